"""Programmatic dependent launch (PDL, sm_90+): a kernel's start and weight loads overlap the kernel before it.

A kernel launched with `launch_pdl=True` may start while the kernel before it on the stream still
runs, once every program of that kernel has called `launch_dependents`. Until it calls `wait_prior`
it must touch nothing an earlier kernel writes: only weights, and only weights no kernel just wrote
(launch_dependents does not make the writer's stores visible; the projections' stacked weights are
built once, with a stream sync, `model.layers.stacked_weight`). After the wait, every earlier kernel
has finished and its stores are visible (each kernel of the chain either waited or was launched
after its predecessor finished, so this holds transitively). A kernel launched without PDL is not
affected: the wait returns at once and the trigger does nothing.

At one token the projections are GEMVs of 2-17 MB bound by latency, not bandwidth (6.2 MB in 3.1 us
of kernel time on the H200, where the copy rate would take 1.4: benchmarks/gemv_probe_gpu.py);
loading a program's strip before the wait moves those loads under the previous kernel, and a kernel
whose programs are already resident and waiting starts without a launch gap.
So the decode step's kernels are written for it: each takes a `PDL` constexpr and, with it, calls
`launch_dependents` first thing and `wait_prior` before its first read of another kernel's output
(its weights' loads go before the wait where it has any). `args(group, device, tokens)` gives a
launch both the constexpr and `launch_pdl`, from the `ON` and `MAX_TOKENS` knobs and the device: PDL
needs sm_90 or newer (the griddepcontrol instructions do not build for older GPUs), and the CPU
interpreter never gets it. Read at each launch, so a captured graph keeps what it was captured with
(docs/perf/engine-serve-h200.md, seventh session).
"""

import functools

import torch
import triton
import triton.language as tl

# The kernel groups launched with PDL (each kernel of a group waits before reading another's output):
# gemv: the one-row projections (`triton_matmul._gemv_kernel`, weights before the wait);
# absorb: one token's absorbed query and RoPEs (W_UK before the wait); router: the gate (its weight
# before the wait); experts: one token's gate/up and down GEMVs; norms: rms_norm, the cache-row
# writes, silu-mul; attention: the indexer's score and selection, sparse MLA and its merge.
GROUPS = ("gemv", "absorb", "router", "experts", "norms", "attention")
ON: tuple[str, ...] = GROUPS
# Launches of more tokens than this run without PDL. On the H200 (one process, alternating graphs) it
# took ~10% off the one-token decode step, most of it launch gaps (the GEMVs' and W_UK's early loads
# alone gave ~3-6%); at 2 and 4 tokens (tl.dot projections, nothing to load early) it changed nothing
# (x1.002-1.006), and at 8, 16 and 64 it cost 0.7-1.4% (docs/perf/engine-serve-h200.md, seventh session).
MAX_TOKENS = 1


@functools.cache
def supported(device: torch.device) -> bool:
    """Whether kernels on `device` can be launched with PDL: a CUDA GPU of compute capability 9.0+."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def on(group: str, device: torch.device, tokens: int = 1) -> bool:
    """Whether a launch of `group`'s kernel over `tokens` tokens on `device` uses PDL now."""
    if group not in GROUPS:
        raise ValueError(f"pdl group {group!r}: one of {', '.join(GROUPS)}")
    return group in ON and tokens <= MAX_TOKENS and supported(torch.device(device))


def args(group: str, device: torch.device, tokens: int = 1, early: bool = True) -> dict:
    """A launch's PDL arguments: the kernel's `PDL` constexpr and Triton's `launch_pdl`, alike. `early`
    False where the kernel loads weights before its wait that the kernel just before wrote (a copy):
    that kernel's stores are only promised visible after the wait, so no PDL then."""
    enabled = early and on(group, device, tokens)
    return {"PDL": enabled, "launch_pdl": enabled}


@triton.jit
def launch_dependents(PDL: tl.constexpr):
    """Let the next kernel on the stream, where launched with PDL, start now (its programs then wait
    in `wait_prior` for this kernel to finish before they read what it writes)."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def wait_prior(PDL: tl.constexpr):
    """Wait until the kernel before this one has finished and its stores are visible."""
    if PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def launch_dependents_and_wait(PDL: tl.constexpr):
    """Both, first thing, for a kernel with nothing to load before its wait (no weights, or weights it
    finds through another kernel's output)."""
    launch_dependents(PDL)
    wait_prior(PDL)

"""Programmatic dependent launch (PDL, sm_90+): a kernel's weight loads overlap the kernel before it.

A kernel launched with `launch_pdl=True` may start while the kernel before it on the stream still
runs, once every program of that kernel has called `launch_dependents()`. Until it calls
`wait_prior()` it must touch nothing an earlier kernel writes: only weights. After the wait, every
earlier kernel has finished and its stores are visible (each kernel of the chain either waited or
was launched after its predecessor finished, so this holds transitively). A kernel launched without
PDL is not affected: `wait_prior()` then returns at once and `launch_dependents()` does nothing.

At one token the projections are GEMVs of 2-17 MB that take 2-3 DRAM round trips after their launch
(`triton_matmul`); loading a program's strip before the wait moves those trips under the previous
kernel. So the kernels before a GEMV call `launch_dependents()` first thing, and the GEMV loads its
strip, waits, then reads its input (docs/perf/engine-serve-h200.md, seventh session).

Both are no-ops in Triton's CPU interpreter, which has no inline assembly.
"""

import os

import triton
import triton.language as tl

_ON_GPU = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0").lower() not in ("1", "true", "on"))


@triton.jit
def launch_dependents():
    """Let the next kernel on the stream, where launched with PDL, start now (its programs then wait
    in `wait_prior()` for this kernel to finish before they read what it writes)."""
    if _ON_GPU:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def wait_prior():
    """Wait until the kernel before this one has finished and its stores are visible (at once where
    this kernel was not launched with PDL)."""
    if _ON_GPU:
        tl.extra.cuda.gdc_wait()

"""Whether a generated kernel (Triton, Inductor) ran on tensor cores, read from what it compiled to.

A kernel's name says little (`_sparse_mla_split_kernel`, `triton_poi_fused_add_0`); its code says it
all: PTX that issues a matrix multiply-accumulate (`wgmma.mma_async` on Hopper, `mma.sync` from
Ampere on, `tcgen05.mma` on Blackwell) runs on tensor cores, PTX without one on CUDA cores. Triton
keeps every compiled kernel in its cache (`TRITON_CACHE_DIR`, default ~/.triton/cache), Inductor in
its own (`TORCHINDUCTOR_CACHE_DIR`, default /tmp/torchinductor_$USER) and vLLM under
~/.cache/vllm; the PTX names its kernel on its `.entry` line. A verdict carries the instruction and
the file that decided it.
"""

from __future__ import annotations

import getpass
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from rooftop.profile.classify import CUDA_CORE, TENSOR, UNKNOWN

_ENTRY = re.compile(rb"\.entry\s+([A-Za-z_$][\w$]*)\s*\(")
# PTX matrix instructions (and SASS ones, for a cubin dumped to text)
_MMA = re.compile(rb"\b(?:wgmma\.mma_async|mma\.sync|tcgen05\.mma|wmma\.mma)[\w.]*|\b(?:HGMMA|HMMA|IMMA|QGMMA|UTCMMA)[\w.]*")
MAX_PTX_BYTES = 64 << 20  # a PTX larger than this is not a kernel cache entry


@dataclass(slots=True, frozen=True)
class CodeVerdict:
    """Where a kernel ran, and the evidence: the first matrix instruction of its code, or its absence."""

    unit: str  # TENSOR or CUDA_CORE
    evidence: str  # "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 in /path/k.ptx"


def default_dirs(env: dict[str, str] | None = None) -> list[Path]:
    """The caches generated kernels of a process with environment `env` (default: this one's) land in,
    on this host: Triton's, Inductor's, vLLM's."""
    env = os.environ if env is None else env
    home = Path(env.get("HOME") or Path.home())
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "root"
    return [Path(env.get("TRITON_CACHE_DIR") or home / ".triton" / "cache"),
            Path(env.get("TORCHINDUCTOR_CACHE_DIR") or f"/tmp/torchinductor_{user}"),
            Path(env.get("VLLM_CACHE_ROOT") or home / ".cache" / "vllm")]


def _ptx_files(dirs: Iterable[Path]) -> Iterable[Path]:
    for d in dirs:
        if Path(d).is_dir():
            yield from sorted(Path(d).rglob("*.ptx"))


def read_verdicts(names: Iterable[str], dirs: Iterable[Path]) -> dict[str, CodeVerdict]:
    """A verdict for each of `names` whose compiled PTX is in one of `dirs`: tensor cores where every
    cached copy of it issues a matrix instruction (the first one found is the evidence), CUDA cores where
    none does, and unknown, "ambiguous", where copies disagree (the same kernel compiled for another dtype
    or tile: which one ran is not known). Kernels not found get no verdict."""
    wanted = set(names)
    copies: dict[str, list[tuple[str | None, Path]]] = {}  # name -> (first matrix instruction or None, file)
    for path in _ptx_files(dirs):
        try:
            if path.stat().st_size > MAX_PTX_BYTES:
                continue
            code = path.read_bytes()
        except OSError:
            continue
        for name in {m.decode() for m in _ENTRY.findall(code)} & wanted:
            mma = _MMA.search(code)
            copies.setdefault(name, []).append((mma.group(0).decode() if mma else None, path))
    return {name: _verdict(found) for name, found in copies.items()}


def _verdict(copies: list[tuple[str | None, Path]]) -> CodeVerdict:
    tensor = [(mma, path) for mma, path in copies if mma]
    plain = [path for mma, path in copies if not mma]
    more = f" ({len(copies)} cached copies agree)" if len(copies) > 1 else ""
    if not plain:
        return CodeVerdict(TENSOR, f"{tensor[0][0]} in {tensor[0][1]}{more}")
    if not tensor:
        return CodeVerdict(CUDA_CORE, f"no mma/wgmma instruction in {plain[0]}{more}")
    return CodeVerdict(UNKNOWN, f"ambiguous: {len(copies)} cached copies disagree: {tensor[0][0]} in {tensor[0][1]}, "
                                f"no mma/wgmma instruction in {plain[0]}")


def existing(dirs: Iterable[Path]) -> list[Path]:
    """Those of `dirs` that exist: the caches a verdict can come from."""
    return [Path(d) for d in dirs if Path(d).is_dir()]

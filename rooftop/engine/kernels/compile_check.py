"""What Triton makes of the sparse-MLA kernel for a GPU, read on any machine: no GPU needed.

Triton compiles for a target it is told (here sm_90, Hopper) without a device, so the pipelining
can be read off the TTGIR: how many shared-memory buffers each tile load got, and how much shared
memory a program takes (which bounds the programs an SM runs). This is how the one-buffer row
loads behind the kernel's 60% of copy bandwidth were found (docs/perf/kernels-h200.md).

    python -m rooftop.engine.kernels.compile_check      # the default tiles at a few shapes

The Gluon kernel for 64+ heads (`gluon_sparse_mla`) is read the same way, with ptxas for its
registers: a Triton upgrade that moves Gluon's API, or a change that spills or overflows shared
memory, fails here on a CPU rather than on a GPU.
"""

import re

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from rooftop.engine.kernels import triton_sparse_mla

_ARGS = [  # the kernels' runtime arguments, in order, with the types the wrapper passes
    ("q_ptr", "*bf16"), ("qr_ptr", "*bf16"), ("kv_ptr", "*bf16"), ("slots_ptr", "*i64"), ("lens_ptr", "*i32"),
    ("out_ptr", "*bf16"), ("part_ptr", "PART"), ("lse_ptr", "*fp32"),
    ("count_ptr", "*i32"), ("stride_qt", "i32"), ("stride_qh", "i32"), ("stride_rt", "i32"), ("stride_rh", "i32"), ("stride_st", "i32"),
    ("stride_ot", "i32"), ("stride_oh", "i32"), ("num_heads", "i32"), ("topk", "i32"), ("keys_per_split", "i32"),
    ("row_width", "i32"), ("rank", "i32"), ("scale_log2", "fp32"), ("num_splits", "i32"), ("head_groups", "i32"),
]
# Pointers and the strides/widths a real call has divisible by 16 (Triton specialises on that).
_DIVISIBLE = {"q_ptr", "qr_ptr", "kv_ptr", "slots_ptr", "lens_ptr", "out_ptr", "part_ptr", "lse_ptr", "count_ptr", "stride_qt",
              "stride_qh", "stride_rt", "stride_rh", "stride_st", "stride_ot", "stride_oh", "row_width", "rank"}


def sparse_mla_pipeline(cfg: dict, rank: int = 512, rope: int = 64, arch: int = 90) -> dict:
    """Compile the sparse-MLA kernel `cfg` picks (valid lengths given) for sm_`arch`.

    Returns the shared memory a program takes and the buffers of the row tile's latent part
    ([BLOCK_N, rank] bf16, or each of its four column blocks): the row tiles a program keeps in flight.
    """
    kernel = (triton_sparse_mla._sparse_mla_rows_kernel if cfg.get("rows_as_m")
              else triton_sparse_mla._sparse_mla_split_kernel)
    merge, part_dtype = triton_sparse_mla.merge_plan(cfg, rank)  # bf16 outputs
    constexprs = {"BLOCK_H": cfg["BLOCK_H"], "BLOCK_N": cfg["BLOCK_N"], "BLOCK_DV": max(64, triton.next_power_of_2(rank)),
                  "BLOCK_DR": max(16, triton.next_power_of_2(rope)), "ONE_SPLIT": cfg["splits"] == 1,
                  "HAS_LENS": True, "EVEN_D": True, "PREFETCH": cfg.get("prefetch", False),
                  "MERGE": merge, "BLOCK_S": triton.next_power_of_2(cfg["splits"]), "PDL": True}
    part = "*bf16" if part_dtype.itemsize == 2 else "*fp32"
    signature = {name: part if kind == "PART" else kind for name, kind in _ARGS} | {name: "constexpr" for name in constexprs}
    attrs = {(i,): [["tt.divisibility", 16]] for i, (name, _) in enumerate(_ARGS) if name in _DIVISIBLE}
    compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs),
                              target=GPUTarget("cuda", arch, 32),
                              options={"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]})
    # The rows-as-M kernel loads the latent part as one [BLOCK_N, DV] tile, the heads-as-M kernel as
    # four [BLOCK_N, DV / 4] column blocks.
    width = constexprs["BLOCK_DV"] if cfg.get("rows_as_m") else constexprs["BLOCK_DV"] // 4
    tile = rf"= ttg.local_alloc : \(\) -> !ttg.memdesc<(\d+)x{cfg['BLOCK_N']}x{width}xbf16"
    buffers = [int(n) for n in re.findall(tile, compiled.asm["ttgir"])]
    if not buffers:  # no shared-memory row tile at all: unpipelined, or a TTGIR this reading does not know
        raise RuntimeError(f"no {cfg['BLOCK_N']}x{width} bf16 shared-memory tile in the TTGIR of "
                           f"{kernel.fn.__name__} for {cfg}: read compiled.asm['ttgir'] to see what Triton made")
    return {"shared_bytes": compiled.metadata.shared, "row_buffers": max(buffers)}


# Shared memory a block may take on sm_90 (227 KB).
SM90_SHARED_BYTES = 232448


def gluon_sparse_mla_build(block_n: int = 64, stages: int = 2, num_warps: int = 8, arch: int = 90) -> dict:
    """Compile the Gluon sparse-MLA kernel (`gluon_sparse_mla`, valid lengths given) for sm_`arch` and
    read what it takes: shared memory a program, registers and spilled bytes a thread (ptxas -v on
    its PTX), and warpgroup MMAs in its code."""
    import os
    import subprocess
    import tempfile

    from triton.experimental.gluon._runtime import GluonASTSource

    from rooftop.engine.kernels import gluon_sparse_mla

    kernel = gluon_sparse_mla._sparse_mla_wgmma_kernel
    args = list(kernel.arg_names)
    constexprs = {"BLOCK_H": gluon_sparse_mla.BLOCK_H, "BLOCK_N": block_n, "DV": gluon_sparse_mla.RANK,
                  "DR": gluon_sparse_mla.ROPE, "STAGES": stages, "HAS_LENS": True}
    kinds = {"q_ptr": "*bf16", "qr_ptr": "*bf16", "kv_ptr": "*bf16", "slots_ptr": "*i64", "lens_ptr": "*i32",
             "out_ptr": "*bf16", "scale_log2": "fp32"}
    signature = {name: "constexpr" if name in constexprs else kinds.get(name, "i32") for name in args}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(args)
             if name in _DIVISIBLE or name in ("stride_st", "topk")}
    compiled = triton.compile(GluonASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs),
                              target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps})
    ptx = compiled.asm["ptx"]
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        out = subprocess.run([ptxas, f"-arch=sm_{arch}a", "-v", src, "-o", os.path.join(tmp, "k.cubin")],
                             capture_output=True, text=True, check=True).stderr
    regs = re.search(r"Used (\d+) registers", out)
    spills = re.search(r"(\d+) bytes spill stores", out)
    if regs is None or spills is None:
        raise RuntimeError(f"ptxas -v printed no register count for the Gluon kernel: {out[-500:]}")
    return {"shared_bytes": compiled.metadata.shared, "registers": int(regs.group(1)),
            "spill_bytes": int(spills.group(1)), "wgmma": ptx.count("wgmma.mma_async")}


def main() -> None:
    print("batch heads | tile | shared KB | row tiles in flight a program")
    for heads in (16, 32, 128):
        for batch in (1, 32, 128):
            cfg = triton_sparse_mla.default_config(batch, heads, 2048)
            got = sparse_mla_pipeline(cfg)
            tile = (f"{'rows' if cfg['rows_as_m'] else 'heads'}-as-M {cfg['BLOCK_H']}x{cfg['BLOCK_N']}, "
                    f"{cfg['num_warps']} warps, {cfg['num_stages']} stages, prefetch {cfg['prefetch']}, "
                    f"{cfg['splits']} splits")
            print(f"{batch:5d} {heads:5d} | {tile} | {got['shared_bytes'] / 1024:.0f} | {got['row_buffers']}")
    got = gluon_sparse_mla_build()
    print(f"Gluon, 64 heads a program, 64-row tiles, 2 stages: {got['shared_bytes'] / 1024:.0f} KB shared, "
          f"{got['registers']} registers, {got['spill_bytes']} bytes spilled, {got['wgmma']} warpgroup MMAs")


if __name__ == "__main__":
    main()

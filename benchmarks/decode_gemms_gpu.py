"""The decode step's weight reads on a GPU: the `small` preset's projections through cuBLAS (F.linear,
torch.bmm) against `triton_matmul` (its default tiles and a sweep), and the routed experts' tiles at
few and many tokens. Each row's bytes are what the call must read and write at least.

    python3 benchmarks/decode_gemms_gpu.py [--rows 1,64] [--budget-s 300] [--out decode-gemms.json]

Times as in kernels_gpu.py: graph replays, the L2 flushed by a 256 MiB read before each, median.
"""

import argparse
import functools
import itertools
import platform
import sys
import time

import torch
import torch.nn.functional as F
import triton
from kernels_gpu import copy_bandwidth, time_ms, write_result  # this folder's (run as a script)

from rooftop.engine.kernels import triton_matmul, triton_moe
from rooftop.engine.model.config import ModelConfig

DEV = "cuda"


def linear_shapes(c: ModelConfig) -> list[tuple[str, int, int]]:
    """(name, N, K) of each decode projection of a config (the stacked ones as the model stacks them)."""
    h = c.num_attention_heads
    return [
        ("q_a + kv_a + index k + index w", c.q_lora_rank + c.kv_cache_dim + c.index_head_dim + c.index_n_heads,
         c.hidden_size),
        ("q_b", h * c.qk_head_dim, c.q_lora_rank),
        ("index wq_b", c.index_n_heads * c.index_head_dim, c.q_lora_rank),
        ("o_proj", c.hidden_size, h * c.v_head_dim),
        ("shared gate + up", 2 * c.n_shared_experts * c.moe_intermediate_size, c.hidden_size),
        ("shared down", c.hidden_size, c.n_shared_experts * c.moe_intermediate_size),
        ("dense gate + up", 2 * c.intermediate_size, c.hidden_size),
        ("dense down", c.hidden_size, c.intermediate_size),
        ("lm_head", c.vocab_size, c.hidden_size),
    ]


def matmul_configs(rows: int) -> list[dict]:
    """Tiles to sweep for a row count (within ~200 KB of shared memory)."""
    bm = triton_matmul.default_config(rows, 1, 1)["BLOCK_M"]
    out = []
    for bn, bk, stages, splits in itertools.product((16, 32, 64), (128, 256, 512), (3, 4), (1, 2, 4)):
        if (bm + bn) * bk * 2 * stages <= 200 << 10:
            out.append({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "splits": splits, "num_warps": 4,
                        "num_stages": stages})
    return out


def bench_linear(shapes, rows_list, copy_rate, deadline) -> list[dict]:
    out = []
    for rows in rows_list:
        for name, n, k in shapes:
            x = torch.randn(rows, k, device=DEV).bfloat16()
            w = torch.randn(n, k, device=DEV).bfloat16()
            nbytes = 2 * (n * k + rows * k + rows * n)
            row = {"rows": rows, "name": name, "N": n, "K": k, "bytes": nbytes,
                   "cublas_us": 1e3 * time_ms(functools.partial(F.linear, x, w)),
                   "default": triton_matmul.default_config(rows, n, k)}
            row["triton_us"] = 1e3 * time_ms(functools.partial(triton_matmul.linear, x, w))
            best = None
            for cfg in matmul_configs(rows):
                if time.time() > deadline:
                    break
                us = 1e3 * time_ms(functools.partial(triton_matmul.linear, x, w, cfg), iters=15)
                if best is None or us < best[0]:
                    best = (us, cfg)
            if best:
                row["best_us"], row["best"] = best
            for key in ("cublas", "triton", "best"):
                if f"{key}_us" in row:
                    row[f"{key}_of_copy"] = nbytes / (row[f"{key}_us"] * 1e-6) / copy_rate
            out.append(row)
            print(f"rows {rows:3d} {name:32s} N {n:6d} K {k:5d}: cuBLAS {row['cublas_us']:6.1f} us "
                  f"({row['cublas_of_copy']:.0%}), triton {row['triton_us']:6.1f} ({row['triton_of_copy']:.0%})"
                  + (f", best {row['best_us']:6.1f} ({row['best_of_copy']:.0%}) {row['best']}" if best else ""))
            sys.stdout.flush()
    return out


def bench_bmm(c: ModelConfig, rows_list, copy_rate) -> list[dict]:
    """The absorbed attention's two per-head products, from the views the model passes."""
    out = []
    h, nope, v, rank = c.num_attention_heads, c.qk_nope_head_dim, c.v_head_dim, c.kv_lora_rank
    w_kv = torch.randn(h, nope + v, rank, device=DEV).bfloat16()
    w_uk, w_uv = w_kv.split([nope, v], dim=1)
    for rows in rows_list:
        q = torch.randn(rows, h, nope, device=DEV).bfloat16()
        lat = torch.randn(rows, h, rank, device=DEV).bfloat16()
        for name, a, b in (("absorb W_UK", q.transpose(0, 1), w_uk), ("apply W_UV", lat.transpose(0, 1),
                                                                      w_uv.transpose(1, 2))):
            nbytes = 2 * (b.numel() + a.numel() + h * rows * b.shape[2])
            row = {"rows": rows, "name": name, "bytes": nbytes,
                   "cublas_us": 1e3 * time_ms(functools.partial(torch.bmm, a, b)),
                   "triton_us": 1e3 * time_ms(functools.partial(triton_matmul.bmm, a, b))}
            for key in ("cublas", "triton"):
                row[f"{key}_of_copy"] = nbytes / (row[f"{key}_us"] * 1e-6) / copy_rate
            out.append(row)
            print(f"rows {rows:3d} bmm {name}: cuBLAS {row['cublas_us']:.1f} us ({row['cublas_of_copy']:.0%}), "
                  f"triton {row['triton_us']:.1f} ({row['triton_of_copy']:.0%})")
    return out


def bench_moe(c: ModelConfig, tokens_list, copy_rate, deadline) -> list[dict]:
    """Routed experts at a token count: the default tiles, then gate/up tiles and down tiles swept in turn."""
    e, inter, hidden, k = c.n_routed_experts, c.moe_intermediate_size, c.hidden_size, c.num_experts_per_tok
    w13 = (torch.randn(e, 2 * inter, hidden, device=DEV) * hidden**-0.5).bfloat16()
    w2 = (torch.randn(e, hidden, inter, device=DEV) * inter**-0.5).bfloat16()
    out = []
    for tokens in tokens_list:
        x = torch.randn(tokens, hidden, device=DEV).bfloat16()
        ids = torch.rand(tokens, e, device=DEV).argsort(-1)[:, :k]
        weights = torch.rand(tokens, k, device=DEV)
        distinct = int(ids.unique().numel())
        nbytes = distinct * 3 * inter * hidden * 2

        def run(cfg, iters=20, x=x, ids=ids, weights=weights):
            return 1e3 * time_ms(functools.partial(triton_moe.moe_experts, x, ids, weights, w13, w2, cfg), iters)

        row = {"tokens": tokens, "distinct_experts": distinct, "bytes": nbytes,
               "default": triton_moe.default_config(tokens), "default_us": run(None)}
        best_cfg, best_us = dict(row["default"]), row["default_us"]
        for bn, bk, st in itertools.product((16, 32, 64), (64, 128, 256), (3, 4)):
            if time.time() > deadline:
                break
            cfg = {**best_cfg, "BLOCK_N1": bn, "BLOCK_K1": bk, "stages1": st}
            if (16 + 2 * bn) * bk * 2 * st > 200 << 10:
                continue
            us = run(cfg, 15)
            if us < best_us:
                best_cfg, best_us = cfg, us
        for bn, bk, st in itertools.product((16, 32, 64), (64, 128, 256), (3, 4)):
            if time.time() > deadline:
                break
            cfg = {**best_cfg, "BLOCK_N2": bn, "BLOCK_K2": bk, "stages2": st}
            if (16 + bn) * bk * 2 * st > 200 << 10:
                continue
            us = run(cfg, 15)
            if us < best_us:
                best_cfg, best_us = cfg, us
        row.update(best=best_cfg, best_us=best_us, default_of_copy=nbytes / (row["default_us"] * 1e-6) / copy_rate,
                   best_of_copy=nbytes / (best_us * 1e-6) / copy_rate)
        out.append(row)
        print(f"MoE {tokens} tokens ({distinct} experts): default {row['default_us']:.1f} us "
              f"({row['default_of_copy']:.0%}), best {best_us:.1f} ({row['best_of_copy']:.0%}) {best_cfg}")
        sys.stdout.flush()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--rows", default="1,64", help="decode batch sizes")
    ap.add_argument("--budget-s", type=float, default=300.0, help="time for the tile sweeps")
    ap.add_argument("--out", default="decode-gemms.json")
    args = ap.parse_args()
    rows_list = [int(r) for r in args.rows.split(",")]
    c = ModelConfig.preset(args.preset)
    t0 = time.time()
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
              "python": platform.python_version(), "command": " ".join(sys.argv), "preset": args.preset}
    result["copy"] = copy_bandwidth()
    rate = result["copy"]["bytes_per_s"]
    deadline = t0 + args.budget_s
    result["moe"] = bench_moe(c, rows_list, rate, t0 + args.budget_s / 3)
    result["bmm"] = bench_bmm(c, rows_list, rate)
    result["linear"] = bench_linear(linear_shapes(c), rows_list, rate, deadline)
    write_result(result, args.out, t0)


if __name__ == "__main__":
    main()

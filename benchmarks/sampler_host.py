"""Host time of the engine's sampler per decode step, with and without banned ids, on CPU or GPU.

    python3 benchmarks/sampler_host.py [--device cuda] [--vocab 512] [--out sampler-host.json]

The load generator forces each request's output length with min_tokens, so while a request is
short of it the sampler bans the end-of-sequence id in its row: every row of every decode step in
a benchmark. Wall time of one Sampler call (greedy, as the bench asks; the `.tolist()` inside waits
for the device), median of --iters, at batch 1, 16 and 64; and the ban alone done a row at a time,
as the sampler did before (one small index copy and one kernel a row), against the one-index form.
"""

import argparse
import json
import platform
import statistics
import time

import torch

from rooftop.engine.sampler import Sampler, ban_ids
from rooftop.provenance import provenance


def _wall_us(fn, iters: int) -> float:
    for _ in range(10):
        fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e6 * statistics.median(times)


def ban_rows_loop(logits: torch.Tensor, banned_ids: list[list[int]]) -> float:
    """The sampler's ban before: a row at a time."""
    logits = logits.clone()
    for row, ids in enumerate(banned_ids):
        if ids:
            logits[row, ids] = float("-inf")
    return logits[0, 0].item()


def ban_one_index(logits: torch.Tensor, banned_ids: list[list[int]]) -> float:
    """The sampler's ban now (`sampler.ban_ids`): one index for all rows."""
    return ban_ids(logits, banned_ids)[0, 0].item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--vocab", type=int, default=512, help="the small and tiny presets' vocabulary is 512 and 320")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--out", default="sampler-host.json")
    args = ap.parse_args()
    sampler = Sampler()
    rows = []
    for batch in (1, 16, 64):
        logits = torch.randn(batch, args.vocab, device=args.device)
        greedy = ([0.0] * batch, [1.0] * batch, [None] * batch)
        banned = [[1] for _ in range(batch)]
        row = {"batch": batch,
               "sampler_us": _wall_us(lambda lg=logits, g=greedy: sampler(lg, *g), args.iters),
               "sampler_banned_us": _wall_us(lambda lg=logits, g=greedy, b=banned: sampler(lg, *g, banned_ids=b),
                                             args.iters),
               "ban_rows_loop_us": _wall_us(lambda lg=logits, b=banned: ban_rows_loop(lg, b), args.iters),
               "ban_one_index_us": _wall_us(lambda lg=logits, b=banned: ban_one_index(lg, b), args.iters)}
        rows.append(row)
        print(" ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()), flush=True)
    result = {"device": torch.cuda.get_device_name(0) if args.device == "cuda" else platform.processor() or "cpu",
              "torch": torch.__version__, "vocab": args.vocab, "iters": args.iters, "rows": rows}
    with open(args.out, "w") as f:
        json.dump({"provenance": provenance(), **result}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

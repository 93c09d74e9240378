"""How often `bench.slo.capacity` finds the true SLO capacity, and how often its interval holds it.

A synthetic sweep: the true attainment per level falls with concurrency (true capacity C=8 at a 90%
target, with C=8 itself close to the line at 93%); each repeat's attainment is the share of 64
requests that met the SLO (binomial). Usage: python benchmarks/slo_capacity_coverage.py [SEEDS]
"""

import sys

import numpy as np

from rooftop.bench.slo import capacity

LEVELS = [1, 2, 4, 8, 16, 32, 64]
TRUE_ATTAINMENT = [0.99, 0.98, 0.96, 0.93, 0.80, 0.5, 0.2]
TRUE_CAPACITY = 8
REQUESTS = 64


def main(seeds: int) -> None:
    for repeats in (3, 5):
        found = covered = 0
        for seed in range(seeds):
            rng = np.random.default_rng(seed)
            att = [list(rng.binomial(REQUESTS, p, repeats) / REQUESTS) for p in TRUE_ATTAINMENT]
            c = capacity(LEVELS, att, 0.9, seed=seed)
            found += c.load == TRUE_CAPACITY
            low = c.low if c.low is not None else 0
            high = c.high if c.high is not None else float("inf")
            covered += low <= TRUE_CAPACITY <= high
        print(f"{repeats} repeats: capacity found at C={TRUE_CAPACITY} in {found / seeds:.1%} of seeds, "
              f"interval holds it in {covered / seeds:.1%}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 500)

#!/usr/bin/env python
"""Derive Muon's per-step Newton-Schulz polynomials (`NS_COEFFICIENTS["polar_express"]`).

Newton-Schulz maps each singular value s of the Frobenius-normalised momentum through an odd
quintic p(s) = a s + b s^3 + c s^5 per step. Greedily, step by step (Amsel et al., "The Polar
Express", 2025): over the range [lo, hi] the previous steps left (at first [--lo, 1]), take the
(a, b, c) that minimises the worst |1 - p(s)|, a linear programme over a fine grid of s; shrink it
by --safety (p(s / safety)) so that rounding cannot push a value past the range; the next range is
p's image of this one. Prints the table and the band each number of steps leaves, beside torch's
single polynomial for comparison.

    python benchmarks/experiments/ns_coefficients.py                 # needs scipy (pip install scipy)
    python benchmarks/experiments/ns_coefficients.py --lo 1e-3 --steps 6
"""

from __future__ import annotations

import argparse

import numpy as np

from minigpt.training.muon import NS_COEFFICIENTS

JORDAN = NS_COEFFICIENTS["jordan"]


def closest_quintic(lo: float, hi: float, points: int = 20000) -> tuple[float, float, float]:
    """The odd quintic whose worst |1 - p(s)| over [lo, hi] is smallest."""
    from scipy.optimize import linprog

    s = np.concatenate([np.geomspace(lo, hi, points), np.linspace(lo, hi, points)])
    powers = np.stack([s, s**3, s**5], axis=1)
    ones = np.ones((len(s), 1))
    # Variables a, b, c, t: minimise t subject to -t <= 1 - p(s) <= t.
    bounds = np.vstack([np.hstack([powers, -ones]), np.hstack([-powers, -ones])])
    limits = np.concatenate([np.ones(len(s)), -np.ones(len(s))])
    result = linprog([0, 0, 0, 1], A_ub=bounds, b_ub=limits, bounds=[(None, None)] * 4)
    a, b, c, _ = result.x
    return float(a), float(b), float(c)


def image(lo: float, hi: float, steps: list[tuple[float, float, float]]) -> tuple[float, float]:
    """The range [lo, hi] reaches through `steps`, read off a fine grid."""
    s = np.geomspace(lo, hi, 200000)
    for a, b, c in steps:
        s = a * s + b * s**3 + c * s**5
    return float(s.min()), float(s.max())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lo", type=float, default=3e-3, help="the smallest singular value to bring to 1")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--safety", type=float, default=1.01)
    args = p.parse_args()
    table: list[tuple[float, float, float]] = []
    lo, hi = args.lo, 1.0
    for _ in range(args.steps):
        a, b, c = closest_quintic(lo, hi)
        table.append((a / args.safety, b / args.safety**3, c / args.safety**5))
        lo, hi = image(lo, hi, table[-1:])
    print("per-step polynomials (a, b, c):")
    for a, b, c in table:
        print(f"    ({a:.6f}, {b:.6f}, {c:.6f}),")
    print(f"\nsingular values from [{args.lo:g}, 1] after k steps:")
    for k in range(1, args.steps + 1):
        ours, torchs = image(args.lo, 1.0, table[:k]), image(args.lo, 1.0, [JORDAN] * k)
        print(f"  k={k}: per-step {ours[0]:.3f}-{ours[1]:.3f}", end="   ")
        print(f"torch's single polynomial {torchs[0]:.3f}-{torchs[1]:.3f}")


if __name__ == "__main__":
    main()

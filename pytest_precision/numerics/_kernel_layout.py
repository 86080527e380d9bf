"""The layout the metrics kernels and their driver share: per-element quantity codes, where each
sum, maximum and count sits in the accumulators, and the ratio thresholds. Plain
constants, so the numba kernels, their driver and the torch pipeline read the same numbers
without importing each other."""

from __future__ import annotations

# Per-element quantities a rule may bound (``_measure.Quantity`` takes its codes from here).
ABS_ERR, REL_ERR, FLOORED_REL_ERR, ULP_ERR, ALLCLOSE_EXCESS = range(5)

# Layout of the float64 accumulator of the comparison kernel.
SUMS = slice(0, 7)  # a.e, a.a, e.e, d.d, sum |d|, sum rel, sum ulp
MAX_ABS, MAX_REL, MAX_ULP = 7, 8, 9
ACC_SIZE = 10
# Layout of the int64 counters: two thousandth counts, non-finite counts, then rule counts.
OVER_THOUSANDTH, OVER_FIVE_THOUSANDTH = 0, 1
NONFINITE = slice(2, 10)  # a: nan +inf -inf, e: nan +inf -inf, mismatched, either side
RULES_START = 10
#: Limits a rule may have in the kernels (the standards use at most three).
RULE_SLOTS = 4
# Layout of the int64 max locations: the start of the first block holding each maximum.
LOC_ABS, LOC_REL, LOC_ULP = 0, 1, 2

EXPONENT_BITS = 0x7FF << 52
THOUSANDTH, FIVE_THOUSANDTH = 1e-3, 5e-3

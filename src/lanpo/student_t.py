"""Student t's two-sided 95% quantiles, for confidence intervals over a few seeds or a few uses."""

from __future__ import annotations

T975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    12: 2.179,
    15: 2.131,
    20: 2.086,
    30: 2.042,
}


def t975(df: int) -> float:
    """The 97.5% quantile of Student t with ``df`` degrees of freedom (the nearest tabled ``df`` below; 1.96 past 30)."""
    if df in T975:
        return T975[df]
    known = [d for d in sorted(T975) if d <= df]
    return T975[known[-1]] if df <= 30 else 1.96

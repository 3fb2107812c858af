"""Statistics helpers shared by the sampling tests."""

from __future__ import annotations

import torch


def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square goodness-of-fit p-value; cells with expected < 5 are pooled."""
    counts = counts.to(torch.float64).flatten()
    probs = probs.to(torch.float64).flatten()
    n = counts.sum()
    expected = probs / probs.sum() * n
    if bool((counts[expected == 0] > 0).any()):
        return 0.0  # an impossible outcome happened
    pos = expected > 0
    small = pos & (expected < 5)
    obs = counts[pos & ~small]
    exp = expected[pos & ~small]
    if bool(small.any()):
        obs = torch.cat([obs, counts[small].sum().reshape(1)])
        exp = torch.cat([exp, expected[small].sum().reshape(1)])
    stat = ((obs - exp) ** 2 / exp).sum()
    df = obs.numel() - 1
    if df <= 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))

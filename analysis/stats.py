"""Statistics over seeds."""

from __future__ import annotations

import numpy as np


def bootstrap_ci(values, n_boot: int = 10000, level: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """Mean and percentile bootstrap CI of the mean over ``values`` (one value per seed)."""
    x = np.asarray(list(values), dtype=float)
    if x.size == 0:
        raise ValueError("bootstrap_ci needs at least one value")
    mean = float(x.mean())
    if x.size == 1:
        return mean, mean, mean
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(axis=1)
    alpha = (1 - level) / 2
    return mean, float(np.quantile(means, alpha)), float(np.quantile(means, 1 - alpha))

"""Statistics over seeds."""

from __future__ import annotations

import numpy as np
import pandas as pd


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


def probability_of_improvement(x, y) -> float:
    """P(X > Y) for one task: the Mann-Whitney U statistic of runs ``x`` over runs ``y``
    divided by ``len(x) * len(y)``; ties count one half (rliable's definition,
    Agarwal et al. 2021; the oracle in ``tests/test_report.py``)."""
    x = np.asarray(list(x), dtype=float)
    y = np.asarray(list(y), dtype=float)
    if x.size == 0 or y.size == 0:
        raise ValueError("probability_of_improvement needs runs on both sides")
    diff = x[:, None] - y[None, :]
    return float(((diff > 0) + 0.5 * (diff == 0)).mean())


def poi_ci(pairs: list[tuple], n_boot: int = 5000, level: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """Probability of improvement averaged over tasks, with a stratified bootstrap CI.

    ``pairs`` holds one ``(x_runs, y_runs)`` per task (domain).  Each bootstrap
    replicate resamples the runs of X and of Y within every task independently
    (rliable's stratified bootstrap; seeds are treated as unpaired runs).
    rliable's own interval code goes through ``arch``, which does not import
    with pandas 3, hence this short equivalent.
    """
    pairs = [(np.asarray(list(x), dtype=float), np.asarray(list(y), dtype=float)) for x, y in pairs]
    point = float(np.mean([probability_of_improvement(x, y) for x, y in pairs]))
    rng = np.random.default_rng(seed)
    reps = np.empty(n_boot)
    for b in range(n_boot):
        reps[b] = np.mean(
            [
                probability_of_improvement(x[rng.integers(0, x.size, x.size)], y[rng.integers(0, y.size, y.size)])
                for x, y in pairs
            ]
        )
    alpha = (1 - level) / 2
    return point, float(np.quantile(reps, alpha)), float(np.quantile(reps, 1 - alpha))


def ci_table(groups: dict[tuple, list[float]], names: list[str]) -> pd.DataFrame:
    """One row per key of ``groups`` (a tuple named by ``names``), sorted, with the mean of its
    values (one per seed), the 95 % bootstrap CI and the count: the long format of the analyses."""
    rows = []
    for key, vals in sorted(groups.items()):
        mean, lo, hi = bootstrap_ci(vals)
        rows.append({**dict(zip(names, key)), "mean": mean, "ci_low": lo, "ci_high": hi, "n_seeds": len(vals)})
    return pd.DataFrame(rows, columns=[*names, "mean", "ci_low", "ci_high", "n_seeds"])

"""Rollouts-to-target: the student rollouts at which each method's mean held-out
curve first reaches the reference method's (GRPO's) final held-out score.

    python -m analysis.rollouts_to_target --runs results/small/runs/*/*/seed*/summary.json \\
        --out-csv results/small/rollouts_to_target.csv --out-md results/small/rollouts_to_target.md

For each domain the target is the reference's final score (mean over its seeds).
A method's rollouts-to-target is the first evaluation point at which the mean of
its seeds' curves is >= the target; the resolution is the evaluation interval.
The 95 % CI comes from a bootstrap over seeds that keeps seeds paired (seed s of
every method starts from the same warm start): each replicate draws seed
indices once and takes both the method's curves and the reference's final
scores from them, so the target's own uncertainty is in the interval.  Methods
whose seeds differ from the reference's are resampled independently.  "not reached" is recorded as an empty
value (and as ``inf`` inside the bootstrap).  ``ratio`` is rollouts-to-target over the
reference's budget: the paper's headline for LOPD is a ratio below 0.30.
Where the target is at or below a method's score before training (rollout 0),
``at_start`` is true: the method "reaches" it without learning anything.
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

from .names import display, domain_name, ordered
from .runs import METRIC, eval_points, finals, write_table

COLUMNS = [
    "domain",
    "method",
    "reference",
    "target",
    "rollouts_to_target",
    "ci_low",
    "ci_high",
    "reached_share",
    "ratio",
    "at_start",
    "budget",
    "eval_interval",
    "n_seeds",
    "paired",
]


def first_reach(curves: np.ndarray, xs: np.ndarray, target: float) -> float:
    """First x where the mean over rows of ``curves`` (seeds x points) is >= target; inf if never."""
    hit = np.nonzero(curves.mean(axis=0) >= target - 1e-12)[0]
    return float(xs[hit[0]]) if hit.size else float("inf")


def _curves(pts: pd.DataFrame, domain: str, method: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(seeds, curves seeds x points, rollouts of the points) of one method on one domain."""
    g = (
        pts[(pts.domain == domain) & (pts.method == method)]
        .pivot_table(index="seed", columns="rollouts", values=METRIC)
        .sort_index()
    )
    if g.isna().any().any():
        raise ValueError(f"{domain}/{method}: seeds were evaluated at different rollouts: {sorted(g.columns)}")
    return g.index.to_numpy(), g.to_numpy(), g.columns.to_numpy(dtype=float)


def compute(runs: list[str], reference: str = "grpo", n_boot: int = 5000, seed: int = 0) -> pd.DataFrame:
    fin = finals([], runs)
    pts = eval_points(runs)
    rng = np.random.default_rng(seed)
    out = []
    for d in sorted(fin.domain.unique()):
        ref = fin[(fin.domain == d) & (fin.method == reference)].set_index("seed")["value"].sort_index()
        if ref.empty:
            raise ValueError(f"domain {d!r} has no {reference!r} runs to take the target from")
        target = float(ref.mean())
        budget = int(fin[(fin.domain == d) & (fin.method == reference)]["budget"].iloc[0])
        for m in ordered(fin[fin.domain == d].method.unique()):
            seeds, curves, xs = _curves(pts, d, m)
            paired = list(seeds) == list(ref.index)
            point = first_reach(curves, xs, target)
            reps = np.empty(n_boot)
            for b in range(n_boot):
                i = rng.integers(0, len(curves), len(curves))
                j = i if paired else rng.integers(0, len(ref), len(ref))
                reps[b] = first_reach(curves[i], xs, ref.to_numpy()[j].mean())
            lo, hi = (float(np.quantile(reps, q, method="lower" if q < 0.5 else "higher")) for q in (0.025, 0.975))
            finite = np.isfinite
            out.append(
                {
                    "domain": d,
                    "method": m,
                    "reference": reference,
                    "target": target,
                    "rollouts_to_target": point if finite(point) else None,
                    "ci_low": lo if finite(lo) else None,
                    "ci_high": hi if finite(hi) else None,
                    "reached_share": float(finite(reps).mean()),
                    "ratio": point / budget if finite(point) else None,
                    "at_start": bool(curves[:, 0].mean() >= target - 1e-12),
                    "budget": budget,
                    "eval_interval": float(np.diff(xs).min()) if xs.size > 1 else None,
                    "n_seeds": len(curves),
                    "paired": paired,
                }
            )
    return pd.DataFrame(out, columns=COLUMNS)


def _fmt(v) -> str:
    return "not reached" if v is None or (isinstance(v, float) and not np.isfinite(v)) or pd.isna(v) else f"{v:.0f}"


def to_markdown(df: pd.DataFrame) -> str:
    ref = display(df.reference.iloc[0]) if len(df) else "GRPO"
    lines = [
        f"# Rollouts to reach {ref}'s final held-out score",
        "",
        f"First evaluation point at which a method's mean curve reaches {ref}'s final mean; "
        "95 % CI from a bootstrap over seeds, paired by seed (the same warm start; "
        '"not reached" where some resamples never reach it); ratio = rollouts over the reference\'s budget.',
        "",
        "| domain | method | target | rollouts to target | 95 % CI | resamples reaching | ratio to budget | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in df.itertuples():
        note = "target <= its score before training" if r.at_start else ""
        ratio = "" if pd.isna(r.ratio) else f"{r.ratio:.2f}"
        lines.append(
            f"| {domain_name(r.domain)} | {display(r.method)} | {r.target:.3f} | {_fmt(r.rollouts_to_target)} | "
            f"[{_fmt(r.ci_low)}, {_fmt(r.ci_high)}] | {r.reached_share:.0%} | {ratio} | {note} |"
        )
    if len(df):
        lines += [
            "",
            f"Evaluation interval: {df.eval_interval.dropna().min():.0f} rollouts (the resolution of these numbers).",
        ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m analysis.rollouts_to_target",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--runs", nargs="+", required=True, help="run summary.json files (all methods)")
    p.add_argument("--reference", default="grpo", help="method whose final score is the target (default grpo)")
    p.add_argument("--out-csv", required=True)
    p.add_argument("--out-md", required=True)
    a = p.parse_args(argv)
    df = compute(a.runs, a.reference)
    write_table(df, to_markdown(df), a.out_csv, a.out_md)


if __name__ == "__main__":
    main()

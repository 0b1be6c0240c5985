"""Paired differences: each method minus GRPO and minus Vanilla, same RL seed, with 95 % CIs.

    python -m analysis.paired --vanilla results/small/warmstart/*/eval.json \\
        --runs results/small/runs/*/*/seed*/summary.json \\
        --out-csv results/small/paired.csv --out-md results/small/paired.md

Every run of a domain starts from the same base policy, so two methods' runs of
one RL seed differ only in the method: the per-seed difference removes what the
seeds share.  ``minus vanilla`` subtracts the base policy's one evaluation;
``minus grpo`` pairs each run with GRPO's run of the same seed.  Mean and
percentile bootstrap CI over seeds (:func:`analysis.stats.bootstrap_ci`); a CI
that excludes 0 is marked.
"""

from __future__ import annotations

import argparse

import pandas as pd

from .names import display, domain_name, ordered
from .runs import finals, write_table
from .stats import bootstrap_ci

COLUMNS = ["domain", "method", "baseline", "mean_diff", "ci_low", "ci_high", "n_seeds", "excludes_zero"]


def paired(fin: pd.DataFrame, baselines: tuple[str, ...] = ("grpo", "vanilla")) -> pd.DataFrame:
    """One row per (domain, method, baseline): the mean per-seed difference and its CI."""
    rows = []
    for d in sorted(fin.domain.unique()):
        sub = fin[fin.domain == d]
        van = sub[sub.method == "vanilla"]["value"]
        for base in baselines:
            if base == "vanilla":
                if len(van) != 1:
                    continue  # one base policy per domain, or no paired baseline
                ref = {s: float(van.iloc[0]) for s in sub.seed.unique()}
            else:
                ref = dict(zip(sub[sub.method == base].seed, sub[sub.method == base].value))
                if not ref:
                    continue
            for m in ordered(sub.method.unique()):
                if m in (base, "vanilla"):
                    continue
                g = sub[(sub.method == m) & sub.seed.isin(list(ref))].sort_values("seed")
                if g.empty:
                    continue
                diffs = [v - ref[s] for s, v in zip(g.seed, g.value)]
                mean, lo, hi = bootstrap_ci(diffs)
                rows.append(
                    {
                        "domain": d,
                        "method": m,
                        "baseline": base,
                        "mean_diff": mean,
                        "ci_low": lo,
                        "ci_high": hi,
                        "n_seeds": len(diffs),
                        "excludes_zero": bool(lo > 0 or hi < 0),
                    }
                )
    return pd.DataFrame(rows, columns=COLUMNS)


def to_markdown(df: pd.DataFrame) -> str:
    lines = [
        (
            "# Paired differences: method minus baseline, same RL seed (held-out reward, mean and 95 % bootstrap CI "
            "over seeds)"
        ),
        "",
        "| domain | method | minus | difference | 95 % CI | seeds |",
        "|---|---|---|---|---|---|",
    ]
    for r in df.itertuples():
        mark = " *" if r.excludes_zero else ""
        lines.append(
            f"| {domain_name(r.domain)} | {display(r.method)} | {display(r.baseline)} | {r.mean_diff:+.3f}{mark} | "
            f"[{r.ci_low:+.3f}, {r.ci_high:+.3f}] | {r.n_seeds} |"
        )
    lines += ["", "\\* the CI excludes 0."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m analysis.paired", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--vanilla", nargs="*", default=[], help="base-policy eval.json files (one per domain)")
    p.add_argument("--runs", nargs="+", required=True, help="run summary.json files")
    p.add_argument("--out-csv", required=True)
    p.add_argument("--out-md", required=True)
    a = p.parse_args(argv)
    df = paired(finals(a.vanilla, a.runs))
    write_table(df, to_markdown(df), a.out_csv, a.out_md)


if __name__ == "__main__":
    main()

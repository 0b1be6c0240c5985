"""Table 1 from the runs: held-out reward per (domain, method), mean and 95 % CI over seeds.

    python -m analysis.table1 --vanilla results/small/warmstart/*/eval.json \
        --runs results/small/runs/*/*/seed*/summary.json \
        --out-csv results/small/table1.csv --out-md results/small/table1.md --out-curves results/small/curves.csv

"Vanilla" is the base policy's own held-out score (rollout budget 0): one base
policy per domain, which every method and RL seed starts from.
``pre_rollouts`` are the warm-start policy's rollouts that seeded an experience
bank before training (retrieval RL, LOPD); they are not student rollouts and
are shown so that the comparison is complete.  The
table refuses to mix runs of unequal rollout budgets or different task
versions within a domain, and names the runs that disagree.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import pandas as pd

from analysis.runs import METRIC, MixedRunsError, check_comparable, eval_points, final_rows  # noqa: F401 (MixedRunsError re-exported)
from analysis.stats import bootstrap_ci
from methods.core.provenance import write_text_atomic

COLUMNS = ["domain", "method", "metric", "mean", "ci_low", "ci_high", "n_seeds", "rollout_budget", "pre_rollouts"]


def load_runs(vanilla: list[str], runs: list[str]) -> list[dict]:
    return final_rows(vanilla, runs)


def table(rows: list[dict]) -> pd.DataFrame:
    check_comparable(rows)
    groups = defaultdict(list)
    for r in rows:
        groups[(r["domain"], r["method"], r["budget"])].append(r)
    out = []
    for (domain, method, budget), rs in groups.items():
        mean, lo, hi = bootstrap_ci([r["value"] for r in sorted(rs, key=lambda r: r["seed"])])
        if method == "vanilla" and len(rs) == 1 and rs[0].get("heldout_reward_se") is not None:
            # one base policy per domain: no RL seeds to vary, so its interval is its evaluation's (mean +- 1.96 SE)
            lo, hi = mean - 1.96 * rs[0]["heldout_reward_se"], mean + 1.96 * rs[0]["heldout_reward_se"]
        pre = max(r.get("pre", 0) for r in rs)
        out.append(
            {
                "domain": domain,
                "method": method,
                "metric": METRIC,
                "mean": mean,
                "ci_low": lo,
                "ci_high": hi,
                "n_seeds": len(rs),
                "rollout_budget": budget,
                "pre_rollouts": pre,
            }
        )
    df = pd.DataFrame(out, columns=COLUMNS)
    order = {"vanilla": 0}
    df["_o"] = df["method"].map(lambda m: order.get(m, 1))
    return df.sort_values(["domain", "_o", "method"]).drop(columns="_o").reset_index(drop=True)


def curves(runs: list[str]) -> pd.DataFrame:
    """Learning curves: held-out reward against student rollouts, mean and CI over seeds."""
    cols = ["domain", "method", "rollouts", "metric", "mean", "ci_low", "ci_high", "n_seeds"]
    pts = eval_points(runs)
    out = []
    if not pts.empty:
        for (domain, method, rollouts), g in pts.groupby(["domain", "method", "rollouts"], sort=True):
            mean, lo, hi = bootstrap_ci(g.sort_values("seed")[METRIC])
            out.append(
                {
                    "domain": domain,
                    "method": method,
                    "rollouts": rollouts,
                    "metric": METRIC,
                    "mean": mean,
                    "ci_low": lo,
                    "ci_high": hi,
                    "n_seeds": len(g),
                }
            )
    return pd.DataFrame(out, columns=cols)


def to_markdown(df: pd.DataFrame, title: str = "Table 1") -> str:
    lines = [
        f"# {title}: held-out reward (mean and 95 % bootstrap CI over RL seeds)",
        "",
        (
            "Every run of a domain starts from the same base policy (`vanilla`); its interval is its one evaluation's "
            "(mean +- 1.96 standard errors)."
        ),
        "",
        "| domain | method | held-out reward | 95 % CI | seeds | rollout budget | pre-RL rollouts (bank seed) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in df.itertuples():
        lines.append(
            f"| {r.domain} | {r.method} | {r.mean:.3f} | [{r.ci_low:.3f}, {r.ci_high:.3f}] | {r.n_seeds} | "
            f"{r.rollout_budget} | {r.pre_rollouts} |"
        )
    return "\n".join(lines) + "\n"


def _write(path: str, text: str) -> None:
    write_text_atomic(Path(path), text)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m analysis.table1", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--vanilla", nargs="*", default=[], help="warm-start eval.json files")
    p.add_argument("--runs", nargs="*", default=[], help="run summary.json files")
    p.add_argument("--out-csv", required=True)
    p.add_argument("--out-md", required=True)
    p.add_argument("--out-curves", help="learning curves CSV (optional)")
    p.add_argument("--title", default="Table 1", help="heading of the markdown table")
    a = p.parse_args(argv)
    rows = load_runs(a.vanilla, a.runs)
    if not rows:
        p.error("no runs given")
    df = table(rows)
    _write(a.out_csv, df.to_csv(index=False))
    _write(a.out_md, to_markdown(df, a.title))
    if a.out_curves:
        _write(a.out_curves, curves(a.runs).to_csv(index=False))
    print(to_markdown(df, a.title))
    print(f"wrote {a.out_csv}, {a.out_md}" + (f", {a.out_curves}" if a.out_curves else ""))


if __name__ == "__main__":
    main()

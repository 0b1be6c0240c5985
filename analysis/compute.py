"""The compute-matched view beside the rollout-matched one: held-out reward against each
run's measured compute.

    python -m analysis.compute --runs results/small/runs/*/*/seed*/summary.json \\
        --out-csv results/small/compute.csv --out-md results/small/compute.md \\
        --out-png results/small/figures/compute.png

Budgets match in student rollouts by construction, but a step of one method may
cost several of another's (LOPD composes latents and runs a second network).
From each run's ledger (``metrics.jsonl``, ``summary.json``):

* ``train_s``: wall time spent training, i.e. the ledger's ``wall_s`` minus its
  held-out evaluations (``eval_wall_s``, the same work for every method);
* ``token_passes``: tokens through a network in one forward or backward pass,
  summed over the student's sampling (``rollout_tokens``: every token of the
  sampled sequences), its training forwards and backwards, the teacher's
  forwards (``teacher_tokens``) and backwards (LOPD: to the latents), and the
  composer's forwards and backwards (LOPD).  Passes of different networks are
  added as they are: on the small profile the student, teacher and composer
  backbone are the same network.

The table gives per (domain, method) the final reward, both costs (mean over
seeds) and their ratio to GRPO's; the figure plots the learning curves against
each cost (one column per domain, mean over seeds at each evaluation).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from .names import color, display, domain_name, ordered
from .runs import METRIC, eval_points, write_table

PASSES = (
    "rollout_tokens",
    "student_fwd_tokens",
    "student_bwd_tokens",
    "teacher_tokens",
    "teacher_bwd_tokens",
    "composer_fwd_tokens",
    "composer_bwd_tokens",
)
COLUMNS = [
    "domain",
    "method",
    "n_seeds",
    "heldout_reward",
    "train_s",
    "token_passes",
    "train_s_vs_grpo",
    "token_passes_vs_grpo",
    "reward_per_train_hour",
]


def costs(rec: dict) -> dict[str, float]:
    """Training wall time and token passes of a ledger snapshot (a metrics record or a summary's ledger)."""
    return {
        "train_s": float(rec.get("wall_s", 0.0)) - float(rec.get("eval_wall_s", 0.0)),
        "token_passes": float(sum(rec.get(k, 0) or 0 for k in PASSES)),
    }


def points(runs: list[str]) -> pd.DataFrame:
    """Every evaluation of every run with the compute spent by then."""
    return eval_points(runs, extra=costs).reindex(
        columns=["domain", "method", "seed", "rollouts", METRIC, "train_s", "token_passes"]
    )


def table(pts: pd.DataFrame, reference: str = "grpo") -> pd.DataFrame:
    final = pts.sort_values("rollouts").groupby(["domain", "method", "seed"]).tail(1)
    rows = []
    for (d, m), g in final.groupby(["domain", "method"]):
        rows.append(
            {
                "domain": d,
                "method": m,
                "n_seeds": len(g),
                "heldout_reward": g[METRIC].mean(),
                "train_s": g["train_s"].mean(),
                "token_passes": g["token_passes"].mean(),
            }
        )
    df = pd.DataFrame(rows)
    if df.empty:
        return pd.DataFrame(columns=COLUMNS)
    ref = df[df.method == reference].set_index("domain")
    for col in ("train_s", "token_passes"):
        df[f"{col}_vs_grpo"] = [
            r[col] / ref.loc[r["domain"], col]
            if r["domain"] in ref.index and ref.loc[r["domain"], col] > 0
            else float("nan")
            for r in df.to_dict("records")
        ]
    df["reward_per_train_hour"] = df["heldout_reward"] / (df["train_s"] / 3600.0)
    df["_o"] = df.method.map({m: i for i, m in enumerate(ordered(df.method.unique()))})
    return df.sort_values(["domain", "_o"]).drop(columns="_o")[COLUMNS].reset_index(drop=True)


def to_markdown(df: pd.DataFrame) -> str:
    lines = [
        "# Compute-matched view: final held-out reward and what each method spent to reach it (mean over RL seeds)",
        "",
        (
            "Training wall time excludes held-out evaluations; token passes count every token through a network "
            "in a forward or backward pass (student sampling and training, teacher, composer)."
        ),
        "",
        "| domain | method | held-out reward | train time (s) | × GRPO | token passes (M) | × GRPO |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in df.to_dict("records"):
        lines.append(
            f"| {domain_name(r['domain'])} | {display(r['method'])} | {r['heldout_reward']:.3f} | {r['train_s']:.0f} | "
            f"{r['train_s_vs_grpo']:.2f} | {r['token_passes'] / 1e6:.1f} | {r['token_passes_vs_grpo']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def plot(pts: pd.DataFrame, out_png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    domains = sorted(pts.domain.unique())
    xs = (("train_s", "training wall time (s)"), ("token_passes", "token passes (millions)"))
    fig, axes = plt.subplots(
        len(xs), max(len(domains), 1), figsize=(5.2 * max(len(domains), 1), 3.4 * len(xs)), squeeze=False
    )
    for j, d in enumerate(domains):
        sub = pts[pts.domain == d]
        for i, (col, label) in enumerate(xs):
            ax = axes[i][j]
            for m in ordered(sub.method.unique()):
                g = sub[sub.method == m].groupby("rollouts")[[col, METRIC]].mean().sort_index()
                x = g[col] / (1e6 if col == "token_passes" else 1.0)
                ax.plot(x, g[METRIC], marker="o", ms=3, lw=1.5, color=color(m), label=display(m))
            ax.set_xlabel(label)
            ax.set_ylabel("held-out reward")
            ax.grid(alpha=0.3)
            if i == 0:
                ax.set_title(f"{domain_name(d)} (mean over seeds at each evaluation)", fontsize=10)
    axes[0][0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=120)
    plt.close(fig)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m analysis.compute", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--runs", nargs="+", required=True, help="run summary.json files")
    p.add_argument("--out-csv", required=True)
    p.add_argument("--out-md", required=True)
    p.add_argument("--out-png", required=True)
    a = p.parse_args(argv)
    pts = points(a.runs)
    df = table(pts)
    write_table(df, to_markdown(df), a.out_csv, a.out_md)
    plot(pts, Path(a.out_png))
    print(f"wrote {a.out_png}")


if __name__ == "__main__":
    main()

"""LOPD's training dynamics: β, the privileged margin Δ, the composer's KL and the anchor per step.

    python -m analysis.lopd_dynamics --runs results/small/runs/*/lopd*/seed*/metrics.jsonl \\
        --out-csv results/small/lopd_dynamics.csv --out-png results/small/lopd_dynamics.png

Reads the fixed metric names LOPD logs every step (``lopd_beta``, ``lopd_margin``,
``lopd_kl``, ``lopd_anchor``; ``methods/lopd/method.py``) from each run's
``metrics.jsonl`` and writes, per (domain, method, student rollouts, metric),
the mean over seeds with a 95 % bootstrap CI (long CSV) and one figure: a row
per domain, a column per quantity, a line (and CI band) per method.  Steps
where a quantity is null (no task retrieved anything) are skipped for that
quantity.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import pandas as pd

from methods.core.provenance import write_text_atomic

from .stats import ci_table

QUANTITIES = {
    "lopd_beta": "β (dual variable)",
    "lopd_margin": "Δ (privileged margin)",
    "lopd_kl": "composer KL",
    "lopd_anchor": "anchor ‖c − c0‖²",
}


def load(paths: list[str]) -> pd.DataFrame:
    pts = defaultdict(list)
    for p in paths:
        p = Path(p)
        summary = json.loads((p.parent / "summary.json").read_text()) if (p.parent / "summary.json").exists() else None
        method = summary["method"] if summary else p.parent.parent.name
        domain = summary["domain"] if summary else p.parent.parent.parent.name
        for line in p.read_text().splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            if r.get("kind") != "train":
                continue
            for q in QUANTITIES:
                if r.get(q) is not None:
                    pts[(domain, method, r["rollouts"], q)].append(float(r[q]))
    return ci_table(pts, ["domain", "method", "rollouts", "metric"])


def plot(df: pd.DataFrame, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    domains = sorted(df["domain"].unique())
    fig, axes = plt.subplots(
        len(domains), len(QUANTITIES), figsize=(4 * len(QUANTITIES), 3 * len(domains)), squeeze=False
    )
    for i, d in enumerate(domains):
        for j, (q, title) in enumerate(QUANTITIES.items()):
            ax = axes[i][j]
            sub = df[(df.domain == d) & (df.metric == q)]
            for method, g in sub.groupby("method"):
                g = g.sort_values("rollouts")
                ax.plot(g.rollouts, g["mean"], label=method, lw=1.5 if method == "lopd" else 1.0)
                ax.fill_between(g.rollouts, g.ci_low, g.ci_high, alpha=0.15)
            ax.set_title(f"{d}: {title}", fontsize=9)
            ax.set_xlabel("student rollouts", fontsize=8)
            ax.tick_params(labelsize=7)
    seen: dict[str, object] = {}
    for ax in axes.flat:  # every method once, whichever panel drew it (the ablations run on fewer domains)
        for h, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, h)
    labels, handles = list(seen), list(seen.values())
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 7), fontsize=8)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    tmp = out.with_name(out.stem + ".tmp" + out.suffix)
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(out)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m analysis.lopd_dynamics",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--runs", nargs="+", required=True, help="metrics.jsonl of LOPD runs (and its variants)")
    p.add_argument("--out-csv", required=True)
    p.add_argument("--out-png", help="figure (optional)")
    a = p.parse_args(argv)
    df = load(a.runs)
    if df.empty:
        p.error("no LOPD metrics (lopd_beta, lopd_margin, ...) in the given runs")
    write_text_atomic(Path(a.out_csv), df.to_csv(index=False))
    if a.out_png:
        plot(df, Path(a.out_png))
    print(f"wrote {a.out_csv}" + (f" and {a.out_png}" if a.out_png else ""))


if __name__ == "__main__":
    main()

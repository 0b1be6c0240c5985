"""The sample-efficiency figure (the paper's Fig. 4): held-out reward against student
rollouts for every method, mean and 95 % CI band over seeds, one column per domain.

    python -m analysis.sample_efficiency --vanilla results/small/warmstart/*/eval.json \\
        --runs results/small/runs/*/*/seed*/summary.json \\
        --out results/small/figures/sample_efficiency.png   # writes the .png and a .pdf beside it

Top row: held-out reward (the paper's figure).  Bottom row: each run minus GRPO's
run of the same RL seed at the same rollout count (paired over seeds: every run
of a domain starts from the same base policy).  Rollout 0 of a
curve is the method's own evaluation before training (retrieval RL already with
retrieved text in its prompt).  The runs pass the same comparability check as
Table 1 (one budget and task version per domain).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from .names import color, display, domain_name, ordered
from .runs import METRIC, eval_points, finals
from .stats import bootstrap_ci


def band_table(vanilla: list[str], runs: list[str], reference: str = "grpo") -> pd.DataFrame:
    """Per (domain, method, rollouts): mean and CI of the reward over RL seeds, and of its paired
    difference from ``reference`` at the same seed and rollout count (where that run exists)."""
    finals(vanilla, runs)  # the comparability check
    pts = eval_points(runs)
    ref = pts[pts.method == reference].set_index(["domain", "seed", "rollouts"])[METRIC]
    rows = []
    for (d, m, r), g in pts.groupby(["domain", "method", "rollouts"], sort=True):
        g = g.sort_values("seed")
        mean, lo, hi = bootstrap_ci(g[METRIC])
        row = {"domain": d, "method": m, "rollouts": r, "mean": mean, "ci_low": lo, "ci_high": hi, "n_seeds": len(g)}
        keys = [(d, s, r) for s in g.seed]
        if all(k in ref.index for k in keys):
            dm, dlo, dhi = bootstrap_ci(g[METRIC].to_numpy() - ref.loc[keys].to_numpy())
            row.update(delta_mean=dm, delta_low=dlo, delta_high=dhi)
        rows.append(row)
    return pd.DataFrame(rows)


def plot(bands: pd.DataFrame, out_png: Path) -> list[Path]:
    """Draw the figure; write ``out_png`` and the same figure as PDF.  Returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    domains = sorted(bands["domain"].unique())
    methods = ordered(bands["method"].unique())
    has_delta = "delta_mean" in bands and bands["delta_mean"].notna().any()
    rows = [("mean", "ci_low", "ci_high", "held-out reward")] + (
        [("delta_mean", "delta_low", "delta_high", "minus GRPO, same seed")] if has_delta else []
    )
    fig, axes = plt.subplots(
        len(rows), len(domains), figsize=(5.2 * len(domains), 3.4 * len(rows)), squeeze=False, sharex=True
    )
    for j, d in enumerate(domains):
        sub = bands[bands.domain == d]
        for i, (mcol, lcol, hcol, ylabel) in enumerate(rows):
            ax = axes[i][j]
            for m in methods:
                g = sub[sub.method == m].sort_values("rollouts").dropna(subset=[mcol])
                if g.empty:
                    continue
                c = color(m, methods)
                ax.plot(
                    g.rollouts,
                    g[mcol],
                    color=c,
                    lw=2.2 if m == "lopd" else 1.3,
                    marker="o",
                    ms=3,
                    label=display(m),
                    zorder=3 if m == "lopd" else 2,
                )
                ax.fill_between(g.rollouts, g[lcol], g[hcol], color=c, alpha=0.08, lw=0)
            if i == 1:
                ax.axhline(0, color="#7f7f7f", lw=0.8, ls="--")
            if i == 0:
                ax.set_title(f"{domain_name(d)} ({int(sub.n_seeds.max())} seeds, mean and 95 % CI)", fontsize=10)
            if i == len(rows) - 1:
                ax.set_xlabel("student rollouts")
            ax.set_ylabel(ylabel, fontsize=9)
            ax.grid(alpha=0.3)
    handles: dict[str, object] = {}
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend(
        list(handles.values()), list(handles), loc="lower center", ncol=min(len(handles), 8), fontsize=8, frameon=False
    )
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    written = []
    for path in (out_png, out_png.with_suffix(".pdf")):
        tmp = path.with_name(path.stem + ".tmp" + path.suffix)
        fig.savefig(tmp, dpi=150)
        tmp.replace(path)
        written.append(path)
    plt.close(fig)
    return written


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m analysis.sample_efficiency",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--vanilla", nargs="*", default=[], help="base-policy eval.json files (checked for comparability with the runs)"
    )
    p.add_argument("--runs", nargs="+", required=True, help="run summary.json files")
    p.add_argument("--out", required=True, help="PNG path; the PDF goes beside it")
    a = p.parse_args(argv)
    bands = band_table(a.vanilla, a.runs)
    if bands.empty:
        p.error("the runs have no held-out evaluations")
    written = plot(bands, Path(a.out))
    print("wrote " + ", ".join(map(str, written)))


if __name__ == "__main__":
    main()

"""Probability of improvement of one method (LOPD) over each other method (rliable style).

    python -m analysis.improvement --vanilla results/small/warmstart/*/eval.json \\
        --runs results/small/runs/*/*/seed*/summary.json --method lopd \\
        --out-csv results/small/improvement.csv --out-md results/small/improvement.md

P(X > Y) is the probability that a run of X scores higher than a run of Y
(final held-out reward; ties count one half), per domain and averaged over
domains ("all"), with a 95 % stratified bootstrap CI over seeds
(``analysis.stats.poi_ci``).  0.5 means no difference; an interval that holds
0.5 is no evidence either way.  With three seeds per method the interval is
necessarily wide.  Seed s of every method starts from the same warm start, so
``paired_wins`` also gives the share of seeds where X beat Y on the same warm
start (ties one half; empty where the seed sets differ).
"""

from __future__ import annotations

import argparse

import pandas as pd

from .names import display, domain_name, ordered
from .runs import finals, write_table
from .stats import poi_ci

COLUMNS = [
    "method",
    "baseline",
    "domain",
    "poi",
    "ci_low",
    "ci_high",
    "n_seeds_method",
    "n_seeds_baseline",
    "paired_wins",
]


def compute(fin: pd.DataFrame, method: str = "lopd", n_boot: int = 5000) -> pd.DataFrame:
    if method not in set(fin.method):
        raise ValueError(f"no runs of {method!r} among the given runs (methods: {sorted(set(fin.method))})")
    rows = []
    for b in ordered(m for m in fin.method.unique() if m != method):
        pairs, domains = [], []
        for d in sorted(fin.domain.unique()):
            xs = fin[(fin.domain == d) & (fin.method == method)].set_index("seed")["value"].sort_index()
            ys = fin[(fin.domain == d) & (fin.method == b)].set_index("seed")["value"].sort_index()
            x, y = xs.to_numpy(), ys.to_numpy()
            wins = float(((x > y) + 0.5 * (x == y)).mean()) if list(xs.index) == list(ys.index) else None
            if len(x) and len(y):
                pairs.append((x, y))
                domains.append(d)
                p, lo, hi = poi_ci([(x, y)], n_boot=n_boot)
                rows.append(
                    {
                        "method": method,
                        "baseline": b,
                        "domain": d,
                        "poi": p,
                        "ci_low": lo,
                        "ci_high": hi,
                        "n_seeds_method": len(x),
                        "n_seeds_baseline": len(y),
                        "paired_wins": wins,
                    }
                )
        if len(pairs) > 1:
            p, lo, hi = poi_ci(pairs, n_boot=n_boot)
            rows.append(
                {
                    "method": method,
                    "baseline": b,
                    "domain": "all",
                    "poi": p,
                    "ci_low": lo,
                    "ci_high": hi,
                    "n_seeds_method": sum(len(x) for x, _ in pairs),
                    "n_seeds_baseline": sum(len(y) for _, y in pairs),
                    "paired_wins": None,
                }
            )
    return pd.DataFrame(rows, columns=COLUMNS)


def to_markdown(df: pd.DataFrame) -> str:
    if df.empty:
        return "# Probability of improvement\n\n(no baselines)\n"
    m = display(df.method.iloc[0])
    domains = [d for d in dict.fromkeys(df.domain) if d != "all"] + (["all"] if "all" in set(df.domain) else [])
    lines = [
        (
            f"# Probability of improvement of {m} over each method (final held-out reward; 95 % stratified "
            "bootstrap CI over seeds; in brackets after it: the share of seeds where it beat the baseline "
            "from the same warm start)"
        ),
        "",
        "| baseline | " + " | ".join("all domains" if d == "all" else domain_name(d) for d in domains) + " |",
        "|---|" + "---|" * len(domains),
    ]
    for b in dict.fromkeys(df.baseline):
        cells = []
        for d in domains:
            r = df[(df.baseline == b) & (df.domain == d)]
            if r.empty:
                cells.append("–")
                continue
            w = r.paired_wins.iloc[0]
            cells.append(
                f"{r.poi.iloc[0]:.2f} [{r.ci_low.iloc[0]:.2f}, {r.ci_high.iloc[0]:.2f}]"
                + ("" if pd.isna(w) else f" ({w:.0%} of seeds)")
            )
        lines.append(f"| {display(b)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m analysis.improvement", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--vanilla", nargs="*", default=[], help="warm-start eval.json files (Vanilla as a baseline)")
    p.add_argument("--runs", nargs="+", required=True, help="run summary.json files")
    p.add_argument("--method", default="lopd", help="the method compared against all others (default lopd)")
    p.add_argument("--out-csv", required=True)
    p.add_argument("--out-md", required=True)
    a = p.parse_args(argv)
    try:
        df = compute(finals(a.vanilla, a.runs), a.method)
    except ValueError as e:
        p.error(str(e))
    write_table(df, to_markdown(df), a.out_csv, a.out_md)


if __name__ == "__main__":
    main()

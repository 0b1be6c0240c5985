"""Behaviour on held-out tool-use tasks (the paper's Table 3), for Vanilla and every method.

    python -m analysis.behaviour --vanilla results/small/warmstart/tooluse/eval.json \\
        --runs results/small/runs/tooluse/*/seed*/summary.json \\
        --out-csv results/small/behaviour.csv --out-md results/small/behaviour.md

From each run's final held-out evaluation (200 episodes; per-episode means logged
by ``methods/core/evaluate.py`` and the tool-use episode's ``info``):

- env steps per episode: agent turns until the episode ends (``heldout_turns``);
- tool calls per step: tool calls / turns (a turn that is ``done`` or unparsable is not a call);
- repeated identical calls per episode: calls whose (tool, arguments) the episode had already made;
- reward per call: held-out reward / tool calls (ratio of the per-episode means);
- first response length: tokens of the agent's first message.

Each quantity is computed per seed, then reported as the mean and 95 % bootstrap
CI over seeds.
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

from .names import display, domain_name, ordered
from .runs import finals, write_table
from .stats import bootstrap_ci

QUANTITIES = {
    "env_steps": "env steps / episode",
    "calls_per_step": "tool calls / step",
    "repeated_calls": "repeated identical calls / episode",
    "reward_per_call": "reward / call",
    "first_response_tokens": "first response (tokens)",
    "reward": "held-out reward",
}
NEEDED = [
    "heldout_turns",
    "heldout_tool_calls",
    "heldout_repeated_calls",
    "heldout_first_response_tokens",
    "heldout_reward",
]


def per_seed(fin: pd.DataFrame) -> pd.DataFrame:
    missing = [c for c in NEEDED if c not in fin or fin[c].isna().any()]
    if missing:
        bad = (
            fin[fin[[c for c in NEEDED if c in fin]].isna().any(axis=1)]["path"].tolist()
            if all(c in fin for c in NEEDED)
            else fin["path"].tolist()
        )
        raise ValueError(f"behaviour metrics {missing} are missing (not a tool-use evaluation?) in: {bad}")
    calls = fin["heldout_tool_calls"].to_numpy(dtype=float)
    return pd.DataFrame(
        {
            "domain": fin["domain"],
            "method": fin["method"],
            "seed": fin["seed"],
            "env_steps": fin["heldout_turns"],
            "calls_per_step": calls / np.maximum(fin["heldout_turns"].to_numpy(dtype=float), 1e-12),
            "repeated_calls": fin["heldout_repeated_calls"],
            "reward_per_call": np.where(
                calls > 0, fin["heldout_reward"].to_numpy(dtype=float) / np.maximum(calls, 1e-12), np.nan
            ),
            "first_response_tokens": fin["heldout_first_response_tokens"],
            "reward": fin["heldout_reward"],
        }
    )


def summarize(seeds: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (d, m), g in seeds.groupby(["domain", "method"]):
        for q in QUANTITIES:
            vals = g.sort_values("seed")[q].dropna()
            if vals.empty:
                continue
            mean, lo, hi = bootstrap_ci(vals)
            rows.append(
                {"domain": d, "method": m, "metric": q, "mean": mean, "ci_low": lo, "ci_high": hi, "n_seeds": len(vals)}
            )
    return pd.DataFrame(rows, columns=["domain", "method", "metric", "mean", "ci_low", "ci_high", "n_seeds"])


def to_markdown(df: pd.DataFrame) -> str:
    lines = []
    for d in sorted(df.domain.unique()):
        sub = df[df.domain == d]
        lines += [
            f"# Behaviour on held-out {domain_name(d).lower()} tasks (final evaluation; mean [95 % CI] over seeds)",
            "",
        ]
        lines.append("| method | " + " | ".join(QUANTITIES.values()) + " |")
        lines.append("|---|" + "---|" * len(QUANTITIES))
        for m in ordered(sub.method.unique()):
            cells = []
            for q in QUANTITIES:
                r = sub[(sub.method == m) & (sub.metric == q)]
                cells.append(
                    "–" if r.empty else f"{r['mean'].iloc[0]:.3g} [{r.ci_low.iloc[0]:.3g}, {r.ci_high.iloc[0]:.3g}]"
                )
            lines.append(f"| {display(m)} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m analysis.behaviour", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--vanilla", nargs="*", default=[], help="warm-start eval.json files of the domain")
    p.add_argument("--runs", nargs="+", required=True, help="run summary.json files of the domain")
    p.add_argument("--out-csv", required=True)
    p.add_argument("--out-md", required=True)
    a = p.parse_args(argv)
    df = summarize(per_seed(finals(a.vanilla, a.runs)))
    write_table(df, to_markdown(df), a.out_csv, a.out_md)


if __name__ == "__main__":
    main()

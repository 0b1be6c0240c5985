"""The teacher sanity check of every self-distillation run, gathered into one table.

    python -m analysis.teacher_check --runs results/small/runs/*/*/seed*/summary.json \\
        --out-csv results/small/teacher_check.csv --out-md results/small/teacher_check.md

A self-distillation teacher only has something to distil if its privileged
context makes the right actions more likely.  Each method that hands its
teacher a text context (OPSD, SDPO, SDFT, Skill-SD; ``methods/core/distill.py``
and ``methods/skill_sd.py``) logs ``teacher_context_gain`` once: the mean
per-token log-likelihood of the expert's actions on that step's tasks with the
method's own contexts minus without them, scored by the method's own teacher.
OPSD, SDPO and SDFT log it on step 1, when their teacher is still the warm start
(a step without any context would log 0.0); Skill-SD on the first step whose
tasks have skills in its library, after a few updates.  > 0 passes: the context
helps the teacher.  A run logs a warning when it does not.  Beside it, each run
logs the same difference on the student's own failed attempts of that step
(``teacher_failed_shift``).  It is a size, not a test: those attempts were
sampled from the teacher's own weights, so any context tends to lower them;
near 0 means the teacher ignores the context, and the expert gain says whether
a reaction points to the right actions.

Rows: one per run that logged the gain (other methods have no text context and
are left out), and per (domain, method) the mean over seeds and the seeds that
pass.  SDPO builds two kinds of context, a successful sibling's trace (with the
feedback when the rollout failed) or the feedback alone, and logs the gain of
each as well: a second table splits its gain by kind.
"""

from __future__ import annotations

import argparse

import pandas as pd

from .names import display, domain_name, ordered
from .runs import run_records, write_table

KEY = "teacher_context_gain"
SHIFT = "teacher_failed_shift"


def per_run(runs: list[str]) -> pd.DataFrame:
    """One row per run that logged the gain; a run that split it by context kind (SDPO) also
    fills ``gain_<kind>`` and ``pairs_<kind>`` (the distinct task-context pairs scored)."""
    rows, kinds = [], set()
    for p in runs:
        s, recs = run_records(p)
        rec = next((r for r in recs if KEY in r), None)  # logged once: the first record that has it
        if rec is None:
            continue
        row = {
            "domain": s["domain"],
            "method": s["method"],
            "seed": s["seed"],
            "gain": float(rec[KEY]),
            "step": rec.get("step"),
            "rollouts": rec.get("rollouts"),
            "failed_shift": rec.get(SHIFT),
            "failed_attempts": rec.get("teacher_failed_attempts"),
        }
        for k, v in rec.items():
            if k.startswith(KEY + "_"):
                kind = k[len(KEY) + 1 :]
                kinds.add(kind)
                row[f"gain_{kind}"], row[f"pairs_{kind}"], row[f"failed_shift_{kind}"] = (
                    float(v),
                    rec.get(f"teacher_context_pairs_{kind}"),
                    rec.get(f"{SHIFT}_{kind}"),
                )
        rows.append(row)
    cols = [
        "domain",
        "method",
        "seed",
        "gain",
        "step",
        "rollouts",
        "failed_shift",
        "failed_attempts",
        *(c for k in sorted(kinds) for c in (f"gain_{k}", f"pairs_{k}", f"failed_shift_{k}")),
    ]
    return pd.DataFrame(rows, columns=cols).sort_values(["domain", "method", "seed"], ignore_index=True)


def kinds_of(df: pd.DataFrame) -> list[str]:
    return [c[len("gain_") :] for c in df.columns if c.startswith("gain_")]


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    cols = ["domain", "method", "mean_gain", "min_gain", "n_seeds", "seeds_passing", "mean_failed_shift"]
    if df.empty:
        return pd.DataFrame(columns=cols)
    g = df.groupby(["domain", "method"])["gain"]
    shift = df.groupby(["domain", "method"])["failed_shift"].mean()  # NaN where no run logged it
    out = pd.DataFrame(
        {
            "mean_gain": g.mean(),
            "min_gain": g.min(),
            "n_seeds": g.size(),
            "seeds_passing": g.apply(lambda x: int((x > 0).sum())),
            "mean_failed_shift": shift,
        }
    ).reset_index()
    return out[cols]


def to_markdown(df: pd.DataFrame, summary: pd.DataFrame) -> str:
    if df.empty:
        return (
            "# Teacher sanity check\n\nNo run logged a teacher context gain "
            "(no self-distillation method with a text context was run).\n"
        )
    lines = [
        "# Teacher sanity check: what each method's own privileged context gives its teacher",
        "",
        "Change of the expert actions' log-likelihood per token on the tasks of the step it was logged "
        "(step 1; Skill-SD: its first step with skills), "
        "with the method's context minus without (> 0: the teacher has something to distil). "
        "Last column: the same difference on the student's own failed attempts of that step (mean over seeds). "
        "It has no sign to pass: they were sampled from the teacher's "
        "own weights, so any context tends to lower them; near 0 means the teacher ignores the context, "
        "and the expert gain says whether a reaction points to the right actions.",
        "",
        "| domain | method | per seed | mean | seeds > 0 | on own failed attempts |",
        "|---|---|---|---|---|---|",
    ]
    for d in sorted(summary.domain.unique()):
        sub = summary[summary.domain == d].set_index("method")
        for m in ordered(sub.index):
            seeds = df[(df.domain == d) & (df.method == m)]
            per_seed = ", ".join(f"{r.seed}: {r.gain:+.4f}" for r in seeds.itertuples())
            r = sub.loc[m]
            lines.append(
                f"| {domain_name(d)} | {display(m)} | {per_seed} | {r.mean_gain:+.4f} | "
                f"{r.seeds_passing}/{r.n_seeds} | {_signed(r.mean_failed_shift)} |"
            )
    return "\n".join(lines + by_kind_markdown(df)) + "\n"


def by_kind_markdown(df: pd.DataFrame) -> list[str]:
    """The same gain split by what the context is made of, for the runs that logged it."""
    kinds = kinds_of(df)
    if not kinds:
        return []
    lines = [
        "",
        (
            "By kind of context (a method that builds several kinds; "
            "pairs: distinct task-context pairs of that step scored):"
        ),
        "",
        "| domain | method | kind | per seed (pairs) | mean | seeds > 0 | on own failed attempts |",
        "|---|---|---|---|---|---|---|",
    ]
    for (d, m), sub in df.groupby(["domain", "method"], sort=False):
        for k in kinds:
            seeds = sub.dropna(subset=[f"gain_{k}"])
            if seeds.empty:
                continue
            per_seed = ", ".join(
                f"{r.seed}: {getattr(r, 'gain_' + k):+.4f} ({int(getattr(r, 'pairs_' + k))})"
                for r in seeds.itertuples()
            )
            g = seeds[f"gain_{k}"]
            lines.append(
                f"| {domain_name(d)} | {display(m)} | {k.replace('_', ' ')} | {per_seed} | {g.mean():+.4f} | "
                f"{int((g > 0).sum())}/{len(g)} | {_signed(seeds[f'failed_shift_{k}'].mean())} |"
            )
    return lines


def _signed(x) -> str:
    return "–" if pd.isna(x) else f"{x:+.4f}"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m analysis.teacher_check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--runs", nargs="+", required=True, help="run summary.json files (their metrics.jsonl sits beside them)"
    )
    p.add_argument("--out-csv", required=True)
    p.add_argument("--out-md", required=True)
    a = p.parse_args(argv)
    df = per_run(a.runs)
    summary = summarize(df)
    write_table(df.merge(summary, on=["domain", "method"]), to_markdown(df, summary), a.out_csv, a.out_md)


if __name__ == "__main__":
    main()

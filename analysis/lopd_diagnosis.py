"""Where LOPD lands and why: one table per domain, LOPD and its variants side by side, over seeds.

    python -m analysis.lopd_diagnosis --runs results/small/runs/*/lopd*/seed*/summary.json \\
        --out-csv results/small/lopd_diagnosis.csv --out-md results/small/lopd_diagnosis.md

Reads each run's ``summary.json`` and ``metrics.jsonl`` (the names LOPD logs,
``methods/lopd/method.py``) and reports, per (domain, variant), the mean over
seeds with a 95 % bootstrap CI of:

* the **cold start's gains** after it, in nats/token over no context, on the
  held-out base successes and on the expert's actions: the composed latents,
  the same retrieved items as text, the task's own solution as text, random
  latents (``methods/lopd/coldstart.py``; logged by the run at its first step);
* the **step-1 context gain** on the expert's actions (``teacher_context_gain``);
* the **share of rollouts distilled** (``signal_share``) and of rollouts that
  retrieved their own task (``retrieved_self``);
* the **teacher's per-token advantage over the student** (log π_T − log π_S on
  the student's own tokens) on successful and on failed rollouts, at the first
  and the last step that had one;
* **β** (share of steps with β > 0, final β) and **Δ** (mean, and mean minus the
  margin m: negative means the constraint was never met);
* the **teacher against the student on the expert's actions** at the first and
  the last step: a frozen teacher that ends behind its student pulls it back;
* the final held-out reward, for reference.

Runs of several profiles may be given (the scale probe): rows are then labelled
``profile/variant``.  A quantity a variant does not log (the text control has no
cold start) is left empty.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import pandas as pd

from methods.core.provenance import write_text_atomic

from .names import domain_name
from .stats import ci_table

#: (quantity, label) in the order the tables show them
QUANTITIES = [
    ("coldstart_latent_gain", "cold start, held-out successes: latents"),
    ("coldstart_text_gain", "cold start, held-out successes: the same items as text"),
    ("coldstart_solution_gain", "cold start, held-out successes: own solution as text"),
    ("coldstart_random_gain", "cold start, held-out successes: random latents"),
    ("coldstart_expert_latent_gain", "cold start, expert actions: latents"),
    ("coldstart_expert_text_gain", "cold start, expert actions: the same items as text"),
    ("coldstart_expert_solution_gain", "cold start, expert actions: own solution as text"),
    ("coldstart_expert_random_gain", "cold start, expert actions: random latents"),
    ("teacher_context_gain", "step 1: context gain on expert actions"),
    ("signal_share", "share of rollouts distilled"),
    ("retrieved_self", "share of rollouts retrieving their own task"),
    ("adv_success_first", "teacher − student per token, successes, first step"),
    ("adv_success_last", "teacher − student per token, successes, last step"),
    ("adv_failed_first", "teacher − student per token, failures, first step"),
    ("adv_failed_last", "teacher − student per token, failures, last step"),
    ("beta_positive_share", "share of steps with β > 0"),
    ("beta_final", "β at the end"),
    ("delta_mean", "Δ, mean over steps"),
    ("delta_minus_margin", "Δ − m, mean over steps"),
    ("expert_gap_first", "teacher − student on expert actions, first step"),
    ("expert_gap_last", "teacher − student on expert actions, last step"),
    ("heldout_reward", "final held-out reward"),
]
LABELS = dict(QUANTITIES)


def _train_records(metrics: Path) -> list[dict]:
    out = []
    for line in metrics.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            if r.get("kind") == "train":
                out.append(r)
    return out


def _first_last(records: list[dict], key: str) -> tuple[float | None, float | None]:
    vals = [r[key] for r in records if r.get(key) is not None]
    return (float(vals[0]), float(vals[-1])) if vals else (None, None)


def _mean(records: list[dict], key: str) -> float | None:
    vals = [float(r[key]) for r in records if r.get(key) is not None]
    return sum(vals) / len(vals) if vals else None


def run_quantities(summary_path: str | Path) -> dict:
    """The diagnosis quantities of one run (None where the run logs nothing for one)."""
    summary_path = Path(summary_path)
    s = json.loads(summary_path.read_text())
    recs = _train_records(summary_path.with_name("metrics.jsonl"))
    job = s.get("job", {})
    margin = job.get("method_config", {}).get("margin")
    q: dict = {
        "profile": job.get("profile", ""),
        "domain": s["domain"],
        "method": job.get("run_name", s["method"]),
        "seed": s["seed"],
        "heldout_reward": s["final"].get("heldout_reward"),
    }
    first = next((r for r in recs if "teacher_context_gain" in r), {})
    for key, _ in QUANTITIES:
        if key.startswith("coldstart_"):
            q[key] = first.get(key)
    q["teacher_context_gain"] = first.get("teacher_context_gain")
    q["signal_share"] = _mean(recs, "signal_share")
    q["retrieved_self"] = _mean(recs, "retrieved_self")
    q["adv_success_first"], q["adv_success_last"] = _first_last(recs, "lopd_success_delta")
    q["adv_failed_first"], q["adv_failed_last"] = _first_last(recs, "lopd_failed_delta")
    betas = [float(r["lopd_beta"]) for r in recs if r.get("lopd_beta") is not None]
    q["beta_positive_share"] = sum(b > 0 for b in betas) / len(betas) if betas else None
    q["beta_final"] = betas[-1] if betas else None
    q["delta_mean"] = _mean(recs, "lopd_margin")
    q["delta_minus_margin"] = q["delta_mean"] - margin if q["delta_mean"] is not None and margin is not None else None
    q["expert_gap_first"], q["expert_gap_last"] = _first_last(recs, "teacher_minus_student_expert")
    return q


def diagnose(summaries: list[str]) -> pd.DataFrame:
    """Long table: one row per (profile, domain, variant, quantity) with the mean over seeds and its CI."""
    per = defaultdict(list)
    for p in summaries:
        q = run_quantities(p)
        for key, _ in QUANTITIES:
            if q.get(key) is not None:
                per[(q["profile"], q["domain"], q["method"], key)].append(float(q[key]))
    return ci_table(per, ["profile", "domain", "method", "quantity"])


GAP_KEYS = ("heldout_reward", "coldstart_latent_gain", "teacher_context_gain")


def latent_text_gaps(d: pd.DataFrame, method: str = "lopd", control: str = "lopd_text") -> list[tuple[str, dict]]:
    """Per profile that ran both: LOPD minus its text control on the held-out reward, and the
    latents' gain minus the text's (the cold start's, on held-out successes; the first step's,
    on expert actions).  What the scale probe compares across base sizes."""
    out = []
    for profile in d["profile"].unique():
        sub = d[d["profile"] == profile]
        m = dict(zip(sub[sub.method == method].quantity, sub[sub.method == method]["mean"]))
        c = dict(zip(sub[sub.method == control].quantity, sub[sub.method == control]["mean"]))
        if not m or not c:
            continue
        g = {
            "heldout_reward": m["heldout_reward"] - c["heldout_reward"]
            if "heldout_reward" in m and "heldout_reward" in c
            else None,
            "coldstart_latent_gain": m["coldstart_latent_gain"] - m["coldstart_text_gain"]
            if "coldstart_latent_gain" in m and "coldstart_text_gain" in m
            else None,
            "teacher_context_gain": m["teacher_context_gain"] - c["teacher_context_gain"]
            if "teacher_context_gain" in m and "teacher_context_gain" in c
            else None,
        }
        out.append((profile, g))
    return out


def _order(methods) -> list[str]:
    """LOPD first, its text control next, then the other variants by name."""
    rank = {"lopd": 0, "lopd_text": 1}
    return sorted(methods, key=lambda m: (rank.get(m.split("/")[-1], 2), m))


def _column(df: pd.DataFrame) -> pd.Series:
    several = df["profile"].nunique() > 1
    return df["profile"] + "/" + df["method"] if several else df["method"]


def paragraph(df: pd.DataFrame, domain: str, method: str = "lopd", control: str = "lopd_text") -> str:
    """One paragraph of the measured numbers for ``method`` on ``domain`` (the report's summary)."""
    d = df[(df["domain"] == domain) & (df["method"] == method)]
    if d.empty:
        return ""
    # the first profile in order is the headline one when several are given
    d = d[d["profile"] == d["profile"].iloc[0]]
    v = dict(zip(d["quantity"], d["mean"]))
    c = df[(df["domain"] == domain) & (df["method"] == control) & (df["profile"] == d["profile"].iloc[0])]
    cv = dict(zip(c["quantity"], c["mean"]))

    def f(x, sign=True):
        return "n/a" if x is None else (f"{x:+.3f}" if sign else f"{x:.3f}")

    parts = [f"**{domain_name(domain)}** ({int(d['n_seeds'].max())} seeds)."]
    if "coldstart_latent_gain" in v:
        parts.append(
            "After the cold start the composed latents gave the frozen teacher "
            f"{f(v.get('coldstart_latent_gain'))} nats/token on held-out base successes, against "
            f"{f(v.get('coldstart_text_gain'))} for the same retrieved items as text, "
            f"{f(v.get('coldstart_solution_gain'))} for the task's own solution and "
            f"{f(v.get('coldstart_random_gain'))} for random latents "
            f"(expert actions: {f(v.get('coldstart_expert_latent_gain'))}, {f(v.get('coldstart_expert_text_gain'))}, "
            f"{f(v.get('coldstart_expert_solution_gain'))}, {f(v.get('coldstart_expert_random_gain'))})."
        )
    parts.append(
        f"{f(v.get('signal_share'), False)} of rollouts were distilled; the teacher's per-token advantage over "
        f"the student was {f(v.get('adv_success_first'))} → {f(v.get('adv_success_last'))} on successes and "
        f"{f(v.get('adv_failed_first'))} → {f(v.get('adv_failed_last'))} on failures (first → last step)."
    )
    if "beta_positive_share" in v:
        parts.append(
            f"β was positive on {f(v.get('beta_positive_share'), False)} of steps "
            f"(final {f(v.get('beta_final'), False)}), "
            f"with Δ − m averaging {f(v.get('delta_minus_margin'))}."
        )
    parts.append(
        f"On the expert's actions the teacher led the student by {f(v.get('expert_gap_first'))} at the first step "
        f"and {f(v.get('expert_gap_last'))} at the last."
    )
    if cv:
        parts.append(
            f"Held-out reward: LOPD {f(v.get('heldout_reward'), False)}, the text control "
            f"{f(cv.get('heldout_reward'), False)} (its teacher's step-1 gain {f(cv.get('teacher_context_gain'))} "
            f"against the latents' {f(v.get('teacher_context_gain'))})."
        )
    return " ".join(parts)


def to_markdown(df: pd.DataFrame) -> str:
    lines = [
        "# LOPD diagnosis",
        "",
        "Mean over seeds [95 % bootstrap CI]. Gains and advantages in nats/token; "
        "`analysis/lopd_diagnosis.py` says how each is measured.",
    ]
    if df.empty:
        return "\n".join(lines + ["", "No LOPD runs."]) + "\n"
    df = df.assign(column=_column(df))
    for domain in sorted(df["domain"].unique()):
        d = df[df["domain"] == domain]
        cols = _order(d["column"].unique())
        lines += ["", f"## {domain_name(domain)}", "", "| quantity | " + " | ".join(cols) + " |"]
        lines.append("|---|" + "---|" * len(cols))
        for key, label in QUANTITIES:
            cells = []
            for c in cols:
                r = d[(d["column"] == c) & (d["quantity"] == key)]
                if r.empty:
                    cells.append("")
                else:
                    r = r.iloc[0]
                    ci = f" [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]" if r["n_seeds"] > 1 else ""
                    cells.append(f"{r['mean']:+.3f}{ci}")
            if any(cells):
                lines.append(f"| {label} | " + " | ".join(cells) + " |")
        gaps = latent_text_gaps(d)
        if gaps:
            lines += ["", "LOPD against its text control (latents − text), per profile:", ""]
            lines += [
                "| profile | held-out reward | cold-start gain, held-out successes | step-1 gain, expert actions |"
            ]
            lines += ["|---|---|---|---|"]
            lines += [
                f"| {p} | " + " | ".join(f"{g[k]:+.3f}" if g[k] is not None else "" for k in GAP_KEYS) + " |"
                for p, g in gaps
            ]
        para = paragraph(df, domain)
        if para:
            lines += ["", para]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--runs", nargs="+", required=True, help="summary.json of LOPD's runs and its variants'")
    p.add_argument("--out-csv", required=True)
    p.add_argument("--out-md", required=True)
    a = p.parse_args(argv)
    df = diagnose(a.runs)
    out = Path(a.out_csv)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, df.to_csv(index=False))
    write_text_atomic(Path(a.out_md), to_markdown(df))


if __name__ == "__main__":
    main()

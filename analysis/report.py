"""``results/small/report.md``: test-bed validity first, then Table 1, paired differences, the figures,
rollouts-to-target, probability of improvement, the ablations, behaviour and LOPD's dynamics, with headline
statistics written from those files (no number in the report is typed by hand).

    snakemake --cores all results/small/report.md      # regenerates every input first

    python -m analysis.report --table1 results/small/table1.csv --table1-md results/small/table1.md \\
        --targets results/small/rollouts_to_target.csv --targets-md results/small/rollouts_to_target.md \\
        --improvement results/small/improvement.csv --improvement-md results/small/improvement.md \\
        --ablations results/small/ablations.csv --ablations-md results/small/ablations.md \\
        --behaviour-md results/small/behaviour.md --dynamics results/small/lopd_dynamics.csv \\
        --figure results/small/figures/sample_efficiency.png --dynamics-figure results/small/lopd_dynamics.png \\
        --teacher-check results/small/teacher_check.csv --teacher-check-md results/small/teacher_check.md \\
        --warmstarts results/small/warmstart/*/eval.json --out results/small/report.md
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pandas as pd

from methods.core.provenance import git_commit, write_text_atomic

from .names import display, domain_name, ordered


def _section(md_path: str) -> str:
    """A generated markdown table as a report section (its '# ' heading becomes '### ')."""
    text = Path(md_path).read_text().strip()
    return "\n".join("##" + line if line.startswith("# ") else line for line in text.splitlines())


def _rel(path: str, out: Path) -> str:
    return os.path.relpath(Path(path).resolve(), out.resolve().parent)


def _overlap(a: pd.Series, b: pd.Series) -> bool:
    return not (a.ci_low > b.ci_high or b.ci_low > a.ci_high)


def headline_table1(t1: pd.DataFrame, method: str = "lopd", reference: str = "grpo") -> list[str]:
    out = []
    for d in sorted(t1.domain.unique()):
        sub = t1[t1.domain == d].set_index("method")
        best = sub["mean"].idxmax()
        line = f"- **{domain_name(d)}**: best mean {display(best)} {sub.loc[best, 'mean']:.3f}"
        for m in (method, reference, "vanilla"):
            if m in sub.index and m != best:
                line += (
                    f"; {display(m)} {sub.loc[m, 'mean']:.3f} [{sub.loc[m, 'ci_low']:.3f}, {sub.loc[m, 'ci_high']:.3f}]"
                )
        if method in sub.index and reference in sub.index:
            a, b = sub.loc[method], sub.loc[reference]
            verdict = (
                "the 95 % CIs overlap"
                if _overlap(a, b)
                else ("CIs separate, " + display(method) + (" higher" if a["mean"] > b["mean"] else " lower"))
            )
            line += f". {display(method)} − {display(reference)} = {a['mean'] - b['mean']:+.3f} ({verdict})"
        budget = int(sub["rollout_budget"].max())
        out.append(line + f"; {int(sub['n_seeds'].max())} seeds, {budget} student rollouts.")
    return out


def headline_targets(tg: pd.DataFrame, method: str = "lopd") -> list[str]:
    out = []
    for r in tg[tg.method == method].itertuples():
        ref = display(r.reference)
        if pd.isna(r.rollouts_to_target):
            out.append(
                f"- {domain_name(r.domain)}: {display(method)} does not reach {ref}'s final score {r.target:.3f} "
                "within the budget."
            )
        elif r.at_start:
            out.append(
                f"- {domain_name(r.domain)}: {ref}'s final score {r.target:.3f} is at or below {display(method)}'s "
                "score before training: reached at 0 rollouts, which says nothing about learning."
            )
        else:
            ci = "not reached" if pd.isna(r.ci_high) else f"{r.ci_high:.0f}"
            lo = "not reached" if pd.isna(r.ci_low) else f"{r.ci_low:.0f}"
            out.append(
                f"- {domain_name(r.domain)}: {display(method)} reaches {ref}'s final score {r.target:.3f} "
                f"at {r.rollouts_to_target:.0f} of {r.budget} rollouts "
                f"(ratio {r.ratio:.2f}; 95 % CI [{lo}, {ci}]; {r.reached_share:.0%} of bootstrap resamples reach it; "
                "paper: < 0.30)."
            )
    return out


def headline_improvement(poi: pd.DataFrame) -> list[str]:
    allrows = poi[poi.domain == "all"] if "all" in set(poi.domain) else poi
    out = []
    for r in allrows.itertuples():
        clear = "above 0.5" if r.ci_low > 0.5 else ("below 0.5" if r.ci_high < 0.5 else "holds 0.5")
        where = "all domains" if r.domain == "all" else domain_name(r.domain)
        out.append(
            f"- P({display(r.method)} > {display(r.baseline)}) = {r.poi:.2f} [{r.ci_low:.2f}, {r.ci_high:.2f}] "
            f"over {where} (CI {clear})."
        )
    return out


def headline_ablations(ab: pd.DataFrame) -> list[str]:
    """The paper's ordering: margin 0.05 (lopd) > frozen composer > no margin (m = 0)."""
    out = []
    for d in sorted(ab.domain.unique()):
        sub = ab[ab.domain == d].set_index("method")
        need = [m for m in ("lopd", "lopd_frozen", "lopd_m0") if m in sub.index]
        if len(need) < 3:
            continue
        a, f, z = (sub.loc[m] for m in ("lopd", "lopd_frozen", "lopd_m0"))
        holds = a["mean"] > f["mean"] > z["mean"]
        noise = _overlap(a, f) and _overlap(f, z) and _overlap(a, z)
        out.append(
            f"- {domain_name(d)}: LOPD (m = 0.05) {a['mean']:.3f}, frozen composer {f['mean']:.3f}, "
            f"m = 0 {z['mean']:.3f}: the paper's ordering "
            f"{'holds in the means' if holds else 'does not hold in the means'}"
            f"{' (all three CIs overlap)' if noise else ''}."
        )
        readings = [
            (m, name)
            for m, name in (
                ("lopd_text", "the text control (the same items as text)"),
                ("lopd_successes_only", "successes only distilled"),
                ("lopd_noself", "no self-retrieval"),
            )
            if m in sub.index
        ]
        if readings:
            out.append(
                f"- {domain_name(d)}: LOPD {a['mean']:.3f} against "
                + "; ".join(
                    f"{name} {sub.loc[m, 'mean']:.3f}{' (CIs overlap)' if _overlap(a, sub.loc[m]) else ''}"
                    for m, name in readings
                )
                + "."
            )
        others = sub.drop(index="lopd")
        lo_m, hi_m = others["mean"].min(), others["mean"].max()
        out.append(
            f"- {domain_name(d)}: every variant's mean lies in [{lo_m:.3f}, {hi_m:.3f}] against LOPD's {a['mean']:.3f}."
        )
    return out


def headline_dynamics(dyn: pd.DataFrame) -> list[str]:
    out = []
    for d in sorted(dyn.domain.unique()):
        sub = dyn[(dyn.domain == d) & (dyn.method == "lopd")]
        parts = []
        for q, name in (("lopd_beta", "β"), ("lopd_margin", "Δ")):
            g = sub[sub.metric == q].sort_values("rollouts")
            if not g.empty:
                parts.append(f"{name} {g['mean'].iloc[0]:.3f} → {g['mean'].iloc[-1]:.3f}")
        if parts:
            out.append(f"- {domain_name(d)} (LOPD, mean over seeds, first → last step): " + ", ".join(parts) + ".")
    return out


def headline_diagnosis(dg: pd.DataFrame) -> list[str]:
    """Where LOPD lands and why: one paragraph of measured numbers per domain (:mod:`analysis.lopd_diagnosis`)."""
    from .lopd_diagnosis import paragraph

    return [f"- {p}" for d in sorted(dg.domain.unique()) if (p := paragraph(dg, d))]


def headline_teacher_check(tc: pd.DataFrame) -> list[str]:
    """Issue 3's sanity check per method: does the method's own privileged context help its teacher?"""
    per = tc.drop_duplicates(["domain", "method"])
    out = []
    for d in sorted(per.domain.unique()):
        sub = per[per.domain == d].set_index("method")
        parts = [
            f"{display(m)} {r.seeds_passing}/{r.n_seeds} seeds (mean {r.mean_gain:+.3f})"
            for m, r in sub.loc[ordered(sub.index)].iterrows()
        ]
        out.append(
            f"- {domain_name(d)}, teacher sanity check (own context helps the teacher; "
            "nats/token, logged once per run): " + ", ".join(parts) + "."
        )
    return out


CONTEXT_GAINS = {
    "context_gain_own_solution": "own solution (OPSD, SDFT, SDPO's sibling)",
    "context_gain_same_group": "same-group trace (retrieval)",
    "context_gain_other_group": "other-group trace",
    "context_gain_feedback": "feedback on a failed attempt (SDPO)",
    "context_gain_skill": "skill (Skill-SD)",
}


def _gain_cell(e: dict, key: str) -> str:
    if not isinstance(e.get(key), (int, float)):
        return "not measured"
    before = e.get(f"stage1_{key}")
    return f"{e[key]:+.4f}" + (f" (stage 1 {before:+.4f})" if isinstance(before, (int, float)) else "")


def headline_testbed(tb: pd.DataFrame) -> list[str]:
    """One line per domain: which test-bed checks fail (the comparison's fitness comes first)."""
    out = []
    for d in sorted(tb.domain.unique()):
        sub = tb[tb.domain == d]
        bad = sub[~sub["pass"].astype(bool)]
        if bad.empty:
            out.append(f"- {domain_name(d)}: every test-bed check passes.")
        else:
            parts = [f"{r['check']} {r['value']:.3f} (needs {r['threshold']})" for r in bad.to_dict("records")]
            out.append(f"- {domain_name(d)}: test-bed checks failing: " + ", ".join(parts) + ".")
    return out


def context_gains_section(evals: list[str]) -> list[str]:
    """What each kind of privileged context gives the warm start (the teacher of every
    self-distillation method): change of the expert actions' mean log-likelihood per token
    on held-out tasks, from each warm start's ``eval.json`` (the teacher sanity check); where the
    warm start had the on-policy stage, stage 1's value follows in parentheses."""
    rows = [json.loads(Path(p).read_text()) for p in evals]
    rows.sort(key=lambda e: (e["domain"], e["seed"]))
    lines = [
        "| domain | seed | " + " | ".join(CONTEXT_GAINS.values()) + " |",
        "|---|---|" + "---|" * len(CONTEXT_GAINS),
    ]
    for e in rows:
        cells = [_gain_cell(e, k) for k in CONTEXT_GAINS]
        lines.append(f"| {domain_name(e['domain'])} | {e['seed']} | " + " | ".join(cells) + " |")
    return lines


def build(a: argparse.Namespace) -> str:
    out = Path(a.out)
    t1 = pd.read_csv(a.table1)
    lines = [
        "# LOPD benchmark: report",
        "",
        f"Generated by `snakemake --cores all {a.out}` from the runs (code at {git_commit()['commit'][:12]}). "
        "Every number below is read from the files named in each section.",
        "",
    ]
    if a.testbed_md:
        lines += [
            f"## Test-bed validity (`{a.testbed_md}`)",
            "",
            "Whether this profile can tell methods apart at all; read it before any comparison below.",
            "",
            _section(a.testbed_md),
            "",
        ]
    lines += [
        "## Headline",
        "",
        *headline_table1(t1),
    ]
    if a.testbed:
        lines += ["", *headline_testbed(pd.read_csv(a.testbed))]
    if a.targets:
        lines += ["", *headline_targets(pd.read_csv(a.targets))]
    if a.improvement:
        lines += ["", *headline_improvement(pd.read_csv(a.improvement))]
    if a.ablations:
        lines += ["", *headline_ablations(pd.read_csv(a.ablations))]
    if a.dynamics:
        lines += ["", *headline_dynamics(pd.read_csv(a.dynamics))]
    if a.teacher_check:
        lines += ["", *headline_teacher_check(pd.read_csv(a.teacher_check))]
    if a.diagnosis:
        lines += ["", *headline_diagnosis(pd.read_csv(a.diagnosis))]
    lines += ["", f"## Table 1 (`{a.table1}`)", "", _section(a.table1_md)]
    if a.paired_md:
        lines += ["", f"## Paired differences (`{a.paired_md}`)", "", _section(a.paired_md)]
    if a.compute_md:
        lines += ["", f"## Compute-matched view (`{a.compute_md}`)", "", _section(a.compute_md)]
        if a.compute_figure:
            lines += ["", f"![reward against compute]({_rel(a.compute_figure, out)})"]
    if a.figure:
        lines += [
            "",
            "## Sample efficiency (the paper's Fig. 4)",
            "",
            f"![sample efficiency]({_rel(a.figure, out)})",
            "",
            (
                f"PDF: `{Path(a.figure).with_suffix('.pdf')}`. "
                "Bottom row: each method minus GRPO at the same RL seed (paired)."
            ),
        ]
    for md, title in (
        (a.targets_md, "Rollouts to target"),
        (a.improvement_md, "Probability of improvement"),
        (a.ablations_md, "Ablations"),
        (a.behaviour_md, "Behaviour (the paper's Table 3)"),
        (a.diagnosis_md, "LOPD diagnosis: where it lands and why"),
    ):
        if md:
            lines += ["", f"## {title} (`{md}`)", "", _section(md)]
    if a.dynamics_figure:
        lines += ["", "## LOPD dynamics", "", f"![LOPD dynamics]({_rel(a.dynamics_figure, out)})"]
    if a.teacher_check_md:
        lines += ["", f"## Teacher sanity check (`{a.teacher_check_md}`)", "", _section(a.teacher_check_md)]
    if a.warmstarts:
        lines += [
            "",
            (
                "## What each privileged context gives the warm start (nats/token on held-out expert actions; "
                "> 0: the teacher can use it)"
            ),
            "",
            *context_gains_section(a.warmstarts),
        ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m analysis.report", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--table1", required=True)
    p.add_argument("--table1-md", required=True)
    p.add_argument("--targets")
    p.add_argument("--targets-md")
    p.add_argument("--improvement")
    p.add_argument("--improvement-md")
    p.add_argument("--ablations")
    p.add_argument("--ablations-md")
    p.add_argument("--behaviour-md")
    p.add_argument("--dynamics", help="lopd_dynamics.csv")
    p.add_argument("--diagnosis", help="lopd_diagnosis.csv (one paragraph per domain in the headline)")
    p.add_argument("--diagnosis-md", help="lopd_diagnosis.md (section)")
    p.add_argument("--figure", help="sample-efficiency PNG")
    p.add_argument("--dynamics-figure", help="LOPD dynamics PNG")
    p.add_argument("--teacher-check", help="teacher_check.csv (headline)")
    p.add_argument("--teacher-check-md", help="teacher_check.md (section)")
    p.add_argument("--warmstarts", nargs="*", default=[], help="warm-start eval.json files (context gains table)")
    p.add_argument("--testbed", help="testbed.csv (headline)")
    p.add_argument("--testbed-md", help="testbed.md (the report's first table)")
    p.add_argument("--paired-md", help="paired.md (paired differences section)")
    p.add_argument("--compute-md", help="compute.md (the compute-matched view)")
    p.add_argument("--compute-figure", help="compute.png (reward against training time and token passes)")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    for name in (
        "table1",
        "table1_md",
        "targets",
        "targets_md",
        "improvement",
        "improvement_md",
        "ablations",
        "ablations_md",
        "behaviour_md",
        "dynamics",
        "diagnosis",
        "diagnosis_md",
        "figure",
        "dynamics_figure",
        "testbed",
        "testbed_md",
        "paired_md",
        "compute_md",
        "compute_figure",
    ):
        v = getattr(a, name)
        if v and not Path(v).exists():
            p.error(f"--{name.replace('_', '-')} {v}: no such file")
    text = build(a)
    write_text_atomic(Path(a.out), text)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()

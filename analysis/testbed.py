"""Test-bed validity: can this comparison show a difference between methods when one exists?

    python -m analysis.testbed --probes results/small/testbed/*/testbed.json \\
        --vanilla results/small/warmstart/*/eval.json --runs results/small/runs/*/*/seed*/summary.json \\
        --out-csv results/small/testbed.csv --out-md results/small/testbed.md

One row per (domain, check) with columns domain, check, value, threshold, pass
(``docs/testbed.md`` says why each check matters).  The thresholds are fixed
here, not in the configuration: they are properties the test bed must have, and
no method's settings are tuned to meet them.

* ``grpo_gain`` / ``grpo_gain_ci_low`` -- transferable headroom: GRPO at the full
  budget minus the base policy on held-out tasks, mean over RL seeds >= +0.10
  and the lower end of its 95 % bootstrap CI > 0;
* ``reference_gain`` -- privileged information is usable: the base policy with
  the task's reference solution in context minus without, >= +0.30;
* ``retrieval_gain`` / ``retrieval_same_group`` -- experience is usable: with the
  top-3 retrieved training successes in context minus without, >= +0.05, and
  >= 80 % of the retrieved items from the task's own group;
* ``eval_se`` -- evaluations are precise: the largest standard error of the
  mean held-out reward among the base policy's evaluation and every run's
  final evaluation of the domain, <= 0.015.

The probe values come from ``methods.cli testbed`` (:mod:`methods.testbed`);
the headroom from the GRPO runs and the base policy's ``eval.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import operator
from pathlib import Path

import pandas as pd

from .names import domain_name
from .runs import final_rows, write_table
from .stats import bootstrap_ci

COLUMNS = ["domain", "check", "value", "threshold", "pass"]
# check -> (comparison, threshold, what it says); the thresholds of docs/testbed.md, never relaxed
CHECKS = {
    "grpo_gain": (">=", 0.10, "GRPO minus the base policy, held-out reward, mean over RL seeds"),
    "grpo_gain_ci_low": (">", 0.0, "lower end of that difference's 95 % CI over seeds"),
    "reference_gain": (">=", 0.30, "base policy with the task's reference solution in context minus without"),
    "retrieval_gain": (">=", 0.05, "base policy with the top-3 retrieved training successes in context minus without"),
    "retrieval_same_group": (">=", 0.80, "share of retrieved items from the task's own group (variant / project)"),
    "eval_se": ("<=", 0.015, "largest standard error of one held-out evaluation (base policy and final evaluations)"),
}
_OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le}


def _value(x) -> float:
    return float(x) if isinstance(x, (int, float)) else math.nan


def domain_values(domain: str, probe: dict | None, rows: list[dict]) -> dict[str, float]:
    """The measured value of every check on one domain (NaN where its inputs are missing)."""
    vals = dict.fromkeys(CHECKS, math.nan)
    van = [r for r in rows if r["domain"] == domain and r["method"] == "vanilla"]
    grpo = sorted((r for r in rows if r["domain"] == domain and r["method"] == "grpo"), key=lambda r: r["seed"])
    if len(van) == 1 and grpo:
        mean, lo, _ = bootstrap_ci([r["value"] - van[0]["value"] for r in grpo])
        vals["grpo_gain"], vals["grpo_gain_ci_low"] = mean, lo
    ses = [_value(r.get("heldout_reward_se")) for r in rows if r["domain"] == domain]
    if probe is not None:
        ses.append(_value(probe.get("reward_no_context_se")))
        for key in ("reference_gain", "retrieval_gain", "retrieval_same_group"):
            vals[key] = _value(probe.get(key))
    ses = [s for s in ses if not math.isnan(s)]
    if ses:
        vals["eval_se"] = max(ses)
    return vals


def checks(probes: list[dict], rows: list[dict]) -> pd.DataFrame:
    by_domain = {p["domain"]: p for p in probes}
    out = []
    for d in sorted({r["domain"] for r in rows} | set(by_domain)):
        for name, value in domain_values(d, by_domain.get(d), rows).items():
            op, thr, _ = CHECKS[name]
            ok = (not math.isnan(value)) and _OPS[op](value, thr)
            out.append({"domain": d, "check": name, "value": value, "threshold": f"{op} {thr:g}", "pass": bool(ok)})
    return pd.DataFrame(out, columns=COLUMNS)


def to_markdown(df: pd.DataFrame) -> str:
    n_fail = int((~df["pass"]).sum())
    verdict = (
        "every check passes: the test bed can show a difference where one exists"
        if n_fail == 0
        else (
            f"{n_fail} of {len(df)} checks fail: "
            "differences between methods on this profile may be invisible or meaningless"
        )
    )
    lines = [
        "# Test-bed validity (held-out tasks, the profile's own evaluation protocol)",
        "",
        f"Verdict: {verdict}.",
        "",
        "| domain | check | value | threshold | pass | what it measures |",
        "|---|---|---|---|---|---|",
    ]
    for r in df.to_dict("records"):
        v = (
            "not measured"
            if math.isnan(r["value"])
            else f"{r['value']:.4f}"
            if r["check"] == "eval_se"
            else f"{r['value']:+.4f}"
        )
        lines.append(
            f"| {domain_name(r['domain'])} | {r['check']} | {v} | {r['threshold']} | "
            f"{'yes' if r['pass'] else '**no**'} | {CHECKS[r['check']][2]} |"
        )
    return "\n".join(lines) + "\n"


def coverage_lines(probes: list[dict]) -> str:
    """Beside the checks: how many held-out tasks the bank can serve with their own group's
    experience at all (test-only variants cannot be covered by design), and the same-group share
    among those it covers."""
    rows = [p for p in probes if p.get("bank_group_coverage") is not None]
    if not rows:
        return ""
    lines = ["", "| domain | bank's coverage of held-out groups | same-group share where covered |", "|---|---|---|"]
    for p in sorted(rows, key=lambda p: p["domain"]):
        seen = p.get("retrieval_same_group_seen")
        lines.append(
            f"| {domain_name(p['domain'])} | {p['bank_group_coverage']:.3f} | {'' if seen is None else f'{seen:.3f}'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m analysis.testbed", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--probes", nargs="*", default=[], help="testbed.json files of methods.cli testbed (one per domain)")
    p.add_argument("--vanilla", nargs="*", default=[], help="base-policy eval.json files (one per domain)")
    p.add_argument(
        "--runs", nargs="*", default=[], help="run summary.json files (GRPO's give the headroom; all give eval_se)"
    )
    p.add_argument("--out-csv", required=True)
    p.add_argument("--out-md", required=True)
    a = p.parse_args(argv)
    probes = [json.loads(Path(x).read_text()) for x in a.probes]
    rows = final_rows(a.vanilla, a.runs)
    if not rows and not probes:
        p.error("nothing to check: give --probes, --vanilla or --runs")
    df = checks(probes, rows)
    write_table(df, to_markdown(df) + coverage_lines(probes), a.out_csv, a.out_md)


if __name__ == "__main__":
    main()

"""Reading finished runs: one place that knows the layout of ``summary.json``,
``metrics.jsonl`` and the warm start's ``eval.json``.

Every analysis (Table 1, curves, behaviour, rollouts-to-target, probability of
improvement) starts from these rows, so all of them refuse the same
incomparable inputs (``check_comparable``).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pandas as pd

from methods.core.provenance import write_text_atomic

METRIC = "heldout_reward"


class MixedRunsError(ValueError):
    pass


def _heldout(record: dict) -> dict:
    return {k: v for k, v in record.items() if k.startswith("heldout_") and isinstance(v, (int, float))}


def final_rows(vanilla: list[str], runs: list[str]) -> list[dict]:
    """One row per (domain, method, seed): the final held-out metrics, budget and provenance.

    Vanilla (the warm start's own evaluation) is method ``vanilla`` with budget 0.
    """
    rows = []
    for p in vanilla:
        e = json.loads(Path(p).read_text())
        rows.append(
            {
                "path": p,
                "domain": e["domain"],
                "method": "vanilla",
                "seed": e["seed"],
                "version": e["domain_version"],
                "budget": 0,
                "pre": 0,
                "value": e[METRIC],
                **_heldout(e),
            }
        )
    for p in runs:
        s = json.loads(Path(p).read_text())
        led = s["ledger"]
        rows.append(
            {
                "path": p,
                "domain": s["domain"],
                "method": s["method"],
                "seed": s["seed"],
                "version": s["domain_version"],
                "budget": led["rollout_budget"],
                "used": led["rollouts"],
                "pre": led.get("pre_rollouts", 0),
                "value": s["final"][METRIC],
                **_heldout(s["final"]),
            }
        )
    return rows


def check_comparable(rows: list[dict]) -> None:
    """One task version per domain, one rollout budget among the trained methods of a domain,
    every run finished, no seed twice.  The error names the runs that disagree."""
    by_domain = defaultdict(list)
    for r in rows:
        by_domain[r["domain"]].append(r)
    for domain, rs in by_domain.items():
        versions = defaultdict(list)
        for r in rs:
            versions[r["version"]].append(r["path"])
        if len(versions) > 1:
            detail = "; ".join(f"{v}: {', '.join(ps)}" for v, ps in versions.items())
            raise MixedRunsError(f"domain {domain!r} mixes task versions: {detail}")
        budgets = defaultdict(list)
        for r in rs:
            if r["method"] != "vanilla":
                budgets[r["budget"]].append(r["path"])
                if r.get("used") is not None and r["used"] != r["budget"]:
                    raise MixedRunsError(
                        f"run {r['path']} used {r['used']} rollouts of its budget {r['budget']} (unfinished?)"
                    )
        if len(budgets) > 1:
            detail = "; ".join(f"{b} rollouts: {', '.join(ps)}" for b, ps in budgets.items())
            raise MixedRunsError(f"domain {domain!r} mixes rollout budgets: {detail}")
        seen = defaultdict(list)
        for r in rs:
            seen[(r["method"], r["seed"])].append(r["path"])
        for (method, seed), ps in seen.items():
            if len(ps) > 1:
                raise MixedRunsError(f"{domain}/{method}: seed {seed} listed twice: {ps}")


def finals(vanilla: list[str], runs: list[str]) -> pd.DataFrame:
    """``final_rows`` as a DataFrame, after ``check_comparable``."""
    rows = final_rows(vanilla, runs)
    check_comparable(rows)
    return pd.DataFrame(rows)


def run_records(summary_path: str) -> tuple[dict, list[dict]]:
    """A run's ``summary.json`` and the records of the ``metrics.jsonl`` beside it, in order."""
    s = json.loads(Path(summary_path).read_text())
    lines = (Path(summary_path).parent / "metrics.jsonl").read_text().splitlines()
    return s, [json.loads(line) for line in lines if line.strip()]


def eval_points(runs: list[str], extra=None) -> pd.DataFrame:
    """Every held-out evaluation of every run: (domain, method, seed, rollouts, heldout_*), plus the
    columns ``extra(record)`` derives from each evaluation record where given."""
    out = []
    for p in runs:
        s, recs = run_records(p)
        for rec in recs:
            if rec.get("kind") == "eval":
                out.append(
                    {
                        "domain": s["domain"],
                        "method": s["method"],
                        "seed": s["seed"],
                        "rollouts": rec["rollouts"],
                        **_heldout(rec),
                        **(extra(rec) if extra else {}),
                    }
                )
    return pd.DataFrame(out)


def write_table(df: pd.DataFrame, markdown: str, out_csv: str, out_md: str) -> None:
    """Write a table as CSV and markdown (each atomically) and say where they went."""
    write_text_atomic(Path(out_csv), df.to_csv(index=False))
    write_text_atomic(Path(out_md), markdown)
    print(markdown)
    print(f"wrote {out_csv}, {out_md}")

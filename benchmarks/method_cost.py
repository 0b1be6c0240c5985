"""No stated target: measures each method's step cost from finished runs; its x GRPO column is the ratio.

Per-step cost of every method relative to GRPO, from finished runs.

    python benchmarks/method_cost.py --runs results/small/runs

For each (domain, method): mean wall time per training step (rollouts + update
+ retrieval, from ``metrics.jsonl``), teacher-scored tokens per step,
generated tokens per step (from the ledger) and the rollouts the update trained
on per step (GRPO skips groups whose rewards are all equal), averaged over seeds, and the
ratio of the step time to GRPO's on the same domain.  The runs of one pipeline
share the machine the same way (two single-thread jobs on two cores), so their
times compare; evaluations are excluded.  Prints a Markdown table and one JSON
line per row.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

# LOPD's timed parts, all inside the loop's update timer (methods/lopd/method.py)
LOPD_PARTS = ("lopd_retrieval_s", "composer_s", "teacher_s", "composer_step_s", "bank_add_s")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", default="results/small/runs", help="directory of <domain>/<method>/seed<S>/ runs")
    a = p.parse_args(argv)
    rows = defaultdict(list)
    for summary in sorted(Path(a.runs).glob("*/*/seed*/summary.json")):
        s = json.loads(summary.read_text())
        steps = [json.loads(x) for x in (summary.parent / "metrics.jsonl").read_text().splitlines() if x.strip()]
        steps = [r for r in steps if r["kind"] == "train"]
        if not steps:
            continue
        wall = sum(r["rollout_s"] + r.get("update_s", 0.0) + r.get("retrieval_s", 0.0) for r in steps) / len(steps)
        led = s["ledger"]
        trained = sum(r.get("trained_rollouts", 0) for r in steps) / len(steps)
        parts = {k: sum(r.get(k, 0.0) for r in steps) / len(steps) for k in ("rollout_s", "update_s", *LOPD_PARTS)}
        rows[(s["domain"], s["method"])].append(
            {
                "step_s": wall,
                "teacher_tokens": led["teacher_tokens"] / len(steps),
                "generated_tokens": led["generated_tokens"] / len(steps),
                "trained_rollouts": trained,
                **parts,
            }
        )
    if not rows:
        p.error(f"no finished runs under {a.runs}")
    table = []
    for (domain, method), rs in sorted(rows.items()):
        mean = {k: sum(r[k] for r in rs) / len(rs) for k in rs[0]}
        table.append(
            {"domain": domain, "method": method, "seeds": len(rs), **{k: round(v, 3) for k, v in mean.items()}}
        )
    for row in table:
        base = next((r for r in table if r["domain"] == row["domain"] and r["method"] == "grpo"), None)
        row["step_time_vs_grpo"] = round(row["step_s"] / base["step_s"], 2) if base else None
    print(
        "| domain | method | seeds | s / step | x GRPO | teacher tokens / step | generated tokens / step | "
        "rollouts trained on / step |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in table:
        print(
            f"| {r['domain']} | {r['method']} | {r['seeds']} | {r['step_s']:.2f} | {r['step_time_vs_grpo']} | "
            f"{r['teacher_tokens']:.0f} | {r['generated_tokens']:.0f} | {r['trained_rollouts']:.1f} |"
        )
    lopd = [r for r in table if r.get("composer_s")]
    if lopd:
        print(
            "\nWhere an LOPD step's time goes "
            "(s / step; 'student' = the student's update: the rest of the update timer)"
        )
        print(
            "| domain | method | rollouts | retrieval | composer (latents) | "
            "teacher | composer step | bank growth | student |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for r in lopd:
            student = r["update_s"] - sum(r[k] for k in LOPD_PARTS)
            print(
                f"| {r['domain']} | {r['method']} | {r['rollout_s']:.2f} | {r['lopd_retrieval_s']:.2f} | "
                f"{r['composer_s']:.2f} | {r['teacher_s']:.2f} | {r['composer_step_s']:.2f} | "
                f"{r['bank_add_s']:.2f} | {student:.2f} |"
            )
    for r in table:
        print(json.dumps(r))


if __name__ == "__main__":
    main()

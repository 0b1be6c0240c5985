"""Target: LOPD's step at most 3x GRPO's (issue 38). The last line's over_grpo is the ratio; <= 3 meets it.

A LOPD training step against a GRPO step at the same number of rollouts (issue 38's target:
LOPD <= 3x GRPO), measured in one invocation on the small profile, and where LOPD's time goes.

    python benchmarks/bench_lopd_step.py --domain code
    python benchmarks/bench_lopd_step.py --domain tooluse --steps 6 --variants lopd lopd_text

Both methods train from the same warm start (``results/<profile>/warmstart/<domain>``)
for ``--steps`` steps of ``rollouts_per_step`` (32) rollouts on one thread; LOPD also
loads the seeded bank and its cold-started composer from ``results/`` (``--composer``
names another file of the same architecture: its weights do not change the cost).  Step time =
rollouts + update (LOPD's retrieval, composer, teacher, composer step and bank growth
are inside its update timer), the first step dropped as warm-up, evaluations excluded
(one 8-episode evaluation is forced at the end).  Prints one JSON line per method and a
final line with the ratio and LOPD's breakdown per step.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.method_cost import LOPD_PARTS  # noqa: E402  (LOPD's timed parts, as method_cost.py reads them)

PARTS = ("rollout_s", "update_s", *LOPD_PARTS)


def run_steps(method: str, domain: str, seed: int, steps: int, profile: str, extra_args: list[str]) -> dict:
    from benchmarks.bench_grpo_run import resolve, run_job

    per_step = resolve(domain, method, profile)["train"]["rollouts_per_step"]
    train = {
        "rollout_budget": per_step * steps,
        "eval_every": per_step * (steps + 1),
        "eval_episodes": 8,
        "curve_eval_episodes": None,
        "checkpoint_every": 10**6,
    }
    job = resolve(domain, method, profile, train=train)
    ws = ROOT / "results" / profile / "warmstart" / domain
    recs, _ = run_job(job, seed, ws, extra_args)
    trains = [r for r in recs if r["kind"] == "train"][1:]  # the first step warms up
    mean = {k: sum(r.get(k) or 0.0 for r in trains) / len(trains) for k in PARTS}
    return {
        "method": method,
        "domain": domain,
        "seed": seed,
        "steps_timed": len(trains),
        "rollouts_per_step": per_step,
        "step_s": round(mean["rollout_s"] + mean["update_s"], 3),
        **{k: round(v, 3) for k, v in mean.items()},
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        prog="python benchmarks/bench_lopd_step.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--domain", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=6, help="training steps per method (the first is not timed)")
    p.add_argument("--profile", default="small")
    p.add_argument("--variants", nargs="+", default=["lopd"], help="LOPD and/or its variants (run names)")
    p.add_argument("--composer", type=Path, help="composer.pt (default: the pipeline's cold start of LOPD)")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    base = ROOT / "results" / a.profile
    from methods.core.config import cold_start_key

    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["profile"] = a.profile
    bank = base / "bank" / a.domain / "bank.pt"
    composer = a.composer or (
        base / "coldstart" / a.domain / cold_start_key(config, a.domain, "lopd") / f"seed{a.seed}" / "composer.pt"
    )
    needs = [bank] + ([composer] if any(cold_start_key(config, a.domain, v) for v in a.variants) else [])
    for f in needs:
        if not f.exists():
            p.error(f"{f} is missing: run the pipeline's bank and coldstart rules first (snakemake --cores all {f})")
    grpo = run_steps("grpo", a.domain, a.seed, a.steps, a.profile, [])
    print(json.dumps(grpo), flush=True)
    for name in a.variants:
        extra = ["--bank", str(bank)] + (
            ["--composer", str(composer)] if cold_start_key(config, a.domain, name) else []
        )
        lopd = run_steps(name, a.domain, a.seed, a.steps, a.profile, extra)
        print(json.dumps(lopd), flush=True)
        student = lopd["update_s"] - sum(lopd[k] for k in PARTS[2:])
        print(
            json.dumps(
                {
                    "domain": a.domain,
                    "variant": name,
                    "over_grpo": round(lopd["step_s"] / grpo["step_s"], 2),
                    "target": 3.0,
                    "breakdown_s": {
                        "rollouts": lopd["rollout_s"],
                        "retrieval": lopd["lopd_retrieval_s"],
                        "composer_latents": lopd["composer_s"],
                        "teacher": lopd["teacher_s"],
                        "composer_step": lopd["composer_step_s"],
                        "bank_growth": lopd["bank_add_s"],
                        "student_update_and_margin_terms": round(student, 3),
                    },
                    "grpo_breakdown_s": {"rollouts": grpo["rollout_s"], "update": grpo["update_s"]},
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()

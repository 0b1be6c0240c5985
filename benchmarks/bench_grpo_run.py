"""Target: a small-profile GRPO run in <= 80 s on one core. Prints wall_s; at most target_s (80) meets it.

Wall time of one small-profile training run (one domain, one seed, the default budget,
held-out evaluations included) on one core.  Target: <= 80 s for GRPO.

    python benchmarks/bench_grpo_run.py --domain tooluse --warmstart results/small/warmstart/tooluse

Prints one JSON line: wall time, rollouts, the ledger, where the time went and the
held-out learning curve.  ``--set`` overrides resolved job settings, e.g. to compare
learning rates on one warm start (the profile's values are the defaults)::

    python benchmarks/bench_grpo_run.py --domain code --warmstart results/small/warmstart/code \
        --set train.lr=1e-5 train.temperature=1.0
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def resolve(domain: str, method: str, profile: str = "small", overrides=(), train: dict | None = None) -> dict:
    """The pipeline's resolved job for (domain, method) on ``profile``, with ``train`` fields
    replaced and ``overrides`` ("train.<field>=<value>" / "method_config.<field>=<value>")
    applied, validated like the config.  Shared by the benchmarks that train."""
    from methods.core.config import resolve_job

    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["profile"] = profile
    job = resolve_job(config, domain, method)
    job["train"].update(train or {})
    for item in overrides:
        key, _, value = item.partition("=")
        section, _, field = key.partition(".")
        if section not in ("train", "method_config") or field not in job[section]:
            raise ValueError(
                f"--set {item}: expected train.<field>=<value> or method_config.<field>=<value> with an existing field"
            )
        job[section][field] = _parse_value(value)
    _validate(job, job["method"])  # a variant (an ablation's run name) validates as the method it varies
    return job


def run_job(job: dict, seed: int, warmstart, extra_args=(), threads: int = 1) -> tuple[list[dict], dict]:
    """Train ``job`` with the pipeline's own entry point (``python -m methods.cli train``) in a
    temporary directory; returns (metrics.jsonl records, summary.json)."""
    from methods.cli import main as cli

    with tempfile.TemporaryDirectory() as out:
        cli(
            [
                "train",
                "--job",
                json.dumps(job),
                "--seed",
                str(seed),
                "--warmstart",
                str(warmstart),
                "--out",
                out,
                "--threads",
                str(threads),
                *extra_args,
            ]
        )
        recs = [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines() if x.strip()]
        summary = json.loads((Path(out) / "summary.json").read_text())
    return recs, summary


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--domain", required=True)
    p.add_argument("--method", default="grpo")
    p.add_argument("--warmstart", required=True)
    p.add_argument("--profile", default="small")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a resolved setting (sections: train, method_config), validated like the config",
    )
    a = p.parse_args(argv)
    try:
        job = resolve(a.domain, a.method, a.profile, a.set)
    except ValueError as e:
        p.error(str(e))
    t0 = time.perf_counter()
    recs, summary = run_job(job, a.seed, a.warmstart)
    wall = time.perf_counter() - t0
    trains = [r for r in recs if r["kind"] == "train"]
    rollout_s = sum(r["rollout_s"] for r in trains)
    print(
        json.dumps(
            {
                "method": a.method,
                "domain": a.domain,
                "profile": a.profile,
                "threads": torch.get_num_threads(),
                "wall_s": round(wall, 1),
                "target_s": 80,
                "rollouts": summary["ledger"]["rollouts"],
                "train_rollout_s": round(rollout_s, 1),
                "train_update_s": round(sum(r["update_s"] for r in trains), 1),
                "eval_s": round(sum(r["eval_s"] for r in recs if r["kind"] == "eval"), 1),
                "evals": sum(r["kind"] == "eval" for r in recs),
                "final_heldout_reward": summary["final"]["heldout_reward"],
                "curve": [(r["rollouts"], round(r["heldout_reward"], 3)) for r in recs if r["kind"] == "eval"],
                "teacher_context_gain": next(
                    (r["teacher_context_gain"] for r in trains if "teacher_context_gain" in r), None
                ),
                "overrides": a.set,
                "ledger": summary["ledger"],
            }
        )
    )


def _parse_value(text: str):
    """A number where the text is one (PyYAML reads ``3e-5`` as a string), else YAML."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return yaml.safe_load(text)


def _validate(job: dict, method: str) -> None:
    from methods.core.loop import TrainConfig
    from methods.core.registry import get_method, make_config

    make_config(TrainConfig, job["train"], "train")
    make_config(get_method(method).Config, job["method_config"], f"methods.{method}")


if __name__ == "__main__":
    main()

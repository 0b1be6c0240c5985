"""Diagnostic: does GRPO raise reward on the tasks it trains on?

Trains GRPO through the shared loop on a fixed set of ``--tasks`` training
tasks (every step samples from them) and evaluates, greedily, on the same
tasks.  A rise here with no rise on held-out tasks means the method learns
but its gains do not transfer at the budget; no rise means the update itself
is broken.  Prints the learning curve as one JSON line.

    python benchmarks/probes/grpo_fixed_tasks.py --domain tooluse --warmstart results/small/warmstart/tooluse
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> None:
    from dataclasses import replace

    from methods.core.config import resolve_job
    from methods.core.ledger import Ledger
    from methods.core.loop import RunContext, TrainConfig, train
    from methods.core.policy import load_policy
    from methods.core.registry import get_method, make_config
    from methods.core.tokenizer import ChatEncoder
    from tasks.base import get_domain

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--domain", required=True)
    p.add_argument("--warmstart", required=True, help="warm start directory (holds model/)")
    p.add_argument("--tasks", type=int, default=16, help="size of the fixed training task set")
    p.add_argument("--budget", type=int, default=1280, help="rollouts")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--rollouts-per-step", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--lr", type=float, default=None, help="default: the profile's train.lr")
    p.add_argument("--profile", default="small")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)

    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["profile"] = a.profile
    job = resolve_job(config, a.domain, "grpo")
    cfg = make_config(TrainConfig, job["train"], "train")
    cfg = replace(
        cfg,
        rollout_budget=a.budget,
        rollouts_per_step=a.rollouts_per_step,
        minibatch_rollouts=a.rollouts_per_step // 2,
        temperature=a.temperature,
        lr=a.lr if a.lr is not None else cfg.lr,
        eval_every=a.rollouts_per_step * 5,
        eval_episodes=a.tasks,
        checkpoint_every=10**6,
    )
    domain = get_domain(a.domain, seed=job["task_seed"], **job["domain_options"])
    fixed = domain.tasks("train", a.tasks)
    domain.tasks = lambda split, n=None: fixed  # train on, and evaluate on, the fixed set
    model, tok = load_policy(Path(a.warmstart) / "model")
    cls = get_method("grpo")
    mcfg = make_config(cls.Config, {**job["method_config"], "group_size": a.group_size}, "methods.grpo")
    with tempfile.TemporaryDirectory() as tmp:
        run = RunContext(
            model=model,
            tokenizer=tok,
            encoder=ChatEncoder(tok),
            domain=domain,
            train_cfg=cfg,
            ledger=Ledger(cfg.rollout_budget),
            seed=0,
            device=torch.device("cpu"),
            warmstart_path=Path(a.warmstart),
            out_dir=Path(tmp),
        )
        train(cls(mcfg, run), run, Path(tmp), label=f"grpo fixed {a.tasks} tasks", fingerprint="fixed-tasks")
        curve = [
            (r["rollouts"], round(r["heldout_reward"], 3))
            for r in map(json.loads, (Path(tmp) / "metrics.jsonl").read_text().splitlines())
            if r["kind"] == "eval"
        ]
    print(
        json.dumps(
            {
                "domain": a.domain,
                "tasks": a.tasks,
                "group_size": a.group_size,
                "temperature": a.temperature,
                "lr": cfg.lr,
                "reward_on_trained_tasks": curve,
            }
        )
    )
    domain.close()


if __name__ == "__main__":
    main()

"""The warm start's on-policy stage with other settings than the config's, on a stage-1 warm start.

    python benchmarks/probes/probe_onpolicy_stage.py --domain tooluse \\
        --warmstart results/small/warmstart_stage1/tooluse --out /tmp/ws_onpolicy --steps 300

The pipeline runs the stage as the ``warmstart`` rule (``methods.cli warmstart-stage2``)
with the configured ``warmstart.onpolicy_*``; this script runs the same
:func:`methods.stages.warmstart_onpolicy.continue_warm_start` with the stage-1 warm
start's own recorded job, ``--steps``, ``--tasks`` and ``--lr`` overriding its
``onpolicy_*`` fields, to measure a setting before adopting it.  Writes ``OUT/model``
and ``OUT/eval.json`` (held-out reward and the context check after, ``stage1_*``
before), so that ``benchmarks/probes/probe_teacher_context.py --warmstart OUT`` can probe the
result on the policy's own failures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> None:
    from methods.core.config import resolve_job
    from methods.core.loop import TrainConfig
    from methods.core.policy import load_policy, save_policy
    from methods.core.provenance import provenance, write_json_atomic
    from methods.core.registry import make_config
    from methods.core.tokenizer import ChatEncoder
    from methods.stages.warmstart import WarmStartConfig
    from methods.stages.warmstart_onpolicy import continue_warm_start
    from tasks.base import get_domain

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--domain", required=True)
    p.add_argument("--warmstart", required=True, help="a stage-1 warm start directory (model/, eval.json)")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--tasks", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    stage1 = json.loads((Path(a.warmstart) / "eval.json").read_text())
    if "onpolicy_samples" in stage1:
        raise SystemExit(
            f"error: {a.warmstart} already had the on-policy stage; pass its stage-1 warm start (warmstart_stage1/)"
        )
    job = stage1.get("job") or resolve_job(
        yaml.safe_load((ROOT / "config" / "config.yaml").read_text()), a.domain
    )  # the warm start's own settings
    cfg = make_config(WarmStartConfig, job["warmstart"], "warmstart")
    cfg = dataclasses.replace(
        cfg,
        onpolicy_steps=a.steps,
        **{k: v for k, v in (("onpolicy_tasks", a.tasks), ("onpolicy_lr", a.lr)) if v is not None},
    )
    train_cfg = make_config(TrainConfig, job["train"], "train")
    domain = get_domain(a.domain, seed=job["task_seed"], **job["domain_options"])
    model, tok = load_policy(Path(a.warmstart) / "model")
    report = continue_warm_start(
        model,
        ChatEncoder(tok),
        domain,
        cfg,
        train_cfg.sampling(eval=True),
        train_cfg.sampling(),
        train_cfg.eval_episodes,
        stage1["seed"],
        stage1,
    )
    domain.close()
    report.update({"from": a.warmstart, "onpolicy": dataclasses.asdict(cfg), **provenance()})
    out = Path(a.out)
    save_policy(model, tok, out / "model")
    write_json_atomic(out / "eval.json", report)
    shown = [
        "seed",
        *sorted(k for k in report if k.startswith("onpolicy_") or "heldout_reward" in k or "context_gain" in k),
    ]
    print(
        json.dumps(
            {k: (round(report[k], 4) if isinstance(report[k], float) else report[k]) for k in shown if k in report}
        )
    )


if __name__ == "__main__":
    main()

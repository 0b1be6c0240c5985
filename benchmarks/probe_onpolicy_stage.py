"""The warm start's on-policy context stage, applied to an existing (stage-1) warm start.

    python benchmarks/probe_onpolicy_stage.py --domain tooluse \\
        --warmstart results/small/warmstart/tooluse/seed0 --out /tmp/ws_onpolicy --steps 300

Runs :func:`methods.core.warmstart_onpolicy.onpolicy_stage` with the warm start's own
config (the job its ``eval.json`` recorded) (``--steps``, ``--tasks``, ``--lr`` override its ``onpolicy_*``
fields) on a copy of the warm start, then measures what the pipeline's warm start
reports: held-out reward (Table 1's Vanilla) and the context check, before and
after.  Writes ``OUT/model`` and ``OUT/eval.json``, so that
``benchmarks/probe_teacher_context.py --warmstart OUT`` can probe the result on
the policy's own failures.  Costs about one stage-1 warm start's tenth.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> None:
    from methods.core.config import resolve_job
    from methods.core.evaluate import evaluate
    from methods.core.loop import TrainConfig
    from methods.core.policy import load_policy, save_policy
    from methods.core.provenance import provenance, write_json_atomic
    from methods.core.registry import make_config
    from methods.core.tokenizer import ChatEncoder
    from methods.core.warmstart import WarmStartConfig, context_likelihood_check
    from methods.core.warmstart_onpolicy import onpolicy_stage
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
    before = json.loads((Path(a.warmstart) / "eval.json").read_text())
    job = before.get("job") or resolve_job(yaml.safe_load((ROOT / "config" / "config.yaml").read_text()), a.domain)  # the warm start's own settings
    cfg = make_config(WarmStartConfig, job["warmstart"], "warmstart")
    cfg = dataclasses.replace(cfg, onpolicy_steps=a.steps, **{k: v for k, v in (("onpolicy_tasks", a.tasks), ("onpolicy_lr", a.lr)) if v is not None})
    train_cfg = make_config(TrainConfig, job["train"], "train")
    seed = before["seed"]
    domain = get_domain(a.domain, seed=job["task_seed"], **job["domain_options"])
    model, tok = load_policy(Path(a.warmstart) / "model")
    enc = ChatEncoder(tok)
    n_warm = before.get("demos_warmstart_groups", cfg.n_demos - int(round(cfg.n_demos * cfg.seen_group_share)))  # stage 1's tasks
    stage = onpolicy_stage(model, enc, domain, cfg, train_cfg.sampling(), seed, n_warm)
    held = evaluate(model, enc, domain, domain.tasks("test", train_cfg.eval_episodes), train_cfg.sampling(eval=True), seed=seed)
    check = context_likelihood_check(model, enc, domain, cfg.likelihood_tasks, seed)
    out = Path(a.out)
    save_policy(model, tok, out / "model")
    keys = ["heldout_reward", *sorted(k for k in check if k.startswith("context_gain"))]
    after = {**held, **check}
    report = {
        "domain": a.domain, "seed": seed, "domain_version": domain.version, "from": a.warmstart, "onpolicy": dataclasses.asdict(cfg),
        **stage, **{f"before_{k}": before.get(k) for k in keys}, **{k: after[k] for k in keys}, **provenance(),
    }
    write_json_atomic(out / "eval.json", {**report, **{k: v for k, v in after.items() if k not in report}})
    domain.close()
    print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in report.items() if k not in ("onpolicy", "versions", "git", "host", "cpu_count")}))


if __name__ == "__main__":
    main()

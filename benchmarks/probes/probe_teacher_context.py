"""What a privileged context gives a warm-started teacher, by kind of context.

    python benchmarks/probes/probe_teacher_context.py --domain tooluse --warmstart results/small/warmstart/tooluse
    python benchmarks/probes/probe_teacher_context.py --domain code --profile real-cpu \\
        --warmstart results/real-cpu/warmstart/code

Samples the warm-start policy once on training tasks (the training temperature),
keeps the failed episodes that carry environment feedback, and reports
``teacher_context_gain`` (:func:`methods.core.distill.context_gain`: the
expert actions' mean per-token log-likelihood with the context minus without)
for the contexts the self-distillation methods build:

* ``own_solution``  -- the task's reference solution (OPSD, SDFT; SDPO's successful sibling is alike);
* ``solution_and_feedback`` -- SDPO's context for a failed rollout with a successful sibling;
* ``feedback_only`` -- SDPO's context for a failed rollout without one;
* ``sibling_only`` / ``sibling_and_feedback`` -- SDPO's real sibling: the policy's own
  successful sample of the same task (``--group`` samples per task, the first success),
  alone and with the failure's feedback, on the failed tasks that have one
  (``sibling_tasks`` of them).  The expert solution is clean; a sibling is the
  policy's own trace, so the two can differ;
* ``skill`` -- Skill-SD's skill (:func:`methods.core.contexts.rollout_skill`) of the
  policy's own sample of another training task of the same group, as its skill library
  holds them (``skill_tasks``: failed tasks whose group has one).

Positive: the teacher can use that context; negative: it misleads the teacher.
``--context-check SEED`` adds the warm start's own context check
(:func:`methods.stages.warmstart.context_likelihood_check` with that seed, what
``eval.json`` holds; ``check_*`` keys), e.g. to measure a warm start built before the
check had its feedback and skill gains.  Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> None:
    from methods.core.config import resolve_job
    from methods.core.contexts import SKILL_MAX_CHARS, rollout_skill, sdpo_context, sdpo_reprompt
    from methods.core.distill import context_gain, expert_trace
    from methods.core.ledger import Ledger
    from methods.core.loop import RunContext, TrainConfig
    from methods.core.policy import load_policy
    from methods.core.registry import make_config
    from methods.core.rollout import run_episodes
    from methods.core.teacher import Teacher
    from methods.core.tokenizer import ChatEncoder
    from tasks.base import get_domain

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--domain", required=True)
    p.add_argument("--warmstart", required=True)
    p.add_argument(
        "--tasks",
        type=int,
        default=60,
        help="training tasks sampled once each (failed ones --group times in all, for the sibling)",
    )
    p.add_argument("--max-failures", type=int, default=30)
    p.add_argument("--group", type=int, default=4, help="samples per task (SDPO's G) for the sibling contexts")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--profile", default=None, help="the profile whose settings the job takes (default: config's)")
    p.add_argument(
        "--context-check", type=int, metavar="SEED", help="also run the warm start's context check with this seed"
    )
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    if a.profile:
        config["profile"] = a.profile
    job = resolve_job(config, a.domain)
    train_cfg = make_config(TrainConfig, job["train"], "train")
    domain = get_domain(a.domain, seed=job["task_seed"], **job["domain_options"])
    model, tok = load_policy(Path(a.warmstart) / "model")
    enc = ChatEncoder(tok)
    run = RunContext(
        model=model,
        tokenizer=tok,
        encoder=enc,
        domain=domain,
        train_cfg=train_cfg,
        ledger=Ledger(1),
        seed=0,
        device=torch.device("cpu"),
    )
    tasks = domain.tasks("train", a.tasks)
    gen = torch.Generator().manual_seed(0)
    rollouts = run_episodes(model.eval(), enc, domain, tasks, None, train_cfg.sampling(), gen)
    failed_r = [r for r in rollouts if r.reward < 1.0 and r.feedback][: a.max_failures]
    failed = [(r.task, r.feedback) for r in failed_r]
    ft = [t for t, _ in failed]
    own = [expert_trace(domain, t) for t in ft]
    teacher = Teacher(run, "student")  # the warm start's weights
    out = {
        "domain": a.domain,
        "warmstart": a.warmstart,
        "failed_episodes": len(ft),
        "own_solution": round(context_gain(teacher, ft, own), 4),
        "solution_and_feedback": round(
            context_gain(teacher, ft, [sdpo_context(o, fb) for o, (_, fb) in zip(own, failed)]), 4
        ),
        "feedback_only": round(context_gain(teacher, ft, [sdpo_context(None, fb) for _, fb in failed]), 4),
    }
    by_group: dict[str, list] = {}
    for t, r in zip(tasks, rollouts):
        by_group.setdefault(t.group_id, []).append(r)
    rng = random.Random(0)
    sk = [(t, [r for r in by_group[t.group_id] if r.task.task_id != t.task_id]) for t in ft]
    sk = [(t, rollout_skill(rng.choice(o), SKILL_MAX_CHARS)) for t, o in sk if o]
    out["skill_tasks"] = len(sk)
    if sk:
        out["skill"] = round(context_gain(teacher, [t for t, _ in sk], [c for _, c in sk]), 4)
    if a.group > 1:  # SDPO's reprompt with a real sibling: the failure and the task's other samples as one group
        g = a.group - 1
        more = run_episodes(
            model.eval(), enc, domain, [t for t in ft for _ in range(g)], None, train_cfg.sampling(), gen
        )
        groups = [[fr, *more[k * g : (k + 1) * g]] for k, fr in enumerate(failed_r)]
        groups = [rs for rs in groups if any(r.reward >= 1.0 for r in rs[1:])]
        st = [rs[0].task for rs in groups]
        out["sibling_tasks"] = len(st)
        if st:
            out["sibling_only"] = round(
                context_gain(teacher, st, [sdpo_reprompt(rs, 0, range(len(rs)), use_feedback=False) for rs in groups]),
                4,
            )
            out["sibling_and_feedback"] = round(
                context_gain(teacher, st, [sdpo_reprompt(rs, 0, range(len(rs))) for rs in groups]), 4
            )
    if a.context_check is not None:
        from methods.stages.warmstart import context_likelihood_check

        check = context_likelihood_check(model, enc, domain, 200, a.context_check)
        out.update({f"check_{k}": round(v, 4) for k, v in check.items() if k.startswith("context_gain")})
    domain.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()

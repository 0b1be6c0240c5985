"""The warm start's second stage: reading contexts built from the policy's *own* samples.

Stage 1 (:mod:`methods.stages.warmstart`) teaches the context formats on the
expert's traces: SDPO's feedback comes from a corrupted expert call, Skill-SD's
skill from an expert trace.  The methods then hand their teachers contexts built
from the *student's* samples, and on tool use those read differently (measured
with ``benchmarks/probes/probe_teacher_context.py`` on the policy's own failures: the
feedback that helped on synthetic failures lowered the expert actions'
log-likelihood on real ones, and SDPO's and Skill-SD's first-step teacher checks
were negative).  An instruct LLM reads feedback on its own attempts from
pretraining; the tiny policy has to be shown.

This stage samples the stage-1 policy ``onpolicy_group`` times on each of
``onpolicy_tasks`` fresh warm-start tasks (environments the methods never
train or test on) at the training temperature, and builds, per task:

* SDPO's reprompt of one failed sample with feedback
  (:func:`methods.core.contexts.sdpo_reprompt`: its first successful sibling
  and/or its feedback, exactly as SDPO builds it);
* Skill-SD's skill of one sample of another task of the same group
  (:func:`methods.core.contexts.rollout_skill`, as Skill-SD's library builds it);

each followed by the *expert's* turns as the target, so a context is only ever
a hint towards the right actions.  As many stage-1 demonstrations of further
fresh tasks (with stage 1's context mix; stage 1's synthetic copy examples are
not replayed) are replayed beside them, and the policy trains
``onpolicy_steps`` more steps at ``onpolicy_lr``.  The tasks are fresh; the
last stage-1 environment variant / project may continue into the first of them.
"""

from __future__ import annotations

import dataclasses
import random
import sys
import time
from collections.abc import Sequence

import torch

from methods.core.contexts import SKILL_MAX_CHARS, rollout_skill, sdpo_reprompt
from methods.core.rollout import SamplingConfig, run_episodes, trajectory_ids


def onpolicy_examples(domain, encoder, rollouts: Sequence, group: int, expert: dict, rng: random.Random) -> list:
    """Examples from ``rollouts`` (``group`` consecutive samples per task): per task, SDPO's
    reprompt of a failed sample and a skill of a same-group task's sample, each with the
    expert's turns of the task (``expert``: {task_id: Episode}) as the target."""
    by_task = [list(rollouts[i : i + group]) for i in range(0, len(rollouts), group)]
    by_group: dict[str, list] = {}
    for rs in by_task:
        by_group.setdefault(rs[0].task.group_id, []).extend(rs)
    out = []
    for rs in by_task:
        task = rs[0].task
        ep = expert.get(task.task_id)
        if ep is None or ep.reward() < 1.0:
            continue
        failed = [i for i, r in enumerate(rs) if r.reward < 1.0 and r.feedback]
        if failed:
            ctx = sdpo_reprompt(rs, rng.choice(failed), range(len(rs)))
            out.append(trajectory_ids(encoder, domain, task, ctx, ep.turns))
        others = [r for r in by_group[task.group_id] if r.task.task_id != task.task_id]
        if others:
            out.append(
                trajectory_ids(encoder, domain, task, rollout_skill(rng.choice(others), SKILL_MAX_CHARS), ep.turns)
            )
    return out


def onpolicy_stage(model, encoder, domain, cfg, sampling: SamplingConfig, seed: int, first_task: int) -> dict:
    """Run the stage on ``model`` in place; ``first_task``: the first warm-start-split task
    stage 1 did not use.  Returns what it did, for ``eval.json``."""
    from .warmstart import build_examples, expert_episodes, sft  # stage 1's pieces

    t0 = time.perf_counter()
    rng = random.Random(f"onpolicy/{seed}")
    fresh = domain.tasks("warmstart", first_task + 3 * cfg.onpolicy_tasks)[
        first_task:
    ]  # sampled, then up to 2 replays per sample
    sampled, spare = fresh[: cfg.onpolicy_tasks], fresh[cfg.onpolicy_tasks :]
    rollouts = run_episodes(
        model.eval(),
        encoder,
        domain,
        [t for t in sampled for _ in range(cfg.onpolicy_group)],
        None,
        sampling,
        torch.Generator(device=next(model.parameters()).device).manual_seed(seed),
    )
    expert = {e.task.task_id: e for e in expert_episodes(domain, sampled)}
    examples = onpolicy_examples(domain, encoder, rollouts, cfg.onpolicy_group, expert, rng)
    if not examples:
        raise ValueError(
            f"the on-policy stage found nothing to train on in {len(rollouts)} samples "
            "(no failure with feedback, no same-group task): "
            "raise warmstart.onpolicy_tasks"
        )
    replay_eps = [e for e in expert_episodes(domain, spare[: len(examples)]) if e.reward() == 1.0]
    replay = build_examples(domain, encoder, replay_eps, cfg, rng)
    print(
        f"[warmstart] on-policy stage: {len(rollouts)} samples "
        f"(reward {sum(r.reward for r in rollouts) / len(rollouts):.3f}), "
        f"{len(examples)} own-sample contexts + {len(replay)} replayed demonstrations, {cfg.onpolicy_steps} steps",
        file=sys.stderr,
        flush=True,
    )
    stage = dataclasses.replace(
        cfg, steps=cfg.onpolicy_steps, lr=cfg.onpolicy_lr, warmup_steps=min(cfg.warmup_steps, 20)
    )
    losses = sft(model, examples + replay, encoder.pad_id, stage, seed + 1)
    return {
        "onpolicy_samples": len(rollouts),
        "onpolicy_sample_reward": sum(r.reward for r in rollouts) / len(rollouts),
        "onpolicy_examples": len(examples),
        "onpolicy_replay": len(replay),
        "onpolicy_final_nll": sum(losses[-50:]) / len(losses[-50:]),
        "onpolicy_s": round(time.perf_counter() - t0, 2),
    }


STAGE1_KEYS = (
    "heldout_reward",
    "train_reward",
    "context_gain_own_solution",
    "context_gain_same_group",
    "context_gain_other_group",
    "context_gain_feedback",
    "context_gain_skill",
)


def continue_warm_start(
    model,
    encoder,
    domain,
    cfg,
    sampling: SamplingConfig,
    train_sampling: SamplingConfig,
    eval_episodes: int,
    seed: int,
    stage1: dict,
) -> dict:
    """Stage 2 on a stage-1 warm start (``model``, trained in place; ``stage1``: its report).
    Returns the warm start's report: stage 1's, with the evaluation redone on the result,
    this stage's counts, stage 1's scores as ``stage1_*`` and ``wall_s`` of both stages."""
    from .warmstart import warm_start_eval

    if not cfg.onpolicy_steps:
        raise ValueError("continue_warm_start needs warmstart.onpolicy_steps > 0 (with 0 the warm start is stage 1's)")
    t0 = time.perf_counter()
    stage = onpolicy_stage(model, encoder, domain, cfg, train_sampling, seed, stage1["demos_warmstart_groups"])
    report = {**stage1, **{f"stage1_{k}": stage1[k] for k in STAGE1_KEYS if k in stage1}}
    report.update(warm_start_eval(model, encoder, domain, cfg, sampling, eval_episodes, seed))
    report.update(stage)
    report["wall_s"] = round(stage1.get("wall_s", 0.0) + time.perf_counter() - t0, 2)
    return report

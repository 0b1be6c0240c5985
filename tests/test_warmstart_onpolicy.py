"""The warm start's on-policy context stage: SDPO's and Skill-SD's contexts built from the
policy's own samples, exactly as the methods build them, with the expert's turns as targets."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from methods.core.contexts import rollout_skill, sdpo_reprompt
from methods.core.warmstart import WarmStartConfig, expert_episodes
from methods.core.warmstart_onpolicy import onpolicy_examples
from tasks.base import format_trace, get_domain


@pytest.fixture(scope="module", params=["tooluse", "code"])
def domain(request):
    d = get_domain(request.param, seed=0)
    yield d
    d.close()


def _sample(ep, reward, feedback):
    """A stand-in for a policy sample: what the context builders read of a Rollout."""
    return SimpleNamespace(task=ep.task, episode=ep, reward=reward, feedback=feedback)


def test_onpolicy_examples_are_the_methods_contexts_with_expert_targets(domain):
    from methods.core.tokenizer import ChatEncoder, train_tokenizer

    tasks = domain.tasks("warmstart", 40)
    eps = expert_episodes(domain, tasks)
    expert = {e.task.task_id: e for e in eps}
    enc = ChatEncoder(train_tokenizer([format_trace(e.task, e.turns) for e in eps], vocab_size=400))
    # G = 3 samples per task; every task: success, failure with feedback, failure without
    samples = [s for e in eps for s in (_sample(e, 1.0, ""), _sample(e, 0.0, "errors: boom"), _sample(e, 0.0, ""))]
    rng = random.Random(0)
    examples = onpolicy_examples(domain, enc, samples, 3, expert, rng)
    groups = {}
    for t in tasks:
        groups.setdefault(t.group_id, []).append(t)
    with_skill = sum(len(groups[t.group_id]) > 1 for t in tasks)
    assert len(examples) == len(tasks) + with_skill  # one SDPO reprompt per task, a skill where the group has another task
    # the contexts are the methods' own, built again with the same random draws
    rng = random.Random(0)
    k = 0
    for i, t in enumerate(tasks):
        rs = samples[3 * i : 3 * i + 3]
        sdpo = sdpo_reprompt(rs, rng.choice([1]), range(3))
        assert "errors: boom" in sdpo and format_trace(t, eps[i].turns, with_task=False) in sdpo  # the sibling and the feedback
        want = [sdpo]
        others = [s for s in samples if s.task.group_id == t.group_id and s.task.task_id != t.task_id]
        if others:
            skill = rollout_skill(rng.choice(others), 600)
            assert skill.startswith(("what worked:", "what failed:"))
            want.append(skill)
        for ctx in want:
            ids, mask = examples[k]
            prompt = enc.decode([x for x, m in zip(ids, mask) if not m])
            assert "".join(ctx.split()) in "".join(prompt.split())
            target = enc.decode([x for x, m in zip(ids, mask) if m and x != enc.eos_id])
            assert "".join(target.split()) == "".join("".join(u.action.split()) for u in eps[i].turns)  # the expert's turns
            k += 1
    # no failed sample with feedback: no SDPO reprompt (a success alone gives SDPO nothing either)
    only_ok = [s for e in eps[:6] for s in (_sample(e, 1.0, ""), _sample(e, 1.0, ""))]
    ex = onpolicy_examples(domain, enc, only_ok, 2, expert, random.Random(0))
    assert all("feedback on a failed attempt" not in enc.decode(ids) for ids, _ in ex)


def test_onpolicy_config_bounds():
    for bad in ({"onpolicy_steps": -1}, {"onpolicy_tasks": 0}, {"onpolicy_group": 0}, {"onpolicy_lr": 1.0}):
        with pytest.raises(ValueError, match="onpolicy"):
            WarmStartConfig(**bad)


def test_warm_start_with_the_onpolicy_stage_reports_it_and_needs_the_training_sampling():
    from dataclasses import replace

    from methods.core.warmstart import warm_start
    from tests.conftest import tiny_configs

    model_cfg, ws_cfg, train_cfg = tiny_configs()
    d = get_domain("code", seed=0)
    cfg = replace(ws_cfg, onpolicy_steps=2, onpolicy_tasks=6, onpolicy_group=2)
    with pytest.raises(ValueError, match="train_sampling"):
        warm_start(d, model_cfg, cfg, train_cfg.sampling(eval=True), 4, seed=0)
    _, _, report = warm_start(d, model_cfg, cfg, train_cfg.sampling(eval=True), 4, seed=0, train_sampling=train_cfg.sampling())
    d.close()
    assert report["onpolicy_samples"] == 12 and report["onpolicy_examples"] > 0 and report["onpolicy_replay"] > 0
    _, _, plain = warm_start(get_domain("code", seed=0), model_cfg, ws_cfg, train_cfg.sampling(eval=True), 4, seed=0)
    assert not any(k.startswith("onpolicy") for k in plain)  # off by default: stage 1 only

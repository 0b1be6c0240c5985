"""The warm start's on-policy context stage: SDPO's and Skill-SD's contexts built from the
policy's own samples, exactly as the methods build them, with the expert's turns as targets."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from methods.stages.warmstart import WarmStartConfig, expert_episodes
from methods.stages.warmstart_onpolicy import onpolicy_examples
from tasks.base import format_trace, get_domain


@pytest.fixture(scope="module", params=["tooluse", "code"])
def domain(request):
    d = get_domain(request.param, seed=0)
    yield d
    d.close()


def _sample(ep, reward, feedback):
    """A stand-in for a policy sample: what the context builders read of a Rollout."""
    return SimpleNamespace(task=ep.task, episode=ep, reward=reward, feedback=feedback)


def _prompt_and_target(enc, example):
    ids, mask = example
    prompt = enc.decode([x for x, m in zip(ids, mask) if not m])
    target = enc.decode([x for x, m in zip(ids, mask) if m and x != enc.eos_id])
    return "".join(prompt.split()), "".join(target.split())


def test_onpolicy_examples_are_the_methods_contexts_with_expert_targets(domain):
    from methods.core.tokenizer import ChatEncoder, train_tokenizer

    tasks = domain.tasks("warmstart", 40)
    eps = expert_episodes(domain, tasks)
    expert = {e.task.task_id: e for e in eps}
    enc = ChatEncoder(train_tokenizer([format_trace(e.task, e.turns) for e in eps], vocab_size=400))
    n = len(eps)
    # G = 3 samples per task, each with its own trace: a failure with feedback (task i's trace),
    # a failure without (task i+1's), and a success last (task i+2's): the sibling
    samples = []
    for i, e in enumerate(eps):
        samples += [
            SimpleNamespace(task=e.task, episode=eps[i], reward=0.0, feedback="errors: boom"),
            SimpleNamespace(task=e.task, episode=eps[(i + 1) % n], reward=0.0, feedback=""),
            SimpleNamespace(task=e.task, episode=eps[(i + 2) % n], reward=1.0, feedback=""),
        ]
    examples = onpolicy_examples(domain, enc, samples, 3, expert, random.Random(0))
    group_of = {t.task_id: t.group_id for t in tasks}
    partners = {t.task_id: [u for u in tasks if u.group_id == t.group_id and u.task_id != t.task_id] for t in tasks}
    assert len(examples) == n + sum(
        bool(p) for p in partners.values()
    )  # one reprompt per task, a skill where the group has another task
    k = 0
    for i, t in enumerate(tasks):
        prompt, target = _prompt_and_target(enc, examples[k])
        sibling = format_trace(t, eps[(i + 2) % n].turns, with_task=False)  # the success, never the failure itself
        assert "".join((sibling + "\n\nfeedback on a failed attempt:\nerrors: boom").split()) in prompt
        assert target == "".join("".join(u.action.split()) for u in eps[i].turns)  # the expert's turns of the task
        k += 1
        if partners[t.task_id]:
            prompt, target = _prompt_and_target(enc, examples[k])
            assert "context:whatfailed:" in prompt or "context:whatworked:" in prompt  # Skill-SD's skill
            # summarised from a sample of another task of the group: its actions are one of theirs
            others = [s for s in samples if group_of[s.task.task_id] == t.group_id and s.task.task_id != t.task_id]
            assert any("".join(">".join([""] + [u.action for u in s.episode.turns]).split()) in prompt for s in others)
            assert target == "".join("".join(u.action.split()) for u in eps[i].turns)
            k += 1
    # only successes: no SDPO reprompt at all, the skills remain
    only_ok = [SimpleNamespace(task=e.task, episode=e, reward=1.0, feedback="") for e in eps[:6] for _ in range(2)]
    ex = onpolicy_examples(domain, enc, only_ok, 2, expert, random.Random(0))
    six = {e.task.task_id for e in eps[:6]}
    assert len(ex) == sum(any(u.task_id in six for u in partners[t.task_id]) for t in tasks[:6])
    assert all("feedbackonafailedattempt" not in _prompt_and_target(enc, x)[0] for x in ex)


def test_onpolicy_config_bounds():
    for bad in ({"onpolicy_steps": -1}, {"onpolicy_tasks": 0}, {"onpolicy_group": 0}, {"onpolicy_lr": 1.0}):
        with pytest.raises(ValueError, match="onpolicy"):
            WarmStartConfig(**bad)


@pytest.mark.slow
def test_stage2_job_continues_stage1_or_passes_it_through_and_refuses_another_stage1(tmp_path):
    """methods.cli: ``warmstart`` builds stage 1 (its job without onpolicy_*), ``warmstart-stage2``
    continues it with the on-policy stage, or, with the stage off, hands stage 1 on unchanged."""
    import json
    from dataclasses import asdict

    from methods import cli
    from methods.core.policy import load_policy
    from tests.conftest import tiny_configs

    model_cfg, ws_cfg, train_cfg = tiny_configs()
    job = {
        "profile": "t",
        "domain": "code",
        "task_seed": 0,
        "domain_options": {},
        "model": asdict(model_cfg),
        "train": asdict(train_cfg),
        "warmstart": {**asdict(ws_cfg), "onpolicy_steps": 2, "onpolicy_tasks": 6, "onpolicy_group": 2},
    }
    off = {**job, "warmstart": {k: v for k, v in job["warmstart"].items() if not k.startswith("onpolicy_")}}
    common = ["--seed", "0", "--threads", "1"]
    cli.main(["warmstart", "--job", json.dumps(job), "--out", str(tmp_path / "s1"), *common])
    s1 = json.loads((tmp_path / "s1" / "eval.json").read_text())
    assert s1["job"] == off and not any(
        k.startswith(("onpolicy", "stage1")) for k in s1
    )  # stage 1 only, and its job says so

    cli.main(
        [
            "warmstart-stage2",
            "--job",
            json.dumps(job),
            "--stage1",
            str(tmp_path / "s1"),
            "--out",
            str(tmp_path / "on"),
            *common,
        ]
    )
    on = json.loads((tmp_path / "on" / "eval.json").read_text())
    assert (
        on["onpolicy_samples"] == 12 and on["onpolicy_examples"] > 0 and on["onpolicy_replay"] > 0 and on["job"] == job
    )
    assert (
        on["stage1_heldout_reward"] == s1["heldout_reward"]
        and on["stage1_context_gain_own_solution"] == s1["context_gain_own_solution"]
    )
    assert on["demos_warmstart_groups"] == s1["demos_warmstart_groups"] and on["wall_s"] > s1["wall_s"]
    trained = dict(load_policy(tmp_path / "on" / "model")[0].named_parameters())
    first = dict(load_policy(tmp_path / "s1" / "model")[0].named_parameters())
    assert any(not torch.equal(trained[k], first[k]) for k in first)  # stage 2 trained the policy

    cli.main(
        [
            "warmstart-stage2",
            "--job",
            json.dumps(off),
            "--stage1",
            str(tmp_path / "s1"),
            "--out",
            str(tmp_path / "off"),
            *common,
        ]
    )
    same = json.loads((tmp_path / "off" / "eval.json").read_text())
    assert {k: v for k, v in same.items() if k != "stage1_dir"} == s1 and same["stage1_dir"] == str(tmp_path / "s1")
    kept = dict(load_policy(tmp_path / "off" / "model")[0].named_parameters())
    assert all(torch.equal(kept[k], first[k]) for k in first)

    other = {**job, "warmstart": {**job["warmstart"], "steps": ws_cfg.steps + 1}}
    with pytest.raises(SystemExit, match="other settings \\(warmstart\\)"):
        cli.main(
            [
                "warmstart-stage2",
                "--job",
                json.dumps(other),
                "--stage1",
                str(tmp_path / "s1"),
                "--out",
                str(tmp_path / "x"),
                *common,
            ]
        )
    with pytest.raises(SystemExit, match="seed 0 \\(wanted 1\\)"):
        cli.main(
            [
                "warmstart-stage2",
                "--job",
                json.dumps(job),
                "--stage1",
                str(tmp_path / "s1"),
                "--out",
                str(tmp_path / "x"),
                "--seed",
                "1",
            ]
        )
    assert not (tmp_path / "x").exists()


def test_continue_warm_start_needs_the_stage_on():
    from methods.stages.warmstart_onpolicy import continue_warm_start

    with pytest.raises(ValueError, match="onpolicy_steps > 0"):
        continue_warm_start(None, None, None, WarmStartConfig(), None, None, 4, 0, {})


def test_a_checkpoint_model_has_no_onpolicy_stage():
    from methods.core.config import resolve_job

    cfg = {
        "profile": "p",
        "profiles": {"p": {"model": {"checkpoint": "/models/x"}, "warmstart": {"onpolicy_steps": 5}}},
    }
    with pytest.raises(ValueError, match="model.checkpoint is its own warm start"):
        resolve_job(cfg, "code")


def test_an_onpolicy_stage_that_is_off_leaves_the_job_unchanged():
    from methods.core.config import resolve_job

    base = {"profile": "small", "profiles": {"small": {"warmstart": {"n_demos": 100}}}}
    assert not any(k.startswith("onpolicy") for k in resolve_job(base, "code")["warmstart"])
    on = {"profile": "small", "profiles": {"small": {"warmstart": {"n_demos": 100, "onpolicy_steps": 5}}}}
    assert (
        resolve_job(on, "code")["warmstart"]["onpolicy_steps"] == 5
        and "onpolicy_lr" in resolve_job(on, "code")["warmstart"]
    )

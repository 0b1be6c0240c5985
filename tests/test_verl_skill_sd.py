"""Skill-SD on the verl backend, on CPU: the skill library actor against the suite's own library, the
agent loop's skill hand-over, the teacher rows of rollouts without a skill, the combined loss inside
verl's own ``distillation_ppo_loss``, the generated config, and the trainer that serves the teacher
from the rollout servers (verl 0.9.1, installed --no-deps)."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch

pytest.importorskip("verl")
from omegaconf import OmegaConf  # noqa: E402

from methods.verl_backend import plugin  # noqa: E402
from tests.helpers.verl import (  # noqa: E402
    ROWS,
    _check_resume,
    _domain_and_encoder,
    _expert_actions,
    _privileged_worker,
    _ScriptedServer,
    _stubbed_verl_step,
    _suite_config,
    _teacher_rows,
    _train_rows,
    _verl_batch,
)


def _skill_job():
    from methods.core.config import resolve_job

    return resolve_job(dict(_suite_config(), profile="real-verl"), "code", "skill_sd")


# --------------------------------------------------------------------------- the skill library
def _step_outcomes(tasks, step):
    """Two rollouts per task with scripted actions and rewards (a success now and then)."""
    return [
        (task, [f"call_{step}_{k}_{j}()"], float((step + k + j) % 3 == 0), f"feedback {step} {k} {j}")
        for k, task in enumerate(tasks)
        for j in range(2)
    ]


def test_skill_service_chooses_credits_and_grows_as_the_suites_library():
    """Three steps of the same rollouts, played through the service in shuffled orders, against the
    suite's :class:`SkillLibrary` driven as :class:`methods.skill_sd.SkillSD` drives it: one UCB1
    choice per task and step, made on the library as the step began; the chosen skill credited with
    the mean reward of the task's rollouts; every rollout's skill added after the step."""
    import math

    from methods.core.contexts import skill_summary
    from methods.experience.bank import LeakError
    from methods.skill_sd import SkillLibrary
    from methods.verl_backend.export import task_rows
    from methods.verl_backend.skills import SkillService

    _, domain, _, _ = _domain_and_encoder("tooluse")
    all_rows, all_tasks = _train_rows(domain, 12)
    pick = [4, 5, 6, 11]  # two pairs of tasks that share an environment variant (their skills are shared)
    rows, tasks = [all_rows[i] for i in pick], [all_tasks[i] for i in pick]
    assert tasks[0].group_id == tasks[1].group_id and tasks[2].group_id == tasks[3].group_id
    row_of = {t.task_id: r for t, r in zip(tasks, rows)}
    suite = SkillLibrary()
    services = [SkillService(ucb_c=math.sqrt(2), max_skill_chars=200) for _ in range(2)]
    for step in range(3):
        outcomes = _step_outcomes(tasks, step)
        chosen = {t.task_id: suite.select(t, math.sqrt(2)) for t in tasks}
        expected = {k: None if i is None else suite.skills[i].text for k, i in chosen.items()}
        for task_id, idx in chosen.items():
            if idx is not None:
                got = [r for t, _, r, _ in outcomes if t.task_id == task_id]
                suite.record(idx, sum(got) / len(got))
        for task, actions, reward, feedback in sorted(outcomes, key=lambda x: (x[0].task_id, -x[2], x[1])):
            suite.add(skill_summary(actions, reward >= 1.0, feedback, 200), task.group_id)
        for n, service in enumerate(services):
            order = list(outcomes)
            random.Random(10 * step + n).shuffle(order)  # episodes start and finish in any order
            for task, actions, reward, feedback in order:
                assert service.choose(row_of[task.task_id]) == expected[task.task_id]
                service.stage(row_of[task.task_id], actions, reward, feedback)
            metrics = service.commit(step)
            assert service.library.state_dict() == suite.state_dict()
            assert metrics["skills/size"] == len(suite.skills) and metrics["skills/staged"] == len(outcomes)
        assert metrics["skills/share"] == (0.0 if step == 0 else 1.0)  # the library starts empty
    assert len({s.text for s in suite.skills}) > 4 and any(s.uses > 1 for s in suite.skills)
    test_row = task_rows(domain, domain.tasks("test", 1), "test")[0]["extra_info"]
    for call in (lambda: services[0].choose(test_row), lambda: services[0].stage(test_row, ["x"], 1.0, "")):
        with pytest.raises(LeakError):
            call()
    domain.close()


def test_skill_service_saves_and_resumes_its_library(tmp_path):
    from methods.verl_backend.skills import SkillService

    _, domain, _, _ = _domain_and_encoder("tooluse")
    rows, _ = _train_rows(domain, 2)
    service = SkillService()
    service.stage(rows[0], ["a()"], 1.0, "ok")
    service.commit(1)
    service.choose(rows[0])
    service.save(str(tmp_path / "skills.json"))
    fresh = SkillService()
    assert fresh.load(str(tmp_path / "skills.json")) == 1
    assert fresh.library.state_dict() == service.library.state_dict() and fresh.chosen == {}
    domain.close()


# --------------------------------------------------------------------------- the agent loop and the teacher rows
def test_skill_sd_agent_loop_hands_the_chosen_skill_to_the_teacher_and_stages_training_episodes(monkeypatch):
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from methods.core.rollout import initial_prompt_ids
    from methods.verl_backend import agent_loop
    from methods.verl_backend.export import task_rows
    from methods.verl_backend.skills import SkillClient, SkillService

    _, domain, encoder, tok = _domain_and_encoder("tooluse")
    rows, tasks = _train_rows(domain, 12)
    with_skill, without = 4, 0  # task 5 shares task 4's environment variant; task 0's has no skill
    service = SkillService()
    service.stage(rows[5], ["lookup()"], 1.0, "done")
    service.commit(0)
    (skill,) = [s.text for s in service.library.skills]
    monkeypatch.setattr(agent_loop, "skills_client", lambda settings: SkillClient(service))
    trainer = OmegaConf.create(
        {
            "actor_rollout_ref": {"rollout": {"prompt_length": 2048, "response_length": 2048}},
            "lopd_bench": {
                "teacher_context": "skill",
                "skills": {"actor": "unused", "ucb_c": 1.4, "max_skill_chars": 600},
            },
        }
    )
    conf = OmegaConf.create({"max_prompt_length": 2048})
    test_task = domain.tasks("test", 1)[0]
    test_row = task_rows(domain, [test_task], "test")[0]["extra_info"]
    outs = {}
    for key, row, task in (
        ("skill", rows[with_skill], tasks[with_skill]),
        ("none", rows[without], tasks[without]),
        ("test", test_row, test_task),
    ):
        server = _ScriptedServer(_expert_actions(encoder, domain.expert_trajectory(task)))
        loop = agent_loop.EpisodeAgentLoop(
            DictConfigWrap(trainer), server, tok, None, RLHFDataset, DictConfigWrap(conf)
        )
        outs[key] = asyncio.run(loop.run({"temperature": 1.0}, extra_info=row))
        assert outs[key].prompt_ids == initial_prompt_ids(encoder, domain, task, None)  # the student sees no skill
    teacher_prompt = outs["skill"].extra_fields[agent_loop.TEACHER_PROMPT]
    assert teacher_prompt == initial_prompt_ids(encoder, domain, tasks[with_skill], skill)
    assert agent_loop.TEACHER_PROMPT not in outs["none"].extra_fields  # no skill yet: the GRPO term only
    assert agent_loop.TEACHER_PROMPT not in outs["test"].extra_fields
    staged = [(t.task_id, r) for t, _, r, _ in service.pending]
    assert staged == [(tasks[with_skill].task_id, 1.0), (tasks[without].task_id, 1.0)]  # the expert succeeds
    assert set(service.chosen) == {tasks[with_skill].task_id, tasks[without].task_id}  # held-out: never asked
    domain.close()


class _Servers:
    """A stand-in for vLLM servers answering verl's prompt log-probability requests from fixed logits
    (one distribution per position, ``logits[i]``, whatever the tokens): row ``i`` holds the
    log-probabilities of the token at ``i + 1``, its own (``prompt_logprobs`` 0) or the top-k by
    rank, and a dummy last row (``extract_prompt_logprobs``' layout).  It stands for verl's teacher
    server manager too: the worker reaches the client through it."""

    def __init__(self, vocab=20, positions=64, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.logits = torch.randn(positions, vocab, generator=g) * 3
        self.teacher_client, self.calls = {"default": self}, []

    def _resolve_teacher_key(self, routing_key):
        return "default"

    async def generate(self, request_id, prompt_ids, sampling_params, **_):
        from verl.workers.rollout.replica import TokenOutput

        k = sampling_params["prompt_logprobs"]
        assert sampling_params["temperature"] == 1.0 and sampling_params["max_tokens"] == 1
        self.calls.append((list(prompt_ids), k))
        lp = torch.log_softmax(self.logits[: len(prompt_ids) - 1], -1)
        if k == 0:
            nxt = torch.tensor(prompt_ids[1:])
            ids, values = nxt[:, None].tolist(), lp.gather(-1, nxt[:, None]).tolist()
        else:
            top = lp.topk(k, -1)
            ids, values = top.indices.tolist(), top.values.tolist()
        width = max(k, 1)
        return TokenOutput(
            token_ids=[0], extra_fields={"prompt_ids": ids + [[0] * width], "prompt_logprobs": values + [[0.0] * width]}
        )


def _skill_worker_run(extra, limit=None, validate=False, temperature=1.0, servers=None, prompt=(5, 6, 7)):
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

    servers = servers or _Servers()
    response = [11, 12, 13]
    section = {
        "teacher_context": "skill",
        "teacher_max_len": limit,
        "teacher_temperature": temperature,
        "teacher_topk": 20,
    }
    out = AgentLoopOutput(
        prompt_ids=list(prompt), response_ids=response, response_mask=[1, 1, 1], num_turns=2,
        metrics=AgentLoopMetrics(), extra_fields=dict(extra),
    )  # fmt: skip
    worker = _privileged_worker(servers, {"lopd_bench": section})
    asyncio.run(worker._compute_teacher_logprobs(out, list(prompt), response, validate, {}))
    return out.extra_fields, servers.calls


def test_skill_sd_teacher_rows_without_a_skill_or_past_the_servers_length_carry_no_signal():
    from methods.verl_backend.distill import TEACHER_PROMPT

    prompt, teacher_prompt, response = [5, 6, 7], [5, 9, 10, 6, 7], [11, 12, 13]
    fields, calls = _skill_worker_run({TEACHER_PROMPT: teacher_prompt})
    assert calls == [(teacher_prompt + response, 0)] and fields["teacher_logprobs"].shape == (len(prompt + response), 1)
    fields, calls = _skill_worker_run({TEACHER_PROMPT: teacher_prompt}, limit=len(teacher_prompt + response) + 1)
    assert len(calls) == 1  # fits: the server also generates one token after the sequence
    full = len(teacher_prompt + response)
    for fields, calls in (_skill_worker_run({}), _skill_worker_run({TEACHER_PROMPT: teacher_prompt}, limit=full)):
        assert calls == []  # nothing is sent to the servers
        assert fields["teacher_ids"].shape == fields["teacher_logprobs"].shape == (len(prompt + response), 1)
        assert (fields["teacher_logprobs"] == plugin.NO_TEACHER).all()
    fields, calls = _skill_worker_run({TEACHER_PROMPT: teacher_prompt}, validate=True)
    assert calls == [] and "teacher_logprobs" not in fields  # held-out episodes are not scored


@pytest.mark.parametrize("temperature", [1.0, 0.8])
def test_skill_sd_teacher_scores_the_sampled_tokens_at_the_students_temperature(temperature):
    """The teacher's row for each response token, on the student's position, is the token's
    log-probability under the servers' logits divided by the rollout temperature, as the suite's
    teacher scores at the training temperature (exact here: the stand-in's vocabulary is its top-k)."""
    from methods.verl_backend.distill import TEACHER_PROMPT

    prompt, teacher_prompt, response = [5, 6, 7], [5, 9, 10, 6, 7], [11, 12, 13]
    servers = _Servers(vocab=20)
    fields, calls = _skill_worker_run({TEACHER_PROMPT: teacher_prompt}, temperature=temperature, servers=servers)
    sequence = teacher_prompt + response
    assert sorted(k for _, k in calls) == ([0] if temperature == 1.0 else [0, 20])  # top-k only to temper
    s, t = len(prompt), len(teacher_prompt)
    exact = torch.log_softmax(servers.logits[t - 1 : t - 1 + len(response)] / temperature, -1)
    expected = exact.gather(-1, torch.tensor(response)[:, None])
    torch.testing.assert_close(fields["teacher_logprobs"][s - 1 : s - 1 + len(response)], expected)
    assert fields["teacher_ids"][s - 1 : s - 1 + len(response), 0].tolist() == response
    assert len(sequence) == len(calls[0][0])


def _peaked(n=64, vocab=400, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, vocab, generator=g) * 4


@pytest.mark.parametrize("temperature", [0.6, 0.8, 1.3])
def test_tempered_sampled_token_is_the_tempered_distribution_up_to_the_tail(temperature):
    """``temper_sampled`` rebuilds log softmax(l / T) of the sampled token from temperature-1
    log-probabilities with the top-k (and the token, where it is outside them) as the normaliser:
    exact when the top-k is the whole vocabulary; otherwise off by the tail the normaliser misses,
    exactly, too high at T < 1 and within the docstring's bound."""
    from methods.verl_backend.distill import temper_sampled

    logits = _peaked()
    lp = torch.log_softmax(logits, -1)
    exact = torch.log_softmax(logits / temperature, -1)
    p = lp.exp()
    g = torch.Generator().manual_seed(1)
    token = torch.multinomial(p, 1, generator=g)[:, 0]
    k = 20
    token[:8] = lp.topk(k + 5, -1).indices[:8, -1]  # a few tokens from outside the top-k
    sampled = lp.gather(-1, token[:, None])[:, 0]
    whole = lp.topk(lp.shape[-1], -1)
    torch.testing.assert_close(
        temper_sampled(sampled, token, whole.values, whole.indices, temperature), exact.gather(-1, token[:, None])[:, 0]
    )
    top = lp.topk(k, -1)
    got = temper_sampled(sampled, token, top.values, top.indices, temperature)
    outside = ~(top.indices == token[:, None]).any(-1)
    assert outside[:8].all() and not outside[8:].all()
    head = (top.values / temperature).exp().sum(-1)
    tail = (p ** (1 / temperature)).sum(-1) - head
    extra = torch.where(outside, (sampled / temperature).exp(), torch.zeros(len(token)))
    expected = exact.gather(-1, token[:, None])[:, 0] + torch.log((head + tail) / (head + extra))
    torch.testing.assert_close(got, expected)
    if temperature < 1:
        gap = torch.log1p(tail / head)  # what the top-k normaliser misses, for a token inside the top-k
        bound = torch.log1p(top.values[:, -1].exp() ** (1 / temperature - 1) * (1 - top.values.exp().sum(-1)) / head)
        assert (gap >= 0).all() and (gap <= bound + 1e-6).all()
        assert ((got - exact.gather(-1, token[:, None])[:, 0])[~outside] >= 0).all()


# --------------------------------------------------------------------------- the loss inside verl's own
def test_skill_sd_loss_through_verls_distillation_ppo_loss_is_the_suites():
    """verl's ``distillation_ppo_loss`` with the generated config's settings: the suite's PPO clip
    (ε 0.2/0.28) plus λ_sdl times the importance-weighted sampled reverse KL, the latter averaged over
    the batch's response tokens, zero on the rollout without a skill."""
    from verl.trainer.distillation.losses import distillation_ppo_loss
    from verl.utils import tensordict_utils as tu
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import FSDPActorConfig, PolicyLossConfig

    from methods.divergences import sampled_token_reverse_kl
    from methods.losses import ppo_clip_loss
    from methods.verl_backend.launch import main_ppo_config

    job = _skill_job()
    cfg = main_ppo_config(job, 0, model_path="m", data_dir="d", run_dir="r")
    distillation = omega_conf_to_dataclass(cfg.distillation)
    actor = FSDPActorConfig(
        strategy="fsdp", ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2, use_dynamic_bsz=False, rollout_n=1,
        loss_agg_mode=cfg.actor_rollout_ref.actor.loss_agg_mode,
        policy_loss=PolicyLossConfig(loss_mode=cfg.actor_rollout_ref.actor.policy_loss.loss_mode),
        clip_ratio_low=cfg.actor_rollout_ref.actor.clip_ratio_low,
        clip_ratio_high=cfg.actor_rollout_ref.actor.clip_ratio_high,
    )  # fmt: skip
    flat, logp, data = _verl_batch(ROWS)
    teacher = logp - 0.7 * torch.rand_like(logp)
    teacher[1] = plugin.NO_TEACHER
    data["teacher_logprobs"] = _teacher_rows(teacher)
    n_tokens = int(data["response_mask"].sum())
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=n_tokens, global_batch_size=len(ROWS))
    flat = flat.clone().requires_grad_()
    loss, metrics = distillation_ppo_loss(actor, distillation, {"log_probs": flat}, data)
    mask = data["response_mask"].bool()
    pg, _ = ppo_clip_loss(logp, data["old_log_probs"], data["advantages"], mask, clip_low=0.2, clip_high=0.28)
    taught = mask.clone()
    taught[1] = False
    kl = sampled_token_reverse_kl(logp[taught], teacher[taught], data["old_log_probs"][taught], plugin.IS_CLIP)
    expected = pg + job["method_config"]["sdl_weight"] * kl.sum() / n_tokens
    torch.testing.assert_close(loss, expected)
    assert job["method_config"]["sdl_weight"] == distillation.distillation_loss.distillation_loss_coef == 0.001


def test_metrics_adapter_carries_skill_sds_metrics_into_the_run_files(tmp_path):
    import json

    from methods.verl_backend.metrics import KL_SUM, RESPONSE_TOKENS, TAUGHT_TOKENS, write_run_files
    from tests.helpers.verl import _fake_verl_run

    job = _skill_job()
    job = dict(job, train=dict(job["train"], rollout_budget=128, rollouts_per_step=64, eval_every=64))

    def extra(step):
        sums = {KL_SUM: 2.0 * step, TAUGHT_TOKENS: 20.0, RESPONSE_TOKENS: 80.0}  # the plugin's, summed by verl
        skills = {"skills/size": 3.0 * step, "skills/added": 3.0, "skills/share": 0.5}
        return skills | {f"actor/{k}": v for k, v in sums.items()}

    log, val, _ = _fake_verl_run(tmp_path, steps=2, val_steps=[1, 2], extra=extra)
    write_run_files(job, "skill_sd", 0, log, val, tmp_path / "run")
    train = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in train if r["kind"] == "train"]
    assert [r["skills"] for r in train] == [3.0, 6.0]  # the names the suite's Skill-SD logs
    assert [r["sdl_kl"] for r in train] == [0.1, 0.2]  # per taught token: the sums' ratio
    assert all(r["skills_added"] == 3.0 and r["skill_share"] == 0.5 and r["taught_token_share"] == 0.25 for r in train)


# --------------------------------------------------------------------------- config and trainer
def test_main_ppo_config_of_skill_sd_distils_from_the_student_with_no_teacher_pool(tmp_path):
    from methods.verl_backend.launch import main_ppo_config, validate
    from methods.verl_backend.trainer import SKILL_TRAINER

    job = _skill_job()
    kw = {"model_path": tmp_path / "base", "data_dir": tmp_path, "run_dir": tmp_path}
    cfg = main_ppo_config(job, 2, **kw)
    validate(cfg)
    assert cfg.trainer.v1.trainer_mode == SKILL_TRAINER
    assert cfg.actor_rollout_ref.rollout.n == job["method_config"]["group_size"] == 4
    assert cfg.actor_rollout_ref.actor.clip_ratio_high == 0.28
    assert cfg.algorithm.adv_estimator == plugin.ADV_ESTIMATOR_KEEP  # zero-variance groups keep their mask
    loss = cfg.distillation.distillation_loss
    assert loss.loss_mode == plugin.DISTILLATION_LOSS and loss.use_task_rewards and not loss.use_policy_gradient
    assert loss.loss_max_clamp is None
    assert cfg.lopd_bench.teacher_context == "skill" and cfg.lopd_bench.skills.actor.endswith("skill_sd/seed2")
    assert cfg.lopd_bench.teacher_max_len == cfg.actor_rollout_ref.rollout.max_model_len  # the teacher's own servers
    # the teacher is tempered to the student's temperature, the servers return the top-k that takes
    assert (
        cfg.lopd_bench.teacher_temperature == job["train"]["temperature"] == cfg.actor_rollout_ref.rollout.temperature
    )
    assert cfg.actor_rollout_ref.rollout.engine_kwargs.vllm.max_logprobs == cfg.lopd_bench.teacher_topk == 20
    assert not cfg.actor_rollout_ref.rollout.enable_prefix_caching  # vllm-project/vllm#42019
    with pytest.raises(ValueError, match="is_clip 3.0 has no verl path"):
        main_ppo_config(dict(job, method_config=dict(job["method_config"], is_clip=3.0)), 0, **kw)


def test_verls_distillation_loss_cannot_take_a_micro_batch_whose_mask_is_empty():
    """Why Skill-SD keeps zero-variance groups in the response mask on verl: with one rollout per
    micro-batch, the dropping estimator's empty masks would stop the run in verl's distillation loss."""
    from verl.trainer.distillation.losses import distillation_ppo_loss
    from verl.utils import tensordict_utils as tu
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import FSDPActorConfig, PolicyLossConfig

    from methods.verl_backend.launch import main_ppo_config

    cfg = main_ppo_config(_skill_job(), 0, model_path="m", data_dir="d", run_dir="r")
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 1
    actor = FSDPActorConfig(
        strategy="fsdp", ppo_mini_batch_size=1, ppo_micro_batch_size_per_gpu=1, use_dynamic_bsz=False, rollout_n=1,
        policy_loss=PolicyLossConfig(loss_mode=plugin.POLICY_LOSS), clip_ratio_low=0.2, clip_ratio_high=0.28,
    )  # fmt: skip
    rows = ROWS[:1]
    flat, logp, data = _verl_batch(rows)
    data["teacher_logprobs"] = _teacher_rows(logp - 0.1, rows)
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=1, global_batch_size=1)
    loss, _ = distillation_ppo_loss(actor, omega_conf_to_dataclass(cfg.distillation), {"log_probs": flat}, data)
    assert torch.isfinite(loss)  # the same rollout with its mask whole trains
    data["response_mask"] = torch.zeros_like(data["response_mask"])  # what the dropping estimator leaves
    with pytest.raises(RuntimeError):
        distillation_ppo_loss(actor, omega_conf_to_dataclass(cfg.distillation), {"log_probs": flat}, data)


@pytest.mark.slow  # a local Ray cluster
def test_skill_trainer_starts_no_teacher_pool_serves_the_teacher_from_the_rollout_and_resumes(tmp_path, monkeypatch):
    from verl.trainer.ppo.v1.trainer_base import Role
    from verl.utils.config import omega_conf_to_dataclass

    from methods.verl_backend.launch import main_ppo_config
    from methods.verl_backend.skills import skills_client
    from methods.verl_backend.trainer import SkillTrainer

    cfg = main_ppo_config(_skill_job(), 0, model_path="m", data_dir=tmp_path, run_dir=tmp_path)
    _, domain, _, _ = _domain_and_encoder("code")
    rows, _ = _train_rows(domain, 2)
    try:
        with _stubbed_verl_step(monkeypatch):
            trainer = SkillTrainer(cfg)
            assert trainer.trainer_mode == "sync" and not trainer.use_teacher_policy
            trainer._init_resource_pool_mgr()  # verl's plan of GPU pools, without starting them
            assert "teacher_pool" not in trainer.resource_pool_manager.resource_pool_spec
            assert Role.TeacherModel not in trainer.mapping and cfg.distillation.enabled  # the loss still distils
            trainer.distillation_config = omega_conf_to_dataclass(cfg.distillation)  # as _setup leaves it
            rollout = object()
            monkeypatch.setattr(SkillTrainer, "get_llm_client", lambda self: rollout)
            assert trainer.get_teacher_client() == {"default": rollout}  # the teacher is the student's own servers
            trainer.global_steps = 0
            trainer.on_init_end()
            client = skills_client(cfg.lopd_bench.skills)  # what an agent loop finds by name
            assert asyncio.run(client.choose(rows[0])) is None
            episode = type("Episode", (), {"turns": [], "reward": lambda self: 1.0, "feedback": lambda self: "ok"})()
            asyncio.run(client.stage(rows[0], episode))
            trainer.global_steps = 1
            metrics = {}
            assert trainer.step(metrics, {}) == "batch"
            assert metrics == {"skills/staged": 1, "skills/added": 1, "skills/size": 1, "skills/share": 0.0}
            assert asyncio.run(client.choose(rows[0])) is not None  # the task's own group now has a skill
            trainer._save_checkpoint()
            _check_resume(trainer, cfg, 1, "no skill library")
    finally:
        domain.close()

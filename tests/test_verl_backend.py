"""The verl backend on CPU: the plugin's registered losses inside verl's own loss functions, and the
parquet export read back through verl's RL dataset (verl 0.9.1, installed --no-deps)."""

from __future__ import annotations

import json
from importlib.metadata import entry_points
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml

pytest.importorskip("verl")
from verl.trainer.ppo import core_algos  # noqa: E402

from methods.losses import ppo_clip_loss  # noqa: E402
from methods.verl_backend import plugin  # noqa: E402
from tests.helpers.verl import (  # noqa: E402
    ROWS,
    _check_resume,
    _config,
    _domain_and_encoder,
    _expert_actions,
    _fake_verl_run,
    _loss,
    _privileged_worker,
    _ScriptedServer,
    _stubbed_verl_step,
    _suite_config,
    _Teacher,
    _teacher_rows,
    _train_rows,
    _verl_batch,
)

ROOT = Path(__file__).resolve().parents[1]
AGG = ["token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


def test_plugin_is_verl_entry_point_and_registered():
    (ep,) = [ep for ep in entry_points(group="verl.plugins") if ep.name == "lopd_bench"]
    assert ep.load() is plugin
    assert core_algos.get_adv_estimator_fn(plugin.ADV_ESTIMATOR) is plugin.grpo_advantage
    assert core_algos.get_adv_estimator_fn(plugin.ADV_ESTIMATOR_KEEP) is plugin.grpo_advantage_keep
    assert core_algos.get_policy_loss_fn(plugin.POLICY_LOSS) is plugin.ppo_loss
    from verl.trainer.distillation import losses as d

    assert d.get_distillation_loss_fn(plugin.DISTILLATION_LOSS) is plugin.sampled_reverse_kl
    assert d.get_distillation_loss_settings(plugin.DISTILLATION_LOSS).use_estimator
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    assert "lopd_bench_episode" in _agent_loop_registry  # the plugin brings the agent loop along
    plugin.register()  # idempotent


def test_plugin_runs_again_after_a_half_finished_import():
    """verl's plugin loader swallows an import that fails after ``register()`` ran (a circular import
    of the agent loop, where something imported it before verl); the next import runs the module
    again, whose fresh functions then replace their earlier copies instead of raising.  Someone
    else's function under one of the names is still refused.  (In a subprocess: it reloads the module.)"""
    import subprocess
    import sys

    script = """
import importlib
import pytest
from verl.trainer.ppo import core_algos
from verl.trainer.distillation import losses as d
from methods.verl_backend import plugin
module = importlib.reload(plugin)
assert core_algos.get_adv_estimator_fn(plugin.ADV_ESTIMATOR) is module.grpo_advantage
assert core_algos.get_adv_estimator_fn(plugin.ADV_ESTIMATOR_KEEP) is module.grpo_advantage_keep
assert d.get_distillation_loss_fn(plugin.DISTILLATION_LOSS) is module.sampled_reverse_kl
d.DISTILLATION_LOSS_REGISTRY[plugin.DISTILLATION_LOSS] = lambda *a, **k: None
with pytest.raises(ValueError, match="another distillation loss"):
    plugin.register()
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


# --------------------------------------------------------------------------- advantage
def _grpo_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.tensor([1.0, 0.0, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    uid = np.array([f"task{i // 4}" for i in range(16)], dtype=object)  # groups 1 and 3 have no variance
    lengths = torch.randint(1, 7, (16,), generator=g)
    mask = (torch.arange(6)[None, :] < lengths[:, None]).long()
    token_rewards = torch.zeros(16, 6)
    token_rewards[torch.arange(16), lengths - 1] = rewards  # the outcome on the last response token
    return token_rewards, mask, uid


def test_grpo_advantage_keep_equals_verl_grpo():
    token_rewards, mask, uid = _grpo_batch()
    ours, returns = plugin.grpo_advantage_keep(token_rewards, mask.clone(), uid)
    theirs, _ = core_algos.compute_grpo_outcome_advantage(token_rewards, mask, uid)
    torch.testing.assert_close(ours, theirs)
    assert returns is ours


def test_grpo_advantage_drops_zero_variance_groups_from_the_mask():
    token_rewards, mask, uid = _grpo_batch()
    before = mask.clone()
    adv, _ = plugin.grpo_advantage(token_rewards, mask, uid)
    dropped = torch.tensor([i // 4 in (1, 3) for i in range(16)])
    assert (mask[dropped] == 0).all()  # in place: verl's loss and token count read this mask
    assert torch.equal(mask[~dropped], before[~dropped])
    theirs, _ = core_algos.compute_grpo_outcome_advantage(token_rewards, before, uid)
    torch.testing.assert_close(adv[~dropped], theirs[~dropped])
    assert (adv[dropped] == 0).all()


# --------------------------------------------------------------------------- policy loss


@pytest.mark.parametrize("agg", AGG)
def test_policy_loss_equals_verl_vanilla_and_the_suite(agg):
    flat, logp, data = _verl_batch(ROWS)
    ours, grad_ours, m_ours = _loss(plugin.POLICY_LOSS, agg, flat, data)
    theirs, grad_theirs, m_theirs = _loss("vanilla", agg, flat, data)
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(grad_ours, grad_theirs)
    for key in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"):
        assert m_ours[key].values == pytest.approx(m_theirs[key].values, abs=1e-6)
    suite, _ = ppo_clip_loss(
        logp, data["old_log_probs"], data["advantages"], data["response_mask"], clip_low=0.2, clip_high=0.28, agg=agg
    )
    torch.testing.assert_close(ours, suite)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_policy_loss_micro_batches_and_ranks_add_up_to_the_batch(agg):
    """verl normalises each micro-batch by the global batch's tokens (or sequences) and DDP averages
    the ranks' gradients: the micro-batches' losses, summed and averaged over ranks, are the batch's."""
    flat, _, data = _verl_batch(ROWS)
    full, grad_full, _ = _loss(plugin.POLICY_LOSS, agg, flat, data)
    info = {"batch_num_tokens": int(data["response_mask"].sum()), "global_batch_size": len(ROWS)}
    parts = [_loss(plugin.POLICY_LOSS, agg, *_split(flat, data, rows), **info)[0] for rows in ([0, 1], [2, 3])]
    torch.testing.assert_close(parts[0] + parts[1], full)
    ranks = [
        _loss(plugin.POLICY_LOSS, agg, *_split(flat, data, rows), dp_size=2, **info)[0] for rows in ([0, 1], [2, 3])
    ]
    torch.testing.assert_close((ranks[0] + ranks[1]) / 2, full)
    assert grad_full.abs().sum() > 0  # the sums compared above are not all zero


def _split(flat, data, rows):
    pieces = flat.split([r + p for r, p in ROWS])
    return torch.cat([pieces[i] for i in rows]), data[rows]


def test_policy_loss_refuses_rollout_correction_weights():
    _, logp, data = _verl_batch(ROWS)
    with pytest.raises(ValueError, match="rollout-correction"):
        plugin.ppo_loss(
            data["old_log_probs"],
            logp,
            data["advantages"],
            data["response_mask"].bool(),
            config=_config(plugin.POLICY_LOSS),
            rollout_is_weights=torch.ones_like(logp),
        )


class _KV:
    """TransferQueue's key-value calls on one partition, holding the fields verl's agent loop puts
    there for each rollout (``AgentLoopWorkerTQ``: ``loss_mask`` a copy of ``response_mask``); a put
    replaces or adds fields, as TransferQueue's does."""

    class Meta(SimpleNamespace):
        def __len__(self):
            return len(self.keys)

    def __init__(self, rows):
        from verl.utils.tensordict_utils import list_of_dict_to_tensordict

        self.data = list_of_dict_to_tensordict(rows)

    def kv_batch_get(self, keys, partition_id, select_fields):
        return self.data.select(*[f for f in select_fields if f in self.data.keys()])

    def kv_batch_put(self, keys, partition_id, fields):
        for key in fields.keys():
            self.data[key] = fields[key]
        return self.Meta(keys=keys, partition_id=partition_id, tags=[{}] * len(keys))

    def padded(self, field, width):
        out = torch.zeros(len(self.data), width)
        for i, row in enumerate(self.data[field].unbind()):
            out[i, : len(row)] = row
        return out


#: 4 groups of 4: two with rewards that differ, two (all 0, all 1) that carry no signal
ZV_REWARDS = [1, 0, 1, 0, 0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 1]
ZV_ROWS = [(1 + i % 5, 1 + i % 3) for i in range(16)]


def _step_through_verl_v1(small_job, tmp_path, monkeypatch, compute_advantage):
    """One GRPO step's loss as verl v1 takes it: the advantage by the trainer (``compute_advantage``,
    the generated config's trainer's or verl's stock one) over the batch in TransferQueue, then the
    engine's token count from ``loss_mask`` (``FSDPEngine.forward_backward_batch``) and verl's
    ``ppo_loss`` with the plugin's loss.  Returns the loss, the token count and the loss's gradient
    on the response tokens' log-probabilities."""
    import transfer_queue
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from methods.verl_backend.launch import main_ppo_config
    from methods.verl_backend.trainer import GRPO_TRAINER, GRPOTrainer

    cfg = main_ppo_config(small_job, 0, model_path="m", data_dir=tmp_path, run_dir=tmp_path)
    assert cfg.trainer.v1.trainer_mode == GRPO_TRAINER and cfg.algorithm.adv_estimator == plugin.ADV_ESTIMATOR
    monkeypatch.setattr(PPOTrainerSync, "on_init_end", lambda self: None)
    trainer = GRPOTrainer(cfg)
    flat, _, data = _verl_batch(ZV_ROWS)
    kv = _KV([
        {"uid": f"g{i // 4}", "response_mask": torch.ones(r, dtype=torch.long),
         "loss_mask": torch.ones(r, dtype=torch.long),
         "rm_scores": torch.nn.functional.pad(torch.tensor([float(ZV_REWARDS[i])]), (r - 1, 0)),
         "rollout_log_probs": data["old_log_probs"][i, :r], "old_log_probs": data["old_log_probs"][i, :r]}
        for i, (r, _) in enumerate(ZV_ROWS)
    ])  # fmt: skip
    monkeypatch.setattr(transfer_queue, "kv_batch_get", kv.kv_batch_get)
    monkeypatch.setattr(transfer_queue, "kv_batch_put", kv.kv_batch_put)
    compute_advantage(trainer, _KV.Meta(keys=[f"k{i}" for i in range(16)], partition_id="train", tags=[]), {})
    data["advantages"], data["response_mask"] = kv.padded("advantages", 5), kv.padded("response_mask", 5).long()
    tokens = int(sum(int(m.sum()) for m in kv.data["loss_mask"].unbind()))  # what verl's engine counts
    loss, grad, _ = _loss(plugin.POLICY_LOSS, "token-mean", flat, data, batch_num_tokens=tokens)
    on_responses = torch.zeros(16, 5)
    for i, ((r, p), piece) in enumerate(zip(ZV_ROWS, grad.split([r + p for r, p in ZV_ROWS]))):
        on_responses[i, :r] = piece[p - 1 : p - 1 + r]
    return loss, tokens, on_responses


def test_zero_variance_groups_leave_verl_v1s_token_count_as_they_leave_the_suites_loss(
    small_job, tmp_path, monkeypatch
):
    """verl v1 normalises the token mean by ``loss_mask``, which the agent loop wrote once; the
    generated config's trainer writes the estimator's cleared mask there, so the loss and its
    gradient are the suite's GRPO loss over the kept groups.  verl's stock trainer would halve them."""
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from methods.grpo import groups_with_variance
    from methods.losses import grpo_outcome_advantage

    rewards = torch.tensor(ZV_REWARDS, dtype=torch.float)
    groups = torch.arange(16) // 4
    kept = groups_with_variance(rewards, groups)
    assert kept.sum() == 8  # half the rollouts carry a signal
    _, logp, data = _verl_batch(ZV_ROWS)  # the same batch _step_through_verl_v1 builds
    adv = grpo_outcome_advantage(rewards, groups, norm_by_std=small_job["method_config"]["norm_by_std"])
    logp = logp.clone().requires_grad_()
    suite, _ = ppo_clip_loss(  # the clip range of _loss's actor config
        logp[kept], data["old_log_probs"][kept], adv[kept].unsqueeze(-1).expand(-1, 5), data["response_mask"][kept],
        clip_low=0.2, clip_high=0.28, agg="token-mean",
    )  # fmt: skip
    suite.backward()

    from methods.verl_backend.trainer import GRPOTrainer

    def verl_step(compute_advantage):
        return _step_through_verl_v1(small_job, tmp_path, monkeypatch, compute_advantage)

    loss, tokens, grad = verl_step(GRPOTrainer._compute_advantage)
    assert tokens == int(data["response_mask"][kept].sum())
    torch.testing.assert_close(loss, suite.detach())
    torch.testing.assert_close(grad, logp.grad)
    assert logp.grad.abs().sum() > 0
    # verl's stock trainer: the token count keeps the dropped groups, and the gradient shrinks by their share
    loss, tokens, grad = verl_step(PPOTrainerSync._compute_advantage)
    share = float(data["response_mask"][kept].sum() / data["response_mask"].sum())
    assert tokens == int(data["response_mask"].sum()) and share < 1
    torch.testing.assert_close(grad, logp.grad * share)


def test_a_mini_batch_of_dropped_groups_adds_nothing():
    """Where every group of a mini-batch was dropped, its kept token count is 0: the plugin's loss is 0
    (no division by zero)."""
    flat, _, data = _verl_batch(ROWS)
    data["response_mask"] = torch.zeros_like(data["response_mask"])
    loss, grad, _ = _loss(plugin.POLICY_LOSS, "token-mean", flat, data, batch_num_tokens=0)
    assert float(loss) == 0.0 and not grad.abs().sum()


def _response_grad(flat, rows=ROWS):
    """The gradient on the flat per-sequence log-probs, laid out on the padded responses."""
    got = torch.zeros(len(rows), 5)
    for i, ((r, p), piece) in enumerate(zip(rows, flat.grad.split([r + p for r, p in rows]))):
        got[i, :r] = piece[p - 1 : p - 1 + r]
    return got


def test_sampled_reverse_kl_gradient_is_the_importance_weighted_score_function_estimate():
    from methods.divergences import sampled_token_reverse_kl
    from methods.verl_backend.metrics import KL_SUM, RESPONSE_TOKENS, TAUGHT_TOKENS

    flat, logp, data = _verl_batch(ROWS)
    teacher = logp - 0.5 * torch.rand_like(logp)
    teacher[2] = plugin.NO_TEACHER  # a rollout whose teacher read nothing privileged
    data["teacher_logprobs"] = _teacher_rows(teacher)
    data["old_log_probs"][0] = logp[0] - 1.0  # a rollout the update has moved far: its weight is capped
    flat = flat.clone().requires_grad_()
    per_token, metrics = plugin.sampled_reverse_kl(None, None, {"log_probs": flat}, data)
    mask = data["response_mask"].bool()
    (per_token * mask).sum().backward()
    taught = mask.clone()
    taught[2] = False
    student = logp.clone().requires_grad_()
    suite = sampled_token_reverse_kl(student[taught], teacher[taught], data["old_log_probs"][taught], plugin.IS_CLIP)
    suite.sum().backward()  # the suite's term on the taught tokens; d/ds = min(π_S/π_old, 2)·(s − t)
    torch.testing.assert_close(_response_grad(flat), torch.where(taught, student.grad, torch.zeros_like(logp)))
    assert not per_token[2].any() and per_token[taught].abs().sum() > 0
    ratio = torch.exp(logp - data["old_log_probs"])[taught]
    assert (ratio > plugin.IS_CLIP).any() and (ratio < 1).any()  # the cap and the weight both matter here
    sums = {k: m.aggregate() for k, m in metrics.items()}  # verl's Metric objects, of kind SUM
    assert sums[KL_SUM] == pytest.approx(float((logp - teacher)[taught].sum()))
    assert sums[TAUGHT_TOKENS] == int(taught.sum()) and sums[RESPONSE_TOKENS] == int(mask.sum())


# --------------------------------------------------------------------------- parquet export
@pytest.fixture(scope="module")
def small_job():
    from methods.core.config import resolve_job

    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    cfg["profile"] = "small"
    return resolve_job(cfg, "code", "grpo")


@pytest.mark.slow  # verl's RLHFDataset over the exported parquet
def test_export_reads_back_through_verl_dataset(small_job, tmp_path):
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from methods.core.rollout import initial_prompt_ids
    from methods.core.tokenizer import ChatEncoder
    from methods.verl_backend.export import AGENT_NAME, export_job, task_of_row
    from tasks.base import get_domain

    paths = export_job(small_job, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["test.parquet", "train.parquet"]  # no .partial left
    tok = AutoTokenizer.from_pretrained(ROOT / "results" / "base" / "small" / "code" / "model")
    conf = OmegaConf.create({"max_prompt_length": 1024, "filter_overlong_prompts": True, "cache_dir": str(tmp_path)})
    domain = get_domain("code", seed=small_job["task_seed"], **small_job["domain_options"])
    encoder = ChatEncoder(tok)
    cache = {}
    for split, n in (("train", len(domain.tasks("train"))), ("test", small_job["train"]["eval_episodes"])):
        ds = RLHFDataset(data_files=[str(paths[split])], tokenizer=tok, config=conf)
        assert len(ds) == n  # no prompt filtered out as too long
        tasks = domain.tasks(split, n)
        for i in (0, n // 2, n - 1):
            row = ds[i]
            assert row["agent_name"] == AGENT_NAME and row["index"] == i
            ids = tok.apply_chat_template(row["raw_prompt"], add_generation_prompt=True, tokenize=True)
            ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
            assert list(ids) == initial_prompt_ids(encoder, domain, tasks[i], None)  # verl's prompt is the suite's
            d, task = task_of_row(row["extra_info"], cache)
            assert task == tasks[i] and task.payload == tasks[i].payload
    domain.close()


def test_export_of_a_heldout_benchmark_and_a_stale_row(small_job, tmp_path):
    import pandas as pd

    from methods.verl_backend.export import export_job, task_of_row

    job = dict(
        small_job, heldout_domain="humaneval", train=dict(small_job["train"], eval_episodes=5, curve_eval_episodes=None)
    )
    paths = export_job(job, tmp_path)
    test = pd.read_parquet(paths["test"])
    assert list(test["ability"]) == ["humaneval"] * 5
    info = dict(test["extra_info"][0])
    assert task_of_row(info)[1].task_id == "HumanEval/0"
    with pytest.raises(ValueError, match="export the tasks again"):
        task_of_row(dict(info, domain_version="0"))
    with pytest.raises(KeyError, match="no test task"):
        task_of_row(dict(info, task_id="HumanEval/9999"))


# --------------------------------------------------------------------------- agent loop


@pytest.mark.parametrize("name", ["tooluse", "code"])
def test_agent_loop_plays_the_expert_in_the_suites_token_layout(name):
    import asyncio

    from methods.core.rollout import trajectory_ids
    from methods.verl_backend.agent_loop import play_episode

    _, domain, encoder, _ = _domain_and_encoder(name)
    task = next(t for t in domain.tasks("train", 50) if len(domain.expert_trajectory(t).turns) >= 2 or name == "code")
    expert = domain.expert_trajectory(task)
    server = _ScriptedServer(_expert_actions(encoder, expert))
    out = asyncio.run(play_episode(server.generate, encoder, domain, task, {"temperature": 1.0}, 4096))
    ids, mask = trajectory_ids(encoder, domain, task, None, expert.turns)
    assert out.prompt_ids + out.response_ids == ids  # the suite's own layout of the same trajectory
    assert [0] * len(out.prompt_ids) + out.response_mask == mask  # observations are not agent tokens
    assert out.reward_score == 1.0 and out.extra_fields["turns"] == len(expert.turns)
    assert (0 in out.response_mask) == (name == "tooluse")  # tool use: several turns, observations between
    assert not out.extra_fields["truncated"] and not server.actions
    assert len(out.response_logprobs) == len(out.response_ids)
    assert [c[0] for c in server.calls] == [
        ids[: len(out.prompt_ids) + k]
        for k, m in enumerate(out.response_mask)
        if m and (k == 0 or not out.response_mask[k - 1])
    ]  # each turn is generated from everything before it
    domain.close()


def test_agent_loop_wrong_answer_truncation_and_missing_logprobs():
    import asyncio

    from methods.verl_backend.agent_loop import play_episode

    _, domain, encoder, _ = _domain_and_encoder("tooluse")
    task = domain.tasks("train", 1)[0]
    wrong = encoder.encode("not a call") + [encoder.eos_id]
    out = asyncio.run(
        play_episode(
            _ScriptedServer([wrong] * task.max_turns, log_probs=False).generate, encoder, domain, task, {}, 4096
        )
    )
    assert out.reward_score < 1.0 and out.extra_fields["feedback"]
    assert out.response_logprobs is None
    assert out.extra_fields["turns"] <= task.max_turns
    server = _ScriptedServer([wrong * 20] * task.max_turns)
    out = asyncio.run(play_episode(server.generate, encoder, domain, task, {"max_tokens": 500}, 64))
    assert len(out.response_ids) <= 64 and len(out.response_mask) == len(out.response_ids)
    assert out.extra_fields["truncated"] or out.extra_fields["turns"] == 1
    assert all(c[1]["max_tokens"] <= 64 for c in server.calls)  # never asks for more than the room left
    domain.close()


def test_agent_loop_runs_an_exported_row_through_verls_interface(tmp_path):
    import asyncio

    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, _agent_loop_registry
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from methods.verl_backend.agent_loop import EpisodeAgentLoop
    from methods.verl_backend.export import AGENT_NAME, export_job, task_of_row

    job, domain, encoder, tok = _domain_and_encoder("tooluse")
    assert _agent_loop_registry[AGENT_NAME]["_target_"] == "methods.verl_backend.agent_loop.EpisodeAgentLoop"
    paths = export_job(dict(job, train=dict(job["train"], eval_episodes=4, curve_eval_episodes=None)), tmp_path)
    conf = OmegaConf.create({"max_prompt_length": 1024, "cache_dir": str(tmp_path)})
    row = RLHFDataset(data_files=[str(paths["test"])], tokenizer=tok, config=conf)[2]
    _, task = task_of_row(row["extra_info"])
    server = _ScriptedServer(_expert_actions(encoder, domain.expert_trajectory(task)))
    trainer = OmegaConf.create({"actor_rollout_ref": {"rollout": {"prompt_length": 1024, "response_length": 2048}}})
    loop = EpisodeAgentLoop(DictConfigWrap(trainer), server, tok, None, RLHFDataset, DictConfigWrap(conf))
    out = asyncio.run(loop.run({"temperature": 1.0}, **row))
    assert out.reward_score == 1.0 and out.extra_fields["task_id"] == task.task_id
    domain.close()


# --------------------------------------------------------------------------- metrics adapter


def test_metrics_adapter_writes_run_files_that_analysis_reads(small_job, tmp_path):
    from analysis.runs import check_comparable, eval_points, final_rows
    from methods.core.evaluate import mean_se
    from methods.verl_backend.metrics import write_run_files

    job = dict(small_job, train=dict(small_job["train"], rollout_budget=64, rollouts_per_step=16))
    log, val, scores = _fake_verl_run(tmp_path, steps=4, val_steps=[2, 4])
    out = tmp_path / "run"
    summary = write_run_files(job, "grpo", 0, log, val, out)
    assert summary["ledger"]["rollouts"] == summary["ledger"]["rollout_budget"] == 64
    assert summary["final"]["heldout_reward"] == pytest.approx(mean_se(scores[4])[0])
    assert summary["final"]["heldout_reward_se"] == pytest.approx(mean_se(scores[4])[1])
    rows = final_rows([], [str(out / "summary.json")])
    check_comparable(rows)
    points = eval_points([str(out / "summary.json")])
    assert list(points["rollouts"]) == [0, 32, 64]
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if r["kind"] == "train"] == [1, 2, 3, 4]
    assert [r["kind"] for r in recs][-3:] == ["train", "train", "eval"]  # the last evaluation follows the last step
    assert [r for r in recs if r["kind"] == "train"][-1]["wall_s"] == 8.0


def test_metrics_adapter_merges_the_logs_of_a_resumed_run(small_job, tmp_path):
    """verl's FileLogger truncates its file when it opens it, so each attempt of a run logs to its
    own file; a run that crashed after step 3 and resumed from its step-2 checkpoint has steps
    1-3 in the first file and 3-4 in the second, and its records are steps 1-4, step 3 the second's."""
    from methods.verl_backend.metrics import train_records, write_run_files

    job = dict(small_job, train=dict(small_job["train"], rollout_budget=64, rollouts_per_step=16))
    log, val, _ = _fake_verl_run(tmp_path, steps=4, val_steps=[2, 4])
    lines = log.read_text().splitlines()
    step = [json.loads(x)["step"] for x in lines]
    first, second = tmp_path / "verl.100.jsonl", tmp_path / "verl.200.jsonl"
    first.write_text("".join(x + "\n" for x, s in zip(lines, step) if s <= 3))
    resumed = [json.loads(x) for x, s in zip(lines, step) if s >= 3]
    for rec in resumed:
        rec["data"]["timing_s/step"] = 3.0  # the second attempt's steps, told apart
    second.write_text("".join(json.dumps(r) + "\n" for r in resumed))
    records = train_records([second, first], 16)  # any order given: read in the order written
    assert [r["step"] for r in records] == [1, 2, 3, 4] and records[-1]["wall_s"] == 2.0 + 2.0 + 3.0 + 3.0
    summary = write_run_files(job, "grpo", 0, [first, second], val, tmp_path / "run")
    assert summary["ledger"]["rollouts"] == 64 and summary["ledger"]["steps"] == 4


def test_metrics_adapter_refuses_a_run_short_of_its_budget(small_job, tmp_path):
    from methods.verl_backend.metrics import write_run_files

    job = dict(small_job, train=dict(small_job["train"], rollout_budget=64, rollouts_per_step=16))
    log, val, _ = _fake_verl_run(tmp_path, steps=3, val_steps=[2])
    with pytest.raises(ValueError, match="not at its budget 64"):
        write_run_files(job, "grpo", 0, log, val, tmp_path / "run")
    assert not (tmp_path / "run" / "summary.json").exists()
    (val / "4.jsonl").write_text('{"score": 1.0}\n')
    with pytest.raises(ValueError, match="logged 48 rollouts of its budget 64"):
        write_run_files(job, "grpo", 0, log, val, tmp_path / "run")
    (val / "5.jsonl").write_text("{not json\n")
    with pytest.raises(ValueError, match="5.jsonl:1: not a JSON line"):
        write_run_files(job, "grpo", 0, log, val, tmp_path / "run")


# --------------------------------------------------------------------------- main_ppo config
def test_main_ppo_config_matches_the_job_and_passes_verls_validation(small_job, tmp_path):
    from methods.verl_backend.launch import main_ppo_config, validate

    cfg = main_ppo_config(small_job, 3, model_path="m", data_dir=tmp_path / "data", run_dir=tmp_path / "run")
    validate(cfg)  # verl's own check (raises on an inconsistent config)
    train, mc = small_job["train"], small_job["method_config"]
    n = cfg.actor_rollout_ref.rollout.n
    assert n == mc["group_size"] and cfg.data.train_batch_size * n == train["rollouts_per_step"]
    assert cfg.trainer.total_training_steps * train["rollouts_per_step"] == train["rollout_budget"]  # the budget
    assert cfg.trainer.test_freq * train["rollouts_per_step"] == train["eval_every"] and cfg.trainer.val_before_train
    assert cfg.algorithm.adv_estimator == plugin.ADV_ESTIMATOR
    assert cfg.trainer.v1.trainer_mode == "lopd_bench_grpo_trainer"  # the kept groups' token count (test below)
    # verl's default would be flash_attention_2: the suite asks for it only where the locked environment has it
    lock = (ROOT / "envs" / "verl.lock.txt").read_text()
    flash = any(line.startswith("flash-attn==") for line in lock.splitlines())
    attention = cfg.actor_rollout_ref.model.override_config.attn_implementation
    assert attention == ("flash_attention_2" if flash else "sdpa")
    # the estimator clears zero-variance rows of response_mask; verl's v1 trainer writes that mask back
    # for the loss only while rollout correction is on (trainer_base._compute_advantage): its config set,
    # not bypassed, and the rollouts' log-probs in the batch; and without IS weights, which the loss refuses
    correction = cfg.algorithm.rollout_correction
    assert correction is not None and not correction.bypass_mode and correction.rollout_is is None
    assert cfg.actor_rollout_ref.rollout.calculate_log_probs
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == plugin.POLICY_LOSS
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size * n == train["minibatch_rollouts"]
    assert cfg.data.train_files == str(tmp_path / "data" / "train.parquet") and cfg.data.seed == 3
    assert "file" in cfg.trainer.logger and cfg.trainer.validation_data_dir == str(tmp_path / "run" / "val")
    assert cfg.data.max_prompt_length + cfg.data.max_response_length == train["max_seq_len"]
    cfg.actor_rollout_ref.actor.ppo_mini_batch_size = cfg.data.train_batch_size * 2
    with pytest.raises(ValueError, match="ppo_mini_batch_size"):
        validate(cfg)  # the validation can fail


def test_main_ppo_config_refuses_what_verl_cannot_run_yet(small_job, tmp_path):
    from methods.verl_backend.launch import main_ppo_config

    kw = {"model_path": "m", "data_dir": tmp_path, "run_dir": tmp_path}
    with pytest.raises(ValueError, match="has no verl path yet"):
        main_ppo_config(dict(small_job, method="lopd"), 0, **kw)
    odd = dict(
        small_job, train=dict(small_job["train"], rollout_budget=small_job["train"]["rollouts_per_step"] * 3 + 1)
    )
    with pytest.raises(ValueError, match="must be a multiple of train.rollouts_per_step"):
        main_ppo_config(odd, 0, **kw)
    seq_mean = dict(small_job, method_config=dict(small_job["method_config"], loss_agg="seq-mean-token-mean"))
    with pytest.raises(ValueError, match="with drop_zero_variance has no verl path"):
        main_ppo_config(seq_mean, 0, **kw)
    seq_mean["method_config"]["drop_zero_variance"] = False  # kept groups: verl's normalisation is the suite's
    assert main_ppo_config(seq_mean, 0, **kw).trainer.v1.trainer_mode == "sync"


def test_a_methods_verl_path_is_its_adapter(small_job, tmp_path):
    """The backend asks the adapter registry: a method without an adapter is refused with the list of
    those that have one; one adapter class registered gives a method its verl path, its settings
    after the shared ones, its trainer and agent-loop manager; a second adapter for a name is refused."""
    from methods.verl_backend import adapters
    from methods.verl_backend.launch import main_ppo_config

    kw = {"model_path": "m", "data_dir": tmp_path, "run_dir": tmp_path}
    with pytest.raises(ValueError, match=r"'lopd' has no verl path yet \(supported: grpo, retrieval_rl, opsd"):
        main_ppo_config(dict(small_job, method="lopd"), 0, **kw)

    class Toy(adapters.GRPOAdapter):
        method = "toy_grpo"
        agent_loop_manager = "some.module.Manager"
        run_file_fields = {"toy": "toy/metric"}

        def overrides(self, job, seed, ctx):
            return {**super().overrides(job, seed, ctx), "lopd_bench.toy": seed}

        def trainer_mode(self, job):
            return "sync"

    try:
        adapters.register_adapter(Toy)
        assert "toy_grpo" in adapters.supported_methods()
        cfg = main_ppo_config(dict(small_job, method="toy_grpo"), 7, **kw)
        assert cfg.lopd_bench.toy == 7 and cfg.trainer.v1.trainer_mode == "sync"
        assert cfg.actor_rollout_ref.rollout.agent.agent_loop_manager_class == "some.module.Manager"
        assert cfg.trainer.experiment_name == "code-toy_grpo-seed7"  # the shared settings, too

        class Other(adapters.GRPOAdapter):
            method = "toy_grpo"

        with pytest.raises(ValueError, match="already has a verl adapter"):
            adapters.register_adapter(Other)
    finally:
        adapters.ADAPTERS.pop("toy_grpo", None)


# --------------------------------------------------------------------------- backend: verl profiles


def test_verl_profile_jobs_carry_the_backend_and_refuse_methods_without_a_verl_path():
    from methods.core.config import resolve_job, validate
    from methods.verl_backend import check_profile

    cfg = dict(_suite_config(), profile="real-verl")
    validate(cfg)
    check_profile(cfg)
    job = resolve_job(cfg, "code", "grpo")
    assert job["backend"] == "verl" and job["backend_options"]["gpus"] == 1
    assert "backend" not in resolve_job(dict(cfg, profile="small"), "code", "grpo")  # other profiles' jobs unchanged
    cfg["profiles"]["real-verl"]["methods"] = ["grpo", "lopd"]
    with pytest.raises(
        ValueError,
        match=r"backend verl runs \['grpo', 'retrieval_rl', 'opsd', 'sdft', 'sdpo', 'skill_sd'\] so far, "
        r"not \['lopd'\]",
    ):
        check_profile(cfg)  # rules/verl.smk runs it at parse time (the dry-run test below sees it refuse)


@pytest.mark.slow
def test_verl_profile_dry_run_trains_with_verl():
    import re
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "results/real-verl/table1.csv", "--config", "profile=real-verl"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rules = set(re.findall(r"^rule (\w+):", out.stdout + out.stderr, re.MULTILINE))
    assert {"verl_data", "verl_train", "table1"} <= rules and "train" not in rules, sorted(rules)


# --------------------------------------------------------------------------- retrieval RL


def test_bank_service_stages_during_a_step_and_retrieves_after_it(tmp_path):
    from methods.experience.bank import LeakError
    from methods.verl_backend.bank import BankService
    from methods.verl_backend.export import task_rows

    _, domain, _, _ = _domain_and_encoder("tooluse")
    rows, tasks = _train_rows(domain)
    service = BankService(n_retrieve=2)  # the suite's default bank settings
    for row, task in zip(rows[:2], tasks[:2]):
        expert = domain.expert_trajectory(task)
        service.stage(row, [(t.action, t.observation) for t in expert.turns], 1.0)
    assert service.contexts(rows) == [None] * 3  # staged, not yet in the bank: the step's own rollouts see none
    assert service.commit(step=1) == {"bank/staged": 2, "bank/added": 2, "bank/size": 2}
    own, other, third = service.contexts(rows)
    assert tasks[1].prompt in own and tasks[0].prompt not in own  # a task never retrieves its own trajectory
    assert tasks[0].prompt in other and tasks[0].prompt in third and tasks[1].prompt in third
    service.stage(rows[2], [("no", None)], 0.0)
    assert service.commit(step=2)["bank/added"] == 0  # a failure stays out
    entered = []
    for order in ([("b", None)], [("a", None)]), ([("a", None)], [("b", None)]):
        fresh = BankService(n_retrieve=2)
        for turns in order:  # two successes of one task, finishing in either order
            fresh.stage(rows[2], turns, 1.0)
        fresh.commit(step=1)
        entered.append(fresh.bank.items[0].turns)
    assert entered[0] == entered[1] == (("a", None),)  # one enters (max_per_task 1), whatever the timing
    test_row = task_rows(domain, domain.tasks("test", 1), "test")[0]["extra_info"]
    with pytest.raises(LeakError):
        service.stage(test_row, [("x", None)], 1.0)
    assert service.contexts([test_row])[0] is not None  # held-out episodes retrieve from the training bank
    service.save(str(tmp_path / "bank.pt"))
    fresh = BankService(n_retrieve=2)
    assert fresh.load(str(tmp_path / "bank.pt")) == 2 and fresh.contexts(rows) == service.contexts(rows)
    domain.close()


def test_retrieval_agent_loop_reads_the_bank_and_stages_only_training_episodes(tmp_path, monkeypatch):
    import asyncio

    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from methods.core.rollout import initial_prompt_ids
    from methods.verl_backend import agent_loop
    from methods.verl_backend.bank import BankClient, BankService
    from methods.verl_backend.export import task_rows

    _, domain, encoder, tok = _domain_and_encoder("code")
    rows, tasks = _train_rows(domain)
    service = BankService()
    expert = domain.expert_trajectory(tasks[0])
    service.stage(rows[0], [(t.action, t.observation) for t in expert.turns], 1.0)
    service.commit(step=0)
    monkeypatch.setattr(agent_loop, "bank_client", lambda settings: BankClient(service))
    trainer = OmegaConf.create(
        {
            "actor_rollout_ref": {"rollout": {"prompt_length": 2048, "response_length": 2048}},
            "lopd_bench": {"retrieval": {"actor": "unused", "n_retrieve": 3}},
        }
    )
    conf = OmegaConf.create({"max_prompt_length": 2048})
    test_row = task_rows(domain, domain.tasks("test", 1), "test")[0]["extra_info"]
    for row, task in ((rows[1], tasks[1]), (test_row, domain.tasks("test", 1)[0])):
        server = _ScriptedServer(_expert_actions(encoder, domain.expert_trajectory(task)))
        loop = agent_loop.EpisodeAgentLoop(
            DictConfigWrap(trainer), server, tok, None, RLHFDataset, DictConfigWrap(conf)
        )
        out = asyncio.run(loop.run({"temperature": 1.0}, extra_info=row))
        context = service.contexts([row])[0]
        assert context and tasks[0].prompt in context
        assert out.prompt_ids == initial_prompt_ids(encoder, domain, task, context)  # the experience is in the prompt
        assert server.calls[0][0] == out.prompt_ids and out.extra_fields["context_chars"] == len(context)
    assert [t.task_id for t, _, _ in service.pending] == [tasks[1].task_id]  # the training episode, not the test one
    assert service.pending[0][2] == 1.0
    domain.close()


def _retrieval_job(job, seed_tasks=0):
    return dict(job, method="retrieval_rl", bank=dict(job["bank"], seed_tasks=seed_tasks))


def test_main_ppo_config_of_retrieval_rl_runs_the_bank_trainer(tmp_path):
    from methods.core.config import resolve_job
    from methods.verl_backend.launch import main_ppo_config, validate
    from methods.verl_backend.trainer import TRAINER

    job = resolve_job(dict(_suite_config(), profile="real-verl"), "code", "retrieval_rl")
    kw = {"model_path": "m", "data_dir": tmp_path, "run_dir": tmp_path}
    cfg = main_ppo_config(job, 1, **kw)
    validate(cfg)
    assert cfg.trainer.v1.trainer_mode == TRAINER
    retrieval = cfg.lopd_bench.retrieval
    assert retrieval.n_retrieve == job["method_config"]["n_retrieve"] == 3 and retrieval.actor.endswith("seed1")
    assert retrieval.bank_config == job["bank"] and retrieval.seed is None
    with pytest.raises(ValueError, match="needs the seeded bank"):
        main_ppo_config(_retrieval_job(job, seed_tasks=8), 1, **kw)
    (tmp_path / "bank.pt").write_bytes(b"")
    seeded = main_ppo_config(_retrieval_job(job, seed_tasks=8), 1, bank_path=tmp_path / "bank.pt", **kw)
    assert seeded.lopd_bench.retrieval.seed == str((tmp_path / "bank.pt").resolve())
    assert "lopd_bench" not in main_ppo_config(dict(job, method="grpo"), 1, **kw)  # GRPO: verl's own sync trainer


@pytest.mark.slow  # a local Ray cluster
def test_retrieval_trainer_grows_the_bank_after_each_step_and_resumes_it(tmp_path, monkeypatch):
    import asyncio

    from methods.core.config import resolve_job
    from methods.verl_backend.bank import bank_client
    from methods.verl_backend.launch import main_ppo_config
    from methods.verl_backend.trainer import RetrievalTrainer

    job = resolve_job(dict(_suite_config(), profile="real-verl"), "code", "retrieval_rl")
    cfg = main_ppo_config(job, 0, model_path="m", data_dir=tmp_path, run_dir=tmp_path)
    _, domain, _, _ = _domain_and_encoder("code")
    rows, tasks = _train_rows(domain, 2)
    try:
        with _stubbed_verl_step(monkeypatch):
            trainer = RetrievalTrainer(cfg)
            assert trainer.trainer_mode == "sync" == cfg.trainer.v1.trainer_mode  # verl's sync machinery
            trainer.global_steps = 0
            trainer.on_init_end()
            client = bank_client(cfg.lopd_bench.retrieval)  # what an agent loop finds by name
            expert = domain.expert_trajectory(tasks[0])
            asyncio.run(client.stage(rows[0], expert.turns, 1.0))
            assert asyncio.run(client.context(rows[1])) is None  # not before the step's end
            trainer.global_steps = 1
            metrics = {}
            assert trainer.step(metrics, {}) == "batch"
            assert metrics == {"bank/staged": 1, "bank/added": 1, "bank/size": 1}
            assert tasks[0].prompt in asyncio.run(client.context(rows[1]))
            trainer._save_checkpoint()
            _check_resume(trainer, cfg, 1, "no experience bank")
    finally:
        domain.close()


# --------------------------------------------------------------------------- OPSD: the privileged-context teacher


def test_teacher_rows_move_to_where_the_students_logits_predict_the_response():
    """``align_to_student``: the teacher's rows for *teacher prompt + response* (verl's layout, row i
    the top-k of token i + 1) laid out on the student's sequence, as verl's padding then takes them;
    a privileged teacher outside the trainer is refused (only Skill-SD's is scored on the servers),
    and validation episodes are scored by no one."""
    import asyncio

    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
    from verl.experimental.teacher_loop.teacher_manager import _pad_teacher_outputs

    from methods.verl_backend.distill import TEACHER_PROMPT, align_to_student

    student_prompt, teacher_prompt, response = [5, 6, 7], [5, 90, 91, 92, 93, 6, 7], [11, 12, 13, 14]
    teacher = _Teacher()
    whole_ids, whole_lp = asyncio.run(teacher.compute_teacher_logprobs_single(teacher_prompt + response))
    ids, logprobs = align_to_student(whole_ids, whole_lp, len(teacher_prompt), len(student_prompt), 0)
    s, t = len(student_prompt), len(teacher_prompt)
    assert ids.shape == (s + len(response), 3) == logprobs.shape
    # the row predicting response token j sits where the student's logits predict it (position s - 1 + j)
    assert [int(ids[s - 1 + j, 0]) for j in range(len(response))] == [10 * tok for tok in response]
    torch.testing.assert_close(ids[s - 1 :], whole_ids[t - 1 :])
    torch.testing.assert_close(logprobs[s - 1 :], whole_lp[t - 1 :])
    assert not ids[: s - 1].any() and not logprobs[: s - 1].any()  # filler at the other prompt positions, never read
    padded_ids, _ = _pad_teacher_outputs(ids, logprobs, 8, 6, s, len(response), 0)
    assert padded_ids.shape == (1, 8 + 6, 3)  # verl's padding takes the aligned rows as they come
    assert padded_ids[0, 8 - 1 : 8 - 1 + len(response), 0].tolist() == [10 * tok for tok in response]

    def output():
        return AgentLoopOutput(
            prompt_ids=student_prompt, response_ids=response, response_mask=[1, 1, 0, 1], num_turns=2,
            metrics=AgentLoopMetrics(), extra_fields={TEACHER_PROMPT: teacher_prompt},
        )  # fmt: skip

    expert = _privileged_worker(teacher, {"lopd_bench": {"teacher_context": "expert"}})
    with pytest.raises(ValueError, match="teacher_in_trainer"):
        asyncio.run(expert._compute_teacher_logprobs(output(), student_prompt, response, False, {}))
    held_out = output()
    asyncio.run(expert._compute_teacher_logprobs(held_out, student_prompt, response, True, {}))
    assert "teacher_ids" not in held_out.extra_fields and TEACHER_PROMPT not in held_out.extra_fields
    assert len(teacher.calls) == 1  # the test's own call: validation episodes are not scored


def test_privileged_manager_runs_the_privileged_worker():
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ

    from methods.verl_backend.distill import PrivilegedAgentLoopManager, PrivilegedAgentLoopWorker

    manager = PrivilegedAgentLoopManager(OmegaConf.create({"actor_rollout_ref": {"rollout": {}, "model": {}}}), None)
    assert isinstance(manager, AgentLoopManagerTQ)
    assert manager.agent_loop_workers_class.__ray_actor_class__ is PrivilegedAgentLoopWorker


def test_opsd_agent_loop_gives_training_episodes_the_reference_solution_as_the_teachers_prompt():
    import asyncio

    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from methods.core.distill import expert_trace
    from methods.core.rollout import initial_prompt_ids
    from methods.verl_backend.agent_loop import TEACHER_PROMPT, EpisodeAgentLoop
    from methods.verl_backend.export import task_rows

    _, domain, encoder, tok = _domain_and_encoder("tooluse")
    trainer = OmegaConf.create(
        {
            "actor_rollout_ref": {"rollout": {"prompt_length": 2048, "response_length": 2048}},
            "lopd_bench": {"teacher_context": "expert"},
        }
    )
    conf = OmegaConf.create({"max_prompt_length": 2048})
    for split in ("train", "test"):
        task = domain.tasks(split, 1)[0]
        row = task_rows(domain, [task], split)[0]["extra_info"]
        server = _ScriptedServer(_expert_actions(encoder, domain.expert_trajectory(task)))
        loop = EpisodeAgentLoop(DictConfigWrap(trainer), server, tok, None, RLHFDataset, DictConfigWrap(conf))
        out = asyncio.run(loop.run({"temperature": 1.0}, extra_info=row))
        assert out.prompt_ids == initial_prompt_ids(encoder, domain, task, None)  # the student's prompt: GRPO's
        if split == "train":
            privileged = initial_prompt_ids(encoder, domain, task, expert_trace(domain, task))
            assert out.extra_fields[TEACHER_PROMPT] == privileged and len(privileged) > len(out.prompt_ids)
        else:
            assert TEACHER_PROMPT not in out.extra_fields  # held-out episodes train nothing
    domain.close()


def test_main_ppo_config_of_opsd_keeps_the_frozen_base_as_the_reference_model_on_the_students_gpus(tmp_path):
    """OPSD on one GPU: the EMA-teacher trainer at rate 0 (the reference model is the base policy as
    loaded), no teacher pool, the teacher reading the privileged prompt, no reward in the loss."""
    from methods.core.config import resolve_job
    from methods.verl_backend.launch import main_ppo_config, validate
    from methods.verl_backend.trainer import EMA_TRAINER

    job = resolve_job(dict(_suite_config(), profile="real-verl"), "code", "opsd")
    kw = {"model_path": tmp_path / "base", "data_dir": tmp_path, "run_dir": tmp_path}
    cfg = main_ppo_config(job, 0, **kw)
    validate(cfg)
    assert cfg.trainer.v1.trainer_mode == EMA_TRAINER and cfg.lopd_bench.teacher_in_trainer
    assert cfg.lopd_bench.ema_teacher.rate == 0.0  # frozen: never moved
    assert cfg.distillation.n_gpus_per_node == 1 and cfg.trainer.n_gpus_per_node == 1  # no pool is started (trainer)
    assert cfg.actor_rollout_ref.model.path == str(tmp_path / "base")  # the reference model: the base policy
    loss = cfg.distillation.distillation_loss
    assert loss.loss_mode == "forward_kl_topk" and not loss.use_task_rewards and not loss.use_policy_gradient
    assert cfg.actor_rollout_ref.rollout.n == 1 and cfg.data.train_batch_size == job["train"]["rollouts_per_step"]
    assert cfg.algorithm.adv_estimator == plugin.ADV_ESTIMATOR_KEEP  # single-rollout groups keep their mask
    assert cfg.lopd_bench.teacher_context == "expert"
    manager = cfg.actor_rollout_ref.rollout.agent.agent_loop_manager_class
    assert manager == "methods.verl_backend.distill.PrivilegedAgentLoopManager"
    ema = main_ppo_config(
        dict(job, method_config=dict(job["method_config"], teacher_source="ema", ema_rate=0.05)), 0, **kw
    )
    assert ema.lopd_bench.ema_teacher.rate == 0.05  # an EMA variant of OPSD takes the same path
    with pytest.raises(ValueError, match="teacher_source 'student' has no verl path"):
        main_ppo_config(dict(job, method_config=dict(job["method_config"], teacher_source="student")), 0, **kw)
    with pytest.raises(ValueError, match="divergence 'jsd' has no verl path"):
        main_ppo_config(dict(job, method_config=dict(job["method_config"], divergence="jsd")), 0, **kw)


@pytest.mark.slow  # an export and a verl config per method, in subprocesses
def test_the_verl_gpu_check_prepares_each_method_up_to_launching_verl(tmp_path):
    """benchmarks/device_check_verl.py --dry-run: the small policy, the shrunk jobs, their parquet
    files and verl-validated main_ppo configs; what a GPU machine then runs is verl itself."""
    import importlib.util

    from omegaconf import OmegaConf

    spec = importlib.util.spec_from_file_location("device_check_verl", ROOT / "benchmarks" / "device_check_verl.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    check.main(["--dry-run", "--out", str(tmp_path), "--tokenizer", str(ROOT / "results/base/small/code/model")])
    records = json.loads((tmp_path / "device_check_verl.json").read_text())
    methods = ["grpo", "opsd", "sdft", "sdpo", "skill_sd"]
    assert [r["method"] for r in records] == methods and all(r["steps"] == 2 for r in records)
    for method in methods:
        cfg = OmegaConf.load(tmp_path / method / "run" / "main_ppo.yaml")
        assert cfg.actor_rollout_ref.model.path == str((tmp_path / "model").resolve())
        assert (tmp_path / method / "data" / "train.parquet").exists()
        assert cfg.distillation.enabled == (method != "grpo")
    assert json.loads((tmp_path / "model" / "config.json").read_text())["num_hidden_layers"] == 4


@pytest.mark.slow  # 25 configs composed
def test_the_config_dump_writes_every_methods_config_on_each_profile(tmp_path):
    """benchmarks/verl_configs.py, the check that a refactor leaves the generated configs unchanged."""
    import importlib.util

    from omegaconf import OmegaConf

    from methods.verl_backend import SUPPORTED_METHODS

    spec = importlib.util.spec_from_file_location("verl_configs", ROOT / "benchmarks" / "verl_configs.py")
    dump = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dump)
    dump.main(["--out", str(tmp_path)])
    files = sorted(tmp_path.glob("*.yaml"))
    assert len(files) == 5 * len(SUPPORTED_METHODS)
    cfg = OmegaConf.load(tmp_path / "real-verl-code-opsd.yaml")
    assert cfg.trainer.experiment_name == "code-opsd-seed1" and cfg.lopd_bench.ema_teacher.rate == 0.0

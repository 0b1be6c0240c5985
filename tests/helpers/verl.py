"""Helpers shared by the verl backend's tests (test_verl_backend.py, test_verl_sdft.py,
test_verl_skill_sd.py, test_verl_sdpo.py): stand-ins in verl's layouts, small batches, and the suite's settings."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

pytest.importorskip("verl")
from tensordict import TensorDict  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.config import FSDPActorConfig, PolicyLossConfig  # noqa: E402
from verl.workers.utils.losses import ppo_loss as verl_ppo_loss  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _verl_batch(rows, seed=0, prompt=3, width=5):
    """A padded verl batch (prompts left-padded, responses right-padded) and the model output verl's
    engine would give for it: log-probs flattened over each sequence's real tokens."""
    g = torch.Generator().manual_seed(seed)
    b = len(rows)
    resp = torch.tensor([r for r, _ in rows])
    plen = torch.tensor([p for _, p in rows])
    attn = torch.zeros(b, prompt + width, dtype=torch.long)
    for i in range(b):
        attn[i, prompt - plen[i] : prompt] = 1
        attn[i, prompt : prompt + resp[i]] = 1
    logp = -torch.rand(b, width, generator=g) * 2
    flat = []
    for i in range(b):  # the model's output at position t scores token t + 1
        seq = torch.zeros(int(plen[i] + resp[i]))
        seq[int(plen[i]) - 1 : int(plen[i]) - 1 + int(resp[i])] = logp[i, : resp[i]]
        flat.append(seq)
    data = TensorDict(
        {
            "prompts": torch.ones(b, prompt, dtype=torch.long),
            "responses": torch.ones(b, width, dtype=torch.long),
            "attention_mask": attn,
            "response_mask": attn[:, prompt:].clone(),
            "old_log_probs": logp + 0.3 * torch.randn(b, width, generator=g),
            "advantages": torch.randn(b, 1, generator=g).expand(b, width).clone(),
        },
        batch_size=[b],
    )
    return torch.cat(flat), logp, data


def _config(mode, agg="token-mean", **kw):
    return FSDPActorConfig(
        strategy="fsdp",
        ppo_mini_batch_size=4,
        ppo_micro_batch_size_per_gpu=2,
        use_dynamic_bsz=False,
        rollout_n=1,
        loss_agg_mode=agg,
        policy_loss=PolicyLossConfig(loss_mode=mode),
        **kw,
    )


def _loss(mode, agg, flat, data, **info):
    tu.assign_non_tensor(
        data,
        dp_size=info.get("dp_size", 1),
        batch_num_tokens=info.get("batch_num_tokens"),
        global_batch_size=info.get("global_batch_size"),
    )
    flat = flat.clone().requires_grad_()
    loss, metrics = verl_ppo_loss(
        _config(mode, agg, clip_ratio_low=0.2, clip_ratio_high=0.28), {"log_probs": flat}, data
    )
    loss.backward()
    return loss.detach(), flat.grad, metrics


ROWS = [(5, 3), (2, 1), (4, 2), (1, 3)]


def _teacher_rows(teacher, rows=ROWS):
    """Teacher log-probs in verl's layout: one ``[sequence, 1]`` row per sample, the response's at the
    positions that predict its tokens."""
    per_sequence = [torch.cat([torch.zeros(p - 1), teacher[i, :r], torch.zeros(1)]) for i, (r, p) in enumerate(rows)]
    return torch.nested.as_nested_tensor([x.unsqueeze(-1) for x in per_sequence], layout=torch.jagged)


class _ScriptedServer:
    """A stand-in for verl's generation server: returns the scripted actions in turn."""

    def __init__(self, actions, log_probs=True):
        self.actions, self.log_probs, self.calls = list(actions), log_probs, []

    async def generate(self, request_id, prompt_ids, sampling_params, **_):
        from verl.workers.rollout.replica import TokenOutput

        self.calls.append((list(prompt_ids), dict(sampling_params)))
        ids = self.actions.pop(0)
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids) if self.log_probs else None)


def _domain_and_encoder(name):
    from transformers import AutoTokenizer

    from methods.core.config import resolve_job
    from methods.core.tokenizer import ChatEncoder
    from tasks.base import get_domain

    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    job = resolve_job(dict(cfg, profile="small"), name, "grpo")
    tok = AutoTokenizer.from_pretrained(ROOT / "results" / "base" / "small" / name / "model")
    return job, get_domain(name, seed=job["task_seed"], **job["domain_options"]), ChatEncoder(tok), tok


def _expert_actions(encoder, expert):
    return [encoder.encode(t.action) + [encoder.eos_id] for t in expert.turns]


def _fake_verl_run(tmp_path, steps, val_steps, n_val=8, seed=0, extra=None):
    """The two records a verl run leaves: its file logger's lines (written by verl's own FileLogger)
    and its validation dumps (``<step>.jsonl``, the lines of ``RayPPOTrainer._write_generations``).
    ``extra(step)`` adds a method's own metrics to a step's line."""
    import os

    from verl.utils.tracking import FileLogger

    rng = np.random.default_rng(seed)
    log = tmp_path / "verl.jsonl"
    os.environ["VERL_FILE_LOGGER_PATH"] = str(log)
    try:
        logger = FileLogger("p", "e")
        for step in range(1, steps + 1):
            logger.log(
                {
                    "critic/score/mean": float(rng.random()),
                    "actor/pg_loss": float(rng.normal()),
                    "actor/grad_norm": 0.5,
                    "response_length/mean": 40.0,
                    "timing_s/step": 2.0,
                    **(extra(step) if extra else {}),
                },
                step,
            )
            if step in val_steps:
                logger.log({"val-core/lopd_bench/code/reward/mean@1": 0.5}, step)
        logger.finish()
    finally:
        del os.environ["VERL_FILE_LOGGER_PATH"]
    val = tmp_path / "val"
    val.mkdir()
    scores = {}
    for step in [0, *val_steps]:
        scores[step] = [float(x) for x in rng.integers(0, 2, n_val)]
        (val / f"{step}.jsonl").write_text(
            "".join(
                json.dumps({"input": "p", "output": "o", "gts": "g", "score": s, "step": step}) + "\n"
                for s in scores[step]
            )
        )
    return log, val, scores


def _suite_config():
    return yaml.safe_load((ROOT / "config" / "config.yaml").read_text())


def _train_rows(domain, n=3):
    from methods.verl_backend.export import task_rows

    tasks = domain.tasks("train")
    return [row["extra_info"] for row in task_rows(domain, tasks, "train")[:n]], tasks[:n]


@contextlib.contextmanager
def _stubbed_verl_step(monkeypatch):
    """A local Ray cluster, with verl's own step, checkpoint and initialisation stubbed (they need GPUs
    and servers): what the suite's trainers add around them runs for real."""
    import ray
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    monkeypatch.setattr(PPOTrainerSync, "on_init_end", lambda self: None)
    monkeypatch.setattr(PPOTrainerSync, "step", lambda self, metrics, timing: "batch")
    monkeypatch.setattr(PPOTrainerSync, "_save_checkpoint", lambda self: None)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def _check_resume(trainer, cfg, size, missing):
    """After ``trainer`` saved step 1's checkpoint: a resumed trainer loads the service's state saved
    there, and refuses a checkpoint without it (message ``missing``)."""
    import ray

    from methods.verl_backend.trainer import checkpoint_dir

    assert (Path(checkpoint_dir(cfg, 1)) / type(trainer).FILE).exists()
    ray.kill(trainer.service)
    resumed = type(trainer)(cfg)
    resumed.global_steps = 1
    resumed.on_init_end()
    assert ray.get(resumed.service.size.remote()) == size
    resumed.global_steps = 2
    with pytest.raises(FileNotFoundError, match=missing):
        resumed.on_init_end()


class _Teacher:
    """A stand-in for verl's teacher server manager, in its layout: row ``i`` holds the top-k of the
    token at ``i + 1`` (here ids ``10 * that token + j`` and log-probs from its position), and a
    dummy last row (``extract_prompt_logprobs``), so that a row shows which token it predicts."""

    def __init__(self, k=3):
        self.k, self.calls = k, []

    async def compute_teacher_logprobs_single(self, sequence_ids, **_):
        self.calls.append(list(sequence_ids))
        nxt = list(sequence_ids[1:])
        ids = torch.tensor([[tok * 10 + j for j in range(self.k)] for tok in nxt] + [[0] * self.k], dtype=torch.int32)
        logprobs = torch.tensor(
            [[-(i + 1) / 100 - j / 10 for j in range(self.k)] for i in range(len(nxt))] + [[0.0] * self.k]
        )
        return ids, logprobs


def _privileged_worker(teacher, config=None):
    from omegaconf import OmegaConf

    from methods.verl_backend.distill import PrivilegedAgentLoopWorker

    worker = object.__new__(PrivilegedAgentLoopWorker)  # verl's own __init__ needs servers; the method needs these
    worker.distillation_enabled, worker.teacher_key, worker.teacher_server_manager = True, "data_source", teacher
    worker.config = OmegaConf.create(config or {})
    worker.tokenizer = type("Tok", (), {"pad_token_id": 0})()
    return worker


# --------------------------------------------------------------------------- the EMA teacher's trainer
def _tiny_lm(seed: int, vocab: int = 48):
    """A two-layer Qwen2 of width 16, random weights (the architecture the small profile uses)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=1024, tie_word_embeddings=False,
    )  # fmt: skip
    return Qwen2ForCausalLM(config).eval()


class _Engine:
    """What the worker reads of verl's FSDP engine: its module and its eval-mode context."""

    def __init__(self, module):
        self.module = module
        self.forwards = 0
        module.register_forward_hook(lambda *_: setattr(self, "forwards", self.forwards + 1))

    def eval_mode(self, **kwargs):
        return contextlib.nullcontext()


def _fsdp(model, version: int, use_orig_params: bool = False):
    """verl's FSDP layout: each decoder layer a unit, the root (embeddings, norm, head) another;
    FSDP1 (verl's default strategy, ``fsdp``) as verl wraps it (full shard, flat parameters unless
    ``use_orig_params``), or FSDP2 (``fsdp2``)."""
    if version == 2:
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        return model
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    return FullyShardedDataParallel(
        model, auto_wrap_policy=ModuleWrapPolicy({type(model.model.layers[0])}), device_id=torch.device("cpu"),
        sharding_strategy=ShardingStrategy.FULL_SHARD, use_orig_params=use_orig_params,
    )  # fmt: skip


def _worker(student, teacher, rank=0, world_size=1):
    """verl's actor worker with an EMA teacher (:class:`methods.verl_backend.ema.EMATeacherWorker`) on
    plain modules: verl's own ``__init__`` needs a process group and GPUs."""
    from types import SimpleNamespace

    from methods.verl_backend.ema import EMATeacherWorker

    worker = object.__new__(EMATeacherWorker)
    worker._rank, worker._world_size = rank, world_size
    worker.actor = SimpleNamespace(engine=_Engine(student))
    worker.ref = SimpleNamespace(engine=_Engine(teacher))
    return worker


class _FakeTQ:
    """TransferQueue's key-value calls on one partition, holding what verl's agent loop puts there
    (``list_of_dict_to_tensordict`` of the episodes' fields)."""

    def __init__(self, fields):
        from verl.utils.tensordict_utils import list_of_dict_to_tensordict

        self.data = list_of_dict_to_tensordict(fields)
        self.put = None

    def kv_batch_get(self, keys, partition_id, select_fields):
        assert len(keys) == len(self.data)
        return self.data.select(*select_fields)

    def kv_batch_put(self, keys, partition_id, fields):
        assert len(keys) == len(self.data)
        self.put = fields


class _WorkerGroup:
    """The ONE_TO_ALL dispatch of verl's worker group: each call on every rank, results as a list."""

    def __init__(self, workers, calls=None):
        self.workers = workers
        self.calls = [] if calls is None else calls

    def __getattr__(self, name):
        def call(*args):
            self.calls.append(name)
            return [getattr(w, name)(*args) for w in self.workers]

        return call

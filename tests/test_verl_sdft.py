"""SDFT on the verl backend, on CPU: the EMA update against the suite's teacher, the worker's calls on
plain modules (verl's FSDP engine needs GPUs), the agent loop leaving the teacher to the trainer,
the trainer's teacher rows on the student's layout, its update and checkpoint order, and the
generated config (verl 0.9.1, installed --no-deps)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

pytest.importorskip("verl")

from methods.verl_backend import plugin  # noqa: E402
from tests.helpers.verl import (  # noqa: E402
    _FakeTQ,
    _fsdp,
    _privileged_worker,
    _suite_config,
    _tiny_lm,
    _worker,
    _WorkerGroup,
)

VOCAB = 48


def _sdft_job(method="sdft"):
    """The real-verl profile's job of SDFT, or of OPSD (the same trainer with its teacher frozen)."""
    from methods.core.config import resolve_job

    return resolve_job(dict(_suite_config(), profile="real-verl"), "code", method)


#: the methods of the EMA-teacher trainer: SDFT (an EMA of the student) and OPSD (the frozen base, rate 0)
EMA_METHODS = ["sdft", "opsd"]


# --------------------------------------------------------------------------- the EMA
def test_ema_update_is_the_suites_ema_teacher_update():
    """Three steps of a moving student: the worker's shard-by-shard update leaves the teacher exactly
    where the suite's :meth:`Teacher.update` (``torch._foreach_lerp_`` over the parameters) does."""
    from methods.core.teacher import Teacher
    from methods.verl_backend.ema import ema_update_

    student, ours, suites = _tiny_lm(0), _tiny_lm(1), _tiny_lm(1)
    rate = 0.01
    suite = object.__new__(Teacher)  # the suite's EMA teacher, on these models (its __init__ needs a run)
    suite.source, suite.ema_rate, suite._model, suite.run = "ema", rate, suites, SimpleNamespace(model=student)
    for _ in range(3):
        with torch.no_grad():
            for p in student.parameters():
                p.add_(torch.randn_like(p) * 0.1)
        n = ema_update_(ours.named_parameters(), student.named_parameters(), rate)
        suite.update()
        assert n == sum(p.numel() for p in student.parameters())
    for (name, a), b in zip(ours.named_parameters(), suites.parameters()):
        assert torch.equal(a, b), name
    moved = next(ours.parameters()) - next(_tiny_lm(1).parameters())
    assert moved.abs().max() > 0  # it did move


def test_ema_update_refuses_a_half_precision_teacher_and_unlike_shards():
    from methods.verl_backend.ema import ema_update_

    t = [("w", torch.zeros(4))]
    with pytest.raises(ValueError, match="must be fp32"):
        ema_update_([("w", torch.zeros(4, dtype=torch.bfloat16))], t, 0.01)
    with pytest.raises(ValueError, match="teacher shard"):
        ema_update_([("w", torch.zeros(3))], t, 0.01)
    with pytest.raises(ValueError, match="names or order"):
        ema_update_([("v", torch.zeros(4))], t, 0.01)
    with pytest.raises(ValueError, match=r"rate in \(0, 1\]"):
        ema_update_(t, t, 0.0)


# --------------------------------------------------------------------------- the worker
def test_top_k_rows_in_chunks_are_the_rows_at_once():
    from methods.verl_backend.ema import topk_rows

    logits = torch.randn(50, VOCAB)
    whole = topk_rows(logits, 7, 6, 0.7, chunk=1 << 20)
    for chunk in (1, 8, 43):
        parts = topk_rows(logits, 7, 6, 0.7, chunk=chunk)
        assert torch.equal(parts[0], whole[0]) and torch.equal(parts[1], whole[1])
    assert whole[0].shape == (43, 6)


def test_worker_moves_its_teacher_shards_toward_its_actor_shards():
    student, teacher = _tiny_lm(0), _tiny_lm(1)
    expected = [t + 0.5 * (s - t) for t, s in zip(teacher.parameters(), student.parameters())]
    worker = _worker(student, teacher)
    assert worker.ema_update(0.5) == sum(p.numel() for p in teacher.parameters())
    for a, b in zip(teacher.parameters(), expected):
        assert torch.allclose(a, b)


@pytest.mark.parametrize("temperature,max_tokens", [(1.0, 1), (0.8, 1), (0.8, 20), (0.8, 10_000)])
def test_worker_teacher_rows_are_the_tempered_top_k_at_the_response_tokens(temperature, max_tokens):
    """Row j of a sequence is the teacher's distribution (logits / T) over the token after position
    ``start + j``, i.e. ``log_softmax(logits[start + j] / T)``'s top-k, whether the sequence is
    scored alone or right-padded in a micro-batch; every rank of an uneven split makes as many
    forwards as the others."""
    from methods.verl_backend.ema import micro_batches

    teacher = _tiny_lm(3)
    sequences = [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10], [11, 12, 13, 14, 15], [16, 17, 18, 19, 20, 21, 22], [23, 24, 25]]
    starts = [2, 1, 3, 4, 1]
    ranks = [_worker(_tiny_lm(0), copy.deepcopy(teacher), rank=r, world_size=3) for r in range(3)]
    freed = []
    for w in ranks:  # as an FSDP2 module: the gathered weights are freed before and after the forwards
        w.ref.engine.module.reshard = lambda: freed.append(1)
    parts = [w.teacher_topk(sequences, starts, 5, temperature, max_tokens) for w in ranks]
    assert len(freed) == 2 * len(ranks)
    assert [sorted(p) for p in parts] == [[0, 3], [1, 4], [2]]
    most = max(len(micro_batches([len(x) for x in sequences], r, 3, max_tokens)) for r in range(3))
    assert most == (2 if max_tokens < 20 else 1)
    assert {w.ref.engine.forwards for w in ranks} == {most}  # lockstep forwards: FSDP gathers collectively
    for i, (seq, start) in enumerate(zip(sequences, starts)):
        owner = parts[i % 3][i]
        with torch.no_grad():
            full = torch.log_softmax(teacher(torch.tensor([seq])).logits[0] / temperature, dim=-1)
        lp, ids = full[start:].topk(5, dim=-1)
        assert owner[0].dtype == torch.int32 and owner[0].shape == (len(seq) - start, 5)
        assert torch.equal(owner[0], ids.int()) and torch.allclose(owner[1], lp, atol=1e-5)


def test_micro_batches_take_each_ranks_share_shortest_first_within_the_padded_budget():
    from methods.verl_backend.ema import micro_batches

    lengths = [4, 9, 3, 3, 30, 2, 5, 5]
    assert micro_batches(lengths, 0, 2, 12) == [[2, 0], [6], [4]]  # shortest first: 2 x 4; 5; 30 alone
    assert micro_batches(lengths, 1, 2, 12) == [[5, 3], [7], [1]]  # 2 x 3; 5 (3 rows of 5 > 12); 9
    assert micro_batches(lengths, 0, 1, 10**6) == [[5, 2, 3, 0, 6, 7, 1, 4]]
    assert micro_batches([], 0, 4, 10) == []


def test_reshard_root_frees_the_gathered_root_weights_of_either_fsdp():
    from methods.verl_backend.ema import reshard_root

    calls = []
    initialised = SimpleNamespace(_local_shard=torch.zeros(1))
    sharded = SimpleNamespace(
        _handle=SimpleNamespace(uses_sharded_strategy=True, reshard=calls.append, flat_param=initialised)
    )
    reshard_root(sharded)  # FSDP1, sharded: free them
    lazy = SimpleNamespace(
        uses_sharded_strategy=True, reshard=calls.append, flat_param=torch.nn.Parameter(torch.zeros(1))
    )
    reshard_root(SimpleNamespace(_handle=lazy))  # not yet run: nothing gathered, nothing to free
    reshard_root(
        SimpleNamespace(
            _handle=SimpleNamespace(uses_sharded_strategy=False, reshard=calls.append, flat_param=initialised)
        )
    )
    reshard_root(SimpleNamespace(reshard=lambda: calls.append("fsdp2")))
    reshard_root(torch.nn.Linear(2, 2))  # a plain module: nothing
    assert calls == [True, "fsdp2"]


def test_worker_refuses_a_forward_that_ignores_logits_to_keep():
    teacher = _tiny_lm(3)
    forward = teacher.forward
    teacher.forward = lambda **kw: forward(**{**kw, "logits_to_keep": 0})  # all positions, as some of verl's
    with pytest.raises(RuntimeError, match="not the last"):
        _worker(_tiny_lm(0), teacher).teacher_topk([[1, 2, 3, 4]], [1], 4, 1.0)


def test_worker_saves_and_loads_its_teacher_shards(tmp_path):
    from methods.verl_backend.ema import shard_file

    worker = _worker(_tiny_lm(0), _tiny_lm(1))
    worker.ema_update(0.3)
    saved = {n: p.detach().clone() for n, p in worker.ref.engine.module.named_parameters()}
    worker.save_teacher(str(tmp_path))
    assert (tmp_path / "teacher_rank0_of1.pt").exists() and shard_file(str(tmp_path), 0, 1).endswith("rank0_of1.pt")
    fresh = _worker(_tiny_lm(0), _tiny_lm(2))
    fresh.load_teacher(str(tmp_path))
    for name, p in fresh.ref.engine.module.named_parameters():
        assert torch.equal(p, saved[name]), name
    with pytest.raises(FileNotFoundError, match="rank 1 of 2"):
        _worker(_tiny_lm(0), _tiny_lm(1), rank=1, world_size=2).load_teacher(str(tmp_path))
    other = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="not this model's"):
        _worker(other, torch.nn.Linear(2, 2)).load_teacher(str(tmp_path))


# --------------------------------------------------------------------------- the agent loop
def test_sdft_agent_loop_leaves_the_teacher_prompt_to_the_trainer():
    import asyncio

    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

    from methods.verl_backend.distill import TEACHER_PROMPT

    class Servers:  # any call to the teacher servers fails the test
        def __getattr__(self, name):
            raise AssertionError(f"the teacher servers were used ({name})")

    for validate in (False, True):
        out = AgentLoopOutput(
            prompt_ids=[5, 6], response_ids=[7, 8], response_mask=[1, 1], num_turns=2,
            metrics=AgentLoopMetrics(), extra_fields={TEACHER_PROMPT: [5, 9, 6]},
        )  # fmt: skip
        worker = _privileged_worker(
            Servers(), {"lopd_bench": {"teacher_context": "expert", "teacher_in_trainer": True}}
        )
        if validate:  # held-out episodes: verl's own path, which scores nothing without a teacher
            worker.distillation_enabled = False
        asyncio.run(worker._compute_teacher_logprobs(out, [5, 6], [7, 8], validate, {}))
        assert "teacher_ids" not in out.extra_fields
        assert out.extra_fields.get(TEACHER_PROMPT) == (None if validate else [5, 9, 6])


# --------------------------------------------------------------------------- the trainer
def _trainer(tmp_path, monkeypatch, method="sdft"):
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from methods.verl_backend.launch import main_ppo_config
    from methods.verl_backend.trainer import EMATeacherTrainer

    cfg = main_ppo_config(_sdft_job(method), 0, model_path="m", data_dir=tmp_path, run_dir=tmp_path)
    cfg.lopd_bench.ema_teacher.max_len = 12
    monkeypatch.setattr(PPOTrainerSync, "on_init_end", lambda self: None)
    monkeypatch.setattr(PPOTrainerSync, "_save_checkpoint", lambda self: self.order.append("verl"))
    monkeypatch.setattr(
        PPOTrainerSync, "_update_actor", lambda self, batch, metrics: self.order.append("update") or batch
    )
    trainer = EMATeacherTrainer(cfg)
    trainer.order = []
    trainer.tokenizer = SimpleNamespace(pad_token_id=0)
    return trainer, cfg


@pytest.mark.parametrize("method", EMA_METHODS)
def test_ema_trainer_plans_the_hybrid_worker_with_its_teacher_and_no_teacher_pool(tmp_path, monkeypatch, method):
    from verl.trainer.ppo.v1.trainer_base import Role

    trainer, cfg = _trainer(tmp_path, monkeypatch, method)
    assert trainer.trainer_mode == "sync" and trainer.use_reference_policy and not trainer.use_teacher_policy
    trainer._init_resource_pool_mgr()  # verl's plan of GPU pools, without starting them
    assert "teacher_pool" not in trainer.resource_pool_manager.resource_pool_spec and cfg.distillation.enabled
    assert set(trainer.role_worker_mapping) == {Role.ActorRolloutRef}  # the reference model is built: the teacher
    assert trainer.resource_pool_manager.mapping[Role.ActorRolloutRef] == "global_pool"
    assert "EMATeacherWorker" in repr(trainer.role_worker_mapping[Role.ActorRolloutRef])


@pytest.mark.parametrize("method", EMA_METHODS)
def test_ema_trainer_writes_the_teachers_rows_on_the_students_layout(tmp_path, monkeypatch, method):
    """The rows verl's loss reads for a student's response token, at the student's position, are the
    EMA teacher's tempered top-k for that token after the *teacher's* prompt; a rollout whose teacher
    sequence would not fit the teacher's positions is scored after the student's own prompt."""
    import transfer_queue

    from methods.verl_backend.distill import TEACHER_PROMPT

    trainer, cfg = _trainer(tmp_path, monkeypatch, method)
    teacher = _tiny_lm(5)
    trainer.actor_rollout_wg = _WorkerGroup([_worker(_tiny_lm(0), teacher, rank=r, world_size=2) for r in range(2)])
    episodes = [  # (student prompt, teacher prompt, response)
        ([1, 2, 3], [1, 30, 31, 2, 3], [4, 5, 6]),
        ([1, 2], [1, 32, 2], [7, 8, 9, 10]),
        ([1, 2, 3], [1, 30, 31, 33, 34, 35, 2, 3], [11, 12, 13]),  # 8 + 3 = 11 <= max_len 12: fits
        ([1, 2], [1, 30, 31, 33, 34, 35, 36, 37, 2], [14, 15, 16, 17]),  # 9 + 4 = 13 > 12: the student's prompt
    ]
    tq = _FakeTQ([
        {"prompts": torch.tensor(p), "responses": torch.tensor(r), "extra_fields": {TEACHER_PROMPT: t}}
        for p, t, r in episodes + episodes[:1]
    ])  # fmt: skip
    monkeypatch.setattr(transfer_queue, "kv_batch_get", tq.kv_batch_get)
    monkeypatch.setattr(transfer_queue, "kv_batch_put", tq.kv_batch_put)
    tags = [{"status": "success"}] * 4 + [{"status": "success", "is_padding": True}]
    batch = SimpleNamespace(keys=[f"k{i}" for i in range(5)], partition_id="train", tags=tags)
    metrics = {}
    assert trainer._compute_ref_log_prob(batch, metrics) is batch
    assert metrics == {"teacher/signal_share": 0.75}  # verl's padding row (a privileged copy) not counted
    T, k = cfg.actor_rollout_ref.rollout.temperature, cfg.lopd_bench.ema_teacher.topk
    assert k == 32 < VOCAB and T == 0.8
    ids, logprobs = tq.put["teacher_ids"].unbind(), tq.put["teacher_logprobs"].unbind()
    for n, (prompt, teacher_prompt, response) in enumerate(episodes):
        head = teacher_prompt if len(teacher_prompt) + len(response) <= 12 else prompt
        assert ids[n].shape == logprobs[n].shape == (len(prompt) + len(response), k)  # the student's sequence
        with torch.no_grad():
            full = torch.log_softmax(teacher(torch.tensor([head + response])).logits[0] / T, dim=-1)
        for j in range(len(response)):  # the student's logits at len(prompt) - 1 + j predict response[j]
            lp, top = full[len(head) - 1 + j].topk(k)
            assert torch.equal(ids[n][len(prompt) - 1 + j], top.int())
            assert torch.allclose(logprobs[n][len(prompt) - 1 + j], lp, atol=1e-6)


def test_ema_trainer_moves_the_teacher_after_the_update_and_saves_it_before_verls_checkpoint(tmp_path, monkeypatch):
    from methods.verl_backend.trainer import EMA_TEACHER_DIR, checkpoint_dir

    trainer, cfg = _trainer(tmp_path, monkeypatch)
    student, teacher = _tiny_lm(0), _tiny_lm(1)
    before = [p.detach().clone() for p in teacher.parameters()]
    trainer.actor_rollout_wg = _WorkerGroup([_worker(student, teacher)], calls=trainer.order)
    trainer.global_steps = 0
    trainer.on_init_end()
    assert trainer.order == ["check_teacher"]  # the shards pair up, before any rollout
    del trainer.order[:]
    trainer._update_actor("batch", {})
    assert trainer.order == ["update", "ema_update"]  # after the student's update
    rate = cfg.lopd_bench.ema_teacher.rate
    assert rate == 0.01
    for p, b, s in zip(teacher.parameters(), before, student.parameters()):
        assert torch.allclose(p, b + rate * (s - b), atol=1e-7)
    trainer.global_steps = 1
    trainer._save_checkpoint()
    folder = tmp_path / "checkpoints" / "global_step_1" / EMA_TEACHER_DIR
    assert trainer.order == ["update", "ema_update", "save_teacher", "verl"]  # verl marks it complete last
    assert str(folder) == trainer.teacher_folder(1) and folder.is_dir()
    assert checkpoint_dir(cfg, 1) == str(folder.parent)
    # resumed: the saved average, not the base model
    resumed = _WorkerGroup([_worker(_tiny_lm(0), _tiny_lm(7))])
    trainer.actor_rollout_wg = resumed
    trainer.on_init_end()
    for a, b in zip(resumed.workers[0].ref.engine.module.parameters(), teacher.parameters()):
        assert torch.equal(a, b)
    trainer.global_steps = 2
    with pytest.raises(FileNotFoundError, match="no EMA teacher"):
        trainer.on_init_end()


def test_opsd_trainer_keeps_its_frozen_teacher_unmoved_and_unsaved(tmp_path, monkeypatch):
    """OPSD on the EMA-teacher trainer: rate 0, so no update after the student's and no copy in the
    checkpoint; a resumed run's teacher is the reference model as verl loads it (the base policy)."""
    from methods.verl_backend.trainer import EMA_TEACHER_DIR

    trainer, cfg = _trainer(tmp_path, monkeypatch, "opsd")
    assert cfg.lopd_bench.ema_teacher.rate == 0.0 and trainer.frozen
    student, teacher = _tiny_lm(0), _tiny_lm(1)
    before = [p.detach().clone() for p in teacher.parameters()]
    trainer.actor_rollout_wg = _WorkerGroup([_worker(student, teacher)], calls=trainer.order)
    trainer.global_steps = 0
    trainer.on_init_end()
    trainer._update_actor("batch", {})
    assert trainer.order == ["check_teacher", "update"]
    assert all(torch.equal(p, b) for p, b in zip(teacher.parameters(), before))
    trainer.global_steps = 1
    trainer._save_checkpoint()
    assert trainer.order[-1] == "verl" and "save_teacher" not in trainer.order
    assert not (tmp_path / "checkpoints" / "global_step_1" / EMA_TEACHER_DIR).exists()
    trainer.global_steps = 2
    trainer.on_init_end()  # resumed: nothing of its own to load
    assert "load_teacher" not in trainer.order


# --------------------------------------------------------------------------- the config
def test_main_ppo_config_of_sdft_distils_from_an_ema_teacher_in_the_actor_workers(tmp_path):
    from methods.verl_backend.launch import main_ppo_config, validate
    from methods.verl_backend.trainer import EMA_TRAINER

    job = _sdft_job()
    kw = {"model_path": tmp_path / "base", "data_dir": tmp_path, "run_dir": tmp_path}
    cfg = main_ppo_config(job, 0, **kw)
    validate(cfg)
    assert cfg.trainer.v1.trainer_mode == EMA_TRAINER and cfg.lopd_bench.teacher_in_trainer
    assert cfg.lopd_bench.teacher_context == "expert"  # OPSD's demonstration
    loss = cfg.distillation.distillation_loss
    assert loss.loss_mode == "forward_kl_topk" and not loss.use_task_rewards and not loss.use_policy_gradient
    assert cfg.actor_rollout_ref.ref.fsdp_config.model_dtype == "fp32"
    ema = cfg.lopd_bench.ema_teacher
    assert ema.rate == job["method_config"]["ema_rate"] == 0.01 and ema.topk == loss.topk
    # verl builds the reference model (the teacher) from its own section: its validation, asked as for a
    # run with a reference model, needs the micro-batch size that ActorRolloutRefWorker.init_model reads
    assert cfg.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu == 1
    assert not cfg.actor_rollout_ref.actor.use_kl_loss and not cfg.algorithm.use_kl_in_reward  # no KL to it
    assert cfg.algorithm.adv_estimator == plugin.ADV_ESTIMATOR_KEEP
    manager = cfg.actor_rollout_ref.rollout.agent.agent_loop_manager_class
    assert manager == "methods.verl_backend.distill.PrivilegedAgentLoopManager"
    with pytest.raises(ValueError, match="teacher_source 'student' has no verl path"):
        main_ppo_config(dict(job, method_config=dict(job["method_config"], teacher_source="student")), 0, **kw)
    with pytest.raises(ValueError, match="divergence 'jsd' has no verl path"):
        main_ppo_config(dict(job, method_config=dict(job["method_config"], divergence="jsd")), 0, **kw)


def test_ema_trainer_refuses_settings_that_break_its_teacher(tmp_path, monkeypatch):
    from methods.verl_backend.launch import main_ppo_config
    from methods.verl_backend.trainer import EMATeacherTrainer

    base = main_ppo_config(_sdft_job(), 0, model_path="m", data_dir=tmp_path, run_dir=tmp_path)
    for key, value, message in [
        ("actor_rollout_ref.actor.ulysses_sequence_parallel_size", 2, "ulysses_sequence_parallel_size"),
        ("actor_rollout_ref.model.use_fused_kernels", True, "use_fused_kernels"),
        ("actor_rollout_ref.model.lora.rank", 8, "LoRA"),
        ("actor_rollout_ref.ref.fsdp_config.fsdp_size", 2, "fsdp_config.fsdp_size differs"),
        ("actor_rollout_ref.ref.ulysses_sequence_parallel_size", 2, "ulysses_sequence_parallel_size"),
        ("actor_rollout_ref.ref.strategy", "fsdp2", "strategy differs"),
        ("actor_rollout_ref.ref.fsdp_config.reshard_after_forward", False, "reshard_after_forward false"),
    ]:
        cfg = base.copy()
        OmegaConf.update(cfg, key, value, merge=False)
        with pytest.raises(ValueError, match=message):
            EMATeacherTrainer(cfg)


# --------------------------------------------------------------------------- on real FSDP2 shards
def _two_rank_ema(rank, world_size, init_file, out_dir, version, rate=0.5):
    """One rank of :func:`test_ema_teacher_on_fsdp_shards_of_two_cpu_processes` (run by
    ``torch.multiprocessing.spawn``): the worker's own calls on FSDP-sharded actor and teacher."""
    import json

    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        worker = _worker(_fsdp(_tiny_lm(0), version), _fsdp(_tiny_lm(1), version), rank=rank, world_size=world_size)
        sequences, starts = [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10], [11, 12, 13]], [2, 1, 1]
        checked = worker.check_teacher()  # before any forward (FSDP1 not yet lazily initialised)
        first = worker.teacher_topk(sequences, starts, 4, 0.8, 64)
        with torch.no_grad():  # forwards outside the worker's calls (verl's log-prob pass on the actor is one):
            for module in (worker.actor.engine.module, worker.ref.engine.module):  # the roots keep their gathered
                module(torch.tensor([[1, 2, 3]]))  # weights after them
        moved = worker.ema_update(rate) if rate else None  # OPSD's trainer never moves its teacher
        after = worker.teacher_topk(sequences, starts, 4, 0.8, 64)
        worker.save_teacher(str(out_dir / "teacher"))
        fresh = _worker(_fsdp(_tiny_lm(0), version), _fsdp(_tiny_lm(2), version), rank=rank, world_size=world_size)
        fresh.load_teacher(str(out_dir / "teacher"))
        reloaded = fresh.teacher_topk(sequences, starts, 4, 0.8, 64)
        rows = {
            name: {i: [ids.tolist(), lp.tolist()] for i, (ids, lp) in part.items()}
            for name, part in (("first", first), ("after", after), ("reloaded", reloaded))
        }
        (out_dir / f"rank{rank}.json").write_text(json.dumps({"checked": checked, "moved": moved, "rows": rows}))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two processes on a gloo group
@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("method,rate", [("sdft", 0.5), ("opsd", 0.0)])
def test_ema_teacher_on_fsdp_shards_of_two_cpu_processes(tmp_path, version, method, rate):
    """The worker's calls on FSDP1 and FSDP2 models laid out as verl's engine lays them out, across two
    ranks: the pairing check passes on models not yet run, each rank updates only its own share of the
    weights, and the teacher then scores exactly as the unsharded suite EMA of the two models does,
    before and after a save and load (FSDP1 would reuse the root's stale gathered weights without
    :func:`reshard_root`; FSDP2's root keeps its gathered copies after a forward)."""
    import json

    import torch.multiprocessing as mp

    from methods.core.teacher import Teacher

    mp.spawn(_two_rank_ema, args=(2, str(tmp_path / "init"), tmp_path, version, rate), nprocs=2)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    total = sum(p.numel() for p in _tiny_lm(1).parameters())
    assert sum(r["checked"] for r in ranks) == total and 0 < ranks[0]["checked"] < total  # a shard each, paired
    if rate:  # each rank moved exactly its own share
        assert [r["moved"] for r in ranks] == [r["checked"] for r in ranks]
    student, teacher = _tiny_lm(0), _tiny_lm(1)
    suite = object.__new__(Teacher)
    source = "ema" if rate else "frozen"  # the suite's Teacher of SDFT, and of OPSD
    suite.source, suite.ema_rate, suite._model, suite.run = source, rate, teacher, SimpleNamespace(model=student)
    sequences, starts = [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10], [11, 12, 13]], [2, 1, 1]

    def expected(model):
        with torch.no_grad():
            return [
                torch.log_softmax(model(torch.tensor([seq])).logits[0] / 0.8, dim=-1)[start:].topk(4, dim=-1)
                for seq, start in zip(sequences, starts)
            ]

    def check(name, want):
        for i, (lp, ids) in enumerate(want):
            got_ids, got_lp = ranks[i % 2]["rows"][name][str(i)]
            assert got_ids == ids.tolist() and torch.allclose(torch.tensor(got_lp), lp, atol=1e-5), (name, i)

    check("first", expected(teacher))
    suite.update()
    check("after", expected(teacher))
    check("reloaded", expected(teacher))


def test_metrics_adapter_carries_sdfts_signal_share_under_the_suites_name(tmp_path):
    import json

    from methods.verl_backend.metrics import write_run_files
    from tests.helpers.verl import _fake_verl_run

    job = _sdft_job()
    job = dict(job, train=dict(job["train"], rollout_budget=128, rollouts_per_step=64, eval_every=64))
    log, val, _ = _fake_verl_run(
        tmp_path, steps=2, val_steps=[1, 2], extra=lambda step: {"teacher/signal_share": 0.25 * step}
    )
    write_run_files(job, "sdft", 0, log, val, tmp_path / "run")
    train = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["signal_share"] for r in train if r["kind"] == "train"] == [0.25, 0.5]  # as the suite's SDFT logs it

"""SDPO on the verl backend, on CPU: the suite's top-k + tail reverse KL as a verl distillation loss (in
verl's own logits processor and final loss, with rollouts that carry no signal), the agent loop's
episode records, the trainer's group contexts and teacher rows against the suite's SDPO on the same
episodes, and the generated config (verl 0.9.1, installed --no-deps)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("verl")
from omegaconf import OmegaConf  # noqa: E402
from tensordict import TensorDict  # noqa: E402

from methods.divergences import topk_tail  # noqa: E402
from methods.verl_backend import plugin  # noqa: E402
from tests.helpers.verl import (  # noqa: E402
    ROWS,
    _config,
    _domain_and_encoder,
    _expert_actions,
    _FakeTQ,
    _fsdp,
    _ScriptedServer,
    _suite_config,
    _tiny_lm,
    _train_rows,
    _verl_batch,
    _worker,
    _WorkerGroup,
)

VOCAB, K = 40, 6
LENGTHS = [5, 3, 7]  # three sequences, packed as verl's engine packs them (one row of their tokens)


def _sdpo_job(domain="code"):
    from methods.core.config import resolve_job

    return resolve_job(dict(_suite_config(), profile="real-verl"), domain, "sdpo")


def _distillation_config(loss_mode: str):
    """verl's DistillationConfig of the real-verl SDPO config with ``loss_mode`` and top-``K`` rows."""
    from verl.utils.config import omega_conf_to_dataclass

    from methods.verl_backend.launch import main_ppo_config

    cfg = main_ppo_config(_sdpo_job(), 0, model_path="m", data_dir="d", run_dir="r")
    cfg.distillation.distillation_loss.loss_mode = loss_mode
    cfg.distillation.distillation_loss.topk = K
    return omega_conf_to_dataclass(cfg.distillation)


def _rows(seed=0):
    """Student logits ``[1, nnz, V]`` and the teacher's full logits; the teacher's top-K rows per
    sequence (nested, as verl's batch holds them) are the top-K of its log-softmax."""
    g = torch.Generator().manual_seed(seed)
    nnz = sum(LENGTHS)
    student = (torch.randn(1, nnz, VOCAB, generator=g) * 2).requires_grad_()
    teacher = torch.randn(nnz, VOCAB, generator=g) * 3
    top = torch.log_softmax(teacher, -1).topk(K, dim=-1)
    split = lambda x: torch.nested.as_nested_tensor(list(x.split(LENGTHS)), layout=torch.jagged)  # noqa: E731
    data = TensorDict(
        {"teacher_logprobs": split(top.values), "teacher_ids": split(top.indices)}, batch_size=[len(LENGTHS)]
    )
    return student, teacher, data


def test_the_topk_tail_loss_in_verls_logits_processor_is_the_suites():
    """verl's ``distillation_ppo_loss`` as the logits processor, with the plugin's mode: per token and in
    its gradient, the suite's ``topk_tail`` reverse KL on the teacher's top-K support (SDPO's divergence);
    the masses are those of the K tokens."""
    from verl.trainer.distillation.losses import distillation_ppo_loss

    student, teacher, data = _rows()
    out = distillation_ppo_loss(
        _config("vanilla"), _distillation_config(plugin.TOPK_TAIL_LOSS), data=data, student_logits=student
    )
    suite = topk_tail(student[0], teacher, m=K, support="teacher")
    torch.testing.assert_close(out["distillation_losses"][0], suite)
    (got,) = torch.autograd.grad(out["distillation_losses"].sum(), student)
    (want,) = torch.autograd.grad(topk_tail(student[0], teacher, m=K, support="teacher").sum(), student)
    torch.testing.assert_close(got, want)
    assert got.abs().sum() > 0 and (out["distillation_losses"] >= -1e-6).all()
    idx = torch.log_softmax(teacher, -1).topk(K, dim=-1).indices
    mass = torch.softmax(student[0].detach(), -1).gather(-1, idx).sum(-1)
    torch.testing.assert_close(out["student_mass"][0], mass)


def test_other_loss_modes_keep_verls_own_processor():
    """The dispatch routes only the plugin's mode: verl's top-k forward KL still gives verl's values
    (and is not the reverse KL), and re-registering (a second import of the plugin) keeps one layer."""
    from verl.trainer.distillation import losses as d
    from verl.trainer.distillation.fsdp import losses as fsdp_losses

    student, _, data = _rows(1)
    theirs = fsdp_losses.compute_forward_kl_topk(
        student, data["teacher_logprobs"], data["teacher_ids"], _distillation_config("forward_kl_topk"), "thd"
    )
    ours = d.distillation_ppo_loss(
        _config("vanilla"), _distillation_config("forward_kl_topk"), data=data, student_logits=student
    )
    torch.testing.assert_close(ours["distillation_losses"], theirs["distillation_losses"])
    reverse = d.distillation_ppo_loss(
        _config("vanilla"), _distillation_config(plugin.TOPK_TAIL_LOSS), data=data, student_logits=student
    )
    assert not torch.allclose(reverse["distillation_losses"], theirs["distillation_losses"])
    plugin.register()
    assert d._lopd_bench_verl_compute_topk_loss.__module__ == "verl.trainer.distillation.losses"
    assert d.get_distillation_loss_settings(plugin.TOPK_TAIL_LOSS).use_topk


# --------------------------------------------------------------------------- the loss over taught rollouts
def _sdpo_loss_data(silent: set[int], seed=0):
    """A verl batch of :data:`ROWS` with the student's logits at every position of each sequence, the
    teacher's full logits, and its top-K rows (:data:`plugin.NO_TEACHER` rows for the ``silent``
    rollouts, whose ``loss_mask`` is 0 as the SDPO trainer writes it)."""
    from methods.verl_backend.distill import no_teacher_rows

    _, _, data = _verl_batch(ROWS, seed=seed)
    lengths = [p + r for r, p in ROWS]
    g = torch.Generator().manual_seed(seed)
    student = (torch.randn(1, sum(lengths), VOCAB, generator=g) * 2).requires_grad_()
    teacher = torch.randn(sum(lengths), VOCAB, generator=g) * 3
    top = torch.log_softmax(teacher, -1).topk(K, dim=-1)
    ids, lps = [], []
    for i, (a, b) in enumerate(zip(top.indices.int().split(lengths), top.values.split(lengths))):
        if i in silent:
            a, b = no_teacher_rows(len(a), K)
        ids.append(a)
        lps.append(b)
    nested = lambda xs: torch.nested.as_nested_tensor(xs, layout=torch.jagged)  # noqa: E731
    data["teacher_ids"], data["teacher_logprobs"] = nested(ids), nested(lps)
    keep = torch.tensor([0.0 if i in silent else 1.0 for i in range(len(ROWS))])
    data["loss_mask"] = data["response_mask"] * keep[:, None].to(data["response_mask"].dtype)
    return student, teacher, data, lengths


def _verl_sdpo_loss(student, data, lengths, dp_size=1, batch_num_tokens=None, global_batch_size=None):
    """verl's ``distillation_ppo_loss`` twice, as its engine calls it: as the logits processor on the
    packed student logits, then as the final loss on the outputs it gathered (one rank's micro-batch:
    the token count and batch size are the whole mini-batch's, over the ``dp_size`` ranks)."""
    from verl.trainer.distillation.losses import distillation_ppo_loss
    from verl.utils import tensordict_utils as tu

    dcfg = _distillation_config(plugin.TOPK_TAIL_LOSS)
    tu.assign_non_tensor(
        data,
        dp_size=dp_size,
        batch_num_tokens=int(data["loss_mask"].sum()) if batch_num_tokens is None else batch_num_tokens,
        global_batch_size=global_batch_size or len(lengths),
    )
    outputs = distillation_ppo_loss(_config("vanilla"), dcfg, data=data, student_logits=student)
    offsets = torch.tensor([0, *lengths]).cumsum(0)
    model_output = {k: torch.nested.nested_tensor_from_jagged(v[0], offsets) for k, v in outputs.items()}
    loss, metrics = distillation_ppo_loss(_config("vanilla"), dcfg, model_output=model_output, data=data)
    return loss, metrics


@pytest.mark.parametrize("silent", [set(), {1}, {0, 2}])
def test_sdpo_loss_on_verl_is_the_suites_token_mean_over_the_taught_rollouts(silent):
    """Through verl's logits processor and final loss, with the trainer's rows and ``loss_mask``: the
    loss and the student's gradient are the suite's ``distill_loss`` (``topk_tail`` on the teacher's
    support, token mean) over the rollouts with a signal only; the silent ones add nothing."""
    from methods.divergences import token_mean

    student, teacher, data, lengths = _sdpo_loss_data(silent)
    loss, metrics = _verl_sdpo_loss(student, data, lengths)
    (got,) = torch.autograd.grad(loss, student)
    starts = torch.tensor([0, *lengths]).cumsum(0)
    positions = [  # the positions whose logits predict each taught rollout's response tokens
        int(starts[i]) + p - 1 + j for i, (r, p) in enumerate(ROWS) if i not in silent for j in range(r)
    ]
    per_token = topk_tail(student[0, positions], teacher[positions], m=K, support="teacher")
    want_loss = token_mean(per_token)
    (want,) = torch.autograd.grad(want_loss, student)
    torch.testing.assert_close(loss, want_loss)
    torch.testing.assert_close(got, want)
    taught_tokens = sum(r for i, (r, _) in enumerate(ROWS) if i not in silent)
    assert metrics[plugin.TAUGHT_TOKENS].values == [taught_tokens] and taught_tokens == len(positions)
    for i in silent:  # no gradient reaches a silent rollout's positions
        assert got[0, int(starts[i]) : int(starts[i + 1])].abs().sum() == 0


def test_sdpo_loss_on_verl_is_zero_when_no_rollout_is_taught():
    """A mini-batch with no signal at all (verl's token count 0): loss 0 and a zero gradient, not 0/0."""
    student, _, data, lengths = _sdpo_loss_data(set(range(len(ROWS))))
    loss, metrics = _verl_sdpo_loss(student, data, lengths)
    (got,) = torch.autograd.grad(loss, student, allow_unused=True)
    assert float(loss) == 0.0 and (got is None or (torch.isfinite(got).all() and got.abs().sum() == 0))
    assert metrics[plugin.TAUGHT_TOKENS].values == [0]


# --------------------------------------------------------------------------- the group contexts
#: (task, succeeds) of each rollout of a step, in batch order: task 0's group interleaved with the others
PLAYS = [(0, False), (1, False), (0, True), (2, True), (0, False), (1, False)]
#: what the suite's SDPO makes of them: a failure beside a success gets the sibling (and its feedback),
#: failures alone their feedback, a success with no successful sibling nothing
KINDS = ["sibling", "feedback_only", None, None, "sibling", "feedback_only"]


def _sdpo_player(tok):
    """Plays a row with scripted actions through the SDPO agent loop (a scripted server)."""
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from methods.verl_backend import agent_loop

    trainer = OmegaConf.create(
        {
            "actor_rollout_ref": {"rollout": {"prompt_length": 2048, "response_length": 2048}},
            "lopd_bench": {"teacher_context": "sdpo", "teacher_in_trainer": True},
        }
    )
    conf = OmegaConf.create({"max_prompt_length": 2048})

    def play(row, actions):
        loop = agent_loop.EpisodeAgentLoop(
            DictConfigWrap(trainer), _ScriptedServer(list(actions)), tok, None, RLHFDataset, DictConfigWrap(conf)
        )
        return asyncio.run(loop.run({"temperature": 1.0}, extra_info=row))

    return play


def _sdpo_episodes():
    """:data:`PLAYS` played by the SDPO agent loop (the expert's actions, or a wrong call until the
    episode ends), and the same actions played on the suite's episodes."""
    _, domain, encoder, tok = _domain_and_encoder("tooluse")
    rows, tasks = _train_rows(domain, 3)
    play = _sdpo_player(tok)
    outs, suite = [], []
    for t, success in PLAYS:
        task = tasks[t]
        wrong = encoder.encode("lookup(key='nothing')") + [encoder.eos_id]
        actions = _expert_actions(encoder, domain.expert_trajectory(task)) if success else [wrong] * task.max_turns
        out = play(rows[t], actions)
        outs.append(out)
        episode = domain.reset(task)  # the suite's rollout of the same actions
        for action in actions:
            result = domain.step_batch([episode], [encoder.decode(action)])[0]
            if result.done or episode.done or len(episode.turns) >= task.max_turns:
                break
        reward = float(episode.reward())
        assert reward == out.reward_score == float(success)
        suite.append(SimpleNamespace(task=task, reward=reward, feedback=episode.feedback(), episode=episode))
    return domain, encoder, tok, outs, suite


def test_sdpo_trainer_teaches_each_rollout_what_the_suites_sdpo_teaches(tmp_path, monkeypatch):
    """Episodes played by the SDPO agent loop, handed to the SDPO trainer in TransferQueue's layout
    (keys ``{uid}_{session}_{index}``, one padding row): each rollout's teacher rows are the EMA
    teacher's top-k on the suite's SDPO context for that rollout (:meth:`methods.sdpo.SDPO.
    teacher_contexts_and_kinds` on the same episodes) ahead of the task, followed by the response; a
    rollout the suite's SDPO gives nothing gets rows the loss leaves out and no tokens in its count."""
    import transfer_queue

    from methods.core.rollout import initial_prompt_ids
    from methods.sdpo import SDPO, SDPOConfig
    from methods.verl_backend.launch import main_ppo_config
    from methods.verl_backend.sdpo import SDPO_EPISODE
    from methods.verl_backend.trainer import SDPOTrainer

    domain, encoder, tok, outs, suite = _sdpo_episodes()
    groups = [t for t, _ in PLAYS]
    method = SimpleNamespace(cfg=SDPOConfig())
    contexts, kinds = SDPO.teacher_contexts_and_kinds(
        method, SimpleNamespace(rollouts=suite, group_index=torch.tensor(groups))
    )
    assert kinds == KINDS
    assert all(SDPO_EPISODE in out.extra_fields for out in outs)

    cfg = main_ppo_config(_sdpo_job(), 0, model_path="m", data_dir=tmp_path, run_dir=tmp_path)
    trainer = SDPOTrainer(cfg)
    trainer.tokenizer = tok
    teacher = _tiny_lm(5, vocab=len(tok))
    trainer.actor_rollout_wg = _WorkerGroup([_worker(_tiny_lm(0, len(tok)), teacher, r, 2) for r in range(2)])
    fields = [
        {
            "prompts": torch.tensor(out.prompt_ids),
            "responses": torch.tensor(out.response_ids),
            "response_mask": torch.tensor(out.response_mask),
            "extra_fields": dict(out.extra_fields),
        }
        for out in outs
    ]
    tq = _FakeTQ(fields + fields[:1])  # verl's padding row: a copy of the first, under a uid of its own
    monkeypatch.setattr(transfer_queue, "kv_batch_get", tq.kv_batch_get)
    monkeypatch.setattr(transfer_queue, "kv_batch_put", tq.kv_batch_put)
    uids = ["ua", "ub", "uc"]
    keys = [f"{uids[t]}_{n}_0" for n, t in enumerate(groups)] + ["padf00d_0_0"]
    tags = [{"status": "success"}] * len(outs) + [{"status": "success", "is_padding": True}]
    metrics = {}
    trainer._compute_ref_log_prob(SimpleNamespace(keys=keys, partition_id="train", tags=tags), metrics)
    assert metrics == {"teacher/signal_share": 4 / 6}  # the padding row not counted
    T, k = cfg.actor_rollout_ref.rollout.temperature, cfg.lopd_bench.ema_teacher.topk
    put = {name: tq.put[name].unbind() for name in ("teacher_ids", "teacher_logprobs", "loss_mask")}
    for n, (out, context) in enumerate(zip(outs + outs[:1], contexts + [None])):
        prompt, response = out.prompt_ids, out.response_ids
        ids, logprobs, loss_mask = put["teacher_ids"][n], put["teacher_logprobs"][n], put["loss_mask"][n]
        assert ids.shape == logprobs.shape == (len(prompt) + len(response), k)
        if context is None:  # nothing to teach (and the padding row)
            assert (logprobs == plugin.NO_TEACHER).all() and loss_mask.sum() == 0
            continue
        assert torch.equal(loss_mask, torch.tensor(out.response_mask, dtype=loss_mask.dtype))
        head = initial_prompt_ids(encoder, domain, suite[n].task, context)
        with torch.no_grad():
            full = torch.log_softmax(teacher(torch.tensor([head + response])).logits[0] / T, dim=-1)
        lp, top = full[len(head) - 1 : len(head) - 1 + len(response)].topk(k)
        rows = slice(len(prompt) - 1, len(prompt) - 1 + len(response))  # the student's positions of the response
        assert torch.equal(ids[rows], top.int()) and torch.allclose(logprobs[rows], lp, atol=1e-5)
    domain.close()


def test_sdpo_agent_loop_records_what_the_trainer_reads():
    """The record of a training episode: its row, its trace as the suite's SDPO formats a sibling's
    (:func:`tasks.base.format_trace` without the task), its reward and its feedback; a held-out
    episode carries none."""
    from methods.verl_backend.export import task_rows
    from methods.verl_backend.sdpo import SDPO_EPISODE
    from tasks.base import format_trace

    domain, encoder, tok, outs, suite = _sdpo_episodes()
    for out, rollout in zip(outs, suite):
        record = out.extra_fields[SDPO_EPISODE]
        assert record["row"]["task_id"] == rollout.task.task_id
        assert record["trace"] == format_trace(rollout.task, rollout.episode.turns, with_task=False)
        assert record["reward"] == rollout.reward and record["feedback"] == rollout.feedback
    held_out = domain.tasks("test", 1)[0]
    out = _sdpo_player(tok)(
        task_rows(domain, [held_out], "test")[0]["extra_info"],
        _expert_actions(encoder, domain.expert_trajectory(held_out)),
    )
    assert out.reward_score == 1.0 and SDPO_EPISODE not in out.extra_fields
    domain.close()


def test_main_ppo_config_of_sdpo_distils_from_an_ema_teacher_with_group_contexts(tmp_path):
    from methods.verl_backend.launch import main_ppo_config, validate
    from methods.verl_backend.trainer import SDPO_TRAINER

    job = _sdpo_job()
    mc = job["method_config"]
    kw = {"model_path": tmp_path / "base", "data_dir": tmp_path, "run_dir": tmp_path}
    cfg = main_ppo_config(job, 1, **kw)
    validate(cfg)
    assert cfg.trainer.v1.trainer_mode == SDPO_TRAINER
    assert cfg.actor_rollout_ref.rollout.n == mc["group_size"] == 4  # the groups the contexts come from
    loss = cfg.distillation.distillation_loss
    assert loss.loss_mode == plugin.TOPK_TAIL_LOSS and loss.topk == mc["topk"] == cfg.lopd_bench.ema_teacher.topk
    assert not loss.use_task_rewards and not loss.use_policy_gradient
    assert cfg.lopd_bench.ema_teacher.rate == mc["ema_rate"] == 0.05 and cfg.lopd_bench.teacher_in_trainer
    assert dict(cfg.lopd_bench.sdpo) == {"success_threshold": 1.0, "use_sibling": True, "use_feedback": True}
    assert cfg.lopd_bench.teacher_context == "sdpo"
    for bad, message in (({"topk_support": "student"}, "student' support"), ({"divergence": "forward_kl"}, "sdpo")):
        with pytest.raises(ValueError, match=message):
            main_ppo_config(dict(job, method_config=dict(mc, **bad)), 0, **kw)


# --------------------------------------------------------------------------- two sharded processes
#: the step's sequences (prompt length, response length); rank r holds sequences 2r and 2r + 1
SHARDED_ROWS = [(3, 4), (2, 3), (4, 2), (1, 5)]


def _sharded_sequences():
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, 48, (p + r,), generator=g).tolist() for p, r in SHARDED_ROWS]


def _micro_batch(seqs, rows, silent, teacher):
    """verl's micro-batch of ``seqs`` (prompts left-padded, responses right-padded), the teacher's
    top-K rows at every position (``NO_TEACHER`` for the ``silent`` ones, whose ``loss_mask`` is 0)."""
    from methods.verl_backend.distill import no_teacher_rows

    width_p, width_r, b = max(p for p, _ in rows), max(r for _, r in rows), len(rows)
    attn = torch.zeros(b, width_p + width_r, dtype=torch.long)
    prompts, responses = torch.zeros(b, width_p, dtype=torch.long), torch.zeros(b, width_r, dtype=torch.long)
    ids, lps = [], []
    for i, (seq, (p, r)) in enumerate(zip(seqs, rows)):
        attn[i, width_p - p : width_p + r] = 1
        prompts[i, width_p - p :], responses[i, :r] = torch.tensor(seq[:p]), torch.tensor(seq[p:])
        with torch.no_grad():
            top = torch.log_softmax(teacher(torch.tensor([seq])).logits[0], -1).topk(K, dim=-1)
        a, v = no_teacher_rows(len(seq), K) if i in silent else (top.indices.int(), top.values)
        ids.append(a)
        lps.append(v)
    nested = lambda xs: torch.nested.as_nested_tensor(xs, layout=torch.jagged)  # noqa: E731
    response_mask = attn[:, width_p:].clone()
    keep = torch.tensor([0 if i in silent else 1 for i in range(b)])
    return TensorDict(
        {
            "prompts": prompts,
            "responses": responses,
            "attention_mask": attn,
            "response_mask": response_mask,
            "loss_mask": response_mask * keep[:, None],
            "teacher_ids": nested(ids),
            "teacher_logprobs": nested(lps),
        },
        batch_size=[b],
    )


def _full_grads(model, version):
    """Each parameter's whole gradient (after FSDP's reduction), by its unwrapped name."""
    if version == 2:
        grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel

        with FullyShardedDataParallel.summon_full_params(model, with_grads=True):
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return {n.replace("_fsdp_wrapped_module.", ""): g for n, g in grads.items()}


def _two_rank_sdpo(rank, world_size, init_file, out_dir, version, silent):
    """One rank of :func:`test_sdpo_loss_on_fsdp_shards_of_two_cpu_processes`: its two sequences
    through the FSDP student and verl's loss with the global token count, then one backward."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        student = _fsdp(_tiny_lm(0), version, use_orig_params=True)
        seqs, rows = _sharded_sequences()[2 * rank : 2 * rank + 2], SHARDED_ROWS[2 * rank : 2 * rank + 2]
        local_silent = {i - 2 * rank for i in silent if 2 * rank <= i < 2 * rank + 2}
        data = _micro_batch(seqs, rows, local_silent, _tiny_lm(1))
        tokens = data["loss_mask"].sum().reshape(1)
        dist.all_reduce(tokens)  # verl's engine: the mini-batch's loss_mask summed over the data-parallel ranks
        logits = torch.cat([student(input_ids=torch.tensor([seq])).logits[0] for seq in seqs])[None]
        loss, _ = _verl_sdpo_loss(
            logits, data, [len(s) for s in seqs], dp_size=world_size, batch_num_tokens=int(tokens),
            global_batch_size=len(SHARDED_ROWS),
        )  # fmt: skip
        loss.backward()
        grads = _full_grads(student, version)
        if rank == 0:
            torch.save(grads, out_dir / "grads.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two processes on a gloo group
@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("silent", [{1}, {2, 3}])
def test_sdpo_loss_on_fsdp_shards_of_two_cpu_processes(tmp_path, version, silent):
    """Two ranks, each with its own sequences of the step on an FSDP-sharded student (a unit per
    decoder layer), verl's loss with the global token count: after FSDP's gradient reduction the
    student's gradient is the suite's unsharded SDPO gradient over the whole batch's taught
    rollouts, also where one rank holds only silent rollouts ({2, 3})."""
    import torch.multiprocessing as mp

    from methods.divergences import token_mean

    mp.spawn(_two_rank_sdpo, args=(2, str(tmp_path / "init"), tmp_path, version, silent), nprocs=2)
    got = torch.load(tmp_path / "grads.pt")
    student, teacher, seqs = _tiny_lm(0), _tiny_lm(1), _sharded_sequences()
    logits, want_teacher = [], []
    for i, (seq, (p, r)) in enumerate(zip(seqs, SHARDED_ROWS)):
        if i in silent:
            continue
        logits.append(student(torch.tensor([seq])).logits[0, p - 1 : p - 1 + r])
        with torch.no_grad():
            want_teacher.append(teacher(torch.tensor([seq])).logits[0, p - 1 : p - 1 + r])
    loss = token_mean(topk_tail(torch.cat(logits), torch.cat(want_teacher), m=K, support="teacher"))
    loss.backward()
    want = {n: p.grad for n, p in student.named_parameters()}
    assert sorted(got) == sorted(want)
    for name, grad in want.items():
        torch.testing.assert_close(got[name], grad, atol=1e-6, rtol=1e-4, msg=name)
    assert sum(g.abs().sum() for g in want.values()) > 0

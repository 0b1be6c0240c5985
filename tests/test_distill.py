"""Teacher scoring and the self-distillation methods' contracts beyond the shared ones."""

from __future__ import annotations

import pytest
import torch

from methods.core.batch import agent_token_logprobs, collate
from methods.core.loop import train
from methods.core.registry import get_method
from methods.core.rollout import run_episodes
from methods.core.teacher import Teacher
from tasks.base import get_domain

from .conftest import tiny_run


def _run(ws_path, domain_name="tooluse"):
    return tiny_run(ws_path, domain_name)


def _rollouts(run, n=4):
    tasks = run.domain.tasks("train", n)
    return run_episodes(
        run.model.eval(),
        run.encoder,
        run.domain,
        tasks,
        None,
        run.train_cfg.sampling(),
        torch.Generator().manual_seed(0),
    )


@pytest.mark.parametrize("domain_name", ["tooluse", "code"])
def test_teacher_without_context_on_student_weights_scores_exactly_the_students_logits(domain_name, warmstarts):
    run = _run(warmstarts[domain_name][0], domain_name)
    rs = _rollouts(run)
    teacher = Teacher(run, "student")
    scores = teacher.score(rs, [None] * len(rs), temperature=0.7)
    b = collate(rs, list(range(len(rs))), run.encoder.pad_id)
    with torch.no_grad():
        _, logits = agent_token_logprobs(run.model, b.input_ids, b.attention_mask, b.loss_mask, 0.7)
    assert [s.shape[0] for s in scores] == [r.generated_tokens for r in rs]
    assert torch.allclose(torch.cat(scores), logits, atol=1e-4)
    assert run.ledger.teacher_tokens == sum(len(r.ids) for r in rs)


def test_teacher_context_goes_ahead_of_the_task_and_keeps_the_students_tokens(warmstarts):
    run = _run(warmstarts["tooluse"][0])
    r = _rollouts(run, 1)[0]
    ids, mask = Teacher(run, "student").sequences(r, "PRIVILEGED HINT")
    text = run.encoder.decode(ids)
    assert text.index("PRIVILEGED HINT") < text.index(r.task.prompt.splitlines()[-1])
    assert ids[len(ids) - (len(r.ids) - r.prompt_len) :] == r.ids[r.prompt_len :]
    assert sum(mask) == r.generated_tokens


def test_ema_teacher_moves_by_exactly_its_rate_and_frozen_teacher_not_at_all(warmstarts):
    run = _run(warmstarts["code"][0], "code")
    ema, frozen = Teacher(run, "ema", ema_rate=0.05), Teacher(run, "frozen")
    before_t = [p.clone() for p in ema.model.parameters()]
    frozen_before = [p.clone() for p in frozen.model.parameters()]
    with torch.no_grad():
        for p in run.model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    ema.update()
    frozen.update()
    for t0, t1, s in zip(before_t, ema.model.parameters(), run.model.parameters()):
        assert torch.allclose(t1, t0 + 0.05 * (s - t0), atol=1e-6)
    assert all(torch.equal(a, b) for a, b in zip(frozen_before, frozen.model.parameters()))
    with pytest.raises(ValueError, match="weight source"):
        Teacher(run, "oracle")


@pytest.mark.parametrize("method_name", ["opsd", "sdft"])
def test_training_leaves_a_frozen_teacher_bit_identical_and_moves_an_ema_one(method_name, warmstarts, tmp_path):
    run = _run(warmstarts["code"][0], "code")
    cls = get_method(method_name)
    method = cls(cls.Config(), run)
    before = {k: v.clone() for k, v in method.teacher.model.state_dict().items()}
    train(method, run, tmp_path)
    after = method.teacher.model.state_dict()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    if method.cfg.teacher_source == "frozen":
        assert not changed
    else:
        assert changed
    assert run.ledger.teacher_tokens > 0
    first = [
        r
        for r in map(__import__("json").loads, (tmp_path / "metrics.jsonl").read_text().splitlines())
        if r["kind"] == "train"
    ][0]
    assert "teacher_context_gain" in first and "signal_share" in first


def test_distill_config_rejects_bad_values():
    cls = get_method("sdft").Config
    with pytest.raises(ValueError, match="ema_rate"):
        cls(ema_rate=0.0)
    with pytest.raises(ValueError, match="divergence"):
        get_method("opsd").Config(divergence="l2")


def test_sdpo_context_uses_a_successful_sibling_never_itself_and_feedback(warmstarts):
    from methods.core.batch import collate as _collate

    run = _run(warmstarts["tooluse"][0])
    cls = get_method("sdpo")
    method = cls(cls.Config(), run)
    import dataclasses

    first = _rollouts(run, 1)[0]
    # one group of four attempts at the same task: rewards 1, 0, 1, 0 (set by hand)
    rs = [
        dataclasses.replace(first, reward=rw, feedback=fb)
        for rw, fb in [(1.0, ""), (0.0, "errors: unknown tool"), (1.0, ""), (0.0, "")]
    ]
    b = _collate(rs, [0, 0, 0, 0], run.encoder.pad_id)
    ctx = method.teacher_contexts(b)
    assert all(c is not None for c in ctx[:3])
    assert "feedback on a failed attempt" in ctx[1] and "unknown tool" in ctx[1]
    assert "feedback" not in ctx[0]  # a success gets its sibling's trace only
    assert ctx[3] is not None and "feedback" not in ctx[3]  # failure without feedback: the sibling still teaches
    lone = _collate(rs[:1], [0], run.encoder.pad_id)
    assert method.teacher_contexts(lone) == [None]  # a lone success: neither source, no signal
    # the kinds that split the sanity check
    fail_alone = _collate([rs[1]], [0], run.encoder.pad_id)
    assert method.teacher_contexts_and_kinds(b) == (ctx, ["sibling"] * 4)
    assert method.teacher_contexts_and_kinds(fail_alone)[1] == ["feedback_only"] and method.teacher_contexts_and_kinds(
        lone
    )[1] == [None]


def test_gain_record_scores_each_task_context_pair_once_and_splits_by_kind(warmstarts):
    from methods.core.distill import context_gain, expert_trace, gain_record

    run = _run(warmstarts["code"][0], "code")
    teacher = Teacher(run, "student")
    rs = _rollouts(run, 3)
    ctx = [expert_trace(run.domain, r.task) for r in rs[:2]] + ["feedback on a failed attempt:\nwrong"]
    kinds = ["sibling", "sibling", "feedback_only"]
    rec = gain_record(teacher, rs, ctx, kinds)
    tasks = [r.task for r in rs]
    assert (
        rec["teacher_context_gain"] == pytest.approx(context_gain(teacher, tasks, ctx), abs=1e-9)
        and rec["teacher_context_pairs"] == 3
    )
    assert (
        rec["teacher_context_gain_sibling"] == pytest.approx(context_gain(teacher, tasks[:2], ctx[:2]), abs=1e-9)
        and rec["teacher_context_pairs_sibling"] == 2
    )
    assert rec["teacher_context_gain_feedback_only"] == pytest.approx(
        context_gain(teacher, tasks[2:], ctx[2:]), abs=1e-9
    )
    # the same task-context pair twice (a task's rollouts sharing one context) is scored once; no context is skipped
    again = gain_record(teacher, rs + rs + rs[:1], ctx + ctx + [None])
    assert (
        again["teacher_context_gain"] == pytest.approx(rec["teacher_context_gain"], abs=1e-9)
        and again["teacher_context_pairs"] == 3
    )
    assert not any(k.startswith("teacher_context_gain_") for k in again)  # no kinds given, no split
    # one task with two different contexts is two pairs
    two = gain_record(teacher, [rs[0], rs[0]], [ctx[0], ctx[2]])
    assert two["teacher_context_pairs"] == 2 and two["teacher_context_gain"] == pytest.approx(
        context_gain(teacher, [tasks[0]] * 2, [ctx[0], ctx[2]]), abs=1e-9
    )


def test_failed_attempt_shift_scores_the_students_own_failed_actions(warmstarts):
    import dataclasses

    from methods.core.distill import expert_trace, failed_attempt_shift, gain_record
    from methods.core.evaluate import mean_agent_logprob

    run = _run(warmstarts["code"][0], "code")
    teacher = Teacher(run, "student")
    rs = [
        dataclasses.replace(r, reward=rw) for r, rw in zip(_rollouts(run, 3), [0.0, 0.5, 1.0])
    ]  # two failures, one success
    ctx = [expert_trace(run.domain, r.task) for r in rs]
    items = [(r.task, c, r.episode.turns) for r, c in zip(rs[:2], ctx[:2])]
    with torch.no_grad():
        expected = mean_agent_logprob(run.model, run.encoder, run.domain, items) - mean_agent_logprob(
            run.model, run.encoder, run.domain, [(t, None, tu) for t, _, tu in items]
        )
    shift = failed_attempt_shift(teacher, rs, ctx)
    assert shift["teacher_failed_attempts"] == 2 and shift["teacher_failed_shift"] == pytest.approx(expected, abs=1e-6)
    assert (
        failed_attempt_shift(teacher, rs, [None, None, ctx[2]]) == {}
    )  # the success does not count; no context, nothing to score
    rec = gain_record(teacher, rs, ctx, ["a", "b", "b"])
    assert rec["teacher_failed_shift"] == shift["teacher_failed_shift"] and rec["teacher_failed_attempts"] == 2
    assert (
        rec["teacher_failed_attempts_a"] == 1 and rec["teacher_failed_attempts_b"] == 1
    )  # per kind: b's success is left out


def test_skill_library_ucb1_and_summaries():
    from methods.skill_sd import SkillLibrary

    lib = SkillLibrary()
    task = get_domain("code", seed=0).tasks("train", 1)[0]
    assert lib.select(task, 1.4) is None  # no candidate: GRPO term only
    assert lib.add("a", task.group_id) and lib.add("b", task.group_id) and not lib.add("a", task.group_id)
    lib.add("other group", "elsewhere")
    first = lib.select(task, 1.4)
    lib.record(first, 0.0)
    second = lib.select(task, 1.4)
    assert {first, second} == {0, 1}  # every candidate is tried once before exploiting
    lib.record(second, 1.0)
    assert lib.select(task, 0.0) == second  # c = 0: pure exploitation of the better mean
    state = lib.state_dict()
    lib2 = SkillLibrary()
    lib2.load_state_dict(state)
    assert lib2.state_dict() == state and lib2.select(task, 0.0) == second


def test_skill_sd_distillation_term_reaches_the_student(warmstarts, tmp_path):
    import json

    run = _run(warmstarts["tooluse"][0])
    cls = get_method("skill_sd")
    method = cls(cls.Config(sdl_weight=1.0), run)
    # seed the library with a skill for every training task's group so the teacher term is active
    for group in {t.group_id for t in run.domain.tasks("train")}:
        method.library.add("what worked:\n> hint", group)
    train(method, run, tmp_path)
    recs = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    trains = [r for r in recs if r["kind"] == "train"]
    assert all(r["skill_share"] == 1.0 for r in trains) and any(r["sdl"] != 0 for r in trains)
    assert "teacher_context_gain" in trains[0] and "teacher_context_gain" not in trains[1]  # measured once


def test_context_gain_is_the_difference_of_expert_log_likelihoods(warmstarts):
    from methods.core.batch import token_logprobs
    from methods.core.distill import context_gain, expert_trace
    from methods.core.rollout import trajectory_ids

    run = _run(warmstarts["code"][0], "code")
    teacher = Teacher(run, "student")
    tasks = run.domain.tasks("train", 3)
    ctx = [expert_trace(run.domain, t) for t in tasks]
    assert context_gain(teacher, tasks, [None] * 3) == 0.0  # no context: nothing to measure

    def mean_lp(with_ctx):
        tot, n = 0.0, 0
        for t, c in zip(tasks, ctx):
            ids, mask = trajectory_ids(
                run.encoder, run.domain, t, c if with_ctx else None, run.domain.expert_trajectory(t).turns
            )
            x = torch.tensor([ids])
            lp, _ = token_logprobs(run.model, x, torch.ones_like(x))
            m = torch.tensor([mask[1:]], dtype=torch.float32)
            tot, n = tot + float((lp * m).sum()), n + int(m.sum())
        return tot / n

    with torch.no_grad():
        expected = mean_lp(True) - mean_lp(False)
    assert context_gain(teacher, tasks, ctx) == pytest.approx(expected, abs=1e-4)


def test_a_context_that_does_not_help_is_reported_in_the_log(capsys):
    from methods.core.distill import checked_gain

    assert checked_gain("sdpo", -0.15) == -0.15
    err = capsys.readouterr().err
    assert "[sdpo] warning" in err and "-0.1500 nats/token" in err
    checked_gain("opsd", 0.03)
    assert "warning" not in capsys.readouterr().err

"""Contract tests, parametrised over every registered method and every task domain.

Each method trains two steps on a tiny warm start through the shared loop (the
domain is wrapped so that an untrained policy still sees reward variance):
its parameters must change, the rollouts used must equal the budget, the
metric names must be the shared ones, and the run must resume to the same
metrics after an interruption.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from methods.core.loop import train
from methods.core.registry import get_method, known_methods

from .conftest import DOMAINS, tiny_configs, tiny_run

SHARED_TRAIN_KEYS = {
    "kind",
    "step",
    "rollouts",
    "rollout_budget",
    "tasks_seen",
    "generated_tokens",
    "teacher_tokens",
    "wall_s",
    "train_reward",
    "loss",
    "grad_norm",
    "rollout_s",
}
SHARED_EVAL_KEYS = {"kind", "step", "rollouts", "heldout_reward", "heldout_success", "heldout_episodes"}


def _run(method_name, domain_name, ws_path: Path, out: Path, train_cfg=None, banks=None):
    cls = get_method(method_name)
    run = tiny_run(ws_path, domain_name, train_cfg, out)
    if cls.uses_bank and banks is not None:  # as the pipeline does: a bank seeded before RL
        run.bank_path = banks[domain_name]
    method = cls(cls.Config(), run)
    return method, run


@pytest.mark.slow  # every method x domain through the loop: 82 s of the quick loop's 336 s
@pytest.mark.parametrize("domain_name", DOMAINS)
@pytest.mark.parametrize("method_name", known_methods())
def test_two_steps_change_parameters_and_spend_the_budget(method_name, domain_name, warmstarts, seeded_banks, tmp_path):
    ws_path, _ = warmstarts[domain_name]
    method, run = _run(method_name, domain_name, ws_path, tmp_path, banks=seeded_banks)
    before = {k: v.clone() for k, v in run.model.state_dict().items()}
    final = train(method, run, tmp_path)
    assert run.ledger.rollouts == run.train_cfg.rollout_budget
    assert run.ledger.steps == run.train_cfg.rollout_budget // run.train_cfg.rollouts_per_step == 2
    assert 0 < run.ledger.tasks_seen <= run.ledger.rollouts
    changed = [k for k, v in run.model.state_dict().items() if not torch.equal(v, before[k])]
    assert changed, "no parameter changed after two steps"
    recs = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    trains = [r for r in recs if r["kind"] == "train"]
    evals = [r for r in recs if r["kind"] == "eval"]
    assert len(trains) == 2 and [e["rollouts"] for e in evals] == [0, 8, 16]
    for r in trains:
        assert SHARED_TRAIN_KEYS <= set(r), SHARED_TRAIN_KEYS - set(r)
    for r in evals:
        assert SHARED_EVAL_KEYS <= set(r)
        assert 0.0 <= r["heldout_reward"] <= 1.0
    assert final["rollouts"] == 16


class _Interrupt(Exception):
    pass


def _strip_time(recs):
    drop = {
        "wall_s",
        "eval_wall_s",
        "rollout_s",
        "update_s",
        "eval_s",
        "retrieval_s",
        "bank_add_s",
        "composer_s",
        "teacher_s",
        "composer_step_s",
        "lopd_retrieval_s",
    }  # wall-clock timings
    return [{k: v for k, v in r.items() if k not in drop} for r in recs]


@pytest.mark.slow  # three runs per method: 55 s
@pytest.mark.parametrize("method_name", known_methods())
def test_resume_after_interruption_matches_uninterrupted_run(method_name, warmstarts, seeded_banks, tmp_path):
    domain_name = "tooluse"
    ws_path, _ = warmstarts[domain_name]
    from dataclasses import replace

    _, _, cfg = tiny_configs()
    cfg = replace(cfg, rollout_budget=24)
    # uninterrupted reference
    m, run = _run(method_name, domain_name, ws_path, tmp_path / "ref", cfg, banks=seeded_banks)
    train(m, run, tmp_path / "ref")
    ref = [json.loads(x) for x in (tmp_path / "ref" / "metrics.jsonl").read_text().splitlines()]
    # killed during step 3 (after the step-2 checkpoint)
    m, run = _run(method_name, domain_name, ws_path, tmp_path / "cut", cfg, banks=seeded_banks)
    orig = m.after_step

    def boom(batch):
        if run.ledger.steps == 2:
            raise _Interrupt
        return orig(batch)

    m.after_step = boom
    with pytest.raises(_Interrupt):
        train(m, run, tmp_path / "cut")
    assert (tmp_path / "cut" / "checkpoint.pt").exists()
    m, run = _run(method_name, domain_name, ws_path, tmp_path / "cut", cfg, banks=seeded_banks)
    train(m, run, tmp_path / "cut")
    got = [json.loads(x) for x in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert _strip_time(got) == _strip_time(ref)


def test_a_checkpoint_of_another_job_is_not_resumed(warmstarts, tmp_path):
    ws_path, _ = warmstarts["tooluse"]
    m, run = _run("grpo", "tooluse", ws_path, tmp_path)
    train(m, run, tmp_path, fingerprint="job-a")
    # same job: nothing left to do, the finished run is reused
    m, run = _run("grpo", "tooluse", ws_path, tmp_path)
    train(m, run, tmp_path, fingerprint="job-a")
    recs = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert sum(r["kind"] == "train" for r in recs) == 2
    # changed job: the stale checkpoint and metrics are discarded and the run starts afresh
    m, run = _run("grpo", "tooluse", ws_path, tmp_path)
    train(m, run, tmp_path, fingerprint="job-b")
    recs = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if r["kind"] == "train"] == [1, 2]
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=False)["fingerprint"] == "job-b"


def test_a_torn_metrics_line_does_not_block_resume(warmstarts, tmp_path):
    ws_path, _ = warmstarts["tooluse"]
    m, run = _run("grpo", "tooluse", ws_path, tmp_path)
    train(m, run, tmp_path)
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"kind": "train", "st')  # killed mid-write
    from methods.core.loop import MetricsLog

    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.truncate_to_step(1)
    assert [r["step"] for r in log.records()] == [0, 1, 1]


@pytest.mark.parametrize("method_name", ["grpo", "retrieval_rl"])
def test_the_rollout_0_evaluation_reuses_the_base_policys_where_it_is_the_same_computation(
    method_name, warmstarts, seeded_banks, tmp_path
):
    """Greedy, same tasks, no student context: the run's first evaluation is the base policy's own
    (bit-identical, so taken from its eval.json); a method with a student context evaluates."""
    from dataclasses import replace

    from methods.core.evaluate import evaluate

    ws_path, _ = warmstarts["tooluse"]
    _, _, cfg = tiny_configs()
    cfg = replace(cfg, rollout_budget=8)
    ref_m, ref_run = _run(method_name, "tooluse", ws_path, tmp_path / "ref", cfg, banks=seeded_banks)
    train(ref_m, ref_run, tmp_path / "ref")
    computed = json.loads((tmp_path / "ref" / "metrics.jsonl").read_text().splitlines()[0])
    m, run = _run(method_name, "tooluse", ws_path, tmp_path / "reuse", cfg, banks=seeded_banks)
    base = evaluate(
        run.model, run.encoder, run.domain, run.domain.tasks("test", cfg.eval_episodes), cfg.sampling(eval=True), seed=7
    )
    run.base_eval = {
        **base,
        "heldout_reward": base["heldout_reward"] + (0.0 if method_name == "grpo" else 1.0),
    }
    train(m, run, tmp_path / "reuse")
    first = json.loads((tmp_path / "reuse" / "metrics.jsonl").read_text().splitlines()[0])
    keys = [k for k in computed if k.startswith("heldout_")]
    assert [first[k] for k in keys] == [computed[k] for k in keys]  # same numbers either way
    assert first.get("eval_reused", False) == (method_name == "grpo")
    run.base_eval = {**base, "heldout_episodes": cfg.eval_episodes + 1}  # other tasks: not reused
    m2, run2 = _run(method_name, "tooluse", ws_path, tmp_path / "other", cfg, banks=seeded_banks)
    run2.base_eval = run.base_eval
    train(m2, run2, tmp_path / "other")
    assert "eval_reused" not in json.loads((tmp_path / "other" / "metrics.jsonl").read_text().splitlines()[0])


def test_retrieval_rls_rollout_0_evaluation_reuses_the_domains_retrieved_evaluation(warmstarts, seeded_banks, tmp_path):
    """The base policy's evaluation with the seeded bank's top-n in context (made once per domain,
    ``methods.cli retrieved-eval``) is a retrieval RL run's rollout-0 evaluation, whatever its seed:
    equal numbers when recomputed, reused when its contexts' fingerprint matches, and evaluated
    again when it does not (another n_retrieve)."""
    from dataclasses import replace

    from methods.experience import BankConfig, ExperienceBank
    from methods.experience.encoder import TextEncoder
    from methods.testbed import retrieved_evaluation

    ws_path, _ = warmstarts["tooluse"]
    _, _, cfg = tiny_configs()
    cfg = replace(cfg, rollout_budget=8)
    ref_m, ref_run = _run("retrieval_rl", "tooluse", ws_path, tmp_path / "ref", cfg, banks=seeded_banks)
    train(ref_m, ref_run, tmp_path / "ref")
    computed = json.loads((tmp_path / "ref" / "metrics.jsonl").read_text().splitlines()[0])
    assert "eval_reused" not in computed

    def shared(run, n):
        bank = ExperienceBank(BankConfig(), TextEncoder()).load(seeded_banks["tooluse"]).freeze()
        tasks = run.domain.tasks("test", cfg.eval_episodes)
        return retrieved_evaluation(run.model, run.encoder, run.domain, tasks, cfg.sampling(eval=True), bank, n, seed=5)

    m, run = _run("retrieval_rl", "tooluse", ws_path, tmp_path / "reuse", cfg, banks=seeded_banks)
    ev = shared(run, m.cfg.n_retrieve)
    keys = [k for k in computed if k.startswith("heldout_")]
    assert [ev[k] for k in keys] == [computed[k] for k in keys]  # the same computation
    run.context_evals = [{**ev, "heldout_reward": ev["heldout_reward"] + 1.0}]  # marked, to see it taken
    train(m, run, tmp_path / "reuse")
    first = json.loads((tmp_path / "reuse" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["eval_reused"] and first["heldout_reward"] == computed["heldout_reward"] + 1.0
    m2, run2 = _run("retrieval_rl", "tooluse", ws_path, tmp_path / "other", cfg, banks=seeded_banks)
    run2.context_evals = [{**shared(run2, m2.cfg.n_retrieve - 1), "heldout_reward": 9.0}]  # other contexts
    train(m2, run2, tmp_path / "other")
    first = json.loads((tmp_path / "other" / "metrics.jsonl").read_text().splitlines()[0])
    assert "eval_reused" not in first and first["heldout_reward"] == computed["heldout_reward"]


def test_inner_curve_points_evaluate_a_prefix_of_the_held_out_tasks(warmstarts, seeded_banks, tmp_path):
    """curve_eval_episodes: the evaluations between the first and the last use the first k of
    the held-out tasks (so they are cheap); the first and the final use all of them."""
    from dataclasses import replace

    ws_path, _ = warmstarts["tooluse"]
    _, _, cfg = tiny_configs()
    k = cfg.eval_episodes // 2
    m, run = _run("grpo", "tooluse", ws_path, tmp_path, replace(cfg, curve_eval_episodes=k), banks=seeded_banks)
    train(m, run, tmp_path)
    evals = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines() if '"eval"' in x]
    assert [(e["rollouts"], e["heldout_episodes"]) for e in evals] == [
        (0, cfg.eval_episodes),
        (8, k),
        (16, cfg.eval_episodes),
    ]
    with pytest.raises(ValueError, match="curve_eval_episodes"):
        replace(cfg, curve_eval_episodes=cfg.eval_episodes + 1)


@pytest.mark.slow  # a run evaluated on HumanEval in the sandbox
def test_held_out_evaluation_on_a_benchmark_domain(warmstarts, tmp_path):
    """With ``heldout_domain`` (the real profile: train on code, evaluate on HumanEval) every held-out
    evaluation plays the benchmark's test problems, while training samples the domain's own tasks."""
    from tasks.base import get_domain

    method, run = _run("grpo", "code", warmstarts["code"][0], tmp_path)
    run.heldout_domain = get_domain("humaneval")
    try:
        train(method, run, tmp_path)
    finally:
        run.heldout_domain.close()
    evals = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in evals if r["kind"] == "eval"]
    assert len(evals) == 3 and all(r["heldout_episodes"] == run.train_cfg.eval_episodes for r in evals)
    # code's episodes report the tests passed; HumanEval's report only a reason: no heldout_passed
    assert all("heldout_passed" not in r for r in evals)
    assert run.ledger.rollouts == run.train_cfg.rollout_budget
    # the same run without it evaluates on code's own test split
    method, run = _run("grpo", "code", warmstarts["code"][0], tmp_path / "own")
    train(method, run, tmp_path / "own")
    own = [json.loads(line) for line in (tmp_path / "own" / "metrics.jsonl").read_text().splitlines()]
    assert all("heldout_passed" in r for r in own if r["kind"] == "eval")

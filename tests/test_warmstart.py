"""The warm start's data: fresh warm-start groups, leak-free, and its batching."""

from __future__ import annotations

import collections
import random

import pytest

from methods.stages.warmstart import WarmStartConfig, batch_stream, expert_episodes
from tasks.base import get_domain

DOMAINS = ["tooluse", "code"]


@pytest.fixture(scope="module", params=DOMAINS)
def domain(request):
    d = get_domain(request.param, seed=0)
    yield d
    d.close()


def test_warmstart_groups_are_fresh_and_shared_by_a_few_tasks(domain):
    ws = domain.tasks("warmstart", 400)
    seen = {t.group_id for t in domain.tasks("train", 3000)} | {t.group_id for t in domain.tasks("test")}
    sizes = collections.Counter(t.group_id for t in ws)
    assert not set(sizes) & seen, "a warm-start group is also a train or test group"
    # a few tasks per group: enough for same-group context blocks, too few to memorize a group
    assert 2 <= min(sizes.values()) and max(sizes.values()) <= 8
    assert len(sizes) >= 50
    assert len({t.prompt for t in ws}) == len(ws)
    assert {t.split for t in ws} == {"warmstart"}
    # deterministic, and a prefix of the longer stream
    assert [t.prompt for t in domain.tasks("warmstart", 100)] == [t.prompt for t in ws[:100]]


def test_expert_solves_warmstart_tasks(domain):
    eps = expert_episodes(domain, domain.tasks("warmstart", 60))
    assert all(e.reward() == 1.0 for e in eps)


def test_warmstart_never_shows_a_test_prompt_or_test_names(domain):
    test = domain.tasks("test")
    ws = domain.tasks("warmstart", 2000)
    assert not {t.prompt for t in test} & {t.prompt for t in ws}
    if domain.name == "code":
        # warm-start projects are never train or test projects, but they use every
        # (template, constants) pair, the test split's held-out ones included
        from tasks.code.families import TEMPLATES
        from tasks.code.generator import _combos_by_split, _key

        by_name = {t.name: t for t in TEMPLATES}
        held_out = {
            (n, _key(c)) for n, tm in by_name.items() if len(tm.combos()) >= 3 for c in _combos_by_split(tm)["test"]
        }
        with_constants = [t for t in ws if len(by_name[t.template_id].combos()) >= 3]
        share = sum((t.template_id, _key(t.payload["params"])) in held_out for t in with_constants) / len(
            with_constants
        )
        assert share > 0.1, share  # ~0.19: held-out pairs are drawn like any other
        train = domain.tasks("train", 2000)
        assert (
            not {(t.template_id, _key(t.payload["params"])) for t in train if len(by_name[t.template_id].combos()) >= 3}
            & held_out
        )
    else:
        from tasks.tooluse.names import words

        def instruction_words(t):
            return set(t.prompt.splitlines()[-1].lower().replace(".", " ").split())

        # pool words that templates also use ("move" = "mo" + "ve") occur in train instructions too
        test_words = set(words("test")) - set().union(*(instruction_words(t) for t in domain.tasks("train", 3000)))
        for t in ws:
            assert not test_words & instruction_words(t), t.prompt


#: fingerprint of the first 200 train and 200 test tasks per domain version.  The
#: methods' world must not move under a version: change the data, bump the version
#: (code-v3 changed only the warm-start split, so its train/test equal code-v2's).
SPLIT_FINGERPRINTS = {
    "tooluse-v2": "c461d8bc24830ade",
    "code-v2": "b6ae8d24f05ccc7c",
    "code-v3": "b6ae8d24f05ccc7c",
    "tooluse-v3": "1f1bbc35d21e027c",
    "code-v4": "e2845f3525875950",
    "code-v5": "e2845f3525875950",
    "code-v6": "e2845f3525875950",
}  # v5, v6: the same tasks, two attempts, named tests


def test_train_and_test_splits_are_pinned_by_the_version(domain):
    import hashlib

    h = hashlib.sha256()
    for split in ("train", "test"):
        for t in domain.tasks(split, 200):
            h.update(
                (
                    t.prompt + "\x00" + t.reference + "\x00" + repr(t.payload.get("tests", t.payload.get("checks")))
                ).encode()
            )
    assert h.hexdigest()[:16] == SPLIT_FINGERPRINTS[domain.version], (
        "train/test data changed: bump the domain's version"
    )


def test_unknown_split_lists_the_known_ones(domain):
    with pytest.raises(ValueError, match="warmstart"):
        domain.tasks("dev", 3)


def test_batch_stream_serves_every_example_once_per_epoch_and_buckets():
    rng = random.Random(0)
    examples = [([0] * rng.randint(5, 300), [1]) for _ in range(640)]
    for bucket in (False, True):
        stream = batch_stream(examples, 32, seed=1, bucket=bucket, pool_batches=4)
        served = [id(x) for _ in range(20) for x in next(stream)]
        assert collections.Counter(served) == collections.Counter(id(x) for x in examples)

    def padding(bucket):
        stream = batch_stream(examples, 32, seed=1, bucket=bucket, pool_batches=16)
        pad = total = 0
        for _ in range(20):
            lens = [len(x[0]) for x in next(stream)]
            pad += max(lens) * len(lens) - sum(lens)
            total += max(lens) * len(lens)
        return pad / total

    assert padding(True) < 0.1 < 0.3 < padding(False)


def test_config_bounds():
    with pytest.raises(ValueError, match="seen_group_share"):
        WarmStartConfig(seen_group_share=1.5)


def test_recovery_demos_mask_the_corrupted_call_and_still_solve_the_task(domain):
    from methods.core.rollout import trajectory_ids
    from methods.core.tokenizer import ChatEncoder, train_tokenizer
    from methods.stages.warmstart import recovery_demos
    from tasks.base import format_trace

    eps = expert_episodes(domain, domain.tasks("warmstart", 120))
    noisy = recovery_demos(domain, eps, 1.0, random.Random(0))
    if domain.name == "code":  # single-turn: there is nothing to recover in
        assert noisy == {}
        return
    assert len(noisy) > 40
    enc = ChatEncoder(train_tokenizer([format_trace(e.task, e.turns) for e in eps], vocab_size=400))
    for i, (turns, masked) in noisy.items():
        clean = eps[i]
        (k,) = masked
        assert len(turns) == len(clean.turns) + 1 and k < len(turns) - 1
        assert turns[k].action != clean.turns[k].action and turns[k + 1].action == clean.turns[k].action
        replay = domain.reset(clean.task)
        for t in turns:
            replay.step(t.action)
        assert replay.done and replay.reward() == 1.0
        ids, mask = trajectory_ids(enc, domain, clean.task, None, turns, masked)
        _, mask_clean = trajectory_ids(enc, domain, clean.task, None, turns)
        assert sum(mask_clean) - sum(mask) == len(enc.encode(turns[k].action)) + 1
    assert sum("error" in (turns[k].observation or "") for turns, (k,) in noisy.values()) > 0.8 * len(noisy)
    assert recovery_demos(domain, eps, 0.0, random.Random(0)) == {}


def test_masked_nll_equals_the_masked_sum_of_token_logprobs():
    import torch

    from methods.core.batch import token_logprobs
    from methods.core.evaluate import masked_nll
    from methods.core.policy import ModelConfig, build_policy
    from methods.core.tokenizer import train_tokenizer

    tok = train_tokenizer(["find(Mara Velk)", "def f(xs):\n    return xs"] * 10, vocab_size=300)
    model = build_policy(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), tok, seed=0)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, len(tok), (3, 17), generator=g)
    attn = torch.ones_like(ids)
    attn[2, 12:] = 0
    mask = (torch.rand(3, 16, generator=g) < 0.4).float() * attn[:, 1:]
    nll, count = masked_nll(model, ids, attn, mask)
    logp, _ = token_logprobs(model, ids, attn)
    assert int(count) == int(mask.sum()) > 0
    assert torch.allclose(nll, -(logp * mask).sum(), atol=1e-4)
    nll.backward()  # gradients reach the shared embedding / output head
    assert model.get_output_embeddings().weight.grad.abs().sum() > 0


def test_context_shares_must_fit_in_one():
    with pytest.raises(ValueError, match="same_task_share \\+ feedback_share \\+ skill_share"):
        WarmStartConfig(same_task_share=0.5, feedback_share=0.4, skill_share=0.2)
    WarmStartConfig(same_task_share=0.5, feedback_share=0.3, skill_share=0.2)


def test_failed_attempts_fail_and_carry_the_environments_feedback(domain):
    from methods.stages.warmstart import failed_attempts

    eps = expert_episodes(domain, domain.tasks("warmstart", 60))
    failed = failed_attempts(domain, eps, random.Random(0))
    assert len(failed) > 30
    by_id = {e.task.task_id: e for e in eps}
    for tid, (turns, fb) in failed.items():
        clean = by_id[tid].turns
        assert fb and 1 <= len(turns) <= len(clean)
        assert [t.action for t in turns[:-1]] == [t.action for t in clean[: len(turns) - 1]] and turns[
            -1
        ].action != clean[len(turns) - 1].action
        replay = domain.reset(by_id[tid].task)
        for t in turns:
            domain.step_batch([replay], [t.action])
        assert replay.reward() < 1.0 and replay.feedback() == fb


@pytest.mark.parametrize("kind", ["none", "feedback", "skill"])
def test_warmstart_contexts_use_the_methods_formats(domain, kind):
    """SDPO's feedback reprompt and Skill-SD's skills enter the demonstrations in the methods' own
    formats (methods/core/contexts.py), and only when their shares are set."""
    from methods.core.tokenizer import ChatEncoder, train_tokenizer
    from methods.stages.warmstart import build_examples
    from tasks.base import format_trace

    eps = expert_episodes(domain, domain.tasks("warmstart", 80))
    shares = {"none": {}, "feedback": {"feedback_share": 1.0}, "skill": {"skill_share": 1.0}}[kind]
    cfg = WarmStartConfig(context_share=1.0, same_task_share=0.0, **shares)
    enc = ChatEncoder(train_tokenizer([format_trace(e.task, e.turns) for e in eps], vocab_size=400))
    examples = build_examples(domain, enc, eps, cfg, random.Random(0))
    texts = [enc.decode([t for t, m in zip(ids, mask) if not m]) for ids, mask in examples]
    marker = {"none": None, "feedback": "feedback on a failed attempt:", "skill": "what worked:"}[kind]
    hits = sum(("feedback on a failed attempt:" in t) or ("what worked:" in t) or ("what failed:" in t) for t in texts)
    if marker is None:
        assert hits == 0
    else:
        assert sum(marker in t for t in texts) > len(texts) // 3
        if kind == "skill":
            assert any("what failed:" in t for t in texts)
    # the targets stay the expert's own turns
    for (ids, mask), e in zip(examples, eps):
        target = enc.decode([t for t, m in zip(ids, mask) if m and t != enc.eos_id])
        assert "".join(target.split()) == "".join("".join(t.action.split()) for t in e.turns)


@pytest.mark.parametrize("demo_recovery", [None, 0.0])
def test_demonstrations_without_context_come_from_the_imperfect_demonstrator(demo_recovery):
    """demo_recovery None: every demonstration is the expert's.  A number: those without a
    context block are the domain's imperfect demonstrator's (here: one that never recovers)."""
    from methods.core.rollout import trajectory_ids
    from methods.core.tokenizer import ChatEncoder, train_tokenizer
    from methods.stages.warmstart import build_examples
    from tasks.base import format_trace

    domain = get_domain("tooluse", seed=0)
    eps = expert_episodes(domain, domain.tasks("warmstart", 40))
    enc = ChatEncoder(train_tokenizer([format_trace(e.task, e.turns) for e in eps], vocab_size=400))
    cfg = WarmStartConfig(context_share=0.0, demo_recovery=demo_recovery)
    got = build_examples(domain, enc, eps, cfg, random.Random(0))
    if demo_recovery is None:
        want = [trajectory_ids(enc, domain, e.task, None, e.turns) for e in eps]
    else:
        want = [
            trajectory_ids(enc, domain, e.task, None, domain.imperfect_trajectory(e.task, random.Random(1), 0.0).turns)
            for e in eps
        ]
        assert want != [trajectory_ids(enc, domain, e.task, None, e.turns) for e in eps]  # it does make mistakes here
    assert [tuple(map(tuple, x)) for x in got] == [tuple(map(tuple, x)) for x in want]
    with pytest.raises(ValueError, match="demo_recovery"):
        WarmStartConfig(demo_recovery=1.5)


def test_retrieval_shaped_contexts_hold_several_solved_tasks_one_of_the_group(domain):
    """retrieved_share: a same-group context block becomes what retrieval hands a student:
    retrieved_docs solved tasks (task line + trace) joined by blank lines, at least one from the
    task's group; retrieved_share 0 keeps the one-trace blocks and their random stream."""
    from methods.stages.warmstart import _context_for
    from tasks.base import format_trace

    eps = expert_episodes(domain, domain.tasks("warmstart", 120))
    by_group: dict = {}
    for e in eps:
        by_group.setdefault(e.task.group_id, []).append(e)
    docs_of = {format_trace(e.task, e.turns): e.task.group_id for e in eps}
    one = WarmStartConfig(context_share=1.0, same_task_share=0.0)
    three = WarmStartConfig(context_share=1.0, same_task_share=0.0, retrieved_share=1.0, retrieved_docs=3)
    plain = [_context_for(e.task, e, by_group, random.Random(i), one) for i, e in enumerate(eps)]
    assert all(c is None or c in docs_of for c in plain)
    shaped = [_context_for(e.task, e, by_group, random.Random(i), three) for i, e in enumerate(eps)]
    blocks = [(e, c) for e, c in zip(eps, shaped) if c is not None]
    assert len(blocks) > len(eps) // 2
    other_groups = 0
    for e, c in blocks:
        parts = [docs_of[d] for d in c.split("\n\n")]  # every part is one whole solved task
        assert len(parts) == 3 and e.task.group_id in parts
        assert format_trace(e.task, e.turns) not in c  # never the task's own solution
        other_groups += sum(g != e.task.group_id for g in parts)
    assert 0 < other_groups < 2 * len(blocks)
    with pytest.raises(ValueError, match="retrieved_docs"):
        WarmStartConfig(retrieved_docs=0)

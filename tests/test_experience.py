"""Experience bank and retrieval: leak-freedom, self-exclusion, persistence, the encoder
against sentence-transformers, and that retrieval finds the experience a task lacks."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from methods.experience import BankConfig, ExperienceBank, LeakError
from methods.experience.encoder import TextEncoder
from tasks.base import get_domain


@pytest.fixture(scope="module")
def encoder():
    return TextEncoder()


def _expert_items(domain, tasks):
    out = []
    for t in tasks:
        ep = domain.expert_trajectory(t)
        out.append((t, ep.turns, ep.reward()))
    return out


def test_encoder_matches_sentence_transformers(encoder):
    from sentence_transformers import SentenceTransformer

    from methods.experience.encoder import default_model_path

    texts = [
        "env: bank-3\ntools: bal(id) put(n,id)\nDeposit 40 for Mara Velk.",
        "def f(xs):\n    return [x * 3 for x in xs]",
        "short",
        "a " * 400,
    ]
    ref = SentenceTransformer(str(default_model_path()), device="cpu").encode(texts, normalize_embeddings=True)
    got = encoder.encode(texts)
    assert got.shape == (4, 384)
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert np.allclose(got, ref, atol=1e-4)
    # queries are cached by text and equal to a fresh encoding
    n = encoder.texts_encoded
    q1 = encoder.encode_query(texts[:2])
    q2 = encoder.encode_query(texts[:2][::-1])
    assert encoder.texts_encoded == n + 2 and np.allclose(q1, q2[::-1]) and np.allclose(q1, got[:2], atol=1e-6)


@pytest.mark.parametrize("domain_name", ["tooluse", "code"])
def test_test_split_tasks_never_enter_the_bank(domain_name, encoder):
    domain = get_domain(domain_name, seed=0)
    bank = ExperienceBank(BankConfig(), encoder)
    test_items = _expert_items(domain, domain.tasks("test", 3))
    assert all(r == 1.0 for _, _, r in test_items)  # they would qualify by reward
    with pytest.raises(LeakError, match="only training-split"):
        bank.add(test_items, step=0)
    with pytest.raises(LeakError):  # not even mixed into a batch of training tasks
        bank.add(_expert_items(domain, domain.tasks("train", 2)) + test_items[:1], step=0)
    assert len(bank) == 0 and len(bank.index) == 0
    bank.add(_expert_items(domain, domain.tasks("train", 4)), step=0)
    bank.freeze()
    with pytest.raises(RuntimeError, match="frozen"):
        bank.add(_expert_items(domain, domain.tasks("train", 8)[4:]), step=1)
    assert len(bank) == 4


def test_a_task_never_retrieves_its_own_trajectory_unless_allowed(encoder):
    domain = get_domain("tooluse", seed=0)
    tasks = domain.tasks("train", 40)
    items = _expert_items(domain, tasks)
    bank = ExperienceBank(BankConfig(), encoder)
    assert bank.add(items, step=0) == 40
    for task, hits in zip(tasks, bank.retrieve(tasks, 3)):
        assert len(hits) == 3 and task.task_id not in {e.task_id for e in hits}
    # with the reference code's flag, a task's own trajectory is its nearest neighbour
    opt_in = ExperienceBank(BankConfig(), encoder, allow_self_retrieval=True)
    opt_in.add(items, step=0)
    own_first = sum(h[0].task_id == t.task_id for t, h in zip(tasks, opt_in.retrieve(tasks, 3)))
    assert own_first >= 0.9 * len(tasks)


def test_admission_threshold_per_task_cap_and_empty_bank(encoder):
    domain = get_domain("tooluse", seed=0)
    t = domain.tasks("train", 1)[0]
    turns = domain.expert_trajectory(t).turns
    bank = ExperienceBank(BankConfig(success_threshold=1.0, max_per_task=1), encoder)
    assert bank.retrieve([t], 3) == [[]]
    assert bank.add([(t, turns, 0.75)], step=0) == 0  # partial success stays out
    assert bank.add([(t, turns, 1.0), (t, turns, 1.0)], step=0) == 1  # one per task
    assert bank.stats()["rejected"] == {"below_threshold": 1, "task_full": 1}
    assert bank.retrieve([t], 3) == [[]]  # its only entry is its own


def test_seeding_retries_only_the_tasks_without_a_success(encoder):
    """pass@k seeding: attempt k+1 replays exactly the tasks that no earlier attempt solved, a task
    keeps its first success, and the rollouts of each attempt are counted."""
    domain = get_domain("tooluse", seed=0)
    tasks = domain.tasks("train", 12)
    expert = {t.task_id: domain.expert_trajectory(t).turns for t in tasks}
    solves_at = {t.task_id: i % 4 for i, t in enumerate(tasks)}  # attempt that succeeds (3: never, with 3 attempts)
    played, calls = [], collections.Counter()

    class R:  # the two fields add_rollouts reads
        def __init__(self, task, reward):
            self.task, self.reward = task, reward
            self.episode = type("E", (), {"turns": expert[task.task_id]})()

    def play(chunk):
        played.append([t.task_id for t in chunk])
        out = []
        for t in chunk:
            out.append(R(t, 1.0 if calls[t.task_id] == solves_at[t.task_id] else 0.0))
            calls[t.task_id] += 1
        return out

    bank = ExperienceBank(BankConfig(), encoder)
    progress = []
    per_attempt = bank.seed(tasks, play, attempts=3, chunk=5, progress=lambda *a: progress.append(a))
    assert per_attempt == [12, 9, 6]  # a quarter of the tasks solved at each attempt
    assert [len(c) for c in played] == [5, 5, 2, 5, 4, 5, 1]  # chunks of at most 5 per attempt
    assert sum(played[3:5], []) == [t.task_id for t in tasks if solves_at[t.task_id] > 0]
    assert len(bank) == 9 and {e.task_id for e in bank.items} == {t for t, k in solves_at.items() if k < 3}
    assert progress[-1] == (2, 6, 6) and bank.stats()["items_per_group"]["max"] >= 1
    # one attempt plays every task once, whatever it scores
    one = ExperienceBank(BankConfig(), encoder)
    calls.clear()
    assert one.seed(tasks, play, attempts=1) == [12] and len(one) == 3


def test_state_roundtrip_restores_identical_retrieval(encoder, tmp_path):
    domain = get_domain("code", seed=0)
    bank = ExperienceBank(BankConfig(), encoder)
    bank.add(_expert_items(domain, domain.tasks("train", 30)), step=3)
    queries = domain.tasks("test", 10)
    before = bank.retrieve(queries, 3)
    bank.save(tmp_path / "bank.pt")
    restored = ExperienceBank(BankConfig(), encoder).load(tmp_path / "bank.pt")
    assert restored.retrieve(queries, 3) == before and restored.stats() == bank.stats()
    assert not (tmp_path / "bank.pt.tmp").exists()


@pytest.mark.slow
@pytest.mark.parametrize("domain_name, min_ratio", [("tooluse", 20), ("code", 5)])
def test_retrieval_finds_same_group_experience_far_above_chance(domain_name, min_ratio, encoder):
    """A held-out task's neighbours come from its own variant/family (what the task line lacks)."""
    domain = get_domain(domain_name, seed=0)
    bank = ExperienceBank(BankConfig(), encoder)
    bank.add(_expert_items(domain, domain.tasks("train", 600)), step=0)
    groups = collections.Counter(e.group_id for e in bank.items)
    test = [t for t in domain.tasks("test", 200) if groups[t.group_id] > 0][:80]
    hits = bank.retrieve(test, 3)
    same = sum(e.group_id == t.group_id for t, h in zip(test, hits) for e in h) / sum(len(h) for h in hits)
    chance = sum(groups[t.group_id] for t in test) / len(test) / len(bank)
    assert same >= min_ratio * chance, (same, chance)


def test_retrieve_each_repeats_per_task_and_counts_same_group(encoder):
    from methods.experience.bank import same_group_share
    from tasks.base import get_domain

    domain = get_domain("tooluse", seed=0)
    bank = ExperienceBank(BankConfig(), encoder)
    bank.add(_expert_items(domain, domain.tasks("train", 30)), step=0)
    q = domain.tasks("train", 60)[40:43]
    each = bank.retrieve_each([q[0], q[1], q[0], q[2]], 3)
    assert each[0] == each[2] and each[:2] + each[3:] == bank.retrieve(q, 3)[:2] + bank.retrieve(q, 3)[2:]
    share = same_group_share(q, bank.retrieve(q, 3))
    want = sum(e.group_id == t.group_id for t, h in zip(q, bank.retrieve(q, 3)) for e in h) / 9
    assert share == want

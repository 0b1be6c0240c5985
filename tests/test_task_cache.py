"""The on-disk cache of generated splits (tasks/cache.py): a hit returns what was stored, a change
of the generating sources or an unreadable file builds again, and cached splits equal fresh ones."""

from __future__ import annotations

import pytest

from tasks.base import get_domain
from tasks.cache import cached


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOPD_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_hit_returns_the_stored_value_and_a_source_change_builds_again(cache):
    calls = []

    def build():
        calls.append(1)
        return {"tasks": [1, 2, 3]}

    assert cached("k", ("a", 1), "src1", build) == {"tasks": [1, 2, 3]}
    assert cached("k", ("a", 1), "src1", build) == {"tasks": [1, 2, 3]} and len(calls) == 1
    cached("k", ("a", 2), "src1", build)  # another key
    cached("k", ("a", 1), "src2", build)  # the generator's source changed
    assert len(calls) == 3 and len(list((cache / "k").glob("*.pkl"))) == 3


def test_an_unreadable_file_is_built_again(cache):
    cached("k", 0, "s", lambda: [1])
    (path,) = (cache / "k").glob("*.pkl")
    path.write_bytes(b"not a pickle")
    assert cached("k", 0, "s", lambda: [2]) == [2]
    assert cached("k", 0, "s", lambda: [3]) == [2]  # rewritten whole


def test_off_builds_every_time(monkeypatch, tmp_path):
    monkeypatch.setenv("LOPD_CACHE_DIR", "off")
    calls = []
    for _ in range(2):
        cached("k", 0, "s", lambda: calls.append(1))
    assert len(calls) == 2


@pytest.mark.parametrize("name", ["code", "tooluse"])
def test_cached_training_splits_equal_generated_ones(name, cache, monkeypatch):
    first = get_domain(name, seed=3).tasks("train")  # generated, stored
    again = get_domain(name, seed=3).tasks("train")  # read back
    monkeypatch.setenv("LOPD_CACHE_DIR", "off")
    fresh = get_domain(name, seed=3).tasks("train")
    assert first == again == fresh and len(list(cache.rglob("*.pkl"))) == 1

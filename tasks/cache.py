"""An on-disk cache for deterministic, expensive task generation.

Every job of the pipeline builds its domain's splits again: the code domain's 5,000 training
tasks take 2.7 s to generate (their hidden tests) and 0.1 s to unpickle, and a smoke-profile
training job does about 2 s of work (docs/decisions.md, "Job start").  A result is stored under a
key that hashes the caller's arguments *and the source of the modules that generate it*, so an
edit to a generator never reads a stale split.  Files are written to a temporary name and renamed,
so concurrent jobs and interrupted writes leave either nothing or a whole file; a file that
cannot be read is regenerated.

The directory is ``$LOPD_CACHE_DIR``, else ``$XDG_CACHE_HOME/lopd-bench``, else
``~/.cache/lopd-bench``; ``LOPD_CACHE_DIR=off`` turns the cache off.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

__all__ = ["cache_dir", "cached", "source_digest"]


def cache_dir() -> Path | None:
    """Where cached results live (None: the cache is off)."""
    env = os.environ.get("LOPD_CACHE_DIR")
    if env == "off":
        return None
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lopd-bench"


def source_digest(files: Iterable[Path]) -> str:
    """A digest of the files' names and bytes: part of every key of what they generate."""
    h = hashlib.sha256()
    for f in sorted(Path(p) for p in files):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def cached(kind: str, key: Any, sources: str, build: Callable[[], Any]) -> Any:
    """``build()``, or what an earlier call with the same ``kind``, ``key`` (its repr) and
    ``sources`` digest stored."""
    root = cache_dir()
    if root is None:
        return build()
    digest = hashlib.sha256(f"{kind}\0{key!r}\0{sources}".encode()).hexdigest()[:32]
    path = root / kind / f"{digest}.pkl"
    try:
        return pickle.loads(path.read_bytes())
    except Exception:  # absent, or unreadable (truncated by a full disk, another pickle protocol): build it
        pass
    value = build()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{digest}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
    except OSError:  # a read-only or full cache directory costs time, never a result
        pass
    return value

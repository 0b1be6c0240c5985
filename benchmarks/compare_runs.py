"""Check: two trees of runs are bit-identical (metrics, optionally checkpoints); all IDENTICAL (exit 0) passes.

Are two trees of runs the same science?  Every run's metrics compared record by record, timings left out.

    python benchmarks/compare_runs.py /tmp/before/results/smoke/runs results/smoke/runs
    python benchmarks/compare_runs.py OLD NEW --methods grpo opsd   # only these methods
    python benchmarks/compare_runs.py OLD NEW --checkpoints         # and every tensor of checkpoint.pt

For each ``<domain>/<method>/seed<S>/metrics.jsonl`` present in the first tree, the
same file of the second is read and every record compared key by key, except
wall-clock fields (``*_s``, ``wall_s``, ``eval_wall_s``): a change that should not
touch a method (a refactor, another method's fix) must leave these bit-identical.
With ``--checkpoints``, each run's ``checkpoint.pt`` is loaded from both trees and every
tensor in it compared bit for bit (``torch.equal``, dtype and shape included), other values
with ``==``, except the code-and-settings fingerprint that a resumed run checks (it changes with
every commit by design).  Prints one line per run (IDENTICAL, DIFFER with the first differing key, or
MISSING) and exits 1 if any run listed differs or is missing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _timing(key: str) -> bool:
    return key.endswith("_s")


def records(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            out.append({k: v for k, v in json.loads(line).items() if not _timing(k)})
    return out


def first_difference(a: list[dict], b: list[dict]) -> str | None:
    if len(a) != len(b):
        return f"{len(a)} records against {len(b)}"
    for i, (x, y) in enumerate(zip(a, b)):
        for k in sorted(set(x) | set(y)):
            if x.get(k, "<absent>") != y.get(k, "<absent>"):
                return f"record {i} (step {x.get('step')}), {k}: {x.get(k, '<absent>')} against {y.get(k, '<absent>')}"
    return None


#: checkpoint entries that identify the code and settings a run was made with (a resumed run checks them), not
#: what it learned: they change with every commit by design
PROVENANCE = {"fingerprint"}


def first_tensor_difference(a, b, where: str = "") -> str | None:
    """The first place where two loaded checkpoints differ (tensors bit for bit), or None."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        same = (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a, b)
        )
        return None if same else f"tensor {where or '<root>'}"
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return f"keys of {where or '<root>'}: {sorted(map(str, set(a) ^ set(b)))[:3]}"
        for k in a:
            diff = first_tensor_difference(a[k], b[k], f"{where}.{k}" if where else str(k))
            if diff:
                return diff
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return f"length of {where or '<root>'}"
        for i, (x, y) in enumerate(zip(a, b)):
            diff = first_tensor_difference(x, y, f"{where}[{i}]")
            if diff:
                return diff
        return None
    if _timing(where.rsplit(".", 1)[-1]) or where in PROVENANCE:
        return None
    return None if a == b else f"value {where or '<root>'}: {a!r} against {b!r}"


def checkpoint_difference(old: Path, new: Path) -> str | None:
    import torch

    if not old.exists():
        return None
    if not new.exists():
        return f"{new.name} missing"
    load = lambda path: torch.load(path, map_location="cpu", weights_only=False)  # noqa: E731
    diff = first_tensor_difference(load(old), load(new))
    return None if diff is None else f"{old.name}: {diff}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("old", type=Path, help="runs directory (<domain>/<method>/seed<S>/metrics.jsonl)")
    p.add_argument("new", type=Path)
    p.add_argument("--methods", nargs="*", help="only these methods (run names); default every run of OLD")
    p.add_argument("--checkpoints", action="store_true", help="compare every tensor of each run's checkpoint.pt too")
    a = p.parse_args(argv)
    bad = 0
    paths = sorted(a.old.glob("*/*/seed*/metrics.jsonl"))
    if not paths:
        p.error(f"{a.old}: no <domain>/<method>/seed<S>/metrics.jsonl")
    for old in paths:
        rel = old.relative_to(a.old)
        if a.methods and rel.parts[1] not in a.methods:
            continue
        new = a.new / rel
        if not new.exists():
            print(f"MISSING   {rel}")
            bad += 1
            continue
        diff = first_difference(records(old), records(new))
        if diff is None and a.checkpoints:
            diff = checkpoint_difference(old.parent / "checkpoint.pt", new.parent / "checkpoint.pt")
        print(f"{'IDENTICAL' if diff is None else 'DIFFER   '} {rel}{'' if diff is None else ': ' + diff}")
        bad += diff is not None
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

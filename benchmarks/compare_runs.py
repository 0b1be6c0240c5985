"""Are two trees of runs the same science?  Every run's metrics compared record by record, timings left out.

    python benchmarks/compare_runs.py /tmp/before/results/smoke/runs results/smoke/runs
    python benchmarks/compare_runs.py OLD NEW --methods grpo opsd   # only these methods

For each ``<domain>/<method>/seed<S>/metrics.jsonl`` present in the first tree, the
same file of the second is read and every record compared key by key, except
wall-clock fields (``*_s``, ``wall_s``, ``eval_wall_s``): a change that should not
touch a method (a refactor, another method's fix) must leave these bit-identical.
Prints one line per run (IDENTICAL, DIFFER with the first differing key, or MISSING)
and exits 1 if any run listed differs or is missing.
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("old", type=Path, help="runs directory (<domain>/<method>/seed<S>/metrics.jsonl)")
    p.add_argument("new", type=Path)
    p.add_argument("--methods", nargs="*", help="only these methods (run names); default every run of OLD")
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
        print(f"{'IDENTICAL' if diff is None else 'DIFFER   '} {rel}{'' if diff is None else ': ' + diff}")
        bad += diff is not None
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

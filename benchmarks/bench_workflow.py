"""Target (issue 21): parse <= 2 s, quick loop <= 2 min, smoke Table 1 < 2 min, 2 cores; read each seconds.

Wall times of the workflow itself, each from a fresh clone of the current commit: how long
Snakemake takes to parse the grid, how long the quick test loop takes, and how long the smoke
profile takes to build Table 1.  Issue 21's targets: parse at most 2 s, quick loop at most 2
minutes, smoke Table 1 under 2 minutes, all on 2 cores.

    python benchmarks/bench_workflow.py                    # parse time only (a minute)
    python benchmarks/bench_workflow.py --quick --smoke    # all three (about 5 minutes)

- **parse**: ``snakemake -n results/table1.csv``, ``--repeats`` times, each run beside a run of a
  one-rule Snakefile (Snakemake's own start, which varies by several tenths of a second between
  runs on a shared machine, so the two are interleaved and both reported);
- **quick**: README's quick loop, ``python -m pytest -q -n 2 -m "not slow"``;
- **smoke**: ``snakemake --cores 2 results/smoke/table1.csv --config profile=smoke`` with an
  empty task cache (``LOPD_CACHE_DIR`` in a temporary directory) and a new fork server (the
  clone's path is part of its key), i.e. what a first run on a fresh machine pays.

Uncommitted changes are not measured (the clone is of HEAD).  Run it on idle cores.  Prints one
JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ONE_RULE = 'rule all:\n    output: "x"\n    shell: "touch x"\n'


def _timed(cmd: list[str], cwd: Path, env: dict | None = None) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    return time.perf_counter() - t0, res


def _summary(xs: list[float]) -> dict:
    return {"min": round(min(xs), 2), "median": round(statistics.median(xs), 2), "max": round(max(xs), 2)}


def parse_times(clone: Path, repeats: int) -> dict:
    one_rule = clone.parent / "one_rule"
    one_rule.mkdir()
    (one_rule / "Snakefile").write_text(ONE_RULE)
    ours, floor = [], []
    for _ in range(repeats):
        t, res = _timed(["snakemake", "-n", "-q"], one_rule)
        floor.append(t)
        t, res = _timed(["snakemake", "-n", "results/table1.csv"], clone)
        if res.returncode:
            raise SystemExit(f"snakemake -n failed:\n{res.stderr[-2000:]}")
        ours.append(t)
    return {
        "command": "snakemake -n results/table1.csv",
        "seconds": _summary(ours),
        "one_rule_snakefile_seconds": _summary(floor),
        "runs": [round(t, 2) for t in ours],
        "one_rule_runs": [round(t, 2) for t in floor],
    }


def quick_time(clone: Path) -> dict:
    cmd = [sys.executable, "-m", "pytest", "-q", "-n", "2", "-m", "not slow"]
    t, res = _timed(cmd, clone)
    if res.returncode:
        raise SystemExit(f"the quick loop failed:\n{res.stdout[-3000:]}")
    return {"command": " ".join(cmd[1:]), "seconds": round(t, 1), "result": res.stdout.strip().splitlines()[-1]}


def smoke_time(clone: Path) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "LOPD_CACHE_DIR": cache}
        cmd = ["snakemake", "--cores", "2", "results/smoke/table1.csv", "--config", "profile=smoke"]
        t, res = _timed(cmd, clone, env)
    if res.returncode:
        raise SystemExit(f"the smoke pipeline failed:\n{res.stderr[-3000:]}")
    done = [line for line in res.stderr.splitlines() if "steps (100%) done" in line]
    return {
        "command": " ".join(cmd),
        "seconds": round(t, 1),
        "jobs": done[-1].split(" of ")[-1].split()[0] if done else None,
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5, help="parse runs (each beside a one-rule Snakefile run)")
    p.add_argument("--quick", action="store_true", help="also time README's quick test loop")
    p.add_argument("--smoke", action="store_true", help="also time the smoke profile's Table 1")
    args = p.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    with tempfile.TemporaryDirectory() as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        out = {"commit": commit.stdout.strip(), "cores": os.cpu_count(), "parse": parse_times(clone, args.repeats)}
        if args.quick:
            print("timing the quick test loop ...", file=sys.stderr)
            out["quick"] = quick_time(clone)
        if args.smoke:
            print("timing the smoke Table 1 ...", file=sys.stderr)
            out["smoke"] = smoke_time(clone)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

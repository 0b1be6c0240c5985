"""Target: small-profile Table 1 in <= 45 min on 2 cores (estimated); table1.meets_target true meets it.

Wall time of the whole small-profile pipeline on N cores (target: Table 1 in <= 45 minutes on 2),
from the job wall times the pipeline's own outputs record.

    python benchmarks/pipeline_time.py                       # results/small, 2 cores
    python benchmarks/pipeline_time.py --cores 2 --profile small --top 12

Every job writes its wall time beside its result: the warm start (``eval.json``:
``wall_s``), the seeded bank (``bank.json``: ``wall_s``), LOPD's cold start
(``coldstart.json``: ``train_s``, its training loop only) and every run (the last
``wall_s`` of ``metrics.jsonl``: training and evaluations, not the process start).
This script rebuilds the job graph from ``config/config.yaml`` (warm start ->
bank -> cold start -> run, as the Snakefile wires them) and schedules those
durations on ``--cores`` single-thread slots, longest ready job first, which is
close to what ``snakemake --cores N`` does.  The result is an **estimate**
assembled from the runs that produced ``results/`` (recorded on this 2-core
machine, often with a second job beside them), not one timed clean run; jobs
missing from ``results/`` are listed and left out.  Model loading and process
start (a few seconds per job) are not in the recorded times.

Prints one JSON object: the makespan for Table 1 alone and for the report
(Table 1 + the ablations), CPU-seconds per rule, and the slowest jobs.
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def _run_wall(path: Path) -> float | None:
    if not path.exists():
        return None
    walls = [json.loads(x).get("wall_s") for x in path.read_text().splitlines() if x.strip()]
    walls = [w for w in walls if w is not None]
    return max(walls) if walls else None


def job_graph(config: dict, out: Path, with_ablations: bool) -> tuple[dict, dict, list]:
    """(durations, dependencies, missing) of the jobs a target needs."""
    from methods.core.config import cold_start_key, profile_section, uses_bank

    seeds = profile_section(config)["seeds"]
    methods = list(config["methods"])
    ablations = list(config.get("ablations") or {}) if with_ablations else []
    abl_domains = list(config.get("ablation_domains") or config["domains"])
    dur, deps, missing = {}, {}, []

    def add(job, seconds, needs):
        if seconds is None:
            missing.append(job)
            seconds = 0.0
        dur[job] = float(seconds)
        deps[job] = needs

    for d in config["domains"]:
        names = methods + ([m for m in ablations] if d in abl_domains else [])
        ws = ("warmstart", d)  # one base policy and one bank per domain
        base = _json(out / f"warmstart/{d}/eval.json")
        shipped = _json(ROOT / "results" / "base" / out.name / d / "eval.json")
        # an installed base is a copy of the shipped one (its wall_s is the build's): seconds, not the build
        add(ws, 0.0 if base is not None and base == shipped else (base or {}).get("wall_s"), [])
        if any(uses_bank(config, m) for m in names):
            add(("bank", d), (_json(out / f"bank/{d}/bank.json") or {}).get("wall_s"), [ws])
            ev = _json(out / f"bank/{d}/eval_retrieved.json")
            add(("retrieved_eval", d), ev.get("eval_s") if ev else None, [("bank", d)])
        for s in seeds:
            for m in names:
                needs = [ws]
                if uses_bank(config, m):
                    needs += [("bank", d), ("retrieved_eval", d)]
                key = cold_start_key(config, d, m)
                if key:
                    cs = ("coldstart", d, key, s)
                    if cs not in dur:
                        rep = _json(out / f"coldstart/{d}/{key}/seed{s}/coldstart.json") or {}
                        add(
                            cs, 0.0 if rep.get("steps") == 0 else rep.get("train_s"), [("bank", d)]
                        )  # empty bank: no training
                    needs.append(cs)
                add(("train", d, m, s), _run_wall(out / f"runs/{d}/{m}/seed{s}/metrics.jsonl"), needs)
    return dur, deps, missing


def makespan(dur: dict, deps: dict, cores: int) -> float:
    """Greedy list schedule: whenever a slot is free, start the longest job whose inputs exist."""
    children: dict = {j: [] for j in dur}
    waiting = {j: len(deps[j]) for j in dur}
    for j, ds in deps.items():
        for p in ds:
            children[p].append(j)
    ready = [(-dur[j], str(j), j) for j in dur if waiting[j] == 0]
    heapq.heapify(ready)
    running: list = []  # (finish time, name, job)
    now, free = 0.0, cores
    while ready or running:
        while ready and free:
            _, name, j = heapq.heappop(ready)
            heapq.heappush(running, (now + dur[j], name, j))
            free -= 1
        now, _, j = heapq.heappop(running)
        free += 1
        for c in children[j]:
            waiting[c] -= 1
            if waiting[c] == 0:
                heapq.heappush(ready, (-dur[c], str(c), c))
    return now


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        prog="python benchmarks/pipeline_time.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--profile", default="small")
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--top", type=int, default=10, help="how many of the slowest jobs to list")
    a = p.parse_args(argv)
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["profile"] = a.profile
    out = ROOT / "results" / a.profile
    result = {
        "profile": a.profile,
        "cores": a.cores,
        "target_s": 2700,
        "source": "recorded job wall times, list-scheduled (an estimate)",
    }
    for name, abl in (("table1", False), ("report", True)):
        dur, deps, missing = job_graph(config, out, abl)
        span = makespan(dur, deps, a.cores)
        per_rule: dict = {}
        for j, s in dur.items():
            per_rule[j[0]] = per_rule.get(j[0], 0.0) + s
        result[name] = {
            "jobs": len(dur),
            "cpu_s": round(sum(dur.values()), 1),
            "makespan_s": round(span, 1),
            "makespan_min": round(span / 60, 1),
            "meets_target": span <= result["target_s"],
            "cpu_s_by_rule": {k: round(v, 1) for k, v in sorted(per_rule.items(), key=lambda kv: -kv[1])},
            "missing_jobs": ["/".join(map(str, j)) for j in missing],
        }
        if abl:
            result["slowest_jobs"] = [
                {"job": "/".join(map(str, j)), "s": round(s, 1)}
                for j, s in sorted(dur.items(), key=lambda kv: -kv[1])[: a.top]
            ]
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

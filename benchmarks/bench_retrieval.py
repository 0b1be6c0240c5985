"""No stated target: measures the bank's embedding rate, search latency by size and share of a step (JSON).

Speed of the experience bank: embedding throughput, retrieval latency at bank sizes
1k / 10k / 100k, and the share of a retrieval-RL training step spent on retrieval.

    python benchmarks/bench_retrieval.py [--run results/small/runs/tooluse/retrieval_rl/seed0]

Embeddings are all-MiniLM-L6-v2 on one thread (the jobs' setting).  Documents
are the expert trajectories of real training tasks (task + trace, as the bank
embeds them); queries are task texts.  Banks of 10k and 100k entries are the
1k real document vectors repeated with small noise (re-normalised): search
cost depends only on the count and the dimension.  With ``--run``, the share
of the run's step time spent on retrieval and bank growth is read from its
``metrics.jsonl`` (``retrieval_s`` + ``bank_add_s`` over the step's wall time).
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _per_second(fn, n_items: int, repeat: int = 1) -> float:
    fn()  # warm-up
    t = time.perf_counter()
    for _ in range(repeat):
        fn()
    return n_items * repeat / (time.perf_counter() - t)


def main(argv=None) -> None:
    from methods.experience.encoder import TextEncoder
    from methods.experience.index import VectorIndex
    from tasks.base import format_trace, get_domain

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--domain", default="tooluse")
    p.add_argument("--docs", type=int, default=1000)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--run", help="a retrieval_rl run directory (its metrics.jsonl gives the step-time share)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    domain = get_domain(a.domain, seed=0)
    tasks = domain.tasks("train", a.docs)
    docs = [format_trace(t, domain.expert_trajectory(t).turns) for t in tasks]
    queries = [t.prompt for t in domain.tasks("test", 256)]
    enc = TextEncoder()
    out: dict = {"domain": a.domain, "threads": a.threads, "dim": enc.dim}
    t = time.perf_counter()
    vecs = enc.encode(docs)
    out["embed_docs_per_s"] = round(len(docs) / (time.perf_counter() - t), 1)
    out["embed_queries_per_s"] = round(_per_second(lambda: enc.encode(queries), len(queries)), 1)
    out["embed_query_single_ms"] = round(1000 / _per_second(lambda: enc.encode(queries[:1]), 1, repeat=20), 2)
    rng = np.random.default_rng(0)
    qv = enc.encode(queries[:32])
    latency = {}
    for size in (1_000, 10_000, 100_000):
        reps = -(-size // len(vecs))
        bank = np.tile(vecs, (reps, 1))[:size] + rng.normal(0, 0.02, (size, vecs.shape[1])).astype(np.float32)
        bank /= np.linalg.norm(bank, axis=1, keepdims=True)
        index = VectorIndex(enc.dim)
        t = time.perf_counter()
        index.add(bank)
        add_s = time.perf_counter() - t
        one = 1000 / _per_second(lambda index=index: index.search(qv[:1], 4), 1, repeat=50)
        batch = 1000 / _per_second(lambda index=index: index.search(qv, 4), len(qv), repeat=10)
        latency[str(size)] = {
            "search_ms_single_query": round(one, 3),
            "search_ms_per_query_batch32": round(batch, 3),
            "add_s": round(add_s, 3),
        }
    out["retrieval"] = latency
    if a.run:
        recs = [json.loads(x) for x in (Path(a.run) / "metrics.jsonl").read_text().splitlines() if x.strip()]
        steps = [r for r in recs if r["kind"] == "train"]
        ret = sum(r.get("retrieval_s", 0) + r.get("bank_add_s", 0) for r in steps)
        wall = sum(r["rollout_s"] + r["update_s"] + r.get("retrieval_s", 0) for r in steps)
        out["run"] = {
            "path": a.run,
            "steps": len(steps),
            "retrieval_and_bank_s": round(ret, 2),
            "step_s": round(wall, 2),
            "share_of_step_time": round(ret / max(wall, 1e-9), 4),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()

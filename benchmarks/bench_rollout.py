"""Rollout-engine throughput: rollouts/s and generated tokens/s on a warm start.

    python benchmarks/bench_rollout.py --warmstart results/small/warmstart/tooluse/seed0 --domain tooluse

Prints one JSON line per batch size.  Uses the small profile's sampling
settings (temperature 1) and one torch thread unless told otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> None:
    from methods.core.policy import count_parameters, load_policy
    from methods.core.rollout import SamplingConfig, run_episodes
    from methods.core.tokenizer import ChatEncoder
    from tasks.base import get_domain

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--warmstart", required=True, help="warm start directory (holds model/)")
    p.add_argument("--domain", required=True)
    p.add_argument("--batch", type=int, nargs="+", default=[32, 64, 128])
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    model, tok = load_policy(Path(a.warmstart) / "model")
    model.eval()
    enc = ChatEncoder(tok)
    domain = get_domain(a.domain, seed=0)
    tasks = domain.tasks("train", max(a.batch) * a.repeats)
    cfg = SamplingConfig(temperature=1.0, max_new_tokens=a.max_new_tokens)
    run_episodes(model, enc, domain, tasks[:8], None, cfg, torch.Generator().manual_seed(0))  # warm-up
    for b in a.batch:
        t0 = time.perf_counter()
        n = toks = 0
        for r in range(a.repeats):
            rs = run_episodes(model, enc, domain, tasks[r * b : (r + 1) * b], None, cfg, torch.Generator().manual_seed(r), batch_size=b)
            n += len(rs)
            toks += sum(x.generated_tokens for x in rs)
        dt = time.perf_counter() - t0
        print(json.dumps({"domain": a.domain, "batch": b, "threads": a.threads, "parameters": count_parameters(model), "rollouts_per_s": round(n / dt, 1), "generated_tokens_per_s": round(toks / dt, 1), "tokens_per_rollout": round(toks / n, 1)}))
    domain.close()


if __name__ == "__main__":
    main()

"""No stated target: measures the rollout engine's rollouts/s and tokens/s per batch size (higher is faster).

Rollout-engine throughput: rollouts/s and generated tokens/s on a warm start.

    python benchmarks/bench_rollout.py --warmstart results/small/warmstart/tooluse --domain tooluse

Prints one JSON line per batch size.  Uses the small profile's sampling
settings (temperature 1) and one torch thread unless told otherwise.

``--compare-reprefill`` also times the engine's predecessor on the same tasks,
which re-encoded the whole conversation every turn instead of keeping the KV
cache across turns (reimplemented here, as the peer of the ratio).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def reprefill_episodes(model, enc, domain, tasks, cfg, generator):
    """Multi-turn episodes that re-prefill the whole conversation every turn
    (the previous engine): the baseline of the KV-reuse ratio."""
    from methods.core.rollout import initial_prompt_ids, sample

    episodes = [domain.reset(t) for t in tasks]
    ids = [initial_prompt_ids(enc, domain, t, None) for t in tasks]
    active = list(range(len(tasks)))
    toks = 0
    while active:
        gens = sample(
            model, [ids[i] for i in active], enc.eos_id, enc.pad_id, cfg.max_new_tokens, cfg.temperature, generator
        )
        results = domain.step_batch([episodes[i] for i in active], [enc.decode(g) for g in gens])
        still = []
        for i, g, res in zip(active, gens, results):
            ids[i] += g
            toks += len(g)
            if (
                res.done
                or episodes[i].done
                or len(episodes[i].turns) >= tasks[i].max_turns
                or len(ids[i]) >= cfg.max_seq_len
            ):
                continue
            close = [] if ids[i][-1] == enc.eos_id else [enc.eos_id]
            ids[i] += (
                close + enc.after_assistant() + enc.message("tool", res.observation or "") + enc.header("assistant")
            )
            still.append(i)
        active = still
    return len(tasks), toks


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
    p.add_argument(
        "--compare-reprefill", action="store_true", help="also time the re-prefill-every-turn engine (ratio)"
    )
    p.add_argument("--profile", default="small", help="profile whose domain options to use")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    model, tok = load_policy(Path(a.warmstart) / "model")
    model.eval()
    enc = ChatEncoder(tok)
    import yaml

    from methods.core.config import resolve_job

    config = yaml.safe_load((Path(__file__).resolve().parents[1] / "config" / "config.yaml").read_text())
    config["profile"] = a.profile
    domain = get_domain(a.domain, seed=0, **resolve_job(config, a.domain)["domain_options"])
    tasks = domain.tasks("train", max(a.batch) * a.repeats)
    cfg = SamplingConfig(temperature=1.0, max_new_tokens=a.max_new_tokens)
    run_episodes(model, enc, domain, tasks[:8], None, cfg, torch.Generator().manual_seed(0))  # warm-up
    for b in a.batch:
        t0 = time.perf_counter()
        n = toks = 0
        for r in range(a.repeats):
            rs = run_episodes(
                model,
                enc,
                domain,
                tasks[r * b : (r + 1) * b],
                None,
                cfg,
                torch.Generator().manual_seed(r),
                batch_size=b,
            )
            n += len(rs)
            toks += sum(x.generated_tokens for x in rs)
        dt = time.perf_counter() - t0
        row = {
            "domain": a.domain,
            "batch": b,
            "threads": a.threads,
            "parameters": count_parameters(model),
            "rollouts_per_s": round(n / dt, 1),
            "generated_tokens_per_s": round(toks / dt, 1),
            "tokens_per_rollout": round(toks / n, 1),
        }
        if a.compare_reprefill:
            t0 = time.perf_counter()
            n2 = 0
            for r in range(a.repeats):
                n2 += reprefill_episodes(
                    model, enc, domain, tasks[r * b : (r + 1) * b], cfg, torch.Generator().manual_seed(r)
                )[0]
            row["reprefill_rollouts_per_s"] = round(n2 / (time.perf_counter() - t0), 1)
            row["speedup_vs_reprefill"] = round(row["rollouts_per_s"] / row["reprefill_rollouts_per_s"], 2)
        print(json.dumps(row))
    domain.close()


if __name__ == "__main__":
    main()

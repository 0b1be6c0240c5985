"""Target: generation at >= 25 % of the fp32 matmul peak. Per batch size, efficiency_vs_peak >= 0.25 meets it.

Generation efficiency: the rollout engine's achieved fp32 FLOP/s against the machine's
measured fp32 matmul peak (target: >= 25 %).

    python benchmarks/bench_generation.py --warmstart results/small/warmstart/code --domain code
    python benchmarks/bench_generation.py --warmstart results/small/warmstart/tooluse --domain tooluse

1. Peak: the best of several ``torch.mm`` timings of square fp32 matrices
   (n = 256 ... 2048) at the same thread count (the job's: 1 by default).
2. Generation: episodes of the domain's training tasks through ``run_episodes`` at
   the training batch (``rollouts_per_step``, 32) and the evaluation batch (200),
   with the profile's sampling settings (temperature 0.7, the domain's
   ``max_new_tokens``).  The FLOPs are counted by ``torch.utils.flop_counter``
   on one identical pass (same tasks, same generator seed), so they include the
   prefill, the padded positions and the KV-cache attention the engine really
   executes; the timing comes from a separate pass without the counter.
   ``useful_gflops`` counts only the textbook 2 x (matmul parameters) per token
   the episodes hold (prompt, observations and generated tokens, each passing the
   model once): the counted FLOPs above it are attention, padding and the
   sampling's extra work.
3. ``model_shape_gflops``: the same peak measurement on the model's own MLP
   shape ([4096, hidden] x [hidden, intermediate]), the best a model this narrow
   can do on this machine.

Prints one JSON line per batch size.  ``--cprofile`` then prints cProfile's top
entries (by own time) for one more batch at the first batch size: where the
generation time goes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def matmul_peak(sizes=(256, 512, 1024, 2048), repeats: int = 5) -> dict:
    """Best fp32 GFLOP/s of torch.mm over ``sizes`` at the current thread count."""
    best = {}
    for n in sizes:
        a, b = torch.randn(n, n), torch.randn(n, n)
        torch.mm(a, b)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            torch.mm(a, b)
            times.append(time.perf_counter() - t0)
        best[n] = 2 * n**3 / min(times) / 1e9
    return {"peak_gflops": round(max(best.values()), 2), "gflops_by_size": {k: round(v, 2) for k, v in best.items()}}


def shape_peak(d: int, ff: int, rows: int = 4096, repeats: int = 5) -> float:
    """Best fp32 GFLOP/s of the model's own MLP matmul shape ([rows, d] x [d, ff]): the ceiling
    a model this narrow can reach on this machine, whatever the engine does."""
    a, b = torch.randn(rows, d), torch.randn(d, ff)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(10):
            torch.mm(a, b)
        best = min(best, (time.perf_counter() - t0) / 10)
    return 2 * rows * d * ff / best / 1e9


def main(argv=None) -> None:
    import yaml
    from torch.utils.flop_counter import FlopCounterMode

    from methods.core.config import resolve_job
    from methods.core.policy import count_parameters, load_policy
    from methods.core.rollout import SamplingConfig, run_episodes
    from methods.core.tokenizer import ChatEncoder
    from tasks.base import get_domain

    p = argparse.ArgumentParser(
        prog="python benchmarks/bench_generation.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--warmstart", required=True, help="warm start directory (holds model/)")
    p.add_argument("--domain", required=True)
    p.add_argument("--batch", type=int, nargs="+", default=[32, 200])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3, help="timed batches per batch size")
    p.add_argument("--profile", default="small")
    p.add_argument(
        "--cprofile", action="store_true", help="print where the time of one batch goes (cProfile, top 12 by own time)"
    )
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    peak = matmul_peak()
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["profile"] = a.profile
    job = resolve_job(config, a.domain, "grpo")
    tr = job["train"]
    cfg = SamplingConfig(
        temperature=tr["temperature"], max_new_tokens=tr["max_new_tokens"], max_seq_len=tr["max_seq_len"]
    )
    model, tok = load_policy(Path(a.warmstart) / "model")
    model.eval()
    enc = ChatEncoder(tok)
    domain = get_domain(a.domain, seed=0, **job["domain_options"])
    peak["model_shape_gflops"] = round(shape_peak(model.config.hidden_size, model.config.intermediate_size), 2)
    matmul_params = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    tasks = domain.tasks("train", max(a.batch) * a.repeats)
    run_episodes(model, enc, domain, tasks[:8], None, cfg, torch.Generator().manual_seed(0))  # warm-up
    for b in a.batch:
        batches = [tasks[r * b : (r + 1) * b] for r in range(a.repeats)]
        with FlopCounterMode(display=False) as fc:
            counted = run_episodes(
                model, enc, domain, batches[0], None, cfg, torch.Generator().manual_seed(0), batch_size=b
            )
        flops = fc.get_total_flops()
        t0 = time.perf_counter()
        first = run_episodes(model, enc, domain, batches[0], None, cfg, torch.Generator().manual_seed(0), batch_size=b)
        t_first = time.perf_counter() - t0
        if [r.ids for r in first] != [r.ids for r in counted]:
            raise RuntimeError(
                "the counted and the timed pass generated different tokens; the FLOP count would not match the timing"
            )
        toks, wall = sum(r.generated_tokens for r in first), t_first
        for r, chunk in enumerate(batches[1:], start=1):
            t0 = time.perf_counter()
            rs = run_episodes(model, enc, domain, chunk, None, cfg, torch.Generator().manual_seed(r), batch_size=b)
            wall += time.perf_counter() - t0
            toks += sum(x.generated_tokens for x in rs)
        achieved = flops / t_first / 1e9
        processed = sum(len(r.ids) for r in first)  # every token of a finished episode passes the model once (KV cache)
        useful = 2 * matmul_params * processed / t_first / 1e9
        print(
            json.dumps(
                {
                    "domain": a.domain,
                    "batch": b,
                    "threads": a.threads,
                    "parameters": count_parameters(model),
                    "matmul_parameters": matmul_params,
                    "generated_tokens_per_s": round(toks / wall, 1),
                    "rollouts_per_s": round(b * a.repeats / wall, 2),
                    "counted_gflop_per_batch": round(flops / 1e9, 3),
                    "achieved_gflops": round(achieved, 3),
                    **peak,
                    "efficiency_vs_peak": round(achieved / peak["peak_gflops"], 4),
                    "target": 0.25,
                    "tokens_processed_per_batch": processed,
                    "useful_gflops": round(useful, 3),
                    "useful_efficiency_vs_peak": round(useful / peak["peak_gflops"], 4),
                    "model_flops_per_token": 2 * matmul_params,
                    "sampling": {"temperature": cfg.temperature, "max_new_tokens": cfg.max_new_tokens},
                }
            )
        )
    if a.cprofile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.runcall(
            run_episodes,
            model,
            enc,
            domain,
            tasks[: a.batch[0]],
            None,
            cfg,
            torch.Generator().manual_seed(0),
            batch_size=a.batch[0],
        )
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(12)
    domain.close()


if __name__ == "__main__":
    main()

"""Target: the engine at >= 2x model.generate's tokens/s on a real model. speedup_tokens_per_s >= 2 meets it.

A real model's generation speed through the suite's rollout engine against ``model.generate``
on the same prompts (issue target: at least 2x generate's tokens/s at batch 32), and the share of
the machine's measured fp32 matmul peak each reaches.

    python -m methods.cli convert-model --model smollm2-135m-instruct --out results/models/smollm2-135m-instruct
    python benchmarks/bench_real_generation.py --model results/models/smollm2-135m-instruct --threads 2

Both decode the same HumanEval prompts (the first ``--batch`` problems, in the model's chat template)
greedily for at most ``--max-new-tokens`` tokens, stopping at ``<|im_end|>``: the same computation,
so their tokens must agree (checked; a mismatch is reported, not hidden).  The engine's time
includes running each answer through the sandbox (the episode's step), which ``generate`` does not
do.  Useful FLOPs are the textbook 2 x (matmul parameters) per token through the model (prompt and
generated); the peak is the best ``torch.mm`` timing at the same thread count
(``benchmarks/bench_generation.py``).

``bound`` is the least time any implementation could take on this machine: the prompts' prefill
at the matmul peak, then one read of every weight per decode step at the measured read bandwidth
(``read_gb_per_s``: a sum over 1 GiB; at batch 32 a decode step moves every weight once and does
little arithmetic per byte).  ``times_the_bound`` is each one's wall time over it: how far from
that floor it is, and so how much room a faster implementation could have.  Prints one JSON object.
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


def read_bandwidth(gib: float = 1.0, repeats: int = 5) -> float:
    """Best GB/s of reading a ``gib``-GiB fp32 tensor once (a sum) at the current thread count."""
    x = torch.ones(int(gib * 2**30) // 4)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return x.numel() * 4 / best / 1e9


def main(argv=None) -> None:
    from bench_generation import matmul_peak

    from methods.core.policy import load_policy
    from methods.core.rollout import SamplingConfig, _left_pad, run_episodes
    from methods.core.tokenizer import ChatEncoder
    from tasks.base import get_domain

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a save_pretrained directory")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    model, tokenizer = load_policy(a.model)
    model.eval()
    enc = ChatEncoder(tokenizer)
    domain = get_domain("humaneval")
    tasks = domain.tasks("test", a.batch)
    cfg = SamplingConfig(temperature=0.0, max_new_tokens=a.max_new_tokens, max_seq_len=4096)
    matmul_params = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))

    run_episodes(model, enc, domain, tasks[:2], None, cfg, torch.Generator().manual_seed(0))  # warm-up
    t0 = time.perf_counter()
    rollouts = run_episodes(model, enc, domain, tasks, None, cfg, torch.Generator().manual_seed(0), batch_size=a.batch)
    t_engine = time.perf_counter() - t0
    engine_new = [r.ids[r.prompt_len : r.prompt_len + r.generated_tokens] for r in rollouts]

    prompts = [r.ids[: r.prompt_len] for r in rollouts]
    ids, mask = _left_pad(prompts, enc.pad_id, "cpu")
    kw = dict(max_new_tokens=a.max_new_tokens, do_sample=False, eos_token_id=enc.eos_id, pad_token_id=enc.pad_id)
    with torch.no_grad():
        model.generate(ids[:2], attention_mask=mask[:2], **{**kw, "max_new_tokens": 4})  # warm-up
        t0 = time.perf_counter()
        out = model.generate(ids, attention_mask=mask, **kw)
    t_generate = time.perf_counter() - t0
    gen_new = []
    for row in out[:, ids.shape[1] :].tolist():
        cut = row.index(enc.eos_id) + 1 if enc.eos_id in row else len(row)
        gen_new.append(row[:cut])
    domain.close()

    peak = matmul_peak()["peak_gflops"]
    bandwidth = read_bandwidth()
    # the least time any implementation needs: prefill at the matmul peak, then one read of every
    # weight per decode step (a decode step at batch 32 is bound by memory, not arithmetic)
    steps = max(len(x) for x in gen_new)
    prefill_s = 2 * matmul_params * sum(len(pr) for pr in prompts) / (peak * 1e9)
    decode_s = steps * 4 * matmul_params / (bandwidth * 1e9)
    bound = prefill_s + decode_s

    def stats(new, wall):
        toks = sum(len(x) for x in new)
        processed = sum(len(pr) for pr in prompts) + toks
        useful = 2 * matmul_params * processed / wall / 1e9
        return {
            "generated_tokens": toks,
            "wall_s": round(wall, 2),
            "tokens_per_s": round(toks / wall, 1),
            "useful_gflops": round(useful, 2),
            "share_of_peak": round(useful / peak, 4),
            "times_the_bound": round(wall / bound, 2),
        }

    engine, generate = stats(engine_new, t_engine), stats(gen_new, t_generate)
    same = sum(x == y for x, y in zip(engine_new, gen_new))
    print(
        json.dumps(
            {
                "model": a.model,
                "batch": a.batch,
                "threads": a.threads,
                "max_new_tokens": a.max_new_tokens,
                "matmul_parameters": matmul_params,
                "peak_gflops": peak,
                "read_gb_per_s": round(bandwidth, 1),
                "bound": {"prefill_s": round(prefill_s, 2), "decode_s": round(decode_s, 2), "decode_steps": steps},
                "engine": engine,
                "generate": generate,
                "speedup_tokens_per_s": round(engine["tokens_per_s"] / generate["tokens_per_s"], 2),
                "target_speedup": 2.0,
                "rows_with_identical_tokens": f"{same}/{len(tasks)}",
            }
        )
    )


if __name__ == "__main__":
    main()

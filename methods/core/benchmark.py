"""A policy's scores on an evaluation-only benchmark domain (HumanEval today): greedy pass@1 and
unbiased pass@k from n samples per problem, through the suite's own rollout engine, so that the
numbers are those a trained run's evaluation would give.

    python -m methods.cli eval-benchmark --model results/models/smollm2-135m-instruct \\
        --domain humaneval --samples 20 --out results/real/vanilla_humaneval.json
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

import torch

from tasks.base import TaskDomain

from .evaluate import mean_se
from .rollout import Rollout, SamplingConfig, run_episodes
from .tokenizer import ChatEncoder

__all__ = ["benchmark_eval"]


def _play(model, encoder, domain, tasks, sampling, batch_size, seed, label) -> tuple[list[Rollout], float]:
    """The episodes of ``tasks``, ``batch_size`` at a time (as ``run_episodes`` batches them, so the
    result is the same), with a progress line per batch."""
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    t0 = time.perf_counter()
    rollouts: list[Rollout] = []
    with torch.no_grad():
        for start in range(0, len(tasks), batch_size):
            chunk = tasks[start : start + batch_size]
            rollouts += run_episodes(model, encoder, domain, chunk, None, sampling, generator=gen, batch_size=batch_size)
            done, elapsed = len(rollouts), time.perf_counter() - t0
            print(
                f"[eval-benchmark] {label}: {done}/{len(tasks)} episodes, {elapsed:.0f} s, "
                f"about {elapsed / done * (len(tasks) - done):.0f} s left",
                file=sys.stderr,
                flush=True,
            )
    return rollouts, time.perf_counter() - t0


def _speed(rollouts: Sequence[Rollout], wall_s: float) -> dict:
    tokens = sum(r.generated_tokens for r in rollouts)
    return {
        "episodes": len(rollouts),
        "generated_tokens": tokens,
        "wall_s": round(wall_s, 2),
        "tokens_per_s": round(tokens / max(wall_s, 1e-9), 1),
        "truncated": sum(r.truncated for r in rollouts),
    }


def benchmark_eval(
    model,
    encoder: ChatEncoder,
    domain: TaskDomain,
    *,
    samples: int = 0,
    ks: Sequence[int] = (1, 10),
    temperature: float = 0.8,
    max_new_tokens: int = 512,
    max_seq_len: int = 2048,
    batch_size: int = 32,
    n_tasks: int | None = None,
    seed: int = 0,
) -> dict:
    """Greedy pass@1 on the first ``n_tasks`` test problems (all by default), and with ``samples`` > 0
    unbiased pass@k for every k in ``ks`` up to ``samples`` from that many samples per problem at
    ``temperature``.  Per-problem greedy answers and verdicts are kept for inspection."""
    from tasks.humaneval import pass_at_k

    was_training = model.training
    model.eval()
    tasks = domain.tasks("test", n_tasks)
    greedy_cfg = SamplingConfig(temperature=0.0, max_new_tokens=max_new_tokens, max_seq_len=max_seq_len)
    greedy, wall = _play(model, encoder, domain, tasks, greedy_cfg, batch_size, seed, f"{domain.name} greedy")
    mean, se = mean_se([r.reward for r in greedy])
    out = {
        "domain": domain.name,
        "domain_version": domain.version,
        "problems": len(tasks),
        "greedy": {"pass@1": mean, "pass@1_se": se, "sampling": vars(greedy_cfg), **_speed(greedy, wall)},
        "problems_greedy": [
            {
                "task_id": r.task.task_id,
                "reward": r.reward,
                "feedback": r.feedback[:300],
                "answer": r.episode.turns[0].action if r.episode.turns else "",
            }
            for r in greedy
        ],
    }
    print(
        f"[eval-benchmark] {domain.name}: greedy pass@1 {mean:.3f} on {len(tasks)} problems ({wall:.0f} s)",
        file=sys.stderr,
    )
    if samples > 0:
        cfg = SamplingConfig(temperature=temperature, max_new_tokens=max_new_tokens, max_seq_len=max_seq_len)
        repeated = [t for t in tasks for _ in range(samples)]
        sampled, wall = _play(model, encoder, domain, repeated, cfg, batch_size, seed + 1, f"{domain.name} sampled")
        correct = [sum(r.reward >= 1.0 for r in sampled[i * samples : (i + 1) * samples]) for i in range(len(tasks))]
        n = [samples] * len(tasks)
        out["sampled"] = {
            "samples_per_problem": samples,
            "sampling": vars(cfg),
            **{f"pass@{k}": pass_at_k(n, correct, k) for k in ks if k <= samples},
            "correct_per_problem": dict(zip([t.task_id for t in tasks], correct)),
            **_speed(sampled, wall),
        }
        print(
            f"[eval-benchmark] {domain.name}: "
            + ", ".join(f"pass@{k} {out['sampled'][f'pass@{k}']:.3f}" for k in ks if k <= samples)
            + f" from {samples} samples at T={temperature} ({wall:.0f} s)",
            file=sys.stderr,
        )
    model.train(was_training)
    return out

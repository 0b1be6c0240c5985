"""A policy's scores on an evaluation-only benchmark domain (HumanEval today): greedy pass@1 and
unbiased pass@k from n samples per problem, through the suite's own rollout engine, so that the
numbers are those a trained run's evaluation would give.

    python -m methods.cli eval-benchmark --model results/models/smollm2-135m-instruct \\
        --domain humaneval --samples 20 --out results/real/vanilla_humaneval.json
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from methods.core.evaluate import mean_se
from methods.core.provenance import write_text_atomic
from methods.core.rollout import Rollout, SamplingConfig, run_episodes
from methods.core.tokenizer import ChatEncoder
from tasks.base import TaskDomain

__all__ = ["benchmark_eval"]


def _record(r: Rollout) -> dict:
    """What the report keeps of one episode (and what the journal stores)."""
    return {
        "task_id": r.task.task_id,
        "reward": r.reward,
        "feedback": r.feedback[:300],
        "answer": r.episode.turns[0].action if r.episode.turns else "",
        "generated_tokens": r.generated_tokens,
        "truncated": bool(r.truncated),
    }


class _Journal:
    """Completed batches of a long evaluation, one JSON line each, so that an interrupted run
    resumes where it stopped.  The first line fingerprints the settings; a journal written under
    other settings is refused rather than mixed in.  A last line cut short by a crash is dropped."""

    def __init__(self, path: Path | None, fingerprint: dict):
        self.path, self.done = path, {}
        if path is None:
            return
        rows: list[dict] = []
        for line in path.read_text().splitlines() if path.exists() else []:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a torn last write; everything before it is whole
        if rows and rows[0].get("fingerprint") != fingerprint:
            raise SystemExit(
                f"[eval-benchmark] {path} was written with other settings ({rows[0].get('fingerprint')}); "
                "delete it or pass another --out"
            )
        rows = rows or [{"fingerprint": fingerprint}]
        self.done = {(row["label"], row["start"]): row for row in rows[1:]}
        # whole lines only, so that a torn line never precedes the ones appended next
        write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))

    def get(self, label: str, start: int) -> dict | None:
        return self.done.get((label, start))

    def add(self, label: str, start: int, records: list[dict], wall_s: float) -> None:
        if self.path is None:
            return
        with self.path.open("a") as f:
            f.write(json.dumps({"label": label, "start": start, "wall_s": wall_s, "records": records}) + "\n")
            f.flush()
            os.fsync(f.fileno())


def _play(model, encoder, domain, tasks, sampling, batch_size, seed, label, journal) -> tuple[list[dict], float]:
    """The episodes of ``tasks``, ``batch_size`` at a time, with a progress line per batch.  Batch
    ``i`` samples from its own generator seeded with ``(seed, i)``, so a resumed run draws what an
    uninterrupted one would have."""
    device = next(model.parameters()).device
    records: list[dict] = []
    wall = 0.0
    for start in range(0, len(tasks), batch_size):
        chunk = tasks[start : start + batch_size]
        row = journal.get(label, start)
        if row is None or [r["task_id"] for r in row["records"]] != [t.task_id for t in chunk]:
            t0 = time.perf_counter()
            gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + start // batch_size)
            with torch.no_grad():
                played = run_episodes(
                    model, encoder, domain, chunk, None, sampling, generator=gen, batch_size=batch_size
                )
            row = {"records": [_record(r) for r in played], "wall_s": time.perf_counter() - t0}
            journal.add(label, start, row["records"], row["wall_s"])
        records += row["records"]
        wall += row["wall_s"]
        done = len(records)
        solved = sum(r["reward"] >= 1.0 for r in records)
        print(
            f"[eval-benchmark] {label}: {done}/{len(tasks)} episodes ({solved} solved), {wall:.0f} s, "
            f"about {wall / done * (len(tasks) - done):.0f} s left",
            file=sys.stderr,
            flush=True,
        )
    return records, wall


def _speed(records: Sequence[dict], wall_s: float) -> dict:
    tokens = sum(r["generated_tokens"] for r in records)
    return {
        "episodes": len(records),
        "generated_tokens": tokens,
        "wall_s": round(wall_s, 2),
        "tokens_per_s": round(tokens / max(wall_s, 1e-9), 1),
        "truncated": sum(r["truncated"] for r in records),
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
    journal: Path | None = None,
    identity: dict | None = None,
) -> dict:
    """Greedy pass@1 on the first ``n_tasks`` test problems (all by default), and with ``samples`` > 0
    unbiased pass@k for every k in ``ks`` up to ``samples`` from that many samples per problem at
    ``temperature``.  Per-problem greedy answers and verdicts are kept for inspection.  With a
    ``journal`` path, each finished batch is appended there and a rerun skips those batches; the
    journal is bound to the settings and to ``identity`` (what else fixes the answers: the model's
    files, the device, the dtype), and one written under others is refused."""
    from tasks.humaneval import pass_at_k

    was_training = model.training
    model.eval()
    tasks = domain.tasks("test", n_tasks)
    greedy_cfg = SamplingConfig(temperature=0.0, max_new_tokens=max_new_tokens, max_seq_len=max_seq_len)
    fingerprint = {
        "domain": domain.name,
        "domain_version": domain.version,
        "problems": [t.task_id for t in tasks],
        "samples": samples,
        "temperature": temperature,
        "max_new_tokens": max_new_tokens,
        "max_seq_len": max_seq_len,
        "batch_size": batch_size,
        "seed": seed,
        **(identity or {}),
    }
    log = _Journal(journal, fingerprint)
    greedy, wall = _play(model, encoder, domain, tasks, greedy_cfg, batch_size, seed, f"{domain.name} greedy", log)
    mean, se = mean_se([r["reward"] for r in greedy])
    out: dict[str, Any] = {
        "domain": domain.name,
        "domain_version": domain.version,
        "problems": len(tasks),
        "greedy": {"pass@1": mean, "pass@1_se": se, "sampling": vars(greedy_cfg), **_speed(greedy, wall)},
        "problems_greedy": [{k: r[k] for k in ("task_id", "reward", "feedback", "answer")} for r in greedy],
    }
    print(
        f"[eval-benchmark] {domain.name}: greedy pass@1 {mean:.3f} on {len(tasks)} problems ({wall:.0f} s)",
        file=sys.stderr,
    )
    if samples > 0:
        cfg = SamplingConfig(temperature=temperature, max_new_tokens=max_new_tokens, max_seq_len=max_seq_len)
        repeated = [t for t in tasks for _ in range(samples)]
        sampled, wall = _play(
            model, encoder, domain, repeated, cfg, batch_size, seed + 1, f"{domain.name} sampled", log
        )
        correct = [sum(r["reward"] >= 1.0 for r in sampled[i * samples : (i + 1) * samples]) for i in range(len(tasks))]
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

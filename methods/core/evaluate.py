"""Held-out evaluation: the same function scores the warm start (Table 1's
"Vanilla") and every method's learning-curve points."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Sequence

import torch

from tasks.base import Task, TaskDomain

from .batch import agent_logits, pad_examples
from .rollout import Rollout, SamplingConfig, run_episodes, trajectory_ids
from .tokenizer import ChatEncoder


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (sample standard deviation / sqrt(n)); (0, 0) for no values."""
    n = len(values)
    mean = sum(values) / max(n, 1)
    var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    return mean, (var / max(n, 1)) ** 0.5


def contexts_fingerprint(tasks: Sequence[Task], contexts: Sequence[str | None], sampling: SamplingConfig) -> str:
    """SHA-256 of what a greedy held-out evaluation of one model depends on besides the model: the
    tasks, the context each one's student sees, and the decoding settings.  Two evaluations of
    the same weights with equal fingerprints are the same computation (``methods.core.loop``
    reuses one for the other)."""
    h = hashlib.sha256(json.dumps(dataclasses.asdict(sampling), sort_keys=True).encode())
    for task, ctx in zip(tasks, contexts, strict=True):
        h.update(json.dumps([task.task_id, task.prompt, ctx]).encode())
    return h.hexdigest()


def summarize(rollouts: Sequence[Rollout], prefix: str = "heldout_") -> dict[str, float]:
    """Score and behaviour statistics of finished episodes (means over episodes)."""
    n = max(len(rollouts), 1)
    mean, se = mean_se([r.reward for r in rollouts])
    out = {
        f"{prefix}reward": mean,
        f"{prefix}reward_se": se,  # standard error of the mean reward over these episodes
        f"{prefix}success": sum(r.reward >= 1.0 for r in rollouts) / n,
        f"{prefix}turns": sum(len(r.episode.turns) for r in rollouts) / n,
        f"{prefix}gen_tokens": sum(r.generated_tokens for r in rollouts) / n,
        f"{prefix}first_response_tokens": sum(_first_response_len(r) for r in rollouts) / n,
    }
    infos = [r.episode.info() for r in rollouts]
    for key in sorted(
        {k for i in infos for k, v in i.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    ):
        out[f"{prefix}{key}"] = sum(float(i.get(key, 0)) for i in infos) / n
    return out


def _first_response_len(r: Rollout) -> int:
    m = r.agent_mask
    if 1 not in m:
        return 0
    start = m.index(1)
    end = start
    while end < len(m) and m[end] == 1:
        end += 1
    return end - start


@torch.no_grad()
def evaluate(
    model,
    encoder: ChatEncoder,
    domain: TaskDomain,
    tasks: Sequence[Task],
    sampling: SamplingConfig,
    contexts_fn: Callable[[Sequence[Task]], list[str | None]] | None = None,
    seed: int = 0,
) -> dict[str, float]:
    was_training = model.training
    model.eval()
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    contexts = contexts_fn(tasks) if contexts_fn else None
    rollouts = run_episodes(model, encoder, domain, tasks, contexts, sampling, generator=gen)
    model.train(was_training)
    out = summarize(rollouts)
    out["heldout_episodes"] = len(rollouts)
    return out


# --------------------------------------------------------------------------- likelihoods
def masked_nll(model, ids: torch.Tensor, attn: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed NLL of the next tokens where ``mask`` [B, T-1] is 1, and the token count.

    Only the masked positions go through the output head (:func:`agent_logits`).
    """
    keep = mask.bool()
    logits = agent_logits(model, ids, attn, mask, grouped=False)  # bit-identical rebuilds of shipped bases
    nll = torch.nn.functional.cross_entropy(logits, ids[:, 1:][keep], reduction="sum")
    return nll, keep.sum()


@torch.no_grad()
def mean_agent_logprob(model, encoder, domain, items) -> float:
    """Mean per-token log-likelihood of the agent turns of ``items`` = [(task, context, turns)]."""
    model.eval()
    tot, cnt = 0.0, 0.0
    for start in range(0, len(items), 32):
        chunk = [trajectory_ids(encoder, domain, t, c, turns) for t, c, turns in items[start : start + 32]]
        dev = next(model.parameters()).device
        ids, attn, mask = pad_examples(chunk, encoder.pad_id)
        nll, count = masked_nll(model, ids.to(dev), attn.to(dev), mask.to(dev))
        tot -= float(nll)
        cnt += float(count)
    return tot / max(cnt, 1.0)

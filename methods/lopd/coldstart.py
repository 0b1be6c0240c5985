"""LOPD's cold start: teach the composer to write latents the frozen teacher can read.

Before RL (methods.md, LOPD item 4) φ = LoRA + Q-Former is trained, with the
backbone frozen, by the NLL of the warm-start policy's *own* successful
training-split trajectories (the seeded experience bank, ``bank`` rule) under
the teacher whose prompt carries the latents of the top-J *other* trajectories
retrieved for that task.  A share of the successes is held out to measure what
the latents give the teacher (``latent_gain``: mean per-token log-likelihood
of the held-out successes' actions with the latents minus without any
context), before and after; the same with the retrieved trajectories as plain
text (``text_gain``) says what a text context would give the same teacher.

The result (φ0 and the report) is cached per domain, seed and
``LOPDConfig.cold_start_key()``; φ0's latents are the anchor of the RL phase.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Sequence

import torch

from methods.core.batch import pad_examples
from methods.core.rollout import initial_prompt_ids, trajectory_ids
from methods.core.warmstart import mean_agent_logprob
from tasks.base import Turn

from .composer import LatentComposer
from .method import LOPDConfig, fill

__all__ = ["cold_start", "Example"]


class Example:
    """One success of the bank as a cold-start example: its task, its tokens, and what retrieval returns for it."""

    def __init__(self, task, tail_ids, tail_mask, turns, hits):
        self.task, self.tail_ids, self.tail_mask, self.turns, self.hits = task, tail_ids, tail_mask, turns, hits


def examples_from_bank(bank, domain, encoder, cfg: LOPDConfig) -> list[Example]:
    """Every bank item whose task retrieves at least one other item, laid out as the teacher reads it."""
    by_id = {t.task_id: t for t in domain.tasks("train")}
    items = [e for e in bank.items if e.turns and e.task_id in by_id]
    tasks = [by_id[e.task_id] for e in items]
    hits = bank.retrieve(tasks, cfg.n_retrieve)
    out = []
    for e, task, h in zip(items, tasks, hits):
        h = fill(h, cfg.n_retrieve, cfg.fill_missing)
        if not h:
            continue
        turns = [Turn(a, o) for a, o in e.turns]
        ids, mask = trajectory_ids(encoder, domain, task, None, turns)
        start = len(initial_prompt_ids(encoder, domain, task, None))
        out.append(Example(task, ids[start:], mask[start:], turns, h))
    return out


def latent_nll(composer: LatentComposer, domain, batch: Sequence[Example], device) -> tuple[torch.Tensor, int]:
    """Token-mean NLL of the examples' actions under the latent-conditioned teacher (grad to φ)."""
    per, _, _ = composer.compose([ex.task.prompt for ex in batch], [ex.hits for ex in batch])
    seqs = [
        composer.teacher_sequence(domain, ex.task, int(p.shape[0]), ex.tail_ids, ex.tail_mask)
        for ex, p in zip(batch, per)
    ]
    ids, attn, mask = pad_examples([q[:2] for q in seqs], composer.encoder.pad_id)
    ids, attn, mask = ids.to(device), attn.to(device), mask.to(device)
    logits = composer.teacher_logits(ids, attn, mask, list(per), [q[2] for q in seqs])
    tok = ids[:, 1:][mask.bool()]
    nll = -torch.log_softmax(logits, -1).gather(-1, tok[:, None]).squeeze(-1)
    return nll.mean(), int(nll.numel())


@torch.no_grad()
def mean_latent_logprob(composer, domain, examples, device, batch_size: int = 16) -> float:
    tot, cnt = 0.0, 0
    for s in range(0, len(examples), batch_size):
        nll, n = latent_nll(composer, domain, examples[s : s + batch_size], device)
        tot -= float(nll) * n
        cnt += n
    return tot / max(cnt, 1)


@torch.no_grad()
def _gains(composer, domain, examples, device) -> dict[str, float]:
    from methods.retrieval_rl import render_experience

    if not examples:
        return {"latent_gain": 0.0, "text_gain": 0.0}
    enc = composer.encoder
    with composer.model.disable_adapter():
        base = composer.backbone
        none = mean_agent_logprob(base, enc, domain, [(ex.task, None, ex.turns) for ex in examples])
        text = mean_agent_logprob(
            base, enc, domain, [(ex.task, render_experience(ex.hits), ex.turns) for ex in examples]
        )
    lat = mean_latent_logprob(composer, domain, examples, device)
    return {"logprob_no_context": none, "logprob_latents": lat, "latent_gain": lat - none, "text_gain": text - none}


def cold_start(cfg: LOPDConfig, composer: LatentComposer, bank, domain, seed: int, device="cpu", log=None) -> dict:
    """Train φ in place on the bank's successes; returns the report (sizes, losses, gains before and after)."""
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    examples = examples_from_bank(bank, domain, composer.encoder, cfg)
    rng = random.Random(f"coldstart/{seed}")
    rng.shuffle(examples)
    n_hold = int(round(cfg.cold_start_holdout * len(examples))) if len(examples) > 1 else 0
    held, train = examples[:n_hold], examples[n_hold:]
    report = {
        "bank_size": len(bank),
        "examples": len(examples),
        "train_examples": len(train),
        "heldout_examples": len(held),
        "steps": 0,
    }
    report["before"] = _gains(composer, domain, held, device)
    probe = train[:64]  # a fixed subset of the training successes: did the cold start fit them?
    report["train_logprob_before"] = mean_latent_logprob(composer, domain, probe, device) if probe else 0.0
    if not train or cfg.cold_start_steps == 0:
        log(
            f"[coldstart] nothing to train on ({len(train)} examples, {cfg.cold_start_steps} steps): φ0 is the initial composer"
        )
        report["after"] = report["before"]
        report["train_logprob_after"] = report["train_logprob_before"]
        return report
    params = [p for p in composer.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.cold_start_lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20))
    losses, t0 = [], time.perf_counter()
    order: list[Example] = []
    for step in range(cfg.cold_start_steps):
        if len(order) < cfg.cold_start_batch:
            more = list(train)
            rng.shuffle(more)
            order += more
        batch, order = order[: cfg.cold_start_batch], order[cfg.cold_start_batch :]
        loss, _ = latent_nll(composer, domain, batch, device)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if (step + 1) % 50 == 0 or step + 1 == cfg.cold_start_steps:
            log(
                f"[coldstart] step {step + 1}/{cfg.cold_start_steps} nll {sum(losses[-50:]) / len(losses[-50:]):.4f} ({time.perf_counter() - t0:.0f}s)"
            )
    report.update(
        {
            "steps": cfg.cold_start_steps,
            "first_nll": losses[0],
            "final_nll": sum(losses[-20:]) / len(losses[-20:]),
            "train_s": round(time.perf_counter() - t0, 2),
        }
    )
    report["after"] = _gains(composer, domain, held, device)
    report["train_logprob_after"] = mean_latent_logprob(composer, domain, probe, device)
    return report

"""LOPD's cold start: teach the composer to write latents the frozen teacher can read.

Before RL (methods.md, LOPD item 4) φ = LoRA + Q-Former is trained, with the
backbone frozen, by the NLL of the warm-start policy's *own* successful
training-split trajectories (the seeded experience bank, ``bank`` rule) under
the teacher whose prompt carries the latents of the top-J trajectories
retrieved for that task.  As in the reference's configs
(``memory_bank.allow_self_retrieval: true``), a training example may retrieve
its own success (``LOPDConfig.allow_self_retrieval``).  A share of the
successes is held out before retrieval and never retrieves itself; on it the
report measures what each context gives the teacher over no context, in
nats/token, before and after (:class:`GainProbe`): the latents, the same items as
text, the task's own solution as text, and random latents, on the held-out
successes' own actions and on the expert's.

The result (φ0 and the report) is cached per domain, seed and
``LOPDConfig.cold_start_key()`` (a digest of every field it depends on); φ0's
latents are the anchor of the RL phase.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Sequence

import torch

from methods.core.batch import pad_examples
from methods.core.evaluate import mean_agent_logprob
from tasks.base import Turn

from .composer import LatentComposer, action_tail
from .method import LOPDConfig, fill

__all__ = ["cold_start", "Example"]

QFORMER_CLIP, LORA_CLIP = 30.0, 3.0  # the reference's qformer_grad_clip and lora_grad_clip


class Example:
    """One success of the bank as a cold-start example: its task, its tokens, and what retrieval returns for it."""

    def __init__(self, task, tail_ids, tail_mask, turns, hits):
        self.task, self.tail_ids, self.tail_mask, self.turns, self.hits = task, tail_ids, tail_mask, turns, hits

    @classmethod
    def of(cls, encoder, domain, task, turns, hits) -> Example:
        """``turns`` of ``task`` laid out as the teacher reads them (the tokens after the first prompt)."""
        return cls(task, *action_tail(encoder, domain, task, turns), turns, hits)


def examples_from_bank(bank, domain, encoder, cfg: LOPDConfig, seed: int) -> tuple[list[Example], list[Example]]:
    """The bank's items as (training, held-out) cold-start examples.

    The items (those of training tasks with their turns kept) are shuffled by ``seed`` and a
    ``cold_start_holdout`` share is held out *before* retrieval.  Training examples retrieve as
    LOPD's teacher does in RL: with ``allow_self_retrieval`` (the reference's setting) a task's own
    success is among its items.  Held-out examples never retrieve themselves, so their gains say
    what the latents of *other* tasks' experience give.  An example that retrieves nothing is dropped."""
    by_id = {t.task_id: t for t in domain.tasks("train")}
    items = [e for e in bank.items if e.turns and e.task_id in by_id]
    random.Random(f"coldstart/{seed}").shuffle(items)
    n_hold = int(round(cfg.cold_start_holdout * len(items))) if len(items) > 1 else 0

    def lay_out(part, allow_self):
        tasks = [by_id[e.task_id] for e in part]
        out = []
        for e, task, h in zip(part, tasks, bank.retrieve(tasks, cfg.n_retrieve, allow_self=allow_self)):
            h = fill(h, cfg.n_retrieve, cfg.fill_missing)
            if h:
                out.append(Example.of(encoder, domain, task, [Turn(a, o) for a, o in e.turns], h))
        return out

    return lay_out(items[n_hold:], cfg.allow_self_retrieval), lay_out(items[:n_hold], False)


def latent_nll(
    composer: LatentComposer, domain, batch: Sequence[Example], device, latents=None
) -> tuple[torch.Tensor, int]:
    """Token-mean NLL of the examples' actions under the latent-conditioned teacher (grad to φ).

    ``latents``: one [n_i, d] tensor per example in place of the composed ones (the random control)."""
    per = (
        latents
        if latents is not None
        else composer.compose([ex.task.prompt for ex in batch], [ex.hits for ex in batch])[0]
    )
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
def mean_latent_logprob(
    composer, domain, examples, device, batch_size: int = 16, random_seed: int | None = None
) -> float:
    """Mean per-token log-likelihood of the examples' actions under the latent teacher; with
    ``random_seed``, under random latents of the same shape and scale (``randn · latent_rms``)."""
    gen = torch.Generator().manual_seed(random_seed) if random_seed is not None else None
    d = composer.backbone.config.hidden_size
    tot, cnt = 0.0, 0
    for s in range(0, len(examples), batch_size):
        batch = examples[s : s + batch_size]
        lat = None
        if gen is not None:
            lat = [
                (torch.randn(len(ex.hits) * composer.n_latents, d, generator=gen) * composer.latent_rms).to(device)
                for ex in batch
            ]
        nll, n = latent_nll(composer, domain, batch, device, latents=lat)
        tot -= float(nll) * n
        cnt += n
    return tot / max(cnt, 1)


#: the contexts whose gain over no context the cold start reports, on two kinds of actions
GAIN_CONTEXTS = ("latent", "text", "solution", "random")
GAIN_TARGETS = {"": "the held-out successes' own actions", "expert_": "the scripted expert's actions"}


class GainProbe:
    """What each context gives the frozen teacher (LoRA off), in nats/token over no context, on the
    held-out examples' own actions (``latent_gain``, ``text_gain``, ``solution_gain``,
    ``random_gain``) and on the expert's actions of the same tasks (``expert_*``).  The contexts:
    the composed latents of the retrieved items, the same items as text (retrieval's format), the
    task's own reference solution as text (OPSD's context: the ceiling of a text teacher), and
    random latents at the latents' scale (what the teacher does with latents that say nothing).

    Only the composed latents depend on φ: the other log-likelihoods are measured once, at
    construction, and each call measures the latents' with the composer as it is then."""

    @torch.no_grad()
    def __init__(self, composer, domain, examples, device, seed: int = 0):
        from methods.core.distill import expert_trace
        from methods.retrieval_rl import render_experience

        self.composer, self.domain, self.device = composer, domain, device
        enc = composer.encoder
        expert = [Example.of(enc, domain, ex.task, domain.expert_trajectory(ex.task).turns, ex.hits) for ex in examples]
        self.targets = {"": examples, "expert_": expert}
        self.fixed: dict[str, float] = {}
        if not examples:
            return
        for prefix, exs in self.targets.items():
            with composer.model.disable_adapter():
                base = composer.backbone

                for name, ctx in (
                    ("none", lambda ex: None),
                    ("text", lambda ex: render_experience(ex.hits)),
                    ("solution", lambda ex: expert_trace(domain, ex.task)),
                ):
                    items = [(ex.task, ctx(ex), ex.turns) for ex in exs]
                    self.fixed[f"{prefix}{name}"] = mean_agent_logprob(base, enc, domain, items)
            self.fixed[f"{prefix}random"] = mean_latent_logprob(composer, domain, exs, device, random_seed=seed)

    @torch.no_grad()
    def __call__(self) -> dict[str, float]:
        keys = [f"{p}{c}_gain" for p in GAIN_TARGETS for c in GAIN_CONTEXTS]
        if not self.fixed:
            return dict.fromkeys(keys, 0.0)
        out: dict[str, float] = {}
        for prefix, exs in self.targets.items():
            none = self.fixed[f"{prefix}none"]
            lat = mean_latent_logprob(self.composer, self.domain, exs, self.device)
            out[f"{prefix}logprob_no_context"] = none
            out[f"{prefix}logprob_latents"] = lat
            out[f"{prefix}latent_gain"] = lat - none
            for c in GAIN_CONTEXTS[1:]:
                out[f"{prefix}{c}_gain"] = self.fixed[f"{prefix}{c}"] - none
        return out


def cold_start(
    cfg: LOPDConfig, composer: LatentComposer, bank, domain, seed: int, device="cpu", log=None, eval_at=()
) -> dict:
    """Train φ in place on the bank's successes; returns the report (sizes, losses, gains before and after).

    ``eval_at``: steps after which the held-out gains are measured too (``report["curve"]``).  The
    learning rate does not depend on the number of steps, so the gains after s steps of a longer
    cold start are those of a cold start of s steps (``benchmarks/probes/coldstart_length.py``)."""
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    train, held = examples_from_bank(bank, domain, composer.encoder, cfg, seed)
    rng = random.Random(f"coldstart/{seed}/order")
    report = {
        "bank_size": len(bank),
        "examples": len(train) + len(held),
        "train_examples": len(train),
        "heldout_examples": len(held),
        "self_retrieval": cfg.allow_self_retrieval,
        # share of training examples whose items include their own success (held-out: never)
        "train_self_share": sum(any(h.task_id == ex.task.task_id for h in ex.hits) for ex in train)
        / max(len(train), 1),
        "steps": 0,
    }
    gains = GainProbe(composer, domain, held, device, seed)
    report["before"] = gains()
    probe = train[:64]  # a fixed subset of the training successes: did the cold start fit them?
    report["train_logprob_before"] = mean_latent_logprob(composer, domain, probe, device) if probe else 0.0
    if not train or cfg.cold_start_steps == 0:
        log(
            f"[coldstart] nothing to train on ({len(train)} examples, {cfg.cold_start_steps} steps): "
            "φ0 is the initial composer"
        )
        report["after"] = report["before"]
        report["train_logprob_after"] = report["train_logprob_before"]
        return report
    named = [(n, p) for n, p in composer.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    opt = torch.optim.AdamW(params, lr=cfg.cold_start_lr, weight_decay=cfg.composer_weight_decay)
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
        # clipped per part, as the reference's compressor SFT does (Q-Former 30, LoRA 3)
        torch.nn.utils.clip_grad_norm_([p for n, p in named if n.startswith("qformer.")], QFORMER_CLIP)
        torch.nn.utils.clip_grad_norm_([p for n, p in named if not n.startswith("qformer.")], LORA_CLIP)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if step + 1 in eval_at:
            was = time.perf_counter()
            report.setdefault("curve", []).append({"step": step + 1, **gains()})
            t0 += time.perf_counter() - was  # train_s counts training only
        if (step + 1) % 50 == 0 or step + 1 == cfg.cold_start_steps:
            log(
                f"[coldstart] step {step + 1}/{cfg.cold_start_steps} nll {sum(losses[-50:]) / len(losses[-50:]):.4f} "
                f"({time.perf_counter() - t0:.0f}s)"
            )
    report.update(
        {
            "steps": cfg.cold_start_steps,
            "first_nll": losses[0],
            "final_nll": sum(losses[-20:]) / len(losses[-20:]),
            "train_s": round(time.perf_counter() - t0, 2),
        }
    )
    report["after"] = gains()
    report["train_logprob_after"] = mean_latent_logprob(composer, domain, probe, device)
    return report

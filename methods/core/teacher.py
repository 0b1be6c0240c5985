"""Teacher scoring, shared by every self-distillation method.

A teacher is the policy's architecture with

* a **weight source**: ``frozen`` (the warm-start checkpoint, never updated:
  OPSD), ``ema`` (an exponential moving average of the student,
  ``θ_T ← (1 − rate)·θ_T + rate·θ_S`` after every student step: SDPO, SDFT),
  or ``student`` (the student's current weights, i.e. synced every step:
  Skill-SD);
* a **privileged context** per rollout, placed ahead of the task in the first
  user message in the one neutral format every method shares
  (:func:`tasks.base.render_user_message`).

:meth:`Teacher.score` re-renders each student trajectory with the teacher's
context and returns the teacher's (temperature-scaled) logits at exactly the
student's agent-token positions, packed per rollout as ``[n_i, V]`` -- the
layout of the student's logits in :func:`methods.core.batch.agent_token_logprobs`
-- batched and without gradients.  The tokens it forwards are counted in the
run's ledger (``teacher_tokens``).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .batch import agent_logits, pad_examples
from .lazy import lazy_import, no_grad

if TYPE_CHECKING:
    from .rollout import Rollout

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")  # loaded on first use: config resolution reads this module (methods/core/lazy.py)

__all__ = ["Teacher", "WEIGHT_SOURCES"]

WEIGHT_SOURCES = ("frozen", "ema", "student")


class Teacher:
    def __init__(self, run, source: str, ema_rate: float = 0.0, batch_size: int = 16):
        if source not in WEIGHT_SOURCES:
            raise ValueError(f"teacher weight source must be one of {WEIGHT_SOURCES}, got {source!r}")
        if source == "ema" and not (0.0 < ema_rate <= 1.0):
            raise ValueError(f"an EMA teacher needs a rate in (0, 1], got {ema_rate}")
        self.run, self.source, self.ema_rate, self.batch_size = run, source, ema_rate, batch_size
        if source == "frozen":
            from .policy import load_policy

            if run.warmstart_path is None:
                raise ValueError("a frozen teacher needs the run's warm-start checkpoint (RunContext.warmstart_path)")
            self._model, _ = load_policy(run.warmstart_path / "model", device=run.device)
        elif source == "ema":
            self._model = copy.deepcopy(run.model)  # the student starts at the warm start
        else:
            self._model = None
        if self._model is not None:
            self._model.eval().requires_grad_(False)
        self.max_len = int(getattr(run.model.config, "max_position_embeddings", 1 << 30))

    @property
    def model(self):
        return self._model if self._model is not None else self.run.model

    # --- weights ---------------------------------------------------------------
    @no_grad
    def update(self) -> None:
        """After a student step: move an EMA teacher toward the student (others: nothing to do)."""
        if self.source != "ema":
            return
        t = [p for p in self._model.parameters()]
        s = [p.detach() for p in self.run.model.parameters()]
        torch._foreach_lerp_(t, s, self.ema_rate)

    def state_dict(self):
        return {"ema": self._model.state_dict()} if self.source == "ema" else {}

    def load_state_dict(self, state) -> None:
        if self.source == "ema":
            self._model.load_state_dict(state["ema"])

    # --- scoring ---------------------------------------------------------------
    def sequences(self, rollout: Rollout, context: str | None) -> tuple[list[int], list[int]]:
        """The rollout re-rendered with ``context`` in its first user message, and its agent mask."""
        from .rollout import initial_prompt_ids

        run = self.run
        prefix = initial_prompt_ids(run.encoder, run.domain, rollout.task, context)
        start = rollout.prompt_len
        return prefix + rollout.ids[start:], [0] * len(prefix) + rollout.agent_mask[start:]

    @no_grad
    def score(
        self, rollouts: Sequence[Rollout], contexts: Sequence[str | None], temperature: float = 1.0
    ) -> list[torch.Tensor | None]:
        """Teacher logits ``[n_i, V]`` at each rollout's agent tokens (None where the
        re-rendered sequence would exceed the model's positions: no signal there)."""
        model = self.model
        was_training = model.training
        model.eval()
        out = self.score_sequences(
            [self.sequences(r, c) for r, c in zip(rollouts, contexts)],
            lambda ids, attn, mask, rows: agent_logits(model, ids, attn, mask),
            temperature,
        )
        model.train(was_training)
        return out

    def score_sequences(
        self, seqs, forward, temperature: float = 1.0, batch_size: int | None = None
    ) -> list[torch.Tensor | None]:
        """The batching of :meth:`score` for any teacher forward (LOPD's latent-conditioned one).

        ``seqs``: ``(ids, agent_mask)`` per rollout; ``forward(ids, attn, mask, rows)``
        returns packed logits ``[n, V]`` for the padded batch of rows ``rows``.
        Sequences longer than the model's positions get None; logits are divided
        by ``temperature``; the forwarded tokens go into the ledger.  Gradients
        flow if ``forward`` lets them (the caller decides)."""
        out: list[torch.Tensor | None] = [None] * len(seqs)
        todo = [i for i, (ids, _) in enumerate(seqs) if len(ids) <= self.max_len]
        dev = self.run.device
        size = batch_size or self.batch_size
        for start in range(0, len(todo), size):
            chunk = todo[start : start + size]
            ids, attn, mask = pad_examples([seqs[i] for i in chunk], self.run.encoder.pad_id)
            logits = forward(ids.to(dev), attn.to(dev), mask.to(dev), chunk)
            if temperature != 1.0:
                logits = logits / temperature
            for i, piece in zip(chunk, torch.split(logits, mask.sum(-1).long().tolist())):
                out[i] = piece
            self.run.ledger.add_teacher_tokens(int(attn.sum()))
        return out

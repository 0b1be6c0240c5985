"""LOPD's privileged-margin objective as pure functions.

The formulas are ``docs/methods.md``, LOPD item 6 (the paper's
equation numbers are not in that reference, so the docstrings cite the item
and name each formula (M1-M5) instead of guessing them).

Notation: on a rollout i of
the student with agent tokens t,

* ``δ_{i,t} = log π_T(a_{i,t} | …, c_φ) − sg[log π_S(a_{i,t} | …)]``  (M1), the
  teacher's log-likelihood advantage over the student on the student's own
  token, with the latents ``c_φ`` in the teacher's context;
* ``A_i = 2 r_i − 1``  (M2), +1 for a success, −1 for a failure (graded for a
  partial tool-use reward);
* ``Δ(φ) = mean_i A_i · mean_t δ_{i,t}``  (M3), the *privileged margin*: large
  when the latents make the teacher prefer successful actions and disfavour
  failed ones more than the student does;
* composer loss ``L_φ = L_distill + β (m − Δ) + λ · mean((c_φ − sg[c_{φ0}])²)``
  (M4), with the anchor to the cold-start composer's latents ``c_{φ0}``;
* dual ascent on β  ``β ← max(0, β + η_β (m − Δ))``  (M5): β grows while the
  margin is below its target m, and decays to 0 once it holds.

Everything here works on *packed* per-token tensors (the agent tokens of a
batch, row-major, as :func:`methods.core.batch.agent_token_logprobs` packs them)
with a list of per-rollout token counts.
"""

from __future__ import annotations

from collections.abc import Sequence

from methods.core.lazy import lazy_import

torch = lazy_import("torch")  # loaded on first use: config resolution reads this module (methods/core/lazy.py)

__all__ = [
    "token_delta",
    "outcome_sign",
    "rollout_means",
    "privileged_margin",
    "token_weighted_margin",
    "anchor_penalty",
    "composer_objective",
    "dual_update",
]


def token_delta(teacher_logp: torch.Tensor, student_logp: torch.Tensor) -> torch.Tensor:
    """M1: δ = log π_T(a) − sg[log π_S(a)] per token (gradients reach the teacher side only)."""
    return teacher_logp - student_logp.detach()


def outcome_sign(rewards: torch.Tensor) -> torch.Tensor:
    """M2: A = 2r − 1 (r in [0, 1])."""
    return 2.0 * rewards - 1.0


def rollout_means(values: torch.Tensor, counts: Sequence[int]) -> torch.Tensor:
    """Mean of packed per-token ``values`` [n] over each rollout's ``counts`` tokens -> [R].

    A rollout with no tokens contributes 0 (it has no action to score)."""
    counts_t = torch.as_tensor(list(counts), device=values.device)
    if int(counts_t.sum()) != values.shape[0]:
        raise ValueError(f"counts sum to {int(counts_t.sum())} but {values.shape[0]} token values were given")
    seg = torch.repeat_interleave(torch.arange(len(counts_t), device=values.device), counts_t)
    sums = values.new_zeros(len(counts_t)).index_add(0, seg, values)
    return sums / counts_t.clamp(min=1).to(values.dtype)


def privileged_margin(delta: torch.Tensor, counts: Sequence[int], rewards: torch.Tensor) -> torch.Tensor:
    """M3: Δ = mean over rollouts of A_i · mean_t δ_{i,t} (a scalar, differentiable in δ)."""
    if len(counts) != rewards.shape[0]:
        raise ValueError(f"{len(counts)} rollouts of tokens but {rewards.shape[0]} rewards")
    if len(counts) == 0:
        return delta.new_zeros(())
    return (outcome_sign(rewards.to(delta.dtype)) * rollout_means(delta, counts)).mean()


def token_weighted_margin(delta: torch.Tensor, counts: Sequence[int], rewards: torch.Tensor) -> torch.Tensor:
    """Δ as the reference code's dual step reads it: Σ_i n_i · A_i · mean_t δ_{i,t} / Σ_i n_i, the
    rollouts weighted by their token counts n_i (the gradient uses :func:`privileged_margin`, the
    plain mean over rollouts; the two agree when every rollout has as many tokens)."""
    if len(counts) != rewards.shape[0]:
        raise ValueError(f"{len(counts)} rollouts of tokens but {rewards.shape[0]} rewards")
    n = torch.as_tensor(list(counts), device=delta.device, dtype=delta.dtype)
    if len(counts) == 0 or float(n.sum()) == 0:
        return delta.new_zeros(())
    per = outcome_sign(rewards.to(delta.dtype)) * rollout_means(delta, counts)
    return (per * n).sum() / n.sum()


def anchor_penalty(
    latents: torch.Tensor, anchor: torch.Tensor, scale: float = 1.0, counts: Sequence[int] | None = None
) -> torch.Tensor:
    """M4's anchor: mean(((c_φ − sg[c_{φ0}]) / scale)²), the mean of squares as in the reference code.

    ``latents`` and ``anchor`` are [items, K, d].  ``scale`` divides both, so that λ acts at the
    reference's unit scale when the latents live at another one (the suite's composer writes
    them at the backbone's embedding RMS).  Given ``counts`` (items per rollout), the mean is
    taken per rollout and then over rollouts, as the reference averages its per-rollout loss;
    without, over every element."""
    if latents.shape != anchor.shape:
        raise ValueError(f"latents {tuple(latents.shape)} and anchor {tuple(anchor.shape)} differ in shape")
    if scale <= 0:
        raise ValueError(f"the anchor's scale must be > 0, got {scale}")
    sq = ((latents - anchor.detach()) / scale).pow(2)
    if counts is None or sq.shape[0] == 0:
        return sq.mean() if sq.numel() else sq.sum()
    return rollout_means(sq.flatten(1).mean(-1), counts).mean()


def composer_objective(
    distill: torch.Tensor, margin: torch.Tensor, beta: float, target: float, anchor: torch.Tensor, anchor_weight: float
) -> torch.Tensor:
    """M4: L_φ = L_distill + β (m − Δ) + λ · anchor.  β is a constant here (the dual variable)."""
    return distill + beta * (target - margin) + anchor_weight * anchor


def dual_update(beta: float, margin: float, target: float, lr: float) -> float:
    """M5: β ← max(0, β + η_β (m − Δ))."""
    return max(0.0, float(beta) + float(lr) * (float(target) - float(margin)))

"""Divergences between the student's and the teacher's next-token distributions (pure functions).

Every self-distillation method (OPSD, SDPO, SDFT, Skill-SD, LOPD) compares,
at each agent-token position of the *student's own* trajectory, the student's
next-token distribution with the teacher's on the same prefix
(``docs/methods.md``, "Pieces several methods share").  Inputs
are logits ``[n, V]`` at the n agent-token positions (the packed layout of
:func:`methods.core.batch.agent_token_logprobs`); outputs are the per-token
divergence ``[n]``, to be averaged over tokens (:func:`token_mean`).  By
default the teacher is detached, so gradients reach only the student;
``grad_to="teacher"`` detaches the student instead (LOPD's composer loss, whose
gradient reaches the composer *through* the teacher).

* :func:`forward_kl` -- KL(π_T ‖ π_S) over the vocabulary;
* :func:`reverse_kl` -- KL(π_S ‖ π_T);
* :func:`jsd` -- generalized Jensen-Shannon with the GKD convention
  (β=0 forward KL, β=1 reverse KL, else β·KL(T‖M) + (1−β)·KL(S‖M) with
  M = β·T + (1−β)·S; Agarwal et al., 2024, Eq. 4 as implemented by TRL);
* :func:`topk_tail` -- both distributions restricted to M support tokens
  (the teacher's top-M, LOPD's code and default; or the student's, TRL's
  SDPO port) plus one tail bucket ``log(1 − Σ p)`` computed stably as
  ``log(-expm1(logsumexp(top-M log-probs)))``, then a KL on the M+1 bins
  (reverse by default, as in LOPD and SDPO).

``tests/test_divergences.py`` checks them against TRL's ``GKDTrainer`` and
``trl.experimental.sdpo`` on random logits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from methods.core.lazy import lazy_import

if TYPE_CHECKING:
    from torch import Tensor

torch = lazy_import("torch")  # loaded on first use: config resolution reads this module (methods/core/lazy.py)

__all__ = [
    "forward_kl",
    "reverse_kl",
    "jsd",
    "topk_tail",
    "topk_tail_from_logp",
    "sampled_token_reverse_kl",
    "token_mean",
    "divergence",
    "known_divergences",
    "register_divergence",
]

# logsumexp of a top-M subset is clamped just below 0 so the tail bucket stays finite
_TAIL_CLAMP = -1e-7


def _kl_from_logp(p_log: Tensor, q_log: Tensor) -> Tensor:
    """KL(p ‖ q) over the last dimension from log-probabilities (0·log 0 = 0)."""
    p = p_log.exp()
    return torch.where(p > 0, p * (p_log - q_log), torch.zeros_like(p)).sum(-1)


GRAD_SIDES = ("student", "teacher")


def _sides(student_logits: Tensor, teacher_logits: Tensor, grad_to: str) -> tuple[Tensor, Tensor]:
    """Log-softmax of both sides, with the side that gets no gradient detached."""
    if grad_to not in GRAD_SIDES:
        raise ValueError(f"grad_to must be one of {GRAD_SIDES}, got {grad_to!r}")
    s = student_logits.detach() if grad_to == "teacher" else student_logits
    t = teacher_logits.detach() if grad_to == "student" else teacher_logits
    return torch.log_softmax(s.float(), -1), torch.log_softmax(t.float(), -1)


def forward_kl(student_logits: Tensor, teacher_logits: Tensor, grad_to: str = "student") -> Tensor:
    """KL(π_T ‖ π_S) per position: the teacher's mass the student misses (mode-covering)."""
    s, t = _sides(student_logits, teacher_logits, grad_to)
    return _kl_from_logp(t, s)


def reverse_kl(student_logits: Tensor, teacher_logits: Tensor, grad_to: str = "student") -> Tensor:
    """KL(π_S ‖ π_T) per position: the student's mass where the teacher has little (mode-seeking)."""
    s, t = _sides(student_logits, teacher_logits, grad_to)
    return _kl_from_logp(s, t)


def jsd(student_logits: Tensor, teacher_logits: Tensor, beta: float = 0.5, grad_to: str = "student") -> Tensor:
    """Generalized JSD per position; β=0 is :func:`forward_kl`, β=1 :func:`reverse_kl`."""
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"jsd beta must be in [0, 1], got {beta}")
    if beta == 0.0:
        return forward_kl(student_logits, teacher_logits, grad_to)
    if beta == 1.0:
        return reverse_kl(student_logits, teacher_logits, grad_to)
    s, t = _sides(student_logits, teacher_logits, grad_to)
    m = torch.logsumexp(torch.stack([s + torch.log1p(torch.tensor(-beta)), t + torch.log(torch.tensor(beta))]), dim=0)
    return beta * _kl_from_logp(t, m) + (1 - beta) * _kl_from_logp(s, m)


def _with_tail(topk_logp: Tensor) -> Tensor:
    """Append the bucket of the mass outside the support: log(1 − Σ p) = log(−expm1(logsumexp))."""
    lse = torch.logsumexp(topk_logp, dim=-1, keepdim=True).clamp(max=_TAIL_CLAMP)
    return torch.cat([topk_logp, torch.log(-torch.expm1(lse))], dim=-1)


def topk_tail(
    student_logits: Tensor,
    teacher_logits: Tensor,
    m: int = 20,
    support: str = "teacher",
    reverse: bool = True,
    grad_to: str = "student",
) -> Tensor:
    """KL on M+1 bins: the top-M tokens of ``support`` ("teacher" or "student") and a tail bucket."""
    if support not in ("teacher", "student"):
        raise ValueError(f"topk_tail support must be 'teacher' or 'student', got {support!r}")
    if m < 1:
        raise ValueError(f"topk_tail needs m >= 1, got {m}")
    s, t = _sides(student_logits, teacher_logits, grad_to)
    k = min(m, s.shape[-1])
    idx = torch.topk(t.detach() if support == "teacher" else s.detach(), k, dim=-1).indices
    return topk_tail_from_logp(s.gather(-1, idx), t.gather(-1, idx), reverse)


def topk_tail_from_logp(student_logp: Tensor, teacher_logp: Tensor, reverse: bool = True) -> Tensor:
    """:func:`topk_tail` from both sides' log-probabilities ``[..., M]`` at the same M support tokens
    (where only those are at hand: a teacher's top-M rows on verl, ``methods/verl_backend/plugin.py``)."""
    s_bins, t_bins = _with_tail(student_logp), _with_tail(teacher_logp)
    return _kl_from_logp(s_bins, t_bins) if reverse else _kl_from_logp(t_bins, s_bins)


def sampled_token_reverse_kl(
    student_logp: Tensor, teacher_logp: Tensor, old_logp: Tensor | None = None, is_clip: float | None = 2.0
) -> Tensor:
    """Per-token surrogate of KL(π_S ‖ π_T) from the sampled tokens only (Skill-SD's term).

    ``sg[log π_S(a) − log π_T(a)] · log π_S(a)``: its gradient is the
    score-function estimate of ∇ KL(π_S ‖ π_T) on the student's own samples.
    With ``old_logp`` it is importance-weighted by ``min(π_S(a)/π_old(a), is_clip)``
    (detached), as in TRL's SDPO port.  Inputs are log-probs ``[n]`` of the
    sampled tokens; the teacher's are detached.
    """
    loss = (student_logp - teacher_logp.detach()).detach() * student_logp
    if old_logp is not None:
        ratio = torch.exp((student_logp - old_logp).detach().clamp(-20.0, 20.0))
        loss = loss * (ratio.clamp(max=is_clip) if is_clip is not None else ratio)
    return loss


def token_mean(per_token: Tensor, weights: Tensor | None = None) -> Tensor:
    """Mean over agent tokens (optionally weighted; 0 when there are none)."""
    if weights is None:
        return per_token.mean() if per_token.numel() else per_token.sum()
    w = weights.to(per_token.dtype)
    return (per_token * w).sum() / w.sum().clamp(min=1e-8) if w.numel() else per_token.sum()


# --------------------------------------------------------------------------- registry
# A divergence selectable by name (``divergence:`` in a self-distillation method's config) is a
# function ``fn(student_logits, teacher_logits, *, beta, m, support, grad_to) -> [n]`` that takes
# the settings it uses and ignores the others.

_DIVERGENCES: dict[str, Callable[..., Tensor]] = {}


def register_divergence(name: str):
    """Make ``fn`` selectable as ``divergence: <name>``."""

    def deco(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
        if name in _DIVERGENCES and _DIVERGENCES[name] is not fn:
            raise ValueError(f"divergence {name!r} is already registered")
        _DIVERGENCES[name] = fn
        return fn

    return deco


def known_divergences() -> tuple[str, ...]:
    return tuple(_DIVERGENCES)


@register_divergence("forward_kl")
def _forward_kl(s: Tensor, t: Tensor, *, grad_to: str, **_) -> Tensor:
    return forward_kl(s, t, grad_to)


@register_divergence("reverse_kl")
def _reverse_kl(s: Tensor, t: Tensor, *, grad_to: str, **_) -> Tensor:
    return reverse_kl(s, t, grad_to)


@register_divergence("jsd")
def _jsd(s: Tensor, t: Tensor, *, beta: float, grad_to: str, **_) -> Tensor:
    return jsd(s, t, beta, grad_to)


@register_divergence("topk_tail")
def _topk_tail(s: Tensor, t: Tensor, *, m: int, support: str, grad_to: str, **_) -> Tensor:
    return topk_tail(s, t, m, support, grad_to=grad_to)


def divergence(
    name: str,
    student_logits: Tensor,
    teacher_logits: Tensor,
    *,
    beta: float = 0.5,
    m: int = 20,
    support: str = "teacher",
    grad_to: str = "student",
) -> Tensor:
    """The registered divergence ``name`` per position (``forward_kl``, ``reverse_kl``, ``jsd``, ``topk_tail``, ...)."""
    if name not in _DIVERGENCES:
        raise ValueError(f"unknown divergence {name!r}; known: {', '.join(_DIVERGENCES)}")
    return _DIVERGENCES[name](student_logits, teacher_logits, beta=beta, m=m, support=support, grad_to=grad_to)

"""Pure loss / advantage functions for RL fine-tuning of tiny LMs.

No models, no I/O: every function maps tensors to tensors.  Every *loss*
returns ``(loss, metrics)`` where ``loss`` is a 0-d tensor (differentiable
w.r.t. the current-policy log-probs) and ``metrics`` is a ``dict[str, float]``.

Conventions
-----------
* ``B`` = number of sequences (responses), ``T`` = response length (tokens).
* Masks are ``[B, T]``, bool or float in {0, 1} (fractional float weights are
  allowed and act as per-token weights).  Masked-out entries never influence a
  result, even if they hold ``inf``/``nan`` (they are selected away with
  ``torch.where`` before multiplying).

The numerics deliberately mirror verl 0.9.1
(``verl.trainer.ppo.core_algos.compute_grpo_outcome_advantage`` and
``compute_policy_loss_vanilla`` + ``agg_loss``); ``tests/test_losses.py``
checks them against verl directly.  Deviations from verl, all on degenerate
inputs only:

* an all-masked batch gives loss 0 instead of verl's ``nan`` (token-mean);
* a zero-variance GRPO group gets advantage exactly 0 even when float
  rounding makes ``r_i - mean`` non-zero (verl would divide that rounding
  residue by ``eps``);
* ``seq-mean-token-mean`` divides each sequence sum by its token count
  instead of ``count + 1e-8`` (relative difference ~1e-8).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from methods.core.lazy import lazy_import, no_grad

if TYPE_CHECKING:
    from torch import Tensor

torch = lazy_import("torch")  # loaded on first use: config resolution reads this module (methods/core/lazy.py)

__all__ = [
    "AGG_MODES",
    "masked_sum",
    "masked_mean",
    "agg_loss",
    "group_ids",
    "grpo_outcome_advantage",
    "ppo_clip_loss",
]

#: Loss aggregation modes understood by :func:`agg_loss` / :func:`ppo_clip_loss`
#: (same names and semantics as verl's ``agg_loss`` with dp_size == 1).
AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)

# verl clamps the log-ratio to this range before exponentiating.
_LOG_RATIO_CLAMP = 20.0


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #
def _check_mask(x: Tensor, mask: Tensor, name_x: str = "x") -> None:
    if not isinstance(x, torch.Tensor) or not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name_x} and mask must be torch.Tensor")
    try:
        shape = torch.broadcast_shapes(x.shape, mask.shape)
    except RuntimeError as e:
        raise ValueError(
            f"mask shape {tuple(mask.shape)} is not broadcastable to {name_x} shape {tuple(x.shape)}"
        ) from e
    if shape != x.shape:
        raise ValueError(
            f"mask shape {tuple(mask.shape)} must broadcast to {name_x} shape {tuple(x.shape)}, "
            f"not enlarge it to {tuple(shape)}"
        )


def _apply_mask(x: Tensor, mask: Tensor) -> Tensor:
    """``x * mask`` with masked-out entries forced to exactly 0 (nan/inf-safe)."""
    if mask.dtype == torch.bool:
        return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))
    keep = mask != 0
    return torch.where(keep, x, torch.zeros((), dtype=x.dtype, device=x.device)) * mask.to(x.dtype)


def _mask_count(x: Tensor, mask: Tensor, dim: Any) -> Tensor:
    m = mask.to(x.dtype).expand_as(x)
    return m.sum() if dim is None else m.sum(dim=dim)


def _agg_check(agg: str) -> None:
    if agg not in AGG_MODES:
        raise ValueError(f"unknown agg mode {agg!r}; allowed values: {', '.join(AGG_MODES)}")


# --------------------------------------------------------------------------- #
# masked reductions
# --------------------------------------------------------------------------- #
def masked_sum(x: Tensor, mask: Tensor, dim: int | tuple[int, ...] | None = None) -> Tensor:
    """Sum of ``x`` over entries where ``mask`` is non-zero (weighted by ``mask``).

    Shapes: ``x`` any shape ``S``; ``mask`` broadcastable to ``S``.  Returns a
    0-d tensor if ``dim is None`` else ``x`` reduced over ``dim``.
    """
    _check_mask(x, mask)
    xm = _apply_mask(x, mask)
    return xm.sum() if dim is None else xm.sum(dim=dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | tuple[int, ...] | None = None) -> Tensor:
    """Masked (token-)mean: ``sum(x * mask) / sum(mask)`` over ``dim``.

    Shapes: ``x`` any shape ``S``; ``mask`` broadcastable to ``S`` (bool or
    float weights).  ``dim=None`` reduces everything to a 0-d tensor, otherwise
    reduces over ``dim``.  Where the mask sums to 0 the result is 0 (not nan).
    Masked-out entries of ``x`` have no influence, even if non-finite.
    """
    _check_mask(x, mask)
    if not torch.is_floating_point(x):
        x = x.float()
    num = masked_sum(x, mask, dim)
    den = _mask_count(x, mask, dim)
    safe_den = torch.where(den != 0, den, torch.ones_like(den))
    return torch.where(den != 0, num / safe_den, torch.zeros_like(num))


def agg_loss(loss_mat: Tensor, mask: Tensor, agg: str = "token-mean") -> Tensor:
    """Aggregate a per-token loss matrix into a scalar, like verl's ``agg_loss`` (dp_size=1).

    Shapes: ``loss_mat`` ``[B, T]``, ``mask`` ``[B, T]``; returns a 0-d tensor.
    With ``L`` = loss_mat, ``M`` = mask, ``n_b = sum_t M_bt`` and ``B' = #{b : n_b > 0}``:

    * ``token-mean``:            ``sum_bt L M / sum_bt M``
    * ``token-sum``:             ``sum_bt L M``
    * ``seq-mean-token-mean``:   ``(1/B') sum_{b: n_b>0} (sum_t L M) / n_b``
    * ``seq-mean-token-sum``:    ``(1/B') sum_b sum_t L M``
    * ``seq-mean-token-sum-norm``: ``seq-mean-token-sum / T``  (Dr.GRPO)

    Sequences with no valid token are excluded; an all-masked batch gives 0.
    """
    _agg_check(agg)
    if loss_mat.dim() != 2 or mask.shape != loss_mat.shape:
        raise ValueError(
            f"agg_loss expects loss_mat and mask of equal shape [B, T]; got "
            f"{tuple(loss_mat.shape)} and {tuple(mask.shape)}"
        )
    if agg == "token-mean":
        return masked_mean(loss_mat, mask)
    if agg == "token-sum":
        return masked_sum(loss_mat, mask)
    seq_sum = masked_sum(loss_mat, mask, dim=-1)  # [B]
    n_tok = _mask_count(loss_mat, mask, dim=-1)  # [B]
    seq_valid = (n_tok > 0).to(loss_mat.dtype)  # [B]
    if agg == "seq-mean-token-mean":
        seq_loss = masked_mean(loss_mat, mask, dim=-1)  # [B], 0 for empty rows
        return masked_mean(seq_loss, seq_valid)
    out = masked_mean(seq_sum, seq_valid)
    if agg == "seq-mean-token-sum-norm":
        out = out / loss_mat.shape[-1]
    return out


# --------------------------------------------------------------------------- #
# GRPO outcome advantage
# --------------------------------------------------------------------------- #
def group_ids(group_index: Tensor | Sequence[Any] | Any, n: int, device: torch.device) -> Tensor:
    """Map arbitrary group labels (tensor / list / numpy array of hashables) to 0..G-1."""
    if isinstance(group_index, torch.Tensor):
        if group_index.dim() != 1:
            raise ValueError(f"group_index must be 1-D, got shape {tuple(group_index.shape)}")
        if group_index.is_floating_point() or group_index.is_complex():
            raise ValueError(f"group_index tensor must have an integer/bool dtype, got {group_index.dtype}")
        labels = group_index.to(device)
        _, inv = torch.unique(labels, return_inverse=True)
    else:
        try:
            labels_list = list(group_index)
        except TypeError as e:
            raise TypeError("group_index must be a 1-D tensor or a sequence of hashable labels") from e
        table: dict[Any, int] = {}
        ids = []
        for lab in labels_list:
            key = lab.item() if hasattr(lab, "item") and getattr(lab, "ndim", 0) == 0 else lab
            ids.append(table.setdefault(key, len(table)))
        inv = torch.tensor(ids, dtype=torch.long, device=device)
    if inv.numel() != n:
        raise ValueError(f"group_index has {inv.numel()} entries but rewards has {n}")
    return inv.to(torch.long)


@no_grad
def grpo_outcome_advantage(
    rewards: Tensor,
    group_index: Tensor | Sequence[Any],
    eps: float = 1e-6,
    norm_by_std: bool = True,
    singleton: str = "verl",
) -> Tensor:
    """GRPO outcome-supervision advantage (DeepSeekMath, arXiv:2402.03300, Sec. 4.1.2).

    For sample ``i`` in group ``g`` (same prompt), with rewards ``r``:

        Â_i = (r_i - mean_g(r)) / (std_g(r) + eps)     if norm_by_std
        Â_i =  r_i - mean_g(r)                          otherwise (Dr.GRPO, arXiv:2503.20783)

    ``std_g`` is the *unbiased* (Bessel-corrected, ``n-1``) sample std, exactly
    like verl's ``torch.std`` call.  The scalar Â_i is meant to be broadcast over
    all response tokens of sample ``i``.

    Size-1 groups: verl 0.9.1 sets ``mean = 0, std = 1`` for them, so their
    advantage is ``r_i / (1 + eps)`` (or ``r_i`` without std-norm) -- it is *not*
    zero.  ``singleton="verl"`` (default) reproduces that; ``singleton="zero"``
    gives them advantage 0 instead (no learning signal without a baseline).

    Groups whose rewards are all identical get exactly 0.

    Args:
        rewards: ``[N]`` float tensor, one scalar (outcome) reward per sample.
        group_index: ``[N]`` integer tensor, or a length-``N`` sequence / numpy
            array of hashable labels (e.g. uid strings); equal labels = same group.
        eps: added to the std in the denominator.
        norm_by_std: divide by ``std_g + eps``.
        singleton: ``"verl"`` or ``"zero"``, see above.

    Returns:
        ``[N]`` tensor of advantages (dtype of ``rewards``, float32 if integer),
        detached (computed under ``no_grad``, as in verl).  Statistics are
        accumulated in float64 with vectorised ``index_add``.
    """
    if not isinstance(rewards, torch.Tensor):
        rewards = torch.as_tensor(rewards)
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    if singleton not in ("verl", "zero"):
        raise ValueError(f"unknown singleton mode {singleton!r}; allowed values: verl, zero")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    out_dtype = rewards.dtype if torch.is_floating_point(rewards) else torch.float32
    n = rewards.shape[0]
    device = rewards.device
    gid = group_ids(group_index, n, device)
    if n == 0:
        return torch.zeros(0, dtype=out_dtype, device=device)

    r = rewards.to(torch.float64)
    n_groups = int(gid.max().item()) + 1
    zeros = torch.zeros(n_groups, dtype=torch.float64, device=device)
    count = zeros.index_add(0, gid, torch.ones_like(r))
    mean = zeros.index_add(0, gid, r) / count.clamp_min(1.0)
    centered = r - mean[gid]
    var = zeros.index_add(0, gid, centered * centered) / (count - 1.0).clamp_min(1.0)
    std = var.sqrt()

    # Identical rewards in a group -> exactly zero advantage (robust to rounding).
    gmax = zeros.scatter_reduce(0, gid, r, reduce="amax", include_self=False)
    gmin = zeros.scatter_reduce(0, gid, r, reduce="amin", include_self=False)
    constant = (gmax == gmin)[gid]
    centered = torch.where(constant, torch.zeros_like(centered), centered)

    single = (count == 1)[gid]
    if singleton == "verl":  # verl: mean := 0, std := 1
        centered = torch.where(single, r, centered)
        std_i = torch.where(single, torch.ones_like(r), std[gid])
    else:
        centered = torch.where(single, torch.zeros_like(r), centered)
        std_i = std[gid]

    adv = centered / (std_i + eps) if norm_by_std else centered
    return adv.to(out_dtype)


# --------------------------------------------------------------------------- #
# PPO clipped surrogate
# --------------------------------------------------------------------------- #
def ppo_clip_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_ratio_c: float | None = 3.0,
    agg: str = "token-mean",
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate (Schulman et al. 2017, arXiv:1707.06347) with optional dual clip.

    Per token, with ``ρ = exp(clamp(logp - old_logp, -20, 20))``:

        L1 = -Â ρ,   L2 = -Â clip(ρ, 1 - clip_low, 1 + clip_high)
        L  = max(L1, L2)                      (= -min(ρÂ, clip(ρ)Â))
        if Â < 0 and clip_ratio_c is not None:   (dual-clip PPO, arXiv:1912.09729)
            L = min(L, -Â · clip_ratio_c)

    then ``L`` is aggregated with :func:`agg_loss` (``agg``).  Asymmetric clips
    (``clip_high > clip_low``, "clip-higher", DAPO arXiv:2503.14476) are allowed.
    This is verl 0.9.1's ``compute_policy_loss_vanilla``; verl always applies the
    dual clip (``actor.clip_ratio_c`` defaults to 3.0 and must be > 1), so the
    default here is ``clip_ratio_c=3.0``; pass ``None`` to disable it.

    Args:
        logp: ``[B, T]`` log-probs of the sampled tokens under the current policy
            (gradients flow through this argument only).
        old_logp: ``[B, T]`` log-probs under the behaviour policy (detached).
        advantages: ``[B]`` (broadcast over tokens) or ``[B, T]`` (detached).
        mask: ``[B, T]`` response mask (bool or float).
        clip_low, clip_high: ε_lo, ε_hi ≥ 0 (clip_low < 1).
        clip_ratio_c: dual-clip constant (> 1) or ``None``.
        agg: one of :data:`AGG_MODES`.

    Returns:
        ``(loss, metrics)``; ``loss`` is a 0-d tensor.  ``metrics`` (floats,
        masked token-means as in verl):
          * ``clipfrac``: fraction of tokens where the clipped term is active (L2 > L1);
          * ``clipfrac_lower``: fraction where the dual clip is active (Â < 0);
          * ``approx_kl``: verl's ``ppo_kl`` = mean(old_logp - logp) (k1 estimator);
          * ``ratio_mean``: mean ρ;  ``loss``: the loss value.
    """
    _agg_check(agg)
    for name, t in (("logp", logp), ("old_logp", old_logp), ("advantages", advantages), ("mask", mask)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if logp.dim() != 2:
        raise ValueError(f"logp must be [B, T], got shape {tuple(logp.shape)}")
    if old_logp.shape != logp.shape:
        raise ValueError(f"old_logp shape {tuple(old_logp.shape)} != logp shape {tuple(logp.shape)}")
    if mask.shape != logp.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} != logp shape {tuple(logp.shape)}")
    B = logp.shape[0]
    if advantages.shape == (B,):
        adv = advantages.unsqueeze(-1)
    elif advantages.shape == logp.shape:
        adv = advantages
    else:
        raise ValueError(
            f"advantages must have shape [B]={(B,)} or [B, T]={tuple(logp.shape)}, got {tuple(advantages.shape)}"
        )
    if not (0.0 <= clip_low < 1.0) or clip_high < 0.0:
        raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got {clip_low}, {clip_high}")
    if clip_ratio_c is not None and not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c must be > 1.0 (or None), got {clip_ratio_c}")

    adv = adv.detach().to(logp.dtype)
    log_ratio = torch.clamp(logp - old_logp.detach().to(logp.dtype), -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)

    pg1 = -adv * ratio
    pg2 = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    clipped = torch.maximum(pg1, pg2)
    if clip_ratio_c is not None:
        pg3 = -adv * clip_ratio_c
        neg = adv < 0
        losses = torch.where(neg, torch.minimum(pg3, clipped), clipped)
        lower_active = (clipped > pg3) & neg
    else:
        losses = clipped
        lower_active = torch.zeros_like(clipped, dtype=torch.bool)
    loss = agg_loss(losses, mask, agg)

    with torch.no_grad():
        metrics = {
            "loss": float(loss.detach()),
            "clipfrac": float(masked_mean((pg2 > pg1).to(logp.dtype), mask)),
            "clipfrac_lower": float(masked_mean(lower_active.to(logp.dtype), mask)),
            "approx_kl": float(masked_mean(-log_ratio, mask)),
            "ratio_mean": float(masked_mean(ratio, mask)),
        }
    return loss, metrics

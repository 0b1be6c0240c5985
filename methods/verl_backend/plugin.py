"""The suite's losses in verl's registries (verl 0.9.1), so that a verl run trains with them.

verl imports every entry point of the ``verl.plugins`` group in each of its processes
(``verl/__init__.py``); ``pyproject.toml`` names this module there.  A verl run then selects:

* ``algorithm.adv_estimator=lopd_bench_grpo`` -- the suite's GRPO outcome advantage
  (:func:`methods.losses.grpo_outcome_advantage`, DeepSeekMath Sec. 4.1.2) with the suite's
  default handling of groups whose rewards are all equal: they carry no signal, so they leave the
  loss entirely (``GRPOConfig.drop_zero_variance``), instead of entering verl's token mean with
  advantage 0 and diluting it.  verl's loss reads the response mask, and counts the batch's tokens,
  after the advantage is computed, so the estimator clears those rows of ``response_mask`` in
  place.  verl's v1 trainer writes that mask back for the loss only while rollout correction is
  on (``algorithm.rollout_correction`` set and the rollouts' log-probs present: verl's defaults,
  which the generated configs keep; a test checks it).  ``lopd_bench_grpo_keep`` keeps the rows,
  as verl's ``grpo`` does.
* ``actor.policy_loss.loss_mode=lopd_bench_ppo`` -- the suite's PPO clipped surrogate with dual
  clip (:func:`methods.losses.ppo_clip_loss`), normalised over the *global* batch as verl's
  ``agg_loss`` is, so that micro-batches and data-parallel ranks add up to the full batch's loss.
* distillation ``loss_mode=lopd_bench_sampled_reverse_kl`` -- the suite's sampled-token surrogate
  of KL(student || teacher) (:func:`methods.divergences.sampled_token_reverse_kl`, Skill-SD's
  term, importance-weighted as the suite's), whose gradient is the score-function estimate of the
  KL's gradient; verl's ``k1`` estimator has the same value in expectation but a gradient that
  ignores the teacher.

* distillation ``loss_mode=lopd_bench_topk_tail_reverse_kl`` -- the suite's top-k + tail reverse KL
  (:func:`methods.divergences.topk_tail`, SDPO's divergence, on the teacher's support): KL(π_S ‖ π_T)
  over the teacher's top-k tokens and one bucket for the rest.  It needs the student's full logits,
  which verl shows only to its logits processor, and verl's processor
  (``distillation.losses.compute_topk_loss``) computes forward KL whatever the loss mode; so the
  plugin replaces that dispatch with one that computes this loss for this mode and leaves every
  other mode to verl's own.

The other full-vocabulary divergences (forward/reverse KL over the whole vocabulary, JSD) need the
teacher's full distribution, which no verl teacher returns; they have no verl path (OPSD and SDFT use
verl's top-k forward KL).

Registration is idempotent: importing the module twice (verl's plugin loader and a direct import)
registers each name once.
"""

from __future__ import annotations

from typing import Any

import torch
from verl.trainer.distillation import losses as verl_distill
from verl.trainer.ppo import core_algos

from methods.divergences import sampled_token_reverse_kl, topk_tail_from_logp
from methods.grpo import groups_with_variance
from methods.losses import group_ids, grpo_outcome_advantage, ppo_clip_loss
from methods.skill_sd import SkillSDConfig
from methods.verl_backend.metrics import KL_SUM, RESPONSE_TOKENS, TAUGHT_TOKENS

__all__ = [
    "ADV_ESTIMATOR",
    "ADV_ESTIMATOR_KEEP",
    "POLICY_LOSS",
    "DISTILLATION_LOSS",
    "TOPK_TAIL_LOSS",
    "IS_CLIP",
    "NO_TEACHER",
    "global_scale",
]

ADV_ESTIMATOR = "lopd_bench_grpo"
ADV_ESTIMATOR_KEEP = "lopd_bench_grpo_keep"
POLICY_LOSS = "lopd_bench_ppo"
DISTILLATION_LOSS = "lopd_bench_sampled_reverse_kl"


def _norm_by_std(config) -> bool:
    return bool(config.get("norm_adv_by_std_in_grpo", True)) if config is not None else True


def _grpo(token_level_rewards, response_mask, index, config, drop_zero_variance: bool):
    scores = token_level_rewards.sum(dim=-1)
    adv = grpo_outcome_advantage(scores, index, norm_by_std=_norm_by_std(config))
    if drop_zero_variance:
        varied = groups_with_variance(scores, group_ids(index, scores.shape[0], scores.device))
        response_mask.masked_fill_(~varied.unsqueeze(-1), 0)  # in place: the loss and its token count read it
    adv = adv.unsqueeze(-1) * response_mask.to(adv.dtype)
    return adv, adv


def grpo_advantage(token_level_rewards, response_mask, index, config=None, **_: Any):
    """``lopd_bench_grpo``: Â_i = (r_i − mean_g r) / (std_g r + ε) on every response token of rollout
    ``i`` (Eq. of DeepSeekMath Sec. 4.1.2; the suite's GRPO); rollouts of zero-variance groups are
    removed from ``response_mask`` (in place)."""
    return _grpo(token_level_rewards, response_mask, index, config, drop_zero_variance=True)


def grpo_advantage_keep(token_level_rewards, response_mask, index, config=None, **_: Any):
    """``lopd_bench_grpo_keep``: the same advantage, zero-variance groups left in the loss with Â = 0."""
    return _grpo(token_level_rewards, response_mask, index, config, drop_zero_variance=False)


def global_scale(mask: torch.Tensor, agg: str, info: dict) -> float:
    """The factor that turns the suite's loss over one micro-batch (normalised over that micro-batch)
    into verl's share of the global loss (``core_algos.agg_loss`` with ``info`` =
    ``config.global_batch_info``: ``dp_size``, ``batch_num_tokens``, ``global_batch_size``,
    ``loss_scale_factor``).  Without global information verl normalises locally, and the factor is 1."""
    dp = info.get("dp_size") or 1
    if agg == "token-mean":
        tokens = info.get("batch_num_tokens")
        if tokens is None:
            return float(dp)
        # a mini-batch whose every group was dropped (GRPOTrainer counts the kept tokens) adds nothing
        return float(mask.sum()) / tokens * dp if tokens else 0.0
    if agg == "token-sum":
        return float(dp)
    seqs = info.get("global_batch_size")
    scale = float((mask.sum(dim=-1) > 0).sum()) / seqs * dp if seqs is not None else float(dp)
    if agg == "seq-mean-token-sum-norm" and info.get("loss_scale_factor") is not None:
        scale *= mask.shape[-1] / info["loss_scale_factor"]
    return scale


def ppo_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config=None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """``lopd_bench_ppo``: the suite's PPO clipped surrogate with dual clip (Schulman et al. 2017;
    Ye et al. 2020) under verl's policy-loss signature, clip ranges from the actor config."""
    if config is None:
        raise ValueError(f"{POLICY_LOSS} needs the actor config (its clip ratios)")
    if rollout_is_weights is not None:
        raise ValueError(
            f"{POLICY_LOSS} applies no rollout-correction weights; set algorithm.rollout_correction.rollout_is to null "
            "(the suite's runs sample and train on the same policy)"
        )
    clip = config.clip_ratio
    low = config.clip_ratio_low if config.clip_ratio_low is not None else clip
    high = config.clip_ratio_high if config.clip_ratio_high is not None else clip
    loss, m = ppo_clip_loss(
        log_prob,
        old_log_prob,
        advantages,
        response_mask,
        clip_low=low,
        clip_high=high,
        clip_ratio_c=config.get("clip_ratio_c", 3.0),
        agg=loss_agg_mode,
    )
    loss = loss * global_scale(response_mask, loss_agg_mode, config.global_batch_info)
    metrics = {
        "actor/pg_clipfrac": m["clipfrac"],
        "actor/ppo_kl": m["approx_kl"],
        "actor/pg_clipfrac_lower": m["clipfrac_lower"],
    }
    return loss, metrics


#: the cap of Skill-SD's importance weight π_S/π_old on the distillation term: the suite's default
IS_CLIP = SkillSDConfig.is_clip
#: a teacher "log-probability" that no distribution gives (it is positive): the rows of a rollout
#: whose teacher read nothing privileged (its task has no skill yet), which the term leaves out, as the
#: suite's Skill-SD leaves out rollouts without a skill (methods/verl_backend/distill.py writes them)
NO_TEACHER = 1.0


def sampled_reverse_kl(config, distillation_config, model_output, data) -> tuple[torch.Tensor, dict[str, Any]]:
    """``lopd_bench_sampled_reverse_kl``: per response token ``sg[log π_S(a) − log π_T(a)] · log π_S(a)``,
    importance-weighted by ``min(π_S(a)/π_old(a), IS_CLIP)`` (the suite's sampled-token reverse KL,
    Skill-SD's term), ``[B, T]``, 0 on the rows of rollouts without a teacher (:data:`NO_TEACHER`);
    verl masks and aggregates it.  Its metrics are sums (:data:`KL_SUM` and the token counts), so
    that their ratio over a step is the token mean the suite logs as ``sdl_kl``, however verl splits
    the step into micro-batches and ranks."""
    from verl.utils.metric import AggregationType, Metric
    from verl.workers.utils.padding import no_padding_2_padding

    student = no_padding_2_padding(model_output["log_probs"], data)
    teacher = no_padding_2_padding(data["teacher_logprobs"], data).squeeze(-1)
    old = data.get("old_log_probs", None)
    if old is not None and old.is_nested:
        old = old.to_padded_tensor(0.0)
    mask = data["response_mask"]
    mask = mask.to_padded_tensor(False) if mask.is_nested else mask
    taught = teacher <= 0  # NO_TEACHER rows are positive
    teacher = teacher.clamp(max=0.0)
    per_token = sampled_token_reverse_kl(student, teacher, old, IS_CLIP if old is not None else None)
    per_token = torch.where(taught, per_token, torch.zeros_like(per_token))
    valid = mask.bool() & taught
    sums = {
        KL_SUM: float((student - teacher).detach()[valid].sum()),
        TAUGHT_TOKENS: float(valid.sum()),
        RESPONSE_TOKENS: float(mask.bool().sum()),
    }
    # a Metric of kind SUM: verl adds it over micro-batches and averages it over data-parallel ranks;
    # the run files carry the ratios (methods/verl_backend/metrics.py: sdl_kl, taught_token_share)
    return per_token, {k: Metric(AggregationType.SUM, v) for k, v in sums.items()}


#: the suite's top-k + tail reverse KL (SDPO's divergence) as a verl distillation loss mode
TOPK_TAIL_LOSS = "lopd_bench_topk_tail_reverse_kl"


def topk_tail_rows(student_logits, teacher_topk_log_probs, teacher_topk_ids, config, data_format) -> dict:
    """Per token, KL(π_S ‖ π_T) on the teacher's top-k tokens plus a tail bucket
    (:func:`methods.divergences.topk_tail_from_logp`), from the student's logits ``[1, nnz, V]`` and
    the teacher's top-k rows (nested, one per sequence), in verl's logits processor: the contract of
    verl's ``fsdp.losses.compute_forward_kl_topk`` (same inputs, ``distillation_losses``,
    ``student_mass`` and ``teacher_mass`` per token), sequence-parallel slices included.  Tokens whose
    teacher rows are :data:`NO_TEACHER` (SDPO's rollouts with no context) get 0, with no gradient,
    and ``taught`` 0 (1 elsewhere), which :func:`topk_tail_loss` reads."""
    from verl.utils.ulysses import get_ulysses_sequence_parallel_world_size, slice_input_tensor

    assert teacher_topk_log_probs.is_nested and teacher_topk_ids.is_nested
    teacher_lp = teacher_topk_log_probs.values().unsqueeze(0)  # (1, total_nnz, k)
    teacher_ids = teacher_topk_ids.values().unsqueeze(0)
    if get_ulysses_sequence_parallel_world_size() > 1:
        teacher_lp = slice_input_tensor(teacher_lp, dim=1)
        teacher_ids = slice_input_tensor(teacher_ids, dim=1)
    assert teacher_lp.shape[:2] == teacher_ids.shape[:2] == student_logits.shape[:2]
    student_lp = torch.log_softmax(student_logits.float(), dim=-1).gather(-1, teacher_ids.long())
    teacher_lp = teacher_lp.float()
    taught = teacher_lp[..., 0] <= 0  # NO_TEACHER rows are positive
    # untaught tokens compare the student with itself (finite, so where() passes no NaN back), then 0
    teacher_lp = torch.where(taught[..., None], teacher_lp, student_lp.detach())
    losses = topk_tail_from_logp(student_lp, teacher_lp, reverse=True)
    return {
        "distillation_losses": torch.where(taught, losses, torch.zeros_like(losses)),
        "student_mass": student_lp.detach().exp().sum(-1),
        "teacher_mass": teacher_lp.exp().sum(-1),
        "taught": taught.float(),
    }


def topk_tail_loss(config, distillation_config, model_output, data) -> tuple[torch.Tensor, dict[str, Any]]:
    """``lopd_bench_topk_tail_reverse_kl``'s final loss: the per-token values of :func:`topk_tail_rows`
    ``[B, T]`` (verl masks and aggregates them), with the masses' means over the taught tokens and the
    taught-token count as metrics.  A mini-batch in which no rollout is taught (every SDPO rollout
    without a context: its ``loss_mask``, and so verl's token count, is 0) gets loss 0, not 0/0."""
    from verl.utils import tensordict_utils as tu
    from verl.utils.metric import AggregationType, Metric
    from verl.workers.utils.padding import no_padding_2_padding

    losses, student_mass, teacher_mass, taught = (
        no_padding_2_padding(model_output[key], data)
        for key in ("distillation_losses", "student_mass", "teacher_mass", "taught")
    )
    mask = data["response_mask"]
    mask = mask.to_padded_tensor(False) if mask.is_nested else mask
    valid = mask.bool() & taught.bool()
    if not data["batch_num_tokens"]:  # nothing taught anywhere in the mini-batch: every loss value is 0
        tu.assign_non_tensor(data, batch_num_tokens=1)
    metrics = {
        TAUGHT_TOKENS: Metric(AggregationType.SUM, float(valid.sum())),
        RESPONSE_TOKENS: Metric(AggregationType.SUM, float(mask.bool().sum())),
    }
    if valid.any():
        metrics["distillation/student_mass"] = float(student_mass[valid].mean())
        metrics["distillation/teacher_mass"] = float(teacher_mass[valid].mean())
    return losses, metrics


def _dispatch_topk_loss() -> None:
    """Route verl's logits-processor loss by loss mode: :func:`topk_tail_rows` for
    :data:`TOPK_TAIL_LOSS`, verl's own for every other mode (its ``compute_topk_loss`` runs forward
    KL whatever the mode).  Idempotent: verl's original is kept on the module once."""
    original = getattr(verl_distill, "_lopd_bench_verl_compute_topk_loss", None)
    if original is None:
        original = verl_distill.compute_topk_loss
        verl_distill._lopd_bench_verl_compute_topk_loss = original

    def compute_topk_loss(config, distillation_config, data, student_logits, data_format):
        if distillation_config.distillation_loss.loss_mode != TOPK_TAIL_LOSS:
            return original(config, distillation_config, data, student_logits, data_format)
        if config.strategy not in ("fsdp", "fsdp2"):
            raise NotImplementedError(f"{TOPK_TAIL_LOSS} runs on the fsdp strategies, not {config.strategy!r}")
        return topk_tail_rows(
            student_logits, data["teacher_logprobs"], data["teacher_ids"], distillation_config, data_format
        )

    verl_distill.compute_topk_loss = compute_topk_loss


def _ours(registered, fn) -> bool:
    """``registered`` is ``fn`` or an earlier copy of it: this module run again (a second import after
    one that failed half-way, e.g. verl's plugin loader meeting a circular import, or a reload)."""
    return registered is fn or (
        getattr(registered, "__module__", None) == fn.__module__
        and getattr(registered, "__qualname__", None) == fn.__qualname__
    )


def _register_distillation_loss(name: str, fn, **settings) -> None:
    """``fn`` as verl's distillation loss ``name`` (an earlier copy of it replaced; another function
    under that name refused)."""
    registered = verl_distill.DISTILLATION_LOSS_REGISTRY.get(name)
    if registered is not None and not _ours(registered, fn):
        raise ValueError(f"verl already has another distillation loss named {name!r}")
    if registered is not None:
        verl_distill.DISTILLATION_LOSS_REGISTRY[name] = fn
    else:
        verl_distill.register_distillation_loss(verl_distill.DistillationLossSettings(names=[name], **settings))(fn)


def register() -> None:
    """Put the suite's functions into verl's registries (each name once; an earlier copy of this
    module's own function is replaced; another function already registered under one of the names is
    an error, raised by verl's own registries or here)."""
    for name, fn in ((ADV_ESTIMATOR, grpo_advantage), (ADV_ESTIMATOR_KEEP, grpo_advantage_keep)):
        registered = core_algos.ADV_ESTIMATOR_REGISTRY.get(name)
        if registered is not None and _ours(registered, fn):
            core_algos.ADV_ESTIMATOR_REGISTRY[name] = fn
        else:
            core_algos.register_adv_est(name)(fn)
    core_algos.register_policy_loss(POLICY_LOSS)(ppo_loss)
    _register_distillation_loss(DISTILLATION_LOSS, sampled_reverse_kl, use_estimator=True)
    # the top-k + tail reverse KL: its per-token values come from the logits processor (below), and the
    # final loss (topk_tail_loss) reads them there
    _register_distillation_loss(TOPK_TAIL_LOSS, topk_tail_loss, use_topk=True)
    _dispatch_topk_loss()


register()

# the agent loop registers itself (``lopd_bench_episode``) in the process that plays the episodes,
# and retrieval RL's trainer (``trainer.v1.trainer_mode: lopd_bench_retrieval``) in the driver
from methods.verl_backend import agent_loop, trainer  # noqa: E402, F401

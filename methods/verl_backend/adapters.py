"""Each method's verl path, as one adapter per method in one registry.

An adapter says everything the backend needs to know about a method on verl:

* ``overrides(job, seed, ctx)`` -- its ``main_ppo`` settings beyond the shared ones
  (:func:`methods.verl_backend.launch.main_ppo_config` writes the shared ones, then these);
* ``trainer_mode(job)`` -- the verl trainer it runs on (``trainer.v1.trainer_mode``: one of the
  suite's trainers in :mod:`.trainer`, or verl's own ``sync``);
* ``agent_loop_manager`` -- verl's agent-loop manager class, where the method needs its own
  (a privileged teacher's prompt handed over: :mod:`.distill`), else ``None`` (verl's);
* ``run_file_fields`` -- what it adds to the run files: the suite's train-record field <- the
  metric its trainer logs (:mod:`.metrics` maps the shared ones);
* ``reads_bank`` -- whether its run needs the seeded experience bank (``--bank``).

The backend asks :func:`adapter_for` instead of branching on names, and a method without an adapter
is refused with the list of those that have one.  A new method's verl path is one adapter class
here (or in a module of its own that this one imports), registered with :func:`register_adapter`.

Nothing here imports verl at import time (:mod:`methods.verl_backend` promises that): the trainers'
and the plugin's names are imported where an adapter's settings are built.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

__all__ = [
    "Context",
    "VerlAdapter",
    "register_adapter",
    "adapter_for",
    "supported_methods",
    "GRPO_TRAINER",
    "RETRIEVAL_TRAINER",
    "SKILL_TRAINER",
    "EMA_TRAINER",
    "SDPO_TRAINER",
]

#: the suite's verl trainers (``trainer.v1.trainer_mode``), registered by :mod:`.trainer`
GRPO_TRAINER = "lopd_bench_grpo_trainer"
RETRIEVAL_TRAINER = "lopd_bench_retrieval"
SKILL_TRAINER = "lopd_bench_skill_sd"
EMA_TRAINER = "lopd_bench_ema_teacher"
SDPO_TRAINER = "lopd_bench_sdpo"
#: the agent-loop manager of a teacher that reads a privileged prompt
PRIVILEGED_MANAGER = "methods.verl_backend.distill.PrivilegedAgentLoopManager"


@dataclass(frozen=True)
class Context:
    """What an adapter's settings may read beyond the job: the run's base model (a teacher's
    weights, its positions), the prompt budget, and the seeded bank's file."""

    model_path: str | Path
    prompt_len: int
    bank_path: str | Path | None = None


class VerlAdapter:
    """A method's verl path (module docstring).  Subclasses set ``method`` and override what differs."""

    method: ClassVar[str]
    agent_loop_manager: ClassVar[str | None] = None
    run_file_fields: ClassVar[dict[str, str]] = {}
    reads_bank: ClassVar[bool] = False

    def overrides(self, job: dict, seed: int, ctx: Context) -> dict[str, Any]:
        raise NotImplementedError

    def trainer_mode(self, job: dict) -> str | None:
        """``trainer.v1.trainer_mode``, or ``None`` for verl's default (``sync``)."""
        return None

    def settings(self, job: dict, seed: int, ctx: Context) -> dict[str, Any]:
        """The method's overrides with its trainer and agent-loop manager."""
        out = self.overrides(job, seed, ctx)
        mode = self.trainer_mode(job)
        if mode is not None:
            out["trainer.v1.trainer_mode"] = mode
        if self.agent_loop_manager is not None:
            out["actor_rollout_ref.rollout.agent.agent_loop_manager_class"] = self.agent_loop_manager
        return out


ADAPTERS: dict[str, VerlAdapter] = {}


def register_adapter(cls: type[VerlAdapter]) -> type[VerlAdapter]:
    """Class decorator: one adapter per method name."""
    if cls.method in ADAPTERS and type(ADAPTERS[cls.method]) is not cls:
        raise ValueError(f"method {cls.method!r} already has a verl adapter ({type(ADAPTERS[cls.method]).__name__})")
    ADAPTERS[cls.method] = cls()
    return cls


def supported_methods() -> tuple[str, ...]:
    return tuple(ADAPTERS)


def adapter_for(method: str) -> VerlAdapter:
    if method not in ADAPTERS:
        raise ValueError(f"method {method!r} has no verl path yet (supported: {', '.join(ADAPTERS)}; see docs/verl.md)")
    return ADAPTERS[method]


# --------------------------------------------------------------------------- GRPO and retrieval RL
@register_adapter
class GRPOAdapter(VerlAdapter):
    """GRPO's advantage and clipped loss.  Dropping zero-variance groups runs on the suite's GRPO
    trainer, whose token count is the kept groups' (:class:`.trainer.GRPOTrainer`); verl normalises a
    sequence mean by the mini-batch's size whatever the mask, so only the token mean matches the
    suite's loop there (refused otherwise)."""

    method = "grpo"

    def overrides(self, job: dict, seed: int, ctx: Context) -> dict[str, Any]:
        from methods.verl_backend.plugin import ADV_ESTIMATOR, ADV_ESTIMATOR_KEEP

        mc = job["method_config"]
        drop = bool(mc["drop_zero_variance"])
        if drop and mc["loss_agg"] != "token-mean":
            raise ValueError(
                f"{job['method']}: loss_agg {mc['loss_agg']!r} with drop_zero_variance has no verl path (verl divides "
                "a sequence mean by the mini-batch's size, dropped groups included); use token-mean or keep the groups"
            )
        return {
            "actor_rollout_ref.actor.clip_ratio_low": mc["clip_low"],
            "actor_rollout_ref.actor.clip_ratio_high": mc["clip_high"],
            "actor_rollout_ref.actor.loss_agg_mode": mc["loss_agg"],
            "algorithm.adv_estimator": ADV_ESTIMATOR if drop else ADV_ESTIMATOR_KEEP,
            "algorithm.norm_adv_by_std_in_grpo": mc["norm_by_std"],
        }

    def trainer_mode(self, job: dict) -> str | None:
        return GRPO_TRAINER if job["method_config"]["drop_zero_variance"] else None


@register_adapter
class RetrievalRLAdapter(GRPOAdapter):
    """Retrieval RL: GRPO with experience in the prompt, on the suite's trainer with the run's bank
    (:class:`.trainer.RetrievalTrainer`, which counts the kept groups' tokens as GRPO's does)."""

    method = "retrieval_rl"
    reads_bank = True
    run_file_fields = {"bank_added": "bank/added", "bank_size": "bank/size"}

    def overrides(self, job: dict, seed: int, ctx: Context) -> dict[str, Any]:
        bank, mc = job["bank"], job["method_config"]
        if bank["seed_tasks"] > 0 and (ctx.bank_path is None or not Path(ctx.bank_path).exists()):
            raise ValueError(
                f"bank.seed_tasks is {bank['seed_tasks']}, so retrieval_rl needs the seeded bank (--bank); "
                f"got {ctx.bank_path!r}"
            )
        return {
            **super().overrides(job, seed, ctx),
            "lopd_bench.retrieval": {
                "actor": f"lopd_bench_bank/{job['domain']}/retrieval_rl/seed{seed}",
                "n_retrieve": int(mc["n_retrieve"]),
                "allow_self_retrieval": bool(mc["allow_self_retrieval"]),
                "bank_config": dict(bank),
                "seed": str(Path(ctx.bank_path).resolve()) if bank["seed_tasks"] > 0 else None,
            },
        }

    def trainer_mode(self, job: dict) -> str | None:
        return RETRIEVAL_TRAINER


# --------------------------------------------------------------------------- distillation
#: the suite's divergences that verl's top-k distillation can give (the teacher's rows are its top-k)
VERL_DIVERGENCE = {"forward_kl": "forward_kl_topk"}
TEACHER = "distillation.teacher_models.teacher_model"
#: the teacher's EMA rate on verl for each weight source the reference model can hold (a
#: ``student`` teacher would be the actor itself: no verl path)
TEACHER_RATE = {"frozen": lambda mc: 0.0, "ema": lambda mc: float(mc["ema_rate"])}


def distill_topk(job: dict) -> int:
    return int((job.get("backend_options") or {}).get("distill_topk", 32))


def teacher_context_length(job: dict, model_path: str | Path, prompt_len: int) -> int:
    """The teacher's context: its prompt is the student's plus the privileged context, whose length
    nothing bounds, so as long as the model allows (``max_position_embeddings``, where the model's
    config says); without a config, a student's sequence plus one more prompt."""
    config = Path(model_path) / "config.json"
    if config.exists():
        limit = json.loads(config.read_text()).get("max_position_embeddings")
        if limit:
            return int(limit)
    return job["train"]["max_seq_len"] + prompt_len


def no_teacher_pool(model_path: str | Path) -> dict[str, Any]:
    """A distillation config whose teacher lives in the run's own workers (Skill-SD, OPSD, SDFT):
    verl's config checks a one-GPU teacher pool, which :class:`.trainer._OwnTeacher` never starts."""
    return {
        "distillation.enabled": True,
        "distillation.n_gpus_per_node": 1,
        "distillation.nnodes": 1,
        f"{TEACHER}.model_path": str(model_path),
        f"{TEACHER}.inference.tensor_model_parallel_size": 1,
    }


class _PrivilegedTeacher(VerlAdapter):
    """A teacher that reads a privileged prompt (``teacher_context``), handed over by the agent loop."""

    teacher_context: ClassVar[str]
    agent_loop_manager = PRIVILEGED_MANAGER


class _ReferenceModelTeacher(_PrivilegedTeacher):
    """verl's top-k forward KL with no reward, the teacher reading the task's demonstration, kept as
    the actor worker's reference model and scored by the trainer after the rollouts
    (:class:`.trainer.EMATeacherTrainer`), in fp32 (an EMA's updates are 1 % steps): the frozen base
    (rate 0) or an EMA of the student, by the method's ``teacher_source``."""

    teacher_context = "expert"
    run_file_fields = {"signal_share": "teacher/signal_share"}  # as the suite's loop logs it

    def loss_mode(self, job: dict) -> str:
        """verl's distillation loss for the method's divergence (the teacher's rows are its top-k)."""
        mc = job["method_config"]
        if mc["divergence"] not in VERL_DIVERGENCE:
            raise ValueError(
                f"{job['method']}: divergence {mc['divergence']!r} has no verl path (verl's loss reads the "
                f"teacher's top-k log-probabilities; supported: {', '.join(VERL_DIVERGENCE)})"
            )
        return VERL_DIVERGENCE[mc["divergence"]]

    def topk(self, job: dict) -> int:
        """How many of the teacher's top tokens each row keeps."""
        return distill_topk(job)

    def overrides(self, job: dict, seed: int, ctx: Context) -> dict[str, Any]:
        from methods.verl_backend.plugin import ADV_ESTIMATOR_KEEP

        mc, opts = job["method_config"], job.get("backend_options") or {}
        loss_mode = self.loss_mode(job)
        if mc["teacher_source"] not in TEACHER_RATE:
            raise ValueError(
                f"{job['method']}: teacher_source {mc['teacher_source']!r} has no verl path (the reference model "
                f"holds {' or '.join(map(repr, TEACHER_RATE))} weights)"
            )
        return {
            "distillation.enabled": True,
            "distillation.distillation_loss.loss_mode": loss_mode,
            "distillation.distillation_loss.topk": self.topk(job),
            "distillation.distillation_loss.use_task_rewards": False,  # the teacher's distribution is the only signal
            "distillation.distillation_loss.use_policy_gradient": False,
            "actor_rollout_ref.actor.loss_agg_mode": "token-mean",  # the suite's distillation loss
            "lopd_bench.teacher_context": self.teacher_context,
            # group_size 1: every group is one rollout; the suite's dropping estimator would clear them all
            "algorithm.adv_estimator": ADV_ESTIMATOR_KEEP,
            **no_teacher_pool(ctx.model_path),
            "actor_rollout_ref.ref.fsdp_config.model_dtype": "fp32",  # the EMA's weights (verl's default, explicit)
            # verl builds the reference model's engine config from these (ActorRolloutRefWorker.init_model)
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 1,
            "lopd_bench.teacher_in_trainer": True,
            "lopd_bench.ema_teacher": {
                "rate": TEACHER_RATE[mc["teacher_source"]](mc),
                "topk": self.topk(job),
                # padded tokens per teacher forward (the rollout's log-prob budget per GPU by default)
                "max_tokens": int(opts.get("teacher_max_tokens", 16384)),
                # the suite's teacher gives no signal past the model's positions (docs/verl.md)
                "max_len": teacher_context_length(job, ctx.model_path, ctx.prompt_len),
            },
        }

    def trainer_mode(self, job: dict) -> str | None:
        return EMA_TRAINER


@register_adapter
class OPSDAdapter(_ReferenceModelTeacher):
    """OPSD: the frozen base policy as the teacher (the reference model as loaded, rate 0: never
    moved, never saved), so OPSD runs on the student's GPUs with exact top-k rows."""

    method = "opsd"


@register_adapter
class SDFTAdapter(_ReferenceModelTeacher):
    """SDFT: an EMA of the student as the teacher (rate ``ema_rate``)."""

    method = "sdft"


@register_adapter
class SDPOAdapter(_ReferenceModelTeacher):
    """SDPO: an EMA of the student (rate ``ema_rate``) as the teacher, reading a successful sibling's
    trace or the rollout's feedback, which its trainer builds from the step's groups
    (:class:`.trainer.SDPOTrainer`, :mod:`.sdpo`); the suite's top-k + tail reverse KL on the teacher's
    top-``topk`` support as verl's loss (``plugin.TOPK_TAIL_LOSS``)."""

    method = "sdpo"
    teacher_context = "sdpo"

    def loss_mode(self, job: dict) -> str:
        from methods.verl_backend.plugin import TOPK_TAIL_LOSS

        mc = job["method_config"]
        if mc["divergence"] != "topk_tail" or mc["topk_support"] != "teacher":
            raise ValueError(
                f"sdpo: divergence {mc['divergence']!r} on the {mc['topk_support']!r} support has no verl path (verl's "
                "rows are the teacher's top-k: topk_tail on the teacher's support)"
            )
        return TOPK_TAIL_LOSS

    def topk(self, job: dict) -> int:
        return int(job["method_config"]["topk"])  # the tail bucket's M: the rows are exactly the suite's support

    def overrides(self, job: dict, seed: int, ctx: Context) -> dict[str, Any]:
        mc = job["method_config"]
        return {
            **super().overrides(job, seed, ctx),
            "lopd_bench.sdpo": {
                "success_threshold": float(mc["success_threshold"]),
                "use_sibling": bool(mc["use_sibling"]),
                "use_feedback": bool(mc["use_feedback"]),
            },
        }

    def trainer_mode(self, job: dict) -> str | None:
        return SDPO_TRAINER


#: the top-k over which Skill-SD's teacher log-probabilities are renormalised at the rollout
#: temperature (vLLM's default ``max_logprobs``)
SKILL_TEACHER_TOPK = 20


@register_adapter
class SkillSDAdapter(_PrivilegedTeacher, GRPOAdapter):
    """Skill-SD: GRPO (with Skill-SD's clip range) plus λ_sdl times the sampled-token reverse KL to
    the student itself reading the task's skill; the teacher is scored on the run's rollout servers
    (:class:`.trainer.SkillTrainer`), and the skills live in a library actor the agent loops reach
    (:mod:`.skills`)."""

    method = "skill_sd"
    teacher_context = "skill"
    run_file_fields = {"skills": "skills/size", "skills_added": "skills/added", "skill_share": "skills/share"}

    def overrides(self, job: dict, seed: int, ctx: Context) -> dict[str, Any]:
        from methods.verl_backend.plugin import ADV_ESTIMATOR_KEEP, DISTILLATION_LOSS, IS_CLIP

        mc = job["method_config"]
        if mc["is_clip"] != IS_CLIP:
            raise ValueError(f"skill_sd: is_clip {mc['is_clip']} has no verl path; the plugin's term caps at {IS_CLIP}")
        limit = teacher_context_length(job, ctx.model_path, ctx.prompt_len)
        grpo = super().overrides(dict(job, method_config=dict(mc, drop_zero_variance=False)), seed, ctx)
        return {
            **grpo,
            **no_teacher_pool(ctx.model_path),  # the teacher is the student, on the rollout servers
            "distillation.distillation_loss.loss_mode": DISTILLATION_LOSS,
            "distillation.distillation_loss.use_task_rewards": True,  # GRPO's loss, plus the term below
            "distillation.distillation_loss.distillation_loss_coef": float(mc["sdl_weight"]),
            "distillation.distillation_loss.use_policy_gradient": False,  # the surrogate is back-propagated
            "distillation.distillation_loss.loss_max_clamp": None,  # the suite clamps nothing
            "distillation.distillation_loss.log_prob_min_clamp": None,
            # zero-variance groups stay in the response mask (advantage 0): verl's distillation loss fails
            # on a micro-batch whose mask is empty (its loss-range metric), and the suite's Skill-SD
            # distils those rollouts too; the PPO term is then normalised over every response token, as
            # verl's grpo does, where the suite's default normalises over the varied groups' (docs/verl.md)
            "algorithm.adv_estimator": ADV_ESTIMATOR_KEEP,
            # the teacher's sequence is the student's plus the skill, on the same servers
            "actor_rollout_ref.rollout.max_model_len": limit,
            "lopd_bench.teacher_context": self.teacher_context,
            "lopd_bench.teacher_max_len": limit,
            # the sampled tokens' log-probabilities come at temperature 1; the worker tempers them to the
            # student's with the top-k as normaliser (distill.py), which the servers must be able to return
            "lopd_bench.teacher_temperature": float(job["train"]["temperature"]),
            "lopd_bench.teacher_topk": SKILL_TEACHER_TOPK,
            "actor_rollout_ref.rollout.engine_kwargs.vllm.max_logprobs": SKILL_TEACHER_TOPK,
            # the teacher's prompt log-probabilities with the prefix cache on have been reported to depend on
            # request order (vllm-project/vllm#42019, open); off, a multi-turn episode's later turns are
            # prefilled again (code's real-verl episodes are single-turn)
            "actor_rollout_ref.rollout.enable_prefix_caching": False,
            "lopd_bench.skills": {
                "actor": f"lopd_bench_skills/{job['domain']}/skill_sd/seed{seed}",
                "ucb_c": float(mc["ucb_c"]),
                "max_skill_chars": int(mc["max_skill_chars"]),
            },
        }

    def trainer_mode(self, job: dict) -> str | None:
        return SKILL_TRAINER

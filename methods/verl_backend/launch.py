"""The verl run of one job: ``main_ppo``'s config generated from the suite's resolved job.

verl's own ``ppo_trainer.yaml`` is composed with Hydra and overridden with the job's settings, so
every setting the job does not name keeps verl's default, and the result passes verl's own
``validate_config`` (checked by the tests on CPU).  The budget is matched by construction, as in
the suite's loop: ``rollout.n`` is the method's group size, ``data.train_batch_size`` x ``rollout.n``
is ``train.rollouts_per_step``, and ``trainer.total_training_steps`` x that is
``train.rollout_budget``.  verl validates before training and every ``train.eval_every`` rollouts,
dumping per-episode scores for the metrics adapter (:mod:`.metrics`).

Only the methods whose verl path exists are accepted (GRPO, retrieval RL, OPSD, SDFT and Skill-SD
today; ``docs/verl.md``), each on the student's GPUs alone.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from methods.verl_backend import EMA_TEACHER, SUPPORTED_METHODS, TEACHER_CONTEXT

__all__ = ["SUPPORTED_METHODS", "main_ppo_config", "validate", "write_config", "rollouts_per_step"]


def rollouts_per_step(job: dict) -> int:
    return int(job["train"]["rollouts_per_step"])


#: the attention implementation of the policy's (and the reference model's) HF model on verl: torch's
#: own, since ``envs/verl.yaml`` carries no flash-attn; a profile may name another
#: (``backend_options.attn_implementation``) in an environment that has it
ATTN_IMPLEMENTATION = "sdpa"


def attention_implementation(job: dict) -> str:
    return str((job.get("backend_options") or {}).get("attn_implementation", ATTN_IMPLEMENTATION))


def _steps(job: dict, key: str) -> int:
    train = job["train"]
    per_step = rollouts_per_step(job)
    if train[key] % per_step:
        raise ValueError(
            f"train.{key} ({train[key]}) must be a multiple of train.rollouts_per_step ({per_step}) on verl"
        )
    return train[key] // per_step


def main_ppo_config(
    job: dict,
    seed: int,
    *,
    model_path: str | Path,
    data_dir: str | Path,
    run_dir: str | Path,
    n_gpus_per_node: int = 1,
    rollout_engine: str = "vllm",
    bank_path: str | Path | None = None,
) -> DictConfig:
    """verl's ``main_ppo`` config for ``job`` (a resolved job of a supported method).

    ``data_dir`` holds ``export-verl``'s parquet files; ``run_dir`` gets verl's log
    (``verl.<attempt>.jsonl``: set ``VERL_FILE_LOGGER_PATH`` to it), validation dumps (``val/``) and
    checkpoints.  A method that reads an experience bank (retrieval RL) gets verl's synchronous
    trainer with the suite's bank (:mod:`.trainer`), seeded from ``bank_path`` (the ``bank`` rule's
    file; required when the profile seeds the bank, ``bank.seed_tasks`` > 0)."""
    import verl
    from hydra import compose, initialize_config_dir

    from methods.verl_backend.plugin import POLICY_LOSS

    method = job.get("method")
    if method not in SUPPORTED_METHODS:
        raise ValueError(
            f"method {method!r} has no verl path yet (supported: {', '.join(SUPPORTED_METHODS)}; see docs/verl.md)"
        )
    train, mc = job["train"], job["method_config"]
    group = int(mc["group_size"])
    per_step = rollouts_per_step(job)
    if per_step % group or train["minibatch_rollouts"] % group:
        raise ValueError(
            f"train.rollouts_per_step and train.minibatch_rollouts must be multiples of group_size {group}"
        )
    prompt_len = int((job.get("backend_options") or {}).get("max_prompt_length", min(1024, train["max_seq_len"] // 2)))
    data_dir, run_dir = Path(data_dir), Path(run_dir)
    overrides = {
        "data.train_files": str(data_dir / "train.parquet"),
        "data.val_files": str(data_dir / "test.parquet"),
        "data.train_batch_size": per_step // group,
        "data.max_prompt_length": prompt_len,
        "data.max_response_length": train["max_seq_len"] - prompt_len,
        "data.filter_overlong_prompts": True,
        "data.truncation": "error",
        "data.seed": seed,
        "actor_rollout_ref.model.path": str(model_path),
        # verl's default is flash_attention_2 (ModelConfig), which the locked environment does not carry
        "actor_rollout_ref.model.override_config.attn_implementation": attention_implementation(job),
        "actor_rollout_ref.actor.optim.lr": train["lr"],
        "actor_rollout_ref.actor.optim.weight_decay": train["weight_decay"],
        "actor_rollout_ref.actor.grad_clip": train["grad_clip"],
        "actor_rollout_ref.actor.ppo_epochs": train["ppo_epochs"],
        "actor_rollout_ref.actor.ppo_mini_batch_size": train["minibatch_rollouts"] // group,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 1,
        "actor_rollout_ref.actor.use_kl_loss": False,
        "actor_rollout_ref.actor.entropy_coeff": 0.0,
        "actor_rollout_ref.actor.policy_loss.loss_mode": POLICY_LOSS,
        "actor_rollout_ref.rollout.name": rollout_engine,
        "actor_rollout_ref.rollout.n": group,
        "actor_rollout_ref.rollout.temperature": train["temperature"],
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 1,
        "actor_rollout_ref.rollout.val_kwargs.temperature": train["eval_temperature"],
        "actor_rollout_ref.rollout.val_kwargs.do_sample": train["eval_temperature"] > 0,
        "actor_rollout_ref.rollout.val_kwargs.n": 1,
        "algorithm.use_kl_in_reward": False,
        "critic.enable": False,
        "trainer.total_training_steps": _steps(job, "rollout_budget"),
        "trainer.test_freq": _steps(job, "eval_every"),
        "trainer.val_before_train": True,
        "trainer.logger": ["console", "file"],
        "trainer.validation_data_dir": str(run_dir / "val"),
        "trainer.default_local_dir": str(run_dir / "checkpoints"),
        "trainer.project_name": "lopd_bench",
        "trainer.experiment_name": f"{job['domain']}-{method}-seed{seed}",
        "trainer.n_gpus_per_node": n_gpus_per_node,
        "trainer.nnodes": 1,  # one node: nothing here starts Ray on a second (README, docs/verl.md)
        "trainer.save_freq": _steps(job, "eval_every"),
    }
    if method in EMA_TEACHER:
        overrides.update(_ema_teacher(job, model_path, prompt_len))
    else:  # GRPO's outcome advantage and clipped loss (retrieval RL: GRPO with experience in the prompt)
        overrides.update(_grpo(job))
    if method == "retrieval_rl":
        overrides.update(_retrieval(job, seed, bank_path))
    if method == "skill_sd":
        overrides.update(_skill_sd(job, seed, model_path, prompt_len))
    _refuse_sequence_mean_of_kept_groups(job, overrides)
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose("ppo_trainer")
    with open_dict(cfg):  # the suite's own section (lopd_bench) is not in verl's schema
        for key, value in overrides.items():
            OmegaConf.update(cfg, key, value, merge=False)
    return cfg


def _grpo(job: dict) -> dict:
    """GRPO's advantage and clipped loss.  Dropping zero-variance groups runs on the suite's GRPO
    trainer, whose token count is the kept groups' (:class:`.trainer.GRPOTrainer`; retrieval RL's
    trainer does the same); verl normalises a sequence mean by the mini-batch's size whatever the
    mask, so only the token mean matches the suite's loop there."""
    from methods.verl_backend.plugin import ADV_ESTIMATOR, ADV_ESTIMATOR_KEEP
    from methods.verl_backend.trainer import GRPO_TRAINER

    mc = job["method_config"]
    drop = bool(mc["drop_zero_variance"])
    overrides = {
        "actor_rollout_ref.actor.clip_ratio_low": mc["clip_low"],
        "actor_rollout_ref.actor.clip_ratio_high": mc["clip_high"],
        "actor_rollout_ref.actor.loss_agg_mode": mc["loss_agg"],
        "algorithm.adv_estimator": ADV_ESTIMATOR if drop else ADV_ESTIMATOR_KEEP,
        "algorithm.norm_adv_by_std_in_grpo": mc["norm_by_std"],
    }
    if drop:
        overrides["trainer.v1.trainer_mode"] = GRPO_TRAINER  # retrieval RL's own trainer replaces it below
    return overrides


def _refuse_sequence_mean_of_kept_groups(job: dict, overrides: dict) -> None:
    from methods.verl_backend.plugin import ADV_ESTIMATOR

    agg = overrides.get("actor_rollout_ref.actor.loss_agg_mode")
    if overrides.get("algorithm.adv_estimator") == ADV_ESTIMATOR and agg != "token-mean":
        raise ValueError(
            f"{job['method']}: loss_agg {agg!r} with drop_zero_variance has no verl path (verl divides a sequence "
            "mean by the mini-batch's size, dropped groups included); use token-mean or keep the groups"
        )


#: the suite's divergences that verl's top-k distillation can give (the teacher's rows are its top-k)
VERL_DIVERGENCE = {"forward_kl": "forward_kl_topk"}

TEACHER = "distillation.teacher_models.teacher_model"


def _topk_distillation(job: dict) -> dict:
    """OPSD's and SDFT's loss and hand-over: verl's top-k forward KL on the student's samples, no
    reward in the loss, the teacher reading the privileged prompt (:mod:`.distill`)."""
    from methods.verl_backend.plugin import ADV_ESTIMATOR_KEEP

    mc = job["method_config"]
    if mc["divergence"] not in VERL_DIVERGENCE:
        raise ValueError(
            f"{job['method']}: divergence {mc['divergence']!r} has no verl path (verl's loss reads the teacher's "
            f"top-k log-probabilities; supported: {', '.join(VERL_DIVERGENCE)})"
        )
    return {
        "distillation.enabled": True,
        "distillation.distillation_loss.loss_mode": VERL_DIVERGENCE[mc["divergence"]],
        "distillation.distillation_loss.topk": _distill_topk(job),
        "distillation.distillation_loss.use_task_rewards": False,  # the teacher's distribution is the only signal
        "distillation.distillation_loss.use_policy_gradient": False,
        "actor_rollout_ref.actor.loss_agg_mode": "token-mean",  # the suite's distillation loss (methods/core/distill.py)
        "actor_rollout_ref.rollout.agent.agent_loop_manager_class": "methods.verl_backend.distill.PrivilegedAgentLoopManager",
        "lopd_bench.teacher_context": TEACHER_CONTEXT[job["method"]],
        # group_size 1: every group is one rollout; the suite's dropping estimator would clear them all
        "algorithm.adv_estimator": ADV_ESTIMATOR_KEEP,
    }


def _distill_topk(job: dict) -> int:
    return int((job.get("backend_options") or {}).get("distill_topk", 32))


def _no_teacher_pool(model_path: str | Path) -> dict:
    """A distillation config whose teacher lives in the run's own workers (Skill-SD, SDFT): verl's
    config checks a one-GPU teacher pool, which :class:`.trainer._OwnTeacher` never starts."""
    return {
        "distillation.enabled": True,
        "distillation.n_gpus_per_node": 1,
        "distillation.nnodes": 1,
        f"{TEACHER}.model_path": str(model_path),
        f"{TEACHER}.inference.tensor_model_parallel_size": 1,
    }


#: the teacher's EMA rate on verl for each weight source the reference model can hold (a
#: ``student`` teacher would be the actor itself: no verl path)
TEACHER_RATE = {"frozen": lambda mc: 0.0, "ema": lambda mc: float(mc["ema_rate"])}


def _ema_teacher(job: dict, model_path: str | Path, prompt_len: int) -> dict:
    """OPSD's and SDFT's settings: verl's top-k forward KL with no reward, the teacher reading the
    privileged prompt, kept as the actor worker's reference model and scored by the trainer after
    the rollouts (:class:`.trainer.EMATeacherTrainer`), in fp32 (an EMA's updates are 1 % steps).
    SDFT's teacher is an EMA of the student; OPSD's is the frozen base policy, which the reference
    model is when loaded, kept at rate 0 (never moved, never saved: a resumed run loads it from
    the base model again).  So OPSD runs on the student's GPUs, with the teacher's exact top-k
    rows at the student's temperature."""
    from methods.verl_backend.trainer import EMA_TRAINER

    mc, opts = job["method_config"], job.get("backend_options") or {}
    if mc["teacher_source"] not in TEACHER_RATE:
        raise ValueError(
            f"{job['method']}: teacher_source {mc['teacher_source']!r} has no verl path (the reference model holds "
            f"{' or '.join(map(repr, TEACHER_RATE))} weights)"
        )
    return {
        **_topk_distillation(job),
        **_no_teacher_pool(model_path),
        "actor_rollout_ref.ref.fsdp_config.model_dtype": "fp32",  # the EMA's weights (verl's default, made explicit)
        # verl builds the reference model's engine config from these (ActorRolloutRefWorker.init_model)
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 1,
        "trainer.v1.trainer_mode": EMA_TRAINER,
        "lopd_bench.teacher_in_trainer": True,
        "lopd_bench.ema_teacher": {
            "rate": TEACHER_RATE[mc["teacher_source"]](mc),
            "topk": _distill_topk(job),
            # padded tokens per teacher forward (the rollout's log-prob budget per GPU by default)
            "max_tokens": int(opts.get("teacher_max_tokens", 16384)),
            # the suite's teacher gives no signal past the model's positions (docs/verl.md)
            "max_len": _teacher_context_length(job, model_path, prompt_len),
        },
    }


def _teacher_context_length(job: dict, model_path: str | Path, prompt_len: int) -> int:
    """The teacher's context: its prompt is the student's plus the privileged context, whose length
    nothing bounds, so as long as the model allows (``max_position_embeddings``, where the model's
    config says); without a config, a student's sequence plus one more prompt."""
    config = Path(model_path) / "config.json"
    if config.exists():
        limit = json.loads(config.read_text()).get("max_position_embeddings")
        if limit:
            return int(limit)
    return job["train"]["max_seq_len"] + prompt_len


def _retrieval(job: dict, seed: int, bank_path: str | Path | None) -> dict:
    """Retrieval RL's settings: the suite's trainer and the bank its agent loops query."""
    from methods.verl_backend.trainer import TRAINER

    bank, mc = job["bank"], job["method_config"]
    if bank["seed_tasks"] > 0 and (bank_path is None or not Path(bank_path).exists()):
        raise ValueError(
            f"bank.seed_tasks is {bank['seed_tasks']}, so retrieval_rl needs the seeded bank (--bank); got {bank_path!r}"
        )
    return {
        "trainer.v1.trainer_mode": TRAINER,
        "lopd_bench.retrieval": {
            "actor": f"lopd_bench_bank/{job['domain']}/retrieval_rl/seed{seed}",
            "n_retrieve": int(mc["n_retrieve"]),
            "allow_self_retrieval": bool(mc["allow_self_retrieval"]),
            "bank_config": dict(bank),
            "seed": str(Path(bank_path).resolve()) if bank["seed_tasks"] > 0 else None,
        },
    }


#: the top-k over which Skill-SD's teacher log-probabilities are renormalised at the rollout
#: temperature (vLLM's default ``max_logprobs``)
SKILL_TEACHER_TOPK = 20


def _skill_sd(job: dict, seed: int, model_path: str | Path, prompt_len: int) -> dict:
    """Skill-SD's settings: GRPO (set above, with Skill-SD's clip range) plus λ_sdl times the
    sampled-token reverse KL to the student itself reading the task's skill; the teacher is scored
    on the run's rollout servers (:class:`.trainer.SkillTrainer`), and the skills live in a library
    actor the agent loops reach (:mod:`.skills`)."""
    from methods.verl_backend.plugin import ADV_ESTIMATOR_KEEP, DISTILLATION_LOSS, IS_CLIP
    from methods.verl_backend.trainer import SKILL_TRAINER

    mc = job["method_config"]
    if mc["is_clip"] != IS_CLIP:
        raise ValueError(f"skill_sd: is_clip {mc['is_clip']} has no verl path; the plugin's term caps at {IS_CLIP}")
    limit = _teacher_context_length(job, model_path, prompt_len)
    return {
        **_no_teacher_pool(model_path),  # the teacher is the student, on the rollout servers
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
        "actor_rollout_ref.rollout.agent.agent_loop_manager_class": "methods.verl_backend.distill.PrivilegedAgentLoopManager",
        "trainer.v1.trainer_mode": SKILL_TRAINER,
        "lopd_bench.teacher_context": TEACHER_CONTEXT["skill_sd"],
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


def validate(cfg: DictConfig) -> None:
    """verl's own check of a ``main_ppo`` config (what ``main_ppo`` runs before anything starts)."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from methods.verl_backend.trainer import EMA_TRAINER

    # the EMA trainer builds the reference model (its teacher) though no KL to it is asked for
    ema = OmegaConf.select(cfg, "trainer.v1.trainer_mode") == EMA_TRAINER
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg) or ema, use_critic=need_critic(cfg))


def write_config(cfg: DictConfig, path: str | Path) -> None:
    """Write ``cfg`` as the YAML ``main_ppo --config-path DIR --config-name NAME`` reads (atomically)."""
    from methods.core.provenance import write_text_atomic

    write_text_atomic(Path(path), OmegaConf.to_yaml(cfg))

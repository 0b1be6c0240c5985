"""The verl run of one job: ``main_ppo``'s config generated from the suite's resolved job.

verl's own ``ppo_trainer.yaml`` is composed with Hydra and overridden with the job's settings, so
every setting the job does not name keeps verl's default, and the result passes verl's own
``validate_config`` (checked by the tests on CPU).  The budget is matched by construction, as in
the suite's loop: ``rollout.n`` is the method's group size, ``data.train_batch_size`` x ``rollout.n``
is ``train.rollouts_per_step``, and ``trainer.total_training_steps`` x that is
``train.rollout_budget``.  verl validates before training and every ``train.eval_every`` rollouts,
dumping per-episode scores for the metrics adapter (:mod:`.metrics`).

The shared settings are here; each method's own come from its adapter (:mod:`.adapters`), and a
method without one is refused (GRPO, retrieval RL, OPSD, SDFT and Skill-SD have one today;
``docs/verl.md``), each on the student's GPUs alone.
"""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from methods.verl_backend.adapters import EMA_TRAINER, Context, adapter_for

__all__ = ["main_ppo_config", "validate", "write_config", "rollouts_per_step"]


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
    adapter = adapter_for(method)  # refuses a method without a verl path
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
    overrides.update(adapter.settings(job, seed, Context(model_path, prompt_len, bank_path)))
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose("ppo_trainer")
    with open_dict(cfg):  # the suite's own section (lopd_bench) is not in verl's schema
        for key, value in overrides.items():
            OmegaConf.update(cfg, key, value, merge=False)
    return cfg


def validate(cfg: DictConfig) -> None:
    """verl's own check of a ``main_ppo`` config (what ``main_ppo`` runs before anything starts)."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    # the EMA trainer builds the reference model (its teacher) though no KL to it is asked for
    ema = OmegaConf.select(cfg, "trainer.v1.trainer_mode") == EMA_TRAINER
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg) or ema, use_critic=need_critic(cfg))


def write_config(cfg: DictConfig, path: str | Path) -> None:
    """Write ``cfg`` as the YAML ``main_ppo --config-path DIR --config-name NAME`` reads (atomically)."""
    from methods.core.provenance import write_text_atomic

    write_text_atomic(Path(path), OmegaConf.to_yaml(cfg))

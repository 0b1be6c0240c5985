"""The verl trainer of retrieval RL (``trainer.v1.trainer_mode: lopd_bench_retrieval``).

verl's synchronous trainer (``PPOTrainerSync``), plus the experience bank of
:mod:`methods.verl_backend.bank`:

* after initialisation (and any checkpoint load), it starts the run's bank actor, from the
  checkpoint's bank when the run resumes, else from the seed bank;
* after each step's update it commits the trajectories the agent loops staged during the step's
  rollouts, and logs the step's ``bank/added`` and ``bank/size``; the suite's loop grows the bank at
  the same point (:meth:`methods.retrieval_rl.RetrievalRL.after_step`);
* with each checkpoint it saves the bank beside verl's own files (``lopd_bench_bank.pt``), so a
  resumed run's bank is the one it had at that step.

verl picks a trainer class by ``trainer.v1.trainer_mode`` and then uses the same setting to choose
between its synchronous and asynchronous machinery (the replay buffer, the refill rules); this
trainer is the synchronous one, so it sets the mode back to ``sync`` before verl reads it.
"""

from __future__ import annotations

import os

import ray
from omegaconf import open_dict
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from .bank import retrieval_settings, start_bank

__all__ = ["TRAINER", "RetrievalTrainer", "BANK_FILE"]

TRAINER = "lopd_bench_retrieval"
BANK_FILE = "lopd_bench_bank.pt"


def checkpoint_dir(config, step: int) -> str:
    """The folder of verl's checkpoint at ``step``: where ``_save_checkpoint`` writes it
    (``trainer.default_local_dir/global_step_<step>``), or the folder a ``resume_path`` run names."""
    if step > 0 and config.trainer.get("resume_mode") == "resume_path" and config.trainer.get("resume_from_path"):
        path = str(config.trainer.resume_from_path)
        if path.rstrip("/").endswith(f"global_step_{step}"):
            return path if os.path.isabs(path) else os.path.join(os.getcwd(), path)
    root = config.trainer.default_local_dir
    return os.path.join(root if os.path.isabs(root) else os.path.join(os.getcwd(), root), f"global_step_{step}")


def _register(cls):
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    # idempotent: verl's plugin loader and a direct import may both import this module
    return TRAINER_REGISTRY[TRAINER] if TRAINER in TRAINER_REGISTRY else register_trainer(TRAINER)(cls)


@_register
class RetrievalTrainer(PPOTrainerSync):
    """verl's synchronous trainer with the run's experience bank (module docstring)."""

    def __init__(self, config):
        self.retrieval = retrieval_settings(config)
        if self.retrieval is None:
            raise ValueError(f"trainer_mode {TRAINER} needs a lopd_bench.retrieval section in the config")
        with open_dict(config):
            config.trainer.v1.trainer_mode = "sync"
        super().__init__(config)
        self.bank = None

    def on_init_end(self):
        super().on_init_end()
        saved = None
        if self.global_steps > 0:  # resumed: the bank as it was saved with this checkpoint
            saved = os.path.join(checkpoint_dir(self.config, self.global_steps), BANK_FILE)
            if not os.path.exists(saved):
                raise FileNotFoundError(f"{saved}: the checkpoint has no experience bank to resume from")
        self.bank = start_bank(self.retrieval)
        if saved is not None:
            ray.get(self.bank.load.remote(saved))

    def step(self, metrics, timing_raw):
        batch = super().step(metrics, timing_raw)
        metrics.update(ray.get(self.bank.commit.remote(self.global_steps)))
        return batch

    def _save_checkpoint(self):
        # the bank first: verl marks the checkpoint complete (latest_checkpointed_iteration.txt) as
        # its last act, and a resumed run must find the bank in any checkpoint marked complete
        ray.get(self.bank.save.remote(os.path.join(checkpoint_dir(self.config, self.global_steps), BANK_FILE)))
        super()._save_checkpoint()

"""The suite's verl trainers: retrieval RL's (``trainer.v1.trainer_mode: lopd_bench_retrieval``) and
Skill-SD's (``lopd_bench_skill_sd``).

Both are verl's synchronous trainer (``PPOTrainerSync``) plus one per-run service that the agent
loops reach by name, a Ray actor that grows with the run's own rollouts:

* retrieval RL: the experience bank of :mod:`methods.verl_backend.bank`;
* Skill-SD: the skill library of :mod:`methods.verl_backend.skills`.

For either, the trainer

* starts the service after initialisation (and any checkpoint load), from the checkpoint's copy
  when the run resumes (the bank otherwise from the seed bank, the library empty);
* commits what the agent loops staged during the step's rollouts once the step's update is done,
  and logs the step's metrics (``bank/added``, ``bank/size``; ``skills/added``, ``skills/size``,
  ``skills/share``); the suite's loop grows both at the same point (``after_step``);
* saves the service's state beside verl's own files with each checkpoint, before verl marks the
  checkpoint complete, so a resumed run continues from the state it had at that step.

Skill-SD's teacher is the student itself, synced every step, so :class:`SkillTrainer` starts no
teacher pool: it hands verl its own rollout servers' client as the teacher's
(:meth:`SkillTrainer.get_teacher_client`), and verl's distillation scores the teacher prompts there
(:mod:`methods.verl_backend.distill`).

verl picks a trainer class by ``trainer.v1.trainer_mode`` and then uses the same setting to choose
between its synchronous and asynchronous machinery (the replay buffer, the refill rules); these
trainers are synchronous, so they set the mode back to ``sync`` before verl reads it.
"""

from __future__ import annotations

import contextlib
import os

import ray
from omegaconf import open_dict
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from .bank import retrieval_settings, start_bank
from .skills import skill_settings, start_skills

__all__ = ["TRAINER", "SKILL_TRAINER", "RetrievalTrainer", "SkillTrainer", "BANK_FILE", "SKILLS_FILE"]

TRAINER = "lopd_bench_retrieval"
SKILL_TRAINER = "lopd_bench_skill_sd"
BANK_FILE = "lopd_bench_bank.pt"
SKILLS_FILE = "lopd_bench_skills.json"


def checkpoint_dir(config, step: int) -> str:
    """The folder of verl's checkpoint at ``step``: where ``_save_checkpoint`` writes it
    (``trainer.default_local_dir/global_step_<step>``), or the folder a ``resume_path`` run names."""
    if step > 0 and config.trainer.get("resume_mode") == "resume_path" and config.trainer.get("resume_from_path"):
        path = str(config.trainer.resume_from_path)
        if path.rstrip("/").endswith(f"global_step_{step}"):
            return path if os.path.isabs(path) else os.path.join(os.getcwd(), path)
    root = config.trainer.default_local_dir
    return os.path.join(root if os.path.isabs(root) else os.path.join(os.getcwd(), root), f"global_step_{step}")


def _register(name: str):
    def decorate(cls):
        from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

        # idempotent: verl's plugin loader and a direct import may both import this module
        return TRAINER_REGISTRY[name] if name in TRAINER_REGISTRY else register_trainer(name)(cls)

    return decorate


class _ServiceTrainer(PPOTrainerSync):
    """verl's synchronous trainer with one of the suite's per-run services (module docstring)."""

    MODE: str  # the trainer_mode this class is registered under
    FILE: str  # the service's state in a checkpoint folder
    WHAT: str  # what the service holds, for messages

    @staticmethod
    def settings(config) -> dict | None:
        raise NotImplementedError

    @staticmethod
    def start(settings: dict):
        raise NotImplementedError

    def __init__(self, config):
        self.service_settings = self.settings(config)
        if self.service_settings is None:
            raise ValueError(f"trainer_mode {self.MODE} needs its lopd_bench section in the config ({self.WHAT})")
        with open_dict(config):
            config.trainer.v1.trainer_mode = "sync"
        super().__init__(config)
        self.service = None

    def on_init_end(self):
        super().on_init_end()
        saved = None
        if self.global_steps > 0:  # resumed: the service's state as it was saved with this checkpoint
            saved = os.path.join(checkpoint_dir(self.config, self.global_steps), self.FILE)
            if not os.path.exists(saved):
                raise FileNotFoundError(f"{saved}: the checkpoint has no {self.WHAT} to resume from")
        self.service = self.start(self.service_settings)
        if saved is not None:
            ray.get(self.service.load.remote(saved))

    def step(self, metrics, timing_raw):
        batch = super().step(metrics, timing_raw)
        metrics.update(ray.get(self.service.commit.remote(self.global_steps)))
        return batch

    def _save_checkpoint(self):
        # the service first: verl marks the checkpoint complete (latest_checkpointed_iteration.txt) as
        # its last act, and a resumed run must find the service's state in any checkpoint marked complete
        ray.get(self.service.save.remote(os.path.join(checkpoint_dir(self.config, self.global_steps), self.FILE)))
        super()._save_checkpoint()


@_register(TRAINER)
class RetrievalTrainer(_ServiceTrainer):
    """Retrieval RL: verl's synchronous trainer with the run's experience bank."""

    MODE, FILE, WHAT = TRAINER, BANK_FILE, "experience bank"
    settings = staticmethod(retrieval_settings)
    start = staticmethod(start_bank)


@contextlib.contextmanager
def _distillation_disabled(config):
    """verl's config with ``distillation.enabled`` false for the duration (its resource-pool setup
    then plans no teacher pool)."""
    with open_dict(config):
        config.distillation.enabled = False
    try:
        yield
    finally:
        with open_dict(config):
            config.distillation.enabled = True


@_register(SKILL_TRAINER)
class SkillTrainer(_ServiceTrainer):
    """Skill-SD: verl's synchronous trainer with the run's skill library, and the rollout servers
    (the current student) as the distillation teacher (module docstring)."""

    MODE, FILE, WHAT = SKILL_TRAINER, SKILLS_FILE, "skill library"
    settings = staticmethod(skill_settings)
    start = staticmethod(start_skills)

    def __init__(self, config):
        if not config.get("distillation") or not config.distillation.get("enabled"):
            raise ValueError(f"trainer_mode {SKILL_TRAINER} distils: it needs distillation.enabled")
        super().__init__(config)
        self.use_teacher_policy = False  # no teacher servers of its own: the teacher is the student

    def _init_resource_pool_mgr(self):
        with _distillation_disabled(self.config):
            super()._init_resource_pool_mgr()

    def _setup(self):
        super()._setup()
        from verl.utils.config import omega_conf_to_dataclass

        # verl sets this only where it starts teacher servers; the actor update reads it (the loss settings)
        self.distillation_config = omega_conf_to_dataclass(self.config.distillation)

    def get_teacher_client(self):
        """The rollout servers' client under the one teacher's key: verl's distillation then scores
        the teacher prompts on the current student's weights."""
        return {key: self.get_llm_client() for key in self.distillation_config.teacher_models}

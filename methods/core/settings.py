"""The settings of every shared component, as plain dataclasses that import nothing heavy.

Each field's validation lives in its ``__post_init__``.  They are here, apart from the code that
uses them (``rollout``, ``policy``, ``loop``, ``warmstart``, ``experience.bank``, which re-export
them), so that resolving and validating the configured grid -- which the Snakefile does at parse
time, before any job starts -- needs neither torch nor transformers (docs/decisions.md, "Parse
time").  The same split as ``transformers``' ``configuration_*.py`` beside ``modeling_*.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SamplingConfig", "ModelConfig", "TrainConfig", "WarmStartConfig", "BankConfig"]


@dataclass
class SamplingConfig:
    temperature: float = 1.0  # 0 -> greedy
    max_new_tokens: int = 48  # per assistant turn
    max_seq_len: int = 1024  # a conversation longer than this ends the episode

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"sampling.temperature must be >= 0, got {self.temperature}")
        if self.max_new_tokens < 1 or self.max_seq_len < 2:
            raise ValueError("sampling.max_new_tokens must be >= 1 and max_seq_len >= 2")


@dataclass
class ModelConfig:
    """Shape of a policy built from scratch (ignored when ``checkpoint`` is given)."""

    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 512
    max_positions: int = 1024
    checkpoint: str | None = None  # a local HF directory to start from instead

    def __post_init__(self):
        for name in ("hidden_size", "num_layers", "num_heads", "intermediate_size", "max_positions"):
            if getattr(self, name) < 1:
                raise ValueError(f"model.{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"model.hidden_size ({self.hidden_size}) must be divisible by model.num_heads ({self.num_heads})"
            )


@dataclass
class TrainConfig:
    """Settings shared by every method (the same values for all methods of a comparison)."""

    rollout_budget: int = 1600  # student rollouts per run (the unit of budget)
    rollouts_per_step: int = 32  # tasks_per_step = rollouts_per_step // group_size
    lr: float = 3e-4
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    ppo_epochs: int = 2  # passes over each step's rollouts
    minibatch_rollouts: int = 16
    temperature: float = 1.0  # sampling temperature of training rollouts
    max_new_tokens: int = 48  # per assistant turn
    max_seq_len: int = 1024
    eval_every: int = (
        320  # rollouts between held-out evaluations (also at 0 and at the end); a multiple of rollouts_per_step
    )
    eval_episodes: int = 200
    # held-out episodes of the evaluations between the first and the last (the first ones of the
    # eval_episodes tasks): the curves' inner points.  None: eval_episodes.  The first and the
    # final evaluation always use all eval_episodes (Table 1 reads the final one).
    curve_eval_episodes: int | None = None
    eval_temperature: float = 0.0  # 0: greedy evaluation
    checkpoint_every: int = 5  # steps
    recompute_old_logp: bool = False  # True: PPO's old log-probs from a training-mode forward instead of the sampler's

    def __post_init__(self):
        positive = [
            "rollout_budget",
            "rollouts_per_step",
            "ppo_epochs",
            "minibatch_rollouts",
            "max_new_tokens",
            "max_seq_len",
            "eval_every",
            "eval_episodes",
            "checkpoint_every",
        ]
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        if not (0 < self.lr < 1):
            raise ValueError(f"train.lr must be in (0, 1), got {self.lr}")
        if self.grad_clip <= 0 or self.weight_decay < 0:
            raise ValueError("train.grad_clip must be > 0 and train.weight_decay >= 0")
        if self.curve_eval_episodes is not None and not (1 <= self.curve_eval_episodes <= self.eval_episodes):
            raise ValueError(
                f"train.curve_eval_episodes must be null or in [1, eval_episodes ({self.eval_episodes})], "
                f"got {self.curve_eval_episodes}"
            )
        if self.eval_every % self.rollouts_per_step:
            raise ValueError(
                f"train.eval_every ({self.eval_every}) must be a multiple of train.rollouts_per_step "
                f"({self.rollouts_per_step}), so that every method is evaluated at the same rollout counts"
            )
        if self.temperature <= 0 or self.eval_temperature < 0:
            raise ValueError("train.temperature must be > 0 and train.eval_temperature >= 0")

    def sampling(self, eval: bool = False) -> SamplingConfig:
        t = self.eval_temperature if eval else self.temperature
        return SamplingConfig(temperature=t, max_new_tokens=self.max_new_tokens, max_seq_len=self.max_seq_len)


@dataclass
class WarmStartConfig:
    n_demos: int = 40000  # expert demonstrations (each seen about once: steps * batch_size ~ n_demos)
    seen_group_share: float = 0.0  # share of demonstrations from the training split (the rest: fresh warm-start groups)
    steps: int = 1500
    batch_size: int = 32
    lr: float = 1e-3
    warmup_steps: int = 50
    context_share: float = 0.3  # share of demonstrations that carry a context block
    same_task_share: float = 0.5  # of those, share whose context is the task's own solution (else a same-group example)
    feedback_share: float = (
        0.0  # of those, share whose context is the feedback on a failed attempt at the task (SDPO's reprompt)
    )
    skill_share: float = (
        0.0  # of those, share whose context is a skill summary of a same-group episode (Skill-SD's skill)
    )
    vocab_size: int = 768
    likelihood_tasks: int = 200  # held-out tasks for the context-likelihood check
    bucket_batches: bool = True  # draw each batch from a length-sorted pool of 16 batches (less padding)
    copy_share: float = 0.0  # share of extra synthetic "repeat: <text>" examples (a pretraining-like copy skill)
    recovery_share: float = (
        0.0  # share of multi-turn demonstrations with one corrupted call and the recovery from its error
    )
    # None: every demonstration is the scripted expert's.  A number q: demonstrations *without* a context
    # block come from the domain's imperfect demonstrator (TaskDomain.imperfect_trajectory), which reacts
    # correctly to the cue of its systematic mistakes with probability q: the SFT-then-RL headroom
    # (docs/testbed.md).  Demonstrations with a context keep the expert's turns (the context shows how).
    demo_recovery: float | None = None
    # Of the same-group context blocks (what is left after same_task/feedback/skill), the share rendered
    # as retrieval hands them over: ``retrieved_docs`` solved tasks joined by blank lines (the format of
    # methods.retrieval_rl.render_experience), one from the task's group and each other one from it with
    # probability 1/2, else from another group, in random order.  A policy that saw only one-trace
    # blocks broke its calls when given three (docs/decisions.md).
    retrieved_share: float = 0.0
    retrieved_docs: int = 3
    # Item 5: a second stage on contexts built from the policy's *own* samples (0 steps: off)
    onpolicy_steps: int = 0  # SFT steps of that stage
    onpolicy_tasks: int = 2000  # fresh warm-start tasks, each sampled onpolicy_group times at the training temperature
    onpolicy_group: int = 4  # SDPO's G: a failed sample's reprompt may hold a successful sibling
    onpolicy_lr: float = 3e-4

    def __post_init__(self):
        for name in (
            "n_demos",
            "steps",
            "batch_size",
            "vocab_size",
            "likelihood_tasks",
            "onpolicy_tasks",
            "onpolicy_group",
            "retrieved_docs",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"warmstart.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("warmup_steps", "onpolicy_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"warmstart.{name} must be >= 0, got {getattr(self, name)}")
        for name in (
            "context_share",
            "same_task_share",
            "feedback_share",
            "skill_share",
            "copy_share",
            "seen_group_share",
            "recovery_share",
            "retrieved_share",
        ):
            if not (0.0 <= getattr(self, name) <= 1.0):
                raise ValueError(f"warmstart.{name} must be in [0, 1], got {getattr(self, name)}")
        if self.same_task_share + self.feedback_share + self.skill_share > 1.0 + 1e-9:
            raise ValueError(
                "warmstart.same_task_share + feedback_share + skill_share must be <= 1 "
                "(shares of the context demonstrations), "
                f"got {self.same_task_share} + {self.feedback_share} + {self.skill_share}"
            )
        if self.demo_recovery is not None and not (0.0 <= self.demo_recovery <= 1.0):
            raise ValueError(f"warmstart.demo_recovery must be null or in [0, 1], got {self.demo_recovery}")
        for name in ("lr", "onpolicy_lr"):
            if not (0 < getattr(self, name) < 1):
                raise ValueError(f"warmstart.{name} must be in (0, 1), got {getattr(self, name)}")


@dataclass
class BankConfig:
    """How the bank admits and returns experience (shared by retrieval RL and LOPD)."""

    success_threshold: float = 1.0  # tool use: reward >= threshold; code: reward is 1 iff all tests pass
    max_per_task: int = 1  # trajectories kept per task (its first successes)
    seed_tasks: int = 0  # training tasks the warm-start policy attempts to seed the bank before RL (0: start empty)
    seed_attempts: int = 1  # attempts per seed task: a task is tried again while it has no success (pass@k seeding)

    def __post_init__(self):
        if not (0.0 < self.success_threshold <= 1.0):
            raise ValueError(f"bank.success_threshold must be in (0, 1], got {self.success_threshold}")
        if self.max_per_task < 1 or self.seed_tasks < 0 or self.seed_attempts < 1:
            raise ValueError("bank.max_per_task and bank.seed_attempts must be >= 1, and bank.seed_tasks >= 0")

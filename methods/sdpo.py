"""SDPO: self-distillation policy optimization (Hübotter et al., arXiv:2601.20802).

G=4 rollouts per task.  Each rollout's privileged context is built from its
own group: a *successful sibling* (another rollout of the same task in the same
step with reward >= ``success_threshold``; never the rollout itself) and/or
the environment's feedback on the rollout's failure (tool errors and failed
checks; failing test output).  A rollout with neither gets no distillation
signal.  The teacher is an EMA of the student (rate 0.05, LOPD's runs; SDPO's
rich-feedback script uses 0.01) reprompted with that context; the loss is the
``topk_tail(20)`` reverse KL on the student's samples.

Unlike GRPO the group is not used for advantages but as a source of context:
a task the student solves once in four attempts teaches the other three.
"""

from __future__ import annotations

from dataclasses import dataclass

from .core.contexts import sdpo_context, sdpo_kind, sdpo_parts
from .core.distill import DistillConfig, SelfDistillation
from .core.registry import register_method


@dataclass
class SDPOConfig(DistillConfig):
    group_size: int = 4
    teacher_source: str = "ema"
    ema_rate: float = 0.05
    divergence: str = "topk_tail"
    topk: int = 20
    success_threshold: float = 1.0
    use_sibling: bool = True
    use_feedback: bool = True

    def __post_init__(self):
        super().__post_init__()
        if not (0 < self.success_threshold <= 1):
            raise ValueError(f"success_threshold must be in (0, 1], got {self.success_threshold}")
        if not (self.use_sibling or self.use_feedback):
            raise ValueError("SDPO needs at least one context source (use_sibling or use_feedback)")


@register_method("sdpo")
class SDPO(SelfDistillation):
    Config = SDPOConfig

    def teacher_contexts_and_kinds(self, batch):
        cfg = self.cfg
        members: dict[int, list[int]] = {}
        for j, g in enumerate(batch.group_index.tolist()):
            members.setdefault(g, []).append(j)
        groups = batch.group_index.tolist()
        parts = [
            sdpo_parts(batch.rollouts, i, members[groups[i]], cfg.success_threshold, cfg.use_sibling, cfg.use_feedback)
            for i in range(len(batch.rollouts))
        ]
        return [sdpo_context(*p) for p in parts], [sdpo_kind(*p) for p in parts]

    def teacher_contexts(self, batch):
        return self.teacher_contexts_and_kinds(batch)[0]

"""OPSD: on-policy self-distillation with a reference solution (Zhao et al., arXiv:2601.18734).

The student samples B tasks x 1 rollout with GRPO's prompts; the *frozen*
warm-start policy, given the task's reference solution ahead of the task (the
scripted expert's action -> result trace: tool use, the oracle calls; code, the
reference program and its test result), scores the student's tokens; the loss
is a divergence on the student's samples: full-vocabulary forward KL as LOPD
ran it (default), or ``jsd`` with β=0.5 as in the OPSD repository's script.
Unlike GRPO there is no reward in the loss: the signal is the teacher's
distribution, available on every rollout, failed ones included.
"""

from __future__ import annotations

from dataclasses import dataclass

from .core.distill import DistillConfig, SelfDistillation
from .core.registry import register_method


@dataclass
class OPSDConfig(DistillConfig):
    teacher_source: str = "frozen"
    divergence: str = "forward_kl"


@register_method("opsd")
class OPSD(SelfDistillation):
    Config = OPSDConfig

    def teacher_contexts(self, batch):
        return self.expert_contexts(batch)

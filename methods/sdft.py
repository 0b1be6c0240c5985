"""SDFT: self-distillation fine-tuning (Shenfeld et al., arXiv:2601.19897).

The teacher is an exponential moving average of the student (rate 0.01,
updated after every student step) prompted with a demonstration of the task
(the scripted expert's episode as an action -> result trace); the loss is the
full-vocabulary forward KL on the student's own samples.  It differs from OPSD
in the teacher's weights (an EMA that follows the student, not the frozen
warm start) and from GRPO in having no reward in the loss.
"""

from __future__ import annotations

from dataclasses import dataclass

from .core.distill import DistillConfig, SelfDistillation
from .core.registry import register_method


@dataclass
class SDFTConfig(DistillConfig):
    teacher_source: str = "ema"
    ema_rate: float = 0.01
    divergence: str = "forward_kl"


@register_method("sdft")
class SDFT(SelfDistillation):
    Config = SDFTConfig

    def teacher_contexts(self, batch):
        return self.expert_contexts(batch)

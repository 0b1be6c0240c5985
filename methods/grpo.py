"""GRPO: group-relative policy optimisation (DeepSeekMath, arXiv:2402.03300).

The "RLVR" baseline of the LOPD paper.  For each task the student samples G
rollouts; each rollout's outcome advantage is its reward standardised within
its group, ``Â_i = (r_i − mean(r)) / (std(r) + eps)``, broadcast to every
token the agent generated, and the policy is updated with the PPO clipped
surrogate ``−mean_tokens min(ρÂ, clip(ρ, 1−ε_lo, 1+ε_hi)Â)`` over
``ppo_epochs`` passes (the shared loop).  No teacher, no privileged context:
the other methods are "GRPO plus something" or "distillation instead".

The advantage and loss are verl's (checked numerically in tests/test_losses.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from .core.batch import RolloutBatch, rows_of
from .core.lazy import lazy_import
from .core.registry import Method, MethodConfig, register_method
from .losses import AGG_MODES, grpo_outcome_advantage, ppo_clip_loss

torch = lazy_import("torch")  # loaded on first use: config resolution reads this module (methods/core/lazy.py)


@dataclass
class GRPOConfig(MethodConfig):
    group_size: int = 4  # G (LOPD's runs)
    clip_low: float = 0.2  # ε_lo
    clip_high: float = 0.2  # ε_hi
    norm_by_std: bool = True
    drop_zero_variance: bool = (
        True  # groups whose rewards are all equal carry no signal: skip them (no token-mean dilution, no compute)
    )
    loss_agg: str = "token-mean"

    def __post_init__(self):
        super().__post_init__()
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 for group-relative advantages, got {self.group_size}")
        if self.loss_agg not in AGG_MODES:
            raise ValueError(f"loss_agg must be one of {list(AGG_MODES)}, got {self.loss_agg!r}")
        for name in ("clip_low", "clip_high"):
            if not (0 < getattr(self, name) < 1):
                raise ValueError(f"{name} must be in (0, 1), got {getattr(self, name)}")


@register_method("grpo")
class GRPO(Method):
    Config = GRPOConfig

    def prepare(self, batch: RolloutBatch) -> dict[str, float]:
        batch.extras["advantages"] = grpo_outcome_advantage(
            batch.rewards, batch.group_index, norm_by_std=self.cfg.norm_by_std
        )
        varied = groups_with_variance(batch.rewards, batch.group_index)
        batch.extras["pg_signal"] = varied if self.cfg.drop_zero_variance else torch.ones_like(varied)
        return {"zero_variance_share": float(1 - varied.float().mean())}

    def trainable_rows(self, batch: RolloutBatch) -> torch.Tensor:
        return torch.nonzero(batch.extras["pg_signal"]).flatten()

    def loss(self, batch, rows, logp, logits):
        width = logp.shape[1]
        return ppo_clip_loss(
            logp,
            rows_of(batch.extras["old_logp"], rows, width),
            batch.extras["advantages"][rows],
            rows_of(batch.loss_mask, rows, width),
            clip_low=self.cfg.clip_low,
            clip_high=self.cfg.clip_high,
            agg=self.cfg.loss_agg,
        )


def groups_with_variance(rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """[N] bool: True where the rollout's group has at least two distinct rewards."""
    n_groups = int(group_index.max()) + 1
    lo = rewards.new_full((n_groups,), float("inf")).scatter_reduce(0, group_index, rewards, "amin")
    hi = rewards.new_full((n_groups,), float("-inf")).scatter_reduce(0, group_index, rewards, "amax")
    return (hi - lo)[group_index] > 1e-8

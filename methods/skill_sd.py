"""Skill-SD: skill-conditioned self-distillation (Wang et al., arXiv:2604.10674).

GRPO (G=4, PPO-clip with ε_lo=0.2, ε_hi=0.28) plus a small distillation term
toward a teacher that is the student itself (synced every step) prompted with a
*skill*: ``L = L_GRPO + λ_sdl · token-mean(importance-weighted sampled-token
reverse KL)``, λ_sdl = 0.001 (:func:`methods.divergences.sampled_token_reverse_kl`).

Skills come from completed trajectories.  The paper summarises them with an
LLM; on the small profile a deterministic summariser over the trace writes
what worked (the action sequence of a success), or what failed (the
environment's feedback) and what was tried -- acceptable per
``docs/methods.md``.  A task's candidate skills are those of its
environment variant / project (named in the task the student sees); the
skill used for a task is chosen by UCB1 (c = √2) with, as its reward, the
outcome of the task's rollouts in the step the skill was used.  Tasks with no
candidate skill get the GRPO term only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tasks.base import Task

from .core.batch import rows_of
from .core.contexts import SKILL_MAX_CHARS, rollout_skill
from .core.distill import checked_gain, gain_record
from .core.lazy import lazy_import
from .core.registry import register_method
from .core.teacher import Teacher
from .divergences import sampled_token_reverse_kl, token_mean
from .grpo import GRPO, GRPOConfig
from .losses import ppo_clip_loss

torch = lazy_import("torch")  # loaded on first use: config resolution reads this module (methods/core/lazy.py)


@dataclass
class SkillSDConfig(GRPOConfig):
    clip_high: float = 0.28
    sdl_weight: float = 0.001  # λ_sdl
    is_clip: float = 2.0  # cap of the importance weight π_S/π_old on the distillation term
    ucb_c: float = math.sqrt(2)
    max_skill_chars: int = SKILL_MAX_CHARS

    def __post_init__(self):
        super().__post_init__()
        if self.sdl_weight < 0 or self.is_clip <= 0 or self.ucb_c < 0 or self.max_skill_chars < 50:
            raise ValueError("sdl_weight >= 0, is_clip > 0, ucb_c >= 0 and max_skill_chars >= 50 are required")


@dataclass
class Skill:
    text: str
    group_id: str
    uses: int = 0
    reward_sum: float = 0.0


@dataclass
class SkillLibrary:
    skills: list[Skill] = field(default_factory=list)
    _by_group: dict[str, list[int]] = field(default_factory=dict)
    _texts: set[tuple[str, str]] = field(default_factory=set)

    def add(self, text: str, group_id: str) -> bool:
        if (group_id, text) in self._texts:
            return False
        self._texts.add((group_id, text))
        self._by_group.setdefault(group_id, []).append(len(self.skills))
        self.skills.append(Skill(text, group_id))
        return True

    def select(self, task: Task, c: float) -> int | None:
        """UCB1 over the task's candidate skills: untried first, then mean + c·sqrt(ln N / n)."""
        cand = self._by_group.get(task.group_id, [])
        if not cand:
            return None
        untried = [i for i in cand if self.skills[i].uses == 0]
        if untried:
            return untried[0]
        total = sum(self.skills[i].uses for i in cand)
        return max(
            cand,
            key=lambda i: (
                self.skills[i].reward_sum / self.skills[i].uses + c * math.sqrt(math.log(total) / self.skills[i].uses)
            ),
        )

    def record(self, idx: int, reward: float) -> None:
        self.skills[idx].uses += 1
        self.skills[idx].reward_sum += reward

    def state_dict(self):
        return [(s.text, s.group_id, s.uses, s.reward_sum) for s in self.skills]

    def load_state_dict(self, state) -> None:
        self.skills, self._by_group, self._texts = [], {}, set()
        for text, group, uses, rsum in state:
            self.add(text, group)
            self.skills[-1].uses, self.skills[-1].reward_sum = uses, rsum


@register_method("skill_sd")
class SkillSD(GRPO):
    Config = SkillSDConfig

    def __init__(self, cfg: SkillSDConfig, run):
        super().__init__(cfg, run)
        self.teacher = Teacher(run, "student")
        self.library = SkillLibrary()
        self._gain_logged = False

    def prepare(self, batch):
        out = super().prepare(batch)
        chosen: dict[str, int | None] = {}
        for r in batch.rollouts:
            if r.task.task_id not in chosen:
                chosen[r.task.task_id] = self.library.select(r.task, self.cfg.ucb_c)
        contexts = [
            self.library.skills[chosen[r.task.task_id]].text if chosen[r.task.task_id] is not None else None
            for r in batch.rollouts
        ]
        scores = self.teacher.score(batch.rollouts, contexts, self.run.train_cfg.temperature)
        # the teacher's log-prob of each sampled agent token, packed per rollout
        batch.extras["teacher_logp"] = [
            None
            if (s is None or c is None)
            else torch.log_softmax(s, -1)
            .gather(-1, torch.tensor([t for t, m in zip(r.ids[1:], r.agent_mask[1:]) if m])[:, None])
            .squeeze(-1)
            for r, s, c in zip(batch.rollouts, scores, contexts)
        ]
        batch.extras["has_skill"] = torch.tensor([lp is not None for lp in batch.extras["teacher_logp"]])
        # UCB1 bookkeeping: the outcome of the task's rollouts in the step its skill was used
        for task_id, idx in chosen.items():
            if idx is not None:
                rewards = [r.reward for r in batch.rollouts if r.task.task_id == task_id]
                self.library.record(idx, sum(rewards) / len(rewards))
        out.update({"skill_share": float(batch.extras["has_skill"].float().mean()), "skills": len(self.library.skills)})
        if (
            any(c is not None for c in contexts) and not self._gain_logged
        ):  # the first step whose tasks have skills (the library starts empty)
            self._gain_logged = True
            out.update(gain_record(self.teacher, batch.rollouts, contexts))
            out["teacher_context_gain"] = checked_gain(self.name, out["teacher_context_gain"])
        return out

    def trainable_rows(self, batch):
        return torch.nonzero(batch.extras["pg_signal"] | batch.extras["has_skill"]).flatten()

    def loss(self, batch, rows, logp, logits):
        width = logp.shape[1]
        agent = rows_of(batch.loss_mask, rows, width)
        varied = batch.extras["pg_signal"][rows].to(agent.dtype)[:, None]
        pg, metrics = ppo_clip_loss(
            logp,
            rows_of(batch.extras["old_logp"], rows, width),
            batch.extras["advantages"][rows],
            agent * varied,
            clip_low=self.cfg.clip_low,
            clip_high=self.cfg.clip_high,
            agg=self.cfg.loss_agg,
        )
        keep = [i for i in rows.tolist() if batch.extras["teacher_logp"][i] is not None]
        if keep and self.cfg.sdl_weight > 0:
            mask = agent.bool() & batch.extras["has_skill"][rows][:, None]
            t_lp = torch.cat([batch.extras["teacher_logp"][i] for i in keep])
            s_lp = logp[mask]
            kl = sampled_token_reverse_kl(
                s_lp, t_lp, rows_of(batch.extras["old_logp"], rows, width)[mask], self.cfg.is_clip
            )
            sdl = token_mean(kl)
            # the surrogate's value is not a divergence; log the sampled-token estimate of KL(π_S ‖ π_T) too
            metrics = {**metrics, "sdl_kl": float((s_lp - t_lp).detach().mean())}
        else:
            sdl = logp.sum() * 0.0
        metrics = {**metrics, "sdl": float(sdl.detach())}
        return pg + self.cfg.sdl_weight * sdl, metrics

    def after_step(self, batch):
        added = sum(
            self.library.add(rollout_skill(r, self.cfg.max_skill_chars), r.task.group_id) for r in batch.rollouts
        )
        return {"skills_added": added}

    def state_dict(self):
        return {"library": self.library.state_dict(), "gain_logged": self._gain_logged}

    def load_state_dict(self, state) -> None:
        self.library.load_state_dict(state["library"])
        self._gain_logged = state.get("gain_logged", True)

"""A privileged-context teacher for verl's on-policy distillation (OPSD on verl).

verl 0.9.1 distils on-policy through teacher servers: after an episode, its agent-loop worker asks
a teacher (a frozen model served like the rollout, in its own GPU pool: ``distillation.*``) for
the top-k log-probabilities at every position of the student's sequence, prompt and response
(``AgentLoopWorker._compute_teacher_logprobs``), and the actor's loss compares them with the
student's full logits at the response tokens (``forward_kl_topk``, in a logits processor).  The
teacher sees exactly the student's prompt; nothing upstream lets it see another (PRs #6833,
#6909 and #7659 were open as of 2026-08).

Self-distillation needs the teacher to read the same response after a *privileged* prompt (OPSD:
the task's reference solution ahead of the task).  So:

* the suite's agent loop puts the teacher's prompt ids, built by the suite's rollout engine's own
  layout with the privileged context (:func:`methods.core.rollout.initial_prompt_ids`), in the
  episode's ``extra_fields`` under :data:`TEACHER_PROMPT`;
* :class:`PrivilegedAgentLoopWorker` (verl's TransferQueue worker) lets verl's own
  ``_compute_teacher_logprobs`` score *teacher prompt + response* instead, then re-aligns the
  result to the student's sequence (:func:`align_to_student`): the rows that predict the
  response's tokens move to the positions where the student's logits predict them, and the
  student's other prompt positions get filler rows, which the loss never reads (it reads the
  response's tokens only);
* :class:`PrivilegedAgentLoopManager` is verl's TransferQueue manager with that worker
  (``actor_rollout_ref.rollout.agent.agent_loop_manager_class``).

OPSD's teacher is the frozen warm-start policy (``distillation.teacher_models.teacher_model.model_path``
is the run's base model), as in the suite's loop.  Skill-SD's teacher is the student itself,
synced every step, reading the skill chosen for the task (``lopd_bench.teacher_context: skill``):
its "teacher servers" are the run's own rollout servers, which hold the current student's weights
while the step's episodes are played (:class:`methods.verl_backend.trainer.SkillTrainer` hands
verl their client as the teacher's, and no teacher pool is started).  It scores the sampled tokens
only (``prompt_logprobs`` 0, as for verl's estimator losses), and a rollout whose task has no skill
yet gets :func:`no_teacher_rows`, which the sampled reverse KL leaves out.  A teacher sequence
longer than ``lopd_bench.teacher_max_len`` is not scored either (the suite's teacher gives no
signal past the model's positions).
"""

from __future__ import annotations

import ray
import torch
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ

from .agent_loop import TEACHER_PROMPT
from .bank import SECTION

__all__ = [
    "TEACHER_PROMPT",
    "align_to_student",
    "no_teacher_rows",
    "PrivilegedAgentLoopWorker",
    "PrivilegedAgentLoopManager",
]


def align_to_student(
    teacher_ids: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    teacher_prompt_length: int,
    student_prompt_length: int,
    pad_token_id: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of the teacher's scoring of *teacher prompt + response*, laid out on *student prompt +
    response*.  verl's teacher returns one row per position, row ``i`` the top-k of the token at
    ``i + 1`` (vLLM's prompt log-probs without their empty first entry, a dummy row appended:
    ``verl.workers.rollout.vllm_rollout.utils.extract_prompt_logprobs``), which is where the
    student's logits predict that token.  So the rows from the teacher's last prompt position on
    (the response's tokens, then the dummy) move to the student's last prompt position on, and the
    student's other prompt positions get filler rows (``pad_token_id``, log-probability 0), which
    the loss never reads."""
    keep = teacher_prompt_length - 1
    filler = student_prompt_length - 1
    filler_ids = teacher_ids.new_full((filler, *teacher_ids.shape[1:]), pad_token_id)
    filler_logprobs = teacher_logprobs.new_zeros((filler, *teacher_logprobs.shape[1:]))
    return torch.cat([filler_ids, teacher_ids[keep:]]), torch.cat([filler_logprobs, teacher_logprobs[keep:]])


def no_teacher_rows(length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher rows for a sequence of ``length`` tokens whose teacher read nothing privileged:
    log-probability :data:`~methods.verl_backend.plugin.NO_TEACHER` everywhere, which the sampled
    reverse KL leaves out (Skill-SD's rollouts whose task has no skill yet)."""
    from .plugin import NO_TEACHER

    return torch.zeros((length, 1), dtype=torch.int32), torch.full((length, 1), NO_TEACHER)


class PrivilegedAgentLoopWorker(AgentLoopWorkerTQ.__ray_actor_class__):
    """verl's agent-loop worker whose teacher reads the episode's privileged prompt (module docstring)."""

    async def _compute_teacher_logprobs(self, output, prompt_ids, response_ids, validate, sample_kwargs=None):
        teacher_prompt = output.extra_fields.pop(TEACHER_PROMPT, None)
        if validate or not self.distillation_enabled:  # verl's own (which scores nothing then)
            return await super()._compute_teacher_logprobs(output, prompt_ids, response_ids, validate, sample_kwargs)
        section = self.config.get(SECTION) or {}
        limit = section.get("teacher_max_len")
        if teacher_prompt is not None and limit and len(teacher_prompt) + len(response_ids) >= limit:
            # the teacher's sequence would not fit its server (which also generates one token after it):
            # no signal, as the suite's Teacher gives none past the model's positions
            teacher_prompt = None
        if teacher_prompt is None:
            if section.get("teacher_context") == "skill":  # no skill for this task yet: the GRPO term only
                ids, logprobs = no_teacher_rows(len(prompt_ids) + len(response_ids))
                output.extra_fields["teacher_ids"], output.extra_fields["teacher_logprobs"] = ids, logprobs
                return
            # an episode without a privileged context: verl's own teacher input
            return await super()._compute_teacher_logprobs(output, prompt_ids, response_ids, validate, sample_kwargs)
        teacher_prompt = list(teacher_prompt)
        await super()._compute_teacher_logprobs(output, teacher_prompt, response_ids, validate, sample_kwargs)
        output.extra_fields["teacher_ids"], output.extra_fields["teacher_logprobs"] = align_to_student(
            output.extra_fields["teacher_ids"],
            output.extra_fields["teacher_logprobs"],
            len(teacher_prompt),
            len(prompt_ids),
            self.tokenizer.pad_token_id,
        )


class PrivilegedAgentLoopManager(AgentLoopManagerTQ):
    """verl's TransferQueue agent-loop manager, its workers :class:`PrivilegedAgentLoopWorker`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.agent_loop_workers_class = ray.remote(PrivilegedAgentLoopWorker)

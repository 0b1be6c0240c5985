"""A privileged-context teacher for verl's on-policy distillation.

verl 0.9.1 distils on-policy through teacher servers: after an episode, its agent-loop worker asks
a teacher for the top-k log-probabilities at every position of the student's sequence
(``AgentLoopWorker._compute_teacher_logprobs``), and the actor's loss compares them with the
student's logits at the response tokens.  The teacher sees exactly the student's prompt; nothing
upstream lets it see another (PRs #6833, #6909 and #7659 were open as of 2026-08).

Self-distillation needs the teacher to read the same response after a *privileged* prompt.  So
the suite's agent loop puts the teacher's prompt ids, built by the suite's rollout engine's own
layout with the privileged context (:func:`methods.core.rollout.initial_prompt_ids`), in the
episode's ``extra_fields`` under :data:`TEACHER_PROMPT`, and :class:`PrivilegedAgentLoopWorker`
(verl's TransferQueue worker; :class:`PrivilegedAgentLoopManager` is verl's manager with it,
``actor_rollout_ref.rollout.agent.agent_loop_manager_class``) hands it on:

* OPSD and SDFT (``lopd_bench.teacher_in_trainer``): the teacher is verl's reference model in the
  actor worker (the frozen base policy for OPSD, an EMA of the student for SDFT;
  :mod:`methods.verl_backend.ema`); the worker scores nothing and leaves the teacher prompt in
  ``extra_fields``, where :class:`methods.verl_backend.trainer.EMATeacherTrainer` reads it after
  the step's rollouts and writes the teacher's exact top-k rows at the student's temperature.
* Skill-SD (``lopd_bench.teacher_context: skill``): the teacher is the student itself, synced every
  step, reading the skill chosen for the task; its "teacher servers" are the run's own rollout
  servers (:class:`methods.verl_backend.trainer.SkillTrainer` hands verl their client as the
  teacher's, and no teacher pool is started).  The worker scores the sampled tokens there
  (``prompt_logprobs`` 0) on *teacher prompt + response* and re-aligns the rows to the student's
  sequence (:func:`align_to_student`); a rollout whose task has no skill yet gets
  :func:`no_teacher_rows`, which the sampled reverse KL leaves out, and so does a teacher sequence
  that would not fit ``lopd_bench.teacher_max_len`` (the suite's teacher gives no signal past the
  model's positions).  vLLM's log-probabilities come from the raw logits, the student's from its
  logits divided by the rollout temperature, so the rows are tempered (:func:`temper_sampled`,
  with a second request for the top-k that normalise them, ``lopd_bench.teacher_topk``).
"""

from __future__ import annotations

import asyncio
from uuid import uuid4

import ray
import torch
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ

from .agent_loop import TEACHER_PROMPT
from .bank import SECTION

__all__ = [
    "TEACHER_PROMPT",
    "align_to_student",
    "no_teacher_rows",
    "temper_sampled",
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


def temper_sampled(
    logprob: torch.Tensor, token: torch.Tensor, topk_logprobs: torch.Tensor, topk_ids: torch.Tensor, temperature: float
) -> torch.Tensor:
    """The sampled token's log-probability ``[S]`` at ``temperature``, from its log-probability at
    temperature 1 (``logprob``, ids ``token``) and the top-k's (``[S, k]``):
    ``log softmax(l / T) = lp / T − logsumexp(lp / T)`` for ``lp = log softmax(l)``, the normaliser
    run over the top-k and the token itself where it is not among them.  What they leave out,
    ``Σ_tail p^(1/T)``, is below ``p_k^(1/T − 1)`` times the tail's mass at T < 1, so the value
    comes out slightly too high; a test bounds the error on a peaked distribution."""
    outside = ~(topk_ids == token[:, None]).any(-1)
    extra = torch.where(outside, logprob, torch.full_like(logprob, float("-inf")))
    pool = torch.cat([topk_logprobs, extra[:, None]], dim=-1) / temperature
    return logprob / temperature - torch.logsumexp(pool, dim=-1)


def no_teacher_rows(length: int, k: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher rows (``k`` columns) for a sequence of ``length`` tokens whose teacher read nothing
    privileged: log-probability :data:`~methods.verl_backend.plugin.NO_TEACHER` everywhere, which the
    sampled reverse KL (Skill-SD's rollouts whose task has no skill yet) and the top-k + tail reverse
    KL (SDPO's rollouts with no context) leave out."""
    from .plugin import NO_TEACHER

    return torch.zeros((length, k), dtype=torch.int32), torch.full((length, k), NO_TEACHER)


class PrivilegedAgentLoopWorker(AgentLoopWorkerTQ.__ray_actor_class__):
    """verl's agent-loop worker whose teacher reads the episode's privileged prompt (module docstring)."""

    async def _prompt_logprobs(self, sequence: list[int], k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The teacher servers' prompt log-probabilities of ``sequence`` (verl's row layout): the
        sequence's own tokens with ``k`` 0, else the top-k; one request, as verl's teacher call."""
        manager = self.teacher_server_manager
        client = manager.teacher_client[manager._resolve_teacher_key(None)]
        params = {"max_tokens": 1, "temperature": 1.0, "prompt_logprobs": k, "detokenize": False}
        out = await client.generate(request_id=uuid4().hex, prompt_ids=sequence, sampling_params=params)
        ids = torch.tensor(out.extra_fields["prompt_ids"], dtype=torch.int32)
        logprobs = torch.tensor(out.extra_fields["prompt_logprobs"], dtype=torch.float32)
        assert ids.shape[0] == logprobs.shape[0] == len(sequence)
        return ids, logprobs

    async def _skill_teacher(self, sequence: list[int], temperature: float, topk: int):
        """Skill-SD's teacher rows ``[S, 1]``: the sampled tokens' log-probabilities on the servers
        (the student's own), at the rollout ``temperature`` (:func:`temper_sampled`, with a second
        request for the top-k the normaliser needs)."""
        if temperature == 1.0:
            return await self._prompt_logprobs(sequence, 0)
        (ids, logprobs), (top_ids, top_logprobs) = await asyncio.gather(
            self._prompt_logprobs(sequence, 0), self._prompt_logprobs(sequence, topk)
        )
        tempered = temper_sampled(logprobs[:, 0], ids[:, 0], top_logprobs, top_ids, temperature)
        return ids, tempered[:, None]

    async def _compute_teacher_logprobs(self, output, prompt_ids, response_ids, validate, sample_kwargs=None):
        teacher_prompt = output.extra_fields.pop(TEACHER_PROMPT, None)
        if validate or not self.distillation_enabled:  # verl's own (which scores nothing then)
            return await super()._compute_teacher_logprobs(output, prompt_ids, response_ids, validate, sample_kwargs)
        section = self.config.get(SECTION) or {}
        if section.get("teacher_in_trainer"):  # OPSD, SDFT: the trainer scores its teacher after the rollouts
            if teacher_prompt is not None:
                output.extra_fields[TEACHER_PROMPT] = list(teacher_prompt)
            return
        if section.get("teacher_context") != "skill":
            raise ValueError(
                f"{SECTION}.teacher_context {section.get('teacher_context')!r}: "
                "only Skill-SD's teacher is scored on the "
                f"rollout servers; a privileged teacher in the actor workers needs {SECTION}.teacher_in_trainer"
            )
        limit = section.get("teacher_max_len")
        temperature = float(section.get("teacher_temperature", 1.0))
        if teacher_prompt is not None and limit and len(teacher_prompt) + len(response_ids) >= limit:
            # the teacher's sequence would not fit its server (which also generates one token after it):
            # no signal, as the suite's Teacher gives none past the model's positions
            teacher_prompt = None
        if teacher_prompt is None:  # no skill for this task yet (or no room for it): the GRPO term only
            ids, logprobs = no_teacher_rows(len(prompt_ids) + len(response_ids))
            output.extra_fields["teacher_ids"], output.extra_fields["teacher_logprobs"] = ids, logprobs
            return
        teacher_prompt = list(teacher_prompt)
        ids, logprobs = await self._skill_teacher(
            teacher_prompt + list(response_ids), temperature, int(section.get("teacher_topk", 20))
        )
        output.extra_fields["teacher_ids"], output.extra_fields["teacher_logprobs"] = align_to_student(
            ids, logprobs, len(teacher_prompt), len(prompt_ids), self.tokenizer.pad_token_id
        )


class PrivilegedAgentLoopManager(AgentLoopManagerTQ):
    """verl's TransferQueue agent-loop manager, its workers :class:`PrivilegedAgentLoopWorker`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.agent_loop_workers_class = ray.remote(PrivilegedAgentLoopWorker)

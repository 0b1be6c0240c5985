"""The suite's verl trainers: GRPO's (``trainer.v1.trainer_mode: lopd_bench_grpo_trainer``),
retrieval RL's (``lopd_bench_retrieval``), Skill-SD's (``lopd_bench_skill_sd``) and the EMA
teacher's (``lopd_bench_ema_teacher``: SDFT, and OPSD with the rate at 0).

All four are verl's synchronous trainer (``PPOTrainerSync``).  GRPO's and retrieval RL's count the
tokens of a step's loss as the suite's loop does (:class:`_KeptTokens`): groups whose rewards are all
equal leave the loss *and* its token count.  SDFT's and OPSD's keep their teacher in the actor
workers (:class:`EMATeacherTrainer`, :mod:`methods.verl_backend.ema`).  Retrieval RL's and
Skill-SD's add one per-run service that the agent loops reach by name, a Ray actor that grows with the
run's own rollouts:

* retrieval RL: the experience bank of :mod:`methods.verl_backend.bank`;
* Skill-SD: the skill library of :mod:`methods.verl_backend.skills`.

For those two, the trainer

* starts the service after initialisation (and any checkpoint load), from the checkpoint's copy
  when the run resumes (the bank otherwise from the seed bank, the library empty);
* commits what the agent loops staged during the step's rollouts once the step's update is done,
  and logs the step's metrics (``bank/added``, ``bank/size``; ``skills/added``, ``skills/size``,
  ``skills/share``); the suite's loop grows both at the same point (``after_step``);
* saves the service's state beside verl's own files with each checkpoint, before verl marks the
  checkpoint complete, so a resumed run continues from the state it had at that step.

Skill-SD's teacher is the student itself, synced every step, and SDFT's lives in the actor
workers, so neither trainer starts a teacher pool (:class:`_OwnTeacher`): they hand verl the run's
own rollout servers' client as the teacher's, and verl's distillation scores Skill-SD's teacher
prompts there (:mod:`methods.verl_backend.distill`).

verl picks a trainer class by ``trainer.v1.trainer_mode`` and then uses the same setting to choose
between its synchronous and asynchronous machinery (the replay buffer, the refill rules); these
trainers are synchronous, so they set the mode back to ``sync`` before verl reads it.
"""

from __future__ import annotations

import contextlib
import os

import ray
import torch
from omegaconf import open_dict
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from .adapters import EMA_TRAINER, GRPO_TRAINER, RETRIEVAL_TRAINER, SDPO_TRAINER, SKILL_TRAINER
from .agent_loop import TEACHER_PROMPT
from .bank import SECTION, retrieval_settings, start_bank
from .distill import align_to_student, no_teacher_rows
from .ema import EMATeacherWorker
from .skills import skill_settings, start_skills

__all__ = [
    "GRPO_TRAINER",
    "GRPOTrainer",
    "TRAINER",
    "SKILL_TRAINER",
    "EMA_TRAINER",
    "RetrievalTrainer",
    "SkillTrainer",
    "EMATeacherTrainer",
    "SDPO_TRAINER",
    "SDPOTrainer",
    "BANK_FILE",
    "SKILLS_FILE",
    "EMA_TEACHER_DIR",
]

TRAINER = RETRIEVAL_TRAINER
EMA_TEACHER_DIR = "lopd_bench_ema_teacher"
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


def _as_sync(config) -> None:
    """Set ``trainer_mode`` back to ``sync`` before verl reads it (module docstring)."""
    with open_dict(config):
        config.trainer.v1.trainer_mode = "sync"


class _KeptTokens:
    """A trainer whose loss normalises over the tokens of the groups that carry a signal.

    The suite's estimator (``algorithm.adv_estimator: lopd_bench_grpo``, :mod:`.plugin`) clears
    the zero-variance groups' rows of ``response_mask``, and verl's v1 trainer writes that mask back
    (rollout correction on, as the generated configs keep it).  But verl's engine counts the
    mini-batch's tokens from a second field, ``loss_mask``, which the agent loop wrote once as a copy
    of the rollout's response mask and nothing rewrites (``FSDPEngine.forward_backward_batch``:
    ``batch_num_tokens = data["loss_mask"].sum()``).  The token mean would then run over every
    rollout's tokens, the dropped ones included: on a batch where half the groups carry no signal the
    gradient would be half the suite's.  After the advantage this trainer writes the cleared mask to
    ``loss_mask`` too, so the count is the kept tokens', as in the suite's loop."""

    def _check_kept_tokens(self, config) -> None:
        from methods.verl_backend.plugin import ADV_ESTIMATOR

        self._drops_groups = config.algorithm.adv_estimator == ADV_ESTIMATOR
        correction = config.algorithm.get("rollout_correction")
        if self._drops_groups and (correction is None or correction.get("bypass_mode")):
            raise ValueError(
                f"adv_estimator {ADV_ESTIMATOR} needs algorithm.rollout_correction on and not bypassed: verl writes "
                "the estimator's response_mask back for the loss only then"
            )

    def _compute_advantage(self, batch, metrics: dict):
        batch = super()._compute_advantage(batch, metrics)
        if self._drops_groups:
            import transfer_queue as tq
            from tensordict import TensorDict

            mask = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["response_mask"])
            kept = TensorDict({"loss_mask": mask["response_mask"]}, batch_size=len(batch.keys))
            tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=kept)
        return batch


@_register(GRPO_TRAINER)
class GRPOTrainer(_KeptTokens, PPOTrainerSync):
    """GRPO: verl's synchronous trainer, its loss normalised over the kept groups' tokens."""

    def __init__(self, config):
        self._check_kept_tokens(config)
        _as_sync(config)
        super().__init__(config)


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
        _as_sync(config)
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
class RetrievalTrainer(_KeptTokens, _ServiceTrainer):
    """Retrieval RL: verl's synchronous trainer with the run's experience bank, its loss normalised
    over the kept groups' tokens as GRPO's."""

    MODE, FILE, WHAT = TRAINER, BANK_FILE, "experience bank"
    settings = staticmethod(retrieval_settings)
    start = staticmethod(start_bank)

    def __init__(self, config):
        self._check_kept_tokens(config)
        super().__init__(config)


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


class _OwnTeacher:
    """A trainer that distils with no teacher pool of its own: the teacher lives in the run's own
    workers (Skill-SD: the rollout servers; SDFT: the actor worker's reference model).  verl then
    plans no teacher GPUs, and its distillation reaches the rollout servers' client under the one
    teacher's key."""

    MODE: str

    def _check_distils(self, config) -> None:
        if not config.get("distillation") or not config.distillation.get("enabled"):
            raise ValueError(f"trainer_mode {self.MODE} distils: it needs distillation.enabled")

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
        the teacher prompts on the current student's weights (Skill-SD), or nothing (SDFT, whose
        agent loops leave the teacher to the trainer)."""
        return {key: self.get_llm_client() for key in self.distillation_config.teacher_models}


@_register(SKILL_TRAINER)
class SkillTrainer(_OwnTeacher, _ServiceTrainer):
    """Skill-SD: verl's synchronous trainer with the run's skill library, and the rollout servers
    (the current student) as the distillation teacher (module docstring)."""

    MODE, FILE, WHAT = SKILL_TRAINER, SKILLS_FILE, "skill library"
    settings = staticmethod(skill_settings)
    start = staticmethod(start_skills)

    def __init__(self, config):
        self._check_distils(config)
        super().__init__(config)
        self.use_teacher_policy = False  # no teacher servers of its own: the teacher is the student


def teacher_sequences(prompts, responses, teacher_prompts, limit: int | None):
    """The EMA teacher's input for each rollout: its teacher prompt (the privileged one) followed by
    the rollout's response, and the position (teacher prompt length − 1) from which the teacher's
    rows predict the response's tokens.  Where the rollout has no teacher prompt, or the teacher's
    sequence would not fit ``limit`` positions, the teacher reads the student's own prompt (as
    verl's teacher does for OPSD's episodes without a privileged context) and the rollout is not
    counted as privileged.  Returns ``(sequences, starts, privileged)``."""
    sequences, starts, privileged = [], [], []
    for prompt, response, teacher in zip(prompts, responses, teacher_prompts, strict=True):
        fits = teacher is not None and (limit is None or len(teacher) + len(response) <= limit)
        head = list(teacher) if fits else list(prompt)
        sequences.append(head + list(response))
        starts.append(len(head) - 1)
        privileged.append(fits)
    return sequences, starts, privileged


def merge_ranks(per_rank: list[dict], n: int) -> list:
    """The workers' :meth:`~methods.verl_backend.ema.EMATeacherWorker.teacher_topk` results (one
    dict per rank, by sequence index) as one list in sequence order; each index exactly once."""
    merged = {}
    for part in per_rank:
        for i, rows in part.items():
            if i in merged:
                raise RuntimeError(f"sequence {i} was scored by two ranks")
            merged[i] = rows
    if sorted(merged) != list(range(n)):
        raise RuntimeError(f"the teacher scored {len(merged)} of {n} sequences")
    return [merged[i] for i in range(n)]


def _refuse_unpaired_teacher(config) -> None:
    """Refuse the settings under which the EMA teacher's forward or its shard-by-shard update
    cannot work: sequence parallelism (each rank scores its own sequences), fused kernels (no
    logits), LoRA (the reference model would get its own adapters), a reference model that keeps
    its gathered weights after a forward, and actor and reference FSDP settings that shard the two
    models differently."""
    arr = config.actor_rollout_ref
    problems = []
    for where in (arr.actor, arr.ref, arr.actor.fsdp_config, arr.ref.fsdp_config):
        if int(where.get("ulysses_sequence_parallel_size", 1) or 1) > 1:
            problems.append("ulysses_sequence_parallel_size > 1")
            break
    if arr.actor.get("strategy") != arr.ref.get("strategy"):
        problems.append(f"strategy differs (actor {arr.actor.get('strategy')}, ref {arr.ref.get('strategy')})")
    if arr.ref.fsdp_config.get("reshard_after_forward") is False:
        # FSDP1 would keep every unit's gathered weights (the teacher would never see an update), FSDP2
        # the inner units' (their shards could not be read)
        problems.append("ref.fsdp_config.reshard_after_forward false")
    if arr.model.get("use_fused_kernels"):
        problems.append("model.use_fused_kernels")
    if int((arr.model.get("lora") or {}).get("rank", 0) or 0) > 0 or int(arr.model.get("lora_rank", 0) or 0) > 0:
        problems.append("LoRA")
    for key in ("wrap_policy", "fsdp_size", "use_orig_params", "reshard_after_forward"):
        actor, ref = arr.actor.fsdp_config.get(key), arr.ref.fsdp_config.get(key)
        if actor != ref:
            problems.append(f"fsdp_config.{key} differs (actor {actor}, ref {ref})")
    if problems:
        raise ValueError(f"trainer_mode {EMA_TRAINER} cannot keep its EMA teacher with: {'; '.join(problems)}")


@_register(EMA_TRAINER)
class EMATeacherTrainer(_OwnTeacher, PPOTrainerSync):
    """SDFT and OPSD: verl's synchronous trainer whose distillation teacher is kept as the actor
    worker's reference model (:mod:`methods.verl_backend.ema`): an EMA of the student (SDFT), or
    at rate 0 the frozen base policy that the reference model is when loaded (OPSD).  Each step

    * after the rollouts, scores every rollout's *teacher prompt + response* on the teacher (in
      place of verl's reference log-probabilities, which no distillation loss here reads) and
      writes the top-k rows where verl's distillation loss reads them (``teacher_ids``,
      ``teacher_logprobs``, on the student's sequence layout);
    * after the update, moves the teacher toward the student (``lopd_bench.ema_teacher.rate``;
      nothing at rate 0);
    * saves the teacher with each checkpoint (before verl marks it complete) and loads it on resume
      (at rate 0 neither: the base model is the teacher, and verl loads it again on resume).
    """

    MODE = EMA_TRAINER

    def __init__(self, config):
        self._check_distils(config)
        settings = (config.get(SECTION) or {}).get("ema_teacher")
        if not settings:
            raise ValueError(f"trainer_mode {EMA_TRAINER} needs lopd_bench.ema_teacher (rate, topk, max_tokens)")
        self.ema = dict(settings)
        self.frozen = float(self.ema["rate"]) == 0.0  # OPSD's teacher: the base model as loaded
        _refuse_unpaired_teacher(config)
        _as_sync(config)
        super().__init__(config)
        self.use_teacher_policy = False  # no teacher servers: the teacher is the reference model
        self.use_reference_policy = True  # ... which verl builds only where a KL to it is asked for

    def _init_resource_pool_mgr(self):
        super()._init_resource_pool_mgr()
        from verl.trainer.ppo.utils import Role

        if Role.Actor in self.role_worker_mapping:
            raise ValueError(
                f"trainer_mode {EMA_TRAINER} needs the hybrid actor worker (actor_rollout_ref.hybrid_engine)"
            )
        # the hybrid worker with a reference model, whatever need_reference_policy says; verl's
        # resource-pool manager holds this same mapping
        for role in (Role.ActorRollout, Role.ActorRolloutRef):
            self.role_worker_mapping.pop(role, None)
            self.mapping.pop(role, None)
        self.role_worker_mapping[Role.ActorRolloutRef] = ray.remote(EMATeacherWorker)
        self.mapping[Role.ActorRolloutRef] = "global_pool"

    def teacher_folder(self, step: int) -> str:
        return os.path.join(checkpoint_dir(self.config, step), EMA_TEACHER_DIR)

    def on_init_end(self):
        super().on_init_end()
        self.actor_rollout_wg.check_teacher()  # the shards pair up, before a step's rollouts are spent
        if self.global_steps > 0 and not self.frozen:  # resumed: the teacher as it was saved with this checkpoint
            folder = self.teacher_folder(self.global_steps)
            if not os.path.isdir(folder):
                raise FileNotFoundError(f"{folder}: the checkpoint has no EMA teacher to resume from")
            self.actor_rollout_wg.load_teacher(folder)

    #: a rollout whose teacher reads nothing privileged: scored after its own prompt (OPSD, SDFT, as
    #: verl's teacher scores it), or no signal at all (SDPO, as the suite's SDPO)
    SILENT_WITHOUT_CONTEXT = False

    def teacher_prompts(self, extras: list[dict], batch) -> list[list[int] | None]:
        """Each rollout's teacher prompt ids (None: none privileged): the agent loop's."""
        return [extra.get(TEACHER_PROMPT) for extra in extras]

    def _compute_ref_log_prob(self, batch, metrics: dict):
        import transfer_queue as tq
        from verl.utils.tensordict_utils import list_of_dict_to_tensordict

        select = ["prompts", "responses", "extra_fields"] + (["response_mask"] if self.SILENT_WITHOUT_CONTEXT else [])
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=select)
        prompts = [p.tolist() for p in data["prompts"].unbind()]
        responses = [r.tolist() for r in data["responses"].unbind()]
        extras = [extra or {} for extra in list(data["extra_fields"])]
        teacher_prompts = self.teacher_prompts(extras, batch)
        sequences, starts, privileged = teacher_sequences(prompts, responses, teacher_prompts, self.ema.get("max_len"))
        scored = [i for i, p in enumerate(privileged) if p or not self.SILENT_WITHOUT_CONTEXT]
        # the student's logits reach verl's loss divided by the rollout temperature; so do the teacher's
        temperature = float(self.config.actor_rollout_ref.rollout.temperature)
        k = int(self.ema["topk"])
        per_rank = self.actor_rollout_wg.teacher_topk(
            [sequences[i] for i in scored], [starts[i] for i in scored], k, temperature, int(self.ema["max_tokens"])
        )
        rows = dict(zip(scored, merge_ranks(per_rank, len(scored)), strict=True))
        fields = []
        for i, (prompt, response) in enumerate(zip(prompts, responses)):
            if i in rows:
                # the rows start at the response's first token; the student's prompt positions before
                # its last get filler rows, which the loss never reads
                ids, logprobs = align_to_student(*rows[i], 1, len(prompt), self.tokenizer.pad_token_id)
            else:  # no signal: rows the top-k + tail loss leaves out (plugin.NO_TEACHER)
                ids, logprobs = no_teacher_rows(len(prompt) + len(response), k)
            fields.append({"teacher_ids": ids, "teacher_logprobs": logprobs})
        if self.SILENT_WITHOUT_CONTEXT:
            # the loss's token count is the taught rollouts' (verl's engine counts loss_mask), as the suite's
            # token mean runs over the rollouts with a signal; response_mask stays (verl's loss-range metric)
            taught = torch.tensor([float(i in rows) for i in range(len(prompts))])
            mask = data["response_mask"]
            for f, m, t in zip(fields, mask.unbind(), taught):
                f["loss_mask"] = m * t.to(m.dtype)
        tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=list_of_dict_to_tensordict(fields))
        # verl's padding rows (copies of a real one, to fill the data-parallel ranks) are not counted
        real = [not (tag or {}).get("is_padding", False) for tag in batch.tags]
        counted = [p for p, keep in zip(privileged, real, strict=True) if keep]
        metrics["teacher/signal_share"] = sum(counted) / max(len(counted), 1)
        return batch

    def _update_actor(self, batch, metrics: dict):
        batch = super()._update_actor(batch, metrics)
        if not self.frozen:
            self.actor_rollout_wg.ema_update(float(self.ema["rate"]))
        return batch

    def _save_checkpoint(self):
        # the teacher first: verl marks the checkpoint complete as its last act
        if not self.frozen:
            self.actor_rollout_wg.save_teacher(self.teacher_folder(self.global_steps))
        super()._save_checkpoint()


@_register(SDPO_TRAINER)
class SDPOTrainer(EMATeacherTrainer):
    """SDPO: the EMA teacher's trainer (:class:`EMATeacherTrainer`) whose teacher prompts it builds
    itself after the rollouts, from the step's groups as the suite's SDPO builds them
    (:func:`methods.verl_backend.sdpo.sdpo_contexts`): a successful sibling's trace and/or the
    rollout's own feedback, ahead of the task as :func:`methods.core.rollout.initial_prompt_ids`
    places a context.  A rollout with neither, or whose teacher sequence would not fit, gets no
    signal: rows the top-k + tail loss leaves out, and no tokens in the loss's count."""

    MODE = SDPO_TRAINER
    SILENT_WITHOUT_CONTEXT = True

    def __init__(self, config):
        settings = (config.get(SECTION) or {}).get("sdpo")
        if not settings:
            raise ValueError(
                f"trainer_mode {SDPO_TRAINER} needs lopd_bench.sdpo (success_threshold, use_sibling, use_feedback)"
            )
        self.sdpo = {k: settings[k] for k in ("success_threshold", "use_sibling", "use_feedback")}
        self._domains: dict = {}  # built domains and their task indexes, by the rows that name them
        super().__init__(config)

    def teacher_prompts(self, extras: list[dict], batch) -> list[list[int] | None]:
        from methods.core.rollout import initial_prompt_ids
        from methods.core.tokenizer import ChatEncoder

        from .export import task_of_row
        from .sdpo import SDPO_EPISODE, sdpo_contexts

        episodes = [extra.get(SDPO_EPISODE) for extra in extras]
        padding = [(tag or {}).get("is_padding", False) for tag in batch.tags]
        contexts, _ = sdpo_contexts(episodes, batch.keys, padding, **self.sdpo)
        encoder = ChatEncoder(self.tokenizer)
        prompts: list[list[int] | None] = []
        for episode, context in zip(episodes, contexts):
            if context is None:
                prompts.append(None)
                continue
            domain, task = task_of_row(episode["row"], self._domains)
            prompts.append(initial_prompt_ids(encoder, domain, task, context))
        return prompts

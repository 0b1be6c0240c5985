"""The method registry and the interface every method implements.

A method is one module that defines a :class:`MethodConfig` subclass (only its
own fields, with its paper's defaults) and a :class:`Method` subclass
registered by name::

    @register_method("grpo")
    class GRPO(Method):
        Config = GRPOConfig
        ...

The shared loop (:mod:`methods.core.loop`) owns everything else: seeding,
sampling rollouts, the budget ledger, optimizer steps, evaluation,
checkpoints and logging.  A method says how many rollouts it wants per task,
what context (if any) the student sees, what to precompute on a batch
(advantages, teacher log-probs) and its loss.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch

    from tasks.base import Task

    from .batch import RolloutBatch
    from .loop import RunContext

__all__ = ["MethodConfig", "Method", "register_method", "get_method", "known_methods", "make_config"]

#: Installed packages may add methods: each entry point of this group names a module that
#: registers one (``[project.entry-points."lopd_bench.methods"] rloo = "my_pkg.rloo"``).
ENTRY_POINT_GROUP = "lopd_bench.methods"
_REGISTERS = re.compile(r"^@register_method\(", re.M)


@dataclasses.dataclass
class MethodConfig:
    """Fields every method has.  Subclasses add their own and validate in ``__post_init__``."""

    group_size: int = 4  # rollouts per task in one step (G)

    #: the fields a cold start depends on (methods with ``needs_cold_start``): runs that share a
    #: :meth:`cold_start_key` share the cold start's file, so they must agree on these
    cold_start_fields: ClassVar[tuple[str, ...]] = ()

    def cold_start_key(self) -> str | None:
        """What the cold start depends on besides domain and seed (a path segment of its file);
        None where this configuration of a method with a cold start needs none."""
        raise NotImplementedError(f"{type(self).__name__} has no cold start")

    def __post_init__(self):
        if self.group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {self.group_size}")


class Method:
    """Base class.  Override only what differs from the defaults."""

    name: ClassVar[str] = ""
    Config: ClassVar[type[MethodConfig]] = MethodConfig
    #: True: the method reads the experience bank (the pipeline seeds one and passes it in as
    #: ``run.bank_path``, with its settings as ``run.bank_config``)
    uses_bank: ClassVar[bool] = False
    #: True: the method trains a component before RL in its own pipeline job (the ``coldstart``
    #: rule, ``python -m methods.cli coldstart``) through :meth:`cold_start`; the run gets the
    #: file as ``run.cold_start_path``
    needs_cold_start: ClassVar[bool] = False
    #: token-pass counters of the method's own networks (LOPD's composer) beyond the shared ones
    #: (:data:`methods.core.ledger.PASS_FIELDS`): every run's ledger carries every registered method's,
    #: so the compute-matched view (``analysis/compute.py``) reads the same fields from each run
    pass_counters: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def cold_start(cls, cfg: MethodConfig, *, backbone, encoder, bank, domain, seed: int, device) -> tuple[dict, dict]:
        """Train the component a run starts from (``needs_cold_start``) before RL.

        ``backbone``: the base policy; ``bank``: the seeded experience bank (``uses_bank``), else
        None.  Returns (the state ``torch.save`` writes, a JSON-able report)."""
        raise NotImplementedError(f"{cls.__name__} has no cold start")

    def __init__(self, cfg: MethodConfig, run: RunContext):
        self.cfg = cfg
        self.run = run

    # --- what the student sees -------------------------------------------------
    def student_context(self, task: Task) -> str | None:
        """Context block placed in the *student's* prompt (None: the bare task)."""
        return None

    def student_contexts(self, tasks: Sequence[Task]) -> list[str | None]:
        """:meth:`student_context` for a batch (training rollouts and evaluations call this).

        Override instead of ``student_context`` where batching pays (retrieval)."""
        return [self.student_context(t) for t in tasks]

    # --- per step ----------------------------------------------------------------
    def prepare(self, batch: RolloutBatch) -> dict[str, float]:
        """Precompute per-batch quantities (advantages, teacher scores) without gradients."""
        return {}

    def trainable_rows(self, batch: RolloutBatch) -> torch.Tensor:
        """Indices of the rollouts that carry a learning signal this step (default: all).

        Rows left out cost no forward/backward pass, and a step with no rows
        takes no optimizer step (Adam would otherwise move on momentum alone)."""
        import torch

        return torch.arange(len(batch), device=batch.input_ids.device)

    def loss(
        self, batch: RolloutBatch, rows: torch.Tensor, logp: torch.Tensor, logits: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Loss on the minibatch ``rows`` of ``batch``; returns (loss, metrics to log).

        **How often.** Each step the loop samples the rollouts, calls :meth:`prepare` once,
        then calls ``loss`` ``train.ppo_epochs`` times over the rows of
        :meth:`trainable_rows`, in minibatches of ``train.minibatch_rollouts``, with one
        optimizer step after each call.  From the second call on, the weights are no longer
        those that sampled the rollouts: an on-policy estimator (plain REINFORCE) must
        correct with the importance ratio against ``batch.extras["old_logp"]``, as
        :func:`methods.losses.ppo_clip_loss` does, or set ``ppo_epochs`` to 1.

        **What the loop provides.**

        * ``batch`` (:class:`methods.core.batch.RolloutBatch`): every rollout of the step,
          right-padded; ``rewards`` [N], ``group_index`` [N] (rollouts of one task in this
          step share it), ``loss_mask`` [N, T-1] (1 where the next token was the agent's),
          and ``extras``: what :meth:`prepare` stored, plus ``extras["old_logp"]`` [N, T-1],
          the log-prob of each agent token under the weights that sampled it (π_old).
        * ``rows``: the indices into ``batch`` of this minibatch.
          :func:`methods.core.batch.rows_of` slices any [N, T-1] tensor to it.
        * ``logp`` [b, T'-1]: the student's log-prob of each next token under the
          current weights, where ``loss_mask`` is 1 (0 elsewhere), with the minibatch's
          right padding trimmed (so T' <= T: slice per-token tensors with
          ``rows_of(t, rows, logp.shape[1])``).
        * ``logits`` [n, V]: the student's (temperature-scaled) logits at exactly those n
          agent-token positions, packed row-major, so ``logp[mask.bool()]`` and ``logits``
          line up (see :func:`methods.core.batch.agent_token_logprobs`).
        """
        raise NotImplementedError

    def after_step(self, batch: RolloutBatch) -> dict[str, float]:
        """Runs after the student's optimizer steps (EMA teachers, banks, composers)."""
        return {}

    # --- checkpointing -----------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


_METHODS: dict[str, type[Method]] = {}


def register_method(name: str):
    def deco(cls: type[Method]) -> type[Method]:
        if name in _METHODS and _METHODS[name] is not cls:
            raise ValueError(f"method {name!r} is already registered by {_METHODS[name].__module__}")
        cls.name = name
        _METHODS[name] = cls
        return cls

    return deco


def method_modules() -> list[str]:
    """The modules that register a method: every module under the ``methods`` package (one
    package level deep, ``methods/core`` aside) whose source has a line starting with
    ``@register_method(``, then the modules named by the ``lopd_bench.methods`` entry points.

    Found from the files, with no hand-kept list: a new ``methods/<name>.py`` is a method as
    soon as it exists.  Only the modules found are imported."""
    import methods

    found: list[str] = []
    for root in map(Path, methods.__path__):
        files = sorted(root.glob("*.py")) + sorted(p for p in root.glob("*/*.py") if p.parent.name != "core")
        for f in files:
            if _REGISTERS.search(f.read_text(encoding="utf-8")):
                parts = f.relative_to(root).with_suffix("").parts
                found.append(".".join(("methods", *parts)))
    from importlib.metadata import entry_points

    found += [ep.value.split(":")[0] for ep in entry_points(group=ENTRY_POINT_GROUP)]
    return found


def _import_methods() -> None:
    for mod in method_modules():
        importlib.import_module(mod)


def known_methods() -> list[str]:
    _import_methods()
    return sorted(_METHODS)


def declared_pass_counters() -> tuple[str, ...]:
    """The registered methods' own token-pass counters (:attr:`Method.pass_counters`), each once, by
    method name."""
    _import_methods()
    out: list[str] = []
    for name in sorted(_METHODS):
        out += [c for c in _METHODS[name].pass_counters if c not in out]
    return tuple(out)


def get_method(name: str) -> type[Method]:
    if name not in _METHODS:  # a registered name needs no new scan (config resolution asks often)
        _import_methods()
    if name not in _METHODS:
        from tasks.base import unknown_name

        raise unknown_name("method", name, _METHODS)
    return _METHODS[name]


def make_config(cls: type, values: dict[str, Any] | None, where: str):
    """Build dataclass ``cls`` from ``values``, with errors that name ``where.field``."""
    values = dict(values or {})
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}; allowed: {sorted(fields)}")
    try:
        return cls(**values)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None

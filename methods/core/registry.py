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
from typing import TYPE_CHECKING, Any, ClassVar, Sequence

if TYPE_CHECKING:
    import torch

    from tasks.base import Task

    from .batch import RolloutBatch
    from .loop import RunContext

__all__ = ["MethodConfig", "Method", "register_method", "get_method", "known_methods", "make_config"]

BUILTIN_METHOD_MODULES = ("methods.grpo", "methods.retrieval_rl", "methods.opsd", "methods.sdft", "methods.sdpo", "methods.skill_sd", "methods.lopd")


@dataclasses.dataclass
class MethodConfig:
    """Fields every method has.  Subclasses add their own and validate in ``__post_init__``."""

    group_size: int = 4  # rollouts per task in one step (G)

    def __post_init__(self):
        if self.group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {self.group_size}")


class Method:
    """Base class.  Override only what differs from the defaults."""

    name: ClassVar[str] = ""
    Config: ClassVar[type[MethodConfig]] = MethodConfig
    #: True: the method reads the experience bank (the pipeline seeds one and passes it in)
    uses_bank: ClassVar[bool] = False

    def __init__(self, cfg: MethodConfig, run: "RunContext"):
        self.cfg = cfg
        self.run = run

    # --- what the student sees -------------------------------------------------
    def student_context(self, task: "Task") -> str | None:
        """Context block placed in the *student's* prompt (None: the bare task)."""
        return None

    def student_contexts(self, tasks: "Sequence[Task]") -> "list[str | None]":
        """:meth:`student_context` for a batch (training rollouts and evaluations call this).

        Override instead of ``student_context`` where batching pays (retrieval)."""
        return [self.student_context(t) for t in tasks]

    # --- per step ----------------------------------------------------------------
    def prepare(self, batch: "RolloutBatch") -> dict[str, float]:
        """Precompute per-batch quantities (advantages, teacher scores) without gradients."""
        return {}

    def trainable_rows(self, batch: "RolloutBatch") -> "torch.Tensor":
        """Indices of the rollouts that carry a learning signal this step (default: all).

        Rows left out cost no forward/backward pass, and a step with no rows
        takes no optimizer step (Adam would otherwise move on momentum alone)."""
        import torch

        return torch.arange(len(batch), device=batch.input_ids.device)

    def loss(self, batch: "RolloutBatch", rows: "torch.Tensor", logp: "torch.Tensor", logits: "torch.Tensor") -> tuple["torch.Tensor", dict[str, float]]:
        """Loss on the minibatch ``rows`` of ``batch``.

        ``logp`` [b, T-1]: the student's log-prob of each next token under the
        current weights, where ``loss_mask`` is 1 (0 elsewhere); ``logits``
        [n, V]: the student's (temperature-scaled) logits at exactly those n
        agent-token positions, packed row-major, so ``logp[mask.bool()]`` and
        ``logits`` line up (see :func:`methods.core.batch.agent_token_logprobs`).
        """
        raise NotImplementedError

    def after_step(self, batch: "RolloutBatch") -> dict[str, float]:
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


def _import_builtins() -> None:
    for mod in BUILTIN_METHOD_MODULES:
        importlib.import_module(mod)


def known_methods() -> list[str]:
    _import_builtins()
    return sorted(_METHODS)


def get_method(name: str) -> type[Method]:
    _import_builtins()
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

"""An EMA teacher inside verl's actor worker (SDFT on verl).

SDFT's teacher is an exponential moving average of the student (``θ_T ← (1 − α)·θ_T + α·θ_S``
after every training step, α = 0.01: :meth:`methods.core.teacher.Teacher.update`) reading the
task's demonstration ahead of the task.  verl's teacher servers are frozen, and the rollout
servers (Skill-SD's teacher) hold the student, not its average.  So the EMA lives where verl
already keeps a second copy of the model beside the student: the reference model of the hybrid
actor worker (role ``actor_rollout_ref``), an FSDP engine on the same devices, sharded as the
actor is.  As in the SDPO authors' verl fork, the reference model *is* the teacher; there is no
third copy.

:class:`EMATeacherWorker` is verl's ``ActorRolloutRefWorker`` with five calls the trainer
(:class:`methods.verl_backend.trainer.EMATeacherTrainer`) makes on every rank:

* :meth:`~EMATeacherWorker.ema_update` after each step's update: each rank moves its own shards of
  the reference model toward its own shards of the actor (:func:`ema_update_`), with no
  communication; the reference model's weights are fp32 (verl's default ``model_dtype``), since
  at α = 0.01 a bf16 average would round most updates away (8 significant bits: a step is lost
  whenever the student differs from the teacher by less than 20 to 40 % of the weight);
* :meth:`~EMATeacherWorker.teacher_topk`: the teacher's top-k log-probabilities at each response
  token of *teacher prompt + response* sequences (:func:`topk_rows`), at the rollout
  temperature, from the full logits (so no tempering approximation, unlike the teacher servers'
  rows in :mod:`.distill`), in right-padded micro-batches (:func:`micro_batches`), freeing the
  root FSDP unit's gathered weights around them (:func:`reshard_root`);
* :meth:`~EMATeacherWorker.check_teacher`, once before training: the shards pair up;
* :meth:`~EMATeacherWorker.save_teacher` / :meth:`~EMATeacherWorker.load_teacher`: each rank's
  shards beside verl's checkpoint (verl saves the actor only), so a resumed run continues from
  the average it had.

Nothing of the worker runs without GPUs (verl's FSDP engine is registered for CUDA and NPU); the
tests run :func:`ema_update_`, :func:`topk_rows`, :func:`micro_batches` and the worker's methods on
plain modules.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Sequence

import torch
from verl.single_controller.base.decorator import Dispatch, register
from verl.utils.device import get_device_id, get_device_name, get_torch_device
from verl.workers.engine_workers import ActorRolloutRefWorker

__all__ = ["ema_update_", "topk_rows", "micro_batches", "reshard_root", "local_shard", "shard_file", "EMATeacherWorker"]


def local_shard(param: torch.Tensor) -> torch.Tensor:
    """The part of ``param`` this rank holds: an FSDP2 parameter's local tensor, else the tensor
    itself (an FSDP1 flat parameter is already this rank's shard)."""
    to_local = getattr(param, "to_local", None)
    return to_local() if to_local is not None else param.data


@torch.no_grad()
def ema_update_(
    teacher: Iterable[tuple[str, torch.Tensor]], student: Iterable[tuple[str, torch.Tensor]], rate: float | None
) -> int:
    """``θ_T ← (1 − rate)·θ_T + rate·θ_S`` in place, parameter by parameter (the suite's
    :meth:`~methods.core.teacher.Teacher.update`), on named tensors paired in order.  Returns the
    number of elements updated.  Refuses pairs whose names or shapes differ (the two models are
    not sharded alike) and teachers that are not fp32.  ``rate`` None checks and moves nothing."""
    if rate is not None and not 0.0 < rate <= 1.0:
        raise ValueError(f"an EMA teacher needs a rate in (0, 1], got {rate}")
    teacher, student = list(teacher), list(student)
    if [n for n, _ in teacher] != [n for n, _ in student]:
        raise ValueError("the teacher's and the student's parameters differ in names or order")
    count = 0
    for (name, t), (_, s) in zip(teacher, student):
        if t.shape != s.shape:
            raise ValueError(f"{name}: teacher shard {tuple(t.shape)} != student shard {tuple(s.shape)}")
        if t.dtype != torch.float32:
            raise ValueError(f"{name}: the EMA teacher must be fp32 (got {t.dtype}); a rate-{rate} average rounds away")
        if rate is not None:
            t.lerp_(s.to(device=t.device, dtype=t.dtype), rate)
        count += t.numel()
    return count


def topk_rows(
    logits: torch.Tensor, start: int, k: int, temperature: float, chunk: int = 1024
) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-``k`` ids ``[n, k]`` (int32) and log-probabilities (fp32) of ``softmax(logits /
    temperature)`` at positions ``start`` on, of one sequence's logits ``[L, V]``: row ``j`` is the
    distribution over the token at ``start + j + 1``, so with ``start`` = teacher prompt length − 1
    the rows predict the response's tokens, and the last row (after the last token) fills the
    dummy row verl's layout ends with.  ``chunk`` rows at a time are upcast (a 16k-token response
    over a 150k vocabulary would be 10 GB in fp32 at once)."""
    ids, logprobs = [], []
    for piece in logits[start:].split(chunk):
        lp, top = torch.log_softmax(piece.float() / temperature, dim=-1).topk(k, dim=-1)
        ids.append(top.to(torch.int32))
        logprobs.append(lp)
    return torch.cat(ids), torch.cat(logprobs)


def micro_batches(lengths: Sequence[int], rank: int, world_size: int, max_tokens: int) -> list[list[int]]:
    """Rank ``rank``'s share of sequences (every ``world_size``-th, from ``rank``), shortest first
    (less padding), grouped into micro-batches whose padded size (rows × the longest row) stays
    within ``max_tokens``; a sequence longer than that goes alone."""
    batches: list[list[int]] = []
    longest = 0
    for i in sorted(range(rank, len(lengths), world_size), key=lambda i: (lengths[i], i)):
        if batches and (len(batches[-1]) + 1) * max(longest, lengths[i]) <= max_tokens:
            batches[-1].append(i)
            longest = max(longest, lengths[i])
        else:
            batches.append([i])
            longest = lengths[i]
    return batches


def reshard_root(module) -> None:
    """Free the root FSDP unit's gathered weights (verl's own eval-mode exit does it only where
    ``fsdp_size`` > 1): FSDP1 reuses them at the next forward without gathering the shards again,
    so after an EMA update the teacher would score with the embeddings, final norm and head it
    had before.  A plain module (the tests') has nothing to free."""
    handle = getattr(module, "_handle", None)  # FSDP1's root unit
    if handle is not None:
        # before FSDP1's lazy initialisation (a model not yet run: the reference model until its first
        # scoring) nothing is gathered, and resharding would fail on the missing local shard
        if handle.uses_sharded_strategy and hasattr(handle.flat_param, "_local_shard"):
            handle.reshard(True)
    elif callable(getattr(module, "reshard", None)):  # FSDP2's FSDPModule
        module.reshard()


def shard_file(folder: str, rank: int, world_size: int) -> str:
    """Where rank ``rank`` of ``world_size`` keeps its teacher shards in a checkpoint folder."""
    return os.path.join(folder, f"teacher_rank{rank}_of{world_size}.pt")


class EMATeacherWorker(ActorRolloutRefWorker):
    """verl's hybrid actor worker whose reference model is an EMA teacher (module docstring)."""

    def _named_shards(self, which) -> list[tuple[str, torch.Tensor]]:
        """``which``'s (the actor's or the reference model's) parameters as this rank's shards.  The
        root unit is resharded first: an FSDP2 root may keep its gathered weights after a forward,
        and its registered parameters are then the gathered copies, which an update would write
        into and the next gathering would overwrite (a test on two CPU processes shows it)."""
        module = which.engine.module
        reshard_root(module)
        return [(name, local_shard(p)) for name, p in module.named_parameters()]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def ema_update(self, rate: float) -> int:
        """Move this rank's teacher shards toward its actor shards; the element count updated."""
        if self.ref is None or self.actor is None:
            raise RuntimeError("the EMA teacher needs role actor_rollout_ref (an actor and a reference model)")
        return ema_update_(self._named_shards(self.ref), self._named_shards(self.actor), rate)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def check_teacher(self) -> int:
        """Refuse, before the first step, a teacher whose shards do not pair with the actor's (the
        checks of :func:`ema_update_`, nothing moved); the element count."""
        if self.ref is None or self.actor is None:
            raise RuntimeError("the EMA teacher needs role actor_rollout_ref (an actor and a reference model)")
        return ema_update_(self._named_shards(self.ref), self._named_shards(self.actor), rate=None)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def teacher_topk(
        self,
        sequences: Sequence[Sequence[int]],
        starts: Sequence[int],
        k: int,
        temperature: float,
        max_tokens: int = 16384,
    ) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """:func:`topk_rows` of the teacher for each sequence (``starts[i]`` = its teacher prompt's
        length − 1).  Every rank gets every sequence and scores every ``world_size``-th one, in
        right-padded micro-batches of at most ``max_tokens`` padded tokens (:func:`micro_batches`;
        a causal model's logits at a row's real tokens do not depend on the padding after them);
        ranks with fewer micro-batches make one-token forwards, so that all ranks make the same
        number (FSDP gathers each layer's weights collectively).  Returns this rank's rows by
        sequence index; the trainer merges the ranks'."""
        lengths = [len(s) for s in sequences]
        plans = [micro_batches(lengths, r, self.world_size, max_tokens) for r in range(self.world_size)]
        mine, rounds = plans[self.rank], max((len(p) for p in plans), default=0)
        accelerated = get_torch_device().is_available()
        device = torch.device(get_device_name(), get_device_id()) if accelerated else torch.device("cpu")
        dtype = getattr(self.ref.engine, "_autocast_dtype", torch.float32)  # as verl's own forward_step
        autocast = (
            torch.autocast(device_type=device.type, dtype=dtype) if dtype != torch.float32 else contextlib.nullcontext()
        )
        module = self.ref.engine.module
        out: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        with self.ref.engine.eval_mode(), torch.no_grad(), autocast:
            reshard_root(module)  # weights gathered before the last update must not be reused
            for r in range(rounds):
                batch = mine[r] if r < len(mine) else None
                rows = [list(sequences[i]) for i in batch] if batch else [list(sequences[0][:1])]
                width = max(len(row) for row in rows)
                ids = torch.tensor([row + row[-1:] * (width - len(row)) for row in rows], device=device)
                keep = width - min(int(starts[i]) for i in batch) if batch else 1
                logits = module(
                    input_ids=ids, position_ids=torch.arange(width, device=device).expand_as(ids), use_cache=False,
                    logits_to_keep=keep,
                ).logits  # fmt: skip
                if logits.shape[1] != keep:  # some of verl's replacement forwards ignore logits_to_keep
                    raise RuntimeError(
                        f"the teacher's forward returned {logits.shape[1]} positions, not the last {keep}"
                    )
                for b, i in enumerate(batch or ()):
                    offset = width - keep  # logits[:, j] is position offset + j
                    row_ids, row_lp = topk_rows(
                        logits[b, int(starts[i]) - offset : lengths[i] - offset], 0, k, temperature
                    )
                    out[i] = (row_ids.cpu(), row_lp.cpu())
                del logits  # not alive during the next forward
            reshard_root(module)  # FSDP1 keeps the root unit's gathered weights otherwise (stale after the update)
        return out

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_teacher(self, folder: str) -> None:
        """This rank's teacher shards into ``folder`` (one file per rank)."""
        os.makedirs(folder, exist_ok=True)
        shards = {name: t.detach().cpu().clone() for name, t in self._named_shards(self.ref)}
        path = shard_file(folder, self.rank, self.world_size)
        torch.save(shards, path + ".tmp")
        os.replace(path + ".tmp", path)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_teacher(self, folder: str) -> None:
        """This rank's teacher shards from ``folder``, saved by as many ranks as there are now."""
        path = shard_file(folder, self.rank, self.world_size)
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"{path}: no EMA teacher saved by rank {self.rank} of {self.world_size} (a checkpoint from another "
                "number of GPUs cannot be resumed with its teacher)"
            )
        saved = torch.load(path, map_location="cpu", weights_only=True)
        with torch.no_grad():
            mine = self._named_shards(self.ref)
            if sorted(saved) != sorted(name for name, _ in mine):
                raise ValueError(f"{path}: the saved teacher's parameters are not this model's")
            for name, t in mine:
                if saved[name].shape != t.shape:
                    raise ValueError(f"{path}: {name} was saved as {tuple(saved[name].shape)}, is {tuple(t.shape)}")
                t.copy_(saved[name])

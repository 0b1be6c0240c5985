"""SDPO on verl, as far as it goes (issue 40): the suite's top-k + tail reverse KL as a verl distillation
loss, computed in verl's own logits processor (``distillation_ppo_loss`` with the student's logits)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("verl")
from tensordict import TensorDict  # noqa: E402

from methods.divergences import topk_tail  # noqa: E402
from methods.verl_backend import plugin  # noqa: E402
from tests.helpers.verl import _config, _suite_config  # noqa: E402

VOCAB, K = 40, 6
LENGTHS = [5, 3, 7]  # three sequences, packed as verl's engine packs them (one row of their tokens)


def _distillation_config(loss_mode: str):
    """verl's DistillationConfig of the real-verl SDFT config with ``loss_mode`` and top-``K`` rows."""
    from verl.utils.config import omega_conf_to_dataclass

    from methods.core.config import resolve_job
    from methods.verl_backend.launch import main_ppo_config

    job = resolve_job(dict(_suite_config(), profile="real-verl"), "code", "sdft")
    cfg = main_ppo_config(job, 0, model_path="m", data_dir="d", run_dir="r")
    cfg.distillation.distillation_loss.loss_mode = loss_mode
    cfg.distillation.distillation_loss.topk = K
    return omega_conf_to_dataclass(cfg.distillation)


def _rows(seed=0):
    """Student logits ``[1, nnz, V]`` and the teacher's full logits; the teacher's top-K rows per
    sequence (nested, as verl's batch holds them) are the top-K of its log-softmax."""
    g = torch.Generator().manual_seed(seed)
    nnz = sum(LENGTHS)
    student = (torch.randn(1, nnz, VOCAB, generator=g) * 2).requires_grad_()
    teacher = torch.randn(nnz, VOCAB, generator=g) * 3
    top = torch.log_softmax(teacher, -1).topk(K, dim=-1)
    split = lambda x: torch.nested.as_nested_tensor(list(x.split(LENGTHS)), layout=torch.jagged)  # noqa: E731
    data = TensorDict(
        {"teacher_logprobs": split(top.values), "teacher_ids": split(top.indices)}, batch_size=[len(LENGTHS)]
    )
    return student, teacher, data


def test_the_topk_tail_loss_in_verls_logits_processor_is_the_suites():
    """verl's ``distillation_ppo_loss`` as the logits processor, with the plugin's mode: per token and in
    its gradient, the suite's ``topk_tail`` reverse KL on the teacher's top-K support (SDPO's divergence);
    the masses are those of the K tokens."""
    from verl.trainer.distillation.losses import distillation_ppo_loss

    student, teacher, data = _rows()
    out = distillation_ppo_loss(
        _config("vanilla"), _distillation_config(plugin.TOPK_TAIL_LOSS), data=data, student_logits=student
    )
    suite = topk_tail(student[0], teacher, m=K, support="teacher")
    torch.testing.assert_close(out["distillation_losses"][0], suite)
    (got,) = torch.autograd.grad(out["distillation_losses"].sum(), student)
    (want,) = torch.autograd.grad(topk_tail(student[0], teacher, m=K, support="teacher").sum(), student)
    torch.testing.assert_close(got, want)
    assert got.abs().sum() > 0 and (out["distillation_losses"] >= -1e-6).all()
    idx = torch.log_softmax(teacher, -1).topk(K, dim=-1).indices
    mass = torch.softmax(student[0].detach(), -1).gather(-1, idx).sum(-1)
    torch.testing.assert_close(out["student_mass"][0], mass)


def test_other_loss_modes_keep_verls_own_processor():
    """The dispatch routes only the plugin's mode: verl's top-k forward KL still gives verl's values
    (and is not the reverse KL), and re-registering (a second import of the plugin) keeps one layer."""
    from verl.trainer.distillation import losses as d
    from verl.trainer.distillation.fsdp import losses as fsdp_losses

    student, _, data = _rows(1)
    theirs = fsdp_losses.compute_forward_kl_topk(
        student, data["teacher_logprobs"], data["teacher_ids"], _distillation_config("forward_kl_topk"), "thd"
    )
    ours = d.distillation_ppo_loss(
        _config("vanilla"), _distillation_config("forward_kl_topk"), data=data, student_logits=student
    )
    torch.testing.assert_close(ours["distillation_losses"], theirs["distillation_losses"])
    reverse = d.distillation_ppo_loss(
        _config("vanilla"), _distillation_config(plugin.TOPK_TAIL_LOSS), data=data, student_logits=student
    )
    assert not torch.allclose(reverse["distillation_losses"], theirs["distillation_losses"])
    plugin.register()
    assert d._lopd_bench_verl_compute_topk_loss.__module__ == "verl.trainer.distillation.losses"
    assert d.get_distillation_loss_settings(plugin.TOPK_TAIL_LOSS).use_topk

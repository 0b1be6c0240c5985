"""Divergences: numerically equal to TRL's implementations, and their defining properties."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from methods.divergences import divergence, forward_kl, jsd, reverse_kl, token_mean, topk_tail

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def _logits(seed: int, n: int = 7, v: int = 50, scale: float = 3.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, v, generator=g) * scale, torch.randn(n, v, generator=g) * scale


@pytest.mark.parametrize("beta", [0.0, 0.3, 0.5, 1.0])
def test_jsd_matches_trl_gkd(beta):
    from trl.experimental.gkd import GKDTrainer

    s, t = _logits(1)
    # TRL's "batchmean" divides the summed divergence by the batch size (1 sequence here)
    ref = GKDTrainer.generalized_jsd_loss(s[None], t[None], beta=beta, reduction="batchmean")
    assert torch.allclose(jsd(s, t, beta).sum(), ref, atol=1e-4)
    per_token = GKDTrainer.generalized_jsd_loss(s[None], t[None], beta=beta, reduction="none").sum(-1)[0]
    assert torch.allclose(jsd(s, t, beta), per_token, atol=1e-5)
    if beta == 0.0:
        assert torch.allclose(forward_kl(s, t), per_token, atol=1e-5)
    if beta == 1.0:
        assert torch.allclose(reverse_kl(s, t), per_token, atol=1e-5)


@pytest.mark.parametrize("m", [1, 5, 20])
def test_topk_tail_with_student_support_matches_trl_sdpo(m):
    from trl.experimental.sdpo.loss_utils import compute_topk_self_distillation_loss

    s, t = _logits(2)
    ref = compute_topk_self_distillation_loss(
        s, t, distillation_topk=m, distillation_alpha=1.0, distillation_add_tail=True
    )
    assert torch.allclose(topk_tail(s, t, m, support="student"), ref, atol=1e-5)
    ref_fwd = compute_topk_self_distillation_loss(
        s, t, distillation_topk=m, distillation_alpha=0.0, distillation_add_tail=True
    )
    assert torch.allclose(topk_tail(s, t, m, support="student", reverse=False), ref_fwd, atol=1e-5)


def test_topk_tail_with_teacher_support_is_trl_with_roles_of_the_support_swapped():
    """LOPD's default (teacher's top-M) equals TRL's formula on the teacher's support."""
    from trl.experimental.sdpo.loss_utils import add_tail_bucket

    s, t = _logits(3)
    idx = torch.topk(t, 20, dim=-1).indices
    sl, tl = torch.log_softmax(s, -1).gather(-1, idx), torch.log_softmax(t, -1).gather(-1, idx)
    sb, tb = add_tail_bucket(sl), add_tail_bucket(tl)
    ref = torch.nn.functional.kl_div(tb, sb, reduction="none", log_target=True).sum(-1)
    assert torch.allclose(topk_tail(s, t, 20), ref, atol=1e-5)


def test_topk_tail_with_the_whole_vocabulary_is_the_full_kl():
    s, t = _logits(4, v=12)
    assert torch.allclose(topk_tail(s, t, 12), reverse_kl(s, t), atol=1e-4)


NAMES = ["forward_kl", "reverse_kl", "jsd", "topk_tail"]


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), name=st.sampled_from(NAMES), scale=st.floats(0.1, 20.0))
def test_zero_on_identical_and_non_negative(seed, name, scale):
    s, t = _logits(seed, scale=scale)
    assert torch.all(divergence(name, s, t) >= -1e-5)
    assert torch.allclose(divergence(name, s, s.clone()), torch.zeros(s.shape[0]), atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_gradients_reach_only_the_student(name):
    s, t = _logits(5)
    s.requires_grad_(True)
    t.requires_grad_(True)
    token_mean(divergence(name, s, t)).backward()
    assert s.grad is not None and s.grad.abs().sum() > 0
    assert t.grad is None


def test_token_mean_and_bad_names():
    assert token_mean(torch.tensor([1.0, 3.0])) == 2.0
    assert token_mean(torch.tensor([1.0, 3.0]), torch.tensor([1.0, 0.0])) == 1.0
    assert token_mean(torch.zeros(0)) == 0.0
    with pytest.raises(ValueError, match="unknown divergence"):
        divergence("kl", *_logits(0))
    with pytest.raises(ValueError, match="support"):
        topk_tail(*_logits(0), support="both")
    with pytest.raises(ValueError, match="beta"):
        jsd(*_logits(0), beta=1.5)


def test_sampled_token_reverse_kl_matches_trl_sdpo_sampled_token_path():
    from trl.experimental.sdpo.loss_utils import (
        apply_importance_sampling_clipping,
        compute_sampled_token_self_distillation_loss,
    )

    from methods.divergences import sampled_token_reverse_kl

    s, t = _logits(6)
    ids = torch.randint(0, s.shape[1], (s.shape[0],), generator=torch.Generator().manual_seed(0))
    old = torch.log_softmax(s + 0.3 * torch.randn_like(s), -1).gather(-1, ids[:, None]).squeeze(-1)
    ref = compute_sampled_token_self_distillation_loss(s[None], t[None], ids[None], distillation_alpha=1.0)[0]
    slp = torch.log_softmax(s, -1).gather(-1, ids[:, None]).squeeze(-1)
    tlp = torch.log_softmax(t, -1).gather(-1, ids[:, None]).squeeze(-1)
    assert torch.allclose(sampled_token_reverse_kl(slp, tlp, None), ref, atol=1e-5)
    ref_is = apply_importance_sampling_clipping(ref, slp, old, 2.0)
    assert torch.allclose(sampled_token_reverse_kl(slp, tlp, old, 2.0), ref_is, atol=1e-5)


@pytest.mark.parametrize("name", ["forward_kl", "reverse_kl", "jsd", "topk_tail"])
def test_grad_to_teacher_moves_the_gradient_to_the_teacher_side(name):
    """LOPD's composer loss is the student's KL with its gradient taken on the teacher side."""
    from methods.divergences import divergence

    g = torch.Generator().manual_seed(0)
    s = torch.randn(5, 30, generator=g, requires_grad=True)
    t = torch.randn(5, 30, generator=g, requires_grad=True)
    a = divergence(name, s, t, m=5)
    b = divergence(name, s, t, m=5, grad_to="teacher")
    torch.testing.assert_close(a, b)  # same value either way
    b.sum().backward()
    assert s.grad is None and t.grad is not None and t.grad.abs().sum() > 0
    with pytest.raises(ValueError):
        divergence(name, s, t, grad_to="both")


def test_a_registered_divergence_is_selectable_by_name():
    from methods import divergences as dv
    from methods.core.distill import DistillConfig

    @dv.register_divergence("sq_logp_gap")
    def _sq(s, t, *, grad_to, **_):
        return (torch.log_softmax(s, -1) - torch.log_softmax(t, -1).detach()).pow(2).sum(-1)

    try:
        assert "sq_logp_gap" in dv.known_divergences()
        DistillConfig(divergence="sq_logp_gap")  # accepted by every self-distillation method's config
        s, t = torch.randn(5, 7), torch.randn(5, 7)
        assert torch.equal(dv.divergence("sq_logp_gap", s, t), _sq(s, t, grad_to="student"))
        with pytest.raises(ValueError, match="already registered"):
            dv.register_divergence("forward_kl")(_sq)
    finally:
        dv._DIVERGENCES.pop("sq_logp_gap", None)
    with pytest.raises(ValueError, match="divergence must be one of"):
        DistillConfig(divergence="sq_logp_gap")

"""LOPD: the privileged-margin math (property tests), the composer and the latent-conditioned
teacher (shapes, injection, gradients), retrieval shortfalls, bad configs and the cold start."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from methods.lopd.composer import item_text
from methods.lopd.margin import (
    anchor_penalty,
    composer_objective,
    dual_update,
    privileged_margin,
    rollout_means,
    token_delta,
    token_weighted_margin,
)
from methods.lopd.method import LOPDConfig, fill

# --------------------------------------------------------------------------- margin (pure)

floats = st.floats(-5, 5, allow_nan=False)


@given(beta=st.floats(0, 10), margin=floats, target=st.floats(0, 1), lr=st.floats(0.01, 2))
def test_dual_step_rises_below_the_target_and_never_goes_negative(beta, margin, target, lr):
    new = dual_update(beta, margin, target, lr)
    assert new >= 0
    if target - margin > 1e-6:  # (a gap below float resolution at beta's scale cannot move it)
        assert new > beta
    elif margin > target:
        assert new <= beta


@given(start=st.floats(0, 10), excess=st.floats(0.01, 1), lr=st.floats(0.05, 2))
def test_beta_decays_to_zero_while_the_margin_holds(start, excess, lr):
    beta = start
    for _ in range(int(start / (excess * lr)) + 2):
        beta = dual_update(beta, 0.05 + excess, 0.05, lr)
    assert beta == 0.0


@settings(max_examples=50, deadline=None)  # the first example pays torch's kernel set-up (about 0.35 s)
@given(counts=st.lists(st.integers(0, 6), min_size=1, max_size=6), data=st.data())
def test_rollout_means_match_a_loop(counts, data):
    vals = torch.tensor(data.draw(st.lists(floats, min_size=sum(counts), max_size=sum(counts))), dtype=torch.float64)
    got = rollout_means(vals, counts)
    pieces = torch.split(vals, counts)
    want = torch.stack([p.mean() if len(p) else torch.tensor(0.0, dtype=torch.float64) for p in pieces])
    torch.testing.assert_close(got, want)


@settings(max_examples=50)
@given(counts=st.lists(st.integers(1, 5), min_size=1, max_size=6), gap=st.floats(0.01, 3), data=st.data())
def test_margin_sign_follows_the_outcome(counts, gap, data):
    """A teacher that prefers the student's tokens (δ > 0) has a positive margin on successes
    and a negative one on failures; A = 2r − 1 weighs partial rewards in between."""
    delta = torch.full((sum(counts),), gap)
    ones, zeros = torch.ones(len(counts)), torch.zeros(len(counts))
    assert privileged_margin(delta, counts, ones) > 0
    assert privileged_margin(delta, counts, zeros) < 0
    assert privileged_margin(-delta, counts, ones) < 0
    half = torch.full((len(counts),), 0.5)
    assert abs(float(privileged_margin(delta, counts, half))) < 1e-6


def test_a_collapsed_composer_has_zero_margin_and_a_growing_beta():
    """Latents that carry no information leave the teacher where the student is: δ = 0, so
    Δ = 0 whatever the rewards, and the dual step raises β by η·m every step."""
    counts = [3, 5, 2, 4]
    student = torch.randn(sum(counts))
    delta = token_delta(student.clone().requires_grad_(), student)
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.25])
    margin = privileged_margin(delta, counts, rewards)
    assert float(margin.detach()) == 0.0
    beta = 0.0
    for step in range(1, 6):
        beta = dual_update(beta, float(margin.detach()), 0.05, 0.5)
        assert beta == pytest.approx(0.025 * step)


def test_gradients_reach_the_teacher_and_the_latents_only():
    t = torch.randn(7, requires_grad=True)
    s = torch.randn(7, requires_grad=True)
    privileged_margin(token_delta(t, s), [3, 4], torch.tensor([1.0, 0.0])).backward()
    assert t.grad is not None and t.grad.abs().sum() > 0 and s.grad is None
    lat = torch.randn(2, 4, 8, requires_grad=True)
    anc = torch.randn(2, 4, 8, requires_grad=True)
    anchor_penalty(lat, anc).backward()
    assert lat.grad is not None and anc.grad is None
    assert float(anchor_penalty(anc.detach(), anc.detach())) == 0.0


@settings(max_examples=50, deadline=None)
@given(counts=st.lists(st.integers(0, 6), min_size=1, max_size=6), data=st.data())
def test_the_dual_steps_margin_weighs_rollouts_by_their_tokens(counts, data):
    """The reference's β reads Σ n_i A_i δ̄_i / Σ n_i; with equal counts it is the gradient's Δ."""
    vals = torch.tensor(data.draw(st.lists(floats, min_size=sum(counts), max_size=sum(counts))), dtype=torch.float64)
    rewards = torch.tensor(data.draw(st.lists(st.floats(0, 1), min_size=len(counts), max_size=len(counts))))
    got = float(token_weighted_margin(vals, counts, rewards))
    pieces = torch.split(vals, counts)
    num = sum(len(p) * (2 * float(r) - 1) * float(p.mean()) for p, r in zip(pieces, rewards) if len(p))
    assert got == pytest.approx(num / sum(counts) if sum(counts) else 0.0, abs=1e-9)
    same = [3] * len(counts)
    even = torch.tensor(data.draw(st.lists(floats, min_size=sum(same), max_size=sum(same))), dtype=torch.float64)
    assert float(token_weighted_margin(even, same, rewards)) == pytest.approx(
        float(privileged_margin(even, same, rewards.double())), abs=1e-9
    )


def test_the_anchor_acts_at_unit_scale_and_averages_per_rollout():
    """Latents at scale s pay the anchor of the same latents at unit scale, and with item counts
    the mean is taken per rollout, then over rollouts (the reference's per-rollout loss)."""
    unit = torch.randn(3, 4, 8)
    unit0 = torch.randn(3, 4, 8)
    s = 0.075
    assert float(anchor_penalty(unit * s, unit0 * s, scale=s)) == pytest.approx(
        float(anchor_penalty(unit, unit0)), rel=1e-5
    )
    per_item = (unit - unit0).pow(2).flatten(1).mean(-1)
    want = (float(per_item[:2].mean()) + float(per_item[2])) / 2  # rollout 1 has items 0-1, rollout 2 item 2
    assert float(anchor_penalty(unit, unit0, counts=[2, 1])) == pytest.approx(want, rel=1e-5)
    with pytest.raises(ValueError):
        anchor_penalty(unit, unit0, scale=0.0)


def test_composer_objective_combines_the_terms():
    kl, margin, anchor = torch.tensor(0.3), torch.tensor(0.01), torch.tensor(0.4)
    got = composer_objective(kl, margin, beta=2.0, target=0.05, anchor=anchor, anchor_weight=0.2)
    assert float(got) == pytest.approx(0.3 + 2.0 * (0.05 - 0.01) + 0.2 * 0.4)


# --------------------------------------------------------------------------- config and retrieval shortfalls


@pytest.mark.parametrize(
    "bad",
    [
        {"fill_missing": "pad"},
        {"n_latents": 0},
        {"n_retrieve": 0},
        {"margin": -0.1},
        {"composer_lr": 0.0},
        {"topk": 0},
        {"divergence": "kl"},
        {"teacher_context": "image"},
        {"composer_weight_decay": -0.1},
    ],
)
def test_bad_lopd_config_is_rejected(bad):
    with pytest.raises(ValueError):
        LOPDConfig(**bad)


def test_lopds_teacher_is_always_the_frozen_base_policy():
    """LOPD has no teacher-weights setting to refuse: its config has no such field."""
    from methods.core.registry import make_config

    with pytest.raises(ValueError, match="unknown field"):
        make_config(LOPDConfig, {"teacher_source": "ema", "ema_rate": 0.1}, "methods.lopd")


def test_fewer_retrieved_than_j_is_handled_as_configured():
    assert fill(["a"], 3, "shorter") == ["a"]
    assert fill(["a", "b"], 3, "repeat") == ["a", "b", "a"]
    assert fill([], 3, "repeat") == []
    assert fill(["a", "b", "c", "d"], 3, "shorter") == ["a", "b", "c"]


# --------------------------------------------------------------------------- composer and teacher


@pytest.fixture
def lopd_run(warmstarts, seeded_banks, tmp_path):
    from .conftest import tiny_run

    run = tiny_run(warmstarts["tooluse"][0], "tooluse", out_dir=tmp_path)
    run.bank_path = seeded_banks["tooluse"]
    return run


def _method(run, **over):
    from methods.lopd import LOPD

    return LOPD(LOPDConfig(**over), run)


def _batch(run, n=6):
    from methods.core.batch import collate
    from methods.core.rollout import run_episodes

    tasks = run.domain.tasks("train", 200)[100 : 100 + n]
    g = torch.Generator().manual_seed(0)
    rollouts = run_episodes(
        run.model, run.encoder, run.domain, tasks, [None] * n, run.train_cfg.sampling(), generator=g
    )
    for r in rollouts[: n // 2]:  # make half of them successes, so every term of the composer loss is live
        r.reward = 1.0
    return collate(rollouts, list(range(n)), run.encoder.pad_id)


@pytest.mark.parametrize("K,J", [(8, 3), (4, 1)])
def test_latents_have_j_times_k_rows_of_the_backbone_width(lopd_run, K, J):
    m = _method(lopd_run, n_latents=K, n_retrieve=J)
    tasks = lopd_run.domain.tasks("train", 200)[100:103]
    hits = m.retrieve(tasks)
    assert all(len(h) == J for h in hits)
    per_task, lat, anchor = m.compose(tasks, hits)
    d = lopd_run.model.config.hidden_size
    assert [tuple(x.shape) for x in per_task] == [(J * K, d)] * 3
    assert lat.shape == anchor.shape == (3 * J, K, d)
    torch.testing.assert_close(lat, anchor)  # before any composer step, c_φ = c_φ0


def test_chunked_composing_equals_one_batch_in_input_order(lopd_run):
    m = _method(lopd_run, n_latents=4, n_retrieve=3)
    tasks = lopd_run.domain.tasks("train", 200)[100:106]
    hits = m.retrieve(tasks)
    ids = m.composer.encode_items([item_text(t.prompt, e) for t, hs in zip(tasks, hits) for e in hs])
    assert len({len(x) for x in ids}) > 1  # ragged, so sorting by length reorders them
    one = m.composer(ids, chunk_items=len(ids))
    for chunk in (1, 5):
        torch.testing.assert_close(m.composer(ids, chunk_items=chunk), one, rtol=1e-4, atol=1e-5)


def test_the_latents_replace_exactly_the_placeholder_span(lopd_run):
    m = _method(lopd_run, n_latents=4, n_retrieve=1)
    comp = m.composer
    task = lopd_run.domain.tasks("train", 1)[0]
    tail = lopd_run.encoder.encode("> call") + [comp.latent_id]  # a sampled placeholder id is just a token
    ids, mask, start = comp.teacher_sequence(lopd_run.domain, task, 4, tail, [1] * len(tail))
    assert ids[start : start + 4] == [comp.latent_id] * 4 and ids[start - 1] != comp.latent_id
    x = torch.tensor([ids])
    attn = torch.ones_like(x)
    m_t = torch.tensor([mask[1:]], dtype=torch.float32)
    d = lopd_run.model.config.hidden_size
    lat_a, lat_b = torch.randn(4, d), torch.randn(4, d)
    a = comp.teacher_logits(x, attn, m_t, [lat_a], [start])
    b = comp.teacher_logits(x, attn, m_t, [lat_b], [start])
    assert not torch.allclose(a, b)  # the teacher reads the latents
    emb = comp.backbone.get_input_embeddings()(x).clone()
    emb[0, start : start + 4] = lat_a
    with torch.no_grad(), comp.model.disable_adapter():
        ref = comp.backbone(inputs_embeds=emb, attention_mask=attn).logits[0, :-1][m_t[0].bool()]
    torch.testing.assert_close(a, ref, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError):
        comp.teacher_logits(x, attn, m_t, [lat_a], [start + 1])


def test_a_tokenizer_without_the_placeholder_gets_it_as_an_added_special_token():
    """A pretrained model's tokenizer (SmolLM2's) has no ``<|latent|>``: the composer adds it to the
    tokenizer only, once, and it then encodes as one token (its id past the vocabulary)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from methods.core.tokenizer import LATENT
    from methods.lopd.composer import placeholder_id

    words = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[UNK]")
    assert tok.convert_tokens_to_ids(LATENT) == tok.unk_token_id  # not there: it reads as unknown
    tid = placeholder_id(tok)
    assert tid == 3 and len(tok) == 4
    assert tok.encode(f"hello {LATENT} world", add_special_tokens=False) == [1, 3, 2]
    assert placeholder_id(tok) == tid and len(tok) == 4  # idempotent


def test_a_placeholder_id_past_the_embedding_table_is_never_looked_up(lopd_run):
    """The teacher's forward replaces the placeholder span by the latents before the backbone runs, so
    a placeholder whose id lies past the embedding table (a pretrained tokenizer's added token)
    gives exactly the logits of one inside it."""
    m = _method(lopd_run, n_latents=4, n_retrieve=1)
    comp = m.composer
    task = lopd_run.domain.tasks("train", 1)[0]
    tail = lopd_run.encoder.encode("> call")
    ids, mask, start = comp.teacher_sequence(lopd_run.domain, task, 4, tail, [1] * len(tail))
    x = torch.tensor([ids])
    attn, m_t = torch.ones_like(x), torch.tensor([mask[1:]], dtype=torch.float32)
    lat = torch.randn(4, lopd_run.model.config.hidden_size)
    inside = comp.teacher_logits(x, attn, m_t, [lat], [start])
    past = comp.backbone.get_input_embeddings().num_embeddings + 7
    x_past = x.clone()
    x_past[0, start : start + 4] = past
    comp.latent_id = past
    torch.testing.assert_close(comp.teacher_logits(x_past, attn, m_t, [lat], [start]), inside, rtol=0, atol=0)


def test_a_composer_step_moves_phi_only(lopd_run):
    """After prepare -> student step -> composer step: LoRA and Q-Former changed, the teacher's
    backbone is bit-identical, and the composer loss never touched the student."""
    m = _method(lopd_run, n_latents=4, composer_lr=1e-2, beta_init=1.0)
    batch = _batch(lopd_run)
    backbone = {k: v.clone() for k, v in m.composer.backbone.state_dict().items() if "lora_" not in k}
    phi = {k: v.detach().clone() for k, v in m.composer.trainable_state().items()}
    student = {k: v.clone() for k, v in lopd_run.model.state_dict().items()}
    batch.extras["old_logp"] = batch.sample_logp
    logs = m.prepare(batch)
    assert logs["signal_share"] > 0 and "lopd_margin" in logs
    for p in lopd_run.model.parameters():
        p.grad = None
    out = m.after_step(batch)
    assert out["lopd_composer_loss"] == out["lopd_composer_loss"]  # finite
    assert all(p.grad is None for p in lopd_run.model.parameters())  # the composer loss never reached the student
    assert all(torch.equal(v, student[k]) for k, v in lopd_run.model.state_dict().items())
    now = m.composer.trainable_state()
    lora = [k for k in phi if "lora_" in k]
    qf = [k for k in phi if k.startswith("qformer.")]
    assert lora and qf
    assert any(not torch.equal(now[k], phi[k]) for k in lora), "no LoRA parameter moved"
    assert any(not torch.equal(now[k], phi[k]) for k in qf), "no Q-Former parameter moved"
    after = {k: v for k, v in m.composer.backbone.state_dict().items() if "lora_" not in k}
    assert set(after) == set(backbone) and all(torch.equal(after[k], backbone[k]) for k in backbone)
    assert out["lopd_beta"] == pytest.approx(max(0.0, 1.0 + 0.5 * (0.05 - logs["lopd_margin"])))


def test_frozen_composer_keeps_phi0(lopd_run):
    m = _method(lopd_run, n_latents=4, train_composer=False)
    phi = {k: v.detach().clone() for k, v in m.composer.trainable_state().items()}
    batch = _batch(lopd_run)
    batch.extras["old_logp"] = batch.sample_logp
    m.prepare(batch)
    out = m.after_step(batch)
    assert "lopd_composer_loss" not in out and out["lopd_beta"] == 0.0
    assert all(torch.equal(v, phi[k]) for k, v in m.composer.trainable_state().items())


def test_nothing_retrieved_means_no_signal_not_a_crash(lopd_run):
    lopd_run.bank_path = None  # an empty bank
    m = _method(lopd_run, n_latents=4)
    batch = _batch(lopd_run)
    batch.extras["old_logp"] = batch.sample_logp
    logs = m.prepare(batch)
    assert logs["signal_share"] == 0.0 and len(m.trainable_rows(batch)) == 0
    assert all(logs[k] is None for k in ("lopd_margin", "lopd_kl", "lopd_anchor"))  # fixed names, null values
    assert m.after_step(batch)["lopd_beta"] == 0.0


def test_state_dict_restores_phi_beta_and_bank(lopd_run):
    m = _method(lopd_run, n_latents=4, composer_lr=1e-2, beta_init=0.3)
    batch = _batch(lopd_run)
    batch.extras["old_logp"] = batch.sample_logp
    m.prepare(batch)
    m.after_step(batch)
    state = m.state_dict()
    fresh = _method(lopd_run, n_latents=4, composer_lr=1e-2)
    fresh.load_state_dict(state)
    assert fresh.beta == m.beta and len(fresh.bank) == len(m.bank)
    assert all(torch.equal(v, m.composer.trainable_state()[k]) for k, v in fresh.composer.trainable_state().items())


def test_cold_start_lowers_the_nll_of_its_training_successes(lopd_run, seeded_banks):
    from methods.experience import BankConfig, ExperienceBank
    from methods.experience.encoder import TextEncoder
    from methods.lopd.coldstart import cold_start
    from tasks.base import get_domain

    m = _method(lopd_run, n_latents=4)
    bank = ExperienceBank(BankConfig(), TextEncoder()).load(seeded_banks["tooluse"])
    cfg = LOPDConfig(n_latents=4, cold_start_steps=12, cold_start_lr=1e-2, cold_start_batch=8)
    rep = cold_start(cfg, m.composer, bank, get_domain("tooluse", seed=0), seed=0, log=lambda _: None)
    assert rep["examples"] == 40 and rep["heldout_examples"] == 8 and rep["steps"] == 12
    assert rep["train_logprob_after"] > rep["train_logprob_before"]
    assert set(rep["after"]) >= {"latent_gain", "text_gain"}


# --------------------------------------------------------------------------- variants in the config


def _config(**extra):
    from pathlib import Path

    import yaml

    cfg = yaml.safe_load((Path(__file__).resolve().parents[1] / "config" / "config.yaml").read_text())
    cfg.update(extra)
    return cfg


def test_ablation_variants_resolve_to_the_one_module_with_their_overrides():
    from methods.core.config import cold_start_key, cold_start_runs, resolve_job

    cfg = _config()
    job = resolve_job(cfg, "tooluse", "lopd_m0")
    assert job["method"] == "lopd" and job["run_name"] == "lopd_m0" and job["method_config"]["margin"] == 0.0
    assert (
        job["method_config"]["composer_lr"] == resolve_job(cfg, "tooluse", "lopd")["method_config"]["composer_lr"]
    )  # profile overrides reach variants
    assert "run_name" not in resolve_job(cfg, "tooluse", "grpo")  # Table 1's methods keep their job settings
    groups = cold_start_runs(cfg, "tooluse")
    key = cold_start_key(cfg, "tooluse", "lopd")
    assert key.startswith("K32_J3_")
    # variants that change nothing the cold start reads share LOPD's; the others get their own
    assert set(groups[key]) == {"lopd", "lopd_frozen", "lopd_m0", "lopd_m010", "lopd_successes_only"}
    assert cold_start_key(cfg, "tooluse", "lopd_noself") not in (None, key)
    assert cold_start_key(cfg, "tooluse", "lopd_text") is None  # the text control has no composer
    assert not any("lopd_text" in runs for runs in groups.values())


def test_changing_any_cold_start_field_changes_the_cold_start_key():
    """A variant that changes anything its cold start reads gets its own cold start (not a
    refusal, not another variant's file); the other fields leave the key alone."""
    from dataclasses import fields

    base = LOPDConfig()
    changed = {
        "n_latents": 16,
        "n_retrieve": 2,
        "fill_missing": "repeat",
        "qformer_layers": 3,
        "qformer_heads": 2,
        "lora_r": 4,
        "lora_alpha": 8,
        "max_item_tokens": 256,
        "allow_self_retrieval": False,
        "composer_weight_decay": 0.0,
        "cold_start_steps": 7,
        "cold_start_lr": 1e-4,
        "cold_start_batch": 4,
        "cold_start_holdout": 0.1,
    }
    assert set(changed) == set(LOPDConfig.cold_start_fields)
    keys = {LOPDConfig(**{f: v}).cold_start_key() for f, v in changed.items()}
    assert len(keys) == len(changed) and base.cold_start_key() not in keys
    others = [f.name for f in fields(LOPDConfig) if f.name not in LOPDConfig.cold_start_fields]
    assert "margin" in others and "distill_only_successes" in others
    assert LOPDConfig(margin=0.1, distill_only_successes=True).cold_start_key() == base.cold_start_key()


@pytest.mark.parametrize(
    "ablations, message",
    [
        ({"x": {"margin": 0.1}}, "must name the method"),
        ({"grpo": {"method": "lopd"}}, "already a method"),
        ({"x": {"method": "nope"}}, "nope"),
        ({"x": {"method": "lopd", "margin": -1}}, "margin"),
        ({"x": {"method": "lopd", "teacher_context": "image"}}, "teacher_context"),
    ],
)
def test_bad_ablation_entries_fail_validation(ablations, message):
    from methods.core.config import validate

    with pytest.raises((ValueError, KeyError), match=message):
        validate(_config(ablations=ablations))


def test_the_composer_kl_alone_moves_phi(lopd_run):
    """With β = 0 and λ = 0 the composer loss is L_distill only: its gradient must reach φ
    through the frozen teacher (a detached teacher would leave φ where it was)."""
    m = _method(lopd_run, n_latents=4, composer_lr=1e-2, beta_init=0.0, anchor_weight=0.0)
    batch = _batch(lopd_run)
    batch.extras["old_logp"] = batch.sample_logp
    m.prepare(batch)
    p = m._pending
    p["kl"].backward()
    grads = [q.grad for q in m.composer.trainable_state().values() if q.grad is not None]
    assert grads and sum(float(g.abs().sum()) for g in grads) > 0


def test_the_anchor_cache_is_bounded(lopd_run, monkeypatch):
    import methods.lopd.method as lm

    monkeypatch.setattr(lm, "ANCHOR_CACHE_ITEMS", 4)
    m = _method(lopd_run, n_latents=4, n_retrieve=3)
    tasks = lopd_run.domain.tasks("train", 200)[100:104]
    hits = m.retrieve(tasks)
    _, lat, anchor = m.compose(tasks, hits)
    torch.testing.assert_close(lat, anchor)  # computed before eviction, whatever the cap
    assert len(m._anchor) == 4
    last = [(t.task_id, e.task_id) for t, hs in zip(tasks, hits) for e in hs][-4:]
    assert list(m._anchor) == last  # the most recently used stay


def test_lopd_logs_its_teacher_context_gain_once_and_it_changes_nothing_it_trains_on(lopd_run):
    """The sanity check of every self-distillation method, with latents for the text context: the
    expert actions' log-likelihood under the frozen teacher with the composed latents minus without
    (checked against a direct computation), logged on the first step only; a run that skips it
    gets bit-identical teacher logits and margin terms."""
    from methods.core.rollout import initial_prompt_ids, trajectory_ids

    m = _method(lopd_run, n_latents=4)
    quiet = _method(lopd_run, n_latents=4)
    quiet._gain_logged = True
    batch = _batch(lopd_run)
    batch.extras["old_logp"] = batch.sample_logp
    logs = m.prepare(batch)
    teacher = [t.clone() if t is not None else None for t in batch.extras["teacher_logits"]]
    logs_quiet = quiet.prepare(batch)
    assert "teacher_context_gain" in logs and "teacher_context_gain" not in logs_quiet
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(teacher, batch.extras["teacher_logits"]))
    assert logs["lopd_margin"] == logs_quiet["lopd_margin"] and logs["lopd_kl"] == logs_quiet["lopd_kl"]
    assert logs["teacher_context_pairs"] == len({r.task.task_id for r in batch.rollouts})
    # a direct computation for the first task: latents in the placeholder span vs the plain prompt
    task = batch.rollouts[0].task
    lat, _, _ = m.compose([task], m.retrieve([task]))
    comp, dom, enc = m.composer, lopd_run.domain, lopd_run.encoder
    ids, mask = trajectory_ids(enc, dom, task, None, dom.expert_trajectory(task).turns)
    start = len(initial_prompt_ids(enc, dom, task, None))

    def logp(n):
        seq, msk, at = comp.teacher_sequence(dom, task, n, ids[start:], mask[start:])
        x = torch.tensor([seq])
        emb = comp.backbone.get_input_embeddings()(x).clone()
        if n:
            emb[0, at : at + n] = lat[0].detach()
        keep = torch.tensor(msk[1:]).bool()
        with torch.no_grad(), comp.model.disable_adapter():
            out = comp.backbone(inputs_embeds=emb, attention_mask=torch.ones_like(x)).logits[0, :-1][keep]
        return torch.log_softmax(out, -1).gather(-1, x[0, 1:][keep][:, None]).mean()

    one = m._latent_shift([(task, lat[0].detach(), ids[start:], mask[start:])])
    assert one == pytest.approx(float(logp(int(lat[0].shape[0])) - logp(0)), abs=1e-5)
    assert m.prepare(batch).get("teacher_context_gain") is None  # once per run


# --------------------------------------------------------------------------- the reference's recipe (issue 38)


def test_reward_zero_rollouts_are_distilled_and_the_old_filter_is_an_ablation(lopd_run):
    """Every rollout whose task retrieved something gets the teacher's signal, reward 0 included
    (the reference marks a rollout unsupervised only when its episode raised or retrieved
    nothing); ``distill_only_successes`` keeps the earlier reading, successes only."""
    batch = _batch(lopd_run)
    batch.extras["old_logp"] = batch.sample_logp
    batch.rewards[3:] = 0.0  # _batch made the first half successes
    zero = batch.rewards == 0
    m = _method(lopd_run, n_latents=4)
    m.prepare(batch)
    signal = batch.extras["teacher_signal"]
    assert bool(signal[zero].all()) and bool(signal.all())
    assert set(m.trainable_rows(batch).tolist()) == set(range(len(batch)))
    old = _method(lopd_run, n_latents=4, distill_only_successes=True)
    old.prepare(batch)
    assert batch.extras["teacher_signal"].tolist() == (batch.rewards >= 1.0).tolist()


def test_the_success_delta_is_null_without_a_scored_success(lopd_run):
    batch = _batch(lopd_run)
    batch.extras["old_logp"] = batch.sample_logp
    batch.rewards.zero_()
    logs = _method(lopd_run, n_latents=4).prepare(batch)
    assert logs["lopd_success_delta"] is None and isinstance(logs["lopd_failed_delta"], float)
    batch.rewards.fill_(1.0)
    logs = _method(lopd_run, n_latents=4).prepare(batch)
    assert logs["lopd_failed_delta"] is None and isinstance(logs["lopd_success_delta"], float)


def test_the_composer_reads_the_retrieved_task_and_its_trajectory(lopd_run):
    """Each item is "Task to solve:\\n{x}\\n\\nReference past trajectory:\\n{m_j}" with m_j the
    retrieved item's own task text and trace, as the reference serialises the whole retrieved
    conversation; the tokens the composer encodes are exactly those of that text."""
    m = _method(lopd_run, n_latents=4, n_retrieve=2)
    task = lopd_run.domain.tasks("train", 200)[100]
    hits = m.retrieve([task])[0]
    text = item_text(task.prompt, hits[0])
    assert text.startswith(f"Task to solve:\n{task.prompt.rstrip()}\n\nReference past trajectory:\n")
    assert hits[0].task_text in text and hits[0].trace in text and hits[0].task_text != task.prompt
    _, _, ids = m.composer.compose([task.prompt], [hits])
    assert ids[0] == m.composer.encoder.encode(text)[: m.cfg.max_item_tokens]


def test_a_self_retrieving_cold_start_uses_its_own_items_and_its_held_out_check_does_not(lopd_run, seeded_banks):
    from methods.experience import BankConfig, ExperienceBank
    from methods.experience.encoder import TextEncoder
    from methods.lopd.coldstart import examples_from_bank
    from tasks.base import get_domain

    domain = get_domain("tooluse", seed=0)
    bank = ExperienceBank(BankConfig(), TextEncoder()).load(seeded_banks["tooluse"])
    enc = lopd_run.encoder
    own = lambda ex: any(h.task_id == ex.task.task_id for h in ex.hits)  # noqa: E731
    train, held = examples_from_bank(bank, domain, enc, LOPDConfig(), seed=0)
    assert len(train) == 32 and len(held) == 8
    assert all(own(ex) for ex in train)  # the bank's own success of each is among its top-J
    assert not any(own(ex) for ex in held)
    train_off, held_off = examples_from_bank(bank, domain, enc, LOPDConfig(allow_self_retrieval=False), seed=0)
    assert not any(own(ex) for ex in train_off + held_off)
    assert [ex.task.task_id for ex in held_off] == [ex.task.task_id for ex in held]  # the same split either way


def test_the_text_control_hands_the_same_items_to_the_frozen_teacher_as_text(lopd_run):
    """``teacher_context: text``: no composer, no cold start, no composer step; the same rows as
    LOPD distilled, with the frozen teacher's logits under the retrieved items as text."""
    from methods.retrieval_rl import render_experience

    cfg = LOPDConfig(n_latents=4, teacher_context="text")
    assert cfg.cold_start_key() is None
    lopd_run.cold_start_path = None
    m = _method(lopd_run, n_latents=4, teacher_context="text")
    assert m.composer is None and m.optimizer is None
    batch = _batch(lopd_run)
    batch.extras["old_logp"] = batch.sample_logp
    logs = m.prepare(batch)
    # every rollout is distilled, but for those whose text context outgrows the tiny model's positions
    scored = [t is not None for t in batch.extras["teacher_logits"]]
    assert batch.extras["teacher_signal"].tolist() == scored and any(scored)
    assert logs["lopd_kl"] is None and logs["lopd_anchor"] is None
    assert isinstance(logs["lopd_margin"], float) and "teacher_context_gain" in logs
    hits = m.retrieve([r.task for r in batch.rollouts])
    want = m.teacher.score(batch.rollouts, [render_experience(h) for h in hits], lopd_run.train_cfg.temperature)
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(batch.extras["teacher_logits"], want))
    out = m.after_step(batch)
    assert "lopd_composer_loss" not in out and out["lopd_beta"] is None
    fresh = _method(lopd_run, n_latents=4, teacher_context="text")
    fresh.load_state_dict(m.state_dict())


def test_the_last_step_logs_where_the_teacher_ends_against_the_student(lopd_run):
    m = _method(lopd_run, n_latents=4)
    batch = _batch(lopd_run)
    batch.extras["old_logp"] = batch.sample_logp
    m.prepare(batch)
    assert "teacher_minus_student_expert" not in m.after_step(batch)  # budget left: not the last step
    lopd_run.ledger.add_rollouts(["x"] * lopd_run.ledger.remaining, 0)
    m.prepare(batch)
    gap = m.after_step(batch)["teacher_minus_student_expert"]
    tasks = [r.task for r in batch.rollouts]
    assert gap == pytest.approx(m.expert_gap(tasks, m.retrieve(tasks)), abs=1e-6)


@pytest.mark.slow  # two cold starts (about 25 s on an idle core)
def test_the_gains_after_s_steps_of_a_longer_cold_start_are_those_of_an_s_step_one(lopd_run, seeded_banks):
    """What ``benchmarks/probes/coldstart_length.py`` relies on: one long cold start measured at several
    lengths gives each length's numbers.  Only the latents' gain moves with φ."""
    from methods.experience import BankConfig, ExperienceBank
    from methods.experience.encoder import TextEncoder
    from methods.lopd.coldstart import cold_start
    from methods.lopd.method import build_composer
    from tasks.base import get_domain

    bank = ExperienceBank(BankConfig(), TextEncoder()).load(seeded_banks["tooluse"])
    domain = get_domain("tooluse", seed=0)

    def run(steps, eval_at=()):
        cfg = LOPDConfig(n_latents=4, cold_start_steps=steps, cold_start_lr=1e-2, cold_start_batch=8)
        comp = build_composer(cfg, lopd_run.model, lopd_run.encoder, seed=0)
        return cold_start(cfg, comp, bank, domain, seed=0, log=lambda _: None, eval_at=eval_at)

    long, short = run(6, eval_at={3}), run(3)
    assert [c["step"] for c in long["curve"]] == [3]
    assert long["curve"][0]["latent_gain"] == pytest.approx(short["after"]["latent_gain"], abs=1e-6)
    assert long["after"]["latent_gain"] != long["before"]["latent_gain"]
    for k in ("text_gain", "solution_gain", "random_gain", "expert_text_gain", "expert_solution_gain"):
        assert long["before"][k] == long["after"][k] == short["after"][k]  # none of these depends on φ
    assert long["after"]["expert_solution_gain"] > 0  # the task's own solution helps the expert's actions

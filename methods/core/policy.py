"""The policy: a ``transformers`` causal LM built from a config, or any local checkpoint.

``build_policy`` makes the small profile's model (Qwen2 family, a few layers, a
small width) for a given tokenizer; ``load_policy`` loads any local
``save_pretrained`` directory, which is how a real model (e.g. Qwen3-4B on a
GPU machine) enters the same pipeline.  Nothing here downloads.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from .settings import ModelConfig


def build_policy(cfg: ModelConfig, tokenizer, seed: int) -> Qwen2ForCausalLM:
    """A freshly initialised Qwen2 causal LM sized by ``cfg`` for ``tokenizer``."""
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        max_position_embeddings=cfg.max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return model


def resolve_device(spec: str = "auto") -> tuple[torch.device, torch.dtype]:
    """The device and dtype a job runs in: ``auto`` is CUDA with bf16 where a GPU is present, else CPU
    with fp32; ``cpu``, ``cuda`` or ``cuda:N`` pick the device (fp32 on CPU, bf16 on CUDA)."""
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(spec)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {spec!r} asked for, but torch sees no CUDA device here")
    return device, (torch.bfloat16 if device.type == "cuda" else torch.float32)


def load_policy(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None):
    """Load model and tokenizer from a local ``save_pretrained`` directory."""
    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"no model checkpoint at {path} (expected {path / 'config.json'})")
    tokenizer = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype or torch.float32)
    return model.to(device), tokenizer  # type: ignore[arg-type]  # transformers types .to() by a decorator


def load_tokenizer(path: str | Path):
    """The tokenizer saved at ``path``, exactly as it was trained.

    ``AutoTokenizer`` resolves the class from the *model's* config: for a Qwen2
    model it builds ``Qwen2Tokenizer``, which replaces the saved pre-tokenizer
    with Qwen's regex and adds an NFC normalizer, so a locally trained
    tokenizer would split text differently after a save/load round trip (it
    did: code indentation changed tokens, and every train job read its warm
    start with other ids than it was trained on).  A tokenizer saved from a
    plain ``tokenizers`` object (class ``TokenizersBackend`` or
    ``PreTrainedTokenizerFast``) is therefore loaded as such; a real
    checkpoint that names its own class (``Qwen2Tokenizer``, ...) goes through
    ``AutoTokenizer``.
    """
    import json

    path = Path(path)
    cfg_file = path / "tokenizer_config.json"
    cls = json.loads(cfg_file.read_text()).get("tokenizer_class") if cfg_file.exists() else None
    if cls in ("TokenizersBackend", "PreTrainedTokenizerFast") and (path / "tokenizer.json").exists():
        tokenizer = PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True)
    else:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    tokenizer.padding_side = "left"
    return tokenizer


def save_policy(model, tokenizer, path: str | Path) -> None:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())

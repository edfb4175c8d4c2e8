"""A stand-in for Faiss's exact inner-product index (``IndexFlatIP``), for ``gpu_check.py`` on a
host where faiss is not installed (its wheel is too large to carry beside the others).

Only what the engine's flat index uses: ``IndexFlatIP(dim)``, ``add``, ``search`` and
``ntotal``; no GPU index (``get_num_gpus()`` is 0), so the engine keeps it on the CPU as it
keeps a Faiss index where faiss-gpu is missing. Exact, like the index it stands for; its speed
is numpy's, not Faiss's. Never on the path of anything but ``gpu_check.py``'s job runs.
"""

from __future__ import annotations

import numpy as np

METRIC_INNER_PRODUCT = 0


class IndexFlatIP:
    def __init__(self, dim: int):
        self.d = dim
        self._rows = np.zeros((0, dim), np.float32)

    @property
    def ntotal(self) -> int:
        return len(self._rows)

    def add(self, x) -> None:
        self._rows = np.concatenate([self._rows, np.ascontiguousarray(x, np.float32)])

    def search(self, queries, k: int, chunk: int = 4096):
        queries = np.ascontiguousarray(queries, np.float32)
        k = min(k, self.ntotal)
        scores = np.empty((len(queries), k), np.float32)
        ids = np.empty((len(queries), k), np.int64)
        for at in range(0, len(queries), chunk):
            sims = queries[at:at + chunk] @ self._rows.T
            top = np.argpartition(-sims, k - 1, axis=1)[:, :k] if k < sims.shape[1] else \
                np.tile(np.arange(sims.shape[1]), (len(sims), 1))
            part = np.take_along_axis(sims, top, axis=1)
            order = np.argsort(-part, axis=1, kind="stable")
            ids[at:at + chunk] = np.take_along_axis(top, order, axis=1)
            scores[at:at + chunk] = np.take_along_axis(part, order, axis=1)
        return scores, ids


class IndexHNSW:  # never built here; the engine only tests against it
    pass


def get_num_gpus() -> int:
    return 0

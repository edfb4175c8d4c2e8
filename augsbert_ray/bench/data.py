"""Sentences for the benchmarks: the STS benchmark's where it is found, else synthetic ones.

The STS benchmark (``<data dir>/stsb/sts-{train,dev,test}.csv``, where the shipped jobs
read it, see ``data_dir``) gives real sentence lengths and words; without it, sentences
are random word sequences of similar lengths (5 to 24 words), which is enough for speed.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def data_dir(given: str | os.PathLike | None = None) -> Path:
    """``given``, else the first folder the shipped jobs read from that holds the STS benchmark
    (``data_fetch.default_roots``: ``AUGSBERT_DATA_DIR``, else ``~/.cache/augsbert-ray/data``,
    ``../shared/data``), else the first of them."""
    from augsbert_ray.data_fetch import default_roots

    if given:
        return Path(given)
    roots = default_roots()
    return next((r for r in roots if has_stsb(r)), roots[0])


def has_stsb(where: Path) -> bool:
    return all((where / "stsb" / f"sts-{s}.csv").exists() for s in ("train", "dev", "test"))


def _stsb(where: Path, split: str):
    from augsbert_ray.loaders import load_pairs
    from augsbert_ray.sources import DataSource

    return load_pairs(DataSource(format="stsb", path=str(where / "stsb" / f"sts-{split}.csv")), split).table


def synthetic_sentences(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct random sentences of 5 to 24 words from a 5,000-word vocabulary."""
    rng = np.random.default_rng(seed)
    words = np.array([f"w{i}" for i in range(5000)])
    lengths = rng.integers(5, 25, size=n)
    picks = words[rng.integers(0, len(words), size=int(lengths.sum()))]
    out, start = [], 0
    for i, k in enumerate(lengths):
        out.append(" ".join(picks[start:start + k]) + f" s{i}")  # the suffix keeps them distinct
        start += k
    return out


def sentence_pairs(where: Path, n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """``n`` pairs: the STS benchmark's dev and test pairs cycled, each copy after the first
    marked with its copy number (so no copy repeats a sentence of another: the engine
    tokenises each distinct sentence once, and copies would flatter it); without the benchmark,
    synthetic sentences."""
    if not has_stsb(where):
        s = synthetic_sentences(2 * n, seed)
        return s[:n], s[n:]
    import pyarrow as pa

    t = pa.concat_tables([_stsb(where, s) for s in ("dev", "test")])
    s1, s2 = t.column("sentence1").to_pylist(), t.column("sentence2").to_pylist()
    reps = -(-n // len(s1))
    mark = lambda s, r: s if r == 0 else f"{s} #{r}"  # noqa: E731
    return ([mark(x, r) for r in range(reps) for x in s1][:n], [mark(x, r) for r in range(reps) for x in s2][:n])


def unique_sentences(where: Path, scale: int = 1, limit: int | None = None) -> list[str]:
    """The STS benchmark's distinct sentences (train, dev and test, first-seen order), ``scale``
    times with a numeric suffix per copy (so every copy is a distinct sentence), at most
    ``limit``; synthetic sentences where the benchmark is absent (``limit`` or 15,000 of them)."""
    if not has_stsb(where):
        return synthetic_sentences(limit or 15_000)
    seen: dict[str, None] = {}
    for split in ("train", "dev", "test"):
        t = _stsb(where, split)
        for col in ("sentence1", "sentence2"):
            seen.update(dict.fromkeys(t.column(col).to_pylist()))
    base = list(seen)
    out = base if scale == 1 else [f"{s} v{i}" for i in range(scale) for s in base]
    return out[:limit] if limit else out

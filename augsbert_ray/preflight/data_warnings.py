"""What a job allows but its user likely did not mean: warned about before Ray starts, not refused.

- ``sampling.top_k`` at or past the distinct training sentences (every pair gets sampled);
- many identical gold training pairs (a file concatenated twice, a join gone wrong);
- dev or test pairs that are also training pairs (a dev path pointing at the training file).
"""

from __future__ import annotations

import pyarrow as pa

from augsbert_ray import schema
from augsbert_ray.config import JobConfig

TOP_K_STRATEGIES = ("bm25", "ss", "bm25+ss")
DUPLICATE_SHARE = 0.1  # identical training pairs worth a warning (and at least 2 of them)
OVERLAP_SHARE = 0.5  # dev or test pairs that are also training pairs, worth a warning


def data_warnings(cfg: JobConfig, gold: dict[str, pa.Table]) -> list[str]:
    """What a job allows but a user likely did not mean: ``sampling.top_k`` past the sentences
    there are, many identical gold training pairs, dev or test pairs that are training pairs.

    Args:
        cfg: the job; gold: its train, dev and test splits as the job uses them.

    Returns:
        One line per warning, naming the key or the file.
    """
    out = []
    pairs = {split: list(zip(t.column(schema.SENTENCE1).to_pylist(), t.column(schema.SENTENCE2).to_pylist()))
             for split, t in gold.items()}
    train = pairs["train"]
    if cfg.target is None and cfg.sampling.strategy in TOP_K_STRATEGIES:
        sentences = len({s for pair in train for s in pair})
        if cfg.sampling.top_k >= sentences:
            out.append(f"sampling.top_k={cfg.sampling.top_k} is not below the {sentences} distinct training sentences: "
                       f"each sentence can have at most {sentences - 1} neighbours, so this samples every pair there is")
    repeats = len(train) - len(set(train))
    if repeats >= 2 and repeats >= DUPLICATE_SHARE * len(train):
        out.append(f"{cfg.data.train.path}: {repeats} of the {len(train)} gold training pairs repeat an earlier pair "
                   "(the same two sentences): they weigh those pairs more in training")
    seen = set(train)
    for split in ("dev", "test"):
        shared = sum(pair in seen for pair in pairs[split])
        if pairs[split] and shared >= OVERLAP_SHARE * len(pairs[split]):
            where = getattr(cfg.data, split).path if getattr(cfg.data, split) is not None else "the carved dev split"
            out.append(f"{where}: {shared} of the {len(pairs[split])} data.{split} pairs are also training pairs "
                       f"({cfg.data.train.path}): scores on {split} will overstate how well the models generalise")
    return out

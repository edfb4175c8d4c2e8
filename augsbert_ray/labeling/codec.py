"""Token columns of a Ray Data batch: pairs tokenised in CPU tasks travel to the scoring
actors as Arrow list columns, so a GPU actor only pads and runs the model."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa

from augsbert_ray import schema
from augsbert_ray.scoring import TokenizedPairs, tokenize_pairs

IDS, TYPES, OFFSETS = "_input_ids", "_token_type_ids", "_n_tokens"  # a tokenised batch's columns


def tokens_to_arrow(tokens: TokenizedPairs) -> dict[str, pa.Array]:
    """A batch's token ids (and type ids, where the model has them) as list columns."""
    cols = {IDS: pa.ListArray.from_arrays(pa.array(tokens.offsets.astype(np.int32)), pa.array(tokens.ids))}
    if tokens.type_ids is not None:
        cols[TYPES] = pa.ListArray.from_arrays(pa.array(tokens.offsets.astype(np.int32)), pa.array(tokens.type_ids))
    return cols


def tokens_from_arrow(batch: pa.Table) -> TokenizedPairs:
    """The inverse of ``tokens_to_arrow``, for a batch that may be a slice of a larger one."""
    ids = batch.column(IDS).combine_chunks()
    offsets = ids.offsets.to_numpy().astype(np.int64)
    base = offsets[0]
    types = None
    if TYPES in batch.column_names:
        t = batch.column(TYPES).combine_chunks()
        t_offsets = t.offsets.to_numpy()  # a sliced list array keeps its own offsets
        types = t.values.to_numpy()[t_offsets[0]:t_offsets[-1]]
    return TokenizedPairs(ids.values.to_numpy()[base:offsets[-1]], types, offsets - base)


_TOKENIZERS: dict = {}


def tokenize_batch(batch: pa.Table, model_dir, max_length: int) -> pa.Table:
    """Ray Data CPU stage ahead of the labelling actors: adds the pairs' token columns."""
    from transformers import AutoTokenizer

    from augsbert_ray.models import resolve_model, trust_remote_code

    key = (str(model_dir), max_length)
    if key not in _TOKENIZERS:
        # This task holds one CPU: the Rust tokenizer's thread pool (made on first use) gets one thread.
        os.environ.setdefault("RAYON_NUM_THREADS", "1")
        _TOKENIZERS[key] = AutoTokenizer.from_pretrained(resolve_model(model_dir), trust_remote_code=trust_remote_code())
    tokens = tokenize_pairs(_TOKENIZERS[key], batch.column(schema.SENTENCE1).to_pylist(),
                            batch.column(schema.SENTENCE2).to_pylist(), max_length)
    for name, col in tokens_to_arrow(tokens).items():
        batch = batch.append_column(name, col)
    return batch

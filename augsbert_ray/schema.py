"""The one data contract between stages: column names and Arrow schemas.

Every stage reads and writes Parquet with one of these schemas, so any artifact in a
run directory can be opened with ``pyarrow.parquet.read_table`` and inspected, and a
stage never has to guess what the previous one produced.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

# Gold (labelled) pairs, whatever file they came from.
SENTENCE1 = "sentence1"
SENTENCE2 = "sentence2"
LABEL = "label"  # float in [0, 1]: scaled similarity, or 0/1 for binary tasks
SPLIT = "split"  # "train" | "dev" | "test"
SOURCE = "source"  # file path or hub id the row came from
LINE = "line"  # 1-based physical line in the file (row index + 1 for Parquet / hub)
GENRE = "genre"  # optional sub-domain (the STS benchmark's genre column); null otherwise

PAIR_SCHEMA = pa.schema(
    [
        pa.field(SENTENCE1, pa.string(), nullable=False),
        pa.field(SENTENCE2, pa.string(), nullable=False),
        pa.field(LABEL, pa.float32(), nullable=False),
        pa.field(SPLIT, pa.string(), nullable=False),
        pa.field(SOURCE, pa.string(), nullable=False),
        pa.field(LINE, pa.int64(), nullable=False),
        pa.field(GENRE, pa.string(), nullable=True),
    ]
)

# Candidate (unlabelled) pairs produced by a sampler. ``id1 < id2`` always holds: ids
# index the job's table of unique sentences, and the order-free key makes dedupe exact.
ID1 = "id1"
ID2 = "id2"
ORIGIN = "origin"  # which sampler proposed the pair: "bm25", "ss", "rs", "kde", ...
RETRIEVAL_SCORE = "retrieval_score"  # the sampler's own score (BM25, cosine); NaN for RS

CANDIDATE_SCHEMA = pa.schema(
    [
        pa.field(ID1, pa.int64(), nullable=False),
        pa.field(ID2, pa.int64(), nullable=False),
        pa.field(SENTENCE1, pa.string(), nullable=False),
        pa.field(SENTENCE2, pa.string(), nullable=False),
        pa.field(ORIGIN, pa.string(), nullable=False),
        pa.field(RETRIEVAL_SCORE, pa.float32(), nullable=False),
    ]
)

# Candidates as samplers hand them over in memory: the same columns with the texts as
# dictionary columns whose indices are the ids, so the texts are held once (in the sentence
# table) however many pairs there are. Written to Parquet as ``CANDIDATE_SCHEMA``.
CANDIDATE_MEMORY_SCHEMA = pa.schema(
    [f.with_type(pa.dictionary(pa.int64(), pa.string())) if f.name in (SENTENCE1, SENTENCE2) else f
     for f in CANDIDATE_SCHEMA]
)

# Silver pairs: candidates with the cross-encoder's score as their label.
SILVER_SCHEMA = pa.schema(list(CANDIDATE_SCHEMA) + [pa.field(LABEL, pa.float32(), nullable=False)])

# Raw retrieval hits, before the pair rules (``candidates.pairs.finalize_candidates``) apply:
# a query sentence, a sentence it found, and the retriever's score.
HITS_SCHEMA = pa.schema([("query_id", pa.int64()), ("hit_id", pa.int64()), ("score", pa.float32())])

# Unique sentences of a job, the universe that samplers draw pairs from.
SENTENCE_ID = "sentence_id"
TEXT = "text"
SENTENCE_SCHEMA = pa.schema(
    [pa.field(SENTENCE_ID, pa.int64(), nullable=False), pa.field(TEXT, pa.string(), nullable=False)]
)


def decoded(s: pa.Schema) -> pa.Schema:
    """``s`` with every dictionary column given its value type (what a cast to it decodes)."""
    return pa.schema([f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f for f in s])


def conforms(table: pa.Table, expected: pa.Schema) -> bool:
    """True if ``table`` has ``expected``'s columns and types, a dictionary column counting as
    its value type (so an in-memory candidate table conforms to ``CANDIDATE_SCHEMA``)."""
    return table.column_names == expected.names and all(
        f.type == expected.field(f.name).type for f in decoded(table.schema))


def empty_table(schema: pa.Schema) -> pa.Table:
    """Returns a zero-row table of ``schema`` (so empty stages still write valid Parquet)."""
    return schema.empty_table()


# The columns a training or scoring step reads from any pair table.
PAIR_COLUMNS = [SENTENCE1, SENTENCE2, LABEL]


# A student's training set marks which pairs the teacher labelled, so an objective that treats
# silver pairs apart from gold ones (score distillation) is told, not left to guess.
IS_SILVER = "is_silver"
TRAINING_COLUMNS = PAIR_COLUMNS + [IS_SILVER]


def training_columns(table: pa.Table) -> list[str]:
    """The columns a training step reads from ``table``: the pair columns, and ``IS_SILVER``
    where the table has it (a student's training set)."""
    return TRAINING_COLUMNS if IS_SILVER in table.column_names else PAIR_COLUMNS


def silver_flags(table: pa.Table) -> np.ndarray | None:
    """Per row, whether the teacher labelled it; None for a table that does not say (gold
    pairs alone, as a teacher trains on)."""
    if IS_SILVER not in table.column_names:
        return None
    return table.column(IS_SILVER).to_numpy(zero_copy_only=False).astype(bool)


def pair_lists(table: pa.Table) -> tuple[list[str], list[str], np.ndarray]:
    """A pair table's first sentences, second sentences and labels, as a training loop takes them."""
    return (table.column(SENTENCE1).to_pylist(), table.column(SENTENCE2).to_pylist(),
            table.column(LABEL).to_numpy())

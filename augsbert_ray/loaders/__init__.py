"""Gold pair loaders: any supported source in, one ``PAIR_SCHEMA`` table out.

Each format is a small reader that finds a row's raw values; the checks every row must
pass (finite label in range, non-empty sentences) live once, in :mod:`.rows`.

Example:
    >>> from augsbert_ray.sources import DataSource
    >>> result = load_pairs(DataSource(format="stsb", path="sts-dev.csv"), "dev")  # doctest: +SKIP
    >>> result.table.num_rows, result.rows_read, result.skipped  # doctest: +SKIP
    (1500, 1500, [])
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Literal

import pyarrow as pa

from augsbert_ray import schema
from augsbert_ray.errors import DataError
from augsbert_ray.loaders import hub, mrpc, stsb, tabular
from augsbert_ray.loaders.rows import BadRow, LoadResult, RawRow, SkippedRow, collect
from augsbert_ray.sources import DataSource, genre_key

Reader = Callable[[DataSource], Iterator[RawRow | BadRow]]

READERS: dict[str, Reader] = {
    "stsb": stsb.read,
    "mrpc": mrpc.read,
    "csv": tabular.read_csv,
    "tsv": tabular.read_tsv,
    "jsonl": tabular.read_jsonl,
    "parquet": tabular.read_parquet,
    "hf": hub.read,
}

__all__ = ["READERS", "LoadResult", "SkippedRow", "get_reader", "load_pairs"]


def get_reader(name: str) -> Reader:
    """Returns the reader of format ``name``.

    Raises:
        ValueError: ``name`` is not a known format; the message lists the valid ones.
    """
    try:
        return READERS[name]
    except KeyError:
        raise ValueError(f"unknown format {name!r}; valid formats: {', '.join(READERS)}") from None


def load_pairs(
    source: DataSource,
    split: str,
    *,
    binary: bool = False,
    on_bad_rows: Literal["error", "skip"] = "error",
) -> LoadResult:
    """Reads gold pairs from ``source``, checks every row and scales labels to [0, 1].

    Args:
        source: the file (or hub dataset), its format, column map and raw label range.
        split: written to every row's ``split`` column ("train", "dev" or "test").
        binary: the task is binary: a scaled label other than exactly 0 or 1 is a bad row.
        on_bad_rows: ``"error"`` raises at the first bad row; ``"skip"`` leaves it out and
            lists it in ``LoadResult.skipped``. No row is ever dropped without a trace.

    Returns:
        the good rows as a ``PAIR_SCHEMA`` table in file order, the number of data rows
        read, and the skipped rows.

    Raises:
        DataError: a bad row under ``on_bad_rows="error"``, or a problem with the whole
            source (unreadable file, missing column, wrong header) under either mode.
        ValueError: an unknown format or ``on_bad_rows`` value.
    """
    result = collect(
        get_reader(source.format)(source),
        path=source.path,
        split=split,
        label_range=source.resolved_label_range,
        binary=binary,
        on_bad_rows=on_bad_rows,
        labelled=source.labelled,
    )
    if source.genres is None:
        return result
    wanted = {genre_key(g) for g in source.genres}
    genres = result.table.column(schema.GENRE).to_pylist()
    if all(g is None for g in genres):
        raise DataError(source.path, None, schema.GENRE, "genres are selected but the source has no genre column")
    keep = pa.array([g is not None and genre_key(g) in wanted for g in genres])
    table = result.table.filter(keep)
    return LoadResult(table, result.rows_read, result.skipped, result.table.num_rows - table.num_rows)

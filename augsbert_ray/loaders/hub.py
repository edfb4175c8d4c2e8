"""Hugging Face hub datasets (format ``hf``), read through ``columns`` like generic files.

``datasets`` is imported only here and only when used: it is heavy, and most jobs read
local files.
"""

from __future__ import annotations

from collections.abc import Iterator

from augsbert_ray.errors import DataError
from augsbert_ray.loaders.mapping import map_record, require_columns, required_columns
from augsbert_ray.loaders.rows import BadRow, RawRow
from augsbert_ray.sources import DataSource


def read(source: DataSource) -> Iterator[RawRow | BadRow]:
    """Loads ``load_dataset(path, hf_config, split=hf_split)``; a row's ``line`` is its index + 1.

    Raises:
        DataError: ``datasets`` is not installed, ``hf_split`` is not set, or a mapped
            column is missing from the dataset.
    """
    try:
        import datasets
    except ImportError:
        reason = "the 'datasets' package is needed for format 'hf': pip install \"augsbert-ray[hub]\""
        raise DataError(source.path, None, None, reason) from None
    if source.hf_split is None:
        # Without a split load_dataset returns every split at once, not rows.
        reason = "format 'hf' needs hf_split (e.g. 'validation')"
        raise DataError(source.path, None, "hf_split", reason)
    dataset = datasets.load_dataset(source.path, source.hf_config, split=source.hf_split)
    require_columns(source.path, dataset.column_names, source.columns, line=None)
    dataset = dataset.select_columns(required_columns(source.columns))
    for number, record in enumerate(dataset, start=1):
        yield map_record(number, record, source.columns)

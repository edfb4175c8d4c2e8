"""The STS benchmark's original files (``sts-train.csv``, ``sts-dev.csv``, ``sts-test.csv``).

Tab-separated, no header, no quoting, scores 0-5. Train has CRLF endings, dev and test LF.
Lines from the news genre carry two extra fields naming their source (e.g. "Europe Media
Monitor"); only the first seven fields are read.

Reference: Cer et al. 2017, "SemEval-2017 Task 1: Semantic Textual Similarity", and the
``readme.txt`` shipped with the files.
"""

from __future__ import annotations

from collections.abc import Iterator

from augsbert_ray.loaders.lines import tab_rows
from augsbert_ray.loaders.rows import BadRow, RawRow
from augsbert_ray.sources import DataSource

FIELDS = ("genre", "file", "year", "id", "score", "sentence1", "sentence2")


def read(source: DataSource) -> Iterator[RawRow | BadRow]:
    """Yields one raw row per line of an STSb file.

    The genre is kept verbatim: note that train spells "main-forum" where dev and test
    spell "main-forums".
    """
    for row in tab_rows(source.path, FIELDS, extra_ok=True):
        if isinstance(row, BadRow):
            yield row
            continue
        number, (genre, _file, _year, _id, score, sentence1, sentence2) = row
        yield RawRow(number, sentence1, sentence2, score, genre)

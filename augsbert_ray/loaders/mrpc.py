"""The Microsoft Research Paraphrase Corpus's original files (``msr_paraphrase_*.txt``).

UTF-8 with a BOM, CRLF endings, one header line, tab-separated, no quoting; ``Quality``
is 1 for a paraphrase and 0 otherwise.

Every line is accounted for: the header is checked (never taken as data) and every other
non-blank line is a row or a bad row. The shipped ``msr_paraphrase_train.txt`` has 4,080
data lines where the corpus has 4,076 pairs: lines 4078-4081 are four made-up pairs
("I like green apples.") with sentence ids ``-1``. Rows must carry the corpus's numeric
sentence ids, so those four are bad rows: loading that file needs ``on_bad_rows="skip"``
(4,076 rows, 4 skipped), or fails loudly at line 4078. The test file has its 1,725 pairs.

Reference: Dolan & Brockett 2005, "Automatically Constructing a Corpus of Sentential
Paraphrases".
"""

from __future__ import annotations

from collections.abc import Iterator

from augsbert_ray.loaders.lines import tab_rows
from augsbert_ray.loaders.rows import BadRow, RawRow
from augsbert_ray.sources import DataSource

HEADER = ("Quality", "#1 ID", "#2 ID", "#1 String", "#2 String")


def read(source: DataSource) -> Iterator[RawRow | BadRow]:
    """Yields one raw row per data line of an MRPC file."""
    for row in tab_rows(source.path, HEADER, header=True):
        if isinstance(row, BadRow):
            yield row
            continue
        number, (quality, id1, id2, sentence1, sentence2) = row
        bad_ids = [(name, v) for name, v in zip(HEADER[1:3], (id1, id2)) if not _is_id(v)]
        if bad_ids:
            name, value = bad_ids[0]
            yield BadRow(number, name, f"not a corpus sentence id: {value!r}")
            continue
        yield RawRow(number, sentence1, sentence2, quality)


def _is_id(value: str) -> bool:
    return value.isascii() and value.isdigit()

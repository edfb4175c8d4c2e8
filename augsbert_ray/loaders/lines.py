"""Physical lines of a text file, decoded one at a time so a bad byte names its line.

Decoding the whole file at once would report an invalid byte as an offset into the file;
decoding per line lets the error say ``file:line``, and lets ``on_bad_rows="skip"`` drop
just that line.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from augsbert_ray.errors import DataError
from augsbert_ray.loaders.rows import BadRow

_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class Line:
    """One physical line, without its line ending.

    Attributes:
        number: 1-based line number in the file.
        text: the decoded line (invalid bytes replaced by U+FFFD when ``error`` is set).
        error: why the line is not valid UTF-8, or None.
    """

    number: int
    text: str
    error: str | None = None


def read_lines(path: str) -> Iterator[Line]:
    """Yields every physical line of ``path``; LF or CRLF endings, an optional UTF-8 BOM.

    Blank lines are yielded too: whether they matter is the format's business (a blank
    line may sit inside a quoted CSV field).

    Raises:
        DataError: the file cannot be read.
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise DataError(path, None, None, f"cannot read file: {e.strerror or e}") from None
    if data.startswith(_BOM):  # MRPC's files open with one
        data = data[len(_BOM) :]
    chunks = data.split(b"\n")
    if chunks[-1] == b"":  # the final newline ends the last line; it does not start one
        chunks.pop()
    for number, raw in enumerate(chunks, start=1):
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        try:
            yield Line(number, raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            reason = f"invalid UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start})"
            yield Line(number, raw.decode("utf-8", errors="replace"), reason)


def tab_rows(
    path: str, names: Sequence[str], *, header: bool = False, extra_ok: bool = False
) -> Iterator[tuple[int, list[str]] | BadRow]:
    """Splits each line of a tab-separated file that has no quoting into its fields.

    The original STSb and MRPC files quote nothing and their sentences hold quote
    characters, so the csv module would join or split rows wrongly; a plain split on tabs
    is the faithful reading.

    Args:
        path: the file.
        names: the fields of a row, in order; bad rows name the first missing one.
        header: the first line must be exactly ``names`` joined by tabs.
        extra_ok: accept (and drop) fields after ``names``; otherwise such a row is bad.

    Returns:
        ``(line number, fields)`` per row, or a :class:`BadRow`. Blank lines are not rows;
        a line holding a lone CR (mixed line endings) is a bad row.

    Raises:
        DataError: the file is empty, or the header is not the expected one (so no data
            row is taken for it).
    """
    lines = read_lines(path)
    if header:
        first = next(lines, None)
        if first is None:
            raise DataError(path, None, None, "empty file: a header row is needed")
        found = first.text.split("\t")
        if found != list(names):
            raise DataError(path, 1, None, f"expected header {list(names)}, found {found}")
    need = len(names)
    for line in lines:
        fields = line.text.split("\t")
        if line.error:
            yield BadRow(line.number, None, line.error)
        elif "\r" in line.text:
            # A lone CR (mixed line endings) would join two rows into one line, and STSb's
            # ignored extra fields would then swallow the second row without a trace.
            index = next(i for i, f in enumerate(fields) if "\r" in f)
            field = names[index] if index < len(names) else None
            yield BadRow(line.number, field, "carriage return inside a line (mixed line endings?)")
        elif not line.text:
            continue
        elif len(fields) < need:
            reason = f"missing (row has {len(fields)} fields, needs {need})"
            yield BadRow(line.number, names[len(fields)], reason)
        elif len(fields) > need and not extra_ok:
            reason = (
                f"extra field (row has {len(fields)} fields, needs {need}; "
                "a tab in a sentence?)"
            )
            yield BadRow(line.number, None, reason)
        else:
            yield line.number, fields[:need]

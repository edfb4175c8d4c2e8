"""Weights files read as far as their headers: damage found before a worker loads them.

A truncated or overwritten ``model.safetensors`` otherwise passes every check by name and
fails inside Ray Train, after its restarts, without naming the file. A safetensors file is an
8-byte little-endian header length, a JSON header (tensor name -> dtype, shape and the byte
range of its data) and the data; checking that the header parses and that every declared
range fits the data (and matches the dtype and shape) reads a few kilobytes, not the weights.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from augsbert_ray.errors import ModelError

# Bytes per element of each safetensors dtype; a dtype not listed (a newer one) is not sized.
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8,
               "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
MAX_HEADER_BYTES = 100_000_000  # the safetensors library refuses larger headers too

# A PyTorch checkpoint is a zip archive (torch.save since 1.6) or, older, a bare pickle.
TORCH_MAGIC = (b"PK\x03\x04", b"\x80")


def check_safetensors(path: Path) -> None:
    """Checks that a safetensors file's header parses and that its tensors fit the file.

    Raises:
        ModelError: naming the file and what is wrong (truncated, not safetensors, damaged).
    """
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else None
            raw = f.read(n) if n is not None and 8 + n <= size and n <= MAX_HEADER_BYTES else b""
    except OSError as e:
        raise ModelError(f"{path}: cannot be read: {e.strerror}") from None
    if n is None:
        raise ModelError(f"{path}: not a safetensors file: {size} bytes, too short to hold a header (truncated?)")
    if 8 + n > size or n > MAX_HEADER_BYTES:
        raise ModelError(f"{path}: not a safetensors file, or truncated: its first 8 bytes give a header of {n:,} "
                         f"bytes, and the file has {size:,}")
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ModelError(f"{path}: not a safetensors file: its header is not JSON (the file is damaged, or "
                         "another format under this name)") from None
    if not isinstance(header, dict):
        raise ModelError(f"{path}: not a safetensors file: its header is not a JSON object")
    data = size - 8 - n
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = spec["dtype"], list(spec["shape"]), spec["data_offsets"]
            if not all(isinstance(v, int) and v >= 0 for v in (*shape, begin, end)):
                raise ValueError
        except (TypeError, KeyError, ValueError):
            raise ModelError(f"{path}: tensor {name!r} lacks a valid dtype, shape or data_offsets in the header: "
                             "the file is damaged") from None
        if not begin <= end <= data:
            raise ModelError(f"{path}: truncated: tensor {name!r} is declared at bytes {begin:,}-{end:,} of the data, "
                             f"which holds {data:,} bytes; download or save the model again")
        width = DTYPE_BYTES.get(str(dtype))
        if width is not None and end - begin != width * math.prod(shape):
            raise ModelError(f"{path}: tensor {name!r} ({dtype}, shape {shape}) spans {end - begin:,} bytes instead of "
                             f"{width * math.prod(shape):,}: the file is damaged")


def check_torch_checkpoint(path: Path) -> None:
    """A pickled PyTorch checkpoint (``pytorch_model.bin``) is not empty and starts as one does
    (a zip archive or a pickle); nothing in it is loaded here.

    Raises:
        ModelError: naming the file.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise ModelError(f"{path}: cannot be read: {e.strerror}") from None
    if not head:
        raise ModelError(f"{path}: empty (0 bytes): download or save the model again")
    if not head.startswith(TORCH_MAGIC):
        raise ModelError(f"{path}: not a PyTorch checkpoint (neither a zip archive nor a pickle): the file is damaged")


def check_weights_file(path: Path) -> None:
    """``check_safetensors`` or ``check_torch_checkpoint`` by the file's name; an index file
    (``*.index.json``) is read by ``models.safetensors_weights`` itself."""
    if path.name.endswith(".safetensors"):
        check_safetensors(path)
    elif path.name.endswith(".bin"):
        check_torch_checkpoint(path)

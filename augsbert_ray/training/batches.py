"""Pre-tokenised training batches: every row tokenised once, each batch padded on demand.

A recipe tokenises its training pairs once, up front (``TokenRows.from_padded`` on its
tokenizer's own padded output, in chunks), and the loop builds each step's batch with
``TokenRows.batch``: the rows padded to the batch's longest, as the tokenizer pads a batch
with ``padding=True``. Padding never changes a row's own tokens, so a batch built here holds
the same tensors as tokenising its texts together, and the step does no tokenising.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# Padded positions of these keys hold 0 whatever the tokenizer (its pad id is for input_ids).
_ZERO_PADDED = ("attention_mask", "special_tokens_mask")


@dataclass(frozen=True)
class TokenRows:
    """Tokenised rows without padding, kept as one flat array per key.

    Attributes:
        flat: per key (``input_ids``, ``attention_mask``, ...), every row's tokens one after
            another.
        offsets: row ``i`` is ``flat[key][offsets[i]:offsets[i + 1]]``.
        pad: per key, the value of a padded position.
        left: whether the tokenizer pads on the left.
        extra: the non-tensor entries of the tokenizer's output, handed on with every batch.
    """

    flat: dict[str, np.ndarray]
    offsets: np.ndarray
    pad: dict[str, int]
    left: bool
    extra: dict

    @property
    def lengths(self) -> np.ndarray:
        """Each row's token count."""
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @classmethod
    def from_padded(cls, chunks: list[dict], pad_id: int, pad_type_id: int = 0, left: bool = False) -> TokenRows:
        """Rows of a tokenizer's padded outputs (``padding=True``, ``return_tensors="pt"``), in order.

        Args:
            chunks: the outputs, each for consecutive rows; their ``attention_mask`` says which
                positions are tokens.
            pad_id: the tokenizer's ``pad_token_id`` (padded ``input_ids``).
            pad_type_id: its ``pad_token_type_id`` (padded ``token_type_ids``).
            left: whether it pads on the left (``padding_side == "left"``).

        Raises:
            ValueError: a tensor entry that is not one value per token of each row.
        """
        keys = [k for k, v in chunks[0].items() if torch.is_tensor(v)]
        extra = {k: v for k, v in chunks[0].items() if not torch.is_tensor(v)}
        flat: dict[str, list[np.ndarray]] = {k: [] for k in keys}
        lengths = []
        for chunk in chunks:
            mask = chunk["attention_mask"].bool()
            for k in keys:
                if chunk[k].shape != mask.shape:
                    raise ValueError(f"tokenizer output '{k}' has shape {tuple(chunk[k].shape)}, not one value "
                                     f"per token {tuple(mask.shape)}: it cannot be batched row by row")
                # Row-major: each row's tokens (contiguous on either side) follow the previous row's.
                flat[k].append(chunk[k][mask].numpy())
            lengths.append(mask.sum(dim=1).numpy())
        pad = {k: 0 if k in _ZERO_PADDED else pad_type_id if k == "token_type_ids" else pad_id for k in keys}
        offsets = np.concatenate([[0], np.cumsum(np.concatenate(lengths))]).astype(np.int64)
        return cls({k: np.concatenate(v) for k, v in flat.items()}, offsets, pad, left, extra)

    def batch(self, rows: np.ndarray) -> dict:
        """The tensors of ``rows`` (indices, in order), padded to the longest of them.

        Returns:
            The tokenizer's keys as CPU tensors of shape (len(rows), longest), plus ``extra``.
        """
        rows = np.asarray(rows)
        starts, ends = self.offsets[rows], self.offsets[rows + 1]
        lengths = ends - starts
        width = int(lengths.max())
        cols = np.arange(width)
        # Positions that hold tokens, and where each comes from in the flat arrays.
        if self.left:
            shift = width - lengths
            filled = cols[None, :] >= shift[:, None]
            source = starts[:, None] + cols[None, :] - shift[:, None]
        else:
            filled = cols[None, :] < lengths[:, None]
            source = starts[:, None] + cols[None, :]
        taken = source[filled]
        out = dict(self.extra)
        for k, values in self.flat.items():
            padded = np.full((len(rows), width), self.pad[k], dtype=values.dtype)
            padded[filled] = values[taken]
            out[k] = torch.from_numpy(padded)
        return out


def to_device(features: dict, device: str | torch.device) -> dict:
    """``features``' tensors on ``device`` (other values as they are): to a GPU through pinned
    memory, without waiting for the copy (the step's kernels queue behind it)."""
    if torch.device(device).type != "cuda":
        return {k: v.to(device) if torch.is_tensor(v) else v for k, v in features.items()}
    return {k: v.pin_memory().to(device, non_blocking=True) if torch.is_tensor(v) else v
            for k, v in features.items()}

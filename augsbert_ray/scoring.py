"""The cross-encoder's scoring core: tokenise, batch by a token budget, run, read a sigmoid.

Pairs are tokenised into flat arrays (``TokenizedPairs``: ids, token types and offsets, the
layout of an Arrow list column, so a CPU stage can tokenise ahead of the GPU actors and hand
the result over in the object store); each distinct sentence is tokenised once and its pairs
are composed from its tokens. Scoring sorts pairs by token length and cuts the sorted
order into batches whose padded size (pairs x longest pair) stays within a token budget:
short pairs go in large batches, long pairs in small ones, and almost no compute is spent on
padding. On a GPU, the next chunk is tokenised and padded on a CPU thread while the current
one runs, inputs go up through pinned memory, and scores come back once per chunk.

``prepare_model`` sets the precision: fp32 (the reference, and the default on CPUs without
bf16 instructions), bf16 (the default on GPUs and on CPUs with AVX-512 BF16 or AMX), fp16
(GPU), or int8 (dynamic int8 quantisation of the linear layers, CPU only, opt-in: it moves
scores measurably, see ``benchmarks/results/labeling_speed*.md``). The benchmark ``benchmarks/labeling_speed.py``
measures each against fp32 scores.
"""

from __future__ import annotations

import itertools
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

PRECISIONS = ("auto", "fp32", "bf16", "fp16", "int8")
CPU_TOKEN_BUDGET = 2048  # padded tokens per forward pass on CPU (larger batches run slower there)
GPU_TOKEN_BUDGET = 65536  # on a GPU
CHUNK_PAIRS = 16384  # pairs tokenised, sorted and scored together


@dataclass
class TokenizedPairs:
    """Tokenised pairs, flat: pair i is ``ids[offsets[i]:offsets[i + 1]]``."""

    ids: np.ndarray  # int32
    type_ids: np.ndarray | None  # int8, or None for models without token types
    offsets: np.ndarray  # int64, len(pairs) + 1

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


def tokenize_pairs(tokenizer, s1: list[str], s2: list[str], max_length: int, compose: bool = True) -> TokenizedPairs:
    """Tokenises pairs (truncated to ``max_length`` tokens, longest sentence first) into flat arrays.

    A fast (Rust) tokenizer is driven directly: it encodes the batch on all cores, and the
    ids go to NumPy without the per-pair Python objects of the ``transformers`` wrapper. With
    ``compose`` (the default) each distinct sentence is tokenised once and the pairs are put
    together from its tokens with the tokenizer's special tokens and truncation (the same ids
    and token types as its pair encoding; see ``_PairLayout``): candidate pairs repeat their
    sentences, so there is less to tokenise. Tokenizers whose pairs cannot be composed exactly
    are given whole pairs.
    """
    n = len(s1)
    if n == 0:
        return TokenizedPairs(np.empty(0, np.int32), None, np.zeros(1, np.int64))
    backend, layout = _prepared(tokenizer, max_length)
    if layout is not None and compose:
        return layout.compose(s1, s2, with_types="token_type_ids" in tokenizer.model_input_names)
    if backend is not None:
        encodings = getattr(backend, "encode_batch_fast", backend.encode_batch)(list(zip(s1, s2)))
        rows = [e.ids for e in encodings]
        types = [e.type_ids for e in encodings] if "token_type_ids" in tokenizer.model_input_names else None
    else:
        enc = tokenizer(list(s1), list(s2), truncation=True, max_length=max_length, return_attention_mask=False)
        rows, types = enc["input_ids"], enc.get("token_type_ids")
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(np.fromiter(map(len, rows), np.int64, count=n), out=offsets[1:])
    total = int(offsets[-1])
    ids = np.fromiter(itertools.chain.from_iterable(rows), np.int32, count=total)
    type_ids = None if types is None else np.fromiter(itertools.chain.from_iterable(types), np.int8, count=total)
    return TokenizedPairs(ids, type_ids, offsets)


_BACKENDS: dict = {}  # (id(tokenizer), max_length) -> (tokenizer, backend, layout)


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + n) for s, n in zip(starts, lengths)])``, without the loop."""
    total = int(lengths.sum())
    ends = np.cumsum(lengths)
    return np.arange(total, dtype=np.int64) + np.repeat(starts - (ends - lengths), lengths)


@dataclass
class _PairLayout:
    """How a tokenizer lays out a pair: special tokens around and between the two sentences'
    own tokens, and their token types. Pairs are composed from each distinct sentence's tokens,
    so a sentence that recurs in many candidate pairs (a BM25 or semantic-search query, a
    popular neighbour) is tokenised once.

    Truncation follows the ``tokenizers`` library's ``longest_first`` rule for pairs; the layout
    is built only after it reproduced the tokenizer's own pair encodings on probes, and tests
    compare it with them on real sentences.
    """

    single: object  # a Rust tokenizer without truncation or padding
    prefix: tuple  # (ids, types) before the first sentence
    middle: tuple  # between the sentences
    suffix: tuple  # after the second
    type_a: int
    type_b: int
    max_length: int

    @property
    def budget(self) -> int:  # tokens left for the two sentences
        return self.max_length - len(self.prefix[0]) - len(self.middle[0]) - len(self.suffix[0])

    def truncated(self, la: np.ndarray, lb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Both sentences' lengths after ``longest_first`` truncation to ``budget``."""
        cap = self.budget
        small = np.minimum(la, lb)
        large_cut = np.maximum(small, cap - small)
        halves = small + large_cut > cap  # both longer than half: split the budget (the larger gets the odd token)
        small_cut = np.where(halves, cap // 2, small)
        large_cut = np.where(halves, cap // 2 + cap % 2, large_cut)
        a_larger = la > lb
        over = la + lb > cap
        return (np.where(over, np.where(a_larger, large_cut, small_cut), la),
                np.where(over, np.where(a_larger, small_cut, large_cut), lb))

    def compose(self, s1: list[str], s2: list[str], with_types: bool) -> TokenizedPairs:
        index: dict[str, int] = {}
        i1 = np.fromiter((index.setdefault(x, len(index)) for x in s1), np.int64, count=len(s1))
        i2 = np.fromiter((index.setdefault(x, len(index)) for x in s2), np.int64, count=len(s2))
        encode = getattr(self.single, "encode_batch_fast", self.single.encode_batch)
        rows = [e.ids for e in encode(list(index), add_special_tokens=False)]
        lens = np.fromiter(map(len, rows), np.int64, count=len(rows))
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
        flat = np.fromiter(itertools.chain.from_iterable(rows), np.int32, count=int(lens.sum()))
        ta, tb = self.truncated(lens[i1], lens[i2])
        npre, nmid, nsuf = len(self.prefix[0]), len(self.middle[0]), len(self.suffix[0])
        offsets = np.zeros(len(s1) + 1, np.int64)
        np.cumsum(ta + tb + (npre + nmid + nsuf), out=offsets[1:])
        head = offsets[:-1]
        ids = np.empty(int(offsets[-1]), np.int32)
        types = np.empty(len(ids), np.int8) if with_types else None
        pos_a, pos_b = _ranges(head + npre, ta), _ranges(head + npre + ta + nmid, tb)
        ids[pos_a], ids[pos_b] = flat[_ranges(starts[i1], ta)], flat[_ranges(starts[i2], tb)]
        if types is not None:
            types[pos_a], types[pos_b] = self.type_a, self.type_b
        for base, (sp_ids, sp_types) in ((head, self.prefix), (head + npre + ta, self.middle),
                                          (head + npre + ta + nmid + tb, self.suffix)):
            for j, (tid, ttype) in enumerate(zip(sp_ids, sp_types)):
                ids[base + j] = tid
                if types is not None:
                    types[base + j] = ttype
        return TokenizedPairs(ids, types, offsets)


# Probe pairs for _pair_layout: short and long, equal and unequal, either side the longer, so
# that at the usual max_length every branch of longest_first truncation is taken.
_PROBES = [("the cat sat on a mat. " * n1, "a dog ran in the park! " * n2)
           for n1, n2 in [(1, 2), (3, 3), (2, 40), (40, 2), (30, 31), (31, 30), (90, 90), (200, 5)]]


def _pair_layout(tokenizer, max_length: int) -> _PairLayout | None:
    """The tokenizer's pair layout, or None where composing pairs would not reproduce its own
    pair encodings exactly (then pairs are tokenised whole)."""
    return _prepared(tokenizer, max_length)[1]


def _make_layout(backend, max_length: int) -> _PairLayout | None:
    try:
        from tokenizers import Tokenizer

        single = Tokenizer.from_str(backend.to_str())
        single.no_truncation()
        return _learn_layout(single, backend, max_length)
    except Exception:  # an unusual tokenizer: tokenise pairs whole
        return None


def _learn_layout(single, pair_encoder, max_length: int) -> _PairLayout | None:
    a, b = "the cat sat", "a dog ran in the park"
    ea, eb = single.encode(a, add_special_tokens=False).ids, single.encode(b, add_special_tokens=False).ids
    full = single.encode(a, b)
    ids, types = full.ids, full.type_ids
    starts_a = [i for i in range(len(ids) - len(ea) + 1) if ids[i:i + len(ea)] == ea]
    if not ea or not eb or not starts_a:
        return None
    at_a = starts_a[0]
    end_a = at_a + len(ea)
    starts_b = [i for i in range(end_a, len(ids) - len(eb) + 1) if ids[i:i + len(eb)] == eb]
    if not starts_b:
        return None
    at_b = starts_b[0]
    end_b = at_b + len(eb)
    if len(set(types[at_a:end_a])) != 1 or len(set(types[at_b:end_b])) != 1:
        return None
    layout = _PairLayout(single, (ids[:at_a], types[:at_a]), (ids[end_a:at_b], types[end_a:at_b]),
                         (ids[end_b:], types[end_b:]), types[at_a], types[at_b], max_length)
    if layout.budget <= 0:
        return None
    firsts, seconds = [p[0] for p in _PROBES], [p[1] for p in _PROBES]
    got = layout.compose(firsts, seconds, with_types=True)
    want = pair_encoder.encode_batch(list(zip(firsts, seconds)))
    for i, e in enumerate(want):
        lo, hi = got.offsets[i], got.offsets[i + 1]
        if got.ids[lo:hi].tolist() != list(e.ids) or got.type_ids[lo:hi].tolist() != list(e.type_ids):
            return None
    return layout


def _prepared(tokenizer, max_length: int) -> tuple:
    """(backend, pair layout) for a fast tokenizer, made once per tokenizer and ``max_length``:
    a private copy of its Rust backend set to truncate pairs at ``max_length``, and the layout
    (``_pair_layout``). (None, None) for a slow tokenizer."""
    rust = getattr(tokenizer, "_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
    if rust is None:
        return None, None
    key = (id(tokenizer), max_length)
    cached = _BACKENDS.get(key)
    if cached is None or cached[0] is not tokenizer:
        from tokenizers import Tokenizer

        copy = Tokenizer.from_str(rust.to_str())
        copy.no_padding()
        copy.enable_truncation(max_length, strategy="longest_first")
        cached = _BACKENDS[key] = (tokenizer, copy, _make_layout(copy, max_length))
    return cached[1], cached[2]


def token_budget_batches(lengths: np.ndarray, token_budget: int, max_pairs: int) -> list[np.ndarray]:
    """Cuts pairs, longest first, into batches with (pairs x longest) <= ``token_budget``.

    A pair longer than the budget goes alone. Returns index arrays into ``lengths``; together
    they hold every index exactly once.
    """
    order = np.argsort(-lengths, kind="stable")
    batches, start, n = [], 0, len(order)
    while start < n:
        longest = max(int(lengths[order[start]]), 1)  # sorted: the first pair is the longest
        size = max(1, min(max_pairs, token_budget // longest, n - start))
        batches.append(order[start:start + size])
        start += size
    return batches


def pad_batch(tokens: TokenizedPairs, idx: np.ndarray, pad_id: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """Right-padded (ids, type ids, lengths) arrays of the pairs ``idx``."""
    lens = tokens.lengths[idx]
    width = int(lens.max())
    rows = np.repeat(np.arange(len(idx)), lens)
    cols = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
    src = np.repeat(tokens.offsets[idx], lens) + cols
    ids = np.full((len(idx), width), pad_id, np.int64)
    ids[rows, cols] = tokens.ids[src]
    types = None
    if tokens.type_ids is not None:
        types = np.zeros((len(idx), width), np.int64)
        types[rows, cols] = tokens.type_ids[src]
    return ids, types, lens


def cpu_has_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (AVX-512 BF16 or AMX tiles).

    There bf16 matrix products run several times faster than fp32 (on a 2-core AMD EPYC with
    AVX-512 BF16: 994 against 205 GFLOP/s); without them bf16 is emulated and slower than fp32.
    """
    import torch

    for probe in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"):
        check = getattr(torch.cpu, probe, None)  # private probes of torch's CPU dispatch
        try:
            if check is not None and check():
                return True
        except Exception:  # a torch without the probe, or one that cannot read the CPU's flags
            continue
    return False


def resolve_precision(precision: str, device: str) -> str:
    """``auto``: bf16 on a GPU that has it (else fp16); on CPU, bf16 where the CPU has bf16
    matrix instructions (``cpu_has_bf16``), else fp32."""
    import torch

    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, not {precision!r}")
    gpu = str(device).startswith("cuda")
    if precision == "auto":
        if gpu:
            return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        return "bf16" if cpu_has_bf16() else "fp32"
    if precision == "int8" and gpu:
        raise ValueError("precision int8 (dynamic quantisation) runs on CPU only; use bf16 or fp16 on a GPU")
    return precision


def prepare_model(model, precision: str, device: str, compile: bool = False):
    """The model, in eval mode, in ``precision`` (see ``resolve_precision``), optionally compiled."""
    import torch

    precision = resolve_precision(precision, device)
    model = model.eval()
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    elif precision == "fp16":
        model = model.to(torch.float16)
    elif precision == "int8":
        model = model.float()
        # Weights per output channel: on a trained MiniLM teacher this kept Spearman with the fp32
        # scores at 0.989 where per-tensor weights gave 0.973 (600 STSb dev pairs), at the same speed.
        with warnings.catch_warnings():  # torch.ao's eager quantisation is deprecated in favour of torchao
            warnings.simplefilter("ignore")
            qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
            model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear: qconfig})
    else:
        model = model.float()
    if compile:
        model = torch.compile(model, dynamic=True)
    return model


def score_tokenized(model, tokens: TokenizedPairs, *, pad_id: int = 0, token_budget: int | None = None,
                    max_pairs: int = 1024, device: str = "cpu", fill: bool | None = None) -> np.ndarray:
    """Scores tokenised pairs: sigmoid of the model's one logit, float32, in input order.
    ``fill``: whether short batches are filled (``fill_rows``); None: where ``fills_rows`` says."""
    return _score_chunks(model, iter([(np.arange(len(tokens)), tokens)]), len(tokens), pad_id,
                         token_budget, max_pairs, device, fill)


def score_pairs(model, tokenizer, s1: list[str], s2: list[str], *, micro_batch_size: int = 64,
                max_length: int = 128, device: str = "cpu", token_budget: int | None = None,
                chunk_pairs: int = CHUNK_PAIRS) -> np.ndarray:
    """Scores sentence pairs with a one-logit cross-encoder: sigmoid(logit) in [0, 1].

    Pairs are tokenised once per chunk (the next chunk on a CPU thread while this one runs),
    sorted by token length and run in batches of at most ``micro_batch_size`` pairs and, with
    a ``token_budget``, at most that many padded tokens; scores come back in input order. The
    model runs in whatever precision it is in (see ``prepare_model``).

    Args:
        model: a ``transformers`` sequence-classification model with one output, in eval mode.
        tokenizer: its tokenizer.
        s1, s2: the pairs' first and second sentences.
        micro_batch_size: most pairs per forward pass.
        max_length: token limit of a pair (longer pairs are truncated).
        device: where ``model`` lives.
        token_budget: most padded tokens per forward pass (None: no limit beyond the pairs).
        chunk_pairs: pairs tokenised and sorted together.

    Returns:
        float32 array of shape (len(s1),).
    """
    n = len(s1)
    if len(s2) != n:
        raise ValueError(f"{n} first sentences but {len(s2)} second sentences")
    starts = range(0, n, chunk_pairs)

    def tokenize(start: int):
        end = min(n, start + chunk_pairs)
        return np.arange(start, end), tokenize_pairs(tokenizer, s1[start:end], s2[start:end], max_length)

    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    if len(starts) <= 1:
        chunks = map(tokenize, starts)
        return _score_chunks(model, chunks, n, pad_id, token_budget, micro_batch_size, device)
    with ThreadPoolExecutor(1, thread_name_prefix="tokenize") as pool:
        chunks = _prefetch(pool, tokenize, starts)
        return _score_chunks(model, chunks, n, pad_id, token_budget, micro_batch_size, device)


def _prefetch(pool, fn, items):
    """``map(fn, items)``, computing the next item on ``pool`` while the caller uses this one."""
    items = iter(items)
    pending = next((pool.submit(fn, x) for x in items), None)
    while pending is not None:
        result = pending.result()
        pending = next((pool.submit(fn, x) for x in items), None)
        yield result


def fill_rows(ids: np.ndarray, types: np.ndarray | None, lens: np.ndarray, rows: int,
              pad_id: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """A padded batch with filler rows appended up to ``rows`` (one pad token each, so that no
    row is wholly masked); a batch of ``rows`` or more is returned as it is."""
    extra = rows - len(ids)
    if extra <= 0:
        return ids, types, lens
    ids = np.concatenate([ids, np.full((extra, ids.shape[1]), pad_id, ids.dtype)])
    if types is not None:
        types = np.concatenate([types, np.zeros((extra, types.shape[1]), types.dtype)])
    return ids, types, np.concatenate([lens, np.ones(extra, lens.dtype)])


def filled_size(rows: int, width: int, token_budget: int, max_pairs: int) -> int:
    """The rows a batch of ``rows`` pairs of ``width`` tokens is filled up to: the next power of
    two, or the width's full batch if that is smaller. Each width then has a few shapes at most,
    and a short batch at most doubles its work. (Filling to the full batch costs more: a block's
    last batch holds its shortest pairs, whose full batch is the largest.)"""
    full = max(rows, min(max_pairs, token_budget // width))
    return min(full, 1 << max(0, rows - 1).bit_length())


def fills_rows(model, device: str) -> bool:
    """Whether short batches are filled (``fill_rows``, ``filled_size``): on CPU, where
    oneDNN compiles and keeps a kernel per input shape, and the last, short batch of each chunk
    would otherwise bring a new shape almost every time, so that an actor's memory grew with the
    pairs it labelled. A filler row changes no other row's score (each row's result depends on
    its own tokens alone; the tests check it to the bit), except under dynamic int8 quantisation,
    which scales each batch by its largest value: there, and on GPUs, batches stay as they are."""
    if str(device).startswith("cuda"):
        return False
    return not any(type(m).__module__.startswith("torch.ao.nn.quantized") for m in model.modules())


def _score_chunks(model, chunks, n: int, pad_id: int, token_budget: int | None, max_pairs: int,
                  device: str, fill: bool | None = None) -> np.ndarray:
    import torch

    out = np.empty(n, dtype=np.float32)
    gpu = str(device).startswith("cuda")
    budget = token_budget if token_budget else 1 << 62
    fill = fills_rows(model, device) if fill is None else fill
    with torch.inference_mode():
        for where, tokens in chunks:
            if len(tokens) == 0:
                continue
            batches = token_budget_batches(tokens.lengths, budget, max_pairs)
            logits, keep = [], []
            for idx in batches:
                ids, types, lens = pad_batch(tokens, idx, pad_id)
                if fill:
                    ids, types, lens = fill_rows(ids, types, lens, filled_size(len(idx), ids.shape[1], budget,
                                                                              max_pairs), pad_id)
                t_ids, t_lens = torch.from_numpy(ids), torch.from_numpy(lens)
                t_types = torch.from_numpy(types) if types is not None else None
                if gpu:  # pinned host memory, so the copy overlaps with the work queued before it
                    t_ids, t_lens = t_ids.pin_memory(), t_lens.pin_memory()
                    t_types = t_types.pin_memory() if t_types is not None else None
                    keep.append((t_ids, t_lens, t_types))
                    t_ids, t_lens = t_ids.to(device, non_blocking=True), t_lens.to(device, non_blocking=True)
                    t_types = t_types.to(device, non_blocking=True) if t_types is not None else None
                mask = torch.arange(ids.shape[1], device=t_ids.device)[None, :] < t_lens[:, None]
                kwargs = {"input_ids": t_ids, "attention_mask": mask.long()}
                if t_types is not None:
                    kwargs["token_type_ids"] = t_types
                logits.append(model(**kwargs).logits.float().reshape(-1)[:len(idx)])
            scores = torch.sigmoid(torch.cat(logits)).cpu().numpy()  # one transfer per chunk
            out[where[np.concatenate(batches)]] = scores
    return out

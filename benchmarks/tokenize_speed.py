"""Tokenising candidate pairs: whole pairs (the tokenizer's own pair encoding) vs pairs
composed from each distinct sentence's tokens, side by side on the same shards.

On a GPU the labelling actors get their pairs tokenised by CPU tasks ahead of them, so the
CPU stage's pairs/s bounds the pipeline. The pairs here are real candidates: BM25 top-k
over the unique sentences of the STS benchmark (the engine's Tantivy index and candidate
rules, no gold pairs removed), cut in candidate order into shards of ``--block-sizes`` pairs
as the labelling stage cuts them (1,024 is the CPU default, 16,384 the GPU one). Each shard
is tokenised both ways, the results are checked to be identical, and the time is summed
over the shards; ``--repeats`` interleaved rounds, median reported. The tokenizer's thread
pool has ``--threads`` threads (1, as in a tokenise task holding one CPU).

    python benchmarks/tokenize_speed.py                      # top-3, shards of 1,024 and 16,384
    python benchmarks/tokenize_speed.py --top-k 10 --threads 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def bm25_candidates(sentences: list[str], k: int):
    """The engine's BM25 candidates over ``sentences`` (ids 0..n-1), in candidate order."""
    import numpy as np
    import pyarrow as pa

    from augsbert_ray import schema
    from augsbert_ray.candidates.bm25 import BM25Searcher, build_index
    from augsbert_ray.candidates.pairs import concat_hits, finalize_candidates

    table = pa.table({schema.SENTENCE_ID: pa.array(range(len(sentences)), pa.int64()),
                      schema.TEXT: pa.array(sentences, pa.string())})
    with tempfile.TemporaryDirectory() as tmp:
        hits = BM25Searcher(str(build_index(table, Path(tmp) / "bm25")), k)(table)  # what each search actor does
    return finalize_candidates(*concat_hits([hits]), table, np.empty(0, np.int64), origin="bm25")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--top-k", type=int, default=3)
    p.add_argument("--block-sizes", type=int, nargs="+", default=[1024, 16384])
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--model", default="embedded", help="whose tokenizer (default: the embedded model's)")
    p.add_argument("--threads", type=int, default=1, help="threads of the tokenizer's pool")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--data-dir", default=os.environ.get("AUGSBERT_DATA_DIR", "../shared/data"))
    p.add_argument("--out", default="benchmarks/results/tokenize_speed")
    args = p.parse_args(argv)
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)  # before the tokenizer's pool starts

    import numpy as np
    from transformers import AutoTokenizer

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bm25_speed import corpus

    from augsbert_ray.models import resolve_model
    from provenance import provenance, write_result
    from augsbert_ray.scoring import tokenize_pairs

    sentences = corpus(Path(args.data_dir), 1)
    cands = bm25_candidates(sentences, args.top_k)
    s1 = cands.column("sentence1").to_pylist()
    s2 = cands.column("sentence2").to_pylist()
    n = len(s1)
    print(f"{n:,} BM25 top-{args.top_k} candidate pairs over {len(sentences):,} sentences", flush=True)
    tok = AutoTokenizer.from_pretrained(str(resolve_model(args.model)))

    rows, record = [], {"pairs": n, "sentences": len(sentences), "top_k": args.top_k, "blocks": {}}
    for block in args.block_sizes:
        shards = [(s1[i:i + block], s2[i:i + block]) for i in range(0, n, block)]
        distinct = sum(len(set(a) | set(b)) for a, b in shards)
        for a, b in shards:  # identical output, checked once per shard (and warms both paths)
            whole, composed = tokenize_pairs(tok, a, b, args.max_length, compose=False), \
                tokenize_pairs(tok, a, b, args.max_length)
            if not (np.array_equal(whole.ids, composed.ids) and np.array_equal(whole.offsets, composed.offsets)
                    and np.array_equal(whole.type_ids, composed.type_ids)):
                raise SystemExit(f"composed pairs differ from whole pairs (shard of {block})")
        times = {"whole": [], "composed": []}
        for _ in range(args.repeats):
            for name, compose in (("whole", False), ("composed", True)):
                t0 = time.perf_counter()
                for a, b in shards:
                    tokenize_pairs(tok, a, b, args.max_length, compose=compose)
                times[name].append(time.perf_counter() - t0)
        rate = {k: n / statistics.median(v) for k, v in times.items()}
        spread = {k: (n / max(v), n / min(v)) for k, v in times.items()}
        record["blocks"][block] = {"shards": len(shards), "distinct_sentences": distinct, "seconds": times,
                                   "pairs_per_s": rate}
        for name in ("whole", "composed"):
            lo, hi = spread[name]
            rows.append((block, len(shards), f"{distinct / n:.2f}", name, f"{rate[name]:,.0f}", f"{lo:,.0f}-{hi:,.0f}",
                         f"{rate[name] / rate['whole']:.2f}x"))
            print(f"shards of {block}: {name} {rate[name]:,.0f} pairs/s", flush=True)

    header = ["pairs per shard", "shards", "distinct sentences per pair", "tokenisation", "pairs/s",
              "rounds' range", "vs whole pairs"]
    md = [
        "# Tokenising candidate pairs: whole pairs vs composed from distinct sentences", "",
        f"{n:,} BM25 top-{args.top_k} candidate pairs over the {len(sentences):,} unique STSb sentences, in "
        f"candidate order; tokenizer of `{args.model}`, max_length {args.max_length}, {args.threads} thread(s). "
        f"Median of {args.repeats} interleaved rounds; both give identical ids, token types and offsets.", "",
        "| " + " | ".join(header) + " |", "|" + "---:|" * 3 + "---|" + "---:|" * 3,
        *("| " + " | ".join(str(c) for c in r) + " |" for r in rows), "",
        *provenance("benchmarks/tokenize_speed.py", argv),
    ]
    write_result(args.out, md, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())

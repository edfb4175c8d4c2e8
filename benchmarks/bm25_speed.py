"""BM25 candidate generation: the engine's Tantivy index vs ``bm25s`` and ``rank_bm25``,
side by side in one run on the same corpus, queries and k.

The corpus is the unique sentences of the STS benchmark (train + dev + test), each also a
query, as in BM25 sampling; ``--scale N`` repeats it N times with a numeric suffix per copy
(so every copy is a distinct sentence) to measure larger corpora. All three run in one
process on one core (``n_threads=1`` for bm25s); throughput is queries per second per core.
``rank_bm25`` scores every document per query, so it is timed on a sample of queries.
Also reported: the overlap of each peer's top-k ids with the engine's (tokenisation and
idf variants differ slightly between the libraries).

    python benchmarks/bm25_speed.py                 # STSb sentences, k = 4
    python benchmarks/bm25_speed.py --scale 10
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

import numpy as np


def corpus(data_dir: Path, scale: int) -> list[str]:
    from augsbert_ray.bench.data import unique_sentences

    return unique_sentences(data_dir, scale)


_TOKEN = re.compile(r"[A-Za-z0-9]+")


def tokens(text: str) -> list[str]:
    """Tantivy's default analysis, for the peers: alphanumeric runs, lowercased, < 40 bytes."""
    return [t.lower() for t in _TOKEN.findall(text) if len(t) < 40]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--scale", type=int, default=1)
    p.add_argument("--rank-bm25-queries", type=int, default=200)
    p.add_argument("--data-dir", default=os.environ.get("AUGSBERT_DATA_DIR", "../shared/data"))
    p.add_argument("--out", default="benchmarks/results/bm25_speed")
    args = p.parse_args(argv)

    import bm25s
    import rank_bm25

    from augsbert_ray.bench.bm25 import bm25s_search, engine_search, overlap
    from provenance import provenance, write_result

    docs = corpus(Path(args.data_dir), args.scale)
    n, k = len(docs), args.k
    rows = {}

    engine, peer = engine_search(docs, k), bm25s_search(docs, k)
    ours = engine["ids"]
    rows["engine (Tantivy)"] = {key: engine[key] for key in ("index_s", "qps", "queries")}
    rows["bm25s"] = {key: peer[key] for key in ("index_s", "qps", "queries")}
    overlap_bm25s = overlap(ours, peer["ids"], k)
    toks = [tokens(d) for d in docs]  # for rank_bm25, which takes token lists

    t0 = time.perf_counter()
    okapi = rank_bm25.BM25Okapi(toks)
    build = time.perf_counter() - t0
    sample = np.random.default_rng(0).choice(n, min(args.rank_bm25_queries, n), replace=False)
    t0 = time.perf_counter()
    rb = [np.argsort(-okapi.get_scores(toks[i]), kind="stable")[:k] for i in sample]
    rows["rank_bm25 (BM25Okapi)"] = {"index_s": build, "qps": len(sample) / (time.perf_counter() - t0),
                                     "queries": len(sample)}
    overlap_rank = float(np.mean([len(set(ours[i]) & set(r.tolist())) / k for i, r in zip(sample, rb)]))

    base = rows["engine (Tantivy)"]["qps"]
    lines = ["# BM25 candidate generation: queries per second per core", "",
             f"Corpus: {n:,} sentences (unique STSb sentences" + (f" x {args.scale}" if args.scale > 1 else "")
             + f"), each also a query, top-{k}. One process, one core.", "",
             "| library | index build (s) | queries/s | engine / library | queries timed |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {name} | {r['index_s']:.2f} | {r['qps']:.0f} | {base / r['qps']:.2f}x | {r['queries']:,} |"
              for name, r in rows.items()]
    lines += ["", f"Top-{k} overlap with the engine: bm25s {overlap_bm25s:.3f}, rank_bm25 {overlap_rank:.3f}.", "",
              *provenance("benchmarks/bm25_speed.py", argv, extra=f", bm25s {bm25s.__version__}")]
    write_result(args.out, lines, {"rows": rows, "overlap": {"bm25s": overlap_bm25s, "rank_bm25": overlap_rank},
                                   "args": vars(args)})
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

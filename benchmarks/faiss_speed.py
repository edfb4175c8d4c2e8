"""Semantic top-k: the engine's Faiss search vs ``sentence_transformers.util.semantic_search``,
and IVF / HNSW recall@k against exact search with their speed-up, side by side in one run
on the same embeddings, queries and k.

The corpus is the unique sentences of the STS benchmark (train + dev + test), embedded by
the bi-encoder (``--model``, the embedded all-MiniLM-L6-v2 by default). ``--scale N`` grows
it N times with synthetic neighbours: copy i of a sentence's embedding has Gaussian noise
of norm ``--noise`` added and is renormalised, so the corpus keeps the real embeddings'
cluster structure at N times the size (a synthetic corpus, said in the report). Queries are
a seeded sample of ``--queries`` corpus rows, each searching for its k nearest *other* rows
(as semantic-search sampling does); recall@k is measured against exact (flat) search.

    python benchmarks/faiss_speed.py                          # STSb sentences, k = 3
    python benchmarks/faiss_speed.py --scale 20 --shards 2    # ~330k rows, 2 index shards
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

from augsbert_ray.bench.data import unique_sentences
from augsbert_ray.bench.semantic import grow, recall, sample_queries, st_search, timed_search


def _pairs(settings: str) -> list[tuple[int, int]]:
    """``"a:b,c:d"`` as ``[(a, b), (c, d)]``."""
    return [tuple(map(int, s.split(":"))) for s in settings.split(",") if s]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--model", default="embedded", help="the bi-encoder that embeds the sentences")
    p.add_argument("--scale", type=int, default=1)
    p.add_argument("--noise", type=float, default=0.3, help="norm of the noise added to each synthetic copy")
    p.add_argument("--queries", type=int, default=5000, help="queries timed (a seeded sample of the corpus)")
    p.add_argument("--threads", type=int, default=0, help="Faiss and torch threads (0: all cores)")
    p.add_argument("--shards", type=int, nargs="*", default=[], help="also time flat search over these "
                   "numbers of index shards (Ray actors)")
    p.add_argument("--ivf", default="1024:8,1024:32,1024:128", help="nlist:nprobe settings")
    p.add_argument("--hnsw", default="32:64,32:128,32:256", help="M:efSearch settings")
    p.add_argument("--data-dir", default=os.environ.get("AUGSBERT_DATA_DIR", "../shared/data"))
    p.add_argument("--out", default="benchmarks/results/faiss_speed")
    args = p.parse_args(argv)

    import faiss
    import torch

    from augsbert_ray.candidates.semantic import ShardedIndex, build_faiss_index, embed_texts
    from augsbert_ray.config import FaissConfig
    from augsbert_ray.models import load_bi_encoder
    from provenance import provenance, write_result

    threads = args.threads or os.cpu_count()
    faiss.omp_set_num_threads(threads)
    torch.set_num_threads(threads)
    texts = unique_sentences(Path(args.data_dir))
    t0 = time.perf_counter()
    base = embed_texts(load_bi_encoder(args.model, 128), texts, batch_size=64)
    print(f"embedded {len(texts):,} sentences in {time.perf_counter() - t0:.0f} s", flush=True)
    emb = grow(base, args.scale, args.noise, seed=0)
    n, k = len(emb), args.k
    q_ids, queries = sample_queries(emb, args.queries)
    rows: dict[str, dict] = {}

    def timed(name: str, build, search, note: str = "") -> np.ndarray:
        t = timed_search(build, search, queries, q_ids, k)
        rows[name] = {"build_s": t.build_s, "search_s": t.search_s, "qps": t.queries_per_s, "note": note}
        print(f"{name}: build {t.build_s:.2f} s, {t.queries_per_s:,.0f} queries/s", flush=True)
        return t.hits

    # The peer: exact cosine top-k in torch, as sentence-transformers users run it.
    peer = timed("sentence_transformers.util.semantic_search", lambda: None,
                 lambda _, q: st_search(emb, q, k + 1), "exact, torch")
    exact = timed("engine: Faiss flat (exact)", lambda: build_faiss_index(emb, FaissConfig(use_gpu=False), 0),
                  lambda ix, q: ix.search(q, k + 1), "exact")
    rows["engine: Faiss flat (exact)"]["recall"] = 1.0
    rows["sentence_transformers.util.semantic_search"]["recall"] = recall(peer, exact)
    if hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0:
        name = "engine: Faiss flat on the GPU (exact)"
        got = timed(name, lambda: build_faiss_index(emb, FaissConfig(use_gpu=True), 0),
                    lambda ix, q: ix.search(q, k + 1), "exact")
        rows[name]["recall"] = recall(got, exact)
    for shards in args.shards:
        import ray

        if not ray.is_initialized():
            ray.init(num_cpus=max(threads, shards), include_dashboard=False, log_to_driver=False)
        name = f"engine: Faiss flat, {shards} shards (Ray actors)"
        got = timed(name, lambda s=shards: ShardedIndex(emb, FaissConfig(use_gpu=False), 0, s,
                                                         num_cpus=max(threads, shards) / s),
                    lambda ix, q: ix.search(q, k + 1), "exact")
        rows[name]["recall"] = recall(got, exact)
    approximate = [(f"engine: IVF nlist {min(a, n // 39)}, nprobe {b}",
                    FaissConfig(index="ivf", ivf_nlist=a, ivf_nprobe=b, use_gpu=False)) for a, b in _pairs(args.ivf)]
    approximate += [(f"engine: HNSW M {a}, efSearch {b}",
                     FaissConfig(index="hnsw", hnsw_m=a, hnsw_ef_search=b, use_gpu=False)) for a, b in _pairs(args.hnsw)]
    for name, cfg in approximate:
        got = timed(name, lambda c=cfg: build_faiss_index(emb, c, 0), lambda ix, q: ix.search(q, k + 1))
        rows[name]["recall"] = recall(got, exact)

    flat_qps = rows["engine: Faiss flat (exact)"]["qps"]
    corpus_note = (f"{n:,} rows: the {len(texts):,} unique STSb sentences embedded by `{args.model}`"
                   + (f", and {args.scale - 1} synthetic noisy copies of each (noise norm {args.noise})"
                      if args.scale > 1 else ""))
    lines = ["# Semantic top-k: Faiss vs sentence-transformers, and approximate indexes vs exact", "",
             f"Corpus: {corpus_note}. {len(q_ids):,} queries (corpus rows), top-{k} other rows each. "
             f"{threads} threads.", "",
             "| search | index build (s) | queries/s | vs flat | recall@k vs exact |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {name} | {r['build_s']:.2f} | {r['qps']:,.0f} | {r['qps'] / flat_qps:.2f}x | {r['recall']:.4f} |"
              for name, r in rows.items()]
    lines += ["", *provenance("benchmarks/faiss_speed.py", argv, extra=f", faiss {faiss.__version__}",
                              machine=torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")]
    write_result(args.out, lines, {"rows": rows, "n": n, "queries": len(q_ids), "k": k, "args": vars(args)})
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

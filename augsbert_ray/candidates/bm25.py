"""BM25 top-k sampling (AugSBERT section 3, "BM25 sampling") with a Tantivy index.

The index over the unique gold sentences is built once per job on the driver and put in
Ray's object store; each node unpacks it once and its query actors open it read-only, so
it is never rebuilt per worker and no shared disk is needed. Each sentence is a query;
its top-k other sentences become candidate pairs.

BM25 here is Tantivy's (k1 = 1.2, b = 0.75, idf = ln(1 + (N - n + 0.5) / (n + 0.5))),
over Tantivy's default analysis (split on non-alphanumerics, drop tokens of 40+ bytes,
lowercase); a query's distinct terms are OR-ed, each counted once.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa

from augsbert_ray import schema

TEXT_FIELD = "text"
ID_FIELD = "sid"


def analyzer():
    """Tantivy's "default" text analysis, to tokenise queries exactly as the index was."""
    import tantivy

    return (
        tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
        .filter(tantivy.Filter.remove_long(40))
        .filter(tantivy.Filter.lowercase())
        .build()
    )


def _index_schema():
    import tantivy

    builder = tantivy.SchemaBuilder()
    builder.add_integer_field(ID_FIELD, stored=True, indexed=False, fast=True)
    builder.add_text_field(TEXT_FIELD, stored=False, index_option="freq")
    return builder.build()


def build_index(sentences, index_dir: Path, heap_bytes: int = 200_000_000) -> Path:
    """Indexes ``sentences`` (a SENTENCE_SCHEMA table, or such tables one after another, read as
    they come) into a fresh Tantivy index at ``index_dir``. The same sentences in the same order
    give the same index, however they are cut into tables."""
    import tantivy

    index_dir = Path(index_dir)
    if index_dir.exists():
        shutil.rmtree(index_dir)
    index_dir.mkdir(parents=True)
    index = tantivy.Index(_index_schema(), path=str(index_dir))
    writer = index.writer(heap_size=heap_bytes, num_threads=1)
    for table in [sentences] if isinstance(sentences, pa.Table) else sentences:
        ids = table.column(schema.SENTENCE_ID).to_pylist()
        for sid, text in zip(ids, table.column(schema.TEXT).to_pylist()):
            writer.add_document(tantivy.Document(**{ID_FIELD: sid, TEXT_FIELD: text}))
    writer.commit()
    writer.wait_merging_threads()
    return index_dir


class BM25Index:
    """A read-only handle on a built index that answers top-k queries."""

    def __init__(self, index_dir: str | Path):
        import tantivy

        self._tantivy = tantivy
        self._index = tantivy.Index.open(str(index_dir))
        self._index.reload()
        self._searcher = self._index.searcher()
        self._schema = self._index.schema
        self._analyzer = analyzer()

    def top_k(self, text: str, k: int) -> list[tuple[int, float]]:
        """The ``k`` best (sentence_id, score) for ``text``, best first."""
        t = self._tantivy
        terms = list(dict.fromkeys(self._analyzer.analyze(text)))
        if not terms or k <= 0:
            return []
        query = t.Query.boolean_query([(t.Occur.Should, t.Query.term_query(self._schema, TEXT_FIELD, w)) for w in terms])
        hits = self._searcher.search(query, k).hits
        ids = self._searcher.fast_field_values(ID_FIELD, [addr for _, addr in hits])
        return [(int(i), float(score)) for (score, _), i in zip(hits, ids)]


class BM25Searcher:
    """Ray Data callable: opens the index once, maps a batch of sentences to their hits.

    With ``progress`` (a picklable ``StageProgress``), each batch's sentences are reported.
    """

    def __init__(self, index_dir, top_k: int, progress=None):
        from augsbert_ray.artifacts import local_model

        self.index = BM25Index(local_model(index_dir))  # a shipped index is unpacked on this node
        self.top_k = top_k
        self.progress = progress

    def __call__(self, batch: pa.Table) -> pa.Table:
        q, h, s = [], [], []
        for sid, text in zip(batch.column(schema.SENTENCE_ID).to_pylist(), batch.column(schema.TEXT).to_pylist()):
            # One extra hit: the query sentence itself is usually its own best match.
            hits = [(i, sc) for i, sc in self.index.top_k(text, self.top_k + 1) if i != sid][: self.top_k]
            q.extend([sid] * len(hits))
            h.extend(i for i, _ in hits)
            s.extend(sc for _, sc in hits)
        if self.progress is not None:
            self.progress.advance(batch.num_rows)
            self.progress.flush()
        return pa.table(
            {"query_id": pa.array(q, pa.int64()), "hit_id": pa.array(h, pa.int64()), "score": pa.array(s, pa.float32())},
            schema=schema.HITS_SCHEMA,
        )


def sample(ctx) -> pa.Table:
    """BM25 top-k candidates for every unique sentence, queries sharded over Ray Data (or run on a
    warm host: ``ctx.on_hosts``)."""
    import ray
    from ray.data import ActorPoolStrategy

    from augsbert_ray.artifacts import ship_directory
    from augsbert_ray.candidates.pairs import concat_hits, finalize_candidates
    from augsbert_ray.runtime import dataset_of_blocks, require_resources

    if not ctx.on_hosts:
        require_resources([{"CPU": 1}] * ctx.cfg.searchers, "BM25 search (sampling.searchers, one CPU each)")
    progress = getattr(ctx, "progress", None)
    if progress is not None:
        progress.add_total(ctx.sentences.num_rows, unit="sentences")
    index_dir = build_index(ctx.sentences, ctx.work_dir / "bm25_index")
    if ctx.on_hosts:  # the driver's machine: the host opens the index where it was built
        from augsbert_ray.candidates.hosts import map_on_host

        args = {"index_dir": str(index_dir), "top_k": ctx.cfg.top_k, "progress": progress}
        tables = map_on_host(ctx.hosts, BM25Searcher, args, ctx.sentences, ctx.cfg.query_batch_size, cpus=1, gpus=0,
                             what="BM25 search on a warm host (one CPU)")
        q, h, s = concat_hits(tables)
        return finalize_candidates(q, h, s, ctx.sentences, ctx.gold_keys, origin="bm25")
    hits = dataset_of_blocks(ctx.sentences, ctx.cfg.query_batch_size).map_batches(
        BM25Searcher,
        fn_constructor_kwargs={"index_dir": ship_directory(index_dir), "top_k": ctx.cfg.top_k, "progress": progress},
        compute=ActorPoolStrategy(size=ctx.cfg.searchers),
        batch_size=ctx.cfg.query_batch_size,
        batch_format="pyarrow",
        num_cpus=1,
    )
    q, h, s = concat_hits(ray.get(hits.to_arrow_refs()))
    return finalize_candidates(q, h, s, ctx.sentences, ctx.gold_keys, origin="bm25")

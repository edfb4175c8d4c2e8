"""Random recombination (AugSBERT section 3.1, "Random Sampling (RS)").

Every sentence is paired with partners drawn uniformly from the other sentences. The
paper notes that most such pairs are dissimilar, so RS mainly adds negatives; it is also
the unlabelled pool that KDE selection draws from (section 3.1, "Kernel Density
Estimation"), hence ``sample_random`` takes the per-sentence count and the origin name.

Each sentence's draws come from its own generator seeded with ``(seed, sentence_id)``,
so the result depends only on the seed, never on how Ray cuts the sentences into batches
or how many workers run them.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from augsbert_ray import schema



def _generator(seed: int, sentence_id: int) -> np.random.Generator:
    # SeedSequence wants non-negative entropy; reducing mod 2**64 keeps every int64 seed distinct.
    return np.random.default_rng([int(seed) % 2**64, int(sentence_id)])


def random_partners(sentence_ids: np.ndarray, n_sentences: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Draws ``k`` distinct random partners for each sentence, uniformly among the others.

    A sentence's partners depend only on ``(seed, sentence_id)``, so any split of the
    ids into batches gives the same pairs.

    Args:
        sentence_ids: ids (rows of the job's sentence table) to draw partners for.
        n_sentences: size of the sentence table; partners are drawn from ``range(n_sentences)``.
        k: partners per sentence; capped at ``n_sentences - 1`` (the sentence itself is never drawn).
        seed: the job seed.

    Returns:
        ``(query_ids, partner_ids)``, int64 arrays of equal length, the ``k`` partners of
        each sentence together and in the order of ``sentence_ids``.
    """
    ids = np.asarray(sentence_ids, dtype=np.int64)
    m = max(0, min(int(k), int(n_sentences) - 1))
    if m == 0 or len(ids) == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    partners = np.empty((len(ids), m), dtype=np.int64)
    for row, sid in enumerate(ids.tolist()):
        # Draw among the n - 1 others, then shift past the sentence itself: uniform over
        # the others with no rejection loop, and no self pair by construction.
        draw = _generator(seed, sid).choice(n_sentences - 1, size=m, replace=False)
        partners[row] = draw + (draw >= sid)
    return np.repeat(ids, m), partners.reshape(-1)


# Sentences per drawing task: about a second of draws. A sentence's draws do not depend on its
# block, and Ray's per-task cost would dominate blocks of a query batch's size on a large corpus.
DRAW_BLOCK = 8192


def draw_batch(batch: pa.Table, n_sentences: int, k: int, seed: int, progress=None) -> pa.Table:
    """Ray Data function: the random partners of a batch of sentences, as a hits table (score NaN).
    With ``progress`` (a picklable ``StageProgress``), the batch's sentences are reported."""
    q, h = random_partners(batch.column(schema.SENTENCE_ID).to_numpy(), n_sentences, k, seed)
    if progress is not None:
        progress.advance(batch.num_rows)
        progress.flush()
    return pa.table(
        {"query_id": pa.array(q, pa.int64()), "hit_id": pa.array(h, pa.int64()),
         "score": pa.array(np.full(len(q), np.nan, np.float32), pa.float32())},
        schema=schema.HITS_SCHEMA,
    )


class RandomDrawer:
    """``draw_batch`` as a callable of its settings (a pool's or a warm host's, ``candidates.hosts``)."""

    def __init__(self, n_sentences: int, k: int, seed: int, progress=None):
        self.kwargs = {"n_sentences": n_sentences, "k": k, "seed": seed, "progress": progress}

    def __call__(self, batch: pa.Table) -> pa.Table:
        return draw_batch(batch, **self.kwargs)


def sample_random(ctx, per_sentence: int, origin: str) -> pa.Table:
    """Random candidate pairs for every unique sentence, drawn in Ray Data tasks (or on a warm
    host: ``ctx.on_hosts``).

    Args:
        ctx: a ``SamplingContext`` (sentences, gold keys, seed, progress).
        per_sentence: partners drawn per sentence (before dedupe and gold removal).
        origin: the name written in the ``origin`` column ("rs", or "kde" for its pool).

    Returns:
        ``schema.CANDIDATE_SCHEMA`` rows with a NaN ``retrieval_score``, sorted by (id1, id2).
    """
    import ray

    from augsbert_ray.candidates.pairs import concat_hits, finalize_candidates
    from augsbert_ray.runtime import dataset_of_blocks

    n = ctx.sentences.num_rows
    progress = getattr(ctx, "progress", None)
    if progress is not None:
        progress.add_total(n, unit="sentences")
    # The drawers get the ids alone: a large corpus's texts would otherwise fill the object store
    # for nothing.
    ids = ctx.sentences.select([schema.SENTENCE_ID])
    settings = {"n_sentences": n, "k": per_sentence, "seed": ctx.seed, "progress": progress}
    if ctx.on_hosts:
        from augsbert_ray.candidates.hosts import map_on_host

        tables = map_on_host(ctx.hosts, RandomDrawer, settings, ids, DRAW_BLOCK, cpus=1, gpus=0,
                             what="random draws on a warm host (one CPU)")
        q, h, s = concat_hits(tables)
        return finalize_candidates(q, h, s, ctx.sentences, ctx.gold_keys, origin=origin)
    # Plain tasks: drawing needs no state, so there is nothing for an actor to keep loaded.
    hits = dataset_of_blocks(ids, DRAW_BLOCK).map_batches(
        draw_batch, fn_kwargs=settings, batch_size=DRAW_BLOCK, batch_format="pyarrow", num_cpus=1)
    q, h, s = concat_hits(ray.get(hits.to_arrow_refs()))
    return finalize_candidates(q, h, s, ctx.sentences, ctx.gold_keys, origin=origin)


def sample(ctx) -> pa.Table:
    """RS: ``cfg.random_per_sentence`` random partners for every sentence (origin "rs")."""
    return sample_random(ctx, ctx.cfg.random_per_sentence, origin="rs")

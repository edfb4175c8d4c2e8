"""The Ray edge of labelling: one actor pool of ``PairScorer``s over the pending shards."""

from __future__ import annotations

import warnings

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from augsbert_ray import schema
from augsbert_ray.errors import LabelingError
from augsbert_ray.labeling.codec import tokenize_batch
from augsbert_ray.labeling.scorer import PairScorer, ScorerSpec, pair_scorer_kwargs
from augsbert_ray.labeling.shards import KEY_COLUMNS, SHARD
from augsbert_ray.labeling.sizing import TOKENIZE_CPUS, labelling_requests, pool_size, separate_tokenizer


def run_pool(pending: dict, finished: set, commit, model_dir, cfg, max_length, cpus_per_actor,
             actors: int | None = None, scorer: ScorerSpec | None = None) -> None:
    """One actor pool over the ``pending`` shards; each shard is committed when all its rows are back.

    ``scorer``: the actors' class and arguments (None: ``PairScorer`` of ``model_dir``).

    Raises:
        LabelingError: a shard that comes back twice or with other pairs than it held.
        Exception: whatever ended the pool (actor restarts or task retries exhausted, a lost actor).
    """
    with warnings.catch_warnings():
        # Ray Data takes actor restart limits only through the deprecated **ray_remote_args.
        warnings.filterwarnings("ignore", message=".*ray_remote_args.*deprecated", category=DeprecationWarning)
        labelled = labelled_dataset([p.ref for _, p in sorted(pending.items())], model_dir, cfg, max_length,
                                    cpus_per_actor, actors, scorer)
    partial: dict[int, list[pa.Table]] = {}
    batches = iter(labelled.iter_batches(batch_size=None, batch_format="pyarrow"))  # a generator
    try:
        for batch in batches:
            for i in sorted(set(batch.column(SHARD).to_pylist())):
                if i in finished or i not in pending:
                    raise LabelingError(f"shard {i} came back twice from the actor pool")
                partial.setdefault(i, []).append(batch.filter(pc.equal(batch.column(SHARD), i)))
                if sum(t.num_rows for t in partial[i]) >= pending[i].rows:
                    commit(i, checked_shard(i, pa.concat_tables(partial.pop(i)), pending[i].keys))
    finally:
        # Closing the generator runs Ray Data's clean-up (its own finally shuts the executor
        # and its actor pool down) now; after a failure the error's traceback keeps the
        # generator alive, and that clean-up would wait for garbage collection.
        batches.close()


def checked_shard(i: int, labelled: pa.Table, keys: tuple[np.ndarray, np.ndarray]) -> pa.Table:
    """The shard's labelled rows sorted by (id1, id2), after checking they are exactly its pairs."""
    order = pc.sort_indices(labelled, [(schema.ID1, "ascending"), (schema.ID2, "ascending")])
    labelled = labelled.take(order).drop_columns([SHARD])
    for name, expect in zip(KEY_COLUMNS, keys):
        if not np.array_equal(labelled.column(name).to_numpy(), expect):
            raise LabelingError(f"shard {i}: the labelled pairs differ from the shard's candidates")
    return labelled.cast(schema.SILVER_SCHEMA)


def release_failed_pool(error: BaseException) -> None:
    """Lets Ray end a failed pool's surviving actors now. The error's traceback holds, in its
    frames' local variables and in reference cycles, handles to the pool's actors, and an actor
    lives (holding its CPUs or GPU) while a handle does: until the next full garbage collection,
    which an idle driver may not run for minutes. A new pool would find those CPUs taken.
    Clearing the frames' locals and collecting the cycles drops the handles; the error keeps
    its message and where it was raised. Call it after the except clause that caught the error
    has ended: while the error is being handled, its frames are not released."""
    import gc
    import traceback

    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        traceback.clear_frames(error.__traceback__)
        error = error.__cause__ or error.__context__
    gc.collect()


def labelled_dataset(refs: list, model_dir: str, cfg, max_length: int, cpus_per_actor: float,
                     actors: int | None = None, scorer: ScorerSpec | None = None):
    """The Ray Dataset that labels the shards in ``refs`` (lazy: nothing runs until it is read).

    Args:
        scorer: the actors' class and constructor arguments; None: this module's ``PairScorer``
            (looked up at each call) for the cross-encoder in ``model_dir``.

    Raises:
        AugSBERTError: when the pool cannot run at once on the cluster (``require_resources``).
    """
    import ray
    from ray.data import ActorPoolStrategy

    if actors is None:
        actors = pool_size(cfg, ray.cluster_resources().get("GPU", 0))

    from augsbert_ray.runtime import require_resources

    require_resources(labelling_requests(cfg, actors, cpus_per_actor),
                      "labelling (labeling.actors, labeling.num_cpus, labeling.num_gpus"
                      + (", and one CPU for the tokenising stage ahead of the actors)" if separate_tokenizer(cfg)
                         else ")"))
    ds = ray.data.from_arrow_refs(refs)
    if separate_tokenizer(cfg):
        # Tokenise in CPU tasks ahead of the actors, so a GPU actor only pads and runs the model.
        ds = ds.map_batches(tokenize_batch, fn_kwargs={"model_dir": model_dir, "max_length": max_length},
                            batch_size=cfg.block_size, batch_format="pyarrow", num_cpus=TOKENIZE_CPUS)
    if scorer is None:
        scorer = ScorerSpec(PairScorer, pair_scorer_kwargs(model_dir, cfg, max_length, cpus_per_actor))
    return ds.map_batches(
        scorer.cls,
        fn_constructor_kwargs=dict(scorer.kwargs),
        compute=ActorPoolStrategy(size=actors),
        batch_size=cfg.block_size,
        batch_format="pyarrow",
        num_cpus=cpus_per_actor,
        num_gpus=cfg.num_gpus,
        max_restarts=cfg.max_restarts,
        max_task_retries=cfg.max_task_retries,
    )

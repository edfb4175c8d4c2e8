"""The Ray edge of labelling: one actor pool of ``PairScorer``s over the pending shards."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from augsbert_ray import schema
from augsbert_ray.errors import LabelingError
from augsbert_ray.labeling.codec import tokenize_batch
from augsbert_ray.labeling.scorer import PairScorer, ScorerSpec, pair_scorer_kwargs
from augsbert_ray.labeling.shards import SHARD, file_row_groups, pairs_digest, read_rows
from augsbert_ray.labeling.sizing import TOKENIZE_CPUS, labelling_requests, pool_size, separate_tokenizer

# Reading tasks at once: one decodes about a million pairs a second, four GPU actors' worth at
# 250,000 pairs/s each, so a pool of ``a`` actors gets max(READ_TASKS, ceil(a / ACTORS_PER_READ_TASK)).
READ_TASKS = 2
ACTORS_PER_READ_TASK = 4


def read_tasks(actors: int | None) -> int:
    """Reading tasks that run at once for a pool of ``actors``."""
    return max(READ_TASKS, -(-(actors or 1) // ACTORS_PER_READ_TASK))


# The row groups of a candidates file that this worker process decoded last (``_read_cached``).
_decoded: dict = {}


def _read_cached(path: str, start: int, stop: int) -> pa.Table:
    """Rows ``[start, stop)`` of a Parquet file, through the row groups this process decoded last.

    A reading task takes one shard, and a row group holds many shards: the tasks of a worker
    read shard after shard of the same groups, which would otherwise be decoded once per shard.
    Only the groups of the latest read are kept; a file rewritten since (size or time) is read anew.
    """
    import pyarrow.parquet as pq

    st = os.stat(path)
    key = (path, st.st_size, st.st_mtime_ns)
    if _decoded.get("key") != key:
        _decoded.clear()
        _decoded.update(key=key, groups=file_row_groups(path), tables={})
    kept, used = _decoded["tables"], {}

    def read_group(g: int) -> pa.Table:
        used[g] = kept[g] if g in kept else pq.ParquetFile(path).read_row_group(g, use_threads=False)
        return used[g]

    rows = read_rows(path, start, stop, _decoded["groups"], read_group)
    _decoded["tables"] = used
    return rows


def read_shards(tasks: pa.Table) -> pa.Table:
    """Runs in a Ray Data task: the rows of each task's shards (``FileSource.tasks``), each
    row with its shard's index in ``SHARD``."""
    out = []
    for task in tasks.to_pylist():
        start, stop, size = task["start"], task["stop"], task["block_size"]
        rows = _read_cached(task["path"], start, stop)
        shard = np.arange(start, stop, dtype=np.int64) // size
        rows = rows.cast(schema.decoded(rows.schema)).append_column(SHARD, pa.array(shard))
        out.append(rows.filter(pa.array(np.isin(shard, task["shards"]))))
    return pa.concat_tables(out)


@dataclass(frozen=True)
class FileSource:
    """Pending shards that Ray Data tasks read from the candidates file themselves, on the
    driver's node (where the file is) or on every node of ``readers`` (the nodes that see the
    same file: a shared file system), instead of the driver putting every shard in the object
    store before the pool starts. Shard ``i`` is rows ``[i * block_size, i * block_size + rows)``.
    """

    path: str
    block_size: int
    node_id: str
    readers: tuple[str, ...] = ()

    def selector(self) -> dict:
        """Where its reading tasks may run (a Ray label selector)."""
        nodes = self.readers if len(self.readers) > 1 else (self.node_id,)
        return {"ray.io/node-id": nodes[0] if len(nodes) == 1 else f"in({', '.join(nodes)})"}

    read = staticmethod(read_shards)

    def tasks(self, pending: dict) -> list[dict]:
        """Reading tasks over the pending shards, in order, one shard each: Ray Data hands an
        actor a task's rows as one block and the actor's labels come back as one block, so a
        shard per task is what lets each shard be committed on its own (``block_size``), as soon
        as it is labelled."""
        return self.tasks_for({i: p.rows for i, p in pending.items()})

    def tasks_for(self, rows: dict[int, int], per_task: int = 1) -> list[dict]:
        """``tasks`` for shards given as index -> rows, up to ``per_task`` consecutive shards a task."""
        out: list[dict] = []
        for i in sorted(rows):
            last = out[-1] if out else None
            if last is not None and len(last["shards"]) < per_task and last["shards"][-1] == i - 1:
                last["shards"].append(i)
                last["stop"] = i * self.block_size + rows[i]
            else:
                out.append({"path": self.path, "block_size": self.block_size, "shards": [i],
                            "start": i * self.block_size, "stop": i * self.block_size + rows[i]})
        return out

    def block(self, pending) -> pa.Table:
        """One pending shard (a ``driver._Pending``) with its ``SHARD`` column, read alone."""
        start = pending.index * self.block_size
        rows = read_rows(self.path, start, start + pending.rows)
        return rows.cast(schema.decoded(rows.schema)).append_column(
            SHARD, pa.array(np.full(pending.rows, pending.index, np.int64)))


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
        labelled = labelled_dataset(pool_input(pending), model_dir, cfg, max_length, cpus_per_actor, actors, scorer)
    partial: dict[int, list[pa.Table]] = {}
    batches = iter(labelled.iter_batches(batch_size=None, batch_format="pyarrow"))  # a generator
    try:
        for batch in batches:
            for i in sorted(set(batch.column(SHARD).to_pylist())):
                if i in finished or i not in pending:
                    raise LabelingError(f"shard {i} came back twice from the actor pool")
                partial.setdefault(i, []).append(batch.filter(pc.equal(batch.column(SHARD), i)))
                if sum(t.num_rows for t in partial[i]) >= pending[i].rows:
                    commit(i, checked_shard(i, pa.concat_tables(partial.pop(i)), pending[i].pairs))
    finally:
        # Closing the generator runs Ray Data's clean-up (its own finally shuts the executor
        # and its actor pool down) now; after a failure the error's traceback keeps the
        # generator alive, and that clean-up would wait for garbage collection.
        batches.close()


# Most shards, and most pairs, a reading task (and so an actor's task) takes where actors commit
# their shards: the driver's work is per task, and a task's pairs are one block in memory.
MAX_SHARDS_PER_TASK = 64
MAX_PAIRS_PER_TASK = 64 * 8192
# Fewest tasks per actor before shards are grouped: the last wave of tasks is then at most
# about 1/TASKS_PER_ACTOR of an actor's work, so grouping does not leave GPUs idle at the end.
TASKS_PER_ACTOR = 8


def shards_per_task(pending: int, actors: int, block_size: int = 8192) -> int:
    """Shards per reading task where the actors commit: one while there are few (each shard's
    record reaches the driver as soon as it is committed), up to ``MAX_SHARDS_PER_TASK`` (and
    ``MAX_PAIRS_PER_TASK`` pairs) where every actor has many, since the driver's scheduling is
    per task, not per shard. An actor still labels and commits one shard per call (its batches
    are ``labeling.block_size`` rows)."""
    most = max(1, min(MAX_SHARDS_PER_TASK, MAX_PAIRS_PER_TASK // max(1, block_size)))
    return max(1, min(most, pending // (TASKS_PER_ACTOR * max(1, actors))))


def run_committing_pool(source: FileSource, pending: dict[int, int], actors_spec: ScorerSpec, on_record, model_dir,
                        cfg, max_length, cpus_per_actor, actors: int | None = None) -> None:
    """One actor pool over the ``pending`` shards of a candidates file (index -> rows), its actors
    ``actors_spec`` (``commit.committing_spec``: a scorer that commits the shards it labels);
    ``on_record(record)`` is called with each shard's commit record (``commit.RECORD_SCHEMA``)
    as it comes back.

    Raises:
        Exception: whatever ended the pool (actor restarts or task retries exhausted, a lost actor).
    """
    tasks = source.tasks_for(pending, shards_per_task(len(pending), actors or 1, source.block_size))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*ray_remote_args.*deprecated", category=DeprecationWarning)
        records = labelled_dataset((source, tasks), model_dir, cfg, max_length, cpus_per_actor, actors, actors_spec)
    batches = iter(records.iter_batches(batch_size=None, batch_format="pyarrow", prefetch_batches=0))
    try:
        for batch in batches:
            for record in batch.to_pylist():
                on_record(record)
    finally:
        batches.close()  # Ray Data's clean-up now (see run_pool)


def pool_input(pending: dict):
    """What the pool reads: the shards' source (a ``FileSource`` or a ``spool.SpoolSource``) with
    its reading tasks where every pending shard lies in one (``_Pending.source``), else their
    object references."""
    sources = {p.source for p in pending.values()}
    if len(sources) == 1 and None not in sources:
        source = sources.pop()
        return source, source.tasks(pending)
    import ray

    return [p.ref if p.ref is not None else ray.put(p.block()) for _, p in sorted(pending.items())]


def input_dataset(inputs, actors: int | None = None):
    """The Ray Dataset of pending shards (``pool_input``), read by ``read_tasks(actors)`` tasks at once."""
    import ray

    if isinstance(inputs, tuple):
        source, tasks = inputs
        selector = source.selector() if isinstance(source, FileSource) else {"ray.io/node-id": source.node_id}
        return ray.data.from_items(tasks, override_num_blocks=len(tasks)).map_batches(
            source.read, batch_size=1, batch_format="pyarrow", num_cpus=0,
            compute=ray.data.TaskPoolStrategy(size=read_tasks(actors)), label_selector=selector)
    return ray.data.from_arrow_refs(inputs)


def checked_shard(i: int, labelled: pa.Table, pairs: str) -> pa.Table:
    """The shard's labelled rows sorted by (id1, id2), after checking they are exactly its pairs
    (``pairs``: the shard's ``shards.pairs_digest``)."""
    order = pc.sort_indices(labelled, [(schema.ID1, "ascending"), (schema.ID2, "ascending")])
    labelled = labelled.take(order).drop_columns([SHARD])
    if pairs_digest(labelled) != pairs:
        raise LabelingError(f"shard {i}: the labelled pairs differ from the shard's candidates")
    require_finite_scores(i, labelled)
    return labelled.cast(schema.SILVER_SCHEMA)


def require_finite_scores(i: int, labelled: pa.Table) -> None:
    """A shard's scores are all finite numbers: a NaN or infinite score (a model whose weights
    are not, or that overflows in its precision) is never committed, trained on or shipped.

    Raises:
        LabelingError: naming the shard, how many scores are not finite and the first pair's ids.
    """
    scores = labelled.column(schema.LABEL).to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
    bad = ~np.isfinite(scores)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        pair = (labelled.column(schema.ID1)[first].as_py(), labelled.column(schema.ID2)[first].as_py())
        raise LabelingError(
            f"shard {i}: the cross-encoder gave {int(bad.sum())} of {labelled.num_rows} pairs a score that is not a "
            f"finite number ({scores[first]} for the pair with ids {pair}); its weights are NaN or infinite (a training "
            "that diverged) or overflow in labeling.precision; nothing of the shard is committed")


def release_failed_pool(error: BaseException, actor_class: str | None = None) -> None:
    """Ends a failed pool's surviving actors now, so that a new pool finds their CPUs and GPUs free.

    Ray Data lets a failed pool's actors go by dropping its handles to them, and an actor
    lives (holding its CPUs or GPU) while a handle does. The error's traceback holds such
    handles, in its frames' local variables and in reference cycles, until the next full
    garbage collection, which an idle driver may not run for minutes: its frames' locals are
    cleared and the cycles collected (the error keeps its message and where it was raised).
    Callbacks that Ray's core still holds for the pool's last tasks keep other handles, out of
    the collector's reach: the actors of ``actor_class`` that this process still has handles to
    are killed. Call it after the except clause that caught the error has ended (while the
    error is being handled, its frames are not released), and only between pools: one pool of
    ``actor_class`` at a time runs in a driver.
    """
    import gc
    import traceback

    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        traceback.clear_frames(error.__traceback__)
        error = error.__cause__ or error.__context__
    gc.collect()
    if actor_class is not None:
        import ray

        for actor in pool_actors(actor_class):
            ray.kill(actor, no_restart=True)


def pool_actors(actor_class: str) -> list:
    """The handles this process holds to actor-pool actors of ``actor_class`` (Ray Data names
    each ``MapWorker(MapBatches(<class>))``, with the operators fused into it)."""
    import gc

    from ray.actor import ActorHandle

    from augsbert_ray.runtime.ray_private import actor_class_name

    out = []
    for obj in gc.get_objects():
        # the type, not isinstance: that would read __class__ of every object (lazy modules warn)
        if issubclass(type(obj), ActorHandle):
            name = actor_class_name(obj)
            if name.startswith("MapWorker(") and f"MapBatches({actor_class})" in name:
                out.append(obj)
    return out


def labelled_dataset(inputs, model_dir: str, cfg, max_length: int, cpus_per_actor: float,
                     actors: int | None = None, scorer: ScorerSpec | None = None):
    """The Ray Dataset that labels the pending shards (lazy: nothing runs until it is read).

    Args:
        inputs: the shards' object references, or their source and its reading tasks
            (``pool_input``).
        scorer: the actors' class and constructor arguments; None: this module's ``PairScorer``
            (looked up at each call) for the cross-encoder in ``model_dir``.

    Raises:
        AugSBERTError: when the pool cannot run at once on the cluster (``require_resources``).
    """
    import ray
    from ray.data import ActorPoolStrategy

    if actors is None:
        res = ray.cluster_resources()
        actors = pool_size(cfg, res.get("GPU", 0), res.get("CPU", 0))

    from augsbert_ray.runtime import require_resources

    require_resources(labelling_requests(cfg, actors, cpus_per_actor),
                      "labelling (labeling.actors, labeling.num_cpus, labeling.num_gpus"
                      + (", and one CPU for the tokenising stage ahead of the actors)" if separate_tokenizer(cfg)
                         else ")"))
    ds = input_dataset(inputs, actors)
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

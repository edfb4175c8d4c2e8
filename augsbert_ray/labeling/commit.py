"""Shards committed where they are labelled: the labelling actor checks and writes its own shards.

With a candidates file and a ``ShardStore`` whose folder the workers see (a shared file system,
or the driver's node), every labelled shard would otherwise travel to the driver, which would
check it, write its Parquet file, hash it and write its manifest: per-shard work in one process
that does not spread over the cluster's nodes. Here each actor of the pool wraps its scorer
(``CommittingScorer``): it keeps the shard's input pairs beside their labels, checks the labels
against them (the same pairs, once each; finite scores: ``pool.checked_shard``), commits the
shard to the store (``ShardStore.commit``, recording its node) and hands the driver one row per
shard: its index, rows, input digest and file sha256 (``RECORD_SCHEMA``, well under 1 KiB). An
actor that does not see the store (a folder on another node's disk; a storage its node cannot
open) sends the checked shard in that row instead, and the driver commits it. With a store on
object storage (``s3://``, ...: ``store.UriShardStore``), every actor that can open it commits
there: a shard's bytes go from the node that labelled it to the storage, not through the driver.

A re-run verifies the shards an earlier run committed in Ray tasks beside the file
(``verify_committed``): each reads its shards' input rows, digests them and checks their
manifests and files, so the driver neither reads nor hashes a shard.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from augsbert_ray.errors import LabelingError
from augsbert_ray.labeling.shards import SHARD, keys_digest, pairs_digest
from augsbert_ray.labeling.store import ShardStore, sees_store

# What an actor returns per shard: a commit record; ``table`` holds the checked shard (Arrow IPC)
# only where the actor could not write to the store itself.
RECORD_SCHEMA = pa.schema([("shard", pa.int64()), ("rows", pa.int64()), ("input", pa.string()),
                           ("sha256", pa.string()), ("writer", pa.string()), ("table", pa.binary())])


# Calls a committing actor runs at once: one labelling while the other checks and commits.
COMMITTING_CALLS = 2


@dataclass(frozen=True)
class StoreTarget:
    """What an actor needs to commit shards of a file's candidates: the store's location (a folder,
    or a storage URI: ``ShardStore.location``), the token that shows it sees it
    (``ShardStore.open_for_workers``), and the shards' sizes (shard ``i`` holds rows
    ``[i * block_size, min((i + 1) * block_size, total))``)."""

    root: str
    token: str
    block_size: int
    total: int

    def rows(self, i: int) -> int:
        return max(0, min(self.block_size, self.total - i * self.block_size))


def encode(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def decode(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


class CommittingScorer:
    """Ray Data callable: the pool's scorer, and each shard it labels checked and committed here.

    A shard's rows may reach the actor over several calls (Ray Data batches a task's blocks by
    ``labeling.block_size``): they are kept until the shard is whole, and the call that completes
    it commits it; the other calls return no row. All the blocks of a task go to one actor, and a
    task that fails is redone whole, so the pieces kept of the failed call's shards are dropped.

    The actor runs ``COMMITTING_CALLS`` calls at once (``committing_spec``): the scorer labels one
    batch at a time (a lock), and a shard's check and commit (Parquet, hashing, the storage's
    writes) run beside the next batch's labelling, so a GPU does not wait for the writes.
    """

    def __init__(self, scorer_cls, scorer_kwargs: dict, target: StoreTarget):
        import threading

        import ray

        self.scorer = scorer_cls(**scorer_kwargs)
        self.target = target
        self.store = ShardStore(target.root) if sees_store(target.root, target.token) else None
        self.node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
        self._inputs: dict[int, list[pa.Table]] = {}
        self._labelled: dict[int, list[pa.Table]] = {}
        self._scoring = threading.Lock()  # the scorer (a model, a tokenizer) labels one batch at a time
        self._held = threading.Lock()  # the pieces of shards kept between calls

    def __call__(self, batch: pa.Table) -> pa.Table:
        try:
            return self._label(batch)
        except BaseException:
            with self._held:
                for i in set(batch.column(SHARD).to_pylist()):
                    self._inputs.pop(i, None)
                    self._labelled.pop(i, None)
            raise

    def _label(self, batch: pa.Table) -> pa.Table:
        from augsbert_ray import schema
        from augsbert_ray.labeling.pool import checked_shard

        keys = batch.select([schema.ID1, schema.ID2, schema.SENTENCE1, schema.SENTENCE2, SHARD])
        done = self._committed_before(keys)
        if done is not None:
            return pa.Table.from_pylist([done], schema=RECORD_SCHEMA)
        with self._scoring:
            labelled = self.scorer(batch)
        records = []
        shard_of = batch.column(SHARD).to_numpy()
        for i in np.unique(shard_of).tolist():
            mine = pc.equal(keys.column(SHARD), i)
            want = self.target.rows(i)
            with self._held:
                self._inputs.setdefault(i, []).append(keys.filter(mine))
                self._labelled.setdefault(i, []).append(labelled.filter(pc.equal(labelled.column(SHARD), i)))
                held = sum(t.num_rows for t in self._inputs[i])
                if held < want:
                    continue
                inputs, outputs = self._inputs.pop(i), self._labelled.pop(i)
            rows = pa.concat_tables(inputs).drop_columns([SHARD])
            out = pa.concat_tables(outputs)
            if held > want:
                raise LabelingError(f"shard {i} reached a labelling actor with {held} rows, {want} expected")
            digest = keys_digest(rows)
            table = checked_shard(i, out, pairs_digest(rows))  # the same pairs, once each; finite scores
            if self.store is not None:
                record = self.store.commit(i, table, digest, writer=self.node)
                records.append({"shard": i, "rows": table.num_rows, "input": digest, "sha256": record["sha256"],
                                "writer": self.node, "table": None})
            else:
                records.append({"shard": i, "rows": table.num_rows, "input": digest, "sha256": None,
                                "writer": self.node, "table": encode(table)})
        return pa.Table.from_pylist(records, schema=RECORD_SCHEMA)

    def _committed_before(self, keys: pa.Table) -> dict | None:
        """The record of a batch that is one whole shard this store holds already (a task retried
        after its shard was committed, or a pool after one whose record never reached the
        driver): it is not labelled or written again. None otherwise."""
        if self.store is None or keys.num_rows == 0:
            return None
        i = keys.column(SHARD)[0].as_py()
        if keys.num_rows != self.target.rows(i) or i in self._inputs or not self.store.has_manifest(i):
            return None
        rows = keys.drop_columns([SHARD])
        digest = keys_digest(rows)
        record = self.store.verified(i, digest) if pc.all(pc.equal(keys.column(SHARD), i)).as_py() else None
        if record is None:
            return None
        return {"shard": i, "rows": rows.num_rows, "input": digest, "sha256": record.get("sha256"),
                "writer": record.get("writer"), "table": None}


def committing_spec(scorer, target: StoreTarget):
    """The ``ScorerSpec`` of actors that run ``scorer`` (a ``ScorerSpec``) and commit its shards."""
    from augsbert_ray.labeling.scorer import ScorerSpec

    return ScorerSpec(CommittingScorer, {"scorer_cls": scorer.cls, "scorer_kwargs": dict(scorer.kwargs),
                                         "target": target}, concurrent_calls=COMMITTING_CALLS)


# -- a re-run: which of the shards with a manifest are done ------------------------------------
# Shards per verifying task: enough that a task's start is small beside reading and hashing them.
VERIFY_SHARDS = 64
VERIFY_TASKS = 4  # verifying tasks at once


def _verify(path: str, root: str, block_size: int, total: int, shards: list[int]) -> list[int]:
    """Runs in a Ray task: those of ``shards`` whose manifest matches their input rows in the file
    and whose file matches their manifest (``root``: the store's folder or storage URI)."""
    from augsbert_ray import schema
    from augsbert_ray.labeling.pool import _read_cached

    store, done = ShardStore(root), []
    for i in shards:
        start = i * block_size
        rows = _read_cached(path, start, min(start + block_size, total))
        if store.done(i, keys_digest(rows.cast(schema.decoded(rows.schema)))):
            done.append(i)
    return done


def verify_committed(path: str, store: ShardStore, block_size: int, total: int, node_id: str | None) -> set[int]:
    """The shards that an earlier run committed to ``store`` for the candidates in ``path``, verified
    in Ray tasks on the node ``node_id`` (where the file is; None: anywhere) rather than by the driver.

    Only shards with a manifest are read (``ShardStore.committed``): on a first run, none.
    """
    import ray

    count = -(-total // block_size)
    listed = sorted(i for i in store.committed() if i < count)
    if not listed:
        return set()
    # No CPU reserved, as the pool's reading tasks: the file's node may have none to give (a head
    # node started with --num-cpus=0); a few tasks at a time instead.
    options = {"num_cpus": 0}
    if node_id is not None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id, soft=False)
    task = ray.remote(_verify).options(**options)
    chunks = [listed[at:at + VERIFY_SHARDS] for at in range(0, len(listed), VERIFY_SHARDS)]
    done, running = set(), []
    while chunks or running:
        while chunks and len(running) < VERIFY_TASKS:
            running.append(task.remote(path, store.location, block_size, total, chunks.pop(0)))
        ready, running = ray.wait(running, num_returns=1)
        done.update(ray.get(ready[0]))
    return done

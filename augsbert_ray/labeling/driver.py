"""The labelling driver: candidates in, silver pairs out, every shard labelled exactly once.

It cuts the candidates into shards, skips those a ``ShardStore`` already holds, hands the
rest to an actor pool (``pool.run_pool``; small sets within a job go to the job's warm hosts,
``hosts.run_on_hosts``), commits each shard as it comes back, and tries again when an attempt
fails, up to ``labeling.pool_retries``.

From a candidates file (``label_candidates_file``) the driver does less: the shards' bounds
come from the file's footer, a re-run's committed shards are verified in Ray tasks, and each
actor checks and commits the shards it labels (``commit``, ``pool.run_committing_pool``): the
driver receives one small record per shard and keeps a few bytes per pending shard.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from augsbert_ray import schema, signals
from augsbert_ray.errors import DiskFullError, LabelingError
from augsbert_ray.labeling.pool import FileSource, release_failed_pool, run_pool
from augsbert_ray.labeling.shards import SHARD, ShardStore, file_shards, keys_digest, pairs_digest, table_shards
from augsbert_ray.labeling.spool import ShardSpool, SpoolSource
from augsbert_ray.progress.ray_logs import describe_error

log = logging.getLogger(__name__)


@dataclass
class LabelingReport:
    """What a labelling run did: shards in all, reused from an earlier run, labelled now."""

    shards: int = 0
    reused: int = 0
    labelled: int = 0
    labelled_pairs: int = 0
    seconds: float = 0.0
    # From the start of labelling to the first shard back: the pipeline's fixed cost (actors
    # started, models loaded, the first batch tokenised), paid whatever the number of pairs.
    first_shard_seconds: float | None = None
    redone_shards: list = field(default_factory=list)  # labelled now (their indices)


def label_candidates(candidates: pa.Table, model_dir: str, cfg, max_length: int, cpus_per_actor: float,
                     store: ShardStore | None = None, on_commit=None,
                     report: LabelingReport | None = None, actors: int | None = None, progress=None,
                     scorer=None, hosts=None) -> pa.Table:
    """Labels candidates with an actor pool of cross-encoders, shard by shard, exactly once.

    The candidates are cut into shards of ``cfg.block_size`` rows; each shard is one Ray Data
    block handed to an actor. With a ``store``, every shard is committed as soon as its labels
    reach the driver, and the shards an earlier run committed are not labelled again: a job
    killed mid-labelling redoes only the shards that were in flight. An actor that dies is
    restarted by Ray and its batch redone; the driver checks every shard's rows against its
    input, so a pair is never lost or doubled. (``label_candidates_file`` does the same from
    and to Parquet files without holding the pairs in memory.)

    Args:
        candidates: ``schema.CANDIDATE_SCHEMA`` rows.
        model_dir: the trained cross-encoder (a path or a shipped model).
        cfg: ``config.LabelingConfig`` (actors, GPUs, batch sizes, retry limits).
        max_length: token limit of a pair.
        cpus_per_actor: CPUs reserved per actor (and torch threads it uses).
        store: where shards are committed (None: in memory only).
        on_commit: called after each committed shard (e.g. to upload it).
        report: filled with shard counts and timings.
        actors: the pool's size (None: ``pool_size(cfg, <the cluster's GPUs>)``).
        progress: a ``progress.StageProgress`` (None: none): the pairs to label in all, then
            the pairs of each committed shard (a reused shard's at the start). With it, the
            periodic "k/n shards labelled" lines are left to the display.
        scorer: the actors' class and arguments (``scorer.ScorerSpec``; None: ``PairScorer``
            of ``model_dir``).
        hosts: the job's warm hosts where they serve it (``JobContext.hosts_serving``): small sets
            are labelled on them (``labeling.executor``); None: always an actor pool.

    Returns:
        ``schema.SILVER_SCHEMA`` rows sorted by (id1, id2): one per candidate.
    """
    if candidates.num_rows == 0:
        return schema.empty_table(schema.SILVER_SCHEMA)
    done: dict[int, pa.Table] = {}
    count = _label(table_shards(candidates, cfg.block_size), done, model_dir, cfg, max_length, cpus_per_actor,
                   store, on_commit, report, actors, progress, scorer, hosts=hosts)
    silver = pa.concat_tables([done[i] for i in range(count)]).cast(schema.SILVER_SCHEMA)
    silver = silver.take(pc.sort_indices(silver, [(schema.ID1, "ascending"), (schema.ID2, "ascending")]))
    if silver.num_rows != candidates.num_rows:  # every candidate gets exactly one label
        raise LabelingError(f"labelling returned {silver.num_rows} rows for {candidates.num_rows} candidates")
    return silver


def label_candidates_file(candidates_path, silver_path, model_dir: str, cfg, max_length: int,
                          cpus_per_actor: float, store: ShardStore, on_commit=None,
                          report: LabelingReport | None = None, actors: int | None = None,
                          progress=None, scorer=None, hosts=None) -> int:
    """``label_candidates`` from a Parquet file of candidates to a Parquet file of silver pairs.

    The driver neither reads nor holds the shards while they are labelled: their bounds come
    from the file's footer, the pool's Ray Data tasks read them from the file, on the driver's
    node, as the actors are ready for them, and each actor checks the shards it labels against
    their input and commits them to ``store`` itself (``commit.CommittingScorer``; an actor on a
    node that does not see the store's folder sends its shards to the driver, which commits
    them). A re-run verifies the shards committed before in Ray tasks (``commit.verify_committed``).
    Small sets labelled on the job's warm hosts, and runs through Ray Client (whose driver is
    on no node of the cluster), are cut and committed by the driver, as ``label_candidates``
    does. ``silver_path`` is then written from the committed shards one at a time (under a
    temporary name, then renamed).
    Rows keep the candidates' order, so candidates sorted by (id1, id2), as every sampler
    writes them, give silver pairs sorted the same way.

    Returns:
        The number of silver rows written: one per candidate.
    """
    import pyarrow.parquet as pq

    total = pq.ParquetFile(candidates_path).metadata.num_rows
    count = label_file(candidates_path, store, model_dir, cfg, max_length, cpus_per_actor, on_commit, report, actors,
                       progress, scorer, hosts)
    out = Path(silver_path)
    tmp = out.with_name(f".{out.name}.tmp")
    written = 0
    with pq.ParquetWriter(tmp, schema.SILVER_SCHEMA) as writer:
        for i in range(count):
            part = store.read(i).cast(schema.SILVER_SCHEMA)
            written += part.num_rows
            writer.write_table(part)
    if written != total:  # every candidate gets exactly one label
        tmp.unlink(missing_ok=True)
        raise LabelingError(f"labelling returned {written} rows for {total} candidates in {candidates_path}")
    os.replace(tmp, out)
    return written


def label_file(candidates_path, store: ShardStore, model_dir: str, cfg, max_length: int, cpus_per_actor: float,
               on_commit=None, report: LabelingReport | None = None, actors: int | None = None, progress=None,
               scorer=None, hosts=None) -> int:
    """Labels a Parquet file of candidates into ``store``'s shards, each committed once
    (``label_candidates_file`` without the silver file; see there).

    Returns:
        The number of shards.
    """
    import pyarrow.parquet as pq

    from augsbert_ray.labeling.hosts import use_hosts

    total = pq.ParquetFile(candidates_path).metadata.num_rows
    source = file_source(candidates_path, cfg)
    if source is None or not hasattr(store, "open_for_workers") or use_hosts(cfg.executor, total, hosts is not None):
        return _label(file_shards(candidates_path, cfg.block_size), None, model_dir, cfg, max_length, cpus_per_actor,
                      store, on_commit, report, actors, progress, scorer, source=source, hosts=hosts)
    return _label_committing(source, total, store, model_dir, cfg, max_length, cpus_per_actor, on_commit, report,
                             actors, progress, scorer)


def _label_committing(source: FileSource, total: int, store: ShardStore, model_dir, cfg, max_length, cpus_per_actor,
                      on_commit, report, actors, progress, scorer) -> int:
    """``label_file`` with the shards committed by the actors that label them."""
    import ray

    from augsbert_ray.labeling.commit import StoreTarget, committing_spec, decode, verify_committed
    from augsbert_ray.labeling.pool import run_committing_pool

    report = report if report is not None else LabelingReport()
    size = cfg.block_size
    count = -(-total // size)
    target = StoreTarget(str(store.root.resolve()), store.open_for_workers(), size, total)
    verified = verify_committed(source.path, store, size, total, source.node_id)
    pending = {i: target.rows(i) for i in range(count) if i not in verified}  # index -> rows: all the driver keeps
    report.shards, report.reused = count, len(verified)
    if verified:
        log.info(f"[silver] {len(verified)} of {count} shards labelled by an earlier run; {len(pending)} to label")
    if progress is not None:
        progress.set_total(total, unit="pairs")
        progress.update(total - sum(pending.values()))
    driver_node = ray.get_runtime_context().get_node_id()
    t0 = time.perf_counter()
    last_log = [t0]

    def on_record(record: dict) -> None:
        i = record["shard"]
        if i not in pending:
            raise LabelingError(f"shard {i} came back twice from the actor pool")
        if record["rows"] != pending[i]:
            raise LabelingError(f"shard {i} came back with {record['rows']} rows, {pending[i]} expected")
        if record["table"] is not None:  # its actor did not see the store's folder
            store.commit(i, decode(record["table"]), record["input"], writer=driver_node)
        if on_commit is not None:
            on_commit()
        rows = pending.pop(i)
        report.labelled += 1
        if report.first_shard_seconds is None:
            report.first_shard_seconds = time.perf_counter() - t0
        report.labelled_pairs += rows
        report.redone_shards.append(i)
        if progress is not None:
            progress.advance(rows)
        now = time.perf_counter()
        if (progress is None and now - last_log[0] > 10) or not pending:
            last_log[0] = now
            log.info(f"[silver] {count - len(pending)}/{count} shards labelled "
                     f"({report.labelled_pairs / (now - t0):.1f} pairs/s)")

    def attempt() -> None:
        from augsbert_ray.labeling import pool as actor_pool
        from augsbert_ray.labeling.scorer import ScorerSpec, pair_scorer_kwargs

        # PairScorer looked up at each attempt, as the pool does (tests put a failing one in its place)
        inner = scorer or ScorerSpec(actor_pool.PairScorer,
                                     pair_scorer_kwargs(model_dir, cfg, max_length, cpus_per_actor))
        run_committing_pool(source, pending, committing_spec(inner, target), on_record, model_dir, cfg, max_length,
                            cpus_per_actor, actors)

    _attempts(attempt, pending, count, cfg, store, "CommittingScorer")
    report.seconds = time.perf_counter() - t0
    return count


def _attempts(run_once, pending: dict, count: int, cfg, store, actor_class: str) -> None:
    """Runs ``run_once`` (one pool over the ``pending`` shards, which it empties as they are
    committed) until no shard is pending, starting a new pool after a failed one up to
    ``labeling.pool_retries`` times.

    Raises:
        LabelingError: the retries are spent (naming the settings and the error), or a pool ended
            with shards pending; a ``LabelingError`` or ``DiskFullError`` from the pool at once.
        signals.Interrupted: the job is stopping.
    """
    attempt = 0
    while pending:
        failure = None
        try:
            run_once()
        except (LabelingError, DiskFullError):  # a new pool would meet them again
            raise
        except Exception as e:  # actor restarts or task retries exhausted, a lost actor, the pool failed
            failure = e
        if failure is not None:  # handled out here: within the except clause, see release_failed_pool
            release_failed_pool(failure, actor_class)
            if signals.stopping():  # the pool failed because the job is stopping: no new pool
                raise signals.Interrupted(signals.received()) from None
            why = describe_error(failure)
            if attempt < cfg.pool_retries:
                attempt += 1
                log.info(f"[silver] the actor pool failed ({why[:300]}); a new pool labels the {len(pending)} shards "
                         f"not committed (retry {attempt} of labeling.pool_retries={cfg.pool_retries})")
                continue
            committed = count - len(pending)
            where = f"; the {committed} committed shards in {store.root} are kept and a re-run resumes from them" \
                if store is not None and committed else ""
            raise LabelingError(
                f"labelling failed with {len(pending)} of {count} shards not labelled (labeling.max_restarts="
                f"{cfg.max_restarts}, max_task_retries={cfg.max_task_retries}, pool_retries={cfg.pool_retries})"
                f"{where}: {why}") from failure
        if pending:
            raise LabelingError(f"shards {sorted(pending)} came back incomplete from the actor pool")


def label_shards(shards, model_dir, cfg, max_length: int, cpus_per_actor: float, store: ShardStore,
                 report: LabelingReport | None = None, actors: int | None = None, progress=None,
                 scorer=None, spool: str | os.PathLike | None = None) -> int:
    """``label_candidates`` for candidate shards made elsewhere (``augsbert label``'s pair files):
    each shard is committed to ``store`` under its index, none is kept in memory.

    Args:
        shards: ``schema.CANDIDATE_SCHEMA`` tables, read lazily; shard ``i`` is the ``i``-th.
        store: where shards are committed; shards it holds already are not labelled again.
        spool: a folder on the driver's disk where the pending shards wait for the pool
            (``spool.ShardSpool``; emptied first, removed at the end); None, or with Ray
            Client, whose driver is on no node of the cluster: Ray's object store.
        (the rest as ``label_candidates``)

    Returns:
        The number of shards.
    """
    spooled = _open_spool(spool)
    try:
        return _label(shards, None, model_dir, cfg, max_length, cpus_per_actor, store, None, report, actors,
                      progress, scorer, spool=spooled)
    finally:
        if spooled is not None:
            spooled.close()


def _run_attempt(pending, finished, commit, model_dir, cfg, max_length, cpus_per_actor, actors, scorer,
                 hosts) -> None:
    """One attempt at the pending shards: on ``hosts`` (the job's warm hosts, where they serve it)
    where ``labeling.hosts.use_hosts`` says so, else in a new actor pool."""
    import ray

    from augsbert_ray.labeling import hosts as warm, pool as actor_pool
    from augsbert_ray.labeling.scorer import ScorerSpec, pair_scorer_kwargs
    from augsbert_ray.labeling.sizing import pool_size, separate_tokenizer

    gpus = ray.cluster_resources().get("GPU", 0)
    if warm.use_hosts(cfg.executor, sum(p.rows for p in pending.values()), hosts is not None):
        # PairScorer looked up at each call, as the pool does (tests put a failing one in its place)
        spec = scorer or ScorerSpec(actor_pool.PairScorer, pair_scorer_kwargs(model_dir, cfg, max_length, cpus_per_actor))
        tokenize = {"model_dir": model_dir, "max_length": max_length} if separate_tokenizer(cfg) else None
        warm.run_on_hosts(pending, commit, spec, cfg, cpus_per_actor,
                          actors if actors is not None else pool_size(cfg, gpus), hosts, tokenize)
    else:
        run_pool(pending, finished, commit, model_dir, cfg, max_length, cpus_per_actor, actors, scorer)


def _actor_class(scorer) -> str:
    """The class name of the pool's actors (``PairScorer`` looked up at each call, as the pool does)."""
    from augsbert_ray.labeling import pool as actor_pool

    return (scorer.cls if scorer is not None else actor_pool.PairScorer).__name__


def file_source(path, cfg) -> FileSource | None:
    """Where the pool's tasks can read the candidates file's shards themselves: on the driver's
    node, and on every other node that sees the same file (``nodes_that_see``). None with Ray
    Client, whose driver (and file) is on no node of the cluster."""
    import ray

    if ray.util.client.ray.is_connected():
        return None
    path = str(Path(path).resolve())
    node = ray.get_runtime_context().get_node_id()
    return FileSource(path, cfg.block_size, node, tuple(nodes_that_see(path, node)))


def _file_identity(path: str) -> tuple[int, str] | None:
    """A file's size and the sha256 of its last 64 KiB (a Parquet file's footer); None if unreadable."""
    import hashlib

    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - 65_536))
            return size, hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def nodes_that_see(path: str, driver_node: str, timeout_s: float = 30.0) -> list[str]:
    """The alive nodes on which ``path`` is the driver's file (its size and footer): the driver's
    node, and the others where the file is on a shared file system. A node that does not answer
    within ``timeout_s`` is left out."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive") and n["NodeID"] != driver_node]
    if not nodes:
        return [driver_node]
    mine = _file_identity(path)
    probe = ray.remote(num_cpus=0, max_retries=0)(_file_identity)
    refs = {probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote(path): n
            for n in nodes}
    ready, late = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    for ref in late:
        ray.cancel(ref, force=True)
    seen = [driver_node]
    for ref in ready:
        try:
            if ray.get(ref) == mine and mine is not None:
                seen.append(refs[ref])
        except Exception:  # a node that failed the probe reads nothing
            continue
    return seen


@dataclass
class _Pending:
    ref: object | None  # the shard (with its SHARD column) in the object store; None: read from ``source``
    pairs: str  # its pairs' ``pairs_digest``, to check what comes back
    rows: int
    source: FileSource | SpoolSource | None = None
    index: int = 0

    def block(self):
        """The shard with its ``SHARD`` column: its object reference, or its rows read from its source."""
        return self.ref if self.ref is not None else self.source.block(self)


def _open_spool(folder) -> ShardSpool | None:
    """The spool for pending shards, where the driver's disk is a node's (not with Ray Client)."""
    import ray

    if folder is None or ray.util.client.ray.is_connected():
        return None
    return ShardSpool(folder, ray.get_runtime_context().get_node_id())


def _label(shards, done: dict | None, model_dir, cfg, max_length, cpus_per_actor, store, on_commit,
           report, actors: int | None = None, progress=None, scorer=None, source: FileSource | None = None,
           spool: ShardSpool | None = None, hosts=None) -> int:
    """Labels an iterable of candidate shards; returns how many shards there were.

    With ``done`` (a dict), labelled shards are kept there by index; with ``done=None`` they
    are only committed to ``store`` (which is then required) and not kept. With ``source``
    (the file the shards are cut from), pending shards are read from it where they are
    labelled, not put in the object store; with a ``spool``, they wait in its folder.
    """
    report = report if report is not None else LabelingReport()
    if done is None and store is None:
        raise ValueError("labelling without keeping shards in memory needs a ShardStore")
    cut = _cut(shards, done, store, source, spool)
    _announce(cut, report, progress)
    t0 = time.perf_counter()
    commit = _committer(cut, done, store, on_commit, spool, report, progress, t0)
    _attempts(lambda: _run_attempt(cut.pending, cut.finished, commit, model_dir, cfg, max_length, cpus_per_actor,
                                   actors, scorer, hosts),
              cut.pending, len(cut.digests), cfg, store, _actor_class(scorer))
    report.seconds = time.perf_counter() - t0
    return len(cut.digests)


@dataclass
class _Cut:
    """The shards as cut: every shard's digest, those finished, those pending, and their pairs."""

    digests: list[str] = field(default_factory=list)
    finished: set[int] = field(default_factory=set)
    pending: dict[int, _Pending] = field(default_factory=dict)
    pairs: int = 0
    reused_pairs: int = 0


def _cut(shards, done: dict | None, store, source: FileSource | None, spool: ShardSpool | None) -> _Cut:
    """Sorts the shards into those an earlier run committed (read into ``done`` where kept) and those pending."""
    cut = _Cut()
    for i, shard in enumerate(shards):
        digest = keys_digest(shard)
        cut.digests.append(digest)
        cut.pairs += shard.num_rows
        if store is not None and store.done(i, digest):
            cut.finished.add(i)
            cut.reused_pairs += shard.num_rows
            if done is not None:
                done[i] = store.read(i)
            continue
        cut.pending[i] = _pending(i, shard, source, spool)
    return cut


def _pending(i: int, shard: pa.Table, source: FileSource | None, spool: ShardSpool | None) -> _Pending:
    """Shard ``i`` waiting to be labelled: read from ``source``, waiting in ``spool``, or in the object store."""
    import ray

    pairs_id = pairs_digest(shard)
    if source is not None:
        return _Pending(None, pairs_id, shard.num_rows, source, i)
    block = shard.append_column(SHARD, pa.array(np.full(shard.num_rows, i, np.int64)))
    if spool is not None:
        return _Pending(None, pairs_id, shard.num_rows, spool.put(i, block), i)
    return _Pending(ray.put(block), pairs_id, shard.num_rows, None, i)


def _announce(cut: _Cut, report: LabelingReport, progress) -> None:
    """Records the shard counts in ``report``, logs those reused, and starts the progress at the reused pairs."""
    report.shards = len(cut.digests)
    report.reused = len(cut.finished)
    if cut.finished:
        log.info(f"[silver] {len(cut.finished)} of {len(cut.digests)} shards labelled by an earlier run; "
                 f"{len(cut.pending)} to label")
    if progress is not None:
        progress.set_total(cut.pairs, unit="pairs")
        progress.update(cut.reused_pairs)


def _committer(cut: _Cut, done: dict | None, store, on_commit, spool: ShardSpool | None, report: LabelingReport,
               progress, t0: float):
    """The callback that commits a labelled shard, moves it from pending to finished and reports it."""
    last_log = [t0]

    def commit(i: int, table: pa.Table) -> None:
        if store is not None:
            store.commit(i, table, cut.digests[i])
            if on_commit is not None:
                on_commit()
        if done is not None:
            done[i] = table
        cut.finished.add(i)
        del cut.pending[i]  # its block leaves the object store
        if spool is not None:
            spool.remove(i)
        report.labelled += 1
        if report.first_shard_seconds is None:
            report.first_shard_seconds = time.perf_counter() - t0
        report.labelled_pairs += table.num_rows
        report.redone_shards.append(i)
        if progress is not None:
            progress.advance(table.num_rows)
        now = time.perf_counter()
        if (progress is None and now - last_log[0] > 10) or len(cut.finished) == len(cut.digests):
            last_log[0] = now
            log.info(f"[silver] {len(cut.finished)}/{len(cut.digests)} shards labelled "
                     f"({report.labelled_pairs / (now - t0):.1f} pairs/s)")

    return commit

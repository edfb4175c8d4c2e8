"""Step 2.2: the cross-encoder labels candidate pairs ("silver" labels).

``score_pairs`` is the pure core (model in, scores out). ``PairScorer`` is the Ray Data
callable that loads the model once per actor, and ``label_candidates`` runs an actor pool
over the candidate table.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from augsbert_ray import schema
from augsbert_ray.errors import LabelingError
from augsbert_ray.models import file_sha256
from augsbert_ray.scoring import (CPU_TOKEN_BUDGET, GPU_TOKEN_BUDGET, TokenizedPairs, prepare_model, resolve_precision,
                                  score_pairs, score_tokenized, tokenize_pairs)

__all__ = ["score_pairs", "label_candidates", "label_candidates_file", "label_shards", "ShardStore", "LabelingReport",
           "PairScorer"]


# Chaos-test hooks (JSON in these environment variables; never set in normal runs).
FAULT_ENV = "AUGSBERT_LABEL_FAULT"  # {"after_batches": n, "flag": path}: one actor exits mid-batch once
TRACE_ENV = "AUGSBERT_LABEL_TRACE"  # {"path": file, "delay_s": s}: log batch start/end, slow batches down


IDS, TYPES, OFFSETS = "_input_ids", "_token_type_ids", "_n_tokens"  # a tokenised batch's columns


def _tokens_to_arrow(tokens: TokenizedPairs) -> dict[str, pa.Array]:
    cols = {IDS: pa.ListArray.from_arrays(pa.array(tokens.offsets.astype(np.int32)), pa.array(tokens.ids))}
    if tokens.type_ids is not None:
        cols[TYPES] = pa.ListArray.from_arrays(pa.array(tokens.offsets.astype(np.int32)), pa.array(tokens.type_ids))
    return cols


def _tokens_from_arrow(batch: pa.Table) -> TokenizedPairs:
    ids = batch.column(IDS).combine_chunks()
    offsets = ids.offsets.to_numpy().astype(np.int64)
    base = offsets[0]
    types = None
    if TYPES in batch.column_names:
        t = batch.column(TYPES).combine_chunks()
        t_offsets = t.offsets.to_numpy()  # a sliced list array keeps its own offsets
        types = t.values.to_numpy()[t_offsets[0]:t_offsets[-1]]
    return TokenizedPairs(ids.values.to_numpy()[base:offsets[-1]], types, offsets - base)


_TOKENIZERS: dict = {}


def tokenize_batch(batch: pa.Table, model_dir, max_length: int) -> pa.Table:
    """Ray Data CPU stage ahead of the labelling actors: adds the pairs' token columns."""
    from transformers import AutoTokenizer

    from augsbert_ray.models import resolve_model, trust_remote_code

    key = (str(model_dir), max_length)
    if key not in _TOKENIZERS:
        # This task holds one CPU: the Rust tokenizer's thread pool (made on first use) gets one thread.
        os.environ.setdefault("RAYON_NUM_THREADS", "1")
        _TOKENIZERS[key] = AutoTokenizer.from_pretrained(resolve_model(model_dir), trust_remote_code=trust_remote_code())
    tokens = tokenize_pairs(_TOKENIZERS[key], batch.column(schema.SENTENCE1).to_pylist(),
                            batch.column(schema.SENTENCE2).to_pylist(), max_length)
    for name, col in _tokens_to_arrow(tokens).items():
        batch = batch.append_column(name, col)
    return batch


class PairScorer:
    """Ray Data callable: loads the cross-encoder once, adds a ``label`` column to each batch.

    A batch that arrives tokenised (by ``tokenize_batch``) is scored from its token columns,
    which are dropped from the output; otherwise the actor tokenises it itself.
    """

    def __init__(self, model_dir: str, micro_batch_size: int, max_length: int, threads: int, use_gpu: bool,
                 precision: str = "fp32", token_budget: int = 0, compile: bool = False,
                 fault: dict | None = None, trace: dict | None = None):
        import torch

        from augsbert_ray.models import load_cross_encoder

        torch.set_num_threads(max(1, threads))
        torch.manual_seed(0)  # a model without a trained head gets the same new one in every actor and run
        self.device = "cuda" if use_gpu and torch.cuda.is_available() else "cpu"
        model, self.tokenizer = load_cross_encoder(model_dir, device=self.device)
        self.precision = resolve_precision(precision, self.device)
        self.model = prepare_model(model, self.precision, self.device, compile=compile)
        print(f"[silver] labelling actor on {self.device}: {self.precision}"
              f"{' (precision: auto)' if precision == 'auto' else ''}, {max(1, threads)} threads", flush=True)
        self.micro_batch_size = micro_batch_size
        self.max_length = max_length
        self.token_budget = token_budget or (GPU_TOKEN_BUDGET if self.device == "cuda" else CPU_TOKEN_BUDGET)
        self.fault, self.trace, self.batches = fault, trace, 0
        if self.trace:
            import ray

            with open(self.trace["path"], "a", encoding="utf-8") as f:
                f.write(f"actor {ray.get_runtime_context().get_node_id()}\n")

    def _trace(self, event: str, batch: pa.Table) -> None:
        shards = sorted(set(batch.column(SHARD).to_pylist())) if SHARD in batch.column_names else []
        with open(self.trace["path"], "a", encoding="utf-8") as f:
            f.write(f"{event} {' '.join(map(str, shards))}\n")

    def __call__(self, batch: pa.Table) -> pa.Table:
        if self.trace:
            self._trace("start", batch)
            time.sleep(float(self.trace.get("delay_s", 0)))
        if IDS in batch.column_names:
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
            scores = score_tokenized(self.model, _tokens_from_arrow(batch), pad_id=pad, token_budget=self.token_budget,
                                     max_pairs=self.micro_batch_size, device=self.device)
            batch = batch.drop_columns([c for c in (IDS, TYPES) if c in batch.column_names])
        else:
            scores = score_pairs(self.model, self.tokenizer, batch.column(schema.SENTENCE1).to_pylist(),
                                 batch.column(schema.SENTENCE2).to_pylist(), micro_batch_size=self.micro_batch_size,
                                 max_length=self.max_length, device=self.device, token_budget=self.token_budget)
        self.batches += 1
        if self.fault and self.batches >= self.fault["after_batches"] and not os.path.exists(self.fault["flag"]):
            Path(self.fault["flag"]).write_text(f"actor pid {os.getpid()} exited after {self.batches} batches\n")
            os._exit(1)  # the process dies with this batch scored but not returned
        if self.trace:
            self._trace("end", batch)
        return batch.append_column(schema.LABEL, pa.array(scores, pa.float32()))


def _hook(env: str) -> dict | None:
    text = os.environ.get(env)
    return json.loads(text) if text else None


SHARD = "_shard"  # the shard a candidate row belongs to (dropped from the silver table)
_KEY_COLUMNS = [schema.ID1, schema.ID2]


class ShardStore:
    """Labelled shards under deterministic names, each committed once with its manifest.

    Shard ``i`` holds candidate rows ``[i * size, (i + 1) * size)``. Its labelled rows go to
    ``part-{i:06d}.parquet`` (written under a temporary name, then renamed) and then its
    manifest ``part-{i:06d}.json`` (the shard's input digest, row count and the file's sha256),
    also renamed into place. A shard counts as done only when its manifest matches the input
    and the file it names: a crash at any point leaves a shard either done or redone, never
    half there.
    """

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def part(self, i: int) -> Path:
        return self.root / f"part-{i:06d}.parquet"

    def manifest(self, i: int) -> Path:
        return self.root / f"part-{i:06d}.json"

    def done(self, i: int, digest: str) -> bool:
        try:
            record = json.loads(self.manifest(i).read_text(encoding="utf-8"))
            part = self.part(i)
            return (record["input"] == digest and part.stat().st_size == record["bytes"]
                    and file_sha256(part) == record["sha256"])
        except (OSError, ValueError, KeyError):
            return False

    def commit(self, i: int, table: pa.Table, digest: str) -> None:
        import pyarrow.parquet as pq

        part = self.part(i)
        tmp = part.with_name(f".{part.name}.tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, part)
        record = {"input": digest, "rows": table.num_rows, "bytes": part.stat().st_size, "sha256": file_sha256(part)}
        tmp = self.manifest(i).with_name(f".{self.manifest(i).name}.tmp")
        tmp.write_text(json.dumps(record), encoding="utf-8")
        os.replace(tmp, self.manifest(i))

    def read(self, i: int) -> pa.Table:
        import pyarrow.parquet as pq

        return pq.read_table(self.part(i))


def _keys_digest(table: pa.Table) -> str:
    """What identifies a shard's input: its pairs' ids and sentences, in order."""
    from augsbert_ray.rundir import table_fingerprint

    return table_fingerprint(table.select([*_KEY_COLUMNS, schema.SENTENCE1, schema.SENTENCE2]).combine_chunks())


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


def _table_shards(table: pa.Table, size: int):
    """Slices of ``size`` rows, dictionary text columns decoded (a shard travels alone)."""
    plain = schema.decoded(table.schema)
    for start in range(0, table.num_rows, size):
        yield table.slice(start, size).cast(plain)


def exact_shards(tables, size: int):
    """Tables cut and joined into shards of exactly ``size`` rows (the last one may be shorter):
    a shard's rows, and so its digest, do not depend on how the input was batched."""
    buf: list[pa.Table] = []
    held = 0
    for rows in tables:
        while rows.num_rows:
            take = min(size - held, rows.num_rows)
            buf.append(rows.slice(0, take))
            held += take
            rows = rows.slice(take)
            if held == size:
                yield pa.concat_tables(buf)
                buf, held = [], 0
    if held:
        yield pa.concat_tables(buf)


def _file_shards(path, size: int):
    """A Parquet file's rows in shards of ``size`` rows, read a batch at a time."""
    import pyarrow.parquet as pq

    return exact_shards((pa.Table.from_batches([b]) for b in pq.ParquetFile(path).iter_batches(batch_size=size)), size)


def label_candidates(candidates: pa.Table, model_dir: str, cfg, max_length: int, cpus_per_actor: float,
                     store: ShardStore | None = None, log=lambda line: None, on_commit=None,
                     report: LabelingReport | None = None, actors: int | None = None, progress=None) -> pa.Table:
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
        log: progress lines.
        on_commit: called after each committed shard (e.g. to upload it).
        report: filled with shard counts and timings.
        actors: the pool's size (None: ``pool_size(cfg, <the cluster's GPUs>)``).
        progress: a ``progress.StageProgress`` (None: none): the pairs to label in all, then
            the pairs of each committed shard (a reused shard's at the start). With it, the
            periodic "k/n shards labelled" lines are left to the display.

    Returns:
        ``schema.SILVER_SCHEMA`` rows sorted by (id1, id2): one per candidate.
    """
    if candidates.num_rows == 0:
        return schema.empty_table(schema.SILVER_SCHEMA)
    done: dict[int, pa.Table] = {}
    count = _label(_table_shards(candidates, cfg.block_size), done, model_dir, cfg, max_length, cpus_per_actor,
                   store, log, on_commit, report, actors, progress)
    silver = pa.concat_tables([done[i] for i in range(count)]).cast(schema.SILVER_SCHEMA)
    silver = silver.take(pc.sort_indices(silver, [(schema.ID1, "ascending"), (schema.ID2, "ascending")]))
    if silver.num_rows != candidates.num_rows:  # every candidate gets exactly one label
        raise LabelingError(f"labelling returned {silver.num_rows} rows for {candidates.num_rows} candidates")
    return silver


def label_candidates_file(candidates_path, silver_path, model_dir: str, cfg, max_length: int,
                          cpus_per_actor: float, store: ShardStore, log=lambda line: None, on_commit=None,
                          report: LabelingReport | None = None, actors: int | None = None,
                          progress=None) -> int:
    """``label_candidates`` from a Parquet file of candidates to a Parquet file of silver pairs.

    The driver's heap never holds all the pairs: the candidates are read a shard at a time and
    put in Ray's object store (which spills to disk when full; the pages of the shards the
    driver put there stay mapped in its address space until they are labelled), labelled
    shards are committed to ``store`` as they arrive and dropped, and ``silver_path`` is
    written from the committed shards one at a time (under a temporary name, then renamed).
    What the driver keeps per pending shard is its object reference and its pairs' two ids,
    for the completeness check.
    Rows keep the candidates' order, so candidates sorted by (id1, id2), as every sampler
    writes them, give silver pairs sorted the same way.

    Returns:
        The number of silver rows written: one per candidate.
    """
    import pyarrow.parquet as pq

    total = pq.ParquetFile(candidates_path).metadata.num_rows
    count = _label(_file_shards(candidates_path, cfg.block_size), None, model_dir, cfg, max_length, cpus_per_actor,
                   store, log, on_commit, report, actors, progress)
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


def label_shards(shards, model_dir, cfg, max_length: int, cpus_per_actor: float, store: ShardStore,
                 log=lambda line: None, report: LabelingReport | None = None, actors: int | None = None,
                 progress=None) -> int:
    """``label_candidates`` for candidate shards made elsewhere (``augsbert label``'s pair files):
    each shard is committed to ``store`` under its index, none is kept in memory.

    Args:
        shards: ``schema.CANDIDATE_SCHEMA`` tables, read lazily; shard ``i`` is the ``i``-th.
        store: where shards are committed; shards it holds already are not labelled again.
        (the rest as ``label_candidates``)

    Returns:
        The number of shards.
    """
    return _label(shards, None, model_dir, cfg, max_length, cpus_per_actor, store, log, None, report, actors,
                  progress)


@dataclass
class _Pending:
    ref: object  # the shard (with its SHARD column) in the object store
    keys: tuple[np.ndarray, np.ndarray]  # its pairs' (id1, id2), sorted, to check what comes back
    rows: int


def _label(shards, done: dict | None, model_dir, cfg, max_length, cpus_per_actor, store, log, on_commit,
           report, actors: int | None = None, progress=None) -> int:
    """Labels an iterable of candidate shards; returns how many shards there were.

    With ``done`` (a dict), labelled shards are kept there by index; with ``done=None`` they
    are only committed to ``store`` (which is then required) and not kept.
    """
    import ray

    report = report if report is not None else LabelingReport()
    keep = done is not None
    if not keep and store is None:
        raise ValueError("labelling without keeping shards in memory needs a ShardStore")
    finished: set[int] = set()
    digests: list[str] = []
    pending: dict[int, _Pending] = {}
    pairs = reused_pairs = 0
    for i, shard in enumerate(shards):
        digest = _keys_digest(shard)
        digests.append(digest)
        pairs += shard.num_rows
        if store is not None and store.done(i, digest):
            finished.add(i)
            reused_pairs += shard.num_rows
            if keep:
                done[i] = store.read(i)
            continue
        order = pc.sort_indices(shard, [(schema.ID1, "ascending"), (schema.ID2, "ascending")])
        keys = tuple(shard.column(c).take(order).to_numpy() for c in _KEY_COLUMNS)
        block = shard.append_column(SHARD, pa.array(np.full(shard.num_rows, i, np.int64)))
        pending[i] = _Pending(ray.put(block), keys, shard.num_rows)
    report.shards = len(digests)
    report.reused = len(finished)
    if finished:
        log(f"[silver] {len(finished)} of {len(digests)} shards labelled by an earlier run; {len(pending)} to label")
    if progress is not None:
        progress.set_total(pairs, unit="pairs")
        progress.update(reused_pairs)
    t0 = time.perf_counter()
    last_log = [t0]

    def commit(i: int, table: pa.Table) -> None:
        if store is not None:
            store.commit(i, table, digests[i])
            if on_commit is not None:
                on_commit()
        if keep:
            done[i] = table
        finished.add(i)
        del pending[i]  # its block leaves the object store
        report.labelled += 1
        if report.first_shard_seconds is None:
            report.first_shard_seconds = time.perf_counter() - t0
        report.labelled_pairs += table.num_rows
        report.redone_shards.append(i)
        if progress is not None:
            progress.advance(table.num_rows)
        now = time.perf_counter()
        if (progress is None and now - last_log[0] > 10) or len(finished) == len(digests):
            last_log[0] = now
            log(f"[silver] {len(finished)}/{len(digests)} shards labelled ({report.labelled_pairs / (now - t0):.1f} pairs/s)")

    attempt = 0
    while pending:
        failure = None
        try:
            _label_shards(pending, finished, commit, model_dir, cfg, max_length, cpus_per_actor, actors)
        except LabelingError:
            raise
        except Exception as e:  # actor restarts or task retries exhausted, a lost actor, the pool failed
            failure = e
        if failure is not None:  # handled out here: within the except clause, see _release_failed_pool
            _release_failed_pool(failure)
            why = f"{type(failure).__name__}: {str(failure).splitlines()[0] if str(failure) else ''}"
            if attempt < cfg.pool_retries:
                attempt += 1
                log(f"[silver] the actor pool failed ({why[:300]}); a new pool labels the {len(pending)} shards "
                    f"not committed (retry {attempt} of labeling.pool_retries={cfg.pool_retries})")
                continue
            where = f"; the {len(finished)} committed shards in {store.root} are kept and a re-run resumes from them" \
                if store is not None else ""
            raise LabelingError(
                f"labelling failed with {len(pending)} of {len(digests)} shards not labelled (labeling.max_restarts="
                f"{cfg.max_restarts}, max_task_retries={cfg.max_task_retries}, pool_retries={cfg.pool_retries})"
                f"{where}: {why}") from failure
        if pending:
            raise LabelingError(f"shards {sorted(pending)} came back incomplete from the actor pool")
    report.seconds = time.perf_counter() - t0
    return len(digests)


def _release_failed_pool(error: BaseException) -> None:
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


def _label_shards(pending: dict, finished: set, commit, model_dir, cfg, max_length, cpus_per_actor,
                  actors: int | None = None) -> None:
    """One actor pool over the ``pending`` shards; each shard is committed when all its rows are back."""
    with warnings.catch_warnings():
        # Ray Data takes actor restart limits only through the deprecated **ray_remote_args.
        warnings.filterwarnings("ignore", message=".*ray_remote_args.*deprecated", category=DeprecationWarning)
        labelled = _labelled_dataset([p.ref for _, p in sorted(pending.items())], model_dir, cfg, max_length,
                                     cpus_per_actor, actors)
    partial: dict[int, list[pa.Table]] = {}
    batches = iter(labelled.iter_batches(batch_size=None, batch_format="pyarrow"))  # a generator
    try:
        for batch in batches:
            for i in sorted(set(batch.column(SHARD).to_pylist())):
                if i in finished or i not in pending:
                    raise LabelingError(f"shard {i} came back twice from the actor pool")
                partial.setdefault(i, []).append(batch.filter(pc.equal(batch.column(SHARD), i)))
                if sum(t.num_rows for t in partial[i]) >= pending[i].rows:
                    commit(i, _checked_shard(i, pa.concat_tables(partial.pop(i)), pending[i].keys))
    finally:
        # Closing the generator runs Ray Data's clean-up (its own finally shuts the executor
        # and its actor pool down) now; after a failure the error's traceback keeps the
        # generator alive, and that clean-up would wait for garbage collection.
        batches.close()


def _checked_shard(i: int, labelled: pa.Table, keys: tuple[np.ndarray, np.ndarray]) -> pa.Table:
    """The shard's labelled rows sorted by (id1, id2), after checking they are exactly its pairs."""
    order = pc.sort_indices(labelled, [(schema.ID1, "ascending"), (schema.ID2, "ascending")])
    labelled = labelled.take(order).drop_columns([SHARD])
    for name, expect in zip(_KEY_COLUMNS, keys):
        if not np.array_equal(labelled.column(name).to_numpy(), expect):
            raise LabelingError(f"shard {i}: the labelled pairs differ from the shard's candidates")
    return labelled.cast(schema.SILVER_SCHEMA)


def pool_size(cfg, cluster_gpus: float) -> int:
    """Labelling actors: ``cfg.actors`` if set; by default, when actors have GPUs, as many as the
    cluster's GPUs hold (``cluster_gpus // cfg.num_gpus``, at least one, so a cluster that is
    still adding GPU nodes starts with one), and one on CPU, which gets all its cores."""
    if cfg.actors:
        return cfg.actors
    if cfg.num_gpus > 0:
        return max(1, int(cluster_gpus // cfg.num_gpus))
    return 1


def separate_tokenizer(cfg) -> bool:
    """Whether pairs are tokenised in CPU tasks ahead of the actors (by default when they have GPUs)."""
    return cfg.tokenize_stage == "separate" or (cfg.tokenize_stage == "auto" and cfg.num_gpus > 0)


# CPUs a tokenising task holds (Ray Data runs as many as there are CPUs left for them).
TOKENIZE_CPUS = 1


def actor_cpus(cfg, cluster_cpus: float, actors: int) -> float:
    """CPUs each labelling actor reserves.

    ``cfg.num_cpus`` if set. By default an actor with a GPU reserves one CPU (it pads batches
    and drives the GPU; tokenising is done ahead of it), leaving the node's other CPUs to the
    tokenising tasks and Ray Data. On CPU, the actors share the cores, less one that the
    tokenising tasks need when they run ahead of the actors: an actor holding every CPU
    would leave them none, and the pipeline would wait for ever.
    """
    if cfg.num_cpus is not None:
        return cfg.num_cpus
    if cfg.num_gpus > 0:
        return 1.0
    spare = TOKENIZE_CPUS if separate_tokenizer(cfg) else 0
    return max(1.0, float(int((cluster_cpus - spare) // max(1, actors))))


def labelling_requests(cfg, actors: int, cpus_per_actor: float) -> list[dict]:
    """The resources the labelling pipeline needs at once: every actor, and (with a separate
    tokenising stage) one tokenising task, without which it cannot make progress."""
    requests = [{"CPU": cpus_per_actor, "GPU": cfg.num_gpus}] * actors
    if separate_tokenizer(cfg):
        requests = requests + [{"CPU": TOKENIZE_CPUS}]
    return requests


def _labelled_dataset(refs: list, model_dir: str, cfg, max_length: int, cpus_per_actor: float,
                      actors: int | None = None):
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
    return ds.map_batches(
        PairScorer,
        fn_constructor_kwargs={
            "model_dir": model_dir,
            "micro_batch_size": cfg.micro_batch_size,
            "max_length": max_length,
            "threads": int(cpus_per_actor),
            "use_gpu": cfg.num_gpus > 0,
            "precision": cfg.precision,
            "token_budget": cfg.token_budget,
            "compile": cfg.compile,
            "fault": _hook(FAULT_ENV),
            "trace": _hook(TRACE_ENV),
        },
        compute=ActorPoolStrategy(size=actors),
        batch_size=cfg.block_size,
        batch_format="pyarrow",
        num_cpus=cpus_per_actor,
        num_gpus=cfg.num_gpus,
        max_restarts=cfg.max_restarts,
        max_task_retries=cfg.max_task_retries,
    )

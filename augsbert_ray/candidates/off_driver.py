"""A large target corpus's candidates, made in a process of their own instead of the driver.

The driver coordinates the job for its whole life. Reading a corpus holds its distinct
sentences and the hash tables that find repeats, and sampling holds the hits and the candidate
pairs: memory that grows with the corpus, and that a long-lived process's allocators keep
after the stage. Above ``OFF_DRIVER_BYTES`` of corpus files, the candidates stage reads the
corpus and samples its pairs in Ray tasks on the driver's node (where the run directory is),
each in a worker process that ends with the task (``max_calls=1``). The tasks write
``sentences.parquet`` and ``candidates.parquet`` and hand back counts alone, so the driver's
memory does not grow with the corpus. The work is the same code either way, so the outputs
are too.

Not with Ray Client, whose driver (and run directory) is on no node of the cluster. A corpus
takes the sharded path instead (``corpus_shards``, ``sharded``), where no process holds the
corpus; this one remains for a cluster of several nodes whose run directory is a storage URI.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from pathlib import Path

import numpy as np

# Corpus files above this many bytes in all are read and sampled off the driver; smaller ones
# cost a worker's start (imports, Ray Data's executor) more than they cost the driver to hold.
OFF_DRIVER_BYTES = 4 << 20


def wanted(files: list[tuple]) -> bool:
    """Whether the corpus (``loaders.corpus.list_files``' entries) is read and sampled off the driver."""
    import ray

    if ray.util.client.ray.is_connected():
        return False
    return sum(size for _, size, _ in files) > OFF_DRIVER_BYTES


def _in_task(fn, prefix: str, quiet: bool, args: tuple):
    """Runs in the task's worker: ``fn(*args)`` with the engine's lines printed (Ray forwards them
    to the driver, which shows them as its own) and Ray Data as quiet as on the driver."""
    from augsbert_ray.progress.messages import lines_to, prefixed

    if quiet:
        from augsbert_ray.runtime.output import _quiet_ray_data

        _quiet_ray_data()
    with lines_to(lambda line: print(line, flush=True)), prefixed(prefix):
        return fn(*args)


def run(fn, *args):
    """``fn(*args)`` in a Ray task on this node, in a worker process that exits after it.

    Raises:
        AugSBERTError: what ``fn`` raised of the engine's own errors (a bad corpus line), as is.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from augsbert_ray.errors import AugSBERTError
    from augsbert_ray.progress.messages import current_prefix
    from augsbert_ray.runtime import state

    node = ray.get_runtime_context().get_node_id()
    task = ray.remote(num_cpus=0, max_calls=1, max_retries=0,
                      scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))(_in_task)
    try:
        return ray.get(task.remote(fn, current_prefix(), not state.settings.verbose, args))
    except ray.exceptions.RayTaskError as e:
        if isinstance(e.cause, AugSBERTError):
            raise e.cause from None
        raise


def read_to_file(corpus_cfg, seed: int, files: list[tuple], out: str) -> tuple[dict, int, int]:
    """Task: reads the corpus and writes its sentences to ``out/sentences.parquet``; returns the
    line counts, the number of sentences and the worker's pid."""
    from augsbert_ray.loaders.corpus import read_corpus
    from augsbert_ray.rundir import write_table

    corpus = read_corpus(corpus_cfg, seed=seed, files=files)
    write_table(Path(out) / "sentences.parquet", corpus.sentences)
    return corpus.counts, corpus.sentences.num_rows, os.getpid()


def sample_to_file(ctx, out: str) -> tuple[int, int]:
    """Task: the sampler of ``ctx`` (a ``SamplingContext`` without its sentences) over
    ``out/sentences.parquet``; writes ``out/candidates.parquet`` and returns how many pairs
    and the worker's pid."""
    import pyarrow.parquet as pq

    from augsbert_ray import schema
    from augsbert_ray.candidates import get_sampler
    from augsbert_ray.rundir import write_table

    sentences = pq.read_table(Path(out) / "sentences.parquet")
    ctx = dataclasses.replace(ctx, sentences=sentences, gold_keys=np.empty(0, np.int64))
    with _flushed(ctx.progress):
        candidates = get_sampler(ctx.cfg.strategy)(ctx)
    write_table(Path(out) / "candidates.parquet", candidates, schema.CANDIDATE_SCHEMA)
    return candidates.num_rows, os.getpid()


@contextlib.contextmanager
def _flushed(progress, every_s: float = 1.0):
    """Sends what this process reports to ``progress`` every ``every_s`` seconds and at the end.
    A sampler adds its stage's total here and then waits on Ray Data's workers, which report the
    batches: without this, the total would stay in this process's batch of events."""
    if progress is None:
        yield
        return
    stop = threading.Event()

    def pump() -> None:
        while not stop.wait(every_s):
            progress.flush()

    thread = threading.Thread(target=pump, name="progress-flush", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        progress.flush()

"""Labelling on the job's warm hosts (``workers``) instead of a new Ray Data actor pool.

A new pool starts processes that import torch and transformers and start Ray Data's executor
before its first shard: most of the silver stage's time when the silver set is small. Within a
job on one machine, the hosts that trained the teacher already have all of that loaded, so a
host loads the teacher's weights and labels at once. Each host reserves what a pool actor
would (``HostPool.acquire``), scores one shard per call with the same ``PairScorer``, and the
driver commits each shard as it comes back, exactly as it does for the pool. A host that dies
ends the attempt like a failed pool: the driver's ``labeling.pool_retries`` start a new one
for the shards not committed.

Large sets keep the pool: its tokenising tasks ahead of the GPU actors and its restarts pay
for its start there (``WARM_MAX_PAIRS``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa

from augsbert_ray.labeling.codec import tokenize_batch
from augsbert_ray.labeling.pool import checked_shard
from augsbert_ray.labeling.scorer import ScorerSpec

log = logging.getLogger(__name__)

# Above this many pairs to label, ``executor: auto`` starts a Ray Data pool (see the module's doc).
WARM_MAX_PAIRS = 200_000


def use_hosts(executor: str, pairs: int, hosts_serve: bool) -> bool:
    """Whether the pending shards are labelled on the job's hosts (pure).

    Only where hosts serve the job (``workers.hosts_serve``); then ``hosts`` always, ``auto`` up
    to ``WARM_MAX_PAIRS`` pairs, ``pool`` never.
    """
    if executor == "pool" or not hosts_serve:
        return False
    return executor == "hosts" or pairs <= WARM_MAX_PAIRS


# The scorers this process holds for labelling runs in progress (a host serves one shard per call).
_scorers: dict[str, object] = {}


def _score_on_host(run: str, scorer_spec: ScorerSpec, block_size: int, tokenize: dict | None,
                   shard: pa.Table) -> pa.Table:
    """Runs in the host: the shard labelled in batches of ``block_size``, as the pool batches it,
    tokenised first as the pool's tokenising tasks would (``tokenize``: their arguments) so that
    the actors see the same input either way."""
    scorer = _scorers.get(run)
    if scorer is None:
        scorer = _scorers[run] = scorer_spec.cls(**scorer_spec.kwargs)
    step = max(1, block_size)
    batches = (shard.slice(at, step) for at in range(0, shard.num_rows, step))
    return pa.concat_tables([scorer(tokenize_batch(b, **tokenize) if tokenize else b) for b in batches])


def _release(run: str) -> None:
    """Runs in the host: drops the run's model, so a later stage on this host has its memory."""
    _scorers.pop(run, None)


def run_on_hosts(pending: dict, commit, scorer: ScorerSpec, cfg, cpus_per_actor: float, actors: int, pool,
                 tokenize: dict | None = None) -> None:
    """Labels the ``pending`` shards on up to ``actors`` hosts of ``pool`` at once, each host with
    one ``scorer``; each shard is committed (``commit(i, table)``, under a lock) as it comes back.
    ``tokenize``: ``codec.tokenize_batch``'s arguments where the pool would tokenise ahead of
    its actors (None: the scorer tokenises).

    Raises:
        LabelingError: a shard that came back with other pairs than it held.
        Exception: whatever ended a host (it is not handed out again).
    """
    import ray

    run = uuid.uuid4().hex
    queue, lock, failed = deque(sorted(pending)), threading.Lock(), threading.Event()
    what = "labelling on a warm host (labeling.num_cpus, labeling.num_gpus)"

    def serve() -> None:
        with lock:
            if not queue:  # the other hosts took every shard: reserve nothing
                return
        with pool.acquire(cpus_per_actor, cfg.num_gpus, what) as host:
            try:
                while not failed.is_set():
                    with lock:
                        if not queue:
                            return
                        i = queue.popleft()
                        shard = pending[i]
                    table = ray.get(host.call.remote(_score_on_host, run, scorer, cfg.block_size, tokenize, shard.block(),
                                                     threads=max(1, int(cpus_per_actor))))
                    with lock:
                        commit(i, checked_shard(i, table, shard.pairs))
            except BaseException:
                failed.set()
                raise
            finally:
                with contextlib.suppress(Exception):  # a dead host has nothing left to release
                    ray.get(host.call.remote(_release, run, trim=True))

    n = max(1, min(actors, len(pending)))
    log.info(f"[silver] labelling {len(pending)} shards on {n} warm host(s) (labeling.executor={cfg.executor})")
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="label-host") as threads:
        for future in [threads.submit(serve) for _ in range(n)]:
            future.result()

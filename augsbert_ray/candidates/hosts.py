"""Small candidate samplings on the job's warm hosts (``workers``) instead of Ray Data.

Ray Data starts processes that import the sampler's libraries (torch and the model too, to
embed) and its executor before the first batch: most of the candidates stage's time when the
sentences are few. Within a job on one machine, the hosts that trained the models have those
imports, so a host runs Ray Data's own callable (``BM25Searcher``, ``SentenceEmbedder``,
``RandomDrawer``) over the same batches, with what one pool actor would reserve, and the
results are Ray Data's.

Large sets keep Ray Data (``WARM_MAX_SENTENCES``): it streams the batches and shows them as they
finish, where a host does all of them in one call, started again from the first batch on a new
host if the host dies (``HOST_RETRIES``).
"""

from __future__ import annotations

import logging

import pyarrow as pa

log = logging.getLogger(__name__)

# Above this many sentences, ``sampling.executor: auto`` starts a Ray Data pool (see the module's doc).
WARM_MAX_SENTENCES = 50_000


def use_hosts(executor: str, sentences: int, hosts_serve: bool) -> bool:
    """Whether the sentences are searched or embedded on the job's hosts (pure).

    Only where hosts serve the job (``workers.hosts_serve``); then ``hosts`` always, ``auto`` up
    to ``WARM_MAX_SENTENCES`` sentences, ``pool`` never.
    """
    if executor == "pool" or not hosts_serve:
        return False
    return executor == "hosts" or sentences <= WARM_MAX_SENTENCES


def _map_batches(make, kwargs: dict, sentences: pa.Table, batch_size: int) -> list[pa.Table]:
    """Runs in the host: ``make(**kwargs)`` applied to ``sentences`` in batches of ``batch_size``,
    the blocks ``runtime.dataset_of_blocks`` cuts for the pool."""
    fn = make(**kwargs)
    step = max(1, batch_size)
    return [fn(sentences.slice(at, step)) for at in range(0, sentences.num_rows, step)] or [fn(sentences)]


# A host that dies mid-call (killed, out of memory) is replaced and the call made again this many
# times, as a pool restarts its actors; the samplers are deterministic, so a retry finds the same.
HOST_RETRIES = 2


def map_on_host(hosts, make, kwargs: dict, sentences: pa.Table, batch_size: int, *, cpus: float, gpus: float,
                what: str) -> list[pa.Table]:
    """What a pool of ``make`` would return for ``sentences``, computed on one of ``hosts`` (the
    job's ``workers.HostPool``) that reserves ``cpus`` and ``gpus`` while it works.

    Raises:
        AugSBERTError: the cluster cannot ever place the reservation (``what`` names the settings).
        RayActorError: the host died ``HOST_RETRIES + 1`` times.
    """
    from ray.exceptions import RayActorError

    from augsbert_ray import workers

    for attempt in range(HOST_RETRIES + 1):
        try:
            return workers.remote_call(hosts, _map_batches, make, kwargs, sentences, batch_size, num_cpus=cpus,
                                       num_gpus=gpus, what=what)
        except RayActorError as e:
            if attempt == HOST_RETRIES:
                raise
            log.warning(f"[candidates] the warm host died ({type(e).__name__}); sampling again on a new one "
                        f"({attempt + 1} of {HOST_RETRIES} retries)")

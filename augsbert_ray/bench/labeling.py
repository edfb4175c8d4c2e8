"""Labelling: the engine's Ray pipeline for 1..N actors against ``CrossEncoder.predict``,
with its defaults and tuned (bf16 weights where the device has bf16, large batches), on the
same pairs and the same saved cross-encoder.

The pipeline's rate is given with its start included (actors started, models loaded), against
the peer's defaults, and steady (from the first shard committed to the last), against the tuned
peer; the peers' after a warm-up call.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from augsbert_ray.bench.ceiling import steady_rate
from augsbert_ray.bench.records import PartResult

PEER = "CrossEncoder.predict (defaults: batch 32, fp32)"


def candidates(s1: list[str], s2: list[str]) -> pa.Table:
    """Pairs as the labelling pipeline takes them (``schema.CANDIDATE_SCHEMA``)."""
    from augsbert_ray import schema

    n = len(s1)
    return pa.table({schema.ID1: np.arange(n, dtype=np.int64) * 2, schema.ID2: np.arange(n, dtype=np.int64) * 2 + 1,
                     schema.SENTENCE1: s1, schema.SENTENCE2: s2, schema.ORIGIN: ["bench"] * n,
                     schema.RETRIEVAL_SCORE: np.zeros(n, np.float32)}, schema=schema.CANDIDATE_SCHEMA)


def bf16_supported(device: str) -> bool:
    """Whether ``device`` computes in bf16 natively (a GPU with bf16, a CPU with AVX-512 BF16 or AMX)."""
    import torch

    if device.startswith("cuda"):
        return torch.cuda.is_bf16_supported()
    from augsbert_ray.scoring import cpu_has_bf16

    return cpu_has_bf16()


def peer_rate(model_dir: Path, s1: list[str], s2: list[str], device: str, batch_size: int = 32,
              bf16: bool = False) -> float:
    """``CrossEncoder.predict``'s pairs/s on the pairs, after a warm-up call."""
    import torch
    from sentence_transformers import CrossEncoder

    kwargs = {"model_kwargs": {"torch_dtype": torch.bfloat16}} if bf16 else {}
    peer = CrossEncoder(str(model_dir), device=device, num_labels=1, **kwargs)
    pairs = list(zip(s1, s2))
    peer.predict(pairs[:min(len(pairs), 2 * batch_size)], batch_size=batch_size, show_progress_bar=False)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    t0 = time.perf_counter()
    peer.predict(pairs, batch_size=batch_size, show_progress_bar=False)
    sync()
    return len(pairs) / (time.perf_counter() - t0)


def pipeline_rate(model_dir: Path, s1: list[str], s2: list[str], cfg, cluster_cpus: float) -> dict:
    """The engine's Ray pipeline (``labeling.label_candidates``, shards committed to disk) on the
    pairs with ``cfg.actors`` actors.

    Returns:
        ``start_included`` and ``steady`` pairs/s, ``first_shard_s``, ``shards``.
    """
    from augsbert_ray.labeling import LabelingReport, ShardStore, actor_cpus, label_candidates

    commits: list[float] = []
    report = LabelingReport()
    with tempfile.TemporaryDirectory(prefix="bench-labelling-") as tmp:
        t0 = time.perf_counter()
        label_candidates(candidates(s1, s2), str(model_dir), cfg, 128, actor_cpus(cfg, cluster_cpus, cfg.actors),
                         store=ShardStore(tmp), actors=cfg.actors, report=report,
                         on_commit=lambda: commits.append(time.perf_counter()))
        wall = time.perf_counter() - t0
    n, size = len(s1), cfg.block_size
    sizes = [size] * (len(commits) - 1) + [n - size * (len(commits) - 1)]
    return {"start_included": n / wall, "steady": steady_rate(commits, sizes),
            "first_shard_s": report.first_shard_seconds, "shards": len(commits), "seconds": wall}


def actor_counts(most: int) -> list[int]:
    """1, 2, 4, ... up to ``most``, and ``most`` itself."""
    counts, a = [], 1
    while a < most:
        counts.append(a)
        a *= 2
    return counts + [max(1, most)]


def run(result: PartResult, model_dir: Path, pairs_for, cluster, plan, device: str, log, write) -> None:
    """Fills ``result``: the peers' pairs/s, then the pipeline's for each number of actors
    (each written as soon as it is measured).

    Args:
        pairs_for: ``n -> (s1, s2)``, the benchmark's pairs.
        cluster: ``runtime.ClusterResources`` of the Ray the pipeline runs on.
        plan: the run's sizes (``suite.Plan``).
        device: where the peers run (this process's device).
        write: called after each figure, to save the report so far.
    """
    from augsbert_ray.config import LabelingConfig

    s1, s2 = pairs_for(plan.peer_pairs)
    log(f"[bench] labelling: {PEER} on {len(s1):,} pairs ({device})")
    base = peer_rate(model_dir, s1, s2, device)
    result.add(PEER, base, "pairs/s", side="peer", note=f"{len(s1):,} pairs on the driver's {device}")
    bf16 = bf16_supported(device)
    tuned_setting = f"the tuned peer (batch {plan.peer_batch}, {'bf16' if bf16 else 'fp32'} weights)"
    tuned = f"CrossEncoder.predict tuned (batch {plan.peer_batch}, {'bf16' if bf16 else 'fp32'} weights)"
    log(f"[bench] labelling: {tuned}")
    best = peer_rate(model_dir, s1, s2, device, plan.peer_batch, bf16)
    result.add(tuned, best, "pairs/s", side="peer", vs=PEER,
               note="" if bf16 else f"{device} has no bf16 matrix instructions: fp32")
    result.data["peer_lines"] = {"CrossEncoder.predict": base, "CrossEncoder.predict tuned": best}
    write()
    gpu = cluster.gpus > 0
    most = int(cluster.gpus) if gpu else max(1, min(int(cluster.cpus), plan.max_cpu_actors))
    series: dict[str, list] = {"start included": [], "steady": []}
    result.data["actors"] = series
    for actors in actor_counts(most):
        cfg = LabelingConfig(actors=actors, num_gpus=1 if gpu else 0,
                             **({"block_size": plan.block_size} if plan.block_size else {}))
        n = plan.pairs_per_actor * actors
        r1, r2 = pairs_for(n)
        log(f"[bench] labelling: Ray pipeline, {actors} actor(s), {n:,} pairs in shards of {cfg.block_size:,}")
        got = pipeline_rate(model_dir, r1, r2, cfg, cluster.cpus)
        where = "GPU" if gpu else "CPU"
        result.add(f"engine: Ray pipeline, {actors} {where} actor(s), start included", got["start_included"],
                   "pairs/s", vs=PEER, note=f"{n:,} pairs; first shard after {got['first_shard_s']:.1f} s; "
                                            "vs peer: against its defaults")
        # The steady rates against the best the peer did: the pipeline's own batches are tuned too.
        result.add(f"engine: Ray pipeline, {actors} {where} actor(s), steady", got["steady"], "pairs/s", vs=tuned,
                   note=f"{got['shards']} shards" + ("" if got["steady"] else ": too few for a steady rate")
                        + f"; vs peer: against {tuned_setting}")
        if got["steady"]:
            result.add(f"engine: steady per actor, {actors} actor(s)", got["steady"] / actors, "pairs/s", vs=tuned,
                       note=f"vs peer: against {tuned_setting}")
        series["start included"].append((actors, got["start_included"]))
        series["steady"].append((actors, got["steady"]))
        result.data.setdefault("per_actor_steady", {})[str(actors)] = \
            got["steady"] / actors if got["steady"] else None
        result.data["device"] = where
        write()

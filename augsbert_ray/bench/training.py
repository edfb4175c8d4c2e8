"""The training loop: the engine's Ray Train stage against ``SentenceTransformer.fit``, on the
same pairs, model, batch size, epochs and learning rate; and the stage's fixed cost.

The engine's figures come from one ``training.ray_trainer.train_on_ray`` run (what a
bi-encoder stage runs, checkpoints included): pairs/s inside its training loop, pairs/s over
the whole call, and the time outside the loop (Ray Train's start, loading the model and the
data, checkpoints, exporting the model). The peer's is its whole ``fit`` call.
"""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from augsbert_ray.bench.records import PartResult

PEER = "SentenceTransformer.fit (CosineSimilarityLoss)"


def peer_fit(model: str, s1: list[str], s2: list[str], labels: np.ndarray, hp: dict, device: str) -> float:
    """Seconds of one ``SentenceTransformer.fit`` call on the pairs."""
    import torch
    from sentence_transformers import InputExample, SentenceTransformer, losses
    from torch.utils.data import DataLoader

    from augsbert_ray.models import resolve_model

    torch.manual_seed(hp["seed"])
    st = SentenceTransformer(str(resolve_model(model)), device=device)
    st.max_seq_length = 128
    examples = [InputExample(texts=[a, b], label=float(y)) for a, b, y in zip(s1, s2, labels)]
    loader = DataLoader(examples, shuffle=True, batch_size=hp["batch_size"])
    steps = len(loader) * hp["epochs"]
    t0 = time.perf_counter()
    st.fit(train_objectives=[(loader, losses.CosineSimilarityLoss(st))], epochs=hp["epochs"],
           warmup_steps=math.ceil(hp["warmup_ratio"] * steps), optimizer_params={"lr": hp["lr"]},
           show_progress_bar=False)
    return time.perf_counter() - t0


def engine_fit(model: str, s1: list[str], s2: list[str], labels: np.ndarray, hp: dict, cluster) -> tuple[dict, float]:
    """(the training statistics, wall seconds) of one bi-encoder training stage on Ray Train."""
    from augsbert_ray.runtime import per_worker_cpus
    from augsbert_ray.training.ray_trainer import WorkerResources, train_on_ray

    pairs = pa.table({"sentence1": s1, "sentence2": s2, "label": pa.array(labels, pa.float32())})
    resources = WorkerResources(1, cluster.gpus > 0, per_worker_cpus(None, cluster.cpus, 1))
    with tempfile.TemporaryDirectory(prefix="bench-training-") as tmp:
        t0 = time.perf_counter()
        stats = train_on_ray("bi_encoder", pairs, recipe={"model": model, "max_length": 128}, hparams=hp,
                             resources=resources, storage_dir=Path(tmp) / "train", out_dir=Path(tmp) / "model",
                             name="bench-bi-encoder")
        return stats, time.perf_counter() - t0


def run(result: PartResult, model: str, pairs_for, plan, cluster, device: str, log, write) -> None:
    """Fills ``result`` with both trainers' pairs/s and the engine stage's fixed cost."""
    from augsbert_ray.training.fit import fixed_seconds

    s1, s2 = pairs_for(plan.train_pairs)
    labels = np.random.default_rng(0).uniform(0, 1, len(s1)).astype(np.float32)
    hp = {"epochs": 1, "lr": 2e-5, "batch_size": plan.train_batch, "warmup_ratio": 0.1, "seed": 1}
    n = len(s1) * hp["epochs"]
    log(f"[bench] training: {PEER}, {len(s1):,} pairs, batch {hp['batch_size']} ({device})")
    peer_s = peer_fit(model, s1, s2, labels, hp, device)
    result.add(PEER, n / peer_s, "pairs/s", side="peer", note=f"the whole fit call, {peer_s:.1f} s, on the driver's "
                                                               f"{device}")
    write()
    log("[bench] training: the engine's bi-encoder stage on Ray Train")
    stats, wall = engine_fit(model, s1, s2, labels, hp, cluster)
    where = "GPU" if cluster.gpus > 0 else "CPU"
    result.add("engine: Ray Train, in the training loop", stats.get("pairs_per_s"), "pairs/s", vs=PEER,
               note=f"1 {where} worker, {stats.get('precision', 'fp32')}")
    result.add("engine: Ray Train, the whole stage", n / wall, "pairs/s", vs=PEER, note=f"{wall:.1f} s")
    fixed = fixed_seconds(stats, wall)
    result.add("engine: a training stage's fixed cost (time outside the loop)", fixed, "s", side="info",
               note="Ray Train's start, model and data loading, checkpoints, export")
    result.data.update({"pairs": len(s1), "hparams": hp, "engine_wall_s": wall, "peer_s": peer_s,
                        "loop_s": stats.get("seconds")})

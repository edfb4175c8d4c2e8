"""Step 2.2 (AugSBERT section 3): the cross-encoder labels the candidates ("silver" pairs).

The pairs stream from ``candidates.parquet`` through a Ray Data actor pool into committed
shards in this stage's folder and from there into ``silver.parquet``; the driver never
holds them all (``labeling.label_candidates_file``). A labelling interrupted by a crash
resumes from its committed shards. A strategy that labels a pool and keeps part of it
(KDE) keeps the labelled pool as ``silver_pool.parquet``.
"""

from __future__ import annotations

import shutil
import time

import numpy as np
import pyarrow.parquet as pq

from augsbert_ray import schema
from augsbert_ray.stages.base import Declaration, Stage


def selector_of(cfg):
    """The post-labelling selection of the job's strategy (KDE), if any; target pairs are used as they are."""
    from augsbert_ray.candidates import SELECTORS

    sampled = cfg.target is None or cfg.target.corpus is not None
    return SELECTORS.get(cfg.sampling.strategy) if sampled else None


class Silver(Stage):
    name = "silver"
    kind = "label"
    unit = "pairs"

    def throughput(self, result: dict, seconds: float) -> str:
        return f"{result['labelled'] / seconds:.1f} pairs labelled/s" if seconds else ""

    def work(self, cfg, results):
        n = results.get("candidates", {}).get("candidates")
        return None if n is None else (n, "pairs", "labelled pair")

    def declare(self, cfg) -> Declaration:
        reads = ["labeling", "cross_encoder.max_length"]
        inputs = {"candidates": "candidates/candidates.parquet", "teacher": "cross_encoder/model"}
        outputs = ["silver.parquet"]
        if selector_of(cfg) is not None:
            reads += ["sampling.strategy", "sampling.kde.bandwidth", "seed", "task"]
            inputs["gold"] = "gold/train.parquet"
            outputs.append("silver_pool.parquet")
        return Declaration(reads=tuple(reads), inputs=inputs, outputs=tuple(outputs))

    def run(self, inputs, settings, env) -> dict:
        from augsbert_ray.labeling import LabelingReport, ShardStore, label_candidates_file, pool_size
        from augsbert_ray.runtime import per_worker_cpus

        lab = settings.labeling
        actors = pool_size(lab, env.cluster.gpus)  # fixed here, so the CPUs per actor and the pool agree
        cpus = per_worker_cpus(lab.num_cpus, env.cluster.cpus, actors)
        # Shards are committed under this stage's folder; shards of another block size are stale.
        shards_dir = env.out / "shards"
        store_dir = shards_dir / f"block-{lab.block_size}"
        for old in shards_dir.glob("*") if shards_dir.exists() else []:
            if old != store_dir:
                shutil.rmtree(old, ignore_errors=True)
        store = ShardStore(store_dir)
        report = LabelingReport()
        last_push = [time.perf_counter()]

        def upload() -> None:  # with a remote run dir, committed shards reach the storage often
            if time.perf_counter() - last_push[0] > 30:
                env.runner.rd.push()
                last_push[0] = time.perf_counter()

        selecting = "gold" in inputs
        labelled_file = env.out / ("silver_pool.parquet" if selecting else "silver.parquet")
        labelled = label_candidates_file(
            inputs.path("candidates"), labelled_file, env.ship(inputs.path("teacher")), lab,
            settings.cross_encoder.max_length, cpus, actors=actors, store=store, log=env.log, on_commit=upload,
            report=report, progress=env.reporter(local=True))
        rate = report.labelled_pairs / report.seconds if report.seconds else 0.0
        env.log(f"[silver] labelled {report.labelled_pairs} pairs in {report.labelled} shards "
                f"({rate:.1f} pairs/s, {actors} actor(s) of {cpus:g} CPUs and {lab.num_gpus:g} GPUs); "
                f"{report.reused} shards reused from an earlier run")
        n_silver = labelled
        if selecting:  # e.g. KDE: the labelled pool is kept, the selection trains
            from augsbert_ray.candidates import SELECTORS
            from augsbert_ray.rundir import write_table

            gold_labels = inputs.table("gold").column(schema.LABEL).to_numpy()
            s = settings.sampling
            silver = SELECTORS[s.strategy](pq.read_table(labelled_file), gold_labels, settings.task, settings.seed,
                                           s)
            env.log(f"[silver] {s.strategy} selection kept {silver.num_rows} of {labelled}")
            write_table(env.out / "silver.parquet", silver)
            n_silver = silver.num_rows
            del silver
        shutil.rmtree(shards_dir, ignore_errors=True)  # silver.parquet now holds every shard
        labels = pq.read_table(env.out / "silver.parquet", columns=[schema.LABEL]).column(0).to_numpy()
        return {
            "labelled": labelled,
            "silver": n_silver,
            "pairs_per_s": rate,
            "actors": actors,
            "cpus_per_actor": cpus,
            "precision": lab.precision,
            "shards": {"total": report.shards, "reused": report.reused, "labelled": report.labelled,
                       "block_size": lab.block_size},
            "label_mean": float(labels.mean()) if len(labels) else None,
            "label_hist": np.histogram(labels, bins=10, range=(0, 1))[0].tolist(),
        }

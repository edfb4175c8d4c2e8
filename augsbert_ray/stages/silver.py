"""Step 2.2 (AugSBERT section 3): the cross-encoder labels the candidates ("silver" pairs).

The pairs stream from ``candidates.parquet`` through a Ray Data actor pool into committed
shards in this stage's folder and from there into ``silver.parquet``; the driver never
holds them all (``labeling.label_candidates_file``). A labelling interrupted by a crash
resumes from its committed shards. A strategy that labels a pool and keeps part of it
(KDE) keeps the labelled pool as ``silver_pool.parquet``.
"""

from __future__ import annotations

import logging
import shutil
import time

import numpy as np
import pyarrow.parquet as pq
from pydantic import BaseModel

from augsbert_ray import schema
from augsbert_ray.config import LabelingConfig, SamplingConfig
from augsbert_ray.stages.base import Declaration, Stage, StageParams, StageResult, SummaryContext, narrowed

log = logging.getLogger(__name__)


def selector_of(cfg):
    """The post-labelling selection of the job's strategy (KDE), if any; target pairs are used as they are."""
    from augsbert_ray.candidates import SELECTORS

    sampled = cfg.target is None or cfg.target.corpus is not None
    return SELECTORS.get(cfg.sampling.strategy) if sampled else None


class Selection(StageParams):
    """A selection from the labelled pool (KDE): the pool is kept, the selection trains."""

    sampling: SamplingConfig  # its strategy and the selector's settings (the others at their defaults)
    seed: int
    task: str


class SilverParams(StageParams):
    labeling: LabelingConfig  # every labelling key but the calibration, which a later stage applies
    max_length: int  # the teacher's
    selection: Selection | None = None


class Shards(BaseModel):
    total: int
    reused: int
    labelled: int
    block_size: int


class SilverResult(StageResult):
    """The teacher's labels: how many pairs, how fast, and their distribution."""

    labelled: int
    silver: int
    pairs_per_s: float
    first_shard_seconds: float | None = None
    actors: int
    cpus_per_actor: float
    precision: str
    shards: Shards
    label_mean: float | None = None
    label_hist: list[int] = []

    def section(self, ctx: SummaryContext) -> list[str]:
        return [f"Labelled: {self.labelled}; silver pairs used: {self.silver} (density plot: silver_density.png)."]

    def view(self, stage: str) -> dict:
        return {"sampling": {"labelled": self.labelled, "silver": self.silver, "silver_label_mean": self.label_mean,
                             "silver_label_hist": self.label_hist, "labeling_pairs_per_s": self.pairs_per_s}}


class Silver(Stage):
    name = "silver"
    kind = "label"
    unit = "pairs"
    result_type = SilverResult
    publishes = {"silver.parquet": "silver.parquet", "silver_pool.parquet": "silver_pool.parquet"}
    runs_after = ("teacher_check",)  # a teacher that fails the check (``stop``) labels nothing

    def throughput(self, result: SilverResult, seconds: float) -> str:
        return f"{result.labelled / seconds:.1f} pairs labelled/s" if seconds else ""

    def fixed_seconds(self, result: SilverResult, seconds: float) -> float | None:
        return result.first_shard_seconds

    def work(self, params, results):
        return None if "candidates" not in results else (results["candidates"].candidates, "pairs", "labelled pair")

    def declare(self, cfg) -> Declaration:
        params = SilverParams(labeling=narrowed(cfg.labeling, [k for k in LabelingConfig.model_fields
                                                               if k != "calibration"]),
                              max_length=cfg.cross_encoder.max_length)
        inputs = {"candidates": "candidates/candidates.parquet", "teacher": "cross_encoder/model"}
        outputs = ["silver.parquet"]
        if selector_of(cfg) is not None:
            selection = Selection(sampling=narrowed(cfg.sampling, ["strategy", "kde.bandwidth"]), seed=cfg.seed,
                                  task=cfg.task)
            params = params.model_copy(update={"selection": selection})
            inputs["gold"] = "gold/train.parquet"
            outputs.append("silver_pool.parquet")
        return Declaration(params, inputs=inputs, outputs=tuple(outputs))

    def run(self, inputs, params: SilverParams, env) -> SilverResult:
        from augsbert_ray.labeling import LabelingReport, ShardStore, actor_cpus, label_candidates_file, pool_size

        lab = params.labeling
        actors = pool_size(lab, env.cluster.gpus, env.cluster.cpus)  # fixed here, so the CPUs per actor and the pool agree
        cpus = actor_cpus(lab, env.cluster.cpus, actors)
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
                env.rd.push()
                last_push[0] = time.perf_counter()

        selecting = params.selection is not None
        labelled_file = env.out / ("silver_pool.parquet" if selecting else "silver.parquet")
        labelled = label_candidates_file(
            inputs.path("candidates"), labelled_file, env.ship(inputs.path("teacher")), lab,
            params.max_length, cpus, actors=actors, store=store, on_commit=upload,
            report=report, progress=env.reporter(local=True), hosts=env.hosts)
        rate = report.labelled_pairs / report.seconds if report.seconds else 0.0
        log.info(f"[silver] labelled {report.labelled_pairs} pairs in {report.labelled} shards "
                 f"({rate:.1f} pairs/s, {actors} actor(s) of {cpus:g} CPUs and {lab.num_gpus:g} GPUs); "
                 f"{report.reused} shards reused from an earlier run")
        n_silver = labelled
        if selecting:  # e.g. KDE: the labelled pool is kept, the selection trains
            from augsbert_ray.candidates import SELECTORS
            from augsbert_ray.rundir import write_table

            gold_labels = inputs.table("gold").column(schema.LABEL).to_numpy()
            sel = params.selection
            s = sel.sampling
            silver = SELECTORS[s.strategy](pq.read_table(labelled_file), gold_labels, sel.task, sel.seed, s)
            log.info(f"[silver] {s.strategy} selection kept {silver.num_rows} of {labelled}")
            write_table(env.out / "silver.parquet", silver)
            n_silver = silver.num_rows
            del silver
        shutil.rmtree(shards_dir, ignore_errors=True)  # silver.parquet now holds every shard
        hist, total, n = np.zeros(10, np.int64), 0.0, 0  # read a batch at a time: any number of pairs
        for batch in pq.ParquetFile(env.out / "silver.parquet").iter_batches(1 << 20, columns=[schema.LABEL]):
            values = batch.column(0).to_numpy(zero_copy_only=False)
            hist += np.histogram(values, bins=10, range=(0, 1))[0]
            total, n = total + float(np.sum(values, dtype=np.float64)), n + len(values)
        return SilverResult(
            labelled=labelled, silver=n_silver, pairs_per_s=rate, first_shard_seconds=report.first_shard_seconds,
            actors=actors, cpus_per_actor=cpus, precision=lab.precision,
            shards=Shards(total=report.shards, reused=report.reused, labelled=report.labelled,
                          block_size=lab.block_size),
            label_mean=total / n if n else None, label_hist=hist.tolist())


def fit_calibration(teacher_scores: np.ndarray, gold_labels: np.ndarray):
    """An increasing map from the teacher's scores to the gold scale, fitted on dev: isotonic
    regression of the gold labels on the scores, clipped to [0, 1] (and to the dev scores'
    range outside it). Returns a function of an array of scores."""
    from sklearn.isotonic import IsotonicRegression

    iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip")
    iso.fit(np.asarray(teacher_scores, np.float64), np.asarray(gold_labels, np.float64))
    return lambda scores: iso.predict(np.asarray(scores, np.float64)).astype(np.float32)


class CalibrateParams(StageParams):
    method: str  # labeling.calibration


class Distribution(BaseModel):
    """Labels' mean, standard deviation and histogram over ten bins of [0, 1]."""

    mean: float
    std: float
    hist: list[int]

    @classmethod
    def of(cls, x: np.ndarray) -> "Distribution":
        return cls(mean=float(x.mean()), std=float(x.std()), hist=np.histogram(x, bins=10, range=(0, 1))[0].tolist())


class CalibrationResult(StageResult):
    """The silver labels before and after their map to the gold scale, beside gold dev's."""

    method: str
    dev_pairs: int
    before: Distribution
    after: Distribution
    gold_dev: Distribution

    def section(self, ctx: SummaryContext) -> list[str]:
        bins = [f"{i / 10:.1f}-{(i + 1) / 10:.1f}" for i in range(10)]
        row = lambda name, d: (f"| {name} | {d.mean:.3f} | {d.std:.3f} | "  # noqa: E731
                               + " | ".join(f"{100 * n / max(1, sum(d.hist)):.0f}%" for n in d.hist) + " |")
        return [f"Silver labels calibrated ({self.method}, fitted on {self.dev_pairs} dev pairs' teacher scores and "
                "gold labels); label distribution:", "",
                "| labels | mean | std | " + " | ".join(bins) + " |", "|---|---:|---:|" + "---:|" * len(bins),
                row("silver as the teacher scored them", self.before), row("silver calibrated", self.after),
                row("gold (dev)", self.gold_dev)]

    def view(self, stage: str) -> dict:
        return {"calibration": self.model_dump()}


class Calibrate(Stage):
    """The silver labels mapped to the gold scale (``labeling.calibration: isotonic``).

    A sigmoid teacher trained with cross-entropy tends to compress its scores towards the
    middle, so its labels teach the student another scale than gold's. The map is fitted on
    dev, where the teacher's scores and the gold labels are both known (the teacher's scores
    there come from its evaluation stage), and applied to every silver label; the report shows
    the label distribution before and after.
    """

    name = "calibrate"
    kind = "label"
    needs_ray = False
    unit = "pairs"
    result_type = CalibrationResult
    publishes = {"silver.parquet": "silver_calibrated.parquet"}

    def declare(self, cfg) -> Declaration:
        return Declaration(CalibrateParams(method=cfg.labeling.calibration),
                           inputs={"silver": "silver/silver.parquet",
                                   "teacher": "eval_cross_encoder/predictions.parquet"},
                           outputs=("silver.parquet",))

    def run(self, inputs, params: CalibrateParams, env) -> CalibrationResult:
        import pyarrow as pa
        import pyarrow.compute as pc

        from augsbert_ray.rundir import write_table

        preds = inputs.table("teacher")
        dev = preds.filter(pc.equal(preds.column("split"), "dev"))
        mapping = fit_calibration(dev.column("prediction").to_numpy(), dev.column(schema.LABEL).to_numpy())
        silver = inputs.table("silver")
        before = silver.column(schema.LABEL).to_numpy()
        after = mapping(before)
        silver = silver.set_column(silver.schema.get_field_index(schema.LABEL), schema.LABEL, pa.array(after))
        write_table(env.out / "silver.parquet", silver, schema.SILVER_SCHEMA)
        gold = dev.column(schema.LABEL).to_numpy()
        log.info(f"[calibrate] {params.method} map fitted on {len(gold)} dev pairs: silver label mean "
                 f"{before.mean():.3f} -> {after.mean():.3f} (gold dev {gold.mean():.3f})")
        return CalibrationResult(method=params.method, dev_pairs=len(gold), before=Distribution.of(before),
                                 after=Distribution.of(after), gold_dev=Distribution.of(gold))

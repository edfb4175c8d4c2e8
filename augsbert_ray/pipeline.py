"""The AugSBERT job, in the paper's order (Thakur et al., NAACL 2021, section 3).

    gold pairs -> step 1: cross-encoder on gold
               -> references: zero-shot and gold-only bi-encoders (and the teacher check)
               -> step 2.1: sample unlabelled candidate pairs
               -> step 2.2: the cross-encoder labels them (silver pairs)
               -> step 3: bi-encoder on gold + silver
               -> evaluation and report

Each step is a stage with fixed artifacts in the run directory and a completion marker;
re-running a job skips the stages whose inputs and config are unchanged.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from augsbert_ray import schema
from augsbert_ray.candidates import EMBEDS, SELECTORS, SamplingContext, get_sampler
from augsbert_ray.candidates.pairs import finalize_candidates, gold_pair_keys, unique_sentences
from augsbert_ray.config import EMBEDDED_MODEL, JobConfig, dump_job
from augsbert_ray.errors import TeacherCheckError
from augsbert_ray.evaluation import (
    PRIMARY_METRIC,
    TARGET_METRIC,
    jaccard_predictions,
    majority_metrics,
    target_metrics,
    task_metrics,
)
from augsbert_ray.loaders import load_pairs
from augsbert_ray.models import TRUST_REMOTE_CODE_ENV, model_content_id
from augsbert_ray.report import versions, write_density_plot, write_report
from augsbert_ray.rundir import RunDir, fingerprint, table_fingerprint
from augsbert_ray.runtime import ClusterResources, per_worker_cpus, remote_call, start_ray
from augsbert_ray.training.ray_trainer import WorkerResources, train_on_ray

SPLITS = ("train", "dev", "test")
PAIR_COLUMNS = [schema.SENTENCE1, schema.SENTENCE2, schema.LABEL]


def run_job(cfg: JobConfig, log: Callable[[str], None] = print, fresh: bool = False, progress=None,
            verbose: bool = True) -> dict:
    """Runs one AugSBERT job end to end and returns its metrics (also written to the run dir).

    A re-run resumes: stages an earlier run completed (same fingerprint, outputs intact) are
    skipped, and labelling reuses the shards it committed. ``fresh`` redoes everything.
    ``progress`` (a ``progress.JobProgress``) shows the stages; ``verbose=False`` keeps Ray's
    own messages off the terminal (``runtime.start_ray``).
    """
    job = Job(cfg, RunDir(cfg.resolved_run_dir, log), log, fresh=fresh, progress=progress, verbose=verbose)
    gold = job.load_gold()  # gold pairs (checked before any cluster work starts)
    target = job.load_target()  # domain adaptation: target pairs and test set (None in-domain)
    job.start()
    teacher = job.train_cross_encoder(gold)  # step 1
    job.evaluate_zero_shot(gold)  # reference: the untrained bi-encoder
    gold_only = job.train_bi_encoder(gold, silver=None)  # reference: gold only (the lower bound across domains)
    if target is not None:
        job.train_upper_bound(target)  # reference: trained on the target's own labels, when it has them
    job.teacher_check(teacher, gold_only)
    # step 2.1: target pairs as they are, or pairs sampled from the gold sentences
    candidates = job.target_candidates(target) if target is not None else job.sample_candidates(gold)
    silver = job.label_silver(candidates, teacher)  # step 2.2
    job.train_bi_encoder(gold, silver=silver)  # step 3
    return job.finish(gold)


def carve_dev(train: pa.Table, fraction: float, seed: int) -> tuple[pa.Table, pa.Table]:
    """Splits a seeded random ``fraction`` of the training pairs off as dev (both keep file order)."""
    n_dev = max(1, round(train.num_rows * fraction))
    dev_rows = np.zeros(train.num_rows, dtype=bool)
    dev_rows[np.random.default_rng([seed, 99]).choice(train.num_rows, n_dev, replace=False)] = True
    dev = train.filter(pa.array(dev_rows))
    dev = dev.set_column(dev.schema.get_field_index(schema.SPLIT), schema.SPLIT, pa.array(["dev"] * dev.num_rows))
    return train.filter(pa.array(~dev_rows)), dev


def _model_id(name: str) -> str:
    """What identifies a configured model in a fingerprint (content hashes; see ``model_content_id``)."""
    return model_content_id(name)


@dataclass
class Stage:
    """A stage's recorded result and the fingerprint downstream stages depend on."""

    result: dict
    fp: str


@dataclass
class Job:
    cfg: JobConfig
    rd: RunDir
    log: Callable[[str], None]
    cluster: ClusterResources | None = None
    results: dict = field(default_factory=dict)
    stage_seconds: dict = field(default_factory=dict)
    reused: list = field(default_factory=list)  # stages skipped because an earlier run completed them
    stage_fp: dict = field(default_factory=dict)  # stage name -> fingerprint, for dependants
    _shipped: dict = field(default_factory=dict)  # model path -> ShippedModel
    fresh: bool = False  # redo every stage, ignoring what earlier runs completed
    target_eval: dict = field(default_factory=dict)  # "target_test" (and "target_dev") tables
    target_fp: dict = field(default_factory=dict)
    # -- progress display (progress.JobProgress; None: log lines only) ----------------------
    progress: object = None
    verbose: bool = True  # False: Ray's own messages go to <run dir>/logs/ray.log
    channel: object = None  # progress_channel.ProgressChannel: workers' steps reach the display
    _current: str | None = None  # the stage running now

    # -- plumbing -------------------------------------------------------------------------
    def start(self) -> None:
        self.rd.write_text("config.yaml", dump_job(self.cfg))
        self.log(f"[augsbert] job '{self.cfg.name}': run directory {self.rd.location}"
                 + (f" (staged locally in {self.rd.root})" if self.rd.uri else ""))
        # Only a job that trusts remote code sets the flag for its workers (and its runtime env).
        os.environ.pop(TRUST_REMOTE_CODE_ENV, None)
        env = {TRUST_REMOTE_CODE_ENV: "1"} if self.cfg.trust_remote_code else None
        if self.cfg.trust_remote_code:
            self.log("[augsbert] WARNING: trust_remote_code is on: Python code shipped with the configured models "
                     "will run on the driver and every Ray worker. Use it only for models whose code you trust.")
        self.cluster = start_ray(self.cfg.ray.address, self.cfg.ray.num_cpus, env_vars=env, verbose=self.verbose,
                                 log_dir=None if self.verbose else self.rd.path("logs"))
        if self.progress is not None:
            from augsbert_ray.progress_channel import ProgressChannel

            self.channel = ProgressChannel(self.progress)
        self.log(f"[augsbert] Ray cluster: {self.cluster.describe()}")
        if self.cluster.logs or self.cluster.dashboard:
            self.log(f"[augsbert] Ray logs: {self.cluster.logs or 'see the cluster'}; dashboard: "
                     f"{self.cluster.dashboard or 'not started'} (bound to the head; reach it by SSH tunnel)")

    def stage(self, name: str, fp: str, run: Callable[[], dict], outputs: tuple[str, ...] = ()) -> Stage:
        """Runs a stage unless an earlier run completed it with this fingerprint and its outputs
        (``outputs`` and the ``model`` it names) are still there as they were written."""
        done = None if self.fresh else self.rd.completed(name, fp)
        self._plan_progress()
        if done is not None:
            if not self._show(name, "reused", done["seconds"]):
                self.log(f"[{name}] complete in an earlier run; skipped")
            self.reused.append(name)
        else:
            if not self._show(name, "start"):
                self.log(f"[{name}] started")
            self._current = name
            t0 = time.perf_counter()
            done = run()
            done["seconds"] = time.perf_counter() - t0
            model = done.get("model")
            self.rd.mark_completed(name, fp, done, outputs=outputs + ((model,) if model else ()))
            if not self._show(name, "done", done["seconds"]):
                self.log(f"[{name}] done in {done['seconds']:.1f}s")
        self.stage_seconds[name] = done["seconds"]
        self.results[name] = done
        self.stage_fp[name] = fp
        self._plan_progress()
        return Stage(done, fp)

    # -- progress display: a demonstration of progress.py's API -------------------------------
    def _show(self, name: str, event: str, seconds: float | None = None) -> bool:
        """Tells the display a stage started, finished or was reused; False without a display."""
        if self.progress is None:
            return False
        if event == "start":
            self.progress.start_stage(name)
        else:
            self.progress.finish_stage(name, seconds, reused=event == "reused")
        return True

    def _reporter(self, local: bool = False):
        """The running stage's ``StageProgress``: picklable for workers, or ``local`` (driver only)."""
        if self.progress is None or self._current is None:
            return None
        if local or self.channel is None:
            return self.progress.stage(self._current)
        return self.channel.handle.stage(self._current)

    def _plan_progress(self) -> None:
        """Declares the work of stages not started yet, as far as it is known, for the job's ETA."""
        if self.progress is None or "data" not in self.results:
            return
        from augsbert_ray.training.loop import steps_per_epoch

        workers = self.cfg.training.num_workers
        n_gold = self.results["data"]["train"]
        mix = self.cfg.target is None or self.cfg.target.mix_source_gold
        plans = {"cross_encoder": ("cross_encoder", n_gold), "gold_only": ("bi_encoder", n_gold)}
        if "silver" in self.results:
            plans["augsbert"] = ("bi_encoder", (n_gold if mix else 0) + self.results["silver"]["silver"])
        for stage, (kind, n) in plans.items():
            c = getattr(self.cfg, kind)
            if stage not in self.results and not self._searched(kind) and n:
                self.progress.plan(stage, total=steps_per_epoch(n, c.batch_size, workers) * c.epochs, unit="steps",
                                   rate_key=f"{kind} step")
        if "candidates" in self.results and "silver" not in self.results:
            self.progress.plan("silver", total=self.results["candidates"]["candidates"], unit="pairs")

    @property
    def cpus_per_worker(self) -> float:
        t = self.cfg.training
        return per_worker_cpus(t.cpus_per_worker, self.cluster.cpus, t.num_workers)

    def _eval_resources(self) -> dict:
        return {"num_cpus": self.cpus_per_worker, "num_gpus": 1 if self.cfg.training.use_gpu else 0}

    # -- gold ----------------------------------------------------------------------------
    def load_gold(self) -> dict[str, pa.Table]:
        d = self.cfg.data
        gold, skipped, read, filtered = {}, [], {}, {}
        for split in SPLITS:
            source = getattr(d, split)
            if source is None:  # dev carved from train below
                continue
            res = load_pairs(source, split, binary=self.cfg.task == "binary", on_bad_rows=d.on_bad_rows)
            gold[split] = res.table
            read[split] = res.rows_read
            if source.genres is not None:
                filtered[split] = res.filtered
                self.log(f"[gold] {split}: kept genres {', '.join(source.genres)} ({res.table.num_rows} pairs); "
                         f"{res.filtered} pairs of other genres left out")
            skipped += [dict(split=split, **vars(s)) for s in res.skipped]
        if d.dev is None:
            gold["train"], gold["dev"] = carve_dev(gold["train"], d.dev_fraction, d.subsample_seed)
            self.results["dev_carved"] = (
                f"{gold['dev'].num_rows} of {gold['dev'].num_rows + gold['train'].num_rows} training pairs "
                f"(fraction {d.dev_fraction}, seed {d.subsample_seed}), removed from train"
            )
            self.log(f"[gold] dev split carved from train: {self.results['dev_carved']}")
        for split in SPLITS:
            table = gold[split]
            if split in d.subsample and d.subsample[split] < table.num_rows:
                rng = np.random.default_rng([d.subsample_seed, SPLITS.index(split)])
                table = table.take(np.sort(rng.choice(table.num_rows, d.subsample[split], replace=False)))
            gold[split] = table
            self.rd.write_table(f"gold/{split}.parquet", table)
        self.rd.write_text("gold/skipped_rows.jsonl", "".join(json.dumps(s) + "\n" for s in skipped))
        self.results["data"] = {
            **{s: gold[s].num_rows for s in SPLITS},
            "rows_read": read,
            "skipped_rows": len(skipped),
            "subsample": dict(d.subsample),
            **({"other_genres_left_out": filtered} if filtered else {}),
        }
        if skipped:
            self.log(f"[gold] skipped {len(skipped)} malformed rows (listed in gold/skipped_rows.jsonl)")
        self.log("[gold] pairs: " + ", ".join(f"{s} {gold[s].num_rows}" for s in SPLITS))
        # Content, not provenance: the same pairs read through another path (a different
        # AUGSBERT_DATA_DIR spelling, a copied file) must not invalidate finished stages.
        self.gold_fp = {s: table_fingerprint(gold[s].drop_columns([schema.SOURCE])) for s in SPLITS}
        return gold

    def load_target(self) -> dict[str, pa.Table] | None:
        """Domain adaptation: the target pairs (labels optional) and the labelled target test/dev sets."""
        t = self.cfg.target
        if t is None:
            return None
        binary = self.cfg.target_task == "binary"
        target, counts = {}, {}
        for name, source, is_eval in (("pairs", t.pairs, False), ("test", t.test, True), ("dev", t.dev, True)):
            # (corpus mode has no target pairs: its sentences are read by the candidates stage)
            if source is None:
                continue
            res = load_pairs(source, f"target_{name}", binary=binary and is_eval, on_bad_rows=self.cfg.data.on_bad_rows)
            if res.skipped:
                self.rd.write_text(f"gold/target_{name}_skipped_rows.jsonl",
                                   "".join(json.dumps(vars(r)) + "\n" for r in res.skipped))
                self.log(f"[target] {name}: skipped {len(res.skipped)} malformed rows "
                         f"(listed in gold/target_{name}_skipped_rows.jsonl)")
            target[name] = res.table
            counts[name] = {"pairs": res.table.num_rows, "rows_read": res.rows_read, "skipped_rows": len(res.skipped)}
            self.rd.write_table(f"gold/target_{name}.parquet", res.table)
        if "pairs" in target:
            labels = target["pairs"].column(schema.LABEL).to_numpy()
            counts["pairs"]["labelled"] = bool(len(labels) and np.isfinite(labels).all())
        self.results["target_data"] = counts
        self.target_eval = {f"target_{n}": target[n].select(PAIR_COLUMNS) for n in ("test", "dev") if n in target}
        self.target_fp = {n: table_fingerprint(target[n].drop_columns([schema.SOURCE])) for n in target}
        self.log("[target] pairs: " + ", ".join(f"{n} {target[n].num_rows}" for n in target)
                 + ("" if counts.get("pairs", {}).get("labelled", True) else " (target pairs unlabelled)")
                 + ("" if t.corpus is None else f"; sentences from the corpus {t.corpus.path}"))
        return target

    def _target_fp(self) -> list:
        """What target evaluation adds to a stage's fingerprint (nothing in-domain, so
        fingerprints of in-domain jobs stay as they were)."""
        if self.cfg.target is None:
            return []
        return [self.cfg.target_task, {n: self.target_fp[n] for n in ("test", "dev") if n in self.target_fp}]

    def _eval_splits(self, gold: dict[str, pa.Table]) -> dict[str, pa.Table]:
        return {**{s: gold[s].select(PAIR_COLUMNS) for s in ("dev", "test")}, **self.target_eval}

    @property
    def metric(self) -> str:
        return PRIMARY_METRIC[self.cfg.task]

    def _metrics(self, gold: dict[str, pa.Table], preds: dict) -> dict:
        scores = task_metrics(self.cfg.task, {s: preds[s] for s in ("dev", "test")}, gold)
        if self.target_eval:
            scores.update(target_metrics(self.cfg.target_task, {s: preds[s] for s in self.target_eval}, self.target_eval))
        return scores

    def _fmt(self, split_scores: dict) -> str:
        return f"{self.metric} {split_scores[self.metric]:.2f}"

    def _fmt_all(self, scores: dict) -> str:
        line = f"dev {self._fmt(scores['dev'])}, test {self._fmt(scores['test'])}"
        if "target_test" in scores:
            m = TARGET_METRIC[self.cfg.target_task]
            line += f", target test {m} {scores['target_test'][m]:.2f}"
        return line

    # -- step 1 --------------------------------------------------------------------------
    def train_cross_encoder(self, gold: dict[str, pa.Table]) -> Stage:
        c = self.cfg.cross_encoder
        fp = fingerprint("cross_encoder", c.model_dump(), _model_id(c.model), self.cfg.seed, self.gold_fp,
                         *self._search_fp("cross_encoder"), *self._target_fp(), *self._precision_fp())
        out = self.rd.path("models", "cross-encoder")

        def run() -> dict:
            stats = self._fit("cross_encoder", gold["train"], gold,
                              recipe={"model": self._base_model(c.model), "max_length": c.max_length},
                              hparams=self._hparams(c), out=out, name="cross-encoder", fp=fp)
            scores = self._metrics(gold, remote_call(_predict_cross_encoder, self._ship(out), self._eval_splits(gold),
                                                     self.cfg.evaluation.batch_size, c.max_length, **self._eval_resources()))
            self.log(f"[cross_encoder] {self._fmt_all(scores)}")
            return {"model": "models/cross-encoder", "train": stats, "scores": scores}

        return self.stage("cross_encoder", fp, run)

    # -- references ----------------------------------------------------------------------
    def evaluate_zero_shot(self, gold: dict[str, pa.Table]) -> Stage:
        b = self.cfg.bi_encoder
        fp = fingerprint("zero_shot", _model_id(b.model), b.max_length, b.num_layers, self.gold_fp["dev"], self.gold_fp["test"],
                         *self._target_fp())

        def run() -> dict:
            scores = self._metrics(gold, remote_call(_predict_bi_encoder, self._base_model(b.model), self._eval_splits(gold),
                                                     self.cfg.evaluation.batch_size, b.max_length, b.num_layers,
                                                     **self._eval_resources()))
            self.log(f"[zero_shot] {self._fmt_all(scores)}")
            return {"scores": scores}

        return self.stage("zero_shot", fp, run)

    def teacher_check(self, teacher: Stage, gold_only: Stage) -> None:
        """AugSBERT helps only if the teacher beats the gold-only student on dev; say so loudly.

        Raises:
            TeacherCheckError: the teacher is not better and ``evaluation.teacher_check`` is "stop".
        """
        metric = self.metric
        ce = teacher.result["scores"]["dev"][metric]
        bi = gold_only.result["scores"]["dev"][metric]
        self.results["teacher_check"] = {"metric": metric, "cross_encoder_dev": ce, "gold_only_dev": bi, "gap": ce - bi}
        if ce <= bi:
            message = (
                f"the cross-encoder ({metric} {ce:.2f} on dev) is not better than the gold-only bi-encoder "
                f"({bi:.2f}); its silver labels are unlikely to help"
            )
            if self.cfg.evaluation.teacher_check == "stop":
                raise TeacherCheckError(
                    f"{message}. Stopping before labelling (evaluation.teacher_check=stop); try a stronger "
                    "teacher (cross_encoder.model / epochs / lr) or set evaluation.teacher_check=warn"
                )
            self.log(f"[teacher_check] WARNING: {message}")
        else:
            self.log(f"[teacher_check] cross-encoder leads the gold-only bi-encoder by {ce - bi:+.2f} {metric} on dev")

    # -- step 2 --------------------------------------------------------------------------
    def sample_candidates(self, gold: dict[str, pa.Table]) -> Stage:
        s = self.cfg.sampling
        # Semantic search embeds with a bi-encoder, so that model is an input too (and only then:
        # BM25 or random candidates do not change with the bi-encoder's seed).
        ss_fp = None
        if s.strategy in EMBEDS:
            ss_fp = self.stage_fp.get("gold_only") if s.ss_model == "gold_only" else _model_id(self.cfg.bi_encoder.model)
        fp = fingerprint("candidates", s.model_dump(), self.cfg.seed, self.gold_fp["train"], ss_fp)

        def run() -> dict:
            sentences = unique_sentences(gold["train"])
            candidates = self._sample(sentences, gold_pair_keys(gold["train"], sentences))
            self.rd.write_table("sentences.parquet", sentences)
            self.rd.write_table("candidates.parquet", candidates, schema.CANDIDATE_SCHEMA)
            self.log(f"[candidates] {candidates.num_rows} {s.strategy} pairs from {sentences.num_rows} sentences")
            return {"sentences": sentences.num_rows, "candidates": candidates.num_rows}

        return self.stage("candidates", fp, run, outputs=("sentences.parquet", "candidates.parquet"))

    def _sample(self, sentences: pa.Table, gold_keys: np.ndarray) -> pa.Table:
        """The job's sampling strategy over ``sentences`` (pairs in ``gold_keys`` left out)."""
        s = self.cfg.sampling
        ss_model = None  # only semantic search embeds sentences
        if s.strategy in EMBEDS:
            ss_model = (self._ship(self.rd.path(self.results["gold_only"]["model"])) if s.ss_model == "gold_only"
                        else self._base_model(self.cfg.bi_encoder.model))
        ctx = SamplingContext(
            sentences, gold_keys, s, self.rd.path("index"), self.cfg.seed,
            bi_encoder=ss_model, max_length=self.cfg.bi_encoder.max_length,
            cpus_per_actor=per_worker_cpus(None, self.cluster.cpus, s.searchers),
            gpus_per_actor=1 if self.cfg.training.use_gpu else 0, progress=self._reporter(),
        )
        return get_sampler(s.strategy)(ctx)

    def _selector(self):
        """The post-labelling selection of the strategy (KDE), if any; target pairs are used as they are."""
        sampled = self.cfg.target is None or self.cfg.target.corpus is not None
        return SELECTORS.get(self.cfg.sampling.strategy) if sampled else None

    def label_silver(self, candidates: Stage, teacher: Stage) -> Stage:
        fp = fingerprint("silver", candidates.fp, teacher.fp, self.cfg.cross_encoder.max_length, self.cfg.task,
                         self.cfg.sampling.kde.model_dump() if self._selector() else None)

        def run() -> dict:
            import shutil

            from augsbert_ray.labeling import LabelingReport, ShardStore, label_candidates_file, pool_size

            # The pool size is fixed here, so the CPUs per actor and the pool agree.
            lab = self.cfg.labeling.model_copy(update={"actors": pool_size(self.cfg.labeling, self.cluster.gpus)})
            cpus = per_worker_cpus(lab.num_cpus, self.cluster.cpus, lab.actors)
            # Shards are committed under names derived from this stage's inputs; another
            # fingerprint's or block size's shards are stale.
            shards_dir = self.rd.path("silver_shards")
            name = f"{fp[:16]}-{lab.block_size}"
            for old in shards_dir.glob("*") if shards_dir.exists() else []:
                if old.name != name:
                    shutil.rmtree(old, ignore_errors=True)
            store = ShardStore(shards_dir / name)
            report = LabelingReport()
            last_push = [time.perf_counter()]

            def upload() -> None:  # with a remote run dir, committed shards reach the storage often
                if self.rd.uri and time.perf_counter() - last_push[0] > 30:
                    self.rd.push()
                    last_push[0] = time.perf_counter()

            # The pairs stream from candidates.parquet through the actor pool into the shard
            # store and from there into the silver file; the driver holds none of them.
            select = self._selector()
            labelled_file = "silver_pool.parquet" if select is not None else "silver.parquet"
            labelled = label_candidates_file(
                self.rd.path("candidates.parquet"), self.rd.path(labelled_file),
                self._ship(self.rd.path(teacher.result["model"])), lab, self.cfg.cross_encoder.max_length, cpus,
                store=store, log=self.log, on_commit=upload, report=report, progress=self._reporter(local=True))
            rate = report.labelled_pairs / report.seconds if report.seconds else 0.0
            self.log(f"[silver] labelled {report.labelled_pairs} pairs in {report.labelled} shards "
                     f"({rate:.1f} pairs/s, {lab.actors} actor(s) of {cpus:g} CPUs and {lab.num_gpus:g} GPUs); "
                     f"{report.reused} shards reused from an earlier run")
            if select is not None:  # e.g. KDE: the labelled pool is kept, the selection trains
                gold_labels = self.rd.read_table("gold/train.parquet").column(schema.LABEL).to_numpy()
                silver = select(self.rd.read_table(labelled_file), gold_labels, self.cfg.task, self.cfg.seed,
                                self.cfg.sampling)
                self.log(f"[silver] {self.cfg.sampling.strategy} selection kept {silver.num_rows} of {labelled}")
                self.rd.write_table("silver.parquet", silver)
                n_silver = silver.num_rows
                del silver
            else:
                n_silver = labelled
            labels = pq.read_table(self.rd.path("silver.parquet"), columns=[schema.LABEL]).column(0).to_numpy()
            return {
                "labelled": labelled,
                "silver": n_silver,
                "pairs_per_s": rate,
                "actors": lab.actors,
                "cpus_per_actor": cpus,
                "precision": lab.precision,
                "shards": {"total": report.shards, "reused": report.reused, "labelled": report.labelled,
                           "block_size": lab.block_size},
                "label_mean": float(labels.mean()) if len(labels) else None,
                "label_hist": np.histogram(labels, bins=10, range=(0, 1))[0].tolist(),
            }

        done = self.stage("silver", fp, run, outputs=("silver.parquet",))
        self.rd.remove_tree("silver_shards")  # silver.parquet, now marked complete, holds every shard
        return done

    # -- step 3 --------------------------------------------------------------------------
    def train_bi_encoder(self, gold: dict[str, pa.Table], silver: Stage | None) -> Stage:
        b = self.cfg.bi_encoder
        name = "gold_only" if silver is None else "augsbert"
        objective = b.resolved_objective(self.cfg.task)
        mix = self.cfg.target is None or self.cfg.target.mix_source_gold  # gold in the AugSBERT training set
        fp = fingerprint(name, b.model_dump(), objective, _model_id(b.model), self.cfg.seed, self.gold_fp,
                         silver.fp if silver else None, *self._search_fp("bi_encoder"), *self._target_fp(),
                         *self._precision_fp(), *([] if mix or silver is None else ["target silver only"]))
        out = self.rd.path("models", f"bi-encoder-{name.replace('_', '-')}")

        def run() -> dict:
            train = gold["train"].select(PAIR_COLUMNS)
            if silver is not None and not mix:  # domain adaptation: target silver only
                train = train.slice(0, 0)
            if silver is not None:
                silver_pairs = self.rd.read_table("silver.parquet").select(PAIR_COLUMNS)
                if self.cfg.task == "binary":  # the teacher's score becomes a class, as gold's are
                    classes = pa.array(silver_pairs.column(schema.LABEL).to_numpy() >= 0.5, pa.float32())
                    silver_pairs = silver_pairs.set_column(2, silver_pairs.schema.field(schema.LABEL), classes)
                train = pa.concat_tables([train, silver_pairs])
            stats = self._fit("bi_encoder", train, gold,
                              recipe={"model": self._base_model(b.model), "max_length": b.max_length,
                                      "num_layers": b.num_layers, "objective": objective},
                              hparams=self._hparams(b), out=out, name=f"bi-encoder-{name.replace('_', '-')}", fp=fp)
            scores = self._metrics(gold, remote_call(_predict_bi_encoder, self._ship(out), self._eval_splits(gold),
                                                     self.cfg.evaluation.batch_size, b.max_length, None,
                                                     **self._eval_resources()))
            self.log(f"[{name}] {self._fmt_all(scores)}")
            return {"model": f"models/{out.name}", "train": stats, "scores": scores}

        return self.stage(name, fp, run)

    def train_upper_bound(self, target: dict[str, pa.Table]) -> Stage | None:
        """Domain adaptation's upper bound: a bi-encoder trained on the target pairs' own labels."""
        if not (self.cfg.target.upper_bound and self.results["target_data"].get("pairs", {}).get("labelled")):
            return None
        b = self.cfg.bi_encoder
        objective = b.resolved_objective(self.cfg.target_task)
        fp = fingerprint("target_gold", b.model_dump(), objective, _model_id(b.model), self.cfg.seed,
                         self.target_fp["pairs"], *self._target_fp(), *self._precision_fp())
        out = self.rd.path("models", "bi-encoder-target-gold")

        def run() -> dict:
            stats = train_on_ray("bi_encoder", target["pairs"].select(PAIR_COLUMNS),
                                 recipe={"model": self._base_model(b.model), "max_length": b.max_length,
                                         "num_layers": b.num_layers, "objective": objective},
                                 hparams=self._hparams(b), resources=self._worker_resources(),
                                 storage_dir=self.rd.storage("ray_train"), out_dir=out, name="bi-encoder-target-gold",
                                 run_name=self._train_run("bi-encoder-target-gold", fp), progress=self._reporter())
            preds = remote_call(_predict_bi_encoder, self._ship(out), self.target_eval, self.cfg.evaluation.batch_size,
                                b.max_length, None, **self._eval_resources())
            scores = target_metrics(self.cfg.target_task, preds, self.target_eval)
            m = TARGET_METRIC[self.cfg.target_task]
            self.log(f"[target_gold] target test {m} {scores['target_test'][m]:.2f}")
            return {"model": f"models/{out.name}", "train": stats, "scores": scores}

        return self.stage("target_gold", fp, run)

    def target_candidates(self, target: dict[str, pa.Table]) -> Stage:
        """Domain adaptation, step 2.1: the target pairs themselves are the candidates (their
        labels are not used); self-pairs and repeats (in either order) are counted and left out.
        In corpus mode the job's sampling strategy picks pairs of the corpus's sentences."""
        if self.cfg.target.corpus is not None:
            return self.corpus_candidates()
        fp = fingerprint("candidates", "target pairs", self.target_fp["pairs"])

        def run() -> dict:
            pairs = target["pairs"]
            sentences = unique_sentences(pairs)
            index = {t: i for i, t in enumerate(sentences.column(schema.TEXT).to_pylist())}
            q = np.array([index[t] for t in pairs.column(schema.SENTENCE1).to_pylist()], dtype=np.int64)
            h = np.array([index[t] for t in pairs.column(schema.SENTENCE2).to_pylist()], dtype=np.int64)
            candidates = finalize_candidates(q, h, np.zeros(len(q), np.float32), sentences,
                                             np.empty(0, np.int64), origin="target")
            self_pairs = int((q == h).sum())
            repeats = pairs.num_rows - self_pairs - candidates.num_rows
            self.rd.write_table("sentences.parquet", sentences)
            self.rd.write_table("candidates.parquet", candidates, schema.CANDIDATE_SCHEMA)
            self.log(f"[candidates] {candidates.num_rows} target pairs ({self_pairs} self-pairs and {repeats} repeated "
                     f"pairs of {pairs.num_rows} left out) over {sentences.num_rows} sentences")
            return {"sentences": sentences.num_rows, "candidates": candidates.num_rows,
                    "target_pairs": pairs.num_rows, "self_pairs_left_out": self_pairs, "repeats_left_out": repeats}

        return self.stage("candidates", fp, run, outputs=("sentences.parquet", "candidates.parquet"))

    def corpus_candidates(self) -> Stage:
        """Corpus mode, step 2.1: the corpus read in streaming shards, cleaned and deduplicated
        (``loaders.corpus``), then the job's sampler over its sentences."""
        from augsbert_ray.loaders.corpus import list_files, read_corpus

        c, s = self.cfg.target.corpus, self.cfg.sampling
        files = list_files(c.path)
        ss_fp = None
        if s.strategy in EMBEDS:
            ss_fp = self.stage_fp.get("gold_only") if s.ss_model == "gold_only" else _model_id(self.cfg.bi_encoder.model)
        # A corpus can be large: its files' names, sizes and modification times stand for its contents.
        fp = fingerprint("candidates", "target corpus", c.model_dump(), files, s.model_dump(), self.cfg.seed, ss_fp)

        def run() -> dict:
            corpus = read_corpus(c, seed=self.cfg.seed, log=self.log, files=files)
            candidates = self._sample(corpus.sentences, np.empty(0, np.int64))
            self.rd.write_table("sentences.parquet", corpus.sentences)
            self.rd.write_table("candidates.parquet", candidates, schema.CANDIDATE_SCHEMA)
            self.log(f"[candidates] {candidates.num_rows} {s.strategy} pairs from {corpus.sentences.num_rows} "
                     "corpus sentences")
            return {"sentences": corpus.sentences.num_rows, "candidates": candidates.num_rows,
                    "corpus_files": len(corpus.files), "corpus_lines": corpus.counts}

        return self.stage("candidates", fp, run, outputs=("sentences.parquet", "candidates.parquet"))

    def _ship(self, path):
        """A model directory of this run, put in the object store once for workers on any node."""
        from augsbert_ray.artifacts import ship_model

        key = str(path)
        if key not in self._shipped:
            self._shipped[key] = ship_model(path)
        return self._shipped[key]

    def _base_model(self, name: str):
        """A configured starting model as workers should get it: a name they resolve, or shipped files."""
        if name == EMBEDDED_MODEL:
            return name  # installed with the package on every node; each checks its hash
        from augsbert_ray.artifacts import ship_if_local

        if name not in self._shipped:
            self._shipped[name] = ship_if_local(name)
        return self._shipped[name]

    def _searched(self, kind: str) -> bool:
        return self.cfg.seed_search.enabled and kind in self.cfg.seed_search.targets

    def _search_fp(self, kind: str) -> list[dict]:
        """The seed search's settings when it decides this encoder; nothing otherwise, so
        fingerprints (and finished stages) of jobs without a seed search stay as they were."""
        return [self.cfg.seed_search.model_dump()] if self._searched(kind) else []

    def _precision_fp(self) -> list[str]:
        """The training precision when it is not fp32; nothing otherwise, so fingerprints of
        jobs that train in fp32 stay as they were."""
        p = self.cfg.training.precision
        return [] if p == "fp32" else [f"training precision {p}"]

    def _train_run(self, name: str, fp: str) -> str:
        """The Ray Train run of a training stage, named by the stage's fingerprint.

        Ray Train resumes a run from the latest checkpoint under its name, which is what a
        re-run after a crash needs; a changed configuration must not inherit the weights of
        another one, so each fingerprint trains under its own name. Earlier runs of this stage
        under other fingerprints are removed from a local run directory (and this one too with
        ``fresh``).
        """
        run = f"{name}-{fp[:12]}"
        if self.rd.uri is None and self.rd.path("ray_train").is_dir():
            stale = re.compile(rf"{re.escape(name)}-[0-9a-f]{{12}}")
            for old in self.rd.path("ray_train").iterdir():
                if stale.fullmatch(old.name) and old.name != run:
                    self.rd.remove_tree(f"ray_train/{old.name}")
        if self.fresh:
            self.rd.remove_tree(f"ray_train/{run}")
        return run

    def _fit(self, kind: str, train: pa.Table, gold: dict[str, pa.Table], *, recipe: dict, hparams: dict,
             out, name: str, fp: str) -> dict:
        """Trains one encoder: one Ray Train run, or a seed search on Ray Tune when configured."""
        if not self._searched(kind):
            return train_on_ray(kind, train, recipe=recipe, hparams=hparams, resources=self._worker_resources(),
                                storage_dir=self.rd.storage("ray_train"), out_dir=out, name=name,
                                run_name=self._train_run(name, fp), progress=self._reporter())
        from augsbert_ray.training.seed_search import SearchPlan, seed_search

        ss = self.cfg.seed_search
        seeds = ss.seed_list(hparams["seed"])
        gpus = ss.gpus_per_trial if ss.gpus_per_trial is not None else (1 if self.cfg.training.use_gpu else 0)
        plan = SearchPlan(seeds=seeds, keep=ss.keep, prune_at=ss.prune_at, scheduler=ss.scheduler, audit=ss.audit,
                          cpus_per_trial=per_worker_cpus(ss.cpus_per_trial, self.cluster.cpus, len(seeds)),
                          gpus_per_trial=gpus)
        record = seed_search(kind, train, gold["dev"], task=self.cfg.task, metric=self.metric, recipe=recipe,
                             hparams=hparams, plan=plan, storage_dir=self.rd.storage("ray_tune"), out_dir=out, name=name,
                             eval_batch_size=self.cfg.evaluation.batch_size, log=self.log)
        return {"seed_search": record}

    def _hparams(self, c) -> dict:
        seed = getattr(c, "seed", None)
        return {"epochs": c.epochs, "lr": c.lr, "batch_size": c.batch_size, "warmup_ratio": c.warmup_ratio,
                "seed": self.cfg.seed if seed is None else seed, "precision": self.cfg.training.precision}

    def _worker_resources(self) -> WorkerResources:
        t = self.cfg.training
        return WorkerResources(t.num_workers, t.use_gpu, self.cpus_per_worker, t.checkpoint_every, t.max_failures)

    # -- report --------------------------------------------------------------------------
    def finish(self, gold: dict[str, pa.Table]) -> dict:
        r = self.results
        splits = {s: gold[s].select(PAIR_COLUMNS) for s in ("dev", "test")}
        scores = {key: r[key]["scores"] for key in ("zero_shot", "gold_only", "cross_encoder", "target_gold", "augsbert")
                  if key in r}
        baselines = {"jaccard": task_metrics(self.cfg.task, jaccard_predictions(splits), splits)}
        if self.target_eval:
            baselines["jaccard"].update(target_metrics(self.cfg.target_task, jaccard_predictions(self.target_eval),
                                                       self.target_eval))
        if self.cfg.task == "binary":
            baselines["majority"] = majority_metrics(gold["train"], splits)
        metrics = {
            "job": self.cfg.name,
            "task": self.cfg.task,
            "primary_metric": self.metric,
            "scores": scores,
            "baselines": baselines,
            "data": {**r["data"], "dev_carved": r.get("dev_carved")},
            "bi_encoder_objective": self.cfg.bi_encoder.resolved_objective(self.cfg.task),
            "target": None if self.cfg.target is None else {
                "task": self.cfg.target_task,
                "metric": TARGET_METRIC[self.cfg.target_task],
                "data": r["target_data"],
                "mix_source_gold": self.cfg.target.mix_source_gold,
                "candidates": {k: v for k, v in r["candidates"].items()
                               if k.endswith(("_left_out", "target_pairs")) or k.startswith("corpus")},
            },
            "sampling": {
                "strategy": "target pairs" if self.cfg.target is not None and self.cfg.target.pairs is not None
                else self.cfg.sampling.strategy,
                "top_k": self.cfg.sampling.top_k,
                "sentences": r["candidates"]["sentences"],
                "candidates": r["candidates"]["candidates"],
                "labelled": r["silver"].get("labelled", r["silver"]["silver"]),
                "silver": r["silver"]["silver"],
                "silver_label_mean": r["silver"]["label_mean"],
                "silver_label_hist": r["silver"]["label_hist"],
                "labeling_pairs_per_s": r["silver"]["pairs_per_s"],
            },
            "teacher_check": r.get("teacher_check"),
            "seed_search": {key: r[key]["train"]["seed_search"] for key in ("cross_encoder", "gold_only", "augsbert")
                            if key in r and "seed_search" in r[key].get("train", {})},
            "stage_seconds": self.stage_seconds,
            "stages_reused": self.reused,
            "cluster": asdict(self.cluster),
            "stage_throughput": stage_throughput(r),
            "versions": versions(),
            "run_dir": self.rd.location,
        }
        write_density_plot(
            self.rd.path("silver_density.png"),
            gold["train"].column(schema.LABEL).to_numpy(),
            self.rd.read_table("silver.parquet").column(schema.LABEL).to_numpy(),
            f"{self.cfg.name}: {self.cfg.sampling.strategy if self.cfg.target is None else 'target pairs'}",
        )
        write_report(self.rd, metrics)
        if self.channel is not None:
            self.channel.close()
        self.rd.push()
        self.log(f"[augsbert] wrote metrics.json and summary.md in {self.rd.location}")
        return metrics


def stage_throughput(results: dict) -> dict[str, str]:
    """What each stage processed per second of its wall time (as a readable rate)."""
    out = {}
    for name, r in results.items():
        if not isinstance(r, dict) or not r.get("seconds"):
            continue
        sec = r["seconds"]
        train = r.get("train", {})
        if train.get("pairs_per_s"):
            precision = f", {train['precision']}" if train.get("precision") else ""
            out[name] = f"{train['pairs_per_s']:.1f} training pairs/s (in the training loop{precision})"
        elif "seed_search" in train:
            c = train["seed_search"]["cost"]
            out[name] = f"{c['steps_run'] / sec:.2f} training steps/s over all seeds"
        elif "labelled" in r:
            out[name] = f"{r['labelled'] / sec:.1f} pairs labelled/s"
        elif "candidates" in r:
            out[name] = f"{r['candidates'] / sec:.1f} candidate pairs/s ({r['sentences'] / sec:.1f} sentences/s)"
        elif "scores" in r:
            pairs = sum(split.get("pairs", 0) for split in r["scores"].values())
            out[name] = f"{pairs / sec:.1f} evaluated pairs/s"
    return out


# Predictions run as Ray tasks (on a GPU node when training uses GPUs); these are their bodies.
def _predict_bi_encoder(model: str, splits: dict, batch_size: int, max_length: int, num_layers: int | None) -> dict:
    import ray
    import torch

    from augsbert_ray.evaluation import bi_encoder_predictions
    from augsbert_ray.models import load_bi_encoder

    torch.set_num_threads(max(1, int(ray.get_runtime_context().get_assigned_resources().get("CPU", 1))))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    st = load_bi_encoder(model, max_length, num_layers, device=device)
    return bi_encoder_predictions(st, splits, batch_size)


def _predict_cross_encoder(model_dir: str, splits: dict, batch_size: int, max_length: int) -> dict:
    import ray
    import torch

    from augsbert_ray.evaluation import cross_encoder_predictions
    from augsbert_ray.models import load_cross_encoder

    torch.set_num_threads(max(1, int(ray.get_runtime_context().get_assigned_resources().get("CPU", 1))))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, tokenizer = load_cross_encoder(model_dir, device=device)
    model.eval()
    return cross_encoder_predictions(model, tokenizer, splits, batch_size, max_length, device)

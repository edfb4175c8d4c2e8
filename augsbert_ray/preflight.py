"""Pre-flight: every check a job can make without a cluster, run before it writes or starts anything.

A job that cannot succeed says so in one line, before Ray starts and before its run
directory is created:

- the optional modules its settings need are installed (faiss for semantic search, datasets
  for hub datasets: ``optional_modules``);
- every local input file exists (a path that does not resolve is named absolutely, with
  the working directory it was resolved from and the environment variables it was built
  from, such as ``AUGSBERT_DATA_DIR``);
- the tracking backend's module is installed (``tracking_checks``);
- every configured model loads the way the job will load it (a local folder without
  pickles, its weights files whole; a hub id in the cache while the hub is off) and can do
  what the job asks: its layers and positions (``model_checks``);
- the gold splits and the target sets load (the loaders' own row checks), and the splits
  the job will use, after skipped rows, genres, a carved dev split and subsampling, are
  large enough for the steps that need them (``require_pairs``, ``require_target``).

The minimum sizes, and why:

- training needs at least one pair; a carved dev split (``data.dev: null``) needs enough
  training pairs that dev gets ``MIN_EVAL_PAIRS`` and training keeps one;
- dev and test need ``MIN_EVAL_PAIRS`` (2) pairs, and labels that can be scored: two
  different labels for regression (Spearman's correlation is undefined otherwise), both
  classes for binary tasks (dev picks the F1 threshold, AUC(0.05) needs positives and
  negatives); the same holds for a domain-adaptation target's test and dev sets, under the
  target's task;
- target pairs need at least one pair that is not a self-pair (the teacher labels them);
- KDE sampling on a regression task fits a density to the training labels: two different
  labels at least.

The gold and target files are read here and once more by the job itself (the checks run
before the job exists, so nothing is handed over); for the STS benchmark's three files the
check took 0.7 s on a busy 2-core machine.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa

from augsbert_ray import schema
from augsbert_ray.config import JobConfig
from augsbert_ray.config.sampling import SELECTED
from augsbert_ray.data_fetch import DATA_DIRS, DATASETS
from augsbert_ray.data_fetch import ENV as DATA_ENV
from augsbert_ray.errors import ConfigError, DataError
from augsbert_ray.loaders import LoadResult, load_pairs
from augsbert_ray.data_warnings import data_warnings
from augsbert_ray.model_checks import check_models
from augsbert_ray.optional_modules import job_needs, require
from augsbert_ray.missing_paths import unresolved
from augsbert_ray.resource_checks import check_local_cpus, check_local_gpus, runs_locally
from augsbert_ray.tracking_checks import check_tracking
from augsbert_ray.sources import DataSource

SPLITS = ("train", "dev", "test")
MIN_EVAL_PAIRS = 2


def check_job(cfg: JobConfig, warn: Callable[[str], None] | None = None) -> dict[str, pa.Table]:
    """Runs every pre-flight check of a job, in the order a user would fix them.

    Args:
        cfg: the validated job.
        warn: receives what is allowed but likely a mistake (``data_warnings``), once every
            check has passed; default: this module's logger.

    Returns:
        The gold splits as the job will use them (train, dev, test).

    Raises:
        ConfigError: an optional module the settings need that is not installed, an input
            path that does not resolve, or a model directory that cannot be loaded (naming
            the job file and the key).
        DataError: a malformed row (as the loaders report it), or a split too small for
            the steps that need it (naming the file and why).
    """
    require(job_needs(cfg), cfg.source)  # an extra not installed: seconds, not a stage an hour in
    check_tracking(cfg)
    check_paths(cfg)
    check_models(cfg)
    gold = require_pairs(cfg.data, cfg.task, load_gold_sources(cfg.data, cfg.task), kde_labels=kde_needs_labels(cfg))
    if cfg.target is not None:
        require_target(cfg.target, cfg.target_task,
                       load_target_sources(cfg.target, cfg.target_task, cfg.data.on_bad_rows), cfg.data.on_bad_rows)
    require_folds(cfg, gold["train"].num_rows)
    check_local_gpus(cfg)
    check_local_cpus(cfg)
    for line in data_warnings(cfg, gold):
        (warn or logging.getLogger(__name__).warning)(line)
    return gold


def check_for_validate(cfg: JobConfig, warn: Callable[[str], None] | None = None) -> list[str]:
    """``augsbert validate``'s checks: those of ``check_job``, so that it refuses what ``run``
    refuses before Ray starts, except what it cannot check here.

    The inputs are read and checked when every one is a local file that exists; otherwise the
    models and this machine's resources are checked, and what was left is said.

    Returns:
        What could not be checked, a line each (empty when everything was).

    Raises:
        ConfigError, DataError: as ``check_job``.
    """
    not_checked = []
    remote = [key for key, source in input_sources(cfg) if source.format == "hf" or "://" in str(source.path)]
    try:
        check_paths(cfg)
    except ConfigError as e:
        if e.key is None or not e.key.endswith(".path") or "file not found" not in e.reason:
            raise
        not_checked.append(f"the inputs ({e}; run refuses that)")
    if remote:
        not_checked.append(f"the inputs ({', '.join(remote)} are read from the network when the job runs)")
    if not not_checked:
        check_job(cfg, warn)
    else:
        require(job_needs(cfg), cfg.source)
        check_tracking(cfg)
        check_models(cfg)
        check_local_gpus(cfg)
        check_local_cpus(cfg)
    if not runs_locally(cfg):
        not_checked.append("GPUs and CPUs (the job runs on a cluster, ray.address or RAY_ADDRESS: they are checked "
                           "there before the first stage that needs them)")
    return not_checked


def load_gold_sources(data, task: str) -> dict[str, LoadResult]:
    """The gold sources of ``data`` (``config.DataConfig``) as the loaders read them."""
    return {split: load_pairs(getattr(data, split), split, binary=task == "binary", on_bad_rows=data.on_bad_rows)
            for split in SPLITS if getattr(data, split) is not None}


def load_target_sources(target, target_task: str, on_bad_rows: str) -> dict[str, LoadResult]:
    """A domain-adaptation target's ``pairs``, ``test`` and ``dev`` (those it has), as read."""
    return {name: load_pairs(source, f"target_{name}", binary=target_task == "binary" and name != "pairs",
                             on_bad_rows=on_bad_rows)
            for name, source in (("pairs", target.pairs), ("test", target.test), ("dev", target.dev))
            if source is not None}


def kde_needs_labels(cfg) -> bool:
    """KDE selection fits a density to the gold training labels (in-domain regression jobs)."""
    return cfg.sampling.strategy in SELECTED and cfg.task == "regression" and cfg.target is None


# -- paths -----------------------------------------------------------------------------------
def input_sources(cfg: JobConfig) -> list[tuple[str, DataSource]]:
    """(dotted key, source) of every gold and target input of a job."""
    out = [(f"data.{split}", getattr(cfg.data, split)) for split in SPLITS]
    if cfg.target is not None:
        out += [(f"target.{name}", getattr(cfg.target, name)) for name in ("pairs", "test", "dev")]
    return [(key, source) for key, source in out if source is not None]


def check_paths(cfg: JobConfig) -> None:
    """Every local input file (and a local target corpus) exists and is readable.

    Hub datasets (format ``hf``) and storage URIs are not checked here: they need the network.

    Raises:
        ConfigError: naming the job file, the key, the absolute path tried and why.
    """
    for key, source in input_sources(cfg):
        if source.format == "hf":
            continue
        path = Path(source.path).expanduser()
        if path.is_dir():
            raise ConfigError(cfg.source, f"{key}.path", f"{path.absolute()} is a folder, not a file of pairs")
        if not path.is_file():
            # A public dataset's own file, looked for where fetch puts it: say how to get it.
            fetched = source.format in DATASETS and any(r.name == DATA_ENV for r in cfg.env_references(f"{key}.path"))
            fetch = (f"; `augsbert data fetch {source.format}` downloads it (into ${DATA_ENV}, else {DATA_DIRS[0]}, "
                     "where the shipped jobs look)" if fetched else "")
            raise ConfigError(cfg.source, f"{key}.path",
                              f"file not found: {unresolved(cfg, f'{key}.path', source.path)}{fetch}")
        if not os.access(path, os.R_OK):
            raise ConfigError(cfg.source, f"{key}.path", f"{path.absolute()} cannot be read (permission denied)")
        packed = compression(path) if source.format != "parquet" else None
        if packed is not None:
            raise ConfigError(cfg.source, f"{key}.path", f"{path.absolute()} is {packed}-compressed, not {source.format} "
                              "text: decompress it first and give the decompressed file")
    corpus = cfg.target.corpus if cfg.target is not None else None
    if corpus is not None and "://" not in corpus.path:
        from augsbert_ray.loaders.corpus import list_files

        try:
            list_files(corpus.path)
        except DataError:
            raise ConfigError(cfg.source, "target.corpus.path", "no corpus files found there (a file, a folder or a "
                              f"glob): {unresolved(cfg, 'target.corpus.path', corpus.path)}") from None


# The first bytes of compressed files, which the text loaders would otherwise report as invalid UTF-8.
COMPRESSION_MAGIC = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd",
                     b"PK\x03\x04": "zip"}


def compression(path: Path) -> str | None:
    """The compression a file's first bytes show (``gzip``, ``bzip2``, ``xz``, ``zstd``, ``zip``), or None."""
    try:
        with open(path, "rb") as f:
            head = f.read(6)
    except OSError:
        return None
    return next((name for magic, name in COMPRESSION_MAGIC.items() if head.startswith(magic)), None)


# -- sizes -----------------------------------------------------------------------------------
def require_pairs(d, task: str, loaded: dict[str, LoadResult], kde_labels: bool = False) -> dict[str, pa.Table]:
    """Checks the gold splits are large enough, and returns them as the job uses them.

    Dev is carved from train when ``data.dev`` is null (``carve_dev_rows``), then
    ``data.subsample`` applies (``subsample_rows``): the job's gold stage takes its splits
    from here.

    Args:
        d: the job's ``data`` settings.
        task: ``regression`` or ``binary``.
        loaded: the loaded ``train``, ``test`` and (unless carved) ``dev``.
        kde_labels: the job's sampling fits a density to the training labels (KDE).

    Returns:
        The final train, dev and test tables.

    Raises:
        DataError: naming the file and why its split is too small (see the module docstring).
    """
    _require_some(loaded["train"], "data.train", d.train, d.on_bad_rows, "for training")
    tables = {split: result.table for split, result in loaded.items()}
    if d.dev is None:
        n = tables["train"].num_rows
        need = carve_minimum(d.dev_fraction)
        if n < need:
            raise DataError(d.train.path, None, None,
                            f"{_pairs(n)} are too few to carve a dev split from (data.dev is null, data.dev_fraction "
                            f"{d.dev_fraction:g}): that takes at least {need} training pairs, {MIN_EVAL_PAIRS} for dev "
                            "and one left for training; give data.dev, or more training pairs")
        dev_rows = carve_dev_rows(n, d.dev_fraction, d.subsample_seed)
        train = tables["train"]
        dev = train.filter(pa.array(dev_rows))
        dev = dev.set_column(dev.schema.get_field_index(schema.SPLIT), schema.SPLIT, pa.array(["dev"] * dev.num_rows))
        tables["train"], tables["dev"] = train.filter(pa.array(~dev_rows)), dev
    for split in SPLITS:
        if split in d.subsample:
            tables[split] = tables[split].take(subsample_rows(tables[split].num_rows, d.subsample[split],
                                                              d.subsample_seed, SPLITS.index(split)))
    for split in ("dev", "test"):
        source = getattr(d, split) or d.train
        origin = "carved from data.train" if getattr(d, split) is None else None
        why = _accounting(loaded[split], source, d.on_bad_rows) if split in loaded else origin
        if split in d.subsample:
            why = "; ".join(w for w in (why, f"data.subsample.{split} keeps {d.subsample[split]}") if w)
        require_scorable(tables[split], task, source.path, f"data.{split}", why)
    if kde_labels:
        labels = np.unique(tables["train"].column(schema.LABEL).to_numpy())
        if len(labels) < 2:
            raise DataError(d.train.path, None, schema.LABEL,
                            f"every training pair has the label {labels[0]:g} (scaled): KDE sampling fits a density "
                            "to the training labels and needs at least two different ones")
    return tables


def require_folds(cfg: JobConfig, train_pairs: int) -> None:
    """The fold pilots (``evaluation.pilot_folds``) have at least one training pair per fold.

    Raises:
        ConfigError: naming the job file, the key and the training pairs the job has.
    """
    k = cfg.evaluation.pilot_folds
    if cfg.evaluation.pilot and k > train_pairs:
        raise ConfigError(cfg.source, "evaluation.pilot_folds",
                          f"{k} folds need at least {k} gold training pairs, one per fold; the job has {train_pairs} "
                          f"(data.train {cfg.data.train.path}, after subsampling and a carved dev split): give at most "
                          f"{train_pairs}, or 0 to score the pilots on dev")


def require_target(t, target_task: str, loaded: dict[str, LoadResult], mode: str = "error") -> None:
    """Checks the domain-adaptation target sets (``pairs``, ``test``, ``dev``) are usable.

    Args:
        t: the job's ``target`` settings; target_task: how the target sets are scored.
        loaded: the loaded target sets; mode: ``data.on_bad_rows`` (named in messages).

    Raises:
        DataError: naming the file and why.
    """
    if "pairs" in loaded:
        result = loaded["pairs"]
        _require_some(result, "target.pairs", t.pairs, mode, "for the teacher to label")
        table = result.table
        s1, s2 = table.column(schema.SENTENCE1).to_pylist(), table.column(schema.SENTENCE2).to_pylist()
        if all(a == b for a, b in zip(s1, s2)):
            raise DataError(t.pairs.path, None, None, f"target.pairs: all {_pairs(len(s1))} pair a sentence with "
                            "itself; the teacher has nothing to label")
    for name in ("test", "dev"):
        if name in loaded:
            source = getattr(t, name)
            require_scorable(loaded[name].table, target_task, source.path, f"target.{name}",
                             _accounting(loaded[name], source, mode))


def require_scorable(table: pa.Table, task: str, path: str, what: str, why: str | None = None) -> None:
    """A dev or test split can be scored: ``MIN_EVAL_PAIRS`` pairs, two different labels
    (regression) or both classes (binary).

    Args:
        table: the split's pairs (labels scaled to [0, 1]).
        task: ``regression`` or ``binary``.
        path: the file the split comes from (named by the error).
        what: the split's key, e.g. ``data.dev``.
        why: how the split came to be this small, added to the message.

    Raises:
        DataError: naming ``path`` and what is missing.
    """
    labels = table.column(schema.LABEL).to_numpy()
    because = f" ({why})" if why else ""
    if len(labels) < MIN_EVAL_PAIRS:
        raise DataError(path, None, None, f"{what}: {_pairs(len(labels))} left{because}; scoring a model on it "
                                          f"needs at least {MIN_EVAL_PAIRS}")
    if task == "binary":
        positives = int(np.sum(labels >= 0.5))
        if positives in (0, len(labels)):
            kind = "negatives (label 0)" if positives == 0 else "positives (label 1)"
            raise DataError(path, None, schema.LABEL, f"{what}: all {len(labels)} pairs are {kind}{because}; "
                                                      "F1 at a threshold chosen on dev and AUC(0.05) need both classes")
    elif len(np.unique(labels)) < 2:
        raise DataError(path, None, schema.LABEL, f"{what}: all {len(labels)} pairs have the same label{because}; "
                                                  "Spearman's correlation needs at least two different labels")


def _require_some(result: LoadResult, what: str, source: DataSource, mode: str, purpose: str) -> None:
    if result.table.num_rows == 0:
        raise DataError(source.path, None, None,
                        f"no pairs left {purpose} in {what} ({_accounting(result, source, mode) or 'no rows'})")


def _accounting(result: LoadResult, source: DataSource, mode: str) -> str | None:
    """Where a source's rows went, when some did not become pairs: '12 rows read, 12 skipped as
    malformed (...)', 'genres [x] kept none of 48 pairs'. None when every row is a pair."""
    read, skipped, filtered = result.rows_read, len(result.skipped), result.filtered
    if read == 0:
        return "the file has no data rows"
    parts = []
    if skipped:
        first = result.skipped[0]
        field = f", field '{first.field}'" if first.field else ""
        parts.append(f"{skipped} skipped as malformed under on_bad_rows: {mode} (the first at line {first.line}"
                     f"{field}: {first.reason})")
    if filtered:
        kept = read - skipped - filtered
        parts.append(f"genres {source.genres} kept {kept} of the {read - skipped} pairs")
    return f"{read} rows read: " + ", ".join(parts) if parts else None


def _pairs(n: int) -> str:
    return f"{n} pair" if n == 1 else f"{n} pairs"


# -- carving a dev split and subsampling (the job's gold stage uses these) -----------------------
def carved_dev_size(n: int, fraction: float) -> int:
    """How many of ``n`` training pairs a carved dev split takes."""
    return max(1, round(n * fraction))


def carve_minimum(fraction: float) -> int:
    """The fewest training pairs from which a dev split of ``MIN_EVAL_PAIRS`` can be carved,
    leaving at least one for training."""
    n = MIN_EVAL_PAIRS + 1
    while not (carved_dev_size(n, fraction) >= MIN_EVAL_PAIRS and n - carved_dev_size(n, fraction) >= 1):
        n += 1
    return n


def carve_dev_rows(n: int, fraction: float, seed: int) -> np.ndarray:
    """The mask of the training rows that become dev when ``data.dev`` is null (seeded)."""
    dev_rows = np.zeros(n, dtype=bool)
    dev_rows[np.random.default_rng([seed, 99]).choice(n, carved_dev_size(n, fraction), replace=False)] = True
    return dev_rows


def subsample_rows(n: int, keep: int, seed: int, split_index: int) -> np.ndarray:
    """The rows ``data.subsample`` keeps of a split of ``n`` pairs, in file order."""
    if keep >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng([seed, split_index]).choice(n, keep, replace=False))

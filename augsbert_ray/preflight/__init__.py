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
  large enough for the steps that need them (``loaders.job_inputs``: the minimum sizes and
  why are there).

The gold and target sets are read here once: ``check_job`` returns them
(``loaders.job_inputs.JobInputs``) and the job's gold and target stages write that read.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Callable

from augsbert_ray.config import JobConfig
from augsbert_ray.data_fetch import DATA_DIRS, DATASETS
from augsbert_ray.data_fetch import ENV as DATA_ENV
from augsbert_ray.errors import ConfigError, DataError
from augsbert_ray.loaders.job_inputs import SPLITS, JobInputs, kde_needs_labels, read_gold, read_target
from augsbert_ray.preflight.data_warnings import data_warnings
from augsbert_ray.preflight.missing_paths import unresolved
from augsbert_ray.preflight.model_checks import check_models
from augsbert_ray.preflight.optional_modules import job_needs, require
from augsbert_ray.preflight.resource_checks import check_local_cpus, check_local_gpus, runs_locally
from augsbert_ray.preflight.tracking_checks import check_tracking
from augsbert_ray.sources import DataSource


def check_job(cfg: JobConfig, warn: Callable[[str], None] | None = None) -> JobInputs:
    """Runs every pre-flight check of a job, in the order a user would fix them.

    Args:
        cfg: the validated job.
        warn: receives what is allowed but likely a mistake (``data_warnings``), once every
            check has passed; default: this module's logger.

    Returns:
        The gold pairs and target sets as read and checked, for the job to use (read once).

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
    inputs = JobInputs(read_gold(cfg.data, cfg.task, kde_needs_labels(cfg)))
    if cfg.target is not None:
        inputs.keep_target(cfg.target, cfg.target_task, cfg.data.on_bad_rows,
                           read_target(cfg.target, cfg.target_task, cfg.data.on_bad_rows))
    require_folds(cfg, inputs.gold.tables["train"].num_rows)
    check_local_gpus(cfg)
    check_local_cpus(cfg)
    for line in data_warnings(cfg, inputs.gold.tables):
        (warn or logging.getLogger(__name__).warning)(line)
    return inputs


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



"""A job's gold and target sets as the job uses them: read, checked for size, dev carved, subsampled.

The pre-flight checks (``preflight.check_job``) read them once, before Ray starts, and hand the
read to the job (``JobInputs``): the gold and target stages write what was read here instead
of reading the files again. Read on their own (``read_gold``, ``read_target``) where a job
runs without the checks (``pipeline.plan``, the benchmarks).

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
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from augsbert_ray import schema
from augsbert_ray.config.sampling import SELECTED
from augsbert_ray.errors import DataError
from augsbert_ray.loaders import LoadResult, load_pairs
from augsbert_ray.sources import DataSource

log = logging.getLogger(__name__)

SPLITS = ("train", "dev", "test")
MIN_EVAL_PAIRS = 2


@dataclass
class GoldRead:
    """A job's gold pairs as read under ``key`` (its data settings, task and KDE need).

    Attributes:
        tables: train, dev and test as the job uses them (``schema.PAIR_SCHEMA``).
        info: counts for the report (``stages.gold.GoldResult``'s fields).
        skipped: the malformed rows skipped, one dict each.
        notes: what the gold stage says about the read (genres kept, a carved dev split).
    """

    tables: dict[str, pa.Table]
    info: dict
    skipped: list[dict]
    key: tuple = ()
    notes: list[str] = field(default_factory=list)


@dataclass
class JobInputs:
    """What the pre-flight checks read, handed to the job so that nothing is read twice.

    Attributes:
        gold: the gold pairs.
        target: a domain-adaptation target's sets as read and checked (``read_target``), keyed
            by ``(target, task, on_bad_rows)``; None without a target.
    """

    gold: GoldRead
    target: dict[str, LoadResult] | None = None
    target_key: tuple = field(default=())

    def gold_for(self, data, task: str, kde_labels: bool) -> GoldRead | None:
        """The gold read when it was read under these settings, else None (read them again)."""
        return self.gold if self.gold.key == _gold_key(data, task, kde_labels) else None

    def keep_target(self, target, task: str, on_bad_rows: str, loaded: dict[str, LoadResult]) -> None:
        """Keeps the target sets read under these settings (``read_target``)."""
        self.target, self.target_key = loaded, _target_key(target, task, on_bad_rows)

    def target_for(self, target, task: str, on_bad_rows: str) -> dict[str, LoadResult] | None:
        """The target sets when they were read under these settings, else None."""
        if self.target is None or self.target_key != _target_key(target, task, on_bad_rows):
            return None
        return self.target


def _gold_key(data, task: str, kde_labels: bool) -> tuple:
    return (data.model_dump_json(), task, kde_labels)


def _target_key(target, task: str, on_bad_rows: str) -> tuple:
    return (target.model_dump_json(), task, on_bad_rows)


def read_gold(data, task: str, kde_labels: bool = False) -> GoldRead:
    """Loads a job's gold pairs: every split checked and scaled, dev carved, splits subsampled,
    and the splits the job will use checked for size (``require_pairs``).

    Args:
        data: the job's ``data`` settings (``config.DataConfig``).
        task: ``regression`` or ``binary`` (binary labels must be 0 or 1).
        kde_labels: the job's sampling fits a density to the training labels (KDE).

    Raises:
        DataError: a malformed row (``on_bad_rows: error``), an unreadable source, or a split
            too small for the steps that need it.
    """
    loaded = load_gold_sources(data, task)
    gold = require_pairs(data, task, loaded, kde_labels=kde_labels)
    skipped, filtered, notes = [], {}, []
    for split, res in loaded.items():
        if getattr(data, split).genres is not None:
            filtered[split] = res.filtered
            notes.append(f"[gold] {split}: kept genres {', '.join(getattr(data, split).genres)} ({res.table.num_rows} "
                         f"pairs); {res.filtered} pairs of other genres left out")
        skipped += [dict(split=split, **vars(s)) for s in res.skipped]
    carved = None
    if data.dev is None:
        n = loaded["train"].table.num_rows
        carved = (f"{carved_dev_size(n, data.dev_fraction)} of {n} training pairs "
                  f"(fraction {data.dev_fraction}, seed {data.subsample_seed}), removed from train")
        notes.append(f"[gold] dev split carved from train: {carved}")
    info = {
        **{s: gold[s].num_rows for s in SPLITS},
        "rows_read": {split: res.rows_read for split, res in loaded.items()},
        "skipped_rows": len(skipped),
        "subsample": dict(data.subsample),
        "dev_carved": carved,
        **({"other_genres_left_out": filtered} if filtered else {}),
    }
    return GoldRead(gold, info, skipped, _gold_key(data, task, kde_labels), notes)


def read_target(target, target_task: str, on_bad_rows: str) -> dict[str, LoadResult]:
    """A domain-adaptation target's sets read and checked (``require_target``)."""
    loaded = load_target_sources(target, target_task, on_bad_rows)
    require_target(target, target_task, loaded, on_bad_rows)
    return loaded


def load_gold(cfg) -> dict[str, pa.Table]:
    """A job's gold splits (train, dev, test), as its gold stage uses them."""
    return read_gold(cfg.data, cfg.task, kde_needs_labels(cfg)).tables


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
        tables["train"], tables["dev"] = carve_dev(tables["train"], d.dev_fraction, d.subsample_seed)
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


# -- carving a dev split and subsampling ---------------------------------------------------------
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


def carve_dev(train: pa.Table, fraction: float, seed: int) -> tuple[pa.Table, pa.Table]:
    """Splits a seeded random ``fraction`` of the training pairs off as dev (both keep file order)."""
    dev_rows = carve_dev_rows(train.num_rows, fraction, seed)
    dev = train.filter(pa.array(dev_rows))
    dev = dev.set_column(dev.schema.get_field_index(schema.SPLIT), schema.SPLIT, pa.array(["dev"] * dev.num_rows))
    return train.filter(pa.array(~dev_rows)), dev


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

"""Where a job's pairs come from: the gold splits, an unlabelled corpus, a target domain."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt, model_validator

from augsbert_ray.config.fields import Section, Seed
from augsbert_ray.sources import DataSource


class DataConfig(Section):
    """The gold (labelled) pairs: train, dev and test splits."""

    train: DataSource = Field(description="the gold training pairs")
    dev: DataSource | None = Field(
        description="the gold dev pairs; null: carve dev_fraction of the training pairs into a dev split (seeded "
                    "with subsample_seed), for datasets such as MRPC that ship without one")
    test: DataSource = Field(description="the gold test pairs")
    dev_fraction: float = Field(0.1, gt=0, lt=1, description="share of the training pairs held out as dev when "
                                                             "dev is null")
    subsample: dict[Literal["train", "dev", "test"], PositiveInt] = Field(
        {}, description="keep a seeded random subset of a split's pairs, e.g. {train: 1000} for a low-resource run "
                        "(pairs keep their file order); splits not named are used whole")
    subsample_seed: Seed = Field(42, description="seed of subsample and of the dev split carved from train")
    on_bad_rows: Literal["error", "skip"] = Field(
        "error", description="error: the first malformed row stops the job, naming file, line and field; skip: "
                             "malformed rows are skipped and counted (with their reasons) in the run report")


class CorpusConfig(Section):
    """An unlabelled target corpus: sentences from which candidate pairs are sampled."""

    path: str = Field(description="a file, a directory or a glob; local or a storage URI (s3://...)")
    format: Literal["lines", "jsonl", "csv", "tsv", "parquet"] = Field(
        "lines", description="lines: one sentence per line; tsv: tab-separated with a header row, quotes are text")
    column: str | None = Field(None, description="the text field (jsonl) or column (csv, tsv, parquet)")
    max_chars: int = Field(1000, gt=0, description="longer lines are truncated or dropped (long_lines)")
    long_lines: Literal["truncate", "drop"] = Field("truncate", description="what happens to a line over max_chars")
    on_bad_lines: Literal["error", "skip"] = Field(
        "error", description="invalid UTF-8 or JSON (lines, jsonl): stop, or leave the line out (counted); a CSV "
                             "or TSV row that the reader refuses always stops")
    max_sentences: int | None = Field(None, gt=1, description="a seeded sample of the distinct sentences; null: all")

    @model_validator(mode="after")
    def _check(self) -> "CorpusConfig":
        if self.format != "lines" and not self.column:
            raise ValueError(f"column: format '{self.format}' needs the name of the text column")
        if self.format == "lines" and self.column:
            raise ValueError("column: format 'lines' has no columns (one sentence per line)")
        return self


class TargetConfig(Section):
    """Domain adaptation: the cross-encoder trained on the source gold (``data``) labels
    unlabelled target-domain pairs, and the bi-encoder trains on those silver pairs.

    The job's ``task`` is the source's (how the teacher and the bi-encoder are trained);
    ``target.task`` says how the target test is scored.
    """

    pairs: DataSource | None = Field(
        None, description="target pairs, labelled by the teacher as they are (the paper's setting); their gold "
                          "labels, if the file has them, never reach AugSBERT and train the upper bound only")
    corpus: CorpusConfig | None = Field(
        None, description="or an unlabelled target corpus: the job's sampling strategy picks pairs of its sentences")
    test: DataSource = Field(description="the labelled target test set")
    dev: DataSource | None = Field(
        None, description="a labelled target dev set: picks the F1 threshold of a binary target (without one, a "
                          "binary target reports AUC(0.05), which needs no threshold)")
    task: Literal["regression", "binary"] | None = Field(None, description="how the target test is scored; "
                                                                          "null: the job's task")
    mix_source_gold: bool = Field(False, description="train AugSBERT on source gold + target silver (default: "
                                                     "target silver only)")
    upper_bound: bool = Field(True, description="train the upper-bound bi-encoder on the target pairs' own labels, "
                                                "when they have them")

    @model_validator(mode="after")
    def _check(self) -> "TargetConfig":
        if (self.pairs is None) == (self.corpus is None):
            raise ValueError("give either target.pairs (pairs labelled as they are) or target.corpus "
                             "(sentences to sample pairs from), not both and not neither")
        for name in ("test", "dev"):
            src = getattr(self, name)
            if src is not None and not src.labelled:
                raise ValueError(f"{name}: the target {name} set needs labels (columns.label)")
        return self

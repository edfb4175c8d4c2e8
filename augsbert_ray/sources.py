"""Where gold pairs come from: the typed description of one input file or hub dataset.

Kept apart from the job config so that loaders depend on this small model only.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from augsbert_ray.strict_model import StrictModel

Format = Literal["stsb", "mrpc", "csv", "tsv", "jsonl", "parquet", "hf"]

# Raw label range of each built-in format; labels are scaled to [0, 1] from it.
DEFAULT_LABEL_RANGE: dict[str, tuple[float, float]] = {"stsb": (0.0, 5.0), "mrpc": (0.0, 1.0)}


class ColumnMap(StrictModel):
    """Names of the columns (or JSON keys) that hold each field, for generic formats."""

    sentence1: str = Field("sentence1", description="the first sentence's column")
    sentence2: str = Field("sentence2", description="the second sentence's column")
    label: str | None = Field("label", description="the label's column; null: the pairs have no labels "
                                                   "(unlabelled target pairs)")
    genre: str | None = Field(None, description="an optional column copied into the pair schema's genre")


class DataSource(StrictModel):
    """One input of gold pairs."""

    format: Format = Field(description="stsb / mrpc (the original distribution files), csv / tsv / jsonl / parquet "
                                       "(generic, with columns), or hf (a Hugging Face dataset id in path; needs the "
                                       "datasets package and a reachable hub)")
    path: str = Field(description="a file path, or the hub dataset id for hf")
    columns: ColumnMap = Field(ColumnMap(), description="the column mapping of generic formats (ignored by stsb "
                                                        "and mrpc)")
    label_range: tuple[float, float] | None = Field(
        None, description="raw [min, max] of the label, scaled linearly to [0, 1]; null: [0, 5] for stsb and [0, 1] "
                          "otherwise. A label outside it is an error")
    hf_config: str | None = Field(None, description="the dataset config name for hf")
    hf_split: str | None = Field(None, description="the split inside the hub dataset for hf (e.g. validation)")
    genres: list[str] | None = Field(
        None, description="keep only rows of these genres (e.g. [captions] or [news, forums] for the STS benchmark), "
                          "matched without a main- prefix or a plural s, so STSb's main-forum and main-forums are one "
                          "genre; rows of other genres are counted in the report, not loaded")

    @model_validator(mode="after")
    def _check_range(self) -> "DataSource":
        lo, hi = self.resolved_label_range
        if not hi > lo:
            raise ValueError(f"label_range must be [min, max] with max > min, got [{lo}, {hi}]")
        if self.genres is not None and not [g for g in self.genres if g.strip()]:
            raise ValueError("genres, when given, must name at least one genre")
        return self

    @property
    def labelled(self) -> bool:
        """Whether rows carry a label (the built-in formats always do)."""
        return self.format in ("stsb", "mrpc") or self.columns.label is not None

    @property
    def resolved_label_range(self) -> tuple[float, float]:
        if self.label_range is not None:
            return (float(self.label_range[0]), float(self.label_range[1]))
        return DEFAULT_LABEL_RANGE.get(self.format, (0.0, 1.0))


def genre_key(genre: str) -> str:
    """A genre as ``genres`` matches it: lowercase, no ``main-`` prefix, no plural ``s``."""
    g = genre.strip().lower()
    g = g[len("main-"):] if g.startswith("main-") else g
    return g[:-1] if g.endswith("s") else g

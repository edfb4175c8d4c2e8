"""The base of every job-config section, and the kinds of field the stages treat apart."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from augsbert_ray.models import EMBEDDED_MODEL
from augsbert_ray.strict_model import StrictModel

# torch, numpy and Ray Tune take seeds up to a 64-bit integer's range, numpy none below 0.
Seed = Annotated[int, Field(ge=0, le=2**63 - 1)]


def placement(default: Any, **kwargs) -> Any:
    """A setting that only places or sizes work (actors, CPUs, GPUs, batch sizes, workers,
    retries): it never changes a result, so changing it never redoes a finished stage."""
    return Field(default, json_schema_extra={"placement": True}, **kwargs)


def model_name(default: str = EMBEDDED_MODEL, **kwargs) -> Any:
    """A model setting: ``embedded``, a Hugging Face id or a local directory. A stage that
    reads it is fingerprinted by the model's content (``models.model_content_id``), not its name."""
    return Field(default, json_schema_extra={"model": True}, **kwargs)


def later_setting(default: Any, **kwargs) -> Any:
    """A setting added after runs were made whose default does what the engine did before it
    existed: at that default it is left out of a stage's fingerprint, so upgrading the engine
    does not redo the stages of a finished run; any other value counts as usual."""
    return Field(default, json_schema_extra={"later": True}, **kwargs)


class Section(StrictModel):
    """A section of the job config (unknown keys refused, no booleans for numbers)."""

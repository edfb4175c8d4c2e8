"""Typed errors. Every user-facing failure names where it happened."""

from __future__ import annotations


class AugSBERTError(Exception):
    """Base class of every error this package raises on purpose."""


class DataError(AugSBERTError):
    """A row of an input file is malformed, or the file as a whole cannot be used (no pairs
    left for training, too few to score a split on).

    Attributes:
        path: the file (or hub id) being read.
        line: 1-based line of the offending row (row index + 1 where a format has no lines).
        field: the column or field that is wrong.
        reason: what is wrong with it.
    """

    def __init__(self, path: str, line: int | None, field: str | None, reason: str):
        self.path = str(path)
        self.line = line
        self.field = field
        self.reason = reason
        where = self.path if line is None else f"{self.path}:{line}"
        what = f" field '{field}'" if field else ""
        super().__init__(f"{where}:{what} {reason}")

    def __reduce__(self):  # crosses process boundaries (Ray tasks) intact
        return (DataError, (self.path, self.line, self.field, self.reason))


class ConfigError(AugSBERTError):
    """A job configuration is invalid; the message names the file and the key."""

    def __init__(self, path: str | None, key: str | None, reason: str):
        self.path = path
        self.key = key
        self.reason = reason
        where = path or "<config>"
        what = f" key '{key}'" if key else ""
        super().__init__(f"{where}:{what} {reason}")


class ModelError(AugSBERTError):
    """A model directory cannot be loaded as configured (no config, no safetensors weights,
    pickled weights only); the message names the directory and what is missing."""


class TrainingError(AugSBERTError):
    """Training an encoder failed: an error that cannot succeed on retry (data, config, model
    files, shapes), reported once without retries, or restarts exhausted after transient faults.

    Attributes:
        permanent: the error would recur on every retry, so none was made.
    """

    def __init__(self, message: str, permanent: bool = False):
        super().__init__(message)
        self.permanent = permanent

    def __reduce__(self):
        return (TrainingError, (str(self), self.permanent))


class TeacherCheckError(AugSBERTError):
    """The cross-encoder is not better than the gold-only bi-encoder and the job asked to stop."""


class LabelingError(AugSBERTError):
    """Labelling could not finish (e.g. actor restarts exhausted); committed shards are kept."""


def tag_stage(exc: BaseException, stage: str) -> None:
    """Records on an error the stage it arose in (the innermost, when stages nest), so that the
    CLI can name the stage of an error the engine did not foresee (``stage_of``)."""
    if getattr(exc, "_augsbert_stage", None) is None:
        try:
            exc._augsbert_stage = stage
        except AttributeError:  # an exception type without attributes of its own
            pass


def stage_of(exc: BaseException) -> str | None:
    """The stage ``tag_stage`` recorded on ``exc``, or None."""
    return getattr(exc, "_augsbert_stage", None)

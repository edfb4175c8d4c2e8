"""The store that commits each labelled shard once: a folder, or a storage URI (``s3://``, ...).

In a folder (a local disk, a shared file system) a shard's file and then its manifest are each
written under a temporary name and renamed into place (``ShardStore``). On storage without an
atomic rename (``UriShardStore``): an object store cannot rename, but one PUT of an object is
atomic: the object appears whole or not at all, and a second PUT of the same key replaces it
whole. So shard ``i``'s Parquet file is put once under its deterministic name,
``part-{i:06d}.parquet``, and then its manifest, ``part-{i:06d}.json``, the commit marker. A
reader accepts a shard only when the bytes it read hash to what the manifest says, so a file cut
short, damaged or replaced since its manifest is never taken for the shard (where the storage's
writes are not atomic, e.g. a file system reached through a URI, the same check refuses a
half-written file).

Two writers of one shard on storage (a task retried after its actor wrote the shard, an actor of
a pool that failed still finishing) each put their own file, with a token of their own in its
footer, and then a manifest naming it. After writing its manifest a writer reads the footer of
the file in place: where it is another writer's, it hashes that file and writes the manifest
again, naming it. Each writer puts its file before its first manifest, so whoever writes the last
manifest does so after every file was put, and its check sees the file that stays: the end is
one file and one manifest that names it.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pyarrow as pa

from augsbert_ray.errors import LabelingError
from augsbert_ray.models import file_sha256

TOKEN_FILE = ".writers"  # the token that tells a worker it sees the driver's store (``ShardStore.open_for_workers``)


class ShardStore:
    """Labelled shards under deterministic names, each committed once with its manifest.

    Shard ``i`` holds candidate rows ``[i * size, (i + 1) * size)``. Its labelled rows go to
    ``part-{i:06d}.parquet`` (written under a temporary name, then renamed) and then its
    manifest ``part-{i:06d}.json`` (the shard's input digest, row count, the file's sha256 and
    the node that wrote it), also renamed into place. A shard counts as done only when its
    manifest matches the input and the file it names: a crash at any point leaves a shard either
    done or redone, never half there. A commit runs in the driver or in the labelling actor that
    labelled the shard (``labeling.commit``), where the store's folder is shared with the workers.

    ``root`` is a folder (a path or a ``file://`` URI) or a storage URI (``s3://``, ``gs://``, any
    location ``pyarrow.fs`` opens): ``ShardStore(uri)`` is then a ``UriShardStore``,
    the same names and checks without a rename (one PUT of an object is atomic), which every
    worker that can open the storage commits to.
    """

    def __new__(cls, root: str | os.PathLike | None = None, *args, **kwargs):
        if cls is ShardStore and root is not None and on_storage(root):
            return super().__new__(UriShardStore)
        return super().__new__(cls)

    def __init__(self, root: str | os.PathLike):
        self.root = Path(local_path(root))
        self.root.mkdir(parents=True, exist_ok=True)
        self.location = str(self.root.resolve())  # what a worker opens it by

    @property
    def where(self) -> str:
        """The store's location, for messages."""
        return str(self.root)

    def part(self, i: int) -> Path:
        return self.root / f"part-{i:06d}.parquet"

    def manifest(self, i: int) -> Path:
        return self.root / f"part-{i:06d}.json"

    def has_manifest(self, i: int) -> bool:
        return self.manifest(i).exists()

    def record(self, i: int) -> dict | None:
        """Shard ``i``'s manifest as written; None when it has none (or an unreadable one)."""
        try:
            return json.loads(self.manifest(i).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def verified(self, i: int, digest: str) -> dict | None:
        """Shard ``i``'s manifest where it matches the input ``digest`` and the file it names; else None."""
        record = self.record(i)
        try:
            part = self.part(i)
            if (record is not None and record["input"] == digest and part.stat().st_size == record["bytes"]
                    and file_sha256(part) == record["sha256"]):
                return record
        except (OSError, KeyError, TypeError):
            pass
        return None

    def done(self, i: int, digest: str) -> bool:
        return self.verified(i, digest) is not None

    def committed(self) -> set[int]:
        """The shards with a manifest (a listing, nothing read): those a resume has to verify."""
        folder = self.manifest(0).parent
        return {int(p.stem.split("-")[1]) for p in folder.glob("part-*.json") if p.stem.split("-")[1].isdigit()}

    def commit(self, i: int, table: pa.Table, digest: str, writer: str | None = None) -> dict:
        """Writes shard ``i``'s labelled rows, then its manifest; returns the manifest.

        Idempotent: a shard written twice (a labelling task retried after its commit) ends as one
        file with one manifest naming that file's sha256. Each write has a temporary name of its
        own, and after the manifest is in place the file is hashed again: where another writer
        replaced the file meanwhile, the manifest is rewritten for the file that is there.

        Args:
            writer: what wrote it (a Ray node id), recorded in the manifest.
        """
        import pyarrow.parquet as pq

        from augsbert_ray.rundir import written_whole

        part = self.part(i)
        tmp = part.with_name(f".{part.name}.{uuid.uuid4().hex[:12]}.tmp")
        with written_whole(tmp, part):  # a full disk: one error naming the part, no partial file kept
            pq.write_table(table, tmp)
        sha = file_sha256(tmp)
        os.replace(tmp, part)
        for _ in range(3):
            placed = _identity(part)
            record = {"input": digest, "rows": table.num_rows, "bytes": placed[1], "sha256": sha, "writer": writer}
            manifest = self.manifest(i)
            tmp = manifest.with_name(f".{manifest.name}.{uuid.uuid4().hex[:12]}.tmp")
            with written_whole(tmp, manifest):
                tmp.write_text(json.dumps(record), encoding="utf-8")
            os.replace(tmp, manifest)
            if _identity(part) == placed:  # the file the manifest names is still the one in place
                return record
            sha = file_sha256(part)  # another writer's file of the same rows replaced it: name that one
        return record

    def open_for_workers(self) -> str:
        """Writes a new token into the store's folder and returns it: a labelling actor that reads
        the same token there sees this folder (a shared file system, or the driver's node) and
        commits its shards itself; one that does not sends them to the driver."""
        token = uuid.uuid4().hex
        path = self.root / TOKEN_FILE
        tmp = path.with_name(f"{path.name}.{token}.tmp")
        tmp.write_text(token, encoding="utf-8")
        os.replace(tmp, path)
        return token

    def read(self, i: int) -> pa.Table:
        import pyarrow.parquet as pq

        return pq.read_table(self.part(i), use_threads=False)  # a shard is small: threads only hold memory


def _identity(path: Path) -> tuple[int, int, int]:
    """What tells one file from another put in its place: inode, size, modification time."""
    st = path.stat()
    return st.st_ino, st.st_size, st.st_mtime_ns


def sees_store(root: str | os.PathLike, token: str) -> bool:
    """Whether this process sees the store ``root`` (a folder or a storage URI) that
    ``ShardStore.open_for_workers`` wrote ``token`` into (nothing is created where it does not):
    a worker that can open a URI's storage sees it."""
    if on_storage(root):
        return _sees(str(root), token)
    try:
        return (Path(local_path(root)) / TOKEN_FILE).read_text(encoding="utf-8") == token
    except OSError:
        return False


def on_storage(location: str | os.PathLike) -> bool:
    """Whether a store's location is a storage URI (``s3://``, ``gs://``, ...) rather than a folder
    (a path, or a ``file://`` URI: a folder, where a rename is atomic)."""
    from augsbert_ray.rundir import is_uri

    return is_uri(location)


def local_path(location: str | os.PathLike) -> str:
    """A folder's path, given as a path or a ``file://`` URI."""
    text = str(location)
    if text.startswith("file://"):
        import pyarrow.fs as pafs

        return pafs.FileSystem.from_uri(text)[1]
    return text


def remove_stores(location: str | os.PathLike, keep: str | None = None) -> None:
    """Removes the folder of stores at ``location`` (a path or a storage URI), or with ``keep``
    every store in it but the one named ``keep``."""
    import shutil

    if on_storage(location):
        _remove(str(location), keep)
        return
    folder = Path(local_path(location))
    if keep is None:
        shutil.rmtree(folder, ignore_errors=True)
        return
    for old in folder.glob("*") if folder.exists() else []:
        if old.name != keep:
            shutil.rmtree(old, ignore_errors=True)


# -- on storage without a rename ---------------------------------------------------------------
WRITER_KEY = b"augsbert.shard_writer"  # the Parquet footer's key of the writer's token
CHECKS = 3  # rounds of manifest and check after another writer's file is found in place


def open_location(location: str):
    """``(filesystem, path)`` of a storage URI (``pyarrow.fs``; credentials and endpoint from the
    environment, or the URI's own user info and query, as ``pyarrow.fs`` reads them)."""
    import pyarrow.fs as pafs

    fs, path = pafs.FileSystem.from_uri(_single_puts(location))
    return fs, path.rstrip("/")


def _single_puts(location: str) -> str:
    """An S3 URI whose objects are each written in one PUT: pyarrow opens a multipart upload (three
    requests) unless the opening waits for the first write, and a shard or a manifest is small."""
    if not location.lower().startswith("s3://") or "allow_delayed_open=" in location:
        return location
    return f"{location}{'&' if '?' in location else '?'}allow_delayed_open=true"


def printable(location: str) -> str:
    """A URI for messages: without credentials in its user info, nor its query's settings."""
    parts = urlsplit(location)
    return urlunsplit((parts.scheme, parts.hostname or "", parts.path, "", ""))


def get_bytes(fs, path: str) -> bytes:
    """A whole object, in one read (one request on an object store: never parts of two versions)."""
    with fs.open_input_file(path) as f:
        return f.read()


def put_bytes(fs, path: str, data: bytes) -> None:
    """One object, in one write (one PUT on an object store: it appears whole or not at all)."""
    with fs.open_output_stream(path) as f:
        f.write(data)


class UriShardStore(ShardStore):
    """``ShardStore`` on a storage URI (``ShardStore(uri)`` makes one; see the module's second paragraph).

    ``part(i)`` and ``manifest(i)`` are paths within ``fs``; nothing is created until a shard is
    committed (an object store has no folders to make).
    """

    def __init__(self, root: str):
        self.location = str(root)
        self.fs, self.base = open_location(self.location)
        self.root = None  # no local folder

    @property
    def where(self) -> str:
        return printable(self.location)

    def part(self, i: int) -> str:
        return f"{self.base}/part-{i:06d}.parquet"

    def manifest(self, i: int) -> str:
        return f"{self.base}/part-{i:06d}.json"

    def has_manifest(self, i: int) -> bool:
        import pyarrow.fs as pafs

        return self.fs.get_file_info(self.manifest(i)).type == pafs.FileType.File

    def record(self, i: int) -> dict | None:
        try:
            return json.loads(get_bytes(self.fs, self.manifest(i)).decode("utf-8"))
        except (OSError, ValueError):
            return None

    def verified(self, i: int, digest: str) -> dict | None:
        record = self.record(i)
        try:
            if record is None or record["input"] != digest:
                return None
            data = get_bytes(self.fs, self.part(i))
            return record if _matches(data, record) else None
        except (OSError, KeyError, TypeError):
            return None

    def committed(self) -> set[int]:
        import pyarrow.fs as pafs

        infos = self.fs.get_file_info(pafs.FileSelector(self.base, allow_not_found=True))
        stems = (info.base_name[:-len(".json")] for info in infos
                 if info.type == pafs.FileType.File and info.base_name.endswith(".json"))
        return {int(s.split("-")[1]) for s in stems if s.startswith("part-") and s.split("-")[1].isdigit()}

    def commit(self, i: int, table: pa.Table, digest: str, writer: str | None = None) -> dict:
        import pyarrow.parquet as pq

        token = uuid.uuid4().hex.encode()
        sink = pa.BufferOutputStream()
        pq.write_table(table.replace_schema_metadata({**(table.schema.metadata or {}), WRITER_KEY: token}), sink)
        data = sink.getvalue().to_pybytes()
        put_bytes(self.fs, self.part(i), data)
        size, sha = len(data), hashlib.sha256(data).hexdigest()
        record = {}
        for _ in range(CHECKS):
            record = {"input": digest, "rows": table.num_rows, "bytes": size, "sha256": sha, "writer": writer}
            put_bytes(self.fs, self.manifest(i), json.dumps(record).encode("utf-8"))
            if self._writer_token(i) == token:  # the file the manifest names is the one in place
                return record
            placed = get_bytes(self.fs, self.part(i))  # another writer's file of the same rows: name that one
            size, sha, token = len(placed), hashlib.sha256(placed).hexdigest(), _token_of(placed)
        return record

    def _writer_token(self, i: int) -> bytes | None:
        """The token in the footer of shard ``i``'s file in place (only its footer is read)."""
        import pyarrow.parquet as pq

        try:
            with self.fs.open_input_file(self.part(i)) as f:
                return (pq.read_metadata(f).metadata or {}).get(WRITER_KEY)
        except (OSError, pa.ArrowException):
            return None

    def open_for_workers(self) -> str:
        token = uuid.uuid4().hex
        put_bytes(self.fs, f"{self.base}/{TOKEN_FILE}", token.encode("utf-8"))
        return token

    def read(self, i: int) -> pa.Table:
        """Shard ``i``'s rows, from bytes checked against its manifest.

        Raises:
            LabelingError: the file does not match its manifest (or either is missing).
        """
        import pyarrow.parquet as pq

        record = self.record(i)
        try:
            data = get_bytes(self.fs, self.part(i))
        except OSError as e:
            raise LabelingError(f"{self.where}: shard {i} cannot be read: {e}") from None
        if record is None or not _matches(data, record):
            raise LabelingError(f"{self.where}: shard {i}'s file does not match its manifest (damaged, or replaced "
                                "since); a re-run labels it again")
        return pq.read_table(pa.BufferReader(data), use_threads=False)


def _matches(data: bytes, record: dict) -> bool:
    return len(data) == record["bytes"] and hashlib.sha256(data).hexdigest() == record["sha256"]


def _token_of(data: bytes) -> bytes | None:
    import pyarrow.parquet as pq

    try:
        return (pq.read_metadata(pa.BufferReader(data)).metadata or {}).get(WRITER_KEY)
    except pa.ArrowException:
        return None


def _sees(location: str, token: str) -> bool:
    """Whether this process reads ``token`` in the store at ``location`` (``shards.sees_store``)."""
    try:
        fs, base = open_location(location)
        return get_bytes(fs, f"{base}/{TOKEN_FILE}").decode("utf-8") == token
    except (OSError, ValueError, pa.ArrowException):
        return False


def _remove(location: str, keep: str | None = None) -> None:
    """Removes the folder at ``location`` on its storage, or with ``keep`` every entry in it but that one."""
    import pyarrow.fs as pafs

    fs, base = open_location(location)
    if keep is None:
        if fs.get_file_info(base).type == pafs.FileType.Directory:
            fs.delete_dir(base)
        return
    for info in fs.get_file_info(pafs.FileSelector(base, allow_not_found=True)):
        if info.base_name == keep:
            continue
        if info.type == pafs.FileType.Directory:
            fs.delete_dir(info.path)
        elif info.type == pafs.FileType.File:
            fs.delete_file(info.path)

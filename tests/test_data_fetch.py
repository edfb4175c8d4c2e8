"""``augsbert data fetch`` without a network: a local HTTP server (a thread on 127.0.0.1) serves
an archive and files built from the shared data, whole, damaged or cut short; and the shipped
jobs' data folders, resolved on a fresh machine and on one with the data beside the checkout."""

from __future__ import annotations

import io
import re
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from augsbert_ray import data_fetch
from augsbert_ray.cli import main
from augsbert_ray.errors import ConfigError, DataError

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def shared():
    from conftest import shared_data_dir

    d = shared_data_dir()
    for ds in data_fetch.DATASETS.values():
        for name in ds.sha256:
            if not (d / ds.folder / name).is_file():
                pytest.skip(f"{d / ds.folder / name} is absent (set AUGSBERT_DATA_DIR to the data directory)")
    return d


def stsb_archive(shared: Path, damage: str | None = None) -> bytes:
    """Stsbenchmark.tar.gz as distributed (members under stsbenchmark/), one file damaged if asked."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in data_fetch.DATASETS["stsb"].sha256:
            data = (shared / "stsb" / name).read_bytes()
            if name == damage:
                data = data.replace(b"5.000", b"4.000", 1)
            info = tarfile.TarInfo(f"stsbenchmark/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class Server:
    """Serves ``files`` (name -> bytes) at http://127.0.0.1:PORT/NAME; a name in ``cut`` is
    announced whole (Content-Length) and cut off at half."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.cut: set[str] = set()
        self.requests: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                name = self.path.lstrip("/")
                server.requests.append(name)
                body = server.files.get(name)
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[: len(body) // 2] if name in server.cut else body)
                if name in server.cut:
                    self.close_connection = True

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def test_stsb_is_downloaded_verified_and_not_downloaded_again(shared, server, tmp_path, capsys):
    server.files["Stsbenchmark.tar.gz"] = stsb_archive(shared)
    root = tmp_path / "data"
    assert main(["data", "fetch", "stsb", "--to", str(root), "--mirror", server.url]) == 0
    assert files_under(root) == ["stsb"] + [f"stsb/{n}" for n in sorted(data_fetch.DATASETS["stsb"].sha256)]
    for name in data_fetch.DATASETS["stsb"].sha256:
        assert (root / "stsb" / name).read_bytes() == (shared / "stsb" / name).read_bytes()
    assert server.requests == ["Stsbenchmark.tar.gz"]
    assert main(["data", "fetch", "stsb", "--to", str(root), "--mirror", server.url]) == 0
    assert server.requests == ["Stsbenchmark.tar.gz"]  # already there: nothing downloaded
    assert "already in" in capsys.readouterr().out


def test_mrpc_files_are_downloaded_and_a_missing_one_is_added_beside_the_others(shared, server, tmp_path):
    for name in data_fetch.DATASETS["mrpc"].sha256:
        server.files[name] = (shared / "mrpc" / name).read_bytes()
    root = tmp_path / "data"
    result = data_fetch.fetch("mrpc", root, mirror=server.url, log=lambda line: None)
    assert result.downloaded and result.folder == root / "mrpc"
    (root / "mrpc" / "msr_paraphrase_test.txt").unlink()
    assert data_fetch.fetch("mrpc", root, mirror=server.url, log=lambda line: None).downloaded
    assert set(data_fetch.verified(data_fetch.DATASETS["mrpc"], root).values()) == {"ok"}
    assert files_under(root) == ["mrpc", "mrpc/msr_paraphrase_test.txt", "mrpc/msr_paraphrase_train.txt"]


def test_a_damaged_download_is_refused_naming_the_file_and_nothing_is_left(shared, server, tmp_path, capsys):
    server.files["Stsbenchmark.tar.gz"] = stsb_archive(shared, damage="sts-train.csv")
    root = tmp_path / "data"
    assert main(["data", "fetch", "stsb", "--to", str(root), "--mirror", server.url]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("augsbert: error: ")
    expected = data_fetch.DATASETS["stsb"].sha256["sts-train.csv"]
    assert f"{server.url}/Stsbenchmark.tar.gz: sts-train.csv has sha256" in err[0] and f"not {expected}" in err[0]
    assert "nothing was written" in err[0]
    assert files_under(root) == []


def test_an_interrupted_download_is_refused_and_nothing_is_left(shared, server, tmp_path):
    body = stsb_archive(shared)
    server.files["Stsbenchmark.tar.gz"] = body
    server.cut.add("Stsbenchmark.tar.gz")
    root = tmp_path / "data"
    with pytest.raises(DataError, match=f"download interrupted after .* of {len(body):,}"):
        data_fetch.fetch("stsb", root, mirror=server.url, log=lambda line: None)
    assert files_under(root) == []


def test_a_file_in_place_that_differs_is_left_alone(shared, server, tmp_path):
    server.files["Stsbenchmark.tar.gz"] = stsb_archive(shared)
    (tmp_path / "stsb").mkdir()
    (tmp_path / "stsb" / "sts-dev.csv").write_text("mine\n")
    with pytest.raises(DataError, match="sts-dev.csv: differs from the STS benchmark file"):
        data_fetch.fetch("stsb", tmp_path, mirror=server.url, log=lambda line: None)
    assert (tmp_path / "stsb" / "sts-dev.csv").read_text() == "mine\n" and server.requests == []


# -- where the jobs read, and where fetch writes ---------------------------------------------
def test_the_shipped_jobs_search_the_folders_fetch_writes_to():
    defaults = {m for job in (REPO / "jobs").glob("*.yaml")
                for m in re.findall(r"\$\{AUGSBERT_DATA_DIR:-([^}]*)\}", job.read_text())}
    assert defaults == {"|".join(data_fetch.DATA_DIRS)}


@pytest.fixture
def fresh_home(tmp_path, monkeypatch):
    """No AUGSBERT_DATA_DIR, an empty home, and a working directory with nothing beside it."""
    monkeypatch.delenv("AUGSBERT_DATA_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    return tmp_path


def test_a_job_reads_the_data_beside_the_checkout_and_fetch_finds_it_there(shared, fresh_home, server):
    import shutil

    from augsbert_ray.config import load_job

    shutil.copytree(shared / "stsb", fresh_home / "shared/data/stsb")
    cfg = load_job(REPO / "jobs/smoke.yaml")
    assert cfg.data.train.path == "../shared/data/stsb/sts-train.csv"
    result = data_fetch.fetch("stsb", mirror=server.url, log=lambda line: None)
    assert not result.downloaded and result.folder == fresh_home / "shared/data/stsb" and server.requests == []


def test_on_a_fresh_machine_the_job_names_the_fetch_command_and_reads_what_it_fetched(shared, fresh_home, server):
    from augsbert_ray import preflight
    from augsbert_ray.config import load_job

    with pytest.raises(ConfigError) as info:
        preflight.check_paths(load_job(REPO / "jobs/smoke.yaml"))
    message = str(info.value)
    assert "none of ~/.cache/augsbert-ray/data, ../shared/data holds it" in message
    assert "`augsbert data fetch stsb` downloads it" in message
    assert not (fresh_home / "home").exists()

    server.files["Stsbenchmark.tar.gz"] = stsb_archive(shared)
    result = data_fetch.fetch("stsb", mirror=server.url, log=lambda line: None)
    cache = fresh_home / "home/.cache/augsbert-ray/data/stsb"
    assert result.downloaded and result.folder == cache
    cfg = load_job(REPO / "jobs/smoke.yaml")
    assert cfg.data.train.path == str(cache / "sts-train.csv")
    preflight.check_paths(cfg)

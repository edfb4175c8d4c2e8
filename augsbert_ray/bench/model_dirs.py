"""Model folders the benchmarks load: a saved cross-encoder that the engine and its peer both
load, and random models of a given shape (speed does not depend on the weights)."""

from __future__ import annotations

import shutil
from pathlib import Path

SHAPE_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


def shape_dir(given: str | None = None) -> Path:
    """The folder with the config and tokenizer files of a model shape (default: the embedded
    all-MiniLM-L6-v2's own folder)."""
    if given:
        return Path(given)
    from augsbert_ray.models import embedded_model_dir

    return embedded_model_dir(verify=False)


def random_model(shape: Path, out: Path) -> Path:
    """A randomly initialised encoder of ``shape``'s config, saved with its tokenizer (safetensors)."""
    import torch
    from transformers import AutoConfig, AutoModel

    torch.manual_seed(0)
    AutoModel.from_config(AutoConfig.from_pretrained(shape)).save_pretrained(out, safe_serialization=True)
    for name in SHAPE_FILES[1:]:
        if (shape / name).exists():
            shutil.copy(shape / name, out / name)
    return out


def tiny_cross_encoder(out: Path) -> str:
    """A 2-layer random BERT (hidden size 128) with a one-logit head, on the embedded model's
    tokenizer: labelling costs little, so the pipeline's own behaviour shows."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from augsbert_ray.models import embedded_model_dir

    tok = AutoTokenizer.from_pretrained(str(embedded_model_dir()))
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=256, max_position_embeddings=512, num_labels=1)
    torch.manual_seed(0)
    BertForSequenceClassification(cfg).save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return str(out)


def saved_cross_encoder(model: str, out: Path) -> Path:
    """``model`` (``embedded``, a hub id or a folder) loaded as the engine loads a cross-encoder
    (a new one-logit head where it has none, the same every time) and saved in fp32 to ``out``,
    so that the engine and ``CrossEncoder`` score with the same weights."""
    import torch

    from augsbert_ray.models import load_cross_encoder

    torch.manual_seed(0)
    m, tok = load_cross_encoder(model)
    m.float().save_pretrained(out)
    tok.save_pretrained(out)
    return out

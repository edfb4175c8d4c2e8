"""Other encoder architectures than BERT, as teacher and student: tiny random models built here.

Each architecture gets a 2-layer random model saved as a local folder with a tokenizer of its
own kind (WordPiece on the shipped MiniLM vocabulary, or a small byte-level BPE for RoBERTa),
so that what differs from BERT is exercised: no token type ids (MPNet, RoBERTa, DistilBERT),
positions offset by the padding index (RoBERTa, MPNet), another layer layout (DistilBERT's
``transformer.layer``), relative positions (DeBERTa-v2).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from augsbert_ray.models import check_local_weights, load_bi_encoder, truncate_layers
from augsbert_ray.scoring import _pair_layout, _score_chunks, tokenize_pairs

SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
PAIRS = (["a man is playing a guitar.", "the cat sat on the mat in the sun all day long.", "two dogs run."],
         ["someone plays music.", "a cat.", "dogs are running outside on the grass near a tree."])


def _minilm_vocab() -> str:
    from augsbert_ray.models import embedded_model_dir

    return os.path.join(os.environ.get("AUGSBERT_TEST_TOKENIZER") or str(embedded_model_dir(verify=False)), "vocab.txt")


def _wordpiece(cls_name: str, vocab: str):
    import transformers

    specials = {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]",
                "mask_token": "[MASK]"}
    if cls_name == "MPNetTokenizerFast":
        specials.update(bos_token="[CLS]", eos_token="[SEP]")
    with open(vocab, encoding="utf-8") as f:
        ids = {line.rstrip("\n"): i for i, line in enumerate(f)}
    return getattr(transformers, cls_name)(vocab=ids, do_lower_case=True, **specials)


def _byte_level_bpe(folder):
    """A RoBERTa tokenizer (vocab.json + merges.txt) trained on a few hundred words, here."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaTokenizerFast

    words = " ".join(PAIRS[0] + PAIRS[1]).split() * 4 + ["the", "a", "is", "man", "cat", "dog", "music"]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(words, vocab_size=400, min_frequency=1,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    folder.mkdir(parents=True, exist_ok=True)
    vocab, merges = bpe.save_model(str(folder))
    return RobertaTokenizerFast(vocab=vocab, merges=merges)


def _build(arch: str, folder):
    """Saves a tiny random ``arch`` model (no head) and its tokenizer in ``folder``."""
    import transformers

    if arch == "roberta":
        tok = _byte_level_bpe(folder / "bpe")
    else:
        cls_name = {"mpnet": "MPNetTokenizerFast", "distilbert": "DistilBertTokenizerFast"}.get(arch, "BertTokenizerFast")
        tok = _wordpiece(cls_name, _minilm_vocab())
    vocab, pad = len(tok), tok.pad_token_id
    if arch == "distilbert":
        config = transformers.DistilBertConfig(vocab_size=vocab, dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                                               max_position_embeddings=160, pad_token_id=pad)
    elif arch == "deberta-v2":
        config = transformers.DebertaV2Config(vocab_size=vocab, **SMALL, max_position_embeddings=160,
                                              relative_attention=True, position_biased_input=False,
                                              pos_att_type=["p2c", "c2p"], pad_token_id=pad)
    else:
        # RoBERTa and MPNet number positions from padding_idx + 1: 128 tokens need 130 positions.
        positions = 128 + pad + 1 if arch in ("roberta", "mpnet") else 160
        config_cls = {"mpnet": transformers.MPNetConfig, "roberta": transformers.RobertaConfig,
                      "electra": transformers.ElectraConfig}[arch]
        extra = {"embedding_size": 32} if arch == "electra" else {}
        config = config_cls(vocab_size=vocab, **SMALL, **extra, max_position_embeddings=positions, pad_token_id=pad)
    torch.manual_seed(0)
    transformers.AutoModel.from_config(config).save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    return folder


ARCHS = ["mpnet", "roberta", "distilbert", "deberta-v2", "electra"]


@pytest.fixture(scope="module", params=ARCHS)
def arch_model(request, tmp_path_factory):
    return request.param, str(_build(request.param, tmp_path_factory.mktemp(request.param)))


def test_cross_encoder_loads_scores_and_trains(arch_model):
    """The scoring core (pairs composed from single sentences, no token types where the model
    has none, right padding) gives the scores of the model run on the tokenizer's own batch;
    the training recipe takes a step with finite gradients."""
    from augsbert_ray.training.recipes import make_recipe

    arch, path = arch_model
    check_local_weights(Path(path), sentence_transformers=False)
    recipe = make_recipe("cross_encoder", model=path, max_length=128)
    model = recipe.build("cpu")
    tok = recipe._tokenizer
    assert model.config.num_labels == 1
    tokens = tokenize_pairs(tok, *PAIRS, max_length=128)
    assert (tokens.type_ids is None) == ("token_type_ids" not in tok.model_input_names)
    if arch in ("mpnet", "roberta", "distilbert"):
        assert tokens.type_ids is None, f"{arch} has no token types"
    assert _pair_layout(tok, 128) is not None, f"{arch}: pairs are composed from single sentences"
    got = recipe.predict(model, *PAIRS, batch_size=2)
    model.eval()
    with torch.inference_mode():
        want = torch.sigmoid(model(**tok(*PAIRS, padding=True, truncation=True, max_length=128,
                                         return_tensors="pt")).logits.reshape(-1)).numpy()
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert np.ptp(got) > 0
    # a short batch filled with one-token rows (as on CPU) leaves every real row's score as it was
    s1, s2 = (list(PAIRS[0]) * 3)[:7], (list(PAIRS[1]) * 3)[:7]
    seven = tokenize_pairs(tok, s1, s2, max_length=128)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    plain, filled = (_score_chunks(model, iter([(np.arange(7), seven)]), 7, pad, None, 4, "cpu", fill=fill)
                     for fill in (False, True))
    assert (filled == plain).all(), f"{arch}: filler rows moved a score"

    model.train()
    loss = recipe.loss(model, *PAIRS, torch.tensor([0.9, 0.1, 0.5]))
    loss.backward()
    assert torch.isfinite(loss)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert recipe.lengths(*PAIRS).tolist() == [len(tokens.ids[a:b]) for a, b in zip(tokens.offsets, tokens.offsets[1:])]


def test_bi_encoder_keeps_its_first_layers(arch_model, tmp_path):
    """``bi_encoder.num_layers`` on any layout: the student keeps the first N layers, they
    are the same weights as in the full model, and the saved student reloads as it was."""
    _, path = arch_model
    full = load_bi_encoder(path, 32)
    small = load_bi_encoder(path, 32, num_layers=1)
    hf = small[0].auto_model
    assert hf.config.num_hidden_layers == 1
    emb = small.encode(PAIRS[0], convert_to_numpy=True)
    assert emb.shape == (3, 32) and np.isfinite(emb).all()
    first = dict(full[0].auto_model.named_parameters())
    for name, p in hf.named_parameters():
        torch.testing.assert_close(p, first[name])
    assert sum(p.numel() for p in hf.parameters()) < sum(p.numel() for p in full[0].auto_model.parameters())
    small.save(str(tmp_path / "student"), safe_serialization=True)
    again = load_bi_encoder(str(tmp_path / "student"), 32)
    np.testing.assert_allclose(again.encode(PAIRS[0], convert_to_numpy=True), emb, atol=1e-5)


def test_truncation_refuses_a_model_without_a_layer_list():
    from augsbert_ray.errors import AugSBERTError

    with pytest.raises(AugSBERTError, match="Linear: no list of transformer layers"):
        truncate_layers(torch.nn.Linear(2, 2), 1)

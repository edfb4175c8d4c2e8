import numpy as np
import pytest

from augsbert_ray.models import load_cross_encoder
from augsbert_ray.scoring import (_score_chunks, fill_rows, filled_size, fills_rows, pad_batch, prepare_model,
                                  resolve_precision, score_pairs, score_tokenized, token_budget_batches,
                                  tokenize_pairs)
from test_labeling import one_by_one, pairs


def test_token_budget_batches_hold_every_pair_once_within_the_budget():
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 120, size=500)
    lengths[7] = 400  # longer than the budget: goes alone
    batches = token_budget_batches(lengths, token_budget=256, max_pairs=32)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(500))
    for b in batches:
        assert len(b) <= 32
        assert len(b) * lengths[b].max() <= 256 or len(b) == 1
    assert [len(b) for b in batches if 7 in b] == [1]
    # Longest first, so a batch is cut only by the budget or the pair cap: few batches.
    assert len(batches) < 250


def test_pad_batch_rebuilds_each_pair(tiny_model):
    _, tok = load_cross_encoder(tiny_model)
    s1, s2 = pairs(9)
    tokens = tokenize_pairs(tok, s1, s2, max_length=20)
    assert len(tokens) == 9 and tokens.lengths.max() <= 20
    idx = np.array([4, 0, 8])
    ids, types, lens = pad_batch(tokens, idx, pad_id=tok.pad_token_id)
    enc = tok([s1[i] for i in idx], [s2[i] for i in idx], truncation=True, max_length=20, padding=True)
    assert ids.tolist() == enc["input_ids"] and types.tolist() == enc["token_type_ids"]
    assert lens.tolist() == [sum(m) for m in enc["attention_mask"]]


@pytest.mark.parametrize("budget", [None, 40, 200])
def test_scores_match_one_by_one_in_input_order(tiny_model, budget):
    model, tok = load_cross_encoder(tiny_model)
    model.eval()
    s1, s2 = pairs(41, seed=3)
    got = score_pairs(model, tok, s1, s2, micro_batch_size=16, token_budget=budget, chunk_pairs=15)
    np.testing.assert_allclose(got, one_by_one(model, tok, s1, s2), atol=1e-5)
    assert len(score_pairs(model, tok, [], [])) == 0
    tokens = tokenize_pairs(tok, s1, s2, 128)
    np.testing.assert_allclose(score_tokenized(model, tokens, pad_id=tok.pad_token_id, token_budget=budget), got,
                               atol=1e-6)


def test_fill_rows_appends_one_token_rows_up_to_the_size():
    ids, types, lens = np.array([[5, 6, 7], [5, 6, 0]]), np.array([[0, 1, 1], [0, 1, 0]]), np.array([3, 2])
    f_ids, f_types, f_lens = fill_rows(ids, types, lens, 5, pad_id=0)
    assert f_ids.shape == f_types.shape == (5, 3) and f_lens.tolist() == [3, 2, 1, 1, 1]
    assert (f_ids[:2] == ids).all() and (f_ids[2:] == 0).all() and (f_types[2:] == 0).all()
    assert fill_rows(ids, None, lens, 2, pad_id=0)[0] is ids  # a full batch is left as it is


def test_a_short_batch_is_filled_to_a_power_of_two_at_most_its_widths_full_batch():
    assert [filled_size(n, 20, 2048, 4096) for n in (1, 2, 3, 5, 8, 9, 60, 100, 102)] == [1, 2, 4, 8, 8, 16, 64, 102, 102]
    assert filled_size(3, 3000, 2048, 4096) == 3  # longer than the budget: as it is
    assert filled_size(7, 20, 1 << 62, 64) == 8  # no token budget: the pair cap is the full batch


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_filled_batches_keep_every_score_to_the_bit_with_few_shapes_per_width(tiny_model, precision):
    """Short batches are filled (the last of each chunk would otherwise bring oneDNN a new
    shape almost every time); no pair's score may move at all."""
    model, tok = load_cross_encoder(tiny_model)
    model = prepare_model(model, precision, "cpu")
    s1, s2 = pairs(300, seed=6)
    chunks = [(np.arange(start, start + 30), tokenize_pairs(tok, s1[start:start + 30], s2[start:start + 30], 64))
              for start in range(0, 300, 30)]
    shapes = []
    hook = model.register_forward_pre_hook(lambda _, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)),
                                           with_kwargs=True)
    try:
        plain = _score_chunks(model, iter(chunks), 300, tok.pad_token_id, 120, 16, "cpu", fill=False)
        plain_shapes, shapes[:] = set(shapes), []
        filled = _score_chunks(model, iter(chunks), 300, tok.pad_token_id, 120, 16, "cpu")
    finally:
        hook.remove()
    assert fills_rows(model, "cpu") and not fills_rows(model, "cuda")
    assert (filled == plain).all()
    full = {width: min(16, 120 // width) for _, width in shapes}
    assert all(rows == full[width] or rows & (rows - 1) == 0 for rows, width in shapes)  # full, or a power of two
    assert len(set(shapes)) < len(plain_shapes)


def test_int8_quantises_the_linear_layers_and_fp32_is_exact(tiny_model):
    import copy

    model, tok = load_cross_encoder(tiny_model)
    model.eval()
    s1, s2 = pairs(30, seed=4)
    ref = one_by_one(model, tok, s1, s2)
    exact = score_pairs(prepare_model(copy.deepcopy(model), "fp32", "cpu"), tok, s1, s2)
    np.testing.assert_allclose(exact, ref, atol=1e-5)
    quant = prepare_model(copy.deepcopy(model), "int8", "cpu")
    assert any("Quantized" in type(m).__name__ or "quantized" in type(m).__module__ for m in quant.modules())
    assert not fills_rows(quant, "cpu")  # dynamic int8 scales a batch by its largest value: no filler rows
    got = score_pairs(quant, tok, s1, s2)
    assert np.abs(got - ref).max() < 2e-2


def test_auto_precision_on_cpu_is_bf16_only_where_the_cpu_has_bf16_instructions(monkeypatch):
    import torch

    from augsbert_ray import scoring

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    assert not scoring.cpu_has_bf16() and resolve_precision("auto", "cpu") == "fp32"
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True, raising=False)
    assert scoring.cpu_has_bf16() and resolve_precision("auto", "cpu") == "bf16"
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: 1 / 0, raising=False)  # a broken probe
    assert resolve_precision("auto", "cpu") == "fp32"
    assert resolve_precision("fp32", "cpu") == "fp32"  # an explicit precision is kept


def test_bf16_on_cpu_keeps_the_fp32_scores_within_its_tolerance(tiny_model):
    import copy

    import torch

    model, tok = load_cross_encoder(tiny_model)
    model.eval()
    s1, s2 = pairs(30, seed=5)
    ref = one_by_one(model, tok, s1, s2)
    half = prepare_model(copy.deepcopy(model), "bf16", "cpu")
    assert next(half.parameters()).dtype == torch.bfloat16
    got = score_pairs(half, tok, s1, s2, token_budget=200)
    assert got.dtype == np.float32 and np.abs(got - ref).max() < 2e-2


def test_precision_names_are_checked():
    assert resolve_precision("fp32", "cpu") == "fp32"
    with pytest.raises(ValueError, match="precision must be one of"):
        resolve_precision("fp8", "cpu")
    with pytest.raises(ValueError, match="CPU only"):
        resolve_precision("int8", "cuda")


def test_mismatched_pair_lists_are_rejected(tiny_model):
    model, tok = load_cross_encoder(tiny_model)
    with pytest.raises(ValueError, match="3 first sentences but 2"):
        score_pairs(model, tok, ["a", "b", "c"], ["x", "y"])


def _reference(tok, s1, s2, max_length):
    enc = tok(list(s1), list(s2), truncation=True, max_length=max_length)
    return enc["input_ids"], enc.get("token_type_ids")


def _rows(tokens):
    ids = [tokens.ids[a:b].tolist() for a, b in zip(tokens.offsets[:-1], tokens.offsets[1:])]
    types = None if tokens.type_ids is None else [tokens.type_ids[a:b].tolist()
                                                  for a, b in zip(tokens.offsets[:-1], tokens.offsets[1:])]
    return ids, types


def _mixed_pairs():
    import random

    s1, s2 = pairs(60, seed=7)
    extra = ["", " ", "naïve café, 東京 😀 — ok?", "word " * 300, "a", "A"]
    sentences = s1 + s2 + extra
    rng = random.Random(1)
    # Candidate-like: a few sentences recur in many pairs, on either side.
    a = [rng.choice(sentences[:10] + extra) if rng.random() < 0.5 else rng.choice(sentences) for _ in range(400)]
    b = [rng.choice(sentences) for _ in range(400)]
    return a, b


@pytest.mark.parametrize("max_length", [5, 9, 20, 128])
def test_composed_pairs_equal_the_tokenizers_pair_encoding(tiny_model, max_length):
    from augsbert_ray import scoring

    _, tok = load_cross_encoder(tiny_model)
    s1, s2 = _mixed_pairs()
    composed = tokenize_pairs(tok, s1, s2, max_length)
    assert scoring._pair_layout(tok, max_length) is not None  # composed, not tokenised whole
    assert _rows(composed) == _reference(tok, s1, s2, max_length)
    whole = tokenize_pairs(tok, s1, s2, max_length, compose=False)
    assert np.array_equal(whole.ids, composed.ids) and np.array_equal(whole.offsets, composed.offsets)


def _template_tokenizer(pair_template: str):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = "the a cat dog sat ran on in park mat . !".split()
    vocab = {w: i for i, w in enumerate(["<pad>", "<s>", "</s>", "<unk>"] + words)}
    rust = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    rust.pre_tokenizer = pre_tokenizers.Whitespace()
    rust.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair=pair_template, special_tokens=[("<s>", 1), ("</s>", 2)])
    return PreTrainedTokenizerFast(tokenizer_object=rust, pad_token="<pad>", unk_token="<unk>",
                                   model_input_names=["input_ids", "attention_mask"])


def test_a_roberta_style_layout_is_composed():
    from augsbert_ray import scoring

    tok = _template_tokenizer("<s> $A </s> </s> $B </s>")
    s1 = ["the cat sat on the mat .", "a dog", "", "the cat sat on the mat ."] * 5
    s2 = ["a dog ran in the park !" * 3, "the cat", "dog", "park"] * 5
    for max_length in (7, 12, 64):
        got = tokenize_pairs(tok, s1, s2, max_length)
        assert scoring._pair_layout(tok, max_length) is not None
        assert got.type_ids is None
        assert _rows(got)[0] == _reference(tok, s1, s2, max_length)[0]


def test_a_layout_it_cannot_learn_falls_back_to_whole_pairs():
    from augsbert_ray import scoring

    tok = _template_tokenizer("<s> $B:1 </s> $A:0 </s>")  # second sentence first: not composed
    s1, s2 = ["the cat sat", "a dog", ""], ["on the mat", "ran in the park !", "cat"]
    got = tokenize_pairs(tok, s1, s2, 8)
    assert scoring._pair_layout(tok, 8) is None
    assert _rows(got)[0] == _reference(tok, s1, s2, 8)[0]

import numpy as np
import pytest

from augsbert_ray.models import load_cross_encoder
from augsbert_ray.scoring import (pad_batch, prepare_model, resolve_precision, score_pairs, score_tokenized,
                                  token_budget_batches, tokenize_pairs)
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


def test_int8_quantises_the_linear_layers_and_fp32_is_exact(tiny_model):
    import copy

    model, tok = load_cross_encoder(tiny_model)
    model.eval()
    s1, s2 = pairs(30, seed=4)
    ref = one_by_one(model, tok, s1, s2)
    exact = score_pairs(prepare_model(copy.deepcopy(model), "fp32", "cpu"), tok, s1, s2)
    np.testing.assert_allclose(exact, ref, atol=1e-5)
    assert resolve_precision("auto", "cpu") == "fp32"
    quant = prepare_model(copy.deepcopy(model), "int8", "cpu")
    assert any("Quantized" in type(m).__name__ or "quantized" in type(m).__module__ for m in quant.modules())
    got = score_pairs(quant, tok, s1, s2)
    assert np.abs(got - ref).max() < 2e-2


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

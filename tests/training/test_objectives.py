"""The two losses, on tensors small enough to compute by hand."""

from __future__ import annotations

import math

import pytest
import torch

from augsbert_ray.training.objectives import cosine_similarity_loss, cross_encoder_loss


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def test_cosine_loss_is_zero_when_cosine_equals_label():
    a = torch.tensor([[1.0, 2.0, 3.0], [0.0, 1.0, 0.0], [2.0, 0.0, 0.0]])
    b = torch.tensor([[2.0, 4.0, 6.0], [1.0, 0.0, 0.0], [-3.0, 0.0, 0.0]])  # parallel, orthogonal, opposite
    assert cosine_similarity_loss(a, b, torch.tensor([1.0, 0.0, -1.0])).item() == pytest.approx(0.0, abs=1e-7)


def test_cosine_loss_by_hand():
    a = torch.tensor([[1.0, 0.0], [1.0, 1.0], [3.0, 4.0]])
    b = torch.tensor([[0.0, 1.0], [1.0, 0.0], [3.0, 4.0]])
    labels = torch.tensor([0.5, 0.5, 0.2])
    # cos = 0, 1/sqrt(2), 1; the loss is the mean squared gap to the labels.
    expected = ((0 - 0.5) ** 2 + (1 / math.sqrt(2) - 0.5) ** 2 + (1 - 0.2) ** 2) / 3
    assert cosine_similarity_loss(a, b, labels).item() == pytest.approx(expected, rel=1e-6)


def test_cosine_loss_ignores_scale_and_casts_labels():
    a = torch.tensor([[1.0, 1.0]], dtype=torch.float64)
    b = torch.tensor([[5.0, 0.0]], dtype=torch.float64)
    loss = cosine_similarity_loss(a, b, torch.tensor([1], dtype=torch.int64))
    assert loss.dtype == torch.float64
    assert loss.item() == pytest.approx((1 / math.sqrt(2) - 1) ** 2, rel=1e-12)


def test_cosine_loss_gradient_pulls_towards_label():
    a = torch.tensor([[1.0, 0.0]], requires_grad=True)
    b = torch.tensor([[1.0, 1.0]])
    cosine_similarity_loss(a, b, torch.tensor([1.0])).backward()
    # Raising cos(a, b) towards 1 means moving a towards b's direction: +y.
    assert a.grad[0, 1] < 0


def test_cross_encoder_loss_by_hand_with_soft_labels():
    logits = torch.tensor([[2.0], [-1.0], [0.0], [0.5]])  # (batch, 1), as a one-output head gives
    labels = torch.tensor([1.0, 0.0, 0.5, 0.3])
    expected = 0.0
    for x, y in zip([2.0, -1.0, 0.0, 0.5], [1.0, 0.0, 0.5, 0.3]):
        p = _sigmoid(x)
        expected += -(y * math.log(p) + (1 - y) * math.log(1 - p))
    expected /= 4
    assert cross_encoder_loss(logits, labels).item() == pytest.approx(expected, rel=1e-6)
    # A logit of 0 against a label of 0.5 costs ln 2: the soft target is honoured, not rounded.
    assert cross_encoder_loss(torch.zeros(1, 1), torch.tensor([0.5])).item() == pytest.approx(math.log(2), rel=1e-6)


def test_cross_encoder_loss_is_minimised_at_the_soft_label():
    labels = torch.tensor([0.3])
    best = torch.tensor([[math.log(0.3 / 0.7)]])  # sigmoid(best) == 0.3
    at_best = cross_encoder_loss(best, labels).item()
    for delta in (-0.5, 0.5):
        assert cross_encoder_loss(best + delta, labels).item() > at_best
    logits = best.clone().requires_grad_(True)
    cross_encoder_loss(logits, labels).backward()
    assert logits.grad.abs().item() < 1e-6


# --- CoSENT, AnglE and score distillation ------------------------------------------------------

def _reference(loss_class: str, a: torch.Tensor, b: torch.Tensor, labels: torch.Tensor) -> float:
    """sentence-transformers' own loss on the same embeddings (no model needed to compute it)."""
    from sentence_transformers.sentence_transformer import losses

    return getattr(losses, loss_class)(model=None).compute_loss_from_embeddings([a, b], labels).item()


@pytest.mark.parametrize("dim", [6, 7])  # an odd dimension: AnglE pads it with a zero
@pytest.mark.parametrize("loss_class", ["CoSENTLoss", "AnglELoss"])
def test_ranking_losses_match_sentence_transformers(loss_class, dim):
    from augsbert_ray.training.objectives import angle_loss, cosent_loss

    ours = {"CoSENTLoss": cosent_loss, "AnglELoss": angle_loss}[loss_class]
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(9, dim, generator=g), torch.randn(9, dim, generator=g)
    labels = torch.tensor([0.1, 0.5, 0.5, 0.9, 0.0, 1.0, 0.3, 0.3, 0.72])  # ties are not ranked
    assert ours(a, b, labels).item() == pytest.approx(_reference(loss_class, a, b, labels), rel=1e-5)


def test_cosent_by_hand():
    from augsbert_ray.training.objectives import cosent_loss

    a = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    b = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])  # cos 1, 0, 1/sqrt(2)
    # Labels rank pair 1 above pair 0 above pair 2: the wrong-way terms are cos_0 - cos_1,
    # cos_2 - cos_1 and cos_2 - cos_0, each times the scale.
    c = [1.0, 0.0, 1 / math.sqrt(2)]
    expected = math.log(1 + math.exp(2 * (c[0] - c[1])) + math.exp(2 * (c[2] - c[1])) + math.exp(2 * (c[2] - c[0])))
    assert cosent_loss(a, b, torch.tensor([0.5, 0.9, 0.1]), scale=2.0).item() == pytest.approx(expected, rel=1e-6)
    # Equal labels leave nothing to rank: log(1 + 0).
    assert cosent_loss(a, b, torch.tensor([0.4, 0.4, 0.4])).item() == 0.0


def test_ranking_losses_see_only_the_order_of_the_labels():
    from augsbert_ray.training.objectives import angle_loss, cosent_loss

    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(6, 8, generator=g), torch.randn(6, 8, generator=g)
    labels = torch.tensor([0.1, 0.4, 0.2, 0.9, 0.6, 0.3])
    for loss in (cosent_loss, angle_loss):
        assert loss(a, b, labels).item() == pytest.approx(loss(a, b, labels ** 3 * 5).item(), rel=1e-6)
        assert loss(a, b, labels).item() != pytest.approx(loss(a, b, labels.flip(0)).item(), rel=1e-3)


def test_angle_similarity_is_the_complex_angle_by_hand():
    from augsbert_ray.training.objectives import angle_similarity

    # As complex numbers, x = 1 and y = i: Re(x * conj(y)) = 0, Im = -1, so |0 - 1| = 1; and x
    # with itself: |1 + 0| = 1; x against -x: |-1| = 1, against a 45-degree turn: |cos - sin| = 0.
    x = torch.tensor([[1.0, 0.0]] * 4)
    y = torch.tensor([[0.0, 1.0], [1.0, 0.0], [-1.0, 0.0], [1.0, 1.0]])
    assert angle_similarity(x, y).tolist() == pytest.approx([1.0, 1.0, 1.0, 0.0], abs=1e-6)


def test_score_distillation_fits_silver_to_the_teacher_and_keeps_gold_objective():
    from augsbert_ray.training.objectives import cosent_loss, cosine_similarity_loss, score_distillation_loss

    g = torch.Generator().manual_seed(7)
    a, b = torch.randn(8, 5, generator=g), torch.randn(8, 5, generator=g)
    labels = torch.rand(8, generator=g)
    silver = torch.tensor([False, True, True, False, True, True, False, True])
    loss = score_distillation_loss(a, b, labels, silver, cosent_loss)
    gold = ~silver
    cos = torch.nn.functional.cosine_similarity(a[silver], b[silver])
    expected = cosent_loss(a[gold], b[gold], labels[gold]) * 3 / 8 + ((cos - labels[silver]) ** 2).mean() * 5 / 8
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    # All gold: the gold objective alone; all silver: MSE to the teacher's scores alone.
    assert score_distillation_loss(a, b, labels, torch.zeros(8, dtype=torch.bool), cosent_loss).item() == \
        pytest.approx(cosent_loss(a, b, labels).item(), rel=1e-6)
    assert score_distillation_loss(a, b, labels, torch.ones(8, dtype=torch.bool), cosent_loss).item() == \
        pytest.approx(cosine_similarity_loss(a, b, labels).item(), rel=1e-6)
    # With the cosine objective for gold it is the cosine loss over every row: AugSBERT's own.
    assert score_distillation_loss(a, b, labels, silver, cosine_similarity_loss).item() == \
        pytest.approx(cosine_similarity_loss(a, b, labels).item(), rel=1e-6)

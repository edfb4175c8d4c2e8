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

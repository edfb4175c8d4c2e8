"""Loss functions as pure tensor functions, so each can be tested on hand-made tensors."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F


def cosine_similarity_loss(emb_a: torch.Tensor, emb_b: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean squared error between cos(u, v) and the gold score (SBERT's CosineSimilarityLoss).

    Args:
        emb_a: (batch, dim) embeddings of the first sentences.
        emb_b: (batch, dim) embeddings of the second sentences.
        labels: (batch,) target similarities in [0, 1].
    """
    return F.mse_loss(F.cosine_similarity(emb_a, emb_b, dim=-1), labels.to(emb_a.dtype))


def cross_encoder_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy of sigmoid(logit) against a score in [0, 1].

    Soft targets are valid for BCE, so the same loss serves regression (STSb scores scaled to
    [0, 1]) and binary tasks, and the trained model's sigmoid output is the silver label.
    """
    return F.binary_cross_entropy_with_logits(logits.reshape(-1), labels.to(logits.dtype))


def softmax_pair_loss(emb_a: torch.Tensor, emb_b: torch.Tensor, labels: torch.Tensor, head: torch.nn.Module) -> torch.Tensor:
    """SBERT's classification objective: softmax over W(u, v, |u - v|) (Reimers & Gurevych 2019, eq. 1).

    Args:
        emb_a, emb_b: (batch, dim) embeddings.
        labels: (batch,) class ids (0/1 for binary tasks; float labels are rounded).
        head: maps (batch, 3 * dim) to (batch, classes) logits; trained with the encoder, then discarded.
    """
    features = torch.cat([emb_a, emb_b, torch.abs(emb_a - emb_b)], dim=-1)
    return F.cross_entropy(head(features), labels.round().long())


def contrastive_loss(emb_a: torch.Tensor, emb_b: torch.Tensor, labels: torch.Tensor, margin: float = 0.5) -> torch.Tensor:
    """Contrastive loss on cosine distance (Hadsell et al. 2006), as in SBERT's ContrastiveLoss.

    Positive pairs (label 1) are pulled to distance 0; negatives pushed beyond ``margin``.
    """
    d = 1 - F.cosine_similarity(emb_a, emb_b, dim=-1)
    y = labels.to(d.dtype)
    return 0.5 * (y * d.pow(2) + (1 - y) * F.relu(margin - d).pow(2)).mean()


def _ranking_loss(scores: torch.Tensor, labels: torch.Tensor, scale: float) -> torch.Tensor:
    """log(1 + sum over pairs (i, j) with label_i > label_j of exp(scale * (score_j - score_i))).

    The pairwise ranking loss shared by CoSENT and AnglE: every pair of rows whose labels are
    ordered should have its scores ordered the same way, whatever their scale.
    """
    s = scale * scores.float()  # exp of scale-20 differences loses too much in half precision
    y = labels.to(s.dtype)
    wrong_way = s[None, :] - s[:, None]  # [i, j]: score_j - score_i
    ordered = y[:, None] > y[None, :]  # [i, j]: label_i > label_j
    return torch.logsumexp(torch.cat([s.new_zeros(1), wrong_way[ordered]]), dim=0)


def cosent_loss(emb_a: torch.Tensor, emb_b: torch.Tensor, labels: torch.Tensor, scale: float = 20.0) -> torch.Tensor:
    """CoSENT (Su 2022): the batch's pairs ranked by cosine as their labels rank them.

    Only the order of the labels matters, not their values, so the cosine is not pulled to
    the label's scale (sentence-transformers' CoSENTLoss).

    Args:
        emb_a, emb_b: (batch, dim) embeddings of the first and second sentences.
        labels: (batch,) similarity scores; only their order within the batch is used.
        scale: the inverse temperature of the cosine differences (20, as in the paper).

    Returns:
        The loss, a scalar (0 in the limit where every ordered pair is ranked right).

    References:
        Su, "CoSENT: a more efficient sentence embedding scheme than Sentence-BERT" (2022).
    """
    return _ranking_loss(F.cosine_similarity(emb_a, emb_b, dim=-1), labels, scale)


def angle_similarity(emb_a: torch.Tensor, emb_b: torch.Tensor) -> torch.Tensor:
    """AnglE's similarity: each embedding read as a complex vector (first half real, second
    half imaginary) of unit norm; the score is |Re + Im| of sum(z_a * conj(z_b)), whose
    imaginary part measures the angle between the two in complex space (Li & Li 2023).

    Unlike the cosine, its gradient does not vanish where the cosine saturates near +-1.
    An odd dimension is padded with a zero.
    """
    a, b = F.normalize(emb_a.float(), dim=-1), F.normalize(emb_b.float(), dim=-1)
    if a.shape[-1] % 2:
        a, b = F.pad(a, (0, 1)), F.pad(b, (0, 1))
    za, zb = torch.complex(*a.chunk(2, dim=-1)), torch.complex(*b.chunk(2, dim=-1))
    product = (za * zb.conj()).sum(dim=-1)
    return (product.real + product.imag).abs()


def angle_loss(emb_a: torch.Tensor, emb_b: torch.Tensor, labels: torch.Tensor, scale: float = 20.0) -> torch.Tensor:
    """AnglE (Li & Li 2023): CoSENT's ranking loss on ``angle_similarity`` instead of the
    cosine (sentence-transformers' AnglELoss).

    Args:
        emb_a, emb_b: (batch, dim) embeddings of the first and second sentences.
        labels: (batch,) similarity scores; only their order within the batch is used.
        scale: the inverse temperature of the similarity differences.

    Returns:
        The loss, a scalar.

    References:
        Li & Li, "AnglE-optimized Text Embeddings" (2023), arXiv:2309.12871.
    """
    return _ranking_loss(angle_similarity(emb_a, emb_b), labels, scale)


def score_distillation_loss(emb_a: torch.Tensor, emb_b: torch.Tensor, labels: torch.Tensor, silver: torch.Tensor,
                            gold_loss: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Gold pairs trained with their own objective, silver pairs fitted to the teacher's score.

    A silver pair's label is the teacher's score: the student's cosine is fitted to it (MSE),
    as in score distillation, while the gold pairs of the batch keep ``gold_loss`` (a ranking
    loss such as ``cosent_loss``). Each part weighs as its share of the batch's rows, so with
    ``cosine_similarity_loss`` as ``gold_loss`` this is exactly that loss over every row.

    Args:
        emb_a, emb_b: (batch, dim) embeddings.
        labels: (batch,) gold scores for gold rows, the teacher's scores for silver rows.
        silver: (batch,) bool, True for the rows the teacher labelled.
        gold_loss: the objective of the gold rows.

    Returns:
        The loss, a scalar.
    """
    silver = silver.to(torch.bool)
    n = silver.numel()
    parts = []
    if (~silver).any():
        gold = ~silver
        parts.append(gold_loss(emb_a[gold], emb_b[gold], labels[gold]).float() * (gold.sum() / n))
    if silver.any():
        cos = F.cosine_similarity(emb_a[silver], emb_b[silver], dim=-1).float()
        parts.append(F.mse_loss(cos, labels[silver].float()) * (silver.sum() / n))
    return torch.stack(parts).sum()

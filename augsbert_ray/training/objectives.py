"""Loss functions as pure tensor functions, so each can be tested on hand-made tensors."""

from __future__ import annotations

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

"""What to train: one small recipe per encoder (build, loss on a batch of pairs, save).

The loop in ``loop.py`` knows nothing of either model; a recipe knows nothing of Ray.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from augsbert_ray.models import load_bi_encoder, load_cross_encoder
from augsbert_ray.training.batches import TokenRows
from augsbert_ray.training.objectives import (
    angle_loss,
    contrastive_loss,
    cosent_loss,
    cosine_similarity_loss,
    cross_encoder_loss,
    score_distillation_loss,
    softmax_pair_loss,
)


@contextmanager
def _no_save_bars():
    """Without transformers' "Writing model shards" bar: a save runs in a Ray worker, whose
    output reaches the terminal late, below the job's own progress display."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


# Rows tokenised per call when a recipe pre-tokenises its training pairs (memory, not results:
# padding inside a chunk is stripped again).
PRETOKENIZE_CHUNK = 1024


class Recipe(Protocol):
    def build(self, device: str) -> torch.nn.Module: ...

    def loss(self, module: torch.nn.Module, s1: list[str], s2: list[str], labels: torch.Tensor,
             silver: torch.Tensor | None = None) -> torch.Tensor: ...

    def save(self, module: torch.nn.Module, out_dir: str) -> None: ...

    # Optional (both recipes have them): pre-tokenised batches, used by the loop when present.
    # pretokenize(s1, s2) -> TokenRows; batch_rows(idx, n) -> the rows of pairs idx;
    # features_loss(module, features, labels, silver) -> the loss, as loss() computes it.

    def predict(self, module: torch.nn.Module, s1: list[str], s2: list[str], batch_size: int) -> np.ndarray: ...


def unwrap(module: torch.nn.Module) -> torch.nn.Module:
    return getattr(module, "module", module)  # DistributedDataParallel keeps the model in .module


@contextmanager
def _eval_mode(module: torch.nn.Module):
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)


class _PairEncoder(torch.nn.Module):
    """A bi-encoder plus the (optional) classifier head of its objective, as one module.

    Keeping the head inside the module that data-parallel training wraps means its
    gradients are synchronised like the encoder's.
    """

    def __init__(self, st, head: torch.nn.Module | None):
        super().__init__()
        self.st = st
        self.head = head

    def forward(self, features: dict) -> torch.Tensor:
        return self.st(features)["sentence_embedding"]


@dataclass
class BiEncoderRecipe:
    """A sentence-transformers bi-encoder (mean pooling) trained with one pair objective.

    Objectives: ``cosine`` (MSE of cosine vs score, for similarity scores), ``cosent`` and
    ``angle`` (ranking losses on similarity scores), ``cosent-distill`` and ``angle-distill``
    (that ranking loss on gold pairs, the teacher's score fitted by MSE on silver pairs: the
    loss needs each batch's silver flags), ``softmax`` (SBERT's classifier over (u, v, |u-v|),
    for binary labels), ``contrastive``.
    """

    model: str
    max_length: int = 128
    num_layers: int | None = None
    objective: str = "cosine"
    _st: Any = field(default=None, repr=False)

    def build(self, device: str) -> torch.nn.Module:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"unknown objective '{self.objective}'; valid: {', '.join(sorted(OBJECTIVES))}")
        self._st = load_bi_encoder(self.model, self.max_length, self.num_layers, device=device)
        head = None
        if self.objective == "softmax":
            head = torch.nn.Linear(3 * self._st.get_embedding_dimension(), 2).to(device)
        return _PairEncoder(self._st, head)

    def loss(self, module, s1, s2, labels, silver=None):
        # One forward over both sides: DistributedDataParallel expects one forward per backward.
        features = st_features(self._st, list(s1) + list(s2))
        device = labels.device
        features = {k: v.to(device) if torch.is_tensor(v) else v for k, v in features.items()}
        return self.features_loss(module, features, labels, silver)

    def pretokenize(self, s1: list[str], s2: list[str]) -> TokenRows:
        """Every sentence tokenised once, as ``loss`` tokenises them: rows ``0..n-1`` are ``s1``,
        ``n..2n-1`` are ``s2`` (see ``batch_rows``)."""
        texts = list(s1) + list(s2)
        tok = self._st.tokenizer
        step = PRETOKENIZE_CHUNK
        # dict(): the tensors alone, without the tokenizer's per-row Encoding objects, which held
        # 4.5 KB a sentence (889 against 132 MiB for 200,000 short sentences) until the end
        chunks = [dict(st_features(self._st, texts[i:i + step])) for i in range(0, len(texts), step)]
        return TokenRows.from_padded(chunks, tok.pad_token_id, tok.pad_token_type_id, tok.padding_side == "left")

    @staticmethod
    def batch_rows(idx: np.ndarray, n: int) -> np.ndarray:
        """The rows of ``pretokenize``'s output that hold pairs ``idx``: both sides, as ``loss`` reads them."""
        return np.concatenate([idx, idx + n])

    def features_loss(self, module, features: dict, labels, silver=None):
        """The loss of a batch given as tokenised features (both sides' sentences, ``s1``'s first)."""
        emb = module(features)
        a, b = emb[: len(labels)], emb[len(labels) :]
        if self.objective == "softmax":
            return softmax_pair_loss(a, b, labels, unwrap(module).head)
        if self.objective in DISTILLED:
            if silver is None:
                raise ValueError(f"the {self.objective} objective needs to know which pairs are silver "
                                 "(a student's training set, schema.IS_SILVER)")
            return score_distillation_loss(a, b, labels, silver, DISTILLED[self.objective])
        return OBJECTIVES[self.objective](a, b, labels)

    def save(self, module, out_dir: str) -> None:
        # No card here: sentence-transformers would copy the base model's own; the stage writes the model's.
        with _no_save_bars():
            unwrap(module).st.save(out_dir, safe_serialization=True, create_model_card=False)

    def lengths(self, s1: list[str], s2: list[str]) -> np.ndarray:
        """Each pair's padded length in a batch: both sentences go through one forward pass,
        so the longer one's token count (a model must be built first, for its tokenizer)."""
        tok = self._tokenizer()
        a = np.array([len(x) for x in tok(list(s1), truncation=True, max_length=self.max_length)["input_ids"]])
        b = np.array([len(x) for x in tok(list(s2), truncation=True, max_length=self.max_length)["input_ids"]])
        return np.maximum(a, b)

    def _tokenizer(self):
        if self._st is not None:
            return self._st.tokenizer
        from transformers import AutoTokenizer

        from augsbert_ray.models import resolve_model, trust_remote_code

        return AutoTokenizer.from_pretrained(resolve_model(self.model), trust_remote_code=trust_remote_code())

    def predict(self, module, s1, s2, batch_size: int = 64) -> np.ndarray:
        """Cosine similarity per pair, in eval mode (the module's mode is restored)."""
        from augsbert_ray.evaluation import cosine_scores

        with _eval_mode(module):
            return cosine_scores(unwrap(module).st, s1, s2, batch_size)


# Gold pairs' objective in score distillation, by name: silver pairs are fitted to the teacher's score.
DISTILLED = {"cosent-distill": cosent_loss, "angle-distill": angle_loss}
OBJECTIVES = {"cosine": cosine_similarity_loss, "cosent": cosent_loss, "angle": angle_loss,
              "softmax": softmax_pair_loss, "contrastive": contrastive_loss,
              **{name: score_distillation_loss for name in DISTILLED}}


@dataclass
class CrossEncoderRecipe:
    """A transformer with one sigmoid output over the concatenated pair."""

    model: str
    max_length: int = 128
    _tokenizer: Any = field(default=None, repr=False)

    def build(self, device: str) -> torch.nn.Module:
        module, self._tokenizer = load_cross_encoder(self.model, device=device)
        return module

    def loss(self, module, s1, s2, labels, silver=None):  # the teacher trains on gold alone
        return self.features_loss(module, self._encode(s1, s2).to(labels.device), labels)

    def _encode(self, s1, s2):
        return self._tokenizer(list(s1), list(s2), truncation=True, max_length=self.max_length, padding=True,
                               return_tensors="pt")

    def pretokenize(self, s1: list[str], s2: list[str]) -> TokenRows:
        """Every pair tokenised once, as ``loss`` tokenises them (row ``i`` is pair ``i``)."""
        chunks = [dict(self._encode(s1[i:i + PRETOKENIZE_CHUNK], s2[i:i + PRETOKENIZE_CHUNK]))  # tensors alone
                  for i in range(0, len(s1), PRETOKENIZE_CHUNK)]
        tok = self._tokenizer
        return TokenRows.from_padded(chunks, tok.pad_token_id, tok.pad_token_type_id, tok.padding_side == "left")

    @staticmethod
    def batch_rows(idx: np.ndarray, n: int) -> np.ndarray:
        return idx

    def features_loss(self, module, features: dict, labels, silver=None):
        """The loss of a batch given as tokenised features."""
        return cross_encoder_loss(module(**features).logits, labels)

    def save(self, module, out_dir: str) -> None:
        with _no_save_bars():
            unwrap(module).save_pretrained(out_dir, safe_serialization=True)
            self._tokenizer.save_pretrained(out_dir)
            as_sentence_transformers_cross_encoder(out_dir, self.max_length)

    def lengths(self, s1: list[str], s2: list[str]) -> np.ndarray:
        """Each pair's token count as the model reads it (the model must be built first)."""
        enc = self._tokenizer(list(s1), list(s2), truncation=True, max_length=self.max_length)
        return np.array([len(x) for x in enc["input_ids"]])

    def predict(self, module, s1, s2, batch_size: int = 64) -> np.ndarray:
        """The sigmoid score per pair, in eval mode (the module's mode is restored)."""
        from augsbert_ray.labeling import score_pairs

        model = unwrap(module)
        with _eval_mode(model):
            return score_pairs(model, self._tokenizer, list(s1), list(s2), micro_batch_size=batch_size,
                               max_length=self.max_length, device=str(next(model.parameters()).device))


def st_features(model, texts: list[str]) -> dict:
    """A sentence-transformers model's features for ``texts``. Newer releases name this
    ``preprocess`` and log a deprecation warning for ``tokenize``, which calls it; older ones
    have ``tokenize`` only."""
    preprocess = getattr(model, "preprocess", None)
    return preprocess(texts) if preprocess is not None else model.tokenize(texts)


def as_sentence_transformers_cross_encoder(model_dir: str, max_length: int) -> None:
    """Adds sentence-transformers' files to a saved one-logit cross-encoder, as its ``CrossEncoder.save``
    writes them, so that ``CrossEncoder(model_dir)`` reads pairs as the job's scorer does: the
    sigmoid of the logit, at most ``max_length`` tokens a pair. Its card is left to the stage."""
    from sentence_transformers import CrossEncoder

    from augsbert_ray.models import trust_remote_code

    model = CrossEncoder(model_dir, device="cpu", max_length=max_length, activation_fn=torch.nn.Sigmoid(),
                         local_files_only=True, trust_remote_code=trust_remote_code(),
                         model_kwargs={"use_safetensors": True})
    model.save(model_dir, create_model_card=False, safe_serialization=True)


RECIPES = {"bi_encoder": BiEncoderRecipe, "cross_encoder": CrossEncoderRecipe}


def make_recipe(kind: str, **kwargs) -> Recipe:
    """Builds a recipe by name; unknown names list the valid ones."""
    try:
        cls = RECIPES[kind]
    except KeyError:
        raise ValueError(f"unknown recipe '{kind}'; valid: {', '.join(sorted(RECIPES))}") from None
    return cls(**kwargs)

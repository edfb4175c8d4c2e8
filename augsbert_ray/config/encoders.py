"""The two encoders' recipes: the cross-encoder teacher and the bi-encoder student."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from augsbert_ray.config.fields import Section, Seed, later_setting, model_name


TRAIN_DOC = (
    "true: fine-tune cross_encoder.model on the gold training pairs (the paper's step 1). false: label with "
    "cross_encoder.model as it is (a ready reranker: a hub id, a folder, an earlier job's "
    "runs/NAME/models/cross-encoder); it must have a trained one-output classification head (the embedded "
    "MiniLM has none). It is still scored on dev and test, and the teacher check and the shipping decision are "
    "made as usual; epochs, lr, batch_size and warmup_ratio are then unused")


class CrossEncoderConfig(Section):
    """Step 1: the teacher. Sigmoid output in [0, 1], binary cross-entropy on gold labels."""

    model: str = model_name(description="embedded, a Hugging Face id, or a local path")
    train: bool = later_setting(True, description=TRAIN_DOC)
    epochs: int = Field(4, gt=0, description="passes over the gold training pairs")
    lr: float = Field(2e-5, gt=0, description="peak learning rate (AdamW)")
    batch_size: int = Field(16, gt=0, description="pairs per optimizer step (the global batch)")
    warmup_ratio: float = Field(0.1, ge=0, lt=1, description="share of the steps with a linear learning-rate warmup")
    max_length: int = Field(128, gt=8, description="token limit of a pair")


Objective = Literal["auto", "cosine", "cosent", "angle", "cosent-distill", "angle-distill", "softmax", "contrastive"]
# Objectives that rank pairs by their similarity scores: regression only.
REGRESSION_OBJECTIVES = ("cosent", "angle", "cosent-distill", "angle-distill")
OBJECTIVE_DOC = (
    "The student's loss. cosine: MSE between the cosine and the score (SBERT; auto's choice for "
    "regression). cosent / angle: the batch's pairs ranked by cosine (CoSENT, Su 2022) or by AnglE's "
    "angle in complex space (Li & Li 2023) as their scores rank them, scale 20. cosent-distill / "
    "angle-distill: score distillation, the gold pairs ranked as in cosent / angle and each silver "
    "pair's cosine fitted to the teacher's score (MSE); on gold alone the same as cosent / angle. "
    "softmax: a classifier over (u, v, |u-v|) (auto's choice for binary tasks); contrastive: "
    "contrastive loss on cosine distance. The ranking and distillation objectives are for regression.")


Curriculum = Literal["mixed", "silver-first"]
CURRICULUM_DOC = (
    "How AugSBERT's student meets gold and silver. mixed: one training on gold + silver shuffled together "
    "(the paper's). silver-first: a training on the silver pairs alone, then one on the gold pairs (each "
    "gold_repeat times) from its weights, each with its own warmup and decay, as many steps in all; the "
    "student ends on the labels it can trust. Only AugSBERT with gold + silver reads it: the gold-only "
    "reference and the pilots train as before (benchmarks/results/student_curriculum_*.md compares the two)")


class BiEncoderConfig(Section):
    """Step 3: the student. Mean pooling, trained on (gold + silver) scores."""

    model: str = model_name(description="embedded, a Hugging Face id, or a local path")
    epochs: int = Field(1, gt=0, description="passes over the training pairs")
    lr: float = Field(2e-5, gt=0, description="peak learning rate (AdamW)")
    batch_size: int = Field(16, gt=0, description="pairs per optimizer step (the global batch)")
    warmup_ratio: float = Field(0.1, ge=0, lt=1, description="share of the steps with a linear learning-rate warmup")
    max_length: int = Field(128, gt=8, description="token limit of a sentence")
    num_layers: int | None = Field(None, gt=0, description="keep only the first N transformer layers of the initial "
                                                           "model (a smaller, faster student); null keeps them all")
    objective: Objective = Field("auto", description=OBJECTIVE_DOC)
    seed: Seed | None = Field(
        None, description="seed of the bi-encoders' initialisation and data order; null: the job's seed. A seed "
                          "sweep over this key reuses the cross-encoder and (except semantic search) the candidates")
    gold_repeat: int = Field(
        1, gt=0, description="how many times each gold pair appears in AugSBERT's training set (gold + silver; its "
                             "pilot's too): repeating the gold keeps the labels the student can trust from being "
                             "drowned out by far more silver pairs. The gold-only reference counts each gold pair as "
                             "often (a change retrains it too), so the two students see gold equally often and "
                             "AugSBERT's gain is the silver's, not extra passes over gold; across domains without "
                             "target.mix_source_gold AugSBERT sees no gold and the reference counts it once "
                             "(benchmarks/results/student_recipe_stsb1k.md compares values)")
    curriculum: Curriculum = later_setting("mixed", description=CURRICULUM_DOC)

    def resolved_objective(self, task: str) -> str:
        return resolved_objective(self.objective, task)


def resolved_objective(objective: str, task: str) -> str:
    """The bi-encoder's objective: ``objective`` unless auto, which is cosine for regression
    and softmax over (u, v, |u-v|) for binary tasks (SBERT)."""
    if objective != "auto":
        return objective
    return "softmax" if task == "binary" else "cosine"

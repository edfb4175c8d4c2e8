"""How results are judged and chosen: evaluation, the pilots, and the autopilot."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt, model_validator

from augsbert_ray.config.encoders import Objective
from augsbert_ray.config.fields import Section, placement
from augsbert_ray.config.sampling import Strategy


class EvaluationConfig(Section):
    """Scoring on dev and test, the teacher check, the pilots, and which student ships."""

    batch_size: int = placement(64, gt=0, description="sentences or pairs per forward pass when scoring")
    teacher_check: Literal["warn", "stop"] = Field(
        "warn", description="before labelling, compare the cross-encoder with the gold-only bi-encoder on dev: "
                            "warn or stop when the teacher is not better, since its labels then rarely help")
    pilot: bool = Field(
        False, description="after labelling, a pilot that predicts whether the silver labels help: the student "
                           "trained for pilot_fraction of its steps on gold alone and on gold + silver, both scored "
                           "on dev (two short Ray Tune trials); the autopilot always runs pilots")
    pilot_fraction: float = Field(0.2, gt=0, le=1, description="of the student's training steps")
    pilot_confidence: float = Field(
        0.9, gt=0, lt=1, description="the pilots predict helps (or does not help) only when this share of the paired "
                                     "bootstrap's samples of the gain on dev lies above (or below) 0: a smaller lead "
                                     "is within what dev's size can tell apart, and the pilot makes no prediction")
    pilot_folds: int = Field(
        0, ge=0, description="0: the pilots are scored on dev. k >= 2: on the gold training pairs instead, k-fold "
                             "(each fold's pilots train on the other folds' gold and the silver pairs none of the "
                             "fold's sentences are in), for a small dev set beside a larger training set. The "
                             "teacher saw every fold, so the silver pilots learn a little of the held-out folds "
                             "through its labels; not for domain adaptation (it has no target gold)")
    shipping: Literal["better", "augsbert"] = Field(
        "better", description="which bi-encoder the job ships as models/bi-encoder: the better of AugSBERT and "
                              "gold-only by their dev score (better; the report says which, with both scores), or "
                              "AugSBERT whatever its score (augsbert)")


class AutoConfig(Section):
    """The autopilot: the teacher recipe, the sampling strategy, the amount of silver and the
    label calibration chosen on dev by short student pilots (AugSBERT's seed-search idea applied
    to the job's other choices), then the chosen setting trained to the end.

    Every candidate setting shares what it can with the others through the stages'
    fingerprints: one teacher per recipe, the candidates once per strategy and amount, the
    labels once per teacher and candidates.
    """

    enabled: bool = Field(False, description="choose the settings below by pilots before training")
    budget_minutes: float = Field(
        60, gt=0, description="wall time for trying settings (their teachers, labels and pilots); settings not tried "
                              "by then are reported as such. The final training of the chosen setting is not counted")
    teacher_recipes: list[tuple[PositiveInt, float]] = Field([(4, 2e-5), (8, 5e-5)],
                                                             description="(epochs, learning rate) of each "
                                                                         "cross-encoder recipe tried")
    strategies: list[Strategy] = Field(["bm25", "bm25+ss"], description="sampling strategies tried")
    top_k: list[PositiveInt] = Field([3, 10], description="neighbours per sentence tried (bm25, ss, bm25+ss, bm25-kde)")
    calibration: list[Literal["none", "isotonic"]] = Field(["none", "isotonic"],
                                                           description="label calibrations tried")
    gold_repeat: list[PositiveInt] | None = Field(
        None, description="bi_encoder.gold_repeat values tried with every setting above (pilots only: the teachers, "
                          "candidates and labels are shared, and the gold-only pilot is the same); null: the job's own")
    objective: list[Objective] | None = Field(
        None, description="bi_encoder.objective values tried with every setting (pilots only; semantic search "
                          "embeds with the job's own gold-only student, and the gold-only pilot trains with the "
                          "job's own objective); null: the job's own")
    pilot_fraction: float = Field(0.2, gt=0, le=1, description="of the student's training steps")
    keep_job_setting: bool = Field(
        True, description="the job's own setting is tried first, and another replaces it only when that one's pilot "
                          "beats it on dev beyond what dev can tell apart (the paired bootstrap at "
                          "evaluation.pilot_confidence). false: the best pilot wins, however small its lead, and "
                          "the job's own setting is tried only if in the grid")

    @model_validator(mode="after")
    def _check(self) -> "AutoConfig":
        for name in ("teacher_recipes", "strategies", "top_k", "calibration"):
            if not getattr(self, name):
                raise ValueError(f"{name}: give at least one to try")
        if self.gold_repeat is not None and not self.gold_repeat:
            raise ValueError("gold_repeat: give at least one to try, or null for the job's own")
        if self.objective is not None and not self.objective:
            raise ValueError("objective: give at least one to try, or null for the job's own")
        for epochs, lr in self.teacher_recipes:
            if not lr > 0:
                raise ValueError(f"teacher_recipes: the learning rate of ({epochs}, {lr}) must be above 0")
        return self

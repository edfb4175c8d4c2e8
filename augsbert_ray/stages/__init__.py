"""The stages of an AugSBERT job, one module each (see ``base`` for what a stage is: its
params, its inputs and outputs, ``run`` and its typed result).

- ``gold``: gold pairs, and a domain-adaptation job's target sets (loaded before Ray starts)
- ``teacher``: step 1, the cross-encoder on gold
- ``student``: bi-encoders: ``GoldOnly`` (the reference), ``TargetGold`` (the target upper
  bound) and ``AugSBERT`` (step 3)
- ``candidates``: step 2.1, unlabelled pairs from a registry of sources
- ``silver``: step 2.2, the teacher's labels
- ``evaluate``: one model's scores on the evaluation sets, and the teacher check
- ``pilot``: short student trainings that predict whether silver labels help
- ``ship``: which bi-encoder the job ships (never a regression against gold only, by dev)
- ``auto``: the autopilot, which picks the teacher recipe, strategy, amount and calibration
"""

from augsbert_ray.stages.auto import AutoPilot
from augsbert_ray.stages.base import (Declaration, Inputs, Stage, StageParams, StageResult, SummaryContext,
                                      UndeclaredSetting, stage_class)
from augsbert_ray.stages.candidates import SOURCES, Candidates, source_of
from augsbert_ray.stages.evaluate import Evaluate, TeacherCheck
from augsbert_ray.stages.gold import Gold, TargetSets
from augsbert_ray.stages.pilot import Pilot
from augsbert_ray.stages.ship import Ship
from augsbert_ray.stages.silver import Calibrate, Silver
from augsbert_ray.stages.student import AugSBERT, GoldOnly, TargetGold
from augsbert_ray.stages.teacher import Teacher

__all__ = ["AugSBERT", "AutoPilot", "Calibrate", "Candidates", "Declaration", "Evaluate", "Gold", "GoldOnly", "Inputs",
           "Pilot", "SOURCES", "Ship", "Silver", "Stage", "StageParams", "StageResult", "SummaryContext",
           "TargetGold", "TargetSets", "Teacher", "TeacherCheck", "UndeclaredSetting", "result_type_of", "source_of"]


def result_type_of(stage: str) -> type[StageResult] | None:
    """The result type of the job's stage named ``stage`` (None for a name no stage has): how
    a stored result is read back (``metrics.RunMetrics.load``). Every stage class registers
    itself by its name when defined (``base.stage_class``); the imports above define them all."""
    cls = stage_class(stage)
    return None if cls is None else cls.result_type

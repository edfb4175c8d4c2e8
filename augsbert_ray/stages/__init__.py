"""The stages of an AugSBERT job, one module each (see ``base`` for what a stage is).

- ``gold``: gold pairs, and a domain-adaptation job's target sets (loaded before Ray starts)
- ``teacher``: step 1, the cross-encoder on gold
- ``student``: bi-encoders: gold only (the reference), the target upper bound, and step 3
- ``candidates``: step 2.1, unlabelled pairs from a registry of sources
- ``silver``: step 2.2, the teacher's labels
- ``evaluate``: one model's scores on the evaluation sets, and the teacher check
- ``pilot``: short student trainings that predict whether silver labels help
- ``ship``: which bi-encoder the job ships (never a regression against gold only, by dev)
- ``auto``: the autopilot, which picks the teacher recipe, strategy, amount and calibration
"""

from augsbert_ray.stages.auto import AutoPilot
from augsbert_ray.stages.base import Declaration, Inputs, Settings, Stage, UndeclaredSetting
from augsbert_ray.stages.candidates import SOURCES, Candidates, source_of
from augsbert_ray.stages.evaluate import Evaluate, TeacherCheck
from augsbert_ray.stages.gold import Gold, TargetSets
from augsbert_ray.stages.pilot import Pilot
from augsbert_ray.stages.ship import Ship
from augsbert_ray.stages.silver import Calibrate, Silver
from augsbert_ray.stages.student import Student
from augsbert_ray.stages.teacher import Teacher

__all__ = ["AutoPilot", "Calibrate", "Candidates", "Declaration", "Evaluate", "Gold", "Inputs", "Pilot", "SOURCES",
           "Settings", "Ship", "Silver", "Stage", "Student", "TargetSets", "Teacher", "TeacherCheck",
           "UndeclaredSetting", "source_of"]

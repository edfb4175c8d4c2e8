"""The stages of an AugSBERT job, one module each (see ``base`` for what a stage is).

- ``gold``: gold pairs, and a domain-adaptation job's target sets (loaded before Ray starts)
- ``teacher``: step 1, the cross-encoder on gold
- ``student``: bi-encoders: gold only (the reference), the target upper bound, and step 3
- ``candidates``: step 2.1, unlabelled pairs from a registry of sources
- ``silver``: step 2.2, the teacher's labels
- ``evaluate``: one model's scores on the evaluation sets, and the teacher check
"""

from augsbert_ray.stages.base import Declaration, Inputs, Settings, Stage, UndeclaredSetting
from augsbert_ray.stages.candidates import SOURCES, Candidates, source_of
from augsbert_ray.stages.evaluate import Evaluate, TeacherCheck
from augsbert_ray.stages.gold import Gold, TargetSets
from augsbert_ray.stages.silver import Silver
from augsbert_ray.stages.student import Student
from augsbert_ray.stages.teacher import Teacher

__all__ = ["Candidates", "Declaration", "Evaluate", "Gold", "Inputs", "SOURCES", "Settings", "Silver", "Stage",
           "Student", "TargetSets", "Teacher", "TeacherCheck", "UndeclaredSetting", "source_of"]

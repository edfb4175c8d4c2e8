"""Step 2.2: the cross-encoder labels candidate pairs ("silver" labels).

``scoring.score_pairs`` is the pure core (model in, scores out). The package around it:

- ``codec``: pairs tokenised ahead of the actors, as Arrow token columns;
- ``scorer``: ``PairScorer``, the Ray Data callable that loads the model once per actor, and
  ``ScorerSpec``, the actors' class and arguments a caller may pass instead;
- ``shards``: candidates cut into shards, and their digests;
- ``store``: the ``ShardStore`` that commits each labelled shard once, in a folder or on a storage
  URI (``s3://``, ...);
- ``sizing``: the pool's size and each actor's CPUs (pure);
- ``pool``: one actor pool over the pending shards (the Ray edge);
- ``commit``: each shard of a candidates file checked and committed by the actor that labels it;
- ``hosts``: the same shards on the job's warm hosts, for small sets within a job;
- ``driver``: ``label_candidates`` and friends, with resume and pool retries.
"""

from augsbert_ray.labeling.codec import tokenize_batch
from augsbert_ray.labeling.driver import (LabelingReport, label_candidates, label_candidates_file, label_file,
                                          label_shards)
from augsbert_ray.labeling.scorer import TRACE_ENV, PairScorer, ScorerSpec
from augsbert_ray.labeling.shards import exact_shards
from augsbert_ray.labeling.store import ShardStore
from augsbert_ray.labeling.sizing import (TOKENIZE_CPUS, actor_cpus, labelling_requests, pool_size,
                                          separate_tokenizer)
from augsbert_ray.scoring import score_pairs

__all__ = ["score_pairs", "label_candidates", "label_candidates_file", "label_file", "label_shards", "ShardStore", "LabelingReport",
           "PairScorer", "ScorerSpec", "TRACE_ENV", "TOKENIZE_CPUS", "actor_cpus", "exact_shards", "labelling_requests",
           "pool_size", "separate_tokenizer", "tokenize_batch"]

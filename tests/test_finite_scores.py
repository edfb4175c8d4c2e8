"""A shard whose scores are not all finite numbers is refused before it is committed, in the
check that both the silver stage and ``augsbert label`` run on every shard."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from augsbert_ray import schema
from augsbert_ray.errors import LabelingError
from augsbert_ray.labeling.pool import checked_shard
from augsbert_ray.labeling.shards import SHARD, pairs_digest


def _labelled(scores) -> pa.Table:
    n = len(scores)
    return pa.table({schema.ID1: pa.array(range(n), pa.int64()), schema.ID2: pa.array(range(1, n + 1), pa.int64()),
                     schema.SENTENCE1: [f"a {i}" for i in range(n)], schema.SENTENCE2: [f"b {i}" for i in range(n)],
                     schema.ORIGIN: ["bm25"] * n, schema.RETRIEVAL_SCORE: pa.array([np.nan] * n, pa.float32()),
                     schema.LABEL: pa.array(scores, pa.float32()), SHARD: pa.array([3] * n, pa.int64())})


def test_finite_scores_pass_and_nan_or_infinite_ones_name_the_shard_and_the_pair():
    good = _labelled([0.1, 0.9, 0.5])
    digest = pairs_digest(good.drop_columns([SHARD]))
    assert checked_shard(3, good, digest).column(schema.LABEL).to_pylist() == pytest.approx([0.1, 0.9, 0.5])
    for bad in (np.nan, np.inf, -np.inf):
        with pytest.raises(LabelingError, match=r"shard 3: .* 1 of 3 pairs .*ids \(1, 2\).*nothing of the shard is committed"):
            checked_shard(3, _labelled([0.1, bad, 0.5]), digest)

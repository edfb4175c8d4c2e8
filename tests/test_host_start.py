"""benchmarks/host_start.py: reading ``python -X importtime``'s report into the table's figures."""

from __future__ import annotations

import pytest
from conftest import load_benchmark

# A report as CPython writes it: children before their parent, indented by depth (microseconds).
REPORT = """import time: self [us] | cumulative | imported package
import time:       100 |     300000 |   numpy
import time:       500 |     900000 | torch
import time:       200 |     400000 | transformers
import time:       100 |    1500000 | transformers.modeling_utils
import time:       300 |     800000 |         sklearn
import time:       100 |     850000 |       sklearn.metrics
import time:       700 |    1200000 | sentence_transformers
import time:        50 |     350000 | ray.train.torch
"""


def test_each_layer_is_its_top_level_line_and_inner_packages_where_they_load():
    host_start = load_benchmark("host_start")
    got = host_start.parse_importtime(REPORT)
    assert got["torch"] == pytest.approx(0.9)
    assert got["transformers.modeling_utils"] == pytest.approx(1.5)
    assert got["sklearn"] == pytest.approx(0.8)
    assert got["pandas"] is None  # not in the report
    assert got["total_s"] == pytest.approx(0.9 + 0.4 + 1.5 + 1.2 + 0.35)

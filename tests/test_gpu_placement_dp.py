"""GPU placement without a GPU, two GPUs: the gold-only student trained by two data-parallel
Ray Train workers holding a GPU each, on a local Ray that declares two GPUs while the models run
on the CPU (``gpus_on_cpu``); its weights must equal those of two CPU workers. The job's time
limit, the GPU reservations and the rest as in test_gpu_placement.py."""

from __future__ import annotations

import numpy as np
import pytest
from gpus_on_cpu import TRAIN_WORKERS, ray_with_gpus, run_watched, write_job

pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]


@pytest.fixture(scope="module")
def two_gpus(tmp_path_factory, _tiny_model_master):
    """The gold-only student by two data-parallel workers on two GPUs, then on two CPU workers."""
    import augsbert_ray

    root = tmp_path_factory.mktemp("two-gpus")
    path = write_job(root, str(_tiny_model_master))
    runs = {}
    with ray_with_gpus(2):
        for name, extra in (("gpu", ["training.use_gpu=true"]), ("cpu", [])):
            runs[name] = (*run_watched(augsbert_ray.load_job(path, [f"run_dir={root}/{name}", "training.num_workers=2",
                                                                    *extra]),
                                       timeout_s=180, verbose=False, until="gold_only"), root / name)
    return runs


def test_two_gpus_data_parallel_holds_both_and_trains_the_cpu_model(two_gpus):
    from safetensors.numpy import load_file

    gpu, seen, gpu_dir = two_gpus["gpu"]
    cpu, cpu_seen, cpu_dir = two_gpus["cpu"]
    seen.check()
    cpu_seen.check()
    assert max(seen.held) == 2 and max(cpu_seen.held) == 0  # a GPU per worker, both at once
    assert seen.actors & TRAIN_WORKERS, seen.actors
    assert gpu.result("gold_only").train["precision"] == cpu.result("gold_only").train["precision"]
    weights = [load_file(next(d.glob("stages/gold_only/*/model/model.safetensors"))) for d in (gpu_dir, cpu_dir)]
    assert weights[0].keys() == weights[1].keys()
    for key in weights[0]:
        np.testing.assert_array_equal(weights[0][key], weights[1][key], err_msg=key)

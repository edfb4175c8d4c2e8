"""GPU placement without a GPU: the tiny job on a local Ray that declares GPUs (Ray schedules
them as numbers), its models run on the CPU (``gpus_on_cpu``), through every path that places
work on a GPU, each compared with the same job run without GPUs.

- one GPU: the trainings on the warm hosts, each holding the GPU; the teacher's seed search on
  Ray Tune with two trials at once on the one GPU (half each); evaluation and sampling on the
  hosts; the silver set in a Ray Data pool of a GPU actor fed by a CPU tokenising task.
- two GPUs: the students trained by two data-parallel workers of Ray Train, a GPU each.

Each job must end within its time limit (a stall fails it, naming what Ray held), never hold
more GPUs than the cluster has (sampled from Ray's state while it runs: the GPUs taken and
those in placement groups), hold the GPU where it should, and give the scores (or the weights)
of the run without GPUs.
"""

from __future__ import annotations

import numpy as np
import pytest
from gpus_on_cpu import ray_with_gpus, run_watched

pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]

MODELS = ("zero_shot", "gold_only", "cross_encoder", "augsbert")
TRAIN_WORKERS = {"RayTrainWorker"}  # the actor class of a Ray Train worker group's workers
# The job's seed, and the teacher's seed search over it and another: on this data the job's seed
# wins, so the run without GPUs (and without the search) trains the same teacher.
SEED, SEARCHED = 43, "[42, 43]"


def write_job(root, model: str) -> str:
    import yaml
    from conftest import write_stsb

    data = {s: {"format": "stsb", "path": str(write_stsb(root / f"sts-{s}.csv", n, seed))}
            for s, n, seed in [("train", 48, 1), ("dev", 24, 2), ("test", 24, 3)]}
    job = {"name": "tiny-gpus", "data": data, "seed": SEED,
           "cross_encoder": {"model": model, "epochs": 1, "batch_size": 8, "lr": 1e-4},
           "bi_encoder": {"model": model, "epochs": 1, "batch_size": 8, "lr": 1e-4},
           "sampling": {"strategy": "bm25", "top_k": 2, "query_batch_size": 16},
           "labeling": {"block_size": 32, "micro_batch_size": 8},
           "evaluation": {"batch_size": 16},
           "training": {"cpus_per_worker": 1}}  # CPUs enough for two trainings at once: the GPUs decide
    path = root / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return str(path)


def job_log(run_dir) -> str:
    return (run_dir / "logs" / "job.log").read_text()


def printed(metrics, models=MODELS) -> dict:
    """The scores as the summary prints them (two decimals)."""
    return {(m, s): f"{metrics.score(m, s):.2f}" for m in models for s in ("dev", "test")}


@pytest.fixture(scope="module")
def one_gpu(tmp_path_factory, _tiny_model_master):
    """The job with a GPU (every placement path of one GPU), then without (the reference)."""
    import augsbert_ray

    root = tmp_path_factory.mktemp("one-gpu")
    path = write_job(root, str(_tiny_model_master))
    with ray_with_gpus(1):
        gpu, gpu_seen = run_watched(augsbert_ray.load_job(path, [
            f"run_dir={root}/gpu", "training.use_gpu=true", "labeling.num_gpus=1", "labeling.executor=pool",
            "seed_search.enabled=true", "seed_search.targets=[cross_encoder]", f"seed_search.seeds={SEARCHED}",
            "seed_search.gpus_per_trial=0.5"]), timeout_s=240, verbose=False)
        # Without GPUs, the teacher trained with the job's seed (the search's choice: a chosen seed resumes
        # from its checkpoint, as a plain training of it would run on) and the silver set labelled on
        # the hosts (the pool's labels are the hosts').
        cpu, cpu_seen = run_watched(augsbert_ray.load_job(path, [f"run_dir={root}/cpu"]), timeout_s=180,
                                    verbose=False)
    return {"gpu": (gpu, gpu_seen, root / "gpu"), "cpu": (cpu, cpu_seen, root / "cpu")}


def test_one_gpu_every_path_holds_the_gpu_and_never_more(one_gpu):
    gpu, seen, run_dir = one_gpu["gpu"]
    seen.check()
    assert max(seen.held) == 1  # the GPU was held: the work asked for it
    # two seed-search trials on the one GPU at once, half each, in their placement groups
    assert 1.0 in seen.in_groups
    silver = gpu.result("silver")
    assert silver.actors == 1 and silver.cpus_per_actor == 1  # one GPU actor, the other CPU tokenises
    stages = {s.name: s for s in gpu.stages}
    assert gpu.complete and not gpu.stages_reused and set(stages) >= {"cross_encoder", "silver", "augsbert"}
    assert "sampling over 69 sentences on a warm host" in job_log(run_dir)  # as the evaluations, on the hosts
    assert "_Host" in seen.actors and not seen.actors & TRAIN_WORKERS, seen.actors  # trained on the hosts
    _, cpu_seen, _ = one_gpu["cpu"]
    cpu_seen.check()
    assert max(cpu_seen.held) == 0


def test_one_gpu_gives_the_cpu_runs_scores(one_gpu):
    gpu, cpu = one_gpu["gpu"][0], one_gpu["cpu"][0]
    assert gpu.result("cross_encoder").seed_search["chosen_seed"] == SEED, "the data or the search changed: " \
        "pick SEED and SEARCHED again so that the job's seed wins"
    assert printed(gpu) == printed(cpu)
    assert gpu.result("silver").silver == cpu.result("silver").silver


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

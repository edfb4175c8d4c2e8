"""GPU placement without a GPU: the tiny job on a local Ray that declares one GPU (Ray schedules
GPUs as numbers), its models run on the CPU (``gpus_on_cpu``), through every path that places
work on a GPU there, compared with the same job run without GPUs: the trainings on the warm
hosts, each holding the GPU; the teacher's seed search on Ray Tune with two trials at once on
the one GPU (half each); evaluation and sampling on the hosts; the silver set in a Ray Data pool
of a GPU actor fed by a CPU tokenising task. (Two GPUs: test_gpu_placement_dp.py.)

Each job must end within its time limit (a stall fails it, naming what Ray held), never hold
more GPUs than the cluster has (sampled from Ray's state while it runs: the GPUs taken and
those in placement groups), hold the GPU where it should, and give the scores (or the weights)
of the run without GPUs.
"""

from __future__ import annotations

import pytest
from gpus_on_cpu import TRAIN_WORKERS, ray_with_gpus, run_watched, write_job

pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]

MODELS = ("zero_shot", "gold_only", "cross_encoder", "augsbert")
# The job's seed, and the teacher's seed search over it and another: on this data the job's seed
# wins, so the run without GPUs (and without the search) trains the same teacher.
SEED, SEARCHED = 43, "[42, 43]"


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
    path = write_job(root, str(_tiny_model_master), seed=SEED)
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
    assert [0.5, 0.5] in seen.groups, seen.groups
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

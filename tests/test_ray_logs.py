"""Ray's own output: off the terminal, kept in the run directory, and what matters translated."""

from __future__ import annotations

import os
import sys

from augsbert_ray.progress.ray_logs import RayOutput, engine_line, translate

# Lines as Ray 2.60 printed them in a run (shortened where long).
WORKER_DIED = (
    "\x1b[33m(raylet)\x1b[0m A worker died or was killed while executing a task by an unexpected system error. To "
    "troubleshoot the problem, check the logs for the dead worker. Lease ID: 01000000e1 Worker ID: 45f02c Node ID: "
    "7e5e64 Worker IP address: 192.0.2.2 Worker port: 36305 Worker PID: 12452 Worker exit type: SYSTEM_ERROR Worker "
    "exit detail: Worker unexpectedly exits with a connection error code 2. End of file. Some common causes include: "
    "(1) the process was killed by the OOM killer due to high memory usage")
TASK_RETRIED = ("(raylet) Task MapWorker(MapBatches(PairScorer)).submit failed. There are 2 retries remaining, so the "
                "task will be retried. Error: The actor is temporarily unavailable: RpcError: Socket closed")
OOM = "(raylet) 2 worker(s) were killed due to the node running low on memory. Memory on the node was 15.2GB / 16GB."
SPILLED = "(raylet) Spilled 2048 MiB, 17 objects, write throughput 512 MiB/s. Set RAY_verbose_spill_logs=0 to disable."
ACTOR_INIT = ("2026-11-25 20:11:06,345 WARNING actor_pool_map_operator.py:421 -- MapBatches(PairScorer): an actor died "
              "during initialization and will be replaced (1 consecutive death(s) so far)")
NOISE = [
    "2026-11-25 20:08:18,357\tINFO logging_progress.py:227 -- Active & requested resources: 0/0 CPU, 0.0B/0.0B "
    "object store (pending: 1 CPU)",
    "[2026-11-25 20:08:17,992 E 7644 7644] core_worker.cc:2465: Actor with class name: 'MapWorker(MapBatches(Scorer))' "
    "and ID: '3581cc' has constructor arguments in the object store and max_restarts > 0.",
    "\x1b[36m(RayTrainWorker pid=8763)\x1b[0m Checkpoint successfully created at: Checkpoint(filesystem=local, "
    "path=/x)",
    "(PlacementGroupCleaner pid=8730) ConnectionError: Found multiple active Ray instances: {'a:1', 'b:2'}.",
]


def test_notices_that_matter_become_one_engine_line_each():
    assert translate(WORKER_DIED)[1] == (
        "[ray] a worker process died (pid 12452, SYSTEM_ERROR: Worker unexpectedly exits with a connection error code "
        "2); Ray retries its work where it can")
    assert translate(TASK_RETRIED)[1] == "[ray] task MapBatches(PairScorer) failed and is retried (2 retries left)"
    assert translate(OOM)[1] == ("[ray] 2 worker(s) were killed because the node ran low on memory; Ray retries "
                                 "their work")
    assert translate(SPILLED)[1] == "[ray] the object store is full: 2048 MiB (17 objects) spilled to disk so far"
    assert translate(ACTOR_INIT)[1] == "[ray] MapBatches(PairScorer): an actor died while starting and is replaced"
    assert all(translate(line) is None and engine_line(line) is None for line in NOISE)


def test_engine_lines_from_workers_lose_rays_prefix():
    line = ("(MapWorker(MapBatches(PairScorer)) pid=8401, ip=10.0.0.2) [silver] labelling actor on cpu: bf16, "
            "2 threads [repeated 2x across cluster]")
    assert engine_line(line) == "[silver] labelling actor on cpu: bf16, 2 threads"
    assert engine_line("\x1b[36m(RayTrainWorker pid=8763)\x1b[0m [bi-encoder-gold-only] epoch 1/4 step 12/120 loss "
                       "0.0312") == "[bi-encoder-gold-only] epoch 1/4 step 12/120 loss 0.0312"
    assert engine_line("[2026-11-25 20:08:17,992 E 7644 7644] core_worker.cc:2465: Actor ...") is None


def test_ray_output_keeps_the_process_output_in_the_file_and_follows_it(tmp_path, capfd):
    log = tmp_path / "logs" / "ray.log"
    shown: list[str] = []
    with RayOutput(log, poll_s=0.05) as out:
        out.follow(shown.append)
        os.write(2, NOISE[1].encode() + b"\n")  # what Ray's C++ core writes
        print(NOISE[0])
        print("(RayTrainWorker pid=8763) [gold_only] epoch 1/2 step 3/6 loss 0.2000", flush=True)
        sys.stderr.write(WORKER_DIED + "\n")
        sys.stderr.write(WORKER_DIED.replace("12452", "12453") + "\n")  # the same kind within a minute: held back
        out.terminal.write("the display\n")
    terminal = capfd.readouterr()
    assert terminal.out == "" and terminal.err == "the display\n"
    text = log.read_text()
    assert all(line in text for line in (NOISE[0], NOISE[1], "Worker PID: 12453"))
    assert shown == ["[gold_only] epoch 1/2 step 3/6 loss 0.2000", translate(WORKER_DIED)[1]]
    print("after")  # the process's own streams are back
    assert capfd.readouterr().out == "after\n" and "after" not in log.read_text()


def test_quiet_ray_keeps_ray_data_progress_off_the_terminal(ray_local, tmp_path, capfd):
    import numpy as np
    import pyarrow as pa

    from augsbert_ray.runtime import dataset_of_blocks, quiet_ray_output, restore_ray_output

    def double(batch: pa.Table) -> pa.Table:
        return pa.table({"x": pa.compute.multiply(batch.column("x"), 2)})

    quiet_ray_output(tmp_path / "logs")
    try:
        ds = dataset_of_blocks(pa.table({"x": np.arange(40)}), 10).map_batches(double, batch_format="pyarrow")
        assert sorted(ray_local.get(ds.to_arrow_refs())[0].column("x").to_pylist())[:2] == [0, 2]
    finally:
        restore_ray_output()
    terminal = capfd.readouterr()
    for noise in ("Running Dataset", "Active & requested resources", "Starting execution", "Queued blocks",
                  "Progress bars disabled"):
        assert noise not in terminal.out + terminal.err
    assert "execution finished" in (tmp_path / "logs" / "ray.log").read_text()


def test_a_ray_error_is_described_by_its_cause_without_terminal_colours():
    from augsbert_ray.progress.ray_logs import describe_error

    text = ("\x1b[36mray::MapWorker(MapBatches(PairScorer)).submit()\x1b[39m (pid=13075, ip=127.0.0.1, repr=x)\n"
            '  File "scoring.py", line 447, in _score_chunks\n    logits.append(model(**kwargs))\n'
            "RuntimeError: The size of tensor a (2056) must match the size of tensor b (512)\n\n"
            "The above exception was the direct cause of the following exception:\n\n"
            "\x1b[36mray::MapWorker(MapBatches(PairScorer)).submit()\x1b[39m (pid=13075)\n"
            "ray.exceptions.UserCodeException: UDF failed to process a data block.")
    assert describe_error(Exception(text)) == "RuntimeError: The size of tensor a (2056) must match the size of " \
                                              "tensor b (512)"
    assert describe_error(ValueError("\x1b[1mbad\x1b[0m value\nmore")) == "ValueError: bad value"
    assert describe_error(KeyError()) == "KeyError"

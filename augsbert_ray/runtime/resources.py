"""Fitting work to the cluster: whether requests can run at once, CPUs per worker, and the
small helpers that place a task or cut a table into blocks."""

from __future__ import annotations

from augsbert_ray.errors import AugSBERTError


def node_capacities() -> list[dict[str, float]]:
    """Each live node's total CPUs and GPUs (``{"CPU": c, "GPU": g}``)."""
    import ray

    return [{"CPU": float(n["Resources"].get("CPU", 0)), "GPU": float(n["Resources"].get("GPU", 0))}
            for n in ray.nodes() if n.get("Alive")]


def fits(requests: list[dict[str, float]], nodes: list[dict[str, float]]) -> bool:
    """Whether ``requests`` (each one task's or actor's CPUs and GPUs) can all run at once on
    ``nodes`` (first fit, largest requests first; exact for the few, similar requests here)."""
    free = [dict(n) for n in nodes]
    for req in sorted(requests, key=lambda r: (-r.get("GPU", 0), -r.get("CPU", 0))):
        for node in free:
            if all(node.get(k, 0) + 1e-9 >= v for k, v in req.items() if v):
                for k, v in req.items():
                    node[k] = node.get(k, 0) - v
                break
        else:
            return False
    return True


def require_resources(requests: list[dict[str, float]], what: str, nodes: list[dict] | None = None) -> None:
    """Fails at once, naming the settings, when ``requests`` cannot all run on the cluster.

    Ray would otherwise queue them and wait for resources that never come (a pipeline whose
    actors hold every CPU leaves none to the tasks that feed them). Checked against the
    cluster's nodes as they are now: an autoscaling cluster that would add nodes for the
    request is better served by asking for less, or starting the nodes first.

    Raises:
        AugSBERTError: naming ``what`` (the settings that size the request) and the cluster.
    """
    nodes = node_capacities() if nodes is None else nodes
    if fits(requests, nodes):
        return
    total = {k: sum(r.get(k, 0) for r in requests) for k in ("CPU", "GPU")}
    have = ", ".join(f"{n['CPU']:g} CPUs and {n['GPU']:g} GPUs" for n in nodes) or "no live node"
    raise AugSBERTError(f"{what} asks for {len(requests)} reservations, {total['CPU']:g} CPUs and {total['GPU']:g} "
                        f"GPUs in all, that cannot run at once on this cluster (nodes: {have}); Ray would wait for "
                        "ever. Ask for less (fewer actors or workers, fewer CPUs or GPUs each) or add nodes.")


def per_worker_cpus(configured: float | None, total_cpus: float, workers: int) -> float:
    """CPUs for each of ``workers`` parallel workers: as configured, else an equal share."""
    if configured is not None:
        return configured
    return max(1.0, float(int(total_cpus // max(1, workers))))


def driver_is_the_only_node() -> bool:
    """Whether the connected Ray cluster is this machine alone: one live node, the driver's.
    Work that needs no placement (scoring a model on a small evaluation set) can then run in
    the driver instead of a worker process that must import everything first."""
    import ray

    try:
        alive = [n for n in ray.nodes() if n.get("Alive")]
        return len(alive) == 1 and alive[0]["NodeID"] == ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - Ray Client, or a state call that failed: run it as a task
        return False


def remote_call(fn, *args, num_cpus: float = 1, num_gpus: float = 0, what: str | None = None, **kwargs):
    """Runs ``fn(*args, **kwargs)`` as a Ray task with the given resources and waits for it.

    ``what`` names the settings that size the task: with it, a task the cluster cannot place
    fails at once (``require_resources``) instead of waiting.
    """
    import ray

    if what is not None:
        require_resources([{"CPU": num_cpus, "GPU": num_gpus}], what)
    # Ray ends a GPU task's worker process after one call by default (max_calls=1), so every
    # GPU task would pay the imports and the CUDA start again. max_calls=0 keeps the worker;
    # the task bodies free their GPU memory when done.
    options = {"num_cpus": num_cpus, "num_gpus": num_gpus, **({"max_calls": 0} if num_gpus else {})}
    return ray.get(ray.remote(**options)(fn).remote(*args, **kwargs))


def dataset_of_blocks(table, rows_per_block: int):
    """A Ray Dataset of ``table`` cut into blocks of ``rows_per_block`` rows.

    Ray Data hands whole blocks to actors, and ``from_arrow`` makes one block of one
    table, so without this cut every actor of a pool but one would sit idle.
    """
    import ray

    blocks = [table.slice(i, rows_per_block) for i in range(0, table.num_rows, rows_per_block)] or [table]
    return ray.data.from_arrow(blocks)

"""Keeping a job to its own cluster.

A local Ray's processes listen on 127.0.0.1 only (``local_only``). A local run's workers are
pinned to their cluster (``pin_worker_to_cluster``), so another Ray on the same host can
neither confuse nor receive them; the driver's ``RAY_ADDRESS`` is set to the cluster it
joined, for the processes it starts (``pin_driver``). A ``RAY_ADDRESS`` the user set still
chooses the cluster.
"""

from __future__ import annotations

import os

from augsbert_ray.runtime import ray_private, state

# Ray's single-host mode. Ray turns an explicit _node_ip_address="127.0.0.1" into the host's
# routable address (services.resolve_ip_for_localhost), so that option cannot keep a local
# Ray off the network; with this variable at 0, Ray takes 127.0.0.1 as the node's address and
# every server binds there: the GCS, the raylet and workers (gRPC), the dashboard agent (gRPC
# and HTTP), the runtime-env agent, and the dashboard's and autoscaler's Prometheus ports.
_SINGLE_HOST_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


class local_only:
    """Context of ``ray.init`` for a local Ray: every Ray process it starts binds to 127.0.0.1.

    The processes Ray starts read the variable when they import Ray; the driver imported it
    already, so its copy of the flag is set for the duration too. Both are restored after,
    so that a later connection to a real cluster from this process is not affected. A user
    who set the variable keeps their setting.
    """

    def __enter__(self):
        self._env = os.environ.get(_SINGLE_HOST_ENV)
        self._flag = ray_private.cluster_flag()
        if self._env is None:
            os.environ[_SINGLE_HOST_ENV] = "0"
            ray_private.set_cluster_flag(False)
        return self

    def __exit__(self, *exc):
        if self._env is None:
            os.environ.pop(_SINGLE_HOST_ENV, None)
        ray_private.set_cluster_flag(self._flag)
        return False




def pin_worker_to_cluster(quiet: bool = False):
    """The Ray worker set-up hook that points ``RAY_ADDRESS`` at the worker's own cluster.

    Code in Ray's workers that looks a cluster up without an address (the State API
    client, ``ray.init`` with address "auto") reads ``RAY_ADDRESS``, then the address file of
    the last ``ray start`` (``/tmp/ray/ray_current_cluster``), then scans the host for GCS
    processes. A local Ray started in a process (``ray.init``) writes no address file, so with a
    second Ray on the host the scan finds two and fails: Ray Train's
    ``PlacementGroupCleaner`` then dies with "Found multiple active Ray instances" (and
    with a ``ray start`` cluster on the host it would watch the wrong cluster's actors).

    With ``quiet``, it also keeps Ray Train's "Reporting training result N:
    TrainingReport(...)" (one per checkpoint) off the console: Ray logs it at INFO on a
    logger named after its source file, which Ray Train's own log level does not reach.

    Returns:
        A function for ``runtime_env["worker_process_setup_hook"]``. It is made here, not
        defined at module level, so that Ray ships it by value: a worker runs it without
        importing this package (a hook that fails to import stops every worker). It never
        raises, for the same reason.
    """

    def pin() -> None:
        try:
            import logging
            import os

            import ray

            if not ray.is_initialized():  # only in a connected worker (asking would start a Ray)
                return
            os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
            if quiet:
                source = os.path.join(os.path.dirname(ray.__file__), "train", "v2", "_internal", "execution",
                                      "context.py")
                logging.getLogger(source).setLevel(logging.WARNING)
        except Exception:  # noqa: BLE001
            pass

    return pin


def pin_driver() -> None:
    """The driver (and any process it starts) uses the cluster it is connected to."""
    import ray

    try:
        if ray.util.client.ray.is_connected():  # Ray Client: the address already says it
            return
        gcs = ray.get_runtime_context().gcs_address
    except Exception:  # noqa: BLE001
        return
    previous = os.environ.get("RAY_ADDRESS")
    if previous in (None, "", "auto"):
        state.pinned.update(address=gcs, previous=previous)
        os.environ["RAY_ADDRESS"] = gcs


def unpin() -> None:
    """Puts back the ``RAY_ADDRESS`` that ``pin_driver`` replaced (unless it changed since)."""
    if not state.pinned:
        return
    if os.environ.get("RAY_ADDRESS") == state.pinned["address"]:
        if state.pinned["previous"] is None:
            os.environ.pop("RAY_ADDRESS", None)
        else:
            os.environ["RAY_ADDRESS"] = state.pinned["previous"]
    state.pinned.clear()

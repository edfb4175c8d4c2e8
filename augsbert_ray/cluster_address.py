"""Which Ray cluster a job joins, and whether it answers, checked before anything is loaded.

The address comes from, in order: ``augsbert run --address``, ``ray.address`` (in the job
file or an override), the ``RAY_ADDRESS`` environment variable; with none of them the job
starts a local Ray. ``choose`` records which one it was, so that a message can say where to
fix it. ``check`` refuses an address Ray cannot parse, one where nothing answers and one where
something answers that is not a gRPC server (Ray's GCS and client server are), within
seconds: ``ray.init`` would otherwise retry the connection for minutes, printing nothing.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass

from augsbert_ray.errors import AugSBERTError

__all__ = ["AddressChoice", "ClusterAddressError", "check", "choose", "for_job", "parse"]

PROBE_TIMEOUT_S = 5.0
_HOST_PORT = re.compile(r"^(?:\[(?P<ip6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9_.-]+)):(?P<port>\d{1,5})$")


class ClusterAddressError(AugSBERTError):
    """A Ray cluster address that is malformed, or where no cluster answers."""


@dataclass(frozen=True)
class AddressChoice:
    """A job's cluster address and where it was given.

    Attributes:
        address: the address; None for a local Ray started by the job.
        origin: where it came from, for messages ("--address", "ray.address in jobs/x.yaml",
            "the override ray.address=...", "RAY_ADDRESS").
    """

    address: str | None
    origin: str

    def describe(self) -> str:
        return f"Ray address '{self.address}' (from {self.origin})"


def choose(job_address: str | None, source: str | None, flag: str | None = None,
           overridden: bool = False) -> AddressChoice:
    """The address a job uses, as ``runtime.start_ray`` will choose it.

    Args:
        job_address: ``ray.address`` of the loaded job (with overrides and ``--address`` applied).
        source: the job file.
        flag: the ``--address`` argument, if given.
        overridden: ``ray.address`` was given as a ``key=value`` override.
    """
    if flag:
        return AddressChoice(flag, "--address")
    if job_address:
        return AddressChoice(job_address, f"the override ray.address={job_address}" if overridden
                             else f"ray.address in {source or 'the job'}")
    env = os.environ.get("RAY_ADDRESS")
    if env:
        return AddressChoice(env, "the RAY_ADDRESS environment variable")
    return AddressChoice(None, "no address given: a local Ray")


def for_job(cfg, given=None, overrides=()):
    """A job's address, resolved once for ``augsbert run`` and ``augsbert_ray.run`` alike.

    Args:
        cfg: the loaded job.
        given: ``--address`` or ``run(address=...)``: an address, or an ``AddressChoice``
            already made (returned as it is); None: the job's own.
        overrides: the ``key=value`` overrides the job was loaded with (an override of
            ``ray.address`` is named as such in messages).

    Returns:
        ``(cfg, choice)``: the job with ``ray.address`` set to a given address (so that
        ``runtime.start_ray`` connects there), and the choice (``choose``).
    """
    if isinstance(given, AddressChoice):
        return cfg, given
    if given:
        cfg = cfg.model_copy(update={"ray": cfg.ray.model_copy(update={"address": given})})
    return cfg, choose(cfg.ray.address, cfg.source, given,
                       overridden=any(o.startswith("ray.address=") for o in overrides))


def parse(address: str) -> tuple[str, str | None, int | None]:
    """``(kind, host, port)`` of a Ray address: kind "auto", "local", "client" (``ray://``)
    or "gcs" (``host:port``); host and port are None for "auto" and "local".

    Raises:
        ValueError: not a form ``ray.init`` accepts.
    """
    text = address.strip()
    if text in ("auto", "local"):
        return text, None, None
    kind = "gcs"
    if text.startswith("ray://"):
        kind, text = "client", text[len("ray://"):]
    m = _HOST_PORT.match(text)
    if m is None:
        raise ValueError("a Ray address is host:port (the head's GCS port, usually 6379), ray://host:port "
                         "(Ray Client, usually 10001) or auto")
    port = int(m["port"])
    if not 0 < port < 65536:
        raise ValueError(f"port {port} is not between 1 and 65535")
    return kind, m["ip6"] or m["host"], port


def check(choice: AddressChoice, timeout_s: float | None = None) -> None:
    """Refuses an address that is malformed, where nothing listens (a TCP connection within
    ``timeout_s``, default ``PROBE_TIMEOUT_S``) or where what listens is no gRPC server. A
    local Ray (no address) passes.

    Raises:
        ClusterAddressError: naming the address, where it was given and what to do.
    """
    if choice.address is None:
        return
    timeout_s = PROBE_TIMEOUT_S if timeout_s is None else timeout_s
    try:
        kind, host, port = parse(choice.address)
    except ValueError as e:
        raise ClusterAddressError(f"{choice.describe()} is not a Ray address: {e}") from None
    if kind == "local":
        return
    if kind == "auto":
        host, port = _auto(choice)
        if host is None:
            return  # Ray starts a local instance
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except socket.timeout:
        raise ClusterAddressError(f"{choice.describe()}: nothing answered at {host}:{port} within {timeout_s:g} s; "
                                  "is the cluster up (ray status on its head) and the port reachable?") from None
    except OSError as e:
        raise ClusterAddressError(f"{choice.describe()}: no Ray cluster answers at {host}:{port} "
                                  f"({e.strerror or e}); start it (ray start --head) or give the right "
                                  "address") from None
    if not _speaks_grpc(host, port, timeout_s):
        raise ClusterAddressError(f"{choice.describe()}: something listens at {host}:{port}, but it is not a Ray "
                                  f"cluster (no gRPC answer within {timeout_s:g} s); the head's GCS port is "
                                  "usually 6379, Ray Client's 10001")


def _speaks_grpc(host: str, port: int, timeout_s: float) -> bool:
    """Whether a gRPC server (Ray's GCS, or its client server) answers at ``host:port``: Ray
    would wait minutes on anything else that accepts connections. With TLS on
    (``RAY_USE_TLS``) the handshake needs Ray's certificates, so only the TCP check holds."""
    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        return True
    import grpc

    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    channel = grpc.insecure_channel(target)
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout_s)
        return True
    except grpc.FutureTimeoutError:
        return False
    finally:
        channel.close()


def _auto(choice: AddressChoice) -> tuple[str | None, int | None]:
    """Where ``auto`` points: the cluster of the last ``ray start`` on this host."""
    try:
        from augsbert_ray.runtime.ray_private import auto_address

        found = auto_address()
    except Exception as e:  # noqa: BLE001 - Ray finds no cluster (or several)
        raise ClusterAddressError(f"{choice.describe()}: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
                                  ) from None
    if found is None:
        return None, None
    _, host, port = parse(found)
    return host, port

"""Choosing and checking a Ray cluster address (``cluster_address``), without Ray."""

import socket
import time

import pytest

from augsbert_ray.cluster_address import AddressChoice, ClusterAddressError, check, choose, parse


def test_where_the_address_came_from(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert choose("h:1", "job.yaml", flag="h:1") == AddressChoice("h:1", "--address")
    assert choose("h:1", "job.yaml").origin == "ray.address in job.yaml"
    assert choose("h:1", "job.yaml", overridden=True).origin == "the override ray.address=h:1"
    assert choose(None, "job.yaml") == AddressChoice("10.0.0.1:6379", "the RAY_ADDRESS environment variable")
    monkeypatch.delenv("RAY_ADDRESS")
    assert choose(None, "job.yaml").address is None


@pytest.mark.parametrize(("text", "parsed"), [
    ("auto", ("auto", None, None)), ("10.0.0.1:6379", ("gcs", "10.0.0.1", 6379)),
    ("ray://head-1:10001", ("client", "head-1", 10001)), ("[::1]:6379", ("gcs", "::1", 6379)),
])
def test_addresses_ray_accepts_parse(text, parsed):
    assert parse(text) == parsed


@pytest.mark.parametrize("text", ["nonsense", "head", "head:", ":6379", "head:99999", "http://head:8265",
                                  "ray://head", "head:6379/x", ""])
def test_malformed_addresses_are_refused_naming_where_they_came_from(text):
    with pytest.raises(ClusterAddressError) as info:
        check(AddressChoice(text, "--address"))
    assert f"Ray address '{text}' (from --address) is not a Ray address" in str(info.value)


def test_an_address_where_nothing_listens_fails_at_once():
    with socket.socket() as s:  # a port that was free a moment ago
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(ClusterAddressError) as info:
        check(AddressChoice(f"127.0.0.1:{port}", "ray.address in job.yaml"))
    assert time.monotonic() - t0 < 5
    assert f"'127.0.0.1:{port}' (from ray.address in job.yaml): no Ray cluster answers" in str(info.value)


def test_a_listener_that_is_not_a_ray_cluster_is_refused():
    with socket.socket() as s:  # accepts connections, answers nothing (ray.init would wait minutes)
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ClusterAddressError) as info:
            check(AddressChoice(f"127.0.0.1:{port}", "--address"), timeout_s=0.5)
    assert f"something listens at 127.0.0.1:{port}, but it is not a Ray cluster" in str(info.value)


def test_a_grpc_server_passes():
    from concurrent import futures

    import grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        check(AddressChoice(f"127.0.0.1:{port}", "--address"))
        check(AddressChoice(f"ray://127.0.0.1:{port}", "--address"))
    finally:
        server.stop(None)
    check(AddressChoice(None, "no address given"))

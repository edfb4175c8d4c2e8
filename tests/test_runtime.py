"""The local Ray a job starts is the job's own: it listens on loopback only, and it stops
with the job, also when the job is ended by SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from augsbert_ray import runtime

SCRIPT = """
import time
from augsbert_ray import runtime
print(runtime.start_ray(num_cpus=1).logs, flush=True)
time.sleep(600)
"""


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _listening(pids: set[int]) -> list[tuple[int, str]]:
    """(pid, address) of every TCP socket the processes ``pids`` listen on, from /proc/net."""
    inodes = {}
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes[target[8:-1]] = pid
        except OSError:
            continue
    out = []
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            raw = bytes.fromhex(fields[1].split(":")[0])
            # /proc prints each 32-bit word of the address in host (little-endian) order
            packed = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            out.append((inodes[fields[9]], socket.inet_ntop(family, packed)))
    return out


def _loopback(address: str) -> bool:
    return address.startswith("127.") or address in ("::1",) or address.startswith("::ffff:127.")


@pytest.mark.timeout(120)
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads processes and sockets from /proc (Linux)")
def test_sigterm_stops_the_local_ray_which_listened_on_loopback_only(tmp_path):
    log = open(tmp_path / "stderr.txt", "wb")
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, stderr=log, text=True,
                            start_new_session=True)
    try:
        session = Path(proc.stdout.readline().strip()).parent
        assert session.name.startswith("session_"), (tmp_path / "stderr.txt").read_text()
        deadline = time.monotonic() + 60  # until Ray's agents are up: then every server of the node is
        while time.monotonic() < deadline:
            ray_processes = runtime.reaping.descendants(proc.pid)
            names = " ".join(_cmdline(p.pid) for p in ray_processes)
            if "DashboardAgent" in names and "RuntimeEnvAgent" in names:
                break
            time.sleep(0.5)
        assert "DashboardAgent" in names and "RuntimeEnvAgent" in names, names
        listening = _listening({p.pid for p in ray_processes} | {proc.pid})
        assert listening and [a for a in listening if not _loopback(a[1])] == [], listening

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 143
        deadline = time.monotonic() + 15
        while [p for p in ray_processes if runtime.reaping.alive(p)] and time.monotonic() < deadline:
            time.sleep(0.2)
        survivors = [(p.pid, _cmdline(p.pid)) for p in ray_processes if runtime.reaping.alive(p)]
        assert survivors == [], "processes Ray started for the job outlived it"
        by_session = [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc"))) if str(session) in _cmdline(pid)]
        assert by_session == []
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()


def test_leftovers_asked_to_end_end_before_their_grace():
    from augsbert_ray.runtime import reaping

    # A process that ends only on SIGTERM (as the dashboard's modules end at once when asked).
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        found = [p for p in reaping.descendants(os.getpid()) if p.pid == child.pid]
        t0 = time.monotonic()
        reaping.kill_leftovers(found, grace_s=30, what="a test", terminate=True)
        assert child.wait(timeout=10) == -signal.SIGTERM and time.monotonic() - t0 < 10
    finally:
        child.kill()


def test_only_the_autoscaler_monitor_is_killed_before_the_shutdown(tmp_path):
    import psutil

    from augsbert_ray.runtime.cluster import _end_autoscaler_monitor

    script = tmp_path / "ray" / "autoscaler" / "_private" / "monitor.py"
    script.parent.mkdir(parents=True)
    script.write_text("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)\n")
    other = tmp_path / "log_monitor.py"
    other.write_text("import time\ntime.sleep(60)\n")
    monitor, bystander = (subprocess.Popen([sys.executable, "-u", str(path), "--logs-dir=x"]) for path in (script, other))
    try:
        _end_autoscaler_monitor([psutil.Process(monitor.pid), psutil.Process(bystander.pid)])
        assert monitor.wait(timeout=10) == -signal.SIGKILL
        assert bystander.poll() is None
    finally:
        monitor.kill()
        bystander.kill()


def test_leftover_processes_are_found_and_killed_after_their_grace():
    from augsbert_ray.runtime import reaping

    child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                              "signal.SIG_IGN); time.sleep(60)"])
    try:
        found = [p for p in reaping.descendants(os.getpid()) if p.pid == child.pid]
        assert len(found) == 1 and reaping.alive(found[0])
        t0 = time.monotonic()
        reaping.kill_leftovers(found, grace_s=0.3, what="a test")
        assert child.wait(timeout=10) == -signal.SIGKILL and time.monotonic() - t0 >= 0.3
        assert not reaping.alive(found[0])
    finally:
        child.kill()

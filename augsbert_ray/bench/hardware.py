"""The machine a benchmark ran on: CPU model, GPUs, library versions, load."""

from __future__ import annotations

import os
import platform
import subprocess


def cpu_model(lscpu_text: str | None = None, cpuinfo_text: str | None = None) -> str:
    """The CPU's model name, from ``lscpu`` or else ``/proc/cpuinfo`` (the platform's name where
    neither says).

    Args:
        lscpu_text, cpuinfo_text: their output, read here when None (for tests).
    """
    if lscpu_text is None:
        try:
            lscpu_text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10,
                                        env={**os.environ, "LC_ALL": "C"}).stdout
        except (OSError, subprocess.SubprocessError):
            lscpu_text = ""
    for line in lscpu_text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Model name" and value.strip():
            return value.strip()
    if cpuinfo_text is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as f:
                cpuinfo_text = f.read()
        except OSError:
            cpuinfo_text = ""
    for line in cpuinfo_text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            return value.strip()
    return platform.processor() or platform.machine()


def gpus() -> list[str]:
    """This process's CUDA GPUs, by name and memory (empty without CUDA)."""
    try:
        import torch

        if not torch.cuda.is_available():
            return []
        return [f"{torch.cuda.get_device_name(i)} ({torch.cuda.get_device_properties(i).total_memory / 2**30:.0f} GiB)"
                for i in range(torch.cuda.device_count())]
    except Exception:  # torch absent or a broken driver: no GPU to name
        return []


def cpu_description() -> str:
    """The CPU's model and the matrix instructions torch uses on it, e.g. "AMD EPYC (AVX512, bf16
    instructions)": the same job runs at very different speeds with and without them."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    try:
        import torch

        from augsbert_ray.scoring import cpu_has_bf16

        isa = torch.backends.cpu.get_cpu_capability()
        return f"{model} ({isa}, {'bf16 instructions' if cpu_has_bf16() else 'no bf16 instructions'})"
    except Exception:  # torch absent or without the probe
        return model


def describe() -> dict:
    """The driver's machine: CPU model and matrix instructions, cores, memory, GPUs."""
    try:
        import psutil

        memory = f"{psutil.virtual_memory().total / 2**30:.0f} GiB"
    except ImportError:
        memory = "unknown"
    isa = cpu_description()
    return {"cpu": cpu_model(), "cpu_features": isa[isa.find("(") + 1:-1] if "(" in isa else "",
            "cores": os.cpu_count(), "memory": memory, "gpus": gpus(), "os": platform.platform()}


def versions() -> dict:
    """Python's and the benchmarked libraries' versions (``absent`` where not installed)."""
    import importlib.metadata as md

    from augsbert_ray.versions import versions as core

    out = core()
    for name in ("bm25s", "faiss-cpu", "faiss-gpu", "tantivy", "numpy"):
        try:
            out[name.replace("-", "_")] = md.version(name)
        except md.PackageNotFoundError:
            pass
    return out


def load_average() -> list[float]:
    """The machine's 1, 5 and 15 minute load averages (empty where the OS has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []

"""Which torch device a piece of work runs on, from the GPUs Ray reserved for it.

Ray schedules GPUs as numbers: a task, actor or placement group that holds one is given the
GPU's index (``CUDA_VISIBLE_DEVICES``), and work that holds none must stay off every GPU,
even in a process that sees them (a warm host keeps the node's devices visible). A GPU
reserved where torch sees no CUDA device (a CPU build of torch on a node declared with GPUs)
runs the work on the CPU, with a warning, rather than failing on its first tensor.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)
_warned = False


def torch_device(gpus: float, index: int = 0) -> str:
    """``cuda:index`` for work that holds ``gpus`` > 0 where torch sees a CUDA device, else ``cpu``."""
    return usable(f"cuda:{index}" if gpus else "cpu")


def usable(device) -> str:
    """``device`` (a name or ``torch.device``) if torch can use it in this process, else ``cpu``."""
    global _warned
    device = str(device)
    if not device.startswith("cuda"):
        return device
    import torch

    if torch.cuda.is_available():
        return device
    if not _warned:
        _warned = True
        log.warning(f"[augsbert] WARNING: this work holds a GPU, but torch sees no CUDA device in this process "
                    f"(torch {torch.__version__}); it runs on the CPU")
    return "cpu"

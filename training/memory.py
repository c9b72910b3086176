"""Whether a training step's batch fits in the memory this process may use, checked before the first step.

The estimate is a lower bound of what a step keeps per image (docs/performance.md), so a refused batch would not
have fitted; an accelerator reports its own out-of-memory errors.
"""

from __future__ import annotations

import math
import os
import resource

from keras_vit.config import ViTConfig
from keras_vit.training.errors import TrainingError

__all__ = ["activation_bytes", "available_memory", "check_batch_fits"]


def activation_bytes(config: ViTConfig, bytes_per_value: int = 4) -> int:
    """The activations one training step keeps for one image of the model of ``config`` (a lower bound)."""
    arch = config.architecture
    height, width = config.image_size
    tokens = (height // arch.patch_size) * (width // arch.patch_size) + (config.classifier == "token")
    d, m, h = arch.hidden_size, arch.mlp_dim, arch.num_heads
    per_block = tokens * (11 * d + 2 * m) + 2 * h * tokens**2
    return bytes_per_value * (arch.depth * per_block + 2 * tokens * d + height * width * config.channels)


def _read(path: str) -> str | None:
    try:
        with open(path) as file:
            return file.read()
    except OSError:
        return None


def _kilobytes(path: str, name: str) -> int | None:
    """The bytes of the ``name: N kB`` line of ``path`` (``/proc/meminfo``, ``/proc/self/status``)."""
    lines = (_read(path) or "").splitlines()
    return next((int(line.split()[1]) * 1024 for line in lines if line.startswith(f"{name}:")), None)


def _cgroup_room() -> int | None:
    """``memory.max`` less ``memory.current`` of this process's cgroup (v2), or None without a limit."""
    lines = (_read("/proc/self/cgroup") or "").splitlines()
    group = next((line.split(":", 2)[2] for line in lines if line.startswith("0::")), None)
    if group is None:
        return None
    folder = os.path.join("/sys/fs/cgroup", group.lstrip("/"))
    limit, used = _read(os.path.join(folder, "memory.max")), _read(os.path.join(folder, "memory.current"))
    if not limit or not used or limit.strip() == "max":
        return None
    return int(limit) - int(used)


def _address_space_room() -> int | None:
    """``RLIMIT_AS`` less the address space in use (``VmSize``), or None without a limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    size = _kilobytes("/proc/self/status", "VmSize")
    if soft == resource.RLIM_INFINITY or size is None:
        return None
    return soft - size


def available_memory() -> tuple[int, str] | None:
    """The bytes this process may still take, and what limits them: the least of ``/proc/meminfo``'s MemAvailable,
    its cgroup's ``memory.max`` (less what the group uses) and ``RLIMIT_AS`` (less the address space in use); None
    where none of them can be read."""
    rooms = {
        "available memory (MemAvailable)": _kilobytes("/proc/meminfo", "MemAvailable"),
        "the cgroup's memory.max": _cgroup_room(),
        "the address-space limit (ulimit -v)": _address_space_room(),
    }
    known = [(room, name) for name, room in rooms.items() if room is not None]
    return min(known) if known else None


def check_batch_fits(config: ViTConfig, batch: int, bytes_per_value: int, accumulation_steps: int = 1) -> None:
    """A :class:`TrainingError` saying what batch fits when ``batch`` images (of one step) need more memory than
    :func:`available_memory` leaves; nothing where the memory cannot be read."""
    room = available_memory()
    per_image = activation_bytes(config, bytes_per_value)
    if room is None or batch * per_image <= room[0]:
        return
    fits = max(0, room[0] // per_image)
    gib = 1 << 30
    raise TrainingError(
        f"A step of {batch} images needs at least {batch * per_image / gib:.1f} GiB for its activations "
        f"({per_image / (1 << 20):.2f} MiB per image), but {max(room[0], 0) / gib:.1f} GiB is left under {room[1]}: "
        f"at most {fits} images fit in a step. Lower --batch-size, or keep it and split each update into more "
        f"micro-batches (--accumulation-steps {accumulation_steps * math.ceil(batch / max(fits, 1))} or more, "
        "dividing --batch-size)."
    )

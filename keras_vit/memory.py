"""Whether a model fits the memory this process may take, checked from its config before any layer is built
(:func:`check_model_fits`), and what that memory is (:func:`available_memory`, also the training commands' batch
check). See docs/models.md and docs/faults.md."""

from __future__ import annotations

import os
import re
from typing import Any

from keras_vit.config import PARTS, ViTConfig

try:
    import resource
except ImportError:  # Windows: no address-space limit to read
    resource = None  # type: ignore[assignment]

__all__ = ["MAX_TENSOR_VALUES", "available_memory", "check_model_fits", "model_bytes", "proc_bytes"]

MAX_TENSOR_VALUES = 2**31 - 1  # the most values one weight or table of a model may hold (int32 indices)

# The fields that make one tensor of each part large: the blocks' width (their number: the memory of them all).
_TABLE_FIELDS = {**PARTS, "blocks": ("hidden_size", "mlp_dim")}
_NAMES = {
    "resnet": "ResNet",
    "embedding": "patch embedding",
    "tokens": "prefix tokens",
    "position": "position embeddings",
    "blocks": "encoder blocks",
    "head": "head",
}


def _read(path: str) -> str | None:
    try:
        with open(path) as file:
            return file.read()
    except OSError:
        return None


def proc_bytes(path: str, name: str) -> int | None:
    """The bytes of the ``name: N kB`` line of ``path`` (``/proc/meminfo``, ``/proc/self/status``), else None."""
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
    if resource is None:
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    size = proc_bytes("/proc/self/status", "VmSize")
    if soft == resource.RLIM_INFINITY or size is None:
        return None
    return soft - size


def _physical_memory() -> int | None:
    """The machine's memory (``SC_PHYS_PAGES`` pages), where there is no ``/proc/meminfo`` (macOS); else None."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def available_memory(swap: bool = False) -> tuple[int, str] | None:
    """The bytes this process may still take, and what limits them: the least of ``/proc/meminfo``'s MemAvailable
    (with ``swap``, plus SwapFree; without ``/proc/meminfo``, the physical memory), its cgroup's ``memory.max`` (less
    what the group uses) and ``RLIMIT_AS`` (less the address space in use); None where none of them can be read."""
    free = proc_bytes("/proc/meminfo", "MemAvailable")
    swapped = proc_bytes("/proc/meminfo", "SwapFree") if swap and free is not None else None
    rooms = {
        "the physical memory": _physical_memory() if free is None else None,
        "the cgroup's memory.max": _cgroup_room(),
        "the address-space limit (ulimit -v)": _address_space_room(),
    }
    if free is not None and swapped:
        rooms["available memory and swap (MemAvailable + SwapFree)"] = free + swapped
    else:
        rooms["available memory (MemAvailable)"] = free
    known = [(room, name) for name, room in rooms.items() if room is not None]
    return min(known) if known else None


def _bytes_per_parameter(policy: Any) -> tuple[float, str]:
    """What one parameter takes under the Keras dtype ``policy`` (its variable dtype), and the dtype's name; a
    quantized policy (or a ``DTypePolicyMap`` of one) counts half a byte, int4's, a lower bound."""
    from keras.dtype_policies import DTypePolicyMap

    if policy.quantization_mode is not None or isinstance(policy, DTypePolicyMap):
        return 0.5, "quantized weights (int4: half a byte each, at least)"
    dtype = str(policy.variable_dtype)
    bits = re.search(r"\d+", dtype)
    return (int(bits[0]) / 8 if bits else 4.0), dtype


def _tables(config: ViTConfig) -> dict[str, int]:
    """The values of the largest tensor of each part: a weight, or a table built beside them (the sin-cos
    embeddings, a relative-position block's ``(N, N)`` index)."""
    arch = config.architecture
    width, (rows, cols), parts = arch.hidden_size, config.grid_size, config.parameter_parts()
    prefix, grid = config.num_prefix_tokens, rows * cols
    position = {
        "learned_1d": (prefix + grid) * width,
        "sincos_2d": (prefix + grid) * width,
        "learned_2d": max(max(rows, cols) * (width // 2), prefix * width),
        "relative": (prefix + grid) ** 2,
    }.get(config.position_embedding, 0)
    return {
        "embedding": parts["embedding"] - width,  # the kernel: all but the bias
        "tokens": parts["tokens"],  # the register tokens' table, with the class and distillation tokens
        "position": position,
        "blocks": width * max(3 * width, arch.mlp_dim),
        "head": (config.representation_size or width) * config.num_classes,
    }


def model_bytes(config: ViTConfig, bytes_per_parameter: float = 4) -> dict[str, int]:
    """The bytes each part of the model of ``config`` takes once built (:meth:`ViTConfig.parameter_parts` times
    ``bytes_per_parameter``; the position part also holds the sin-cos table and every relative-position block's
    int32 index): a lower bound of what building it takes."""
    arch = config.architecture
    sizes = {part: int(count * bytes_per_parameter) for part, count in config.parameter_parts().items()}
    tokens = config.num_prefix_tokens + config.grid_size[0] * config.grid_size[1]
    if config.position_embedding == "sincos_2d":
        sizes["position"] += 4 * tokens * arch.hidden_size
    if config.position_embedding == "relative":
        sizes["position"] += 4 * tokens**2 * arch.depth
    return sizes


def _arguments(config: ViTConfig, names: tuple[str, ...]) -> str:
    """``depth=1000000, hidden_size=192, mlp_dim=768``: the fields ``names`` as set (those unset left out)."""
    shown = []
    for name in names:
        value = getattr(config.architecture if hasattr(config.architecture, name) else config, name)
        if value is not None:
            shown.append(f"{name}={'x'.join(map(str, value)) if name == 'image_size' else value}")
    return ", ".join(shown)


def _size(count: float) -> str:
    """``count`` bytes in binary units: ``2.0 TiB``."""
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    power = min(len(units) - 1, max(0, (int(count).bit_length() - 1) // 10))
    return f"{count / 1024**power:.1f} {units[power]}"


def check_model_fits(config: ViTConfig, policy: Any) -> None:
    """Refuse the model of ``config`` under the Keras dtype ``policy`` before any layer is built, where one of its
    tensors would hold more than :data:`MAX_TENSOR_VALUES` values, or its weights need more bytes than
    :func:`available_memory` leaves, swap included (a lower bound: :func:`model_bytes`). Costs microseconds.

    Raises:
        ValueError: naming the fields that make the largest part large, the estimate and the limit.
    """
    tables = _tables(config)
    part = max(tables, key=tables.__getitem__)
    if tables[part] > MAX_TENSOR_VALUES:
        raise ValueError(
            f"ViT {_arguments(config, _TABLE_FIELDS[part])}: one tensor of the model's {_NAMES[part]} would hold "
            f"{tables[part]:,} values, more than the {MAX_TENSOR_VALUES:,} one tensor may hold."
        )
    per_parameter, dtype = _bytes_per_parameter(policy)
    sizes = model_bytes(config, per_parameter)
    needed, room = sum(sizes.values()), available_memory(swap=True)  # what builds today, swapping, still does
    if room is None or needed <= room[0]:
        return
    part = max(sizes, key=sizes.__getitem__)
    raise ValueError(
        f"ViT {_arguments(config, PARTS[part])}: the model's {config.parameter_count():,} parameters need "
        f"{_size(needed)} as {dtype} ({_size(sizes[part])} for its {_NAMES[part]}), but {_size(max(room[0], 0))} is "
        f"left under {room[1]}."
    )

"""Mixed precision chosen by the hardware: :func:`auto_policy`, the Keras dtype policy a ViT runs fastest under.
The rule and its measurements: docs/performance.md ("Precision chosen by the hardware")."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from keras_vit.checks import check_choice

if TYPE_CHECKING:
    import keras

__all__ = [
    "BF16_CPU_FLAGS",
    "MIXED_PRECISION",
    "add_mixed_precision_flag",
    "auto_policy",
    "cpu_features",
    "detect_device",
    "global_policy",
    "openvino_precision",
    "policy_for",
    "policy_of_choice",
    "with_policy",
]

# /proc/cpuinfo flags of x86 CPUs with bfloat16 arithmetic (AVX512_BF16 on Cooper Lake and Zen 4+,
# AMX on Sapphire Rapids and later).
BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "amx_tile"})
_DEVICES = ("cpu", "gpu", "tpu")
# The commands' --mixed-precision choices (training, keras_vit.predict, keras_vit.analysis): policy_of_choice.
MIXED_PRECISION = ("auto", "none", "bfloat16", "float16")


def cpu_features(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags, lower case: ``/proc/cpuinfo`` on Linux, else ``lscpu``; empty if unknown."""
    text = ""
    if os.path.exists(cpuinfo):
        with open(cpuinfo, errors="replace") as info:
            text = info.read()
    else:
        try:
            text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10, check=False).stdout
        except (OSError, subprocess.SubprocessError):
            return frozenset()
    # x86 writes "flags : ...", ARM "Features : ...", lscpu "Flags: ...".
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("flags", "features"):
            return frozenset(value.lower().split())
    return frozenset()


def _capability(value) -> tuple[int, int] | None:
    """``(major, minor)`` from ``(8, 0)``, ``"8.0"``, ``8.0`` or ``"sm_80"``; ``None`` if unknown."""
    if value is None:
        return None
    if isinstance(value, (tuple, list)):
        return int(value[0]), int(value[1]) if len(value) > 1 else 0
    match = re.fullmatch(r"(?:sm_?)?(\d+)(?:\.(\d+))?", str(value).strip().lower())
    if match is None:
        return None
    if match[2] is None and len(match[1]) >= 2:  # "sm_80", "90"
        return int(match[1][:-1]), int(match[1][-1])
    return int(match[1]), int(match[2] or 0)


def policy_for(device: str, features: Iterable[str] = (), gpu_capability=None, backend: str | None = None) -> str:
    """The rule alone, no probing: the policy for ``device`` ("cpu", "gpu", "tpu") with these facts; ``backend``
    matters only on CPUs (``"jax"`` and ``"openvino"`` keep float32 there)."""
    device = _normalise_device(device)
    if device == "tpu":
        return "mixed_bfloat16"
    if device == "gpu":
        capability = _capability(gpu_capability)
        if capability is None or capability < (7, 0):
            return "float32"
        return "mixed_bfloat16" if capability >= (8, 0) else "mixed_float16"
    if backend in ("jax", "openvino"):
        return "float32"
    return "mixed_bfloat16" if BF16_CPU_FLAGS & {f.lower() for f in features} else "float32"


def openvino_precision(features: Iterable[str] | None = None) -> str:
    """OpenVINO's ``INFERENCE_PRECISION_HINT`` for a CPU with these flags (``None``: :func:`cpu_features`):
    ``"bf16"`` where it has bfloat16 units (:data:`BF16_CPU_FLAGS`), else ``"f32"``: the rule :func:`policy_for`
    follows, and the choice OpenVINO's CPU runtime makes by default on such CPUs."""
    features = cpu_features() if features is None else features
    return "bf16" if BF16_CPU_FLAGS & {f.lower() for f in features} else "f32"


def _normalise_device(device: str) -> str:
    """``"GPU"``, ``"/device:GPU:0"``, ``"cuda:0"`` -> ``"gpu"``."""
    name = str(device).lower().removeprefix("/device:").removeprefix("/physical_device:").split(":")[0]
    name = "gpu" if name in ("cuda", "rocm") else name
    return check_choice(name, _DEVICES, "device")


def detect_device() -> tuple[str, tuple[int, int] | None]:
    """``(device, gpu_capability)`` of the active Keras backend's device (TPU, then GPU, then CPU)."""
    import keras

    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        if tf.config.list_physical_devices("TPU"):
            return "tpu", None
        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            return "gpu", _capability(tf.config.experimental.get_device_details(gpus[0]).get("compute_capability"))
    elif backend == "jax":
        import jax

        device = jax.devices()[0]  # the default backend's: TPU, then GPU, then CPU
        platform = device.platform.lower()
        if platform == "tpu":
            return "tpu", None
        if platform in ("gpu", "cuda", "rocm"):
            return "gpu", _capability(getattr(device, "compute_capability", None))
    elif backend == "torch":
        import torch

        if torch.cuda.is_available():
            return "gpu", _capability(torch.cuda.get_device_capability(0))
    return "cpu", None  # numpy, openvino: CPU execution


def auto_policy(
    device: str | None = None, features: Iterable[str] | None = None, gpu_capability=None, *, backend: str | None = None
) -> str:
    """The Keras dtype-policy name for this hardware (the rule in docs/performance.md); ``device``, ``features``
    (CPU flags), ``gpu_capability`` and ``backend`` replace the probes when given."""
    if device is None:
        device, detected = detect_device()
        gpu_capability = detected if gpu_capability is None else gpu_capability
    device = _normalise_device(device)
    if device == "gpu" and gpu_capability is None:
        gpu_capability = detect_device()[1]
    if device == "cpu":
        features = cpu_features() if features is None else features
        if backend is None:
            import keras

            backend = keras.backend.backend()
    return policy_for(device, features or (), gpu_capability, backend)


def policy_of_choice(choice: str, device: str | None = None) -> str:
    """The Keras dtype policy of a ``--mixed-precision`` choice (:data:`MIXED_PRECISION`): ``auto`` (:func:`auto_policy`
    for ``device``), ``none`` (float32), ``bfloat16``, ``float16``; float16 on a CPU under JAX is a ``ValueError``."""
    check_choice(choice, MIXED_PRECISION, "mixed precision")
    if choice == "auto":
        return auto_policy(device)
    if choice == "float16":
        import keras

        on_cpu = (device or detect_device()[0]) == "cpu"
        if on_cpu and keras.backend.backend() == "jax":
            raise ValueError(
                "mixed precision float16 does not run on JAX's CPU (XLA has no float16 matmul there); use bfloat16, "
                "none or auto."
            )
    return "float32" if choice == "none" else f"mixed_{choice}"


def add_mixed_precision_flag(parser: argparse.ArgumentParser) -> None:
    """The inference commands' ``--mixed-precision`` flag (:data:`MIXED_PRECISION`, default ``auto``)."""
    parser.add_argument(
        "--mixed-precision",
        choices=MIXED_PRECISION,
        default="auto",
        help="auto (default): keras_vit.precision.auto_policy's choice for this hardware (bfloat16 on CPUs with "
        "bfloat16 units, TPUs and GPUs from Ampere on); none: float32",
    )


@contextlib.contextmanager
def global_policy(name: str) -> Iterator[str]:
    """Build layers under Keras' global dtype policy ``name`` (e.g. ``"mixed_bfloat16"``), restored on exit."""
    import keras

    previous = keras.mixed_precision.dtype_policy()
    keras.mixed_precision.set_global_policy(name)
    try:
        yield name
    finally:
        keras.mixed_precision.set_global_policy(previous)


def with_policy(model: keras.Model, policy: str, keep_float32: tuple[str, ...] = ("head",)) -> keras.Model:
    """A copy of ``model`` with its weights whose layers compute under ``policy`` (e.g. a float32 model, saved or
    loaded, run in ``"mixed_bfloat16"``). The layers named in ``keep_float32`` (the classification head, as every
    keras_vit model is built) stay float32. LoRA adapters are merged into their kernels, as ``model.save`` does. A
    :class:`~keras_vit.models.VisionTransformer` stays one, its config and class names kept."""
    import keras

    from keras_vit.cloning import clone_with_weights, copy_weights
    from keras_vit.quantization import is_quantized

    policy = keras.dtype_policies.get(policy).name  # an unknown name: Keras' ValueError naming the valid ones
    # keras_vit.models' class by its registered name: that module imports this one
    vit = keras.saving.get_registered_object("keras_vit>VisionTransformer")
    if vit is not None and isinstance(model, vit) and set(keep_float32) <= {"head"} and not is_quantized(model):
        head = "float32" if keep_float32 else policy
        return copy_weights(model, vit(model.config, name=model.name, dtype=policy, head_dtype=head))

    def rebuilt(layer):
        config = layer.get_config()
        if layer.name not in keep_float32:
            config["dtype"] = policy
        return layer.__class__.from_config(config)

    return clone_with_weights(model, rebuilt)

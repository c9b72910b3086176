"""Choosing a ``tf.distribute`` strategy: automatically from the machine, or by name.

``auto`` picks, in order: ``tpu`` when a TPU is reachable (``TPU_NAME`` set, or a TPU VM's
``/dev/accel0``), ``multi_worker`` when ``TF_CONFIG`` describes more than one task, ``mirrored`` when
more than one GPU is visible, else ``default`` (one CPU or one GPU).
"""

from __future__ import annotations

import json
import os

import tensorflow as tf

__all__ = ["STRATEGIES", "accelerator", "choose_strategy", "get_strategy", "is_chief", "split_cpu"]

STRATEGIES = ("auto", "default", "one_device", "mirrored", "multi_worker", "tpu")


def split_cpu(num_devices: int) -> None:
    """Split the CPU into ``num_devices`` logical devices, so a MirroredStrategy can run on a CPU-only
    machine (for testing distribution). Must be called before TensorFlow initialises its devices."""
    if num_devices < 1:
        raise ValueError(f"num_devices must be >= 1, got {num_devices}.")
    cpu = tf.config.list_physical_devices("CPU")[0]
    if len(tf.config.get_logical_device_configuration(cpu) or ()) == num_devices:
        return  # already split so
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)
    except RuntimeError as error:
        raise RuntimeError(
            "The CPU can only be split before TensorFlow has initialised its devices; do it at the "
            "start of the program (the CLI's --cpu-devices does)."
        ) from error


def _tf_config_tasks(env: dict[str, str]) -> int:
    if not env.get("TF_CONFIG"):
        return 0
    try:
        cluster = json.loads(env["TF_CONFIG"]).get("cluster", {})
    except json.JSONDecodeError as error:
        raise ValueError(f"TF_CONFIG is not valid JSON: {error}") from error
    return sum(len(cluster.get(role, [])) for role in ("chief", "worker"))


def _tpu_address(env: dict[str, str]) -> str | None:
    if env.get("TPU_NAME"):
        return env["TPU_NAME"]
    return "local" if os.path.exists("/dev/accel0") else None


def choose_strategy(env: dict[str, str] | None = None, num_gpus: int | None = None) -> str:
    """The name ``auto`` resolves to on this machine (see the module docstring)."""
    env = dict(os.environ) if env is None else env
    if _tpu_address(env) is not None:
        return "tpu"
    if _tf_config_tasks(env) > 1:
        return "multi_worker"
    if num_gpus is None:
        num_gpus = len(tf.config.list_physical_devices("GPU"))
    return "mirrored" if num_gpus > 1 else "default"


def get_strategy(name: str = "auto", tpu: str | None = None) -> tf.distribute.Strategy:
    """Build the strategy called ``name`` (one of :data:`STRATEGIES`).

    ``mirrored`` replicates over all local GPUs, or over all logical CPUs when there is no GPU (see
    :func:`split_cpu`). ``tpu`` connects to ``tpu`` (an address or name; default ``TPU_NAME`` or the
    local TPU VM).
    """
    if name not in STRATEGIES:
        raise ValueError(f"Unknown strategy {name!r}; expected one of {STRATEGIES}.")
    if name == "auto":
        name = choose_strategy()
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "one_device":
        gpus = tf.config.list_logical_devices("GPU")
        return tf.distribute.OneDeviceStrategy(gpus[0].name if gpus else "/cpu:0")
    if name == "mirrored":
        devices = tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")
        return tf.distribute.MirroredStrategy([device.name for device in devices])
    if name == "multi_worker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    address = tpu or _tpu_address(dict(os.environ))
    if address is None:
        raise ValueError("strategy='tpu' but no TPU was given (tpu=...) or found (TPU_NAME, /dev/accel0).")
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=address)
    if address != "local":
        tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)


def accelerator(strategy: tf.distribute.Strategy) -> str:
    """``"tpu"``, ``"gpu"`` or ``"cpu"``: what the strategy's replicas run on."""
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return "tpu"
    return "gpu" if tf.config.list_logical_devices("GPU") else "cpu"


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """Whether this process writes outputs (always, except on non-chief multi-worker tasks)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return True
    task_type, task_id = resolver.task_type, resolver.task_id
    return task_type in (None, "chief") or (task_type == "worker" and task_id == 0 and
                                             "chief" not in resolver.cluster_spec().as_dict())

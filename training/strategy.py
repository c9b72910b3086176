"""Choosing a ``tf.distribute`` strategy: automatically from the machine, or by name.

``auto`` picks, in order: ``tpu`` when a TPU is reachable (``TPU_NAME`` set, or a TPU VM's
``/dev/accel0``), ``multi_worker`` when ``TF_CONFIG`` describes more than one task,
``mirrored`` when more than one GPU is visible, else ``default`` (one CPU or one GPU).

``multi_worker`` waits at most ``KERAS_VIT_CONNECT_TIMEOUT`` seconds (default 600) for the other tasks
of ``TF_CONFIG``; past it a watchdog process names the peers whose address does not answer a TCP
connection and kills it (TensorFlow itself would wait forever). ``KERAS_VIT_COLLECTIVE_TIMEOUT`` sets
``CommunicationOptions(timeout_seconds=...)`` of every collective (off by default: TensorFlow runs a
thread per collective for it; a dead peer is found anyway by the strategy's health check).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import tensorflow as tf

__all__ = [
    "STRATEGIES",
    "MultiWorkerMirroredStrategy",
    "accelerator",
    "choose_strategy",
    "cluster_peers",
    "get_strategy",
    "is_chief",
    "multi_worker_strategy",
    "split_cpu",
]

STRATEGIES = ("auto", "default", "one_device", "mirrored", "multi_worker", "tpu")
DEFAULT_CONNECT_TIMEOUT = 600.0


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
        return multi_worker_strategy()
    address = tpu or _tpu_address(dict(os.environ))
    if address is None:
        raise ValueError("strategy='tpu' but no TPU was given (tpu=...) or found (TPU_NAME, /dev/accel0).")
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=address)
    if address != "local":
        tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)


def cluster_peers(env: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """``[(task name, "host:port")]`` of the other tasks of ``TF_CONFIG`` (``"worker 1"``, ...)."""
    env = dict(os.environ) if env is None else env
    config = json.loads(env.get("TF_CONFIG") or "{}")
    task = config.get("task", {})
    me = (task.get("type"), int(task.get("index", 0)))
    return [
        (f"{role} {index}", address)
        for role, addresses in config.get("cluster", {}).items()
        for index, address in enumerate(addresses)
        if (role, index) != me
    ]


# Run in a separate process: while TensorFlow waits for the cluster it holds the GIL, so no Python thread of
# the waiting process runs. Exits quietly once its stdin closes (the parent joined the cluster, or died).
_WATCHDOG = r"""
import json, os, select, signal, socket, sys
parent, timeout, peers = int(sys.argv[1]), float(sys.argv[2]), json.loads(sys.argv[3])
if select.select([sys.stdin], [], [], timeout)[0]:
    sys.exit(0)
down = []
for name, address in peers:
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=2).close()
    except OSError as error:
        down.append(f"{name} at {address} ({error.strerror or error})")
reason = ("could not reach " + ", ".join(down)) if down else (
    "every peer answered on TCP (" + ", ".join(f"{n} at {a}" for n, a in peers) + ") but the cluster did not "
    "form (a peer started with another TF_CONFIG, or is stuck)")
print(f"error: multi-worker task did not join the cluster within {timeout:g} s: {reason}", file=sys.stderr,
      flush=True)
os.kill(parent, signal.SIGKILL)
"""


class MultiWorkerMirroredStrategy(tf.distribute.MultiWorkerMirroredStrategy):
    """TensorFlow's strategy with a ``reduce`` that takes what Keras 3's ``fit`` passes it under several
    workers (keras-team/keras#20585): a nested structure (a whole ``(x, y)`` batch, to build the model),
    and scalars with ``axis=0`` (the step's logs), reduced across replicas only."""

    def reduce(self, reduce_op, value, axis):
        if not isinstance(value, tf.distribute.DistributedValues) and tf.nest.is_nested(value):
            return tf.nest.map_structure(lambda v: self.reduce(reduce_op, v, axis), value)
        if axis is not None and self.experimental_local_results(value)[0].shape.rank == 0:
            axis = None
        return super().reduce(reduce_op, value, axis)


def multi_worker_strategy(
    connect_timeout: float | None = None, collective_timeout: float | None = None
) -> tf.distribute.MultiWorkerMirroredStrategy:
    """``MultiWorkerMirroredStrategy`` over ``TF_CONFIG``'s tasks, giving up after ``connect_timeout`` seconds
    (default ``KERAS_VIT_CONNECT_TIMEOUT`` or 600; see the module docstring) when a peer does not join."""
    env = os.environ
    if connect_timeout is None:
        connect_timeout = float(env.get("KERAS_VIT_CONNECT_TIMEOUT") or DEFAULT_CONNECT_TIMEOUT)
    if collective_timeout is None and env.get("KERAS_VIT_COLLECTIVE_TIMEOUT"):
        collective_timeout = float(env["KERAS_VIT_COLLECTIVE_TIMEOUT"])
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=collective_timeout or None)
    watchdog = subprocess.Popen(
        [sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(connect_timeout), json.dumps(cluster_peers())],
        stdin=subprocess.PIPE,
    )
    try:  # the constructor runs an all-reduce over every task: it returns once the whole cluster is up
        return MultiWorkerMirroredStrategy(communication_options=options)
    finally:
        watchdog.stdin.close()
        watchdog.wait()


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
    return task_type in (None, "chief") or (
        task_type == "worker" and task_id == 0 and "chief" not in resolver.cluster_spec().as_dict()
    )

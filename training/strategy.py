"""Choosing how a run is distributed: a ``tf.distribute`` strategy on TensorFlow, a ``keras.distribution`` on JAX.

TensorFlow: ``auto`` picks, in order, ``tpu`` when a TPU is reachable (``TPU_NAME`` set, or a TPU VM's
``/dev/accel0``), ``multi_worker`` when ``TF_CONFIG`` describes more than one task, ``mirrored`` when more
than one GPU is visible, else ``default`` (one CPU or one GPU).

JAX: ``auto`` is ``data_parallel`` (``keras.distribution.DataParallel`` over ``jax.devices()``) when there is
more than one device, else ``default`` (one device). ``model_parallel`` is ``keras.distribution.ModelParallel``
on a ``(batch, model)`` mesh with ``model_devices`` devices on the model axis (default: all), sharding the
attention and MLP kernels of every block (:func:`vit_layout_map`). torch: one device (``auto``/``default``).
The other backends' run is a :class:`KerasDistribution`; the tf.distribute-only names are errors there, and
the JAX-only names on TensorFlow.

``multi_worker`` waits at most ``KERAS_VIT_CONNECT_TIMEOUT`` seconds (default 600) for the other tasks
of ``TF_CONFIG``; past it a watchdog process names the peers whose address does not answer a TCP
connection and kills it (TensorFlow itself would wait forever). ``KERAS_VIT_COLLECTIVE_TIMEOUT`` sets
``CommunicationOptions(timeout_seconds=...)`` of every collective (off by default: TensorFlow runs a
thread per collective for it; a dead peer is found anyway by the strategy's health check).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
from typing import Union

import keras
import tensorflow as tf

__all__ = [
    "JAX_STRATEGIES",
    "MODEL_AXIS_KERNELS",
    "STRATEGIES",
    "TF_STRATEGIES",
    "KerasDistribution",
    "MultiWorkerMirroredStrategy",
    "Strategy",
    "accelerator",
    "choose_strategy",
    "cluster_peers",
    "get_strategy",
    "is_chief",
    "keras_distribution",
    "multi_worker_strategy",
    "split_cpu",
    "strategy_name",
    "training_scope",
    "vit_layout_map",
]

TF_STRATEGIES = ("one_device", "mirrored", "multi_worker", "tpu")
JAX_STRATEGIES = ("data_parallel", "model_parallel")
STRATEGIES = ("auto", "default", *TF_STRATEGIES, *JAX_STRATEGIES)
DEFAULT_CONNECT_TIMEOUT = 600.0
# Variable path (a regular expression matching the whole path) -> its layout on the ("batch", "model") mesh of
# model_parallel: the fused qkv and the first MLP kernel split by output column, the attention output and second
# MLP kernel by input row (Megatron-style); the rest (embeddings, norms, LoRA adapters, the head) is replicated.
MODEL_AXIS_KERNELS = {
    r".*/qkv/kernel": (None, "model"),
    r".*/qkv/bias": ("model",),
    r".*/out/kernel": ("model", None),
    r".*/Dense_0/kernel": (None, "model"),
    r".*/Dense_0/bias": ("model",),
    r".*/Dense_1/kernel": ("model", None),
}


def split_cpu(num_devices: int) -> None:
    """Split the CPU into ``num_devices`` devices, so that replication can run on a CPU-only machine (for testing
    distribution): TensorFlow's logical devices, or JAX's host devices (``jax_num_cpu_devices``). Must be called
    before the backend initialises its devices."""
    if num_devices < 1:
        raise ValueError(f"num_devices must be >= 1, got {num_devices}.")
    message = (
        "The CPU can only be split before the backend has initialised its devices; do it at the start of the "
        "program (the CLI's --cpu-devices does)."
    )
    if keras.backend.backend() == "jax":
        import jax

        if jax.config.jax_num_cpu_devices == num_devices:
            return
        try:
            jax.config.update("jax_num_cpu_devices", num_devices)
        except RuntimeError as error:
            raise RuntimeError(message) from error
        return
    if keras.backend.backend() != "tensorflow":
        raise ValueError(f"--cpu-devices needs the TensorFlow or JAX backend; this run is {keras.backend.backend()}.")
    cpu = tf.config.list_physical_devices("CPU")[0]
    if len(tf.config.get_logical_device_configuration(cpu) or ()) == num_devices:
        return  # already split so
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)
    except RuntimeError as error:
        raise RuntimeError(message) from error


@dataclasses.dataclass(frozen=True)
class KerasDistribution:
    """How a run on JAX or torch is distributed: a ``keras.distribution`` (JAX), or ``None`` for one device.

    It answers what the training code asks of a ``tf.distribute`` strategy: :meth:`scope` (variables created in
    it get the distribution's layouts; ``model.fit`` in it splits the batch) and :attr:`num_replicas_in_sync`.
    """

    distribution: keras.distribution.Distribution | None = None

    @property
    def name(self) -> str:
        return type(self.distribution).__name__ if self.distribution is not None else "OneDevice"

    @property
    def num_replicas_in_sync(self) -> int:
        """How many parts the global batch is split into (the size of the mesh's batch axis)."""
        if self.distribution is None:
            return 1
        mesh = self.distribution.device_mesh
        return int(mesh.shape[mesh.axis_names.index(self.distribution.batch_dim_name)])

    def scope(self) -> contextlib.AbstractContextManager:
        return self.distribution.scope() if self.distribution is not None else contextlib.nullcontext()


Strategy = Union[tf.distribute.Strategy, KerasDistribution]  # noqa: UP007  (a runtime alias for annotations)


def vit_layout_map(mesh: keras.distribution.DeviceMesh) -> keras.distribution.LayoutMap:
    """The layouts of :data:`MODEL_AXIS_KERNELS` on ``mesh`` (axes ``batch`` and ``model``) for a keras-vit ViT."""
    layout_map = keras.distribution.LayoutMap(mesh)
    for path, axes in MODEL_AXIS_KERNELS.items():
        layout_map[path] = axes
    return layout_map


def keras_distribution(name: str = "auto", model_devices: int | None = None) -> KerasDistribution:
    """The :class:`KerasDistribution` called ``name`` for the JAX or torch backend (see the module docstring)."""
    backend = keras.backend.backend()
    if name in TF_STRATEGIES:
        raise ValueError(
            f"--strategy {name} is a tf.distribute strategy and needs KERAS_BACKEND=tensorflow; this run is {backend} "
            f"(use auto, default{', data_parallel or model_parallel' if backend == 'jax' else ''})."
        )
    if backend != "jax":
        if name in JAX_STRATEGIES:
            raise ValueError(
                f"--strategy {name} is a keras.distribution of the JAX backend; on {backend} a run uses one device "
                "(--strategy auto or default)."
            )
        return KerasDistribution()
    devices = keras.distribution.list_devices()
    if name == "auto":
        name = "data_parallel" if len(devices) > 1 else "default"
    if name == "default":
        return KerasDistribution()
    if name == "data_parallel":
        return KerasDistribution(keras.distribution.DataParallel(devices=devices))
    model = model_devices or len(devices)
    if len(devices) % model:
        raise ValueError(f"--model-devices {model} does not divide the {len(devices)} devices ({', '.join(devices)}).")
    mesh = keras.distribution.DeviceMesh((len(devices) // model, model), ("batch", "model"), devices)
    return KerasDistribution(keras.distribution.ModelParallel(layout_map=vit_layout_map(mesh), batch_dim_name="batch"))


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


def get_strategy(name: str = "auto", tpu: str | None = None, model_devices: int | None = None) -> Strategy:
    """Build the strategy called ``name`` (one of :data:`STRATEGIES`) for the Keras backend.

    On TensorFlow a ``tf.distribute.Strategy``: ``mirrored`` replicates over all local GPUs, or over all logical
    CPUs when there is no GPU (see :func:`split_cpu`). ``tpu`` connects to ``tpu`` (an address or name; default
    ``TPU_NAME`` or the local TPU VM). On the other backends a :class:`KerasDistribution`
    (:func:`keras_distribution`; ``model_devices``: the model axis of ``model_parallel``); TensorFlow is then
    kept off the GPUs (it only runs the tf.data pipeline).
    """
    if name not in STRATEGIES:
        raise ValueError(f"Unknown strategy {name!r}; expected one of {STRATEGIES}.")
    if keras.backend.backend() != "tensorflow":
        with contextlib.suppress(RuntimeError):  # too late once TensorFlow has started: then it stays as it is
            tf.config.set_visible_devices([], "GPU")
        return keras_distribution(name, model_devices)
    if name in JAX_STRATEGIES:
        raise ValueError(
            f"--strategy {name} is a keras.distribution of the JAX backend (KERAS_BACKEND=jax); on TensorFlow use "
            "auto, default, one_device, mirrored, multi_worker or tpu."
        )
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


def accelerator(strategy: Strategy) -> str:
    """``"tpu"``, ``"gpu"`` or ``"cpu"``: what the strategy's replicas run on."""
    if isinstance(strategy, KerasDistribution):
        from keras_vit.precision import detect_device

        return detect_device()[0]
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return "tpu"
    return "gpu" if tf.config.list_logical_devices("GPU") else "cpu"


def is_chief(strategy: Strategy) -> bool:
    """Whether this process writes outputs (always, except on non-chief multi-worker tasks and JAX processes
    other than the first)."""
    if isinstance(strategy, KerasDistribution):
        if keras.backend.backend() != "jax":
            return True
        import jax

        return jax.process_index() == 0
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return True
    task_type, task_id = resolver.task_type, resolver.task_id
    return task_type in (None, "chief") or (
        task_type == "worker" and task_id == 0 and "chief" not in resolver.cluster_spec().as_dict()
    )


def strategy_name(strategy: Strategy) -> str:
    """``"MirroredStrategy"``, ``"DefaultDistributionStrategy"``, ``"DataParallel"``, ``"OneDevice"``, ..."""
    if isinstance(strategy, KerasDistribution):
        return strategy.name
    return type(strategy).__name__.lstrip("_")


def training_scope(strategy: Strategy) -> contextlib.AbstractContextManager:
    """Where ``model.fit`` / ``evaluate`` run: in a keras.distribution's scope (it splits the batch over the devices);
    a tf.distribute model needs none (it keeps its strategy)."""
    return strategy.scope() if isinstance(strategy, KerasDistribution) else contextlib.nullcontext()

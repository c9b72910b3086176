"""Choosing how a run is distributed: a ``tf.distribute`` strategy on TensorFlow, a ``keras.distribution`` on JAX.

``auto``, the JAX processes' environment and the connection timeouts: docs/distributed.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Union

import keras
import tensorflow as tf

from keras_vit.checks import check_choice
from keras_vit.training.config import JAX_STRATEGIES, STRATEGIES, TF_STRATEGIES
from keras_vit.training.distributed.launch import JOB_ADDRESSES, NUM_PROCESSES, PROCESS_ID

__all__ = [
    "JAX_STRATEGIES",
    "MODEL_AXIS_KERNELS",
    "STRATEGIES",
    "TF_STRATEGIES",
    "JaxProcesses",
    "KerasDistribution",
    "MultiWorkerMirroredStrategy",
    "Strategy",
    "accelerator",
    "choose_strategy",
    "cluster_peers",
    "get_strategy",
    "initialize_jax_processes",
    "is_chief",
    "jax_processes",
    "keras_distribution",
    "multi_worker_strategy",
    "split_cpu",
    "strategy_name",
    "training_scope",
    "vit_layout_map",
]

DEFAULT_CONNECT_TIMEOUT = 600.0
JAX_CLUSTER = "KERAS_VIT_JAX_CLUSTER"  # "auto": jax.distributed.initialize() finds the cluster itself
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

        # the ignore: jax.config's options are attributes made at run time
        if jax.config.jax_num_cpu_devices == num_devices:  # type: ignore[attr-defined]
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
    """A run on JAX or torch: a ``keras.distribution`` (JAX) or ``None`` (one device), with what the training code
    asks of a ``tf.distribute`` strategy (:meth:`scope`, :attr:`num_replicas_in_sync`)."""

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
    processes = initialize_jax_processes()  # before anything lists the devices
    devices = keras.distribution.list_devices()
    if name == "auto":
        name = "data_parallel" if len(devices) > 1 else "default"
    if name == "default":
        if processes > 1:
            raise ValueError(
                f"--strategy default trains on one device, but this is one of {processes} JAX processes: use auto, "
                "data_parallel or model_parallel."
            )
        return KerasDistribution()
    # Each process feeds its own part of every batch (keras_vit.training.distributed.sharding): no sharding by Keras.
    if name == "data_parallel":
        return KerasDistribution(keras.distribution.DataParallel(devices=devices, auto_shard_dataset=False))
    model = model_devices or len(devices)
    if len(devices) % model:
        raise ValueError(f"--model-devices {model} does not divide the {len(devices)} devices ({', '.join(devices)}).")
    local = len(devices) // processes
    if processes > 1 and local % model:
        raise ValueError(
            f"--model-devices {model} would span JAX processes ({local} devices per process): keep the model axis "
            f"within a process (a divisor of {local}), so that each holds whole weights to save; the batch axis spans "
            "the processes."
        )
    mesh = keras.distribution.DeviceMesh((len(devices) // model, model), ("batch", "model"), devices)
    return KerasDistribution(
        keras.distribution.ModelParallel(
            layout_map=vit_layout_map(mesh), batch_dim_name="batch", auto_shard_dataset=False
        )
    )


@dataclasses.dataclass(frozen=True)
class JaxProcesses:
    """The JAX processes of a run: the coordinator's ``host:port`` (process 0's), how many, which one this is."""

    coordinator: str
    count: int
    index: int


def jax_processes(env: dict[str, str] | None = None) -> JaxProcesses | None:
    """The processes ``KERAS_DISTRIBUTION_*`` describe (see the module docstring); ``None`` for a single one."""
    env = dict(os.environ) if env is None else env
    addresses = [a.strip() for a in env.get(JOB_ADDRESSES, "").split(",") if a.strip()]
    if not addresses:
        return None
    try:
        count = int(env.get(NUM_PROCESSES) or len(addresses))
        index = int(env[PROCESS_ID])
    except (KeyError, ValueError) as error:
        raise ValueError(
            f"{JOB_ADDRESSES} is set, so {PROCESS_ID} must be the process's index (and {NUM_PROCESSES}, if set, "
            f"their count): {error}"
        ) from None
    if len(addresses) not in (1, count) or not 0 <= index < count:
        raise ValueError(
            f"{JOB_ADDRESSES}={','.join(addresses)} ({len(addresses)} addresses), {NUM_PROCESSES}={count} and "
            f"{PROCESS_ID}={index} disagree: give one address per process, or the coordinator's alone, and an index "
            f"in 0..{count - 1}."
        )
    return JaxProcesses(addresses[0], count, index) if count > 1 else None


def _connect_timeout(given: float | None) -> float:
    """``given``, else ``KERAS_VIT_CONNECT_TIMEOUT``, else :data:`DEFAULT_CONNECT_TIMEOUT` (seconds)."""
    return float(os.environ.get("KERAS_VIT_CONNECT_TIMEOUT") or DEFAULT_CONNECT_TIMEOUT) if given is None else given


def initialize_jax_processes(connect_timeout: float | None = None) -> int:
    """Join this process to the run's other JAX processes (``jax.distributed.initialize``), once; return how many
    there are (1: a single process, nothing to join). A process that has not joined within ``connect_timeout``
    seconds (default ``KERAS_VIT_CONNECT_TIMEOUT`` or 600) is killed by a watchdog naming the coordinator."""
    import jax

    if jax.distributed.is_initialized():
        return jax.process_count()
    if os.environ.get(JAX_CLUSTER) == "auto":
        jax.distributed.initialize()
        return jax.process_count()
    processes = jax_processes()
    if processes is None:
        return 1
    connect_timeout = _connect_timeout(connect_timeout)
    # older JAX: no CPU collectives by default (the ignore: jax.config's options are attributes made at run time)
    if jax.config.jax_cpu_collectives_implementation in (None, "none"):  # type: ignore[attr-defined]
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    count, coordinator = processes.count, processes.coordinator
    peers = [] if processes.index == 0 else [("the coordinator (process 0)", coordinator)]
    missing = (
        f"the coordinator at {coordinator} answers, but not all {count} processes joined it (one is missing, or was "
        f"started with other {NUM_PROCESSES} / {JOB_ADDRESSES})"
    )
    what = f"JAX process {processes.index} of {count} did not join the others"
    with _watchdog(connect_timeout, peers, what, missing):
        jax.distributed.initialize(
            coordinator_address=coordinator,
            num_processes=count,
            process_id=processes.index,
            initialization_timeout=int(connect_timeout) + 60,  # the watchdog's message comes first
        )
    return count


def _tf_config_tasks(env: dict[str, str]) -> int:
    if not env.get("TF_CONFIG"):
        return 0
    try:
        cluster = json.loads(env["TF_CONFIG"]).get("cluster", {})
    except json.JSONDecodeError as error:
        raise ValueError(f"TF_CONFIG is not valid JSON: {error}") from error
    return sum(len(cluster.get(role, [])) for role in ("chief", "worker"))


def _tpu_address(env: dict[str, str]) -> str | None:
    return env.get("TPU_NAME") or ("local" if os.path.exists("/dev/accel0") else None)


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
    """The strategy called ``name`` (:data:`STRATEGIES`) for the Keras backend: a ``tf.distribute.Strategy`` on
    TensorFlow (``tpu``: the TPU ``tpu`` names), else a :class:`KerasDistribution` (``model_devices``: the model axis
    of ``model_parallel``). A ``ValueError`` for a name the backend does not run."""
    check_choice(name, STRATEGIES, "strategy")
    if keras.backend.backend() == "openvino":
        raise ValueError(
            "Keras' openvino backend runs inference only: train with KERAS_BACKEND=tensorflow, jax or torch (the "
            "model.keras a run writes then predicts on openvino)."
        )
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


# Run in a separate process: while TensorFlow (or JAX) waits for the cluster it holds the GIL, so no Python thread of
# the waiting process runs. Exits quietly once its stdin closes (the parent joined the cluster, or died).
_WATCHDOG = r"""
import json, os, select, signal, socket, sys
parent, timeout, peers, what, otherwise = int(sys.argv[1]), float(sys.argv[2]), json.loads(sys.argv[3]), *sys.argv[4:]
if select.select([sys.stdin], [], [], timeout)[0]:
    sys.exit(0)
down = []
for name, address in peers:
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=2).close()
    except OSError as error:
        down.append(f"{name} at {address} ({error.strerror or error})")
reason = ("could not reach " + ", ".join(down)) if down else otherwise
print(f"error: {what} within {timeout:g} s: {reason}", file=sys.stderr, flush=True)
os.kill(parent, signal.SIGKILL)
"""


@contextlib.contextmanager
def _watchdog(timeout: float, peers: list[tuple[str, str]], what: str, otherwise: str) -> Iterator[None]:
    """Kill this process unless the block ends within ``timeout`` seconds, printing ``error: {what} within T s:``
    and the ``(name, "host:port")`` peers that do not answer on TCP, or ``otherwise`` when all do."""
    watchdog = subprocess.Popen(
        [sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(timeout), json.dumps(peers), what, otherwise],
        stdin=subprocess.PIPE,
    )
    assert watchdog.stdin is not None  # stdin=PIPE
    try:
        yield
    finally:
        watchdog.stdin.close()
        watchdog.wait()


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
    connect_timeout = _connect_timeout(connect_timeout)
    if collective_timeout is None and env.get("KERAS_VIT_COLLECTIVE_TIMEOUT"):
        collective_timeout = float(env["KERAS_VIT_COLLECTIVE_TIMEOUT"])
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=collective_timeout or None)
    peers = cluster_peers()
    stuck = (
        f"every peer answered on TCP ({', '.join(f'{n} at {a}' for n, a in peers)}) but the cluster did not form "
        "(a peer started with another TF_CONFIG, or is stuck)"
    )
    # the constructor runs an all-reduce over every task: it returns once the whole cluster is up
    with _watchdog(connect_timeout, peers, "multi-worker task did not join the cluster", stuck):
        return MultiWorkerMirroredStrategy(communication_options=options)


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
    return strategy.name if isinstance(strategy, KerasDistribution) else type(strategy).__name__.lstrip("_")


def training_scope(strategy: Strategy) -> contextlib.AbstractContextManager:
    """Where ``model.fit`` / ``evaluate`` run: in a keras.distribution's scope (it splits the batch over the devices);
    a tf.distribute model needs none (it keeps its strategy)."""
    return strategy.scope() if isinstance(strategy, KerasDistribution) else contextlib.nullcontext()

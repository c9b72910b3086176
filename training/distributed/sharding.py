"""Input sharded at the source: worker ``k`` of N builds part ``k`` of every global batch (:class:`Shard`), reading
only its own files, and hands it to ``model.fit`` (docs/distributed.md)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf

from keras_vit.training.distributed.strategy import KerasDistribution, Strategy

__all__ = ["WHOLE", "Shard", "distribute_input", "gather_over_workers", "input_shard", "part_range"]


@dataclasses.dataclass(frozen=True)
class Shard:
    """Part ``index`` of ``count`` of the input: this worker's share of every global batch."""

    index: int = 0
    count: int = 1

    def __post_init__(self):
        if not 0 <= self.index < self.count:
            raise ValueError(f"A shard needs 0 <= index < count, got index {self.index} of {self.count}.")

    def local_batch(self, batch_size: int) -> int:
        """This worker's part of a global batch of ``batch_size``."""
        if batch_size < 1 or batch_size % self.count:
            raise ValueError(f"The batch of {batch_size} does not split over {self.count} input workers.")
        return batch_size // self.count

    def parts(self, parts: int) -> range:
        """The parts of ``parts`` this worker reads (a multiple of ``count`` splits evenly; the rest as close)."""
        return range(self.index * parts // self.count, (self.index + 1) * parts // self.count)

    def span(self, size: int, parts: int) -> tuple[int, int]:
        """``[start, stop)`` of the items that :meth:`parts` of ``parts`` :func:`part_range` parts of ``size``
        items cover."""
        mine = self.parts(parts)
        if not mine:
            return 0, 0
        return part_range(size, mine.start, parts)[0], part_range(size, mine.stop - 1, parts)[1]


WHOLE = Shard()  # one worker reads all the input


def part_range(size: int, index: int, count: int) -> tuple[int, int]:
    """``[start, stop)`` of part ``index`` of ``count`` contiguous parts of ``size`` items, whose sizes differ by at
    most one, the larger first (the rule of ``tfds.even_splits``)."""
    base, extra = divmod(size, count)
    start = index * base + min(index, extra)
    return start, start + base + (index < extra)


def _tf_workers(strategy: tf.distribute.Strategy) -> tuple[int, int]:
    """``(this task's id, tasks)`` of a MultiWorkerMirroredStrategy's cluster (chief first); ``(0, 1)`` otherwise."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return 0, 1
    spec = resolver.cluster_spec().as_dict()
    tasks = [(role, i) for role in ("chief", "worker") for i in range(len(spec.get(role, [])))]
    if len(tasks) < 2:
        return 0, 1
    return tasks.index((resolver.task_type, resolver.task_id)), len(tasks)


def _jax_shard(strategy: KerasDistribution) -> Shard:
    """The block of the mesh's batch axis this JAX process's devices hold."""
    import jax

    distribution = strategy.distribution
    if distribution is None or jax.process_count() == 1:
        return Shard()
    mesh = distribution.device_mesh
    axis = mesh.axis_names.index(distribution.batch_dim_name)
    local = {f"{d.platform}:{d.id}" for d in jax.local_devices()}
    rows = sorted({position[axis] for position, device in np.ndenumerate(mesh.devices) if device in local})
    size = len(rows)
    if not rows or rows != list(range(rows[0], rows[0] + size)) or rows[0] % size:
        raise ValueError(
            f"JAX process {jax.process_index()} holds rows {rows} of the batch axis: its devices must hold one block "
            "of it for the process to feed its part of the batch."
        )
    return Shard(rows[0] // size, mesh.shape[axis] // size)


def input_shard(strategy: Strategy) -> Shard:
    """This worker's :class:`Shard` under ``strategy`` (``Shard()``: one worker reads everything)."""
    if isinstance(strategy, KerasDistribution):
        return _jax_shard(strategy) if keras.backend.backend() == "jax" else Shard()
    return Shard(*_tf_workers(strategy))


def distribute_input(strategy: Strategy, make: Callable[[Shard], tf.data.Dataset]):
    """What ``model.fit`` takes for the dataset ``make(shard)`` builds of this worker's part (batches of
    ``Shard.local_batch``): that dataset, or on a TensorFlow cluster a distributed dataset of every worker's."""
    shard = input_shard(strategy)
    if shard.count == 1 or isinstance(strategy, KerasDistribution):
        return make(shard)

    def worker_input(context: tf.distribute.InputContext) -> tf.data.Dataset:
        if (context.input_pipeline_id, context.num_input_pipelines) != (shard.index, shard.count):
            raise RuntimeError(
                f"TensorFlow made input pipeline {context.input_pipeline_id} of {context.num_input_pipelines} on the "
                f"worker that reads part {shard.index} of {shard.count}."
            )
        dataset = make(shard)
        local = tf.nest.flatten(dataset.element_spec)[0].shape[0]
        per_replica = context.get_per_replica_batch_size(local * shard.count)
        return dataset if per_replica == local else dataset.rebatch(per_replica)

    return strategy.distribute_datasets_from_function(worker_input)


def gather_over_workers(strategy: Strategy, values: np.ndarray) -> np.ndarray:
    """Every worker's ``values`` (a 1-D integer vector of the same length on each), one row per worker (TensorFlow
    task or JAX process); a collective, so every worker must call it. One row where there is one worker."""
    values = np.asarray(values, np.int64).reshape(-1)
    if isinstance(strategy, KerasDistribution):
        if keras.backend.backend() != "jax":
            return values[None]
        import jax
        from jax.experimental import multihost_utils

        if jax.process_count() == 1:
            return values[None]
        return np.asarray(multihost_utils.process_allgather(values.astype(np.int32))).astype(np.int64)
    index, count = _tf_workers(strategy)
    if count == 1:
        return values[None]
    rows = np.zeros((count, len(values)), np.float64)  # float64 all-reduce: integers below 2**53 stay exact
    rows[index] = values
    per_worker = strategy.num_replicas_in_sync // count  # every local replica adds the worker's rows
    local = strategy.experimental_distribute_values_from_function(lambda _: tf.constant(rows))
    total = strategy.reduce(tf.distribute.ReduceOp.SUM, local, axis=None)
    return np.rint(total.numpy() / per_worker).astype(np.int64)

"""Input sharded at the source (training/distributed/sharding.py, the pipelines' input shards): each worker builds
only its slice of every batch, the slices are disjoint, cover the data once per epoch and make up one process's
batches, and no worker opens an image file or a TFDS shard outside its part. In one process: a worker is a Shard."""

import contextlib
import os
import shutil
import threading

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from training_support import damaged_folder, write_images

from keras_vit.training import data as data_lib
from keras_vit.training.config import DataConfig
from keras_vit.training.data import Split, load_folder, load_tfds
from keras_vit.training.distributed.sharding import Shard, part_range
from keras_vit.training.errors import CorruptDataError
from keras_vit.training.pipeline import Augment, eval_dataset, eval_part_length, train_dataset

AUGMENT = Augment(
    8, DataConfig(crop_area=(0.5, 1.0), flip=True)
)  # keyed by position: the same for any number of workers


def batches(dataset: tf.data.Dataset, steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(images, example ids)`` of the first ``steps`` batches (the labels are one-hot example ids)."""
    return [(x.numpy(), np.argmax(y.numpy(), -1)) for x, y in dataset.take(steps)]


def id_split(n: int) -> Split:
    """``n`` images of 8x8 whose label is their id, each with its own pixels."""
    rng = np.random.default_rng(0)
    return Split(n, rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8), np.arange(n))


def test_parts_are_even_splits():
    assert [part_range(11, k, 3) for k in range(3)] == [(0, 4), (4, 8), (8, 11)]  # tfds.even_splits: 4, 4, 3
    assert [Shard(k, 2).parts(6) for k in range(2)] == [range(0, 3), range(3, 6)]
    assert [Shard(k, 2).span(10, 4) for k in range(2)] == [(0, 6), (6, 10)]  # parts of 3, 3, 2, 2
    assert Shard(1, 3).local_batch(12) == 4
    with pytest.raises(ValueError, match="The batch of 10 does not split over 3 input workers"):
        Shard(0, 3).local_batch(10)
    with pytest.raises(ValueError, match="0 <= index < count"):
        Shard(2, 2)


@pytest.mark.parametrize("workers", [2, 3])
def test_worker_slices_make_up_one_process_batches_and_cover_the_data_once_per_epoch(workers):
    """48 examples, batch 12, 6 input shards: every step the workers' slices, in worker order, are one process's
    batch (images too: the augmentation is keyed by position); each worker keeps to its own parts of the data;
    each epoch (4 steps) covers every example once; a worker restarted at a step goes on exactly."""
    n, batch, shards, steps = 48, 12, 6, 8
    split = id_split(n)
    one = batches(train_dataset(split, n, batch, AUGMENT, seed=5, input_shards=shards), steps)
    slices = []
    for k in range(workers):
        shard = Shard(k, workers)
        mine = batches(train_dataset(split, n, batch, AUGMENT, seed=5, shard=shard, input_shards=shards), steps)
        assert all(len(ids) == batch // workers for _, ids in mine)
        start, stop = shard.span(n, shards)
        assert {int(i) for _, ids in mine for i in ids} == set(range(start, stop))  # its part, all of it
        resumed = batches(
            train_dataset(split, n, batch, AUGMENT, seed=5, shard=shard, input_shards=shards, start_step=3), steps - 3
        )
        for (x, ids), (x_whole, ids_whole) in zip(resumed, mine[3:]):
            np.testing.assert_array_equal(ids, ids_whole)
            np.testing.assert_array_equal(x, x_whole)
        slices.append(mine)
    for step in range(steps):
        np.testing.assert_array_equal(np.concatenate([s[step][1] for s in slices]), one[step][1])
        np.testing.assert_array_equal(np.concatenate([s[step][0] for s in slices]), one[step][0])
    for epoch in range(2):
        ids = np.concatenate([ids for _, ids in one[4 * epoch : 4 * epoch + 4]])
        assert sorted(ids.tolist()) == list(range(n))
    one_part = batches(train_dataset(split, n, batch, AUGMENT, seed=5), steps)  # input_shards 1: another order
    assert not np.array_equal(np.concatenate([i for _, i in one_part]), np.concatenate([i for _, i in one]))


def test_input_shards_must_fit_the_batch_and_the_workers():
    split = id_split(48)
    with pytest.raises(ValueError, match="--input-shards 4 must divide the batch of 12 and be a multiple of the 3"):
        train_dataset(split, 48, 12, AUGMENT, shard=Shard(0, 3), input_shards=4)
    with pytest.raises(ValueError, match="--input-shards 4 must divide the batch of 10"):
        train_dataset(split, 48, 10, AUGMENT, input_shards=4)
    with pytest.raises(ValueError, match="--input-shards 12 is more than the 10 training examples"):
        train_dataset(id_split(10), 10, 12, AUGMENT, input_shards=12)


def test_each_worker_scores_its_part_of_the_held_out_set_in_whole_batches():
    """13 held-out examples, batch 6 over 3 workers: each scores its part (5, 4, 4) and blanks of weight 0 up to 3
    batches of 2; together every example once."""
    n, batch, workers = 13, 6, 3
    split = id_split(n)
    length = eval_part_length(n, batch, workers)
    assert length == 6
    scored = []
    for k in range(workers):
        parts = list(eval_dataset(split, n, batch, Augment(8), shard=Shard(k, workers)))
        assert len(parts) == length // 2 and all(x.shape[0] == 2 for x, _, _ in parts)
        weights = np.concatenate([w.numpy() for *_, w in parts])
        ids = np.concatenate([np.argmax(y.numpy(), -1) for _, y, _ in parts])[weights == 1]
        assert ids.tolist() == list(range(*part_range(n, k, workers)))
        scored += ids.tolist()
    assert sorted(scored) == list(range(n))


class ShardedIds(tfds.core.GeneratorBasedBuilder):
    """40 training and 12 test images, each split in 4 files; an image's label is its id."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        features = {"image": tfds.features.Image(shape=(4, 4, 3)), "label": tfds.features.ClassLabel(num_classes=40)}
        return tfds.core.DatasetInfo(
            builder=self, features=tfds.features.FeaturesDict(features), supervised_keys=("image", "label")
        )

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(40), "test": self._generate_examples(12)}

    def _generate_examples(self, count):
        for i in range(count):
            yield i, {"image": np.full((4, 4, 3), i, np.uint8), "label": i}


@pytest.fixture(scope="module")
def sharded_ids(tmp_path_factory) -> str:
    data_dir = str(tmp_path_factory.mktemp("tfds"))
    ShardedIds(data_dir=data_dir).download_and_prepare(download_config=tfds.download.DownloadConfig(num_shards=4))
    return data_dir


def stored(data_dir: str, splits) -> set[int]:
    """The ids of the examples in ``splits`` of the whole copy of sharded_ids (TFDS stores them shuffled)."""
    builder = tfds.builder("sharded_ids", data_dir=data_dir)
    return {int(label) for split in splits for _, label in builder.as_dataset(split=split, as_supervised=True)}


def test_a_worker_opens_only_the_tfds_shards_of_its_part(sharded_ids, tmp_path):
    """4 input shards, batch 8, 2 workers: in worker k's copy of the data only the files of its parts are left (2 of
    4 per split), and it trains two epochs and evaluates its part of the test split; its slices and the other's
    make up one process's batches, and each epoch (5 steps) covers the 40 examples once."""
    batch, shards, steps = 8, 4, 10
    one = batches(
        train_dataset(
            load_tfds("sharded_ids", data_dir=sharded_ids).train, 40, batch, AUGMENT, seed=1, input_shards=shards
        ),
        steps,
    )
    for epoch in range(2):
        assert sorted(np.concatenate([ids for _, ids in one[5 * epoch : 5 * epoch + 5]]).tolist()) == list(range(40))
    slices = []
    for k in range(2):
        shard, copy = Shard(k, 2), str(tmp_path / f"worker{k}")
        shutil.copytree(sharded_ids, copy)
        builder = tfds.builder("sharded_ids", data_dir=copy)
        parts = [tfds.even_splits("train", shards)[u] for u in shard.parts(shards)] + [tfds.even_splits("test", 2)[k]]
        needed = {os.path.basename(f.filename) for p in parts for f in builder.info.splits[p].file_instructions}
        removed = [f for f in os.listdir(builder.data_dir) if ".tfrecord" in f and f not in needed]
        assert len(needed) == len(removed) == 4
        for name in removed:
            os.remove(os.path.join(builder.data_dir, name))
        source = load_tfds("sharded_ids", data_dir=copy)
        mine = batches(train_dataset(source.train, 40, batch, AUGMENT, seed=1, shard=shard, input_shards=shards), steps)
        assert {int(i) for _, ids in mine for i in ids} == stored(sharded_ids, parts[:-1])  # its parts, all of them
        held_out = list(eval_dataset(source.eval, 40, batch, Augment(8), shard=shard))
        weights = np.concatenate([w.numpy() for *_, w in held_out])
        ids = np.concatenate([np.argmax(y.numpy(), -1) for _, y, _ in held_out])[weights == 1]
        assert sorted(ids.tolist()) == sorted(stored(sharded_ids, parts[-1:]))
        slices.append(mine)
    for step in range(steps):
        np.testing.assert_array_equal(np.concatenate([s[step][1] for s in slices]), one[step][1])
        np.testing.assert_allclose(np.concatenate([s[step][0] for s in slices]), one[step][0])


def garble(paths) -> None:
    for path in paths:
        with open(path, "wb") as file:
            file.write(b"not an image")


@pytest.mark.parametrize("workers", [2, 3])
def test_a_worker_opens_only_the_image_files_of_its_part(tmp_path, workers):
    """A copy of the folder where every file outside worker k's part is garbage: worker k loads it (its start-up
    check decodes only its own files), trains two epochs and evaluates without touching one of them; another
    worker's check fails on them."""
    root = str(tmp_path / "images")
    write_images(os.path.join(root, "train"), per_class=6)  # 18 training images, 6 input shards
    write_images(os.path.join(root, "val"), per_class=2, first=10)
    whole = load_folder(root)
    batch, shards = 6, 6
    for k in range(workers):
        shard = Shard(k, workers)
        copy = str(tmp_path / f"worker{k}")
        shutil.copytree(root, copy)
        train_span, eval_span = shard.span(18, shards), part_range(6, k, workers)
        train_paths = [p.replace(root, copy) for p in whole.train.items]
        eval_paths = [p.replace(root, copy) for p in whole.eval.items]
        garble(train_paths[: train_span[0]] + train_paths[train_span[1] :])
        garble(eval_paths[: eval_span[0]] + eval_paths[eval_span[1] :])
        source = load_folder(copy, shard=shard, input_shards=shards)
        assert list(source.train.items) == train_paths  # the same listing as one process's
        trained = batches(train_dataset(source.train, 3, batch, AUGMENT, shard=shard, input_shards=shards), 6)
        assert len(trained) == 6  # two epochs of 3 steps, every image decoded
        held_out = list(eval_dataset(source.eval, 3, batch, Augment(8), shard=shard))
        assert sum(float(w.numpy().sum()) for *_, w in held_out) == eval_span[1] - eval_span[0]
        other = Shard((k + 1) % workers, workers)
        with pytest.raises(CorruptDataError, match="image files do not decode"):
            load_folder(copy, shard=other, input_shards=shards)


class Threads:
    """``workers`` threads standing for workers, with a ``gather_over_workers`` of their own (a barrier)."""

    def __init__(self, workers: int):
        self.barrier, self.rows = threading.Barrier(workers), [None] * workers

    def gather(self, index: int):
        def gather(values: np.ndarray) -> np.ndarray:
            self.rows[index] = np.asarray(values)
            self.barrier.wait()
            rows = np.stack(self.rows)
            self.barrier.wait()
            return rows

        return gather


class InThread(contextlib.nullcontext):
    """A ThreadPoolExecutor that maps in the calling thread."""

    def __init__(self, workers: int):
        super().__init__(self)

    @staticmethod
    def map(function, items):
        return [function(item) for item in items]


def test_workers_check_only_their_files_and_agree_on_those_left_out(tmp_path, monkeypatch):
    """--skip-corrupt on 2 workers (threads): each decodes its part of each split, the files that leaving out the bad
    ones moved into its part, and nothing else; both leave out the same files and split the data as one process."""
    root = str(tmp_path / "images")
    damaged_folder(root)  # 12 good images, 2 bad
    one = load_folder(root, eval_fraction=0.25, skip_corrupt=True)
    opened: dict[int, set[str]] = {0: set(), 1: set()}
    decode, worker = data_lib.image_problem, threading.local()

    def image_problem(path):
        opened[worker.index].add(path)
        return decode(path)

    monkeypatch.setattr(data_lib, "image_problem", image_problem)
    monkeypatch.setattr(data_lib, "ThreadPoolExecutor", InThread)  # decode in the worker's thread, to tell whose
    threads, sources = Threads(2), {}

    def run(index: int) -> None:
        worker.index = index
        sources[index] = load_folder(
            root, 0.25, skip_corrupt=True, shard=Shard(index, 2), input_shards=2, gather=threads.gather(index)
        )

    workers = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join(60)
    assert sorted(sources) == [0, 1]
    for k, source in sources.items():
        assert list(source.train.items) == list(one.train.items) and list(source.eval.items) == list(one.eval.items)
        train, held = Shard(k, 2).span(len(one.train.items), 2), part_range(len(one.eval.items), k, 2)
        part = {*one.train.items[slice(*train)], *one.eval.items[slice(*held)]}
        assert part <= opened[k] and len(opened[k] - part) <= 2  # at most the 2 left out, or files they moved

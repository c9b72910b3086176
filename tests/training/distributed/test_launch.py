"""MultiWorkerMirroredStrategy for real: worker processes on 127.0.0.1 started by ``keras_vit.training.launch``.

Several workers equal one process, a killed worker stops the job and the rerun resumes from the chief's last
checkpoint, and an unreachable peer is named within the timeout. How each worker reads its own part of the input:
tests/training/distributed/test_sharding.py.
"""

from __future__ import annotations

import json
import os
import signal
import time

import numpy as np
import pytest
from training_support import (
    TINY_FLAGS,
    cluster_env,
    kill_each_worker_and_resume,
    launch,
    logged_losses,
    preempt_launcher,
    single,
    weights_difference,
)

from keras_vit.training.distributed.launch import free_ports

pytestmark = pytest.mark.backends("tensorflow")  # MultiWorkerMirroredStrategy
ENV = cluster_env("tensorflow")


@pytest.mark.slow
@pytest.mark.parametrize("workers", [2, 3])
def test_workers_on_localhost_equal_one_process(tmp_path, workers):
    """Same global batch of 24, SGD with an active global-norm clip: same per-step losses and final weights. The
    workers read the digits in one input shard each; the single process reads them in as many."""
    flags = [*TINY_FLAGS, "--steps", "6", "--eval-every", "3", "--checkpoint-every", "2"]
    single([*flags, "--input-shards", str(workers)], str(tmp_path / "one"), ENV)
    started = time.time()
    status, output = launch(
        ["--workers", str(workers), "--connect-timeout", "120", "--", *flags, "--output-dir", str(tmp_path / "many")],
        ENV,
    )
    assert status == 0, output[-5000:]
    print(f"{workers} workers: {time.time() - started:.1f} s")
    metrics = json.loads((tmp_path / "many" / "metrics.json").read_text())
    assert metrics["replicas"] == workers and metrics["strategy"] == "MultiWorkerMirroredStrategy"
    one, many = logged_losses(str(tmp_path / "one")), logged_losses(str(tmp_path / "many"))
    assert len(many) == len(one) == 6
    difference = weights_difference(str(tmp_path / "one"), str(tmp_path / "many"))
    print(f"max loss difference {np.abs(one - many).max():.2e}, max weight difference {difference:.2e}")
    np.testing.assert_allclose(many, one, atol=1e-5)
    assert difference < 1e-5
    expected = json.loads((tmp_path / "one" / "metrics.json").read_text())["eval"]
    assert metrics["eval"]["accuracy"] == pytest.approx(expected["accuracy"], abs=1e-6)
    # only the chief wrote outputs; no worker scratch is left behind
    assert sorted(os.listdir(tmp_path)) == ["many", "one"]
    assert {"checkpoints", "tensorboard", "train_log.jsonl", "model.keras", "metrics.json"} <= set(
        os.listdir(tmp_path / "many")
    )


KILL_FLAGS = [*TINY_FLAGS, "--steps", "150", "--eval-every", "1000", "--checkpoint-every", "10", "--verbose", "2"]


@pytest.mark.slow
def test_a_killed_worker_stops_the_job_and_the_rerun_resumes_exactly(tmp_path):
    """SIGKILL worker 1 mid-run, then the chief mid-rerun: each time the launcher fails naming the worker and stops
    the other; each rerun resumes from the chief's last checkpoint, and the run's per-step losses and final weights
    equal those of an uninterrupted 2-worker run (over 150 steps a single process drifts by ~1e-4: float sums in
    another order)."""
    whole, run, scratch = str(tmp_path / "whole"), str(tmp_path / "run"), tmp_path / "tmp"
    args = ["--workers", "2", "--connect-timeout", "120", "--", *KILL_FLAGS, "--output-dir"]
    status, output = launch([*args, whole], ENV)
    assert status == 0, output[-5000:]
    scratch.mkdir()  # the workers' temporary folder: their own, not another test's running beside this one
    env = {**ENV, "TMPDIR": str(scratch)}

    def check(killed: int, output: str) -> None:
        assert f"worker {killed} failed" in output
        if killed == 0:  # the surviving worker, stopped by the launcher, removed its scratch
            assert not [p for p in os.listdir(scratch) if p.startswith("keras_vit_worker_")]

    kill_each_worker_and_resume([*args, run], env, run, 150, (40, 90), check)
    difference = weights_difference(whole, run)
    resumed, whole_losses = logged_losses(run), logged_losses(whole)
    print(f"max loss difference {np.abs(whole_losses - resumed).max():.2e}, max weight difference {difference:.2e}")
    assert difference == 0.0  # the resumed run computes exactly what the uninterrupted one did
    # train_log's per-step loss is a difference of Keras' float32 running epoch means, and the resumed epoch
    # starts at the checkpoint: the logged values differ by rounding (measured 2.5e-5 relative)
    np.testing.assert_allclose(resumed, whole_losses, rtol=1e-4)
    assert sorted(os.listdir(tmp_path)) == ["run", "tmp", "whole"]
    assert not [p for p in os.listdir(scratch) if p.startswith("keras_vit_worker_")]  # the resumed runs' too


@pytest.mark.slow
def test_a_signal_to_the_launcher_stops_every_worker_at_one_checkpointed_step(tmp_path):
    """SIGTERM to the launcher (a preemption): forwarded to the workers, which stop at the same update; the chief
    writes its checkpoint, each worker says so, and the launcher exits 1 once they have ended."""
    preempt_launcher(str(tmp_path / "run"), ENV)


def test_an_unreachable_peer_fails_within_the_timeout_naming_its_address(tmp_path):
    own, absent = free_ports(2)
    started = time.time()
    status, output = launch(
        [
            "--hosts",
            f"127.0.0.1:{own},127.0.0.1:{absent}",
            "--index",
            "0",
            "--connect-timeout",
            "5",
            "--",
            *TINY_FLAGS,
            "--steps",
            "2",
            "--output-dir",
            str(tmp_path / "run"),
        ],
        ENV,
        timeout=120,
    )
    elapsed = time.time() - started
    assert status == 128 + signal.SIGKILL, output[-3000:]  # the watchdog killed the waiting worker
    assert f"could not reach worker 1 at 127.0.0.1:{absent}" in output
    assert "within 5 s" in output
    assert elapsed < 60  # TensorFlow start-up plus the 5 s timeout, not a hang

"""Multi-process JAX for real: JAX processes on 127.0.0.1 started by ``keras_vit.training.launch`` under
``KERAS_BACKEND=jax`` (``jax.distributed`` with gloo's CPU collectives, ``keras.distribution.DataParallel`` over
every process's CPU device, each process reading its own part of the input).

2 and 3 processes equal one process reading the same input shards; a SIGKILLed process stops the job and the rerun
resumes from the chief's last checkpoint to the uninterrupted result; a SIGTERM to the launcher stops every process at
one checkpointed step; an unreachable coordinator is named within the timeout.
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
    checkpoint_steps,
    cluster_env,
    kill_each_worker_and_resume,
    launch,
    logged_losses,
    preempt_launcher,
    single,
    weights_difference,
)

from keras_vit.training.distributed.launch import free_ports

# The parent only starts and reads the runs (the TensorFlow test pass); the processes are JAX.
pytestmark = [pytest.mark.backends("tensorflow"), pytest.mark.requires("jax")]
ENV = cluster_env("jax")
FLAGS = TINY_FLAGS
KILL_FLAGS = [
    *FLAGS,
    "--steps=60",
    "--eval-every=10",
    "--checkpoint-every=10",
    "--verbose=2",
]  # evaluations on checkpoint steps


def workers(count: int, flags: list[str], output_dir: str) -> list[str]:
    """The launcher's arguments for ``count`` local JAX processes."""
    return ["--workers", str(count), "--connect-timeout", "120", "--", *flags, "--output-dir", output_dir]


@pytest.mark.slow
@pytest.mark.parametrize("count", [2, 3])
def test_jax_processes_on_localhost_equal_one_process(tmp_path, count):
    """Global batch 24 over ``count`` processes, SGD with an active global-norm clip: the per-step losses, final
    weights and held-out scores of one process that reads the digits in as many input shards."""
    flags = [*FLAGS, "--steps=6", "--eval-every=3", "--checkpoint-every=2"]
    one, many = str(tmp_path / "one"), str(tmp_path / "many")
    single([*flags, f"--input-shards={count}"], one, ENV)
    started = time.time()
    status, output = launch(workers(count, flags, many), ENV)
    assert status == 0, output[-5000:]
    metrics = json.loads((tmp_path / "many" / "metrics.json").read_text())
    assert (metrics["backend"], metrics["strategy"], metrics["replicas"]) == ("jax", "DataParallel", count)
    assert len(logged_losses(many)) == len(logged_losses(one)) == 6
    losses, weights = np.abs(logged_losses(one) - logged_losses(many)).max(), weights_difference(one, many)
    print(f"{count} JAX processes: {time.time() - started:.1f} s; losses {losses:.1e}, weights {weights:.1e} apart")
    assert losses < 1e-5 and weights < 1e-5
    expected = json.loads((tmp_path / "one" / "metrics.json").read_text())["eval"]
    assert metrics["eval"]["accuracy"] == pytest.approx(expected["accuracy"], abs=1e-6)
    assert metrics["eval"]["loss"] == pytest.approx(expected["loss"], rel=1e-5)  # blanks of weight 0 not counted
    # only the chief (process 0) wrote outputs; the others' scratch folders are gone
    assert sorted(os.listdir(tmp_path)) == ["many", "one"] and checkpoint_steps(many) == [2, 4, 6]
    assert {"run.json", "tensorboard", "train_log.jsonl", "model.keras"} <= set(os.listdir(many))


@pytest.mark.slow
def test_model_parallel_within_each_of_two_processes_equals_one_process_on_four_devices(tmp_path):
    """2 processes of 2 CPU devices, --model-devices 2 (each process holds one (batch, model) row of the mesh): the
    weights of one process on 4 devices; a model axis across the processes is refused, naming the fix."""
    flags = [*FLAGS, "--steps=3", "--eval-every=3", "--strategy=model_parallel", "--model-devices=2"]
    one, many = str(tmp_path / "one"), str(tmp_path / "many")
    single([*flags, "--cpu-devices=4", "--input-shards=2"], one, ENV)
    status, output = launch(workers(2, [*flags, "--cpu-devices=2"], many), ENV)
    assert status == 0, output[-5000:]
    metrics = json.loads((tmp_path / "many" / "metrics.json").read_text())
    assert (metrics["strategy"], metrics["replicas"]) == ("ModelParallel", 2)
    difference = weights_difference(one, many)
    print(f"model parallel in 2 processes: weights {difference:.1e} apart")
    assert difference < 1e-5
    status, output = launch(workers(2, flags, str(tmp_path / "across")), ENV)  # one device each: the axis spans both
    assert status == 1 and "--model-devices 2 would span JAX processes (1 devices per process)" in output


@pytest.mark.slow
def test_a_signal_to_the_launcher_stops_every_process_at_one_checkpointed_step(tmp_path):
    """SIGTERM to the launcher: forwarded to both JAX processes, which agree (an allgather every update) and stop at
    the same one; process 0 checkpoints it; each says so; status 1."""
    preempt_launcher(str(tmp_path / "run"), ENV)


@pytest.mark.slow
def test_a_killed_jax_process_stops_the_job_and_the_rerun_resumes_exactly(tmp_path):
    """SIGKILL process 1 of 2 mid-run, then the chief (process 0) mid-rerun: each time the launcher fails and stops
    the other; each rerun resumes every process from the chief's checkpoint, and the run ends where an uninterrupted
    2-process run did."""
    whole, run = str(tmp_path / "whole"), str(tmp_path / "run")
    status, output = launch(workers(2, KILL_FLAGS, whole), ENV)
    assert status == 0, output[-5000:]

    def check(killed: int, output: str) -> None:
        assert "failed with status" in output, output[-3000:]

    kill_each_worker_and_resume(workers(2, KILL_FLAGS, run), ENV, run, 60, (25, 45), check)
    losses, weights = logged_losses(whole), weights_difference(whole, run)
    print(f"killed each process and resumed: weights {weights:.1e} apart")
    assert weights < 1e-6
    np.testing.assert_allclose(logged_losses(run), losses, rtol=1e-5)
    assert sorted(os.listdir(tmp_path)) == ["run", "whole"]


def test_an_unreachable_coordinator_fails_within_the_timeout_naming_its_address(tmp_path):
    absent, own = free_ports(2)
    started = time.time()
    hosts = ["--hosts", f"127.0.0.1:{absent},127.0.0.1:{own}", "--index", "1", "--connect-timeout", "5"]
    run = ["--", *FLAGS, "--steps=2", "--output-dir", str(tmp_path / "run")]
    status, output = launch([*hosts, *run], ENV, timeout=120)
    elapsed = time.time() - started
    assert status == 128 + signal.SIGKILL, output[-3000:]  # the watchdog killed the waiting process
    expected = "JAX process 1 of 2 did not join the others within 5 s: could not reach the coordinator (process 0) at"
    assert f"{expected} 127.0.0.1:{absent}" in output, output[-3000:]
    assert elapsed < 60  # start-up plus the 5 s timeout, not JAX's own 5 minutes

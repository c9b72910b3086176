"""Worker processes of a multi-worker run: their environment, starting, output, signals and stopping.

The command is :mod:`keras_vit.training.launch`; docs/distributed.md describes both.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence

__all__ = [
    "JOB_ADDRESSES",
    "NUM_PROCESSES",
    "PROCESS_ID",
    "Worker",
    "free_ports",
    "keras_backend",
    "run",
    "tf_config",
    "worker_env",
]

GRACE_SECONDS = 10.0
PREEMPT_SECONDS = 120.0  # how long forwarded signals give the workers to checkpoint and end
BACKENDS = ("tensorflow", "jax")  # the backends a worker can run
# keras.distribution.initialize's variables: what a JAX worker reads (strategy.jax_processes).
JOB_ADDRESSES = "KERAS_DISTRIBUTION_JOB_ADDRESSES"
NUM_PROCESSES = "KERAS_DISTRIBUTION_NUM_PROCESSES"
PROCESS_ID = "KERAS_DISTRIBUTION_PROCESS_ID"


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports free on ``host`` now (the OS's choice; another program may take one later)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def tf_config(addresses: Sequence[str], index: int) -> str:
    """The ``TF_CONFIG`` of worker ``index`` of a cluster of ``addresses`` (worker 0 is the chief)."""
    return json.dumps({"cluster": {"worker": list(addresses)}, "task": {"type": "worker", "index": index}})


def keras_backend(env: Mapping[str, str] | None = None) -> str:
    """The Keras backend a worker will run: ``KERAS_BACKEND``, else the one of ``keras.json`` (in ``KERAS_HOME`` or
    ``~/.keras``), else TensorFlow."""
    env = os.environ if env is None else env
    if env.get("KERAS_BACKEND"):
        return env["KERAS_BACKEND"]
    home = env.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    with contextlib.suppress(OSError, ValueError, AttributeError), open(os.path.join(home, "keras.json")) as file:
        return json.load(file).get("backend") or "tensorflow"
    return "tensorflow"


def worker_env(
    addresses: Sequence[str],
    index: int,
    *,
    connect_timeout: float,
    collective_timeout: float | None,
    gpus: str | None,
    backend: str = "tensorflow",
) -> dict[str, str]:
    """The environment of a worker process: ``TF_CONFIG`` (TensorFlow) or ``KERAS_DISTRIBUTION_*`` (JAX), the
    timeouts, and its GPUs (``None``: inherited)."""
    env = {**os.environ, "KERAS_VIT_CONNECT_TIMEOUT": str(connect_timeout), "PYTHONUNBUFFERED": "1"}
    if backend == "jax":
        env.update({JOB_ADDRESSES: ",".join(addresses), NUM_PROCESSES: str(len(addresses)), PROCESS_ID: str(index)})
    else:
        env["TF_CONFIG"] = tf_config(addresses, index)
    if collective_timeout:
        env["KERAS_VIT_COLLECTIVE_TIMEOUT"] = str(collective_timeout)
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    return env


@dataclasses.dataclass
class Worker:
    """A started worker process and the thread copying its output."""

    index: int
    process: subprocess.Popen
    reader: threading.Thread


def _copy_output(index: int, stream, lock: threading.Lock) -> None:
    for line in stream:
        with lock:
            sys.stdout.write(f"[worker {index}] {line}" if line.endswith("\n") else f"[worker {index}] {line}\n")
            sys.stdout.flush()
    stream.close()


def _start(index: int, command: list[str], env: dict[str, str], lock: threading.Lock) -> Worker:
    process = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    reader = threading.Thread(target=_copy_output, args=(index, process.stdout, lock), daemon=True)
    reader.start()
    return Worker(index, process, reader)


def _stop(workers: Sequence[Worker], grace: float = GRACE_SECONDS) -> None:
    """SIGTERM every running worker's process group, SIGKILL what is left after ``grace`` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, grace)):
        running = [w for w in workers if w.process.poll() is None]
        for worker in running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.process.pid, sig)
        deadline = time.monotonic() + wait
        for worker in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.process.wait(max(0.0, deadline - time.monotonic()))


def _status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def run(
    command: Sequence[str],
    addresses: Sequence[str],
    indices: Sequence[int],
    *,
    connect_timeout: float = 600,
    collective_timeout: float | None = None,
    gpus_per_worker: int | None = 0,
    timeout: float | None = None,
    backend: str = "tensorflow",
) -> int:
    """Run ``command`` as the tasks ``indices`` of the cluster ``addresses`` on ``backend``; return the exit status
    (0: all succeeded; a failed worker's status; 124 past ``timeout`` seconds). Workers are always stopped on
    return."""
    lock = threading.Lock()
    workers: list[Worker] = []
    started = time.monotonic()
    received: list[int] = []

    def forward(number, frame):
        received.append(number)
        for worker in workers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.process.pid, number)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {number: signal.signal(number, forward) for number in (signal.SIGTERM, signal.SIGINT)}
    try:
        for slot, index in enumerate(indices):
            gpus = None
            if gpus_per_worker is not None:
                gpus = ",".join(str(slot * gpus_per_worker + g) for g in range(gpus_per_worker))
            env = worker_env(
                addresses,
                index,
                connect_timeout=connect_timeout,
                collective_timeout=collective_timeout,
                gpus=gpus,
                backend=backend,
            )
            workers.append(_start(index, list(command), env, lock))
        while True:
            codes = {w.index: w.process.poll() for w in workers}
            if received:
                return _preempted(workers, signal.Signals(received[0]).name)
            failed = [(i, c) for i, c in codes.items() if c not in (None, 0)]
            if failed:
                index, code = failed[0]
                print(f"launch: worker {index} failed with status {_status(code)}; stopping the others", flush=True)
                return _status(code)
            if all(c == 0 for c in codes.values()):
                return 0
            if timeout is not None and time.monotonic() - started > timeout:
                print(f"launch: the workers did not finish within {timeout:g} s; stopping them", flush=True)
                return 124
            time.sleep(0.2)
    finally:
        _stop(workers)
        for worker in workers:
            worker.reader.join(5)
        for number, handler in previous.items():
            signal.signal(number, handler)


def _preempted(workers: Sequence[Worker], name: str) -> int:
    """Wait up to :data:`PREEMPT_SECONDS` for the workers a signal was forwarded to; the chief's status."""
    print(f"launch: {name} forwarded to the workers; waiting for the chief's checkpoint", flush=True)
    deadline = time.monotonic() + PREEMPT_SECONDS
    for worker in workers:
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.process.wait(max(0.0, deadline - time.monotonic()))
    code = workers[0].process.poll() if workers else None
    status = 128 + signal.Signals[name] if code in (None, 0) else _status(code)
    print(f"launch: stopped by {name}; exit status {status}", flush=True)
    return status

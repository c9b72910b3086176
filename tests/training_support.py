"""Shared pieces of the training tests: a tiny model config, image folders, a crash callback, running Python in a
subprocess on a chosen backend, and running ``keras_vit.training.launch`` (multi-worker runs on 127.0.0.1)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import keras
import numpy as np
from PIL import Image

COLOURS = ((220, 30, 30), (30, 220, 30), (30, 30, 220))  # class k is bright in channel k
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A ViT small enough that a few steps take well under a second on a CPU. float32: the tests compare runs to
# float tolerances (what --mixed-precision auto picks is tested on its own).
TINY = dict(
    model="Ti/4",
    image_size=8,
    hidden_size=16,
    depth=1,
    num_heads=2,
    mlp_dim=32,
    batch_size=16,
    eval_every=5,
    warmup=2,
    verbose=0,
    crop_area=(0.6, 1.0),
    mixed_precision="none",
)

# The model part of TINY as command-line flags.
TINY_MODEL_FLAGS = [
    f"--{name.replace('_', '-')}={TINY[name]}"
    for name in ("model", "image_size", "hidden_size", "depth", "num_heads", "mlp_dim")
]


def backend_env(backend: str = "tensorflow", host_devices: int | None = None) -> dict[str, str]:
    """The environment of a subprocess on ``backend`` (``host_devices``: XLA's CPU split into that many devices)."""
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": REPO}
    if host_devices:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={host_devices}".strip()
    return env


def python_json(code: str, timeout: int = 300, backend: str = "tensorflow", host_devices: int | None = None):
    """Run ``code`` in a fresh Python on ``backend`` (the backend, and device set-up, are fixed at start); return
    the JSON value it prints on its last line."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=backend_env(backend, host_devices),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def read_log(output_dir: str) -> list[dict]:
    with open(os.path.join(output_dir, "train_log.jsonl")) as file:
        return [json.loads(line) for line in file if line.strip()]


def iterations(model: keras.Model) -> int:
    """The optimizer's update counter, on any backend."""
    return int(keras.ops.convert_to_numpy(model.optimizer.iterations))


def checkpoint_steps(output_dir: str) -> list[int]:
    """The steps of the run's checkpoints (``checkpoints/ckpt-<step>.npz``), ascending."""
    from keras_vit.training.checkpoint import checkpoint_steps as steps

    return steps(os.path.join(output_dir, "checkpoints"))


# A tiny run of a launched cluster: global batch 24, SGD with a global-norm clip that is active on every step, in
# float32 (auto is bfloat16 on CPUs with AMX or AVX512_BF16 under TensorFlow, where one process and several differ by
# the rounding of partial sums, 1e-5 here, rather than 1e-9).
TINY_FLAGS = [
    *TINY_MODEL_FLAGS,
    "--mixed-precision=none",
    "--batch-size=24",
    "--warmup=2",
    "--verbose=0",
    "--crop-area=0.6,1.0",
    "--optimizer=sgd",
    "--lr=0.1",
    "--clip-norm=0.05",
    "--weight-decay=0",
    "--log-every=1",
]


def cluster_env(backend: str) -> dict[str, str]:
    """The environment of a launcher on ``backend`` whose workers have one CPU device each."""
    return {**backend_env(backend), "CUDA_VISIBLE_DEVICES": ""}


def children(pid: int) -> list[int]:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{pid}/children") as file:
        return [int(p) for p in file.read().split()]
    return []


def process_state(pid: int) -> str:
    """``/proc``'s state letter of ``pid`` (``"Z"``: a zombie), or ``"gone"``."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as file:
        return file.read().rsplit(")", 1)[1].split()[0]
    return "gone"


def worker_pid(launcher: int, index: int) -> int | None:
    """The pid of the launcher's worker ``index`` (from its TF_CONFIG, or its KERAS_DISTRIBUTION_PROCESS_ID)."""
    for pid in children(launcher):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/environ", "rb") as file:
            env = dict(v.split(b"=", 1) for v in file.read().split(b"\0") if b"=" in v)
            if b"TF_CONFIG" in env and json.loads(env[b"TF_CONFIG"])["task"]["index"] == index:
                return pid
            if env.get(b"KERAS_DISTRIBUTION_PROCESS_ID") == str(index).encode():
                return pid
    return None


@contextlib.contextmanager
def launched(args: list[str], env: dict[str, str]):
    """The launcher running ``args``; it and its workers are killed on the way out, whatever happened."""
    process = subprocess.Popen(
        [sys.executable, "-m", "keras_vit.training.launch", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    workers: set[int] = set()
    try:
        yield process, workers
    finally:
        workers.update(children(process.pid))
        for pid in [process.pid, *workers]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        process.communicate(timeout=30)


def launch(args: list[str], env: dict[str, str], timeout: float = 240) -> tuple[int, str]:
    """Run the launcher to the end (bounded); return its status and output."""
    with launched(args, env) as (process, _):
        output, _ = process.communicate(timeout=timeout)
        return process.returncode, output


def single(flags: list[str], output_dir: str, env: dict[str, str], timeout: float = 240) -> None:
    """``python -m keras_vit.training.finetune`` on one device, to the end."""
    command = [sys.executable, "-m", "keras_vit.training.finetune", *flags, "--strategy=default"]
    done = subprocess.run(
        [*command, "--output-dir", output_dir], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-3000:]


def weights_difference(a: str, b: str) -> float:
    """The largest difference between the weights of two runs' ``model.keras``."""
    import keras_vit  # noqa: F401  (registers the layers of model.keras)

    left, right = (keras.saving.load_model(os.path.join(d, "model.keras")).get_weights() for d in (a, b))
    return max(float(np.abs(x - y).max()) for x, y in zip(left, right))


def logged_losses(output_dir: str) -> np.ndarray:
    """The per-step losses of a run's ``train_log.jsonl``."""
    return np.array([entry["loss"] for entry in read_log(output_dir)])


def preempt_launcher(run: str, env: dict[str, str]) -> int:
    """SIGTERM to a launcher of 2 workers after 5 of 300 steps: check that both stop at one step, the chief's
    checkpoint of it the only one, each worker and the launcher saying so, status 1; return the step."""
    flags = [*TINY_FLAGS, "--steps", "300", "--eval-every", "1000", "--checkpoint-every", "1000"]
    with launched(["--workers", "2", "--connect-timeout", "120", "--", *flags, "--output-dir", run], env) as (
        process,
        workers,
    ):
        pids = running_workers(process, workers, run, 5, 180)
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=150)
    assert process.returncode == 1, output[-5000:]
    step = int(re.search(r"\[worker 0\] error: stopped by SIGTERM at step (\d+): the checkpoint", output)[1])
    assert f"[worker 1] error: stopped by SIGTERM at step {step}: " in output
    assert 5 <= step < 300 and checkpoint_steps(run) == [step]  # the only checkpoint: the one of the signal
    assert output.rstrip().endswith("launch: stopped by SIGTERM; exit status 1")
    assert all(process_state(pid) in ("gone", "Z") for pid in pids)
    return step


def running_workers(process: subprocess.Popen, workers: set[int], run: str, steps: int, seconds: float) -> list[int]:
    """The pids of a launcher's 2 workers (added to ``workers``) once ``run`` has logged ``steps`` steps (or after
    ``seconds``, or when the launcher ended)."""
    deadline = time.time() + seconds
    while time.time() < deadline and process.poll() is None:
        if os.path.exists(os.path.join(run, "train_log.jsonl")) and len(read_log(run)) >= steps:
            break
        time.sleep(0.02)
    pids = [worker_pid(process.pid, i) for i in (0, 1)]
    workers.update(p for p in pids if p)
    return pids


def kill_each_worker_and_resume(
    args: list[str], env: dict[str, str], run: str, steps: int, at: tuple[int, int], check: Callable[[int, str], None]
) -> None:
    """SIGKILL worker 1 once ``run`` has logged ``at[0]`` of its ``steps``, then, in the rerun, worker 0 (the chief)
    at ``at[1]``: each time the launcher fails and stops the survivor, and the rerun says it resumes from the chief's
    last checkpoint (one every 10 steps); a last rerun ends the run, every step logged once. ``args`` carry
    ``--verbose 2`` (the resume line). ``check(killed, output)`` runs after each kill."""
    resumed_from = 0
    for killed, logged in zip((1, 0), at):
        with launched(args, env) as (process, workers):
            pids = running_workers(process, workers, run, logged, 300)
            assert all(pids) and len(read_log(run)) < steps, "the run ended before it could be killed"
            os.kill(pids[killed], signal.SIGKILL)
            output, _ = process.communicate(timeout=120)
        assert process.returncode != 0, output[-3000:]
        assert all(process_state(pid) in ("gone", "Z") for pid in pids)  # the launcher stopped the survivor
        check(killed, output)
        assert resumed_from == 0 or f"resuming at step {resumed_from} of {steps} from " in output, output[-3000:]
        resumed_from = checkpoint_steps(run)[-1]
        assert logged - 10 < resumed_from < steps  # the last checkpoint before the kill, or a later one
    status, output = launch(args, env)
    assert status == 0, output[-5000:]
    assert f"resuming at step {resumed_from} of {steps} from " in output, output[-3000:]
    with open(os.path.join(run, "metrics.json")) as file:
        assert json.load(file)["resumed_from_step"] == resumed_from
    assert [e["step"] for e in read_log(run)] == list(range(1, steps + 1))


class Crash(keras.callbacks.Callback):
    """Simulates the process dying after ``at`` batches."""

    def __init__(self, at: int):
        super().__init__()
        self.at, self.seen = at, 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen == self.at:
            raise RuntimeError("simulated crash")


def write_images(root, per_class=4, names=("cat", "dog", "emu"), first=0):
    """Class folders of PNG/JPEG files of several sizes, coloured by class."""
    rng = np.random.default_rng(first)
    for label, name in enumerate(names):
        os.makedirs(os.path.join(root, name), exist_ok=True)
        for i in range(per_class):
            h, w = 10 + 3 * i, 14 - 2 * i
            pixels = np.clip(np.array(COLOURS[label]) + rng.integers(-20, 20, (h, w, 3)), 0, 255).astype(np.uint8)
            ext = "png" if i % 2 else "jpg"
            Image.fromarray(pixels).save(os.path.join(root, name, f"{first + i}.{ext}"))
    with open(os.path.join(root, names[0], "notes.txt"), "w") as file:
        file.write("not an image")


def damaged_folder(root):
    """Three classes of good images, plus a truncated JPEG and a text file named .png; returns the bad paths."""
    write_images(root, per_class=4)
    truncated, text = os.path.join(root, "dog", "cut.jpg"), os.path.join(root, "emu", "letter.png")
    with open(os.path.join(root, "dog", "0.jpg"), "rb") as file:
        data = file.read()
    with open(truncated, "wb") as file:
        file.write(data[: len(data) // 2])
    with open(text, "w") as file:
        file.write("not an image at all")
    return truncated, text

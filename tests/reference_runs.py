"""Reference outputs from timm and transformers, run in an interpreter of their own (TensorFlow and torch in one
process crash): the scripts and the helpers the checkpoint tests share."""

import atexit
import json
import select
import subprocess
import sys
import textwrap

import numpy as np
from sklearn.datasets import load_sample_image

TIMM_SCRIPT = """
import json, sys
import numpy as np
import timm, torch
from safetensors.torch import save_file
torch.manual_seed(0)
torch.set_num_threads(2)
for job in json.load(open(sys.argv[1])):
    model = timm.create_model(job["model"], pretrained=False, **job["kwargs"]).eval()
    if "load" in job:
        from safetensors.torch import load_file
        model.load_state_dict(load_file(job["load"]))
    else:
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.add_(torch.randn_like(p) * (0.2 if p.ndim == 1 else 0.05))
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        if job["save"].endswith(".safetensors"):
            save_file(state, job["save"])
        else:
            torch.save(state, job["save"])
    images = torch.from_numpy(np.load(job["images"])).permute(0, 3, 1, 2)
    with torch.no_grad():
        np.save(job["logits"], model(images).numpy())
"""


def photos(size: int, count: int = 2) -> np.ndarray:
    """``count`` crops of scikit-learn's china.jpg, scaled to [-1, 1]."""
    image = load_sample_image("china.jpg").astype("float32")
    crops = [image[40 + 90 * i : 40 + 90 * i + size, 100 + 130 * i : 100 + 130 * i + size] for i in range(count)]
    return (np.stack(crops) - 127.5) / 127.5


# Runs each script it reads on stdin (a JSON line: source and arguments) as ``__main__`` and answers a JSON line. It
# imports torch and timm once for the whole test process (about 10 s of CPU each time); the scripts seed their own
# random numbers. After a script that imported TensorFlow (keras_vit) it answers and ends, and the next script gets
# a new server: TensorFlow and timm in one process crash.
SERVER = """
import contextlib, importlib.util, io, json, sys, traceback
import numpy, torch
if importlib.util.find_spec("timm"):  # the transformers scripts need no timm
    import timm
for line in sys.stdin:
    request, output = json.loads(line), io.StringIO()
    sys.argv = ["-c", *request["args"]]
    try:
        with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
            exec(compile(request["script"], "<reference script>", "exec"), {"__name__": "__main__"})
        reply = {"ok": True}
    except BaseException as error:
        failed = not isinstance(error, SystemExit) or error.code not in (0, None)
        reply = {"ok": not failed, "error": output.getvalue()[-2000:] + traceback.format_exc()}
    reply["last"] = "tensorflow" in sys.modules
    print(json.dumps(reply), flush=True)
    if reply["last"]:
        break
"""
_server: list[subprocess.Popen] = []


def _reference_server() -> subprocess.Popen:
    """The running server of this test process, started if there is none."""
    if not _server or _server[0].poll() is not None:
        process = subprocess.Popen(
            [sys.executable, "-c", SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        atexit.register(process.kill)
        _server[:] = [process]
    return _server[0]


def run_reference(script: str, *args, timeout: float = 600) -> None:
    """Run a reference script as ``__main__`` with ``args`` in the reference interpreter (its test is marked
    ``requires`` for the script's library); an ``AssertionError`` with its traceback when it fails."""
    server = _reference_server()
    server.stdin.write(json.dumps({"script": textwrap.dedent(script), "args": [str(a) for a in args]}) + "\n")
    server.stdin.flush()
    if not select.select([server.stdout], [], [], timeout)[0]:
        server.kill()
        server.wait()
        raise AssertionError(f"the reference script ran past {timeout} s")
    line = server.stdout.readline()
    if not line:
        raise AssertionError(f"the reference interpreter ended with status {server.wait()}")
    reply = json.loads(line)
    if reply["last"]:
        server.kill()
        server.wait()
    assert reply["ok"], reply["error"][-3000:]


def write_timm_files(tmp, cases: dict, images=photos):
    """timm's files of ``cases`` (name: (model, kwargs, image size, suffix)) in ``tmp``, with its outputs on
    ``images(size)`` (``{name}.npy``): one subprocess for all."""
    jobs = []
    for name, (model, kwargs, size, suffix) in cases.items():
        np.save(tmp / f"images{size}.npy", images(size))
        jobs.append(
            dict(
                model=model,
                kwargs=kwargs,
                images=str(tmp / f"images{size}.npy"),
                save=str(tmp / f"{name}{suffix}"),
                logits=str(tmp / f"{name}.npy"),
            )
        )
    (tmp / "jobs.json").write_text(json.dumps(jobs))
    run_reference(TIMM_SCRIPT, tmp / "jobs.json")
    return tmp

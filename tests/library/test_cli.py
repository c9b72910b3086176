"""The commands start quiet and fast: help and argument checks before TensorFlow loads, no TensorFlow start-up
lines, every option's default in its help, model names checked, and progress lines fit for a file."""

import argparse
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
from training_support import TINY_MODEL_FLAGS

from keras_vit.analysis.__main__ import build_parser as analysis_parser
from keras_vit.cli import NATIVE_LOG, HelpFormatter
from keras_vit.export import parser as export_parser
from keras_vit.predict import _parser as predict_parser
from keras_vit.training import ablation, finetune, launch, pretrain
from keras_vit.zoo.__main__ import build_parser as zoo_parser

pytestmark = pytest.mark.backends("tensorflow")  # the commands' start: the default backend

COMMANDS = {
    "keras_vit.analysis": analysis_parser,
    "keras_vit.export": export_parser,
    "keras_vit.predict": predict_parser,
    "keras_vit.zoo": zoo_parser,
    "keras_vit.training.finetune": finetune.parser,
    "keras_vit.training.pretrain": pretrain.parser,
    "keras_vit.training.ablation": ablation.parser,
    "keras_vit.training.launch": launch.parser,
}

# Run in a fresh interpreter: each command's --help, then refusals that must come before TensorFlow loads; prints
# {"help": {module: text}, "exits": {case: [status, stdout, stderr]}, "loaded": the modules of TensorFlow or Keras,
# "folder": the folder of its files}.
BEFORE_TENSORFLOW = textwrap.dedent(
    """
    import contextlib, io, json, runpy, sys

    def run(module, *argv):
        sys.argv = [module, *argv]
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
                status = 0
            except SystemExit as exit_info:
                status = exit_info.code
        return status, out.getvalue(), err.getvalue()

    modules, folder = json.loads(sys.argv[1]), sys.argv[2]
    helps = {module: run(module, "--help") for module in modules}
    helps["keras_vit.zoo convert"] = run("keras_vit.zoo", "convert", "--help")
    a_file, missing, new = folder + "/a_file", folder + "/no/such.npz", folder + "/new"
    open(a_file, "w").close()
    open(folder + "/results.json", "w").close()
    from PIL import Image

    image = folder + "/cat.png"
    Image.new("RGB", (8, 8)).save(image)
    pretrain = ("keras_vit.training.pretrain", "--output-dir", new)
    exits = {
        "export": run("keras_vit.export", a_file, "--weights", "B_16.augreg_in21k_ft_in1k_224"),
        "analysis": run("keras_vit.analysis", "--output-dir", folder),
        "finetune": run("keras_vit.training.finetune", "--output-dir", a_file),
        "ablation": run("keras_vit.training.ablation", "--output-dir", a_file),
        "model base": run("keras_vit.training.finetune", "--model", "base"),
        "timm name": run("keras_vit.training.finetune", "--model", "vit_base_patch16_224"),
        "analysis base": run("keras_vit.analysis", "base", "--output-dir", folder + "/new"),
        "zoo download": run("keras_vit.zoo", "download", "B_16.no_such_checkpoint"),
        "predict weights": run("keras_vit.predict", image, "--weights", "NO_SUCH_NAME"),
        "export weights": run("keras_vit.export", new, "--weights", missing),
        "analysis weights": run("keras_vit.analysis", "--weights", "NO_SUCH_NAME", "--output-dir", new),
        "analysis dataset": run("keras_vit.analysis", "--dataset", missing, "--output-dir", new),
        "zoo info": run("keras_vit.zoo", "info", "NO_SUCH_NAME"),
        "zoo convert": run("keras_vit.zoo", "convert", missing, new + ".keras"),
        "finetune weights": run("keras_vit.training.finetune", "--weights", missing, "--output-dir", new),
        "finetune dataset": run("keras_vit.training.finetune", "--dataset", folder + "/no/such", "--output-dir", new),
        "pretrain weights": run(*pretrain, "--weights", "NO_SUCH_NAME"),
        "pretrain lora": run(*pretrain, "--lora-rank", "4"),
        "pretrain rate": run(*pretrain, "--corruption-rate", "2"),
        "pretrain steps": run(*pretrain, "--pretrain-steps", "0"),
        "pretrain batch": run(*pretrain, "--pretrain-batch-size", "0"),
        "pretrain eval": run(*pretrain, "--pretrain-eval-every", "0"),
    }
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras", "jax", "torch"))
    print(json.dumps({"help": helps, "exits": exits, "loaded": loaded, "folder": folder}))
    """
)


def _quiet_env() -> dict[str, str]:
    """The environment of a user who set no TensorFlow logging (the tests' conftest sets it)."""
    return {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}


@pytest.fixture(scope="module")
def before_tensorflow(tmp_path_factory):
    folder = tmp_path_factory.mktemp("outputs")
    run = subprocess.run(
        [sys.executable, "-c", BEFORE_TENSORFLOW, json.dumps(list(COMMANDS)), str(folder)],
        capture_output=True,
        text=True,
        env=_quiet_env(),
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""  # no TensorFlow start-up lines, nor anything else
    return json.loads(run.stdout)


def test_help_and_refusals_come_before_tensorflow_loads(before_tensorflow):
    assert before_tensorflow["loaded"] == []
    for module, (status, out, err) in before_tensorflow["help"].items():
        assert status == 0 and out.startswith("usage: ") and err == "", module
    exits = before_tensorflow["exits"]
    for case in ("export", "finetune", "ablation"):
        status, _, err = exits[case]
        assert status == 1 and "a file, not a folder" in err, case
    status, _, err = exits["analysis"]
    assert status == 1 and "results.json already exist" in err and "--overwrite" in err
    status, _, err = exits["zoo download"]
    assert status == 1 and "No checkpoint 'B_16.no_such_checkpoint'" in err


@pytest.mark.backend_independent
def test_weights_datasets_and_pretraining_options_are_refused_before_tensorflow_loads(before_tensorflow):
    """Each refusal is one line and exit status 1, with the message it had when TensorFlow loaded first (the
    fixture's interpreter loads no framework: test_help_and_refusals_come_before_tensorflow_loads)."""
    unknown = "No checkpoint 'NO_SUCH_NAME' in the zoo catalogue. List them with `python -m keras_vit.zoo list`."
    no_file = "No checkpoint file at {0} (nor a folder); expected a Google .npz"
    expected = {
        "predict weights": f"weights 'NO_SUCH_NAME': {unknown}",
        "export weights": "weights '{0}': " + no_file,
        "analysis weights": unknown,
        "analysis dataset": "No dataset file '{0}'.",
        "zoo info": unknown,
        "zoo convert": no_file,  # a path, not a catalogue name
        "finetune weights": no_file,
        "finetune dataset": "Image folder '{1}' does not exist.",
        "pretrain weights": unknown,
        "pretrain lora": "--lora-rank does not apply to pretrain",
        "pretrain rate": "corruption rate must be in (0, 1], got 2.0.",
        "pretrain steps": "--steps must be >= 1, got 0.",
        "pretrain batch": "--pretrain-batch-size must be >= 1, got 0.",  # 0 was taken as unset
        "pretrain eval": "--pretrain-eval-every must be >= 1, got 0.",
    }
    for case, message in expected.items():
        status, out, err = before_tensorflow["exits"][case]
        missing = before_tensorflow["folder"] + "/no/such"
        assert status == 1 and out == "" and err.count("\n") == 1, (case, err)
        assert err.startswith("error: " + message.format(missing + ".npz", missing)), (case, err)


def test_unknown_model_names_list_the_known_ones(before_tensorflow):
    status, _, err = before_tensorflow["exits"]["model base"]
    assert status == 2 and "Unknown ViT variant 'base'" in err and "Named variants: Ti/16, S/16" in err
    status, _, err = before_tensorflow["exits"]["analysis base"]
    assert status == 1 and "Unknown ViT variant 'base'" in err and "Named variants:" in err
    status, _, err = before_tensorflow["exits"]["timm name"]
    assert status == 2 and "timm's name of B/16 at 224 px" in err and "B/16 with --image-size 224" in err


def test_alias_spellings_are_the_variant():
    for spelling in ("B/16", "B16", "ViT-B/16", "ViT_B16", "vit-b16"):
        assert finetune.parser().parse_args(["--model", spelling]).model == spelling
    assert "also spelt B16, ViT-B/16, ViT_B16" in finetune.parser().format_help().replace("\n", " ").replace("  ", "")


def _options(parser: argparse.ArgumentParser, name: str):
    """``(command, action)`` of every option and positional of ``parser`` and its sub-commands."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command, sub in action.choices.items():
                yield from _options(sub, f"{name} {command}")
        elif not isinstance(action, argparse._HelpAction):
            yield name, action


def test_every_option_has_help_showing_its_default():
    for module, build in COMMANDS.items():
        for command, action in _options(build(), module):
            assert action.help, (command, action.dest)
            if action.nargs == 0 or action.required or (not action.option_strings and action.nargs in (None, "+")):
                continue  # a flag (off unless given) or a required argument
            shown = HelpFormatter(command)._get_help_string(action).lower()
            assert "default" in shown or "required" in shown, (command, action.dest, shown)


def test_help_says_the_default_it_adds():
    text = analysis_parser().format_help()
    assert re.search(r"--dpi DPI\s+resolution of the figures \(default: 100\)", text)


def test_a_redirected_training_run_prints_a_short_line_per_interval(tmp_path):
    """stdout a file: no progress bar's bytes, no "Epoch" on a run given in steps, no TensorFlow lines."""
    flags = [*TINY_MODEL_FLAGS, "--steps=4", "--eval-every=2", "--batch-size=16", "--mixed-precision=none"]
    run = subprocess.run(
        [sys.executable, "-m", "keras_vit.training.finetune", *flags, "--output-dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        env=_quiet_env(),
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert not [line for line in run.stderr.splitlines() if NATIVE_LOG.match(line)]
    assert "\x08" not in run.stdout and "\r" not in run.stdout and "Epoch" not in run.stdout
    progress = [line for line in run.stdout.splitlines() if line.startswith("step ")]
    assert [line.split(":")[0] for line in progress] == ["step 2/4", "step 4/4"]
    assert all(len(line) < 300 and "val_accuracy" in line for line in progress)

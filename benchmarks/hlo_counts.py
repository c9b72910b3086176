"""Ops of keras-vit's jitted JAX training step, counted in its HLO before and after XLA's optimisation, per block.

    KERAS_BACKEND=jax python benchmarks/hlo_counts.py                       # B/16, depth 2 and 3, batch 8, 224 px
    python benchmarks/hlo_counts.py --compare qkv_layout=split              # a ViT option off and on, side by side

The step is ``benchmarks/gpu.py``'s (``keras_vit.ViT(model, gelu="exact")`` under ``--policy``, AdamW,
``jit_compile=True``), traced as Keras' JAX trainer jits it (``jax.jit(model.train_step, donate_argnums=0)``)
and lowered for JAX's default device. Counted, in the HLO before optimisation (``lowered``: device-independent)
and in the optimized HLO of that device's XLA (``compiled.as_text()``: XLA:CPU's on a CPU, XLA:GPU's on a GPU):
``convert`` by source and target dtype, ``transpose``, ``copy``, ``slice``, ``concatenate``, fusions by kind,
``dot``, ``convolution``, ``reduce``, ``custom-call``, ``all-reduce``. Optimized ops are split between kernels
(outside fusions) and ops fused into them. A block's figure is the step at depth ``N + 1`` less the step at depth
``N``: everything one more encoder block adds, its share of the optimizer's update included.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import os
import platform
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpu import keras_vit_step

__all__ = ["count_ops", "main", "pretend_cudnn", "step_hlo"]

COUNTED = ("convert", "transpose", "copy", "slice", "concatenate", "dot", "convolution", "reduce", "custom-call")
COUNTED += ("all-reduce", "fusion")
DTYPE = re.compile(r"^\(?([a-z]+[0-9]*)\[")
HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
CALLEE = re.compile(r"\b(calls|to_apply|body|condition)=%?([\w.\-]+)")
KIND = re.compile(r"\bkind=(k\w+)")
LEVELS = {"pre": "pre-opt", "kernels": "kernels", "fused": "fused"}


def _instruction(line: str):
    """``(name, result type, opcode, operand names, attributes)`` of one HLO instruction line, else ``None``."""
    head, equals, rest = line.strip().removeprefix("ROOT ").partition(" = ")
    if not equals:
        return None
    if rest.startswith("("):  # a tuple type: up to its closing parenthesis
        depths = itertools.accumulate({"(": 1, ")": -1}.get(char, 0) for char in rest)
        end = next(index for index, depth in enumerate(depths) if depth == 0) + 1
        result, rest = rest[:end], rest[end:].lstrip()
    else:
        result, _, rest = rest.partition(" ")
    opcode, _, rest = rest.partition("(")
    operands, _, attributes = rest.partition(")")
    names = [operand.split()[-1].lstrip("%") for operand in operands.split(",") if operand.strip()]
    return head.lstrip("%"), result, opcode, names, attributes


def _dtype(result: str) -> str:
    match = DTYPE.match(result)
    return match.group(1) if match else "?"


def count_ops(text: str) -> dict[str, collections.Counter]:
    """Counted ops of an HLO module's text: ``{"kernels": ..., "fused": ...}`` (ops outside and inside fusions).

    A computation reached through ``call`` (or a loop) counts once per call; reducers' computations (``to_apply``
    of a ``reduce``) not at all. ``convert`` is keyed by its dtypes (``convert f32->bf16``), ``fusion`` by its kind.
    """
    computations: dict[str, list] = {}
    order: list[str] = []
    current = None
    for line in text.splitlines():
        match = None if line[:1].isspace() else HEADER.match(line)
        if match:
            current = match.group(1)
            order.append(current)
            computations[current] = []
        elif current is not None and (instruction := _instruction(line)):
            computations[current].append(instruction)
    types = {name: result for instructions in computations.values() for name, result, *_ in instructions}
    weight = collections.Counter({order[-1]: 1}) if order else collections.Counter()  # the entry comes last
    fused: set[str] = set()
    for computation in reversed(order):  # callers are printed after their callees
        for _, _, opcode, _, attributes in computations[computation]:
            for role, callee in CALLEE.findall(attributes):
                if opcode == "fusion" or computation in fused:
                    fused.add(callee)
                if opcode == "call" or (opcode in ("fusion", "while") and role != "to_apply"):
                    weight[callee] += weight[computation]
    counts = {"kernels": collections.Counter(), "fused": collections.Counter()}
    for computation in order:
        counter = counts["fused" if computation in fused else "kernels"]
        for _, result, opcode, operands, attributes in computations[computation]:
            if opcode not in COUNTED or not weight[computation]:
                continue
            key = opcode
            if opcode == "convert":
                key = f"convert {_dtype(types.get(operands[0], '?'))}->{_dtype(result)}"
            elif opcode == "fusion" and (kind := KIND.search(attributes)):
                key = f"fusion {kind.group(1)}"
            counter[key] += weight[computation]
    return counts


@contextlib.contextmanager
def pretend_cudnn():
    """While active, JAX's and Keras' cuDNN checks pass as on a Hopper GPU with cuDNN 9.10, so that a step lowered
    for CUDA on a machine without one takes the path a GPU takes (cuDNN's attention, or Keras' fallback)."""
    from unittest import mock

    from jax._src.cudnn import fused_attention_stablehlo as cudnn
    from keras.src.backend.jax import nn as keras_jax_nn

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(cudnn, "check_cudnn_version", lambda: 91000))
        stack.enter_context(mock.patch.object(cudnn, "check_compute_capability", lambda capability: True))
        stack.enter_context(mock.patch.object(cudnn, "is_cuda_compute_capability_equal", lambda capability: False))
        stack.enter_context(mock.patch.object(keras_jax_nn, "_can_use_flash_attention", lambda *a, **k: True))
        yield


def step_hlo(args, options: dict) -> tuple[str, str | None, str]:
    """The training step's HLO before and after optimisation (``None`` when lowered for another platform than
    JAX's device, ``--platform``), and the platform, for ``options`` (``keras_vit.layers`` settings in capitals)."""
    import jax

    from keras_vit import layers

    settings = {name: value for name, value in options.items() if name.isupper()}
    saved = {name: getattr(layers, name) for name in settings}
    platform_ = args.platform or jax.devices()[0].platform
    with pretend_cudnn() if platform_ == "cuda" else contextlib.nullcontext():
        try:
            for name, value in settings.items():
                setattr(layers, name, value)
            vit_options = {name: value for name, value in options.items() if name not in settings}
            model, x, y, _ = keras_vit_step(args, **vit_options)
            data = (x, y, None)
            model._symbolic_build(data_batch=data)  # builds the optimizer's variables, as train_on_batch does
            state = model._get_jax_state(
                trainable_variables=True, non_trainable_variables=True, optimizer_variables=True, metrics_variables=True
            )
            traced = jax.jit(model.train_step, donate_argnums=0).trace(state, data)
            lowered = traced.lower(lowering_platforms=(platform_,)) if args.platform else traced.lower()
        finally:
            for name, value in saved.items():
                setattr(layers, name, value)
    before = lowered.as_text(dialect="hlo")
    return before, None if args.platform else lowered.compile().as_text(), platform_


def _option(text: str) -> dict:
    """``name=value`` (a ``keras_vit.ViT`` option) as a dict; ``true``/``false``/numbers parsed."""
    name, _, value = text.partition("=")
    parsed: object = {"true": True, "false": False, "none": None}.get(value.lower(), value)
    if isinstance(parsed, str) and re.fullmatch(r"-?[0-9.e]+", parsed):
        parsed = float(parsed) if any(c in parsed for c in ".e") else int(parsed)
    return {name: parsed}


def per_block(args, options: dict) -> tuple[dict, str]:
    """Counts of one encoder block (depth ``N + 1`` less depth ``N``) for ``pre`` and the optimized HLO."""
    steps = []
    for depth in (args.depth, args.depth + 1):
        before, after, device = step_hlo(args, dict(options, depth=depth))
        steps.append({"pre": count_ops(before)["kernels"], **(count_ops(after) if after else {})})
    block = {}
    for level, counter in steps[1].items():
        block[level] = counter.copy()
        block[level].subtract(steps[0][level])  # keeps negative differences, unlike ``-``
    return block, device


def markdown(columns: dict[str, dict], device: str, args) -> str:
    """The per-block counts as a Markdown table, one group of three columns per configuration."""
    keys = sorted({key for block in columns.values() for counter in block.values() for key, n in counter.items() if n})
    levels = [level for level in ("pre", "kernels", "fused") if level in next(iter(columns.values()))]
    where = (
        f"lowered for {device} here (cuDNN's checks passed as on a Hopper GPU), not compiled"
        if args.platform
        else f"optimized HLO: XLA:{device.upper()}'s" + (" (not the GPU's)" if device == "cpu" else "")
    )
    lines = [
        f"Ops per encoder block of the {args.model} training step (depth {args.depth + 1} less depth {args.depth}; "
        f"batch {args.batch}, {args.image_size} px, {args.policy}) on {platform.machine()} ({_cpu_name()}); {where}",
        "",
        "| op | " + " | ".join(f"{name}: {LEVELS[level]}" for name in columns for level in levels) + " |",
        "|---|" + "---|" * len(levels) * len(columns),
    ]
    for key in keys:
        cells = [str(block[level][key]) for block in columns.values() for level in levels]
        lines.append(f"| `{key}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            return next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "?"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="B/16")
    parser.add_argument("--depth", type=int, default=2, help="N: blocks counted at depth N and N + 1")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--num-classes", type=int, default=1000)
    parser.add_argument("--policy", default="mixed_bfloat16")
    parser.add_argument(
        "--compare",
        nargs="+",
        metavar="OPTION=VALUE",
        help="count OPTION=VALUE beside the default, or the first beside the second: a keras_vit.ViT option, or "
        "a keras_vit.layers setting in capitals (PAD_ODD_ATTENTION=true)",
    )
    parser.add_argument("--platform", help="lower for this platform (cuda) instead of JAX's device; no optimized HLO")
    args = parser.parse_args(argv)
    if args.compare and len(args.compare) > 2:
        parser.error("--compare takes one or two configurations")
    return args


def main(argv=None) -> dict:
    """Count the default step's ops per block (and ``--compare``'s), print the table, return the counts."""
    os.environ.setdefault("KERAS_BACKEND", "jax")
    args = parse_args(argv)
    compared = args.compare or []
    configurations = {"default": {}} if len(compared) < 2 else {}
    configurations |= {text: _option(text) for text in compared}
    columns, device = {}, "?"
    for name, options in configurations.items():
        columns[name], device = per_block(args, options)
    print(markdown(columns, device, args))
    return columns


if __name__ == "__main__":
    main()

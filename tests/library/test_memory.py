"""A model's size from its config alone (issue 36): ``ViTConfig.parameter_count()`` is ``count_params()`` of the
model built, and a model too large for the memory left, or with one tensor over 2**31 - 1 values, is refused at
once, naming the fields that make it large, before any layer is built. See docs/faults.md."""

import os
import statistics
import subprocess
import sys
import time

import keras
import pytest

import keras_vit
from keras_vit import memory, models
from keras_vit.config import ViTConfig
from keras_vit.variants import FAMILY_VARIANTS, NAMED_VARIANTS
from library.test_config import CONFIGS, TINY

pytestmark = pytest.mark.backend_independent  # the same arithmetic and the same host on every backend

GIB = 1 << 30
# Option combinations beyond tests/library/test_config.py's CONFIGS (which set every field once).
OPTIONS = {
    "learned 2-D, distillation token": dict(position_embedding="learned_2d", distillation_token=True),
    "learned 2-D without embedded prefix tokens": dict(
        position_embedding="learned_2d", classifier="gap", num_register_tokens=3
    ),
    "sin-cos, MAP head with a top": dict(position_embedding="sincos_2d", classifier="map", representation_size=8),
    "relative, registers, no class token": dict(position_embedding="relative", classifier="gap", num_register_tokens=2),
    "relative without prefix tokens": dict(position_embedding="relative", classifier="gap"),
    "no position embeddings, fc_norm, max pooling": dict(
        position_embedding="none", fc_norm=True, include_top=False, pooling="max"
    ),
    "fc_norm, the tokens out: no final norm": dict(fc_norm=True, include_top=False),
    "the tokens out, with the final norm": dict(include_top=False),
    "DeiT III: layer scale, class token without position embedding, qk-norm": dict(
        layer_scale_init=1e-6, class_position_embedding=False, qk_norm=True, num_register_tokens=1
    ),
    "SwiGLU, norm_pre, pre_logits, a padded grid": dict(
        mlp_type="swiglu", norm_pre=True, representation_size=12, image_size=(30, 20), dynamic_img_pad=True
    ),
    "hybrid of the root only": dict(patch_size=1, resnet_stages=(), resnet_width=32, channels=2),
    "hybrid of two stages": dict(patch_size=2, resnet_stages=(2, 1), resnet_width=32, image_size=64),
}
TABLE = {**CONFIGS, **{name: ViTConfig.from_variant(None, **{**TINY, **fields}) for name, fields in OPTIONS.items()}}


def _count_params(config: ViTConfig) -> int:
    count = models.build_vit(config).count_params()
    keras.backend.clear_session()
    return count


@pytest.mark.parametrize("name", TABLE)
def test_the_count_is_count_params_for_every_option(name):
    config = TABLE[name]
    assert config.parameter_count() == _count_params(config)
    assert sum(config.parameter_parts().values()) == config.parameter_count()


@pytest.mark.parametrize("variant", [*NAMED_VARIANTS, *FAMILY_VARIANTS])
def test_the_count_is_count_params_for_every_named_variant(variant):
    """Built with one block (the count is linear in depth: one block more adds the same count)."""
    config = ViTConfig.from_variant(variant, depth=1)
    assert config.parameter_count() == _count_params(config)
    full = ViTConfig.from_variant(variant)
    block = config.replace(depth=2).parameter_count() - config.parameter_count()
    assert full.parameter_count() == config.parameter_count() + (full.architecture.depth - 1) * block


@pytest.fixture
def room(monkeypatch):
    """Set the memory :func:`keras_vit.memory.available_memory` reports: ``room(bytes)`` (None: unknown)."""

    def set_room(size):
        monkeypatch.setattr(memory, "available_memory", lambda swap=False: size and (size, "the test's limit"))

    return set_room


@pytest.fixture
def nothing_built(monkeypatch):
    """Fail the test where the model's graph is started."""

    def graph(*args, **kwargs):
        raise AssertionError("the model was built")

    monkeypatch.setattr(models, "_graph", graph)


ISSUE_CASES = {  # issue 36: minutes of building, a SIGSEGV, two TensorFlow OOM tracebacks
    "depth": ("Ti/16", dict(depth=10**6), "ViT depth=1000000, hidden_size=192, mlp_dim=768: the model's "),
    "width": ("L/16", dict(hidden_size=10**6, mlp_dim=10**6), "ViT hidden_size=1000000, mlp_dim=1000000: one tensor"),
    "image_size": ("Ti/16", dict(image_size=10**6), "ViT image_size=1000000x1000000, patch_size=16, hidden_size=192:"),
    "num_classes": ("Ti/16", dict(num_classes=10**9), "ViT num_classes=1000000000, hidden_size=192: one tensor"),
}


@pytest.mark.parametrize("case", ISSUE_CASES)
def test_the_issues_huge_models_are_refused_at_once_naming_the_argument(case, room, nothing_built):
    variant, arguments, message = ISSUE_CASES[case]
    room(64 * GIB)
    start = time.perf_counter()
    with pytest.raises(ValueError) as refused:
        keras_vit.ViT(variant, **arguments)
    assert time.perf_counter() - start < 1
    assert str(refused.value).startswith(message), refused.value
    assert "\n" not in str(refused.value)


def test_the_memory_refusal_names_the_largest_part_the_estimate_and_the_limit(room, nothing_built):
    room(100 << 20)
    with pytest.raises(ValueError) as refused:
        keras_vit.ViT("B/16")
    assert str(refused.value) == (
        "ViT depth=12, hidden_size=768, mlp_dim=3072: the model's 86,567,656 parameters need 330.2 MiB as float32 "
        "(324.5 MiB for its encoder blocks), but 100.0 MiB is left under the test's limit."
    )
    with pytest.raises(ValueError, match=r"^ViT num_classes=200000, hidden_size=768: .* for its head\)"):
        keras_vit.ViT("B/16", num_classes=200_000)
    with pytest.raises(ValueError, match=r"^ViT image_size=4096x4096, patch_size=16, hidden_size=768: .* embeddings"):
        keras_vit.ViT("B/16", image_size=4096, depth=1)


@pytest.mark.parametrize(
    "policy, size, dtype",  # the variable dtype: a mixed policy keeps float32 weights
    [
        ("float32", 4, "float32"),
        ("mixed_bfloat16", 4, "float32"),
        ("bfloat16", 2, "bfloat16"),
        ("float64", 8, "float64"),
    ],
)
def test_the_estimate_takes_the_policys_variable_dtype(policy, size, dtype, room, nothing_built):
    config = ViTConfig.from_variant("Ti/16")
    needed = config.parameter_count() * size
    room(needed)
    with pytest.raises(AssertionError, match="the model was built"):  # it fits: the graph starts
        models.build_vit(config, dtype=policy)
    room(needed - 1)
    with pytest.raises(ValueError, match=f" as {dtype} "):
        models.build_vit(config, dtype=policy)
    with keras_vit.precision.global_policy(policy), pytest.raises(ValueError, match=f" as {dtype} "):
        models.build_vit(config)  # the global policy's


def test_a_quantized_policy_counts_half_a_byte_a_parameter():
    assert memory._bytes_per_parameter(keras.dtype_policies.get("int8_from_float32"))[0] == 0.5
    policy_map = keras.dtype_policies.DTypePolicyMap("float32", {"head": "int4_from_float32"})
    assert memory._bytes_per_parameter(policy_map)[0] == 0.5


def test_a_table_over_2_31_values_is_refused_even_where_the_memory_is_unknown(room, nothing_built):
    """A relative-position block's (N, N) index at 3520 px (48,401 tokens), a 30,000-class head on 100,000 features."""
    room(None)
    with pytest.raises(ValueError, match=r"^ViT image_size=3520x3520, patch_size=16, hidden_size=192: one tensor of "):
        keras_vit.ViT("Ti/16", image_size=3520, position_embedding="relative")
    with pytest.raises(ValueError, match=r"2,342,656,801 values, more than the 2,147,483,647 one tensor may hold\.$"):
        keras_vit.ViT("Ti/16", image_size=3520, position_embedding="relative")
    head = r"^ViT num_classes=30000, representation_size=100000, hidden_size=192: one tensor of the model's head"
    with pytest.raises(ValueError, match=head):
        keras_vit.ViT("Ti/16", representation_size=100_000, num_classes=30_000)
    with pytest.raises(AssertionError, match="the model was built"):  # the memory unknown: nothing else refused
        keras_vit.ViT("Ti/16", depth=10**6)


def _fitting(variants, sizes):
    """Every variant at the multiples of its stride nearest ``sizes``."""
    for variant in variants:
        stride = ViTConfig.from_variant(variant).architecture.stride
        yield from ((variant, stride * round(size / stride)) for size in sizes)


def test_every_model_that_builds_today_fits_a_few_gib_and_the_check_costs_microseconds(room):
    """B/16 to H/14 and the hybrids at 224 to 518 px, the family (DINOv2-G/14, 1.1B parameters, in bfloat16),
    relative position biases at 512 px: none refused with 3 GiB left; each check well under a millisecond."""
    room(3 * GIB)
    float32 = keras.dtype_policies.get("float32")
    checks = [(ViTConfig.from_variant(v, image_size=s), float32) for v, s in _fitting(NAMED_VARIANTS, (224, 384, 518))]
    checks += [(ViTConfig.from_variant(v), float32) for v in FAMILY_VARIANTS if not v.startswith("DINOv2-G")]
    checks += [(ViTConfig.from_variant("DINOv2-G/14"), keras.dtype_policies.get("bfloat16"))]
    checks += [(ViTConfig.from_variant("L/16", image_size=512, position_embedding="relative"), float32)]
    times = []
    for config, policy in checks:
        start = time.perf_counter()
        memory.check_model_fits(config, policy)
        times.append(time.perf_counter() - start)
    assert statistics.median(times) < 1e-3, times


def test_a_real_process_is_refused_in_seconds_with_a_valueerror_not_a_crash():
    """``python -c "keras_vit.ViT('Ti/16', depth=10**6)"`` on this machine's real memory (1.6 TiB needed)."""
    needed = sum(memory.model_bytes(ViTConfig.from_variant("Ti/16", depth=10**6)).values())
    if (memory.available_memory() or (0,))[0] >= needed:
        pytest.skip("this machine has the 1.6 TiB the model needs")
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", "import keras_vit; keras_vit.ViT('Ti/16', depth=10**6)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr[-2000:]  # a Python exception, not a signal
    assert time.perf_counter() - start < 60
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError: ViT depth=1000000, hidden_size=192, mlp_dim=768: the model's 444,864,379,048")


def test_the_training_command_prints_one_line_for_a_huge_depth(tmp_path):
    """``finetune --depth 1000000``: one ``error:`` line naming ``depth``, exit 1, within seconds, nothing written."""
    out = tmp_path / "run"
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "keras_vit.training.finetune", "--depth=1000000", "--steps=1", f"--output-dir={out}"],
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_VIT_DEBUG": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert time.perf_counter() - start < 60
    assert done.returncode == 1, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith(("error", "Traceback"))]
    assert len(lines) == 1 and lines[0].startswith("error: ViT depth=1000000, hidden_size=64, mlp_dim=128: "), lines
    assert not out.exists()


def test_the_memory_is_memavailable_with_swap_for_a_model_else_the_physical_memory(monkeypatch):
    """A model that builds today by swapping still does; without ``/proc/meminfo`` (macOS) the physical memory."""
    meminfo = {"MemAvailable": 6 * GIB, "SwapFree": 2 * GIB}
    monkeypatch.setattr(memory, "proc_bytes", lambda path, name: meminfo.get(name) if path == "/proc/meminfo" else None)
    monkeypatch.setattr(memory, "_cgroup_room", lambda: None)
    assert memory.available_memory() == (6 * GIB, "available memory (MemAvailable)")
    assert memory.available_memory(swap=True) == (8 * GIB, "available memory and swap (MemAvailable + SwapFree)")
    meminfo.clear()
    physical = memory.available_memory(swap=True)
    assert physical is not None and physical[1] == "the physical memory" and physical[0] > 0

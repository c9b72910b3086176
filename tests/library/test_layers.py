"""The fast paths compute what the plain ones do, so speed never changes results.

Both attention kernels (head-major batched matmuls, TensorFlow's, and
``keras.ops.dot_product_attention``, fused on other backends) vs the path that returns the
probabilities and vs numpy, the strided-convolution patch embedding vs a patch matmul, XLA
(``jit_compile=True``) vs plain graph and eager execution for inference and a training step:
float32 within 1e-5. ``mixed_bfloat16`` vs
float32: bfloat16 keeps 8 significant bits (relative rounding 2^-9), so after two blocks features of
magnitude ~3 agree to a few 1e-2; the test allows 0.1 absolute and a cosine similarity of 0.999.
Rematerialised blocks (``remat=True``) recompute the same float32 operations on the same inputs with
the same dropout masks: losses and weights after training steps equal the plain path's within 1e-6
(bit-identical on TensorFlow and torch as measured; JAX's dropout rounds ``x / keep`` where the mask
path computes ``x * (1 / keep)``: 6e-8).

Bad layer arguments are a ``ValueError`` naming the argument; a batch of 0 images gives an empty output, and the
normal path is unchanged.
"""

import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

import keras_vit
from keras_vit.layers import DropPath, MlpBlock, MultiHeadSelfAttention, PatchEmbed, TransformerBlock, conv_nhwc
from keras_vit.position import RelativeTransformerBlock
from keras_vit.resnet import StdConv2D, standardize_kernel

TF_ONLY = pytest.mark.backends("tensorflow")  # the fast paths: the default backend only

TINY = dict(image_size=32, patch_size=8, depth=2, hidden_size=32, num_heads=4, mlp_dim=64, gelu="exact")
FLOAT32_ATOL = 1e-5


def _images(batch=3, size=32, seed=1):
    return np.random.default_rng(seed).uniform(-1, 1, (batch, size, size, 3)).astype("float32")


def _attention_reference(layer, x, bias=None):
    """numpy softmax(q k^T / sqrt(d) + bias) v from the layer's own weights: (output, probabilities)."""
    b, n, width = x.shape
    heads, d = layer.num_heads, width // layer.num_heads
    qkv = (x @ layer.qkv.kernel.numpy() + layer.qkv.bias.numpy()).reshape(b, n, 3, heads, d)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d) + (0.0 if bias is None else bias)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    context = np.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, n, width)
    return context @ layer.out.kernel.numpy() + layer.out.bias.numpy(), probs


def _randomise(layer_or_model, seed=2):
    rng = np.random.default_rng(seed)
    layer_or_model.set_weights([rng.normal(0, 0.2, w.shape).astype("float32") for w in layer_or_model.get_weights()])


@TF_ONLY
@pytest.mark.parametrize("fused", [False, True], ids=["head-major matmuls", "dot_product_attention"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_attention_paths_match_explicit_path_and_numpy(with_bias, fused, monkeypatch):
    # The kernel in use depends on the backend (head-major matmuls on TensorFlow,
    # keras.ops.dot_product_attention elsewhere): force each in turn.
    monkeypatch.setattr(keras_vit.layers, "fused_attention_available", lambda: fused)
    x = np.random.default_rng(0).normal(size=(2, 17, 32)).astype("float32")
    layer = MultiHeadSelfAttention(num_heads=4)
    layer.build(x.shape)
    _randomise(layer)
    bias = np.random.default_rng(3).normal(size=(1, 4, 17, 17)).astype("float32") if with_bias else None

    fast = layer(x, attention_bias=bias).numpy()
    explicit, probs = layer(x, return_attention_scores=True, attention_bias=bias)
    expected, expected_probs = _attention_reference(layer, x, bias)

    np.testing.assert_allclose(fast, explicit.numpy(), atol=FLOAT32_ATOL, rtol=0)
    np.testing.assert_allclose(fast, expected, atol=FLOAT32_ATOL, rtol=0)
    np.testing.assert_allclose(probs.numpy(), expected_probs, atol=FLOAT32_ATOL, rtol=0)
    assert probs.shape == (2, 4, 17, 17)


@TF_ONLY
def test_block_output_does_not_depend_on_returning_probabilities():
    x = np.random.default_rng(0).normal(size=(2, 10, 32)).astype("float32")
    block = TransformerBlock(num_heads=4, mlp_dim=64, gelu="exact")
    block.build(x.shape)
    _randomise(block)
    plain = block(x).numpy()
    with_probs, probs = block(x, return_attention_scores=True)
    np.testing.assert_allclose(plain, with_probs.numpy(), atol=FLOAT32_ATOL, rtol=0)
    np.testing.assert_allclose(probs.numpy().sum(-1), 1.0, atol=FLOAT32_ATOL)


@TF_ONLY
def test_conv_patch_embedding_matches_patch_matmul():
    images = _images(batch=2, size=12)
    layer = PatchEmbed(patch_size=4, hidden_size=8)
    layer.build(images.shape)
    _randomise(layer)
    tokens = layer(images).numpy()
    # The same projection as a matmul: cut 4x4 patches row-major, flatten each as (row, col, channel).
    patches = images.reshape(2, 3, 4, 3, 4, 3).transpose(0, 1, 3, 2, 4, 5).reshape(2, 9, 48)
    expected = patches @ layer.kernel.numpy().reshape(48, 8) + layer.bias.numpy()
    np.testing.assert_allclose(tokens, expected, atol=FLOAT32_ATOL, rtol=0)


def _twin_models(**kwargs):
    """Two tiny ViTs with the same random (non-zero) weights, head included."""
    config = {**TINY, **kwargs}
    first = keras_vit.ViT("Ti/16", num_classes=5, **config)
    _randomise(first)
    second = keras_vit.ViT("Ti/16", num_classes=5, **config)
    second.set_weights(first.get_weights())
    return first, second


@TF_ONLY
def test_jit_compile_predict_matches_graph_and_eager():
    plain, xla = _twin_models()
    xla.jit_compile = True  # before the first predict, which builds (and caches) the function
    images = _images()
    graph_out = plain.predict(images, verbose=0)
    xla_out = xla.predict(images, verbose=0)
    eager_out = plain(images).numpy()
    assert np.abs(graph_out).max() > 0.1  # a real signal, not the zero-initialised head
    np.testing.assert_allclose(xla_out, graph_out, atol=FLOAT32_ATOL, rtol=0)
    np.testing.assert_allclose(eager_out, graph_out, atol=FLOAT32_ATOL, rtol=0)


@TF_ONLY
def test_jit_compile_train_step_matches_plain_train_step():
    plain, xla = _twin_models(depth=1)
    for model, jit in ((plain, False), (xla, True)):
        model.compile(
            optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=jit,
        )
    images, labels = _images(batch=4), np.array([0, 1, 2, 3])
    before = plain.get_weights()
    losses = [m.train_on_batch(images, labels) for m in (plain, xla)]
    np.testing.assert_allclose(losses[0], losses[1], atol=FLOAT32_ATOL, rtol=0)
    moved = max(np.abs(a - b).max() for a, b in zip(before, plain.get_weights()))
    assert moved > 1e-3  # the step really changed the weights
    for a, b in zip(plain.get_weights(), xla.get_weights()):
        np.testing.assert_allclose(a, b, atol=FLOAT32_ATOL, rtol=0)


@TF_ONLY
def test_compile_auto_keeps_xla_off_on_cpu():
    """The default we chose (measured in benchmarks/throughput.py): XLA only where an accelerator is."""
    if tf.config.list_physical_devices("GPU"):
        pytest.skip("an accelerator is present: jit_compile='auto' turns XLA on there")
    model = keras_vit.ViT("Ti/16", num_classes=5, **TINY)
    model.compile(optimizer="sgd", loss="mse")
    assert model.jit_compile is False


@TF_ONLY
def test_bfloat16_matches_float32_within_tolerance():
    reference = keras_vit.ViT("Ti/16", include_top=False, pooling="token", **TINY)
    _randomise(reference)
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    half = keras_vit.ViT("Ti/16", include_top=False, pooling="token", **TINY)
    keras.mixed_precision.set_global_policy("float32")
    half.set_weights(reference.get_weights())
    assert half.get_layer("encoderblock_0").attn.qkv.compute_dtype == "bfloat16"
    images = _images(batch=4)
    expected = reference.predict(images, verbose=0)
    got = np.asarray(half.predict(images, verbose=0), dtype="float32")
    np.testing.assert_allclose(got, expected, atol=0.1, rtol=0)
    cosine = (got * expected).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(expected, axis=-1)
    assert cosine.min() > 0.999


# --- rematerialisation --------------------------------------------------------------------------

REMAT_ATOL = 1e-6
REGULARISED = dict(dropout=0.2, attention_dropout=0.1, drop_path=0.3)  # every random mask of a block in use


def _seeded_vit(compile=True, **kwargs):
    """A tiny ViT with random non-zero weights, built after one global seed: two builds with the same
    arguments have the same weights and the same dropout seed generators."""
    keras.utils.set_random_seed(0)
    model = keras_vit.ViT("Ti/16", num_classes=5, **{**TINY, **kwargs})
    _randomise(model)
    if compile:
        model.compile(
            optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    return model


def _two_steps_and_a_forward(model, images, labels):
    """Losses of two training steps (the second uses the seed generators as the first left them) and a
    training-mode forward pass, from one global random state (torch draws unseeded dropout from it)."""
    keras.utils.set_random_seed(1)
    losses = [model.train_on_batch(images, labels) for _ in range(2)]
    return losses, model(images, training=True)


@TF_ONLY
@pytest.mark.parametrize("position_embedding", ["learned_1d", "relative"])
def test_remat_training_equals_plain_training(position_embedding):
    depth = 2 if position_embedding == "learned_1d" else 1  # one relative block suffices: halves the tracing
    plain, remat = (
        _seeded_vit(remat=r, position_embedding=position_embedding, depth=depth, **REGULARISED) for r in (False, True)
    )
    assert all(block.remat for block in remat.layers if isinstance(block, TransformerBlock))
    images, labels = _images(batch=4), np.array([0, 1, 2, 3])
    before = plain.get_weights()
    (plain_losses, plain_out), (remat_losses, remat_out) = (
        _two_steps_and_a_forward(model, images, labels) for model in (plain, remat)
    )
    np.testing.assert_allclose(remat_losses, plain_losses, atol=REMAT_ATOL, rtol=0)
    assert max(np.abs(a - b).max() for a, b in zip(before, plain.get_weights())) > 1e-3  # the steps moved them
    for a, b in zip(plain.get_weights(), remat.get_weights()):
        np.testing.assert_allclose(b, a, atol=REMAT_ATOL, rtol=0)
    plain_out, remat_out = keras.ops.convert_to_numpy(plain_out), keras.ops.convert_to_numpy(remat_out)
    np.testing.assert_allclose(remat_out, plain_out, atol=REMAT_ATOL, rtol=0)
    inference = keras.ops.convert_to_numpy(plain(images))
    assert np.abs(plain_out - inference).max() > 1e-3  # dropout really was on


@TF_ONLY
def test_remat_survives_keras_saving(tmp_path):
    model = _seeded_vit(compile=False, remat=True)
    path = tmp_path / "remat.keras"
    model.save(path)
    restored = keras.models.load_model(path)
    blocks = [layer for layer in restored.layers if isinstance(layer, TransformerBlock)]
    assert len(blocks) == TINY["depth"] and all(block.get_config()["remat"] is True for block in blocks)
    images = _images()
    np.testing.assert_array_equal(restored.predict(images, verbose=0), model.predict(images, verbose=0))


@pytest.mark.backend_independent
@pytest.mark.parametrize("value", ["yes", 1, None])
def test_remat_must_be_a_bool(value):
    with pytest.raises(ValueError, match="`remat` must be True or False"):
        keras_vit.ViT("Ti/16", remat=value, **TINY)


_JAX_REMAT_SCRIPT = """
    import numpy as np
    import keras
    import keras_vit

    def train(remat):
        keras.utils.set_random_seed(0)
        model = keras_vit.ViT("Ti/16", num_classes=5, remat=remat, dropout=0.2, attention_dropout=0.1,
                              drop_path=0.3, **TINY)
        rng = np.random.default_rng(2)
        model.set_weights([rng.normal(0, 0.2, w.shape).astype("float32") for w in model.get_weights()])
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        x = np.random.default_rng(1).uniform(-1, 1, (4, 32, 32, 3)).astype("float32")
        losses = [model.train_on_batch(x, np.arange(4)) for _ in range(2)]
        return losses, model.get_weights()

    (loss0, w0), (loss1, w1) = train(False), train(True)
    print(max(abs(a - b) for a, b in zip(loss0, loss1)), max(float(np.abs(a - b).max()) for a, b in zip(w0, w1)))
"""


@TF_ONLY
@pytest.mark.slow  # a JAX interpreter: about 15 s
@pytest.mark.requires("jax")
def test_remat_equals_plain_on_jax():
    script = f"TINY = {TINY!r}\n" + textwrap.dedent(_JAX_REMAT_SCRIPT)
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    loss_diff, weight_diff = map(float, done.stdout.split()[-2:])
    assert loss_diff <= REMAT_ATOL and weight_diff <= REMAT_ATOL


def _graph_ops(fn, *args) -> set[str]:
    return {op.type for op in tf.function(fn).get_concrete_function(*args).graph.get_operations()}


@TF_ONLY
@pytest.mark.parametrize("policy", ["mixed_bfloat16", "float32"])
def test_projection_in_bfloat16_inference_is_a_batched_matmul_equal_to_the_dense_on_rows(policy):
    """``keras_vit.layers.project``: bfloat16 inference runs ``x @ kernel[None] + bias`` (a ``BatchMatMulV2``, which
    TensorFlow fuses with the bias into oneDNN's AMX matmul), everything else the ``Dense`` on rows (``MatMul``);
    both agree within bfloat16 rounding (outputs ~1: 2^-8 relative), float32 within 1e-5. Training, int8 and LoRA
    layers keep the rows."""
    from keras_vit.layers import project
    from keras_vit.precision import global_policy

    with global_policy(policy):
        dense = keras.layers.Dense(48, bias_initializer="glorot_uniform")
        dense.build((None, 32))
    x = tf.cast(np.random.default_rng(0).standard_normal((3, 17, 32)), dense.compute_dtype)
    fast, rows = project(dense, x), project(dense, x, training=True)
    assert fast.shape == rows.shape == (3, 17, 48) and fast.dtype == x.dtype
    batched = "BatchMatMulV2" in _graph_ops(lambda t: project(dense, t), x)
    assert batched == (policy == "mixed_bfloat16")
    assert "BatchMatMulV2" not in _graph_ops(lambda t: project(dense, t, training=True), x)
    tolerance = 0.03 if policy == "mixed_bfloat16" else FLOAT32_ATOL
    np.testing.assert_allclose(
        np.asarray(tf.cast(fast, "float32")), np.asarray(tf.cast(rows, "float32")), atol=tolerance
    )
    if policy == "mixed_bfloat16":
        dense.enable_lora(2)
        assert "BatchMatMulV2" not in _graph_ops(lambda t: project(dense, t), x)


@pytest.mark.requires("torch")
@pytest.mark.backends("torch")
@pytest.mark.parametrize("policy", ["mixed_bfloat16", "float32"])
def test_dense_rows_on_torch_is_one_addmm_equal_to_the_dense(policy):
    """``keras_vit.layers.dense_rows`` on torch: ``F.linear`` (one ``addmm``, the bias fused) gives the ``Dense``'s
    outputs and the same gradients for input, kernel and bias; a LoRA layer runs its own call."""
    import torch

    from keras_vit.layers import dense_rows
    from keras_vit.precision import global_policy

    with global_policy(policy):
        dense = keras.layers.Dense(48, bias_initializer="glorot_uniform")
        dense.build((None, 32))
    rng = np.random.default_rng(0)
    results = []
    for run in (dense_rows, lambda layer, x: layer(x)):
        x = torch.tensor(rng.standard_normal((51, 32)), dtype=torch.float32, requires_grad=True)
        with torch.profiler.profile() as trace:
            y = run(dense, x.to(getattr(torch, dense.compute_dtype)))
        ops = {event.key for event in trace.key_averages()}
        y.float().square().sum().backward()
        grads = [x.grad] + [w.value.grad.clone() for w in (dense.kernel, dense.bias)]
        for w in (dense.kernel, dense.bias):
            w.value.grad = None
        results.append((y.float().detach().numpy(), [g.float().numpy() for g in grads], ops))
        rng = np.random.default_rng(0)
    (fast, fast_grads, fast_ops), (plain, plain_grads, plain_ops) = results
    assert "aten::addmm" in fast_ops and "aten::addmm" not in plain_ops
    tolerance = 0.03 if policy == "mixed_bfloat16" else FLOAT32_ATOL
    np.testing.assert_allclose(fast, plain, atol=tolerance * np.abs(plain).max())
    for ours, theirs in zip(fast_grads, plain_grads, strict=True):
        np.testing.assert_allclose(ours, theirs, atol=tolerance * np.abs(theirs).max())
    dense.enable_lora(2)
    with torch.profiler.profile() as trace:
        dense_rows(dense, torch.ones((4, 32), dtype=getattr(torch, dense.compute_dtype)))
    assert "aten::addmm" not in {event.key for event in trace.key_averages()}


@TF_ONLY
def test_bfloat16_inference_of_a_block_equals_its_training_path_without_dropout():
    """A whole encoder block in ``mixed_bfloat16``: inference (batched-matmul projections) against the training
    call (Dense on rows; no dropout, so the same function) and against float32."""
    from keras_vit.precision import global_policy

    x = np.random.default_rng(2).standard_normal((2, 17, 32)).astype("float32")
    reference = TransformerBlock(4, 64, gelu="exact")
    expected = np.asarray(reference(x))
    with global_policy("mixed_bfloat16"):
        block = TransformerBlock(4, 64, gelu="exact")
        block.build(x.shape)
    block.set_weights(reference.get_weights())
    inference = np.asarray(tf.cast(block(x, training=False), "float32"))
    trained = np.asarray(tf.cast(block(x, training=True), "float32"))
    np.testing.assert_allclose(inference, trained, atol=0.05)
    np.testing.assert_allclose(inference, expected, atol=0.1)
    cosine = np.sum(inference * expected, -1) / (np.linalg.norm(inference, axis=-1) * np.linalg.norm(expected, axis=-1))
    assert cosine.min() >= 0.999


# --- bad layer arguments, empty batches ----------------------------------------------------------------------------

EMPTY_TINY = dict(image_size=32, patch_size=8, depth=1, num_classes=5)
EMPTY_HYBRID = ("R26+S/32", dict(image_size=32, depth=1, num_classes=5))

BAD_LAYERS = [
    ("patch_size", lambda: PatchEmbed(0, 8)),
    ("patch_size", lambda: PatchEmbed((8, -8), 8)),
    ("patch_size", lambda: PatchEmbed(True, 8)),
    ("hidden_size", lambda: PatchEmbed(8, 0)),
    ("num_heads", lambda: TransformerBlock(num_heads=0, mlp_dim=8)),
    ("mlp_dim", lambda: TransformerBlock(num_heads=2, mlp_dim=0)),
    ("drop_path", lambda: TransformerBlock(2, 8, drop_path=1.0)),
    ("dropout", lambda: TransformerBlock(2, 8, dropout=1.5)),
    ("attention_dropout", lambda: TransformerBlock(2, 8, attention_dropout=-0.1)),
    ("num_heads", lambda: RelativeTransformerBlock(0, 8, grid_size=(2, 2))),
    ("num_heads", lambda: MultiHeadSelfAttention(0)),
    ("num_heads", lambda: MultiHeadSelfAttention(False)),
    ("attention_dropout", lambda: MultiHeadSelfAttention(2, attention_dropout=1.0)),
    ("mlp_dim", lambda: MlpBlock(0)),
    ("dropout", lambda: MlpBlock(8, dropout=-0.1)),
    ("rate", lambda: DropPath(1.5)),
    ("rate", lambda: DropPath(1.0)),
    ("rate", lambda: DropPath(-0.2)),
    ("kernel_size", lambda: StdConv2D(8, 0)),
]


@pytest.mark.backend_independent
@pytest.mark.parametrize("name, make", BAD_LAYERS, ids=[f"{i}-{name}" for i, (name, _) in enumerate(BAD_LAYERS)])
def test_layers_reject_bad_arguments_naming_them(name, make):
    with pytest.raises(ValueError, match=name):
        make()


def test_good_values_still_build_and_configs_round_trip():
    block = TransformerBlock(np.int64(2), 8, dropout=0.1, attention_dropout=0.0, drop_path=0.99)
    assert TransformerBlock.from_config(block.get_config()).get_config() == block.get_config()
    embed = PatchEmbed([4, 2], 8)
    assert PatchEmbed.from_config(embed.get_config()).patch_size == (4, 2)
    model = keras_vit.ViT("Ti/16", image_size=(32, 16), patch_size=8, depth=1, dropout=0.1, drop_path=0.5)
    assert model.output_shape == (None, 1000)


# --- empty batches ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "variant, kwargs, classes",
    [
        pytest.param("Ti/16", EMPTY_TINY, 5, id="plain"),
        pytest.param(
            *EMPTY_HYBRID, 5, id="hybrid", marks=pytest.mark.backends("tensorflow", "torch")
        ),  # slow to compile on JAX
        pytest.param("Ti/16", dict(EMPTY_TINY, classifier="gap", position_embedding="relative"), 5, id="gap-relative"),
        pytest.param("Ti/16", dict(EMPTY_TINY, include_top=False, pooling="avg"), 192, id="features"),
    ],
)
def test_an_empty_batch_gives_an_empty_output(variant, kwargs, classes):
    model = keras_vit.ViT(variant, **kwargs)
    empty = np.zeros((0, 32, 32, 3), np.float32)
    assert tuple(model(empty).shape) == (0, classes)
    assert model.predict_on_batch(empty).shape == (0, classes)
    if keras.backend.backend() == "tensorflow":  # traced as fit runs it (on JAX predict_on_batch is that already)
        assert tuple(tf.function(model)(empty).shape) == (0, classes)
    assert model.predict(np.zeros((2, 32, 32, 3)), verbose=0).shape == (2, classes)  # the same model, still fine


@pytest.mark.filterwarnings("ignore:Your input ran out of data:UserWarning")
@pytest.mark.xfail(
    strict=True,
    raises=UnboundLocalError,
    reason="Keras' own Model.predict fails on 0 samples (no batch, so no output: keras/src/backend/tensorflow/"
    "trainer.py, also for a plain Dense model); model(x) and predict_on_batch(x) work. Passes once Keras fixes it.",
)
def test_model_predict_on_an_empty_array():
    model = keras_vit.ViT("Ti/16", **EMPTY_TINY)
    assert model.predict(np.zeros((0, 32, 32, 3)), verbose=0).shape == (0, 5)


def traced(function):
    """``function`` compiled as the backend's ``predict`` and ``fit`` run it: ``tf.function`` (TensorFlow's graph,
    where oneDNN fuses), ``jax.jit``; torch runs eagerly."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        return tf.function(function)
    if backend == "jax":
        import jax

        return jax.jit(function)
    return function


def _reference_patch_embed(layer, x):
    """PatchEmbed as it was computed before the empty-batch fix: conv + bias, then flatten."""
    y = ops.conv(x, layer.kernel, strides=layer.patch_size, padding="valid") + layer.bias
    return ops.reshape(y, (ops.shape(y)[0], -1, layer.hidden_size))


def test_the_normal_path_is_bit_identical_to_a_plain_convolution():
    x = ops.convert_to_tensor(np.random.default_rng(0).standard_normal((4, 32, 48, 3)).astype("float32"))
    embed = PatchEmbed(8, 16)
    embed.build(x.shape)
    embed.bias.assign(np.random.default_rng(1).standard_normal(16))
    conv = StdConv2D(16, 3, strides=2)
    conv.build(x.shape)

    def reference_conv(x):
        return ops.conv(x, standardize_kernel(conv.kernel, conv.epsilon), strides=2, padding="same")

    for run in (lambda f: f, traced):  # eager, and traced as Keras' predict runs it (oneDNN graph fusions)
        for layer, reference in ((embed, lambda x: _reference_patch_embed(embed, x)), (conv, reference_conv)):
            np.testing.assert_array_equal(ops.convert_to_numpy(run(layer)(x)), ops.convert_to_numpy(run(reference)(x)))
    assert tuple(embed(x[:0]).shape) == (0, 24, 16) and tuple(conv(x[:0]).shape) == (0, 16, 24, 16)


@pytest.mark.backends("tensorflow")  # only TensorFlow traces graphs with unknown sizes (JAX and torch see them)
def test_empty_batches_with_unknown_image_sizes_in_a_tensorflow_graph():
    kernel = tf.constant(np.ones((3, 3, 3, 4), np.float32))
    convolve = tf.function(
        lambda x: conv_nhwc(x, kernel, (2, 2), "same"), input_signature=[tf.TensorSpec((None, None, None, 3))]
    )
    assert tuple(convolve(tf.zeros((0, 9, 10, 3))).shape) == (0, 5, 5, 4)
    assert tuple(convolve(tf.zeros((2, 9, 10, 3))).shape) == (2, 5, 5, 4)


def test_empty_batches_with_unknown_image_sizes():
    inputs = keras.Input((None, None, 3))
    model = keras.Model(inputs, PatchEmbed(4, 8)(inputs))
    assert tuple(model(np.zeros((0, 8, 12, 3))).shape) == (0, 6, 8)
    assert tuple(model(np.zeros((3, 8, 12, 3))).shape) == (3, 6, 8)


def test_patch_embed_takes_channels_first_and_pads_with_zeros_below_and_right():
    """The same kernel in either layout; with dynamic_img_pad, 10x7 images embed as the 12x8 images that are
    them padded with zeros (timm's); without, the size is refused."""
    x = np.random.default_rng(1).uniform(-1, 1, (2, 10, 7, 3)).astype("float32")
    last = PatchEmbed(4, 8, dynamic_img_pad=True)
    first = PatchEmbed(4, 8, data_format="channels_first", dynamic_img_pad=True)
    last.build(x.shape)
    first.build(x.transpose(0, 3, 1, 2).shape)
    _randomise(last)
    first.set_weights(last.get_weights())
    tokens = ops.convert_to_numpy(last(x))
    assert tokens.shape == (2, 6, 8) == last.compute_output_shape(x.shape)
    padded = np.pad(x, [(0, 0), (0, 2), (0, 1), (0, 0)])
    np.testing.assert_allclose(tokens, ops.convert_to_numpy(last(padded)), atol=1e-6)
    np.testing.assert_allclose(ops.convert_to_numpy(first(x.transpose(0, 3, 1, 2))), tokens, atol=1e-6)
    assert first.compute_output_shape((None, 3, 10, 7)) == (None, 6, 8)
    with pytest.raises(ValueError, match="10x7 is not divisible by the patch size 4x4"):
        PatchEmbed(4, 8)(x)


@pytest.mark.backends("jax", "torch")  # TensorFlow runs the head-major matmuls, where the switch changes nothing
@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_odd_attention_padding_equals_plain_attention(policy, monkeypatch):
    # JAX's cuDNN attention trains only on an even token count: 17 tokens padded to 18 with the last key masked
    # must give the plain path's outputs and gradients (two SGD steps' losses and weights).
    keras.mixed_precision.set_global_policy(policy)
    try:
        images, labels = _images(batch=4), np.array([0, 1, 2, 3])
        runs = []
        for padded in (False, True):
            monkeypatch.setattr(keras_vit.layers, "PAD_ODD_ATTENTION", padded)
            model = _seeded_vit()
            losses, out = _two_steps_and_a_forward(model, images, labels)
            runs.append((losses, keras.ops.convert_to_numpy(ops.cast(out, "float32")), model.get_weights()))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    atol = FLOAT32_ATOL if policy == "float32" else 2e-2  # bfloat16: a few roundings of 2^-9 apart
    (plain_losses, plain_out, plain_weights), (padded_losses, padded_out, padded_weights) = runs
    np.testing.assert_allclose(padded_losses, plain_losses, atol=atol, rtol=0)
    np.testing.assert_allclose(padded_out, plain_out, atol=atol, rtol=0)
    for a, b in zip(plain_weights, padded_weights):
        np.testing.assert_allclose(b, a, atol=atol, rtol=0)

def from_state_dict(
    state: Mapping[str, np.ndarray],
    source: str,
    config: Mapping | None = None,
    fmt: str = "npz",
    num_heads: int | None = None,
) -> CheckpointArrays:
    """Arrays in any key layout -> :class:`CheckpointArrays` in the ``.npz`` layout (timm and Hugging Face
    state dicts are converted; ``config`` is a Hugging Face ``config.json``; ``num_heads`` a timm file's, where
    its metadata records them)."""
    try:
        if looks_like_timm(state):
            arrays, options = timm_to_npz(state, num_heads=num_heads, source=source)
            fields = dict(format="timm", model_options=options, heads_known=num_heads is not None)
            return CheckpointArrays(arrays, source, **fields)
        if looks_like_huggingface(state) or looks_like_tower(state):
            convert = tower_to_npz if looks_like_tower(state) else huggingface_to_npz
            arrays, options, known = convert(state, config, source=source)
            return CheckpointArrays(arrays, source, format="huggingface", model_options=options, heads_known=known)
    except (KeyError, TypeError, AttributeError) as exc:  # a tensor a whole layer needs is absent
        raise ValueError(f"{source} is an incomplete ViT state dict: a layer lacks {exc}.") from exc
    if fmt != "npz" and "embedding/kernel" not in state:
        listed = ", ".join(sorted(state)[:5]) or "none"
        raise ValueError(
            f"{source} is {fmt} but not a ViT state dict keras-vit knows (timm: patch_embed.proj.weight, "
            f"blocks.*; Hugging Face: [vit.]embeddings.patch_embeddings.*); its keys start {listed}."
        )
    return CheckpointArrays(state, source)


def read_saved_model(path: str | os.PathLike) -> CheckpointArrays:
    """A saved keras-vit model (``.keras``: the training commands' ``model.keras`` and ``encoder.keras``, a user's
    ``model.save``): its weights in the ``.npz`` layout and its :class:`~keras_vit.config.ViTConfig` (of the
    :class:`~keras_vit.models.VisionTransformer` it is or holds); a plain model made of keras-vit layers brings the
    options its layers show, and its architecture is read from the shapes as a checkpoint's."""
    check_archive(path)
    try:
        model = keras.saving.load_model(path, compile=False)
    except Exception as exc:  # Keras raises many kinds for a damaged or foreign file (ValueError, TypeError, ...)
        raise ValueError(f"{path} is not a readable saved Keras model ({type(exc).__name__}: {exc}).") from exc
    layers = list(model._flatten_layers(include_self=True))
    vits = [layer for layer in layers if isinstance(layer, VisionTransformer)]
    vit = vits[0] if len(vits) == 1 else model
    if not any(isinstance(layer, TransformerBlock) for layer in layers):
        raise ValueError(
            f"{path} is a saved Keras model ({type(model).__name__} {model.name!r}) without keras-vit layers (as "
            "keras_vit.ViT builds): open it with keras.saving.load_model."
        )
    config = getattr(vit, "config", None)
    options = {k: v for k, v in model_options(vit).items() if k in field_names("structure", "numerics")}
    mapped = {id(variable) for variable, _ in npz_key_map(vit).values()}
    extra = {v.path: keras.ops.convert_to_numpy(v) for v in vit.weights if id(v) not in mapped}
    fields = dict(format="keras", model_options=options, config=config, extra=extra)
    return CheckpointArrays(model_arrays(vit), str(path), **fields)


_ATTENTION_KEY = re.compile(
    r"(?:Transformer/encoderblock_\d+/MultiHeadDotProductAttention_1|MAPHead_0/MultiHeadDotProductAttention_0)"
    r"/(query|key|value|out)/kernel"
)


def with_num_heads(arrays: CheckpointArrays, num_heads: int) -> CheckpointArrays:
    """``arrays`` with its attention arrays regrouped into ``num_heads`` heads where the file did not
    record the head count (``heads_known=False``); unchanged otherwise."""
    if arrays.heads_known:
        return arrays
    regrouped = dict(arrays)
    for key, kernel in arrays.items():
        match = _ATTENTION_KEY.fullmatch(key)
        if not match or kernel.size % num_heads:
            continue
        bias = key[: -len("kernel")] + "bias"
        if match[1] == "out":
            regrouped[key] = kernel.reshape(num_heads, -1, kernel.shape[-1])
        else:
            regrouped[key] = kernel.reshape(kernel.shape[0], num_heads, -1)
            if bias in arrays:
                regrouped[bias] = arrays[bias].reshape(num_heads, -1)
    return dataclasses.replace(arrays, arrays=regrouped, heads_known=True)


def read_checkpoint(weights: str | os.PathLike | Mapping[str, np.ndarray]) -> CheckpointArrays:
    """The arrays of ``weights``: a catalogue name (downloaded), a path of any format :func:`read_path`
    reads, or arrays already read (a state dict in the ``.npz``, timm or Hugging Face layout)."""
    if isinstance(weights, CheckpointArrays):
        return weights
    if isinstance(weights, Mapping):
        return from_state_dict(weights, "the given arrays")
    return read_path(resolve_weights(weights))

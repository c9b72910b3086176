"""The paper's analyses of a trained ViT (Sec. 4.5, Fig. 6-7) as functions returning arrays, and the figures;
``python -m keras_vit.analysis`` draws them all. See docs/analyses.md."""

from keras_vit.lazy import lazy_attributes

# The public names, by the module that defines them; each imported on first use (the command's --help loads no Keras).
_EXPORTS = {
    "attention": (
        "AttentionAnalysis", "analyse_attention", "attention_rollout", "iter_attentions", "mean_attention_distance",
        "overlay", "patch_distances", "rollout_map",
    ),
    "embeddings": (
        "filter_components", "model_filter_components", "model_position_similarity", "position_similarity",
        "to_rgb_tiles",
    ),
    "fewshot": (
        "L2_GRID", "SHOTS", "extract_features", "few_shot_evaluation", "fit_linear_probe", "linear_probe",
        "sample_per_class",
    ),
    "geometry": ("TokenGeometry", "token_geometry"),
}  # fmt: skip
__all__ = sorted(name for names in _EXPORTS.values() for name in names)

# Submodules too are attributes imported on first use: keras_vit.analysis.plots (it loads matplotlib).
__getattr__, __dir__ = lazy_attributes(
    __name__,
    {name: f"{__name__}.{module}" for module, names in _EXPORTS.items() for name in names},
    (*_EXPORTS, "data", "plots"),
)

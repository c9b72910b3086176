"""Class names travel with a run: ``classes.txt`` and the saved model's config; a resume on other classes is
refused, saying what changed; fine-tuning goes on from a saved model (pretrain's advice, as printed)."""

import os
import re
import shlex

import keras
import numpy as np
import pytest
from PIL import Image
from training_support import TINY, TINY_MODEL_FLAGS

from keras_vit.training.data import Source, Split
from keras_vit.training.errors import OutputDirError
from keras_vit.training.finetune import finetune
from keras_vit.training.finetune import main as finetune_main
from keras_vit.training.resume import check_classes

pytestmark = pytest.mark.backends("tensorflow")  # the run's files: the backends' runs are tested elsewhere

RUN = dict(TINY, steps=2, checkpoint_every=1)


def _folder(root, classes) -> str:
    rng = np.random.default_rng(0)
    for index, name in enumerate(classes):
        os.makedirs(root / name)
        for i in range(4):
            pixels = np.clip(rng.normal(60 * index, 20, (12, 12, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return str(root)


def test_digits_runs_record_their_classes(tmp_path):
    digits = finetune(output_dir=str(tmp_path / "digits"), **RUN)
    assert (tmp_path / "digits" / "classes.txt").read_text() == "".join(f"{d}\n" for d in range(10))
    loaded = keras.saving.load_model(tmp_path / "digits" / "model.keras")
    assert loaded.config.class_names == tuple(str(d) for d in range(10)) == digits.model.config.class_names


def test_a_resume_on_renamed_or_added_classes_is_refused_saying_what_changed(tmp_path):
    data = tmp_path / "pets"
    _folder(data, ["cat", "dog", "emu"])
    out = str(tmp_path / "run")
    finetune(dataset=str(data), eval_fraction=0.25, output_dir=out, **RUN)
    assert (tmp_path / "run" / "classes.txt").read_text().split() == ["cat", "dog", "emu"]
    saved = keras.saving.load_model(tmp_path / "run" / "model.keras")
    assert saved.config.class_names == ("cat", "dog", "emu") and saved.output_shape == (None, 3)
    os.rename(data / "dog", data / "zebra")  # labels would shift: emu 2 -> 1
    with pytest.raises(OutputDirError, match=r"the dataset changed, classes added zebra; gone dog\. Restore"):
        finetune(dataset=str(data), eval_fraction=0.25, output_dir=out, **RUN)
    os.rename(data / "zebra", data / "dog")
    os.makedirs(data / "fox")
    for i in range(4):
        Image.fromarray(np.zeros((12, 12, 3), np.uint8)).save(data / "fox" / f"{i}.png")
    with pytest.raises(OutputDirError, match=r"classes added fox\. .*--weights .*run/model.keras"):
        finetune(dataset=str(data), eval_fraction=0.25, output_dir=out, **RUN)
    assert sorted(os.listdir(os.path.join(out, "checkpoints"))) == ["ckpt-1.npz", "ckpt-2.npz"]  # nothing touched
    reordered = Source("pets", 3, Split(0), Split(0), "held-out", ("dog", "cat", "emu"))
    with pytest.raises(OutputDirError, match=r"the same classes in another order \(was cat, dog, emu; now dog, cat"):
        check_classes(out, reordered)


@pytest.mark.slow  # three runs: masked patches, its fine-tuning, then LoRA from the encoder
def test_finetune_from_pretrain_s_encoder_as_its_advice_says(tmp_path, capsys):
    from keras_vit.training.pretrain import main as pretrain

    out = str(tmp_path / "pre")
    argv = ["--pretrain-steps=2", "--steps=1", *TINY_MODEL_FLAGS, "--mixed-precision=none", "--verbose=0"]
    argv += ["--output-dir", out]
    with pytest.raises(SystemExit):
        pretrain([*argv, "--lora-rank", "2"])
    advice = re.search(r"keras_vit\.training\.finetune (--weights \S+ --lora-rank N)", capsys.readouterr().err)[1]
    pretrain(argv)
    given = shlex.split(advice.replace("OUT", out).replace("N", "2"))
    tiny = ["--steps=2", "--mixed-precision=none", "--verbose=0"]
    result = finetune_main([*given, *tiny, "--output-dir", str(tmp_path / "lora")])
    encoder = keras.saving.load_model(os.path.join(out, "encoder.keras"))
    assert result.model.config.architecture == encoder.config.architecture  # the file's, though no --model was given
    assert sum(int(np.prod(v.shape)) for v in result.model.trainable_weights) < encoder.count_params() / 4  # LoRA
    trained = {variable.path for variable in result.model.trainable_weights}
    attention = "encoderblock_0/MultiHeadDotProductAttention_1/out"
    assert f"{attention}/lora_kernel_a" in trained and f"{attention}/kernel" not in trained

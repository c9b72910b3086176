"""The shipped class names (keras_vit/data, from timm 1.0.31) and decode_predictions."""

import numpy as np
import pytest

from keras_vit import labels

pytestmark = pytest.mark.backend_independent  # files, names and checks: the same on every backend


def test_counts_and_order():
    in1k, in21k = labels.wnids("imagenet1k"), labels.wnids("imagenet21k")
    assert len(in1k) == len(set(in1k)) == 1000
    assert len(in21k) == len(set(in21k)) == 21843
    # both heads are indexed by sorted WordNet ids (ILSVRC-2012 and Google's ImageNet-21k)
    assert in1k == sorted(in1k) and in21k == sorted(in21k)
    assert len(labels.class_names("imagenet1k")) == 1000 and len(labels.class_names("imagenet21k")) == 21843


def test_known_entries():
    in1k, names1k = labels.wnids(), labels.class_names()
    assert (in1k[0], names1k[0]) == ("n01440764", "tench")
    assert (in1k[1], names1k[1]) == ("n01443537", "goldfish")
    assert (in1k[999], names1k[999]) == ("n15075141", "toilet tissue")
    assert names1k[134] == names1k[517] == "crane"  # the bird and the machine, as in keras.applications
    assert labels.class_names(synonyms=True)[0] == "tench, Tinca tinca"
    # 21k: sorted ids, so the first and last are WordNet's smallest and largest ids in the set
    in21k, names21k = labels.wnids("imagenet21k"), labels.class_names("imagenet21k")
    assert (in21k[0], names21k[0]) == ("n00004475", "organism")
    assert (in21k[21842], names21k[21842]) == ("n15102894", "knothole")
    # the two classes Google's list has beyond the 21,841 of the fall 2011 release (timm's note)
    assert {"n03931044", "n09859684"} <= set(in21k)
    assert in21k.index("n01440764") < in21k.index("n01443537")


def test_decode_predictions_order_and_scores():
    logits = np.zeros((2, 1000), "float32")
    logits[0, [1, 0, 2]] = [3.0, 2.0, 1.0]  # goldfish, tench, great white shark
    logits[1, 999] = 5.0
    decoded = labels.decode_predictions(logits, top=3)
    assert decoded[0] == [
        ("n01443537", "goldfish", 3.0),
        ("n01440764", "tench", 2.0),
        ("n01484850", "great_white_shark", 1.0),
    ]
    assert decoded[1][0] == ("n15075141", "toilet_tissue", 5.0)
    assert [len(d) for d in decoded] == [3, 3]
    assert labels.decode_predictions(logits[0])[0][0][1] == "goldfish"  # one image, (classes,)


def test_decode_predictions_21k_and_explicit_labels():
    logits = np.zeros((1, 21843), "float32")
    logits[0, 21842] = 1.0
    assert labels.decode_predictions(logits, top=1) == [[("n15102894", "knothole", 1.0)]]
    assert labels.decode_predictions(logits, top=1, labels="imagenet21k")[0][0][1] == "knothole"
    with pytest.raises(ValueError, match="imagenet1k has 1000 classes"):
        labels.decode_predictions(logits, labels="imagenet1k")


def test_wrong_sizes():
    with pytest.raises(ValueError, match="No class names for a head of 10 classes"):
        labels.decode_predictions(np.zeros((1, 10)))
    with pytest.raises(ValueError, match="Unknown labels"):
        labels.class_names("imagenet22k")
    with pytest.raises(ValueError, match=r"shape \(batch, classes\)"):
        labels.decode_predictions(np.zeros((1, 2, 1000)))
    assert labels.label_set(1000) == "imagenet1k" and labels.label_set(21843) == "imagenet21k"


def test_names_are_spelt_as_keras_applications_spells_them():
    """keras.applications' imagenet_class_index.json: WordNet's first lemma with underscores for spaces."""
    logits = np.zeros((1, 1000), "float32")
    logits[0, 386] = 1.0
    assert labels.decode_predictions(logits, top=1) == [[("n02504458", "African_elephant", 1.0)]]
    assert labels.decode_predictions(logits, top=1, spelling="wordnet")[0][0][1] == "African elephant"
    keras_names = labels.class_names(spelling="keras")
    assert keras_names[:3] == ["tench", "goldfish", "great_white_shark"] and keras_names[999] == "toilet_tissue"
    assert keras_names[134] == keras_names[517] == "crane" and keras_names[247] == "Saint_Bernard"
    assert [name.replace("_", " ") for name in keras_names] == labels.class_names()
    with pytest.raises(ValueError, match="spelling"):
        labels.decode_predictions(logits, spelling="timm")

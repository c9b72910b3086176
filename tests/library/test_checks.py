"""The argument checks (keras_vit.checks): good values pass (as Python numbers), bad ones are named."""

import numpy as np
import pytest

from keras_vit.checks import check_choice, check_fraction, check_positive_int

pytestmark = pytest.mark.backend_independent


def test_checks_accept_good_values_and_name_bad_ones():
    assert check_positive_int(np.int64(3), "n") == 3 and type(check_positive_int(np.int64(3), "n")) is int
    assert check_fraction(0, "rate") == 0.0 and check_fraction(np.float32(0.5), "rate") == 0.5
    assert check_choice("a", ("a", "b"), "mode") == "a"
    for bad in (0, -1, 2.0, "3", True, None):
        with pytest.raises(ValueError, match=r"^n must be a positive int, got "):
            check_positive_int(bad, "n")
    for bad in (1, 1.0, -1e-9, "0.1", False, None, float("inf")):
        with pytest.raises(ValueError, match=r"^rate must be a number in \[0, 1\), got "):
            check_fraction(bad, "rate")
    with pytest.raises(ValueError, match=r"Unknown mode 'c'; expected one of \('a', 'b'\)"):
        check_choice("c", ("a", "b"), "mode")

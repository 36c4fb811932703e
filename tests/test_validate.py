"""The shared input rules (icml24.common.validate): good values pass, bad ones fail naming owner and argument."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from icml24.common import validate as v

NAN, INF = float("nan"), float("inf")


def _raises(exc, owner, name):
    return pytest.raises(exc, match=rf"^{re.escape(owner)}: {re.escape(name)} must ")


# ------------------------------------------------------------------------------------------------- numbers
@pytest.mark.parametrize("x", [0, 1, -2.5, 1e300, np.float32(0.5), np.float64(-3.0), np.int64(7),
                               torch.tensor(2.0), torch.tensor(3)])
def test_finite_accepts_real_scalars_and_returns_float(x):
    out = v.finite("Own", "x", x)
    assert type(out) is float and out == float(x)


@pytest.mark.parametrize("x", [NAN, INF, -INF, np.float64("nan"), torch.tensor(INF)])
def test_finite_rejects_non_finite(x):
    with _raises(ValueError, "Own", "x"):
        v.finite("Own", "x", x)


@pytest.mark.parametrize("x", [True, False, "1", None, [1.0], 1 + 2j, torch.zeros(2), torch.tensor(1j)])
def test_number_rules_reject_wrong_types(x):
    for rule in (v.finite, v.positive, v.non_negative, v.probability):
        with _raises(TypeError, "Own", "x"):
            rule("Own", "x", x)
    with _raises(TypeError, "Own", "x"):
        v.in_range("Own", "x", x, 0.0, 1.0)


def test_positive():
    assert v.positive("Opt", "lr", 1e-12) == 1e-12
    assert v.positive("Opt", "lr", np.float32(0.25)) == 0.25
    assert v.positive("Opt", "lr", torch.tensor(3.0)) == 3.0
    for bad in (0, 0.0, -1e-12, NAN, INF):
        with _raises(ValueError, "Opt", "lr") as e:
            v.positive("Opt", "lr", bad)
        assert "> 0" in str(e.value)


def test_non_negative():
    assert v.non_negative("Opt", "wd", 0) == 0.0
    assert v.non_negative("Opt", "wd", np.int32(3)) == 3.0
    for bad in (-1e-12, -1, NAN, INF):
        with _raises(ValueError, "Opt", "wd") as e:
            v.non_negative("Opt", "wd", bad)
        assert ">= 0" in str(e.value)


@pytest.mark.parametrize("low_open,high_open,ok,bad,span", [
    (False, False, [0.0, 0.5, 1.0], [-1e-9, 1.0 + 1e-9], "[0, 1]"),
    (True, False, [1e-9, 1.0], [0.0, 1.5], "(0, 1]"),
    (False, True, [0.0, 1 - 1e-9], [1.0, -0.5], "[0, 1)"),
    (True, True, [0.5], [0.0, 1.0], "(0, 1)"),
])
def test_in_range_ends(low_open, high_open, ok, bad, span):
    for x in ok:
        assert v.in_range("C", "f", x, 0.0, 1.0, low_open=low_open, high_open=high_open) == x
    for x in [*bad, NAN, INF, -INF]:
        with _raises(ValueError, "C", "f") as e:
            v.in_range("C", "f", x, 0.0, 1.0, low_open=low_open, high_open=high_open)
        assert span in str(e.value) and repr(x) in str(e.value)


def test_in_range_other_bounds_and_scalars():
    assert v.in_range("C", "m", np.float64(-2.0), -2.0, 3.0) == -2.0
    assert v.in_range("C", "m", torch.tensor(0.5, dtype=torch.float64), -2.0, 3.0) == 0.5
    with _raises(ValueError, "C", "m"):
        v.in_range("C", "m", 3.5, -2.0, 3.0)


def test_probability():
    assert v.probability("P", "p", 0) == 0.0 and v.probability("P", "p", 1) == 1.0
    assert v.probability("P", "p", np.float32(0.5)) == 0.5
    with _raises(ValueError, "P", "p"):
        v.probability("P", "p", 0.0, open_low=True)
    with _raises(ValueError, "P", "p"):
        v.probability("P", "p", 1.0, open_high=True)
    for bad in (-0.1, 1.1, NAN):
        with _raises(ValueError, "P", "p"):
            v.probability("P", "p", bad)


# ------------------------------------------------------------------------------------------------ integers
def test_integer_accepts_python_and_numpy_ints():
    for x in (0, 5, -3, np.int64(4), np.int8(2)):
        out = v.integer("L", "k", x)
        assert type(out) is int and out == int(x)
    assert v.integer("L", "k", 1, minimum=1, maximum=1) == 1


@pytest.mark.parametrize("x", [True, False, 1.0, 2.5, "3", None, torch.tensor(3), NAN])
def test_integer_rejects_wrong_types(x):
    with _raises(TypeError, "L", "k") as e:
        v.integer("L", "k", x, minimum=1)
    assert "an int >= 1" in str(e.value)


def test_integer_bounds():
    with _raises(ValueError, "L", "k") as e:
        v.integer("L", "k", 0, minimum=1)
    assert str(e.value) == "L: k must be an int >= 1, got 0"
    with _raises(ValueError, "L", "k") as e:
        v.integer("L", "k", 9, minimum=1, maximum=8)
    assert ">= 1 <= 8" in str(e.value)
    with _raises(ValueError, "L", "k"):
        v.integer("L", "k", -1, maximum=-2)


# --------------------------------------------------------------------------------------------- choices etc.
def test_one_of():
    assert v.one_of("Est", "mode", "a", ("a", "b")) == "a"
    assert v.one_of("Est", "mode", None, ["a", None]) is None
    with _raises(ValueError, "Est", "mode") as e:
        v.one_of("Est", "mode", "c", ["a", "b"])
    assert "'a', 'b'" in str(e.value) and "'c'" in str(e.value)


def test_tensor():
    x = torch.zeros(2, 3)
    assert v.tensor("F", "x", x, ndim=2, floating=True) is x
    assert v.tensor("F", "x", x, ndim=(1, 2), dtype=(torch.float32, torch.float64)) is x
    with _raises(TypeError, "F", "x"):
        v.tensor("F", "x", np.zeros((2, 3)))
    with _raises(ValueError, "F", "x") as e:
        v.tensor("F", "x", x, ndim=3)
    assert "(2, 3)" in str(e.value)
    with _raises(ValueError, "F", "x"):
        v.tensor("F", "x", x, ndim=(1, 3))
    with _raises(TypeError, "F", "x"):
        v.tensor("F", "x", x, dtype=torch.float64)
    with _raises(TypeError, "F", "x"):
        v.tensor("F", "x", torch.zeros(2, dtype=torch.long), floating=True)


def test_same_length():
    assert v.same_length("Loss", ("scores", "labels"), 4, 4) == 4
    assert v.same_length("Loss", ("a", "b", "c"), 2, 2, 2) == 2
    with pytest.raises(ValueError, match=r"^Loss: scores and labels must have the same length, "
                                         r"got scores=4, labels=3$"):
        v.same_length("Loss", ("scores", "labels"), 4, 3)


def test_rules_return_plain_python_types():
    assert isinstance(v.finite("o", "n", np.float32(1.5)), float)
    assert not math.isnan(v.in_range("o", "n", np.float64(0.0), 0, 1))

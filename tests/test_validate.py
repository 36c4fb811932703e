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
    assert "an int in [1, 8]" in str(e.value)
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


def test_privacy_budget():
    assert v.privacy_budget("DP", 1, 1e-5) == (1.0, 1e-5)
    assert v.privacy_budget("DP", np.float64(0.5)) == (0.5, None)
    for eps in (0.0, -1.0, NAN, INF):
        with _raises(ValueError, "DP", "epsilon"):
            v.privacy_budget("DP", eps, 1e-5)
    for delta in (0.0, 1.0, -0.1, NAN):
        with _raises(ValueError, "DP", "delta"):
            v.privacy_budget("DP", 1.0, delta)
    with _raises(TypeError, "DP", "target_delta"):
        v.privacy_budget("DP", 1.0, True, delta_name="target_delta")


def test_wrong_types_are_type_and_value_errors():
    for call in (lambda: v.positive("O", "a", "1"), lambda: v.integer("O", "a", 1.0),
                 lambda: v.tensor("O", "a", [1.0]), lambda: v.tensor("O", "a", torch.zeros(1), dtype=torch.long)):
        with pytest.raises(v.ArgumentTypeError) as e:
            call()
        assert isinstance(e.value, TypeError) and isinstance(e.value, ValueError)


def test_each():
    assert v.each("Config", "lrs", [0.1, np.float32(1.0)], v.positive) == (0.1, 1.0)
    assert v.each("Config", "ks", (1, 2), v.integer, minimum=1) == (1, 2)
    assert v.each("Config", "b", (0.0, 1.0), v.in_range, 0.0, 1.0) == (0.0, 1.0)
    for bad in ((), [], "ab", None, 3):
        with _raises(ValueError, "Config", "lrs"):
            v.each("Config", "lrs", bad, v.positive)
    with _raises(ValueError, "Config", "lrs[1]"):
        v.each("Config", "lrs", (0.1, 0.0), v.positive)
    with _raises(ValueError, "Config", "b[0]"):
        v.each("Config", "b", (1.5,), v.in_range, 0.0, 1.0, high_open=True)


def test_at_least():
    assert v.at_least("Opt", "ratio", 1, 1.0) == 1.0
    assert v.at_least("Opt", "ratio", np.float64(16.0), 1.0, strict=True) == 16.0
    with _raises(ValueError, "Opt", "ratio") as e:
        v.at_least("Opt", "ratio", 1.0, 1.0, strict=True)
    assert "> 1" in str(e.value)
    for bad in (0.5, NAN, INF):
        with _raises(ValueError, "Opt", "ratio") as e:
            v.at_least("Opt", "ratio", bad, 1.0)
        assert "a finite number >= 1" in str(e.value)
    with _raises(TypeError, "Opt", "ratio"):
        v.at_least("Opt", "ratio", "2", 1.0)

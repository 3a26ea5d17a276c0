"""is_int / is_real (every request's sampling parameters go through them) say what the number ABCs say, bools
refused, whatever the value's type: plain, numpy, subclasses, other numbers, non-numbers."""

import enum
import fractions
import numbers

import numpy as np
import pytest

from testbed.validation import is_int, is_real


class Level(enum.IntEnum):
    LOW = 1


class MyInt(int):
    pass


class MyFloat(float):
    pass


VALUES = [0, 7, -(2**70), True, False, 1.5, float("nan"), np.int32(3), np.int64(-4), np.uint8(2), np.float32(0.5)]
VALUES += [np.float64(2.0), np.bool_(True), Level.LOW, MyInt(5), MyFloat(2.5), fractions.Fraction(1, 3), 1j, "1"]
VALUES += [None, [1], b"\x01"]


@pytest.mark.parametrize("value", VALUES, ids=[f"{type(v).__name__}-{v!r}" for v in VALUES])
def test_checks_follow_the_number_abcs(value):
    assert is_int(value) == (isinstance(value, numbers.Integral) and not isinstance(value, bool))
    assert is_real(value) == (isinstance(value, numbers.Real) and not isinstance(value, bool))

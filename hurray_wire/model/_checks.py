"""Small argument checks shared by the model classes, raising the caller's error type."""

from __future__ import annotations

import numbers

from hurray_wire.errors import InvalidDescriptorError

U8_MAX = 0xFF
U16_MAX = 0xFFFF
U32_MAX = 0xFFFFFFFF
U64_MAX = 0xFFFFFFFFFFFFFFFF
I32_MIN, I32_MAX = -(2**31), 2**31 - 1


def check_uint(value: object, field: str, maximum: int, *, minimum: int = 0) -> int:
    """``value`` as an int in ``[minimum, maximum]``; bools and non-integers are refused."""
    if type(value) is int and minimum <= value <= maximum:  # the common case, fast
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidDescriptorError("must be an integer", field=field, found=repr(value))
    number = int(value)
    if not minimum <= number <= maximum:
        raise InvalidDescriptorError(
            "out of range", field=field, found=number, expected=f"{minimum}..{maximum}"
        )
    return number


def is_power_of_two(value: int) -> bool:
    """True for 1, 2, 4, ...; False for 0 and everything else."""
    return value > 0 and value & (value - 1) == 0

"""Bit patterns worth drawing for each dtype the format stores (no Hypothesis here).

A tensor drawn in ``mode="bits"`` is an array of unsigned integers of the element's width
viewed as the dtype, so every code is reachable: NaNs with any payload and sign, ``-0.0``,
subnormals, infinities, every float8/float4 code. Uniform draws rarely hit the codes that
break round trips, so each dtype also has a short list of *special* codes, simplest first
(Hypothesis shrinks a ``sampled_from`` towards its first element).
"""

from __future__ import annotations

import struct

import numpy as np

__all__ = [
    "FAMILIES",
    "NAMES",
    "special_codes",
    "element_bits",
    "float64_specials",
    "planted_groups",
    "is_multi_byte_native",
]

#: every dtype name of the format (FORMAT.md §4) in three families — integers and bool, the
#: IEEE floats and complex, the ml_dtypes formats — each simplest first (strategies.dtypes draws
#: a family, then a member: in one flat list the float8 formats were almost never drawn)
FAMILIES: tuple[tuple[str, ...], ...] = (
    ("bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64"),
    ("float32", "float64", "float16", "complex64", "complex128"),
    (
        "bfloat16",
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
        "float8_e8m0fnu",
        "float4_e2m1fn_x2",
    ),
)
#: every dtype name of the format, simplest first
NAMES: tuple[str, ...] = tuple(n for family in FAMILIES for n in family)

# exponent and mantissa bits of the IEEE-style formats wider than a byte
_IEEE = {"float16": (5, 10), "bfloat16": (8, 7), "float32": (8, 23), "float64": (11, 52)}
_WIDTH = {
    "bool": 8,
    "uint8": 8,
    "int8": 8,
    "uint16": 16,
    "int16": 16,
    "uint32": 32,
    "int32": 32,
    "uint64": 64,
    "int64": 64,
    "float16": 16,
    "bfloat16": 16,
    "float32": 32,
    "float64": 64,
    "complex64": 64,
    "complex128": 128,
}


def element_bits(name: str) -> int:
    """Width of one element in bits (complex128: 128, drawn as two 64-bit halves)."""
    return _WIDTH.get(name, 8)


def is_multi_byte_native(name: str) -> bool:
    """A numpy-native dtype wider than a byte (one that has a big-endian variant)."""
    return name in _WIDTH and _WIDTH[name] > 8 and name != "bfloat16"


def _ieee(exp_bits: int, mant_bits: int) -> list[int]:
    m = mant_bits
    sign = 1 << (exp_bits + m)
    exp_mask = ((1 << exp_bits) - 1) << m
    mant_mask = (1 << m) - 1
    one = ((1 << (exp_bits - 1)) - 1) << m
    quiet = exp_mask | (1 << (m - 1))
    return [
        0,
        sign,  # -0.0
        one,  # 1.0
        sign | one,  # -1.0
        quiet,  # the canonical quiet NaN
        sign | quiet,  # negative NaN
        quiet | 1,  # quiet NaN with a payload
        exp_mask | 1,  # signalling NaN
        sign | exp_mask | mant_mask,  # all ones: negative NaN, full payload
        exp_mask,  # inf
        sign | exp_mask,  # -inf
        1,  # smallest subnormal
        sign | 1,
        mant_mask,  # largest subnormal
        1 << m,  # smallest normal
        exp_mask - (1 << m) | mant_mask,  # largest finite
        sign | (exp_mask - (1 << m)) | mant_mask,
    ]


def _integers(bits: int) -> list[int]:
    top = 1 << (bits - 1)
    return [0, 1, (1 << bits) - 1, 2, top, top - 1, top + 1, (1 << bits) - 2]


# one-byte formats: the codes around the sign bit and the all-ones corners (NaN, inf, -0.0
# and the largest finite codes of every float8/float4 variant sit there); any other code is
# reached by the uniform draw of 256 values
_BYTE = [0, 0x80, 0x7F, 0xFF, 0x01, 0x81, 0x7E, 0xFE, 0x7C, 0xFC, 0x7D, 0x78, 0x88, 0x08]


def special_codes(name: str) -> list[int]:
    """Unsigned codes of ``name``'s element width (complex: of each half), simplest first."""
    if name == "bool":
        return [0, 1]
    if name in _IEEE:
        return _ieee(*_IEEE[name])
    if name == "complex64":
        return _ieee(8, 23)
    if name == "complex128":
        return _ieee(11, 52)
    if name.startswith(("int", "uint")):
        return _integers(_WIDTH[name])
    return list(_BYTE)


def planted_groups(name: str) -> list[list[int]]:
    """Special codes of ``name`` (of each half, for complex) worth planting into drawn
    arrays, in groups a bug treats alike: NaNs (the canonical one and four others: negative,
    with a payload, signalling, all ones), ``-0.0``, subnormals, infinities, the extremes of
    the exponent (the codes a narrower format cannot hold). One-byte formats: the codes
    around the sign bit and the all-ones corners. ``[]`` for integers and bool, whose special
    values are drawn often enough."""
    if name == "bool" or name.startswith(("int", "uint")):
        return []
    if name in _IEEE or name.startswith("complex"):
        c = special_codes(name)
        return [c[4:9], [c[1]], c[11:14], c[9:11], c[14:17]]
    return [[0x80], [0x7F, 0xFF], [0x7E, 0xFE, 0x7C, 0xFC, 0x7D], [0x01, 0x81, 0x78, 0x88, 0x08]]


def float64_specials() -> list[float]:
    """Python floats with the special bit patterns of binary64 (NaN payloads, -0.0...)."""
    return [struct.unpack("<d", struct.pack("<Q", c))[0] for c in _ieee(11, 52)]


def uint_dtype(bits: int) -> np.dtype:
    """The unsigned integer dtype of ``bits`` (64 for the halves of complex128)."""
    return np.dtype(
        {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64, 128: np.uint64}[bits]
    )

"""crc32c of the reference reader (:mod:`reference_reader`), written here from the definition
(Castagnoli, reflected polynomial 0x82F63B78): no ``shardpoint`` or crc library import."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["crc32c"]


# ---- crc32c (Castagnoli, reflected polynomial 0x82F63B78) -------------------------------------

_POLY = 0x82F63B78


def _make_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ _POLY if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _make_table()
_NP_TABLE = np.array(_TABLE, dtype=np.uint32)
_SMALL = 1 << 14


def _update_py(reg: int, data: bytes | memoryview) -> int:
    t = _TABLE
    for b in bytes(data):
        reg = t[(reg ^ b) & 0xFF] ^ (reg >> 8)
    return reg


def _apply(cols: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Apply the GF(2)-linear map whose images of the 32 unit vectors are ``cols`` to ``x``."""
    out = np.zeros_like(x)
    for j in range(32):
        out ^= np.where((x >> np.uint32(j)) & np.uint32(1), cols[j], np.uint32(0))
    return out


def _zeros_op(n: int) -> np.ndarray:
    """The linear map 'feed n zero bytes into the crc register', as 32 column images."""
    unit = np.array([1 << j for j in range(32)], dtype=np.uint32)
    one = unit.copy()  # one zero byte
    one = _NP_TABLE[one & np.uint32(0xFF)] ^ (one >> np.uint32(8))
    result = unit.copy()  # identity
    power = one
    while n:
        if n & 1:
            result = _apply(power, result)
        n >>= 1
        if n:
            power = _apply(power, power)
    return result


def crc32c(data: bytes | bytearray | memoryview | np.ndarray) -> int:
    """CRC-32C of ``data``: table-driven; large inputs are split into equal lanes processed in
    parallel with numpy and combined with the zero-byte operator (crc linearity)."""
    buf = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    n = buf.size
    if n < _SMALL:
        return _update_py(0xFFFFFFFF, buf.tobytes()) ^ 0xFFFFFFFF
    # Starting from 0xFFFFFFFF equals starting from 0 with the first 4 bytes complemented.
    head = buf[:4] ^ np.uint8(0xFF)
    lanes_n = 1 << max(1, (math.isqrt(n).bit_length() - 1))
    lane_len = n // lanes_n
    body = np.concatenate([head, buf[4 : lanes_n * lane_len]]).reshape(lanes_n, lane_len)
    cols_t = np.ascontiguousarray(body.T)
    reg = np.zeros(lanes_n, dtype=np.uint32)
    for j in range(lane_len):
        reg = _NP_TABLE[(reg ^ cols_t[j]) & np.uint32(0xFF)] ^ (reg >> np.uint32(8))
    op = _zeros_op(lane_len)
    while reg.size > 1:
        reg = _apply(op, reg[0::2]) ^ reg[1::2]
        op = _apply(op, op)
    r = _update_py(int(reg[0]), buf[lanes_n * lane_len :].tobytes())
    return r ^ 0xFFFFFFFF

"""The protobuf wire format for many rows at once: varints and fields as numpy uint8 blocks.

A *part* is one field of n rows, as a list of segments laid side by side (key bytes, a length,
the value): each ``(bytes (n, w) uint8, mask (n, w) bool or None when every byte is used,
lengths (n,) or one int)``. Parts in field-number order, compacted by ``left_aligned``, are the
rows' canonical encodings (minimal varints, fields in order). Segments are not joined until
then: each join would copy every row again.
"""
from __future__ import annotations

import numpy as np

__all__ = ["varint", "varint_block", "const", "length", "tagged", "le64", "fixed64", "length_delimited",
           "matrix", "left_aligned"]

_U64 = np.uint64
_THRESH = [1 << (7 * k) for k in range(1, 10)]


def varint(x: int) -> bytes:
    """One varint (two's complement for a negative int, as int64 fields are encoded)."""
    x &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = x & 0x7F
        x >>= 7
        if x:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _vlen(x: int) -> int:
    return 1 + sum(x >= t for t in _THRESH)


def varint_block(v: np.ndarray, w: int | None = None):
    """Varints of uint64 values as a (n, w) uint8 block, its byte mask (None: all bytes used)
    and lengths (an int when all values have the same length)."""
    v = np.asarray(v).astype(_U64, copy=False)
    n = len(v)
    if n:
        lo, hi = _vlen(int(v.min())), _vlen(int(v.max()))
    else:
        lo = hi = 1
    if w is None:
        w = hi
    blk = np.empty((n, w), np.uint8)
    if lo == hi and w == hi:  # uniform length: continuation bits are per column constants
        x = v.copy()
        for k in range(w):
            col = x.astype(np.uint8)
            col &= 0x7F
            if k < w - 1:
                col |= 0x80
            blk[:, k] = col
            if k < w - 1:
                x >>= _U64(7)
        return blk, None, hi
    lens = np.ones(n, np.int64)
    for t in _THRESH[:max(hi, 1) - 1]:
        lens += v >= _U64(t)
    msk = np.empty((n, w), bool)
    x = v.copy()
    for k in range(w):
        col = x.astype(np.uint8)
        col &= 0x7F
        col |= (lens > k + 1).view(np.uint8) << 7
        blk[:, k] = col
        msk[:, k] = lens > k
        x >>= _U64(7)
    return blk, msk, lens


def const(b: bytes, n: int) -> list:
    """The same bytes in every row."""
    return [(np.broadcast_to(np.frombuffer(b, np.uint8), (n, len(b))), None, len(b))]


def length(part: list):
    """Bytes per row of ``part`` (an array, or an int when all rows have the same)."""
    return sum(lens for _, _, lens in part)


def tagged(tag: bytes, values: np.ndarray) -> list:
    """Field ``tag`` (its key bytes; b"" for a bare varint) with varint ``values`` (uint64)."""
    return const(tag, len(values)) + [varint_block(values)]


def le64(bits: np.ndarray) -> np.ndarray:
    """int64s as rows of 8 little-endian bytes (fixed64, double)."""
    return np.ascontiguousarray(bits.astype("<i8")).view(np.uint8).reshape(-1, 8)


def fixed64(tag: bytes, bits: np.ndarray) -> list:
    """Field ``tag`` with 8 little-endian bytes per row (``bits``: int64 bit patterns)."""
    return const(tag, len(bits)) + [(le64(bits), None, 8)]


def length_delimited(tag: bytes, part: list) -> list:
    """Field ``tag`` holding ``part`` as a message of fewer than 128 bytes (one length byte)."""
    n = len(part[0][0])
    lens = np.broadcast_to(np.asarray(length(part), np.int64), (n,))
    assert int(lens.max(initial=0)) < 128
    return const(tag, n) + [(lens.astype(np.uint8)[:, None], None, 1)] + part


def matrix(parts: list[list], n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The parts' n rows side by side: (bytes (n, w), the bytes in use, each row's length).
    The bytes every row has (keys, constants) are written once, into a row copied for all."""
    segments = [s for p in parts for s in p]
    width = sum(blk.shape[1] for blk, _, _ in segments)
    same = np.zeros(width, np.uint8)
    at = 0
    for blk, msk, _ in segments:
        if msk is None and blk.strides[0] == 0:   # a broadcast row: the same bytes in every row
            same[at:at + blk.shape[1]] = blk[0] if n else 0
        at += blk.shape[1]
    blk_all = np.broadcast_to(same, (n, width)).copy()
    msk_all = np.ones((n, width), bool)
    at = 0
    for blk, msk, _ in segments:
        w = blk.shape[1]
        if blk.strides[0] != 0:
            blk_all[:, at:at + w] = blk
        if msk is not None:
            msk_all[:, at:at + w] = msk
        at += w
    return blk_all, msk_all, np.broadcast_to(np.asarray(sum(lens for _, _, lens in segments), np.int64), (n,))


def left_aligned(parts: list[list], into: np.ndarray) -> np.ndarray:
    """The parts' rows laid end to end into the rows of ``into`` (n, at least the longest),
    unused bytes dropped; returns each row's length."""
    blk, msk, lens = matrix(parts, len(into))
    into[np.arange(into.shape[1]) < lens[:, None]] = blk[msk]   # row-major both sides: bytes keep their rows
    return lens

"""Read a screenshot PNG in pure Python (zlib), to check that a browser really drew a page.

Handles what headless Chromium writes: 8-bit RGB or RGBA, not interlaced, any of the five
row filters. :func:`decode` gives the pixels; :func:`colour_stats` what a check needs.
Pure: bytes in, numbers out.
"""

from __future__ import annotations

import struct
import zlib
from collections import Counter
from dataclasses import dataclass

_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_CHANNELS = {2: 3, 6: 4}  # colour type -> bytes per pixel at 8 bits


@dataclass(frozen=True, slots=True)
class Image:
    """Decoded pixels: ``rows[y]`` is ``width * channels`` bytes (RGB or RGBA)."""

    width: int
    height: int
    channels: int
    rows: tuple[bytes, ...]

    def pixel(self, x: int, y: int) -> tuple[int, int, int]:
        at = x * self.channels
        r, g, b = self.rows[y][at:at + 3]
        return r, g, b


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def _unfilter(kind: int, row: bytearray, prior: bytes, bpp: int) -> bytes:
    if kind == 0:
        return bytes(row)
    if kind == 2:
        return bytes((x + p) & 0xFF for x, p in zip(row, prior, strict=True))
    for i in range(len(row)):
        left = row[i - bpp] if i >= bpp else 0
        if kind == 1:
            row[i] = (row[i] + left) & 0xFF
        elif kind == 3:
            row[i] = (row[i] + ((left + prior[i]) >> 1)) & 0xFF
        elif kind == 4:
            upper_left = prior[i - bpp] if i >= bpp else 0
            row[i] = (row[i] + _paeth(left, prior[i], upper_left)) & 0xFF
        else:
            raise ValueError(f"PNG row filter {kind} does not exist")
    return bytes(row)


def decode(data: bytes) -> Image:
    """The pixels of ``data``; ValueError for anything but an 8-bit RGB(A) PNG."""
    if not data.startswith(_SIGNATURE):
        raise ValueError("not a PNG file")
    at = len(_SIGNATURE)
    header: tuple[int, ...] = ()
    compressed = bytearray()
    while at < len(data):
        (length,) = struct.unpack_from(">I", data, at)
        kind = data[at + 4:at + 8]
        body = data[at + 8:at + 8 + length]
        if zlib.crc32(kind + body) != struct.unpack_from(">I", data, at + 8 + length)[0]:
            raise ValueError(f"bad CRC in PNG chunk {kind!r}")
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            compressed += body
        elif kind == b"IEND":
            break
        at += 12 + length
    width, height, depth, colour, _, _, interlace = header
    if depth != 8 or colour not in _CHANNELS or interlace:
        raise ValueError(f"unsupported PNG: depth {depth}, colour type {colour}, "
                         f"interlace {interlace}")
    channels = _CHANNELS[colour]
    stride = width * channels
    raw = zlib.decompress(bytes(compressed))
    rows: list[bytes] = []
    prior = bytes(stride)
    for y in range(height):
        start = y * (stride + 1)
        prior = _unfilter(raw[start], bytearray(raw[start + 1:start + 1 + stride]), prior,
                          channels)
        rows.append(prior)
    return Image(width, height, channels, tuple(rows))


def colour_stats(image: Image) -> tuple[Counter[tuple[int, int, int]], int]:
    """Every RGB colour with its pixel count, and how many rows hold a pixel unlike the
    top-left one (the background)."""
    counts: Counter[tuple[int, int, int]] = Counter()
    background = image.pixel(0, 0)
    drawn_rows = 0
    step = image.channels
    for row in image.rows:
        pixels = [(row[i], row[i + 1], row[i + 2]) for i in range(0, len(row), step)]
        counts.update(pixels)
        drawn_rows += any(p != background for p in pixels)
    return counts, drawn_rows

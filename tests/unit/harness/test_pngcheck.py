"""tests/pngcheck.py decodes what it is given, whichever row filters the encoder chose."""

from __future__ import annotations

import struct
import zlib

import pytest

from tests.pngcheck import Image, _paeth, colour_stats, decode


def chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(
        ">I", zlib.crc32(kind + body))


def filtered(kind: int, row: bytes, prior: bytes, bpp: int) -> bytes:
    """The encoder's side of each PNG filter (the decoder must undo it)."""
    out = bytearray()
    for i, x in enumerate(row):
        left = row[i - bpp] if i >= bpp else 0
        upper_left = prior[i - bpp] if i >= bpp else 0
        predictor = [0, left, prior[i], (left + prior[i]) >> 1,
                     _paeth(left, prior[i], upper_left)][kind]
        out.append((x - predictor) & 0xFF)
    return bytes(out)


def png(rows: list[bytes], width: int, channels: int) -> bytes:
    colour = {3: 2, 4: 6}[channels]
    raw = bytearray()
    prior = bytes(width * channels)
    for y, row in enumerate(rows):
        kind = y % 5  # every filter, in turn
        raw += bytes([kind]) + filtered(kind, row, prior, channels)
        prior = row
    header = struct.pack(">IIBBBBB", width, len(rows), 8, colour, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(bytes(raw))) + chunk(b"IEND", b""))


@pytest.mark.parametrize("channels", [3, 4])
def test_every_filter_decodes_back(channels: int) -> None:
    width = 7
    rows = [bytes((x * 37 + y * 91 + c * 13) % 256 for x in range(width)
                  for c in range(channels)) for y in range(10)]
    image = decode(png(rows, width, channels))
    assert (image.width, image.height, image.channels) == (width, 10, channels)
    assert list(image.rows) == rows


def test_colour_stats_count_colours_and_drawn_rows() -> None:
    white, ink = b"\xff\xff\xff", b"\x10\x20\x30"
    image = Image(3, 3, 3, (white * 3, white + ink + white, white * 3))
    counts, drawn = colour_stats(image)
    assert counts == {(255, 255, 255): 8, (16, 32, 48): 1} and drawn == 1


def test_not_a_png_or_a_bad_crc_is_refused() -> None:
    with pytest.raises(ValueError, match="not a PNG"):
        decode(b"GIF89a")
    good = png([b"\x00\x00\x00"], 1, 3)
    with pytest.raises(ValueError, match="CRC"):
        decode(good[:20] + bytes([good[20] ^ 1]) + good[21:])

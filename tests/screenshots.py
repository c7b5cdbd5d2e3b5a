"""Reading Chromium screenshots without Pillow: decode a PNG and find where text was drawn.

The layout tests check what a person would see, not only what the DOM says: that a column's
header is actually painted inside the screenshot, and that two headers are apart (a strip of
background between them) rather than run together.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Image", "read_png"]

_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class Image:
    """An RGB(A) image as rows of bytes (``channels`` bytes per pixel)."""

    width: int
    height: int
    channels: int
    rows: list[bytes]

    def pixel(self, x: int, y: int) -> tuple[int, int, int]:
        i = x * self.channels
        row = self.rows[y]
        return row[i], row[i + 1], row[i + 2]

    def inked_columns(
        self, left: int, right: int, top: int, bottom: int, *, threshold: int = 60
    ) -> list[bool]:
        """For each x in ``[left, right)``: does any pixel of rows ``[top, bottom)`` differ from
        the background (the colour at ``(left, top)``) by more than ``threshold`` in a channel?
        """
        left, right = max(left, 0), min(right, self.width)
        top, bottom = max(top, 0), min(bottom, self.height)
        background = self.pixel(left, top)
        inked = []
        for x in range(left, right):
            inked.append(
                any(
                    max(abs(a - b) for a, b in zip(self.pixel(x, y), background, strict=True))
                    > threshold
                    for y in range(top, bottom)
                )
            )
        return inked


def read_png(path: Path) -> Image:
    """Decode an 8-bit, non-interlaced RGB or RGBA PNG (what Chromium writes)."""
    data = path.read_bytes()
    if not data.startswith(_SIGNATURE):
        raise ValueError(f"{path} is not a PNG")
    pos = len(_SIGNATURE)
    idat = b""
    width = height = channels = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or color not in (2, 6) or interlace:
                raise ValueError(f"unsupported PNG (depth {depth}, colour type {color})")
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    raw = zlib.decompress(idat)
    stride = width * channels
    rows: list[bytes] = []
    previous = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        filter_type = raw[start]
        line = bytearray(raw[start + 1 : start + 1 + stride])
        _unfilter(filter_type, line, previous, channels)
        rows.append(bytes(line))
        previous = line
    return Image(width, height, channels, rows)


def _unfilter(kind: int, line: bytearray, prior: bytearray, bpp: int) -> None:
    if kind == 0:
        return
    for i in range(len(line)):
        left = line[i - bpp] if i >= bpp else 0
        up = prior[i]
        if kind == 1:
            line[i] = (line[i] + left) & 0xFF
        elif kind == 2:
            line[i] = (line[i] + up) & 0xFF
        elif kind == 3:
            line[i] = (line[i] + (left + up) // 2) & 0xFF
        elif kind == 4:
            corner = prior[i - bpp] if i >= bpp else 0
            p = left + up - corner
            pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
            predictor = left if pa <= pb and pa <= pc else up if pb <= pc else corner
            line[i] = (line[i] + predictor) & 0xFF
        else:
            raise ValueError(f"unknown PNG filter {kind}")

"""Checks a screenshot PNG (stdlib only: zlib and the PNG filters).

Usage: png_check.py FILE WIDTH HEIGHT
Exits 0 when the image is WIDTH x HEIGHT, is not blank (some ink: pixels that differ from the
background, taken as the most common colour), is not one big blot (ink under 60% of the pixels), and
has ink in both the left and right halves (the layout uses the width). Prints what it measured.
"""
import struct
import sys
import zlib
from collections import Counter


def read_png(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise SystemExit(f"{path}: not a PNG")
    pos, idat, w = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or ctype not in (2, 6) or interlace:
                raise SystemExit(f"{path}: unsupported PNG (depth {depth}, colour type {ctype}, interlace {interlace})")
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    raw, stride, rows, prev = zlib.decompress(idat), w * bpp, [], bytearray(w * bpp)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return w, h, bpp, rows


path, want_w, want_h = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
w, h, bpp, rows = read_png(path)
px = lambda row, x: row[x * bpp:x * bpp + 3]
bg = Counter(px(r, x) for r in rows[::7] for x in range(0, w, 7)).most_common(1)[0][0]
ink = left = right = 0
for r in rows:
    for x in range(w):
        if px(r, x) != bg:
            ink += 1
            if x < w // 2:
                left += 1
            else:
                right += 1
frac = ink / float(w * h)
print(f"{path}: {w}x{h}, background {bg.hex()}, ink {frac:.1%} (left {left}, right {right})")
ok = (w, h) == (want_w, want_h) and 0.005 < frac < 0.6 and left > 0 and right > 0
sys.exit(0 if ok else 1)

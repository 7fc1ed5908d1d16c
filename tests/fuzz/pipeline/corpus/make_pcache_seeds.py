#!/usr/bin/env python3
"""Writes the seed corpus for fuzz_pcache into corpus/pcache/.

Prefix cache files (common/src/pipeline/pcache.h) for the fuzz target's
key: valid ones (no entries, one, three added out of order, mixed shapes),
a few damaged ones, and "framed" inputs (0xff, then record data with u16
lengths: the target frames them with valid CRCs). Only the standard
library: CRC-32C is computed here bit by bit, the format written from its
description, independently of pcache.c (three_4x5x3_shuffled is byte for
byte what the C writer makes). Run from any directory; the outputs are
committed (each under 4 KB)."""
import os
import struct

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pcache")

# The fuzz target's key (fuzz_pcache.c).
PREFIX_FP = 0x0123456789ABCDEF
PATH = b"shard-00000.tfrecord"
FILE_SIZE, MTIME_NS, BYTE_OFFSET, BYTE_END = 1000, 1, 0, 1000
FIRST_RECORD, MAX_RECORDS = 0, 0


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c ^= b
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    return c ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def record(payload):
    length = struct.pack("<Q", len(payload))
    return (length + struct.pack("<I", masked(length)) + payload +
            struct.pack("<I", masked(payload)))


def header(path=PATH):
    return record(b"FERRYPC1" + struct.pack(
        "<QQqQQQQI", PREFIX_FP, FILE_SIZE, MTIME_NS, BYTE_OFFSET, BYTE_END,
        FIRST_RECORD, MAX_RECORDS, len(path)) + path)


def pixels(pos, n):
    return bytes((pos * 131 + i * 7) & 0xFF for i in range(n))


def cache_file(shapes, order, path=PATH):
    """shapes[pos] = (h, w, c); entries written in `order`."""
    out = header(path)
    offsets = [0] * len(shapes)
    for pos in order:
        h, w, c = shapes[pos]
        offsets[pos] = len(out)
        out += record(struct.pack("<QQQqIII", pos, 100 + pos, 4096 * pos,
                                  -pos, h, w, c) + pixels(pos, h * w * c))
    footer_off = len(out)
    out += record(b"FERRYPCF" + struct.pack("<Q", len(shapes)) +
                  b"".join(struct.pack("<Q", o) for o in offsets))
    out += record(b"FERRYPCT" + struct.pack("<Q", footer_off))
    return out


def pieces(shapes, order, path=PATH):
    """The same file as the fuzz target's "framed" input: 0xff, then each
    record's data with a u16 length; the target adds framing and trailer."""
    out = b"\xff"
    data = cache_file(shapes, order, path)
    at = 0
    while at < len(data) - 32:  # the trailer is the target's
        (n,) = struct.unpack_from("<Q", data, at)
        out += struct.pack("<H", n) + data[at + 12:at + 12 + n]
        at += n + 16
    return out


def main():
    os.makedirs(HERE, exist_ok=True)
    three = cache_file([(4, 5, 3)] * 3, [2, 0, 1])
    seeds = {
        "empty_split": cache_file([], []),
        "one_1x1x1": cache_file([(1, 1, 1)], [0]),
        "three_4x5x3_shuffled": three,
        "mixed_shapes": cache_file([(2, 3, 4), (7, 1, 1), (3, 3, 2),
                                    (1, 9, 3)], [3, 1, 0, 2]),
        "other_path": cache_file([(2, 2, 1)], [0], b"shard-00001.tfrecord"),
        "truncated": three[:-7],
        "flipped_in_entry": three[:150] + bytes([three[150] ^ 0x20]) +
        three[151:],
        "framed_three": pieces([(4, 5, 3)] * 3, [2, 0, 1]),
        "framed_mixed": pieces([(2, 3, 4), (7, 1, 1), (3, 3, 2)], [1, 2, 0]),
        "framed_empty_split": pieces([], []),
        "flipped_in_footer": three[:-40] + bytes([three[-40] ^ 1]) +
        three[-39:],
    }
    for name, data in seeds.items():
        with open(os.path.join(HERE, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Writes the seed corpus for fuzz_tfrecord into corpus/tfrecord/.

Small TFRecord files, plain, gzip and zlib, and a few damaged ones. Only
the standard library: CRC-32C is computed here bit by bit. Run from any
directory; the outputs are committed (each under 4 KB)."""
import gzip
import os
import struct
import zlib

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tfrecord")


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


def main():
    os.makedirs(HERE, exist_ok=True)
    payloads = [b"", b"hello", b"x" * 100, bytes(range(256)), b"12345"]
    plain = b"".join(record(p) for p in payloads)
    seeds = {
        "plain.tfrecord": plain,
        "one_empty.tfrecord": record(b""),
        "plain.gz": gzip.compress(plain, mtime=0),
        "plain.zz": zlib.compress(plain),
    }
    bad = bytearray(plain)
    bad[16 + 9] ^= 0x20  # length CRC of record 1
    seeds["bad_lencrc.tfrecord"] = bytes(bad)
    bad = bytearray(plain)
    bad[16 + 12 + 2] ^= 0x01  # a data byte of record 1
    seeds["bad_datacrc.tfrecord"] = bytes(bad)
    seeds["truncated.tfrecord"] = plain[:len(plain) - 3]
    seeds["truncated.gz"] = gzip.compress(plain, mtime=0)[:-12]
    # Record 2 claims 2^40 bytes with a valid length CRC.
    length = struct.pack("<Q", 1 << 40)
    huge = length + struct.pack("<I", masked(length))
    seeds["huge_length.tfrecord"] = record(b"a") + huge + record(b"b")
    for name, data in seeds.items():
        assert len(data) < 4096, name
        with open(os.path.join(HERE, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()

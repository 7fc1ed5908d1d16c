#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_example: small tf.train.Example records
encoded by hand (no protobuf library), each under 4 KB, into
tests/fuzz/records/corpus/example/. Run from anywhere; the output is
deterministic.
"""
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "example")


def varint(v):
    v &= (1 << 64) - 1  # int64 values are two's complement
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def tag(field, wire):
    return varint(field << 3 | wire)


def ld(field, body):
    return tag(field, 2) + varint(len(body)) + body


def bytes_list(*values):
    return ld(1, b"".join(ld(1, v) for v in values))


def float_list(values, packed=True):
    if packed:
        return ld(2, ld(1, b"".join(struct.pack("<f", v) for v in values)))
    return ld(2, b"".join(tag(1, 5) + struct.pack("<f", v) for v in values))


def int64_list(values, packed=True):
    if packed:
        return ld(3, ld(1, b"".join(varint(v) for v in values)))
    return ld(3, b"".join(tag(1, 0) + varint(v) for v in values))


def entry(key, feature, value_first=False):
    k = ld(1, key.encode())
    v = ld(2, feature)
    return ld(1, v + k if value_first else k + v)


def example(*entries):
    return ld(1, b"".join(entries))


UNKNOWN = (tag(9, 0) + varint(12345) + tag(10, 1) + b"\x01" * 8 +
           ld(11, b"skip") + tag(12, 5) + b"\x02" * 4)

SEEDS = {
    "raw_image": example(
        entry("image", bytes_list(bytes(range(256)) * 3)),
        entry("label", int64_list([7])),
        entry("id", int64_list([123456789]))),
    "floats_mixed": example(
        entry("bbox", ld(2, ld(1, struct.pack("<2f", 0.25, 0.5)) +
                         tag(1, 5) + struct.pack("<f", -1.5))),
        entry("unpacked", float_list([1.0, 2.0], packed=False))),
    "int64_negative": example(
        entry("neg", int64_list([-1, -2**63, 2**63 - 1, 0, 300])),
        entry("unpacked", int64_list([5, -5], packed=False))),
    "unknown_fields": UNKNOWN + ld(1, UNKNOWN + ld(
        1, UNKNOWN + ld(1, b"k") + ld(2, UNKNOWN + ld(
            1, UNKNOWN + ld(1, b"v"))))) + UNKNOWN,
    "orders_and_repeats": example(
        entry("dup", int64_list([1])),
        entry("rev", bytes_list(b"x"), value_first=True),
        entry("dup", bytes_list(b"later")),
        ld(1, ld(2, b"")),              # no key, empty Feature
        ld(1, ld(1, b"novalue")),       # no value
        entry("oneof", int64_list([1]) + bytes_list(b"last"))) +
        example(entry("second", float_list([3.0]))),
    "empty_lists": example(
        entry("b", ld(1, b"")), entry("f", ld(2, b"")),
        entry("i", ld(3, b"")), entry("none", b"")),
    "sequence_example": example(entry("ctx", int64_list([1]))) +
        ld(2, ld(1, ld(1, b"seq") + ld(2, ld(1, int64_list([1, 2]))))),
    "many_keys": example(*[entry("key/%d" % i, int64_list([i]))
                           for i in range(40)]),
    "empty": b"",
}


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, data in SEEDS.items():
        assert len(data) < 4096, name
        with open(os.path.join(OUT, name + ".pb"), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()

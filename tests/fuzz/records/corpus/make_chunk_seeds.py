#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_chunk: ferry.v1.Chunk messages written
by hand (header fields, then the payload last, as workers send them),
each preceded by one byte that the target turns into a slice size."""
import os

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chunk")


def varint(v):
    out = bytearray()
    v &= (1 << 64) - 1
    while v >= 0x80:
        out.append(v & 0x7F | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def field(num, wire, body):
    return varint(num << 3 | wire) + body


def chunk(count, h, w, c, first=0, last=False, error=None, packed=True):
    m = field(1, 0, varint(7)) + field(2, 0, varint(1))
    m += field(3, 0, varint(12)) + field(4, 0, varint(2))
    m += field(5, 0, varint(first)) + field(6, 0, varint(count))
    m += field(7, 0, varint(h)) + field(8, 0, varint(w)) + field(9, 0, varint(c))
    labels = [i % 10 for i in range(count)]
    ids = [(3 << 40) | (first + i) for i in range(count)]
    if packed:
        m += field(10, 2, varint(len(b"".join(varint(x) for x in labels))) +
                   b"".join(varint(x) for x in labels))
        body = b"".join(varint(x) for x in ids)
        m += field(11, 2, varint(len(body)) + body)
    else:
        for x in labels:
            m += field(10, 0, varint(x))
        for x in ids:
            m += field(11, 0, varint(x))
    if last:
        m += field(12, 0, varint(1))
    if error:
        m += field(13, 0, varint(-1004)) + field(14, 2, varint(len(error)) + error)
    payload = bytes((i * 7) & 0xFF for i in range(count * h * w * c))
    m += field(15, 2, varint(len(payload)) + payload)
    return m


seeds = {
    "one_record": b"\x00" + chunk(1, 4, 4, 3),
    "four_records_sliced": b"\x05" + chunk(4, 6, 6, 3, first=8),
    "unpacked": b"\x01" + chunk(3, 2, 2, 1, packed=False),
    "last_empty": b"\x02" + chunk(0, 8, 8, 3, first=40, last=True),
    "error": b"\x03" + chunk(0, 0, 0, 0, error=b"a.tfrecord: byte offset 42: record data CRC mismatch"),
    "truncated": b"\x04" + chunk(2, 4, 4, 3)[:-5],
}
os.makedirs(here, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(here, name + ".bin"), "wb") as f:
        f.write(data)

"""Writes TFRecord files with TensorFlow for Ferry's reader to check.

Usage: tf_write.py OUTDIR

For each compression (none, GZIP, ZLIB) it writes:
  raw_<c>.tfrecord       records of assorted sizes (0 bytes to just over
                         1 MiB) of pseudo-random bytes;
  examples_<c>.tfrecord  tf.train.Example records with bytes, int64 and
                         float features: negative and extreme int64s,
                         special floats, empty lists, a Feature with no
                         kind, multi-valued lists, many keys;
  empty_<c>.tfrecord     a file with no records.
and OUTDIR/expected.txt, a line format that interop_check.c parses:

  file NAME COMPRESSION NRECORDS raw|example
  rec INDEX LENGTH SHA256HEX
  feat KEYHEX KIND COUNT VALUE...     (example files, after each rec)

KIND is bytes, int64, float or none. Bytes values are hex ("-" for an
empty value, "#LEN:SHA256HEX" for one over 64 bytes), int64 values
decimal, float values the 8 hex digits of the float32 bit pattern (so NaN,
-0.0 and denormals compare exactly).
"""

import hashlib
import os
import struct
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

COMPRESSIONS = [("none", ""), ("gzip", "GZIP"), ("zlib", "ZLIB")]

# Sizes chosen to cross buffer and varint boundaries: 0, tiny, 127/128
# (one/two byte varints), 64 KiB +- 1 (typical I/O and inflate buffer
# sizes), 1 MiB and just over.
RAW_SIZES = [0, 1, 2, 15, 16, 127, 128, 1000, 4095, 4096, 4097, 65535,
             65536, 65537, 300001, 1 << 20, (1 << 20) + 3, 0, 5]

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1


def raw_records():
    rng = np.random.RandomState(20240611)
    out = []
    for n in RAW_SIZES:
        out.append(rng.randint(0, 256, size=n, dtype=np.uint8).tobytes())
    return out


def feature_bytes(values):
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))


def feature_int64(values):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=values))


def feature_float(values):
    return tf.train.Feature(float_list=tf.train.FloatList(value=values))


def example_records():
    rng = np.random.RandomState(7)
    out = []
    # An image-like record, as ferryctl gen and most datasets write.
    img = rng.randint(0, 256, size=32 * 32 * 3, dtype=np.uint8).tobytes()
    out.append({
        "image": feature_bytes([img]),
        "label": feature_int64([7]),
        "id": feature_int64([0]),
    })
    # Extremes and negatives: negative int64s are 10-byte varints.
    out.append({
        "neg": feature_int64([-1, -2, -127, -128, -129, INT64_MIN]),
        "pos": feature_int64([0, 1, 127, 128, 16383, 16384, INT64_MAX]),
        "mixed": feature_int64([1, -1, 1 << 40, -(1 << 40)]),
        "floats": feature_float([0.0, -0.0, 1.5, -2.25, 3.4028234663852886e38,
                                 1e-45, float("inf"), float("-inf"),
                                 float("nan"), 0.1]),
        "str": feature_bytes([b"hello", b"", b"\x00\xff\x80", b"x" * 300]),
    })
    # Empty lists of each kind and a Feature with no kind set at all.
    out.append({
        "empty_bytes": feature_bytes([]),
        "empty_int64": feature_int64([]),
        "empty_float": feature_float([]),
        "no_kind": tf.train.Feature(),
        "one_empty_string": feature_bytes([b""]),
    })
    # An Example with no features at all.
    out.append({})
    # Many keys (grows the parser's feature array) with long lists.
    many = {}
    for i in range(100):
        k = "k%03d" % i
        if i % 3 == 0:
            many[k] = feature_int64(rng.randint(-(1 << 62), 1 << 62, size=i,
                                                dtype=np.int64).tolist())
        elif i % 3 == 1:
            many[k] = feature_float(rng.standard_normal(i).astype(
                np.float32).tolist())
        else:
            many[k] = feature_bytes([bytes([j % 256]) * j for j in range(i)])
    out.append(many)
    # Unicode keys and a large bytes value.
    out.append({
        "clé/ünïcode": feature_int64([42]),
        "image/encoded": feature_bytes([rng.randint(
            0, 256, size=200000, dtype=np.uint8).tobytes()]),
        "image/object/bbox/xmin": feature_float([0.25, 0.5, 0.75]),
    })
    return [tf.train.Example(features=tf.train.Features(feature=f))
            for f in out]


def sha(b):
    return hashlib.sha256(b).hexdigest()


def bytes_token(v):
    """A bytes value in expected.txt: hex, "-" when empty, or
    "#LEN:SHA256HEX" when longer than 64 bytes (keeps lines short)."""
    if not v:
        return "-"
    if len(v) > 64:
        return "#%d:%s" % (len(v), sha(v))
    return v.hex()


def describe_example(serialized):
    """Returns the feat lines for a serialized Example, from a parse of the
    bytes themselves so the expectation is what is on the wire."""
    ex = tf.train.Example.FromString(serialized)
    lines = []
    for key in sorted(ex.features.feature):
        f = ex.features.feature[key]
        kind = f.WhichOneof("kind")
        khex = key.encode("utf-8").hex()
        if kind is None:
            lines.append("feat %s none 0" % khex)
        elif kind == "bytes_list":
            vals = [bytes_token(v) for v in f.bytes_list.value]
            lines.append(" ".join(["feat", khex, "bytes", str(len(vals))]
                                  + vals))
        elif kind == "int64_list":
            vals = [str(v) for v in f.int64_list.value]
            lines.append(" ".join(["feat", khex, "int64", str(len(vals))]
                                  + vals))
        else:
            arr = np.array(list(f.float_list.value), dtype=np.float32)
            vals = ["%08x" % v for v in arr.view(np.uint32).tolist()]
            lines.append(" ".join(["feat", khex, "float", str(len(vals))]
                                  + vals))
    return lines


def write_file(path, records, ctype):
    opts = tf.io.TFRecordOptions(compression_type=ctype)
    with tf.io.TFRecordWriter(path, options=opts) as w:
        for r in records:
            w.write(r)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: tf_write.py OUTDIR")
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    raws = raw_records()
    exs = [e.SerializeToString() for e in example_records()]
    lines = []
    for cname, ctype in COMPRESSIONS:
        for kind, recs in (("raw", raws), ("example", exs), ("empty", [])):
            stem = "examples" if kind == "example" else kind
            name = "%s_%s.tfrecord" % (stem, cname)
            write_file(os.path.join(outdir, name), recs, ctype)
            lines.append("file %s %s %d %s" % (
                name, cname, len(recs), "example" if kind == "example"
                else "raw"))
            for i, r in enumerate(recs):
                lines.append("rec %d %d %s" % (i, len(r), sha(r)))
                if kind == "example":
                    lines.extend(describe_example(r))
    with open(os.path.join(outdir, "expected.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    # Self-check: TensorFlow reads back what it wrote, so a mismatch in the
    # C checker is Ferry's, not this script's.
    for cname, ctype in COMPRESSIONS:
        got = [r.numpy() for r in tf.data.TFRecordDataset(
            os.path.join(outdir, "raw_%s.tfrecord" % cname),
            compression_type=ctype)]
        if got != raws:
            sys.exit("tf_write: TensorFlow cannot read back raw_%s" % cname)
    print("tf_write: %d files in %s (tensorflow %s)" % (
        3 * len(COMPRESSIONS), outdir, tf.__version__))


if __name__ == "__main__":
    main()

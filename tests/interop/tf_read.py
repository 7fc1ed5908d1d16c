"""Reads files written by Ferry with TensorFlow and checks them.

Usage:
  tf_read.py [--kind raw|jpeg] [--shape HxWxC] [--count N] [--classes K]
             [--compression auto|none|gzip|zlib] FILE...
      Files from `ferryctl gen`: Examples with features "image" (bytes:
      raw HWC uint8 or a JPEG), "label" (int64) and "id" (int64, a global
      index). Checks the record count (N when given), that the ids are
      exactly 0..N-1, that 0 <= label < K (K when given), and the decoded
      image shape. Compression "auto" (the default) goes by extension:
      .gz/.gzip = GZIP, .zlib/.zz = ZLIB, anything else none.
  tf_read.py --dataset KIND:HxWxC:N:K:DIR ...
      The same checks for each DIR's *.tfrecord* files (one TensorFlow
      start for many datasets).
  tf_read.py --manifest MANIFEST
      Files written by interop_check's Ferry writer: MANIFEST has the
      expected.txt format of tf_write.py (file/rec lines). Checks the count,
      length and SHA-256 of every record, and that each uncompressed file is
      byte-identical to what tf.io.TFRecordWriter writes for the same
      records.

Prints one line per check ("ok ..." or "FAIL ...") and a last line
"tf_read: N passed, M failed"; exits 1 on any failure.
"""

import argparse
import copy
import glob
import hashlib
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

CTYPE = {"none": "", "gzip": "GZIP", "zlib": "ZLIB"}


class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def ok(self, cond, what):
        if cond:
            self.passed += 1
            print("ok   " + what)
        else:
            self.failed += 1
            print("FAIL " + what)
        return cond


def compression_of(path, flag):
    if flag != "auto":
        return CTYPE[flag]
    low = path.lower()
    if low.endswith(".gz") or low.endswith(".gzip"):
        return "GZIP"
    if low.endswith(".zlib") or low.endswith(".zz"):
        return "ZLIB"
    return ""


def read_records(path, ctype):
    return [r.numpy() for r in tf.data.TFRecordDataset(
        path, compression_type=ctype)]


def check_gen(args, chk):
    shape = None
    if args.shape:
        shape = tuple(int(v) for v in args.shape.lower().split("x"))
        if len(shape) != 3:
            sys.exit("tf_read: --shape wants HxWxC, got %r" % args.shape)
    spec = {"image": tf.io.FixedLenFeature([], tf.string),
            "label": tf.io.FixedLenFeature([], tf.int64),
            "id": tf.io.FixedLenFeature([], tf.int64)}
    ids = []
    bad_shape = 0
    bad_label = 0
    first_bad = ""  # the first bad shape
    first_bad_label = ""
    for path in args.files:
        ctype = compression_of(path, args.compression)
        n = 0
        try:
            ds = tf.data.TFRecordDataset(path, compression_type=ctype)
            for rec in ds:
                ex = tf.io.parse_single_example(rec, spec)
                if args.kind == "jpeg":
                    img = tf.io.decode_jpeg(
                        ex["image"], channels=shape[2] if shape else 3)
                else:
                    img = tf.io.decode_raw(ex["image"], tf.uint8)
                    if shape:
                        if img.shape[0] != shape[0] * shape[1] * shape[2]:
                            bad_shape += 1
                            first_bad = first_bad or (
                                "%s record %d: %d image bytes, want %d" % (
                                    path, n, img.shape[0],
                                    shape[0] * shape[1] * shape[2]))
                            img = None
                        else:
                            img = tf.reshape(img, shape)
                if img is not None and shape and tuple(img.shape) != shape:
                    bad_shape += 1
                    first_bad = first_bad or "%s record %d: shape %s" % (
                        path, n, tuple(img.shape))
                label = int(ex["label"])
                if label < 0 or (args.classes and label >= args.classes):
                    bad_label += 1
                    first_bad_label = first_bad_label or (
                        "%s record %d: label %d" % (path, n, label))
                ids.append(int(ex["id"]))
                n += 1
            chk.ok(True, "tf reads %s (%s, %d records)" % (
                path, ctype or "uncompressed", n))
        except tf.errors.OpError as e:
            chk.ok(False, "tf reads %s (%s) after %d records: %s" % (
                path, ctype or "uncompressed", n,
                e.message.splitlines()[0]))
    total = len(ids)
    if args.count is not None:
        chk.ok(total == args.count, "record count %d (want %d)" % (
            total, args.count))
    want = args.count if args.count is not None else total
    dup = total - len(set(ids))
    missing = sorted(set(range(want)) - set(ids))
    extra = sorted(set(ids) - set(range(want)))
    chk.ok(dup == 0 and not missing and not extra,
           "ids are 0..%d exactly once (%d duplicates, %d missing%s,"
           " %d out of range%s)" % (
               want - 1, dup, len(missing),
               " e.g. %d" % missing[0] if missing else "", len(extra),
               " e.g. %d" % extra[0] if extra else ""))
    chk.ok(bad_label == 0, "labels in range%s (%d bad) %s" % (
        " [0, %d)" % args.classes if args.classes else " (>= 0)", bad_label,
        first_bad_label))
    chk.ok(bad_shape == 0, "image shapes%s (%d bad) %s" % (
        " %s" % (shape,) if shape else " (not checked: no --shape)",
        bad_shape, first_bad))


def parse_manifest(path):
    files = []
    with open(path) as f:
        for line in f:
            tok = line.split()
            if not tok:
                continue
            if tok[0] == "file":
                files.append({"name": tok[1], "comp": tok[2],
                              "n": int(tok[3]), "recs": []})
            elif tok[0] == "rec":
                files[-1]["recs"].append((int(tok[2]), tok[3]))
    return files


def check_manifest(path, chk):
    base = os.path.dirname(os.path.abspath(path))
    files = parse_manifest(path)
    chk.ok(len(files) > 0, "manifest %s lists %d files" % (path, len(files)))
    for f in files:
        fpath = os.path.join(base, f["name"])
        ctype = CTYPE[f["comp"]]
        try:
            recs = read_records(fpath, ctype)
        except tf.errors.OpError as e:
            chk.ok(False, "tf reads %s: %s" % (
                f["name"], e.message.splitlines()[0]))
            continue
        bad = [i for i, (r, (ln, h)) in enumerate(zip(recs, f["recs"]))
               if len(r) != ln or hashlib.sha256(r).hexdigest() != h]
        chk.ok(len(recs) == f["n"] and not bad,
               "tf reads %s (%s): %d records (want %d), %d differ%s" % (
                   f["name"], f["comp"], len(recs), f["n"], len(bad),
                   " from record %d" % bad[0] if bad else ""))
        if f["comp"] == "none" and len(recs) == f["n"] and not bad:
            with tempfile.TemporaryDirectory() as tmp:
                ref = os.path.join(tmp, "ref.tfrecord")
                with tf.io.TFRecordWriter(ref) as w:
                    for r in recs:
                        w.write(r)
                with open(ref, "rb") as a, open(fpath, "rb") as b:
                    same = a.read() == b.read()
            chk.ok(same, "%s is byte-identical to TFRecordWriter's output"
                   % f["name"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--manifest")
    ap.add_argument("--kind", choices=["raw", "jpeg"], default="raw")
    ap.add_argument("--shape")
    ap.add_argument("--count", type=int)
    ap.add_argument("--classes", type=int)
    ap.add_argument("--compression", default="auto",
                    choices=["auto", "none", "gzip", "zlib"])
    ap.add_argument("--dataset", action="append", default=[])
    ap.add_argument("files", nargs="*")
    args = ap.parse_args()
    chk = Checks()
    if args.manifest:
        check_manifest(args.manifest, chk)
    if args.files:
        check_gen(args, chk)
    for spec in args.dataset:
        parts = spec.split(":", 4)
        if len(parts) != 5:
            ap.error("--dataset wants KIND:HxWxC:N:K:DIR, got %r" % spec)
        ds = copy.copy(args)
        ds.kind, ds.shape = parts[0], parts[1]
        ds.count, ds.classes = int(parts[2]), int(parts[3])
        ds.files = sorted(glob.glob(os.path.join(parts[4], "*.tfrecord*")))
        print("info dataset %s" % spec)
        if chk.ok(len(ds.files) > 0, "%s holds TFRecord files" % parts[4]):
            check_gen(ds, chk)
    if not args.manifest and not args.files and not args.dataset:
        ap.error("give FILE..., --dataset or --manifest")
    print("tf_read: %d passed, %d failed" % (chk.passed, chk.failed))
    sys.exit(1 if chk.failed else 0)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()

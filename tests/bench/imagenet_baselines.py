"""The baselines of the JPEG benchmark (tests/bench/imagenet.sh):
RandomResizedCrop(224) and a horizontal flip on the same JPEGs as
bench_jpeg_crop, per core, with the two input pipelines Ferry replaces.

  python imagenet_baselines.py tf JPEG_DIR [--seconds S] [--size 224]
  python imagenet_baselines.py torch JPEG_DIR [--seconds S] [--size 224]

tf (run in the venv of tests/interop/setup-venv.sh): tf.data on one
thread (inter- and intra-op parallelism 1, a private thread pool of 1, no
parallel map), three ways:
  tf-decode      tf.io.decode_jpeg, tf.image.sample_distorted_bounding_box
                 (area (0.08, 1), aspect (3/4, 4/3), 10 attempts), tf.slice,
                 tf.image.resize(antialias=True), random_flip_left_right;
  tf-fused       the same with tf.io.decode_and_crop_jpeg (TF's own fused
                 crop: libjpeg skips the rows and columns outside it);
  tf-fused-ratio decode_and_crop_jpeg with its `ratio` argument (DCT
                 scaling by 1/2, 1/4 or 1/8): per image the largest ratio
                 that keeps the crop at least SIZE pixels on both sides,
                 through tf.switch_case (ratio is an attribute, not a
                 tensor).
torch (Debian's python3-torch, python3-torchvision, python3-pil, one
process): the seeds' DataLoader path,
  torch-pil      a Dataset doing PIL.Image.open(...).convert("RGB"),
                 RandomResizedCrop(SIZE), RandomHorizontalFlip(),
                 PILToTensor(), through DataLoader(num_workers=0,
                 batch_size=64), torch.set_num_threads(1);
  torch-pil-draft the same with PIL's JPEG draft mode (DCT scaling) asked
                 for the crop's size first: not what torchvision does, the
                 best this stack can do.
Both pin themselves to one CPU. Each path runs passes over the images
(read into memory first) until it has used --seconds of the process's CPU
time, and prints
  RESULT <name> <images per CPU second> <images per wall second> <label>
then "baselines: ok". A missing module prints "SKIP <reason>" and exits
77.
"""

import argparse
import io
import math
import os
import sys
import time


def load(jpeg_dir):
    names = sorted(n for n in os.listdir(jpeg_dir) if n.endswith(".jpg"))
    if not names:
        sys.exit(f"imagenet_baselines: no .jpg files in {jpeg_dir}")
    out = []
    for n in names:
        with open(os.path.join(jpeg_dir, n), "rb") as f:
            out.append(f.read())
    return out


def pin_one_cpu():
    try:
        cpu = sorted(os.sched_getaffinity(0))[0]
        os.sched_setaffinity(0, {cpu})
        return f"pinned to CPU {cpu}"
    except (AttributeError, OSError) as e:
        return f"not pinned: {e}"


def measure(name, label, run_pass, n_images, seconds):
    """Runs run_pass() (one pass, returns the number of images it made)
    until `seconds` of process CPU time are spent; prints a RESULT."""
    run_pass()  # warm-up and sanity, not timed
    c0, w0, images = time.process_time(), time.perf_counter(), 0
    while time.process_time() - c0 < seconds:
        got = run_pass()
        if got != n_images:
            sys.exit(f"imagenet_baselines: {name}: {got} images out of "
                     f"{n_images}")
        images += got
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    print(f"RESULT {name} {images / cpu:.1f} {images / wall:.1f} {label}",
          flush=True)


def run_tf(jpegs, size, seconds):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import tensorflow as tf
    except ImportError as e:
        print(f"SKIP tf.data: TensorFlow does not import ({e}); "
              "tests/interop/setup-venv.sh makes the venv")
        sys.exit(77)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    print(f"tf.data: TensorFlow {tf.__version__}, one thread", flush=True)
    whole = tf.constant([[[0.0, 0.0, 1.0, 1.0]]])

    def sample(shape):
        begin, bsize, _ = tf.image.sample_distorted_bounding_box(
            shape, bounding_boxes=whole, min_object_covered=0.0,
            aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0),
            max_attempts=10, use_image_if_no_bounding_boxes=True)
        return begin, bsize

    def finish(img):
        img = tf.image.resize(img, [size, size], method="bilinear",
                              antialias=True)
        img = tf.image.random_flip_left_right(img)
        return tf.cast(tf.clip_by_value(tf.round(img), 0, 255), tf.uint8)

    def decode(x):
        img = tf.io.decode_jpeg(x, channels=3)
        begin, bsize = sample(tf.shape(img))
        return finish(tf.slice(img, begin, bsize))

    def fused(x):
        begin, bsize = sample(tf.io.extract_jpeg_shape(x))
        window = tf.stack([begin[0], begin[1], bsize[0], bsize[1]])
        return finish(tf.io.decode_and_crop_jpeg(x, window, channels=3))

    def fused_ratio(x):
        shape = tf.io.extract_jpeg_shape(x)
        begin, bsize = sample(shape)
        ch, cw = bsize[0], bsize[1]
        # The largest ratio r in 8, 4, 2 with both sides of the crop at
        # least size * r, else 1.
        small = tf.minimum(ch, cw)
        idx = tf.cast(small >= 2 * size, tf.int32) + \
            tf.cast(small >= 4 * size, tf.int32) + \
            tf.cast(small >= 8 * size, tf.int32)

        def branch(r):
            def f():
                # The window is in the scaled image's pixels (ceil(H/r)).
                sh = (shape[0] + r - 1) // r
                sw = (shape[1] + r - 1) // r
                y, x_ = begin[0] // r, begin[1] // r
                h = tf.maximum(1, tf.minimum(ch // r, sh - y))
                w = tf.maximum(1, tf.minimum(cw // r, sw - x_))
                return tf.io.decode_and_crop_jpeg(
                    x, tf.stack([y, x_, h, w]), channels=3, ratio=r)
            return f

        img = tf.switch_case(idx, [branch(1), branch(2), branch(4),
                                   branch(8)])
        return finish(img)

    data = tf.constant(jpegs)
    opts = tf.data.Options()
    opts.threading.private_threadpool_size = 1
    opts.threading.max_intra_op_parallelism = 1
    opts.autotune.enabled = False

    def make(fn):
        ds = tf.data.Dataset.from_tensor_slices(data).map(fn).batch(64)
        ds = ds.with_options(opts)

        def one_pass():
            n = 0
            for b in ds:
                if tuple(b.shape[1:]) != (size, size, 3):
                    sys.exit(f"imagenet_baselines: batch of shape "
                             f"{tuple(b.shape)}")
                n += int(b.shape[0])
            return n
        return one_pass

    for name, fn, label in (
            ("tf-decode", decode, "tf.data: decode_jpeg, crop, resize"),
            ("tf-fused", fused,
             "tf.data: decode_and_crop_jpeg, resize"),
            ("tf-fused-ratio", fused_ratio,
             "tf.data: decode_and_crop_jpeg with ratio, resize")):
        measure(name, label, make(fn), len(jpegs), seconds)


def run_torch(jpegs, size, seconds):
    try:
        import torch
        import torchvision
        from PIL import Image
        from torchvision import transforms
    except ImportError as e:
        print(f"SKIP PyTorch DataLoader: {e} (Debian: apt-get install "
              "python3-pil python3-torchvision)")
        sys.exit(77)
    torch.set_num_threads(1)
    print(f"PyTorch {torch.__version__}, torchvision "
          f"{torchvision.__version__}, PIL {Image.__version__}, one process",
          flush=True)
    rrc = transforms.RandomResizedCrop(size)
    tail = transforms.Compose([transforms.RandomHorizontalFlip(),
                               transforms.PILToTensor()])

    def plain(b):
        img = Image.open(io.BytesIO(b)).convert("RGB")
        return tail(rrc(img))

    def draft(b):
        img = Image.open(io.BytesIO(b))
        i, j, h, w = transforms.RandomResizedCrop.get_params(
            img, rrc.scale, rrc.ratio)
        W, H = img.size
        # Ask for a DCT scale that keeps the crop at least `size` wide and
        # high; draft() picks the smallest scale >= the requested size.
        want = (math.ceil(W * size / w), math.ceil(H * size / h))
        img.draft("RGB", want)
        sx, sy = img.size[0] / W, img.size[1] / H
        box = (j * sx, i * sy, (j + w) * sx, (i + h) * sy)
        img = img.convert("RGB").resize((size, size), Image.BILINEAR,
                                        box=box, reducing_gap=None)
        return tail(img)

    class Images(torch.utils.data.Dataset):
        def __init__(self, fn):
            self.fn = fn

        def __len__(self):
            return len(jpegs)

        def __getitem__(self, i):
            return self.fn(jpegs[i])

    def make(fn):
        loader = torch.utils.data.DataLoader(Images(fn), batch_size=64,
                                             num_workers=0, shuffle=True)

        def one_pass():
            n = 0
            for b in loader:
                if tuple(b.shape[1:]) != (3, size, size):
                    sys.exit(f"imagenet_baselines: batch of shape "
                             f"{tuple(b.shape)}")
                n += int(b.shape[0])
            return n
        return one_pass

    measure("torch-pil", "PyTorch DataLoader: PIL, RandomResizedCrop",
            make(plain), len(jpegs), seconds)
    measure("torch-pil-draft",
            "PyTorch DataLoader: PIL draft (DCT scale), crop, resize",
            make(draft), len(jpegs), seconds)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("framework", choices=("tf", "torch"))
    ap.add_argument("jpeg_dir")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--size", type=int, default=224)
    a = ap.parse_args()
    jpegs = load(a.jpeg_dir)
    print(f"{a.framework}: {len(jpegs)} JPEGs, {pin_one_cpu()}", flush=True)
    if a.framework == "tf":
        run_tf(jpegs, a.size, a.seconds)
    else:
        run_torch(jpegs, a.size, a.seconds)
    print("baselines: ok")


if __name__ == "__main__":
    main()

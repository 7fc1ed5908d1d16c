"""Computes TensorFlow reference outputs for Ferry's image ops.

Usage: tf_ops_ref.py OUTDIR

Writes raw uint8 HWC files and OUTDIR/manifest.txt, one line per case:

  img NAME H W C          NAME.in (input), NAME.dilate, NAME.blur
  jpeg NAME H W PATH      PATH (the JPEG), NAME.jpegout (H x W x 3 RGB)

dilate: tf.nn.dilation2d with a zero 3x3xC filter, SAME, stride 1.
blur:   tfa.image.gaussian_filter2d(filter_shape=11, sigma=0.8) as the
        (deprecated) TensorFlow Addons code computes it, reproduced here
        op for op: softmax kernel, outer product, REFLECT pad, depthwise
        conv VALID in float32, tf.cast back to uint8 (truncation).
jpeg:   tf.io.decode_jpeg(channels=3) with its defaults (IFAST DCT, fancy
        upsampling), of images encoded by tf.io.encode_jpeg (quality 90,
        4:2:0) and of the valid files in FERRY_TESTDATA_DIR/jpeg.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

BLUR_SIZE = 11
BLUR_SIGMA = 0.8

# Valid JPEGs of ../shared/testdata/jpeg (MANIFEST.md section C1) that
# TensorFlow decodes to RGB. CMYK/YCCK files are listed too: TensorFlow
# converts them, and the checker reports whether Ferry does.
TESTDATA_JPEGS = [
    "ljt_testorig.jpg", "ljt_testimgint.jpg", "ljt_testimgari.jpg",
    "ljt_testimgp.jpg", "ljt_testimggray.jpg", "tf_jpeg_merge_test1.jpg",
    "tf_jpeg_merge_test1_cmyk.jpg", "jd_jpg-cmyk-1.jpg", "jd_ycck.jpg",
    "jd_jpg-gray.jpg", "jd_jpg-srgb-icc.jpg",
    "jd_grayscale_16x24_sampling2x2.jpg", "jd_jpg-progressive.jpg",
    "jd_non-interleaved-mcu.jpg", "jd_progressive-missing-ac.jpg",
    "jd_restarts.jpg", "jd_jpg-size-1x1.jpg", "jd_jpg-size-15x15.jpg",
    "jd_jpg-size-33x33.jpg", "jd_16bit-qtables.jpg",
    "jd_multiple-0xff-before-eoi.jpg",
]


def smooth(rng, h, w, c):
    """Gradients plus low-frequency waves: most blur outputs land near
    integer boundaries only by accident, like natural images."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    chans = []
    for k in range(c):
        fy, fx, ph = rng.uniform(0.02, 0.3, 3)
        v = (127.5 + 60 * np.sin(fy * y + ph) * np.cos(fx * x)
             + 60 * (x + y * (k + 1)) / (w + h * (k + 1)) - 30)
        chans.append(v)
    return np.clip(np.stack(chans, -1), 0, 255).astype(np.uint8)


def noisy(rng, h, w, c):
    return rng.randint(0, 256, size=(h, w, c), dtype=np.uint8)


def images():
    rng = np.random.RandomState(1234)
    cases = [
        ("s6x6x1", smooth(rng, 6, 6, 1)),
        ("n6x6x1", noisy(rng, 6, 6, 1)),
        ("n7x9x3", noisy(rng, 7, 9, 3)),
        ("s32x32x3", smooth(rng, 32, 32, 3)),
        ("n32x32x3", noisy(rng, 32, 32, 3)),
        ("s33x47x3", smooth(rng, 33, 47, 3)),
        ("n33x47x3", noisy(rng, 33, 47, 3)),
        ("n64x64x4", noisy(rng, 64, 64, 4)),
        ("s64x64x4", smooth(rng, 64, 64, 4)),
        ("s224x224x3", smooth(rng, 224, 224, 3)),
        ("n224x224x3", noisy(rng, 224, 224, 3)),
        ("n100x221x6", noisy(rng, 100, 221, 6)),
        ("n17x300x2", noisy(rng, 17, 300, 2)),
        # Constant 255: the float32 kernel sums to just under or over 1,
        # so the truncating cast decides between 254 and 255.
        ("c255_16x16x3", np.full((16, 16, 3), 255, np.uint8)),
        ("c0_8x8x3", np.zeros((8, 8, 3), np.uint8)),
    ]
    check = np.indices((20, 24)).sum(0) % 2 * 255
    cases.append(("checker20x24x3", np.repeat(
        check[:, :, None], 3, axis=2).astype(np.uint8)))
    return cases


def tf_dilate(img):
    c = img.shape[2]
    x = tf.constant(img[None].astype(np.float32))
    out = tf.nn.dilation2d(x, filters=tf.zeros((3, 3, c), tf.float32),
                           strides=[1, 1, 1, 1], padding="SAME",
                           data_format="NHWC", dilations=[1, 1, 1, 1])
    return tf.cast(out[0], tf.uint8).numpy()


def gaussian_kernel_1d(sigma, size):
    # tfa: x = range(-size//2 + 1, size//2 + 1); softmax(-x^2 / (2 s^2)).
    x = tf.range(-size // 2 + 1, size // 2 + 1)
    x = tf.cast(x ** 2, sigma.dtype)
    return tf.nn.softmax(-x / (2.0 * (sigma ** 2)))


def tf_blur(img, size=BLUR_SIZE, sigma=BLUR_SIGMA):
    image = tf.constant(img[None])
    orig_dtype = image.dtype
    image = tf.cast(image, tf.float32)
    channels = tf.shape(image)[3]
    s = tf.cast(tf.convert_to_tensor(sigma), tf.float32)
    kx = gaussian_kernel_1d(s, size)[tf.newaxis, :]
    ky = gaussian_kernel_1d(s, size)[:, tf.newaxis]
    k2 = tf.matmul(ky, kx)[:, :, tf.newaxis, tf.newaxis]
    k2 = tf.tile(k2, [1, 1, channels, 1])
    top = (size - 1) // 2
    bottom = size - 1 - top
    image = tf.pad(image, [[0, 0], [top, bottom], [top, bottom], [0, 0]],
                   mode="REFLECT")
    out = tf.nn.depthwise_conv2d(input=image, filter=k2,
                                 strides=(1, 1, 1, 1), padding="VALID")
    return tf.cast(out, orig_dtype)[0].numpy()


def jpeg_cases(outdir):
    """Yields (name, path) of JPEGs to decode."""
    rng = np.random.RandomState(99)
    for name, img in [("enc_s32x32", smooth(rng, 32, 32, 3)),
                      ("enc_s33x47", smooth(rng, 33, 47, 3)),
                      ("enc_n31x17", noisy(rng, 31, 17, 3)),
                      ("enc_s224x224", smooth(rng, 224, 224, 3))]:
        data = tf.io.encode_jpeg(img, quality=90).numpy()
        path = os.path.join(outdir, name + ".jpg")
        with open(path, "wb") as f:
            f.write(data)
        yield name, path
    tdir = os.environ.get("FERRY_TESTDATA_DIR", "")
    jdir = os.path.join(tdir, "jpeg") if tdir else ""
    if not jdir or not os.path.isdir(jdir):
        print("tf_ops_ref: no testdata JPEGs (FERRY_TESTDATA_DIR=%r);"
              " using encoded ones only" % tdir)
        return
    for fname in TESTDATA_JPEGS:
        path = os.path.join(jdir, fname)
        if os.path.isfile(path):
            yield "td_" + fname[:-4], os.path.abspath(path)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: tf_ops_ref.py OUTDIR")
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    lines = []
    for name, img in images():
        h, w, c = img.shape
        base = os.path.join(outdir, name)
        img.tofile(base + ".in")
        tf_dilate(img).tofile(base + ".dilate")
        tf_blur(img).tofile(base + ".blur")
        lines.append("img %s %d %d %d" % (name, h, w, c))
    njpeg = 0
    for name, path in jpeg_cases(outdir):
        with open(path, "rb") as f:
            data = f.read()
        try:
            px = tf.io.decode_jpeg(data, channels=3).numpy()
        except tf.errors.OpError as e:
            print("tf_ops_ref: TensorFlow cannot decode %s (%s); skipped"
                  % (path, e.message.splitlines()[0]))
            continue
        px.tofile(os.path.join(outdir, name + ".jpegout"))
        lines.append("jpeg %s %d %d %s" % (name, px.shape[0], px.shape[1],
                                            path))
        njpeg += 1
    with open(os.path.join(outdir, "manifest.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("tf_ops_ref: %d images, %d JPEGs in %s" % (
        len(lines) - njpeg, njpeg, outdir))


if __name__ == "__main__":
    main()

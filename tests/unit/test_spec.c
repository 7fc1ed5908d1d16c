/* Tests of the pipeline spec: parser, errors with columns, canonical text,
 * protobuf round trips, fingerprint, validation, output shape, file
 * expansion, leaks and allocation failures on every path.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc.h"
#include "ferry/v1/common.pb-c.h"
#include "spec.h"

#define SEED_SPEC                                                             \
  "tfrecord(\"/data/train-*.tfrecord\") | decode(raw, 32, 32, 3) | "          \
  "dilate(3) | blur(11, 0.8) | shuffle(seed=7, buffer=10000) | batch(1024)"

#define SEED_CANONICAL                                                        \
  "tfrecord(\"/data/train-*.tfrecord\") | decode(raw, 32, 32, 3) | "          \
  "dilate(3) | blur(11, 0.8) | shuffle(seed=7) | batch(1024)"

/* The fingerprint of SEED_SPEC, pinned: it names datasets across versions,
 * so a change here is a compatibility break (docs/PROTOCOL.md). */
#define SEED_FINGERPRINT 0xa60854bf2df9dacdull

static ferry_alloc_stats_t start_stats;

static void leak_setup(void) {
  ferry__alloc_fail_reset();
  ferry__alloc_stats(&start_stats);
}

static void leak_check(void) {
  ferry_alloc_stats_t now;
  ferry__alloc_fail_reset();
  ferry__alloc_stats(&now);
  cr_assert_eq(now.blocks, start_stats.blocks, "leaked %lld blocks",
               (long long)(now.blocks - start_stats.blocks));
  cr_assert_eq(now.bytes, start_stats.bytes, "leaked %lld bytes",
               (long long)(now.bytes - start_stats.bytes));
}

TestSuite(spec, .init = leak_setup, .fini = leak_check);

static void parse_ok(const char *text, ferry_spec_t *s) {
  ferry_error_t err = {0};
  int rc = ferry__spec_parse(text, s, &err);
  cr_assert_eq(rc, 0, "parse of <%s> failed: %s", text, err.msg);
}

static char *format_ok(const ferry_spec_t *s) {
  char *out = NULL;
  cr_assert_eq(ferry__spec_format(s, &out), 0);
  cr_assert_not_null(out);
  return out;
}

/* --- The seed spec ---------------------------------------------------- */

Test(spec, seed_spec_parses_into_expected_struct) {
  ferry_spec_t s;
  parse_ok(SEED_SPEC, &s);
  cr_assert_eq(s.n_patterns, 1);
  cr_assert_str_eq(s.patterns[0], "/data/train-*.tfrecord");
  cr_assert_eq(s.compression, FERRY_COMPRESSION_NONE);
  cr_assert_eq(s.format, FERRY_IMAGE_RAW);
  cr_assert_eq(s.height, 32);
  cr_assert_eq(s.width, 32);
  cr_assert_eq(s.channels, 3);
  cr_assert_str_eq(s.image_key, "image");
  cr_assert_str_eq(s.label_key, "label");
  cr_assert_eq(s.n_ops, 2);
  cr_assert_eq(s.ops[0].kind, FERRY_OP_DILATE);
  cr_assert_eq(s.ops[0].a, 3);
  cr_assert_eq(s.ops[1].kind, FERRY_OP_BLUR);
  cr_assert_eq(s.ops[1].a, 11);
  cr_assert_eq(s.ops[1].sigma, 0.8f);
  cr_assert(s.shuffle);
  cr_assert_eq(s.shuffle_seed, 7);
  cr_assert_eq(s.shuffle_buffer, 10000);
  cr_assert_eq(s.batch_size, 1024);
  cr_assert(!s.drop_remainder);
  cr_assert_eq(s.repeat, 1);
  cr_assert_eq(ferry__spec_validate(&s, NULL), 0);
  ferry__spec_close(&s);
}

Test(spec, seed_spec_canonical_text_and_pinned_fingerprint) {
  ferry_spec_t s;
  char *text;
  parse_ok(SEED_SPEC, &s);
  text = format_ok(&s);
  cr_assert_str_eq(text, SEED_CANONICAL);
  cr_assert_eq(ferry__spec_fingerprint(&s), SEED_FINGERPRINT,
               "fingerprint %016llx",
               (unsigned long long)ferry__spec_fingerprint(&s));
  ferry_free(text);
  ferry__spec_close(&s);
}

Test(spec, all_stages_and_arguments) {
  ferry_spec_t s;
  parse_ok("tfrecord(\"a\", \"b/*.tfr\", compression=gzip)\n"
           "  | label(\"y\") | decode(jpeg, 300, 200, key=\"jpg\")\n"
           "  | resize(224, 112) | dilate(3) | blur(3, 1e-3) | blur(31, 100)"
           " | shuffle(buffer=5, seed=18446744073709551615)"
           " | batch(7, drop_remainder=true) | repeat(3)",
           &s);
  cr_assert_eq(s.n_patterns, 2);
  cr_assert_str_eq(s.patterns[1], "b/*.tfr");
  cr_assert_eq(s.compression, FERRY_COMPRESSION_GZIP);
  cr_assert_eq(s.format, FERRY_IMAGE_JPEG);
  cr_assert_eq(s.height, 300);
  cr_assert_eq(s.width, 200);
  cr_assert_eq(s.channels, 3);
  cr_assert_str_eq(s.image_key, "jpg");
  cr_assert_str_eq(s.label_key, "y");
  cr_assert_eq(s.n_ops, 4);
  cr_assert_eq(s.ops[0].kind, FERRY_OP_RESIZE);
  cr_assert_eq(s.ops[0].a, 224);
  cr_assert_eq(s.ops[0].b, 112);
  cr_assert_eq(s.ops[2].sigma, 0.001f);
  cr_assert_eq(s.ops[3].a, 31);
  cr_assert_eq(s.ops[3].sigma, 100.0f);
  cr_assert_eq(s.shuffle_seed, UINT64_MAX);
  cr_assert_eq(s.shuffle_buffer, 5);
  cr_assert_eq(s.batch_size, 7);
  cr_assert(s.drop_remainder);
  cr_assert_eq(s.repeat, 3);
  ferry__spec_close(&s);

  parse_ok("tfrecord(\"a\",compression=auto)|decode(jpeg)|label(none)|"
           "repeat()",
           &s);
  cr_assert_eq(s.compression, FERRY_COMPRESSION_AUTO);
  cr_assert_eq(s.height, 0);
  cr_assert_eq(s.width, 0);
  cr_assert_eq(s.channels, 3);
  cr_assert_null(s.label_key);
  cr_assert(!s.shuffle);
  cr_assert_eq(s.batch_size, 0);
  cr_assert_eq(s.repeat, -1);
  ferry__spec_close(&s);

  parse_ok("tfrecord(\"a\") | decode(format=raw, channels=1, width=2, "
           "height=3) | label(key=\"k\") | shuffle() | batch(size=9)",
           &s);
  cr_assert_eq(s.height, 3);
  cr_assert_eq(s.width, 2);
  cr_assert_eq(s.channels, 1);
  cr_assert_str_eq(s.label_key, "k");
  cr_assert(s.shuffle);
  cr_assert_eq(s.shuffle_seed, 0);
  cr_assert_eq(s.shuffle_buffer, 10000);
  cr_assert_eq(s.batch_size, 9);
  ferry__spec_close(&s);
}

Test(spec, string_escapes) {
  ferry_spec_t s;
  char *text;
  parse_ok("tfrecord(\"q\\\"b\\\\n\\nt\\t\xe2\x82\xac\") | "
           "decode(raw, 1, 1, 1)",
           &s);
  cr_assert_str_eq(s.patterns[0], "q\"b\\n\nt\t\xe2\x82\xac");
  text = format_ok(&s);
  cr_assert_str_eq(text, "tfrecord(\"q\\\"b\\\\n\\nt\\t\xe2\x82\xac\") | "
                         "decode(raw, 1, 1, 1)");
  ferry_free(text);
  ferry__spec_close(&s);
}

/* --- Errors ------------------------------------------------------------ */

typedef struct {
  const char *text;
  const char *want; /* substrings of the message, '|'-free */
  const char *want2;
} bad_case;

static const bad_case bad_cases[] = {
    {"", "column 1: expected a stage name, found end of input", NULL},
    {"   ", "column 4: expected a stage name, found end of input", NULL},
    {"tfrecord(\"a\") | decode(raw | batch(1)",
     "column 28: expected ',' or ')', found '|'", NULL},
    {"tfrecord(\"a\") | decode(raw, raw)",
     "column 29: expected an integer for decode height, found 'raw'",
     NULL},
    {"tfrecord(\"a\") | decode(raw, 32, 32, 3 | batch(1))",
     "column 39: expected ',' or ')', found '|'", NULL},
    {"tfrecord(\"a\") | dec(raw, 1, 1, 1)",
     "column 17: expected a stage name (tfrecord, decode, label, resize, "
     "dilate, blur, random_resized_crop, center_crop, shuffle, batch, "
     "repeat), found 'dec'",
     NULL},
    {"decode(raw, 1, 1, 1)",
     "column 1: expected tfrecord(...) as the first stage, found 'decode'",
     NULL},
    {"tfrecord(\"a\")", "column 14: expected '| decode(...)', found end",
     NULL},
    {"tfrecord(\"a\") | dilate(3)",
     "column 17: expected decode(...) after tfrecord, found 'dilate'", NULL},
    {"tfrecord()", "column 1: tfrecord needs at least one", NULL},
    {"tfrecord(\"\")", "column 10: tfrecord pattern must not be empty", NULL},
    {"tfrecord(\"a\", 3)",
     "column 15: expected a \"file pattern\" for tfrecord, found 3", NULL},
    {"tfrecord(\"a\", compression=lz4)",
     "column 27: expected one of none, gzip, zlib, auto for tfrecord "
     "compression, found 'lz4'",
     NULL},
    {"tfrecord(\"a\", compression=gzip, \"b\")",
     "column 33: expected a named argument (positional ones come first)",
     NULL},
    {"tfrecord(\"a\"", "column 13: expected ',' or ')', found end of input",
     NULL},
    {"tfrecord(\"a\",)", "column 14: expected an argument, found ')'",
     NULL},
    {"tfrecord(\"a)", "expected '\"' to end the string", "end of input"},
    {"tfrecord(\"a\\q\")", "column 12: expected an escape", "found '\\q'"},
    {"tfrecord(\"a\tb\")",
     "column 12: expected a printable character or an escape", "0x09"},
    {"tfrecord(\"\xff\")", "column 11: expected UTF-8 text", "0xff"},
    {"tfrecord(\"a\") # x", "column 15: expected '|' or end of input, "
                            "found '#'", NULL},
    {"tfrecord \"a\"", "column 10: expected '(', found \"a\"", NULL},
    {"tfrecord(\"a\") | decode(png)",
     "column 24: expected one of raw, jpeg for decode format, found 'png'",
     NULL},
    {"tfrecord(\"a\") | decode()", "column 17: decode needs a format", NULL},
    {"tfrecord(\"a\") | decode(raw, 32, 32)",
     "column 17: decode(raw) needs height, width and channels", NULL},
    {"tfrecord(\"a\") | decode(jpeg, 32)",
     "column 17: decode(jpeg) needs both height and width", NULL},
    {"tfrecord(\"a\") | decode(jpeg, 32, 32, 1)",
     "column 38: decode channels must be 3 for jpeg, found 1", NULL},
    {"tfrecord(\"a\") | decode(raw, 0, 32, 3)",
     "column 29: decode height must be in 1..65535, found 0", NULL},
    {"tfrecord(\"a\") | decode(raw, 1, 1, 17)",
     "column 35: decode channels must be in 1..16, found 17", NULL},
    {"tfrecord(\"a\") | decode(raw, 99999999999999999999999, 1, 1)",
     "column 29: decode height must be in 1..65535, found "
     "99999999999999999999999",
     NULL},
    {"tfrecord(\"a\") | decode(raw, 1.5, 1, 1)",
     "column 29: expected an integer for decode height, found 1.5", NULL},
    {"tfrecord(\"a\") | decode(raw, 1, 1, 1, 1)",
     "column 38: expected ')' (decode takes at most 4 positional "
     "arguments), found 1",
     NULL},
    {"tfrecord(\"a\") | decode(raw, 1, 1, 1, foo=1)",
     "column 38: expected an argument name of decode (format, height, "
     "width, channels, key), found 'foo'",
     NULL},
    {"tfrecord(\"a\") | decode(raw, 1, 1, 1, key=\"x\", key=\"y\")",
     "column 47: decode argument 'key' given twice", NULL},
    {"tfrecord(\"a\") | decode(raw, 1, 1, 1, key=)",
     "column 42: expected a value after '=', found ')'", NULL},
    {"tfrecord(\"a\") | decode(raw, 1, 1, 1, key=\"\")",
     "column 42: decode key must not be empty", NULL},
    {"tfrecord(\"a\") | decode(raw, 65535, 65535, 16)",
     "column 17: decode: a 65535x65535x16 image is over the 268435456-byte",
     NULL},
    {"tfrecord(\"a\") | decode(raw, 1, 1, 1) | decode(raw, 1, 1, 1)",
     "column 40: duplicate stage 'decode' (first at column 17)", NULL},
    {"tfrecord(\"a\") | tfrecord(\"b\")",
     "column 17: duplicate stage 'tfrecord' (first at column 1)", NULL},
    {"tfrecord(\"a\") | decode(raw, 8, 8, 1) | label()",
     "column 40: label needs a key", NULL},
    {"tfrecord(\"a\") | decode(raw, 8, 8, 1) | label(\"\")",
     "column 46: label key must not be empty (label(none) means no label)",
     NULL},
    {"tfrecord(\"a\") | decode(raw, 8, 8, 1) | label(nothing)",
     "column 46: expected a \"string\" or none for label key, found "
     "'nothing'",
     NULL},
    {"tfrecord(\"a\") | decode(raw, 8, 8, 1) | dilate(3) | label(\"y\")",
     "column 52: expected label right before or after decode, found it "
     "after the image ops",
     NULL},
    {"tfrecord(\"a\") | decode(raw, 8, 8, 1) | dilate(5)",
     "column 47: dilate size must be 3 (the only size supported for now), "
     "found 5",
     NULL},
    {"tfrecord(\"a\") | decode(raw, 8, 8, 1) | dilate()",
     "column 40: dilate needs a size", NULL},
    {"tfrecord(\"a\") | decode(raw, 8, 8, 1) | blur(4, 1)",
     "column 45: blur size must be an odd integer in 3..31, found 4", NULL},
    {"tfrecord(\"a\") | decode(raw, 8, 8, 1) | blur(33, 1)",
     "column 45: blur size must be an odd integer in 3..31, found 33", NULL},
    {"tfrecord(\"a\") | decode(raw, 8, 8, 1) | blur(3, 0)",
     "column 48: blur sigma must be in 0.001..100, found 0", NULL},
    {"tfrecord(\"a\") | decode(raw, 8, 8, 1) | blur(3, 100.5)",
     "column 48: blur sigma must be in 0.001..100, found 100.5", NULL},
    {"tfrecord(\"a\") | decode(raw, 8, 8, 1) | blur(3, 1e999)",
     "column 48: blur sigma must be in 0.001..100, found 1e999", NULL},
    {"tfrecord(\"a\") | decode(raw, 8, 8, 1) | blur(3, raw)",
     "column 48: expected a number for blur sigma, found 'raw'", NULL},
    {"tfrecord(\"a\") | decode(raw, 8, 8, 1) | blur(3)",
     "column 40: blur needs a size and a sigma", NULL},
    {"tfrecord(\"a\") | decode(raw, 8, 8, 1) | blur(31, 1)",
     "column 40: blur (op 1): a 8x8 image is too small for size 31", NULL},
    {"tfrecord(\"a\") | decode(raw, 8, 8, 1) | resize(4, 40) | "
     "blur(11, 1)",
     "column 56: blur (op 2): a 4x40 image is too small for size 11",
     "must be > 5"},
    {"tfrecord(\"a\") | decode(raw, 8, 8, 1) | resize(0, 4)",
     "column 47: resize height must be in 1..16384, found 0", NULL},
    {"tfrecord(\"a\") | decode(raw, 8, 8, 1) | resize(4, 16385)",
     "column 50: resize width must be in 1..16384, found 16385", NULL},
    {"tfrecord(\"a\") | decode(raw, 8, 8, 16) | resize(16384, 16384)",
     "column 41: resize: a 16384x16384x16 image is over", NULL},
    {"tfrecord(\"a\") | decode(raw, 8, 8, 1) | shuffle(7)",
     "column 48: expected a named argument (seed=, buffer=), found 7", NULL},
    {"tfrecord(\"a\") | decode(raw, 8, 8, 1) | shuffle(buffer=0)",
     "column 55: shuffle buffer must be in 1..100000000, found 0", NULL},
    {"tfrecord(\"a\") | decode(raw, 8, 8, 1) | shuffle(seed=-1)",
     "column 53: shuffle seed must be in 0..18446744073709551615, found -1",
     NULL},
    {"tfrecord(\"a\") | decode(raw, 8, 8, 1) | shuffle(seed="
     "18446744073709551616)",
     "column 53: shuffle seed must be in 0..18446744073709551615", NULL},
    {"tfrecord(\"a\") | decode(raw, 8, 8, 1) | shuffle(seed=1, seed=2)",
     "column 56: shuffle argument 'seed' given twice", NULL},
    {"tfrecord(\"a\") | decode(raw, 8, 8, 1) | batch(0)",
     "column 46: batch size must be in 1..1000000, found 0", NULL},
    {"tfrecord(\"a\") | decode(raw, 8, 8, 1) | batch(1000001)",
     "column 46: batch size must be in 1..1000000, found 1000001", NULL},
    {"tfrecord(\"a\") | decode(raw, 8, 8, 1) | batch()",
     "column 40: batch needs a size", NULL},
    {"tfrecord(\"a\") | decode(raw, 8, 8, 1) | batch(2, "
     "drop_remainder=yes)",
     "column 64: expected true or false for batch drop_remainder, found "
     "'yes'",
     NULL},
    {"tfrecord(\"a\") | decode(raw, 8, 8, 1) | batch(2) | dilate(3)",
     "column 51: expected image ops before shuffle, batch and repeat, found "
     "'dilate' after 'batch'",
     NULL},
    {"tfrecord(\"a\") | decode(raw, 8, 8, 1) | batch(2) | shuffle()",
     "column 51: expected shuffle before batch and repeat, found it after "
     "'batch'",
     NULL},
    {"tfrecord(\"a\") | decode(raw, 8, 8, 1) | repeat() | batch(2)",
     "column 51: expected batch before repeat", NULL},
    {"tfrecord(\"a\") | decode(raw, 8, 8, 1) | batch(2) | batch(2)",
     "column 51: duplicate stage 'batch' (first at column 40)", NULL},
    {"tfrecord(\"a\") | decode(raw, 8, 8, 1) | repeat(0)",
     "column 47: repeat count must be >= 1 (repeat() repeats forever), "
     "found 0",
     NULL},
    {"tfrecord(\"a\") | decode(raw, 8, 8, 1) | repeat(-1)",
     "column 47: repeat count must be >= 1", NULL},
    {"tfrecord(\"a\") | decode(raw, 8, 8, 1) | repeat(1, 2)",
     "column 50: expected ')' (repeat takes at most 1 positional argument)",
     NULL},
    {"tfrecord(\"a\") |\n  decode(raw, 8, 8, 1) | dilate(x)",
     "line 2, column 33: expected an integer for dilate size, found 'x'",
     NULL},
    {"tfrecord(\"a\") | decode(raw, 8, 8, 1) | \x01",
     "column 40: expected a stage name, found byte 0x01", NULL},
    {"tfrecord(\"a\") | decode(raw, 8, 8, 1) |",
     "column 39: expected a stage name, found end of input", NULL},
};

/* The crop ops: every argument out of range names the op and the field. */
static const bad_case crop_bad_cases[] = {
    {"tfrecord(\"a\") | decode(jpeg) | random_resized_crop()",
     "column 32: random_resized_crop needs a size", NULL},
    {"tfrecord(\"a\") | decode(jpeg) | random_resized_crop(0)",
     "column 52: random_resized_crop height must be in 1..16384, found 0",
     NULL},
    {"tfrecord(\"a\") | decode(jpeg) | random_resized_crop(224, "
     "scale=(0, 1))",
     "random_resized_crop scale must be (min, max) with 0 < min <= max <= "
     "1, found (0, 1)",
     NULL},
    {"tfrecord(\"a\") | decode(jpeg) | random_resized_crop(224, "
     "scale=(0.5, 0.25))",
     "random_resized_crop scale must be (min, max) with 0 < min <= max <= "
     "1, found (0.5, 0.25)",
     NULL},
    {"tfrecord(\"a\") | decode(jpeg) | random_resized_crop(224, "
     "scale=(0.5, 1.5))",
     "random_resized_crop scale must be (min, max) with 0 < min <= max <= "
     "1, found 1.5",
     NULL},
    {"tfrecord(\"a\") | decode(jpeg) | random_resized_crop(224, "
     "ratio=(0.001, 1))",
     "random_resized_crop ratio must be (min, max) with 0.01 <= min <= max "
     "<= 100, found 0.001",
     NULL},
    {"tfrecord(\"a\") | decode(jpeg) | random_resized_crop(224, "
     "ratio=0.5)",
     "expected (min, max) for random_resized_crop ratio, found 0.5", NULL},
    {"tfrecord(\"a\") | decode(jpeg) | random_resized_crop(224, "
     "ratio=(0.5 1))",
     "expected ',' between min and max, found 1", NULL},
    {"tfrecord(\"a\") | decode(jpeg) | random_resized_crop(224, "
     "exact=1)",
     "expected true or false for random_resized_crop exact, found 1", NULL},
    {"tfrecord(\"a\") | decode(jpeg) | resize(224, 224, exact=true)",
     "resize exact applies to resize(S) only", NULL},
    {"tfrecord(\"a\") | decode(jpeg) | resize(0)",
     "resize height must be in 1..16384, found 0", NULL},
    {"tfrecord(\"a\") | decode(jpeg) | center_crop(16385)",
     "center_crop height must be in 1..16384, found 16385", NULL},
    {"tfrecord(\"a\") | decode(raw, 64, 64, 4) | resize(16000)",
     "resize: a 16000x16000x4 image is over the 268435456-byte limit",
     NULL},
    {"tfrecord(\"a\") | decode(raw, 64, 64, 5) | random_resized_crop(8)",
     "random_resized_crop (op 1): images of 1 to 4 channels, this one has 5",
     NULL},
    {"tfrecord(\"a\") | decode(raw, 64, 64, 6) | resize(8)",
     "resize (op 1): resize(S) takes images of 1 to 4 channels, this one "
     "has 6",
     NULL},
};

Test(spec, crop_ops_errors_name_the_field) {
  for (size_t i = 0; i < sizeof(crop_bad_cases) / sizeof(crop_bad_cases[0]);
       i++) {
    ferry_spec_t s;
    ferry_error_t err = {0};
    int rc = ferry__spec_parse(crop_bad_cases[i].text, &s, &err);
    cr_assert_eq(rc, FERRY_ESPEC, "case %zu <%s>: rc %d", i,
                 crop_bad_cases[i].text, rc);
    cr_assert(strstr(err.msg, crop_bad_cases[i].want) != NULL,
              "case %zu <%s>:\n  got  %s\n  want %s", i,
              crop_bad_cases[i].text, err.msg, crop_bad_cases[i].want);
  }
}

Test(spec, crop_ops_parse) {
  ferry_spec_t s;
  int h, w, c;
  parse_ok("tfrecord(\"a\") | decode(jpeg) | random_resized_crop(224)", &s);
  cr_assert_eq(s.n_ops, 1);
  cr_assert_eq(s.ops[0].kind, FERRY_OP_RANDOM_RESIZED_CROP);
  cr_assert(s.ops[0].a == 224 && s.ops[0].b == 224 && !s.ops[0].exact);
  /* torchvision's defaults. */
  cr_assert(s.ops[0].scale[0] == 0.08f && s.ops[0].scale[1] == 1.0f);
  cr_assert(s.ops[0].ratio[0] == 0.75f &&
            s.ops[0].ratio[1] == (float)(4.0 / 3.0));
  cr_assert_eq(ferry__spec_output_shape(&s, &h, &w, &c), 0);
  cr_assert(h == 224 && w == 224 && c == 3);
  ferry__spec_close(&s);
  /* resize(S) of an unknown size: the shape varies until center_crop. */
  parse_ok("tfrecord(\"a\") | decode(jpeg) | resize(256)", &s);
  cr_assert_eq(s.ops[0].kind, FERRY_OP_RESIZE_SHORTER);
  cr_assert_eq(ferry__spec_output_shape(&s, &h, &w, &c), FERRY_ESHAPE);
  ferry__spec_close(&s);
  parse_ok("tfrecord(\"a\") | decode(raw, 375, 500, 3) | resize(256)", &s);
  cr_assert_eq(ferry__spec_output_shape(&s, &h, &w, &c), 0);
  cr_assert(h == 256 && w == 341, "%dx%d", h, w);
  ferry__spec_close(&s);
  parse_ok("tfrecord(\"a\") | decode(jpeg) | resize(256) | "
           "center_crop(224, 200)",
           &s);
  cr_assert_eq(s.ops[1].kind, FERRY_OP_CENTER_CROP);
  cr_assert_eq(ferry__spec_output_shape(&s, &h, &w, &c), 0);
  cr_assert(h == 224 && w == 200);
  ferry__spec_close(&s);
}

Test(spec, errors_give_column_and_expectation) {
  size_t i;
  for (i = 0; i < sizeof(bad_cases) / sizeof(bad_cases[0]); i++) {
    ferry_spec_t s;
    ferry_error_t err = {0};
    int rc = ferry__spec_parse(bad_cases[i].text, &s, &err);
    cr_assert_eq(rc, FERRY_ESPEC, "case %zu <%s>: rc %d", i,
                 bad_cases[i].text, rc);
    cr_assert_eq(err.code, FERRY_ESPEC);
    cr_assert(strstr(err.msg, bad_cases[i].want) != NULL,
              "case %zu <%s>:\n  got  %s\n  want %s", i, bad_cases[i].text,
              err.msg, bad_cases[i].want);
    if (bad_cases[i].want2 != NULL)
      cr_assert(strstr(err.msg, bad_cases[i].want2) != NULL,
                "case %zu: got %s, want also %s", i, err.msg,
                bad_cases[i].want2);
    /* Nothing left to free: the spec is back to its defaults. */
    cr_assert_null(s.patterns);
    cr_assert_eq(s.n_patterns, 0);
    cr_assert_eq(s.n_ops, 0);
    ferry__spec_close(&s);
  }
}

Test(spec, too_many_ops) {
  char text[1024];
  size_t o;
  int i;
  ferry_spec_t s;
  ferry_error_t err = {0};
  o = (size_t)snprintf(text, sizeof(text),
                       "tfrecord(\"a\") | decode(raw, 8, 8, 1)");
  for (i = 0; i < FERRY_SPEC_MAX_OPS; i++)
    o += (size_t)snprintf(text + o, sizeof(text) - o, " | dilate(3)");
  parse_ok(text, &s);
  cr_assert_eq(s.n_ops, FERRY_SPEC_MAX_OPS);
  ferry__spec_close(&s);
  snprintf(text + o, sizeof(text) - o, " | blur(3, 1)");
  cr_assert_eq(ferry__spec_parse(text, &s, &err), FERRY_ESPEC);
  cr_assert(strstr(err.msg, "too many image ops (at most 16)") != NULL,
            "%s", err.msg);
  cr_assert(strstr(err.msg, "column 232:") != NULL, "%s", err.msg);
}

Test(spec, null_arguments) {
  ferry_spec_t s;
  ferry_error_t err = {0};
  cr_assert_eq(ferry__spec_parse(NULL, &s, &err), FERRY_EINVAL);
  cr_assert_eq(ferry__spec_parse("x", NULL, NULL), FERRY_EINVAL);
  cr_assert_eq(ferry__spec_validate(NULL, &err), FERRY_EINVAL);
  cr_assert_eq(ferry__spec_fingerprint(NULL), 0);
}

/* --- Round trips ------------------------------------------------------- */

static const char *const good_specs[] = {
    SEED_SPEC,
    "tfrecord(\"a\") | decode(raw, 1, 1, 1)",
    "tfrecord(\"a\", compression=zlib) | decode(raw, 1, 1, 16)",
    "tfrecord(\"a\", compression=gzip) | decode(raw, 1, 1, 16)",
    "tfrecord(\"a\", compression=auto) | decode(raw, 1, 1, 16)",
    "tfrecord(\"a\", \"b\") | decode(raw, 1, 1, 1)",
    "tfrecord(\"b\", \"a\") | decode(raw, 1, 1, 1)",
    "tfrecord(\"a\") | decode(raw, 1, 1, 1, key=\"img\")",
    "tfrecord(\"a\") | decode(raw, 1, 1, 1) | label(none)",
    "tfrecord(\"a\") | decode(raw, 1, 1, 1) | label(\"none\")",
    "tfrecord(\"a\") | decode(raw, 1, 1, 1) | label(\"image\")",
    "tfrecord(\"a\") | decode(jpeg)",
    "tfrecord(\"a\") | decode(jpeg, 224, 224)",
    "tfrecord(\"a\") | decode(jpeg) | resize(224, 224) | blur(11, 0.8)",
    "tfrecord(\"a\") | decode(jpeg) | resize(224, 225) | blur(11, 0.8)",
    "tfrecord(\"a\") | decode(raw, 32, 32, 3) | blur(11, 0.800000012)",
    "tfrecord(\"a\") | decode(raw, 32, 32, 3) | blur(11, 0.80000001)",
    "tfrecord(\"a\") | decode(raw, 32, 32, 3) | blur(3, 0.1234567)",
    "tfrecord(\"a\") | decode(raw, 32, 32, 3) | blur(3, 99.99999)",
    "tfrecord(\"a\") | decode(raw, 32, 32, 3) | blur(3, 0.001)",
    "tfrecord(\"a\") | decode(raw, 32, 32, 3) | dilate(3) | blur(3, 1)",
    "tfrecord(\"a\") | decode(raw, 32, 32, 3) | blur(3, 1) | dilate(3)",
    "tfrecord(\"a\") | decode(raw, 32, 32, 3) | shuffle()",
    "tfrecord(\"a\") | decode(raw, 32, 32, 3) | shuffle(seed=1)",
    "tfrecord(\"a\") | decode(raw, 32, 32, 3) | shuffle(buffer=1)",
    "tfrecord(\"a\") | decode(raw, 32, 32, 3) | batch(1)",
    "tfrecord(\"a\") | decode(jpeg, 9, 9) | batch(1, drop_remainder=true)",
    "tfrecord(\"a\") | decode(raw, 32, 32, 3) | repeat()",
    "tfrecord(\"a\") | decode(raw, 32, 32, 3) | repeat(2)",
    "tfrecord(\"a\") | decode(raw, 32, 32, 3) | repeat(9223372036854775807)",
    "tfrecord(\"a\") | decode(jpeg) | random_resized_crop(224) | batch(256)",
    "tfrecord(\"a\") | decode(jpeg) | random_resized_crop(224, 192, "
    "scale=(0.25, 0.5), ratio=(0.5, 2), exact=true)",
    "tfrecord(\"a\") | decode(jpeg) | random_resized_crop(8, "
    "scale=(1e-06, 1), ratio=(0.01, 100))",
    "tfrecord(\"a\") | decode(jpeg) | resize(256) | center_crop(224)",
    "tfrecord(\"a\") | decode(jpeg) | resize(256, exact=true) | "
    "center_crop(224, 200)",
    "tfrecord(\"a\") | decode(raw, 32, 48, 4) | center_crop(16) | "
    "resize(8) | random_resized_crop(4)",
};
#define N_GOOD (sizeof(good_specs) / sizeof(good_specs[0]))

Test(spec, text_round_trip) {
  size_t i;
  for (i = 0; i < N_GOOD; i++) {
    ferry_spec_t a, b;
    char *t1, *t2;
    parse_ok(good_specs[i], &a);
    t1 = format_ok(&a);
    parse_ok(t1, &b);
    cr_assert(ferry__spec_equal(&a, &b), "<%s> -> <%s> differs", good_specs[i],
              t1);
    cr_assert_eq(memcmp(&a.ops, &b.ops, sizeof(a.ops)), 0,
                 "op fields differ bitwise for <%s>", t1);
    t2 = format_ok(&b);
    cr_assert_str_eq(t1, t2);
    ferry_free(t1);
    ferry_free(t2);
    ferry__spec_close(&a);
    ferry__spec_close(&b);
  }
}

Test(spec, float_round_trip_is_bit_exact) {
  /* Every float32 sigma from 0.001 to 100 in a coarse walk, plus its
   * neighbours, survives format -> parse. */
  float f;
  for (f = 0.001f; f <= 100.0f; f *= 1.37f) {
    float v[3] = {nextafterf(f, 0), f, nextafterf(f, 200)};
    int k;
    for (k = 0; k < 3; k++) {
      ferry_spec_t a, b;
      char *t;
      if (v[k] < 0.001f || v[k] > 100.0f)
        continue;
      parse_ok("tfrecord(\"a\") | decode(jpeg) | blur(3, 1)", &a);
      a.ops[0].sigma = v[k];
      t = format_ok(&a);
      parse_ok(t, &b);
      cr_assert_eq(memcmp(&a.ops[0].sigma, &b.ops[0].sigma, sizeof(float)),
                   0, "%.9g -> %s", (double)v[k], t);
      ferry_free(t);
      ferry__spec_close(&a);
      ferry__spec_close(&b);
    }
  }
}

Test(spec, pack_round_trip) {
  size_t i;
  for (i = 0; i < N_GOOD; i++) {
    ferry_spec_t a, b;
    ferry_error_t err = {0};
    uint8_t *buf, *buf2;
    size_t len, len2;
    parse_ok(good_specs[i], &a);
    cr_assert_eq(ferry__spec_pack(&a, &buf, &len), 0);
    cr_assert_eq(ferry__spec_unpack(buf, len, &b, &err), 0, "<%s>: %s",
                 good_specs[i], err.msg);
    cr_assert(ferry__spec_equal(&a, &b), "<%s> differs after unpack",
              good_specs[i]);
    cr_assert_eq(ferry__spec_fingerprint(&a), ferry__spec_fingerprint(&b));
    cr_assert_eq(ferry__spec_pack(&b, &buf2, &len2), 0);
    cr_assert_eq(len, len2);
    cr_assert_eq(memcmp(buf, buf2, len), 0, "pack is not canonical");
    ferry_free(buf);
    ferry_free(buf2);
    ferry__spec_close(&a);
    ferry__spec_close(&b);
  }
}

Test(spec, copy_and_equal) {
  size_t i;
  for (i = 0; i < N_GOOD; i++) {
    ferry_spec_t a, b;
    parse_ok(good_specs[i], &a);
    cr_assert_eq(ferry__spec_copy(&b, &a), 0);
    cr_assert(ferry__spec_equal(&a, &b));
    if (a.n_patterns > 0)
      cr_assert_neq(a.patterns[0], b.patterns[0], "copy must be deep");
    ferry__spec_close(&a);
    cr_assert(!ferry__spec_equal(&a, &b));
    ferry__spec_close(&b);
  }
}

/* --- Fingerprint --------------------------------------------------------*/

Test(spec, equal_specs_written_differently_have_equal_fingerprints) {
  static const char *const same[] = {
      SEED_SPEC,
      SEED_CANONICAL,
      "tfrecord( \"/data/train-*.tfrecord\" , compression = none )|"
      "decode(raw,32,32,3,key=\"image\")|label(\"label\")|dilate(3)|"
      "blur(11,8e-1)|shuffle(buffer=10000,seed=7)|"
      "batch(1024,drop_remainder=false)|repeat(1)",
      "\n\ttfrecord(\"/data/train-*.tfrecord\")\n| label(key=\"label\") "
      "| decode(format=raw, height=32, width=32, channels=3)\n| dilate(3) "
      "| blur(11, 0.80000001) | shuffle(seed=007) | batch(size=1024)\n",
  };
  ferry_spec_t s;
  uint64_t fp0;
  size_t i;
  parse_ok(same[0], &s);
  fp0 = ferry__spec_fingerprint(&s);
  ferry__spec_close(&s);
  cr_assert_neq(fp0, 0);
  for (i = 1; i < sizeof(same) / sizeof(same[0]); i++) {
    parse_ok(same[i], &s);
    cr_assert_eq(ferry__spec_fingerprint(&s), fp0, "<%s>", same[i]);
    ferry__spec_close(&s);
  }
}

Test(spec, different_specs_have_different_fingerprints) {
  uint64_t fps[N_GOOD];
  size_t i, j;
  for (i = 0; i < N_GOOD; i++) {
    ferry_spec_t s;
    parse_ok(good_specs[i], &s);
    fps[i] = ferry__spec_fingerprint(&s);
    ferry__spec_close(&s);
  }
  for (i = 0; i < N_GOOD; i++)
    for (j = i + 1; j < N_GOOD; j++) {
      /* 0.800000012 and 0.80000001 are the same float32. */
      if (strstr(good_specs[i], "blur(11, 0.8000000") &&
          strstr(good_specs[j], "blur(11, 0.8000000"))
        continue;
      cr_assert_neq(fps[i], fps[j], "<%s> and <%s>", good_specs[i],
                    good_specs[j]);
    }
}

Test(spec, fingerprint_of_invalid_spec_is_zero) {
  ferry_spec_t s;
  parse_ok(SEED_SPEC, &s);
  s.ops[1].a = 12;
  cr_assert_eq(ferry__spec_fingerprint(&s), 0);
  s.ops[1].a = 11;
  s.n_ops = FERRY_SPEC_MAX_OPS + 1;
  cr_assert_eq(ferry__spec_fingerprint(&s), 0);
  s.n_ops = 2;
  ferry__spec_close(&s);
}

/* --- Validation of hand-made specs ------------------------------------ */

static void expect_invalid(ferry_spec_t *s, const char *want) {
  ferry_error_t err = {0};
  uint8_t *buf = (uint8_t *)"x";
  size_t len = 9;
  char *text = (char *)"x";
  cr_assert_eq(ferry__spec_validate(s, &err), FERRY_ESPEC, "want %s", want);
  cr_assert(strstr(err.msg, want) != NULL, "got %s, want %s", err.msg, want);
  cr_assert_eq(ferry__spec_pack(s, &buf, &len), FERRY_ESPEC);
  cr_assert_null(buf);
  cr_assert_eq(len, 0);
  cr_assert_eq(ferry__spec_format(s, &text), FERRY_ESPEC);
  cr_assert_null(text);
}

Test(spec, validate_hand_made) {
  ferry_spec_t s;
  ferry_error_t err = {0};
  char **pats;

  ferry__spec_init(&s);
  expect_invalid(&s, "tfrecord: needs at least one file pattern");
  pats = ferry__calloc(1, sizeof(char *));
  pats[0] = ferry__strdup("a\rb");
  s.patterns = pats;
  s.n_patterns = 1;
  expect_invalid(&s, "tfrecord: pattern 1 contains a control character");
  pats[0][1] = '\xc3'; /* a lone lead byte */
  expect_invalid(&s, "tfrecord: pattern 1 is not valid UTF-8");
  pats[0][1] = 'x';
  expect_invalid(&s, "decode(raw): height and width must be in 1..65535");
  s.height = s.width = 8;
  s.channels = 3;
  cr_assert_eq(ferry__spec_validate(&s, &err), 0, "%s", err.msg);
  s.compression = (ferry_compression_t)9;
  expect_invalid(&s, "tfrecord: unknown compression 9");
  s.compression = FERRY_COMPRESSION_NONE;
  s.format = (ferry_image_format_t)5;
  expect_invalid(&s, "decode: unknown image format 5");
  s.format = FERRY_IMAGE_JPEG;
  s.channels = 1;
  expect_invalid(&s, "decode(jpeg): channels must be 3, found 1");
  s.channels = 3;
  s.width = 0;
  expect_invalid(&s, "decode(jpeg): give both height and width or neither");
  s.height = 0;
  cr_assert_eq(ferry__spec_validate(&s, &err), 0, "%s", err.msg);
  s.image_key = (char *)"";
  expect_invalid(&s, "decode: image key is empty");
  s.image_key = (char *)"image";
  s.label_key = (char *)"";
  expect_invalid(&s, "label: key is empty");
  s.label_key = NULL;

  /* JPEG of any size: blur cannot be checked, resize makes it known. */
  s.n_ops = 2;
  s.ops[0] = (ferry_image_op_t){.kind = FERRY_OP_BLUR, .a = 31, .b = 0, .sigma = 1.0f};
  s.ops[1] = (ferry_image_op_t){.kind = FERRY_OP_RESIZE, .a = 15, .b = 100, .sigma = 0};
  cr_assert_eq(ferry__spec_validate(&s, &err), 0, "%s", err.msg);
  s.ops[0] = (ferry_image_op_t){.kind = FERRY_OP_RESIZE, .a = 15, .b = 100, .sigma = 0};
  s.ops[1] = (ferry_image_op_t){.kind = FERRY_OP_BLUR, .a = 31, .b = 0, .sigma = 1.0f};
  expect_invalid(&s, "blur (op 2): a 15x100 image is too small for size 31");
  s.ops[1] = (ferry_image_op_t){.kind = FERRY_OP_BLUR, .a = 3, .b = 0, .sigma = NAN};
  expect_invalid(&s, "blur (op 2): sigma must be in 0.001..100, found nan");
  s.ops[1] = (ferry_image_op_t){.kind = FERRY_OP_BLUR, .a = 3, .b = 0, .sigma = 0.0009f};
  expect_invalid(&s, "blur (op 2): sigma must be in 0.001..100");
  s.ops[1] = (ferry_image_op_t){.kind = FERRY_OP_DILATE, .a = 2, .b = 0, .sigma = 0};
  expect_invalid(&s, "dilate (op 2): size must be 3");
  s.ops[1] = (ferry_image_op_t){.kind = (ferry_op_kind_t)7, .a = 2, .b = 0, .sigma = 0};
  expect_invalid(&s, "op 2: unknown kind 7");
  s.ops[1] = (ferry_image_op_t){.kind = FERRY_OP_RESIZE, .a = 1, .b = 16385, .sigma = 0};
  expect_invalid(&s, "resize (op 2): height and width must be in 1..16384");
  s.ops[1] = (ferry_image_op_t){.kind = FERRY_OP_DILATE, .a = 3, .b = 0, .sigma = 0};
  s.n_ops = FERRY_SPEC_MAX_OPS + 1;
  expect_invalid(&s, "too many image ops: 17 (at most 16)");
  s.n_ops = 2;
  cr_assert_eq(ferry__spec_validate(&s, &err), 0, "%s", err.msg);

  s.shuffle = true;
  s.shuffle_buffer = 0;
  expect_invalid(&s, "shuffle: buffer must be in 1..100000000, found 0");
  s.shuffle = false; /* ignored when not shuffling */
  cr_assert_eq(ferry__spec_validate(&s, &err), 0, "%s", err.msg);
  s.drop_remainder = true;
  expect_invalid(&s, "batch: drop_remainder without a batch size");
  s.batch_size = 1000001;
  expect_invalid(&s, "batch: size must be in 1..1000000, found 1000001");
  s.batch_size = 8;
  s.repeat = 0;
  expect_invalid(&s, "repeat: count must be >= 1 or -1 (infinite), found 0");
  s.repeat = -2;
  expect_invalid(&s, "found -2");
  s.repeat = -1;
  cr_assert_eq(ferry__spec_validate(&s, &err), 0, "%s", err.msg);
  s.image_key = NULL; /* the static default is not to be freed */
  ferry__spec_close(&s);
}

/* --- Protobuf form ------------------------------------------------------*/

static int unpack_bytes(const uint8_t *b, size_t n, ferry_spec_t *s,
                        ferry_error_t *err) {
  return ferry__spec_unpack(b, n, s, err);
}

Test(spec, unpack_rejects_garbage_and_truncation) {
  ferry_spec_t a, b;
  ferry_error_t err = {0};
  uint8_t *buf, junk[64];
  size_t len, i;
  unsigned x = 12345;

  parse_ok(SEED_SPEC, &a);
  cr_assert_eq(ferry__spec_pack(&a, &buf, &len), 0);
  /* A prefix is malformed, or incomplete, or (cut between trailing
   * fields) a valid spec with those fields at their defaults. */
  for (i = 0; i < len; i++) {
    int rc = unpack_bytes(buf, i, &b, &err);
    cr_assert(rc == FERRY_ESPEC || (rc == 0 && i > 30), "prefix %zu: rc %d",
              i, rc);
    if (rc != 0)
      cr_assert_null(b.patterns);
    ferry__spec_close(&b);
  }
  /* Random bytes never crash and never leave anything allocated. */
  for (i = 0; i < 2000; i++) {
    size_t k, n = i % sizeof(junk);
    int rc;
    for (k = 0; k < n; k++) {
      x = x * 1103515245u + 12345u;
      junk[k] = (uint8_t)(x >> 16);
    }
    rc = unpack_bytes(junk, n, &b, &err);
    cr_assert(rc == 0 || rc == FERRY_ESPEC, "rc %d", rc);
    ferry__spec_close(&b);
  }
  /* One flipped byte at a time: accepted specs re-pack canonically. */
  for (i = 0; i < len; i++) {
    uint8_t *m = ferry__malloc(len);
    memcpy(m, buf, len);
    m[i] ^= 0x5a;
    if (unpack_bytes(m, len, &b, &err) == 0) {
      cr_assert_eq(ferry__spec_validate(&b, NULL), 0);
      ferry__spec_close(&b);
    }
    ferry__free(m);
  }
  cr_assert_eq(unpack_bytes(NULL, 0, &b, &err), FERRY_ESPEC);
  cr_assert(strstr(err.msg, "source is missing") != NULL, "%s", err.msg);
  cr_assert_eq(unpack_bytes(NULL, 3, &b, &err), FERRY_EINVAL);
  ferry_free(buf);
  ferry__spec_close(&a);
}

Test(spec, unpack_maps_proto3_defaults) {
  /* A PipelineSpec written by another client, leaning on proto3
   * defaults: no decode key, JPEG channels 0, no label message, shuffle
   * buffer 0, repeat 0. */
  Ferry__V1__PipelineSpec m = FERRY__V1__PIPELINE_SPEC__INIT;
  Ferry__V1__Source src = FERRY__V1__SOURCE__INIT;
  Ferry__V1__Decode dec = FERRY__V1__DECODE__INIT;
  Ferry__V1__Shuffle sh = FERRY__V1__SHUFFLE__INIT;
  char *pats[] = {(char *)"/d/*.tfrecord"};
  uint8_t buf[256];
  size_t len;
  ferry_spec_t s, t;
  ferry_error_t err = {0};

  src.n_patterns = 1;
  src.patterns = pats;
  dec.format = FERRY__V1__IMAGE_FORMAT__IMAGE_FORMAT_JPEG;
  sh.enabled = 1;
  sh.seed = 7;
  m.source = &src;
  m.decode = &dec;
  m.shuffle = &sh;
  m.batch_size = 32;
  len = ferry__v1__pipeline_spec__pack(&m, buf);
  cr_assert_eq(ferry__spec_unpack(buf, len, &s, &err), 0, "%s", err.msg);
  parse_ok("tfrecord(\"/d/*.tfrecord\") | decode(jpeg) | "
           "shuffle(seed=7, buffer=10000) | batch(32) | repeat(1)",
           &t);
  cr_assert(ferry__spec_equal(&s, &t));
  cr_assert_eq(ferry__spec_fingerprint(&s), ferry__spec_fingerprint(&t));
  ferry__spec_close(&s);
  ferry__spec_close(&t);

  /* A Label with an empty key means no label; disabled shuffle is no
   * shuffle whatever its seed. */
  {
    Ferry__V1__Label lab = FERRY__V1__LABEL__INIT;
    m.label = &lab;
    sh.enabled = 0;
    len = ferry__v1__pipeline_spec__pack(&m, buf);
    cr_assert_eq(ferry__spec_unpack(buf, len, &s, &err), 0, "%s", err.msg);
    cr_assert_null(s.label_key);
    cr_assert(!s.shuffle);
    ferry__spec_close(&s);
    m.label = NULL;
  }

  /* Invalid values are refused with the field's name. */
  dec.channels = 4;
  len = ferry__v1__pipeline_spec__pack(&m, buf);
  cr_assert_eq(ferry__spec_unpack(buf, len, &s, &err), FERRY_ESPEC);
  cr_assert(strstr(err.msg, "channels must be 3") != NULL, "%s", err.msg);
  dec.channels = 0;
  dec.height = 0x80000000u;
  dec.width = 1;
  len = ferry__v1__pipeline_spec__pack(&m, buf);
  cr_assert_eq(ferry__spec_unpack(buf, len, &s, &err), FERRY_ESPEC);
  cr_assert(strstr(err.msg, "decode height") != NULL, "%s", err.msg);
  dec.height = dec.width = 0;
  m.repeat = -5;
  len = ferry__v1__pipeline_spec__pack(&m, buf);
  cr_assert_eq(ferry__spec_unpack(buf, len, &s, &err), FERRY_ESPEC);
  cr_assert(strstr(err.msg, "repeat") != NULL, "%s", err.msg);
  m.repeat = 0;
  src.compression = (Ferry__V1__Compression)12;
  len = ferry__v1__pipeline_spec__pack(&m, buf);
  cr_assert_eq(ferry__spec_unpack(buf, len, &s, &err), FERRY_ESPEC);
  cr_assert(strstr(err.msg, "unknown compression 12") != NULL, "%s",
            err.msg);
  src.compression = 0;
  {
    Ferry__V1__ImageOp op = FERRY__V1__IMAGE_OP__INIT, *ops[] = {&op};
    m.n_ops = 1;
    m.ops = ops;
    len = ferry__v1__pipeline_spec__pack(&m, buf);
    cr_assert_eq(ferry__spec_unpack(buf, len, &s, &err), FERRY_ESPEC);
    cr_assert(strstr(err.msg, "ops[0]: no op set") != NULL, "%s", err.msg);
    m.n_ops = 0;
    m.ops = NULL;
  }
}

Test(spec, unpack_refuses_unknown_fields) {
  ferry_spec_t s;
  ferry_error_t err = {0};
  uint8_t *buf, *big;
  size_t len;
  parse_ok(SEED_SPEC, &s);
  cr_assert_eq(ferry__spec_pack(&s, &buf, &len), 0);
  ferry__spec_close(&s);
  /* Field 99, varint 1, appended: a newer client's option. */
  big = ferry__malloc(len + 3);
  memcpy(big, buf, len);
  big[len] = (99 << 3) & 0x7f ? (uint8_t)(((99 << 3) & 0x7f) | 0x80) : 0;
  big[len + 1] = (uint8_t)((99 << 3) >> 7);
  big[len + 2] = 1;
  cr_assert_eq(ferry__spec_unpack(big, len + 3, &s, &err), FERRY_ESPEC);
  cr_assert(strstr(err.msg, "PipelineSpec: unknown field 99") != NULL, "%s",
            err.msg);
  ferry__free(big);
  ferry_free(buf);
}

Test(spec, pack_bytes_are_canonical) {
  /* The smallest spec, byte for byte (docs/PROTOCOL.md shows it). */
  static const uint8_t want[] = {
      0x0a, 0x03, 0x0a, 0x01, 'a',              /* source */
      0x12, 0x0d, 0x10, 0x01, 0x18, 0x02, 0x20, /* decode */
      0x03, 0x2a, 0x05, 'i',  'm',  'a',  'g',  'e',
      0x1a, 0x07, 0x0a, 0x05, 'l',  'a',  'b',  'e',  'l', /* label */
      0x40, 0x01};                                           /* repeat */
  ferry_spec_t s;
  uint8_t *buf;
  size_t len;
  parse_ok("tfrecord(\"a\") | decode(raw, 1, 2, 3)", &s);
  cr_assert_eq(ferry__spec_pack(&s, &buf, &len), 0);
  cr_assert_eq(len, sizeof(want));
  cr_assert_eq(memcmp(buf, want, len), 0);
  cr_assert_eq(ferry__spec_fingerprint(&s), 0xdcad776849087bd0ull);
  ferry_free(buf);
  ferry__spec_close(&s);
}

/* --- Output shape -------------------------------------------------------*/

Test(spec, output_shape) {
  ferry_spec_t s;
  int h = -1, w = -1, c = -1;
  parse_ok(SEED_SPEC, &s);
  cr_assert_eq(ferry__spec_output_shape(&s, &h, &w, &c), 0);
  cr_assert(h == 32 && w == 32 && c == 3);
  ferry__spec_close(&s);
  parse_ok("tfrecord(\"a\") | decode(jpeg) | dilate(3)", &s);
  cr_assert_eq(ferry__spec_output_shape(&s, &h, &w, &c), FERRY_ESHAPE);
  ferry__spec_close(&s);
  parse_ok("tfrecord(\"a\") | decode(jpeg) | resize(10, 20) | dilate(3) | "
           "resize(5, 7) | blur(3, 1)",
           &s);
  cr_assert_eq(ferry__spec_output_shape(&s, &h, &w, &c), 0);
  cr_assert(h == 5 && w == 7 && c == 3);
  ferry__spec_close(&s);
  parse_ok("tfrecord(\"a\") | decode(raw, 4, 6, 16)", &s);
  cr_assert_eq(ferry__spec_output_shape(&s, &h, &w, &c), 0);
  cr_assert(h == 4 && w == 6 && c == 16);
  ferry__spec_close(&s);
}

/* --- File expansion ---------------------------------------------------- */

static void touch(const char *dir, const char *name) {
  char path[512];
  FILE *f;
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  f = fopen(path, "w");
  cr_assert_not_null(f, "%s", path);
  fclose(f);
}

static void rm_tree(const char *dir) {
  char cmd[600];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
}

static void spec_with(ferry_spec_t *s, const char *dir,
                      const char *const *pats, size_t n) {
  size_t i;
  ferry__spec_init(s);
  s->patterns = ferry__calloc(n, sizeof(char *));
  cr_assert_not_null(s->patterns);
  s->n_patterns = n;
  for (i = 0; i < n; i++) {
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", dir, pats[i]);
    s->patterns[i] = ferry__strdup(p);
  }
}

Test(spec, expand_files) {
  char dir[] = "/tmp/ferry-spec-XXXXXX", sub[600], want[600];
  static const char *const pats[] = {"b-*.tfrecord", "*.tfrecord",
                                     "a-0.tfrecord", "sub*"};
  ferry_spec_t s;
  ferry_error_t err = {0};
  char **files;
  size_t n, i;

  cr_assert_not_null(mkdtemp(dir));
  touch(dir, "b-1.tfrecord");
  touch(dir, "a-0.tfrecord");
  touch(dir, "b-0.tfrecord");
  touch(dir, "A-9.tfrecord");
  touch(dir, "notes.txt");
  snprintf(sub, sizeof(sub), "%s/sub.d", dir);
  cr_assert_eq(mkdir(sub, 0700), 0);
  touch(dir, "sub-file");

  spec_with(&s, dir, pats, 4);
  cr_assert_eq(ferry__spec_expand_files(&s, &files, &n, &err), 0, "%s",
               err.msg);
  /* Byte order (upper case first), duplicates once, no directory. */
  {
    static const char *const order[] = {"A-9.tfrecord", "a-0.tfrecord",
                                        "b-0.tfrecord", "b-1.tfrecord",
                                        "sub-file"};
    cr_assert_eq(n, 5);
    for (i = 0; i < n; i++) {
      snprintf(want, sizeof(want), "%s/%s", dir, order[i]);
      cr_assert_str_eq(files[i], want);
    }
  }
  ferry__spec_free_files(files, n);
  ferry__spec_close(&s);

  {
    static const char *const nomatch[] = {"*.tfrecord", "c-*.tfrecord"};
    spec_with(&s, dir, nomatch, 2);
    files = (char **)&s;
    cr_assert_eq(ferry__spec_expand_files(&s, &files, &n, &err), FERRY_ENOENT);
    cr_assert_null(files);
    cr_assert_eq(n, 0);
    cr_assert(strstr(err.msg, "no file matches pattern") != NULL);
    cr_assert(strstr(err.msg, "c-*.tfrecord") != NULL, "%s", err.msg);
    ferry__spec_close(&s);
  }
  {
    static const char *const missing[] = {"a-0.tfrecord", "missing.tfr"};
    spec_with(&s, dir, missing, 2);
    cr_assert_eq(ferry__spec_expand_files(&s, &files, &n, &err), FERRY_ENOENT);
    cr_assert(strstr(err.msg, "missing.tfr") != NULL, "%s", err.msg);
    ferry__spec_close(&s);
  }
  {
    static const char *const nodir[] = {"nodir/*.tfrecord"};
    spec_with(&s, dir, nodir, 1);
    cr_assert_eq(ferry__spec_expand_files(&s, &files, &n, &err), FERRY_ENOENT);
    ferry__spec_close(&s);
  }
  {
    static const char *const dirs[] = {"sub.*"};
    spec_with(&s, dir, dirs, 1);
    cr_assert_eq(ferry__spec_expand_files(&s, &files, &n, &err), FERRY_ENOENT);
    cr_assert(strstr(err.msg, "matches only directories") != NULL, "%s",
              err.msg);
    ferry__spec_close(&s);
  }
  {
    /* A backslash makes glob's special characters literal. */
    static const char *const lit[] = {"x\\[1].dat"};
    touch(dir, "x[1].dat");
    touch(dir, "x1.dat");
    spec_with(&s, dir, lit, 1);
    cr_assert_eq(ferry__spec_expand_files(&s, &files, &n, &err), 0, "%s",
                 err.msg);
    cr_assert_eq(n, 1);
    snprintf(want, sizeof(want), "%s/x[1].dat", dir);
    cr_assert_str_eq(files[0], want);
    ferry__spec_free_files(files, n);
    ferry__spec_close(&s);
  }
  /* Allocation failures: ENOMEM or success, nothing leaked. */
  {
    int64_t k;
    spec_with(&s, dir, pats, 4);
    for (k = 0;; k++) {
      int rc;
      ferry__alloc_fail_after(k);
      rc = ferry__spec_expand_files(&s, &files, &n, &err);
      ferry__alloc_fail_reset();
      if (rc == 0) {
        cr_assert_eq(n, 5);
        ferry__spec_free_files(files, n);
        break;
      }
      cr_assert_eq(rc, FERRY_ENOMEM, "k=%lld rc=%d", (long long)k, rc);
    }
    ferry__spec_close(&s);
  }
  rm_tree(dir);
}

/* `ferryctl records index` writes FILE.idx next to each shard,
 * and a glob like train-* matches those too: they are never shards. */
Test(spec, expand_files_skips_index_files) {
  char dir[] = "/tmp/ferry-spec-XXXXXX", want[600];
  static const char *const star[] = {"train-*"};
  static const char *const only_idx[] = {"*.idx"};
  ferry_spec_t s;
  ferry_error_t err = {0};
  char **files;
  size_t n;

  cr_assert_not_null(mkdtemp(dir));
  touch(dir, "train-0.tfrecord");
  touch(dir, "train-0.tfrecord.idx");
  touch(dir, "train-1.tfrecord");
  touch(dir, "train-1.tfrecord.idx");
  touch(dir, "train-2.idx"); /* DALI's tfrecord2idx naming */
  touch(dir, "train-3.idxx");
  spec_with(&s, dir, star, 1);
  cr_assert_eq(ferry__spec_expand_files(&s, &files, &n, &err), 0, "%s",
               err.msg);
  {
    static const char *const order[] = {"train-0.tfrecord", "train-1.tfrecord",
                                        "train-3.idxx"};
    cr_assert_eq(n, 3);
    for (size_t i = 0; i < n; i++) {
      snprintf(want, sizeof(want), "%s/%s", dir, order[i]);
      cr_assert_str_eq(files[i], want);
    }
  }
  ferry__spec_free_files(files, n);
  ferry__spec_close(&s);

  spec_with(&s, dir, only_idx, 1);
  cr_assert_eq(ferry__spec_expand_files(&s, &files, &n, &err), FERRY_ENOENT);
  cr_assert(strstr(err.msg, ".idx index files") != NULL, "%s", err.msg);
  cr_assert(strstr(err.msg, "*.idx") != NULL, "%s", err.msg);
  ferry__spec_close(&s);
  rm_tree(dir);
}

/* --- Allocation failures ------------------------------------------------*/

Test(spec, alloc_failure_injection) {
  static const char *const texts[] = {
      SEED_SPEC,
      "tfrecord(\"a\", \"b\", \"c\", \"d\", \"e\") | decode(jpeg, key=\"k\") "
      "| label(\"y\") | resize(8, 8) | blur(3, 1)",
      "tfrecord(\"a\") | decode(raw, 1, 1, 1, key=\"x\") | label(\"y\") | "
      "batch(0)",
  };
  size_t t;
  for (t = 0; t < sizeof(texts) / sizeof(texts[0]); t++) {
    ferry_spec_t ref;
    uint8_t *packed;
    size_t plen;
    int64_t k;
    bool expect_ok = t < 2;
    parse_ok(t < 2 ? texts[t] : texts[0], &ref);
    cr_assert_eq(ferry__spec_pack(&ref, &packed, &plen), 0);

    for (k = 0;; k++) { /* parse */
      ferry_spec_t s;
      ferry_error_t err = {0};
      int rc;
      ferry__alloc_fail_after(k);
      rc = ferry__spec_parse(texts[t], &s, &err);
      ferry__alloc_fail_reset();
      if (rc == 0) {
        cr_assert(expect_ok);
        ferry__spec_close(&s);
        break;
      }
      cr_assert_null(s.patterns);
      if (!expect_ok && rc == FERRY_ESPEC)
        break;
      cr_assert_eq(rc, FERRY_ENOMEM, "text %zu k=%lld rc=%d %s", t,
                   (long long)k, rc, err.msg);
      cr_assert_eq(err.code, FERRY_ENOMEM);
    }
    for (k = 0;; k++) { /* format */
      char *out = NULL;
      int rc;
      ferry__alloc_fail_after(k);
      rc = ferry__spec_format(&ref, &out);
      ferry__alloc_fail_reset();
      if (rc == 0) {
        ferry_free(out);
        break;
      }
      cr_assert_eq(rc, FERRY_ENOMEM);
      cr_assert_null(out);
    }
    for (k = 0;; k++) { /* pack */
      uint8_t *out = NULL;
      size_t len;
      int rc;
      ferry__alloc_fail_after(k);
      rc = ferry__spec_pack(&ref, &out, &len);
      ferry__alloc_fail_reset();
      if (rc == 0) {
        ferry_free(out);
        break;
      }
      cr_assert_eq(rc, FERRY_ENOMEM);
    }
    for (k = 0;; k++) { /* unpack */
      ferry_spec_t s;
      ferry_error_t err = {0};
      int rc;
      ferry__alloc_fail_after(k);
      rc = ferry__spec_unpack(packed, plen, &s, &err);
      ferry__alloc_fail_reset();
      if (rc == 0) {
        cr_assert(ferry__spec_equal(&s, &ref));
        ferry__spec_close(&s);
        break;
      }
      cr_assert_eq(rc, FERRY_ENOMEM, "k=%lld rc=%d %s", (long long)k, rc,
                   err.msg);
      cr_assert_null(s.patterns);
    }
    for (k = 0;; k++) { /* copy */
      ferry_spec_t s;
      int rc;
      ferry__alloc_fail_after(k);
      rc = ferry__spec_copy(&s, &ref);
      ferry__alloc_fail_reset();
      if (rc == 0) {
        cr_assert(ferry__spec_equal(&s, &ref));
        ferry__spec_close(&s);
        break;
      }
      cr_assert_eq(rc, FERRY_ENOMEM);
    }
    /* The fingerprint allocates nothing at all. */
    ferry__alloc_fail_after(0);
    cr_assert_neq(ferry__spec_fingerprint(&ref), 0);
    ferry__alloc_fail_reset();
    ferry_free(packed);
    ferry__spec_close(&ref);
  }
}

Test(spec, close_is_idempotent) {
  ferry_spec_t s;
  parse_ok(SEED_SPEC, &s);
  ferry__spec_close(&s);
  ferry__spec_close(&s);
  cr_assert_null(s.patterns);
  cr_assert_str_eq(s.image_key, "image");
  cr_assert_str_eq(s.label_key, "label");
  cr_assert_eq(s.repeat, 1);
  cr_assert_eq(s.shuffle_buffer, 10000);
}

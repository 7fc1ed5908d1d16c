/* TFRecord reader, writer and index: framing vectors, round trips through
 * each compression, record ranges, every kind of bad input under both
 * policies, leak checks, and conformance with files written by
 * TensorFlow and others ($FERRY_TESTDATA_DIR/tfrecord). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "alloc.h"
#include "crc32c.h"
#include "tfrecord.h"

/* Helpers. */

static char tmpdir[64];

static void make_tmpdir(void) {
  strcpy(tmpdir, "/tmp/ferry-tfr-XXXXXX");
  cr_assert_not_null(mkdtemp(tmpdir));
}

static void remove_tmpdir(void) {
  DIR *d = opendir(tmpdir);
  struct dirent *e;
  char p[512];
  if (d == NULL)
    return;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.')
      continue;
    snprintf(p, sizeof(p), "%s/%s", tmpdir, e->d_name);
    unlink(p);
  }
  closedir(d);
  rmdir(tmpdir);
}

static const char *tpath(const char *name) {
  static char bufs[4][512];
  static int next;
  char *p = bufs[next++ & 3];
  snprintf(p, 512, "%s/%s", tmpdir, name);
  return p;
}

static uint8_t *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  uint8_t *buf;
  long n;
  cr_assert_not_null(f, "open %s", path);
  fseek(f, 0, SEEK_END);
  n = ftell(f);
  fseek(f, 0, SEEK_SET);
  buf = malloc((size_t)n + 1);
  cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  *len = (size_t)n;
  return buf;
}

static void spit(const char *path, const void *buf, size_t len) {
  FILE *f = fopen(path, "wb");
  cr_assert_not_null(f);
  cr_assert_eq(fwrite(buf, 1, len, f), len);
  cr_assert_eq(fclose(f), 0);
}

static uint8_t content(size_t rec, size_t i) {
  return (uint8_t)(rec * 31 + i * 7 + (i >> 9));
}

/* Writes records of the given sizes with content(k, i). */
static void write_records(const char *path, ferry_compression_t c,
                          const size_t *sizes, size_t n) {
  ferry_tfr_writer_t *w;
  ferry_error_t err;
  size_t max = 0;
  uint8_t *buf;
  for (size_t k = 0; k < n; k++)
    max = sizes[k] > max ? sizes[k] : max;
  buf = malloc(max + 1);
  cr_assert_eq(ferry__tfr_writer_open(path, c, &w, &err), 0, "%s", err.msg);
  for (size_t k = 0; k < n; k++) {
    for (size_t i = 0; i < sizes[k]; i++)
      buf[i] = content(k, i);
    cr_assert_eq(ferry__tfr_writer_write(w, buf, sizes[k], &err), 0, "%s",
                 err.msg);
  }
  cr_assert_eq(ferry__tfr_writer_close(w, &err), 0, "%s", err.msg);
  free(buf);
}

static void check_content(const ferry_record_t *rec, size_t k, size_t size) {
  cr_assert_eq(rec->len, size, "record %zu: len %zu, want %zu", k, rec->len,
               size);
  for (size_t i = 0; i < size; i++)
    if (rec->data[i] != content(k, i))
      cr_assert_fail("record %zu byte %zu differs", k, i);
}

static ferry_tfr_options_t opts_with(ferry_compression_t c,
                                     ferry_error_policy_t pol) {
  ferry_tfr_options_t o;
  ferry__tfr_options_init(&o);
  o.compression = c;
  o.on_error = pol;
  return o;
}

/* Compresses a buffer into a gzip (windowBits 31) or zlib (15) stream. */
static uint8_t *zcompress(const uint8_t *in, size_t len, int bits,
                          size_t *out_len) {
  z_stream zs;
  uint8_t *out;
  memset(&zs, 0, sizeof(zs));
  cr_assert_eq(deflateInit2(&zs, 6, Z_DEFLATED, bits, 8, Z_DEFAULT_STRATEGY),
               Z_OK);
  size_t cap = deflateBound(&zs, len) + 64;
  out = malloc(cap);
  zs.next_in = (Bytef *)in;
  zs.avail_in = (uInt)len;
  zs.next_out = out;
  zs.avail_out = (uInt)cap;
  cr_assert_eq(deflate(&zs, Z_FINISH), Z_STREAM_END);
  *out_len = cap - zs.avail_out;
  deflateEnd(&zs);
  return out;
}

static int64_t live_bytes(void) {
  ferry_alloc_stats_t s;
  ferry__alloc_stats(&s);
  return s.bytes;
}

/* Framing vectors from OPS.md. */

static const uint8_t empty_rec[] = {0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                                    0x00, 0x00, 0x29, 0x03, 0x98, 0x07,
                                    0xd8, 0xea, 0x82, 0xa2};
static const uint8_t hello_rec[] = {0x05, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                                    0x00, 0xea, 0xb2, 0x04, 0x3e, 'h',  'e',
                                    'l',  'l',  'o',  0xbb, 0x1f, 0x1c, 0x19};

Test(tfrecord, frame_vectors) {
  uint8_t h[12], f[4];
  ferry__tfr_frame_header(0, h);
  ferry__tfr_frame_footer("", 0, f);
  cr_assert_arr_eq(h, empty_rec, 12);
  cr_assert_arr_eq(f, empty_rec + 12, 4);
  ferry__tfr_frame_header(5, h);
  ferry__tfr_frame_footer("hello", 5, f);
  cr_assert_arr_eq(h, hello_rec, 12);
  cr_assert_arr_eq(f, hello_rec + 17, 4);
}

Test(tfrecord, writer_bytes_match_vectors, .init = make_tmpdir,
     .fini = remove_tmpdir) {
  ferry_tfr_writer_t *w;
  ferry_error_t err;
  uint8_t want[sizeof(empty_rec) + sizeof(hello_rec)];
  size_t len;
  uint8_t *got;

  cr_assert_eq(ferry__tfr_writer_open(tpath("v.tfrecord"),
                                      FERRY_COMPRESSION_NONE, &w, &err),
               0);
  cr_assert_eq(ferry__tfr_writer_write(w, "", 0, &err), 0);
  cr_assert_eq(ferry__tfr_writer_write(w, "hello", 5, &err), 0);
  cr_assert_eq(ferry__tfr_writer_close(w, &err), 0);
  memcpy(want, empty_rec, sizeof(empty_rec));
  memcpy(want + sizeof(empty_rec), hello_rec, sizeof(hello_rec));
  got = slurp(tpath("v.tfrecord"), &len);
  cr_assert_eq(len, sizeof(want));
  cr_assert_arr_eq(got, want, sizeof(want));
  free(got);
}

Test(tfrecord, writer_rejects_auto_and_bad_path) {
  ferry_tfr_writer_t *w;
  ferry_error_t err;
  cr_assert_eq(
      ferry__tfr_writer_open("/tmp/x", FERRY_COMPRESSION_AUTO, &w, &err),
      FERRY_EINVAL);
  cr_assert_eq(ferry__tfr_writer_open("/nonexistent-dir/x.tfrecord",
                                      FERRY_COMPRESSION_NONE, &w, &err),
               FERRY_ENOENT);
  cr_assert(strstr(err.msg, "/nonexistent-dir/x.tfrecord") != NULL);
}

Test(tfrecord, compression_names) {
  cr_assert_eq(ferry__compression_parse("none"), FERRY_COMPRESSION_NONE);
  cr_assert_eq(ferry__compression_parse(""), FERRY_COMPRESSION_NONE);
  cr_assert_eq(ferry__compression_parse("gzip"), FERRY_COMPRESSION_GZIP);
  cr_assert_eq(ferry__compression_parse("GZIP"), FERRY_COMPRESSION_GZIP);
  cr_assert_eq(ferry__compression_parse("zlib"), FERRY_COMPRESSION_ZLIB);
  cr_assert_eq(ferry__compression_parse("auto"), FERRY_COMPRESSION_AUTO);
  cr_assert_eq(ferry__compression_parse("bzip2"), -1);
  cr_assert_eq(ferry__compression_parse(NULL), -1);
  cr_assert_str_eq(ferry__compression_name(FERRY_COMPRESSION_NONE), "none");
  cr_assert_str_eq(ferry__compression_name(FERRY_COMPRESSION_GZIP), "gzip");
  cr_assert_str_eq(ferry__compression_name(FERRY_COMPRESSION_ZLIB), "zlib");
  cr_assert_str_eq(ferry__compression_name(FERRY_COMPRESSION_AUTO), "auto");
}

/* Round trips. */

static const size_t rt_sizes[] = {0, 1, 1000, 1 << 20, 0, 1, 1000, 17};
#define RT_N (sizeof(rt_sizes) / sizeof(rt_sizes[0]))

static void round_trip(ferry_compression_t wc, ferry_compression_t rc) {
  ferry_tfr_options_t o = opts_with(rc, FERRY_ON_ERROR_FAIL);
  ferry_tfr_reader_t *r;
  ferry_tfr_stats_t st;
  ferry_record_t rec;
  ferry_error_t err;
  uint64_t off = 0, bytes = 0;
  int64_t before;

  write_records(tpath("rt.tfrecord"), wc, rt_sizes, RT_N);
  before = live_bytes();
  cr_assert_eq(ferry__tfr_reader_open(tpath("rt.tfrecord"), &o, &r, &err), 0,
               "%s", err.msg);
  cr_assert_eq(ferry__tfr_reader_compression(r), wc);
  for (size_t k = 0; k < RT_N; k++) {
    cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), 0, "%s", err.msg);
    check_content(&rec, k, rt_sizes[k]);
    cr_assert_eq(rec.offset, off);
    cr_assert_eq(rec.index, k);
    off += rt_sizes[k] + 16;
    bytes += rt_sizes[k];
  }
  cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), FERRY_EOF);
  cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), FERRY_EOF);
  ferry__tfr_reader_stats(r, &st);
  cr_assert_eq(st.records, RT_N);
  cr_assert_eq(st.bytes, bytes);
  cr_assert_eq(st.skipped, 0);
  ferry__tfr_reader_free(r);
  cr_assert_eq(live_bytes(), before, "leak: %" PRId64 " bytes",
               live_bytes() - before);
}

Test(tfrecord, round_trip_none, .init = make_tmpdir, .fini = remove_tmpdir) {
  round_trip(FERRY_COMPRESSION_NONE, FERRY_COMPRESSION_NONE);
  round_trip(FERRY_COMPRESSION_NONE, FERRY_COMPRESSION_AUTO);
}

Test(tfrecord, round_trip_gzip, .init = make_tmpdir, .fini = remove_tmpdir) {
  round_trip(FERRY_COMPRESSION_GZIP, FERRY_COMPRESSION_GZIP);
  round_trip(FERRY_COMPRESSION_GZIP, FERRY_COMPRESSION_AUTO);
}

Test(tfrecord, round_trip_zlib, .init = make_tmpdir, .fini = remove_tmpdir) {
  round_trip(FERRY_COMPRESSION_ZLIB, FERRY_COMPRESSION_ZLIB);
  round_trip(FERRY_COMPRESSION_ZLIB, FERRY_COMPRESSION_AUTO);
}

Test(tfrecord, empty_file_is_clean_eof, .init = make_tmpdir,
     .fini = remove_tmpdir) {
  ferry_tfr_reader_t *r;
  ferry_record_t rec;
  ferry_error_t err;
  spit(tpath("empty"), "", 0);
  cr_assert_eq(ferry__tfr_reader_open(tpath("empty"), NULL, &r, &err), 0);
  cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), FERRY_EOF);
  ferry__tfr_reader_free(r);
  cr_assert_eq(ferry__tfr_reader_open(tpath("missing"), NULL, &r, &err),
               FERRY_ENOENT);
  cr_assert(strstr(err.msg, "missing") != NULL);
}

/* Many small records through gzip: once the buffer has grown, reading
 * allocates nothing more. */
Test(tfrecord, compressed_steady_state_no_alloc, .init = make_tmpdir,
     .fini = remove_tmpdir) {
  enum { N = 20000 };
  static size_t sizes[N];
  ferry_tfr_options_t o = opts_with(FERRY_COMPRESSION_AUTO,
                                    FERRY_ON_ERROR_FAIL);
  ferry_tfr_reader_t *r;
  ferry_record_t rec;
  ferry_error_t err;
  ferry_alloc_stats_t a, b;

  for (size_t k = 0; k < N; k++)
    sizes[k] = 50 + k % 200;
  write_records(tpath("many.gz"), FERRY_COMPRESSION_GZIP, sizes, N);
  cr_assert_eq(ferry__tfr_reader_open(tpath("many.gz"), &o, &r, &err), 0);
  for (size_t k = 0; k < 100; k++)
    cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), 0);
  ferry__alloc_stats(&a);
  for (size_t k = 100; k < N; k++) {
    cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), 0, "%s", err.msg);
    if (k % 1000 == 0)
      check_content(&rec, k, sizes[k]);
  }
  ferry__alloc_stats(&b);
  cr_assert_eq(a.blocks, b.blocks);
  cr_assert_eq(a.bytes, b.bytes);
  cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), FERRY_EOF);
  ferry__tfr_reader_free(r);
}

/* Concatenated gzip members read as one stream. */
Test(tfrecord, gzip_multi_member, .init = make_tmpdir,
     .fini = remove_tmpdir) {
  size_t s1[] = {10, 20}, la, lb;
  ferry_tfr_reader_t *r;
  ferry_record_t rec;
  ferry_error_t err;
  write_records(tpath("a.gz"), FERRY_COMPRESSION_GZIP, s1, 2);
  uint8_t *a = slurp(tpath("a.gz"), &la);
  uint8_t *b = malloc(2 * la);
  memcpy(b, a, la);
  memcpy(b + la, a, la);
  cr_assert_eq(ferry__tfr_reader_open_mem(b, 2 * la, "two.gz", NULL, &r, &err),
               0);
  for (int k = 0; k < 4; k++) {
    cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), 0, "%s", err.msg);
    check_content(&rec, (size_t)k % 2, s1[k % 2]);
    cr_assert_eq(rec.index, (uint64_t)k);
  }
  cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), FERRY_EOF);
  ferry__tfr_reader_free(r);
  (void)lb;
  free(a);
  free(b);
}

/* An uncompressed file whose first length bytes look like a gzip magic
 * (0x8b1f = 35615) or a zlib header (78 9c: 0x9c78 = 40056) is still
 * read as uncompressed under AUTO. */
Test(tfrecord, auto_detect_not_fooled_by_lengths, .init = make_tmpdir,
     .fini = remove_tmpdir) {
  size_t lens[] = {0x8b1f, 0x9c78};
  for (int i = 0; i < 2; i++) {
    ferry_tfr_reader_t *r;
    ferry_record_t rec;
    ferry_error_t err;
    write_records(tpath("tricky"), FERRY_COMPRESSION_NONE, &lens[i], 1);
    cr_assert_eq(ferry__tfr_reader_open(tpath("tricky"), NULL, &r, &err), 0);
    cr_assert_eq(ferry__tfr_reader_compression(r), FERRY_COMPRESSION_NONE);
    cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), 0, "%s", err.msg);
    check_content(&rec, 0, lens[i]);
    ferry__tfr_reader_free(r);
    /* The sniff every caller uses (the scan, ferryctl) agrees. */
    cr_assert_eq(ferry__tfr_sniff_file(tpath("tricky"), &err),
                 FERRY_COMPRESSION_NONE, "%s", err.msg);
  }
}

/* The one header check and the one compression sniff on raw bytes. */
Test(tfrecord, header_check_and_sniff) {
  uint64_t len = 0;
  cr_assert(ferry__tfr_header_check(hello_rec, &len));
  cr_assert_eq(len, 5);
  cr_assert(ferry__tfr_header_check(empty_rec, NULL));
  uint8_t bad[12];
  memcpy(bad, hello_rec, 12);
  bad[8] ^= 1;
  cr_assert_not(ferry__tfr_header_check(bad, &len));
  cr_assert_eq(ferry__tfr_sniff(hello_rec, sizeof(hello_rec)),
               FERRY_COMPRESSION_NONE);
  static const uint8_t gz[] = {0x1f, 0x8b, 0x08, 0, 0, 0, 0, 0, 0, 3, 0, 0};
  static const uint8_t zl[] = {0x78, 0x9c, 0, 0};
  static const uint8_t zl_dict[] = {0x78, 0xbb}; /* FDICT set */
  cr_assert_eq(ferry__tfr_sniff(gz, sizeof(gz)), FERRY_COMPRESSION_GZIP);
  cr_assert_eq(ferry__tfr_sniff(gz, 2), FERRY_COMPRESSION_GZIP);
  cr_assert_eq(ferry__tfr_sniff(gz, 1), FERRY_COMPRESSION_NONE);
  cr_assert_eq(ferry__tfr_sniff(zl, sizeof(zl)), FERRY_COMPRESSION_ZLIB);
  cr_assert_eq(ferry__tfr_sniff(zl_dict, 2), FERRY_COMPRESSION_NONE);
  cr_assert_eq(ferry__tfr_sniff(NULL, 0), FERRY_COMPRESSION_NONE);
  ferry_error_t err;
  ferry_error_clear(&err);
  cr_assert_eq(ferry__tfr_sniff_file("/nonexistent/ferry.tfrecord", &err),
               FERRY_ENOENT);
  cr_assert(strstr(err.msg, "/nonexistent/ferry.tfrecord") != NULL);
}

/* Every allocation failing in turn, while writing and while reading a
 * gzip file: each run ends in success or FERRY_ENOMEM, and leaks
 * nothing. */
Test(tfrecord, allocation_failures, .init = make_tmpdir,
     .fini = remove_tmpdir) {
  size_t sizes[] = {10, 70000, 5, 200000};
  int ok_write = 0, ok_read = 0;
  write_records(tpath("af.gz"), FERRY_COMPRESSION_GZIP, sizes, 4);
  for (int64_t n = 0; n < 40; n++) {
    ferry_tfr_writer_t *w;
    ferry_tfr_reader_t *r;
    ferry_record_t rec;
    ferry_error_t err;
    int64_t before = live_bytes();
    int rc;

    ferry__alloc_fail_after(n);
    rc = ferry__tfr_writer_open(tpath("afw.gz"), FERRY_COMPRESSION_GZIP, &w,
                                &err);
    if (rc == 0) {
      rc = ferry__tfr_writer_write(w, "abc", 3, &err);
      cr_assert_eq(rc, 0);
      rc = ferry__tfr_writer_close(w, &err);
      ok_write += rc == 0;
    }
    cr_assert(rc == 0 || rc == FERRY_ENOMEM, "%d", rc);
    cr_assert_eq(live_bytes(), before);

    ferry__alloc_fail_after(n);
    rc = ferry__tfr_reader_open(tpath("af.gz"), NULL, &r, &err);
    if (rc == 0) {
      while ((rc = ferry__tfr_reader_next(r, &rec, &err)) == 0)
        ;
      cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), rc);
      ferry__tfr_reader_free(r);
      ok_read += rc == FERRY_EOF;
    }
    ferry__alloc_fail_reset();
    cr_assert(rc == FERRY_EOF || rc == FERRY_ENOMEM, "n %" PRId64 ": %d %s",
              n, rc, err.msg);
    cr_assert_eq(live_bytes(), before);
  }
  cr_assert(ok_write > 0 && ok_read > 0);
}

/* Index and record ranges. */

static const size_t idx_sizes[] = {5,   0,  300, 77, 1000, 3,  64, 65,
                                   128, 9,  500, 1,  2,    40, 0,  4096,
                                   33,  33, 700, 11};
#define IDX_N (sizeof(idx_sizes) / sizeof(idx_sizes[0]))

Test(tfrecord, index_build_write_read, .init = make_tmpdir,
     .fini = remove_tmpdir) {
  ferry_tfr_index_entry_t *ix, *back;
  size_t n, nb;
  ferry_error_t err;
  uint64_t off = 0;
  int64_t before;

  write_records(tpath("ix.tfrecord"), FERRY_COMPRESSION_NONE, idx_sizes,
                IDX_N);
  before = live_bytes();
  cr_assert_eq(ferry__tfr_index_build(tpath("ix.tfrecord"), &ix, &n, &err), 0,
               "%s", err.msg);
  cr_assert_eq(n, IDX_N);
  for (size_t k = 0; k < n; k++) {
    cr_assert_eq(ix[k].offset, off);
    cr_assert_eq(ix[k].size, idx_sizes[k] + 16);
    off += idx_sizes[k] + 16;
  }
  cr_assert_eq(ferry__tfr_index_write(tpath("ix.idx"), ix, n, &err), 0);
  size_t tl;
  char *text = (char *)slurp(tpath("ix.idx"), &tl);
  text[tl] = '\0';
  cr_assert(strncmp(text, "0 21\n21 16\n37 316\n", 18) == 0, "%s", text);
  free(text);
  cr_assert_eq(ferry__tfr_index_read(tpath("ix.idx"), &back, &nb, &err), 0);
  cr_assert_eq(nb, n);
  cr_assert_arr_eq(back, ix, n * sizeof(*ix));
  ferry_free(back);
  ferry_free(ix);
  cr_assert_eq(live_bytes(), before);
}

static void read_range(const char *path, ferry_compression_t c,
                       const ferry_tfr_index_entry_t *ix, size_t k,
                       size_t m) {
  ferry_tfr_options_t o = opts_with(c, FERRY_ON_ERROR_FAIL);
  ferry_tfr_reader_t *r;
  ferry_record_t rec;
  ferry_error_t err;
  o.start_offset = ix[k].offset;
  o.start_index = k;
  o.max_records = m;
  cr_assert_eq(ferry__tfr_reader_open(path, &o, &r, &err), 0, "%s", err.msg);
  for (size_t j = k; j < k + m && j < IDX_N; j++) {
    cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), 0, "%s", err.msg);
    cr_assert_eq(rec.index, j);
    cr_assert_eq(rec.offset, ix[j].offset);
    check_content(&rec, j, idx_sizes[j]);
  }
  cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), FERRY_EOF,
               "range %zu+%zu", k, m);
  ferry__tfr_reader_free(r);
}

Test(tfrecord, record_ranges_via_index, .init = make_tmpdir,
     .fini = remove_tmpdir) {
  ferry_tfr_index_entry_t *ix;
  size_t n;
  ferry_error_t err;
  write_records(tpath("r.tfrecord"), FERRY_COMPRESSION_NONE, idx_sizes,
                IDX_N);
  write_records(tpath("r.gz"), FERRY_COMPRESSION_GZIP, idx_sizes, IDX_N);
  cr_assert_eq(ferry__tfr_index_build(tpath("r.tfrecord"), &ix, &n, &err), 0);
  for (size_t k = 0; k < IDX_N; k += 3) {
    for (size_t m = 1; m < 6; m += 2) {
      read_range(tpath("r.tfrecord"), FERRY_COMPRESSION_AUTO, ix, k, m);
      /* Compressed: the offset is in the uncompressed stream. */
      read_range(tpath("r.gz"), FERRY_COMPRESSION_AUTO, ix, k, m);
    }
  }
  /* The last record alone, and a range running off the end. */
  read_range(tpath("r.tfrecord"), FERRY_COMPRESSION_NONE, ix, IDX_N - 1, 1);
  read_range(tpath("r.tfrecord"), FERRY_COMPRESSION_NONE, ix, IDX_N - 2, 9);
  ferry_free(ix);
}

Test(tfrecord, start_offset_past_end, .init = make_tmpdir,
     .fini = remove_tmpdir) {
  size_t s[] = {10};
  ferry_tfr_options_t o = opts_with(FERRY_COMPRESSION_AUTO,
                                    FERRY_ON_ERROR_FAIL);
  ferry_tfr_reader_t *r;
  ferry_record_t rec;
  ferry_error_t err;
  write_records(tpath("s"), FERRY_COMPRESSION_NONE, s, 1);
  write_records(tpath("s.gz"), FERRY_COMPRESSION_GZIP, s, 1);
  o.start_offset = 27;
  cr_assert_eq(ferry__tfr_reader_open(tpath("s"), &o, &r, &err), FERRY_EINVAL);
  cr_assert(strstr(err.msg, "start offset 27 is past the end") != NULL, "%s",
            err.msg);
  cr_assert_null(r);
  cr_assert_eq(ferry__tfr_reader_open(tpath("s.gz"), &o, &r, &err), 0);
  cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), FERRY_EINVAL);
  ferry__tfr_reader_free(r);
  o.start_offset = 26; /* exactly the end: no records */
  cr_assert_eq(ferry__tfr_reader_open(tpath("s.gz"), &o, &r, &err), 0);
  cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), FERRY_EOF);
  ferry__tfr_reader_free(r);
}

Test(tfrecord, invalid_options) {
  ferry_tfr_options_t o = opts_with(FERRY_COMPRESSION_AUTO,
                                    FERRY_ON_ERROR_FAIL);
  ferry_tfr_reader_t *r;
  ferry_error_t err;
  int64_t before = live_bytes();
  o.compression = (ferry_compression_t)7;
  cr_assert_eq(ferry__tfr_reader_open_mem("", 0, "m", &o, &r, &err),
               FERRY_EINVAL);
  cr_assert(strstr(err.msg, "m: unknown compression 7") != NULL);
  o.compression = FERRY_COMPRESSION_GZIP;
  o.on_error = (ferry_error_policy_t)5;
  cr_assert_eq(ferry__tfr_reader_open_mem("", 0, "m", &o, &r, &err),
               FERRY_EINVAL);
  cr_assert_eq(live_bytes(), before);
}

Test(tfrecord, index_of_compressed_is_enotsup, .init = make_tmpdir,
     .fini = remove_tmpdir) {
  size_t s[] = {10, 20};
  ferry_tfr_index_entry_t *ix;
  size_t n;
  ferry_error_t err;
  write_records(tpath("c.gz"), FERRY_COMPRESSION_GZIP, s, 2);
  cr_assert_eq(ferry__tfr_index_build(tpath("c.gz"), &ix, &n, &err),
               FERRY_ENOTSUP);
  cr_assert(strstr(err.msg, "c.gz") != NULL);
  cr_assert_null(ix);
}

Test(tfrecord, index_read_malformed, .init = make_tmpdir,
     .fini = remove_tmpdir) {
  static const char *bad[] = {
      "0 21\n21 16\n37x 316\n", "0 21\n21 16\n37\n",
      "0 21\n21 16\n37 316 5\n", "0 21\n\n37 316\n",
      "0 21\n21 16\n-1 316\n", "0 21\n21 16\n37 99999999999999999999\n",
      "0 21\n21 16\n37 15\n"};
  ferry_tfr_index_entry_t *ix;
  size_t n;
  ferry_error_t err;
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    int want_line = strstr(bad[i], "\n\n") != NULL ? 2 : 3;
    char want[32];
    spit(tpath("bad.idx"), bad[i], strlen(bad[i]));
    cr_assert_eq(ferry__tfr_index_read(tpath("bad.idx"), &ix, &n, &err),
                 FERRY_EINDEX, "case %zu", i);
    cr_assert(strstr(err.msg, "bad.idx") != NULL, "%s", err.msg);
    snprintf(want, sizeof(want), "line %d:", want_line);
    cr_assert(strstr(err.msg, want) != NULL, "case %zu: %s", i, err.msg);
    cr_assert_null(ix);
  }
  /* No trailing newline, CRLF and spacing are accepted. */
  spit(tpath("ok.idx"), "0 21\r\n21  16\n37 316", 19);
  cr_assert_eq(ferry__tfr_index_read(tpath("ok.idx"), &ix, &n, &err), 0, "%s",
               err.msg);
  cr_assert_eq(n, 3);
  cr_assert_eq(ix[2].offset, 37);
  cr_assert_eq(ix[2].size, 316);
  ferry_free(ix);
}

/* Bad input: five records of 100 bytes, 116 bytes each framed, so record
 * k starts at 116 k. */

#define BAD_N 5
#define BAD_SZ 100
#define BAD_REC (BAD_SZ + 16)

static uint8_t *good_file(size_t *len) {
  size_t sizes[BAD_N];
  for (int k = 0; k < BAD_N; k++)
    sizes[k] = BAD_SZ;
  write_records(tpath("good.tfrecord"), FERRY_COMPRESSION_NONE, sizes, BAD_N);
  return slurp(tpath("good.tfrecord"), len);
}

/* Reads `path` under FAIL and expects records before `bad_k` to be good,
 * then `code` with the file name and "byte offset <off>:" in the message,
 * twice (sticky). */
static void expect_fail(const char *path, ferry_compression_t c, int bad_k,
                        int code, uint64_t off, uint64_t max_len) {
  ferry_tfr_options_t o = opts_with(c, FERRY_ON_ERROR_FAIL);
  ferry_tfr_reader_t *r;
  ferry_record_t rec;
  ferry_error_t err, err2;
  char want[64];
  const char *base = strrchr(path, '/') + 1;
  int64_t before = live_bytes();

  o.max_record_len = max_len;
  cr_assert_eq(ferry__tfr_reader_open(path, &o, &r, &err), 0, "%s", err.msg);
  for (int k = 0; k < bad_k; k++)
    cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), 0, "%d: %s", k,
                 err.msg);
  cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), code, "got %s: %s",
               ferry_err_name(err.code), err.msg);
  cr_assert_eq(err.code, code);
  cr_assert(strstr(err.msg, base) != NULL, "%s", err.msg);
  snprintf(want, sizeof(want), "byte offset %" PRIu64 ":", off);
  cr_assert(strstr(err.msg, want) != NULL, "want '%s' in: %s", want,
            err.msg);
  cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err2), code);
  cr_assert_str_eq(err2.msg, err.msg);
  ferry__tfr_reader_free(r);
  cr_assert_eq(live_bytes(), before);
}

/* Reads under SKIP and expects exactly the records numbered in `want`
 * (content(k) of BAD_SZ bytes), `skipped` skips, last_bad.code `code`. */
static void expect_skip(const char *path, ferry_compression_t c,
                        const int *want, int nwant, int skipped, int code,
                        uint64_t max_len) {
  ferry_tfr_options_t o = opts_with(c, FERRY_ON_ERROR_SKIP);
  ferry_tfr_reader_t *r;
  ferry_tfr_stats_t st;
  ferry_record_t rec;
  ferry_error_t err;
  o.max_record_len = max_len;
  cr_assert_eq(ferry__tfr_reader_open(path, &o, &r, &err), 0, "%s", err.msg);
  for (int i = 0; i < nwant; i++) {
    cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), 0, "%d: %s", i,
                 err.msg);
    cr_assert_eq(rec.offset, (uint64_t)want[i] * BAD_REC);
    check_content(&rec, (size_t)want[i], rec.len);
  }
  cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), FERRY_EOF);
  ferry__tfr_reader_stats(r, &st);
  cr_assert_eq(st.records, (uint64_t)nwant);
  cr_assert_eq(st.skipped, (uint64_t)skipped);
  cr_assert_eq(st.last_bad.code, code);
  cr_assert(strstr(st.last_bad.msg, strrchr(path, '/') + 1) != NULL);
  ferry__tfr_reader_free(r);
}

/* Writes the corrupted stream plain, and gzip- and zlib-compressed. */
static void spit3(const char *name, const uint8_t *buf, size_t len) {
  char n2[128];
  size_t zl;
  uint8_t *z;
  spit(tpath(name), buf, len);
  snprintf(n2, sizeof(n2), "%s.gz", name);
  z = zcompress(buf, len, 31, &zl);
  spit(tpath(n2), z, zl);
  free(z);
  snprintf(n2, sizeof(n2), "%s.zz", name);
  z = zcompress(buf, len, 15, &zl);
  spit(tpath(n2), z, zl);
  free(z);
}

static void both_policies(const char *name, int bad_k, int code,
                          uint64_t off, const int *want, int nwant,
                          int skipped) {
  static const char *sfx[] = {"", ".gz", ".zz"};
  for (int i = 0; i < 3; i++) {
    char n2[128];
    snprintf(n2, sizeof(n2), "%s%s", name, sfx[i]);
    expect_fail(tpath(n2), FERRY_COMPRESSION_AUTO, bad_k, code, off,
                FERRY_TFR_DEFAULT_MAX_RECORD);
    expect_skip(tpath(n2), FERRY_COMPRESSION_AUTO, want, nwant, skipped, code,
                FERRY_TFR_DEFAULT_MAX_RECORD);
  }
}

Test(tfrecord, bad_length_crc, .init = make_tmpdir, .fini = remove_tmpdir) {
  size_t len;
  uint8_t *b = good_file(&len);
  const int want[] = {0, 1, 3, 4};
  b[2 * BAD_REC + 9] ^= 0x40;
  spit3("lencrc.tfrecord", b, len);
  both_policies("lencrc.tfrecord", 2, FERRY_ELENCRC, 2 * BAD_REC, want, 4, 1);
  free(b);
}

Test(tfrecord, bad_length_field, .init = make_tmpdir, .fini = remove_tmpdir) {
  size_t len;
  uint8_t *b = good_file(&len);
  const int want[] = {1, 2, 3, 4};
  b[0] = 0x65; /* length 101 against the stored CRC of 100 */
  spit3("lenfield.tfrecord", b, len);
  both_policies("lenfield.tfrecord", 0, FERRY_ELENCRC, 0, want, 4, 1);
  free(b);
}

Test(tfrecord, bad_data_crc, .init = make_tmpdir, .fini = remove_tmpdir) {
  size_t len;
  uint8_t *b = good_file(&len);
  const int want[] = {0, 1, 2, 4};
  b[3 * BAD_REC + 12 + BAD_SZ + 1] ^= 0x01;
  spit3("datacrc.tfrecord", b, len);
  both_policies("datacrc.tfrecord", 3, FERRY_EDATACRC, 3 * BAD_REC, want, 4,
                1);
  free(b);
}

Test(tfrecord, bad_data_byte, .init = make_tmpdir, .fini = remove_tmpdir) {
  size_t len;
  uint8_t *b = good_file(&len);
  const int want[] = {0, 2, 3, 4};
  ferry_tfr_options_t o = opts_with(FERRY_COMPRESSION_AUTO,
                                    FERRY_ON_ERROR_FAIL);
  ferry_tfr_reader_t *r;
  ferry_record_t rec;
  ferry_error_t err;
  b[1 * BAD_REC + 12 + 50] ^= 0x80;
  spit3("data.tfrecord", b, len);
  both_policies("data.tfrecord", 1, FERRY_EDATACRC, BAD_REC, want, 4, 1);
  /* By default the message quotes nothing read from the file... */
  cr_assert_eq(ferry__tfr_reader_open(tpath("data.tfrecord"), &o, &r, &err), 0);
  cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), 0);
  cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), FERRY_EDATACRC);
  cr_assert(strstr(err.msg, "data.tfrecord: record 1 at byte offset 116: "
                            "record data CRC mismatch") != NULL,
            "%s", err.msg);
  cr_assert(strstr(err.msg, "0x") == NULL, "%s", err.msg);
  ferry__tfr_reader_free(r);
  /* ... and for the file's owner (ferryctl) it gives both CRCs. */
  o.file_bytes_in_errors = true;
  cr_assert_eq(ferry__tfr_reader_open(tpath("data.tfrecord"), &o, &r, &err), 0);
  cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), 0);
  cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), FERRY_EDATACRC);
  cr_assert(strstr(err.msg, "data.tfrecord: record 1 at byte offset 116: "
                            "record data CRC mismatch (stored 0x") != NULL,
            "%s", err.msg);
  cr_assert(strstr(err.msg, ", computed 0x") != NULL, "%s", err.msg);
  ferry__tfr_reader_free(r);
  o.file_bytes_in_errors = false;
  /* With verification off the record comes back as it is. */
  o.verify_crc = false;
  cr_assert_eq(ferry__tfr_reader_open(tpath("data.tfrecord"), &o, &r, &err), 0);
  for (int k = 0; k < BAD_N; k++)
    cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), 0);
  cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), FERRY_EOF);
  ferry__tfr_reader_free(r);
  free(b);
}

Test(tfrecord, truncated_header, .init = make_tmpdir, .fini = remove_tmpdir) {
  size_t len;
  uint8_t *b = good_file(&len);
  const int want[] = {0, 1, 2};
  spit3("trunclen.tfrecord", b, 3 * BAD_REC + 5);
  both_policies("trunclen.tfrecord", 3, FERRY_ETRUNCLEN, 3 * BAD_REC, want, 3,
                1);
  free(b);
}

Test(tfrecord, truncated_data, .init = make_tmpdir, .fini = remove_tmpdir) {
  size_t len;
  uint8_t *b = good_file(&len);
  const int want[] = {0, 1, 2};
  spit3("truncdata.tfrecord", b, 3 * BAD_REC + 12 + 50);
  both_policies("truncdata.tfrecord", 3, FERRY_ETRUNCDATA, 3 * BAD_REC, want,
                3, 1);
  /* Inside the footer. */
  spit3("truncfoot.tfrecord", b, 4 * BAD_REC - 2);
  both_policies("truncfoot.tfrecord", 3, FERRY_ETRUNCDATA, 3 * BAD_REC, want,
                3, 1);
  free(b);
}

Test(tfrecord, length_over_max, .init = make_tmpdir, .fini = remove_tmpdir) {
  size_t len;
  uint8_t *b = good_file(&len);
  const int want[] = {0, 1, 3, 4};
  uint8_t h[12];
  static const char *sfx[] = {"", ".gz", ".zz"};

  /* Record 2 claims 2^40 bytes, with a valid length CRC. */
  ferry__tfr_frame_header(1ull << 40, h);
  memcpy(b + 2 * BAD_REC, h, 12);
  spit3("toolong.tfrecord", b, len);
  both_policies("toolong.tfrecord", 2, FERRY_ETOOLONG, 2 * BAD_REC, want, 4,
                1);
  free(b);

  /* A small maximum against honest records: 10, 10, 100, 10 bytes. */
  size_t sizes[] = {10, 10, BAD_SZ, 10};
  write_records(tpath("small.tfrecord"), FERRY_COMPRESSION_NONE, sizes, 4);
  b = slurp(tpath("small.tfrecord"), &len);
  spit3("small.tfrecord", b, len);
  for (int i = 0; i < 3; i++) {
    char n2[64];
    ferry_tfr_options_t o = opts_with(FERRY_COMPRESSION_AUTO,
                                      FERRY_ON_ERROR_SKIP);
    ferry_tfr_reader_t *r;
    ferry_record_t rec;
    ferry_error_t err;
    ferry_tfr_stats_t st;
    snprintf(n2, sizeof(n2), "small.tfrecord%s", sfx[i]);
    expect_fail(tpath(n2), FERRY_COMPRESSION_AUTO, 2, FERRY_ETOOLONG, 52, 50);
    o.max_record_len = 50;
    cr_assert_eq(ferry__tfr_reader_open(tpath(n2), &o, &r, &err), 0);
    cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), 0);
    cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), 0);
    cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), 0);
    cr_assert_eq(rec.offset, 52 + 116);
    check_content(&rec, 3, 10);
    cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), FERRY_EOF);
    ferry__tfr_reader_stats(r, &st);
    cr_assert_eq(st.skipped, 1);
    cr_assert(strstr(st.last_bad.msg, "is over the maximum 50") != NULL);
    ferry__tfr_reader_free(r);
  }
  free(b);
}

Test(tfrecord, garbage_compressed_streams, .init = make_tmpdir,
     .fini = remove_tmpdir) {
  static const uint8_t gz[] = {0x1f, 0x8b, 0x08, 0x00, 0, 0, 0, 0, 0, 0x03,
                               0xff, 0xee, 0xdd, 0xcc, 0x12, 0x34, 0x56};
  static const uint8_t zz[] = {0x78, 0x9c, 0xff, 0xff, 0xff, 0x00, 0x13};
  const struct {
    const char *name;
    const uint8_t *b;
    size_t n;
  } cases[] = {{"garbage.gz", gz, sizeof(gz)}, {"garbage.zz", zz, sizeof(zz)}};
  for (int i = 0; i < 2; i++) {
    ferry_tfr_reader_t *r;
    ferry_record_t rec;
    ferry_error_t err;
    ferry_tfr_stats_t st;
    int64_t before = live_bytes();
    spit(tpath(cases[i].name), cases[i].b, cases[i].n);
    expect_fail(tpath(cases[i].name), FERRY_COMPRESSION_AUTO, 0,
                FERRY_ECOMPRESS, 0, FERRY_TFR_DEFAULT_MAX_RECORD);
    ferry_tfr_options_t o = opts_with(FERRY_COMPRESSION_AUTO,
                                      FERRY_ON_ERROR_SKIP);
    cr_assert_eq(ferry__tfr_reader_open(tpath(cases[i].name), &o, &r, &err), 0);
    cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), FERRY_EOF);
    ferry__tfr_reader_stats(r, &st);
    cr_assert_eq(st.skipped, 1);
    cr_assert_eq(st.last_bad.code, FERRY_ECOMPRESS);
    ferry__tfr_reader_free(r);
    cr_assert_eq(live_bytes(), before);
  }
}

/* A gzip file missing its 8-byte trailer: every record is there, then
 * the stream ends early. */
Test(tfrecord, gzip_missing_trailer, .init = make_tmpdir,
     .fini = remove_tmpdir) {
  size_t sizes[] = {100, 200, 300}, len;
  uint8_t *b;
  write_records(tpath("t.gz"), FERRY_COMPRESSION_GZIP, sizes, 3);
  b = slurp(tpath("t.gz"), &len);
  spit(tpath("cut.gz"), b, len - 8);
  expect_fail(tpath("cut.gz"), FERRY_COMPRESSION_GZIP, 3, FERRY_ECOMPRESS,
              116 + 216 + 316, FERRY_TFR_DEFAULT_MAX_RECORD);
  /* Trailing garbage after the stream is reported, not ignored. */
  memcpy(b + len, "x", 1);
  spit(tpath("trail.gz"), b, len + 1);
  expect_fail(tpath("trail.gz"), FERRY_COMPRESSION_AUTO, 3, FERRY_ECOMPRESS,
              116 + 216 + 316, FERRY_TFR_DEFAULT_MAX_RECORD);
  free(b);
}

/* A header with a valid CRC claiming 200 MiB, in a small gzip stream:
 * within the maximum, so the reader must find the truncation without
 * allocating anything near 200 MiB. */
Test(tfrecord, huge_claim_in_small_stream, .init = make_tmpdir,
     .fini = remove_tmpdir) {
  uint8_t buf[12 + 1000];
  size_t zl;
  uint8_t *z;
  ferry_tfr_reader_t *r;
  ferry_record_t rec;
  ferry_error_t err;
  ferry__tfr_frame_header(200u << 20, buf);
  memset(buf + 12, 0x5a, 1000);
  z = zcompress(buf, sizeof(buf), 31, &zl);
  cr_assert_eq(ferry__tfr_reader_open_mem(z, zl, "claim.gz", NULL, &r, &err),
               0);
  cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), FERRY_ETRUNCDATA, "%s",
               err.msg);
  cr_assert(live_bytes() < (4 << 20), "%" PRId64 " bytes live", live_bytes());
  ferry__tfr_reader_free(r);
  free(z);
}

/* Conformance with files written by other software. */

#ifndef FERRY_TESTDATA_DIR
#define FERRY_TESTDATA_DIR "/nonexistent"
#endif

static const char *tdpath(const char *sub, const char *name) {
  static char bufs[2][1024];
  static int next;
  char *p = bufs[next++ & 1];
  snprintf(p, 1024, "%s/%s/%s", FERRY_TESTDATA_DIR, sub, name);
  return p;
}

static void need_testdata(void) {
  struct stat st;
  if (stat(tdpath("tfrecord", ""), &st) != 0) {
    printf("skipping: %s/tfrecord is absent\n", FERRY_TESTDATA_DIR);
    cr_skip_test("testdata folder %s/tfrecord is absent", FERRY_TESTDATA_DIR);
  }
}

static const struct {
  const char *name;
  ferry_compression_t compression;
  uint64_t records;
  uint64_t stream_bytes; /* uncompressed size; 0: the file size */
} conf[] = {
    {"nitishkiitk_test.tfrecord", FERRY_COMPRESSION_NONE, 10, 0},
    {"nitishkiitk_test_1.tfrecord", FERRY_COMPRESSION_NONE, 1, 0},
    {"shapes_test.record", FERRY_COMPRESSION_NONE, 169, 0},
    {"tfmodels_pets_examples.record", FERRY_COMPRESSION_NONE, 10, 0},
    {"fruit_classifier_test.tfrecords", FERRY_COMPRESSION_NONE, 10, 0},
    {"deepvariant_golden.training_examples.tfrecord.gz",
     FERRY_COMPRESSION_GZIP, 49, 6516187},
    {"deepvariant_customized_classes.golden.training_examples.tfrecord.gz",
     FERRY_COMPRESSION_GZIP, 19, 2527024},
    {"DERIVED_tfds_mnist-test.tfrecord-00000-of-00001.first1000",
     FERRY_COMPRESSION_NONE, 1000, 0},
    {"ptdata_example.tfrecord", FERRY_COMPRESSION_NONE, 4, 0},
    {"ptdata_sequence_example.tfrecord", FERRY_COMPRESSION_NONE, 4, 0},
    {"tfmodels_snapshot_serengeti_sequence_examples.record",
     FERRY_COMPRESSION_NONE, 1, 0},
    {"zzw922cn_test.tfrecords", FERRY_COMPRESSION_NONE, 1, 0},
    {"magenta_tfrecord_iterator_test.tfrecord", FERRY_COMPRESSION_NONE, 3, 0},
    {"jkh911208_test.tfrecords", FERRY_COMPRESSION_NONE, 946, 0},
    {"tfx_penguin_Split-eval_data_tfrecord-00000-of-00001.gz",
     FERRY_COMPRESSION_GZIP, 100, 15200},
    {"tfx_penguin_Split-train_data_tfrecord-00000-of-00001.gz",
     FERRY_COMPRESSION_GZIP, 234, 35568},
    {"tfx_tfjs_next_page_data.tfrecord.gz", FERRY_COMPRESSION_GZIP, 100,
     8500},
    {"tfx_taxi_unlabelled_data_tfrecord-00000-of-00012.gz",
     FERRY_COMPRESSION_GZIP, 205, 102656},
    {"deeplab_pascal_voc_seg_val-00000-of-00001.tfrecord",
     FERRY_COMPRESSION_NONE, 3, 0},
    {"coldrean_test.tfrecord", FERRY_COMPRESSION_NONE, 5, 0},
};

Test(tfrecord_conformance, record_counts_and_crcs) {
  need_testdata();
  for (size_t i = 0; i < sizeof(conf) / sizeof(conf[0]); i++) {
    const char *path = tdpath("tfrecord", conf[i].name);
    ferry_tfr_reader_t *r;
    ferry_record_t rec;
    ferry_error_t err;
    ferry_tfr_stats_t st;
    struct stat sb;
    uint64_t end = 0;
    int rc;
    cr_assert_eq(stat(path, &sb), 0, "%s missing", path);
    cr_assert_eq(ferry__tfr_reader_open(path, NULL, &r, &err), 0, "%s",
                 err.msg);
    cr_assert_eq(ferry__tfr_reader_compression(r), conf[i].compression, "%s",
                 conf[i].name);
    while ((rc = ferry__tfr_reader_next(r, &rec, &err)) == 0)
      end = rec.offset + rec.len + 16;
    cr_assert_eq(rc, FERRY_EOF, "%s: %s", conf[i].name, err.msg);
    ferry__tfr_reader_stats(r, &st);
    cr_assert_eq(st.records, conf[i].records, "%s: %" PRIu64 " records",
                 conf[i].name, st.records);
    cr_assert_eq(st.skipped, 0);
    cr_assert_eq(end, conf[i].stream_bytes != 0 ? conf[i].stream_bytes
                                                : (uint64_t)sb.st_size,
                 "%s: stream ends at %" PRIu64, conf[i].name, end);
    ferry__tfr_reader_free(r);
  }
}

Test(tfrecord_conformance, magenta_payloads) {
  static const char *want[] = {"hello world", "12345", "success"};
  static const uint64_t offs[] = {0, 27, 48};
  ferry_tfr_reader_t *r;
  ferry_record_t rec;
  ferry_error_t err;
  need_testdata();
  cr_assert_eq(ferry__tfr_reader_open(tdpath("tfrecord",
                                             "magenta_tfrecord_iterator_test."
                                             "tfrecord"),
                                      NULL, &r, &err),
               0);
  for (int k = 0; k < 3; k++) {
    cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), 0);
    cr_assert_eq(rec.len, strlen(want[k]));
    cr_assert(memcmp(rec.data, want[k], rec.len) == 0);
    cr_assert_eq(rec.offset, offs[k]);
  }
  cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), FERRY_EOF);
  ferry__tfr_reader_free(r);
}

/* DAMAGED_crlf_pets_examples.record: data CRC error for record 0 at
 * offset 0; with CRC checks off, record 0 reads and the header at 18446
 * fails its length CRC; under SKIP the reader resynchronises. */
Test(tfrecord_conformance, damaged_pets) {
  const char *path;
  ferry_tfr_options_t o = opts_with(FERRY_COMPRESSION_AUTO,
                                    FERRY_ON_ERROR_FAIL);
  ferry_tfr_reader_t *r;
  ferry_record_t rec;
  ferry_error_t err;
  ferry_tfr_stats_t st;
  need_testdata();
  path = tdpath("tfrecord", "DAMAGED_crlf_pets_examples.record");
  int64_t before = live_bytes();

  cr_assert_eq(ferry__tfr_reader_open(path, &o, &r, &err), 0);
  cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), FERRY_EDATACRC);
  cr_assert(strstr(err.msg, "DAMAGED_crlf_pets_examples.record: record 0 at "
                            "byte offset 0: ") != NULL,
            "%s", err.msg);
  ferry__tfr_reader_free(r);

  o.verify_crc = false;
  cr_assert_eq(ferry__tfr_reader_open(path, &o, &r, &err), 0);
  cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), 0);
  cr_assert_eq(rec.len, 18430);
  cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), FERRY_ELENCRC);
  cr_assert(strstr(err.msg, "byte offset 18446:") != NULL, "%s", err.msg);
  ferry__tfr_reader_free(r);

  /* Resync finds intact records again at the offsets the MANIFEST lists,
   * and only there. */
  o.verify_crc = true;
  o.on_error = FERRY_ON_ERROR_SKIP;
  cr_assert_eq(ferry__tfr_reader_open(path, &o, &r, &err), 0);
  uint64_t got[16];
  int n = 0, rc;
  while ((rc = ferry__tfr_reader_next(r, &rec, &err)) == 0 && n < 16)
    got[n++] = rec.offset;
  cr_assert_eq(rc, FERRY_EOF);
  static const uint64_t intact[] = {165555, 244384, 256429, 549719};
  cr_assert_eq(n, 4, "%d records", n);
  for (int i = 0; i < 4; i++)
    cr_assert_eq(got[i], intact[i]);
  ferry__tfr_reader_stats(r, &st);
  cr_assert(st.skipped >= 2);
  ferry__tfr_reader_free(r);
  cr_assert_eq(live_bytes(), before);
}

Test(tfrecord_conformance, damaged_serengeti_truncated) {
  const char *path;
  ferry_tfr_options_t o = opts_with(FERRY_COMPRESSION_AUTO,
                                    FERRY_ON_ERROR_FAIL);
  ferry_tfr_reader_t *r;
  ferry_record_t rec;
  ferry_error_t err;
  ferry_tfr_stats_t st;
  need_testdata();
  path = tdpath("tfrecord",
                "DAMAGED_crlf_snapshot_serengeti_sequence_examples.record");
  cr_assert_eq(ferry__tfr_reader_open(path, &o, &r, &err), 0);
  cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), FERRY_ETRUNCDATA);
  cr_assert(strstr(err.msg, "record 0 at byte offset 0:") != NULL, "%s",
            err.msg);
  ferry__tfr_reader_free(r);
  o.on_error = FERRY_ON_ERROR_SKIP;
  cr_assert_eq(ferry__tfr_reader_open(path, &o, &r, &err), 0);
  cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), FERRY_EOF);
  ferry__tfr_reader_stats(r, &st);
  cr_assert_eq(st.records, 0);
  cr_assert_eq(st.skipped, 1);
  cr_assert_eq(st.last_bad.code, FERRY_ETRUNCDATA);
  ferry__tfr_reader_free(r);
}

/* The TFDS JSON files beside the MNIST shard are not TFRecords. */
Test(tfrecord_conformance, json_is_not_tfrecord) {
  static const char *names[] = {"DERIVED_tfds_mnist.features.json",
                                "DERIVED_tfds_mnist.dataset_info.json"};
  need_testdata();
  for (int i = 0; i < 2; i++) {
    ferry_tfr_reader_t *r;
    ferry_record_t rec;
    ferry_error_t err;
    cr_assert_eq(
        ferry__tfr_reader_open(tdpath("tfrecord", names[i]), NULL, &r, &err),
        0);
    cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), FERRY_ELENCRC);
    cr_assert(strstr(err.msg, "byte offset 0:") != NULL);
    ferry__tfr_reader_free(r);
  }
}

/* Our index builder against the expected DALI indices. */
Test(tfrecord_conformance, dali_index_computed_by_us) {
  DIR *d;
  struct dirent *e;
  int checked = 0;
  need_testdata();
  d = opendir(tdpath("dali_index", "computed_by_us"));
  if (d == NULL)
    cr_skip_test("dali_index/computed_by_us is absent");
  make_tmpdir();
  while ((e = readdir(d)) != NULL) {
    size_t nl = strlen(e->d_name), n, nw, la, lb;
    char tfr[256];
    ferry_tfr_index_entry_t *got, *want;
    ferry_error_t err;
    if (nl < 5 || strcmp(e->d_name + nl - 4, ".idx") != 0)
      continue;
    snprintf(tfr, sizeof(tfr), "%.*s", (int)(nl - 4), e->d_name);
    cr_assert_eq(
        ferry__tfr_index_build(tdpath("tfrecord", tfr), &got, &n, &err), 0,
        "%s", err.msg);
    cr_assert_eq(
        ferry__tfr_index_read(tdpath("dali_index/computed_by_us", e->d_name),
                              &want, &nw, &err),
        0, "%s", err.msg);
    cr_assert_eq(n, nw, "%s", tfr);
    cr_assert_arr_eq(got, want, n * sizeof(*got), "%s", tfr);
    /* Byte for byte, as written. */
    cr_assert_eq(ferry__tfr_index_write(tpath("ours.idx"), got, n, &err), 0);
    uint8_t *a = slurp(tpath("ours.idx"), &la);
    uint8_t *b = slurp(tdpath("dali_index/computed_by_us", e->d_name), &lb);
    cr_assert_eq(la, lb, "%s", tfr);
    cr_assert_arr_eq(a, b, la, "%s", tfr);
    free(a);
    free(b);
    ferry_free(got);
    ferry_free(want);
    checked++;
  }
  closedir(d);
  remove_tmpdir();
  cr_assert_eq(checked, 6);
}

/* DALI_extra's own indices: their TFRecords are in Git LFS and absent, so
 * only the reader and the format's invariants are checked. */
Test(tfrecord_conformance, dali_extra_indices_parse) {
  static const struct {
    const char *name;
    size_t n;
    uint64_t total;
  } idx[] = {{"DALI_extra_db_tfrecord_train.idx", 47, 12078679},
             {"DALI_extra_test_db_images_train-tfrecord-480_train.idx", 135,
              14397831},
             {"DALI_extra_db_sequential_tfrecord_sequential.idx", 1000,
              52720}};
  need_testdata();
  printf("note: DALI_extra indices checked for format only: their TFRecords "
         "are not in the testdata\n");
  for (int i = 0; i < 3; i++) {
    ferry_tfr_index_entry_t *v;
    size_t n;
    ferry_error_t err;
    uint64_t off = 0;
    cr_assert_eq(
        ferry__tfr_index_read(tdpath("dali_index", idx[i].name), &v, &n, &err),
        0, "%s", err.msg);
    cr_assert_eq(n, idx[i].n);
    for (size_t k = 0; k < n; k++) {
      cr_assert_eq(v[k].offset, off);
      off += v[k].size;
    }
    cr_assert_eq(off, idx[i].total);
    ferry_free(v);
  }
}

/* on_skip reports every skipped record, consecutive ones included, with its
 * own code, byte offset and index (what `ferryctl records inspect` lists). */
typedef struct skips_s {
  int n;
  int code[8];
  uint64_t offset[8], index[8];
} skips_t;

static void note_skipped(const ferry_error_t *err, uint64_t offset,
                         uint64_t index, void *arg) {
  skips_t *s = arg;
  if (s->n < 8) {
    s->code[s->n] = err->code;
    s->offset[s->n] = offset;
    s->index[s->n] = index;
  }
  s->n++;
}

Test(tfrecord, on_skip_reports_each_bad_record, .init = make_tmpdir,
     .fini = remove_tmpdir) {
  size_t len;
  uint8_t *b = good_file(&len);
  skips_t s = {0};
  ferry_tfr_options_t o = opts_with(FERRY_COMPRESSION_AUTO,
                                    FERRY_ON_ERROR_SKIP);
  ferry_tfr_reader_t *r;
  ferry_record_t rec;
  ferry_error_t err;
  int good = 0;
  /* Records 1 and 2 have bad data CRCs, record 4 a bad length CRC. */
  b[1 * BAD_REC + 12 + BAD_SZ] ^= 0x01;
  b[2 * BAD_REC + 12 + BAD_SZ] ^= 0x01;
  b[4 * BAD_REC + 9] ^= 0x40;
  spit3("skips.tfrecord", b, len);
  o.on_skip = note_skipped;
  o.on_skip_arg = &s;
  cr_assert_eq(ferry__tfr_reader_open(tpath("skips.tfrecord.gz"), &o, &r, &err),
               0, "%s", err.msg);
  while (ferry__tfr_reader_next(r, &rec, &err) == 0)
    good++;
  ferry__tfr_reader_free(r);
  cr_assert_eq(good, 2);
  cr_assert_eq(s.n, 3);
  cr_assert_eq(s.code[0], FERRY_EDATACRC);
  cr_assert_eq(s.offset[0], 1 * BAD_REC);
  cr_assert_eq(s.index[0], 1);
  cr_assert_eq(s.code[1], FERRY_EDATACRC);
  cr_assert_eq(s.offset[1], 2 * BAD_REC);
  cr_assert_eq(s.index[1], 2);
  cr_assert_eq(s.code[2], FERRY_ELENCRC);
  cr_assert_eq(s.offset[2], 4 * BAD_REC);
  cr_assert_eq(s.index[2], 4);
  free(b);
}

/* A file truncated (or rewritten) between open and read: never SIGBUS
 * (the reader does not map files), an error naming the file, the byte
 * offset and the truncation under policy fail, the end of the file under
 * skip; the records before the cut read intact. */
static void read_until_cut(const char *name, ferry_compression_t c,
                           ferry_error_policy_t pol, off_t cut, size_t rec,
                           size_t nrec, size_t *good, int *code,
                           ferry_error_t *err, uint64_t *skipped) {
  ferry_tfr_options_t o = opts_with(c, pol);
  ferry_tfr_reader_t *r;
  ferry_record_t rc;
  ferry_tfr_stats_t st;
  int k;
  cr_assert_eq(ferry__tfr_reader_open(tpath(name), &o, &r, err), 0, "%s",
               err->msg);
  *good = 0;
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(ferry__tfr_reader_next(r, &rc, err), 0, "%s", err->msg);
    check_content(&rc, *good, rec);
    (*good)++;
  }
  cr_assert_eq(truncate(tpath(name), cut), 0);
  while ((k = ferry__tfr_reader_next(r, &rc, err)) == 0) {
    cr_assert_lt(*good, nrec, "%s: more records than written", name);
    check_content(&rc, *good, rec);
    (*good)++;
  }
  *code = k;
  ferry__tfr_reader_stats(r, &st);
  *skipped = st.skipped;
  ferry__tfr_reader_free(r);
}

Test(tfrecord, file_truncated_between_open_and_read, .init = make_tmpdir,
     .fini = remove_tmpdir) {
  enum { N = 300, REC = 4000, FRAMED = REC + 16 };
  size_t sizes[N], good;
  for (size_t i = 0; i < N; i++)
    sizes[i] = REC;
  ferry_error_t err;
  uint64_t skipped;
  int code;
  char want[128];

  /* Inside record 150's data: policy fail names file and offset. */
  write_records(tpath("cut.tfrecord"), FERRY_COMPRESSION_NONE, sizes, N);
  read_until_cut("cut.tfrecord", FERRY_COMPRESSION_NONE, FERRY_ON_ERROR_FAIL,
                 150 * FRAMED + 100, REC, N, &good, &code, &err, &skipped);
  cr_assert_eq(good, 150);
  cr_assert_eq(code, FERRY_ETRUNCDATA, "%d %s", code, err.msg);
  snprintf(want, sizeof(want), "record 150 at byte offset %d", 150 * FRAMED);
  cr_assert(strstr(err.msg, tpath("cut.tfrecord")) != NULL, "%s", err.msg);
  cr_assert(strstr(err.msg, want) != NULL, "%s", err.msg);
  cr_assert(strstr(err.msg, "truncated while being read") != NULL, "%s",
            err.msg);

  /* Exactly at a record boundary: still an error, not a clean end. */
  write_records(tpath("cut.tfrecord"), FERRY_COMPRESSION_NONE, sizes, N);
  read_until_cut("cut.tfrecord", FERRY_COMPRESSION_NONE, FERRY_ON_ERROR_FAIL,
                 200 * FRAMED, REC, N, &good, &code, &err, &skipped);
  cr_assert_eq(good, 200);
  cr_assert_eq(code, FERRY_ETRUNCLEN, "%d %s", code, err.msg);
  snprintf(want, sizeof(want), "byte offset %d", 200 * FRAMED);
  cr_assert(strstr(err.msg, want) != NULL, "%s", err.msg);

  /* Policy skip: the cut ends the file, counted once. */
  write_records(tpath("cut.tfrecord"), FERRY_COMPRESSION_NONE, sizes, N);
  read_until_cut("cut.tfrecord", FERRY_COMPRESSION_NONE, FERRY_ON_ERROR_SKIP,
                 150 * FRAMED + 100, REC, N, &good, &code, &err, &skipped);
  cr_assert_eq(good, 150);
  cr_assert_eq(code, FERRY_EOF);
  cr_assert_eq(skipped, 1);

  /* To zero bytes (the window had data left: those records still read
   * intact, then the error). */
  write_records(tpath("cut.tfrecord"), FERRY_COMPRESSION_NONE, sizes, N);
  read_until_cut("cut.tfrecord", FERRY_COMPRESSION_NONE, FERRY_ON_ERROR_FAIL,
                 0, REC, N, &good, &code, &err, &skipped);
  cr_assert_lt(good, N);
  cr_assert(code == FERRY_ETRUNCLEN || code == FERRY_ETRUNCDATA, "%d %s",
            code, err.msg);

  /* Compressed: the stream is cut; no crash, and an error naming the
   * file unless the reader had already read the whole (small) file. */
  write_records(tpath("cut.gz"), FERRY_COMPRESSION_GZIP, sizes, N);
  struct stat stz;
  cr_assert_eq(stat(tpath("cut.gz"), &stz), 0);
  read_until_cut("cut.gz", FERRY_COMPRESSION_AUTO, FERRY_ON_ERROR_FAIL,
                 stz.st_size / 2, REC, N, &good, &code, &err, &skipped);
  if (code != FERRY_EOF) {
    cr_assert(code == FERRY_ECOMPRESS || code == FERRY_ETRUNCDATA ||
                  code == FERRY_ETRUNCLEN,
              "%d %s", code, err.msg);
    cr_assert(strstr(err.msg, tpath("cut.gz")) != NULL, "%s", err.msg);
  } else {
    cr_assert_eq(good, N);
  }
}

/* A file rewritten in place under the reader: the CRCs catch it. */
Test(tfrecord, file_rewritten_under_reader, .init = make_tmpdir,
     .fini = remove_tmpdir) {
  enum { N = 300, REC = 4000, FRAMED = REC + 16 };
  size_t sizes[N];
  for (size_t i = 0; i < N; i++)
    sizes[i] = REC;
  write_records(tpath("rw.tfrecord"), FERRY_COMPRESSION_NONE, sizes, N);
  ferry_tfr_options_t o = opts_with(FERRY_COMPRESSION_NONE,
                                    FERRY_ON_ERROR_FAIL);
  ferry_tfr_reader_t *r;
  ferry_record_t rec;
  ferry_error_t err;
  cr_assert_eq(ferry__tfr_reader_open(tpath("rw.tfrecord"), &o, &r, &err), 0);
  cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), 0);
  FILE *f = fopen(tpath("rw.tfrecord"), "r+b");
  cr_assert_not_null(f);
  fseek(f, 250L * FRAMED + 40, SEEK_SET);
  fputs("rewritten", f);
  fclose(f);
  size_t good = 1;
  int code;
  while ((code = ferry__tfr_reader_next(r, &rec, &err)) == 0)
    good++;
  cr_assert_eq(good, 250);
  cr_assert_eq(code, FERRY_EDATACRC, "%d %s", code, err.msg);
  cr_assert(strstr(err.msg, "record 250 at byte offset") != NULL, "%s",
            err.msg);
  ferry__tfr_reader_free(r);
}

/* A spec naming a secret file must not read it back through the
 * error text. A "record" whose header is text (here the first 12 bytes of
 * a shadow-like line) fails its length CRC; the message names the file
 * and offset but neither the length field nor either CRC. */
Test(tfrecord, errors_quote_no_file_bytes, .init = make_tmpdir,
     .fini = remove_tmpdir) {
  const char *secret = "root:*:20228:0:99999:7:::\n";
  ferry_tfr_options_t o;
  ferry_tfr_reader_t *r;
  ferry_record_t rec;
  ferry_error_t err;
  spit3("shadow", (const uint8_t *)secret, strlen(secret));
  ferry__tfr_options_init(&o);
  cr_assert_eq(ferry__tfr_reader_open(tpath("shadow"), &o, &r, &err), 0);
  cr_assert_eq(ferry__tfr_reader_next(r, &rec, &err), FERRY_ELENCRC);
  cr_assert(strstr(err.msg, "shadow: record 0 at byte offset 0: record "
                            "length CRC mismatch") != NULL, "%s", err.msg);
  /* The length field, as a number, and the stored CRC, in hex. */
  uint64_t len = 0;
  uint32_t stored = 0;
  memcpy(&len, secret, 8);
  memcpy(&stored, secret + 8, 4);
  char num[32], hex[16];
  snprintf(num, sizeof(num), "%" PRIu64, len);
  snprintf(hex, sizeof(hex), "%08" PRIx32, stored);
  /* What follows the file's name: its directory is mkdtemp's, whose
   * random letters once held "0x". */
  const char *said = strstr(err.msg, "shadow: ");
  cr_assert_not_null(said, "%s", err.msg);
  cr_assert(strstr(said, num) == NULL && strstr(said, hex) == NULL &&
                strstr(said, "0x") == NULL,
            "the message quotes file bytes: %s", err.msg);
  ferry__tfr_reader_free(r);
}

/* A FIFO (or device) named as a shard is refused at once: opening it
 * must not block the caller (the dispatcher's loop thread). */
Test(tfrecord, fifo_is_refused_without_blocking, .init = make_tmpdir,
     .fini = remove_tmpdir, .timeout = 10) {
  ferry_tfr_options_t o;
  ferry_tfr_reader_t *r = NULL;
  ferry_error_t err;
  cr_assert_eq(mkfifo(tpath("pipe"), 0600), 0);
  ferry__tfr_options_init(&o);
  cr_assert_eq(ferry__tfr_reader_open(tpath("pipe"), &o, &r, &err),
               FERRY_EINVAL);
  cr_assert_null(r);
  cr_assert(strstr(err.msg, "pipe: not a regular file") != NULL, "%s",
            err.msg);
}

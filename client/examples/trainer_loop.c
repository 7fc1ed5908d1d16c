/* ferry-example-trainer: the smallest useful trainer loop over libferry.
 * It joins (or creates) a job, takes batches until the job ends, touches
 * each batch the way a training step would read it, and prints the rate,
 * the record count and the time spent waiting for data. Optionally it
 * augments the batches (--augment, e.g. "flip(horizontal)": on the GPU
 * with --gpu when a CUDA device is usable, else by the CPU twin), and
 * spends --step-ms per batch standing in for a training step (a sleep),
 * so that the stall fraction says whether the cluster keeps up.
 *
 *   ferry-example-trainer --dispatcher=127.0.0.1:5050 \
 *     --spec='tfrecord("/tmp/d/train-*.tfrecord") | decode(raw, 32, 32, 3) |
 *             batch(256)' --epochs=2 --job-name=demo
 *
 * Exit status: 0 when every epoch was delivered, 1 on an error (printed).
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ferry/client.h"
#include "ferry/log.h"
#include "options.h"

typedef struct settings_s {
  char *dispatcher;
  char *spec;
  char *dataset_id;
  char *job_name;
  int64_t epochs;
  int64_t batch_size;
  int64_t prefetch;
  int64_t timeout_ms;
  int mode;
  bool skip_errors;
  bool verbose;
  char *augment;
  bool gpu;
  int64_t device;
  double step_ms;
  bool help;
  char *tls_ca, *tls_cert, *tls_key, *token_file; /* a secured cluster */
} settings_t;

static const ferry_option_t options[] = {
    {"dispatcher", FERRY_OPT_STRING, offsetof(settings_t, dispatcher),
     "127.0.0.1:5050", 0, 0, NULL, "dispatcher host:port"},
    {"spec", FERRY_OPT_STRING, offsetof(settings_t, spec), NULL, 0, 0, NULL,
     "pipeline spec text (or --dataset-id)"},
    {"dataset-id", FERRY_OPT_STRING, offsetof(settings_t, dataset_id), NULL,
     0, 0, NULL, "id of a registered dataset"},
    {"job-name", FERRY_OPT_STRING, offsetof(settings_t, job_name), NULL, 0,
     0, NULL, "shared job name (empty: a private job)"},
    {"epochs", FERRY_OPT_INT, offsetof(settings_t, epochs), "0", -1, 1e9,
     NULL, "epochs (0: the spec's repeat(), -1: forever)"},
    {"batch-size", FERRY_OPT_INT, offsetof(settings_t, batch_size), "0", 0,
     1e6, NULL, "records per batch (0: the spec's batch())"},
    {"prefetch", FERRY_OPT_INT, offsetof(settings_t, prefetch), "4", 1, 1024,
     NULL, "batches assembled ahead"},
    {"timeout-ms", FERRY_OPT_INT, offsetof(settings_t, timeout_ms), "60000",
     1, 3.6e6, NULL, "give up when no batch comes for this long"},
    {"mode", FERRY_OPT_ENUM, offsetof(settings_t, mode), "distributed", 0, 0,
     "distributed|parallel", "job mode"},
    {"skip-errors", FERRY_OPT_BOOL, offsetof(settings_t, skip_errors),
     "false", 0, 0, NULL, "error policy skip instead of fail"},
    {"augment", FERRY_OPT_STRING, offsetof(settings_t, augment), NULL, 0, 0,
     NULL, "augmentation of each batch, e.g. \"flip(horizontal)\" (float32 "
     "NHWC out; ferry/augment.h)"},
    {"gpu", FERRY_OPT_BOOL, offsetof(settings_t, gpu), "false", 0, 0, NULL,
     "stage batches to CUDA device --device and augment there; without a "
     "usable device, host batches augmented by the CPU (a warning, shown "
     "with --verbose)"},
    {"device", FERRY_OPT_INT, offsetof(settings_t, device), "0", 0, 1024,
     NULL, "CUDA device id (with --gpu)"},
    {"step-ms", FERRY_OPT_DOUBLE, offsetof(settings_t, step_ms), "0", 0,
     3.6e6, NULL, "milliseconds slept per batch, standing in for a "
     "training step"},
    {"verbose", FERRY_OPT_BOOL, offsetof(settings_t, verbose), "false", 0, 0,
     NULL, "log the library's warnings and progress"},
    {"tls-ca", FERRY_OPT_STRING, offsetof(settings_t, tls_ca), NULL, 0, 0,
     NULL, "PEM CA bundle: TLS to the dispatcher and workers, verified"},
    {"tls-cert", FERRY_OPT_STRING, offsetof(settings_t, tls_cert), NULL, 0, 0,
     NULL, "PEM client certificate (mutual TLS)"},
    {"tls-key", FERRY_OPT_STRING, offsetof(settings_t, tls_key), NULL, 0, 0,
     NULL, "private key of --tls-cert"},
    {"token-file", FERRY_OPT_STRING, offsetof(settings_t, token_file), NULL,
     0, 0, NULL, "file holding the client bearer token"},
    {"help", FERRY_OPT_BOOL, offsetof(settings_t, help), "false", 0, 0, NULL,
     "print this help"},
};
#define N_OPTIONS (sizeof(options) / sizeof(options[0]))

static const char usage[] =
    "usage: ferry-example-trainer [--dispatcher HOST:PORT] (--spec SPEC | "
    "--dataset-id ID)\n"
    "                             [--epochs N] [--job-name NAME] "
    "[options]\n"
    "\n"
    "The smallest trainer loop over libferry: joins (or creates) a job,\n"
    "takes batches until the job ends, touches each batch as a training\n"
    "step would, and prints the rate, the record count and the time spent\n"
    "waiting for data.\n"
    "\n"
    "Options:\n";
static const char footer[] =
    "\nExit status: 0 when every epoch was delivered, 1 on an error "
    "(printed),\n2 on a usage error.\n";

int main(int argc, char **argv) {
  settings_t s = {0}; /* defaults() frees the strings it replaces */
  ferry_error_t err = {0};
  int npos = 0, status = 1;
  ferry_client_t *c = NULL;
  if (ferry__options_defaults(options, N_OPTIONS, &s, &err) != 0 ||
      ferry__options_parse_argv(options, N_OPTIONS, &s, argc - 1, argv + 1,
                                &npos, &err) != 0) {
    fprintf(stderr, "ferry-example-trainer: %s (see "
            "'ferry-example-trainer --help')\n", err.msg);
    ferry__options_free(options, N_OPTIONS, &s);
    return 2;
  }
  if (s.help || npos != 0) {
    /* A stray argument is a usage error: the usage goes to stderr. */
    FILE *out = s.help ? stdout : stderr;
    if (!s.help)
      fprintf(stderr, "ferry-example-trainer: unexpected argument '%s'\n\n",
              argv[1]);
    fputs(usage, out);
    ferry__options_help(options, N_OPTIONS, out);
    fputs(footer, out);
    ferry__options_free(options, N_OPTIONS, &s);
    return s.help ? 0 : 2;
  }
  if ((s.spec == NULL || s.spec[0] == '\0') ==
      (s.dataset_id == NULL || s.dataset_id[0] == '\0')) {
    fprintf(stderr, "ferry-example-trainer: give either --spec SPEC or "
            "--dataset-id ID (see 'ferry-example-trainer --help')\n");
    ferry__options_free(options, N_OPTIONS, &s);
    return 2;
  }
  ferry_log_set_callback(ferry_log_to_stderr, NULL);
  ferry_log_set_level(s.verbose ? FERRY_LOG_INFO : FERRY_LOG_ERROR);

  ferry_client_options_t o;
  ferry_client_options_init(&o);
  o.dispatcher = s.dispatcher;
  o.spec = s.spec;
  o.dataset_id = s.dataset_id;
  o.job_name = s.job_name;
  o.num_epochs = s.epochs;
  o.batch_size = (uint32_t)s.batch_size;
  o.prefetch = (uint32_t)s.prefetch;
  o.mode = s.mode == 1 ? FERRY_MODE_PARALLEL_EPOCHS
                       : FERRY_MODE_DISTRIBUTED_EPOCH;
  o.error_policy = s.skip_errors ? 1 : 0;
  o.augment = s.augment;
  o.gpu = s.gpu;
  o.device = (int)s.device;
  o.device_fallback = true;
  o.tls_ca = s.tls_ca;
  o.tls_cert = s.tls_cert;
  o.tls_key = s.tls_key;
  o.token_file = s.token_file;
  if (ferry_client_new(&o, &c, &err) != 0) {
    fprintf(stderr, "ferry-example-trainer: %s (%s)\n", err.msg,
            ferry_err_name(err.code));
    goto out;
  }
  printf("job %llu, client %llu\n",
         (unsigned long long)ferry_client_job_id(c),
         (unsigned long long)ferry_client_id(c));
  uint64_t checksum = 0, epoch_records = 0;
  int out_device = -2; /* where the first batch's output was */
  for (;;) {
    const ferry_batch_t *b;
    int rc = ferry_next(c, &b, (int)s.timeout_ms, &err);
    if (rc == FERRY_EPOCH_END) {
      printf("end of epoch: %llu records\n",
             (unsigned long long)epoch_records);
      epoch_records = 0;
      continue;
    }
    if (rc == FERRY_END) {
      status = 0;
      break;
    }
    if (rc != 0) {
      fprintf(stderr, "ferry-example-trainer: %s (%s)\n", err.msg,
              ferry_err_name(rc));
      break;
    }
    /* A training step reads the whole batch; sum a byte per record. */
    size_t rec = (size_t)b->height * b->width * b->channels;
    for (uint32_t i = 0; i < b->size; i++)
      checksum += b->images[i * rec] + (uint64_t)b->labels[i];
    epoch_records += b->size;
    if (out_device == -2) {
      out_device = b->device;
      printf("first batch: %u images of %ux%ux%u, %s\n", b->size, b->height,
             b->width, b->channels,
             b->device >= 0 ? "augmented on the GPU (device memory)"
             : b->raw       ? "uint8 host memory, not augmented"
                            : "augmented by the CPU (host memory)");
    }
    if (s.step_ms > 0) {
      long long ns = (long long)(s.step_ms * 1e6);
      struct timespec ts = {(time_t)(ns / 1000000000),
                            (long)(ns % 1000000000)};
      while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
    }
    ferry_batch_release(c, b);
  }
  ferry_client_stats_t st;
  ferry_client_stats(c, &st);
  printf("batches %llu, records %llu, %.1f batches/s, %.1f MB/s, "
         "wait %.3f s of %.3f s (stall %.1f%%), checksum %llu\n",
         (unsigned long long)st.batches, (unsigned long long)st.records,
         st.total_seconds > 0 ? (double)st.batches / st.total_seconds : 0,
         st.total_seconds > 0 ? (double)st.bytes / st.total_seconds / 1e6
                              : 0,
         st.wait_seconds, st.total_seconds, st.stall_fraction * 100,
         (unsigned long long)checksum);
  printf("images/s %.0f, stall fraction %.3f (time waiting for data / "
         "total, since the client started)\n",
         st.total_seconds > 0 ? (double)st.records / st.total_seconds : 0,
         st.stall_fraction);
out:
  ferry_client_free(c);
  ferry__options_free(options, N_OPTIONS, &s);
  return status;
}

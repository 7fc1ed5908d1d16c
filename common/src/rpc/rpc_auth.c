/* Credentials: TLS material for servers and channels, bearer
 * tokens, constant-time comparison, random secrets.
 *
 * Server certificates are served through gRPC's certificate-config
 * fetcher: gRPC calls fetch() at each new connection's handshake, which
 * stats the three files and re-reads them only when one changed (inode,
 * size, mtime or ctime) or a reload was forced (SIGHUP). A new config
 * applies to new connections only; open connections keep their TLS
 * session, so no stream is dropped. A file that cannot be read, or a pair
 * gRPC refuses, keeps the previous config (logged).
 */
#include <errno.h>
#include <fcntl.h>
#include <grpc/grpc_security.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc.h"
#include "ferry/log.h"
#include "rpc_internal.h"

#define MAX_PEM_BYTES (1 << 20)
#define MAX_TOKEN_BYTES 4096

/* Reads a whole small file into a NUL-terminated buffer. */
static int read_file(const char *path, size_t max, char **out, size_t *len,
                     ferry_error_t *err) {
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  struct stat st;
  char *buf = NULL;
  size_t n = 0;
  *out = NULL;
  if (fd < 0)
    return ferry__seterr(err, -errno, "%s: %s", path, strerror(errno));
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return ferry__seterr(err, FERRY_EINVAL, "%s: not a regular file", path);
  }
  if ((uint64_t)st.st_size > max) {
    close(fd);
    return ferry__seterr(err, FERRY_EINVAL, "%s: larger than %zu bytes",
                         path, max);
  }
  buf = ferry__malloc(max + 1);
  if (buf == NULL) {
    close(fd);
    return ferry__seterr(err, FERRY_ENOMEM, "%s: out of memory", path);
  }
  for (;;) {
    ssize_t r = read(fd, buf + n, max - n);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0) {
      int e = errno;
      close(fd);
      ferry__free(buf);
      return ferry__seterr(err, -e, "%s: %s", path, strerror(e));
    }
    if (r == 0 || n + (size_t)r == max) {
      n += (size_t)r;
      break;
    }
    n += (size_t)r;
  }
  close(fd);
  buf[n] = '\0';
  *out = buf;
  *len = n;
  return 0;
}

static int read_pem(const char *path, char **out, ferry_error_t *err) {
  size_t len;
  int rc = read_file(path, MAX_PEM_BYTES, out, &len, err);
  if (rc != 0)
    return rc;
  if (strstr(*out, "-----BEGIN ") == NULL) {
    ferry__free(*out);
    *out = NULL;
    return ferry__seterr(err, FERRY_EINVAL, "%s: no PEM block", path);
  }
  return 0;
}

int ferry__rpc_read_token(const char *path, char **out, ferry_error_t *err) {
  struct stat st;
  size_t len;
  char *tok;
  int rc = read_file(path, MAX_TOKEN_BYTES + 64, &tok, &len, err);
  *out = NULL;
  if (rc != 0)
    return rc;
  while (len > 0 && (tok[len - 1] == '\n' || tok[len - 1] == '\r' ||
                     tok[len - 1] == ' ' || tok[len - 1] == '\t'))
    tok[--len] = '\0';
  if (len == 0 || len > MAX_TOKEN_BYTES) {
    ferry__free(tok);
    return ferry__seterr(err, FERRY_EINVAL,
                         "%s: a token must be 1 to %d characters", path,
                         MAX_TOKEN_BYTES);
  }
  for (size_t i = 0; i < len; i++)
    if (tok[i] < 0x21 || tok[i] > 0x7e) {
      ferry__free(tok);
      return ferry__seterr(err, FERRY_EINVAL,
                           "%s: a token must be printable ASCII without "
                           "spaces (character %zu is not)", path, i);
    }
  if (stat(path, &st) == 0 && (st.st_mode & 077) != 0)
    FERRY_LOG(FERRY_LOG_WARN,
              "%s: the token file is readable by group or others (mode "
              "%03o); chmod 600 it", path, (unsigned)(st.st_mode & 0777));
  *out = tok;
  return 0;
}

bool ferry__rpc_bytes_equal(const void *a, const void *b, size_t n) {
  const volatile uint8_t *x = a, *y = b;
  uint8_t d = 0;
  for (size_t i = 0; i < n; i++)
    d |= (uint8_t)(x[i] ^ y[i]);
  return d == 0;
}

bool ferry__rpc_token_equal(const char *a, size_t n, const char *b) {
  size_t m = strlen(b);
  /* Walk the expected token whatever `a` is: the time depends on the
   * lengths only. */
  uint8_t d = (uint8_t)(n != m);
  for (size_t i = 0; i < m; i++) {
    uint8_t x = i < n ? (uint8_t)a[i] : 0;
    d |= (uint8_t)(x ^ (uint8_t)b[i]);
  }
  return d == 0 && a != NULL;
}

int ferry__rpc_random(void *buf, size_t n) {
  uint8_t *p = buf;
  while (n > 0) {
    ssize_t r = getrandom(p, n, 0);
    if (r < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

bool ferry__rpc_host_is_loopback(const char *host) {
  if (host == NULL)
    return false;
  if (host[0] == '[')
    host++;
  return strncmp(host, "127.", 4) == 0 || strncmp(host, "::1", 3) == 0 ||
         strcmp(host, "localhost") == 0;
}

/* ---- Channels --------------------------------------------------------- */

int ferry__rpc_channel_creds(const ferry_rpc_tls_t *tls,
                             grpc_channel_credentials **out,
                             ferry_error_t *err) {
  char *ca = NULL, *cert = NULL, *key = NULL;
  int rc = 0;
  *out = NULL;
  if ((tls->cert_file == NULL) != (tls->key_file == NULL))
    return ferry__seterr(err, FERRY_EINVAL,
                         "TLS: a client certificate needs its key and a key "
                         "its certificate");
  if ((tls->ca_file != NULL && (rc = read_pem(tls->ca_file, &ca, err))) ||
      (tls->cert_file != NULL &&
       (rc = read_pem(tls->cert_file, &cert, err))) ||
      (tls->key_file != NULL && (rc = read_pem(tls->key_file, &key, err))))
    goto out;
  grpc_ssl_pem_key_cert_pair pair = {key, cert};
  *out = grpc_ssl_credentials_create(ca, cert != NULL ? &pair : NULL, NULL,
                                     NULL);
  if (*out == NULL)
    rc = ferry__seterr(err, FERRY_EINVAL, "TLS: gRPC refused %s",
                       tls->ca_file != NULL ? tls->ca_file : "the settings");
out:
  if (key != NULL)
    explicit_bzero(key, strlen(key));
  ferry__free(ca);
  ferry__free(cert);
  ferry__free(key);
  return rc;
}

/* ---- Servers ---------------------------------------------------------- */

struct file_sig {
  dev_t dev;
  ino_t ino;
  off_t size;
  struct timespec mtime, ctime;
};

struct ferry__rpc_tls_server {
  pthread_mutex_t lock;
  char *ca_file, *cert_file, *key_file;
  bool require;
  bool force;   /* reload at the next handshake */
  bool served;  /* a config was handed to gRPC */
  struct file_sig sig[3];
  uint64_t reloads;
};

static void file_sig(const char *path, struct file_sig *s) {
  struct stat st;
  memset(s, 0, sizeof(*s));
  if (path == NULL || stat(path, &st) != 0)
    return;
  s->dev = st.st_dev;
  s->ino = st.st_ino;
  s->size = st.st_size;
  s->mtime = st.st_mtim;
  s->ctime = st.st_ctim;
}

/* Reads the three files into a gRPC config; NULL on failure (err set). */
static grpc_ssl_server_certificate_config *
load_config(struct ferry__rpc_tls_server *t, ferry_error_t *err) {
  char *ca = NULL, *cert = NULL, *key = NULL;
  grpc_ssl_server_certificate_config *cfg = NULL;
  /* gRPC 1.51's reloading server credentials assert on a config without
   * root certificates (ssl_security_connector.cc: pem_root_certs), even
   * when no client certificate is requested. Without --tls-ca the server
   * requests none (ferry__rpc_tls_server_creds), so the roots are never
   * consulted: the server's own certificate stands in for them. */
  if (read_pem(t->ca_file != NULL ? t->ca_file : t->cert_file, &ca, err) ==
          0 &&
      read_pem(t->cert_file, &cert, err) == 0 &&
      read_pem(t->key_file, &key, err) == 0) {
    grpc_ssl_pem_key_cert_pair pair = {key, cert};
    cfg = grpc_ssl_server_certificate_config_create(ca, &pair, 1);
    if (cfg == NULL)
      ferry__seterr(err, FERRY_EINVAL, "TLS: gRPC refused %s and %s",
                    t->cert_file, t->key_file);
  }
  if (key != NULL)
    explicit_bzero(key, strlen(key));
  ferry__free(ca);
  ferry__free(cert);
  ferry__free(key);
  return cfg;
}

static grpc_ssl_certificate_config_reload_status
fetch(void *user, grpc_ssl_server_certificate_config **config) {
  struct ferry__rpc_tls_server *t = user;
  grpc_ssl_certificate_config_reload_status st =
      GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;
  struct file_sig now[3];
  ferry_error_t err = {0};
  pthread_mutex_lock(&t->lock);
  file_sig(t->ca_file, &now[0]);
  file_sig(t->cert_file, &now[1]);
  file_sig(t->key_file, &now[2]);
  if (t->served && !t->force && memcmp(now, t->sig, sizeof(now)) == 0)
    goto out;
  /* Remember what was looked at, so a broken file is logged once. */
  memcpy(t->sig, now, sizeof(now));
  t->force = false;
  *config = load_config(t, &err);
  if (*config == NULL) {
    FERRY_LOG(FERRY_LOG_WARN, "TLS reload failed, keeping the current "
              "certificate: %s", err.msg);
    st = t->served ? GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED
                   : GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_FAIL;
    goto out;
  }
  if (t->served)
    FERRY_LOG(FERRY_LOG_INFO, "TLS: reloaded %s (new connections use it)",
              t->cert_file);
  t->served = true;
  t->reloads++;
  st = GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW;
out:
  pthread_mutex_unlock(&t->lock);
  return st;
}

void ferry__rpc_tls_server_free(struct ferry__rpc_tls_server *t) {
  if (t == NULL)
    return;
  pthread_mutex_destroy(&t->lock);
  ferry__free(t->ca_file);
  ferry__free(t->cert_file);
  ferry__free(t->key_file);
  ferry__free(t);
}

int ferry__rpc_tls_server_new(const ferry_rpc_tls_t *tls,
                              struct ferry__rpc_tls_server **out,
                              ferry_error_t *err) {
  struct ferry__rpc_tls_server *t;
  *out = NULL;
  if (tls->cert_file == NULL || tls->key_file == NULL)
    return ferry__seterr(err, FERRY_EINVAL,
                         "TLS: a server needs a certificate and its key");
  if (tls->require_client_cert && tls->ca_file == NULL)
    return ferry__seterr(err, FERRY_EINVAL,
                         "TLS: requiring client certificates needs the CA "
                         "that signs them");
  t = ferry__calloc(1, sizeof(*t));
  if (t == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "TLS: out of memory");
  pthread_mutex_init(&t->lock, NULL);
  t->require = tls->require_client_cert;
  t->cert_file = ferry__strdup(tls->cert_file);
  t->key_file = ferry__strdup(tls->key_file);
  t->ca_file = tls->ca_file != NULL ? ferry__strdup(tls->ca_file) : NULL;
  if (t->cert_file == NULL || t->key_file == NULL ||
      (tls->ca_file != NULL && t->ca_file == NULL)) {
    ferry__rpc_tls_server_free(t);
    return ferry__seterr(err, FERRY_ENOMEM, "TLS: out of memory");
  }
  /* Check the files now, so a bad path fails the start naming it. */
  grpc_ssl_server_certificate_config *cfg = load_config(t, err);
  if (cfg == NULL) {
    ferry__rpc_tls_server_free(t);
    return err != NULL && err->code != 0 ? err->code : FERRY_EINVAL;
  }
  grpc_ssl_server_certificate_config_destroy(cfg);
  *out = t;
  return 0;
}

grpc_server_credentials *
ferry__rpc_tls_server_creds(struct ferry__rpc_tls_server *t) {
  grpc_ssl_client_certificate_request_type req =
      t->require ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
      : t->ca_file != NULL
          ? GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY
          : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE;
  grpc_ssl_server_credentials_options *o =
      grpc_ssl_server_credentials_create_options_using_config_fetcher(
          req, fetch, t);
  if (o == NULL)
    return NULL;
  return grpc_ssl_server_credentials_create_with_options(o);
}

void ferry__rpc_tls_server_force(struct ferry__rpc_tls_server *t) {
  if (t == NULL)
    return;
  pthread_mutex_lock(&t->lock);
  t->force = true;
  pthread_mutex_unlock(&t->lock);
}

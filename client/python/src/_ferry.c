/* ferry._ferry: the CPython binding of libferry.
 *
 * Written against libferry's public headers only (ferry/client.h and what
 * it includes, ferry/version.h). The Python API is documented in
 * docs/PYTHON.md and ferry/_ferry.pyi; this comment states how the
 * objects own libferry's memory.
 *
 * Objects. A Client owns a ferry_client_t. Every batch ferry_next hands
 * out is held by one private _Slot object, which holds a strong reference
 * to its Client and gives the batch back (ferry_batch_release_after with
 * the legacy default stream) when it is deallocated. A Batch holds its
 * _Slot (release() drops that reference early); an Array (batch.images,
 * .labels, .ids) holds the _Slot; every __dlpack__ call makes one malloc'd
 * DLManagedTensor whose manager_ctx is a strong reference to the _Slot,
 * dropped by its deleter (which takes the GIL itself, so consumers may
 * call it from any thread). So the ring slot goes back exactly when the
 * Batch and everything made from it are gone, and nothing refers back
 * from the Client to a batch (no reference cycles).
 *
 * Freeing. ferry_client_free runs once close() was called (or the Client
 * is deallocated), no _Slot is alive and no thread is inside next(): each
 * of those three events checks the other two (client_maybe_free).
 *
 * Threads. Python state is only touched with the GIL held. next() releases
 * the GIL around ferry_next, which it calls in slices of at most 100 ms;
 * between slices it runs PyErr_CheckSignals (Ctrl-C) and looks at the
 * closing flag that close() from another thread sets.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ferry/client.h"
#include "ferry/version.h"

#define PYFERRY_SLICE_MS 100   /* longest wait without the GIL */
#define PYFERRY_DEFAULT_PREFETCH 3
/* With every ring slot held: how long next() looks for the job's or the
 * epoch's end (or a slot another thread frees) before raising, and how
 * often. Twice libferry's default heartbeat period. */
#define PYFERRY_HELD_GRACE_MS 1000
#define PYFERRY_HELD_POLL_MS 10

/* ---- Exceptions -------------------------------------------------------- */

static PyObject *FerryError;
static PyObject *SpecError;
static PyObject *RecordError;
static PyObject *UnreachableError;
static PyObject *WorkerError;
static PyObject *FerryTimeoutError;
static PyObject *ClosedError;
static PyObject *CancelledError;
static PyObject *ForkedError;

/* Where an error came from, for the choice of subclass. */
enum { CTX_CONNECT, CTX_NEXT, CTX_OTHER };

static PyObject *error_class(int code, const char *msg, int ctx) {
  if (code == FERRY_EFORKED)
    return ForkedError;
  if (code == FERRY_ETIMEDOUT)
    return FerryTimeoutError;
  if (code <= FERRY_EOF && code >= FERRY_ESHAPE)
    return RecordError; /* the record codes, -1000 .. -1024 */
  if (code == FERRY_ESPEC || code == FERRY_EOPTION)
    return SpecError;
  if (code == FERRY_EGRPC_UNAVAILABLE || code == FERRY_EGRPC_DEADLINE_EXCEEDED)
    return ctx == CTX_NEXT && strncmp(msg, "worker ", 7) == 0
               ? WorkerError
               : UnreachableError;
  if (ctx == CTX_NEXT) {
    /* Heartbeat loss: "dispatcher HOST unreachable for N s: ...". */
    if (strncmp(msg, "dispatcher ", 11) == 0 && strstr(msg, "unreachable"))
      return UnreachableError;
    /* A worker's stream failed, or the dispatcher failed the job because
     * of a worker's task. */
    if (strncmp(msg, "worker ", 7) == 0 || strncmp(msg, "job failed", 10) == 0)
      return WorkerError;
    /* The operator cancelled the job ("job J cancelled by the operator"). */
    if (code == FERRY_ECANCELED)
      return CancelledError;
    /* A worker's task error relayed in its chunk stream carries the
     * worker's own text ("FILE: open: ..."): the file errors are the
     * worker's, not this process's (the client opens no file). */
    if (code == FERRY_ENOENT || code == FERRY_EACCES || code == FERRY_ENOSPC ||
        (code == FERRY_EIO && strncmp(msg, "batch ", 6) != 0))
      return WorkerError;
    if (code <= FERRY_EGRPC_CANCELLED && code >= FERRY_EGRPC_UNAUTHENTICATED)
      return WorkerError;
  }
  return FerryError;
}

/* Raises `cls` (NULL: chosen from code, message and context) with the
 * message and the attributes code and code_name. Returns NULL. */
static PyObject *raise_ferry(PyObject *cls, int code, const char *msg, int ctx) {
  if (cls == NULL)
    cls = error_class(code, msg, ctx);
  PyObject *text = PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "replace");
  if (text == NULL)
    return NULL;
  PyObject *exc = PyObject_CallOneArg(cls, text);
  Py_DECREF(text);
  if (exc == NULL)
    return NULL;
  PyObject *c = PyLong_FromLong(code);
  PyObject *n = PyUnicode_FromString(code ? ferry_err_name(code) : "");
  if (c == NULL || n == NULL || PyObject_SetAttrString(exc, "code", c) < 0 ||
      PyObject_SetAttrString(exc, "code_name", n) < 0) {
    Py_XDECREF(c);
    Py_XDECREF(n);
    Py_DECREF(exc);
    return NULL;
  }
  Py_DECREF(c);
  Py_DECREF(n);
  PyErr_SetObject(cls, exc);
  Py_DECREF(exc);
  return NULL;
}

static PyObject *raise_err(const ferry_error_t *err, int rc, int ctx) {
  int code = err->code != 0 ? err->code : rc;
  const char *msg = err->msg[0] ? err->msg : ferry_strerror(code);
  return raise_ferry(NULL, code, msg, ctx);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- Client ------------------------------------------------------------ */

typedef struct {
  PyObject_HEAD
  ferry_client_t *c;      /* NULL before __init__ succeeds and once freed */
  int closing;            /* close() was called */
  int in_next;            /* a thread is inside ferry_next */
  int ended;              /* FERRY_END seen */
  int epoch_open;         /* an epochs() iterator has not reached its end */
  uint64_t epoch_seq;     /* which epochs() iterator is current */
  Py_ssize_t live;        /* _Slot objects alive (batches held by Python) */
  const ferry_batch_t *peeked; /* a batch epochs() took to look ahead */
  uint32_t prefetch;
  double timeout;         /* seconds for next(); < 0: forever */
  uint64_t job_id, client_id;
  /* Ranks: world_size > 1, else all four 0 (None in Python). */
  uint32_t rank, world_size;
  uint64_t steps_per_epoch, dropped_per_epoch;
  ferry_client_stats_t last; /* the counters when the client was freed */
  int have_last;
  pid_t pid;              /* the process that created `c` */
} ClientObject;

static PyTypeObject ClientType;

static void client_free_now(ClientObject *self) {
  ferry_client_t *c = self->c;
  if (c == NULL)
    return;
  ferry_client_stats(c, &self->last);
  self->have_last = 1;
  self->c = NULL;
  self->peeked = NULL; /* freed with the client */
  /* Saying goodbye to the dispatcher can take up to ~2 s. */
  Py_BEGIN_ALLOW_THREADS
  ferry_client_free(c);
  Py_END_ALLOW_THREADS
}

static void client_maybe_free(ClientObject *self) {
  if (self->closing && self->live == 0 && !self->in_next)
    client_free_now(self);
}

/* ---- _Slot: one held batch --------------------------------------------- */

typedef struct {
  PyObject_HEAD
  ClientObject *client;
  const ferry_batch_t *b;
} SlotObject;

static PyTypeObject SlotType;

static void slot_dealloc(SlotObject *self) {
  ClientObject *cl = self->client;
  if (cl != NULL) {
    if (self->b != NULL && cl->c != NULL)
      ferry_batch_release_after(cl->c, self->b, NULL);
    self->b = NULL;
    cl->live--;
    client_maybe_free(cl);
    self->client = NULL;
    Py_DECREF(cl);
  }
  PyObject_Free(self);
}

static PyTypeObject SlotType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ferry._ferry._Slot",
    .tp_basicsize = sizeof(SlotObject),
    .tp_dealloc = (destructor)slot_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A batch slot held by Python objects (internal).",
};

/* Takes over `b` (gives it back on failure). */
static SlotObject *slot_new(ClientObject *cl, const ferry_batch_t *b) {
  SlotObject *s = PyObject_New(SlotObject, &SlotType);
  if (s == NULL) {
    ferry_batch_release(cl->c, b);
    return NULL;
  }
  Py_INCREF(cl);
  s->client = cl;
  s->b = b;
  cl->live++;
  return s;
}

/* ---- Array: images, labels or ids of a batch ---------------------------- */

enum { DT_UINT8, DT_FLOAT32, DT_FLOAT16, DT_BFLOAT16, DT_INT64 };

static const struct {
  const char *name;
  const char *typestr; /* NULL: no NumPy type */
  uint8_t code, bits;
} dtypes[] = {
    [DT_UINT8] = {"uint8", "|u1", kDLUInt, 8},
    [DT_FLOAT32] = {"float32", "<f4", kDLFloat, 32},
    [DT_FLOAT16] = {"float16", "<f2", kDLFloat, 16},
    [DT_BFLOAT16] = {"bfloat16", NULL, kDLBfloat, 16},
    [DT_INT64] = {"int64", "<i8", kDLInt, 64},
};

typedef struct {
  PyObject_HEAD
  SlotObject *slot;
  void *data;
  int ndim;
  int64_t shape[4];
  int dtype;
  int device; /* CUDA device, or -1 for host memory */
} ArrayObject;

static PyTypeObject ArrayType;

static void array_dealloc(ArrayObject *self) {
  Py_XDECREF(self->slot);
  PyObject_Free(self);
}

/* The DLPack deleter: may run in any thread, with or without the GIL. */
typedef struct {
  DLManagedTensor t;
  int64_t shape[4];
  int64_t strides[4];
} ManagedTensor;

static void dl_deleter(DLManagedTensor *t) {
  if (t == NULL)
    return;
  if (t->manager_ctx != NULL && Py_IsInitialized()) {
    PyGILState_STATE st = PyGILState_Ensure();
    Py_DECREF((PyObject *)t->manager_ctx);
    PyGILState_Release(st);
  }
  free(t);
}

static void capsule_destructor(PyObject *cap) {
  /* A consumer that took the tensor renamed the capsule "used_dltensor"
   * and calls the deleter itself. */
  if (!PyCapsule_IsValid(cap, "dltensor"))
    return;
  PyObject *et, *ev, *tb;
  PyErr_Fetch(&et, &ev, &tb);
  DLManagedTensor *t = PyCapsule_GetPointer(cap, "dltensor");
  if (t != NULL && t->deleter != NULL)
    t->deleter(t);
  PyErr_Restore(et, ev, tb);
}

static int array_device_check(ArrayObject *self) {
  if (self->slot->client->c == NULL) { /* cannot happen while a slot lives */
    raise_ferry(ClosedError, FERRY_EINVAL, "the client was freed", CTX_OTHER);
    return -1;
  }
  return 0;
}

static PyObject *array_dlpack(ArrayObject *self, PyObject *args,
                              PyObject *kwargs) {
  static char *kwlist[] = {"stream", NULL};
  PyObject *stream = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:__dlpack__", kwlist,
                                   &stream))
    return NULL;
  if (array_device_check(self) < 0)
    return NULL;
  if (self->device >= 0) {
    /* The consumer's stream waits for the batch's ready event: None and 1
     * are the legacy default stream, 2 the per-thread default stream
     * (cudaStreamPerThread is (cudaStream_t)2), -1 asks for no wait,
     * other values are cudaStream_t handles. */
    void *cuda_stream = NULL;
    int wait = 1;
    if (stream != Py_None) {
      if (!PyLong_Check(stream) || PyBool_Check(stream))
        return PyErr_Format(PyExc_TypeError,
                            "__dlpack__: stream must be an int or None, "
                            "not %.100s", Py_TYPE(stream)->tp_name);
      long long v = PyLong_AsLongLong(stream);
      if (v == -1 && PyErr_Occurred())
        return NULL;
      if (v == 0)
        return PyErr_Format(PyExc_ValueError,
                            "__dlpack__: stream 0 is ambiguous for CUDA: "
                            "use 1 (legacy default) or 2 (per-thread "
                            "default)");
      if (v == -1)
        wait = 0;
      else if (v == 1)
        cuda_stream = NULL;
      else if (v < -1)
        return PyErr_Format(PyExc_ValueError,
                            "__dlpack__: invalid stream %lld", v);
      else
        cuda_stream = (void *)(uintptr_t)v;
    }
    if (wait) {
      ferry_error_t err = {0};
      int rc = ferry_batch_wait_stream(self->slot->client->c, self->slot->b,
                                       cuda_stream, &err);
      if (rc != 0)
        return raise_err(&err, rc, CTX_OTHER);
    }
  } else if (stream != Py_None && !PyLong_Check(stream)) {
    return PyErr_Format(PyExc_TypeError,
                        "__dlpack__: stream must be an int or None, not "
                        "%.100s", Py_TYPE(stream)->tp_name);
  }
  ManagedTensor *m = calloc(1, sizeof(*m));
  if (m == NULL)
    return PyErr_NoMemory();
  DLTensor *t = &m->t.dl_tensor;
  t->data = self->data;
  t->device.device_type = self->device >= 0 ? kDLCUDA : kDLCPU;
  t->device.device_id = self->device >= 0 ? self->device : 0;
  t->ndim = self->ndim;
  t->dtype.code = dtypes[self->dtype].code;
  t->dtype.bits = dtypes[self->dtype].bits;
  t->dtype.lanes = 1;
  int64_t stride = 1;
  for (int i = self->ndim - 1; i >= 0; i--) {
    m->shape[i] = self->shape[i];
    m->strides[i] = stride;
    stride *= self->shape[i];
  }
  t->shape = m->shape;
  t->strides = m->strides;
  t->byte_offset = 0;
  Py_INCREF(self->slot);
  m->t.manager_ctx = self->slot;
  m->t.deleter = dl_deleter;
  PyObject *cap = PyCapsule_New(&m->t, "dltensor", capsule_destructor);
  if (cap == NULL) {
    dl_deleter(&m->t);
    return NULL;
  }
  return cap;
}

static PyObject *array_dlpack_device(ArrayObject *self,
                                     PyObject *Py_UNUSED(ignored)) {
  if (self->device >= 0)
    return Py_BuildValue("(ii)", (int)kDLCUDA, self->device);
  return Py_BuildValue("(ii)", (int)kDLCPU, 0);
}

static PyObject *array_shape_tuple(ArrayObject *self) {
  PyObject *t = PyTuple_New(self->ndim);
  if (t == NULL)
    return NULL;
  for (int i = 0; i < self->ndim; i++) {
    PyObject *v = PyLong_FromLongLong(self->shape[i]);
    if (v == NULL) {
      Py_DECREF(t);
      return NULL;
    }
    PyTuple_SET_ITEM(t, i, v);
  }
  return t;
}

static PyObject *array_get_shape(ArrayObject *self, void *Py_UNUSED(c)) {
  return array_shape_tuple(self);
}

static PyObject *array_get_dtype(ArrayObject *self, void *Py_UNUSED(c)) {
  return PyUnicode_FromString(dtypes[self->dtype].name);
}

static PyObject *array_get_device(ArrayObject *self, void *Py_UNUSED(c)) {
  if (self->device >= 0)
    return PyUnicode_FromFormat("cuda:%d", self->device);
  return PyUnicode_FromString("cpu");
}

static PyObject *array_get_data_ptr(ArrayObject *self, void *Py_UNUSED(c)) {
  return PyLong_FromVoidPtr(self->data);
}

static Py_ssize_t array_nbytes_n(ArrayObject *self) {
  Py_ssize_t n = dtypes[self->dtype].bits / 8;
  for (int i = 0; i < self->ndim; i++)
    n *= (Py_ssize_t)self->shape[i];
  return n;
}

static PyObject *array_get_nbytes(ArrayObject *self, void *Py_UNUSED(c)) {
  return PyLong_FromSsize_t(array_nbytes_n(self));
}

static PyObject *array_get_interface(ArrayObject *self, void *Py_UNUSED(c)) {
  if (self->device >= 0) {
    PyErr_SetString(PyExc_AttributeError,
                    "__array_interface__: the array is in CUDA device "
                    "memory; use __dlpack__ (torch.from_dlpack)");
    return NULL;
  }
  if (dtypes[self->dtype].typestr == NULL) {
    PyErr_SetString(PyExc_AttributeError,
                    "__array_interface__: NumPy has no bfloat16; use "
                    "__dlpack__ (torch.from_dlpack)");
    return NULL;
  }
  PyObject *shape = array_shape_tuple(self);
  if (shape == NULL)
    return NULL;
  /* data: (pointer, read-only). The memory is the library's ring slot. */
  return Py_BuildValue("{s:i,s:N,s:s,s:(NO),s:O}", "version", 3, "shape",
                       shape, "typestr", dtypes[self->dtype].typestr, "data",
                       PyLong_FromVoidPtr(self->data), Py_True, "strides",
                       Py_None);
}

static Py_ssize_t array_len(ArrayObject *self) {
  return (Py_ssize_t)self->shape[0];
}

static PyObject *array_repr(ArrayObject *self) {
  PyObject *shape = array_shape_tuple(self);
  if (shape == NULL)
    return NULL;
  PyObject *r;
  if (self->device >= 0)
    r = PyUnicode_FromFormat("<ferry.Array shape=%R dtype=%s device=cuda:%d>",
                             shape, dtypes[self->dtype].name, self->device);
  else
    r = PyUnicode_FromFormat("<ferry.Array shape=%R dtype=%s device=cpu>",
                             shape, dtypes[self->dtype].name);
  Py_DECREF(shape);
  return r;
}

static PyMethodDef array_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))array_dlpack,
     METH_VARARGS | METH_KEYWORDS,
     "__dlpack__(stream=None) -> PyCapsule\n\n"
     "Exports the array as a DLPack 0.8 capsule named \"dltensor\", "
     "sharing the batch's memory (no copy). The batch slot stays held "
     "until the consumer calls the tensor's deleter (or the capsule is "
     "dropped unused).\n\n"
     "For CUDA arrays, `stream` is the consumer's stream: None or 1 is the "
     "legacy default stream, 2 the per-thread default stream, -1 asks for "
     "no synchronisation, any other int is a cudaStream_t handle. That "
     "stream is made to wait (on the device) for the batch's ready event "
     "before the capsule is returned. Host arrays ignore it."},
    {"__dlpack_device__", (PyCFunction)array_dlpack_device, METH_NOARGS,
     "__dlpack_device__() -> (device_type, device_id)\n\n"
     "(1, 0) for host memory (kDLCPU), (2, N) for CUDA device N (kDLCUDA)."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef array_getset[] = {
    {"shape", (getter)array_get_shape, NULL, "The shape, a tuple of ints.",
     NULL},
    {"dtype", (getter)array_get_dtype, NULL,
     "The element type: 'uint8', 'float32', 'float16', 'bfloat16' or "
     "'int64'.",
     NULL},
    {"device", (getter)array_get_device, NULL, "'cpu' or 'cuda:N'.", NULL},
    {"data_ptr", (getter)array_get_data_ptr, NULL,
     "The address of the first element (in device memory for CUDA "
     "arrays).",
     NULL},
    {"nbytes", (getter)array_get_nbytes, NULL, "The size in bytes.", NULL},
    {"__array_interface__", (getter)array_get_interface, NULL,
     "NumPy's array interface (version 3, read-only data), for host arrays "
     "other than bfloat16.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PySequenceMethods array_as_sequence = {
    .sq_length = (lenfunc)array_len,
};

static PyTypeObject ArrayType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ferry.Array",
    .tp_basicsize = sizeof(ArrayObject),
    .tp_dealloc = (destructor)array_dealloc,
    .tp_repr = (reprfunc)array_repr,
    .tp_as_sequence = &array_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc =
        "A view of one part of a batch (images, labels or ids) in the "
        "client's ring slot.\n\n"
        "Exports __dlpack__/__dlpack_device__ (torch.from_dlpack, "
        "numpy.from_dlpack, tf.experimental.dlpack.from_dlpack) and, for "
        "host memory, __array_interface__ (numpy.asarray): no copy. The "
        "slot stays held while the Array or anything made from it lives.",
    .tp_methods = array_methods,
    .tp_getset = array_getset,
};

/* ---- Batch -------------------------------------------------------------- */

typedef struct {
  PyObject_HEAD
  SlotObject *slot; /* NULL after release() */
  uint32_t size, epoch;
  uint32_t num_real; /* the first num_real records are real (ranks) */
  uint64_t index;
} BatchObject;

static PyTypeObject BatchType;

static void batch_dealloc(BatchObject *self) {
  Py_XDECREF(self->slot);
  PyObject_Free(self);
}

/* Takes over `b`. */
static PyObject *batch_new(ClientObject *cl, const ferry_batch_t *b) {
  SlotObject *s = slot_new(cl, b);
  if (s == NULL)
    return NULL;
  BatchObject *o = PyObject_New(BatchObject, &BatchType);
  if (o == NULL) {
    Py_DECREF(s);
    return NULL;
  }
  o->slot = s;
  o->size = b->size;
  o->epoch = b->epoch;
  o->num_real = b->num_real <= b->size ? b->num_real : b->size;
  o->index = b->index;
  return (PyObject *)o;
}

enum { PART_IMAGES, PART_LABELS, PART_IDS };

static PyObject *batch_part(BatchObject *self, int part) {
  if (self->slot == NULL) {
    PyErr_SetString(PyExc_ValueError,
                    "the batch was released: take its arrays before "
                    "release()");
    return NULL;
  }
  const ferry_batch_t *b = self->slot->b;
  ArrayObject *a = PyObject_New(ArrayObject, &ArrayType);
  if (a == NULL)
    return NULL;
  Py_INCREF(self->slot);
  a->slot = self->slot;
  a->device = -1;
  a->shape[0] = b->size;
  if (part == PART_LABELS || part == PART_IDS) {
    /* ids are uint64 below 2^63: exported as int64 (torch 1.13 has no
     * uint64). */
    a->data = part == PART_LABELS ? (void *)b->labels : (void *)b->ids;
    a->ndim = 1;
    a->dtype = DT_INT64;
    return (PyObject *)a;
  }
  a->data = (void *)b->output;
  a->ndim = 4;
  a->device = b->device;
  if (b->raw) {
    a->dtype = DT_UINT8;
  } else {
    switch (b->dtype) {
    case FERRY_DTYPE_FLOAT16: a->dtype = DT_FLOAT16; break;
    case FERRY_DTYPE_BFLOAT16: a->dtype = DT_BFLOAT16; break;
    default: a->dtype = DT_FLOAT32; break;
    }
  }
  if (!b->raw && b->layout == FERRY_LAYOUT_NCHW) {
    a->shape[1] = b->channels;
    a->shape[2] = b->height;
    a->shape[3] = b->width;
  } else {
    a->shape[1] = b->height;
    a->shape[2] = b->width;
    a->shape[3] = b->channels;
  }
  return (PyObject *)a;
}

static PyObject *batch_get_images(BatchObject *self, void *Py_UNUSED(c)) {
  return batch_part(self, PART_IMAGES);
}
static PyObject *batch_get_labels(BatchObject *self, void *Py_UNUSED(c)) {
  return batch_part(self, PART_LABELS);
}
static PyObject *batch_get_ids(BatchObject *self, void *Py_UNUSED(c)) {
  return batch_part(self, PART_IDS);
}
static PyObject *batch_get_epoch(BatchObject *self, void *Py_UNUSED(c)) {
  return PyLong_FromUnsignedLong(self->epoch);
}
static PyObject *batch_get_index(BatchObject *self, void *Py_UNUSED(c)) {
  return PyLong_FromUnsignedLongLong(self->index);
}
static PyObject *batch_get_num_real(BatchObject *self, void *Py_UNUSED(c)) {
  return PyLong_FromUnsignedLong(self->num_real);
}
static PyObject *batch_get_released(BatchObject *self, void *Py_UNUSED(c)) {
  return PyBool_FromLong(self->slot == NULL);
}

static PyObject *batch_release(BatchObject *self, PyObject *Py_UNUSED(a)) {
  Py_CLEAR(self->slot);
  Py_RETURN_NONE;
}

static PyObject *batch_enter(BatchObject *self, PyObject *Py_UNUSED(a)) {
  Py_INCREF(self);
  return (PyObject *)self;
}

static PyObject *batch_exit(BatchObject *self, PyObject *Py_UNUSED(args)) {
  Py_CLEAR(self->slot);
  Py_RETURN_FALSE;
}

static Py_ssize_t batch_len(BatchObject *self) {
  return (Py_ssize_t)self->size;
}

static PyObject *batch_repr(BatchObject *self) {
  if (self->num_real != self->size)
    return PyUnicode_FromFormat(
        "<ferry.Batch epoch=%u index=%llu size=%u num_real=%u%s>",
        self->epoch, (unsigned long long)self->index, self->size,
        self->num_real, self->slot ? "" : " released");
  return PyUnicode_FromFormat("<ferry.Batch epoch=%u index=%llu size=%u%s>",
                              self->epoch, (unsigned long long)self->index,
                              self->size, self->slot ? "" : " released");
}

static PyMethodDef batch_methods[] = {
    {"release", (PyCFunction)batch_release, METH_NOARGS,
     "release()\n\nDrops the batch's hold on its ring slot. The slot goes "
     "back to the client once no Array, DLPack capsule or tensor made from "
     "the batch lives either. The batch's arrays cannot be taken after "
     "this. Idempotent."},
    {"__enter__", (PyCFunction)batch_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)batch_exit, METH_VARARGS,
     "Calls release()."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef batch_getset[] = {
    {"images", (getter)batch_get_images, NULL,
     "The batch's output as a ferry.Array: uint8 NHWC raw images, or the "
     "augmented float output in the client's dtype and layout; host "
     "memory, or CUDA device memory with device='cuda:N'.",
     NULL},
    {"labels", (getter)batch_get_labels, NULL,
     "The labels, an int64 ferry.Array of len(batch) (host memory).", NULL},
    {"ids", (getter)batch_get_ids, NULL,
     "The record ids, an int64 ferry.Array of len(batch) (host memory): "
     "file index << 40 | record index in the file.",
     NULL},
    {"epoch", (getter)batch_get_epoch, NULL,
     "The epoch every record of the batch belongs to (from 0).", NULL},
    {"index", (getter)batch_get_index, NULL,
     "The batch's number within the job.", NULL},
    {"num_real", (getter)batch_get_num_real, NULL,
     "How many of the batch's records are real: the first num_real. A "
     "ranked client's last batches of an epoch are padded (world_size > 1 "
     "without drop_remainder) by repeating records of the epoch, which a "
     "loss should leave out; 0 for a batch of padding only. len(batch) "
     "otherwise.",
     NULL},
    {"released", (getter)batch_get_released, NULL,
     "Whether release() was called.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PySequenceMethods batch_as_sequence = {
    .sq_length = (lenfunc)batch_len,
};

static PyTypeObject BatchType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ferry.Batch",
    .tp_basicsize = sizeof(BatchObject),
    .tp_dealloc = (destructor)batch_dealloc,
    .tp_repr = (reprfunc)batch_repr,
    .tp_as_sequence = &batch_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc =
        "A batch from Client.next() or iteration: .images, .labels, .ids "
        "(ferry.Array), .epoch, .index, .num_real, len().\n\n"
        "The batch borrows one of the client's `prefetch` ring slots; the "
        "slot goes back when the Batch and every Array, capsule and tensor "
        "made from it are gone (or after release() once those are gone). "
        "Usable as a context manager that releases it on exit.",
    .tp_methods = batch_methods,
    .tp_getset = batch_getset,
};

/* ---- Client: construction ---------------------------------------------- */

/* Optional string argument (None -> NULL). PathLike accepted with
 * `path`. The UTF-8 text stays valid while *keep lives. */
static int arg_str(PyObject *o, const char *name, int path, const char **out,
                   PyObject **keep) {
  *out = NULL;
  *keep = NULL;
  if (o == NULL || o == Py_None)
    return 0;
  PyObject *s;
  if (path) {
    s = PyOS_FSPath(o);
    if (s == NULL)
      return -1;
    if (!PyUnicode_Check(s)) {
      Py_DECREF(s);
      PyErr_Format(PyExc_TypeError, "%s must be a str path", name);
      return -1;
    }
  } else {
    if (!PyUnicode_Check(o)) {
      PyErr_Format(PyExc_TypeError, "%s must be a str or None, not %.100s",
                   name, Py_TYPE(o)->tp_name);
      return -1;
    }
    Py_INCREF(o);
    s = o;
  }
  Py_ssize_t len;
  const char *t = PyUnicode_AsUTF8AndSize(s, &len);
  if (t == NULL) {
    Py_DECREF(s);
    return -1;
  }
  if (strlen(t) != (size_t)len) {
    Py_DECREF(s);
    PyErr_Format(PyExc_ValueError, "%s contains a NUL character", name);
    return -1;
  }
  *out = t;
  *keep = s;
  return 0;
}

/* An int argument in [lo, hi] (bool refused). */
static int arg_u64(PyObject *o, const char *name, unsigned long long lo,
                   unsigned long long hi, unsigned long long *out) {
  if (!PyLong_Check(o) || PyBool_Check(o)) {
    PyErr_Format(PyExc_TypeError, "%s must be an int, not %.100s", name,
                 Py_TYPE(o)->tp_name);
    return -1;
  }
  PyObject *zero = PyLong_FromLong(0);
  if (zero == NULL)
    return -1;
  int below = PyObject_RichCompareBool(o, zero, Py_LT);
  Py_DECREF(zero);
  if (below < 0)
    return -1;
  if (below) {
    PyErr_Format(PyExc_ValueError, "%s must be >= %llu, got %R", name, lo, o);
    return -1;
  }
  unsigned long long v = PyLong_AsUnsignedLongLong(o);
  if (v == (unsigned long long)-1 && PyErr_Occurred()) {
    PyErr_Clear();
    PyErr_Format(PyExc_ValueError, "%s must be <= %llu, got %R", name, hi, o);
    return -1;
  }
  if (v < lo || v > hi) {
    PyErr_Format(PyExc_ValueError, "%s must be in [%llu, %llu], got %R", name,
                 lo, hi, o);
    return -1;
  }
  *out = v;
  return 0;
}

/* A timeout in seconds: None -> -1 (forever), else a real number > 0. */
static int arg_timeout(PyObject *o, const char *name, double *out) {
  if (o == NULL || o == Py_None) {
    *out = -1;
    return 0;
  }
  if (PyBool_Check(o) || !(PyLong_Check(o) || PyFloat_Check(o))) {
    PyErr_Format(PyExc_TypeError,
                 "%s must be a number of seconds or None, not %.100s", name,
                 Py_TYPE(o)->tp_name);
    return -1;
  }
  double v = PyFloat_AsDouble(o);
  if (v == -1 && PyErr_Occurred())
    return -1;
  if (!(v > 0) || !isfinite(v)) {
    PyErr_Format(PyExc_ValueError,
                 "%s must be a finite number of seconds > 0 (or None to "
                 "wait forever), got %R", name, o);
    return -1;
  }
  *out = v;
  return 0;
}

/* Picks `o` among `names` (NULL-terminated); returns its index or -1. */
static int arg_choice(PyObject *o, const char *name, const char *const *names,
                      const char *expected) {
  if (!PyUnicode_Check(o)) {
    PyErr_Format(PyExc_TypeError, "%s must be a str (%s), not %.100s", name,
                 expected, Py_TYPE(o)->tp_name);
    return -1;
  }
  const char *t = PyUnicode_AsUTF8(o);
  if (t == NULL)
    return -1;
  for (int i = 0; names[i] != NULL; i++)
    if (strcmp(t, names[i]) == 0)
      return i;
  PyErr_Format(PyExc_ValueError, "%s must be %s, got %R", name, expected, o);
  return -1;
}

static int parse_device(PyObject *o, int *gpu, int *device) {
  if (!PyUnicode_Check(o)) {
    PyErr_Format(PyExc_TypeError,
                 "device must be a str ('cpu', 'cuda' or 'cuda:N'), not "
                 "%.100s", Py_TYPE(o)->tp_name);
    return -1;
  }
  const char *t = PyUnicode_AsUTF8(o);
  if (t == NULL)
    return -1;
  *gpu = 0;
  *device = 0;
  if (strcmp(t, "cpu") == 0)
    return 0;
  if (strcmp(t, "cuda") == 0) {
    *gpu = 1;
    return 0;
  }
  if (strncmp(t, "cuda:", 5) == 0 && t[5] >= '0' && t[5] <= '9') {
    char *end;
    long v = strtol(t + 5, &end, 10);
    if (*end == '\0' && v >= 0 && v < 1024) {
      *gpu = 1;
      *device = (int)v;
      return 0;
    }
  }
  PyErr_Format(PyExc_ValueError,
               "device must be 'cpu', 'cuda' or 'cuda:N', got %R", o);
  return -1;
}

static int blank(const char *s) {
  if (s == NULL)
    return 1;
  for (; *s; s++)
    if (*s != ' ' && *s != '\t' && *s != '\n' && *s != '\r')
      return 0;
  return 1;
}

static int client_init(ClientObject *self, PyObject *args, PyObject *kwargs) {
  static char *kwlist[] = {
      "dispatcher", "spec",           "dataset_id",   "epochs",
      "job_name",   "mode",           "shuffle",      "seed",
      "on_error",   "batch_size",     "drop_remainder", "prefetch",
      "device",     "dtype",          "layout",       "augment",
      "augment_seed", "timeout",      "tls_ca",       "tls_cert",
      "tls_key",    "token_file",     "rank",         "world_size",
      "order",      "resume",       "share",        NULL};
  PyObject *dispatcher, *spec = Py_None, *dataset_id = Py_None;
  PyObject *epochs = NULL, *job_name = Py_None, *mode = NULL;
  PyObject *shuffle = Py_None, *seed = NULL, *on_error = NULL;
  PyObject *batch_size = Py_None, *drop_remainder = Py_False;
  PyObject *prefetch = Py_None, *device = NULL, *dtype = Py_None;
  PyObject *layout = NULL, *augment = Py_None, *augment_seed = NULL;
  PyObject *timeout = Py_None, *tls_ca = Py_None, *tls_cert = Py_None;
  PyObject *tls_key = Py_None, *token_file = Py_None;
  PyObject *rank = Py_None, *world_size = Py_None, *order = NULL;
  PyObject *resume = Py_None, *share = Py_False;
  Py_buffer resume_buf = {0};
  if (!PyArg_ParseTupleAndKeywords(
          args, kwargs, "O|O$OOOOOOOOOOOOOOOOOOOOOOOOO:Client", kwlist,
          &dispatcher, &spec, &dataset_id, &epochs, &job_name, &mode,
          &shuffle, &seed, &on_error, &batch_size, &drop_remainder,
          &prefetch, &device, &dtype, &layout, &augment, &augment_seed,
          &timeout, &tls_ca, &tls_cert, &tls_key, &token_file, &rank,
          &world_size, &order, &resume, &share))
    return -1;
  if (self->c != NULL || self->closing) {
    PyErr_SetString(PyExc_RuntimeError, "Client.__init__ called twice");
    return -1;
  }

  enum { K_DISP, K_SPEC, K_ID, K_JOB, K_AUG, K_CA, K_CERT, K_KEY, K_TOK, K_N };
  PyObject *keep[K_N] = {0};
  const char *s[K_N] = {0};
  int rc = -1;
  ferry_client_options_t o;
  ferry_client_options_init(&o);

  if (!PyUnicode_Check(dispatcher)) {
    PyErr_Format(PyExc_TypeError,
                 "dispatcher must be a str 'host:port', not %.100s",
                 Py_TYPE(dispatcher)->tp_name);
    goto out;
  }
  if (arg_str(dispatcher, "dispatcher", 0, &s[K_DISP], &keep[K_DISP]) < 0 ||
      arg_str(spec, "spec", 0, &s[K_SPEC], &keep[K_SPEC]) < 0 ||
      arg_str(dataset_id, "dataset_id", 0, &s[K_ID], &keep[K_ID]) < 0 ||
      arg_str(job_name, "job_name", 0, &s[K_JOB], &keep[K_JOB]) < 0 ||
      arg_str(augment, "augment", 0, &s[K_AUG], &keep[K_AUG]) < 0 ||
      arg_str(tls_ca, "tls_ca", 1, &s[K_CA], &keep[K_CA]) < 0 ||
      arg_str(tls_cert, "tls_cert", 1, &s[K_CERT], &keep[K_CERT]) < 0 ||
      arg_str(tls_key, "tls_key", 1, &s[K_KEY], &keep[K_KEY]) < 0 ||
      arg_str(token_file, "token_file", 1, &s[K_TOK], &keep[K_TOK]) < 0)
    goto out;
  if (blank(s[K_DISP])) {
    PyErr_SetString(PyExc_ValueError,
                    "dispatcher must be 'host:port', got an empty string");
    goto out;
  }
  if (blank(s[K_SPEC]) == blank(s[K_ID])) {
    PyErr_SetString(PyExc_ValueError,
                    "give exactly one of spec (a pipeline spec text) and "
                    "dataset_id");
    goto out;
  }
  o.dispatcher = s[K_DISP];
  o.spec = blank(s[K_SPEC]) ? NULL : s[K_SPEC];
  o.dataset_id = blank(s[K_ID]) ? NULL : s[K_ID];
  o.job_name = s[K_JOB];
  o.tls_ca = s[K_CA];
  o.tls_cert = s[K_CERT];
  o.tls_key = s[K_KEY];
  o.token_file = s[K_TOK];

  unsigned long long v;
  if (epochs == NULL) {
    o.num_epochs = 1;
  } else if (epochs == Py_None) {
    o.num_epochs = -1;
  } else {
    if (arg_u64(epochs, "epochs", 0, INT64_MAX, &v) < 0)
      goto out;
    o.num_epochs = (int64_t)v;
  }
  if (mode != NULL) {
    static const char *const modes[] = {"distributed_epoch", "parallel_epochs",
                                        NULL};
    int m = arg_choice(mode, "mode", modes,
                       "'distributed_epoch' or 'parallel_epochs'");
    if (m < 0)
      goto out;
    o.mode = m == 0 ? FERRY_MODE_DISTRIBUTED_EPOCH : FERRY_MODE_PARALLEL_EPOCHS;
  }
  if (shuffle == Py_None) {
    o.shuffle = -1;
  } else if (PyBool_Check(shuffle)) {
    o.shuffle = shuffle == Py_True ? 1 : 0;
  } else {
    PyErr_Format(PyExc_TypeError, "shuffle must be None, True or False, not "
                 "%.100s", Py_TYPE(shuffle)->tp_name);
    goto out;
  }
  if (seed != NULL) {
    if (arg_u64(seed, "seed", 0, UINT64_MAX, &v) < 0)
      goto out;
    o.shuffle_seed = v;
  }
  if (on_error != NULL) {
    static const char *const pols[] = {"fail", "skip", NULL};
    int p = arg_choice(on_error, "on_error", pols, "'fail' or 'skip'");
    if (p < 0)
      goto out;
    o.error_policy = p == 0 ? FERRY_ON_ERROR_FAIL : FERRY_ON_ERROR_SKIP;
  }
  if (batch_size != Py_None) {
    if (arg_u64(batch_size, "batch_size", 1, UINT32_MAX, &v) < 0)
      goto out;
    o.batch_size = (uint32_t)v;
  }
  {
    int t = PyObject_IsTrue(drop_remainder);
    if (t < 0)
      goto out;
    o.drop_remainder = t != 0;
  }
  self->prefetch = PYFERRY_DEFAULT_PREFETCH;
  if (prefetch != Py_None) {
    if (arg_u64(prefetch, "prefetch", 1, 1u << 16, &v) < 0)
      goto out;
    o.prefetch = (uint32_t)v;
    self->prefetch = (uint32_t)v;
  }
  int gpu = 0, dev = 0;
  if (device != NULL && parse_device(device, &gpu, &dev) < 0)
    goto out;
  o.gpu = gpu != 0;
  o.device = dev;
  int nchw = 0;
  if (layout != NULL) {
    static const char *const lays[] = {"NHWC", "NCHW", NULL};
    int l = arg_choice(layout, "layout", lays, "'NHWC' or 'NCHW'");
    if (l < 0)
      goto out;
    nchw = l == 1;
  }
  o.layout = nchw ? FERRY_LAYOUT_NCHW : FERRY_LAYOUT_NHWC;
  int has_aug = !blank(s[K_AUG]);
  /* dtype: None is uint8 for raw host batches, float32 whenever the
   * output is converted (an augment, NCHW, or CUDA device memory). */
  int dt = -1; /* -1: uint8 raw */
  if (dtype != Py_None) {
    static const char *const dts[] = {"uint8", "float32", "float16",
                                      "bfloat16", NULL};
    int d = arg_choice(dtype, "dtype", dts,
                       "'uint8', 'float32', 'float16' or 'bfloat16'");
    if (d < 0)
      goto out;
    if (d == 0) {
      if (has_aug || nchw || gpu) {
        PyErr_Format(PyExc_ValueError,
                     "dtype='uint8' is the raw NHWC host images: it cannot "
                     "be combined with %s; use dtype='float32', "
                     "'float16' or 'bfloat16'",
                     has_aug ? "augment" : nchw ? "layout='NCHW'"
                                                : "a CUDA device");
        goto out;
      }
    } else {
      dt = d == 1 ? FERRY_DTYPE_FLOAT32
                  : d == 2 ? FERRY_DTYPE_FLOAT16 : FERRY_DTYPE_BFLOAT16;
    }
  } else if (has_aug || nchw || gpu) {
    dt = FERRY_DTYPE_FLOAT32;
  }
  if (dt >= 0) {
    o.dtype = (ferry_dtype_t)dt;
    /* A converted output without an augmentation: the identity spec
     * ("flip(none)" parses to no op), which only converts. */
    o.augment = has_aug ? s[K_AUG] : "flip(none)";
  } else {
    o.augment = NULL;
  }
  if (augment_seed != NULL) {
    if (arg_u64(augment_seed, "augment_seed", 0, UINT64_MAX, &v) < 0)
      goto out;
    o.augment_seed = v;
  }
  /* Ranks: both or neither (the `ferry` package's Client
   * fills them in from the launcher's environment). A world of 1 has no
   * ranks. */
  if ((rank == Py_None) != (world_size == Py_None)) {
    PyErr_Format(PyExc_ValueError,
                 "rank and world_size go together: got %s=%R without %s "
                 "(give both, or neither to take them from the launcher's "
                 "environment)",
                 rank != Py_None ? "rank" : "world_size",
                 rank != Py_None ? rank : world_size,
                 rank != Py_None ? "world_size" : "rank");
    goto out;
  }
  if (rank != Py_None) {
    unsigned long long r, w;
    if (arg_u64(world_size, "world_size", 1, UINT32_MAX, &w) < 0 ||
        arg_u64(rank, "rank", 0, UINT32_MAX, &r) < 0)
      goto out;
    if (r >= w) {
      PyErr_Format(PyExc_ValueError,
                   "rank %llu is not below world_size %llu (ranks are 0 .. "
                   "world_size - 1)", r, w);
      goto out;
    }
    if (w > 1) {
      if (blank(s[K_JOB])) {
        PyErr_Format(PyExc_ValueError,
                     "rank %llu of world_size %llu needs a job_name: the "
                     "named job every rank joins (each rank is a Client "
                     "giving the same job_name)", r, w);
        goto out;
      }
      if (o.mode != FERRY_MODE_DISTRIBUTED_EPOCH) {
        PyErr_Format(PyExc_ValueError,
                     "rank %llu of world_size %llu needs "
                     "mode='distributed_epoch' (the ranks share each "
                     "epoch's records)", r, w);
        goto out;
      }
      o.world_size = (uint32_t)w;
      o.rank = (uint32_t)r;
    }
  }
  /* The order of the records in the batches. */
  if (order != NULL) {
    static const char *const orders[] = {"arrival", "deterministic", NULL};
    int m = arg_choice(order, "order", orders,
                       "'arrival' or 'deterministic'");
    if (m < 0)
      goto out;
    o.order = m == 0 ? FERRY_ORDER_ARRIVAL : FERRY_ORDER_DETERMINISTIC;
  }
  if (!PyBool_Check(share)) {
    PyErr_Format(PyExc_TypeError, "share must be True or False, not %.100s",
                 Py_TYPE(share)->tp_name);
    goto out;
  }
  o.share = share == Py_True;
  /* resume= takes what state_dict() returned, or its bytes. */
  if (resume != Py_None) {
    PyObject *cur = resume;
    if (PyDict_Check(resume)) {
      cur = PyDict_GetItemString(resume, "cursor");
      if (cur == NULL) {
        PyErr_SetString(PyExc_ValueError,
                        "resume: a dict from Client.state_dict() has the "
                        "key 'cursor'");
        goto out;
      }
    }
    if (PyObject_GetBuffer(cur, &resume_buf, PyBUF_SIMPLE) < 0) {
      PyErr_Clear();
      PyErr_Format(PyExc_TypeError,
                   "resume must be what Client.state_dict() returned (or "
                   "its 'cursor' bytes), not %.100s", Py_TYPE(cur)->tp_name);
      goto out;
    }
    o.resume = resume_buf.buf;
    o.resume_len = (size_t)resume_buf.len;
  }
  double tmo;
  if (arg_timeout(timeout, "timeout", &tmo) < 0)
    goto out;
  self->timeout = tmo;
  if (tmo > 0) {
    double ms = ceil(tmo * 1e3);
    o.connect_timeout_ms = ms > (double)UINT32_MAX ? UINT32_MAX : (uint32_t)ms;
  }

  ferry_client_t *c = NULL;
  ferry_error_t err = {0};
  int r;
  Py_BEGIN_ALLOW_THREADS
  r = ferry_client_new(&o, &c, &err);
  Py_END_ALLOW_THREADS
  if (r != 0) {
    raise_err(&err, r, CTX_CONNECT);
    goto out;
  }
  self->c = c;
  self->pid = getpid();
  self->job_id = ferry_client_job_id(c);
  self->client_id = ferry_client_id(c);
  if (o.world_size > 1) {
    self->rank = o.rank;
    self->world_size = o.world_size;
    self->steps_per_epoch = ferry_client_steps_per_epoch(c);
    self->dropped_per_epoch = ferry_client_dropped_per_epoch(c);
  }
  rc = 0;
out:
  if (resume_buf.obj != NULL)
    PyBuffer_Release(&resume_buf);
  for (int i = 0; i < K_N; i++)
    Py_XDECREF(keep[i]);
  return rc;
}

static void client_dealloc(ClientObject *self) {
  /* Every _Slot holds a reference and next() runs inside a method call:
   * nothing can be alive or waiting here. */
  self->closing = 1;
  client_free_now(self);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

/* ---- Client: next ------------------------------------------------------- */

/* A forked child may not use its parent's client (libferry refuses too;
 * this names it before anything else, a stashed batch included). Freeing
 * it in the child is safe: libferry then touches nothing. */
static int client_check_forked(ClientObject *self) {
  if (self->c == NULL || self->pid == getpid())
    return 0;
  char msg[400];
  snprintf(msg, sizeof msg,
           "this ferry client was created in process %ld; a forked child "
           "cannot use it: create a new Client in the child (a child "
           "started with multiprocessing's 'spawn' or 'forkserver': gRPC "
           "cannot run in a child forked while a client was open)",
           (long)self->pid);
  raise_ferry(ForkedError, FERRY_EFORKED, msg, CTX_OTHER);
  return -1;
}

static int client_check_open(ClientObject *self) {
  if (client_check_forked(self) < 0)
    return -1;
  if (self->c == NULL || self->closing) {
    raise_ferry(ClosedError, FERRY_ECANCELED,
                self->closing || self->have_last
                    ? "the client is closed"
                    : "the client was not initialised (Client.__init__ "
                      "failed or was not called)",
                CTX_OTHER);
    return -1;
  }
  return 0;
}

/* One ferry_next result: 0 with *out (a batch to wrap), FERRY_EPOCH_END,
 * FERRY_END, or -1 with an exception set. timeout_s < 0 waits forever. */
static int client_fetch(ClientObject *self, double timeout_s,
                        const ferry_batch_t **out) {
  *out = NULL;
  if (client_check_forked(self) < 0)
    return -1;
  if (self->peeked != NULL && self->c != NULL && !self->closing) {
    *out = self->peeked;
    self->peeked = NULL;
    return 0;
  }
  if (client_check_open(self) < 0)
    return -1;
  if (self->ended)
    return FERRY_END;
  if (self->in_next) {
    PyErr_SetString(PyExc_RuntimeError,
                    "next(): another thread is already waiting in next() "
                    "on this client (a client has one consumer)");
    return -1;
  }
  ferry_client_t *c = self->c;
  double deadline = timeout_s < 0 ? INFINITY : now_s() + timeout_s;
  double held_since = -1;
  int result = -1;
  self->in_next = 1;
  for (;;) {
    int slice = PYFERRY_SLICE_MS;
    if (timeout_s >= 0) {
      double left_ms = (deadline - now_s()) * 1e3;
      if (left_ms < slice)
        slice = left_ms < 1 ? 1 : (int)ceil(left_ms);
    }
    const ferry_batch_t *b = NULL;
    ferry_error_t err = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ferry_next(c, &b, slice, &err);
    Py_END_ALLOW_THREADS
    if (self->closing) {
      if (rc == 0 && b != NULL)
        ferry_batch_release(c, b);
      raise_ferry(ClosedError, FERRY_ECANCELED,
                  "next(): the client was closed while waiting", CTX_OTHER);
      break;
    }
    if (rc == 0) {
      /* A Ctrl-C that came while ferry_next waited would be raised by the
       * interpreter right after next() returns, and the batch returned
       * would be dropped unseen (a notebook that caught the interrupt and
       * went on silently missed those records): raise it here and keep
       * the batch for the following call. */
      if (PyErr_CheckSignals() < 0) {
        self->peeked = b;
        break;
      }
      *out = b;
      result = 0;
      break;
    }
    if (rc == FERRY_EPOCH_END || rc == FERRY_END) {
      if (rc == FERRY_END)
        self->ended = 1;
      result = rc;
      break;
    }
    if (rc == FERRY_ETIMEDOUT) {
      if (PyErr_CheckSignals() < 0)
        break;
      if (timeout_s >= 0 && now_s() >= deadline) {
        char msg[160];
        snprintf(msg, sizeof msg, "next(): no batch within %.3f s "
                 "(timeout)", timeout_s);
        raise_ferry(FerryTimeoutError, FERRY_ETIMEDOUT, msg, CTX_NEXT);
        break;
      }
      continue;
    }
    if (rc == FERRY_EINVAL && strstr(err.msg, "batches are held") != NULL) {
      /* Every slot is held. libferry answers this at once, but the job's
       * or the epoch's end may be a heartbeat away (list(client) over a
       * job of exactly `prefetch` batches), and another thread may drop a
       * batch: poll for up to PYFERRY_HELD_GRACE_MS (bounded by the
       * timeout) before raising. */
      double now = now_s();
      if (held_since < 0)
        held_since = now;
      if ((now - held_since) * 1e3 < PYFERRY_HELD_GRACE_MS &&
          (timeout_s < 0 || now < deadline)) {
        struct timespec pause = {0, PYFERRY_HELD_POLL_MS * 1000000L};
        Py_BEGIN_ALLOW_THREADS
        nanosleep(&pause, NULL);
        Py_END_ALLOW_THREADS
        if (PyErr_CheckSignals() < 0)
          break;
        continue;
      }
      char msg[640];
      snprintf(msg, sizeof msg,
               "next(): all %u batches of the client's ring (prefetch=%u) "
               "are held by Python objects: a Batch keeps its slot while "
               "it, or any Array, DLPack capsule or tensor made from it, is "
               "alive. Drop those (or call batch.release() and drop the "
               "tensors) before asking for the next batch, copy what must "
               "be kept, or create the Client with a larger prefetch",
               self->prefetch, self->prefetch);
      raise_ferry(FerryError, FERRY_EINVAL, msg, CTX_NEXT);
      break;
    }
    raise_err(&err, rc, CTX_NEXT);
    break;
  }
  self->in_next = 0;
  client_maybe_free(self);
  return result;
}

static double arg_next_timeout(ClientObject *self, PyObject *o, int *bad) {
  *bad = 0;
  if (o == NULL || o == Py_None)
    return self->timeout;
  double t;
  if (arg_timeout(o, "timeout", &t) < 0) {
    *bad = 1;
    return 0;
  }
  return t;
}

static PyObject *client_iternext(ClientObject *self) {
  for (;;) {
    const ferry_batch_t *b;
    int r = client_fetch(self, self->timeout, &b);
    if (r == 0)
      return batch_new(self, b);
    if (r == FERRY_EPOCH_END) {
      self->epoch_open = 0;
      continue;
    }
    return NULL; /* FERRY_END (StopIteration) or an error */
  }
}

static PyObject *client_next(ClientObject *self, PyObject *args,
                             PyObject *kwargs) {
  static char *kwlist[] = {"timeout", NULL};
  PyObject *timeout = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:next", kwlist, &timeout))
    return NULL;
  int bad;
  double t = arg_next_timeout(self, timeout, &bad);
  if (bad)
    return NULL;
  for (;;) {
    const ferry_batch_t *b;
    int r = client_fetch(self, t, &b);
    if (r == 0)
      return batch_new(self, b);
    if (r == FERRY_EPOCH_END) {
      self->epoch_open = 0;
      continue;
    }
    if (r == FERRY_END)
      PyErr_SetNone(PyExc_StopIteration);
    return NULL;
  }
}

static PyObject *client_iter(ClientObject *self) {
  Py_INCREF(self);
  return (PyObject *)self;
}

/* ---- Client: epochs() ------------------------------------------------- */

typedef struct {
  PyObject_HEAD
  ClientObject *client;
  uint64_t seq;
  int done;
} EpochObject;

static PyTypeObject EpochType, EpochsType;

static void epoch_dealloc(EpochObject *self) {
  Py_XDECREF(self->client);
  PyObject_Free(self);
}

static PyObject *self_iter(PyObject *self) {
  Py_INCREF(self);
  return self;
}

static PyObject *epoch_iternext(EpochObject *self) {
  ClientObject *cl = self->client;
  if (self->done || cl->epoch_seq != self->seq || !cl->epoch_open) {
    self->done = 1;
    return NULL;
  }
  const ferry_batch_t *b;
  int r = client_fetch(cl, cl->timeout, &b);
  if (r == 0)
    return batch_new(cl, b);
  if (r == FERRY_EPOCH_END || r == FERRY_END) {
    self->done = 1;
    cl->epoch_open = 0;
  }
  return NULL;
}

static PyTypeObject EpochType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ferry._ferry.Epoch",
    .tp_basicsize = sizeof(EpochObject),
    .tp_dealloc = (destructor)epoch_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The batches of one epoch (from Client.epochs()); stops at the "
              "epoch's end.",
    .tp_iter = self_iter,
    .tp_iternext = (iternextfunc)epoch_iternext,
};

static PyObject *epochs_iternext(EpochObject *self) {
  ClientObject *cl = self->client;
  if (self->done)
    return NULL;
  /* The rest of an epoch the trainer left is dropped. */
  while (cl->epoch_open) {
    const ferry_batch_t *b;
    int r = client_fetch(cl, cl->timeout, &b);
    if (r < 0)
      return NULL;
    if (r == 0) {
      ferry_batch_release(cl->c, b);
      continue;
    }
    cl->epoch_open = 0;
  }
  for (;;) {
    /* Look ahead: a job that just ended has no further epoch. */
    const ferry_batch_t *b;
    int r = client_fetch(cl, cl->timeout, &b);
    if (r < 0)
      return NULL;
    if (r == FERRY_END) {
      self->done = 1;
      return NULL;
    }
    if (r == FERRY_EPOCH_END)
      continue; /* an epoch without a batch */
    cl->peeked = b;
    break;
  }
  EpochObject *e = PyObject_New(EpochObject, &EpochType);
  if (e == NULL)
    return NULL;
  Py_INCREF(cl);
  e->client = cl;
  e->seq = ++cl->epoch_seq;
  e->done = 0;
  cl->epoch_open = 1;
  return (PyObject *)e;
}

static PyTypeObject EpochsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ferry._ferry.Epochs",
    .tp_basicsize = sizeof(EpochObject),
    .tp_dealloc = (destructor)epoch_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An iterator of epochs (from Client.epochs()), each an iterator "
              "of batches.",
    .tp_iter = self_iter,
    .tp_iternext = (iternextfunc)epochs_iternext,
};

static PyObject *client_epochs(ClientObject *self, PyObject *Py_UNUSED(a)) {
  if (client_check_open(self) < 0)
    return NULL;
  EpochObject *e = PyObject_New(EpochObject, &EpochsType);
  if (e == NULL)
    return NULL;
  Py_INCREF(self);
  e->client = self;
  e->seq = 0;
  e->done = 0;
  return (PyObject *)e;
}

/* ---- Client: the rest ---------------------------------------------------- */

static int dict_set(PyObject *d, const char *k, PyObject *v) {
  if (v == NULL)
    return -1;
  int r = PyDict_SetItemString(d, k, v);
  Py_DECREF(v);
  return r;
}

/* The checkpoint cursor, in the protocol of torchdata's stateful
 * loaders (torch.save of a checkpoint carries the dict). */
static PyObject *client_state_dict(ClientObject *self,
                                   PyObject *Py_UNUSED(a)) {
  uint8_t buf[FERRY_CLIENT_CURSOR_MAX];
  size_t len = 0;
  ferry_error_t err = {0};
  if (client_check_open(self) < 0)
    return NULL;
  int rc = ferry_client_state(self->c, buf, sizeof(buf), &len, &err);
  if (rc != 0)
    return raise_err(&err, rc, CTX_OTHER);
  return Py_BuildValue("{s:y#}", "cursor", (const char *)buf,
                       (Py_ssize_t)len);
}

static PyObject *client_stats(ClientObject *self, PyObject *Py_UNUSED(a)) {
  ferry_client_stats_t st;
  if (client_check_forked(self) < 0)
    return NULL;
  if (self->c != NULL)
    ferry_client_stats(self->c, &st);
  else if (self->have_last)
    st = self->last;
  else
    return raise_ferry(ClosedError, FERRY_ECANCELED,
                       "the client was not initialised", CTX_OTHER);
  PyObject *d = PyDict_New();
  if (d == NULL)
    return NULL;
  double t = st.total_seconds;
  if (dict_set(d, "batches", PyLong_FromUnsignedLongLong(st.batches)) < 0 ||
      dict_set(d, "records", PyLong_FromUnsignedLongLong(st.records)) < 0 ||
      dict_set(d, "bytes", PyLong_FromUnsignedLongLong(st.bytes)) < 0 ||
      dict_set(d, "wait_seconds", PyFloat_FromDouble(st.wait_seconds)) < 0 ||
      dict_set(d, "total_seconds", PyFloat_FromDouble(t)) < 0 ||
      dict_set(d, "stall_fraction", PyFloat_FromDouble(st.stall_fraction)) <
          0 ||
      dict_set(d, "batches_per_second",
               PyFloat_FromDouble(t > 0 ? (double)st.batches / t : 0.0)) < 0 ||
      dict_set(d, "records_per_second",
               PyFloat_FromDouble(t > 0 ? (double)st.records / t : 0.0)) < 0 ||
      dict_set(d, "workers", PyLong_FromUnsignedLong(st.workers)) < 0 ||
      dict_set(d, "records_acked",
               PyLong_FromUnsignedLongLong(st.records_acked)) < 0 ||
      dict_set(d, "held_records_peak",
               PyLong_FromUnsignedLongLong(st.held_records_peak)) < 0 ||
      dict_set(d, "records_placed_ahead",
               PyLong_FromUnsignedLongLong(st.records_placed_ahead)) < 0 ||
      dict_set(d, "held", PyLong_FromSsize_t(self->live)) < 0) {
    Py_DECREF(d);
    return NULL;
  }
  return d;
}

static PyObject *client_close(ClientObject *self, PyObject *Py_UNUSED(a)) {
  self->closing = 1;
  client_maybe_free(self);
  Py_RETURN_NONE;
}

static PyObject *client_enter(ClientObject *self, PyObject *Py_UNUSED(a)) {
  if (client_check_open(self) < 0)
    return NULL;
  Py_INCREF(self);
  return (PyObject *)self;
}

static PyObject *client_exit(ClientObject *self, PyObject *Py_UNUSED(args)) {
  self->closing = 1;
  client_maybe_free(self);
  Py_RETURN_FALSE;
}

static PyObject *client_get_job_id(ClientObject *self, void *Py_UNUSED(c)) {
  return PyLong_FromUnsignedLongLong(self->job_id);
}
static PyObject *client_get_client_id(ClientObject *self,
                                      void *Py_UNUSED(c)) {
  return PyLong_FromUnsignedLongLong(self->client_id);
}
static PyObject *client_get_closed(ClientObject *self, void *Py_UNUSED(c)) {
  return PyBool_FromLong(self->closing || self->c == NULL);
}
static PyObject *client_get_prefetch(ClientObject *self, void *Py_UNUSED(c)) {
  return PyLong_FromUnsignedLong(self->prefetch);
}
static PyObject *client_get_timeout(ClientObject *self, void *Py_UNUSED(c)) {
  if (self->timeout < 0)
    Py_RETURN_NONE;
  return PyFloat_FromDouble(self->timeout);
}

/* Ranks: None for a client without ranks. */
static PyObject *client_get_rank(ClientObject *self, void *Py_UNUSED(c)) {
  if (self->world_size <= 1)
    Py_RETURN_NONE;
  return PyLong_FromUnsignedLong(self->rank);
}
static PyObject *client_get_world_size(ClientObject *self,
                                       void *Py_UNUSED(c)) {
  if (self->world_size <= 1)
    Py_RETURN_NONE;
  return PyLong_FromUnsignedLong(self->world_size);
}
static PyObject *client_get_steps_per_epoch(ClientObject *self,
                                            void *Py_UNUSED(c)) {
  if (self->world_size <= 1)
    Py_RETURN_NONE;
  /* The current epoch's (an epoch resumed with another world size has
   * its own); the last one known once the client is closed. */
  if (self->c != NULL && self->pid == getpid())
    self->steps_per_epoch = ferry_client_steps_per_epoch(self->c);
  return PyLong_FromUnsignedLongLong(self->steps_per_epoch);
}
static PyObject *client_get_dropped_per_epoch(ClientObject *self,
                                              void *Py_UNUSED(c)) {
  if (self->world_size <= 1)
    Py_RETURN_NONE;
  return PyLong_FromUnsignedLongLong(self->dropped_per_epoch);
}

static PyObject *client_repr(ClientObject *self) {
  if (self->world_size > 1)
    return PyUnicode_FromFormat(
        "<ferry.Client job_id=%llu client_id=%llu rank=%u/%u held=%zd%s>",
        (unsigned long long)self->job_id, (unsigned long long)self->client_id,
        self->rank, self->world_size, self->live,
        self->closing || self->c == NULL ? " closed" : "");
  return PyUnicode_FromFormat(
      "<ferry.Client job_id=%llu client_id=%llu held=%zd%s>",
      (unsigned long long)self->job_id, (unsigned long long)self->client_id,
      self->live, self->closing || self->c == NULL ? " closed" : "");
}

static PyMethodDef client_methods[] = {
    {"next", (PyCFunction)(void (*)(void))client_next,
     METH_VARARGS | METH_KEYWORDS,
     "next(timeout=None) -> Batch\n\n"
     "The next batch of the job (epoch boundaries are skipped: batch.epoch "
     "says which). Raises StopIteration at the job's end, "
     "ferry.TimeoutError after `timeout` seconds (None: the Client's "
     "timeout), ferry.ClosedError if the client is or gets closed, "
     "ferry.Error when all `prefetch` batches are held, and the "
     "library's error otherwise. Releases the GIL while it waits; Ctrl-C "
     "interrupts it. One thread at a time (RuntimeError otherwise)."},
    {"epochs", (PyCFunction)client_epochs, METH_NOARGS,
     "epochs() -> iterator of iterators of Batch\n\n"
     "Yields one iterator per epoch, each stopping at that epoch's end:\n\n"
     "    for epoch in client.epochs():\n"
     "        for batch in epoch: ...\n\n"
     "Moving on to the next epoch drops what is left of the current one."},
    {"state_dict", (PyCFunction)client_state_dict, METH_NOARGS,
     "state_dict() -> dict\n\n"
     "A checkpoint cursor ({'cursor': bytes}, at most 4 KiB, versioned): "
     "the batch after the last one next() returned, in deterministic "
     "order. Save it with the model (torch.save) and pass it back as "
     "Client(..., resume=state_dict) to resume the job exactly there. "
     "Every rank of a synchronous job at one step has the same cursor."},
    {"stats", (PyCFunction)client_stats, METH_NOARGS,
     "stats() -> dict\n\n"
     "The client's counters: batches, records, bytes, wait_seconds, "
     "total_seconds, stall_fraction (wait / total), batches_per_second, "
     "records_per_second, workers (streams open), records_acked, "
     "held_records_peak (order='deterministic': the most records that "
     "waited for their turn at once), records_placed_ahead (records that "
     "came before their turn and went straight into their batch), held "
     "(batches currently held by Python objects). After close(), the "
     "counters as they were when the client was freed."},
    {"close", (PyCFunction)client_close, METH_NOARGS,
     "close()\n\n"
     "Closes the client: next() raises ferry.ClosedError from now on (a "
     "next() waiting in another thread within 100 ms). The C client says "
     "goodbye to the dispatcher and is freed once no batch (or tensor made "
     "from one) is alive. Idempotent."},
    {"__enter__", (PyCFunction)client_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)client_exit, METH_VARARGS, "Calls close()."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef client_getset[] = {
    {"job_id", (getter)client_get_job_id, NULL, "The job's id.", NULL},
    {"client_id", (getter)client_get_client_id, NULL,
     "This client's id within the job.", NULL},
    {"closed", (getter)client_get_closed, NULL,
     "Whether close() was called.", NULL},
    {"prefetch", (getter)client_get_prefetch, NULL,
     "The ring's depth: how many batches may be held at once.", NULL},
    {"timeout", (getter)client_get_timeout, NULL,
     "The timeout of next() in seconds, or None.", NULL},
    {"rank", (getter)client_get_rank, NULL,
     "This client's rank (0 .. world_size - 1), or None without ranks.",
     NULL},
    {"world_size", (getter)client_get_world_size, NULL,
     "The number of ranks (> 1), or None without ranks.", NULL},
    {"steps_per_epoch", (getter)client_get_steps_per_epoch, NULL,
     "The batches every rank receives per epoch, each of exactly "
     "batch_size records (known from the constructor on: LR schedules, "
     "len() of a DataLoader), or None without ranks.",
     NULL},
    {"dropped_per_epoch", (getter)client_get_dropped_per_epoch, NULL,
     "The records of each epoch no rank receives (drop_remainder=True: "
     "the last partial round; 0 under padding), or None without ranks.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL}};

PyDoc_STRVAR(client_doc,
"Client(dispatcher, spec=None, *, dataset_id=None, epochs=1, job_name=None,\n"
"       mode='distributed_epoch', shuffle=None, seed=0, on_error='fail',\n"
"       batch_size=None, drop_remainder=False, prefetch=None, device='cpu',\n"
"       dtype=None, layout='NHWC', augment=None, augment_seed=0,\n"
"       timeout=None, tls_ca=None, tls_cert=None, tls_key=None,\n"
"       token_file=None, rank=None, world_size=None, order='arrival',\n"
"       resume=None, share=False)\n"
"\n"
"A trainer's connection to a Ferry cluster: registers the dataset (`spec`,\n"
"a pipeline spec text, or `dataset_id`), joins or creates the job and\n"
"streams its batches. An iterator of Batch over every epoch and a context\n"
"manager that closes it.\n"
"\n"
"epochs: int >= 1; 0 = the spec's repeat(); None = forever.\n"
"mode: 'distributed_epoch' (each record once per epoch over all the job's\n"
"  clients) or 'parallel_epochs' (every client sees everything).\n"
"shuffle: None (as the spec says), True or False; seed: the shuffle seed.\n"
"on_error: 'fail' or 'skip' (bad records).\n"
"batch_size: None (the spec's batch()) or an int; drop_remainder drops\n"
"  each epoch's last partial batch.\n"
"prefetch: the ring's depth (default 3): how many batches are assembled\n"
"  ahead, and how many Python may hold at once.\n"
"device: 'cpu', 'cuda' or 'cuda:N' (batches staged to the GPU).\n"
"dtype: None (uint8 raw images; float32 with augment, NCHW or a GPU),\n"
"  'uint8', 'float32', 'float16' or 'bfloat16'. A float dtype without\n"
"  augment only converts. layout: 'NHWC' or 'NCHW'.\n"
"augment: libferry's augment text, e.g.\n"
"  'flip(horizontal) | rotate(0.1) | zoom(0.1) | rescale(1/255)';\n"
"  augment_seed keys the random parameters.\n"
"timeout: seconds (float) bounding the connection and each next(), or\n"
"  None (connect within libferry's default 5 s; next() waits forever).\n"
"tls_ca, tls_cert, tls_key, token_file: TLS and bearer-token files.\n"
"rank, world_size: both or neither. world_size > 1 makes this client rank\n"
"  `rank` of the named job `job_name` (data-parallel trainers): every rank\n"
"  gets steps_per_epoch batches of exactly batch_size records per epoch;\n"
"  drop_remainder drops the last partial round, else it is padded\n"
"  (Batch.num_real). ferry.Client takes them from the launcher's\n"
"  environment when both are None (ferry.launcher_rank()).\n"
"share: True shares what the workers produce with the other sharing jobs\n"
"  of the same dataset, spec and seed (a sweep's trainers): each record\n"
"  is produced once and reaches every trainer once per epoch, each at its\n"
"  own pace; False (the default): the job's own production.\n"
"\n"
"Raises TypeError/ValueError for bad arguments, ferry.SpecError for a bad\n"
"spec or augment text, ferry.UnreachableError when the dispatcher does not\n"
"answer in time, ferry.Error otherwise.");

static PyTypeObject ClientType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    /* ferry.Client is a Python subclass (ferry/__init__.py) that takes
     * rank and world_size from the launcher's environment. */
    .tp_name = "ferry._ferry.Client",
    .tp_basicsize = sizeof(ClientObject),
    .tp_dealloc = (destructor)client_dealloc,
    .tp_repr = (reprfunc)client_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = client_doc,
    .tp_iter = (getiterfunc)client_iter,
    .tp_iternext = (iternextfunc)client_iternext,
    .tp_methods = client_methods,
    .tp_getset = client_getset,
    .tp_init = (initproc)client_init,
    .tp_new = PyType_GenericNew,
};

/* ---- Module functions ----------------------------------------------------- */

static PyObject *mod_version(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(a)) {
  return PyUnicode_FromString(ferry_version());
}

static PyObject *mod_memory_stats(PyObject *Py_UNUSED(m),
                                  PyObject *Py_UNUSED(a)) {
  int64_t bytes = 0, blocks = 0;
  ferry_memory_stats(&bytes, &blocks);
  return Py_BuildValue("{s:L,s:L}", "bytes", (long long)bytes, "blocks",
                       (long long)blocks);
}

static PyObject *mod_augment_cpu(PyObject *Py_UNUSED(m), PyObject *args,
                                 PyObject *kwargs) {
  static char *kwlist[] = {"images", "shape", "augment", "seed", "epoch",
                           "index",  "dtype", "layout",  NULL};
  PyObject *images, *shape, *augment, *seed = NULL, *epoch = NULL,
                                      *index = NULL, *dtype = NULL,
                                      *layout = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|$OOOOO:augment_cpu",
                                   kwlist, &images, &shape, &augment, &seed,
                                   &epoch, &index, &dtype, &layout))
    return NULL;
  unsigned long long dims[4], v_seed = 0, v_epoch = 0, v_index = 0;
  PyObject *seq = PySequence_Fast(shape, "shape must be a tuple (n, h, w, c)");
  if (seq == NULL)
    return NULL;
  if (PySequence_Fast_GET_SIZE(seq) != 4) {
    Py_DECREF(seq);
    PyErr_SetString(PyExc_ValueError, "shape must be (n, h, w, c)");
    return NULL;
  }
  static const char *const dn[] = {"shape[0] (n)", "shape[1] (h)",
                                   "shape[2] (w)", "shape[3] (c)"};
  for (int i = 0; i < 4; i++) {
    if (arg_u64(PySequence_Fast_GET_ITEM(seq, i), dn[i], 1,
                i == 0 ? (unsigned long long)PY_SSIZE_T_MAX : UINT32_MAX,
                &dims[i]) < 0) {
      Py_DECREF(seq);
      return NULL;
    }
  }
  Py_DECREF(seq);
  if ((seed && arg_u64(seed, "seed", 0, UINT64_MAX, &v_seed) < 0) ||
      (epoch && arg_u64(epoch, "epoch", 0, UINT64_MAX, &v_epoch) < 0) ||
      (index && arg_u64(index, "index", 0, UINT64_MAX, &v_index) < 0))
    return NULL;
  ferry_dtype_t dt = FERRY_DTYPE_FLOAT32;
  if (dtype != NULL) {
    static const char *const dts[] = {"float32", "float16", "bfloat16", NULL};
    int d = arg_choice(dtype, "dtype", dts,
                       "'float32', 'float16' or 'bfloat16'");
    if (d < 0)
      return NULL;
    dt = d == 0 ? FERRY_DTYPE_FLOAT32
                : d == 1 ? FERRY_DTYPE_FLOAT16 : FERRY_DTYPE_BFLOAT16;
  }
  ferry_layout_t lay = FERRY_LAYOUT_NHWC;
  if (layout != NULL) {
    static const char *const lays[] = {"NHWC", "NCHW", NULL};
    int l = arg_choice(layout, "layout", lays, "'NHWC' or 'NCHW'");
    if (l < 0)
      return NULL;
    lay = l == 1 ? FERRY_LAYOUT_NCHW : FERRY_LAYOUT_NHWC;
  }
  const char *text;
  PyObject *keep;
  if (arg_str(augment, "augment", 0, &text, &keep) < 0)
    return NULL;
  ferry_augment_spec_t spec;
  ferry_error_t err = {0};
  int rc = ferry_augment_spec_parse(text ? text : "", &spec, &err);
  Py_XDECREF(keep);
  if (rc != 0)
    return raise_err(&err, rc, CTX_OTHER);
  size_t n = (size_t)dims[0];
  uint32_t h = (uint32_t)dims[1], w = (uint32_t)dims[2], c = (uint32_t)dims[3];
  size_t out_bytes = ferry_augment_out_bytes(n, h, w, c, dt);
  if (out_bytes == 0 || out_bytes > (size_t)PY_SSIZE_T_MAX) {
    ferry_augment_spec_close(&spec);
    PyErr_SetString(PyExc_ValueError, "augment_cpu: shape too large");
    return NULL;
  }
  Py_buffer in;
  if (PyObject_GetBuffer(images, &in, PyBUF_C_CONTIGUOUS) < 0) {
    ferry_augment_spec_close(&spec);
    return NULL;
  }
  /* n*h*w*c bytes, computed without overflow: out_bytes bounds it. */
  size_t in_bytes = n * h * w * c;
  if (in.itemsize != 1 || (size_t)in.len != in_bytes) {
    PyBuffer_Release(&in);
    ferry_augment_spec_close(&spec);
    PyErr_Format(PyExc_ValueError,
                 "augment_cpu: images has %zd bytes, shape (%zu, %u, %u, %u) "
                 "needs %zu (uint8 NHWC)",
                 in.len, n, h, w, c, in_bytes);
    return NULL;
  }
  PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)out_bytes);
  if (out == NULL) {
    PyBuffer_Release(&in);
    ferry_augment_spec_close(&spec);
    return NULL;
  }
  Py_BEGIN_ALLOW_THREADS
  rc = ferry_augment_batch_cpu(&spec, v_seed, v_epoch, v_index,
                               (const uint8_t *)in.buf, n, h, w, c,
                               PyBytes_AS_STRING(out), dt, lay, &err);
  Py_END_ALLOW_THREADS
  PyBuffer_Release(&in);
  ferry_augment_spec_close(&spec);
  if (rc != 0) {
    Py_DECREF(out);
    return raise_err(&err, rc, CTX_OTHER);
  }
  return out;
}

static PyMethodDef module_methods[] = {
    {"version", mod_version, METH_NOARGS,
     "version() -> str\n\nThe version of the libferry loaded (ferry_version())."},
    {"memory_stats", mod_memory_stats, METH_NOARGS,
     "memory_stats() -> dict\n\n"
     "Live allocations made by libferry, process-wide: {'bytes': int, "
     "'blocks': int} (ferry_memory_stats). For leak checks."},
    {"augment_cpu", (PyCFunction)(void (*)(void))mod_augment_cpu,
     METH_VARARGS | METH_KEYWORDS,
     "augment_cpu(images, shape, augment, *, seed=0, epoch=0, index=0, "
     "dtype='float32', layout='NHWC') -> bytes\n\n"
     "Runs libferry's CPU twin (ferry_augment_batch_cpu) over `images`, a "
     "C-contiguous uint8 NHWC buffer of shape (n, h, w, c), with the "
     "augment text `augment` ('' only converts) and the random parameters "
     "of (seed, epoch, batch index, image index): the exact bytes a "
     "client with that augment, augment_seed, dtype and layout delivers "
     "for that batch."},
    {NULL, NULL, 0, NULL}};

PyDoc_STRVAR(module_doc,
"The C extension behind the `ferry` package (libferry's Python binding).\n"
"Import `ferry` instead.");

static struct PyModuleDef ferry_module = {
    PyModuleDef_HEAD_INIT, "_ferry", module_doc, -1, module_methods,
    NULL, NULL, NULL, NULL};

static PyObject *new_error(PyObject *m, const char *name, PyObject *bases,
                           const char *doc) {
  char full[64];
  snprintf(full, sizeof full, "ferry.%s", name);
  PyObject *e = PyErr_NewExceptionWithDoc(full, doc, bases, NULL);
  if (e == NULL)
    return NULL;
  if (PyModule_AddObjectRef(m, name, e) < 0) {
    Py_DECREF(e);
    return NULL;
  }
  return e;
}

static PyObject *new_error2(PyObject *m, const char *name, PyObject *extra,
                            const char *doc) {
  PyObject *bases = PyTuple_Pack(2, FerryError, extra);
  if (bases == NULL)
    return NULL;
  PyObject *e = new_error(m, name, bases, doc);
  Py_DECREF(bases);
  return e;
}

PyMODINIT_FUNC PyInit__ferry(void); /* -Wmissing-prototypes */
PyMODINIT_FUNC PyInit__ferry(void) {
  PyTypeObject *types[] = {&SlotType, &ArrayType, &BatchType, &EpochType,
                           &EpochsType, &ClientType};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
    if (PyType_Ready(types[i]) < 0)
      return NULL;
  PyObject *m = PyModule_Create(&ferry_module);
  if (m == NULL)
    return NULL;
  if (PyModule_AddObjectRef(m, "Client", (PyObject *)&ClientType) < 0 ||
      PyModule_AddObjectRef(m, "Batch", (PyObject *)&BatchType) < 0 ||
      PyModule_AddObjectRef(m, "Array", (PyObject *)&ArrayType) < 0 ||
      PyModule_AddStringConstant(m, "FERRY_VERSION_STRING",
                                 FERRY_VERSION_STRING) < 0)
    goto fail;
  if ((FerryError = new_error(
           m, "Error", PyExc_Exception,
           "A libferry error: .code is the negative FERRY_E* code, "
           ".code_name its name (e.g. 'ESPEC'), the message the C "
           "library's text.")) == NULL ||
      (SpecError = new_error2(
           m, "SpecError", PyExc_ValueError,
           "The pipeline spec or augment text does not parse; the message "
           "names the column.")) == NULL ||
      (RecordError = new_error(
           m, "RecordError", FerryError,
           "A bad record (corrupt file, malformed Example, wrong image "
           "size) under on_error='fail'; the message names the file and "
           "byte offset.")) == NULL ||
      (UnreachableError = new_error2(
           m, "UnreachableError", PyExc_ConnectionError,
           "The dispatcher did not answer within its timeout.")) == NULL ||
      (WorkerError = new_error(
           m, "WorkerError", FerryError,
           "A worker failed (its stream broke, or the dispatcher failed the "
           "job because of a worker's task).")) == NULL ||
      (FerryTimeoutError = new_error2(
           m, "TimeoutError", PyExc_TimeoutError,
           "next() got no batch within its timeout.")) == NULL ||
      (ClosedError = new_error(
           m, "ClosedError", FerryError,
           "The client is closed (close() was called, possibly from "
           "another thread while next() waited).")) == NULL ||
      (CancelledError = new_error(
           m, "CancelledError", FerryError,
           "An operator cancelled the job (ferryctl job cancel); the "
           "message names the job.")) == NULL ||
      (ForkedError = new_error(
           m, "ForkedError", FerryError,
           "The client was created in another process: a forked child "
           "cannot use its parent's client, nor (gRPC) create one while "
           "the parent's was open.")) == NULL)
    goto fail;
  return m;
fail:
  Py_DECREF(m);
  return NULL;
}

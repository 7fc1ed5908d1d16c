/* The DLPack v0.8 tensor structs (https://dmlc.github.io/dlpack/), written
 * from the public specification so that libferry needs no extra header.
 * Field order, types and enum values are the specification's, so these
 * structs are ABI-compatible with every DLPack 0.8 consumer (PyTorch's
 * torch.utils.dlpack, JAX, CuPy).
 *
 * The include guard is upstream dlpack.h's: whichever of the two headers
 * comes first defines the (identical) types and the other is skipped.
 */
#ifndef DLPACK_DLPACK_H_
#define DLPACK_DLPACK_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DLPACK_VERSION 80
#define DLPACK_ABI_VERSION 1

/* Where a tensor's memory lives. */
typedef enum {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3, /* pinned host memory from cudaMallocHost */
  kDLOpenCL = 4,
  kDLVulkan = 7,
  kDLMetal = 8,
  kDLVPI = 9,
  kDLROCM = 10,
  kDLROCMHost = 11,
  kDLExtDev = 12,
  kDLCUDAManaged = 13,
  kDLOneAPI = 14,
  kDLWebGPU = 15,
  kDLHexagon = 16
} DLDeviceType;

typedef struct {
  DLDeviceType device_type;
  int32_t device_id; /* the CUDA device ordinal; 0 for the CPU */
} DLDevice;

typedef enum {
  kDLInt = 0,
  kDLUInt = 1,
  kDLFloat = 2,
  kDLOpaqueHandle = 3,
  kDLBfloat = 4,
  kDLComplex = 5,
  kDLBool = 6
} DLDataTypeCode;

/* An element type: code (a DLDataTypeCode), bits per lane, lanes. */
typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

/* A strided view of memory. strides == NULL means compact row-major. */
typedef struct {
  void *data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t *shape;
  int64_t *strides;
  uint64_t byte_offset;
} DLTensor;

/* A tensor with its owner: the consumer calls deleter(self) once it no
 * longer needs the memory (deleter may be NULL). */
typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

#ifdef __cplusplus
}
#endif

#endif /* DLPACK_DLPACK_H_ */

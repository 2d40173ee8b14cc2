// A stand-in libcuda.so.1 for a host with no GPU: the CUDA driver API entry points that
// Triton's NVIDIA launcher calls, answering as one H200 (sm_90) would, so that a kernel
// launch runs Triton's whole JIT path (binder, compile, launcher build, argument packing)
// up to the driver. Modules are read from the cubin Triton hands over (its registers and
// local memory a thread, from the ELF's .nv.info); a launch is checked as the driver
// checks it (block size, the register file, dynamic shared memory beyond 48 KB only once
// opted in) and appended as one JSON line to the file $STUB_CUDA_LOG, not run.
// Built against Triton's bundled cuda.h, so every signature and enum is the driver's.
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define H200_SMS 132
#define H200_SHARED_OPTIN 232448  // 227 KB a block
#define H200_SHARED_PER_SM 233472
#define REGISTER_FILE 65536
#define EIATTR_FRAME_SIZE 0x11
#define EIATTR_REGCOUNT 0x2f

struct CUmod_st { int regs, frame_bytes; };
struct CUfunc_st { char name[256]; int regs, frame_bytes, dynamic_shared_max; };
struct CUctx_st { int unused; };
static struct CUctx_st context;

// The driver keeps a function's registers and frame in the cubin's .nv.info section as
// (format, attribute, size, value) records: EIFMT_SVAL (4) carries (symbol, value).
static void read_nv_info(const unsigned char *elf, struct CUmod_st *mod) {
  uint64_t shoff;
  uint16_t shentsize, shnum, shstrndx;
  memcpy(&shoff, elf + 0x28, 8);
  memcpy(&shentsize, elf + 0x3a, 2);
  memcpy(&shnum, elf + 0x3c, 2);
  memcpy(&shstrndx, elf + 0x3e, 2);
  uint64_t names;
  memcpy(&names, elf + shoff + shstrndx * shentsize + 0x18, 8);
  for (int i = 0; i < shnum; i++) {
    const unsigned char *header = elf + shoff + i * shentsize;
    uint32_t name;
    uint64_t offset, size;
    memcpy(&name, header, 4);
    memcpy(&offset, header + 0x18, 8);
    memcpy(&size, header + 0x20, 8);
    if (strcmp((const char *)elf + names + name, ".nv.info") != 0) continue;
    for (uint64_t at = offset; at + 4 <= offset + size;) {
      unsigned char format = elf[at], attribute = elf[at + 1];
      if (format != 4) {  // EIFMT_NVAL (1) is 2 bytes, EIFMT_HVAL (3) 4.
        at += format == 1 ? 2 : 4;
        continue;
      }
      uint16_t bytes;
      uint32_t value;
      memcpy(&bytes, elf + at + 2, 2);
      memcpy(&value, elf + at + 8, 4);
      if (attribute == EIATTR_REGCOUNT) mod->regs = (int)value;
      if (attribute == EIATTR_FRAME_SIZE) mod->frame_bytes = (int)value;
      at += 4 + bytes;
    }
  }
}

CUresult cuCtxGetCurrent(CUcontext *pctx) { *pctx = &context; return CUDA_SUCCESS; }
CUresult cuCtxSetCurrent(CUcontext ctx) { return CUDA_SUCCESS; }
CUresult cuCtxGetLimit(size_t *value, CUlimit limit) { *value = 0; return CUDA_SUCCESS; }
CUresult cuCtxSetLimit(CUlimit limit, size_t value) { return CUDA_SUCCESS; }
CUresult cuDeviceGet(CUdevice *device, int ordinal) {
  if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
  *device = 0;
  return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
  *pctx = &context;
  return CUDA_SUCCESS;
}
CUresult cuGetErrorString(CUresult error, const char **text) {
  *text = error == CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES ? "too many resources requested for launch"
                                                      : "invalid argument (stub driver)";
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *value, CUdevice_attribute attribute, CUdevice dev) {
  switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *value = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *value = 0; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *value = H200_SMS; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *value = H200_SHARED_OPTIN; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: *value = H200_SHARED_PER_SM; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: *value = REGISTER_FILE; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = 1024; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *value = 32; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: *value = 1980000; break;  // kHz
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: *value = 2619000; break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: *value = 6144; break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult cuModuleLoadData(CUmodule *module, const void *image) {
  if (memcmp(image, "\x7f" "ELF", 4) != 0) return CUDA_ERROR_INVALID_IMAGE;  // Triton loads cubins
  struct CUmod_st *mod = calloc(1, sizeof *mod);
  read_nv_info(image, mod);
  *module = mod;
  return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction *function, CUmodule module, const char *name) {
  struct CUfunc_st *fn = calloc(1, sizeof *fn);
  snprintf(fn->name, sizeof fn->name, "%s", name);
  fn->regs = module->regs;
  fn->frame_bytes = module->frame_bytes;
  *function = fn;
  return CUDA_SUCCESS;
}

// Threads a block can have at `regs` a thread: registers are given out a warp at a time,
// in units of 256.
static int max_threads(int regs) {
  int per_warp = ((regs * 32 + 255) / 256) * 256;
  int warps = per_warp ? REGISTER_FILE / per_warp : 32;
  return warps >= 32 ? 1024 : warps * 32;
}

CUresult cuFuncGetAttribute(int *value, CUfunction_attribute attribute, CUfunction fn) {
  switch (attribute) {
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *value = fn->regs; break;
    case CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: *value = fn->frame_bytes; break;
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = max_threads(fn->regs); break;
    case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: *value = 0; break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult cuFuncSetAttribute(CUfunction fn, CUfunction_attribute attribute, int value) {
  if (attribute != CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) return CUDA_SUCCESS;
  if (value > H200_SHARED_OPTIN) return CUDA_ERROR_INVALID_VALUE;
  fn->dynamic_shared_max = value;
  return CUDA_SUCCESS;
}
CUresult cuFuncSetCacheConfig(CUfunction fn, CUfunc_cache config) { return CUDA_SUCCESS; }
CUresult cuOccupancyMaxActiveClusters(int *clusters, CUfunction fn, const CUlaunchConfig *c) {
  *clusters = H200_SMS;
  return CUDA_SUCCESS;
}
CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  if (attribute == CU_POINTER_ATTRIBUTE_DEVICE_POINTER) memcpy(data, &ptr, sizeof ptr);
  return CUDA_SUCCESS;
}
CUresult cuTensorMapEncodeTiled(CUtensorMap *map, CUtensorMapDataType type, cuuint32_t rank,
                                void *address, const cuuint64_t *dims, const cuuint64_t *strides,
                                const cuuint32_t *box, const cuuint32_t *element_strides,
                                CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                CUtensorMapL2promotion promotion,
                                CUtensorMapFloatOOBfill fill) {
  return CUDA_ERROR_NOT_SUPPORTED;  // no kernel of ours uses TMA descriptors
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction fn, void **params,
                          void **extra) {
  unsigned threads = config->blockDimX * config->blockDimY * config->blockDimZ;
  if (!config->gridDimX || !config->gridDimY || !config->gridDimZ || !threads || threads > 1024)
    return CUDA_ERROR_INVALID_VALUE;
  if ((int)threads > max_threads(fn->regs)) return CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
  unsigned opted_in = fn->dynamic_shared_max > 49152 ? (unsigned)fn->dynamic_shared_max : 49152;
  if (config->sharedMemBytes > opted_in) return CUDA_ERROR_INVALID_VALUE;
  int dependent = 0;
  for (unsigned i = 0; i < config->numAttrs; i++) {
    if (config->attrs[i].id == CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
      dependent = config->attrs[i].value.programmaticStreamSerializationAllowed;
  }
  const char *path = getenv("STUB_CUDA_LOG");
  FILE *log = path ? fopen(path, "a") : NULL;
  if (!log) return CUDA_ERROR_UNKNOWN;
  fprintf(log,
          "{\"kernel\": \"%s\", \"grid\": [%u, %u, %u], \"threads\": %u, \"shared_bytes\": %u, "
          "\"regs\": %d, \"local_bytes\": %d, \"dependent\": %s}\n",
          fn->name, config->gridDimX, config->gridDimY, config->gridDimZ, threads,
          config->sharedMemBytes, fn->regs, fn->frame_bytes, dependent ? "true" : "false");
  fclose(log);
  return CUDA_SUCCESS;
}

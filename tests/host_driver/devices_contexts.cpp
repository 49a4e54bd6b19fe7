// The host driver's devices, contexts, streams and error names (see driver_state.hpp).
//
// HOSTCUDA_DEVICES (default 1) devices of HOSTCUDA_MEMORY MiB each (default 4096), named
// "vramswap host driver device N", compute capability 9.0. Contexts: a per-thread stack of
// current contexts as the real driver keeps; each device's primary context is retained and
// released by count. Streams hold no work: every call completes before it returns.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "driver_state.hpp"

extern "C" {
// Older ABIs the real driver still exports (cudaTypedefs.h), not declared by cuda.h at 13.0.
CUresult CUDAAPI cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev);
CUresult CUDAAPI cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* params, int numParams, unsigned int flags, CUdevice dev);
CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream hStream);
}

namespace hostcuda {
namespace {
thread_local std::vector<context*> t_stack;

long env_number(const char* name, long fallback, long low, long high) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n < low || n > high) {
    std::fprintf(stderr, "host cuda driver: %s=%s is not a number in [%ld, %ld]; using %ld\n", name, v, low, high, fallback);
    return fallback;
  }
  return n;
}
}  // namespace

state& st() {
  static state* s = new state;  // leaked: programs call the driver from static destructors
  return *s;
}

CUresult require_init() { return st().initialized ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED; }

context* current_context() { return t_stack.empty() ? nullptr : t_stack.back(); }

CUresult require_context(context** out) {
  if (const CUresult r = require_init(); r != CUDA_SUCCESS) return r;
  context* c = current_context();
  if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (st().contexts.count(c) == 0) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  *out = c;
  return CUDA_SUCCESS;
}

bool valid_device(CUdevice device) { return st().initialized && device >= 0 && device < st().device_count; }

bool valid_stream(CUstream s) {
  return s == nullptr || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD ||
         st().streams.count(reinterpret_cast<const stream*>(s)) != 0;
}

CUresult charge(CUdevice device, size_t bytes) {
  size_t& used = st().used[static_cast<size_t>(device)];
  if (bytes > st().device_memory - used) return CUDA_ERROR_OUT_OF_MEMORY;
  used += bytes;
  return CUDA_SUCCESS;
}

void uncharge(CUdevice device, size_t bytes) { st().used[static_cast<size_t>(device)] -= bytes; }

CUresult check_range(CUdeviceptr p, size_t bytes, bool write) {
  if (bytes == 0) return CUDA_SUCCESS;
  if (p == 0 || p + bytes < p) return CUDA_ERROR_INVALID_VALUE;
  if (const int r = check_allocation_range(p, bytes); r >= 0) return static_cast<CUresult>(r);
  if (const int r = check_vmm_range(p, bytes, write); r >= 0) return static_cast<CUresult>(r);
  return CUDA_SUCCESS;  // host memory
}

}  // namespace hostcuda

using namespace hostcuda;

namespace {
using guard = std::lock_guard<std::mutex>;

// Values a program commonly asks; the attributes not listed read 0 (a capability the
// emulation lacks: texture and surface limits, compression, fabric handles, memory pools).
int attribute_value(CUdevice_attribute a) {
  switch (a) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: return 64;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: return 49152;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: return 65536;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: return 32;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: return 65536;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: return 1755000;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: return 512;
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP: return 1;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: return 132;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: return 1;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: return CU_COMPUTEMODE_DEFAULT;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: return 1;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: return 2619000;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: return 5120;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: return 52428800;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: return 2048;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: return 2;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: return 1;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT: return 32;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: return 9;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: return 0;
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: return 233472;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: return 65536;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: return 1;
    case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS: return 1;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: return 1;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: return 232448;
    case CU_DEVICE_ATTRIBUTE_DIRECT_MANAGED_MEM_ACCESS_FROM_HOST: return 1;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: return 32;
    default: return 0;
  }
}

struct error_text {
  CUresult code;
  const char* name;
  const char* text;
};
#define HOSTCUDA_ERR(code, text) {code, #code, text},
constexpr error_text k_errors[] = {
    HOSTCUDA_ERR(CUDA_SUCCESS, "no error")
    HOSTCUDA_ERR(CUDA_ERROR_INVALID_VALUE, "invalid argument")
    HOSTCUDA_ERR(CUDA_ERROR_OUT_OF_MEMORY, "out of memory")
    HOSTCUDA_ERR(CUDA_ERROR_NOT_INITIALIZED, "initialization error")
    HOSTCUDA_ERR(CUDA_ERROR_DEINITIALIZED, "driver shutting down")
    HOSTCUDA_ERR(CUDA_ERROR_STUB_LIBRARY, "CUDA driver is a stub library")
    HOSTCUDA_ERR(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected")
    HOSTCUDA_ERR(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal")
    HOSTCUDA_ERR(CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid")
    HOSTCUDA_ERR(CUDA_ERROR_INVALID_CONTEXT, "invalid device context")
    HOSTCUDA_ERR(CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "context already current")
    HOSTCUDA_ERR(CUDA_ERROR_MAP_FAILED, "mapping of buffer object failed")
    HOSTCUDA_ERR(CUDA_ERROR_UNMAP_FAILED, "unmapping of buffer object failed")
    HOSTCUDA_ERR(CUDA_ERROR_ALREADY_MAPPED, "resource already mapped")
    HOSTCUDA_ERR(CUDA_ERROR_NOT_MAPPED, "resource not mapped")
    HOSTCUDA_ERR(CUDA_ERROR_INVALID_SOURCE, "device kernel image is invalid")
    HOSTCUDA_ERR(CUDA_ERROR_FILE_NOT_FOUND, "file not found")
    HOSTCUDA_ERR(CUDA_ERROR_OPERATING_SYSTEM, "OS call failed or operation not supported on this OS")
    HOSTCUDA_ERR(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle")
    HOSTCUDA_ERR(CUDA_ERROR_ILLEGAL_STATE, "the operation cannot be performed in the present state")
    HOSTCUDA_ERR(CUDA_ERROR_NOT_FOUND, "named symbol not found")
    HOSTCUDA_ERR(CUDA_ERROR_NOT_READY, "device not ready")
    HOSTCUDA_ERR(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered")
    HOSTCUDA_ERR(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure")
    HOSTCUDA_ERR(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, "primary context active")
    HOSTCUDA_ERR(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed")
    HOSTCUDA_ERR(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "part or all of the requested memory range is already mapped")
    HOSTCUDA_ERR(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "pointer does not correspond to a registered memory region")
    HOSTCUDA_ERR(CUDA_ERROR_MISALIGNED_ADDRESS, "misaligned address")
    HOSTCUDA_ERR(CUDA_ERROR_NOT_PERMITTED, "operation not permitted")
    HOSTCUDA_ERR(CUDA_ERROR_NOT_SUPPORTED, "operation not supported")
    HOSTCUDA_ERR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "operation not permitted when stream is capturing")
    HOSTCUDA_ERR(CUDA_ERROR_TIMEOUT, "timeout occurred")
    HOSTCUDA_ERR(CUDA_ERROR_UNKNOWN, "unknown error")
};
#undef HOSTCUDA_ERR

const error_text* find_error(CUresult r) {
  for (const error_text& e : k_errors) {
    if (e.code == r) return &e;
  }
  return nullptr;
}

CUresult create_context(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  guard g(st().m);
  if (const CUresult r = require_init(); r != CUDA_SUCCESS) return r;
  if (pctx == nullptr || flags > 0x3f) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  auto* c = new context{dev, false};
  st().contexts.insert(c);
  t_stack.push_back(c);
  *pctx = reinterpret_cast<CUcontext>(c);
  return CUDA_SUCCESS;
}

bool live(CUcontext ctx) { return st().contexts.count(reinterpret_cast<const context*>(ctx)) != 0; }

}  // namespace

extern "C" {

// --- errors --------------------------------------------------------------------------------
CUresult CUDAAPI cuGetErrorName(CUresult error, const char** pStr) {
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const error_text* e = find_error(error);
  *pStr = e != nullptr ? e->name : nullptr;
  return e != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char** pStr) {
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const error_text* e = find_error(error);
  *pStr = e != nullptr ? e->text : nullptr;
  return e != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

// --- initialization and devices ------------------------------------------------------------
CUresult CUDAAPI cuInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  guard g(st().m);
  if (st().initialized) return CUDA_SUCCESS;
  state& s = st();
  s.device_count = static_cast<int>(env_number("HOSTCUDA_DEVICES", 1, 0, 64));
  s.device_memory = static_cast<size_t>(env_number("HOSTCUDA_MEMORY", 4096, 2, 1l << 24)) << 20;
  if (s.device_count == 0) return CUDA_ERROR_NO_DEVICE;
  s.used.assign(static_cast<size_t>(s.device_count), 0);
  for (int d = 0; d < s.device_count; ++d) {
    auto* c = new context{d, true};
    s.primary.push_back(c);
    s.contexts.insert(c);
  }
  s.primary_refs.assign(static_cast<size_t>(s.device_count), 0);
  s.initialized = true;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDriverGetVersion(int* driverVersion) {
  if (driverVersion == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *driverVersion = CUDA_VERSION;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetCount(int* count) {
  guard g(st().m);
  if (const CUresult r = require_init(); r != CUDA_SUCCESS) return r;
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *count = st().device_count;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGet(CUdevice* device, int ordinal) {
  guard g(st().m);
  if (const CUresult r = require_init(); r != CUDA_SUCCESS) return r;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetName(char* name, int len, CUdevice dev) {
  guard g(st().m);
  if (const CUresult r = require_init(); r != CUDA_SUCCESS) return r;
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(name, static_cast<size_t>(len), "vramswap host driver device %d", dev);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  guard g(st().m);
  if (const CUresult r = require_init(); r != CUDA_SUCCESS) return r;
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = st().device_memory;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {
  guard g(st().m);
  if (const CUresult r = require_init(); r != CUDA_SUCCESS) return r;
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  // "hostcuda" then the ordinal: stable across processes, as a GPU's UUID is.
  std::memset(uuid->bytes, 0, sizeof uuid->bytes);
  std::memcpy(uuid->bytes, "hostcuda", 8);
  uuid->bytes[15] = static_cast<char>(dev);
  return CUDA_SUCCESS;
}

// The CUDA 9.2 name, same ABI.
CUresult CUDAAPI hostcuda_cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) __asm__("cuDeviceGetUuid");
CUresult CUDAAPI hostcuda_cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) { return cuDeviceGetUuid_v2(uuid, dev); }

CUresult CUDAAPI cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  guard g(st().m);
  if (const CUresult r = require_init(); r != CUDA_SUCCESS) return r;
  if (pi == nullptr || attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *pi = 1 + dev; break;
    case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD_GROUP_ID: *pi = dev; break;
    default: *pi = attribute_value(attrib);
  }
  return CUDA_SUCCESS;
}

// --- primary contexts and contexts ----------------------------------------------------------
CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  guard g(st().m);
  if (const CUresult r = require_init(); r != CUDA_SUCCESS) return r;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  ++st().primary_refs[static_cast<size_t>(dev)];
  *pctx = reinterpret_cast<CUcontext>(st().primary[static_cast<size_t>(dev)]);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  guard g(st().m);
  if (const CUresult r = require_init(); r != CUDA_SUCCESS) return r;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  unsigned& refs = st().primary_refs[static_cast<size_t>(dev)];
  if (refs == 0) return CUDA_ERROR_INVALID_CONTEXT;  // not retained
  --refs;
  return CUDA_SUCCESS;
}

// The CUDA 7.0 name, same ABI.
CUresult CUDAAPI hostcuda_cuDevicePrimaryCtxRelease(CUdevice dev) __asm__("cuDevicePrimaryCtxRelease");
CUresult CUDAAPI hostcuda_cuDevicePrimaryCtxRelease(CUdevice dev) { return cuDevicePrimaryCtxRelease_v2(dev); }

CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  guard g(st().m);
  if (const CUresult r = require_init(); r != CUDA_SUCCESS) return r;
  if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *flags = 0;
  *active = st().primary_refs[static_cast<size_t>(dev)] > 0 ? 1 : 0;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev) { return create_context(pctx, flags, dev); }

CUresult CUDAAPI cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* params, int numParams, unsigned int flags, CUdevice dev) {
  if (numParams < 0 || (numParams > 0 && params == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  if (numParams > 0) return CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY;
  return create_context(pctx, flags, dev);
}

CUresult CUDAAPI cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* params, unsigned int flags, CUdevice dev) {
  if (params != nullptr && (params->numExecAffinityParams > 0 || params->cigParams != nullptr)) return CUDA_ERROR_NOT_SUPPORTED;
  return create_context(pctx, flags, dev);
}

CUresult CUDAAPI cuCtxDestroy_v2(CUcontext ctx) {
  guard g(st().m);
  if (const CUresult r = require_init(); r != CUDA_SUCCESS) return r;
  if (ctx == nullptr || !live(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  auto* c = reinterpret_cast<context*>(ctx);
  if (c->primary) return CUDA_ERROR_INVALID_CONTEXT;  // primary contexts are released, not destroyed
  st().contexts.erase(c);
  st().destroyed.push_back(c);
  if (!t_stack.empty() && t_stack.back() == c) t_stack.pop_back();
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
  guard g(st().m);
  if (const CUresult r = require_init(); r != CUDA_SUCCESS) return r;
  if (ctx != nullptr && !live(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  if (!t_stack.empty()) t_stack.pop_back();
  if (ctx != nullptr) t_stack.push_back(reinterpret_cast<context*>(ctx));
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext* pctx) {
  guard g(st().m);
  if (const CUresult r = require_init(); r != CUDA_SUCCESS) return r;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pctx = reinterpret_cast<CUcontext>(current_context());
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext ctx) {
  guard g(st().m);
  if (const CUresult r = require_init(); r != CUDA_SUCCESS) return r;
  if (ctx == nullptr || !live(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  t_stack.push_back(reinterpret_cast<context*>(ctx));
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext* pctx) {
  guard g(st().m);
  if (const CUresult r = require_init(); r != CUDA_SUCCESS) return r;
  if (t_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (pctx != nullptr) *pctx = reinterpret_cast<CUcontext>(t_stack.back());
  t_stack.pop_back();
  return CUDA_SUCCESS;
}

// The CUDA 2.0 ABI of cuCtxGetDevice (cuda.h's declaration); CUDA 13's takes a context.
CUresult CUDAAPI cuCtxGetDevice(CUdevice* device) {
  guard g(st().m);
  context* c = nullptr;
  if (const CUresult r = require_context(&c); r != CUDA_SUCCESS) return r;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *device = c->device;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetDevice_v2(CUdevice* device, CUcontext ctx) {
  if (ctx == nullptr) return cuCtxGetDevice(device);
  guard g(st().m);
  if (const CUresult r = require_init(); r != CUDA_SUCCESS) return r;
  if (!live(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *device = reinterpret_cast<context*>(ctx)->device;
  return CUDA_SUCCESS;
}

// Nothing is ever pending: a synchronize checks its context and returns.
CUresult CUDAAPI cuCtxSynchronize(void) {
  guard g(st().m);
  context* c = nullptr;
  return require_context(&c);
}

CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx) {
  if (ctx == nullptr) return cuCtxSynchronize();
  guard g(st().m);
  if (const CUresult r = require_init(); r != CUDA_SUCCESS) return r;
  return live(ctx) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

// --- streams -------------------------------------------------------------------------------
CUresult CUDAAPI cuStreamCreate(CUstream* phStream, unsigned int flags) {
  guard g(st().m);
  context* c = nullptr;
  if (const CUresult r = require_context(&c); r != CUDA_SUCCESS) return r;
  if (phStream == nullptr || (flags & ~unsigned{CU_STREAM_NON_BLOCKING}) != 0) return CUDA_ERROR_INVALID_VALUE;
  auto* s = new stream{c, flags};
  st().streams.insert(s);
  *phStream = reinterpret_cast<CUstream>(s);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamDestroy_v2(CUstream hStream) {
  guard g(st().m);
  if (const CUresult r = require_init(); r != CUDA_SUCCESS) return r;
  auto* s = reinterpret_cast<stream*>(hStream);
  if (hStream == nullptr || st().streams.erase(s) == 0) return CUDA_ERROR_INVALID_HANDLE;
  delete s;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamSynchronize(CUstream hStream) {
  guard g(st().m);
  context* c = nullptr;
  if (const CUresult r = require_context(&c); r != CUDA_SUCCESS) return r;
  return valid_stream(hStream) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream hStream) { return cuStreamSynchronize(hStream); }

}  // extern "C"

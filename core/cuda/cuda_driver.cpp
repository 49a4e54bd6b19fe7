// Loading the CUDA driver at run time; see cuda_driver.hpp for why and how.
#include "core/cuda/cuda_driver.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <new>
#include <string_view>
#include <type_traits>

#include "core/log.hpp"
#include "core/cuda/declared_abi.hpp"
#include "core/status.hpp"

namespace vramswap::detail::cuda {
namespace {

// --- compile-time proof that the table's names and types came out right -----------------
// `#name` must give the base name cuGetProcAddress expects, never a versioned symbol.
#define VRAMSWAP_CUDA_NAME(name) #name,
constexpr const char* k_function_names[] = {VRAMSWAP_CUDA_DRIVER_FUNCTIONS(VRAMSWAP_CUDA_NAME)};
#undef VRAMSWAP_CUDA_NAME
constexpr bool names_unversioned() {
  for (std::string_view name : k_function_names) {
    if (name.find("_v") != std::string_view::npos || name.find("_pt") != std::string_view::npos) return false;
  }
  return true;
}
static_assert(names_unversioned(), "a driver function's lookup name was macro-expanded to a versioned symbol");
static_assert(std::string_view(k_function_names[0]) == "cuGetErrorName");
// ...while the pointer types are those of the versioned declarations cuda.h maps them to.
static_assert(std::is_same_v<decltype(driver::cuMemGetInfo), decltype(&::cuMemGetInfo_v2)>);
static_assert(std::is_same_v<decltype(driver::cuMemcpyDtoHAsync), decltype(&::cuMemcpyDtoHAsync_v2)>);
static_assert(std::is_same_v<decltype(driver::cuStreamDestroy), decltype(&::cuStreamDestroy_v2)>);
static_assert(std::is_same_v<decltype(driver::cuDeviceGetUuid), decltype(&::cuDeviceGetUuid_v2)>);
// The argument-less cuCtxSynchronize cuda.h declares, fetched at 12000 (declared_abi.hpp).
static_assert(std::is_same_v<decltype(driver::cuCtxSynchronize), CUresult(CUDAAPI*)(void)>);

// cuGetProcAddress before CUDA 12.0 had no symbolStatus argument.
using get_proc_address_v2_fn = decltype(&::cuGetProcAddress);  // cuGetProcAddress_v2
static_assert(std::is_same_v<get_proc_address_v2_fn, CUresult(CUDAAPI*)(const char*, void**, int, cuuint64_t,
                                                                        CUdriverProcAddressQueryResult*)>);
using get_proc_address_v1_fn = CUresult(CUDAAPI*)(const char*, void**, int, cuuint64_t);
using driver_get_version_fn = decltype(&::cuDriverGetVersion);

struct load_state {
  driver table;
  int status = 0;
  char error[768] = {};
};

// Set once the table is complete; read by error_name()/error_string().
std::atomic<const driver*> g_driver{nullptr};

int load_failed(load_state* s, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
int load_failed(load_state* s, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(s->error, sizeof s->error, fmt, ap);
  va_end(ap);
  s->status = err_unavailable;
  return s->status;
}

const char* name_with(const driver& d, CUresult result) {
  const char* s = nullptr;
  if (d.cuGetErrorName != nullptr && d.cuGetErrorName(result, &s) == CUDA_SUCCESS && s != nullptr) return s;
  thread_local char buf[32];
  std::snprintf(buf, sizeof buf, "CUresult %d", static_cast<int>(result));
  return buf;
}

const char* status_text(CUdriverProcAddressQueryResult st) {
  switch (st) {
    case CU_GET_PROC_ADDRESS_SUCCESS: return "found";
    case CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: return "symbol not found";
    case CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: return "symbol newer than the requested version";
    default: return "unknown symbol status";
  }
}

struct proc_lookup {
  get_proc_address_v2_fn v2 = nullptr;
  get_proc_address_v1_fn v1 = nullptr;

  // One driver function's address at `version`; fails if the driver lacks it.
  int fetch(load_state* s, const char* name, int version, void** out) const {
    void* pfn = nullptr;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
    const CUresult r = v2 != nullptr ? v2(name, &pfn, version, CU_GET_PROC_ADDRESS_DEFAULT, &st)
                                     : v1(name, &pfn, version, CU_GET_PROC_ADDRESS_DEFAULT);
    if (r != CUDA_SUCCESS) {
      return load_failed(s, "cuGetProcAddress(\"%s\", cudaVersion=%d) failed: %s; the NVIDIA driver (CUDA %d.%d) "
                            "is unusable for vramswap",
                         name, version, name_with(s->table, r), s->table.driver_version / 1000,
                         s->table.driver_version % 1000 / 10);
    }
    if (pfn == nullptr) {
      return load_failed(s, "cuGetProcAddress(\"%s\", cudaVersion=%d): %s; the NVIDIA driver (CUDA %d.%d) lacks a "
                            "function vramswap needs",
                         name, version, status_text(st), s->table.driver_version / 1000,
                         s->table.driver_version % 1000 / 10);
    }
    *out = pfn;
    return 0;
  }
};

int load(load_state* s) {
  // RTLD_LOCAL: libcuda's symbols stay out of the global namespace; we never dlclose it.
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    return load_failed(s, "libcuda.so.1 not found: %s (no NVIDIA driver on this machine, or it is not on the "
                          "loader's path)",
                       why != nullptr ? why : "dlopen failed");
  }

  // cuDriverGetVersion works before cuInit and tells which ABI versions we may ask for.
  auto get_version = reinterpret_cast<driver_get_version_fn>(dlsym(lib, "cuDriverGetVersion"));
  if (get_version == nullptr) return load_failed(s, "libcuda.so.1 has no cuDriverGetVersion: not a CUDA driver");
  int version = 0;
  if (const CUresult r = get_version(&version); r != CUDA_SUCCESS) {
    return load_failed(s, "cuDriverGetVersion() failed: CUresult %d", static_cast<int>(r));
  }
  s->table.driver_version = version;
  if (version < min_driver_version) {
    return load_failed(s, "the NVIDIA driver supports CUDA %d.%d; vramswap needs a driver for CUDA %d.%d or newer",
                       version / 1000, version % 1000 / 10, min_driver_version / 1000,
                       min_driver_version % 1000 / 10);
  }
  // cuGetProcAddress refuses versions newer than the driver; every ABI we use is the same
  // from min_driver_version to CUDA_VERSION, so asking at the driver's version is safe.
  const int api = std::min(CUDA_VERSION, version);
  s->table.api_version = api;

  proc_lookup lookup;
  lookup.v2 = reinterpret_cast<get_proc_address_v2_fn>(dlsym(lib, "cuGetProcAddress_v2"));
  if (lookup.v2 == nullptr) {
    lookup.v1 = reinterpret_cast<get_proc_address_v1_fn>(dlsym(lib, "cuGetProcAddress"));
    if (lookup.v1 == nullptr) {
      return load_failed(s, "libcuda.so.1 (CUDA %d.%d) has neither cuGetProcAddress_v2 nor cuGetProcAddress",
                         version / 1000, version % 1000 / 10);
    }
  }

  // `name` is used unexpanded only by #name; everywhere else it is the (possibly
  // versioned) member name, consistently.
#define VRAMSWAP_CUDA_LOAD(name)                                                                       \
  {                                                                                                    \
    void* pfn = nullptr;                                                                               \
    if (const int rc = lookup.fetch(s, #name, declared_abi_version(#name, api), &pfn); rc != 0) return rc; \
    s->table.name = reinterpret_cast<decltype(s->table.name)>(pfn);                                    \
  }
  VRAMSWAP_CUDA_DRIVER_FUNCTIONS(VRAMSWAP_CUDA_LOAD)
#undef VRAMSWAP_CUDA_LOAD

  g_driver.store(&s->table, std::memory_order_release);
  if (log_enabled(log_level::debug)) {
    log(log_level::debug, "cuda: loaded libcuda.so.1 (driver for CUDA %d.%d; functions at ABI %d; built with %d)",
        version / 1000, version % 1000 / 10, api, CUDA_VERSION);
  }
  return 0;
}

load_state* load_once() noexcept {
  // Deliberately leaked: the table must outlive every static destructor that may still
  // release CUDA objects at exit.
  auto* s = new (std::nothrow) load_state;
  if (s != nullptr) load(s);
  return s;
}

}  // namespace

int load_driver(const driver** out) noexcept {
  static load_state* const state = load_once();  // thread-safe, once
  if (state == nullptr) return fail(err_out_of_memory, "cuda: out of memory loading the driver table");
  if (state->status != 0) return fail(state->status, "%s", state->error);
  *out = &state->table;
  return 0;
}

const char* error_name(CUresult result) noexcept {
  if (const driver* d = g_driver.load(std::memory_order_acquire); d != nullptr) return name_with(*d, result);
  thread_local char buf[32];
  std::snprintf(buf, sizeof buf, "CUresult %d", static_cast<int>(result));
  return buf;
}

const char* error_string(CUresult result) noexcept {
  const char* s = nullptr;
  if (const driver* d = g_driver.load(std::memory_order_acquire);
      d != nullptr && d->cuGetErrorString(result, &s) == CUDA_SUCCESS && s != nullptr) {
    return s;
  }
  return "unknown CUDA error";
}

int check(CUresult result, const char* call_fmt, ...) noexcept {
  if (result == CUDA_SUCCESS) return 0;
  char call[512];
  va_list ap;
  va_start(ap, call_fmt);
  std::vsnprintf(call, sizeof call, call_fmt, ap);
  va_end(ap);
  const int code = result == CUDA_ERROR_OUT_OF_MEMORY ? err_out_of_memory : err_cuda;
  return fail(code, "%s failed: %s (%s)", call, error_name(result), error_string(result));
}

}  // namespace vramswap::detail::cuda

// How a program's CUDA calls reach the shim (preload/shim.hpp).
//
// The substitution is by function pointer. Once, at the first lookup, the shim asks the real
// cuGetProcAddress for each function it replaces (at this header's CUDA version, with the
// default and the per-thread-default-stream flags) and records real pointer -> replacement.
// Every lookup that passes through the shim (cuGetProcAddress, cudaGetDriverEntryPoint[ByVersion])
// then swaps a recorded real pointer for its replacement and leaves any other pointer alone.
// dlsym is answered by name instead (replacement_by_name): libcuda calls dlsym while it
// initializes, and a cuGetProcAddress call from in there crashes it. A caller asking for another ABI version of a function (a different real pointer) gets
// the real function: never a replacement with the wrong signature. Such calls are not gated;
// `VRAMSWAP_LOG=debug` lists every lookup left alone.
//
// libvramswap itself loads the driver with dlsym + cuGetProcAddress too; the shim's dlsym
// recognises it by the caller's address and gives it the real functions, so the pager's own
// copies never wait at the gate its migration thread has closed.
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "runtime/runtime.hpp"
#include "shim.hpp"

namespace vramswap::detail::preload {
namespace {

using get_proc_v1_fn = CUresult (*)(const char*, void**, int, cuuint64_t);

void* libcuda() {
  static void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  return handle;
}

// --- the gated functions -----------------------------------------------------------------
// Every driver function through which a program queues device work that may touch its
// memory. The same literal-name rule as core/cuda/cuda_driver.hpp: `#name` is the base name
// cuGetProcAddress wants, `decltype(&name)` the header's (newest) ABI.
#define VRAMSWAP_GATED_FUNCTIONS(X) \
  X(cuLaunchKernel)                 \
  X(cuLaunchKernelEx)               \
  X(cuLaunchCooperativeKernel)      \
  X(cuGraphLaunch)                  \
  X(cuMemcpy)                       \
  X(cuMemcpyAsync)                  \
  X(cuMemcpyPeer)                   \
  X(cuMemcpyPeerAsync)              \
  X(cuMemcpyHtoD)                   \
  X(cuMemcpyHtoDAsync)              \
  X(cuMemcpyDtoH)                   \
  X(cuMemcpyDtoHAsync)              \
  X(cuMemcpyDtoD)                   \
  X(cuMemcpyDtoDAsync)              \
  X(cuMemcpy2D)                     \
  X(cuMemcpy2DAsync)                \
  X(cuMemcpy2DUnaligned)            \
  X(cuMemcpy3D)                     \
  X(cuMemcpy3DAsync)                \
  X(cuMemcpy3DPeer)                 \
  X(cuMemcpy3DPeerAsync)            \
  X(cuMemcpyBatchAsync)             \
  X(cuMemcpy3DBatchAsync)           \
  X(cuMemsetD8)                     \
  X(cuMemsetD8Async)                \
  X(cuMemsetD16)                    \
  X(cuMemsetD16Async)               \
  X(cuMemsetD32)                    \
  X(cuMemsetD32Async)               \
  X(cuMemsetD2D8)                   \
  X(cuMemsetD2D8Async)              \
  X(cuMemsetD2D16)                  \
  X(cuMemsetD2D16Async)             \
  X(cuMemsetD2D32)                  \
  X(cuMemsetD2D32Async)             \
  X(cuStreamWriteValue32)           \
  X(cuStreamWriteValue64)           \
  X(cuStreamBatchMemOp)

enum gated_index : int {
#define VRAMSWAP_GATED_ENUM(name) gated_##name,
  VRAMSWAP_GATED_FUNCTIONS(VRAMSWAP_GATED_ENUM)
#undef VRAMSWAP_GATED_ENUM
};

// --- observing kernel launches (placement by use, runtime/use_tracker.hpp) --------------
// On a sample of launches, every parameter's bytes are scanned for addresses in this
// process's arenas. The parameters' sizes come from cuFuncGetParamInfo (CUDA 12.4); a
// CUkernel handle passed as a CUfunction (the library API allows it) is asked with
// cuKernelGetParamInfo. A driver without them observes nothing, and says so once.
using param_info_fn = CUresult (*)(void*, size_t, size_t*, size_t*);
constexpr size_t k_max_observed_params = 1024;

param_info_fn function_param_info() {
  static const param_info_fn fn = [] {
    auto f = reinterpret_cast<param_info_fn>(real_driver("cuFuncGetParamInfo", 12040));
    if (f == nullptr) {
      rt::log_line(rt::log_severity::warn, "preload: this driver has no cuFuncGetParamInfo (CUDA 12.4 and later): kernel launches are not "
          "observed, so placement by use (VRAMSWAP_OVERSUBSCRIBE_PLACEMENT) moves nothing; pages stay where they were first backed");
    }
    return f;
  }();
  return fn;
}

param_info_fn kernel_param_info() {
  static const param_info_fn fn = reinterpret_cast<param_info_fn>(real_driver("cuKernelGetParamInfo", 12040));
  return fn;
}

void observe_launch(void* function, void** params, void** extra) noexcept {
  if (!rt::sample_this_launch()) return;
  if (params != nullptr) {
    param_info_fn info = function_param_info();
    if (info == nullptr) {
      rt::note_launch_unreadable();
      return;
    }
    size_t offset = 0;
    size_t size = 0;
    CUresult r = info(function, 0, &offset, &size);
    if (r == CUDA_ERROR_INVALID_HANDLE && kernel_param_info() != nullptr) {
      info = kernel_param_info();
      r = info(function, 0, &offset, &size);
    }
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_INVALID_VALUE) {  // INVALID_VALUE at 0: no parameters
      rt::note_launch_unreadable();
      return;
    }
    for (size_t i = 0; r == CUDA_SUCCESS && i < k_max_observed_params; r = info(function, ++i, &offset, &size)) {
      rt::record_launch_argument_bytes(params[i], size);
    }
  } else if (extra != nullptr) {  // one packed buffer: CU_LAUNCH_PARAM_BUFFER_POINTER, _SIZE
    const void* buffer = nullptr;
    size_t size = 0;
    for (size_t i = 0; i < 64 && extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
      if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) buffer = extra[i + 1];
      if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1] != nullptr) size = *static_cast<const size_t*>(extra[i + 1]);
    }
    rt::record_launch_argument_bytes(buffer, size);
  }
  rt::note_launch_observed();
}

// What a gated function does before the real one: the kernel launches are observed.
template <int Index>
struct before_call {
  template <typename... A>
  static void run(A...) noexcept {}
};
template <>
struct before_call<gated_cuLaunchKernel> {
  static void run(CUfunction f, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void** params,
                  void** extra) noexcept {
    observe_launch(f, params, extra);
  }
};
template <>
struct before_call<gated_cuLaunchKernelEx> {
  static void run(const CUlaunchConfig*, CUfunction f, void** params, void** extra) noexcept { observe_launch(f, params, extra); }
};
template <>
struct before_call<gated_cuLaunchCooperativeKernel> {
  static void run(CUfunction f, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                  void** params) noexcept {
    observe_launch(f, params, nullptr);
  }
};

// One instance per function and flavour (Id = index * 2 + per-thread-default-stream): the
// real pointer it calls, and the wrapper that calls it inside the gate.
template <typename F, int Id>
struct gated;
template <typename R, typename... A, int Id>
struct gated<R (*)(A...), Id> {
  static inline R (*real)(A...) = nullptr;
  static R call(A... a) {
    const rt::launch_pass through;
    before_call<Id / 2>::run(a...);
    return real(a...);
  }
};

// --- the replacement table ---------------------------------------------------------------
template <typename R, typename... A>
constexpr void* as_void(R (*f)(A...)) {
  return reinterpret_cast<void*>(f);
}

struct named_replacement {
  const char* name;  // the base name cuGetProcAddress takes, and dlsym's for these
  void* fn;
};
// The virtual memory API (vmm.cpp) and the allocation paths past vramswap (bypass.cpp)
// with no stream argument. Each base name is also its exported symbol, except those
// dlsym_names() lists with their suffix.
const named_replacement k_stream_free_replacements[] = {
    {"cuMemAddressReserve", as_void(&vmm_address_reserve)},
    {"cuMemAddressFree", as_void(&vmm_address_free)},
    {"cuMemCreate", as_void(&vmm_create)},
    {"cuMemRelease", as_void(&vmm_release)},
    {"cuMemMap", as_void(&vmm_map)},
    {"cuMemUnmap", as_void(&vmm_unmap)},
    {"cuMemSetAccess", as_void(&vmm_set_access)},
    {"cuMemGetAccess", as_void(&vmm_get_access)},
    {"cuMemRetainAllocationHandle", as_void(&vmm_retain_allocation_handle)},
    {"cuMemGetAllocationPropertiesFromHandle", as_void(&vmm_get_allocation_properties)},
    {"cuMemExportToShareableHandle", as_void(&vmm_export)},
    {"cuMemMapArrayAsync", as_void(&vmm_map_array_async)},
    {"cuMemAllocPitch", as_void(&bypass_alloc_pitch)},
    {"cuMemAllocManaged", as_void(&bypass_alloc_managed)},
    {"cuArrayCreate", as_void(&bypass_array_create)},
    {"cuArray3DCreate", as_void(&bypass_array_3d_create)},
    {"cuArrayDestroy", as_void(&bypass_array_destroy)},
    {"cuMipmappedArrayCreate", as_void(&bypass_mipmapped_array_create)},
    {"cuGraphAddMemAllocNode", as_void(&bypass_graph_add_mem_alloc_node)},
};
std::once_flag g_table_once;
std::unordered_map<void*, void*> g_replacement;  // real function -> the shim's; read-only once built

void build_table() {
  get_proc_v2_fn get = real_get_proc_address();
  if (get == nullptr) return;
  auto add = [&](const char* name, int version, cuuint64_t flags, void* replacement) -> void* {
    void* real = nullptr;
    CUdriverProcAddressQueryResult st{};
    if (get(name, &real, version, flags, &st) != CUDA_SUCCESS || real == nullptr) return nullptr;
    g_replacement.emplace(real, replacement);
    return real;
  };
  // Not cuGetProcAddress itself: own_lookup hands it out by the version asked for.
  for (cuuint64_t flags : {cuuint64_t{CU_GET_PROC_ADDRESS_DEFAULT}, cuuint64_t{CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM}}) {
    const bool per_thread = flags == CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    add("cuMemAlloc", CUDA_VERSION, flags, as_void(&mem_alloc));
    add("cuMemFree", CUDA_VERSION, flags, as_void(&mem_free));
    add("cuMemGetInfo", CUDA_VERSION, flags, as_void(&mem_get_info));
    add("cuMemAllocAsync", CUDA_VERSION, flags, per_thread ? as_void(&mem_alloc_async_ptsz) : as_void(&mem_alloc_async));
    add("cuMemFreeAsync", CUDA_VERSION, flags, per_thread ? as_void(&mem_free_async_ptsz) : as_void(&mem_free_async));
    add("cuMemAllocFromPoolAsync", CUDA_VERSION, flags,
        per_thread ? as_void(&bypass_alloc_from_pool_async_ptsz) : as_void(&bypass_alloc_from_pool_async));
    // Functions without a stream have one pointer for both flavours: recorded once.
    if (per_thread) continue;
    for (const auto& [name, fn] : k_stream_free_replacements) add(name, CUDA_VERSION, flags, fn);
  }
#define VRAMSWAP_GATED_ADD(name)                                                                                       \
  gated<decltype(&name), gated_##name * 2>::real = reinterpret_cast<decltype(&name)>(                                  \
      add(#name, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, as_void(&gated<decltype(&name), gated_##name * 2>::call)));  \
  gated<decltype(&name), gated_##name * 2 + 1>::real = reinterpret_cast<decltype(&name)>(add(                         \
      #name, CUDA_VERSION, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, as_void(&gated<decltype(&name), gated_##name * 2 + 1>::call)));
  VRAMSWAP_GATED_FUNCTIONS(VRAMSWAP_GATED_ADD)
#undef VRAMSWAP_GATED_ADD
  rt::set_launches_bracketed();
  rt::log_line(rt::log_severity::debug, "preload: %zu driver functions replaced", g_replacement.size());
}

}  // namespace

void* substitute(void* real, const char* symbol) {
  if (real == nullptr) return nullptr;
  std::call_once(g_table_once, build_table);
  auto it = g_replacement.find(real);
  if (it != g_replacement.end()) return it->second;
  if (symbol != nullptr) rt::log_line(rt::log_severity::debug, "preload: lookup of %s left alone", symbol);
  return real;
}

// cuGetProcAddress asked for itself: the shim's, chosen by the version asked for (the CUDA
// runtime fetches cuGetProcAddress through cuGetProcAddress, then everything else through
// the result). By version, not by pointer: the driver's two ABIs need not be two pointers.
bool own_lookup(const char* symbol, int version, void** pfn) {
  if (symbol == nullptr || pfn == nullptr || std::strcmp(symbol, "cuGetProcAddress") != 0) return false;
  *pfn = version >= 12000 ? as_void(&hook_get_proc_v2) : as_void(&hook_get_proc_v1);
  return true;
}

CUresult hook_get_proc_v2(const char* symbol, void** pfn, int version, cuuint64_t flags, CUdriverProcAddressQueryResult* status) {
  get_proc_v2_fn real = real_get_proc_address();
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = real(symbol, pfn, version, flags, status);
  if (r == CUDA_SUCCESS && pfn != nullptr && *pfn != nullptr && !own_lookup(symbol, version, pfn)) *pfn = substitute(*pfn, symbol);
  return r;
}

CUresult hook_get_proc_v1(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  static auto real = reinterpret_cast<get_proc_v1_fn>(real_dlsym(libcuda(), "cuGetProcAddress"));
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = real(symbol, pfn, version, flags);
  if (r == CUDA_SUCCESS && pfn != nullptr && *pfn != nullptr && !own_lookup(symbol, version, pfn)) *pfn = substitute(*pfn, symbol);
  return r;
}

namespace {

// Is `address` in libvramswap (whose driver calls must stay real) or in the shim itself?
bool internal_caller(const void* address) {
  static const void* vramswap_base = [] {
    Dl_info info{};
    return dladdr(reinterpret_cast<const void*>(&rt::owns), &info) != 0 ? info.dli_fbase : nullptr;
  }();
  static const void* shim_base = [] {
    Dl_info info{};
    return dladdr(reinterpret_cast<const void*>(&internal_caller), &info) != 0 ? info.dli_fbase : nullptr;
  }();
  Dl_info info{};
  if (dladdr(address, &info) == 0) return false;
  return info.dli_fbase == vramswap_base || info.dli_fbase == shim_base;
}

}  // namespace

void* real_dlsym(void* handle, const char* symbol) {
  dlsym_fn real = real_dlsym_function();
  return real != nullptr ? real(handle, symbol) : nullptr;
}

void* real_driver_per_thread(const char* name) {
  get_proc_v2_fn get = real_get_proc_address();
  void* p = nullptr;
  CUdriverProcAddressQueryResult st{};
  if (get == nullptr || get(name, &p, CUDA_VERSION, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st) != CUDA_SUCCESS) return nullptr;
  return p;
}

get_proc_v2_fn real_get_proc_address() {
  static get_proc_v2_fn real = [] {
    void* lib = libcuda();
    return lib != nullptr ? reinterpret_cast<get_proc_v2_fn>(real_dlsym(lib, "cuGetProcAddress_v2")) : nullptr;
  }();
  return real;
}

void* real_driver(const char* name, int version) {
  get_proc_v2_fn get = real_get_proc_address();
  void* p = nullptr;
  CUdriverProcAddressQueryResult st{};
  const int asked = rt::driver_abi_version(name, version);
  if (get == nullptr || get(name, &p, asked, CU_GET_PROC_ADDRESS_DEFAULT, &st) != CUDA_SUCCESS) return nullptr;
  return p;
}

namespace {
// What dlsym answers, by name, for the driver symbols the shim replaces. By name, not by
// pointer: libcuda itself calls dlsym while it initializes, when asking it anything
// (cuGetProcAddress, to build the pointer table) crashes it.
void* replacement_by_name(const char* symbol) {
  struct entry {
    const char* name;
    void* fn;
  };
  static const entry table[] = {
      {"cuGetProcAddress_v2", as_void(&hook_get_proc_v2)}, {"cuGetProcAddress", as_void(&hook_get_proc_v1)},
      {"cuMemAlloc_v2", as_void(&mem_alloc)},              {"cuMemFree_v2", as_void(&mem_free)},
      {"cuMemGetInfo_v2", as_void(&mem_get_info)},         {"cuMemAllocAsync", as_void(&mem_alloc_async)},
      {"cuMemFreeAsync", as_void(&mem_free_async)},        {"cuMemAllocAsync_ptsz", as_void(&mem_alloc_async_ptsz)},
      {"cuMemFreeAsync_ptsz", as_void(&mem_free_async_ptsz)},
      {"cuMemAllocPitch_v2", as_void(&bypass_alloc_pitch)}, {"cuArrayCreate_v2", as_void(&bypass_array_create)},
      {"cuArray3DCreate_v2", as_void(&bypass_array_3d_create)}, {"cuMemAllocFromPoolAsync", as_void(&bypass_alloc_from_pool_async)},
      {"cuMemAllocFromPoolAsync_ptsz", as_void(&bypass_alloc_from_pool_async_ptsz)},
  };
  for (const entry& e : table) {
    if (std::strcmp(symbol, e.name) == 0) return e.fn;
  }
  // Exported under their base names (cuda.h #defines none of them to a suffixed name).
  for (const named_replacement& r : k_stream_free_replacements) {
    if (std::strcmp(symbol, r.name) == 0 && std::strcmp(symbol, "cuMemAllocPitch") != 0 && std::strcmp(symbol, "cuArrayCreate") != 0 &&
        std::strcmp(symbol, "cuArray3DCreate") != 0) {
      return r.fn;
    }
  }
  return nullptr;
}
}  // namespace

namespace {
bool in_libcuda(const void* address) {
  static const void* base = [] {
    Dl_info info{};
    void* fn = real_dlsym(libcuda(), "cuInit");
    return fn != nullptr && dladdr(fn, &info) != 0 ? info.dli_fbase : nullptr;
  }();
  Dl_info info{};
  return base != nullptr && dladdr(address, &info) != 0 && info.dli_fbase == base;
}
}  // namespace

// dlsym's answer for a caller at `caller`: the shim's function, or nullptr to let the real
// dlsym answer (dlsym_trampoline.cpp).
void* lookup_for(const void* caller, void* handle, const char* symbol) {
  if (symbol == nullptr || symbol[0] != 'c' || symbol[1] != 'u' || handle == RTLD_NEXT || internal_caller(caller)) return nullptr;
  // Only where the real symbol is there to be replaced (libcuda's handle, or the global scope).
  void* real = real_dlsym(handle, symbol);
  if (real == nullptr) return nullptr;
  if (void* ours = replacement_by_name(symbol)) return ours;
  // A program that binds the driver by dlsym (XLA's loader does) gets the gated functions
  // too, by the real pointer as cuGetProcAddress's callers do: its launches and copies must
  // wait at the gate while its pages move. Not for libcuda's own lookups while it
  // initializes, when building the table (cuGetProcAddress) would crash it.
  if (in_libcuda(caller)) return nullptr;
  void* substituted = substitute(real, nullptr);
  return substituted != real ? substituted : nullptr;
}

// Uninstrumented: dlsym_trampoline.cpp calls it while a sanitizer runtime initializes.
__attribute__((no_sanitize("address", "undefined"))) void* resolve_real_dlsym() {
  // dlsym is versioned in glibc (GLIBC_2.34 since it moved into libc; GLIBC_2.2.5 before).
  void* p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  return p != nullptr ? p : dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
}

dlsym_fn real_dlsym_function() {
  static dlsym_fn real = reinterpret_cast<dlsym_fn>(resolve_real_dlsym());
  return real;
}

}  // namespace vramswap::detail::preload

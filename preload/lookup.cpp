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
#include <link.h>

#include <cstring>
#include <mutex>
#include <unordered_map>

#include "core/launch_gate.hpp"
#include "core/log.hpp"
#include "cpp_api/src/runtime.hpp"
#include "preload/shim.hpp"

namespace vramswap::preload {
namespace {

using dlsym_fn = void* (*)(void*, const char*);
using get_proc_v1_fn = CUresult (*)(const char*, void**, int, cuuint64_t);

dlsym_fn resolve_real_dlsym() {
  // dlsym is versioned in glibc (GLIBC_2.34 since it moved into libc; GLIBC_2.2.5 before).
  for (const char* version : {"GLIBC_2.34", "GLIBC_2.2.5"}) {
    if (void* p = dlvsym(RTLD_NEXT, "dlsym", version)) return reinterpret_cast<dlsym_fn>(p);
  }
  return nullptr;
}

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

// One instance per function and flavour (Id = index * 2 + per-thread-default-stream): the
// real pointer it calls, and the wrapper that calls it inside the gate.
template <typename F, int Id>
struct gated;
template <typename R, typename... A, int Id>
struct gated<R (*)(A...), Id> {
  static inline R (*real)(A...) = nullptr;
  static R call(A... a) {
    launch_gate::pass through;
    return real(a...);
  }
};

// --- the replacement table ---------------------------------------------------------------
std::once_flag g_table_once;
std::unordered_map<void*, void*> g_replacement;  // real function -> the shim's; read-only once built

template <typename R, typename... A>
void* as_void(R (*f)(A...)) {
  return reinterpret_cast<void*>(f);
}

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
  for (cuuint64_t flags : {cuuint64_t{CU_GET_PROC_ADDRESS_DEFAULT}, cuuint64_t{CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM}}) {
    add("cuMemAlloc", CUDA_VERSION, flags, as_void(&mem_alloc));
    add("cuMemFree", CUDA_VERSION, flags, as_void(&mem_free));
    add("cuMemGetInfo", CUDA_VERSION, flags, as_void(&mem_get_info));
    add("cuMemAllocAsync", CUDA_VERSION, flags, as_void(&mem_alloc_async));
    add("cuMemFreeAsync", CUDA_VERSION, flags, as_void(&mem_free_async));
    add("cuGetProcAddress", CUDA_VERSION, flags, as_void(&hook_get_proc_v2));
    add("cuGetProcAddress", 11030, flags, as_void(&hook_get_proc_v1));
  }
#define VRAMSWAP_GATED_ADD(name)                                                                                       \
  gated<decltype(&name), gated_##name * 2>::real = reinterpret_cast<decltype(&name)>(                                  \
      add(#name, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, as_void(&gated<decltype(&name), gated_##name * 2>::call)));  \
  gated<decltype(&name), gated_##name * 2 + 1>::real = reinterpret_cast<decltype(&name)>(add(                         \
      #name, CUDA_VERSION, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, as_void(&gated<decltype(&name), gated_##name * 2 + 1>::call)));
  VRAMSWAP_GATED_FUNCTIONS(VRAMSWAP_GATED_ADD)
#undef VRAMSWAP_GATED_ADD
  launch_gate::set_installed();
  log(log_level::debug, "preload: %zu driver functions replaced", g_replacement.size());
}

}  // namespace

void* substitute(void* real, const char* symbol) {
  if (real == nullptr) return nullptr;
  std::call_once(g_table_once, build_table);
  auto it = g_replacement.find(real);
  if (it != g_replacement.end()) return it->second;
  if (symbol != nullptr) log(log_level::debug, "preload: lookup of %s left alone", symbol);
  return real;
}

CUresult hook_get_proc_v2(const char* symbol, void** pfn, int version, cuuint64_t flags, CUdriverProcAddressQueryResult* status) {
  get_proc_v2_fn real = real_get_proc_address();
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = real(symbol, pfn, version, flags, status);
  if (r == CUDA_SUCCESS && pfn != nullptr) *pfn = substitute(*pfn, symbol);
  return r;
}

CUresult hook_get_proc_v1(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  static auto real = reinterpret_cast<get_proc_v1_fn>(real_dlsym(libcuda(), "cuGetProcAddress"));
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = real(symbol, pfn, version, flags);
  if (r == CUDA_SUCCESS && pfn != nullptr) *pfn = substitute(*pfn, symbol);
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

// dlsym(RTLD_NEXT, ...) is relative to its caller, which the real dlsym would take to be
// the shim. Search the objects loaded after the caller instead, in load order.
void* next_after(const void* caller, const char* symbol) {
  Dl_info info{};
  struct link_map* self = nullptr;
  if (dladdr1(caller, &info, reinterpret_cast<void**>(&self), RTLD_DL_LINKMAP) == 0 || self == nullptr) return nullptr;
  for (struct link_map* l = self->l_next; l != nullptr; l = l->l_next) {
    if (l->l_name == nullptr || l->l_name[0] == '\0') continue;
    void* h = dlopen(l->l_name, RTLD_NOLOAD | RTLD_LAZY);
    if (h == nullptr) continue;
    void* p = real_dlsym(h, symbol);
    dlclose(h);
    if (p != nullptr) return p;
  }
  return nullptr;
}

}  // namespace

void* real_dlsym(void* handle, const char* symbol) {
  static dlsym_fn real = resolve_real_dlsym();
  return real != nullptr ? real(handle, symbol) : nullptr;
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
  if (get == nullptr || get(name, &p, version, CU_GET_PROC_ADDRESS_DEFAULT, &st) != CUDA_SUCCESS) return nullptr;
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
      {"cuMemFreeAsync", as_void(&mem_free_async)},        {"cuMemAllocAsync_ptsz", as_void(&mem_alloc_async)},
      {"cuMemFreeAsync_ptsz", as_void(&mem_free_async)},
  };
  for (const entry& e : table) {
    if (std::strcmp(symbol, e.name) == 0) return e.fn;
  }
  return nullptr;
}
}  // namespace

// The replaced entry points of an object that called them through its own dlsym.
void* lookup_for(const void* caller, void* handle, const char* symbol) {
  void* p = handle == RTLD_NEXT ? next_after(caller, symbol) : real_dlsym(handle, symbol);
  if (p == nullptr || symbol == nullptr || symbol[0] != 'c' || symbol[1] != 'u') return p;
  void* ours = replacement_by_name(symbol);
  return ours != nullptr && !internal_caller(caller) ? ours : p;
}

}  // namespace vramswap::preload

// --- exported: dlsym ---------------------------------------------------------------------
// (The other exported entry points are in exports.cpp.)
extern "C" __attribute__((visibility("default"))) void* dlsym(void* handle, const char* symbol) {
  return vramswap::preload::lookup_for(__builtin_return_address(0), handle, symbol);
}

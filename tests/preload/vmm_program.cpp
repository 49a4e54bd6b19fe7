// A program written against the CUDA driver's virtual memory API alone, knowing nothing of
// vramswap: what the preload shim must carry unchanged (tests/preload/vmm_program_test.cpp runs
// it on the host driver emulation, with and without the shim; on a GPU it runs on the real
// driver as is).
//
// usage: vmm_program --lookup=proc|dlsym <granules> <signal-file> [seed] [--also-pitch]
//
// It dlopens libcuda.so.1 and gets every function through cuGetProcAddress by base name
// (--lookup=proc, as the CUDA runtime does) or through dlsym by the versioned symbol cuda.h
// maps the name to (--lookup=dlsym, as a program linked with -lcuda binds). Then: cuInit, the
// primary context, cuMemAddressReserve of <granules> granules, one cuMemCreate per granule
// mapped at consecutive addresses, cuMemSetAccess read-write over the whole range, seeded
// pseudo-random bytes written with cuMemcpyHtoD and checked with cuMemcpyDtoH. It prints
// "written" on stdout and waits (at most 300 s) until <signal-file> exists, then checks every
// byte again, checks cuMemRetainAllocationHandle and cuMemGetAllocationPropertiesFromHandle
// on a mapped address, unmaps one granule and maps a fresh handle there (the rest must be
// untouched), and unmaps, releases and frees everything.
// --also-pitch: also holds 3 rows of 1 MiB from cuMemAllocPitch while it waits (memory the
// shim does not virtualize: it must say so and count it outside the pool), freed after.
// Exit 0 only when everything matched; 1 after a failed call (its name and error name on
// stderr), 2 for different bytes (the first: offset, expected, got), 64 for bad arguments.
#include <cuda.h>
#include <dlfcn.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

#define VP_STR2(x) #x
#define VP_STR(x) VP_STR2(x)

// `#name` is the base name (for cuGetProcAddress), VP_STR(name) the versioned symbol (for
// dlsym), decltype(&name) the declared type: the names appear here literally.
#define VP_FUNCTIONS(X)                          \
  X(cuGetErrorName)                              \
  X(cuInit)                                      \
  X(cuDeviceGet)                                 \
  X(cuDevicePrimaryCtxRetain)                    \
  X(cuDevicePrimaryCtxRelease)                   \
  X(cuCtxSetCurrent)                             \
  X(cuMemGetAllocationGranularity)               \
  X(cuMemAddressReserve)                         \
  X(cuMemAddressFree)                            \
  X(cuMemCreate)                                 \
  X(cuMemRelease)                                \
  X(cuMemMap)                                    \
  X(cuMemUnmap)                                  \
  X(cuMemSetAccess)                              \
  X(cuMemcpyHtoD)                                \
  X(cuMemcpyDtoH)                                \
  X(cuMemRetainAllocationHandle)                 \
  X(cuMemGetAllocationPropertiesFromHandle)      \
  X(cuMemAllocPitch)                             \
  X(cuMemFree)

struct driver {
#define VP_FIELD(name) decltype(&::name) name = nullptr;
  VP_FUNCTIONS(VP_FIELD)
#undef VP_FIELD
};
driver d;

const char* error_name(CUresult r) {
  const char* s = nullptr;
  if (d.cuGetErrorName != nullptr && d.cuGetErrorName(r, &s) == CUDA_SUCCESS && s != nullptr) return s;
  static char buf[32];
  std::snprintf(buf, sizeof buf, "CUresult %d", static_cast<int>(r));
  return buf;
}

void check(CUresult r, const char* function) {
  if (r == CUDA_SUCCESS) return;
  std::fprintf(stderr, "vmm_program: %s failed: %s\n", function, error_name(r));
  std::exit(1);
}
#define CK(call, name) check(d.call, #name)

bool load(const std::string& lookup) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::fprintf(stderr, "vmm_program: dlopen(libcuda.so.1): %s\n", dlerror());
    return false;
  }
  if (lookup == "dlsym") {
#define VP_DLSYM(name)                                                                   \
  d.name = reinterpret_cast<decltype(d.name)>(dlsym(lib, VP_STR(name)));                 \
  if (d.name == nullptr) {                                                               \
    std::fprintf(stderr, "vmm_program: dlsym(%s): %s\n", VP_STR(name), dlerror());     \
    return false;                                                                        \
  }
    VP_FUNCTIONS(VP_DLSYM)
#undef VP_DLSYM
    return true;
  }
  auto get = reinterpret_cast<decltype(&::cuGetProcAddress)>(dlsym(lib, VP_STR(cuGetProcAddress)));
  if (get == nullptr) {
    std::fprintf(stderr, "vmm_program: dlsym(%s): %s\n", VP_STR(cuGetProcAddress), dlerror());
    return false;
  }
#define VP_PROC(name)                                                                                  \
  {                                                                                                    \
    void* p = nullptr;                                                                                 \
    CUdriverProcAddressQueryResult found{};                                                            \
    const CUresult r = get(#name, &p, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &found);             \
    if (r != CUDA_SUCCESS || p == nullptr) {                                                           \
      std::fprintf(stderr, "vmm_program: cuGetProcAddress(%s) failed: CUresult %d, symbol status %d\n", #name, \
                   static_cast<int>(r), static_cast<int>(found));                                      \
      return false;                                                                                    \
    }                                                                                                  \
    d.name = reinterpret_cast<decltype(d.name)>(p);                                                    \
  }
  VP_FUNCTIONS(VP_PROC)
#undef VP_PROC
  return true;
}

// The byte at offset `o` of data written with `seed`.
unsigned char pattern(uint64_t seed, uint64_t o) {
  uint64_t z = seed * 0x9e3779b97f4a7c15ull + (o / 8) + 1;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<unsigned char>(z >> (8 * (o % 8)));
}

struct range_data {
  CUdeviceptr va;
  size_t gran;
  std::vector<uint64_t> seeds;  // per granule
};

void write_granule(const range_data& r, size_t i, std::vector<unsigned char>& staging) {
  for (size_t o = 0; o < r.gran; ++o) staging[o] = pattern(r.seeds[i], i * r.gran + o);
  CK(cuMemcpyHtoD(r.va + i * r.gran, staging.data(), r.gran), cuMemcpyHtoD);
}

// False after printing the first different byte.
bool verify(const range_data& r, const char* when, std::vector<unsigned char>& staging) {
  for (size_t i = 0; i < r.seeds.size(); ++i) {
    CK(cuMemcpyDtoH(staging.data(), r.va + i * r.gran, r.gran), cuMemcpyDtoH);
    for (size_t o = 0; o < r.gran; ++o) {
      const unsigned char want = pattern(r.seeds[i], i * r.gran + o);
      if (staging[o] != want) {
        std::fprintf(stderr, "vmm_program: %s: byte at offset %zu (granule %zu) is 0x%02x, expected 0x%02x\n", when, i * r.gran + o, i,
                     staging[o], want);
        return false;
      }
    }
  }
  return true;
}

bool wait_for(const char* path) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(300);
  while (::access(path, F_OK) != 0) {
    if (std::chrono::steady_clock::now() > until) {
      std::fprintf(stderr, "vmm_program: %s did not appear within 300 s\n", path);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4 || (std::strcmp(argv[1], "--lookup=proc") != 0 && std::strcmp(argv[1], "--lookup=dlsym") != 0)) {
    std::fprintf(stderr, "usage: %s --lookup=proc|dlsym <granules> <signal-file> [seed]\n", argv[0]);
    return 64;
  }
  const std::string lookup = argv[1] + std::strlen("--lookup=");
  const size_t n = std::strtoull(argv[2], nullptr, 10);
  const char* signal_file = argv[3];
  const uint64_t seed = argc > 4 ? std::strtoull(argv[4], nullptr, 10) : 1;
  if (n < 2) {
    std::fprintf(stderr, "vmm_program: at least 2 granules\n");
    return 64;
  }
  if (!load(lookup)) return 1;

  CK(cuInit(0), cuInit);
  CUdevice dev = 0;
  CK(cuDeviceGet(&dev, 0), cuDeviceGet);
  CUcontext ctx = nullptr;
  CK(cuDevicePrimaryCtxRetain(&ctx, dev), cuDevicePrimaryCtxRetain);
  CK(cuCtxSetCurrent(ctx), cuCtxSetCurrent);

  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  size_t gran = 0;
  CK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), cuMemGetAllocationGranularity);

  range_data r{0, gran, std::vector<uint64_t>(n, seed)};
  CK(cuMemAddressReserve(&r.va, n * gran, 0, 0, 0), cuMemAddressReserve);
  std::vector<CUmemGenericAllocationHandle> handles(n);
  for (size_t i = 0; i < n; ++i) {
    CK(cuMemCreate(&handles[i], gran, &prop, 0), cuMemCreate);
    CK(cuMemMap(r.va + i * gran, gran, 0, handles[i], 0), cuMemMap);
  }
  CUmemAccessDesc rw{};
  rw.location = prop.location;
  rw.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CK(cuMemSetAccess(r.va, n * gran, &rw, 1), cuMemSetAccess);

  std::vector<unsigned char> staging(gran);
  for (size_t i = 0; i < n; ++i) write_granule(r, i, staging);
  if (!verify(r, "after writing", staging)) return 2;
  const bool also_pitch = argc > 5 && std::strcmp(argv[5], "--also-pitch") == 0;
  CUdeviceptr pitched = 0;
  size_t pitch = 0;
  if (also_pitch) CK(cuMemAllocPitch(&pitched, &pitch, 1 << 20, 3, 4), cuMemAllocPitch);
  std::printf("written\n");
  std::fflush(stdout);
  if (!wait_for(signal_file)) return 1;
  if (also_pitch) CK(cuMemFree(pitched), cuMemFree);
  if (!verify(r, "after the wait", staging)) return 2;

  // The handle behind an address inside one granule, and its properties.
  const size_t k = n / 2;
  CUmemGenericAllocationHandle retained = 0;
  CK(cuMemRetainAllocationHandle(&retained, reinterpret_cast<void*>(r.va + k * gran + gran / 2)), cuMemRetainAllocationHandle);
  CUmemAllocationProp got{};
  CK(cuMemGetAllocationPropertiesFromHandle(&got, retained), cuMemGetAllocationPropertiesFromHandle);
  if (got.type != CU_MEM_ALLOCATION_TYPE_PINNED || got.location.type != CU_MEM_LOCATION_TYPE_DEVICE || got.location.id != dev) {
    std::fprintf(stderr, "vmm_program: cuMemGetAllocationPropertiesFromHandle: type %d, location type %d id %d; expected pinned on device %d\n",
                 static_cast<int>(got.type), static_cast<int>(got.location.type), got.location.id, dev);
    return 2;
  }
  CK(cuMemRelease(retained), cuMemRelease);

  // A fresh handle in granule k's place: new bytes there, the rest untouched.
  CK(cuMemUnmap(r.va + k * gran, gran), cuMemUnmap);
  CK(cuMemRelease(handles[k]), cuMemRelease);
  CK(cuMemCreate(&handles[k], gran, &prop, 0), cuMemCreate);
  CK(cuMemMap(r.va + k * gran, gran, 0, handles[k], 0), cuMemMap);
  CK(cuMemSetAccess(r.va + k * gran, gran, &rw, 1), cuMemSetAccess);
  r.seeds[k] = seed + 1000;
  write_granule(r, k, staging);
  if (!verify(r, "after remapping one granule", staging)) return 2;

  for (size_t i = 0; i < n; ++i) {
    CK(cuMemUnmap(r.va + i * gran, gran), cuMemUnmap);
    CK(cuMemRelease(handles[i]), cuMemRelease);
  }
  CK(cuMemAddressFree(r.va, n * gran), cuMemAddressFree);
  CK(cuDevicePrimaryCtxRelease(dev), cuDevicePrimaryCtxRelease);
  std::printf("ok: %zu granules of %zu bytes, every byte matched (lookup %s)\n", n, gran, lookup.c_str());
  return 0;
}

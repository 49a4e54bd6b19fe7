// The host driver (libcuda.so.1 over plain Linux, tests/host_driver/CMakeLists.txt), loaded
// by path with dlopen as a program would load the real one: its VMM calls' semantics and
// errors, export and import sharing memory, cuGetProcAddress's versions, contexts and copies.
#include <cuda.h>
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>
#include <vector>

namespace {

#define HD_STR2(x) #x
#define HD_STR(x) HD_STR2(x)

// The driver's functions by the symbols cuda.h maps their names to (cuMemcpyHtoD ->
// "cuMemcpyHtoD_v2"): each member is named and typed as the header's declaration.
#define HD_FUNCTIONS(X)                                                                                    \
  X(cuInit) X(cuDriverGetVersion) X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetAttribute) X(cuDeviceGetName) \
  X(cuDeviceTotalMem) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) X(cuCtxSetCurrent)            \
  X(cuCtxGetCurrent) X(cuCtxGetDevice) X(cuCtxSynchronize) X(cuCtxCreate) X(cuCtxDestroy) X(cuCtxPushCurrent) \
  X(cuCtxPopCurrent) X(cuMemAlloc) X(cuMemFree) X(cuMemGetInfo) X(cuMemcpyHtoD) X(cuMemcpyDtoH)              \
  X(cuMemcpyDtoD) X(cuMemsetD8) X(cuMemsetD32) X(cuStreamCreate) X(cuStreamDestroy) X(cuMemcpyHtoDAsync)   \
  X(cuGetErrorName) X(cuGetErrorString) X(cuMemGetAllocationGranularity) X(cuMemAddressReserve)             \
  X(cuMemAddressFree) X(cuMemCreate) X(cuMemRelease) X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess)            \
  X(cuMemGetAccess) X(cuMemRetainAllocationHandle) X(cuMemGetAllocationPropertiesFromHandle)                \
  X(cuMemExportToShareableHandle) X(cuMemImportFromShareableHandle) X(cuGetProcAddress)

struct driver {
#define HD_FIELD(name) decltype(&::name) name = nullptr;
  HD_FUNCTIONS(HD_FIELD)
#undef HD_FIELD
  void* lib = nullptr;
};

const driver& drv() {
  static const driver d = [] {
    driver x;
    x.lib = dlopen(VRAMSWAP_HOST_DRIVER, RTLD_NOW | RTLD_LOCAL);
    if (x.lib == nullptr) return x;
#define HD_LOAD(name) x.name = reinterpret_cast<decltype(x.name)>(dlsym(x.lib, HD_STR(name)));
    HD_FUNCTIONS(HD_LOAD)
#undef HD_LOAD
    return x;
  }();
  return d;
}

constexpr size_t k_gran = 2ull << 20;

std::string name_of(CUresult r) {
  const char* s = nullptr;
  return drv().cuGetErrorName(r, &s) == CUDA_SUCCESS ? s : "CUresult " + std::to_string(static_cast<int>(r));
}
#define EXPECT_CU(expected, call) EXPECT_EQ(name_of(call), name_of(expected)) << #call
#define ASSERT_CU(expected, call) ASSERT_EQ(name_of(call), name_of(expected)) << #call

CUmemAllocationProp device_prop(CUmemAllocationHandleType types = CU_MEM_HANDLE_TYPE_NONE) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = 0;
  p.requestedHandleTypes = types;
  return p;
}

CUmemAccessDesc access(CUmemAccess_flags f) {
  CUmemAccessDesc a{};
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.location.id = 0;
  a.flags = f;
  return a;
}

std::vector<unsigned char> random_bytes(size_t n, unsigned seed) {
  std::mt19937_64 gen(seed);
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(gen());
  return v;
}

class HostDriver : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(drv().lib, nullptr) << dlerror();
    ASSERT_CU(CUDA_SUCCESS, drv().cuInit(0));
    ASSERT_CU(CUDA_SUCCESS, drv().cuDevicePrimaryCtxRetain(&ctx_, 0));
    ASSERT_CU(CUDA_SUCCESS, drv().cuCtxSetCurrent(ctx_));
  }
  void TearDown() override { EXPECT_CU(CUDA_SUCCESS, drv().cuDevicePrimaryCtxRelease(0)); }

  size_t free_bytes() {
    size_t f = 0, t = 0;
    EXPECT_CU(CUDA_SUCCESS, drv().cuMemGetInfo(&f, &t));
    return f;
  }

  CUcontext ctx_ = nullptr;
  const driver& d = drv();
};

TEST_F(HostDriver, ExportsTheVersionedSymbolsCudaHMapsTo) {
#define HD_CHECK(name) EXPECT_NE(d.name, nullptr) << HD_STR(name);
  HD_FUNCTIONS(HD_CHECK)
#undef HD_CHECK
  int version = 0;
  EXPECT_CU(CUDA_SUCCESS, d.cuDriverGetVersion(&version));
  EXPECT_EQ(version, CUDA_VERSION);
  int count = 0;
  EXPECT_CU(CUDA_SUCCESS, d.cuDeviceGetCount(&count));
  EXPECT_EQ(count, 1);
  CUdevice dev = -1;
  EXPECT_CU(CUDA_SUCCESS, d.cuDeviceGet(&dev, 0));
  EXPECT_CU(CUDA_ERROR_INVALID_DEVICE, d.cuDeviceGet(&dev, 1));
  int vmm = 0, fd_handles = 0;
  EXPECT_CU(CUDA_SUCCESS, d.cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
  EXPECT_CU(CUDA_SUCCESS, d.cuDeviceGetAttribute(&fd_handles, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 0));
  EXPECT_EQ(vmm, 1);
  EXPECT_EQ(fd_handles, 1);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d.cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_MAX, 0));
  const char* s = nullptr;
  EXPECT_CU(CUDA_SUCCESS, d.cuGetErrorName(CUDA_ERROR_INVALID_VALUE, &s));
  EXPECT_STREQ(s, "CUDA_ERROR_INVALID_VALUE");
  EXPECT_CU(CUDA_SUCCESS, d.cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &s));
  EXPECT_STREQ(s, "out of memory");
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d.cuGetErrorName(static_cast<CUresult>(123456), &s));
  EXPECT_EQ(s, nullptr);
}

TEST_F(HostDriver, ReserveCreateMapSetAccessWriteReadUnmapRelease) {
  CUmemAllocationProp prop = device_prop();
  size_t gran = 0;
  ASSERT_CU(CUDA_SUCCESS, d.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  ASSERT_EQ(gran, k_gran);
  const size_t before = free_bytes();
  constexpr int n = 4;
  CUdeviceptr va = 0;
  ASSERT_CU(CUDA_SUCCESS, d.cuMemAddressReserve(&va, n * gran, 8 * gran, 0, 0));
  EXPECT_EQ(va % (8 * gran), 0u) << "the alignment asked for";
  CUmemGenericAllocationHandle h[n];
  for (auto& x : h) ASSERT_CU(CUDA_SUCCESS, d.cuMemCreate(&x, gran, &prop, 0));
  EXPECT_EQ(free_bytes(), before - n * gran) << "created memory counts against the device";
  for (int i = 0; i < n; ++i) ASSERT_CU(CUDA_SUCCESS, d.cuMemMap(va + i * gran, gran, 0, h[i], 0));
  const auto data = random_bytes(n * gran, 1);
  // Mapped but not accessible yet.
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d.cuMemcpyHtoD(va, data.data(), data.size()));
  const CUmemAccessDesc rw = access(CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  ASSERT_CU(CUDA_SUCCESS, d.cuMemSetAccess(va, n * gran, &rw, 1));
  unsigned long long flags = 0;
  EXPECT_CU(CUDA_SUCCESS, d.cuMemGetAccess(&flags, &rw.location, va + gran));
  EXPECT_EQ(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  ASSERT_CU(CUDA_SUCCESS, d.cuMemcpyHtoD(va, data.data(), data.size()));
  std::vector<unsigned char> back(data.size());
  ASSERT_CU(CUDA_SUCCESS, d.cuMemcpyDtoH(back.data(), va, back.size()));
  EXPECT_EQ(back, data);
  EXPECT_EQ(std::memcmp(reinterpret_cast<const void*>(va), data.data(), data.size()), 0) << "a device pointer is a host address";

  // Read-only: reads go on, writes fail.
  const CUmemAccessDesc ro = access(CU_MEM_ACCESS_FLAGS_PROT_READ);
  ASSERT_CU(CUDA_SUCCESS, d.cuMemSetAccess(va + gran, gran, &ro, 1));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d.cuMemcpyHtoD(va + gran, data.data(), 16));
  EXPECT_CU(CUDA_SUCCESS, d.cuMemcpyDtoH(back.data(), va + gran, 16));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d.cuMemsetD8(va, 0, n * gran)) << "one granule of the range is read-only";

  // One granule unmapped and another handle mapped there: the rest is untouched.
  ASSERT_CU(CUDA_SUCCESS, d.cuMemUnmap(va + 2 * gran, gran));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d.cuMemcpyDtoH(back.data(), va + 2 * gran, 16)) << "unmapped";
  CUmemGenericAllocationHandle fresh = 0;
  ASSERT_CU(CUDA_SUCCESS, d.cuMemCreate(&fresh, gran, &prop, 0));
  ASSERT_CU(CUDA_SUCCESS, d.cuMemMap(va + 2 * gran, gran, 0, fresh, 0));
  ASSERT_CU(CUDA_SUCCESS, d.cuMemSetAccess(va + 2 * gran, gran, &rw, 1));
  std::vector<unsigned char> granule(gran);
  ASSERT_CU(CUDA_SUCCESS, d.cuMemcpyDtoH(granule.data(), va + 2 * gran, gran));
  EXPECT_EQ(granule, std::vector<unsigned char>(gran, 0)) << "a new handle's memory reads zero here";
  // The old handle keeps its bytes while it lives: map it elsewhere and look.
  CUdeviceptr other = 0;
  ASSERT_CU(CUDA_SUCCESS, d.cuMemAddressReserve(&other, gran, 0, 0, 0));
  ASSERT_CU(CUDA_SUCCESS, d.cuMemMap(other, gran, 0, h[2], 0));
  ASSERT_CU(CUDA_SUCCESS, d.cuMemSetAccess(other, gran, &rw, 1));
  ASSERT_CU(CUDA_SUCCESS, d.cuMemcpyDtoH(granule.data(), other, gran));
  EXPECT_EQ(std::memcmp(granule.data(), data.data() + 2 * gran, gran), 0);
  ASSERT_CU(CUDA_SUCCESS, d.cuMemcpyDtoH(back.data(), va, gran));
  EXPECT_EQ(std::memcmp(back.data(), data.data(), gran), 0);
  ASSERT_CU(CUDA_SUCCESS, d.cuMemcpyDtoH(back.data(), va + 3 * gran, gran));
  EXPECT_EQ(std::memcmp(back.data(), data.data() + 3 * gran, gran), 0);

  // Unmap covering several whole mappings at once, then release everything.
  ASSERT_CU(CUDA_SUCCESS, d.cuMemUnmap(va, n * gran));
  ASSERT_CU(CUDA_SUCCESS, d.cuMemUnmap(other, gran));
  for (auto x : h) EXPECT_CU(CUDA_SUCCESS, d.cuMemRelease(x));
  EXPECT_CU(CUDA_SUCCESS, d.cuMemRelease(fresh));
  EXPECT_EQ(free_bytes(), before);
  EXPECT_CU(CUDA_SUCCESS, d.cuMemAddressFree(va, n * gran));
  EXPECT_CU(CUDA_SUCCESS, d.cuMemAddressFree(other, gran));
}

TEST_F(HostDriver, MisuseFailsAsTheRealDriverDoes) {
  CUmemAllocationProp prop = device_prop();
  CUdeviceptr va = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d.cuMemAddressReserve(&va, k_gran + 4096, 0, 0, 0)) << "not a granule multiple";
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d.cuMemAddressReserve(&va, k_gran, 3 * k_gran, 0, 0)) << "alignment not a power of 2";
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d.cuMemAddressReserve(&va, 0, 0, 0, 0));
  CUmemGenericAllocationHandle h = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d.cuMemCreate(&h, k_gran / 2, &prop, 0));
  CUmemAllocationProp bad = prop;
  bad.location.id = 7;
  EXPECT_CU(CUDA_ERROR_INVALID_DEVICE, d.cuMemCreate(&h, k_gran, &bad, 0));
  bad = prop;
  bad.type = CU_MEM_ALLOCATION_TYPE_INVALID;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d.cuMemCreate(&h, k_gran, &bad, 0));
  size_t free_now = 0, total = 0;
  ASSERT_CU(CUDA_SUCCESS, d.cuMemGetInfo(&free_now, &total));
  EXPECT_CU(CUDA_ERROR_OUT_OF_MEMORY, d.cuMemCreate(&h, (total / k_gran + 1) * k_gran, &prop, 0));

  ASSERT_CU(CUDA_SUCCESS, d.cuMemAddressReserve(&va, 2 * k_gran, 0, 0, 0));
  ASSERT_CU(CUDA_SUCCESS, d.cuMemCreate(&h, 2 * k_gran, &prop, 0));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d.cuMemMap(va + k_gran, 2 * k_gran, 0, h, 0)) << "past the reservation's end";
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d.cuMemMap(va, k_gran, 2 * k_gran, h, 0)) << "offset past the handle";
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d.cuMemMap(va + 4096, k_gran, 0, h, 0)) << "unaligned address";
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d.cuMemMap(va, k_gran, 0, h + 12345, 0)) << "no such handle";
  const CUmemAccessDesc rw = access(CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d.cuMemSetAccess(va, k_gran, &rw, 1)) << "nothing mapped";
  // Half the handle at the reservation's second granule (an offset into the handle).
  ASSERT_CU(CUDA_SUCCESS, d.cuMemMap(va + k_gran, k_gran, k_gran, h, 0));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d.cuMemMap(va, 2 * k_gran, 0, h, 0)) << "overlaps a mapping";
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d.cuMemSetAccess(va, 2 * k_gran, &rw, 1)) << "half the range unmapped";
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d.cuMemUnmap(va, 2 * k_gran)) << "half the range unmapped";
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d.cuMemAddressFree(va, 2 * k_gran)) << "still mapped";
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d.cuMemAddressFree(va, k_gran)) << "not the reservation's size";
  int fd = -1;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d.cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0))
      << "made without an exportable handle type";
  CUmemAccessDesc wrong = rw;
  wrong.location.id = 3;
  EXPECT_CU(CUDA_ERROR_INVALID_DEVICE, d.cuMemSetAccess(va + k_gran, k_gran, &wrong, 1));

  // Released while mapped: the memory stays until it is unmapped, the handle is gone.
  ASSERT_CU(CUDA_SUCCESS, d.cuMemSetAccess(va + k_gran, k_gran, &rw, 1));
  ASSERT_CU(CUDA_SUCCESS, d.cuMemsetD32(va + k_gran, 0xabcdef01u, k_gran / 4));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d.cuMemsetD32(va + k_gran + 1, 0, 4)) << "misaligned";
  const size_t before = free_bytes();
  ASSERT_CU(CUDA_SUCCESS, d.cuMemRelease(h));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d.cuMemRelease(h)) << "released twice";
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d.cuMemMap(va, k_gran, 0, h, 0)) << "a released handle";
  EXPECT_EQ(free_bytes(), before) << "still mapped: still allocated";
  unsigned int word = 0;
  ASSERT_CU(CUDA_SUCCESS, d.cuMemcpyDtoH(&word, va + 2 * k_gran - 4, 4));
  EXPECT_EQ(word, 0xabcdef01u);
  ASSERT_CU(CUDA_SUCCESS, d.cuMemUnmap(va + k_gran, k_gran));
  EXPECT_EQ(free_bytes(), before + 2 * k_gran) << "unmapped and released: freed";
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d.cuMemUnmap(va + k_gran, k_gran)) << "unmapped twice";
  EXPECT_CU(CUDA_SUCCESS, d.cuMemAddressFree(va, 2 * k_gran));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d.cuMemAddressFree(va, 2 * k_gran)) << "freed twice";
}

TEST_F(HostDriver, RetainedHandleAndItsProperties) {
  CUmemAllocationProp prop = device_prop(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  CUdeviceptr va = 0;
  CUmemGenericAllocationHandle h = 0;
  ASSERT_CU(CUDA_SUCCESS, d.cuMemAddressReserve(&va, 2 * k_gran, 0, 0, 0));
  ASSERT_CU(CUDA_SUCCESS, d.cuMemCreate(&h, 2 * k_gran, &prop, 0));
  ASSERT_CU(CUDA_SUCCESS, d.cuMemMap(va, 2 * k_gran, 0, h, 0));
  CUmemGenericAllocationHandle retained = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d.cuMemRetainAllocationHandle(&retained, reinterpret_cast<void*>(va + 2 * k_gran)));
  ASSERT_CU(CUDA_SUCCESS, d.cuMemRetainAllocationHandle(&retained, reinterpret_cast<void*>(va + k_gran + 123)));
  EXPECT_EQ(retained, h);
  CUmemAllocationProp got{};
  ASSERT_CU(CUDA_SUCCESS, d.cuMemGetAllocationPropertiesFromHandle(&got, retained));
  EXPECT_EQ(got.type, CU_MEM_ALLOCATION_TYPE_PINNED);
  EXPECT_EQ(got.location.type, CU_MEM_LOCATION_TYPE_DEVICE);
  EXPECT_EQ(got.location.id, 0);
  EXPECT_EQ(got.requestedHandleTypes, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  // Two references: the first release leaves the handle usable.
  ASSERT_CU(CUDA_SUCCESS, d.cuMemRelease(h));
  EXPECT_CU(CUDA_SUCCESS, d.cuMemGetAllocationPropertiesFromHandle(&got, retained));
  ASSERT_CU(CUDA_SUCCESS, d.cuMemRelease(retained));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d.cuMemGetAllocationPropertiesFromHandle(&got, retained));
  ASSERT_CU(CUDA_SUCCESS, d.cuMemUnmap(va, 2 * k_gran));
  ASSERT_CU(CUDA_SUCCESS, d.cuMemAddressFree(va, 2 * k_gran));
}

TEST_F(HostDriver, ExportedAndImportedHandlesShareTheirBytes) {
  CUmemAllocationProp prop = device_prop(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  CUmemGenericAllocationHandle h = 0;
  ASSERT_CU(CUDA_SUCCESS, d.cuMemCreate(&h, k_gran, &prop, 0));
  int fd = -1;
  EXPECT_CU(CUDA_ERROR_NOT_SUPPORTED, d.cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_FABRIC, 0));
  ASSERT_CU(CUDA_SUCCESS, d.cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  ASSERT_GE(fd, 0);
  CUmemGenericAllocationHandle imported = 0;
  ASSERT_CU(CUDA_SUCCESS, d.cuMemImportFromShareableHandle(&imported, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  ::close(fd);  // the imported handle holds its own
  EXPECT_NE(imported, h);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d.cuMemImportFromShareableHandle(&imported, reinterpret_cast<void*>(intptr_t{-1}),
                                                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  CUmemAllocationProp got{};
  ASSERT_CU(CUDA_SUCCESS, d.cuMemGetAllocationPropertiesFromHandle(&got, imported));
  EXPECT_EQ(got.location.id, 0);

  CUdeviceptr a = 0, b = 0;
  ASSERT_CU(CUDA_SUCCESS, d.cuMemAddressReserve(&a, k_gran, 0, 0, 0));
  ASSERT_CU(CUDA_SUCCESS, d.cuMemAddressReserve(&b, k_gran, 0, 0, 0));
  ASSERT_CU(CUDA_SUCCESS, d.cuMemMap(a, k_gran, 0, h, 0));
  ASSERT_CU(CUDA_SUCCESS, d.cuMemMap(b, k_gran, 0, imported, 0));
  const CUmemAccessDesc rw = access(CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  ASSERT_CU(CUDA_SUCCESS, d.cuMemSetAccess(a, k_gran, &rw, 1));
  ASSERT_CU(CUDA_SUCCESS, d.cuMemSetAccess(b, k_gran, &rw, 1));
  const auto data = random_bytes(k_gran, 5);
  ASSERT_CU(CUDA_SUCCESS, d.cuMemcpyHtoD(a, data.data(), data.size()));
  std::vector<unsigned char> back(k_gran);
  ASSERT_CU(CUDA_SUCCESS, d.cuMemcpyDtoH(back.data(), b, back.size()));
  EXPECT_EQ(back, data) << "the importer sees the exporter's bytes";
  ASSERT_CU(CUDA_SUCCESS, d.cuMemsetD8(b, 0x5a, 100));
  ASSERT_CU(CUDA_SUCCESS, d.cuMemcpyDtoH(back.data(), a, 100));
  EXPECT_EQ(back[99], 0x5a) << "and the exporter the importer's";
  // The creator releases and unmaps first: the importer's mapping keeps the memory.
  ASSERT_CU(CUDA_SUCCESS, d.cuMemUnmap(a, k_gran));
  ASSERT_CU(CUDA_SUCCESS, d.cuMemRelease(h));
  ASSERT_CU(CUDA_SUCCESS, d.cuMemcpyDtoH(back.data(), b + 100, 100));
  EXPECT_EQ(std::memcmp(back.data(), data.data() + 100, 100), 0);
  ASSERT_CU(CUDA_SUCCESS, d.cuMemUnmap(b, k_gran));
  ASSERT_CU(CUDA_SUCCESS, d.cuMemRelease(imported));
  ASSERT_CU(CUDA_SUCCESS, d.cuMemAddressFree(a, k_gran));
  ASSERT_CU(CUDA_SUCCESS, d.cuMemAddressFree(b, k_gran));
}

TEST_F(HostDriver, ProcAddressGivesEachAbiByBaseNameAndVersion) {
  auto get = [&](const char* name, int version, cuuint64_t flags, CUdriverProcAddressQueryResult* status) {
    void* p = nullptr;
    const CUresult r = d.cuGetProcAddress(name, &p, version, flags, status);
    return r == CUDA_SUCCESS ? p : nullptr;
  };
  CUdriverProcAddressQueryResult status{};
  EXPECT_EQ(get("cuMemAlloc", CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &status), dlsym(d.lib, "cuMemAlloc_v2"));
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS);
  EXPECT_EQ(get("cuMemCreate", CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &status), dlsym(d.lib, "cuMemCreate"));
  // CUDA 13's new ABIs, and the ones cuda.h still declares (core/cuda/declared_abi.hpp).
  EXPECT_EQ(get("cuCtxSynchronize", 13000, CU_GET_PROC_ADDRESS_DEFAULT, &status), dlsym(d.lib, "cuCtxSynchronize_v2"));
  EXPECT_EQ(get("cuCtxSynchronize", 12000, CU_GET_PROC_ADDRESS_DEFAULT, &status), dlsym(d.lib, "cuCtxSynchronize"));
  EXPECT_EQ(get("cuCtxGetDevice", 12000, CU_GET_PROC_ADDRESS_DEFAULT, &status), dlsym(d.lib, "cuCtxGetDevice"));
  EXPECT_EQ(get("cuGetProcAddress", 11030, CU_GET_PROC_ADDRESS_DEFAULT, &status), dlsym(d.lib, "cuGetProcAddress"));
  EXPECT_EQ(get("cuGetProcAddress", 12000, CU_GET_PROC_ADDRESS_DEFAULT, &status), dlsym(d.lib, "cuGetProcAddress_v2"));
  EXPECT_EQ(get("cuCtxCreate", 12000, CU_GET_PROC_ADDRESS_DEFAULT, &status), dlsym(d.lib, "cuCtxCreate_v3"));
  // Per-thread default stream: its own entry points where a function has them.
  EXPECT_EQ(get("cuMemcpyHtoD", CUDA_VERSION, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status),
            dlsym(d.lib, "cuMemcpyHtoD_v2_ptds"));
  EXPECT_EQ(get("cuMemcpyHtoD", CUDA_VERSION, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status), dlsym(d.lib, "cuMemcpyHtoD_v2"));
  EXPECT_EQ(get("cuMemAlloc", CUDA_VERSION, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status), dlsym(d.lib, "cuMemAlloc_v2"));
  // Absent, and too new for the version asked.
  void* p = reinterpret_cast<void*>(1);
  EXPECT_CU(CUDA_ERROR_NOT_FOUND, d.cuGetProcAddress("cuFuncGetParamInfo", &p, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &status));
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  EXPECT_CU(CUDA_ERROR_NOT_FOUND, d.cuGetProcAddress("cuMemCreate", &p, 10000, CU_GET_PROC_ADDRESS_DEFAULT, &status));
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d.cuGetProcAddress("cuMemAlloc", &p, CUDA_VERSION, 0x40, &status));
}

TEST_F(HostDriver, ContextsStreamsAllocationsAndCopies) {
  CUdevice dev = -1;
  EXPECT_CU(CUDA_SUCCESS, d.cuCtxGetDevice(&dev));
  EXPECT_EQ(dev, 0);
  EXPECT_CU(CUDA_SUCCESS, d.cuCtxSynchronize());
  // Another thread has no current context.
  std::thread([&] {
    CUdeviceptr p = 0;
    CUcontext c = reinterpret_cast<CUcontext>(1);
    EXPECT_CU(CUDA_SUCCESS, d.cuCtxGetCurrent(&c));
    EXPECT_EQ(c, nullptr);
    EXPECT_CU(CUDA_ERROR_INVALID_CONTEXT, d.cuMemAlloc(&p, 4096));
    EXPECT_CU(CUDA_ERROR_INVALID_CONTEXT, d.cuCtxSynchronize());
  }).join();
  // A context of its own, pushed and popped.
  CUcontext own = nullptr, popped = nullptr, cur = nullptr;
  ASSERT_CU(CUDA_SUCCESS, d.cuCtxCreate(&own, nullptr, 0, 0));
  EXPECT_CU(CUDA_SUCCESS, d.cuCtxGetCurrent(&cur));
  EXPECT_EQ(cur, own);
  EXPECT_CU(CUDA_SUCCESS, d.cuCtxPopCurrent(&popped));
  EXPECT_EQ(popped, own);
  EXPECT_CU(CUDA_SUCCESS, d.cuCtxGetCurrent(&cur));
  EXPECT_EQ(cur, ctx_);
  EXPECT_CU(CUDA_ERROR_INVALID_CONTEXT, d.cuCtxDestroy(ctx_)) << "a primary context is released, not destroyed";
  EXPECT_CU(CUDA_SUCCESS, d.cuCtxDestroy(own));
  EXPECT_CU(CUDA_ERROR_INVALID_CONTEXT, d.cuCtxPushCurrent(own));

  const size_t before = free_bytes();
  CUdeviceptr a = 0, b = 0;
  ASSERT_CU(CUDA_SUCCESS, d.cuMemAlloc(&a, 1 << 20));
  ASSERT_CU(CUDA_SUCCESS, d.cuMemAlloc(&b, 1 << 20));
  EXPECT_EQ(free_bytes(), before - (2 << 20));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d.cuMemAlloc(&a, 0));
  CUstream s = nullptr;
  ASSERT_CU(CUDA_SUCCESS, d.cuStreamCreate(&s, 0));
  const auto data = random_bytes(1 << 20, 9);
  ASSERT_CU(CUDA_SUCCESS, d.cuMemcpyHtoDAsync(a, data.data(), data.size(), s));
  ASSERT_CU(CUDA_SUCCESS, d.cuMemcpyDtoD(b, a, data.size()));
  std::vector<unsigned char> back(data.size());
  ASSERT_CU(CUDA_SUCCESS, d.cuMemcpyDtoH(back.data(), b, back.size()));
  EXPECT_EQ(back, data);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d.cuMemcpyDtoH(back.data(), b + 1, back.size())) << "past the allocation's end";
  ASSERT_CU(CUDA_SUCCESS, d.cuStreamDestroy(s));
  EXPECT_CU(CUDA_ERROR_INVALID_HANDLE, d.cuMemcpyHtoDAsync(a, data.data(), 1, s)) << "a destroyed stream";
  ASSERT_CU(CUDA_SUCCESS, d.cuMemFree(a));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d.cuMemFree(a)) << "freed twice";
  ASSERT_CU(CUDA_SUCCESS, d.cuMemFree(b));
  EXPECT_EQ(free_bytes(), before);
}

}  // namespace

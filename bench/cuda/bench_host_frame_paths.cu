// bench_host_frame_paths: how fast the primitives under oversubscription's reclaim run on this
// machine, side by side: creating host frames (cuMemCreate in host memory), and moving a
// page between a device frame and a host frame by the copy engine (cuMemcpyDtoDAsync) and by
// a copy kernel, against the pinned cudaMemcpy baseline.
//
//   build: part of the CMake build where nvcc is found (target bench_host_frame_paths), or
//          nvcc -O2 -arch=native -I. -o bench_host_frame_paths bench/cuda/bench_host_frame_paths.cu -lcuda
//   run:   bench_host_frame_paths [frames (default 64)] [frame MiB (default 32)]
// Prints a markdown table; GB/s are one-way bytes moved per second. Exit 1 when a byte that
// went through host frames came back wrong, 2 on a CUDA error.
#include <cuda.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "bench/support/cu_check.hpp"

namespace {

#define RT(x)                                                                   \
  do {                                                                          \
    cudaError_t r_ = (x);                                                       \
    if (r_ != cudaSuccess) {                                                    \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(r_)); \
      std::exit(2);                                                             \
    }                                                                           \
  } while (0)

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

__global__ void copy16(int4* dst, const int4* src, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) dst[i] = src[i];
}

CUmemAllocationProp host_prop() {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  p.location.id = 0;
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  const int frames = argc > 1 ? std::atoi(argv[1]) : 64;
  const size_t frame = size_t(argc > 2 ? std::atoi(argv[2]) : 32) << 20;
  const size_t bytes = frames * frame;
  RT(cudaSetDevice(0));
  RT(cudaFree(nullptr));
  CUcontext ctx;
  CU(cuCtxGetCurrent(&ctx));
  const CUmemAllocationProp prop = host_prop();

  // 1. Creating host frames: one thread, then four.
  std::vector<CUmemGenericAllocationHandle> h(frames), h4(frames);
  double t = now();
  for (int i = 0; i < frames; ++i) CU(cuMemCreate(&h[i], frame, &prop, 0));
  const double create1 = now() - t;
  t = now();
  {
    std::vector<std::thread> ts;
    for (int k = 0; k < 4; ++k) {
      ts.emplace_back([&, k] {
        CU(cuCtxSetCurrent(ctx));
        for (int i = k; i < frames; i += 4) CU(cuMemCreate(&h4[i], frame, &prop, 0));
      });
    }
    for (auto& x : ts) x.join();
  }
  const double create4 = now() - t;
  t = now();
  for (int i = 0; i < frames; ++i) CU(cuMemRelease(h4[i]));
  const double release = now() - t;
  std::printf("# Host frames: the primitives under a reclaim (%d frames of %zu MiB)\n\n| what | value |\n| --- | ---: |\n", frames,
              frame >> 20);
  std::printf("| create a host frame (cuMemCreate, HOST_NUMA), one thread | %.3f ms |\n", create1 * 1e3 / frames);
  std::printf("| the same, four threads at once (wall time per frame) | %.3f ms |\n", create4 * 1e3 / frames);
  std::printf("| release one (cuMemRelease) | %.3f ms |\n", release * 1e3 / frames);

  // 2. The host frames mapped contiguously; device memory of the same size.
  CUdeviceptr host_va = 0;
  CU(cuMemAddressReserve(&host_va, bytes, frame, 0, 0));
  t = now();
  for (int i = 0; i < frames; ++i) CU(cuMemMap(host_va + i * frame, frame, 0, h[i], 0));
  const double map_s = now() - t;
  CUmemAccessDesc acc{};
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = 0;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  t = now();
  for (int i = 0; i < frames; ++i) CU(cuMemSetAccess(host_va + i * frame, frame, &acc, 1));
  const double access_s = now() - t;
  std::printf("| map one (cuMemMap) | %.3f ms |\n| grant the device access to one (cuMemSetAccess) | %.3f ms |\n",
              map_s * 1e3 / frames, access_s * 1e3 / frames);
  {
    // The same frames mapped again elsewhere, access granted once per run of 16 mappings (as
    // remap_pages and malloc do), then unmapped one by one.
    constexpr int k_run = 16;
    CUdeviceptr va2 = 0;
    CU(cuMemAddressReserve(&va2, bytes, frame, 0, 0));
    for (int i = 0; i < frames; ++i) CU(cuMemMap(va2 + i * frame, frame, 0, h[i], 0));
    t = now();
    int calls = 0;
    for (int i = 0; i < frames; i += k_run, ++calls) {
      const int n = frames - i < k_run ? frames - i : k_run;
      CU(cuMemSetAccess(va2 + i * frame, n * frame, &acc, 1));
    }
    const double run_s = now() - t;
    t = now();
    for (int i = 0; i < frames; ++i) CU(cuMemUnmap(va2 + i * frame, frame));
    const double unmap_s = now() - t;
    CU(cuMemAddressFree(va2, bytes));
    std::printf("| grant access to %d mappings side by side in one cuMemSetAccess, frames mapped and granted at another "
                "address already: per call / per frame | %.3f / %.3f ms |\n", k_run, run_s * 1e3 / calls, run_s * 1e3 / frames);
    std::printf("| unmap one (cuMemUnmap) | %.3f ms |\n", unmap_s * 1e3 / frames);
  }
  {
    // The same runs of 16 over frames mapped nowhere else: which part of a grant's cost is the
    // frame's first mapping with access (as a reclaim's host frame at the page's address) and
    // which the call's.
    constexpr int k_run = 16;
    std::vector<CUmemGenericAllocationHandle> fresh(frames);
    for (int i = 0; i < frames; ++i) CU(cuMemCreate(&fresh[i], frame, &prop, 0));
    CUdeviceptr va3 = 0;
    CU(cuMemAddressReserve(&va3, bytes, frame, 0, 0));
    for (int i = 0; i < frames; ++i) CU(cuMemMap(va3 + i * frame, frame, 0, fresh[i], 0));
    t = now();
    int calls = 0;
    for (int i = 0; i < frames; i += k_run, ++calls) {
      const int n = frames - i < k_run ? frames - i : k_run;
      CU(cuMemSetAccess(va3 + i * frame, n * frame, &acc, 1));
    }
    const double run_s = now() - t;
    std::printf("| grant access to %d mappings side by side in one cuMemSetAccess, frames mapped nowhere else: per call / per "
                "frame | %.3f / %.3f ms |\n", k_run, run_s * 1e3 / calls, run_s * 1e3 / frames);
    for (int i = 0; i < frames; ++i) CU(cuMemUnmap(va3 + i * frame, frame));
    CU(cuMemAddressFree(va3, bytes));
    for (int i = 0; i < frames; ++i) CU(cuMemRelease(fresh[i]));
  }
  void* dev = nullptr;
  RT(cudaMalloc(&dev, bytes));
  RT(cudaMemset(dev, 0x5a, bytes));
  void* pinned = nullptr;
  RT(cudaHostAlloc(&pinned, bytes, cudaHostAllocDefault));
  std::memset(pinned, 0, bytes);
  cudaStream_t s;
  RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  auto rate = [&](const char* name, auto&& body) {
    body();  // warm
    RT(cudaStreamSynchronize(s));
    const double t0 = now();
    for (int r = 0; r < 3; ++r) body();
    RT(cudaStreamSynchronize(s));
    std::printf("| %s | %.2f GB/s |\n", name, 3.0 * bytes / (now() - t0) / 1e9);
  };
  const CUdeviceptr d = reinterpret_cast<CUdeviceptr>(dev);
  // 3. Copy engine, page by page (as remap_pages does) and as one copy.
  rate("copy engine, device -> host frames, a copy per frame", [&] {
    for (int i = 0; i < frames; ++i) CU(cuMemcpyDtoDAsync(host_va + i * frame, d + i * frame, frame, s));
  });
  rate("copy engine, host frames -> device, a copy per frame", [&] {
    for (int i = 0; i < frames; ++i) CU(cuMemcpyDtoDAsync(d + i * frame, host_va + i * frame, frame, s));
  });
  rate("copy engine, device -> host frames, one copy", [&] { CU(cuMemcpyDtoDAsync(host_va, d, bytes, s)); });
  // 4. A copy kernel (SMs).
  rate("copy kernel, device -> host frames", [&] {
    copy16<<<264, 1024, 0, s>>>(reinterpret_cast<int4*>(host_va), static_cast<const int4*>(dev), bytes / 16);
  });
  rate("copy kernel, host frames -> device", [&] {
    copy16<<<264, 1024, 0, s>>>(static_cast<int4*>(dev), reinterpret_cast<const int4*>(host_va), bytes / 16);
  });
  // 5. The baseline: pinned cudaMemcpy.
  rate("baseline: cudaMemcpy device -> pinned host", [&] { RT(cudaMemcpyAsync(pinned, dev, bytes, cudaMemcpyDeviceToHost, s)); });
  rate("baseline: cudaMemcpy pinned host -> device", [&] { RT(cudaMemcpyAsync(dev, pinned, bytes, cudaMemcpyHostToDevice, s)); });

  // Every byte made it through (the last copy into host frames was the kernel's).
  std::vector<unsigned char> back(frame);
  bool right = true;
  for (int i = 0; i < frames && right; ++i) {
    RT(cudaMemcpy(back.data(), reinterpret_cast<void*>(host_va + i * frame), frame, cudaMemcpyDefault));
    for (size_t b = 0; b < frame; ++b) right = right && back[b] == 0x5a;
  }
  std::printf("| every byte through host frames right | %s |\n", right ? "yes" : "NO");
  return right ? 0 : 1;
}

// bench_pinning: how fast this machine makes pinned host memory for saved pages, by the
// number of threads making it at once, against the pinned device-to-host copy it feeds.
// The steps are those of core/pinned_chunk (mmap, MADV_HUGEPAGE, MADV_POPULATE_WRITE,
// cuMemHostRegister) and of the swap file's fixed buffers (io_uring_register_buffers):
// timed apart (every thread faults in its chunks, then every thread registers them) and
// together (each thread makes its chunks one after another, as a pinning thread does), and
// with one chunk's faulting in split over the threads, one or two chunks in the making.
//
//   build: part of the CMake build where nvcc is found (target bench_pinning)
//   run:   bench_pinning [GiB in all (default 16)] [chunk MiB (default 512)] [threads list (default 1,2,4,8,12)]
// Prints a markdown table; GB/s are bytes made per second of wall time. Exit 2 on an error.
#include <cuda.h>
#include <liburing.h>
#include <sys/mman.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#include "bench/support/cu_check.hpp"

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

void die(const char* what) {
  std::fprintf(stderr, "bench_pinning: %s: %s\n", what, std::strerror(errno));
  std::exit(2);
}

char* map_chunk(size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) die("mmap");
  ::madvise(p, bytes, MADV_HUGEPAGE);
  return static_cast<char*>(p);
}

void fault_in(char* p, size_t bytes) {
  if (::madvise(p, bytes, MADV_POPULATE_WRITE) != 0) die("madvise(MADV_POPULATE_WRITE)");
}

void register_uring(char* p, size_t bytes) {
  // One ring per chunk, as a stand-in for the swap file's update of one fixed buffer; the
  // kernel's cost is pinning the pages again and coalescing them, per registered buffer.
  io_uring ring;
  if (io_uring_queue_init(4, &ring, 0) != 0) die("io_uring_queue_init");
  for (size_t off = 0; off < bytes; off += size_t{1} << 30) {
    iovec iov{p + off, std::min(bytes - off, size_t{1} << 30)};
    const int rc = io_uring_register_buffers(&ring, &iov, 1);
    if (rc != 0) {
      errno = -rc;
      die("io_uring_register_buffers");
    }
    io_uring_unregister_buffers(&ring);
  }
  io_uring_queue_exit(&ring);
}

template <class Fn>
double on_threads(int threads, CUcontext ctx, const std::vector<char*>& chunks, Fn fn) {
  const double t0 = now();
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      CU(cuCtxSetCurrent(ctx));
      for (size_t i = t; i < chunks.size(); i += threads) fn(chunks[i]);
    });
  }
  for (auto& th : ts) th.join();
  return now() - t0;
}

std::string read_file(const char* path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t total = size_t(argc > 1 ? std::atoi(argv[1]) : 16) << 30;
  const size_t chunk = size_t(argc > 2 ? std::atoi(argv[2]) : 512) << 20;
  std::vector<int> thread_counts;
  {
    std::stringstream ss(argc > 3 ? argv[3] : "1,2,4,8,12");
    for (std::string s; std::getline(ss, s, ',');) thread_counts.push_back(std::atoi(s.c_str()));
  }
  const size_t n = total / chunk;

  CU(cuInit(0));
  CUdevice dev;
  CU(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CU(cuDevicePrimaryCtxRetain(&ctx, dev));
  CU(cuCtxSetCurrent(ctx));

  // The copy these chunks feed: 4 GiB device to host into pinned memory, best of 3.
  const size_t copy_bytes = std::min(total, size_t{4} << 30);
  CUdeviceptr d;
  CU(cuMemAlloc(&d, copy_bytes));
  CU(cuMemsetD8(d, 0x5a, copy_bytes));
  char* h = map_chunk(copy_bytes);
  fault_in(h, copy_bytes);
  CU(cuMemHostRegister(h, copy_bytes, 0));
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    const double t0 = now();
    CU(cuMemcpyDtoH(h, d, copy_bytes));
    best = std::min(best, now() - t0);
  }
  const double copy_rate = copy_bytes / best / 1e9;
  CU(cuMemHostUnregister(h));
  ::munmap(h, copy_bytes);
  CU(cuMemFree(d));

  std::printf("transparent huge pages: enabled %s, defrag %s\n",
              read_file("/sys/kernel/mm/transparent_hugepage/enabled").c_str(),
              read_file("/sys/kernel/mm/transparent_hugepage/defrag").c_str());
  std::printf("pinned copy, device to host, %zu MiB: %.1f GB/s\n\n", copy_bytes >> 20, copy_rate);
  std::printf("%zu GiB in chunks of %zu MiB; GB/s (and / pinned copy)\n\n", total >> 30, chunk >> 20);
  std::printf("| threads | fault in | cuMemHostRegister | io_uring register | fault in + cuMemHostRegister, per chunk | one chunk at a time, fault in split over the threads | two chunks at a time, fault in split over half the threads each |\n");
  std::printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  auto cell = [&](double secs) {
    char buf[64];
    const double r = total / secs / 1e9;
    std::snprintf(buf, sizeof buf, "%.1f (%.2f)", r, r / copy_rate);
    return std::string(buf);
  };
  auto unpin_all = [&](int threads, const std::vector<char*>& chunks) {
    on_threads(threads, ctx, chunks, [&](char* c) {
      CU(cuMemHostUnregister(c));
      ::munmap(c, chunk);
    });
  };
  // Fault in one chunk with `split` threads (each a contiguous piece), then register it.
  auto make_split = [&](char* c, int split) {
    std::vector<char*> pieces(split);
    const size_t piece = chunk / split;
    for (int i = 0; i < split; ++i) pieces[i] = c + i * piece;
    on_threads(split, ctx, pieces, [&](char* q) { fault_in(q, piece); });
    CU(cuMemHostRegister(c, chunk, 0));
  };
  for (const int threads : thread_counts) {
    std::vector<char*> chunks(n);
    for (auto& c : chunks) c = map_chunk(chunk);
    const double t_fault = on_threads(threads, ctx, chunks, [&](char* c) { fault_in(c, chunk); });
    const double t_reg = on_threads(threads, ctx, chunks, [&](char* c) { CU(cuMemHostRegister(c, chunk, 0)); });
    const double t_uring = on_threads(threads, ctx, chunks, [&](char* c) { register_uring(c, chunk); });
    unpin_all(threads, chunks);
    for (auto& c : chunks) c = map_chunk(chunk);
    const double t_both = on_threads(threads, ctx, chunks, [&](char* c) {
      fault_in(c, chunk);
      CU(cuMemHostRegister(c, chunk, 0));
    });
    unpin_all(threads, chunks);
    for (auto& c : chunks) c = map_chunk(chunk);
    const double t_split = on_threads(1, ctx, chunks, [&](char* c) { make_split(c, threads); });
    unpin_all(threads, chunks);
    for (auto& c : chunks) c = map_chunk(chunk);
    const double t_two = on_threads(2, ctx, chunks, [&](char* c) { make_split(c, std::max(1, threads / 2)); });
    unpin_all(threads, chunks);
    std::printf("| %d | %s | %s | %s | %s | %s | %s |\n", threads, cell(t_fault).c_str(), cell(t_reg).c_str(), cell(t_uring).c_str(),
                cell(t_both).c_str(), cell(t_split).c_str(), cell(t_two).c_str());
    std::fflush(stdout);
  }
  CU(cuDevicePrimaryCtxRelease(dev));
  return 0;
}

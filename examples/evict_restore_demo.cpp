// evict_restore_demo: a buffer's frame is evicted to pinned host memory and restored at the
// same virtual address, so a pointer taken before the eviction stays valid. This is what the
// pager does for every page of a process, shown here with the backend interface directly.
//
// Build and run (from the repository root):
//   cmake -S . -B build -G Ninja && ninja -C build vramswap_demo && ./build/examples/vramswap_demo [MiB]
// VRAMSWAP_BACKEND=host|cuda picks the backend (default: cuda where a GPU is usable).
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "core/backend.hpp"
#include "core/status.hpp"

using namespace vramswap;
using namespace vramswap::detail;

namespace {

void check(int rc, const char* what) {
  if (rc == ok) return;
  std::fprintf(stderr, "vramswap_demo: %s failed: %s: %s\n", what, status_name(rc), last_error());
  std::exit(1);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const size_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 256;
  backend* be = nullptr;
  check(default_backend(&be), "choosing a backend");
  device_info info;
  check(be->get_device_info(0, &info), "get_device_info");
  const size_t size = (mib << 20) / info.granularity * info.granularity;
  std::printf("backend %s, device 0: %s (%s), %.1f GiB, granularity %" PRIu64 " KiB\n", be->name(), info.name.c_str(),
              info.uuid.c_str(), info.total_bytes / 1073741824.0, info.granularity >> 10);

  // 1. Reserve an address range and back it with one frame.
  device_ptr va = 0;
  check(be->reserve(0, size, 0, &va), "reserve");
  frame_id frame = 0;
  check(be->create_frame(0, size, &frame), "create_frame");
  check(be->map(va, size, frame, 0), "map");
  check(be->set_access(va, size, access_flags::read_write), "set_access");
  std::printf("1. %zu MiB buffer at device address 0x%" PRIxPTR ", backed by frame %" PRIu64 "\n", size >> 20, va, frame);

  // 2. Fill it with random bytes (through pinned memory, as everything that moves does).
  void* staging = nullptr;
  void* original = nullptr;
  check(be->host_alloc(size, &staging), "host_alloc");
  check(be->host_alloc(size, &original), "host_alloc");
  std::mt19937_64 rng(2026);
  for (size_t i = 0; i < size / 8; ++i) static_cast<uint64_t*>(original)[i] = rng() | 1;
  stream_id s = 0;
  check(be->stream_create(0, &s), "stream_create");
  check(be->copy_h2d(va, original, size, s), "copy_h2d");
  check(be->stream_synchronize(s), "stream_synchronize");
  std::printf("2. wrote %zu MiB of random data\n", size >> 20);

  // 3. Evict: copy out to pinned host memory, unmap, give the frame back.
  auto t0 = std::chrono::steady_clock::now();
  check(be->copy_d2h(staging, va, size, s), "copy_d2h");
  check(be->stream_synchronize(s), "stream_synchronize");
  check(be->unmap(va, size), "unmap");
  check(be->release_frame(frame), "release_frame");
  const double out_s = seconds_since(t0);
  device_info during;
  check(be->get_device_info(0, &during), "get_device_info");
  std::printf("3. evicted to host in %.1f ms (%.1f GB/s); the device has %.1f GiB free, the address range stays reserved\n",
              out_s * 1e3, size / out_s / 1e9, during.free_bytes / 1073741824.0);

  // 4. Restore: a new frame mapped at the same address, contents copied back in.
  t0 = std::chrono::steady_clock::now();
  frame_id again = 0;
  check(be->create_frame(0, size, &again), "create_frame");
  check(be->map(va, size, again, 0), "map");
  check(be->set_access(va, size, access_flags::read_write), "set_access");
  check(be->copy_h2d(va, staging, size, s), "copy_h2d");
  check(be->stream_synchronize(s), "stream_synchronize");
  const double in_s = seconds_since(t0);
  std::printf("4. restored at the same address 0x%" PRIxPTR " in new frame %" PRIu64 " in %.1f ms (%.1f GB/s)\n", va, again,
              in_s * 1e3, size / in_s / 1e9);

  // 5. Check every byte through the old pointer.
  std::memset(staging, 0, size);
  check(be->copy_d2h(staging, va, size, s), "copy_d2h");
  check(be->stream_synchronize(s), "stream_synchronize");
  const bool same = std::memcmp(staging, original, size) == 0;
  std::printf("5. all %zu bytes read back through the pointer taken before eviction: %s\n", size, same ? "identical" : "DIFFERENT");

  check(be->stream_destroy(s), "stream_destroy");
  check(be->unmap(va, size), "unmap");
  check(be->release_frame(again), "release_frame");
  check(be->unreserve(va, size), "unreserve");
  check(be->host_free(staging), "host_free");
  check(be->host_free(original), "host_free");
  return same ? 0 : 1;
}

// A process that uses only the public C++ API, for the public API's cross-process tests.
//
// usage: api_worker hold <device> <hold-ms> <ready-file>
//   take gpu_lock(device), create <ready-file>, hold the lock <hold-ms>, release, exit 0.
// usage: api_worker fill <device> <bytes> <ready-file> <release-file>
//   take gpu_lock(device), allocate <bytes> under it (frames taken from idle processes) and
//   write every byte, create <ready-file>, hold the lock until <release-file> exists (at
//   most 120 s), free, release, exit 0.
// usage: api_worker touch <device> <bytes> <ready-file> <go-file>
//   without the lock: allocate <bytes> and write every byte through the pointer (host
//   backend: device memory is process memory), create <ready-file>, wait for <go-file> (at
//   most 120 s), read every byte again, exit 0. Touching memory that is not backed then
//   kills it with SIGSEGV (the test checks the message vramswap prints first).
// usage: api_worker each <devices>
//   lock and unlock devices 0..<devices>-1 in turn, twice (a session opened on each), exit 0.
// usage: api_worker polled <device> <ready-file>
//   take gpu_lock(device), create <ready-file>, poll vramswap::release_requested(device)
//   (and the C call) every 10 ms until an operator asks for the lock (at most 60 s),
//   release, exit 0; exit 5 when nobody asked, 6 when the C and C++ answers differ.
// Exit: 0 ok, 2 a vramswap::error (printed), 3 bytes differed, 4 a file never appeared,
// 64 bad usage.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "support/signal_files.hpp"
#include "vramswap/vramswap.h"
#include "vramswap/vramswap.hpp"

namespace {

void create(const char* path) { vramswap::detail::test::create_signal_file(path); }
bool wait_for(const char* path) { return vramswap::detail::test::wait_for_signal_file(path, 120, "api_worker"); }

int usage(const char* self) {
  std::fprintf(stderr,
               "usage: %s hold <device> <hold-ms> <ready-file>\n"
               "       %s fill <device> <bytes> <ready-file> <release-file>\n"
               "       %s touch <device> <bytes> <ready-file> <go-file>\n"
               "       %s each <devices>\n"
               "       %s polled <device> <ready-file>\n",
               self, self, self, self, self);
  return 64;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage(argv[0]);
  const std::string mode = argv[1];
  try {
    if (mode == "hold" && argc == 5) {
      vramswap::gpu_lock lock(std::atoi(argv[2]));
      create(argv[4]);
      std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(argv[3])));
      return 0;
    }
    if (mode == "polled" && argc == 4) {
      const int device = std::atoi(argv[2]);
      vramswap::gpu_lock lock(device);
      if (vramswap::release_requested(device)) return 6;  // nobody asked yet
      create(argv[3]);
      for (int i = 0; i < 6000; ++i) {
        const bool asked = vramswap::release_requested(device);
        if (asked != (vramswap_release_requested(device) == 1)) return 6;
        if (asked) return 0;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      return 5;
    }
    if (mode == "each" && argc == 3) {
      for (int round = 0; round < 2; ++round) {
        for (int d = 0; d < std::atoi(argv[2]); ++d) vramswap::gpu_lock lock(d);
      }
      return 0;
    }
    if (mode == "fill" && argc == 6) {
      const int device = std::atoi(argv[2]);
      const size_t bytes = std::strtoull(argv[3], nullptr, 10);
      vramswap::gpu_lock lock(device);
      void* p = vramswap::malloc(bytes, device);
      std::memset(p, 0xA5, bytes);
      create(argv[4]);
      const bool released = wait_for(argv[5]);
      vramswap::free(p, device);
      return released ? 0 : 4;
    }
    if (mode == "touch" && argc == 6) {
      const int device = std::atoi(argv[2]);
      const size_t bytes = std::strtoull(argv[3], nullptr, 10);
      auto* p = static_cast<unsigned char*>(vramswap::malloc(bytes, device));
      for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(i * 7 + 3);
      create(argv[4]);
      if (!wait_for(argv[5])) return 4;
      for (size_t i = 0; i < bytes; ++i) {
        if (p[i] != static_cast<unsigned char>(i * 7 + 3)) {
          std::fprintf(stderr, "api_worker: byte %zu differs\n", i);
          return 3;
        }
      }
      return 0;
    }
  } catch (const vramswap::error& e) {
    std::fprintf(stderr, "api_worker: %s\n", e.what());
    return 2;
  }
  return usage(argv[0]);
}

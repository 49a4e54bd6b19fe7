// A process that uses only the public C++ API, for the public API's cross-process tests.
//
// usage: api_worker hold <device> <hold-ms> <ready-file>
//   take gpu_lock(device), create <ready-file>, hold the lock <hold-ms>, release, exit 0.
//        api_worker each <devices>
//   lock and unlock devices 0..<devices>-1 in turn, twice (a session opened on each), exit 0.
// Exit: 0 ok, 2 a vramswap::error (printed), 64 bad usage.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "vramswap/vramswap.hpp"

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "each") == 0) {
    try {
      for (int round = 0; round < 2; ++round) {
        for (int d = 0; d < std::atoi(argv[2]); ++d) vramswap::gpu_lock lock(d);
      }
    } catch (const vramswap::error& e) {
      std::fprintf(stderr, "api_worker: %s\n", e.what());
      return 2;
    }
    return 0;
  }
  if (argc != 5 || std::strcmp(argv[1], "hold") != 0) {
    std::fprintf(stderr, "usage: %s hold <device> <hold-ms> <ready-file> | each <devices>\n", argv[0]);
    return 64;
  }
  try {
    vramswap::gpu_lock lock(std::atoi(argv[2]));
    const int fd = ::open(argv[4], O_CREAT | O_WRONLY, 0600);
    if (fd >= 0) ::close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(argv[3])));
  } catch (const vramswap::error& e) {
    std::fprintf(stderr, "api_worker: %s\n", e.what());
    return 2;
  }
  return 0;
}

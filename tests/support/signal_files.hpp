// Files as signals between a test and the worker processes it starts: one side creates a
// file ("ready", "release", "go"), the other waits until it exists. Header-only and free of
// vramswap's internals, for workers that link only the public library.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

namespace vramswap::detail::test {

// False when the file could not be made (errno says why).
inline bool create_signal_file(const char* path) {
  const int fd = ::open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

// True once `path` exists; false (said on stderr, as `who`) after `timeout_s` seconds.
inline bool wait_for_signal_file(const char* path, int timeout_s, const char* who) {
  struct stat st {};
  for (int i = 0; i < timeout_s * 100; ++i) {
    if (::stat(path, &st) == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::fprintf(stderr, "%s: %s never appeared\n", who, path);
  return false;
}

}  // namespace vramswap::detail::test

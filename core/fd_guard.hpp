// fd_guard: a descriptor closed at scope exit unless released.
#pragma once

#include <unistd.h>

namespace vramswap::detail {

struct fd_guard {
  int fd = -1;
  explicit fd_guard(int f = -1) : fd(f) {}
  ~fd_guard() {
    if (fd >= 0) ::close(fd);
  }
  fd_guard(const fd_guard&) = delete;
  fd_guard& operator=(const fd_guard&) = delete;
  int release() {
    const int f = fd;
    fd = -1;
    return f;
  }
};

}  // namespace vramswap::detail

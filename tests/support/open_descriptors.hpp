// How many descriptors a process has open, from /proc/<pid>/fd: what tests of leaks and
// descriptor limits count.
#pragma once

#include <dirent.h>
#include <sys/types.h>

#include <string>

namespace vramswap::detail::test {

// Descriptors open in process `pid` (0: this one, not counting the one this call opens to
// read the directory); -1 when /proc/<pid>/fd cannot be read.
inline long open_descriptors(pid_t pid = 0) {
  DIR* d = ::opendir(pid == 0 ? "/proc/self/fd" : ("/proc/" + std::to_string(pid) + "/fd").c_str());
  if (d == nullptr) return -1;
  long n = 0;
  while (const dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return pid == 0 ? n - 1 : n;
}

}  // namespace vramswap::detail::test

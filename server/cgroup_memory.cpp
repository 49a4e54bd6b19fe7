#include "server/cgroup_memory.hpp"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace vramswap::detail {
namespace {

// A number from a cgroup file; false for "max", a missing file or anything else.
bool read_number(const std::string& path, uint64_t* out) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text.empty() || text == "max") return false;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0') return false;
  *out = v;
  return true;
}

// This process's path in the hierarchy whose /proc/self/cgroup line matches `controller`
// ("" for v2's "0::" line).
bool cgroup_path(const std::string& controller, std::string* out) {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    const size_t a = line.find(':');
    const size_t b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    bool match = controller.empty() ? line.compare(0, 2, "0:") == 0 && controllers.empty() : false;
    if (!controller.empty()) {
      std::stringstream list(controllers);
      for (std::string c; std::getline(list, c, ',');) match = match || c == controller;
    }
    if (match) {
      *out = line.substr(b + 1);
      return true;
    }
  }
  return false;
}

// Walk from the process's cgroup directory up to the mount's root, keeping the tightest
// limit. Inside a cgroup namespace the path is "/" and the mount is that namespace's root;
// where the path does not exist under the mount (a v1 mount of another namespace's root),
// the mount's root is all there is to ask.
void tightest(const std::string& mount, const std::string& path, const char* limit_file, const char* usage_file, cgroup_memory* best) {
  std::string rel = path;
  for (;;) {
    const std::string dir = mount + (rel == "/" ? "" : rel);
    uint64_t limit = 0;
    // v1 reports "no limit" as a huge number (a page-rounded LONG_MAX).
    if (read_number(dir + "/" + limit_file, &limit) && limit < (uint64_t{1} << 62) && (best->limit == 0 || limit < best->limit)) {
      uint64_t used = 0;
      read_number(dir + "/" + usage_file, &used);
      best->limit = limit;
      best->used = used;
      best->where = dir + "/" + limit_file;
    }
    if (rel.empty() || rel == "/") return;
    const size_t slash = rel.rfind('/');
    rel = slash == 0 || slash == std::string::npos ? "/" : rel.substr(0, slash);
  }
}

}  // namespace

bool read_cgroup_memory(cgroup_memory* out) noexcept {
  try {
    cgroup_memory best;
    std::string path;
    if (cgroup_path("", &path)) tightest("/sys/fs/cgroup", path, "memory.max", "memory.current", &best);
    if (cgroup_path("memory", &path)) tightest("/sys/fs/cgroup/memory", path, "memory.limit_in_bytes", "memory.usage_in_bytes", &best);
    if (best.limit == 0) return false;
    *out = best;
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace vramswap::detail

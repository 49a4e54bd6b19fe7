// cgroup_memory: how much more memory this process's cgroup lets it have.
//
// The shared host pool is a memfd the server faults in at start: its pages are charged to
// the server's memory cgroup (a DaemonSet container's limit, the job's cgroup of a server a
// job started), not to the host's free memory. Past that limit the kernel's OOM killer ends
// the server in the middle of faulting it in, with nothing in its log; asking first turns
// that into an error that names the limit.
#pragma once

#include <cstdint>
#include <string>

namespace vramswap::detail {

struct cgroup_memory {
  uint64_t limit = 0;  // bytes; 0: no limit found
  uint64_t used = 0;   // charged now
  std::string where;   // the file the limit came from, for messages
};

// The tightest memory limit of this process's cgroup and its ancestors (cgroup v2
// memory.max; v1 memory.limit_in_bytes), with the usage charged there. False when no limit
// applies or none can be read (the host's memory is the bound then).
bool read_cgroup_memory(cgroup_memory* out) noexcept;

}  // namespace vramswap::detail

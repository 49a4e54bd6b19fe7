// kept_descriptors: the pool frames' descriptors a member keeps for a next pool server.
//
// A pool's frames live in its members' imports: when vramswapd stops or dies, the server
// that follows adopts the pool and needs a descriptor of every frame, which only a member
// can give it. The descriptor must be the one the member was given: CUDA does not export an
// allocation that a process imported (cuMemExportToShareableHandle refuses an imported
// handle), so a member keeps each descriptor it received, open, for as long as it is one.
//
// The descriptors sit at or above k_base, away from the low numbers: a pool has thousands of
// frames, and a program that still uses select() (FD_SETSIZE is 1024) must keep finding
// its own descriptors below that.
//
// A process that forks without exec (a Python DataLoader worker, multiprocessing) must not
// hold them: an open descriptor keeps the frame's memory allocated, so a child that outlives
// the member would keep device memory that the next server builds anew. A fork handler
// closes every kept descriptor in the child.
//
// When the process may not hold that many descriptors (RLIMIT_NOFILE's hard limit), keeping
// stops and what was kept is closed: the member still works and rejoins a next server, but
// cannot hand it the frames (pool/pool_protocol.hpp, k_hello_has_frames).
#pragma once

#include <cstddef>
#include <vector>

namespace vramswap::detail {

class kept_descriptors {
 public:
  static constexpr int k_base = 1024;

  kept_descriptors();
  ~kept_descriptors();  // closes what it keeps
  kept_descriptors(const kept_descriptors&) = delete;
  kept_descriptors& operator=(const kept_descriptors&) = delete;

  // Keeps a duplicate of `fd` (the caller still closes `fd`). False when it cannot: then
  // nothing is kept any more (complete() is false for good), and errno says why.
  bool keep(int fd) noexcept;
  // Whether every descriptor offered was kept.
  bool complete() const noexcept { return complete_; }
  const std::vector<int>& fds() const noexcept { return fds_; }

 private:
  void drop_locked() noexcept;
  static void close_in_child() noexcept;

  std::vector<int> fds_;
  bool complete_ = true;
};

}  // namespace vramswap::detail

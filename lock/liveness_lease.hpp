// liveness_lease: is the process that owns a shared slot still alive, whatever its PID
// namespace?
//
// A slot in a shared file (a lock slot) is leased by an OFD write lock on
// one byte of that file, at k_lease_base + the slot's index (far past the end of the file:
// locks need no data there). The owner takes the lease before it publishes the slot and drops
// it only after it freed the slot. The kernel drops the lock when the owner's last descriptor
// of that open file goes, which is at its death at the latest (exit, SIGKILL, OOM kill), and
// any process that has the same file open can test it (F_OFD_GETLK). So "published and not
// leased" means "its owner is dead", and no PID is involved: a pid seen from another PID
// namespace (another container) names another process or none, and the /proc start-time
// check it used to rest on cannot tell them apart.
//
// Why OFD locks: they belong to the open file description rather than the process (a
// classic POSIX lock would be dropped by any close of the file in the owning process), they
// are per byte (one lease per slot), they need no helper process, they work across PID, IPC,
// mount and UTS namespaces for every process that opens the same inode, and the kernel
// releases them itself. The alternatives were worse: pidfds cannot be made for a process of
// a sibling PID namespace; the daemon's socket hang-up needs the daemon (the lock works
// without one); a robust futex says only that the owner of one mutex died, not of a slot.
//
// A descriptor's own leases never conflict with it, so a test from the description that
// holds a lease reads it as free: the holder of a description keeps the list of its own
// leases (lease_set below) and asks the kernel only about the others.
//
// Forks: a forked child shares its parent's open file descriptions, and with them the
// leases; a child that outlived its parent would keep the parent's slots "alive". So leases
// live on a description of their own (open_lease_description), which nothing maps: a shared
// mapping holds a reference to the description it was made from, which a child inherits
// with the mapping. Every lease description is registered here, and in a forked child each
// is replaced by /dev/null (dup3, so the descriptor number stays valid for its owner to
// close; closed when /dev/null cannot be opened): the child drops its only reference and the
// leases stay with the parent alone. (exec closes them anyway: they are close-on-exec.)
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>

namespace vramswap::detail {

constexpr off_t k_lease_base = off_t{1} << 40;

// A new open file description of the file open at `fd` (through /proc/self/fd, so it is that
// very file even if its name was replaced meanwhile), close-on-exec, for leases only: never
// map it. Returns 0, or err_system naming `what`.
int open_lease_description(int fd, const char* what, int* out) noexcept;

// Take lease `index` on the description behind `fd`. Returns 0; err_busy when another
// description holds it (its owner freed the slot and has not yet dropped the lease: take
// another slot); err_system when the file system refuses OFD locks (the detail names `what`,
// the file, and asks for a local file system such as tmpfs).
int take_lease(int fd, uint32_t index, const char* what) noexcept;

// Drop lease `index` (after the slot was freed). Never fails in a way the caller could act
// on: an error is logged.
void drop_lease(int fd, uint32_t index) noexcept;

// Does a description other than `fd`'s hold lease `index`? Where the kernel cannot say (an
// error), true: a slot is never taken from a process that may be alive.
bool lease_held_elsewhere(int fd, uint32_t index) noexcept;

// The leases one description holds, for the tests from that same description.
template <uint32_t Count>
class lease_set {
 public:
  void add(uint32_t i) noexcept { words_[i / 64].fetch_or(bit(i), std::memory_order_acq_rel); }
  void remove(uint32_t i) noexcept { words_[i / 64].fetch_and(~bit(i), std::memory_order_acq_rel); }
  bool has(uint32_t i) const noexcept { return (words_[i / 64].load(std::memory_order_acquire) & bit(i)) != 0; }

 private:
  static uint64_t bit(uint32_t i) noexcept { return uint64_t{1} << (i % 64); }
  std::atomic<uint64_t> words_[(Count + 63) / 64] = {};
};

// Register `fd` as carrying leases (see Forks above), or forget it before closing it.
// At most k_max_lease_fds at once; past that, register returns err_busy.
constexpr int k_max_lease_fds = 256;
int register_lease_fd(int fd) noexcept;
void unregister_lease_fd(int fd) noexcept;

}  // namespace vramswap::detail

// One per-device shared segment: create or open, check its version, map it.
//
// A file in the runtime dir (lock/runtime_dir.hpp), mapped MAP_SHARED by every process of
// the device: <runtime dir>/<VRAMSWAP_SHM_PREFIX>vramswap-<owner>-<device key>. The owner
// is "u<uid>", or "g<gid>" with VRAMSWAP_GROUP (lock/ownership.hpp: owner_tag), the key the
// GPU UUID, or "host-N" for the host backend's emulated devices. Futexes and robust mutexes
// work in any shared file mapping; a tmpfs runtime dir keeps it out of any disk's way.
// Mode 0600; with VRAMSWAP_GROUP, 0660 and owned by that group. An existing segment
// owned by anyone else, or open to others, is refused (err_not_owner) and left alone.
//
// Users and removal: each open segment keeps its descriptor with a read lock (an OFD byte
// lock) while mapped; the last user to close it removes the name, under the init flock, and
// an opener that finds its object removed opens again. A process that forked since it
// opened a segment leaves it to others. docs/lock.md, "Removing a lock segment".
//
// Creation race and creator death: every opener takes flock(LOCK_EX) on the object while
// it looks at the header. The first one finds it empty (size 0 or magic 0), initializes
// it and publishes the magic last. The kernel drops the flock when its holder dies, so a
// creator killed half-way leaves magic 0 and the next opener simply initializes again;
// nobody uses a segment before seeing its magic, so nobody sees the half-built one.
//
// Every byte is ours (header, lock state, slots: lock/segment_layout.hpp), and every step is
// plain POSIX: the file opened by path with O_NOFOLLOW and checked by fstat
// (lock/ownership.hpp), fchown/fchmod, flock for creation, an OFD read lock per user, mmap,
// unlink. A second descriptor of the file, never mapped, carries the liveness leases of the
// slots this process fills (lock/liveness_lease.hpp, Forks). The header is checked first: a segment of another layout version is refused
// by name. docs/lock.md, "Why plain POSIX", says why Boost.Interprocess is not used here.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <atomic>
#include <memory>
#include <string>

#include "lock/liveness_lease.hpp"
#include "lock/segment_layout.hpp"

namespace vramswap::detail {

// VRAMSWAP_GROUP as a group id (a name or a number); *is_set false when it is unset. Shared
// objects (segments, sockets) are 0600, or 0660 owned by this group when it is set.
int configured_group(gid_t* gid, bool* is_set);

class shared_segment {
 public:
  // Open the segment of `device_key`, creating and initializing it when absent.
  // Returns 0; err_invalid_argument (bad key, prefix or VRAMSWAP_GROUP); err_not_owner (the
  // segment belongs to another user or group, or its mode lets others in: the detail names
  // it, its owner and mode);
  // err_version_mismatch (corrupt, foreign, or incompatible segment: nothing was changed);
  // err_system (an OS call failed, e.g. permission denied on the segment).
  static int open(const std::string& device_key, std::unique_ptr<shared_segment>* out) noexcept;

  // Remove the segment's name now, whoever uses it (processes that have it mapped keep
  // using it, and the next opener makes a new one: for tests and for stopping everything).
  // 0 when it was removed or did not exist. The destructor removes it safely by itself when
  // this is its last user (docs/lock.md, "Removing a lock segment").
  static int remove(const std::string& device_key) noexcept;

  // The segment's file name for `device_key` under the current VRAMSWAP_SHM_PREFIX and owner
  // (this user, or VRAMSWAP_GROUP), with a leading '/': "/<p>vramswap-<owner>-<key>". The
  // one place that builds vramswap's segment names.
  static int name_for(const std::string& device_key, std::string* out) noexcept;
  // The runtime dir followed by name_for; with `create_dir`, the runtime dir is made or
  // checked first (runtime_dir).
  static int path_for(const std::string& device_key, bool create_dir, std::string* out) noexcept;

  ~shared_segment();
  shared_segment(const shared_segment&) = delete;
  shared_segment& operator=(const shared_segment&) = delete;

  void* base() const noexcept { return base_; }
  // The segment's path, for messages.
  const std::string& name() const noexcept { return name_; }
  // The descriptor whose open file description carries this object's slot leases (one of
  // its own, never mapped: lock/liveness_lease.hpp, Forks).
  int lease_fd() const noexcept { return lease_fd_; }
  // The slots whose leases this object holds (lease_held_elsewhere cannot see them).
  lease_set<lock_layout::k_slot_count>& own_leases() noexcept { return own_leases_; }
  // A free slot this object still leases, kept from a release for the next acquire, which
  // then takes it with no system call (k_no_slot: none). It stays in own_leases, so no other
  // thread of this object takes it meanwhile, and its lease keeps other processes off it.
  std::atomic<uint32_t>& spare_slot() noexcept { return spare_slot_; }
  // False in a forked child of the process that opened it (its leases are not the child's);
  // true in the process that opened it, however often it forked since.
  bool opened_in_this_process() const noexcept;
  // Who locks the segment's internal mutex through this object: its lease description and
  // the token it took at open (none in a forked child: the token is its parent's).
  lease_mutex_owner mutex_owner() const noexcept {
    return {lease_fd_, opened_in_this_process() ? mutex_token_ : 0};
  }

 private:
  shared_segment() = default;
  void remove_if_unused() noexcept;

  void* base_ = nullptr;
  size_t size_ = 0;
  int fd_ = -1;                 // kept open with a read lock on byte 0: "in use"
  int lease_fd_ = -1;           // the description the slot leases are taken on
  uint32_t mutex_token_ = 0;    // leased on lease_fd_ (lock/lease_mutex.hpp)
  uint64_t forks_at_open_ = 0;  // forks of this process before it opened the segment
  uint64_t opened_in_generation_ = 0;  // fork_generation() of the process that opened it
  std::string name_;
  lease_set<lock_layout::k_slot_count> own_leases_;
  std::atomic<uint32_t> spare_slot_{lock_layout::k_no_slot};
};

}  // namespace vramswap::detail

// The byte layout of a per-device shared segment, as every participating process sees it.
//
// Glossary
//   segment   one shared file per device: <runtime dir>/<prefix>vramswap-<owner>-<key>
//   header    the first bytes: magic + format word, checked before anything else is read
//   slot      two cache lines describing one participant thread of the lock: waiting or holding
//   ticket    a 64-bit counter value taken at enqueue; lower ticket = earlier = served first
//             within a priority class
//
// Offsets (k_segment_size bytes in all):
//   0                      segment_header      (one cache line)
//   64                     lock_state          (internal mutex, counters, hints)
//   k_slots_offset         waiter_slot[k_slot_count]
//   k_turns_offset         turn_histograms     (lock/turn_histograms.hpp), then zeros to the end
//
// Every byte is ours and plain POSIX: no library's structure lives in the segment, so no
// library's version is part of its format (the pool's shared state has a segment of its
// own, pool/pool_segment.hpp).
//
// Versioning (the LMDB rule): `magic` identifies the object; `format` encodes the layout
// version and every size the layout depends on. A process that finds a different magic or
// format refuses to touch the segment (err_version_mismatch); it never guesses. Change
// k_layout_version whenever the meaning of any field changes; size changes are caught by
// the format word automatically.
//
// Consistency rule: a process may die (SIGKILL) between any two instructions. Every field
// below is either (a) a single aligned word whose every value is meaningful, or (b) a
// derived hint that the recovery function recomputes from (a). The comments on each field
// say which, and in what order a writer publishes it.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "lock/lease_mutex.hpp"
#include "lock/turn_histograms.hpp"

namespace vramswap::detail::lock_layout {

constexpr uint64_t k_magic = 0x4B434F4C57535256ull;  // "VRSWLOCK" in little-endian bytes
// 2: lock_state's hold-time hints.
// 3: a waiter that gives up frees its own slot without the mutex and the grant is a CAS;
//    a segment is removed by its last user (users hold a read lock on it while mapped).
// 4: no Boost managed area after the slots (the segment ends at k_segment_size, 64 KiB),
//    and the header records no Boost version.
// 5: a file in the runtime dir; slots are leased (lock/liveness_lease.hpp) and record their
//    owner's PID namespace and uid, as the internal mutex records its owner's namespace.
// 6: slots take a second cache line for fair turns (VRAMSWAP_MAX_HOLD, release requests);
//    the turn histograms (lock/turn_histograms.hpp) after the slots.
// 7: lock_state's compute_watchers (low-priority jobs asleep on holder_slot); gangs
//    (docs/lock.md, "Gangs"): the priority word carries gang bits above the class, a slot
//    may be `granting`, and the fair-turns line records a gang slot's gang id.
// 8: the internal mutex is a lease_mutex (lock/lease_mutex.hpp), its owner named by a lease,
//    no longer a robust pthread mutex named by a thread id; its owner hints are in it.
constexpr uint64_t k_layout_version = 8;

constexpr size_t k_cache_line = 64;
constexpr uint32_t k_slot_count = 256;  // participant threads per device, waiting or holding
constexpr uint32_t k_no_slot = 0xFFFFFFFFu;

// Slot states. The state word is also the futex a waiter sleeps on: a grant is the single
// store waiting -> holding followed by one FUTEX_WAKE of that slot only.
enum slot_state : uint32_t {
  slot_free = 0,     // unused; every other field is garbage and must not be read
  slot_waiting = 1,  // enqueued: owner/ticket/priority fields are complete
  slot_holding = 2,  // granted: this slot's thread holds the lock
  // A gang member being granted with the rest of its gang: a granter holding every member
  // device's mutex reserves each member slot waiting -> granting, then stores each holding.
  // Its owner treats it as waiting that it cannot leave; the recovery function (which runs
  // only with the mutex, so never during a live grant) turns it back into waiting.
  slot_granting = 3,
};

// The priority word: the class (lock_priority) in the low 16 bits, gang bits above it.
// Keeping them in the first cache line keeps the queue scan to one line per slot.
constexpr uint32_t k_class_mask = 0xFFFFu;
// A gang member (docs/lock.md, "Gangs"): never granted alone by a dispatch (which wakes it
// instead); its gang's granter grants all members at once when each is next on its device.
constexpr uint32_t k_gang_member = 1u << 16;
// A cross-process gang member whose gang has not yet been queued (not every rank has
// joined): not in the order at all until the last rank to join gives it its ticket.
constexpr uint32_t k_gang_forming = 1u << 17;
inline uint32_t class_of(uint32_t priority_word) { return priority_word & k_class_mask; }

// One participant. Written only under lock_state::mutex, except `state`, which the owning
// waiter also reads without the mutex (to learn of its grant). Publication order for
// enqueue: take the slot's lease, fill every other field, then store `state` (release); the
// lease is dropped only after the slot is free again. A writer that dies before the state
// store leaves the slot free; one that dies after leaves a complete entry whose lease is
// gone, which the liveness check removes.
//
// The second cache line is fair turns (docs/lock.md, "Fair turns"): the owner's hold limit
// and queue penalty, filled at enqueue like the rest, and three facts about a hold, each a
// single store made under the mutex while the slot holds (the grant time by the dispatcher
// just before the grant) and each meaningful in every value, so a death between any two of
// them leaves nothing for the recovery function to recompute.
struct alignas(k_cache_line) waiter_slot {
  std::atomic<uint32_t> state;       // slot_state; the futex word
  // Atomic (written under the mutex) because the lock's wake-up hints read them without it.
  std::atomic<uint32_t> priority;    // lock_priority in the low bits (class_of), gang bits above
  std::atomic<uint64_t> ticket;      // FIFO order within a priority class
  int32_t pid;                       // owning process, in its own PID namespace
  int32_t tid;                       // owning thread (re-entry and release checks)
  uint64_t pid_start_time;           // /proc/<pid>/stat starttime: defeats PID reuse
  uint64_t enqueue_ns;               // CLOCK_MONOTONIC at enqueue
  int32_t dead_holder_pid;           // set at grant: the previous holder died (0: it did not)
  uint32_t uid;                      // the owner's effective uid (for messages: whose process)
  uint64_t pid_ns;                   // the owner's PID namespace (for messages: whose pid)
  uint64_t dead_holder_pid_ns;       // with dead_holder_pid
  // --- fair turns -------------------------------------------------------------------------
  // The owner's VRAMSWAP_MAX_HOLD in ns (0: no limit): the longest it means to hold the lock
  // while others wait.
  std::atomic<uint64_t> max_hold_ns;
  // A queue penalty (0: none): the owner held the lock past its limit while others waited,
  // and every slot still waiting with a ticket below this one waited for it. When this slot
  // would be granted, the best of those is granted instead (device_lock.hpp, Order).
  std::atomic<uint64_t> behind_ticket;
  // CLOCK_MONOTONIC of the grant; written by the dispatcher before the grant (like
  // dead_holder_pid), read only while the slot holds.
  std::atomic<uint64_t> granted_ns;
  // While holding: since when (CLOCK_MONOTONIC) the hold has been past max_hold_ns with a
  // waiter; 0: it has not. Set once per hold, by a waiter's liveness scan, the holder's own
  // check or its release.
  std::atomic<uint64_t> over_limit_since_ns;
  // While holding: when an operator asked the owner to release the lock (CLOCK_MONOTONIC;
  // 0: nobody asked), and who. The asker's fields are stored before the time.
  std::atomic<uint64_t> release_requested_ns;
  std::atomic<uint64_t> release_requester_pid_ns;
  std::atomic<int32_t> release_requester_pid;
  std::atomic<uint32_t> release_requester_uid;
  // A gang member's gang, for observers (status: which slots go together); 0 for a single.
  // Filled at enqueue like the rest.
  std::atomic<uint64_t> gang_id;
};
static_assert(sizeof(waiter_slot) == 2 * k_cache_line);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

// The lock's shared state besides the slots.
struct alignas(k_cache_line) lock_state {
  lease_mutex mutex;  // guards everything below and the slots (lock/lease_mutex.hpp)
  // Authoritative: the next ticket to hand out. A single 64-bit store; a death after the
  // increment but before the slot publish only skips a number, which keeps FIFO order.
  uint64_t next_ticket;
  // Hints, recomputed from the slots by the recovery function; kept current by every
  // critical section so that the uncontended path never scans the slots.
  // (Atomic, written under the mutex: the wake-up hints read them without it.)
  std::atomic<uint32_t> holder_slot;      // index of the slot in slot_holding, or k_no_slot
  std::atomic<uint32_t> waiter_count;     // number of slots in slot_waiting
  std::atomic<uint32_t> slot_high_water;  // every non-free slot has an index below this
  // Authoritative, sticky: set when recovery found the slots in a state no sequence of
  // deaths can produce (two holders: memory corruption). Every later operation fails with
  // err_internal rather than risk two processes in the lock at once.
  uint32_t broken;
  // Authoritative: pid of a holder found dead and not yet reported to a grantee (0: none).
  // Set by the recovery function, copied into the next grantee's slot, then cleared.
  int32_t dead_holder_pid;
  // A hint, changed without the mutex: how many threads of low-priority (oversubscribed)
  // jobs sleep in FUTEX_WAIT on holder_slot, yielding the GPU to the holder
  // (docs/oversubscription.md, "Compute"). Whoever changes holder_slot away from a holder
  // (a release, the recovery function) wakes holder_slot when it is not 0. A watcher that
  // dies asleep leaves it too high, for good: every release then makes one futex call that
  // wakes nobody. Too high costs that; it is never too low (a watcher counts itself in
  // before it reads holder_slot for its wait).
  std::atomic<uint32_t> compute_watchers;
  uint64_t dead_holder_pid_ns;  // with dead_holder_pid
  // CLOCK_MONOTONIC time of the last liveness scan; rate-limits scans across all waiters.
  uint64_t last_liveness_scan_ns;
  uint64_t recoveries;  // how many times the recovery function repaired something
  // Hints for waiters (written under the mutex, read without it): when the current holder
  // was granted, and how long holds have lasted (moving averages, ns). The next waiter uses
  // them to be awake, spinning, when a regular holder releases (device_lock.hpp, Waiting).
  std::atomic<uint64_t> holder_granted_ns;
  std::atomic<uint64_t> hold_mean_ns;
  std::atomic<uint64_t> hold_jitter_ns;  // mean absolute deviation from hold_mean_ns
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);

struct alignas(k_cache_line) segment_header {
  // Published last at creation (release store), after everything else is initialized;
  // zero means "not initialized", and the next opener (under the init flock) starts over.
  std::atomic<uint64_t> magic;
  uint64_t format;          // format_word() of the creator
  uint64_t segment_size;    // bytes; equals the object's size
  uint64_t reserved_[5];
};
static_assert(sizeof(segment_header) == k_cache_line);

constexpr size_t k_lock_state_offset = sizeof(segment_header);
constexpr size_t k_slots_offset = k_lock_state_offset + ((sizeof(lock_state) + k_cache_line - 1) / k_cache_line) * k_cache_line;
constexpr size_t k_segment_size = 64 * 1024;  // whole pages; untouched ones cost nothing on tmpfs
// The turn histograms: statistics that any process adds to without the mutex (their rules
// are in lock/turn_histograms.hpp), in a block of their own after the slots.
constexpr size_t k_turns_offset = k_slots_offset + k_slot_count * sizeof(waiter_slot);
static_assert(k_turns_offset % alignof(turn_histograms) == 0);
static_assert(k_turns_offset + sizeof(turn_histograms) <= k_segment_size);

// version:16 | sizeof(lease_mutex):8 | sizeof(lock_state):12 | sizeof(waiter_slot):8 |
// k_slot_count:12 | k_segment_size/4096:8
constexpr uint64_t format_word() {
  return (k_layout_version << 48) | (uint64_t{sizeof(lease_mutex)} << 40) | (uint64_t{sizeof(lock_state)} << 28) |
         (uint64_t{sizeof(waiter_slot)} << 20) | (uint64_t{k_slot_count} << 8) | (k_segment_size / 4096);
}
constexpr uint64_t format_version(uint64_t format) { return format >> 48; }

inline segment_header* header_of(void* base) { return static_cast<segment_header*>(base); }
inline lock_state* lock_state_of(void* base) {
  return reinterpret_cast<lock_state*>(static_cast<char*>(base) + k_lock_state_offset);
}
inline waiter_slot* slots_of(void* base) {
  return reinterpret_cast<waiter_slot*>(static_cast<char*>(base) + k_slots_offset);
}
inline turn_histograms* turns_of(void* base) {
  return reinterpret_cast<turn_histograms*>(static_cast<char*>(base) + k_turns_offset);
}

}  // namespace vramswap::detail::lock_layout

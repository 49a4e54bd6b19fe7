// rank_gang: the ranks of one job, one process per device, granted their devices together.
//
// Internal API (namespace vramswap::detail); the runtime's join_gang (cpp_api, Python, C)
// wraps it. docs/lock.md, "Gangs of processes", has the design and its reasons; in short:
//
// Rendezvous. The ranks meet in a small shared segment of their own, named by the job:
// <runtime dir>/<prefix>vramswap-<owner>-gang-<job>. It is a lock segment as far as the
// file goes (the same header and format word, robust mutex, leases and removal by its last
// user: lock/shared_segment.hpp), whose slot area holds a gang_record instead of slots. Each
// rank holds the lease of its rank index there for as long as it is in the gang: a rank
// whose entry is present but not leased is dead.
//
// A round. Each acquire of a rank is one round. The rank publishes a slot on its own device
// marked k_gang_forming (not in the device's order yet), then joins the round in the gang
// record. The rank that completes the round (the last to join) takes the gang mutex, then
// every member device's mutex (in device-key order, like a gang of one process), and gives
// each member slot its ticket and its place (forming cleared): all places in one step, so
// gangs of processes and of threads stand in the same order on every device and the
// deadlock-freedom argument of gang_acquire.cpp holds as it is. The grant is that of a
// one-process gang: whichever rank finds the gang next on every member device (a dispatch
// there wakes it) reserves and grants every member slot at once; each rank then sees its own
// slot granted, and brings its own device's memory in (its own session, after the lock).
//
// Release. Each rank releases its own device, like a single holder: a device goes on to the
// next waiter as soon as its rank is done. The gang's turn is over when the last rank has
// released; the ranks' next round forms meanwhile.
//
// Death. A rank that dies (SIGKILL) is found by its peers' liveness checks (its rank lease
// is gone) and breaks the gang for good: every rank waiting in a round leaves it and fails
// with err_owner_died naming the dead rank and its pid, and so does every later acquire of
// the job's ranks, until all of them have left (the job is restarted whole: torchrun does).
// A rank that never joins: the others time out (their own timeout) naming the missing
// ranks. A rank that leaves a queued round (its timeout, an interrupt) ends that round for
// everyone (err_timeout naming it); the next round is a new one.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "lock/device_lock.hpp"

namespace vramswap::detail {

class shared_segment;

class rank_gang {
 public:
  static constexpr uint32_t k_max_ranks = 64;
  // How long the gang's mutex may take (it is held for microseconds).
  static constexpr int64_t k_gang_mutex_ns = 1'000'000'000;

  // Join the gang of `job` (letters, digits, '-', '_', '.') as `rank` of `world_size`
  // (1..k_max_ranks). Returns 0; err_invalid_argument (bad job, rank or world size; the gang
  // exists with another world size); err_busy (a live process already is this rank);
  // err_owner_died (the gang is broken: a rank died; the detail names it and the ranks
  // still in it, which must leave first); what opening its segment returns.
  static int open(const std::string& job, uint32_t rank, uint32_t world_size, std::unique_ptr<rank_gang>* out) noexcept;
  ~rank_gang();
  rank_gang(const rank_gang&) = delete;
  rank_gang& operator=(const rank_gang&) = delete;

  // One round: wait until every rank has joined and the gang is next on every rank's device,
  // then hold `mine` (this rank's device lock, open) as acquire() would. A re-entry by the
  // holding thread is counted, as acquire()'s. Returns 0; err_owner_died (a rank died: the
  // gang is broken; nothing held); err_timeout (the time ran out: the detail names the ranks
  // that never joined, or the devices' queues; or another rank left the round); err_busy (a
  // try: the gang was not granted at once); err_interrupted; err_invalid_argument (two ranks
  // on one device); what device_lock::acquire returns.
  int acquire(device_lock& mine, lock_priority priority, int64_t timeout_ns, acquire_info* info = nullptr) noexcept;

  const std::string& job() const noexcept { return job_; }
  uint32_t rank() const noexcept { return rank_; }
  uint32_t world_size() const noexcept { return world_; }

 private:
  rank_gang() = default;
  int lock_gang(uint64_t deadline_ns) noexcept;
  void unlock_gang() noexcept;
  static int recover(void* self) noexcept;
  // With the gang mutex: mark the gang broken when a present rank's lease is gone.
  void check_ranks_locked() noexcept;
  int broken_error(const char* when) noexcept;
  // With the gang mutex: the last rank of round `round` joined: give every member its place,
  // and grant the gang if it is next everywhere.
  void queue_round_locked(uint64_t round, device_lock& mine) noexcept;
  // With the gang mutex: round `round` is over for every rank (`rank`, `pid` left it).
  void set_aborted(uint64_t round, uint32_t rank, pid_t pid) noexcept;
  // The device lock of `key`: ours, or a peer's opened on first use. nullptr on failure.
  device_lock* lock_for(const std::string& key, device_lock& mine) noexcept;
  // Try to grant round `round` (queued), taking the device mutexes by `deadline_ns`.
  bool try_grant(uint64_t round, device_lock& mine, uint64_t deadline_ns) noexcept;

  // The steps of acquire (rank_gang.cpp), in its order; a round_call is what they share.
  struct round_call;
  // The arguments, and whether this process may act as its rank (not a forked child).
  int check_acquire(device_lock& mine, lock_priority priority, int64_t timeout_ns) noexcept;
  // Our slot on our device, forming (outside every device's order).
  int publish_forming_slot(round_call& c, uint64_t mutex_deadline) noexcept;
  // Join the round now forming; the last to join queues it. On failure our slot is left.
  int join_round(round_call& c, uint64_t mutex_deadline) noexcept;
  // With the gang mutex, every rank joined: two ranks on one device end the round (true).
  bool ranks_share_a_device_locked(uint64_t round) noexcept;
  // Wait until our slot is granted (ok), the gang breaks (err_owner_died), another rank ends
  // the round (err_timeout), or the deadline or an interrupt (*stop) ends the wait (ok).
  int wait_for_round(round_call& c, bool* stop) noexcept;
  // Our device's liveness scan, then a look for dead ranks.
  void check_liveness(device_lock& mine, uint64_t now, uint64_t deadline) noexcept;
  // Sleep until our slot or the gang's events move (`seen`: the events read), or the next
  // liveness period. EINTR when a signal handler ran.
  int sleep_in_round(const round_call& c, uint32_t seen, uint64_t last_tick) noexcept;
  // Not granted, our slot left: leave the round (ending it for every rank when it was
  // queued) and say why the acquire failed (`why`, `stop`: what ended the wait).
  int leave_round(const round_call& c, int why, bool stop) noexcept;
  // Take this rank out of the round; true when the round had been queued.
  bool quit_round(const round_call& c) noexcept;
  // "1, 3": the ranks (this one aside) that have not joined round `round`.
  std::string missing_ranks(uint64_t round) const noexcept;

  std::unique_ptr<shared_segment> segment_;
  std::string job_;
  uint32_t rank_ = 0;
  uint32_t world_ = 0;
  uint64_t gang_id_ = 0;
  std::map<std::string, std::unique_ptr<device_lock>> peers_;
};

}  // namespace vramswap::detail

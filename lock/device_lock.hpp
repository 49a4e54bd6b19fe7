// device_lock: the per-device, cross-process FIFO lock that survives SIGKILL anywhere.
//
// Internal API (namespace vramswap::detail); the public gpu_lock guard in cpp_api/ wraps it.
// The full design, with its reasoning and limits, is in docs/lock.md; in short:
//
// State. One shared segment per device (lock/shared_segment.hpp) holds a robust
// process-shared pthread mutex, a ticket counter and 256 cache-line slots
// (lock/segment_layout.hpp). A thread that acquires takes a free slot and publishes it as
// `waiting` with the next ticket; the lock is held by the one slot in state `holding`.
//
// Order. The next holder is the waiting slot with the highest priority class, then the
// lowest ticket: FIFO within a class, high before normal. A normal waiter can starve while
// high waiters keep arriving; that is what "high" means.
//
// Waiting. A waiter sleeps in FUTEX_WAIT on its own slot's state word. A release marks the
// chosen slot `holding` and wakes that futex only: one handoff wakes exactly one thread.
// The sleep has a 10 ms timeout (k_liveness_poll_ns) so that waiters notice a dead holder
// without help from anyone. Heads-up: a holder about to release (device_session, before it
// synchronizes the device) may call announce_release(), which wakes the waiter that would be
// granted without granting it; a waiter woken without a grant spins for up to
// k_heads_up_spin_ns before it sleeps again. A thread that slept long takes tens of
// microseconds to run again after a wake; the heads-up overlaps that with the holder's last
// work instead of adding it to the handoff. Prediction: the segment keeps when the holder
// was granted and a moving average of hold times (and of their jitter); when holds are
// regular (jitter under half the mean), the next waiter in line sleeps only until shortly
// before the holder's expected release and spins through it (k_predict_margin_ns + the
// jitter each side, never more than k_predict_spin_max_ns), so a sleeping thread's wake-up
// latency (tens of microseconds, more on a VM) is not in the handoff at all. A missed prediction falls back to
// sleeping until the grant. Training loops, whose steps take about the same time, are the
// case this serves; the cost is that spin, once per handoff.
//
// Death. The internal mutex is held only for a few dozen instructions; if its owner dies
// there, the next locker gets EOWNERDEAD and runs the one recovery function, which reaps
// slots of dead processes and recomputes every derived field from the slots, then marks the
// mutex consistent. A holder or waiter that dies outside the mutex is found by the
// liveness scan, which waiters run at most once per 10 ms across all processes (rate
// limited through the segment) and which calls the same recovery function. A process is
// alive while it holds its slot's liveness lease, an OFD lock on the segment file that the
// kernel drops when the process dies (lock/liveness_lease.hpp): no PID is looked up, so
// processes of different PID namespaces (containers) judge each other rightly, and PID
// reuse cannot fool the check. The next waiter is granted the lock within
// a liveness period or two of the holder's death (docs/lock.md has the numbers) and learns of the death
// through acquire_info::previous_holder_died.
//
// Ownership, decided:
//   - The lock is held by a thread (of a process). Re-entry by the holding thread is
//     counted: acquire succeeds at once and each acquire needs its release; only the last
//     release hands the lock on. Priority and timeout are ignored on re-entry.
//   - release() by a thread that does not hold the lock (another thread, another process,
//     no acquire, one release too many) fails with err_not_owner and changes nothing.
//   - fork: the child never holds the lock. In a child, held() is false and release()
//     fails with err_not_owner; the child may acquire for itself, queueing like anyone (its
//     first acquire opens the segment anew: the parent's descriptor carries the parent's
//     liveness leases, which the child must not share).
//   - A holding thread that exits without releasing keeps the lock until its process exits
//     (liveness is per process). Do not do that.
//   - Destroying a device_lock that the calling thread holds releases it.
//
// Bounded waits. The internal mutex is held for microseconds, but its owner can be stopped
// there (SIGSTOP, Ctrl-Z, a debugger) for as long as it likes. So every take of the mutex
// has a deadline: an acquire's is its own timeout; a try waits at most k_mutex_try_ns; an
// observer's (snapshot, repair_now) is its argument; a release waits k_release_mutex_ns.
// A waiter leaves the queue (timeout, interruption) and a holder whose release finds the
// mutex stuck frees its slot without the mutex: one compare-and-swap on its own slot's
// state (waiting -> free, holding -> free), which is why dispatch grants by
// compare-and-swap too. The hints that change then are recomputed by the next repair. An
// error that gives up on the mutex names its owner (thread, process, and whether stopped).
//
// Interruption. A thread may install a wait_interrupt (scoped_wait_interrupt) around an
// acquire: the wait calls it on every wake-up without a grant (the futex wait returning
// early because a signal handler ran on this thread, or the periodic 10 ms wake-up); when
// it says stop, the acquire leaves the queue at once and fails with err_interrupted. With
// none installed (the default) a signal's handler runs and the wait goes on, as
// pthread_mutex_lock's does.
//
// Return codes: 0 on success, or a negative vramswap::detail::status with the detail in
// last_error(); never throws.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace vramswap::detail {

class shared_segment;

// Priority classes, served high first. Values are stored in the segment; a low class for
// oversubscribed jobs will take 0.
enum class lock_priority : uint32_t { normal = 1, high = 2 };

// What an acquire learned, for callers that care.
struct acquire_info {
  bool previous_holder_died = false;  // the lock was taken from a holder that died holding it
  pid_t dead_holder_pid = 0;          // that holder, when previous_holder_died
  uint64_t waited_ns = 0;             // from the call to the grant
  bool reentered = false;             // this thread already held it: the count went up
};

// One entry of the queue, for tests, diagnostics and `vramswap status`.
struct lock_queue_entry {
  pid_t pid;
  pid_t tid;
  lock_priority priority;
  uint64_t ticket;
  bool holding;
  uint64_t enqueue_ns = 0;  // CLOCK_MONOTONIC when the thread asked for the lock
  uint64_t pid_ns = 0;      // the PID namespace `pid` and `tid` belong to
  uint32_t uid = 0;         // the thread's effective uid (whose process, for observers)
  // Its owner still holds the slot's liveness lease. False: the process has exited and the
  // slot awaits the liveness scan (a waiter's, within k_liveness_poll_ns; with no waiter,
  // the next acquire's).
  bool alive = true;
};

// Asked by a waiting acquire whether to give up (see Interruption, above). signal_ran: a
// signal handler ran on this thread since the previous call. Return true to stop waiting.
struct wait_interrupt {
  bool (*should_stop)(void* context, bool signal_ran) = nullptr;
  void* context = nullptr;
};

// Install `check` for this thread's acquires until the scope ends (restoring the previous).
class scoped_wait_interrupt {
 public:
  explicit scoped_wait_interrupt(wait_interrupt check) noexcept;
  ~scoped_wait_interrupt();
  scoped_wait_interrupt(const scoped_wait_interrupt&) = delete;
  scoped_wait_interrupt& operator=(const scoped_wait_interrupt&) = delete;

 private:
  wait_interrupt previous_;
};

class device_lock {
 public:
  // How often a waiter wakes to check that the holder still lives, and the lower bound of
  // the time between two liveness scans of one segment.
  static constexpr int64_t k_liveness_poll_ns = 10'000'000;
  // How long a waiter woken without a grant (a heads-up) spins before sleeping again.
  static constexpr int64_t k_heads_up_spin_ns = 1'000'000;
  // Predicted release: start spinning this long (plus the jitter) before it, and stop at
  // most k_predict_spin_max_ns later.
  static constexpr int64_t k_predict_margin_ns = 150'000;
  static constexpr int64_t k_predict_spin_max_ns = 2'000'000;
  // How long a try (timeout 0) may wait for the internal mutex, and a release before it
  // frees its slot without it (Bounded waits, above).
  static constexpr int64_t k_mutex_try_ns = 10'000'000;
  static constexpr int64_t k_release_mutex_ns = 100'000'000;
  // The default bound of snapshot() and repair_now().
  static constexpr int64_t k_observer_wait_ns = 100'000'000;

  // Open (creating when absent) the lock of `device_key`: the GPU UUID, or "host-N".
  // Returns 0, err_invalid_argument, err_version_mismatch, err_unavailable, err_system.
  static int open(const std::string& device_key, device_lock* out) noexcept;

  // Remove the segment's name; processes that have it open keep using it.
  static int remove(const std::string& device_key) noexcept;

  device_lock() noexcept;
  ~device_lock();
  device_lock(device_lock&& other) noexcept;
  device_lock& operator=(device_lock&& other) noexcept;
  device_lock(const device_lock&) = delete;
  device_lock& operator=(const device_lock&) = delete;

  // Wait for the lock. timeout_ns: -1 waits forever, 0 only tries, > 0 waits that long.
  // Returns 0 when this thread now holds the lock (see info->previous_holder_died);
  // err_busy (timeout 0: someone else holds it or is ahead in the queue);
  // err_timeout (the time ran out, or the internal mutex stayed taken that long; this thread
  // is no longer in the queue; the detail names the holder, the waiters ahead, and a stuck
  // mutex's owner); err_interrupted (the installed wait_interrupt said stop; not queued);
  // err_invalid_argument (not open, bad priority or timeout);
  // err_busy also when all slots are in use; err_internal when the segment is broken.
  int acquire(lock_priority priority = lock_priority::normal, int64_t timeout_ns = -1,
              acquire_info* info = nullptr) noexcept;
  int try_acquire(lock_priority priority = lock_priority::normal, acquire_info* info = nullptr) noexcept {
    return acquire(priority, 0, info);
  }

  // Undo one acquire; the last one hands the lock to the next waiter.
  // Returns 0; err_not_owner (this thread does not hold it); err_internal.
  int release() noexcept;

  // A hint, by the holding thread, that its last release() is coming: wakes the waiter that
  // would be granted now, so that it is running (spinning) when the grant comes. Changes no
  // state; a no-op when the calling thread does not hold the lock or nobody waits. If the
  // grant goes to someone else (a higher-priority waiter arrived), the woken waiter sleeps
  // again after its spin.
  void announce_release() noexcept;

  // Does the calling thread hold the lock? (False in a forked child.)
  bool held() const noexcept;

  // Run the liveness scan and repair now, without waiting for the periodic one: slots of
  // dead processes disappear, and a lock held by a dead process passes to the next waiter.
  // Waits at most wait_ns for the internal mutex: err_timeout (naming its owner) after that.
  int repair_now(int64_t wait_ns = k_observer_wait_ns) noexcept;

  // The queue: the holder first, then waiters in grant order. Waits at most wait_ns for the
  // internal mutex: err_timeout (naming its owner) after that.
  int snapshot(std::vector<lock_queue_entry>* out, int64_t wait_ns = k_observer_wait_ns) noexcept;

  // Times the recovery function repaired something in this segment, since it was created.
  uint64_t recoveries() const noexcept;

  // How long holds last (moving averages, ns; 0 before the first release) and whether they
  // are regular enough for the next waiter to predict the release (Waiting, above).
  struct hold_stats {
    uint64_t mean_ns = 0;
    uint64_t jitter_ns = 0;
    bool predictable = false;
  };
  hold_stats holds() const noexcept;

  // The segment, for later components that keep their state in its managed area.
  shared_segment* segment() const noexcept { return segment_.get(); }

 private:
  // Take the internal mutex by `deadline_ns` (CLOCK_MONOTONIC); `interruptible`: also stop
  // when the thread's wait_interrupt says so. err_timeout names the mutex's owner.
  int lock_mutex(uint64_t deadline_ns, bool interruptible = false) noexcept;
  void unlock_mutex() noexcept;
  // Leave the queue without the mutex: our slot waiting -> free. False when it was granted.
  bool withdraw(uint32_t slot) noexcept;
  // "held by pid 12 (python3) for 3.2 s, stopped (...); 2 waiters ahead: ...", for errors.
  // `priority` and `ticket`: those of the waiter asking (ticket 0: list no waiters).
  void describe_queue(uint32_t priority, uint64_t ticket, char* buf, size_t size) const noexcept;
  // err_timeout for a mutex still taken after `waited_ns`, naming its owner.
  int mutex_timeout(uint64_t waited_ns) const noexcept;
  static int recover_after_owner_death(void* self) noexcept;
  int repair_locked() noexcept;
  bool slot_owner_alive(uint32_t i) noexcept;
  void let_go_of_lease(uint32_t i) noexcept;
  uint32_t dispatch_locked() noexcept;
  int wait_for_grant(uint32_t slot, uint64_t start_ns, int64_t timeout_ns, uint64_t deadline) noexcept;
  // The waiting slot that would be granted now (read without the mutex: a hint), or k_no_slot.
  uint32_t next_in_line() const noexcept;
  // When `mine`, next in line, should start spinning for a predicted release: 0 when holds
  // are not regular enough to predict, or `mine` is not next. *spin_until: when to stop.
  uint64_t predicted_spin_start(uint32_t mine, uint64_t* spin_until) const noexcept;
  void liveness_tick(uint64_t deadline_ns) noexcept;
  bool held_by(pid_t pid, pid_t tid) const noexcept;
  void forget_holding() noexcept;

  std::unique_ptr<shared_segment> segment_;
  std::string device_key_;  // to open the segment anew in a forked child
  // Which thread of which process holds the lock through this object. Written only by the
  // holding thread; read by any thread to recognize re-entry (a thread only ever finds its
  // own tid here if it wrote it, and the pid check rules out a forked copy).
  std::atomic<pid_t> holder_pid_{0};
  std::atomic<pid_t> holder_tid_{0};
  uint32_t holder_slot_ = 0;
  uint32_t depth_ = 0;
};

}  // namespace vramswap::detail

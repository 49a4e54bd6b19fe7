// device_lock: the per-device, cross-process FIFO lock that survives SIGKILL anywhere.
//
// Internal API (namespace vramswap::detail); the public gpu_lock guard in cpp_api/ wraps it.
// The full design, with its reasoning and limits, is in docs/lock.md; in short:
//
// State. One shared segment per device (lock/shared_segment.hpp) holds a robust
// process-shared pthread mutex, a ticket counter and 256 slots of two cache lines
// (lock/segment_layout.hpp). A thread that acquires takes a free slot and publishes it as
// `waiting` with the next ticket; the lock is held by the one slot in state `holding`.
//
// Order. The next holder is the waiting slot with the highest priority class, then the
// lowest ticket: FIFO within a class, high before normal. A normal waiter can starve while
// high waiters keep arriving; that is what "high" means.
//
// Fair turns (VRAMSWAP_MAX_HOLD, docs/lock.md). A hold longer than its owner's limit while
// others wait is marked in its slot (by a waiter's liveness scan, by the holder's own
// check_hold() at a safe point, or at its release), and the holder's log says so once. A
// process whose hold was marked carries a penalty into its next enqueue: the ticket counter
// at its release (behind_ticket). Every slot still waiting with a lower ticket waited for
// it. The penalized slot keeps its place in the order above, but when it would be granted,
// the best of those waiters is granted instead, one per grant, until none is left; then it
// is granted. So it is served after each waiter it made wait, whatever their class (a high
// holder too), and it can neither starve by it (its place stays; at most as many grants as
// there were waiters go before it) nor deadlock: each substitute has a lower ticket than
// the slot it stands in for, so the choice always ends at a slot that is granted. The
// penalty is spent by the next grant. An operator may ask a holder to release
// (request_release: `vramswap release-request`); it is a flag in the holder's slot that the
// holder's check_hold() reports. Nothing is ever taken from a holder: the flag and the
// penalty are advisory, and a holder that does not release keeps the lock.
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

#include "lock/wait_bounds.hpp"

namespace vramswap::detail {

class shared_segment;
struct process_identity;
struct waiter_list;
namespace lock_layout {
struct turn_histograms;
}

// Priority classes, served high first. Values are stored in the segment; a low class for
// oversubscribed jobs will take 0.
enum class lock_priority : uint32_t { normal = 1, high = 2 };

// What an acquire learned, for callers that care.
struct acquire_info {
  bool previous_holder_died = false;  // the lock was taken from a holder that died holding it
  pid_t dead_holder_pid = 0;          // that holder, when previous_holder_died (a pid of its PID namespace)
  uint64_t dead_holder_pid_ns = 0;    // that namespace (process_identity.hpp: describe_process_in)
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
  // Fair turns (times CLOCK_MONOTONIC, 0: none):
  uint64_t max_hold_ns = 0;           // the owner's VRAMSWAP_MAX_HOLD (0: no limit)
  uint64_t behind_ticket = 0;         // a waiter's penalty: served after the waiters below this ticket
  uint64_t granted_ns = 0;            // the holder: when it was granted
  uint64_t over_limit_since_ns = 0;   // the holder: past its limit with a waiter since then
  uint64_t release_requested_ns = 0;  // the holder: when an operator asked it to release
  uint64_t gang_id = 0;               // a gang member's gang (docs/lock.md, "Gangs"); 0: a single
};

// What request_release() found and did.
struct release_request_result {
  bool held = false;            // somebody held the lock (otherwise nothing was asked)
  bool already_asked = false;   // an earlier request of this hold stands (not asked again)
  pid_t pid = 0;                // the holder
  uint64_t pid_ns = 0;
  uint32_t uid = 0;
  uint64_t held_ns = 0;         // how long it has held the lock
  uint64_t max_hold_ns = 0;     // its VRAMSWAP_MAX_HOLD (0: none)
  uint64_t over_limit_since_ns = 0;
};

// What check_hold() found about the calling process's hold.
struct hold_check {
  bool holding = false;              // this process holds the lock (through this object)
  uint64_t held_ns = 0;
  uint64_t max_hold_ns = 0;          // this process's VRAMSWAP_MAX_HOLD (0: none)
  uint64_t over_limit_since_ns = 0;  // past it with a waiter since then (CLOCK_MONOTONIC; 0: not)
  bool release_requested = false;    // an operator asked this process to release the lock
};


class device_lock {
 public:
  // How often a waiter wakes to check that the holder still lives, and the lower bound of
  // the time between two liveness scans of one segment.
  static constexpr int64_t k_liveness_poll_ns = 10'000'000;
  // Wait notices (VRAMSWAP_WAIT_NOTICE, T s) of one process and device come at most every
  // this many T (every minute at the default 10 s); the next one counts those held back.
  static constexpr uint64_t k_wait_notice_spacing = 6;
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

  // --- fair turns (Order, above; docs/lock.md, "Fair turns") ---------------------------
  // For observers (status, metrics): is the current holder past its VRAMSWAP_MAX_HOLD while
  // others wait? True with *since_ns (CLOCK_MONOTONIC, this machine's clock) the moment it
  // went past; false when nobody holds, the holder has no limit, or is within it, or nobody
  // has waited past it. Read without the mutex, like holds(): a hint, current to a waiter's
  // liveness period.
  bool holder_over_hold_limit(uint64_t* since_ns = nullptr) const noexcept;

  // The holder's side, at a safe point (the session's service thread, at least every 50 ms;
  // each last release): marks this process's hold past its limit when it is and someone
  // waits, logs that once per hold at warn (how long, who waits, that its next acquire
  // queues behind them), and logs once per hold an operator's request to release (and sends
  // this process VRAMSWAP_RELEASE_SIGNAL when that is set). Any thread of the holding process
  // may call it; when this process does not hold the lock it does nothing.
  hold_check check_hold() noexcept;

  // Ask the current holder to release the lock (`vramswap release-request`): one flag in its
  // slot, which its library reports at its next safe point (check_hold). Advisory: the holder
  // keeps the lock until it releases. Returns 0 with *out saying whom it asked (out->held
  // false: nobody holds the lock, nothing was asked); err_timeout after wait_ns for the
  // internal mutex (naming its owner); err_invalid_argument when not open.
  int request_release(release_request_result* out, int64_t wait_ns = k_observer_wait_ns) noexcept;

  // How long holds last (moving averages, ns; 0 before the first release) and whether they
  // are regular enough for the next waiter to predict the release (Waiting, above).
  struct hold_stats {
    uint64_t mean_ns = 0;
    uint64_t jitter_ns = 0;
    bool predictable = false;
    uint64_t holder_granted_ns = 0;  // CLOCK_MONOTONIC of the current holder's grant; 0: nobody holds it
  };
  hold_stats holds() const noexcept;

  // The segment's turn histograms (lock/turn_histograms.hpp): acquire() records each wait,
  // release() each hold, and a session adds its switch times; observers read them. nullptr
  // when not open.
  lock_layout::turn_histograms* turns() const noexcept;

  // --- low-priority compute (docs/oversubscription.md, "Compute") -----------------------
  // For a low-priority (oversubscribed) job that yields the GPU while somebody holds the
  // lock: the word to watch, read without the mutex and without a system call. Nobody holds
  // the lock while it reads k_no_holder. nullptr when not open.
  static constexpr uint32_t k_no_holder = 0xFFFFFFFFu;
  const std::atomic<uint32_t>* holder_word() const noexcept;
  // Whether `seen` (a value read from holder_word) names a live-looking hold that a
  // low-priority job yields to (a holding slot, priority normal or high). A hint, read
  // without the mutex.
  bool holder_claims_compute(uint32_t seen) const noexcept;
  // Sleep until holder_word no longer reads `seen` (a release or a repair wakes it) or
  // timeout_ns passes; then, if it still reads `seen`, run the liveness scan (rate limited
  // across processes, as a waiter's): a holder that died is removed, which changes the word.
  // Safe to call from any number of threads; never takes a slot.
  void wait_holder_change(uint32_t seen, uint64_t timeout_ns) noexcept;

  // The segment, for later components that keep their state in its managed area.
  shared_segment* segment() const noexcept { return segment_.get(); }

  // --- gangs (docs/lock.md, "Gangs") ------------------------------------------------------
  // Take the locks of several devices at once, all or none: `locks[0..count)`, each open
  // and each of a different device (count <= k_max_gang). The calling thread queues on every
  // one of them in one step (it takes their internal mutexes together, in the order of
  // their device keys), and is granted all of them at once when it is next on every one;
  // until then a member device that is free idles rather than serve those queued behind
  // the gang (FIFO per device: that is what keeps a gang from starving behind single-device
  // users). Gangs never deadlock against each other or against singles: a gang's queue
  // places are taken in one step, so all gangs stand in the same order on every device,
  // and the first of them is granted as soon as its devices are free.
  // Each lock is then held as by acquire(): release each with release() (in any order; each
  // device is handed on at its own release). infos (optional): count entries, filled per
  // lock. Re-entry: when the thread holds every one of them already, each count goes up;
  // when it holds only some, err_invalid_argument (waiting for the rest while holding those
  // could deadlock). Returns what acquire() returns; on any failure, none is held.
  // gang_id: recorded in the slots for observers (0: one is made from the thread).
  static constexpr size_t k_max_gang = 64;
  static int acquire_gang(device_lock* const* locks, size_t count, lock_priority priority, int64_t timeout_ns,
                          acquire_info* infos = nullptr, uint64_t gang_id = 0) noexcept;

  // The device key this lock was opened for.
  const std::string& device_key() const noexcept { return device_key_; }

 private:
  friend class gang_waiter;
  // The lock's parts, one file each; the functions of each group below are defined in the
  // file that heads it.

  // device_lock.cpp: the object, and whom it records as the holder.
  // If needed, open the segment anew in a forked child (its descriptor was its parent's).
  int reopen_if_forked() noexcept;
  bool held_by(pid_t pid, pid_t tid) const noexcept;
  void forget_holding() noexcept;

  // lock_word.cpp: the internal mutex, the holder recorded, release and hand-on.
  // Take the internal mutex by `deadline_ns` (CLOCK_MONOTONIC); `interruptible`: also stop
  // when the thread's wait_interrupt says so. err_timeout names the mutex's owner.
  int lock_mutex(uint64_t deadline_ns, bool interruptible = false) noexcept;
  void unlock_mutex() noexcept;
  // err_timeout for a mutex still taken after `waited_ns`, naming its owner.
  int mutex_timeout(uint64_t waited_ns) const noexcept;
  // After a grant of slot `mine` (ticket `ticket`): record this thread as the holder.
  void became_holder(uint32_t mine, uint64_t ticket, pid_t pid, pid_t tid, uint64_t start_ns, acquire_info* info) noexcept;
  // release() by thread `tid` of process `pid`, which does not hold the lock: err_not_owner, saying why.
  int not_the_holder(pid_t pid, pid_t tid) const noexcept;
  // The last release of slot `mine` when the internal mutex stays taken (Bounded waits, above).
  int release_without_mutex(uint32_t mine) noexcept;
  // The last release of slot `mine`, with the mutex held: free it, grant the next waiter, let
  // go of the mutex, then record the hold and say what waits until after it.
  int hand_on_locked(uint32_t mine) noexcept;

  // lock_queue.cpp: slots, tickets, the grant.
  // Where enqueue() put the calling thread: its slot, its ticket, and the penalty it carried.
  struct queue_place {
    uint32_t slot = 0;
    uint64_t ticket = 0;
    uint64_t penalty = 0;
  };
  // An acquire by the thread that holds the lock: the count goes up.
  int reenter(acquire_info* info) noexcept;
  // Take a slot and publish it as waiting (granted at once when nobody holds the lock); a try
  // that is not granted leaves again with err_busy.
  int enqueue(lock_priority priority, int64_t timeout_ns, uint64_t start_ns, uint64_t deadline, const process_identity& me,
              pid_t tid, queue_place* place) noexcept;
  // A try not granted at once, with the mutex held: leave the queue, let go of the mutex, err_busy.
  int refuse_try_locked(uint32_t mine, lock_priority priority, uint64_t my_ticket) noexcept;
  int take_slot_locked(uint32_t* out) noexcept;
  void publish_slot_locked(uint32_t mine, uint32_t priority_word, const process_identity& me, pid_t tid, uint64_t start_ns,
                           uint64_t behind, uint64_t gang_id) noexcept;
  uint32_t dispatch_locked(uint32_t caller_slot) noexcept;
  // Leave the queue without the mutex: our slot waiting -> free. False when it was granted.
  bool withdraw(uint32_t slot) noexcept;
  // "held by pid 12 (python3) for 3.2 s, stopped (...); 2 waiters ahead: ...", for errors.
  // `priority` and `ticket`: those of the waiter asking (ticket 0: list no waiters).
  void describe_queue(uint32_t priority, uint64_t ticket, char* buf, size_t size) const noexcept;

  // lock_wait.cpp: the wait for the grant.
  int wait_for_grant(uint32_t slot, uint64_t start_ns, int64_t timeout_ns, uint64_t deadline) noexcept;
  bool sleep_for_grant(uint32_t mine, uint64_t now, uint64_t last_tick, uint64_t deadline, uint64_t* spun_for) noexcept;
  int leave_queue_after_wait(uint32_t mine, uint64_t start_ns, int64_t timeout_ns, bool stopped, uint32_t my_priority,
                             uint64_t my_ticket) noexcept;
  // The waiting slot that would be granted now (read without the mutex: a hint), or k_no_slot.
  uint32_t next_in_line() const noexcept;
  // When `mine`, next in line, should start spinning for a predicted release: 0 when holds
  // are not regular enough to predict, or `mine` is not next. *spin_until: when to stop.
  uint64_t predicted_spin_start(uint32_t mine, uint64_t* spin_until) const noexcept;

  // lock_recovery.cpp: death recovery, the liveness of slot owners, our leases.
  static int recover_after_owner_death(void* self) noexcept;
  int repair_locked() noexcept;
  bool free_slots_of_dead_owners_locked() noexcept;
  void liveness_tick(uint64_t deadline_ns) noexcept;
  // With the mutex held, for a try or a wait shorter than a liveness period: repair when the
  // holder is dead. On failure slot `mine` has left the queue and the mutex is let go.
  int repair_for_short_wait_locked(uint32_t mine, int64_t timeout_ns) noexcept;
  bool slot_owner_alive(uint32_t i) noexcept;
  void let_go_of_lease(uint32_t i) noexcept;
  void keep_or_let_go_of_lease(uint32_t i) noexcept;

  // lock_notices.cpp: wait notices, holds past their limit, release requests.
  // A wait that began at `start_ns` has passed VRAMSWAP_WAIT_NOTICE (`notice_s`): say whom it
  // waits for, unless a notice was said too recently (then count it).
  void give_wait_notice(uint64_t start_ns, uint64_t now, uint64_t notice_s, uint32_t my_priority, uint64_t my_ticket) noexcept;
  // With the mutex held: mark the hold of slot `holder` past its limit when it is and a
  // waiter waits (once per hold). Returns its over_limit_since_ns (0: not past it).
  uint64_t note_over_limit_locked(uint32_t holder, uint64_t now) noexcept;
  // After the release of a hold (`ticket`) that went past its limit: say so, unless
  // check_hold already did.
  void warn_over_limit_at_release(uint64_t ticket, uint64_t held_ns, uint64_t now, const waiter_list& waiters) noexcept;

  std::unique_ptr<shared_segment> segment_;
  std::string device_key_;  // to open the segment anew in a forked child
  // Fair turns, this process's side: its VRAMSWAP_MAX_HOLD and VRAMSWAP_RELEASE_SIGNAL (read
  // at open), the penalty its next enqueue carries (0: none), the ticket of the hold this
  // object holds (it names the hold in the segment), and the holds already warned about.
  uint64_t max_hold_ns_ = 0;
  int release_signal_ = 0;
  uint32_t uid_ = 0;  // the effective uid at open, recorded in each slot this object fills
  // The wait notices of this opening (VRAMSWAP_WAIT_NOTICE): when the last was logged, and how
  // many waits passed the notice's time since without one.
  std::atomic<uint64_t> last_wait_notice_ns_{0};
  std::atomic<uint32_t> wait_notices_held_{0};
  std::atomic<uint64_t> penalty_behind_{0};
  std::atomic<uint64_t> hold_ticket_{0};
  static constexpr uint64_t k_no_ticket = UINT64_MAX;  // tickets start at 0
  std::atomic<uint64_t> warned_over_ticket_{k_no_ticket};
  std::atomic<uint64_t> told_release_ticket_{k_no_ticket};
  // Which thread of which process holds the lock through this object. Written only by the
  // holding thread; read by any thread to recognize re-entry (a thread only ever finds its
  // own tid here if it wrote it, and the pid check rules out a forked copy).
  std::atomic<pid_t> holder_pid_{0};
  std::atomic<pid_t> holder_tid_{0};
  std::atomic<uint32_t> holder_slot_{0};  // atomic: check_hold reads it from any thread
  uint32_t depth_ = 0;
};

}  // namespace vramswap::detail

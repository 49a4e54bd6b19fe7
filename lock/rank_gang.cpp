// rank_gang (lock/rank_gang.hpp): the design is there and in docs/lock.md.
#include "lock/rank_gang.hpp"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/log.hpp"
#include "core/status.hpp"
#include "lock/crash_points.hpp"
#include "lock/futex.hpp"
#include "lock/gang_waiter.hpp"
#include "lock/liveness_lease.hpp"
#include "lock/process_identity.hpp"
#include "lock/lease_mutex.hpp"
#include "lock/segment_layout.hpp"
#include "lock/shared_segment.hpp"
#include "lock/wait_bounds.hpp"

namespace vramswap::detail {
using namespace lock_layout;

namespace {

constexpr uint64_t k_gang_magic = 0x474E4147574E4152ull;  // "RANKGANG" in little-endian bytes

// A rank's entry. Written under the gang mutex; `state` last (release), so that an entry in
// a state is complete. Every field is a single store meaningful in every value.
enum rank_state : uint32_t {
  rank_absent = 0,  // no process is this rank
  rank_idle = 1,    // a process is this rank (it holds the rank's lease), in no round
  rank_joined = 2,  // in round `round`, its device slot published (forming), not yet queued
  rank_queued = 3,  // in round `round`, its device slot has its place (ticket): waiting or holding
};

struct alignas(k_cache_line) rank_entry {
  std::atomic<uint32_t> state;
  int32_t pid;
  uint64_t pid_ns;
  uint64_t round;
  uint64_t ticket;  // its device slot's ticket, once queued
  uint32_t slot;    // its device slot
  uint32_t uid;
  uint64_t reserved_;
  char device_key[64];
};
static_assert(sizeof(rank_entry) == 2 * k_cache_line);

// The gang's record, in the lock segment's slot area (lock/rank_gang.hpp, Rendezvous).
struct alignas(k_cache_line) gang_record {
  uint64_t magic;  // k_gang_magic once set up (under the mutex): all below is meaningful
  uint32_t world_size;
  uint32_t reserved_;
  uint64_t round;                 // the round now forming (rounds start at 1)
  std::atomic<uint32_t> events;   // the futex ranks wait on: bumped at each join, queueing, break, abort
  // Sticky: a rank died. Its index and pid; set once (the first death), before `broken`.
  std::atomic<uint32_t> broken;
  int32_t broken_rank;
  int32_t broken_pid;
  uint64_t broken_pid_ns;
  // A rank left round `aborted_round` after it was queued (its timeout or an interrupt).
  uint64_t aborted_round;
  int32_t aborted_rank;
  int32_t aborted_pid;
  rank_entry ranks[rank_gang::k_max_ranks];
};
static_assert(k_slots_offset + sizeof(gang_record) <= k_turns_offset, "the gang record fits the slot area");
static_assert(rank_gang::k_max_ranks <= k_slot_count, "one lease per rank");

gang_record* record_of(shared_segment* s) {
  return reinterpret_cast<gang_record*>(static_cast<char*>(s->base()) + k_slots_offset);
}
lock_state* gang_state_of(shared_segment* s) { return lock_state_of(s->base()); }

bool rank_alive(shared_segment* s, uint32_t r) {
  if (!s->opened_in_this_process()) return true;
  return s->own_leases().has(r) || lease_held_elsewhere(s->lease_fd(), r);
}

uint64_t fnv1a(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h == 0 ? 1 : h;
}

void wake_all(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Leave our slot `slot` on `mine` (its place: `my_slot`) without its device's mutex, like a
// timed-out waiter: CAS waiting -> free; a slot being granted (granting) is waited for.
// Then a free device that had it next goes on to those behind. True when the slot turned
// out granted after all (it is then ours to hold).
bool leave_slot(device_lock& mine, uint32_t slot, const waiter_slot& my_slot) noexcept {
  for (int spins = 0; spins < 1'000'000; ++spins) {
    if (gang_waiter::withdraw(&mine, slot)) break;
    const uint32_t s = my_slot.state.load(std::memory_order_acquire);
    if (s == slot_holding) return true;  // granted after all
    if (s != slot_granting) {
      gang_waiter::let_go_of_lease(&mine, slot);
      break;
    }
    if (spins % 1000 == 999) gang_waiter::liveness_tick(&mine, monotonic_ns() + static_cast<uint64_t>(device_lock::k_mutex_try_ns));
    cpu_relax();
  }
  if (gang_waiter::lock_mutex(&mine, monotonic_ns() + static_cast<uint64_t>(device_lock::k_mutex_try_ns)) == ok) {
    gang_waiter::dispatch_if_free_locked(&mine);
    gang_waiter::unlock_mutex(&mine);
  } else {
    clear_error();
  }
  return false;
}

}  // namespace

int rank_gang::recover(void* self) noexcept {
  auto* g = static_cast<rank_gang*>(self);
  log(log_level::warn, "gang %s: a process died inside the gang's critical section; repairing", g->job_.c_str());
  g->check_ranks_locked();
  return ok;
}

int rank_gang::lock_gang(uint64_t deadline_ns) noexcept {
  lock_state* st = gang_state_of(segment_.get());
  const int rc = lease_mutex_lock(&st->mutex, segment_->mutex_owner(), deadline_ns, &rank_gang::recover, this);
  if (rc == err_timeout) {
    const pid_t tid = st->mutex.owner_tid.load(std::memory_order_relaxed);
    return fail(err_timeout,
                "gang %s: its internal mutex stayed taken (by thread %d) past the deadline; it is held for microseconds by "
                "a running process: a stopped one (kill -CONT) or a debugger holds it",
                job_.c_str(), static_cast<int>(tid));
  }
  return rc;
}

void rank_gang::unlock_gang() noexcept { lease_mutex_unlock(&gang_state_of(segment_.get())->mutex); }

void rank_gang::check_ranks_locked() noexcept {
  gang_record* g = record_of(segment_.get());
  if (g->magic != k_gang_magic) return;
  for (uint32_t r = 0; r < std::min(g->world_size, k_max_ranks); ++r) {
    rank_entry& e = g->ranks[r];
    const uint32_t state = e.state.load(std::memory_order_relaxed);
    if (state == rank_absent || rank_alive(segment_.get(), r)) continue;
    // A death: record it before forgetting the entry (a death in between records it twice).
    if (g->broken.load(std::memory_order_relaxed) == 0) {
      g->broken_rank = static_cast<int32_t>(r);
      g->broken_pid = e.pid;
      g->broken_pid_ns = e.pid_ns;
      g->broken.store(1, std::memory_order_release);
      char who[192];
      describe_process_in(e.pid, e.pid_ns, who, sizeof who);
      log(log_level::warn, "gang %s: rank %u (%s) died; the gang is broken: its other ranks fail at their next acquire",
          job_.c_str(), r, who);
    }
    e.state.store(rank_absent, std::memory_order_release);
    g->events.fetch_add(1, std::memory_order_release);
    wake_all(&g->events);
  }
}

int rank_gang::broken_error(const char* when) noexcept {
  gang_record* g = record_of(segment_.get());
  char who[192];
  describe_process_in(g->broken_pid, g->broken_pid_ns, who, sizeof who);
  std::string alive;
  for (uint32_t r = 0; r < std::min(g->world_size, k_max_ranks); ++r) {
    if (g->ranks[r].state.load(std::memory_order_relaxed) == rank_absent) continue;
    try {
      alive += (alive.empty() ? "" : ", ") + std::to_string(r) + " (pid " + std::to_string(g->ranks[r].pid) + ")";
    } catch (...) {
    }
  }
  return fail(err_owner_died,
              "gang %s: rank %d (%s) died%s, so the gang cannot be granted together any more: nothing is held. Restart the "
              "whole job (every rank exits; torchrun restarts them); ranks still in the gang: %s",
              job_.c_str(), g->broken_rank, who, when, alive.empty() ? "none" : alive.c_str());
}

int rank_gang::open(const std::string& job, uint32_t rank, uint32_t world_size, std::unique_ptr<rank_gang>* out) noexcept {
  if (out == nullptr) return fail(err_invalid_argument, "rank_gang::open: out is null");
  if (world_size == 0 || world_size > k_max_ranks) {
    return fail(err_invalid_argument, "gang %s: world size %u; a gang has 1 to %u ranks", job.c_str(), world_size, k_max_ranks);
  }
  if (rank >= world_size) {
    return fail(err_invalid_argument, "gang %s: rank %u is not below the world size %u (ranks count from 0)", job.c_str(), rank,
                world_size);
  }
  if (job.empty() || job.size() > 100) {
    return fail(err_invalid_argument, "gang: the job id \"%s\" must have 1 to 100 characters", job.c_str());
  }
  std::unique_ptr<rank_gang> g(new (std::nothrow) rank_gang());
  if (g == nullptr) return fail(err_out_of_memory, "gang %s: out of host memory", job.c_str());
  try {
    g->job_ = job;
  } catch (...) {
    return fail(err_out_of_memory, "gang %s: out of host memory", job.c_str());
  }
  g->rank_ = rank;
  g->world_ = world_size;
  g->gang_id_ = fnv1a(job);
  VS_TRY(add_context(shared_segment::open("gang-" + job, &g->segment_), "gang %s: ", job.c_str()));
  VS_TRY(g->lock_gang(monotonic_ns() + static_cast<uint64_t>(k_gang_mutex_ns)));
  gang_record* rec = record_of(g->segment_.get());
  bool anyone = false;
  if (rec->magic == k_gang_magic) {
    for (uint32_t r = 0; r < std::min(rec->world_size, k_max_ranks); ++r) {
      if (rec->ranks[r].state.load(std::memory_order_relaxed) != rank_absent && rank_alive(g->segment_.get(), r)) anyone = true;
    }
  }
  if (!anyone) {
    // Nobody alive in it: a new gang (the last one's ranks have all left, or died).
    rec->magic = 0;
    rec->world_size = world_size;
    rec->round = 1;
    rec->broken_rank = -1;
    rec->broken_pid = 0;
    rec->broken_pid_ns = 0;
    rec->aborted_round = 0;
    rec->aborted_rank = -1;
    rec->aborted_pid = 0;
    for (uint32_t r = 0; r < k_max_ranks; ++r) rec->ranks[r].state.store(rank_absent, std::memory_order_relaxed);
    rec->broken.store(0, std::memory_order_relaxed);
    rec->magic = k_gang_magic;  // last: the record is meaningful
  }
  g->check_ranks_locked();
  int rc = ok;
  rank_entry& e = rec->ranks[rank];
  if (rec->world_size != world_size) {
    rc = fail(err_invalid_argument, "gang %s: its ranks say the world size is %u, this process says %u; every rank of a job must "
              "give the same world size", job.c_str(), rec->world_size, world_size);
  } else if (rec->broken.load(std::memory_order_relaxed) != 0) {
    rc = g->broken_error(" earlier");
  } else if (e.state.load(std::memory_order_relaxed) != rank_absent) {
    char who[192];
    describe_process_in(e.pid, e.pid_ns, who, sizeof who);
    rc = fail(err_busy, "gang %s: rank %u is already taken by %s; give each process of the job its own rank", job.c_str(), rank, who);
  } else if (const int lrc = take_lease(g->segment_->lease_fd(), rank, g->segment_->name().c_str()); lrc != ok) {
    rc = lrc == err_busy ? fail(err_busy, "gang %s: rank %u is being left by its previous process; retry", job.c_str(), rank) : lrc;
  } else {
    g->segment_->own_leases().add(rank);
    process_identity me{};
    current_process(&me);
    e.pid = me.pid;
    e.pid_ns = me.pid_ns;
    e.uid = static_cast<uint32_t>(::geteuid());
    e.round = 0;
    e.ticket = 0;
    e.slot = k_no_slot;
    e.device_key[0] = '\0';
    e.state.store(rank_idle, std::memory_order_release);
  }
  g->unlock_gang();
  VS_TRY(rc);
  *out = std::move(g);
  return ok;
}

rank_gang::~rank_gang() {
  if (segment_ == nullptr || !segment_->opened_in_this_process()) return;
  if (segment_->own_leases().has(rank_)) {
    if (lock_gang(monotonic_ns() + static_cast<uint64_t>(k_gang_mutex_ns)) == ok) {
      gang_record* rec = record_of(segment_.get());
      rec->ranks[rank_].state.store(rank_absent, std::memory_order_release);
      rec->events.fetch_add(1, std::memory_order_release);
      wake_all(&rec->events);
      unlock_gang();
    } else {
      clear_error();  // the entry stays; with its lease gone the others read it as a death
    }
    drop_lease(segment_->lease_fd(), rank_);
    segment_->own_leases().remove(rank_);
  }
}

device_lock* rank_gang::lock_for(const std::string& key, device_lock& mine) noexcept {
  if (key == mine.device_key()) return &mine;
  try {
    auto it = peers_.find(key);
    if (it != peers_.end()) return it->second.get();
    auto l = std::make_unique<device_lock>();
    if (device_lock::open(key, l.get()) != ok) return nullptr;
    device_lock* raw = l.get();
    peers_.emplace(key, std::move(l));
    return raw;
  } catch (...) {
    return nullptr;
  }
}

void rank_gang::queue_round_locked(uint64_t round, device_lock& mine) noexcept {
  gang_record* rec = record_of(segment_.get());
  gang_waiter::member members[k_max_ranks];
  size_t n = 0;
  for (uint32_t r = 0; r < world_; ++r) {
    rank_entry& e = rec->ranks[r];
    std::string key;
    try {
      key.assign(e.device_key, strnlen(e.device_key, sizeof e.device_key));
    } catch (...) {
      return;
    }
    members[n].lock = lock_for(key, mine);
    members[n].slot = e.slot;
    members[n].caller_index = r;
    if (members[n].lock == nullptr) {
      log(log_level::warn, "gang %s: round %llu could not be queued: opening rank %u's device %s: %s", job_.c_str(),
          static_cast<unsigned long long>(round), r, key.c_str(), last_error());
      set_aborted(round, rank_, ::getpid());
      return;
    }
    ++n;
  }
  std::sort(members, members + n, [](const gang_waiter::member& a, const gang_waiter::member& b) {
    return a.lock->device_key() < b.lock->device_key();
  });
  gang_waiter gang(members, n);
  if (gang.lock_all(monotonic_ns() + static_cast<uint64_t>(k_gang_mutex_ns), false) != ok) {
    // A device's mutex stuck (a stopped process): the round cannot be queued; it ends, and
    // every rank's wait says why.
    log(log_level::warn, "gang %s: round %llu could not be queued: %s", job_.c_str(), static_cast<unsigned long long>(round),
        last_error());
    set_aborted(round, rank_, ::getpid());
    return;
  }
  // Every member's slot must still be the one it published (its process may have died).
  for (size_t i = 0; i < n; ++i) {
    const rank_entry& e = rec->ranks[members[i].caller_index];
    const waiter_slot& s = gang.slot_of(i);
    if (s.state.load(std::memory_order_relaxed) != slot_waiting || s.pid != e.pid ||
        (s.priority.load(std::memory_order_relaxed) & k_gang_forming) == 0) {
      gang.unlock_all();
      check_ranks_locked();  // a dead rank breaks the gang; a live one left: the round ends
      if (rec->broken.load(std::memory_order_relaxed) == 0) set_aborted(round, static_cast<uint32_t>(members[i].caller_index), e.pid);
      return;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    lock_state* st = lock_state_of(gang_waiter::segment_of(members[i].lock)->base());
    waiter_slot& s = gang.slot_of(i);
    rank_entry& e = rec->ranks[members[i].caller_index];
    members[i].ticket = st->next_ticket;
    st->next_ticket = members[i].ticket + 1;
    e.ticket = members[i].ticket;
    s.ticket.store(members[i].ticket, std::memory_order_relaxed);
    // The place is taken with this one store: the slot is in the device's order from now.
    s.priority.store(s.priority.load(std::memory_order_relaxed) & ~k_gang_forming, std::memory_order_release);
    e.state.store(rank_queued, std::memory_order_release);
    if (i == 0) at_crash_point(crash_point::gang_queued_one);
  }
  if (gang.grantable_locked()) gang.grant_locked();
  gang.unlock_all();
}

void rank_gang::set_aborted(uint64_t round, uint32_t rank, pid_t pid) noexcept {
  gang_record* rec = record_of(segment_.get());
  rec->aborted_rank = static_cast<int32_t>(rank);
  rec->aborted_pid = pid;
  __atomic_store_n(&rec->aborted_round, round, __ATOMIC_RELEASE);  // last: the others read it without the mutex
}

bool rank_gang::try_grant(uint64_t round, device_lock& mine, uint64_t deadline_ns) noexcept {
  gang_record* rec = record_of(segment_.get());
  gang_waiter::member members[k_max_ranks];
  size_t n = 0;
  if (lock_gang(deadline_ns) != ok) {
    clear_error();
    return false;
  }
  for (uint32_t r = 0; r < world_; ++r) {
    const rank_entry& e = rec->ranks[r];
    if (e.state.load(std::memory_order_relaxed) != rank_queued || e.round != round) {
      unlock_gang();
      return false;  // not queued (or already granted and gone on to its next round)
    }
    std::string key;
    try {
      key.assign(e.device_key, strnlen(e.device_key, sizeof e.device_key));
    } catch (...) {
      unlock_gang();
      return false;
    }
    members[n].lock = lock_for(key, mine);
    members[n].slot = e.slot;
    members[n].ticket = e.ticket;
    if (members[n].lock == nullptr) {
      unlock_gang();
      clear_error();
      return false;
    }
    ++n;
  }
  std::sort(members, members + n, [](const gang_waiter::member& a, const gang_waiter::member& b) {
    return a.lock->device_key() < b.lock->device_key();
  });
  gang_waiter gang(members, n);
  bool granted = false;
  if (gang.lock_all(deadline_ns, false) == ok) {
    granted = gang.grantable_locked() && gang.grant_locked();
    gang.unlock_all();
  } else {
    clear_error();
  }
  unlock_gang();
  return granted;
}

// One acquire's round, as its steps share it.
struct rank_gang::round_call {
  device_lock& mine;
  const lock_priority priority;
  const int64_t timeout_ns;
  const uint64_t start_ns;
  const uint64_t deadline;
  const process_identity me;
  const pid_t tid;
  uint32_t slot = k_no_slot;          // ours on our device
  waiter_slot* my_slot = nullptr;     // its place in the device's segment
  uint64_t round = 0;                 // the round joined
};

int rank_gang::acquire(device_lock& mine, lock_priority priority, int64_t timeout_ns, acquire_info* info) noexcept {
  const uint64_t start_ns = monotonic_ns();
  if (info != nullptr) *info = acquire_info{};
  if (segment_ == nullptr) return fail(err_invalid_argument, "rank_gang::acquire: not open");
  if (world_ == 1) return mine.acquire(priority, timeout_ns, info);
  VS_TRY(check_acquire(mine, priority, timeout_ns));
  process_identity me{};
  VS_TRY(current_process(&me));
  const pid_t tid = current_tid();
  if (gang_waiter::held_by(&mine, me.pid, tid)) return mine.acquire(priority, timeout_ns, info);  // re-entry: counted
  const uint64_t deadline = deadline_after(start_ns, timeout_ns);
  const uint64_t mutex_deadline = std::max(deadline, start_ns + static_cast<uint64_t>(device_lock::k_mutex_try_ns));
  round_call c{mine, priority, timeout_ns, start_ns, deadline, me, tid};

  // 1. Our slot on our device, forming (outside every device's order).
  VS_TRY(publish_forming_slot(c, mutex_deadline));
  // 2. Join the round; the last to join queues it.
  VS_TRY(join_round(c, mutex_deadline));
  // 3. Wait for the grant.
  bool stop = false;
  const int why = wait_for_round(c, &stop);
  // 4. Not granted: leave the round, unless the grant came as we left.
  if (c.my_slot->state.load(std::memory_order_acquire) != slot_holding && !leave_slot(mine, c.slot, *c.my_slot)) {
    return leave_round(c, why, stop);
  }
  gang_waiter::became_holder(&mine, c.slot, c.my_slot->ticket.load(std::memory_order_relaxed), me.pid, tid, start_ns, info);
  return ok;
}

int rank_gang::check_acquire(device_lock& mine, lock_priority priority, int64_t timeout_ns) noexcept {
  if (priority != lock_priority::normal && priority != lock_priority::high) {
    return fail(err_invalid_argument, "gang %s: priority %u is not a lock_priority (normal=1, high=2)", job_.c_str(),
                static_cast<unsigned>(priority));
  }
  if (timeout_ns < -1) return fail(err_invalid_argument, "gang %s: timeout %lld ns is negative", job_.c_str(), static_cast<long long>(timeout_ns));
  if (mine.device_key().size() >= sizeof(rank_entry{}.device_key)) {
    return fail(err_invalid_argument, "gang %s: device key %s is too long for a gang", job_.c_str(), mine.device_key().c_str());
  }
  VS_TRY(gang_waiter::reopen_if_forked(&mine));
  if (!segment_->opened_in_this_process()) {
    return fail(err_unavailable, "gang %s: this process was forked from the one that joined the gang as rank %u; a forked child "
                "is no rank (join the gang in it anew)", job_.c_str(), rank_);
  }
  return ok;
}

int rank_gang::publish_forming_slot(round_call& c, uint64_t mutex_deadline) noexcept {
  VS_TRY(gang_waiter::lock_mutex(&c.mine, mutex_deadline, true));
  if (const int trc = gang_waiter::take_slot_locked(&c.mine, &c.slot); trc != ok) {
    gang_waiter::unlock_mutex(&c.mine);
    return trc;
  }
  gang_waiter::publish_slot_locked(&c.mine, c.slot, static_cast<uint32_t>(c.priority) | k_gang_member | k_gang_forming, c.me, c.tid,
                                   c.start_ns, gang_id_);
  gang_waiter::unlock_mutex(&c.mine);
  c.my_slot = &slots_of(gang_waiter::segment_of(&c.mine)->base())[c.slot];
  return ok;
}

int rank_gang::join_round(round_call& c, uint64_t mutex_deadline) noexcept {
  gang_record* rec = record_of(segment_.get());
  rank_entry& entry = rec->ranks[rank_];
  if (const int grc = lock_gang(mutex_deadline); grc != ok) {
    leave_slot(c.mine, c.slot, *c.my_slot);
    return grc;
  }
  check_ranks_locked();
  if (rec->broken.load(std::memory_order_relaxed) != 0) {
    unlock_gang();
    leave_slot(c.mine, c.slot, *c.my_slot);
    return broken_error("");
  }
  const uint64_t round = rec->round;
  c.round = round;
  entry.round = round;
  entry.slot = c.slot;
  entry.ticket = 0;
  std::memcpy(entry.device_key, c.mine.device_key().c_str(), c.mine.device_key().size() + 1);
  entry.state.store(rank_joined, std::memory_order_release);
  uint32_t joined = 0;
  for (uint32_t r = 0; r < world_; ++r) {
    const rank_entry& e = rec->ranks[r];
    const uint32_t s = e.state.load(std::memory_order_relaxed);
    if ((s == rank_joined || s == rank_queued) && e.round == round) ++joined;
  }
  if (joined == world_) {
    if (!ranks_share_a_device_locked(round)) queue_round_locked(round, c.mine);
    rec->round = round + 1;
  }
  rec->events.fetch_add(1, std::memory_order_release);
  wake_all(&rec->events);
  unlock_gang();
  return ok;
}

bool rank_gang::ranks_share_a_device_locked(uint64_t round) noexcept {
  // Two ranks on one device cannot be granted together.
  gang_record* rec = record_of(segment_.get());
  for (uint32_t a = 0; a < world_; ++a) {
    for (uint32_t b = a + 1; b < world_; ++b) {
      if (std::strncmp(rec->ranks[a].device_key, rec->ranks[b].device_key, sizeof rec->ranks[a].device_key) == 0) {
        log(log_level::error, "gang %s: ranks %u and %u both use device %s; each rank needs a device of its own", job_.c_str(),
            a, b, rec->ranks[a].device_key);
        set_aborted(round, b, rec->ranks[b].pid);
        return true;
      }
    }
  }
  return false;
}

int rank_gang::wait_for_round(round_call& c, bool* stop) noexcept {
  gang_record* rec = record_of(segment_.get());
  const rank_entry& entry = rec->ranks[rank_];
  const waiter_slot& my_slot = *c.my_slot;
  uint64_t last_tick = monotonic_ns();
  for (;;) {
    if (my_slot.state.load(std::memory_order_acquire) == slot_holding) return ok;
    const uint32_t seen = rec->events.load(std::memory_order_acquire);
    if (rec->broken.load(std::memory_order_acquire) != 0) return err_owner_died;
    if (__atomic_load_n(&rec->aborted_round, __ATOMIC_ACQUIRE) == c.round) return err_timeout;
    const uint64_t now = monotonic_ns();
    if (now >= c.deadline || *stop) return ok;
    if (now - last_tick >= static_cast<uint64_t>(device_lock::k_liveness_poll_ns)) {
      check_liveness(c.mine, now, c.deadline);
      last_tick = now;
      *stop = interrupted_now(false);
      if (entry.state.load(std::memory_order_acquire) == rank_queued) {
        try_grant(c.round, c.mine, std::min(c.deadline, monotonic_ns() + static_cast<uint64_t>(device_lock::k_mutex_try_ns)));
      }
      continue;
    }
    if (sleep_in_round(c, seen, last_tick) == EINTR) {
      *stop = interrupted_now(true);
      continue;
    }
    if (entry.state.load(std::memory_order_acquire) == rank_queued && my_slot.state.load(std::memory_order_acquire) == slot_waiting) {
      try_grant(c.round, c.mine, std::min(c.deadline, monotonic_ns() + static_cast<uint64_t>(device_lock::k_mutex_try_ns)));
    }
  }
}

void rank_gang::check_liveness(device_lock& mine, uint64_t now, uint64_t deadline) noexcept {
  gang_waiter::liveness_tick(&mine, std::min(deadline, now + static_cast<uint64_t>(device_lock::k_liveness_poll_ns)));
  if (lock_gang(std::min(deadline, now + static_cast<uint64_t>(device_lock::k_mutex_try_ns))) == ok) {
    check_ranks_locked();
    unlock_gang();
  } else {
    clear_error();
  }
}

int rank_gang::sleep_in_round(const round_call& c, uint32_t seen, uint64_t last_tick) noexcept {
  // Asleep until our slot changes or is woken (a dispatch found the gang next on our
  // device; the grant) or the gang's events move (a join, the queueing, a break).
  gang_record* rec = record_of(segment_.get());
  waiter_slot& my_slot = *c.my_slot;
  std::atomic<uint32_t>* words[2] = {&my_slot.state, &rec->events};
  const uint32_t expected[2] = {slot_waiting, seen};
  const uint64_t wake = std::min(c.deadline, last_tick + static_cast<uint64_t>(device_lock::k_liveness_poll_ns));
  int wrc = 0;
  if (my_slot.state.load(std::memory_order_acquire) == slot_waiting) {
    wrc = futex_wait_any(words, expected, 2, wake);
    if (wrc == ENOSYS) wrc = futex_wait(&my_slot.state, slot_waiting, std::min<uint64_t>(1'000'000, wake > monotonic_ns() ? wake - monotonic_ns() : 0));
  } else {
    cpu_relax();  // granting: the granter is in its critical section
  }
  return wrc;
}

int rank_gang::leave_round(const round_call& c, int why, bool stop) noexcept {
  const bool queued = quit_round(c);
  if (why == err_owner_died) return broken_error(" while its gang waited");
  const std::string missing = missing_ranks(c.round);
  const gang_record* rec = record_of(segment_.get());
  if (why == err_timeout && rec->aborted_rank != static_cast<int32_t>(rank_)) {
    return fail(err_timeout,
                "gang %s: rank %d (pid %d) left round %llu before the gang was granted (its timeout, an interrupt, or a "
                "device shared with another rank): nothing is held; acquire again for the next round",
                job_.c_str(), rec->aborted_rank, rec->aborted_pid, static_cast<unsigned long long>(c.round));
  }
  if (stop) {
    return fail(err_interrupted, "gang %s: interrupted while rank %u waited for its gang; nothing is held", job_.c_str(), rank_);
  }
  if (!queued) {
    return fail(c.timeout_ns == 0 ? err_busy : err_timeout,
                "gang %s: rank %u waited %.3f s, but ranks %s of %u never joined round %llu: start every rank of the job "
                "(each with the same job id and world size), or wait longer",
                job_.c_str(), rank_, static_cast<double>(monotonic_ns() - c.start_ns) / 1e9, missing.c_str(), world_,
                static_cast<unsigned long long>(c.round));
  }
  char queue[768];
  gang_waiter::member m[1] = {{&c.mine, 0, c.slot, rec->ranks[rank_].ticket}};
  gang_waiter(m, 1).describe(static_cast<uint32_t>(c.priority), queue, sizeof queue);
  return fail(c.timeout_ns == 0 ? err_busy : err_timeout,
              "gang %s: every rank joined, but the gang was not next on every rank's device within %.3f s (this rank's: %s); "
              "the round is over for every rank. Wait longer, or see `vramswap status`",
              job_.c_str(), static_cast<double>(monotonic_ns() - c.start_ns) / 1e9, queue);
}

bool rank_gang::quit_round(const round_call& c) noexcept {
  gang_record* rec = record_of(segment_.get());
  rank_entry& entry = rec->ranks[rank_];
  // Queued (read under the gang mutex: the last rank may have queued the round as we
  // left): the round cannot be granted without us, so it is over for every rank.
  bool queued = entry.state.load(std::memory_order_acquire) == rank_queued;
  if (lock_gang(monotonic_ns() + static_cast<uint64_t>(k_gang_mutex_ns)) == ok) {
    queued = entry.state.load(std::memory_order_relaxed) == rank_queued && entry.round == c.round;
    if (queued && rec->aborted_round != c.round && rec->broken.load(std::memory_order_relaxed) == 0) {
      set_aborted(c.round, rank_, c.me.pid);
    }
    entry.state.store(rank_idle, std::memory_order_release);
    rec->events.fetch_add(1, std::memory_order_release);
    wake_all(&rec->events);
    unlock_gang();
  } else {
    clear_error();
  }
  return queued;
}

std::string rank_gang::missing_ranks(uint64_t round) const noexcept {
  const gang_record* rec = record_of(segment_.get());
  std::string missing;
  for (uint32_t r = 0; r < world_; ++r) {
    const rank_entry& e = rec->ranks[r];
    const uint32_t s = e.state.load(std::memory_order_relaxed);
    if (r == rank_ || ((s == rank_joined || s == rank_queued) && e.round == round)) continue;
    try {
      missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    } catch (...) {
    }
  }
  return missing;
}

}  // namespace vramswap::detail

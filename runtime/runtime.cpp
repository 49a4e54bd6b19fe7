#include "runtime/runtime.hpp"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "core/log.hpp"
#include "core/status.hpp"
#include "core/options.hpp"
#include "lock/process_identity.hpp"
#include "lock/wait_bounds.hpp"
#include "runtime/device_session.hpp"
#include "runtime/memory_tags.hpp"
#include "runtime/oversubscribed_session.hpp"
#include "runtime/session.hpp"
#include "runtime/stream_allocator.hpp"
#include "pool/pool_segment.hpp"
#include "lock/shared_segment.hpp"

namespace vramswap::detail::rt {
namespace {

// A device's session: time-sharing under the lock (device_session) or, with
// VRAMSWAP_OVERSUBSCRIBE=1, low priority without it (oversubscribed_session).
struct device_state {
  std::unique_ptr<session> policy;
  std::unique_ptr<stream_allocator> async;  // over the session's pager; destroyed before it
  std::unique_ptr<memory_tags> tags;        // the same
  std::atomic<uint64_t> holder_deaths{0};
};

// Sessions by device. Opened under g_mutex, never closed before exit, so a pointer taken
// under the mutex stays valid without it.
std::timed_mutex g_mutex;
std::vector<std::unique_ptr<device_state>> g_devices;
// The same sessions for the first devices, read without g_mutex: every malloc_async and
// free_async looks its device up, and a process-wide mutex per call would serialize the
// framework's threads (and cost a lock and unlock each). Published after the session is
// whole; cleared under g_mutex before g_devices is.
constexpr size_t k_fast_devices = 64;
std::atomic<device_state*> g_fast[k_fast_devices] = {};
void clear_fast() noexcept {
  for (auto& f : g_fast) f.store(nullptr, std::memory_order_relaxed);
}
std::atomic<pid_t> g_owner_pid{0};  // the process that opened the first session
// Set in a child made by fork() (pthread_atfork): forked_child() is asked on every call,
// malloc_async's included, and getpid() is a system call.
std::atomic<bool> g_forked{false};
void mark_forked() noexcept { g_forked.store(true, std::memory_order_relaxed); }
// Locks held by this thread, by device: the re-entry depth (the sessions count the same).
thread_local std::vector<uint32_t> t_held;
// This thread's allocation tag (set_thread_tag); "" when none.
thread_local char t_tag[memory_tags::k_max_name + 1] = "";

// Set by close_all (at exit): the sessions are gone, and so, soon, is the backend. A call
// after it (from an atexit handler or a static destructor that runs after vramswap's own)
// opens nothing: it would reopen a session over a backend already destroyed. The arenas the
// sessions had are kept (under g_mutex), so that a free of their memory then succeeds: the
// memory went with the session.
std::atomic<bool> g_closed{false};
struct closed_arena {
  int device;
  uintptr_t base;
  uint64_t size;
};
std::vector<closed_arena> g_closed_arenas;

bool in_closed_arena(int device, uintptr_t ptr) {
  std::lock_guard<std::timed_mutex> guard(g_mutex);
  for (const closed_arena& a : g_closed_arenas) {
    if (a.device == device && ptr >= a.base && ptr - a.base < a.size) return true;
  }
  return false;
}

void close_all() {
  g_closed.store(true);
  if (forked_child()) {
    // The copies of the sessions in a forked child have no threads to join (and g_mutex may
    // have been held by a thread that does not exist here): leave them.
    for (auto& d : g_devices) (void)d.release();
    return;
  }
  std::lock_guard<std::timed_mutex> guard(g_mutex);
  clear_fast();
  for (size_t d = 0; d < g_devices.size(); ++d) {
    if (!g_devices[d] || !g_devices[d]->policy) continue;
    const pager& p = g_devices[d]->policy->memory();
    try {
      g_closed_arenas.push_back({static_cast<int>(d), p.arena_base(), p.arena_size()});
    } catch (const std::bad_alloc&) {
    }
  }
  g_devices.clear();  // releases a lock the exiting thread holds, leaves the pool
}

int check_process(const char* fn, int device) {
  if (forked_child()) {
    return fail(err_unavailable,
                "%s(device %d): this process was forked from process %d after vramswap was used there; a forked child "
                "cannot use vramswap (nor CUDA), and it never holds the parent's locks. Start helper processes with "
                "posix_spawn/exec (Python multiprocessing: the 'spawn' start method)",
                fn, device, static_cast<int>(g_owner_pid.load()));
  }
  return ok;
}

// The session of `device`, opened on first use.
int state_for(const char* fn, int device, device_state** out) {
  VS_TRY(check_process(fn, device));
  if (g_closed.load()) {
    return fail(err_unavailable,
                "%s(device %d): vramswap has shut down, this process is exiting: the call came from an atexit handler or a "
                "static destructor that runs after vramswap's own teardown (its sessions, and the memory they held, are "
                "gone); make such calls before exit, or register the handler after vramswap's first use",
                fn, device);
  }
  if (device >= 0 && static_cast<size_t>(device) < k_fast_devices) {
    if (device_state* st = g_fast[device].load(std::memory_order_acquire); st != nullptr) {
      *out = st;
      return ok;
    }
  }
  // Another thread may be opening a session (waiting for the pool server): this thread's wait
  // for it is bounded like its own would be (lock/wait_bounds.hpp: an acquire's timeout).
  std::unique_lock<std::timed_mutex> guard(g_mutex, std::defer_lock);
  while (!guard.try_lock_for(std::chrono::milliseconds(wait_slice_ms(50)))) {
    VS_TRY(wait_may_go_on(false, "another thread of this process to open a device's session"));
  }
  if (device >= 0 && static_cast<size_t>(device) < g_devices.size() && g_devices[device] &&
      g_devices[device]->policy) {
    *out = g_devices[device].get();
    return ok;
  }
  // Every VRAMSWAP_* setting is checked before anything is made, so a bad one fails this
  // first call whole (and every later one until it is corrected) instead of surfacing as a
  // fallback halfway through a session.
  VS_TRY(add_context(validate_options(), "%s(device %d): ", fn, device));
  backend* be = nullptr;
  const auto t_backend = std::chrono::steady_clock::now();
  VS_TRY(add_context(default_backend(&be), "%s(device %d): ", fn, device));
  log(log_level::debug, "runtime: %s(device %d): the %s backend ready in %.2f ms", fn, device, be->name(),
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_backend).count());
  int count = 0;
  VS_TRY(add_context(be->device_count(&count), "%s(device %d): ", fn, device));
  if (device < 0 || device >= count) {
    return fail(err_invalid_argument,
                "%s(device %d): no such device; the %s backend has %d device(s), numbered from 0 (the host backend's count "
                "is VRAMSWAP_HOST_DEVICES)",
                fn, device, be->name(), count);
  }
  uint64_t oversubscribe = 0;
  VS_TRY(option_uint(option_id::oversubscribe, &oversubscribe));
  auto st = std::make_unique<device_state>();
  if (oversubscribe == 1) {
    std::unique_ptr<oversubscribed_session> over;
    VS_TRY(add_context(oversubscribed_session::open(device, &over), "%s(device %d): opening the device's oversubscribed session: ",
                       fn, device));
    st->policy = std::move(over);
  } else {
    std::unique_ptr<device_session> shared;
    VS_TRY(add_context(device_session::open(device, &shared), "%s(device %d): opening the device's session: ", fn, device));
    st->policy = std::move(shared);
  }
  st->async = std::make_unique<stream_allocator>(st->policy->get_backend(), device, st->policy->memory(),
                                                 /*advise_at_release=*/!st->policy->mapped_without_lock());
  st->tags = std::make_unique<memory_tags>(st->policy->memory());
  if (g_devices.size() <= static_cast<size_t>(device)) g_devices.resize(device + 1);
  g_devices[device] = std::move(st);
  if (static_cast<size_t>(device) < k_fast_devices) g_fast[device].store(g_devices[device].get(), std::memory_order_release);
  g_owner_pid.store(::getpid());
  static std::once_flag at_fork;
  std::call_once(at_fork, [] { ::pthread_atfork(nullptr, nullptr, mark_forked); });
  // After default_backend() made the backend, so this runs before the backend's destructor.
  static std::once_flag at_exit;
  std::call_once(at_exit, [] { std::atexit(close_all); });
  *out = g_devices[device].get();
  return ok;
}

// An acquire's timeout bounds the whole call, under one deadline (lock/wait_bounds.hpp) that
// every wait of the call asks: the first acquire of a device opens its session, which may
// wait for the pool server (to answer, to start, or, the node's service, to come back); the
// lock's queue gets what is left, at least a moment (a timed wait, never a try); after the
// grant, bringing the memory in may wait for other processes to give back pool frames. A
// try (0) or an unbounded acquire (-1) installs no deadline: a try does not wait in the
// queue, but the session it needs is made once, whatever that takes.
class acquire_timeout {
 public:
  explicit acquire_timeout(int64_t timeout_ns) : timeout_ns_(timeout_ns), start_ns_(monotonic_ns()) {
    if (timeout_ns_ > 0) deadline_.emplace(start_ns_ + static_cast<uint64_t>(timeout_ns_));
  }
  int64_t left_for_the_queue() const {
    if (timeout_ns_ <= 0) return timeout_ns_;
    const int64_t spent = static_cast<int64_t>(monotonic_ns() - start_ns_);
    return std::max<int64_t>(1, timeout_ns_ - spent);
  }

 private:
  int64_t timeout_ns_;
  uint64_t start_ns_;
  std::optional<scoped_wait_deadline> deadline_;  // installed for the object's life
};

uint32_t& held_slot(int device) {
  if (t_held.size() <= static_cast<size_t>(device)) t_held.resize(device + 1, 0);
  return t_held[device];
}

}  // namespace

void reset() noexcept {
  if (forked_child()) return;
  std::lock_guard<std::timed_mutex> guard(g_mutex);
  clear_fast();
  g_devices.clear();
  t_held.clear();
  g_owner_pid.store(0);
}

namespace {

// The key of `device`'s pool and lock segments (its uuid).
int device_key(int device, std::string* key) {
  backend* be = nullptr;
  VS_TRY(default_backend(&be));
  device_info info;
  VS_TRY(be->get_device_info(device, &info));
  *key = info.uuid;
  return ok;
}

}  // namespace

int pool_server_pid(int device, pid_t* out) noexcept {
  try {
    *out = 0;
    std::string key;
    VS_TRY(device_key(device, &key));
    std::string name;
    std::unique_ptr<pool_segment> pool;
    if (pool_segment::name_for(key, &name) == ok && pool_segment::open(name, &pool) == ok) *out = pool->header()->server_pid;
    clear_error();
    return ok;
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "pool_server_pid: out of host memory");
  }
}

int stop_pool_server(int device) noexcept {
  try {
    std::string key;
    VS_TRY(device_key(device, &key));
    pid_t server = 0;
    VS_TRY(pool_server_pid(device, &server));
    if (server > 0 && ::kill(server, SIGTERM) == 0) {
      for (int i = 0; i < 200 && ::kill(server, 0) == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    pool_segment::remove(key);
    shared_segment::remove(key);
    return ok;
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "stop_pool_server: out of host memory");
  }
}

bool forked_child() noexcept {
  // fork() and every libc wrapper that copies the process run the atfork handlers; a child
  // made with a raw clone system call (which runs no handler) is not told apart.
  return g_forked.load(std::memory_order_relaxed) && g_owner_pid.load() != 0;
}

uint32_t held_by_this_thread(int device) noexcept {
  if (forked_child() || device < 0 || static_cast<size_t>(device) >= t_held.size()) return 0;
  return t_held[device];
}

int lock(int device, uint32_t priority, int64_t timeout_ns, bool* holder_died) noexcept {
  try {
    if (holder_died != nullptr) *holder_died = false;
    if (priority != static_cast<uint32_t>(lock_priority::normal) && priority != static_cast<uint32_t>(lock_priority::high)) {
      return fail(err_invalid_argument, "lock(device %d): priority %u is not one of 1 (normal), 2 (high)", device, priority);
    }
    if (timeout_ns < -1) {
      return fail(err_invalid_argument, "lock(device %d): timeout %lld ns; use -1 (wait), 0 (try) or a positive time", device,
                  static_cast<long long>(timeout_ns));
    }
    VS_TRY(check_process("lock", device));
    if (timeout_ns != 0 && device >= 0) {
      for (size_t above = static_cast<size_t>(device) + 1; above < t_held.size(); ++above) {
        if (t_held[above] > 0) {
          return fail(err_invalid_argument,
                      "lock(device %d): this thread holds device %zu; take device locks in increasing device order (%d "
                      "before %zu) so that two processes can never wait for each other. Release device %zu first, or use a "
                      "try-lock (it never waits)",
                      device, above, device, above, above);
        }
      }
    }
    const acquire_timeout timeout(timeout_ns);
    device_state* st = nullptr;
    VS_TRY(state_for("lock", device, &st));
    acquire_info info;
    const int rc = st->policy->acquire(static_cast<lock_priority>(priority), timeout.left_for_the_queue(), &info);
    if (rc != ok) return rc;
    ++held_slot(device);
    if (info.previous_holder_died) {
      st->holder_deaths.fetch_add(1);
      char who[192];
      describe_process_in(info.dead_holder_pid, info.dead_holder_pid_ns, who, sizeof who);
      log(log_level::warn, "device %d: the lock was taken over from %s, which died holding it; the lock was repaired", device, who);
      if (holder_died != nullptr) *holder_died = true;
    }
    return ok;
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "lock(device %d): out of host memory", device);
  }
}

namespace {

// lock_gang's steps; each may throw std::bad_alloc, which lock_gang reports.

// The gang's devices sorted into `devs`, and listed for messages ("0,1,3"); a device
// listed twice is refused.
int sort_gang(const int* devices, size_t count, std::vector<int>* devs, std::string* listed) {
  *devs = std::vector<int>(devices, devices + count);
  std::sort(devs->begin(), devs->end());
  for (size_t i = 0; i < devs->size(); ++i) *listed += (i == 0 ? "" : ",") + std::to_string((*devs)[i]);
  for (size_t i = 1; i < devs->size(); ++i) {
    if ((*devs)[i] == (*devs)[i - 1]) {
      return fail(err_invalid_argument, "lock_gang(devices %s): device %d is listed twice; list each device once", listed->c_str(),
                  (*devs)[i]);
    }
  }
  return ok;
}

// The priority, the timeout, this process, and the device order: a thread that holds a
// device above the gang's lowest (and not every device of the gang) would wait for it
// against the order that keeps two processes from waiting for each other.
int check_gang(const std::vector<int>& devs, const std::string& listed, uint32_t priority, int64_t timeout_ns) {
  if (priority != static_cast<uint32_t>(lock_priority::normal) && priority != static_cast<uint32_t>(lock_priority::high)) {
    return fail(err_invalid_argument, "lock_gang(devices %s): priority %u is not one of 1 (normal), 2 (high)", listed.c_str(),
                priority);
  }
  if (timeout_ns < -1) {
    return fail(err_invalid_argument, "lock_gang(devices %s): timeout %lld ns; use -1 (wait), 0 (try) or a positive time",
                listed.c_str(), static_cast<long long>(timeout_ns));
  }
  VS_TRY(check_process("lock_gang", devs[0]));
  bool holds_all = true;
  for (int d : devs) holds_all = holds_all && d >= 0 && held_by_this_thread(d) > 0;
  if (timeout_ns != 0 && !holds_all && devs[0] >= 0) {
    for (size_t above = static_cast<size_t>(devs[0]) + 1; above < t_held.size(); ++above) {
      if (t_held[above] > 0) {
        return fail(err_invalid_argument,
                    "lock_gang(devices %s): this thread holds device %zu; a gang takes all its devices at its lowest one, "
                    "in increasing device order (%d before %zu), so that two processes can never wait for each other. "
                    "Release device %zu first, or take it in the gang",
                    listed.c_str(), above, devs[0], above, above);
      }
    }
  }
  return ok;
}

// Each device's state and lock; a device whose turns are not its lock's (a rank gang's, an
// oversubscribed one) cannot be in a gang of devices.
int gang_locks(const std::vector<int>& devs, const std::string& listed, std::vector<device_state*>* states,
               std::vector<device_lock*>* locks) {
  for (size_t i = 0; i < devs.size(); ++i) {
    VS_TRY(state_for("lock_gang", devs[i], &(*states)[i]));
    device_state* st = (*states)[i];
    (*locks)[i] = st->policy->gang_lock();
    if ((*locks)[i] == nullptr && st->policy->joined_gang() != nullptr) {
      return fail(err_invalid_argument,
                  "lock_gang(devices %s): device %d is rank %u of gang %s (join_gang): its turns are its gang's, so it cannot "
                  "be in a gang of devices too",
                  listed.c_str(), devs[i], st->policy->joined_gang()->rank(), st->policy->joined_gang()->job().c_str());
    }
    if ((*locks)[i] == nullptr) {
      return fail(err_invalid_argument,
                  "lock_gang(devices %s): device %d is oversubscribed (VRAMSWAP_OVERSUBSCRIBE=1): it runs without the lock, "
                  "so it cannot be part of a gang",
                  listed.c_str(), devs[i]);
    }
  }
  return ok;
}

// Take every lock at once, then bring each device's memory in. One that fails releases its
// own lock; then the whole gang is let go (all or none).
int take_gang(const std::vector<int>& devs, const std::string& listed, lock_priority prio, const acquire_timeout& timeout,
              const std::vector<device_state*>& states, const std::vector<device_lock*>& locks, std::vector<acquire_info>* infos) {
  std::vector<session::acquire_start> starts(devs.size());
  for (size_t i = 0; i < devs.size(); ++i) states[i]->policy->asking(prio, &starts[i]);
  if (const int rc = device_lock::acquire_gang(locks.data(), locks.size(), prio, timeout.left_for_the_queue(), infos->data()); rc != ok) {
    for (size_t i = 0; i < devs.size(); ++i) states[i]->policy->gave_up(starts[i]);
    return add_context(rc, "lock_gang(devices %s): ", listed.c_str());
  }
  for (size_t i = 0; i < devs.size(); ++i) {
    if (const int rc = states[i]->policy->granted(prio, starts[i], (*infos)[i]); rc != ok) {
      const std::string why = last_error();
      for (size_t j = 0; j < i; ++j) states[j]->policy->release();
      for (size_t j = i + 1; j < devs.size(); ++j) {
        states[j]->policy->gave_up(starts[j]);
        if (!(*infos)[j].reentered) locks[j]->release();
      }
      return fail(rc, "lock_gang(devices %s): device %d: %s; the gang's other devices were released too", listed.c_str(),
                  devs[i], why.c_str());
    }
  }
  return ok;
}

}  // namespace

int lock_gang(const int* devices, size_t count, uint32_t priority, int64_t timeout_ns, bool* holder_died) noexcept {
  try {
    if (holder_died != nullptr) *holder_died = false;
    if (devices == nullptr || count == 0) return fail(err_invalid_argument, "lock_gang: no devices; list at least one");
    if (count > device_lock::k_max_gang) {
      return fail(err_invalid_argument, "lock_gang: %zu devices; a gang has at most %zu", count, device_lock::k_max_gang);
    }
    std::vector<int> devs;
    std::string listed;
    VS_TRY(sort_gang(devices, count, &devs, &listed));
    if (count == 1) return lock(devs[0], priority, timeout_ns, holder_died);
    VS_TRY(check_gang(devs, listed, priority, timeout_ns));
    const acquire_timeout timeout(timeout_ns);
    std::vector<device_state*> states(devs.size(), nullptr);
    std::vector<device_lock*> locks(devs.size(), nullptr);
    VS_TRY(gang_locks(devs, listed, &states, &locks));
    std::vector<acquire_info> infos(devs.size());
    VS_TRY(take_gang(devs, listed, static_cast<lock_priority>(priority), timeout, states, locks, &infos));
    for (size_t i = 0; i < devs.size(); ++i) {
      ++held_slot(devs[i]);
      if (infos[i].previous_holder_died) {
        states[i]->holder_deaths.fetch_add(1);
        char who[192];
        describe_process_in(infos[i].dead_holder_pid, infos[i].dead_holder_pid_ns, who, sizeof who);
        log(log_level::warn, "device %d: the lock was taken over from %s, which died holding it; the lock was repaired", devs[i], who);
        if (holder_died != nullptr) *holder_died = true;
      }
    }
    return ok;
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "lock_gang: out of host memory");
  }
}

int join_gang(const char* job, int rank, int world_size, int device) noexcept {
  try {
    VS_TRY(check_process("join_gang", device));
    if (held_by_this_thread(device) > 0) {
      return fail(err_invalid_argument, "join_gang(device %d): this thread holds the device's lock; join or leave a gang between turns",
                  device);
    }
    device_state* st = nullptr;
    VS_TRY(state_for("join_gang", device, &st));
    if (job == nullptr) return st->policy->set_rank_gang(nullptr);
    if (rank < 0 || world_size < 1) {
      return fail(err_invalid_argument, "join_gang(%s, device %d): rank %d of world size %d; ranks count from 0 below the world size",
                  job, device, rank, world_size);
    }
    if (const rank_gang* current = st->policy->joined_gang(); current != nullptr) {
      if (current->job() == job && current->rank() == static_cast<uint32_t>(rank) &&
          current->world_size() == static_cast<uint32_t>(world_size)) {
        return ok;  // joined already
      }
      return fail(err_invalid_argument,
                  "join_gang(%s, rank %d, device %d): this process is rank %u of gang %s on the device already; leave it first "
                  "(join_gang with no job)",
                  job, rank, device, current->rank(), current->job().c_str());
    }
    std::unique_ptr<rank_gang> gang;
    VS_TRY(add_context(rank_gang::open(job, static_cast<uint32_t>(rank), static_cast<uint32_t>(world_size), &gang),
                       "join_gang(device %d): ", device));
    return st->policy->set_rank_gang(std::move(gang));
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "join_gang: out of host memory");
  }
}

int unlock_gang(const int* devices, size_t count) noexcept {
  if (devices == nullptr || count == 0) return fail(err_invalid_argument, "unlock_gang: no devices");
  try {
    std::vector<int> devs(devices, devices + count);
    std::sort(devs.begin(), devs.end());
    // Every device is checked first, so that a wrong list releases nothing.
    for (size_t i = 0; i < devs.size(); ++i) {
      VS_TRY(check_process("unlock_gang", devs[i]));
      if ((i > 0 && devs[i] == devs[i - 1]) || held_by_this_thread(devs[i]) == 0) {
        return fail(err_not_owner, "unlock_gang: this thread does not hold device %d%s; nothing was released", devs[i],
                    i > 0 && devs[i] == devs[i - 1] ? " twice (listed twice)" : "");
      }
    }
    int first = ok;
    std::string why;
    for (size_t i = devs.size(); i-- > 0;) {
      if (const int rc = unlock(devs[i]); rc != ok && first == ok) {
        first = rc;
        why = last_error();
      }
    }
    if (first != ok) return fail(first, "%s", why.c_str());
    return ok;
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "unlock_gang: out of host memory");
  }
}

int unlock(int device) noexcept {
  VS_TRY(check_process("unlock", device));
  if (held_by_this_thread(device) == 0) {
    return fail(err_not_owner, "unlock(device %d): this thread does not hold the device's lock (unlock without lock, one "
                "unlock too many, or a lock taken by another thread)", device);
  }
  device_state* st = nullptr;
  VS_TRY(state_for("unlock", device, &st));
  if (t_held[device] == 1 && st->async->advise_cached() != ok) {
    // Only the eviction's cost is at stake: cached blocks not advised are copied like live ones.
    log(log_level::warn, "unlock(device %d): %s; an eviction may copy freed blocks", device, last_error());
    clear_error();
  }
  const int rc = st->policy->release();
  // A failed last release (the device could not be synchronized) still hands the lock on.
  if (!st->policy->holding()) {
    t_held[device] = 0;
  } else if (rc == ok) {
    --t_held[device];
  }
  return rc;
}

int malloc(int device, size_t size, uintptr_t* out) noexcept {
  if (t_tag[0] != '\0') return malloc_tagged(device, size, t_tag, out);
  device_state* st = nullptr;
  VS_TRY(state_for("malloc", device, &st));
  if (size == 0) return fail(err_invalid_argument, "malloc(device %d): size 0", device);
  device_ptr p = 0;
  VS_TRY(add_context(st->policy->memory().malloc(size, &p), "malloc(%zu bytes, device %d): ", size, device));
  *out = p;
  return ok;
}

int free(int device, uintptr_t ptr) noexcept {
  if (ptr == 0 || (g_closed.load() && in_closed_arena(device, ptr))) return ok;  // after exit's teardown: gone with its session
  device_state* st = nullptr;
  VS_TRY(state_for("free", device, &st));
  if (st->async->owns(ptr)) {
    return fail(err_invalid_argument,
                "free(0x%zx, device %d): this block came from malloc_async; give it back with free_async (stream-ordered); "
                "nothing was freed",
                static_cast<size_t>(ptr), device);
  }
  if (st->tags->owns(ptr)) return add_context(st->tags->free(ptr), "free(0x%zx, device %d): ", static_cast<size_t>(ptr), device);
  return add_context(st->policy->memory().free(ptr), "free(0x%zx, device %d): ", static_cast<size_t>(ptr), device);
}

namespace {
int tagged_allocation(int device, size_t size, const char* tag, backing when_not_resident, uintptr_t* out) {
  if (tag == nullptr) return fail(err_invalid_argument, "malloc_tagged(device %d): tag is NULL", device);
  try {
    device_state* st = nullptr;
    VS_TRY(state_for("malloc_tagged", device, &st));
    device_ptr p = 0;
    VS_TRY(add_context(st->tags->malloc(tag, size, when_not_resident, &p), "malloc(%zu bytes, tag '%s', device %d): ", size, tag, device));
    *out = p;
    return ok;
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "malloc(%zu bytes, device %d): out of host memory", size, device);
  }
}
}  // namespace

int malloc_tagged(int device, size_t size, const char* tag, uintptr_t* out) noexcept {
  return tagged_allocation(device, size, tag, backing::when_free, out);
}

int set_thread_tag(const char* tag) noexcept {
  if (tag == nullptr || tag[0] == '\0') {
    t_tag[0] = '\0';
    return ok;
  }
  if (std::strlen(tag) > memory_tags::k_max_name) {
    return fail(err_invalid_argument, "memory tag '%.*s...': a tag is 1 to %zu characters", 16, tag, memory_tags::k_max_name);
  }
  VS_TRY(memory_tags::check_name(tag));
  std::snprintf(t_tag, sizeof t_tag, "%s", tag);
  return ok;
}

const char* thread_tag() noexcept { return t_tag; }

namespace {
int sleeping_session(const char* fn, int device, device_state** out) {
  VS_TRY(state_for(fn, device, out));
  if ((*out)->policy->oversubscribed()) {
    return fail(err_invalid_argument, "%s(device %d): this process is oversubscribed (VRAMSWAP_OVERSUBSCRIBE=1); sleep and wake are for "
                "time-sharing processes (docs/sleep.md)", fn, device);
  }
  return ok;
}
}  // namespace

int sleep(int device, const char* const* tags, const uint8_t* modes, size_t count) noexcept {
  if (count > 0 && (tags == nullptr || modes == nullptr)) return fail(err_invalid_argument, "sleep(device %d): tags or modes is NULL", device);
  try {
    device_state* st = nullptr;
    VS_TRY(sleeping_session("sleep", device, &st));
    std::vector<tag_sleep> asked;
    for (size_t i = 0; i < count; ++i) {
      if (tags[i] == nullptr) return fail(err_invalid_argument, "sleep(device %d): tag %zu is NULL", device, i);
      asked.push_back({tags[i], static_cast<sleep_mode>(modes[i])});
    }
    return add_context(st->tags->sleep(asked), "device %d: ", device);
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "sleep(device %d): out of host memory; nothing was put to sleep", device);
  }
}

int wake(int device, const char* const* tags, size_t count) noexcept {
  if (count > 0 && tags == nullptr) return fail(err_invalid_argument, "wake(device %d): tags is NULL", device);
  try {
    device_state* st = nullptr;
    VS_TRY(sleeping_session("wake", device, &st));
    std::vector<std::string> asked;
    for (size_t i = 0; i < count; ++i) {
      if (tags[i] == nullptr) return fail(err_invalid_argument, "wake(device %d): tag %zu is NULL", device, i);
      asked.emplace_back(tags[i]);
    }
    return add_context(st->tags->wake(asked), "device %d: ", device);
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "wake(device %d): out of host memory; nothing was woken", device);
  }
}

int keep_resident(int device) noexcept {
  if (held_by_this_thread(device) > 0) {
    return fail(err_invalid_argument, "keep_resident(device %d): this thread holds the device's lock; a process either takes turns "
                "under the lock or keeps its memory resident and sleeps it, not both", device);
  }
  try {
    device_state* st = nullptr;
    VS_TRY(state_for("keep_resident", device, &st));
    return st->policy->keep_resident();
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "keep_resident(device %d): out of host memory", device);
  }
}

int tags(int device, vramswap_tag_info_t* out, size_t capacity, size_t* count) noexcept {
  if (count == nullptr || (capacity > 0 && out == nullptr)) return fail(err_invalid_argument, "tags(device %d): out or count is NULL", device);
  try {
    device_state* st = nullptr;
    VS_TRY(state_for("tags", device, &st));
    const std::vector<tag_report> all = st->tags->report();
    for (size_t i = 0; i < all.size() && i < capacity; ++i) {
      vramswap_tag_info_t& t = out[i];
      std::memset(&t, 0, sizeof t);
      std::snprintf(t.name, sizeof t.name, "%s", all[i].name.c_str());
      t.allocated_bytes = all[i].allocated_bytes;
      t.allocations = all[i].allocations;
      t.reserved_bytes = all[i].reserved_bytes;
      t.asleep = all[i].asleep ? 1 : 0;
      t.sleep_mode = static_cast<int>(all[i].mode);
    }
    *count = all.size();
    return ok;
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "tags(device %d): out of host memory", device);
  }
}

int reserve_addresses(int device, size_t size, size_t alignment, uintptr_t* out) noexcept {
  device_state* st = nullptr;
  VS_TRY(state_for("reserve_addresses", device, &st));
  device_ptr p = 0;
  VS_TRY(add_context(st->policy->memory().reserve(size, alignment, &p), "reserving %zu bytes of addresses (device %d): ", size, device));
  *out = p;
  return ok;
}

int free_addresses(int device, uintptr_t ptr) noexcept {
  if (g_closed.load() && in_closed_arena(device, ptr)) return ok;
  device_state* st = nullptr;
  VS_TRY(state_for("free_addresses", device, &st));
  return add_context(st->policy->memory().unreserve(ptr), "freeing the addresses at 0x%zx (device %d): ", static_cast<size_t>(ptr), device);
}

int map_at(int device, uintptr_t ptr, size_t size) noexcept {
  device_state* st = nullptr;
  VS_TRY(state_for("map_at", device, &st));
  return add_context(st->policy->memory().malloc_at(ptr, size), "memory for [0x%zx, +%zu) (device %d): ", static_cast<size_t>(ptr), size,
                     device);
}

int note_outside_pool(int device, int64_t delta_bytes) noexcept {
  device_state* st = nullptr;
  VS_TRY(state_for("note_outside_pool", device, &st));
  st->policy->note_outside_pool(delta_bytes);
  return ok;
}

int malloc_async(int device, size_t size, uintptr_t stream, uintptr_t* out) noexcept {
  // Its callers write the memory at once: backed now, or out of memory.
  if (t_tag[0] != '\0') return tagged_allocation(device, size, t_tag, backing::required, out);
  try {
    device_state* st = nullptr;
    VS_TRY(state_for("malloc_async", device, &st));
    device_ptr p = 0;
    VS_TRY(st->async->allocate(size, stream, &p));
    *out = p;
    return ok;
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "malloc_async(%zu bytes, device %d): out of host memory", size, device);
  }
}

int free_async(int device, uintptr_t ptr, uintptr_t stream) noexcept {
  if (ptr == 0 || (g_closed.load() && in_closed_arena(device, ptr))) return ok;  // after exit's teardown: gone with its session
  try {
    device_state* st = nullptr;
    VS_TRY(state_for("free_async", device, &st));
    if (st->tags->owns(ptr)) {
      // Tagged memory is not the stream allocator's: work queued on `stream` may still use
      // it, and its pages may leave with it.
      VS_TRY(add_context(st->policy->get_backend().device_synchronize(device), "free_async(0x%zx, device %d): ", static_cast<size_t>(ptr),
                         device));
      return add_context(st->tags->free(ptr), "free_async(0x%zx, device %d): ", static_cast<size_t>(ptr), device);
    }
    return st->async->deallocate(ptr, stream);
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "free_async(0x%zx, device %d): out of host memory", static_cast<size_t>(ptr), device);
  }
}

int resident(int device, bool* out) noexcept {
  device_state* st = nullptr;
  VS_TRY(state_for("resident", device, &st));
  *out = st->policy->resident();
  return ok;
}

int memory_info(int device, uint64_t* free_bytes, uint64_t* total_bytes) noexcept {
  device_state* st = nullptr;
  VS_TRY(state_for("memory_info", device, &st));
  st->policy->memory_info(free_bytes, total_bytes);
  return ok;
}

bool release_requested(int device) noexcept {
  if (forked_child() || device < 0) return false;
  session* policy = nullptr;
  {
    std::lock_guard<std::timed_mutex> guard(g_mutex);
    if (static_cast<size_t>(device) >= g_devices.size() || !g_devices[device]) return false;
    policy = g_devices[device]->policy.get();  // never closed before exit
  }
  return policy->check_hold().release_requested;
}

bool owns(int device, uintptr_t ptr) noexcept {
  if (forked_child() || device < 0) return false;
  if (g_closed.load()) return in_closed_arena(device, ptr);
  std::lock_guard<std::timed_mutex> guard(g_mutex);
  if (static_cast<size_t>(device) >= g_devices.size() || !g_devices[device]) return false;
  pager& p = g_devices[device]->policy->memory();
  return ptr >= p.arena_base() && ptr < p.arena_base() + p.arena_size();
}

int oversubscribed(int device, bool* out) noexcept {
  device_state* st = nullptr;
  VS_TRY(state_for("oversubscribed", device, &st));
  *out = st->policy->oversubscribed();
  return ok;
}

int release_cached(int device) noexcept {
  device_state* st = nullptr;
  VS_TRY(state_for("release_cached", device, &st));
  return st->async->trim();
}

int advise(int device, uintptr_t ptr, size_t size, uint8_t a) noexcept {
  if (a > static_cast<uint8_t>(advice::read_mostly)) {
    return fail(err_invalid_argument, "advise(device %d): advice %u is not one of 0 (normal), 1 (discardable), 2 (read_mostly)",
                device, a);
  }
  device_state* st = nullptr;
  VS_TRY(state_for("advise", device, &st));
  return add_context(st->policy->memory().advise(ptr, size, static_cast<advice>(a)), "advise(0x%zx, %zu bytes, device %d): ",
                     static_cast<size_t>(ptr), size, device);
}

int stats(int device, vramswap_stats_t* out) noexcept {
  device_state* st = nullptr;
  VS_TRY(state_for("stats", device, &st));
  try {
    vramswap_stats_t r;
    std::memset(&r, 0, sizeof r);
    r.size = sizeof r;
    const stream_allocator_stats a = st->async->stats();
    r.cached_bytes = a.cached_bytes;
    r.graph_bytes = a.graph_bytes;
    r.cache_hits = a.hits;
    r.cache_misses = a.misses;
    r.cache_trims = a.trims;
    r.allocator_seconds = static_cast<double>(a.busy_ns) / 1e9;
    r.cache_miss_bytes = a.new_bytes;
    st->policy->fill_stats(&r);
    r.lock_holder_deaths = st->holder_deaths.load();
    r.asleep_bytes = st->tags->asleep_bytes();
    *out = r;
    return ok;
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "stats(device %d): out of host memory", device);
  }
}

namespace {
// One copy through pinned staging on a stream of its own; tests only, so simple over fast.
int copy(const char* fn, int device, uintptr_t dev, void* host, size_t size, bool to_device) {
  device_state* st = nullptr;
  VS_TRY(state_for(fn, device, &st));
  if (!st->policy->mapped_without_lock() && !st->policy->keeps_resident() && held_by_this_thread(device) == 0) {
    return fail(err_not_owner, "%s(device %d): take the device's lock first (or keep_resident): memory is resident only while it is "
                "held", fn, device);
  }
  if (size == 0) return ok;
  backend& be = st->policy->get_backend();
  void* staging = nullptr;
  VS_TRY(be.host_alloc(size, &staging));
  stream_id s = 0;
  int rc = be.stream_create(device, &s);
  if (rc == ok) {
    if (to_device) std::memcpy(staging, host, size);
    rc = to_device ? be.copy_h2d(dev, staging, size, s) : be.copy_d2h(staging, dev, size, s);
    if (rc == ok) rc = be.stream_synchronize(s);
    if (rc == ok && !to_device) std::memcpy(host, staging, size);
    const std::string why = rc != ok ? last_error() : "";
    be.stream_destroy(s);
    if (rc != ok) fail(rc, "%s(0x%zx, %zu bytes, device %d): %s", fn, static_cast<size_t>(dev), size, device, why.c_str());
  }
  be.host_free(staging);
  return rc;
}
}  // namespace

int copy_to_device(int device, uintptr_t dst, const void* src, size_t size) noexcept {
  try {
    return copy("copy_to_device", device, dst, const_cast<void*>(src), size, true);
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "copy_to_device: out of host memory");
  }
}

int copy_from_device(int device, void* dst, uintptr_t src, size_t size) noexcept {
  try {
    return copy("copy_from_device", device, src, dst, size, false);
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "copy_from_device: out of host memory");
  }
}

}  // namespace vramswap::detail::rt

#include "runtime/device_session.hpp"

#include <algorithm>
#include <chrono>
#include <cinttypes>

#include "core/log.hpp"
#include "core/options.hpp"
#include "core/status.hpp"
#include "runtime/fault_report.hpp"
#include "lock/futex.hpp"
#include "lock/process_identity.hpp"
#include "swap/store_chain.hpp"

namespace vramswap::detail {

namespace {
constexpr uint64_t k_service_poll_ns = 50'000'000;  // the eviction thread also wakes this often
constexpr uint64_t k_evict_retry_ns = 1'000'000'000;  // a failed eviction is tried again after this

double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

int flag_option(option_id id, bool* out) {
  uint64_t v = 0;
  VS_TRY(option_uint(id, &v, 0, 1));
  *out = v == 1;
  return ok;
}
}  // namespace

int device_session::open(int device, std::unique_ptr<device_session>* out) {
  std::unique_ptr<device_session> s(new device_session());
  VS_TRY(default_backend(&s->be_));
  s->device_ = device;
  VS_TRY(flag_option(option_id::eager_release, &s->eager_release_));
  VS_TRY(flag_option(option_id::strict, &s->strict_));
  uint64_t evict_timeout_s = 0;
  VS_TRY(option_uint(option_id::evict_timeout, &evict_timeout_s, 1, 86400));

  VS_TRY(pool_connection::connect(*s->be_, device, /*autostart=*/true, &s->conn_));
  device_info info;
  VS_TRY(s->be_->get_device_info(device, &info));
  VS_TRY(add_context(device_lock::open(info.uuid, &s->lock_), "device %d: opening its lock: ", device));

  pool_connection& conn = *s->conn_;
  s->frames_ = std::make_unique<pool_frame_source>(conn.segment(), conn.member(), conn.frames(), evict_timeout_s * 1'000'000'000ull,
                                                   [c = s->conn_.get()] { return c->server_alive(); });
  VS_TRY(make_page_store(*s->be_, device, conn, evict_timeout_s * 1'000'000'000ull, &s->store_));
  pager_config cfg;
  cfg.frame_size = conn.frame_size();
  cfg.start_resident = false;  // backed at acquire, from the pool
  VS_TRY(pager::create(*s->be_, device, *s->store_, *s->frames_, cfg, &s->pager_));
  s->observe_ = std::make_unique<member_observer>(conn.segment(), conn.member());  // observability
  // Host backend: a CPU access to a page of ours that is not in a frame is a SIGSEGV; say
  // what it was before the process dies (runtime/fault_report.hpp).
  if (s->be_->kind() == backend_kind::host) fault_watch(device, *s->pager_);
  log_set_device(device);
  s->server_ = std::thread([p = s.get()] {
    log_set_device(p->device_);
    p->serve_evictions();
  });
  *out = std::move(s);
  return ok;
}

device_session::~device_session() {
  if (lock_.held()) {
    depth_ = 1;
    release();
  }
  stop_.store(true);
  if (conn_) futex_wake_one(&conn_->segment().member(conn_->member()).requests);
  if (server_.joinable()) server_.join();
  if (pager_) fault_unwatch(*pager_);
  pager_.reset();  // unmaps every page, zeroes and frees its frames in the pool
  store_.reset();  // gives back any host slot still held (shared host pool)
  frames_.reset();
  conn_.reset();  // releases the imported frames and unpins the host pool; the server sees us leave
}

int device_session::acquire(lock_priority priority, int64_t timeout_ns, acquire_info* info) {
  const auto t0 = std::chrono::steady_clock::now();
  acquire_info local;
  if (info == nullptr) info = &local;
  // Observability: an "asked" event unless this thread already holds the lock (re-entry).
  const bool first = !lock_.held();
  const uint64_t asked_ns = monotonic_ns();
  if (first) observe_->asked(priority, asked_ns);
  if (const int lrc = lock_.acquire(priority, timeout_ns, info); lrc != ok) {
    if (first) observe_->gave_up();
    return lrc;
  }
  if (info->reentered) {
    ++depth_;
    return ok;
  }
  const auto t1 = std::chrono::steady_clock::now();
  const uint64_t granted_ns = monotonic_ns();
  std::lock_guard<std::mutex> guard(mutex_);
  pool_layout::member_slot& me = conn_->segment().member(conn_->member());
  me.holding.store(1);
  observe_->granted(priority, asked_ns, granted_ns);
  const uint64_t bytes_in_before = pager_->stats().bytes_in;
  frames_->reclaim_own();
  const int rc = pager_->restore_all();
  if (rc != ok) {
    const std::string why = last_error();
    pager_->set_not_resident();
    frames_->release_own();
    observe_->restore_failed();
    me.holding.store(0);
    lock_.release();
    return fail(rc, "acquire(device %d): bringing this process's memory in failed, the lock was released again: %s", device_,
                why.c_str());
  }
  // A thread of ours that allocated while restore_all() had not yet made us resident took
  // free frames as idle (pool_frame_source::try_take_not_resident), after the reclaim
  // above: make them active too, so that no one asks for them while we hold the lock. (No
  // one could have meanwhile: only the holder asks, and that is us.)
  frames_->reclaim_own();
  depth_ = 1;
  ++stats_.acquires;
  stats_.last_lock_granted_ns = granted_ns;
  stats_.last_resident_ns = monotonic_ns();
  observe_->resident(granted_ns, stats_.last_resident_ns, pager_->stats().bytes_in - bytes_in_before);
  publish_store();
  const auto t2 = std::chrono::steady_clock::now();
  stats_.lock_wait_seconds += seconds_between(t0, t1);
  stats_.acquire_seconds += seconds_between(t0, t2);
  return ok;
}

int device_session::release() {
  if (!lock_.held()) {
    return fail(err_not_owner, "release(device %d): this thread does not hold the device lock (release without acquire, or one "
                "release too many)", device_);
  }
  if (depth_ > 1) {
    --depth_;
    return lock_.release();
  }
  const uint64_t called_ns = monotonic_ns();
  std::lock_guard<std::mutex> guard(mutex_);
  if (eager_release_ || strict_) {
    // Evict everything before anyone else may have the device (evict_all synchronizes first).
    const uint64_t evict_start_ns = monotonic_ns();
    const uint64_t bytes_out_before = pager_->stats().bytes_out;
    const int rc = pager_->evict_all();
    const std::string why = rc != ok ? last_error() : "";
    hand_on(called_ns, evict_start_ns, bytes_out_before);
    const int unlock = lock_.release();
    if (rc != ok) return fail(rc, "release(device %d): evicting: %s (the lock was released; memory not evicted stays where it was)", device_, why.c_str());
    return unlock;
  }
  // The default: nothing moves. Hand the lock on first, then wait for our device work, so
  // that the next holder does not wait for a device round trip (a synchronize of an idle
  // device costs ~45 us on the H200 machine, more than the rest of a handoff). Our memory is
  // safe meanwhile: frames change hands only through our own eviction, which synchronizes
  // first. The caller still gets back from release() only once its work is done.
  lock_.announce_release();  // the next waiter's wake-up overlaps what follows
  pager_->set_not_resident();
  hand_on(called_ns, monotonic_ns(), pager_->stats().bytes_out);
  const int unlock = lock_.release();
  const int sync = be_->device_synchronize(device_);
  stats_.last_synced_ns = monotonic_ns();
  if (sync != ok) {
    return fail(sync, "release(device %d): the lock was handed on, but this process's device work failed: %s", device_,
                last_error());
  }
  return unlock;
}

// Mark our frames idle (others may ask for them) and publish the release; the lock itself
// is released by the caller right after.
void device_session::hand_on(uint64_t called_ns, uint64_t evict_start_ns, uint64_t bytes_out_before) {
  frames_->release_own();
  conn_->segment().member(conn_->member()).holding.store(0);
  depth_ = 0;
  stats_.last_release_call_ns = called_ns;
  stats_.last_unlock_ns = monotonic_ns();
  stats_.last_synced_ns = 0;
  observe_->released(evict_start_ns, stats_.last_unlock_ns, pager_->stats().bytes_out - bytes_out_before);
  publish_store();
}

void device_session::serve_evictions() {
  pool_layout::member_slot& me = conn_->segment().member(conn_->member());
  // After an eviction fails (a full swap disk, a failing device), the same requests are
  // tried again only after k_evict_retry_ns, or at once on a new request; the failure is
  // logged once and published for the lock holder waiting on it until an eviction succeeds.
  bool failing = false;
  uint64_t retry_at_ns = 0;
  uint32_t failed_at_requests = 0;
  while (!stop_.load()) {
    const uint32_t seen = me.requests.load(std::memory_order_acquire);
    {
      std::lock_guard<std::mutex> guard(mutex_);
      const std::vector<frame_id> wanted = frames_->requested_of_me();
      if (!wanted.empty() && (!failing || seen != failed_at_requests || monotonic_ns() >= retry_at_ns)) {
        const pager_stats before = pager_->stats();
        const uint64_t start_ns = monotonic_ns();
        const int rc = pager_->evict_frames(wanted);
        const pager_stats after = pager_->stats();
        const uint64_t end_ns = monotonic_ns();
        stats_.evictions_served += after.pages_evicted - before.pages_evicted;
        observe_->evicted(start_ns, end_ns, after.bytes_out - before.bytes_out, after.pages_evicted - before.pages_evicted);
        publish_store();
        if (rc != ok) {
          observe_->evict_failed(rc, last_error(), end_ns);
          log(failing ? log_level::debug : log_level::error,
              "device %d: evicting %zu frame(s) another process asked for: %s%s", device_, wanted.size(), last_error(),
              failing ? "" : "; the pages stay resident here, the process that asked waits until its VRAMSWAP_EVICT_TIMEOUT "
                             "(tried again every second, and at each new request)");
          retry_at_ns = end_ns + k_evict_retry_ns;
          failed_at_requests = seen;
        } else if (failing) {
          observe_->evict_succeeded();
          log(log_level::info, "device %d: evicting for other processes works again", device_);
        }
        failing = rc != ok;
      }
    }
    if (stop_.load()) break;
    futex_wait(&me.requests, seen, k_service_poll_ns);
  }
}

void device_session::publish_store() noexcept {
  const uint64_t held = store_->bytes_held();
  const uint64_t disk = held - std::min(held, store_->bytes_in_tier(0));
  observe_->stored(held - std::min(held, disk), disk);
}

session_stats device_session::stats() const {
  std::lock_guard<std::mutex> guard(mutex_);
  session_stats s = stats_;
  s.pager = pager_->stats();
  s.disk_bytes = store_->bytes_held() - std::min(store_->bytes_held(), store_->bytes_in_tier(0));
  return s;
}

}  // namespace vramswap::detail

#include "runtime/device_session.hpp"

#include <algorithm>
#include <chrono>
#include <cinttypes>

#include "core/log.hpp"
#include "core/options.hpp"
#include "core/status.hpp"
#include "runtime/fault_report.hpp"
#include "lock/process_identity.hpp"
#include "lock/turn_histograms.hpp"
#include "swap/store_chain.hpp"

namespace vramswap::detail {

namespace {
constexpr uint64_t k_evict_retry_ns = 1'000'000'000;  // a failed eviction is tried again after this

int flag_option(option_id id, bool* out) {
  uint64_t v = 0;
  VS_TRY(option_uint(id, &v));
  *out = v == 1;
  return ok;
}
}  // namespace

int device_session::open(int device, std::unique_ptr<device_session>* out) {
  std::unique_ptr<device_session> s(new device_session());
  VS_TRY(flag_option(option_id::eager_release, &s->eager_release_));
  VS_TRY(flag_option(option_id::strict, &s->strict_));
  VS_TRY(flag_option(option_id::evict_ahead, &s->evict_ahead_));
  uint64_t evict_timeout_s = 0;
  VS_TRY(option_uint(option_id::evict_timeout, &evict_timeout_s));
  s->evict_timeout_ns_ = evict_timeout_s * 1'000'000'000ull;
  VS_TRY(s->session::open(device));
  *out = std::move(s);
  return ok;
}

int device_session::build(pool_member& member, frame_source** frames, page_store** store, pager_config* cfg) {
  pool_connection& conn = member.connection();
  device_info info;
  VS_TRY(be_->get_device_info(device_, &info));
  VS_TRY(add_context(device_lock::open(info.uuid, &lock_), "device %d: opening its lock: ", device_));
  frames_ = std::make_unique<pool_frame_source>(conn.segment(), conn.member(), conn.frames(), evict_timeout_ns_,
                                                [c = &conn] { return c->pool_alive(); });
  VS_TRY(make_page_store(*be_, device_, conn, evict_timeout_ns_, &store_));
  cfg->start_resident = false;  // backed at acquire, from the pool
  *frames = frames_.get();
  *store = store_.get();
  return ok;
}

void device_session::opened() {
  // Host backend: a CPU access to a page of ours that is not in a frame is a SIGSEGV; say
  // what it was before the process dies (runtime/fault_report.hpp).
  if (be_->kind() == backend_kind::host) fault_watch(device_, memory());
}

device_session::~device_session() {
  close();  // releases a held lock, stops the service thread, destroys the pager
  store_.reset();  // gives back any host slot still held (shared host pool)
  frames_.reset();
}

void device_session::leaving() noexcept {
  if (lock_.held()) {
    depth_ = 1;
    release();
  }
}

// Our idle frames active again, every page brought in, under mutex_. On failure the pager is
// not resident and our frames are idle again, every page's bytes where they were.
int device_session::bring_memory_in() {
  frames_->reclaim_own();
  if (const int rc = memory().restore_all(); rc != ok) {
    const std::string why = last_error();
    memory().set_not_resident();
    frames_->release_own();
    return fail(rc, "%s", why.c_str());
  }
  // A thread of ours that allocated while restore_all() had not yet made us resident took
  // free frames as idle (pool_frame_source::try_take_not_resident), after the reclaim
  // above: make them active too, so that no one asks for them. (No one could have
  // meanwhile: only a holder asks, and a process that keeps its memory resident takes
  // no turns.)
  frames_->reclaim_own();
  return ok;
}

int device_session::keep_resident() {
  std::lock_guard<std::mutex> guard(mutex_);
  if (kept_resident_.load(std::memory_order_relaxed)) return ok;
  if (lock_.held() || rank_ != nullptr) {
    return fail(err_invalid_argument, "keep_resident(device %d): this process %s; a process either takes turns under the lock or keeps "
                "its memory resident and sleeps it, not both", device_, rank_ != nullptr ? "is a rank of a gang" : "holds the device's lock");
  }
  if (const int rc = bring_memory_in(); rc != ok) {
    return add_context(rc, "keep_resident(device %d): bringing this process's memory in failed (it stays as it was): ", device_);
  }
  kept_resident_.store(true, std::memory_order_release);
  log(log_level::info, "device %d: this process keeps its memory resident from now on (it sleeps and wakes it; no turns under the lock)",
      device_);
  return ok;
}

int device_session::acquire(lock_priority priority, int64_t timeout_ns, acquire_info* info) {
  if (kept_resident_.load(std::memory_order_acquire)) {
    return fail(err_invalid_argument, "acquire(device %d): this process keeps its memory resident (keep_resident: it shares the device "
                "by sleep and wake), so it takes no turns under the lock", device_);
  }
  acquire_info local;
  if (info == nullptr) info = &local;
  acquire_start start;
  asking(priority, &start);
  const int lrc = rank_ != nullptr ? rank_->acquire(lock_, priority, timeout_ns, info) : lock_.acquire(priority, timeout_ns, info);
  if (lrc != ok) {
    gave_up(start);
    return lrc;
  }
  return granted(priority, start, *info);
}

int device_session::set_rank_gang(std::unique_ptr<rank_gang> gang) {
  if (lock_.held()) {
    return fail(err_invalid_argument, "join_gang(device %d): this thread holds the device's lock; join or leave a gang between turns",
                device_);
  }
  rank_ = std::move(gang);
  return ok;
}

void device_session::asking(lock_priority priority, acquire_start* out) noexcept {
  out->t0_ns = monotonic_ns();
  // Observability: an "asked" event unless this thread already holds the lock (re-entry).
  out->first = !lock_.held();
  out->asked_ns = out->t0_ns;
  if (!out->first) return;
  member().observe().asked(priority, out->asked_ns);
  // Queued from now on (unless the lock is free): the frames our memory needs are best
  // freed while the holder computes, so the service thread asks ahead at once, not at its
  // next poll (ask_ahead decides whether we are first in line and need any). Not the
  // pager's stats here: its mutex may be held by an eviction for others, and our place in
  // the queue must not wait for that.
  if (evict_ahead_) member().wake_service();
}

void device_session::gave_up(const acquire_start& start) noexcept {
  if (start.first) member().observe().gave_up();
}

int device_session::granted(lock_priority priority, const acquire_start& start, const acquire_info& info) {
  if (info.reentered) {
    ++depth_;
    return ok;
  }
  const uint64_t asked_ns = start.asked_ns;
  const uint64_t granted_ns = monotonic_ns();
  std::lock_guard<std::mutex> guard(mutex_);
  member().set_holding(true);
  member().observe().granted(priority, asked_ns, granted_ns);
  const uint64_t bytes_in_before = memory().stats().bytes_in;
  const int rc = bring_memory_in();
  if (rc != ok) {
    const std::string why = last_error();
    member().observe().restore_failed();
    member().set_holding(false);
    lock_.release();
    return fail(rc, "acquire(device %d): bringing this process's memory in failed, the lock was released again: %s", device_,
                why.c_str());
  }
  depth_ = 1;
  ++stats_.acquires;
  stats_.last_lock_granted_ns = granted_ns;
  stats_.last_resident_ns = monotonic_ns();
  member().observe().resident(granted_ns, stats_.last_resident_ns, memory().stats().bytes_in - bytes_in_before);
  member().observe().asked_frames(frames_->frames_asked_ahead(), frames_->frames_asked_at_acquire());
  lock_.turns()->switching.observe(stats_.last_resident_ns - granted_ns);  // the device's switch times, for the metrics
  publish_store();
  stats_.lock_wait_seconds += static_cast<double>(granted_ns - start.t0_ns) / 1e9;
  stats_.acquire_seconds += static_cast<double>(monotonic_ns() - start.t0_ns) / 1e9;
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
    const uint64_t bytes_out_before = memory().stats().bytes_out;
    const int rc = memory().evict_all();
    const std::string why = rc != ok ? last_error() : "";
    hand_on(called_ns, evict_start_ns, bytes_out_before);
    const int unlock = lock_.release();
    if (rc != ok) return fail(rc, "release(device %d): evicting: %s (the lock was released; memory not evicted stays where it was)", device_, why.c_str());
    return unlock;
  }
  // The default: nothing moves. Hand the lock on first, then wait for our device work, so
  // that the next holder does not wait for a device round trip (a synchronize, even of an
  // idle device, costs more than the rest of a handoff: bench/results/handoff.md). Our memory is
  // safe meanwhile: frames change hands only through our own eviction, which synchronizes
  // first. The caller still gets back from release() only once its work is done.
  lock_.announce_release();  // the next waiter's wake-up overlaps what follows
  memory().set_not_resident();
  hand_on(called_ns, monotonic_ns(), memory().stats().bytes_out);
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
  member().set_holding(false);
  depth_ = 0;
  stats_.last_release_call_ns = called_ns;
  stats_.last_unlock_ns = monotonic_ns();
  stats_.last_synced_ns = 0;
  member().observe().released(evict_start_ns, stats_.last_unlock_ns, memory().stats().bytes_out - bytes_out_before);
  publish_store();
}

// One wake of the service thread: evict the frames other processes asked for. After an
// eviction fails (a full swap disk, a failing device), the same requests are tried again
// only after k_evict_retry_ns, or at once on a new request; the failure is logged once and
// published for the lock holder waiting on it until an eviction succeeds.
void device_session::serve(uint32_t seen) {
  lock_.check_hold();  // a safe point for fair turns; needs none of our state
  std::lock_guard<std::mutex> guard(mutex_);
  const std::vector<frame_id> wanted = frames_->frames().requested_of_me();
  if (wanted.empty() || (evict_failing_ && seen == evict_failed_at_requests_ && monotonic_ns() < evict_retry_at_ns_)) {
    ask_ahead();
    return;
  }
  const pager_stats before = memory().stats();
  const uint64_t start_ns = monotonic_ns();
  const int rc = memory().evict_frames(wanted);
  const pager_stats after = memory().stats();
  const uint64_t end_ns = monotonic_ns();
  stats_.evictions_served += after.pages_evicted - before.pages_evicted;
  member().observe().evicted(start_ns, end_ns, after.bytes_out - before.bytes_out, after.pages_evicted - before.pages_evicted);
  publish_store();
  if (rc != ok) {
    member().observe().evict_failed(rc, last_error(), end_ns);
    log(evict_failing_ ? log_level::debug : log_level::error,
        "device %d: evicting %zu frame(s) another process asked for: %s%s", device_, wanted.size(), last_error(),
        evict_failing_ ? "" : "; the pages stay resident here, the process that asked waits until its VRAMSWAP_EVICT_TIMEOUT "
                              "(tried again every second, and at each new request)");
    evict_retry_at_ns_ = end_ns + k_evict_retry_ns;
    evict_failed_at_requests_ = seen;
  } else if (evict_failing_) {
    member().observe().evict_succeeded();
    log(log_level::info, "device %d: evicting for other processes works again", device_);
  }
  evict_failing_ = rc != ok;
}

// Between turns: if we are the process predicted to acquire next and the pool lacks free
// frames for our memory, ask the owners predicted to come after us to evict that much now
// (pool_frame_source::ask_ahead decides; docs/pool_server.md, Eviction ahead of need). Only
// compare-and-swaps of the frame table: it never waits and holds the mutex for microseconds.
// While we wait for the lock too: the holder's memory is in, and the frames we will need are
// better freed while it computes than after it hands on.
void device_session::ask_ahead() noexcept {
  if (!evict_ahead_ || lock_.held() || kept_resident_.load(std::memory_order_relaxed)) return;
  const uint64_t need = memory().stats().pages_not_resident;
  if (need == 0) return;
  if (frames_->ask_ahead(need, monotonic_ns()) > 0) {
    member().observe().asked_frames(frames_->frames_asked_ahead(), frames_->frames_asked_at_acquire());
  }
}

// Saved bytes not in the store's first tier (host slots): those in the swap file.
uint64_t device_session::saved_past_host_tier() const noexcept {
  const uint64_t held = store_->bytes_held();
  return held - std::min(held, store_->bytes_in_tier(0));
}

void device_session::publish_store() noexcept {
  const uint64_t held = store_->bytes_held();
  const uint64_t disk = saved_past_host_tier();
  member().observe().stored(held - disk, disk, store_->host_bytes_pinned());
}

session_stats device_session::stats() const {
  std::lock_guard<std::mutex> guard(mutex_);
  session_stats s = stats_;
  s.pager = memory().stats();
  s.disk_bytes = saved_past_host_tier();
  s.frames_asked_ahead = frames_->frames_asked_ahead();
  s.frames_asked_at_acquire = frames_->frames_asked_at_acquire();
  s.host_pinned_bytes = store_->host_bytes_pinned();
  return s;
}

void device_session::fill_stats(vramswap_stats_t* out) const {
  const session_stats s = stats();
  out->allocated_bytes = s.pager.allocated_bytes;
  out->allocations = s.pager.allocations;
  out->resident_bytes = s.pager.resident_bytes;
  out->disk_bytes = s.disk_bytes;
  out->host_bytes = s.pager.host_bytes - std::min(s.pager.host_bytes, s.disk_bytes);
  out->bytes_in = s.pager.bytes_in;
  out->bytes_out = s.pager.bytes_out;
  out->acquires = s.acquires;
  out->evictions_served = s.evictions_served;
  out->acquire_seconds = s.acquire_seconds;
  out->lock_wait_seconds = s.lock_wait_seconds;
  out->evict_seconds = s.pager.evict_seconds;
  out->restore_seconds = s.pager.restore_seconds;
  out->frames_asked_ahead = s.frames_asked_ahead;
  out->frames_asked_at_acquire = s.frames_asked_at_acquire;
  out->host_pinned_bytes = s.host_pinned_bytes;
}

void device_session::memory_info(uint64_t* free_bytes, uint64_t* total_bytes) const {
  const pool_connection& pool = member().connection();
  const uint64_t total = uint64_t{pool.frame_count()} * pool.frame_size();
  const pager_stats p = memory().stats();
  // Live pages, whether resident or saved: what this process's memory takes of the pool.
  const uint64_t mine = p.resident_bytes + p.host_bytes;
  *total_bytes = total;
  *free_bytes = total - std::min(total, mine);
}

}  // namespace vramswap::detail

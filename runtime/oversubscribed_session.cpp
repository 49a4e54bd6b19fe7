#include "runtime/oversubscribed_session.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdlib>
#include <string>

#include "core/launch_gate.hpp"
#include "core/log.hpp"
#include "core/options.hpp"
#include "core/status.hpp"
#include "lock/device_lock.hpp"
#include "lock/process_identity.hpp"

namespace vramswap::detail {

namespace {
constexpr uint64_t k_promote_quiet_ns = 1'000'000'000;  // no request for this long before promoting
constexpr uint64_t k_burst_linger_ns = 20'000'000;      // the gate stays closed this long for a next request
constexpr uint64_t k_spare_keep_ns = 30'000'000'000;    // spare host frames kept this long after a reclaim
constexpr uint64_t k_retry_after_failure_ns = 1'000'000'000;  // a failed demotion is tried again after this
// Host frames made ahead: made for this long, then a pause as long (at most half of one
// thread; a reclaim that comes meanwhile waits for one frame at most), within one serve for
// at most k_ahead_serve_ns (the rest of the service loop runs between).
constexpr uint64_t k_ahead_slice_ns = 25'000'000;
constexpr uint64_t k_ahead_serve_ns = 1'000'000'000;
constexpr uint64_t k_placement_period_ns = 1'000'000'000;     // a placement-by-use round at most this often

// VRAMSWAP_OVERSUBSCRIBE_COMPUTE: yield | share:N | free.
int read_compute_policy(launch_gate::yield_policy* policy, unsigned* share) {
  const std::string v = option_text(option_id::oversubscribe_compute);
  VS_TRY(option_check(option_id::oversubscribe_compute, v.c_str()));
  *share = 0;
  if (v == "free") {
    *policy = launch_gate::yield_policy::free;
  } else if (v.rfind("share:", 0) == 0) {
    *policy = launch_gate::yield_policy::share;
    *share = static_cast<unsigned>(std::strtoul(v.c_str() + 6, nullptr, 10));
  } else {
    *policy = launch_gate::yield_policy::yield;
  }
  return ok;
}

// The device locks that launches yield to, one per device, opened by the first
// oversubscribed session on it and kept for the life of the process: a thread may read a
// lock's holder word (or sleep on it) in the launch gate at any time, even while a session
// closes, so the mapping must never go away under it.
struct yield_lock {
  device_lock lock;
  launch_gate::yield_source source;
};
std::mutex g_yield_locks_mutex;
yield_lock* g_yield_locks[64] = {};

bool lock_claims(void* context, uint32_t seen) {
  return static_cast<device_lock*>(context)->holder_claims_compute(seen);
}
void lock_wait(void* context, uint32_t seen, uint64_t timeout_ns) {
  static_cast<device_lock*>(context)->wait_holder_change(seen, timeout_ns);
}

int yield_lock_of(int device, const std::string& key, yield_lock** out) {
  std::lock_guard<std::mutex> guard(g_yield_locks_mutex);
  if (device < 0 || device >= 64) {
    return fail(err_invalid_argument, "device %d: an oversubscribed process yields compute on devices 0 to 63 only", device);
  }
  if (g_yield_locks[device] == nullptr) {
    std::unique_ptr<yield_lock> y(new yield_lock());
    VS_TRY(add_context(device_lock::open(key, &y->lock), "device %d: opening its lock (to yield compute to its holders): ", device));
    y->source.word = y->lock.holder_word();
    y->source.idle = device_lock::k_no_holder;
    y->source.claims = lock_claims;
    y->source.wait = lock_wait;
    y->source.context = &y->lock;
    g_yield_locks[device] = y.release();  // kept: see above
  }
  *out = g_yield_locks[device];
  return ok;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

int oversubscribed_session::open(int device, std::unique_ptr<oversubscribed_session>* out) {
  std::unique_ptr<oversubscribed_session> s(new oversubscribed_session());
  VS_TRY(option_size(option_id::oversubscribe_limit, &s->limit_, physical_ram()));
  VS_TRY(read_compute_policy(&s->compute_policy_, &s->compute_share_));
  if (!option_text(option_id::oversubscribe_ahead).empty()) {
    VS_TRY(option_size(option_id::oversubscribe_ahead, &s->ahead_bytes_, physical_ram()));
  }
  uint64_t placement = 1;
  VS_TRY(option_uint(option_id::oversubscribe_placement, &placement));
  s->placement_ = placement != 0;
  VS_TRY(s->session::open(device));
  *out = std::move(s);
  return ok;
}

int oversubscribed_session::build(pool_member& member, frame_source** frames, page_store** store, pager_config* cfg) {
  if (compute_policy_ != launch_gate::yield_policy::free) {
    device_info info;
    VS_TRY(be_->get_device_info(device_, &info));
    yield_lock* y = nullptr;
    VS_TRY(yield_lock_of(device_, info.uuid, &y));
    yield_lock_ = &y->lock;
    yield_handle_ = launch_gate::add_yield_source(y->source);
    if (yield_handle_ < 0) {
      return fail(err_busy, "device %d: the launch gate yields to %u locks at most (one per device); set "
                  "VRAMSWAP_OVERSUBSCRIBE_COMPUTE=free to run without yielding", device_, launch_gate::k_max_yield_sources);
    }
  }
  launch_gate::set_yield_policy(compute_policy_, compute_share_);
  pool_connection& conn = member.connection();
  frames_ = std::make_unique<lending_frame_source>(*be_, conn.segment(), conn.member(), conn.frames(), limit_);
  store_ = std::make_unique<host_tier>(*be_, conn.frame_size());
  cfg->start_resident = true;  // every page is backed at once: pool frame or host frame
  *frames = frames_.get();
  *store = store_.get();
  return ok;
}

void oversubscribed_session::opened() {
  if (!launch_gate::installed()) {
    log(log_level::warn,
        "device %d: VRAMSWAP_OVERSUBSCRIBE=1 without libvramswap_preload.so: nothing holds this process's kernel launches "
        "while its pages move between pool and host frames, so a reclaim could race with its kernels. Run it with "
        "LD_PRELOAD=libvramswap_preload.so",
        device_);
  }
  const char* compute = compute_policy_ == launch_gate::yield_policy::free    ? "run beside lock holders"
                        : compute_policy_ == launch_gate::yield_policy::yield ? "wait while a lock holder holds"
                                                                              : "go on part of the time while a lock holder holds";
  log(log_level::info, "device %d: oversubscribed (low priority, no lock): pool frames while free, then up to %" PRIu64
      " MiB of host memory (VRAMSWAP_OVERSUBSCRIBE_LIMIT); launches %s (VRAMSWAP_OVERSUBSCRIBE_COMPUTE=%s)", device_,
      limit_ >> 20, compute, option_text(option_id::oversubscribe_compute).c_str());
  last_request_ns_ = monotonic_ns();
  start_placement();
}

oversubscribed_session::~oversubscribed_session() {
  if (yield_handle_ >= 0) launch_gate::remove_yield_source(yield_handle_);
  if (tracker_) {
    tracker_->stop();  // no launch records into it from here on
    placement_summary();
  }
  close();  // stops the service thread, destroys the pager (pool frames scrubbed and freed, host frames released)
  tracker_.reset();  // after close(): the service thread used it
  store_.reset();
  frames_.reset();
}

int oversubscribed_session::acquire(lock_priority, int64_t, acquire_info*) {
  return fail(err_invalid_argument,
              "lock(device %d): this process runs oversubscribed (VRAMSWAP_OVERSUBSCRIBE=1): low priority, without the device "
              "lock, its memory always mapped. Unset VRAMSWAP_OVERSUBSCRIBE to take turns under the lock",
              device_);
}

int oversubscribed_session::release() {
  return fail(err_not_owner, "unlock(device %d): this thread does not hold the device's lock: this process runs oversubscribed "
              "(VRAMSWAP_OVERSUBSCRIBE=1) and never takes it", device_);
}

bool oversubscribed_session::launches_held_by_holder() const {
  if (compute_policy_ != launch_gate::yield_policy::yield || yield_lock_ == nullptr) return false;
  const std::atomic<uint32_t>* word = yield_lock_->holder_word();
  if (word == nullptr) return false;
  const uint32_t holder = word->load(std::memory_order_acquire);
  return holder != device_lock::k_no_holder && yield_lock_->holder_claims_compute(holder);
}

// The wait keeps the gate closed so that this process starts no work that the next
// request's closing would have to drain. Each request's requester is blocked on it (a lock
// holder asks once per allocation and waits for the frames), so a next request comes only
// after the requester's own work between its allocations; the wait pays only when that is
// shorter than the wait. It does not pay
//   - while this process's launches yield to the lock holder: none starts while the gate is
//     open, so there is nothing to drain;
//   - when the requests came further apart than the wait lasts: the previous burst ended
//     longer before this one began (or there was none), so the requester's next request is
//     not expected in time either. A wait that a request ends shows they follow closely.
bool oversubscribed_session::linger_pays(uint64_t gap_ns) const {
  if (launches_held_by_holder()) return false;
  return gap_ns < k_burst_linger_ns;
}

// What a burst of requests did under one closing of the gate, for the stats and the log.
struct oversubscribed_session::reclaim_burst {
  size_t moved = 0;
  unsigned requests = 0;
  double linger_s = 0;
  unsigned lingers = 0, caught = 0, skipped = 0;
  pager::remap_timing spent;
};

int oversubscribed_session::serve_requests(std::vector<frame_id> wanted) {
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t start_ns = monotonic_ns();
  const uint64_t gap_ns = last_burst_end_ns_ == 0 ? UINT64_MAX : start_ns - std::min(start_ns, last_burst_end_ns_);
  const double gap_ms = gap_ns == UINT64_MAX ? -1 : gap_ns / 1e6;
  // The first request's host frames before the gate closes, while this process's kernels
  // still run: spares, else new ones (creating one pins its memory: milliseconds each). A
  // shortfall (the limit) is not final here: remap_pages asks again for each page that
  // lacks one, and reports the limit's error.
  const uint64_t created_before = frames_->frames_created();
  std::vector<frame_id> ready;
  size_t spares = 0;
  if (frames_->take_host_frames(device_, memory().frame_size(), wanted.size(), &ready, &spares) != ok) {
    log(log_level::debug, "device %d: reclaim: %zu of %zu host frame(s) ready ahead: %s", device_, ready.size(), wanted.size(),
        last_error());
  }
  const double ready_s = seconds_since(t0);
  const size_t made_ahead = ready.size();
  const auto t_close = std::chrono::steady_clock::now();
  reclaim_burst b;
  int failure = ok;
  double close_s = 0;
  {
    launch_gate::closed gate;  // no device work of ours runs while pages change frames
    close_s = seconds_since(t_close);
    failure = serve_burst(std::move(wanted), gap_ns, &ready, &b);
  }
  const double closed_s = seconds_since(t_close);
  last_burst_end_ns_ = monotonic_ns();
  for (frame_id f : ready) frames_->give_back(f);  // not needed after all: spares
  const double s = seconds_since(t0);
  count_burst(b, closed_s, created_before);
  const uint64_t created = frames_->frames_created() - created_before;
  const uint64_t bytes = uint64_t(b.moved) * memory().frame_size();
  member().observe().evicted(monotonic_ns() - uint64_t(s * 1e9), monotonic_ns(), bytes, b.moved);
  const pager::remap_timing& spent = b.spent;
  // (A retry that moved nothing, at the limit, says so at debug level: the failure itself
  // was logged once.)
  log(b.moved > 0 ? log_level::info : log_level::debug,
      "device %d: reclaim: %zu page(s) (%" PRIu64 " MiB) for %u request(s) moved to host frames in %.1f ms: host frames "
      "ready ahead in %.1f ms (%zu, %zu of them spares; %" PRIu64 " created while the lock holder waited); gate closed %.1f ms (closing it %.1f, running work %.1f, new frames %.1f, "
      "filling %.1f, copies %.1f, remapping %.1f, scrubbing %.1f, waiting for more requests %.1f); waits for a next request "
      "%u (%u ended by one), %u skipped; began %.1f ms after the previous burst ended (-1: none before); of the filling, "
      "mapping %.1f ms and granting access %.1f ms",
      device_, b.moved, bytes >> 20, b.requests, s * 1e3, ready_s * 1e3, made_ahead, spares, created,
      closed_s * 1e3, close_s * 1e3, spent.drain_s * 1e3, spent.new_frames_s * 1e3, spent.fill_s * 1e3,
      spent.copy_wait_s * 1e3, spent.switch_s * 1e3, spent.scrub_wait_s * 1e3, b.linger_s * 1e3, b.lingers, b.caught, b.skipped,
      gap_ms, spent.fill_map_s * 1e3, spent.fill_grant_s * 1e3);
  return failure;
}

int oversubscribed_session::serve_burst(std::vector<frame_id> wanted, uint64_t gap_ns, std::vector<frame_id>* ready_frames,
                                        reclaim_burst* b) {
  std::vector<frame_id>& ready = *ready_frames;
  // A lock holder asks once per allocation, and allocations come in bursts (a model's
  // tensors one after another). Each reopening of the gate may let this process launch
  // work that the next request must wait for, so the gate stays closed for the requests
  // that are waiting, and for k_burst_linger_ns more where a next one may come in time to
  // save that (linger_pays).
  for (;;) {
    size_t n = 0;
    pager::remap_timing t;
    const int rc = memory().remap_pages(
        wanted,
        [&](frame_id* f) -> int {
          if (ready.empty()) return frames_->take_host_frame(device_, memory().frame_size(), f);
          *f = ready.back();
          ready.pop_back();
          return ok;
        },
        &n, &t);
    ++b->requests;
    b->moved += n;
    b->spent += t;
    if (rc != ok) {
      // The frames stay requested; the service loop tries again later, with the gate
      // open (a retry here would hold this process's work back for as long as it fails).
      return fail(rc, "giving back %zu pool frame(s) a lock holder asked for: %s", wanted.size(), last_error());
    }
    if (member().stopping()) return ok;
    const auto t_linger = std::chrono::steady_clock::now();
    const uint32_t seen = member().requests_seen();
    const std::vector<frame_id> served = std::move(wanted);
    wanted = frames_->frames().requested_of_me();
    // A frame still asked for after a remap that moved nothing backs no page of ours (kept
    // after a failure elsewhere, which logged it): serving it again would move nothing, with
    // the gate closed, for as long as it is asked for.
    if (n == 0 && std::any_of(wanted.begin(), wanted.end(),
                              [&](frame_id f) { return std::find(served.begin(), served.end(), f) != served.end(); })) {
      return fail(err_busy, "giving back %zu pool frame(s) a lock holder asked for: they back no page of this process and "
                  "could not be given back (kept after an earlier failure of this process's, which its log names)",
                  served.size());
    }
    if (wanted.empty()) {
      if (!linger_pays(gap_ns)) {
        ++b->skipped;
        return ok;
      }
      ++b->lingers;
      member().wait_for_request(seen, k_burst_linger_ns);
      wanted = frames_->frames().requested_of_me();
      if (!wanted.empty()) {
        ++b->caught;
        gap_ns = 0;  // requests follow closely: wait for the next one too
      }
    }
    b->linger_s += seconds_since(t_linger);
    if (wanted.empty()) return ok;
  }
}

void oversubscribed_session::count_burst(const reclaim_burst& b, double closed_s, uint64_t created_before) {
  std::lock_guard<std::mutex> guard(mutex_);
  stats_.demotions += b.requests;
  ++stats_.bursts;
  stats_.pages_demoted += b.moved;
  stats_.demote_seconds += closed_s;
  stats_.last_demote_seconds = closed_s;
  stats_.host_frames_created_in_reclaim += frames_->frames_created() - created_before;
  stats_.lingers += b.lingers;
  stats_.lingers_caught += b.caught;
  stats_.linger_seconds += b.linger_s;
  stats_.lingers_skipped += b.skipped;
}

int oversubscribed_session::promote(uint32_t at_most) {
  const std::vector<frame_id> host_backed = host_frames_hottest_first(at_most);
  if (host_backed.empty()) return ok;
  size_t moved = 0;
  int rc = ok;
  {
    launch_gate::closed gate;
    rc = memory().remap_pages(host_backed,
                             [this](frame_id* f) -> int {
                               if (frames_->take_pool_frame(f)) return ok;
                               return fail(err_out_of_memory, "promotion: the pool's free frames were taken meanwhile");
                             },
                             &moved);
  }
  std::lock_guard<std::mutex> guard(mutex_);
  stats_.pages_promoted += moved;
  // Running out of free frames half-way is the normal end of a promotion, not a failure.
  return rc == err_out_of_memory ? ok : rc;
}

size_t oversubscribed_session::ahead_target() const {
  const uint64_t fs = memory().frame_size();
  const uint64_t resident = memory().stats().resident_bytes;
  const uint64_t in_pool = resident - std::min(resident, frames_->host_bytes());
  return static_cast<size_t>(std::min(in_pool, ahead_bytes_) / fs);
}

void oversubscribed_session::make_frames_ahead(uint32_t seen) {
  if (ahead_bytes_ == 0 || member().stopping()) return;
  const uint64_t start = monotonic_ns();
  if (ahead_failing_ && start < ahead_retry_at_ns_) return;
  const size_t fs = memory().frame_size();
  size_t made_now = 0;
  int rc = ok;
  for (;;) {
    const size_t target = ahead_target();
    const size_t have = frames_->spare_count();
    if (have >= target) {
      ahead_failing_ = false;
      if (!ahead_ready_said_ && made_now > 0) {
        log(log_level::info, "device %d: %zu host frame(s) (%" PRIu64 " MiB) ready ahead for reclaims: a lock holder that takes "
            "this process's pool frames waits for no new host frame (VRAMSWAP_OVERSUBSCRIBE_AHEAD)", device_, have,
            (uint64_t(have) * fs) >> 20);
        ahead_ready_said_ = true;
      }
      break;
    }
    ahead_ready_said_ = false;
    const uint64_t slice_end = monotonic_ns() + k_ahead_slice_ns;
    size_t made = 0;
    rc = frames_->make_spares(device_, fs, target - have,
                              [&] { return member().stopping() || member().requests_seen() != seen || monotonic_ns() >= slice_end; },
                              &made);
    made_now += made;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      stats_.host_frames_made_ahead += made;
    }
    if (rc != ok) break;
    // Stopped by the limit (nothing made although there was time), a request, or the end.
    if (made == 0 && monotonic_ns() < slice_end) break;
    if (member().stopping() || member().requests_seen() != seen || monotonic_ns() - start >= k_ahead_serve_ns) break;
    member().wait_for_request(seen, k_ahead_slice_ns);  // the pause: the job's threads have the CPU and the driver
    if (member().requests_seen() != seen) break;
  }
  if (rc != ok) {
    if (!ahead_failing_) {
      log(log_level::warn, "device %d: %s; a reclaim creates the host frames it lacks while the lock holder waits (tried again "
          "every %.0f s)", device_, last_error(), k_retry_after_failure_ns / 1e9);
    }
    ahead_failing_ = true;
    ahead_retry_at_ns_ = monotonic_ns() + k_retry_after_failure_ns;
  }
}

// One wake of the service thread. After a demotion fails (host memory or
// VRAMSWAP_OVERSUBSCRIBE_LIMIT exhausted), the same requests are tried again only after
// k_retry_after_failure_ns, or at once on a new request; the failure is logged once until a
// demotion succeeds again.
void oversubscribed_session::serve(uint32_t seen) {
  if (const uint32_t n = frames_->withdraw_abandoned_requests(); n > 0) {
    log(log_level::info, "device %d: %u request(s) for pool frames withdrawn: the lock holder that asked is gone", device_, n);
  }
  std::vector<frame_id> wanted = frames_->frames().requested_of_me();
  if (!wanted.empty() && (!failing_ || seen != failed_at_requests_ || monotonic_ns() >= retry_at_ns_)) {
    const int rc = serve_requests(std::move(wanted));
    last_request_ns_ = monotonic_ns();
    if (rc != ok) {
      // In the member slot too: the lock holder's timeout error quotes it.
      member().observe().evict_failed(rc, last_error(), last_request_ns_);
      log(failing_ ? log_level::debug : log_level::error, "device %d: %s%s", device_, last_error(),
          failing_ ? "" : "; the lock holder waits until VRAMSWAP_EVICT_TIMEOUT (tried again every second)");
      retry_at_ns_ = last_request_ns_ + k_retry_after_failure_ns;
      failed_at_requests_ = seen;
    } else if (failing_) {
      member().observe().evict_succeeded();
      log(log_level::info, "device %d: pool frames given back again", device_);
    }
    failing_ = rc != ok;
  } else if (wanted.empty() && monotonic_ns() - last_request_ns_ >= k_promote_quiet_ns) {
    // Not while a lock user queues or brings its memory in: the free frames are about to be
    // its, some of them given back by us at its asking, and taking them would have it ask
    // again, our pages going back and forth for as long as it waits.
    const uint32_t free_frames = frames_->free_pool_frames();
    if (free_frames > 0 && frames_->host_bytes() > 0 && !frames_->lock_user_on_its_way() && promote(free_frames) != ok) {
      log(log_level::warn, "device %d: moving pages back into free pool frames: %s", device_, last_error());
    }
    const size_t keep = ahead_target();
    if (frames_->spare_count() > keep && monotonic_ns() - last_request_ns_ >= k_spare_keep_ns) {
      const size_t n = frames_->release_spares(keep);
      log(log_level::info, "device %d: released %zu spare host frame(s) (%" PRIu64 " MiB): no reclaim for %.0f s; %zu kept "
          "ahead of the next", device_, n, (uint64_t(n) * memory().frame_size()) >> 20, k_spare_keep_ns / 1e9, keep);
    }
    make_frames_ahead(seen);
    if (tracker_ && monotonic_ns() >= next_placement_ns_) {
      next_placement_ns_ = monotonic_ns() + k_placement_period_ns;
      if (place_by_use() != ok) log(log_level::warn, "device %d: placement by use: %s", device_, last_error());
    }
  }
  member().observe().stored(frames_->host_bytes(), 0, frames_->pinned_bytes());
}

oversubscribed_stats oversubscribed_session::stats() const {
  std::lock_guard<std::mutex> guard(mutex_);
  oversubscribed_stats s = stats_;
  s.host_frame_bytes = frames_->host_bytes();
  s.spare_host_bytes = frames_->spare_bytes();
  const launch_gate::yield_totals y = launch_gate::yielded();
  s.yield_waits = y.waits;
  s.yield_seconds = y.waited_ns / 1e9;
  s.launches_observed = use_tracking::observed();
  s.launches_unreadable = use_tracking::unreadable();
  const uint64_t resident = memory().stats().resident_bytes;
  s.pool_frame_bytes = resident - std::min(resident, s.host_frame_bytes);
  return s;
}

void oversubscribed_session::fill_stats(vramswap_stats_t* out) const {
  const pager_stats p = memory().stats();
  const oversubscribed_stats o = stats();
  out->allocated_bytes = p.allocated_bytes;
  out->allocations = p.allocations;
  out->resident_bytes = p.resident_bytes;
  out->host_frame_bytes = o.host_frame_bytes;
  out->pages_demoted = o.pages_demoted;
  out->pages_promoted = o.pages_promoted;
  out->reclaim_seconds = o.demote_seconds;
  out->yield_waits = o.yield_waits;
  out->yield_seconds = o.yield_seconds;
  out->placement_rounds = o.placement_rounds;
  out->placement_rounds_skipped = o.placement_rounds_skipped;
  out->pages_placed_in = o.pages_placed_in;
  out->pages_placed_out = o.pages_placed_out;
  out->host_pinned_bytes = frames_->pinned_bytes();
}

void oversubscribed_session::memory_info(uint64_t* free_bytes, uint64_t* total_bytes) const {
  const uint64_t fs = member().connection().frame_size();
  const uint64_t pool = uint64_t(member().segment().frame_count()) * fs;
  const uint64_t limit = frames_->host_limit();
  const uint64_t host_used = std::min(frames_->host_bytes(), limit);
  *total_bytes = pool + limit;
  *free_bytes = uint64_t(frames_->free_pool_frames()) * fs + (limit - host_used);
}

int oversubscribed_session::keep_resident() {
  return fail(err_invalid_argument, "keep_resident(device %d): this process is oversubscribed (VRAMSWAP_OVERSUBSCRIBE=1): its memory is "
              "mapped at all times already, and it gives frames back to lock holders; sleep and wake are for time-sharing processes",
              device_);
}

}  // namespace vramswap::detail

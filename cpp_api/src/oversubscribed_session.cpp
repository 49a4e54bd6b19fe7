#include "cpp_api/src/oversubscribed_session.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>

#include "core/launch_gate.hpp"
#include "core/log.hpp"
#include "core/options.hpp"
#include "core/status.hpp"
#include "lock/futex.hpp"
#include "lock/process_identity.hpp"

namespace vramswap {

namespace {
constexpr uint64_t k_service_poll_ns = 50'000'000;    // the service thread also wakes this often
constexpr uint64_t k_promote_quiet_ns = 1'000'000'000;  // no request for this long before promoting
constexpr unsigned k_host_frame_threads = 4;            // threads creating a reclaim's host frames

}  // namespace

int oversubscribed_session::open(int device, std::unique_ptr<oversubscribed_session>* out) {
  std::unique_ptr<oversubscribed_session> s(new oversubscribed_session());
  VS_TRY(default_backend(&s->be_));
  s->device_ = device;
  uint64_t limit = 0;
  VS_TRY(option_size(option_id::oversubscribe_limit, &limit, physical_ram()));
  VS_TRY(pool_connection::connect(*s->be_, device, /*autostart=*/true, &s->conn_));
  pool_connection& conn = *s->conn_;
  s->frames_ = std::make_unique<lending_frame_source>(*s->be_, conn.segment(), conn.member(), conn.frames(), limit);
  s->store_ = std::make_unique<host_tier>(*s->be_, conn.frame_size());
  pager_config cfg;
  cfg.frame_size = conn.frame_size();
  cfg.start_resident = true;  // every page is backed at once: pool frame or host frame
  VS_TRY(pager::create(*s->be_, device, *s->store_, *s->frames_, cfg, &s->pager_));
  s->observe_ = std::make_unique<member_observer>(conn.segment(), conn.member());
  if (!launch_gate::installed()) {
    log(log_level::warn,
        "device %d: VRAMSWAP_OVERSUBSCRIBE=1 without libvramswap_preload.so: nothing holds this process's kernel launches "
        "while its pages move between pool and host frames, so a reclaim could race with its kernels. Run it with "
        "LD_PRELOAD=libvramswap_preload.so",
        device);
  }
  log(log_level::info, "device %d: oversubscribed (low priority, no lock): pool frames while free, then up to %" PRIu64
      " MiB of host memory (VRAMSWAP_OVERSUBSCRIBE_LIMIT)", device, limit >> 20);
  log_set_device(device);
  s->server_ = std::thread([p = s.get()] {
    log_set_device(p->device_);
    p->serve();
  });
  *out = std::move(s);
  return ok;
}

oversubscribed_session::~oversubscribed_session() {
  stop_.store(true);
  if (conn_) futex_wake_one(&conn_->segment().member(conn_->member()).requests);
  if (server_.joinable()) server_.join();
  pager_.reset();  // unmaps every page; pool frames are scrubbed and freed, host frames released
  store_.reset();
  frames_.reset();
  conn_.reset();
}

int oversubscribed_session::demote(const std::vector<frame_id>& wanted) {
  const auto t0 = std::chrono::steady_clock::now();
  auto since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  // The host frames first, while this process's kernels still run: creating one pins its
  // memory (milliseconds each), which need not hold the gate, and several threads do it at
  // once. A shortfall (the limit) is not final here: remap_pages asks again for each page
  // that lacks one and reports the limit's error.
  std::vector<frame_id> prepared;
  prepared.reserve(wanted.size());
  if (frames_->take_host_frames(device_, pager_->frame_size(), wanted.size(), k_host_frame_threads, &prepared) != ok) {
    log(log_level::debug, "device %d: reclaim: %zu of %zu host frame(s) made ahead: %s", device_, prepared.size(), wanted.size(),
        last_error());
  }
  const double prepare_s = since(t0);
  size_t moved = 0;
  int rc = ok;
  double close_s = 0;
  pager::remap_timing timing;
  const auto t_close = std::chrono::steady_clock::now();
  {
    launch_gate::closed gate;  // no device work of ours runs while pages change frames
    close_s = since(t_close);
    rc = pager_->remap_pages(
        wanted,
        [&](frame_id* f) -> int {
          if (prepared.empty()) return frames_->take_host_frame(device_, pager_->frame_size(), f);
          *f = prepared.back();
          prepared.pop_back();
          return ok;
        },
        &moved, &timing);
  }
  const double closed_s = since(t_close);
  for (frame_id f : prepared) frames_->give_back(f);  // pages that did not move (an error below)
  const double s = since(t0);
  {
    std::lock_guard<std::mutex> guard(mutex_);
    ++stats_.demotions;
    stats_.pages_demoted += moved;
    stats_.demote_seconds += closed_s;
    stats_.last_demote_seconds = closed_s;
  }
  const uint64_t bytes = uint64_t(moved) * pager_->frame_size();
  observe_->evicted(monotonic_ns() - uint64_t(s * 1e9), monotonic_ns(), bytes, moved);
  log(log_level::info,
      "device %d: reclaim: %zu page(s) (%" PRIu64 " MiB) moved to host frames in %.1f ms: host frames made ahead %.1f ms; gate "
      "closed %.1f ms (closing it, waiting for running launches and the device: %.1f ms; new frames %.1f, filling %.1f, copies "
      "%.1f, remapping %.1f, scrubbing %.1f)",
      device_, moved, bytes >> 20, s * 1e3, prepare_s * 1e3, closed_s * 1e3, close_s * 1e3, timing.new_frames_s * 1e3,
      timing.fill_s * 1e3, timing.copy_wait_s * 1e3, timing.switch_s * 1e3, timing.scrub_wait_s * 1e3);
  return rc;
}

int oversubscribed_session::promote(uint32_t at_most) {
  std::vector<frame_id> host_backed;
  for (frame_id f : pager_->resident_frames()) {
    if (!frames_->is_pool_frame(f)) host_backed.push_back(f);
    if (host_backed.size() == at_most) break;
  }
  if (host_backed.empty()) return ok;
  size_t moved = 0;
  int rc = ok;
  {
    launch_gate::closed gate;
    rc = pager_->remap_pages(host_backed,
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

void oversubscribed_session::serve() {
  pool_layout::member_slot& me = conn_->segment().member(conn_->member());
  uint64_t last_request_ns = monotonic_ns();
  while (!stop_.load()) {
    const uint32_t seen = me.requests.load(std::memory_order_acquire);
    const std::vector<frame_id> wanted = frames_->requested_of_me();
    if (!wanted.empty()) {
      last_request_ns = monotonic_ns();
      if (demote(wanted) != ok) {
        log(log_level::error, "device %d: giving back %zu pool frame(s) a lock holder asked for: %s", device_, wanted.size(),
            last_error());
      }
    } else if (monotonic_ns() - last_request_ns >= k_promote_quiet_ns) {
      const uint32_t free_frames = frames_->free_pool_frames();
      if (free_frames > 0 && frames_->host_bytes() > 0 && promote(free_frames) != ok) {
        log(log_level::warn, "device %d: moving pages back into free pool frames: %s", device_, last_error());
      }
    }
    observe_->stored(frames_->host_bytes(), 0);
    if (stop_.load()) break;
    futex_wait(&me.requests, seen, k_service_poll_ns);
  }
}

oversubscribed_stats oversubscribed_session::stats() const {
  std::lock_guard<std::mutex> guard(mutex_);
  oversubscribed_stats s = stats_;
  s.host_frame_bytes = frames_->host_bytes();
  const uint64_t resident = pager_->stats().resident_bytes;
  s.pool_frame_bytes = resident - std::min(resident, s.host_frame_bytes);
  return s;
}

void oversubscribed_session::memory_info(uint64_t* free_bytes, uint64_t* total_bytes) const {
  const uint64_t fs = conn_->frame_size();
  const uint64_t pool = uint64_t(conn_->segment().frame_count()) * fs;
  const uint64_t limit = frames_->host_limit();
  const uint64_t host_used = std::min(frames_->host_bytes(), limit);
  *total_bytes = pool + limit;
  *free_bytes = uint64_t(frames_->free_pool_frames()) * fs + (limit - host_used);
}

}  // namespace vramswap

#include "runtime/session.hpp"

#include "core/log.hpp"
#include "core/status.hpp"
#include "lock/process_identity.hpp"
#include "runtime/fault_report.hpp"

namespace vramswap::detail {

int session::open(int device) {
  const uint64_t t_start = monotonic_ns();
  VS_TRY(default_backend(&be_));
  device_ = device;
  VS_TRY(pool_member::join(*be_, device, &member_));
  const uint64_t t_joined = monotonic_ns();
  frame_source* frames = nullptr;
  page_store* store = nullptr;
  pager_config cfg;
  cfg.frame_size = member_->connection().frame_size();
  VS_TRY(build(*member_, &frames, &store, &cfg));
  const uint64_t t_built = monotonic_ns();
  VS_TRY(pager::create(*be_, device, *store, *frames, cfg, &pager_));
  opened();
  log_set_device(device);
  member_->start_service(device, [this](uint32_t requests_seen) { serve(requests_seen); });
  // Where a process's start goes (debug level): a pool that is being built, or one whose
  // server is busy, shows in the joining.
  const uint64_t t_done = monotonic_ns();
  log(log_level::debug,
      "session: device %d opened in %.2f ms (joining the pool %.2f, its frame source and store %.2f, the pager and the rest %.2f)",
      device, (t_done - t_start) / 1e6, (t_joined - t_start) / 1e6, (t_built - t_joined) / 1e6, (t_done - t_built) / 1e6);
  return ok;
}

void session::close() noexcept {
  if (closed_) return;
  closed_ = true;
  if (pager_ && member_) leaving();
  if (member_) member_->stop_service();
  // A pager watched for faults (the time-sharing policy on the host backend) stops being
  // watched before it goes; for one that never was, this does nothing.
  if (pager_) fault_unwatch(*pager_);
  // Work this process queued may still run (an exception left a step unsynchronized): it
  // would write into a frame after the pager zeroed it, and the frame would go back to the
  // pool, to another tenant, holding our bytes. The pager synchronizes only its own streams.
  if (pager_ && be_ != nullptr && be_->device_synchronize(device_) != ok) {
    log(log_level::warn, "session: device %d: waiting for this process's device work before giving its frames back failed: %s",
        device_, last_error());
  }
  pager_.reset();  // unmaps every page; its pool frames are zeroed and given back
}

int session::set_rank_gang(std::unique_ptr<rank_gang> gang) {
  if (gang == nullptr) return ok;
  return fail(err_invalid_argument,
              "join_gang(device %d): this device is oversubscribed (VRAMSWAP_OVERSUBSCRIBE=1): it runs without the lock, so "
              "it cannot be a rank of a gang", device_);
}

void session::note_outside_pool(int64_t delta) noexcept {
  if (member_) member_->observe().outside_pool(delta);
}

// The policy's destructor has called close() and destroyed its frame source and store;
// leaving the pool is last (the server frees whatever this member still owns).
session::~session() { member_.reset(); }

}  // namespace vramswap::detail

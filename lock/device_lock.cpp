// The device_lock object: opening and removing a device's lock, moving and destroying the
// object, whom it records as the holder (re-entry), and opening anew in a forked child. The
// lock itself is in the files named in device_lock.hpp's private part.
#include "lock/device_lock.hpp"

#include <signal.h>
#include <unistd.h>

#include <new>

#include "core/options.hpp"
#include "core/status.hpp"
#include "lock/process_identity.hpp"
#include "lock/segment_layout.hpp"
#include "lock/shared_segment.hpp"

namespace vramswap::detail {
using namespace lock_layout;

namespace {

int signal_of(const std::string& name) {
  if (name == "SIGINT") return SIGINT;
  if (name == "SIGTERM") return SIGTERM;
  if (name == "SIGUSR1") return SIGUSR1;
  if (name == "SIGUSR2") return SIGUSR2;
  return 0;
}

}  // namespace

device_lock::device_lock() noexcept = default;

device_lock::~device_lock() {
  if (segment_ != nullptr && held()) {
    depth_ = 1;
    release();
  }
}

device_lock::device_lock(device_lock&& other) noexcept { *this = std::move(other); }

device_lock& device_lock::operator=(device_lock&& other) noexcept {
  if (this == &other) return *this;
  if (segment_ != nullptr && held()) {
    depth_ = 1;
    release();
  }
  segment_ = std::move(other.segment_);
  device_key_ = std::move(other.device_key_);
  holder_pid_.store(other.holder_pid_.load());
  holder_tid_.store(other.holder_tid_.load());
  holder_slot_.store(other.holder_slot_.load());
  depth_ = other.depth_;
  max_hold_ns_ = other.max_hold_ns_;
  release_signal_ = other.release_signal_;
  uid_ = other.uid_;
  penalty_behind_.store(other.penalty_behind_.load());
  hold_ticket_.store(other.hold_ticket_.load());
  warned_over_ticket_.store(other.warned_over_ticket_.load());
  told_release_ticket_.store(other.told_release_ticket_.load());
  other.penalty_behind_.store(0);
  other.holder_pid_.store(0);
  other.holder_tid_.store(0);
  other.depth_ = 0;
  return *this;
}

int device_lock::open(const std::string& device_key, device_lock* out) noexcept {
  if (out == nullptr) return fail(err_invalid_argument, "device_lock::open: out is null");
  process_identity me{};
  VS_TRY(current_process(&me));
  uint64_t max_hold_ns = 0;
  VS_TRY(add_context(option_duration_ns(option_id::max_hold, &max_hold_ns), "device_lock::open(%s): ", device_key.c_str()));
  std::string release_signal;
  try {
    release_signal = option_text(option_id::release_signal);
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "device_lock::open: out of host memory");
  }
  if (!release_signal.empty() && signal_of(release_signal) == 0) {
    VS_TRY(add_context(option_check(option_id::release_signal, release_signal.c_str()), "device_lock::open(%s): ",
                       device_key.c_str()));
  }
  std::unique_ptr<shared_segment> segment;
  VS_TRY(shared_segment::open(device_key, &segment));
  device_lock opened;
  opened.segment_ = std::move(segment);
  opened.max_hold_ns_ = max_hold_ns;
  opened.release_signal_ = signal_of(release_signal);
  opened.uid_ = static_cast<uint32_t>(::geteuid());
  try {
    opened.device_key_ = device_key;
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "device_lock::open: out of host memory");
  }
  *out = std::move(opened);
  return ok;
}

int device_lock::remove(const std::string& device_key) noexcept { return shared_segment::remove(device_key); }

bool device_lock::held_by(pid_t pid, pid_t tid) const noexcept {
  return holder_tid_.load(std::memory_order_relaxed) == tid && holder_pid_.load(std::memory_order_relaxed) == pid;
}

bool device_lock::held() const noexcept {
  process_identity me{};
  if (segment_ == nullptr || current_process(&me) != 0) return false;
  return held_by(me.pid, current_tid());
}

void device_lock::forget_holding() noexcept {
  holder_tid_.store(0, std::memory_order_relaxed);
  holder_pid_.store(0, std::memory_order_relaxed);
  depth_ = 0;
}

uint64_t device_lock::recoveries() const noexcept {
  return segment_ == nullptr ? 0 : lock_state_of(segment_->base())->recoveries;
}

lock_layout::turn_histograms* device_lock::turns() const noexcept {
  return segment_ == nullptr ? nullptr : turns_of(segment_->base());
}

int device_lock::reopen_if_forked() noexcept {
  if (segment_->opened_in_this_process()) return ok;
  // A forked child: its descriptor of the segment was its parent's (liveness_lease.hpp).
  std::unique_ptr<shared_segment> own;
  VS_TRY(shared_segment::open(device_key_, &own));
  segment_ = std::move(own);
  penalty_behind_.store(0);  // the parent's long hold is not the child's
  return ok;
}

}  // namespace vramswap::detail

#include "lock/crash_points.hpp"

namespace vramswap::detail {

namespace detail {
crash_hook g_crash_hook = nullptr;
}

const char* crash_point_name(crash_point point) noexcept {
  switch (point) {
    case crash_point::enqueue_slot_filled: return "enqueue_slot_filled";
    case crash_point::enqueue_published: return "enqueue_published";
    case crash_point::grant_state_stored: return "grant_state_stored";
    case crash_point::grant_before_wake: return "grant_before_wake";
    case crash_point::release_slot_freed: return "release_slot_freed";
    case crash_point::timeout_slot_freed: return "timeout_slot_freed";
    case crash_point::recovery_midway: return "recovery_midway";
    case crash_point::over_limit_marked: return "over_limit_marked";
    case crash_point::release_request_stored: return "release_request_stored";
    case crash_point::gang_enqueued_one: return "gang_enqueued_one";
    case crash_point::gang_reserved: return "gang_reserved";
    case crash_point::gang_granted_one: return "gang_granted_one";
    case crash_point::gang_queued_one: return "gang_queued_one";
    case crash_point::count_: break;
  }
  return "unknown";
}

void set_crash_hook(crash_hook hook) noexcept { detail::g_crash_hook = hook; }

}  // namespace vramswap::detail

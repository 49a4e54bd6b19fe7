// Named points inside the lock's critical sections, for crash tests.
//
// The SIGKILL torture kills processes at random moments, which reaches the short windows
// inside the internal critical sections only by luck. To cover every window on purpose, a
// test process installs a hook and the lock calls it at each named point below; the test's
// hook typically raises SIGKILL there, leaving exactly the partial state a death at that
// instruction would leave. Without a hook installed (always, outside tests) each point is
// one well-predicted branch on a null pointer. Not configurable from the environment, so a
// production process can never enable it by accident.
#pragma once

namespace vramswap::detail {

enum class crash_point {
  enqueue_slot_filled,       // acquire: slot fields written, state not yet published
  enqueue_published,         // acquire: slot published as waiting, no grant decided yet
  grant_state_stored,        // dispatch: the next slot marked holding, hints not yet updated
  grant_before_wake,         // dispatch done, mutex still held, the grantee not yet woken
  release_slot_freed,        // release: own slot freed, the next waiter not yet granted
  timeout_slot_freed,        // timed-out acquire: own slot freed, hints not yet updated
  recovery_midway,           // recovery: dead slots reaped, hints not yet recomputed
  over_limit_marked,         // a hold marked past its limit, mutex still held
  release_request_stored,    // release request: the asker recorded, the request time not yet stored
  gang_enqueued_one,         // gang acquire: queued on its first device, not yet on the others
  gang_reserved,             // gang grant: every member slot reserved (granting), none granted
  gang_granted_one,          // gang grant: the first member granted, the others still reserved
  gang_queued_one,           // rank gang: the first rank's slot given its place, the others still forming
  count_
};

const char* crash_point_name(crash_point point) noexcept;

using crash_hook = void (*)(crash_point point);

// Install (or remove, with nullptr) this process's hook. Tests only.
void set_crash_hook(crash_hook hook) noexcept;

namespace detail {
extern crash_hook g_crash_hook;
}

inline void at_crash_point(crash_point point) noexcept {
  if (__builtin_expect(detail::g_crash_hook != nullptr, 0)) detail::g_crash_hook(point);
}

}  // namespace vramswap::detail

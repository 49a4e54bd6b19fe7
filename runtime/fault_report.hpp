// fault_report: on the host backend, a SIGSEGV inside a time-sharing session's arena is
// explained before the process dies.
//
// Device memory there is ordinary process memory, so a CPU access to a page that is not in
// a frame (saved for another process, dropped, never backed, or freed) is a segmentation
// fault. Without this the user sees only "Segmentation fault"; with it, stderr says first
// which address, which device's arena, whether this process held the lock then, and what
// to do. Nothing is paged in from the handler: the access was outside the rules (docs/api.md,
// "Memory"), the page's bytes may be on their way to or from another process, and a page-in
// would need the lock. The process then dies as it would have: the handler puts back the
// action that was there before (a sanitizer's, Python's faulthandler, the default) and
// lets the access fault again, or calls a chained handler directly.
//
// Only the host backend installs it: on the cuda backend device memory is not CPU memory,
// and a kernel's access to an unmapped page is a CUDA error (illegal address), not a signal.
#pragma once

#include <cstdint>

namespace vramswap::detail {

class pager;

// Watch `memory`'s arena for `device` until unwatch(). The first watch installs the handler
// (SA_SIGINFO | SA_ONSTACK, chaining to the previous action). At most 16 arenas at once;
// more are simply not watched. Thread-safe; `memory` must outlive its watch.
void fault_watch(int device, const pager& memory) noexcept;
void fault_unwatch(const pager& memory) noexcept;

}  // namespace vramswap::detail

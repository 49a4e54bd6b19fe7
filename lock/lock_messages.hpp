// The words of the device lock's messages (errors, warnings): a duration, a list of waiters,
// text appended to a buffer. Internal to lock/; no message is logged here.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

#include "lock/segment_layout.hpp"

namespace vramswap::detail {

// "0.30 s", "12.5 s", "2.0 h": a duration for messages.
void format_duration(uint64_t ns, char* buf, size_t size);

// Append printf-style to buf (size bytes, *used of them taken); truncates quietly.
void appendf(char* buf, size_t size, size_t* used, const char* fmt, ...) __attribute__((format(printf, 4, 5)));

// Up to four waiters, copied from the slots (under the mutex, so that no /proc read happens
// there) and described after it: "pid 12 (python3) of uid 1000, waiting 3.2 s, ...".
struct waiter_list {
  struct entry {
    pid_t pid;
    uint64_t pid_ns;
    uint32_t uid;
    uint64_t enqueue_ns;
  } first[4];
  uint32_t shown = 0;
  uint32_t count = 0;

  void collect(const lock_layout::waiter_slot* slots, uint32_t end);
  void describe(uint64_t now, char* buf, size_t size) const;
};

}  // namespace vramswap::detail

#include "lock/lock_messages.hpp"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <string>

#include "lock/ownership.hpp"
#include "lock/process_identity.hpp"

namespace vramswap::detail {
using namespace lock_layout;

void format_duration(uint64_t ns, char* buf, size_t size) {
  const double s = static_cast<double>(ns) / 1e9;
  if (s < 10) {
    std::snprintf(buf, size, "%.2f s", s);
  } else if (s < 120) {
    std::snprintf(buf, size, "%.1f s", s);
  } else if (s < 7200) {
    std::snprintf(buf, size, "%.1f min", s / 60);
  } else {
    std::snprintf(buf, size, "%.1f h", s / 3600);
  }
}

void appendf(char* buf, size_t size, size_t* used, const char* fmt, ...) {
  if (*used + 1 >= size) return;
  va_list ap;
  va_start(ap, fmt);
  const int n = std::vsnprintf(buf + *used, size - *used, fmt, ap);
  va_end(ap);
  if (n > 0) *used = std::min(size - 1, *used + static_cast<size_t>(n));
}

void waiter_list::collect(const waiter_slot* slots, uint32_t end) {
  for (uint32_t i = 0; i < end; ++i) {
    if (slots[i].state.load(std::memory_order_relaxed) != slot_waiting) continue;
    if (shown < 4) {
      first[shown++] = {__atomic_load_n(&slots[i].pid, __ATOMIC_RELAXED), __atomic_load_n(&slots[i].pid_ns, __ATOMIC_RELAXED),
                        __atomic_load_n(&slots[i].uid, __ATOMIC_RELAXED), __atomic_load_n(&slots[i].enqueue_ns, __ATOMIC_RELAXED)};
    }
    ++count;
  }
}

void waiter_list::describe(uint64_t now, char* buf, size_t size) const {
  size_t used = 0;
  buf[0] = '\0';
  char who[192], waited[32];
  for (uint32_t i = 0; i < shown; ++i) {
    describe_process_in(first[i].pid, first[i].pid_ns, who, sizeof who);
    std::string owner;
    try {
      owner = describe_uid(first[i].uid);
    } catch (...) {  // out of memory: the uid's name is a nicety
    }
    format_duration(now > first[i].enqueue_ns ? now - first[i].enqueue_ns : 0, waited, sizeof waited);
    const int n = std::snprintf(buf + used, size - used, "%s%s%s%s, waiting %s", i == 0 ? "" : "; ", who,
                                owner.empty() ? "" : " of ", owner.c_str(), waited);
    if (n < 0 || static_cast<size_t>(n) >= size - used) return;
    used += static_cast<size_t>(n);
  }
  if (count > shown) std::snprintf(buf + used, size - used, "; and %u more", count - shown);
}

}  // namespace vramswap::detail

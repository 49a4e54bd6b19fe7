// What tests/cpp_api/yield_worker's job publishes while it runs, in a file both it and the
// test map: how many rounds (one launch-gate pass each) it made, when the gate last let it
// through, and its longest pause between two passes, with the time that pause ended (all
// times CLOCK_MONOTONIC).
#pragma once

#include <atomic>
#include <cstdint>

namespace vramswap::detail::test {

struct job_shared {
  std::atomic<uint64_t> ready{0};  // 1 once the job's session is open and it starts its rounds
  std::atomic<uint64_t> rounds{0};
  std::atomic<uint64_t> longest_pause_ns{0};
  std::atomic<uint64_t> longest_pause_end_ns{0};
  std::atomic<uint64_t> last_pass_ns{0};  // the latest time the gate let the job through
};

}  // namespace vramswap::detail::test

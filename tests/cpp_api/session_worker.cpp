// A time-sharing client for the multi-process tests: a real process with its own session.
//
// usage: session_worker <bytes> <rounds> <seed> [hold-ms] [alloc-under-lock]
// Allocates <bytes> of device memory in four allocations (sizes that share pages and span
// them), then for each round: acquire; check that every byte still holds what the previous
// round wrote (random data from the seed); write new random data; hold the lock hold-ms
// (compute time); release. With alloc-under-lock (any 5th argument) the allocations are made
// while holding the lock (backed at once, frames taken at malloc) instead of before the first
// acquire. Prints one summary line. Exit: 0 ok, 2 an API call failed,
// 3 data differed (the message says where).
//
// SESSION_WORKER_PAUSE=<round>:<path> in the environment: after releasing round <round>,
// wait (its frames idle, others may ask for them) until <path> exists, then go on with the
// next rounds, which check every byte as before (at most 120 s; exit 2 past that). Round 0
// waits before the first acquire, with the session open and the memory allocated: a start
// line for workers whose start-up times differ (a CUDA context takes far longer than a turn).
//
// SESSION_WORKER_FORK=<round>:<path>: after releasing round <round> (before its pause, if
// any), fork a child that runs nothing else and waits to be killed (a DataLoader worker of
// the fork start method: it inherits the session's connection and driver files), and write
// the child's pid to <path>.
//
// SESSION_WORKER_ALLOC_GAP_MS=<ms>: with alloc-under-lock, wait <ms> before each allocation
// after the first (a program's own work between its allocations).
// SESSION_WORKER_HOLD_AFTER_ALLOC_MS=<ms>: with alloc-under-lock, hold the lock <ms> after the
// last allocation before releasing it (a program's work after its allocations).
//
// SESSION_WORKER_TURNS=<dir>: turns driven by the test: before round r, wait (at most 120 s)
// until <dir>/go.<seed>.<r> exists; after its release, create <dir>/done.<seed>.<r>.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/status.hpp"
#include "runtime/device_session.hpp"
#include "support/random_bytes.hpp"
#include "support/worker_exit.hpp"

using namespace vramswap;
using namespace vramswap::detail;

namespace {

constexpr const char* k_program = "session_worker";
void check(int rc, const char* what) { test::worker_check(k_program, rc, what); }

// Waits (at most 120 s) until `path` exists; false, with a message, past that.
bool wait_for_file(const std::string& path) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (::access(path.c_str(), F_OK) != 0) {
    if (std::chrono::steady_clock::now() > until) {
      std::fprintf(stderr, "session_worker[%d]: %s did not appear within 120 s\n", static_cast<int>(getpid()), path.c_str());
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

struct block {
  device_ptr ptr;
  uint64_t size;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s <bytes> <rounds> <seed> [hold-ms]\n", argv[0]);
    return 64;
  }
  const uint64_t bytes = std::strtoull(argv[1], nullptr, 10);
  const int rounds = std::atoi(argv[2]);
  const uint64_t seed = std::strtoull(argv[3], nullptr, 10);
  const int hold_ms = argc > 4 ? std::atoi(argv[4]) : 0;
  const bool alloc_under_lock = argc > 5;
  int pause_after = 0;
  std::string pause_file;
  if (const char* pause = std::getenv("SESSION_WORKER_PAUSE"); pause != nullptr && std::strchr(pause, ':') != nullptr) {
    pause_after = std::atoi(pause);
    pause_file = std::strchr(pause, ':') + 1;
  }

  int fork_after = 0;
  std::string fork_file;
  if (const char* fork = std::getenv("SESSION_WORKER_FORK"); fork != nullptr && std::strchr(fork, ':') != nullptr) {
    fork_after = std::atoi(fork);
    fork_file = std::strchr(fork, ':') + 1;
  }

  std::unique_ptr<device_session> session;
  check(device_session::open(0, &session), "opening the session");
  backend& be = session->get_backend();
  // Allocated before the first acquire (backed only when the lock is taken), or under the lock.
  if (alloc_under_lock) check(session->acquire(), "acquire (to allocate)");
  const char* gap_env = std::getenv("SESSION_WORKER_ALLOC_GAP_MS");
  const int alloc_gap_ms = alloc_under_lock && gap_env != nullptr ? std::atoi(gap_env) : 0;
  std::vector<block> blocks;
  for (uint64_t size : {bytes / 2, bytes / 3, bytes - bytes / 2 - bytes / 3 - 1000, uint64_t{1000}}) {
    if (alloc_gap_ms > 0 && !blocks.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(alloc_gap_ms));
    device_ptr p = 0;
    check(session->memory().malloc(size, &p), "malloc");
    blocks.push_back({p, size});
  }
  if (const char* hold = std::getenv("SESSION_WORKER_HOLD_AFTER_ALLOC_MS"); alloc_under_lock && hold != nullptr) {
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(hold)));
  }
  if (alloc_under_lock) check(session->release(), "release (after allocating)");
  uint64_t largest = 0;
  for (const block& b : blocks) largest = std::max(largest, b.size);
  void* staging = nullptr;
  check(be.host_alloc(largest, &staging), "host_alloc");
  stream_id s = 0;
  check(be.stream_create(0, &s), "stream_create");

  const char* turns = std::getenv("SESSION_WORKER_TURNS");
  auto turn_file = [&](const char* what, int round) {
    return std::string(turns) + "/" + what + "." + std::to_string(seed) + "." + std::to_string(round);
  };
  if (pause_after == 0 && !pause_file.empty() && !wait_for_file(pause_file)) return 2;
  for (int round = 1; round <= rounds; ++round) {
    if (turns != nullptr && !wait_for_file(turn_file("go", round))) return 2;
    check(session->acquire(), "acquire");
    for (size_t i = 0; i < blocks.size(); ++i) {
      const block& b = blocks[i];
      if (round > 1) {
        check(be.copy_d2h(staging, b.ptr, b.size, s), "copy_d2h");
        check(be.stream_synchronize(s), "sync");
        const size_t bad = test::first_mismatch(staging, b.size, seed * 1000003 + (round - 1) * 101 + i);
        if (bad != b.size) {
          std::fprintf(stderr, "session_worker[%d]: round %d: byte %zu of block %zu (%llu bytes) differs from what round %d wrote\n",
                       static_cast<int>(getpid()), round, bad, i, static_cast<unsigned long long>(b.size), round - 1);
          return 3;
        }
      }
      test::fill_random(staging, b.size, seed * 1000003 + round * 101 + i);
      check(be.copy_h2d(b.ptr, staging, b.size, s), "copy_h2d");
      check(be.stream_synchronize(s), "sync");
    }
    if (hold_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms));
    check(session->release(), "release");
    if (turns != nullptr) {
      if (FILE* f = std::fopen(turn_file("done", round).c_str(), "w")) std::fclose(f);
    }
    if (round == fork_after && !fork_file.empty()) {
      const pid_t child = ::fork();
      if (child < 0) check(err_system, "fork");
      if (child == 0) {
        for (;;) ::pause();
      }
      if (FILE* f = std::fopen((fork_file + ".part").c_str(), "w")) {
        std::fprintf(f, "%d\n", static_cast<int>(child));
        std::fclose(f);
        std::rename((fork_file + ".part").c_str(), fork_file.c_str());
      }
    }
    if (round == pause_after && !wait_for_file(pause_file)) return 2;
  }
  const session_stats st = session->stats();
  std::printf("session_worker[%d]: %d rounds ok; %llu bytes in, %llu out, %llu frames evicted for others\n", static_cast<int>(getpid()),
              rounds, static_cast<unsigned long long>(st.pager.bytes_in), static_cast<unsigned long long>(st.pager.bytes_out),
              static_cast<unsigned long long>(st.evictions_served));
  check(be.stream_destroy(s), "stream_destroy");
  check(be.host_free(staging), "host_free");
  return 0;
}

// An oversubscribed (low-priority) job for the multi-process tests: a real process with its
// own oversubscribed_session, running without the lock.
//
// usage: oversub_worker <bytes> <seconds> <seed> [<file> <seconds after>]
// Allocates <bytes> (more than the pool, in the tests) in three allocations, writes random
// data, then for <seconds> runs rounds: check every byte against the previous round's data,
// write the next round's. With <file>, the rounds go on until <seconds after> have passed
// since <file> appeared as well (a test creates it when the job's competitor is done, so
// that what follows is timed from that moment, however slow the machine). Every copy is queued inside the launch gate, as the preload shim
// does for a CUDA program's work, so reclaims (demotions) may happen between any two of them.
// OVERSUB_WORKER_FSIZE=<bytes> (with OVERSUB_WORKER_FSIZE_UNTIL=<file>): before its
// allocations the job lowers its RLIMIT_FSIZE below a frame's size, so that creating a host
// frame (a memfd grown to the frame's size) fails, until <file> appears.
// With VRAMSWAP_TEST_HOT_BLOCK=<i> (0, 1 or 2; "alternate": 2 and 0 by turns, 2 s each), every
// round first declares many uses of block i the way the preload shim records a kernel launch's
// (use_tracking::record_launch_words, inside the gate), and none of the others: placement by
// use should move its pages into pool frames. With VRAMSWAP_TEST_WAIT_PLACED=1 as well, the job
// runs on (60 s at most) until a whole round has checked every byte after the first pages
// were placed.
// With VRAMSWAP_TEST_STEPS=<n>, a thread of its own runs "steps" every 50 ms beside the rounds,
// as a training job's stream would: the arena is cut into tensors of 4 MiB, and each step
// launches n times each of tensors 4 and up (through the gate, in a random order, sampled the
// way the shim samples: use_tracking::sample_this_launch), never tensors 0-3. With
// VRAMSWAP_TEST_LIGHT_USE=<n>, the thread instead declares n uses a second (every one
// recorded) of the last page of the last block, and nothing else. With
// VRAMSWAP_TEST_ROTATE=<seconds>, it declares 20 uses a step of one tensor of those first
// backed in host frames (23 down to 16), a different one every <seconds>, so that placement
// keeps moving pages, round after round, while the rounds check every byte. Either way the job also
// prints what placement had done at half of <seconds> (placed_in_at_half, rounds_at_half) and
// the bytes of tensors 0-3 in pool frames at the end (cold_pool_bytes).
// OVERSUB_WORKER_GROW=<bytes>:<file>: when <file> appears, a thread of its own allocates
// <bytes> more (outside the launch gate, so even while the rounds wait at it) and notes how
// much of it landed in pool frames (grown_pool_bytes; -1: never grown); after the rounds the
// job writes and checks that block too.
// Prints one line of numbers (key=value) on stdout. Exit: 0 ok, 2 an API call failed,
// 3 data differed.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <string>
#include <vector>

#include "core/launch_gate.hpp"
#include "core/status.hpp"
#include "runtime/oversubscribed_session.hpp"
#include "runtime/use_tracker.hpp"
#include "support/random_bytes.hpp"
#include "support/signal_files.hpp"
#include "support/worker_exit.hpp"

using namespace vramswap;
using namespace vramswap::detail;

namespace {
constexpr const char* k_program = "oversub_worker";
void check(int rc, const char* what) { test::worker_check(k_program, rc, what); }
struct block {
  device_ptr ptr;
  uint64_t size;
};
}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s <bytes> <seconds> <seed>\n", argv[0]);
    return 64;
  }
  const uint64_t bytes = std::strtoull(argv[1], nullptr, 10);
  const double seconds = std::atof(argv[2]);
  const uint64_t seed = std::strtoull(argv[3], nullptr, 10);
  const char* after_file = argc >= 6 ? argv[4] : nullptr;
  const double seconds_after = argc >= 6 ? std::atof(argv[5]) : 0;
  launch_gate::set_installed();  // this program brackets its device work itself

  std::unique_ptr<oversubscribed_session> session;
  check(oversubscribed_session::open(0, &session), "opening the oversubscribed session");
  const char* fsize = std::getenv("OVERSUB_WORKER_FSIZE");
  const char* fsize_until = std::getenv("OVERSUB_WORKER_FSIZE_UNTIL");
  rlimit fsize_before{};
  bool fsize_lowered = false;
  // After the session's open: a pool server it started must not inherit the limit.
  if (fsize != nullptr && fsize_until != nullptr) {
    ::signal(SIGXFSZ, SIG_IGN);  // the failing ftruncate then says EFBIG
    if (::getrlimit(RLIMIT_FSIZE, &fsize_before) != 0) return 2;
    rlimit low = fsize_before;
    low.rlim_cur = std::strtoull(fsize, nullptr, 10);
    if (::setrlimit(RLIMIT_FSIZE, &low) != 0) return 2;
    fsize_lowered = true;
  }
  // A thread of its own puts the limit back: the rounds may be held at the launch gate (a
  // lock holder's hold) when <file> appears.
  std::thread fsize_watch;
  if (fsize_lowered) {
    fsize_watch = std::thread([&] {
      test::wait_for_signal_file(fsize_until, 600, k_program);  // the limit goes back even past the bound
      if (::setrlimit(RLIMIT_FSIZE, &fsize_before) != 0) std::fprintf(stderr, "oversub_worker: setrlimit(RLIMIT_FSIZE) back failed\n");
    });
  }
  backend& be = session->get_backend();
  // The block allocated later (OVERSUB_WORKER_GROW), by its own thread.
  block grown{0, 0};
  std::atomic<int64_t> grown_pool_bytes{-1};
  std::thread grower;
  if (const char* grow = std::getenv("OVERSUB_WORKER_GROW"); grow != nullptr && std::strchr(grow, ':') != nullptr) {
    grown.size = std::strtoull(grow, nullptr, 10);
    const std::string grow_file = std::strchr(grow, ':') + 1;
    grower = std::thread([&, grow_file] {
      test::wait_for_signal_file(grow_file.c_str(), 600, k_program);
      check(session->memory().malloc(grown.size, &grown.ptr), "malloc (growing)");
      grown_pool_bytes = static_cast<int64_t>(session->pool_bytes_of(grown.ptr, grown.size));
    });
  }
  std::vector<block> blocks;
  for (uint64_t size : {bytes / 2, bytes / 3, bytes - bytes / 2 - bytes / 3}) {
    device_ptr p = 0;
    check(session->memory().malloc(size, &p), "malloc");
    blocks.push_back({p, size});
  }
  void* staging = nullptr;
  check(be.host_alloc(blocks[0].size, &staging), "host_alloc");
  stream_id s = 0;
  check(be.stream_create(0, &s), "stream_create");
  const oversubscribed_stats at_start = session->stats();

  const auto t0 = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point file_seen{};
  auto done = [&] {
    const auto now = std::chrono::steady_clock::now();
    if (std::chrono::duration<double>(now - t0).count() < seconds) return false;
    if (after_file == nullptr) return true;
    if (file_seen == std::chrono::steady_clock::time_point{}) {
      if (::access(after_file, F_OK) != 0) return std::chrono::duration<double>(now - t0).count() >= 600;  // bounded
      file_seen = now;
    }
    return std::chrono::duration<double>(now - file_seen).count() >= seconds_after;
  };
  const char* hot_env = std::getenv("VRAMSWAP_TEST_HOT_BLOCK");
  const bool alternate = hot_env != nullptr && std::string(hot_env) == "alternate";
  const int hot_fixed = hot_env != nullptr && !alternate ? std::atoi(hot_env) : -1;
  auto hot_block = [&]() -> int {
    if (!alternate) return hot_fixed >= 0 && hot_fixed < 3 ? hot_fixed : -1;
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return static_cast<int>(t / 2.0) % 2 == 0 ? 2 : 0;
  };
  const bool wait_placed = std::getenv("VRAMSWAP_TEST_WAIT_PLACED") != nullptr;
  // The tensors of the steps: 4 MiB pieces of the blocks, in address order.
  std::vector<block> tensors;
  for (const block& b : blocks) {
    for (uint64_t at = 0; at + (4ull << 20) <= b.size; at += 4ull << 20) tensors.push_back({b.ptr + at, 4ull << 20});
  }
  const char* steps_env = std::getenv("VRAMSWAP_TEST_STEPS");
  const char* light_env = std::getenv("VRAMSWAP_TEST_LIGHT_USE");
  const unsigned launches_per_step = steps_env != nullptr ? static_cast<unsigned>(std::atoi(steps_env)) : 0;
  const unsigned light_uses = light_env != nullptr ? static_cast<unsigned>(std::atoi(light_env)) : 0;
  const char* rotate_env = std::getenv("VRAMSWAP_TEST_ROTATE");
  const double rotate_s = rotate_env != nullptr ? std::atof(rotate_env) : 0;
  std::atomic<bool> stop_steps{false};
  std::atomic<uint64_t> placed_in_at_half{0};
  std::atomic<uint64_t> rounds_at_half{0};
  std::thread stepper;
  if (launches_per_step > 0 || light_uses > 0 || rotate_s > 0) {
    stepper = std::thread([&] {
      std::mt19937 rng(static_cast<unsigned>(seed));
      bool half_taken = false;
      std::vector<size_t> launches;
      const auto page = session->memory().frame_size();
      const uint64_t light_word = blocks.back().ptr + blocks.back().size - page;
      for (int step = 0; !stop_steps.load(); ++step) {
        if (!half_taken && std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() >= seconds / 2) {
          const oversubscribed_stats h = session->stats();
          placed_in_at_half = h.pages_placed_in;
          rounds_at_half = h.placement_rounds;
          half_taken = true;
        }
        {
          launch_gate::pass gate;
          if (rotate_s > 0 && tensors.size() >= 24) {
            const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            const block& hot = tensors[23 - static_cast<size_t>(t / rotate_s) % 8];  // from the end: each moves alone
            const uint64_t words[] = {hot.ptr, hot.size};
            for (int i = 0; i < 20; ++i) use_tracking::record_launch_words(words, 2);
          } else if (launches_per_step > 0) {
            launches.clear();
            for (size_t t = 4; t < tensors.size(); ++t) launches.insert(launches.end(), launches_per_step, t);
            std::shuffle(launches.begin(), launches.end(), rng);
            for (size_t t : launches) {
              if (!use_tracking::sample_this_launch()) continue;
              const uint64_t words[] = {tensors[t].ptr, tensors[t].size, 1};
              use_tracking::record_launch_words(words, 3, use_tracking::k_sample_every);
            }
          } else if (step % 20 == 0) {
            const uint64_t words[] = {light_word, page};
            for (unsigned i = 0; i < light_uses; ++i) use_tracking::record_launch_words(words, 2);
          }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    });
  }
  int round = 0;
  int placed_at_round = -1;  // the first round that began after pages were placed
  for (;; ++round) {
    if (placed_at_round < 0 && session->stats().pages_placed_in > 0) placed_at_round = round;
    if (const int hot = hot_block(); hot >= 0) {
      // A launch's argument words: the block's start, a length and a flag that are no pointers.
      const uint64_t words[] = {blocks[hot].ptr, blocks[hot].size, 1, 0};
      launch_gate::pass gate;
      for (int i = 0; i < 200; ++i) use_tracking::record_launch_words(words, 4);
    }
    for (size_t i = 0; i < blocks.size(); ++i) {
      const block& b = blocks[i];
      if (round > 0) {
        {
          launch_gate::pass gate;
          check(be.copy_d2h(staging, b.ptr, b.size, s), "copy_d2h");
        }
        check(be.stream_synchronize(s), "sync");
        const size_t bad = test::first_mismatch(staging, b.size, seed * 1000003 + (round - 1) * 101 + i);
        if (bad != b.size) {
          std::fprintf(stderr, "oversub_worker[%d]: round %d: byte %zu of block %zu differs from what round %d wrote\n",
                       static_cast<int>(getpid()), round, bad, i, round - 1);
          return 3;
        }
      }
      test::fill_random(staging, b.size, seed * 1000003 + round * 101 + i);
      {
        launch_gate::pass gate;
        check(be.copy_h2d(b.ptr, staging, b.size, s), "copy_h2d");
      }
      check(be.stream_synchronize(s), "sync");
    }
    const bool placed_and_checked = placed_at_round >= 0 && round >= placed_at_round;
    const bool waiting_for_placement = wait_placed && !placed_and_checked &&
                                       std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 60;
    if (done() && !waiting_for_placement) break;
  }
  if (fsize_watch.joinable()) fsize_watch.join();
  if (grower.joinable()) grower.join();
  if (grown.size > 0) {
    const uint64_t part = std::min(grown.size, blocks[0].size);  // what the staging buffer holds
    test::fill_random(staging, part, seed * 1000003 + 7);
    {
      launch_gate::pass gate;
      check(be.copy_h2d(grown.ptr, staging, part, s), "copy_h2d (grown)");
    }
    check(be.stream_synchronize(s), "sync");
    std::memset(staging, 0, part);
    {
      launch_gate::pass gate;
      check(be.copy_d2h(staging, grown.ptr, part, s), "copy_d2h (grown)");
    }
    check(be.stream_synchronize(s), "sync");
    if (test::first_mismatch(staging, part, seed * 1000003 + 7) != part) {
      std::fprintf(stderr, "oversub_worker[%d]: the block allocated later does not hold what was written\n", static_cast<int>(getpid()));
      return 3;
    }
  }
  stop_steps = true;
  if (stepper.joinable()) stepper.join();
  // The numbers once the service thread's moves have settled: a placement round counts its
  // moves when it ends, while the frame bytes change as it goes, so a snapshot taken during
  // one would show pages moved out and not yet in. Settled: the same numbers for 1 s.
  const oversubscribed_stats st = [&] {
    auto same = [](const oversubscribed_stats& a, const oversubscribed_stats& b) {
      return a.placement_rounds == b.placement_rounds && a.pages_placed_in == b.pages_placed_in &&
             a.pages_placed_out == b.pages_placed_out && a.pages_promoted == b.pages_promoted &&
             a.pool_frame_bytes == b.pool_frame_bytes && a.host_frame_bytes == b.host_frame_bytes;
    };
    oversubscribed_stats last = session->stats();
    for (int calm = 0, tries = 0; calm < 4 && tries < 40; ++tries) {
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
      const oversubscribed_stats now = session->stats();
      calm = same(now, last) ? calm + 1 : 0;
      last = now;
    }
    return last;
  }();
  uint64_t cold_pool = 0;
  for (size_t t = 0; t < std::min<size_t>(4, tensors.size()); ++t) cold_pool += session->pool_bytes_of(tensors[t].ptr, tensors[t].size);
  const int hot_end = hot_block();
  const uint64_t hot_pool = hot_end >= 0 ? session->pool_bytes_of(blocks[hot_end].ptr, blocks[hot_end].size) : 0;
  const uint64_t hot_size = hot_end >= 0 ? blocks[hot_end].size : 0;
  std::printf("rounds=%d start_host_bytes=%" PRIu64 " host_bytes=%" PRIu64 " pool_bytes=%" PRIu64 " demoted=%" PRIu64
              " promoted=%" PRIu64 " reclaims=%" PRIu64 " bursts=%" PRIu64 " reclaim_ms=%.3f spare_bytes=%" PRIu64
              " yield_waits=%" PRIu64 " yield_ms=%.3f made_ahead=%" PRIu64 " created_in_reclaim=%" PRIu64
              " placement_rounds=%" PRIu64 " placed_in=%" PRIu64 " placed_out=%" PRIu64
              " hot_bytes=%" PRIu64 " hot_pool_bytes=%" PRIu64 " rounds_after_placement=%d placement_skipped=%" PRIu64
              " placed_in_at_half=%" PRIu64 " placement_rounds_at_half=%" PRIu64 " cold_pool_bytes=%" PRIu64 " lingers=%" PRIu64
              " lingers_caught=%" PRIu64 " linger_ms=%.3f lingers_skipped=%" PRIu64 " grown_pool_bytes=%" PRId64 "\n",
              round + 1, at_start.host_frame_bytes, st.host_frame_bytes, st.pool_frame_bytes, st.pages_demoted, st.pages_promoted,
              st.demotions, st.bursts, st.demote_seconds * 1e3, st.spare_host_bytes, st.yield_waits, st.yield_seconds * 1e3,
              st.host_frames_made_ahead, st.host_frames_created_in_reclaim, st.placement_rounds, st.pages_placed_in,
              st.pages_placed_out, hot_size, hot_pool, placed_at_round >= 0 ? round - placed_at_round + 1 : 0,
              st.placement_rounds_skipped, placed_in_at_half.load(), rounds_at_half.load(), cold_pool, st.lingers,
              st.lingers_caught, st.linger_seconds * 1e3, st.lingers_skipped, grown_pool_bytes.load());
  std::fflush(stdout);
  check(be.stream_destroy(s), "stream_destroy");
  check(be.host_free(staging), "host_free");
  return 0;
}

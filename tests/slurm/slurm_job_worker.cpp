// The program each Slurm job of tests/slurm runs: one vramswap client on device 0, in the mode
// its environment asks for. The point is that the settings the TaskProlog printed reach
// vramswap: the mode is what vramswap's own options say (VRAMSWAP_OVERSUBSCRIBE), not an
// argument.
//
// usage: slurm_job_worker <barrier-dir> <jobs> <bytes> <turns> <hold-ms> <oversub-seconds>
//
// Every job first waits at a barrier (a file per job in <barrier-dir>, up to 60 s for all
// <jobs>): if Slurm does not run them at the same time, the jobs fail here, saying so.
// Then:
//   time-sharing (VRAMSWAP_OVERSUBSCRIBE unset or 0): allocate <bytes>, and <turns> times take
//     the lock, check every byte the previous turn wrote, write new random bytes, hold the
//     lock <hold-ms>, release. One line per turn: "turn <granted-ns> <released-ns>"
//     (CLOCK_MONOTONIC, comparable across the jobs of one machine).
//   oversubscribed (VRAMSWAP_OVERSUBSCRIBE=1): no lock; allocate <bytes>, and for
//     <oversub-seconds> write random bytes and check every one of them, round after round,
//     while the time-sharing jobs take its pool frames back. One line: "oversub rounds=..
//     demoted=.. promoted=..".
// Always: "mode <name>" first, "span <start-ns> <end-ns>" last (from the barrier to the end).
// Exit: 0 ok, 2 a vramswap call failed, 3 a byte differed, 4 the barrier timed out, 64 usage.
#include <dirent.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "core/launch_gate.hpp"
#include "core/options.hpp"
#include "core/status.hpp"
#include "lock/process_identity.hpp"
#include "runtime/device_session.hpp"
#include "runtime/oversubscribed_session.hpp"
#include "support/random_bytes.hpp"
#include "support/worker_exit.hpp"

using namespace vramswap;
using namespace vramswap::detail;

namespace {

constexpr const char* k_program = "slurm_job_worker";
void check(int rc, const char* what) { test::worker_check(k_program, rc, what); }

const char* job_id() {
  const char* id = std::getenv("SLURM_JOB_ID");
  return id != nullptr ? id : "(no SLURM_JOB_ID)";
}

// Each job announces itself with a file, then waits until all <jobs> have.
bool barrier(const std::string& dir, int jobs) {
  const std::string mine = dir + "/ready." + std::to_string(getpid());
  const int fd = ::open(mine.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::fprintf(stderr, "%s: job %s cannot create its barrier file %s: %m\n", k_program, job_id(), mine.c_str());
    return false;
  }
  ::close(fd);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    int seen = 0;
    if (DIR* d = ::opendir(dir.c_str())) {
      while (const dirent* e = ::readdir(d)) seen += std::strncmp(e->d_name, "ready.", 6) == 0;
      ::closedir(d);
    }
    if (seen >= jobs) return true;
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr,
                   "%s: job %s: only %d of %d jobs reached the barrier in %s within 60 s: Slurm did not run them at the same "
                   "time (check the node's CPUs, the partitions' OverSubscribe and the GRES count in slurm.conf/gres.conf)\n",
                   k_program, job_id(), seen, jobs, dir.c_str());
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

uint64_t random_seed() {
  uint64_t seed = 0;
  if (::getrandom(&seed, sizeof seed, 0) != sizeof seed) seed = monotonic_ns();
  return seed;
}

// Both modes allocate before the barrier: the oversubscribed jobs' allocations then take pool
// frames (lent) before any time-sharing job takes the lock, so that the lock holders must
// take those frames back (a demotion) while the jobs run.
using barrier_fn = std::function<bool()>;

// What each mode works with: `bytes` of device memory from its session, a host staging
// buffer of the same size, and a stream.
struct workspace {
  backend& be;
  device_ptr buf = 0;
  void* staging = nullptr;
  stream_id st = 0;

  template <typename Session>
  workspace(Session& s, uint64_t bytes) : be(s.get_backend()) {
    check(s.memory().malloc(bytes, &buf), "malloc");
    check(be.host_alloc(bytes, &staging), "host_alloc");
    check(be.stream_create(0, &st), "stream_create");
  }
  ~workspace() {
    check(be.stream_destroy(st), "stream_destroy");
    check(be.host_free(staging), "host_free");
  }
};

int time_sharing(uint64_t bytes, int turns, int hold_ms, uint64_t seed, const barrier_fn& meet) {
  std::unique_ptr<device_session> s;
  check(device_session::open(0, &s), "opening the time-sharing session of device 0");
  workspace w(*s, bytes);
  auto& [be, buf, staging, st] = w;
  if (!meet()) return 4;
  const uint64_t start = monotonic_ns();
  for (int turn = 0; turn < turns; ++turn) {
    check(s->acquire(), "acquire");
    const uint64_t granted = s->stats().last_lock_granted_ns;
    if (turn > 0) {  // every byte written last turn is still there, whoever held the device since
      check(be.copy_d2h(staging, buf, bytes, st), "copy_d2h");
      check(be.stream_synchronize(st), "sync");
      const size_t bad = test::first_mismatch(staging, bytes, seed + turn - 1);
      if (bad != bytes) {
        std::fprintf(stderr, "%s: job %s: turn %d: byte %zu of %" PRIu64 " differs from what turn %d wrote\n", k_program, job_id(),
                     turn + 1, bad, bytes, turn);
        return 3;
      }
    }
    test::fill_random(staging, bytes, seed + turn);
    check(be.copy_h2d(buf, staging, bytes, st), "copy_h2d");
    check(be.stream_synchronize(st), "sync");
    std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms));
    const uint64_t released = monotonic_ns();
    check(s->release(), "release");
    std::printf("turn %" PRIu64 " %" PRIu64 "\n", granted, released);
    std::fflush(stdout);
  }
  const session_stats ss = s->stats();
  std::printf("time-sharing turns=%d bytes_in=%" PRIu64 " bytes_out=%" PRIu64 "\n", turns, ss.pager.bytes_in, ss.pager.bytes_out);
  std::printf("span %" PRIu64 " %" PRIu64 "\n", start, monotonic_ns());
  return 0;
}

int oversubscribed(uint64_t bytes, double seconds, uint64_t seed, const barrier_fn& meet) {
  launch_gate::set_installed();  // this program brackets its device work itself, as the preload shim does
  std::unique_ptr<oversubscribed_session> s;
  check(oversubscribed_session::open(0, &s), "opening the oversubscribed session of device 0");
  workspace w(*s, bytes);
  auto& [be, buf, staging, st] = w;
  if (!meet()) return 4;
  const uint64_t start = monotonic_ns();
  const auto t0 = std::chrono::steady_clock::now();
  int round = 0;
  for (;; ++round) {
    if (round > 0) {
      {
        launch_gate::pass gate;  // a reclaim moves pages only between copies, never under one
        check(be.copy_d2h(staging, buf, bytes, st), "copy_d2h");
      }
      check(be.stream_synchronize(st), "sync");
      const size_t bad = test::first_mismatch(staging, bytes, seed + round - 1);
      if (bad != bytes) {
        std::fprintf(stderr, "%s: job %s: round %d: byte %zu of %" PRIu64 " differs from what round %d wrote\n", k_program, job_id(),
                     round + 1, bad, bytes, round);
        return 3;
      }
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() >= seconds) break;
    test::fill_random(staging, bytes, seed + round);
    {
      launch_gate::pass gate;
      check(be.copy_h2d(buf, staging, bytes, st), "copy_h2d");
    }
    check(be.stream_synchronize(st), "sync");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const oversubscribed_stats os = s->stats();
  std::printf("oversub rounds=%d demoted=%" PRIu64 " promoted=%" PRIu64 "\n", round, os.pages_demoted, os.pages_promoted);
  std::printf("span %" PRIu64 " %" PRIu64 "\n", start, monotonic_ns());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: %s <barrier-dir> <jobs> <bytes> <turns> <hold-ms> <oversub-seconds>\n", argv[0]);
    return 64;
  }
  const uint64_t bytes = std::strtoull(argv[3], nullptr, 10);
  check(validate_options(), "checking the VRAMSWAP_* settings the job was given");
  uint64_t over = 0;
  check(option_uint(option_id::oversubscribe, &over), "VRAMSWAP_OVERSUBSCRIBE");
  std::printf("mode %s\n", over == 1 ? "oversubscribed" : "time-sharing");
  std::fflush(stdout);
  const std::string dir = argv[1];
  const int jobs = std::atoi(argv[2]);
  const barrier_fn meet = [&] { return barrier(dir, jobs); };
  const uint64_t seed = random_seed();
  const int rc = over == 1 ? oversubscribed(bytes, std::atof(argv[6]), seed, meet)
                           : time_sharing(bytes, std::atoi(argv[4]), std::atoi(argv[5]), seed, meet);
  std::fflush(stdout);
  return rc;  // the session closed when its function returned: the pool sees this job leave, not die
}

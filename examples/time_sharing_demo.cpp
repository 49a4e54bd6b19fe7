// time_sharing_demo: several processes whose memory does not fit on the device together take
// turns on it, and a timeline shows who held it, for how long, and how many bytes moved.
//
// Build and run (from the repository root):
//   cmake -S . -B build -G Ninja && ninja -C build vramswap_time_sharing_demo vramswapd
//   ./build/examples/vramswap_time_sharing_demo [processes=3] [MiB-each=auto] [rounds=3]
// VRAMSWAP_BACKEND=host|cuda picks the backend (default: cuda where a GPU is usable). The
// pool server vramswapd is started on demand and exits when idle.
//
// The parent starts the workers (this same program, spawned) and prints the timeline from
// what they report. Each worker allocates its memory, fills it with random data, and for
// each round: acquires the device (its memory comes back, evicting others' if needed),
// checks every byte it wrote last round, "trains" (writes new data, holds the lock a
// moment), and releases.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/backend.hpp"
#include "core/options.hpp"
#include "core/status.hpp"
#include "runtime/device_session.hpp"
#include "lock/process_identity.hpp"

extern char** environ;
using namespace vramswap;
using namespace vramswap::detail;

namespace {

constexpr uint64_t MiB = 1ull << 20;

// The demo's value for an option the user left unset: in this process's options (which read
// the environment once, already) and in the environment the workers are spawned with.
void default_setting(option_id id, const char* value) {
  if (!option_is_default(id)) return;
  option_set(id, value);
  ::setenv(describe(id).env_name, value, 1);
}

void check(int rc, const char* what) {
  if (rc == ok) return;
  std::fprintf(stderr, "time_sharing_demo[%d]: %s failed: %s: %s\n", static_cast<int>(getpid()), what, status_name(rc), last_error());
  std::exit(1);
}

void fill(uint64_t* p, uint64_t words, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (uint64_t i = 0; i < words; ++i) p[i] = rng() | 1;
}

// One line per turn on stdout: "turn <worker> <acquire called> <lock granted> <memory resident> <released> <bytes in>"
// (times in CLOCK_MONOTONIC nanoseconds, comparable across the workers)
int run_worker(int id, uint64_t bytes, int rounds) {
  std::unique_ptr<device_session> s;
  check(device_session::open(0, &s), "opening the device session");
  backend& be = s->get_backend();
  device_ptr buf = 0;
  check(s->memory().malloc(bytes, &buf), "malloc");
  uint64_t* host = nullptr;
  check(be.host_alloc(bytes, reinterpret_cast<void**>(&host)), "host_alloc");
  std::vector<uint64_t> expect(bytes / 8);
  stream_id st = 0;
  check(be.stream_create(0, &st), "stream_create");
  for (int r = 0; r < rounds; ++r) {
    const uint64_t asked = monotonic_ns();
    const pager_stats before = s->memory().stats();
    check(s->acquire(), "acquire");
    const uint64_t resident = monotonic_ns();
    if (r > 0) {  // every byte written last turn is still there
      check(be.copy_d2h(host, buf, bytes, st), "copy_d2h");
      check(be.stream_synchronize(st), "sync");
      if (std::memcmp(host, expect.data(), bytes) != 0) {
        std::fprintf(stderr, "worker %d: DATA DIFFERS after acquire %d\n", id, r + 1);
        return 3;
      }
    }
    fill(expect.data(), expect.size(), 1000 * id + r);  // this turn's "training step"
    std::memcpy(host, expect.data(), bytes);
    check(be.copy_h2d(buf, host, bytes, st), "copy_h2d");
    check(be.stream_synchronize(st), "sync");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const uint64_t released = monotonic_ns();
    check(s->release(), "release");
    const pager_stats after = s->memory().stats();
    std::printf("turn %d %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", id, asked, s->stats().last_lock_granted_ns,
                resident, released, after.bytes_in - before.bytes_in);
    std::fflush(stdout);
  }
  check(be.stream_destroy(st), "stream_destroy");
  check(be.host_free(host), "host_free");
  return 0;
}

struct turn {
  int worker;
  uint64_t asked, granted, resident, released, bytes_in;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc == 5 && std::strcmp(argv[1], "--worker") == 0) {
    return run_worker(std::atoi(argv[2]), std::strtoull(argv[3], nullptr, 10), std::atoi(argv[4]));
  }
  const int procs = argc > 1 ? std::max(2, std::atoi(argv[1])) : 3;
  const int rounds = argc > 3 ? std::max(1, std::atoi(argv[3])) : 3;
  backend* be = nullptr;
  check(default_backend(&be), "choosing a backend");
  device_info info;
  check(be->get_device_info(0, &info), "get_device_info");
  // Memory per process: 60% of the pool each, so that no two fit at once. The demo's pool
  // is kept small (VRAMSWAP_POOL_SIZE, default here 256 MiB) so it runs anywhere.
  default_setting(option_id::pool_size, "256MiB");
  uint64_t pool = 0;
  check(option_size(option_id::pool_size, &pool, info.total_bytes), "VRAMSWAP_POOL_SIZE");
  default_setting(option_id::frame_size, "2MiB");
  // The pool server it starts goes away soon after the demo (unless one was already running).
  default_setting(option_id::pool_idle_exit, "10");
  const uint64_t each = argc > 2 ? std::strtoull(argv[2], nullptr, 10) * MiB : pool * 6 / 10 / MiB * MiB;
  std::printf("device 0: %s (%s backend); pool %.0f MiB; %d processes of %.0f MiB each (%.1fx the pool together), %d turns each\n\n",
              info.name.c_str(), be->name(), pool / double(MiB), procs, each / double(MiB), procs * double(each) / pool, rounds);

  std::vector<pid_t> pids;
  std::vector<FILE*> outs;
  for (int i = 0; i < procs; ++i) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return 1;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    std::string id = std::to_string(i), bytes = std::to_string(each), r = std::to_string(rounds);
    char* args[] = {argv[0], const_cast<char*>("--worker"), id.data(), bytes.data(), r.data(), nullptr};
    pid_t pid = -1;
    if (::posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, args, environ) != 0) return 1;
    posix_spawn_file_actions_destroy(&fa);
    ::close(fds[1]);
    pids.push_back(pid);
    outs.push_back(::fdopen(fds[0], "r"));
  }
  std::vector<turn> turns;
  std::vector<std::thread> readers;
  std::vector<std::vector<turn>> per(procs);
  for (int i = 0; i < procs; ++i) {
    readers.emplace_back([&, i] {
      char line[256];
      while (std::fgets(line, sizeof line, outs[i]) != nullptr) {
        turn t{};
        if (std::sscanf(line, "turn %d %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64, &t.worker, &t.asked, &t.granted,
                        &t.resident, &t.released, &t.bytes_in) == 6) {
          per[i].push_back(t);
        }
      }
    });
  }
  for (auto& r : readers) r.join();
  bool all_ok = true;
  for (int i = 0; i < procs; ++i) {
    int status = 0;
    ::waitpid(pids[i], &status, 0);
    all_ok = all_ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    turns.insert(turns.end(), per[i].begin(), per[i].end());
  }
  std::sort(turns.begin(), turns.end(), [](const turn& a, const turn& b) { return a.granted < b.granted; });
  if (turns.empty()) return 1;
  const uint64_t t0 = turns.front().asked;
  std::printf("%10s  %-9s %12s %14s %9s %10s\n", "start(ms)", "holder", "waited(ms)", "bring-in(ms)", "held(ms)", "moved in");
  for (const turn& t : turns) {
    std::printf("%10.1f  worker %-2d %12.1f %14.1f %9.1f %6.1f MiB\n", (t.granted - t0) / 1e6, t.worker, (t.granted - t.asked) / 1e6,
                (t.resident - t.granted) / 1e6, (t.released - t.resident) / 1e6, t.bytes_in / double(MiB));
  }
  std::printf("\n%s: every worker found every byte it wrote intact after every acquire.\n", all_ok ? "OK" : "FAILED");
  return all_ok ? 0 : 1;
}

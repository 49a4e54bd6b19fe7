// bench_host_pool_spill: two time-sharing processes whose saved pages do not fit the device's
// shared host pool, with the swap file behind it (VRAMSWAP_HOST_POOL with VRAMSWAP_SWAP_DIR).
//
//   bench_host_pool_spill [--size 40] [--host-pool 24] [--pool SIZE+1] [--rounds 3] [--frame 32]
//                                                                          (GiB; --frame MiB)
//
// Defaults with the cuda backend; with the host backend --size 0.25 --host-pool 0.15
// --pool 0.3 --frame 2 (a shared host pool needs at least 17 slots). Swap files go to VRAMSWAP_SWAP_DIR (default /var/tmp). Two worker processes of
// --size each take turns under the lock on a pool that holds one of them; the host pool holds
// --host-pool, so the rest of what the idle process saves goes to its swap file. Every turn
// the holder checks every byte of its memory against what it wrote the turn before (random
// words, a new seed each turn) and writes new ones: a lost, stale or misplaced byte fails the
// run. Each counted handoff (release called to the other's acquire returning, all its memory
// resident) reports the disk bytes the releaser wrote and the acquirer read (/proc/<pid>/io)
// and its time as a ratio to the least time the disk needs for those bytes at its ceiling:
// an io_uring O_DIRECT writer and reader (bench/support/uring_ceiling.hpp) on the same
// directory, measured in the same run. 1.0 would be a handoff as fast as the disk allows.
//
// Internal mode: --worker <bytes> <rounds> <seed> (a session client printing events).
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/backend.hpp"
#include "core/options.hpp"
#include "core/status.hpp"
#include "lock/process_identity.hpp"
#include "runtime/device_session.hpp"
#include "support/bench_util.hpp"
#include "support/spawn_self.hpp"
#include "support/uring_ceiling.hpp"

extern char** environ;
using namespace vramswap;
using namespace vramswap::detail;
using bench::check;
using bench::child;
using bench::spawn_self;

namespace {

constexpr uint64_t MiB = 1ull << 20;
constexpr uint64_t GiB = 1ull << 30;

// The word at `index` of the data written with `seed` (splitmix64: every word differs).
inline uint64_t word(uint64_t seed, uint64_t index) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + index + 1;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Runs fn(begin, end) over [0, n) on all cores.
template <class Fn>
void parallel(uint64_t n, Fn fn) {
  const unsigned threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([=] { fn(n * t / threads, n * (t + 1) / threads); });
  }
  for (auto& th : pool) th.join();
}

// Disk bytes this process caused to be written and read (/proc/self/io, all its threads).
void disk_io(uint64_t* written, uint64_t* read) {
  *written = *read = 0;
  FILE* f = std::fopen("/proc/self/io", "r");
  if (f == nullptr) return;
  char line[128];
  unsigned long long v = 0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::sscanf(line, "write_bytes: %llu", &v) == 1) *written = v;
    if (std::sscanf(line, "read_bytes: %llu", &v) == 1) *read = v;
  }
  std::fclose(f);
}

// --- worker --------------------------------------------------------------------------------
// Turn r (0..rounds): acquire; check the words of turn r-1; write those of turn r (not after
// the last); release. Prints one line per acquire and per release.
int run_worker(uint64_t bytes, int rounds, uint64_t seed) {
  std::unique_ptr<device_session> s;
  check(device_session::open(0, &s), "session");
  backend& be = s->get_backend();
  device_ptr p = 0;
  check(s->memory().malloc(bytes, &p), "malloc");
  stream_id st = 0;
  check(be.stream_create(0, &st), "stream");
  const size_t chunk = static_cast<size_t>(std::min<uint64_t>(bytes, 256 * MiB));
  void* staging = nullptr;
  check(be.host_alloc(chunk, &staging), "pinned staging buffer");
  auto* words = static_cast<uint64_t*>(staging);
  std::printf("attached\n");
  std::fflush(stdout);
  const char* dir = std::getenv("VRAMSWAP_RUNTIME_DIR");
  const std::string go = std::string(dir != nullptr ? dir : "/tmp") + "/bench-go";
  while (::access(go.c_str(), F_OK) != 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  uint64_t bad_total = 0;
  for (int r = 0; r <= rounds; ++r) {
    check(s->acquire(), "acquire");
    const uint64_t acquired = monotonic_ns();
    uint64_t w = 0, rd = 0;
    disk_io(&w, &rd);
    std::printf("acquired %" PRIu64 " wrote %" PRIu64 " read %" PRIu64 "\n", acquired, w, rd);
    std::fflush(stdout);
    uint64_t bad = 0;
    for (uint64_t off = 0; off < bytes; off += chunk) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk, bytes - off));
      const uint64_t first = off / 8;
      if (r > 0) {
        check(be.copy_d2h(staging, p + off, n, st), "copy out for the check");
        check(be.stream_synchronize(st), "check sync");
        std::atomic<uint64_t> chunk_bad{0};
        parallel(n / 8, [&](uint64_t b, uint64_t e) {
          uint64_t mine = 0;
          for (uint64_t i = b; i < e; ++i) mine += words[i] != word(seed + static_cast<uint64_t>(r - 1), first + i);
          chunk_bad += mine;
        });
        bad += chunk_bad;
      }
      if (r < rounds) {
        parallel(n / 8, [&](uint64_t b, uint64_t e) {
          for (uint64_t i = b; i < e; ++i) words[i] = word(seed + static_cast<uint64_t>(r), first + i);
        });
        check(be.copy_h2d(p + off, staging, n, st), "copy in of the new words");
        check(be.stream_synchronize(st), "write sync");
      }
    }
    if (r > 0) std::printf("checked %" PRIu64 " bad_words %" PRIu64 "\n", bytes, bad);
    bad_total += bad;
    const uint64_t released = monotonic_ns();
    check(s->release(), "release");
    disk_io(&w, &rd);
    std::printf("release %" PRIu64 " wrote %" PRIu64 " read %" PRIu64 "\n", released, w, rd);
    std::fflush(stdout);
  }
  check(be.host_free(staging), "staging");
  check(be.stream_destroy(st), "stream");
  return bad_total == 0 ? 0 : 3;
}


struct event {
  uint64_t ns = 0;
  int who = 0;
  bool acquire = false;
  uint64_t wrote = 0, read = 0;  // /proc/<pid>/io at the event
};

double gib_flag(int argc, char** argv, const char* name, double fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return std::atof(argv[i + 1]);
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 5 && std::strcmp(argv[1], "--worker") == 0) {
    return run_worker(std::strtoull(argv[2], nullptr, 10), std::atoi(argv[3]), std::strtoull(argv[4], nullptr, 10));
  }
  backend* be = nullptr;  // only to know which backend the workers will have
  check(default_backend(&be), "backend");
  const bool gpu = be->kind() == backend_kind::cuda;
  const double size_gib = gib_flag(argc, argv, "--size", gpu ? 40 : 0.25);
  const double host_pool_gib = gib_flag(argc, argv, "--host-pool", gpu ? 24 : 0.15);
  const double pool_gib = gib_flag(argc, argv, "--pool", gpu ? size_gib + 1 : 0.3);
  const int rounds = static_cast<int>(gib_flag(argc, argv, "--rounds", 3));
  const uint64_t frame = static_cast<uint64_t>(gib_flag(argc, argv, "--frame", gpu ? 32 : 2)) * MiB;
  auto bytes_of = [&](double gib) { return static_cast<uint64_t>(gib * GiB) / frame * frame; };
  const uint64_t bytes = bytes_of(size_gib), host_pool = bytes_of(host_pool_gib), pool = bytes_of(pool_gib);
  const char* dir_env = std::getenv("VRAMSWAP_SWAP_DIR");
  const std::string swap_dir = dir_env != nullptr && *dir_env != '\0' ? dir_env : "/var/tmp";

  // The disk's ceiling first, on a quiet disk.
  const uint64_t ceiling_bytes = std::min<uint64_t>(gpu ? 8 * GiB : 256 * MiB, std::max(bytes, 64 * MiB));
  double cw = 0, cr = 0;
  if (!bench::ceiling(swap_dir, ceiling_bytes, 32, MiB, &cw, &cr)) return 1;
  const double ceil_w = bench::gbps(ceiling_bytes, cw), ceil_r = bench::gbps(ceiling_bytes, cr);

  char dir[] = "/tmp/vramswap-spill-XXXXXX";
  if (::mkdtemp(dir) == nullptr) check(fail_errno(errno, "mkdtemp"), "runtime dir");
  const std::string prefix = "vsspill" + std::to_string(::getpid()) + "-";
  const std::vector<std::string> env = {"VRAMSWAP_SHM_PREFIX=" + prefix, std::string("VRAMSWAP_RUNTIME_DIR=") + dir,
                                        "VRAMSWAP_POOL_SIZE=" + std::to_string(pool), "VRAMSWAP_POOL_IDLE_EXIT=2",
                                        "VRAMSWAP_LOG=warn", "VRAMSWAP_HOST_POOL=" + std::to_string(host_pool),
                                        "VRAMSWAP_SWAP_DIR=" + swap_dir, "VRAMSWAP_FRAME_SIZE=" + std::to_string(frame)};
  child workers[2];
  for (int i = 0; i < 2; ++i) {
    workers[i] = spawn_self({"bench_host_pool_spill", "--worker", std::to_string(bytes), std::to_string(rounds),
                             std::to_string(1000 * (i + 1))},
                            env);
  }
  char line[256];
  for (child& c : workers) {
    if (std::fgets(line, sizeof line, c.out) == nullptr || std::strncmp(line, "attached", 8) != 0) {
      check(fail(err_system, "a worker did not attach (see its errors above)"), "worker");
    }
  }
  if (FILE* g = std::fopen((std::string(dir) + "/bench-go").c_str(), "w")) std::fclose(g);
  std::vector<event> ev[2];
  uint64_t checked[2] = {0, 0}, bad[2] = {0, 0};
  std::vector<std::thread> readers;
  for (int i = 0; i < 2; ++i) {
    readers.emplace_back([&, i] {
      char l[256];
      while (std::fgets(l, sizeof l, workers[i].out) != nullptr) {
        event e;
        e.who = i;
        uint64_t c = 0, b = 0;
        if (std::sscanf(l, "acquired %" SCNu64 " wrote %" SCNu64 " read %" SCNu64, &e.ns, &e.wrote, &e.read) == 3) {
          e.acquire = true;
          ev[i].push_back(e);
        } else if (std::sscanf(l, "release %" SCNu64 " wrote %" SCNu64 " read %" SCNu64, &e.ns, &e.wrote, &e.read) == 3) {
          ev[i].push_back(e);
        } else if (std::sscanf(l, "checked %" SCNu64 " bad_words %" SCNu64, &c, &b) == 2) {
          checked[i] += c;
          bad[i] += b;
        }
      }
    });
  }
  for (auto& t : readers) t.join();
  int status[2];
  for (int i = 0; i < 2; ++i) ::waitpid(workers[i].pid, &status[i], 0);
  std::this_thread::sleep_for(std::chrono::seconds(3));  // the server leaves after its idle exit
  if (std::system((std::string("rm -rf ") + dir).c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", dir);

  std::printf("# Shared host pool with a swap file behind it\n\n");
  std::printf("Two processes of %.2f GiB each, device pool %.2f GiB, shared host pool %.2f GiB, %" PRIu64
              " MiB frames, swap dir %s, %d turns each (%s backend).\n\n",
              bytes / double(GiB), pool / double(GiB), host_pool / double(GiB), frame / MiB, swap_dir.c_str(), rounds + 1,
              gpu ? "cuda" : "host");
  std::printf("Disk ceiling (io_uring O_DIRECT, QD 32, 1 MiB blocks, %.2f GiB, same run): write %.2f GB/s, read %.2f GB/s.\n\n",
              ceiling_bytes / double(GiB), ceil_w, ceil_r);
  std::printf("| handoff | seconds | releaser wrote GiB | acquirer read GiB | write GB/s | read GB/s | least disk time at the ceiling, s | handoff / least disk time |\n");
  std::printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  // Handoffs: each acquire paired with the other worker's release just before it. The
  // releaser's writes run from its release to its next acquire (its eviction for the other);
  // the acquirer's reads from its previous release to this acquire (its restore).
  std::vector<event> all;
  for (auto& v : ev) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end(), [](const event& x, const event& y) { return x.ns < y.ns; });
  auto next_acquire_of = [&](int who, uint64_t after) -> const event* {
    for (const event& e : ev[who]) {
      if (e.acquire && e.ns > after) return &e;
    }
    return nullptr;
  };
  auto previous_release_of = [&](int who, uint64_t before) -> const event* {
    const event* found = nullptr;
    for (const event& e : ev[who]) {
      if (!e.acquire && e.ns < before) found = &e;
    }
    return found;
  };
  int n = 0, counted_n = 0;
  double sum_ratio = 0;
  for (size_t i = 1; i < all.size(); ++i) {
    const event& acq = all[i];
    const event& rel = all[i - 1];
    if (!acq.acquire || rel.acquire || rel.who == acq.who) continue;
    const event* rel_next = next_acquire_of(rel.who, rel.ns);
    const event* acq_prev = previous_release_of(acq.who, acq.ns);
    const uint64_t wrote = rel_next != nullptr ? rel_next->wrote - rel.wrote : 0;
    const uint64_t read = acq_prev != nullptr ? acq.read - acq_prev->read : 0;
    const double secs = (acq.ns - rel.ns) / 1e9;
    const double least = wrote / 1e9 / ceil_w + read / 1e9 / ceil_r;
    ++n;
    // Not counted: the first handoff (the tiers fill for the first time), and one whose
    // releaser never acquires again (it left: its writes cannot be told from its exit's).
    const bool counted = n > 1 && rel_next != nullptr && acq_prev != nullptr;
    if (counted && least > 0) sum_ratio += secs / least, ++counted_n;
    std::printf("| %d%s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %s |\n", n, counted ? "" : " (not counted)", secs,
                wrote / double(GiB), read / double(GiB), wrote / 1e9 / secs, read / 1e9 / secs, least,
                least > 0 ? (std::to_string(secs / least).substr(0, 4)).c_str() : "no disk traffic");
  }
  const bool ok_run = WIFEXITED(status[0]) && WEXITSTATUS(status[0]) == 0 && WIFEXITED(status[1]) && WEXITSTATUS(status[1]) == 0;
  std::printf("\nEvery byte checked: %.2f GiB by worker 1, %.2f GiB by worker 2, %" PRIu64 " wrong words; workers exited %d / %d.\n",
              checked[0] / double(GiB), checked[1] / double(GiB), bad[0] + bad[1], status[0], status[1]);
  if (counted_n > 0) std::printf("Mean handoff / least disk time (%d counted handoffs): %.2f\n", counted_n, sum_ratio / counted_n);
  if (!ok_run || bad[0] + bad[1] != 0 || checked[0] == 0 || checked[1] == 0) {
    std::fprintf(stderr, "bench_host_pool_spill: FAILED: a worker failed or a word came back wrong\n");
    return 1;
  }
  return 0;
}

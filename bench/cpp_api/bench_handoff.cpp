// bench_handoff: what a switch between two time-sharing processes costs.
//
//   bench_handoff [--sizes 16,32,60] [--fit 8] [--rounds 8] [--shared-above 40]     (GiB)
//
// For each X in --sizes: two worker processes with X GiB of device memory each take turns
// under the lock, on a pool that holds one of them (X + 1 GiB, or X + X/4 when smaller).
// Sizes above --shared-above keep their saved pages in a host pool shared by the two
// (VRAMSWAP_HOST_POOL = X + the same slack, at least 18 slots) instead of a pinned tier
// each: two 60 GiB tiers would pin 120 GiB, the shared pool ~61. Such a size runs only when
// the host's available memory and the device's free memory allow it (else the row says
// why it was skipped), with at most 4 rounds per worker. The handoff is the time
// from the holder calling release() to the other's acquire() returning, all of its memory
// resident: the holder's frames are evicted by the holder while the acquirer copies its own
// memory in. It is reported as a ratio to X / (the one-way pinned copy rate, measured in
// the same run): 1.0 would be a switch as fast as copying one process's memory one way;
// a serial evict-then-restore would be about 2.0. The first two handoffs of each run (tiers
// growing, first-touch) are not counted.
//
// --fit X: the same with a pool that holds both: no byte moves, the handoff is the lock's
// handoff plus bookkeeping (goal p50 <= 50 us).
//
// The same switch done with cuda-checkpoint (cuCheckpointProcessLock + Checkpoint of the
// holder, then Restore + Unlock of the other), on two plain CUDA processes of X GiB each,
// is measured for the smallest X, as the baseline to beat (cuda backend only).
//
// Internal modes: --worker <bytes> <rounds> <hold-ms> (a session client printing events),
// --plain <bytes> (a plain CUDA process for the checkpoint baseline).
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/backend.hpp"
#include "support/bench_util.hpp"
#include "support/spawn_self.hpp"
#include "core/status.hpp"
#include "runtime/device_session.hpp"
#include "lock/process_identity.hpp"

#ifdef VRAMSWAP_HAVE_CUDA_H
#include <cuda.h>
#endif

extern char** environ;
using namespace vramswap;
using namespace vramswap::detail;
using bench::check;
using bench::child;
using bench::spawn_self;
using bench::parse_list;

namespace {

constexpr uint64_t GiB = 1ull << 30;



// --- worker: acquire, hold, release; one line per event on stdout ------------------------
int run_worker(uint64_t bytes, int rounds, int hold_ms) {
  std::unique_ptr<device_session> s;
  check(device_session::open(0, &s), "session");
  device_ptr p = 0;
  check(s->memory().malloc(bytes, &p), "malloc");
  stream_id st = 0;
  check(s->get_backend().stream_create(0, &st), "stream");
  // Start together: attaching to a large shared host pool (mapping and registering it) takes
  // seconds, in which the first worker would otherwise run all its rounds alone.
  std::printf("attached\n");
  std::fflush(stdout);
  const char* dir = std::getenv("VRAMSWAP_RUNTIME_DIR");
  const std::string go = std::string(dir != nullptr ? dir : "/tmp") + "/bench-go";
  while (::access(go.c_str(), F_OK) != 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  for (int r = 0; r < rounds; ++r) {
    check(s->acquire(), "acquire");
    const uint64_t acquired = monotonic_ns();
    const session_stats ss = s->stats();
    std::printf("acquired %" PRIu64 " in %" PRIu64 " out %" PRIu64 " granted %" PRIu64 "\n", acquired, ss.pager.bytes_in,
                ss.pager.bytes_out, ss.last_lock_granted_ns);
    if (r == 0) {  // first touch: real data, never zeros
      check(s->get_backend().memset_d8(p, 0x5A, bytes, st), "fill");
      check(s->get_backend().stream_synchronize(st), "fill sync");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms));
    const uint64_t released = monotonic_ns();  // "release called": printed after, so printing is not timed
    check(s->release(), "release");
    const session_stats after = s->stats();
    std::printf("release %" PRIu64 " unlock %" PRIu64 " synced %" PRIu64 "\n", released, after.last_unlock_ns, after.last_synced_ns);
    std::fflush(stdout);
  }
  check(s->get_backend().stream_destroy(st), "stream");
  return 0;
}


struct event {
  uint64_t ns;
  int who;
  bool acquire;
  uint64_t bytes_in, bytes_out;
  uint64_t stage_ns;  // acquire: when the lock was granted; release: when it was handed on
  uint64_t synced_ns;  // release: when the device was synchronized
};

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * (v.size() - 1) + 0.5)];
}

// One run: two workers of `bytes` each on a pool of `pool_bytes`; returns the counted
// handoff times (seconds) and the bytes moved in by each counted acquire.
// The stages of the counted handoffs (seconds): the releaser's work up to handing the lock
// on, the lock's handoff, and the acquirer's work once granted.
struct stages {
  std::vector<double> release_work, lock_handoff, acquire_work;
  std::vector<double> release_sync;  // after the handoff: the releaser synchronizing the device
};

void run_pair(uint64_t bytes, uint64_t pool_bytes, uint64_t host_pool_bytes, int rounds, int hold_ms, std::vector<double>* handoffs,
              std::vector<double>* moved, stages* st) {
  static int run = 0;
  char dir[] = "/tmp/vramswap-bench-XXXXXX";
  if (::mkdtemp(dir) == nullptr) check(fail_errno(errno, "mkdtemp"), "runtime dir");
  const std::string prefix = "vsb" + std::to_string(getpid()) + "r" + std::to_string(run++) + "-";
  const std::vector<std::string> env = {"VRAMSWAP_SHM_PREFIX=" + prefix, std::string("VRAMSWAP_RUNTIME_DIR=") + dir,
                                        "VRAMSWAP_POOL_SIZE=" + std::to_string(pool_bytes), "VRAMSWAP_POOL_IDLE_EXIT=2",
                                        "VRAMSWAP_LOG=warn", "VRAMSWAP_HOST_POOL=" + std::to_string(host_pool_bytes)};
  const std::vector<std::string> wargs = {"bench_handoff", "--worker", std::to_string(bytes), std::to_string(rounds), std::to_string(hold_ms)};
  // Both attach first, then start at once (they wait for the go file).
  child a = spawn_self(wargs, env);
  child b = spawn_self(wargs, env);
  char line[256];
  for (FILE* f : {a.out, b.out}) {
    if (std::fgets(line, sizeof line, f) == nullptr || std::strncmp(line, "attached", 8) != 0) {
      check(fail(err_system, "a worker did not attach (see its errors above)"), "worker");
    }
  }
  if (FILE* g = std::fopen((std::string(dir) + "/bench-go").c_str(), "w")) std::fclose(g);
  std::vector<event> events;
  auto reader = [](FILE* f, int who, std::vector<event>* out) {
    char l[256];
    while (std::fgets(l, sizeof l, f) != nullptr) {
      event e{};
      e.who = who;
      if (std::sscanf(l, "acquired %" SCNu64 " in %" SCNu64 " out %" SCNu64 " granted %" SCNu64, &e.ns, &e.bytes_in, &e.bytes_out,
                      &e.stage_ns) == 4) {
        e.acquire = true;
      } else if (std::sscanf(l, "release %" SCNu64 " unlock %" SCNu64 " synced %" SCNu64, &e.ns, &e.stage_ns, &e.synced_ns) == 3) {
        e.acquire = false;
      } else {
        continue;
      }
      out->push_back(e);
    }
  };
  std::vector<event> ea, eb;
  std::thread ta(reader, a.out, 0, &ea), tb(reader, b.out, 1, &eb);
  ta.join();
  tb.join();
  int sa = 0, sb = 0;
  ::waitpid(a.pid, &sa, 0);
  ::waitpid(b.pid, &sb, 0);
  if (!WIFEXITED(sa) || WEXITSTATUS(sa) != 0 || !WIFEXITED(sb) || WEXITSTATUS(sb) != 0) {
    check(fail(err_internal, "a worker failed (status %d / %d)", sa, sb), "workers");
  }
  events.insert(events.end(), ea.begin(), ea.end());
  events.insert(events.end(), eb.begin(), eb.end());
  std::sort(events.begin(), events.end(), [](const event& x, const event& y) { return x.ns < y.ns; });
  // Pair each acquire with the release just before it, by the other worker.
  uint64_t last_in[2] = {0, 0};
  int counted = 0;
  for (size_t i = 1; i < events.size(); ++i) {
    const event& e = events[i];
    if (!e.acquire) continue;
    const event& prev = events[i - 1];
    const uint64_t in_delta = e.bytes_in - last_in[e.who];
    last_in[e.who] = e.bytes_in;
    if (prev.acquire || prev.who == e.who) continue;
    if (++counted <= 2) continue;  // tiers growing, first touch
    handoffs->push_back((e.ns - prev.ns) / 1e9);
    moved->push_back(static_cast<double>(in_delta));
    st->release_work.push_back((prev.stage_ns - prev.ns) / 1e9);
    st->release_sync.push_back((static_cast<double>(prev.synced_ns) - static_cast<double>(prev.stage_ns)) / 1e9);
    st->lock_handoff.push_back((static_cast<double>(e.stage_ns) - static_cast<double>(prev.stage_ns)) / 1e9);
    st->acquire_work.push_back((e.ns - e.stage_ns) / 1e9);
  }
  const std::string rm = std::string("rm -rf ") + dir;
  // The server exits by itself after VRAMSWAP_POOL_IDLE_EXIT; wait for it so that the next
  // run's pool can have the device's memory.
  std::this_thread::sleep_for(std::chrono::seconds(3));
  if (std::system(rm.c_str()) != 0) std::fprintf(stderr, "bench_handoff: could not remove %s\n", dir);
}

#ifdef VRAMSWAP_HAVE_CUDA_H
// --- cuda-checkpoint baseline --------------------------------------------------------------
struct driver {
  void* lib = nullptr;
  CUresult (*init)(unsigned) = nullptr;
  CUresult (*device_get)(CUdevice*, int) = nullptr;
  CUresult (*retain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*set_current)(CUcontext) = nullptr;
  CUresult (*mem_alloc)(CUdeviceptr*, size_t) = nullptr;
  CUresult (*memset8)(CUdeviceptr, unsigned char, size_t) = nullptr;
  CUresult (*ck_lock)(int, CUcheckpointLockArgs*) = nullptr;
  CUresult (*ck_checkpoint)(int, CUcheckpointCheckpointArgs*) = nullptr;
  CUresult (*ck_restore)(int, CUcheckpointRestoreArgs*) = nullptr;
  CUresult (*ck_unlock)(int, CUcheckpointUnlockArgs*) = nullptr;
  bool load(std::string* why) {
    lib = ::dlopen("libcuda.so.1", RTLD_NOW);
    if (lib == nullptr) return *why = "libcuda.so.1 not found", false;
    auto sym = [&](const char* n) { return ::dlsym(lib, n); };
    init = reinterpret_cast<decltype(init)>(sym("cuInit"));
    device_get = reinterpret_cast<decltype(device_get)>(sym("cuDeviceGet"));
    retain = reinterpret_cast<decltype(retain)>(sym("cuDevicePrimaryCtxRetain"));
    set_current = reinterpret_cast<decltype(set_current)>(sym("cuCtxSetCurrent"));
    mem_alloc = reinterpret_cast<decltype(mem_alloc)>(sym("cuMemAlloc_v2"));
    memset8 = reinterpret_cast<decltype(memset8)>(sym("cuMemsetD8_v2"));
    ck_lock = reinterpret_cast<decltype(ck_lock)>(sym("cuCheckpointProcessLock"));
    ck_checkpoint = reinterpret_cast<decltype(ck_checkpoint)>(sym("cuCheckpointProcessCheckpoint"));
    ck_restore = reinterpret_cast<decltype(ck_restore)>(sym("cuCheckpointProcessRestore"));
    ck_unlock = reinterpret_cast<decltype(ck_unlock)>(sym("cuCheckpointProcessUnlock"));
    if (!init || !device_get || !retain || !set_current || !mem_alloc || !memset8) return *why = "basic driver symbols missing", false;
    if (!ck_lock || !ck_checkpoint || !ck_restore || !ck_unlock) return *why = "the driver has no cuCheckpointProcess* API", false;
    return true;
  }
};

int run_plain(uint64_t bytes) {
  driver d;
  std::string why;
  if (!d.load(&why)) return std::fprintf(stderr, "plain: %s\n", why.c_str()), 1;
  CUdevice dev;
  CUcontext ctx;
  CUdeviceptr p;
  if (d.init(0) || d.device_get(&dev, 0) || d.retain(&ctx, dev) || d.set_current(ctx) || d.mem_alloc(&p, bytes) || d.memset8(p, 0x5A, bytes)) {
    std::fprintf(stderr, "plain: CUDA setup failed\n");
    return 1;
  }
  std::printf("ready\n");
  std::fflush(stdout);
  ::pause();
  return 0;
}

// Returns the switch time in seconds, or a negative number with *why set.
double checkpoint_switch(uint64_t bytes, std::string* why) {
  driver d;
  if (!d.load(why)) return -1;
  if (d.init(0) != CUDA_SUCCESS) return *why = "cuInit failed", -1;
  const std::vector<std::string> args = {"bench_handoff", "--plain", std::to_string(bytes)};
  child a = spawn_self(args, {});
  char line[64];
  if (std::fgets(line, sizeof line, a.out) == nullptr) return *why = "plain worker A failed", -1;
  CUcheckpointLockArgs lk{};
  lk.timeoutMs = 60000;
  CUcheckpointCheckpointArgs ck{};
  CUcheckpointRestoreArgs rs{};
  CUcheckpointUnlockArgs ul{};
  // B comes up, then is checkpointed out so that only A is on the device.
  child b = spawn_self(args, {});
  if (std::fgets(line, sizeof line, b.out) == nullptr) return *why = "plain worker B failed", -1;
  if (d.ck_lock(b.pid, &lk) || d.ck_checkpoint(b.pid, &ck)) return *why = "checkpointing B failed", -1;
  // The switch: A out, B in.
  const uint64_t t0 = monotonic_ns();
  CUresult r1 = d.ck_lock(a.pid, &lk);
  CUresult r2 = r1 ? r1 : d.ck_checkpoint(a.pid, &ck);
  CUresult r3 = r2 ? r2 : d.ck_restore(b.pid, &rs);
  CUresult r4 = r3 ? r3 : d.ck_unlock(b.pid, &ul);
  const uint64_t t1 = monotonic_ns();
  ::kill(a.pid, SIGKILL);
  ::kill(b.pid, SIGKILL);
  ::waitpid(a.pid, nullptr, 0);
  ::waitpid(b.pid, nullptr, 0);
  if (r4 != CUDA_SUCCESS) return *why = "the checkpoint switch failed with CUresult " + std::to_string(static_cast<int>(r4)), -1;
  return (t1 - t0) / 1e9;
}
#endif

// MemAvailable (bytes), 0 when unknown.
uint64_t available_ram() {
  FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return 0;
  char line[256];
  unsigned long long kib = 0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1) break;
  }
  std::fclose(f);
  return kib * 1024;
}

double pinned_one_way_rate(backend& be, uint64_t bytes) {
  // Plain pinned device-to-host copies of a frame-backed buffer: the same path the pager
  // uses, without the pager.
  device_info info;
  check(be.get_device_info(0, &info), "device info");
  const uint64_t n = std::min<uint64_t>(bytes, 4 * GiB) / info.granularity * info.granularity;
  device_ptr va = 0;
  frame_id f = 0;
  check(be.reserve(0, n, 0, &va), "reserve");
  check(be.create_frame(0, n, &f), "frame");
  check(be.map(va, n, f, 0), "map");
  check(be.set_access(va, n, access_flags::read_write), "access");
  void* host = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  check(be.host_register(host, n), "pin");
  stream_id s = 0;
  check(be.stream_create(0, &s), "stream");
  check(be.memset_d8(va, 0x5A, n, s), "fill");
  check(be.copy_d2h(host, va, n, s), "warm-up");
  check(be.stream_synchronize(s), "sync");
  const uint64_t t0 = monotonic_ns();
  check(be.copy_d2h(host, va, n, s), "copy");
  check(be.stream_synchronize(s), "sync");
  const double rate = n / ((monotonic_ns() - t0) / 1e9);
  be.stream_destroy(s);
  be.host_unregister(host);
  ::munmap(host, n);
  be.unmap(va, n);
  be.release_frame(f);
  be.unreserve(va, n);
  return rate;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 5 && std::strcmp(argv[1], "--worker") == 0) return run_worker(std::strtoull(argv[2], nullptr, 10), std::atoi(argv[3]), std::atoi(argv[4]));
#ifdef VRAMSWAP_HAVE_CUDA_H
  if (argc >= 3 && std::strcmp(argv[1], "--plain") == 0) return run_plain(std::strtoull(argv[2], nullptr, 10));
#endif
  backend* be = nullptr;
  check(default_backend(&be), "backend");
  const bool gpu = be->kind() == backend_kind::cuda;
  std::vector<double> sizes = gpu ? std::vector<double>{16, 32, 60} : std::vector<double>{0.125};
  double fit = gpu ? 8 : 0.0625;
  int rounds = 8;
  double shared_above = 40;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--sizes") == 0) sizes = parse_list(argv[i + 1]);
    if (std::strcmp(argv[i], "--fit") == 0) fit = std::atof(argv[i + 1]);
    if (std::strcmp(argv[i], "--rounds") == 0) rounds = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--shared-above") == 0) shared_above = std::atof(argv[i + 1]);
  }
  constexpr uint64_t k_frame = 32ull << 20;  // VRAMSWAP_FRAME_SIZE's default, which the workers use
  device_info info;
  check(be->get_device_info(0, &info), "device info");
  std::printf("# bench_handoff: %s backend, %s\n\n", be->name(), info.name.c_str());
  const double rate = pinned_one_way_rate(*be, static_cast<uint64_t>(sizes.front() * GiB));
  std::printf("pinned one-way copy (device to host, same run): %.1f GB/s\n\n", rate / 1e9);
  std::printf("| memory per process | pool | handoffs | ideal X/rate | handoff p50 | p90 | ratio p50/ideal | bytes in per handoff | p50 stages: release / lock / acquire |\n");
  std::printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  std::vector<std::string> notes;
  for (double x : sizes) {
    const uint64_t bytes = static_cast<uint64_t>(x * GiB);
    std::vector<double> h, moved;
    stages st;
    const uint64_t slack = std::min<uint64_t>(GiB, bytes / 4);
    const uint64_t pool = bytes + slack;  // holds one, not two
    const bool shared = x > shared_above;
    // The shared host pool holds what is saved at once (2X less the device pool, X - slack)
    // plus slack on both sides: X + slack, at least the server's minimum (17 slots) and one.
    const uint64_t host_pool = shared ? std::max<uint64_t>(bytes + slack, 18 * k_frame) : 0;
    if (shared) {
      const uint64_t avail = available_ram();
      const uint64_t want_ram = host_pool + 4 * GiB;  // and room for the workers and the server
      device_info now;
      check(be->get_device_info(0, &now), "device info");
      const uint64_t want_device = pool + (gpu ? std::max<uint64_t>(GiB, now.total_bytes / 100 * 3) : 0);
      char why[256] = "";
      if (avail < want_ram) {
        std::snprintf(why, sizeof why, "needs %.1f GiB of available host memory (a %.1f GiB shared host pool), %.1f GiB available",
                      want_ram / double(GiB), host_pool / double(GiB), avail / double(GiB));
      } else if (now.free_bytes < want_device) {
        std::snprintf(why, sizeof why, "needs %.1f GiB of free device memory, %.1f GiB free", want_device / double(GiB),
                      now.free_bytes / double(GiB));
      }
      if (why[0] != '\0') {
        std::printf("| %g GiB | %.3g GiB | skipped: %s | | | | | | |\n", x, pool / double(GiB), why);
        std::fflush(stdout);
        continue;
      }
      char note[200];
      std::snprintf(note, sizeof note, "%g GiB: saved pages in one shared host pool of %.3g GiB (VRAMSWAP_HOST_POOL), %d rounds per worker",
                    x, host_pool / double(GiB), std::min(rounds, 4));
      notes.push_back(note);
    }
    run_pair(bytes, pool, host_pool, shared ? std::min(rounds, 4) : rounds, 300, &h, &moved, &st);
    const double ideal = bytes / rate;
    std::printf("| %g GiB | %.3g GiB | %zu | %.3f s | %.3f s | %.3f s | %.2f | %.1f GiB | %.3f / %.6f / %.3f s |\n", x, pool / double(GiB), h.size(), ideal, percentile(h, 0.5),
                percentile(h, 0.9), percentile(h, 0.5) / ideal, percentile(moved, 0.5) / GiB, percentile(st.release_work, 0.5),
                percentile(st.lock_handoff, 0.5), percentile(st.acquire_work, 0.5));
    std::fflush(stdout);
  }
  if (!notes.empty()) std::printf("\n");
  for (const std::string& n : notes) std::printf("- %s; the other sizes: a pinned host tier per process\n", n.c_str());
  if (fit > 0) {
    const uint64_t bytes = static_cast<uint64_t>(fit * GiB);
    std::vector<double> h, moved;
    stages st;
    run_pair(bytes, 3 * bytes, 0, std::max(rounds, 40), 20, &h, &moved, &st);
    std::printf("\nBoth fit (%g GiB each, pool %g GiB): %zu handoffs, p50 %.1f us, p90 %.1f us, max bytes moved %.0f; "
                "p50 stages: release %.1f us, lock %.1f us, acquire %.1f us; the releaser's device synchronize, after the "
                "handoff, %.1f us\n",
                fit, 3 * fit, h.size(), percentile(h, 0.5) * 1e6, percentile(h, 0.9) * 1e6,
                moved.empty() ? 0.0 : *std::max_element(moved.begin(), moved.end()), percentile(st.release_work, 0.5) * 1e6,
                percentile(st.lock_handoff, 0.5) * 1e6, percentile(st.acquire_work, 0.5) * 1e6,
                percentile(st.release_sync, 0.5) * 1e6);
  }
#ifdef VRAMSWAP_HAVE_CUDA_H
  if (gpu) {
    std::string why;
    const double t = checkpoint_switch(static_cast<uint64_t>(sizes.front() * GiB), &why);
    if (t >= 0) {
      std::printf("\ncuda-checkpoint baseline, %g GiB per process: switch (lock+checkpoint A, restore+unlock B) %.3f s = %.2f x ideal\n",
                  sizes.front(), t, t / (sizes.front() * GiB / rate));
    } else {
      std::printf("\ncuda-checkpoint baseline: not measured: %s\n", why.c_str());
    }
  }
#endif
  return 0;
}

// bench_handoff: what a switch between time-sharing processes costs.
//
//   bench_handoff [--sizes 16,32,60] [--processes 2,3,5] [--many-sizes 16] [--fit 8]
//                 [--rounds 8] [--shared-above 40]                                  (GiB)
//
// For each X in --sizes and N in --processes (N = 2; rows of 3 or more processes run at
// the sizes of --many-sizes, by default the first of --sizes): N worker processes with X GiB
// of device memory each take turns under the lock (FIFO: they go round), on a pool that
// holds one of them when N = 2 (X + 1 GiB, or X + X/4 when smaller) and two of them when N
// >= 3 (2X + the same slack). With two, the holder's frames are what the next one needs; with
// five, each acquirer needs the few frames its predecessor's last eviction left to an owner
// and most of the next owner's, so two owners evict for it at once. Three processes go
// round with one owner per switch, and every other switch moves nothing: the pool evicts
// the idle process predicted to come back last (pool/victim_order.hpp), so the next one's
// memory is still resident. The rows count the switches that moved memory and, apart,
// those that found it resident; the times and stages are the former's.
// Saved pages go to a pinned host tier per process, or to one host pool shared by all
// (VRAMSWAP_HOST_POOL = what they save at once plus slack, at least 18 slots) for sizes
// above --shared-above and where N tiers of X would pin more than half the host's available
// memory. A row runs only when the host's available memory and the device's free memory
// allow it (else it says why it was skipped); with a shared host pool above --shared-above
// at most 4 rounds per worker.
//
// The switch is the time from the holder calling release() to the next one's acquire()
// returning, all of its memory resident: the owners of the frames it needs evict them (their
// service threads, at once) while it copies its own memory in, frame by frame as each comes
// free. It is reported against the ideal: the bytes the acquirer copies in / the one-way
// pinned copy rate measured in the same run (1.0 would be a switch as fast as copying the
// acquirer's memory one way; a serial evict-then-restore would be about 2.0), and against X
// / rate as issue 5's rows were. Each worker's first two acquires (first touch, tiers
// growing) are not counted. The stages of a switch, from the pool's trace (each owner's
// evictions, pool/pool_layout.hpp) and the acquirer's pager: the releaser's work until it
// hands the lock on, the lock's handoff, then from the grant: the first frame the acquirer
// got from an owner (after the free frames ran out), the first owner's eviction start, how
// far apart the owners' starts were, the span of their evictions (first start to last end),
// how much of the shorter eviction ran while the other did, and the restore's tail after the
// last eviction ended, in steps: to the restore's last frame, to its last copy queued (the
// pages mapped), to the memory resident (the copies drained).
//
// --fit X: two processes with a pool that holds both: no byte moves, the handoff is the
// lock's handoff plus bookkeeping (goal p50 <= 50 us).
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
#include <atomic>
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
#include "pool/pool_segment.hpp"

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
// Then, from its member's trace ring in the pool segment, one line per eviction it served.
void print_evictions(backend& be) {
  device_info info;
  check(be.get_device_info(0, &info), "device info");
  std::string name;
  std::unique_ptr<pool_segment> pool;
  check(pool_segment::name_for(info.uuid, &name), "pool name");
  check(pool_segment::open(name, &pool, /*read_only=*/true), "opening the pool segment");
  for (uint32_t m = 0; m < pool_layout::k_member_count; ++m) {
    const pool_layout::member_slot& slot = pool->member(m);
    if (slot.state.load() != pool_layout::member_live || slot.pid != ::getpid()) continue;
    std::vector<pool_segment::trace_event> events;
    uint64_t cursor = 0;
    const uint64_t lost = pool->read_trace(m, &cursor, &events);
    if (lost != 0) std::fprintf(stderr, "bench_handoff: worker %d: %" PRIu64 " trace records lost\n", static_cast<int>(::getpid()), lost);
    for (const auto& e : events) {
      if (e.kind != pool_layout::trace_evicted || e.pid != ::getpid()) continue;
      std::printf("evicted %" PRIu64 " end %" PRIu64 " bytes %" PRIu64 "\n", e.ns, e.ns + e.duration_ns, e.bytes);
    }
    break;
  }
}

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
    std::printf("acquired %" PRIu64 " in %" PRIu64 " out %" PRIu64 " granted %" PRIu64 " waited %" PRIu64 " frame %" PRIu64
                " last_frame %" PRIu64 " queued %" PRIu64 "\n",
                acquired, ss.pager.bytes_in, ss.pager.bytes_out, ss.last_lock_granted_ns, ss.pager.last_restore_waited_ns,
                ss.pager.last_restore_frame_after_wait_ns, ss.pager.last_restore_last_frame_ns, ss.pager.last_restore_queued_ns);
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
  // The others may still ask for our frames: stay a member until every worker is done.
  std::printf("done\n");
  std::fflush(stdout);
  const std::string all_done = std::string(dir != nullptr ? dir : "/tmp") + "/bench-done";
  while (::access(all_done.c_str(), F_OK) != 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  print_evictions(s->get_backend());
  std::fflush(stdout);
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
  uint64_t waited_ns, frame_ns;  // acquire: the restore found no free frame / got one after (0: never)
  uint64_t last_frame_ns, queued_ns;  // acquire: the restore's last frame taken, its last copy queued (0: none)
};

struct eviction {
  int who;
  uint64_t start_ns, end_ns, bytes;
};

// The counted switches of one run, each a sample per vector (seconds unless said).
struct switches {
  std::vector<double> time, bytes_in, bytes_out, owners;
  std::vector<double> release_work, lock_handoff, acquire_work;
  std::vector<double> release_sync;  // after the handoff: the releaser synchronizing the device
  // From the grant: the first frame an owner freed for the acquirer; the first owner's
  // eviction start; the owners' starts apart; first start to last end; the restore's tail
  // after the last eviction ended. (Only switches where the quantity exists.)
  std::vector<double> first_frame, first_start, start_spread, evict_span, restore_tail;
  // The restore's tail in steps, from the last eviction's end: to the restore's last frame
  // (below 0 when that came before the end), to its last copy queued, to the memory resident.
  std::vector<double> tail_last_frame, tail_queued, tail_resident;
  std::vector<double> at_once;  // switches with two or more owners: the shorter eviction's share that ran while another did
};

// One run: n workers of `bytes` each on a pool of `pool_bytes` (host pool `host_pool_bytes`,
// 0: a tier per process), `rounds` turns each holding the lock `hold_ms`. The counted
// switches go to `moving` where the acquirer brought memory in, else to `resident` (its
// memory had stayed in the pool: the pool evicted someone predicted to come back later).
void run_group(int n, uint64_t bytes, uint64_t pool_bytes, uint64_t host_pool_bytes, int rounds, int hold_ms, switches* moving,
               switches* resident) {
  static int run = 0;
  char dir[] = "/tmp/vramswap-bench-XXXXXX";
  if (::mkdtemp(dir) == nullptr) check(fail_errno(errno, "mkdtemp"), "runtime dir");
  const std::string prefix = "vsb" + std::to_string(getpid()) + "r" + std::to_string(run++) + "-";
  const std::vector<std::string> env = {"VRAMSWAP_SHM_PREFIX=" + prefix, std::string("VRAMSWAP_RUNTIME_DIR=") + dir,
                                        "VRAMSWAP_POOL_SIZE=" + std::to_string(pool_bytes), "VRAMSWAP_POOL_IDLE_EXIT=2",
                                        "VRAMSWAP_LOG=warn", "VRAMSWAP_HOST_POOL=" + std::to_string(host_pool_bytes)};
  const std::vector<std::string> wargs = {"bench_handoff", "--worker", std::to_string(bytes), std::to_string(rounds), std::to_string(hold_ms)};
  // All attach first, then start at once (they wait for the go file).
  std::vector<child> workers;
  for (int i = 0; i < n; ++i) workers.push_back(spawn_self(wargs, env));
  char line[256];
  for (child& c : workers) {
    if (std::fgets(line, sizeof line, c.out) == nullptr || std::strncmp(line, "attached", 8) != 0) {
      check(fail(err_system, "a worker did not attach (see its errors above)"), "worker");
    }
  }
  if (FILE* g = std::fopen((std::string(dir) + "/bench-go").c_str(), "w")) std::fclose(g);
  // Once every worker has done its rounds, they print their evictions and leave.
  std::atomic<int> done{0};
  const std::string done_file = std::string(dir) + "/bench-done";
  auto reader = [&](FILE* f, int who, std::vector<event>* evs, std::vector<eviction>* evicted) {
    char l[256];
    while (std::fgets(l, sizeof l, f) != nullptr) {
      event e{};
      e.who = who;
      eviction v{who, 0, 0, 0};
      if (std::sscanf(l, "acquired %" SCNu64 " in %" SCNu64 " out %" SCNu64 " granted %" SCNu64 " waited %" SCNu64 " frame %" SCNu64
                      " last_frame %" SCNu64 " queued %" SCNu64,
                      &e.ns, &e.bytes_in, &e.bytes_out, &e.stage_ns, &e.waited_ns, &e.frame_ns, &e.last_frame_ns, &e.queued_ns) == 8) {
        e.acquire = true;
        evs->push_back(e);
      } else if (std::sscanf(l, "release %" SCNu64 " unlock %" SCNu64 " synced %" SCNu64, &e.ns, &e.stage_ns, &e.synced_ns) == 3) {
        evs->push_back(e);
      } else if (std::sscanf(l, "evicted %" SCNu64 " end %" SCNu64 " bytes %" SCNu64, &v.start_ns, &v.end_ns, &v.bytes) == 3) {
        evicted->push_back(v);
      } else if (std::strncmp(l, "done", 4) == 0 && ++done == n) {
        if (FILE* g = std::fopen(done_file.c_str(), "w")) std::fclose(g);
      }
    }
  };
  std::vector<std::vector<event>> per(n);
  std::vector<std::vector<eviction>> per_evicted(n);
  std::vector<std::thread> readers;
  for (int i = 0; i < n; ++i) readers.emplace_back(reader, workers[i].out, i, &per[i], &per_evicted[i]);
  for (std::thread& t : readers) t.join();
  bool failed = false;
  for (child& c : workers) {
    int status = 0;
    ::waitpid(c.pid, &status, 0);
    failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
  }
  if (failed) check(fail(err_internal, "a worker failed (its errors are above)"), "workers");
  std::vector<event> events;
  std::vector<eviction> evictions;
  for (int i = 0; i < n; ++i) {
    events.insert(events.end(), per[i].begin(), per[i].end());
    evictions.insert(evictions.end(), per_evicted[i].begin(), per_evicted[i].end());
  }
  std::sort(events.begin(), events.end(), [](const event& x, const event& y) { return x.ns < y.ns; });
  // Pair each acquire with the release just before it, by another worker.
  std::vector<uint64_t> last_in(n, 0);
  std::vector<int> acquires(n, 0);
  for (size_t i = 1; i < events.size(); ++i) {
    const event& e = events[i];
    if (!e.acquire) continue;
    const event& prev = events[i - 1];
    const uint64_t in_delta = e.bytes_in - last_in[e.who];
    last_in[e.who] = e.bytes_in;
    if (++acquires[e.who] <= 2) continue;  // first touch, tiers growing
    if (prev.acquire || prev.who == e.who) continue;
    switches* const out = in_delta > 0 ? moving : resident;
    const uint64_t granted = e.stage_ns;
    out->time.push_back((e.ns - prev.ns) / 1e9);
    out->bytes_in.push_back(static_cast<double>(in_delta));
    out->release_work.push_back((prev.stage_ns - prev.ns) / 1e9);
    out->release_sync.push_back((static_cast<double>(prev.synced_ns) - static_cast<double>(prev.stage_ns)) / 1e9);
    out->lock_handoff.push_back((static_cast<double>(granted) - static_cast<double>(prev.stage_ns)) / 1e9);
    out->acquire_work.push_back((e.ns - granted) / 1e9);
    if (e.frame_ns != 0) out->first_frame.push_back((static_cast<double>(e.frame_ns) - static_cast<double>(granted)) / 1e9);
    // The owners: other workers whose evictions began while this acquire brought memory in
    // (only the lock holder asks for frames).
    std::vector<const eviction*> mine;
    for (const eviction& v : evictions) {
      if (v.who != e.who && v.start_ns >= granted && v.start_ns <= e.ns) mine.push_back(&v);
    }
    std::vector<int> owners;
    uint64_t out_bytes = 0, first = UINT64_MAX, last_start = 0, last_end = 0;
    for (const eviction* v : mine) {
      if (std::find(owners.begin(), owners.end(), v->who) == owners.end()) owners.push_back(v->who);
      out_bytes += v->bytes;
      first = std::min(first, v->start_ns);
      last_start = std::max(last_start, v->start_ns);
      last_end = std::max(last_end, v->end_ns);
    }
    out->owners.push_back(static_cast<double>(owners.size()));
    out->bytes_out.push_back(static_cast<double>(out_bytes));
    if (!mine.empty()) {
      out->first_start.push_back((first - granted) / 1e9);
      out->start_spread.push_back((last_start - first) / 1e9);
      out->evict_span.push_back((last_end - first) / 1e9);
      out->restore_tail.push_back((static_cast<double>(e.ns) - static_cast<double>(last_end)) / 1e9);
      if (e.last_frame_ns != 0 && e.queued_ns != 0) {
        const double end = static_cast<double>(last_end);
        out->tail_last_frame.push_back((static_cast<double>(e.last_frame_ns) - end) / 1e9);
        out->tail_queued.push_back((static_cast<double>(e.queued_ns) - end) / 1e9);
        out->tail_resident.push_back((static_cast<double>(e.ns) - end) / 1e9);
      }
    }
    if (owners.size() >= 2) {
      // Each owner's eviction interval (first start to last end of its evictions for this
      // switch); how much of the shortest ran while any other owner evicted.
      struct span {
        uint64_t from = UINT64_MAX, to = 0;
      };
      std::vector<span> spans(owners.size());
      for (const eviction* v : mine) {
        span& sp = spans[std::find(owners.begin(), owners.end(), v->who) - owners.begin()];
        sp.from = std::min(sp.from, v->start_ns);
        sp.to = std::max(sp.to, v->end_ns);
      }
      size_t shortest = 0;
      for (size_t k = 1; k < spans.size(); ++k) {
        if (spans[k].to - spans[k].from < spans[shortest].to - spans[shortest].from) shortest = k;
      }
      uint64_t with_other = 0;
      for (size_t k = 0; k < spans.size(); ++k) {
        if (k == shortest) continue;
        const uint64_t from = std::max(spans[k].from, spans[shortest].from), to = std::min(spans[k].to, spans[shortest].to);
        with_other = std::max<uint64_t>(with_other, to > from ? to - from : 0);
      }
      const uint64_t len = spans[shortest].to - spans[shortest].from;
      out->at_once.push_back(len == 0 ? 1.0 : static_cast<double>(with_other) / static_cast<double>(len));
    }
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
  std::vector<double> processes = {2, 3, 5};
  std::vector<double> many_sizes;
  double fit = gpu ? 8 : 0.0625;
  int rounds = 8;
  double shared_above = 40;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--sizes") == 0) sizes = parse_list(argv[i + 1]);
    if (std::strcmp(argv[i], "--processes") == 0) processes = parse_list(argv[i + 1]);
    if (std::strcmp(argv[i], "--many-sizes") == 0) many_sizes = parse_list(argv[i + 1]);
    if (std::strcmp(argv[i], "--fit") == 0) fit = std::atof(argv[i + 1]);
    if (std::strcmp(argv[i], "--rounds") == 0) rounds = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--shared-above") == 0) shared_above = std::atof(argv[i + 1]);
  }
  if (many_sizes.empty() && !sizes.empty()) many_sizes = {sizes.front()};
  constexpr uint64_t k_frame = 32ull << 20;  // VRAMSWAP_FRAME_SIZE's default, which the workers use
  device_info info;
  check(be->get_device_info(0, &info), "device info");
  std::printf("# bench_handoff: %s backend, %s\n\n", be->name(), info.name.c_str());
  const double rate = pinned_one_way_rate(*be, static_cast<uint64_t>((sizes.empty() ? many_sizes.front() : sizes.front()) * GiB));
  std::printf("pinned one-way copy (device to host, same run): %.1f GB/s\n\n", rate / 1e9);
  std::printf("| processes | memory per process | pool | switches that moved memory (+ memory resident) | owners per switch | bytes in / out per switch | ideal in/rate | "
              "switch p50 | p90 | ratio p50 | ratio p90 | p50 vs X/rate | p50 stages, ms: release / lock / grant to first owner frame / "
              "to first eviction start / owners' starts apart / evictions' span / at once / restore after the last eviction | "
              "the restore from the last eviction's end, p50 ms: its last frame taken / its last copy queued / resident |\n");
  std::printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  std::vector<std::string> notes;
  for (double nd : processes) {
    const int n = static_cast<int>(nd);
    if (n < 2) continue;
    for (double x : n == 2 ? sizes : many_sizes) {
      const uint64_t bytes = static_cast<uint64_t>(x * GiB);
      const uint64_t slack = std::min<uint64_t>(GiB, bytes / 4);
      const uint64_t pool = (n == 2 ? 1 : 2) * bytes + slack;  // holds one (two processes), or two
      const uint64_t avail = available_ram();
      // Pinned tiers pin each process's memory (ahead of need): N of them must leave the host room.
      const bool shared = x > shared_above || (avail != 0 && n * bytes > avail / 2);
      // The shared host pool holds what is saved at once (N X less the device pool) plus
      // slack on both sides, at least the server's minimum (17 slots) and one.
      const uint64_t host_pool = shared ? std::max<uint64_t>(n * bytes - pool + 2 * slack, 18 * k_frame) : 0;
      const uint64_t want_ram = (shared ? host_pool : n * bytes) + 4 * GiB;  // and room for the workers and the server
      device_info now;
      check(be->get_device_info(0, &now), "device info");
      const uint64_t want_device = pool + (gpu ? std::max<uint64_t>(GiB, now.total_bytes / 100 * 3) : 0);
      char why[256] = "";
      if (avail != 0 && avail < want_ram) {
        std::snprintf(why, sizeof why, "needs %.1f GiB of available host memory (%s of %.1f GiB), %.1f GiB available",
                      want_ram / double(GiB), shared ? "a shared host pool" : "pinned tiers", (want_ram - 4 * GiB) / double(GiB),
                      avail / double(GiB));
      } else if (now.free_bytes < want_device) {
        std::snprintf(why, sizeof why, "needs %.1f GiB of free device memory, %.1f GiB free", want_device / double(GiB),
                      now.free_bytes / double(GiB));
      }
      if (why[0] != '\0') {
        std::printf("| %d | %g GiB | %.3g GiB | skipped: %s | | | | | | | | | | |\n", n, x, pool / double(GiB), why);
        std::fflush(stdout);
        continue;
      }
      const int row_rounds = shared && x > shared_above ? std::min(rounds, 4) : rounds;
      if (shared) {
        char note[240];
        std::snprintf(note, sizeof note, "%d x %g GiB: saved pages in one shared host pool of %.3g GiB (VRAMSWAP_HOST_POOL), %d rounds per worker",
                      n, x, host_pool / double(GiB), row_rounds);
        notes.push_back(note);
      }
      switches sw, stayed;
      run_group(n, bytes, pool, host_pool, row_rounds, 300, &sw, &stayed);
      const double in = bench::percentile(sw.bytes_in, 0.5);
      const double ideal = in / rate;
      const double p50 = bench::percentile(sw.time, 0.5), p90 = bench::percentile(sw.time, 0.9);
      auto ms = [](const std::vector<double>& v) {
        char b[32];
        if (v.empty()) return std::string("-");
        std::snprintf(b, sizeof b, "%.2f", bench::percentile(v, 0.5) * 1e3);
        return std::string(b);
      };
      std::string at_once = "-";
      if (!sw.at_once.empty()) {
        char b[32];
        std::snprintf(b, sizeof b, "%.0f%%", bench::percentile(sw.at_once, 0.5) * 100);
        at_once = b;
      }
      std::printf("| %d | %g GiB | %.3g GiB | %zu (+%zu) | %.0f (max %.0f) | %.2f / %.2f GiB | %.3f s | %.3f s | %.3f s | %.2f | %.2f | %.2f | "
                  "%s / %s / %s / %s / %s / %s / %s / %s | %s / %s / %s |\n",
                  n, x, pool / double(GiB), sw.time.size(), stayed.time.size(), bench::percentile(sw.owners, 0.5),
                  sw.owners.empty() ? 0.0 : *std::max_element(sw.owners.begin(), sw.owners.end()), in / GiB,
                  bench::percentile(sw.bytes_out, 0.5) / GiB, ideal, p50, p90, ideal > 0 ? p50 / ideal : 0.0, ideal > 0 ? p90 / ideal : 0.0,
                  p50 / (bytes / rate), ms(sw.release_work).c_str(), ms(sw.lock_handoff).c_str(), ms(sw.first_frame).c_str(),
                  ms(sw.first_start).c_str(), ms(sw.start_spread).c_str(), ms(sw.evict_span).c_str(), at_once.c_str(),
                  ms(sw.restore_tail).c_str(), ms(sw.tail_last_frame).c_str(), ms(sw.tail_queued).c_str(),
                  ms(sw.tail_resident).c_str());
      std::fflush(stdout);
    }
  }
  if (!notes.empty()) std::printf("\n");
  for (const std::string& note : notes) std::printf("- %s; the other rows: a pinned host tier per process\n", note.c_str());
  if (fit > 0) {
    const uint64_t bytes = static_cast<uint64_t>(fit * GiB);
    switches moved, sw;
    run_group(2, bytes, 3 * bytes, 0, std::max(rounds, 40), 20, &moved, &sw);
    std::printf("\nBoth fit (%g GiB each, pool %g GiB): %zu handoffs, p50 %.1f us, p90 %.1f us, %zu that moved memory; "
                "p50 stages: release %.1f us, lock %.1f us, acquire %.1f us; the releaser's device synchronize, after the "
                "handoff, %.1f us\n",
                fit, 3 * fit, sw.time.size(), bench::percentile(sw.time, 0.5) * 1e6, bench::percentile(sw.time, 0.9) * 1e6,
                moved.time.size(),
                bench::percentile(sw.release_work, 0.5) * 1e6, bench::percentile(sw.lock_handoff, 0.5) * 1e6,
                bench::percentile(sw.acquire_work, 0.5) * 1e6, bench::percentile(sw.release_sync, 0.5) * 1e6);
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

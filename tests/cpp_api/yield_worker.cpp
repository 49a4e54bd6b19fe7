// The two sides of compute yielding (VRAMSWAP_OVERSUBSCRIBE_COMPUTE) for the multi-process
// tests: a low-priority job that passes the launch gate as fast as it can, and a lock holder
// whose hold the test schedules.
//
// usage: yield_worker job <shared-file> <seconds>
//   An oversubscribed session; then, for <seconds>, rounds of one small copy inside the
//   launch gate (as the preload shim brackets a CUDA program's launches) and a stream
//   synchronize outside it. <shared-file> (created, one page) holds job_shared: the rounds
//   so far, and the longest pause between two passes through the gate with the time it
//   ended (the moment the gate let the job through), which the test
//   reads while the job runs. At the end one line of numbers on stdout.
// usage: yield_worker hold <device-key> <hold-ms>
//   Takes the device's lock (normal priority), prints held_ns=, holds it <hold-ms>, prints
//   release_ns= (just before the release) and released_ns=, and exits.
// Exit: 0 ok, 2 an API call failed.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "core/launch_gate.hpp"
#include "core/status.hpp"
#include "lock/device_lock.hpp"
#include "lock/process_identity.hpp"
#include "runtime/oversubscribed_session.hpp"
#include "support/worker_exit.hpp"
#include "support/yield_shared.hpp"

using namespace vramswap;
using namespace vramswap::detail;

namespace {
constexpr const char* k_program = "yield_worker";
void check(int rc, const char* what) { test::worker_check(k_program, rc, what); }

int run_job(const char* path, double seconds) {
  const int fd = ::open(path, O_RDWR | O_CREAT, 0600);
  if (fd < 0 || ::ftruncate(fd, 4096) != 0) {
    std::fprintf(stderr, "%s: %s: %s\n", k_program, path, std::strerror(errno));
    return 2;
  }
  void* map = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return 2;
  auto* shared = new (map) test::job_shared();

  launch_gate::set_installed();  // this program brackets its device work itself
  std::unique_ptr<oversubscribed_session> session;
  check(oversubscribed_session::open(0, &session), "opening the oversubscribed session");
  backend& be = session->get_backend();
  device_ptr p = 0;
  check(session->memory().malloc(2u << 20, &p), "malloc");
  void* staging = nullptr;
  check(be.host_alloc(4096, &staging), "host_alloc");
  std::memset(staging, 7, 4096);
  stream_id s = 0;
  check(be.stream_create(0, &s), "stream_create");
  shared->ready.store(1, std::memory_order_release);

  const uint64_t end = monotonic_ns() + static_cast<uint64_t>(seconds * 1e9);
  uint64_t last = monotonic_ns();
  uint64_t rounds = 0;
  for (;;) {
    uint64_t now = 0;
    {
      launch_gate::pass gate;
      now = monotonic_ns();  // through the gate: a pause ends here
      check(be.copy_h2d(p, staging, 4096, s), "copy_h2d");
    }
    check(be.stream_synchronize(s), "sync");
    shared->last_pass_ns.store(now, std::memory_order_release);
    shared->rounds.store(++rounds, std::memory_order_release);
    if (now - last > shared->longest_pause_ns.load(std::memory_order_relaxed)) {
      shared->longest_pause_ns.store(now - last, std::memory_order_relaxed);
      shared->longest_pause_end_ns.store(now, std::memory_order_release);
    }
    last = now;
    if (now >= end) break;
  }
  const oversubscribed_stats st = session->stats();
  std::printf("rounds=%" PRIu64 " yield_waits=%" PRIu64 " yield_ms=%.3f\n", rounds, st.yield_waits, st.yield_seconds * 1e3);
  std::fflush(stdout);
  check(be.stream_destroy(s), "stream_destroy");
  check(be.host_free(staging), "host_free");
  return 0;
}

int run_holder(const char* key, int hold_ms) {
  device_lock lock;
  check(device_lock::open(key, &lock), "opening the device lock");
  check(lock.acquire(lock_priority::normal), "acquire");
  std::printf("held_ns=%" PRIu64 "\n", monotonic_ns());
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms));
  const uint64_t release_ns = monotonic_ns();
  check(lock.release(), "release");
  const uint64_t released_ns = monotonic_ns();
  std::printf("release_ns=%" PRIu64 " released_ns=%" PRIu64 "\n", release_ns, released_ns);
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::strcmp(argv[1], "job") == 0) return run_job(argv[2], std::atof(argv[3]));
  if (argc == 4 && std::strcmp(argv[1], "hold") == 0) return run_holder(argv[2], std::atoi(argv[3]));
  std::fprintf(stderr, "usage: %s job <shared-file> <seconds> | hold <device-key> <hold-ms>\n", argv[0]);
  return 64;
}

// pod_worker: what one "pod" of pods_test runs, inside the PID, mount, IPC and UTS namespaces
// the test made for it, sharing only the runtime dir with the other pods.
//
//   pod_worker count COUNTER_FILE N   N times: take the device lock of host-0, read the
//                                     counter (a file in the runtime dir), yield, write it
//                                     plus one, release. Exact only under mutual exclusion.
//   pod_worker hold                   take the lock, say "holding" on stdout, wait forever
//   pod_worker wait                   take the lock, say "granted <CLOCK_MONOTONIC ns>"
//   pod_worker stall-inside           as wait, but stop inside the lock's internal critical
//                                     section (at enqueue_published), say "inside", and go on
//                                     when a line arrives on stdin
//
// Exit 0 when done; 1, with the reason on stderr, when the lock refuses.
#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/status.hpp"
#include "lock/crash_points.hpp"
#include "lock/device_lock.hpp"
#include "lock/process_identity.hpp"

using namespace vramswap::detail;

namespace {

int refused(const char* what) {
  std::fprintf(stderr, "pod_worker: %s: %s\n", what, last_error());
  return 1;
}

int count(const char* path, long n) {
  device_lock lock;
  if (device_lock::open("host-0", &lock) != ok) return refused("device_lock::open");
  const int fd = ::open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    std::perror(path);
    return 1;
  }
  void* p = ::mmap(nullptr, sizeof(uint64_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    return 1;
  }
  volatile uint64_t* counter = static_cast<volatile uint64_t*>(p);
  for (long i = 0; i < n; ++i) {
    if (lock.acquire() != ok) return refused("acquire");
    const uint64_t seen = *counter;
    sched_yield();  // widen the window a second holder would fall into
    *counter = seen + 1;
    if (lock.release() != ok) return refused("release");
  }
  return 0;
}

int hold() {
  device_lock lock;
  if (device_lock::open("host-0", &lock) != ok) return refused("device_lock::open");
  if (lock.acquire() != ok) return refused("acquire");
  std::printf("holding\n");
  std::fflush(stdout);
  for (;;) ::pause();
}

int wait_for_it() {
  device_lock lock;
  if (device_lock::open("host-0", &lock) != ok) return refused("device_lock::open");
  std::printf("waiting\n");
  std::fflush(stdout);
  acquire_info info;
  if (lock.acquire(lock_priority::normal, -1, &info) != ok) return refused("acquire");
  std::printf("granted %" PRIu64 " previous_holder_died=%d dead_holder_pid_ns=%" PRIu64 "\n", monotonic_ns(),
              info.previous_holder_died ? 1 : 0, info.dead_holder_pid_ns);
  std::fflush(stdout);
  return lock.release() == ok ? 0 : refused("release");
}

void stall_once(crash_point point) {
  static bool stalled = false;
  if (point != crash_point::enqueue_published || stalled) return;
  stalled = true;
  std::printf("inside\n");
  std::fflush(stdout);
  char line[8];
  (void)!::read(0, line, sizeof line);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "count" && argc == 4) return count(argv[2], std::strtol(argv[3], nullptr, 10));
  if (mode == "hold" && argc == 2) return hold();
  if (mode == "wait" && argc == 2) return wait_for_it();
  if (mode == "stall-inside" && argc == 2) {
    set_crash_hook(&stall_once);
    return wait_for_it();
  }
  std::fprintf(stderr, "usage: pod_worker count COUNTER_FILE N | hold | wait | stall-inside\n");
  return 2;
}

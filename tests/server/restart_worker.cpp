// A time-sharing job for restart_test: a real process with its own session, taking turns on
// the device lock until told to stop, while the test restarts the pool server under it.
//
// usage: restart_worker <bytes> <seed> <stop-file> [hold | few-fds:<frames>]
// Allocates <bytes> of device memory in four allocations (sizes that share pages and span
// them); then, round after round: acquire; check that every byte still holds what the
// previous round wrote (random data from the seed and the round); write new random data;
// release; until <stop-file> exists. With "hold", after its first round it takes the lock and
// keeps it (printing "holding") until it is killed. With "few-fds:<frames>", its descriptor
// limit leaves room to import a pool of <frames> frames but not to keep their descriptors too
// (pool/kept_descriptors.hpp), as under a low RLIMIT_NOFILE.
// Prints "rounds <n>" at the end. Exit: 0 ok, 2 an API call failed (the message says which
// and why), 3 data differed (the message says where).
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
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
#include "support/open_descriptors.hpp"
#include "support/random_bytes.hpp"
#include "support/worker_exit.hpp"

using namespace vramswap;
using namespace vramswap::detail;

namespace {

constexpr const char* k_program = "restart_worker";
void check(int rc, const char* what) { test::worker_check(k_program, rc, what); }

struct block {
  device_ptr ptr;
  uint64_t size;
};

uint64_t seed_of(uint64_t seed, int round, size_t i) { return seed * 1000003 + static_cast<uint64_t>(round) * 101 + i; }

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s <bytes> <seed> <stop-file> [hold]\n", argv[0]);
    return 64;
  }
  const uint64_t bytes = std::strtoull(argv[1], nullptr, 10);
  const uint64_t seed = std::strtoull(argv[2], nullptr, 10);
  const std::string stop_file = argv[3];
  const bool hold = argc > 4 && std::strcmp(argv[4], "hold") == 0;
  if (argc > 4 && std::strncmp(argv[4], "few-fds:", 8) == 0) {
    // The host backend holds a descriptor per imported frame; 40 more cover the rest (the
    // socket, segments, the host pool, the swap file) but not a second one per frame.
    const rlim_t frames = std::strtoull(argv[4] + 8, nullptr, 10);
    const rlim_t enough = static_cast<rlim_t>(test::open_descriptors()) + frames + 40;
    const rlimit lim{enough, enough};
    if (frames == 0 || ::setrlimit(RLIMIT_NOFILE, &lim) != 0) {
      std::fprintf(stderr, "%s: few-fds: setrlimit: %s\n", k_program, std::strerror(errno));
      return 64;
    }
  }

  std::unique_ptr<device_session> session;
  check(device_session::open(0, &session), "opening the session");
  backend& be = session->get_backend();
  std::vector<block> blocks;
  for (uint64_t size : {bytes / 2, bytes / 3, bytes - bytes / 2 - bytes / 3 - 1000, uint64_t{1000}}) {
    device_ptr p = 0;
    check(session->memory().malloc(size, &p), "malloc");
    blocks.push_back({p, size});
  }
  void* staging = nullptr;
  check(be.host_alloc(bytes / 2, &staging), "host_alloc");
  stream_id s = 0;
  check(be.stream_create(0, &s), "stream_create");

  int round = 0;
  for (;;) {
    ++round;
    check(session->acquire(), "acquire");
    for (size_t i = 0; i < blocks.size(); ++i) {
      const block& b = blocks[i];
      if (round > 1) {
        check(be.copy_d2h(staging, b.ptr, b.size, s), "copy_d2h");
        check(be.stream_synchronize(s), "sync");
        const size_t bad = test::first_mismatch(staging, b.size, seed_of(seed, round - 1, i));
        if (bad != b.size) {
          std::fprintf(stderr, "%s[%d]: round %d: byte %zu of block %zu (%llu bytes) differs from what round %d wrote\n", k_program,
                       static_cast<int>(getpid()), round, bad, i, static_cast<unsigned long long>(b.size), round - 1);
          std::fflush(nullptr);
          std::_Exit(3);
        }
      }
      test::fill_random(staging, b.size, seed_of(seed, round, i));
      check(be.copy_h2d(b.ptr, staging, b.size, s), "copy_h2d");
      check(be.stream_synchronize(s), "sync");
    }
    if (hold && round > 1) {
      std::printf("holding\n");
      std::fflush(stdout);
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    check(session->release(), "release");
    struct stat st {};
    if (!hold && ::stat(stop_file.c_str(), &st) == 0) break;
  }
  std::printf("rounds %d\n", round);
  std::fflush(stdout);
  check(be.stream_destroy(s), "stream_destroy");
  check(be.host_free(staging), "host_free");
  return 0;
}

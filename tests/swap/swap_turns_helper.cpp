// Child process of swap_turns_test (spawned, never forked): one process whose memory is
// larger than its host budget, taking turns on device "host-0" with another under the lock.
//
// usage: swap_turns_helper <index> <rounds> <log-path> <swap-dir>
// Allocates 40 MiB (20 pages of 2 MiB) with a 16 MiB host budget, so every eviction puts
// pages on disk. Each round: acquire, log "<index> in", restore_all, check every byte
// against the previous round's data, write new random data, evict_all, check that pages
// went to disk, log "<index> out", release. Exit 0 when every round passed; otherwise the
// reason on stderr and a nonzero status.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "core/backend.hpp"
#include "core/pager.hpp"
#include "core/status.hpp"
#include "lock/device_lock.hpp"
#include "support/random_bytes.hpp"
#include "swap/tiered_store.hpp"

using namespace vramswap;
using namespace vramswap::detail;

namespace {
constexpr uint64_t MiB = 1ull << 20;
constexpr uint64_t k_page = 2 * MiB;
constexpr uint64_t k_size = 40 * MiB;

[[noreturn]] void die(int code, const char* what) {
  std::fprintf(stderr, "swap_turns_helper[%d]: %s: %s\n", static_cast<int>(::getpid()), what, last_error());
  std::exit(code);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: swap_turns_helper <index> <rounds> <log-path> <swap-dir>\n");
    return 2;
  }
  const int index = std::atoi(argv[1]);
  const int rounds = std::atoi(argv[2]);
  const int log_fd = ::open(argv[3], O_WRONLY | O_APPEND | O_CLOEXEC);
  if (log_fd < 0) die(3, "opening the log");
  auto note = [&](const char* what) {
    char line[64];
    const int n = std::snprintf(line, sizeof line, "%d %s\n", index, what);
    if (::write(log_fd, line, static_cast<size_t>(n)) != n) die(4, "writing the log");
  };

  std::unique_ptr<backend> be;
  if (make_backend(backend_kind::host, &be) != ok) die(10, "make_backend");
  device_lock lock;
  if (device_lock::open("host-0", &lock) != ok) die(11, "device_lock::open");
  tiered_config tc;
  tc.slot_size = k_page;
  tc.host_limit = 16 * MiB;
  tc.swap_dir = argv[4];
  tc.queue_depth = 8;
  tc.block_size = 512 * 1024;
  tc.grow_step = 8 * MiB;
  tc.chunk_slots = 4;
  tc.write_window = 4;
  tc.spill_ahead = 2;
  tc.read_ahead = 2;
  tc.label = "host-0";
  std::unique_ptr<tiered_store> store;
  if (tiered_store::create(*be, tc, &store) != ok) die(12, "tiered_store::create");
  local_frame_source frames(*be);
  pager_config pc;
  pc.frame_size = k_page;
  pc.arena_size = 64 * MiB;
  pc.copies_in_flight = 4;
  std::unique_ptr<pager> pg;
  if (pager::create(*be, 0, *store, frames, pc, &pg) != ok) die(13, "pager::create");
  stream_id stream = 0;
  void* staging = nullptr;
  if (be->stream_create(0, &stream) != ok || be->host_alloc(k_page, &staging) != ok) die(14, "stream/staging");
  device_ptr mem = 0;
  if (pg->malloc(k_size, &mem) != ok) die(15, "malloc");

  auto seed_of = [&](int round, uint64_t page) { return static_cast<uint64_t>(index) * 1'000'000 + round * 1000 + page; };
  auto write_all = [&](int round) {
    for (uint64_t p = 0; p < k_size / k_page; ++p) {
      test::fill_random(staging, k_page, seed_of(round, p));
      if (be->copy_h2d(mem + p * k_page, staging, k_page, stream) != ok || be->stream_synchronize(stream) != ok) die(20, "write");
    }
  };
  auto check_all = [&](int round) {
    for (uint64_t p = 0; p < k_size / k_page; ++p) {
      std::memset(staging, 0, k_page);
      if (be->copy_d2h(staging, mem + p * k_page, k_page, stream) != ok || be->stream_synchronize(stream) != ok) die(21, "read");
      const size_t at = test::first_mismatch(staging, k_page, seed_of(round, p));
      if (at != k_page) {
        std::fprintf(stderr, "swap_turns_helper %d: round %d: page %llu differs at byte %zu\n", index, round,
                     static_cast<unsigned long long>(p), at);
        std::exit(22);
      }
    }
  };
  auto evict = [&]() {
    if (pg->evict_all() != ok) die(23, "evict_all");
    if (store->flush() != ok) die(24, "flush");
    if (store->bytes_in_tier(1) == 0) die(25, "no page went to disk");
  };

  if (lock.acquire() != ok) die(30, "acquire");
  write_all(0);
  evict();
  if (lock.release() != ok) die(31, "release");
  for (int r = 1; r <= rounds; ++r) {
    if (lock.acquire() != ok) die(30, "acquire");
    note("in");
    if (pg->restore_all() != ok) die(32, "restore_all");
    check_all(r - 1);
    write_all(r);
    evict();
    note("out");
    if (lock.release() != ok) die(31, "release");
  }
  pg.reset();
  be->host_free(staging);
  be->stream_destroy(stream);
  return 0;
}

// bench_disk_tier: the disk tier's write and read rates as a ratio to the disk's ceiling,
// both measured in the same run, plus an end-to-end eviction and restore through the pager.
//
//   bench_disk_tier [--no-variants] [SIZE [E2E_SIZE E2E_BUDGET]]      (sizes take K/M/G suffixes)
//
// Defaults: with the cuda backend (a GPU) SIZE=16GiB, E2E 16GiB with a 4GiB host budget;
// with the host backend SIZE=1GiB, E2E 1.5GiB with a 704MiB budget. Files go to
// VRAMSWAP_SWAP_DIR (default /var/tmp). Prints markdown tables on stdout.
//
// (a) ceiling: a plain unlinked O_DIRECT file, reserved with ONE fallocate of SIZE bytes
//     (untimed), written then read sequentially through io_uring at queue depth 32 with 1 MiB
//     blocks from fixed buffers. Run before and after (b); the faster run per direction counts.
// (b) disk tier: a tiered_store with 32 MiB pages and a small host budget, its swap file
//     empty when the timer starts (the warm-up pins the budget's slots without spilling):
//     expect_saves(SIZE's pages), as the pager does when an eviction starts, then SIZE bytes
//     of pages saved (slot_for_write) and written out (spill_all), timed to the last
//     completion, the swap file's fallocate included; then read back in key order
//     (slot_for_read + read_done), timed. Rates are bytes moved to/from disk over the time. A
//     line after the table says where the spill's time went: how long the ring held
//     queue_depth blocks, the mean number in flight, the fallocate calls (how many, how much
//     they reserved, their time), the page writes into never-written vs reused extents, and
//     the syscalls.
// (v) plain-writer variants (skipped with --no-variants): the ceiling's writer (no vramswap
//     code, same ring, QD, blocks and buffer), SIZE bytes into a new file, each timed with its
//     fallocate: one fallocate of the whole file; 1 GiB fallocates as the file is written (the
//     file grows while written, as the tier's did before it reserved ahead); and the same file
//     overwritten (every block written before, no fallocate). Ratios are to the ceiling (a).
//     They tell the disk's allocation costs apart from the tier's.
// (c) end to end: pager evict_all / restore_all of E2E_SIZE with E2E_BUDGET of host memory on
//     the default backend (VRAMSWAP_BACKEND), 32 MiB frames.
//
// Every measurement starts on a quiet disk: each file is closed so that its blocks are freed
// before close() returns (unregistered from its ring first; io_uring's teardown would
// otherwise keep the file and free it in the background, during the next measurement), then
// syncfs() (with ext4's `discard`, it waits for the discards). Untimed; the total is printed.
#include <fcntl.h>
#include <liburing.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/options.hpp"
#include "core/pager.hpp"
#include "core/status.hpp"
#include "support/uring_ceiling.hpp"
#include "swap/tiered_store.hpp"

using namespace vramswap;
using namespace vramswap::detail;

namespace {
constexpr uint64_t MiB = 1ull << 20;
constexpr uint64_t GiB = 1ull << 30;
constexpr uint64_t k_page = 32 * MiB;

using bench::ceiling;
using bench::gbps;
using bench::plain_io;
using bench::settle;
using bench::settle_s;

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "bench_disk_tier: %s: %s\n", what, last_error());
  std::exit(1);
}

// (v) The plain writer's variants, as rows of a table: write rate and ratio to the ceiling.
bool writer_variants(const std::string& dir, uint64_t size, unsigned qd, size_t block, double ceiling_w) {
  plain_io io(qd, block);
  std::printf("| plain writer (no vramswap code; QD %u, %zu MiB blocks, O_DIRECT, io_uring), %.2f GiB, fallocate timed | write GB/s "
              "| ratio to the ceiling |\n| --- | ---: | ---: |\n",
              qd, block / MiB, size / double(GiB));
  auto row = [&](const char* what, double s) { std::printf("| %s | %.2f | %.2f |\n", what, gbps(size, s), ceiling_w / s); };
  auto settled = [&]() {
    const double t0 = bench::seconds_now();
    io.close_file();
    settle_s += bench::seconds_now() - t0 + settle(dir);
  };
  // One fallocate of the whole file, inside the timer: the ceiling plus its reservation, as
  // the tier now reserves a spill.
  if (!io.open_file(dir)) return false;
  double t0 = bench::seconds_now();
  if (!io.fallocate(0, size) || !io.pass(true, size)) return false;
  row("one fallocate of the whole file, then the writes (a new file)", bench::seconds_now() - t0);
  // The same file again: every block was written before, nothing to reserve or convert.
  t0 = bench::seconds_now();
  if (!io.pass(true, size)) return false;
  row("overwriting the blocks just written (the tier reuses written extents first)", bench::seconds_now() - t0);
  // A new file while the previous one (SIZE bytes written) is freed in the background: the
  // situation the tier's spill used to be measured in, right after the ceiling's file.
  io.next_close_in_background();
  if (!io.open_file(dir) || !io.fallocate(0, size)) return false;
  t0 = bench::seconds_now();
  if (!io.pass(true, size)) return false;
  row("a new file (fallocate untimed) while the previous file is freed in the background", bench::seconds_now() - t0);
  settled();
  // The file grows while it is written, 1 GiB at a time, as the tier's did.
  if (!io.open_file(dir)) return false;
  t0 = bench::seconds_now();
  if (!io.pass(true, size, GiB)) return false;
  row("1 GiB fallocates as the file is written (a new file)", bench::seconds_now() - t0);
  settled();
  std::printf("\n");
  return true;
}

bool fail_bench(const char* what) {
  std::fprintf(stderr, "bench_disk_tier: %s: %s\n", what, last_error());
  return false;
}

// (c) The pager evicts and restores `e2e` bytes with `e2e_budget` of host memory.
bool end_to_end(backend& bref, uint64_t e2e, uint64_t e2e_budget, double ceil_w, double ceil_r, bool with_disk) {
  backend* be = &bref;
  local_frame_source frames(*be);
  tiered_config tc;
  tc.slot_size = k_page;
  tc.host_limit = e2e_budget;
  std::unique_ptr<tiered_store> store;
  if (tiered_store::create(*be, tc, &store) != ok) return fail_bench("tiered_store::create (end to end)");
  pager_config pc;
  pc.frame_size = k_page;
  std::unique_ptr<pager> pg;
  if (pager::create(*be, 0, *store, frames, pc, &pg) != ok) return fail_bench("pager::create");
  device_ptr mem = 0;
  if (pg->malloc(e2e, &mem) != ok) return fail_bench("malloc");
  stream_id s = 0;
  if (be->stream_create(0, &s) != ok) return fail_bench("stream_create");
  for (uint64_t off = 0; off < e2e; off += k_page) {
    if (be->memset_d8(mem + off, static_cast<uint8_t>(off / k_page * 7 + 1), k_page, s) != ok) return fail_bench("memset");
  }
  if (be->stream_synchronize(s) != ok) return fail_bench("synchronize");
  double t0 = bench::seconds_now();
  if (pg->evict_all() != ok) return fail_bench("evict_all");
  if (store->flush() != ok) return fail_bench("flush");
  const double te = bench::seconds_now() - t0;
  const tiered_stats es = store->stats();
  t0 = bench::seconds_now();
  if (pg->restore_all() != ok) return fail_bench("restore_all");
  const double tre = bench::seconds_now() - t0;
  const tiered_stats rs = store->stats();
  // Spot check: the first byte of every page.
  void* probe = nullptr;
  if (be->host_alloc(4096, &probe) != ok) return fail_bench("host_alloc");
  for (uint64_t off = 0; off < e2e; off += k_page) {
    if (be->copy_d2h(probe, mem + off, 4096, s) != ok || be->stream_synchronize(s) != ok) return fail_bench("copy_d2h");
    if (*static_cast<uint8_t*>(probe) != static_cast<uint8_t>(off / k_page * 7 + 1)) {
      std::fprintf(stderr, "bench_disk_tier: page at offset %" PRIu64 " came back wrong\n", off);
      return false;
    }
  }
  be->host_free(probe);
  const uint64_t disk_w = es.bytes_written, disk_r = rs.bytes_read - es.bytes_read;
  const char* tag = with_disk ? "" : " (reference: no disk)";
  std::printf("| host budget %.2f GiB%s: seconds | %.2f | %.2f |\n", e2e_budget / double(GiB), tag, te, tre);
  std::printf("| rate, GB/s of the process's memory%s | %.2f | %.2f |\n", tag, gbps(e2e, te), gbps(e2e, tre));
  if (with_disk) {
    std::printf("| bytes through the disk, GiB | %.2f | %.2f |\n", disk_w / double(GiB), disk_r / double(GiB));
    std::printf("| least possible: disk bytes / ceiling, seconds | %.2f | %.2f |\n", static_cast<double>(disk_w) / 1e9 / ceil_w,
                static_cast<double>(disk_r) / 1e9 / ceil_r);
  }
  std::printf("| host memory pinned after evict / restore, GiB%s (slots past the budget: %" PRIu64 ") | %.2f | %.2f |\n", tag,
              rs.budget_overruns, es.pinned_bytes / double(GiB), rs.pinned_bytes / double(GiB));
  pg.reset();
  be->stream_destroy(s);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  backend* be = nullptr;
  if (default_backend(&be) != ok) die("default_backend");
  const bool gpu = be->kind() == backend_kind::cuda;
  uint64_t size = gpu ? 16 * GiB : 1 * GiB;
  uint64_t e2e = gpu ? 16 * GiB : 1536 * MiB;
  uint64_t e2e_budget = gpu ? 4 * GiB : 704 * MiB;  // the least for 32 MiB pages: 16 in flight + 5 staging + 1
  bool variants = true;
  std::vector<const char*> args;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--no-variants") == 0) {
      variants = false;
    } else {
      args.push_back(argv[i]);
    }
  }
  if (args.size() > 0 && parse_size(args[0], &size, "SIZE") != ok) die("SIZE");
  if (args.size() > 2 && (parse_size(args[1], &e2e, "E2E_SIZE") != ok || parse_size(args[2], &e2e_budget, "E2E_BUDGET") != ok)) {
    die("E2E");
  }
  size = size / k_page * k_page;
  e2e = e2e / k_page * k_page;
  const std::string dir = option_text(option_id::swap_dir);

  std::printf("backend: %s; swap dir: %s; disk-tier size %.2f GiB; end to end %.2f GiB with %.2f GiB host budget\n\n", be->name(),
              dir.c_str(), size / double(GiB), e2e / double(GiB), e2e_budget / double(GiB));

  // (a) before and after (b); the faster of the two runs per direction is the ceiling, so a
  // noisy shared disk can only make the ratios look worse, never better.
  double cw = 0, cr = 0, cw2 = 0, cr2 = 0;
  settle_s += settle(dir);  // whatever ran before this program
  if (!ceiling(dir, size, 32, MiB, &cw, &cr)) return 1;

  // (b)
  tiered_config tc;
  tc.slot_size = k_page;
  tc.host_limit = 16 * k_page;
  tc.write_window = 0;  // no device copies in flight here
  std::unique_ptr<tiered_store> store;
  if (tiered_store::create(*be, tc, &store) != ok) die("tiered_store::create");
  const uint64_t pages = size / k_page;
  // Warm up (untimed): pin the host budget's slots once, as a long-running process has,
  // without spilling: the swap file must be empty (nothing reserved, nothing written) when
  // the timer starts, as the ceiling's file is new.
  uint64_t warm_pages = 0;
  while (store->stats().pinned_bytes < store->host_limit() && store->stats().bytes_written == 0 && store->stats().file_bytes == 0) {
    void* slot = nullptr;
    if (store->slot_for_write(pages + warm_pages++, k_page, &slot) != ok) die("slot_for_write (warm-up)");
  }
  for (uint64_t k = 0; k < warm_pages; ++k) store->release(pages + k);
  if (store->flush() != ok) die("flush (warm-up)");
  const tiered_stats warm = store->stats();
  const swap_file::io_stats warm_io = store->io_stats();
  if (warm.file_bytes != 0 || warm.bytes_written != 0) {
    std::printf("(note: the warm-up reached the disk: %.2f GiB reserved, %.2f GiB written before the timer)\n\n",
                warm.file_bytes / double(GiB), warm.bytes_written / double(GiB));
  }
  double t0 = bench::seconds_now();
  // As the pager does when an eviction starts: the store reserves the disk space ahead.
  if (store->expect_saves(pages) != ok) die("expect_saves");
  for (uint64_t k = 0; k < pages; ++k) {
    void* slot = nullptr;
    if (store->slot_for_write(k, k_page, &slot) != ok) die("slot_for_write");
    std::memcpy(slot, &k, sizeof k);  // a stamp to check on the way back
  }
  if (store->spill_all() != ok) die("spill_all");
  const double tw = bench::seconds_now() - t0;
  const tiered_stats after_write = store->stats();
  swap_file::io_stats ios = store->io_stats();
  ios.grows -= warm_io.grows, ios.grow_s -= warm_io.grow_s, ios.submits -= warm_io.submits, ios.sqes -= warm_io.sqes;
  ios.grow_bytes -= warm_io.grow_bytes, ios.grows_in_flight -= warm_io.grows_in_flight;
  ios.fresh_writes -= warm_io.fresh_writes, ios.overwrites -= warm_io.overwrites;
  ios.waits -= warm_io.waits, ios.busy_s -= warm_io.busy_s, ios.full_s -= warm_io.full_s, ios.depth_s -= warm_io.depth_s;
  t0 = bench::seconds_now();
  for (uint64_t k = 0; k < pages; ++k) {
    void* slot = nullptr;
    if (store->slot_for_read(k, &slot) != ok) die("slot_for_read");
    uint64_t stamp = 0;
    std::memcpy(&stamp, slot, sizeof stamp);
    if (stamp != k) {
      std::fprintf(stderr, "bench_disk_tier: page %" PRIu64 " came back as %" PRIu64 "\n", k, stamp);
      return 1;
    }
    store->read_done(k);
  }
  const double tr = bench::seconds_now() - t0;
  const tiered_stats after_read = store->stats();
  {
    const double t = bench::seconds_now();
    store.reset();  // closes the swap file: its blocks are freed before this returns
    settle_s += bench::seconds_now() - t + settle(dir);
  }
  if (!ceiling(dir, size, 32, MiB, &cw2, &cr2)) return 1;
  std::printf("ceiling runs before / after the disk tier: write %.2f / %.2f GB/s, read %.2f / %.2f GB/s\n\n", gbps(size, cw),
              gbps(size, cw2), gbps(size, cr), gbps(size, cr2));
  cw = std::min(cw, cw2);
  cr = std::min(cr, cr2);

  const double tier_w = gbps(after_write.bytes_written - warm.bytes_written, tw);
  const double tier_r = gbps(after_read.bytes_read - after_write.bytes_read, tr);
  std::printf("| measurement | write GB/s | read GB/s |\n| --- | ---: | ---: |\n");
  std::printf("| ceiling: io_uring O_DIRECT, QD 32, 1 MiB blocks, %.2f GiB | %.2f | %.2f |\n", size / double(GiB), gbps(size, cw),
              gbps(size, cr));
  std::printf("| disk tier: spill / read back, %.2f GiB in 32 MiB pages | %.2f | %.2f |\n", size / double(GiB), tier_w, tier_r);
  std::printf("| **ratio to the ceiling** (goal >= 0.90) | **%.2f** | **%.2f** |\n\n", tier_w / gbps(size, cw), tier_r / gbps(size, cr));
  std::printf("spill, %.2f s: ring full %.0f%% of the time, busy %.0f%%, mean depth %.1f; %" PRIu64 " fallocate (%.3f s); %" PRIu64
              " submits for %" PRIu64 " blocks, %" PRIu64 " waits\n",
              tw, 100 * ios.full_s / tw, 100 * ios.busy_s / tw, ios.depth_s / tw, ios.grows, ios.grow_s, ios.submits, ios.sqes, ios.waits);
  std::printf("spill reservations: %" PRIu64 " fallocate (%" PRIu64 " with writes in flight) reserved %.2f GiB (largest %.2f GiB) for "
              "%.2f GiB written; pages written into new extents %" PRIu64 ", into reused ones %" PRIu64 "\n\n",
              ios.grows, ios.grows_in_flight, ios.grow_bytes / double(GiB), ios.largest_grow / double(GiB),
              (after_write.bytes_written - warm.bytes_written) / double(GiB), ios.fresh_writes, ios.overwrites);

  // An experiment: if it cannot run (e.g. no room for two files at once), say so and go on.
  if (variants && !writer_variants(dir, size, 32, MiB, cw)) {
    std::printf("\n(plain-writer variants stopped early; the reason is on stderr)\n\n");
    settle_s += settle(dir);
  }
  std::printf("between the measurements above (untimed): each file closed, its blocks freed, syncfs: %.2f s in all\n\n", settle_s);

  // (c) with the budget, then (for reference) with a budget that holds everything.
  std::printf("| end to end (%s backend, pager, 32 MiB frames), %.2f GiB | evict | restore |\n| --- | ---: | ---: |\n", be->name(),
              e2e / double(GiB));
  if (!end_to_end(*be, e2e, e2e_budget, gbps(size, cw), gbps(size, cr), true)) return 1;
  if (!end_to_end(*be, e2e, e2e + 20 * k_page, gbps(size, cw), gbps(size, cr), false)) return 1;
  return 0;
}

// bench_pager: eviction and restore rates of the pager, each as a ratio to a plain pinned
// copy of the same bytes measured in the same run, for several sizes and frame sizes.
//
//   bench_pager [--sizes 1,8,32,64] [--frames 2,32,64,256]      (GiB, MiB)
//
// For each frame size: a host tier is grown (pinned) to the largest size first, and its
// pinning rate reported; then for each size a buffer is allocated through the pager, filled
// with a non-zero pattern, and
//   baseline D2H / H2D: the same bytes copied between the buffer and a pinned host buffer
//                       with plain asynchronous copies of up to 4 GiB each, one stream;
//   evict / restore:    pager.evict_all() / restore_all() (frames released to and re-created
//                       from the driver, as without a pool);
// ratio = baseline time / pager time (1.0 = the pager moves memory at the link's rate).
// Output: a markdown table on stdout. Uses the default backend (VRAMSWAP_BACKEND).
#include <sys/mman.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/pager.hpp"
#include "support/bench_util.hpp"
#include "core/status.hpp"
#include "swap/host_tier.hpp"

using namespace vramswap;
using namespace vramswap::detail;
using bench::check;
using bench::parse_list;

namespace {

constexpr uint64_t MiB = 1ull << 20;
constexpr uint64_t GiB = 1ull << 30;




// Plain copies of `size` bytes between `dev` and the pinned `host` buffer (reused cyclically).
double timed_copies(backend& be, stream_id s, device_ptr dev, void* host, uint64_t host_size, uint64_t size, bool to_host) {
  const double t0 = bench::seconds_now();
  for (uint64_t off = 0; off < size; off += host_size) {
    const uint64_t n = std::min(host_size, size - off);
    check(to_host ? be.copy_d2h(host, dev + off, n, s) : be.copy_h2d(dev + off, host, n, s), "baseline copy");
  }
  check(be.stream_synchronize(s), "baseline sync");
  return bench::seconds_now() - t0;
}

}  // namespace

int main(int argc, char** argv) {
  backend* be = nullptr;
  check(default_backend(&be), "backend");
  device_info info;
  check(be->get_device_info(0, &info), "device info");
  const bool gpu = be->kind() == backend_kind::cuda;
  std::vector<double> sizes = gpu ? std::vector<double>{1, 8, 32, 64} : std::vector<double>{0.25, 1};
  std::vector<double> frames_mib = gpu ? std::vector<double>{2, 32, 64, 256} : std::vector<double>{2, 32};
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--sizes") == 0) sizes = parse_list(argv[i + 1]);
    if (std::strcmp(argv[i], "--frames") == 0) frames_mib = parse_list(argv[i + 1]);
  }
  uint64_t largest = 0;
  for (double g : sizes) largest = std::max<uint64_t>(largest, static_cast<uint64_t>(g * GiB));

  // The baseline's pinned buffer: pre-faulted and registered, as the host tier's memory is.
  const uint64_t baseline_bytes = std::min<uint64_t>(largest, 4 * GiB);
  void* baseline = ::mmap(nullptr, baseline_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (baseline == MAP_FAILED) check(fail_errno(errno, "mmap %" PRIu64, baseline_bytes), "baseline buffer");
  check(be->host_register(baseline, baseline_bytes), "pinning the baseline buffer");
  stream_id s = 0;
  check(be->stream_create(0, &s), "stream");

  std::printf("# bench_pager: %s backend, %s\n\n", be->name(), info.name.c_str());
  std::printf("| size | frame | baseline D2H GB/s | evict GB/s | evict ratio | baseline H2D GB/s | restore GB/s | restore ratio |\n");
  std::printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  std::vector<std::string> pinning;
  for (double fm : frames_mib) {
    const uint64_t frame = static_cast<uint64_t>(fm * MiB);
    auto tier = std::make_unique<host_tier>(*be, frame, std::max<uint64_t>(1, GiB / frame));
    const double tp = bench::seconds_now();
    check(tier->reserve(largest), "growing the host tier");
    const double pin_s = bench::seconds_now() - tp;
    char line[160];
    std::snprintf(line, sizeof line, "frame %g MiB: host tier of %.1f GiB faulted in and pinned in %.2f s (%.1f GB/s)", fm,
                  tier->bytes_pinned() / double(GiB), pin_s, tier->bytes_pinned() / pin_s / 1e9);
    pinning.push_back(line);
    local_frame_source frames(*be);
    pager_config cfg;
    cfg.frame_size = frame;
    cfg.arena_size = 2 * largest;
    std::unique_ptr<pager> pg;
    check(pager::create(*be, 0, *tier, frames, cfg, &pg), "pager");
    for (double g : sizes) {
      const uint64_t size = static_cast<uint64_t>(g * GiB);
      device_ptr buf = 0;
      check(pg->malloc(size, &buf), "malloc");
      check(be->memset_d8(buf, 0xA5, size, s), "fill");
      check(be->stream_synchronize(s), "fill sync");
      // Warm-up, then the baseline both ways.
      timed_copies(*be, s, buf, baseline, baseline_bytes, std::min<uint64_t>(size, 256 * MiB), true);
      const double d2h = timed_copies(*be, s, buf, baseline, baseline_bytes, size, true);
      const double h2d = timed_copies(*be, s, buf, baseline, baseline_bytes, size, false);
      check(be->memset_d8(buf, 0xA5, size, s), "refill");
      check(be->stream_synchronize(s), "refill sync");
      const pager_stats before = pg->stats();
      check(pg->evict_all(), "evict_all");
      const pager_stats mid = pg->stats();
      check(pg->restore_all(), "restore_all");
      const pager_stats after = pg->stats();
      const double ev = mid.evict_seconds - before.evict_seconds;
      const double rs = after.restore_seconds - mid.restore_seconds;
      // Sanity: the first and last bytes came back.
      unsigned char* probe = static_cast<unsigned char*>(baseline);
      std::memset(probe, 0, 4096);
      check(be->copy_d2h(probe, buf + size - 4096, 4096, s), "probe");
      check(be->stream_synchronize(s), "probe sync");
      for (int i = 0; i < 4096; ++i) {
        if (probe[i] != 0xA5) check(fail(err_internal, "byte %d of the last page differs after restore", i), "verify");
      }
      std::printf("| %g GiB | %g MiB | %.1f | %.1f | %.2f | %.1f | %.1f | %.2f |\n", g, fm, size / d2h / 1e9, size / ev / 1e9, d2h / ev,
                  size / h2d / 1e9, size / rs / 1e9, h2d / rs);
      std::fflush(stdout);
      check(pg->free(buf), "free");
    }
  }
  std::printf("\n");
  for (const std::string& l : pinning) std::printf("- %s\n", l.c_str());
  check(be->host_unregister(baseline), "unpin");
  ::munmap(baseline, baseline_bytes);
  check(be->stream_destroy(s), "stream");
  return 0;
}

// A process that uses only the public C++ API, for the public API's cross-process tests.
//
// usage: api_worker hold <device> <hold-ms> <ready-file>
//   take gpu_lock(device), create <ready-file>, hold the lock <hold-ms>, release, exit 0.
// usage: api_worker fill <device> <bytes> <ready-file> <release-file>
//   take gpu_lock(device), allocate <bytes> under it (frames taken from idle processes) and
//   write every byte, create <ready-file>, hold the lock until <release-file> exists (at
//   most 120 s), free, release, exit 0.
// usage: api_worker keep <device> <bytes> <ready-file> <end-file>
//   take gpu_lock(device), allocate <bytes> under it and write every byte, release (the
//   frames stay this process's, idle, until another process asks for them), create
//   <ready-file>, wait for <end-file> (at most 120 s), check every byte under the lock, exit 0.
// usage: api_worker touch <device> <bytes> <ready-file> <go-file>
//   without the lock: allocate <bytes> and write every byte through the pointer (host
//   backend: device memory is process memory), create <ready-file>, wait for <go-file> (at
//   most 120 s), read every byte again, exit 0. Touching memory that is not backed then
//   kills it with SIGSEGV (the test checks the message vramswap prints first).
// usage: api_worker each <devices>
//   lock and unlock devices 0..<devices>-1 in turn, twice (a session opened on each), exit 0.
// usage: api_worker polled <device> <ready-file>
//   take gpu_lock(device), create <ready-file>, poll vramswap::release_requested(device)
//   (and the C call) every 10 ms until an operator asks for the lock (at most 60 s),
//   release, exit 0; exit 5 when nobody asked, 6 when the C and C++ answers differ.
// usage: api_worker mix <rounds> <seed> <bytes> <inside-file>
//   allocate <bytes> on devices 0 and 1 and fill them; then <rounds> times take device 0,
//   device 1, or both as a gang (the C++ guard or the C call, at random), check that nobody
//   else is inside a device it took (a counter per device in <inside-file>, 64 bytes, shared
//   by every worker) and that its memory there is as it left it, change it, release. Exit 7
//   when another process was inside, 3 when bytes differed.
// usage: api_worker rank <job> <rank> <world> <rounds> <bytes> <shared-file>
//   join the gang of <job> as <rank> of <world> on device <rank>, allocate <bytes> there and
//   fill them; then <rounds> times lock the device, check that nobody else is inside it, that
//   its memory is as it left it and that every rank of the gang reaches this round while it
//   holds (a round counter per rank in <shared-file>, after the devices' counters), change
//   the memory, release. It creates <shared-file>.joined<rank> once it joined. Exit 8 when a lock failed with VRAMSWAP_ERR_OWNER_DIED (printed), 9
//   when the ranks were not granted together.
// usage: api_worker after-teardown <device>
//   register an atexit handler before vramswap's first use, allocate on <device> and return
//   from main; the handler, which runs after vramswap's own teardown, frees the memory
//   (must succeed: it went with the session) and allocates (must fail, saying vramswap shut
//   down). Exit 20-22 when it did not.
// usage: api_worker fork-exit <device>
//   allocate on <device>, fork a child that calls exit(0) (atexit handlers and static
//   destructors run in it, over the parent's copies); exit 0 when the child exited 0 within
//   10 s, 30 + its signal when it was killed, 40 when it hung.
// Exit: 0 ok, 2 a vramswap::error (printed), 3 bytes differed, 4 a file never appeared,
// 64 bad usage.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <atomic>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "support/forked_child.hpp"
#include "support/signal_files.hpp"
#include "vramswap/vramswap.h"
#include "vramswap/vramswap.hpp"

namespace {

void create(const char* path) { vramswap::detail::test::create_signal_file(path); }
bool wait_for(const char* path) { return vramswap::detail::test::wait_for_signal_file(path, 120, "api_worker"); }

int usage(const char* self) {
  std::fprintf(stderr,
               "usage: %s hold <device> <hold-ms> <ready-file>\n"
               "       %s fill <device> <bytes> <ready-file> <release-file>\n"
               "       %s keep <device> <bytes> <ready-file> <end-file>\n"
               "       %s touch <device> <bytes> <ready-file> <go-file>\n"
               "       %s each <devices>\n"
               "       %s polled <device> <ready-file>\n"
               "       %s mix <rounds> <seed> <bytes> <inside-file>\n"
               "       %s rank <job> <rank> <world> <rounds> <bytes> <shared-file>\n",
               self, self, self, self, self, self, self, self);
  return 64;
}

// The mix mode (see the top).
int mix(int rounds, unsigned seed, size_t bytes, const char* inside_path) {
  const int fd = ::open(inside_path, O_RDWR | O_CREAT, 0600);
  if (fd < 0 || ::ftruncate(fd, 64) != 0) return 4;
  void* map = ::mmap(nullptr, 64, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) return 4;
  auto* inside = static_cast<std::atomic<int>*>(map);  // inside[d]: who is in device d (pid; 0 none)
  const int me = static_cast<int>(::getpid());
  unsigned char* mem[2];
  unsigned char value[2] = {static_cast<unsigned char>(seed), static_cast<unsigned char>(seed + 1)};
  for (int d = 0; d < 2; ++d) {
    vramswap::gpu_lock lock(d);
    mem[d] = static_cast<unsigned char*>(vramswap::malloc(bytes, d));
    std::memset(mem[d], value[d], bytes);
  }
  std::mt19937 rng(seed);
  for (int r = 0; r < rounds; ++r) {
    const int kind = static_cast<int>(rng() % 4);  // 0: device 0, 1: device 1, 2: the C++ gang, 3: the C gang
    std::vector<int> devs = kind == 0 ? std::vector<int>{0} : kind == 1 ? std::vector<int>{1} : std::vector<int>{1, 0};
    vramswap::gpu_lock guard(devs, std::defer_lock);
    if (kind == 3) {
      if (const int rc = vramswap_lock_devices(devs.data(), devs.size(), VRAMSWAP_PRIORITY_NORMAL, 30'000'000'000); rc != 0) {
        std::fprintf(stderr, "api_worker: vramswap_lock_devices: %s\n", vramswap_last_error());
        return 2;
      }
    } else {
      guard.lock();
    }
    for (int d : devs) {
      int nobody = 0;
      if (!inside[d].compare_exchange_strong(nobody, me)) {
        std::fprintf(stderr, "api_worker: pid %d was inside device %d too\n", nobody, d);
        return 7;
      }
      // Resident and ours: the first, a middle and the last byte (all of them would be slow).
      const size_t at[3] = {0, bytes / 2, bytes - 1};
      for (size_t i : at) {
        if (mem[d][i] != value[d]) {
          std::fprintf(stderr, "api_worker: device %d byte %zu is %u, not %u\n", d, i, mem[d][i], value[d]);
          return 3;
        }
      }
      ++value[d];
      std::memset(mem[d], value[d], bytes);
    }
    if ((rng() % 4) == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 500));
    for (int d : devs) inside[d].store(0);
    if (kind == 3) {
      if (vramswap_unlock_devices(devs.data(), devs.size()) != 0) {
        std::fprintf(stderr, "api_worker: vramswap_unlock_devices: %s\n", vramswap_last_error());
        return 2;
      }
    } else {
      guard.unlock();
    }
  }
  for (int d = 0; d < 2; ++d) vramswap::free(mem[d], d);
  return 0;
}

// The rank mode (see the top).
int rank_rounds(const char* job, int rank, int world, int rounds, size_t bytes, const char* shared_path) {
  const int fd = ::open(shared_path, O_RDWR | O_CREAT, 0600);
  if (fd < 0 || ::ftruncate(fd, 256) != 0) return 4;
  void* map = ::mmap(nullptr, 256, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) return 4;
  auto* inside = static_cast<std::atomic<int>*>(map);
  auto* round_of = reinterpret_cast<std::atomic<int>*>(static_cast<char*>(map) + 64);
  const int device = rank;
  const int me = static_cast<int>(::getpid());
  vramswap::join_gang(job, rank, world, device);
  create((std::string(shared_path) + ".joined" + std::to_string(rank)).c_str());
  auto* mem = static_cast<unsigned char*>(vramswap::malloc(bytes, device));
  unsigned char value = static_cast<unsigned char>(rank * 50);
  for (int r = 0; r <= rounds; ++r) {
    try {
      if (r == 0) {  // the first turn fills the memory
        vramswap::gpu_lock lock(device, std::chrono::seconds(30));
        std::memset(mem, value, bytes);
        continue;
      }
      vramswap::gpu_lock lock(device, std::chrono::seconds(30));
      int nobody = 0;
      if (!inside[device].compare_exchange_strong(nobody, me)) {
        std::fprintf(stderr, "api_worker: pid %d was inside device %d too\n", nobody, device);
        return 7;
      }
      if (mem[0] != value || mem[bytes - 1] != value) return 3;
      std::memset(mem, ++value, bytes);
      round_of[rank].store(r);
      for (int p = 0; p < world; ++p) {
        for (int i = 0; i < 5000 && round_of[p].load() < r; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        if (round_of[p].load() < r) {
          std::fprintf(stderr, "api_worker: rank %d held round %d without rank %d\n", rank, r, p);
          return 9;
        }
      }
      inside[device].store(0);
    } catch (const vramswap::error& e) {
      std::fprintf(stderr, "api_worker: %s\n", e.what());
      return e.code() == VRAMSWAP_ERR_OWNER_DIED ? 8 : 2;
    }
  }
  vramswap::free(mem, device);
  return 0;
}

}  // namespace

void* g_kept = nullptr;
int g_kept_device = 0;

void after_teardown() {
  if (vramswap_free(g_kept, g_kept_device) != VRAMSWAP_OK) {
    std::fprintf(stderr, "free after teardown: %s\n", vramswap_last_error());
    ::_exit(20);
  }
  void* p = nullptr;
  if (vramswap_malloc(&p, 4096, g_kept_device) != VRAMSWAP_ERR_UNAVAILABLE) ::_exit(21);
  if (std::strstr(vramswap_last_error(), "shut down") == nullptr) {
    std::fprintf(stderr, "malloc after teardown: %s\n", vramswap_last_error());
    ::_exit(22);
  }
}

// The child is forked while the session's threads run: under AddressSanitizer (whose allocator
// GCC 12's libasan does not make fork-safe) it may wait for ever on that allocator's lock,
// which run_in_forked_child tells apart by trying again; a hang on every try, or without the
// sanitizer, is the code's (40).
int fork_exit(int device) {
  void* p = nullptr;
  if (vramswap_malloc(&p, 1 << 20, device) != VRAMSWAP_OK) return 2;
  const vramswap::detail::test::forked_outcome out = vramswap::detail::test::run_in_forked_child(
      [] {
        std::exit(0);
        return 0;
      },
      std::chrono::seconds(3));
  if (out.status < 0) {
    std::fprintf(stderr, "the forked child did not end (%d tries): %s\n", out.tries, out.hung.c_str());
    return 40;
  }
  if (out.status > 128) return 30 + (out.status - 128);
  return out.status == 0 ? 0 : 41;
}

int main(int argc, char** argv) {
  if (argc < 2) return usage(argv[0]);
  const std::string mode = argv[1];
  try {
    if (mode == "after-teardown" && argc == 3) {
      std::atexit(after_teardown);  // before vramswap's first use: it runs after vramswap's teardown
      g_kept_device = std::atoi(argv[2]);
      if (vramswap_malloc(&g_kept, 1 << 20, g_kept_device) != VRAMSWAP_OK) return 2;
      return 0;
    }
    if (mode == "fork-exit" && argc == 3) return fork_exit(std::atoi(argv[2]));
    if (mode == "hold" && argc == 5) {
      vramswap::gpu_lock lock(std::atoi(argv[2]));
      create(argv[4]);
      std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(argv[3])));
      return 0;
    }
    if (mode == "polled" && argc == 4) {
      const int device = std::atoi(argv[2]);
      vramswap::gpu_lock lock(device);
      if (vramswap::release_requested(device)) return 6;  // nobody asked yet
      create(argv[3]);
      for (int i = 0; i < 6000; ++i) {
        const bool asked = vramswap::release_requested(device);
        if (asked != (vramswap_release_requested(device) == 1)) return 6;
        if (asked) return 0;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      return 5;
    }
    if (mode == "rank" && argc == 8) {
      return rank_rounds(argv[2], std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]), std::strtoull(argv[6], nullptr, 10),
                         argv[7]);
    }
    if (mode == "mix" && argc == 6) {
      return mix(std::atoi(argv[2]), static_cast<unsigned>(std::atoi(argv[3])), std::strtoull(argv[4], nullptr, 10), argv[5]);
    }
    if (mode == "each" && argc == 3) {
      for (int round = 0; round < 2; ++round) {
        for (int d = 0; d < std::atoi(argv[2]); ++d) vramswap::gpu_lock lock(d);
      }
      return 0;
    }
    if (mode == "fill" && argc == 6) {
      const int device = std::atoi(argv[2]);
      const size_t bytes = std::strtoull(argv[3], nullptr, 10);
      vramswap::gpu_lock lock(device);
      void* p = vramswap::malloc(bytes, device);
      std::memset(p, 0xA5, bytes);
      create(argv[4]);
      const bool released = wait_for(argv[5]);
      vramswap::free(p, device);
      return released ? 0 : 4;
    }
    if (mode == "keep" && argc == 6) {
      const int device = std::atoi(argv[2]);
      const size_t bytes = std::strtoull(argv[3], nullptr, 10);
      unsigned char* p = nullptr;
      {
        vramswap::gpu_lock lock(device);
        p = static_cast<unsigned char*>(vramswap::malloc(bytes, device));
        for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(i * 13 + 5);
      }
      create(argv[4]);
      if (!wait_for(argv[5])) return 4;
      vramswap::gpu_lock lock(device);
      for (size_t i = 0; i < bytes; ++i) {
        if (p[i] != static_cast<unsigned char>(i * 13 + 5)) {
          std::fprintf(stderr, "api_worker: byte %zu differs\n", i);
          return 3;
        }
      }
      vramswap::free(p, device);
      return 0;
    }
    if (mode == "touch" && argc == 6) {
      const int device = std::atoi(argv[2]);
      const size_t bytes = std::strtoull(argv[3], nullptr, 10);
      auto* p = static_cast<unsigned char*>(vramswap::malloc(bytes, device));
      for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(i * 7 + 3);
      create(argv[4]);
      if (!wait_for(argv[5])) return 4;
      for (size_t i = 0; i < bytes; ++i) {
        if (p[i] != static_cast<unsigned char>(i * 7 + 3)) {
          std::fprintf(stderr, "api_worker: byte %zu differs\n", i);
          return 3;
        }
      }
      return 0;
    }
  } catch (const vramswap::error& e) {
    std::fprintf(stderr, "api_worker: %s\n", e.what());
    return 2;
  }
  return usage(argv[0]);
}

// Configuration: one table of VRAMSWAP_* environment variables (mimalloc's options.c idea).
//
// Each option is read from the environment when asked for, unless a programmatic override
// was set with option_set(), which wins. Sizes accept K/M/G/T suffixes (powers of two, with
// or without "iB"/"B"), some also a percentage of a base. A malformed value is an error that
// names the variable, the value and what would be accepted; it is never silently replaced
// by the default.
#pragma once

#include <cstdint>
#include <string>

namespace vramswap {

// X(id, ENV_NAME, default text, help)
#define VRAMSWAP_OPTIONS(X)                                                                     \
  X(backend, "VRAMSWAP_BACKEND", "auto",                                                         \
    "backend: host | cuda | auto (cuda where a GPU is usable, else host)")                       \
  X(log_level, "VRAMSWAP_LOG", "info", "log level: error | warn | info | debug")                 \
  X(host_devices, "VRAMSWAP_HOST_DEVICES", "1", "number of emulated devices of the host backend") \
  X(host_device_memory, "VRAMSWAP_HOST_DEVICE_MEMORY", "4GiB",                                   \
    "memory of each emulated device of the host backend (size)")                                 \
  X(frame_size, "VRAMSWAP_FRAME_SIZE", "32MiB",                                                  \
    "frame size: a multiple of the device's allocation granularity (2 MiB on CUDA)")             \
  X(arena_size, "VRAMSWAP_ARENA_SIZE", "200%",                                                   \
    "virtual reservation per process and device: size, or percent of device memory")           \
  X(group, "VRAMSWAP_GROUP", "",                                                                 \
    "group allowed to share the per-device segments (mode 0660); empty: owner only (0600)")     \
  X(shm_prefix, "VRAMSWAP_SHM_PREFIX", "",                                                       \
    "prefix of the per-device segment names and the pool server's files: each prefix is a pool of its own") \
  X(runtime_dir, "VRAMSWAP_RUNTIME_DIR", "",                                                     \
    "directory of the pool servers' sockets; empty: /tmp/vramswap-<uid> (-g<gid> with VRAMSWAP_GROUP)")                        \
  X(pool_size, "VRAMSWAP_POOL_SIZE", "",                                                         \
    "pool size: bytes or percent of device memory; empty: free memory less a reserve")           \
  X(pool_idle_exit, "VRAMSWAP_POOL_IDLE_EXIT", "60",                                             \
    "seconds a pool server started on demand waits with no client before it exits")              \
  X(server_path, "VRAMSWAP_SERVER", "",                                                          \
    "path of vramswapd, for starting it on demand; empty: next to libvramswap")                  \
  X(metrics_port, "VRAMSWAP_METRICS_PORT", "",                                                  \
    "the pool server serves Prometheus metrics at http://127.0.0.1:PORT/metrics (0: any free port, " \
    "shown by `vramswap status`); empty: no metrics endpoint")                                   \
  X(evict_timeout, "VRAMSWAP_EVICT_TIMEOUT", "30",                                               \
    "seconds an acquirer waits for another process to evict frames it asked for")                \
  X(eager_release, "VRAMSWAP_EAGER_RELEASE", "0", "1: evict this process's memory at every release") \
  X(strict, "VRAMSWAP_STRICT", "0",                                                              \
    "1: evict and unmap at every release, so device access outside the lock faults (debugging)") \
  X(host_limit, "VRAMSWAP_HOST_LIMIT", "50%",                                                    \
    "pinned host memory for saved pages, per process and device: size, or percent of RAM; "     \
    "past it, least recently used pages go to the swap file")                                    \
  X(host_pool, "VRAMSWAP_HOST_POOL", "0",                                                        \
    "pinned host memory for saved pages shared by all processes of a device, made by vramswapd: " \
    "size, or percent of RAM; 0: none (each process keeps its own host tier, VRAMSWAP_HOST_LIMIT)") \
  X(swap_dir, "VRAMSWAP_SWAP_DIR", "/var/tmp",                                                   \
    "directory of the swap files (one per process and device, unlinked, O_DIRECT); "             \
    "its filesystem must support O_TMPFILE and O_DIRECT (ext4, xfs, btrfs, tmpfs >= 6.6)")      \
  X(swap_queue_depth, "VRAMSWAP_SWAP_QUEUE_DEPTH", "32", "disk requests in flight per swap file (1..4096)") \
  X(swap_block, "VRAMSWAP_SWAP_BLOCK", "1MiB",                                                   \
    "bytes per disk request (a multiple of 4 KiB; a page is split into blocks)")                 \
  X(swap_extent, "VRAMSWAP_SWAP_EXTENT", "1GiB",                                                 \
    "the least the swap file grows by (fallocate), and the unit its reservations are rounded "   \
    "up to (whole pages); a spill reserves all it needs in one piece before writing")          \
  X(oversubscribe, "VRAMSWAP_OVERSUBSCRIBE", "0",                                                \
    "1: low priority, no lock: allocations take free pool frames, then host memory, and "       \
    "lock holders take the pool frames back (run under libvramswap_preload.so)")               \
  X(oversubscribe_limit, "VRAMSWAP_OVERSUBSCRIBE_LIMIT", "50%",                                  \
    "host memory an oversubscribed process may use for what does not fit the pool: size, or "  \
    "percent of RAM")

enum class option_id {
#define VRAMSWAP_OPTION_ENUM(id, env, def, help) id,
  VRAMSWAP_OPTIONS(VRAMSWAP_OPTION_ENUM)
#undef VRAMSWAP_OPTION_ENUM
      count_
};

struct option_desc {
  const char* env_name;
  const char* default_text;
  const char* help;
};

const option_desc& describe(option_id id) noexcept;

// The effective text: override, else environment, else the default. Never null.
std::string option_text(option_id id);
// True when neither an override nor the environment sets the option.
bool option_is_default(option_id id);

// Programmatic override (wins over the environment); nullptr removes it.
void option_set(option_id id, const char* value);

// Parse "4096", "32M", "32MiB", "1.5G" (binary units). With percent_base != 0, "50%" means
// half of percent_base. Returns err_invalid_argument with a detail naming `what`.
int parse_size(const char* text, uint64_t* out, const char* what, uint64_t percent_base = 0) noexcept;

// Typed accessors: the detail of a failure names the variable and the bad value.
int option_size(option_id id, uint64_t* out, uint64_t percent_base = 0);
// The machine's physical memory in bytes (0 when unknown): the base of the options given as a
// percent of RAM (VRAMSWAP_HOST_LIMIT, VRAMSWAP_HOST_POOL, VRAMSWAP_OVERSUBSCRIBE_LIMIT).
uint64_t physical_ram() noexcept;
int option_uint(option_id id, uint64_t* out, uint64_t min_value, uint64_t max_value);

}  // namespace vramswap

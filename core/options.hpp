// Configuration: one table of VRAMSWAP_* environment variables (mimalloc's options.c idea).
//
// Each option's kind and bounds are its form in the table; the typed accessors read and
// check it by that form alone, so a bound lives in one place. The environment is read once
// per process, on the first use of any option, and kept: setting a variable later in the
// process changes nothing (options_reread_for_testing() is the tests' way round that). What
// is then in force is logged once at debug level (VRAMSWAP_LOG=debug). An override set with
// option_set() wins over the environment, at once. Sizes accept K/M/G/T suffixes (powers of
// two, with or without "iB"/"B"), some also a percentage of a base. A malformed value is
// an error that names the variable, the value and what would be accepted; it is never
// silently replaced by the default.
//
// This is also the one place that reads the environment at all: the few variables vramswap
// reads but does not own (the driver's, a service manager's, the loader's, the terminal's)
// are here too, apart from the table, as foreign_environment. No other file of vramswap's
// programs and libraries calls getenv (the tests and benchmarks do, for their own variables).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace vramswap::detail {

// How an option's value is checked, by validate_options() at start and by the typed accessors
// when it is read, so the two never disagree; also the "expected ..." of its error.
enum class option_kind : uint8_t {
  text,    // anything (a path, a group name)
  name,    // letters, digits, '-', '_', '.' (part of a file or segment name), at most 128
  choice,  // one of `choices`, separated by '|'; a choice "word:N" takes "word:" and a count in [min, max]
  flag,    // 0 or 1
  count,   // a whole number in [min, max]
  size,    // bytes with an optional K/M/G/T suffix (or a percentage of `percent_of`)
  duration,  // seconds with an optional fraction, or with a unit s/m/h; min/max in nanoseconds
};

struct option_form {
  option_kind kind = option_kind::text;
  const char* choices = nullptr;     // choice: "host|cuda|auto"
  uint64_t min = 0;                  // count: the range; size: the range of sizes given in bytes
  uint64_t max = UINT64_MAX;
  uint64_t multiple = 0;             // size: a multiple of this (0: any)
  const char* percent_of = nullptr;  // size: what a percentage is of ("RAM"); nullptr: none accepted
};

constexpr option_form text_form() { return {}; }
constexpr option_form name_form() { return {option_kind::name}; }
constexpr option_form choice_form(const char* choices) { return {option_kind::choice, choices}; }
// Choices of which one ("share:N") carries a number from min to max.
constexpr option_form choice_form(const char* choices, uint64_t min, uint64_t max) {
  return {option_kind::choice, choices, min, max};
}
constexpr option_form flag_form() { return {option_kind::flag, nullptr, 0, 1}; }
constexpr option_form count_form(uint64_t min, uint64_t max) { return {option_kind::count, nullptr, min, max}; }
constexpr option_form size_form(uint64_t min = 0, uint64_t max = UINT64_MAX, uint64_t multiple = 0) {
  return {option_kind::size, nullptr, min, max, multiple};
}
constexpr option_form percent_form(const char* percent_of) {
  return {option_kind::size, nullptr, 0, UINT64_MAX, 0, percent_of};
}
constexpr option_form duration_form(uint64_t max_ns) { return {option_kind::duration, nullptr, 0, max_ns}; }
constexpr uint64_t k_ns_per_day = 24ull * 3600 * 1'000'000'000;

// X(id, ENV_NAME, default text, form, help). An empty default means "not set": the help says
// what happens then, and an empty value is accepted.
#define VRAMSWAP_OPTIONS(X)                                                                     \
  X(backend, "VRAMSWAP_BACKEND", "auto", choice_form("host|cuda|auto"),                          \
    "backend: host | cuda | auto (cuda where a GPU is usable, else host)")                       \
  X(log_level, "VRAMSWAP_LOG", "warn", choice_form("error|warn|info|debug"),                     \
    "log level: error | warn | info | debug. Unset: warn in programs that use the library (and "  \
    "the vramswap command), info in vramswapd, whose log is a file of its own")                  \
  X(host_devices, "VRAMSWAP_HOST_DEVICES", "1", count_form(1, 64),                               \
    "number of emulated devices of the host backend")                                           \
  X(host_device_memory, "VRAMSWAP_HOST_DEVICE_MEMORY", "4GiB", size_form(1),                     \
    "memory of each emulated device of the host backend (size)")                                 \
  X(frame_size, "VRAMSWAP_FRAME_SIZE", "32MiB", size_form(1),                                    \
    "frame size: a multiple of the device's allocation granularity (2 MiB on CUDA)")             \
  X(arena_size, "VRAMSWAP_ARENA_SIZE", "1000%", percent_form("device memory"),                   \
    "virtual reservation per process and device: size, or percent of device memory")           \
  X(group, "VRAMSWAP_GROUP", "", text_form(),                                                    \
    "group whose users share the runtime dir and every file in it (mode 2770 / 0660, owned by "   \
    "the group; a name or a number); empty: owner only (0700 / 0600). docs/security.md")        \
  X(shm_prefix, "VRAMSWAP_SHM_PREFIX", "", name_form(),                                          \
    "prefix of the per-device segment names and of the pool server's files (socket, locks, log), " \
    "so that separate deployments or test runs in one runtime dir never collide: each prefix "    \
    "is a pool of its own, with its own server")                                                 \
  X(runtime_dir, "VRAMSWAP_RUNTIME_DIR", "", text_form(),                                        \
    "the directory of everything the processes of a device share: lock and pool segments, the "  \
    "pool server's socket, lock files and log (containers share a device by sharing this "       \
    "directory alone; another directory is another pool); empty: /dev/shm/vramswap-<uid> "            \
    "(-g<gid> with VRAMSWAP_GROUP). It must be yours (or the group's) with mode 0700 (2770 or "   \
    "0770): anything else is refused, naming its owner")                                         \
  X(pool_size, "VRAMSWAP_POOL_SIZE", "", percent_form("device memory"),                          \
    "pool size: bytes or percent of device memory; empty: free memory less a reserve")           \
  X(pool_idle_exit, "VRAMSWAP_POOL_IDLE_EXIT", "60", count_form(0, 365ull * 24 * 3600),          \
    "seconds a pool server started on demand waits with no client before it exits")              \
  X(server_path, "VRAMSWAP_SERVER", "", text_form(),                                             \
    "path of vramswapd, for starting it on demand; empty: next to the library holding vramswap")  \
  X(metrics_port, "VRAMSWAP_METRICS_PORT", "", count_form(0, 65535),                             \
    "the pool server serves Prometheus metrics at http://127.0.0.1:PORT/metrics, or at the "      \
    "address of `vramswapd --metrics-address`, with /healthz and /readyz for probes (0: any free " \
    "port, shown by `vramswap status`); empty: no metrics endpoint")                             \
  X(evict_timeout, "VRAMSWAP_EVICT_TIMEOUT", "30", count_form(1, 86400),                         \
    "seconds an acquirer waits for another process to evict frames it asked for (an acquire's "  \
    "own timeout, and Ctrl-C, end that wait sooner)")                                            \
  X(wait_notice, "VRAMSWAP_WAIT_NOTICE", "10", count_form(0, 86400),                             \
    "seconds a thread waits for the device lock before it logs, once per wait (at warn) and at " \
    "most every 6 times this per process and device (the next one counts the waits held back), " \
    "who holds it: pid, command, user, and for how long; 0: never. A timeout's error says the "  \
    "same")                                                                                       \
  X(max_hold, "VRAMSWAP_MAX_HOLD", "0", duration_form(365 * k_ns_per_day),                        \
    "the longest this process holds a device's lock while others wait: past it, its hold is "   \
    "flagged (`vramswap status`, the metric vramswap_holder_over_hold_limit), it logs one warning " \
    "naming who waits, and its next acquire queues behind every waiter that waited for it "      \
    "(docs/concepts.md, Fair turns); 0: no limit. Advisory: nothing is taken from a holder")      \
  X(release_signal, "VRAMSWAP_RELEASE_SIGNAL", "", choice_form("SIGINT|SIGTERM|SIGUSR1|SIGUSR2"), \
    "a signal this process sends itself when an operator asks it to release a device's lock "   \
    "(`vramswap release-request`) while it holds it, e.g. SIGINT for a KeyboardInterrupt in "    \
    "Python; empty: none (the request is logged and vramswap.release_requested() says so)")      \
  X(job_name, "VRAMSWAP_JOB_NAME", "", text_form(),                                             \
    "the job's name in `vramswap status`, shown instead of its command line (\"train-llama\"): " \
    "the environment of a process is not readable by other users, so each process records the " \
    "name in its pool member slot when it joins; the first 55 bytes are kept. Empty: the "      \
    "command line is shown")                                                                     \
  X(eager_release, "VRAMSWAP_EAGER_RELEASE", "0", flag_form(),                                   \
    "1: evict this process's memory at every release")                                           \
  X(evict_ahead, "VRAMSWAP_EVICT_AHEAD", "1", flag_form(),                                       \
    "1: when this process takes the device's lock next (it waits for the lock with nobody "      \
    "queued before it, or the processes' release and acquire times predict it next) and the pool lacks " \
    "free frames for its memory, it asks the idle processes predicted to come after it to evict " \
    "that much now, so that its switch is a restore only (docs/pool_server.md, Eviction ahead of " \
    "need); 0: frames are asked for only at the acquire")                                          \
  X(strict, "VRAMSWAP_STRICT", "0", flag_form(),                                                 \
    "1: evict and unmap at every release, so device access outside the lock faults (debugging)") \
  X(host_limit, "VRAMSWAP_HOST_LIMIT", "50%", percent_form("RAM"),                               \
    "pinned host memory for saved pages, per process and device: size, or percent of RAM; "     \
    "past it, least recently used pages go to the swap file")                                    \
  X(host_pin_ahead, "VRAMSWAP_HOST_PIN_AHEAD", "1", flag_form(),                                 \
    "1: threads pin this process's host memory for saved pages as its device memory grows "   \
    "(up to VRAMSWAP_HOST_LIMIT), waiting while it maps device memory, so that its first "       \
    "eviction runs at the link's rate once pinning has caught up (about a second per 16 GiB "     \
    "after the allocation); 0: pin as evictions need it (slower first eviction, no host memory " \
    "before it, the fastest allocation)")                                                        \
  X(host_pool, "VRAMSWAP_HOST_POOL", "0", percent_form("RAM"),                                   \
    "pinned host memory for saved pages shared by all processes of a device, made by vramswapd: " \
    "size, or percent of RAM; 0: none (each process keeps its own host tier, VRAMSWAP_HOST_LIMIT); " \
    "with VRAMSWAP_SWAP_DIR set as well, saved pages past the pool spill to each process's swap file") \
  X(swap_dir, "VRAMSWAP_SWAP_DIR", "/var/tmp", text_form(),                                      \
    "directory of the swap files (one per process and device, unlinked, O_DIRECT); "             \
    "its filesystem must support O_TMPFILE and O_DIRECT (ext4, xfs, btrfs, tmpfs >= 6.6); "    \
    "with a shared host pool (VRAMSWAP_HOST_POOL), setting it puts a swap file behind the pool") \
  X(swap_queue_depth, "VRAMSWAP_SWAP_QUEUE_DEPTH", "32", count_form(1, 4096),                    \
    "disk requests in flight per swap file (1..4096)")                                           \
  X(swap_block, "VRAMSWAP_SWAP_BLOCK", "1MiB", size_form(4096, 1ull << 30, 4096),                \
    "bytes per disk request (a multiple of 4 KiB, at most 1 GiB; a page is split into blocks)")  \
  X(swap_extent, "VRAMSWAP_SWAP_EXTENT", "1GiB", size_form(1),                                   \
    "the least the swap file grows by (fallocate), and the unit its reservations are rounded "   \
    "up to (whole pages); a spill reserves all it needs in one piece before writing")          \
  X(oversubscribe, "VRAMSWAP_OVERSUBSCRIBE", "0", flag_form(),                                   \
    "1: low priority, no lock: allocations take free pool frames, then host memory, and "       \
    "lock holders take the pool frames back (run under libvramswap_preload.so; "                 \
    "docs/oversubscription.md)")                                                                 \
  X(oversubscribe_limit, "VRAMSWAP_OVERSUBSCRIBE_LIMIT", "50%", percent_form("RAM"),             \
    "host memory an oversubscribed process may use for what does not fit the pool: size, or "  \
    "percent of RAM")                                                                            \
  X(oversubscribe_ahead, "VRAMSWAP_OVERSUBSCRIBE_AHEAD", "", percent_form("RAM"),                \
    "host frames an oversubscribed process makes ahead of reclaims (pinned host memory, within " \
    "VRAMSWAP_OVERSUBSCRIBE_LIMIT): unset, as many as its pages in lent pool frames; a size, or " \
    "percent of RAM, bounds them lower; 0 turns it off (a reclaim then creates them while the "  \
    "lock holder waits). docs/oversubscription.md")                                              \
  X(oversubscribe_compute, "VRAMSWAP_OVERSUBSCRIBE_COMPUTE", "yield",                            \
    choice_form("yield|share:N|free", 1, 99),                                                    \
    "what an oversubscribed process's device work does while a lock holder holds the device: "  \
    "yield (new launches wait at the launch gate until the holder releases), share:N (they go "  \
    "on for N% of each 10 ms, N from 1 to 99), free (they run beside the holder). "             \
    "Work already queued runs on. docs/oversubscription.md, Compute")                            \
  X(oversubscribe_placement, "VRAMSWAP_OVERSUBSCRIBE_PLACEMENT", "0", flag_form(),               \
    "1: an oversubscribed process observes which pages its kernel launches use (a sample of "   \
    "launches' arguments) and, about once a second, swaps the most used pages in host frames "  \
    "with the least used in its pool frames; 0 (the default, until it pays on real "             \
    "programs): pages stay where they were first backed. docs/oversubscription.md, Placement by use") \
  X(preload_backtrace, "VRAMSWAP_PRELOAD_BACKTRACE", "0", flag_form(),                           \
    "1: libvramswap_preload.so prints the native stack to stderr when the program crashes "     \
    "(SIGSEGV, SIGBUS, SIGILL), for reports of a program that fails only under the shim. Read "  \
    "when the shim is loaded, before the program runs: setting it from within the program has " \
    "no effect. docs/oversubscription.md")

enum class option_id {
#define VRAMSWAP_OPTION_ENUM(id, env, def, form, help) id,
  VRAMSWAP_OPTIONS(VRAMSWAP_OPTION_ENUM)
#undef VRAMSWAP_OPTION_ENUM
      count_
};

struct option_desc {
  const char* env_name;
  const char* default_text;
  option_form form;
  const char* help;
};

const option_desc& describe(option_id id) noexcept;

// The effective text: override, else environment, else the default. Never null.
std::string option_text(option_id id);
// True when neither an override nor the environment sets the option.
bool option_is_default(option_id id);

// Programmatic override (wins over the environment); nullptr removes it.
void option_set(option_id id, const char* value);

// Tests only: read the environment again, for a test that sets a variable and then needs
// this process to see it (the environment is otherwise read once per process): the options
// and the foreign_environment below.
void options_reread_for_testing();

// Parse "4096", "32M", "32MiB", "1.5G" (binary units). With percent_base != 0, "50%" means
// half of percent_base. Returns err_invalid_argument with a detail naming `what`.
int parse_size(const char* text, uint64_t* out, const char* what, uint64_t percent_base = 0) noexcept;

// Typed accessors: the detail of a failure names the variable, the bad value and what the
// option accepts. option_size applies the option's form (range, multiple; a percentage of
// percent_base only where the option takes one).
int option_size(option_id id, uint64_t* out, uint64_t percent_base = 0);
// The machine's physical memory in bytes (0 when unknown): the base of the options given as a
// percent of RAM (VRAMSWAP_HOST_LIMIT, VRAMSWAP_HOST_POOL, VRAMSWAP_OVERSUBSCRIBE_LIMIT).
uint64_t physical_ram() noexcept;
// A count or flag option, in the range of its form.
int option_uint(option_id id, uint64_t* out);
// A duration option, in nanoseconds, in the range of its form.
int option_duration_ns(option_id id, uint64_t* out);
// Parse a duration: "90", "0.3", "90s", "30m", "1.5h" (seconds unless a unit says otherwise).
int parse_duration_ns(const char* text, uint64_t* out, const char* what) noexcept;

// What the option accepts, in words ("a whole number from 1 to 4096"), as its errors say it.
std::string option_accepted(option_id id);
// Check `text` as a value of the option: ok, or err_invalid_argument whose detail names the
// variable, the value and what is accepted.
int option_check(option_id id, const char* text);

// VRAMSWAP_* variables that are not options of the library but are read by another part of
// vramswap (the Python package, the preload shim, the tests and benchmarks): known names, so
// that they are never reported as unknown. The one list of them.
struct other_variable {
  const char* env_name;
  const char* read_by;
};
const other_variable* other_variables(size_t* count) noexcept;

// The known VRAMSWAP_* name (an option or an other_variable) closest to `name` by edit
// distance, ignoring case; empty when none is close enough to be a likely typo.
std::string closest_known_name(const std::string& name);

// The one check of the settings at start (the runtime's first session, vramswapd, the CLI):
// every option's value (override or environment) against its form. Returns
// err_invalid_argument naming every bad variable, its value and what it accepts, and changes
// nothing. Each VRAMSWAP_* variable of the environment that is neither an option nor an
// other_variable gets one warning per process, naming it and the closest known name.
int validate_options();

// VRAMSWAP_PRELOAD_BACKTRACE as the environment has it when libvramswap_preload.so is loaded:
// true for "1". For the shim's constructor, which runs before main, perhaps before this
// file's objects are constructed, and must not make the once-per-process read of the table
// (that read logs, and would fix every option before the program could set one): it looks
// at this one variable alone, by its table row, and keeps nothing. Any other value is off
// here; a malformed one is refused at start like any option's, by validate_options() at the
// process's first session.
bool preload_backtrace_at_load() noexcept;

// --- The environment that vramswap reads but does not own ---------------------------------
//
// Variables whose meaning belongs to another program (the CUDA driver, a service manager, the
// dynamic loader, the terminal), and the marker the library leaves for the processes it
// starts. Not settings: not in the options table, not checked by validate_options(), and
// their values are their owners' to define. Read here all the same, like the options: once
// per process, at the first ask, and kept (options_reread_for_testing() reads them again);
// each in the one form its reader needs.
struct foreign_environment {
  // CUDA_VISIBLE_DEVICES as set, an empty value included (it hides every device); nullopt when
  // unset. Only quoted in the CUDA backend's errors: the driver is what interprets it.
  std::optional<std::string> cuda_visible_devices;
  // NOTIFY_SOCKET: where a service manager (systemd, Type=notify) listens for the process's
  // state (server/service_notify.hpp); empty when unset or empty.
  std::string notify_socket;
  // LD_PRELOAD as set; nullopt when unset. vramswapd refuses to run with the shim in it.
  std::optional<std::string> ld_preload;
  // NO_COLOR is set and not empty (no-color.org): the CLI does not color its output.
  bool no_color = false;
  // TERM is "dumb": a terminal that shows no color.
  bool dumb_terminal = false;
  // VRAMSWAP_NO_GPU_NOTED: which process of this process tree already said that it found no
  // GPU (its pid, or what a user set to silence that warning); empty when none did. The first
  // process that says it sets it (mark_no_gpu_noted), so that the processes it starts (fork,
  // fork and exec, Python's multiprocessing and DataLoader workers) inherit it and do not say
  // it again: a job of many processes says it once.
  std::string no_gpu_noted_by;
};

// The foreign environment as read at the first ask. A copy: mark_no_gpu_noted() changes the
// kept one.
foreign_environment process_foreign_environment();

// This process said that it found no GPU: VRAMSWAP_NO_GPU_NOTED=<its pid> in the environment,
// for the processes it starts, and in the kept foreign environment, for its own later asks.
void mark_no_gpu_noted();

}  // namespace vramswap::detail

// pool_report: a device's state as observers see it, for `vramswap status` (which renders it:
// cli/status_view.hpp), the pool server's metrics endpoint, and tests. Read from the pool
// segment (frame table, member slots) and the device lock's queue, without initializing any
// backend (no CUDA): devices are found by their pool segments in the runtime dir.
//
// The per-process statistics come from one field list (VRAMSWAP_PROCESS_STATS), so the
// struct, the text and JSON renderings and the Prometheus metrics never disagree (the
// mimalloc-stats idea). Times are nanoseconds here; every rendering shows them in seconds.
// Values are hints read word by word while processes run: a report is not an atomic
// snapshot, and a field may be a moment older than its neighbour.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "lock/turn_histograms.hpp"

namespace vramswap::detail {

class pool_segment;
class device_lock;

// X(field, kind, prometheus name, divisor, help). kind: gauge or counter; the Prometheus
// value is the field divided by `divisor` (nanoseconds are exported as seconds).
#define VRAMSWAP_PROCESS_STATS(X)                                                                                  \
  X(resident_bytes, gauge, "vramswap_process_resident_bytes", 1, "Bytes of the pool's frames that hold this process's pages") \
  X(host_bytes, gauge, "vramswap_process_host_bytes", 1, "Bytes of saved pages in the process's host memory tier")  \
  X(disk_bytes, gauge, "vramswap_process_disk_bytes", 1, "Bytes of saved pages only in the process's swap file")   \
  X(host_pinned_bytes, gauge, "vramswap_process_host_pinned_bytes", 1,                                             \
    "Bytes of host memory the process pinned of its own for its pages, used or not")                              \
  X(outside_pool_bytes, gauge, "vramswap_process_outside_pool_bytes", 1,                                           \
    "Bytes of device memory the process got past vramswap (outside the pool), as the preload shim saw them")     \
  X(acquires, counter, "vramswap_process_acquires_total", 1, "Lock acquisitions (re-entries not counted)")          \
  X(swaps_in, counter, "vramswap_process_swaps_in_total", 1, "Acquisitions that brought memory in")               \
  X(bytes_in, counter, "vramswap_process_bytes_in_total", 1, "Bytes copied into the device (restores)")            \
  X(bytes_out, counter, "vramswap_process_bytes_out_total", 1, "Bytes copied out of the device (evictions)")       \
  X(evictions_served, counter, "vramswap_process_evictions_served_total", 1,                                       \
    "Frames evicted at other processes' request")                                                                  \
  X(lock_wait_ns, counter, "vramswap_process_lock_wait_seconds_total", 1e9, "Time spent queued for the lock")      \
  X(restore_ns, counter, "vramswap_process_restore_seconds_total", 1e9, "Time spent bringing memory in after the grant") \
  X(evict_ns, counter, "vramswap_process_evict_seconds_total", 1e9, "Time spent evicting memory")

struct process_report {
  uint32_t member = 0;
  pid_t pid = 0;
  uint64_t pid_ns = 0;           // the PID namespace `pid` belongs to
  std::string command;           // /proc/<pid>/comm ("?" when gone; "(in another PID namespace)")
  // Who it is, for people: its command line, shortened (pool/process_label.hpp), from /proc
  // or, for a process of another PID namespace, as it recorded it in its member slot; the
  // job name it recorded (VRAMSWAP_JOB_NAME; "" when not set); its effective uid and user
  // name; the container, pod or batch job its cgroup names ("" when none, or not visible).
  std::string command_line;
  std::string job;
  uint32_t uid = 0;
  bool have_uid = false;
  std::string user;
  std::string container;
  std::string phase;             // idle | waiting | restoring | running
  bool stopped = false;          // SIGSTOP, Ctrl-Z or a debugger (/proc/<pid>/stat state T or t)
  bool holding = false;
  uint64_t holding_since_ns = 0;  // CLOCK_MONOTONIC of the grant; 0 when not holding
  uint32_t frames = 0;           // frames owned (active, idle or requested)
#define VRAMSWAP_PROCESS_FIELD(field, kind, prom, div, help) uint64_t field = 0;
  VRAMSWAP_PROCESS_STATS(VRAMSWAP_PROCESS_FIELD)
#undef VRAMSWAP_PROCESS_FIELD

  // The name a person knows the process by: its job name, else its command line, else comm.
  const std::string& label() const noexcept { return !job.empty() ? job : !command_line.empty() ? command_line : command; }
};

struct queue_report {
  pid_t pid = 0;
  pid_t tid = 0;
  uint64_t pid_ns = 0;  // the PID namespace `pid` and `tid` belong to
  std::string priority;  // normal | high
  uint64_t ticket = 0;
  bool holding = false;
  uint64_t enqueue_ns = 0;  // CLOCK_MONOTONIC
  bool stopped = false;     // as process_report::stopped
  uint32_t uid = 0;         // the thread's effective uid, as its lock slot records it
  // As process_report's: the member's when the process is one, else read from /proc.
  std::string command, command_line, job, user, container;
  const std::string& label() const noexcept { return !job.empty() ? job : !command_line.empty() ? command_line : command; }
};

// Is the pool's server (vramswapd) running? It holds its segment's flock all its life; an
// observer asks the kernel about its pid (this PID namespace) or about the flock
// (/proc/locks, which shows the locks of this namespace and the ones below it).
enum class server_state {
  running,
  dead,     // its pid is gone (or another process's now): the segment is a dead server's
  unknown,  // a server of a PID namespace this one cannot see
};

struct device_report {
  std::string key;           // "host-0", "GPU-<uuid>"
  int index = -1;            // the device's number (pool/device_index.hpp; vramswapd --device for its metrics); -1 unknown
  std::string segment;       // the pool segment's shm name
  pid_t server_pid = 0;      // as the header says; meaningful only while `server` is running
  server_state server = server_state::running;
  uint32_t metrics_port = 0;  // 0: none
  // Its host as a URL writes it ("127.0.0.2", "[::1]"), from this network namespace's TCP
  // listeners (pool/listen_address.hpp); "" when unknown (another network namespace; the
  // server's own metrics never look).
  std::string metrics_host;
  uint64_t frame_size = 0;
  uint32_t frame_count = 0;
  uint32_t frames_free = 0, frames_active = 0, frames_idle = 0, frames_requested = 0;
  uint32_t frames_lent = 0;  // to oversubscribed processes (lent, not yet requested)
  uint32_t host_slots = 0, host_slots_used = 0;  // the shared host pool (VRAMSWAP_HOST_POOL); 0: none
  uint64_t host_slot_size = 0;
  uint64_t now_ns = 0;       // CLOCK_MONOTONIC when the report was taken
  bool have_queue = false;   // the lock segment was readable
  std::string queue_error;   // why not
  std::vector<queue_report> queue;      // holder first, then waiters in grant order
  // By member index. A member whose process has exited (its slot not yet repaired: the
  // server repairs it soon, once no process holds its GPU context, or never when the server
  // is dead) is not listed, only counted, with the frames it still owns.
  std::vector<process_report> processes;
  uint32_t exited = 0;
  uint32_t exited_frames = 0;
  // The holder (pid 0 when nobody holds the lock), from the queue, else from the members.
  pid_t holder_pid = 0;
  uint64_t holder_pid_ns = 0;
  // Queue entries of exited processes (their slots not yet repaired) are left out of
  // `queue`; a holder among them is named here (0: none), as it no longer holds anything.
  pid_t exited_holder_pid = 0;
  // How long holds last (the lock's moving averages; 0 before the first release), and
  // whether they are regular enough for waiters to wake ahead of a release (docs/lock.md).
  uint64_t hold_mean_ns = 0, hold_jitter_ns = 0;
  bool holds_predictable = false;
  // For the metrics (pool/prometheus_report.cpp):
  uint64_t holder_granted_ns = 0;  // CLOCK_MONOTONIC of the holder's grant, from the lock (0: nobody, or no lock)
  // CLOCK_MONOTONIC since when the holder is past its VRAMSWAP_MAX_HOLD while others wait
  // (device_lock::holder_over_hold_limit); 0: not, or no lock.
  uint64_t holder_over_limit_since_ns = 0;
  bool have_turns = false;         // the lock segment was open: the turn histograms below were read
  lock_layout::turn_counts turn_wait, turn_hold, turn_switching;

  // The member that holds the lock; nullptr when nobody does or the holder is no member.
  const process_report* holder() const noexcept;
};

// Device keys with a pool segment under the current VRAMSWAP_SHM_PREFIX, sorted.
int discover_devices(std::vector<std::string>* keys) noexcept;

// Report on `pool` (and `lock`'s queue when lock != nullptr).
int collect_report(const std::string& key, const pool_segment& pool, device_lock* lock, device_report* out);
// Open `key`'s pool segment read-only and its lock (when its segment exists) and report.
int collect_report(const std::string& key, device_report* out);

// The text and JSON renderings are the CLI's (cli/status_view.hpp).
// The Prometheus text format (0.0.4): pool/prometheus_report.cpp, docs/observability.md.
std::string render_prometheus(const std::vector<device_report>& devices);

}  // namespace vramswap::detail

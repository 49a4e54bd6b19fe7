#include "pool/pool_report.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "core/options.hpp"
#include "core/status.hpp"
#include "lock/device_lock.hpp"
#include "pool/pool_layout.hpp"
#include "pool/pool_segment.hpp"
#include "lock/process_identity.hpp"
#include "lock/runtime_dir.hpp"
#include "lock/shared_segment.hpp"

namespace vramswap::detail {
using namespace pool_layout;

namespace {

// The command of `pid`, of PID namespace `pid_ns`: only a pid of this process's own
// namespace can be looked up here.
std::string command_of(pid_t pid, uint64_t pid_ns) {
  if (!visible_here(pid_ns)) return "(in another PID namespace)";
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/comm", static_cast<int>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "?";
  char buf[64] = {};
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  std::string s(buf, n > 0 ? static_cast<size_t>(n) : 0);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
  return s.empty() ? "?" : s;
}

const char* phase_name(uint32_t phase) {
  switch (phase) {
    case phase_idle: return "idle";
    case phase_waiting: return "waiting";
    case phase_restoring: return "restoring";
    case phase_running: return "running";
  }
  return "?";
}

std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

std::string bytes_text(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? fmt("%" PRIu64 " B", b) : fmt("%.1f %s", v, units[u]);
}

double seconds_since(uint64_t then_ns, uint64_t now_ns) { return then_ns != 0 && now_ns > then_ns ? (now_ns - then_ns) / 1e9 : 0.0; }

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      out += fmt("\\u%04x", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string command_for(const device_report& d, pid_t pid, uint64_t pid_ns) {
  for (const process_report& p : d.processes) {
    if (p.pid == pid && p.pid_ns == pid_ns) return p.command;
  }
  return command_of(pid, pid_ns);
}

}  // namespace

int discover_devices(std::vector<std::string>* keys) noexcept {
  try {
    std::string marker;
    VS_TRY(pool_segment::name_for("x", &marker));  // "/<prefix>vramswap-<owner>-pool-x"
    marker = marker.substr(1, marker.size() - 2);  // "<prefix>vramswap-<owner>-pool-"
    keys->clear();
    std::string dir;
    VS_TRY(runtime_dir(/*create=*/false, &dir));
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr && errno == ENOENT) return ok;  // no runtime dir: no device in use
    if (d == nullptr) return fail_errno(errno, "status: cannot list the runtime dir %s", dir.c_str());
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.size() > marker.size() && name.compare(0, marker.size(), marker) == 0) keys->push_back(name.substr(marker.size()));
    }
    ::closedir(d);
    std::sort(keys->begin(), keys->end());
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "status: out of memory");
  }
  return ok;
}

int collect_report(const std::string& key, const pool_segment& pool, device_lock* lock, device_report* out) {
  device_report& d = *out;
  d = device_report{};
  d.key = key;
  d.segment = pool.name();
  // The host backend's keys carry the index; a GPU's key is its UUID (its server knows the index).
  if (key.rfind("host-", 0) == 0 && key.size() > 5 && key.size() < 12 && key.find_first_not_of("0123456789", 5) == std::string::npos) {
    d.index = std::atoi(key.c_str() + 5);
  }
  const pool_header* h = pool.header();
  d.server_pid = h->server_pid;
  d.metrics_port = h->metrics_port.load(std::memory_order_relaxed);
  d.frame_size = h->frame_size;
  d.frame_count = h->frame_count;
  d.now_ns = monotonic_ns();
  d.host_slots = pool.host_slot_count();
  d.host_slot_size = pool.host_slot_size();
  d.host_slots_used = d.host_slots != 0 ? pool.count_slots(slot_used) : 0;
  std::vector<uint32_t> owned(k_member_count, 0);
  for (uint32_t f = 0; f < d.frame_count; ++f) {
    const frame_word w = frame_word::decode(pool.read(f));
    switch (w.state) {
      case frame_free: ++d.frames_free; break;
      case frame_active: ++d.frames_active; break;
      case frame_idle: ++d.frames_idle; break;
      case frame_requested: ++d.frames_requested; break;
      case frame_lent: ++d.frames_lent; break;
    }
    if (w.state != frame_free && w.owner < k_member_count) ++owned[w.owner];
  }
  for (uint32_t m = 0; m < k_member_count; ++m) {
    const member_slot& s = pool.member(m);
    if (s.state.load(std::memory_order_acquire) != member_live) continue;
    process_report p;
    p.member = m;
    p.pid = s.pid;
    p.pid_ns = s.pid_ns;
    p.command = command_of(s.pid, s.pid_ns);
    p.holding = s.holding.load(std::memory_order_relaxed) != 0;
    p.phase = phase_name(s.phase.load(std::memory_order_relaxed));
    p.stopped = visible_here(s.pid_ns) && is_stopped_state(process_state(s.pid));
    p.holding_since_ns = p.holding ? s.holding_since_ns.load(std::memory_order_relaxed) : 0;
    p.frames = owned[m];
    p.resident_bytes = uint64_t{owned[m]} * d.frame_size;
    p.host_bytes = s.host_bytes.load(std::memory_order_relaxed);
    p.disk_bytes = s.disk_bytes.load(std::memory_order_relaxed);
    p.acquires = s.acquires.load(std::memory_order_relaxed);
    p.swaps_in = s.swaps_in.load(std::memory_order_relaxed);
    p.bytes_in = s.bytes_in.load(std::memory_order_relaxed);
    p.bytes_out = s.bytes_out.load(std::memory_order_relaxed);
    p.evictions_served = s.evictions_served.load(std::memory_order_relaxed);
    p.lock_wait_ns = s.lock_wait_ns.load(std::memory_order_relaxed);
    p.restore_ns = s.restore_ns.load(std::memory_order_relaxed);
    p.evict_ns = s.evict_ns.load(std::memory_order_relaxed);
    if (p.holding) d.holder_pid = p.pid, d.holder_pid_ns = p.pid_ns;
    d.processes.push_back(std::move(p));
  }
  if (lock != nullptr) {
    std::vector<lock_queue_entry> q;
    const device_lock::hold_stats holds = lock->holds();
    d.hold_mean_ns = holds.mean_ns;
    d.hold_jitter_ns = holds.jitter_ns;
    d.holds_predictable = holds.predictable;
    d.holder_granted_ns = holds.holder_granted_ns;
    if (const lock_layout::turn_histograms* t = lock->turns()) {
      d.have_turns = true;
      d.turn_wait = lock_layout::read_counts(t->wait);
      d.turn_hold = lock_layout::read_counts(t->hold);
      d.turn_switching = lock_layout::read_counts(t->switching);
    }
    if (lock->snapshot(&q) == ok) {
      d.have_queue = true;
      for (const lock_queue_entry& e : q) {
        d.queue.push_back({e.pid, e.tid, e.pid_ns, e.priority == lock_priority::high ? "high" : "normal", e.ticket, e.holding,
                           e.enqueue_ns, visible_here(e.pid_ns) && is_stopped_state(process_state(e.pid))});
        if (e.holding) d.holder_pid = e.pid, d.holder_pid_ns = e.pid_ns;
      }
    } else {
      d.queue_error = last_error();
    }
  }
  return ok;
}

int collect_report(const std::string& key, device_report* out) {
  std::string name, lock_path;
  VS_TRY(pool_segment::name_for(key, &name));
  VS_TRY(shared_segment::path_for(key, /*create_dir=*/false, &lock_path));
  std::unique_ptr<pool_segment> pool;
  VS_TRY(pool_segment::open(name, &pool, /*read_only=*/true));
  // The queue needs the lock's mutex (a consistent snapshot), so the lock segment is mapped
  // read-write; it is opened only when it exists, never created by an observer.
  device_lock lock;
  bool have_lock = false;
  std::string lock_error;
  if (::access(lock_path.c_str(), F_OK) == 0) {
    have_lock = device_lock::open(key, &lock) == ok;
    if (!have_lock) lock_error = last_error();
  } else {
    lock_error = "no lock segment " + lock_path;
  }
  VS_TRY(collect_report(key, *pool, have_lock ? &lock : nullptr, out));
  if (!have_lock) out->queue_error = lock_error;
  return ok;
}

std::string render_text(const std::vector<device_report>& devices) {
  std::string t;
  if (devices.empty()) t += "no vramswap device in use (no pool segment in the runtime dir)\n";
  for (const device_report& d : devices) {
    t += fmt("device %s: pool %s = %u frames of %s; free %u (%s), active %u, idle %u, requested %u, lent %u\n", d.key.c_str(),
             bytes_text(uint64_t{d.frame_count} * d.frame_size).c_str(), d.frame_count, bytes_text(d.frame_size).c_str(), d.frames_free,
             bytes_text(uint64_t{d.frames_free} * d.frame_size).c_str(), d.frames_active, d.frames_idle, d.frames_requested,
             d.frames_lent);
    if (d.host_slots != 0) {
      t += fmt("  host pool %s = %u slots; used %u (%s)\n", bytes_text(uint64_t{d.host_slots} * d.host_slot_size).c_str(),
               d.host_slots, d.host_slots_used, bytes_text(uint64_t{d.host_slots_used} * d.host_slot_size).c_str());
    }
    t += fmt("  server pid %d", static_cast<int>(d.server_pid));
    if (d.metrics_port != 0) t += fmt(", metrics http://127.0.0.1:%u/metrics", d.metrics_port);
    t += "\n";
    const process_report* holder = nullptr;
    for (const process_report& p : d.processes) {
      if (p.pid == d.holder_pid && p.pid_ns == d.holder_pid_ns) holder = &p;
    }
    if (d.holder_pid == 0) {
      t += "  holder: none\n";
    } else if (holder != nullptr) {
      t += fmt("  holder: pid %d (%s), held %.3f s, %s\n", static_cast<int>(holder->pid), holder->command.c_str(),
               seconds_since(holder->holding_since_ns, d.now_ns),
               holder->stopped ? fmt("STOPPED (SIGSTOP, Ctrl-Z or a debugger; kill -CONT %d resumes it) while %s",
                                     static_cast<int>(holder->pid), holder->phase.c_str()).c_str()
                               : holder->phase.c_str());
    } else {
      const bool stopped = visible_here(d.holder_pid_ns) && is_stopped_state(process_state(d.holder_pid));
      t += fmt("  holder: pid %d (%s), not in the pool%s\n", static_cast<int>(d.holder_pid), command_of(d.holder_pid, d.holder_pid_ns).c_str(),
               stopped ? ", STOPPED (SIGSTOP, Ctrl-Z or a debugger)" : "");
    }
    if (!d.have_queue) {
      t += fmt("  queue: unknown (%s)\n", d.queue_error.c_str());
    } else {
      size_t waiting = 0;
      for (const queue_report& q : d.queue) waiting += q.holding ? 0 : 1;
      t += fmt("  queue: %zu waiting", waiting);
      if (d.hold_mean_ns != 0) {
        t += fmt("; holds last %.1f ms (jitter %.1f ms): %s", d.hold_mean_ns / 1e6, d.hold_jitter_ns / 1e6,
                 d.holds_predictable ? "the next waiter wakes ahead of a release" : "too irregular to wake ahead");
      }
      t += "\n";
      size_t n = 0;
      for (const queue_report& q : d.queue) {
        if (q.holding) continue;
        t += fmt("    %zu. pid %d (%s) tid %d, %s priority, waiting %.3f s%s\n", ++n, static_cast<int>(q.pid), command_for(d, q.pid, q.pid_ns).c_str(),
                 static_cast<int>(q.tid), q.priority.c_str(), seconds_since(q.enqueue_ns, d.now_ns), q.stopped ? ", stopped" : "");
      }
    }
    t += fmt("  %-8s %-15s %-9s %10s %10s %10s %6s %6s %10s %10s %8s %9s\n", "PID", "COMMAND", "PHASE", "RESIDENT", "HOST", "DISK",
             "ACQ", "SWAPS", "IN", "OUT", "EVICTED", "WAITED");
    for (const process_report& p : d.processes) {
      t += fmt("  %-8d %-15s %-9s %10s %10s %10s %6" PRIu64 " %6" PRIu64 " %10s %10s %8" PRIu64 " %8.2fs\n", static_cast<int>(p.pid),
               p.command.c_str(), p.stopped ? "stopped" : p.phase.c_str(), bytes_text(p.resident_bytes).c_str(), bytes_text(p.host_bytes).c_str(),
               bytes_text(p.disk_bytes).c_str(), p.acquires, p.swaps_in, bytes_text(p.bytes_in).c_str(), bytes_text(p.bytes_out).c_str(),
               p.evictions_served, p.lock_wait_ns / 1e9);
    }
  }
  return t;
}

std::string render_json(const std::vector<device_report>& devices) {
  if (devices.empty()) return "{\"version\": 1, \"devices\": []}\n";
  std::string j = "{\"version\": 1, \"devices\": [";
  for (size_t i = 0; i < devices.size(); ++i) {
    const device_report& d = devices[i];
    j += i == 0 ? "\n  {" : ",\n  {";
    j += fmt("\"key\": %s, \"segment\": %s, \"server_pid\": %d, \"metrics_port\": %u, ", json_string(d.key).c_str(),
             json_string(d.segment).c_str(), static_cast<int>(d.server_pid), d.metrics_port);
    j += fmt("\"frame_size\": %" PRIu64 ", \"frame_count\": %u, \"pool_bytes\": %" PRIu64 ", \"free_bytes\": %" PRIu64 ", ", d.frame_size,
             d.frame_count, uint64_t{d.frame_count} * d.frame_size, uint64_t{d.frames_free} * d.frame_size);
    j += fmt("\"frames\": {\"free\": %u, \"active\": %u, \"idle\": %u, \"requested\": %u, \"lent\": %u},\n   ", d.frames_free,
             d.frames_active, d.frames_idle, d.frames_requested, d.frames_lent);
    j += fmt("\"host_pool\": {\"slots\": %u, \"used\": %u, \"slot_bytes\": %" PRIu64 "},\n   ", d.host_slots, d.host_slots_used,
             d.host_slot_size);
    const process_report* holder = nullptr;
    for (const process_report& p : d.processes) {
      if (p.pid == d.holder_pid && p.pid_ns == d.holder_pid_ns) holder = &p;
    }
    if (d.holder_pid == 0) {
      j += "\"holder\": null,\n   ";
    } else {
      j += fmt("\"holder\": {\"pid\": %d, \"command\": %s, \"held_seconds\": %.6f, \"phase\": %s, \"stopped\": %s},\n   ",
               static_cast<int>(d.holder_pid), json_string(command_for(d, d.holder_pid, d.holder_pid_ns)).c_str(),
               holder != nullptr ? seconds_since(holder->holding_since_ns, d.now_ns) : 0.0,
               json_string(holder != nullptr ? holder->phase : "?").c_str(),
               (holder != nullptr ? holder->stopped : visible_here(d.holder_pid_ns) && is_stopped_state(process_state(d.holder_pid))) ? "true" : "false");
    }
    j += fmt("\"holds\": {\"mean_seconds\": %.6f, \"jitter_seconds\": %.6f, \"predictable\": %s},\n   ", d.hold_mean_ns / 1e9,
             d.hold_jitter_ns / 1e9, d.holds_predictable ? "true" : "false");
    j += "\"queue\": ";
    if (!d.have_queue) {
      j += "null, \"queue_error\": " + json_string(d.queue_error);
    } else {
      j += "[";
      bool first = true;
      for (const queue_report& q : d.queue) {
        if (q.holding) continue;
        j += first ? "\n    {" : ",\n    {";
        first = false;
        j += fmt("\"pid\": %d, \"tid\": %d, \"command\": %s, \"priority\": %s, \"ticket\": %" PRIu64
                 ", \"waiting_seconds\": %.6f, \"stopped\": %s}",
                 static_cast<int>(q.pid), static_cast<int>(q.tid), json_string(command_for(d, q.pid, q.pid_ns)).c_str(), json_string(q.priority).c_str(),
                 q.ticket, seconds_since(q.enqueue_ns, d.now_ns), q.stopped ? "true" : "false");
      }
      j += "]";
    }
    j += ",\n   \"processes\": [";
    for (size_t k = 0; k < d.processes.size(); ++k) {
      const process_report& p = d.processes[k];
      j += k == 0 ? "\n    {" : ",\n    {";
      j += fmt("\"pid\": %d, \"command\": %s, \"member\": %u, \"phase\": %s, \"stopped\": %s, \"holding\": %s, \"held_seconds\": %.6f, "
               "\"frames\": %u",
               static_cast<int>(p.pid), json_string(p.command).c_str(), p.member, json_string(p.phase).c_str(), p.stopped ? "true" : "false",
               p.holding ? "true" : "false", seconds_since(p.holding_since_ns, d.now_ns), p.frames);
#define VRAMSWAP_JSON_FIELD(field, kind, prom, div, help) j += fmt(", \"" #field "\": %" PRIu64, p.field);
      VRAMSWAP_PROCESS_STATS(VRAMSWAP_JSON_FIELD)
#undef VRAMSWAP_JSON_FIELD
      j += "}";
    }
    j += "]}";
  }
  return j + "\n]}\n";
}

}  // namespace vramswap::detail

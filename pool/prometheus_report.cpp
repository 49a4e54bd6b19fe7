#include "pool/prometheus_report.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <vector>

#include "core/string_format.hpp"
#include "lock/process_identity.hpp"
#include "lock/turn_histograms.hpp"

namespace vramswap::detail {

namespace {

// A label value in the text format: backslash, double quote and newline escaped.
std::string label_value(const std::string& s) {
  std::string out;
  for (const char c : s) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

// A sample value: the shortest text that reads back as the same double ("0.5", not
// "0.50000000000000000").
std::string number(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

double seconds_since(uint64_t then_ns, uint64_t now_ns) { return then_ns != 0 && now_ns > then_ns ? (now_ns - then_ns) / 1e9 : 0.0; }

std::string base_name(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Programs that run the file (or module) their arguments name: the job is that file.
bool is_interpreter(const std::string& name) {
  for (const char* prefix : {"python", "pypy", "perl", "lua", "ruby", "php"}) {
    if (name.rfind(prefix, 0) == 0) return true;
  }
  for (const char* exact : {"sh", "bash", "dash", "zsh", "ksh", "node", "nodejs", "Rscript", "julia"}) {
    if (name == exact) return true;
  }
  return false;
}

// /proc/<pid>/cmdline, at most 4 KiB of it ("" when the process is gone).
std::string cmdline_of(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/cmdline", static_cast<int>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  char buf[4096];
  const ssize_t n = ::read(fd, buf, sizeof buf);
  ::close(fd);
  return std::string(buf, n > 0 ? static_cast<size_t>(n) : 0);
}

// At most k_job_name_max bytes, cut at a character boundary; control characters as '_'.
std::string bounded_label(std::string s) {
  if (s.size() > k_job_name_max) {
    size_t cut = k_job_name_max;
    while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;  // not inside a UTF-8 sequence
    s.resize(cut);
  }
  for (char& c : s) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) c = '_';
  }
  return s;
}

}  // namespace

std::string program_name(const std::string& cmdline) {
  std::vector<std::string> args;
  for (size_t at = 0; at < cmdline.size();) {
    const size_t end = std::min(cmdline.find('\0', at), cmdline.size());
    args.push_back(cmdline.substr(at, end - at));
    at = end + 1;
  }
  if (args.empty() || args[0].empty()) return "";
  const std::string self = base_name(args[0]);
  if (!is_interpreter(self)) return self;
  const bool python = self.rfind("python", 0) == 0 || self.rfind("pypy", 0) == 0;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-m" && i + 1 < args.size()) return args[i + 1];
    if (a == "-c" || a == "-e") return self;  // the code is on the command line: no file names the job
    if (python && (a == "-W" || a == "-X")) {
      ++i;  // an option with a value
      continue;
    }
    if (!a.empty() && a[0] != '-') return base_name(a);
  }
  return self;
}

// Today the program a process runs; where the process recorded a job name (VRAMSWAP_JOB_NAME)
// in the pool segment, that name comes first.
std::string job_name_of(const process_report& p) {
  if (!p.job.empty()) return bounded_label(p.job);  // VRAMSWAP_JOB_NAME, as the process recorded it
  if (!visible_here(p.pid_ns)) return "unknown";
  std::string name = program_name(cmdline_of(p.pid));
  if (name.empty() && p.command != "?") name = p.command;
  return name.empty() ? "unknown" : bounded_label(std::move(name));
}

namespace {

// A metric family's header lines.
void family(std::string* m, const char* name, const char* type, const char* help) {
  *m += string_format("# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

// The labels of a device's series: its index where it has one, and its key.
std::string device_labels(const device_report& d) {
  return (d.index >= 0 ? string_format("gpu=\"%d\",", d.index) : std::string()) + "UUID=\"" + label_value(d.key) + "\"";
}

// A gauge per device: the pool, its frames and the lock.
void render_device_gauges(const std::vector<device_report>& devices, std::string* out) {
  std::string& m = *out;
  auto device_gauge = [&](const char* name, const char* help, auto value_of) {
    family(&m, name, "gauge", help);
    for (const device_report& d : devices) {
      m += string_format("%s{%s} %s\n", name, device_labels(d).c_str(), number(static_cast<double>(value_of(d))).c_str());
    }
  };
  device_gauge("vramswap_lock_hold_mean_seconds", "Moving average of how long the lock is held (0: no release yet)",
               [](const device_report& d) { return d.hold_mean_ns / 1e9; });
  device_gauge("vramswap_lock_hold_jitter_seconds", "Moving average of the holds' deviation from that mean",
               [](const device_report& d) { return d.hold_jitter_ns / 1e9; });
  device_gauge("vramswap_holder_over_hold_limit", "1 while the lock's holder is past its VRAMSWAP_MAX_HOLD and others wait",
               [](const device_report& d) { return d.holder_over_limit_since_ns != 0 ? 1 : 0; });
  device_gauge("vramswap_pool_bytes", "Bytes of the device's pool", [](const device_report& d) { return uint64_t{d.frame_count} * d.frame_size; });
  device_gauge("vramswap_pool_frame_bytes", "Bytes per frame", [](const device_report& d) { return d.frame_size; });
  device_gauge("vramswap_pool_frames", "Frames in the device's pool", [](const device_report& d) { return d.frame_count; });
  device_gauge("vramswap_pool_free_frames", "Frames owned by no process", [](const device_report& d) { return d.frames_free; });
  device_gauge("vramswap_pool_idle_frames", "Frames of processes that do not hold the lock (evictable)",
               [](const device_report& d) { return d.frames_idle + d.frames_requested; });
  device_gauge("vramswap_host_pool_slots", "Slots of the shared host pool (0: none)", [](const device_report& d) { return d.host_slots; });
  device_gauge("vramswap_host_pool_used_slots", "Slots of the shared host pool holding saved pages",
               [](const device_report& d) { return d.host_slots_used; });
  device_gauge("vramswap_host_pool_slot_bytes", "Bytes per slot of the shared host pool (0: none)",
               [](const device_report& d) { return d.host_slot_size; });
  device_gauge("vramswap_pool_lent_frames", "Frames lent to oversubscribed (low-priority) processes",
               [](const device_report& d) { return d.frames_lent; });
  device_gauge("vramswap_pool_processes", "Processes attached to the pool", [](const device_report& d) { return d.processes.size(); });
  device_gauge("vramswap_lock_holder_pid", "Pid of the lock's holder (0: none)", [](const device_report& d) { return d.holder_pid; });
  device_gauge("vramswap_lock_waiters", "Threads queued for the lock", [](const device_report& d) {
    size_t n = 0;
    for (const queue_report& q : d.queue) n += q.holding ? 0 : 1;
    return n;
  });
  device_gauge("vramswap_lock_held_seconds", "How long the lock's holder has held it so far (0: nobody holds it)",
               [](const device_report& d) {
                 if (d.holder_pid == 0) return 0.0;
                 if (d.holder_granted_ns != 0) return seconds_since(d.holder_granted_ns, d.now_ns);
                 for (const process_report& p : d.processes) {
                   if (p.holding) return seconds_since(p.holding_since_ns, d.now_ns);
                 }
                 return 0.0;
               });
  device_gauge("vramswap_lock_longest_wait_seconds", "How long the longest-waiting thread in the lock's queue has waited so far (0: none waits)",
               [](const device_report& d) {
                 double longest = 0;
                 for (const queue_report& q : d.queue) {
                   if (!q.holding) longest = std::max(longest, seconds_since(q.enqueue_ns, d.now_ns));
                 }
                 return longest;
               });
}

// The turn histograms (lock/turn_histograms.hpp), cumulative as the format wants them.
void render_turn_histograms(const std::vector<device_report>& devices, std::string* out) {
  std::string& m = *out;
  auto histogram = [&](const char* name, const char* help, lock_layout::turn_counts device_report::*counts) {
    family(&m, name, "histogram", help);
    for (const device_report& d : devices) {
      if (!d.have_turns) continue;
      const std::string labels = device_labels(d);
      const lock_layout::turn_counts& c = d.*counts;
      uint64_t cumulative = 0;
      for (size_t i = 0; i < lock_layout::k_turn_buckets; ++i) {
        cumulative += c.count[i];
        const std::string le = i + 1 < lock_layout::k_turn_buckets ? string_format("%g", lock_layout::k_turn_bucket_le_ns[i] / 1e9) : "+Inf";
        m += string_format("%s_bucket{%s,le=\"%s\"} %" PRIu64 "\n", name, labels.c_str(), le.c_str(), cumulative);
      }
      m += string_format("%s_sum{%s} %s\n", name, labels.c_str(), number(c.sum_ns / 1e9).c_str());
      m += string_format("%s_count{%s} %" PRIu64 "\n", name, labels.c_str(), cumulative);
    }
  };
  histogram("vramswap_lock_wait_seconds", "Time from asking for the lock to its grant, per grant", &device_report::turn_wait);
  histogram("vramswap_lock_hold_seconds", "Time from the lock's grant to its release, per hold", &device_report::turn_hold);
  histogram("vramswap_switch_seconds", "Time from the lock's grant to the holder's memory being resident, per acquire of a session",
            &device_report::turn_switching);
}

// Per process: labelled by job and member slot (pool/prometheus_report.hpp).
void render_process_metrics(const std::vector<device_report>& devices, std::string* out) {
  std::string& m = *out;
  std::vector<std::vector<std::string>> labels(devices.size());
  for (size_t i = 0; i < devices.size(); ++i) {
    for (const process_report& p : devices[i].processes) {
      labels[i].push_back(device_labels(devices[i]) + ",job_name=\"" + label_value(job_name_of(p)) + "\",member=\"" +
                          std::to_string(p.member) + "\"");
    }
  }
  auto process_metric = [&](const char* name, const char* type, const char* help, auto value_of) {
    family(&m, name, type, help);
    for (size_t i = 0; i < devices.size(); ++i) {
      for (size_t k = 0; k < devices[i].processes.size(); ++k) {
        m += string_format("%s{%s} %s\n", name, labels[i][k].c_str(), number(static_cast<double>(value_of(devices[i], devices[i].processes[k]))).c_str());
      }
    }
  };
  process_metric("vramswap_process_holding", "gauge", "1 while the process holds the device lock",
                 [](const device_report&, const process_report& p) { return p.holding ? 1 : 0; });
  process_metric("vramswap_process_stopped", "gauge", "1 while the process is stopped (SIGSTOP, Ctrl-Z or a debugger)",
                 [](const device_report&, const process_report& p) { return p.stopped ? 1 : 0; });
  process_metric("vramswap_process_waiting_seconds", "gauge", "How long the process has been queued for the lock so far (0: not queued)",
                 [](const device_report& d, const process_report& p) {
                   double longest = 0;
                   for (const queue_report& q : d.queue) {
                     if (!q.holding && q.pid == p.pid && q.pid_ns == p.pid_ns) longest = std::max(longest, seconds_since(q.enqueue_ns, d.now_ns));
                   }
                   return longest;
                 });
#define VRAMSWAP_PROM_FIELD(field, kind, prom, div, help) \
  process_metric(prom, #kind, help, [](const device_report&, const process_report& p) { return static_cast<double>(p.field) / (div); });
  VRAMSWAP_PROCESS_STATS(VRAMSWAP_PROM_FIELD)
#undef VRAMSWAP_PROM_FIELD
}

}  // namespace

std::string render_prometheus(const std::vector<device_report>& devices) {
  std::string m;
  render_device_gauges(devices, &m);
  render_turn_histograms(devices, &m);
  render_process_metrics(devices, &m);
  return m;
}

}  // namespace vramswap::detail

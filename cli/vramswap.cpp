// vramswap: the command line for operators (docs/observability.md).
//
//   vramswap status [--json | --prometheus] [--device KEY]
//   vramswap trace --out FILE [--seconds N] [--device KEY]
//   vramswap config [--markdown]
//   vramswap release-request --device KEY
//   vramswap --version
//
// status  per device: the pool (size, free frames), the lock's holder (pid, command, held
//         since), the queue (priorities, waiting times), and per process its resident, host
//         and disk bytes, swap counts and bytes moved. --json for programs (schema in
//         docs/observability.md), --prometheus for the text format a scraper reads.
// trace   records every process's lock and swap events (acquire asked, lock granted,
//         memory brought in, lock released, frames evicted, with bytes and durations) from
//         the devices' trace rings until SIGINT/SIGTERM or N seconds have passed, then writes
//         a Chrome/Perfetto trace (JSON, one track group per process) that chrome://tracing
//         and ui.perfetto.dev open.
// config  every VRAMSWAP_* setting in effect, with its source; --markdown prints the
//         configuration reference instead (cli/config_reference.hpp).
// release-request  asks the process that holds a device's lock to release it: a flag in its
//         lock slot that its library logs and reports (vramswap.release_requested()).
//         Advisory (docs/concepts.md, "Fair turns").
//
// Devices are found by their pool segments in the runtime dir under VRAMSWAP_SHM_PREFIX; nothing
// here initializes CUDA or any backend. Exit: 0 ok, 1 failure (the reason is printed), 2
// usage error.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "config_reference.hpp"
#include "core/options.hpp"
#include "core/status.hpp"
#include "pool/pool_layout.hpp"
#include "pool/pool_report.hpp"
#include "pool/pool_segment.hpp"
#include "lock/device_lock.hpp"
#include "lock/process_identity.hpp"
#include "lock/shared_segment.hpp"
#include "vramswap/version.hpp"

namespace {
using namespace vramswap::detail;

void usage(FILE* out) {
  std::fprintf(out,
               "usage: vramswap status [--json | --prometheus] [--device KEY]\n"
               "       vramswap trace --out FILE [--seconds N] [--device KEY]\n"
               "       vramswap config [--markdown]\n"
               "       vramswap release-request --device KEY\n"
               "       vramswap --version\n"
               "\n"
               "status   who holds each device, who waits and why, and what each process has where:\n"
               "         pool size and free frames; the holder (pid, command, held since); the queue\n"
               "         (priority, waiting time); per process resident, host and disk bytes, swaps and\n"
               "         bytes moved. --json: machine-readable; --prometheus: metrics text format.\n"
               "trace    record lock and swap events of every process until Ctrl-C (SIGINT/SIGTERM)\n"
               "         or --seconds N, then write FILE: a Chrome/Perfetto trace (open it in\n"
               "         ui.perfetto.dev or chrome://tracing), one track group per process.\n"
               "config   every VRAMSWAP_* setting in effect here: its value and whether it came from the\n"
               "         environment or is the default; a bad value is marked (exit 1). --markdown: the\n"
               "         configuration reference (docs/configuration.md) instead.\n"
               "release-request  ask the process that holds device KEY's lock to release it (it is\n"
               "         logged there, and vramswap.release_requested() says so); nothing is taken from it.\n"
               "--device KEY   only this device (\"host-0\", \"GPU-...\"); default: every device with a pool\n"
               "\n"
               "Environment: VRAMSWAP_SHM_PREFIX selects the deployment. See docs/observability.md.\n");
}

int reports(const std::string& only, std::vector<device_report>* out) {
  std::vector<std::string> keys;
  if (only.empty()) {
    VS_TRY(discover_devices(&keys));
  } else {
    keys.push_back(only);
  }
  for (const std::string& key : keys) {
    device_report r;
    const int rc = collect_report(key, &r);
    if (rc != ok) {
      if (!only.empty()) return rc;
      std::fprintf(stderr, "vramswap: device %s skipped: %s\n", key.c_str(), last_error());
      continue;
    }
    out->push_back(std::move(r));
  }
  return ok;
}

int cmd_status(int argc, char** argv) {
  std::string format = "text", device;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") {
      format = "json";
    } else if (a == "--prometheus") {
      format = "prometheus";
    } else if (a == "--device" && i + 1 < argc) {
      device = argv[++i];
    } else {
      std::fprintf(stderr, "vramswap status: bad argument \"%s\"\n\n", a.c_str());
      usage(stderr);
      return 2;
    }
  }
  std::vector<device_report> devices;
  if (reports(device, &devices) != ok) {
    std::fprintf(stderr, "vramswap status: %s\n", last_error());
    return 1;
  }
  const std::string text = format == "json" ? render_json(devices) : format == "prometheus" ? render_prometheus(devices) : render_text(devices);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

// --- trace -------------------------------------------------------------------------------

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop.store(true); }

struct traced_event {
  pool_segment::trace_event e;
  int device;  // index into the device list
};

struct member_cursor {
  pid_t pid = 0;
  uint64_t start_time = 0;
  uint64_t cursor = 0;
  bool tracked = false;
};

struct traced_device {
  std::string key;
  std::unique_ptr<pool_segment> pool;
  std::vector<member_cursor> members = std::vector<member_cursor>(pool_layout::k_member_count);
};

std::string json_escape(const std::string& s) {
  std::string out;
  for (const unsigned char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      out += b;
      continue;
    }
    out += static_cast<char>(c);
  }
  return out;
}

std::string comm_of(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/comm", static_cast<int>(pid));
  FILE* f = std::fopen(path, "re");
  if (f == nullptr) return "pid " + std::to_string(pid);
  char buf[64] = {};
  const bool got = std::fgets(buf, sizeof buf, f) != nullptr;
  std::fclose(f);
  std::string s = got ? buf : "";
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s.empty() ? "pid " + std::to_string(pid) : s;
}

// Read what is new in every member's ring of `d`. At the first look at a member that was
// already there when the trace began, only events from then on are taken.
uint64_t poll_device(traced_device& d, int index, bool first_look, std::vector<traced_event>* out, std::map<pid_t, std::string>* names) {
  uint64_t lost = 0;
  std::vector<pool_segment::trace_event> got;
  for (uint32_t m = 0; m < pool_layout::k_member_count; ++m) {
    const pool_layout::member_slot& s = d.pool->member(m);
    member_cursor& c = d.members[m];
    const bool live = s.state.load(std::memory_order_acquire) == pool_layout::member_live;
    if (live && (!c.tracked || c.pid != s.pid || c.start_time != s.start_time)) {
      if (c.tracked) lost += d.pool->read_trace(m, &c.cursor, &got);  // the previous member's last events
      c.tracked = true;
      c.pid = s.pid;
      c.start_time = s.start_time;
      const uint64_t start = s.trace_start.load(std::memory_order_acquire);
      c.cursor = first_look ? d.pool->trace_ring_of(m).head.load(std::memory_order_acquire) : std::max(c.cursor, start);
      if (c.cursor < start) c.cursor = start;
      names->emplace(s.pid, comm_of(s.pid));
    }
    if (c.tracked) lost += d.pool->read_trace(m, &c.cursor, &got);
    if (!live) c.tracked = false;  // gone: its events up to now were read above
  }
  for (const auto& e : got) out->push_back({e, index});
  return lost;
}

int write_trace(const std::string& path, const std::vector<traced_device>& devices, std::vector<traced_event> events,
                const std::map<pid_t, std::string>& names, uint64_t lost) {
  std::sort(events.begin(), events.end(), [](const traced_event& a, const traced_event& b) { return a.e.ns < b.e.ns; });
  uint64_t t0 = events.empty() ? 0 : events.front().e.ns;
  FILE* f = std::fopen(path.c_str(), "we");
  if (f == nullptr) {
    std::fprintf(stderr, "vramswap trace: cannot write %s: %s\n", path.c_str(), std::strerror(errno));
    return 1;
  }
  std::fprintf(f, "{\"displayTimeUnit\": \"ms\", \"otherData\": {\"producer\": \"vramswap trace\", \"lost_events\": %" PRIu64
               ", \"clock\": \"CLOCK_MONOTONIC\", \"t0_ns\": %" PRIu64 "},\n\"traceEvents\": [\n", lost, t0);
  bool first = true;
  auto emit = [&](const std::string& line) {
    std::fprintf(f, "%s%s", first ? "" : ",\n", line.c_str());
    first = false;
  };
  char b[1024];
  // Track names: one group per process (pid), one track per kind of activity and device.
  std::map<std::pair<pid_t, int>, bool> seen;
  for (const traced_event& t : events) {
    if (seen.emplace(std::make_pair(t.e.pid, t.device), true).second) {
      auto it = names.find(t.e.pid);
      const std::string name = it != names.end() ? it->second : "pid " + std::to_string(t.e.pid);
      std::snprintf(b, sizeof b, "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": \"%s\"}}", t.e.pid,
                    json_escape(name).c_str());
      emit(b);
      const char* tracks[] = {"lock", "memory in", "evictions"};
      for (int k = 0; k < 3; ++k) {
        std::snprintf(b, sizeof b, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"args\": {\"name\": \"%s %s\"}}",
                      t.e.pid, 1 + k + 10 * t.device, json_escape(devices[t.device].key).c_str(), tracks[k]);
        emit(b);
      }
    }
  }
  for (const traced_event& t : events) {
    const pool_segment::trace_event& e = t.e;
    const double ts = (static_cast<double>(e.ns) - static_cast<double>(t0)) / 1e3;
    const double dur = e.duration_ns / 1e3;
    const double end = ts + dur;
    const int lock_tid = 1 + 10 * t.device;
    const char* prio = e.extra == 2 ? "high" : "normal";
    switch (e.kind) {
      case pool_layout::trace_asked:
        std::snprintf(b, sizeof b, "{\"name\": \"acquire asked\", \"cat\": \"lock\", \"ph\": \"i\", \"s\": \"t\", \"ts\": %.3f, \"pid\": %d, \"tid\": %d, \"args\": {\"priority\": \"%s\"}}",
                      ts, e.pid, lock_tid, prio);
        emit(b);
        break;
      case pool_layout::trace_granted:
        std::snprintf(b, sizeof b, "{\"name\": \"wait for lock\", \"cat\": \"lock\", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": %d, \"tid\": %d, \"args\": {\"priority\": \"%s\"}}",
                      ts, dur, e.pid, lock_tid, prio);
        emit(b);
        std::snprintf(b, sizeof b, "{\"name\": \"granted\", \"cat\": \"lock\", \"ph\": \"i\", \"s\": \"t\", \"ts\": %.3f, \"pid\": %d, \"tid\": %d, \"args\": {\"waited_ms\": %.3f}}",
                      end, e.pid, lock_tid, dur / 1e3);
        emit(b);
        break;
      case pool_layout::trace_resident:
        std::snprintf(b, sizeof b, "{\"name\": \"bring in\", \"cat\": \"swap\", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": %d, \"tid\": %d, \"args\": {\"bytes\": %" PRIu64 ", \"GB_per_s\": %.3f}}",
                      ts, dur, e.pid, lock_tid + 1, e.bytes, e.duration_ns > 0 ? e.bytes / static_cast<double>(e.duration_ns) : 0.0);
        emit(b);
        break;
      case pool_layout::trace_released:
        std::snprintf(b, sizeof b, "{\"name\": \"hold\", \"cat\": \"lock\", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": %d, \"tid\": %d, \"args\": {\"bytes_evicted_at_release\": %" PRIu64 "}}",
                      ts, dur, e.pid, lock_tid, e.bytes);
        emit(b);
        std::snprintf(b, sizeof b, "{\"name\": \"released\", \"cat\": \"lock\", \"ph\": \"i\", \"s\": \"t\", \"ts\": %.3f, \"pid\": %d, \"tid\": %d, \"args\": {}}",
                      end, e.pid, lock_tid);
        emit(b);
        break;
      case pool_layout::trace_evicted:
        std::snprintf(b, sizeof b, "{\"name\": \"evict\", \"cat\": \"swap\", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": %d, \"tid\": %d, \"args\": {\"bytes\": %" PRIu64 ", \"frames\": %" PRIu64 ", \"GB_per_s\": %.3f}}",
                      ts, dur, e.pid, lock_tid + 2, e.bytes, e.extra, e.duration_ns > 0 ? e.bytes / static_cast<double>(e.duration_ns) : 0.0);
        emit(b);
        break;
    }
  }
  std::fprintf(f, "\n]}\n");
  const bool bad = std::ferror(f) != 0;
  if (std::fclose(f) != 0 || bad) {
    std::fprintf(stderr, "vramswap trace: writing %s failed\n", path.c_str());
    return 1;
  }
  return 0;
}

int cmd_trace(int argc, char** argv) {
  std::string out, only;
  double seconds = 0;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--out" && i + 1 < argc) {
      out = argv[++i];
    } else if (a == "--seconds" && i + 1 < argc) {
      char* end = nullptr;
      seconds = std::strtod(argv[++i], &end);
      if (*end != '\0' || seconds <= 0) {
        std::fprintf(stderr, "vramswap trace: --seconds wants a positive number, not \"%s\"\n", argv[i]);
        return 2;
      }
    } else if (a == "--device" && i + 1 < argc) {
      only = argv[++i];
    } else {
      std::fprintf(stderr, "vramswap trace: bad argument \"%s\"\n\n", a.c_str());
      usage(stderr);
      return 2;
    }
  }
  if (out.empty()) {
    std::fprintf(stderr, "vramswap trace: --out FILE is required\n\n");
    usage(stderr);
    return 2;
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);

  std::vector<traced_device> devices;
  std::vector<traced_event> events;
  std::map<pid_t, std::string> names;
  uint64_t lost = 0;
  const auto start = std::chrono::steady_clock::now();
  auto last_scan = start - std::chrono::seconds(1);
  bool first_scan = true;
  std::fprintf(stderr, "vramswap trace: recording%s; Ctrl-C to stop\n",
               seconds > 0 ? (" for " + std::to_string(seconds) + " s").c_str() : "");
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    const bool stopping = g_stop.load() || (seconds > 0 && now - start >= std::chrono::duration<double>(seconds));
    // Devices (pool segments) may appear while recording: look again every 250 ms.
    if (now - last_scan >= std::chrono::milliseconds(250) && !stopping) {
      last_scan = now;
      std::vector<std::string> keys;
      if (only.empty()) {
        if (discover_devices(&keys) != ok) keys.clear();
      } else {
        keys.push_back(only);
      }
      for (const std::string& key : keys) {
        if (std::any_of(devices.begin(), devices.end(), [&](const traced_device& d) { return d.key == key; })) continue;
        std::string name;
        traced_device d;
        d.key = key;
        if (pool_segment::name_for(key, &name) != ok || pool_segment::open(name, &d.pool, true) != ok) continue;
        devices.push_back(std::move(d));
        lost += poll_device(devices.back(), static_cast<int>(devices.size() - 1), first_scan, &events, &names);
      }
      first_scan = false;
    }
    for (size_t i = 0; i < devices.size(); ++i) lost += poll_device(devices[i], static_cast<int>(i), false, &events, &names);
    if (stopping) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const int rc = write_trace(out, devices, std::move(events), names, lost);
  if (rc == 0) {
    std::fprintf(stderr, "vramswap trace: wrote %s (%zu device(s), %zu process(es)%s)\n", out.c_str(), devices.size(), names.size(),
                 lost > 0 ? (", " + std::to_string(lost) + " event(s) lost: the rings wrapped").c_str() : "");
  }
  return rc;
}

// --- config ------------------------------------------------------------------------------

int cmd_config(int argc, char** argv) {
  bool markdown = false;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--markdown") == 0) {
      markdown = true;
    } else {
      std::fprintf(stderr, "vramswap config: bad argument \"%s\"\n\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  if (markdown) {
    const std::string text = render_configuration_reference();
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  }
  bool valid = true;
  const std::string text = render_effective_settings(&valid);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return valid ? 0 : 1;
}

// --- release-request ---------------------------------------------------------------------

// Ask the holder of one device's lock to release it (device_lock::request_release). Kept to
// one function, its own argument parsing included.
int cmd_release_request(int argc, char** argv) {
  std::string device;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--device" && i + 1 < argc) {
      device = argv[++i];
    } else if (a.rfind("--device=", 0) == 0) {
      device = a.substr(9);
    } else {
      std::fprintf(stderr, "vramswap release-request: bad argument \"%s\"\n\n", a.c_str());
      usage(stderr);
      return 2;
    }
  }
  if (device.empty()) {
    std::fprintf(stderr, "vramswap release-request: --device KEY is required (\"host-0\", \"GPU-...\"; `vramswap status` "
                 "lists them)\n");
    return 2;
  }
  std::string path;
  if (shared_segment::path_for(device, /*create_dir=*/false, &path) != ok) {
    std::fprintf(stderr, "vramswap release-request: %s\n", last_error());
    return 1;
  }
  if (::access(path.c_str(), F_OK) != 0) {  // an observer never creates a lock
    std::fprintf(stderr, "vramswap release-request: device %s has no lock segment (%s): nobody uses it under this "
                 "VRAMSWAP_SHM_PREFIX and runtime dir; `vramswap status` lists the devices in use\n", device.c_str(),
                 path.c_str());
    return 1;
  }
  device_lock lock;
  release_request_result r;
  if (device_lock::open(device, &lock) != ok || lock.request_release(&r) != ok) {
    std::fprintf(stderr, "vramswap release-request: %s\n", last_error());
    return 1;
  }
  if (!r.held) {
    std::printf("device %s: nobody holds its lock; nothing to ask\n", device.c_str());
    return 0;
  }
  char who[192];
  describe_process_in(r.pid, r.pid_ns, who, sizeof who);
  std::printf("device %s: %s %s to release the lock, held for %.1f s%s. The request is advisory: the process logs it and "
              "vramswap.release_requested() tells it; nothing is taken from it\n",
              device.c_str(), r.already_asked ? "already asked" : "asked", who, static_cast<double>(r.held_ns) / 1e9,
              r.over_limit_since_ns != 0 ? ", past its VRAMSWAP_MAX_HOLD" : "");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "help") == 0) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (std::strcmp(argv[1], "--version") == 0) {
    std::printf("vramswap %d.%d.%d\n", VRAMSWAP_VERSION_MAJOR, VRAMSWAP_VERSION_MINOR, VRAMSWAP_VERSION_PATCH);
    return 0;
  }
  const std::string cmd = argv[1];
  if (cmd == "config") return cmd_config(argc - 2, argv + 2);
  if (cmd == "status" || cmd == "trace" || cmd == "release-request") {
    // The same settings as the library's (VRAMSWAP_SHM_PREFIX picks the deployment): a bad
    // one is an error here too, rather than a report on some other deployment.
    if (vramswap::detail::validate_options() != vramswap::detail::ok) {
      std::fprintf(stderr, "vramswap %s: %s\n", cmd.c_str(), vramswap::detail::last_error());
      return 1;
    }
  }
  if (cmd == "status") return cmd_status(argc - 2, argv + 2);
  if (cmd == "trace") return cmd_trace(argc - 2, argv + 2);
  if (cmd == "release-request") return cmd_release_request(argc - 2, argv + 2);
  std::fprintf(stderr, "vramswap: unknown command \"%s\"\n\n", cmd.c_str());
  usage(stderr);
  return 2;
}

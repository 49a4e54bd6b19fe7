// vramswap: the command line for operators (docs/observability.md).
//
//   vramswap status [--json | --prometheus] [--device KEY] [--watch [SECONDS]] [--wide]
//                   [--color WHEN]
//   vramswap trace --out FILE [--seconds N] [--device KEY]
//   vramswap config [--markdown]
//   vramswap release-request --device KEY
//   vramswap help [COMMAND] | --help | --version
//
// status  per device: the pool (size, free frames), the daemon, the lock's holder (pid, user,
//         job or command line, held for), the queue (each waiter's wait and whom it waits
//         behind), and per process its user, command line or job name, container, state and
//         resident, host and disk bytes (cli/status_view.hpp). --watch redraws it in place
//         every SECONDS like watch(1); --json for programs (schema in docs/observability.md),
//         --prometheus for the text format a scraper reads.
// trace   records every process's lock and swap events (acquire asked, lock granted,
//         memory brought in, lock released, frames evicted, with bytes and durations) from
//         the devices' trace rings until SIGINT/SIGTERM or N seconds have passed, then writes
//         a Chrome/Perfetto trace (JSON, one track group per process) that chrome://tracing
//         and ui.perfetto.dev open.
// config  every VRAMSWAP_* setting in effect, with its source; --markdown prints the
//         configuration reference instead (cli/config_reference.hpp).
// release-request  asks the process that holds a device's lock to release it: a flag in its
//         lock slot that its library logs and reports (vramswap.release_requested()).
//
// A device is given by number (as nvidia-smi numbers the GPUs; N for host-N), by key
// ("GPU-<uuid>", "host-0") or by a unique prefix of its key. Devices are found by their pool
// segments in the runtime dir under VRAMSWAP_SHM_PREFIX; nothing here initializes CUDA or any
// backend. Arguments are parsed by CLI11, JSON written by nlohmann/json. Exit: 0 ok, 1 failure
// (the reason is printed), 2 usage error (a bad or conflicting argument).
#include <signal.h>
#include <time.h>
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
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/config_reference.hpp"
#include "cli/status_view.hpp"
#include "core/options.hpp"
#include "core/status.hpp"
#include "lock/device_lock.hpp"
#include "lock/process_identity.hpp"
#include "lock/runtime_dir.hpp"
#include "lock/shared_segment.hpp"
#include "pool/device_index.hpp"
#include "pool/pool_layout.hpp"
#include "pool/pool_report.hpp"
#include "pool/pool_segment.hpp"
#include "pool/process_label.hpp"
#include "vramswap/version.hpp"

namespace {
using namespace vramswap::detail;

// --- devices -------------------------------------------------------------------------------

// "0 (host-0), 1 (GPU-8a3f...)": the devices with a pool, for messages.
std::string list_devices(const std::vector<std::string>& keys, const std::vector<numbered_device>& gpus) {
  std::string text;
  for (const std::string& k : keys) {
    const int index = device_index_of(k, gpus);
    text += (text.empty() ? "" : ", ") + (index >= 0 ? std::to_string(index) + " (" + k + ")" : k);
  }
  return text;
}

// The key of the device the user named: a number (the device's index), a key, or a unique
// prefix of a key. need_pool: it must have a pool now (status); else (trace, which waits for
// devices to appear) a number or key of a device with no pool yet is taken as it is.
// Returns 0, or err_invalid_argument with a detail that lists the devices there are.
int resolve_device(const std::string& want, bool need_pool, std::string* key) {
  std::vector<std::string> keys;
  VS_TRY(discover_devices(&keys));
  const std::vector<numbered_device> gpus = nvidia_gpus();
  const bool number = !want.empty() && want.size() < 6 && std::all_of(want.begin(), want.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (number) {
    const int n = std::atoi(want.c_str());
    for (const std::string& k : keys) {
      if (device_index_of(k, gpus) == n) return *key = k, ok;
    }
    if (!need_pool) {
      for (const numbered_device& g : gpus) {
        if (g.index == n) return *key = g.key, ok;
      }
      return *key = "host-" + want, ok;  // no NVIDIA GPU here: the host backend's device
    }
  } else {
    if (std::find(keys.begin(), keys.end(), want) != keys.end()) return *key = want, ok;
    std::vector<std::string> prefixed;
    for (const std::string& k : keys) {
      if (want.size() >= 4 && k.compare(0, want.size(), want) == 0) prefixed.push_back(k);
    }
    if (prefixed.size() == 1) return *key = prefixed[0], ok;
    if (prefixed.size() > 1) {
      return fail(err_invalid_argument, "device \"%s\" is ambiguous: it begins %s; give more of the key", want.c_str(),
                  list_devices(prefixed, gpus).c_str());
    }
    if (!need_pool) return *key = want, ok;
  }
  std::string dir;
  if (runtime_dir(/*create=*/false, &dir) != ok) dir = "the runtime dir";
  std::string gpu_text;
  for (const numbered_device& g : gpus) {
    if (std::find(keys.begin(), keys.end(), g.key) == keys.end()) gpu_text += (gpu_text.empty() ? "" : ", ") + std::to_string(g.index) + " (" + g.key + ")";
  }
  if (!gpu_text.empty()) gpu_text = "; GPUs here without a pool (nothing uses them through vramswap): " + gpu_text;
  if (keys.empty()) {
    return fail(err_invalid_argument,
                "no device \"%s\": no device has a vramswap pool in %s (VRAMSWAP_RUNTIME_DIR and VRAMSWAP_SHM_PREFIX must be the "
                "jobs' own)%s",
                want.c_str(), dir.c_str(), gpu_text.c_str());
  }
  return fail(err_invalid_argument, "no device \"%s\": the devices with a vramswap pool are %s; give one by number or key%s",
              want.c_str(), list_devices(keys, gpus).c_str(), gpu_text.c_str());
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

// --- status --------------------------------------------------------------------------------

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop.store(true); }

void stop_on_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(s, &sa, nullptr);
}

bool write_all(const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(STDOUT_FILENO, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

struct status_args {
  bool json = false, prometheus = false, wide = false;
  std::string device;
  bool watch = false;
  double interval_s = 2;
  std::string color = "auto";
};

// Color on a terminal only, unless asked; NO_COLOR (no-color.org) and TERM=dumb turn it off.
bool want_color(const std::string& when) {
  if (when == "always") return true;
  if (when == "never") return false;
  const foreign_environment environment = process_foreign_environment();
  return ::isatty(STDOUT_FILENO) == 1 && !environment.no_color && !environment.dumb_terminal;
}

// One screen: the report of every device (or the one asked for), rendered.
int status_once(const status_args& a, const std::string& key, bool color, std::string* text) {
  std::vector<device_report> devices;
  VS_TRY(reports(key, &devices));
  if (a.json) {
    *text = render_json(devices, /*pretty=*/!a.watch);
  } else if (a.prometheus) {
    *text = render_prometheus(devices);
  } else {
    text_options o;
    o.wide = a.wide;
    o.color = color;
    *text = render_text(devices, o);
  }
  return ok;
}

std::string local_time_now() {
  const time_t now = ::time(nullptr);
  tm local{};
  ::localtime_r(&now, &local);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &local);
  return buf;
}

// --watch: redraw every interval until SIGINT, SIGTERM or SIGHUP. On a terminal, in the
// alternate screen (as watch and top leave the scrollback alone) from its top left corner,
// each line cleared to its end and the rest of the screen below the last; elsewhere (a pipe,
// a file), one screen after another, each under a header line. With --json, one JSON
// document per line (JSON Lines).
int status_watch(const status_args& a, const std::string& key, bool color) {
  stop_on_signals();
  ::signal(SIGPIPE, SIG_IGN);  // a reader that goes away ends the watch (write fails), quietly
  const bool tty = ::isatty(STDOUT_FILENO) == 1 && !a.json;
  if (tty && !write_all("\033[?1049h\033[?25l")) return 1;
  int rc = 0;
  while (!g_stop.load()) {
    std::string body;
    if (status_once(a, key, color, &body) != ok) {
      // On the screen, where the reader looks; with --json, on stderr (stdout is for documents).
      const std::string why = std::string("vramswap status: ") + last_error() + "\n";
      if (a.json) std::fputs(why.c_str(), stderr);
      body = a.json ? "" : why;
    }
    std::string frame;
    if (a.json) {
      frame = body;
    } else {
      char head[160];
      std::snprintf(head, sizeof head, "Every %gs: vramswap status%s%s    %s (Ctrl-C quits)\n\n", a.interval_s, key.empty() ? "" : " --device ",
                    key.c_str(), local_time_now().c_str());
      frame = head + body;
    }
    if (tty) {
      std::string screen = "\033[H";
      for (size_t at = 0; at < frame.size();) {
        size_t end = frame.find('\n', at);
        if (end == std::string::npos) end = frame.size();
        screen.append(frame, at, end - at);
        screen += "\033[K\n";
        at = end + 1;
      }
      frame = screen + "\033[J";
    } else if (!a.json) {
      frame += "\n";
    }
    if (!write_all(frame)) {
      rc = errno == EPIPE ? 0 : 1;
      break;
    }
    // Sleep the interval; a signal cuts it short (nanosleep returns EINTR).
    timespec left{static_cast<time_t>(a.interval_s), static_cast<long>((a.interval_s - static_cast<double>(static_cast<time_t>(a.interval_s))) * 1e9)};
    while (!g_stop.load() && ::nanosleep(&left, &left) != 0 && errno == EINTR) {
    }
  }
  if (tty) write_all("\033[?25h\033[?1049l");
  return rc;
}

int cmd_status(const status_args& a) {
  std::string key;
  if (!a.device.empty() && resolve_device(a.device, /*need_pool=*/true, &key) != ok) {
    std::fprintf(stderr, "vramswap status: %s\n", last_error());
    return 1;
  }
  const bool color = !a.json && !a.prometheus && want_color(a.color);
  if (a.watch) return status_watch(a, key, color);
  std::string text;
  if (status_once(a, key, color, &text) != ok) {
    std::fprintf(stderr, "vramswap status: %s\n", last_error());
    return 1;
  }
  return write_all(text) ? 0 : 1;
}

// --- trace ---------------------------------------------------------------------------------

using json = nlohmann::ordered_json;

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

// A traced process's name: its job name, else its command line (pool/process_label.hpp).
std::string name_of(const pool_layout::member_slot& s) {
  if (s.identity.load(std::memory_order_acquire) == 1) {
    const std::string job(s.job_name, ::strnlen(s.job_name, sizeof s.job_name));
    if (!job.empty()) return job;
  }
  std::string command = visible_here(s.pid_ns) ? command_line_of(s.pid) : "";
  if (command.empty() && s.identity.load(std::memory_order_acquire) == 1) command.assign(s.command, ::strnlen(s.command, sizeof s.command));
  return command.empty() ? "pid " + std::to_string(s.pid) : command;
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
      names->emplace(s.pid, name_of(s));
    }
    if (c.tracked) lost += d.pool->read_trace(m, &c.cursor, &got);
    if (!live) c.tracked = false;  // gone: its events up to now were read above
  }
  for (const auto& e : got) out->push_back({e, index});
  return lost;
}

// Microseconds, rounded to nanoseconds: the trace format's unit, without float noise.
double micros(double ns) { return std::round(ns) / 1e3; }

// The Chrome trace event format: one object, its events one per line (grep works on it).
int write_trace(const std::string& path, const std::vector<traced_device>& devices, std::vector<traced_event> events,
                const std::map<pid_t, std::string>& names, uint64_t lost) {
  std::sort(events.begin(), events.end(), [](const traced_event& a, const traced_event& b) { return a.e.ns < b.e.ns; });
  const uint64_t t0 = events.empty() ? 0 : events.front().e.ns;
  FILE* f = std::fopen(path.c_str(), "we");
  if (f == nullptr) {
    std::fprintf(stderr, "vramswap trace: cannot write %s: %s\n", path.c_str(), std::strerror(errno));
    return 1;
  }
  const json other = {{"producer", "vramswap trace"}, {"lost_events", lost}, {"clock", "CLOCK_MONOTONIC"}, {"t0_ns", t0}};
  std::fprintf(f, "{\"displayTimeUnit\": \"ms\", \"otherData\": %s,\n\"traceEvents\": [\n", other.dump().c_str());
  bool first = true;
  auto emit = [&](const json& event) {
    std::fprintf(f, "%s%s", first ? "" : ",\n", event.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
    first = false;
  };
  // Track names: one group per process (pid), one track per kind of activity and device.
  std::map<std::pair<pid_t, int>, bool> seen;
  for (const traced_event& t : events) {
    if (!seen.emplace(std::make_pair(t.e.pid, t.device), true).second) continue;
    auto it = names.find(t.e.pid);
    const std::string name = it != names.end() ? it->second : "pid " + std::to_string(t.e.pid);
    emit({{"name", "process_name"}, {"ph", "M"}, {"pid", t.e.pid}, {"args", {{"name", name}}}});
    const char* tracks[] = {"lock", "memory in", "evictions"};
    for (int k = 0; k < 3; ++k) {
      emit({{"name", "thread_name"}, {"ph", "M"}, {"pid", t.e.pid}, {"tid", 1 + k + 10 * t.device},
            {"args", {{"name", devices[t.device].key + " " + tracks[k]}}}});
    }
  }
  for (const traced_event& t : events) {
    const pool_segment::trace_event& e = t.e;
    const double ts = micros(static_cast<double>(e.ns - t0));
    const double dur = micros(static_cast<double>(e.duration_ns));
    const double end = micros(static_cast<double>(e.ns - t0 + e.duration_ns));
    const int lock_tid = 1 + 10 * t.device;
    const char* prio = e.extra == 2 ? "high" : "normal";
    const double gb_per_s = e.duration_ns > 0 ? e.bytes / static_cast<double>(e.duration_ns) : 0.0;
    auto instant = [&](const char* name, const char* cat, double at, json args) {
      emit({{"name", name}, {"cat", cat}, {"ph", "i"}, {"s", "t"}, {"ts", at}, {"pid", e.pid}, {"tid", lock_tid}, {"args", std::move(args)}});
    };
    auto complete = [&](const char* name, const char* cat, int tid, json args) {
      emit({{"name", name}, {"cat", cat}, {"ph", "X"}, {"ts", ts}, {"dur", dur}, {"pid", e.pid}, {"tid", tid}, {"args", std::move(args)}});
    };
    switch (e.kind) {
      case pool_layout::trace_asked:
        instant("acquire asked", "lock", ts, {{"priority", prio}});
        break;
      case pool_layout::trace_granted:
        complete("wait for lock", "lock", lock_tid, {{"priority", prio}});
        instant("granted", "lock", end, {{"waited_ms", dur / 1e3}});
        break;
      case pool_layout::trace_resident:
        complete("bring in", "swap", lock_tid + 1, {{"bytes", e.bytes}, {"GB_per_s", gb_per_s}});
        break;
      case pool_layout::trace_released:
        complete("hold", "lock", lock_tid, {{"bytes_evicted_at_release", e.bytes}});
        instant("released", "lock", end, json::object());
        break;
      case pool_layout::trace_evicted:
        complete("evict", "swap", lock_tid + 2, {{"bytes", e.bytes}, {"frames", e.extra}, {"GB_per_s", gb_per_s}});
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

struct trace_args {
  std::string out, device;
  double seconds = 0;
};

int cmd_trace(const trace_args& a) {
  std::string only;
  if (!a.device.empty() && resolve_device(a.device, /*need_pool=*/false, &only) != ok) {
    std::fprintf(stderr, "vramswap trace: %s\n", last_error());
    return 1;
  }
  stop_on_signals();
  std::vector<traced_device> devices;
  std::vector<traced_event> events;
  std::map<pid_t, std::string> names;
  uint64_t lost = 0;
  const auto start = std::chrono::steady_clock::now();
  auto last_scan = start - std::chrono::seconds(1);
  bool first_scan = true;
  std::fprintf(stderr, "vramswap trace: recording%s; Ctrl-C to stop\n",
               a.seconds > 0 ? (" for " + std::to_string(a.seconds) + " s").c_str() : "");
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    const bool stopping = g_stop.load() || (a.seconds > 0 && now - start >= std::chrono::duration<double>(a.seconds));
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
  const int rc = write_trace(a.out, devices, std::move(events), names, lost);
  if (rc == 0) {
    std::fprintf(stderr, "vramswap trace: wrote %s (%zu device(s), %zu process(es)%s)\n", a.out.c_str(), devices.size(), names.size(),
                 lost > 0 ? (", " + std::to_string(lost) + " event(s) lost: the rings wrapped").c_str() : "");
  }
  return rc;
}

// --- config --------------------------------------------------------------------------------

int cmd_config(bool markdown) {
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

// Ask the holder of one device's lock to release it (device_lock::request_release).
int cmd_release_request(const std::string& device_arg) {
  std::string device;
  if (resolve_device(device_arg, /*need_pool=*/false, &device) != ok) {
    std::fprintf(stderr, "vramswap release-request: %s\n", last_error());
    return 1;
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

// --- the command line ----------------------------------------------------------------------

// CLI11's help, with usage lines of our own: the forms a command takes, not "[OPTIONS]".
class help_formatter : public CLI::Formatter {
 public:
  std::map<const CLI::App*, std::string> usage;
  std::string make_usage(const CLI::App* app, std::string name) const override {
    auto it = usage.find(app);
    return it != usage.end() ? it->second + "\n" : CLI::Formatter::make_usage(app, std::move(name));
  }
};

const char* const k_top_usage =
    "usage: vramswap status [--json | --prometheus] [--device KEY] [--watch [SECONDS]]\n"
    "                       [--wide] [--color WHEN]\n"
    "       vramswap trace --out FILE [--seconds N] [--device KEY]\n"
    "       vramswap config [--markdown]\n"
    "       vramswap release-request --device KEY\n"
    "       vramswap help [COMMAND] | --help | --version";

const char* const k_top_footer =
    "A device KEY is its number (as nvidia-smi numbers the GPUs; N for host-N), its key\n"
    "(GPU-<uuid>, host-0) or a unique prefix of its key; default: every device with a pool.\n"
    "Environment: VRAMSWAP_RUNTIME_DIR and VRAMSWAP_SHM_PREFIX select the deployment (the jobs'\n"
    "own). Exit status: 0 ok, 1 failure, 2 usage error. See docs/observability.md.";

// The command a parse error belongs to, for its message ("vramswap status: ...").
std::string command_of(const CLI::App& app) {
  std::string name = "vramswap";
  for (const CLI::App* sub : app.get_subcommands()) name += " " + sub->get_name();
  return name;
}

// The command line: the parser, what each command's options are read into, and each
// command's App (which one was given).
struct command_line {
  CLI::App app{"vramswap: who holds each GPU that vramswap time-shares, who waits, and what each process has where",
               "vramswap"};
  std::shared_ptr<help_formatter> formatter = std::make_shared<help_formatter>();
  status_args st;
  std::string watch_text;
  CLI::Option* watch = nullptr;
  CLI::App* status = nullptr;
  trace_args tr;
  CLI::App* trace = nullptr;
  bool markdown = false;
  CLI::App* config = nullptr;
  std::string release_device;
  CLI::App* release = nullptr;
  std::string help_on;
  CLI::App* help = nullptr;
};

// Before any command is added: a command takes its parent's formatter when it is made.
void set_up_top(command_line& cl) {
  cl.formatter->column_width(28);
  cl.app.formatter(cl.formatter);
  cl.app.footer(k_top_footer);
  cl.app.set_version_flag("--version", "vramswap " + std::to_string(VRAMSWAP_VERSION_MAJOR) + "." + std::to_string(VRAMSWAP_VERSION_MINOR) +
                                           "." + std::to_string(VRAMSWAP_VERSION_PATCH),
                          "print the version and exit");
  cl.app.require_subcommand(0, 1);
  cl.formatter->usage[&cl.app] = k_top_usage;
}

void add_status_command(command_line& cl) {
  status_args& st = cl.st;
  CLI::App* status = cl.app.add_subcommand("status", "who holds each device, who waits behind whom, what each has where");
  status->footer(std::string("Per device: the pool (size, free frames), the daemon, the holder (pid, user, job or command\n"
                             "line, held for), the queue (each waiter's wait and whom it waits behind), and per process its\n"
                             "user, job or command line, container, state, and resident (VRAM), host and disk bytes. The\n"
                             "screen fits 100 columns (--wide: all columns, nothing cut); colors on a terminal only.\n\n") +
                 k_top_footer);
  cl.formatter->usage[status] =
      "usage: vramswap status [--json | --prometheus] [--device KEY] [--watch [SECONDS]]\n"
      "                       [--wide] [--color WHEN]";
  CLI::Option* json_flag = status->add_flag("--json", st.json, "machine-readable (schema version 2, docs/observability.md)");
  CLI::Option* prom_flag = status->add_flag("--prometheus", st.prometheus, "the Prometheus text format (a textfile collector's)");
  json_flag->excludes(prom_flag);
  status->add_option("--device", st.device, "only this device: a number, GPU-<uuid>, host-N, or a unique prefix")->type_name("KEY");
  CLI::Option* watch = status->add_option("--watch", cl.watch_text, "redraw every SECONDS (default 2) until Ctrl-C; --json: a line each")
                           ->expected(0, 1)
                           ->type_name("[SECONDS]");
  watch->excludes(prom_flag);
  status->add_flag("--wide", st.wide, "all columns (swaps, bytes in and out, evictions, waited), none cut");
  status->add_option("--color", st.color, "auto (a terminal, NO_COLOR unset), always or never")
      ->type_name("WHEN")
      ->check(CLI::IsMember({"auto", "always", "never"}));
  cl.status = status;
  cl.watch = watch;
}

void add_trace_command(command_line& cl) {
  trace_args& tr = cl.tr;
  CLI::App* trace = cl.app.add_subcommand("trace", "record lock and swap events into a Chrome/Perfetto trace");
  trace->footer(std::string("Records every process's lock and swap events until Ctrl-C (SIGINT/SIGTERM) or --seconds N,\n"
                            "then writes FILE: a Chrome/Perfetto trace (open it in ui.perfetto.dev or chrome://tracing),\n"
                            "one track group per process.\n\n") +
                k_top_footer);
  cl.formatter->usage[trace] = "usage: vramswap trace --out FILE [--seconds N] [--device KEY]";
  trace->add_option("--out", tr.out, "the trace file to write")->type_name("FILE")->required();
  trace->add_option("--seconds", tr.seconds, "stop after N seconds")->type_name("N")->check(CLI::PositiveNumber);
  trace->add_option("--device", tr.device, "only this device (as for status)")->type_name("KEY");
  cl.trace = trace;
}

void add_config_command(command_line& cl) {
  CLI::App* config = cl.app.add_subcommand("config", "every VRAMSWAP_* setting in effect here, and where it came from");
  config->footer("Each setting's value and whether it came from the environment or is the default; a bad value\n"
                 "is marked (exit 1).");
  cl.formatter->usage[config] = "usage: vramswap config [--markdown]";
  config->add_flag("--markdown", cl.markdown, "the configuration reference (docs/configuration.md) instead");
  cl.config = config;
}

void add_release_request_command(command_line& cl) {
  CLI::App* release = cl.app.add_subcommand("release-request", "ask the process that holds a device's lock to release it");
  release->footer(std::string("Sets a flag in the holder's lock slot: the holder logs who asked, vramswap.release_requested()\n"
                              "(C++: vramswap::release_requested()) says so, and with VRAMSWAP_RELEASE_SIGNAL set it sends\n"
                              "itself that signal. Advisory: nothing is taken from the holder (docs/concepts.md, Fair turns).\n\n") +
                  k_top_footer);
  cl.formatter->usage[release] = "usage: vramswap release-request --device KEY";
  release->add_option("--device", cl.release_device, "the device whose holder is asked (as for status)")->type_name("KEY")->required();
  cl.release = release;
}

void add_help_command(command_line& cl) {
  CLI::App* help = cl.app.add_subcommand("help", "help on a command (vramswap help status)");
  cl.formatter->usage[help] = "usage: vramswap help [COMMAND]";
  help->add_option("command", cl.help_on, "status, trace, config or release-request")
      ->check(CLI::IsMember({"status", "trace", "config", "release-request", "help"}));
  cl.help = help;
}

// --watch's SECONDS, once parsed; a bad one is a usage error like CLI11's own.
void read_watch_interval(command_line& cl) {
  if (cl.watch->count() == 0) return;
  cl.st.watch = true;
  if (cl.watch_text.empty()) return;
  char* end = nullptr;
  cl.st.interval_s = std::strtod(cl.watch_text.c_str(), &end);
  if (end == cl.watch_text.c_str() || *end != '\0' || !(cl.st.interval_s >= 0.1 && cl.st.interval_s <= 86400)) {
    throw CLI::ValidationError("--watch", "SECONDS is a number from 0.1 to 86400, not \"" + cl.watch_text + "\"");
  }
}

// Parse argv. Returns the exit status when that is all there is to do (help, the version,
// a usage error), nothing when a command is to run.
std::optional<int> parse_command_line(command_line& cl, int argc, char** argv) {
  CLI::App& app = cl.app;
  if (argc < 2) {
    std::fputs(app.help().c_str(), stderr);
    return 2;
  }
  try {
    app.parse(argc, argv);
    read_watch_interval(cl);
  } catch (const CLI::CallForHelp&) {
    std::fputs((app.get_subcommands().empty() ? app.help() : app.get_subcommands().back()->help()).c_str(), stdout);
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    std::fputs(app.help("", CLI::AppFormatMode::All).c_str(), stdout);
    return 0;
  } catch (const CLI::CallForVersion& e) {
    std::printf("%s\n", e.what());
    return 0;
  } catch (const CLI::ParseError& e) {
    const std::string command = command_of(app);
    std::string why = e.what();
    if (dynamic_cast<const CLI::ExcludesError*>(&e) != nullptr) why += ": give one of them";
    // An argument before any command is a command we do not have.
    if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr && app.get_subcommands().empty()) {
      const std::vector<std::string> extras = app.remaining();
      why = "unknown command \"" + (extras.empty() ? std::string("?") : extras.front()) + "\" (the commands: status, trace, config, release-request, help)";
    }
    std::fprintf(stderr, "%s: %s\nRun `%s --help` for usage.\n", command.c_str(), why.c_str(), command.c_str());
    return 2;
  }
  return std::nullopt;
}

// The command that was given, run.
int run_command(command_line& cl) {
  if (*cl.help) {
    CLI::App* on = cl.help_on.empty() ? &cl.app : cl.app.get_subcommand(cl.help_on);
    std::fputs(on->help().c_str(), stdout);
    return 0;
  }
  if (*cl.config) return cmd_config(cl.markdown);
  if (*cl.status || *cl.trace || *cl.release) {
    // The same settings as the library's (VRAMSWAP_SHM_PREFIX picks the deployment): a bad
    // one is an error here too, rather than a report on some other deployment.
    if (validate_options() != ok) {
      std::fprintf(stderr, "vramswap %s: %s\n", *cl.status ? "status" : *cl.trace ? "trace" : "release-request", last_error());
      return 1;
    }
    if (*cl.release) return cmd_release_request(cl.release_device);
    return *cl.status ? cmd_status(cl.st) : cmd_trace(cl.tr);
  }
  std::fputs(cl.app.help().c_str(), stderr);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  command_line cl;
  set_up_top(cl);
  add_status_command(cl);
  add_trace_command(cl);
  add_config_command(cl);
  add_release_request_command(cl);
  add_help_command(cl);
  if (const std::optional<int> done = parse_command_line(cl, argc, argv)) return *done;
  return run_command(cl);
}

#include "cli/status_view.hpp"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "core/string_format.hpp"
#include "lock/process_identity.hpp"

namespace vramswap::detail {

namespace {

using json = nlohmann::ordered_json;  // keys in the order written, as the schema lists them

double seconds_since(uint64_t then_ns, uint64_t now_ns) { return then_ns != 0 && now_ns > then_ns ? (now_ns - then_ns) / 1e9 : 0.0; }

// --- text ------------------------------------------------------------------------------------

// Text a process chose (its command line, its job name), safe to print: control characters
// (an escape sequence would reach the operator's terminal) become '?'.
std::string printable(const std::string& s) {
  std::string out = s;
  for (char& c : out) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7F) c = '?';
  }
  return out;
}

// Columns a string takes: its UTF-8 characters (continuation bytes take none).
size_t columns(const std::string& s) {
  size_t n = 0;
  for (const char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80 ? 1 : 0;
  return n;
}

// `s` in at most `width` columns: cut, with "…" as its last column.
std::string cut(const std::string& s, size_t width) {
  if (columns(s) <= width) return s;
  if (width == 0) return "";
  std::string out;
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const bool starts = (static_cast<unsigned char>(s[i]) & 0xC0) != 0x80;
    if (starts && ++n == width) break;
    out += s[i];
  }
  return out + "\xE2\x80\xA6";  // U+2026 HORIZONTAL ELLIPSIS
}

std::string pad(const std::string& s, size_t width, bool right) {
  const size_t n = columns(s);
  if (n >= width) return s;
  return right ? std::string(width - n, ' ') + s : s + std::string(width - n, ' ');
}

enum class tint { none, bold, dim, green, yellow, red, cyan };

struct painter {
  bool on;
  std::string operator()(const std::string& s, tint t) const {
    if (!on || t == tint::none || s.empty()) return s;
    static const char* const k_codes[] = {"", "1", "2", "32", "33", "1;31", "36"};
    return std::string("\033[") + k_codes[static_cast<int>(t)] + "m" + s + "\033[0m";
  }
};

tint tint_of_state(const std::string& state) {
  if (state == "running") return tint::green;
  if (state == "restoring") return tint::cyan;
  if (state == "waiting") return tint::yellow;
  if (state == "stopped") return tint::red;
  return tint::none;
}

// "pid 4242 (alice)"
std::string who(pid_t pid, const std::string& user) {
  return user.empty() ? string_format("pid %d", static_cast<int>(pid)) : string_format("pid %d (%s)", static_cast<int>(pid), printable(user).c_str());
}

// `label` cut so that a line of `fixed` other columns fits in `width` (never below 12 columns).
std::string fit(const std::string& label, size_t fixed, int width) {
  const size_t room = width > 0 && static_cast<size_t>(width) > fixed + 12 ? static_cast<size_t>(width) - fixed : 12;
  return width > 0 ? cut(printable(label), room) : printable(label);
}

struct column {
  std::string title;
  bool right;     // numbers are right-aligned
  bool flexible;  // takes the width the others leave (the command)
};

struct cell {
  std::string text;
  tint color = tint::none;
};

// render_device's parts, top to bottom.

// The device's line, its daemon, its frames and host pool, and exited processes left in its table.
void render_summary(const device_report& d, const painter& paint, std::string* out) {
  std::string& t = *out;
  const uint64_t pool_bytes = uint64_t{d.frame_count} * d.frame_size;
  t += paint(string_format("%s \xC2\xB7 %s", device_label(d).c_str(), d.key.c_str()), tint::bold);
  t += string_format(" \xC2\xB7 pool %s (%u frames of %s), %s free\n", human_bytes(pool_bytes).c_str(), d.frame_count,
           human_bytes(d.frame_size).c_str(), human_bytes(uint64_t{d.frames_free} * d.frame_size).c_str());
  // The daemon: a dead one is said to be dead, never shown as if its old pid still served.
  switch (d.server) {
    case server_state::running:
      t += string_format("  daemon: pid %d", static_cast<int>(d.server_pid));
      if (d.metrics_port != 0 && !d.metrics_host.empty()) {
        t += string_format(" \xC2\xB7 metrics http://%s:%u/metrics", d.metrics_host.c_str(), d.metrics_port);
      } else if (d.metrics_port != 0) {
        t += string_format(" \xC2\xB7 metrics on port %u (not listening in this network namespace)", d.metrics_port);
      }
      t += "\n";
      break;
    case server_state::dead:
      t += "  daemon: " + paint("NOT RUNNING", tint::red) +
           " (vramswapd died; the pool below is as it left it; its jobs or the next to start start a new one, which "
           "adopts the pool)\n";
      break;
    case server_state::unknown:
      t += "  daemon: in another PID namespace (this one cannot tell whether it runs)\n";
      break;
  }
  t += string_format("  frames: %u free \xC2\xB7 %u active \xC2\xB7 %u idle \xC2\xB7 %u requested \xC2\xB7 %u lent\n", d.frames_free,
           d.frames_active, d.frames_idle, d.frames_requested, d.frames_lent);
  if (d.host_slots != 0) {
    t += string_format("  host pool: %s in %u slots, %u used (%s)\n", human_bytes(uint64_t{d.host_slots} * d.host_slot_size).c_str(), d.host_slots,
             d.host_slots_used, human_bytes(uint64_t{d.host_slots_used} * d.host_slot_size).c_str());
  }
  if (d.exited != 0) {
    t += string_format("  %u exited process%s left in the pool's table, owning %u frame%s: %s\n", d.exited, d.exited == 1 ? "" : "es",
             d.exited_frames, d.exited_frames == 1 ? "" : "s",
             d.server != server_state::running ? "the next daemon frees what they held"
                                               : "the daemon frees what they held once no process holds their GPU context (processes "
                                                 "they forked without exec keep it until they exit; the daemon's log names them)");
  }
}

// The holder's line; returns its label, which the first waiter is shown waiting behind.
std::string render_holder(const device_report& d, const painter& paint, int width, std::string* out) {
  std::string& t = *out;
  const process_report* holder = d.holder();
  std::string holder_label;
  if (d.holder_pid == 0 && d.exited_holder_pid != 0) {
    t += string_format("  holder: none (pid %d exited holding the lock; it passes on at the next acquire)\n", static_cast<int>(d.exited_holder_pid));
  } else if (d.holder_pid == 0) {
    t += "  holder: none\n";
  } else if (holder != nullptr) {
    holder_label = holder->label();
    const std::string head = "  holder: " + who(holder->pid, holder->user) + " ";
    const std::string held = string_format(" \xC2\xB7 held %s \xC2\xB7 ", human_duration(seconds_since(holder->holding_since_ns, d.now_ns)).c_str());
    std::string state = holder->stopped ? string_format("STOPPED (SIGSTOP, Ctrl-Z or a debugger; kill -CONT %d resumes it) while %s",
                                              static_cast<int>(holder->pid), holder->phase.c_str())
                                        : holder->phase;
    if (d.holder_over_limit_since_ns != 0) {
      state += string_format(", PAST ITS VRAMSWAP_MAX_HOLD for %s", human_duration(seconds_since(d.holder_over_limit_since_ns, d.now_ns)).c_str());
    }
    t += head + fit(holder_label, columns(head) + columns(held) + columns(state), width) + held +
         paint(state, holder->stopped || d.holder_over_limit_since_ns != 0 ? tint::red : tint_of_state(holder->phase)) + "\n";
  } else {
    const auto q = std::find_if(d.queue.begin(), d.queue.end(), [](const queue_report& e) { return e.holding; });
    const bool stopped = q != d.queue.end() && q->stopped;
    holder_label = q != d.queue.end() ? q->label() : "";
    const std::string head = "  holder: " + who(d.holder_pid, q != d.queue.end() ? q->user : "") + " ";
    const std::string tail = std::string(" \xC2\xB7 not in the pool") + (stopped ? ", STOPPED (SIGSTOP, Ctrl-Z or a debugger)" : "");
    t += head + fit(holder_label, columns(head) + columns(tail), width) + tail + "\n";
  }
  return holder_label;
}

// The queue's line, then each waiter: how long, and behind whom.
void render_queue(const device_report& d, int width, const std::string& holder_label, std::string* out) {
  std::string& t = *out;
  if (!d.have_queue) {
    t += "  queue: unknown (" + d.queue_error + ")\n";
  } else {
    size_t waiting = 0;
    for (const queue_report& q : d.queue) waiting += q.holding ? 0 : 1;
    t += string_format("  queue: %zu waiting", waiting);
    if (d.hold_mean_ns != 0) {
      t += string_format(" \xC2\xB7 holds last %s (jitter %s): %s", human_duration(d.hold_mean_ns / 1e9).c_str(),
               human_duration(d.hold_jitter_ns / 1e9).c_str(),
               d.holds_predictable ? "the next waiter wakes ahead of a release" : "too irregular to wake ahead");
    }
    t += "\n";
    // Each waiter: how long, and behind whom (the thread just ahead of it: the holder for the first).
    size_t n = 0;
    pid_t ahead_pid = d.holder_pid;
    std::string ahead_label = holder_label;
    for (const queue_report& q : d.queue) {
      if (q.holding) continue;
      std::string head = string_format("    %zu. %s", ++n, who(q.pid, q.user).c_str());
      if (q.tid != q.pid) head += string_format(" tid %d", static_cast<int>(q.tid));
      std::string tail = string_format(" \xC2\xB7 waiting %s", human_duration(seconds_since(q.enqueue_ns, d.now_ns)).c_str());
      if (ahead_pid != 0) {
        tail += string_format(" behind pid %d", static_cast<int>(ahead_pid));
        if (!ahead_label.empty()) tail += " (" + cut(printable(ahead_label), 16) + ")";
      }
      if (q.priority != "normal") tail += " \xC2\xB7 " + q.priority + " priority";
      if (q.stopped) tail += " \xC2\xB7 STOPPED";
      head += " ";
      t += head + fit(q.label(), columns(head) + columns(tail), width) + tail + "\n";
      ahead_pid = q.pid;
      ahead_label = q.label();
    }
  }
}

// The table of the pool's processes, its command column fit to the width left.
void render_processes(const device_report& d, const text_options& o, const painter& paint, int width, std::string* out) {
  std::string& t = *out;
  bool any_container = false;
  bool any_outside = false;  // device memory a process got past vramswap: shown only when there is some
  for (const process_report& p : d.processes) {
    any_container = any_container || !p.container.empty();
    any_outside = any_outside || p.outside_pool_bytes != 0;
  }
  std::vector<column> cols = {{"PID", true, false}, {"USER", false, false}, {"JOB / COMMAND", false, true}};
  if (any_container) cols.push_back({"WHERE", false, false});
  for (const char* c : {"STATE", "VRAM", "HOST", "DISK", "TURNS"}) cols.push_back({c, std::string(c) != "STATE", false});
  if (any_outside) cols.push_back({"OUTSIDE POOL", true, false});
  if (o.wide) {
    for (const char* c : {"SWAPS", "IN", "OUT", "EVICTED", "WAITED"}) cols.push_back({c, true, false});
  }
  std::vector<std::vector<cell>> rows;
  for (const process_report& p : d.processes) {
    const std::string state = p.stopped ? "stopped" : p.phase;
    std::vector<cell> r = {{std::to_string(p.pid)}, {p.user.empty() ? "?" : printable(p.user)}, {printable(p.label())}};
    if (any_container) r.push_back({p.container.empty() ? "-" : printable(p.container)});
    r.push_back({state, tint_of_state(state)});
    r.push_back({human_bytes(p.resident_bytes)});
    r.push_back({human_bytes(p.host_bytes)});
    r.push_back({human_bytes(p.disk_bytes)});
    r.push_back({std::to_string(p.acquires)});
    if (any_outside) r.push_back({human_bytes(p.outside_pool_bytes)});
    if (o.wide) {
      r.push_back({std::to_string(p.swaps_in)});
      r.push_back({human_bytes(p.bytes_in)});
      r.push_back({human_bytes(p.bytes_out)});
      r.push_back({std::to_string(p.evictions_served)});
      r.push_back({human_duration(p.lock_wait_ns / 1e9)});
    }
    rows.push_back(std::move(r));
  }
  std::vector<size_t> w(cols.size());
  for (size_t c = 0; c < cols.size(); ++c) {
    w[c] = columns(cols[c].title);
    for (const auto& r : rows) w[c] = std::max(w[c], columns(r[c].text));
  }
  // Short columns first (user names and containers have a cap), then the command gets the rest.
  const size_t k_user_max = 12, k_where_max = 16, k_flex_min = 12;
  size_t fixed = 2 + 2 * (cols.size() - 1);
  size_t flex = 0;
  for (size_t c = 0; c < cols.size(); ++c) {
    if (!o.wide && cols[c].title == "USER") w[c] = std::min(w[c], k_user_max);
    if (!o.wide && cols[c].title == "WHERE") w[c] = std::min(w[c], k_where_max);
    if (cols[c].flexible) {
      flex = c;
    } else {
      fixed += w[c];
    }
  }
  if (!o.wide) {
    const size_t room = static_cast<size_t>(std::max(width, 0)) > fixed + k_flex_min ? static_cast<size_t>(width) - fixed : k_flex_min;
    w[flex] = std::min(w[flex], room);
  }
  auto emit = [&](const std::vector<cell>& r, bool header) {
    std::string line = "  ";
    for (size_t c = 0; c < cols.size(); ++c) {
      const bool last = c + 1 == cols.size();
      std::string text = cut(r[c].text, w[c]);
      // No padding after the last column: lines end without blanks.
      std::string padded = last && !cols[c].right ? text : pad(text, w[c], cols[c].right);
      line += paint(padded, header ? tint::dim : r[c].color);
      if (!last) line += "  ";
    }
    t += line + "\n";
  };
  std::vector<cell> titles;
  for (const column& c : cols) titles.push_back({c.title});
  emit(titles, true);
  for (const auto& r : rows) emit(r, false);
}

void render_device(const device_report& d, const text_options& o, std::string* out) {
  const painter paint{o.color};
  const int width = o.wide ? 0 : o.width;
  render_summary(d, paint, out);
  // The holder, and what everyone waits behind.
  const std::string holder_label = render_holder(d, paint, width, out);
  render_queue(d, width, holder_label, out);
  render_processes(d, o, paint, width, out);
}

// --- JSON ------------------------------------------------------------------------------------

json or_null(const std::string& s) { return s.empty() ? json(nullptr) : json(s); }

const char* server_state_name(server_state s) {
  switch (s) {
    case server_state::running: return "running";
    case server_state::dead: return "dead";
    case server_state::unknown: return "unknown";
  }
  return "unknown";
}

// A statistic's JSON name: nanosecond counters are written in seconds ("lock_wait_ns" ->
// "lock_wait_seconds"), everything else as it is.
std::string stat_name(const char* field, double divisor) {
  std::string name = field;
  if (divisor != 1 && name.size() > 3 && name.compare(name.size() - 3, 3, "_ns") == 0) name.replace(name.size() - 3, 3, "_seconds");
  return name;
}

// Long on purpose: the document's fields, in the order they appear, read best as one table.
json device_json(const device_report& d) {
  json j;
  j["key"] = d.key;
  j["index"] = d.index >= 0 ? json(d.index) : json(nullptr);
  j["segment"] = d.segment;
  const bool running = d.server == server_state::running;
  j["server"] = {{"state", server_state_name(d.server)},
                 {"pid", d.server == server_state::dead ? json(nullptr) : json(d.server_pid)},
                 {"metrics_port", running && d.metrics_port != 0 ? json(d.metrics_port) : json(nullptr)},
                 {"metrics_url", running && d.metrics_port != 0 && !d.metrics_host.empty()
                                     ? json("http://" + d.metrics_host + ":" + std::to_string(d.metrics_port) + "/metrics")
                                     : json(nullptr)}};
  j["frame_size"] = d.frame_size;
  j["frame_count"] = d.frame_count;
  j["pool_bytes"] = uint64_t{d.frame_count} * d.frame_size;
  j["free_bytes"] = uint64_t{d.frames_free} * d.frame_size;
  j["frames"] = {{"free", d.frames_free}, {"active", d.frames_active}, {"idle", d.frames_idle}, {"requested", d.frames_requested},
                 {"lent", d.frames_lent}};
  j["host_pool"] = {{"slots", d.host_slots}, {"used", d.host_slots_used}, {"slot_bytes", d.host_slot_size}};

  const process_report* holder = d.holder();
  if (d.holder_pid == 0) {
    j["holder"] = nullptr;
  } else {
    const auto q = std::find_if(d.queue.begin(), d.queue.end(), [](const queue_report& e) { return e.holding; });
    json h;
    h["pid"] = d.holder_pid;
    if (holder != nullptr) {
      h["user"] = or_null(holder->user);
      h["command"] = or_null(holder->command_line);
      h["job"] = or_null(holder->job);
      h["held_seconds"] = seconds_since(holder->holding_since_ns, d.now_ns);
      h["phase"] = holder->phase;
      h["stopped"] = holder->stopped;
    } else {  // holds the lock without being a member of the pool
      h["user"] = q != d.queue.end() ? or_null(q->user) : json(nullptr);
      h["command"] = q != d.queue.end() ? or_null(q->command_line) : json(nullptr);
      h["job"] = nullptr;
      h["held_seconds"] = nullptr;
      h["phase"] = nullptr;
      h["stopped"] = q != d.queue.end() && q->stopped;
    }
    h["over_hold_limit_seconds"] =
        d.holder_over_limit_since_ns != 0 ? json(seconds_since(d.holder_over_limit_since_ns, d.now_ns)) : json(nullptr);
    j["holder"] = std::move(h);
  }
  j["holds"] = {{"mean_seconds", d.hold_mean_ns / 1e9}, {"jitter_seconds", d.hold_jitter_ns / 1e9}, {"predictable", d.holds_predictable}};
  if (!d.have_queue) {
    j["queue"] = nullptr;
    j["queue_error"] = d.queue_error;
  } else {
    json queue = json::array();
    pid_t ahead = d.holder_pid;
    int position = 0;
    for (const queue_report& q : d.queue) {
      if (q.holding) continue;
      queue.push_back({{"position", ++position},
                       {"pid", q.pid},
                       {"tid", q.tid},
                       {"uid", q.uid},
                       {"user", or_null(q.user)},
                       {"command", or_null(q.command_line)},
                       {"job", or_null(q.job)},
                       {"container", or_null(q.container)},
                       {"priority", q.priority},
                       {"ticket", q.ticket},
                       {"waiting_seconds", seconds_since(q.enqueue_ns, d.now_ns)},
                       {"behind_pid", ahead != 0 ? json(ahead) : json(nullptr)},
                       {"stopped", q.stopped}});
      ahead = q.pid;
    }
    j["queue"] = std::move(queue);
  }
  json processes = json::array();
  for (const process_report& p : d.processes) {
    json e;
    e["pid"] = p.pid;
    e["member"] = p.member;
    e["uid"] = p.have_uid ? json(p.uid) : json(nullptr);
    e["user"] = or_null(p.user);
    e["command"] = or_null(p.command_line);
    e["comm"] = p.command;
    e["job"] = or_null(p.job);
    e["container"] = or_null(p.container);
    e["phase"] = p.phase;
    e["stopped"] = p.stopped;
    e["holding"] = p.holding;
    e["held_seconds"] = seconds_since(p.holding_since_ns, d.now_ns);
    e["frames"] = p.frames;
#define VRAMSWAP_JSON_FIELD(field, kind, prom, div, help) \
  if ((div) == 1) {                                       \
    e[#field] = p.field;                                  \
  } else {                                                \
    e[stat_name(#field, div)] = p.field / (div);          \
  }
    VRAMSWAP_PROCESS_STATS(VRAMSWAP_JSON_FIELD)
#undef VRAMSWAP_JSON_FIELD
    processes.push_back(std::move(e));
  }
  j["processes"] = std::move(processes);
  j["exited_processes"] = d.exited;
  j["exited_frames"] = d.exited_frames;
  return j;
}

}  // namespace

std::string human_bytes(uint64_t bytes) {
  static const char* const k_units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return string_format("%" PRIu64 " B", bytes);
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1000 && u < 5) {  // 1000 MiB is shown as 0.98 GiB: never more than three digits
    v /= 1024;
    ++u;
  }
  if (v == std::floor(v)) return string_format("%.0f %s", v, k_units[u]);
  return string_format(v < 10 ? "%.2f %s" : v < 100 ? "%.1f %s" : "%.0f %s", v, k_units[u]);
}

std::string human_duration(double s) {
  if (s < 0) s = 0;
  if (s < 1) return string_format("%.0f ms", s * 1e3);
  if (s < 60) return string_format("%.1f s", s);
  const auto whole = static_cast<uint64_t>(s);
  if (whole < 3600) return string_format("%" PRIu64 " min %02" PRIu64 " s", whole / 60, whole % 60);
  return string_format("%" PRIu64 " h %02" PRIu64 " min", whole / 3600, whole % 3600 / 60);
}

std::string device_label(const device_report& d) { return d.index >= 0 ? string_format("device %d", d.index) : std::string("device ?"); }

std::string render_text(const std::vector<device_report>& devices, const text_options& options) {
  std::string t;
  if (devices.empty()) t += "no vramswap device in use (no pool segment in the runtime dir)\n";
  for (size_t i = 0; i < devices.size(); ++i) {
    if (i != 0) t += "\n";
    render_device(devices[i], options, &t);
  }
  return t;
}

std::string render_json(const std::vector<device_report>& devices, bool pretty) {
  json doc;
  doc["version"] = 2;
  doc["devices"] = json::array();
  for (const device_report& d : devices) doc["devices"].push_back(device_json(d));
  // Invalid UTF-8 in a command line is replaced, not an exception.
  return doc.dump(pretty ? 2 : -1, ' ', false, json::error_handler_t::replace) + "\n";
}

}  // namespace vramswap::detail

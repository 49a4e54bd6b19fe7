#include "pool/pool_report.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
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
#include "pool/device_index.hpp"
#include "pool/listen_address.hpp"
#include "pool/pool_layout.hpp"
#include "pool/pool_segment.hpp"
#include "pool/process_label.hpp"
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

// The recorded identity of member slot `s` (pool_layout.hpp: member_slot's last lines).
struct recorded_identity {
  bool present = false;
  uint32_t uid = 0;
  std::string job, command;
};

recorded_identity identity_of(const member_slot& s) {
  recorded_identity id;
  if (s.identity.load(std::memory_order_acquire) != 1) return id;
  id.present = true;
  id.uid = s.uid;
  id.job.assign(s.job_name, ::strnlen(s.job_name, sizeof s.job_name));
  id.command.assign(s.command, ::strnlen(s.command, sizeof s.command));
  return id;
}

// Fill p's names: from /proc where the process is visible here, else from what it recorded.
void name_process(process_report* p, const recorded_identity& id) {
  p->command = command_of(p->pid, p->pid_ns);
  p->job = id.job;
  if (visible_here(p->pid_ns)) {
    p->command_line = command_line_of(p->pid);
    uid_t uid = 0;
    if (effective_uid_of(p->pid, &uid)) p->uid = uid, p->have_uid = true;
    p->container = container_of(p->pid);
  }
  if (p->command_line.empty()) p->command_line = id.command;
  if (!p->have_uid && id.present) p->uid = id.uid, p->have_uid = true;
  if (p->have_uid) p->user = user_name(p->uid);
}

// The pool's server, from its header: running, dead, or out of sight (server_state).
server_state judge_server(const pool_segment& pool) {
  const pool_header* h = pool.header();
  if (h->claimed.load(std::memory_order_acquire) == 1 && visible_here(h->server_pid_ns)) {
    return check_liveness({h->server_pid, h->server_start_time, h->server_pid_ns}) == liveness::alive ? server_state::running
                                                                                                       : server_state::dead;
  }
  // Another namespace's server: its flock on the segment, if /proc/locks shows it
  // ("1: FLOCK  ADVISORY  WRITE 812 00:1a:4711 0 EOF": major and minor in hex, inode).
  struct stat st {};
  if (::stat(pool.path().c_str(), &st) != 0) return server_state::unknown;
  char want[64];
  std::snprintf(want, sizeof want, " %02x:%02x:%lu ", major(st.st_dev), minor(st.st_dev), static_cast<unsigned long>(st.st_ino));
  FILE* f = std::fopen("/proc/locks", "re");
  if (f == nullptr) return server_state::unknown;
  bool held = false;
  char line[256];
  while (!held && std::fgets(line, sizeof line, f) != nullptr) {
    held = std::strstr(line, " FLOCK ") != nullptr && std::strstr(line, " WRITE ") != nullptr && std::strstr(line, "->") == nullptr &&
           std::strstr(line, want) != nullptr;
  }
  std::fclose(f);
  return held ? server_state::running : server_state::unknown;
}

// The device and its pool, from the pool's header.
void report_pool(const std::string& key, const pool_segment& pool, device_report* out) {
  device_report& d = *out;
  d.key = key;
  d.index = device_index_of(key, nvidia_gpus());
  d.segment = pool.name();
  // The host backend's keys carry the index; a GPU's key is its UUID (its server knows the index).
  if (key.rfind("host-", 0) == 0 && key.size() > 5 && key.size() < 12 && key.find_first_not_of("0123456789", 5) == std::string::npos) {
    d.index = std::atoi(key.c_str() + 5);
  }
  const pool_header* h = pool.header();
  d.server_pid = h->server_pid;
  d.server = judge_server(pool);
  d.metrics_port = h->metrics_port.load(std::memory_order_relaxed);
  d.frame_size = h->frame_size;
  d.frame_count = h->frame_count;
  d.now_ns = monotonic_ns();
  d.host_slots = pool.host_slot_count();
  d.host_slot_size = pool.host_slot_size();
  d.host_slots_used = d.host_slots != 0 ? pool.count_slots(slot_used) : 0;
}

// The frames by state into `d`; returns how many each member slot owns.
std::vector<uint32_t> count_frames(const pool_segment& pool, device_report* out) {
  device_report& d = *out;
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
  return owned;
}

// A live member's report, from its slot `m`, which owns `frames` frames of `frame_size`.
process_report member_report(const member_slot& s, uint32_t m, uint32_t frames, uint64_t frame_size) {
  process_report p;
  p.member = m;
  p.pid = s.pid;
  p.pid_ns = s.pid_ns;
  name_process(&p, identity_of(s));
  p.holding = s.holding.load(std::memory_order_relaxed) != 0;
  p.phase = phase_name(s.phase.load(std::memory_order_relaxed));
  p.stopped = visible_here(s.pid_ns) && is_stopped_state(process_state(s.pid));
  p.holding_since_ns = p.holding ? s.holding_since_ns.load(std::memory_order_relaxed) : 0;
  p.frames = frames;
  p.resident_bytes = uint64_t{frames} * frame_size;
  p.host_bytes = s.host_bytes.load(std::memory_order_relaxed);
  p.disk_bytes = s.disk_bytes.load(std::memory_order_relaxed);
  p.host_pinned_bytes = s.host_pinned_bytes.load(std::memory_order_relaxed);
  p.outside_pool_bytes = s.outside_pool_bytes.load(std::memory_order_relaxed);
  p.acquires = s.acquires.load(std::memory_order_relaxed);
  p.swaps_in = s.swaps_in.load(std::memory_order_relaxed);
  p.bytes_in = s.bytes_in.load(std::memory_order_relaxed);
  p.bytes_out = s.bytes_out.load(std::memory_order_relaxed);
  p.evictions_served = s.evictions_served.load(std::memory_order_relaxed);
  p.lock_wait_ns = s.lock_wait_ns.load(std::memory_order_relaxed);
  p.restore_ns = s.restore_ns.load(std::memory_order_relaxed);
  p.evict_ns = s.evict_ns.load(std::memory_order_relaxed);
  return p;
}

// The pool's processes: its live members, less those that exited (counted apart).
void report_members(const pool_segment& pool, const std::vector<uint32_t>& owned, device_report* out) {
  device_report& d = *out;
  for (uint32_t m = 0; m < k_member_count; ++m) {
    const member_slot& s = pool.member(m);
    if (s.state.load(std::memory_order_acquire) != member_live) continue;
    // Exited, and not yet repaired by the server (or never: a dead server repairs nothing):
    // no longer a process of the pool, whatever its slot still says.
    if (visible_here(s.pid_ns) && check_liveness({s.pid, s.start_time, s.pid_ns}) == liveness::dead) {
      ++d.exited;
      d.exited_frames += owned[m];
      continue;
    }
    process_report p = member_report(s, m, owned[m], d.frame_size);
    if (p.holding) d.holder_pid = p.pid, d.holder_pid_ns = p.pid_ns;
    d.processes.push_back(std::move(p));
  }
}

// The lock's holds: their mean and jitter, the holder's grant and hold limit, the turn histograms.
void report_holds(device_lock& lock, device_report* out) {
  device_report& d = *out;
  const device_lock::hold_stats holds = lock.holds();
  d.hold_mean_ns = holds.mean_ns;
  d.hold_jitter_ns = holds.jitter_ns;
  d.holds_predictable = holds.predictable;
  d.holder_granted_ns = holds.holder_granted_ns;
  uint64_t over_since = 0;
  if (lock.holder_over_hold_limit(&over_since)) d.holder_over_limit_since_ns = over_since;
  if (const lock_layout::turn_histograms* t = lock.turns()) {
    d.have_turns = true;
    d.turn_wait = lock_layout::read_counts(t->wait);
    d.turn_hold = lock_layout::read_counts(t->hold);
    d.turn_switching = lock_layout::read_counts(t->switching);
  }
}

// A live entry of the lock's queue, named as its member of the pool is (or from /proc
// when it is none).
queue_report queue_entry_report(const lock_queue_entry& e, const std::vector<process_report>& processes) {
  queue_report r;
  r.pid = e.pid;
  r.tid = e.tid;
  r.pid_ns = e.pid_ns;
  r.priority = e.priority == lock_priority::high ? "high" : "normal";
  r.ticket = e.ticket;
  r.holding = e.holding;
  r.enqueue_ns = e.enqueue_ns;
  r.stopped = visible_here(e.pid_ns) && is_stopped_state(process_state(e.pid));
  r.uid = e.uid;
  const auto member = std::find_if(processes.begin(), processes.end(),
                                   [&](const process_report& p) { return p.pid == e.pid && p.pid_ns == e.pid_ns; });
  if (member != processes.end()) {
    r.command = member->command, r.command_line = member->command_line, r.job = member->job;
    r.user = member->user, r.container = member->container;
  } else {  // in the lock's queue without being a member of the pool
    process_report p;
    p.pid = e.pid;
    p.pid_ns = e.pid_ns;
    p.uid = e.uid;
    p.have_uid = true;
    name_process(&p, recorded_identity{});
    r.command = p.command, r.command_line = p.command_line, r.user = p.user, r.container = p.container;
  }
  return r;
}

// The lock's queue (a snapshot under its mutex), or why there is none.
void report_queue(device_lock& lock, device_report* out) {
  device_report& d = *out;
  std::vector<lock_queue_entry> q;
  if (lock.snapshot(&q) != ok) {
    d.queue_error = last_error();
    return;
  }
  d.have_queue = true;
  for (const lock_queue_entry& e : q) {
    if (!e.alive) {  // exited: the lock's liveness scan frees its slot (and passes the lock on)
      if (e.holding) d.exited_holder_pid = e.pid;
      continue;
    }
    queue_report r = queue_entry_report(e, d.processes);
    if (e.holding) d.holder_pid = e.pid, d.holder_pid_ns = e.pid_ns;
    d.queue.push_back(std::move(r));
  }
}

}  // namespace

const process_report* device_report::holder() const noexcept {
  if (holder_pid == 0) return nullptr;
  for (const process_report& p : processes) {
    if (p.pid == holder_pid && p.pid_ns == holder_pid_ns) return &p;
  }
  return nullptr;
}

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
  report_pool(key, pool, &d);
  const std::vector<uint32_t> owned = count_frames(pool, &d);
  report_members(pool, owned, &d);
  if (lock != nullptr) {
    report_holds(*lock, &d);
    report_queue(*lock, &d);
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
  // Where the server's metrics endpoint listens: the header has its port only.
  if (out->server == server_state::running && out->metrics_port != 0 && out->metrics_port <= 0xFFFF) {
    out->metrics_host = listening_host(static_cast<uint16_t>(out->metrics_port));
  }
  return ok;
}

}  // namespace vramswap::detail

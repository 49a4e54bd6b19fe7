// pool_server's life: start() (options, the one-server locks, the pool's and the host pool's
// sizes, then the pool, the socket and the metrics endpoint in order), the poll() loop of
// run(), request_stop() and the teardown. The pool's frames are built in pool_frames.cpp,
// clients are taken in in pool_handshake.cpp, dead ones repaired in pool_repair.cpp, and the
// metrics endpoint is wired up in pool_metrics.cpp.
#include "server/pool_server.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>

#include "core/log.hpp"
#include "core/options.hpp"
#include "core/status.hpp"
#include "lock/device_lock.hpp"
#include "lock/ownership.hpp"
#include "lock/process_identity.hpp"
#include "pool/pool_connection.hpp"
#include "pool/pool_segment.hpp"
#include "server/human_size.hpp"
#include "server/metrics_endpoint.hpp"

namespace vramswap::detail {
namespace {

using namespace pool_layout;

bool is_pow2(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

void close_fd(int* fd) {
  if (*fd >= 0) ::close(*fd);
  *fd = -1;
}

// pool_server::start's steps, in the order it takes them.

// The one-server lock of this runtime dir (*lock_fd), flocked, with our pid written in it
// for the error of the next server that tries.
int hold_server_lock(const pool_paths& paths, int device, const std::string& uuid, int* lock_fd) {
  VS_TRY(open_owned(paths.server_lock, O_RDWR | O_CREAT, "vramswapd: the one-server lock", "or use another VRAMSWAP_RUNTIME_DIR",
                    lock_fd));
  if (::flock(*lock_fd, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    if (e != EWOULDBLOCK) return fail_errno(e, "vramswapd: flock %s", paths.server_lock.c_str());
    char pid_text[32] = {};
    const ssize_t n = ::pread(*lock_fd, pid_text, sizeof pid_text - 1, 0);
    if (n > 0) pid_text[n] = '\0';
    while (n > 0 && std::strlen(pid_text) > 0 && pid_text[std::strlen(pid_text) - 1] == '\n') pid_text[std::strlen(pid_text) - 1] = '\0';
    return fail(err_busy,
                "vramswapd: another pool server (pid %s) already serves device %d (%s); its socket is %s. Only one "
                "server per device: stop that one first (kill -TERM %s)",
                n > 0 ? pid_text : "unknown", device, uuid.c_str(), paths.socket.c_str(), n > 0 ? pid_text : "<pid>");
  }
  char pid_text[32];
  const int pid_len = std::snprintf(pid_text, sizeof pid_text, "%d\n", static_cast<int>(::getpid()));
  if (::ftruncate(*lock_fd, 0) != 0 || ::pwrite(*lock_fd, pid_text, static_cast<size_t>(pid_len), 0) != pid_len) {
    log(log_level::warn, "vramswapd: cannot write the pid into %s: %s", paths.server_lock.c_str(), std::strerror(errno));
  }
  return ok;
}

// stdout and stderr into the log file, renamed to <log>.1 first once it is over
// `rotate_bytes`.
int log_to_file(const pool_paths& paths, off_t rotate_bytes) {
  struct stat st {};
  int rotated = -1;  // errno of a failed rotation; 0: rotated; -1: not needed
  if (::lstat(paths.log.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() && st.st_size > rotate_bytes) {
    rotated = ::rename(paths.log.c_str(), (paths.log + ".1").c_str()) == 0 ? 0 : errno;
  }
  int log_fd = -1;
  VS_TRY(open_owned(paths.log, O_WRONLY | O_CREAT | O_APPEND, "vramswapd: the log", "or use another VRAMSWAP_RUNTIME_DIR", &log_fd));
  ::dup2(log_fd, STDOUT_FILENO);
  ::dup2(log_fd, STDERR_FILENO);
  ::close(log_fd);
  if (rotated == 0) {
    log(log_level::info, "vramswapd: the log had grown to %lld bytes: it is %s.1 now", static_cast<long long>(st.st_size),
        paths.log.c_str());
  } else if (rotated > 0) {
    log(log_level::warn, "vramswapd: the log %s has grown to %lld bytes and could not be renamed to %s.1 (%s); appending to it",
        paths.log.c_str(), static_cast<long long>(st.st_size), paths.log.c_str(), std::strerror(rotated));
  }
  return ok;
}

// The frame size (VRAMSWAP_FRAME_SIZE) and the pool's bytes (--pool-size, VRAMSWAP_POOL_SIZE,
// or the device's free memory less a reserve), checked against the device.
int pool_sizes(const pool_server_options& options, backend& be, const device_info& info, uint64_t* frame_size_out,
               uint64_t* pool_bytes_out) {
  // The pager's rule (core/pager.cpp, resolve_pager_config): a power-of-two multiple of the
  // granularity, so that pager and server agree on every valid value.
  uint64_t frame_size = 0;
  VS_TRY(option_size(option_id::frame_size, &frame_size));
  if (frame_size == 0 || frame_size % info.granularity != 0 || !is_pow2(frame_size / info.granularity)) {
    return fail(err_invalid_argument,
                "VRAMSWAP_FRAME_SIZE: %" PRIu64 " bytes is not a power-of-two multiple of device %d's allocation granularity (%" PRIu64
                " bytes); use e.g. 2MiB, 32MiB (the default), 64MiB or 256MiB",
                frame_size, options.device, info.granularity);
  }
  *frame_size_out = frame_size;
  uint64_t pool_bytes = 0;
  const std::string size_text = options.pool_size.empty() ? option_text(option_id::pool_size) : options.pool_size;
  const uint64_t reserve = be.kind() == backend_kind::cuda ? std::max(k_gib, info.total_bytes / 100 * 3) : frame_size;
  if (!size_text.empty()) {
    VS_TRY(parse_size(size_text.c_str(), &pool_bytes, options.pool_size.empty() ? "VRAMSWAP_POOL_SIZE" : "--pool-size",
                      info.total_bytes));
  } else {
    pool_bytes = info.free_bytes > reserve ? info.free_bytes - reserve : 0;
  }
  pool_bytes = pool_bytes / frame_size * frame_size;
  if (pool_bytes == 0) {
    return fail(err_out_of_memory,
                "vramswapd: device %d (%s) leaves no room for a pool of %" PRIu64 "-byte frames: %s free of %s%s",
                options.device, info.uuid.c_str(), frame_size, human_size(info.free_bytes).c_str(), human_size(info.total_bytes).c_str(),
                size_text.empty() ? (", less a reserve of " + human_size(reserve)).c_str() : "");
  }
  if (pool_bytes > info.free_bytes) {
    return fail(err_out_of_memory, "vramswapd: a pool of %s does not fit in device %d's free memory (%s of %s)",
                human_size(pool_bytes).c_str(), options.device, human_size(info.free_bytes).c_str(), human_size(info.total_bytes).c_str());
  }
  if (pool_bytes / frame_size >= k_no_member) {
    return fail(err_invalid_argument, "vramswapd: %" PRIu64 " frames of %" PRIu64 " bytes; at most %u: use larger frames",
                pool_bytes / frame_size, frame_size, k_no_member - 1);
  }
  *pool_bytes_out = pool_bytes;
  return ok;
}

// The shared host pool's slots of `frame_size` (--host-pool, VRAMSWAP_HOST_POOL; 0: none).
int host_pool_slots(const pool_server_options& options, uint64_t frame_size, uint64_t* host_slots_out) {
  uint64_t host_pool_bytes = 0;
  {
    const std::string text = options.host_pool.empty() ? option_text(option_id::host_pool) : options.host_pool;
    VS_TRY(parse_size(text.c_str(), &host_pool_bytes, options.host_pool.empty() ? "VRAMSWAP_HOST_POOL" : "--host-pool",
                      physical_ram()));
  }
  const uint64_t host_slots = host_pool_bytes / frame_size;
  if (host_pool_bytes > 0 && host_slots < k_min_host_slots) {
    // Below this even one eviction cannot keep the pager's copies in flight (each needs a
    // slot), and there is no slack for a handoff (docs/swap.md, "Shared host pool").
    return fail(err_invalid_argument,
                "VRAMSWAP_HOST_POOL: %s holds %" PRIu64 " slot(s) of %s; a shared host pool needs at least %u (the pager's "
                "%u copies in flight and one more), and should hold what all processes of device %d save at once (their memory "
                "less the device pool) plus slack; set it to 0 to keep per-process host tiers",
                human_size(host_pool_bytes).c_str(), host_slots, human_size(frame_size).c_str(), k_min_host_slots, k_min_host_slots - 1,
                options.device);
  }
  if (host_slots > UINT32_MAX) {
    return fail(err_invalid_argument, "VRAMSWAP_HOST_POOL: %" PRIu64 " slots of %s; at most %u: use larger frames", host_slots,
                human_size(frame_size).c_str(), UINT32_MAX);
  }
  *host_slots_out = host_slots;
  return ok;
}

}  // namespace

int pool_server::start(const pool_server_options& options, std::unique_ptr<pool_server>* out) noexcept {
  try {
    std::unique_ptr<pool_server> s(new pool_server());
    s->device_ = options.device;
    log_set_device(options.device);
    s->idle_exit_s_ = options.idle_exit_s;
    s->be_ = options.be;
    if (s->be_ == nullptr) VS_TRY(default_backend(&s->be_));
    backend& be = *s->be_;
    device_info info;
    VS_TRY(be.get_device_info(options.device, &info));
    s->key_ = info.uuid;
    pool_paths paths;
    VS_TRY(pool_paths::make(info.uuid, true, &paths));
    s->log_path_ = paths.log;

    // --- one server per device -------------------------------------------------------------
    VS_TRY(hold_server_lock(paths, options.device, info.uuid, &s->server_lock_fd_));
    // The lock above is per runtime dir; the pool segment's name is the same for every
    // server of the device whatever its runtime dir, so its flock makes the one server.
    process_identity me{};
    VS_TRY(current_process(&me));
    {
      pool_segment::server_identity who;
      who.pid = me.pid;
      who.start_time = me.start_time;
      who.runtime_dir = paths.dir;
      who.socket = paths.socket;
      who.flags = options.managed ? k_server_managed : 0;
      VS_TRY(add_context(pool_segment::claim(info.uuid, who, &s->segment_), "vramswapd: device %d: ", options.device));
    }

    if (options.log_to_file) VS_TRY(log_to_file(paths, k_log_rotate_bytes));

    if (s->segment_->adopted()) {
      // A running pool: its members keep its frames alive and hand them over (pool_adoption.cpp).
      VS_TRY(s->adopt_pool());
      VS_TRY(s->finish_start(options, info, paths));
      *out = std::move(s);
      return ok;
    }

    // --- frame size and pool size ------------------------------------------------------------
    uint64_t frame_size = 0;
    uint64_t pool_bytes = 0;
    VS_TRY(pool_sizes(options, be, info, &frame_size, &pool_bytes));
    s->frame_size_ = frame_size;

    // --- the shared host pool (optional) ----------------------------------------------------
    uint64_t host_slots = 0;
    VS_TRY(host_pool_slots(options, frame_size, &host_slots));

    // --- the pool --------------------------------------------------------------------------
    const uint64_t t0 = monotonic_ns();
    VS_TRY(s->build_pool(pool_bytes));
    if (host_slots > 0) VS_TRY(s->build_host_pool(host_slots * frame_size));
    VS_TRY(s->segment_->initialize(s->frame_count(), frame_size, s->host_slots_));
    VS_TRY(s->finish_start(options, info, paths));
    const std::string host_text =
        s->host_slots_ > 0 ? "; shared host pool " + human_size(uint64_t{s->host_slots_} * frame_size) + " (" + std::to_string(s->host_slots_) + " slots)"
                           : "";
    log(log_level::info,
        "vramswapd: serving device %d (%s, %s): %u frames of %s = %s (%s free of %s before)%s, built in %.2f s; socket %s%s",
        options.device, info.name.c_str(), info.uuid.c_str(), s->frame_count(), human_size(frame_size).c_str(),
        human_size(pool_bytes).c_str(), human_size(info.free_bytes).c_str(), human_size(info.total_bytes).c_str(), host_text.c_str(),
        static_cast<double>(monotonic_ns() - t0) / 1e9, paths.socket.c_str(),
        s->idle_exit_s_ > 0 ? (", idle exit after " + std::to_string(s->idle_exit_s_) + " s").c_str() : "");
    *out = std::move(s);
    return ok;
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "vramswapd: out of host memory");
  }
}

// The rest of a start, for a pool built here or adopted: the device lock, the socket, the
// metrics endpoint.
int pool_server::finish_start(const pool_server_options& options, const device_info& info, const pool_paths& paths) noexcept {
  lock_.reset(new (std::nothrow) device_lock());
  if (!lock_) return fail(err_out_of_memory, "vramswapd: out of host memory");
  VS_TRY(device_lock::open(info.uuid, lock_.get()));
  if (::pipe2(stop_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) return fail_errno(errno, "vramswapd: pipe2");
  socket_path_ = paths.socket;
  VS_TRY(open_socket());
  const std::string port = options.metrics_port.empty() ? option_text(option_id::metrics_port) : options.metrics_port;
  if (!port.empty()) VS_TRY(open_metrics(port, options.metrics_port.empty() ? "VRAMSWAP_METRICS_PORT" : "--metrics-port"));
  return ok;
}

void pool_server::request_stop() noexcept {
  if (stop_pipe_[1] >= 0) {
    const char byte = 1;
    [[maybe_unused]] const ssize_t n = ::write(stop_pipe_[1], &byte, 1);
  }
}

// One turn's poll set (run()): the descriptors in fds, each kind from where it starts.
struct pool_server::poll_set {
  static constexpr size_t first_client = 2;  // after the stop pipe and the listener
  std::vector<pollfd> fds;
  std::vector<size_t> pidfd_clients;  // the client of each pidfd in fds, by index
  size_t first_pidfd = 0;
  size_t first_attaching = 0;
  size_t first_greeting = 0;
  bool pending = false;  // a client hung up and awaits its repair
};

int pool_server::run() noexcept {
  uint64_t idle_since = monotonic_ns();
  poll_set ps;
  for (;;) {
    const bool accept_paused = monotonic_ns() < accept_paused_until_ns_;
    fill_poll_set(accept_paused, &ps);
    int timeout_ms = poll_timeout_ms(ps.pending, accept_paused, &idle_since);
    // Watched by the metrics endpoint (/healthz): beat at every turn, and turn at least every
    // k_beat_ms even when idle, so that a silent loop means a stuck one.
    if (metrics_ != nullptr) {
      metrics_->beat();
      if (timeout_ms < 0 || timeout_ms > metrics_endpoint::k_beat_ms) timeout_ms = metrics_endpoint::k_beat_ms;
    }
    const int n = ::poll(ps.fds.data(), ps.fds.size(), timeout_ms);
    if (n < 0 && errno != EINTR) return fail_errno(errno, "vramswapd: poll");
    const uint64_t now = monotonic_ns();
    if (n > 0) {
      if (ps.fds[0].revents != 0) {
        log(log_level::info, "vramswapd: stopping on request (%zu clients attached)", clients_.size());
        return ok;
      }
      serve_events(ps, now);
    }
    tell_held_connections(now);
    drop_late_attaches(now);
    drop_silent_connections(now);
    if (lock_repair_pending_) repair_lock();
    if (adopted_) tend_adoption(now);
    repair_gone_members(now, &idle_since);
    if (idle_exit_s_ > 0 && clients_.empty() && monotonic_ns() - idle_since >= static_cast<uint64_t>(idle_exit_s_) * 1'000'000'000) {
      log(log_level::info, "vramswapd: no client for %" PRId64 " s: exiting", idle_exit_s_);
      return ok;
    }
  }
}

void pool_server::fill_poll_set(bool accept_paused, poll_set* ps) noexcept {
  std::vector<pollfd>& fds = ps->fds;
  ps->pending = false;
  fds.clear();
  fds.push_back({stop_pipe_[0], POLLIN, 0});
  fds.push_back({listen_fd_, static_cast<short>(accept_paused ? 0 : POLLIN), 0});
  for (const client& c : clients_) {
    if (c.fd >= 0) {
      fds.push_back({c.fd, POLLIN | POLLRDHUP, 0});
    } else if (c.hung_up_ns != 0) {
      ps->pending = true;
    }
  }
  // The pidfds of connected members, to see one exit while its connection stays open.
  ps->first_pidfd = fds.size();
  ps->pidfd_clients.clear();
  for (size_t i = 0; i < clients_.size(); ++i) {
    const client& c = clients_[i];
    if (c.fd < 0 || c.pidfd < 0 || c.exited_ns != 0) continue;
    fds.push_back({c.pidfd, POLLIN, 0});
    ps->pidfd_clients.push_back(i);
  }
  ps->first_attaching = fds.size();
  for (const attaching& a : attaching_) fds.push_back({a.fd, POLLIN | POLLRDHUP, 0});
  ps->first_greeting = fds.size();
  for (const greeting& g : greeting_) fds.push_back({g.fd, POLLIN | POLLRDHUP, 0});
}

int pool_server::poll_timeout_ms(bool pending, bool accept_paused, uint64_t* idle_since) noexcept {
  int timeout_ms = -1;
  if (lock_repair_pending_) timeout_ms = k_lock_repair_retry_ms;
  // Orphans are watched by their leases and newcomers may wait for the frames: look often.
  if (adopted_ && (!waiting_.empty() || std::any_of(clients_.begin(), clients_.end(), [](const client& c) { return c.orphan; }))) {
    timeout_ms = k_orphan_poll_ms;
  }
  // A newcomer between its connect and its attach keeps the server from being idle.
  if (!attaching_.empty() || !greeting_.empty()) *idle_since = monotonic_ns();
  // Members that exited with their connection held (tell_held_connections): named soon,
  // then their holders looked at every second.
  bool held = false;
  bool held_untold = false;
  for (const client& c : clients_) {
    if (c.fd < 0 || c.exited_ns == 0) continue;
    held = true;
    held_untold = held_untold || !c.held_told;
  }
  if (pending) {
    timeout_ms = 10;
  } else if (held_untold) {
    timeout_ms = 100;
  } else if (held || !attaching_.empty() || !greeting_.empty()) {
    timeout_ms = 1000;  // for tell_held_connections, drop_late_attaches and drop_silent_connections
  } else if (idle_exit_s_ > 0 && clients_.empty()) {
    const uint64_t limit = *idle_since + static_cast<uint64_t>(idle_exit_s_) * 1'000'000'000;
    const uint64_t now = monotonic_ns();
    // At most an hour a poll: an idle exit of 25 days or more is past an int of milliseconds.
    timeout_ms = now >= limit ? 0 : static_cast<int>(std::min<uint64_t>((limit - now) / 1'000'000 + 1, 3'600'000));
  }
  constexpr int k_accept_pause_ms = static_cast<int>(k_accept_pause_ns / 1'000'000);
  if (accept_paused && (timeout_ms < 0 || timeout_ms > k_accept_pause_ms)) timeout_ms = k_accept_pause_ms;  // to poll it again
  return timeout_ms;
}

void pool_server::serve_events(const poll_set& ps, uint64_t now) noexcept {
  const std::vector<pollfd>& fds = ps.fds;
  // Hang-ups first: their fds are positions first_client.. in the order of the clients.
  size_t at = poll_set::first_client;
  for (client& c : clients_) {
    if (c.fd < 0) continue;
    const short revents = fds[at++].revents;
    if (revents == 0) continue;
    char byte;
    const ssize_t got = ::recv(c.fd, &byte, 1, MSG_DONTWAIT);
    if (got > 0) {
      log(log_level::warn, "vramswapd: member %u (pid %d) sent unexpected data after its handshake; ignored", c.member,
          static_cast<int>(c.pid));
      continue;
    }
    if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    c.hung_up_ns = now;
    close_fd(&c.fd);
  }
  // Exits of members whose connection is still open (one that hung up in this turn is
  // the repair's below).
  for (size_t k = 0; k < ps.pidfd_clients.size(); ++k) {
    client& c = clients_[ps.pidfd_clients[k]];
    if (fds[ps.first_pidfd + k].revents != 0 && c.fd >= 0) c.exited_ns = now;
  }
  // Attaches (or hang-ups) of newcomers, from the last: finish_attach erases its entry.
  for (size_t k = attaching_.size(); k-- > 0;) {
    if (fds[ps.first_attaching + k].revents != 0) finish_attach(k);
  }
  // Hellos (or hang-ups) of new connections, from the last: the hello is one message, so
  // serve_new reads it without waiting.
  for (size_t k = greeting_.size(); k-- > 0;) {
    if (fds[ps.first_greeting + k].revents == 0) continue;
    const int fd = greeting_[k].fd;
    greeting_.erase(greeting_.begin() + static_cast<ptrdiff_t>(k));
    serve_new(fd);
  }
  if (fds[1].revents != 0) accept_one();
}

void pool_server::repair_gone_members(uint64_t now, uint64_t* idle_since) noexcept {
  // Repair members whose process is gone (or that left long enough ago): with the frames
  // at hand (an adopted pool has none until a member hands them over).
  for (size_t i = 0; i < clients_.size() && !frames_.empty();) {
    const client& c = clients_[i];
    if (c.fd < 0 && c.hung_up_ns != 0 &&
        (client_exited(c) || now - c.hung_up_ns >= uint64_t{k_repair_grace_ms} * 1'000'000)) {
      repair(c);
      close_client(&clients_[i]);
      clients_.erase(clients_.begin() + static_cast<ptrdiff_t>(i));
      if (clients_.empty()) *idle_since = monotonic_ns();
    } else {
      ++i;
    }
  }
}

pool_server::~pool_server() { teardown(); }

void pool_server::teardown() noexcept {
  // Newcomers not attached yet are not members: their handshakes fail, and they join the
  // next server as newcomers.
  for (attaching& a : attaching_) {
    if (segment_) segment_->remove_member(a.member);
    close_fd(&a.fd);
    close_fd(&a.pidfd);
  }
  attaching_.clear();
  for (greeting& g : greeting_) close_fd(&g.fd);
  greeting_.clear();
  // Members still attached (a restart, an upgrade): they go on without a server, and the next
  // one adopts the pool. Their imports keep the frames' memory; only this server's
  // references go below.
  if (pool_in_use()) {
    segment_->keep_for_next_server();
    log(log_level::info, "vramswapd: leaving the pool (%u frames) in %s for the next server: its members still use it and "
        "rejoin the next server of the device when it starts", frame_count_, segment_->path().c_str());
  }
  // No new connection from here on.
  close_fd(&listen_fd_);
  if (socket_bound_) ::unlink(socket_path_.c_str());
  for (newcomer& n : waiting_) {
    close_fd(&n.fd);
    close_fd(&n.pidfd);
  }
  waiting_.clear();
  metrics_.reset();  // joins its thread: before the segment and the lock it reads go
  metrics_lock_.reset();
  close_fd(&host_pool_fd_);  // its memory goes when the last client unmaps it
  segment_.reset();  // a claimed segment's name goes with it (pool_segment::~pool_segment), unless kept
  lock_.reset();
  for (int& fd : exported_) close_fd(&fd);
  exported_.clear();
  for (frame_id f : frames_) {
    if (be_->release_frame(f) != ok) log(log_level::warn, "vramswapd: releasing a frame: %s", last_error());
  }
  frames_.clear();
  if (scratch_ != 0) be_->unreserve(scratch_, scratch_frames_ * frame_size_);
  if (stream_ != 0) be_->stream_destroy(stream_);
  close_fd(&stop_pipe_[0]);
  close_fd(&stop_pipe_[1]);
  close_fd(&server_lock_fd_);  // the next server may start now
  // Last: the hang-up sends the members to the next server, which can start by now.
  for (client& c : clients_) close_client(&c);
  clients_.clear();
}
}  // namespace vramswap::detail

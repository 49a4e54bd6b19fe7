#include "pool/pool_connection.hpp"

#include <signal.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>
#include <new>

#include "core/fd_guard.hpp"
#include "core/fd_transfer.hpp"
#include "core/log.hpp"
#include "core/options.hpp"
#include "core/status.hpp"
#include "lock/ownership.hpp"
#include "pool/pool_protocol.hpp"
#include "pool/pool_segment.hpp"
#include "lock/process_identity.hpp"
#include "lock/shared_segment.hpp"
#include "lock/wait_bounds.hpp"

namespace vramswap::detail {
namespace {

// The server at the other end of `fd` (connected to `path`) must be ours: this user's, or in
// group mode a member of VRAMSWAP_GROUP. Anyone else's would see and write this process's
// memory through the frames it hands out.
int check_server_peer(int fd, const std::string& path) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return fail_errno(errno, "pool: SO_PEERCRED on %s", path.c_str());
  sharing who;
  VS_TRY(current_sharing(&who));
  // Root could read this process's memory anyway: a server run by root gives nothing away.
  if (cred.uid == ::geteuid() || cred.uid == 0) return ok;
  if (who.group && socket_peer_in_group(fd, who.gid)) return ok;
  return fail(err_not_owner,
              "pool: the pool server listening on %s (pid %d) runs as %s, not as you (%s)%s: another user's server is never "
              "used (its frames would expose this process's memory to it); have its owner stop it, or use another "
              "VRAMSWAP_RUNTIME_DIR",
              path.c_str(), static_cast<int>(cred.pid), describe_uid(cred.uid).c_str(), describe_uid(::geteuid()).c_str(),
              who.group ? (" and is not in group " + describe_gid(who.gid) + " (VRAMSWAP_GROUP)").c_str() : "");
}

// The peer's pid as this process sees it (0 in another PID namespace, or unknown).
pid_t peer_pid(int fd) {
  ucred cred{};
  socklen_t len = sizeof cred;
  return ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 ? cred.pid : 0;
}

int set_timeouts(int fd, int seconds) {
  timeval tv{seconds, 0};
  if (::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
      ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0) {
    return fail_errno(errno, "pool: setsockopt(SO_RCVTIMEO/SO_SNDTIMEO)");
  }
  return ok;
}

// Wait until the pool server's next answer can be read, at most `seconds`, in slices that
// let this thread's wait bounds (Ctrl-C, the acquire's timeout) end the wait: a server that
// accepted and then stopped answering (SIGSTOP, stuck in a driver call) would otherwise hold
// the caller in a blocking receive for all of that time.
// `answer_to`: what the answer is to ("this process's hello").
int wait_for_answer(int fd, int seconds, pid_t server, const char* answer_to) {
  const uint64_t until = monotonic_ns() + static_cast<uint64_t>(seconds) * 1'000'000'000;
  const std::string waiting_for = "the pool server (pid " + std::to_string(server) + ") to answer " + answer_to;
  for (;;) {
    const uint64_t now = monotonic_ns();
    if (now >= until) {
      return fail(err_timeout, "pool: the pool server (pid %d) accepted this process's connection and did not answer %s "
                  "in %d s: it is stopped (SIGSTOP, a debugger) or stuck (`vramswap status`, its log); resume or restart it",
                  static_cast<int>(server), answer_to, seconds);
    }
    pollfd p{fd, POLLIN, 0};
    const int n = ::poll(&p, 1, wait_slice_ms(static_cast<int>((until - now) / 1'000'000) + 1));
    if (n > 0) return ok;  // an answer, or the end of the connection: the receive says which
    if (n < 0 && errno != EINTR) return fail_errno(errno, "pool: poll on the pool socket");
    VS_TRY(wait_may_go_on(n < 0, waiting_for.c_str()));
  }
}

// A descriptor limit high enough for `frames` imported frames, twice (the descriptors kept
// for a next server, pool/kept_descriptors.hpp; and the host backend keeps one descriptor per
// imported frame), plus a margin; best effort.
void raise_fd_limit(uint64_t frames) {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
  const rlim_t want = static_cast<rlim_t>(2 * frames + 1024);
  if (lim.rlim_cur >= want) return;
  lim.rlim_cur = lim.rlim_max == RLIM_INFINITY || lim.rlim_max > want ? want : lim.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &lim);
}

// VRAMSWAP_POOL_SIZE is read by the server when it starts; a client that set it and found a
// server already running with another size says so, since otherwise its request is silently
// not what it gets (the old size stays until that server exits idle).
void note_pool_size_differs(backend& be, int device, uint64_t frames, uint64_t frame_size, int server_pid) {
  if (option_is_default(option_id::pool_size)) return;
  const std::string text = option_text(option_id::pool_size);
  device_info info;
  if (text.empty() || be.get_device_info(device, &info) != ok) return;
  const uint64_t have = frames * frame_size;
  uint64_t want = 0;
  if (parse_size(text.c_str(), &want, "VRAMSWAP_POOL_SIZE", info.total_bytes) != ok) {
    log(log_level::warn, "pool: %s; the pool server of %s already running (pid %d) has %" PRIu64 " MiB, which this process uses",
        last_error(), info.uuid.c_str(), server_pid, have >> 20);
    clear_error();
    return;
  }
  want = want / frame_size * frame_size;
  if (want == have) return;
  log(log_level::warn,
      "pool: VRAMSWAP_POOL_SIZE=%s asks for %" PRIu64 " MiB, but the pool server of %s already running (pid %d) has %" PRIu64
      " MiB: the size applies when a server starts; this process uses the running pool (stop that server, or let it exit "
      "idle, for a new size; or use another VRAMSWAP_SHM_PREFIX for a pool of its own)",
      text.c_str(), want >> 20, info.uuid.c_str(), server_pid, have >> 20);
}

// A pool left by a server that a service manager restarts (pool_header::server_flags): its
// members are still there, and the manager starts the next server.
bool restart_expected(const std::string& key) {
  std::string name;
  std::unique_ptr<pool_segment> seg;
  if (pool_segment::name_for(key, &name) != ok || pool_segment::open(name, &seg, /*read_only=*/true) != ok) {
    clear_error();
    return false;
  }
  return (seg->header()->server_flags.load(std::memory_order_relaxed) & pool_layout::k_server_managed) != 0;
}

// A hello naming this process (pid, start time, PID namespace), for a first join or a rejoin.
int hello_from_this_process(pool_protocol::hello* h) {
  process_identity me{};
  VS_TRY(current_process(&me));
  *h = pool_protocol::hello{};
  h->magic = pool_protocol::k_magic;
  h->version = pool_protocol::k_version;
  h->pid = me.pid;
  h->start_time = me.start_time;
  h->pid_ns = me.pid_ns;
  return ok;
}

// Send `h` with a pidfd of this process: the server learns of its exit from it, in whatever
// PID namespace either runs (pool/pool_protocol.hpp). Without one (a kernel or a seccomp
// policy without pidfd_open) the server falls back on what it can see.
int send_hello(int fd, const pool_protocol::hello& h) {
  const int pidfd = open_pidfd(::getpid());
  const int sent = send_fds(fd, pidfd >= 0 ? &pidfd : nullptr, pidfd >= 0 ? 1 : 0, &h, sizeof h);
  if (pidfd >= 0) ::close(pidfd);
  return sent;
}

}  // namespace

int pool_connection::connect(backend& be, int device, bool autostart, std::unique_ptr<pool_connection>* out) noexcept {
  try {
    device_info info;
    VS_TRY(be.get_device_info(device, &info));
    pool_paths paths;
    VS_TRY(pool_paths::make(info.uuid, autostart, &paths));

    for (int attempt = 1;; ++attempt) {
      std::unique_ptr<pool_connection> c(new pool_connection(be));
      c->device_ = device;
      c->key_ = info.uuid;
      int rc = dial_server(paths.socket, &c->fd_);
      // A server that has claimed the pool and builds it listens once it has: wait for it.
      if (rc == err_unavailable) rc = wait_for_starting_server(paths, info.uuid, device, &c->fd_);
      if (rc == err_unavailable && autostart && restart_expected(info.uuid)) {
        // The pool's server is the node's service: give it the time to come back (its
        // manager restarts it), and never start one of ours instead. Ours would run in this
        // job's cgroup and die with it, and while it lived the service could not start.
        const uint64_t until = monotonic_ns() + k_managed_restart_wait_ns;
        const std::string waiting_for = "the node's service to serve device " + std::to_string(device) + " again on " + paths.socket;
        while (rc == err_unavailable && monotonic_ns() < until) {
          VS_TRY(wait_may_go_on(sleep_in_wait(50'000'000), waiting_for.c_str()));
          rc = dial_server(paths.socket, &c->fd_);
        }
        if (rc == ok) log(log_level::debug, "pool: the service manager restarted the pool server of %s", info.uuid.c_str());
        if (rc == err_unavailable) {
          return fail(err_unavailable,
                      "pool: the pool of device %d (%s) is served by the node's service (vramswapd under systemd, or "
                      "--service: a DaemonSet's), which has not listened on %s for %.0f s; this process starts no server of "
                      "its own for it. Start the service (systemctl start vramswapd@%d; the DaemonSet's pod), or, if this "
                      "node has no such service any more, remove the pool segment in the runtime dir so that jobs start "
                      "servers on demand",
                      device, info.uuid.c_str(), paths.socket.c_str(), k_managed_restart_wait_ns / 1e9, device);
        }
      }
      if (rc == err_unavailable && autostart) rc = start_or_join_server(paths, info.uuid, device, &c->fd_);
      if (rc != ok) {
        if (rc == err_unavailable && !autostart) {
          return fail(err_unavailable, "pool: no pool server listens on %s; start vramswapd --device %d, or connect with autostart",
                      paths.socket.c_str(), device);
        }
        return rc;
      }
      VS_TRY(check_server_peer(c->fd_, paths.socket));
      rc = c->handshake();
      // The server ended in the middle of it (a restart): once more, with the next server. A
      // refusal is the server's answer, not an end: never tried again.
      if (rc == err_system && !c->server_alive() && attempt < 3) {
        log(log_level::debug, "pool: the pool server ended while this process joined (%s); joining the next one", last_error());
        clear_error();
        continue;
      }
      VS_TRY(rc);
      *out = std::move(c);
      return ok;
    }
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "pool: out of host memory");
  }
}

int pool_connection::handshake() noexcept {
  using namespace pool_protocol;
  welcome w{};
  pid_t server = 0;
  VS_TRY(exchange_hello(&w, &server));
  member_ = w.member;
  server_pid_ = w.server_pid;
  frame_size_ = w.frame_size;
  pool_id_ = w.pool_id;
  raise_fd_limit(w.frame_count);
  frames_.reserve(w.frame_count);
  VS_TRY(receive_frames(w, server));
  if (w.host_slot_count > 0) VS_TRY(attach_host_pool(w.host_slot_count, w.host_pool_bytes));
  VS_TRY(open_segment(w));
  VS_TRY(attach_as_member(server));
  VS_TRY(set_timeouts(fd_, 0));
  note_pool_size_differs(be_, device_, frames_.size(), frame_size_, static_cast<int>(server_pid()));
  log(log_level::debug, "pool: member %u of %s: %zu frames of %" PRIu64 " bytes from server pid %d", member_, key_.c_str(),
      frames_.size(), frame_size_, static_cast<int>(server_pid()));
  return ok;
}

int pool_connection::exchange_hello(pool_protocol::welcome* welcome_out, pid_t* server_out) noexcept {
  using namespace pool_protocol;
  // Bounded: a server that stops answering is an error, not a hang.
  VS_TRY(set_timeouts(fd_, k_start_timeout_s));
  hello h{};
  VS_TRY(hello_from_this_process(&h));
  const int sent = send_hello(fd_, h);
  const std::string send_error = sent == ok ? "" : last_error();

  // Read the welcome even when the hello could not be sent: a server refuses a peer it does
  // not allow (SO_PEERCRED) before reading anything, and closes.
  welcome& w = *welcome_out;
  size_t len = 0;
  size_t nfds = 0;
  int fds[k_max_fds_per_message];
  const pid_t server = peer_pid(fd_);  // as this process sees it, for messages
  *server_out = server;
  VS_TRY(wait_for_answer(fd_, k_start_timeout_s, server, "this process's hello"));
  const int got = recv_fds(fd_, fds, 0, &nfds, &w, sizeof w, &len);
  if (sent != ok && (got != ok || len != sizeof w || w.status == 0)) {
    return fail(sent, "pool: sending hello to the pool server: %s", send_error.c_str());
  }
  VS_TRY(add_context(got, "pool: waiting for the pool server's welcome: "));
  if (len < offsetof(welcome, member) || w.magic != k_magic) {
    return fail(err_version_mismatch, "pool: the peer on the pool socket is not a vramswap pool server (%zu-byte reply)", len);
  }
  if (w.status != 0) {
    w.message[sizeof w.message - 1] = '\0';
    return fail(w.status, "pool: the pool server refused: %s", w.message);
  }
  if (w.version != k_version || len != sizeof w) {
    return fail(err_version_mismatch, "pool: the pool server speaks protocol version %u, this library version %u", w.version,
                k_version);
  }
  w.segment_name[sizeof w.segment_name - 1] = '\0';
  if (w.frame_size == 0 || w.frame_count == 0) {
    return fail(err_version_mismatch, "pool: the pool server's welcome announces %u frames of %" PRIu64 " bytes", w.frame_count,
                w.frame_size);
  }
  return ok;
}

int pool_connection::receive_frames(const pool_protocol::welcome& w, pid_t server) noexcept {
  using namespace pool_protocol;
  size_t len = 0;
  size_t nfds = 0;
  int fds[k_max_fds_per_message];
  while (frames_.size() < w.frame_count) {
    frame_batch b{};
    VS_TRY(wait_for_answer(fd_, k_start_timeout_s, server, "this process's hello with the pool's frames"));
    int rc = recv_fds(fd_, fds, k_max_fds_per_message, &nfds, &b, sizeof b, &len);
    if (rc != ok) return add_context(rc, "pool: receiving frames %zu.. of %u: ", frames_.size(), w.frame_count);
    if (len != sizeof b || b.first != frames_.size() || b.count != nfds || b.count == 0 ||
        frames_.size() + b.count > w.frame_count) {
      rc = fail(err_version_mismatch, "pool: malformed frame batch (first %u, count %u, %zu descriptors; expected first %zu of %u)",
                b.first, b.count, nfds, frames_.size(), w.frame_count);
    }
    for (size_t i = 0; i < nfds; ++i) {
      frame_id id = 0;
      if (rc == ok) {
        rc = be_.import_frame(device_, fds[i], frame_size_, &id);
        if (rc == ok) {
          frames_.push_back(id);
        } else {
          rc = add_context(rc, "pool: importing pool frame %zu: ", frames_.size());
        }
      }
      if (rc == ok && !kept_.keep(fds[i]) && kept_.fds().empty() && !told_not_kept_) {
        told_not_kept_ = true;
        log(log_level::info, "pool: this process cannot keep a descriptor of each of the pool's %u frames (%s; RLIMIT_NOFILE): "
            "it works as always, but a restarted vramswapd cannot take the frames over from it", w.frame_count, std::strerror(errno));
      }
      ::close(fds[i]);
    }
    VS_TRY(rc);
  }
  return ok;
}

int pool_connection::open_segment(const pool_protocol::welcome& w) noexcept {
  // By name, in this process's view of the runtime dir: a container may mount it elsewhere
  // than the server sees it. Opened after the frames and the host pool, which can take
  // seconds: the server that welcomed this process may have ended meanwhile, and the name be
  // gone or another server's (claimed, maybe still building its pool). That is the end of
  // this handshake, not a broken pool: the caller joins the next server (connect).
  int opened = pool_segment::open(w.segment_name, &segment_);
  if (opened == ok && (segment_->header()->server_pid != static_cast<int32_t>(server_pid()) || segment_->header()->pool_id != pool_id_)) {
    opened = fail(err_version_mismatch,
                  "pool: the pool segment %s belongs to the pool server pid %d, not to pid %d that welcomed this process",
                  segment_->path().c_str(), static_cast<int>(segment_->header()->server_pid), static_cast<int>(server_pid()));
  }
  if (opened != ok && !server_alive()) {
    const std::string why = last_error();
    segment_.reset();
    return fail(err_system, "pool: the pool server pid %d that welcomed this process ended before it attached (%s)",
                static_cast<int>(server_pid()), why.c_str());
  }
  VS_TRY(opened);
  // The segment at that name must be this server's: a frame table of another pool would
  // have this process write into frames that other processes own.
  if (segment_->header()->server_pid != static_cast<int32_t>(server_pid()) || segment_->header()->pool_id != pool_id_) {
    return fail(err_version_mismatch,
                "pool: the pool segment %s belongs to the pool server pid %d, not to pid %d that welcomed this "
                "process; the device's pool changed hands while connecting: connect again",
                segment_->path().c_str(), static_cast<int>(segment_->header()->server_pid), static_cast<int>(server_pid()));
  }
  if (segment_->frame_count() != frames_.size() || segment_->frame_size() != frame_size_ || member_ >= pool_layout::k_member_count) {
    return fail(err_version_mismatch, "pool: segment %s describes %u frames of %" PRIu64 " bytes, the server sent %zu of %" PRIu64,
                w.segment_name, segment_->frame_count(), segment_->frame_size(), frames_.size(), frame_size_);
  }
  if (segment_->host_slot_count() != host_slot_count_ || (host_slot_count_ > 0 && segment_->host_slot_size() != frame_size_)) {
    return fail(err_version_mismatch, "pool: segment %s describes %u host slots of %" PRIu64 " bytes, the server sent a host pool of %u",
                w.segment_name, segment_->host_slot_count(), segment_->host_slot_size(), host_slot_count_);
  }
  return ok;
}

int pool_connection::attach_as_member(pid_t server) noexcept {
  using namespace pool_protocol;
  size_t len = 0;
  size_t nfds = 0;
  int fds[k_max_fds_per_message];
  // The lease first, then the attach: a server that sees the attach knows the lease is
  // there for its successors to watch (pool/pool_protocol.hpp).
  const int leased = segment_->lease_member(member_);
  const std::string lease_error = leased == ok ? "" : last_error();
  const attach a{k_magic, leased};
  VS_TRY(add_context(send_fds(fd_, nullptr, 0, &a, sizeof a), "pool: telling the pool server this process attached: "));
  if (leased != ok) return fail(leased, "%s", lease_error.c_str());
  attach done{};
  VS_TRY(wait_for_answer(fd_, k_start_timeout_s, server, "this process's attach"));
  VS_TRY(add_context(recv_fds(fd_, fds, 0, &nfds, &done, sizeof done, &len), "pool: waiting for the pool server to confirm the attach: "));
  if (len != sizeof done || done.magic != k_magic || done.status != ok) {
    return fail(err_version_mismatch, "pool: the pool server did not confirm the attach (%zu-byte reply, status %d)", len, done.status);
  }
  return ok;
}

int pool_connection::rejoin(bool autostart) noexcept {
  try {
    pool_paths paths;
    VS_TRY(pool_paths::make(key_, autostart, &paths));
    int fd = -1;
    int rc = dial_server(paths.socket, &fd);
    if (rc == err_unavailable) rc = wait_for_starting_server(paths, key_, device_, &fd);
    if (rc == err_unavailable && autostart) rc = start_or_join_server(paths, key_, device_, &fd);
    if (rc != ok) return rc;
    fd_guard conn(fd);
    VS_TRY(check_server_peer(conn.fd, paths.socket));
    VS_TRY(rejoin_on(conn.fd));
    // Same descriptor number from now on: a thread polling socket_fd() never meets another file.
    if (::dup3(conn.fd, fd_, O_CLOEXEC) < 0) return fail_errno(errno, "pool: dup3 of the new pool server connection");
    log(log_level::debug, "pool: member %u of %s rejoined through server pid %d", member_, key_.c_str(), static_cast<int>(server_pid()));
    return ok;
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "pool: out of host memory");
  }
}

int pool_connection::rejoin_on(int fd) noexcept {
  using namespace pool_protocol;
  VS_TRY(set_timeouts(fd, k_start_timeout_s));
  hello h{};
  VS_TRY(hello_from_this_process(&h));
  h.flags = k_hello_rejoin | (kept_.complete() && kept_.fds().size() == frames_.size() ? k_hello_has_frames : 0);
  h.member = member_;
  h.pool_id = pool_id_;
  VS_TRY(add_context(send_hello(fd, h), "pool: sending the rejoin hello: "));
  welcome w{};
  size_t len = 0;
  size_t nfds = 0;
  VS_TRY(add_context(recv_fds(fd, nullptr, 0, &nfds, &w, sizeof w, &len), "pool: waiting for the next pool server's welcome: "));
  if (len < offsetof(welcome, member) || w.magic != k_magic) {
    return fail(err_version_mismatch, "pool: the peer on the pool socket is not a vramswap pool server (%zu-byte reply)", len);
  }
  if (w.status != 0 || w.version != k_version || len != sizeof w) {
    // This membership cannot go on: the pool it belongs to is gone for this process.
    w.message[sizeof w.message - 1] = '\0';
    const int code = w.status != 0 ? w.status : err_version_mismatch;
    if (code == err_unavailable) return fail(code, "pool: the pool server refused the rejoin for now: %s", w.message);
    lost_.store(true, std::memory_order_release);
    if (w.status == 0) {
      return fail(code, "pool: the pool server (pid %d) that followed pid %d speaks protocol version %u, this library version %u: "
                  "this process's pool is gone; restart the job", w.server_pid, static_cast<int>(server_pid()), w.version, k_version);
    }
    return fail(code, "pool: the pool server (pid %d) that followed pid %d does not take this process back as member %u: %s",
                w.server_pid, static_cast<int>(server_pid()), member_, w.message);
  }
  w.segment_name[sizeof w.segment_name - 1] = '\0';
  if ((w.flags & k_welcome_rejoined) == 0 || w.member != member_ || w.pool_id != pool_id_ || w.frame_count != frames_.size() ||
      w.frame_size != frame_size_ || w.host_slot_count != host_slot_count_ || segment_->name() != w.segment_name) {
    lost_.store(true, std::memory_order_release);
    return fail(err_version_mismatch,
                "pool: the pool server (pid %d) that followed pid %d serves another pool (%u frames of %" PRIu64 " bytes in %s, "
                "member %u) than this process's (%zu frames of %" PRIu64 " bytes in %s, member %u): this process's pool is gone; "
                "restart the job",
                w.server_pid, static_cast<int>(server_pid()), w.frame_count, w.frame_size, w.segment_name, w.member,
                frames_.size(), frame_size_, segment_->name().c_str(), member_);
  }
  if ((w.flags & k_welcome_send_frames) != 0) VS_TRY(send_frames(fd));
  attach done{};
  VS_TRY(add_context(recv_fds(fd, nullptr, 0, &nfds, &done, sizeof done, &len), "pool: waiting for the next pool server to confirm the rejoin: "));
  if (len != sizeof done || done.magic != k_magic || done.status != ok) {
    return fail(err_version_mismatch, "pool: the next pool server did not confirm the rejoin (%zu-byte reply, status %d)", len, done.status);
  }
  VS_TRY(set_timeouts(fd, 0));
  server_pid_.store(w.server_pid, std::memory_order_release);
  return ok;
}

// The descriptor of every frame this process was given (kept_: an imported frame cannot be
// exported again), and of the host pool: the next server has none of its own (its
// predecessor's went with it).
int pool_connection::send_frames(int fd) noexcept {
  using namespace pool_protocol;
  const std::vector<int>& fds = kept_.fds();
  if (fds.size() != frames_.size()) {
    return fail(err_invalid_argument, "pool: the next pool server asks for the frames' descriptors, but this process kept %zu of %zu",
                fds.size(), frames_.size());
  }
  for (size_t first = 0; first < fds.size(); first += k_max_fds_per_message) {
    const size_t count = std::min(k_max_fds_per_message, fds.size() - first);
    const frame_batch b{static_cast<uint32_t>(first), static_cast<uint32_t>(count)};
    VS_TRY(add_context(send_fds(fd, fds.data() + first, count, &b, sizeof b), "pool: handing frames %zu.. to the next pool server: ", first));
  }
  if (host_slot_count_ > 0) {
    const pool_protocol::host_pool hp{uint64_t{host_slot_count_} * frame_size_, host_slot_count_, 0};
    VS_TRY(add_context(send_fds(fd, &host_pool_fd_, 1, &hp, sizeof hp), "pool: handing the host pool to the next pool server: "));
  }
  return ok;
}

// The shared host pool: receive its memfd, map it MAP_SHARED, fault it in and register it
// with the backend once (pinned for the connection's life), as the stores pin their own
// chunks (core/pinned_chunk.hpp). The server faulted the memfd in (committed); here the
// pages are only mapped, never written, since other members' saved pages are in them.
int pool_connection::attach_host_pool(uint32_t slot_count, uint64_t bytes) noexcept {
  using namespace pool_protocol;
  pool_protocol::host_pool hp{};
  size_t len = 0;
  size_t nfds = 0;
  int fds[k_max_fds_per_message];
  VS_TRY(add_context(recv_fds(fd_, fds, k_max_fds_per_message, &nfds, &hp, sizeof hp, &len),
                     "pool: receiving the shared host pool's descriptor: "));
  fd_guard memfd(nfds >= 1 ? fds[0] : -1);
  for (size_t i = 1; i < nfds; ++i) ::close(fds[i]);
  if (len != sizeof hp || nfds != 1 || hp.bytes != bytes || hp.slot_count != slot_count ||
      bytes != uint64_t{slot_count} * frame_size_) {
    return fail(err_version_mismatch,
                "pool: malformed host pool message (%zu bytes, %zu descriptors, %" PRIu64 " bytes in %u slots; the welcome said %" PRIu64
                " bytes in %u slots of %" PRIu64 ")",
                len, nfds, hp.bytes, hp.slot_count, bytes, slot_count, frame_size_);
  }
  struct stat st {};
  if (::fstat(memfd.fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != bytes) {
    return fail(err_version_mismatch, "pool: the shared host pool's memfd is %lld bytes, the server announced %" PRIu64,
                static_cast<long long>(st.st_size), bytes);
  }
  // Faulted in without writing: other members' saved pages are in it (core/pinned_chunk.hpp).
  VS_TRY(pinned_chunk::map_shared(be_, memfd.fd, bytes, "pool: the shared host pool (VRAMSWAP_HOST_POOL of the server)", &host_pool_));
  host_slot_count_ = slot_count;
  host_pool_fd_ = memfd.release();  // for a next server, which gets it from its members
  return ok;
}

pool_connection::~pool_connection() {
  host_pool_ = pinned_chunk();  // unpins the shared host pool before the frames go
  // One line for all failures: after a device fault every release fails, and a pool has
  // thousands of frames.
  size_t failed = 0;
  std::string first;
  for (frame_id f : frames_) {
    if (be_.release_frame(f) != ok && failed++ == 0) first = last_error();
  }
  if (failed > 0) {
    log(log_level::warn, "pool: releasing %zu of the %zu imported frames at disconnect failed; the first: %s (still mapped? after a "
        "device fault the driver frees them when the process exits)", failed, frames_.size(), first.c_str());
  }
  if (host_pool_fd_ >= 0) ::close(host_pool_fd_);
  segment_.reset();  // the member lease goes with it, before the hang-up the server repairs at
  if (fd_ >= 0) ::close(fd_);
}

bool pool_connection::server_alive() const noexcept {
  if (fd_ < 0) return false;
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  int n;
  do {
    n = ::poll(&p, 1, 0);
  } while (n < 0 && errno == EINTR);
  // The server never writes after the frame batches: readable means its end closed.
  return n == 0;
}

}  // namespace vramswap::detail

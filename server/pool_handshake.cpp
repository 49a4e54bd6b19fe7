// pool_server's handshake: the listening socket (and the stale one of a dead server it
// replaces), accepting a client, checking its credentials and hello, and sending it the
// welcome, the frames' descriptors and the host pool's (pool/pool_protocol.hpp).
#include "server/pool_server.hpp"

#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>

#include "core/fd_guard.hpp"
#include "core/fd_transfer.hpp"
#include "core/unix_address.hpp"
#include "core/log.hpp"
#include "core/status.hpp"
#include "lock/ownership.hpp"
#include "lock/process_identity.hpp"
#include "lock/shared_segment.hpp"
#include "pool/pool_protocol.hpp"
#include "pool/pool_segment.hpp"
#include "pool/server_start.hpp"

namespace vramswap::detail {
namespace {

constexpr int k_client_io_timeout_s = 5;  // a client that stops reading during its handshake is dropped
// How long a newcomer may take between its welcome and its attach while its process lives:
// it pins the shared host pool meanwhile, which for hundreds of GiB takes as long as the
// server's own build of it. One that hangs up is dropped at once.
constexpr uint64_t k_attach_limit_ns = uint64_t{k_server_build_limit_s} * 1'000'000'000;

// What may be at the socket path before we bind: nothing, or the socket of a dead server of
// ours (we hold the server flock, so no live one of ours listens), which is removed. Anything
// else is refused and left alone: a file, a link or a directory is not ours to delete, and a
// socket somebody listens on is not stale.
int remove_stale_socket(const std::string& path, const sockaddr_un& addr) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return ok;
    return fail_errno(errno, "vramswapd: lstat %s", path.c_str());
  }
  if (!S_ISSOCK(st.st_mode)) {
    const char* kind = S_ISREG(st.st_mode) ? "a regular file" : S_ISLNK(st.st_mode) ? "a symbolic link" : S_ISDIR(st.st_mode) ? "a directory" : "not a socket";
    return fail(err_busy,
                "vramswapd: %s is %s (owner uid %u, %lld bytes), not a pool server's socket; it is left alone: move it "
                "away or remove it, then start the server again",
                path.c_str(), kind, static_cast<unsigned>(st.st_uid), static_cast<long long>(st.st_size));
  }
  // In group mode the pool is the group's: a socket a member's dead server left behind (the
  // group's, mode 0660) is this server's to replace.
  gid_t gid = 0;
  bool group = false;
  VS_TRY(configured_group(&gid, &group));
  const bool groups = group && st.st_gid == gid && (st.st_mode & 0007) == 0;
  if (st.st_uid != ::geteuid() && !groups) {
    return fail(err_not_owner,
                "vramswapd: the socket %s belongs to %s, group %s, not to this server's %s%s; it is left alone: remove it (as "
                "its owner or root), or set VRAMSWAP_RUNTIME_DIR to a directory of your own",
                path.c_str(), describe_uid(st.st_uid).c_str(), describe_gid(st.st_gid).c_str(), describe_uid(::geteuid()).c_str(),
                group ? (" or group " + describe_gid(gid) + " (VRAMSWAP_GROUP)").c_str() : "");
  }
  const int probe = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (probe < 0) return fail_errno(errno, "vramswapd: socket(AF_UNIX, SOCK_SEQPACKET)");
  int rc;
  do {
    rc = ::connect(probe, reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
  } while (rc != 0 && errno == EINTR);
  const int e = errno;
  ::close(probe);
  if (rc == 0 || (e != ECONNREFUSED && e != ENOENT)) {
    return fail(err_busy,
                "vramswapd: something listens on %s although this server holds the device's server lock (%s); it is left "
                "alone: find that process (ss -xlp | grep %s) and stop it",
                path.c_str(), rc == 0 ? "it accepted a connection" : std::strerror(e), path.c_str());
  }
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return fail_errno(errno, "vramswapd: removing the stale socket %s", path.c_str());
  log(log_level::info, "vramswapd: removed the stale socket %s of a dead server", path.c_str());
  return ok;
}

}  // namespace

int pool_server::open_socket() noexcept {
  sockaddr_un addr{};
  socklen_t addr_len = 0;
  if (unix_address(socket_path_, /*allow_abstract=*/false, &addr, &addr_len) != ok) {
    const std::string why = last_error();
    return fail(err_invalid_argument, "vramswapd: %s; use a shorter VRAMSWAP_RUNTIME_DIR", why.c_str());
  }
  listen_fd_ = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listen_fd_ < 0) return fail_errno(errno, "vramswapd: socket(AF_UNIX, SOCK_SEQPACKET)");
  VS_TRY(remove_stale_socket(socket_path_, addr));
  gid_t gid = 0;
  bool group = false;
  VS_TRY(configured_group(&gid, &group));
  // Bind under a tight umask so that the socket is never, even briefly, open to others.
  const mode_t old_mask = ::umask(group ? 0007 : 0077);
  const int brc = ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), addr_len);
  const int bind_errno = errno;
  ::umask(old_mask);
  if (brc != 0) return fail_errno(bind_errno, "vramswapd: bind %s", socket_path_.c_str());
  socket_bound_ = true;
  if (group && ::chown(socket_path_.c_str(), static_cast<uid_t>(-1), gid) != 0) {
    return fail_errno(errno, "vramswapd: cannot give %s to group %u (VRAMSWAP_GROUP)", socket_path_.c_str(), static_cast<unsigned>(gid));
  }
  if (::chmod(socket_path_.c_str(), group ? 0660 : 0600) != 0) return fail_errno(errno, "vramswapd: chmod %s", socket_path_.c_str());
  if (::listen(listen_fd_, 128) != 0) return fail_errno(errno, "vramswapd: listen on %s", socket_path_.c_str());
  return ok;
}

void pool_server::accept_one() noexcept {
  const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    if (e == EAGAIN || e == EINTR || e == ECONNABORTED) return;
    const uint64_t now = monotonic_ns();
    ++accept_failures_;
    const bool out_of_descriptors = e == EMFILE || e == ENFILE;
    if (out_of_descriptors) accept_paused_until_ns_ = now + k_accept_pause_ns;
    if (accept_warned_ns_ == 0 || now - accept_warned_ns_ >= k_accept_warn_interval_ns) {
      rlimit lim{};
      ::getrlimit(RLIMIT_NOFILE, &lim);
      log(log_level::warn, "vramswapd: accept: %s (%" PRIu64 " time(s) since the last warning; %zu clients, %zu connections "
          "waiting for their hello, RLIMIT_NOFILE %llu)%s", std::strerror(e), accept_failures_, clients_.size(), greeting_.size(),
          static_cast<unsigned long long>(lim.rlim_cur),
          out_of_descriptors ? "; new clients wait in the backlog until descriptors are free: raise the server's "
                                       "descriptor limit (LimitNOFILE= in its unit, ulimit -n)" : "");
      accept_warned_ns_ = now;
      accept_failures_ = 0;
    }
    return;
  }
  try {
    greeting_.push_back(greeting{fd, monotonic_ns()});
  } catch (const std::bad_alloc&) {
    refuse(fd, err_out_of_memory, "the pool server is out of host memory");
  }
}

void pool_server::drop_silent_connections(uint64_t now) noexcept {
  constexpr uint64_t limit_ns = uint64_t{k_client_io_timeout_s} * 1'000'000'000;
  for (size_t i = 0; i < greeting_.size();) {
    const greeting g = greeting_[i];
    if (g.since_ns >= now || now - g.since_ns < limit_ns) {  // accepted after `now` was read: not late
      ++i;
      continue;
    }
    greeting_.erase(greeting_.begin() + static_cast<ptrdiff_t>(i));
    ucred cred{};
    socklen_t cred_len = sizeof cred;
    const pid_t pid = ::getsockopt(g.fd, SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) == 0 ? cred.pid : 0;
    refuse(g.fd, err_timeout, "pid %d sent no hello within %d s of connecting (stopped or frozen?); connect again",
           static_cast<int>(pid), k_client_io_timeout_s);
  }
}

void pool_server::refuse(int fd, int status, const char* fmt, ...) noexcept {
  pool_protocol::welcome w{};
  w.magic = pool_protocol::k_magic;
  w.version = pool_protocol::k_version;
  w.status = status;
  w.server_pid = ::getpid();
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(w.message, sizeof w.message, fmt, ap);
  va_end(ap);
  log(log_level::warn, "vramswapd: refused a client (%s): %s", status_name(status), w.message);
  send_fds(fd, nullptr, 0, &w, sizeof w);
  // Drop whatever else the peer sent, so that the close does not reset the connection
  // (which would discard the welcome before the peer reads it).
  char sink[256];
  while (::recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0) {
  }
  ::close(fd);
}

bool pool_server::peer_allowed(int fd, const ucred& peer, std::string* why) noexcept {
  if (peer.uid == ::geteuid() || peer.uid == 0) return true;
  gid_t gid = 0;
  bool group = false;
  if (configured_group(&gid, &group) == ok && group && socket_peer_in_group(fd, gid)) return true;
  try {
    *why = describe_uid(peer.uid) + " may not use this pool: it belongs to " + describe_uid(::geteuid()) +
           (group ? " and group " + describe_gid(gid) + " (VRAMSWAP_GROUP), of which the peer is not a member"
                  : " alone (VRAMSWAP_GROUP is not set: set it, for the server and its clients, to share a pool among a group's users)");
  } catch (const std::bad_alloc&) {
    *why = "a peer of another user may not use this pool";
  }
  return false;
}

void pool_server::serve_new(int fd) noexcept {
  using pool_protocol::hello;
  using pool_protocol::welcome;
  using pool_protocol::frame_batch;
  using pool_protocol::k_version;
  constexpr uint32_t k_magic = pool_protocol::k_magic;
  timeval tv{k_client_io_timeout_s, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  ucred cred{};
  socklen_t cred_len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) != 0) {
    refuse(fd, err_system, "SO_PEERCRED failed: %s", std::strerror(errno));
    return;
  }
  // The hello first, even from a peer about to be refused: closing a Unix socket with
  // unread data resets the connection, and the peer would lose the welcome that says why.
  hello h{};
  size_t len = 0;
  size_t nfds = 0;
  int hello_fd = -1;
  if (recv_fds(fd, &hello_fd, 1, &nfds, &h, sizeof h, &len) != ok) {
    refuse(fd, err_invalid_argument, "no valid hello from pid %d: %s", static_cast<int>(cred.pid), last_error());
    return;
  }
  fd_guard pidfd(nfds == 1 ? hello_fd : -1);  // closed on every refusal below
  std::string why;
  if (!peer_allowed(fd, cred, &why)) {
    refuse(fd, err_not_owner, "%s", why.c_str());
    return;
  }
  if (len != sizeof h || h.magic != k_magic || h.version != k_version) {
    refuse(fd, err_version_mismatch,
           "pid %d sent a %zu-byte hello with magic %#x, protocol version %u; this server (pid %d) speaks protocol version %u "
           "(%zu-byte hello, magic %#x): run client and server from the same vramswap version",
           static_cast<int>(cred.pid), len, len >= 4 ? h.magic : 0u, len >= 8 ? h.version : 0u, static_cast<int>(::getpid()),
           k_version, sizeof h, k_magic);
    return;
  }
  if (!peer_told_the_truth(fd, cred, h, pidfd.fd)) return;
  if ((h.flags & pool_protocol::k_hello_rejoin) != 0) {
    serve_rejoin(fd, h, cred.pid, pidfd.release());
    return;
  }
  if (frames_.empty()) {
    wait_for_frames(fd, h, cred.pid, &pidfd);
    return;
  }
  welcome_newcomer(fd, h, cred.pid, pidfd.release());
}

bool pool_server::peer_told_the_truth(int fd, const ucred& cred, const pool_protocol::hello& h, int pidfd) noexcept {
  // What the kernel says of the peer, where this server can see it: SO_PEERCRED's pid is
  // translated into this server's PID namespace (0 when the peer's is not below it), and
  // /proc/<that pid>/ns/pid names the peer's own namespace. A peer this server sees must have
  // told the truth; one it cannot see (a sibling container) is taken at its word, and no
  // decision rests on that word (pool/pool_protocol.hpp, hello).
  if (cred.pid != 0) {
    // Unreadable (another user's /proc/<pid>/ns without ptrace rights): a claim of this
    // server's own namespace must still hold.
    const uint64_t peer_ns = pid_namespace_of(cred.pid);
    if (peer_ns != 0 && h.pid_ns != peer_ns) {
      refuse(fd, err_invalid_argument, "the hello names PID namespace pid:[%" PRIu64 "] but the socket's peer (pid %d here) is in "
             "pid:[%" PRIu64 "]", h.pid_ns, static_cast<int>(cred.pid), peer_ns);
      return false;
    }
    if ((peer_ns == current_pid_namespace() || (peer_ns == 0 && h.pid_ns == current_pid_namespace())) && h.pid != cred.pid) {
      refuse(fd, err_invalid_argument, "the hello names pid %d of this server's PID namespace but the socket's peer is pid %d",
             h.pid, static_cast<int>(cred.pid));
      return false;
    }
    if (check_liveness({cred.pid, h.start_time}) != liveness::alive) {
      refuse(fd, err_invalid_argument, "pid %d's start time %" PRIu64 " does not match /proc/%d/stat", static_cast<int>(cred.pid),
             h.start_time, static_cast<int>(cred.pid));
      return false;
    }
  }
  // The pidfd must be one, and, for a peer this server can see, the peer's: its exit is
  // what the server waits for before it scrubs the member's frames (client_exited).
  if (pidfd >= 0) {
    const pid_t of = pidfd_process(pidfd);
    if (of == -2 || (cred.pid != 0 && of != cred.pid)) {
      refuse(fd, err_invalid_argument, "the descriptor sent with pid %d's hello is %s, not a pidfd of the peer (pid %d here)",
             static_cast<int>(cred.pid), of == -2 ? "not a pidfd" : ("a pidfd of pid " + std::to_string(of)).c_str(),
             static_cast<int>(cred.pid));
      return false;
    }
  }
  return true;
}

void pool_server::wait_for_frames(int fd, const pool_protocol::hello& h, pid_t peer_pid, fd_guard* pidfd) noexcept {
  // An adopted pool whose frames no member has handed over yet: the newcomer's welcome
  // waits (tend_adoption).
  try {
    waiting_.push_back(newcomer{fd, h, peer_pid, pidfd->fd, monotonic_ns()});
  } catch (const std::bad_alloc&) {
    refuse(fd, err_out_of_memory, "the pool server is out of host memory");
    return;
  }
  pidfd->release();
  log(log_level::info, "vramswapd: pid %d waits for its welcome until a member of the adopted pool hands over the frames",
      static_cast<int>(h.pid));
}

// A new member: a slot, the welcome, every frame's descriptor, the host pool's, then the
// attach exchange (pool/pool_protocol.hpp). Takes `fd` and `pidfd_in`.
void pool_server::welcome_newcomer(int fd, const pool_protocol::hello& h, pid_t peer_pid, int pidfd_in) noexcept {
  using pool_protocol::welcome;
  using pool_protocol::frame_batch;
  using pool_protocol::k_version;
  constexpr uint32_t k_magic = pool_protocol::k_magic;
  fd_guard pidfd(pidfd_in);
  uint32_t member = 0;
  if (segment_->add_member(h.pid, h.start_time, h.pid_ns, &member) != ok) {
    refuse(fd, err_busy, "%s", last_error());
    return;
  }
  welcome w{};
  w.magic = k_magic;
  w.version = k_version;
  w.status = ok;
  w.member = member;
  w.frame_count = frame_count();
  w.server_pid = ::getpid();
  w.frame_size = frame_size_;
  std::snprintf(w.segment_name, sizeof w.segment_name, "%s", segment_->name().c_str());
  w.host_slot_count = host_slots_;
  w.host_pool_bytes = uint64_t{host_slots_} * frame_size_;
  w.pool_id = segment_->header()->pool_id;
  int rc = send_fds(fd, nullptr, 0, &w, sizeof w);
  for (uint32_t first = 0; rc == ok && first < frame_count(); first += static_cast<uint32_t>(k_max_fds_per_message)) {
    frame_batch b{first, static_cast<uint32_t>(std::min<size_t>(k_max_fds_per_message, frame_count() - first))};
    rc = send_fds(fd, &exported_[first], b.count, &b, sizeof b);
  }
  if (rc == ok && host_slots_ > 0) {
    pool_protocol::host_pool hp{w.host_pool_bytes, host_slots_, 0};
    rc = send_fds(fd, &host_pool_fd_, 1, &hp, sizeof hp);
  }
  if (rc != ok) {
    log(log_level::warn, "vramswapd: pid %d left during its handshake: %s", h.pid, last_error());
    segment_->remove_member(member);
    ::close(fd);
    return;
  }
  // The client imports the frames, pins the host pool, leases its slot, then says so; only
  // then is it a member (a server that dies before this point leaves a slot that no lease
  // holds, which the next one repairs). run() waits for that message (finish_attach).
  try {
    attaching_.push_back(attaching{fd, member, h, peer_pid, pidfd.fd, monotonic_ns()});
  } catch (const std::bad_alloc&) {
    log(log_level::warn, "vramswapd: pid %d dropped during its handshake: out of host memory", h.pid);
    segment_->remove_member(member);
    ::close(fd);
    return;
  }
  pidfd.release();
}

void pool_server::finish_attach(size_t i) noexcept {
  constexpr uint32_t k_magic = pool_protocol::k_magic;
  const attaching a = attaching_[i];
  attaching_.erase(attaching_.begin() + static_cast<ptrdiff_t>(i));
  pool_protocol::attach msg{};
  size_t len = 0;
  size_t nfds = 0;
  int rc = recv_fds(a.fd, nullptr, 0, &nfds, &msg, sizeof msg, &len);
  if (rc == ok && (len != sizeof msg || msg.magic != k_magic)) rc = fail(err_version_mismatch, "a malformed attach message (%zu bytes)", len);
  if (rc == ok && msg.status != ok) {
    rc = fail(msg.status < 0 ? msg.status : err_internal, "it could not attach (%s; its own error says why)", status_name(msg.status));
  }
  if (rc == ok) {
    const pool_protocol::attach done{k_magic, ok};
    rc = send_fds(a.fd, nullptr, 0, &done, sizeof done);
  }
  bool added = false;
  if (rc == ok) {
    try {
      clients_.push_back(client{a.fd, a.member, a.hello.pid, a.hello.start_time, a.peer_pid, a.pidfd, 0, false});
      added = true;
    } catch (const std::bad_alloc&) {
      rc = fail(err_out_of_memory, "out of host memory");
    }
  }
  if (!added) {
    log(log_level::warn, "vramswapd: pid %d left during its handshake: %s", a.hello.pid, last_error());
    segment_->remove_member(a.member);
    ::close(a.fd);
    if (a.pidfd >= 0) ::close(a.pidfd);
    return;
  }
  log(log_level::info, "vramswapd: member %u: pid %d attached in %.2f s (%zu clients)", a.member, a.hello.pid,
      static_cast<double>(monotonic_ns() - a.since_ns) / 1e9, clients_.size());
}

void pool_server::drop_late_attaches(uint64_t now) noexcept {
  for (size_t i = 0; i < attaching_.size();) {
    const attaching& a = attaching_[i];
    if (a.since_ns >= now || now - a.since_ns < k_attach_limit_ns) {  // welcomed after `now` was read: not late
      ++i;
      continue;
    }
    log(log_level::warn,
        "vramswapd: pid %d did not attach within %d s of its welcome (importing the frames, pinning the host pool); "
        "dropped, its member slot %u freed: it gets an error and may connect again",
        static_cast<int>(a.hello.pid), k_server_build_limit_s, a.member);
    segment_->remove_member(a.member);
    ::close(a.fd);
    if (a.pidfd >= 0) ::close(a.pidfd);
    attaching_.erase(attaching_.begin() + static_cast<ptrdiff_t>(i));
  }
}
}  // namespace vramswap::detail

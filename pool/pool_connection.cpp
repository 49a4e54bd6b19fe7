#include "pool/pool_connection.hpp"
#include "pool/preload_shim.hpp"

#include <dlfcn.h>
#include <link.h>
#include <signal.h>
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <climits>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>
#include <new>

#include "core/fd_transfer.hpp"
#include "core/log.hpp"
#include "core/options.hpp"
#include "core/status.hpp"
#include "lock/ownership.hpp"
#include "pool/pool_protocol.hpp"
#include "pool/pool_segment.hpp"
#include "lock/process_identity.hpp"
#include "lock/shared_segment.hpp"

extern char** environ;

namespace vramswap::detail {
namespace {

// Closes a descriptor at scope exit unless released.
struct fd_guard {
  int fd = -1;
  explicit fd_guard(int f = -1) : fd(f) {}
  ~fd_guard() {
    if (fd >= 0) ::close(fd);
  }
  fd_guard(const fd_guard&) = delete;
  fd_guard& operator=(const fd_guard&) = delete;
  int release() {
    const int f = fd;
    fd = -1;
    return f;
  }
};

// Connect to the SOCK_SEQPACKET socket at `path`. err_unavailable when nobody listens
// there (no such file, or a stale file of a dead server).
int try_connect(const std::string& path, int* fd_out) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    return fail(err_invalid_argument, "pool: socket path %s is longer than %zu bytes; use a shorter VRAMSWAP_RUNTIME_DIR",
                path.c_str(), sizeof addr.sun_path - 1);
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  fd_guard fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (fd.fd < 0) return fail_errno(errno, "pool: socket(AF_UNIX, SOCK_SEQPACKET)");
  int rc;
  do {
    rc = ::connect(fd.fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int e = errno;
    if (e == ENOENT || e == ECONNREFUSED) return fail(err_unavailable, "pool: no pool server listens on %s", path.c_str());
    return fail_errno(e, "pool: connect to %s", path.c_str());
  }
  *fd_out = fd.release();
  return ok;
}

// The server at the other end of `fd` (connected to `path`) must be ours: this user's, or in
// group mode a member of VRAMSWAP_GROUP. Anyone else's would see and write this process's
// memory through the frames it hands out.
int check_server_peer(int fd, const std::string& path) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return fail_errno(errno, "pool: SO_PEERCRED on %s", path.c_str());
  sharing who;
  VS_TRY(current_sharing(&who));
  if (cred.uid == ::geteuid()) return ok;
  if (who.group && (cred.gid == who.gid || process_in_group(cred.pid, who.gid))) return ok;
  return fail(err_not_owner,
              "pool: the pool server listening on %s (pid %d) runs as %s, not as you (%s)%s: another user's server is never "
              "used (its frames would expose this process's memory to it); have its owner stop it, or use another "
              "VRAMSWAP_RUNTIME_DIR",
              path.c_str(), static_cast<int>(cred.pid), describe_uid(cred.uid).c_str(), describe_uid(::geteuid()).c_str(),
              who.group ? (" and is not in group " + describe_gid(who.gid) + " (VRAMSWAP_GROUP)").c_str() : "");
}

int set_timeouts(int fd, int seconds) {
  timeval tv{seconds, 0};
  if (::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
      ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0) {
    return fail_errno(errno, "pool: setsockopt(SO_RCVTIMEO/SO_SNDTIMEO)");
  }
  return ok;
}

std::string directory_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// The last `max` bytes of a file, for error messages that point at a log.
std::string tail_of(const std::string& path, size_t max) {
  fd_guard fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.fd < 0) return "";
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) return "";
  const off_t from = st.st_size > static_cast<off_t>(max) ? st.st_size - static_cast<off_t>(max) : 0;
  std::string text(static_cast<size_t>(st.st_size - from), '\0');
  const ssize_t n = ::pread(fd.fd, text.data(), text.size(), from);
  text.resize(n > 0 ? static_cast<size_t>(n) : 0);
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

// A pidfd for `pid` (Linux 5.3), so that a signal sent to it later can only reach that
// process, never one that reused its pid; -1 where the kernel has none.
int open_pidfd(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  return -1;
#endif
}

void kill_through(int pidfd, pid_t pid) {
#ifdef SYS_pidfd_send_signal
  if (pidfd >= 0 && ::syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0) == 0) return;
  if (pidfd >= 0 && errno == ESRCH) return;  // already gone
#endif
  (void)pidfd;
  if (pid > 0) ::kill(pid, SIGKILL);
}

// Reap child `pid`, waiting at most `ms` (it was sent SIGKILL, or is about to exit).
bool reap_within(pid_t pid, int ms) {
  for (int waited = 0;; waited += 5) {
    int wstatus = 0;
    const pid_t r = ::waitpid(pid, &wstatus, WNOHANG);
    if (r == pid || (r < 0 && errno == ECHILD)) return true;
    if (waited >= ms) return false;
    ::usleep(5000);
  }
}

// What a client that starts a server records in the start lock file, for the clients that
// wait on it: "<client pid> <server pid> <state> <status> <server path>", the server pid 0
// until it is known, the state "starting", "ready" or "failed" (then <status> is its error).
void note_start(int lock_fd, pid_t server_pid, const char* state, int status, const std::string& server) {
  const std::string text = std::to_string(::getpid()) + " " + std::to_string(server_pid) + " " + state + " " +
                           std::to_string(status) + " " + server + "\n";
  if (::ftruncate(lock_fd, 0) != 0 || ::pwrite(lock_fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    log(log_level::debug, "pool: cannot record this start in the start lock file: %s", std::strerror(errno));
  }
}

struct start_record {
  int client = 0;
  int server_pid = 0;
  std::string state;
  int status = 0;
  std::string server;
};

bool read_start_record(int lock_fd, start_record* r) {
  char text[PATH_MAX + 96] = {};
  const ssize_t n = ::pread(lock_fd, text, sizeof text - 1, 0);
  char state[16] = {};
  int used = 0;
  if (n <= 0 || std::sscanf(text, "%d %d %15s %d %n", &r->client, &r->server_pid, state, &r->status, &used) < 4 || used == 0) {
    return false;
  }
  r->state = state;
  r->server = text + used;
  while (!r->server.empty() && r->server.back() == '\n') r->server.pop_back();
  return true;
}

// Wait for the start lock until `deadline`. Meanwhile keep trying the socket: the server that
// another client is starting listens before that client lets go of the lock. ok with *fd >= 0
// when connected, ok with *fd < 0 when the lock is ours and a start is up to us; err_timeout
// naming whoever holds it; the start's error when the client we waited for failed to start
// one (trying again at once, with what is left of our time, would only fail again).
int wait_for_start_lock(int lock_fd, const pool_paths& paths, int device, uint64_t deadline, int* fd) {
  *fd = -1;
  bool waited = false;
  for (;;) {
    if (::flock(lock_fd, LOCK_EX | LOCK_NB) == 0) break;
    if (errno != EWOULDBLOCK && errno != EINTR) return fail_errno(errno, "pool: flock %s", paths.start_lock.c_str());
    waited = true;
    const int rc = try_connect(paths.socket, fd);
    if (rc == ok) return ok;
    if (rc != err_unavailable) return rc;
    clear_error();
    if (monotonic_ns() >= deadline) {
      start_record r;
      if (!read_start_record(lock_fd, &r)) {
        return fail(err_timeout,
                    "pool: no pool server for device %d became ready within %d s, and another process holds the start lock "
                    "%s without saying what it starts; find it (fuser -v %s), look at the server's log %s, or start "
                    "vramswapd --device %d --foreground yourself",
                    device, pool_connection::k_start_timeout_s, paths.start_lock.c_str(), paths.start_lock.c_str(),
                    paths.log.c_str(), device);
      }
      const std::string pid = r.server_pid > 0 ? " (pid " + std::to_string(r.server_pid) + ")" : " (its pid not known yet)";
      return fail(err_timeout,
                  "pool: no pool server for device %d became ready within %d s: client pid %d holds the start lock %s while "
                  "it starts the pool server %s%s; see the server's log %s. If that server hangs, stop it%s and fix what "
                  "its log says, or start vramswapd --device %d --foreground yourself",
                  device, pool_connection::k_start_timeout_s, r.client, paths.start_lock.c_str(), r.server.c_str(),
                  pid.c_str(), paths.log.c_str(), r.server_pid > 0 ? (" (kill " + std::to_string(r.server_pid) + ")").c_str() : "",
                  device);
    }
    ::usleep(10'000);
  }
  start_record r;
  if (waited && read_start_record(lock_fd, &r) && r.state == "failed" && r.client != ::getpid()) {
    return fail(r.status < 0 ? r.status : err_unavailable,
                "pool: client pid %d tried to start the pool server %s (pid %d) for device %d while this process waited for "
                "it, and failed (%s); see the server's log %s and that client's error. Fix what they say, or start vramswapd "
                "--device %d --foreground yourself",
                r.client, r.server.c_str(), r.server_pid, device, status_name(r.status), paths.log.c_str(), device);
  }
  return ok;
}

// Spawn vramswapd for `device` and wait until it reports ready (or an error) on a pipe, at
// most until `deadline`; a server still not ready then is killed (and our child reaped), so
// that nothing is left behind and the start lock passes on. `lock_fd`: the start lock, ours.
// *server_out and *server_pid_out say what was started (for the start lock's record).
int spawn_server(const pool_paths& paths, int device, int lock_fd, uint64_t deadline, std::string* server_out,
                 pid_t* server_pid_out) {
  std::string server;
  std::string tried;
  VS_TRY(pool_connection::find_server(&server, &tried));
  *server_out = server;
  if (monotonic_ns() >= deadline) {
    return fail(err_timeout,
                "pool: no pool server for device %d became ready within %d s (this process waited that long for another "
                "client's start, which failed; see the log %s)",
                device, pool_connection::k_start_timeout_s, paths.log.c_str());
  }
  note_start(lock_fd, 0, "starting", ok, server);

  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return fail_errno(errno, "pool: pipe2 for vramswapd's ready report");
  fd_guard read_end(pipe_fds[0]);
  // The write end goes to the server as descriptor 3; keep the source away from 0..3 so
  // that posix_spawn's dup2 really happens (and clears close-on-exec).
  fd_guard write_end(::fcntl(pipe_fds[1], F_DUPFD_CLOEXEC, 10));
  ::close(pipe_fds[1]);
  if (write_end.fd < 0) return fail_errno(errno, "pool: fcntl(F_DUPFD_CLOEXEC)");

  // The server's environment: ours, plus every option set programmatically in this process
  // (option_set), so that it serves the pool this process expects.
  std::vector<std::string> env_text;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (std::strncmp(*e, "VRAMSWAP_", 9) == 0) continue;
    if (std::strncmp(*e, "LD_PRELOAD=", 11) == 0) {
      const std::string rest = without_preload_shim(*e + 11);
      if (!rest.empty()) env_text.push_back("LD_PRELOAD=" + rest);
      continue;
    }
    env_text.emplace_back(*e);
  }
  for (int id = 0; id < static_cast<int>(option_id::count_); ++id) {
    const auto oid = static_cast<option_id>(id);
    if (!option_is_default(oid)) env_text.push_back(std::string(describe(oid).env_name) + "=" + option_text(oid));
  }
  std::vector<char*> envp;
  for (std::string& s : env_text) envp.push_back(s.data());
  envp.push_back(nullptr);

  const std::string device_text = std::to_string(device);
  const char* argv[] = {server.c_str(), "--device", device_text.c_str(), "--ready-fd", "3", nullptr};

  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&actions);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, write_end.fd, 3);
  // Its own session: no terminal signals from ours. Default signal dispositions and mask.
  sigset_t none;
  sigset_t all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = 0;
  const int spawn_rc = ::posix_spawn(&pid, server.c_str(), &actions, &attr, const_cast<char**>(argv), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(write_end.release());
  if (spawn_rc != 0) return fail_errno(spawn_rc, "pool: cannot start the pool server %s", server.c_str());
  log(log_level::info, "pool: started the pool server %s for device %d (log: %s)", server.c_str(), device, paths.log.c_str());
  note_start(lock_fd, pid, "starting", ok, server);
  *server_pid_out = pid;

  // vramswapd forks once and its first process exits at once: reap it, so that the server
  // is nobody's child (no zombie of ours when it exits, none of it dying with us). The
  // second process reports "started <pid>" at once, then "ready <pid>" or "error <message>";
  // EOF means it died. Every wait here ends by the deadline.
  bool reaped = false;
  pid_t server_pid = 0;  // the detached server, once it said "started"
  fd_guard server_pidfd;
  std::string report;    // what was read and not yet taken as a line
  std::string outcome;   // the "ready ..." or "error ..." line
  bool eof = false;
  while (outcome.empty() && !eof) {
    if (!reaped) {
      int wstatus = 0;
      const pid_t r = ::waitpid(pid, &wstatus, WNOHANG);
      reaped = r == pid || (r < 0 && errno == ECHILD);
    }
    const uint64_t now = monotonic_ns();
    if (now >= deadline) break;
    // Poll the pipe; while our child lives, wake every 10 ms to reap it.
    const int left_ms = static_cast<int>((deadline - now) / 1'000'000) + 1;
    pollfd p{read_end.fd, POLLIN, 0};
    const int n = ::poll(&p, 1, reaped ? left_ms : std::min(left_ms, 10));
    if (n < 0 && errno != EINTR) return fail_errno(errno, "pool: poll on vramswapd's ready pipe");
    if (n <= 0) continue;
    char buf[512];
    const ssize_t got = ::read(read_end.fd, buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      eof = true;
      break;
    }
    report.append(buf, static_cast<size_t>(got));
    for (size_t nl; outcome.empty() && (nl = report.find('\n')) != std::string::npos;) {
      const std::string line = report.substr(0, nl);
      report.erase(0, nl + 1);
      int started = 0;
      if (std::sscanf(line.c_str(), "started %d", &started) == 1 && started > 0) {
        server_pid = started;
        *server_pid_out = server_pid;
        if (server_pidfd.fd >= 0) ::close(server_pidfd.fd);
        server_pidfd.fd = open_pidfd(server_pid);
        note_start(lock_fd, server_pid, "starting", ok, server);
      } else {
        outcome = line;
      }
    }
  }
  if (outcome.empty() && !eof) {
    // Not ready by the deadline: kill what we started, so that it neither lingers nor comes
    // up later behind the back of the clients that were told it failed.
    if (!reaped) {
      ::kill(pid, SIGKILL);
      reaped = reap_within(pid, 2000);
    }
    if (server_pid > 0 && server_pid != pid) kill_through(server_pidfd.fd, server_pid);
    const pid_t named = server_pid > 0 ? server_pid : pid;
    const std::string tail = tail_of(paths.log, 600);
    return fail(err_timeout,
                "pool: the pool server %s (pid %d) did not become ready within %d s, so it was killed%s; its log %s ends with: "
                "%s. Fix what the log says; a server that needs longer to build its pool can be started by hand "
                "(vramswapd --device %d --foreground)",
                server.c_str(), static_cast<int>(named), pool_connection::k_start_timeout_s,
                reaped ? "" : " (our child did not exit in 2 s of SIGKILL)", paths.log.c_str(),
                tail.empty() ? "(nothing)" : tail.c_str(), device);
  }
  // Its first process exits right after its fork, long before any report: give it a moment
  // rather than leave a zombie, but never wait on a server that did not fork.
  if (!reaped) reap_within(pid, 1000);
  if (outcome.rfind("ready", 0) == 0) return ok;
  if (outcome.rfind("error ", 0) == 0) {
    return fail(err_unavailable, "pool: the pool server %s could not start: %s", server.c_str(), outcome.c_str() + 6);
  }
  const std::string tail = tail_of(paths.log, 600);
  return fail(err_unavailable, "pool: the pool server %s exited before it was ready; its log %s ends with: %s", server.c_str(),
              paths.log.c_str(), tail.empty() ? "(nothing)" : tail.c_str());
}

// A descriptor limit high enough for `frames` imported frames (the host backend keeps one
// descriptor per imported frame) plus a margin; best effort.
void raise_fd_limit(uint64_t frames) {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
  const rlim_t want = static_cast<rlim_t>(frames + 1024);
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

}  // namespace

int pool_paths::make(const std::string& device_key, bool create_dir, pool_paths* out) noexcept {
  try {
    std::string unused;
    VS_TRY(shared_segment::name_for(device_key, &unused));  // the key's character rules
    gid_t gid = 0;
    bool group = false;
    VS_TRY(configured_group(&gid, &group));
    pool_paths p;
    p.dir = option_text(option_id::runtime_dir);
    if (p.dir.empty()) {
      p.dir = group ? "/tmp/vramswap-g" + std::to_string(gid) : "/tmp/vramswap-" + std::to_string(::getuid());
    }
    while (p.dir.size() > 1 && p.dir.back() == '/') p.dir.pop_back();
    // The prefix names the files as it names the segments: pools under two prefixes are two
    // pools, each with its own server, even in one runtime dir.
    const std::string base = p.dir + "/" + option_text(option_id::shm_prefix) + device_key;
    p.socket = base + ".sock";
    p.server_lock = base + ".server.lock";
    p.start_lock = base + ".start.lock";
    p.log = base + ".log";
    if (create_dir) {
      const mode_t mode = group ? 0770 : 0700;
      if (::mkdir(p.dir.c_str(), mode) == 0) {
        // Set group and mode explicitly: mkdir's mode went through the umask.
        if (group && ::chown(p.dir.c_str(), static_cast<uid_t>(-1), gid) != 0) {
          return fail_errno(errno, "pool: cannot give the runtime dir %s to group %u (VRAMSWAP_GROUP)", p.dir.c_str(),
                            static_cast<unsigned>(gid));
        }
        if (::chmod(p.dir.c_str(), mode) != 0) return fail_errno(errno, "pool: chmod %s", p.dir.c_str());
      } else if (errno != EEXIST) {
        return fail_errno(errno, "pool: cannot create the runtime dir %s (VRAMSWAP_RUNTIME_DIR)", p.dir.c_str());
      }
      // Checked on the opened directory, never by a path looked at first (a symlink is refused).
      const int dir_fd = ::open(p.dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (dir_fd < 0) {
        const int e = errno;
        struct stat st {};
        if ((e == ENOTDIR || e == ELOOP) && ::lstat(p.dir.c_str(), &st) == 0) {
          return fail(err_not_owner, "pool: the runtime dir %s is not a directory (a symlink or file is refused); remove it or set "
                      "VRAMSWAP_RUNTIME_DIR to a directory of your own", p.dir.c_str());
        }
        return fail_errno(e, "pool: cannot open the runtime dir %s", p.dir.c_str());
      }
      struct stat st {};
      const int src = ::fstat(dir_fd, &st);
      const int e = errno;
      ::close(dir_fd);
      if (src != 0) return fail_errno(e, "pool: fstat the runtime dir %s", p.dir.c_str());
      sharing who;
      who.group = group;
      who.gid = gid;
      VS_TRY(check_owned(st, S_IFDIR, p.dir, "pool: the runtime dir", who, "or set VRAMSWAP_RUNTIME_DIR to a directory of your own"));
    }
    *out = std::move(p);
    return ok;
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "pool: out of host memory");
  }
}

int pool_connection::find_server(std::string* path, std::string* tried) noexcept {
  try {
    std::vector<std::string> candidates;
    const std::string configured = option_text(option_id::server_path);
    if (!configured.empty()) {
      candidates.push_back(configured);
    } else {
      // The object holding this code: a shared object's path from its link map, or, when the
      // code is linked into the program itself (whose link map name is empty and whose dladdr
      // name is argv[0], perhaps relative), /proc/self/exe.
      Dl_info info{};
      link_map* map = nullptr;
      std::string holder;
      if (::dladdr1(reinterpret_cast<void*>(&pool_connection::find_server), &info, reinterpret_cast<void**>(&map),
                    RTLD_DL_LINKMAP) != 0 &&
          map != nullptr && map->l_name != nullptr && map->l_name[0] != '\0') {
        holder = map->l_name;
      } else {
        char exe[PATH_MAX];
        const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (n > 0) holder.assign(exe, static_cast<size_t>(n));
      }
      if (!holder.empty()) {
        char resolved[PATH_MAX];
        const std::string lib = ::realpath(holder.c_str(), resolved) != nullptr ? resolved : holder;
        const std::string dir = directory_of(lib);
        candidates.push_back(dir + "/vramswapd");
        candidates.push_back(dir + "/../bin/vramswapd");
        candidates.push_back(dir + "/../libexec/vramswapd");
      }
    }
    tried->clear();
    for (const std::string& c : candidates) {
      if (!tried->empty()) *tried += ", ";
      *tried += c;
      if (::access(c.c_str(), X_OK) == 0) {
        *path = c;
        return ok;
      }
    }
    if (!configured.empty()) {
      return fail(err_unavailable, "pool: VRAMSWAP_SERVER=%s is not an executable file", configured.c_str());
    }
    return fail(err_unavailable,
                "pool: cannot find vramswapd to start the pool server; tried %s; set VRAMSWAP_SERVER to its path or "
                "start it yourself (vramswapd --foreground)",
                tried->empty() ? "(no location of libvramswap known)" : tried->c_str());
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "pool: out of host memory");
  }
}

int pool_connection::connect(backend& be, int device, bool autostart, std::unique_ptr<pool_connection>* out) noexcept {
  try {
    device_info info;
    VS_TRY(be.get_device_info(device, &info));
    pool_paths paths;
    VS_TRY(pool_paths::make(info.uuid, autostart, &paths));

    std::unique_ptr<pool_connection> c(new pool_connection(be));
    c->device_ = device;
    c->key_ = info.uuid;
    int rc = try_connect(paths.socket, &c->fd_);
    if (rc == err_unavailable && autostart) {
      // One bound for all of a start: waiting for the start lock, the spawn, the ready report.
      const uint64_t deadline = monotonic_ns() + uint64_t{k_start_timeout_s} * 1'000'000'000;
      // One starter at a time: the others wait here and then find the server it started.
      fd_guard lock;
      VS_TRY(open_owned(paths.start_lock, O_RDWR | O_CREAT, "pool: the start lock", "or use another VRAMSWAP_RUNTIME_DIR", &lock.fd));
      VS_TRY(wait_for_start_lock(lock.fd, paths, device, deadline, &c->fd_));
      rc = c->fd_ >= 0 ? ok : try_connect(paths.socket, &c->fd_);
      if (rc == err_unavailable) {
        std::string server;
        pid_t server_pid = 0;
        const int spawned = spawn_server(paths, device, lock.fd, deadline, &server, &server_pid);
        const std::string spawn_error = spawned == ok ? "" : last_error();
        rc = try_connect(paths.socket, &c->fd_);
        // A server that lost a race with one started by hand reports an error, yet one
        // listens now; anything else is the spawn's error.
        if (rc != ok && spawned != ok) rc = fail(spawned, "%s", spawn_error.c_str());
        if (rc != ok && spawned == ok) rc = add_context(rc, "pool: the server reported ready, yet: ");
        note_start(lock.fd, server_pid, rc == ok ? "ready" : "failed", rc, server);
      }
      // The flock goes with the descriptor.
    }
    if (rc != ok) {
      if (rc == err_unavailable && !autostart) {
        return fail(err_unavailable, "pool: no pool server listens on %s; start vramswapd --device %d, or connect with autostart",
                    paths.socket.c_str(), device);
      }
      return rc;
    }
    VS_TRY(check_server_peer(c->fd_, paths.socket));
    VS_TRY(c->handshake());
    *out = std::move(c);
    return ok;
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "pool: out of host memory");
  }
}

int pool_connection::handshake() noexcept {
  using namespace pool_protocol;
  // Bounded: a server that stops answering is an error, not a hang.
  VS_TRY(set_timeouts(fd_, k_start_timeout_s));
  process_identity me{};
  VS_TRY(current_process(&me));
  hello h{};
  h.magic = k_magic;
  h.version = k_version;
  h.pid = me.pid;
  h.start_time = me.start_time;
  const int sent = send_fds(fd_, nullptr, 0, &h, sizeof h);
  const std::string send_error = sent == ok ? "" : last_error();

  // Read the welcome even when the hello could not be sent: a server refuses a peer it does
  // not allow (SO_PEERCRED) before reading anything, and closes.
  welcome w{};
  size_t len = 0;
  size_t nfds = 0;
  int fds[k_max_fds_per_message];
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
  member_ = w.member;
  server_pid_ = w.server_pid;
  frame_size_ = w.frame_size;
  raise_fd_limit(w.frame_count);
  frames_.reserve(w.frame_count);

  while (frames_.size() < w.frame_count) {
    frame_batch b{};
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
      ::close(fds[i]);  // imported or not, never kept
    }
    VS_TRY(rc);
  }
  if (w.host_slot_count > 0) VS_TRY(attach_host_pool(w.host_slot_count, w.host_pool_bytes));
  VS_TRY(pool_segment::open(w.segment_name, &segment_));
  // The segment at that name must be this server's: a frame table of another pool would
  // have this process write into frames that other processes own.
  if (segment_->header()->server_pid != static_cast<int32_t>(server_pid_)) {
    return fail(err_version_mismatch,
                "pool: the pool segment /dev/shm%s belongs to the pool server pid %d, not to pid %d that welcomed this "
                "process; the device's pool changed hands while connecting: connect again",
                w.segment_name, static_cast<int>(segment_->header()->server_pid), static_cast<int>(server_pid_));
  }
  if (segment_->frame_count() != frames_.size() || segment_->frame_size() != frame_size_ || member_ >= pool_layout::k_member_count) {
    return fail(err_version_mismatch, "pool: segment %s describes %u frames of %" PRIu64 " bytes, the server sent %zu of %" PRIu64,
                w.segment_name, segment_->frame_count(), segment_->frame_size(), frames_.size(), frame_size_);
  }
  if (segment_->host_slot_count() != host_slot_count_ || (host_slot_count_ > 0 && segment_->host_slot_size() != frame_size_)) {
    return fail(err_version_mismatch, "pool: segment %s describes %u host slots of %" PRIu64 " bytes, the server sent a host pool of %u",
                w.segment_name, segment_->host_slot_count(), segment_->host_slot_size(), host_slot_count_);
  }
  VS_TRY(set_timeouts(fd_, 0));
  note_pool_size_differs(be_, device_, frames_.size(), frame_size_, static_cast<int>(server_pid_));
  log(log_level::debug, "pool: member %u of %s: %zu frames of %" PRIu64 " bytes from server pid %d", member_, key_.c_str(),
      frames_.size(), frame_size_, static_cast<int>(server_pid_));
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
  segment_.reset();
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

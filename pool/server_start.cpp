#include "pool/server_start.hpp"

#include <signal.h>
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/file.h>
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
#include <vector>

#include "core/log.hpp"
#include "core/options.hpp"
#include "core/status.hpp"
#include "lock/ownership.hpp"
#include "lock/process_identity.hpp"
#include "lock/wait_bounds.hpp"

#include "core/code_location.hpp"
#include "core/fd_guard.hpp"
#include "core/unix_address.hpp"
#include "pool/pool_segment.hpp"
#include "pool/preload_shim.hpp"
#include "pool/start_record.hpp"

extern char** environ;

namespace vramswap::detail {

int dial_server(const std::string& path, int* fd_out, int patience_ms) noexcept {
  sockaddr_un addr{};
  socklen_t addr_len = 0;
  if (unix_address(path, /*allow_abstract=*/false, &addr, &addr_len) != ok) {
    const std::string why = last_error();
    return fail(err_invalid_argument, "pool: %s; use a shorter VRAMSWAP_RUNTIME_DIR", why.c_str());
  }
  // Non-blocking for the connect alone: a Unix socket's connect to a full queue of new
  // connections says EAGAIN at once, where a blocking one would sleep until the server
  // accepts, however long that takes.
  fd_guard fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (fd.fd < 0) return fail_errno(errno, "pool: socket(AF_UNIX, SOCK_SEQPACKET)");
  const uint64_t deadline = monotonic_ns() + uint64_t(std::max(patience_ms, 0)) * 1'000'000;
  int rc;
  for (;;) {
    rc = ::connect(fd.fd, reinterpret_cast<sockaddr*>(&addr), addr_len);
    if (rc == 0 || errno == EINTR) {
      if (rc == 0) break;
      continue;
    }
    if (errno != EAGAIN || monotonic_ns() >= deadline) break;
    const bool signalled = sleep_in_wait(10'000'000);
    if (const int stop = wait_may_go_on(signalled, ("the pool server listening on " + path + " to take a new connection").c_str());
        stop != ok) {
      return stop;
    }
  }
  if (rc != 0) {
    const int e = errno;
    if (e == ENOENT || e == ECONNREFUSED) return fail(err_unavailable, "pool: no pool server listens on %s", path.c_str());
    if (e == EAGAIN) {
      return fail(err_timeout,
                  "pool: the pool server listening on %s took no new connection for %.1f s (its queue of them is full): it is "
                  "stopped (SIGSTOP, a debugger), stuck (in a driver call: `vramswap status` and its /healthz say), or "
                  "swamped by connections; its log is beside that socket. Resume or restart it, then try again",
                  path.c_str(), patience_ms / 1e3);
    }
    return fail_errno(e, "pool: connect to %s", path.c_str());
  }
  const int flags = ::fcntl(fd.fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd.fd, F_SETFL, flags & ~O_NONBLOCK) != 0) return fail_errno(errno, "pool: fcntl(F_SETFL) on %s", path.c_str());
  *fd_out = fd.release();
  return ok;
}

namespace {

// A variable the service manager (systemd, podman --sdnotify) set for this process alone:
// its readiness socket, its watchdog, the sockets it passed.
bool for_the_service_manager_of_this_process(const char* entry) {
  for (const char* name : {"NOTIFY_SOCKET=", "WATCHDOG_PID=", "WATCHDOG_USEC=", "LISTEN_PID=", "LISTEN_FDS=", "LISTEN_FDNAMES="}) {
    if (std::strncmp(entry, name, std::strlen(name)) == 0) return true;
  }
  return false;
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

// The start lock file's record (pool/start_record.hpp) is advice for the waiters' error
// messages: a start goes on without it.
void note_start(int lock_fd, pid_t server_pid, const char* state, int status, const std::string& server) {
  if (!write_start_record(lock_fd, server_pid, state, status, server)) {
    log(log_level::debug, "pool: cannot record this start in the start lock file: %s", std::strerror(errno));
  }
}

// Wait for the start lock until `deadline`. Meanwhile keep trying the socket: the server that
// another client is starting listens before that client lets go of the lock. ok with *fd >= 0
// when connected, ok with *fd < 0 when the lock is ours and a start is up to us; err_timeout
// naming whoever holds it; the start's error when the client we waited for failed to start
// one (trying again at once, with what is left of our time, would only fail again).
int wait_for_start_lock(int lock_fd, const pool_paths& paths, const std::string& key, int device, uint64_t deadline,
                        uint64_t build_limit, int* fd) {
  *fd = -1;
  bool waited = false;
  for (;;) {
    if (::flock(lock_fd, LOCK_EX | LOCK_NB) == 0) break;
    if (errno != EWOULDBLOCK && errno != EINTR) return fail_errno(errno, "pool: flock %s", paths.start_lock.c_str());
    waited = true;
    const int rc = dial_server(paths.socket, fd);
    if (rc == ok) return ok;
    if (rc != err_unavailable) return rc;
    clear_error();
    const uint64_t now = monotonic_ns();
    // The server that the lock's holder started builds its pool: wait while it does (the
    // holder waits as long, spawn_server).
    if (now >= deadline && !(now < build_limit && pool_segment::starting(key, nullptr))) {
      start_record r;
      if (!read_start_record(lock_fd, &r)) {
        return fail(err_timeout,
                    "pool: no pool server for device %d became ready within %d s, and another process holds the start lock "
                    "%s without saying what it starts; find it (fuser -v %s), look at the server's log %s, or start "
                    "vramswapd --device %d --foreground yourself",
                    device, k_server_start_timeout_s, paths.start_lock.c_str(), paths.start_lock.c_str(),
                    paths.log.c_str(), device);
      }
      const std::string pid = r.server_pid > 0 ? " (pid " + std::to_string(r.server_pid) + ")" : " (its pid not known yet)";
      return fail(err_timeout,
                  "pool: no pool server for device %d became ready within %d s: client pid %d holds the start lock %s while "
                  "it starts the pool server %s%s; see the server's log %s. If that server hangs, stop it%s and fix what "
                  "its log says, or start vramswapd --device %d --foreground yourself",
                  device, k_server_start_timeout_s, r.client, paths.start_lock.c_str(), r.server.c_str(),
                  pid.c_str(), paths.log.c_str(), r.server_pid > 0 ? (" (kill " + std::to_string(r.server_pid) + ")").c_str() : "",
                  device);
    }
    const bool signalled = sleep_in_wait(10'000'000);
    if (const int stop = wait_may_go_on(signalled, ("another process to start the pool server of device " + std::to_string(device) +
                                                    " (it holds the start lock " + paths.start_lock + ")").c_str());
        stop != ok) {
      return stop;
    }
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

// A pipe for the server's ready report: *read_end ours, *write_end for the server.
int open_ready_pipe(fd_guard* read_end, fd_guard* write_end) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return fail_errno(errno, "pool: pipe2 for vramswapd's ready report");
  read_end->fd = pipe_fds[0];
  // The write end goes to the server as descriptor 3; keep the source away from 0..3 so
  // that posix_spawn's dup2 really happens (and clears close-on-exec).
  write_end->fd = ::fcntl(pipe_fds[1], F_DUPFD_CLOEXEC, 10);
  ::close(pipe_fds[1]);
  if (write_end->fd < 0) return fail_errno(errno, "pool: fcntl(F_DUPFD_CLOEXEC)");
  return ok;
}

// The server's environment: ours, plus every option set programmatically in this process
// (option_set), so that it serves the pool this process expects. Less what a service
// manager gave this process for itself: a server we start is not that manager's service,
// and told NOTIFY_SOCKET it would report to it as if it were (its main pid, its stop).
std::vector<std::string> server_environment() {
  std::vector<std::string> env_text;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (std::strncmp(*e, "VRAMSWAP_", 9) == 0) continue;
    if (for_the_service_manager_of_this_process(*e)) continue;
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
  return env_text;
}

// posix_spawn `server` for `device`, `write_end` as its descriptor 3 (closed here either
// way: only the server keeps it), in a session of its own; *pid: our child.
int spawn_detached(const std::string& server, int device, fd_guard* write_end, pid_t* pid) {
  std::vector<std::string> env_text = server_environment();
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
  posix_spawn_file_actions_adddup2(&actions, write_end->fd, 3);
  // Not in our working directory: it would keep that file system busy (a job's scratch
  // directory that its epilog unmounts) for as long as it serves.
  posix_spawn_file_actions_addchdir_np(&actions, "/");
  // Its own session: no terminal signals from ours. Default signal dispositions and mask.
  sigset_t none;
  sigset_t all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  const int spawn_rc = ::posix_spawn(pid, server.c_str(), &actions, &attr, const_cast<char**>(argv), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(write_end->release());
  if (spawn_rc != 0) return fail_errno(spawn_rc, "pool: cannot start the pool server %s", server.c_str());
  return ok;
}

// spawn_server's wait for the report of the server it started, and what it learns meanwhile.
// vramswapd forks once and its first process exits at once: reap it, so that the server
// is nobody's child (no zombie of ours when it exits, none of it dying with us). The
// second process reports "started <pid>" at once, then "ready <pid>" or "error <message>";
// EOF means it died. Every wait here ends by the deadline.
class ready_wait {
 public:
  ready_wait(const pool_paths& paths, const std::string& key, const std::string& server, int device, int lock_fd, pid_t child,
             int read_fd, uint64_t deadline, uint64_t build_limit, pid_t* server_pid_out)
      : paths_(paths), key_(key), server_(server), device_(device), lock_fd_(lock_fd), child_(child), read_fd_(read_fd),
        deadline_(deadline), build_limit_(build_limit), server_pid_out_(server_pid_out) {}

  // Read the report until its outcome, its EOF or the deadline (past it, while the server
  // builds its pool, up to the build limit). Not ok: the wait failed, or was given up
  // (*abandoned, the server left to start).
  int wait(bool* abandoned) {
    while (outcome_.empty() && !eof_) {
      if (!reaped_) {
        int wstatus = 0;
        const pid_t r = ::waitpid(child_, &wstatus, WNOHANG);
        reaped_ = r == child_ || (r < 0 && errno == ECHILD);
      }
      const uint64_t now = monotonic_ns();
      if (now >= deadline_ && !still_building(now)) break;
      // Poll the pipe; while our child lives, wake every 10 ms to reap it; while it builds, every 100 ms to look at it.
      const uint64_t until = now >= deadline_ ? now + 100'000'000 : deadline_;
      const int left_ms = static_cast<int>((until - now) / 1'000'000) + 1;
      pollfd p{read_fd_, POLLIN, 0};
      const int n = ::poll(&p, 1, wait_slice_ms(reaped_ ? left_ms : std::min(left_ms, 10)));
      if (n < 0 && errno != EINTR) return fail_errno(errno, "pool: poll on vramswapd's ready pipe");
      if (n <= 0) {
        // The caller gives up (Ctrl-C, its timeout): the server is left to start. It claims the
        // pool and serves whoever dials it next (the start lock passes on with our descriptor,
        // and its next holder waits for a server that builds); our reader of its report goes,
        // and it ignores SIGPIPE.
        const int stop = wait_may_go_on(n < 0, ("the pool server " + server_ + " of device " + std::to_string(device_) + " to start").c_str());
        if (stop != ok) return leave_to_start(stop, abandoned);
        continue;
      }
      char buf[512];
      const ssize_t got = ::read(read_fd_, buf, sizeof buf);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        eof_ = true;
        break;
      }
      report_.append(buf, static_cast<size_t>(got));
      take_lines();
    }
    return ok;
  }

  // What the wait ended with: the server ready (ok), or why not.
  int outcome() {
    if (outcome_.empty() && !eof_) return kill_unready();
    // Its first process exits right after its fork, long before any report: give it a moment
    // rather than leave a zombie, but never wait on a server that did not fork.
    if (!reaped_) reap_within(child_, 1000);
    if (outcome_.rfind("ready", 0) == 0) return ok;
    if (outcome_.rfind("error ", 0) == 0) {
      return fail(err_unavailable, "pool: the pool server %s could not start: %s", server_.c_str(), outcome_.c_str() + 6);
    }
    const std::string tail = tail_of(paths_.log, 600);
    return fail(err_unavailable, "pool: the pool server %s exited before it was ready; its log %s ends with: %s", server_.c_str(),
                paths_.log.c_str(), tail.empty() ? "(nothing)" : tail.c_str());
  }

 private:
  // Past the start timeout, a server that has claimed the pool and is alive building it
  // (pinning a large host pool, say) is waited for, up to the build limit.
  bool still_building(uint64_t now) {
    pool_segment::server_identity who;
    if (now >= build_limit_ || server_pid_ <= 0 || !pool_segment::starting(key_, &who) || who.pid != server_pid_) return false;
    if (!building_) {
      building_ = true;
      log(log_level::info, "pool: the pool server %s (pid %d) is still building its pool after %d s; waiting while it does "
          "(at most %d s)", server_.c_str(), static_cast<int>(server_pid_), k_server_start_timeout_s, k_server_build_limit_s);
    }
    return true;
  }

  // The report's complete lines: "started <pid>" names the detached server (recorded, a
  // pidfd opened on it); the first other line is the outcome.
  void take_lines() {
    for (size_t nl; outcome_.empty() && (nl = report_.find('\n')) != std::string::npos;) {
      const std::string line = report_.substr(0, nl);
      report_.erase(0, nl + 1);
      int started = 0;
      if (std::sscanf(line.c_str(), "started %d", &started) == 1 && started > 0) {
        server_pid_ = started;
        *server_pid_out_ = server_pid_;
        if (server_pidfd_.fd >= 0) ::close(server_pidfd_.fd);
        server_pidfd_.fd = open_pidfd(server_pid_);
        note_start(lock_fd_, server_pid_, "starting", ok, server_);
      } else {
        outcome_ = line;
      }
    }
  }

  // The wait was given up (`stop`): the server is left to start, its pid recorded when it
  // can be had.
  int leave_to_start(int stop, bool* abandoned) {
    const std::string why = last_error();
    // Its pid, for the record (the next starter waits for that server instead of
    // starting a second one): it says "started" right after its fork, long before it
    // opens the device.
    for (int waited_ms = 0; server_pid_ <= 0 && waited_ms < 200 && !eof_; waited_ms += 10) {
      pollfd q{read_fd_, POLLIN, 0};
      if (::poll(&q, 1, 10) <= 0) continue;
      char line[128];
      const ssize_t got = ::read(read_fd_, line, sizeof line - 1);
      if (got <= 0) {
        eof_ = got == 0;
        continue;
      }
      line[got] = '\0';
      report_.append(line);
      int started = 0;
      if (std::sscanf(report_.c_str(), "started %d", &started) == 1 && started > 0) server_pid_ = started;
    }
    if (!reaped_) reap_within(child_, 200);
    *abandoned = true;
    if (eof_ && server_pid_ <= 0) return fail(stop, "pool: %s; the server %s it started exited at once (its log: %s)", why.c_str(),
                                              server_.c_str(), paths_.log.c_str());
    // The detached server's pid; not yet known, the process started (a wrapper that has not
    // exec'd vramswapd yet): it becomes the server.
    note_start(lock_fd_, server_pid_ > 0 ? server_pid_ : child_, "left", ok, server_);
    return fail(stop, "pool: %s; the server %s (pid %d) was left to start, and serves later calls once ready (its log: %s)",
                why.c_str(), server_.c_str(), static_cast<int>(server_pid_ > 0 ? server_pid_ : child_), paths_.log.c_str());
  }

  // Not ready by the deadline: kill what we started, so that it neither lingers nor comes
  // up later behind the back of the clients that were told it failed.
  int kill_unready() {
    if (!reaped_) {
      ::kill(child_, SIGKILL);
      reaped_ = reap_within(child_, 2000);
    }
    if (server_pid_ > 0 && server_pid_ != child_) kill_through(server_pidfd_.fd, server_pid_);
    const pid_t named = server_pid_ > 0 ? server_pid_ : child_;
    const std::string tail = tail_of(paths_.log, 600);
    return fail(err_timeout,
                "pool: the pool server %s (pid %d) did not become ready within %d s%s, so it was killed%s; its log %s ends with: "
                "%s. Fix what the log says; a server that needs longer to build its pool can be started by hand "
                "(vramswapd --device %d --foreground)",
                server_.c_str(), static_cast<int>(named), building_ ? k_server_build_limit_s : k_server_start_timeout_s,
                building_ ? " (it was building its pool all that time)" : "",
                reaped_ ? "" : " (our child did not exit in 2 s of SIGKILL)", paths_.log.c_str(),
                tail.empty() ? "(nothing)" : tail.c_str(), device_);
  }

  const pool_paths& paths_;
  const std::string& key_;
  const std::string& server_;
  const int device_;
  const int lock_fd_;
  const pid_t child_;  // what posix_spawn started
  const int read_fd_;
  const uint64_t deadline_;
  const uint64_t build_limit_;
  pid_t* const server_pid_out_;
  bool reaped_ = false;
  pid_t server_pid_ = 0;  // the detached server, once it said "started"
  fd_guard server_pidfd_;
  std::string report_;    // what was read and not yet taken as a line
  std::string outcome_;   // the "ready ..." or "error ..." line
  bool eof_ = false;
  bool building_ = false;  // past the deadline, while our server builds its pool
};

// Spawn vramswapd for `device` and wait until it reports ready (or an error) on a pipe, at
// most until `deadline`; a server still not ready then is killed (and our child reaped), so
// that nothing is left behind and the start lock passes on. `lock_fd`: the start lock, ours.
// *server_out and *server_pid_out say what was started (for the start lock's record).
// *abandoned: this thread's wait bounds (lock/wait_bounds.hpp) ended the wait, and the
// server was left to start (not a failed start).
int spawn_server(const pool_paths& paths, const std::string& key, int device, int lock_fd, uint64_t deadline,
                 uint64_t build_limit, std::string* server_out, pid_t* server_pid_out, bool* abandoned) {
  *abandoned = false;
  std::string server;
  std::string tried;
  VS_TRY(find_server(&server, &tried));
  *server_out = server;
  if (monotonic_ns() >= deadline) {
    return fail(err_timeout,
                "pool: no pool server for device %d became ready within %d s (this process waited that long for another "
                "client's start, which failed; see the log %s)",
                device, k_server_start_timeout_s, paths.log.c_str());
  }
  note_start(lock_fd, 0, "starting", ok, server);

  fd_guard read_end;
  fd_guard write_end;
  VS_TRY(open_ready_pipe(&read_end, &write_end));
  pid_t pid = 0;
  VS_TRY(spawn_detached(server, device, &write_end, &pid));
  log(log_level::info, "pool: started the pool server %s for device %d (log: %s)", server.c_str(), device, paths.log.c_str());
  note_start(lock_fd, pid, "starting", ok, server);
  *server_pid_out = pid;

  ready_wait report(paths, key, server, device, lock_fd, pid, read_end.fd, deadline, build_limit, server_pid_out);
  VS_TRY(report.wait(abandoned));
  return report.outcome();
}

// Does `pid` name a live process of the server binary `server` (by its command name, which the
// kernel keeps to 15 characters)? A pid the start record names may be of another PID
// namespace, or reused: the name guards against taking another process for the server.
bool runs_server(pid_t pid, const std::string& server) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/comm", static_cast<int>(pid));
  fd_guard f(::open(path, O_RDONLY | O_CLOEXEC));
  char text[64];
  const ssize_t got = f.fd >= 0 ? ::read(f.fd, text, sizeof text) : -1;
  std::string comm = got > 0 ? std::string(text, static_cast<size_t>(got)) : "";
  while (!comm.empty() && comm.back() == '\n') comm.pop_back();
  const size_t slash = server.rfind('/');
  const std::string name = (slash == std::string::npos ? server : server.substr(slash + 1)).substr(0, 15);
  // The binary started, or vramswapd itself once a wrapper (VRAMSWAP_SERVER) exec'd it.
  return !comm.empty() && (comm == name || comm == "vramswapd");
}

// Was the file behind `fd` written within the last `seconds`? A start left long ago has ended,
// one way or the other, and its pid may name another process by now.
bool written_within(int fd, int seconds) {
  struct stat st {};
  timespec now {};
  if (::fstat(fd, &st) != 0 || ::clock_gettime(CLOCK_REALTIME, &now) != 0) return false;
  return now.tv_sec - st.st_mtim.tv_sec <= seconds;
}

// The start lock is ours, and its record says that the client before us left its server
// starting (its caller gave up: Ctrl-C, a timeout). Wait for that server, until `deadline`,
// rather than start a second one, which would only lose the race for the pool (and have the
// start recorded as failed for everyone waiting). err_unavailable when it is gone: start one.
int wait_for_left_server(const pool_paths& paths, const std::string& key, int device, const start_record& left,
                         uint64_t deadline, int* fd) {
  const std::string waiting_for = "the pool server " + left.server + " (pid " + std::to_string(left.server_pid) +
                                  ") that another client left starting for device " + std::to_string(device);
  for (;;) {
    const int rc = dial_server(paths.socket, fd);
    if (rc != err_unavailable) return rc;
    clear_error();
    if (pool_segment::starting(key, nullptr)) return wait_for_starting_server(paths, key, device, fd);
    if (!runs_server(left.server_pid, left.server) || monotonic_ns() >= deadline) {
      return fail(err_unavailable, "pool: %s: not there", waiting_for.c_str());
    }
    VS_TRY(wait_may_go_on(sleep_in_wait(20'000'000), waiting_for.c_str()));
  }
}

}  // namespace

int wait_for_starting_server(const pool_paths& paths, const std::string& key, int device, int* fd) noexcept {
  try {
    const uint64_t since = monotonic_ns();
    const uint64_t limit = since + uint64_t{k_server_build_limit_s} * 1'000'000'000;
    pool_segment::server_identity who;
    bool told = false;
    uint64_t listen_since = 0;  // when the pool was first seen built with nobody listening
    const std::string waiting_for = "the pool server of device " + std::to_string(device) + " to listen on " + paths.socket;
    for (;;) {
      pool_segment::server_identity now_who;
      const pool_segment::claim_state claim = pool_segment::claim_of(key, &now_who);
      // Dialled after the look: a server that initialized its segment in between listens by now.
      const int rc = dial_server(paths.socket, fd);
      if (rc != err_unavailable) {
        if (rc == ok && told) {
          log(log_level::info, "pool: the pool server pid %d of device %d serves now (waited %.1f s for it to build its pool)",
              static_cast<int>(who.pid), device, static_cast<double>(monotonic_ns() - since) / 1e9);
        }
        return rc;
      }
      if (claim != pool_segment::claim_state::starting) {
        // Built, by a live server that does not listen yet: it opens its socket just after
        // it initializes its segment (or closes it as it goes). Waited for, briefly.
        if (claim == pool_segment::claim_state::built) {
          clear_error();
          const uint64_t t = monotonic_ns();
          if (listen_since == 0) listen_since = t;
          if (t - listen_since < uint64_t{k_server_listen_grace_s} * 1'000'000'000) {
            VS_TRY(wait_may_go_on(sleep_in_wait(20'000'000), waiting_for.c_str()));
            continue;
          }
        }
        if (!told) return rc;  // nobody is starting: the caller starts one or says so
        return fail(err_unavailable,
                    "pool: the pool server pid %d of device %d, which this process waited for while it built its pool, ended "
                    "before it listened on %s; see its log %s",
                    static_cast<int>(who.pid), device, paths.socket.c_str(), paths.log.c_str());
      }
      clear_error();
      if (!told) {
        who = now_who;
        told = true;
        log(log_level::info, "pool: the pool server pid %d of device %d is starting (building its pool); waiting for it to listen on %s",
            static_cast<int>(who.pid), device, paths.socket.c_str());
      }
      if (monotonic_ns() >= limit) {
        return fail(err_timeout,
                    "pool: the pool server pid %d of device %d has been building its pool for %d s and does not listen on %s "
                    "yet; it is taken for hung: see its log %s, stop it (kill %d) and start vramswapd --device %d "
                    "--foreground to see why",
                    static_cast<int>(who.pid), device, k_server_build_limit_s, paths.socket.c_str(), paths.log.c_str(),
                    static_cast<int>(who.pid), device);
      }
      VS_TRY(wait_may_go_on(sleep_in_wait(20'000'000), waiting_for.c_str()));
    }
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "pool: out of host memory");
  }
}

int start_or_join_server(const pool_paths& paths, const std::string& key, int device, int* fd) noexcept {
  try {
    // One bound for all of a start: waiting for the start lock, the spawn, the ready report;
    // longer only while the server that was started is alive and building its pool.
    const uint64_t start = monotonic_ns();
    const uint64_t deadline = start + uint64_t{k_server_start_timeout_s} * 1'000'000'000;
    const uint64_t build_limit = start + uint64_t{k_server_build_limit_s} * 1'000'000'000;
    // One starter at a time: the others wait here and then find the server it started.
    fd_guard lock;
    VS_TRY(open_owned(paths.start_lock, O_RDWR | O_CREAT, "pool: the start lock", "or use another VRAMSWAP_RUNTIME_DIR", &lock.fd));
    VS_TRY(wait_for_start_lock(lock.fd, paths, key, device, deadline, build_limit, fd));
    int rc = *fd >= 0 ? ok : dial_server(paths.socket, fd);
    if (start_record left; rc == err_unavailable && read_start_record(lock.fd, &left) && left.state == "left" && left.server_pid > 0 &&
                           written_within(lock.fd, k_server_start_timeout_s)) {
      clear_error();
      rc = wait_for_left_server(paths, key, device, left, deadline, fd);
      if (rc == ok) note_start(lock.fd, left.server_pid, "ready", ok, left.server);
      if (rc != err_unavailable) return rc;
    }
    if (rc == err_unavailable) {
      std::string server;
      pid_t server_pid = 0;
      // A server started by hand (or of another runtime dir mounted here) that builds the
      // pool: wait for it rather than start a second one, which could only fail.
      const int waited = wait_for_starting_server(paths, key, device, fd);
      if (waited != err_unavailable) return waited;
      clear_error();
      bool abandoned = false;
      const int spawned = spawn_server(paths, key, device, lock.fd, deadline, build_limit, &server, &server_pid, &abandoned);
      // Left to start: the start lock's record says so ("left"), for the next starter.
      if (abandoned) return spawned;
      const std::string spawn_error = spawned == ok ? "" : last_error();
      rc = dial_server(paths.socket, fd);
      // A server that lost a race with one started by hand reports an error, yet one
      // listens now; anything else is the spawn's error.
      if (rc != ok && spawned != ok) rc = fail(spawned, "%s", spawn_error.c_str());
      if (rc != ok && spawned == ok) rc = add_context(rc, "pool: the server reported ready, yet: ");
      note_start(lock.fd, server_pid, rc == ok ? "ready" : "failed", rc, server);
    }
    return rc;  // the start lock's flock goes with its descriptor
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "pool: out of host memory");
  }
}

int find_server(std::string* path, std::string* tried) noexcept {
  try {
    std::vector<std::string> candidates;
    const std::string configured = option_text(option_id::server_path);
    if (!configured.empty()) {
      candidates.push_back(configured);
    } else {
      const std::string holder = object_holding(reinterpret_cast<const void*>(&find_server));
      if (!holder.empty()) {
        char resolved[PATH_MAX];
        const std::string lib = ::realpath(holder.c_str(), resolved) != nullptr ? resolved : holder;
        const std::string dir = directory_of(lib);
        candidates.push_back(dir + "/vramswapd");
        // Installed: the bin directory as this build installs it beside its library directory
        // (lib/x86_64-linux-gnu/../../bin under a multiarch prefix), then the usual places.
        candidates.push_back(dir + "/" VRAMSWAP_BINDIR_FROM_LIBDIR "/vramswapd");
        if (std::string(VRAMSWAP_BINDIR_FROM_LIBDIR) != "../bin") candidates.push_back(dir + "/../bin/vramswapd");
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

}  // namespace vramswap::detail

// vramswapd: the per-device pool server (server/pool_server.hpp; docs/pool_server.md).
//
//   vramswapd [--device N] [--foreground] [--service] [--idle-exit SECONDS] [--pool-size SIZE] [--host-pool SIZE]
//             [--metrics-port PORT] [--metrics-address ADDR]
//
// Two ways to run it:
//   on demand   (the default) a client starts it when none listens (pool/pool_connection.cpp).
//               It detaches: forks once (its first process exits at once, so the server is
//               nobody's child), logs to <runtime dir>/<key>.log, and exits after
//               VRAMSWAP_POOL_IDLE_EXIT seconds (default 60; 0 never) without a client.
//   --foreground for a service manager or a terminal: stays in the foreground, logs to
//               stderr, never exits for idleness unless --idle-exit is given.
// SIGTERM or SIGINT: stop accepting, close every connection, remove the socket, release every
// frame, exit 0. With no client attached the pool segment goes too; with clients attached (a
// service manager's restart, an upgrade) the pool is left for the next server, which adopts
// it, and the clients rejoin that one (docs/pool_server.md, "Restarts"). The handler is in
// place before the pool is built, so a container runtime's SIGTERM during a long build ends
// in the same clean exit right after it instead of killing the process half-way (which would
// leave the socket and segment for the next server to clean up). Exit 1 when the server cannot start (the reason is printed),
// 2 on a usage error.
//
// Under a service manager that set NOTIFY_SOCKET (systemd, Type=notify: deploy/systemd), the
// server says READY=1 once it serves and STOPPING=1 at SIGTERM (server/service_notify.hpp).
// Such a server, or one given --service (a Kubernetes DaemonSet's), is the node's service
// for its pool: while it is down, clients wait for it and never start a server of their own,
// which would run in a job's cgroup, die with the job, and keep the service from starting.
//
// The metrics endpoint (--metrics-port) also answers /healthz and /readyz for a container
// runtime's probes (server/metrics_endpoint.hpp); --metrics-address moves it off loopback so
// that a pod's kubelet and Prometheus can reach it. docs/deploy.md.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "core/log.hpp"
#include "core/options.hpp"
#include "core/status.hpp"
#include "pool/preload_shim.hpp"
#include "server/metrics_endpoint.hpp"
#include "server/pool_server.hpp"
#include "server/service_notify.hpp"
#include "vramswap/version.hpp"

namespace {

std::atomic<vramswap::detail::pool_server*> g_server{nullptr};
volatile sig_atomic_t g_stop_requested = 0;

void on_stop_signal(int) {
  g_stop_requested = 1;
  vramswap::detail::metrics_endpoint::note_stopping();
  if (vramswap::detail::pool_server* s = g_server.load()) s->request_stop();
}

void usage(FILE* out) {
  std::fprintf(out,
               "usage: vramswapd [--device N] [--foreground] [--service] [--idle-exit SECONDS] [--pool-size SIZE]\n"
               "                 [--host-pool SIZE]\n"
               "                 [--metrics-port PORT] [--metrics-address ADDR]\n"
               "\n"
               "The pool server of one device: creates the device's pool of frames and hands them to the\n"
               "vramswap processes of this user (or of VRAMSWAP_GROUP) over a Unix socket; repairs after a\n"
               "client dies (scrubs and frees its frames, passes on a lock it held).\n"
               "\n"
               "  --device N           the device to serve (default 0)\n"
               "  --foreground         stay in the foreground and log to stderr (service managers); no idle\n"
               "                       exit unless --idle-exit is given. Without it, the server detaches,\n"
               "                       logs to <runtime dir>/<device key>.log and exits after\n"
               "                       VRAMSWAP_POOL_IDLE_EXIT seconds without a client (how clients start it)\n"
               "  --service            the node's service for this pool (implied under NOTIFY_SOCKET: systemd):\n"
               "                       while it is down its clients wait for it to come back and never\n"
               "                       start a server of their own (one in a job's cgroup would die with\n"
               "                       the job and keep the service from starting); a DaemonSet's gives it\n"
               "  --idle-exit SECONDS  exit after SECONDS without a client (0: never)\n"
               "  --pool-size SIZE     pool size: bytes (K/M/G suffixes) or a percentage of the device's\n"
               "                       memory; default VRAMSWAP_POOL_SIZE, else free memory less a reserve\n"
               "  --host-pool SIZE     a pinned host pool for saved pages shared by the device's processes:\n"
               "                       bytes or a percentage of RAM (0: none, each process keeps its own\n"
               "                       host tier); default VRAMSWAP_HOST_POOL. docs/swap.md\n"
               "  --metrics-port PORT  serve Prometheus metrics at http://ADDR:PORT/metrics, and liveness\n"
               "                       (/healthz) and readiness (/readyz) for probes; 0: any free port,\n"
               "                       shown by `vramswap status`; default VRAMSWAP_METRICS_PORT, else\n"
               "                       no endpoint\n"
               "  --metrics-address ADDR\n"
               "                       the endpoint's IPv4 or IPv6 address (default 127.0.0.1, loopback\n"
               "                       only); 0.0.0.0 or the pod IP in a Kubernetes pod, for the kubelet\n"
               "                       and Prometheus. It serves counts and states, never memory\n"
               "                       contents. docs/deploy.md\n"
               "  --version            the version\n"
               "  --help               this text\n"
               "\n"
               "Environment: VRAMSWAP_RUNTIME_DIR (the shared files' directory; default /dev/shm/vramswap-<uid>),\n"
               "VRAMSWAP_FRAME_SIZE, VRAMSWAP_POOL_SIZE, VRAMSWAP_HOST_POOL, VRAMSWAP_POOL_IDLE_EXIT, VRAMSWAP_GROUP,\n"
               "VRAMSWAP_SHM_PREFIX, VRAMSWAP_BACKEND, VRAMSWAP_LOG, VRAMSWAP_METRICS_PORT. See docs/pool_server.md\n"
               "and docs/observability.md.\n");
}

bool parse_int(const char* text, long long min_value, long long* out) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || errno == ERANGE || v < min_value) return false;
  *out = v;
  return true;
}

// The report a client that started us waits for on --ready-fd: "started <pid>" once we have
// detached (so that it can kill us if we never get ready), then one last line, then close.
void report(int fd, const std::string& line, bool last = true) {
  if (fd < 0) return;
  const std::string text = line + "\n";
  [[maybe_unused]] const ssize_t n = ::write(fd, text.data(), text.size());
  if (last) ::close(fd);
}

// What the command line asks for.
struct command_line {
  vramswap::detail::pool_server_options options;
  bool foreground = false;
  bool service = false;
  bool idle_given = false;
  long long ready_fd = -1;
};

// Under the preload shim, our own driver calls would be taken for a program's, and the shim
// would open a session against this very server. True (said) when it is preloaded.
bool shim_preloaded(const vramswap::detail::foreign_environment& environment) {
  using namespace vramswap::detail;
  if (!environment.ld_preload || !preloads_shim(*environment.ld_preload)) return false;
  std::fprintf(stderr,
               "vramswapd: the preload shim %s is preloaded into the server (LD_PRELOAD=%s); it would take the "
               "server's own CUDA calls for a program's. Start vramswapd without it (env -u LD_PRELOAD vramswapd ...); "
               "clients that start it on demand leave the shim out themselves\n",
               k_preload_shim_name, environment.ld_preload->c_str());
  return true;
}

// Read argv into `cl`. Returns the exit status when that is all there is to do (--help,
// --version, a usage error), nothing when the server is to start.
std::optional<int> parse_arguments(int argc, char** argv, command_line* cl) {
  using namespace vramswap::detail;
  pool_server_options& options = cl->options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    long long v = 0;
    if (arg == "--help" || arg == "-h") {
      usage(stdout);
      return 0;
    } else if (arg == "--version") {
      std::printf("vramswapd %d.%d.%d\n", VRAMSWAP_VERSION_MAJOR, VRAMSWAP_VERSION_MINOR, VRAMSWAP_VERSION_PATCH);
      return 0;
    } else if (arg == "--foreground") {
      cl->foreground = true;
    } else if (arg == "--service") {
      cl->service = true;
    } else if (arg == "--device" && value != nullptr && parse_int(value, 0, &v) && v < 1 << 20) {
      options.device = static_cast<int>(v);
      ++i;
    } else if (arg == "--idle-exit" && value != nullptr && parse_int(value, 0, &v)) {
      options.idle_exit_s = v;
      cl->idle_given = true;
      ++i;
    } else if (arg == "--pool-size" && value != nullptr && *value != '\0') {
      options.pool_size = value;
      ++i;
    } else if (arg == "--host-pool" && value != nullptr && *value != '\0') {
      options.host_pool = value;
      ++i;
    } else if (arg == "--metrics-port" && value != nullptr && parse_int(value, 0, &v) && v <= 65535) {
      options.metrics_port = value;
      ++i;
    } else if (arg == "--metrics-address" && value != nullptr) {
      if (metrics_endpoint::set_address(value, "--metrics-address") != ok) {
        std::fprintf(stderr, "%s\n", last_error());
        return 2;
      }
      ++i;
    } else if (arg == "--ready-fd" && value != nullptr && parse_int(value, 0, &v) && v < 1 << 20) {
      cl->ready_fd = v;  // internal: how a client that starts us learns that we are ready
      ++i;
    } else {
      std::fprintf(stderr, "vramswapd: bad argument \"%s\"%s\n\n", arg.c_str(),
                   value == nullptr && arg.rfind("--", 0) == 0 ? " (missing value?)" : "");
      usage(stderr);
      return 2;
    }
  }
  return std::nullopt;
}

// The settings (VRAMSWAP_*), and the idle exit of a server started on demand. False (said,
// and reported to the client that started us) when one is bad.
bool read_settings(command_line* cl) {
  using namespace vramswap::detail;
  if (validate_options() != ok) {
    std::fprintf(stderr, "vramswapd: %s\n", last_error());
    report(static_cast<int>(cl->ready_fd), std::string("error ") + last_error());
    return false;
  }
  if (!cl->foreground && !cl->idle_given) {
    uint64_t seconds = 0;
    if (option_uint(option_id::pool_idle_exit, &seconds) != ok) {
      std::fprintf(stderr, "vramswapd: %s\n", last_error());
      report(static_cast<int>(cl->ready_fd), std::string("error ") + last_error());
      return false;
    }
    cl->options.idle_exit_s = static_cast<int64_t>(seconds);
  }
  return true;
}

// Detach: the first process exits at once (a client that spawned us reaps it), the second
// serves, in a session of its own. Before any backend exists: CUDA forbids fork. False (said)
// when fork fails.
bool detach(command_line* cl) {
  const pid_t pid = ::fork();
  if (pid < 0) {
    std::fprintf(stderr, "vramswapd: fork: %s\n", std::strerror(errno));
    return false;
  }
  if (pid > 0) _exit(0);
  ::setsid();
  report(static_cast<int>(cl->ready_fd), "started " + std::to_string(::getpid()), false);
  cl->options.log_to_file = true;
  return true;
}

void install_signal_handlers(bool foreground) {
  ::signal(SIGHUP, foreground ? SIG_DFL : SIG_IGN);
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
}

// A server started on demand inherits its starter's descriptor limit, often a shell's
// 1024: too few for a pool taken over from its members (a descriptor per frame, twice, and
// per client). Raise the soft limit to the hard one, as daemons do. Returns what to log once
// logging is up ("" when the limit was the hard one already).
std::string raise_descriptor_limit() {
  std::string raised;
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != lim.rlim_max) {
    const rlim_t was = lim.rlim_cur;
    lim.rlim_cur = lim.rlim_max;
    auto text = [](rlim_t v) { return v == RLIM_INFINITY ? std::string("unlimited") : std::to_string(static_cast<unsigned long long>(v)); };
    raised = ::setrlimit(RLIMIT_NOFILE, &lim) == 0
                 ? "vramswapd: raised the descriptor limit (RLIMIT_NOFILE) from " + text(was) + " to the hard limit " + text(lim.rlim_max)
                 : "vramswapd: could not raise the descriptor limit (RLIMIT_NOFILE) from " + text(was) + " to the hard limit " +
                       text(lim.rlim_max) + ": " + std::strerror(errno) + "; raise it where the server starts (ulimit -n, LimitNOFILE=)";
  }
  return raised;
}

// Start the server, serve until told to stop, and take it down. Returns the exit status.
int serve(const command_line& cl, const vramswap::detail::foreign_environment& environment, const std::string& raised) {
  using namespace vramswap::detail;
  std::unique_ptr<pool_server> server;
  if (pool_server::start(cl.options, &server) != ok) {
    std::string why = last_error();
    if (why.rfind("vramswapd: ", 0) == 0) why.erase(0, 11);
    std::fprintf(stderr, "vramswapd: cannot start: %s\n", why.c_str());
    report(static_cast<int>(cl.ready_fd), "error " + why);
    return 1;
  }
  if (!raised.empty()) log(log_level::info, "%s", raised.c_str());
  g_server.store(server.get());
  // A signal during the build found no server to stop: stop now, before serving anyone.
  if (g_stop_requested != 0) server->request_stop();
  report(static_cast<int>(cl.ready_fd), "ready " + std::to_string(::getpid()));
  notify_service_manager(environment.notify_socket,
                         "READY=1\nMAINPID=" + std::to_string(::getpid()) + "\nSTATUS=serving device " + std::to_string(cl.options.device));

  const int rc = server->run();
  // Told here, not in the signal handler (building the message is not async-signal-safe):
  // the loop has stopped, the connections and the pool go next.
  notify_service_manager(environment.notify_socket, "STOPPING=1\nSTATUS=stopping: releasing the pool");
  if (rc != ok) log(log_level::error, "vramswapd: %s", last_error());
  g_server.store(nullptr);
  const bool left = server->pool_in_use();  // then its teardown leaves the pool (and says so)
  server.reset();
  log(log_level::info, "vramswapd: stopped; %s", left ? "pool left for the next server" : "pool released");
  return rc == ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace vramswap::detail;
  // The server's log is a file of its own (or a service manager's journal): it says what it
  // does at info unless VRAMSWAP_LOG says otherwise, where the library's clients say warn.
  log_set_default_level(log_level::info);
  // Before any report on --ready-fd: a client that started this server may have stopped
  // waiting for it (Ctrl-C, its timeout) and closed that pipe; the server starts all the same.
  // And a client that goes away mid-message must not end the server.
  ::signal(SIGPIPE, SIG_IGN);
  // The variables of the process's environment that are not settings (LD_PRELOAD,
  // NOTIFY_SOCKET), read once: the server's own facts from here on.
  const foreign_environment environment = process_foreign_environment();
  if (shim_preloaded(environment)) return 2;  // before anything else
  command_line cl;
  if (const std::optional<int> done = parse_arguments(argc, argv, &cl)) return *done;
  if (!read_settings(&cl)) return 1;
  if (!cl.foreground && !detach(&cl)) return 1;
  // The node's service (under a service manager, or said so): its clients wait for it to come
  // back instead of starting a server of their own.
  cl.options.managed = cl.service || !environment.notify_socket.empty();
  install_signal_handlers(cl.foreground);
  const std::string raised = raise_descriptor_limit();
  return serve(cl, environment, raised);
}

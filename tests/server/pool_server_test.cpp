// Description: the pool server (vramswapd) and its clients as real processes on the host
// backend: zeroed, shared frames; 8 clients autostarting at once get exactly one server; a
// client killed with SIGKILL has its frames scrubbed and freed and its member slot freed; a
// killed lock holder's lock passes on; idle exit; a killed server is noticed and replaced;
// a second server refuses; a bad hello gets an error welcome; an in-process server gives
// all device memory back when it stops.
//
// Each test has its own VRAMSWAP_RUNTIME_DIR and VRAMSWAP_SHM_PREFIX, a 256 MiB emulated
// device and 2 MiB frames (127 frames in the pool). The test process is a child subreaper,
// so servers that clients start (and that detach) are reaped here.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/backend.hpp"
#include "core/fd_transfer.hpp"
#include "core/options.hpp"
#include "core/status.hpp"
#include "lock/device_lock.hpp"
#include "pool/pool_connection.hpp"
#include "pool/pool_protocol.hpp"
#include "cli/status_view.hpp"
#include "pool/pool_report.hpp"
#include "pool/pool_segment.hpp"
#include "pool/server_start.hpp"
#include "lock/process_identity.hpp"
#include "support/loopback.hpp"
#include "support/open_descriptors.hpp"
#include "support/own_children.hpp"
#include "lock/runtime_dir.hpp"
#include "lock/shared_segment.hpp"
#include "server/pool_server.hpp"
#include "server/socket_holders.hpp"
#include "support/test_env.hpp"

extern char** environ;

namespace vramswap::detail {
namespace {

using namespace std::chrono_literals;
constexpr uint32_t k_frames = 127;  // 256 MiB / 2 MiB, less one frame of reserve

struct proc {
  pid_t pid = -1;
  int in = -1;   // its stdin (write end)
  int out = -1;  // its stdout (read end)
};

// Start `argv` with pipes on stdin and stdout; stderr stays ours (shown when a test fails),
// or goes to `err_file`.
proc spawn(const std::vector<std::string>& args, const std::string& err_file = "") {
  int in_pipe[2];
  int out_pipe[2];
  if (::pipe2(in_pipe, O_CLOEXEC) != 0 || ::pipe2(out_pipe, O_CLOEXEC) != 0) std::abort();
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in_pipe[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out_pipe[1], 1);
  if (!err_file.empty()) posix_spawn_file_actions_addopen(&fa, 2, err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  proc p;
  const int rc = ::posix_spawn(&p.pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(in_pipe[0]);
  ::close(out_pipe[1]);
  if (rc != 0) {
    ADD_FAILURE() << "posix_spawn " << args[0] << ": " << std::strerror(rc);
    ::close(in_pipe[1]);
    ::close(out_pipe[0]);
    return proc{};
  }
  p.in = in_pipe[1];
  p.out = out_pipe[0];
  return p;
}

// One line of `p`'s stdout ("" on EOF or after `timeout`).
std::string read_line(const proc& p, std::chrono::milliseconds timeout = 20s) {
  std::string line;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return "";
    pollfd pfd{p.out, POLLIN, 0};
    if (::poll(&pfd, 1, static_cast<int>(left.count())) <= 0) continue;
    char c;
    if (::read(p.out, &c, 1) != 1) return "";
    if (c == '\n') return line;
    line += c;
  }
}

// Exit status of a child (128 + signal when killed); -1 when it did not end in `timeout`.
int reap(pid_t pid, std::chrono::milliseconds timeout = 20s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
    if (r < 0) return -1;
    if (std::chrono::steady_clock::now() > deadline) return -1;
    std::this_thread::sleep_for(2ms);
  }
}

bool eventually(const std::function<bool()>& predicate, std::chrono::milliseconds timeout = 10s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (predicate()) return true;
    std::this_thread::sleep_for(2ms);
  }
  return predicate();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

size_t count_of(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// A new file at `path` owned by uid and gid 65534 (nobody), mode 0600: another user's
// (needs root).
void give_to_nobody(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0) << path << ": " << std::strerror(errno);
  ASSERT_EQ(::fchown(fd, 65534, 65534), 0);
  ASSERT_EQ(::fchmod(fd, 0600), 0);
  ::close(fd);
}

// A pool server on the host backend is refused with err_not_owner; *said: why.
void start_refused(std::string* said) {
  std::unique_ptr<backend> be;
  ASSERT_EQ(make_backend(backend_kind::host, &be), ok);
  pool_server_options o;
  o.be = be.get();
  std::unique_ptr<pool_server> server;
  clear_error();
  EXPECT_EQ(pool_server::start(o, &server), err_not_owner);
  *said = last_error();
}

class PoolServer : public ::testing::Test {
 protected:
  void SetUp() override {
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    const char* log = std::getenv("VRAMSWAP_LOG");
    saved_log_ = log != nullptr ? log : "";
    static int counter = 0;
    const std::string tag = std::to_string(::getpid()) + "-" + std::to_string(counter++);
    dir_ = "/tmp/vramswap-srvtest-" + tag;
    prefix_ = "vssrv-" + tag + "-";
    vramswap::detail::test::set_env("VRAMSWAP_RUNTIME_DIR", dir_.c_str());
    vramswap::detail::test::set_env("VRAMSWAP_SHM_PREFIX", prefix_.c_str());
    vramswap::detail::test::set_env("VRAMSWAP_BACKEND", "host");
    vramswap::detail::test::set_env("VRAMSWAP_HOST_DEVICE_MEMORY", "256MiB");
    vramswap::detail::test::set_env("VRAMSWAP_FRAME_SIZE", "2MiB");
    vramswap::detail::test::set_env("VRAMSWAP_POOL_IDLE_EXIT", "0");
    vramswap::detail::test::set_env("VRAMSWAP_SERVER", VRAMSWAP_SERVER_BINARY);
    vramswap::detail::test::unset_env("VRAMSWAP_POOL_SIZE");
    vramswap::detail::test::unset_env("VRAMSWAP_GROUP");
  }

  void TearDown() override {
    if (saved_log_.empty()) {
      vramswap::detail::test::unset_env("VRAMSWAP_LOG");
    } else {
      vramswap::detail::test::set_env("VRAMSWAP_LOG", saved_log_.c_str());
    }
    for (proc& p : procs_) {
      if (p.pid > 0) ::kill(p.pid, SIGKILL);
      if (p.in >= 0) ::close(p.in);
      if (p.out >= 0) ::close(p.out);
    }
    for (proc& p : procs_) {
      if (p.pid > 0) reap(p.pid, 5s);
    }
    for (pid_t s : servers_) {
      ::kill(s, SIGTERM);
      ::kill(s, SIGCONT);  // one a test stopped (SIGSTOP) and did not resume
    }
    for (pid_t s : servers_) {
      if (reap(s, 10s) < 0) ::kill(s, SIGKILL);
    }
    // Everything else we started or adopted (detached servers), stopped: a test that
    // ended at a failed assertion, or whose client started a server, leaves no server behind.
    const std::string left = vramswap::detail::test::stop_own_children();
    if (!left.empty()) std::fprintf(stderr, "TearDown stopped what the test left running:\n%s", left.c_str());
    pool_segment::remove("host-0");
    device_lock::remove("host-0");
    if (std::system(("rm -rf " + dir_).c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", dir_.c_str());
    for (const char* v : {"VRAMSWAP_RUNTIME_DIR", "VRAMSWAP_SHM_PREFIX", "VRAMSWAP_SERVER", "VRAMSWAP_POOL_IDLE_EXIT", "VRAMSWAP_HOST_POOL"}) vramswap::detail::test::unset_env(v);
  }

  // A client running `steps`, remembered for TearDown; its stderr to `err_file` when given.
  proc& client(std::vector<std::string> steps, const std::string& err_file = "") {
    steps.insert(steps.begin(), VRAMSWAP_POOL_CLIENT);
    procs_.push_back(spawn(steps, err_file));
    return procs_.back();
  }
  // Run a client to its end; its exit status.
  int run_client(std::vector<std::string> steps) {
    proc& p = client(std::move(steps));
    const int rc = reap(p.pid);
    p.pid = -1;
    return rc;
  }
  // A foreground server; returns its pid once it reported ready (-1 if it never did).
  pid_t start_server(std::vector<std::string> extra = {}, const std::string& err_file = "") {
    std::vector<std::string> args = {VRAMSWAP_SERVER_BINARY, "--foreground", "--ready-fd", "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    proc p = spawn(args, err_file);
    const std::string line = read_line(p);
    ::close(p.in);
    ::close(p.out);
    if (line.rfind("ready ", 0) != 0) {
      ADD_FAILURE() << "vramswapd did not report ready: \"" << line << "\"";
      if (p.pid > 0) {  // never kill(-1): a failed spawn has no pid
        ::kill(p.pid, SIGKILL);
        reap(p.pid);
      }
      return -1;
    }
    servers_.push_back(p.pid);
    return p.pid;
  }
  int stop_server(pid_t pid) {
    ::kill(pid, SIGTERM);
    const int rc = reap(pid);
    servers_.erase(std::remove(servers_.begin(), servers_.end(), pid), servers_.end());
    return rc;
  }
  // A connection to the server's socket, as a client's before its hello (-1 on failure).
  int connect_to_server() const {
    const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s/%shost-0.sock", dir_.c_str(), prefix_.c_str());
    if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return fd;
    if (fd >= 0) ::close(fd);
    return -1;
  }
  std::unique_ptr<pool_segment> open_segment() {
    std::string name;
    std::unique_ptr<pool_segment> seg;
    EXPECT_EQ(pool_segment::name_for("host-0", &name), ok);
    EXPECT_EQ(pool_segment::open(name, &seg), ok) << last_error();
    return seg;
  }
  // "ready <member> <frames> <server pid>" -> its fields.
  static std::vector<long> fields(const std::string& ready_line) {
    std::istringstream in(ready_line);
    std::string word;
    std::vector<long> v;
    in >> word;
    long x;
    while (in >> x) v.push_back(x);
    return v;
  }

  std::string dir_;
  std::string prefix_;
  std::string saved_log_;
  std::deque<proc> procs_;  // a deque: references stay valid as it grows
  std::vector<pid_t> servers_;
};

TEST_F(PoolServer, ServesZeroedFramesSharedBetweenClients) {
  const pid_t server = start_server();
  ASSERT_GT(server, 0);
  struct stat st {};
  ASSERT_EQ(::stat((dir_ + "/" + prefix_ + "host-0.sock").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat(dir_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);

  proc& a = client({"connect-noauto", "zero", "0", std::to_string(k_frames), "write", "5", "42", "write", "126", "7", "ready", "hold"});
  const std::vector<long> f = fields(read_line(a));
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f[1], static_cast<long>(k_frames));
  EXPECT_EQ(f[2], server);
  // A second process sees A's bytes through its own import of the same pool frames.
  EXPECT_EQ(run_client({"connect-noauto", "check", "5", "42", "check", "126", "7", "zero", "0", "5"}), 0);

  // With no client left, a stop removes everything (with one, it leaves the pool: restart_test).
  ::close(a.in);
  a.in = -1;
  EXPECT_EQ(reap(a.pid), 0);
  a.pid = -1;
  EXPECT_EQ(stop_server(server), 0);
  EXPECT_NE(::access((dir_ + "/" + prefix_ + "host-0.sock").c_str(), F_OK), 0) << "socket left behind";
  std::string name;
  ASSERT_EQ(pool_segment::name_for("host-0", &name), ok);
  EXPECT_NE(::access((dir_ + name).c_str(), F_OK), 0) << "pool segment left behind";
  // The lock segment goes with its last user, the server (nobody else opened it here).
  ASSERT_EQ(shared_segment::name_for("host-0", &name), ok);
  EXPECT_NE(::access((dir_ + name).c_str(), F_OK), 0) << "lock segment left behind";
}

TEST_F(PoolServer, EightClientsStartingAtOnceGetExactlyOneServer) {
  // No VRAMSWAP_SERVER: clients find vramswapd next to the binary holding vramswap's code
  // (dladdr), here the link beside pool_client (tests/server/CMakeLists.txt).
  vramswap::detail::test::unset_env("VRAMSWAP_SERVER");
  vramswap::detail::test::set_env("VRAMSWAP_POOL_IDLE_EXIT", "1");
  vramswap::detail::test::set_env("VRAMSWAP_LOG", "info");  // the server's log is checked below
  std::vector<proc*> clients;
  for (int i = 0; i < 8; ++i) clients.push_back(&client({"connect", "zero", "0", "2", "ready", "hold"}));
  std::set<long> servers;
  std::set<long> members;
  for (proc* c : clients) {
    const std::vector<long> f = fields(read_line(*c, 60s));
    ASSERT_EQ(f.size(), 3u) << "a client did not connect";
    members.insert(f[0]);
    servers.insert(f[2]);
  }
  EXPECT_EQ(servers.size(), 1u);
  EXPECT_EQ(members.size(), 8u);
  const std::string log = read_file(dir_ + "/" + prefix_ + "host-0.log");
  EXPECT_EQ(count_of(log, "vramswapd: serving device"), 1u) << log;
  EXPECT_EQ(count_of(log, "cannot start"), 0u) << log;
  // All leave; the server (adopted by this subreaper) exits idle, with status 0.
  for (proc* c : clients) ::close(c->in), c->in = -1;
  for (proc* c : clients) EXPECT_EQ(reap(c->pid), 0), c->pid = -1;
  EXPECT_EQ(reap(static_cast<pid_t>(*servers.begin()), 20s), 0);
}

TEST_F(PoolServer, TwoPrefixesInOneRuntimeDirAreTwoPools) {
  // The prefix names the server's files as it names the segments: a client under another
  // prefix starts its own server with its own size, and never joins the first one's pool.
  vramswap::detail::test::unset_env("VRAMSWAP_SERVER");
  vramswap::detail::test::set_env("VRAMSWAP_POOL_IDLE_EXIT", "1");
  vramswap::detail::test::set_env("VRAMSWAP_POOL_SIZE", "64MiB");
  proc& a = client({"connect", "ready", "hold"});
  const std::vector<long> fa = fields(read_line(a, 60s));
  ASSERT_EQ(fa.size(), 3u);
  EXPECT_EQ(fa[1], 32);

  const std::string other = prefix_ + "b-";
  vramswap::detail::test::set_env("VRAMSWAP_SHM_PREFIX", other.c_str());
  vramswap::detail::test::set_env("VRAMSWAP_POOL_SIZE", "32MiB");
  proc& b = client({"connect", "ready", "hold"});
  const std::vector<long> fb = fields(read_line(b, 60s));
  vramswap::detail::test::set_env("VRAMSWAP_SHM_PREFIX", prefix_.c_str());
  ASSERT_EQ(fb.size(), 3u);
  EXPECT_EQ(fb[1], 16);
  EXPECT_NE(fb[2], fa[2]) << "the second prefix joined the first prefix's server";
  struct stat st {};
  EXPECT_EQ(::stat((dir_ + "/" + prefix_ + "host-0.sock").c_str(), &st), 0);
  EXPECT_EQ(::stat((dir_ + "/" + other + "host-0.sock").c_str(), &st), 0);

  // Both leave; both servers exit idle, each removing its own segment.
  for (proc* c : {&a, &b}) ::close(c->in), c->in = -1;
  for (proc* c : {&a, &b}) EXPECT_EQ(reap(c->pid), 0), c->pid = -1;
  EXPECT_EQ(reap(static_cast<pid_t>(fa[2]), 20s), 0);
  EXPECT_EQ(reap(static_cast<pid_t>(fb[2]), 20s), 0);
  vramswap::detail::test::set_env("VRAMSWAP_SHM_PREFIX", other.c_str());
  std::string other_name;
  ASSERT_EQ(pool_segment::name_for("host-0", &other_name), ok);
  vramswap::detail::test::set_env("VRAMSWAP_SHM_PREFIX", prefix_.c_str());
  EXPECT_NE(::access((dir_ + other_name).c_str(), F_OK), 0) << "segment left behind";
}

TEST_F(PoolServer, ClientAskingForAnotherSizeIsToldTheRunningPoolsSize) {
  vramswap::detail::test::set_env("VRAMSWAP_POOL_SIZE", "64MiB");
  const pid_t server = start_server();
  ASSERT_GT(server, 0);
  std::unique_ptr<backend> be;
  ASSERT_EQ(make_backend(backend_kind::host, &be), ok);
  vramswap::detail::test::set_env("VRAMSWAP_POOL_SIZE", "32MiB");
  std::unique_ptr<pool_connection> c;
  ::testing::internal::CaptureStderr();  // the log writes to fd 2; its level is at least warn
  const int rc = pool_connection::connect(*be, 0, false, &c);
  const std::string said = ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(rc, ok) << last_error();
  EXPECT_EQ(c->frame_count(), 32u) << "the running pool's size, not the client's";
  EXPECT_NE(said.find("VRAMSWAP_POOL_SIZE=32MiB asks for 32 MiB, but the pool server of host-0 already running (pid " +
                      std::to_string(server) + ") has 64 MiB"),
            std::string::npos)
      << said;
  c.reset();

  // Asking for what runs says nothing.
  vramswap::detail::test::set_env("VRAMSWAP_POOL_SIZE", "64MiB");
  ::testing::internal::CaptureStderr();
  ASSERT_EQ(pool_connection::connect(*be, 0, false, &c), ok) << last_error();
  EXPECT_EQ(::testing::internal::GetCapturedStderr().find("VRAMSWAP_POOL_SIZE"), std::string::npos);
}

TEST_F(PoolServer, KilledClientsFramesAreScrubbedAndFreed) {
  ASSERT_GT(start_server(), 0);
  proc& a = client({"connect-noauto", "own", "3", "write", "3", "11", "own", "4", "write", "4", "12", "own", "9", "write",
                    "9", "13", "ready", "hold"});
  const std::vector<long> f = fields(read_line(a));
  ASSERT_EQ(f.size(), 3u);
  const auto member = static_cast<uint32_t>(f[0]);
  auto seg = open_segment();
  ASSERT_TRUE(seg);
  EXPECT_EQ(seg->count(pool_layout::frame_active, member), 3u);
  EXPECT_EQ(seg->member(member).state.load(), pool_layout::member_live);
  // A bystander sees A's data while A lives (the frames are shared, not copied).
  EXPECT_EQ(run_client({"connect-noauto", "check", "4", "12"}), 0);

  ::kill(a.pid, SIGKILL);
  EXPECT_EQ(reap(a.pid), 128 + SIGKILL);
  a.pid = -1;
  EXPECT_TRUE(eventually([&] { return seg->count(pool_layout::frame_free) == k_frames; })) << "frames were not freed";
  EXPECT_TRUE(eventually([&] { return seg->member(member).state.load() == pool_layout::member_free; }));
  EXPECT_EQ(run_client({"connect-noauto", "zero", "0", std::to_string(k_frames)}), 0) << "a freed frame kept data";
}

// A member killed while a process it forked without exec lives on (a DataLoader worker, a
// multiprocessing pool) leaves its connection open in that child, and with it its GPU
// context: its frames stay its own until the child exits, and the server says so at once,
// naming the child. Then they are scrubbed and freed.
TEST_F(PoolServer, AMemberWhoseForkedChildOutlivesItIsNamedAndRepairedWhenTheChildEnds) {
  const std::string log = dir_ + "-server.log";
  vramswap::detail::test::set_env("VRAMSWAP_LOG", "info");  // for the repair's line (TearDown restores it)
  ASSERT_GT(start_server({}, log), 0);
  proc& a = client({"connect-noauto", "own", "3", "write", "3", "21", "own", "5", "write", "5", "22", "fork-child", "ready", "hold"});
  const std::string forked = read_line(a);
  ASSERT_EQ(forked.rfind("forked ", 0), 0u) << forked;
  const pid_t child = static_cast<pid_t>(std::stol(forked.substr(7)));
  const std::vector<long> f = fields(read_line(a));
  ASSERT_EQ(f.size(), 3u);
  const auto member = static_cast<uint32_t>(f[0]);
  auto seg = open_segment();
  ASSERT_TRUE(seg);

  ::kill(a.pid, SIGKILL);
  EXPECT_EQ(reap(a.pid), 128 + SIGKILL);
  const pid_t parent = a.pid;
  a.pid = -1;
  // Where the kernel has no Unix socket diagnostics the holders cannot be named, and the
  // warning says why instead.
  const bool diagnostics = [] {
    int pair[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) return false;
    uint64_t peer = 0;
    std::string why;
    const bool found = peer_socket_inode(pair[0], &peer, &why);
    ::close(pair[0]);
    ::close(pair[1]);
    return found;
  }();
  const std::string told = "member " + std::to_string(member) + " (pid " + std::to_string(parent) +
                           ") has exited, but its connection to this server is still held by " +
                           (diagnostics ? "pid " + std::to_string(child) + " (pool_client)" : "processes this server cannot name (");
  ASSERT_TRUE(eventually([&] { return read_file(log).find(told) != std::string::npos; }, 10s)) << read_file(log);
  const std::string said = read_file(log);
  EXPECT_NE(said.find("its 2 frames stay out of the pool until they exit; stop them" +
                      (diagnostics ? " (kill " + std::to_string(child) + ")" : std::string(","))),
            std::string::npos) << said;
  EXPECT_EQ(count_of(said, "has exited, but its connection"), 1u) << "said once: " << said;
  // Kept while the child lives: it holds the dead member's GPU context.
  std::this_thread::sleep_for(1s);
  EXPECT_EQ(seg->count(pool_layout::frame_active, member), 2u);
  EXPECT_EQ(seg->member(member).state.load(), pool_layout::member_live);
  // `vramswap status` counts it as exited, with its frames, and says what keeps them.
  device_report report;
  ASSERT_EQ(collect_report("host-0", &report), ok) << last_error();
  const std::string text = render_text({report});
  EXPECT_NE(text.find("1 exited process left in the pool's table, owning 2 frames: the daemon frees what they held once no "
                      "process holds their GPU context"),
            std::string::npos) << text;

  ::kill(child, SIGKILL);
  EXPECT_TRUE(eventually([&] {
    ::waitpid(child, nullptr, WNOHANG);  // ours to reap: this test is a subreaper
    return seg->count(pool_layout::frame_free) == k_frames;
  })) << "the frames were not freed after the child ended";
  EXPECT_TRUE(eventually([&] { return seg->member(member).state.load() == pool_layout::member_free; }));
  EXPECT_TRUE(eventually([&] { return read_file(log).find("processes it forked held its connection until then") != std::string::npos; }))
      << read_file(log);
  EXPECT_EQ(run_client({"connect-noauto", "zero", "0", std::to_string(k_frames)}), 0) << "a freed frame kept data";
  ::unlink(log.c_str());
}

TEST_F(PoolServer, KilledLockHolderPassesTheLockOn) {
  ASSERT_GT(start_server(), 0);
  proc& a = client({"connect-noauto", "lock", "ready", "hold"});
  ASSERT_EQ(fields(read_line(a)).size(), 3u);
  device_lock lock;
  ASSERT_EQ(device_lock::open("host-0", &lock), ok) << last_error();
  EXPECT_EQ(lock.try_acquire(), err_busy);
  ::kill(a.pid, SIGKILL);
  reap(a.pid);
  a.pid = -1;
  acquire_info info;
  ASSERT_EQ(lock.acquire(lock_priority::normal, 5'000'000'000, &info), ok) << last_error();
  EXPECT_TRUE(info.previous_holder_died);
  EXPECT_EQ(lock.release(), ok);
}

// A stopped lock holder shows as stopped in the status report. A client stopped (SIGSTOP)
// inside the device lock's internal mutex does not stop the server: a client that leaves
// is repaired, a new one connects and is served, and a 1 s timed lock returns in about 1 s
// with an error that names the stopped process.
TEST_F(PoolServer, StoppedClientsDoNotStopTheServer) {
  ASSERT_GT(start_server(), 0);
  proc& holder = client({"connect-noauto", "lock", "ready", "hold"});
  ASSERT_EQ(fields(read_line(holder)).size(), 3u);
  ::kill(holder.pid, SIGSTOP);
  ASSERT_TRUE(eventually([&] { return is_stopped_state(process_state(holder.pid)); }));
  device_report report;
  ASSERT_EQ(collect_report("host-0", &report), ok) << last_error();
  const std::string text = render_text({report});
  EXPECT_NE(text.find("holder: pid " + std::to_string(holder.pid)), std::string::npos) << text;
  EXPECT_NE(text.find("STOPPED (SIGSTOP, Ctrl-Z or a debugger; kill -CONT " + std::to_string(holder.pid)), std::string::npos) << text;
  EXPECT_NE(render_json({report}).find("\"stopped\": true"), std::string::npos);

  proc& stuck = client({"connect-noauto", "ready", "lock-stop-inside", "hold"});
  ASSERT_EQ(fields(read_line(stuck)).size(), 3u);
  ASSERT_TRUE(eventually([&] { return is_stopped_state(process_state(stuck.pid)); })) << "the client never stopped in the mutex";
  // A client that leaves makes the server repair the pool and the lock...
  EXPECT_EQ(run_client({"connect-noauto", "own", "5"}), 0);
  std::this_thread::sleep_for(100ms);
  // ...and the server still serves the next one.
  proc& next = client({"connect-noauto", "own", "6", "ready", "hold"});
  const std::string line = read_line(next, 15s);
  EXPECT_EQ(fields(line).size(), 3u) << "the server stopped serving while a client is stopped in the lock's mutex: \"" << line << "\"";
  device_lock lock;
  ASSERT_EQ(device_lock::open("host-0", &lock), ok) << last_error();
  const uint64_t t0 = monotonic_ns();
  EXPECT_EQ(lock.acquire(lock_priority::normal, 1'000'000'000), err_timeout);
  const std::string why = last_error();
  EXPECT_LT(monotonic_ns() - t0, 5'000'000'000u);
  EXPECT_NE(why.find("pid " + std::to_string(stuck.pid)), std::string::npos) << why;
  EXPECT_NE(why.find("stopped"), std::string::npos) << why;
  ASSERT_EQ(collect_report("host-0", &report), ok) << last_error();
  EXPECT_FALSE(report.have_queue);
  EXPECT_NE(report.queue_error.find("pid " + std::to_string(stuck.pid)), std::string::npos) << report.queue_error;
  ::kill(stuck.pid, SIGCONT);
  ::kill(holder.pid, SIGCONT);
}

TEST_F(PoolServer, ExitsAfterTheIdleTimeout) {
  vramswap::detail::test::set_env("VRAMSWAP_POOL_IDLE_EXIT", "1");
  vramswap::detail::test::set_env("VRAMSWAP_LOG", "info");  // the server's log is checked below
  // Started on demand; stays while a client is attached (2 s > 1 s), then exits idle.
  proc& a = client({"connect", "ready", "hold"});
  const std::vector<long> f = fields(read_line(a, 60s));
  ASSERT_EQ(f.size(), 3u);
  const auto server = static_cast<pid_t>(f[2]);
  std::this_thread::sleep_for(2s);
  EXPECT_EQ(::waitpid(server, nullptr, WNOHANG), 0) << "the server exited while a client was attached";
  const auto t0 = std::chrono::steady_clock::now();
  ::close(a.in);
  a.in = -1;
  EXPECT_EQ(reap(a.pid), 0);
  a.pid = -1;
  EXPECT_EQ(reap(server, 20s), 0);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(waited, 0.9);
  EXPECT_LT(waited, 10.0);
  EXPECT_NE(count_of(read_file(dir_ + "/" + prefix_ + "host-0.log"), "no client for 1 s"), 0u);
}

// Servers started on demand one after another (each exits when idle) append to one log in the
// runtime dir, often a small tmpfs: a log past 8 MiB is rotated to <log>.1 when the next starts.
TEST_F(PoolServer, AServerStartedOnDemandRotatesALogThatHasGrownLarge) {
  vramswap::detail::test::set_env("VRAMSWAP_LOG", "info");
  const std::string log = dir_ + "/" + prefix_ + "host-0.log";
  ASSERT_EQ(::mkdir(dir_.c_str(), 0700), 0) << std::strerror(errno);
  {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    ASSERT_EQ(::write(fd, "the previous servers' lines\n", 28), 28);
    ASSERT_EQ(::ftruncate(fd, 9 << 20), 0);  // sparse: 9 MiB
    ::close(fd);
  }
  proc& a = client({"connect", "ready", "hold"});
  ASSERT_EQ(fields(read_line(a, 60s)).size(), 3u);
  struct stat st {};
  ASSERT_EQ(::stat((log + ".1").c_str(), &st), 0) << "the large log was not rotated";
  EXPECT_EQ(st.st_size, 9 << 20);
  EXPECT_NE(read_file(log + ".1").find("the previous servers' lines"), std::string::npos);
  ASSERT_EQ(::stat(log.c_str(), &st), 0);
  EXPECT_LT(st.st_size, 1 << 20);
  EXPECT_NE(read_file(log).find("it is " + log + ".1 now"), std::string::npos) << read_file(log);
}

// A node's server over weeks: jobs come and go by the thousand, many killed. More of them than
// the pool has member slots (256), killed or ending, twenty at a time: the server repairs each
// one, keeps no descriptor of theirs, and the next process still joins.
TEST_F(PoolServer, MoreJobsThanMemberSlotsComeAndGoAndLeaveNothingBehind) {
  const pid_t server = start_server();
  ASSERT_GT(server, 0);
  auto one_batch = [&](int n, bool kill) {
    std::vector<proc*> batch;
    for (int i = 0; i < n; ++i) batch.push_back(&client({"connect", "ready", "hold"}));
    for (proc* p : batch) ASSERT_EQ(fields(read_line(*p, 60s)).size(), 3u) << "a client did not join";
    for (proc* p : batch) {
      if (kill) {
        ::kill(p->pid, SIGKILL);
      } else {
        ::close(p->in);
        p->in = -1;
      }
    }
    for (proc* p : batch) {
      EXPECT_EQ(reap(p->pid), kill ? 128 + SIGKILL : 0);
      p->pid = -1;
      for (int* fd : {&p->in, &p->out}) {
        if (*fd >= 0) ::close(*fd);
        *fd = -1;
      }
    }
  };
  one_batch(1, false);  // whatever the server opens once is open now
  const long before = test::open_descriptors(server);
  ASSERT_GT(before, 0);
  constexpr int k_batches = 15, k_per_batch = 20;  // 300 processes, 256 slots
  for (int b = 0; b < k_batches && !HasFatalFailure(); ++b) one_batch(k_per_batch, b % 3 != 2);
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (test::open_descriptors(server) > before && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(20ms);
  EXPECT_LE(test::open_descriptors(server), before) << "the server kept descriptors of jobs that ended";
  one_batch(1, false);  // and one more still joins
  EXPECT_EQ(::waitpid(server, nullptr, WNOHANG), 0) << "the server exited";
}

TEST_F(PoolServer, KilledServerIsNoticedAndReplaced) {
  proc& a = client({"connect", "ready", "wait-server-gone", "20"});
  const std::vector<long> f = fields(read_line(a, 60s));
  ASSERT_EQ(f.size(), 3u);
  const auto server = static_cast<pid_t>(f[2]);
  ::kill(server, SIGKILL);
  EXPECT_EQ(reap(server), 128 + SIGKILL);
  EXPECT_EQ(read_line(a), "server-gone");
  EXPECT_EQ(reap(a.pid), 0);
  a.pid = -1;
  // Its socket file and segment are left behind; a new client starts a new server anyway.
  proc& b = client({"connect", "zero", "0", "4", "ready"});
  const std::vector<long> g = fields(read_line(b, 60s));
  ASSERT_EQ(g.size(), 3u);
  EXPECT_NE(g[2], server);
  EXPECT_EQ(reap(b.pid), 0);
  b.pid = -1;
  servers_.push_back(static_cast<pid_t>(g[2]));
}

// The preload shim must never be loaded into vramswapd (it would take the server's own CUDA
// calls for a program's). A client under the shim starts the server without it, keeping the
// rest of LD_PRELOAD; a server started by hand under the shim refuses, saying how to start it.
// The preloaded names do not exist: ld.so warns and goes on, which is all these cases need.
TEST_F(PoolServer, AClientUnderThePreloadShimStartsTheServerWithoutIt) {
  vramswap::detail::test::unset_env("VRAMSWAP_SERVER");
  vramswap::detail::test::set_env("VRAMSWAP_POOL_IDLE_EXIT", "1");
  ::setenv("LD_PRELOAD", "/nonexistent/libvramswap_preload.so", 1);
  proc& c = client({"connect", "ready", "hold"});
  ::unsetenv("LD_PRELOAD");
  const std::vector<long> f = fields(read_line(c, 60s));
  ASSERT_EQ(f.size(), 3u) << "the client did not connect: the server it started did not get ready";
  servers_.push_back(static_cast<pid_t>(f[2]));
}

TEST_F(PoolServer, RefusesToRunUnderThePreloadShim) {
  ASSERT_EQ(::mkdir(dir_.c_str(), 0700), 0);  // the runtime dir, which no server made here
  const std::string err = dir_ + "/under-shim.err";
  const std::string cmd = "LD_PRELOAD='/nonexistent/libvramswap_preload.so' " + std::string(VRAMSWAP_SERVER_BINARY) +
                          " --foreground 2>" + err;
  const int status = std::system(cmd.c_str());
  EXPECT_EQ(WEXITSTATUS(status), 2);
  const std::string text = read_file(err);
  EXPECT_NE(text.find("the preload shim libvramswap_preload.so is preloaded into the server"), std::string::npos) << text;
  EXPECT_NE(text.find("env -u LD_PRELOAD"), std::string::npos) << text;
}

TEST_F(PoolServer, SecondServerForTheDeviceRefuses) {
  const pid_t first = start_server();
  ASSERT_GT(first, 0);
  const std::string err = dir_ + "/second.err";
  const std::string cmd = std::string(VRAMSWAP_SERVER_BINARY) + " --foreground 2>" + err;
  const int status = std::system(cmd.c_str());
  EXPECT_EQ(WEXITSTATUS(status), 1);
  const std::string text = read_file(err);
  EXPECT_NE(text.find("another pool server (pid " + std::to_string(first) + ") already serves device 0"), std::string::npos) << text;
  // The first one is unharmed.
  EXPECT_EQ(run_client({"connect-noauto", "zero", "0", "1"}), 0);
}

TEST_F(PoolServer, ASecondRuntimeDirIsASecondPoolWithAShareOfItsOwn) {
  // Two trust domains on one device are two pools (docs/security.md): each runtime dir has
  // a server, a lock and a frame table of its own, and each pool takes the share of the
  // device's memory its --pool-size says. Frames of one are never seen from the other.
  const pid_t first = start_server({"--pool-size", "96M"});
  ASSERT_GT(first, 0);
  proc& a = client({"connect-noauto", "own", "3", "write", "3", "11", "ready", "hold"});
  const std::vector<long> a_ready = fields(read_line(a));
  ASSERT_EQ(a_ready.size(), 3u);
  EXPECT_EQ(a_ready[1], 48) << "96 MiB of 2 MiB frames";

  const std::string other = dir_ + "-b";
  vramswap::detail::test::set_env("VRAMSWAP_RUNTIME_DIR", other.c_str());
  const pid_t second = start_server({"--pool-size", "64M"});
  ASSERT_GT(second, 0) << "a server of a second runtime dir must start a second pool on the device";
  proc& b = client({"connect-noauto", "own", "3", "write", "3", "99", "check", "3", "99", "ready", "hold"});
  const std::vector<long> b_ready = fields(read_line(b));
  ASSERT_EQ(b_ready.size(), 3u);
  EXPECT_EQ(b_ready[1], 32) << "64 MiB of 2 MiB frames";
  EXPECT_EQ(b_ready[2], second) << "the client of the second runtime dir is served by the second server";
  auto seg_b = open_segment();
  ASSERT_TRUE(seg_b);
  EXPECT_EQ(seg_b->header()->server_pid, second);
  EXPECT_EQ(seg_b->path().rfind(other + "/", 0), 0u) << seg_b->path();

  // Back in the first pool: A's bytes and frame table are untouched by the second pool.
  vramswap::detail::test::set_env("VRAMSWAP_RUNTIME_DIR", dir_.c_str());
  EXPECT_NE(run_client({"connect-noauto", "own", "3", "write", "3", "42"}), 0) << "a client took a frame that A owns";
  EXPECT_EQ(run_client({"connect-noauto", "check", "3", "11", "zero", "0", "3", "zero", "4", "48"}), 0)
      << "A's bytes or the free frames changed";
  auto seg_a = open_segment();
  ASSERT_TRUE(seg_a);
  EXPECT_EQ(seg_a->header()->server_pid, first);
  EXPECT_EQ(seg_a->frame_count(), 48u);
  EXPECT_EQ(stop_server(second), 0);
  EXPECT_EQ(std::system(("rm -rf " + other).c_str()), 0);
}

TEST_F(PoolServer, PoolSegmentOfAnotherUserIsRefusedByOwner) {
  if (::geteuid() != 0) GTEST_SKIP() << "skipped: needs root to give a file to uid 65534";
  std::string name, dir;
  ASSERT_EQ(pool_segment::name_for("host-0", &name), ok);
  ASSERT_EQ(runtime_dir(/*create=*/true, &dir), ok) << last_error();
  const std::string path = dir + name;
  give_to_nobody(path);
  std::string said;
  start_refused(&said);
  EXPECT_NE(said.find("the pool segment " + path + " belongs to uid 65534"), std::string::npos) << said;
  EXPECT_NE(said.find("rm " + path), std::string::npos) << said;
  EXPECT_NE(said.find("VRAMSWAP_SHM_PREFIX"), std::string::npos) << said;
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << "the foreign segment was removed";
  EXPECT_EQ(st.st_uid, 65534u);
  ::unlink(path.c_str());
}

TEST_F(PoolServer, RuntimeFilesOfAnotherUserOrOpenToOthersAreRefused) {
  pool_paths paths;
  ASSERT_EQ(pool_paths::make("host-0", true, &paths), ok) << last_error();
  ASSERT_EQ(::chmod(dir_.c_str(), 0755), 0);
  clear_error();
  EXPECT_EQ(pool_paths::make("host-0", true, &paths), err_not_owner);
  EXPECT_NE(std::string(last_error()).find("the runtime dir " + dir_ + " is open to other users"), std::string::npos) << last_error();
  ASSERT_EQ(::chmod(dir_.c_str(), 0700), 0);
  if (::geteuid() != 0) GTEST_SKIP() << "skipped: needs root to give a file to uid 65534";
  give_to_nobody(paths.server_lock);
  std::string said;
  start_refused(&said);
  EXPECT_NE(said.find("the one-server lock " + paths.server_lock + " belongs to uid 65534"), std::string::npos) << said;
}

TEST_F(PoolServer, ServerOfAnotherUserIsNotUsed) {
  if (::geteuid() != 0) GTEST_SKIP() << "skipped: needs root to listen as uid 65534";
  pool_paths paths;
  ASSERT_EQ(pool_paths::make("host-0", true, &paths), ok) << last_error();
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Bound at our socket's path, listening as uid 65534 (SO_PEERCRED is taken at listen).
    const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", paths.socket.c_str());
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0 ||
        ::listen(fd, 4) != 0) {
      ::_exit(1);
    }
    [[maybe_unused]] const ssize_t n = ::write(ready[1], "x", 1);
    ::pause();
    ::_exit(0);
  }
  ::close(ready[1]);
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  std::unique_ptr<backend> be;
  ASSERT_EQ(make_backend(backend_kind::host, &be), ok);
  std::unique_ptr<pool_connection> conn;
  clear_error();
  EXPECT_EQ(pool_connection::connect(*be, 0, false, &conn), err_not_owner);
  const std::string said = last_error();
  EXPECT_NE(said.find("the pool server listening on " + paths.socket + " (pid " + std::to_string(child) + ") runs as uid 65534"),
            std::string::npos)
      << said;
  ::kill(child, SIGKILL);
  reap(child);
}

// A hello with more descriptors than the one (the pidfd) a client sends is refused, and the
// server keeps none of them: a peer that sent such hellos over and over would otherwise
// leak the server's descriptors until every client was refused.
TEST_F(PoolServer, AHelloWithExtraDescriptorsIsRefusedAndLeavesNoneOpen) {
  const pid_t server = start_server();
  ASSERT_GT(server, 0);
  process_identity me{};
  ASSERT_EQ(current_process(&me), ok);
  const pool_protocol::hello h{pool_protocol::k_magic, pool_protocol::k_version, me.pid, 0, me.start_time, me.pid_ns};
  auto refused_hello = [&](std::string* message) {
    const int fd = connect_to_server();
    ASSERT_GE(fd, 0) << std::strerror(errno);
    const int two[2] = {::open("/dev/null", O_RDONLY | O_CLOEXEC), ::open("/dev/null", O_RDONLY | O_CLOEXEC)};
    EXPECT_EQ(send_fds(fd, two, 2, &h, sizeof h), ok) << last_error();
    ::close(two[0]);
    ::close(two[1]);
    pool_protocol::welcome w{};
    size_t got = 0, nfds = 0;
    EXPECT_EQ(recv_fds(fd, nullptr, 0, &nfds, &w, sizeof w, &got), ok) << last_error();
    EXPECT_EQ(w.status, err_invalid_argument);
    *message = w.message;
    ::close(fd);
  };
  std::string message;
  refused_hello(&message);  // the first: whatever the server opens once is open now
  EXPECT_NE(message.find("more than 1 descriptor(s) arrived"), std::string::npos) << message;
  const long before = test::open_descriptors(server);
  ASSERT_GT(before, 0);
  for (int i = 0; i < 20; ++i) refused_hello(&message);
  // The refusals close their connections at once; give the server's loop a moment.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (test::open_descriptors(server) > before && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_LE(test::open_descriptors(server), before) << "the server kept descriptors of refused hellos";
  // A real client still joins.
  std::unique_ptr<backend> be;
  ASSERT_EQ(make_backend(backend_kind::host, &be), ok);
  std::unique_ptr<pool_connection> c;
  EXPECT_EQ(pool_connection::connect(*be, 0, false, &c), ok) << last_error();
}

// At its descriptor limit the server cannot accept: the connection stays in the backlog,
// and a listener polled again at once would turn the loop into a spin that floods the log.
// It pauses the listener instead, warns once, and accepts again when descriptors are free.
TEST_F(PoolServer, AtItsDescriptorLimitTheServerNeitherSpinsNorFloodsItsLog) {
  const std::string err_file = dir_ + "-server.err";  // beside the runtime dir, which the server makes
  const pid_t server = start_server({}, err_file);
  ASSERT_GT(server, 0);
  auto cpu_ticks = [&] {
    std::ifstream in("/proc/" + std::to_string(server) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::istringstream fields(stat.substr(stat.rfind(')') + 2));
    std::string f;
    unsigned long long utime = 0, stime = 0;
    for (int i = 3; i <= 15 && fields >> f; ++i) {
      if (i == 14) utime = std::stoull(f);
      if (i == 15) stime = std::stoull(f);
    }
    return utime + stime;
  };
  // Two descriptors to spare, then five silent connections: two are accepted, three wait.
  rlimit lim{};
  ASSERT_EQ(::prlimit(server, RLIMIT_NOFILE, nullptr, &lim), 0) << std::strerror(errno);
  rlimit low = lim;
  low.rlim_cur = test::open_descriptors(server) + 2;
  ASSERT_EQ(::prlimit(server, RLIMIT_NOFILE, &low, nullptr), 0) << std::strerror(errno);
  std::vector<int> silent;
  for (int i = 0; i < 5; ++i) {
    const int fd = connect_to_server();
    ASSERT_GE(fd, 0) << std::strerror(errno);
    silent.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const unsigned long long before = cpu_ticks();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const unsigned long long spent = cpu_ticks() - before;
  const long per_second = ::sysconf(_SC_CLK_TCK);
  EXPECT_LT(spent, static_cast<unsigned long long>(per_second / 5)) << "the server's loop spun at its descriptor limit";
  std::ifstream log_in(err_file);
  size_t warnings = 0, told_what_to_do = 0;
  for (std::string line; std::getline(log_in, line);) {
    if (line.find("vramswapd: accept: Too many open files") == std::string::npos) continue;
    ++warnings;
    told_what_to_do += line.find("raise the server's descriptor limit") != std::string::npos;
  }
  EXPECT_GE(warnings, 1u) << "the limit was never hit";
  EXPECT_LE(warnings, 1u) << "the warning repeats";
  EXPECT_EQ(told_what_to_do, warnings) << "the warning should say what to do";
  // Descriptors free again: the silent connections go, the limit comes back, and a client joins.
  for (int fd : silent) ::close(fd);
  ASSERT_EQ(::prlimit(server, RLIMIT_NOFILE, &lim, nullptr), 0) << std::strerror(errno);
  std::unique_ptr<backend> be;
  ASSERT_EQ(make_backend(backend_kind::host, &be), ok);
  std::unique_ptr<pool_connection> c;
  EXPECT_EQ(pool_connection::connect(*be, 0, false, &c), ok) << last_error();
  ::unlink(err_file.c_str());
}

// A stopped server (SIGSTOP, a debugger) whose queue of new connections is full: a
// client's connect would sleep until the server accepts, however long that takes, with
// nothing said. It gives up after its patience with an error that says why.
TEST_F(PoolServer, ConnectingToAStoppedServerWithAFullQueueFailsInTimeAndSaysWhy) {
  const pid_t server = start_server();
  ASSERT_GT(server, 0);
  const std::string path = dir_ + "/" + prefix_ + "host-0.sock";
  ASSERT_EQ(::kill(server, SIGSTOP), 0);
  std::vector<int> queued;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
  for (int i = 0; i < 1000; ++i) {  // the listen backlog (128) and one more
    const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    ASSERT_GE(fd, 0);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      EXPECT_EQ(errno, EAGAIN) << std::strerror(errno);
      ::close(fd);
      break;
    }
    queued.push_back(fd);
  }
  ASSERT_LT(queued.size(), 1000u) << "the queue never filled";
  const auto t0 = std::chrono::steady_clock::now();
  int fd = -1;
  clear_error();
  EXPECT_EQ(dial_server(path, &fd, 500), err_timeout);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(waited, 0.4);
  EXPECT_LT(waited, 5.0) << "the connect should give up after its patience";
  const std::string why = last_error();
  EXPECT_NE(why.find("took no new connection for 0.5 s"), std::string::npos) << why;
  EXPECT_NE(why.find("stopped (SIGSTOP"), std::string::npos) << why;
  // Resumed, with its queue drained, the server takes connections again.
  for (int q : queued) ::close(q);
  ASSERT_EQ(::kill(server, SIGCONT), 0);
  fd = -1;
  EXPECT_EQ(dial_server(path, &fd), ok) << last_error();
  if (fd >= 0) ::close(fd);
}

TEST_F(PoolServer, BadHelloGetsAnErrorWelcome) {
  ASSERT_GT(start_server(), 0);
  // `attached`: a descriptor sent with the message (-1: none), where a client's pidfd goes.
  auto exchange = [&](const void* msg, size_t len, pool_protocol::welcome* w, int attached = -1) {
    const int fd = connect_to_server();
    EXPECT_GE(fd, 0) << std::strerror(errno);
    EXPECT_EQ(send_fds(fd, attached >= 0 ? &attached : nullptr, attached >= 0 ? 1 : 0, msg, len), ok);
    size_t got = 0;
    size_t nfds = 0;
    *w = {};
    EXPECT_EQ(recv_fds(fd, nullptr, 0, &nfds, w, sizeof *w, &got), ok) << last_error();
    EXPECT_EQ(got, sizeof *w);
    char byte;
    EXPECT_EQ(::recv(fd, &byte, 1, 0), 0) << "the server should close after an error welcome";
    ::close(fd);
  };
  process_identity me{};
  ASSERT_EQ(current_process(&me), ok);
  pool_protocol::hello h{pool_protocol::k_magic, pool_protocol::k_version, me.pid, 0, me.start_time, me.pid_ns};
  pool_protocol::welcome w{};

  h.magic = 0x12345678;
  exchange(&h, sizeof h, &w);
  EXPECT_EQ(w.status, err_version_mismatch);
  EXPECT_NE(std::string(w.message).find("protocol version " + std::to_string(pool_protocol::k_version)), std::string::npos) << w.message;

  h.magic = pool_protocol::k_magic;
  h.version = 99;
  exchange(&h, sizeof h, &w);
  EXPECT_EQ(w.status, err_version_mismatch);
  EXPECT_NE(std::string(w.message).find("protocol version 99"), std::string::npos) << w.message;

  const char junk[3] = {1, 2, 3};
  exchange(junk, sizeof junk, &w);
  EXPECT_EQ(w.status, err_version_mismatch);

  h.version = pool_protocol::k_version;
  h.pid = me.pid + 1;
  exchange(&h, sizeof h, &w);
  EXPECT_EQ(w.status, err_invalid_argument);
  EXPECT_NE(std::string(w.message).find("names pid " + std::to_string(me.pid + 1) + " of this server's PID namespace"),
            std::string::npos) << w.message;

  // A peer the server can see cannot claim to be in a namespace it is not in (and so
  // escape the pid check).
  h.pid = me.pid;
  h.pid_ns = me.pid_ns + 1;
  exchange(&h, sizeof h, &w);
  EXPECT_EQ(w.status, err_invalid_argument);
  EXPECT_NE(std::string(w.message).find("names PID namespace"), std::string::npos) << w.message;
  h.pid_ns = me.pid_ns;

  // The descriptor sent with a hello must be a pidfd, and the peer's: the server waits for
  // it before it scrubs a member's frames.
  const int not_a_pidfd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  exchange(&h, sizeof h, &w, not_a_pidfd);
  ::close(not_a_pidfd);
  EXPECT_EQ(w.status, err_invalid_argument);
  EXPECT_NE(std::string(w.message).find("is not a pidfd"), std::string::npos) << w.message;
  const pid_t other = ::fork();
  ASSERT_GE(other, 0);
  if (other == 0) {
    ::pause();
    ::_exit(0);
  }
  const int others_pidfd = static_cast<int>(::syscall(SYS_pidfd_open, other, 0));
  if (others_pidfd >= 0) {
    exchange(&h, sizeof h, &w, others_pidfd);
    ::close(others_pidfd);
    EXPECT_EQ(w.status, err_invalid_argument);
    EXPECT_NE(std::string(w.message).find("a pidfd of pid " + std::to_string(other)), std::string::npos) << w.message;
  }
  ::kill(other, SIGKILL);
  ::waitpid(other, nullptr, 0);

  auto seg = open_segment();
  ASSERT_TRUE(seg);
  EXPECT_EQ(seg->count(pool_layout::frame_free), k_frames);
  for (uint32_t m = 0; m < pool_layout::k_member_count; ++m) EXPECT_EQ(seg->member(m).state.load(), pool_layout::member_free);
}

// Peers that connect and say nothing (a process stopped or frozen right after connecting)
// never hold up the server: the next client joins at once, while each silent one is
// refused, saying why, only after the handshake's time (5 s).
TEST_F(PoolServer, ConnectionsThatSendNoHelloDelayNoOtherClient) {
  ASSERT_GT(start_server(), 0);
  std::vector<int> silent;
  for (int i = 0; i < 3; ++i) {
    silent.push_back(connect_to_server());
    ASSERT_GE(silent.back(), 0) << std::strerror(errno);
  }
  // Served in turn, three silent peers would hold the loop for 15 s before this client.
  const uint64_t t0 = monotonic_ns();
  EXPECT_EQ(run_client({"connect-noauto", "own", "2"}), 0);
  EXPECT_LT(monotonic_ns() - t0, 10'000'000'000u) << "a client waited for connections that sent no hello";
  for (const int fd : silent) {
    pollfd p{fd, POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 15000), 1) << "a silent connection was never refused";
    pool_protocol::welcome w{};
    size_t got = 0;
    size_t nfds = 0;
    ASSERT_EQ(recv_fds(fd, nullptr, 0, &nfds, &w, sizeof w, &got), ok) << last_error();
    EXPECT_EQ(w.status, err_timeout);
    EXPECT_NE(std::string(w.message).find("sent no hello within 5 s"), std::string::npos) << w.message;
    EXPECT_NE(std::string(w.message).find("pid " + std::to_string(::getpid())), std::string::npos) << w.message;
    ::close(fd);
  }
  // And the server goes on serving.
  EXPECT_EQ(run_client({"connect-noauto", "own", "2"}), 0);
}

TEST_F(PoolServer, PeerOfAnotherUserIsRefused) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "skipped: needs root to run a client as another user (uid 65534) against this server";
  }
  ASSERT_GT(start_server(), 0);
  // Let uid 65534 reach the socket at all, so that the server's own check is what refuses.
  ASSERT_EQ(::chmod(dir_.c_str(), 0755), 0);
  ASSERT_EQ(::chmod((dir_ + "/" + prefix_ + "host-0.sock").c_str(), 0666), 0);
  int result[2];
  ASSERT_EQ(::pipe(result), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Only system calls here: the test process may have threads.
    pool_protocol::welcome w{};
    w.status = 1;
    if (::setresgid(65534, 65534, 65534) == 0 && ::setresuid(65534, 65534, 65534) == 0) {
      const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET, 0);
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s/%shost-0.sock", dir_.c_str(), prefix_.c_str());
      pool_protocol::hello h{pool_protocol::k_magic, pool_protocol::k_version, ::getpid(), 0, 0};
      // A server that neither answers nor hangs up ends the wait (status 2), not the test.
      const timeval bound{30, 0};
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &bound, sizeof bound);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
        // The server may refuse before it reads the hello: the send may fail; read anyway.
        [[maybe_unused]] const ssize_t sent = ::send(fd, &h, sizeof h, MSG_NOSIGNAL);
        if (::recv(fd, &w, sizeof w, 0) != sizeof w) w.status = 2;
      } else {
        w.status = 3;
      }
    }
    [[maybe_unused]] const ssize_t n = ::write(result[1], &w, sizeof w);
    ::_exit(0);
  }
  ::close(result[1]);
  pool_protocol::welcome w{};
  pollfd answered{result[0], POLLIN, 0};
  ASSERT_EQ(::poll(&answered, 1, 60'000), 1) << "the child (pid " << child << ") said nothing in 60 s; it was: "
                                             << read_file("/proc/" + std::to_string(child) + "/stat") << " in "
                                             << read_file("/proc/" + std::to_string(child) + "/wchan");
  EXPECT_EQ(::read(result[0], &w, sizeof w), static_cast<ssize_t>(sizeof w));
  ::close(result[0]);
  EXPECT_EQ(reap(child), 0);
  EXPECT_EQ(w.status, err_not_owner);
  w.message[sizeof w.message - 1] = '\0';
  EXPECT_NE(std::string(w.message).find("uid 65534 (nobody) may not use this pool"), std::string::npos) << w.message;
}

TEST_F(PoolServer, NoServerAndNoAutostartIsAClearError) {
  std::unique_ptr<backend> be;
  ASSERT_EQ(make_backend(backend_kind::host, &be), ok);
  std::unique_ptr<pool_connection> c;
  clear_error();
  EXPECT_EQ(pool_connection::connect(*be, 0, false, &c), err_unavailable);
  EXPECT_NE(std::string(last_error()).find("no pool server listens on " + dir_ + "/" + prefix_ + "host-0.sock"), std::string::npos) << last_error();

  vramswap::detail::test::set_env("VRAMSWAP_SERVER", "/nonexistent/vramswapd");
  EXPECT_EQ(pool_connection::connect(*be, 0, true, &c), err_unavailable);
  EXPECT_NE(std::string(last_error()).find("VRAMSWAP_SERVER=/nonexistent/vramswapd"), std::string::npos) << last_error();

  // A server that cannot start says why, through the client.
  vramswap::detail::test::set_env("VRAMSWAP_SERVER", VRAMSWAP_SERVER_BINARY);
  vramswap::detail::test::set_env("VRAMSWAP_POOL_SIZE", "lots");
  EXPECT_EQ(pool_connection::connect(*be, 0, true, &c), err_unavailable);
  EXPECT_NE(std::string(last_error()).find("VRAMSWAP_POOL_SIZE"), std::string::npos) << last_error();
}

// Gone: not running (a zombie of ours is reaped first; this process is a subreaper).
bool process_gone(pid_t pid) {
  ::waitpid(pid, nullptr, WNOHANG);
  return ::kill(pid, 0) != 0 && errno == ESRCH;
}

long pid_in(const std::string& path) { return std::strtol(read_file(path).c_str(), nullptr, 10); }

// A VRAMSWAP_SERVER that never reports ready holds nobody past the start bound: the client
// that started it kills it (and reaps its own child) and says so; the clients that waited on
// the start lock give up with it, naming the server, its pid and its log. Two kinds of hang:
// a server that detaches like vramswapd (reports "started <pid>" from its second process),
// and one that never even forks (the starter's own child never exits).
TEST_F(PoolServer, ServerThatNeverGetsReadyIsKilledWithinTheStartBound) {
  const std::string forking = dir_ + "-forking.sh";
  const std::string plain = dir_ + "-plain.sh";
  const std::string forked_pid = dir_ + "-forked.pid";
  const std::string plain_pid = dir_ + "-plain.pid";
  std::ofstream(forking) << "#!/bin/sh\nsh -c 'echo started $$ >&3; echo $$ > " << forked_pid << "; exec sleep 600' &\nexit 0\n";
  std::ofstream(plain) << "#!/bin/sh\necho $$ > " << plain_pid << "\nexec sleep 600\n";
  ASSERT_EQ(::chmod(forking.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(plain.c_str(), 0700), 0);
  const std::string log = dir_ + "/" + prefix_ + "host-0.log";
  const auto t0 = std::chrono::steady_clock::now();

  vramswap::detail::test::set_env("VRAMSWAP_SERVER", forking.c_str());
  proc& starter = client({"connect"}, dir_ + "-starter.err");
  const pid_t starter_pid = starter.pid;
  ASSERT_TRUE(eventually([&] { return pid_in(forked_pid) > 0; }, 20s)) << "the fake server never ran";
  const long hung = pid_in(forked_pid);
  proc& waiter1 = client({"connect"}, dir_ + "-waiter1.err");
  proc& waiter2 = client({"connect"}, dir_ + "-waiter2.err");

  // Another pool (prefix) at the same time, whose server does not even fork.
  const std::string other_dir = dir_ + "-b";
  vramswap::detail::test::set_env("VRAMSWAP_SERVER", plain.c_str());
  vramswap::detail::test::set_env("VRAMSWAP_RUNTIME_DIR", other_dir.c_str());
  vramswap::detail::test::set_env("VRAMSWAP_SHM_PREFIX", (prefix_ + "b-").c_str());
  proc& lone = client({"connect"}, dir_ + "-lone.err");
  vramswap::detail::test::set_env("VRAMSWAP_SERVER", VRAMSWAP_SERVER_BINARY);
  vramswap::detail::test::set_env("VRAMSWAP_RUNTIME_DIR", dir_.c_str());
  vramswap::detail::test::set_env("VRAMSWAP_SHM_PREFIX", prefix_.c_str());

  const int bound = pool_connection::k_start_timeout_s;
  for (proc* p : {&starter, &waiter1, &waiter2, &lone}) {
    EXPECT_EQ(reap(p->pid, std::chrono::seconds(bound + 30)), 1) << "a client did not fail within the start bound";
    p->pid = -1;
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(took, bound + 20.0) << "the start bound is " << bound << " s";

  const std::string said = read_file(dir_ + "-starter.err");
  EXPECT_NE(said.find("the pool server " + forking + " (pid " + std::to_string(hung) + ") did not become ready within " +
                      std::to_string(bound) + " s, so it was killed"),
            std::string::npos)
      << said;
  EXPECT_NE(said.find(log), std::string::npos) << said;
  for (const char* w : {"-waiter1.err", "-waiter2.err"}) {
    const std::string text = read_file(dir_ + w);
    EXPECT_NE(text.find("client pid " + std::to_string(starter_pid)), std::string::npos) << text;
    EXPECT_NE(text.find("the pool server " + forking + " (pid " + std::to_string(hung) + ")"), std::string::npos) << text;
    EXPECT_NE(text.find(log), std::string::npos) << text;
    EXPECT_NE(text.find("vramswapd --device 0 --foreground"), std::string::npos) << text;
  }
  EXPECT_TRUE(eventually([&] { return process_gone(static_cast<pid_t>(hung)); })) << "the detached fake server was left running";

  const std::string lone_said = read_file(dir_ + "-lone.err");
  const long plain_server = pid_in(plain_pid);
  ASSERT_GT(plain_server, 0) << lone_said;
  EXPECT_NE(lone_said.find("the pool server " + plain + " (pid " + std::to_string(plain_server) + ") did not become ready"),
            std::string::npos)
      << lone_said;
  EXPECT_TRUE(eventually([&] { return process_gone(static_cast<pid_t>(plain_server)); })) << "the fake server was left running";
  // The client reaped its own child: nothing of it was left for this subreaper to adopt.
  EXPECT_EQ(::waitpid(static_cast<pid_t>(plain_server), nullptr, WNOHANG), -1);
  if (std::system(("rm -rf " + other_dir).c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", other_dir.c_str());
  for (const std::string& f : {forking, plain, forked_pid, plain_pid}) ::unlink(f.c_str());
  for (const char* f : {"-starter.err", "-waiter1.err", "-waiter2.err", "-lone.err"}) ::unlink((dir_ + f).c_str());
}

// A regular file (or a socket somebody listens on, or another user's socket) at the socket
// path is refused by name and left as it was; the stale socket of a dead server is replaced.
TEST_F(PoolServer, SomethingElseAtTheSocketPathIsRefusedNotReplaced) {
  ASSERT_EQ(::mkdir(dir_.c_str(), 0700), 0);
  const std::string sock = dir_ + "/" + prefix_ + "host-0.sock";
  const std::string err = dir_ + "/server.err";
  // --idle-exit: a server that (wrongly) starts anyway ends, and the test with it.
  const std::string cmd = std::string(VRAMSWAP_SERVER_BINARY) + " --foreground --idle-exit 2 2>" + err;
  std::ofstream(sock) << "precious\n";
  EXPECT_EQ(WEXITSTATUS(std::system(cmd.c_str())), 1);
  std::string text = read_file(err);
  EXPECT_NE(text.find(sock + " is a regular file"), std::string::npos) << text;
  EXPECT_EQ(read_file(sock), "precious\n") << "the file was replaced";
  // Through a client that starts the server: the server's reason reaches it.
  std::unique_ptr<backend> be;
  ASSERT_EQ(make_backend(backend_kind::host, &be), ok);
  std::unique_ptr<pool_connection> c;
  EXPECT_EQ(pool_connection::connect(*be, 0, true, &c), err_unavailable);
  EXPECT_NE(std::string(last_error()).find(sock + " is a regular file"), std::string::npos) << last_error();
  EXPECT_EQ(read_file(sock), "precious\n");
  ASSERT_EQ(::unlink(sock.c_str()), 0);

  // A socket that somebody listens on is not stale.
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", sock.c_str());
  int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  EXPECT_EQ(WEXITSTATUS(std::system(cmd.c_str())), 1);
  text = read_file(err);
  EXPECT_NE(text.find("something listens on " + sock), std::string::npos) << text;
  ::close(fd);
  struct stat st {};
  EXPECT_EQ(::lstat(sock.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));

  // Another user's socket (needs root to make one).
  if (::geteuid() == 0) {
    ASSERT_EQ(::chown(sock.c_str(), 65534, 65534), 0);
    EXPECT_EQ(WEXITSTATUS(std::system(cmd.c_str())), 1);
    text = read_file(err);
    EXPECT_NE(text.find("the socket " + sock + " belongs to uid 65534"), std::string::npos) << text;
    ASSERT_EQ(::chown(sock.c_str(), 0, 0), 0);
  }

  // Now it is the stale socket of a dead server (nobody listens): replaced.
  vramswap::detail::test::set_env("VRAMSWAP_LOG", "info");
  const pid_t server = start_server({"--idle-exit", "0"});
  ASSERT_GT(server, 0);
  EXPECT_EQ(run_client({"connect-noauto", "zero", "0", "1"}), 0);
}

// A metrics port that scrapers connect to and say nothing on (or never read from) never holds
// up the server's event loop: a killed client is repaired, a new client served, and a real
// scrape answered, each at once, while such connections keep arriving; and the server closes
// each silent connection after its timeout.
TEST_F(PoolServer, IdleMetricsConnectionsNeverDelayTheEventLoop) {
  const pid_t server = start_server({"--metrics-port", "0"});
  ASSERT_GT(server, 0);
  auto seg = open_segment();
  ASSERT_TRUE(seg);
  const auto port = static_cast<uint16_t>(seg->header()->metrics_port.load());
  ASSERT_NE(port, 0);
  auto dial = [port] { return test::connect_loopback(port); };
  // Eight connections that stay silent, and two that ask and never read; each replaced by a
  // new one as soon as the server closes it.
  std::atomic<bool> stop{false};
  std::atomic<int> closed_by_server{0};
  std::thread idlers([&] {
    std::vector<int> fds;
    for (int i = 0; i < 10; ++i) fds.push_back(-1);
    while (!stop.load()) {
      for (size_t i = 0; i < fds.size(); ++i) {
        if (fds[i] < 0) {
          fds[i] = dial();
          if (fds[i] >= 0 && i >= 8) (void)!::send(fds[i], "GET /metrics HTTP/1.0\r\n\r\n", 25, MSG_NOSIGNAL);
          continue;
        }
        pollfd p{fds[i], POLLIN, 0};
        char buf[1];
        if (i < 8 && ::poll(&p, 1, 0) == 1 && ::recv(fds[i], buf, 1, MSG_DONTWAIT) == 0) {
          ::close(fds[i]);
          fds[i] = -1;
          closed_by_server.fetch_add(1);
        }
      }
      std::this_thread::sleep_for(5ms);
    }
    for (int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
  });
  std::this_thread::sleep_for(300ms);  // let them queue up

  // Repairs: a client that owns a frame is killed; how long until the server has freed it.
  std::vector<double> repair_s;
  std::vector<double> connect_s;
  for (int round = 0; round < 4; ++round) {
    const auto asked = std::chrono::steady_clock::now();
    proc& a = client({"connect-noauto", "own", "3", "ready", "hold"});
    ASSERT_EQ(fields(read_line(a)).size(), 3u);
    connect_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - asked).count());
    ASSERT_EQ(seg->count(pool_layout::frame_free), k_frames - 1);
    const auto killed = std::chrono::steady_clock::now();
    ::kill(a.pid, SIGKILL);
    ASSERT_TRUE(eventually([&] { return seg->count(pool_layout::frame_free) == k_frames; }, 30s));
    repair_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count());
    reap(a.pid);
    a.pid = -1;
  }
  // A real scrape while the silent connections are there.
  std::vector<double> scrape_s;
  std::string body;
  for (int i = 0; i < 3; ++i) {
    const auto asked = std::chrono::steady_clock::now();
    const int fd = dial();
    ASSERT_GE(fd, 0);
    (void)!::send(fd, "GET /metrics HTTP/1.0\r\n\r\n", 25, MSG_NOSIGNAL);
    body.clear();
    char buf[4096];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) body.append(buf, static_cast<size_t>(n));
    ::close(fd);
    scrape_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - asked).count());
  }
  EXPECT_TRUE(eventually([&] { return closed_by_server.load() >= 8; }, 20s)) << "silent connections are never closed";
  stop.store(true);
  idlers.join();
  EXPECT_EQ(body.rfind("HTTP/1.0 200 OK\r\n", 0), 0u) << body;
  EXPECT_NE(body.find("vramswap_pool_frames{gpu=\"0\",UUID=\"host-0\"} " + std::to_string(k_frames)), std::string::npos) << body;
  // The fastest of each: the event loop of the old design spent up to 1 s on every silent
  // connection, so none of these came in under a second there.
  auto fastest = [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); };
  EXPECT_LT(fastest(repair_s), 0.5) << "repairs waited behind silent metrics connections";
  EXPECT_LT(fastest(connect_s), 0.9) << "handshakes waited behind silent metrics connections";
  EXPECT_LT(fastest(scrape_s), 0.5) << "a scrape waited behind silent metrics connections";
  EXPECT_EQ(::waitpid(server, nullptr, WNOHANG), 0) << "the server died";
}

// A pool segment truncated under its users is refused by name to a newcomer (never mapped
// past its end, which would be SIGBUS), with what to do.
TEST_F(PoolServer, TruncatedPoolSegmentIsRefusedByName) {
  std::unique_ptr<pool_segment> made;
  ASSERT_EQ(pool_segment::create("host-0", 64, 2u << 20, 0, ::getpid(), 0, &made), ok) << last_error();
  std::string name;
  ASSERT_EQ(pool_segment::name_for("host-0", &name), ok);
  struct stat st {};
  ASSERT_EQ(::stat((dir_ + name).c_str(), &st), 0);
  ASSERT_EQ(::truncate((dir_ + name).c_str(), st.st_size / 2), 0);
  std::unique_ptr<pool_segment> seg;
  EXPECT_EQ(pool_segment::open(name, &seg), err_version_mismatch);
  EXPECT_NE(std::string(last_error()).find(dir_ + name + " is " + std::to_string(st.st_size / 2) + " bytes"), std::string::npos)
      << last_error();
  EXPECT_NE(std::string(last_error()).find("SIGBUS"), std::string::npos) << last_error();
}

// In-process: a pool_server on the test's own backend, a pool_connection to it, and all
// device memory back when the server is gone.
TEST_F(PoolServer, InProcessServerGivesAllMemoryBack) {
  std::unique_ptr<backend> be;
  ASSERT_EQ(make_backend(backend_kind::host, &be), ok);
  device_info before;
  ASSERT_EQ(be->get_device_info(0, &before), ok);
  vramswap::detail::test::set_env("VRAMSWAP_POOL_SIZE", "25%");
  pool_server_options o;
  o.be = be.get();
  std::unique_ptr<pool_server> server;
  ASSERT_EQ(pool_server::start(o, &server), ok) << last_error();
  EXPECT_EQ(server->frame_count(), 32u);
  std::thread loop([&] { EXPECT_EQ(server->run(), ok); });
  {
    std::unique_ptr<pool_connection> c;
    ASSERT_EQ(pool_connection::connect(*be, 0, false, &c), ok) << last_error();
    EXPECT_EQ(c->frame_count(), 32u);
    EXPECT_EQ(c->frame_size(), 2u << 20);
    EXPECT_TRUE(c->server_alive());
    EXPECT_EQ(c->segment().frame_count(), 32u);
  }
  server->request_stop();
  loop.join();
  server.reset();
  device_info after;
  ASSERT_EQ(be->get_device_info(0, &after), ok);
  EXPECT_EQ(after.free_bytes, before.free_bytes);
}

TEST_F(PoolServer, BadSizesAreRefusedByName) {
  std::unique_ptr<backend> be;
  ASSERT_EQ(make_backend(backend_kind::host, &be), ok);
  pool_server_options o;
  o.be = be.get();
  std::unique_ptr<pool_server> server;
  vramswap::detail::test::set_env("VRAMSWAP_FRAME_SIZE", "3MiB");
  clear_error();
  EXPECT_EQ(pool_server::start(o, &server), err_invalid_argument);
  EXPECT_NE(std::string(last_error()).find("VRAMSWAP_FRAME_SIZE"), std::string::npos) << last_error();
  vramswap::detail::test::set_env("VRAMSWAP_FRAME_SIZE", "2MiB");
  o.pool_size = "1TiB";
  EXPECT_EQ(pool_server::start(o, &server), err_out_of_memory);
  EXPECT_NE(std::string(last_error()).find("does not fit"), std::string::npos) << last_error();
}

// The shared host pool: too small for the pager's copies in flight, or larger than the
// host's available memory, is refused at start by name.
TEST_F(PoolServer, HostPoolTooSmallOrLargerThanRamIsRefusedByName) {
  std::unique_ptr<backend> be;
  ASSERT_EQ(make_backend(backend_kind::host, &be), ok);
  pool_server_options o;
  o.be = be.get();
  std::unique_ptr<pool_server> server;
  o.host_pool = "16MiB";  // 8 slots of 2 MiB
  EXPECT_EQ(pool_server::start(o, &server), err_invalid_argument);
  EXPECT_NE(std::string(last_error()).find("VRAMSWAP_HOST_POOL"), std::string::npos) << last_error();
  EXPECT_NE(std::string(last_error()).find("at least " + std::to_string(pool_layout::k_min_host_slots)), std::string::npos)
      << last_error();
  o.host_pool = "100%";  // of RAM: never all available
  EXPECT_EQ(pool_server::start(o, &server), err_out_of_memory);
  EXPECT_NE(std::string(last_error()).find("available memory"), std::string::npos) << last_error();
  o.host_pool = "lots";
  EXPECT_EQ(pool_server::start(o, &server), err_invalid_argument);
  EXPECT_NE(std::string(last_error()).find("--host-pool"), std::string::npos) << last_error();
}

// In-process: a server with a host pool hands its memfd to each client; the clients map the
// same memory (a byte written through one is read through the other) and the slot table.
TEST_F(PoolServer, HostPoolIsSharedByItsClients) {
  std::unique_ptr<backend> be;
  ASSERT_EQ(make_backend(backend_kind::host, &be), ok);
  vramswap::detail::test::set_env("VRAMSWAP_POOL_SIZE", "25%");
  pool_server_options o;
  o.be = be.get();
  o.host_pool = "40MiB";
  std::unique_ptr<pool_server> server;
  ASSERT_EQ(pool_server::start(o, &server), ok) << last_error();
  EXPECT_EQ(server->host_slot_count(), 20u);
  std::thread loop([&] { EXPECT_EQ(server->run(), ok); });
  {
    std::unique_ptr<pool_connection> c1, c2;
    ASSERT_EQ(pool_connection::connect(*be, 0, false, &c1), ok) << last_error();
    ASSERT_EQ(pool_connection::connect(*be, 0, false, &c2), ok) << last_error();
    ASSERT_NE(c1->host_pool(), nullptr);
    ASSERT_NE(c2->host_pool(), nullptr);
    EXPECT_NE(c1->host_pool(), c2->host_pool()) << "two mappings of one memfd";
    EXPECT_EQ(c1->host_slot_count(), 20u);
    EXPECT_EQ(c1->segment().host_slot_count(), 20u);
    EXPECT_EQ(c1->segment().host_slot_size(), 2u << 20);
    const uint64_t last = 20ull * (2u << 20) - 1;
    c1->host_pool()[last] = 0x5C;
    EXPECT_EQ(c2->host_pool()[last], 0x5C);
    EXPECT_EQ(c2->segment().count_slots(pool_layout::slot_free), 20u);
  }
  server->request_stop();
  loop.join();
}

}  // namespace
}  // namespace vramswap::detail

namespace vramswap::detail {
namespace {

// The pool segment's header as a reader sees it now: claimed, magic, server pid; false when
// there is no segment (yet).
struct header_view {
  bool claimed = false;
  uint64_t magic = 0;
  int server_pid = 0;
};
bool view_header(const std::string& path, header_view* v) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  bool seen = false;
  if (::fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= sizeof(pool_layout::pool_header)) {
    void* p = ::mmap(nullptr, sizeof(pool_layout::pool_header), PROT_READ, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) {
      const pool_layout::pool_header* h = pool_layout::header_of(p);
      v->claimed = h->claimed.load() == 1;
      v->magic = h->magic.load();
      v->server_pid = h->server_pid;
      ::munmap(p, sizeof(pool_layout::pool_header));
      seen = true;
    }
  }
  ::close(fd);
  return seen;
}

// A real vramswapd stopped (SIGSTOP) between its claim of the pool segment and its
// initialization of it, the window a large host pool opens; true once it is stopped there.
// The host pool (faulted in by the server) keeps it in the window long enough to catch it.
bool stop_in_build_window(pid_t server, const std::string& segment) {
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (std::chrono::steady_clock::now() < deadline) {
    header_view v;
    if (view_header(segment, &v) && v.claimed && v.magic == 0 && v.server_pid == server) {
      ::kill(server, SIGSTOP);
      eventually([&] { return process_state(server) == 'T'; }, 5s);
      return view_header(segment, &v) && v.magic == 0;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return false;
}

// Clients that start while the device's server builds its pool (claimed, not initialized)
// wait for it, with or without autostart, instead of starting a second server (which can
// only fail) or reading the half-made segment as a version mismatch; an observer is told
// that the server is starting, by pid.
TEST_F(PoolServer, ClientsStartingWhileTheServerBuildsItsPoolWaitForIt) {
  vramswap::detail::test::set_env("VRAMSWAP_HOST_POOL", "1GiB");
  std::string name;
  ASSERT_EQ(pool_segment::name_for("host-0", &name), ok);
  const std::string segment = dir_ + name;
  proc server = spawn({VRAMSWAP_SERVER_BINARY, "--foreground", "--ready-fd", "1"});
  ASSERT_GT(server.pid, 0);
  servers_.push_back(server.pid);
  if (!stop_in_build_window(server.pid, segment)) {
    ::kill(server.pid, SIGCONT);
    GTEST_SKIP() << "vramswapd built its pool before it could be stopped in the window";
  }
  std::unique_ptr<pool_segment> seg;
  EXPECT_EQ(pool_segment::open(name, &seg, /*read_only=*/true), err_unavailable);
  EXPECT_NE(std::string(last_error()).find("pool server pid " + std::to_string(server.pid)), std::string::npos) << last_error();
  EXPECT_NE(std::string(last_error()).find("still starting"), std::string::npos) << last_error();
  std::vector<proc*> clients;
  for (int i = 0; i < 3; ++i) clients.push_back(&client({"connect", "ready", "hold"}, dir_ + "-c" + std::to_string(i) + ".err"));
  clients.push_back(&client({"connect-noauto", "ready", "hold"}, dir_ + "-c3.err"));
  std::this_thread::sleep_for(1500ms);  // long enough for a client that does not wait to fail
  for (size_t i = 0; i < clients.size(); ++i) {
    EXPECT_EQ(::waitpid(clients[i]->pid, nullptr, WNOHANG), 0)
        << "client " << i << " did not wait for the server: " << read_file(dir_ + "-c" + std::to_string(i) + ".err");
  }
  ::kill(server.pid, SIGCONT);
  EXPECT_EQ(read_line(server, 60s).rfind("ready ", 0), 0u);
  for (size_t i = 0; i < clients.size(); ++i) {
    const std::vector<long> f = fields(read_line(*clients[i], 60s));
    ASSERT_EQ(f.size(), 3u) << "client " << i << ": " << read_file(dir_ + "-c" + std::to_string(i) + ".err");
    EXPECT_EQ(f[2], server.pid) << "client " << i << " was served by another server";
  }
  ::close(server.in);
  ::close(server.out);
  for (int i = 0; i < 4; ++i) ::unlink((dir_ + "-c" + std::to_string(i) + ".err").c_str());
}

// A server initializes its pool segment and opens its socket just after: a client that looks
// in between finds the pool built, by a live server, and nobody listening. It waits for the
// socket rather than take the server for gone (without autostart: "no pool server listens";
// after a wait for the build: "ended before it listened"). Here the test is that server: its
// segment initialized, its socket opened a moment later.
TEST_F(PoolServer, AClientThatFindsThePoolBuiltBeforeItsServerListensWaitsForIt) {
  pool_paths paths;
  ASSERT_EQ(pool_paths::make("host-0", true, &paths), ok) << last_error();
  process_identity me{};
  ASSERT_EQ(current_process(&me), ok);
  std::unique_ptr<pool_segment> seg;
  ASSERT_EQ(pool_segment::create("host-0", 4, 2 << 20, 0, me.pid, me.start_time, &seg), ok) << last_error();
  const int listener = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", paths.socket.c_str());
  std::thread opens_late([&] {
    std::this_thread::sleep_for(500ms);
    EXPECT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << std::strerror(errno);
    EXPECT_EQ(::listen(listener, 4), 0) << std::strerror(errno);
  });
  int fd = -1;
  clear_error();
  const int rc = wait_for_starting_server(paths, "host-0", 0, &fd);
  opens_late.join();
  EXPECT_EQ(rc, ok) << "a client gave up on a live server with a built pool that listens a moment later: " << last_error();
  if (fd >= 0) ::close(fd);
  ::close(listener);
  ::unlink(paths.socket.c_str());
}

// A server that dies while it builds its pool leaves a claimed, never initialized segment:
// an observer is told so by pid (not a version mismatch, never a wait), and the next client
// with autostart gets a new server, which replaces the segment.
TEST_F(PoolServer, SegmentOfAServerThatDiedWhileBuildingIsNamedAndReplaced) {
  vramswap::detail::test::set_env("VRAMSWAP_HOST_POOL", "1GiB");
  std::string name;
  ASSERT_EQ(pool_segment::name_for("host-0", &name), ok);
  const std::string segment = dir_ + name;
  proc server = spawn({VRAMSWAP_SERVER_BINARY, "--foreground", "--ready-fd", "1"});
  ASSERT_GT(server.pid, 0);
  if (!stop_in_build_window(server.pid, segment)) {
    ::kill(server.pid, SIGKILL);
    reap(server.pid);
    GTEST_SKIP() << "vramswapd built its pool before it could be stopped in the window";
  }
  ::kill(server.pid, SIGKILL);
  EXPECT_EQ(reap(server.pid), 128 + SIGKILL);
  ::close(server.in);
  ::close(server.out);
  std::unique_ptr<pool_segment> seg;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(pool_segment::open(name, &seg, /*read_only=*/true), err_unavailable);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s) << "an open waited for a dead server";
  const std::string said = last_error();
  EXPECT_NE(said.find("pool server pid " + std::to_string(server.pid)), std::string::npos) << said;
  EXPECT_NE(said.find("no longer running"), std::string::npos) << said;
  EXPECT_NE(said.find("replaces it"), std::string::npos) << said;
  vramswap::detail::test::set_env("VRAMSWAP_HOST_POOL", "0");
  vramswap::detail::test::set_env("VRAMSWAP_POOL_IDLE_EXIT", "1");  // the server this client starts leaves after the test
  proc& c = client({"connect", "ready", "hold"});
  const std::vector<long> f = fields(read_line(c, 60s));
  ASSERT_EQ(f.size(), 3u) << "the next client did not get a server";
  EXPECT_NE(f[2], server.pid);
  vramswap::detail::test::unset_env("VRAMSWAP_HOST_POOL");
}

}  // namespace
}  // namespace vramswap::detail

namespace vramswap::detail {
namespace {

// A server started with a low soft descriptor limit (a shell's, which a server started on
// demand inherits) raises it to the hard limit, and says so in its log.
TEST_F(PoolServer, ServerRaisesItsSoftDescriptorLimitToTheHardOne) {
  rlimit lim{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &lim), 0);
  if (lim.rlim_max != RLIM_INFINITY && lim.rlim_max <= 256) GTEST_SKIP() << "the hard descriptor limit is " << lim.rlim_max;
  vramswap::detail::test::set_env("VRAMSWAP_LOG", "info");  // the server's log is checked below
  const std::string err = dir_ + "-server.err";
  const std::string cmd = std::string("ulimit -Sn 256 && exec ") + VRAMSWAP_SERVER_BINARY + " --foreground --ready-fd 1";
  proc server = spawn({"/bin/sh", "-c", cmd}, err);
  ASSERT_GT(server.pid, 0);
  servers_.push_back(server.pid);
  ASSERT_EQ(read_line(server).rfind("ready ", 0), 0u) << read_file(err);
  const std::string limits = read_file("/proc/" + std::to_string(server.pid) + "/limits");
  const std::string hard = lim.rlim_max == RLIM_INFINITY ? "unlimited" : std::to_string(lim.rlim_max);
  std::istringstream lines(limits);
  std::string line;
  while (std::getline(lines, line) && line.rfind("Max open files", 0) != 0) {
  }
  std::istringstream words(line.substr(std::strlen("Max open files")));
  std::string soft_now, hard_now;
  words >> soft_now >> hard_now;
  EXPECT_EQ(soft_now, hard) << limits;
  EXPECT_NE(read_file(err).find("raised the descriptor limit (RLIMIT_NOFILE) from 256 to the hard limit " + hard), std::string::npos)
      << read_file(err);
  ::close(server.in);
  ::close(server.out);
  ::unlink(err.c_str());
}

}  // namespace
}  // namespace vramswap::detail

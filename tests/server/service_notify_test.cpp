// vramswapd under a service manager (systemd, Type=notify): with NOTIFY_SOCKET set it sends
// READY=1 (with its MAINPID) once it serves, and STOPPING=1 when SIGTERM stops it; a real
// vramswapd on the host backend, the test playing the manager's datagram socket, by path and
// in the abstract namespace. Without NOTIFY_SOCKET nothing is sent (the other suites).
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace vramswap::detail {
namespace {

class ServiceNotify : public ::testing::Test {
 protected:
  void SetUp() override {
    static int counter = 0;
    dir_ = "/tmp/vramswap-notify-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
    ASSERT_EQ(::mkdir(dir_.c_str(), 0700), 0) << dir_;
  }
  void TearDown() override {
    if (server_ > 0) {
      ::kill(server_, SIGKILL);
      ::waitpid(server_, nullptr, 0);
    }
    if (fd_ >= 0) ::close(fd_);
    (void)!std::system(("rm -rf " + dir_).c_str());
  }
  // The manager's socket: at `name` (a path, or "@..." for the abstract namespace).
  void listen_at(const std::string& name) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd_, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, name.data(), name.size());
    if (name[0] == '@') addr.sun_path[0] = '\0';
    const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size() + (name[0] == '@' ? 0 : 1));
    ASSERT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), len), 0) << name << ": " << std::strerror(errno);
    notify_socket_ = name;
  }
  void start_server() {
    std::vector<std::string> env = {"NOTIFY_SOCKET=" + notify_socket_, "VRAMSWAP_RUNTIME_DIR=" + dir_ + "/run",
                                    "VRAMSWAP_BACKEND=host", "VRAMSWAP_HOST_DEVICE_MEMORY=256MiB", "VRAMSWAP_FRAME_SIZE=2MiB",
                                    "VRAMSWAP_LOG=warn"};
    for (const char* name : {"ASAN_OPTIONS", "UBSAN_OPTIONS", "LD_LIBRARY_PATH", "PATH"}) {
      if (const char* v = std::getenv(name)) env.push_back(std::string(name) + "=" + v);
    }
    std::vector<char*> cenv;
    for (std::string& v : env) cenv.push_back(v.data());
    cenv.push_back(nullptr);
    const char* argv[] = {VRAMSWAP_SERVER_BINARY, "--foreground", nullptr};
    ASSERT_EQ(::posix_spawn(&server_, VRAMSWAP_SERVER_BINARY, nullptr, nullptr, const_cast<char**>(argv), cenv.data()), 0);
  }
  // The next datagram, or "" after `seconds`.
  std::string next_message(int seconds) const {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, seconds * 1000) != 1) return "";
    char buf[1024];
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
  }
  int stop_and_reap() {
    ::kill(server_, SIGTERM);
    int status = 0;
    ::waitpid(server_, &status, 0);
    server_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  void expect_ready_then_stopping() {
    const std::string ready = next_message(60);
    EXPECT_NE(ready.find("READY=1"), std::string::npos) << "the first message once serving: \"" << ready << "\"";
    EXPECT_NE(ready.find("MAINPID=" + std::to_string(server_) + "\n"), std::string::npos) << ready;
    EXPECT_NE(ready.find("STATUS=serving device 0"), std::string::npos) << ready;
    struct stat st {};
    EXPECT_EQ(::stat((dir_ + "/run/host-0.sock").c_str(), &st), 0) << "READY=1 only once the socket is there";
    const pid_t pid = server_;
    EXPECT_EQ(stop_and_reap(), 0) << "vramswapd " << pid << " should exit 0 on SIGTERM";
    const std::string stopping = next_message(10);
    EXPECT_NE(stopping.find("STOPPING=1"), std::string::npos) << "the message at SIGTERM: \"" << stopping << "\"";
  }

  std::string dir_;
  std::string notify_socket_;
  int fd_ = -1;
  pid_t server_ = -1;
};

TEST_F(ServiceNotify, ReadyOnceServingAndStoppingAtSigtermToASocketPath) {
  listen_at(dir_ + "/notify");
  start_server();
  expect_ready_then_stopping();
}

TEST_F(ServiceNotify, AnAbstractNotifySocketWorksToo) {
  listen_at("@vramswap-notify-test-" + std::to_string(::getpid()));
  start_server();
  expect_ready_then_stopping();
}

// A client that runs under a service manager (a Type=notify unit, podman --sdnotify) and
// starts a server: the server is not that manager's service. It must not tell it READY=1
// with its own MAINPID (which would make the manager take the server for the unit's main
// process) nor STOPPING=1, and it does not keep the client's working directory busy.
TEST_F(ServiceNotify, AServerAClientStartsTellsTheClientsServiceManagerNothing) {
  listen_at(dir_ + "/notify");
  const std::string work = dir_ + "/job-scratch";
  ASSERT_EQ(::mkdir(work.c_str(), 0700), 0);
  const std::string command = "cd " + work + " && env NOTIFY_SOCKET=" + notify_socket_ + " WATCHDOG_USEC=1000000 VRAMSWAP_RUNTIME_DIR=" +
                              dir_ + "/run VRAMSWAP_BACKEND=host VRAMSWAP_HOST_DEVICE_MEMORY=256MiB VRAMSWAP_FRAME_SIZE=2MiB "
                              "VRAMSWAP_LOG=warn " VRAMSWAP_POOL_CLIENT " connect ready";
  FILE* client = ::popen(command.c_str(), "r");
  ASSERT_NE(client, nullptr);
  char line[256] = {};
  const bool got = std::fgets(line, sizeof line, client) != nullptr;
  EXPECT_EQ(::pclose(client), 0) << line;
  ASSERT_TRUE(got) << "the client printed nothing";
  unsigned member = 0, frames = 0;
  int pid = 0;
  ASSERT_EQ(std::sscanf(line, "ready %u %u %d", &member, &frames, &pid), 3) << line;
  server_ = pid;  // killed by TearDown
  EXPECT_EQ(next_message(3), "") << "the client's service manager heard from the server it started";
  std::string environ_text;
  {
    FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/environ").c_str(), "r");
    ASSERT_NE(f, nullptr);
    for (int c; (c = std::fgetc(f)) != EOF;) environ_text.push_back(c == '\0' ? '\n' : static_cast<char>(c));
    std::fclose(f);
  }
  EXPECT_EQ(environ_text.find("NOTIFY_SOCKET="), std::string::npos) << environ_text;
  EXPECT_EQ(environ_text.find("WATCHDOG_USEC="), std::string::npos) << environ_text;
  char cwd[256] = {};
  const ssize_t n = ::readlink(("/proc/" + std::to_string(pid) + "/cwd").c_str(), cwd, sizeof cwd - 1);
  ASSERT_GT(n, 0);
  EXPECT_STREQ(cwd, "/") << "the server keeps the client's working directory busy";
  // Not our child: TearDown's waitpid does not reap it, so wait for it to go here.
  ::kill(pid, SIGKILL);
  for (int i = 0; i < 500 && ::kill(pid, 0) == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  server_ = -1;
}

}  // namespace
}  // namespace vramswap::detail

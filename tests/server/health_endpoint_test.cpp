// Description: the pool server's HTTP endpoint for container runtimes: /healthz follows the
// event loop's beat (live while it turns, 503 saying for how long once it has not turned for
// too long), /readyz (503 until the loop serves,
// while it is stalled and once the process stops), 404 and 405, HEAD, --metrics-address (bound
// where asked, a bad one refused by name); and the real vramswapd, in the foreground with a
// client attached, answering its probes and exiting 0 promptly on a real SIGTERM, its
// socket removed and its client told the server is gone.
//
// In-process cases drive a thread of their own as the "loop"; process cases run the real
// vramswapd and pool_client on the host backend. Loopback addresses only.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/status.hpp"
#include "server/metrics_endpoint.hpp"
#include "support/loopback.hpp"
#include "support/test_env.hpp"

extern char** environ;

namespace vramswap::detail {
namespace {

using namespace std::chrono_literals;

using test::http_exchange;
using test::http_reply;
using test::http_request;

bool eventually(const std::function<bool()>& predicate, std::chrono::milliseconds timeout = 10s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (predicate()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return predicate();
}

// A thread that plays the pool server's loop: it starts the endpoint, then does what it is
// told: turn (beat every 10 ms, as the real loop beats at each turn), get stuck (no beat), or end.
class fake_loop {
 public:
  enum class step { none, turn, stuck, end };

  explicit fake_loop(int stall_ms) {
    std::promise<int> started;
    auto f = started.get_future();
    thread_ = std::thread([this, stall_ms, &started] {
      auto render = [](std::string* body) {
        *body = "vramswap_test_metric 1\n";
        return true;
      };
      started.set_value(metrics_endpoint::start("0", "the test", render, &endpoint_, stall_ms));
      for (step s = step::none; s != step::end;) {
        const step told = next_.exchange(step::none);
        if (told != step::none) s = told;
        if (s == step::turn && endpoint_) endpoint_->beat();
        std::this_thread::sleep_for(10ms);
      }
    });
    start_rc = f.get();
  }
  ~fake_loop() {
    if (thread_.joinable()) join();
    endpoint_.reset();
  }
  void go(step s) { next_.store(s); }
  void join() {
    go(step::end);
    thread_.join();
  }
  uint16_t port() const { return endpoint_ ? endpoint_->port() : 0; }
  int start_rc = -1;

 private:
  std::atomic<step> next_{step::none};
  std::unique_ptr<metrics_endpoint> endpoint_;
  std::thread thread_;
};

TEST(HealthEndpoint, LivenessAndReadinessFollowTheLoopsBeat) {
  fake_loop loop(600);
  ASSERT_EQ(loop.start_rc, ok) << "the endpoint should start on 127.0.0.1: " << last_error();
  const uint16_t port = loop.port();
  // No beat yet: alive (within the stall limit of the start) but not ready.
  http_reply r = http_request(port, "GET /readyz HTTP/1.0");
  EXPECT_EQ(r.status, 503) << "/readyz before the loop's first beat should be 503; body: " << r.body;
  EXPECT_NE(r.body.find("has not begun serving"), std::string::npos) << "/readyz should say the loop is not serving yet: " << r.body;
  r = http_request(port, "GET /healthz HTTP/1.0");
  EXPECT_EQ(r.status, 200) << "/healthz within the stall limit should be 200; body: " << r.body;

  loop.go(fake_loop::step::turn);
  EXPECT_TRUE(eventually([&] { return http_request(port, "GET /readyz HTTP/1.0").status == 200; }))
      << "/readyz should turn 200 once the loop beats; last body: " << http_request(port, "GET /readyz HTTP/1.0").body;
  r = http_request(port, "GET /healthz HTTP/1.0");
  EXPECT_EQ(r.status, 200) << "/healthz with the loop turning should be 200; body: " << r.body;
  EXPECT_EQ(r.body, "ok\n") << "/healthz should answer \"ok\"";
  std::this_thread::sleep_for(900ms);
  r = http_request(port, "GET /healthz HTTP/1.0");
  EXPECT_EQ(r.status, 200) << "a loop that keeps turning past the stall limit is alive; body: " << r.body;

  // Stuck: 503 once past the limit, saying for how long.
  loop.go(fake_loop::step::stuck);
  EXPECT_EQ(http_request(port, "GET /healthz HTTP/1.0").status, 200) << "a loop that just stopped is still within the limit";
  EXPECT_TRUE(eventually([&] { return http_request(port, "GET /healthz HTTP/1.0").status == 503; }, 5s))
      << "/healthz should turn 503 once the loop has not turned for 600 ms";
  r = http_request(port, "GET /healthz HTTP/1.0");
  EXPECT_NE(r.body.find("has not turned for"), std::string::npos) << "the 503 should say why: " << r.body;
  EXPECT_NE(r.body.find("restart vramswapd"), std::string::npos) << "the 503 should say what to do: " << r.body;
  r = http_request(port, "GET /readyz HTTP/1.0");
  EXPECT_EQ(r.status, 503) << "a stalled loop is not ready; body: " << r.body;

  // Turning again: live again.
  loop.go(fake_loop::step::turn);
  EXPECT_TRUE(eventually([&] { return http_request(port, "GET /healthz HTTP/1.0").status == 200; }, 5s))
      << "/healthz should recover once the loop turns again";

  // Paths and methods.
  r = http_request(port, "GET /metrics HTTP/1.0");
  EXPECT_EQ(r.status, 200) << "/metrics should render; body: " << r.body;
  EXPECT_EQ(r.body, "vramswap_test_metric 1\n") << "/metrics should be the render function's text";
  r = http_request(port, "GET /nothing-here HTTP/1.0");
  EXPECT_EQ(r.status, 404) << "an unknown path should be 404; body: " << r.body;
  EXPECT_NE(r.body.find("/healthz"), std::string::npos) << "the 404 should list what is served: " << r.body;
  EXPECT_EQ(http_request(port, "POST /healthz HTTP/1.0").status, 405) << "a POST should be 405";
  EXPECT_EQ(http_request(port, "GET /healthz?verbose HTTP/1.0").status, 200) << "a query string should not change the path";

  // The loop's thread ends: no more beats, so not live.
  loop.join();
  EXPECT_TRUE(eventually([&] { return http_request(port, "GET /healthz HTTP/1.0").status == 503; }, 5s))
      << "/healthz should be 503 once the loop no longer turns";
}

// HEAD answers what GET would (status, Content-Length) without the body; other methods are
// 405 and say which are allowed.
TEST(HealthEndpoint, HeadAnswersWhatGetWouldWithoutTheBody) {
  fake_loop loop(30000);
  ASSERT_EQ(loop.start_rc, ok) << last_error();
  loop.go(fake_loop::step::turn);
  const uint16_t port = loop.port();
  ASSERT_TRUE(eventually([&] { return http_request(port, "GET /readyz HTTP/1.0").status == 200; }));
  for (const char* path : {"/healthz", "/readyz", "/metrics", "/nothing-here"}) {
    const std::string get = http_exchange(port, std::string("GET ") + path + " HTTP/1.0");
    const std::string head = http_exchange(port, std::string("HEAD ") + path + " HTTP/1.0");
    const size_t end = get.find("\r\n\r\n");
    ASSERT_NE(end, std::string::npos) << "GET " << path << " got no answer: " << get;
    EXPECT_EQ(head, get.substr(0, end + 4)) << "HEAD " << path << " should answer GET's status and headers, and no body";
    EXPECT_NE(head.find("Content-Length: " + std::to_string(get.size() - end - 4) + "\r\n"), std::string::npos)
        << "HEAD " << path << " should give the length of GET's body: " << head;
  }
  EXPECT_EQ(http_exchange(port, "HEAD /healthz HTTP/1.0").rfind("HTTP/1.0 200 OK\r\n", 0), 0u) << "HEAD /healthz should be 200";
  const std::string post = http_exchange(port, "POST /metrics HTTP/1.0");
  EXPECT_EQ(post.rfind("HTTP/1.0 405 ", 0), 0u) << "a POST should be 405: " << post;
  EXPECT_NE(post.find("\r\nAllow: GET, HEAD\r\n"), std::string::npos) << "a 405 should say which methods are allowed: " << post;
}

TEST(HealthEndpoint, BindsTheAddressItIsGivenAndRefusesABadOneByName) {
  clear_error();
  EXPECT_EQ(metrics_endpoint::set_address("localhost", "--metrics-address"), err_invalid_argument)
      << "a host name should be refused (nothing is resolved)";
  const std::string why = last_error();
  EXPECT_NE(why.find("\"localhost\""), std::string::npos) << "the error should quote the address: " << why;
  EXPECT_NE(why.find("--metrics-address"), std::string::npos) << "the error should name the setting: " << why;
  EXPECT_NE(why.find("0.0.0.0"), std::string::npos) << "the error should say what to give instead: " << why;
  EXPECT_EQ(metrics_endpoint::set_address("127.0.0.300", "x"), err_invalid_argument) << "an out-of-range octet should be refused";

  // 127.0.0.2 is loopback too, and not the default: the endpoint must be there, not on 127.0.0.1.
  ASSERT_EQ(metrics_endpoint::set_address("127.0.0.2", "--metrics-address"), ok) << last_error();
  {
    fake_loop loop(30000);
    ASSERT_EQ(loop.start_rc, ok) << "the endpoint should bind 127.0.0.2: " << last_error();
    loop.go(fake_loop::step::turn);
    EXPECT_TRUE(eventually([&] { return http_request(loop.port(), "GET /readyz HTTP/1.0", "127.0.0.2").status == 200; }))
        << "the endpoint should answer on 127.0.0.2";
    EXPECT_EQ(http_request(loop.port(), "GET /readyz HTTP/1.0", "127.0.0.1").status, 0)
        << "the endpoint should not listen on 127.0.0.1 when given 127.0.0.2";
  }
  ASSERT_EQ(metrics_endpoint::set_address("127.0.0.1", "the test"), ok) << last_error();
}

// --- the real vramswapd -------------------------------------------------------------------

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

pid_t spawn(const std::vector<std::string>& args, const std::string& out_file, const std::string& err_file) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, out_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&fa, 2, err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    ADD_FAILURE() << "posix_spawn " << args[0] << ": " << std::strerror(rc);
    return -1;
  }
  return pid;
}

// Exit status (128 + signal when killed); -1 when it did not end within `timeout`.
int reap(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
    if (r < 0 || std::chrono::steady_clock::now() > deadline) return -1;
    std::this_thread::sleep_for(2ms);
  }
}

class Vramswapd : public ::testing::Test {
 protected:
  void SetUp() override {
    static int counter = 0;
    const std::string tag = std::to_string(::getpid()) + "-" + std::to_string(counter++);
    dir_ = "/tmp/vramswap-healthtest-" + tag;
    test::set_env("VRAMSWAP_RUNTIME_DIR", dir_.c_str());
    test::set_env("VRAMSWAP_SHM_PREFIX", ("vshealth-" + tag + "-").c_str());
    test::set_env("VRAMSWAP_BACKEND", "host");
    test::set_env("VRAMSWAP_HOST_DEVICE_MEMORY", "256MiB");
    test::set_env("VRAMSWAP_FRAME_SIZE", "2MiB");
    test::set_env("VRAMSWAP_SERVER", VRAMSWAP_SERVER_BINARY);
    test::unset_env("VRAMSWAP_METRICS_PORT");
    test::unset_env("VRAMSWAP_POOL_SIZE");
    test::unset_env("VRAMSWAP_GROUP");
    test::set_env("VRAMSWAP_LOG", "info");  // the cases read vramswapd's info lines (CI runs at warn)
    files_ = "/tmp/vramswap-healthtest-" + tag + "-";
  }
  void TearDown() override {
    for (pid_t p : pids_) {
      ::kill(p, SIGKILL);
      reap(p, 5s);
    }
    (void)!std::system(("rm -rf " + dir_ + " " + files_ + "*").c_str());
  }
  std::string dir_;
  std::string files_;
  std::vector<pid_t> pids_;
};

TEST_F(Vramswapd, AnswersItsProbesAndExitsZeroPromptlyOnSigtermWithAClientAttached) {
  const std::string server_err = files_ + "server.err";
  const pid_t server = spawn({VRAMSWAP_SERVER_BINARY, "--foreground", "--metrics-port", "0", "--metrics-address", "127.0.0.1"},
                             "/dev/null", server_err);
  ASSERT_GT(server, 0);
  pids_.push_back(server);
  // The port: vramswapd logs "metrics at http://127.0.0.1:PORT/metrics".
  uint16_t port = 0;
  ASSERT_TRUE(eventually([&] {
    const std::string log = read_file(server_err);
    const size_t at = log.find("metrics at http://127.0.0.1:");
    if (at == std::string::npos) return false;
    port = static_cast<uint16_t>(std::atoi(log.c_str() + at + std::strlen("metrics at http://127.0.0.1:")));
    return port != 0;
  }, 20s)) << "vramswapd should log its metrics URL; its stderr: " << read_file(server_err);

  EXPECT_TRUE(eventually([&] { return http_request(port, "GET /readyz HTTP/1.0").status == 200; }))
      << "a serving vramswapd's /readyz should be 200; last body: " << http_request(port, "GET /readyz HTTP/1.0").body;
  http_reply r = http_request(port, "GET /healthz HTTP/1.0");
  EXPECT_EQ(r.status, 200) << "a serving vramswapd's /healthz should be 200; body: " << r.body;
  EXPECT_EQ(r.body, "ok\n") << "a serving vramswapd should answer \"ok\"";
  r = http_request(port, "GET /metrics HTTP/1.0");
  EXPECT_EQ(r.status, 200) << "/metrics should be 200; body: " << r.body;
  EXPECT_NE(r.body.find("vramswap_pool_frames"), std::string::npos) << "/metrics should carry the pool's gauges: " << r.body;
  EXPECT_EQ(http_request(port, "GET /favicon.ico HTTP/1.0").status, 404) << "an unknown path should be 404";

  // A client that attaches and then waits for the server to go.
  const std::string client_out = files_ + "client.out";
  const std::string client_err = files_ + "client.err";
  const pid_t client = spawn({VRAMSWAP_POOL_CLIENT, "connect-noauto", "ready", "wait-server-gone", "30"}, client_out, client_err);
  ASSERT_GT(client, 0);
  pids_.push_back(client);
  ASSERT_TRUE(eventually([&] { return read_file(client_out).find("ready ") != std::string::npos; }, 20s))
      << "the client should attach; its stderr: " << read_file(client_err);
  std::string socket_path;
  {
    const std::string log = read_file(server_err);
    const size_t at = log.find("; socket ");
    ASSERT_NE(at, std::string::npos) << "vramswapd should log its socket: " << log;
    socket_path = log.substr(at + 9, log.find_first_of(",\n", at + 9) - at - 9);
  }
  struct stat st {};
  ASSERT_EQ(::stat(socket_path.c_str(), &st), 0) << "the socket " << socket_path << " should exist while serving";

  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(server, SIGTERM), 0);
  const int rc = reap(server, 5s);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(rc, 0) << "vramswapd should exit 0 on SIGTERM within 5 s (-1: still running); its stderr: " << read_file(server_err);
  EXPECT_LT(took, 2.0) << "vramswapd should exit promptly on SIGTERM";
  pids_.erase(pids_.begin());
  const std::string log = read_file(server_err);
  EXPECT_NE(log.find("stopping on request (1 clients attached)"), std::string::npos)
      << "vramswapd should say it stopped on request with the client attached: " << log;
  EXPECT_NE(log.find("stopped; pool left for the next server"), std::string::npos) << "with a client attached, vramswapd should say it left the pool for the next server: " << log;
  EXPECT_NE(::stat(socket_path.c_str(), &st), 0) << "the socket " << socket_path << " should be removed on SIGTERM";
  EXPECT_EQ(http_request(port, "GET /healthz HTTP/1.0").status, 0) << "the endpoint should be closed after exit";

  EXPECT_EQ(reap(client, 10s), 0) << "the attached client should notice the server's end and exit 0; its stderr: "
                                  << read_file(client_err);
  pids_.clear();
  EXPECT_NE(read_file(client_out).find("server-gone"), std::string::npos) << "the client should report the server gone";
}

TEST_F(Vramswapd, RefusesABadMetricsAddressByName) {
  const std::string err = files_ + "err";
  const pid_t server = spawn({VRAMSWAP_SERVER_BINARY, "--foreground", "--metrics-port", "0", "--metrics-address", "gpu-node-1"},
                             "/dev/null", err);
  ASSERT_GT(server, 0);
  const int rc = reap(server, 10s);
  EXPECT_EQ(rc, 2) << "a bad --metrics-address is a usage error (exit 2); stderr: " << read_file(err);
  const std::string said = read_file(err);
  EXPECT_NE(said.find("\"gpu-node-1\""), std::string::npos) << "the error should quote the address: " << said;
  EXPECT_NE(said.find("not an IPv4 or IPv6 address"), std::string::npos) << "the error should say what is wrong: " << said;
  // An address this host does not have: exit 1 at start, naming it.
  const pid_t other = spawn({VRAMSWAP_SERVER_BINARY, "--foreground", "--metrics-port", "0", "--metrics-address", "192.0.2.1"},
                            "/dev/null", err);
  ASSERT_GT(other, 0);
  pids_.push_back(other);
  EXPECT_EQ(reap(other, 20s), 1) << "an address the host lacks should fail the start (exit 1); stderr: " << read_file(err);
  pids_.clear();
  EXPECT_NE(read_file(err).find("192.0.2.1"), std::string::npos) << "the error should name the address: " << read_file(err);
}

// Last: note_stopping() is process-wide and stays.
TEST(HealthEndpointStopping, ReadinessIs503OnceStopping) {
  fake_loop loop(30000);
  ASSERT_EQ(loop.start_rc, ok) << last_error();
  loop.go(fake_loop::step::turn);
  ASSERT_TRUE(eventually([&] { return http_request(loop.port(), "GET /readyz HTTP/1.0").status == 200; })) << "should be ready first";
  metrics_endpoint::note_stopping();
  const http_reply r = http_request(loop.port(), "GET /readyz HTTP/1.0");
  EXPECT_EQ(r.status, 503) << "/readyz should be 503 once stopping; body: " << r.body;
  EXPECT_NE(r.body.find("stopping"), std::string::npos) << "the 503 should say it is stopping: " << r.body;
  EXPECT_EQ(http_request(loop.port(), "GET /healthz HTTP/1.0").status, 200) << "stopping is not dead: /healthz stays 200";
}

}  // namespace
}  // namespace vramswap::detail

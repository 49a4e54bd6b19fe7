// Description: `vramswap status`, `vramswap trace` and vramswapd's metrics endpoint against a
// live multi-process scenario. session_worker clients (tests/cpp_api) over more
// than half the pool each take turns on the host backend while the tests run the real
// `vramswap` binary and scrape the real server on loopback. JSON is parsed by python3
// (json_check.py); the cases that need it skip, saying so, without it.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/status_view.hpp"
#include "lock/process_identity.hpp"
#include "core/options.hpp"
#include "core/status.hpp"
#include "pool/device_index.hpp"
#include "pool/pool_report.hpp"
#include "pool/pool_segment.hpp"
#include "pool/process_label.hpp"
#include "lock/shared_segment.hpp"
#include "support/deployment.hpp"
#include "support/loopback.hpp"

extern char** environ;

namespace vramswap::detail {
namespace {
using clock_type = std::chrono::steady_clock;
constexpr uint64_t MiB = 1ull << 20;
const std::string k_key = "host-0";

struct ran {
  int status = -1;
  std::string out, err;
};

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    deploy_.create("cli", k_key,
                   {"VRAMSWAP_BACKEND=host", "VRAMSWAP_HOST_DEVICE_MEMORY=256MiB", "VRAMSWAP_FRAME_SIZE=2MiB",
                    "VRAMSWAP_POOL_SIZE=64MiB", "VRAMSWAP_POOL_IDLE_EXIT=5", "VRAMSWAP_LOG=warn", "VRAMSWAP_SWAP_DIR=/var/tmp"});
    dir_ = deploy_.dir();
  }

  void TearDown() override {
    for (pid_t w : workers_) {
      ::kill(w, SIGKILL);
      ::waitpid(w, nullptr, 0);
    }
    deploy_.destroy();
  }

  pid_t spawn(std::vector<std::string> args, const std::vector<std::string>& extra = {}, const std::string& out_file = "",
              const std::string& err_file = "") {
    return deploy_.spawn(std::move(args), extra, out_file, err_file);
  }

  pid_t worker(uint64_t bytes, int rounds, uint64_t seed, int hold_ms, const std::vector<std::string>& extra = {},
               const std::string& err_file = "") {
    const pid_t pid = spawn({VRAMSWAP_SESSION_WORKER, std::to_string(bytes), std::to_string(rounds), std::to_string(seed), std::to_string(hold_ms)},
                            extra, "/dev/null", err_file);
    workers_.push_back(pid);
    return pid;
  }

  static int wait_for(pid_t pid) {
    int status = -1;
    EXPECT_EQ(::waitpid(pid, &status, 0), pid);
    return status;
  }

  void expect_workers_ok() {
    for (pid_t w : workers_) {
      const int status = wait_for(w);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "worker " << w << " status " << status;
    }
    workers_.clear();
  }

  ran run(std::vector<std::string> args, const std::vector<std::string>& extra = {}) {
    const std::string out = dir_ + "/out." + std::to_string(runs_++);
    const std::string err = out + ".err";
    const pid_t pid = spawn(std::move(args), extra, out, err);
    ran r;
    r.status = wait_for(pid);
    r.out = read_file(out);
    r.err = read_file(err);
    ::unlink(out.c_str());
    ::unlink(err.c_str());
    return r;
  }

  std::string file_of(const std::string& text) {
    const std::string path = dir_ + "/in." + std::to_string(runs_++);
    std::ofstream(path) << text;
    return path;
  }

  static bool have_python() {
    static const bool have = std::system("python3 -c 'import json' >/dev/null 2>&1") == 0;
    return have;
  }

  // `json` flattened by json_check.py: path -> value (strings keep their quotes).
  std::map<std::string, std::string> flatten(const std::string& json) {
    const std::string path = file_of(json);
    const ran r = run({"python3", VRAMSWAP_JSON_CHECK, "flatten", path});
    ::unlink(path.c_str());
    EXPECT_EQ(r.status, 0) << "not JSON:\n" << json;
    std::map<std::string, std::string> m;
    std::istringstream in(r.out);
    for (std::string line; std::getline(in, line);) {
      const size_t eq = line.find('=');
      if (eq != std::string::npos) m[line.substr(0, eq)] = line.substr(eq + 1);
    }
    return m;
  }

  std::map<std::string, std::string> status_json() { return flatten(run({VRAMSWAP_CLI_BINARY, "status", "--json"}).out); }

  static uint64_t num(const std::map<std::string, std::string>& m, const std::string& key) {
    auto it = m.find(key);
    return it == m.end() ? 0 : std::strtoull(it->second.c_str(), nullptr, 10);
  }
  static double real(const std::map<std::string, std::string>& m, const std::string& key) {
    auto it = m.find(key);
    return it == m.end() ? -1 : std::strtod(it->second.c_str(), nullptr);
  }

  test::deployment deploy_;
  std::string dir_;
  std::vector<pid_t> workers_;
  int runs_ = 0;
};

TEST_F(Cli, UsageErrorsAndNoDevice) {
  EXPECT_EQ(WEXITSTATUS(run({VRAMSWAP_CLI_BINARY}).status), 2);
  const ran help = run({VRAMSWAP_CLI_BINARY, "--help"});
  EXPECT_EQ(WEXITSTATUS(help.status), 0);
  EXPECT_NE(help.out.find("vramswap status"), std::string::npos);
  EXPECT_EQ(WEXITSTATUS(run({VRAMSWAP_CLI_BINARY, "status", "--bogus"}).status), 2);
  EXPECT_EQ(WEXITSTATUS(run({VRAMSWAP_CLI_BINARY, "trace"}).status), 2);
  EXPECT_EQ(WEXITSTATUS(run({VRAMSWAP_CLI_BINARY, "frobnicate"}).status), 2);
  const ran text = run({VRAMSWAP_CLI_BINARY, "status"});
  EXPECT_EQ(WEXITSTATUS(text.status), 0);
  EXPECT_NE(text.out.find("no vramswap device"), std::string::npos) << text.out;
  const ran json = run({VRAMSWAP_CLI_BINARY, "status", "--json"});
  EXPECT_NE(json.out.find("\"devices\": []"), std::string::npos) << json.out;
}

// A bad setting is refused as `vramswap status` and vramswapd start, before either does
// anything, an option that neither reads included: VRAMSWAP_PRELOAD_BACKTRACE is the preload
// shim's (and was checked by nobody before it was an option). Each exits 1 naming the
// variable, the value and what it accepts.
TEST_F(Cli, ABadSettingIsRefusedAtTheStartOfTheCommandAndOfTheServer) {
  for (const char* setting : {"VRAMSWAP_PRELOAD_BACKTRACE=yes", "VRAMSWAP_SWAP_QUEUE_DEPTH=0"}) {
    SCOPED_TRACE(setting);
    const std::string said = std::string(setting, std::strchr(setting, '=')) + "=\"" + (std::strchr(setting, '=') + 1) + "\"";
    const std::string accepted = std::strncmp(setting, "VRAMSWAP_PRELOAD", 16) == 0 ? "expected 0 or 1" : "expected a whole number from 1 to 4096";
    const ran status = run({VRAMSWAP_CLI_BINARY, "status"}, {setting});
    EXPECT_TRUE(WIFEXITED(status.status) && WEXITSTATUS(status.status) == 1) << status.status << "\n" << status.err;
    EXPECT_NE(status.err.find("vramswap status: " + said), std::string::npos) << status.err;
    EXPECT_NE(status.err.find(accepted), std::string::npos) << status.err;
    // --idle-exit: a server that failed to refuse it would not wait for this test forever.
    const ran server = run({VRAMSWAP_SERVER_BINARY, "--foreground", "--idle-exit", "1"}, {setting});
    EXPECT_TRUE(WIFEXITED(server.status) && WEXITSTATUS(server.status) == 1) << server.status << "\n" << server.err;
    EXPECT_NE(server.err.find("vramswapd: " + said), std::string::npos) << server.err;
    EXPECT_NE(server.err.find(accepted), std::string::npos) << server.err;
  }
  const ran good = run({VRAMSWAP_CLI_BINARY, "status"}, {"VRAMSWAP_PRELOAD_BACKTRACE=1"});
  EXPECT_TRUE(WIFEXITED(good.status) && WEXITSTATUS(good.status) == 0) << good.err;
}

// Three processes over half the pool each take turns; while one holds, the others queue.
TEST_F(Cli, StatusShowsPoolHolderQueueAndPerProcessBytes) {
  if (!have_python()) GTEST_SKIP() << "python3 is not available to parse the JSON";
  std::set<std::string> pids;
  for (int i = 0; i < 3; ++i) pids.insert(std::to_string(worker(40 * MiB, 3, 10 + i, 700)));
  // Wait for a moment with a holder and two waiters.
  std::map<std::string, std::string> s;
  const auto deadline = clock_type::now() + std::chrono::seconds(20);
  while (clock_type::now() < deadline) {
    s = status_json();
    if (num(s, "devices.#") == 1 && s.count("devices.0.holder.pid") && num(s, "devices.0.queue.#") == 2 &&
        s["devices.0.holder.phase"] == "\"running\"")
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(num(s, "devices.0.queue.#"), 2u) << "never saw a holder and two waiters";
  EXPECT_EQ(s["devices.0.key"], "\"host-0\"");
  EXPECT_EQ(num(s, "devices.0.pool_bytes"), 64 * MiB);
  EXPECT_EQ(num(s, "devices.0.frame_size"), 2 * MiB);
  EXPECT_EQ(num(s, "devices.0.frame_count"), 32u);
  const uint64_t free_frames = num(s, "devices.0.frames.free");
  EXPECT_EQ(free_frames + num(s, "devices.0.frames.active") + num(s, "devices.0.frames.idle") + num(s, "devices.0.frames.requested") +
                num(s, "devices.0.frames.lent"),
            32u);
  EXPECT_EQ(num(s, "devices.0.frames.lent"), 0u);       // nobody oversubscribed here
  EXPECT_EQ(num(s, "devices.0.host_pool.slots"), 0u);   // no shared host pool either
  EXPECT_EQ(num(s, "devices.0.host_pool.used"), 0u);
  EXPECT_EQ(num(s, "devices.0.free_bytes"), free_frames * 2 * MiB);
  const std::string holder = s["devices.0.holder.pid"];
  EXPECT_TRUE(pids.count(holder)) << holder;
  EXPECT_EQ(s["devices.0.holder.command"].rfind("\"session_worker 41943040 3 ", 0), 0u) << s["devices.0.holder.command"];
  EXPECT_GE(real(s, "devices.0.holder.held_seconds"), 0.0);
  std::set<std::string> waiting;
  for (int i = 0; i < 2; ++i) {
    const std::string q = "devices.0.queue." + std::to_string(i) + ".";
    waiting.insert(s[q + "pid"]);
    EXPECT_EQ(s[q + "priority"], "\"normal\"");
    EXPECT_GE(real(s, q + "waiting_seconds"), 0.0);
    EXPECT_EQ(s[q + "command"].rfind("\"session_worker ", 0), 0u) << s[q + "command"];
  }
  EXPECT_EQ(waiting.size(), 2u);
  EXPECT_FALSE(waiting.count(holder));
  for (const std::string& w : waiting) EXPECT_TRUE(pids.count(w)) << w;
  ASSERT_EQ(num(s, "devices.0.processes.#"), 3u);
  for (int i = 0; i < 3; ++i) {
    const std::string p = "devices.0.processes." + std::to_string(i) + ".";
    EXPECT_TRUE(pids.count(s[p + "pid"]));
    if (s[p + "pid"] == holder) {
      EXPECT_EQ(s[p + "holding"], "True");  // python prints booleans so
      EXPECT_EQ(num(s, p + "resident_bytes"), num(s, p + "frames") * 2 * MiB);
      EXPECT_GE(num(s, p + "resident_bytes"), 40 * MiB) << "the running holder has all its memory resident";
      EXPECT_GE(num(s, p + "acquires"), 1u);
    } else {
      EXPECT_EQ(s[p + "phase"], "\"waiting\"");
    }
  }
  // The text form of a moment later (the holder may have changed since): one of the workers
  // holds or is between turns, and every worker is listed.
  const ran text = run({VRAMSWAP_CLI_BINARY, "status"});
  EXPECT_NE(text.out.find("device 0 \xC2\xB7 host-0 \xC2\xB7 pool 64 MiB (32 frames of 2 MiB)"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("queue: "), std::string::npos) << text.out;
  for (const std::string& p : pids) EXPECT_NE(text.out.find(" " + p + "  "), std::string::npos) << text.out;

  // After a few turns, memory has moved: saved pages in host memory, bytes copied both ways.
  uint64_t host = 0, out = 0, in = 0, swaps = 0, pinned_short = 0;
  const auto later = clock_type::now() + std::chrono::seconds(20);
  while (clock_type::now() < later && (host == 0 || out == 0 || in == 0 || swaps == 0)) {
    s = status_json();
    host = out = in = swaps = pinned_short = 0;
    for (int i = 0; i < static_cast<int>(num(s, "devices.0.processes.#")); ++i) {
      const std::string p = "devices.0.processes." + std::to_string(i) + ".";
      host += num(s, p + "host_bytes");
      // A process's saved pages lie in host memory it pinned (its own tier, no shared pool here).
      if (num(s, p + "host_pinned_bytes") < num(s, p + "host_bytes")) ++pinned_short;
      out += num(s, p + "bytes_out");
      in += num(s, p + "bytes_in");
      swaps += num(s, p + "swaps_in");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_GT(host, 0u);
  EXPECT_EQ(pinned_short, 0u) << "a process reports fewer pinned host bytes than the saved pages it holds in host memory";
  EXPECT_GT(out, 0u);
  EXPECT_GT(in, 0u);
  // The lock's hold statistics: the workers hold for 700 ms a turn.
  EXPECT_GE(real(s, "devices.0.holds.mean_seconds"), 0.3) << "the lock's mean hold, after several 700 ms holds";
  EXPECT_LT(real(s, "devices.0.holds.mean_seconds"), 10.0);
  EXPECT_TRUE(s["devices.0.holds.predictable"] == "True" || s["devices.0.holds.predictable"] == "False");
  EXPECT_NE(run({VRAMSWAP_CLI_BINARY, "status"}).out.find("holds last "), std::string::npos);
  EXPECT_GT(swaps, 0u);
  expect_workers_ok();
}

// A trace recorded while two processes take turns parses and holds their events in order.
TEST_F(Cli, TraceHoldsEveryProcessesEventsInOrder) {
  if (!have_python()) GTEST_SKIP() << "python3 is not available to parse the JSON";
  const std::string trace = dir_ + "/trace.json";
  // No --seconds: stopped with SIGINT once the workers are done (the flush-on-signal path).
  const pid_t tracer = spawn({VRAMSWAP_CLI_BINARY, "trace", "--out", trace}, {}, "/dev/null", "/dev/null");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const pid_t a = worker(40 * MiB, 3, 20, 100);
  const pid_t b = worker(40 * MiB, 3, 21, 100);
  expect_workers_ok();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // a few polls
  ::kill(tracer, SIGINT);
  const int status = wait_for(tracer);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(WEXITSTATUS(run({"python3", "-m", "json.tool", trace}).status), 0) << "not JSON";
  const ran check = run({"python3", VRAMSWAP_JSON_CHECK, "trace", trace, std::to_string(a), std::to_string(b)});
  ASSERT_EQ(WEXITSTATUS(check.status), 0) << check.out;
  // Each worker: 3 acquires, 3 grants, 3 releases, 3 bring-ins; between them, evictions.
  uint64_t evict_bytes = 0, in_bytes = 0;
  std::istringstream lines(check.out);
  for (std::string line; std::getline(lines, line);) {
    EXPECT_NE(line.find("asked=3 granted=3 released=3 bring_in=3"), std::string::npos) << line;
    evict_bytes += std::strtoull(line.substr(line.find("evict_bytes=") + 12).c_str(), nullptr, 10);
    in_bytes += std::strtoull(line.substr(line.find("bring_in_bytes=") + 15).c_str(), nullptr, 10);
  }
  EXPECT_GT(evict_bytes, 0u) << check.out;
  EXPECT_GT(in_bytes, 0u) << check.out;
  std::ifstream f(trace);
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_NE(ss.str().find("\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + std::to_string(a) + ","), std::string::npos) << ss.str();
  // Each process is named by its command line (its job name when it has one).
  EXPECT_NE(ss.str().find("\"args\":{\"name\":\"session_worker 41943040 3 20 100\"}"), std::string::npos);
}

std::string http_get(uint16_t port, const std::string& path) { return test::http_exchange(port, "GET " + path + " HTTP/1.0"); }

TEST_F(Cli, MetricsEndpointScrapesOnLoopback) {
  const std::string k_worker_series = "vramswap_process_resident_bytes{gpu=\"0\",UUID=\"host-0\",job_name=\"session_worker\",member=\"";
  const std::vector<std::string> metrics = {"VRAMSWAP_METRICS_PORT=0"};
  worker(40 * MiB, 2, 30, 600, metrics);
  worker(40 * MiB, 2, 31, 600, metrics);
  std::string name;
  ASSERT_EQ(pool_segment::name_for(k_key, &name), ok);
  std::unique_ptr<pool_segment> pool;
  uint16_t port = 0;
  std::string body;
  const auto deadline = clock_type::now() + std::chrono::seconds(20);
  while (clock_type::now() < deadline) {
    if (!pool && pool_segment::open(name, &pool, true) != ok) pool.reset();
    if (pool) port = static_cast<uint16_t>(pool->header()->metrics_port.load());
    if (port != 0) {
      body = http_get(port, "/metrics");
      // Both workers attached: two series of their job, one per member slot.
      size_t series = 0;
      for (size_t at = 0; (at = body.find(k_worker_series, at)) != std::string::npos; ++at) ++series;
      if (series == 2) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_NE(port, 0) << "the server published no metrics port";
  EXPECT_EQ(body.rfind("HTTP/1.0 200 OK\r\n", 0), 0u) << body;
  EXPECT_NE(body.find("Content-Type: text/plain; version=0.0.4"), std::string::npos);
  const std::string text = body.substr(body.find("\r\n\r\n") + 4);
  // Text format: every sample's family has # HELP and # TYPE lines before it.
  std::set<std::string> typed;
  std::istringstream in(text);
  int samples = 0;
  const std::regex sample(R"(^([a-z_]+)\{([A-Za-z_]+="[^"]*"(,[A-Za-z_]+="[^"]*")*)\} (-?[0-9.e+-]+)$)");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("# HELP ", 0) == 0) continue;
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream t(line.substr(7));
      std::string family, type;
      t >> family >> type;
      EXPECT_TRUE(type == "gauge" || type == "counter" || type == "histogram") << line;
      EXPECT_TRUE(type != "counter" || family.size() > 6) << line;
      typed.insert(family);
      continue;
    }
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, sample)) << "not a sample line: " << line;
    const std::string sample_name = m[1].str();
    const std::string family = std::regex_replace(sample_name, std::regex("_(bucket|sum|count)$"), "");
    EXPECT_TRUE(typed.count(sample_name) || typed.count(family)) << "no # TYPE before " << line;
    ++samples;
  }
  EXPECT_GT(samples, 20);
  EXPECT_NE(text.find("vramswap_pool_frames{gpu=\"0\",UUID=\"host-0\"} 32\n"), std::string::npos) << text;
  EXPECT_NE(text.find("vramswap_pool_bytes{gpu=\"0\",UUID=\"host-0\"} 67108864\n"), std::string::npos);
  EXPECT_NE(text.find("vramswap_process_acquires_total{gpu=\"0\",UUID=\"host-0\",job_name=\"session_worker\",member=\""),
            std::string::npos);
  EXPECT_EQ(text.find("pid=\""), std::string::npos) << "processes are labelled by job and member slot, not pid";
  EXPECT_NE(text.find("# TYPE vramswap_lock_wait_seconds histogram"), std::string::npos);
  EXPECT_NE(text.find("# TYPE vramswap_process_bytes_in_total counter"), std::string::npos);
  EXPECT_EQ(http_get(port, "/nope").rfind("HTTP/1.0 404", 0), 0u);
  // `vramswap status` shows where the metrics are.
  EXPECT_NE(run({VRAMSWAP_CLI_BINARY, "status"}).out.find("metrics http://127.0.0.1:" + std::to_string(port) + "/metrics"),
            std::string::npos);
  expect_workers_ok();
}

// VRAMSWAP_LOG=debug: lines carry the time, the pid and the device; each is one line.
TEST_F(Cli, LogLinesCarryTimePidAndDevice) {
  const std::string err = dir_ + "/worker.err";
  // Allocating under the lock (the worker's fifth argument), so that malloc backs pages itself.
  const pid_t w = spawn({VRAMSWAP_SESSION_WORKER, std::to_string(4 * MiB), "2", "40", "0", "alloc-under-lock"}, {"VRAMSWAP_LOG=debug"},
                        "/dev/null", err);
  workers_.push_back(w);
  expect_workers_ok();
  std::ifstream f(err);
  const std::regex line_re(R"(^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z vramswap\[(\d+)\] dev (\d+|-) (error|warn|info|debug): .+$)");
  // Where a start and an allocation went: the session's parts and the pager's, each a number.
  const std::regex opened_re(R"(debug: session: device 0 opened in [\d.]+ ms \(joining the pool [\d.]+, .+\)$)");
  const std::regex malloc_re(R"(debug: pager: malloc\(\d+ bytes\): \d+ page\(s\) backed in [\d.]+ ms \(asking for frames [\d.]+, )"
                             R"(waiting for them [\d.]+, mapping [\d.]+, granting access [\d.]+\)$)");
  int granted = 0, lines = 0, opened = 0, mallocs = 0;
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("session_worker", 0) == 0) continue;  // the worker's own output
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, line_re)) << line;
    EXPECT_EQ(m[1].str(), std::to_string(w));
    ++lines;
    if (line.find(" dev 0 debug: acquire: lock granted after ") != std::string::npos) ++granted;
    opened += std::regex_search(line, opened_re);
    mallocs += std::regex_search(line, malloc_re);
  }
  EXPECT_GT(lines, 0);
  EXPECT_EQ(granted, 3);  // one turn to allocate, then its two rounds
  EXPECT_EQ(opened, 1);
  EXPECT_GE(mallocs, 1);
}

// Columns a line takes on a terminal (UTF-8 characters; an escape sequence takes none).
size_t screen_columns(const std::string& line) {
  size_t n = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    if (line[i] == '\033') {
      while (i < line.size() && !std::isalpha(static_cast<unsigned char>(line[i]))) ++i;
      continue;
    }
    n += (static_cast<unsigned char>(line[i]) & 0xC0) != 0x80 ? 1 : 0;
  }
  return n;
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

// Two jobs take turns, one named by VRAMSWAP_JOB_NAME: the status names each by user, job
// name or command line, numbers the device, says how long the waiter has waited and behind
// whom, and fits 100 columns; --device takes the number, the key or a prefix, in both forms.
TEST_F(Cli, StatusNamesJobsUsersAndWhomEachWaiterWaitsBehind) {
  if (!have_python()) GTEST_SKIP() << "python3 is not available to parse the JSON";
  const pid_t a = worker(40 * MiB, 2, 50, 1000, {"VRAMSWAP_JOB_NAME=train-llama"});
  const pid_t b = worker(40 * MiB, 2, 51, 1000);
  const std::string me = user_name(::geteuid());
  std::map<std::string, std::string> s;
  const auto deadline = clock_type::now() + std::chrono::seconds(30);
  while (clock_type::now() < deadline) {
    s = status_json();
    if (s["devices.0.holder.phase"] == "\"running\"" && num(s, "devices.0.queue.#") == 1 && num(s, "devices.0.processes.#") == 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(num(s, "devices.0.queue.#"), 1u) << "never saw one job holding while the other waits";
  const pid_t holder = static_cast<pid_t>(num(s, "devices.0.holder.pid"));
  const pid_t waiter = holder == a ? b : a;
  ASSERT_TRUE(holder == a || holder == b) << holder;
  auto command_of_worker = [&](pid_t w) { return std::string("session_worker 41943040 2 ") + (w == a ? "50" : "51") + " 1000"; };
  EXPECT_EQ(num(s, "devices.0.index"), 0u);
  EXPECT_EQ(s["devices.0.server.state"], "\"running\"");
  EXPECT_EQ(s["devices.0.holder.user"], "\"" + me + "\"");
  EXPECT_EQ(s["devices.0.holder.command"], "\"" + command_of_worker(holder) + "\"");
  EXPECT_EQ(s["devices.0.holder.job"], holder == a ? "\"train-llama\"" : "None");
  EXPECT_EQ(num(s, "devices.0.queue.0.pid"), static_cast<uint64_t>(waiter));
  EXPECT_EQ(num(s, "devices.0.queue.0.position"), 1u);
  EXPECT_EQ(num(s, "devices.0.queue.0.behind_pid"), static_cast<uint64_t>(holder));
  EXPECT_GT(real(s, "devices.0.queue.0.waiting_seconds"), 0.0);
  EXPECT_EQ(s["devices.0.queue.0.user"], "\"" + me + "\"");
  EXPECT_EQ(s["devices.0.queue.0.job"], waiter == a ? "\"train-llama\"" : "None");
  for (int i = 0; i < 2; ++i) {
    const std::string p = "devices.0.processes." + std::to_string(i) + ".";
    const pid_t pid = static_cast<pid_t>(num(s, p + "pid"));
    EXPECT_EQ(s[p + "user"], "\"" + me + "\"");
    EXPECT_EQ(num(s, p + "uid"), ::geteuid());
    EXPECT_EQ(s[p + "comm"], "\"session_worker\"");
    EXPECT_EQ(s[p + "command"], "\"" + command_of_worker(pid) + "\"");
    EXPECT_EQ(s[p + "job"], pid == a ? "\"train-llama\"" : "None");
    EXPECT_GE(real(s, p + "lock_wait_seconds"), 0.0) << "times are in seconds";
    EXPECT_EQ(s.count(p + "lock_wait_ns"), 0u) << "one unit per kind: no nanoseconds beside the seconds";
  }

  // The text: the same facts, in at most 100 columns.
  const ran text = run({VRAMSWAP_CLI_BINARY, "status"});
  ASSERT_EQ(WEXITSTATUS(text.status), 0) << text.err;
  std::istringstream lines(text.out);
  for (std::string line; std::getline(lines, line);) EXPECT_LE(screen_columns(line), 100u) << "too wide:\n" << line << "\n" << text.out;
  EXPECT_NE(text.out.find("device 0 \xC2\xB7 host-0 \xC2\xB7 pool "), std::string::npos) << text.out;
  EXPECT_EQ(text.out.find("\033["), std::string::npos) << "no color when stdout is no terminal";
  EXPECT_NE(text.out.find("PID  USER"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("JOB / COMMAND"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("train-llama"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find(command_of_worker(b)), std::string::npos) << text.out;
  // The holder may have changed since the JSON: whoever waits now waits behind the other.
  const std::string behind_a = "behind pid " + std::to_string(a) + " (train-llama)";
  const std::string behind_b = "behind pid " + std::to_string(b) + " (session_worker";
  EXPECT_TRUE(text.out.find(behind_a) != std::string::npos || text.out.find(behind_b) != std::string::npos ||
              text.out.find("queue: 0 waiting") != std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find(" waiting "), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("(" + me + ")"), std::string::npos) << text.out;

  // --device: the number, the key or a prefix of it; "--device KEY" and "--device=KEY".
  for (const std::vector<std::string>& args : {std::vector<std::string>{"--device", "0"}, {"--device=0"}, {"--device", "host-0"},
                                                {"--device=host"}}) {
    std::vector<std::string> cmd = {VRAMSWAP_CLI_BINARY, "status"};
    cmd.insert(cmd.end(), args.begin(), args.end());
    const ran r = run(cmd);
    EXPECT_EQ(WEXITSTATUS(r.status), 0) << args[0] << "\n" << r.err;
    EXPECT_NE(r.out.find("device 0 \xC2\xB7 host-0"), std::string::npos) << args[0] << "\n" << r.out;
  }
  const ran unknown = run({VRAMSWAP_CLI_BINARY, "status", "--device", "7"});
  EXPECT_EQ(WEXITSTATUS(unknown.status), 1);
  EXPECT_NE(unknown.err.find("no device \"7\": the devices with a vramswap pool are 0 (host-0)"), std::string::npos) << unknown.err;
  const ran unknown_key = run({VRAMSWAP_CLI_BINARY, "status", "--device=GPU-0000"});
  EXPECT_EQ(WEXITSTATUS(unknown_key.status), 1);
  EXPECT_NE(unknown_key.err.find("0 (host-0)"), std::string::npos) << unknown_key.err;
  expect_workers_ok();
}

// The command line's conventions: help everywhere, conflicting or malformed flags are usage
// errors (exit 2) that say what is wrong.
TEST_F(Cli, HelpAndConflictingFlags) {
  for (const std::vector<std::string>& args : {std::vector<std::string>{"status", "--help"}, {"help", "status"}, {"status", "-h"}}) {
    std::vector<std::string> cmd = {VRAMSWAP_CLI_BINARY};
    cmd.insert(cmd.end(), args.begin(), args.end());
    const ran r = run(cmd);
    EXPECT_EQ(WEXITSTATUS(r.status), 0) << args[0] << " " << args[1];
    EXPECT_NE(r.out.find("usage: vramswap status [--json | --prometheus] [--device KEY] [--watch [SECONDS]]"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("--watch"), std::string::npos) << r.out;
  }
  const ran top = run({VRAMSWAP_CLI_BINARY, "--help"});
  EXPECT_EQ(WEXITSTATUS(top.status), 0);
  EXPECT_NE(top.out.find("usage: vramswap status"), std::string::npos) << top.out;
  EXPECT_NE(top.out.find("vramswap trace --out FILE"), std::string::npos) << top.out;
  const ran trace_help = run({VRAMSWAP_CLI_BINARY, "help", "trace"});
  EXPECT_NE(trace_help.out.find("usage: vramswap trace --out FILE"), std::string::npos) << trace_help.out;

  struct usage_error {
    std::vector<std::string> args;
    std::string says;
  };
  for (const usage_error& u : std::vector<usage_error>{
           {{"status", "--json", "--prometheus"}, "vramswap status: --json excludes --prometheus: give one of them"},
           {{"status", "--prometheus", "--json"}, "excludes"},
           {{"status", "--watch", "--prometheus"}, "excludes"},
           {{"status", "--watch", "soon"}, "--watch: SECONDS is a number from 0.1 to 86400, not \"soon\""},
           {{"status", "--color=purple"}, "--color"},
           {{"status", "--device"}, "--device"},
           {{"status", "--bogus"}, "--bogus"},
           {{"trace"}, "--out is required"},
           {{"help", "frobnicate"}, "frobnicate"},
       }) {
    std::vector<std::string> cmd = {VRAMSWAP_CLI_BINARY};
    cmd.insert(cmd.end(), u.args.begin(), u.args.end());
    const ran r = run(cmd);
    std::string joined;
    for (const auto& a : u.args) joined += " " + a;
    EXPECT_TRUE(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 2) << "vramswap" << joined << ": status " << r.status;
    EXPECT_NE(r.err.find(u.says), std::string::npos) << "vramswap" << joined << ":\n" << r.err;
    EXPECT_NE(r.err.find("--help` for usage"), std::string::npos) << r.err;
  }
  const ran no_device = run({VRAMSWAP_CLI_BINARY, "status", "--device=0"});
  EXPECT_EQ(WEXITSTATUS(no_device.status), 1);
  EXPECT_NE(no_device.err.find("no device \"0\": no device has a vramswap pool in " + dir_), std::string::npos) << no_device.err;
}

// --watch redraws until SIGTERM or Ctrl-C, then exits 0: into a file, one screen after
// another under a header (and JSON Lines with --json); on a terminal, in the alternate
// screen, redrawn in place from the top left corner, the terminal given back at the end.
TEST_F(Cli, WatchRefreshesUntilSignalled) {
  const pid_t w = worker(4 * MiB, 1, 70, 6000);  // a device to watch, holding for a while
  const std::string out = dir_ + "/watch.out";
  auto wait_until = [&](const std::function<bool()>& done) {
    const auto deadline = clock_type::now() + std::chrono::seconds(30);
    while (!done() && clock_type::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return done();
  };
  ASSERT_TRUE(wait_until([&] { return run({VRAMSWAP_CLI_BINARY, "status"}).out.find("holder: pid " + std::to_string(w)) != std::string::npos; }));

  // Into a file.
  pid_t watcher = spawn({VRAMSWAP_CLI_BINARY, "status", "--watch", "0.2"}, {}, out, "/dev/null");
  EXPECT_TRUE(wait_until([&] { return count_of(read_file(out), "Every 0.2s: vramswap status") >= 2; })) << read_file(out);
  ::kill(watcher, SIGTERM);
  int status = wait_for(watcher);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  std::string text = read_file(out);
  EXPECT_GE(count_of(text, "holder: pid " + std::to_string(w)), 2u) << text;
  EXPECT_EQ(text.find('\033'), std::string::npos) << "escape sequences in a file";

  // JSON Lines.
  watcher = spawn({VRAMSWAP_CLI_BINARY, "status", "--json", "--watch=0.2"}, {}, out, "/dev/null");
  EXPECT_TRUE(wait_until([&] { return count_of(read_file(out), "{\"version\":2,\"devices\":[{\"key\":\"host-0\"") >= 2; })) << read_file(out);
  ::kill(watcher, SIGINT);
  status = wait_for(watcher);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  text = read_file(out);
  EXPECT_EQ(count_of(text, "\n"), count_of(text, "{\"version\":2,")) << "one document a line:\n" << text;

  // On a terminal (a pty whose other end this test reads).
  const int master = ::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  ASSERT_GE(master, 0) << std::strerror(errno);
  ASSERT_EQ(::grantpt(master), 0);
  ASSERT_EQ(::unlockpt(master), 0);
  char slave[64];
  ASSERT_EQ(::ptsname_r(master, slave, sizeof slave), 0);
  watcher = spawn({VRAMSWAP_CLI_BINARY, "status", "--watch", "0.2"}, {"TERM=xterm", "NO_COLOR="}, slave, "/dev/null");
  std::string screen;
  auto drain = [&](int wait_ms) {
    pollfd p{master, POLLIN, 0};
    char buf[4096];
    while (::poll(&p, 1, wait_ms) > 0) {
      const ssize_t n = ::read(master, buf, sizeof buf);
      if (n <= 0) return false;  // EIO: the terminal's last writer is gone
      screen.append(buf, static_cast<size_t>(n));
    }
    return true;
  };
  const auto deadline = clock_type::now() + std::chrono::seconds(30);
  while (count_of(screen, "Every 0.2s: vramswap status") < 2 && clock_type::now() < deadline) drain(50);
  ::kill(watcher, SIGINT);
  status = wait_for(watcher);
  while (drain(100)) {
  }
  ::close(master);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_GE(count_of(screen, "Every 0.2s: vramswap status"), 2u) << screen;
  EXPECT_EQ(screen.rfind("\033[?1049h", 0), 0u) << "the alternate screen first";
  EXPECT_GE(count_of(screen, "\033[H"), 2u) << "each screen drawn from the top left corner";
  EXPECT_GE(count_of(screen, "\033[J"), 2u) << "what is below each screen cleared";
  EXPECT_NE(screen.find("\033[32mrunning"), std::string::npos) << "a running holder in green on a terminal";
  EXPECT_NE(screen.find("\033[?25h\033[?1049l"), std::string::npos) << "the cursor and the screen given back at the end";
  // The worker, still holding, is killed by TearDown: nothing here waits for its turn to end.
}

// A daemon killed with SIGKILL leaves its pool segment: status says it is not running (not
// its old pid), and a client that has exited since is not listed, only counted.
TEST_F(Cli, DeadDaemonIsFlaggedAndExitedClientsAreNotListed) {
  if (!have_python()) GTEST_SKIP() << "python3 is not available to parse the JSON";
  const pid_t a = worker(4 * MiB, 1, 80, 8000);
  const pid_t b = worker(4 * MiB, 1, 81, 8000);
  std::map<std::string, std::string> s;
  const auto deadline = clock_type::now() + std::chrono::seconds(30);
  while (clock_type::now() < deadline) {
    s = status_json();
    if (num(s, "devices.0.processes.#") == 2 && s.count("devices.0.holder.pid")) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(num(s, "devices.0.processes.#"), 2u);
  const pid_t server = static_cast<pid_t>(num(s, "devices.0.server.pid"));
  ASSERT_GT(server, 0);
  // Both jobs stopped first: a job whose daemon dies starts the next one (the pool is
  // adopted), and this test looks at the time in between.
  const pid_t holder = static_cast<pid_t>(num(s, "devices.0.holder.pid"));
  const pid_t waiter = holder == a ? b : a;
  ASSERT_EQ(::kill(holder, SIGSTOP), 0);
  ASSERT_EQ(::kill(waiter, SIGSTOP), 0);
  ASSERT_EQ(::kill(server, SIGKILL), 0);
  // The daemon was started on demand (detached): gone once its /proc entry is.
  const auto gone = clock_type::now() + std::chrono::seconds(10);
  while (::kill(server, 0) == 0 && clock_type::now() < gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  // The waiter exits (killed) while no daemon is there to repair its slot.
  ::kill(waiter, SIGKILL);
  wait_for(waiter);
  workers_.erase(std::find(workers_.begin(), workers_.end(), waiter));

  s = status_json();
  EXPECT_EQ(s["devices.0.server.state"], "\"dead\"");
  EXPECT_EQ(s["devices.0.server.pid"], "None");
  EXPECT_EQ(s["devices.0.server.metrics_port"], "None");
  EXPECT_GE(num(s, "devices.0.exited_processes"), 1u);
  for (int i = 0; i < static_cast<int>(num(s, "devices.0.processes.#")); ++i) {
    EXPECT_NE(num(s, "devices.0.processes." + std::to_string(i) + ".pid"), static_cast<uint64_t>(waiter)) << "an exited client is listed";
  }
  // Nor is it in the queue, though no waiter is left to run the lock's liveness scan.
  for (int i = 0; i < static_cast<int>(num(s, "devices.0.queue.#")); ++i) {
    EXPECT_NE(num(s, "devices.0.queue." + std::to_string(i) + ".pid"), static_cast<uint64_t>(waiter)) << "an exited waiter is queued";
  }
  ran text = run({VRAMSWAP_CLI_BINARY, "status"});
  EXPECT_NE(text.out.find("daemon: NOT RUNNING (vramswapd died"), std::string::npos) << text.out;
  EXPECT_EQ(text.out.find("pid " + std::to_string(server)), std::string::npos) << "the dead daemon's pid is shown:\n" << text.out;
  EXPECT_EQ(text.out.find("daemon: pid"), std::string::npos) << text.out;
  EXPECT_EQ(text.out.find("pid " + std::to_string(waiter) + " "), std::string::npos) << "the exited client is queued:\n" << text.out;
  EXPECT_EQ(text.out.find(" " + std::to_string(waiter) + "  "), std::string::npos) << "the exited client is listed:\n" << text.out;
  EXPECT_NE(text.out.find("exited process"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("the next daemon frees what they held"), std::string::npos) << text.out;

  // The holder exits too: nobody holds the lock any more, and status says whose it was.
  ::kill(holder, SIGKILL);
  wait_for(holder);
  workers_.erase(std::find(workers_.begin(), workers_.end(), holder));
  s = status_json();
  EXPECT_EQ(s["devices.0.holder"], "None");
  EXPECT_EQ(num(s, "devices.0.processes.#"), 0u);
  EXPECT_EQ(num(s, "devices.0.exited_processes"), 2u);
  EXPECT_GT(num(s, "devices.0.exited_frames"), 0u) << "the holder's frames are its own until a daemon repairs it";
  text = run({VRAMSWAP_CLI_BINARY, "status"});
  EXPECT_NE(text.out.find("holder: none (pid " + std::to_string(holder) + " exited holding the lock"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("2 exited processes left"), std::string::npos) << text.out;
}

// How processes and devices are named, from real inputs of each kind: command lines as
// /proc/<pid>/cmdline holds them, cgroup files as docker, podman, the kubelet and slurmd
// leave them, and a /proc/driver/nvidia tree laid out as the driver lays it out.
// The daemon's metrics URL names the address its endpoint listens on; a port with no
// listener in this network namespace is said to be elsewhere, with no URL that would fail.
TEST(StatusView, TheMetricsUrlIsWhereTheEndpointListensOrNone) {
  device_report d;
  d.key = "host-0";
  d.server_pid = 4242;
  d.metrics_port = 41577;
  d.metrics_host = "127.0.0.2";
  EXPECT_NE(render_text({d}).find("daemon: pid 4242 \xC2\xB7 metrics http://127.0.0.2:41577/metrics"), std::string::npos)
      << render_text({d});
  EXPECT_NE(render_json({d}, false).find("\"metrics_url\":\"http://127.0.0.2:41577/metrics\""), std::string::npos)
      << render_json({d}, false);
  d.metrics_host.clear();
  EXPECT_NE(render_text({d}).find("metrics on port 41577 (not listening in this network namespace)"), std::string::npos)
      << render_text({d});
  EXPECT_EQ(render_text({d}).find("http://"), std::string::npos) << render_text({d});
  EXPECT_NE(render_json({d}, false).find("\"metrics_url\":null"), std::string::npos) << render_json({d}, false);
}

TEST(StatusNames, CommandLinesContainersAndDeviceNumbers) {
  using namespace std::string_literals;
  EXPECT_EQ(shorten_command_line("/opt/venv/bin/python3.11\0/home/alice/proj/train.py\0--lr\0003e-4\0"s), "python3.11 train.py --lr 3e-4");
  EXPECT_EQ(shorten_command_line("python\0-u\0/srv/eval.py\0--name\0my run\0"s), "python -u eval.py --name 'my run'");
  EXPECT_EQ(shorten_command_line("/usr/bin/python3\0-m\0torch.distributed.run\0--nproc-per-node\0008\0/x/t.py\0"s),
            "python3 -m torch.distributed.run --nproc-per-node 8 /x/t.py");
  EXPECT_EQ(shorten_command_line("/usr/local/bin/llama-server\0--model\0/models/7b.gguf\0"s), "llama-server --model /models/7b.gguf");
  EXPECT_EQ(shorten_command_line("/usr/bin/python3 train.py --data /d/x"s), "python3 train.py --data /d/x");  // setproctitle
  EXPECT_EQ(shorten_command_line(""), "");
  EXPECT_EQ(command_line_of(::getpid()).rfind("cli_test", 0), 0u) << command_line_of(::getpid());

  const std::string id = "3f2a1b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708";
  EXPECT_EQ(container_from_cgroup("0::/system.slice/docker-" + id + ".scope\n"), "docker 3f2a1b4c5d6e");
  EXPECT_EQ(container_from_cgroup("12:memory:/docker/" + id + "\n11:cpu:/docker/" + id + "\n"), "docker 3f2a1b4c5d6e");
  EXPECT_EQ(container_from_cgroup("0::/machine.slice/libpod-" + id + ".scope/container\n"), "podman 3f2a1b4c5d6e");
  EXPECT_EQ(container_from_cgroup("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b3c4d_5e6f_7081_92a3_b4c5d6e7f809"
                                  ".slice/cri-containerd-" + id + ".scope\n"),
            "pod 1a2b3c4d");
  EXPECT_EQ(container_from_cgroup("4:memory:/kubepods/besteffort/pod1a2b3c4d-5e6f-7081-92a3-b4c5d6e7f809/" + id + "\n"), "pod 1a2b3c4d");
  EXPECT_EQ(container_from_cgroup("0::/system.slice/containerd.service/cri-containerd-" + id + ".scope\n"), "containerd 3f2a1b4c5d6e");
  EXPECT_EQ(container_from_cgroup("0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n"), "slurm 4242");
  EXPECT_EQ(container_from_cgroup("5:cpuset:/slurm/uid_1000/job_77/step_batch\n"), "slurm 77");
  EXPECT_EQ(container_from_cgroup("0::/lxc.payload.build01/init.scope\n"), "lxc build01");
  EXPECT_EQ(container_from_cgroup("0::/user.slice/user-1000.slice/session-3.scope\n"), "");
  EXPECT_EQ(container_from_cgroup("0::/system.slice/docker.service\n"), "");

  // The driver's tree, listed out of order: numbered by PCI bus id, as nvidia-smi numbers them.
  char root[] = "/tmp/vramswap-proc-XXXXXX";
  ASSERT_NE(::mkdtemp(root), nullptr);
  const std::string gpus = std::string(root) + "/driver/nvidia/gpus";
  const std::vector<std::pair<std::string, std::string>> cards = {{"0000:9b:00.0", "GPU-bbbbbbbb-0000-0000-0000-000000000002"},
                                                                   {"0000:18:00.0", "GPU-aaaaaaaa-0000-0000-0000-000000000001"}};
  ASSERT_EQ(std::system(("mkdir -p " + gpus + "/0000:9b:00.0 " + gpus + "/0000:18:00.0").c_str()), 0);
  for (const auto& [bus, uuid] : cards) {
    std::ofstream(gpus + "/" + bus + "/information") << "Model: \t\t NVIDIA H200\nIRQ:   \t\t 187\nGPU UUID: \t " << uuid
                                                     << "\nVideo BIOS: \t 96.00.a5.00.01\nBus Type: \t PCIe\nBus Location: \t " << bus
                                                     << "\nDevice Minor: \t 0\n";
  }
  const std::vector<numbered_device> found = nvidia_gpus(root);
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0].key, cards[1].second);
  EXPECT_EQ(found[1].key, cards[0].second);
  EXPECT_EQ(device_index_of(cards[0].second, found), 1);
  EXPECT_EQ(device_index_of("GPU-AAAAAAAA-0000-0000-0000-000000000001", found), 0);
  EXPECT_EQ(device_index_of("GPU-cccccccc-0000-0000-0000-000000000003", found), -1);
  EXPECT_EQ(device_index_of("host-3", found), 3);
  EXPECT_TRUE(nvidia_gpus(std::string(root) + "/nothing").empty());
  ASSERT_EQ(std::system(("rm -rf " + std::string(root)).c_str()), 0);

  EXPECT_EQ(human_bytes(0), "0 B");
  EXPECT_EQ(human_bytes(2 * MiB), "2 MiB");
  EXPECT_EQ(human_bytes(1536 * MiB), "1.50 GiB");
  EXPECT_EQ(human_bytes(1000 * MiB), "0.98 GiB");
  EXPECT_EQ(human_bytes(80ull << 30), "80 GiB");
  EXPECT_EQ(human_duration(0.25), "250 ms");
  EXPECT_EQ(human_duration(12.34), "12.3 s");
  EXPECT_EQ(human_duration(245), "4 min 05 s");
  EXPECT_EQ(human_duration(7500), "2 h 05 min");
}

// The trace ring in-process: records read back in order; a writer that died between claiming
// a record and publishing it leaves a hole that is skipped (and counted) once later records
// exist, never a torn record; a wrapped ring reports what was lost.
TEST(TraceRing, ReadsInOrderSkipsADeadWritersRecordAndCountsLoss) {
  option_set(option_id::shm_prefix, ("vsr" + std::to_string(getpid()) + "-").c_str());
  std::unique_ptr<pool_segment> pool;
  ASSERT_EQ(pool_segment::create("host-9", 4, 2 * MiB, 0, getpid(), 0, &pool), ok) << last_error();
  uint32_t m = 0;
  ASSERT_EQ(pool->add_member(getpid(), 1, current_pid_namespace(), &m), ok);
  uint64_t cursor = pool->member(m).trace_start.load();
  std::vector<pool_segment::trace_event> got;
  pool->trace(m, pool_layout::trace_asked, 100, 0, 0, 1);
  pool->trace(m, pool_layout::trace_granted, 100, 5, 0, 1);
  EXPECT_EQ(pool->read_trace(m, &cursor, &got), 0u);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].kind, pool_layout::trace_asked);
  EXPECT_EQ(got[1].duration_ns, 5u);
  EXPECT_EQ(got[1].pid, getpid());
  // A writer dies after claiming a record: the reader waits at the hole while it is recent...
  pool->trace_ring_of(m).head.fetch_add(1);
  pool->trace(m, pool_layout::trace_resident, 105, 7, 4096, 0);
  got.clear();
  EXPECT_EQ(pool->read_trace(m, &cursor, &got), 0u);
  EXPECT_TRUE(got.empty());
  // ... and skips it, counted as lost, once the ring has moved on.
  for (int i = 0; i < 20; ++i) pool->trace(m, pool_layout::trace_evicted, 200 + i, 1, 2 * MiB, 1);
  EXPECT_EQ(pool->read_trace(m, &cursor, &got), 1u);
  ASSERT_EQ(got.size(), 21u);
  EXPECT_EQ(got[0].kind, pool_layout::trace_resident);
  EXPECT_EQ(got[0].bytes, 4096u);
  // More than a ring's worth between two reads: the oldest are lost, the rest read in order.
  for (uint32_t i = 0; i < pool_layout::k_trace_records + 10; ++i) pool->trace(m, pool_layout::trace_asked, 1000 + i, 0, 0, 1);
  got.clear();
  EXPECT_EQ(pool->read_trace(m, &cursor, &got), 10u);
  ASSERT_EQ(got.size(), pool_layout::k_trace_records);
  EXPECT_EQ(got.front().ns, 1010u);
  EXPECT_EQ(got.back().ns, 1000u + pool_layout::k_trace_records + 9);
  // A new member in a reused slot starts after the previous member's records.
  pool->remove_member(m);
  uint32_t again = 0;
  ASSERT_EQ(pool->add_member(getpid(), 2, current_pid_namespace(), &again), ok);
  EXPECT_EQ(again, m);
  EXPECT_EQ(pool->member(again).trace_start.load(), pool->trace_ring_of(m).head.load());
  pool.reset();
  pool_segment::remove("host-9");
  option_set(option_id::shm_prefix, nullptr);
}

}  // namespace
}  // namespace vramswap::detail

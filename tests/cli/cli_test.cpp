// Description: `vramswap status`, `vramswap trace` and vramswapd's metrics endpoint against a
// live multi-process scenario. session_worker clients (tests/cpp_api) over more
// than half the pool each take turns on the host backend while the tests run the real
// `vramswap` binary and scrape the real server on loopback. JSON is parsed by python3
// (json_check.py); the cases that need it skip, saying so, without it.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
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

#include "lock/process_identity.hpp"
#include "core/options.hpp"
#include "core/status.hpp"
#include "pool/pool_segment.hpp"
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
  std::string out;
};

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

  ran run(std::vector<std::string> args) {
    const std::string out = dir_ + "/out." + std::to_string(runs_++);
    const pid_t pid = spawn(std::move(args), {}, out);
    ran r;
    r.status = wait_for(pid);
    std::ifstream f(out);
    std::stringstream ss;
    ss << f.rdbuf();
    r.out = ss.str();
    ::unlink(out.c_str());
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
  EXPECT_EQ(s["devices.0.holder.command"], "\"session_worker\"");
  EXPECT_GE(real(s, "devices.0.holder.held_seconds"), 0.0);
  std::set<std::string> waiting;
  for (int i = 0; i < 2; ++i) {
    const std::string q = "devices.0.queue." + std::to_string(i) + ".";
    waiting.insert(s[q + "pid"]);
    EXPECT_EQ(s[q + "priority"], "\"normal\"");
    EXPECT_GE(real(s, q + "waiting_seconds"), 0.0);
    EXPECT_EQ(s[q + "command"], "\"session_worker\"");
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
  EXPECT_NE(text.out.find("device host-0: pool 64.0 MiB = 32 frames of 2.0 MiB"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("queue: "), std::string::npos) << text.out;
  for (const std::string& p : pids) EXPECT_NE(text.out.find("\n  " + p + " "), std::string::npos) << text.out;

  // After a few turns, memory has moved: saved pages in host memory, bytes copied both ways.
  uint64_t host = 0, out = 0, in = 0, swaps = 0;
  const auto later = clock_type::now() + std::chrono::seconds(20);
  while (clock_type::now() < later && (host == 0 || out == 0 || in == 0 || swaps == 0)) {
    s = status_json();
    host = out = in = swaps = 0;
    for (int i = 0; i < static_cast<int>(num(s, "devices.0.processes.#")); ++i) {
      const std::string p = "devices.0.processes." + std::to_string(i) + ".";
      host += num(s, p + "host_bytes");
      out += num(s, p + "bytes_out");
      in += num(s, p + "bytes_in");
      swaps += num(s, p + "swaps_in");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_GT(host, 0u);
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
  EXPECT_NE(ss.str().find("\"process_name\", \"ph\": \"M\", \"pid\": " + std::to_string(a)), std::string::npos);
}

std::string http_get(uint16_t port, const std::string& path) {
  const int fd = test::connect_loopback(port);
  if (fd < 0) return "connect failed: " + std::string(std::strerror(errno));
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  (void)!::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string answer;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) answer.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return answer;
}

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
  const pid_t w = worker(4 * MiB, 2, 40, 0, {"VRAMSWAP_LOG=debug"}, err);
  expect_workers_ok();
  std::ifstream f(err);
  const std::regex line_re(R"(^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z vramswap\[(\d+)\] dev (\d+|-) (error|warn|info|debug): .+$)");
  int granted = 0, lines = 0;
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("session_worker", 0) == 0) continue;  // the worker's own output
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, line_re)) << line;
    EXPECT_EQ(m[1].str(), std::to_string(w));
    ++lines;
    if (line.find(" dev 0 debug: acquire: lock granted after ") != std::string::npos) ++granted;
  }
  EXPECT_GT(lines, 0);
  EXPECT_EQ(granted, 2);
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

// Description: a real vramswapd's metrics, scraped over TCP at a listen address other than
// the default (--metrics-address 127.0.0.2; nothing on 127.0.0.1), while real clients
// (session_worker processes, tests/cpp_api) take turns on the host backend: per-process
// series labelled by device index, UUID, job name and member slot (no pid, no command), the
// holder and its waiters visible while they hold and wait, and the wait, hold and switch
// histograms growing by exactly the turns the clients took, their buckets cumulative and
// their _count the +Inf bucket.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/status.hpp"
#include "lock/turn_histograms.hpp"
#include "pool/listen_address.hpp"
#include "pool/pool_segment.hpp"
#include "support/deployment.hpp"
#include "support/loopback.hpp"

namespace vramswap::detail {
namespace {

using namespace std::chrono_literals;
constexpr uint64_t MiB = 1ull << 20;
constexpr const char* k_address = "127.0.0.2";
constexpr int k_workers = 3;
constexpr int k_rounds = 2;
constexpr int k_hold_ms = 150;

// GET `path` from address:port; the body of a 200 answer, else "".
std::string scrape(const char* address, uint16_t port, const std::string& path = "/metrics") {
  const test::http_reply r = test::http_request(port, "GET " + path + " HTTP/1.0", address);
  return r.status == 200 ? r.body : "";
}

// Samples of a scrape: "name{labels}" -> value; and each family's # TYPE.
struct metrics {
  std::map<std::string, double> samples;
  std::map<std::string, std::string> types;
  std::string text;

  explicit metrics(const std::string& body) : text(body) {
    std::istringstream in(body);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("# TYPE ", 0) == 0) {
        std::istringstream t(line.substr(7));
        std::string name, type;
        t >> name >> type;
        types[name] = type;
      } else if (!line.empty() && line[0] != '#') {
        const size_t sp = line.rfind(' ');
        samples[line.substr(0, sp)] = std::strtod(line.c_str() + sp + 1, nullptr);
      }
    }
  }
  double get(const std::string& series, double otherwise = -1) const {
    const auto it = samples.find(series);
    return it == samples.end() ? otherwise : it->second;
  }
  // Every sample of family `name` (exactly that name), with its labels.
  std::vector<std::pair<std::string, double>> of(const std::string& name) const {
    std::vector<std::pair<std::string, double>> out;
    for (const auto& [series, value] : samples) {
      if (series.rfind(name + "{", 0) == 0) out.emplace_back(series.substr(name.size()), value);
    }
    return out;
  }
};

const std::string k_device = "gpu=\"0\",UUID=\"host-0\"";

// A histogram's buckets (cumulative, in bound order, +Inf last) and count, checked for the
// text format's rules. Returns the count.
double check_histogram(const metrics& m, const std::string& name) {
  EXPECT_EQ(m.types.count(name) ? m.types.at(name) : "", "histogram") << name;
  double previous = 0;
  for (size_t i = 0; i < lock_layout::k_turn_buckets; ++i) {
    char le[32];
    if (i + 1 < lock_layout::k_turn_buckets) {
      std::snprintf(le, sizeof le, "%g", lock_layout::k_turn_bucket_le_ns[i] / 1e9);
    } else {
      std::snprintf(le, sizeof le, "+Inf");
    }
    const double v = m.get(name + "_bucket{" + k_device + ",le=\"" + le + "\"}");
    EXPECT_GE(v, previous) << name << " le=" << le << ": buckets are cumulative";
    previous = v;
  }
  const double count = m.get(name + "_count{" + k_device + "}");
  EXPECT_EQ(count, previous) << name << ": _count is the +Inf bucket";
  EXPECT_GE(m.get(name + "_sum{" + k_device + "}"), 0) << name << "_sum";
  return count;
}

class MetricsScrape : public ::testing::Test {
 protected:
  void SetUp() override {
    deploy_.create("mscrape", "host-0",
                   {"VRAMSWAP_BACKEND=host", "VRAMSWAP_HOST_DEVICE_MEMORY=256MiB", "VRAMSWAP_FRAME_SIZE=2MiB", "VRAMSWAP_POOL_SIZE=64MiB",
                    "VRAMSWAP_LOG=warn", "VRAMSWAP_SWAP_DIR=/var/tmp"});
  }
  void TearDown() override {
    for (pid_t p : pids_) {
      ::kill(p, SIGKILL);
      ::waitpid(p, nullptr, 0);
    }
    deploy_.destroy();
  }
  pid_t spawn(std::vector<std::string> args) {
    const pid_t pid = deploy_.spawn(std::move(args), {}, "/dev/null", deploy_.dir() + "/stderr." + std::to_string(pids_.size()));
    pids_.push_back(pid);
    return pid;
  }
  test::deployment deploy_;
  std::vector<pid_t> pids_;
};

TEST_F(MetricsScrape, LabelsAndTurnHistogramsOfRealClientsOnANonDefaultAddress) {
  const pid_t server = spawn({VRAMSWAP_SERVER_BINARY, "--foreground", "--metrics-port", "0", "--metrics-address", k_address});
  std::unique_ptr<pool_segment> pool;
  ASSERT_TRUE(deploy_.open_pool(&pool, 30000, true)) << "vramswapd made no pool segment";
  uint16_t port = 0;
  for (int i = 0; i < 3000 && port == 0; ++i) {
    port = static_cast<uint16_t>(pool->header()->metrics_port.load());
    if (port == 0) std::this_thread::sleep_for(10ms);
  }
  ASSERT_NE(port, 0) << "vramswapd published no metrics port";
  const metrics before(scrape(k_address, port));
  ASSERT_FALSE(before.text.empty()) << "no 200 from http://" << k_address << ":" << port << "/metrics";
  EXPECT_EQ(scrape("127.0.0.1", port), "") << "the endpoint should listen on " << k_address << " only, not on the default";
  EXPECT_EQ(listening_host(port), k_address) << "vramswap status would print another metrics URL";
  EXPECT_EQ(before.get("vramswap_pool_frames{" + k_device + "}"), 32) << before.text;
  const double waits0 = check_histogram(before, "vramswap_lock_wait_seconds");
  const double holds0 = check_histogram(before, "vramswap_lock_hold_seconds");
  const double switches0 = check_histogram(before, "vramswap_switch_seconds");

  // Three clients of 24 MiB over a 64 MiB pool: each acquire evicts another's frames.
  for (int w = 0; w < k_workers; ++w) {
    spawn({VRAMSWAP_SESSION_WORKER, std::to_string(24 * MiB), std::to_string(k_rounds), std::to_string(70 + w), std::to_string(k_hold_ms)});
  }
  // While they take turns: one holder, waiters behind it, each a series of its job and slot.
  double waited_seen = 0;
  std::string during;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (std::chrono::steady_clock::now() < deadline) {
    const metrics m(scrape(k_address, port));
    const auto holding = m.of("vramswap_process_holding");
    int holders = 0;
    for (const auto& [labels, v] : holding) holders += v == 1 ? 1 : 0;
    double waiting = 0;
    for (const auto& [labels, v] : m.of("vramswap_process_waiting_seconds")) waiting = std::max(waiting, v);
    if (holding.size() == k_workers && holders == 1 && m.get("vramswap_lock_waiters{" + k_device + "}") >= 1 && waiting > 0.05) {
      waited_seen = waiting;
      during = m.text;
      for (const auto& [labels, v] : holding) {
        EXPECT_EQ(labels.rfind("{" + k_device + ",job_name=\"session_worker\",member=\"", 0), 0u) << "labels: " << labels;
      }
      EXPECT_GT(m.get("vramswap_lock_held_seconds{" + k_device + "}"), 0) << m.text;
      EXPECT_GE(m.get("vramswap_lock_longest_wait_seconds{" + k_device + "}"), waiting) << m.text;
      EXPECT_NE(m.get("vramswap_lock_holder_pid{" + k_device + "}"), 0);
      break;
    }
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_FALSE(during.empty()) << "no scrape showed " << k_workers << " clients, one holding and one waiting";
  EXPECT_EQ(during.find("pid=\""), std::string::npos) << "no pid label";
  EXPECT_EQ(during.find("command=\""), std::string::npos) << "no command label";
  const double waits_during = metrics(during).get("vramswap_lock_wait_seconds_count{" + k_device + "}");

  for (size_t i = 1; i < pids_.size(); ++i) {
    int status = 0;
    ASSERT_EQ(::waitpid(pids_[i], &status, 0), pids_[i]);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "worker " << pids_[i] << " status " << status;
  }
  pids_.resize(1);
  const metrics after(scrape(k_address, port));
  const double turns = k_workers * k_rounds;
  EXPECT_EQ(check_histogram(after, "vramswap_lock_wait_seconds") - waits0, turns) << "one wait per grant\n" << after.text;
  EXPECT_EQ(check_histogram(after, "vramswap_lock_hold_seconds") - holds0, turns) << "one hold per release";
  EXPECT_EQ(check_histogram(after, "vramswap_switch_seconds") - switches0, turns) << "one switch per acquire";
  EXPECT_LT(waits_during, after.get("vramswap_lock_wait_seconds_count{" + k_device + "}")) << "the counts grow as turns are taken";
  EXPECT_GE(after.get("vramswap_lock_hold_seconds_sum{" + k_device + "}"), turns * k_hold_ms / 1000.0) << "each hold lasted its " << k_hold_ms << " ms";
  EXPECT_GT(after.get("vramswap_switch_seconds_sum{" + k_device + "}"), 0) << "switches that brought memory in take time";
  // The wait seen in flight ended in a bucket above it.
  uint64_t below = 0;
  for (size_t i = 0; i + 1 < lock_layout::k_turn_buckets && lock_layout::k_turn_bucket_le_ns[i] / 1e9 <= waited_seen; ++i) {
    char le[32];
    std::snprintf(le, sizeof le, "%g", lock_layout::k_turn_bucket_le_ns[i] / 1e9);
    below = static_cast<uint64_t>(after.get("vramswap_lock_wait_seconds_bucket{" + k_device + ",le=\"" + le + "\"}"));
  }
  EXPECT_LT(below, after.get("vramswap_lock_wait_seconds_count{" + k_device + "}"))
      << "a wait of at least " << waited_seen << " s should be counted above that bound";
  // Exited clients leave no series once the server has repaired their slots.
  bool gone = false;
  for (int i = 0; i < 1000 && !gone; ++i) {
    gone = metrics(scrape(k_address, port)).of("vramswap_process_holding").empty();
    if (!gone) std::this_thread::sleep_for(10ms);
  }
  EXPECT_TRUE(gone) << "exited clients should leave no series: " << scrape(k_address, port);
  ::kill(server, SIGTERM);
}

}  // namespace
}  // namespace vramswap::detail

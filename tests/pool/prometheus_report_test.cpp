// Description: the metrics' labels and histograms (pool/prometheus_report.hpp): the job name
// a command line gives (interpreters name their script or module), the job names of real
// processes read from /proc, and the text a report renders to: histogram buckets cumulative
// with _count equal to the +Inf bucket, two processes of one job told apart by their member
// slot, no pid or command label, label values escaped. (A real daemon's scrape is in
// tests/server/metrics_scrape_test.cpp.)
#include "pool/prometheus_report.hpp"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "lock/process_identity.hpp"

extern char** environ;

namespace vramswap::detail {
namespace {

using namespace std::chrono_literals;

std::string cmdline(std::initializer_list<const char*> args) {
  std::string s;
  for (const char* a : args) s += std::string(a) + '\0';
  return s;
}

TEST(ProgramName, InterpretersNameTheirScriptOrModule) {
  EXPECT_EQ(program_name(cmdline({"/usr/bin/python3", "-u", "/jobs/train.py", "--lr", "3e-4"})), "train.py");
  EXPECT_EQ(program_name(cmdline({"python3.11", "-X", "importtime", "-W", "ignore", "eval.py"})), "eval.py")
      << "options with a value are skipped with it";
  EXPECT_EQ(program_name(cmdline({"/usr/bin/python3", "-m", "torch.distributed.run", "train.py"})), "torch.distributed.run");
  EXPECT_EQ(program_name(cmdline({"/usr/bin/python3", "/usr/local/bin/torchrun", "--nproc-per-node", "8", "train.py"})), "torchrun")
      << "a console script run through its shebang";
  EXPECT_EQ(program_name(cmdline({"python", "-c", "import vramswap"})), "python") << "code on the command line names no file";
  EXPECT_EQ(program_name(cmdline({"/bin/bash", "/home/ana/run.sh"})), "run.sh");
  EXPECT_EQ(program_name(cmdline({"python3"})), "python3") << "an interactive interpreter";
  EXPECT_EQ(program_name(cmdline({"/opt/bin/trainer", "--steps", "9"})), "trainer");
  EXPECT_EQ(program_name(cmdline({"./a.out"})), "a.out");
  EXPECT_EQ(program_name(std::string("no-nul-at-the-end")), "no-nul-at-the-end");
  EXPECT_EQ(program_name(""), "") << "a kernel thread or a zombie";
}

class JobName : public ::testing::Test {
 protected:
  void TearDown() override {
    for (pid_t p : pids_) {
      ::kill(p, SIGKILL);
      ::waitpid(p, nullptr, 0);
    }
    if (!dir_.empty()) (void)!std::system(("rm -rf " + dir_).c_str());
  }
  // A process running `args`, with its /proc entry ready (exec done).
  pid_t run(std::vector<std::string> args) {
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    EXPECT_EQ(::posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), environ), 0) << args[0];
    pids_.push_back(pid);
    return pid;
  }
  std::string script(const std::string& name, const std::string& text) {
    if (dir_.empty()) {
      std::string templ = "/tmp/vramswap-jobname-XXXXXX";
      EXPECT_NE(::mkdtemp(templ.data()), nullptr);
      dir_ = templ;
    }
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  static process_report report_of(pid_t pid) {
    process_report p;
    p.pid = pid;
    p.pid_ns = current_pid_namespace();
    p.command = "comm-of-it";
    return p;
  }
  // job_name_of(pid) once its exec is seen (at most 5 s), else what it was last.
  static std::string job_of(pid_t pid, const std::string& expected) {
    std::string got;
    for (int i = 0; i < 500; ++i) {
      got = job_name_of(report_of(pid));
      if (got == expected) break;
      std::this_thread::sleep_for(10ms);
    }
    return got;
  }
  std::vector<pid_t> pids_;
  std::string dir_;
};

TEST_F(JobName, IsTheProgramOfARealProcess) {
  EXPECT_EQ(job_name_of(report_of(::getpid())), "prometheus_report_test") << "this test's own binary";
  const pid_t sh = run({"sh", script("train.sh", "sleep 30; :\n")});
  EXPECT_EQ(job_of(sh, "train.sh"), "train.sh") << "a shell script, by its file";
  if (std::system("python3 -c '' >/dev/null 2>&1") == 0) {
    const pid_t py = run({"python3", "-u", script("train.py", "import time\ntime.sleep(30)\n"), "--epochs", "3"});
    EXPECT_EQ(job_of(py, "train.py"), "train.py") << "python3 -u train.py, by its script";
  }
  process_report elsewhere = report_of(::getpid());
  elsewhere.pid_ns = current_pid_namespace() + 1;
  EXPECT_EQ(job_name_of(elsewhere), "unknown") << "a pid of another PID namespace is never looked up here";
  const pid_t gone = run({"true"});
  ::waitpid(gone, nullptr, 0);
  pids_.pop_back();
  process_report ended = report_of(gone);
  ended.command = "?";
  EXPECT_EQ(job_name_of(ended), "unknown") << "an exited process";
}

TEST_F(JobName, IsBoundedAndCutAtACharacterBoundary) {
  const std::string name = std::string(k_job_name_max - 1, 'a') + "\xc3\xa9" + "tail.sh";  // an e-acute across the limit
  const pid_t sh = run({"sh", script(name, "sleep 30; :\n")});
  const std::string expected(k_job_name_max - 1, 'a');
  EXPECT_EQ(job_of(sh, expected), expected) << "cut before the two-byte character that crosses the limit";
}

device_report sample_device() {
  device_report d;
  d.key = "GPU-1b5f3a2c";
  d.index = 3;
  d.frame_size = 2 << 20;
  d.frame_count = 8;
  d.have_queue = true;
  d.have_turns = true;
  d.turn_wait.count[0] = 5;
  d.turn_wait.count[3] = 2;
  d.turn_wait.count[lock_layout::k_turn_buckets - 1] = 1;
  d.turn_wait.sum_ns = 4'000'000'000;
  for (uint32_t member : {4u, 9u}) {
    process_report p;
    p.member = member;
    p.pid = 1;  // not visible as a job here: the name is unknown either way
    p.pid_ns = 1;
    p.command = "python";
    p.acquires = member;
    d.processes.push_back(p);
  }
  return d;
}

TEST(RenderPrometheus, HistogramsAreCumulativeAndSeriesAreLabelledByDeviceJobAndMember) {
  const std::string text = render_prometheus({sample_device()});
  const std::string dev = "gpu=\"3\",UUID=\"GPU-1b5f3a2c\"";
  EXPECT_NE(text.find("# TYPE vramswap_lock_wait_seconds histogram\n"), std::string::npos) << text;
  EXPECT_NE(text.find("vramswap_lock_wait_seconds_bucket{" + dev + ",le=\"0.0001\"} 5\n"), std::string::npos) << text;
  EXPECT_NE(text.find("vramswap_lock_wait_seconds_bucket{" + dev + ",le=\"0.005\"} 5\n"), std::string::npos) << "cumulative";
  EXPECT_NE(text.find("vramswap_lock_wait_seconds_bucket{" + dev + ",le=\"0.01\"} 7\n"), std::string::npos) << text;
  EXPECT_NE(text.find("vramswap_lock_wait_seconds_bucket{" + dev + ",le=\"3600\"} 7\n"), std::string::npos) << text;
  EXPECT_NE(text.find("vramswap_lock_wait_seconds_bucket{" + dev + ",le=\"+Inf\"} 8\n"), std::string::npos) << text;
  EXPECT_NE(text.find("vramswap_lock_wait_seconds_count{" + dev + "} 8\n"), std::string::npos) << "_count is the +Inf bucket";
  EXPECT_NE(text.find("vramswap_lock_wait_seconds_sum{" + dev + "} 4\n"), std::string::npos) << text;
  EXPECT_NE(text.find("vramswap_switch_seconds_count{" + dev + "} 0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("vramswap_process_acquires_total{" + dev + ",job_name=\"unknown\",member=\"4\"} 4\n"), std::string::npos) << text;
  EXPECT_NE(text.find("vramswap_process_acquires_total{" + dev + ",job_name=\"unknown\",member=\"9\"} 9\n"), std::string::npos)
      << "two processes of one job are two series";
  EXPECT_EQ(text.find("pid=\""), std::string::npos) << "no pid label";
  EXPECT_EQ(text.find("command=\""), std::string::npos) << "no command label";

  device_report unknown_index = sample_device();
  unknown_index.index = -1;
  unknown_index.key = "odd\"key";
  const std::string t2 = render_prometheus({unknown_index});
  EXPECT_NE(t2.find("vramswap_pool_frames{UUID=\"odd\\\"key\"} 8\n"), std::string::npos) << "no gpu label when the index is unknown; " << t2;
  unknown_index.have_turns = false;
  const std::string t3 = render_prometheus({unknown_index});
  EXPECT_NE(t3.find("# TYPE vramswap_lock_hold_seconds histogram\n"), std::string::npos) << "the family is always described";
  EXPECT_EQ(t3.find("vramswap_lock_hold_seconds_count"), std::string::npos) << "no samples without the lock segment";
}

}  // namespace
}  // namespace vramswap::detail

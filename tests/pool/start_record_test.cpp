// Description: the start lock file's record (pool/start_record.hpp), which the clients waiting
// on a pool server's start read while its starter rewrites it: a reader racing a writer in
// another process never finds it empty or half written, and what is not a whole record of
// ours is refused.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "pool/start_record.hpp"

namespace vramswap::detail {
namespace {

const char* const k_states[] = {"starting", "ready", "failed"};
// Of two lengths, so that each record is longer or shorter than the one it replaces; one
// holds a '#' and spaces, as a path may.
const std::string k_servers[] = {"/usr/bin/vramswapd", "/opt/a long path/with #hash/and more/bin/vramswapd"};

class StartRecord : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/vramswap-start-record-XXXXXX";
    fd_ = ::mkstemp(tmpl);
    ASSERT_GE(fd_, 0);
    path_ = tmpl;
  }
  void TearDown() override {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  void put(const std::string& text) {
    ASSERT_EQ(::ftruncate(fd_, 0), 0);
    ASSERT_EQ(::pwrite(fd_, text.data(), text.size(), 0), static_cast<ssize_t>(text.size()));
  }
  int fd_ = -1;
  std::string path_;
};

TEST_F(StartRecord, RoundTripsEveryField) {
  start_record r;
  EXPECT_FALSE(read_start_record(fd_, &r)) << "an empty file holds no record";
  ASSERT_TRUE(write_start_record(fd_, 4242, "failed", -7, k_servers[1]));
  ASSERT_TRUE(read_start_record(fd_, &r));
  EXPECT_EQ(r.client, ::getpid());
  EXPECT_EQ(r.server_pid, 4242);
  EXPECT_EQ(r.state, "failed");
  EXPECT_EQ(r.status, -7);
  EXPECT_EQ(r.server, k_servers[1]);

  // A shorter record replaces a longer one whole: nothing of the old one is left over.
  ASSERT_TRUE(write_start_record(fd_, 0, "starting", 0, k_servers[0]));
  ASSERT_TRUE(read_start_record(fd_, &r));
  EXPECT_EQ(r.server_pid, 0);
  EXPECT_EQ(r.state, "starting");
  EXPECT_EQ(r.server, k_servers[0]);
}

TEST_F(StartRecord, WhatIsNotAWholeRecordOfOursIsRefused) {
  ASSERT_TRUE(write_start_record(fd_, 99, "ready", 0, k_servers[0]));
  char whole[512] = {};
  const ssize_t n = ::pread(fd_, whole, sizeof whole - 1, 0);
  ASSERT_GT(n, 1);
  const std::string good(whole, static_cast<size_t>(n));
  start_record r;

  put(good.substr(0, good.size() / 2));  // cut short
  EXPECT_FALSE(read_start_record(fd_, &r, 10));
  std::string flipped = good;
  flipped[good.find(" 99 ") + 1] = '7';  // a field changed under its checksum
  put(flipped);
  EXPECT_FALSE(read_start_record(fd_, &r, 10));
  put("12 0 starting 0 /usr/bin/vramswapd\n");  // no checksum
  EXPECT_FALSE(read_start_record(fd_, &r, 10));
  put("not a record at all #00000000\n");
  EXPECT_FALSE(read_start_record(fd_, &r, 10));
  put(good);
  EXPECT_TRUE(read_start_record(fd_, &r, 10));
  EXPECT_EQ(r.server_pid, 99);
}

// The start lock's waiters read the record while its starter rewrites it, each at its own
// moment: here a writer process rewrites it as fast as it can, with records of changing
// length, and every read finds one whole record that the writer wrote.
TEST_F(StartRecord, AReaderRacingAWriterAlwaysFindsAWholeRecord) {
  ASSERT_TRUE(write_start_record(fd_, 0, "starting", 0, k_servers[0]));
  const pid_t writer = ::fork();
  ASSERT_GE(writer, 0);
  if (writer == 0) {
    // Each record's fields follow from its server pid, so a reader can tell a mix of two.
    for (int i = 1;; ++i) {
      if (!write_start_record(fd_, i, k_states[i % 3], -(i % 97), k_servers[i % 2])) ::_exit(2);
    }
  }
  // Stopped however the test ends.
  struct stop_writer {
    pid_t pid;
    int status = 0;
    ~stop_writer() { stop(); }
    void stop() {
      if (pid <= 0) return;
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      pid = -1;
    }
  } guard{writer};
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
  long reads = 0;
  long unreadable = 0;
  int last_pid = 0;
  int distinct = 0;
  while (std::chrono::steady_clock::now() < until) {
    start_record r;
    ++reads;
    if (!read_start_record(fd_, &r)) {
      ++unreadable;
      continue;
    }
    if (r.server_pid == 0) continue;  // the first record, before the writer's
    ASSERT_EQ(r.client, writer);
    ASSERT_EQ(r.state, k_states[r.server_pid % 3]) << "server pid " << r.server_pid;
    ASSERT_EQ(r.status, -(r.server_pid % 97)) << "server pid " << r.server_pid;
    ASSERT_EQ(r.server, k_servers[r.server_pid % 2]) << "server pid " << r.server_pid;
    ASSERT_GE(r.server_pid, last_pid) << "a record older than one read before";
    if (r.server_pid != last_pid) ++distinct;
    last_pid = r.server_pid;
  }
  guard.stop();
  EXPECT_TRUE(WIFSIGNALED(guard.status)) << "the writer failed to write (exit " << WEXITSTATUS(guard.status) << ")";
  EXPECT_EQ(unreadable, 0) << "of " << reads << " reads";
  EXPECT_GT(distinct, 10) << "the reads saw too few of the writer's records to show a race (" << reads << " reads)";
}

}  // namespace
}  // namespace vramswap::detail

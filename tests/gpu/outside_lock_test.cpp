// Memory allocated outside the lock, on the GPU (cuda backend), with real processes
// (outside_lock_worker):
//   - allocated and written by a kernel outside the lock while the pool has free frames, it
//     is kept when another process takes the whole pool, and checked word for word at the
//     next lock;
//   - with the pool held by another process, malloc_async outside the lock fails saying to
//     allocate inside the lock, and a kernel that writes a plain (unbacked) allocation anyway
//     faults; the teardown after that fault logs one summary line, not one per object.
// Skips, saying why, where no GPU is usable.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "core/backend.hpp"
#include "core/status.hpp"
#include "support/backends.hpp"
#include "support/child_output.hpp"
#include "support/deployment.hpp"

namespace vramswap::detail {
namespace {
constexpr uint64_t MiB = 1ull << 20;

class OutsideLock : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    backend* be = test::shared_backend(backend_kind::cuda, &why);
    if (be == nullptr) GTEST_SKIP() << "cuda backend unavailable here: " << why;
    device_info info;
    ASSERT_EQ(be->get_device_info(0, &info), ok);
    deploy_.create("ol", info.uuid,
                   {"VRAMSWAP_BACKEND=cuda", "VRAMSWAP_POOL_SIZE=" + std::to_string(pool_), "VRAMSWAP_FRAME_SIZE=2MiB",
                    "VRAMSWAP_POOL_IDLE_EXIT=5", "VRAMSWAP_LOG=warn"});
  }
  void TearDown() override { deploy_.destroy(); }

  pid_t run(std::vector<std::string> args, const std::string& tag) {
    args.insert(args.begin(), VRAMSWAP_OUTSIDE_LOCK_WORKER);
    return deploy_.spawn(std::move(args), {}, file(tag, "out"), file(tag, "err"));
  }
  std::string file(const std::string& tag, const char* kind) const { return deploy_.dir() + "/" + tag + "." + kind; }
  std::string path(const char* name) const { return deploy_.dir() + "/" + name; }
  static void create(const std::string& f) {
    const int fd = ::open(f.c_str(), O_CREAT | O_WRONLY, 0600);
    if (fd >= 0) ::close(fd);
  }
  static bool wait_file(const std::string& f, pid_t pid) {
    struct stat st {};
    int status = 0;
    for (int i = 0; i < 30000; ++i) {
      if (::stat(f.c_str(), &st) == 0) return true;
      if (::waitpid(pid, &status, WNOHANG) == pid) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  static int wait_exit(pid_t pid) {
    int status = 0;
    EXPECT_EQ(::waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  std::string output(const std::string& tag) const { return test::slurp(file(tag, "out")) + test::slurp(file(tag, "err")); }

  uint64_t pool_ = 1024 * MiB;
  test::deployment deploy_;
};

TEST_F(OutsideLock, KernelWritesOutsideTheLockAreKeptAcrossAnotherProcessTurn) {
  const pid_t writer = run({"write", std::to_string(640 * MiB), "11", path("written"), path("go")}, "writer");
  ASSERT_TRUE(wait_file(path("written"), writer)) << output("writer");
  create(path("release"));
  const pid_t filler = run({"fill", std::to_string(pool_), path("filled"), path("release")}, "filler");
  EXPECT_EQ(wait_exit(filler), 0) << output("filler");
  create(path("go"));
  EXPECT_EQ(wait_exit(writer), 0) << output("writer");
  EXPECT_NE(test::slurp(file("writer", "out")).find("wrong 0"), std::string::npos) << output("writer");
}

TEST_F(OutsideLock, NoFreeFrameMeansAClearErrorAndAFaultEndsInOneTeardownLine) {
  const pid_t filler = run({"fill", std::to_string(pool_), path("filled"), path("release")}, "filler");
  ASSERT_TRUE(wait_file(path("filled"), filler)) << output("filler");
  const int faulted = wait_exit(run({"fault", std::to_string(64 * MiB)}, "fault"));
  create(path("release"));
  EXPECT_EQ(wait_exit(filler), 0) << output("filler");
  const std::string out = test::slurp(file("fault", "out")), err = test::slurp(file("fault", "err"));
  std::printf("fault (exit %d):\n%s%s", faulted, out.c_str(), err.c_str());
  EXPECT_NE(out.find("malloc_async -1001 "), std::string::npos) << out;  // VRAMSWAP_ERR_OUT_OF_MEMORY
  EXPECT_NE(out.find("Allocate inside the lock"), std::string::npos) << out;
  EXPECT_NE(out.find("resident 0"), std::string::npos) << out;
  EXPECT_EQ(out.find("kernel cudaSuccess"), std::string::npos) << "a kernel on unbacked memory must fault: " << out;
  // The lines of its log: after a device fault, summaries (no per-object flood).
  size_t lines = 0;
  for (char c : err) lines += c == '\n';
  EXPECT_LT(lines, 10u) << err;
  size_t teardown_lines = 0;
  for (size_t at = err.find("teardown"); at != std::string::npos; at = err.find("teardown", at + 1)) ++teardown_lines;
  EXPECT_LE(teardown_lines, 1u) << "one summary line after a device fault, not one per object:\n" << err;
  if (teardown_lines == 1) {
    EXPECT_NE(err.find("could not be destroyed"), std::string::npos) << err;
  }
}

}  // namespace
}  // namespace vramswap::detail

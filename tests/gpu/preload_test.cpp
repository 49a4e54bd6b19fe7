// The preload shim on the GPU: unmodified programs under libvramswap_preload.so.
//   - plain_cuda (cudaMalloc, kernels) oversubscribed on 1.5x the pool completes with every
//     word right, built with the shared CUDA runtime and with the static one (nvcc's default);
//   - a lock user (plain_cuda again, normal priority under the shim) takes frames back from a
//     running oversubscribed plain_cuda; both check every word;
//   - an ordinary PyTorch training script runs oversubscribed on more than the pool.
// Skips, saying why, where no GPU is usable (or, for the last, where torch is missing).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "core/backend.hpp"
#include "core/status.hpp"
#include "pool/pool_segment.hpp"
#include "support/backends.hpp"
#include "support/child_output.hpp"
#include "support/deployment.hpp"

namespace vramswap::detail {
namespace {
using namespace pool_layout;
constexpr uint64_t GiB = 1ull << 30;

class Preload : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    backend* be = test::shared_backend(backend_kind::cuda, &why);
    if (be == nullptr) GTEST_SKIP() << "cuda backend unavailable here: " << why;
    device_info info;
    ASSERT_EQ(be->get_device_info(0, &info), ok);
    deploy_.create("pl", info.uuid,
                   {"VRAMSWAP_BACKEND=cuda", "VRAMSWAP_POOL_SIZE=" + std::to_string(pool_), "VRAMSWAP_POOL_IDLE_EXIT=5",
                    "VRAMSWAP_LOG=info", "LD_PRELOAD=" VRAMSWAP_PRELOAD_LIBRARY});
  }
  void TearDown() override { deploy_.destroy(); }

  pid_t run(std::vector<std::string> args, const std::string& tag, const std::vector<std::string>& env) {
    return deploy_.spawn(std::move(args), env, file(tag, "out"), file(tag, "err"));
  }
  std::string file(const std::string& tag, const char* kind) const { return deploy_.dir() + "/" + tag + "." + kind; }
  static std::string slurp(const std::string& path) { return test::slurp(path); }
  std::map<std::string, double> numbers(const std::string& tag) const {
    return test::key_values(file(tag, "out"));
  }
  static int wait_status(pid_t pid) {
    int status = 0;
    EXPECT_EQ(::waitpid(pid, &status, 0), pid);
    return status;
  }
  static bool exited_ok(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }
  void report(const std::string& tag) const {
    std::printf("%s: %s%s", tag.c_str(), slurp(file(tag, "out")).c_str(), slurp(file(tag, "err")).c_str());
  }

  void expect_every_word_right_on_one_and_a_half_pools(const char* program) {
    const pid_t job = run({program, std::to_string(6 * GiB)}, "job", {"VRAMSWAP_OVERSUBSCRIBE=1"});
    const int status = wait_status(job);
    report("job");
    ASSERT_TRUE(exited_ok(status)) << status;
    auto n = numbers("job");
    EXPECT_EQ(n["wrong"], 0);
    EXPECT_EQ(n["passes"], 3);
    EXPECT_GT(n["meminfo_total"], double(pool_)) << "oversubscribed: the pool plus the host limit";
    const std::string err = slurp(file("job", "err"));
    EXPECT_NE(err.find("in host frames"), std::string::npos) << "no summary from the shim: was it loaded?";
    // All 6 GiB went through vramswap: its view counts them as used (pool and host frames);
    // a lookup that bypassed the shim would have allocated real device memory unseen.
    EXPECT_EQ(n["meminfo_total"] - n["meminfo_free"], double(6 * GiB)) << err;
  }

  uint64_t pool_ = 4 * GiB;
  test::deployment deploy_;
};

TEST_F(Preload, UnmodifiedProgramOnOneAndAHalfPoolsHasEveryWordRight) {
  expect_every_word_right_on_one_and_a_half_pools(VRAMSWAP_PLAIN_CUDA);
}

TEST_F(Preload, UnmodifiedStaticRuntimeProgramOnOneAndAHalfPoolsHasEveryWordRight) {
  expect_every_word_right_on_one_and_a_half_pools(VRAMSWAP_PLAIN_CUDA_STATIC);
}

TEST_F(Preload, LockUserTakesFramesBackFromARunningUnmodifiedJob) {
  const pid_t job = run({VRAMSWAP_PLAIN_CUDA, std::to_string(3 * GiB), "12"}, "job", {"VRAMSWAP_OVERSUBSCRIBE=1"});
  std::unique_ptr<pool_segment> pool;
  ASSERT_TRUE(deploy_.open_pool(&pool, 30000));
  uint32_t lent = 0;
  for (int i = 0; i < 3000 && lent < 96; ++i) {  // 3 GiB = 96 frames of 32 MiB
    lent = pool->count(frame_lent);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GE(lent, 96u) << "the job never took its frames";
  std::this_thread::sleep_for(std::chrono::seconds(1));  // a few of its passes first
  const pid_t user = run({VRAMSWAP_PLAIN_CUDA, std::to_string(3 * GiB + GiB / 2)}, "user", {});
  const int user_status = wait_status(user);
  const int job_status = wait_status(job);
  report("user");
  report("job");
  EXPECT_TRUE(exited_ok(user_status)) << user_status;
  EXPECT_TRUE(exited_ok(job_status)) << job_status;
  EXPECT_EQ(numbers("user")["wrong"], 0);
  EXPECT_EQ(numbers("job")["wrong"], 0);
  EXPECT_GE(numbers("job")["passes"], 3);
  const std::string err = slurp(file("job", "err"));
  EXPECT_EQ(err.find(" 0 page(s) moved to host frames"), std::string::npos) << "the job gave nothing back: " << err;
}

TEST_F(Preload, UnmodifiedPyTorchScriptRunsOversubscribed) {
  if (std::system("python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3 with a CUDA-enabled torch is not available here";
  }
  // ~1.5 GiB of weights, ~6 GiB with gradients and Adam state, on a 4 GiB pool.
  const pid_t job = run({"python3", VRAMSWAP_TORCH_SCRIPT, "1.5", "6"}, "torch", {"VRAMSWAP_OVERSUBSCRIBE=1"});
  const int status = wait_status(job);
  report("torch");
  ASSERT_TRUE(exited_ok(status)) << status;
  auto n = numbers("torch");
  EXPECT_EQ(n["ok"], 1);
  EXPECT_GT(n["meminfo_total"], double(pool_));
  EXPECT_NE(slurp(file("torch", "err")).find("in host frames"), std::string::npos) << "no summary from the shim";
}

}  // namespace
}  // namespace vramswap::detail

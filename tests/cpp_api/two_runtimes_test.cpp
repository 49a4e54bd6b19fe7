// One copy of the runtime per process (runtime/single_runtime.hpp): two_runtimes_worker, a
// real process that links the runtime and loads libvramswap.so as well, finds the second
// copy refusing to open a session, in either order, with a message that names both copies.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "cpp_api/api_test_env.hpp"
#include "support/child_output.hpp"
#include "vramswap/vramswap.h"

extern char** environ;

namespace vramswap::detail::test {
namespace {

class TwoRuntimes : public ::testing::Test {
 protected:
  // Runs `worker` over `library` in `order`; its exit status, and its stdout in *out.
  int run_worker(const std::string& worker, const std::string& library, const std::string& order, std::string* out) {
    const std::string out_path = env_.runtime_dir() + "/worker-" + order + ".out";
    std::vector<std::string> args = {worker, library, order};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
    pid_t pid = 0;
    const int spawned = ::posix_spawn(&pid, worker.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (spawned != 0) return -1;
    int status = 0;
    if (::waitpid(pid, &status, 0) != pid) return -1;
    *out = slurp(out_path);
    ::unlink(out_path.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  // `order` names which copy comes first: the worker's own ("own-first") or the library.
  void expect_second_refused(const std::string& worker, const std::string& library, const std::string& order) {
    const bool own_first = order == "own-first";
    const std::string& first_copy = own_first ? worker : library;
    const std::string& second_copy = own_first ? library : worker;
    std::string out;
    ASSERT_EQ(run_worker(worker, library, order, &out), 0) << out;
    EXPECT_NE(out.find("first=0\n"), std::string::npos) << "the first copy must open its session:\n" << out;
    EXPECT_NE(out.find("second=" + std::to_string(VRAMSWAP_ERR_UNAVAILABLE) + "\n"), std::string::npos)
        << "the second copy must refuse with VRAMSWAP_ERR_UNAVAILABLE:\n" << out;
    const size_t message = out.find("second_error=");
    ASSERT_NE(message, std::string::npos) << out;
    const std::string text = out.substr(message);
    EXPECT_NE(text.find("already runs vramswap's runtime from " + first_copy), std::string::npos) << text;
    EXPECT_NE(text.find("this copy (" + second_copy + ")"), std::string::npos) << text;
    EXPECT_NE(text.find("LD_PRELOAD=libvramswap_preload.so"), std::string::npos) << "the message says what to do:\n" << text;
  }

  api_test_env env_{1};
};

TEST_F(TwoRuntimes, TheLibraryRefusesWhenTheProgramsOwnCopyCameFirst) {
  expect_second_refused(VRAMSWAP_TWO_RUNTIMES_WORKER, VRAMSWAP_LIBRARY, "own-first");
}

TEST_F(TwoRuntimes, TheProgramsOwnCopyRefusesWhenTheLibraryCameFirst) {
  expect_second_refused(VRAMSWAP_TWO_RUNTIMES_WORKER, VRAMSWAP_LIBRARY, "library-first");
}

// A socket name holds 107 bytes and install paths (a container's, a CI checkout's) can be
// longer: copies of the worker and the library in a folder whose path is well past that are
// still both named in full.
TEST_F(TwoRuntimes, BothCopiesAreNamedInFullHoweverLongTheirPaths) {
  const std::string folder = env_.runtime_dir() + "/" + std::string(120, 'p') + "/" + std::string(60, 'q');
  std::filesystem::create_directories(folder);
  const std::string worker = folder + "/two_runtimes_worker";
  const std::string library = folder + "/libvramswap.so";
  std::filesystem::copy_file(VRAMSWAP_TWO_RUNTIMES_WORKER, worker);
  std::filesystem::copy_file(VRAMSWAP_LIBRARY, library);
  ASSERT_GT(library.size(), 200u);
  expect_second_refused(worker, library, "own-first");
  expect_second_refused(worker, library, "library-first");
  std::filesystem::remove_all(env_.runtime_dir() + "/" + std::string(120, 'p'));
}

// Containers that share the host's network (one network namespace, hence one abstract
// socket namespace) but each have a pid namespace repeat pids: two processes, each pid 1 of a
// pid namespace made here with unshare, both run one copy of the runtime and both must be
// allowed to (the claim names the pid namespace and the start time, not the pid alone).
TEST_F(TwoRuntimes, ProcessesWithTheSamePidInTwoPidNamespacesBothClaimTheirOwn) {
  struct child {
    pid_t pid = -1;
    int in = -1;   // its stdin: closing it ends the child
    int out = -1;  // its stdout
  };
  auto start = [](child* c) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) return false;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in[0], 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    const char* argv[] = {"unshare", "--pid", "--fork", "--mount-proc", VRAMSWAP_RUNTIME_CLAIM_WORKER, nullptr};
    const int spawned = ::posix_spawnp(&c->pid, "unshare", &actions, nullptr, const_cast<char**>(argv), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(in[0]);
    ::close(out[1]);
    c->in = in[1];
    c->out = out[0];
    return spawned == 0;
  };
  auto first_line = [](int fd) {
    std::string line;
    char ch;
    while (::read(fd, &ch, 1) == 1 && ch != '\n') line += ch;
    return line;
  };
  child a, b;
  ASSERT_TRUE(start(&a)) << "posix_spawnp(unshare) failed";
  const std::string line_a = first_line(a.out);
  if (line_a.empty()) {
    ::close(a.in);
    int status = 0;
    ::waitpid(a.pid, &status, 0);
    GTEST_SKIP() << "cannot make a pid namespace here (unshare --pid --fork --mount-proc failed, exit "
                 << (WIFEXITED(status) ? WEXITSTATUS(status) : -1) << "): this case needs root or user namespaces";
  }
  ASSERT_TRUE(start(&b)) << "posix_spawnp(unshare) failed";
  const std::string line_b = first_line(b.out);
  EXPECT_EQ(line_a, "claim=0 pid=1") << "the first process in its own pid namespace";
  EXPECT_EQ(line_b, "claim=0 pid=1") << "the second, pid 1 of another pid namespace, while the first holds its claim";
  for (child* c : {&a, &b}) {
    ::close(c->in);
    int status = 0;
    EXPECT_EQ(::waitpid(c->pid, &status, 0), c->pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
    ::close(c->out);
  }
}

}  // namespace
}  // namespace vramswap::detail::test

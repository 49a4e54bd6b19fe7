// A benchmark's worker processes: the benchmark itself (/proc/self/exe) spawned with
// arguments and extra environment, its stdout read through a pipe.
#pragma once

#include <fcntl.h>
#include <spawn.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <string>
#include <vector>

#include "core/status.hpp"
#include "support/bench_util.hpp"

extern char** environ;

namespace vramswap::detail::bench {

struct child {
  pid_t pid = -1;
  FILE* out = nullptr;  // the child's stdout
};

// Spawns this program with `args` (argv[0] first) and this process's environment plus
// `extra_env`; exits the benchmark when it cannot.
inline child spawn_self(const std::vector<std::string>& args, const std::vector<std::string>& extra_env) {
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) check(fail_errno(errno, "pipe"), "spawn");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, pipefd[1], 1);
  std::vector<std::string> a = args;
  std::vector<char*> argv;
  for (auto& x : a) argv.push_back(x.data());
  argv.push_back(nullptr);
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  for (const auto& e : extra_env) env.push_back(e);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  child c;
  if (::posix_spawn(&c.pid, "/proc/self/exe", &fa, nullptr, argv.data(), envp.data()) != 0) {
    check(fail(err_system, "posix_spawn"), "spawn");
  }
  posix_spawn_file_actions_destroy(&fa);
  ::close(pipefd[1]);
  c.out = ::fdopen(pipefd[0], "r");
  return c;
}

}  // namespace vramswap::detail::bench

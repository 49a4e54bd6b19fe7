// A private vramswap deployment for one multi-process test: its own shm prefix and runtime
// directory (so concurrent test runs never meet), the environment its child processes get,
// spawning them, and the clean-up that stops the pool server they started on demand.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/options.hpp"
#include "core/status.hpp"
#include "pool/pool_segment.hpp"
#include "lock/shared_segment.hpp"

extern char** environ;

namespace vramswap::detail::test {

class deployment {
 public:
  // `tag` names the test's files; `key` is the device key its pool and lock are named by
  // ("host-0", or a GPU UUID). `env` is VRAMSWAP_* settings for the children; the prefix,
  // runtime directory and VRAMSWAP_SERVER are added here.
  void create(const std::string& tag, const std::string& key, std::vector<std::string> env) {
    static int counter = 0;
    key_ = key;
    prefix_ = tag + std::to_string(getpid()) + "x" + std::to_string(counter++) + "-";
    std::string templ = "/tmp/vramswap-" + tag + "-XXXXXX";
    ASSERT_NE(::mkdtemp(templ.data()), nullptr);
    dir_ = templ;
    option_set(option_id::shm_prefix, prefix_.c_str());
    option_set(option_id::runtime_dir, dir_.c_str());  // where the test itself finds the segments
    env_ = std::move(env);
    env_.push_back("VRAMSWAP_SHM_PREFIX=" + prefix_);
    env_.push_back("VRAMSWAP_RUNTIME_DIR=" + dir_);
    env_.push_back(std::string("VRAMSWAP_SERVER=") + VRAMSWAP_SERVER_BINARY);
  }

  // Stop the server that was started on demand (it is detached: found through the pid it
  // published in the pool segment), remove the segment names and the runtime directory.
  void destroy() {
    std::string name;
    std::unique_ptr<pool_segment> pool;
    if (pool_segment::name_for(key_, &name) == ok && pool_segment::open(name, &pool, true) == ok) {
      const pid_t server = pool->header()->server_pid;
      if (server > 0) ::kill(server, SIGTERM);
      for (int i = 0; i < 200 && server > 0 && ::kill(server, 0) == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    pool.reset();
    pool_segment::remove(key_);
    shared_segment::remove(key_);
    if (DIR* d = ::opendir(dir_.c_str())) {
      while (dirent* e = ::readdir(d)) {
        if (e->d_name[0] != '.') ::unlink((dir_ + "/" + e->d_name).c_str());
      }
      ::closedir(d);
    }
    ::rmdir(dir_.c_str());
    option_set(option_id::shm_prefix, nullptr);
    option_set(option_id::runtime_dir, nullptr);
  }

  // Spawn `args` with this process's environment less VRAMSWAP_*, plus the deployment's
  // settings and `extra` (which wins over a setting of the same name); stdout to `out_file`
  // and stderr to `err_file` when given.
  pid_t spawn(std::vector<std::string> args, const std::vector<std::string>& extra = {}, const std::string& out_file = "",
              const std::string& err_file = "") const {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> all;
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::strncmp(*e, "VRAMSWAP_", 9) != 0) all.emplace_back(*e);
    }
    for (const auto& e : env_) {
      const std::string name = e.substr(0, e.find('=') + 1);
      bool overridden = false;
      for (const auto& x : extra) overridden |= x.rfind(name, 0) == 0;
      if (!overridden) all.push_back(e);
    }
    for (const auto& e : extra) all.push_back(e);
    std::vector<char*> envp;
    for (auto& e : all) envp.push_back(e.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (!out_file.empty()) posix_spawn_file_actions_addopen(&fa, 1, out_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (!err_file.empty()) posix_spawn_file_actions_addopen(&fa, 2, err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    pid_t pid = -1;
    EXPECT_EQ(::posix_spawnp(&pid, argv[0], &fa, nullptr, argv.data(), envp.data()), 0) << args[0];
    posix_spawn_file_actions_destroy(&fa);
    return pid;
  }

  // Map the pool segment once the server made it, waiting up to wait_ms.
  bool open_pool(std::unique_ptr<pool_segment>* out, int wait_ms, bool read_only = false) const {
    std::string name;
    if (pool_segment::name_for(key_, &name) != ok) return false;
    for (int waited = 0;; waited += 5) {
      if (pool_segment::open(name, out, read_only) == ok) return true;
      if (waited >= wait_ms) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  const std::string& dir() const noexcept { return dir_; }
  const std::string& key() const noexcept { return key_; }
  const std::string& prefix() const noexcept { return prefix_; }

 private:
  std::string key_, prefix_, dir_;
  std::vector<std::string> env_;
};

}  // namespace vramswap::detail::test

// A private deployment per test for tests of the public API (which only sees the
// environment): its own segment prefix, socket directory, pool size; and, at the end, the
// pool servers it started stopped and their segments removed. The runtime is process-wide,
// so end() also closes this process's sessions.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace vramswap::detail::test {

class api_test_env {
 public:
  // Sets VRAMSWAP_* in this process's environment (children inherit it). `devices`: host
  // devices whose servers end() stops.
  explicit api_test_env(int devices = 2);
  ~api_test_env() { end(); }
  void end();
  const std::string& prefix() const { return prefix_; }
  const std::string& runtime_dir() const { return runtime_dir_; }

 private:
  std::string prefix_, runtime_dir_;
  int devices_;
  bool ended_ = false;
};

}  // namespace vramswap::detail::test

// Reading what a spawned test process left in its output files: the whole file, and its
// summary line of key=value numbers (the workers and examples print one).
#pragma once

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

namespace vramswap::detail::test {

inline std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Every key=value word of the file, as numbers (missing keys read as 0 through operator[]).
inline std::map<std::string, double> key_values(const std::string& path) {
  std::map<std::string, double> out;
  std::istringstream in(slurp(path));
  std::string kv;
  while (in >> kv) {
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) out[kv.substr(0, eq)] = std::atof(kv.c_str() + eq + 1);
  }
  return out;
}

}  // namespace vramswap::detail::test

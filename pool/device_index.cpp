#include "pool/device_index.hpp"

#include <dirent.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>

namespace vramswap::detail {

std::vector<numbered_device> nvidia_gpus(const std::string& proc_root) noexcept {
  std::vector<numbered_device> gpus;
  try {
    const std::string dir = proc_root + "/driver/nvidia/gpus";
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return gpus;
    while (const dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream info(dir + "/" + e->d_name + "/information");
      // "GPU UUID: \t GPU-8a3f...": the value after the colon, blanks trimmed.
      for (std::string line; std::getline(info, line);) {
        if (line.rfind("GPU UUID:", 0) != 0) continue;
        size_t at = line.find(':') + 1;
        while (at < line.size() && std::isspace(static_cast<unsigned char>(line[at]))) ++at;
        size_t end = line.size();
        while (end > at && std::isspace(static_cast<unsigned char>(line[end - 1]))) --end;
        if (end > at) gpus.push_back({-1, line.substr(at, end - at), e->d_name});
        break;
      }
    }
    ::closedir(d);
    // PCI bus ids of one width ("0000:18:00.0"), so their text order is the bus order.
    std::sort(gpus.begin(), gpus.end(), [](const numbered_device& a, const numbered_device& b) { return a.bus_id < b.bus_id; });
    for (size_t i = 0; i < gpus.size(); ++i) gpus[i].index = static_cast<int>(i);
  } catch (...) {
    gpus.clear();
  }
  return gpus;
}

int device_index_of(const std::string& key, const std::vector<numbered_device>& gpus) noexcept {
  if (key.rfind("host-", 0) == 0 && key.size() > 5 && key.size() < 10 &&
      std::all_of(key.begin() + 5, key.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; })) {
    return std::atoi(key.c_str() + 5);
  }
  // The driver and the cuda backend both write the UUID in lowercase hex; compare as words.
  const auto same = [](const std::string& a, const std::string& b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
             return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
           });
  };
  for (const numbered_device& g : gpus) {
    if (same(g.key, key)) return g.index;
  }
  return -1;
}

}  // namespace vramswap::detail

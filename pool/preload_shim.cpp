#include "pool/preload_shim.hpp"

namespace vramswap::detail {
namespace {

template <class Visit>
void for_each_preload(const std::string& ld_preload, Visit visit) {
  size_t start = 0;
  while (start <= ld_preload.size()) {
    size_t end = ld_preload.find_first_of(" :", start);
    if (end == std::string::npos) end = ld_preload.size();
    const std::string entry = ld_preload.substr(start, end - start);
    const size_t slash = entry.rfind('/');
    const std::string file = slash == std::string::npos ? entry : entry.substr(slash + 1);
    if (!entry.empty()) visit(entry, file == k_preload_shim_name);
    start = end + 1;
  }
}

}  // namespace

std::string without_preload_shim(const std::string& ld_preload) {
  std::string kept;
  for_each_preload(ld_preload, [&](const std::string& entry, bool shim) {
    if (shim) return;
    if (!kept.empty()) kept += ':';
    kept += entry;
  });
  return kept;
}

bool preloads_shim(const std::string& ld_preload) {
  bool found = false;
  for_each_preload(ld_preload, [&](const std::string&, bool shim) { found = found || shim; });
  return found;
}

}  // namespace vramswap::detail

// The second error tier: status codes (core/status.hpp) become typed exceptions here, and
// only here. Python's mapping (python/src/errors.cpp) follows these types.
#include "core/status.hpp"
#include "vramswap/vramswap.hpp"

namespace vramswap {
// The public types are defined here over the internal status codes and runtime.
using namespace detail;

error::error(int code, const std::string& what) : std::runtime_error(what), code_(code) {}

void throw_error(int code, const std::string& detail) {
  const std::string what = detail.empty() ? std::string("vramswap: ") + status_name(code) : detail;
  switch (code) {
    case err_invalid_argument: throw invalid_argument(code, what);
    case err_out_of_memory: throw out_of_memory(code, what);
    case err_cuda: throw cuda_error(code, what);
    case err_version_mismatch: throw version_mismatch(code, what);
    case err_timeout: throw timeout(code, what);
    case err_unavailable: throw unavailable(code, what);
    default: throw error(code, what);  // not_owner, busy, system, io, no_space, internal, ...
  }
}

}  // namespace vramswap

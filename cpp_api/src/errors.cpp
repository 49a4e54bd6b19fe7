// The second error tier: status codes (vramswap.h's, the runtime's) become typed exceptions
// here, and only here. Python's mapping (python/src/errors.cpp) follows these types.
#include "runtime/runtime.hpp"
#include "vramswap/vramswap.hpp"

namespace vramswap {

error::error(int code, const std::string& what) : std::runtime_error(what), code_(code) {}

void throw_error(int code, const std::string& detail) {
  const std::string what = detail.empty() ? std::string("vramswap: ") + vramswap::detail::rt::status_name(code) : detail;
  switch (code) {
    case VRAMSWAP_ERR_INVALID_ARGUMENT: throw invalid_argument(code, what);
    case VRAMSWAP_ERR_OUT_OF_MEMORY: throw out_of_memory(code, what);
    case VRAMSWAP_ERR_CUDA: throw cuda_error(code, what);
    case VRAMSWAP_ERR_VERSION_MISMATCH: throw version_mismatch(code, what);
    case VRAMSWAP_ERR_TIMEOUT: throw timeout(code, what);
    case VRAMSWAP_ERR_UNAVAILABLE: throw unavailable(code, what);
    default: throw error(code, what);  // not_owner, busy, system, io, no_space, internal, ...
  }
}

}  // namespace vramswap

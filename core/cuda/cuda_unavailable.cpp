// The cuda backend of a build made without cuda.h (no CUDA toolkit headers at configure
// time): the library still builds and runs its host backend, and asking for the cuda
// backend says why it cannot work and what to do about it.
#include "core/backend_impls.hpp"
#include "core/status.hpp"

namespace vramswap::detail {

int make_cuda_backend(std::unique_ptr<backend>* out) {
  out->reset();
  return fail(err_unavailable,
              "vramswap was built without cuda.h (CUDA toolkit headers); rebuild with the CUDA toolkit "
              "installed to use the cuda backend");
}

}  // namespace vramswap::detail

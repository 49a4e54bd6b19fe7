// Constructors of the two backend implementations; make_backend() picks one.
// Only core/backend.cpp and tests need this header.
#pragma once

#include <memory>

#include "core/backend.hpp"

namespace vramswap::detail {

// The host emulation (core/host/). Fails only on bad VRAMSWAP_HOST_* options.
int make_host_backend(std::unique_ptr<backend>* out);

// The CUDA driver backend (core/cuda/): dlopen("libcuda.so.1"), cuGetProcAddress, cuInit.
// err_unavailable with the reason when there is no driver, no GPU, or no cuda.h at build.
int make_cuda_backend(std::unique_ptr<backend>* out);

}  // namespace vramswap::detail

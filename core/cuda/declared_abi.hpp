// Driver functions whose name cuda.h declares with an older ABI than the driver's newest.
//
// cuGetProcAddress(name, version) returns the ABI that `name` had at `version`. For most
// functions that is what cuda.h declares at its own CUDA_VERSION: when CUDA gives a function
// a new ABI, cuda.h #defines the name to the new symbol (cuMemGetInfo -> cuMemGetInfo_v2).
// CUDA 13.0 broke that rule for two functions: cuCtxSynchronize and cuCtxGetDevice got new
// ABIs taking a CUcontext (PFN_..._v13000), yet cuda.h still declares the argument-less /
// one-argument ones under those names. Fetched at 13000, the pointer is the new function;
// called the way the header says, it crashes inside libcuda (docs/oversubscription.md, "Two
// CUDA 13 pitfalls"). Fetched at 12000 it is the function the header declares.
//
// Both places that fetch driver functions ask here first: the library's driver table
// (core/cuda/cuda_driver.cpp) and the preload shim's own lookups (preload/lookup.cpp).
// Header-only and dependency-free, so that the shim can use it without core/cuda's table.
#pragma once

#include <string_view>

namespace vramswap::detail::cuda {

struct redeclared_function {
  std::string_view name;
  int declared_version;  // the newest version whose ABI is the one cuda.h declares
};

inline constexpr redeclared_function k_redeclared_functions[] = {
    {"cuCtxSynchronize", 12000},
    {"cuCtxGetDevice", 12000},
};

// The version to ask cuGetProcAddress for `name` at, for a caller compiled against
// `wanted` (CUDA_VERSION, or lower for an older driver): `wanted`, except for the functions
// above, which are capped at the last version whose ABI cuda.h declares.
constexpr int declared_abi_version(std::string_view name, int wanted) {
  for (const redeclared_function& f : k_redeclared_functions) {
    if (f.name == name) return wanted < f.declared_version ? wanted : f.declared_version;
  }
  return wanted;
}

static_assert(declared_abi_version("cuCtxSynchronize", 13000) == 12000);
static_assert(declared_abi_version("cuCtxSynchronize", 11040) == 11040);
static_assert(declared_abi_version("cuMemGetInfo", 13000) == 13000);

}  // namespace vramswap::detail::cuda

// The Python module vramswap._vramswap: one init_<area>() per area of the public header
// (vramswap/vramswap.hpp), each in its own file; module.cpp only calls them (MLX's shape).
#pragma once

#include <pybind11/pybind11.h>

namespace vramswap::detail::python {

void init_errors(pybind11::module_& m);   // errors.cpp: exception types and their translation
void init_lock(pybind11::module_& m);     // lock.cpp: acquire / release / held
void init_memory(pybind11::module_& m);   // memory.cpp: malloc / free / advise / stats
void init_testing(pybind11::module_& m);  // testing.cpp: vramswap._testing (tests only)

}  // namespace vramswap::detail::python

#include "bindings.hpp"
#include "vramswap/version.hpp"

#define VRAMSWAP_STR2(x) #x
#define VRAMSWAP_STR(x) VRAMSWAP_STR2(x)

PYBIND11_MODULE(_vramswap, m) {
  m.doc() = "vramswap's native module; use the package `vramswap`, which re-exports it.";
  m.attr("__version__") = VRAMSWAP_STR(VRAMSWAP_VERSION_MAJOR) "." VRAMSWAP_STR(VRAMSWAP_VERSION_MINOR) "." VRAMSWAP_STR(
      VRAMSWAP_VERSION_PATCH);
  vramswap::detail::python::init_errors(m);
  vramswap::detail::python::init_lock(m);
  vramswap::detail::python::init_memory(m);
  vramswap::detail::python::init_testing(m);
}

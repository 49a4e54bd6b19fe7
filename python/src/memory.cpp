// Raw device memory for Python, as integers (addresses), and this process's statistics.
#include <pybind11/stl.h>

#include <string>

#include "bindings.hpp"
#include "runtime/runtime.hpp"
#include "vramswap/vramswap.h"
#include "vramswap/vramswap.hpp"

namespace py = pybind11;

namespace vramswap::detail::python {
namespace {
// stats()'s docstring names the dict's keys from the list that makes them.
const std::string& stats_doc() {
  static const std::string doc = [] {
    std::string text = "This process's numbers on the device, as a dict (the fields of vramswap::stats): ";
    const char* separator = "";
#define VRAMSWAP_FIELD(name, type) \
  text += separator;               \
  text += #name;                   \
  separator = ", ";
    VRAMSWAP_PROCESS_STATS(VRAMSWAP_FIELD)
#undef VRAMSWAP_FIELD
    return text + ".";
  }();
  return doc;
}

advice parse_advice(const std::string& text) {
  if (text == "normal") return advice::normal;
  if (text == "discardable") return advice::discardable;
  if (text == "read_mostly") return advice::read_mostly;
  throw vramswap::invalid_argument(VRAMSWAP_ERR_INVALID_ARGUMENT,
                                   "advise: advice must be 'normal', 'discardable' or 'read_mostly', not '" + text + "'");
}
}  // namespace

void init_memory(py::module_& m) {
  m.def(
      "malloc",
      [](size_t size, int device) {
        py::gil_scoped_release nogil;
        return reinterpret_cast<uintptr_t>(vramswap::malloc(size, device));
      },
      py::arg("size"), py::arg("device") = 0,
      R"doc(Allocate `size` bytes of this process's device memory (256-byte aligned) and return its
address as an int. The address never changes, whatever is swapped. Allocating without the
lock is fine: the memory is backed at once when the pool has free frames for it (and is then
usable until another process needs them), else at the next acquire. The device may touch it
only while this process holds the lock. Raises MemoryError, ValueError (size 0, bad device).)doc");
  m.def(
      "free",
      [](uintptr_t ptr, int device) {
        py::gil_scoped_release nogil;
        vramswap::free(reinterpret_cast<void*>(ptr), device);
      },
      py::arg("ptr"), py::arg("device") = 0,
      "Free what malloc() returned (0 is ignored). Raises ValueError for any other address.");
  m.def(
      "advise",
      [](uintptr_t ptr, size_t size, const std::string& a, int device) {
        const advice parsed = parse_advice(a);
        py::gil_scoped_release nogil;
        vramswap::advise(reinterpret_cast<void*>(ptr), size, parsed, device);
      },
      py::arg("ptr"), py::arg("size"), py::arg("advice"), py::arg("device") = 0,
      R"doc(Attach a hint to [ptr, ptr + size), a range inside one allocation:
'discardable' (contents need not survive eviction: they come back zero-filled),
'read_mostly' (not written while the hint stands: a host copy is kept so eviction is free;
advise again after writing), or 'normal'.)doc");
  m.def(
      "stats",
      [](int device) {
        stats s;
        {
          py::gil_scoped_release nogil;
          s = get_stats(device);
        }
        py::dict d;
#define VRAMSWAP_FIELD(name, type) d[#name] = s.name;
        VRAMSWAP_PROCESS_STATS(VRAMSWAP_FIELD)
#undef VRAMSWAP_FIELD
        return d;
      },
      py::arg("device") = 0,
      stats_doc().c_str());
  m.def(
      "release_cached",
      [](int device) {
        py::gil_scoped_release nogil;
        vramswap::release_cached(device);
      },
      py::arg("device") = 0,
      R"doc(Synchronize the device and give back every block that stream-ordered frees keep for
reuse (what vramswap.torch frees): stats()['cached_bytes'] drops to 0.)doc");
}

}  // namespace vramswap::detail::python

// Raw device memory for Python, as integers (addresses), and this process's statistics.
#include <pybind11/stl.h>

#include <string>

#include "bindings.hpp"
#include "vramswap/vramswap.h"
#include "vramswap/vramswap.hpp"

namespace py = pybind11;

namespace vramswap::detail::python {
namespace {
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
        d["allocated_bytes"] = s.allocated_bytes;
        d["allocations"] = s.allocations;
        d["resident_bytes"] = s.resident_bytes;
        d["host_bytes"] = s.host_bytes;
        d["disk_bytes"] = s.disk_bytes;
        d["bytes_in"] = s.bytes_in;
        d["bytes_out"] = s.bytes_out;
        d["acquires"] = s.acquires;
        d["evictions_served"] = s.evictions_served;
        d["lock_holder_deaths"] = s.lock_holder_deaths;
        d["acquire_seconds"] = s.acquire_seconds;
        d["lock_wait_seconds"] = s.lock_wait_seconds;
        d["evict_seconds"] = s.evict_seconds;
        d["restore_seconds"] = s.restore_seconds;
        d["cached_bytes"] = s.cached_bytes;
        d["graph_bytes"] = s.graph_bytes;
        d["host_frame_bytes"] = s.host_frame_bytes;
        d["pages_demoted"] = s.pages_demoted;
        d["pages_promoted"] = s.pages_promoted;
        d["reclaim_seconds"] = s.reclaim_seconds;
        return d;
      },
      py::arg("device") = 0,
      R"doc(This process's numbers on the device, as a dict (the fields of vramswap::stats):
allocated_bytes, allocations, resident_bytes, host_bytes, disk_bytes, bytes_in, bytes_out,
acquires, evictions_served, lock_holder_deaths, acquire_seconds, lock_wait_seconds,
evict_seconds, restore_seconds, cached_bytes, graph_bytes, host_frame_bytes, pages_demoted,
pages_promoted, reclaim_seconds.)doc");
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

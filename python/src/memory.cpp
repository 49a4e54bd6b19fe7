// Raw device memory for Python, as integers (addresses), and this process's statistics.
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

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
      [](size_t size, int device, std::optional<std::string> tag) {
        py::gil_scoped_release nogil;
        return reinterpret_cast<uintptr_t>(tag ? vramswap::malloc(size, device, *tag) : vramswap::malloc(size, device));
      },
      py::arg("size"), py::arg("device") = 0, py::arg("tag") = py::none(),
      R"doc(Allocate `size` bytes of this process's device memory (256-byte aligned) and return its
address as an int. The address never changes, whatever is swapped. Allocating without the
lock is fine: the memory is backed at once when the pool has free frames for it (and is then
usable until another process needs them), else at the next acquire. The device may touch it
only while this process holds the lock. `tag` names the memory class it belongs to (see
sleep(); default: this thread's tag, vramswap.memory_tag(), else none). Raises MemoryError,
ValueError (size 0, bad device, a bad tag or one asleep).)doc");
  m.def(
      "_sleep",
      [](const std::vector<std::pair<std::string, int>>& tags, int device) {
        std::vector<tag_sleep> asked;
        for (const auto& [tag, mode] : tags) asked.push_back({tag, static_cast<sleep_mode>(mode)});
        py::gil_scoped_release nogil;
        vramswap::sleep(asked, device);
      },
      py::arg("tags"), py::arg("device") = 0, "vramswap.sleep's native half: [(tag, 0 offload | 1 discard)].");
  m.def(
      "_wake",
      [](std::optional<std::vector<std::string>> tags, int device) {
        py::gil_scoped_release nogil;
        vramswap::wake(tags ? *tags : std::vector<std::string>{}, device);
      },
      py::arg("tags") = py::none(), py::arg("device") = 0,
      "vramswap.wake's native half: a list of tags, or None for every sleeping one.");
  m.def(
      "keep_resident",
      [](int device) {
        py::gil_scoped_release nogil;
        vramswap::keep_resident(device);
      },
      py::arg("device") = 0,
      R"doc(From now on this process's memory on the device stays resident without the lock, and
leaves it only by sleep(): for processes that share a GPU by sleeping and waking (a rollout
engine and a trainer colocated) rather than by taking turns. gpu_lock() of the device is
refused afterwards. Raises ValueError (the lock held, a gang rank, an oversubscribed process).)doc");
  m.def(
      "tags",
      [](int device) {
        std::vector<tag_info> all;
        {
          py::gil_scoped_release nogil;
          all = vramswap::tags(device);
        }
        py::list out;
        for (const tag_info& t : all) {
          py::dict d;
          d["name"] = t.name;
          d["allocated_bytes"] = t.allocated_bytes;
          d["allocations"] = t.allocations;
          d["reserved_bytes"] = t.reserved_bytes;
          d["asleep"] = t.asleep;
          d["mode"] = t.asleep ? py::object(py::str(t.mode == sleep_mode::discard ? "discard" : "offload")) : py::object(py::none());
          out.append(d);
        }
        return out;
      },
      py::arg("device") = 0,
      "This process's memory tags on the device, in the order they were made: a list of dicts "
      "(name, allocated_bytes, allocations, reserved_bytes, asleep, mode: 'offload'/'discard' while asleep, else None).");
  m.def(
      "_set_thread_tag", [](const std::string& tag) { vramswap::set_thread_tag(tag); }, py::arg("tag"),
      "Set this thread's allocation tag ('' clears it); vramswap.memory_tag() is the context manager.");
  m.def(
      "_thread_tag", [] { return vramswap::thread_tag(); }, "This thread's allocation tag ('' when none).");
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

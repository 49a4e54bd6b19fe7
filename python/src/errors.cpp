// C++ exceptions (vramswap/vramswap.hpp) as the Python exceptions a Python user expects:
//   invalid_argument -> ValueError        out_of_memory -> MemoryError
//   timeout          -> TimeoutError      anything else -> vramswap.Error (a RuntimeError),
// with subclasses UnavailableError, CudaError and VersionMismatchError. Every one carries
// `code`, the C API's status code (vramswap.h), and the C++ message unchanged.
#include <Python.h>

#include "bindings.hpp"
#include "vramswap/vramswap.hpp"

namespace py = pybind11;

namespace vramswap::detail::python {
namespace {
// Created once, kept for the life of the process (never decref'ed: the translator may run
// late in finalization).
PyObject* g_error = nullptr;
PyObject* g_unavailable = nullptr;
PyObject* g_cuda = nullptr;
PyObject* g_version = nullptr;

void raise(PyObject* type, const vramswap::error& e) {
  PyObject* inst = PyObject_CallFunction(type, "s", e.what());
  if (inst == nullptr) return;  // the call's own error stands
  PyObject* code = PyLong_FromLong(e.code());
  if (code != nullptr) {
    PyObject_SetAttrString(inst, "code", code);
    Py_DECREF(code);
  }
  PyErr_SetObject(type, inst);
  Py_DECREF(inst);
}

PyObject* make(py::module_& m, const char* name, PyObject* base, const char* doc) {
  const std::string full = std::string("vramswap.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(full.c_str(), doc, base, nullptr);
  if (type == nullptr) throw py::error_already_set();
  m.attr(name) = py::handle(type);  // the module holds a reference, and so do we (never dropped)
  return type;
}
}  // namespace

void init_errors(py::module_& m) {
  g_error = make(m, "Error", PyExc_RuntimeError,
                 "A vramswap failure that is not a bad argument (ValueError), out of memory (MemoryError) or a timeout "
                 "(TimeoutError). `code` is the C API's status code; the message names the call and what to do.");
  g_unavailable = make(m, "UnavailableError", g_error,
                       "vramswap cannot work here: no usable backend or device, no pool server, or a process forked after "
                       "vramswap was used (use the 'spawn' start method).");
  g_cuda = make(m, "CudaError", g_error, "The CUDA driver reported an error; the message carries its name.");
  g_version = make(m, "VersionMismatchError", g_error,
                   "Shared state or the pool server belongs to an incompatible vramswap version.");
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const vramswap::invalid_argument& e) {
      raise(PyExc_ValueError, e);
    } catch (const vramswap::out_of_memory& e) {
      raise(PyExc_MemoryError, e);
    } catch (const vramswap::timeout& e) {
      raise(PyExc_TimeoutError, e);
    } catch (const vramswap::unavailable& e) {
      raise(g_unavailable, e);
    } catch (const vramswap::cuda_error& e) {
      raise(g_cuda, e);
    } catch (const vramswap::version_mismatch& e) {
      raise(g_version, e);
    } catch (const vramswap::error& e) {
      raise(g_error, e);
    }
  });
}

}  // namespace vramswap::detail::python

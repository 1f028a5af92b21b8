// Python bindings of fastnorm._C. Only declarations here; the kernels live in kernels.cpp.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "fastnorm.h"
#include "snapshot.h"
#include "thread_pool.h"

#if !defined(FASTNORM_SOURCE_HASH)
#define FASTNORM_SOURCE_HASH "unknown"
#endif

namespace py = pybind11;
using fastnorm::Attr;
using fastnorm::TaskSplit;
using fastnorm::Snapshot;
using fastnorm::TensorAccess;

namespace {

// (owner, name, descriptor, is_method) for each of TensorAccess's attributes, in order.
TensorAccess access_from(const py::tuple& attrs) {
  TensorAccess access;
  Attr* fields[] = {&access.grad,  &access.tensor_grad,   &access.requires_grad,
                    &access.data_ptr, &access.nbytes, &access.dtype,
                    &access.is_contiguous, &access.shape, &access.stride, &access.version};
  if (attrs.size() != std::size(fields)) {
    throw std::invalid_argument("fastnorm._C.Snapshot: access must list " +
                                std::to_string(std::size(fields)) + " attributes");
  }
  for (size_t i = 0; i < std::size(fields); ++i) {
    const auto spec = attrs[i].cast<py::tuple>();
    fields[i]->owner = spec[0];
    fields[i]->name = spec[1].cast<py::str>();
    fields[i]->descriptor = spec[2];
    fields[i]->method = spec[3].cast<bool>();
  }
  return access;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "fastnorm CPU kernels (raw addresses in, no libtorch)";

  py::class_<TaskSplit>(m, "TaskSplit")
      .def(py::init<const std::vector<uintptr_t>&, const std::vector<int64_t>&,
                    const std::vector<int>&, int64_t>(),
           py::arg("addrs"), py::arg("numels"), py::arg("dtypes"), py::arg("task_bytes"))
      .def_property_readonly("num_tasks", &TaskSplit::num_tasks)
      .def_property_readonly("num_pieces", &TaskSplit::num_pieces)
      .def_property_readonly("num_tensors", &TaskSplit::num_tensors)
      .def_property_readonly("numel", &TaskSplit::numel)
      .def_property_readonly("nbytes", &TaskSplit::nbytes)
      .def("set_gates", &TaskSplit::set_gates, py::arg("first_item"),
           "For reduce_checked: the index of the first item that gives each tensor.");

  py::class_<Snapshot>(m, "Snapshot")
      .def(py::init([](int kind, const py::list& items, const py::list& grads, const py::tuple& access) {
             return new Snapshot(kind, items, grads, access_from(access));
           }),
           py::arg("kind"), py::arg("items"), py::arg("grads"), py::arg("access"))
      .def("matches", &Snapshot::matches, py::arg("items"), py::arg("grads") = py::none(),
           py::arg("written") = py::none(), py::arg("held") = py::none(),
           "Whether the items are the same objects whose gradients have the same facts; "
           "`written` (a list) then receives what clip_ writes, `held` every tensor the split reads.")
      .def("__len__", &Snapshot::size);

  m.def("reduce", &fastnorm::reduce, py::arg("split"), py::arg("mode"), py::arg("p"),
        py::arg("partial_addr"), py::arg("root_addr"), py::arg("root_is_double"),
        py::arg("per_tensor_addr"), py::arg("num_threads"),
        py::call_guard<py::gil_scoped_release>());
  m.def("reduce_stats", &fastnorm::reduce_stats, py::arg("split"), py::arg("mode"), py::arg("p"),
        py::arg("partial_addr"), py::arg("root_addr"), py::arg("root_is_double"), py::arg("thresholds_addr"),
        py::arg("limit_codes_addr"), py::arg("stats_addr"), py::arg("num_threads"),
        py::call_guard<py::gil_scoped_release>());
  m.def("count_stats", &fastnorm::count_stats, py::arg("addr"), py::arg("numel"), py::arg("dtype"),
        py::arg("limit_code"), py::arg("task_bytes"), py::arg("thresholds_addr"), py::arg("stats_addr"),
        py::arg("num_threads"), py::call_guard<py::gil_scoped_release>());
  m.def(
      "reduce_checked",
      [](const Snapshot& snapshot, const py::list& items, const py::handle& written, const TaskSplit& split,
         int mode, double p, uintptr_t partial_addr, uintptr_t root_addr, bool root_is_double,
         int num_threads) {
        // The check needs the GIL; the kernel, once the check is done, does not.
        // Every tensor checked stays referenced until the kernel has read it.
        py::list held;
        PyThreadState* released = nullptr;
        PyObject *error_type = nullptr, *error_value = nullptr, *error_traceback = nullptr;
        auto check = [&](std::atomic<int64_t>& progress) {
          const bool ok = snapshot.check(items, py::none(), written, &progress, held);
          // An exception to propagate, taken along while the GIL is released.
          if (!ok) PyErr_Fetch(&error_type, &error_value, &error_traceback);
          released = PyEval_SaveThread();
          return ok;
        };
        bool ok = false;
        try {
          ok = fastnorm::reduce_checked(split, check, mode, p, partial_addr, root_addr, root_is_double,
                                        num_threads);
        } catch (...) {
          if (released != nullptr) PyEval_RestoreThread(released);
          Py_XDECREF(error_type);
          Py_XDECREF(error_value);
          Py_XDECREF(error_traceback);
          throw;
        }
        if (released != nullptr) PyEval_RestoreThread(released);
        if (error_type != nullptr) {
          PyErr_Restore(error_type, error_value, error_traceback);
          throw py::error_already_set();
        }
        return ok;
      },
      py::arg("snapshot"), py::arg("items"), py::arg("written"), py::arg("split"), py::arg("mode"),
      py::arg("p"), py::arg("partial_addr"), py::arg("root_addr"), py::arg("root_is_double"),
      py::arg("num_threads"),
      "reduce() while snapshot.matches(items, None, written) runs: False, with nothing written, "
      "where it does not match; an exception the check propagates is raised, with nothing written.");
  m.def("scale_by_norm", &fastnorm::scale_by_norm, py::arg("split"), py::arg("norm_addr"),
        py::arg("norm_is_double"), py::arg("max_norm"), py::arg("num_threads"),
        py::call_guard<py::gil_scoped_release>());
  // An unknown or unsupported FASTNORM_ISA, or a FASTNORM_PREFETCH out of
  // range, fails the import, with its reason.
  fastnorm::isa();
  fastnorm::prefetch_bytes();
  m.def("isa", &fastnorm::isa, "The instruction set the kernels run with.");
  m.def("supported_isas", &fastnorm::supported_isas,
        "The instruction sets this build can run on this CPU, narrowest first.");
  m.def("use_isa", &fastnorm::use_isa, py::arg("name"),
        "Runs the calls that start afterwards with another instruction set (same bits).");
  m.def("prefetch_bytes", &fastnorm::prefetch_bytes,
        "How far ahead (bytes) the kernels' loops prefetch; 0 for not at all (FASTNORM_PREFETCH).");
  m.def("vendor_prefetch", &fastnorm::vendor_prefetch, py::arg("vendor"), py::arg("avx512"), py::arg("family") = 0,
        "The default prefetch distance (bytes) for a CPU of this vendor (intel, amd), with or without AVX-512, "
        "of this x86 family.");
  m.def("set_prefetch_bytes", &fastnorm::set_prefetch_bytes, py::arg("bytes"),
        "Sets the prefetch distance for the calls that start afterwards (same bits).");
  m.def("clock_hz", &fastnorm::clock_hz, py::arg("seconds") = 0.05,
        "The core clock in Hz, from a timed chain of dependent additions (0 where unknown).");
  m.def("source_hash", [] { return std::string(FASTNORM_SOURCE_HASH); },
        "The fingerprint of the sources this build was compiled from (fastnorm/_build.py).");
  m.def("attach_openmp", &fastnorm::ThreadPool::attach_openmp, py::arg("path"),
        "Run parallel tasks on the threads of the OpenMP runtime loaded from `path`.");
  m.def("uses_openmp", &fastnorm::ThreadPool::uses_openmp);
}

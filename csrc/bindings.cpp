// Python bindings of fastnorm._C. Only declarations here; the kernels live in kernels.cpp.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "fastnorm.h"
#include "thread_pool.h"

namespace py = pybind11;
using fastnorm::Plan;

PYBIND11_MODULE(_C, m) {
  m.doc() = "fastnorm CPU kernels (raw addresses in, no libtorch)";

  py::class_<Plan>(m, "Plan")
      .def(py::init<const std::vector<uintptr_t>&, const std::vector<int64_t>&,
                    const std::vector<int>&, int64_t>(),
           py::arg("addrs"), py::arg("numels"), py::arg("dtypes"), py::arg("task_bytes"))
      .def_property_readonly("num_tasks", &Plan::num_tasks)
      .def_property_readonly("num_pieces", &Plan::num_pieces)
      .def_property_readonly("num_tensors", &Plan::num_tensors)
      .def_property_readonly("numel", &Plan::numel)
      .def_property_readonly("nbytes", &Plan::nbytes);

  m.def("reduce", &fastnorm::reduce, py::arg("plan"), py::arg("mode"), py::arg("p"),
        py::arg("partial_addr"), py::arg("root_addr"), py::arg("root_is_double"),
        py::arg("per_tensor_addr"), py::arg("num_threads"),
        py::call_guard<py::gil_scoped_release>());
  m.def("scale_by_norm", &fastnorm::scale_by_norm, py::arg("plan"), py::arg("norm_addr"),
        py::arg("norm_is_double"), py::arg("max_norm"), py::arg("num_threads"),
        py::call_guard<py::gil_scoped_release>());
  // An unknown or unsupported FASTNORM_ISA fails the import, with its reason.
  fastnorm::isa();
  m.def("isa", &fastnorm::isa, "The instruction set the kernels run with.");
  m.def("supported_isas", &fastnorm::supported_isas,
        "The instruction sets this build can run on this CPU, narrowest first.");
  m.def("use_isa", &fastnorm::use_isa, py::arg("name"),
        "Runs the calls that start afterwards with another instruction set (same bits).");
  m.def("clock_hz", &fastnorm::clock_hz, py::arg("seconds") = 0.05,
        "The core clock in Hz, from a timed chain of dependent additions (0 where unknown).");
  m.def("attach_openmp", &fastnorm::ThreadPool::attach_openmp, py::arg("path"),
        "Run parallel tasks on the threads of the OpenMP runtime loaded from `path`.");
  m.def("uses_openmp", &fastnorm::ThreadPool::uses_openmp);
}

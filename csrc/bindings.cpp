// Python bindings of fastnorm._C. Only declarations here; the kernels live in kernels.cpp.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

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
  m.def("isa", &fastnorm::isa);
  m.def("attach_openmp", &fastnorm::ThreadPool::attach_openmp, py::arg("path"),
        "Run parallel tasks on the threads of the OpenMP runtime loaded from `path`.");
  m.def("uses_openmp", &fastnorm::ThreadPool::uses_openmp);
}

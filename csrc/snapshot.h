// What a cached plan depends on, per tensor, read and compared in one call.
//
// fastnorm/_plan.py keeps a plan while every gradient has the address, size,
// dtype and layout it was built for (its docstring says exactly when). Read
// from Python, those facts cost six attribute reads per tensor, most of a
// call's host time on many small tensors. Here they are read through the very
// same torch descriptors (Tensor.data_ptr, .nbytes, .dtype, ...), which Python
// hands over once, called straight from C: the answers are torch's own, so the
// check is exactly as strict, without the interpreter's cost around each read,
// and the extension still needs no torch to build.
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <cstdint>
#include <vector>

namespace fastnorm {

namespace py = pybind11;

// One attribute of a tensor as torch defines it: its descriptor, resolved by
// Python on `owner` (torch.Tensor, or Parameter for .grad). An object whose
// type is exactly `owner` is read through the descriptor, which is what
// Python's attribute lookup calls for it (these are data descriptors, which an
// instance's __dict__ cannot shadow; methods are called unbound, as
// Tensor.data_ptr(t)); any other object through getattr.
struct Attr {
  py::object owner;
  py::str name;
  py::object descriptor;
  bool method = false;

  // Resolves how to call the descriptor: its C function itself where it is a
  // getset or method descriptor of a C type (torch's are), which spares the
  // type checks Python repeats on every call through it.
  void bind();

  // A new reference, or nullptr with a Python error set.
  PyObject* read(PyObject* obj) const;

 private:
  getter get_ = nullptr;
  void* closure_ = nullptr;
  PyCFunction noargs_ = nullptr;
  PyCFunctionWithKeywords varargs_ = nullptr;
  py::tuple no_args_;
};

// The attributes a snapshot reads: a parameter's .grad, and a tensor's.
struct TensorAccess {
  Attr grad, tensor_grad, requires_grad, data_ptr, nbytes, dtype, is_contiguous, shape, stride, version;
};

class Snapshot {
 public:
  // How the items give their tensors: they are the gradients themselves (and
  // neither require grad nor have a .grad); their .grad; their .grad's local
  // shard (DTensor).
  enum Kind : int { kTensors = 0, kParams = 1, kDTensorParams = 2 };

  // The facts of `grads` (one per item, None where an item has no gradient),
  // the gradients the plan was built from. Raises when a fact cannot be read,
  // or when the items are not all of one type.
  //
  // It holds no reference to an item, strong or weak: a weak reference would
  // make torch.utils.swap_tensors (and so nn.Module.to on DTensor parameters)
  // refuse the item. An item that dies may leave its address to a new object;
  // that object matches only if it is of the same type and its gradient has
  // every fact the plan depends on, which makes the plan right for it too.
  Snapshot(int kind, const py::list& items, const py::list& grads, TensorAccess access);

  // Whether `items` are the same objects, in the same order, whose gradients
  // still have exactly these facts. `grads` (a list, or None): the items'
  // .grad, read by the caller; then those are the gradients checked.
  //
  // `written` (a list, or None), for clip_: on a match it holds the tensors
  // clip_ writes, whose version counters it bumps (every gradient, and a
  // DTensor's local shard beside it). An inference tensor is a difference
  // there, so that the caller's slower path refuses it, as torch does.
  //
  // `held` (a list, or None) receives every tensor the plan reads, as soon as
  // it is checked: Python code that runs during the check (a
  // TorchFunctionMode, a tensor subclass) may drop an item's .grad, and the
  // kernel must not read it freed. The caller keeps the list until the kernel
  // has run.
  //
  // A fact that cannot be read because the gradient changed (torch raises a
  // TypeError, AttributeError or RuntimeError: a sparse gradient has no
  // data_ptr, a plain tensor no DTensor spec) is a difference: the caller's
  // slower path reads everything afresh and reports what is wrong there. Any
  // other exception (a KeyboardInterrupt raised in Python code the check ran,
  // a MemoryError) propagates.
  bool matches(const py::list& items, const py::handle& grads, const py::handle& written,
               const py::handle& held) const;

  // matches(), which also stores in `progress` how many items, from the
  // first, are known to match so far (release order): a kernel may read the
  // gradients of those while the rest are checked. It is not raised past an
  // item that differs. Does not throw: false with a Python error set is an
  // exception to propagate.
  bool check(const py::list& items, const py::handle& grads, const py::handle& written,
             std::atomic<int64_t>* progress, const py::handle& held) const noexcept;

  int64_t size() const { return int64_t(items_.size()); }

 private:
  struct Facts {
    bool present = false;
    uintptr_t data_ptr = 0;
    int64_t nbytes = 0;
    py::object dtype;
    bool contiguous = true;
    py::object shape, stride;  // only when not contiguous
    // kDTensorParams: the DTensorSpec the domain came from (the gradient's, or
    // the item's where it has none), with its mesh and placements.
    py::object spec, mesh, placements;
  };

  // The tensor an item's facts are read from (a new reference), given its
  // .grad when the caller read it (`grad`, borrowed; nullptr to read it here);
  // nullptr with *missing set when the item has no gradient; nullptr otherwise
  // when it has changed kind or cannot be read. A DTensor gradient whose local
  // shard that is goes to *dtensor (a new reference).
  PyObject* tensor_of(PyObject* item, PyObject* grad, bool* missing, PyObject** dtensor) const;
  bool read(PyObject* tensor, Facts* out) const;
  bool same(PyObject* tensor, const Facts& facts) const;
  // Whether clip_ may write `tensor`: not an inference tensor, which is the one
  // kind whose ._version cannot be read (a getter: cheaper than is_inference()).
  bool writable(PyObject* tensor) const;
  // kDTensorParams: whether `dtensor` (the gradient, or the item) is laid out
  // as `facts` records: the same spec object (FSDP2 reuses one per parameter),
  // or the same mesh object with equal placements.
  bool same_spec(PyObject* dtensor, const Facts& facts) const;
  bool read_spec(PyObject* dtensor, Facts* out) const;

  int kind_;
  TensorAccess access_;
  py::str local_tensor_, spec_, mesh_, placements_;
  py::object item_type_;          // every item's type, exactly
  std::vector<PyObject*> items_;  // not owned: only compared by identity
  std::vector<Facts> facts_;
};

}  // namespace fastnorm

#include "snapshot.h"

#include <stdexcept>
#include <utility>

namespace fastnorm {

namespace {

// Reads an integer attribute; false (a Python error set) when it fails.
bool read_int(const Attr& attr, PyObject* obj, long long* out) {
  PyObject* value = attr.read(obj);
  if (value == nullptr) return false;
  *out = PyLong_AsLongLong(value);
  Py_DECREF(value);
  return !(*out == -1 && PyErr_Occurred());
}

}  // namespace

void Attr::bind() {
  PyObject* d = descriptor.ptr();
  if (!method && Py_TYPE(d) == &PyGetSetDescr_Type) {
    const PyGetSetDef* def = reinterpret_cast<PyGetSetDescrObject*>(d)->d_getset;
    get_ = def->get;
    closure_ = def->closure;
  } else if (method && Py_TYPE(d) == &PyMethodDescr_Type) {
    const PyMethodDef* def = reinterpret_cast<PyMethodDescrObject*>(d)->d_method;
    const int calling = def->ml_flags & (METH_VARARGS | METH_FASTCALL | METH_NOARGS | METH_O | METH_KEYWORDS);
    if (calling == METH_NOARGS) {
      noargs_ = def->ml_meth;
    } else if (calling == (METH_VARARGS | METH_KEYWORDS)) {
      varargs_ = reinterpret_cast<PyCFunctionWithKeywords>(reinterpret_cast<void (*)(void)>(def->ml_meth));
      no_args_ = py::tuple();
    }
  }
}

PyObject* Attr::read(PyObject* obj) const {
  if (reinterpret_cast<PyObject*>(Py_TYPE(obj)) == owner.ptr()) {
    if (get_ != nullptr) return get_(obj, closure_);
    if (noargs_ != nullptr) return noargs_(obj, nullptr);
    if (varargs_ != nullptr) return varargs_(obj, no_args_.ptr(), nullptr);
    if (method) {
      PyObject* args[] = {obj};
      return PyObject_Vectorcall(descriptor.ptr(), args, 1, nullptr);
    }
    return Py_TYPE(descriptor.ptr())->tp_descr_get(descriptor.ptr(), obj, owner.ptr());
  }
  PyObject* value = PyObject_GetAttr(obj, name.ptr());
  if (value == nullptr || !method) return value;
  PyObject* result = PyObject_CallNoArgs(value);
  Py_DECREF(value);
  return result;
}

Snapshot::Snapshot(int kind, const py::list& items, const py::list& grads, TensorAccess access)
    : kind_(kind),
      access_(std::move(access)),
      local_tensor_("_local_tensor"),
      spec_("_spec"),
      mesh_("mesh"),
      placements_("placements") {
  for (Attr* a : {&access_.grad, &access_.tensor_grad, &access_.requires_grad, &access_.data_ptr,
                  &access_.nbytes, &access_.dtype, &access_.is_contiguous, &access_.shape, &access_.stride,
                  &access_.version}) {
    if (!a->method && Py_TYPE(a->descriptor.ptr())->tp_descr_get == nullptr) {
      throw std::invalid_argument("fastnorm._C.Snapshot: the getter " + std::string(a->name) +
                                  " is not a descriptor");
    }
    a->bind();
  }
  if (kind < kTensors || kind > kDTensorParams) {
    throw std::invalid_argument("fastnorm._C.Snapshot: unknown kind");
  }
  if (items.size() != grads.size()) {
    throw std::invalid_argument("fastnorm._C.Snapshot: items and grads differ in length");
  }
  items_.reserve(items.size());
  facts_.resize(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    PyObject* item = items[i].ptr();
    if (i == 0) {
      item_type_ = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(Py_TYPE(item)));
    } else if (reinterpret_cast<PyObject*>(Py_TYPE(item)) != item_type_.ptr()) {
      throw std::invalid_argument("fastnorm._C.Snapshot: the items are not all of one type");
    }
    items_.push_back(item);
    py::object tensor = grads[i];
    if (kind == kDTensorParams && !read_spec(tensor.is_none() ? item : tensor.ptr(), &facts_[i])) {
      throw py::error_already_set();
    }
    if (tensor.is_none()) continue;
    if (kind == kDTensorParams) tensor = tensor.attr(local_tensor_);
    if (!read(tensor.ptr(), &facts_[i])) throw py::error_already_set();
  }
}

bool Snapshot::read_spec(PyObject* dtensor, Facts* out) const {
  PyObject* spec = PyObject_GetAttr(dtensor, spec_.ptr());
  if (spec == nullptr) return false;
  out->spec = py::reinterpret_steal<py::object>(spec);
  PyObject* mesh = PyObject_GetAttr(spec, mesh_.ptr());
  if (mesh == nullptr) return false;
  out->mesh = py::reinterpret_steal<py::object>(mesh);
  PyObject* placements = PyObject_GetAttr(spec, placements_.ptr());
  if (placements == nullptr) return false;
  out->placements = py::reinterpret_steal<py::object>(placements);
  return true;
}

bool Snapshot::same_spec(PyObject* dtensor, const Facts& f) const {
  PyObject* spec = PyObject_GetAttr(dtensor, spec_.ptr());
  if (spec == nullptr) return false;
  bool same = spec == f.spec.ptr();
  if (!same) {
    PyObject* mesh = PyObject_GetAttr(spec, mesh_.ptr());
    PyObject* placements = mesh == f.mesh.ptr() ? PyObject_GetAttr(spec, placements_.ptr()) : nullptr;
    same = placements != nullptr && PyObject_RichCompareBool(placements, f.placements.ptr(), Py_EQ) == 1;
    Py_XDECREF(mesh);
    Py_XDECREF(placements);
  }
  Py_DECREF(spec);
  return same;
}

bool Snapshot::read(PyObject* tensor, Facts* out) const {
  long long value = 0;
  out->present = true;
  if (!read_int(access_.data_ptr, tensor, &value)) return false;
  out->data_ptr = uintptr_t(value);
  if (!read_int(access_.nbytes, tensor, &value)) return false;
  out->nbytes = value;
  PyObject* dtype = access_.dtype.read(tensor);
  if (dtype == nullptr) return false;
  out->dtype = py::reinterpret_steal<py::object>(dtype);
  PyObject* contiguous = access_.is_contiguous.read(tensor);
  if (contiguous == nullptr) return false;
  out->contiguous = contiguous == Py_True;
  Py_DECREF(contiguous);
  if (!out->contiguous) {
    // Read as flat without being contiguous (channels_last, permuted): the
    // shape and strides must stay the same too.
    PyObject* shape = access_.shape.read(tensor);
    if (shape == nullptr) return false;
    out->shape = py::reinterpret_steal<py::object>(shape);
    PyObject* stride = access_.stride.read(tensor);
    if (stride == nullptr) return false;
    out->stride = py::reinterpret_steal<py::object>(stride);
  }
  return true;
}

PyObject* Snapshot::tensor_of(PyObject* item, PyObject* grad, bool* missing, PyObject** dtensor) const {
  *missing = false;
  if (kind_ == kTensors) {
    // An item that starts requiring grad, or gets a .grad, is a parameter now.
    PyObject* flag = access_.requires_grad.read(item);
    if (flag == nullptr) return nullptr;
    Py_DECREF(flag);
    if (flag != Py_False) return nullptr;
    PyObject* own = access_.tensor_grad.read(item);
    if (own == nullptr) return nullptr;
    Py_DECREF(own);
    if (own != Py_None) return nullptr;
    Py_INCREF(item);
    return item;
  }
  if (grad != nullptr) {
    Py_INCREF(grad);
  } else {
    grad = access_.grad.read(item);
  }
  if (grad == Py_None) {
    Py_DECREF(grad);
    *missing = true;
    return nullptr;
  }
  if (grad != nullptr && kind_ == kDTensorParams) {
    PyObject* local = PyObject_GetAttr(grad, local_tensor_.ptr());
    if (local != nullptr) {
      *dtensor = grad;
    } else {
      Py_DECREF(grad);
    }
    return local;
  }
  return grad;
}

bool Snapshot::same(PyObject* tensor, const Facts& f) const {
  long long value = 0;
  if (!read_int(access_.data_ptr, tensor, &value) || uintptr_t(value) != f.data_ptr) return false;
  if (!read_int(access_.nbytes, tensor, &value) || value != f.nbytes) return false;
  PyObject* dtype = access_.dtype.read(tensor);
  if (dtype == nullptr) return false;
  Py_DECREF(dtype);  // dtypes are singletons: torch compares them by identity too
  if (dtype != f.dtype.ptr()) return false;
  PyObject* contiguous = access_.is_contiguous.read(tensor);
  if (contiguous == nullptr) return false;
  Py_DECREF(contiguous);
  if ((contiguous == Py_True) != f.contiguous) return false;
  if (f.contiguous) return true;
  const std::pair<const Attr*, const py::object*> layout[] = {{&access_.shape, &f.shape},
                                                              {&access_.stride, &f.stride}};
  for (const auto& [attr, stored] : layout) {
    PyObject* now = attr->read(tensor);
    if (now == nullptr) return false;
    const int equal = PyObject_RichCompareBool(now, stored->ptr(), Py_EQ);
    Py_DECREF(now);
    if (equal != 1) return false;
  }
  return true;
}

bool Snapshot::writable(PyObject* tensor) const {
  PyObject* version = access_.version.read(tensor);
  if (version == nullptr) return false;
  Py_DECREF(version);
  return true;
}

bool Snapshot::matches(const py::list& items, const py::handle& grads, const py::handle& written,
                       const py::handle& held) const {
  const bool ok = check(items, grads, written, nullptr, held);
  if (!ok && PyErr_Occurred() != nullptr) throw py::error_already_set();
  return ok;
}

namespace {

// Clears the Python error set where it means only that a gradient changed
// (see Snapshot::matches); any other stays set, to propagate.
void clear_if_a_difference() {
  if (PyErr_Occurred() != nullptr &&
      (PyErr_ExceptionMatches(PyExc_TypeError) || PyErr_ExceptionMatches(PyExc_AttributeError) ||
       PyErr_ExceptionMatches(PyExc_RuntimeError))) {
    PyErr_Clear();
  }
}

}  // namespace

bool Snapshot::check(const py::list& items, const py::handle& grads, const py::handle& written,
                     std::atomic<int64_t>* progress, const py::handle& held) const noexcept {
  PyObject* list = items.ptr();
  const auto n = Py_ssize_t(items_.size());
  if (PyList_GET_SIZE(list) != n) return false;
  PyObject* given = grads.is_none() ? nullptr : grads.ptr();
  if (given != nullptr && (!PyList_Check(given) || PyList_GET_SIZE(given) != n)) return false;
  PyObject* out = written.is_none() ? nullptr : written.ptr();
  if (out != nullptr && !PyList_Check(out)) return false;
  PyObject* keep = held.is_none() ? nullptr : held.ptr();
  if (keep != nullptr && !PyList_Check(keep)) return false;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = PyList_GET_ITEM(list, i);
    if (item != items_[size_t(i)]) return false;
    if (reinterpret_cast<PyObject*>(Py_TYPE(item)) != item_type_.ptr()) return false;
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    bool missing = false;
    PyObject* dtensor = nullptr;
    PyObject* grad = given != nullptr ? PyList_GET_ITEM(given, i) : nullptr;
    PyObject* item = items_[size_t(i)];
    PyObject* tensor = tensor_of(item, grad, &missing, &dtensor);
    const Facts& facts = facts_[size_t(i)];
    bool ok = tensor != nullptr ? facts.present && same(tensor, facts) : missing && !facts.present;
    if (ok && kind_ == kDTensorParams) ok = same_spec(dtensor != nullptr ? dtensor : item, facts);
    if (ok && tensor != nullptr && out != nullptr) {
      ok = writable(tensor) && PyList_Append(out, tensor) == 0 &&
           (dtensor == nullptr || PyList_Append(out, dtensor) == 0);
    }
    // Held before any kernel may read it (progress is raised below).
    if (ok && tensor != nullptr && keep != nullptr) ok = PyList_Append(keep, tensor) == 0;
    Py_XDECREF(tensor);
    Py_XDECREF(dtensor);
    if (!ok) {
      clear_if_a_difference();
      if (out != nullptr) {
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);  // the exception to propagate, kept while the list empties
        PyList_SetSlice(out, 0, PyList_GET_SIZE(out), nullptr);
        PyErr_Restore(type, value, traceback);
      }
      return false;
    }
    if (progress != nullptr) progress->store(i + 1, std::memory_order_release);
  }
  return true;
}

}  // namespace fastnorm

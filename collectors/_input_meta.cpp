// Input metadata of the eager op observer: the shapes, dtypes and devices strings of an op's
// inputs (collectors/_engine.py's docstring says how they read), built on a miss of the
// per-thread cache (meta_ids, _observer.h), and the shape and dtype an allocation op allocates.
#include "_engine.h"
#include "_observer.h"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace neuron_prof::observer {

namespace {

// ------------------------------------------------------------------ metadata strings
const char* dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float: return "float32";
    case c10::ScalarType::Double: return "float64";
    case c10::ScalarType::Half: return "float16";
    case c10::ScalarType::BFloat16: return "bfloat16";
    case c10::ScalarType::Long: return "int64";
    case c10::ScalarType::Int: return "int32";
    case c10::ScalarType::Short: return "int16";
    case c10::ScalarType::Char: return "int8";
    case c10::ScalarType::Byte: return "uint8";
    case c10::ScalarType::Bool: return "bool";
    case c10::ScalarType::ComplexFloat: return "complex64";
    case c10::ScalarType::ComplexDouble: return "complex128";
    case c10::ScalarType::ComplexHalf: return "complex32";
    case c10::ScalarType::Float8_e4m3fn: return "float8_e4m3fn";
    case c10::ScalarType::Float8_e5m2: return "float8_e5m2";
    default: return c10::toString(t);
  }
}

void shape_str(std::string& out, const at::Tensor& t) {
  auto* impl = t.unsafeGetTensorImpl();
  if (impl->is_nested()) {
    out += "nested";
    return;
  }
  out.push_back('[');
  bool first = true;
  for (const auto& s : impl->sym_sizes()) {
    if (!first) out += ", ";
    first = false;
    auto m = s.maybe_as_int();
    if (m)
      out += std::to_string(*m);
    else
      out.push_back('?');
  }
  out.push_back(']');
}

struct Entry {
  std::string shape, dtype, device;
  bool meaningful = false;
};

void join_uniform(std::string& out, const std::vector<std::string>& v) {
  bool uniform = true;
  for (auto& s : v) uniform = uniform && s == v[0];
  if (v.empty()) return;
  if (uniform) {
    out = v[0];
    return;
  }
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out.push_back('|');
    out += v[i];
  }
}

void entry_of_list(Entry& e, const std::vector<at::Tensor>& ts) {
  std::vector<std::string> dts, dvs;
  e.shape.push_back('[');
  for (size_t i = 0; i < ts.size(); ++i) {
    if (i) e.shape += ", ";
    if (ts[i].defined()) {
      shape_str(e.shape, ts[i]);
      dts.emplace_back(dtype_name(ts[i].scalar_type()));
      dvs.emplace_back(ts[i].device().str());
    } else {
      e.shape += "[]";
    }
  }
  e.shape.push_back(']');
  join_uniform(e.dtype, dts);
  join_uniform(e.device, dvs);
  e.meaningful = true;
}

bool list_tensors(const c10::IValue& iv, std::vector<at::Tensor>& out) {
  if (iv.isTensorList()) {
    for (const at::Tensor& t : iv.toTensorList()) out.push_back(t);
    return true;
  }
  if (iv.isList()) {
    bool any = false;
    for (const c10::IValue& el : iv.toListRef()) {
      if (el.isTensor()) {
        out.push_back(el.toTensor());
        any = true;
      } else {
        out.emplace_back();
      }
    }
    return any;
  }
  return false;
}


}  // namespace

std::atomic<int64_t> g_meta_miss{0};  // metadata cache misses (diagnostics)

MetaIds build_meta(c10::ArrayRef<const c10::IValue> inputs) {
  std::vector<Entry> es(inputs.size());
  size_t last = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const c10::IValue& iv = inputs[i];
    Entry& e = es[i];
    if (iv.isTensor()) {
      const at::Tensor& t = iv.toTensor();
      if (t.defined()) {
        shape_str(e.shape, t);
        e.dtype = dtype_name(t.scalar_type());
        e.device = t.device().str();
        e.meaningful = true;
      }
    } else if (iv.isDevice()) {
      e.device = iv.toDevice().str();
      e.meaningful = true;
    } else {
      std::vector<at::Tensor> ts;
      if (list_tensors(iv, ts)) entry_of_list(e, ts);
    }
    if (e.meaningful) last = i + 1;
  }
  std::string shapes = "[", dtypes, devices;
  for (size_t i = 0; i < last; ++i) {
    if (i) {
      shapes += ", ";
      dtypes.push_back(',');
      devices.push_back(',');
    }
    shapes += es[i].shape.empty() ? std::string("[]") : es[i].shape;
    dtypes += es[i].dtype;
    devices += es[i].device;
  }
  shapes.push_back(']');
  auto& st = strings();
  return MetaIds{st.intern(shapes), st.intern(dtypes), st.intern(devices)};
}

// The shape and dtype of the tensor an allocation op makes, from its arguments: the first int
// list is the size (empty_strided's second is the stride); the dtype is the first tensor's
// (resize_) or the first int argument (a ScalarType), else the default dtype.
void alloc_meta(const at::RecordFunction& rf, OpenFrame& f) {
  std::string shape;
  const char* dtype = nullptr;
  for (const c10::IValue& iv : rf.inputs()) {
    if (iv.isIntList() && shape.empty()) {
      shape.push_back('[');
      bool first = true;
      for (int64_t d : iv.toIntVector()) {
        if (!first) shape += ", ";
        first = false;
        shape += std::to_string(d);
      }
      shape.push_back(']');
    } else if (iv.isTensor() && !dtype && iv.toTensor().defined()) {
      dtype = dtype_name(iv.toTensor().scalar_type());
    } else if (iv.isInt() && !dtype && !shape.empty()) {
      dtype = dtype_name(static_cast<c10::ScalarType>(iv.toInt()));
    }
  }
  if (!dtype) dtype = dtype_name(c10::typeMetaToScalarType(c10::get_default_dtype()));
  auto& st = strings();
  f.alloc_shape = st.intern(shape);
  f.alloc_dtype = st.intern(dtype);
}

}  // namespace neuron_prof::observer

namespace neuron_prof {
const char* dtype_name(c10::ScalarType t) { return observer::dtype_name(t); }
}  // namespace neuron_prof

// neuron_prof eager op observer: a global at::RecordFunction callback pair.
//
// Built JIT by collectors/_engine.py with torch.utils.cpp_extension.load. Records one row per
// completed op (FUNCTION, BACKWARD_FUNCTION and USER_SCOPE scopes) into per-thread buffers that
// Python drains, then takes as packed ``ops`` journal rows with its own ids (`OpRow`, `take_rows`).
//
// Concurrency model
//  * Every recording thread owns a ThreadState: its stack of open ops (owner-only), its caches
//    (owner-only) and an event buffer guarded by a tiny spin lock (owner pushes, drain swaps).
//  * ThreadStates live in a registry (mutex). A thread's state is retired by a thread_local
//    destructor at thread exit: its pending events move to an orphan buffer.
//  * An op that ends on another thread than it started on (rare: async ranges) is handed to
//    the owner through a mutex-guarded "foreign ends" list that the owner processes on its next
//    callback.
//  * Python stacks are interned under the GIL (callbacks re-acquire it with PyGILState_Ensure);
//    drain reads them under the GIL too. No lock is ever held while acquiring the GIL.
//  * A forked child never records (pthread_atfork).
#include <Python.h>
#include <frameobject.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <ATen/record_function.h>

#include "_engine.h"

#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

// ------------------------------------------------------------------ packed event row
struct Event {
  int64_t ts;
  int64_t dur;
  int64_t tid;
  int64_t seq;
  int64_t fwd_tid;
  int32_t name;
  int32_t module;
  int32_t stack;
  int32_t shapes;
  int32_t dtypes;
  int32_t devices;
  int16_t depth;
  uint8_t bwd;
  uint8_t pad_;
};

// One ``ops`` journal row exactly as the run store lays it out (neuron_prof.schema.row_dtype:
// schema order, packed): ``take_rows`` writes these with the Recorder's ids, so the collector
// hands the bytes to the store as they are, with no per-column work in Python.
#pragma pack(push, 1)
struct OpRow {
  int64_t ts, dur, tid;
  int32_t name, module, stack, shapes, dtypes, devices;
  int64_t seq, fwd_tid;
  uint8_t bwd;
  int16_t depth;
};
#pragma pack(pop)
static_assert(sizeof(OpRow) == 67, "OpRow must match the ops table's packed journal row");

inline int64_t now_ns() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return int64_t(t.tv_sec) * 1000000000LL + t.tv_nsec;
}

struct SpinLock {
  std::atomic<bool> f{false};
  void lock() {
    while (f.exchange(true, std::memory_order_acquire)) {
      while (f.load(std::memory_order_relaxed)) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      }
    }
  }
  void unlock() { f.store(false, std::memory_order_release); }
};

// ------------------------------------------------------------------ global string table
struct StringTable {
  std::mutex mu;
  std::unordered_map<std::string, int32_t> ids;
  std::vector<std::string> strs{std::string()};  // id 0 = ""
  size_t drained = 1;

  int32_t intern(const std::string& s) {
    if (s.empty()) return 0;
    std::lock_guard<std::mutex> g(mu);
    auto it = ids.find(s);
    if (it != ids.end()) return it->second;
    int32_t id = (int32_t)strs.size();
    strs.push_back(s);
    ids.emplace(s, id);
    return id;
  }
};
StringTable& strings() {
  static StringTable* t = new StringTable();  // leaked on purpose: usable during exit
  return *t;
}

// ------------------------------------------------------------------ per-thread state
struct OpenFrame {
  const void* rf;
  int64_t ts;
  int64_t excluded;  // neuron_prof's own work on this thread while the op was open (py_exclude)
  int64_t seq;
  int64_t fwd_tid;
  int32_t name, module, stack, shapes, dtypes, devices;
  int32_t alloc_shape, alloc_dtype;  // allocation ops (aten::empty...): the tensor they make
  int16_t depth;
  bool bwd;
  bool unresolved;  // backward wrapper whose forward attribution is not known yet
  bool user_scope;
};

struct NameEntry {
  const char* p = nullptr;  // the name pointer this slot was filled for (checked with strcmp)
  std::string s;
  int32_t id;
  bool skip;
  bool eval_fn;
  bool alloc_op;  // aten::empty, empty_strided, resize_: their size argument is what they allocate
};

struct MetaIds {
  int32_t shapes, dtypes, devices;
};

struct MetaSlot {
  uint64_t h = 0;
  std::string key;
  MetaIds ids{0, 0, 0};
};
constexpr size_t kNameSlots = 1024;  // direct-mapped per-thread caches (power of two)
constexpr size_t kMetaSlots = 2048;

struct ThreadState {
  int64_t os_tid = 0;
  uint64_t logical_tid = 0;
  uint64_t gen = 0;
  bool named_py = false;  // the Python thread name was looked up
  int32_t module = 0;  // current module path id (set from Python on this thread)
  std::vector<OpenFrame> open;
  // owner-only caches
  std::vector<NameEntry> names = std::vector<NameEntry>(kNameSlots);     // by name pointer
  std::vector<NameEntry> names_c = std::vector<NameEntry>(kNameSlots);   // by name content
  std::vector<MetaSlot> metas = std::vector<MetaSlot>(kMetaSlots);  // by hash(key), 2-way
  char kb[2048];  // metadata cache key being built
  // event buffer (owner pushes, drain swaps)
  SpinLock lock;
  std::vector<Event> events;
  // ends of our ops that happened on other threads
  std::atomic<bool> has_foreign{false};
  std::mutex foreign_mu;
  std::vector<std::pair<const void*, int64_t>> foreign;
};

struct Registry {
  std::mutex mu;
  std::vector<ThreadState*> states;
  std::vector<Event> orphans;
  std::unordered_map<uint64_t, int64_t> logical_to_os;
  std::unordered_map<int64_t, std::string> names;  // OS tid -> thread name
  std::vector<int64_t> names_dirty;                  // tids whose name is not drained yet
  void set_name(int64_t tid, const std::string& n) {  // registry mutex held
    auto it = names.find(tid);
    if (it != names.end() && it->second == n) return;
    names[tid] = n;
    names_dirty.push_back(tid);
  }
};
Registry& registry() {
  static Registry* r = new Registry();  // leaked on purpose
  return *r;
}

// ------------------------------------------------------------------ globals
std::atomic<bool> g_started{false};
std::atomic<bool> g_recording{false};
std::atomic<bool> g_child{false};
std::atomic<uint64_t> g_gen{0};
std::atomic<int64_t> g_buffered{0};
std::atomic<int64_t> g_dropped{0};
std::atomic<int64_t> g_max_buffered{1 << 22};
at::CallbackHandle g_handle = 0;
std::mutex g_ctl_mu;  // start/stop/set_recording

// forward (logical tid, seq) -> attribution, for backward ops: a direct-mapped table (the
// newest forward op of a slot wins; a backward node older than ~kFwdSlots forward ops that
// collide with it loses its attribution). Slots are guarded by one spin lock.
struct FwdSlot {
  uint64_t tid;  // logical RecordFunction thread id, 0 = empty
  int64_t seq;
  int64_t os_tid;
  int32_t module, stack;
};
constexpr size_t kFwdSlots = 1 << 18;
FwdSlot* g_fwd = new FwdSlot[kFwdSlots]();
SpinLock g_fwd_lock;
inline size_t fwd_index(uint64_t tid, int64_t seq) {
  return ((uint64_t)seq + tid * 0x9E3779B97F4A7C15ULL) & (kFwdSlots - 1);
}

// Python-side state: everything below is only touched with the GIL held.
std::vector<std::string>* g_skip = new std::vector<std::string>();
std::unordered_map<PyObject*, bool>* g_code_skip = new std::unordered_map<PyObject*, bool>();
using StackKey = std::vector<std::pair<PyObject*, int>>;
struct StackKeyHash {
  size_t operator()(const StackKey& k) const {
    size_t h = 1469598103934665603ULL;
    for (auto& p : k) {
      h ^= std::hash<void*>()(p.first) + 0x9E3779B97F4A7C15ULL + (h << 6) + (h >> 2);
      h ^= std::hash<int>()(p.second) + 0x9E3779B97F4A7C15ULL + (h << 6) + (h >> 2);
    }
    return h;
  }
};
std::unordered_map<StackKey, int32_t, StackKeyHash>* g_stack_ids =
    new std::unordered_map<StackKey, int32_t, StackKeyHash>();
std::vector<StackKey>* g_stacks = new std::vector<StackKey>(1);  // id 0 = no stack
size_t g_stacks_drained = 1;
// Drained events not yet packed, and the Recorder's id of each engine string and stack id (set
// by take_rows from what the drain reported new). GIL held for all three.
std::vector<Event>* g_taken = new std::vector<Event>();
std::vector<int32_t>* g_string_map = new std::vector<int32_t>(1, 0);
std::vector<int32_t>* g_stack_map = new std::vector<int32_t>(1, 0);
constexpr size_t kMaxFrames = 32;
constexpr int kMaxWalk = 1024;
constexpr size_t kMaxStacks = 4 << 20;
constexpr size_t kMaxCodeCache = 1 << 18;

// ------------------------------------------------------------------ thread registry
thread_local ThreadState* tls_state = nullptr;
thread_local bool tls_dead = false;

void retire(ThreadState* st) {
  auto& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  {
    std::lock_guard<SpinLock> g2(st->lock);
    r.orphans.insert(r.orphans.end(), st->events.begin(), st->events.end());
  }
  for (size_t i = 0; i < r.states.size(); ++i) {
    if (r.states[i] == st) {
      r.states.erase(r.states.begin() + i);
      break;
    }
  }
  delete st;
}

struct TlsHolder {
  ~TlsHolder() {
    tls_dead = true;
    ThreadState* st = tls_state;
    tls_state = nullptr;
    if (st && !g_child.load(std::memory_order_relaxed)) retire(st);
  }
};
thread_local TlsHolder tls_holder;

ThreadState* get_state() {
  if (tls_state) return tls_state;
  if (tls_dead) return nullptr;
  (void)&tls_holder;  // construct the holder so the state is retired at thread exit
  auto* st = new ThreadState();
  st->os_tid = (int64_t)syscall(SYS_gettid);
  st->logical_tid = at::RecordFunction::currentThreadId();
  st->gen = g_gen.load(std::memory_order_relaxed);
  st->open.reserve(64);
  st->events.reserve(1024);
  {
    auto& r = registry();
    std::lock_guard<std::mutex> g(r.mu);
    r.states.push_back(st);
    r.logical_to_os[st->logical_tid] = st->os_tid;
    char buf[32] = {0};
    if (pthread_getname_np(pthread_self(), buf, sizeof(buf)) == 0 && buf[0]) r.set_name(st->os_tid, buf);
  }
  tls_state = st;
  return st;
}

int64_t os_tid_of_logical(uint64_t logical) {
  auto& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  auto it = r.logical_to_os.find(logical);
  return it == r.logical_to_os.end() ? 0 : it->second;
}

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

constexpr int64_t kSymDim = INT64_MIN;

// Writes the shape-relevant facts of one tensor into the cache key; returns false if undefined.
// Fixed-size key writer (no allocation, no capacity checks per byte); overflow disables caching.
struct KeyBuf {
  char* p;
  char* end;
  bool over = false;
  inline void put(char c) {
    if (p < end) *p++ = c; else over = true;
  }
  inline void put8(int64_t v) {
    if (p + 8 <= end) { memcpy(p, &v, 8); p += 8; } else over = true;
  }
};

inline void key_tensor(KeyBuf& k, const at::Tensor& t) {
  if (!t.defined()) {
    k.put('u');
    return;
  }
  auto* impl = t.unsafeGetTensorImpl();
  c10::Device d = impl->device();
  k.put8(int64_t('T') | (int64_t((uint8_t)t.scalar_type()) << 8) | (int64_t((uint8_t)d.type()) << 16) |
         (int64_t((uint8_t)d.index()) << 24));
  if (impl->is_nested()) {
    k.put('n');
    return;
  }
  c10::SymIntArrayRef sz = impl->sym_sizes();
  k.put((char)sz.size());
  for (const auto& s : sz) {
    auto m = s.maybe_as_int();
    k.put8(m ? *m : kSymDim);
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

std::atomic<int64_t> g_meta_miss{0};  // metadata cache misses (diagnostics)
inline uint64_t hash_bytes(const char* p, size_t n) {
  // 8 bytes at a time, multiply-xorshift mixing (keys are short: tens of bytes)
  uint64_t h = 0x9E3779B97F4A7C15ULL ^ (n * 0xC2B2AE3D27D4EB4FULL);
  while (n >= 8) {
    uint64_t v;
    memcpy(&v, p, 8);
    h = (h ^ v) * 0xBF58476D1CE4E5B9ULL;
    h ^= h >> 31;
    p += 8;
    n -= 8;
  }
  uint64_t v = 0;
  memcpy(&v, p, n);
  h = (h ^ v) * 0x94D049BB133111EBULL;
  return h ^ (h >> 29);
}

MetaIds meta_ids(ThreadState* st, const at::RecordFunction& rf) {
  c10::ArrayRef<const c10::IValue> inputs = rf.inputs();
  if (inputs.empty()) return MetaIds{0, 0, 0};
  KeyBuf k{st->kb, st->kb + sizeof(st->kb)};
  for (const c10::IValue& iv : inputs) {
    if (iv.isTensor()) {
      key_tensor(k, iv.toTensor());
    } else if (iv.isDevice()) {
      c10::Device d = iv.toDevice();
      k.put('D');
      k.put((char)d.type());
      k.put((char)d.index());
    } else if (!iv.isList() || iv.isIntList() || iv.isDoubleList() || iv.isBoolList()) {
      k.put('x');
    } else {
      auto l = iv.toListRef();
      k.put('G');
      k.put8((int64_t)l.size());
      for (const c10::IValue& el : l) {
        if (el.isTensor())
          key_tensor(k, el.toTensor());
        else
          k.put('x');
      }
    }
  }
  if (k.over) return build_meta(inputs);
  const size_t klen = (size_t)(k.p - st->kb);
  const uint64_t h = hash_bytes(st->kb, klen);
  const size_t i0 = h & (kMetaSlots - 1), i1 = i0 ^ 1;
  for (size_t i : {i0, i1}) {
    MetaSlot& sl = st->metas[i];
    if (sl.h == h && sl.key.size() == klen && memcmp(sl.key.data(), st->kb, klen) == 0)
      return sl.ids;
  }
  g_meta_miss.fetch_add(1, std::memory_order_relaxed);
  MetaIds m = build_meta(inputs);
  MetaSlot& sl = st->metas[st->metas[i0].key.empty() || !st->metas[i1].key.empty() ? i0 : i1];
  sl.h = h;
  sl.key.assign(st->kb, klen);
  sl.ids = m;
  return m;
}

// ------------------------------------------------------------------ python stacks (GIL held)
bool py_alive() {
  if (!Py_IsInitialized()) return false;
#if PY_VERSION_HEX >= 0x030D0000
  if (Py_IsFinalizing()) return false;
#else
  if (_Py_IsFinalizing()) return false;
#endif
  return true;
}

bool code_skipped(PyObject* code) {
  auto it = g_code_skip->find(code);
  if (it != g_code_skip->end()) return it->second;
  bool skip = false;
  PyObject* fn = PyObject_GetAttrString(code, "co_filename");
  if (fn) {
    const char* s = PyUnicode_Check(fn) ? PyUnicode_AsUTF8(fn) : nullptr;
    if (s) {
      for (const auto& p : *g_skip) {
        if (strncmp(s, p.data(), p.size()) == 0) {
          skip = true;
          break;
        }
      }
    }
    Py_DECREF(fn);
  }
  if (PyErr_Occurred()) PyErr_Clear();
  if (g_code_skip->size() >= kMaxCodeCache) {
    for (auto& kv : *g_code_skip) Py_DECREF(kv.first);
    g_code_skip->clear();
  }
  Py_INCREF(code);
  g_code_skip->emplace(code, skip);
  return skip;
}

inline int frame_lasti(PyFrameObject* f) {
#if PY_VERSION_HEX >= 0x030B0000
  return PyFrame_GetLasti(f);
#else
  return f->f_lasti * (int)sizeof(_Py_CODEUNIT);
#endif
}

thread_local StackKey tls_walk;

// The Python name of the calling thread (threading._active[ident]._name), "" if none. GIL held.
std::string py_thread_name() {
  std::string out;
  PyObject* name = PyUnicode_FromString("threading");
  PyObject* mod = name ? PyImport_GetModule(name) : nullptr;
  Py_XDECREF(name);
  if (mod) {
    PyObject* active = PyObject_GetAttrString(mod, "_active");
    if (active && PyDict_Check(active)) {
      PyObject* key = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
      PyObject* th = key ? PyDict_GetItemWithError(active, key) : nullptr;  // borrowed
      if (th) {
        PyObject* nm = PyObject_GetAttrString(th, "_name");
        if (nm && PyUnicode_Check(nm)) {
          const char* c = PyUnicode_AsUTF8(nm);
          if (c) out = c;
        }
        Py_XDECREF(nm);
      }
      Py_XDECREF(key);
    }
    Py_XDECREF(active);
    Py_DECREF(mod);
  }
  if (PyErr_Occurred()) PyErr_Clear();
  return out;
}

int32_t walk_python(ThreadState* st) {
  if (!py_alive()) return 0;
  PyThreadState* ts = PyGILState_GetThisThreadState();
  if (!ts) return 0;
  PyGILState_STATE g = PyGILState_Ensure();
  int32_t id = 0;
  if (g_started.load(std::memory_order_relaxed)) {
    PyObject *et, *ev, *etb;
    PyErr_Fetch(&et, &ev, &etb);
    if (!st->named_py) {
      st->named_py = true;
      std::string n = py_thread_name();
      if (!n.empty()) {
        auto& r = registry();
        std::lock_guard<std::mutex> g(r.mu);
        r.set_name(st->os_tid, n);
      }
    }
    StackKey& buf = tls_walk;
    buf.clear();
    PyFrameObject* f = PyThreadState_GetFrame(ts);  // new reference
    int walked = 0;
    while (f && walked < kMaxWalk && buf.size() < kMaxFrames) {
      PyCodeObject* code = PyFrame_GetCode(f);  // new reference
      if (!code_skipped((PyObject*)code)) buf.emplace_back((PyObject*)code, frame_lasti(f));
      Py_DECREF(code);  // kept alive by the running frame (and by g_code_skip)
      PyFrameObject* back = PyFrame_GetBack(f);
      Py_DECREF(f);
      f = back;
      ++walked;
    }
    Py_XDECREF(f);
    if (!buf.empty()) {
      auto it = g_stack_ids->find(buf);
      if (it != g_stack_ids->end()) {
        id = it->second;
      } else if (g_stacks->size() < kMaxStacks) {
        id = (int32_t)g_stacks->size();
        for (auto& p : buf) Py_INCREF(p.first);
        g_stacks->push_back(buf);
        g_stack_ids->emplace(buf, id);
      }
    }
    PyErr_Restore(et, ev, etb);
  }
  PyGILState_Release(g);
  return id;
}

// ------------------------------------------------------------------ callbacks
const NameEntry& lookup_name(ThreadState* st, const char* nm) {
  if (!nm) nm = "";
  const uintptr_t u = reinterpret_cast<uintptr_t>(nm);
  NameEntry& e = st->names[((u >> 3) ^ (u >> 13)) & (kNameSlots - 1)];
  if (e.p == nm && strcmp(e.s.c_str(), nm) == 0) return e;
  // names built per call (backward nodes, ranges) have a new pointer each time: look up by content
  const size_t len = strlen(nm);
  NameEntry& c = st->names_c[hash_bytes(nm, len) & (kNameSlots - 1)];
  if (!(c.p && c.s.size() == len && memcmp(c.s.data(), nm, len) == 0)) {
    c.p = nm;
    c.s.assign(nm, len);
    c.id = strings().intern(c.s);
    c.skip = c.s.rfind("profiler::_record_function", 0) == 0;
    c.eval_fn = c.s.rfind("autograd::engine::evaluate_function", 0) == 0;
    c.alloc_op = c.s == "aten::empty" || c.s == "aten::empty_strided" || c.s == "aten::resize_";
  }
  e.p = nm;
  e.s = c.s;
  e.id = c.id;
  e.skip = c.skip;
  e.eval_fn = c.eval_fn;
  e.alloc_op = c.alloc_op;
  return e;
}

void emit(ThreadState* st, const OpenFrame& f, int64_t te) {
  if (!g_started.load(std::memory_order_relaxed)) return;
  if (g_buffered.fetch_add(1, std::memory_order_relaxed) >=
      g_max_buffered.load(std::memory_order_relaxed)) {
    g_buffered.fetch_sub(1, std::memory_order_relaxed);
    g_dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  Event e;
  e.ts = f.ts;
  e.dur = std::max<int64_t>(te - f.ts - f.excluded, 0);
  e.tid = st->os_tid;
  e.seq = f.seq;
  e.fwd_tid = f.fwd_tid;
  e.name = f.name;
  e.module = f.module;
  e.stack = f.stack;
  e.shapes = f.shapes;
  e.dtypes = f.dtypes;
  e.devices = f.devices;
  e.depth = f.depth;
  e.bwd = f.bwd ? 1 : 0;
  e.pad_ = 0;
  std::lock_guard<SpinLock> g(st->lock);
  st->events.push_back(e);
}

bool finish(ThreadState* st, const void* rf, int64_t te) {
  auto& open = st->open;
  for (size_t i = open.size(); i-- > 0;) {
    if (open[i].rf == rf) {
      emit(st, open[i], te);
      open.erase(open.begin() + (ptrdiff_t)i);
      return true;
    }
  }
  return false;
}

void process_foreign(ThreadState* st) {
  std::vector<std::pair<const void*, int64_t>> items;
  {
    std::lock_guard<std::mutex> g(st->foreign_mu);
    items.swap(st->foreign);
    st->has_foreign.store(false, std::memory_order_relaxed);
  }
  for (auto& it : items) finish(st, it.first, it.second);
}

void foreign_end(uint64_t owner_logical, const void* rf, int64_t te) {
  auto& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  for (ThreadState* o : r.states) {
    if (o->logical_tid == owner_logical) {
      std::lock_guard<std::mutex> g2(o->foreign_mu);
      o->foreign.emplace_back(rf, te);
      o->has_foreign.store(true, std::memory_order_release);
      return;
    }
  }
}

// The shape and dtype of the tensor an allocation op makes, from its arguments: the first int
// list is the size (empty_strided's second is the stride); the dtype is the first tensor's
// (resize_) or the first int argument (a ScalarType), else the default dtype.
std::atomic<bool> g_alloc_meta{false};  // set by the memory tracker while it records in detail

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

void start_impl(const at::RecordFunction& rf) {
  ThreadState* st = get_state();
  if (!st) return;
  if (st->has_foreign.load(std::memory_order_acquire)) process_foreign(st);
  uint64_t gen = g_gen.load(std::memory_order_relaxed);
  if (st->gen != gen) {
    st->open.clear();
    st->gen = gen;
  }
  const NameEntry& ne = lookup_name(st, rf.name());
  if (ne.skip) return;
  const at::RecordScope scope = rf.scope();
  OpenFrame f;
  f.rf = &rf;
  f.excluded = 0;
  f.name = ne.id;
  f.seq = rf.seqNr();
  f.depth = (int16_t)std::min<size_t>(st->open.size(), 32767);
  f.user_scope = scope == at::RecordScope::USER_SCOPE;
  f.unresolved = false;
  OpenFrame* parent = st->open.empty() ? nullptr : &st->open.back();
  if (scope == at::RecordScope::BACKWARD_FUNCTION) {
    f.bwd = true;
    uint64_t ftid = rf.forwardThreadId();
    f.module = 0;
    f.stack = 0;
    f.fwd_tid = 0;
    bool found = false;
    if (f.seq >= 0) {
      std::lock_guard<SpinLock> g(g_fwd_lock);
      const FwdSlot& sl = g_fwd[fwd_index(ftid, f.seq)];
      if (sl.tid == ftid && sl.seq == f.seq) {
        f.module = sl.module;
        f.stack = sl.stack;
        f.fwd_tid = sl.os_tid;
        found = true;
      }
    }
    if (!found && ftid) f.fwd_tid = os_tid_of_logical(ftid);
    for (auto it = st->open.rbegin(); it != st->open.rend() && it->bwd && it->unresolved; ++it) {
      it->module = f.module;
      it->stack = f.stack;
      it->fwd_tid = f.fwd_tid;
      it->unresolved = false;
    }
  } else if (parent && parent->bwd) {
    f.bwd = true;
    f.module = parent->module;
    f.stack = parent->stack;
    f.fwd_tid = parent->fwd_tid;
    f.unresolved = parent->unresolved;
  } else if (ne.eval_fn) {
    f.bwd = true;
    f.unresolved = true;
    f.module = 0;
    f.stack = 0;
    f.fwd_tid = 0;
  } else {
    f.bwd = false;
    f.module = st->module;
    f.fwd_tid = st->os_tid;
    if (parent && !parent->user_scope) {
      f.stack = parent->stack;
    } else {
      f.stack = walk_python(st);
      if (f.stack == 0 && parent) f.stack = parent->stack;
    }
    if (f.seq >= 0) {
      std::lock_guard<SpinLock> g(g_fwd_lock);
      g_fwd[fwd_index(st->logical_tid, f.seq)] =
          FwdSlot{st->logical_tid, f.seq, st->os_tid, f.module, f.stack};
    }
  }
  MetaIds mi{0, 0, 0};
  if (rf.needsInputs()) mi = meta_ids(st, rf);
  f.shapes = mi.shapes;
  f.dtypes = mi.dtypes;
  f.devices = mi.devices;
  f.alloc_shape = f.alloc_dtype = 0;
  if (ne.alloc_op && g_alloc_meta.load(std::memory_order_relaxed) && rf.needsInputs()) alloc_meta(rf, f);
  f.ts = now_ns();  // after our own work (stack walk, metadata): it stays out of the op's time
  st->open.push_back(f);
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& rf) {
  if (g_child.load(std::memory_order_relaxed) || !g_recording.load(std::memory_order_relaxed))
    return nullptr;
  try {
    start_impl(rf);
  } catch (...) {
  }
  return nullptr;
}

void on_end(const at::RecordFunction& rf, at::ObserverContext*) {
  if (g_child.load(std::memory_order_relaxed)) return;
  try {
    int64_t te = now_ns();
    ThreadState* st = get_state();
    if (!st) return;
    if (st->has_foreign.load(std::memory_order_acquire)) process_foreign(st);
    if (finish(st, &rf, te)) return;
    uint64_t owner = rf.threadId();
    if (owner && owner != st->logical_tid) foreign_end(owner, &rf, te);
  } catch (...) {
  }
}

void atfork_child() {
  g_child.store(true);
  g_recording.store(false);
}

// ------------------------------------------------------------------ python API
void py_start(py::list skip_prefixes, int64_t max_buffered) {
  if (g_child.load()) return;
  std::lock_guard<std::mutex> g(g_ctl_mu);
  if (g_handle != 0) throw std::runtime_error("eager observer already started");
  g_skip->clear();
  for (auto item : skip_prefixes) g_skip->push_back(py::cast<std::string>(item));
  for (auto& kv : *g_code_skip) Py_DECREF(kv.first);
  g_code_skip->clear();
  g_max_buffered.store(max_buffered > 0 ? max_buffered : 1);
  g_gen.fetch_add(1);
  g_recording.store(false);
  {
    std::lock_guard<SpinLock> g2(g_fwd_lock);
    std::fill(g_fwd, g_fwd + kFwdSlots, FwdSlot{0, 0, 0, 0, 0});
  }
  {
    // a new session sees the whole string and stack tables again
    std::lock_guard<std::mutex> g3(strings().mu);
    strings().drained = 1;
  }
  g_stacks_drained = 1;
  g_taken->clear();
  g_string_map->assign(1, 0);  // a new session's Recorder maps every id again
  g_stack_map->assign(1, 0);
  // discard leftovers of a previous session
  {
    auto& r = registry();
    std::lock_guard<std::mutex> g4(r.mu);
    r.orphans.clear();
    r.names_dirty.clear();
    for (auto& kv : r.names) r.names_dirty.push_back(kv.first);
    for (ThreadState* st : r.states) {
      std::lock_guard<SpinLock> g5(st->lock);
      st->events.clear();
    }
  }
  g_buffered.store(0);
  g_dropped.store(0);
  g_started.store(true);
  g_handle = at::addGlobalCallback(
      at::RecordFunctionCallback(on_start, on_end)
          .needsInputs(true)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                   at::RecordScope::USER_SCOPE}));
  at::disableCallback(g_handle);
}

void py_set_recording(bool on) {
  if (g_child.load()) return;
  std::lock_guard<std::mutex> g(g_ctl_mu);
  if (g_handle == 0) return;
  bool was = g_recording.exchange(on);
  if (was == on) return;
  if (on) {
    at::reenableCallback(g_handle);
    return;
  }
  at::disableCallback(g_handle);
  // A window closes at a step boundary, which under `record` is inside torch.optim's step range
  // (its post-hook ends the step): with the callback off that range would never end and its
  // children would lose their parent. The calling thread's open ops end here instead (other
  // threads' open lists are theirs alone to touch).
  ThreadState* st = get_state();
  if (!st) return;
  int64_t te = now_ns();
  for (auto& f : st->open) emit(st, f, te);
  st->open.clear();
}

void py_stop() {
  if (g_child.load()) return;
  std::lock_guard<std::mutex> g(g_ctl_mu);
  g_recording.store(false);
  g_started.store(false);
  if (g_handle != 0) {
    at::removeCallback(g_handle);
    g_handle = 0;
  }
}

void py_set_module(int32_t id) {
  if (g_child.load(std::memory_order_relaxed)) return;
  ThreadState* st = get_state();
  if (st) st->module = id;
}

int32_t py_intern(const std::string& s) { return strings().intern(s); }

// neuron_prof's own work (the session's step-boundary flush) just took `ns` on the calling
// thread, inside whatever ops are open there (e.g. torch.optim's step range, whose post-hook
// ends the step): their durations must not include it.
void py_exclude(int64_t ns) {
  if (g_child.load(std::memory_order_relaxed) || ns <= 0) return;
  ThreadState* st = get_state();
  if (!st) return;
  for (auto& f : st->open) f.excluded += ns;
}

// Takes everything recorded since the last drain (kept for take_rows) and returns
// (number of events, new strings, new stacks, dropped, thread names).
py::tuple py_drain() {
  std::vector<Event> out;
  std::vector<std::pair<int32_t, std::string>> new_strings;
  std::vector<std::pair<int64_t, std::string>> new_names;
  int64_t dropped = 0;
  if (!g_child.load()) {
    py::gil_scoped_release nogil;
    {
      auto& r = registry();
      std::lock_guard<std::mutex> g(r.mu);
      out.swap(r.orphans);
      for (int64_t tid : r.names_dirty) new_names.emplace_back(tid, r.names[tid]);
      r.names_dirty.clear();
      for (ThreadState* st : r.states) {
        std::vector<Event> taken;
        taken.reserve(1024);  // allocated here, not by the writer under its lock
        {
          std::lock_guard<SpinLock> g2(st->lock);
          if (st->events.empty()) continue;
          st->events.swap(taken);
        }
        if (out.empty())
          out.swap(taken);
        else
          out.insert(out.end(), taken.begin(), taken.end());
      }
    }
    g_buffered.fetch_sub((int64_t)out.size());
    dropped = g_dropped.exchange(0);
    auto& s = strings();
    std::lock_guard<std::mutex> g(s.mu);
    for (size_t i = s.drained; i < s.strs.size(); ++i) new_strings.emplace_back((int32_t)i, s.strs[i]);
    s.drained = s.strs.size();
  }
  const size_t n = out.size();
  if (g_taken->empty())
    g_taken->swap(out);
  else
    g_taken->insert(g_taken->end(), out.begin(), out.end());
  { std::vector<Event>().swap(out); }
  py::list strs;
  for (auto& p : new_strings) strs.append(py::make_tuple(p.first, py::str(p.second)));
  py::list stacks;
  for (size_t i = g_stacks_drained; i < g_stacks->size(); ++i) {
    py::list frames;
    for (auto& fr : (*g_stacks)[i]) {
      PyObject* code = fr.first;
      py::object co = py::reinterpret_borrow<py::object>(code);
      py::object file = co.attr("co_filename");
      py::object func = py::hasattr(co, "co_qualname") ? co.attr("co_qualname") : co.attr("co_name");
      int line = PyCode_Addr2Line((PyCodeObject*)code, fr.second);
      frames.append(py::make_tuple(file, func, line));
    }
    stacks.append(py::make_tuple((int32_t)i, frames));
  }
  g_stacks_drained = g_stacks->size();
  py::list threads;
  for (auto& p : new_names) threads.append(py::make_tuple(p.first, py::str(p.second)));
  return py::make_tuple(n, strs, stacks, dropped, threads);
}

inline int32_t mapped(const std::vector<int32_t>& m, int32_t id) {
  return id > 0 && (size_t)id < m.size() ? m[id] : 0;
}

void set_map(std::vector<int32_t>& m, const std::vector<std::pair<int32_t, int32_t>>& pairs) {
  for (auto& p : pairs) {
    if (p.first <= 0) continue;
    if ((size_t)p.first >= m.size()) m.resize(std::max<size_t>(p.first + 1, 2 * m.size()), 0);
    m[p.first] = p.second;
  }
}

// The drained events as packed ``ops`` journal rows (OpRow), engine ids replaced by the
// Recorder's: ``strings``/``stacks`` give the Recorder's id of each id the drain reported new.
py::bytes py_take_rows(const std::vector<std::pair<int32_t, int32_t>>& strings,
                       const std::vector<std::pair<int32_t, int32_t>>& stacks) {
  set_map(*g_string_map, strings);
  set_map(*g_stack_map, stacks);
  const auto& sm = *g_string_map;
  const auto& km = *g_stack_map;
  std::string out(g_taken->size() * sizeof(OpRow), '\0');
  OpRow* rows = reinterpret_cast<OpRow*>(&out[0]);
  for (size_t i = 0; i < g_taken->size(); ++i) {
    const Event& e = (*g_taken)[i];
    OpRow r;
    r.ts = e.ts;
    r.dur = e.dur;
    r.tid = e.tid;
    r.name = mapped(sm, e.name);
    r.module = mapped(sm, e.module);
    r.stack = mapped(km, e.stack);
    r.shapes = mapped(sm, e.shapes);
    r.dtypes = mapped(sm, e.dtypes);
    r.devices = mapped(sm, e.devices);
    r.seq = e.seq;
    r.fwd_tid = e.fwd_tid;
    r.bwd = e.bwd;
    r.depth = e.depth;
    memcpy(rows + i, &r, sizeof(OpRow));
  }
  std::vector<Event>().swap(*g_taken);
  return py::bytes(out);
}

py::dict py_layout() {
  py::dict d;
  py::list fields;
  auto add = [&](const char* n, size_t off, const char* t) { fields.append(py::make_tuple(n, off, t)); };
  add("ts", offsetof(OpRow, ts), "<i8");
  add("dur", offsetof(OpRow, dur), "<i8");
  add("tid", offsetof(OpRow, tid), "<i8");
  add("name", offsetof(OpRow, name), "<i4");
  add("module", offsetof(OpRow, module), "<i4");
  add("stack", offsetof(OpRow, stack), "<i4");
  add("shapes", offsetof(OpRow, shapes), "<i4");
  add("dtypes", offsetof(OpRow, dtypes), "<i4");
  add("devices", offsetof(OpRow, devices), "<i4");
  add("seq", offsetof(OpRow, seq), "<i8");
  add("fwd_tid", offsetof(OpRow, fwd_tid), "<i8");
  add("bwd", offsetof(OpRow, bwd), "u1");
  add("depth", offsetof(OpRow, depth), "<i2");
  d["fields"] = fields;
  d["itemsize"] = sizeof(OpRow);
  return d;
}

py::dict py_stats() {
  py::dict d;
  d["started"] = g_started.load();
  d["recording"] = g_recording.load();
  d["buffered"] = g_buffered.load();
  d["dropped_pending"] = g_dropped.load();
  d["child"] = g_child.load();
  {
    auto& r = registry();
    std::lock_guard<std::mutex> g(r.mu);
    d["threads"] = r.states.size();
  }
  d["stacks"] = g_stacks->size() - 1;
  d["registered"] = g_handle != 0;
  d["meta_miss"] = g_meta_miss.load();
  d["has_global_callbacks"] = at::hasGlobalCallbacks();
  return d;
}

// Names of engine string ids (for collectors other than the eager one: memory events).
py::list py_strings_of(const std::vector<int32_t>& ids) {
  py::list out;
  auto& s = strings();
  std::lock_guard<std::mutex> g(s.mu);
  for (int32_t i : ids) out.append(py::str(i >= 0 && (size_t)i < s.strs.size() ? s.strs[i] : std::string()));
  return out;
}

// Frames (file, function, line), innermost first, of engine stack ids (GIL held, as for drain).
py::list py_stacks_of(const std::vector<int32_t>& ids) {
  py::list out;
  for (int32_t i : ids) {
    py::list frames;
    if (i > 0 && (size_t)i < g_stacks->size()) {
      for (auto& fr : (*g_stacks)[i]) {
        py::object co = py::reinterpret_borrow<py::object>(fr.first);
        py::object func = py::hasattr(co, "co_qualname") ? co.attr("co_qualname") : co.attr("co_name");
        frames.append(py::make_tuple(co.attr("co_filename"), func, PyCode_Addr2Line((PyCodeObject*)fr.first, fr.second)));
      }
    }
    out.append(frames);
  }
  return out;
}

}  // namespace

namespace neuron_prof {
bool current_op(OpContext* out) {
  ThreadState* st = tls_state;  // never created here: a thread without ops has nothing to say
  if (!st || st->open.empty() || st->gen != g_gen.load(std::memory_order_relaxed)) return false;
  const OpenFrame& in = st->open.back();
  const OpenFrame& top = st->open.front();
  out->op = in.name;
  out->top_op = top.name;
  out->module = in.module ? in.module : top.module;
  out->stack = in.stack ? in.stack : top.stack;
  out->bwd = in.bwd;
  out->shape = in.alloc_shape;
  out->dtype = in.alloc_dtype;
  return true;
}
int64_t now_ns() { return ::now_ns(); }
const char* dtype_name(c10::ScalarType t) { return ::dtype_name(t); }
int32_t intern(const std::string& s) { return strings().intern(s); }
bool in_forked_child() { return g_child.load(std::memory_order_relaxed); }
void set_alloc_meta(bool on) { g_alloc_meta.store(on); }
int32_t thread_module() {
  ThreadState* st = tls_state;
  return st ? st->module : 0;
}
int32_t user_stack() {
  ThreadState* st = get_state();
  return st ? walk_python(st) : 0;
}
}  // namespace neuron_prof

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  static bool fork_registered = false;
  if (!fork_registered) {
    pthread_atfork(nullptr, nullptr, atfork_child);
    fork_registered = true;
  }
  m.def("start", &py_start);
  m.def("set_recording", &py_set_recording);
  m.def("stop", &py_stop);
  m.def("set_module", &py_set_module);
  m.def("intern", &py_intern);
  m.def("exclude", &py_exclude);
  m.def("drain", &py_drain);
  m.def("take_rows", &py_take_rows);
  m.def("layout", &py_layout);
  m.def("stats", &py_stats);
  m.def("now_ns", &now_ns);
  m.def("strings_of", &py_strings_of);
  m.def("stacks_of", &py_stacks_of);
  neuron_prof::register_memory(m);
  neuron_prof::register_comms(m);
  neuron_prof::register_device(m);
}

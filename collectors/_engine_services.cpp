// Engine-wide services of the eager op observer: the string table, the thread registry, the
// forward-seq table and the interned Python stacks (the user code running an op). The memory
// tracker and the other native parts reach them through _engine.h; the observer through
// _observer.h. See _observer.cpp for the concurrency model they follow.
#include <Python.h>
#include <frameobject.h>
#include <pybind11/pybind11.h>

#include "_engine.h"
#include "_observer.h"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace neuron_prof::observer {

// ------------------------------------------------------------------ global string table
StringTable& strings() {
  static StringTable* t = new StringTable();  // leaked on purpose: usable during exit
  return *t;
}

// ------------------------------------------------------------------ thread registry
Registry& registry() {
  static Registry* r = new Registry();  // leaked on purpose
  return *r;
}

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

int64_t os_tid_of_logical(uint64_t logical) {
  auto& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  auto it = r.logical_to_os.find(logical);
  return it == r.logical_to_os.end() ? 0 : it->second;
}

// ------------------------------------------------------------------ forward-seq table
FwdSlot* g_fwd = new FwdSlot[kFwdSlots]();
SpinLock g_fwd_lock;

// ------------------------------------------------------------------ python stacks (GIL held)
std::vector<std::string>* g_skip = new std::vector<std::string>();
std::unordered_map<PyObject*, bool>* g_code_skip = new std::unordered_map<PyObject*, bool>();
std::vector<StackKey>* g_stacks = new std::vector<StackKey>(1);  // id 0 = no stack
size_t g_stacks_drained = 1;

namespace {

constexpr size_t kMaxFrames = 32;
constexpr int kMaxWalk = 1024;
constexpr size_t kMaxStacks = 4 << 20;
constexpr size_t kMaxCodeCache = 1 << 18;

// Stack ids by their frames: an open-addressed table of ids into g_stacks (linear probing, at
// most half full), with each stack's hash beside it. Every top-level op looks its stack up here:
// a probe is one multiply per frame and a compare of the stored frames, no allocation.
struct StackIds {
  std::vector<int32_t> slot = std::vector<int32_t>(1 << 12, 0);  // 0: empty
  std::vector<uint64_t> hash = std::vector<uint64_t>(1, 0);      // by stack id

  static uint64_t of(const StackKey& k) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ k.size();
    for (auto& p : k) {
      h = (h ^ reinterpret_cast<uintptr_t>(p.first)) * 0xBF58476D1CE4E5B9ULL;
      h = (h ^ (uint64_t)(uint32_t)p.second) * 0x94D049BB133111EBULL;
      h ^= h >> 31;
    }
    return h;
  }
  // The id of ``k`` (hash ``h``), or the empty slot where it goes.
  int32_t* find(const StackKey& k, uint64_t h) {
    const size_t mask = slot.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
      int32_t& id = slot[i];
      if (id == 0 || (hash[id] == h && (*g_stacks)[id] == k)) return &id;
    }
  }
  void add(int32_t* at, int32_t id, uint64_t h) {
    *at = id;
    hash.push_back(h);
    if (2 * hash.size() <= slot.size()) return;
    std::vector<int32_t> old(2 * slot.size(), 0);
    old.swap(slot);
    const size_t mask = slot.size() - 1;
    for (int32_t i : old) {
      if (i == 0) continue;
      size_t j = hash[i] & mask;
      while (slot[j] != 0) j = (j + 1) & mask;
      slot[j] = i;
    }
  }
};
StackIds* g_stack_ids = new StackIds();

// Whether a code object's frames are left out of user stacks, by code pointer: a direct-mapped
// cache in front of g_code_skip (which holds a reference to every code object it knows, so a
// cached pointer is never a freed and reused one while it is in there: the cache is emptied
// whenever g_code_skip is). A hit costs one load and compare, no hashing.
struct CodeSlot {
  PyObject* code;
  bool skip;
};
constexpr size_t kCodeSlots = 1 << 12;
CodeSlot* g_code_slots = new CodeSlot[kCodeSlots]();
inline CodeSlot& code_slot(PyObject* code) {
  const uintptr_t u = reinterpret_cast<uintptr_t>(code);
  return g_code_slots[((u >> 4) ^ (u >> 16)) & (kCodeSlots - 1)];
}

bool py_alive() {
  if (!Py_IsInitialized()) return false;
#if PY_VERSION_HEX >= 0x030D0000
  if (Py_IsFinalizing()) return false;
#else
  if (_Py_IsFinalizing()) return false;
#endif
  return true;
}

bool code_skipped_slow(PyObject* code) {
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
  if (g_code_skip->size() >= kMaxCodeCache) forget_code_skips();
  Py_INCREF(code);
  g_code_skip->emplace(code, skip);
  return skip;
}

inline bool code_skipped(PyObject* code) {
  CodeSlot& c = code_slot(code);
  if (c.code == code) return c.skip;
  const bool skip = code_skipped_slow(code);
  c = CodeSlot{code, skip};
  return skip;
}

inline int frame_lasti(PyFrameObject* f) {
#if PY_VERSION_HEX >= 0x030B0000
  return PyFrame_GetLasti(f);
#else
  return f->f_lasti * (int)sizeof(_Py_CODEUNIT);
#endif
}

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

}  // namespace

void forget_code_skips() {
  for (auto& kv : *g_code_skip) Py_DECREF(kv.first);
  g_code_skip->clear();
  std::fill(g_code_slots, g_code_slots + kCodeSlots, CodeSlot{nullptr, false});
}

int32_t walk_python(ThreadState* st) {
  if (!py_alive()) return 0;
  PyThreadState* ts = PyGILState_GetThisThreadState();
  if (!ts) return 0;
  PyGILState_STATE g = PyGILState_Ensure();
  int32_t id = 0;
  if (g_started.load(std::memory_order_relaxed)) {
    // An op may run while an exception is set (its fetch and restore are kept for that case
    // alone: PyErr_Occurred is one load); errors of the walk's own are dropped.
    PyObject *et = nullptr, *ev = nullptr, *etb = nullptr;
    const bool pending = PyErr_Occurred() != nullptr;
    if (pending) PyErr_Fetch(&et, &ev, &etb);
    if (!st->named_py) {
      st->named_py = true;
      std::string n = py_thread_name();
      if (!n.empty()) {
        auto& r = registry();
        std::lock_guard<std::mutex> g(r.mu);
        r.set_name(st->os_tid, n);
      }
    }
    StackKey& buf = st->walk;
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
      const uint64_t h = StackIds::of(buf);
      int32_t* at = g_stack_ids->find(buf, h);
      if (*at != 0) {
        id = *at;
      } else if (g_stacks->size() < kMaxStacks) {
        id = (int32_t)g_stacks->size();
        for (auto& p : buf) Py_INCREF(p.first);
        g_stacks->push_back(buf);
        g_stack_ids->add(at, id, h);
      }
    }
    if (pending)
      PyErr_Restore(et, ev, etb);
    else if (PyErr_Occurred())
      PyErr_Clear();
  }
  PyGILState_Release(g);
  return id;
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

}  // namespace neuron_prof::observer

namespace neuron_prof {
int32_t intern(const std::string& s) { return observer::strings().intern(s); }
}  // namespace neuron_prof

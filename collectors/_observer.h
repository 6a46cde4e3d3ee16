// What the eager op observer's three sources share (internal to them; the engine's other
// native parts use _engine.h): the per-thread state and its registry, the string table, the
// forward-seq table, the Python stacks (_engine_services.cpp), the input metadata
// (_input_meta.cpp) and the observer's started flag (_observer.cpp).
//
// Everything here is in neuron_prof::observer with hidden visibility: each symbol binds inside
// the engine's library, so a call or a global read across these files costs what it did when
// they were one file's anonymous namespace (no PLT or GOT indirection under -fPIC).
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>

#include <ATen/record_function.h>

#include <time.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#pragma GCC visibility push(hidden)
namespace neuron_prof::observer {

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
  uint8_t recompute;  // a forward op re-run in the backward pass (OpenFrame::recompute)
};

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
StringTable& strings();

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
  // A forward op re-run inside the backward pass (activation checkpointing): an op under a backward
  // op that records autograd history (seq >= 0; the engine runs backward nodes with grad mode off
  // unless create_graph), and the ops under it.
  bool recompute;
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
  std::vector<std::pair<PyObject*, int>> walk;  // the Python stack being walked (walk_python)
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
  // libkineto::threadId() (pthread_self()'s low 32 bits, what CUPTI names a runtime call's
  // thread by when Kineto traces no CPU ops) -> OS tid
  std::unordered_map<int32_t, int64_t> kineto_to_os;
  std::unordered_map<int64_t, std::string> names;  // OS tid -> thread name
  std::vector<int64_t> names_dirty;                  // tids whose name is not drained yet
  void set_name(int64_t tid, const std::string& n) {  // registry mutex held
    auto it = names.find(tid);
    if (it != names.end() && it->second == n) return;
    names[tid] = n;
    names_dirty.push_back(tid);
  }
};
Registry& registry();
// Moves a thread's pending events to the orphans and forgets the thread (at its exit).
void retire(ThreadState* st);
int64_t os_tid_of_logical(uint64_t logical);

// The observer is started (_observer.cpp owns it; the stack walk checks it).
extern std::atomic<bool> g_started;

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
extern FwdSlot* g_fwd;
extern SpinLock g_fwd_lock;
inline size_t fwd_index(uint64_t tid, int64_t seq) {
  return ((uint64_t)seq + tid * 0x9E3779B97F4A7C15ULL) & (kFwdSlots - 1);
}

// Python-side state: everything below is only touched with the GIL held.
extern std::vector<std::string>* g_skip;  // file-name prefixes of frames left out of user stacks
extern std::unordered_map<PyObject*, bool>* g_code_skip;  // code object -> skipped
// Empties g_code_skip (and its cache), dropping its references: a new session's skip prefixes.
void forget_code_skips();
using StackKey = std::vector<std::pair<PyObject*, int>>;
extern std::vector<StackKey>* g_stacks;  // id 0 = no stack
extern size_t g_stacks_drained;
// The calling thread's user Python stack (engine stack id; 0: none). Takes the GIL.
int32_t walk_python(ThreadState* st);
// Names of engine string ids, and frames (file, function, line) of engine stack ids.
pybind11::list py_strings_of(const std::vector<int32_t>& ids);
pybind11::list py_stacks_of(const std::vector<int32_t>& ids);

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

// ------------------------------------------------------------------ input metadata
// The shapes/dtypes/devices string ids of an op's inputs, cached per thread by a key of the
// inputs' shape-relevant facts. The key and the cache probe run on every op: they are static
// inline here so that the observer's callback, their one caller, inlines them as it did when
// they were one file's; a miss builds the strings (build_meta, _input_meta.cpp).
extern std::atomic<int64_t> g_meta_miss;  // metadata cache misses (diagnostics)
MetaIds build_meta(c10::ArrayRef<const c10::IValue> inputs);
// What an allocation op (aten::empty...) allocates: its shape and dtype ids into ``f``.
void alloc_meta(const at::RecordFunction& rf, OpenFrame& f);

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

static inline void key_tensor(KeyBuf& k, const at::Tensor& t) {
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

static inline MetaIds meta_ids(ThreadState* st, const at::RecordFunction& rf) {
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

}  // namespace neuron_prof::observer
#pragma GCC visibility pop

// neuron_prof eager op observer: a global at::RecordFunction callback pair.
//
// Built JIT by collectors/_engine.py with torch.utils.cpp_extension.load. Records one row per
// completed op (FUNCTION, BACKWARD_FUNCTION and USER_SCOPE scopes) into per-thread buffers that
// Python drains, then takes as packed ``ops`` journal rows with its own ids (`OpRow`, `take_rows`).
//
// The engine-wide services it uses (string table, thread registry, forward-seq table, Python
// stacks) are in _engine_services.cpp, the input metadata in _input_meta.cpp (_observer.h).
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
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <ATen/record_function.h>

#include "_engine.h"
#include "_observer.h"

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

namespace neuron_prof::observer {

std::atomic<bool> g_started{false};

namespace {

// One ``ops`` journal row exactly as the run store lays it out (neuron_prof.store.schema.row_dtype:
// schema order, packed): ``take_rows`` writes these with the Recorder's ids, so the collector
// hands the bytes to the store as they are, with no per-column work in Python.
#pragma pack(push, 1)
struct OpRow {
  int64_t ts, dur, tid;
  int32_t name, module, stack, shapes, dtypes, devices;
  int64_t seq, fwd_tid;
  uint8_t bwd;
  int16_t depth;
  uint8_t recompute;
};
#pragma pack(pop)
static_assert(sizeof(OpRow) == 68, "OpRow must match the ops table's packed journal row");

// ------------------------------------------------------------------ globals
std::atomic<bool> g_recording{false};
std::atomic<bool> g_child{false};
std::atomic<uint64_t> g_gen{0};
std::atomic<int64_t> g_buffered{0};
std::atomic<int64_t> g_dropped{0};
std::atomic<int64_t> g_max_buffered{1 << 22};
at::CallbackHandle g_handle = 0;  // registered only while recording (py_set_recording)
std::mutex g_ctl_mu;  // start/stop/set_recording

// Drained events not yet packed, and the Recorder's id of each engine string and stack id (set
// by take_rows from what the drain reported new). GIL held for all three.
std::vector<Event>* g_taken = new std::vector<Event>();
neuron_prof::IdMap* g_string_map = new neuron_prof::IdMap();
neuron_prof::IdMap* g_stack_map = new neuron_prof::IdMap();

// ------------------------------------------------------------------ per-thread state
thread_local ThreadState* tls_state = nullptr;
thread_local bool tls_dead = false;

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
    const pthread_t self = pthread_self();
    int32_t kineto_tid;
    std::memcpy(&kineto_tid, &self, sizeof kineto_tid);  // as libkineto::threadId() reads it
    r.kineto_to_os[kineto_tid] = st->os_tid;
    char buf[32] = {0};
    if (pthread_getname_np(pthread_self(), buf, sizeof(buf)) == 0 && buf[0]) r.set_name(st->os_tid, buf);
  }
  tls_state = st;
  return st;
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
    // torch.profiler's own ranges: the record_function machinery, and the ProfilerStep#N range
    // its step() opens around each of the job's steps (a profiler's bookkeeping, not the job's
    // op: counted, it would be "forward" time and the owner of every allocation in the step)
    c.skip = c.s.rfind("profiler::_record_function", 0) == 0 || c.s.rfind("ProfilerStep#", 0) == 0;
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
  e.recompute = f.recompute ? 1 : 0;
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

std::atomic<bool> g_alloc_meta{false};  // set by the memory tracker while it records in detail

// A forward op's attribution, for its backward node to find by (thread, seq).
void remember_forward(const ThreadState* st, const OpenFrame& f) {
  if (f.seq < 0) return;
  std::lock_guard<SpinLock> g(g_fwd_lock);
  g_fwd[fwd_index(st->logical_tid, f.seq)] = FwdSlot{st->logical_tid, f.seq, st->os_tid, f.module, f.stack};
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
  f.recompute = false;
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
  } else if (parent && parent->bwd && (parent->recompute || (f.seq >= 0 && scope == at::RecordScope::FUNCTION))) {
    // re-run forward code: attributed as forward code is (the module running, the user's line)
    f.bwd = true;
    f.recompute = true;
    f.module = st->module ? st->module : parent->module;
    f.fwd_tid = st->os_tid;
    f.stack = parent->recompute && !parent->user_scope ? parent->stack : walk_python(st);
    if (f.stack == 0) f.stack = parent->stack;
    remember_forward(st, f);  // its backward, later in this pass, is attributed to it
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
    remember_forward(st, f);
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
  if (g_started.load()) throw std::runtime_error("eager observer already started");
  g_skip->clear();
  for (auto item : skip_prefixes) g_skip->push_back(py::cast<std::string>(item));
  forget_code_skips();
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
  *g_string_map = neuron_prof::IdMap();  // a new session's Recorder maps every id again
  *g_stack_map = neuron_prof::IdMap();
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
}

void py_set_recording(bool on) {
  if (g_child.load()) return;
  std::lock_guard<std::mutex> g(g_ctl_mu);
  if (!g_started.load()) return;
  bool was = g_recording.exchange(on);
  if (was == on) return;
  if (on) {
    g_handle = at::addGlobalCallback(
        at::RecordFunctionCallback(on_start, on_end)
            .needsInputs(true)
            .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                     at::RecordScope::USER_SCOPE}));
    return;
  }
  // Removed, not disabled: outside a window RecordFunction has no callback of ours at all
  // (at::hasGlobalCallbacks() is false without other observers), the state of a process that
  // never loaded us, so those steps pay nothing for it. Ops that started with the callback still
  // get their end (a RecordFunction keeps the callbacks it started with).
  at::removeCallback(g_handle);
  g_handle = 0;
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

// The drained events as packed ``ops`` journal rows (OpRow), engine ids replaced by the
// Recorder's: ``strings``/``stacks`` give the Recorder's id of each id the drain reported new.
py::bytes py_take_rows(const std::vector<std::pair<int32_t, int32_t>>& strings,
                       const std::vector<std::pair<int32_t, int32_t>>& stacks) {
  g_string_map->set(strings);
  g_stack_map->set(stacks);
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
    r.name = sm.mapped(e.name);
    r.module = sm.mapped(e.module);
    r.stack = km.mapped(e.stack);
    r.shapes = sm.mapped(e.shapes);
    r.dtypes = sm.mapped(e.dtypes);
    r.devices = sm.mapped(e.devices);
    r.seq = e.seq;
    r.fwd_tid = e.fwd_tid;
    r.bwd = e.bwd;
    r.depth = e.depth;
    r.recompute = e.recompute;
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
  add("recompute", offsetof(OpRow, recompute), "u1");
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
  d["registered"] = g_handle != 0;  // the callback is registered (while recording)
  d["meta_miss"] = g_meta_miss.load();
  d["has_global_callbacks"] = at::hasGlobalCallbacks();
  return d;
}

}  // namespace

}  // namespace neuron_prof::observer

using namespace neuron_prof::observer;

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
int64_t now_ns() { return observer::now_ns(); }
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
  m.def("kineto_thread_ids", [] {  // {libkineto::threadId() of each thread the observer saw: OS tid}
    auto& r = registry();
    std::lock_guard<std::mutex> g(r.mu);
    py::dict out;
    for (const auto& [kineto_tid, os_tid] : r.kineto_to_os) out[py::int_(kineto_tid)] = py::int_(os_tid);
    return out;
  });
  neuron_prof::register_memory(m);
  neuron_prof::register_comms(m);
  neuron_prof::register_device(m);
}

// neuron_prof memory tracker: the allocator events every PyTorch device reports to the profiler.
//
// Mechanism: allocators (CPU, CUDA, PrivateUse1 backends) call c10::reportMemoryUsageToProfiler
// for every allocation and free while the thread's PROFILER_STATE debug info says memory
// profiling is on. We push our own state there: a ProfilerStateBase whose config is *disabled*
// (so torch sees no profiler running: profilerEnabled() stays false, torch.profiler can still be
// started on top of it) but whose memoryProfilingEnabled() is true. Thread-local debug info is
// carried into autograd's device threads and at::launch tasks, so backward allocations count too.
//
// What is kept
//  * Always (cheap): every live allocation made since start, in a map (address -> size, time,
//    attribution), and per device the live bytes and the peak since the last read.
//  * While detail is on (a capture window): every alloc and free as an event with the op, module
//    and user stack the eager observer has open on the allocating thread. When a window opens,
//    allocations made before it that are still live are emitted first (kind BASELINE), so the
//    events always describe everything live. A free outside a window of an allocation already
//    emitted is still emitted (kind LATE_FREE): lifetimes stay complete.
//  * A ring of the last kRing events of any kind, for an out-of-memory report outside windows.
//  * Unless CPU allocations are followed between windows (mem_start's follow_cpu; always-on capture
//    leaves it off): outside windows memoryProfilingEnabled() is false, so the CPU allocator
//    (c10::ProfiledCPUMemoryReporter: a mutex and a size table per block, before any report)
//    reports nothing; devices' allocators report regardless and stay followed. When a window
//    closes, the CPU blocks still live are let go: an UNFOLLOWED event each (their lifetime, as
//    far as it is known, ends there) and the CPU's live bytes start from zero at the next window.
#include <torch/csrc/profiler/orchestration/observer.h>

#include <ATen/record_function.h>
#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <pybind11/stl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "_engine.h"

namespace py = pybind11;
using torch::profiler::impl::ActiveProfilerType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;
using torch::profiler::impl::ProfilerStateBase;

namespace {

enum Kind : uint8_t { ALLOC = 0, FREE = 1, BASELINE = 2, LATE_FREE = 3, LIVE = 4, OOM = 5, UNFOLLOWED = 7 };

struct MemEvent {
  int64_t ts;        // event time (BASELINE/LIVE: the allocation's time)
  int64_t addr;
  int64_t bytes;     // > 0 allocation, < 0 free; OOM: the size that failed
  int64_t alloc_ts;  // time of the allocation this event is about (pairs frees with allocs)
  int64_t total_allocated;  // the allocator's own figures at the event (0 where it has none)
  int64_t total_reserved;
  int64_t tid;
  int32_t op, top_op, module, stack, shape, dtype;
  int8_t device_type, device_index;
  uint8_t bwd, kind;
  uint8_t grad;  // an op returned a tensor over the block that carries a grad_fn (see outputs_end)
  uint8_t pad_[3];
};

// The Recorder's id of each engine string and stack id and of each device (type << 8 | index
// byte), learnt from Python once each (mem_unmapped, mem_pack); reset by mem_start. GIL held.
struct RecorderIds {
  neuron_prof::IdMap strings, stacks;
  std::unordered_map<int32_t, int32_t> devices;
};
RecorderIds* g_ids = new RecorderIds();

struct Live {
  int64_t addr, bytes, ts, tid;
  neuron_prof::OpContext ctx;
  int8_t device_type, device_index;
  bool emitted;
  bool grad = false;
  int64_t event = -1;  // its alloc event's index in g_events while not drained (see g_drains)
  uint64_t drains = 0;
};

struct Device {
  int8_t type, index;
  int64_t live = 0, peak = 0, allocated = 0, reserved = 0;
};

// The live blocks by key (key_of): open addressing with linear probing, deletion by backward
// shift, at most 3/4 full. Every allocation and free looks a block up here, in and out of
// windows; a node-based map's heap allocation per insert and free per erase were most of what a
// report cost outside windows.
class LiveMap {
 public:
  Live* find(uint64_t key) {
    if (keys_.empty()) return nullptr;
    key = stored(key);
    for (size_t i = home(key);; i = (i + 1) & mask_) {
      if (keys_[i] == key) return &vals_[i];
      if (keys_[i] == 0) return nullptr;
    }
  }
  // The entry for `key`, made (from `l`) or replaced.
  Live& put(uint64_t key, const Live& l) {
    if ((size_ + 1) * 4 > keys_.size() * 3) grow();
    key = stored(key);
    size_t i = home(key);
    while (keys_[i] != 0 && keys_[i] != key) i = (i + 1) & mask_;
    if (keys_[i] == 0) ++size_;
    keys_[i] = key;
    vals_[i] = l;
    return vals_[i];
  }
  // Removes the entry `v` (from find or put; no other call in between).
  void erase(Live* v) {
    size_t i = (size_t)(v - vals_.data());
    for (size_t j = (i + 1) & mask_; keys_[j] != 0; j = (j + 1) & mask_) {
      const size_t h = home(keys_[j]);
      // the entry at j may move into the hole at i unless its home lies cyclically in (i, j]
      if (i <= j ? (h > i && h <= j) : (h > i || h <= j)) continue;
      keys_[i] = keys_[j];
      vals_[i] = vals_[j];
      i = j;
    }
    keys_[i] = 0;
    --size_;
  }
  template <class F>
  void for_each(F f) {
    for (size_t i = 0; i < keys_.size(); ++i)
      if (keys_[i] != 0) f(vals_[i]);
  }
  size_t size() const { return size_; }
  void clear() {
    keys_.clear();
    vals_.clear();
    size_ = 0;
    mask_ = 0;
    shift_ = 64;
  }

 private:
  static uint64_t stored(uint64_t key) { return key ? key : ~0ull; }  // 0 marks an empty slot
  size_t home(uint64_t key) const { return (size_t)((key * 0x9E3779B97F4A7C15ull) >> shift_); }
  void grow() {
    std::vector<uint64_t> keys;
    std::vector<Live> vals;
    keys.swap(keys_);
    vals.swap(vals_);
    const size_t cap = keys.empty() ? 1024 : keys.size() * 2;
    keys_.assign(cap, 0);
    vals_.resize(cap);
    mask_ = cap - 1;
    shift_ = 64 - __builtin_ctzll(cap);
    for (size_t i = 0; i < keys.size(); ++i) {
      if (keys[i] == 0) continue;
      size_t j = home(keys[i]);
      while (keys_[j] != 0) j = (j + 1) & mask_;
      keys_[j] = keys[i];
      vals_[j] = vals[i];
    }
  }
  std::vector<uint64_t> keys_;
  std::vector<Live> vals_;
  size_t size_ = 0, mask_ = 0;
  int shift_ = 64;
};

constexpr size_t kRing = 4096;

std::mutex g_mu;  // everything below
LiveMap* g_live = new LiveMap();
std::vector<MemEvent>* g_events = new std::vector<MemEvent>();
std::vector<Device>* g_devices = new std::vector<Device>();
std::vector<MemEvent>* g_ring = new std::vector<MemEvent>(kRing);
size_t g_ring_n = 0;  // events ever put in the ring
int64_t g_max_events = 1 << 22;
uint64_t g_drains = 0;  // g_events handed to Python so far: an index from another drain is stale
at::CallbackHandle g_outputs = 0;  // the op-output callback, registered while detail is on
int64_t g_dropped = 0;
std::atomic<bool> g_on{false};
std::atomic<bool> g_detail{false};
std::atomic<bool> g_follow_cpu{true};  // CPU allocations followed outside windows too

inline bool unfollowed(int8_t device_type) {  // a CPU block outside windows, when those are not followed
  return device_type == (int8_t)c10::DeviceType::CPU && !g_follow_cpu.load(std::memory_order_relaxed) &&
         !g_detail.load(std::memory_order_relaxed);
}

thread_local int64_t t_tid = 0;  // the OS thread id, asked once per thread (a syscall)

inline int64_t tid() {
  if (!t_tid) t_tid = (int64_t)syscall(SYS_gettid);
  return t_tid;
}

inline uint64_t key_of(int64_t addr, int8_t type, int8_t index) {
  return (uint64_t)addr ^ ((uint64_t)(uint8_t)type << 56) ^ ((uint64_t)(uint8_t)index << 48);
}

Device& device_of(int8_t type, int8_t index) {
  for (auto& d : *g_devices)
    if (d.type == type && d.index == index) return d;
  g_devices->push_back(Device{type, index});
  return g_devices->back();
}

int64_t record(const MemEvent& e, bool keep) {  // g_mu held; the event's index in g_events or -1
  (*g_ring)[g_ring_n++ % kRing] = e;
  if (!keep) return -1;
  if ((int64_t)g_events->size() >= g_max_events) {
    ++g_dropped;
    return -1;
  }
  g_events->push_back(e);
  return (int64_t)g_events->size() - 1;
}

MemEvent event_of(const Live& l, int64_t addr, int64_t ts, int64_t bytes, uint8_t kind) {
  MemEvent e;
  std::memset(&e, 0, sizeof(e));
  e.ts = ts;
  e.addr = addr;
  e.bytes = bytes;
  e.alloc_ts = l.ts;
  e.tid = l.tid;
  e.op = l.ctx.op;
  e.top_op = l.ctx.top_op;
  e.module = l.ctx.module;
  e.stack = l.ctx.stack;
  e.shape = l.ctx.shape;
  e.dtype = l.ctx.dtype;
  e.bwd = l.ctx.bwd ? 1 : 0;
  e.grad = l.grad ? 1 : 0;
  e.device_type = l.device_type;
  e.device_index = l.device_index;
  e.kind = kind;
  return e;
}

struct Tracker final : public ProfilerStateBase {
  Tracker() : ProfilerStateBase(ProfilerConfig(ProfilerState::Disabled, false, /*profile_memory=*/true)) {}

  // what the CPU allocator asks before it keeps a block's size and reports it (devices' allocators
  // report without asking): off outside windows unless CPU allocations are followed there
  bool memoryProfilingEnabled() const override {
    return g_on.load(std::memory_order_relaxed) &&
           (g_follow_cpu.load(std::memory_order_relaxed) || g_detail.load(std::memory_order_relaxed));
  }
  ActiveProfilerType profilerType() override { return ActiveProfilerType::NONE; }

  void reportMemoryUsage(void* ptr, int64_t alloc_size, size_t total_allocated, size_t total_reserved,
                         c10::Device device) override {
    if (!g_on.load(std::memory_order_relaxed) || neuron_prof::in_forked_child() || alloc_size == 0) return;
    try {
      const int64_t now = neuron_prof::now_ns();
      const bool detail = g_detail.load(std::memory_order_relaxed);
      neuron_prof::OpContext ctx;
      if (detail) neuron_prof::current_op(&ctx);
      const int8_t dt = (int8_t)device.type(), di = (int8_t)device.index();
      const int64_t addr = (int64_t)(uintptr_t)ptr;
      std::lock_guard<std::mutex> g(g_mu);
      if (unfollowed(dt)) return;  // the window closed since the allocator asked
      Device& d = device_of(dt, di);
      d.allocated = (int64_t)total_allocated;
      d.reserved = (int64_t)total_reserved;
      const uint64_t key = key_of(addr, dt, di);
      if (alloc_size > 0) {
        d.live += alloc_size;
        if (d.live > d.peak) d.peak = d.live;
        Live& l = g_live->put(key, Live{addr, alloc_size, now, tid(), ctx, dt, di, detail});
        MemEvent e = event_of(l, addr, now, alloc_size, ALLOC);
        e.total_allocated = (int64_t)total_allocated;
        e.total_reserved = (int64_t)total_reserved;
        l.event = record(e, detail);
        l.drains = g_drains;
      } else {
        Live* l = g_live->find(key);
        if (l == nullptr) return;  // allocated before the tracker started: not ours to count
        d.live -= l->bytes;
        MemEvent e = event_of(*l, addr, now, -l->bytes, detail ? FREE : LATE_FREE);
        e.tid = tid();
        if (detail) {
          e.op = ctx.op;
          e.top_op = ctx.top_op;
          e.module = ctx.module;
          e.stack = ctx.stack;
          e.bwd = ctx.bwd ? 1 : 0;
        }
        e.total_allocated = (int64_t)total_allocated;
        e.total_reserved = (int64_t)total_reserved;
        record(e, l->emitted);
        g_live->erase(l);
      }
    } catch (...) {
    }
  }

  void reportOutOfMemory(int64_t alloc_size, size_t total_allocated, size_t total_reserved,
                         c10::Device device) override {
    if (!g_on.load(std::memory_order_relaxed) || neuron_prof::in_forked_child()) return;
    try {
      Live l{0, alloc_size, neuron_prof::now_ns(), tid(), {}, (int8_t)device.type(),
             (int8_t)device.index(), true};
      neuron_prof::current_op(&l.ctx);
      std::lock_guard<std::mutex> g(g_mu);
      MemEvent e = event_of(l, 0, l.ts, alloc_size, OOM);
      e.total_allocated = (int64_t)total_allocated;
      e.total_reserved = (int64_t)total_reserved;
      record(e, true);
    } catch (...) {
    }
  }
};

// ------------------------------------------------------------------ shapes of what ops made
// Most kernels allocate their outputs without a dispatched aten::empty, so the allocation itself
// carries no shape. The first op that returns a tensor over a block we saw allocated (the op that
// made it: it ends before anyone can use its output) gives the block its shape and dtype.
// An op that returns a tensor over the block with a grad_fn (the autograd-level op: inner kernels
// return it before autograd sets its history) marks the block ``grad``: it belongs to an autograd
// graph. A view with a grad_fn over the block (`loss.view(1)`) marks it too. is_leaf() reads the
// grad_fn pointer (grad_fn() could rebuild a view's), so this adds one flag test per output.
std::unique_ptr<at::ObserverContext> outputs_start(const at::RecordFunction&) { return nullptr; }

void outputs_end(const at::RecordFunction& rf, at::ObserverContext*) {
  if (!g_detail.load(std::memory_order_relaxed) || neuron_prof::in_forked_child()) return;
  try {
    for (const c10::IValue& iv : rf.outputs()) {
      if (!iv.isTensor()) continue;
      const at::Tensor& t = iv.toTensor();
      if (!t.defined() || !t.has_storage()) continue;
      const c10::Storage& st = t.unsafeGetTensorImpl()->storage();
      const c10::Device d = st.device();
      const uint64_t key = key_of((int64_t)(uintptr_t)st.data(), (int8_t)d.type(), (int8_t)d.index());
      const bool grad = t.requires_grad() && !t.is_leaf();
      std::lock_guard<std::mutex> g(g_mu);
      Live* found = g_live->find(key);
      if (found == nullptr) continue;
      Live& l = *found;
      const bool current = l.event >= 0 && l.drains == g_drains && l.event < (int64_t)g_events->size();
      if (grad && !l.grad) {
        l.grad = true;
        if (current) (*g_events)[l.event].grad = 1;
      }
      if (l.ctx.shape) continue;
      std::string shape = "[";
      bool first = true;
      for (const auto& dim : t.sym_sizes()) {
        if (!first) shape += ", ";
        first = false;
        auto m = dim.maybe_as_int();
        shape += m ? std::to_string(*m) : std::string("?");
      }
      shape.push_back(']');
      l.ctx.shape = neuron_prof::intern(shape);
      l.ctx.dtype = neuron_prof::intern(neuron_prof::dtype_name(t.scalar_type()));
      if (current) {
        (*g_events)[l.event].shape = l.ctx.shape;
        (*g_events)[l.event].dtype = l.ctx.dtype;
      }
    }
  } catch (...) {
  }
}

std::shared_ptr<Tracker>* g_tracker = new std::shared_ptr<Tracker>();
bool g_pushed = false;
bool g_suspended = false;

// ------------------------------------------------------------------ python API
// Starts tracking on the calling thread (and the threads its work is handed to). Returns an
// error message, "" on success: a torch.profiler already running on this thread owns the slot.
std::string mem_start(int64_t max_events, bool follow_cpu) {
  if (neuron_prof::in_forked_child()) return "forked child";
  if (g_pushed) return "memory tracking already started";
  if (ProfilerStateBase::get(/*global=*/false) != nullptr)
    return "torch.profiler is running on this thread; memory tracking needs it stopped first";
  {
    std::lock_guard<std::mutex> g(g_mu);
    g_live->clear();
    g_events->clear();
    g_devices->clear();
    g_ring_n = 0;
    g_dropped = 0;
    g_max_events = max_events > 0 ? max_events : 1;
  }
  g_follow_cpu.store(follow_cpu);
  *g_ids = RecorderIds();  // a new session's Recorder: every id is learnt again
  *g_tracker = std::make_shared<Tracker>();
  c10::ThreadLocalDebugInfo::_push(c10::DebugInfoKind::PROFILER_STATE, *g_tracker);
  g_pushed = true;
  g_on.store(true);
  return "";
}

void mem_set_detail(bool on);

void mem_stop() {
  mem_set_detail(false);
  g_on.store(false);
  if (!g_pushed) return;
  g_pushed = false;
  if (g_suspended) {
    g_suspended = false;
    g_tracker->reset();
    return;
  }
  // pop only if ours is the innermost state here; otherwise (a torch.profiler started later and
  // still running, or another thread) it stays in the chain, switched off, and is dropped with it
  if (c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE) == g_tracker->get()) {
    try {
      c10::ThreadLocalDebugInfo::_pop(c10::DebugInfoKind::PROFILER_STATE);
    } catch (...) {
    }
  }
  g_tracker->reset();
}

// A torch.profiler is about to start on this thread: step aside (true if we did).
bool mem_suspend() {
  if (!g_pushed || g_suspended) return false;
  if (c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE) != g_tracker->get()) return false;
  try {
    c10::ThreadLocalDebugInfo::_pop(c10::DebugInfoKind::PROFILER_STATE);
  } catch (...) {
    return false;
  }
  g_suspended = true;
  return true;
}

// The torch.profiler stopped: take the slot back (no-op unless suspended).
void mem_resume() {
  if (!g_suspended || !g_pushed) return;
  if (ProfilerStateBase::get(/*global=*/false) != nullptr) return;  // still someone else's
  c10::ThreadLocalDebugInfo::_push(c10::DebugInfoKind::PROFILER_STATE, *g_tracker);
  g_suspended = false;
}

// A window closed and CPU allocations are not followed until the next: the CPU blocks still live
// are let go (g_mu held). Their frees will not be reported; an emitted one gets an UNFOLLOWED event.
void let_cpu_go() {
  const int64_t now = neuron_prof::now_ns();
  std::vector<uint64_t> keys;
  g_live->for_each([&](Live& l) {
    if (l.device_type != (int8_t)c10::DeviceType::CPU) return;
    keys.push_back(key_of(l.addr, l.device_type, l.device_index));
    if (!l.emitted) return;
    MemEvent e = event_of(l, l.addr, now, -l.bytes, UNFOLLOWED);
    e.op = e.top_op = e.module = e.stack = 0;  // no op freed it: attribution is the allocation's
    e.bwd = 0;
    e.tid = tid();
    record(e, true);
  });
  for (uint64_t k : keys) {
    Live* l = g_live->find(k);
    if (l == nullptr) continue;
    device_of(l->device_type, l->device_index).live -= l->bytes;
    g_live->erase(l);
  }
}

void mem_set_detail(bool on) {
  std::lock_guard<std::mutex> g(g_mu);
  if (on && !g_detail.load()) {
    g_live->for_each([](Live& l) {
      if (l.emitted) return;
      l.emitted = true;
      l.event = record(event_of(l, l.addr, l.ts, l.bytes, BASELINE), true);
      l.drains = g_drains;
    });
  }
  g_detail.store(on);
  if (!on && !g_follow_cpu.load()) let_cpu_go();
  neuron_prof::set_alloc_meta(on);
  if (on && g_outputs == 0) {
    g_outputs = at::addGlobalCallback(at::RecordFunctionCallback(outputs_start, outputs_end)
                                          .needsOutputs(true)
                                          .scopes({at::RecordScope::FUNCTION}));
  } else if (!on && g_outputs != 0) {
    at::removeCallback(g_outputs);
    g_outputs = 0;
  }
}

py::bytes pack(const std::vector<MemEvent>& v) {
  return py::bytes(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(MemEvent));
}

py::tuple mem_drain() {
  std::vector<MemEvent> out;
  int64_t dropped;
  {
    std::lock_guard<std::mutex> g(g_mu);
    out.swap(*g_events);
    ++g_drains;
    dropped = g_dropped;
    g_dropped = 0;
  }
  return py::make_tuple(pack(out), dropped);
}

// Per device: (type, index, live bytes, peak since the last call, allocator allocated, reserved).
// The CPU only where its allocations are followed at every step (else its figures would count
// what windows saw, from an unknown start).
py::list mem_totals() {
  py::list out;
  std::lock_guard<std::mutex> g(g_mu);
  const bool cpu = g_follow_cpu.load();
  for (auto& d : *g_devices) {
    if (!cpu && d.type == (int8_t)c10::DeviceType::CPU) continue;
    out.append(py::make_tuple((int)d.type, (int)d.index, d.live, d.peak, d.allocated, d.reserved));
    d.peak = d.live;
  }
  return out;
}

// The bytes the allocator reported for each live block at (device type, index, address); 0 for a
// block not live here (not reported, or allocated before tracking). What neuron_prof alone keeps
// alive is taken off a boundary's totals at its reported size (CUDA's rounded block, not nbytes).
py::list mem_block_bytes(const std::vector<std::tuple<int, int, int64_t>>& blocks) {
  py::list out;
  std::lock_guard<std::mutex> g(g_mu);
  for (const auto& [type, index, addr] : blocks) {
    Live* l = g_live->find(key_of(addr, (int8_t)type, (int8_t)index));
    out.append(l ? l->bytes : (int64_t)0);
  }
  return out;
}

// Everything live now (kind LIVE, attribution where it was captured) and the last events (ring).
py::tuple mem_snapshot() {
  std::vector<MemEvent> live, ring;
  {
    std::lock_guard<std::mutex> g(g_mu);
    live.reserve(g_live->size());
    g_live->for_each([&live](Live& l) { live.push_back(event_of(l, l.addr, l.ts, l.bytes, LIVE)); });
    size_t n = std::min(g_ring_n, kRing);
    for (size_t i = g_ring_n - n; i < g_ring_n; ++i) ring.push_back((*g_ring)[i % kRing]);
  }
  return py::make_tuple(pack(live), pack(ring));
}

// ---- rows for the run store: the ``memory_events`` journal row (neuron_prof.store.schema.row_dtype:
// schema order, packed) with the Recorder's ids, so the collector stores the bytes as they are.
#pragma pack(push, 1)
struct MemRow {
  int64_t ts, alloc_ts, addr, bytes;
  int32_t device;
  int64_t tid;
  int32_t op, top_op, module, stack, shape, dtype;
  uint8_t bwd;
  int8_t kind;
  int64_t total_allocated, total_reserved;
  uint8_t grad;
};
#pragma pack(pop)
static_assert(sizeof(MemRow) == 87, "MemRow must match the memory_events table's packed journal row");

inline int32_t device_code(const MemEvent& e) { return (int32_t(e.device_type) << 8) | uint8_t(e.device_index); }

// Each native event of ``data`` (mem_drain's bytes), read in place, one copy of 88 bytes at a time.
template <class F>
void for_each_event(const py::bytes& data, F f) {
  std::string_view v(data);
  const size_t n = v.size() / sizeof(MemEvent);
  MemEvent e;
  for (size_t i = 0; i < n; ++i) {
    memcpy(&e, v.data() + i * sizeof(MemEvent), sizeof(MemEvent));
    f(i, e);
  }
}

// The string ids, stack ids and devices (type, index) of native events ``data`` the Recorder
// has no id for yet, each once.
py::tuple mem_unmapped(const py::bytes& data) {
  std::vector<int32_t> strings, stacks;
  std::vector<std::pair<int, int>> devices;
  std::unordered_map<int32_t, bool> seen_s, seen_k, seen_d;
  for_each_event(data, [&](size_t, const MemEvent& e) {
    for (int32_t id : {e.op, e.top_op, e.module, e.shape, e.dtype})
      if (id > 0 && g_ids->strings.find(id) < 0 && seen_s.emplace(id, true).second) strings.push_back(id);
    if (e.stack > 0 && g_ids->stacks.find(e.stack) < 0 && seen_k.emplace(e.stack, true).second) stacks.push_back(e.stack);
    const int32_t d = device_code(e);
    if (!g_ids->devices.count(d) && seen_d.emplace(d, true).second) devices.emplace_back(e.device_type, e.device_index);
  });
  return py::make_tuple(strings, stacks, devices);
}

// Native events ``data`` as memory_events journal rows. The pairs give the Recorder's id of what
// mem_unmapped reported (devices as ((type, index), id)); anything never given maps to 0.
py::bytes mem_pack(const py::bytes& data, const std::vector<std::pair<int32_t, int32_t>>& strings,
                   const std::vector<std::pair<int32_t, int32_t>>& stacks,
                   const std::vector<std::pair<std::pair<int, int>, int32_t>>& devices) {
  g_ids->strings.set(strings);
  g_ids->stacks.set(stacks);
  for (auto& p : devices) g_ids->devices[(int32_t(int8_t(p.first.first)) << 8) | uint8_t(int8_t(p.first.second))] = p.second;
  std::string out(std::string_view(data).size() / sizeof(MemEvent) * sizeof(MemRow), '\0');
  MemRow* rows = reinterpret_cast<MemRow*>(&out[0]);
  int32_t last_code = INT32_MIN, last_device = 0;
  for_each_event(data, [&](size_t i, const MemEvent& e) {
    const int32_t code = device_code(e);
    if (code != last_code) {
      auto it = g_ids->devices.find(code);
      last_device = it == g_ids->devices.end() ? 0 : it->second;
      last_code = code;
    }
    MemRow r;
    r.ts = e.ts;
    r.alloc_ts = e.alloc_ts;
    r.addr = e.addr;
    r.bytes = e.bytes;
    r.device = last_device;
    r.tid = e.tid;
    r.op = g_ids->strings.mapped(e.op);
    r.top_op = g_ids->strings.mapped(e.top_op);
    r.module = g_ids->strings.mapped(e.module);
    r.stack = g_ids->stacks.mapped(e.stack);
    r.shape = g_ids->strings.mapped(e.shape);
    r.dtype = g_ids->strings.mapped(e.dtype);
    r.bwd = e.bwd;
    r.kind = (int8_t)e.kind;
    r.total_allocated = e.total_allocated;
    r.total_reserved = e.total_reserved;
    r.grad = e.grad;
    memcpy(rows + i, &r, sizeof(MemRow));
  });
  return py::bytes(out);
}

py::dict mem_row_layout() {
  py::dict d;
  py::list f;
  auto add = [&](const char* n, size_t off, size_t size) { f.append(py::make_tuple(n, off, size)); };
  add("ts", offsetof(MemRow, ts), 8);
  add("alloc_ts", offsetof(MemRow, alloc_ts), 8);
  add("addr", offsetof(MemRow, addr), 8);
  add("bytes", offsetof(MemRow, bytes), 8);
  add("device", offsetof(MemRow, device), 4);
  add("tid", offsetof(MemRow, tid), 8);
  add("op", offsetof(MemRow, op), 4);
  add("top_op", offsetof(MemRow, top_op), 4);
  add("module", offsetof(MemRow, module), 4);
  add("stack", offsetof(MemRow, stack), 4);
  add("shape", offsetof(MemRow, shape), 4);
  add("dtype", offsetof(MemRow, dtype), 4);
  add("bwd", offsetof(MemRow, bwd), 1);
  add("kind", offsetof(MemRow, kind), 1);
  add("total_allocated", offsetof(MemRow, total_allocated), 8);
  add("total_reserved", offsetof(MemRow, total_reserved), 8);
  add("grad", offsetof(MemRow, grad), 1);
  d["fields"] = f;
  d["itemsize"] = sizeof(MemRow);
  return d;
}

py::dict mem_layout() {
  py::dict d;
  py::list f;
  auto add = [&](const char* n, size_t off, const char* t) { f.append(py::make_tuple(n, off, t)); };
  add("ts", offsetof(MemEvent, ts), "<i8");
  add("addr", offsetof(MemEvent, addr), "<i8");
  add("bytes", offsetof(MemEvent, bytes), "<i8");
  add("alloc_ts", offsetof(MemEvent, alloc_ts), "<i8");
  add("total_allocated", offsetof(MemEvent, total_allocated), "<i8");
  add("total_reserved", offsetof(MemEvent, total_reserved), "<i8");
  add("tid", offsetof(MemEvent, tid), "<i8");
  add("op", offsetof(MemEvent, op), "<i4");
  add("top_op", offsetof(MemEvent, top_op), "<i4");
  add("module", offsetof(MemEvent, module), "<i4");
  add("stack", offsetof(MemEvent, stack), "<i4");
  add("shape", offsetof(MemEvent, shape), "<i4");
  add("dtype", offsetof(MemEvent, dtype), "<i4");
  add("device_type", offsetof(MemEvent, device_type), "i1");
  add("device_index", offsetof(MemEvent, device_index), "i1");
  add("bwd", offsetof(MemEvent, bwd), "u1");
  add("kind", offsetof(MemEvent, kind), "u1");
  add("grad", offsetof(MemEvent, grad), "u1");
  d["fields"] = f;
  d["itemsize"] = sizeof(MemEvent);
  return d;
}

}  // namespace

namespace neuron_prof {
void register_memory(py::module_& m) {
  m.def("mem_start", &mem_start);
  m.def("mem_stop", &mem_stop);
  m.def("mem_set_detail", &mem_set_detail);
  m.def("mem_suspend", &mem_suspend);
  m.def("mem_resume", &mem_resume);
  m.def("mem_drain", &mem_drain);
  m.def("mem_totals", &mem_totals);
  m.def("mem_snapshot", &mem_snapshot);
  m.def("mem_block_bytes", &mem_block_bytes);
  m.def("mem_layout", &mem_layout);
  m.def("mem_unmapped", &mem_unmapped);
  m.def("mem_pack", &mem_pack);
  m.def("mem_row_layout", &mem_row_layout);
}
}  // namespace neuron_prof

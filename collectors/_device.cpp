// neuron_prof backend hook API (collectors/neuron_prof_backend.h): what a device backend reports
// of its queues, its kernels, its events and its CPU fallbacks, kept in per-kind buffers that the
// device collector (collectors/device.py) drains at every flush.
//
// The API is one static struct, handed out as a PyCapsule (device_api_capsule). Its `capturing`
// points at g_capturing, which the collector sets while it wants reports: while a capture window
// is open (g_window: rows), and, in always-on capture, all the time (g_live: the queue state a
// dump shows). A backend tests it before every report, and every function tests the flags again
// (a report that raced a window's end keeps no row). Reports come from host threads (enqueue,
// flush, fallback) and from the device's worker threads (kernels): one mutex guards the buffers,
// held only to push a row.
//
// The queue state a dump shows (device_live_queues) is the latest depth an enqueue reported and
// the latest flush, per device, window on or off. It costs a report a few stores: each reporting
// thread writes a block of its own (LiveBlock, made at its first report and kept for the next
// thread when it exits), one writer per block, so a seqlock with plain stores and no lock
// guards it; a dump reads every block and takes the latest.
//
// Each row takes the calling thread's OS tid, and enqueues, flushes and fallbacks also the host op
// the observer has open on the calling thread (neuron_prof::current_op: op name, module path,
// user stack, backward flag; module from the module hooks when no op is open). Version 2's host
// reports (event records and waits, queue_synchronized) come from Python calls outside any op as
// often as not (Event.record(), Stream.synchronize()): with no op open, they take the thread's
// user stack (neuron_prof::user_stack), so that they still name their line. A queue_synchronized
// is a flush with its stream and event: it makes a queue_flushes row (what every analysis of host
// waits reads) and a stream_syncs row beside it. Enqueue ids come
// from one process-wide counter (unique, increasing, never 0); kernels get ids of their own, and
// the enqueue ids a kernel ran are kept as (kernel id, enqueue id) pairs, in the order given: the
// table kernel_enqueues. Strings (op and kernel names) are interned in the engine's string table.
#include <pybind11/stl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "_engine.h"
#include "neuron_prof_backend.h"

namespace py = pybind11;

namespace {

struct EnqueueRow {
  int64_t ts, tid, id;
  int32_t device, stream, op, host_op, module, stack, queue_depth;
  uint8_t bwd, pad_[3];
};

struct FlushRow {
  int64_t ts, dur, tid;
  int32_t device, reason, ops, host_op, module, stack;
  uint8_t bwd, pad_[7];
};

struct KernelRow {
  int64_t ts, dur, tid, id;
  int32_t device, stream, name, n_ops;
};

struct FallbackRow {
  int64_t ts, dur, tid, bytes_to_host, bytes_from_host;
  int32_t device, op, host_op, module, stack;
  uint8_t bwd, pad_[3];
};

struct LinkRow {
  int64_t kernel, enqueue;
};

// version 2: streams and events
struct EventRow {  // a record or wait the host put on a stream
  int64_t ts, tid, event;
  int32_t device, stream, kind, host_op, module, stack;
  uint8_t bwd, pad_[3];
};

struct CompletionRow {  // the device reached an event's record
  int64_t ts, event;
  int32_t device, stream;
};

struct StreamWaitRow {  // a stream stood idle waiting for an event
  int64_t ts, dur, event;
  int32_t device, stream;
};

struct SyncRow {  // a host wait, with its stream (-1: every stream) and event (0: none)
  int64_t ts, dur, tid, event;
  int32_t device, stream, reason, ops, host_op, module, stack;
  uint8_t bwd, pad_[3];
};

volatile int32_t g_capturing = 0;  // the API's flag: g_window || g_live
volatile int32_t g_window = 0;     // a capture window is open: reports become rows
volatile int32_t g_live = 0;       // always-on capture: reports keep each queue's state
int64_t g_live_since = 0;          // when g_live came on: older state is not this capture's
std::atomic<uint64_t> g_next_enqueue{1};
std::atomic<int64_t> g_next_kernel{1};

std::mutex g_mu;  // the buffers and counters below
std::vector<EnqueueRow> g_enqueues;
std::vector<FlushRow> g_flushes;
std::vector<KernelRow> g_kernels;
std::vector<FallbackRow> g_fallbacks;
std::vector<LinkRow> g_links;
std::vector<EventRow> g_events;
std::vector<CompletionRow> g_completions;
std::vector<StreamWaitRow> g_stream_waits;
std::vector<SyncRow> g_syncs;
size_t g_max = 2000000;  // rows per kind between drains; the rest are dropped and counted
// the kinds, in the order of g_dropped's counts
const char* const kKinds[] = {"enqueues", "flushes", "kernels", "fallbacks", "links",
                              "events", "completions", "stream_waits", "syncs"};
constexpr int kNKinds = sizeof(kKinds) / sizeof(kKinds[0]);
int64_t g_dropped[kNKinds] = {};

thread_local int64_t t_tid = 0;

inline int64_t tid() {
  if (!t_tid) t_tid = (int64_t)syscall(SYS_gettid);
  return t_tid;
}

inline bool on() { return g_window && !neuron_prof::in_forked_child(); }

// ---- each device queue as it is now (always-on dumps)
constexpr int kLiveDevices = 64;  // device indices -1..62 keep a state; others do not

struct LiveQueue {  // one writer (the block's thread); a reader retries while seq is odd or moved
  std::atomic<uint32_t> seq{0};
  std::atomic<int32_t> depth{0}, flush_reason{0}, flush_ops{0};
  std::atomic<int64_t> depth_ts{-1}, flush_ts{-1}, flush_dur{0};
};

struct LiveBlock {
  LiveQueue queue[kLiveDevices];
  LiveBlock* next = nullptr;  // every block ever made, newest first (g_blocks)
};

std::atomic<LiveBlock*> g_blocks{nullptr};
// Blocks of threads that exited, with what they last wrote. Made once and never destroyed: threads
// (autograd's device threads) exit after this library's static objects are gone, and their
// BlockOwner still hands its block back here.
std::mutex& spare_mu() {
  static std::mutex* mu = new std::mutex();
  return *mu;
}
std::vector<LiveBlock*>& spare() {
  static std::vector<LiveBlock*>* blocks = new std::vector<LiveBlock*>();
  return *blocks;
}

thread_local LiveBlock* t_block = nullptr;

// Gives the thread's block back at its exit: the next new thread writes on where it left off,
// so what it wrote last stays visible and the blocks stay as many as threads reporting at once.
struct BlockOwner {
  bool armed = false;  // set at the thread's first report: constructs it, so its destructor runs
  ~BlockOwner() {
    if (!t_block) return;
    std::lock_guard<std::mutex> g(spare_mu());
    spare().push_back(t_block);
    t_block = nullptr;
  }
};
thread_local BlockOwner t_block_owner;

LiveBlock* new_block() {  // a thread's first report: a spare block, or a new one
  LiveBlock* b = nullptr;
  {
    std::lock_guard<std::mutex> g(spare_mu());
    if (!spare().empty()) {
      b = spare().back();
      spare().pop_back();
    }
  }
  if (!b) {
    b = new LiveBlock();
    b->next = g_blocks.load(std::memory_order_relaxed);
    while (!g_blocks.compare_exchange_weak(b->next, b, std::memory_order_release, std::memory_order_relaxed)) {
    }
  }
  t_block_owner.armed = true;
  return t_block = b;
}

inline LiveQueue* live_queue(int32_t device) {
  const uint32_t i = uint32_t(device + 1);
  if (i >= uint32_t(kLiveDevices)) return nullptr;
  LiveBlock* b = t_block;
  return &(b ? b : new_block())->queue[i];
}

// A write of the calling thread's state of `device`: a few stores between two of seq.
template <class Write>
inline void keep(int32_t device, Write write) {
  LiveQueue* q = live_queue(device);
  if (!q) return;
  const uint32_t s = q->seq.load(std::memory_order_relaxed);
  q->seq.store(s + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  write(*q);
  q->seq.store(s + 2, std::memory_order_release);
}

inline int32_t intern_c(const char* s) {
  if (!s || !*s) return 0;
  return neuron_prof::intern(std::string(s));
}

// The host op open on the calling thread.
struct Host {
  int32_t op = 0, module = 0, stack = 0;
  uint8_t bwd = 0;
  Host() {
    neuron_prof::OpContext oc;
    if (neuron_prof::current_op(&oc)) {
      op = oc.op;
      module = oc.module;
      stack = oc.stack;
      bwd = oc.bwd;
    } else {
      module = neuron_prof::thread_module();
    }
  }
};

// A row's span on the calling thread's device report: start, duration, thread, device.
template <class Row>
void span(Row& r, int32_t device, int64_t start_ns, int64_t end_ns) {
  r.ts = start_ns;
  r.dur = end_ns - start_ns;
  r.tid = tid();
  r.device = device;
}

// The host op open on the calling thread, into a row that records it.
template <class Row>
void attribute(Row& r) {
  Host h;
  r.host_op = h.op;
  r.module = h.module;
  r.stack = h.stack;
  r.bwd = h.bwd;
}

// The same, and the thread's user stack when no op is open (a report from a Python call).
template <class Row>
void attribute_line(Row& r) {
  attribute(r);
  if (!r.stack) r.stack = neuron_prof::backward_stack();  // a device's autograd thread: no walk
  if (!r.stack) r.stack = neuron_prof::user_stack();
}

template <class T>
bool push(std::vector<T>& v, const T& row, int kind) {  // g_mu held
  if (v.size() >= g_max) {
    ++g_dropped[kind];
    return false;
  }
  v.push_back(row);
  return true;
}

int64_t api_now_ns(void) { return neuron_prof::now_ns(); }

uint64_t api_op_enqueued(int32_t device, int32_t stream, const char* op, int32_t queue_depth) {
  if (!g_capturing || neuron_prof::in_forked_child()) return 0;
  const int64_t ts = neuron_prof::now_ns();
  if (g_live)
    keep(device, [&](LiveQueue& q) {
      q.depth.store(queue_depth, std::memory_order_relaxed);
      q.depth_ts.store(ts, std::memory_order_relaxed);
    });
  if (!g_window) return 0;
  try {
    EnqueueRow r{};
    r.ts = ts;
    r.tid = tid();
    r.device = device;
    r.stream = stream;
    r.op = intern_c(op);
    attribute(r);
    r.queue_depth = queue_depth;
    r.id = (int64_t)g_next_enqueue.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard<std::mutex> g(g_mu);
    push(g_enqueues, r, 0);
    return (uint64_t)r.id;  // a dropped row's id is still unique: kernels may name it
  } catch (...) {
    return 0;
  }
}

inline int32_t known_reason(int32_t reason) {
  return reason < NEURON_PROF_FLUSH_SYNC || reason > NEURON_PROF_FLUSH_EVENT_SYNCHRONIZE ? NEURON_PROF_FLUSH_OTHER
                                                                                          : reason;
}

void keep_flush(int32_t device, int32_t reason, int32_t ops, int64_t start_ns, int64_t end_ns) {
  keep(device, [&](LiveQueue& q) {
    q.flush_reason.store(reason, std::memory_order_relaxed);
    q.flush_ops.store(ops, std::memory_order_relaxed);
    q.flush_dur.store(end_ns - start_ns, std::memory_order_relaxed);
    q.flush_ts.store(start_ns, std::memory_order_relaxed);
  });
}

FlushRow flush_row(int32_t device, int32_t reason, int32_t ops, int64_t start_ns, int64_t end_ns) {
  FlushRow r{};
  span(r, device, start_ns, end_ns);
  r.reason = reason;
  r.ops = ops;
  return r;
}

void api_queue_flushed(int32_t device, int32_t reason, int32_t ops, int64_t start_ns, int64_t end_ns) {
  if (!g_capturing || neuron_prof::in_forked_child()) return;
  reason = known_reason(reason);
  if (g_live) keep_flush(device, reason, ops, start_ns, end_ns);
  if (!g_window) return;
  try {
    FlushRow r = flush_row(device, reason, ops, start_ns, end_ns);
    attribute(r);
    std::lock_guard<std::mutex> g(g_mu);
    push(g_flushes, r, 1);
  } catch (...) {
  }
}

void api_kernel_executed(int32_t device, int32_t stream, const char* name, int64_t start_ns, int64_t end_ns,
                         const uint64_t* enqueue_ids, int32_t n_ops) {
  if (!on()) return;
  try {
    KernelRow r{};
    span(r, device, start_ns, end_ns);
    r.stream = stream;
    r.name = intern_c(name);
    if (!enqueue_ids || n_ops < 0) n_ops = 0;
    r.n_ops = n_ops;
    r.id = g_next_kernel.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard<std::mutex> g(g_mu);
    if (!push(g_kernels, r, 2)) return;
    if (g_links.size() + (size_t)n_ops > 8 * g_max) {
      g_dropped[4] += n_ops;
      return;
    }
    for (int32_t i = 0; i < n_ops; ++i) g_links.push_back(LinkRow{r.id, (int64_t)enqueue_ids[i]});
  } catch (...) {
  }
}

void api_cpu_fallback(int32_t device, const char* op, int64_t bytes_to_host, int64_t bytes_from_host,
                      int64_t start_ns, int64_t end_ns) {
  if (!on()) return;
  try {
    FallbackRow r{};
    span(r, device, start_ns, end_ns);
    r.op = intern_c(op);
    r.bytes_to_host = bytes_to_host;
    r.bytes_from_host = bytes_from_host;
    attribute(r);
    std::lock_guard<std::mutex> g(g_mu);
    push(g_fallbacks, r, 3);
  } catch (...) {
  }
}

// ---- version 2
void host_event(int32_t device, int32_t stream, uint64_t event, const char* kind) {
  if (!on()) return;
  try {
    EventRow r{};
    r.ts = neuron_prof::now_ns();
    r.tid = tid();
    r.event = (int64_t)event;
    r.device = device;
    r.stream = stream;
    r.kind = intern_c(kind);
    attribute_line(r);
    std::lock_guard<std::mutex> g(g_mu);
    push(g_events, r, 5);
  } catch (...) {
  }
}

void api_event_recorded(int32_t device, int32_t stream, uint64_t event) { host_event(device, stream, event, "record"); }
void api_event_waited(int32_t device, int32_t stream, uint64_t event) { host_event(device, stream, event, "wait"); }

void api_event_completed(int32_t device, int32_t stream, uint64_t event, int64_t ts_ns) {
  if (!on()) return;
  try {
    CompletionRow r{ts_ns, (int64_t)event, device, stream};
    std::lock_guard<std::mutex> g(g_mu);
    push(g_completions, r, 6);
  } catch (...) {
  }
}

void api_stream_waited(int32_t device, int32_t stream, uint64_t event, int64_t start_ns, int64_t end_ns) {
  if (!on()) return;
  try {
    StreamWaitRow r{start_ns, end_ns - start_ns, (int64_t)event, device, stream};
    std::lock_guard<std::mutex> g(g_mu);
    push(g_stream_waits, r, 7);
  } catch (...) {
  }
}

void api_queue_synchronized(int32_t device, int32_t stream, uint64_t event, int32_t reason, int32_t ops,
                            int64_t start_ns, int64_t end_ns) {
  if (!g_capturing || neuron_prof::in_forked_child()) return;
  reason = known_reason(reason);
  if (g_live) keep_flush(device, reason, ops, start_ns, end_ns);
  if (!g_window) return;
  try {
    FlushRow f = flush_row(device, reason, ops, start_ns, end_ns);
    attribute_line(f);
    SyncRow r{};
    span(r, device, start_ns, end_ns);
    r.event = (int64_t)event;
    r.stream = stream;
    r.reason = reason;
    r.ops = ops;
    r.host_op = f.host_op;
    r.module = f.module;
    r.stack = f.stack;
    r.bwd = f.bwd;
    std::lock_guard<std::mutex> g(g_mu);
    push(g_flushes, f, 1);
    push(g_syncs, r, 8);
  } catch (...) {
  }
}

neuron_prof_backend_api g_api = {
    NEURON_PROF_BACKEND_API_VERSION,
    (uint32_t)sizeof(neuron_prof_backend_api),
    &g_capturing,
    &api_now_ns,
    &api_op_enqueued,
    &api_queue_flushed,
    &api_kernel_executed,
    &api_cpu_fallback,
    &api_event_recorded,
    &api_event_waited,
    &api_event_completed,
    &api_stream_waited,
    &api_queue_synchronized,
};

py::object device_api_capsule() {
  PyObject* c = PyCapsule_New(static_cast<void*>(&g_api), NEURON_PROF_BACKEND_API_CAPSULE, nullptr);
  if (!c) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(c);
}

// `window`: reports become rows; `live`: they keep each queue's state (always-on capture), from
// now on: the state kept before is not this capture's.
void device_set_flags(bool window, bool live) {
  if (live && !g_live) g_live_since = neuron_prof::now_ns();
  g_window = window ? 1 : 0;
  g_live = live ? 1 : 0;
  g_capturing = (window || live) ? 1 : 0;
}
bool device_capturing() { return g_capturing != 0; }

// Each device queue as it is now, from the latest reports since g_live came on: {device index:
// (depth, depth_ts, flush_ts, flush_dur, flush_reason, flush_ops)}, the latest enqueue's depth
// and time (-1: none) and the latest flush (flush_ts -1: none), over every reporting thread.
py::dict device_live_queues() {
  struct Latest {
    int32_t depth = 0, flush_reason = 0, flush_ops = 0;
    int64_t depth_ts = -1, flush_ts = -1, flush_dur = 0;
  } latest[kLiveDevices];
  const int64_t since = g_live_since;
  for (LiveBlock* b = g_blocks.load(std::memory_order_acquire); b; b = b->next) {
    for (int i = 0; i < kLiveDevices; ++i) {
      LiveQueue& q = b->queue[i];
      Latest v;
      for (int tries = 0;; ++tries) {
        const uint32_t s0 = q.seq.load(std::memory_order_acquire);
        v.depth = q.depth.load(std::memory_order_relaxed);
        v.depth_ts = q.depth_ts.load(std::memory_order_relaxed);
        v.flush_reason = q.flush_reason.load(std::memory_order_relaxed);
        v.flush_ops = q.flush_ops.load(std::memory_order_relaxed);
        v.flush_ts = q.flush_ts.load(std::memory_order_relaxed);
        v.flush_dur = q.flush_dur.load(std::memory_order_relaxed);
        std::atomic_thread_fence(std::memory_order_acquire);
        if (!(s0 & 1) && q.seq.load(std::memory_order_relaxed) == s0) break;
        if (tries > 64) std::this_thread::yield();  // its writer was preempted mid-write
      }
      Latest& l = latest[i];
      if (v.depth_ts >= since && v.depth_ts > l.depth_ts) {
        l.depth = v.depth;
        l.depth_ts = v.depth_ts;
      }
      if (v.flush_ts >= 0 && v.flush_ts + v.flush_dur >= since && v.flush_ts > l.flush_ts) {
        l.flush_ts = v.flush_ts;
        l.flush_dur = v.flush_dur;
        l.flush_reason = v.flush_reason;
        l.flush_ops = v.flush_ops;
      }
    }
  }
  py::dict out;
  for (int i = 0; i < kLiveDevices; ++i) {
    const Latest& l = latest[i];
    if (l.depth_ts >= 0 || l.flush_ts >= 0)
      out[py::int_(i - 1)] = py::make_tuple(l.depth, l.depth_ts, l.flush_ts, l.flush_dur, l.flush_reason, l.flush_ops);
  }
  return out;
}

void device_set_max(int64_t n) {
  std::lock_guard<std::mutex> g(g_mu);
  if (n > 0) g_max = (size_t)n;
}

// Python backends: the same functions, the calling thread's op and tid included.
uint64_t py_enqueue(int32_t device, int32_t stream, const std::string& op, int32_t depth) {
  return api_op_enqueued(device, stream, op.c_str(), depth);
}
void py_flush(int32_t device, int32_t reason, int32_t ops, int64_t start, int64_t end) {
  api_queue_flushed(device, reason, ops, start, end);
}
void py_kernel(int32_t device, int32_t stream, const std::string& name, int64_t start, int64_t end,
               const std::vector<uint64_t>& ids) {
  api_kernel_executed(device, stream, name.c_str(), start, end, ids.data(), (int32_t)ids.size());
}
void py_fallback(int32_t device, const std::string& op, int64_t to_host, int64_t from_host, int64_t start,
                 int64_t end) {
  api_cpu_fallback(device, op.c_str(), to_host, from_host, start, end);
}
void py_event(int32_t device, int32_t stream, uint64_t event, bool wait) {
  (wait ? api_event_waited : api_event_recorded)(device, stream, event);
}
void py_event_completed(int32_t device, int32_t stream, uint64_t event, int64_t ts) {
  api_event_completed(device, stream, event, ts);
}
void py_stream_wait(int32_t device, int32_t stream, uint64_t event, int64_t start, int64_t end) {
  api_stream_waited(device, stream, event, start, end);
}
void py_sync(int32_t device, int32_t stream, uint64_t event, int32_t reason, int32_t ops, int64_t start,
             int64_t end) {
  api_queue_synchronized(device, stream, event, reason, ops, start, end);
}

py::dict device_layout() {
  py::dict d;
  auto table = [&](const char* kind, py::list fields, size_t itemsize) {
    py::dict t;
    t["fields"] = fields;
    t["itemsize"] = itemsize;
    d[kind] = t;
  };
#define F(T, n, t) fields.append(py::make_tuple(#n, offsetof(T, n), t))
  {
    py::list fields;
    F(EnqueueRow, ts, "<i8"); F(EnqueueRow, tid, "<i8"); F(EnqueueRow, id, "<i8");
    F(EnqueueRow, device, "<i4"); F(EnqueueRow, stream, "<i4"); F(EnqueueRow, op, "<i4");
    F(EnqueueRow, host_op, "<i4"); F(EnqueueRow, module, "<i4"); F(EnqueueRow, stack, "<i4");
    F(EnqueueRow, queue_depth, "<i4"); F(EnqueueRow, bwd, "u1");
    table("enqueues", fields, sizeof(EnqueueRow));
  }
  {
    py::list fields;
    F(FlushRow, ts, "<i8"); F(FlushRow, dur, "<i8"); F(FlushRow, tid, "<i8");
    F(FlushRow, device, "<i4"); F(FlushRow, reason, "<i4"); F(FlushRow, ops, "<i4");
    F(FlushRow, host_op, "<i4"); F(FlushRow, module, "<i4"); F(FlushRow, stack, "<i4"); F(FlushRow, bwd, "u1");
    table("flushes", fields, sizeof(FlushRow));
  }
  {
    py::list fields;
    F(KernelRow, ts, "<i8"); F(KernelRow, dur, "<i8"); F(KernelRow, tid, "<i8"); F(KernelRow, id, "<i8");
    F(KernelRow, device, "<i4"); F(KernelRow, stream, "<i4"); F(KernelRow, name, "<i4"); F(KernelRow, n_ops, "<i4");
    table("kernels", fields, sizeof(KernelRow));
  }
  {
    py::list fields;
    F(FallbackRow, ts, "<i8"); F(FallbackRow, dur, "<i8"); F(FallbackRow, tid, "<i8");
    F(FallbackRow, bytes_to_host, "<i8"); F(FallbackRow, bytes_from_host, "<i8");
    F(FallbackRow, device, "<i4"); F(FallbackRow, op, "<i4"); F(FallbackRow, host_op, "<i4");
    F(FallbackRow, module, "<i4"); F(FallbackRow, stack, "<i4"); F(FallbackRow, bwd, "u1");
    table("fallbacks", fields, sizeof(FallbackRow));
  }
  {
    py::list fields;
    F(LinkRow, kernel, "<i8"); F(LinkRow, enqueue, "<i8");
    table("links", fields, sizeof(LinkRow));
  }
  {
    py::list fields;
    F(EventRow, ts, "<i8"); F(EventRow, tid, "<i8"); F(EventRow, event, "<i8"); F(EventRow, device, "<i4");
    F(EventRow, stream, "<i4"); F(EventRow, kind, "<i4"); F(EventRow, host_op, "<i4"); F(EventRow, module, "<i4");
    F(EventRow, stack, "<i4"); F(EventRow, bwd, "u1");
    table("events", fields, sizeof(EventRow));
  }
  {
    py::list fields;
    F(CompletionRow, ts, "<i8"); F(CompletionRow, event, "<i8"); F(CompletionRow, device, "<i4");
    F(CompletionRow, stream, "<i4");
    table("completions", fields, sizeof(CompletionRow));
  }
  {
    py::list fields;
    F(StreamWaitRow, ts, "<i8"); F(StreamWaitRow, dur, "<i8"); F(StreamWaitRow, event, "<i8");
    F(StreamWaitRow, device, "<i4"); F(StreamWaitRow, stream, "<i4");
    table("stream_waits", fields, sizeof(StreamWaitRow));
  }
  {
    py::list fields;
    F(SyncRow, ts, "<i8"); F(SyncRow, dur, "<i8"); F(SyncRow, tid, "<i8"); F(SyncRow, event, "<i8");
    F(SyncRow, device, "<i4"); F(SyncRow, stream, "<i4"); F(SyncRow, reason, "<i4"); F(SyncRow, ops, "<i4");
    F(SyncRow, host_op, "<i4"); F(SyncRow, module, "<i4"); F(SyncRow, stack, "<i4"); F(SyncRow, bwd, "u1");
    table("syncs", fields, sizeof(SyncRow));
  }
#undef F
  return d;
}

template <class T>
py::bytes as_bytes(const std::vector<T>& v) {
  return py::bytes(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// Everything reported since the last drain: {kind: bytes of rows (device_layout)}, and the rows
// dropped per kind ("links": enqueue ids of kernels) since the last drain.
py::tuple device_drain() {
  std::vector<EnqueueRow> e;
  std::vector<FlushRow> f;
  std::vector<KernelRow> k;
  std::vector<FallbackRow> fb;
  std::vector<LinkRow> l;
  std::vector<EventRow> ev;
  std::vector<CompletionRow> c;
  std::vector<StreamWaitRow> w;
  std::vector<SyncRow> s;
  int64_t dropped[kNKinds];
  {
    std::lock_guard<std::mutex> g(g_mu);
    e.swap(g_enqueues);
    f.swap(g_flushes);
    k.swap(g_kernels);
    fb.swap(g_fallbacks);
    l.swap(g_links);
    ev.swap(g_events);
    c.swap(g_completions);
    w.swap(g_stream_waits);
    s.swap(g_syncs);
    std::memcpy(dropped, g_dropped, sizeof(dropped));
    std::memset(g_dropped, 0, sizeof(g_dropped));
  }
  py::dict rows;
  rows["enqueues"] = as_bytes(e);
  rows["flushes"] = as_bytes(f);
  rows["kernels"] = as_bytes(k);
  rows["fallbacks"] = as_bytes(fb);
  rows["links"] = as_bytes(l);
  rows["events"] = as_bytes(ev);
  rows["completions"] = as_bytes(c);
  rows["stream_waits"] = as_bytes(w);
  rows["syncs"] = as_bytes(s);
  py::dict drops;
  for (int i = 0; i < kNKinds; ++i) drops[kKinds[i]] = dropped[i];
  return py::make_tuple(rows, drops);
}

// ns per call of the API's op_enqueued (through the struct's pointer, as a backend calls it), of
// kernel_executed with 4 enqueue ids and of queue_flushed, `n` calls each, with a window open
// (`capturing`: rows) or not, and the queue state kept (`live`, always-on capture) or not; also
// the cost of a backend's guarded call (`if (*api->capturing) api->op_enqueued(...)`). The rows
// it adds are taken out again; never call it during a capture.
py::dict device_bench(int64_t n, bool capturing, bool live) {
  neuron_prof_backend_api* volatile api = &g_api;
  const int32_t saved_window = g_window, saved_live = g_live;
  const int64_t saved_since = g_live_since;
  size_t e0, f0, k0, l0;
  int64_t d0[kNKinds];
  {
    std::lock_guard<std::mutex> g(g_mu);
    e0 = g_enqueues.size();
    f0 = g_flushes.size();
    k0 = g_kernels.size();
    l0 = g_links.size();
    std::memcpy(d0, g_dropped, sizeof(d0));
  }
  device_set_flags(capturing, live);
  uint64_t ids[4] = {1, 2, 3, 4};
  double r[4];
  int64_t guarded_calls = 0;
  {
    py::gil_scoped_release nogil;
    int64_t t0 = neuron_prof::now_ns();
    for (int64_t i = 0; i < n; ++i) api->op_enqueued(0, 0, "aten::add", (int32_t)(i & 15));
    int64_t t1 = neuron_prof::now_ns();
    for (int64_t i = 0; i < n; ++i) api->kernel_executed(0, 0, "fused_add_mul", t1, t1 + 10, ids, 4);
    int64_t t2 = neuron_prof::now_ns();
    for (int64_t i = 0; i < n; ++i)
      if (*api->capturing) guarded_calls += (int64_t)api->op_enqueued(0, 0, "aten::add", 0) != 0;
    int64_t t3 = neuron_prof::now_ns();
    for (int64_t i = 0; i < n; ++i) api->queue_flushed(0, NEURON_PROF_FLUSH_SIZE, 16, t2, t3);
    int64_t t4 = neuron_prof::now_ns();
    r[0] = double(t1 - t0) / double(n);
    r[1] = double(t2 - t1) / double(n);
    r[2] = double(t3 - t2) / double(n);
    r[3] = double(t4 - t3) / double(n);
  }
  py::dict out;
  out["op_enqueued_ns"] = r[0];
  out["kernel_executed_ns"] = r[1];
  out["guarded_ns"] = r[2];
  out["queue_flushed_ns"] = r[3];
  out["guarded_calls"] = guarded_calls;
  device_set_flags(saved_window, saved_live);
  g_live_since = saved_since;
  {
    std::lock_guard<std::mutex> g(g_mu);
    if (g_enqueues.size() > e0) g_enqueues.resize(e0);
    if (g_flushes.size() > f0) g_flushes.resize(f0);
    if (g_kernels.size() > k0) g_kernels.resize(k0);
    if (g_links.size() > l0) g_links.resize(l0);
    std::memcpy(g_dropped, d0, sizeof(d0));
  }
  return out;
}

}  // namespace

namespace neuron_prof {
void register_device(py::module_& m) {
  m.def("device_api_capsule", &device_api_capsule);
  m.def("device_set_flags", &device_set_flags);
  m.def("device_live_queues", &device_live_queues);
  m.def("device_capturing", &device_capturing);
  m.def("device_set_max", &device_set_max);
  m.def("device_enqueue", &py_enqueue);
  m.def("device_flush", &py_flush);
  m.def("device_kernel", &py_kernel);
  m.def("device_fallback", &py_fallback);
  m.def("device_event", &py_event);
  m.def("device_event_completed", &py_event_completed);
  m.def("device_stream_wait", &py_stream_wait);
  m.def("device_sync", &py_sync);
  m.def("device_layout", &device_layout);
  m.def("device_drain", &device_drain);
  m.def("device_bench", &device_bench, py::arg("n"), py::arg("capturing"), py::arg("live") = false);
}
}  // namespace neuron_prof

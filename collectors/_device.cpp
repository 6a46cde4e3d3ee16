// neuron_prof backend hook API (collectors/neuron_prof_backend.h), version 3: what a device backend
// reports of its queues that Kineto cannot carry -- each queue's depth and latest host wait as
// they are now, for always-on capture's dumps, which happen between capture windows, when no
// Kineto session runs. Everything a device did in a capture window (kernels, launches, waits,
// fallbacks, events) comes from the backend's Kineto activity profiler (collectors/device.py);
// version 1 and 2's functions that reported those are kept in the struct and do nothing.
//
// The API is one static struct, handed out as a PyCapsule (device_api_capsule). Its `capturing`
// points at g_capturing, set all through an always-on capture (device_set_flags): a backend tests
// it before every report. The queue state a dump shows (device_live_queues) is the latest depth an
// enqueue reported and the latest flush, per device. It costs a report a few stores: each
// reporting thread writes a block of its own (LiveBlock, made at its first report and kept for
// the next thread when it exits), one writer per block, so a seqlock with plain stores and no
// lock guards it; a dump reads every block and takes the latest.
#include <pybind11/stl.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "_engine.h"
#include "neuron_prof_backend.h"

namespace py = pybind11;

namespace {

volatile int32_t g_capturing = 0;  // the API's flag: always-on capture keeps each queue's state
int64_t g_live_since = 0;          // when g_capturing came on: older state is not this capture's

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

int64_t api_now_ns(void) { return neuron_prof::now_ns(); }

inline bool on() { return g_capturing && !neuron_prof::in_forked_child(); }

// An op was put on `device`'s queue: the queue's depth with it. No id: Kineto's correlation ids
// join a kernel to its launches now.
uint64_t api_op_enqueued(int32_t device, int32_t, const char*, int32_t queue_depth) {
  if (!on()) return 0;
  const int64_t ts = neuron_prof::now_ns();
  keep(device, [&](LiveQueue& q) {
    q.depth.store(queue_depth, std::memory_order_relaxed);
    q.depth_ts.store(ts, std::memory_order_relaxed);
  });
  return 0;
}

inline int32_t known_reason(int32_t reason) {
  return reason < NEURON_PROF_FLUSH_SYNC || reason > NEURON_PROF_FLUSH_EVENT_SYNCHRONIZE ? NEURON_PROF_FLUSH_OTHER
                                                                                          : reason;
}

// The host waited from start_ns to end_ns for `ops` queued ops of `device`: its latest flush.
void api_queue_flushed(int32_t device, int32_t reason, int32_t ops, int64_t start_ns, int64_t end_ns) {
  if (!on()) return;
  reason = known_reason(reason);
  keep(device, [&](LiveQueue& q) {
    q.flush_reason.store(reason, std::memory_order_relaxed);
    q.flush_ops.store(ops, std::memory_order_relaxed);
    q.flush_dur.store(end_ns - start_ns, std::memory_order_relaxed);
    q.flush_ts.store(start_ns, std::memory_order_relaxed);
  });
}

void api_queue_synchronized(int32_t device, int32_t, uint64_t, int32_t reason, int32_t ops, int64_t start_ns,
                            int64_t end_ns) {
  api_queue_flushed(device, reason, ops, start_ns, end_ns);
}

// Retired in version 3 (what they reported is the backend's Kineto activity): accepted, ignored.
void api_kernel_executed(int32_t, int32_t, const char*, int64_t, int64_t, const uint64_t*, int32_t) {}
void api_cpu_fallback(int32_t, const char*, int64_t, int64_t, int64_t, int64_t) {}
void api_event(int32_t, int32_t, uint64_t) {}
void api_event_completed(int32_t, int32_t, uint64_t, int64_t) {}
void api_stream_waited(int32_t, int32_t, uint64_t, int64_t, int64_t) {}

neuron_prof_backend_api g_api = {
    NEURON_PROF_BACKEND_API_VERSION,
    (uint32_t)sizeof(neuron_prof_backend_api),
    &g_capturing,
    &api_now_ns,
    &api_op_enqueued,
    &api_queue_flushed,
    &api_kernel_executed,
    &api_cpu_fallback,
    &api_event,
    &api_event,
    &api_event_completed,
    &api_stream_waited,
    &api_queue_synchronized,
};

py::object device_api_capsule() {
  PyObject* c = PyCapsule_New(static_cast<void*>(&g_api), NEURON_PROF_BACKEND_API_CAPSULE, nullptr);
  if (!c) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(c);
}

// `live`: reports keep each queue's state (always-on capture), from now on: the state kept before
// is not this capture's.
void device_set_live(bool live) {
  if (live && !g_capturing) g_live_since = neuron_prof::now_ns();
  g_capturing = live ? 1 : 0;
}
bool device_capturing() { return g_capturing != 0; }

// Each device queue as it is now, from the latest reports since capture came on: {device index:
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

// Python backends: the same reports, for the calling thread's block.
void py_enqueue(int32_t device, int32_t depth) { api_op_enqueued(device, 0, nullptr, depth); }
void py_flush(int32_t device, int32_t reason, int32_t ops, int64_t start, int64_t end) {
  api_queue_flushed(device, reason, ops, start, end);
}

// ns per call of the API's op_enqueued and queue_flushed (through the struct's pointer, as a
// backend calls them), `n` calls each, with always-on capture keeping the queue state
// (`capturing`) or not; also the cost of a backend's guarded call
// (`if (*api->capturing) api->op_enqueued(...)`). Never call it during a capture.
py::dict device_bench(int64_t n, bool capturing) {
  neuron_prof_backend_api* volatile api = &g_api;
  const int32_t saved = g_capturing;
  const int64_t saved_since = g_live_since;
  device_set_live(capturing);
  double r[3];
  int64_t guarded_calls = 0;
  {
    py::gil_scoped_release nogil;
    int64_t t0 = neuron_prof::now_ns();
    for (int64_t i = 0; i < n; ++i) api->op_enqueued(0, 0, "aten::add", (int32_t)(i & 15));
    int64_t t1 = neuron_prof::now_ns();
    for (int64_t i = 0; i < n; ++i)
      if (*api->capturing) guarded_calls += (int64_t)api->op_enqueued(0, 0, "aten::add", 0) != 0;
    int64_t t2 = neuron_prof::now_ns();
    for (int64_t i = 0; i < n; ++i) api->queue_flushed(0, NEURON_PROF_FLUSH_SIZE, 16, t1, t2);
    int64_t t3 = neuron_prof::now_ns();
    r[0] = double(t1 - t0) / double(n);
    r[1] = double(t2 - t1) / double(n);
    r[2] = double(t3 - t2) / double(n);
  }
  py::dict out;
  out["op_enqueued_ns"] = r[0];
  out["guarded_ns"] = r[1];
  out["queue_flushed_ns"] = r[2];
  out["guarded_calls"] = guarded_calls;
  g_capturing = saved;
  g_live_since = saved_since;
  return out;
}

}  // namespace

namespace neuron_prof {
void register_device(py::module_& m) {
  m.def("device_api_capsule", &device_api_capsule);
  m.def("device_set_live", &device_set_live);
  m.def("device_live_queues", &device_live_queues);
  m.def("device_capturing", &device_capturing);
  m.def("device_enqueue", &py_enqueue);
  m.def("device_flush", &py_flush);
  m.def("device_bench", &device_bench, py::arg("n"), py::arg("capturing"));
}
}  // namespace neuron_prof

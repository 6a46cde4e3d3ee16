// An emulated `neuron` device: a real PrivateUse1 backend whose memory lives in host RAM and whose
// ops go through asynchronous, fusing queues (TorchNeuron's "Adaptive Eager" execution model), one
// per stream, with events between them. See neuron_prof/testing/neuron.py for what it emulates and
// what it does not. It reports what the device did (kernels and the ops they fused, launches, host
// waits, copies, CPU fallbacks, events) to PyTorch's profiler, as a real backend does: a Kineto
// activity profiler registered for PrivateUse1 (_neuron_kineto.cpp, _neuron_trace.h). Only each
// queue's depth and latest wait, which always-on capture's dumps show between capture windows,
// go through neuron_prof's backend hook API (collectors/neuron_prof_backend.h), of which it is a
// client (version 2's queue_synchronized, or version 1's queue_flushed).
//
// Every op on neuron tensors takes one of three paths (op_path):
//   queued   output metadata from the op's Meta kernel on the host, outputs allocated, the work
//            enqueued; the device thread runs the op's CPU kernel over the device memory, so
//            results are bitwise those of the CPU;
//   inline   ops whose outputs depend on data (nonzero, .item() ...) or that draw random numbers
//            (kept in the CPU generator's order): the queue drains and the op runs on the host;
//   fallback ops the device does not implement (kUnimplemented, or no Meta kernel): the queue
//            drains and torch's CPU fallback copies the inputs to the host and the results back.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <ATen/EmptyTensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/record_function.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ParamCommsUtils.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/extension.h>
#include <torch/library.h>

#include <sys/prctl.h>
#include <time.h>

#include <chrono>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>

extern "C" void omp_set_num_threads(int);  // libgomp's, loaded with libtorch_cpu
#include <vector>

#include "_neuron_trace.h"
#include "neuron_prof_backend.h"

namespace neuron_dev {

using c10::Device;
using c10::DeviceIndex;
using c10::DeviceType;
using torch::jit::Stack;

constexpr DeviceType kNeuron = DeviceType::PrivateUse1;
constexpr int kMaxDevices = 8;
// Streams per device: 0 is the default stream, 1..kPoolStreams a pool that new streams cycle through
// (as CUDA's stream pool does), the last one the device's communication stream (collectives: see
// "collectives" below), as a collective library keeps a stream of its own; each has its own queue
// and worker thread.
constexpr int kPoolStreams = 7;
constexpr int kCommStream = kPoolStreams + 1;
constexpr int kStreams = kCommStream + 1;

int64_t now_ns() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return int64_t(t.tv_sec) * 1000000000 + t.tv_nsec;
}

// ------------------------------------------------------------------ settings and the hook API
struct Settings {
  int devices = 0;  // 0: not enabled
  int64_t launch_ns = 20000;
  int64_t capacity = int64_t(8) << 30;
  int max_queue = 256;
  int max_fused = 16;
  // Modes that make the device behave as backends ship (neuron.enable's options; set once, before
  // the first op): an allocator that keeps its counters (memory_stats) but does not report to the
  // profiler, and ops of the user's choice left to the boxed CPU fallback (g_cpu_ops).
  bool allocator_reports = true;
};
Settings g_settings;
std::unordered_set<std::string> g_cpu_ops;  // ops left to the CPU fallback beside kUnimplemented
// A backend bug to test against (set_trace_fault): an op name it reports with a raw quote in it,
// which Kineto writes into the trace's JSON as it is, so the trace no longer parses.
std::atomic<bool> g_trace_fault{false};
const neuron_prof_backend_api* g_api = nullptr;  // reports each queue's state to (always-on dumps)
bool g_api_v2 = false;  // g_api has version 2's queue_synchronized; else only version 1's queue_flushed

inline bool capturing() { return g_api != nullptr && *g_api->capturing; }

// ------------------------------------------------------------------ allocator
std::atomic<int64_t> g_allocated[kMaxDevices];
std::atomic<int64_t> g_peak[kMaxDevices];
thread_local DeviceIndex tl_device = 0;  // the current device: the allocator allocates there

// Makes `d` the current device for a scope (an allocation on a device that is not current).
struct OnDevice {
  DeviceIndex saved;
  explicit OnDevice(DeviceIndex d) : saved(tl_device) { tl_device = d; }
  ~OnDevice() { tl_device = saved; }
};

struct Block {
  void* ptr;
  size_t bytes;
  DeviceIndex device;
};

void free_block(void* ctx) {
  auto* b = static_cast<Block*>(ctx);
  int64_t total = (g_allocated[b->device] -= int64_t(b->bytes));
  if (g_settings.allocator_reports)
    c10::reportMemoryUsageToProfiler(b->ptr, -int64_t(b->bytes), size_t(total), size_t(total),
                                     Device(kNeuron, b->device));
  std::free(b->ptr);
  delete b;
}

std::string format_mib(int64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f MiB", double(bytes) / (1 << 20));
  return buf;
}

struct NeuronAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    DeviceIndex dev = tl_device;
    int64_t before = g_allocated[dev].load();
    if (before + int64_t(n) > g_settings.capacity) {
      c10::reportOutOfMemoryToProfiler(int64_t(n), size_t(before), size_t(before), Device(kNeuron, dev));
      TORCH_CHECK_WITH(OutOfMemoryError, false, "neuron out of memory. Tried to allocate ", format_mib(int64_t(n)),
                       " (device neuron:", int(dev), "; ", format_mib(g_settings.capacity), " total capacity; ",
                       format_mib(before), " already allocated)");
    }
    void* p = n ? std::aligned_alloc(64, (n + 63) / 64 * 64) : nullptr;
    TORCH_CHECK(n == 0 || p != nullptr, "neuron: host allocation of ", n, " bytes failed");
    int64_t total = (g_allocated[dev] += int64_t(n));
    int64_t peak = g_peak[dev].load();
    while (total > peak && !g_peak[dev].compare_exchange_weak(peak, total)) {
    }
    if (g_settings.allocator_reports)
      c10::reportMemoryUsageToProfiler(p, int64_t(n), size_t(total), size_t(total), Device(kNeuron, dev));
    return {p, new Block{p, n, dev}, &free_block, Device(kNeuron, dev)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
};
NeuronAllocator g_allocator;
REGISTER_ALLOCATOR(kNeuron, &g_allocator);

// Pinned host memory (pin_memory()): host memory a non_blocking copy to the device reads in place,
// without staging a copy and without a host wait. Its blocks are kept by address so that
// isPinnedPtr answers for any pointer into one (a view's data).
std::mutex g_pinned_mu;
std::map<uintptr_t, size_t> g_pinned_blocks;  // start -> bytes

void free_pinned(void* p) {
  {
    std::lock_guard<std::mutex> lock(g_pinned_mu);
    g_pinned_blocks.erase(reinterpret_cast<uintptr_t>(p));
  }
  std::free(p);
}

bool is_pinned_ptr(const void* p) {
  auto at = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(g_pinned_mu);
  auto it = g_pinned_blocks.upper_bound(at);
  if (it == g_pinned_blocks.begin()) return false;
  --it;
  return at < it->first + std::max<size_t>(it->second, 1);
}

struct PinnedAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    void* p = n ? std::aligned_alloc(64, (n + 63) / 64 * 64) : nullptr;
    TORCH_CHECK(n == 0 || p != nullptr, "neuron: pinned host allocation of ", n, " bytes failed");
    if (p) {
      std::lock_guard<std::mutex> lock(g_pinned_mu);
      g_pinned_blocks[reinterpret_cast<uintptr_t>(p)] = n;
    }
    return {p, p, &free_pinned, Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_pinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
};
PinnedAllocator g_pinned_allocator;

// ------------------------------------------------------------------ the queues
enum class Kind { Pointwise, Reduction, Matmul, Copy, Other };

struct Task {
  std::function<void()> run;
  std::string name;
  Kind kind;
  int32_t correlation = 0;  // its launch's in the activity trace (0: no trace recorded it)
  uint64_t external = 0;    // the profiler's id of the host op that queued it
};

// An event (what c10::Event's handle points at: a new'd EventHandle). Its records are numbered:
// record() queues version n+1, and a wait waits for the version recorded when the wait was queued
// (CUDA's semantics: recording the event again later does not change what an earlier wait waits for).
struct EventState {
  uint64_t id = 0;      // the hook API's event id (process-wide, from 1)
  bool timing = false;  // enable_timing
  DeviceIndex device = -1;
  int stream = 0;       // where its latest record was queued
  uint64_t recorded = 0, completed = 0;  // versions queued and reached (g_events_mu)
  int64_t completed_ns = -1;             // when the device reached the latest one
  int32_t record_correlation = 0;        // the latest record's launch in the activity trace
};
using EventHandle = std::shared_ptr<EventState>;  // shared with the markers still queued
std::mutex g_events_mu;
std::condition_variable g_events_cv;  // an event was completed
std::atomic<uint64_t> g_event_serial{0};
// The live handles (g_events_mu): what Python may name by Event.event_id (see elapsed_time_of).
std::unordered_set<const void*> g_event_handles;

EventHandle event_of(void* handle) { return *static_cast<EventHandle*>(handle); }

// What a queue entry is: a kernel, or a marker of an event (a record, or a wait for one). Markers
// cost no launch, are not kernels, and nothing fuses across them.
enum class Marker { None, Record, Wait };

struct Kernel {
  std::vector<Task> tasks;
  bool started = false;
  uint64_t group = 0;   // a compiled group's kernel (begin_kernel): runs only once sealed
  bool sealed = true;
  std::string name;     // a group's name; else the fused ops' names
  Marker marker = Marker::None;
  EventHandle event;    // a marker's event and the version it records or waits for
  uint64_t version = 0;
  int32_t correlation = 0;  // a marker's host call in the activity trace (0: not recorded)
  int32_t record_correlation = 0;  // a wait's: the traced record it waits for (0: none)
  int wait_on_stream = -1;         // a wait's: the stream that record was put on
};

// The compiled group the calling thread is enqueuing (neuron.kernel(name): every op enqueued
// until it closes runs as one kernel).
struct Group {
  uint64_t serial = 0;  // 0: none open
  std::string name;
  int device = -1;      // where its kernel was put
};
thread_local Group tl_group;
std::atomic<uint64_t> g_group_serial{0};

// Fusion rule, on op kinds in queue order (not on data flow): a kernel starts with any op; a
// pointwise op (copies included) joins the kernel at the back of the queue when that kernel has
// not started and holds only pointwise ops, one matmul or one reduction followed by pointwise ops
// (an epilogue), up to max_fused ops. Every other op starts a kernel of its own.
bool fusable(const Kernel& k, Kind next) {
  if (k.group != 0 || k.marker != Marker::None) return false;
  if (k.started || (next != Kind::Pointwise && next != Kind::Copy)) return false;
  if (int(k.tasks.size()) >= g_settings.max_fused) return false;
  Kind head = k.tasks.front().kind;
  if (head == Kind::Other) return false;
  for (size_t i = 1; i < k.tasks.size(); ++i)
    if (k.tasks[i].kind != Kind::Pointwise && k.tasks[i].kind != Kind::Copy) return false;
  return true;
}

// One stream: its queue, run in order by a worker thread of its own, so that the streams of a
// device run at the same time (a compute and a copy engine, and more).
struct Queue {
  DeviceIndex device = 0;
  int stream = 0;
  std::mutex mu;
  std::condition_variable work_cv, idle_cv;
  std::deque<std::unique_ptr<Kernel>> pending;  // not started, or running at the front
  std::vector<std::unique_ptr<Kernel>> done;    // run; destroyed on a host thread (frees there)
  std::atomic<bool> reapable{false};            // done holds something
  int64_t in_flight = 0;                        // ops enqueued and not yet run
  std::string error;                            // the first error of an op on the device
  std::thread worker;
  bool stop = false;

  void run_worker();
  void run_kernel(Kernel& k);
  void report_kernel(const Kernel& k, const std::string& name, int64_t start, int64_t end);
  void reach_record(Kernel& k);
  void reach_wait(Kernel& k);
};

Queue* g_queues[kMaxDevices][kStreams] = {};
std::atomic<int> g_pool_next[kMaxDevices];     // the pool stream a new stream gets next
thread_local int tl_stream[kMaxDevices] = {};  // each thread's current stream, per device

void Queue::run_worker() {
  at::RecordFunctionGuard no_ops(false);  // the device's work is not the host's ops
  c10::AutoGradMode no_grad(false);
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
  // The device computes on one core of its own (neuron.DEVICE_THREADS): a second OpenMP team of the CPU's size would
  // fight the host's for the cores, and every kernel would wait out scheduler time slices
  // (on 2 cores, kernels took whole multiples of ~8 ms). lazy_init first: it would reset it.
  at::internal::lazy_init_num_threads();
  omp_set_num_threads(1);
  for (;;) {
    Kernel* k;
    {
      std::unique_lock<std::mutex> lock(mu);
      work_cv.wait(lock, [&] { return stop || (!pending.empty() && pending.front()->sealed); });
      if (pending.empty()) return;
      k = pending.front().get();
      k->started = true;
    }
    switch (k->marker) {
      case Marker::None: run_kernel(*k); break;
      case Marker::Record: reach_record(*k); break;
      case Marker::Wait: reach_wait(*k); break;
    }
    std::lock_guard<std::mutex> lock(mu);
    in_flight -= int64_t(k->tasks.size());
    done.push_back(std::move(pending.front()));
    pending.pop_front();
    reapable = true;
    if (pending.empty()) idle_cv.notify_all();
  }
}

void Queue::run_kernel(Kernel& k) {
  int64_t start = now_ns();
  // The launch cost of one kernel: the device is busy, the host's cores are not (a sleep, with
  // the thread's timer slack at 1 ns so that tens of microseconds are tens of microseconds).
  if (g_settings.launch_ns > 0) std::this_thread::sleep_for(std::chrono::nanoseconds(g_settings.launch_ns));
  for (auto& t : k.tasks) {
    try {
      t.run();
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu);
      if (error.empty()) error = t.name + ": " + e.what();
    }
  }
  int64_t end = now_ns();
  bool traced = false;
  for (const auto& t : k.tasks) traced |= t.correlation != 0;
  if (!traced) return;
  std::string name = k.name;  // a group's; else the fused ops' names
  if (k.group == 0)
    for (const auto& t : k.tasks) {
      if (!name.empty()) name += "+";
      name += t.name.rfind("aten::", 0) == 0 ? t.name.substr(6) : t.name;
    }
  report_kernel(k, name, start, end);
}

// What the device ran while a trace recorded: kernels and their device time per (device, stream),
// the ground truth a test holds a profiler's view of the device against (traced_kernels).
std::mutex g_traced_mu;
std::map<std::pair<int, int>, std::pair<int64_t, int64_t>> g_traced;

// The kernel's activity: linked to the launch of its first traced op, with the launches of all of
// them (the ops it fused) as "queued ops".
void Queue::report_kernel(const Kernel& k, const std::string& name, int64_t start, int64_t end) {
  {
    std::lock_guard<std::mutex> lock(g_traced_mu);
    auto& n = g_traced[{int(device), stream}];
    n.first += 1;
    n.second += end - start;
  }
  trace::Record r = trace::on_device(trace::Kind::Kernel, name, start, end, device, stream);
  std::string ops = "[";
  for (const auto& t : k.tasks) {
    if (t.correlation == 0) continue;
    if (r.correlation == 0) {
      r.correlation = t.correlation;
      r.external = t.external;
    } else {
      ops += ", ";
    }
    ops += std::to_string(t.correlation);
  }
  r.args.push_back(trace::raw("queued ops", ops + "]"));
  trace::add(std::move(r));
}

// The stream reached an event's record: the event completes now (its timestamp is the device's).
void Queue::reach_record(Kernel& k) {
  int64_t ts = now_ns();
  {
    std::lock_guard<std::mutex> lock(g_events_mu);
    if (k.version >= k.event->completed) {
      k.event->completed = k.version;
      k.event->completed_ns = ts;
    }
  }
  g_events_cv.notify_all();
  if (k.correlation != 0) {  // its record was traced: the device reached it now
    trace::Record r = trace::on_device(trace::Kind::EventRecord, "Event Record", ts, ts, device, stream, k.correlation);
    r.args.push_back(trace::number("event", int64_t(k.event->id)));
    trace::add(std::move(r));
  }
}

// The stream reached a wait: it stands idle until the event's awaited record completes.
void Queue::reach_wait(Kernel& k) {
  int64_t start = now_ns();
  bool waited = false;
  {
    std::unique_lock<std::mutex> lock(g_events_mu);
    EventState& e = *k.event;
    if (e.completed < k.version) {
      waited = true;
      g_events_cv.wait(lock, [&] { return e.completed >= k.version; });
    }
  }
  int64_t end = now_ns();
  if (waited && k.correlation != 0) {  // its wait was traced: the stream stood idle until now
    trace::Record r = trace::on_device(trace::Kind::StreamWait, "Stream Wait Event", start, end, device, stream,
                                       k.correlation);
    r.args = {trace::text("cuda_sync_kind", "Stream Wait Event"), trace::number("wait_on_stream", k.wait_on_stream),
              trace::number("wait_on_cuda_event_record_corr_id", k.record_correlation),
              trace::number("wait_on_cuda_event_id", int64_t(k.event->id)), trace::number("stream idle", 1)};
    trace::add(std::move(r));
  }
}

// A host thread's call into the device, as the activity trace records it (PRIVATEUSE1_RUNTIME):
// name, span on the calling thread, device, and the profiler's id of the host op open there.
trace::Record host_call(const char* name, int64_t start, int64_t end, DeviceIndex d) {
  trace::Record r;
  r.kind = trace::Kind::Runtime;
  r.name = name;
  r.start = start;
  r.end = end;
  r.device = d;
  r.tid = trace::thread_id();
  r.external = trace::current_external();
  return r;
}

const char* const kWaitReasons[] = {"sync", "size", "fallback", "synchronize", "other", "stream_synchronize",
                                    "event_synchronize"};

void check_device(DeviceIndex d) {
  TORCH_CHECK(d >= 0 && d < g_settings.devices, "neuron: no device neuron:", int(d), " (",
              g_settings.devices, " enabled)");
}

Queue& queue(DeviceIndex d, int64_t stream) {
  check_device(d);
  TORCH_CHECK(stream >= 0 && stream < kStreams, "neuron: no stream ", stream, " on neuron:", int(d));
  return *g_queues[d][stream];
}

// The calling thread's current stream of device d: where its ops go.
Queue& current_queue(DeviceIndex d) { return queue(d, d >= 0 && d < kMaxDevices ? tl_stream[d] : 0); }

// Stream `id` of device d as PyTorch names it.
c10::Stream stream_of(DeviceIndex d, int id) {
  return c10::Stream(c10::Stream::UNSAFE, Device(kNeuron, d), c10::StreamId(id));
}

// Kernels already run, destroyed here (on a host thread): the tensors they held are freed where
// the memory profiler of the host thread sees the frees, as a real backend frees at the host.
void reap(Queue& q) {
  if (!q.reapable.exchange(false)) return;
  std::vector<std::unique_ptr<Kernel>> done;
  {
    std::lock_guard<std::mutex> lock(q.mu);
    done.swap(q.done);
  }
}

void reap_device(DeviceIndex d) {
  for (int s = 0; s < kStreams; ++s) reap(*g_queues[d][s]);
}

void raise_device_error(Queue& q) {
  std::string error;
  {
    std::lock_guard<std::mutex> lock(q.mu);
    error.swap(q.error);
  }
  TORCH_CHECK(error.empty(), "neuron: an op queued earlier failed on the device: ", error);
}

void end_group();

// A host wait ends the calling thread's open group kernel (it would wait for itself); the rest of
// the group is another kernel of the same name.
void end_group_before_wait() {
  if (tl_group.serial == 0) return;
  std::string name = tl_group.name;
  end_group();
  tl_group = Group{++g_group_serial, name, -1};
}

// Reports a host wait that began at start: to the activity trace (a host call with its stream, -1
// for every stream of the device, its event, why and for how many ops), and as the queue's latest
// flush to the hook API (version 2's queue_synchronized, or version 1's queue_flushed).
void report_wait(DeviceIndex d, int stream, uint64_t event, int reason, int64_t ops, int64_t start) {
  if (trace::on()) {
    // a wait for the whole device, one stream or one event, with why and for how many ops
    trace::Record r = host_call(reason == NEURON_PROF_FLUSH_EVENT_SYNCHRONIZE    ? "neuronEventSynchronize"
                                : reason == NEURON_PROF_FLUSH_STREAM_SYNCHRONIZE ? "neuronStreamSynchronize"
                                : stream >= 0                                   ? "neuronStreamSynchronize"
                                                                                : "neuronDeviceSynchronize",
                                start, now_ns(), d);
    r.correlation = trace::next_correlation();
    r.args = {trace::number("stream", stream), trace::text("wait reason", kWaitReasons[reason]),
              trace::number("ops waited for", ops)};
    if (event) r.args.push_back(trace::number("event", int64_t(event)));
    trace::add(std::move(r));
  }
  if (!capturing()) return;
  if (g_api_v2) {
    g_api->queue_synchronized(d, stream, event, reason, int32_t(ops), start, now_ns());
  } else {
    int v1_reason = reason > NEURON_PROF_FLUSH_OTHER ? NEURON_PROF_FLUSH_SYNCHRONIZE : reason;
    g_api->queue_flushed(d, v1_reason, int32_t(ops), start, now_ns());
  }
}

// Waits until the queues have run everything queued on them; reports the wait if it waited for
// anything (ops or markers) and raises the first device error of any of them.
void drain(const std::vector<Queue*>& queues, int stream, int reason) {
  end_group_before_wait();
  int64_t start = now_ns();
  int64_t ops = 0;
  bool any = false;
  for (Queue* q : queues) {
    std::lock_guard<std::mutex> lock(q->mu);
    ops += q->in_flight;
    any |= !q->pending.empty();
  }
  for (Queue* q : queues) {
    std::unique_lock<std::mutex> lock(q->mu);
    q->idle_cv.wait(lock, [&] { return q->pending.empty(); });
  }
  if (any) report_wait(queues.front()->device, stream, 0, reason, ops, start);
  for (Queue* q : queues) reap(*q);
  for (Queue* q : queues) raise_device_error(*q);
}

// The host waits for every stream of device d. Host syncs that need a value (.item(), .cpu(),
// data-dependent ops, fallbacks) take this path too: simplest and safe (the value may come from
// any stream), at the cost of waiting for streams it does not need.
void flush(DeviceIndex d, int reason) {
  check_device(d);
  drain(std::vector<Queue*>(g_queues[d], g_queues[d] + kStreams), -1, reason);
}

void flush_all(int reason) {
  for (int d = 0; d < g_settings.devices; ++d) flush(DeviceIndex(d), reason);
}

// The host waits for one stream only (Stream.synchronize(), a full queue).
void flush_stream(Queue& q, int reason) { drain({&q}, q.stream, reason); }

// Puts an op on stream q of device d (fused with the kernel at the back by the fusion rule, or
// into the thread's open group kernel).
void enqueue_on(Queue& q, DeviceIndex d, const std::string& name, Kind kind, std::function<void()> run) {
  reap_device(d);
  bool full;
  const bool traced = trace::on();
  const int64_t start = traced ? now_ns() : 0;
  int32_t depth;
  Task t{std::move(run), name, kind};
  if (traced) {
    t.correlation = trace::next_correlation();
    t.external = trace::current_external();
  }
  const int32_t correlation = t.correlation;
  {
    std::lock_guard<std::mutex> lock(q.mu);
    depth = int32_t(q.in_flight + 1);
    if (capturing()) g_api->op_enqueued(d, q.stream, name.c_str(), depth);
    uint64_t group = tl_group.serial;
    Kernel* back = q.pending.empty() ? nullptr : q.pending.back().get();
    if (back && (group != 0 ? back->group == group : fusable(*back, kind))) {
      back->tasks.push_back(std::move(t));
    } else {
      auto k = std::make_unique<Kernel>();
      k->tasks.push_back(std::move(t));
      if (group != 0) {
        k->group = group;
        k->sealed = false;
        k->name = tl_group.name;
        tl_group.device = d;
      }
      q.pending.push_back(std::move(k));
    }
    full = ++q.in_flight >= g_settings.max_queue;
  }
  q.work_cv.notify_one();
  if (traced) {  // the launch: the op, its stream, the queue's depth with it
    trace::Record r = host_call("neuronLaunchKernel", start, now_ns(), d);
    r.correlation = correlation;
    r.flow_start = true;
    r.args = {trace::number("stream", q.stream), trace::text("op", g_trace_fault ? name + "\"" : name),
              trace::number("queue depth", depth)};
    trace::add(std::move(r));
  }
  if (full) flush_stream(q, NEURON_PROF_FLUSH_SIZE);
}

// Puts an op on the calling thread's current stream of device d.
void enqueue(DeviceIndex d, const std::string& name, Kind kind, std::function<void()> run) {
  enqueue_on(current_queue(d), d, name, kind, std::move(run));
}

// Puts a record of `event` (or a wait for its record `version`) on q; `call`: its host call in the
// activity trace (its correlation id, 0 when none), `wait_on`: a wait's record (correlation, stream).
void enqueue_marker(Queue& q, Marker marker, const EventHandle& event, uint64_t version, int32_t call,
                    std::pair<int32_t, int> wait_on = {0, -1}) {
  {
    std::lock_guard<std::mutex> lock(q.mu);
    auto k = std::make_unique<Kernel>();
    k->marker = marker;
    k->event = event;
    k->version = version;
    k->correlation = call;
    k->record_correlation = wait_on.first;
    k->wait_on_stream = wait_on.second;
    q.pending.push_back(std::move(k));
  }
  q.work_cv.notify_one();
}

// The host call that put a record or wait of `event` on q, in the activity trace: its correlation
// id (what the device's "Event Record" and "Stream Wait Event" activities name), 0 when no trace
// records.
int32_t trace_event_call(const char* name, Queue& q, const EventState& e, int64_t start) {
  if (!trace::on()) return 0;
  trace::Record r = host_call(name, start, now_ns(), q.device);
  r.correlation = trace::next_correlation();
  r.args = {trace::number("stream", q.stream), trace::number("event", int64_t(e.id))};
  int32_t id = r.correlation;
  trace::add(std::move(r));
  return id;
}

// Event.record(stream): a record marker on the stream's queue; the event completes when the
// stream's worker reaches it.
void record_event(void** handle, const c10::Stream& s, DeviceIndex event_device, c10::EventFlag flag) {
  TORCH_CHECK(event_device == -1 || event_device == s.device_index(), "neuron: an event of neuron:",
              int(event_device), " cannot be recorded on a stream of neuron:", int(s.device_index()));
  Queue& q = queue(s.device_index(), s.id());
  if (*handle == nullptr) {
    auto e = std::make_shared<EventState>();
    e->id = ++g_event_serial;
    e->timing = flag == c10::EventFlag::BACKEND_DEFAULT;
    *handle = new EventHandle(std::move(e));
    std::lock_guard<std::mutex> lock(g_events_mu);
    g_event_handles.insert(*handle);
  }
  EventHandle e = event_of(*handle);
  int32_t call = trace_event_call("neuronEventRecord", q, *e, now_ns());
  uint64_t version;
  {
    std::lock_guard<std::mutex> lock(g_events_mu);
    version = ++e->recorded;
    e->device = q.device;
    e->stream = q.stream;
    e->record_correlation = call;
  }
  enqueue_marker(q, Marker::Record, e, version, call);
}

// Stream.wait_event(event): a wait marker on the stream's queue, for the event's latest record;
// an event never recorded has nothing to wait for (as on CUDA).
void wait_event(void* handle, const c10::Stream& s) {
  if (handle == nullptr) return;
  Queue& q = queue(s.device_index(), s.id());
  EventHandle e = event_of(handle);
  uint64_t version;
  std::pair<int32_t, int> record;
  {
    std::lock_guard<std::mutex> lock(g_events_mu);
    version = e->recorded;
    record = {e->record_correlation, e->stream};
  }
  if (version == 0) return;
  int32_t call = trace_event_call("neuronStreamWaitEvent", q, *e, now_ns());
  enqueue_marker(q, Marker::Wait, e, version, call, record);
}

bool event_done(void* handle) {
  if (handle == nullptr) return true;
  EventHandle e = event_of(handle);
  std::lock_guard<std::mutex> lock(g_events_mu);
  return e->completed >= e->recorded;
}

// Ops queued on q ahead of the event's record (what a host wait for the event waits for).
int64_t ops_before(Queue& q, const EventHandle& e, uint64_t version) {
  std::lock_guard<std::mutex> lock(q.mu);
  int64_t ops = 0;
  for (const auto& k : q.pending) {
    if (k->marker == Marker::Record && k->event == e && k->version == version) break;
    ops += int64_t(k->tasks.size());
  }
  return ops;
}

// Event.synchronize(): the host waits for the event's latest record only (not for the rest of its
// stream, nor for other streams).
void synchronize_event(void* handle) {
  if (handle == nullptr) return;
  EventHandle e = event_of(handle);
  uint64_t version;
  {
    std::lock_guard<std::mutex> lock(g_events_mu);
    version = e->recorded;
    if (e->completed >= version) return;
  }
  end_group_before_wait();
  Queue& q = queue(e->device, e->stream);
  int64_t ops = ops_before(q, e, version);
  int64_t start = now_ns();
  {
    std::unique_lock<std::mutex> lock(g_events_mu);
    g_events_cv.wait(lock, [&] { return e->completed >= version; });
  }
  report_wait(q.device, q.stream, e->id, NEURON_PROF_FLUSH_EVENT_SYNCHRONIZE, ops, start);
  reap(q);
  raise_device_error(q);
}

// Event.elapsed_time: milliseconds between the device's timestamps of the two events' records.
double elapsed_ms(void* from, void* to) {
  TORCH_CHECK(from != nullptr && to != nullptr, "neuron: both events must be recorded before elapsed_time");
  EventHandle a = event_of(from), b = event_of(to);
  TORCH_CHECK(a->timing && b->timing, "neuron: both events must be created with enable_timing=True");
  std::lock_guard<std::mutex> lock(g_events_mu);
  TORCH_CHECK(a->recorded > 0 && b->recorded > 0, "neuron: both events must be recorded before elapsed_time");
  TORCH_CHECK(a->completed >= a->recorded && b->completed >= b->recorded,
              "neuron: both events must be completed before elapsed_time");
  return double(b->completed_ns - a->completed_ns) / 1e6;
}

void destroy_event(void* handle) {
  if (handle == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(g_events_mu);
    g_event_handles.erase(handle);
  }
  delete static_cast<EventHandle*>(handle);
}

// Event.elapsed_time between two events Python names by their event_id (torch.Event's own
// elapsed_time takes only an exact torch.Event as the other, not torch.neuron.Event): ids of live
// events only, so a wrong id raises instead of reading freed memory.
double elapsed_time_of(uintptr_t from, uintptr_t to) {
  {
    std::lock_guard<std::mutex> lock(g_events_mu);
    TORCH_CHECK(g_event_handles.count(reinterpret_cast<void*>(from)) && g_event_handles.count(reinterpret_cast<void*>(to)),
                "neuron: both events must be recorded neuron events before elapsed_time");
  }
  return elapsed_ms(reinterpret_cast<void*>(from), reinterpret_cast<void*>(to));
}

Kind kind_of(const std::string& name);

// The eager queue's fusion rule over a sequence of ops (a compiler's partition of a graph into
// kernels, by the same rule): each op's kernel number.
std::vector<int> fusion_groups(const std::vector<std::string>& ops) {
  std::vector<int> out;
  Kernel k;
  int g = -1;
  for (const auto& name : ops) {
    Kind kind = name == "aten::copy_" ? Kind::Copy : kind_of(name);
    if (g < 0 || !fusable(k, kind)) {
      k = Kernel();
      ++g;
    }
    k.tasks.push_back(Task{{}, name, kind});
    out.push_back(g);
  }
  return out;
}

void begin_group(const std::string& name) {
  TORCH_CHECK(tl_group.serial == 0, "neuron: a kernel is already open on this thread (", tl_group.name, ")");
  tl_group = Group{++g_group_serial, name, -1};
}

// Seals the open group's kernel (on whichever stream of its device it was put): the device may
// run it now.
void end_group() {
  Group g = tl_group;
  tl_group = Group{};
  if (g.serial == 0 || g.device < 0) return;
  for (int s = 0; s < kStreams; ++s) {
    Queue& q = *g_queues[g.device][s];
    {
      std::lock_guard<std::mutex> lock(q.mu);
      for (auto& k : q.pending)
        if (k->group == g.serial) k->sealed = true;
    }
    q.work_cv.notify_one();
  }
}

// ------------------------------------------------------------------ tensors
bool is_neuron(const at::Tensor& t) { return t.defined() && t.device().type() == kNeuron; }

// A CPU tensor over a neuron tensor's memory (no copy): what the device's kernels compute on.
at::Tensor host_alias(const at::Tensor& t) {
  auto opts = at::TensorOptions().dtype(t.dtype()).device(at::kCPU);
  if (t.storage().nbytes() == 0) return at::empty_strided(t.sizes(), t.strides(), opts);
  char* base = static_cast<char*>(t.storage().mutable_data());
  return at::for_blob(base + t.storage_offset() * t.itemsize(), t.sizes())
      .strides(t.strides())
      .options(opts)
      .make_tensor();
}

at::Tensor meta_like(const at::Tensor& t) {
  auto opts = at::TensorOptions().dtype(t.dtype()).device(at::kMeta);
  int64_t elems = int64_t(t.storage().nbytes() / std::max<size_t>(t.itemsize(), 1));
  return at::empty({elems}, opts).as_strided(t.sizes(), t.strides(), t.storage_offset());
}

at::Tensor empty_neuron(at::IntArrayRef size, at::IntArrayRef stride, c10::ScalarType dtype, DeviceIndex d) {
  OnDevice on(d);
  return at::detail::empty_strided_generic(size, stride, &g_allocator,
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dtype);
}

template <typename F>
c10::IValue map_tensors(const c10::IValue& v, F f) {
  if (v.isTensor()) return f(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(f(t));
    return out;
  }
  if (v.isOptionalTensorList()) {
    c10::List<std::optional<at::Tensor>> out;
    for (const std::optional<at::Tensor>& t : v.toOptionalTensorList())
      out.push_back(t.has_value() && t->defined() ? std::optional<at::Tensor>(f(*t)) : t);
    return out;
  }
  return v;
}

template <typename F>
void for_tensors(const c10::IValue& v, F f) {
  if (v.isTensor()) {
    f(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) f(t);
  } else if (v.isOptionalTensorList()) {
    for (const std::optional<at::Tensor>& t : v.toOptionalTensorList())
      if (t.has_value()) f(*t);
  }
}

at::Tensor to_host_view(const at::Tensor& t) { return is_neuron(t) ? host_alias(t) : t; }

// ------------------------------------------------------------------ which path an op takes
enum class Path { Queued, Inline, Fallback };

// Left unimplemented on purpose, so that CPU fallbacks show up in realistic training code (see
// neuron.py's UNIMPLEMENTED, which lists the same ops).
const std::unordered_set<std::string> kUnimplemented = {
    "aten::embedding_dense_backward", "aten::cumsum", "aten::sort", "aten::topk", "aten::linalg_vector_norm",
};
// Outputs that depend on the data: the host must wait for it.
const std::unordered_set<std::string> kDataDependent = {
    "aten::nonzero", "aten::masked_select", "aten::_unique2", "aten::unique_consecutive", "aten::unique_dim",
    "aten::repeat_interleave", "aten::equal", "aten::is_nonzero", "aten::nonzero_static",
};
const std::unordered_set<std::string> kMatmul = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"};
const std::unordered_set<std::string> kReduction = {
    "aten::sum", "aten::mean", "aten::amax", "aten::amin", "aten::max", "aten::min", "aten::var_mean",
    "aten::var", "aten::std", "aten::norm", "aten::prod", "aten::argmax", "aten::argmin", "aten::all",
    "aten::any",
};
const std::unordered_set<std::string> kPointwise = {
    "aten::add", "aten::add_", "aten::sub", "aten::sub_", "aten::mul", "aten::mul_", "aten::div", "aten::div_",
    "aten::neg", "aten::exp", "aten::log", "aten::sqrt", "aten::rsqrt", "aten::pow", "aten::pow_", "aten::tanh",
    "aten::sigmoid", "aten::relu", "aten::relu_", "aten::gelu", "aten::gelu_backward", "aten::silu",
    "aten::silu_backward", "aten::threshold_backward", "aten::sigmoid_backward", "aten::tanh_backward",
    "aten::where", "aten::masked_fill", "aten::masked_fill_", "aten::fill_", "aten::zero_", "aten::clamp",
    "aten::clamp_", "aten::clamp_min", "aten::clamp_max", "aten::lerp_", "aten::addcmul", "aten::addcmul_",
    "aten::addcdiv", "aten::addcdiv_", "aten::abs", "aten::sign", "aten::reciprocal", "aten::square",
    "aten::eq", "aten::ne", "aten::lt", "aten::le", "aten::gt", "aten::ge", "aten::logical_not",
    "aten::bitwise_not", "aten::maximum", "aten::minimum", "aten::erf", "aten::expm1", "aten::log1p",
    "aten::_foreach_add_", "aten::_foreach_mul_", "aten::_foreach_addcmul_", "aten::_foreach_addcdiv_",
    "aten::_foreach_lerp_", "aten::_foreach_sqrt", "aten::_foreach_div_", "aten::_foreach_add",
    "aten::_foreach_div", "aten::_foreach_mul", "aten::_foreach_sub_", "aten::_foreach_neg",
    "aten::_foreach_zero_", "aten::_foreach_copy_",
};

Kind kind_of(const std::string& name) {
  if (kPointwise.count(name)) return Kind::Pointwise;
  if (kMatmul.count(name)) return Kind::Matmul;
  if (kReduction.count(name)) return Kind::Reduction;
  return Kind::Other;
}

std::mutex g_paths_mu;
std::unordered_map<const void*, Path> g_paths;  // by operator (its schema's address)

Path initial_path(const c10::OperatorHandle& op) {
  const auto& schema = op.schema();
  const std::string& name = schema.name();
  if (kUnimplemented.count(name) || g_cpu_ops.count(name)) return Path::Fallback;
  if (kDataDependent.count(name)) return Path::Inline;
  for (const auto& a : schema.arguments())
    if (a.type()->kind() == c10::TypeKind::OptionalType &&
        a.type()->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::GeneratorType)
      return Path::Inline;  // random numbers: drawn in program order from the CPU generator
  for (const auto& r : schema.returns()) {
    auto k = r.type()->kind();
    if (k != c10::TypeKind::TensorType && !(k == c10::TypeKind::ListType && r.type()->isSubtypeOf(*c10::ListType::ofTensors())))
      return Path::Inline;  // a value the host reads (a bool, a number)
    if (r.alias_info() && !r.alias_info()->isWrite()) return Path::Fallback;  // a view the device lacks
  }
  return Path::Queued;
}

Path op_path(const c10::OperatorHandle& op) {
  const void* key = &op.schema();
  std::lock_guard<std::mutex> lock(g_paths_mu);
  auto it = g_paths.find(key);
  if (it != g_paths.end()) return it->second;
  return g_paths[key] = initial_path(op);
}

void set_path(const c10::OperatorHandle& op, Path p) {
  std::lock_guard<std::mutex> lock(g_paths_mu);
  g_paths[&op.schema()] = p;
}

DeviceIndex device_of(const Stack& args) {
  for (const auto& v : args) {
    DeviceIndex d = -1;
    for_tensors(v, [&](const at::Tensor& t) {
      if (d < 0 && is_neuron(t)) d = t.device().index();
    });
    if (d >= 0) return d;
    if (v.isDevice() && v.toDevice().type() == kNeuron) return std::max<DeviceIndex>(v.toDevice().index(), 0);
  }
  return tl_device;
}

// The argument a returned alias (``Tensor(a!)``) is: in-place ops' self, out= variants' out.
int aliased_argument(const c10::FunctionSchema& schema, size_t ret) {
  const auto* info = schema.returns()[ret].alias_info();
  if (!info || !info->isWrite()) return -1;
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const auto* a = schema.arguments()[i].alias_info();
    if (a && a->isWrite() && a->beforeSets() == info->beforeSets()) return int(i);
  }
  return -1;
}

// A CPU tensor argument beside neuron ones is a mistake on a real device, except a 0-dim tensor
// (a scalar), which is copied now: the host may change it before the device runs.
c10::IValue snapshot_host(const c10::IValue& v, const std::string& name) {
  return map_tensors(v, [&](const at::Tensor& t) {
    if (!t.defined() || is_neuron(t)) return t;
    TORCH_CHECK(t.dim() == 0, name, ": expected all tensors to be on the same device, but found at least two "
                "devices, neuron and ", t.device(), "!");
    return t.clone();
  });
}

// The key of an op's output metadata: the op and, per argument, a tensor's dtype, sizes and
// strides or a plain value's bits. False for an argument it cannot key (then nothing is cached).
bool append_key(std::string& key, const c10::IValue& v) {
  auto put = [&](const void* p, size_t n) { key.append(static_cast<const char*>(p), n); };
  auto put_i = [&](int64_t x) { put(&x, sizeof(x)); };
  auto put_tensor = [&](const at::Tensor& t) {
    put_i(t.defined() ? int64_t(t.scalar_type()) * 2 + is_neuron(t) : -1);
    if (!t.defined()) return;
    put_i(t.dim());
    for (int64_t d : t.sizes()) put_i(d);
    for (int64_t d : t.strides()) put_i(d);
  };
  key.push_back(char(v.tagKind().size()));
  key += v.tagKind();
  if (v.isTensor()) {
    put_tensor(v.toTensor());
  } else if (v.isTensorList()) {
    put_i(int64_t(v.toTensorList().size()));
    for (const at::Tensor& t : v.toTensorList()) put_tensor(t);
  } else if (v.isOptionalTensorList()) {
    for (const std::optional<at::Tensor>& t : v.toOptionalTensorList()) put_tensor(t.has_value() ? *t : at::Tensor());
  } else if (v.isInt()) {
    put_i(v.toInt());
  } else if (v.isDouble()) {
    double d = v.toDouble();
    put(&d, sizeof(d));
  } else if (v.isBool()) {
    put_i(v.toBool());
  } else if (v.isIntList()) {
    for (int64_t x : v.toIntVector()) put_i(x);
  } else if (v.isScalar()) {
    at::Scalar sc = v.toScalar();
    put_i(int64_t(sc.type()));
    if (sc.isFloatingPoint()) {
      double d = sc.toDouble();
      put(&d, sizeof(d));
    } else if (sc.isIntegral(true)) {
      put_i(sc.toLong());
    } else {
      return false;  // complex, symbolic
    }
  } else if (v.isDevice()) {
    put_i(int64_t(v.toDevice().type()) * 256 + v.toDevice().index());
  } else if (v.isString()) {
    key += v.toStringRef();
    key.push_back('\0');
  } else if (!v.isNone()) {
    return false;
  }
  return true;
}

std::mutex g_meta_mu;
std::unordered_map<std::string, Stack> g_meta_cache;
constexpr size_t kMetaCacheSize = 1 << 16;

// Outputs' shapes, strides and dtypes (meta tensors) from the op's Meta kernel, cached by what
// they depend on: many Meta kernels are Python (torch._meta_registrations), 50-500 µs a call,
// and a training step repeats its ops with the same shapes.
Stack output_meta(const c10::OperatorHandle& op, const Stack& args) {
  std::string key(reinterpret_cast<const char*>(&op.schema()), sizeof(void*));
  bool keyed = true;
  for (const auto& v : args) keyed = keyed && append_key(key, v);
  if (keyed) {
    std::lock_guard<std::mutex> lock(g_meta_mu);
    auto it = g_meta_cache.find(key);
    if (it != g_meta_cache.end()) return it->second;
  }
  Stack meta;
  {
    at::RecordFunctionGuard no_ops(false);  // the backend's shape functions are not the user's ops
    for (const auto& v : args) meta.push_back(map_tensors(v, [](const at::Tensor& t) {
      return is_neuron(t) ? meta_like(t) : (t.defined() ? t.to(at::kMeta) : t);
    }));
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta);
  }
  if (keyed) {
    std::lock_guard<std::mutex> lock(g_meta_mu);
    if (g_meta_cache.size() >= kMetaCacheSize) g_meta_cache.clear();
    g_meta_cache.emplace(std::move(key), meta);
  }
  return meta;
}

void run_queued(const c10::OperatorHandle& op, Stack* stack, DeviceIndex d) {
  const auto& schema = op.schema();
  const std::string& name = schema.name();
  size_t nargs = schema.arguments().size();
  Stack args(stack->end() - nargs, stack->end());
  Stack meta = output_meta(op, args);
  for (auto& v : args) v = snapshot_host(v, name);
  Stack outs;
  std::vector<bool> fresh;
  for (size_t i = 0; i < meta.size(); ++i) {
    int a = aliased_argument(schema, i);
    if (a >= 0) {
      const at::Tensor& arg = args[a].toTensor();
      const at::Tensor& m = meta[i].toTensor();
      if (arg.sizes() != m.sizes()) arg.resize_(m.sizes());  // an out= tensor, as the op would resize it
      outs.push_back(args[a]);
      fresh.push_back(false);
    } else {
      outs.push_back(map_tensors(meta[i], [&](const at::Tensor& m) {
        return empty_neuron(m.sizes(), m.strides(), m.scalar_type(), d);
      }));
      fresh.push_back(true);
    }
  }
  // The CPU views the device thread computes on are made now: a later in-place metadata op
  // (squeeze_, transpose_, resize_) changes the tensor, not what was queued.
  Stack cpu_args, cpu_outs;
  for (const auto& v : args) cpu_args.push_back(map_tensors(v, to_host_view));
  // An out= tensor is only written: the CPU kernel gets a buffer of its own, copied into the
  // device tensor after, because some kernels resize out= on the way (mse_loss.out makes it
  // elementwise before reducing into it), which device memory cannot be. The buffer starts empty,
  // so the kernel sizes it without PyTorch's warning about resizing a non-empty out=. It is the
  // device's scratch: made and freed on the device thread, where the profiler sees neither.
  std::vector<std::pair<size_t, at::Tensor>> scratch;  // (argument, its output's meta)
  for (size_t i = 0; i < outs.size(); ++i) {
    int a = aliased_argument(schema, i);
    bool out_arg = a >= 0 && schema.arguments()[a].is_out() && args[a].isTensor();
    if (out_arg) scratch.emplace_back(size_t(a), meta[i].toTensor());
    cpu_outs.push_back(fresh[i] || out_arg ? map_tensors(outs[i], host_alias) : c10::IValue());
  }
  c10::OperatorHandle handle = op;
  enqueue(d, name, kind_of(name), [handle, keep = args, outs, cpu_args, cpu_outs, scratch]() {
    Stack cpu = cpu_args;
    for (const auto& [a, m] : scratch) cpu[a] = at::empty({0}, m.options().device(at::kCPU));
    handle.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &cpu);
    for (size_t i = 0; i < cpu_outs.size(); ++i) {
      if (cpu_outs[i].isTensor()) {
        cpu_outs[i].toTensor().copy_(cpu[i].toTensor());
      } else if (cpu_outs[i].isTensorList()) {
        auto dst = cpu_outs[i].toTensorList();
        auto src = cpu[i].toTensorList();
        for (size_t j = 0; j < dst.size(); ++j) dst.get(j).copy_(src.get(j));
      }
    }
  });
  torch::jit::drop(*stack, nargs);
  for (auto& v : outs) stack->push_back(std::move(v));
}

at::Tensor to_device_result(const at::Tensor& r, DeviceIndex d) {
  bool dense = r.is_non_overlapping_and_dense();
  at::Tensor out = dense ? empty_neuron(r.sizes(), r.strides(), r.scalar_type(), d)
                         : empty_neuron(r.sizes(), c10::contiguous_strides(r.sizes()), r.scalar_type(), d);
  host_alias(out).copy_(r);
  return out;
}

void run_inline(const c10::OperatorHandle& op, Stack* stack, DeviceIndex d) {
  const auto& schema = op.schema();
  flush_all(kDataDependent.count(schema.name()) ? NEURON_PROF_FLUSH_SYNC : NEURON_PROF_FLUSH_OTHER);
  size_t nargs = schema.arguments().size();
  Stack args(stack->end() - nargs, stack->end());
  Stack cpu;
  for (const auto& v : args) cpu.push_back(map_tensors(v, to_host_view));
  {
    at::RecordFunctionGuard no_ops(false);
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &cpu);
  }
  torch::jit::drop(*stack, nargs);
  for (size_t i = 0; i < cpu.size(); ++i) {
    int a = aliased_argument(schema, i);
    if (a >= 0)
      stack->push_back(args[a]);
    else
      stack->push_back(map_tensors(cpu[i], [&](const at::Tensor& r) { return to_device_result(r, d); }));
  }
}

int64_t neuron_bytes(const Stack& values) {
  int64_t n = 0;
  for (const auto& v : values)
    for_tensors(v, [&](const at::Tensor& t) {
      if (is_neuron(t)) n += int64_t(t.numel()) * int64_t(t.itemsize());
    });
  return n;
}

void run_fallback(const c10::OperatorHandle& op, Stack* stack, DeviceIndex d) {
  flush_all(NEURON_PROF_FLUSH_FALLBACK);
  size_t nargs = op.schema().arguments().size();
  int64_t to_host = neuron_bytes(Stack(stack->end() - nargs, stack->end()));
  int64_t start = now_ns();
  size_t below = stack->size() - nargs;
  at::native::cpu_fallback(op, stack);
  int64_t from_host = neuron_bytes(Stack(stack->begin() + below, stack->end()));  // its results
  int64_t end = now_ns();
  if (trace::on()) {  // the op ran on the host: which, and the bytes it copied each way
    trace::Record r = host_call("neuronCpuFallback", start, end, d);
    r.correlation = trace::next_correlation();
    r.args = {trace::text("cpu fallback", op.schema().name()), trace::number("bytes to host", to_host),
              trace::number("bytes from host", from_host)};
    trace::add(std::move(r));
  }
}

void neuron_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  TORCH_CHECK(g_settings.devices > 0, "neuron: the device is not enabled (neuron_prof.testing.neuron.enable())");
  size_t nargs = op.schema().arguments().size();
  DeviceIndex d = device_of(Stack(stack->end() - nargs, stack->end()));
  c10::DeviceGuard guard(Device(kNeuron, d));
  switch (op_path(op)) {
    case Path::Queued:
      try {
        run_queued(op, stack, d);
      } catch (const c10::NotImplementedError&) {  // no Meta kernel: the device lacks the op
        set_path(op, Path::Fallback);
        run_fallback(op, stack, d);
      }
      return;
    case Path::Inline:
      return run_inline(op, stack, d);
    case Path::Fallback:
      return run_fallback(op, stack, d);
  }
}

// ------------------------------------------------------------------ kernels of their own
at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout>, std::optional<c10::Device> device,
                               std::optional<bool>, std::optional<c10::MemoryFormat> memory_format) {
  DeviceIndex d = device && device->has_index() ? device->index() : tl_device;
  check_device(d);
  OnDevice on(d);
  return at::detail::empty_generic(size, &g_allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout>, std::optional<c10::Device> device, std::optional<bool>) {
  DeviceIndex d = device && device->has_index() ? device->index() : tl_device;
  check_device(d);
  return empty_neuron(size, stride, c10::dtype_or_default(dtype), d);
}

// A copy from the device to the host memory (pageable: the host waited for it), as the activity
// trace shows one: the host's call (neuronMemcpy) and the copy on the current stream, linked.
void report_copy_to_host(DeviceIndex d, int64_t start, int64_t end, int64_t bytes) {
  trace::Record call = host_call("neuronMemcpy", start, end, d);
  call.correlation = trace::next_correlation();
  call.flow_start = true;
  int stream = d >= 0 && d < kMaxDevices ? tl_stream[d] : 0;
  call.args = {trace::number("stream", stream), trace::number("bytes", bytes)};
  trace::Record copy = trace::on_device(trace::Kind::Memcpy, "Memcpy DtoH (Device -> Pageable)", start, end, d, stream,
                                        call.correlation);
  copy.external = call.external;
  copy.args = {trace::number("bytes", bytes)};
  trace::add(std::move(call));
  trace::add(std::move(copy));
}

// copy_ between devices ends here, on the current stream. neuron -> neuron: queued; cpu -> neuron:
// a non_blocking copy from pinned memory is queued reading the source in place (the kernel holds
// it; as on CUDA, the host must not change it before the copy ran), any other source is staged
// (copied now: the host may change it) and the copy queued; neuron -> cpu: the host waits.
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  at::RecordFunctionGuard no_ops(false);
  if (is_neuron(dst)) {
    bool in_place = is_neuron(self) || (non_blocking && self.is_cpu() && is_pinned_ptr(self.storage().data()));
    at::Tensor src = in_place ? self : self.clone();
    enqueue(dst.device().index(), "aten::copy_", Kind::Copy,
            [src, dst, to = host_alias(dst), from = to_host_view(src)]() { to.copy_(from); });
  } else {
    DeviceIndex d = self.device().index();
    flush(d, NEURON_PROF_FLUSH_SYNC);
    int64_t start = now_ns();
    dst.copy_(host_alias(self));
    if (trace::on()) report_copy_to_host(d, start, now_ns(), int64_t(self.numel()) * int64_t(self.itemsize()));
  }
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return copy_from(self, dst, false);
}

// Growing a storage copies its bytes, so the queue drains first; an empty storage (an out= tensor
// made with at::empty({0})) has no bytes to keep and gets its memory without a wait.
const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size, std::optional<c10::MemoryFormat>) {
  int64_t needed = (int64_t(c10::multiply_integers(size)) + self.storage_offset()) * int64_t(self.itemsize());
  const c10::Storage& storage = self.storage();
  OnDevice on(self.device().index());
  if (needed > int64_t(storage.nbytes())) {
    if (storage.nbytes() == 0) {
      storage.unsafeGetStorageImpl()->set_data_ptr_noswap(g_allocator.allocate(size_t(needed)));
      storage.unsafeGetStorageImpl()->set_nbytes(size_t(needed));
    } else {
      flush(self.device().index(), NEURON_PROF_FLUSH_OTHER);
    }
  }
  at::native::resize_impl_cpu_(self.unsafeGetTensorImpl(), size, std::nullopt);
  return self;
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  DeviceIndex d = self.device().index();
  flush(d, NEURON_PROF_FLUSH_SYNC);
  int64_t start = now_ns();
  at::Scalar value = at::_local_scalar_dense(host_alias(self));
  if (trace::on()) report_copy_to_host(d, start, now_ns(), int64_t(self.itemsize()));
  return value;
}

// Which attention kernel scaled_dot_product_attention runs: the CPU's choice, from metadata
// alone (no data is read, so no wait). A backend without this choice runs the math decomposition.
// The CPU twin of a tensor's metadata (sizes, strides, dtype, requires_grad) over no data: what the
// choice reads. It works for tensors with no memory too (torch.compile's fake tensors).
at::Tensor metadata_twin(const at::Tensor& t) {
  alignas(64) static char nothing[64];
  at::Tensor twin = at::from_blob(nothing, t.sizes(), t.strides(), at::TensorOptions().dtype(t.dtype()));
  if (t.requires_grad()) twin.set_requires_grad(true);
  return twin;
}

int64_t fused_sdp_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const std::optional<at::Tensor>& mask, double dropout, bool causal,
                         std::optional<double> scale, bool gqa) {
  std::optional<at::Tensor> host_mask = mask.has_value() ? std::optional<at::Tensor>(metadata_twin(*mask)) : mask;
  at::RecordFunctionGuard no_ops(false);  // the backend's decision, not a user op
  // past any Python mode (torch.compile's fake-tensor mode would see the twins)
  c10::impl::ExcludeDispatchKeyGuard no_python(
      c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot,
                           c10::DispatchKey::PythonDispatcher}));
  return at::_fused_sdp_choice(metadata_twin(q), metadata_twin(k), metadata_twin(v), host_mask, dropout, causal,
                               scale, gqa);
}

// A dense CPU tensor and a neuron tensor may take each other's place (`param.data = t`): so
// `model.to("neuron")` keeps each Parameter object, and weights tied across modules stay tied
// (PyTorch's default lists only its own backends; without this, an LM head tied to its
// embedding becomes a second parameter).
bool shallow_copy_compatible(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](const at::Tensor& t) {
    return t.layout() == c10::kStrided && !t.is_quantized() && (t.is_cpu() || is_neuron(t));
  };
  return dense(self) && dense(from);
}

// Tensor.record_stream(s): checks the stream, and needs nothing more (see the guard's
// recordDataPtrOnStream: a kernel's closure keeps the memory it uses alive).
void record_stream(at::Tensor& self, c10::Stream s) {
  TORCH_CHECK(s.device_type() == kNeuron, "neuron: record_stream of a neuron tensor on a ", s.device_type(), " stream");
  queue(s.device_index(), s.id());
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(shallow_copy_compatible));
  m.impl("record_stream", TORCH_FN(record_stream));
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  m.impl("_copy_from", TORCH_FN(copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  m.impl("resize_", TORCH_FN(resize_));
  m.impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("unfold", TORCH_FN(at::native::unfold));
}

}  // namespace neuron_dev
namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &neuron_dev::fused_sdp_choice)
}  // namespace at::native
namespace neuron_dev {

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&neuron_kernel>()); }

// ------------------------------------------------------------------ autocast
// torch.autocast(device_type="neuron"): PyTorch's own op lists (the ones CUDA, XPU and MPS use:
// matmuls and convolutions in the lower precision, losses, norms and exp/log in fp32, mixed
// inputs promoted), registered for the PrivateUse1 autocast key as a backend registers them; every
// other op falls through. The casts are ops of their own (aten::_to_copy), queued like any other.
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

using at::Scalar;  // the op lists' signatures name these unqualified
using at::IntArrayRef;
using at::ScalarType;
using at::Tensor;

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define NEURON_AUTOCAST_LOWER(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define NEURON_AUTOCAST_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define NEURON_AUTOCAST_FP32_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define NEURON_AUTOCAST_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_LOWER_PRECISION_FP(NEURON_AUTOCAST_LOWER)
  AT_FORALL_FP32(NEURON_AUTOCAST_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(NEURON_AUTOCAST_FP32_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(NEURON_AUTOCAST_PROMOTE)
#undef NEURON_AUTOCAST_LOWER
#undef NEURON_AUTOCAST_FP32
#undef NEURON_AUTOCAST_FP32_OPT_DTYPE
#undef NEURON_AUTOCAST_PROMOTE
}

// ------------------------------------------------------------------ collectives
// The process-group backend of neuron tensors (registered as "neuron" by neuron.py, for the cpu and
// neuron devices). Gloo moves the data; the device queues it, as a collective library on a real
// device does: a collective on neuron tensors is one kernel (named by its c10d op,
// "c10d::allreduce_") on the device's communication stream, after a wait for an event recorded on
// the issuing thread's current stream (its inputs are ready), and the Work it returns makes the
// current stream wait for it (ProcessGroupNCCL's semantics: wait() and the Work's future block
// streams, not the host). So the host never waits for a collective unless it needs a value, work
// after wait() on the stream runs after the collective, and compute on the other streams runs
// while it does. CPU tensors go to gloo as they are. One communication stream per device: the
// device runs its collectives in issue order, whichever group issued them.

// Makes stream `id` the calling thread's current stream of device d for a scope.
struct OnStream {
  DeviceIndex device;
  int saved;
  OnStream(DeviceIndex d, int id) : device(d), saved(tl_stream[d]) { tl_stream[d] = id; }
  ~OnStream() { tl_stream[device] = saved; }
};

// A collective queued on the communication stream: done once the stream ran past it.
struct CollectiveWork final : c10d::Work {
  DeviceIndex device;
  void* done = nullptr;  // an event recorded on the communication stream after the collective
  c10::intrusive_ptr<c10::ivalue::Future> future;
  std::vector<at::Tensor> outputs;  // what it writes (its future's value)

  CollectiveWork(int rank, c10d::OpType type, DeviceIndex d) : Work(rank, type), device(d) {}
  ~CollectiveWork() override { destroy_event(done); }
  bool isCompleted() override { return event_done(done); }
  bool isSuccess() const override { return true; }
  // The calling thread's current stream waits for the collective; the host does not.
  bool wait(std::chrono::milliseconds) override {
    wait_event(done, stream_of(device, tl_stream[device]));
    return true;
  }
  void synchronize() override { wait(kNoTimeout); }
  void blockCurrentStream() override { wait(kNoTimeout); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future; }
  std::vector<at::Tensor> result() override { return outputs; }
};

class NeuronBackend final : public c10d::Backend {
 public:
  NeuronBackend(c10::intrusive_ptr<c10d::Backend> gloo, int rank, int size)
      : Backend(rank, size), gloo_(std::move(gloo)) {}
  const std::string getBackendName() const override { return "neuron"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& t, const c10d::BroadcastOptions& o) override {
    return run("c10d::broadcast_", c10d::OpType::BROADCAST, t, t, {},
               [this, o](std::vector<at::Tensor>& h, std::vector<at::Tensor>&) { return gloo_->broadcast(h, o); });
  }
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& t, const c10d::AllreduceOptions& o) override {
    return run("c10d::allreduce_", c10d::OpType::ALLREDUCE, t, t, {},
               [this, o](std::vector<at::Tensor>& h, std::vector<at::Tensor>&) { return gloo_->allreduce(h, o); });
  }
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& t,
                                                     const c10d::AllreduceCoalescedOptions& o) override {
    return run("c10d::allreduce_coalesced_", c10d::OpType::ALLREDUCE_COALESCED, t, t, {},
               [this, o](std::vector<at::Tensor>& h, std::vector<at::Tensor>&) { return gloo_->allreduce_coalesced(h, o); });
  }
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& t, const c10d::ReduceOptions& o) override {
    return run("c10d::reduce_", c10d::OpType::REDUCE, t, t, {},
               [this, o](std::vector<at::Tensor>& h, std::vector<at::Tensor>&) { return gloo_->reduce(h, o); });
  }
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& out, std::vector<at::Tensor>& in,
                                           const c10d::AllgatherOptions& o) override {
    TORCH_CHECK(out.size() == 1, "neuron: allgather takes one output list");
    return run("c10d::allgather_", c10d::OpType::ALLGATHER, in, out[0], out[0],
               [this, o](std::vector<at::Tensor>& h, std::vector<at::Tensor>& ho) {
                 std::vector<std::vector<at::Tensor>> outs{ho};
                 return gloo_->allgather(outs, h, o);
               });
  }
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& out, at::Tensor& in, const c10d::AllgatherOptions& o) override {
    std::vector<at::Tensor> ins{in}, outs{out};
    return run("c10d::_allgather_base_", c10d::OpType::_ALLGATHER_BASE, ins, outs, outs,
               [this, o](std::vector<at::Tensor>& h, std::vector<at::Tensor>& ho) {
                 return gloo_->_allgather_base(ho[0], h[0], o);
               });
  }
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& out, std::vector<at::Tensor>& in,
                                                                 const c10d::AllgatherOptions& o) override {
    return run("c10d::allgather_into_tensor_coalesced_", c10d::OpType::COALESCED, in, out, out,
               [this, o](std::vector<at::Tensor>& h, std::vector<at::Tensor>& ho) {
                 return gloo_->allgather_into_tensor_coalesced(ho, h, o);
               });
  }
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& out, std::vector<at::Tensor>& in,
                                        const c10d::GatherOptions& o) override {
    TORCH_CHECK(out.size() <= 1, "neuron: gather takes one output list");
    std::vector<at::Tensor> outs = out.empty() ? std::vector<at::Tensor>{} : out[0];  // empty off the root
    return run("c10d::gather_", c10d::OpType::GATHER, in, outs, outs,
               [this, o, root = !out.empty()](std::vector<at::Tensor>& h, std::vector<at::Tensor>& ho) {
                 std::vector<std::vector<at::Tensor>> outs;
                 if (root) outs.push_back(ho);
                 return gloo_->gather(outs, h, o);
               });
  }
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& out, std::vector<std::vector<at::Tensor>>& in,
                                         const c10d::ScatterOptions& o) override {
    TORCH_CHECK(in.size() <= 1, "neuron: scatter takes one input list");
    std::vector<at::Tensor> ins = in.empty() ? std::vector<at::Tensor>{} : in[0];  // empty off the root
    return run("c10d::scatter_", c10d::OpType::SCATTER, ins, out, out,
               [this, o, root = !in.empty()](std::vector<at::Tensor>& h, std::vector<at::Tensor>& ho) {
                 std::vector<std::vector<at::Tensor>> ins;
                 if (root) ins.push_back(h);
                 return gloo_->scatter(ho, ins, o);
               });
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& out, std::vector<std::vector<at::Tensor>>& in,
                                                const c10d::ReduceScatterOptions& o) override {
    TORCH_CHECK(in.size() == 1, "neuron: reduce_scatter takes one input list");
    return run("c10d::reduce_scatter_", c10d::OpType::REDUCE_SCATTER, in[0], out, out,
               [this, o](std::vector<at::Tensor>& h, std::vector<at::Tensor>& ho) {
                 std::vector<std::vector<at::Tensor>> ins{h};
                 return gloo_->reduce_scatter(ho, ins, o);
               });
  }
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& out, at::Tensor& in,
                                                      const c10d::ReduceScatterOptions& o) override {
    std::vector<at::Tensor> ins{in}, outs{out};
    return run("c10d::_reduce_scatter_base_", c10d::OpType::_REDUCE_SCATTER_BASE, ins, outs, outs,
               [this, o](std::vector<at::Tensor>& h, std::vector<at::Tensor>& ho) {
                 return gloo_->_reduce_scatter_base(ho[0], h[0], o);
               });
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& out, std::vector<at::Tensor>& in,
                                                                 const c10d::ReduceScatterOptions& o) override {
    return run("c10d::reduce_scatter_tensor_coalesced_", c10d::OpType::COALESCED, in, out, out,
               [this, o](std::vector<at::Tensor>& h, std::vector<at::Tensor>& ho) {
                 return gloo_->reduce_scatter_tensor_coalesced(ho, h, o);
               });
  }
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& out_splits,
                                               std::vector<int64_t>& in_splits, const c10d::AllToAllOptions& o) override {
    std::vector<at::Tensor> ins{in}, outs{out};
    return run("c10d::alltoall_base_", c10d::OpType::ALLTOALL_BASE, ins, outs, outs,
               [this, o, out_splits, in_splits](std::vector<at::Tensor>& h, std::vector<at::Tensor>& ho) mutable {
                 return gloo_->alltoall_base(ho[0], h[0], out_splits, in_splits, o);
               });
  }
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& t, int dst, int tag) override {
    return run("c10d::send", c10d::OpType::SEND, t, t, {},
               [this, dst, tag](std::vector<at::Tensor>& h, std::vector<at::Tensor>&) { return gloo_->send(h, dst, tag); });
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& t, int src, int tag) override {
    return run("c10d::recv_", c10d::OpType::RECV, t, t, {},
               [this, src, tag](std::vector<at::Tensor>& h, std::vector<at::Tensor>&) { return gloo_->recv(h, src, tag); });
  }
  // A barrier holds no tensors: gloo's (the host waits in wait(), as with gloo).
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& o) override { return gloo_->barrier(o); }

 private:
  using Call = std::function<c10::intrusive_ptr<c10d::Work>(std::vector<at::Tensor>&, std::vector<at::Tensor>&)>;

  // Runs `call` (gloo's collective, given host aliases of `in` and `out`) on the tensors' device's
  // communication stream, or on the tensors themselves when they are CPU tensors. `result`: the
  // Work's future's value (what DDP's comm hooks read).
  c10::intrusive_ptr<c10d::Work> run(const char* name, c10d::OpType type, std::vector<at::Tensor>& in,
                                     std::vector<at::Tensor>& out, std::vector<at::Tensor> result, Call call) {
    TORCH_CHECK(!in.empty() || !out.empty(), "neuron: ", name, " without tensors");
    const at::Tensor& first = in.empty() ? out.front() : in.front();
    if (!is_neuron(first)) return call(in, out);
    DeviceIndex d = first.device().index();
    for (const auto* list : {&in, &out})
      for (const at::Tensor& t : *list)
        TORCH_CHECK(is_neuron(t) && t.device().index() == d, "neuron: ", name,
                    " needs its tensors on one neuron device, got ", t.device());
    if (result.empty()) result = in;
    // What the profiler knows of the collective, as ProcessGroupNCCL reports it: a
    // record_param_comms range on the issuing thread (its name, sequence number, group, sizes).
    int64_t in_n = 0, out_n = 0;
    for (const at::Tensor& t : in) in_n += t.numel();
    for (const at::Tensor& t : out) out_n += t.numel();
    std::string coll(name + std::strlen("c10d::"));
    if (!coll.empty() && coll.back() == '_') coll.pop_back();
    RECORD_PARAM_COMMS_DATA(std::make_tuple(++seq_, false), std::make_tuple(pg_uid_, pg_desc_), in, out, rank_,
                            std::move(coll), in_n, out_n, first.scalar_type(), std::vector<int64_t>(),
                            std::vector<int64_t>(), 0, 0, size_);  // stride 0: the group's ranks not given
    // The inputs are ready once the issuing stream reached this point.
    void* ready = nullptr;
    record_event(&ready, stream_of(d, tl_stream[d]), d, c10::EventFlag::PYTORCH_DEFAULT);
    wait_event(ready, stream_of(d, kCommStream));
    destroy_event(ready);  // the queued markers hold the event's state
    std::vector<at::Tensor> host_in, host_out;
    for (const at::Tensor& t : in) host_in.push_back(host_alias(t));
    for (const at::Tensor& t : out) host_out.push_back(host_alias(t));
    Group open = tl_group;  // a collective is a kernel of its own, never part of a compiled group's
    tl_group = Group{};
    enqueue_on(queue(d, kCommStream), d, name, Kind::Other,
               [keep_in = in, keep_out = out, host_in, host_out, call]() mutable {
                 call(host_in, host_out)->wait();
               });
    tl_group = open;
    auto work = c10::make_intrusive<CollectiveWork>(rank_, type, d);
    work->outputs = result;
    record_event(&work->done, stream_of(d, kCommStream), d, c10::EventFlag::PYTORCH_DEFAULT);
    // The future completes now, as ProcessGroupNCCL's does, with the communication stream current:
    // it records its own event there, after the collective, and whoever waits on it (DDP's
    // reducer, a comm hook's then()) waits for that event on its stream.
    work->future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                              std::vector<Device>{Device(kNeuron, d)});
    {
      OnStream comm(d, kCommStream);
      work->future->markCompleted(c10::IValue(c10::List<at::Tensor>(result)));
    }
    return work;
  }

  c10::intrusive_ptr<c10d::Backend> gloo_;
  int64_t seq_ = 0;  // collectives issued on neuron tensors, as ProcessGroupNCCL counts them
};

// The backend for one process group and device: `gloo` a ProcessGroupGloo over the group's store.
c10::intrusive_ptr<c10d::Backend> collective_backend(c10::intrusive_ptr<c10d::Backend> gloo, int rank, int size) {
  return c10::make_intrusive<NeuronBackend>(std::move(gloo), rank, size);
}

// ------------------------------------------------------------------ device guard and hooks
struct GuardImpl final : c10::impl::DeviceGuardImplInterface {
  DeviceType type() const override { return kNeuron; }
  Device exchangeDevice(Device d) const override {
    Device old = getDevice();
    setDevice(d);
    return old;
  }
  Device getDevice() const override { return Device(kNeuron, tl_device); }
  void setDevice(Device d) const override {
    if (d.has_index()) tl_device = d.index();
  }
  void uncheckedSetDevice(Device d) const noexcept override {
    if (d.has_index()) tl_device = d.index();
  }
  // Streams: the current one is per thread and device (tl_stream); new ones come from the pool.
  c10::Stream getStream(Device d) const override { return stream_of(index_of(d), tl_stream[index_of(d)]); }
  c10::Stream getDefaultStream(Device d) const override { return stream_of(index_of(d), 0); }
  c10::Stream getStreamFromGlobalPool(Device d, bool) const override { return pool_stream(index_of(d)); }
  c10::Stream getNewStream(Device d, int) const override { return pool_stream(index_of(d)); }
  c10::Stream exchangeStream(c10::Stream s) const override {
    Queue& q = queue(s.device_index(), s.id());  // checks it
    int old = tl_stream[q.device];
    tl_stream[q.device] = q.stream;
    return stream_of(q.device, old);
  }
  DeviceIndex deviceCount() const noexcept override { return DeviceIndex(g_settings.devices); }
  void synchronizeDevice(DeviceIndex d) const override {
    RECORD_USER_SCOPE("neuron::synchronize");
    flush(d, NEURON_PROF_FLUSH_SYNCHRONIZE);
  }
  void synchronizeStream(const c10::Stream& s) const override {
    RECORD_USER_SCOPE("neuron::stream_synchronize");
    flush_stream(queue(s.device_index(), s.id()), NEURON_PROF_FLUSH_STREAM_SYNCHRONIZE);
  }
  bool queryStream(const c10::Stream& s) const override {
    Queue& q = queue(s.device_index(), s.id());
    std::lock_guard<std::mutex> lock(q.mu);
    return q.pending.empty();
  }
  // Events (see record_event and wait_event).
  void record(void** event, const c10::Stream& s, DeviceIndex d, const c10::EventFlag flag) const override {
    RECORD_USER_SCOPE("neuron::record_event");
    record_event(event, s, d, flag);
  }
  void block(void* event, const c10::Stream& s) const override {
    RECORD_USER_SCOPE("neuron::wait_event");
    wait_event(event, s);
  }
  bool queryEvent(void* event) const override { return event_done(event); }
  void synchronizeEvent(void* event) const override {
    RECORD_USER_SCOPE("neuron::event_synchronize");
    synchronize_event(event);
  }
  double elapsedTime(void* from, void* to, DeviceIndex) const override { return elapsed_ms(from, to); }
  void destroyEvent(void* event, DeviceIndex) const noexcept override { destroy_event(event); }
  // Tensor.record_stream: nothing to do. A queued kernel's closure holds the tensors it uses, so
  // their memory is freed (on the host, at reap) only after every kernel using them ran, on
  // whichever stream: no block is reused while a stream may still read or write it.
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}

 private:
  static DeviceIndex index_of(Device d) {
    DeviceIndex i = d.has_index() ? d.index() : tl_device;
    check_device(i);
    return i;
  }
  static c10::Stream pool_stream(DeviceIndex d) { return stream_of(d, 1 + g_pool_next[d]++ % kPoolStreams); }
};
C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return g_settings.devices > 0; }
  // Random numbers come from the CPU generator (see initial_path), in program order.
  const at::Generator& getDefaultGenerator(DeviceIndex) const override { return at::detail::getDefaultCPUGenerator(); }
  at::Device getDeviceFromPtr(void*) const override { return Device(kNeuron, tl_device); }
  bool hasPrimaryContext(DeviceIndex d) const override { return d >= 0 && d < g_settings.devices; }
  DeviceIndex deviceCount() const override { return DeviceIndex(g_settings.devices); }
  DeviceIndex getCurrentDevice() const override { return tl_device; }
  // pin_memory(): the pinned allocator (see PinnedAllocator).
  bool isPinnedPtr(const void* p) const override { return is_pinned_ptr(p); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return &g_pinned_allocator; }
  void setCurrentDevice(DeviceIndex d) const override { tl_device = d; }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    auto dev = storage.device().index();
    flush(dev, NEURON_PROF_FLUSH_OTHER);
    OnDevice on(dev);
    at::native::resize_bytes_cpu(storage.unsafeGetStorageImpl(), newsize);
  }
};

// An op with a CPU kernel and a CompositeExplicitAutograd one (native_layer_norm: layer_norm_cpu
// and math_native_layer_norm) would run its composite decomposition on a backend without a kernel
// of its own, which is not bitwise the CPU's result: such ops get the device's kernel. Views keep
// their composite kernels (they only make metadata).
void claim_cpu_kernels() {
  static torch::Library* lib = nullptr;
  if (lib) return;
  lib = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  static const std::unordered_set<std::string> own = {
      "empty", "empty_strided", "_copy_from", "_copy_from_and_resize", "resize_", "_local_scalar_dense",
      "view", "as_strided", "_reshape_alias", "unfold", "_has_compatible_shallow_copy_type", "record_stream"};
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    auto op = c10::Dispatcher::singleton().findOp(name);
    if (!op || !op->hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
        !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
        op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1))
      continue;
    std::string base = name.name.substr(6);
    if (own.count(base)) continue;
    bool view = false;
    for (const auto& r : op->schema().returns()) view |= r.alias_info() != nullptr && !r.alias_info()->isWrite();
    if (view) continue;
    std::string full = name.overload_name.empty() ? base : base + "." + name.overload_name;
    lib->impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&neuron_kernel>());
  }
}

// As a backend ships (openreg, torch_npu): a kernel of its own registered for each op it runs, so
// that only the ops it lacks reach its boxed fallback, and PyTorch's dispatcher tells which those
// are. The kernel is the same boxed function. Ops served by a composite kernel that runs other ops
// keep it; a structured op's functional form (CompositeExplicitAutogradNonFunctional: it writes
// through its .out overload) gets a kernel as its .out does. Ops whose path is the fallback
// (kUnimplemented, g_cpu_ops, views, no Meta kernel) get none, and so do factory ops (a Device
// argument: new_empty_strided(..., device=neuron) made by the CPU kernel would be a device tensor;
// their composites allocate through the device's empty).
void register_kernels() {
  static torch::Library* lib = nullptr;
  if (lib) return;
  lib = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  using c10::DispatchKey;
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    auto op = c10::Dispatcher::singleton().findOp(name);
    if (!op || op->hasKernelForDispatchKey(DispatchKey::PrivateUse1) ||
        op->hasKernelForDispatchKey(DispatchKey::CompositeExplicitAutograd) ||
        op->hasKernelForDispatchKey(DispatchKey::CompositeImplicitAutograd))
      continue;
    bool factory = false;
    for (const auto& a : op->schema().arguments()) factory |= a.type()->str().find("Device") != std::string::npos;
    if (factory) continue;
    Path p = initial_path(*op);
    if (p == Path::Fallback || (p == Path::Queued && !op->hasKernelForDispatchKey(DispatchKey::Meta))) continue;
    std::string base = name.name.substr(6);
    std::string full = name.overload_name.empty() ? base : base + "." + name.overload_name;
    lib->impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&neuron_kernel>());
  }
}

void set_modes(bool allocator_reports, const std::vector<std::string>& cpu_ops) {
  TORCH_CHECK(g_settings.devices == 0, "neuron: the device's modes are set before it is enabled");
  g_settings.allocator_reports = allocator_reports;
  g_cpu_ops = std::unordered_set<std::string>(cpu_ops.begin(), cpu_ops.end());
}

// ------------------------------------------------------------------ Python side
void init(int devices, int64_t launch_ns, int64_t capacity, int max_queue, int max_fused) {
  TORCH_CHECK(devices >= 1 && devices <= kMaxDevices, "neuron: devices must be 1..", kMaxDevices);
  TORCH_CHECK(g_settings.devices == 0 || g_settings.devices == devices,
              "neuron: already enabled with ", g_settings.devices, " devices");
  g_settings.launch_ns = launch_ns;
  g_settings.capacity = capacity;
  g_settings.max_queue = std::max(1, max_queue);
  g_settings.max_fused = std::max(1, max_fused);
  if (g_settings.devices == 0) {
    for (int d = 0; d < devices; ++d) {
      for (int s = 0; s < kStreams; ++s) {
        auto* q = new Queue();  // lives as long as the process, like a device
        q->device = DeviceIndex(d);
        q->stream = s;
        q->worker = std::thread([q] { q->run_worker(); });
        q->worker.detach();
        g_queues[d][s] = q;
      }
    }
    static Hooks hooks;
    at::RegisterPrivateUse1HooksInterface(&hooks);
    claim_cpu_kernels();
    g_settings.devices = devices;
  }
}

void connect(py::capsule capsule) {
  auto* api = static_cast<const neuron_prof_backend_api*>(
      PyCapsule_GetPointer(capsule.ptr(), NEURON_PROF_BACKEND_API_CAPSULE));
  if (api == nullptr) throw py::error_already_set();
  // Version 1's fields are all it needs; version 2's queue_synchronized is used when present.
  constexpr size_t v1_size = offsetof(neuron_prof_backend_api, cpu_fallback) + sizeof(api->cpu_fallback);
  TORCH_CHECK(api->version >= 1 && api->size >= v1_size,
              "neuron: neuron_prof's backend API is too old (version ", api->version, ")");
  g_api_v2 = api->version >= 2 && api->size >= offsetof(neuron_prof_backend_api, queue_synchronized) +
                                                  sizeof(api->queue_synchronized);
  g_api = api;
}

int device_count() { return g_settings.devices; }
int64_t capacity_bytes() { return g_settings.capacity; }

py::dict memory_stats(int d) {
  check_device(DeviceIndex(d));
  py::dict out;
  out["allocated_bytes"] = g_allocated[d].load();
  out["peak_bytes"] = g_peak[d].load();
  out["capacity_bytes"] = g_settings.capacity;
  return out;
}

}  // namespace neuron_dev

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("init", &neuron_dev::init);
  m.def("connect", &neuron_dev::connect);
  m.def("set_modes", &neuron_dev::set_modes);
  m.def("register_kernels", &neuron_dev::register_kernels);
  m.def("set_kineto_kernels_only", [](bool on) { neuron_dev::trace::g_kernels_only = on; });
  m.def("synchronize", [](int d) {
    py::gil_scoped_release nogil;
    RECORD_USER_SCOPE("neuron::synchronize");
    neuron_dev::flush(c10::DeviceIndex(d), NEURON_PROF_FLUSH_SYNCHRONIZE);
  });
  m.def("current_device", []() { return int(neuron_dev::tl_device); });
  m.def("set_device", [](int d) {
    neuron_dev::check_device(c10::DeviceIndex(d));
    neuron_dev::tl_device = c10::DeviceIndex(d);
  });
  m.def("device_count", []() { return neuron_dev::g_settings.devices; });
  m.def("memory_stats", &neuron_dev::memory_stats);
  m.def("fusion_groups", &neuron_dev::fusion_groups);
  m.def("begin_kernel", &neuron_dev::begin_group);
  m.def("end_kernel", &neuron_dev::end_group);
  m.def("elapsed_time", &neuron_dev::elapsed_time_of);
  m.def("collective_backend", &neuron_dev::collective_backend);
  m.def("set_launch_ns", [](int64_t ns) { neuron_dev::g_settings.launch_ns = ns; });
  m.def("set_trace_fault", [](bool on) { neuron_dev::g_trace_fault = on; });
  m.def("traced_kernels", [](bool reset) {
    std::lock_guard<std::mutex> lock(neuron_dev::g_traced_mu);
    py::dict out;
    for (const auto& [key, v] : neuron_dev::g_traced) out[py::make_tuple(key.first, key.second)] = py::make_tuple(v.first, v.second);
    if (reset) neuron_dev::g_traced.clear();
    return out;
  });
}

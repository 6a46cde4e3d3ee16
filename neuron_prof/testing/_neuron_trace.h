// The emulated device's activity trace: what it reports to PyTorch's profiler (Kineto) as a real
// PrivateUse1 backend does, through a libkineto::IActivityProfiler registered with
// REGISTER_PRIVATEUSE1_PROFILER (_neuron_kineto.cpp). So plain torch.profiler with
// ProfilerActivity.PrivateUse1 shows the device's kernels, copies and runtime calls, and
// neuron_prof reads the same stream.
//
// The device (_neuron.cpp) records activities here while a trace records (on()), on the run clock
// (CLOCK_MONOTONIC ns); the profiler session hands them to Kineto on its clock (the Unix epoch's).
// Kineto's own activity types carry them:
//   PRIVATEUSE1_RUNTIME  a host thread's call into the device: an op queued (neuronLaunchKernel), a
//                        host wait (neuronDeviceSynchronize, neuronStreamSynchronize,
//                        neuronEventSynchronize), a copy to the host (neuronMemcpy), an event record
//                        or wait put on a stream (neuronEventRecord, neuronStreamWaitEvent), an op
//                        run on the CPU instead (neuronCpuFallback);
//   CONCURRENT_KERNEL    a kernel on a stream, linked to the launch of its first queued op by their
//                        correlation id (an ac2g flow);
//   GPU_MEMCPY           a copy, with its bytes;
//   GPU_USER_ANNOTATION  the device reaching an event's record on a stream ("Event Record");
//   CUDA_SYNC            a stream standing idle at a wait for an event ("Stream Wait Event").
// What those types cannot say travels as activity metadata (documented in docs/device.md): the
// ops a fused kernel ran ("queued ops": their launches' correlation ids), an op's name and the
// queue depth at its launch, why the host waited ("wait reason") and for how many ops, the op a
// fallback ran and its bytes each way, and that a stream wait is the stream's idle time.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace neuron_dev::trace {

enum class Kind : uint8_t { Runtime, Kernel, Memcpy, EventRecord, StreamWait };

struct Arg {
  std::string key, value;
  bool quoted;  // a JSON string (else a number or a list, as written)
};

struct Record {
  Kind kind = Kind::Runtime;
  std::string name;
  int64_t start = 0, end = 0;  // CLOCK_MONOTONIC ns
  int32_t device = 0;          // the device index (a host call: its device, for the metadata)
  int64_t stream = 0;          // a device activity's stream
  int64_t tid = 0;             // a host call's OS thread
  int32_t correlation = 0;     // 0: none
  uint64_t external = 0;       // the profiler's correlation id of the host op open at the launch (0: none)
  bool flow_start = false;     // a launch: the ac2g flow to its device work starts here
  std::vector<Arg> args;
};

// A record of work on the device: `kind` on stream `stream` of device `device`, its launch's
// `correlation` (0: none).
inline Record on_device(Kind kind, std::string name, int64_t start, int64_t end, int32_t device, int64_t stream,
                        int32_t correlation = 0) {
  Record r;
  r.kind = kind;
  r.name = std::move(name);
  r.start = start;
  r.end = end;
  r.device = device;
  r.stream = stream;
  r.correlation = correlation;
  return r;
}

// A backend that reports its kernels only (no runtime calls, copies or events, no correlation ids,
// no metadata), as many ship: add() keeps kernels and strips the rest (neuron.enable(kineto=...)).
extern std::atomic<bool> g_kernels_only;

// Whether a trace records now: the device checks it before it builds a record of a host call.
extern std::atomic<bool> g_on;
inline bool on() { return g_on.load(std::memory_order_relaxed); }

// Correlation ids of launches and host calls, from 1, wrapping below 2^31 (Kineto's are int32).
int32_t next_correlation();
// The profiler's correlation id of the host op open on the calling thread (CPU profiling pushes
// one per op; 0 when it does not run): what links a launch to its op in torch.profiler's trace.
uint64_t current_external();
// The calling thread's OS id.
int64_t thread_id();
// Keeps a record for the trace (any thread). Device-side records of work whose launch was traced
// are kept whether or not a trace records still: a kernel in flight at a trace's stop is reported
// to a trace that starts right after (neuron_prof's drains) and dropped otherwise.
void add(Record&& r);

inline Arg number(std::string key, int64_t v) { return Arg{std::move(key), std::to_string(v), false}; }
inline Arg text(std::string key, std::string v) { return Arg{std::move(key), std::move(v), true}; }
inline Arg raw(std::string key, std::string json) { return Arg{std::move(key), std::move(json), false}; }

}  // namespace neuron_dev::trace

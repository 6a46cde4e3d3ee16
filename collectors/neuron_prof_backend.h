/* neuron_prof's backend hook API, version 2: how a device backend (TorchNeuron, another
 * PrivateUse1 backend, neuron_prof's emulated `neuron` device) reports what only it knows --
 * its queues (one per stream), its kernels, its events and its CPU fallbacks -- to a running
 * capture.
 *
 * A backend does not link against neuron_prof. It asks Python once, at start-up, for the API:
 *
 *     api = neuron_prof.collectors.device.backend_api()   # a PyCapsule named
 *                                                           # "neuron_prof.backend_api"
 *
 * and keeps the pointer (PyCapsule_GetPointer(capsule, NEURON_PROF_BACKEND_API_CAPSULE)); the
 * struct lives as long as the process. Before each report it tests one flag:
 *
 *     if (api && *api->capturing) api->op_enqueued(device, stream, "aten::add", depth);
 *
 * so that with no capture running a report costs one predictable branch. Every function may be
 * called from any thread, never blocks for long, and never throws. Times are nanoseconds of
 * CLOCK_MONOTONIC (the run's clock); `now_ns` reads it.
 *
 * The version rule: a newer neuron_prof keeps the fields below where they are and only appends
 * (functions, flush reasons). A backend checks `version` (>= the version it was written for) and
 * `size` (>= the struct it was compiled with) once at start-up. So a backend written for version 1
 * keeps working with any later neuron_prof, unchanged (its host waits are recorded with no stream,
 * it reports no events); a version-2 backend that finds a version-1 neuron_prof uses only the
 * version-1 functions (queue_flushed for its host waits) and skips its event reports.
 */
#ifndef NEURON_PROF_BACKEND_H
#define NEURON_PROF_BACKEND_H

#include <stdint.h>

#define NEURON_PROF_BACKEND_API_VERSION 2
#define NEURON_PROF_BACKEND_API_CAPSULE "neuron_prof.backend_api"

/* Why the host waited for a queue to drain. */
enum neuron_prof_flush_reason {
  NEURON_PROF_FLUSH_SYNC = 0,        /* the host needs a value: .item(), .cpu(), printing, nonzero */
  NEURON_PROF_FLUSH_SIZE = 1,        /* the queue reached its size limit */
  NEURON_PROF_FLUSH_FALLBACK = 2,    /* an op falls back to the CPU and needs its inputs */
  NEURON_PROF_FLUSH_SYNCHRONIZE = 3, /* torch.<device>.synchronize() */
  NEURON_PROF_FLUSH_OTHER = 4,
  /* version 2 */
  NEURON_PROF_FLUSH_STREAM_SYNCHRONIZE = 5, /* the host waited for one stream (Stream.synchronize()) */
  NEURON_PROF_FLUSH_EVENT_SYNCHRONIZE = 6   /* the host waited for an event (Event.synchronize()) */
};

typedef struct neuron_prof_backend_api {
  uint32_t version; /* NEURON_PROF_BACKEND_API_VERSION of the neuron_prof that made it */
  uint32_t size;    /* sizeof(neuron_prof_backend_api) there */
  /* Nonzero while neuron_prof wants reports: while a capture window records device events, and
   * all through an always-on capture (its dumps show each queue's latest depth and flush, so
   * reports keep that state between windows too). Test it before every report. */
  const volatile int32_t* capturing;
  int64_t (*now_ns)(void);
  /* An op was put on a device queue by the calling (host) thread. neuron_prof records the host op
   * open on this thread (the op the observer records: its name, module path and source line), the
   * time and the queue depth after it. Returns the enqueue's id (never 0 while a window records),
   * which kernel_executed names to say which enqueued ops a kernel ran; 0 when no window records. */
  uint64_t (*op_enqueued)(int32_t device, int32_t stream, const char* op, int32_t queue_depth);
  /* The calling (host) thread waited from start_ns to end_ns for `ops` queued ops to run. */
  void (*queue_flushed)(int32_t device, int32_t reason, int32_t ops, int64_t start_ns, int64_t end_ns);
  /* A kernel ran on the device (any thread may report it): the enqueued ops it ran, fused. A
   * custom kernel (an NKI kernel, a torch.library op the user registered for the device) is named
   * by its op's qualified name, "lib::op": the analyses count it as one (outside the aten, prims
   * and c10d namespaces), forward and backward apart, in custom-kernel coverage. A collective the
   * backend runs as a kernel is named by the c10d op that issued it ("c10d::allreduce_"), its op
   * enqueued (op_enqueued) inside that op's call on the issuing thread: the analyses trace it to
   * the collective (op, group, sequence number, bytes, line) and read communication on the device. */
  void (*kernel_executed)(int32_t device, int32_t stream, const char* name, int64_t start_ns,
                          int64_t end_ns, const uint64_t* enqueue_ids, int32_t n_ops);
  /* An op ran on the CPU instead (start_ns..end_ns on the calling thread, copies included):
   * bytes copied from the device to the host for its inputs, and back for its outputs. */
  void (*cpu_fallback)(int32_t device, const char* op, int64_t bytes_to_host, int64_t bytes_from_host,
                       int64_t start_ns, int64_t end_ns);

  /* ---- version 2: streams and events (test `version >= 2` before use) */
  /* The calling (host) thread put a record of `event` on `stream`'s queue (Event.record()), or a
   * wait for it (Stream.wait_event()): neuron_prof records the host op, module and source line open
   * on the thread, as for op_enqueued. */
  void (*event_recorded)(int32_t device, int32_t stream, uint64_t event);
  void (*event_waited)(int32_t device, int32_t stream, uint64_t event);
  /* The device reached the record of `event` on `stream` at ts_ns (what Event.elapsed_time reads;
   * any thread may report it). */
  void (*event_completed)(int32_t device, int32_t stream, uint64_t event, int64_t ts_ns);
  /* `stream` stood idle on the device from start_ns to end_ns at a wait for `event` (recorded on
   * another stream) that was not complete when the stream reached it. Not reported when the event
   * was complete already: the stream did not wait. */
  void (*stream_waited)(int32_t device, int32_t stream, uint64_t event, int64_t start_ns, int64_t end_ns);
  /* The calling (host) thread waited from start_ns to end_ns for `ops` queued ops: the flush of
   * version 2 (queue_flushed with the stream and event), for every host wait of a version-2
   * backend: stream -1 (every stream of the device: .item(), a fallback, synchronize()) or the
   * stream waited for; event: the event waited for (reason EVENT_SYNCHRONIZE), else 0. Report it
   * instead of queue_flushed, not beside it. */
  void (*queue_synchronized)(int32_t device, int32_t stream, uint64_t event, int32_t reason, int32_t ops,
                             int64_t start_ns, int64_t end_ns);
} neuron_prof_backend_api;

#endif /* NEURON_PROF_BACKEND_H */

/* neuron_prof's backend hook API, version 3: what a device backend reports of its queues that
 * PyTorch's profiler cannot carry -- each queue's depth and its latest host wait as they are now,
 * for always-on capture's dumps (a hang, an exception, SIGUSR1), which happen between capture
 * windows, when no Kineto session runs. Optional: a backend without it loses only that.
 *
 * Everything a device did in a capture window -- kernels and the ops they fused, launches, host
 * waits and why, copies, CPU fallbacks, events and stream waits -- neuron_prof reads from the
 * backend's Kineto activity profiler (libkineto::IActivityProfiler registered with
 * REGISTER_PRIVATEUSE1_PROFILER; CUPTI on CUDA), the path torch.profiler reads too
 * (docs/device.md says which activity metadata adds what Kineto's types cannot say). Version 1 and
 * 2's functions that reported those (kernel_executed, cpu_fallback, event_recorded, event_waited,
 * event_completed, stream_waited) stay in the struct, where they were, and do nothing.
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
 * so that with no always-on capture running a report costs one predictable branch. Every function
 * may be called from any thread, never blocks, and never throws. Times are nanoseconds of
 * CLOCK_MONOTONIC (the run's clock); `now_ns` reads it.
 *
 * The version rule: a newer neuron_prof keeps the fields below where they are and only appends
 * (functions, flush reasons). A backend checks `version` (>= the version it was written for) and
 * `size` (>= the struct it was compiled with) once at start-up, so a backend written for an
 * earlier version keeps working, unchanged.
 */
#ifndef NEURON_PROF_BACKEND_H
#define NEURON_PROF_BACKEND_H

#include <stdint.h>

#define NEURON_PROF_BACKEND_API_VERSION 3
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
  /* Nonzero while neuron_prof wants reports: all through an always-on capture (its dumps show
   * each queue's latest depth and flush). Test it before every report. */
  const volatile int32_t* capturing;
  int64_t (*now_ns)(void);
  /* An op was put on a device queue by the calling (host) thread: the queue's depth after it. Returns
   * 0 (version 1 and 2 returned an id for kernel_executed; version 3's kernels are Kineto's). */
  uint64_t (*op_enqueued)(int32_t device, int32_t stream, const char* op, int32_t queue_depth);
  /* The calling (host) thread waited from start_ns to end_ns for `ops` queued ops to run: the
   * queue's latest flush. */
  void (*queue_flushed)(int32_t device, int32_t reason, int32_t ops, int64_t start_ns, int64_t end_ns);
  /* Retired in version 3 (a kernel is a Kineto CONCURRENT_KERNEL activity): does nothing. */
  void (*kernel_executed)(int32_t device, int32_t stream, const char* name, int64_t start_ns,
                          int64_t end_ns, const uint64_t* enqueue_ids, int32_t n_ops);
  /* Retired in version 3 (a runtime activity with metadata "cpu fallback"): does nothing. */
  void (*cpu_fallback)(int32_t device, const char* op, int64_t bytes_to_host, int64_t bytes_from_host,
                       int64_t start_ns, int64_t end_ns);

  /* ---- version 2 (test `version >= 2` before use) */
  /* Retired in version 3 (event records, waits and completions, and stream waits, are Kineto
   * activities): do nothing. */
  void (*event_recorded)(int32_t device, int32_t stream, uint64_t event);
  void (*event_waited)(int32_t device, int32_t stream, uint64_t event);
  void (*event_completed)(int32_t device, int32_t stream, uint64_t event, int64_t ts_ns);
  void (*stream_waited)(int32_t device, int32_t stream, uint64_t event, int64_t start_ns, int64_t end_ns);
  /* queue_flushed with the stream waited for (-1: every stream of the device) and the event (0:
   * none): the queue's latest flush. Report it instead of queue_flushed, not beside it. */
  void (*queue_synchronized)(int32_t device, int32_t stream, uint64_t event, int32_t reason, int32_t ops,
                             int64_t start_ns, int64_t end_ns);
} neuron_prof_backend_api;

#endif /* NEURON_PROF_BACKEND_H */

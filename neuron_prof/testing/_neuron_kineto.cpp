// The emulated device's Kineto activity profiler (see _neuron_trace.h): registered with
// REGISTER_PRIVATEUSE1_PROFILER, as a PrivateUse1 backend registers its own, so that any
// torch.profiler with ProfilerActivity.PrivateUse1 (and neuron_prof's capture, which runs the same
// Kineto sessions) gets the device's activities. A session switches recording on at start() and
// off at stop(); processTrace() hands Kineto every record kept since, on Kineto's clock, each as a
// libkineto::GenericTraceActivity it owns (its trace buffer) and logs.
#include <IActivityProfiler.h>
#include <libkineto.h>
#include <output_base.h>
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>
#include <c10/core/DeviceType.h>

#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "_neuron_trace.h"

namespace neuron_dev {
int device_count();          // _neuron.cpp: devices enabled
int64_t capacity_bytes();    // _neuron.cpp: each device's memory
}  // namespace neuron_dev

namespace neuron_dev::trace {

std::atomic<bool> g_on{false};

namespace {

using libkineto::ActivityType;

std::atomic<int32_t> g_correlation{0};
std::mutex g_mu;               // the records and the session state below
std::vector<Record> g_records;
int64_t g_last_stop = 0;       // CLOCK_MONOTONIC ns of the last trace's stop (0: none yet)
// A trace that starts within this of the last one's stop gets that trace's late device records
// (work launched in it, run after its stop): neuron_prof's drains restart a trace at once, but
// preparing one takes tens of milliseconds, and far more on a loaded machine.
constexpr int64_t kLateGraceNs = 1'000'000'000;

thread_local std::vector<uint64_t> t_external;  // the profiler's correlation ids of the open host ops
thread_local int64_t t_tid = 0;

int64_t clock_ns(clockid_t c) {
  timespec t;
  clock_gettime(c, &t);
  return int64_t(t.tv_sec) * 1000000000 + t.tv_nsec;
}

// CLOCK_REALTIME - CLOCK_MONOTONIC, read between two monotonic reads the closest together of a few
// tries: Kineto's clock is the Unix epoch's, the device's the run clock. Both move at the same
// rate (NTP slews both), so one offset holds for the process.
int64_t epoch_offset() {
  static const int64_t offset = [] {
    int64_t best = std::numeric_limits<int64_t>::max(), out = 0;
    for (int i = 0; i < 200; ++i) {
      int64_t a = clock_ns(CLOCK_MONOTONIC), r = clock_ns(CLOCK_REALTIME), b = clock_ns(CLOCK_MONOTONIC);
      if (b - a < best) {
        best = b - a;
        out = r - (a + (b - a) / 2);
      }
    }
    return out;
  }();
  return offset;
}

ActivityType type_of(Kind k) {
  switch (k) {
    case Kind::Runtime: return ActivityType::PRIVATEUSE1_RUNTIME;
    case Kind::Kernel: return ActivityType::CONCURRENT_KERNEL;
    case Kind::Memcpy: return ActivityType::GPU_MEMCPY;
    case Kind::EventRecord: return ActivityType::GPU_USER_ANNOTATION;
    case Kind::StreamWait: return ActivityType::CUDA_SYNC;
  }
  return ActivityType::PRIVATEUSE1_RUNTIME;
}

std::string backend_name() { return c10::get_privateuse1_backend(/*lower_case=*/true); }

class Session final : public libkineto::IActivityProfilerSession {
 public:
  explicit Session(std::set<ActivityType> types) : types_(std::move(types)) {}

  void start() override {
    std::lock_guard<std::mutex> lock(g_mu);
    int64_t now = clock_ns(CLOCK_MONOTONIC);
    if (g_last_stop == 0 || now - g_last_stop > kLateGraceNs) g_records.clear();  // another trace's
    start_ = now;
    g_on = true;
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    std::lock_guard<std::mutex> lock(g_mu);
    g_on = false;
    stop_ = g_last_stop = clock_ns(CLOCK_MONOTONIC);
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  std::vector<std::string> errors() override { return {}; }

  void processTrace(libkineto::ActivityLogger& logger) override {
    std::vector<Record> records;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      records.swap(g_records);
    }
    const int64_t offset = epoch_offset();
    buf_->span = libkineto::TraceSpan(start_ + offset, stop_ + offset, backend_name());
    for (Record& r : records) {
      ActivityType type = type_of(r.kind);
      if (!types_.count(type)) continue;
      buf_->emplace_activity(buf_->span, type, r.name);
      libkineto::GenericTraceActivity& a = *buf_->activities.back();
      a.startTime = r.start + offset;
      a.endTime = r.end + offset;
      a.id = r.correlation;
      if (r.kind == Kind::Runtime) {
        a.device = int32_t(getpid());
        a.resource = int32_t(r.tid);
        a.threadId = int32_t(r.tid);
      } else {
        a.device = r.device;
        a.resource = int32_t(r.stream);
        a.threadId = int32_t(r.stream);
        streams_.insert({r.device, r.stream});
      }
      if (r.correlation != 0 && (r.kind == Kind::Runtime ? r.flow_start : r.kind != Kind::StreamWait &&
                                                                             r.kind != Kind::EventRecord)) {
        a.flow.id = uint32_t(r.correlation);
        a.flow.type = libkineto::kLinkAsyncCpuGpu;
        a.flow.start = r.kind == Kind::Runtime;
      }
      if (r.external != 0 && linked_) a.linked = linked_(int32_t(r.external));
      if (r.kind != Kind::Runtime) {
        a.addMetadata("device", r.device);
        a.addMetadata("stream", r.stream);
      } else {
        a.addMetadata("device", r.device);
      }
      if (r.correlation != 0) a.addMetadata("correlation", r.correlation);
      for (const Arg& arg : r.args) {
        if (arg.quoted)
          a.addMetadataQuoted(arg.key, arg.value);
        else
          a.addMetadata(arg.key, arg.value);
      }
      logger.handleGenericActivity(a);
    }
  }

  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked, int64_t,
                    int64_t) override {
    linked_ = std::move(linked);
    processTrace(logger);
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    std::string name = backend_name();
    return std::make_unique<libkineto::DeviceInfo>(libkineto::DeviceInfo{0, 0, name, name + " 0"});
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::vector<libkineto::ResourceInfo> out;
    for (const auto& [device, stream] : streams_)
      out.push_back(libkineto::ResourceInfo{stream, stream, device, "stream " + std::to_string(stream)});
    return out;
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return std::move(buf_); }

  void pushCorrelationId(uint64_t id) override { t_external.push_back(id); }
  void popCorrelationId() override {
    if (!t_external.empty()) t_external.pop_back();
  }

  // What torch.profiler writes as the trace's deviceProperties: one object per device.
  std::string getDeviceProperties() override {
    std::string out, name = backend_name();
    for (int d = 0; d < device_count(); ++d) {
      if (d) out += ",";
      out += "{\"id\": " + std::to_string(d) + ", \"name\": \"" + name + " (emulated)\", \"totalGlobalMem\": " +
             std::to_string(capacity_bytes()) + "}";
    }
    return out;
  }

 private:
  std::set<ActivityType> types_;
  int64_t start_ = 0, stop_ = 0;
  libkineto::getLinkedActivityCallback linked_;
  std::unique_ptr<libkineto::CpuTraceBuffer> buf_ = std::make_unique<libkineto::CpuTraceBuffer>();
  std::set<std::pair<int32_t, int64_t>> streams_;
};

class Profiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<ActivityType>& availableActivities() const override { return types_; }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<ActivityType>& types,
                                                                 const libkineto::Config&) override {
    std::set<ActivityType> mine;
    for (ActivityType t : types)
      if (types_.count(t)) mine.insert(t);
    if (mine.empty()) return nullptr;
    // a trace of the device's kernels gets its stream waits too: PyTorch asks a PrivateUse1 backend
    // for no CUDA_SYNC activity, the type that carries them
    if (mine.count(ActivityType::CONCURRENT_KERNEL)) mine.insert(ActivityType::CUDA_SYNC);
    return std::make_unique<Session>(std::move(mine));
  }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t, int64_t, const std::set<ActivityType>& types,
                                                                 const libkineto::Config& config) override {
    return configure(types, config);
  }

 private:
  std::string name_{"neuron_prof emulated device"};
  std::set<ActivityType> types_{ActivityType::PRIVATEUSE1_RUNTIME, ActivityType::CONCURRENT_KERNEL,
                                ActivityType::GPU_MEMCPY, ActivityType::GPU_USER_ANNOTATION,
                                ActivityType::CUDA_SYNC};
};

REGISTER_PRIVATEUSE1_PROFILER(Profiler);

}  // namespace

int32_t next_correlation() {
  int32_t id = g_correlation.fetch_add(1, std::memory_order_relaxed) + 1;
  if (id <= 0) {  // wrapped: start again at 1
    g_correlation.store(1, std::memory_order_relaxed);
    id = 1;
  }
  return id;
}

uint64_t current_external() { return t_external.empty() ? 0 : t_external.back(); }

int64_t thread_id() {
  if (!t_tid) t_tid = int64_t(syscall(SYS_gettid));
  return t_tid;
}

std::atomic<bool> g_kernels_only{false};

void add(Record&& r) {
  if (g_kernels_only.load(std::memory_order_relaxed)) {
    if (r.kind != Kind::Kernel) return;
    r.correlation = 0;
    r.external = 0;
    r.flow_start = false;
    r.args.clear();
  }
  std::lock_guard<std::mutex> lock(g_mu);
  g_records.push_back(std::move(r));
}

}  // namespace neuron_dev::trace

// Observers that do nothing: the floors under every profiler of ATen ops, which
// benchmarks/overhead.py reads neuron_prof's and torch.profiler's overheads against.
//
// * `start(needs_inputs)`: one global RecordFunction callback pair on the FUNCTION,
//   BACKWARD_FUNCTION and USER_SCOPE scopes, registered as neuron_prof's op observer registers
//   (collectors/_observer.cpp, py_start); with needs_inputs RecordFunction boxes every op's inputs
//   for it, which is what recording shapes costs before any recording is done.
// * `start_hooks()`: every native hook full capture needs, each doing nothing: the same callback
//   asking for inputs and outputs (shapes; which op made a tensor), c10's memory reports (a
//   profiler state whose memoryProfilingEnabled() is true, so the CPU allocator keeps each block's
//   size and reports every allocation and free), and the calling thread's Python frames walked
//   (PyThreadState_GetFrame .. PyFrame_GetBack, the only way to the executing line without a
//   tracer) at every op that no other op encloses. benchmarks/overhead.py adds global nn.Module
//   hooks (module paths) in Python.
// Benchmark-only: the package never builds or imports it.
#include <torch/extension.h>

#include <ATen/record_function.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/csrc/profiler/orchestration/observer.h>

#include <Python.h>
#include <frameobject.h>

#include <memory>
#include <mutex>
#include <stdexcept>

namespace {

std::mutex g_mu;
at::CallbackHandle g_handle = 0;
bool g_walk = false;
bool g_memory = false;
thread_local int tls_depth = 0;

// Walks the calling thread's Python frames and lets them go: what knowing an op's line costs.
void walk_frames() {
  PyThreadState* ts = PyGILState_GetThisThreadState();
  if (!ts) return;
  PyGILState_STATE g = PyGILState_Ensure();
  PyFrameObject* f = PyThreadState_GetFrame(ts);  // new reference
  while (f) {
    PyCodeObject* code = PyFrame_GetCode(f);
    Py_DECREF(code);
    PyFrameObject* back = PyFrame_GetBack(f);
    Py_DECREF(f);
    f = back;
  }
  PyGILState_Release(g);
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& rf) {
  if (g_walk && tls_depth++ == 0 && rf.scope() == at::RecordScope::FUNCTION) walk_frames();
  return nullptr;
}

void on_end(const at::RecordFunction&, at::ObserverContext*) {
  if (g_walk && tls_depth > 0) --tls_depth;
}

// c10's memory reports, answered by nothing (as torch.profiler's profile_memory state is asked).
struct NullMemoryState final : public torch::profiler::impl::ProfilerStateBase {
  NullMemoryState()
      : ProfilerStateBase(torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::Disabled,
                                                                false, /*profile_memory=*/true)) {}
  bool memoryProfilingEnabled() const override { return true; }
  torch::profiler::impl::ActiveProfilerType profilerType() override {
    return torch::profiler::impl::ActiveProfilerType::NONE;
  }
  void reportMemoryUsage(void*, int64_t, size_t, size_t, c10::Device) override {}
};

void add_callback(bool needs_inputs, bool needs_outputs) {
  if (g_handle != 0) throw std::runtime_error("null observer already started");
  g_handle = at::addGlobalCallback(
      at::RecordFunctionCallback(on_start, on_end)
          .needsInputs(needs_inputs)
          .needsOutputs(needs_outputs)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                   at::RecordScope::USER_SCOPE}));
}

void start(bool needs_inputs) {
  std::lock_guard<std::mutex> g(g_mu);
  add_callback(needs_inputs, false);
}

void start_hooks() {
  std::lock_guard<std::mutex> g(g_mu);
  if (torch::profiler::impl::ProfilerStateBase::get(/*global=*/false) != nullptr)
    throw std::runtime_error("a profiler state is already on this thread");
  add_callback(true, true);
  g_walk = true;
  c10::ThreadLocalDebugInfo::_push(c10::DebugInfoKind::PROFILER_STATE, std::make_shared<NullMemoryState>());
  g_memory = true;
}

void stop() {
  std::lock_guard<std::mutex> g(g_mu);
  if (g_handle != 0) at::removeCallback(g_handle);
  g_handle = 0;
  g_walk = false;
  if (g_memory) c10::ThreadLocalDebugInfo::_pop(c10::DebugInfoKind::PROFILER_STATE);
  g_memory = false;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("start", &start, py::arg("needs_inputs"), "register the do-nothing callbacks");
  m.def("start_hooks", &start_hooks, "every native hook full capture needs, doing nothing");
  m.def("stop", &stop, "remove them");
}

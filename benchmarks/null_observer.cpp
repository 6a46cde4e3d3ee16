// A RecordFunction observer that does nothing: the floor under every profiler of ATen ops, which
// benchmarks/overhead.py reads neuron_prof's and torch.profiler's overheads against. It registers
// as neuron_prof's op observer does (collectors/_observer.cpp, py_start): one global callback pair
// on the FUNCTION, BACKWARD_FUNCTION and USER_SCOPE scopes; with needs_inputs, RecordFunction boxes
// every op's inputs for it, which is what recording shapes costs before any recording is done.
// Benchmark-only: the package never builds or imports it.
#include <torch/extension.h>

#include <ATen/record_function.h>

#include <memory>
#include <mutex>
#include <stdexcept>

namespace {

std::mutex g_mu;
at::CallbackHandle g_handle = 0;

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction&) { return nullptr; }

void on_end(const at::RecordFunction&, at::ObserverContext*) {}

void start(bool needs_inputs) {
  std::lock_guard<std::mutex> g(g_mu);
  if (g_handle != 0) throw std::runtime_error("null observer already started");
  g_handle = at::addGlobalCallback(
      at::RecordFunctionCallback(on_start, on_end)
          .needsInputs(needs_inputs)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                   at::RecordScope::USER_SCOPE}));
}

void stop() {
  std::lock_guard<std::mutex> g(g_mu);
  if (g_handle == 0) return;
  at::removeCallback(g_handle);
  g_handle = 0;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("start", &start, py::arg("needs_inputs"), "register the do-nothing callbacks");
  m.def("stop", &stop, "remove them");
}

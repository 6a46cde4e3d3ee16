// What the eager op observer (_observer.cpp, _engine_services.cpp, _input_meta.cpp) shares with
// the other native parts of the engine (_memory.cpp): the calling thread's open op, the clock and
// the string table.
#pragma once

#include <c10/core/ScalarType.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace neuron_prof {

// Attribution of the calling thread's innermost open op (engine string / stack ids).
struct OpContext {
  int32_t op = 0;      // innermost open op or range (aten::empty, ...)
  int32_t top_op = 0;  // outermost open op on the thread (Optimizer.step#Adam.step, ...)
  int32_t module = 0;  // module path of the op (the forward op's, for backward ops)
  int32_t stack = 0;   // user Python stack of the top-level op (the forward op's, for backward)
  bool bwd = false;    // the op runs in autograd's backward pass
  int32_t shape = 0;   // an allocation op's (aten::empty...) size argument, e.g. "[64, 512]"
  int32_t dtype = 0;   // and the dtype it allocates
};

// False when the thread has no open op the observer recorded (observer off, outside any op).
bool current_op(OpContext* out);
int64_t now_ns();
const char* dtype_name(c10::ScalarType t);  // "float32", "int64"... (as the ops table spells them)
int32_t intern(const std::string& s);
bool in_forked_child();
// Whether the observer works out the shape/dtype allocation ops make (costs a little per op).
void set_alloc_meta(bool on);

// The calling thread's module path id as the module hooks last set it (0: none), and its user
// Python stack (engine stack id; 0 when the observer is not started or no user frame is running).
int32_t thread_module();
int32_t user_stack();
// On an autograd engine thread other than the one that called the running backward() (a
// device's engine thread, with no Python frame of its own): the user stack of that backward()
// call (what comms_backward_begin recorded), the line that made this thread run; else 0. Known
// without walking Python, so without taking the GIL on that thread.
int32_t backward_stack();

// Engine string or stack id -> the Recorder's id, learnt from Python once each. Engine ids are
// small and dense (handed out in order), so a vector indexed by them: every row of every step is
// mapped through several of these (a hash map's lookups cost most of a drain's packing).
class IdMap {
 public:
  int32_t find(int32_t k) const { return k > 0 && (size_t)k < v_.size() ? v_[k] : -1; }  // -1: not learnt
  int32_t mapped(int32_t k) const { return std::max(find(k), 0); }  // 0 (none) where not learnt
  void set(const std::vector<std::pair<int32_t, int32_t>>& pairs) {
    for (auto& p : pairs) {
      if (p.first <= 0) continue;
      if ((size_t)p.first >= v_.size()) v_.resize(std::max<size_t>((size_t)p.first + 1, v_.size() * 2), -1);
      v_[p.first] = p.second;
    }
  }

 private:
  std::vector<int32_t> v_;
};

// Registers the memory functions (mem_*), the collectives observer (comms_*) and the backend hook
// API (device_*, _device.cpp) on the module.
void register_memory(pybind11::module_& m);
void register_comms(pybind11::module_& m);
void register_device(pybind11::module_& m);

}  // namespace neuron_prof

// neuron_prof collectives observer: one row per collective this process issues, on any backend.
//
// Mechanism: every collective, whoever issues it (explicit torch.distributed calls, DDP's reducer,
// FSDP2, functional collectives, DTensor redistributions), runs one of the c10d dispatcher ops
// (c10d::allreduce_, c10d::_allgather_base_, ...: ProcessGroup's methods call them), and the
// dispatcher wraps each in an at::RecordFunction. A global callback sees them with their
// arguments (the tensors, the ProcessGroup, the root or peer rank, asyncOp) and their result (the
// Work). From these it records the op, the group, the group's own sequence number (the same on
// every rank for the same collective: what the flight recorder matches on), tensor count, bytes
// and dtype, the issuing thread's user stack and module, the issue call's start and end, and the
// completion time, from a callback on the Work's future (the backend marks it when the collective
// finished, on whatever thread). No setting of torch or of the process group is touched.
//
// The callback runs for every op while it is on, so non-c10d ops leave after one prefix compare;
// it is on only while a process group exists (the collector turns it on at init_process_group).
//
// Hangs: each collective is also written to a slot of a small memory-mapped file in the rank
// folder (comms_set_inflight) as its issue call begins, before the backend sees it, and marked
// there when it completes. A process killed while
// stuck in a collective (kill -9 included) leaves the slot marked "issued": the page cache keeps
// what was written, no flush needed.
#include <ATen/record_function.h>
#include <ATen/core/ivalue.h>
#include <pybind11/stl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "_engine.h"

namespace py = pybind11;

namespace {

enum Status : int8_t { COMPLETED = 0, FAILED = 1, IN_FLIGHT = 2, UNKNOWN = 3 };

struct CommRow {
  int64_t ts;         // issue call start (calling thread)
  int64_t dur;        // issue call duration
  int64_t done;       // completion (the Work's future), -1: not known
  int64_t tid;        // OS tid of the issuing thread
  int64_t seq;        // the group's sequence number of this collective
  int64_t bytes;      // tensor bytes this rank sends / contributes
  int64_t out_bytes;  // tensor bytes this rank receives
  int32_t op, call, group, count, dtype, peer, module, stack;
  int8_t status;
  uint8_t async_op, bwd, pad_[5];
};

// Argument roles, from the op's schema argument names.
enum Role : char { R_NONE = '-', R_IN = 'i', R_OUT = 'o', R_BOTH = 'b', R_PEER = 'p', R_ASYNC = 'a' };

struct OpInfo {
  bool collective = false;
  const char* kind = nullptr;  // all_reduce, ...
  int32_t op = 0, call = 0;
  std::vector<char> roles;
};

struct GroupInfo {
  int32_t desc = 0, backend = 0;
  int32_t size = 0, rank = -1;
  int64_t own_seq = 0;  // used when the backend keeps no sequence number
};

// What one collective's issue call knew at its start.
struct CommCtx : at::ObserverContext {
  CommRow row{};
  uint64_t id = 0;  // its in-flight slot's
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
};

struct InflightSlot {  // 128 bytes; readers: neuron_prof/store/reader.py (INFLIGHT_*)
  int64_t id;          // written last at issue: 0 while the slot is being written
  int64_t ts, done, seq, bytes;
  int32_t state;       // 1 issued, 2 completed, 3 failed
  int32_t peer;
  char op[24];
  char group[56];
};
static_assert(sizeof(InflightSlot) == 128, "inflight slot layout");
constexpr int64_t kInflightMagic = 0x3130464e4950504eLL;  // "NPPINF01"
constexpr size_t kInflightHeader = 64;

std::atomic<bool> g_on{false};
at::CallbackHandle g_handle = 0;
std::mutex g_mu;  // everything below
std::unordered_map<std::string, OpInfo> g_ops;
std::unordered_map<std::string, GroupInfo> g_groups;  // by group name
std::vector<std::string> g_group_order;
std::unordered_map<uint64_t, CommRow> g_pending;  // issued, not completed
std::vector<CommRow> g_done;
uint64_t g_next_id = 1;
char* g_map = nullptr;
size_t g_map_len = 0, g_slots = 0;

const char* kind_of(const std::string& n) {
  static const std::unordered_map<std::string, const char*> kinds = {
      {"allreduce_", "all_reduce"}, {"allreduce_coalesced_", "all_reduce"},
      {"allgather_", "all_gather"}, {"_allgather_base_", "all_gather"},
      {"allgather_coalesced_", "all_gather"}, {"allgather_into_tensor_coalesced_", "all_gather"},
      {"reduce_scatter_", "reduce_scatter"}, {"_reduce_scatter_base_", "reduce_scatter"},
      {"reduce_scatter_tensor_coalesced_", "reduce_scatter"}, {"reduce_", "reduce"},
      {"broadcast_", "broadcast"}, {"gather_", "gather"}, {"scatter_", "scatter"},
      {"alltoall_", "all_to_all"}, {"alltoall_base_", "all_to_all"}, {"barrier", "barrier"},
      {"monitored_barrier_", "barrier"}, {"send", "send"}, {"recv_", "recv"},
      {"recv_any_source_", "recv"}};
  auto it = kinds.find(n);
  return it == kinds.end() ? nullptr : it->second;
}

OpInfo make_info(const at::RecordFunction& rf, const std::string& name) {
  OpInfo info;
  const char* kind = kind_of(name.substr(6));
  if (!kind) return info;
  info.collective = true;
  info.kind = kind;
  info.op = neuron_prof::intern(kind);
  info.call = neuron_prof::intern(name);
  auto schema = rf.operator_schema();
  if (!schema) return info;
  const std::string k(kind);
  for (const auto& a : schema->arguments()) {
    const std::string& an = a.name();
    char r = R_NONE;
    // torch 2.13 spells them async_op, root_rank, dst (send), src (recv_); older: asyncOp, dstRank
    if (an == "async_op" || an == "asyncOp") r = R_ASYNC;
    else if (an == "src" || an == "dst" || an.find("Rank") != std::string::npos ||
             an.find("rank") != std::string::npos)
      r = R_PEER;
    else if (k == "barrier") r = R_NONE;  // its tensor is a placeholder
    else if (an.rfind("output", 0) == 0) r = R_OUT;
    else if (an.rfind("input", 0) == 0) r = R_IN;
    else if (an == "tensors" || an == "tensor") r = k == "send" ? R_IN : k == "recv" ? R_OUT : R_BOTH;
    info.roles.push_back(r);
  }
  return info;
}

// Bytes and count of the tensors in an argument (a tensor, a list, a list of lists).
void tensors_of(const c10::IValue& v, int64_t* bytes, int32_t* count, int32_t* dtype) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) return;
    *bytes += (int64_t)t.numel() * (int64_t)t.element_size();
    *count += 1;
    if (!*dtype) *dtype = neuron_prof::intern(neuron_prof::dtype_name(t.scalar_type()));
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) tensors_of(e, bytes, count, dtype);
  }
}

bool is_class(const c10::IValue& v, const char* qualified) {
  if (!v.isObject()) return false;
  auto name = v.toObjectRef().type()->name();
  return name && name->qualifiedName() == qualified;
}

template <class T>
c10::intrusive_ptr<T> custom(const c10::IValue& v) {
  // a torchbind object holds its C++ instance as a capsule in slot 0
  return c10::static_intrusive_pointer_cast<T>(v.toObjectRef().getSlot(0).toCapsule());
}

GroupInfo& group_of(const c10d::ProcessGroup& pg, const std::string& name) {  // g_mu held
  auto it = g_groups.find(name);
  if (it != g_groups.end()) return it->second;
  GroupInfo g;
  g.desc = neuron_prof::intern(pg.getGroupDesc());
  g.size = pg.getSize();
  g.rank = pg.getRank();
  try {
    g.backend = neuron_prof::intern(pg.getBackendName());
  } catch (...) {
  }
  g_group_order.push_back(name);
  return g_groups.emplace(name, g).first->second;
}

void copy_name(char* dst, size_t n, const std::string& s) {
  size_t k = std::min(n - 1, s.size());
  std::memcpy(dst, s.data(), k);
  std::memset(dst + k, 0, n - k);
}

InflightSlot* slot_for(uint64_t id) {  // g_mu held
  if (!g_map || !g_slots) return nullptr;
  return reinterpret_cast<InflightSlot*>(g_map + kInflightHeader) + (id % g_slots);
}

// The group's sequence number of its latest collective (-1: the backend keeps none).
int64_t backend_seq(c10d::ProcessGroup& pg) {
  try {
    return (int64_t)pg.getSequenceNumberForGroup();
  } catch (...) {
    return -1;
  }
}

// Collective `id`'s in-flight slot, written as it is issued: a process that dies inside the issue
// call (gloo aborts the process on a size mismatch, from its own thread) still leaves it.
void write_slot(uint64_t id, const CommRow& r, const char* op, const std::string& group) {  // g_mu held
  InflightSlot* s = slot_for(id);
  if (!s) return;
  __atomic_store_n(&s->id, (int64_t)0, __ATOMIC_RELEASE);
  s->ts = r.ts;
  s->done = -1;
  s->seq = r.seq;
  s->bytes = r.bytes;
  s->peer = r.peer;
  s->state = 1;
  copy_name(s->op, sizeof(s->op), op);
  copy_name(s->group, sizeof(s->group), group);
  __atomic_store_n(&s->id, (int64_t)id, __ATOMIC_RELEASE);
}

void complete(uint64_t id, bool failed) {
  int64_t t = neuron_prof::now_ns();
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_pending.find(id);
  if (it == g_pending.end()) return;
  it->second.done = t;
  it->second.status = failed ? FAILED : COMPLETED;
  g_done.push_back(it->second);
  g_pending.erase(it);
  if (InflightSlot* s = slot_for(id)) {
    if (__atomic_load_n(&s->id, __ATOMIC_ACQUIRE) == (int64_t)id) {
      s->done = t;
      __atomic_store_n(&s->state, failed ? 3 : 2, __ATOMIC_RELEASE);
    }
  }
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& rf) {
  if (!g_on.load(std::memory_order_relaxed) || neuron_prof::in_forked_child()) return nullptr;
  const char* name = rf.name();
  if (std::strncmp(name, "c10d::", 6) != 0) return nullptr;
  try {
    std::string n(name);
    OpInfo info;
    {
      std::lock_guard<std::mutex> g(g_mu);
      auto it = g_ops.find(n);
      if (it == g_ops.end()) it = g_ops.emplace(n, make_info(rf, n)).first;
      info = it->second;
    }
    if (!info.collective) return nullptr;
    auto ctx = std::make_unique<CommCtx>();
    CommRow& r = ctx->row;
    r.op = info.op;
    r.call = info.call;
    r.peer = -1;
    r.done = -1;
    r.tid = (int64_t)syscall(SYS_gettid);
    int64_t in_b = 0, out_b = 0;
    int32_t in_n = 0, out_n = 0, dt = 0;
    const auto inputs = rf.inputs();
    for (size_t i = 0; i < inputs.size(); ++i) {
      const c10::IValue& v = inputs[i];
      if (is_class(v, "__torch__.torch.classes.c10d.ProcessGroup")) {
        ctx->pg = custom<c10d::ProcessGroup>(v);
        continue;
      }
      char role = i < info.roles.size() ? info.roles[i] : R_NONE;
      if (role == R_ASYNC && v.isBool()) r.async_op = v.toBool();
      else if (role == R_PEER && v.isInt()) r.peer = (int32_t)v.toInt();
      else if (role == R_IN || role == R_BOTH) {
        int64_t b = 0;
        int32_t c = 0;
        tensors_of(v, &b, &c, &dt);
        in_b += b;
        in_n += c;
        if (role == R_BOTH) {
          out_b += b;
          out_n += c;
        }
      } else if (role == R_OUT) {
        tensors_of(v, &out_b, &out_n, &dt);
      }
    }
    if (!ctx->pg) return nullptr;
    r.bytes = in_b;
    r.out_bytes = out_b;
    r.count = in_n ? in_n : out_n;
    r.dtype = dt;
    neuron_prof::OpContext oc;
    if (neuron_prof::current_op(&oc)) {
      r.module = oc.module;
      r.stack = oc.stack;
      r.bwd = oc.bwd;
    } else {
      r.module = neuron_prof::thread_module();
    }
    // a backward hook's collective (DDP's bucket all-reduce) has no forward op to inherit a
    // stack from: the user's line is the one running backward (loss.backward())
    // on a device's autograd thread (DDP's hooks under loss.backward() on an accelerator) there is
    // no Python frame: the line is the backward() call's, as on the CPU where backward runs there;
    // known without walking (taking the GIL) on that thread
    if (!r.stack) r.stack = neuron_prof::backward_stack();
    if (!r.stack) r.stack = neuron_prof::user_stack();
    // nor does one issued from autograd's final callbacks (FSDP2's last reduce-scatter, queued
    // with queue_callback): no op is open, but the engine's graph task is
    if (!r.bwd && torch::autograd::get_current_graph_task_id() != -1) r.bwd = 1;
    const std::string& gname = ctx->pg->getGroupName();
    r.group = neuron_prof::intern(gname);
    const int64_t seq = backend_seq(*ctx->pg);
    r.ts = neuron_prof::now_ns();  // after our own work, but the slot: it stays out of the issue time
    {
      std::lock_guard<std::mutex> g(g_mu);
      GroupInfo& gi = group_of(*ctx->pg, gname);
      r.seq = (seq >= 0 ? seq : gi.own_seq) + 1;  // the number the group gives it as it is issued
      ctx->id = g_next_id++;
      write_slot(ctx->id, r, info.kind, gname);
    }
    return ctx;
  } catch (...) {
    return nullptr;
  }
}

void on_end(const at::RecordFunction& rf, at::ObserverContext* base) {
  if (!base) return;
  auto* ctx = static_cast<CommCtx*>(base);
  CommRow& r = ctx->row;
  int64_t te = neuron_prof::now_ns();
  r.dur = te - r.ts;
  try {
    const std::string& gname = ctx->pg->getGroupName();
    const int64_t seq = backend_seq(*ctx->pg);
    c10::intrusive_ptr<c10::ivalue::Future> fut;
    for (const c10::IValue& v : rf.outputs()) {
      if (!is_class(v, "__torch__.torch.classes.c10d.Work")) continue;
      try {
        fut = custom<c10d::Work>(v)->getFuture();
      } catch (...) {
      }
      break;
    }
    const uint64_t id = ctx->id;
    {
      std::lock_guard<std::mutex> g(g_mu);
      GroupInfo& gi = group_of(*ctx->pg, gname);
      ++gi.own_seq;
      r.seq = seq >= 0 ? seq : gi.own_seq;
      r.status = fut ? IN_FLIGHT : UNKNOWN;
      if (fut) g_pending.emplace(id, r);
      else g_done.push_back(r);
      InflightSlot* s = slot_for(id);
      if (s && __atomic_load_n(&s->id, __ATOMIC_ACQUIRE) == (int64_t)id) {
        s->seq = r.seq;
        __atomic_store_n(&s->state, fut ? 1 : 2, __ATOMIC_RELEASE);  // no completion to wait for: done
      }
    }
    if (fut) fut->addCallback([id](c10::ivalue::Future& f) { complete(id, f.hasError()); });
  } catch (...) {
  }
}

void comms_start() {
  std::lock_guard<std::mutex> g(g_mu);
  if (g_handle != 0) return;
  // an earlier capture's collectives (completed after its last drain) are not this one's
  g_pending.clear();
  g_done.clear();
  g_handle = at::addGlobalCallback(at::RecordFunctionCallback(on_start, on_end)
                                       .needsInputs(true)
                                       .needsOutputs(true)
                                       .needsIds(false)
                                       .scopes({at::RecordScope::FUNCTION}));
  g_on.store(true);
}

void comms_stop() {
  std::lock_guard<std::mutex> g(g_mu);
  g_on.store(false);
  if (g_handle != 0) {
    at::removeCallback(g_handle);
    g_handle = 0;
  }
}

// Slots for in-flight collectives in `fd` (a file in the rank folder, opened by the collector):
// the file is sized and mapped here; the fd may be closed afterwards.
void comms_set_inflight(int fd, int64_t slots) {
  std::lock_guard<std::mutex> g(g_mu);
  if (g_map || slots <= 0) return;
  size_t len = kInflightHeader + (size_t)slots * sizeof(InflightSlot);
  if (ftruncate(fd, (off_t)len) != 0) throw std::runtime_error("cannot size the in-flight file");
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) throw std::runtime_error("cannot map the in-flight file");
  g_map = static_cast<char*>(p);
  g_map_len = len;
  g_slots = (size_t)slots;
  int64_t head[4] = {kInflightMagic, (int64_t)sizeof(InflightSlot), slots, (int64_t)kInflightHeader};
  std::memcpy(g_map, head, sizeof(head));
}

void comms_close_inflight() {
  std::lock_guard<std::mutex> g(g_mu);
  if (!g_map) return;
  munmap(g_map, g_map_len);
  g_map = nullptr;
  g_map_len = g_slots = 0;
}

py::dict comms_layout() {
  py::list fields;
  auto add = [&](const char* n, size_t off, const char* t) { fields.append(py::make_tuple(n, off, t)); };
  add("ts", offsetof(CommRow, ts), "<i8");
  add("dur", offsetof(CommRow, dur), "<i8");
  add("done", offsetof(CommRow, done), "<i8");
  add("tid", offsetof(CommRow, tid), "<i8");
  add("seq", offsetof(CommRow, seq), "<i8");
  add("bytes", offsetof(CommRow, bytes), "<i8");
  add("out_bytes", offsetof(CommRow, out_bytes), "<i8");
  add("op", offsetof(CommRow, op), "<i4");
  add("call", offsetof(CommRow, call), "<i4");
  add("group", offsetof(CommRow, group), "<i4");
  add("count", offsetof(CommRow, count), "<i4");
  add("dtype", offsetof(CommRow, dtype), "<i4");
  add("peer", offsetof(CommRow, peer), "<i4");
  add("module", offsetof(CommRow, module), "<i4");
  add("stack", offsetof(CommRow, stack), "<i4");
  add("status", offsetof(CommRow, status), "i1");
  add("async_op", offsetof(CommRow, async_op), "u1");
  add("bwd", offsetof(CommRow, bwd), "u1");
  py::dict d;
  d["fields"] = fields;
  d["itemsize"] = sizeof(CommRow);
  return d;
}

// Completed collectives since the last drain (with `final`, also those still in flight: the
// capture ends with them issued and not completed) and every group seen so far
// (name, desc id, backend id, size, rank).
py::tuple comms_drain(bool final) {
  std::vector<CommRow> out;
  std::vector<py::tuple> groups;
  {
    std::lock_guard<std::mutex> g(g_mu);
    out.swap(g_done);
    if (final) {
      for (auto& kv : g_pending) out.push_back(kv.second);
      g_pending.clear();
    }
    for (const auto& n : g_group_order) {
      const GroupInfo& gi = g_groups[n];
      groups.push_back(py::make_tuple(n, gi.desc, gi.backend, gi.size, gi.rank));
    }
  }
  py::bytes data(reinterpret_cast<const char*>(out.data()), out.size() * sizeof(CommRow));
  return py::make_tuple(data, groups);
}

}  // namespace

namespace neuron_prof {
// The backward() call running now (see backward_stack in _engine.h): its user stack and the
// thread that called it, set by the collectives collector's wrapper of torch.autograd's engine
// entry on that thread.
std::atomic<int32_t> g_backward_stack{0};
std::atomic<int64_t> g_backward_tid{0};

// Records the calling thread and its user stack as the running backward's; returns the ones
// before (a backward inside a backward: a reentrant checkpoint), for backward_end.
std::pair<int32_t, int64_t> backward_begin() {
  return {g_backward_stack.exchange(neuron_prof::user_stack()), g_backward_tid.exchange((int64_t)syscall(SYS_gettid))};
}
void backward_end(std::pair<int32_t, int64_t> before) {
  g_backward_stack.store(before.first);
  g_backward_tid.store(before.second);
}
int32_t backward_stack() {
  const int64_t caller = g_backward_tid.load();
  if (caller == 0 || caller == (int64_t)syscall(SYS_gettid) || torch::autograd::get_current_graph_task_id() == -1)
    return 0;  // not an engine thread of a running backward: the thread's own frames say where
  return g_backward_stack.load();
}

void register_comms(py::module_& m) {
  m.def("comms_backward_begin", &backward_begin);
  m.def("comms_backward_end", &backward_end);
  m.def("comms_start", &comms_start);
  m.def("comms_stop", &comms_stop);
  m.def("comms_set_inflight", &comms_set_inflight);
  m.def("comms_close_inflight", &comms_close_inflight);
  m.def("comms_layout", &comms_layout);
  m.def("comms_drain", &comms_drain);
}
}  // namespace neuron_prof

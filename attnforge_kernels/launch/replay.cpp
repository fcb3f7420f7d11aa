// attnforge's native launch path (issue 30 §2): the replay of attnforge_kernels/launch/plans.py's plans, and the
// autograd node around it, in C++.
//
// At the small shapes diffusion and LLM users train, a step of flash_attn_func is bound by host
// time, and what is left of it after the Python plans is Python's autograd.Function: the `.apply`
// around a Python forward and a Python backward on autograd's device thread
// (docs/history/benchmarks-2026.md, "The training step's host time"). Here a planned call allocates
// its outputs, launches the recorded Triton kernels with the driver's launch call (cuLaunchKernel,
// or hipModuleLaunchKernel on ROCm) and builds a C++ autograd node, as PyTorch's own attention ops
// do. Every decision is still Python's: a plan is what the Python path launched for a call with the
// same key (attnforge_kernels/launch/replay.py exports it), and a call or a backward without a plan
// here goes back to Python.
//
// A launch is kept as the kernel's parameters, 8 bytes each (the value's own bytes first, as a
// little-endian host passes them), and the parameters that take the call's tensors; the
// trailing global and profile scratch pointers of Triton 3.6's launchers (third_party/nvidia
// and third_party/amd backend driver.py, make_launcher) are among the parameters.
#include <torch/extension.h>
#include <torch/csrc/autograd/custom_function.h>

#include <dlfcn.h>

#include <atomic>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

namespace py = pybind11;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

constexpr size_t kMaxParams = 160;
constexpr size_t kMaxPlans = 256;      // per table, as attnforge_kernels/launch/plans.py's MAX_PLANS
constexpr size_t kMaxBackward = 16;    // per forward plan, as its Python table

// cuLaunchKernel and hipModuleLaunchKernel take the same arguments.
using LaunchFn = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         unsigned, void*, void**, void**);
LaunchFn g_launch = nullptr;
// cuStreamIsCapturing and hipStreamIsCapturing: (stream, status*), status 0 where not capturing.
using CapturingFn = int (*)(void*, int*);
CapturingFn g_capturing = nullptr;
bool g_hip = false;

// Tests on the CPU: launches are noted here instead of made.
bool g_noting = false;
std::mutex g_noted_mu;
struct Noted {
  uint64_t function;
  unsigned grid[3], block, shared;
  std::vector<uint64_t> params;
};
std::vector<Noted> g_noted;

// What the backward calls where it has no plan: attnforge_kernels/launch/replay.py's `_backward`.
py::object* g_fallback = nullptr;

// Replays and returns to Python since the last `counts()` (tests, tools/host_probe.py).
std::atomic<int64_t> g_forwards{0}, g_backwards{0}, g_fallbacks{0}, g_kv{0};

using Key = std::vector<int64_t>;
struct KeyHash {
  size_t operator()(const Key& k) const noexcept {
    uint64_t h = 1469598103934665603ULL ^ k.size();
    for (int64_t x : k) {
      h ^= static_cast<uint64_t>(x) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    }
    return static_cast<size_t>(h);
  }
};

int64_t bits(double x) {
  int64_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

constexpr int64_t kNone = std::numeric_limits<int64_t>::min();

int64_t align16(const at::Tensor& t) {
  return static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16);
}

// What a call's decisions and Triton's specialisation read of one tensor (launch.tensor_key,
// and on ROCm the 2 GiB buffer-op bit, launch._storage_key).
void put_tensor(Key& key, const at::Tensor& t) {
  if (!t.defined()) {
    key.push_back(-1);
    return;
  }
  key.push_back(static_cast<int64_t>(t.scalar_type()));
  key.push_back(t.dim());
  for (int64_t s : t.sizes()) key.push_back(s);
  for (int64_t s : t.strides()) key.push_back(s);
  key.push_back(static_cast<int64_t>(t.device().type()));
  key.push_back(t.device().index());
  key.push_back(align16(t));
  if (g_hip) key.push_back(t.storage().nbytes() <= std::numeric_limits<int32_t>::max());
}

// Which positions hold one tensor twice (q is k): a plan fills its pointer parameters by
// position.
void put_identity(Key& key, std::initializer_list<const at::Tensor*> ts) {
  std::vector<const c10::TensorImpl*> seen;
  for (const at::Tensor* t : ts) {
    const c10::TensorImpl* impl = t->defined() ? t->unsafeGetTensorImpl() : nullptr;
    int64_t first = static_cast<int64_t>(seen.size());
    for (size_t i = 0; i < seen.size(); ++i) {
      if (impl != nullptr && seen[i] == impl) {
        first = static_cast<int64_t>(i);
        break;
      }
    }
    key.push_back(first);
    seen.push_back(impl);
  }
}

uint64_t pointer(const at::Tensor& t) {
  return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(t.data_ptr()));
}

struct Launch {
  uint64_t function = 0;
  unsigned grid[3] = {1, 1, 1};
  unsigned block = 0, shared = 0;
  std::vector<uint64_t> params;                   // every kernel parameter, 8 bytes each
  std::vector<std::pair<int32_t, int32_t>> fills; // (parameter, index of the call's tensor)
  int64_t scratch_bytes = 0;                      // global scratch per program (0: none)
  int32_t scratch_param = -1;

  void operator()(void* stream, const at::Tensor* const* tensors, const at::Tensor& like) const {
    if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0) return;  // as Triton's launchers: no launch
    uint64_t values[kMaxParams];
    void* ptrs[kMaxParams];
    const size_t n = params.size();
    std::memcpy(values, params.data(), n * sizeof(uint64_t));
    for (const auto& f : fills) values[f.first] = pointer(*tensors[f.second]);
    at::Tensor scratch;
    if (scratch_bytes > 0) {
      const int64_t programs = int64_t(grid[0]) * grid[1] * grid[2];
      scratch = at::empty({programs * scratch_bytes}, like.options().dtype(at::kByte));
      values[scratch_param] = pointer(scratch);
    }
    for (size_t i = 0; i < n; ++i) ptrs[i] = &values[i];
    if (g_noting) {
      std::lock_guard<std::mutex> lock(g_noted_mu);
      g_noted.push_back({function, {grid[0], grid[1], grid[2]}, block, shared,
                         std::vector<uint64_t>(values, values + n)});
      return;
    }
    TORCH_CHECK(g_launch != nullptr, "attnforge native: the launch path was not initialised");
    const int err = g_launch(reinterpret_cast<void*>(function), grid[0], grid[1], grid[2], block,
                             1, 1, shared, stream, ptrs, nullptr);
    TORCH_CHECK(err == 0, "attnforge native: ", g_hip ? "hipModuleLaunchKernel" : "cuLaunchKernel",
                " failed with error ", err);
  }
};

// (function, (grid), block, shared, [params], [(param, tensor)], scratch_bytes, scratch_param)
Launch launch_from(const py::tuple& d) {
  Launch l;
  l.function = d[0].cast<uint64_t>();
  auto g = d[1].cast<std::vector<unsigned>>();
  TORCH_CHECK(g.size() == 3, "attnforge native: a grid has three dimensions");
  std::copy(g.begin(), g.end(), l.grid);
  l.block = d[2].cast<unsigned>();
  l.shared = d[3].cast<unsigned>();
  l.params = d[4].cast<std::vector<uint64_t>>();
  l.fills = d[5].cast<std::vector<std::pair<int32_t, int32_t>>>();
  l.scratch_bytes = d[6].cast<int64_t>();
  l.scratch_param = d[7].cast<int32_t>();
  TORCH_CHECK(l.params.size() <= kMaxParams, "attnforge native: too many kernel parameters");
  for (const auto& f : l.fills) {
    TORCH_CHECK(f.first >= 0 && size_t(f.first) < l.params.size() && f.second >= 0,
                "attnforge native: a tensor parameter out of range");
  }
  TORCH_CHECK(l.scratch_bytes == 0 ||
                  (l.scratch_param >= 0 && size_t(l.scratch_param) < l.params.size()),
              "attnforge native: a scratch parameter out of range");
  return l;
}

void* current_stream(const at::Tensor& t) {
  if (g_noting) return nullptr;
  const auto* impl = c10::impl::getDeviceGuardImpl(t.device().type());
  return impl->getStream(t.device()).native_handle();
}

struct BackwardPlan {
  std::vector<Launch> launches;  // dQ (with delta), then dK/dV
};

struct ForwardPlan : torch::CustomClassHolder {
  Launch launch;
  std::vector<int64_t> out_shape, lse_shape;
  at::ScalarType out_dtype = at::kHalf;
  int64_t id = 0, token = 0;
  // The call's values, for the backward's way back to Python.
  int64_t max_q = 0, max_k = 0, batch = 0;
  double scale = 0, softcap = 0;
  std::optional<int64_t> left, right;
  bool varlen = false;
  std::mutex mu;  // `backward` is read on autograd's device thread without the GIL
  std::unordered_map<Key, std::shared_ptr<const BackwardPlan>, KeyHash> backward;
};

std::unordered_map<Key, c10::intrusive_ptr<ForwardPlan>, KeyHash> g_forward;
int64_t g_next_id = 1;

Key forward_key(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const at::Tensor& cu_q, const at::Tensor& cu_k, int64_t max_q, int64_t max_k,
                int64_t batch, double scale, std::optional<int64_t> left,
                std::optional<int64_t> right, double softcap, bool varlen, int64_t token) {
  Key key;
  key.reserve(64);
  key.push_back(token);
  for (const at::Tensor* t : {&q, &k, &v, &cu_q, &cu_k}) put_tensor(key, *t);
  put_identity(key, {&q, &k, &v, &cu_q, &cu_k});
  key.insert(key.end(), {max_q, max_k, batch, bits(scale), left.value_or(kNone),
                         right.value_or(kNone), bits(softcap), varlen ? 1 : 0});
  return key;
}

// What a backward adds to its forward's key (launch.backward_key): dO's fields, the output's
// and LSE's alignment, and which input dO is. The process state is the forward's (its token).
Key backward_key(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                 const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse) {
  Key key;
  key.reserve(24);
  put_tensor(key, dout);
  const auto* d = dout.unsafeGetTensorImpl();
  key.insert(key.end(), {align16(out), align16(lse), d == q.unsafeGetTensorImpl(),
                         d == k.unsafeGetTensorImpl(), d == v.unsafeGetTensorImpl(),
                         d == out.unsafeGetTensorImpl()});
  return key;
}

// One call's state for its backward: the plan and its inputs' data pointers (a replaced
// `.data` is not an in-place change autograd refuses; a moved input goes back to Python).
struct Call : torch::CustomClassHolder {
  c10::intrusive_ptr<ForwardPlan> plan;
  uint64_t pointers[5] = {0, 0, 0, 0, 0};
  at::Tensor out, lse;    // allocated before the node, handed to it
  at::Tensor cu_q, cu_k;  // the call's cu_seqlens (undefined where not varlen), saved by it
};

uint64_t pointer_of(const at::Tensor& t) { return t.defined() ? pointer(t) : 0; }

bool aligned(std::initializer_list<const at::Tensor*> ts) {
  for (const at::Tensor* t : ts) {
    if (align16(*t) != 0) return false;
  }
  return true;
}

// The tensors of a backward launch, in attnforge_kernels/api/flash_attn.py's order.
enum { DO, Q, K, V, OUT, LSE, CU_Q, CU_K, DQ, DK, DV, DELTA, N_BACKWARD };

// The backward from `call`'s plan, or nullopt: no plan for dO's layout, or the saved inputs' data
// moved since the forward (`same` then false).
std::optional<variable_list> replay_backward(const Call& call, const at::Tensor& dout,
                                             const variable_list& saved, bool& same) {
  const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
  const at::Tensor &cu_q = saved[5], &cu_k = saved[6];
  const at::Tensor* inputs[5] = {&q, &k, &v, &cu_q, &cu_k};
  same = true;
  for (int i = 0; i < 5; ++i) {
    if (pointer_of(*inputs[i]) != call.pointers[i]) same = false;
  }
  if (!same) return std::nullopt;
  std::shared_ptr<const BackwardPlan> plan;
  {
    Key key = backward_key(dout, q, k, v, out, lse);
    std::lock_guard<std::mutex> lock(call.plan->mu);
    auto it = call.plan->backward.find(key);
    if (it == call.plan->backward.end() || !it->second) return std::nullopt;
    plan = it->second;
  }
  at::Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  at::Tensor delta = at::empty_like(lse);
  if (!aligned({&dq, &dk, &dv, &delta})) return std::nullopt;
  const at::Tensor* tensors[N_BACKWARD] = {&dout, &q,  &k,  &v,  &out, &lse,
                                           &cu_q, &cu_k, &dq, &dk, &dv,  &delta};
  void* stream = current_stream(q);
  for (const Launch& l : plan->launches) l(stream, tensors, q);
  g_backwards.fetch_add(1, std::memory_order_relaxed);
  return variable_list{dq, dk, dv, at::Tensor()};
}

py::object none_or(const at::Tensor& t) { return t.defined() ? py::cast(t) : py::none(); }

py::object optional_int(const std::optional<int64_t>& x) {
  return x.has_value() ? py::cast(*x) : py::none();
}

struct Flash : public torch::autograd::Function<Flash> {
  // `call` is not a tensor, so autograd does not take it (or the tensors it holds) for an input:
  // q, k and v are the inputs.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, c10::intrusive_ptr<Call> call) {
    ctx->set_materialize_grads(false);
    at::Tensor out = std::move(call->out), lse = std::move(call->lse);
    const at::Tensor* tensors[7] = {&q, &k, &v, &call->cu_q, &call->cu_k, &out, &lse};
    call->plan->launch(current_stream(q), tensors, q);
    // The cu_seqlens are saved too (not inputs: no gradient), so that one changed in place is
    // refused at the backward as Python's Function refuses it.
    ctx->save_for_backward({q, k, v, out, lse, call->cu_q, call->cu_k});
    call->cu_q = at::Tensor();
    call->cu_k = at::Tensor();
    ctx->saved_data["call"] = c10::IValue::make_capsule(call);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor& dout = grads[0];
    if (!dout.defined()) return variable_list(4);  // q, k, v and `call`
    variable_list saved = ctx->get_saved_variables();
    auto call = c10::static_intrusive_pointer_cast<Call>(ctx->saved_data["call"].toCapsule());
    bool same = false;
    if (auto res = replay_backward(*call, dout, saved, same)) return *res;
    // No plan here: the Python path, which records one and hands it back (put_backward).
    const ForwardPlan& p = *call->plan;
    g_fallbacks.fetch_add(1, std::memory_order_relaxed);
    py::gil_scoped_acquire gil;
    TORCH_CHECK(g_fallback != nullptr, "attnforge native: no Python backward registered");
    py::tuple r = (*g_fallback)(py::cast(call->plan), same, dout, saved[0], saved[1], saved[2],
                                saved[3], saved[4], none_or(saved[5]), none_or(saved[6]),
                                p.max_q, p.max_k, p.batch, p.scale, optional_int(p.left),
                                optional_int(p.right), p.softcap, p.varlen);
    return {r[0].cast<at::Tensor>(), r[1].cast<at::Tensor>(), r[2].cast<at::Tensor>(),
            at::Tensor()};
  }
};

at::Tensor or_undefined(const std::optional<at::Tensor>& t) { return t ? *t : at::Tensor(); }

// A planned call's output, or None where this call has no plan here (then Python's path).
py::object flash(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                 const std::optional<at::Tensor>& cu_q_, const std::optional<at::Tensor>& cu_k_,
                 int64_t max_q, int64_t max_k, int64_t batch, double scale,
                 std::optional<int64_t> left, std::optional<int64_t> right, double softcap,
                 bool varlen, int64_t token) {
  const at::Tensor cu_q = or_undefined(cu_q_), cu_k = or_undefined(cu_k_);
  c10::intrusive_ptr<ForwardPlan> plan;
  try {
    auto it = g_forward.find(forward_key(q, k, v, cu_q, cu_k, max_q, max_k, batch, scale, left,
                                         right, softcap, varlen, token));
    if (it == g_forward.end()) return py::none();
    plan = it->second;
  } catch (const c10::Error&) {
    return py::none();  // not plain tensors (no strides or storage): Python's path says why
  }
  at::Tensor out = at::empty(plan->out_shape, q.options().dtype(plan->out_dtype));
  at::Tensor lse = at::empty(plan->lse_shape, q.options().dtype(at::kFloat));
  if (!aligned({&out, &lse})) return py::none();
  g_forwards.fetch_add(1, std::memory_order_relaxed);
  auto call = c10::make_intrusive<Call>();
  call->plan = plan;
  if (at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad())) {
    const at::Tensor* inputs[5] = {&q, &k, &v, &cu_q, &cu_k};
    for (int i = 0; i < 5; ++i) call->pointers[i] = pointer_of(*inputs[i]);
    call->out = out;
    call->lse = lse;
    call->cu_q = cu_q;
    call->cu_k = cu_k;
    return py::cast(Flash::apply(q, k, v, call));
  }
  const at::Tensor* tensors[7] = {&q, &k, &v, &cu_q, &cu_k, &out, &lse};
  plan->launch(current_stream(q), tensors, q);
  return py::cast(out);
}

c10::intrusive_ptr<ForwardPlan> put_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& cu_q, const std::optional<at::Tensor>& cu_k, int64_t max_q,
    int64_t max_k, int64_t batch, double scale, std::optional<int64_t> left,
    std::optional<int64_t> right, double softcap, bool varlen, int64_t token,
    const py::tuple& desc, const at::Tensor& out, const at::Tensor& lse) {
  auto plan = c10::make_intrusive<ForwardPlan>();
  plan->launch = launch_from(desc);
  for (const auto& f : plan->launch.fills) {
    TORCH_CHECK(f.second < 7, "attnforge native: a forward launch reads tensor ", f.second);
  }
  plan->out_shape = out.sizes().vec();
  plan->lse_shape = lse.sizes().vec();
  plan->out_dtype = out.scalar_type();
  plan->id = g_next_id++;
  plan->token = token;
  plan->max_q = max_q, plan->max_k = max_k, plan->batch = batch;
  plan->scale = scale, plan->softcap = softcap;
  plan->left = left, plan->right = right, plan->varlen = varlen;
  if (g_forward.size() >= kMaxPlans) g_forward.clear();
  g_forward[forward_key(q, k, v, or_undefined(cu_q), or_undefined(cu_k), max_q, max_k, batch,
                        scale, left, right, softcap, varlen, token)] = plan;
  return plan;
}

// `descs`: the backward's launches, or None where its calls cannot be replayed here (they then
// go back to Python each time).
void put_backward(const c10::intrusive_ptr<ForwardPlan>& plan, const at::Tensor& dout,
                  const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& out, const at::Tensor& lse, const py::object& descs) {
  std::shared_ptr<BackwardPlan> bp;
  if (!descs.is_none()) {
    bp = std::make_shared<BackwardPlan>();
    for (const auto& d : descs.cast<py::list>()) {
      bp->launches.push_back(launch_from(d.cast<py::tuple>()));
      for (const auto& f : bp->launches.back().fills) {
        TORCH_CHECK(f.second < N_BACKWARD, "attnforge native: a backward launch reads tensor ",
                    f.second);
      }
    }
  }
  Key key = backward_key(dout, q, k, v, out, lse);
  std::lock_guard<std::mutex> lock(plan->mu);
  if (plan->backward.size() >= kMaxBackward) plan->backward.clear();
  plan->backward[key] = bp;
}


// ---------------------------------------------------------------------------------------------
// flash_attn_with_kvcache (attnforge_kernels/api/kvcache.py): a planned decoding step on a
// contiguous cache, with or without new keys (rotary, left padding and batch indices included).
// Paged caches keep Python's path, which reads the lengths on the host to check them against the
// block table, as does a step whose tensors Python would convert first (q's last dimension strided;
// lengths, indices or padding not int32 and contiguous; new keys or rotary tables strided).

// _kv_fwd's pointer parameters (attnforge_kernels/api/kvcache.py, _KVPlan.replay), and _kv_append's
// (_append_pointers).
enum { KQ, KK, KV, KOUT, KLSE, KPART, KCOUNT, KCUQ, KSEQLENS, KSTART, KTABLE, KBIDX, KSLOPES,
       N_KV };
enum { AQ, AK, AV, AKC, AVC, AQOUT, ASEQLENS, ALENGTHS, ASTART, ATABLE, ABIDX, ACOS, ASIN,
       N_APPEND };

struct KVPlan : torch::CustomClassHolder {
  Launch launch;
  std::optional<Launch> append;               // the cache update of a step with new keys
  bool rotary = false;                        // the update writes rotated queries
  std::vector<int64_t> out_shape, lse_shape;  // lse_shape empty: no LSE
  int64_t part_numel = 0, count_numel = 0;    // split scratch (0: none)
  int64_t batch = 0, rows = 0;                // the whole cache's lengths where none are given
};

std::unordered_map<Key, c10::intrusive_ptr<KVPlan>, KeyHash> g_kv_plans;

// Per stream and shape: split partials and zeroed counters (the kernel leaves them at zero), and
// whole-cache lengths: as kvcache.py's _SCRATCH, a few entries of at most 16 MiB, made outside
// graph capture only (a buffer made while capturing would be filled only on replay).
constexpr size_t kScratchEntries = 8;
constexpr int64_t kScratchBytes = 16 << 20;
std::unordered_map<Key, at::Tensor, KeyHash> g_scratch;

bool capturing(void* stream) {
  if (g_noting || g_capturing == nullptr) return false;
  int status = 0;
  return g_capturing(stream, &status) != 0 || status != 0;
}

// The kept tensor for (kind, stream, device, size...), made by `make` where missing; undefined
// where it cannot be kept (large, or while the stream captures a graph).
template <typename Make>
at::Tensor scratch(std::initializer_list<int64_t> what, void* stream, const at::Tensor& like,
                   int64_t bytes, Make make) {
  Key key(what);
  key.push_back(static_cast<int64_t>(reinterpret_cast<uintptr_t>(stream)));
  key.push_back(like.device().index());
  auto it = g_scratch.find(key);
  if (it != g_scratch.end()) return it->second;
  if (bytes > kScratchBytes || capturing(stream)) return at::Tensor();
  if (g_scratch.size() >= kScratchEntries) g_scratch.erase(g_scratch.begin());
  at::Tensor t = make();
  g_scratch.emplace(std::move(key), t);
  return t;
}

// A step's tensors, in the order of attnforge_kernels/api/kvcache.py's key
// (flash_attn_with_kvcache's arguments; undefined for None).
enum { TQ, TKC, TVC, TK, TV, TCOS, TSIN, TSEQLENS, TBIDX, TLEFTPAD, N_STEP };

Key kv_key(const at::Tensor* const* t, std::optional<double> scale, bool causal, int64_t left,
           int64_t right, double softcap, bool interleaved, std::optional<int64_t> num_splits,
           bool lse, int64_t token) {
  Key key;
  key.reserve(96);
  key.push_back(token);
  for (int i = 0; i < N_STEP; ++i) put_tensor(key, *t[i]);
  put_identity(key, {t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], t[9]});
  key.insert(key.end(), {scale ? bits(*scale) : kNone, causal ? 1 : 0, left, right,
                         bits(softcap), interleaved ? 1 : 0, num_splits.value_or(kNone),
                         lse ? 1 : 0});
  return key;
}

using OptT = std::optional<at::Tensor>;

// A planned decoding step's out (and LSE), or None: no plan here, or its scratch cannot be kept
// (then Python's path, which allocates its own).
py::object kv(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
              const OptT& k_, const OptT& v_, const OptT& cos_, const OptT& sin_,
              const OptT& seqlens_, const OptT& bidx_, const OptT& leftpad_,
              std::optional<double> scale, bool causal, int64_t left, int64_t right,
              double softcap, bool interleaved, std::optional<int64_t> num_splits,
              bool return_lse, int64_t token) {
  const at::Tensor k = or_undefined(k_), v = or_undefined(v_), cos = or_undefined(cos_),
                   sin = or_undefined(sin_), seqlens = or_undefined(seqlens_),
                   bidx = or_undefined(bidx_), leftpad = or_undefined(leftpad_);
  const at::Tensor* step[N_STEP] = {&q, &k_cache, &v_cache, &k, &v, &cos, &sin,
                                    &seqlens, &bidx, &leftpad};
  c10::intrusive_ptr<KVPlan> plan;
  try {
    auto it = g_kv_plans.find(kv_key(step, scale, causal, left, right, softcap, interleaved,
                                     num_splits, return_lse, token));
    if (it == g_kv_plans.end()) return py::none();
    plan = it->second;
  } catch (const c10::Error&) {
    return py::none();
  }
  void* stream = current_stream(q);
  at::Tensor part, count, lengths = seqlens;
  if (plan->part_numel > 0) {
    part = scratch({0, plan->part_numel}, stream, q, 4 * plan->part_numel,
                   [&] { return at::empty({plan->part_numel}, q.options().dtype(at::kFloat)); });
    count = scratch({1, plan->count_numel}, stream, q, 4 * plan->count_numel,
                    [&] { return at::zeros({plan->count_numel}, q.options().dtype(at::kInt)); });
    if (!part.defined() || !count.defined()) return py::none();
  }
  at::Tensor q_att = q, q_out;
  if (plan->append) {
    if (plan->rotary) q_out = at::empty(q.sizes(), q.options());
    lengths = at::empty({plan->batch}, q.options().dtype(at::kInt));
  } else if (!lengths.defined()) {
    lengths = scratch({2, plan->batch, plan->rows}, stream, q, 4 * plan->batch, [&] {
      return at::full({plan->batch}, plan->rows, q.options().dtype(at::kInt));
    });
    if (!lengths.defined()) return py::none();
  }
  at::Tensor out = at::empty(plan->out_shape, q.options());
  at::Tensor lse;
  if (return_lse) lse = at::empty(plan->lse_shape, q.options().dtype(at::kFloat));
  for (const at::Tensor* t : {&out, &lengths, &lse, &part, &count, &q_out}) {
    if (t->defined() && !aligned({t})) return py::none();
  }
  const at::Tensor none;
  if (plan->append) {
    const at::Tensor* a[N_APPEND] = {&q,      &k,      &v,       &k_cache, &v_cache,
                                     &q_out,  &seqlens, &lengths, &leftpad, &none,
                                     &bidx,   &cos,    &sin};
    (*plan->append)(stream, a, q);
    if (plan->rotary) q_att = q_out;
  }
  const at::Tensor* tensors[N_KV] = {&q_att, &k_cache, &v_cache, &out,    &lse,  &part, &count,
                                     &none,  &lengths, &leftpad, &none,   &bidx, &none};
  plan->launch(stream, tensors, q);
  g_kv.fetch_add(1, std::memory_order_relaxed);
  if (return_lse) return py::make_tuple(out, lse);
  return py::cast(out);
}

// A Python plan handed over (attnforge_kernels/launch/replay.py put_kv): the step's inputs for its
// key, the launches (the update's, or None; the attention's), the outputs' shapes and the split
// scratch's sizes. Refused (false) where a replay here would pass the kernels other tensors than
// Python does (see above).
bool put_kv(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
            const OptT& k_, const OptT& v_, const OptT& cos_, const OptT& sin_,
            const OptT& seqlens_, const OptT& bidx_, const OptT& leftpad_,
            std::optional<double> scale, bool causal, int64_t left, int64_t right, double softcap,
            bool interleaved, std::optional<int64_t> num_splits, bool return_lse, int64_t token,
            const py::object& append_desc, const py::tuple& desc,
            const std::vector<int64_t>& out_shape, const std::vector<int64_t>& lse_shape,
            int64_t part_numel, int64_t count_numel, int64_t rows) {
  const at::Tensor k = or_undefined(k_), v = or_undefined(v_), cos = or_undefined(cos_),
                   sin = or_undefined(sin_), seqlens = or_undefined(seqlens_),
                   bidx = or_undefined(bidx_), leftpad = or_undefined(leftpad_);
  auto int32_vector = [](const at::Tensor& t) {
    return !t.defined() || (t.scalar_type() == at::kInt && t.dim() == 1 && t.is_contiguous());
  };
  auto unit_last = [](const at::Tensor& t) { return !t.defined() || t.stride(-1) == 1; };
  const bool append = k.defined();
  if (q.stride(-1) != 1 || !int32_vector(seqlens) || !int32_vector(bidx) ||
      !int32_vector(leftpad) || !unit_last(k) || !unit_last(v) || !unit_last(cos) ||
      !unit_last(sin) || (append != !append_desc.is_none()) || (append && !seqlens.defined()) ||
      (leftpad.defined() && !append)) {
    return false;
  }
  auto plan = c10::make_intrusive<KVPlan>();
  plan->launch = launch_from(desc);
  bool att_defined[N_KV] = {true, true, true, true, !lse_shape.empty(), part_numel > 0,
                            part_numel > 0, false, true, leftpad.defined(), false,
                            bidx.defined(), false};
  for (const auto& f : plan->launch.fills) {
    TORCH_CHECK(f.second < N_KV && att_defined[f.second],
                "attnforge native: a cache launch reads tensor ", f.second);
  }
  if (append) {
    plan->append = launch_from(append_desc.cast<py::tuple>());
    plan->rotary = cos.defined();
    bool app_defined[N_APPEND] = {true, true, true, true, true, cos.defined(), true, true,
                                  leftpad.defined(), false, bidx.defined(), cos.defined(),
                                  sin.defined()};
    for (const auto& f : plan->append->fills) {
      TORCH_CHECK(f.second < N_APPEND && app_defined[f.second],
                  "attnforge native: a cache update reads tensor ", f.second);
    }
  }
  plan->out_shape = out_shape;
  plan->lse_shape = lse_shape;
  plan->part_numel = part_numel;
  plan->count_numel = count_numel;
  plan->batch = q.size(0);
  plan->rows = rows;
  const at::Tensor* step[N_STEP] = {&q, &k_cache, &v_cache, &k, &v, &cos, &sin,
                                    &seqlens, &bidx, &leftpad};
  if (g_kv_plans.size() >= kMaxPlans) g_kv_plans.clear();
  g_kv_plans[kv_key(step, scale, causal, left, right, softcap, interleaved, num_splits,
                    return_lse, token)] = plan;
  return true;
}

void init(bool hip, bool noting) {
  g_hip = hip;
  g_noting = noting;
  if (noting) return;
  const char* lib = hip ? "libamdhip64.so" : "libcuda.so.1";
  const char* sym = hip ? "hipModuleLaunchKernel" : "cuLaunchKernel";
  void* handle = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) handle = dlopen(lib, RTLD_NOW);
  TORCH_CHECK(handle != nullptr, "attnforge native: cannot open ", lib);
  g_launch = reinterpret_cast<LaunchFn>(dlsym(handle, sym));
  TORCH_CHECK(g_launch != nullptr, "attnforge native: ", lib, " has no ", sym);
  g_capturing = reinterpret_cast<CapturingFn>(
      dlsym(handle, hip ? "hipStreamIsCapturing" : "cuStreamIsCapturing"));
  TORCH_CHECK(g_capturing != nullptr, "attnforge native: ", lib, " has no stream capture query");
}

py::list take_noted() {
  std::lock_guard<std::mutex> lock(g_noted_mu);
  py::list out;
  for (const auto& n : g_noted) {
    out.append(py::make_tuple(n.function, py::make_tuple(n.grid[0], n.grid[1], n.grid[2]),
                              n.block, n.shared, n.params));
  }
  g_noted.clear();
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<ForwardPlan, c10::intrusive_ptr<ForwardPlan>>(m, "ForwardPlan")
      .def_readonly("id", &ForwardPlan::id)
      .def("backward_plans", [](ForwardPlan& p) {
        std::lock_guard<std::mutex> lock(p.mu);
        return p.backward.size();
      });
  m.def("init", &init, py::arg("hip"), py::arg("noting") = false);
  m.def("set_fallback", [](py::object fn) {
    if (g_fallback == nullptr) g_fallback = new py::object();  // kept until exit
    *g_fallback = std::move(fn);
  });
  m.def("flash", &flash);
  m.def("put_forward", &put_forward);
  m.def("put_backward", &put_backward);
  m.def("kv", &kv);
  m.def("put_kv", &put_kv);
  m.def("clear", [] {
    g_forward.clear();
    g_kv_plans.clear();
  });
  m.def("clear_kv", [] { g_kv_plans.clear(); });
  m.def("size", [] { return g_forward.size(); });
  m.def("kv_size", [] { return g_kv_plans.size(); });
  m.def("scratch_size", [] { return g_scratch.size(); });
  m.def("take_noted", &take_noted);
  m.def("counts", [] {
    return py::make_tuple(g_forwards.exchange(0), g_backwards.exchange(0), g_fallbacks.exchange(0),
                          g_kv.exchange(0));
  });
  m.def("stream_of", [](const at::Tensor& t) {
    return reinterpret_cast<uintptr_t>(current_stream(t));
  });
}

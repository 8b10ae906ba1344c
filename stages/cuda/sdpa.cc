#include "stages/cuda/sdpa.h"

#include <cudnn_frontend.h>

#include <atomic>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/device/cuda/check.h"
#include "stages/cuda/sdpa_internal.h"
#include "stages/cuda/sdpa_layout.h"

namespace bigmac::stages::cuda {
namespace {

namespace fe = cudnn_frontend;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

enum class Direction { kForward, kBackward };

// The uids of the graphs' device tensors: the variant pack maps them to pointers.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

// One built graph and what executing it needs. Immutable once built, shared by the cache and
// the calls that run it.
struct BuiltGraph {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace_bytes = 0;
};

// A graph belongs to the cuDNN handle it was built with (its operation graph holds the handle),
// hence the handle in the key besides the device ordinal.
using Key = std::tuple<int, uint64_t, const void*, int, int, int, int, int, Direction>;

struct Cache {
  std::mutex mutex;
  std::map<Key, std::shared_ptr<const BuiltGraph>> graphs;
  std::atomic<int64_t> builds{0};
};

// Never destroyed: a graph's destructor calls into cuDNN, which must not run after the CUDA
// runtime has been torn down at exit.
Cache& GlobalCache() {
  static Cache* cache = new Cache;
  return *cache;
}

const char* DirectionName(Direction direction) {
  return direction == Direction::kForward ? "forward" : "backward";
}

// One attention shape: kv = h is multi-head, kv < h grouped-query (kv dividing h).
struct Shape {
  int b, t, h, kv, d;
};

std::string ShapeText(Direction direction, const Shape& s) {
  return std::string("cuDNN SDPA ") + DirectionName(direction) +
         " graph for b=" + std::to_string(s.b) + ",t=" + std::to_string(s.t) +
         ",h=" + std::to_string(s.h) + (s.kv == s.h ? "" : ",kv_heads=" + std::to_string(s.kv)) +
         ",d=" + std::to_string(s.d);
}

// kv_heads 0 means h.
Shape MakeShape(int b, int t, int h, int kv_heads, int d) {
  return {b, t, h, kv_heads == 0 ? h : kv_heads, d};
}

SdpaLayout LayoutOf(const Shape& s) { return GroupedQkvLayout(s.b, s.t, s.h, s.kv, s.d); }

const char* CodeName(fe::error_code_t code) {
  switch (code) {
    case fe::error_code_t::OK:
      return "OK";
    case fe::error_code_t::ATTRIBUTE_NOT_SET:
      return "ATTRIBUTE_NOT_SET";
    case fe::error_code_t::SHAPE_DEDUCTION_FAILED:
      return "SHAPE_DEDUCTION_FAILED";
    case fe::error_code_t::INVALID_TENSOR_NAME:
      return "INVALID_TENSOR_NAME";
    case fe::error_code_t::INVALID_VARIANT_PACK:
      return "INVALID_VARIANT_PACK";
    case fe::error_code_t::GRAPH_NOT_SUPPORTED:
      return "GRAPH_NOT_SUPPORTED";
    case fe::error_code_t::GRAPH_EXECUTION_PLAN_CREATION_FAILED:
      return "GRAPH_EXECUTION_PLAN_CREATION_FAILED";
    case fe::error_code_t::GRAPH_EXECUTION_FAILED:
      return "GRAPH_EXECUTION_FAILED";
    case fe::error_code_t::HEURISTIC_QUERY_FAILED:
      return "HEURISTIC_QUERY_FAILED";
    case fe::error_code_t::UNSUPPORTED_GRAPH_FORMAT:
      return "UNSUPPORTED_GRAPH_FORMAT";
    case fe::error_code_t::CUDA_API_FAILED:
      return "CUDA_API_FAILED";
    case fe::error_code_t::CUDNN_BACKEND_API_FAILED:
      return "CUDNN_BACKEND_API_FAILED";
    case fe::error_code_t::INVALID_CUDA_DEVICE:
      return "INVALID_CUDA_DEVICE";
    case fe::error_code_t::HANDLE_ERROR:
      return "HANDLE_ERROR";
    case fe::error_code_t::INVALID_VALUE:
      return "INVALID_VALUE";
    case fe::error_code_t::NVRTC_COMPILATION_FAILED:
      return "NVRTC_COMPILATION_FAILED";
  }
  return "unknown error code";
}

// Throws DeviceError("<shape>: <step> failed: <code> (<message>), in <where>") unless ok.
void CheckStep(fe::error_t status, const std::string& shape, const char* step,
               const CallSite& site) {
  if (status.is_good()) return;
  std::string message = CodeName(status.get_code());
  const std::string detail = status.get_message();
  if (!detail.empty()) message += " (" + detail + ")";
  throw device::DeviceError(shape + ": " + step + " failed: " + message + ", in " + site.where);
}

std::vector<int64_t> Vec(const std::array<int64_t, 4>& a) { return {a.begin(), a.end()}; }

// Sets a tensor's name, uid, dims, strides and type from the layout.
fe::graph::Tensor_attributes& Describe(fe::graph::Tensor_attributes& tensor, const char* name,
                                       int64_t uid, const SdpaTensor& layout, fe::DataType_t type) {
  return tensor.set_name(name)
      .set_uid(uid)
      .set_dim(Vec(layout.dims))
      .set_stride(Vec(layout.strides))
      .set_data_type(type);
}

TensorPtr Input(fe::graph::Graph& graph, const char* name, int64_t uid, const SdpaTensor& layout,
                fe::DataType_t type) {
  fe::graph::Tensor_attributes tensor;
  Describe(tensor, name, uid, layout, type);
  return graph.tensor(tensor);
}

void Output(const TensorPtr& tensor, const char* name, int64_t uid, const SdpaTensor& layout,
            fe::DataType_t type) {
  Describe(*tensor, name, uid, layout, type).set_output(true);
}

// Declares the forward or backward SDPA over `layout` (not yet built). `sm_version` (90 for
// Hopper; 0: the frontend asks the current device) is what validate() checks support against.
std::shared_ptr<fe::graph::Graph> Declare(Direction direction, const SdpaLayout& layout,
                                          int sm_version) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(layout.q.dims[3]));
  constexpr fe::DataType_t kBf16 = fe::DataType_t::BFLOAT16;
  constexpr fe::DataType_t kFloat = fe::DataType_t::FLOAT;

  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(kBf16).set_intermediate_data_type(kFloat).set_compute_data_type(kFloat);
  if (sm_version > 0) graph->set_sm_version(sm_version);
  const TensorPtr q = Input(*graph, "Q", kQ, layout.q, kBf16);
  const TensorPtr k = Input(*graph, "K", kK, layout.k, kBf16);
  const TensorPtr v = Input(*graph, "V", kV, layout.v, kBf16);

  if (direction == Direction::kForward) {
    // Causal = the band to the left of the top-left-aligned diagonal (what set_causal_mask(true)
    // sets; that setter is marked for deprecation).
    auto attributes = fe::graph::SDPA_attributes()
                          .set_name("sdpa_forward")
                          .set_generate_stats(true)
                          .set_attn_scale(scale)
                          .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                          .set_diagonal_band_right_bound(0);
    auto [o, stats] = graph->sdpa(q, k, v, std::move(attributes));
    Output(o, "O", kO, layout.o, kBf16);
    Output(stats, "Stats", kStats, layout.stats, kFloat);
  } else {
    const TensorPtr o = Input(*graph, "O", kO, layout.o, kBf16);
    const TensorPtr dout = Input(*graph, "dO", kDO, layout.o, kBf16);
    const TensorPtr stats = Input(*graph, "Stats", kStats, layout.stats, kFloat);
    auto attributes = fe::graph::SDPA_backward_attributes()
                          .set_name("sdpa_backward")
                          .set_attn_scale(scale)
                          .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                          .set_diagonal_band_right_bound(0)
                          .set_deterministic_algorithm(true);
    auto [dq, dk, dv] = graph->sdpa_backward(q, k, v, o, dout, stats, std::move(attributes));
    // The gradients have q, k and v's layout inside dqkv: together they cover all of it.
    Output(dq, "dQ", kDQ, layout.q, kBf16);
    Output(dk, "dK", kDK, layout.k, kBf16);
    Output(dv, "dV", kDV, layout.v, kBf16);
  }
  return graph;
}

std::shared_ptr<const BuiltGraph> Build(Direction direction, const Shape& s, const CallSite& site) {
  const std::string shape = ShapeText(direction, s);
  const device::cuda::CudaContext& context = *site.context;
  // The frontend reads the target's compute capability from the current device.
  int current = -1;
  BIGMAC_CUDA_CHECK(cudaGetDevice(&current), site.where);
  if (current != context.ordinal) {
    throw device::DeviceError(shape + ": the current CUDA device is " + std::to_string(current) +
                              ", not the context's " + std::to_string(context.ordinal) + ", in " +
                              site.where);
  }
  auto built = std::make_shared<BuiltGraph>();
  built->graph = Declare(direction, LayoutOf(s), /*sm_version=*/0);
  fe::graph::Graph& graph = *built->graph;
  CheckStep(graph.validate(), shape, "validate", site);
  CheckStep(graph.build_operation_graph(context.dnn), shape, "build_operation_graph", site);
  CheckStep(graph.create_execution_plans({fe::HeurMode_t::A}), shape, "create_execution_plans",
            site);
  CheckStep(graph.check_support(), shape, "check_support", site);
  CheckStep(graph.build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), shape, "build_plans",
            site);
  CheckStep(graph.get_workspace_size(built->workspace_bytes), shape, "get_workspace_size", site);
  return built;
}

// The cached graph for the shape, built on first use. One thread at a time runs a device's
// layers (its handle and stream); the map itself is thread-safe. A failed build throws and leaves
// nothing in the cache, so the next call tries again (and fails with the same words).
std::shared_ptr<const BuiltGraph> GraphFor(Direction direction, const Shape& s,
                                           const CallSite& site) {
  if (site.context == nullptr || site.context->dnn == nullptr) {
    throw std::logic_error(ShapeText(direction, s) + ": no cuDNN handle, in " + site.where);
  }
  if (s.b <= 0 || s.t <= 0 || s.h <= 0 || s.d <= 0 || s.kv <= 0 || s.h % s.kv != 0) {
    throw std::invalid_argument(ShapeText(direction, s) +
                                ": every size must be positive and kv_heads must divide h, in " +
                                site.where);
  }
  Cache& cache = GlobalCache();
  const Key key{site.context->ordinal,
                site.context->generation,
                site.context->dnn,
                s.b,
                s.t,
                s.h,
                s.kv,
                s.d,
                direction};
  {
    std::lock_guard<std::mutex> lock(cache.mutex);
    const auto it = cache.graphs.find(key);
    if (it != cache.graphs.end()) return it->second;
  }
  // Built outside the lock (tens of milliseconds or more); if two threads race, the first
  // insertion wins and both run that graph.
  std::shared_ptr<const BuiltGraph> built = Build(direction, s, site);
  cache.builds.fetch_add(1);
  std::lock_guard<std::mutex> lock(cache.mutex);
  return cache.graphs.emplace(key, std::move(built)).first->second;
}

// The graph's workspace for one call. From the device's allocator when the context has a device:
// counted like any tensor, and not zeroed (cuDNN needs none). It is freed when the call returns,
// with the kernels still queued: like every temporary tensor of the CUDA layers, this relies on
// the device's caching allocator handing a freed block only to later work on the same compute
// stream. A bare context (no device, as in the GPU tests) uses stream-ordered
// cudaMallocAsync/cudaFreeAsync instead.
class Workspace {
 public:
  Workspace(const CallSite& site, int64_t bytes) : site_(site) {
    if (bytes <= 0) return;
    device_ = site.context->device;
    if (device_ != nullptr) {
      data_ = device_->allocator().Allocate(bytes);
    } else {
      BIGMAC_CUDA_CHECK(cudaMallocAsync(&data_, static_cast<size_t>(bytes), site.stream()),
                        site.where);
    }
  }
  ~Workspace() {
    if (data_ == nullptr) return;
    if (device_ != nullptr) {
      device_->allocator().Free(data_);
    } else {
      cudaFreeAsync(data_, site_.stream());  // a failure here has nowhere to go but the next call
    }
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  void* data() const { return data_; }

 private:
  const CallSite& site_;
  device::Device* device_ = nullptr;
  void* data_ = nullptr;
};

void Execute(Direction direction, const BuiltGraph& built,
             std::unordered_map<int64_t, void*>& pointers, const Shape& s, const CallSite& site) {
  const device::cuda::CudaContext& context = *site.context;
  BIGMAC_CUDA_CHECK(cudnnSetStream(context.dnn, site.stream()), site.where);
  Workspace workspace(site, built.workspace_bytes);
  CheckStep(built.graph->execute(context.dnn, pointers, workspace.data()), ShapeText(direction, s),
            "execute", site);
}

}  // namespace

std::string CudnnAttentionUnavailable(const CallSite& site, int b, int t, int h, int d,
                                      int kv_heads) {
  const Shape shape = MakeShape(b, t, h, kv_heads, d);
  try {
    GraphFor(Direction::kForward, shape, site);
    GraphFor(Direction::kBackward, shape, site);
  } catch (const device::DeviceError& error) {
    return error.what();
  } catch (const std::runtime_error& error) {
    // The frontend reports most refusals as statuses (a DeviceError above) but throws
    // std::runtime_error for some ("No suitable implementation for given SDPA_attributes"):
    // a refusal all the same, so the layer falls back instead of failing.
    return std::string("cuDNN frontend: ") + error.what() + ", in " + site.where;
  }
  return "";
}

void CudnnAttentionForward(const CallSite& site, void* out, float* stats, const void* qkv, int b,
                           int t, int h, int d, int kv_heads) {
  const Shape shape = MakeShape(b, t, h, kv_heads, d);
  const auto built = GraphFor(Direction::kForward, shape, site);
  const SdpaLayout layout = LayoutOf(shape);
  // bf16 elements are 2 bytes; the layout's offsets are in elements.
  auto* base = static_cast<char*>(const_cast<void*>(qkv));
  std::unordered_map<int64_t, void*> pointers = {
      {kQ, base + 2 * layout.q.offset},
      {kK, base + 2 * layout.k.offset},
      {kV, base + 2 * layout.v.offset},
      {kO, out},
      {kStats, stats},
  };
  Execute(Direction::kForward, *built, pointers, shape, site);
}

void CudnnAttentionBackward(const CallSite& site, void* dqkv, const void* dout, const void* qkv,
                            const void* out, const float* stats, int b, int t, int h, int d,
                            int kv_heads) {
  const Shape shape = MakeShape(b, t, h, kv_heads, d);
  const auto built = GraphFor(Direction::kBackward, shape, site);
  const SdpaLayout layout = LayoutOf(shape);
  auto* base = static_cast<char*>(const_cast<void*>(qkv));
  auto* grad = static_cast<char*>(dqkv);
  std::unordered_map<int64_t, void*> pointers = {
      {kQ, base + 2 * layout.q.offset},  {kK, base + 2 * layout.k.offset},
      {kV, base + 2 * layout.v.offset},  {kO, const_cast<void*>(out)},
      {kDO, const_cast<void*>(dout)},    {kStats, const_cast<float*>(stats)},
      {kDQ, grad + 2 * layout.q.offset}, {kDK, grad + 2 * layout.k.offset},
      {kDV, grad + 2 * layout.v.offset},
  };
  Execute(Direction::kBackward, *built, pointers, shape, site);
}

namespace internal {

std::string ValidateSdpaGraph(bool backward, const SdpaLayout& layout, int sm_version) {
  const auto graph =
      Declare(backward ? Direction::kBackward : Direction::kForward, layout, sm_version);
  fe::error_t status = graph->validate();
  if (status.is_good()) return "";
  const std::string message = status.get_message();
  return std::string(CodeName(status.get_code())) + (message.empty() ? "" : ": " + message);
}

int64_t SdpaGraphBuilds() { return GlobalCache().builds.load(); }

int64_t SdpaCachedGraphs() {
  Cache& cache = GlobalCache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  return static_cast<int64_t>(cache.graphs.size());
}

}  // namespace internal

}  // namespace bigmac::stages::cuda

// The mLSTM time loop on CPU, forward and backward, in one compiled op each (see app/model/fused_core.py).
//
// Per step: the two recurrent products and the elementwise work around them. Each product runs on the
// path measured fastest for its shape (app/model/matmul.py, kind "step"):
// - packed (this file): a register-tiled GEMM over the weight packed ONCE per call into column panels (the
//   weights are the same for all T steps; a per-step product has only B rows, so a BLAS call per step pays
//   its dispatch, its own packing and its generic blocking T times). Light elementwise work is the GEMM's
//   epilogue, applied to each finished register tile while it is in L1; the gate math (transcendentals,
//   many streams) runs as one pass at full vector width after the GEMM, which measured faster than
//   running it per tile:
//     forward   r = h W_mh^T   [GEMM, epilogue: keep r and pm, m = pm * r]
//               q = m W_m^T    [GEMM] -> gate pass: gates, c, tanh c, h (into y as well)
//     backward  dm = dG W_m    [GEMM, epilogue: d(pm) = dm * r, d(r) = dm * pm]
//               dh = d(r) W_mh [GEMM] -> gate pass of the PREVIOUS step: dG, dc carry, bias gradient
//   so a step is 2 GEMMs + 1 elementwise pass each way, and nothing crosses the ATen dispatcher inside the
//   time loop.
// - "mm" / "onednn": ATen's mm (MKL) or oneDNN's linear into a buffer, then the same epilogues as passes.

// Portability of the build: the extension is cached per user and that cache may be shared by machines with
// different CPUs (an NFS home on a cluster), so nothing is compiled with -march=native. Every kernel is
// compiled three times, for AVX-512 (x86-64-v4 features), AVX2 + FMA and the SSE2 baseline, each with its
// own vector width and register tiles; the best level the running CPU supports is picked at load time, and
// `isa(level)` can lower it (the tests run all three on one machine). The kernels live in mlstm_kernels.h
// (no torch headers) and each level is compiled in a file of its own, so ninja builds them in parallel.
// The math auto-vectorises: no libm calls in the float path (a Cephes-style exp, tanh from a polynomial
// near 0 / from exp elsewhere, both within a few ulp of libm) and GCC vector extensions for the GEMM tiles.

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS  // per-op headers: the build parses far less of ATen
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/zeros.h>
#include <ATen/record_function.h>
#include <torch/library.h>

#include <sys/mman.h>

#include <omp.h>

#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "mlstm_kernels.h"

namespace mlstm_k {
#if MLSTM_X86
MLSTM_ISA_DECL(avx512)
MLSTM_ISA_DECL(avx2)
#endif
MLSTM_ISA_DECL(base)

// ISA levels: 2 = AVX-512, 1 = AVX2 + FMA, 0 = baseline (SSE2 on x86-64).
int supported_level() {
#if MLSTM_X86
  __builtin_cpu_init();
  bool v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi") &&
            __builtin_cpu_supports("bmi2");
  bool v4 = v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
            __builtin_cpu_supports("avx512cd");
  return v4 ? 2 : v3 ? 1 : 0;
#else
  return 0;
#endif
}
int& active_level() {
  static int level = supported_level();
  return level;
}
const char* const* tile_names() {
#if MLSTM_X86
  if (active_level() == 2) return avx512::tile_names;
  if (active_level() == 1) return avx2::tile_names;
#endif
  return base::tile_names;
}

template <class C, class S>
const Fns<C, S>& fns() {
#if MLSTM_X86
  static const Fns<C, S> v4 = avx512::fns<C, S>(), v3 = avx2::fns<C, S>();
#endif
  static const Fns<C, S> v0 = base::fns<C, S>();
#if MLSTM_X86
  if (active_level() == 2) return v4;
  if (active_level() == 1) return v3;
#endif
  return v0;
}

// ---- buffers: a pool of the op's own tensors ------------------------------------------------------------
// torch's CPU allocator hands every large tensor fresh pages from the OS (glibc returns freed ones), so
// each step page-faulted its (T, B, .) buffers anew: ~25 MB and 5-14 ms of system time per step of the
// small model. The op's tensors come from this pool instead: a freed buffer is kept (by byte size) for
// the next step's tensor of the same size. The pool never holds more than the most bytes ever live at
// once, live and free together: a request it cannot serve first returns free buffers (the largest first)
// until the new one fits under that peak, so work of changing shapes (featurizing texts of every length,
// evaluation's buckets) holds one step's memory, not one step's plus the free buffers of the steps before
// (up to twice as much). Large blocks are mapped and unmapped directly (2 MiB-aligned, asking for
// transparent huge pages), not through malloc, whose free() of a mapped block would raise glibc's mmap
// threshold and keep torch's own later tensors on its heap after they are freed.
class Pool {
 public:
  void* get(size_t bytes) {
    std::vector<std::pair<void*, size_t>> drop;
    {
      std::lock_guard<std::mutex> g(mu_);
      live_ += bytes;
      peak_ = std::max(peak_, live_);
      auto it = free_.find(bytes);
      if (it != free_.end()) {
        void* p = it->second;
        free_.erase(it);
        cached_ -= bytes;
        return p;
      }
      while (live_ + cached_ > peak_ && !free_.empty()) {  // make room under the peak: the largest first
        auto last = std::prev(free_.end());
        cached_ -= last->first;
        drop.emplace_back(last->second, last->first);
        free_.erase(last);
      }
    }
    for (auto& [q, n] : drop) release(q, n);
    return acquire(bytes);
  }
  void put(void* p, size_t bytes) {
    std::lock_guard<std::mutex> g(mu_);
    live_ -= bytes;
    free_.emplace(bytes, p);
    cached_ += bytes;  // live + cached unchanged: still within the peak
  }

 private:
  static constexpr size_t kHuge = size_t(2) << 20;
  static size_t mapped(size_t bytes) { return (bytes + kHuge - 1) / kHuge * kHuge; }
  static void* acquire(size_t bytes) {
    if (bytes < kHuge) {
      void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
      TORCH_CHECK(p, "mlstm_cpu: out of memory allocating ", bytes, " bytes");
      return p;
    }
    const size_t n = mapped(bytes);  // mapped with a huge page's slack, then trimmed to a 2 MiB boundary
    void* raw = mmap(nullptr, n + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    TORCH_CHECK(raw != MAP_FAILED, "mlstm_cpu: out of memory allocating ", bytes, " bytes");
    const uintptr_t a = reinterpret_cast<uintptr_t>(raw), start = (a + kHuge - 1) / kHuge * kHuge;
    if (start > a) munmap(raw, start - a);
    if (a + n + kHuge > start + n) munmap(reinterpret_cast<void*>(start + n), a + n + kHuge - start - n);
#ifdef MADV_HUGEPAGE
    madvise(reinterpret_cast<void*>(start), n, MADV_HUGEPAGE);
#endif
    return reinterpret_cast<void*>(start);
  }
  static void release(void* p, size_t bytes) {
    if (bytes < kHuge) {
      std::free(p);
    } else {
      munmap(p, mapped(bytes));
    }
  }

  std::mutex mu_;
  std::multimap<size_t, void*> free_;
  size_t live_ = 0, peak_ = 0, cached_ = 0;
};
Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: tensors may be freed after static destructors run
  return *p;
}
at::Tensor pooled(at::IntArrayRef sizes, at::ScalarType dtype) {
  int64_t n = 1;
  for (int64_t v : sizes) n *= v;
  const size_t bytes = std::max<size_t>(1, n * c10::elementSize(dtype));
  void* p = pool().get(bytes);
  return at::from_blob(p, sizes, [bytes](void* q) { pool().put(q, bytes); }, at::TensorOptions().dtype(dtype));
}

// The per-step (B, .) blocks of the (T, B, .) buffers are far apart in memory and touched once per step,
// so the hardware prefetchers (which follow a stream within a step) miss the first lines of each: the
// gate pass stalled on DRAM. The step loops ask for the next step's blocks one step ahead (a step is
// ~100 us; its blocks ~0.2 MB).
void prefetch(const void* p, int64_t bytes, bool write) {
  const char* c = static_cast<const char*>(p);
  if (write)
    for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(c + i, 1, 2);
  else
    for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(c + i, 0, 2);
}
void prefetch_rows(const void* p, int64_t rows, int64_t row_bytes, int64_t stride_bytes, bool write) {
  for (int64_t r = 0; r < rows; ++r) prefetch(static_cast<const char*>(p) + r * stride_bytes, row_bytes, write);
}

// Each kernel shows in torch.profiler under this name (bench/mlstm_layer.py counts kernels per step from
// it); costs a flag check when no profiler runs.
#define MLSTM_RECORD(NAME) RECORD_FUNCTION(NAME, c10::ArrayRef<const c10::IValue>{})

// The same record, made by one thread of a team only (thread 0, the caller's): one record per kernel.
struct TeamRecord {
  std::optional<at::RecordFunction> guard;
  TeamRecord(int tid, const char* name) {
    if (tid != 0) return;
    guard.emplace(at::RecordScope::FUNCTION);
    if (guard->isActive()) guard->before(name, c10::ArrayRef<const c10::IValue>{});  // const char*: torch 2.6+
  }
};

// ---- threads: a team splits each step's work ---------------------------------------------------------------
// With T steps of three kernels each, a parallel region per kernel would pay the team's start 3T times; one
// region spans the whole time loop instead and barriers separate the kernels: each product is split by
// panels, each elementwise pass by units (a multiple of 16), so every value is computed exactly as by one
// thread and the result does not depend on the thread count. One thread (the training default: a process
// per core) runs the same loop with no team.
int team_size(int64_t H) {
  if (at::in_parallel_region()) return 1;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), H / 16)));
}
struct Share {
  int64_t a, b;  // [a, b)
};
Share share(int64_t n, int tid, int nth) { return {n * tid / nth, n * (tid + 1) / nth}; }
Share share_units(int64_t H, int tid, int nth) {
  const int64_t chunk = (H + 16 * nth - 1) / (16 * nth) * 16;
  return {std::min(H, tid * chunk), std::min(H, (tid + 1) * chunk)};
}
constexpr int64_t ALL = INT64_MAX;  // every panel
// This thread's share of a step (call inside the team): panels of the step's two products (np1, np2 panels)
// and units of its gate pass.
struct TeamShare {
  int tid;
  Share p1, p2, units;
  TeamShare(int64_t np1, int64_t np2, int64_t H) : tid(omp_get_thread_num()) {
    const int nth = omp_get_num_threads();
    p1 = share(np1, tid, nth);
    p2 = share(np2, tid, nth);
    units = share_units(H, tid, nth);
  }
};

// ---- one per-step product, on its path ---------------------------------------------------------------------
enum : int64_t { PATH_MM = 0, PATH_ONEDNN = 1, PATH_TILE0 = 2 };  // 2 + i: packed with tile i

// x @ w^T for w (N, K) through oneDNN's linear (the op app/model/matmul.py times against mm).
at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& w) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                         c10::string_view, c10::List<std::optional<at::Scalar>>,
                                         std::optional<c10::string_view>)>();
  return op.call(x, w, std::nullopt, "none", c10::List<std::optional<at::Scalar>>(), std::nullopt);
}

// The weight of a per-step product, prepared once per call for its path. The product is x (B, K) @ w^T
// with w (N, K); `src` holds w[n][k] at src[n*sn + k*sk] (a transposed view when the stored matrix is
// the transpose), so no transposed copy is made for the packed path.
template <class C, class S>
struct Product {
  int64_t path, N, K;
  at::Tensor w;       // mm: the (K, N) operand view; onednn: (N, K) contiguous
  at::Tensor packed;  // packed path: panels in the state type
  at::Tensor out;     // mm / onednn: (B, N) result buffer (compute dtype)
  at::Tensor scratch; // packed path: MR x K zero-padded tail rows
  int tile = 0, nr = 0;  // packed path: the tile and its panel width

  Product(int64_t path_, const at::Tensor& wsrc /* (N, K) view */, int64_t B, int threads = 1) : path(path_) {
    N = wsrc.size(0);
    K = wsrc.size(1);
    if (path == PATH_MM) {
      w = wsrc.t();  // (K, N) view: mm takes the transpose for free
      out = at::empty({B, N}, wsrc.options());
    } else if (path == PATH_ONEDNN) {
      w = wsrc.contiguous();
      out = at::empty({B, N}, wsrc.options());
    } else {
      tile = static_cast<int>(path - PATH_TILE0);
      TORCH_CHECK(tile == 0 || tile == 1, "mlstm_cpu: unknown product path ", path);
      nr = fns<C, S>().tile[tile].nr;
      auto so = wsrc.options().dtype(c10::CppTypeToScalarType<typename S::T>::value);
      packed = pooled({packed_size(N, K, nr)}, so.dtype().toScalarType());
      pack<C, typename S::T>(reinterpret_cast<const typename C::T*>(wsrc.data_ptr()), N, K, wsrc.stride(0),
                             wsrc.stride(1), nr, packed.data_ptr<typename S::T>());
      scratch = pooled({8 * K * threads}, wsrc.scalar_type());  // MR <= 8, one per thread
    }
  }
  bool is_packed() const { return path >= PATH_TILE0; }
  const typename S::T* bp() const { return packed.data_ptr<typename S::T>(); }
  typename C::T* scr(int tid = 0) const {  // this thread's
    return reinterpret_cast<typename C::T*>(scratch.data_ptr()) + tid * 8 * K;
  }
  int64_t panels() const { return panel_count(N, nr); }
  // ATen paths: x (B, K) -> out (B, N) in the compute dtype; returns its data.
  const typename C::T* aten(const at::Tensor& x) {
    if (path == PATH_ONEDNN) out = onednn_linear(x, w).contiguous();
    else at::mm_out(out, x, w);
    return reinterpret_cast<const typename C::T*>(out.data_ptr());
  }
};

template <class C, class S>
std::vector<at::Tensor> forward_impl(const at::Tensor& proj, const at::Tensor& bias, const at::Tensor& w_mh,
                                     const at::Tensor& w_m, int64_t path_r, int64_t path_g,
                                     const std::optional<at::Tensor>& h0, const std::optional<at::Tensor>& c0) {
  using CT = typename C::T;
  using ST = typename S::T;
  const auto& F = fns<C, S>();
  const int64_t B = proj.size(0), T = proj.size(1), H = w_mh.size(0);
  const auto sd = proj.scalar_type(), cd = w_mh.scalar_type();
  auto y = pooled({B, T, H}, cd);          // h_1 .. h_T in the caller's layout
  auto hs = pooled({T + 1, B, H}, cd);     // h_0 .. h_T, matmul operands
  auto cs = pooled({T + 1, B, H}, sd);     // c_0 .. c_T
  // the initial state (h_0, c_0): given (a carried state), else zero; backward reads it from hs[0] / cs[0]
  if (h0) hs.select(0, 0).copy_(*h0);
  else hs.select(0, 0).zero_();
  if (c0) cs.select(0, 0).copy_(*c0);
  else cs.select(0, 0).zero_();
  auto tcs = pooled({T, B, H}, sd);        // tanh(c_t)
  auto gates = pooled({T, B, 4 * H}, sd);  // activated [si, sf, so, tu]
  auto ms = pooled({T, B, H}, cd);         // m_t
  auto rs = pooled({T, B, H}, cd);         // W_mh h_{t-1}
  auto pms = pooled({T, B, H}, sd);        // W_mx x_t
  const int nt = team_size(H);
  Product<C, S> pr(path_r, w_mh, B, nt), pq(path_g, w_m, B, nt);
  auto q = pooled({B, 4 * H}, sd);  // W_m m_t of one step, unrounded, for the gate pass
  auto* q_p = q.data_ptr<ST>();
  const ST* pj = proj.data_ptr<ST>();
  const int64_t pj_b = proj.stride(0), pj_t = proj.stride(1);
  auto* y_p = reinterpret_cast<CT*>(y.data_ptr());
  auto* hs_p = reinterpret_cast<CT*>(hs.data_ptr());
  auto* ms_p = reinterpret_cast<CT*>(ms.data_ptr());
  auto* rs_p = reinterpret_cast<CT*>(rs.data_ptr());
  auto* cs_p = cs.data_ptr<ST>();
  auto* tcs_p = tcs.data_ptr<ST>();
  auto* g_p = gates.data_ptr<ST>();
  auto* pms_p = pms.data_ptr<ST>();
  const int64_t n = B * H;
  auto prefetch_next = [&](int64_t t) {
    if (t + 1 < T) {  // the next step's inputs and outputs
      const int64_t u = t + 1;
      prefetch_rows(pj + u * pj_t, B, 5 * H * sizeof(ST), pj_b * sizeof(ST), false);
      prefetch(g_p + u * 4 * n, 4 * n * sizeof(ST), true);
      prefetch(cs_p + (u + 1) * n, n * sizeof(ST), true);
      prefetch(tcs_p + u * n, n * sizeof(ST), true);
      prefetch(pms_p + u * n, n * sizeof(ST), true);
      prefetch(rs_p + u * n, n * sizeof(CT), true);
      prefetch(ms_p + u * n, n * sizeof(CT), true);
      prefetch(hs_p + (u + 1) * n, n * sizeof(CT), true);
      prefetch_rows(y_p + u * H, B, H * sizeof(CT), T * H * sizeof(CT), true);
    }
  };
  if (pr.is_packed() && pq.is_packed()) {
    const auto &tr = F.tile[pr.tile], &tq = F.tile[pq.tile];
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
      const TeamShare my(pr.panels(), pq.panels(), H);
      for (int64_t t = 0; t < T; ++t) {
        if (my.tid == 0) prefetch_next(t);
        const ST* pt = pj + t * pj_t;
        FwdM<C, S> em{rs_p + t * n, ms_p + t * n, pt, pms_p + t * n, H, pj_b};
        Gates<C, S> eg{pt + H, bias.data_ptr<ST>(), g_p + t * 4 * n, cs_p + t * n, cs_p + (t + 1) * n,
                       tcs_p + t * n, hs_p + (t + 1) * n, y_p + t * H, H, pj_b, T * H};
        {
          TeamRecord rec(my.tid, "mlstm_cpu::gemm_m");
          tr.fwd_m(B, H, H, hs_p + t * n, H, pr.bp(), pr.scr(my.tid), em, my.p1.a, my.p1.b);
        }
#pragma omp barrier
        {
          TeamRecord rec(my.tid, "mlstm_cpu::gemm_q");
          tq.keep(B, 4 * H, H, ms_p + t * n, H, pq.bp(), pq.scr(my.tid), Keep<C, S>{q_p, 4 * H}, my.p2.a,
                  my.p2.b);
        }
#pragma omp barrier
        {
          TeamRecord rec(my.tid, "mlstm_cpu::fwd_gates");
          F.p_gates_s(B, 4 * H, q_p, eg, my.units.a, my.units.b - my.units.a);
        }
#pragma omp barrier
      }
    }
    return {y, hs, cs, tcs, gates, ms, rs, pms};
  }
  for (int64_t t = 0; t < T; ++t) {
    const ST* pt = pj + t * pj_t;
    prefetch_next(t);
    FwdM<C, S> em{rs_p + t * n, ms_p + t * n, pt, pms_p + t * n, H, pj_b};
    Gates<C, S> eg{pt + H, bias.data_ptr<ST>(), g_p + t * 4 * n, cs_p + t * n, cs_p + (t + 1) * n,
                   tcs_p + t * n, hs_p + (t + 1) * n, y_p + t * H, H, pj_b, T * H};
    if (pr.is_packed()) {
      MLSTM_RECORD("mlstm_cpu::gemm_m");
      F.tile[pr.tile].fwd_m(B, H, H, hs_p + t * n, H, pr.bp(), pr.scr(), em, 0, ALL);
    } else {
      const CT* q = pr.aten(hs.select(0, t));  // (B, H)
      MLSTM_RECORD("mlstm_cpu::fwd_m");
      F.p_fwd_m(B, H, q, em);
    }
    if (pq.is_packed()) {
      {
        MLSTM_RECORD("mlstm_cpu::gemm_q");
        F.tile[pq.tile].keep(B, 4 * H, H, ms_p + t * n, H, pq.bp(), pq.scr(), Keep<C, S>{q_p, 4 * H}, 0, ALL);
      }
      MLSTM_RECORD("mlstm_cpu::fwd_gates");
      F.p_gates_s(B, 4 * H, q_p, eg, 0, H);
    } else {
      const CT* qc = pq.aten(ms.select(0, t));  // (B, 4H)
      MLSTM_RECORD("mlstm_cpu::fwd_gates");
      F.p_gates(B, 4 * H, qc, eg);
    }
  }
  return {y, hs, cs, tcs, gates, ms, rs, pms};
}

template <class C, class S>
std::vector<at::Tensor> backward_impl(const at::Tensor& dy, const at::Tensor& gates, const at::Tensor& cs,
                                      const at::Tensor& tcs, const at::Tensor& rs, const at::Tensor& pms,
                                      const at::Tensor& w_mh, const at::Tensor& w_m, int64_t path_m,
                                      int64_t path_h) {
  using CT = typename C::T;
  using ST = typename S::T;
  const auto& F = fns<C, S>();
  const int64_t T = pms.size(0), B = pms.size(1), H = pms.size(2);
  const auto cd = rs.scalar_type();
  auto dP = pooled({T, B, 5 * H}, cd);  // [d(W_mx x_t) | d(pre-activations i, f, o, u)]
  auto dR = pooled({T, B, H}, cd);      // d(W_mh h_{t-1})
  auto dc = pooled({B, H}, pms.scalar_type()).zero_();
  auto db = at::zeros({4 * H}, pms.options());  // d(bias)
  // dm = dG W_m is x @ w^T with w = W_m^T (H, 4H); dh = d(r) W_mh with w = W_mh^T: transposed views
  const int nt = team_size(H);
  Product<C, S> pmp(path_m, w_m.t(), B, nt), php(path_h, w_mh.t(), B, nt);
  auto dq = pooled({B, H}, pms.scalar_type());  // d(r) W_mh of one step, unrounded, for the gate pass
  auto* dq_p = dq.data_ptr<ST>();
  const ST* dy_p = dy.data_ptr<ST>();
  const int64_t dy_b = dy.stride(0), dy_t = dy.stride(1);
  auto* g_p = gates.data_ptr<ST>();
  auto* cs_p = cs.data_ptr<ST>();
  auto* tcs_p = tcs.data_ptr<ST>();
  auto* pm_p = pms.data_ptr<ST>();
  auto* dc_p = dc.data_ptr<ST>();
  auto* db_p = db.data_ptr<ST>();
  auto* rs_p = reinterpret_cast<const CT*>(rs.data_ptr());
  auto* dP_p = reinterpret_cast<CT*>(dP.data_ptr());
  auto* dR_p = reinterpret_cast<CT*>(dR.data_ptr());
  const int64_t n = B * H, dp_b = 5 * H;
  auto bg = [&](int64_t s) {
    return BwdGates<C, S>{dy_p + s * dy_t, g_p + s * 4 * n, cs_p + s * n, tcs_p + s * n, dc_p, db_p,
                          dP_p + s * 5 * n + H, H, dy_b, dp_b};
  };
  {
    MLSTM_RECORD("mlstm_cpu::bwd_gates");  // the last step: nothing arrives from a later one
    F.p_bwd_gates(B, H, nullptr, bg(T - 1));
  }
  auto prefetch_next = [&](int64_t t) {
    if (t >= 1) {  // the next (earlier) step's inputs and outputs: step t-1's gate pass runs in this one
      const int64_t u = t - 1;
      prefetch(g_p + u * 4 * n, 4 * n * sizeof(ST), false);
      prefetch(cs_p + u * n, n * sizeof(ST), false);
      prefetch(tcs_p + u * n, n * sizeof(ST), false);
      prefetch_rows(dy_p + u * dy_t, B, H * sizeof(ST), dy_b * sizeof(ST), false);
      prefetch(dP_p + u * 5 * n, 5 * n * sizeof(CT), true);
      prefetch(rs_p + t * n, n * sizeof(CT), false);
      prefetch(pm_p + t * n, n * sizeof(ST), false);
      prefetch(dR_p + t * n, n * sizeof(CT), true);
    }
  };
  if (pmp.is_packed() && php.is_packed()) {
    const auto &tm = F.tile[pmp.tile], &th = F.tile[php.tile];
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
      const TeamShare my(pmp.panels(), php.panels(), H);
      for (int64_t t = T - 1; t >= 0; --t) {
        if (my.tid == 0) prefetch_next(t);
        BwdM<C, S> em{dP_p + t * 5 * n, dR_p + t * n, rs_p + t * n, pm_p + t * n, H, dp_b};
        {
          TeamRecord rec(my.tid, "mlstm_cpu::gemm_dm");
          tm.bwd_m(B, H, 4 * H, dP_p + t * 5 * n + H, 5 * H, pmp.bp(), pmp.scr(my.tid), em, my.p1.a, my.p1.b);
        }
        if (t == 0) break;  // every thread: t is the same for all
#pragma omp barrier
        {
          TeamRecord rec(my.tid, "mlstm_cpu::gemm_dh");
          th.keep(B, H, H, dR_p + t * n, H, php.bp(), php.scr(my.tid), Keep<C, S>{dq_p, H}, my.p2.a, my.p2.b);
        }
#pragma omp barrier
        {
          TeamRecord rec(my.tid, "mlstm_cpu::bwd_gates");
          F.p_bwd_gates_s(B, H, dq_p, bg(t - 1), my.units.a, my.units.b - my.units.a);
        }
#pragma omp barrier
      }
    }
    return {dP, dR, db};
  }
  for (int64_t t = T - 1; t >= 0; --t) {
    prefetch_next(t);
    BwdM<C, S> em{dP_p + t * 5 * n, dR_p + t * n, rs_p + t * n, pm_p + t * n, H, dp_b};
    if (pmp.is_packed()) {
      MLSTM_RECORD("mlstm_cpu::gemm_dm");
      F.tile[pmp.tile].bwd_m(B, H, 4 * H, dP_p + t * 5 * n + H, 5 * H, pmp.bp(), pmp.scr(), em, 0, ALL);
    } else {
      const CT* q = pmp.aten(dP.select(0, t).narrow(1, H, 4 * H));  // (B, H)
      MLSTM_RECORD("mlstm_cpu::bwd_m");
      F.p_bwd_m(B, H, q, em);
    }
    if (t == 0) break;
    if (php.is_packed()) {
      {
        MLSTM_RECORD("mlstm_cpu::gemm_dh");
        F.tile[php.tile].keep(B, H, H, dR_p + t * n, H, php.bp(), php.scr(), Keep<C, S>{dq_p, H}, 0, ALL);
      }
      MLSTM_RECORD("mlstm_cpu::bwd_gates");
      F.p_bwd_gates_s(B, H, dq_p, bg(t - 1), 0, H);
    } else {
      const CT* q = php.aten(dR.select(0, t));  // (B, H)
      MLSTM_RECORD("mlstm_cpu::bwd_gates");
      F.p_bwd_gates(B, H, q, bg(t - 1));
    }
  }
  return {dP, dR, db};
}

void check(bool ok, const char* what) { TORCH_CHECK(ok, "mlstm_cpu: ", what); }

void check_weights(const at::Tensor& w_mh, const at::Tensor& w_m, int64_t H) {
  check(w_mh.device().is_cpu() && w_m.device().is_cpu(), "CPU tensors only");
  check(w_mh.dim() == 2 && w_m.dim() == 2, "w_mh (H, H), w_m (4H, H)");
  check(w_mh.size(0) == H && w_mh.size(1) == H && w_m.size(0) == 4 * H && w_m.size(1) == H, "weight shapes");
  check(w_mh.scalar_type() == w_m.scalar_type(), "w_mh and w_m share the compute dtype");
}

#define MLSTM_DISPATCH(cdt, sdt, CALL, ...)                                                                  \
  if (cdt == at::kFloat && sdt == at::kFloat) return CALL<F32, F32>(__VA_ARGS__);                            \
  if (cdt == at::kBFloat16 && sdt == at::kFloat) return CALL<BF16, F32>(__VA_ARGS__);                        \
  if (cdt == at::kDouble && sdt == at::kDouble) return CALL<F64, F64>(__VA_ARGS__);                          \
  TORCH_CHECK(false, "mlstm_cpu: unsupported compute/state dtypes ", cdt, "/", sdt);

// proj (B, T, 5H) = [W_mx x_t | W_x x_t] in the state dtype, any strides with unit stride in the last dim
// (the caller passes a (T, B) buffer seen as (B, T): one step's rows are then contiguous);
// bias (4H,) state dtype; w_mh (H, H) and w_m (4H, H) in the compute dtype; h0 / c0 (B, H) the initial state
// (zero where not given), h0 in the compute dtype, c0 in the state dtype. Returns y (B, T, H) = h_1..h_T,
// and for backward hs (T+1, B, H) h_0..h_T, cs (T+1, B, H) c_0..c_T, tcs (T, B, H) tanh c_t, gates
// (T, B, 4H), ms (T, B, H) m_t, rs (T, B, H) W_mh h_{t-1}, pms (T, B, H) W_mx x_t. path_r / path_g: the
// path of the product W_mh h / W_m m (0 mm, 1 oneDNN, 2 + i packed with tile i of the active ISA level).
std::vector<at::Tensor> forward(const at::Tensor& proj_, const at::Tensor& bias_, const at::Tensor& w_mh_,
                                const at::Tensor& w_m_, int64_t path_r, int64_t path_g,
                                const std::optional<at::Tensor>& h0, const std::optional<at::Tensor>& c0) {
  check(proj_.device().is_cpu() && proj_.dim() == 3 && proj_.size(2) % 5 == 0, "proj (B, T, 5H) on CPU");
  const int64_t H = proj_.size(2) / 5;
  check_weights(w_mh_, w_m_, H);
  auto proj = proj_.stride(2) == 1 ? proj_ : proj_.contiguous();
  auto bias = bias_.contiguous(), w_mh = w_mh_.contiguous(), w_m = w_m_.contiguous();
  check(bias.scalar_type() == proj.scalar_type() && bias.numel() == 4 * H, "bias (4H,) in the state dtype");
  const int64_t B = proj.size(0);
  auto state_ok = [&](const std::optional<at::Tensor>& s, at::ScalarType dt) {
    return !s || (s->device().is_cpu() && s->dim() == 2 && s->size(0) == B && s->size(1) == H &&
                  s->scalar_type() == dt);
  };
  check(state_ok(h0, w_mh.scalar_type()), "h0 (B, H) in the compute dtype");
  check(state_ok(c0, proj.scalar_type()), "c0 (B, H) in the state dtype");
  at::NoGradGuard no_grad;
  MLSTM_DISPATCH(w_mh.scalar_type(), proj.scalar_type(), forward_impl, proj, bias, w_mh, w_m, path_r, path_g, h0,
                 c0)
}

// dy (B, T, H) state dtype (any strides with unit stride in the last dim) and the forward's saved tensors
// -> dP (T, B, 5H) = [d(W_mx x) | dG] and dR (T, B, H) in the compute dtype, d(bias) (4H,) state dtype. path_m / path_h: the path of
// dG W_m / d(r) W_mh.
std::vector<at::Tensor> backward(const at::Tensor& dy_, const at::Tensor& gates, const at::Tensor& cs,
                                 const at::Tensor& tcs, const at::Tensor& rs, const at::Tensor& pms,
                                 const at::Tensor& w_mh_, const at::Tensor& w_m_, int64_t path_m, int64_t path_h) {
  check(pms.device().is_cpu() && pms.dim() == 3, "pms (T, B, H) on CPU");
  check_weights(w_mh_, w_m_, pms.size(2));
  auto dy = dy_.stride(2) == 1 ? dy_ : dy_.contiguous();
  auto w_mh = w_mh_.contiguous(), w_m = w_m_.contiguous();
  check(dy.scalar_type() == pms.scalar_type() && dy.dim() == 3 && dy.size(0) == pms.size(1) &&
            dy.size(1) == pms.size(0) && dy.size(2) == pms.size(2),
        "dy (B, T, H) in the state dtype");
  check(gates.is_contiguous() && cs.is_contiguous() && tcs.is_contiguous() && rs.is_contiguous() &&
            pms.is_contiguous(),
        "saved tensors are contiguous");
  at::NoGradGuard no_grad;
  MLSTM_DISPATCH(w_mh.scalar_type(), pms.scalar_type(), backward_impl, dy, gates, cs, tcs, rs, pms, w_mh, w_m,
                 path_m, path_h)
}

// The packed GEMM alone, for timing against mm / oneDNN (app/model/matmul.py) and for tests:
// pack(w (N, K), tile) -> panels; packed_linear(x (M, K), panels, N, tile) -> x @ w^T (M, N).
at::ScalarType state_of(at::ScalarType c) { return c == at::kDouble ? at::kDouble : at::kFloat; }

template <class C, class S>
at::Tensor pack_impl(const at::Tensor& w, int64_t tile) {
  check(tile == 0 || tile == 1, "tile is 0 or 1");
  const int nr = fns<C, S>().tile[tile].nr;
  auto out = at::empty({packed_size(w.size(0), w.size(1), nr)}, w.options().dtype(state_of(w.scalar_type())));
  pack<C, typename S::T>(reinterpret_cast<const typename C::T*>(w.data_ptr()), w.size(0), w.size(1), w.stride(0),
                         w.stride(1), nr, out.data_ptr<typename S::T>());
  return out;
}
at::Tensor pack_op(const at::Tensor& w, int64_t tile) {
  check(w.device().is_cpu() && w.dim() == 2, "w (N, K) on CPU");
  MLSTM_DISPATCH(w.scalar_type(), state_of(w.scalar_type()), pack_impl, w, tile)
}

template <class C, class S>
at::Tensor linear_impl(const at::Tensor& x_, const at::Tensor& packed, int64_t N, int64_t tile) {
  auto x = x_.contiguous();
  const auto& F = fns<C, S>();
  check(tile == 0 || tile == 1, "tile is 0 or 1");
  const int64_t M = x.size(0), K = x.size(1);
  check(packed.numel() == packed_size(N, K, F.tile[tile].nr) && packed.scalar_type() == state_of(x.scalar_type()),
        "packed weight matches (N, K, tile, dtype)");
  auto out = at::empty({M, N}, x.options());
  // split by panels over the threads, as inside the time loop (the timing that picks a path sees that)
  const int64_t np = panel_count(N, F.tile[tile].nr);
  const int nt = static_cast<int>(std::min<int64_t>(team_size(N), np));
  auto scratch = at::empty({8 * K * nt}, x.options());
  Store<C, S> e{reinterpret_cast<typename C::T*>(out.data_ptr()), N};
  const auto* xp = reinterpret_cast<const typename C::T*>(x.data_ptr());
  auto* sp = reinterpret_cast<typename C::T*>(scratch.data_ptr());
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    const int tid = omp_get_thread_num();
    const Share sh = share(np, tid, omp_get_num_threads());
    F.tile[tile].store(M, N, K, xp, K, packed.data_ptr<typename S::T>(), sp + tid * 8 * K, e, sh.a, sh.b);
  }
  return out;
}
at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& packed, int64_t N, int64_t tile) {
  check(x.device().is_cpu() && x.dim() == 2, "x (M, K) on CPU");
  MLSTM_DISPATCH(x.scalar_type(), state_of(x.scalar_type()), linear_impl, x, packed, N, tile)
}

// empty(sizes, dtype): an uninitialised CPU tensor from the pool (for the caller's own per-step buffers).
at::Tensor empty_op(at::IntArrayRef sizes, at::ScalarType dtype) { return pooled(sizes, dtype); }

// isa(level): cap the ISA level at `level` (-1: leave it) -> [level name, tile 0 name, tile 1 name].
std::vector<std::string> isa(int64_t level) {
  if (level >= 0) active_level() = std::min<int>(static_cast<int>(level), supported_level());
  static const char* names[] = {"base", "avx2", "avx512"};
  const char* const* t = tile_names();
  return {names[active_level()], t[0], t[1]};
}

}  // namespace mlstm_k

using namespace mlstm_k;

TORCH_LIBRARY(mlstm_cpu, m) {
  m.def(
      "forward(Tensor proj, Tensor bias, Tensor w_mh, Tensor w_m, int path_r, int path_g, Tensor? h0=None, "
      "Tensor? c0=None) -> Tensor[]");
  m.def(
      "backward(Tensor dyt, Tensor gates, Tensor cs, Tensor tcs, Tensor rs, Tensor pm, Tensor w_mh, "
      "Tensor w_m, int path_m, int path_h) -> Tensor[]");
  m.def("pack(Tensor w, int tile) -> Tensor");
  m.def("packed_linear(Tensor x, Tensor packed, int n, int tile) -> Tensor");
  m.def("isa(int level) -> str[]", &isa);
  m.def("empty(int[] sizes, ScalarType dtype) -> Tensor", &empty_op);
}

TORCH_LIBRARY_IMPL(mlstm_cpu, CPU, m) {
  m.impl("forward", &forward);
  m.impl("backward", &backward);
  m.impl("pack", &pack_op);
  m.impl("packed_linear", &packed_linear);
}

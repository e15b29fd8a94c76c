// The mLSTM time loop on CPU, forward and backward, in one compiled op each (see app/model/fused_core.py).
//
// Per step: the two recurrent products through ATen's mm (MKL / oneDNN, whatever torch picks for the
// dtype on this CPU) into preallocated buffers, and fused elementwise passes written here: forward one
// pass m = pm * r between the products and ONE pass for gates + cell + h after them; backward one pass
// for all gate / cell derivatives and one for the two m-product derivatives.
//
// Portability of the build: the extension is cached per user and that cache may be shared by machines
// with different CPUs (an NFS home on a cluster), so nothing is compiled with -march=native. Instead the
// elementwise kernels are function-multiversioned (GCC target_clones: x86-64-v4 = AVX-512, x86-64-v3 =
// AVX2 + FMA, baseline SSE2), the loader picks the clone for the running CPU, and the math below is
// written so the compiler auto-vectorises it (no libm calls in the float path: a Cephes-style exp, and
// tanh from a polynomial near 0 / from exp elsewhere, both within a few ulp of libm).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define MLSTM_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MLSTM_CLONES
#endif
#define AI __attribute__((always_inline)) inline

namespace {

// ---- storage types: matmul operands (compute dtype) and state (float32 / float64) -------------------
struct F32 {
  using T = float;
  static AI float ld(float v) { return v; }
  static AI float st(float v) { return v; }
};
struct F64 {
  using T = double;
  static AI double ld(double v) { return v; }
  static AI double st(double v) { return v; }
};
struct BF16 {  // bit-level conversions (round to nearest even, as c10::BFloat16), vectorisable
  using T = uint16_t;
  static AI float ld(uint16_t v) { return __builtin_bit_cast(float, static_cast<uint32_t>(v) << 16); }
  static AI uint16_t st(float f) {
    uint32_t u = __builtin_bit_cast(uint32_t, f);
    return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
  }
};

// ---- activations --------------------------------------------------------------------------------------
AI float exp_(float x) {  // Cephes expf: x = n ln2 + r, |r| <= ln2/2, degree-5 polynomial, scale by 2^n
  x = x < -88.3762626647949f ? -88.3762626647949f : x;
  x = x > 88.3762626647949f ? 88.3762626647949f : x;
  float n = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float z = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * z + r + 1.0f;
  return p * __builtin_bit_cast(float, (static_cast<int32_t>(n) + 127) << 23);
}
AI float sigmoid_(float x) { return 1.0f / (1.0f + exp_(-x)); }
AI float tanh_(float x) {  // Cephes tanhf: odd polynomial for |x| < 0.625 (no cancellation), exp beyond
  float a = std::fabs(x);
  float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  float small = p * z * x + x;
  float big = 1.0f - 2.0f / (exp_(2.0f * a) + 1.0f);
  big = x < 0.0f ? -big : big;
  return a < 0.625f ? small : big;
}
AI double sigmoid_(double x) { return 1.0 / (1.0 + std::exp(-x)); }
AI double tanh_(double x) { return std::tanh(x); }

// ---- fused elementwise passes, rows [b0, b1) of the batch ----------------------------------------------
// Layouts: gates (B, 4H) activated [si, sf, so, tu]; everything else (B, H); pg (B, 4H) = W_x x_t + b.

template <class C, class S>
AI void fwd_m(int64_t n, const typename S::T* pm, const typename C::T* r, typename C::T* m) {
#pragma omp simd
  for (int64_t k = 0; k < n; ++k) m[k] = C::st(pm[k] * C::ld(r[k]));
}

template <class C, class S>
AI void fwd_gates(int64_t b0, int64_t b1, int64_t H, const typename S::T* pg, const typename C::T* gmm,
                  typename S::T* gates, const typename S::T* cp, typename S::T* c, typename S::T* tc,
                  typename C::T* h) {
  using T = typename S::T;
  for (int64_t b = b0; b < b1; ++b) {
    const T* p = pg + b * 4 * H;
    const typename C::T* q = gmm + b * 4 * H;
    T* g = gates + b * 4 * H;
    const int64_t o = b * H;
#pragma omp simd
    for (int64_t j = 0; j < H; ++j) {
      T si = sigmoid_(T(p[j] + C::ld(q[j])));
      T sf = sigmoid_(T(p[H + j] + C::ld(q[H + j])));
      T so = sigmoid_(T(p[2 * H + j] + C::ld(q[2 * H + j])));
      T tu = tanh_(T(p[3 * H + j] + C::ld(q[3 * H + j])));
      T cn = sf * cp[o + j] + si * tu;
      T tcn = tanh_(cn);
      g[j] = si;
      g[H + j] = sf;
      g[2 * H + j] = so;
      g[3 * H + j] = tu;
      c[o + j] = cn;
      tc[o + j] = tcn;
      h[o + j] = C::st(so * tcn);
    }
  }
}

// dh = dy + W_mh^T-propagated dh_next; dc carries dL/dc_t * sf_{t+1} from the later step and leaves
// with dL/dc_t * sf_t for the earlier one. dG = d(pre-activations [i, f, o, u]).
template <class C, class S>
AI void bwd_gates(int64_t b0, int64_t b1, int64_t H, const typename S::T* dy, const typename C::T* dhn,
                  const typename S::T* gates, const typename S::T* cp, const typename S::T* tc,
                  typename S::T* dc, typename C::T* dG) {
  using T = typename S::T;
  for (int64_t b = b0; b < b1; ++b) {
    const T* g = gates + b * 4 * H;
    typename C::T* d = dG + b * 4 * H;
    const int64_t o = b * H;
#pragma omp simd
    for (int64_t j = 0; j < H; ++j) {
      T si = g[j], sf = g[H + j], so = g[2 * H + j], tu = g[3 * H + j], t = tc[o + j];
      T dh = dy[o + j] + C::ld(dhn[o + j]);
      T dcn = dc[o + j] + dh * so * (T(1) - t * t);
      d[j] = C::st(dcn * tu * (si - si * si));
      d[H + j] = C::st(dcn * cp[o + j] * (sf - sf * sf));
      d[2 * H + j] = C::st(dh * t * (so - so * so));
      d[3 * H + j] = C::st(dcn * si * (T(1) - tu * tu));
      dc[o + j] = dcn * sf;
    }
  }
}

template <class C, class S>
AI void bwd_m(int64_t n, const typename C::T* dm, const typename C::T* r, const typename S::T* pm,
              typename C::T* dpm, typename C::T* dr) {
#pragma omp simd
  for (int64_t k = 0; k < n; ++k) {
    typename S::T v = C::ld(dm[k]);
    dpm[k] = C::st(v * C::ld(r[k]));
    dr[k] = C::st(v * pm[k]);
  }
}

// One multiversioned, non-template entry point per (kernel, compute, state) combination.
#define MLSTM_INSTANCES(NAME, C, S)                                                                          \
  MLSTM_CLONES void fwd_m_##NAME(int64_t n, const S::T* pm, const C::T* r, C::T* m) {                       \
    fwd_m<C, S>(n, pm, r, m);                                                                                \
  }                                                                                                          \
  MLSTM_CLONES void fwd_gates_##NAME(int64_t b0, int64_t b1, int64_t H, const S::T* pg, const C::T* q,      \
                                     S::T* g, const S::T* cp, S::T* c, S::T* tc, C::T* h) {                  \
    fwd_gates<C, S>(b0, b1, H, pg, q, g, cp, c, tc, h);                                                      \
  }                                                                                                          \
  MLSTM_CLONES void bwd_gates_##NAME(int64_t b0, int64_t b1, int64_t H, const S::T* dy, const C::T* dhn,    \
                                     const S::T* g, const S::T* cp, const S::T* tc, S::T* dc, C::T* dG) {    \
    bwd_gates<C, S>(b0, b1, H, dy, dhn, g, cp, tc, dc, dG);                                                  \
  }                                                                                                          \
  MLSTM_CLONES void bwd_m_##NAME(int64_t n, const C::T* dm, const C::T* r, const S::T* pm, C::T* dpm,       \
                                 C::T* dr) {                                                                 \
    bwd_m<C, S>(n, dm, r, pm, dpm, dr);                                                                      \
  }

MLSTM_INSTANCES(f32, F32, F32)
MLSTM_INSTANCES(bf16, BF16, F32)
MLSTM_INSTANCES(f64, F64, F64)

template <class C, class S>
struct Kernels;
#define MLSTM_BIND(NAME, C, S)                                                                               \
  template <>                                                                                                \
  struct Kernels<C, S> {                                                                                     \
    static constexpr auto fm = fwd_m_##NAME;                                                                 \
    static constexpr auto fg = fwd_gates_##NAME;                                                             \
    static constexpr auto bg = bwd_gates_##NAME;                                                             \
    static constexpr auto bm = bwd_m_##NAME;                                                                 \
  };
MLSTM_BIND(f32, F32, F32)
MLSTM_BIND(bf16, BF16, F32)
MLSTM_BIND(f64, F64, F64)

// Each elementwise pass shows in torch.profiler under this name (bench/mlstm_layer.py counts kernels
// per step from it); costs a flag check when no profiler runs.
#define MLSTM_RECORD(NAME) RECORD_FUNCTION(NAME, c10::ArrayRef<const c10::IValue>{})

// Rows per parallel chunk: the elementwise pass goes to several threads only when a chunk has enough
// work (~16K gate elements) to pay for waking them; at the small model (B16, H256) it stays on one.
int64_t grain_rows(int64_t H) { return std::max<int64_t>(1, 16384 / (4 * H)); }

// x (M, K) @ w (N, K)^T through oneDNN's linear (the op app/model/matmul.py times against mm).
at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& w) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                         c10::string_view, c10::List<std::optional<at::Scalar>>,
                                         std::optional<c10::string_view>)>();
  return op.call(x, w, std::nullopt, "none", c10::List<std::optional<at::Scalar>>(), std::nullopt);
}

// x @ w^T for w (N, K): into `out` through mm (MKL, w^T a free transposed view), or oneDNN's linear
// (which allocates its result). Returns the tensor holding the product.
at::Tensor lin(at::Tensor out, const at::Tensor& x, const at::Tensor& w, bool onednn) {
  if (onednn) return onednn_linear(x, w);
  at::mm_out(out, x, w.t());
  return out;
}

template <class C, class S>
std::vector<at::Tensor> forward_impl(const at::Tensor& pm, const at::Tensor& pg, const at::Tensor& w_mh,
                                     const at::Tensor& w_m, bool dnn_r, bool dnn_g) {
  using K = Kernels<C, S>;
  const int64_t T = pm.size(0), B = pm.size(1), H = pm.size(2);
  const auto cdt = w_mh.scalar_type();
  auto so = pm.options(), co = pm.options().dtype(cdt);
  auto hs = at::zeros({T + 1, B, H}, co);      // h_0 .. h_T, matmul operands
  auto cs = at::zeros({T + 1, B, H}, so);      // c_0 .. c_T
  auto tcs = at::empty({T, B, H}, so);         // tanh(c_t)
  auto gates = at::empty({T, B, 4 * H}, so);   // activated [si, sf, so, tu]
  auto ms = at::empty({T, B, H}, co);          // m_t
  auto rs = at::empty({T, B, H}, co);          // W_mh h_{t-1}
  auto gmm = at::empty({B, 4 * H}, co);        // W_m m_t, reused every step
  auto* pm_p = pm.data_ptr<typename S::T>();
  auto* pg_p = pg.data_ptr<typename S::T>();
  auto* hs_p = reinterpret_cast<typename C::T*>(hs.data_ptr());
  auto* ms_p = reinterpret_cast<typename C::T*>(ms.data_ptr());
  auto* rs_p = reinterpret_cast<typename C::T*>(rs.data_ptr());
  auto* cs_p = cs.data_ptr<typename S::T>();
  auto* tcs_p = tcs.data_ptr<typename S::T>();
  auto* g_p = gates.data_ptr<typename S::T>();
  const int64_t n = B * H, grain = grain_rows(H);
  for (int64_t t = 0; t < T; ++t) {
    auto r = rs.select(0, t);
    if (dnn_r) r.copy_(onednn_linear(hs.select(0, t), w_mh));  // kept for backward
    else at::mm_out(r, hs.select(0, t), w_mh.t());             // (B, H)
    {
      MLSTM_RECORD("mlstm_cpu::fwd_m");
      K::fm(n, pm_p + t * n, rs_p + t * n, ms_p + t * n);
    }
    auto q = lin(gmm, ms.select(0, t), w_m, dnn_g).contiguous();  // (B, 4H)
    auto* q_p = reinterpret_cast<const typename C::T*>(q.data_ptr());
    MLSTM_RECORD("mlstm_cpu::fwd_gates");
    at::parallel_for(0, B, grain, [&](int64_t b0, int64_t b1) {
      K::fg(b0, b1, H, pg_p + t * 4 * n, q_p, g_p + t * 4 * n, cs_p + t * n, cs_p + (t + 1) * n,
            tcs_p + t * n, hs_p + (t + 1) * n);
    });
  }
  return {hs, cs, tcs, gates, ms, rs};
}

template <class C, class S>
std::vector<at::Tensor> backward_impl(const at::Tensor& dyt, const at::Tensor& gates, const at::Tensor& cs,
                                      const at::Tensor& tcs, const at::Tensor& rs, const at::Tensor& pm,
                                      const at::Tensor& w_mh_t, const at::Tensor& w_m_t, bool dnn_m, bool dnn_h) {
  using K = Kernels<C, S>;
  const int64_t T = pm.size(0), B = pm.size(1), H = pm.size(2);
  auto co = rs.options();
  auto dG = at::empty({T, B, 4 * H}, co);  // d(pre-activations [i, f, o, u])
  auto dPm = at::empty({T, B, H}, co);     // d(W_mx x_t)
  auto dR = at::empty({T, B, H}, co);      // d(W_mh h_{t-1})
  auto dc = at::zeros({B, H}, pm.options());
  auto dhn = at::zeros({B, H}, co);        // dL/dh_t from step t+1 (through W_mh)
  auto dm = at::empty({B, H}, co);
  auto* dy_p = dyt.data_ptr<typename S::T>();
  auto* g_p = gates.data_ptr<typename S::T>();
  auto* cs_p = cs.data_ptr<typename S::T>();
  auto* tcs_p = tcs.data_ptr<typename S::T>();
  auto* pm_p = pm.data_ptr<typename S::T>();
  auto* dc_p = dc.data_ptr<typename S::T>();
  auto* rs_p = reinterpret_cast<const typename C::T*>(rs.data_ptr());
  auto* dG_p = reinterpret_cast<typename C::T*>(dG.data_ptr());
  auto* dPm_p = reinterpret_cast<typename C::T*>(dPm.data_ptr());
  auto* dR_p = reinterpret_cast<typename C::T*>(dR.data_ptr());
  const int64_t n = B * H, grain = grain_rows(H);
  at::Tensor dh_in = dhn;  // dL/dh_t arriving from step t+1 (zero at the last step)
  for (int64_t t = T - 1; t >= 0; --t) {
    auto* dhn_p = reinterpret_cast<const typename C::T*>(dh_in.data_ptr());
    {
      MLSTM_RECORD("mlstm_cpu::bwd_gates");
      at::parallel_for(0, B, grain, [&](int64_t b0, int64_t b1) {
        K::bg(b0, b1, H, dy_p + t * n, dhn_p, g_p + t * 4 * n, cs_p + t * n, tcs_p + t * n, dc_p,
              dG_p + t * 4 * n);
      });
    }
    auto dmt = lin(dm, dG.select(0, t), w_m_t, dnn_m).contiguous();  // (B, 4H) @ W_m -> (B, H)
    {
      MLSTM_RECORD("mlstm_cpu::bwd_m");
      K::bm(n, reinterpret_cast<const typename C::T*>(dmt.data_ptr()), rs_p + t * n, pm_p + t * n,
            dPm_p + t * n, dR_p + t * n);
    }
    if (t > 0) dh_in = lin(dhn, dR.select(0, t), w_mh_t, dnn_h).contiguous();  // (B, H) @ W_mh -> (B, H)
  }
  return {dG, dPm, dR};
}

void check(bool ok, const char* what) { TORCH_CHECK(ok, "mlstm_cpu: ", what); }

void check_common(const at::Tensor& pm, const at::Tensor& w_mh, const at::Tensor& w_m) {
  check(pm.device().is_cpu() && w_mh.device().is_cpu() && w_m.device().is_cpu(), "CPU tensors only");
  check(pm.dim() == 3 && w_mh.dim() == 2 && w_m.dim() == 2, "pm (T, B, H), w_mh (H, H), w_m (4H, H)");
  const int64_t H = pm.size(2);
  check(w_mh.size(0) == H && w_mh.size(1) == H && w_m.size(0) == 4 * H && w_m.size(1) == H, "weight shapes");
  check(w_mh.scalar_type() == w_m.scalar_type(), "w_mh and w_m share the compute dtype");
}

#define MLSTM_DISPATCH(cdt, sdt, CALL, ...)                                                                  \
  if (cdt == at::kFloat && sdt == at::kFloat) return CALL<F32, F32>(__VA_ARGS__);                            \
  if (cdt == at::kBFloat16 && sdt == at::kFloat) return CALL<BF16, F32>(__VA_ARGS__);                        \
  if (cdt == at::kDouble && sdt == at::kDouble) return CALL<F64, F64>(__VA_ARGS__);                          \
  TORCH_CHECK(false, "mlstm_cpu: unsupported compute/state dtypes ", cdt, "/", sdt);

// pm (T, B, H) = W_mx x_t and pg (T, B, 4H) = W_x x_t + b, both in the state dtype; w_mh (H, H) and
// w_m (4H, H) in the compute dtype. Returns hs (T+1, B, H), cs (T+1, B, H), tcs (T, B, H),
// gates (T, B, 4H), ms (T, B, H), rs (T, B, H).
// dnn_r / dnn_g: take the recurrent product W_mh h / the gate product W_m m through oneDNN (else mm).
std::vector<at::Tensor> forward(const at::Tensor& pm_, const at::Tensor& pg_, const at::Tensor& w_mh_,
                                const at::Tensor& w_m_, bool dnn_r, bool dnn_g) {
  check_common(pm_, w_mh_, w_m_);
  auto pm = pm_.contiguous(), pg = pg_.contiguous(), w_mh = w_mh_.contiguous(), w_m = w_m_.contiguous();
  check(pg.scalar_type() == pm.scalar_type() && pg.size(2) == 4 * pm.size(2), "pg (T, B, 4H) state dtype");
  at::NoGradGuard no_grad;
  MLSTM_DISPATCH(w_mh.scalar_type(), pm.scalar_type(), forward_impl, pm, pg, w_mh, w_m, dnn_r, dnn_g)
}

// dyt (T, B, H) state dtype and the forward's saved tensors -> dG (T, B, 4H), dPm (T, B, H), dR (T, B, H)
// in the compute dtype. w_mh_t = W_mh^T (H, H) and w_m_t = W_m^T (H, 4H), so both backward products are
// x @ w^T like the forward's; dnn_m / dnn_h route them to oneDNN.
std::vector<at::Tensor> backward(const at::Tensor& dyt_, const at::Tensor& gates, const at::Tensor& cs,
                                 const at::Tensor& tcs, const at::Tensor& rs, const at::Tensor& pm,
                                 const at::Tensor& w_mh_, const at::Tensor& w_m_, bool dnn_m, bool dnn_h) {
  check_common(pm, w_mh_, w_m_.t());
  auto dyt = dyt_.contiguous(), w_mh = w_mh_.contiguous(), w_m = w_m_.contiguous();
  check(dyt.scalar_type() == pm.scalar_type() && dyt.sizes() == pm.sizes(), "dyt (T, B, H) state dtype");
  check(gates.is_contiguous() && cs.is_contiguous() && tcs.is_contiguous() && rs.is_contiguous() &&
            pm.is_contiguous(),
        "saved tensors are contiguous");
  at::NoGradGuard no_grad;
  MLSTM_DISPATCH(w_mh.scalar_type(), pm.scalar_type(), backward_impl, dyt, gates, cs, tcs, rs, pm, w_mh, w_m, dnn_m, dnn_h)
}

}  // namespace

TORCH_LIBRARY(mlstm_cpu, m) {
  m.def("forward(Tensor pm, Tensor pg, Tensor w_mh, Tensor w_m, bool dnn_r, bool dnn_g) -> Tensor[]");
  m.def(
      "backward(Tensor dyt, Tensor gates, Tensor cs, Tensor tcs, Tensor rs, Tensor pm, Tensor w_mh_t, "
      "Tensor w_m_t, bool dnn_m, bool dnn_h) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(mlstm_cpu, CPU, m) {
  m.impl("forward", &forward);
  m.impl("backward", &backward);
}

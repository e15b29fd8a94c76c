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
// `isa(level)` can lower it (the tests run all three on one machine). The math auto-vectorises: no libm
// calls in the float path (a Cephes-style exp, tanh from a polynomial near 0 / from exp elsewhere, both
// within a few ulp of libm) and GCC vector extensions for the GEMM tiles.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <torch/library.h>

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#define AI __attribute__((always_inline)) inline

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MLSTM_X86 1
#define ISA_V4 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512cd,avx2,fma,bmi,bmi2,f16c")))
#define ISA_V3 __attribute__((target("avx2,fma,bmi,bmi2,f16c")))
#else
#define MLSTM_X86 0
#endif

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
  // n = round(x / ln2) by the 1.5 * 2^23 trick: plain adds, so it vectorises on SSE2 too (floor needs
  // SSE4.1); |x / ln2| <= 128 is far inside its exact range.
  float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
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

// ---- epilogues: the elementwise work of a step, applied to finished product values ----------------------
// Product values arrive unrounded (accumulator = state type S); each epilogue first rounds them to the
// compute dtype, as a product stored in that dtype would be (the Python core's semantics). Per-step
// buffers are (B, .) with row b at b * width; tensors laid out (B, T, .) are passed as step-t pointers
// with a row stride (`*_b`), so x, y, dy, dP keep the caller's layout and nothing is transposed.
// proj rows (5H) = [W_mx x | W_x x]; dP rows (5H) = [d(pm) | dG], dG = d(pre-activations [i, f, o, u]);
// gates (B, 4H) activated [si, sf, so, tu]. NC > 0: a full tile of NC columns (a constant trip count, so
// the loop vectorises at exactly that width); NC = 0: `nc` columns.

// r = h_{t-1} W_mh^T: keep r and pm (for backward), m = pm * r (the next product's operand, kept too).
template <class C, class S>
struct FwdM {
  using CT = typename C::T;
  using ST = typename S::T;
  CT *r, *m;     // (B, H)
  const ST* pm;  // row stride pm_b
  ST* pms;       // (B, H)
  int64_t H, pm_b;
  template <int NC>
  AI void cols(int64_t b, int64_t n0, int64_t nc, const ST* v) const {
    const int64_t n = NC ? NC : nc, o = b * H + n0;
    const ST* p = pm + b * pm_b + n0;
#pragma omp simd
    for (int64_t k = 0; k < n; ++k) {
      CT rv = C::st(v[k]);
      ST pv = p[k];
      r[o + k] = rv;
      pms[o + k] = pv;
      m[o + k] = C::st(pv * C::ld(rv));
    }
  }
};

// q = m W_m^T: pre-activations (pg + bias) + q -> gates, c_t, tanh c_t, h_t, for units [j0, j0 + nu).
template <class C, class S>
struct Gates {
  using CT = typename C::T;
  using ST = typename S::T;
  const ST *pg, *bias;  // pg row stride pg_b
  ST* gates;
  const ST* cp;
  ST *c, *tc;
  CT *h, *y;  // h (B, H); y row stride y_b
  int64_t H, pg_b, y_b;
  template <int NC>
  AI void units(int64_t b, int64_t j0, int64_t nu, const ST* qi, const ST* qf, const ST* qo,
                const ST* qu) const {
    const int64_t n = NC ? NC : nu, o = b * H + j0;
    const ST* p = pg + b * pg_b + j0;
    const ST* bi = bias + j0;
    ST* g = gates + b * 4 * H + j0;
    CT* yo = y + b * y_b + j0;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) {
      ST si = sigmoid_(ST((p[j] + bi[j]) + C::ld(C::st(qi[j]))));
      ST sf = sigmoid_(ST((p[H + j] + bi[H + j]) + C::ld(C::st(qf[j]))));
      ST so = sigmoid_(ST((p[2 * H + j] + bi[2 * H + j]) + C::ld(C::st(qo[j]))));
      ST tu = tanh_(ST((p[3 * H + j] + bi[3 * H + j]) + C::ld(C::st(qu[j]))));
      ST cn = sf * cp[o + j] + si * tu;
      ST tcn = tanh_(cn);
      CT hv = C::st(so * tcn);
      g[j] = si;
      g[H + j] = sf;
      g[2 * H + j] = so;
      g[3 * H + j] = tu;
      c[o + j] = cn;
      tc[o + j] = tcn;
      h[o + j] = hv;
      yo[j] = hv;
    }
  }
};

// dm = dG W_m: d(pm) = dm * r into dP[:, :H], d(r) = dm * pm.
template <class C, class S>
struct BwdM {
  using CT = typename C::T;
  using ST = typename S::T;
  CT *dpm, *dr;  // dpm row stride dp_b; dr (B, H)
  const CT* r;
  const ST* pm;
  int64_t H, dp_b;
  template <int NC>
  AI void cols(int64_t b, int64_t n0, int64_t nc, const ST* v) const {
    const int64_t n = NC ? NC : nc, o = b * H + n0;
    CT* a = dpm + b * dp_b + n0;
#pragma omp simd
    for (int64_t k = 0; k < n; ++k) {
      ST dm = C::ld(C::st(v[k]));
      a[k] = C::st(dm * C::ld(r[o + k]));
      dr[o + k] = C::st(dm * pm[o + k]);
    }
  }
};

// dh_next = d(r) W_mh (or zero at the last step): every derivative of step s for units [j0, j0 + nu).
// dh = dy + dh_next; dc carries dL/dc_s * sf_{s+1} from the later step and leaves with dL/dc_s * sf_s.
// dG goes to dP (row stride dp_b; the next product reads it there) and into the bias gradient db (4H,)
// (the sum of dG over all rows and steps, as stored: rounded to the compute dtype).
template <class C, class S>
struct BwdGates {
  using CT = typename C::T;
  using ST = typename S::T;
  const ST* dy;  // row stride dy_b
  const ST *gates, *cp, *tc;
  ST *dc, *db;
  CT* dG;
  int64_t H, dy_b, dp_b;
  template <int NC>
  AI void cols(int64_t b, int64_t j0, int64_t nc, const ST* dhn) const {
    const int64_t n = NC ? NC : nc, o = b * H + j0;
    const ST* g = gates + b * 4 * H + j0;
    const ST* dyr = dy + b * dy_b + j0;
    CT* d = dG + b * dp_b + j0;
    ST* s = db + j0;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) {
      ST si = g[j], sf = g[H + j], so = g[2 * H + j], tu = g[3 * H + j], t = tc[o + j];
      ST dh = dyr[j] + C::ld(C::st(dhn[j]));
      ST dcn = dc[o + j] + dh * so * (ST(1) - t * t);
      CT di = C::st(dcn * tu * (si - si * si));
      CT df = C::st(dcn * cp[o + j] * (sf - sf * sf));
      CT dq = C::st(dh * t * (so - so * so));
      CT du = C::st(dcn * si * (ST(1) - tu * tu));
      d[j] = di;
      d[H + j] = df;
      d[2 * H + j] = dq;
      d[3 * H + j] = du;
      s[j] += C::ld(di);
      s[H + j] += C::ld(df);
      s[2 * H + j] += C::ld(dq);
      s[3 * H + j] += C::ld(du);
      dc[o + j] = dcn * sf;
    }
  }
};

// A plain product: store it (the op packed_linear, used to time and test the GEMM).
template <class C, class S>
struct Store {
  typename C::T* out;
  int64_t ld;
  template <int NC>
  AI void cols(int64_t b, int64_t n0, int64_t nc, const typename S::T* v) const {
    const int64_t n = NC ? NC : nc;
    typename C::T* o = out + b * ld + n0;
#pragma omp simd
    for (int64_t k = 0; k < n; ++k) o[k] = C::st(v[k]);
  }
};

// A product kept unrounded in the state type (the gate product, for a separate full-width gate pass).
template <class C, class S>
struct Keep {
  typename S::T* out;
  int64_t ld;
  template <int NC>
  AI void cols(int64_t b, int64_t n0, int64_t nc, const typename S::T* v) const {
    const int64_t n = NC ? NC : nc;
    typename S::T* o = out + b * ld + n0;
#pragma omp simd
    for (int64_t k = 0; k < n; ++k) o[k] = v[k];
  }
};

// ---- the packed GEMM ------------------------------------------------------------------------------------
// out (M, N) = a (M, K, row stride lda, compute dtype) @ B (K, N), with B packed as column panels of NR:
// panel p holds B[k][p*NR + c] at bp[(p*K + k)*NR + c], zero-padded past N. Accumulation in the state type
// (fp32 for fp32/bf16 operands, fp64 for fp64): a bf16 x bf16 product is exact in fp32, so bf16 operands
// against a weight unpacked to fp32 give what a bf16 GEMM with fp32 accumulation gives.
template <class T, int W>
struct Vec {
  typedef T type __attribute__((vector_size(W * sizeof(T)), aligned(sizeof(T))));
};

// One MR x (NV*W) register tile over all K; writes the accumulators to tmp (MR rows of NV*W). PF: also
// fetch the next panel `pf` into L2 as this one is read, line for line (the first row tile of a panel
// does it): the weights of a large layer do not stay in cache between steps, and a panel streamed from
// DRAM on demand stalled the kernel.
template <class C, class A, int W, int MR, int NV, bool PF>
AI void micro(int64_t K, const typename C::T* a, int64_t lda, const A* bp, A* tmp, const A* pf) {
  using V = typename Vec<A, W>::type;
  V acc[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NV; ++j) acc[i][j] = V{};
  for (int64_t k = 0; k < K; ++k) {
    V b[NV];
    for (int j = 0; j < NV; ++j) b[j] = *reinterpret_cast<const V*>(bp + (k * NV + j) * W);
    if constexpr (PF) {
      constexpr int lines = NV * W * sizeof(A) >= 64 ? NV * W * sizeof(A) / 64 : 1;  // per k
      for (int j = 0; j < lines; ++j) __builtin_prefetch(pf + k * NV * W + j * (64 / sizeof(A)), 0, 2);
    }
    for (int i = 0; i < MR; ++i) {
      const A x = C::ld(a[i * lda + k]);
      for (int j = 0; j < NV; ++j) acc[i][j] += x * b[j];
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NV; ++j) *reinterpret_cast<V*>(tmp + (i * NV + j) * W) = acc[i][j];
}

// The loop over panels (outer: each panel is read from L2/L3 once per step) and row tiles (inner). Rows
// past the last full tile run on a zero-padded copy in `scratch` (MR x K), so one tile shape serves any B.
template <class C, class A, int W, int MR, int NV, class E>
AI void gemm(int64_t M, int64_t N, int64_t K, const typename C::T* a, int64_t lda, const A* bp,
             typename C::T* scratch, const E& e) {
  constexpr int NR = NV * W;
  const int64_t np = (N + NR - 1) / NR;
  const int64_t mfull = M - M % MR;
  if (mfull < M) {
    std::memset(static_cast<void*>(scratch), 0, sizeof(typename C::T) * MR * K);
    for (int64_t i = mfull; i < M; ++i)
      std::memcpy(scratch + (i - mfull) * K, a + i * lda, sizeof(typename C::T) * K);
  }
  alignas(64) A tmp[MR * NR];
  for (int64_t p = 0; p < np; ++p) {
    const A* panel = bp + p * K * NR;
    const int64_t n0 = p * NR, nc = std::min<int64_t>(NR, N - n0);
    for (int64_t m = 0; m < M; m += MR) {
      const bool full = m < mfull;
      const typename C::T* at = full ? a + m * lda : scratch;
      if (m == 0 && p + 1 < np) micro<C, A, W, MR, NV, true>(K, at, full ? lda : K, panel, tmp, panel + K * NR);
      else micro<C, A, W, MR, NV, false>(K, at, full ? lda : K, panel, tmp, nullptr);
      const int64_t rows = full ? MR : M - m;
      for (int64_t i = 0; i < rows; ++i) {
        if (nc == NR) e.template cols<NR>(m + i, n0, NR, tmp + i * NR);
        else e.template cols<0>(m + i, n0, nc, tmp + i * NR);
      }
    }
  }
}

// Pack src (N outputs x K, element [n][k] at src[n*sn + k*sk]) into panels of NR (state type), reading
// along whichever of n, k is contiguous in src.
template <class C, class A>
void pack(const typename C::T* src, int64_t N, int64_t K, int64_t sn, int64_t sk, int NR, A* out) {
  const int64_t np = (N + NR - 1) / NR;
  for (int64_t p = 0; p < np; ++p) {
    A* o = out + p * K * NR;
    const int64_t nc = std::min<int64_t>(NR, N - p * NR);
    const typename C::T* s = src + p * NR * sn;
    if (sn == 1) {
      for (int64_t k = 0; k < K; ++k)
        for (int64_t c = 0; c < NR; ++c) o[k * NR + c] = c < nc ? C::ld(s[k * sk + c]) : A(0);
    } else {
      for (int64_t c = 0; c < NR; ++c)
        for (int64_t k = 0; k < K; ++k) o[k * NR + c] = c < nc ? C::ld(s[c * sn + k * sk]) : A(0);
    }
  }
}

int64_t packed_size(int64_t N, int64_t K, int NR) { return (N + NR - 1) / NR * K * NR; }

// ---- per-ISA instantiation -----------------------------------------------------------------------------
// The function table one ISA level provides for one (compute, state) dtype pair.
template <class C, class S>
struct Fns {
  using CT = typename C::T;
  using ST = typename S::T;
  // GEMM with each epilogue: (M, N, K, a, lda, packed, scratch, epilogue)
  using GFwdM = void (*)(int64_t, int64_t, int64_t, const CT*, int64_t, const ST*, CT*, const FwdM<C, S>&);
  using GBwdM = void (*)(int64_t, int64_t, int64_t, const CT*, int64_t, const ST*, CT*, const BwdM<C, S>&);
  using GStore = void (*)(int64_t, int64_t, int64_t, const CT*, int64_t, const ST*, CT*, const Store<C, S>&);
  using GKeep = void (*)(int64_t, int64_t, int64_t, const CT*, int64_t, const ST*, CT*, const Keep<C, S>&);
  using PGatesS = void (*)(int64_t, int64_t, const ST*, const Gates<C, S>&);  // q in the state type
  using PBwdGS = void (*)(int64_t, int64_t, const ST*, const BwdGates<C, S>&);
  // the same epilogues as passes over a plain (B, N) product in the compute dtype (paths mm / onednn)
  using PFwdM = void (*)(int64_t, int64_t, const CT*, const FwdM<C, S>&);
  using PGates = void (*)(int64_t, int64_t, const CT*, const Gates<C, S>&);
  using PBwdM = void (*)(int64_t, int64_t, const CT*, const BwdM<C, S>&);
  using PBwdG = void (*)(int64_t, int64_t, const CT*, const BwdGates<C, S>&);
  struct Tile {
    int nr;
    GFwdM fwd_m;
    GBwdM bwd_m;
    GStore store;
    GKeep keep;
  };
  Tile tile[2];
  PFwdM p_fwd_m;
  PGates p_gates;
  PGatesS p_gates_s;
  PBwdGS p_bwd_gates_s;
  PBwdM p_bwd_m;
  PBwdG p_bwd_gates;  // dhn == nullptr: zero
};

// Plain passes: rows [0, B) of a (B, N) product `q` in the compute dtype, converted row by row.
template <class C, class S, class E>
AI void plain_cols(int64_t B, int64_t N, const typename C::T* q, const E& e) {
  std::vector<typename S::T> row(N);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t k = 0; k < N; ++k) row[k] = q ? C::ld(q[b * N + k]) : typename S::T(0);
    e.template cols<0>(b, 0, N, row.data());
  }
}
template <class C, class S, class E>
AI void plain_cols_s(int64_t B, int64_t N, const typename S::T* q, const E& e) {
  for (int64_t b = 0; b < B; ++b) e.template cols<0>(b, 0, N, q + b * N);
}
template <class C, class S>
AI void plain_gates_s(int64_t B, int64_t N, const typename S::T* q, const Gates<C, S>& e) {
  const int64_t H = N / 4;
  for (int64_t b = 0; b < B; ++b) {
    const typename S::T* r = q + b * N;
    e.template units<0>(b, 0, H, r, r + H, r + 2 * H, r + 3 * H);
  }
}
template <class C, class S>
AI void plain_gates(int64_t B, int64_t N, const typename C::T* q, const Gates<C, S>& e) {
  std::vector<typename S::T> row(N);
  const int64_t H = N / 4;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t k = 0; k < N; ++k) row[k] = C::ld(q[b * N + k]);
    e.template units<0>(b, 0, H, row.data(), row.data() + H, row.data() + 2 * H, row.data() + 3 * H);
  }
}

// Defines namespace NS with target attribute ATTR: float vectors of WF lanes, tiles (MR0 x NV0 vectors)
// and (MR1 x NV1 vectors); doubles use WF/2 lanes with the same tiles.
#define MLSTM_ISA(NS, ATTR, WF, MR0, NV0, MR1, NV1)                                                          \
  namespace NS {                                                                                             \
  template <class C, class S, int MR, int NV, class E>                                                       \
  ATTR void g(int64_t M, int64_t N, int64_t K, const typename C::T* a, int64_t lda,                          \
              const typename S::T* bp, typename C::T* scr, const E& e) {                                     \
    constexpr int W = sizeof(typename S::T) == 8 ? WF / 2 : WF;                                              \
    gemm<C, typename S::T, W, MR, NV>(M, N, K, a, lda, bp, scr, e);                                          \
  }                                                                                                          \
  template <class C, class S, class E>                                                                       \
  ATTR void p(int64_t B, int64_t N, const typename C::T* q, const E& e) {                                    \
    plain_cols<C, S>(B, N, q, e);                                                                            \
  }                                                                                                          \
  template <class C, class S>                                                                                \
  ATTR void pg(int64_t B, int64_t N, const typename C::T* q, const Gates<C, S>& e) {                         \
    plain_gates<C, S>(B, N, q, e);                                                                           \
  }                                                                                                          \
  template <class C, class S, class E>                                                                       \
  ATTR void ps(int64_t B, int64_t N, const typename S::T* q, const E& e) {                                   \
    plain_cols_s<C, S>(B, N, q, e);                                                                          \
  }                                                                                                          \
  template <class C, class S>                                                                                \
  ATTR void pgs(int64_t B, int64_t N, const typename S::T* q, const Gates<C, S>& e) {                        \
    plain_gates_s<C, S>(B, N, q, e);                                                                         \
  }                                                                                                          \
  template <class C, class S, int MR, int NV>                                                                \
  typename Fns<C, S>::Tile tile() {                                                                \
    constexpr int W = sizeof(typename S::T) == 8 ? WF / 2 : WF;                                              \
    return {NV * W,                                                                                          \
            &g<C, S, MR, NV, FwdM<C, S>>,                                                                    \
            &g<C, S, MR, NV, BwdM<C, S>>,                                                                    \
            &g<C, S, MR, NV, Store<C, S>>,                                                                   \
            &g<C, S, MR, NV, Keep<C, S>>};                                                                   \
  }                                                                                                          \
  template <class C, class S>                                                                                \
  Fns<C, S> fns() {                                                                                          \
    return {{tile<C, S, MR0, NV0>(), tile<C, S, MR1, NV1>()},                                                \
            &p<C, S, FwdM<C, S>>,                                                                            \
            &pg<C, S>,                                                                                       \
            &pgs<C, S>,                                                                                      \
            &ps<C, S, BwdGates<C, S>>,                                                                       \
            &p<C, S, BwdM<C, S>>,                                                                            \
            &p<C, S, BwdGates<C, S>>};                                                                       \
  }                                                                                                          \
  const char* const tile_names[2] = {#NS "_" #MR0 "x" #NV0, #NS "_" #MR1 "x" #NV1};                          \
  }

// Register budgets: AVX-512 has 32 vector registers (tiles of 24 / 16 accumulators), AVX2 and SSE2 have
// 16 (12 / 8 accumulators). NV * lanes must be a multiple of 4 (gate-interleaved panels).
#if MLSTM_X86
MLSTM_ISA(avx512, ISA_V4, 16, 6, 4, 8, 2)
MLSTM_ISA(avx2, ISA_V3, 8, 4, 3, 6, 2)
#endif
MLSTM_ISA(base, , 4, 4, 2, 6, 2)

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
// the next step's tensor of the same size. Free buffers are capped at the most bytes ever live at once,
// so the pool holds at most what one step needs; large blocks ask for transparent huge pages (fewer
// faults and TLB misses where the kernel allows them).
class Pool {
 public:
  void* get(size_t bytes) {
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
    }
    const size_t align = bytes >= (size_t(2) << 20) ? size_t(2) << 20 : 64;
    void* p = std::aligned_alloc(align, (bytes + align - 1) / align * align);
    TORCH_CHECK(p, "mlstm_cpu: out of memory allocating ", bytes, " bytes");
#ifdef MADV_HUGEPAGE
    if (align > 64) madvise(p, (bytes + align - 1) / align * align, MADV_HUGEPAGE);
#endif
    return p;
  }
  void put(void* p, size_t bytes) {
    std::vector<void*> drop;
    {
      std::lock_guard<std::mutex> g(mu_);
      live_ -= bytes;
      free_.emplace(bytes, p);
      cached_ += bytes;
      while (cached_ > peak_ && !free_.empty()) {  // drop the largest first
        auto it = std::prev(free_.end());
        cached_ -= it->first;
        drop.push_back(it->second);
        free_.erase(it);
      }
    }
    for (void* q : drop) std::free(q);
  }

 private:
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
  int tile = 0;

  Product(int64_t path_, const at::Tensor& wsrc /* (N, K) view */, int64_t B) : path(path_) {
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
      const int nr = fns<C, S>().tile[tile].nr;
      auto so = wsrc.options().dtype(c10::CppTypeToScalarType<typename S::T>::value);
      packed = pooled({packed_size(N, K, nr)}, so.dtype().toScalarType());
      pack<C, typename S::T>(reinterpret_cast<const typename C::T*>(wsrc.data_ptr()), N, K, wsrc.stride(0),
                             wsrc.stride(1), nr, packed.data_ptr<typename S::T>());
      scratch = pooled({8 * K}, wsrc.scalar_type());  // MR <= 8
    }
  }
  bool is_packed() const { return path >= PATH_TILE0; }
  const typename S::T* bp() const { return packed.data_ptr<typename S::T>(); }
  typename C::T* scr() const { return reinterpret_cast<typename C::T*>(scratch.data_ptr()); }
  // ATen paths: x (B, K) -> out (B, N) in the compute dtype; returns its data.
  const typename C::T* aten(const at::Tensor& x) {
    if (path == PATH_ONEDNN) out = onednn_linear(x, w).contiguous();
    else at::mm_out(out, x, w);
    return reinterpret_cast<const typename C::T*>(out.data_ptr());
  }
};

template <class C, class S>
std::vector<at::Tensor> forward_impl(const at::Tensor& proj, const at::Tensor& bias, const at::Tensor& w_mh,
                                     const at::Tensor& w_m, int64_t path_r, int64_t path_g) {
  using CT = typename C::T;
  using ST = typename S::T;
  const auto& F = fns<C, S>();
  const int64_t B = proj.size(0), T = proj.size(1), H = w_mh.size(0);
  const auto sd = proj.scalar_type(), cd = w_mh.scalar_type();
  auto y = pooled({B, T, H}, cd);          // h_1 .. h_T in the caller's layout
  auto hs = pooled({T + 1, B, H}, cd);     // h_0 .. h_T, matmul operands
  auto cs = pooled({T + 1, B, H}, sd);     // c_0 .. c_T
  hs.select(0, 0).zero_();
  cs.select(0, 0).zero_();
  auto tcs = pooled({T, B, H}, sd);        // tanh(c_t)
  auto gates = pooled({T, B, 4 * H}, sd);  // activated [si, sf, so, tu]
  auto ms = pooled({T, B, H}, cd);         // m_t
  auto rs = pooled({T, B, H}, cd);         // W_mh h_{t-1}
  auto pms = pooled({T, B, H}, sd);        // W_mx x_t
  Product<C, S> pr(path_r, w_mh, B), pq(path_g, w_m, B);
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
  for (int64_t t = 0; t < T; ++t) {
    const ST* pt = pj + t * pj_t;
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
    FwdM<C, S> em{rs_p + t * n, ms_p + t * n, pt, pms_p + t * n, H, pj_b};
    Gates<C, S> eg{pt + H, bias.data_ptr<ST>(), g_p + t * 4 * n, cs_p + t * n, cs_p + (t + 1) * n,
                   tcs_p + t * n, hs_p + (t + 1) * n, y_p + t * H, H, pj_b, T * H};
    if (pr.is_packed()) {
      MLSTM_RECORD("mlstm_cpu::gemm_m");
      F.tile[pr.tile].fwd_m(B, H, H, hs_p + t * n, H, pr.bp(), pr.scr(), em);
    } else {
      const CT* q = pr.aten(hs.select(0, t));  // (B, H)
      MLSTM_RECORD("mlstm_cpu::fwd_m");
      F.p_fwd_m(B, H, q, em);
    }
    if (pq.is_packed()) {
      {
        MLSTM_RECORD("mlstm_cpu::gemm_q");
        F.tile[pq.tile].keep(B, 4 * H, H, ms_p + t * n, H, pq.bp(), pq.scr(), Keep<C, S>{q_p, 4 * H});
      }
      MLSTM_RECORD("mlstm_cpu::fwd_gates");
      F.p_gates_s(B, 4 * H, q_p, eg);
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
  Product<C, S> pmp(path_m, w_m.t(), B), php(path_h, w_mh.t(), B);
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
  for (int64_t t = T - 1; t >= 0; --t) {
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
    BwdM<C, S> em{dP_p + t * 5 * n, dR_p + t * n, rs_p + t * n, pm_p + t * n, H, dp_b};
    if (pmp.is_packed()) {
      MLSTM_RECORD("mlstm_cpu::gemm_dm");
      F.tile[pmp.tile].bwd_m(B, H, 4 * H, dP_p + t * 5 * n + H, 5 * H, pmp.bp(), pmp.scr(), em);
    } else {
      const CT* q = pmp.aten(dP.select(0, t).narrow(1, H, 4 * H));  // (B, H)
      MLSTM_RECORD("mlstm_cpu::bwd_m");
      F.p_bwd_m(B, H, q, em);
    }
    if (t == 0) break;
    if (php.is_packed()) {
      {
        MLSTM_RECORD("mlstm_cpu::gemm_dh");
        F.tile[php.tile].keep(B, H, H, dR_p + t * n, H, php.bp(), php.scr(), Keep<C, S>{dq_p, H});
      }
      MLSTM_RECORD("mlstm_cpu::bwd_gates");
      F.p_bwd_gates_s(B, H, dq_p, bg(t - 1));
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
// bias (4H,) state dtype; w_mh (H, H) and w_m (4H, H) in the compute dtype. Returns y (B, T, H) = h_1..h_T,
// and for backward hs (T+1, B, H) h_0..h_T, cs (T+1, B, H) c_0..c_T, tcs (T, B, H) tanh c_t, gates
// (T, B, 4H), ms (T, B, H) m_t, rs (T, B, H) W_mh h_{t-1}, pms (T, B, H) W_mx x_t. path_r / path_g: the
// path of the product W_mh h / W_m m (0 mm, 1 oneDNN, 2 + i packed with tile i of the active ISA level).
std::vector<at::Tensor> forward(const at::Tensor& proj_, const at::Tensor& bias_, const at::Tensor& w_mh_,
                                const at::Tensor& w_m_, int64_t path_r, int64_t path_g) {
  check(proj_.device().is_cpu() && proj_.dim() == 3 && proj_.size(2) % 5 == 0, "proj (B, T, 5H) on CPU");
  const int64_t H = proj_.size(2) / 5;
  check_weights(w_mh_, w_m_, H);
  auto proj = proj_.stride(2) == 1 ? proj_ : proj_.contiguous();
  auto bias = bias_.contiguous(), w_mh = w_mh_.contiguous(), w_m = w_m_.contiguous();
  check(bias.scalar_type() == proj.scalar_type() && bias.numel() == 4 * H, "bias (4H,) in the state dtype");
  at::NoGradGuard no_grad;
  MLSTM_DISPATCH(w_mh.scalar_type(), proj.scalar_type(), forward_impl, proj, bias, w_mh, w_m, path_r, path_g)
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
  auto scratch = at::empty({8 * K}, x.options());
  Store<C, S> e{reinterpret_cast<typename C::T*>(out.data_ptr()), N};
  F.tile[tile].store(M, N, K, reinterpret_cast<const typename C::T*>(x.data_ptr()), K,
                     packed.data_ptr<typename S::T>(), reinterpret_cast<typename C::T*>(scratch.data_ptr()), e);
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

}  // namespace

TORCH_LIBRARY(mlstm_cpu, m) {
  m.def("forward(Tensor proj, Tensor bias, Tensor w_mh, Tensor w_m, int path_r, int path_g) -> Tensor[]");
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

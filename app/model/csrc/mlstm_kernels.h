// The mLSTM step kernels (register-tiled GEMM with epilogues, gate passes) for any ISA level; no torch
// headers. app/model/csrc/mlstm_cpu.cpp (the ops) declares each level's function table with
// MLSTM_ISA_DECL; mlstm_isa_{avx512,avx2,base}.cpp define one level each with MLSTM_ISA and
// MLSTM_ISA_INSTANTIATE, so the build compiles the levels in parallel (see mlstm_cpu.cpp's header).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#define AI __attribute__((always_inline)) inline

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MLSTM_X86 1
#define ISA_V4 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512cd,avx2,fma,bmi,bmi2,f16c")))
#define ISA_V3 __attribute__((target("avx2,fma,bmi,bmi2,f16c")))
#else
#define MLSTM_X86 0
#endif

namespace mlstm_k {

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

// A product written out: rounded to the compute dtype (Store: the op packed_linear, used to time and test the
// GEMM) or kept unrounded in the state type (Keep: the gate products, for a separate full-width gate pass).
template <class C, class S, bool Round>
struct Write {
  using T = std::conditional_t<Round, typename C::T, typename S::T>;
  T* out;
  int64_t ld;
  template <int NC>
  AI void cols(int64_t b, int64_t n0, int64_t nc, const typename S::T* v) const {
    const int64_t n = NC ? NC : nc;
    T* o = out + b * ld + n0;
#pragma omp simd
    for (int64_t k = 0; k < n; ++k) {
      if constexpr (Round) o[k] = C::st(v[k]);
      else o[k] = v[k];
    }
  }
};
template <class C, class S>
using Store = Write<C, S, true>;
template <class C, class S>
using Keep = Write<C, S, false>;

// Column panels of NR a weight of N outputs is packed into.
inline int64_t panel_count(int64_t N, int NR) { return (N + NR - 1) / NR; }

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
// Only panels [p0, p1) (clipped to the panel count): threads split a product by panels, each with its own
// scratch, and every output is computed exactly as in one call over all panels.
template <class C, class A, int W, int MR, int NV, class E>
AI void gemm(int64_t M, int64_t N, int64_t K, const typename C::T* a, int64_t lda, const A* bp,
             typename C::T* scratch, const E& e, int64_t p0, int64_t p1) {
  constexpr int NR = NV * W;
  const int64_t np = std::min<int64_t>(p1, panel_count(N, NR));
  if (p0 >= np) return;
  const int64_t mfull = M - M % MR;
  if (mfull < M) {
    std::memset(static_cast<void*>(scratch), 0, sizeof(typename C::T) * MR * K);
    for (int64_t i = mfull; i < M; ++i)
      std::memcpy(scratch + (i - mfull) * K, a + i * lda, sizeof(typename C::T) * K);
  }
  alignas(64) A tmp[MR * NR];
  for (int64_t p = p0; p < np; ++p) {
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
  const int64_t np = panel_count(N, NR);
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

inline int64_t packed_size(int64_t N, int64_t K, int NR) { return panel_count(N, NR) * K * NR; }

// ---- per-ISA instantiation -----------------------------------------------------------------------------
// The function table one ISA level provides for one (compute, state) dtype pair.
template <class C, class S>
struct Fns {
  using CT = typename C::T;
  using ST = typename S::T;
  // GEMM with each epilogue: (M, N, K, a, lda, packed, scratch, epilogue, first panel, end panel)
  template <class E>
  using G = void (*)(int64_t, int64_t, int64_t, const CT*, int64_t, const ST*, CT*, const E&, int64_t, int64_t);
  using GFwdM = G<FwdM<C, S>>;
  using GBwdM = G<BwdM<C, S>>;
  using GStore = G<Store<C, S>>;
  using GKeep = G<Keep<C, S>>;
  // q in the state type: (B, N, q, epilogue, first unit, units)
  using PGatesS = void (*)(int64_t, int64_t, const ST*, const Gates<C, S>&, int64_t, int64_t);
  using PBwdGS = void (*)(int64_t, int64_t, const ST*, const BwdGates<C, S>&, int64_t, int64_t);
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
// The passes over a product kept in the state type ((B, N) with N = H, or 4H for the gates), for columns /
// units [j0, j0 + nc): threads split them by units (every unit's math is the same either way).
template <class C, class S, class E>
AI void plain_cols_s(int64_t B, int64_t N, const typename S::T* q, const E& e, int64_t j0, int64_t nc) {
  for (int64_t b = 0; b < B; ++b) e.template cols<0>(b, j0, nc, q + b * N + j0);
}
template <class C, class S>
AI void plain_gates_s(int64_t B, int64_t N, const typename S::T* q, const Gates<C, S>& e, int64_t j0,
                      int64_t nu) {
  const int64_t H = N / 4;
  for (int64_t b = 0; b < B; ++b) {
    const typename S::T* r = q + b * N + j0;
    e.template units<0>(b, j0, nu, r, r + H, r + 2 * H, r + 3 * H);
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
  ATTR void g(int64_t M, int64_t N, int64_t K, const typename C::T* a, int64_t lda,                           \
              const typename S::T* bp, typename C::T* scr, const E& e, int64_t p0, int64_t p1) {              \
    constexpr int W = sizeof(typename S::T) == 8 ? WF / 2 : WF;                                              \
    gemm<C, typename S::T, W, MR, NV>(M, N, K, a, lda, bp, scr, e, p0, p1);                                   \
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
  ATTR void ps(int64_t B, int64_t N, const typename S::T* q, const E& e, int64_t j0, int64_t nc) {            \
    plain_cols_s<C, S>(B, N, q, e, j0, nc);                                                                   \
  }                                                                                                          \
  template <class C, class S>                                                                                \
  ATTR void pgs(int64_t B, int64_t N, const typename S::T* q, const Gates<C, S>& e, int64_t j0,               \
                int64_t nu) {                                                                                 \
    plain_gates_s<C, S>(B, N, q, e, j0, nu);                                                                  \
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
  extern const char* const tile_names[2] = {#NS "_" #MR0 "x" #NV0, #NS "_" #MR1 "x" #NV1};                   \
  }


// The function tables a level's file provides, for the three (compute, state) dtype pairs the ops use.
#define MLSTM_ISA_INSTANTIATE(NS)              \
  template Fns<F32, F32> NS::fns<F32, F32>();   \
  template Fns<BF16, F32> NS::fns<BF16, F32>(); \
  template Fns<F64, F64> NS::fns<F64, F64>();
#define MLSTM_ISA_DECL(NS)                        \
  namespace NS {                                  \
  template <class C, class S>                     \
  Fns<C, S> fns();                                \
  extern const char* const tile_names[2];         \
  }

}  // namespace mlstm_k

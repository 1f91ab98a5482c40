// Fused CPU training kernels for the layers whose Paddle CPU kernels are slow on our machines
// (`python benchmarks/peers.py --run NAME --side ours --profile` shows a step's operators): bias +
// activation, bias + dropout + residual (+ LayerNorm), LayerNorm, scaled softmax + additive mask +
// dropout, BatchNorm (+ residual) + ReLU (batch or running statistics), a convolution's bias, RoIAlign
// and Mask R-CNN's polygon targets. Forward and backward, float32, contiguous row-major tensors; OpenMP
// across rows or channels, inner loops
// written for the compiler's vectoriser (no libm calls inside them: exp and erf are our own polynomial
// approximations, accurate to a few float ulps / 1.5e-7 absolute for erf).
//
// No kernel writes a subnormal float (|v| < 2^-126) where the exact result is below float32's normal
// range: it writes 0 instead (`flush`, and `fast_exp` is 0 below ln 2^-126). Intel cores compute on
// subnormal operands 70-100x slower, and one such value in a softmax row reaches every GEMM after it
// (benchmarks/denormals.py measures it). Float32 inputs that already are subnormal pass through unchanged
// (a bf16 output is never subnormal: bf16.h); the process-wide guard (flush-to-zero and
// denormals-are-zero, `runtime.flush_denormals`, engine/cpu.py) treats those, and is applied to the
// calling thread on every operator call (`zoo_apply_fp_mode`).
//
// Dropout masks come from a counter-based hash of (seed, element index), so a kernel is
// deterministic for a seed whatever the thread count; the Python side draws the seed from Paddle's
// generator (paddle.seed and recompute's RNG restore keep working). Masks are returned as uint8 and
// reused by the backward kernels.
#include <omp.h>
#include <xmmintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <vector>

#include "bf16.h"
#include "paddle/extension.h"

// ------------------------------------------------------------- floating-point mode of the threads
// The flush-to-zero (FTZ, MXCSR bit 15) and denormals-are-zero (DAZ, bit 6) guard, process-wide:
// -1 leave every thread as it is (nobody asked), 1 set both bits, 0 clear them. MXCSR is per thread:
// each operator (here and in dnnl.cc) applies the mode to its calling thread on entry, and the
// OpenMP runtime (libiomp5) copies the caller's MXCSR to its workers at every parallel region
// (KMP_INHERIT_FP_CONTROL, on by default), oneDNN's included.
namespace zoo_fp {
std::atomic<int> mode{-1};
constexpr unsigned kBits = 0x8040u;
}  // namespace zoo_fp

void zoo_apply_fp_mode() {
  const int m = zoo_fp::mode.load(std::memory_order_relaxed);
  if (m < 0) return;
  const unsigned csr = _mm_getcsr(), want = m ? (csr | zoo_fp::kBits) : (csr & ~zoo_fp::kBits);
  if (csr != want) _mm_setcsr(want);
}

extern "C" {
// Called through ctypes by ops/library.py (runtime.flush_denormals).
void zoo_set_fp_mode(int m) {
  zoo_fp::mode.store(m < 0 ? -1 : (m ? 1 : 0));
  zoo_apply_fp_mode();
}

// The MXCSR of `n` OpenMP threads in one parallel region (the tests check every thread's bits).
int zoo_threads_mxcsr(unsigned* out, int n) {
  zoo_apply_fp_mode();
  int seen = 0;
#pragma omp parallel num_threads(n)
  {
    const int t = omp_get_thread_num();
    if (t < n) out[t] = _mm_getcsr();
#pragma omp atomic
    seen++;
  }
  return seen;
}
}

namespace {

int threads() {
  static const char* env = nullptr;
  env = std::getenv("ZOO_FAST_OPS_THREADS");
  int n = env ? std::atoi(env) : 0;
  return n > 0 ? n : omp_get_num_procs();
}

constexpr float kMinNormal = 1.17549435e-38f;  // 2^-126, FLT_MIN

// v, or 0 where |v| is below float32's normal range (a subnormal result is written as exact zero)
inline float flush(float v) { return std::fabs(v) < kMinNormal ? 0.f : v; }

inline float fast_exp(float x) {
  // exp(x) = 2^n * exp(r), r in [-ln2/2, ln2/2]; degree-6 polynomial (Cephes expf coefficients).
  // Below ln 2^-126 = -87.3365 the exact value is subnormal or underflows: 0 (clamping the argument
  // instead gave ~1e-38 for every masked attention position). The inputs here are <= 0 (softmax,
  // cross entropy, the GELU tail); above 88.37 2^n would overflow the exponent field.
  const bool under = x < -87.3365f;
  x = under ? -87.3365f : (x > 88.37f ? 88.37f : x);
  float n = std::nearbyint(x * 1.44269504088896341f);
  float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t e = (static_cast<int32_t>(n) + 127) << 23;
  float s;
  std::memcpy(&s, &e, sizeof(s));
  const float y = p * s;
  return under || y < kMinNormal ? 0.f : y;
}

inline float fast_erf(float x) {
  // Abramowitz & Stegun 7.1.26, |error| <= 1.5e-7
  float a = x < 0.f ? -x : x;
  float t = 1.0f / (1.0f + 0.3275911f * a);
  float y = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
  y = 1.0f - y * fast_exp(-a * a);
  return x < 0.f ? -y : y;
}

inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// keep[i] = 1 with probability 1 - p (p resolved to 2^-32), from (seed, i)
void dropout_mask(uint8_t* keep, int64_t n, int64_t seed, float p) {
  if (p <= 0.f) {
    std::memset(keep, 1, n);
    return;
  }
  const uint32_t s0 = static_cast<uint32_t>(seed), s1 = static_cast<uint32_t>(static_cast<uint64_t>(seed) >> 32);
  const uint32_t thresh = static_cast<uint32_t>(std::min(4294967295.0, static_cast<double>(p) * 4294967296.0));
#pragma omp parallel for num_threads(threads()) schedule(static)
  for (int64_t start = 0; start < n; start += 4096) {
    int64_t end = std::min(n, start + 4096);
#pragma omp simd
    for (int64_t i = start; i < end; ++i) {
      uint32_t h = mix32(mix32(static_cast<uint32_t>(i) ^ s0) + s1 + static_cast<uint32_t>(i >> 32));
      keep[i] = h >= thresh;
    }
  }
}

// per-thread column sums of rows [M, N] -> out[N], via f(row, col)
template <typename F>
void column_sums(int64_t M, int64_t N, float* out, F f) {
  int nt = threads();
  std::vector<float> part(static_cast<size_t>(nt) * N, 0.f);
#pragma omp parallel num_threads(nt)
  {
    float* acc = part.data() + static_cast<size_t>(omp_get_thread_num()) * N;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < M; ++i) {
#pragma omp simd
      for (int64_t j = 0; j < N; ++j) acc[j] += f(i, j);
    }
  }
  for (int64_t j = 0; j < N; ++j) {
    float s = 0.f;
    for (int t = 0; t < nt; ++t) s += part[static_cast<size_t>(t) * N + j];
    out[j] = flush(s);
  }
}

void check(const paddle::Tensor& t, const char* what) {
  PD_CHECK(t.is_cpu(), what, " must be a CPU tensor");
  PD_CHECK(t.dtype() == paddle::DataType::FLOAT32, what, " must be float32");
}

int64_t last_dim(const paddle::Tensor& t) { return t.shape().back(); }

// ------------------------------------------------------------------- bias + activation + dropout
// act: 0 none, 1 relu, 2 gelu (erf)
template <int ACT>
inline float act_fwd(float z) {
  if (ACT == 1) return z > 0.f ? z : 0.f;
  if (ACT == 2) return flush(0.5f * z * (1.0f + fast_erf(z * 0.70710678118654752f)));
  return z;
}
template <int ACT>
inline float act_grad(float z) {
  if (ACT == 1) return z > 0.f ? 1.f : 0.f;
  if (ACT == 2)
    return 0.5f * (1.0f + fast_erf(z * 0.70710678118654752f)) + z * 0.39894228040143268f * fast_exp(-0.5f * z * z);
  return 1.f;
}

template <int ACT>
void bias_act_rows(const float* px, const float* pb, const uint8_t* pk, int64_t M, int64_t N, float p, float* py) {
  const float scale = 1.0f / (1.0f - p);
#pragma omp parallel for num_threads(threads()) schedule(static)
  for (int64_t i = 0; i < M; ++i) {
    const float* xr = px + i * N;
    const uint8_t* kr = pk ? pk + i * N : nullptr;
    float* yr = py + i * N;
    if (p > 0.f) {
#pragma omp simd
      for (int64_t j = 0; j < N; ++j) yr[j] = kr[j] ? act_fwd<ACT>(xr[j] + pb[j]) * scale : 0.f;
    } else {
#pragma omp simd
      for (int64_t j = 0; j < N; ++j) yr[j] = act_fwd<ACT>(xr[j] + pb[j]);
    }
  }
}

// dx = keep * dy * act'(x + b) / (1 - p). Without a mask (pk null: no dropout) every element is kept;
// without an activation (ACT 0) x and b are not read (they may be null).
template <int ACT>
void bias_act_rows_grad(const float* px, const float* pb, const uint8_t* pk, const float* pdy, int64_t M, int64_t N,
                        float p, float* pdx) {
  const float scale = 1.0f / (1.0f - p);
#pragma omp parallel for num_threads(threads()) schedule(static)
  for (int64_t i = 0; i < M; ++i) {
#pragma omp simd
    for (int64_t j = 0; j < N; ++j) {
      const int64_t k = i * N + j;
      const float g = ACT == 0 ? pdy[k] * scale : pdy[k] * scale * act_grad<ACT>(px[k] + pb[j]);
      pdx[k] = (pk == nullptr || pk[k]) ? flush(g) : 0.f;
    }
  }
}

// out = keep * act(x + b) / (1 - p). `mask_at_p0`: Keep is made (all ones) also without dropout, as
// bias_act's backward reads it; else it is empty then.
std::vector<paddle::Tensor> bias_act_forward(const paddle::Tensor& x, const paddle::Tensor& b, int act, int64_t seed,
                                             float p, bool mask_at_p0) {
  zoo_apply_fp_mode();
  check(x, "x");
  check(b, "bias");
  const int64_t N = last_dim(x), M = x.numel() / N;
  PD_CHECK(b.numel() == N, "bias has ", b.numel(), " values for rows of ", N);
  auto y = paddle::empty(x.shape(), x.dtype(), x.place());
  const bool masked = p > 0.f || mask_at_p0;
  auto keep = masked ? paddle::empty(x.shape(), paddle::DataType::UINT8, x.place())
                     : paddle::empty({0}, paddle::DataType::UINT8, x.place());
  uint8_t* pk = masked ? keep.data<uint8_t>() : nullptr;
  if (masked) dropout_mask(pk, x.numel(), seed, p);
  const float *px = x.data<float>(), *pb = b.data<float>();
  float* py = y.data<float>();
  if (act == 1) bias_act_rows<1>(px, pb, pk, M, N, p, py);
  else if (act == 2) bias_act_rows<2>(px, pb, pk, M, N, p, py);
  else bias_act_rows<0>(px, pb, pk, M, N, p, py);
  return {y, keep};
}

std::vector<paddle::Tensor> BiasActForward(const paddle::Tensor& x, const paddle::Tensor& b, int act, int64_t seed,
                                           float p) {
  return bias_act_forward(x, b, act, seed, p, true);
}

std::vector<paddle::Tensor> BiasActBackward(const paddle::Tensor& x, const paddle::Tensor& b,
                                            const paddle::Tensor& keep, const paddle::Tensor& dy, int act, float p) {
  zoo_apply_fp_mode();
  const int64_t N = last_dim(x), M = x.numel() / N;
  auto dx = paddle::empty(x.shape(), x.dtype(), x.place());
  auto db = paddle::empty(b.shape(), b.dtype(), b.place());
  const float *px = x.data<float>(), *pb = b.data<float>(), *pdy = dy.data<float>();
  const uint8_t* pk = keep.data<uint8_t>();
  float* pdx = dx.data<float>();
  if (act == 1) bias_act_rows_grad<1>(px, pb, pk, pdy, M, N, p, pdx);
  else if (act == 2) bias_act_rows_grad<2>(px, pb, pk, pdy, M, N, p, pdx);
  else bias_act_rows_grad<0>(px, pb, pk, pdy, M, N, p, pdx);
  column_sums(M, N, db.data<float>(), [&](int64_t i, int64_t j) { return pdx[i * N + j]; });
  return {dx, db};
}

// out = keep * (x + b) / (1 - p): bias_act without an activation, whose backward reads the dropout
// mask only. Neither x nor the bias is saved for it, and without dropout (p = 0) no mask is made:
// Keep is empty and the gradient of x is dy.
std::vector<paddle::Tensor> BiasDropoutForward(const paddle::Tensor& x, const paddle::Tensor& b, int64_t seed,
                                               float p) {
  return bias_act_forward(x, b, 0, seed, p, false);
}

std::vector<paddle::Tensor> BiasDropoutBackward(const paddle::Tensor& keep, const paddle::Tensor& dy, float p) {
  zoo_apply_fp_mode();
  const int64_t N = last_dim(dy), M = dy.numel() / N;
  auto dx = paddle::empty(dy.shape(), dy.dtype(), dy.place());
  auto db = paddle::empty({N}, dy.dtype(), dy.place());
  float* pdx = dx.data<float>();
  bias_act_rows_grad<0>(nullptr, nullptr, keep.numel() ? keep.data<uint8_t>() : nullptr, dy.data<float>(), M, N, p,
                        pdx);
  column_sums(M, N, db.data<float>(), [&](int64_t i, int64_t j) { return pdx[i * N + j]; });
  return {dx, db};
}

// ------------------------------------------------------- bias + dropout + residual (+ LayerNorm)
// h = residual + keep * (x + b) / (1 - p); out = h, or LayerNorm(h) * gamma + beta when with_ln
void layer_norm_rows(const float* h, int64_t M, int64_t N, const float* g, const float* be, float eps,
                     float* out, float* mean, float* rstd) {
#pragma omp parallel for num_threads(threads()) schedule(static)
  for (int64_t i = 0; i < M; ++i) {
    const float* hr = h + i * N;
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < N; ++j) s += hr[j];
    const float mu = s / N;
    float v = 0.f;
#pragma omp simd reduction(+ : v)
    for (int64_t j = 0; j < N; ++j) v += (hr[j] - mu) * (hr[j] - mu);
    const float r = 1.0f / std::sqrt(v / N + eps);
    mean[i] = mu;
    rstd[i] = r;
    float* o = out + i * N;
#pragma omp simd
    for (int64_t j = 0; j < N; ++j) o[j] = flush((hr[j] - mu) * r * g[j] + be[j]);
  }
}

// dh = rstd * (g*dy - mean(g*dy) - xhat * mean(g*dy*xhat)); dgamma, dbeta column sums
void layer_norm_rows_grad(const float* h, const float* dy, int64_t M, int64_t N, const float* g,
                          const float* mean, const float* rstd, float* dh, float* dg, float* dbe) {
#pragma omp parallel for num_threads(threads()) schedule(static)
  for (int64_t i = 0; i < M; ++i) {
    const float* hr = h + i * N;
    const float* d = dy + i * N;
    const float mu = mean[i], r = rstd[i];
    float a = 0.f, c = 0.f;
#pragma omp simd reduction(+ : a, c)
    for (int64_t j = 0; j < N; ++j) {
      const float gd = g[j] * d[j];
      a += gd;
      c += gd * (hr[j] - mu) * r;
    }
    a /= N;
    c /= N;
    float* o = dh + i * N;
#pragma omp simd
    for (int64_t j = 0; j < N; ++j) o[j] = flush(r * (g[j] * d[j] - a - (hr[j] - mu) * r * c));
  }
  if (dg != nullptr) {
    column_sums(M, N, dg, [&](int64_t i, int64_t j) { return dy[i * N + j] * (h[i * N + j] - mean[i]) * rstd[i]; });
    column_sums(M, N, dbe, [&](int64_t i, int64_t j) { return dy[i * N + j]; });
  }
}

void bias_dropout_residual(const float* x, const float* b, const float* res, const uint8_t* keep, int64_t M,
                           int64_t N, float scale, float* h) {
#pragma omp parallel for num_threads(threads()) schedule(static)
  for (int64_t i = 0; i < M; ++i) {
#pragma omp simd
    for (int64_t j = 0; j < N; ++j) {
      const int64_t k = i * N + j;
      h[k] = res[k] + (keep[k] ? (x[k] + b[j]) * scale : 0.f);
    }
  }
}

std::vector<paddle::Tensor> BDRForward(const paddle::Tensor& x, const paddle::Tensor& b, const paddle::Tensor& res,
                                       int64_t seed, float p) {
  zoo_apply_fp_mode();
  check(x, "x");
  check(b, "bias");
  check(res, "residual");
  const int64_t N = last_dim(x), M = x.numel() / N;
  PD_CHECK(res.numel() == x.numel() && b.numel() == N, "x, bias and residual shapes do not fit");
  auto keep = paddle::empty(x.shape(), paddle::DataType::UINT8, x.place());
  auto out = paddle::empty(x.shape(), x.dtype(), x.place());
  dropout_mask(keep.data<uint8_t>(), x.numel(), seed, p);
  bias_dropout_residual(x.data<float>(), b.data<float>(), res.data<float>(), keep.data<uint8_t>(), M, N,
                        1.0f / (1.0f - p), out.data<float>());
  return {out, keep};
}

// dx = dout * keep * scale, db = column sums of dx, dres = dout
// reads the mask and the output's gradient only: x is not kept for it (its shape is dout's)
std::vector<paddle::Tensor> BDRBackward(const paddle::Tensor& keep, const paddle::Tensor& dout, float p) {
  auto g = BiasDropoutBackward(keep, dout, p);   // dx and db as for the bias and dropout alone
  return {g[0], g[1], dout.copy_to(dout.place(), true)};
}

std::vector<paddle::Tensor> BDRLNForward(const paddle::Tensor& x, const paddle::Tensor& b, const paddle::Tensor& res,
                                         const paddle::Tensor& g, const paddle::Tensor& be, int64_t seed, float p,
                                         float eps) {
  zoo_apply_fp_mode();
  check(x, "x");
  check(b, "bias");
  check(res, "residual");
  check(g, "weight");
  check(be, "bias of the norm");
  const int64_t N = last_dim(x), M = x.numel() / N;
  PD_CHECK(res.numel() == x.numel() && b.numel() == N && g.numel() == N && be.numel() == N,
           "x, bias, residual and norm shapes do not fit");
  auto keep = paddle::empty(x.shape(), paddle::DataType::UINT8, x.place());
  auto h = paddle::empty(x.shape(), x.dtype(), x.place());
  auto out = paddle::empty(x.shape(), x.dtype(), x.place());
  auto mean = paddle::empty({M}, x.dtype(), x.place());
  auto rstd = paddle::empty({M}, x.dtype(), x.place());
  dropout_mask(keep.data<uint8_t>(), x.numel(), seed, p);
  bias_dropout_residual(x.data<float>(), b.data<float>(), res.data<float>(), keep.data<uint8_t>(), M, N,
                        1.0f / (1.0f - p), h.data<float>());
  layer_norm_rows(h.data<float>(), M, N, g.data<float>(), be.data<float>(), eps, out.data<float>(),
                  mean.data<float>(), rstd.data<float>());
  return {out, keep, h, mean, rstd};
}

std::vector<paddle::Tensor> BDRLNBackward(const paddle::Tensor& keep, const paddle::Tensor& h,
                                          const paddle::Tensor& g, const paddle::Tensor& mean,
                                          const paddle::Tensor& rstd, const paddle::Tensor& dout, float p) {
  zoo_apply_fp_mode();
  const int64_t N = last_dim(h), M = h.numel() / N;
  auto dres = paddle::empty(h.shape(), h.dtype(), h.place());
  auto dx = paddle::empty(h.shape(), h.dtype(), h.place());
  auto db = paddle::empty({N}, h.dtype(), h.place());
  auto dg = paddle::empty({N}, h.dtype(), h.place());
  auto dbe = paddle::empty({N}, h.dtype(), h.place());
  float* pr = dres.data<float>();
  layer_norm_rows_grad(h.data<float>(), dout.data<float>(), M, N, g.data<float>(), mean.data<float>(),
                       rstd.data<float>(), pr, dg.data<float>(), dbe.data<float>());
  const uint8_t* k = keep.data<uint8_t>();
  float* pdx = dx.data<float>();
  const float scale = 1.0f / (1.0f - p);
  const int64_t n = h.numel();
#pragma omp parallel for simd num_threads(threads()) schedule(static)
  for (int64_t i = 0; i < n; ++i) pdx[i] = k[i] ? pr[i] * scale : 0.f;
  column_sums(M, N, db.data<float>(), [&](int64_t i, int64_t j) { return pdx[i * N + j]; });
  return {dx, db, dres, dg, dbe};
}

// --------------------------------------------------------------------------------- LayerNorm
std::vector<paddle::Tensor> LNForward(const paddle::Tensor& x, const paddle::Tensor& g, const paddle::Tensor& be,
                                      float eps) {
  zoo_apply_fp_mode();
  check(x, "x");
  check(g, "weight");
  check(be, "bias");
  const int64_t N = last_dim(x), M = x.numel() / N;
  PD_CHECK(g.numel() == N && be.numel() == N, "LayerNorm weight/bias do not fit rows of ", N);
  auto out = paddle::empty(x.shape(), x.dtype(), x.place());
  auto mean = paddle::empty({M}, x.dtype(), x.place());
  auto rstd = paddle::empty({M}, x.dtype(), x.place());
  layer_norm_rows(x.data<float>(), M, N, g.data<float>(), be.data<float>(), eps, out.data<float>(),
                  mean.data<float>(), rstd.data<float>());
  return {out, mean, rstd};
}

std::vector<paddle::Tensor> LNBackward(const paddle::Tensor& x, const paddle::Tensor& g, const paddle::Tensor& mean,
                                       const paddle::Tensor& rstd, const paddle::Tensor& dout) {
  zoo_apply_fp_mode();
  const int64_t N = last_dim(x), M = x.numel() / N;
  auto dx = paddle::empty(x.shape(), x.dtype(), x.place());
  auto dg = paddle::empty({N}, x.dtype(), x.place());
  auto dbe = paddle::empty({N}, x.dtype(), x.place());
  layer_norm_rows_grad(x.data<float>(), dout.data<float>(), M, N, g.data<float>(), mean.data<float>(),
                       rstd.data<float>(), dx.data<float>(), dg.data<float>(), dbe.data<float>());
  return {dx, dg, dbe};
}

// ------------------------------------------------------------ softmax(scale * x + mask) + dropout
// x [B, H, S, T]; mask [Bm, 1, Sm, T] with Bm in {1, B}, Sm in {1, S} (broadcast over heads)
std::vector<paddle::Tensor> SoftmaxForward(const paddle::Tensor& x, const paddle::Tensor& mask, float scale,
                                           int64_t seed, float p) {
  zoo_apply_fp_mode();
  check(x, "scores");
  check(mask, "mask");
  auto xs = x.shape(), ms = mask.shape();
  PD_CHECK(xs.size() == 4 && ms.size() == 4, "scores and mask must be 4-D");
  const int64_t B = xs[0], H = xs[1], S = xs[2], T = xs[3];
  PD_CHECK((ms[0] == 1 || ms[0] == B) && ms[1] == 1 && (ms[2] == 1 || ms[2] == S) && ms[3] == T,
           "mask shape does not broadcast to the scores");
  const int64_t mb = ms[0] == 1 ? 0 : ms[2] * T, ms_row = ms[2] == 1 ? 0 : T;
  auto probs = paddle::empty(xs, x.dtype(), x.place());
  auto keep = paddle::empty(xs, paddle::DataType::UINT8, x.place());
  auto out = paddle::empty(xs, x.dtype(), x.place());
  dropout_mask(keep.data<uint8_t>(), x.numel(), seed, p);
  const float* px = x.data<float>();
  const float* pm = mask.data<float>();
  float *pp = probs.data<float>(), *po = out.data<float>();
  const uint8_t* pk = keep.data<uint8_t>();
  const float drop_scale = 1.0f / (1.0f - p);
  const int64_t rows = B * H * S;
#pragma omp parallel for num_threads(threads()) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = r / (H * S), s = r % S;
    const float* xr = px + r * T;
    const float* mr = pm + b * mb + s * ms_row;
    float* pr = pp + r * T;
    float mx = -INFINITY;
    for (int64_t t = 0; t < T; ++t) {
      pr[t] = xr[t] * scale + mr[t];
      mx = pr[t] > mx ? pr[t] : mx;
    }
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t t = 0; t < T; ++t) {
      pr[t] = fast_exp(pr[t] - mx);
      sum += pr[t];
    }
    const float inv = 1.0f / sum;
    float* orow = po + r * T;
    const uint8_t* kr = pk + r * T;
#pragma omp simd
    for (int64_t t = 0; t < T; ++t) {
      pr[t] = flush(pr[t] * inv);
      orow[t] = kr[t] ? pr[t] * drop_scale : 0.f;
    }
  }
  return {out, probs, keep};
}

// dz = y * (g - sum(g * y)), g = dout * keep / (1 - p); dx = scale * dz
std::vector<paddle::Tensor> SoftmaxBackward(const paddle::Tensor& probs, const paddle::Tensor& keep,
                                            const paddle::Tensor& dout, float scale, float p) {
  zoo_apply_fp_mode();
  const int64_t T = last_dim(probs), rows = probs.numel() / T;
  auto dx = paddle::empty(probs.shape(), probs.dtype(), probs.place());
  const float *py = probs.data<float>(), *pd = dout.data<float>();
  const uint8_t* pk = keep.data<uint8_t>();
  float* po = dx.data<float>();
  const float drop_scale = 1.0f / (1.0f - p);
#pragma omp parallel for num_threads(threads()) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* y = py + r * T;
    const float* d = pd + r * T;
    const uint8_t* k = pk + r * T;
    float* o = po + r * T;
    float dot = 0.f;
#pragma omp simd reduction(+ : dot)
    for (int64_t t = 0; t < T; ++t) {
      o[t] = k[t] ? d[t] * drop_scale : 0.f;
      dot += o[t] * y[t];
    }
#pragma omp simd
    for (int64_t t = 0; t < T; ++t) o[t] = flush(scale * y[t] * (o[t] - dot));
  }
  return {dx};
}

// ------------------------------------------------------- label-smoothed cross entropy over logits
// Per row z [V] and label y, q = (1 - eps) one_hot(y) + eps / V:
//   nll = lse(z) - z_y;  loss = -sum_v q_v log p_v = nll + eps * (z_y - mean(z)).
// A label outside [0, V) (paddle's ignore_index -1) gives 0 and no gradient. One pass over the logits
// forward (row max, sum of exp, sum) and one backward, instead of paddle's cross entropy + take_along_axis
// + mean and their gradients (each a full pass, several single-threaded, over a [tokens, vocabulary] tensor).
inline float row_sum_blocked(const float* z, int64_t V, float shift, bool exp_) {
  double total = 0.0;  // float partial sums of 1024, added in double: the error does not grow with V
  for (int64_t start = 0; start < V; start += 1024) {
    const int64_t end = std::min(V, start + 1024);
    float part = 0.f;
    if (exp_) {
#pragma omp simd reduction(+ : part)
      for (int64_t v = start; v < end; ++v) part += fast_exp(z[v] - shift);
    } else {
#pragma omp simd reduction(+ : part)
      for (int64_t v = start; v < end; ++v) part += z[v];
    }
    total += part;
  }
  return static_cast<float>(total);
}

std::vector<paddle::Tensor> SmoothCEForward(const paddle::Tensor& logits, const paddle::Tensor& labels, float eps) {
  zoo_apply_fp_mode();
  check(logits, "logits");
  PD_CHECK(labels.dtype() == paddle::DataType::INT64, "labels must be int64");
  const int64_t V = last_dim(logits), R = logits.numel() / V;
  PD_CHECK(labels.numel() == R, "labels must have one entry per row of the logits");
  auto loss = paddle::empty(labels.shape(), logits.dtype(), logits.place());
  auto nll = paddle::empty(labels.shape(), logits.dtype(), logits.place());
  auto lse = paddle::empty({R}, logits.dtype(), logits.place());
  const float* pz = logits.data<float>();
  const int64_t* py = labels.data<int64_t>();
  float *pl = loss.data<float>(), *pn = nll.data<float>(), *ps = lse.data<float>();
#pragma omp parallel for num_threads(threads()) schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    const float* z = pz + r * V;
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int64_t v = 0; v < V; ++v) mx = z[v] > mx ? z[v] : mx;
    const float l = mx + std::log(row_sum_blocked(z, V, mx, true));
    ps[r] = l;
    const int64_t y = py[r];
    if (y < 0 || y >= V) {
      pl[r] = pn[r] = 0.f;
      continue;
    }
    pn[r] = l - z[y];
    pl[r] = pn[r] + (eps ? eps * (z[y] - row_sum_blocked(z, V, 0.f, false) / V) : 0.f);
  }
  return {loss, nll, lse};
}

// dz_v = (gl + gn) p_v - (gl (1 - eps) + gn) [v = y] - gl eps / V  (gl, gn: the gradients of loss, nll)
std::vector<paddle::Tensor> SmoothCEBackward(const paddle::Tensor& logits, const paddle::Tensor& labels,
                                             const paddle::Tensor& lse, const paddle::Tensor& dloss,
                                             const paddle::Tensor& dnll, float eps) {
  zoo_apply_fp_mode();
  const int64_t V = last_dim(logits), R = logits.numel() / V;
  auto dz = paddle::empty(logits.shape(), logits.dtype(), logits.place());
  const float *pz = logits.data<float>(), *ps = lse.data<float>();
  const float* pgl = dloss.initialized() ? dloss.data<float>() : nullptr;   // an unused output has no gradient
  const float* pgn = dnll.initialized() ? dnll.data<float>() : nullptr;
  const int64_t* py = labels.data<int64_t>();
  float* po = dz.data<float>();
#pragma omp parallel for num_threads(threads()) schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    const float* z = pz + r * V;
    float* o = po + r * V;
    const int64_t y = py[r];
    if (y < 0 || y >= V) {
      std::memset(o, 0, sizeof(float) * V);
      continue;
    }
    const float gl = pgl ? pgl[r] : 0.f, gn = pgn ? pgn[r] : 0.f;
    const float a = gl + gn, c = gl * eps / V, l = ps[r];
#pragma omp simd
    for (int64_t v = 0; v < V; ++v) o[v] = flush(a * fast_exp(z[v] - l) - c);
    o[y] -= gl * (1.0f - eps) + gn;
  }
  return {dz};
}

std::vector<std::vector<int64_t>> SmoothCEInferShape(const std::vector<int64_t>& logits,
                                                     const std::vector<int64_t>& labels) {
  return {labels, labels, {std::accumulate(labels.begin(), labels.end(), int64_t{1}, std::multiplies<int64_t>())}};
}

std::vector<paddle::DataType> SmoothCEInferDtype(const paddle::DataType& logits, const paddle::DataType& labels) {
  return {logits, logits, logits};
}

// ------------------------------------------------------------- BatchNorm (+ residual) (+ ReLU), NCHW
// Training: batch statistics (biased variance for the normalisation), running statistics updated in
// place as Paddle's batch_norm does: running = momentum * running + (1 - momentum) * batch, with the
// batch's biased variance (as paddle 3's CPU kernel).
//
// The activations (X, Residual, Y and their gradients) are float32 or all bfloat16 (issue 43: bf16
// activations between a convolution and the next halve the bytes a ResNet step moves and keeps for
// its backward); the parameters, the statistics and every reduction stay float32, as PyTorch's
// autocast and oneDNN keep a norm's statistics. A bf16 value is read exactly (its bits are the upper
// half of a float32) and written by bf16.h's conversion (nearest even, a subnormal to zero), the one
// dnnl.cc uses too. It is plain integer code, so these kernels run on every CPU, bf16 hardware or not.
struct Bf16 {
  uint16_t bits;
};

inline float load(const float* p, int64_t i) { return p[i]; }
inline float load(const Bf16* p, int64_t i) {
  const uint32_t u = static_cast<uint32_t>(p[i].bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
inline void store(float* p, int64_t i, float v) { p[i] = v; }
inline void store(Bf16* p, int64_t i, float v) { p[i].bits = zoo_bf16::bits(v); }

bool is_bf16(const paddle::Tensor& t) { return t.dtype() == paddle::DataType::BFLOAT16; }

template <typename T>
const T* in(const paddle::Tensor& t) {
  return static_cast<const T*>(t.data());
}
template <typename T>
T* out(paddle::Tensor& t) {
  return static_cast<T*>(t.data());
}

// the activations' checks: float32, or bfloat16 with every other activation bfloat16 too
void check_act(const paddle::Tensor& t, const paddle::Tensor& x, const char* what) {
  PD_CHECK(t.is_cpu(), what, " must be a CPU tensor");
  PD_CHECK(t.dtype() == paddle::DataType::FLOAT32 || is_bf16(t), what, " must be float32 or bfloat16");
  PD_CHECK(t.dtype() == x.dtype(), what, " must have the input's dtype");
}

template <typename T>
void bn_stats(const T* x, int64_t N, int64_t C, int64_t HW, float* mean, float* var) {
#pragma omp parallel for num_threads(threads()) schedule(static)
  for (int64_t c = 0; c < C; ++c) {
    double s = 0.0;
    for (int64_t n = 0; n < N; ++n) {
      const T* p = x + (n * C + c) * HW;
      float part = 0.f;
#pragma omp simd reduction(+ : part)
      for (int64_t i = 0; i < HW; ++i) part += load(p, i);
      s += part;
    }
    const float mu = static_cast<float>(s / (N * HW));
    double v = 0.0;
    for (int64_t n = 0; n < N; ++n) {
      const T* p = x + (n * C + c) * HW;
      float part = 0.f;
#pragma omp simd reduction(+ : part)
      for (int64_t i = 0; i < HW; ++i) {
        const float d = load(p, i) - mu;
        part += d * d;
      }
      v += part;
    }
    mean[c] = mu;
    var[c] = static_cast<float>(v / (N * HW));
  }
}

// batch statistics (mean, invstd), the running ones updated, then y; T: the activations' type. With
// `global_stats` (inference, or a frozen BN: paddle's use_global_stats) the running statistics are the
// statistics, left as they are: y = act(x * a + b [+ residual]) with a = gamma / sqrt(var + eps),
// b = beta - mean * a, one pass where paddle's batch_norm, add and relu make three.
template <typename T>
void bn_act_forward(const paddle::Tensor& x, const paddle::Tensor& g, const paddle::Tensor& be,
                    const paddle::Tensor& rmean, const paddle::Tensor& rvar, const paddle::Tensor* res, float momentum,
                    float eps, bool relu, bool global_stats, paddle::Tensor& y, paddle::Tensor& mean,
                    paddle::Tensor& invstd) {
  auto xs = x.shape();
  const int64_t N = xs[0], C = xs[1], HW = N * C ? x.numel() / (N * C) : 0;
  const T* px = in<T>(x);
  std::vector<float> var(C);
  float* pmean = mean.data<float>();
  float* pinv = invstd.data<float>();
  float* rm = const_cast<float*>(rmean.data<float>());
  float* rv = const_cast<float*>(rvar.data<float>());
  if (global_stats) {
    for (int64_t c = 0; c < C; ++c) pmean[c] = rm[c], pinv[c] = 1.0f / std::sqrt(rv[c] + eps);
  } else {
    bn_stats(px, N, C, HW, pmean, var.data());
    for (int64_t c = 0; c < C; ++c) {
      pinv[c] = 1.0f / std::sqrt(var[c] + eps);
      rm[c] = flush(momentum * rm[c] + (1.0f - momentum) * pmean[c]);
      rv[c] = flush(momentum * rv[c] + (1.0f - momentum) * var[c]);
    }
  }
  const float *pg = g.data<float>(), *pb = be.data<float>();
  const T* pr = res != nullptr ? in<T>(*res) : nullptr;
  T* py = out<T>(y);
#pragma omp parallel for collapse(2) num_threads(threads()) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < C; ++c) {
      const float a = pg[c] * pinv[c], sh = pb[c] - pmean[c] * a;
      const int64_t off = (n * C + c) * HW;
      const T* xp = px + off;
      T* yp = py + off;
      if (pr != nullptr) {
        const T* rp = pr + off;
#pragma omp simd
        for (int64_t i = 0; i < HW; ++i) {
          const float v = flush(load(xp, i) * a + sh + load(rp, i));
          store(yp, i, relu ? (v > 0.f ? v : 0.f) : v);
        }
      } else {
#pragma omp simd
        for (int64_t i = 0; i < HW; ++i) {
          const float v = flush(load(xp, i) * a + sh);
          store(yp, i, relu ? (v > 0.f ? v : 0.f) : v);
        }
      }
    }
  }
}

std::vector<paddle::Tensor> BNActForwardImpl(const paddle::Tensor& x, const paddle::Tensor& g,
                                             const paddle::Tensor& be, const paddle::Tensor& rmean,
                                             const paddle::Tensor& rvar, const paddle::Tensor* res, float momentum,
                                             float eps, bool relu, bool global_stats = false) {
  zoo_apply_fp_mode();
  check_act(x, x, "x");
  if (res != nullptr) {
    check_act(*res, x, "residual");
    PD_CHECK(res->numel() == x.numel(), "residual does not fit the BatchNorm input");
  }
  check(g, "scale");
  auto xs = x.shape();
  PD_CHECK(xs.size() >= 2, "BatchNorm input must be [N, C, ...]");
  const int64_t C = xs[1];
  PD_CHECK(g.numel() == C && be.numel() == C && rmean.numel() == C && rvar.numel() == C,
           "BatchNorm parameters do not fit ", C, " channels");
  auto y = paddle::empty(xs, x.dtype(), x.place());
  auto mean = paddle::empty({C}, paddle::DataType::FLOAT32, x.place());
  auto invstd = paddle::empty({C}, paddle::DataType::FLOAT32, x.place());
  if (is_bf16(x)) {
    bn_act_forward<Bf16>(x, g, be, rmean, rvar, res, momentum, eps, relu, global_stats, y, mean, invstd);
  } else {
    bn_act_forward<float>(x, g, be, rmean, rvar, res, momentum, eps, relu, global_stats, y, mean, invstd);
  }
  return {y, mean, invstd};
}

std::vector<paddle::Tensor> BNActForward(const paddle::Tensor& x, const paddle::Tensor& g, const paddle::Tensor& be,
                                         const paddle::Tensor& rmean, const paddle::Tensor& rvar, float momentum,
                                         float eps, bool relu) {
  return BNActForwardImpl(x, g, be, rmean, rvar, nullptr, momentum, eps, relu);
}

std::vector<paddle::Tensor> BNAddActForward(const paddle::Tensor& x, const paddle::Tensor& g,
                                            const paddle::Tensor& be, const paddle::Tensor& rmean,
                                            const paddle::Tensor& rvar, const paddle::Tensor& res, float momentum,
                                            float eps, bool relu) {
  return BNActForwardImpl(x, g, be, rmean, rvar, &res, momentum, eps, relu);
}

std::vector<paddle::Tensor> BNGlobalActForward(const paddle::Tensor& x, const paddle::Tensor& g,
                                               const paddle::Tensor& be, const paddle::Tensor& rmean,
                                               const paddle::Tensor& rvar, float eps, bool relu) {
  return BNActForwardImpl(x, g, be, rmean, rvar, nullptr, 0.f, eps, relu, true);
}

std::vector<paddle::Tensor> BNGlobalAddActForward(const paddle::Tensor& x, const paddle::Tensor& g,
                                                  const paddle::Tensor& be, const paddle::Tensor& rmean,
                                                  const paddle::Tensor& rvar, const paddle::Tensor& res, float eps,
                                                  bool relu) {
  return BNActForwardImpl(x, g, be, rmean, rvar, &res, 0.f, eps, relu, true);
}

// dy' = dy * (y > 0); per channel: dbeta = sum dy', dgamma = sum dy' * xhat;
// dx = gamma * invstd * (dy' - dbeta / M - xhat * dgamma / M), or with global statistics (constants
// here) gamma * invstd * dy'
template <typename T>
void bn_act_backward(const paddle::Tensor& x, const float* pg, const float* pm, const float* pi,
                     const paddle::Tensor& y, const paddle::Tensor& dy, bool relu, bool global_stats,
                     paddle::Tensor& dx, float* pdg, float* pdb, paddle::Tensor* dres) {
  auto xs = x.shape();
  const int64_t N = xs[0], C = xs[1], HW = N * C ? x.numel() / (N * C) : 0;
  const double M = static_cast<double>(N * HW);
  const T *px = in<T>(x), *py = in<T>(y), *pd = in<T>(dy);
  T* pdx = out<T>(dx);
  T* pres = dres != nullptr ? out<T>(*dres) : nullptr;
#pragma omp parallel for num_threads(threads()) schedule(static)
  for (int64_t c = 0; c < C; ++c) {
    const float mu = pm[c], inv = pi[c];
    double sb = 0.0, sg = 0.0;
    for (int64_t n = 0; n < N; ++n) {
      const int64_t off = (n * C + c) * HW;
      const T *xp = px + off, *yp = py + off, *dp = pd + off;
      T* rp = pres != nullptr ? pres + off : nullptr;
      float b = 0.f, gg = 0.f;
      if (rp != nullptr) {
#pragma omp simd reduction(+ : b, gg)
        for (int64_t i = 0; i < HW; ++i) {
          const float d = (!relu || load(yp, i) > 0.f) ? load(dp, i) : 0.f;
          store(rp, i, d);
          b += d;
          gg += d * (load(xp, i) - mu);
        }
      } else {
#pragma omp simd reduction(+ : b, gg)
        for (int64_t i = 0; i < HW; ++i) {
          const float d = (!relu || load(yp, i) > 0.f) ? load(dp, i) : 0.f;
          b += d;
          gg += d * (load(xp, i) - mu);
        }
      }
      sb += b;
      sg += gg;
    }
    const float dbeta = static_cast<float>(sb), dgamma = static_cast<float>(sg) * inv;
    pdb[c] = flush(dbeta);
    pdg[c] = flush(dgamma);
    const float k = pg[c] * inv, mb = global_stats ? 0.f : dbeta / static_cast<float>(M),
                mg = global_stats ? 0.f : dgamma * inv / static_cast<float>(M);
    for (int64_t n = 0; n < N; ++n) {
      const int64_t off = (n * C + c) * HW;
      const T *xp = px + off, *yp = py + off, *dp = pd + off;
      T* o = pdx + off;
#pragma omp simd
      for (int64_t i = 0; i < HW; ++i) {
        const float d = (!relu || load(yp, i) > 0.f) ? load(dp, i) : 0.f;
        store(o, i, flush(k * (d - mb - (load(xp, i) - mu) * mg)));
      }
    }
  }
}

std::vector<paddle::Tensor> BNActBackwardImpl(const paddle::Tensor& x, const paddle::Tensor& g,
                                              const paddle::Tensor& mean, const paddle::Tensor& invstd,
                                              const paddle::Tensor& y, const paddle::Tensor& dy, bool relu,
                                              bool with_res, bool global_stats = false) {
  zoo_apply_fp_mode();
  check_act(dy, x, "the gradient of y");
  auto xs = x.shape();
  const int64_t C = xs[1];
  auto dx = paddle::empty(xs, x.dtype(), x.place());
  auto dg = paddle::empty({C}, paddle::DataType::FLOAT32, x.place());
  auto db = paddle::empty({C}, paddle::DataType::FLOAT32, x.place());
  paddle::Tensor dres;
  if (with_res) dres = paddle::empty(xs, x.dtype(), x.place());
  const float *pg = g.data<float>(), *pm = mean.data<float>(), *pi = invstd.data<float>();
  if (is_bf16(x)) {
    bn_act_backward<Bf16>(x, pg, pm, pi, y, dy, relu, global_stats, dx, dg.data<float>(), db.data<float>(),
                          with_res ? &dres : nullptr);
  } else {
    bn_act_backward<float>(x, pg, pm, pi, y, dy, relu, global_stats, dx, dg.data<float>(), db.data<float>(),
                           with_res ? &dres : nullptr);
  }
  if (with_res) return {dx, dg, db, dres};
  return {dx, dg, db};
}

std::vector<paddle::Tensor> BNActBackward(const paddle::Tensor& x, const paddle::Tensor& g,
                                          const paddle::Tensor& mean, const paddle::Tensor& invstd,
                                          const paddle::Tensor& y, const paddle::Tensor& dy, bool relu) {
  return BNActBackwardImpl(x, g, mean, invstd, y, dy, relu, false);
}

std::vector<paddle::Tensor> BNAddActBackward(const paddle::Tensor& x, const paddle::Tensor& g,
                                             const paddle::Tensor& mean, const paddle::Tensor& invstd,
                                             const paddle::Tensor& y, const paddle::Tensor& dy, bool relu) {
  return BNActBackwardImpl(x, g, mean, invstd, y, dy, relu, true);
}

std::vector<paddle::Tensor> BNGlobalActBackward(const paddle::Tensor& x, const paddle::Tensor& g,
                                                const paddle::Tensor& mean, const paddle::Tensor& invstd,
                                                const paddle::Tensor& y, const paddle::Tensor& dy, bool relu) {
  return BNActBackwardImpl(x, g, mean, invstd, y, dy, relu, false, true);
}

std::vector<paddle::Tensor> BNGlobalAddActBackward(const paddle::Tensor& x, const paddle::Tensor& g,
                                                   const paddle::Tensor& mean, const paddle::Tensor& invstd,
                                                   const paddle::Tensor& y, const paddle::Tensor& dy, bool relu) {
  return BNActBackwardImpl(x, g, mean, invstd, y, dy, relu, true, true);
}

// ---------------------------------------------------------------- 2-D pooling, bf16 activations
// Max and average pooling on NCHW bf16 activations (paddle's CPU build has none; its fp32 kernels
// would need an fp32 copy of the input, kept for the backward). Paddle's window rule: output size
// (H + 2p - k) / s + 1, rounded up with ceil_mode; average pooling divides by the window's cells
// inside the input (`exclusive`, paddle's default) or by k_h * k_w. Max pooling returns the flat input
// index of each maximum (the first in scan order, as paddle's kernel) and the backward adds the
// gradient there; padding never wins. A window with no input cell writes 0 and gets no gradient.
int64_t pool_out(int64_t in, int64_t k, int64_t s, int64_t p, bool ceil_mode) {
  const int64_t span = in + 2 * p - k;
  return (ceil_mode ? (span + s - 1) / s : span / s) + 1;
}

struct Span {
  int64_t lo, hi;  // input indices [lo, hi); empty when hi <= lo
  int64_t size() const { return hi > lo ? hi - lo : 0; }
};

struct PoolGeom {
  int64_t NC, H, W, OH, OW, kh, kw, sh, sw, ph, pw;
  // the input rows of output row oh, and the input columns of output column ow (padding left out)
  Span rows(int64_t oh) const { return {std::max<int64_t>(oh * sh - ph, 0), std::min(oh * sh - ph + kh, H)}; }
  Span cols(int64_t ow) const { return {std::max<int64_t>(ow * sw - pw, 0), std::min(ow * sw - pw + kw, W)}; }
  // what average pooling divides by: the window's cells inside the input (exclusive) or k_h * k_w
  int64_t cells(const Span& r, const Span& c, bool exclusive) const {
    return exclusive ? r.size() * c.size() : kh * kw;
  }
};

PoolGeom pool_geom(const paddle::Tensor& x, const std::vector<int64_t>& k, const std::vector<int64_t>& st,
                   const std::vector<int64_t>& pad, bool ceil_mode) {
  auto xs = x.shape();
  PD_CHECK(xs.size() == 4, "pooling input must be [N, C, H, W]");
  PD_CHECK(k.size() == 2 && st.size() == 2 && pad.size() == 2, "pooling needs 2 kernel, stride and padding values");
  PoolGeom g{xs[0] * xs[1], xs[2], xs[3], pool_out(xs[2], k[0], st[0], pad[0], ceil_mode),
             pool_out(xs[3], k[1], st[1], pad[1], ceil_mode), k[0], k[1], st[0], st[1], pad[0], pad[1]};
  PD_CHECK(g.OH > 0 && g.OW > 0, "pooling window larger than the padded input");
  return g;
}

std::vector<paddle::Tensor> PoolForward(const paddle::Tensor& x, const std::vector<int64_t>& k,
                                        const std::vector<int64_t>& st, const std::vector<int64_t>& pad,
                                        bool ceil_mode, bool is_max, bool exclusive) {
  zoo_apply_fp_mode();
  PD_CHECK(x.is_cpu() && is_bf16(x), "x must be a bfloat16 CPU tensor");
  const PoolGeom g = pool_geom(x, k, st, pad, ceil_mode);
  auto xs = x.shape();
  auto y = paddle::empty({xs[0], xs[1], g.OH, g.OW}, x.dtype(), x.place());
  auto arg = paddle::empty({is_max ? xs[0] : 0, xs[1], g.OH, g.OW}, paddle::DataType::INT32, x.place());
  const Bf16* px = in<Bf16>(x);
  Bf16* py = out<Bf16>(y);
  int32_t* pa = is_max ? arg.data<int32_t>() : nullptr;
#pragma omp parallel for num_threads(threads()) schedule(static)
  for (int64_t nc = 0; nc < g.NC; ++nc) {
    const Bf16* xp = px + nc * g.H * g.W;
    for (int64_t oh = 0; oh < g.OH; ++oh) {
      const Span r = g.rows(oh);
      for (int64_t ow = 0; ow < g.OW; ++ow) {
        const Span c = g.cols(ow);
        const int64_t o = (nc * g.OH + oh) * g.OW + ow;
        if (is_max) {
          float best = -INFINITY;
          int32_t at = -1;
          for (int64_t h = r.lo; h < r.hi; ++h)
            for (int64_t w = c.lo; w < c.hi; ++w) {
              const float v = load(xp, h * g.W + w);
              if (v > best || at < 0) best = v, at = static_cast<int32_t>(h * g.W + w);
            }
          store(py, o, at < 0 ? 0.f : best);
          pa[o] = at;
        } else {
          float sum = 0.f;
          for (int64_t h = r.lo; h < r.hi; ++h)
            for (int64_t w = c.lo; w < c.hi; ++w) sum += load(xp, h * g.W + w);
          const int64_t cells = g.cells(r, c, exclusive);
          store(py, o, cells > 0 ? flush(sum / static_cast<float>(cells)) : 0.f);
        }
      }
    }
  }
  return {y, arg};
}

std::vector<paddle::Tensor> PoolBackward(const paddle::Tensor& x, const paddle::Tensor& arg, const paddle::Tensor& dy,
                                         const std::vector<int64_t>& k, const std::vector<int64_t>& st,
                                         const std::vector<int64_t>& pad, bool ceil_mode, bool is_max,
                                         bool exclusive) {
  zoo_apply_fp_mode();
  PD_CHECK(is_bf16(dy), "the gradient of a bf16 pooling output must be bfloat16");
  const PoolGeom g = pool_geom(x, k, st, pad, ceil_mode);
  auto dx = paddle::empty(x.shape(), x.dtype(), x.place());
  const Bf16* pd = in<Bf16>(dy);
  Bf16* pdx = out<Bf16>(dx);
  const int32_t* pa = is_max ? arg.data<int32_t>() : nullptr;
  // per (n, c) plane: accumulate in fp32, round once (windows overlap when stride < kernel)
#pragma omp parallel for num_threads(threads()) schedule(static)
  for (int64_t nc = 0; nc < g.NC; ++nc) {
    std::vector<float> acc(g.H * g.W, 0.f);
    for (int64_t oh = 0; oh < g.OH; ++oh) {
      const Span r = g.rows(oh);
      for (int64_t ow = 0; ow < g.OW; ++ow) {
        const int64_t o = (nc * g.OH + oh) * g.OW + ow;
        const float d = load(pd, o);
        if (is_max) {
          if (pa[o] >= 0) acc[pa[o]] += d;
          continue;
        }
        const Span c = g.cols(ow);
        const int64_t cells = g.cells(r, c, exclusive);
        if (cells <= 0) continue;
        const float share = d / static_cast<float>(cells);
        for (int64_t h = r.lo; h < r.hi; ++h)
          for (int64_t w = c.lo; w < c.hi; ++w) acc[h * g.W + w] += share;
      }
    }
    Bf16* o = pdx + nc * g.H * g.W;
    for (int64_t i = 0; i < g.H * g.W; ++i) store(o, i, flush(acc[i]));
  }
  return {dx};
}

std::vector<paddle::DataType> PoolInferDtype(const paddle::DataType& x) { return {x, paddle::DataType::INT32}; }

// ------------------------------------------------------------ a convolution's bias, NCHW
// y[n, c, ...] = x[n, c, ...] + b[c] (ops.conv2d adds a layer's bias to oneDNN's output with it), x float32
// or bfloat16 (added in fp32, rounded once), b float32; backward dx = dy, db[c] = the sum of dy over
// n and the plane. Paddle's CPU broadcast add of a [C] bias was the slow part of Mask R-CNN's
// convolutions (FPN, RPN, mask head: every one has a bias): on amd-zen3, 2 threads, an [8, 64, 40, 40]
// tensor took 8.6 ms forward and 25.7 ms with its backward, [2, 256, 200, 336] (FPN P2 at 800 x 1333)
// 340 and 996 ms.
template <typename T>
void channel_bias(const T* x, const float* b, T* y, int64_t NC, int64_t C, int64_t HW) {
#pragma omp parallel for num_threads(threads()) schedule(static)
  for (int64_t nc = 0; nc < NC; ++nc) {
    const float bc = b[nc % C];
    const T* xp = x + nc * HW;
    T* yp = y + nc * HW;
#pragma omp simd
    for (int64_t i = 0; i < HW; ++i) store(yp, i, flush(load(xp, i) + bc));
  }
}

template <typename T>
void channel_bias_grad(const T* dy, T* dx, float* db, int64_t N, int64_t C, int64_t HW) {
#pragma omp parallel for num_threads(threads()) schedule(static)
  for (int64_t c = 0; c < C; ++c) {
    double total = 0.0;   // planes summed in fp32 (vectorised), the N plane sums in double
    for (int64_t n = 0; n < N; ++n) {
      const T* d = dy + (n * C + c) * HW;
      T* o = dx + (n * C + c) * HW;
      float sum = 0.f;
#pragma omp simd reduction(+ : sum)
      for (int64_t i = 0; i < HW; ++i) {
        const float v = load(d, i);
        sum += v;
        store(o, i, v);
      }
      total += sum;
    }
    db[c] = flush(static_cast<float>(total));
  }
}

void check_channel_bias(const paddle::Tensor& x, const paddle::Tensor& b) {
  PD_CHECK(x.is_cpu() && (x.dtype() == paddle::DataType::FLOAT32 || is_bf16(x)) && x.shape().size() >= 2,
           "x must be a float32 or bfloat16 CPU tensor [N, C, ...]");
  PD_CHECK(b.is_cpu() && b.dtype() == paddle::DataType::FLOAT32 && b.shape() == std::vector<int64_t>({x.shape()[1]}),
           "the bias must be a float32 CPU tensor [C]");
}

std::vector<paddle::Tensor> ChannelBiasForward(const paddle::Tensor& x, const paddle::Tensor& b) {
  zoo_apply_fp_mode();
  check_channel_bias(x, b);
  auto y = paddle::empty(x.shape(), x.dtype(), x.place());
  const int64_t C = x.shape()[1], NC = x.shape()[0] * C, HW = NC ? x.numel() / NC : 0;   // N = 0: no RoI
  if (is_bf16(x))
    channel_bias(in<Bf16>(x), b.data<float>(), out<Bf16>(y), NC, C, HW);
  else
    channel_bias(in<float>(x), b.data<float>(), out<float>(y), NC, C, HW);
  return {y};
}

std::vector<paddle::Tensor> ChannelBiasBackward(const paddle::Tensor& b, const paddle::Tensor& dy) {
  zoo_apply_fp_mode();
  check_channel_bias(dy, b);
  auto dx = paddle::empty(dy.shape(), dy.dtype(), dy.place());
  auto db = paddle::empty(b.shape(), b.dtype(), b.place());
  const int64_t N = dy.shape()[0], C = dy.shape()[1], HW = N * C ? dy.numel() / (N * C) : 0;
  if (is_bf16(dy))
    channel_bias_grad(in<Bf16>(dy), out<Bf16>(dx), db.data<float>(), N, C, HW);
  else
    channel_bias_grad(in<float>(dy), out<float>(dx), db.data<float>(), N, C, HW);
  return {dx, db};
}

// ------------------------------------------------------- channel concat, bf16 activations
// y = concat(xs, axis 1) for [N, C_i, ...] tensors of one dtype (DeepLabV3's ASPP joins its branches);
// its backward splits dy. paddle's CPU build has a bf16 concat but no bf16 concat_grad. A plain copy,
// so any element type: rows of C_i * inner elements per sample.
std::vector<paddle::Tensor> ConcatForward(const std::vector<paddle::Tensor>& xs) {
  PD_CHECK(!xs.empty(), "concat needs at least one input");
  auto shape = xs[0].shape();
  PD_CHECK(shape.size() >= 2, "concat inputs must be [N, C, ...]");
  const int64_t N = shape[0], inner = xs[0].numel() / (shape[0] * shape[1]);
  const size_t bytes = phi::SizeOf(xs[0].dtype());
  int64_t C = 0;
  for (const auto& x : xs) {
    PD_CHECK(x.is_cpu() && x.dtype() == xs[0].dtype(), "concat inputs must be CPU tensors of one dtype");
    PD_CHECK(x.shape().size() == shape.size() && x.shape()[0] == N && x.numel() == N * x.shape()[1] * inner,
             "concat inputs must agree but in their channels");
    C += x.shape()[1];
  }
  shape[1] = C;
  auto y = paddle::empty(shape, xs[0].dtype(), xs[0].place());
  char* py = static_cast<char*>(y.data());
  int64_t at = 0;
  for (const auto& x : xs) {
    const int64_t row = x.shape()[1] * inner * bytes;
    const char* px = static_cast<const char*>(x.data());
#pragma omp parallel for num_threads(threads()) schedule(static) if (N > 1)
    for (int64_t n = 0; n < N; ++n) std::memcpy(py + (n * C * inner) * bytes + at, px + n * row, row);
    at += row;
  }
  return {y};
}

std::vector<paddle::Tensor> ConcatBackward(const std::vector<paddle::Tensor>& xs, const paddle::Tensor& dy) {
  const int64_t N = xs[0].shape()[0], C = dy.shape()[1], inner = dy.numel() / (N * C);
  const size_t bytes = phi::SizeOf(dy.dtype());
  const char* pd = static_cast<const char*>(dy.data());
  std::vector<paddle::Tensor> dxs;
  int64_t at = 0;
  for (const auto& x : xs) {
    auto dx = paddle::empty(x.shape(), dy.dtype(), dy.place());
    const int64_t row = x.shape()[1] * inner * bytes;
    char* px = static_cast<char*>(dx.data());
#pragma omp parallel for num_threads(threads()) schedule(static) if (N > 1)
    for (int64_t n = 0; n < N; ++n) std::memcpy(px + n * row, pd + (n * C * inner) * bytes + at, row);
    at += row;
    dxs.push_back(dx);
  }
  return dxs;
}

std::vector<std::vector<int64_t>> ConcatInferShape(const std::vector<std::vector<int64_t>>& xs) {
  auto shape = xs[0];
  for (size_t i = 1; i < xs.size(); ++i) shape[1] += xs[i][1];
  return {shape};
}

std::vector<paddle::DataType> ConcatInferDtype(const std::vector<paddle::DataType>& xs) { return {xs[0]}; }

// ------------------------------------------------------------------- L2 norms of many tensors
// zoo_l2_norms: the L2 norm of each float32 tensor (gradient clipping's per-gradient norms), in one
// parallel pass over all of them: paddle's p_norm, one call per gradient, took 21% of the TSN demo's
// step. Sums of squares in double over fixed chunks, added in chunk order: the result does not depend
// on the threads.
std::vector<paddle::Tensor> L2NormsForward(const std::vector<paddle::Tensor>& xs) {
  PD_CHECK(!xs.empty(), "zoo_l2_norms needs at least one tensor");
  zoo_apply_fp_mode();
  constexpr int64_t kChunk = 1 << 15;
  std::vector<paddle::Tensor> dense(xs.size());
  std::vector<int64_t> first(xs.size() + 1, 0);   // the first chunk of each tensor
  for (size_t i = 0; i < xs.size(); ++i) {
    PD_CHECK(xs[i].is_cpu() && xs[i].dtype() == paddle::DataType::FLOAT32, "zoo_l2_norms takes float32 CPU tensors");
    dense[i] = xs[i].is_contiguous() ? xs[i] : xs[i].contiguous();
    first[i + 1] = first[i] + (xs[i].numel() + kChunk - 1) / kChunk;
  }
  std::vector<double> part(first.back());
#pragma omp parallel for num_threads(threads()) schedule(dynamic, 4)
  for (int64_t c = 0; c < first.back(); ++c) {
    const size_t i = std::upper_bound(first.begin(), first.end(), c) - first.begin() - 1;
    const float* x = dense[i].data<float>();
    const int64_t lo = (c - first[i]) * kChunk, hi = std::min(dense[i].numel(), lo + kChunk);
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = lo; j < hi; ++j) sum += static_cast<double>(x[j]) * x[j];
    part[c] = sum;
  }
  auto out = paddle::empty({static_cast<int64_t>(xs.size())}, paddle::DataType::FLOAT32, xs[0].place());
  float* norms = out.data<float>();
  for (size_t i = 0; i < xs.size(); ++i)
    norms[i] = static_cast<float>(std::sqrt(std::accumulate(part.begin() + first[i], part.begin() + first[i + 1],
                                                            0.0)));
  return {out};
}

// Y keeps the input's dtype; the saved statistics are float32 whatever it is
std::vector<paddle::DataType> BNActInferDtype(const paddle::DataType& x, const paddle::DataType& g,
                                              const paddle::DataType& be, const paddle::DataType& rm,
                                              const paddle::DataType& rv) {
  return {x, paddle::DataType::FLOAT32, paddle::DataType::FLOAT32};
}

std::vector<paddle::DataType> BNAddActInferDtype(const paddle::DataType& x, const paddle::DataType& g,
                                                 const paddle::DataType& be, const paddle::DataType& rm,
                                                 const paddle::DataType& rv, const paddle::DataType& res) {
  return {x, paddle::DataType::FLOAT32, paddle::DataType::FLOAT32};
}

// ------------------------------------------------------------------ RoIAlign, NCHW, float32
// paddle.vision.ops.roi_align (Mask R-CNN's box and mask heads) with its semantics: per bin, the mean
// of bilinear samples on a grid (sampling_ratio, or ceil(roi size / bins) when it is <= 0), half-pixel
// boxes when `aligned`, samples beyond one pixel outside the map count as zero. paddle's CPU kernels
// run one thread, and its backward was the largest operator of the Mask R-CNN demo's step (23%, with
// the forward 32%). Here each RoI's sample positions and weights are computed once for all channels;
// the forward runs in parallel over (RoI, channel), the backward over channels, so no two threads
// add into the same plane.
struct RoiSample {
  int32_t pos[4];
  float w[4];
};

struct RoiPlan {
  std::vector<int64_t> image, first, grid;   // per RoI: its image, its first sample, grid_h * grid_w
  std::vector<RoiSample> samples;
};

RoiPlan roi_plan(const float* boxes, const int32_t* boxes_num, int64_t B, int64_t R, int64_t H, int64_t W,
                 int64_t PH, int64_t PW, float scale, int sampling_ratio, bool aligned) {
  RoiPlan plan;
  plan.image.resize(R);
  plan.first.resize(R + 1, 0);
  plan.grid.resize(R);
  std::vector<int> gh(R), gw(R);
  std::vector<float> x0(R), y0(R), bh(R), bw(R);   // each RoI's corner and bin size on the map
  int64_t r = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int32_t k = 0; k < boxes_num[b]; ++k) plan.image[r++] = b;
  const float offset = aligned ? 0.5f : 0.f;
  for (r = 0; r < R; ++r) {
    const float* q = boxes + 4 * r;
    x0[r] = q[0] * scale - offset, y0[r] = q[1] * scale - offset;
    float rw = q[2] * scale - offset - x0[r], rh = q[3] * scale - offset - y0[r];
    if (!aligned) rw = std::max(rw, 1.f), rh = std::max(rh, 1.f);
    bh[r] = rh / PH, bw[r] = rw / PW;
    gh[r] = sampling_ratio > 0 ? sampling_ratio : static_cast<int>(std::ceil(rh / PH));
    gw[r] = sampling_ratio > 0 ? sampling_ratio : static_cast<int>(std::ceil(rw / PW));
    plan.grid[r] = std::max(gh[r] * gw[r], 1);
    plan.first[r + 1] = plan.first[r] + PH * PW * std::max(gh[r], 0) * std::max(gw[r], 0);
  }
  plan.samples.resize(plan.first[R]);
#pragma omp parallel for num_threads(threads()) schedule(static)
  for (int64_t i = 0; i < R; ++i) {
    RoiSample* s = plan.samples.data() + plan.first[i];
    for (int64_t ph = 0; ph < PH; ++ph)
      for (int64_t pw = 0; pw < PW; ++pw)
        for (int iy = 0; iy < gh[i]; ++iy) {
          float y = y0[i] + ph * bh[i] + (iy + .5f) * bh[i] / gh[i];
          for (int ix = 0; ix < gw[i]; ++ix, ++s) {
            float x = x0[i] + pw * bw[i] + (ix + .5f) * bw[i] / gw[i];
            if (y < -1.f || y > H || x < -1.f || x > W) {
              *s = RoiSample{{0, 0, 0, 0}, {0.f, 0.f, 0.f, 0.f}};
              continue;
            }
            float yy = std::max(y, 0.f), xx = std::max(x, 0.f);
            int64_t yl = static_cast<int64_t>(yy), xl = static_cast<int64_t>(xx), yh, xh;
            if (yl >= H - 1) yh = yl = H - 1, yy = static_cast<float>(yl);
            else yh = yl + 1;
            if (xl >= W - 1) xh = xl = W - 1, xx = static_cast<float>(xl);
            else xh = xl + 1;
            const float ly = yy - yl, lx = xx - xl, hy = 1.f - ly, hx = 1.f - lx;
            *s = RoiSample{{static_cast<int32_t>(yl * W + xl), static_cast<int32_t>(yl * W + xh),
                            static_cast<int32_t>(yh * W + xl), static_cast<int32_t>(yh * W + xh)},
                           {hy * hx, hy * lx, ly * hx, ly * lx}};
          }
        }
  }
  return plan;
}

void check_roi_align(const paddle::Tensor& x, const paddle::Tensor& boxes, const paddle::Tensor& boxes_num) {
  PD_CHECK(x.is_cpu() && x.dtype() == paddle::DataType::FLOAT32 && x.shape().size() == 4,
           "x must be a float32 CPU tensor [N, C, H, W]");
  PD_CHECK(boxes.is_cpu() && boxes.dtype() == paddle::DataType::FLOAT32 && boxes.shape().size() == 2 &&
               boxes.shape()[1] == 4, "boxes must be a float32 CPU tensor [R, 4]");
  PD_CHECK(boxes_num.is_cpu() && boxes_num.dtype() == paddle::DataType::INT32 && boxes_num.shape().size() == 1 &&
               boxes_num.shape()[0] <= x.shape()[0], "boxes_num must be an int32 CPU tensor [B], B <= N");
  PD_CHECK(x.shape()[2] * x.shape()[3] < (int64_t{1} << 31), "the feature map is too large for RoIAlign's offsets");
  const int32_t* n = boxes_num.data<int32_t>();
  int64_t total = 0;
  for (int64_t b = 0; b < boxes_num.shape()[0]; ++b) {
    PD_CHECK(n[b] >= 0, "boxes_num must not be negative");
    total += n[b];
  }
  PD_CHECK(total == boxes.shape()[0], "boxes_num must add up to the number of boxes");
}

std::vector<paddle::Tensor> RoiAlignForward(const paddle::Tensor& x, const paddle::Tensor& boxes,
                                            const paddle::Tensor& boxes_num, int pooled_height, int pooled_width,
                                            float spatial_scale, int sampling_ratio, bool aligned) {
  zoo_apply_fp_mode();
  check_roi_align(x, boxes, boxes_num);
  const int64_t C = x.shape()[1], H = x.shape()[2], W = x.shape()[3], R = boxes.shape()[0];
  const int64_t PH = pooled_height, PW = pooled_width, bins = PH * PW;
  auto y = paddle::empty({R, C, PH, PW}, x.dtype(), x.place());
  const RoiPlan plan = roi_plan(boxes.data<float>(), boxes_num.data<int32_t>(), boxes_num.shape()[0], R, H, W,
                                PH, PW, spatial_scale, sampling_ratio, aligned);
  const float* px = x.data<float>();
  float* py = y.data<float>();
#pragma omp parallel for collapse(2) num_threads(threads()) schedule(static)
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) {
      const float* plane = px + (plan.image[r] * C + c) * H * W;
      const RoiSample* s = plan.samples.data() + plan.first[r];
      const int64_t per_bin = (plan.first[r + 1] - plan.first[r]) / bins;
      const float inv = 1.f / plan.grid[r];
      float* out = py + (r * C + c) * bins;
      for (int64_t k = 0; k < bins; ++k) {
        float sum = 0.f;
        for (int64_t j = 0; j < per_bin; ++j, ++s)
          sum += s->w[0] * plane[s->pos[0]] + s->w[1] * plane[s->pos[1]] + s->w[2] * plane[s->pos[2]] +
                 s->w[3] * plane[s->pos[3]];
        out[k] = flush(sum * inv);
      }
    }
  return {y};
}

std::vector<paddle::Tensor> RoiAlignBackward(const paddle::Tensor& x, const paddle::Tensor& boxes,
                                             const paddle::Tensor& boxes_num, const paddle::Tensor& dy,
                                             int pooled_height, int pooled_width, float spatial_scale,
                                             int sampling_ratio, bool aligned) {
  zoo_apply_fp_mode();
  check_roi_align(x, boxes, boxes_num);
  const int64_t N = x.shape()[0], C = x.shape()[1], H = x.shape()[2], W = x.shape()[3], R = boxes.shape()[0];
  const int64_t PH = pooled_height, PW = pooled_width, bins = PH * PW;
  auto dx = paddle::empty(x.shape(), x.dtype(), x.place());
  const RoiPlan plan = roi_plan(boxes.data<float>(), boxes_num.data<int32_t>(), boxes_num.shape()[0], R, H, W,
                                PH, PW, spatial_scale, sampling_ratio, aligned);
  const float* pd = dy.data<float>();
  float* pdx = dx.data<float>();
  // channel-major: each plane (a few hundred KB) stays in cache while every RoI adds into it
#pragma omp parallel for num_threads(threads()) schedule(static)
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t n = 0; n < N; ++n) std::fill_n(pdx + (n * C + c) * H * W, H * W, 0.f);
    for (int64_t r = 0; r < R; ++r) {
      float* plane = pdx + (plan.image[r] * C + c) * H * W;
      const RoiSample* s = plan.samples.data() + plan.first[r];
      const int64_t per_bin = (plan.first[r + 1] - plan.first[r]) / bins;
      const float inv = 1.f / plan.grid[r];
      const float* g = pd + (r * C + c) * bins;
      for (int64_t k = 0; k < bins; ++k) {
        const float gk = g[k] * inv;
        for (int64_t j = 0; j < per_bin; ++j, ++s)
          for (int q = 0; q < 4; ++q) plane[s->pos[q]] += s->w[q] * gk;
      }
    }
    for (int64_t n = 0; n < N; ++n) {
      float* plane = pdx + (n * C + c) * H * W;
#pragma omp simd
      for (int64_t i = 0; i < H * W; ++i) plane[i] = flush(plane[i]);
    }
  }
  return {dx};
}

std::vector<std::vector<int64_t>> RoiAlignInferShape(const std::vector<int64_t>& x, const std::vector<int64_t>& boxes,
                                                     const std::vector<int64_t>& boxes_num, int pooled_height,
                                                     int pooled_width, float spatial_scale, int sampling_ratio,
                                                     bool aligned) {
  return {{boxes[0], x[1], pooled_height, pooled_width}};
}

// --------------------------------------------- polygon rasterisation (Mask R-CNN's mask targets)
// The masks pycocotools' frPyObjects + merge + decode give (maskApi.c rleFrPoly, what the official
// targets use), one set of parts per thread: each part's vertices scaled by 5 and truncated as C does,
// its edges walked in unit steps of their longer axis, and every step between x = 5c + 2 and 5c + 3
// toggles the pixel row below it in column c; the mask is the parity of the toggles down each column
// (column-major, a toggle past the last row starts the next column), the parts OR-ed. The tensor
// version (ops/reference.py) solves each (edge, column) pair instead of walking: the same pixels, and
// 22% of the Mask R-CNN demo's step on the CPU.
// Without fused multiply-adds: -march=native lets the compiler turn ys + s * t into one FMA, whose
// single rounding moves a truncation now and then (a pixel of tests/test_mask_rcnn_device.py's random
// masks differed with it).
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
void rasterize_part(const double* xy, int64_t n, int64_t h, int64_t w, std::vector<uint8_t>& flips,
                    std::vector<int>& u, std::vector<int>& v) {
  std::vector<int> x(n + 1), y(n + 1);
  for (int64_t j = 0; j < n; ++j) {
    x[j] = static_cast<int>(5.0 * xy[2 * j] + .5);
    y[j] = static_cast<int>(5.0 * xy[2 * j + 1] + .5);
  }
  x[n] = x[0], y[n] = y[0];
  u.clear(), v.clear();
  for (int64_t j = 0; j < n; ++j) {
    int xs = x[j], xe = x[j + 1], ys = y[j], ye = y[j + 1];
    const int dx = std::abs(xe - xs), dy = std::abs(ys - ye);
    const bool flip = (dx >= dy && xs > xe) || (dx < dy && ys > ye);
    if (flip) std::swap(xs, xe), std::swap(ys, ye);
    const double s = dx >= dy ? static_cast<double>(ye - ys) / dx : static_cast<double>(xe - xs) / dy;
    for (int d = 0, len = std::max(dx, dy); d <= len; ++d) {   // in the edge's own direction
      const int t = flip ? len - d : d;
      if (dx >= dy) u.push_back(t + xs), v.push_back(static_cast<int>(ys + s * t + .5));
      else v.push_back(t + ys), u.push_back(static_cast<int>(xs + s * t + .5));
    }
  }
  for (size_t j = 1; j < u.size(); ++j) {
    if (u[j] == u[j - 1]) continue;
    double xd = u[j] < u[j - 1] ? u[j] : u[j] - 1;
    xd = (xd + .5) / 5.0 - .5;
    if (std::floor(xd) != xd || xd < 0 || xd > w - 1) continue;
    double yd = (std::min(v[j], v[j - 1]) + .5) / 5.0 - .5;
    yd = std::ceil(yd < 0 ? 0 : (yd > h ? h : yd));
    flips[static_cast<int64_t>(xd) * h + static_cast<int64_t>(yd)] ^= 1;
  }
}
#pragma GCC pop_options

std::vector<paddle::Tensor> RasterizeForward(const paddle::Tensor& xy, const paddle::Tensor& counts, int height,
                                             int width) {
  PD_CHECK(xy.is_cpu() && xy.dtype() == paddle::DataType::FLOAT64 && xy.shape().size() == 3 && xy.shape()[2] == 2,
           "xy must be a float64 CPU tensor [F, V, 2]");
  PD_CHECK(counts.is_cpu() && counts.dtype() == paddle::DataType::INT32 && counts.shape().size() == 2 &&
               counts.shape()[0] == xy.shape()[0], "counts must be an int32 CPU tensor [F, K]");
  const int64_t F = xy.shape()[0], V = xy.shape()[1], K = counts.shape()[1], h = height, w = width;
  auto masks = paddle::empty({F, h, w}, paddle::DataType::UINT8, xy.place());
  const double* pxy = xy.data<double>();
  const int32_t* pc = counts.data<int32_t>();
  uint8_t* pm = masks.data<uint8_t>();
  for (int64_t f = 0; f < F; ++f) {
    int64_t total = 0;
    for (int64_t k = 0; k < K; ++k) {
      PD_CHECK(pc[f * K + k] >= 0, "a part's vertex count is negative");
      total += pc[f * K + k];
    }
    PD_CHECK(total <= V, "a set's part vertex counts add up to more than its ", V, " vertices");
  }
#pragma omp parallel num_threads(threads())
  {
    std::vector<uint8_t> flips(h * w + 1), inside(h * w);
    std::vector<int> u, v;
#pragma omp for schedule(dynamic)
    for (int64_t f = 0; f < F; ++f) {
      std::fill(inside.begin(), inside.end(), 0);
      int64_t start = 0;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t n = pc[f * K + k];
        if (n >= 3) {
          std::fill(flips.begin(), flips.end(), 0);
          rasterize_part(pxy + (f * V + start) * 2, n, h, w, flips, u, v);
          uint8_t on = 0;
          for (int64_t i = 0; i < h * w; ++i) inside[i] |= (on ^= flips[i]);
        }
        start += n;
      }
      for (int64_t r = 0; r < h; ++r)        // column-major parity -> the [h, w] image
        for (int64_t c = 0; c < w; ++c) pm[(f * h + r) * w + c] = inside[c * h + r];
    }
  }
  return {masks};
}

}  // namespace

PD_BUILD_OP(zoo_bias_act)
    .Inputs({"X", "Bias"})
    .Outputs({"Out", "Keep"})
    .Attrs({"act: int", "seed: int64_t", "p: float"})
    .SetKernelFn(PD_KERNEL(BiasActForward));
PD_BUILD_GRAD_OP(zoo_bias_act)
    .Inputs({"X", "Bias", "Keep", paddle::Grad("Out")})
    .Outputs({paddle::Grad("X"), paddle::Grad("Bias")})
    .Attrs({"act: int", "p: float"})
    .SetKernelFn(PD_KERNEL(BiasActBackward));

PD_BUILD_OP(zoo_bias_dropout)
    .Inputs({"X", "Bias"})
    .Outputs({"Out", "Keep"})
    .Attrs({"seed: int64_t", "p: float"})
    .SetKernelFn(PD_KERNEL(BiasDropoutForward));
PD_BUILD_GRAD_OP(zoo_bias_dropout)
    .Inputs({"Keep", paddle::Grad("Out")})
    .Outputs({paddle::Grad("X"), paddle::Grad("Bias")})
    .Attrs({"p: float"})
    .SetKernelFn(PD_KERNEL(BiasDropoutBackward));

PD_BUILD_OP(zoo_bias_dropout_residual)
    .Inputs({"X", "Bias", "Residual"})
    .Outputs({"Out", "Keep"})
    .Attrs({"seed: int64_t", "p: float"})
    .SetKernelFn(PD_KERNEL(BDRForward));
PD_BUILD_GRAD_OP(zoo_bias_dropout_residual)
    .Inputs({"Keep", paddle::Grad("Out")})
    .Outputs({paddle::Grad("X"), paddle::Grad("Bias"), paddle::Grad("Residual")})
    .Attrs({"p: float"})
    .SetKernelFn(PD_KERNEL(BDRBackward));

PD_BUILD_OP(zoo_bias_dropout_residual_ln)
    .Inputs({"X", "Bias", "Residual", "Weight", "NormBias"})
    .Outputs({"Out", "Keep", "H", "Mean", "Rstd"})
    .Attrs({"seed: int64_t", "p: float", "eps: float"})
    .SetKernelFn(PD_KERNEL(BDRLNForward));
PD_BUILD_GRAD_OP(zoo_bias_dropout_residual_ln)
    .Inputs({"Keep", "H", "Weight", "Mean", "Rstd", paddle::Grad("Out")})
    .Outputs({paddle::Grad("X"), paddle::Grad("Bias"), paddle::Grad("Residual"), paddle::Grad("Weight"),
              paddle::Grad("NormBias")})
    .Attrs({"p: float"})
    .SetKernelFn(PD_KERNEL(BDRLNBackward));

PD_BUILD_OP(zoo_layer_norm)
    .Inputs({"X", "Weight", "Bias"})
    .Outputs({"Out", "Mean", "Rstd"})
    .Attrs({"eps: float"})
    .SetKernelFn(PD_KERNEL(LNForward));
PD_BUILD_GRAD_OP(zoo_layer_norm)
    .Inputs({"X", "Weight", "Mean", "Rstd", paddle::Grad("Out")})
    .Outputs({paddle::Grad("X"), paddle::Grad("Weight"), paddle::Grad("Bias")})
    .SetKernelFn(PD_KERNEL(LNBackward));

PD_BUILD_OP(zoo_softmax_dropout)
    .Inputs({"X", "Mask"})
    .Outputs({"Out", "Probs", "Keep"})
    .Attrs({"scale: float", "seed: int64_t", "p: float"})
    .SetKernelFn(PD_KERNEL(SoftmaxForward));
PD_BUILD_GRAD_OP(zoo_softmax_dropout)
    .Inputs({"Probs", "Keep", paddle::Grad("Out")})
    .Outputs({paddle::Grad("X")})
    .Attrs({"scale: float", "p: float"})
    .SetKernelFn(PD_KERNEL(SoftmaxBackward));

PD_BUILD_OP(zoo_bn_act)
    .Inputs({"X", "Scale", "Bias", "RunningMean", "RunningVar"})
    .Outputs({"Y", "SavedMean", "SavedInvStd"})
    .Attrs({"momentum: float", "eps: float", "relu: bool"})
    .SetKernelFn(PD_KERNEL(BNActForward))
    .SetInferDtypeFn(PD_INFER_DTYPE(BNActInferDtype));
PD_BUILD_GRAD_OP(zoo_bn_act)
    .Inputs({"X", "Scale", "SavedMean", "SavedInvStd", "Y", paddle::Grad("Y")})
    .Outputs({paddle::Grad("X"), paddle::Grad("Scale"), paddle::Grad("Bias")})
    .Attrs({"relu: bool"})
    .SetKernelFn(PD_KERNEL(BNActBackward));

PD_BUILD_OP(zoo_bn_add_act)
    .Inputs({"X", "Scale", "Bias", "RunningMean", "RunningVar", "Residual"})
    .Outputs({"Y", "SavedMean", "SavedInvStd"})
    .Attrs({"momentum: float", "eps: float", "relu: bool"})
    .SetKernelFn(PD_KERNEL(BNAddActForward))
    .SetInferDtypeFn(PD_INFER_DTYPE(BNAddActInferDtype));
PD_BUILD_GRAD_OP(zoo_bn_add_act)
    .Inputs({"X", "Scale", "SavedMean", "SavedInvStd", "Y", paddle::Grad("Y")})
    .Outputs({paddle::Grad("X"), paddle::Grad("Scale"), paddle::Grad("Bias"), paddle::Grad("Residual")})
    .Attrs({"relu: bool"})
    .SetKernelFn(PD_KERNEL(BNAddActBackward));

PD_BUILD_OP(zoo_bn_global_act)
    .Inputs({"X", "Scale", "Bias", "RunningMean", "RunningVar"})
    .Outputs({"Y", "SavedMean", "SavedInvStd"})
    .Attrs({"eps: float", "relu: bool"})
    .SetKernelFn(PD_KERNEL(BNGlobalActForward))
    .SetInferDtypeFn(PD_INFER_DTYPE(BNActInferDtype));
PD_BUILD_GRAD_OP(zoo_bn_global_act)
    .Inputs({"X", "Scale", "SavedMean", "SavedInvStd", "Y", paddle::Grad("Y")})
    .Outputs({paddle::Grad("X"), paddle::Grad("Scale"), paddle::Grad("Bias")})
    .Attrs({"relu: bool"})
    .SetKernelFn(PD_KERNEL(BNGlobalActBackward));

PD_BUILD_OP(zoo_bn_global_add_act)
    .Inputs({"X", "Scale", "Bias", "RunningMean", "RunningVar", "Residual"})
    .Outputs({"Y", "SavedMean", "SavedInvStd"})
    .Attrs({"eps: float", "relu: bool"})
    .SetKernelFn(PD_KERNEL(BNGlobalAddActForward))
    .SetInferDtypeFn(PD_INFER_DTYPE(BNAddActInferDtype));
PD_BUILD_GRAD_OP(zoo_bn_global_add_act)
    .Inputs({"X", "Scale", "SavedMean", "SavedInvStd", "Y", paddle::Grad("Y")})
    .Outputs({paddle::Grad("X"), paddle::Grad("Scale"), paddle::Grad("Bias"), paddle::Grad("Residual")})
    .Attrs({"relu: bool"})
    .SetKernelFn(PD_KERNEL(BNGlobalAddActBackward));

PD_BUILD_OP(zoo_pool2d_bf16)
    .Inputs({"X"})
    .Outputs({"Out", "Arg"})
    .Attrs({"kernel: std::vector<int64_t>", "strides: std::vector<int64_t>", "pads: std::vector<int64_t>",
            "ceil_mode: bool", "is_max: bool", "exclusive: bool"})
    .SetKernelFn(PD_KERNEL(PoolForward))
    .SetInferDtypeFn(PD_INFER_DTYPE(PoolInferDtype));
PD_BUILD_GRAD_OP(zoo_pool2d_bf16)
    .Inputs({"X", "Arg", paddle::Grad("Out")})
    .Outputs({paddle::Grad("X")})
    .Attrs({"kernel: std::vector<int64_t>", "strides: std::vector<int64_t>", "pads: std::vector<int64_t>",
            "ceil_mode: bool", "is_max: bool", "exclusive: bool"})
    .SetKernelFn(PD_KERNEL(PoolBackward));

PD_BUILD_OP(zoo_channel_bias)
    .Inputs({"X", "Bias"})
    .Outputs({"Out"})
    .SetKernelFn(PD_KERNEL(ChannelBiasForward));
PD_BUILD_GRAD_OP(zoo_channel_bias)
    .Inputs({"Bias", paddle::Grad("Out")})
    .Outputs({paddle::Grad("X"), paddle::Grad("Bias")})
    .SetKernelFn(PD_KERNEL(ChannelBiasBackward));

PD_BUILD_OP(zoo_concat_channels)
    .Inputs({paddle::Vec("X")})
    .Outputs({"Out"})
    .SetKernelFn(PD_KERNEL(ConcatForward))
    .SetInferShapeFn(PD_INFER_SHAPE(ConcatInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(ConcatInferDtype));
PD_BUILD_GRAD_OP(zoo_concat_channels)
    .Inputs({paddle::Vec("X"), paddle::Grad("Out")})
    .Outputs({paddle::Grad(paddle::Vec("X"))})
    .SetKernelFn(PD_KERNEL(ConcatBackward));

PD_BUILD_OP(zoo_l2_norms)
    .Inputs({paddle::Vec("X")})
    .Outputs({"Out"})
    .SetKernelFn(PD_KERNEL(L2NormsForward));

PD_BUILD_OP(zoo_smooth_cross_entropy)
    .Inputs({"Logits", "Labels"})
    .Outputs({"Loss", "Nll", "Lse"})
    .Attrs({"eps: float"})
    .SetKernelFn(PD_KERNEL(SmoothCEForward))
    .SetInferShapeFn(PD_INFER_SHAPE(SmoothCEInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(SmoothCEInferDtype));
PD_BUILD_GRAD_OP(zoo_smooth_cross_entropy)
    .Inputs({"Logits", "Labels", "Lse", paddle::Grad("Loss"), paddle::Grad("Nll")})
    .Outputs({paddle::Grad("Logits")})
    .Attrs({"eps: float"})
    .SetKernelFn(PD_KERNEL(SmoothCEBackward));

PD_BUILD_OP(zoo_roi_align)
    .Inputs({"X", "Boxes", "BoxesNum"})
    .Outputs({"Out"})
    .Attrs({"pooled_height: int", "pooled_width: int", "spatial_scale: float", "sampling_ratio: int",
            "aligned: bool"})
    .SetKernelFn(PD_KERNEL(RoiAlignForward))
    .SetInferShapeFn(PD_INFER_SHAPE(RoiAlignInferShape));
PD_BUILD_GRAD_OP(zoo_roi_align)
    .Inputs({"X", "Boxes", "BoxesNum", paddle::Grad("Out")})
    .Outputs({paddle::Grad("X")})
    .Attrs({"pooled_height: int", "pooled_width: int", "spatial_scale: float", "sampling_ratio: int",
            "aligned: bool"})
    .SetKernelFn(PD_KERNEL(RoiAlignBackward));

PD_BUILD_OP(zoo_rasterize_polygons)
    .Inputs({"XY", "Counts"})
    .Outputs({"Masks"})
    .Attrs({"height: int", "width: int"})
    .SetKernelFn(PD_KERNEL(RasterizeForward));

// CPU operators on oneDNN, the libdnnl.so.3 that the paddle wheel bundles (3.6 here). Why: paddle's
// matmul runs on its bundled MKL 2019, which on AMD takes its AVX2 path (MKL_DEBUG_CPU_TYPE=5) and on
// every CPU misses newer kernels; oneDNN's brgemm matmul picks the CPU's best ISA (AVX-512 on Zen 4/5 and
// on the Intel Xeons). Measured on our AMD EPYC (2 threads): 1.6-2.0x paddle.matmul on every
// layer GEMM of the Transformer-base step, 1.0-1.5x on its batched attention (benchmarks/kernel_shapes.py).
//
// oneDNN is built with the OpenMP runtime and its GOMP/omp calls resolve to paddle's libiomp5 (loaded before libgomp): one thread pool with
// MKL and the kernels of ops.cc, sized by ZOO_FAST_OPS_THREADS.
//
// bf16 (ops.autocast, train.amp.dtype bfloat16): the same operators with bf16 operands and fp32
// results and gradients, accumulated in fp32 (oneDNN's avx512_core_bf16 / AMX kernels). The fp32
// tensors are rounded to bf16 at the operator (round to nearest even). zoo_matmul_bf16 keeps both
// rounded operands for the backward GEMMs (its second and third outputs: half the bytes of the fp32
// ones, no second rounding); zoo_linear_bf16 (y a weight, a parameter alive anyway) keeps x's and
// rounds y again; convolution rounds inside the reorders to oneDNN's blocked layouts it does anyway.
// The other route, oneDNN's fpmath_mode = bf16 on the fp32 primitives (the `fpmath` attribute), is
// kept for measuring: on our AMD EPYC oneDNN 3.6 ignores it.
//
// Layout: a shared section (engine, stream, lock, thread count and one bounded cache of prepared
// problems), then one section per operator: matmul (C API), convolution (C++ API, its reorders at the
// NCHW boundary). Each operator caches what it prepares by problem (shape, strides, thread count).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "bf16.h"
#include "paddle/extension.h"

// The library is the paddle wheel's (oneDNN 3.6, built without the experimental sparse API); the
// headers come from an older 3.x package (the C ABI is stable within 3.x) whose config turns that API
// on: turn it off before the API is read (the config header is include-guarded).
#include "oneapi/dnnl/dnnl_config.h"
#undef DNNL_EXPERIMENTAL_SPARSE
#include "oneapi/dnnl/dnnl.hpp"

void zoo_apply_fp_mode();  // ops.cc: runtime.flush_denormals on the calling thread

namespace zoo_dnnl {

void ok(dnnl_status_t s, const char* what) { PD_CHECK(s == 0, "oneDNN ", what, " failed (status ", s, ")"); }

// ------------------------------------------------------------------------------ shared helpers
int threads() {
  const char* env = std::getenv("ZOO_FAST_OPS_THREADS");
  int n = env ? std::atoi(env) : 0;
  return n > 0 ? n : omp_get_max_threads();
}

// A primitive with the memory descriptors of its arguments (in execution-argument order); owns them.
struct Primitive {
  dnnl_primitive_t prim = nullptr;
  std::vector<std::pair<int, dnnl_memory_desc_t>> args;
  dnnl_memory_desc_t scratchpad = nullptr;  // made in user scratchpad mode: Context::scratchpad at each call
  Primitive() = default;
  Primitive(const Primitive&) = delete;
  Primitive& operator=(const Primitive&) = delete;
  ~Primitive() {
    if (prim != nullptr) dnnl_primitive_destroy(prim);
    for (auto& a : args) dnnl_memory_desc_destroy(a.second);
    if (scratchpad != nullptr) dnnl_memory_desc_destroy(scratchpad);
  }
};

// The CPU engine, an in-order stream, one lock and an LRU cache of whatever an operator prepares for
// a problem (primitives, descriptors), by key. The context lives for the process (never destroyed at
// exit: the library may be unloaded first).
class Context {
 public:
  static Context& get() {
    static Context* c = new Context();
    return *c;
  }
  const dnnl::engine& engine() const { return engine_; }
  dnnl::stream& stream() { return stream_; }

  // Held for one operator call: one problem runs at a time, with the configured number of OpenMP
  // threads (oneDNN sizes its parallel regions by it), which is also part of every cache key.
  std::unique_lock<std::mutex> enter(int* nthreads) {
    std::unique_lock<std::mutex> lock(mu_);
    zoo_apply_fp_mode();   // the denormal guard on the calling thread; OpenMP copies it to oneDNN's workers
    *nthreads = threads();
    if (omp_get_max_threads() != *nthreads) omp_set_num_threads(*nthreads);
    return lock;
  }

  // What `make()` prepared for `key` (a std::shared_ptr<T>), made on a miss; call inside enter().
  template <typename T, typename Make>
  T& cached(const std::string& key, Make make) {
    auto it = index_.find(key);
    if (it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return *static_cast<T*>(it->second->second.get());
    }
    if (lru_.size() >= kCapacity) {  // sequence lengths and image sizes vary per batch: keep the recent
      index_.erase(lru_.back().first);
      lru_.pop_back();
    }
    std::shared_ptr<T> made = make();
    lru_.emplace_front(key, made);
    index_[key] = lru_.begin();
    return *made;
  }

  // The work space of every primitive we make (user scratchpad mode), one buffer grown to the largest
  // asked; calls run one at a time (enter()), so they can share it. In oneDNN's own mode each cached
  // primitive held its own: paddle's oneDNN is built for concurrent execution. Call inside enter().
  void* scratchpad(size_t bytes) {
    if (bytes > scratch_bytes_) {
      const size_t n = (bytes + 4095) / 4096 * 4096;
      void* p = std::aligned_alloc(4096, n);
      PD_CHECK(p != nullptr, "oneDNN's work space: cannot allocate ", n, " bytes");
      scratch_.reset(p);
      scratch_bytes_ = n;
    }
    return scratch_.get();
  }
  dnnl::memory scratchpad(const dnnl::memory::desc& d) { return dnnl::memory(d, engine_, scratchpad(d.get_size())); }
  size_t scratchpad_bytes() const { return scratch_bytes_; }

  // Executes the primitive cached under `key` (built by `make` on a miss) on `ptrs` (one data pointer
  // per argument, in the order of Primitive::args).
  template <typename Make>
  void run(const std::string& key, Make make, const std::vector<void*>& ptrs) {
    int nt;
    auto lock = enter(&nt);
    const Primitive& p = cached<Primitive>(key + "|t" + std::to_string(nt), make);
    const size_t n = p.args.size() + (p.scratchpad != nullptr);
    std::vector<dnnl_memory_t> mems(n);
    std::vector<dnnl_exec_arg_t> args(n);
    for (size_t i = 0; i < p.args.size(); ++i) {
      ok(dnnl_memory_create(&mems[i], p.args[i].second, engine_.get(), ptrs[i]), "memory_create");
      args[i] = {p.args[i].first, mems[i]};
    }
    if (p.scratchpad != nullptr) {
      ok(dnnl_memory_create(&mems.back(), p.scratchpad, engine_.get(),
                            scratchpad(dnnl_memory_desc_get_size(p.scratchpad))), "memory_create");
      args.back() = {DNNL_ARG_SCRATCHPAD, mems.back()};
    }
    dnnl_status_t s = dnnl_primitive_execute(p.prim, stream_.get(), static_cast<int>(args.size()), args.data());
    if (s == 0) s = dnnl_stream_wait(stream_.get());
    for (auto m : mems) dnnl_memory_destroy(m);
    ok(s, "primitive_execute");
  }

 private:
  Context() : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {}

  static constexpr size_t kCapacity = 1024;
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> scratch_;
  size_t scratch_bytes_ = 0;
  dnnl::engine engine_;
  dnnl::stream stream_;
  std::mutex mu_;
  std::list<std::pair<std::string, std::shared_ptr<void>>> lru_;
  std::unordered_map<std::string, std::list<std::pair<std::string, std::shared_ptr<void>>>::iterator> index_;
};

dnnl_memory_desc_t strided_desc(int ndims, const int64_t* dims, const int64_t* strides, dnnl_data_type_t type) {
  dnnl_dims_t d = {0}, s = {0};
  for (int i = 0; i < ndims; ++i) d[i] = dims[i], s[i] = strides[i];
  dnnl_memory_desc_t md;
  ok(dnnl_memory_desc_create_with_strides(&md, ndims, d, type, s), "memory_desc_create");
  return md;
}

// ------------------------------------------------------------------------------------- bf16
// Whether oneDNN's effective ISA here (within ONEDNN_MAX_CPU_ISA) includes `want`.
bool isa_has(dnnl_cpu_isa_t want) {
  const unsigned isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  return (isa & static_cast<unsigned>(want)) == static_cast<unsigned>(want);
}

// Whether oneDNN runs bf16 natively here (avx512_core_bf16 or AMX, within ONEDNN_MAX_CPU_ISA); below
// that it would emulate or refuse, and ops.autocast stays in fp32.
bool bf16_native() { return isa_has(dnnl_cpu_isa_avx512_core_bf16); }

// dst[i] = bf16(src[i]): the hardware conversion (vcvtneps2bf16) where the CPU has it, else bf16.h's,
// which rounds alike (nearest even, a subnormal to zero).
void to_bf16(const float* src, uint16_t* dst, int64_t n, int nthreads) {
  constexpr int64_t kChunk = 1 << 14;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
    int64_t i = lo;
#ifdef __AVX512BF16__
    for (; i + 16 <= hi; i += 16) {
      __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + i));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), reinterpret_cast<__m256i&>(h));
    }
#endif
    for (; i < hi; ++i) dst[i] = zoo_bf16::bits(src[i]);
  }
}

paddle::Tensor bf16_copy(const paddle::Tensor& t, int nthreads) {
  auto out = paddle::empty(t.shape(), paddle::DataType::BFLOAT16, t.place());
  to_bf16(t.data<float>(), reinterpret_cast<uint16_t*>(out.data<paddle::bfloat16>()), t.numel(), nthreads);
  return out;
}

void check_f32_cpu(const paddle::Tensor& t, const char* what) {
  PD_CHECK(t.is_cpu(), what, " must be a CPU tensor");
  PD_CHECK(t.dtype() == paddle::DataType::FLOAT32, what, " must be float32");
}

// ================================================================================ matmul
// C[b] (M x N, contiguous, fp32) = A[b] (M x K) @ B[b] (K x N), A and B given by element strides
// (batch, row, column) and their type (both fp32 or both bf16): a transposed operand is the same
// memory with row and column strides swapped. `fpmath`: fp32 operands computed in bf16 by oneDNN.
struct Operand {
  const void* data;
  int64_t sb, sr, sc;  // strides of batch, row, column
  dnnl_data_type_t type;
  Operand t() const { return {data, sb, sc, sr, type}; }
};

float operand_at(const Operand& o, int64_t i) {
  if (o.type != dnnl_bf16) return static_cast<const float*>(o.data)[i];
  const uint32_t u = static_cast<uint32_t>(static_cast<const uint16_t*>(o.data)[i]) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// K = 1: an outer product, computed here. oneDNN 3.6's avx512_core matmul wrote NaN for some such
// shapes on amd-zen4 (a linear layer to 1 output: its input gradient at 1200 x 1 x 256), which broke
// AttentionLSTM's attention (tests/test_fast_ops.py test_linear_to_one_output).
void outer(int64_t batch, int64_t M, int64_t N, const Operand& a, const Operand& b, float* c) {
#pragma omp parallel for collapse(2) num_threads(threads()) schedule(static) if (batch * M * N > (1 << 14))
  for (int64_t bi = 0; bi < batch; ++bi)
    for (int64_t m = 0; m < M; ++m) {
      const float x = operand_at(a, bi * a.sb + m * a.sr);
      float* row = c + (bi * M + m) * N;
      for (int64_t n = 0; n < N; ++n) row[n] = x * operand_at(b, bi * b.sb + n * b.sc);
    }
}

void gemm(int64_t batch, int64_t M, int64_t K, int64_t N, const Operand& a, const Operand& b, float* c,
          bool fpmath = false) {
  if (batch == 0 || M == 0 || N == 0) return;
  if (K == 0) {
    std::memset(c, 0, sizeof(float) * batch * M * N);
    return;
  }
  if (K == 1) {
    int nt;
    auto lock = Context::get().enter(&nt);   // the denormal guard and the thread count, as oneDNN's calls
    outer(batch, M, N, batch > 1 ? a : Operand{a.data, 0, a.sr, a.sc, a.type},
          batch > 1 ? b : Operand{b.data, 0, b.sr, b.sc, b.type}, c);
    return;
  }
  std::string key = "matmul";
  for (int64_t v : {batch, M, K, N, a.sb, a.sr, a.sc, b.sb, b.sr, b.sc, int64_t(a.type), int64_t(fpmath)})
    key += "," + std::to_string(v);
  auto make = [&]() {
    const int64_t ad[3] = {batch, M, K}, as[3] = {batch > 1 ? a.sb : M * K, a.sr, a.sc};
    const int64_t bd[3] = {batch, K, N}, bs[3] = {batch > 1 ? b.sb : K * N, b.sr, b.sc};
    const int64_t cd[3] = {batch, M, N}, cs[3] = {M * N, N, 1};
    auto p = std::make_shared<Primitive>();
    p->args = {{DNNL_ARG_SRC, strided_desc(3, ad, as, a.type)},
               {DNNL_ARG_WEIGHTS, strided_desc(3, bd, bs, b.type)},
               {DNNL_ARG_DST, strided_desc(3, cd, cs, dnnl_f32)}};
    dnnl_primitive_attr_t attr = nullptr;
    ok(dnnl_primitive_attr_create(&attr), "primitive_attr_create");
    ok(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user), "set_scratchpad_mode");
    if (fpmath) ok(dnnl_primitive_attr_set_fpmath_mode(attr, dnnl_fpmath_mode_bf16), "set_fpmath_mode");
    dnnl_primitive_desc_t pd;
    dnnl_status_t made = dnnl_matmul_primitive_desc_create(&pd, Context::get().engine().get(), p->args[0].second,
                                                           p->args[1].second, nullptr, p->args[2].second, attr);
    dnnl_primitive_attr_destroy(attr);
    ok(made, "matmul_primitive_desc_create");
    dnnl_status_t s = dnnl_primitive_create(&p->prim, pd);
    const_dnnl_memory_desc_t scratch = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    if (s == 0 && scratch != nullptr && dnnl_memory_desc_get_size(scratch) > 0)
      s = dnnl_memory_desc_clone(&p->scratchpad, scratch);
    dnnl_primitive_desc_destroy(pd);
    ok(s, "primitive_create");
    return p;
  };
  Context::get().run(key, make, {const_cast<void*>(a.data), const_cast<void*>(b.data), c});
}

// The problem of paddle.matmul(x, y, tx, ty) for the two shapes we take (ops.functional.matmul checks them):
// y 2-D and x not transposed (x's leading axes fold into the rows: one GEMM, also for the weight
// gradient), or x and y with the same leading (batch) axes.
struct MatmulShape {
  int64_t batch, M, K, N;
  int64_t xr, xc, yr, yc;  // stored matrix sizes
  std::vector<int64_t> out;
};

MatmulShape matmul_shape(const std::vector<int64_t>& xs, const std::vector<int64_t>& ys, bool tx, bool ty) {
  PD_CHECK(xs.size() >= 2 && ys.size() >= 2, "zoo_matmul: operands need 2 or more axes");
  MatmulShape s;
  s.xr = xs[xs.size() - 2], s.xc = xs.back(), s.yr = ys[ys.size() - 2], s.yc = ys.back();
  s.K = tx ? s.xr : s.xc;
  int64_t ky = ty ? s.yc : s.yr;
  s.N = ty ? s.yr : s.yc;
  PD_CHECK(s.K == ky, "zoo_matmul: inner sizes differ (", s.K, " vs ", ky, ")");
  if (ys.size() == 2 && !tx) {
    s.batch = 1;
    s.M = 1;
    for (size_t i = 0; i + 1 < xs.size(); ++i) s.M *= xs[i];
    s.xr = s.M;
    s.out.assign(xs.begin(), xs.end() - 1);
  } else {
    PD_CHECK(xs.size() == ys.size() && std::equal(xs.begin(), xs.end() - 2, ys.begin()),
             "zoo_matmul: batched operands need the same leading axes");
    s.batch = 1;
    for (size_t i = 0; i + 2 < xs.size(); ++i) s.batch *= xs[i];
    s.M = tx ? s.xc : s.xr;
    s.out.assign(xs.begin(), xs.end() - 2);
    s.out.push_back(s.M);
  }
  s.out.push_back(s.N);
  return s;
}

// op(X) and op(Y) as operands of the forward GEMM
Operand x_operand(const MatmulShape& s, const void* x, bool tx, dnnl_data_type_t type) {
  Operand a{x, s.xr * s.xc, s.xc, 1, type};
  return tx ? a.t() : a;
}
Operand y_operand(const MatmulShape& s, const void* y, bool ty, bool batched, dnnl_data_type_t type) {
  Operand b{y, batched ? s.yr * s.yc : 0, s.yc, 1, type};
  return ty ? b.t() : b;
}

paddle::Tensor dense(const paddle::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

const void* raw(const paddle::Tensor& t) {
  return t.dtype() == paddle::DataType::BFLOAT16 ? static_cast<const void*>(t.data<paddle::bfloat16>())
                                                 : static_cast<const void*>(t.data<float>());
}

dnnl_data_type_t dnnl_type(const paddle::Tensor& t) {
  return t.dtype() == paddle::DataType::BFLOAT16 ? dnnl_bf16 : dnnl_f32;
}

paddle::Tensor matmul_forward(const paddle::Tensor& x, const paddle::Tensor& y, bool tx, bool ty, bool fpmath) {
  MatmulShape s = matmul_shape(x.shape(), y.shape(), tx, ty);
  auto out = paddle::empty(s.out, paddle::DataType::FLOAT32, x.place());
  bool batched = y.shape().size() > 2;
  gemm(s.batch, s.M, s.K, s.N, x_operand(s, raw(x), tx, dnnl_type(x)), y_operand(s, raw(y), ty, batched, dnnl_type(y)),
       out.data<float>(), fpmath);
  return out;
}

// dX = dC op(Y)^T (stored transposed when tx); dY = op(X)^T dC (stored transposed when ty). With a
// 2-D y and folded rows, dY's GEMM sums over all rows of x at once. x, y and dout are contiguous, all
// fp32 or all bf16; the gradients are fp32.
std::vector<paddle::Tensor> matmul_backward(const paddle::Tensor& x, const paddle::Tensor& y, const paddle::Tensor& dout,
                                            bool tx, bool ty, bool fpmath) {
  MatmulShape s = matmul_shape(x.shape(), y.shape(), tx, ty);
  bool batched = y.shape().size() > 2;
  auto dx = paddle::empty(x.shape(), paddle::DataType::FLOAT32, x.place());
  auto dy = paddle::empty(y.shape(), paddle::DataType::FLOAT32, y.place());
  const dnnl_data_type_t type = dnnl_type(x);
  Operand a = x_operand(s, raw(x), tx, type), b = y_operand(s, raw(y), ty, batched, type);
  Operand dc{raw(dout), s.M * s.N, s.N, 1, type};
  if (!tx)
    gemm(s.batch, s.M, s.N, s.K, dc, b.t(), dx.data<float>(), fpmath);   // [M, N] @ [N, K]
  else
    gemm(s.batch, s.K, s.N, s.M, b, dc.t(), dx.data<float>(), fpmath);   // [K, N] @ [N, M]
  int64_t yb = batched ? s.batch : 1;
  if (!ty)
    gemm(yb, s.K, s.M, s.N, a.t(), dc, dy.data<float>(), fpmath);        // [K, M] @ [M, N]
  else
    gemm(yb, s.N, s.M, s.K, dc.t(), a, dy.data<float>(), fpmath);        // [N, M] @ [M, K]
  return {dx, dy};
}

// zoo_matmul: fp32 operands (`fpmath`: oneDNN may compute in bf16).
std::vector<paddle::Tensor> MatmulForward(const paddle::Tensor& x, const paddle::Tensor& y, bool tx, bool ty,
                                          bool fpmath) {
  check_f32_cpu(x, "X");
  check_f32_cpu(y, "Y");
  return {matmul_forward(dense(x), dense(y), tx, ty, fpmath)};
}

std::vector<paddle::Tensor> MatmulBackward(const paddle::Tensor& x, const paddle::Tensor& y,
                                           const paddle::Tensor& dout, bool tx, bool ty, bool fpmath) {
  return matmul_backward(dense(x), dense(y), dense(dout), tx, ty, fpmath);
}

// zoo_matmul_bf16: fp32 operands rounded to bf16 once; the rounded copies are outputs 2 and 3, which
// the backward reads instead of the fp32 operands.
std::vector<paddle::Tensor> MatmulBf16Forward(const paddle::Tensor& x, const paddle::Tensor& y, bool tx, bool ty) {
  check_f32_cpu(x, "X");
  check_f32_cpu(y, "Y");
  const int nt = threads();
  auto xb = bf16_copy(dense(x), nt), yb = bf16_copy(dense(y), nt);
  return {matmul_forward(xb, yb, tx, ty, false), xb, yb};
}

std::vector<paddle::Tensor> MatmulBf16Backward(const paddle::Tensor& xb, const paddle::Tensor& yb,
                                               const paddle::Tensor& dout, bool tx, bool ty) {
  return matmul_backward(xb, yb, bf16_copy(dense(dout), threads()), tx, ty, false);
}

// zoo_linear_bf16: y a 2-D weight, alive anyway as a parameter: only x's rounded copy is kept (output
// 2), y is rounded again in the backward (K x N elements, against the M x K x N products).
std::vector<paddle::Tensor> LinearBf16Forward(const paddle::Tensor& x, const paddle::Tensor& y, bool tx, bool ty) {
  check_f32_cpu(x, "X");
  check_f32_cpu(y, "Y");
  const int nt = threads();
  auto xb = bf16_copy(dense(x), nt);
  return {matmul_forward(xb, bf16_copy(dense(y), nt), tx, ty, false), xb};
}

std::vector<paddle::Tensor> LinearBf16Backward(const paddle::Tensor& xb, const paddle::Tensor& y,
                                               const paddle::Tensor& dout, bool tx, bool ty) {
  const int nt = threads();
  return matmul_backward(xb, bf16_copy(dense(y), nt), bf16_copy(dense(dout), nt), tx, ty, false);
}

std::vector<std::vector<int64_t>> MatmulInferShape(const std::vector<int64_t>& xs, const std::vector<int64_t>& ys,
                                                   bool tx, bool ty, bool fpmath) {
  return {matmul_shape(xs, ys, tx, ty).out};
}

std::vector<paddle::DataType> MatmulInferDtype(const paddle::DataType& x, const paddle::DataType& y) { return {x}; }

std::vector<std::vector<int64_t>> MatmulBf16InferShape(const std::vector<int64_t>& xs, const std::vector<int64_t>& ys,
                                                       bool tx, bool ty) {
  return {matmul_shape(xs, ys, tx, ty).out, xs, ys};
}

std::vector<paddle::DataType> MatmulBf16InferDtype(const paddle::DataType& x, const paddle::DataType& y) {
  return {x, paddle::DataType::BFLOAT16, paddle::DataType::BFLOAT16};
}

std::vector<std::vector<int64_t>> LinearBf16InferShape(const std::vector<int64_t>& xs, const std::vector<int64_t>& ys,
                                                       bool tx, bool ty) {
  return {matmul_shape(xs, ys, tx, ty).out, xs};
}

std::vector<paddle::DataType> LinearBf16InferDtype(const paddle::DataType& x, const paddle::DataType& y) {
  return {x, paddle::DataType::BFLOAT16};
}

// ============================================================================= convolution
// The output size along one axis (symmetric padding `pad`, `dilation` counted paddle's way: 1 is none)
int64_t conv_out_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation) {
  return (in + 2 * pad - dilation * (kernel - 1) - 1) / stride + 1;
}

// 2-D convolution for training: forward, data and weight gradients. Paddle's CPU convolution in the
// dynamic graph is im2col + GEMM; oneDNN's direct JIT kernels run a ResNet 3x3 layer's forward +
// backward in about half its time (README, "Against PyTorch"). Float32, NCHW activations and OIHW
// weights in paddle's layout; oneDNN picks its own (blocked) layouts and we reorder at the boundary,
// as PyTorch does for NCHW tensors. Any groups (goihw weights: a depthwise convolution runs oneDNN's
// depthwise kernels), symmetric zero padding, any stride and dilation.
// `math`: 0 fp32; 1 fp32 with fpmath_mode = bf16 (zoo_conv2d's `fpmath`); 2 bf16 operands
// (zoo_conv2d_bf16: the reorders at the boundary round x, w and dy to bf16 in oneDNN's layouts; y, dx
// and dw stay fp32); 3 bf16 activations (zoo_conv2d_bf16act, issue 43: y and dy are bf16 tensors, x
// bf16 or fp32 (a network's input) and dx of x's type, w and dw fp32).
using dnnl::memory;

struct ConvDescs {
  memory::desc x, w, y;  // paddle's layouts
  dnnl::convolution_forward::primitive_desc fwd;
  dnnl::convolution_backward_data::primitive_desc bwd_data;
  dnnl::convolution_backward_weights::primitive_desc bwd_weights;
};

struct ConvPlan : ConvDescs {
  dnnl::convolution_forward fwd_prim;
  dnnl::convolution_backward_data bwd_data_prim;
  dnnl::convolution_backward_weights bwd_weights_prim;
};

// The three descriptors (oneDNN picks its kernels here), in user scratchpad mode (Context::scratchpad;
// also the only mode in which oneDNN reports the scratchpad's size).
// Call inside Context::enter(): oneDNN sizes the work space by the OpenMP threads set there.
ConvDescs conv_descs(const std::vector<int64_t>& xs, const std::vector<int64_t>& ws,
                     const std::vector<int64_t>& strides, const std::vector<int64_t>& pads,
                     const std::vector<int64_t>& dilations, int64_t groups, int math,
                     bool x_bf16 = false) {
  using Tag = memory::format_tag;
  const auto f32 = memory::data_type::f32;
  const memory::dims st{strides[0], strides[1]}, pd{pads[0], pads[1]};
  const memory::dims dl{dilations[0] - 1, dilations[1] - 1};  // oneDNN counts the gaps
  memory::dims ys{xs[0], ws[0], 0, 0};
  for (int i = 0; i < 2; ++i) ys[2 + i] = conv_out_size(xs[2 + i], ws[2 + i], strides[i], pads[i], dilations[i]);
  ConvDescs p;
  const auto bf16 = memory::data_type::bf16;
  const auto xt = x_bf16 ? bf16 : f32, yt = math == 3 ? bf16 : f32;   // the tensors' types
  p.x = memory::desc(memory::dims(xs.begin(), xs.end()), xt, Tag::nchw);
  // paddle's [O, C / groups, kh, kw] is oneDNN's goihw [groups, O / groups, C / groups, kh, kw]
  const memory::dims wd = groups == 1 ? memory::dims(ws.begin(), ws.end())
                                      : memory::dims{groups, ws[0] / groups, ws[1], ws[2], ws[3]};
  p.w = memory::desc(wd, f32, groups == 1 ? Tag::oihw : Tag::goihw);
  p.y = memory::desc(ys, yt, Tag::nchw);
  const auto in = math >= 2 ? bf16 : f32;   // x, w, and dy in the backward
  const memory::desc xa(p.x.get_dims(), in, Tag::any), wa(p.w.get_dims(), in, Tag::any), ya(ys, yt, Tag::any);
  const memory::desc dya(ys, in, Tag::any), dxa(p.x.get_dims(), xt, Tag::any), dwa(p.w.get_dims(), f32, Tag::any);
  const auto alg = dnnl::algorithm::convolution_direct;
  const dnnl::engine& eng = Context::get().engine();
  dnnl::primitive_attr attr;
  if (math == 1) attr.set_fpmath_mode(dnnl::fpmath_mode::bf16);
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  p.fwd = dnnl::convolution_forward::primitive_desc(eng, dnnl::prop_kind::forward_training, alg, xa, wa, ya,
                                                    st, dl, pd, pd, attr);
  p.bwd_data = dnnl::convolution_backward_data::primitive_desc(eng, alg, dxa, wa, dya, st, dl, pd, pd, p.fwd, attr);
  p.bwd_weights =
      dnnl::convolution_backward_weights::primitive_desc(eng, alg, xa, dwa, dya, st, dl, pd, pd, p.fwd, attr);
  return p;
}

// Call inside Context::enter().
const ConvPlan& conv_plan(const std::vector<int64_t>& xs, const std::vector<int64_t>& ws,
                          const std::vector<int64_t>& strides, const std::vector<int64_t>& pads,
                          const std::vector<int64_t>& dilations, int64_t groups, int math, int nthreads,
                          bool x_bf16) {
  std::string key = "conv|t" + std::to_string(nthreads) + "|m" + std::to_string(math) + (x_bf16 ? "|xb" : "") +
                    "|g" + std::to_string(groups);
  for (const auto* v : {&xs, &ws, &strides, &pads, &dilations})
    for (int64_t d : *v) key += "," + std::to_string(d);
  return Context::get().cached<ConvPlan>(key, [&]() {
    auto p = std::make_shared<ConvPlan>();
    static_cast<ConvDescs&>(*p) = conv_descs(xs, ws, strides, pads, dilations, groups, math, x_bf16);
    p->fwd_prim = dnnl::convolution_forward(p->fwd);
    p->bwd_data_prim = dnnl::convolution_backward_data(p->bwd_data);
    p->bwd_weights_prim = dnnl::convolution_backward_weights(p->bwd_weights);
    return p;
  });
}

// `user` itself when it already has the layout the primitive wants, else a reordered copy
memory as(const memory& user, const memory::desc& want) {
  if (user.get_desc() == want) return user;
  memory m(want, Context::get().engine());
  dnnl::reorder(user, m).execute(Context::get().stream(), const_cast<memory&>(user), m);
  return m;
}

// a buffer in the primitive's layout for an output, copied to `user` by `finish`
memory out_for(const memory& user, const memory::desc& got) {
  return user.get_desc() == got ? user : memory(got, Context::get().engine());
}

void finish(memory& m, memory& user) {
  if (m.get_data_handle() != user.get_data_handle()) dnnl::reorder(m, user).execute(Context::get().stream(), m, user);
}

memory wrap(const memory::desc& d, const paddle::Tensor& t) {
  return memory(d, Context::get().engine(), const_cast<void*>(t.data()));
}

bool is_bf16(const paddle::Tensor& t) { return t.dtype() == paddle::DataType::BFLOAT16; }

std::vector<paddle::Tensor> ConvForward(const paddle::Tensor& x, const paddle::Tensor& w,
                                        const std::vector<int64_t>& strides, const std::vector<int64_t>& pads,
                                        const std::vector<int64_t>& dilations, int64_t groups, bool need_dx,
                                        int math) {
  int nt;
  auto lock = Context::get().enter(&nt);
  const ConvPlan& p = conv_plan(x.shape(), w.shape(), strides, pads, dilations, groups, math, nt, is_bf16(x));
  auto y = paddle::empty(p.y.get_dims(), math == 3 ? paddle::DataType::BFLOAT16 : x.dtype(), x.place());
  auto& s = Context::get().stream();
  memory xu = wrap(p.x, x), wu = wrap(p.w, w), yu = wrap(p.y, y);
  memory xm = as(xu, p.fwd.src_desc()), wm = as(wu, p.fwd.weights_desc()), ym = out_for(yu, p.fwd.dst_desc());
  p.fwd_prim.execute(s, {{DNNL_ARG_SRC, xm}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, ym},
                         {DNNL_ARG_SCRATCHPAD, Context::get().scratchpad(p.fwd.scratchpad_desc())}});
  finish(ym, yu);
  s.wait();
  return {y};
}

std::vector<paddle::Tensor> ConvBackward(const paddle::Tensor& x, const paddle::Tensor& w, const paddle::Tensor& dy,
                                         const std::vector<int64_t>& strides, const std::vector<int64_t>& pads,
                                         const std::vector<int64_t>& dilations, int64_t groups, bool need_dx,
                                         int math) {
  int nt;
  auto lock = Context::get().enter(&nt);
  const ConvPlan& p = conv_plan(x.shape(), w.shape(), strides, pads, dilations, groups, math, nt, is_bf16(x));
  auto dx = paddle::empty(x.shape(), x.dtype(), x.place());  // left unwritten when the input needs no grad
  auto dw = paddle::empty(w.shape(), w.dtype(), w.place());
  auto& s = Context::get().stream();
  memory xu = wrap(p.x, x), wu = wrap(p.w, w), dyu = wrap(p.y, dy), dxu = wrap(p.x, dx), dwu = wrap(p.w, dw);
  memory dy_w = as(dyu, p.bwd_weights.diff_dst_desc());
  if (need_dx) {
    memory dy_d = p.bwd_data.diff_dst_desc() == dy_w.get_desc() ? dy_w : as(dyu, p.bwd_data.diff_dst_desc());
    memory wm = as(wu, p.bwd_data.weights_desc()), dxm = out_for(dxu, p.bwd_data.diff_src_desc());
    p.bwd_data_prim.execute(s, {{DNNL_ARG_DIFF_DST, dy_d}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DIFF_SRC, dxm},
                                {DNNL_ARG_SCRATCHPAD, Context::get().scratchpad(p.bwd_data.scratchpad_desc())}});
    finish(dxm, dxu);
  }
  memory xm = as(xu, p.bwd_weights.src_desc()), dwm = out_for(dwu, p.bwd_weights.diff_weights_desc());
  p.bwd_weights_prim.execute(s, {{DNNL_ARG_SRC, xm}, {DNNL_ARG_DIFF_DST, dy_w}, {DNNL_ARG_DIFF_WEIGHTS, dwm},
                                 {DNNL_ARG_SCRATCHPAD, Context::get().scratchpad(p.bwd_weights.scratchpad_desc())}});
  finish(dwm, dwu);
  s.wait();
  return {dx, dw};
}

std::vector<paddle::Tensor> ConvF32Forward(const paddle::Tensor& x, const paddle::Tensor& w,
                                           const std::vector<int64_t>& strides, const std::vector<int64_t>& pads,
                                           const std::vector<int64_t>& dilations, int64_t groups, bool need_dx,
                                           bool fpmath) {
  return ConvForward(x, w, strides, pads, dilations, groups, need_dx, fpmath ? 1 : 0);
}
std::vector<paddle::Tensor> ConvF32Backward(const paddle::Tensor& x, const paddle::Tensor& w, const paddle::Tensor& dy,
                                            const std::vector<int64_t>& strides, const std::vector<int64_t>& pads,
                                            const std::vector<int64_t>& dilations, int64_t groups, bool need_dx,
                                            bool fpmath) {
  return ConvBackward(x, w, dy, strides, pads, dilations, groups, need_dx, fpmath ? 1 : 0);
}
std::vector<paddle::Tensor> ConvBf16Forward(const paddle::Tensor& x, const paddle::Tensor& w,
                                            const std::vector<int64_t>& strides, const std::vector<int64_t>& pads,
                                            const std::vector<int64_t>& dilations, int64_t groups, bool need_dx) {
  return ConvForward(x, w, strides, pads, dilations, groups, need_dx, 2);
}
std::vector<paddle::Tensor> ConvBf16Backward(const paddle::Tensor& x, const paddle::Tensor& w, const paddle::Tensor& dy,
                                             const std::vector<int64_t>& strides, const std::vector<int64_t>& pads,
                                             const std::vector<int64_t>& dilations, int64_t groups, bool need_dx) {
  return ConvBackward(x, w, dy, strides, pads, dilations, groups, need_dx, 2);
}

// bf16 activations (math 3). Where oneDNN has no bf16 (AVX2 CPUs: ops.autocast never asks for it
// there, the tests do) the same arithmetic runs on the fp32 primitives: bf16-rounded operands
// (bf16 products are exact in fp32, and oneDNN accumulates in fp32 either way), the result rounded
// to bf16. Only the accumulation order differs from the native kernels, so every CPU checks what the
// bf16 activations do to a network.
paddle::Tensor f32_rounded(const paddle::Tensor& t, int nthreads) {
  // a bf16 tensor widened (exact), or a float32 one rounded to bf16 and widened
  const paddle::Tensor b = is_bf16(t) ? t : bf16_copy(t, nthreads);
  auto out = paddle::empty(t.shape(), paddle::DataType::FLOAT32, t.place());
  const uint16_t* src = static_cast<const uint16_t*>(b.data());
  uint32_t* dst = static_cast<uint32_t*>(out.data());
  const int64_t n = t.numel();
#pragma omp parallel for num_threads(nthreads) schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<uint32_t>(src[i]) << 16;
  return out;
}

void check_act_input(const paddle::Tensor& t, const char* what) {
  PD_CHECK(t.is_cpu(), what, " must be a CPU tensor");
  PD_CHECK(t.dtype() == paddle::DataType::FLOAT32 || is_bf16(t), what, " must be float32 or bfloat16");
}

std::vector<paddle::Tensor> ConvActForward(const paddle::Tensor& x, const paddle::Tensor& w,
                                           const std::vector<int64_t>& strides, const std::vector<int64_t>& pads,
                                           const std::vector<int64_t>& dilations, int64_t groups, bool need_dx) {
  check_act_input(x, "x");
  check_f32_cpu(w, "the weight");
  if (bf16_native()) return ConvForward(x, w, strides, pads, dilations, groups, need_dx, 3);
  const int nt = threads();
  const paddle::Tensor y =
      ConvForward(f32_rounded(x, nt), f32_rounded(w, nt), strides, pads, dilations, groups, need_dx, 0)[0];
  return {bf16_copy(y, nt)};
}

std::vector<paddle::Tensor> ConvActBackward(const paddle::Tensor& x, const paddle::Tensor& w, const paddle::Tensor& dy,
                                            const std::vector<int64_t>& strides, const std::vector<int64_t>& pads,
                                            const std::vector<int64_t>& dilations, int64_t groups, bool need_dx) {
  PD_CHECK(is_bf16(dy), "the gradient of a bf16 convolution output must be bfloat16");
  if (bf16_native()) return ConvBackward(x, w, dy, strides, pads, dilations, groups, need_dx, 3);
  const int nt = threads();
  auto g = ConvBackward(f32_rounded(x, nt), f32_rounded(w, nt), f32_rounded(dy, nt), strides, pads, dilations,
                        groups, need_dx, 0);
  if (!is_bf16(x)) return g;
  return {need_dx ? bf16_copy(g[0], nt) : paddle::empty(x.shape(), x.dtype(), x.place()), g[1]};
}

std::vector<paddle::DataType> ConvActInferDtype(const paddle::DataType& x, const paddle::DataType& w) {
  return {paddle::DataType::BFLOAT16};
}

// ================================================================== convolution as one GEMM
// zoo_conv2d_gemm: the convolution of zoo_conv2d (fp32, groups 1, symmetric zero padding; `fpmath` as
// there) as im2col over the whole batch and one GEMM per pass, for layers whose output map is small
// beside their weights (ops.functional._one_gemm picks them: at most 4 output pixels): a ResNet's last
// stage at demo sizes, 2 x 2. There the direct kernels reorder the weights to their blocked layouts in every pass
// (9.4 MB at 512 x 512 x 3 x 3) and run the backward-weights pass as per-thread GEMMs over a large work
// space (72 MB there, so functional.py sent those layers to paddle); paddle's im2col + GEMM runs one
// thin GEMM per sample and so reads the weights once per sample. Here each pass reads them once: the
// columns are cols [K = C kh kw, M = N OH OW], rebuilt from x in the backward rather than kept.
struct ConvGeom {
  int64_t n, c, h, w, o, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow;
  int64_t L() const { return oh * ow; }
  int64_t K() const { return c * kh * kw; }
  int64_t M() const { return n * oh * ow; }
};

ConvGeom conv_geom(const std::vector<int64_t>& xs, const std::vector<int64_t>& ws, const std::vector<int64_t>& st,
                   const std::vector<int64_t>& pd, const std::vector<int64_t>& dl) {
  PD_CHECK(xs.size() == 4 && ws.size() == 4 && xs[1] == ws[1] && st.size() == 2 && pd.size() == 2 && dl.size() == 2,
           "zoo_conv2d_gemm: x [N, C, H, W], w [O, C, kh, kw] and two strides, pads and dilations expected");
  ConvGeom g{xs[0], xs[1], xs[2], xs[3], ws[0], ws[2], ws[3], st[0], st[1], pd[0], pd[1], dl[0], dl[1], 0, 0};
  g.oh = conv_out_size(g.h, g.kh, g.sh, g.ph, g.dh);
  g.ow = conv_out_size(g.w, g.kw, g.sw, g.pw, g.dw);
  PD_CHECK(g.oh > 0 && g.ow > 0, "zoo_conv2d_gemm: the kernel does not fit in the padded input");
  return g;
}

// cols[k, m], k = (c, i, j), m = (n, y, x): x[n, c, y sh - ph + i dh, x sw - pw + j dw], 0 in the padding
void im2col(const ConvGeom& g, const float* x, float* cols, int nt) {
  const int64_t K = g.K(), M = g.M(), L = g.L();
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t k = 0; k < K; ++k) {
    const int64_t c = k / (g.kh * g.kw), i = (k / g.kw) % g.kh, j = k % g.kw;
    for (int64_t n = 0; n < g.n; ++n) {
      const float* plane = x + (n * g.c + c) * g.h * g.w;
      float* dst = cols + k * M + n * L;
      for (int64_t y = 0; y < g.oh; ++y, dst += g.ow) {
        const int64_t iy = y * g.sh - g.ph + i * g.dh;
        if (iy < 0 || iy >= g.h) {
          std::fill(dst, dst + g.ow, 0.f);
          continue;
        }
        const float* row = plane + iy * g.w;
        for (int64_t xx = 0; xx < g.ow; ++xx) {
          const int64_t ix = xx * g.sw - g.pw + j * g.dw;
          dst[xx] = (ix >= 0 && ix < g.w) ? row[ix] : 0.f;
        }
      }
    }
  }
}

// dx[n, c] = the sum of dcols over the (i, j) that read each pixel, in a fixed order (the result does
// not depend on the threads); one (n, c) plane per task, so no two threads write one plane
void col2im(const ConvGeom& g, const float* dcols, float* dx, int nt) {
  const int64_t M = g.M(), L = g.L(), HW = g.h * g.w;
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t nc = 0; nc < g.n * g.c; ++nc) {
    const int64_t n = nc / g.c, c = nc % g.c;
    float* plane = dx + nc * HW;
    std::fill(plane, plane + HW, 0.f);
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j) {
        const float* src = dcols + ((c * g.kh + i) * g.kw + j) * M + n * L;
        for (int64_t y = 0; y < g.oh; ++y, src += g.ow) {
          const int64_t iy = y * g.sh - g.ph + i * g.dh;
          if (iy < 0 || iy >= g.h) continue;
          float* row = plane + iy * g.w;
          for (int64_t xx = 0; xx < g.ow; ++xx) {
            const int64_t ix = xx * g.sw - g.pw + j * g.dw;
            if (ix >= 0 && ix < g.w) row[ix] += src[xx];
          }
        }
      }
  }
}

// between NCHW y [N, O, L] and the GEMM's t [O, N L]: `to_nchw` y from t, else t from y
void swap_batch_axis(const ConvGeom& g, float* t, float* y, bool to_nchw, int nt) {
  const int64_t L = g.L(), M = g.M();
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t no = 0; no < g.n * g.o; ++no) {
    float* a = t + (no % g.o) * M + (no / g.o) * L;
    float* b = y + no * L;
    if (to_nchw)
      std::memcpy(b, a, sizeof(float) * L);
    else
      std::memcpy(a, b, sizeof(float) * L);
  }
}

paddle::Tensor f32_empty(const std::vector<int64_t>& shape, const paddle::Tensor& like) {
  return paddle::empty(shape, paddle::DataType::FLOAT32, like.place());
}

Operand plain(const float* data, int64_t cols) { return {data, 0, cols, 1, dnnl_f32}; }

std::vector<paddle::Tensor> ConvGemmForward(const paddle::Tensor& x, const paddle::Tensor& w,
                                            const std::vector<int64_t>& strides, const std::vector<int64_t>& pads,
                                            const std::vector<int64_t>& dilations, bool need_dx, bool fpmath) {
  check_f32_cpu(x, "x");
  check_f32_cpu(w, "the weight");
  const paddle::Tensor xd = dense(x), wd = dense(w);
  const ConvGeom g = conv_geom(xd.shape(), wd.shape(), strides, pads, dilations);
  zoo_apply_fp_mode();
  const int nt = threads();
  auto t = f32_empty({g.o, g.M()}, x);
  {
    auto cols = f32_empty({g.K(), g.M()}, x);
    im2col(g, xd.data<float>(), cols.data<float>(), nt);
    gemm(1, g.o, g.K(), g.M(), plain(wd.data<float>(), g.K()), plain(cols.data<float>(), g.M()), t.data<float>(),
         fpmath);   // t [O, M] = w [O, K] @ cols [K, M]
  }
  auto y = f32_empty({g.n, g.o, g.oh, g.ow}, x);
  swap_batch_axis(g, t.data<float>(), y.data<float>(), true, nt);
  return {y};
}

std::vector<paddle::Tensor> ConvGemmBackward(const paddle::Tensor& x, const paddle::Tensor& w,
                                             const paddle::Tensor& dy, const std::vector<int64_t>& strides,
                                             const std::vector<int64_t>& pads, const std::vector<int64_t>& dilations,
                                             bool need_dx, bool fpmath) {
  check_f32_cpu(dy, "the convolution output's gradient");
  const paddle::Tensor xd = dense(x), wd = dense(w), dyd = dense(dy);
  const ConvGeom g = conv_geom(xd.shape(), wd.shape(), strides, pads, dilations);
  zoo_apply_fp_mode();
  const int nt = threads();
  auto dt = f32_empty({g.o, g.M()}, x);
  swap_batch_axis(g, dt.data<float>(), const_cast<float*>(dyd.data<float>()), false, nt);
  auto dw = f32_empty(wd.shape(), w);
  {
    auto cols = f32_empty({g.K(), g.M()}, x);
    im2col(g, xd.data<float>(), cols.data<float>(), nt);
    gemm(1, g.o, g.M(), g.K(), plain(dt.data<float>(), g.M()), plain(cols.data<float>(), g.M()).t(),
         dw.data<float>(), fpmath);   // dw [O, K] = dt [O, M] @ cols^T
  }
  auto dx = f32_empty(xd.shape(), x);   // left unwritten when the input needs no gradient
  if (need_dx) {
    auto dcols = f32_empty({g.K(), g.M()}, x);
    gemm(1, g.K(), g.o, g.M(), plain(wd.data<float>(), g.K()).t(), plain(dt.data<float>(), g.M()),
         dcols.data<float>(), fpmath);   // dcols [K, M] = w^T @ dt
    col2im(g, dcols.data<float>(), dx.data<float>(), nt);
  }
  return {dx, dw};
}

// ==================================================================================== LSTM
// One direction of a single-layer LSTM, from zero states, on time-major x [T, N, C]
// (oneDNN's tnc layout: its backward on batch-first ntc took twice the time). Paddle's CPU LSTM (its
// rnn kernel: MKL GEMMs and the gate functions step by step) is the slower: AttentionLSTM's training
// step 5.1-5.7 -> 3.9-4.5 s (amd-zen3, 2 threads; there oneDNN 3.6 trains an LSTM with its reference
// implementation, "ref": its JIT LSTM kernels on AVX2 serve inference only). The weights stay
// paddle's: weight_ih [4H, C] and weight_hh [4H, H] with the gates in paddle's order i, f, g, o, which
// is oneDNN's, are its `ldgoi` layout; b = bias_ih + bias_hh. `reverse` runs right to left over all T
// steps; per-sample lengths are the caller's (functional.lstm). Outputs: y [T, N, H] and the
// primitive's work space (uint8), which the backward reads.
// bf16 (`zoo_lstm_bf16`, under ops.autocast; oneDNN's bf16 LSTM needs AVX512_BF16 or AMX): the same
// operator with x, the weights and the recurrent h in bf16 (rounded at the operator, nearest even), the
// cell state c, the bias, the gates' accumulation and every gradient in fp32, as oneDNN's bf16 RNNs
// compute; y is returned widened to fp32 (exact), so the backward rounds x and y again to the same bf16.
// Without gradients (evaluation, `zoo_lstm_infer`) the plan is oneDNN's forward_inference: no work space
// (a no-grad bidirectional call at 150 x 16 x 1024 peaks 62 MB above its start against 136 MB). On AVX2
// it runs oneDNN's JIT kernels (brgemm), measured no faster than the reference training forward on
// amd-zen3 (1.36-1.51 against 1.29-1.47 s for that call).
struct LstmPlan {
  memory::desc x, y, w_ih, w_hh, b, state;   // paddle's layouts (fp32); `state`: h0 or c0 [1, 1, N, H]
  memory::desc xc, yc, h_state;              // what the primitive computes on: x, y and h0 (bf16 or fp32)
  dnnl::lstm_forward::primitive_desc fwd;
  dnnl::lstm_backward::primitive_desc bwd;   // training plans only
  dnnl::lstm_forward fwd_prim;
  dnnl::lstm_backward bwd_prim;
};

// Call inside Context::enter().
const LstmPlan& lstm_plan(int64_t n, int64_t t, int64_t c, int64_t h, bool reverse, int nthreads,
                          bool training, bool bf16) {
  std::string key = "lstm|t" + std::to_string(nthreads) + (reverse ? "|r" : "|l") + (training ? "|train" : "|infer");
  key += bf16 ? "|bf16" : "";
  for (int64_t d : {n, t, c, h}) key += "," + std::to_string(d);
  return Context::get().cached<LstmPlan>(key, [&]() {
    using Tag = memory::format_tag;
    const auto f32 = memory::data_type::f32, dt = bf16 ? memory::data_type::bf16 : f32;
    auto p = std::make_shared<LstmPlan>();
    p->x = memory::desc({t, n, c}, f32, Tag::tnc);
    p->y = memory::desc({t, n, h}, f32, Tag::tnc);
    p->w_ih = memory::desc({1, 1, c, 4, h}, f32, Tag::ldgoi);
    p->w_hh = memory::desc({1, 1, h, 4, h}, f32, Tag::ldgoi);
    p->b = memory::desc({1, 1, 4, h}, f32, Tag::ldgo);
    p->state = memory::desc({1, 1, n, h}, f32, Tag::ldnc);
    p->xc = memory::desc({t, n, c}, dt, Tag::tnc);
    p->yc = memory::desc({t, n, h}, dt, Tag::tnc);
    p->h_state = memory::desc({1, 1, n, h}, dt, Tag::ldnc);
    const memory::desc wl(p->w_ih.get_dims(), dt, Tag::any), wi(p->w_hh.get_dims(), dt, Tag::any), none;
    // the gradients are fp32 in both (oneDNN's bf16 backward takes and gives its diff tensors in fp32)
    const memory::desc dwl(p->w_ih.get_dims(), f32, Tag::any), dwi(p->w_hh.get_dims(), f32, Tag::any);
    const auto dir = reverse ? dnnl::rnn_direction::unidirectional_right2left
                             : dnnl::rnn_direction::unidirectional_left2right;
    const dnnl::engine& eng = Context::get().engine();
    // zero initial states given as memory: with none (oneDNN's zero states) its reference backward on tnc
    // data takes the first output for h0 in the left-to-right weight_hh gradient; final states not written
    const memory::desc& st = p->state;
    const auto prop = training ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference;
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);   // Context::scratchpad
    const memory::desc& hs = p->h_state;
    p->fwd = dnnl::lstm_forward::primitive_desc(eng, prop, dir, p->xc, hs, st, wl, wi, p->b, p->yc, none, none, attr);
    p->fwd_prim = dnnl::lstm_forward(p->fwd);
    if (!training) return p;
    p->bwd = dnnl::lstm_backward::primitive_desc(eng, dnnl::prop_kind::backward, dir, p->xc, hs, st, wl, wi, p->b,
                                                 p->yc, none, none, p->x, st, st, dwl, dwi, p->b, p->y, none, none,
                                                 p->fwd, attr);
    p->bwd_prim = dnnl::lstm_backward(p->bwd);
    return p;
  });
}

void check_lstm(const paddle::Tensor& x, const paddle::Tensor& w_ih, const paddle::Tensor& w_hh,
                const paddle::Tensor& b) {
  for (const auto* t : {&x, &w_ih, &w_hh, &b}) check_f32_cpu(*t, "an LSTM operand");
  const int64_t h = w_hh.shape().size() == 2 ? w_hh.shape()[1] : -1;
  PD_CHECK(x.shape().size() == 3 && w_ih.shape() == std::vector<int64_t>({4 * h, x.shape()[2]}) &&
               w_hh.shape() == std::vector<int64_t>({4 * h, h}) && b.shape() == std::vector<int64_t>({4 * h}),
           "LSTM: x [T, N, C], weight_ih [4H, C], weight_hh [4H, H] and bias [4H] expected");
}

memory zeroed(memory m) {
  std::memset(m.get_data_handle(), 0, m.get_desc().get_size());
  return m;
}

// x (fp32) as the primitive reads it: itself, or its bf16 copy
paddle::Tensor lstm_operand(const paddle::Tensor& x, bool bf16, int nthreads) {
  return bf16 ? bf16_copy(x, nthreads) : x;
}

// y, and the work space when `training`
std::vector<paddle::Tensor> lstm_forward(const paddle::Tensor& x, const paddle::Tensor& w_ih,
                                         const paddle::Tensor& w_hh, const paddle::Tensor& b, bool reverse,
                                         bool training, bool bf16) {
  check_lstm(x, w_ih, w_hh, b);
  int nt;
  auto lock = Context::get().enter(&nt);
  const auto& xs = x.shape();
  const int64_t h = w_hh.shape()[1];
  const LstmPlan& p = lstm_plan(xs[1], xs[0], xs[2], h, reverse, nt, training, bf16);
  const auto ct = bf16 ? paddle::DataType::BFLOAT16 : x.dtype();   // the computed tensors' type
  auto y = paddle::empty({xs[0], xs[1], h}, ct, x.place());
  auto& s = Context::get().stream();
  memory wl = as(wrap(p.w_ih, w_ih), p.fwd.weights_layer_desc());
  memory wi = as(wrap(p.w_hh, w_hh), p.fwd.weights_iter_desc());
  const auto zero = paddle::full({xs[1], h}, 0.0f, x.dtype(), x.place());
  const auto zero_h = bf16 ? paddle::full({xs[1], h}, 0.0f, ct, x.place()) : zero;   // h0 as the primitive reads it
  const paddle::Tensor xc = lstm_operand(x, bf16, nt);
  std::unordered_map<int, memory> args = {
      {DNNL_ARG_SRC_LAYER, wrap(p.xc, xc)},       {DNNL_ARG_SRC_ITER, wrap(p.h_state, zero_h)},
      {DNNL_ARG_SRC_ITER_C, wrap(p.state, zero)}, {DNNL_ARG_WEIGHTS_LAYER, wl},
      {DNNL_ARG_WEIGHTS_ITER, wi},                {DNNL_ARG_BIAS, wrap(p.b, b)},
      {DNNL_ARG_DST_LAYER, wrap(p.yc, y)},
      {DNNL_ARG_SCRATCHPAD, Context::get().scratchpad(p.fwd.scratchpad_desc())}};
  std::vector<paddle::Tensor> outs = {y};
  if (training) {
    outs.push_back(paddle::empty({static_cast<int64_t>(p.fwd.workspace_desc().get_size())}, paddle::DataType::UINT8,
                                 x.place()));
    args[DNNL_ARG_WORKSPACE] = wrap(p.fwd.workspace_desc(), outs.back());
  }
  p.fwd_prim.execute(s, args);
  s.wait();
  if (bf16) outs[0] = f32_rounded(y, nt);   // widened: exact
  return outs;
}

std::vector<paddle::Tensor> LstmForward(const paddle::Tensor& x, const paddle::Tensor& w_ih,
                                        const paddle::Tensor& w_hh, const paddle::Tensor& b, bool reverse) {
  return lstm_forward(x, w_ih, w_hh, b, reverse, true, false);
}
std::vector<paddle::Tensor> LstmInfer(const paddle::Tensor& x, const paddle::Tensor& w_ih,
                                      const paddle::Tensor& w_hh, const paddle::Tensor& b, bool reverse) {
  return lstm_forward(x, w_ih, w_hh, b, reverse, false, false);
}
std::vector<paddle::Tensor> LstmBf16Forward(const paddle::Tensor& x, const paddle::Tensor& w_ih,
                                            const paddle::Tensor& w_hh, const paddle::Tensor& b, bool reverse) {
  return lstm_forward(x, w_ih, w_hh, b, reverse, true, true);
}
std::vector<paddle::Tensor> LstmBf16Infer(const paddle::Tensor& x, const paddle::Tensor& w_ih,
                                          const paddle::Tensor& w_hh, const paddle::Tensor& b, bool reverse) {
  return lstm_forward(x, w_ih, w_hh, b, reverse, false, true);
}

std::vector<paddle::Tensor> lstm_backward(const paddle::Tensor& x, const paddle::Tensor& w_ih,
                                          const paddle::Tensor& w_hh, const paddle::Tensor& b, const paddle::Tensor& y,
                                          const paddle::Tensor& ws, const paddle::Tensor& dy, bool reverse, bool bf16) {
  check_f32_cpu(dy, "the LSTM output's gradient");
  int nt;
  auto lock = Context::get().enter(&nt);
  const auto& xs = x.shape();
  const int64_t h = w_hh.shape()[1];
  const LstmPlan& p = lstm_plan(xs[1], xs[0], xs[2], h, reverse, nt, true, bf16);
  auto dx = paddle::empty(x.shape(), x.dtype(), x.place());
  auto dw_ih = paddle::empty(w_ih.shape(), w_ih.dtype(), w_ih.place());
  auto dw_hh = paddle::empty(w_hh.shape(), w_hh.dtype(), w_hh.place());
  auto db = paddle::empty(b.shape(), b.dtype(), b.place());
  auto& s = Context::get().stream();
  memory wl = as(wrap(p.w_ih, w_ih), p.bwd.weights_layer_desc());
  memory wi = as(wrap(p.w_hh, w_hh), p.bwd.weights_iter_desc());
  // oneDNN adds the weight gradients to what its buffers hold: they start at zero
  memory dwl_u = wrap(p.w_ih, dw_ih), dwi_u = wrap(p.w_hh, dw_hh);
  memory dwl = zeroed(out_for(dwl_u, p.bwd.diff_weights_layer_desc()));
  memory dwi = zeroed(out_for(dwi_u, p.bwd.diff_weights_iter_desc()));
  const auto zero = paddle::full({xs[1], h}, 0.0f, x.dtype(), x.place());
  const auto zero_h = bf16 ? paddle::full({xs[1], h}, 0.0f, paddle::DataType::BFLOAT16, x.place()) : zero;
  const paddle::Tensor xc = lstm_operand(x, bf16, nt), yc = lstm_operand(y, bf16, nt);
  // the initial states' gradients (unused)
  const auto dh0 = paddle::empty({xs[1], h}, x.dtype(), x.place()), dc0 = paddle::empty_like(dh0);
  p.bwd_prim.execute(s, {{DNNL_ARG_SRC_LAYER, wrap(p.xc, xc)}, {DNNL_ARG_SRC_ITER, wrap(p.h_state, zero_h)},
                         {DNNL_ARG_SRC_ITER_C, wrap(p.state, zero)}, {DNNL_ARG_DIFF_SRC_ITER, wrap(p.state, dh0)},
                         {DNNL_ARG_DIFF_SRC_ITER_C, wrap(p.state, dc0)}, {DNNL_ARG_WEIGHTS_LAYER, wl},
                         {DNNL_ARG_WEIGHTS_ITER, wi},
                         {DNNL_ARG_BIAS, wrap(p.b, b)}, {DNNL_ARG_DST_LAYER, wrap(p.yc, yc)},
                         {DNNL_ARG_WORKSPACE, wrap(p.bwd.workspace_desc(), ws)},
                         {DNNL_ARG_DIFF_DST_LAYER, wrap(p.y, dy)}, {DNNL_ARG_DIFF_SRC_LAYER, wrap(p.x, dx)},
                         {DNNL_ARG_DIFF_WEIGHTS_LAYER, dwl}, {DNNL_ARG_DIFF_WEIGHTS_ITER, dwi},
                         {DNNL_ARG_SCRATCHPAD, Context::get().scratchpad(p.bwd.scratchpad_desc())},
                         {DNNL_ARG_DIFF_BIAS, zeroed(wrap(p.b, db))}});
  finish(dwl, dwl_u);
  finish(dwi, dwi_u);
  s.wait();
  return {dx, dw_ih, dw_hh, db};
}
std::vector<paddle::Tensor> LstmBackward(const paddle::Tensor& x, const paddle::Tensor& w_ih,
                                         const paddle::Tensor& w_hh, const paddle::Tensor& b, const paddle::Tensor& y,
                                         const paddle::Tensor& ws, const paddle::Tensor& dy, bool reverse) {
  return lstm_backward(x, w_ih, w_hh, b, y, ws, dy, reverse, false);
}
std::vector<paddle::Tensor> LstmBf16Backward(const paddle::Tensor& x, const paddle::Tensor& w_ih,
                                             const paddle::Tensor& w_hh, const paddle::Tensor& b,
                                             const paddle::Tensor& y, const paddle::Tensor& ws,
                                             const paddle::Tensor& dy, bool reverse) {
  return lstm_backward(x, w_ih, w_hh, b, y, ws, dy, reverse, true);
}

std::vector<paddle::DataType> LstmInferDtype(const paddle::DataType& x, const paddle::DataType& w_ih,
                                             const paddle::DataType& w_hh, const paddle::DataType& b) {
  return {x, paddle::DataType::UINT8};
}

}  // namespace zoo_dnnl

extern "C" {
// Called through ctypes by ops/library.py: 1 when oneDNN computes bf16 natively on this CPU.
int zoo_bf16_supported() { return zoo_dnnl::bf16_native() ? 1 : 0; }

// Called through ctypes by ops/library.py: 1 when oneDNN's kernels here are AVX-512 ones (avx512_core,
// within ONEDNN_MAX_CPU_ISA).
int zoo_avx512() { return zoo_dnnl::isa_has(dnnl_cpu_isa_avx512_core) ? 1 : 0; }

// Called through ctypes by ops/library.py: the bytes of the work space our primitives share.
long long zoo_scratchpad_bytes() {
  int nt;
  auto lock = zoo_dnnl::Context::get().enter(&nt);
  return static_cast<long long>(zoo_dnnl::Context::get().scratchpad_bytes());
}

// Called through ctypes by ops/library.py: the work space in bytes oneDNN's convolution of these shapes
// (x NCHW, w [O, C / groups, kh, kw]; strides, pads, dilations of 2) needs in its forward or backward
// with the configured threads, the largest of the three; -1 when oneDNN has no convolution for them.
// `prepare`: also make and cache its three primitives, as its first call would (their JIT code is then
// resident: a measurement can tell it from the work space).
long long zoo_conv_work_space(const int64_t* xs, const int64_t* ws, const int64_t* strides, const int64_t* pads,
                              const int64_t* dilations, int64_t groups, int math, int prepare) {
  try {
    int nt;
    auto lock = zoo_dnnl::Context::get().enter(&nt);
    // bf16 activations without native bf16 run the fp32 primitives on fp32 tensors (ConvActForward)
    const bool x_bf16 = math == 3 && zoo_dnnl::bf16_native();
    if (math == 3 && !x_bf16) math = 0;
    const std::vector<int64_t> x(xs, xs + 4), w(ws, ws + 4), st(strides, strides + 2), pd(pads, pads + 2),
        dl(dilations, dilations + 2);
    const auto size = [](const zoo_dnnl::ConvDescs& d) {
      return static_cast<long long>(std::max({d.fwd.scratchpad_desc().get_size(),
                                              d.bwd_data.scratchpad_desc().get_size(),
                                              d.bwd_weights.scratchpad_desc().get_size()}));
    };
    if (prepare) return size(zoo_dnnl::conv_plan(x, w, st, pd, dl, groups, math, nt, x_bf16));
    return size(zoo_dnnl::conv_descs(x, w, st, pd, dl, groups, math, x_bf16));
  } catch (...) {
    return -1;
  }
}
}

PD_BUILD_OP(zoo_matmul)
    .Inputs({"X", "Y"})
    .Outputs({"Out"})
    .Attrs({"transpose_x: bool", "transpose_y: bool", "fpmath: bool"})
    .SetKernelFn(PD_KERNEL(zoo_dnnl::MatmulForward))
    .SetInferShapeFn(PD_INFER_SHAPE(zoo_dnnl::MatmulInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(zoo_dnnl::MatmulInferDtype));
PD_BUILD_GRAD_OP(zoo_matmul)
    .Inputs({"X", "Y", paddle::Grad("Out")})
    .Outputs({paddle::Grad("X"), paddle::Grad("Y")})
    .Attrs({"transpose_x: bool", "transpose_y: bool", "fpmath: bool"})
    .SetKernelFn(PD_KERNEL(zoo_dnnl::MatmulBackward));

PD_BUILD_OP(zoo_matmul_bf16)
    .Inputs({"X", "Y"})
    .Outputs({"Out", "XBf16", "YBf16"})
    .Attrs({"transpose_x: bool", "transpose_y: bool"})
    .SetKernelFn(PD_KERNEL(zoo_dnnl::MatmulBf16Forward))
    .SetInferShapeFn(PD_INFER_SHAPE(zoo_dnnl::MatmulBf16InferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(zoo_dnnl::MatmulBf16InferDtype));
PD_BUILD_GRAD_OP(zoo_matmul_bf16)
    .Inputs({"XBf16", "YBf16", paddle::Grad("Out")})
    .Outputs({paddle::Grad("X"), paddle::Grad("Y")})
    .Attrs({"transpose_x: bool", "transpose_y: bool"})
    .SetKernelFn(PD_KERNEL(zoo_dnnl::MatmulBf16Backward));

PD_BUILD_OP(zoo_linear_bf16)
    .Inputs({"X", "Y"})
    .Outputs({"Out", "XBf16"})
    .Attrs({"transpose_x: bool", "transpose_y: bool"})
    .SetKernelFn(PD_KERNEL(zoo_dnnl::LinearBf16Forward))
    .SetInferShapeFn(PD_INFER_SHAPE(zoo_dnnl::LinearBf16InferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(zoo_dnnl::LinearBf16InferDtype));
PD_BUILD_GRAD_OP(zoo_linear_bf16)
    .Inputs({"XBf16", "Y", paddle::Grad("Out")})
    .Outputs({paddle::Grad("X"), paddle::Grad("Y")})
    .Attrs({"transpose_x: bool", "transpose_y: bool"})
    .SetKernelFn(PD_KERNEL(zoo_dnnl::LinearBf16Backward));

PD_BUILD_OP(zoo_conv2d)
    .Inputs({"X", "W"})
    .Outputs({"Out"})
    .Attrs({"strides: std::vector<int64_t>", "pads: std::vector<int64_t>", "dilations: std::vector<int64_t>",
            "groups: int64_t", "need_dx: bool", "fpmath: bool"})
    .SetKernelFn(PD_KERNEL(zoo_dnnl::ConvF32Forward));
PD_BUILD_GRAD_OP(zoo_conv2d)
    .Inputs({"X", "W", paddle::Grad("Out")})
    .Outputs({paddle::Grad("X"), paddle::Grad("W")})
    .Attrs({"strides: std::vector<int64_t>", "pads: std::vector<int64_t>", "dilations: std::vector<int64_t>",
            "groups: int64_t", "need_dx: bool", "fpmath: bool"})
    .SetKernelFn(PD_KERNEL(zoo_dnnl::ConvF32Backward));

PD_BUILD_OP(zoo_conv2d_gemm)
    .Inputs({"X", "W"})
    .Outputs({"Out"})
    .Attrs({"strides: std::vector<int64_t>", "pads: std::vector<int64_t>", "dilations: std::vector<int64_t>",
            "need_dx: bool", "fpmath: bool"})
    .SetKernelFn(PD_KERNEL(zoo_dnnl::ConvGemmForward));
PD_BUILD_GRAD_OP(zoo_conv2d_gemm)
    .Inputs({"X", "W", paddle::Grad("Out")})
    .Outputs({paddle::Grad("X"), paddle::Grad("W")})
    .Attrs({"strides: std::vector<int64_t>", "pads: std::vector<int64_t>", "dilations: std::vector<int64_t>",
            "need_dx: bool", "fpmath: bool"})
    .SetKernelFn(PD_KERNEL(zoo_dnnl::ConvGemmBackward));

PD_BUILD_OP(zoo_conv2d_bf16act)
    .Inputs({"X", "W"})
    .Outputs({"Out"})
    .Attrs({"strides: std::vector<int64_t>", "pads: std::vector<int64_t>", "dilations: std::vector<int64_t>",
            "groups: int64_t", "need_dx: bool"})
    .SetKernelFn(PD_KERNEL(zoo_dnnl::ConvActForward))
    .SetInferDtypeFn(PD_INFER_DTYPE(zoo_dnnl::ConvActInferDtype));
PD_BUILD_GRAD_OP(zoo_conv2d_bf16act)
    .Inputs({"X", "W", paddle::Grad("Out")})
    .Outputs({paddle::Grad("X"), paddle::Grad("W")})
    .Attrs({"strides: std::vector<int64_t>", "pads: std::vector<int64_t>", "dilations: std::vector<int64_t>",
            "groups: int64_t", "need_dx: bool"})
    .SetKernelFn(PD_KERNEL(zoo_dnnl::ConvActBackward));

PD_BUILD_OP(zoo_conv2d_bf16)
    .Inputs({"X", "W"})
    .Outputs({"Out"})
    .Attrs({"strides: std::vector<int64_t>", "pads: std::vector<int64_t>", "dilations: std::vector<int64_t>",
            "groups: int64_t", "need_dx: bool"})
    .SetKernelFn(PD_KERNEL(zoo_dnnl::ConvBf16Forward));
PD_BUILD_GRAD_OP(zoo_conv2d_bf16)
    .Inputs({"X", "W", paddle::Grad("Out")})
    .Outputs({paddle::Grad("X"), paddle::Grad("W")})
    .Attrs({"strides: std::vector<int64_t>", "pads: std::vector<int64_t>", "dilations: std::vector<int64_t>",
            "groups: int64_t", "need_dx: bool"})
    .SetKernelFn(PD_KERNEL(zoo_dnnl::ConvBf16Backward));

PD_BUILD_OP(zoo_lstm)
    .Inputs({"X", "WeightIh", "WeightHh", "Bias"})
    .Outputs({"Out", "Workspace"})
    .Attrs({"reverse: bool"})
    .SetKernelFn(PD_KERNEL(zoo_dnnl::LstmForward))
    .SetInferDtypeFn(PD_INFER_DTYPE(zoo_dnnl::LstmInferDtype));
PD_BUILD_OP(zoo_lstm_infer)
    .Inputs({"X", "WeightIh", "WeightHh", "Bias"})
    .Outputs({"Out"})
    .Attrs({"reverse: bool"})
    .SetKernelFn(PD_KERNEL(zoo_dnnl::LstmInfer));
PD_BUILD_GRAD_OP(zoo_lstm)
    .Inputs({"X", "WeightIh", "WeightHh", "Bias", "Out", "Workspace", paddle::Grad("Out")})
    .Outputs({paddle::Grad("X"), paddle::Grad("WeightIh"), paddle::Grad("WeightHh"), paddle::Grad("Bias")})
    .Attrs({"reverse: bool"})
    .SetKernelFn(PD_KERNEL(zoo_dnnl::LstmBackward));

PD_BUILD_OP(zoo_lstm_bf16)
    .Inputs({"X", "WeightIh", "WeightHh", "Bias"})
    .Outputs({"Out", "Workspace"})
    .Attrs({"reverse: bool"})
    .SetKernelFn(PD_KERNEL(zoo_dnnl::LstmBf16Forward))
    .SetInferDtypeFn(PD_INFER_DTYPE(zoo_dnnl::LstmInferDtype));
PD_BUILD_OP(zoo_lstm_bf16_infer)
    .Inputs({"X", "WeightIh", "WeightHh", "Bias"})
    .Outputs({"Out"})
    .Attrs({"reverse: bool"})
    .SetKernelFn(PD_KERNEL(zoo_dnnl::LstmBf16Infer));
PD_BUILD_GRAD_OP(zoo_lstm_bf16)
    .Inputs({"X", "WeightIh", "WeightHh", "Bias", "Out", "Workspace", paddle::Grad("Out")})
    .Outputs({paddle::Grad("X"), paddle::Grad("WeightIh"), paddle::Grad("WeightHh"), paddle::Grad("Bias")})
    .Attrs({"reverse: bool"})
    .SetKernelFn(PD_KERNEL(zoo_dnnl::LstmBf16Backward));

// The ViT's attention core for XLA:CPU, an FFI custom call (vit_jax/kernels/cpu.py builds and
// registers it): softmax(q k^T / sqrt(head_dim)) v, forward and backward, float32.
//
// q, k and v are read straight from the QKV projection's [batch, tokens, 3, heads, head_dim]
// output and the result is written [batch, tokens, heads, head_dim], so the model needs no
// heads-major transposes. Each (batch, head) pair is one task on XLA's intra-op thread pool; a
// task packs its operands into zero-padded scratch rows, runs its matmuls as register-tiled loops
// and keeps the [tokens, tokens] softmax weights for the backward pass, as the XLA path does.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif
#include <vector>

#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using vit_jax::Failed;
using vit_jax::ParallelFor;

inline int64_t RoundUp(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// Rows of C a tile keeps in registers: R x 16 accumulators, R independent FMA chains per step
// of the K loop. AVX-512 holds 16 floats in one register and retires two FMAs a cycle with a
// latency of four, so 4 rows of floats left half its FMA throughput unused: 8 there. With AVX2,
// 4 rows of 16 floats are already 8 registers (16 doubles: 16 registers), so 4 elsewhere.
template <typename T>
constexpr int TileRows() {
#if defined(__AVX512F__)
  return sizeof(T) == 4 ? 8 : 4;
#else
  return 4;
#endif
}

// The R x 16 tile of C at (i, j): C[i:i+R, j:j+16] = A[i:i+R, :] B[:, j:j+16].
template <int R, bool kTransA, typename T>
inline void GemmTile(int64_t i, int64_t j, int64_t k, const T* a, int64_t lda, const T* b,
                     int64_t ldb, float* c, int64_t ldc) {
  T acc[R][16] = {};
  for (int64_t p = 0; p < k; ++p) {
    const T* bp = b + p * ldb + j;
    for (int ii = 0; ii < R; ++ii) {
      const T ai = kTransA ? a[p * lda + i + ii] : a[(i + ii) * lda + p];
#pragma omp simd
      for (int jj = 0; jj < 16; ++jj) acc[ii][jj] += ai * bp[jj];
    }
  }
  for (int ii = 0; ii < R; ++ii)
    for (int jj = 0; jj < 16; ++jj) c[(i + ii) * ldc + j + jj] = static_cast<float>(acc[ii][jj]);
}

// C[M, N] = A[M, K] B[K, N] (kTransA: A is stored as [K, M]), row-major with leading
// dimensions; M % 4 == 0, N % 16 == 0. Each element of C is one sum over K in order, whatever
// the tile size. T is float, or double for the logits q k^T: their float sums lose most of their
// digits to cancellation when the logits are large (the softmax gradient was then 17x further
// from float64 than a float64 sum rounded once to float).
template <bool kTransA, typename T = float>
void Gemm(int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb,
          float* c, int64_t ldc) {
  constexpr int R = TileRows<T>();
  for (int64_t j = 0; j < n; j += 16) {
    int64_t i = 0;
    for (; i + R <= m; i += R) GemmTile<R, kTransA>(i, j, k, a, lda, b, ldb, c, ldc);
    for (; i < m; i += 4) GemmTile<4, kTransA>(i, j, k, a, lda, b, ldb, c, ldc);
  }
}

// Scratch space of the calling thread, grown as needed and reused across tasks (not zeroed).
float* Scratch(int slot, int64_t size) {
  thread_local std::vector<float> buffers[8];
  if (static_cast<int64_t>(buffers[slot].size()) < size) buffers[slot].resize(size);
  return buffers[slot].data();
}

double* ScratchDouble(int slot, int64_t size) {
  thread_local std::vector<double> buffers[2];
  if (static_cast<int64_t>(buffers[slot].size()) < size) buffers[slot].resize(size);
  return buffers[slot].data();
}

// Softmax of row[0:t] in place: exp(x - max) over the sum. exp by Cody-Waite range reduction
// and a degree-6 polynomial, eight lanes at a time with AVX2 and FMA (libm's expf does not
// vectorize without -ffast-math); tests/test_cpu_kernels.py checks the result against XLA.
inline float ExpPoly(float r) {
  float p = 1.38888889e-03f;
  p = p * r + 8.33333333e-03f;
  p = p * r + 4.16666667e-02f;
  p = p * r + 1.66666667e-01f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  return p * r + 1.0f;
}

inline float ExpScalar(float x) {
  x = std::max(x, -87.f);
  const float n = std::nearbyint(x * 1.44269504f);
  const float r = (x - n * 0.693145752f) - n * 1.42860677e-06f;
  return ExpPoly(r) * std::ldexp(1.f, static_cast<int>(n));
}

#if defined(__AVX2__) && defined(__FMA__)
inline __m256 Exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-06f), r);
  __m256 p = _mm256_set1_ps(1.38888889e-03f);
  for (float c : {8.33333333e-03f, 4.16666667e-02f, 1.66666667e-01f, 0.5f, 1.0f, 1.0f})
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#endif

// The row's maximum: eight lanes at a time with AVX2 (one scalar chain of maxss, four cycles an
// element, was most of the forward pass's time outside its matmuls).
float RowMax(const float* row, int64_t t) {
  float mx = row[0];
  int64_t j = 0;
#if defined(__AVX2__) && defined(__FMA__)
  if (t >= 8) {
    __m256 m8 = _mm256_loadu_ps(row);
    for (j = 8; j + 8 <= t; j += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(row + j));
    float lanes[8];
    _mm256_storeu_ps(lanes, m8);
    for (float l : lanes) mx = std::max(mx, l);
  }
#endif
  for (; j < t; ++j) mx = std::max(mx, row[j]);
  return mx;
}

void SoftmaxRow(float* row, int64_t t) {
  const float mx = RowMax(row, t);
  float sum = 0.f;
  int64_t j = 0;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 acc = _mm256_setzero_ps();
  const __m256 m8 = _mm256_set1_ps(mx);
  for (; j + 8 <= t; j += 8) {
    const __m256 e = Exp8(_mm256_sub_ps(_mm256_loadu_ps(row + j), m8));
    _mm256_storeu_ps(row + j, e);
    acc = _mm256_add_ps(acc, e);
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, acc);
  for (float l : lanes) sum += l;
#endif
  for (; j < t; ++j) {
    row[j] = ExpScalar(row[j] - mx);
    sum += row[j];
  }
  const float inv = 1.f / sum;
  for (int64_t k = 0; k < t; ++k) row[k] *= inv;
}

struct Shape {
  int64_t b, t, h, d;
  int64_t tp4() const { return RoundUp(t, 4); }
  int64_t tp16() const { return RoundUp(t, 16); }
  int64_t dp16() const { return RoundUp(d, 16); }
  // 1/sqrt(head_dim) rounded once to float, as vit_jax.models.ops.scaled_queries multiplies.
  float scale() const { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(d))); }
  // Row i of part s (0: q, 1: k, 2: v) of batch bi, head hi in [B, T, 3, H, D].
  int64_t qkv(int64_t bi, int64_t i, int64_t s, int64_t hi) const {
    return (((bi * t + i) * 3 + s) * h + hi) * d;
  }
  int64_t out(int64_t bi, int64_t i, int64_t hi) const { return ((bi * t + i) * h + hi) * d; }
};

// rows [t, d] with row stride `stride`, times `scale`, into dst [rows_p, cols_p] (zero padding;
// only the padding is zeroed, the rest is written once).
template <typename T = float>
void Pack(const float* src, int64_t stride, int64_t t, int64_t d, float scale, T* dst,
          int64_t rows_p, int64_t cols_p) {
  for (int64_t i = 0; i < t; ++i) {
    T* row = dst + i * cols_p;
    for (int64_t x = 0; x < d; ++x) row[x] = src[i * stride + x] * scale;
    std::fill(row + d, row + cols_p, T(0));
  }
  std::fill(dst + t * cols_p, dst + rows_p * cols_p, T(0));
}

// The transpose: dst[x, i] = src[i, x] for i < t, x < d; dst is [rows_p >= d, cols_p >= t].
template <typename T = float>
void PackTransposed(const float* src, int64_t stride, int64_t t, int64_t d, float scale,
                    T* dst, int64_t rows_p, int64_t cols_p) {
  for (int64_t i = 0; i < t; ++i)
    for (int64_t x = 0; x < d; ++x) dst[x * cols_p + i] = src[i * stride + x] * scale;
  for (int64_t x = 0; x < d; ++x) std::fill(dst + x * cols_p + t, dst + (x + 1) * cols_p, T(0));
  std::fill(dst + d * cols_p, dst + rows_p * cols_p, T(0));
}

ffi::Future Forward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> qkv, ffi::ResultBuffer<ffi::F32> out,
                   ffi::ResultBuffer<ffi::F32> weights) {
  auto dims = qkv.dimensions();
  if (dims.size() != 5 || dims[2] != 3) {
    return Failed(
        ffi::Error::InvalidArgument("attention: qkv must be [batch, tokens, 3, heads, head_dim]"));
  }
  const Shape s{dims[0], dims[1], dims[3], dims[4]};
  const float* x = qkv.typed_data();
  float* o = out->typed_data();
  float* w = weights->typed_data();
  const float scale = s.scale();
  const int64_t stride = 3 * s.h * s.d;
  auto task_body = [=](int64_t task) {
    const int64_t bi = task / s.h, hi = task % s.h;
    const int64_t tp4 = s.tp4(), tp16 = s.tp16(), dp16 = s.dp16(), t = s.t, d = s.d;
    double* q = ScratchDouble(0, tp4 * d);  // the logits' operands, in double
    double* kt = ScratchDouble(1, d * tp16);
    float* v = Scratch(2, t * dp16);
    float* p = Scratch(3, tp4 * tp16);
    float* ov = Scratch(4, tp4 * dp16);
    Pack(x + s.qkv(bi, 0, 0, hi), stride, t, d, scale, q, tp4, d);
    PackTransposed(x + s.qkv(bi, 0, 1, hi), stride, t, d, 1.f, kt, d, tp16);
    Pack(x + s.qkv(bi, 0, 2, hi), stride, t, d, 1.f, v, t, dp16);
    Gemm<false, double>(tp4, tp16, d, q, d, kt, tp16, p, tp16);  // the logits
    float* wt = w + task * t * t;
    for (int64_t i = 0; i < t; ++i) {
      float* row = p + i * tp16;
      SoftmaxRow(row, t);
      std::fill(row + t, row + tp16, 0.f);
      std::memcpy(wt + i * t, row, t * sizeof(float));
    }
    Gemm<false>(tp4, dp16, t, p, tp16, v, dp16, ov, dp16);
    for (int64_t i = 0; i < t; ++i)
      std::memcpy(o + s.out(bi, i, hi), ov + i * dp16, d * sizeof(float));
  };
  return ParallelFor(pool, s.b * s.h, task_body, [] {});
}

ffi::Future Backward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> d_out, ffi::Buffer<ffi::F32> qkv,
                    ffi::Buffer<ffi::F32> weights, ffi::ResultBuffer<ffi::F32> d_qkv) {
  auto dims = qkv.dimensions();
  if (dims.size() != 5 || dims[2] != 3 || d_out.element_count() * 3 != qkv.element_count()) {
    return Failed(ffi::Error::InvalidArgument(
        "attention backward: qkv must be [batch, tokens, 3, heads, head_dim] and d_out "
        "[batch, tokens, heads, head_dim]"));
  }
  const Shape s{dims[0], dims[1], dims[3], dims[4]};
  const float* x = qkv.typed_data();
  const float* go = d_out.typed_data();
  const float* w = weights.typed_data();
  float* dx = d_qkv->typed_data();
  const float scale = s.scale();
  const int64_t stride = 3 * s.h * s.d, out_stride = s.h * s.d;
  auto task_body = [=](int64_t task) {
    const int64_t bi = task / s.h, hi = task % s.h;
    const int64_t tp4 = s.tp4(), tp16 = s.tp16(), dp16 = s.dp16(), t = s.t, d = s.d;
    // dP = dO V^T; dS = P (dP - rowsum(dP P)); dQ = dS K scale; dK = dS^T (Q scale); dV = P^T dO.
    // dS and P are kept [tp4 rows, tp16 columns] with zero padding, so the transposed products
    // read them column-wise (Gemm<true>) over the t query rows.
    float* g = Scratch(0, tp4 * d);
    float* vt = Scratch(1, d * tp16);
    float* ds = Scratch(2, tp4 * tp16);
    float* p = Scratch(3, tp4 * tp16);
    float* kk = Scratch(4, t * dp16);
    float* qs = Scratch(5, t * dp16);
    float* go_p = Scratch(6, t * dp16);
    float* res = Scratch(7, tp4 * dp16);
    Pack(go + s.out(bi, 0, hi), out_stride, t, d, 1.f, g, tp4, d);
    PackTransposed(x + s.qkv(bi, 0, 2, hi), stride, t, d, 1.f, vt, d, tp16);
    Gemm<false>(tp4, tp16, d, g, d, vt, tp16, ds, tp16);  // dP, turned into dS below
    const float* wt = w + task * t * t;
    for (int64_t i = 0; i < t; ++i) {
      const float* pr = wt + i * t;
      float* dsr = ds + i * tp16;
      float* prow = p + i * tp16;
      float dot = 0.f;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j < t; ++j) dot += dsr[j] * pr[j];
#pragma omp simd
      for (int64_t j = 0; j < t; ++j) {
        dsr[j] = pr[j] * (dsr[j] - dot);
        prow[j] = pr[j];
      }
      std::fill(dsr + t, dsr + tp16, 0.f);
      std::fill(prow + t, prow + tp16, 0.f);
    }
    Pack(x + s.qkv(bi, 0, 1, hi), stride, t, d, 1.f, kk, t, dp16);
    Pack(x + s.qkv(bi, 0, 0, hi), stride, t, d, scale, qs, t, dp16);
    Pack(go + s.out(bi, 0, hi), out_stride, t, d, 1.f, go_p, t, dp16);
    auto store = [&](int64_t part, float factor) {
      for (int64_t i = 0; i < t; ++i) {
        float* dst = dx + s.qkv(bi, i, part, hi);
        const float* src = res + i * dp16;
        for (int64_t c = 0; c < d; ++c) dst[c] = src[c] * factor;
      }
    };
    Gemm<false>(tp4, dp16, t, ds, tp16, kk, dp16, res, dp16);
    store(0, scale);
    Gemm<true>(tp4, dp16, t, ds, tp16, qs, dp16, res, dp16);
    store(1, 1.f);
    Gemm<true>(tp4, dp16, t, p, tp16, go_p, dp16, res, dp16);
    store(2, 1.f);
  };
  return ParallelFor(pool, s.b * s.h, task_body, [] {});
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(VitAttentionForward, Forward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(VitAttentionBackward, Backward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

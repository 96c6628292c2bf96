// LayerNorm over the last axis for XLA:CPU, FFI custom calls (vit_jax/kernels/cpu.py builds and
// registers them): y = (x - mean) / sqrt(var + epsilon) * scale + bias in float32, and its
// backward pass, the row statistics saved in between as the XLA path saves them. Rows are split
// into chunks run on XLA's intra-op thread pool; the handlers return futures instead of waiting.
// The parameters' gradients are summed per chunk and then over chunks in a fixed order, so the
// result does not depend on which thread ran what.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using vit_jax::Failed;
using vit_jax::ParallelFor;

bool RowsOf(const ffi::Buffer<ffi::F32>& x, int64_t d, int64_t* rows) {
  if (d == 0 || x.element_count() % d) return false;
  *rows = x.element_count() / d;
  return true;
}

// Four chunks per thread, each at least ~16k numbers.
int64_t Chunks(ffi::ThreadPool& pool, int64_t rows, int64_t d) {
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t min_rows = std::max<int64_t>(1, 16384 / d);
  return std::min<int64_t>(threads * 4, std::max<int64_t>(1, rows / min_rows));
}

ffi::Future Forward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> scale,
                   ffi::Buffer<ffi::F32> bias, float epsilon, ffi::ResultBuffer<ffi::F32> y,
                   ffi::ResultBuffer<ffi::F32> mean, ffi::ResultBuffer<ffi::F32> rstd) {
  const int64_t d = scale.element_count();
  int64_t rows;
  if (!RowsOf(x, d, &rows) || bias.element_count() != d) {
    return Failed(ffi::Error::InvalidArgument("layer norm: x must be [..., d], scale and bias [d]"));
  }
  const float* xs = x.typed_data();
  const float* g = scale.typed_data();
  const float* b = bias.typed_data();
  float* ys = y->typed_data();
  float* ms = mean->typed_data();
  float* rs = rstd->typed_data();
  const int64_t chunks = Chunks(pool, rows, d);
  auto rows_of_chunk = [=](int64_t c) {
    const int64_t lo = rows * c / chunks, hi = rows * (c + 1) / chunks;
    for (int64_t r = lo; r < hi; ++r) {
      const float* xr = xs + r * d;
      float* yr = ys + r * d;
      float sum = 0.f;
#pragma omp simd reduction(+ : sum)
      for (int64_t i = 0; i < d; ++i) sum += xr[i];
      const float m = sum / d;
      float sq = 0.f;
#pragma omp simd reduction(+ : sq)
      for (int64_t i = 0; i < d; ++i) sq += (xr[i] - m) * (xr[i] - m);
      const float rstd_r = 1.f / std::sqrt(sq / d + epsilon);
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) yr[i] = (xr[i] - m) * rstd_r * g[i] + b[i];
      ms[r] = m;
      rs[r] = rstd_r;
    }
  };
  return ParallelFor(pool, chunks, rows_of_chunk, [] {});
}

ffi::Future Backward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> dy, ffi::Buffer<ffi::F32> x,
                    ffi::Buffer<ffi::F32> mean, ffi::Buffer<ffi::F32> rstd,
                    ffi::Buffer<ffi::F32> scale, ffi::ResultBuffer<ffi::F32> dx,
                    ffi::ResultBuffer<ffi::F32> dscale, ffi::ResultBuffer<ffi::F32> dbias) {
  const int64_t d = scale.element_count();
  int64_t rows;
  if (!RowsOf(x, d, &rows) || dy.element_count() != x.element_count()) {
    return Failed(ffi::Error::InvalidArgument("layer norm backward: dy and x must be [..., d]"));
  }
  const float* dys = dy.typed_data();
  const float* xs = x.typed_data();
  const float* ms = mean.typed_data();
  const float* rs = rstd.typed_data();
  const float* g = scale.typed_data();
  float* dxs = dx->typed_data();
  const int64_t chunks = Chunks(pool, rows, d);
  auto partial = std::make_shared<std::vector<float>>(2 * chunks * d, 0.f);
  float* parts = partial->data();
  float* dsc = dscale->typed_data();
  float* dbi = dbias->typed_data();
  auto rows_of_chunk = [=](int64_t c) {
    const int64_t lo = rows * c / chunks, hi = rows * (c + 1) / chunks;
    float* ds = parts + 2 * c * d;
    float* db = ds + d;
    for (int64_t r = lo; r < hi; ++r) {
      const float* xr = xs + r * d;
      const float* dyr = dys + r * d;
      float* dxr = dxs + r * d;
      const float m = ms[r], rr = rs[r];
      float s1 = 0.f, s2 = 0.f;
#pragma omp simd reduction(+ : s1, s2)
      for (int64_t i = 0; i < d; ++i) {
        const float xh = (xr[i] - m) * rr;
        const float gi = dyr[i] * g[i];
        s1 += gi;
        s2 += gi * xh;
        ds[i] += dyr[i] * xh;
        db[i] += dyr[i];
      }
      s1 /= d;
      s2 /= d;
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) {
        const float xh = (xr[i] - m) * rr;
        dxr[i] = rr * (dyr[i] * g[i] - s1 - xh * s2);
      }
    }
  };
  auto sum_chunks = [=] {
    for (int64_t i = 0; i < d; ++i) dsc[i] = dbi[i] = 0.f;
    for (int64_t c = 0; c < chunks; ++c) {
      const float* ds = parts + 2 * c * d;
      for (int64_t i = 0; i < d; ++i) {
        dsc[i] += ds[i];
        dbi[i] += ds[d + i];
      }
    }
    (void)partial;  // captured: the partial sums live until the last worker is done
  };
  return ParallelFor(pool, chunks, rows_of_chunk, sum_chunks);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(VitLayerNormForward, Forward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("epsilon")
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(VitLayerNormBackward, Backward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

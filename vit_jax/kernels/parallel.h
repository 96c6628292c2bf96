// Shared by attention.cc and layer_norm.cc: running an FFI handler's work on XLA:CPU's
// intra-op thread pool without blocking any of its threads, and failing with a message.
#ifndef VIT_JAX_CPU_PARALLEL_H_
#define VIT_JAX_CPU_PARALLEL_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>

#include "xla/ffi/api/ffi.h"

namespace vit_jax {

namespace ffi = xla::ffi;

// Runs body(task) for every task in [0, tasks) on the pool, one worker per pool thread taking
// tasks in turn, then finish() on the worker that ends last, and then completes the returned
// future. Returns at once: XLA's runtime goes on with other work and continues after the custom
// call when the future is ready. (A first version that blocked a pool thread until the workers
// were done stalled the train step: with two threads, one of them sat waiting.)
template <typename Body, typename Finish>
ffi::Future ParallelFor(ffi::ThreadPool& pool, int64_t tasks, Body body, Finish finish) {
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(pool.num_threads(), tasks));
  ffi::Promise promise;
  ffi::Future future(promise);
  struct State {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> left;
  };
  auto state = std::make_shared<State>();
  state->left = workers;
  for (int64_t w = 0; w < workers; ++w) {
    pool.Schedule([=]() mutable {
      for (int64_t t; (t = state->next.fetch_add(1)) < tasks;) body(t);
      if (state->left.fetch_sub(1) == 1) {
        finish();
        promise.SetAvailable();
      }
    });
  }
  return future;
}

// A future that is already failed with `error`.
inline ffi::Future Failed(ffi::Error error) {
  ffi::Promise promise;
  ffi::Future future(promise);
  promise.SetError(std::move(error));
  return future;
}

}  // namespace vit_jax

#endif  // VIT_JAX_CPU_PARALLEL_H_

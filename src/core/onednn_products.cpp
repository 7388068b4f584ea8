// bfloat16 block products on oneDNN's matmul (bf16 inputs, float32 accumulation): the kernel
// the bfloat16 issue's products run on where oneDNN is present. One primitive per shape, kept
// in a per-thread cache (a primitive_desc costs tens of microseconds; a training step calls the
// same few shapes again and again).
//
// Called by detail::gemm (core/gemm.hpp) for every bfloat16 product.

#include "core/onednn_products.hpp"

#include <cblas.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace shard::detail {

namespace {

using dt = dnnl::memory::data_type;

dnnl::engine& cpu_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

/// A row-major m x n operand with leading dim ld, read transposed when `t` (then it is stored
/// n x m): a desc with strides, so no copy is made.
dnnl::memory::desc operand_desc(std::int64_t rows, std::int64_t cols, std::int64_t ld, bool t, dt type) {
  const dnnl::memory::dims dims{rows, cols};
  const dnnl::memory::dims strides = t ? dnnl::memory::dims{1, ld} : dnnl::memory::dims{ld, 1};
  return dnnl::memory::desc(dims, type, strides);
}

struct Key {
  std::int64_t m, n, k, lda, ldb, ldc;
  bool ta, tb, accumulate, bf16_out;
  auto tie() const { return std::tie(m, n, k, lda, ldb, ldc, ta, tb, accumulate, bf16_out); }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

struct Entry {
  dnnl::memory::desc a, b, c;
  dnnl::matmul prim;
};

Entry& primitive_for(const Key& key) {
  thread_local std::map<Key, Entry> cache;
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const auto a = operand_desc(key.m, key.k, key.lda, key.ta, dt::bf16);
  const auto b = operand_desc(key.k, key.n, key.ldb, key.tb, dt::bf16);
  const auto c = operand_desc(key.m, key.n, key.ldc, false, key.bf16_out ? dt::bf16 : dt::f32);
  dnnl::primitive_attr attr;
  if (key.accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, cpu_engine());
  return cache.emplace(key, Entry{a, b, c, dnnl::matmul(pd)}).first->second;
}

/// True when oneDNN builds a bf16 matmul on this CPU (it needs AVX-512; avx512_bf16 or AMX run
/// it natively) and SHARD_BF16_PRODUCTS is not "convert".
bool onednn_usable() {
  static const bool usable = [] {
    const char* env = std::getenv("SHARD_BF16_PRODUCTS");
    if (env && std::string(env) == "convert") return false;
    try {
      const auto a = operand_desc(2, 2, 2, false, dt::bf16);
      const auto c = operand_desc(2, 2, 2, false, dt::f32);
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, a, c), cpu_engine());
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return usable;
}

/// The stored rows x cols matrix x (leading dim ld) as a dense float32 matrix, in a per-thread
/// buffer `slot` (reused across calls: no allocation per product after the first).
const float* widened(const bfloat16* x, std::int64_t rows, std::int64_t cols, std::int64_t ld, int slot) {
  thread_local std::vector<float> buffers[2];
  std::vector<float>& out = buffers[slot];
  if (out.size() < static_cast<std::size_t>(rows * cols)) out.resize(static_cast<std::size_t>(rows * cols));
  for (std::int64_t i = 0; i < rows; ++i) widen_bf16(x + i * ld, out.data() + i * cols, cols);
  return out.data();
}

/// The same product by widening to float32 and OpenBLAS's sgemm (exact products of bf16 values
/// in float32; the sums' order differs from oneDNN's). The operands are widened as stored (the
/// transposes are sgemm's); a float32 output is written by sgemm in place.
template <typename Out>
void run_converted(std::int64_t m, std::int64_t n, std::int64_t k, const bfloat16* a, bool ta,
                   std::int64_t lda, const bfloat16* b, bool tb, std::int64_t ldb, Out* c, std::int64_t ldc,
                   bool accumulate) {
  const std::int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
  const float* fa = widened(a, ar, ac, lda, 0);
  const float* fb = widened(b, br, bc, ldb, 1);
  const auto tra = ta ? CblasTrans : CblasNoTrans, trb = tb ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<Out, float>) {
    cblas_sgemm(CblasRowMajor, tra, trb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0f,
                fa, static_cast<int>(ac), fb, static_cast<int>(bc), accumulate ? 1.0f : 0.0f, c,
                static_cast<int>(ldc));
  } else {
    thread_local std::vector<float> out;
    if (out.size() < static_cast<std::size_t>(m * n)) out.resize(static_cast<std::size_t>(m * n));
    if (accumulate)
      for (std::int64_t i = 0; i < m; ++i) widen_bf16(c + i * ldc, out.data() + i * n, n);
    cblas_sgemm(CblasRowMajor, tra, trb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0f,
                fa, static_cast<int>(ac), fb, static_cast<int>(bc), accumulate ? 1.0f : 0.0f, out.data(),
                static_cast<int>(n));
    for (std::int64_t i = 0; i < m; ++i) narrow_to_bf16(out.data() + i * n, c + i * ldc, n);
  }
}

/// oneDNN's OpenMP threads for calls from this thread: as many as OpenBLAS uses (1 when a rank
/// runs several devices, whose threads call products at once), so that threads x devices per
/// rank stay within the cores. Set once per calling thread (OpenMP's thread count is per thread);
/// omp_set_num_threads is looked up in the OpenMP runtime oneDNN loaded.
void size_onednn_threads() {
  thread_local const bool done = [] {
    using SetThreads = void (*)(int);
    if (auto* set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "omp_set_num_threads")))
      set(std::max(1, openblas_get_num_threads()));
    return true;
  }();
  (void)done;
}

template <typename Out>
void run(std::int64_t m, std::int64_t n, std::int64_t k, const bfloat16* a, bool ta, std::int64_t lda,
         const bfloat16* b, bool tb, std::int64_t ldb, Out* c, std::int64_t ldc, bool accumulate) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum (oneDNN takes no empty dims)
    if (!accumulate)
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t j = 0; j < n; ++j) c[i * ldc + j] = Out(0.0f);
    return;
  }
  if (!onednn_usable()) return run_converted(m, n, k, a, ta, lda, b, tb, ldb, c, ldc, accumulate);
  size_onednn_threads();
  Entry& e = primitive_for(Key{m, n, k, lda, ldb, ldc, ta, tb, accumulate, std::is_same_v<Out, bfloat16>});
  dnnl::engine& eng = cpu_engine();
  thread_local dnnl::stream stream(eng);
  dnnl::memory am(e.a, eng, const_cast<bfloat16*>(a));
  dnnl::memory bm(e.b, eng, const_cast<bfloat16*>(b));
  dnnl::memory cm(e.c, eng, c);
  e.prim.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
  stream.wait();
}

}  // namespace

const char* bf16_products_path() {
  return onednn_usable() ? "oneDNN matmul (bf16 inputs, float32 accumulation)"
                         : "bf16 -> float32 + OpenBLAS sgemm";
}

void bf16_gemm(std::int64_t m, std::int64_t n, std::int64_t k, const bfloat16* a, bool ta, std::int64_t lda,
               const bfloat16* b, bool tb, std::int64_t ldb, float* c, std::int64_t ldc, bool accumulate) {
  run(m, n, k, a, ta, lda, b, tb, ldb, c, ldc, accumulate);
}

void bf16_gemm(std::int64_t m, std::int64_t n, std::int64_t k, const bfloat16* a, bool ta, std::int64_t lda,
               const bfloat16* b, bool tb, std::int64_t ldb, bfloat16* c, std::int64_t ldc, bool accumulate) {
  run(m, n, k, a, ta, lda, b, tb, ldb, c, ldc, accumulate);
}

}  // namespace shard::detail

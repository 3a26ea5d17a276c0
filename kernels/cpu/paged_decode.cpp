// Paged decode attention for the CPU: one query token per sequence, reading K/V straight from the
// block table (no gather copy), GQA-aware, fp32 accumulation. Parallel over (sequence, KV head).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <vector>

namespace {

inline float to_float(float x) { return x; }
inline float to_float(c10::Half x) { return static_cast<float>(x); }
inline float to_float(c10::BFloat16 x) { return static_cast<float>(x); }

// 8 floats; GCC/Clang vector extension: AVX with -march=native on x86, two 128-bit ops elsewhere.
// aligned(4): rows start anywhere in the cache.
typedef float v8f __attribute__((vector_size(32), aligned(4)));

inline float hsum(v8f v) { return (v[0] + v[1]) + (v[2] + v[3]) + (v[4] + v[5]) + (v[6] + v[7]); }

// A cache row as fp32: itself for fp32 caches, else converted into `buf`.
inline const float* as_float(const float* row, float*, int64_t) { return row; }
template <typename T>
inline const float* as_float(const T* row, float* buf, int64_t d) {
  for (int64_t i = 0; i < d; ++i) buf[i] = to_float(row[i]);
  return buf;
}

// scores[g] = q_g . k for every query head g of the group (q pre-scaled, [group, d]); d % 8 == 0.
inline void dots(const float* q, const float* k, int64_t group, int64_t d, float* scores, int64_t score_stride) {
  const int64_t nv = d / 8;
  const v8f* kv = reinterpret_cast<const v8f*>(k);
  for (int64_t g = 0; g < group; ++g) {
    const v8f* qv = reinterpret_cast<const v8f*>(q + g * d);
    v8f acc = qv[0] * kv[0];
    for (int64_t i = 1; i < nv; ++i) acc += qv[i] * kv[i];
    scores[g * score_stride] = hsum(acc);
  }
}

// acc_g += p_g * v for every query head g of the group; d % 8 == 0.
inline void axpys(const float* p, int64_t p_stride, const float* v, int64_t group, int64_t d, float* acc) {
  const int64_t nv = d / 8;
  const v8f* vv = reinterpret_cast<const v8f*>(v);
  for (int64_t g = 0; g < group; ++g) {
    v8f* av = reinterpret_cast<v8f*>(acc + g * d);
    const float pg = p[g * p_stride];
    for (int64_t i = 0; i < nv; ++i) av[i] += pg * vv[i];
  }
}

template <typename T>
void decode_kernel(T* out, const T* q, const T* k_cache, const T* v_cache, const int32_t* tables,
                   const int32_t* seq_lens, int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads,
                   int64_t head_dim, int64_t block_size, int64_t max_blocks, float scale,
                   int64_t q_stride_tok, int64_t q_stride_head, int64_t o_stride_tok, int64_t o_stride_head) {
  const int64_t group = num_heads / num_kv_heads;
  // cache layout [num_blocks, block_size, num_kv_heads, head_dim], contiguous
  const int64_t tok_stride = num_kv_heads * head_dim;
  const int64_t blk_stride = block_size * tok_stride;
  at::parallel_for(0, num_seqs * num_kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, qf(group * head_dim), acc(group * head_dim), row_buf(head_dim);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t s = item / num_kv_heads, kh = item % num_kv_heads;
      const int64_t len = seq_lens[s];
      const int32_t* table = tables + s * max_blocks;
      scores.resize(group * len);
      for (int64_t g = 0; g < group; ++g) {
        const T* qrow = q + s * q_stride_tok + (kh * group + g) * q_stride_head;
        for (int64_t i = 0; i < head_dim; ++i) qf[g * head_dim + i] = to_float(qrow[i]) * scale;
      }
      // scores[g, t] = q_g . k_t
      for (int64_t t0 = 0; t0 < len; t0 += block_size) {
        const T* kblk = k_cache + int64_t(table[t0 / block_size]) * blk_stride + kh * head_dim;
        const int64_t n = std::min(block_size, len - t0);
        for (int64_t j = 0; j < n; ++j) {
          const float* krow = as_float(kblk + j * tok_stride, row_buf.data(), head_dim);
          dots(qf.data(), krow, group, head_dim, &scores[t0 + j], len);
        }
      }
      // softmax over t, per query head
      for (int64_t g = 0; g < group; ++g) {
        float* row = &scores[g * len];
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t t = 0; t < len; ++t) mx = std::max(mx, row[t]);
        float sum = 0.f;
        for (int64_t t = 0; t < len; ++t) {
          row[t] = std::exp(row[t] - mx);
          sum += row[t];
        }
        const float inv = 1.f / sum;
        for (int64_t t = 0; t < len; ++t) row[t] *= inv;
      }
      // out[g] = sum_t p[g, t] v_t
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t t0 = 0; t0 < len; t0 += block_size) {
        const T* vblk = v_cache + int64_t(table[t0 / block_size]) * blk_stride + kh * head_dim;
        const int64_t n = std::min(block_size, len - t0);
        for (int64_t j = 0; j < n; ++j) {
          const float* vrow = as_float(vblk + j * tok_stride, row_buf.data(), head_dim);
          axpys(&scores[t0 + j], len, vrow, group, head_dim, acc.data());
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        T* orow = out + s * o_stride_tok + (kh * group + g) * o_stride_head;
        for (int64_t i = 0; i < head_dim; ++i) orow[i] = static_cast<T>(acc[g * head_dim + i]);
      }
    }
  });
}

template <typename T>
void run_decode(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale) {
  decode_kernel<T>(out.data_ptr<T>(), q.data_ptr<T>(), k_cache.data_ptr<T>(), v_cache.data_ptr<T>(),
                   block_tables.data_ptr<int32_t>(), seq_lens.data_ptr<int32_t>(), q.size(0), q.size(1),
                   k_cache.size(2), q.size(2), k_cache.size(1), block_tables.size(1), static_cast<float>(scale),
                   q.stride(0), q.stride(1), out.stride(0), out.stride(1));
}

// out/q: [num_seqs, num_heads, head_dim] (last dim contiguous); caches: [num_blocks, block_size,
// num_kv_heads, head_dim] contiguous; block_tables: [num_seqs, max_blocks] int32; seq_lens: [num_seqs] int32.
void paged_decode(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                  const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale) {
  TORCH_CHECK(q.device().is_cpu(), "paged_decode: CPU tensors only");
  TORCH_CHECK(q.dim() == 3 && out.sizes() == q.sizes(), "paged_decode: q and out must be [seqs, heads, head_dim]");
  TORCH_CHECK(q.stride(2) == 1 && out.stride(2) == 1, "paged_decode: head_dim must be contiguous");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.dim() == 4,
              "paged_decode: caches must be contiguous [blocks, block_size, kv_heads, head_dim]");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && q.scalar_type() == out.scalar_type(),
              "paged_decode: q, out and the cache must share a dtype");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && seq_lens.scalar_type() == at::kInt &&
                  block_tables.is_contiguous() && seq_lens.is_contiguous(),
              "paged_decode: block_tables and seq_lens must be contiguous int32");
  const int64_t num_seqs = q.size(0), num_heads = q.size(1), head_dim = q.size(2);
  const int64_t num_kv_heads = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == head_dim && num_heads % num_kv_heads == 0, "paged_decode: head shapes disagree");
  TORCH_CHECK(head_dim % 8 == 0, "paged_decode: head_dim must be a multiple of 8, got ", head_dim);
  TORCH_CHECK(block_tables.size(0) == num_seqs && seq_lens.size(0) == num_seqs, "paged_decode: batch sizes disagree");
  AT_DISPATCH_SWITCH(q.scalar_type(), "paged_decode",
    AT_DISPATCH_CASE(at::kFloat, [&] { run_decode<scalar_t>(out, q, k_cache, v_cache, block_tables, seq_lens, scale); })
    AT_DISPATCH_CASE(at::kHalf, [&] { run_decode<scalar_t>(out, q, k_cache, v_cache, block_tables, seq_lens, scale); })
    AT_DISPATCH_CASE(at::kBFloat16,
                     [&] { run_decode<scalar_t>(out, q, k_cache, v_cache, block_tables, seq_lens, scale); }));
}

}  // namespace

TORCH_LIBRARY(testbed_cpu, m) {
  m.def("paged_decode(Tensor(a!) out, Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor seq_lens, float scale) -> ()");
  m.impl("paged_decode", c10::DispatchKey::CPU, TORCH_FN(paged_decode));
}

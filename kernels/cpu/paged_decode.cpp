// Paged decode attention for the CPU: one query token per sequence, reading K/V straight from the
// block table (no gather copy), GQA-aware, fp32 accumulation. Parallel over sequences, balanced by length.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
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

// Ask for a whole KV block ahead of use: blocks sit anywhere in the cache, so the hardware prefetcher
// cannot guess the next one.
inline void prefetch_block(const void* p, int64_t bytes) {
    const char* c = static_cast<const char*>(p);
    for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off);
}

// One sequence, all heads: reads each of its KV blocks front to back once for K and once for V.
template <typename T>
void decode_sequence(int64_t s, T* out, const T* q, const T* k_cache, const T* v_cache, const int32_t* table,
                     int64_t len, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
                     float scale, int64_t q_stride_tok, int64_t q_stride_head, int64_t o_stride_tok,
                     int64_t o_stride_head, std::vector<float>& scores, std::vector<float>& qf, std::vector<float>& acc,
                     std::vector<float>& row_buf) {
    const int64_t group = num_heads / num_kv_heads;
    // cache layout [num_blocks, block_size, num_kv_heads, head_dim], contiguous
    const int64_t tok_stride = num_kv_heads * head_dim;
    const int64_t blk_stride = block_size * tok_stride;
    const int64_t num_blocks = (len + block_size - 1) / block_size;
    scores.resize(num_heads * len);
    for (int64_t h = 0; h < num_heads; ++h) {
        const T* qrow = q + s * q_stride_tok + h * q_stride_head;
        for (int64_t i = 0; i < head_dim; ++i) qf[h * head_dim + i] = to_float(qrow[i]) * scale;
    }
    // scores[h, t] = q_h . k_t (the query heads of a group share their KV head's row)
    for (int64_t b = 0; b < num_blocks; ++b) {
        const T* kblk = k_cache + int64_t(table[b]) * blk_stride;
        if (b + 1 < num_blocks) prefetch_block(k_cache + int64_t(table[b + 1]) * blk_stride, blk_stride * sizeof(T));
        const int64_t t0 = b * block_size, n = std::min(block_size, len - t0);
        for (int64_t j = 0; j < n; ++j) {
            for (int64_t kh = 0; kh < num_kv_heads; ++kh) {
                const float* krow = as_float(kblk + j * tok_stride + kh * head_dim, row_buf.data(), head_dim);
                dots(&qf[kh * group * head_dim], krow, group, head_dim, &scores[kh * group * len + t0 + j], len);
            }
        }
    }
    // softmax over t, per query head
    for (int64_t h = 0; h < num_heads; ++h) {
        float* row = &scores[h * len];
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
    // out[h] = sum_t p[h, t] v_t
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int64_t b = 0; b < num_blocks; ++b) {
        const T* vblk = v_cache + int64_t(table[b]) * blk_stride;
        if (b + 1 < num_blocks) prefetch_block(v_cache + int64_t(table[b + 1]) * blk_stride, blk_stride * sizeof(T));
        const int64_t t0 = b * block_size, n = std::min(block_size, len - t0);
        for (int64_t j = 0; j < n; ++j) {
            for (int64_t kh = 0; kh < num_kv_heads; ++kh) {
                const float* vrow = as_float(vblk + j * tok_stride + kh * head_dim, row_buf.data(), head_dim);
                axpys(&scores[kh * group * len + t0 + j], len, vrow, group, head_dim, &acc[kh * group * head_dim]);
            }
        }
    }
    for (int64_t h = 0; h < num_heads; ++h) {
        T* orow = out + s * o_stride_tok + h * o_stride_head;
        for (int64_t i = 0; i < head_dim; ++i) orow[i] = static_cast<T>(acc[h * head_dim + i]);
    }
}

template <typename T>
void decode_kernel(T* out, const T* q, const T* k_cache, const T* v_cache, const int32_t* tables,
                   const int32_t* seq_lens, int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                   int64_t block_size, int64_t max_blocks, float scale, int64_t q_stride_tok, int64_t q_stride_head,
                   int64_t o_stride_tok, int64_t o_stride_head) {
    // One task per thread, sequences dealt longest first to the least loaded task (work ~ length).
    const int64_t num_tasks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), num_seqs));
    std::vector<int64_t> order(num_seqs);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return seq_lens[a] > seq_lens[b]; });
    std::vector<std::vector<int64_t>> tasks(num_tasks);
    std::vector<int64_t> load(num_tasks, 0);
    for (int64_t s : order) {
        const int64_t t = std::min_element(load.begin(), load.end()) - load.begin();
        tasks[t].push_back(s);
        load[t] += seq_lens[s] + 1;
    }
    at::parallel_for(0, num_tasks, 1, [&](int64_t begin, int64_t end) {
        std::vector<float> scores, qf(num_heads * head_dim), acc(num_heads * head_dim), row_buf(head_dim);
        for (int64_t task = begin; task < end; ++task) {
            for (int64_t s : tasks[task]) {
                decode_sequence<T>(s, out, q, k_cache, v_cache, tables + s * max_blocks, seq_lens[s], num_heads,
                                   num_kv_heads, head_dim, block_size, scale, q_stride_tok, q_stride_head, o_stride_tok,
                                   o_stride_head, scores, qf, acc, row_buf);
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
    AT_DISPATCH_SWITCH(q.scalar_type(), "paged_decode", AT_DISPATCH_CASE(at::kFloat, [&] {
                           run_decode<scalar_t>(out, q, k_cache, v_cache, block_tables, seq_lens, scale);
                       }) AT_DISPATCH_CASE(at::kHalf, [&] {
                           run_decode<scalar_t>(out, q, k_cache, v_cache, block_tables, seq_lens, scale);
                       }) AT_DISPATCH_CASE(at::kBFloat16, [&] {
                           run_decode<scalar_t>(out, q, k_cache, v_cache, block_tables, seq_lens, scale);
                       }));
}

}  // namespace

TORCH_LIBRARY(testbed_cpu, m) {
    m.def(
        "paged_decode(Tensor(a!) out, Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor seq_lens, float scale) -> ()");
    m.impl("paged_decode", c10::DispatchKey::CPU, TORCH_FN(paged_decode));
}

// Paged decode attention for the CPU: one query token per sequence, reading K/V straight from the
// block table (no gather copy), GQA-aware, fp32 accumulation. Parallel over sequences, balanced by length.
// The cache may hold a narrower dtype than the queries (kv_cache_dtype): rows are widened to fp32 as read.
// Also the KV write (a step's new keys/values into their slots), alone or fused in front of the decode.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "checks.h"
#include "ops.h"
#include "vec.h"

namespace testbed_cpu {
namespace {

// A cache row as fp32: itself for fp32 caches, else widened into `buf`; d % 8 == 0.
inline const float* as_float(const float* row, float*, int64_t) { return row; }
template <typename T>
inline const float* as_float(const T* row, float* buf, int64_t d) {
    for (int64_t i = 0; i < d; i += 8) *reinterpret_cast<v8f*>(buf + i) = load8_as_float(row + i);
    return buf;
}

// Prefetches for the next KV block, spread over the current block's inner steps: asked for all at once (one
// instruction per line at the block's start), they queued on the core's few line-fill buffers and stalled the
// arithmetic they were meant to overlap (the perf profile: results/kernels/README.md).
struct Prefetch {
    const char* next;
    int64_t lines, per_step, done = 0;
    Prefetch(const void* block, int64_t bytes, int64_t steps)
        : next(static_cast<const char*>(block)),
          lines(block ? (bytes + 63) / 64 : 0),
          per_step((lines + steps - 1) / std::max<int64_t>(1, steps)) {}
    inline void step() {
        for (int64_t i = 0; i < per_step && done < lines; ++i, ++done) __builtin_prefetch(next + 64 * done);
    }
};

// scores[g, 0..8) = q_g . k_j for G query heads of a group (q pre-scaled, rows d apart) and 8 key rows (d % 8
// == 0; rows past the tile's real ones repeat one, their scores land in padding). Each 8-float chunk of a key
// row is loaded once for all G heads; every score is its head's chain of multiply-adds over d in order, then
// hsum8x8's fixed tree: the same arithmetic whatever G and the tile.
template <int G>
FORCE_INLINE void dots8(const float* q, int64_t d, const float* const* k, float* scores, int64_t score_stride,
                        Prefetch& pf) {
    v8f acc[G][8];
    for (int g = 0; g < G; ++g) {
        const v8f q0 = load8(q + g * d);
        for (int j = 0; j < 8; ++j) acc[g][j] = q0 * load8(k[j]);
    }
    for (int64_t i = 8; i < d; i += 8) {
        pf.step();
        v8f qv[G];
        for (int g = 0; g < G; ++g) qv[g] = load8(q + g * d + i);
        for (int j = 0; j < 8; ++j) {
            const v8f kv = load8(k[j] + i);
            for (int g = 0; g < G; ++g) acc[g][j] = fma8(qv[g], kv, acc[g][j]);
        }
    }
    for (int g = 0; g < G; ++g) *reinterpret_cast<v8f*>(scores + g * score_stride) = hsum8x8(acc[g]);
}

// Query heads per dots8 call: G x 8 accumulators must fit the vector registers (32 with AVX-512, 16 without).
#if defined(__AVX512F__)
constexpr int kHeadsPerDots = 3;
#else
constexpr int kHeadsPerDots = 1;
#endif

// acc[g, 8 * NV floats] += sum over the block's n tokens j of p[g, j] * v_j for the G query heads of a KV
// head: the accumulators stay in registers for the whole block; every element still sums its tokens in order
// with one fused multiply-add each, so the result does not depend on the blocking.
template <int G, int NV, typename C>
FORCE_INLINE void weighted_rows(const float* p, int64_t p_stride, const C* v, int64_t tok_stride, int64_t n, float* acc,
                                int64_t acc_stride, Prefetch& pf) {
    v8f a[G][NV];
    for (int g = 0; g < G; ++g)
        for (int i = 0; i < NV; ++i) a[g][i] = load8(acc + g * acc_stride + 8 * i);
    for (int64_t j = 0; j < n; ++j) {
        pf.step();
        v8f vr[NV];
        for (int i = 0; i < NV; ++i) vr[i] = load8_as_float(v + j * tok_stride + 8 * i);
        for (int g = 0; g < G; ++g) {
            const v8f pg = splat8(p[g * p_stride + j]);
            for (int i = 0; i < NV; ++i) a[g][i] = fma8(pg, vr[i], a[g][i]);
        }
    }
    for (int g = 0; g < G; ++g)
        for (int i = 0; i < NV; ++i) *reinterpret_cast<v8f*>(acc + g * acc_stride + 8 * i) = a[g][i];
}

// One block's tokens into every query head's accumulator: the query heads of a KV head in sets of up to 4,
// head_dim in chunks of up to 32 floats (4 * 4 vectors of accumulators at most).
template <typename C>
FORCE_INLINE void weighted_block(const float* p, int64_t p_stride, const C* vblk, int64_t tok_stride, int64_t n,
                                 int64_t num_kv_heads, int64_t group, int64_t head_dim, float* acc, Prefetch& pf) {
    for (int64_t kh = 0; kh < num_kv_heads; ++kh) {
        for (int64_t g0 = 0; g0 < group; g0 += 4) {
            const int64_t h = kh * group + g0;
            with_count<4>(std::min<int64_t>(4, group - g0), [&](auto gs) {
                for (int64_t c = 0; c < head_dim; c += 32) {
                    with_count<4>(std::min<int64_t>(32, head_dim - c) / 8, [&](auto nv) {
                        weighted_rows<decltype(gs)::value, decltype(nv)::value>(p + h * p_stride, p_stride,
                                                                                vblk + kh * head_dim + c, tok_stride, n,
                                                                                acc + h * head_dim + c, head_dim, pf);
                    });
                }
            });
        }
    }
}

// row[0, len) <- softmax(row[0, len)); the row has room for len rounded up to 8.
inline void softmax_row(float* row, int64_t len) {
    const int64_t padded = (len + 7) & ~int64_t(7);
    for (int64_t t = len; t < padded; ++t) row[t] = -std::numeric_limits<float>::infinity();
    v8f mx = load8(row);
    for (int64_t t = 8; t < padded; t += 8) {
        const v8f r = load8(row + t);
        mx = r > mx ? r : mx;
    }
    float m = mx[0];
    for (int i = 1; i < 8; ++i) m = std::max(m, mx[i]);
    const v8f mv = splat8(m);
    v8f sum{};
    for (int64_t t = 0; t < padded; t += 8) {
        v8f e = exp8(load8(row + t) - mv);
        if (t + 8 > len)
            for (int64_t i = len - t; i < 8; ++i) e[i] = 0.f;
        *reinterpret_cast<v8f*>(row + t) = e;
        sum += e;
    }
    const v8f inv = splat8(1.f / hsum(sum));
    for (int64_t t = 0; t < padded; t += 8) *reinterpret_cast<v8f*>(row + t) = load8(row + t) * inv;
}

// One sequence, all heads: reads each of its KV blocks front to back once for K and once for V.
template <typename T, typename C>
void decode_sequence(int64_t s, T* out, const T* q, const C* k_cache, const C* v_cache, const int32_t* table,
                     int64_t len, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
                     float scale, int64_t q_stride_tok, int64_t q_stride_head, int64_t o_stride_tok,
                     int64_t o_stride_head, std::vector<float>& scores, std::vector<float>& qf, std::vector<float>& acc,
                     std::vector<float>& row_buf) {
    const int64_t group = num_heads / num_kv_heads;
    // cache layout [num_blocks, block_size, num_kv_heads, head_dim], contiguous
    const int64_t tok_stride = num_kv_heads * head_dim;
    const int64_t blk_stride = block_size * tok_stride;
    const int64_t num_blocks = (len + block_size - 1) / block_size;
    // a score row: padded to 8 for softmax_row, + 8 for dots8's stores past a row's last token
    const int64_t stride = ((len + 7) & ~int64_t(7)) + 8;
    scores.resize(num_heads * stride);
    row_buf.resize(8 * head_dim);
    for (int64_t h = 0; h < num_heads; ++h) {
        const T* qrow = q + s * q_stride_tok + h * q_stride_head;
        for (int64_t i = 0; i < head_dim; ++i) qf[h * head_dim + i] = to_float(qrow[i]) * scale;
    }
    auto next_block = [&](const C* cache, int64_t b) -> const C* {
        return b + 1 < num_blocks ? cache + int64_t(table[b + 1]) * blk_stride : nullptr;
    };
    // scores[h, t] = q_h . k_t (the query heads of a group share their KV head's row)
    const int64_t head_sets = (group + kHeadsPerDots - 1) / kHeadsPerDots;
    for (int64_t b = 0; b < num_blocks; ++b) {
        const C* kblk = k_cache + int64_t(table[b]) * blk_stride;
        const int64_t t0 = b * block_size, n = std::min(block_size, len - t0);
        Prefetch pf(next_block(k_cache, b), blk_stride * sizeof(C),
                    num_kv_heads * ((n + 7) / 8) * head_sets * (head_dim / 8 - 1));
        for (int64_t kh = 0; kh < num_kv_heads; ++kh) {
            for (int64_t j0 = 0; j0 < n; j0 += 8) {
                const int64_t m = std::min<int64_t>(8, n - j0);
                const float* rows[8];
                for (int64_t j = 0; j < 8; ++j)  // lanes past the block's last token repeat its first row
                    rows[j] = as_float(kblk + (j0 + (j < m ? j : 0)) * tok_stride + kh * head_dim,
                                       row_buf.data() + j * head_dim, head_dim);
                for (int64_t g0 = 0; g0 < group; g0 += kHeadsPerDots) {
                    const int64_t h = kh * group + g0;
                    with_count<kHeadsPerDots>(group - g0, [&](auto gs) {
                        dots8<decltype(gs)::value>(&qf[h * head_dim], head_dim, rows, &scores[h * stride + t0 + j0],
                                                   stride, pf);
                    });
                }
            }
        }
    }
    for (int64_t h = 0; h < num_heads; ++h) softmax_row(&scores[h * stride], len);
    // out[h] = sum_t p[h, t] v_t
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int64_t b = 0; b < num_blocks; ++b) {
        const C* vblk = v_cache + int64_t(table[b]) * blk_stride;
        const int64_t t0 = b * block_size, n = std::min(block_size, len - t0);
        Prefetch pf(next_block(v_cache, b), blk_stride * sizeof(C),
                    num_kv_heads * ((group + 3) / 4) * ((head_dim + 31) / 32) * n);
        weighted_block(&scores[t0], stride, vblk, tok_stride, n, num_kv_heads, group, head_dim, acc.data(), pf);
    }
    for (int64_t h = 0; h < num_heads; ++h) {
        T* orow = out + s * o_stride_tok + h * o_stride_head;
        for (int64_t i = 0; i < head_dim; ++i) orow[i] = static_cast<T>(acc[h * head_dim + i]);
    }
}

template <typename T, typename C>
void decode_kernel(T* out, const T* q, const C* k_cache, const C* v_cache, const int32_t* tables,
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
        std::vector<float> scores, qf(num_heads * head_dim), acc(num_heads * head_dim), row_buf;
        for (int64_t task = begin; task < end; ++task) {
            for (int64_t s : tasks[task]) {
                decode_sequence<T, C>(s, out, q, k_cache, v_cache, tables + s * max_blocks, seq_lens[s], num_heads,
                                      num_kv_heads, head_dim, block_size, scale, q_stride_tok, q_stride_head,
                                      o_stride_tok, o_stride_head, scores, qf, acc, row_buf);
            }
        }
    });
}

// new k/v rows [tokens, kv_heads, head_dim] (head_dim contiguous, any token/head stride) -> their cache slots;
// slot -1: padding, nothing written.
template <typename T, typename C>
void write_rows(const at::Tensor& k, const at::Tensor& v, at::Tensor& k_cache, at::Tensor& v_cache,
                const at::Tensor& slot_mapping) {
    const int64_t tokens = k.size(0), heads = k.size(1), d = k.size(2);
    const int64_t* slots = slot_mapping.data_ptr<int64_t>();
    const int64_t num_slots = k_cache.size(0) * k_cache.size(1);
    for (const at::Tensor* pair : {&k, &v}) {
        const T* src = pair->data_ptr<T>();
        C* dst = (pair == &k ? k_cache : v_cache).data_ptr<C>();
        const int64_t st = pair->stride(0), sh = pair->stride(1);
        for (int64_t t = 0; t < tokens; ++t) {
            const int64_t slot = slots[t];
            if (slot < 0) continue;
            TORCH_CHECK(slot < num_slots, "write_kv: slot ", slot, " outside the cache (", num_slots, " slots)");
            C* row = dst + slot * heads * d;
            for (int64_t h = 0; h < heads; ++h)
                for (int64_t i = 0; i < d; ++i) row[h * d + i] = static_cast<C>(to_float(src[t * st + h * sh + i]));
        }
    }
}

}  // namespace

void write_kv(const at::Tensor& k, const at::Tensor& v, at::Tensor& k_cache, at::Tensor& v_cache,
              const at::Tensor& slot_mapping) {
    check_cache(k_cache, v_cache, "write_kv");
    TORCH_CHECK(k.dim() == 3 && v.sizes() == k.sizes() && k.stride(2) == 1 && v.stride(2) == 1 &&
                    v.scalar_type() == k.scalar_type(),
                "write_kv: k and v must be [tokens, kv_heads, head_dim] of one dtype, head_dim contiguous");
    TORCH_CHECK(k.size(1) == k_cache.size(2) && k.size(2) == k_cache.size(3),
                "write_kv: k/v and cache shapes disagree");
    TORCH_CHECK(
        slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous() && slot_mapping.numel() == k.size(0),
        "write_kv: slot_mapping must be contiguous int64, one per token");
    dispatch_float(k.scalar_type(), "write_kv", [&](auto t) {
        dispatch_float(k_cache.scalar_type(), "write_kv",
                       [&](auto c) { write_rows<decltype(t), decltype(c)>(k, v, k_cache, v_cache, slot_mapping); });
    });
}

// out/q: [num_seqs, num_heads, head_dim] (last dim contiguous); caches: [num_blocks, block_size,
// num_kv_heads, head_dim] contiguous, in q's dtype or another float dtype; block_tables: [num_seqs, max_blocks]
// int32; seq_lens: [num_seqs] int32 (0: a padding row, its output is zeros).
void paged_decode(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                  const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale) {
    TORCH_CHECK(q.device().is_cpu(), "paged_decode: CPU tensors only");
    TORCH_CHECK(q.dim() == 3 && out.sizes() == q.sizes(), "paged_decode: q and out must be [seqs, heads, head_dim]");
    TORCH_CHECK(q.stride(2) == 1 && out.stride(2) == 1, "paged_decode: head_dim must be contiguous");
    check_cache(k_cache, v_cache, "paged_decode");
    TORCH_CHECK(q.scalar_type() == out.scalar_type(), "paged_decode: q and out must share a dtype");
    TORCH_CHECK(block_tables.scalar_type() == at::kInt && seq_lens.scalar_type() == at::kInt &&
                    block_tables.is_contiguous() && seq_lens.is_contiguous(),
                "paged_decode: block_tables and seq_lens must be contiguous int32");
    const int64_t num_seqs = q.size(0), num_heads = q.size(1), head_dim = q.size(2);
    const int64_t num_kv_heads = k_cache.size(2);
    TORCH_CHECK(k_cache.size(3) == head_dim && num_heads % num_kv_heads == 0, "paged_decode: head shapes disagree");
    TORCH_CHECK(head_dim % 8 == 0, "paged_decode: head_dim must be a multiple of 8, got ", head_dim);
    TORCH_CHECK(block_tables.size(0) == num_seqs && seq_lens.size(0) == num_seqs, "paged_decode: batch sizes disagree");
    dispatch_float(q.scalar_type(), "paged_decode", [&](auto t) {
        dispatch_float(k_cache.scalar_type(), "paged_decode", [&](auto c) {
            using T = decltype(t);
            using C = decltype(c);
            decode_kernel<T, C>(out.data_ptr<T>(), q.data_ptr<T>(), k_cache.data_ptr<C>(), v_cache.data_ptr<C>(),
                                block_tables.data_ptr<int32_t>(), seq_lens.data_ptr<int32_t>(), num_seqs, num_heads,
                                num_kv_heads, head_dim, k_cache.size(1), block_tables.size(1),
                                static_cast<float>(scale), q.stride(0), q.stride(1), out.stride(0), out.stride(1));
        });
    });
}

// A decode step's attention in one call: this step's k/v into the cache, then each sequence's query over it.
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& k_cache,
                            at::Tensor& v_cache, const at::Tensor& slot_mapping, const at::Tensor& block_tables,
                            const at::Tensor& seq_lens, double scale) {
    write_kv(k, v, k_cache, v_cache, slot_mapping);
    at::Tensor out = at::empty(q.sizes(), q.options());
    paged_decode(out, q, k_cache, v_cache, block_tables, seq_lens, scale);
    return out;
}

}  // namespace testbed_cpu

TORCH_LIBRARY(testbed_cpu, m) {
    m.def(
        "paged_decode(Tensor(a!) out, Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor seq_lens, float scale) -> ()");
    m.def("write_kv(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping) -> ()");
    m.def(
        "decode_attention(Tensor q, Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping, "
        "Tensor block_tables, Tensor seq_lens, float scale) -> Tensor");
    m.impl("paged_decode", c10::DispatchKey::CPU, TORCH_FN(testbed_cpu::paged_decode));
    m.impl("write_kv", c10::DispatchKey::CPU, TORCH_FN(testbed_cpu::write_kv));
    m.impl("decode_attention", c10::DispatchKey::CPU, TORCH_FN(testbed_cpu::decode_attention));
}

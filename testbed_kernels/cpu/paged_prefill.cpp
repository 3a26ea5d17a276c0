// Causal prefill attention for the CPU over the paged KV cache: each sequence's chunk of queries (the last
// q_len of its ctx_len tokens, so a chunk after a cached prefix too) against its keys and values, read
// through the block table (no gathered copy of the context), GQA-aware, fp32 accumulation. Follows
// FlashAttention-2 (Dao, 2023): keys in chunks with an online softmax, so scores never exist for a whole
// row, and keys past a tile's last query are skipped, not computed and masked (whole chunks, and within the
// diagonal chunk the key vectors and keys past the tile's last row). Where it departs from the
// paper (a GPU kernel): the loop is per KV head over its query heads (GQA shares each copied key chunk),
// keys are copied (and transposed) into fp32 scratch per chunk instead of staged in shared memory, and the
// running max is applied to every chunk (no skipped rescaling).
//
// Work item: one KV head x up to kQueryTile query positions of one chunk. Its rows are the query heads of
// that KV head at those positions, position-major, so a register tile of rows has nearly one causal limit.
// Per key chunk the item copies K transposed ([d][key]) and V ([key][d]) as fp32 (widening a narrower
// cache), then per register tile of kRows rows: scores by broadcast FMAs (no horizontal sums), online
// softmax, O += P V with O's tile in registers. Items are dealt to threads by cost, largest first.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "checks.h"
#include "ops.h"
#include "vec.h"

namespace testbed_cpu {
namespace {

#if defined(__AVX512F__)
constexpr int kLanes = 16;
constexpr int kRows = 6;  // 6 rows x 4 vectors of scores: 24 of the 32 registers
#else
constexpr int kLanes = 8;
constexpr int kRows = 2;  // 2 x 4 of the 16 registers
#endif
typedef float vf __attribute__((vector_size(kLanes * 4), aligned(4)));
typedef int32_t vi __attribute__((vector_size(kLanes * 4), aligned(4)));
constexpr int kKeyVecs = 4;
constexpr int kKeys = kKeyVecs * kLanes;  // keys per chunk
// Query positions per work item: each item copies its keys once per key chunk, so larger tiles copy less
// but leave fewer items to share out (128 was ahead of 64 and 32 at 256-1024-token prompts in one sweep on
// the noisy 2-core Xeon VM; not a tuned optimum).
constexpr int64_t kQueryTile = 128;

inline vf load_v(const float* p) { return *reinterpret_cast<const vf*>(p); }
inline void store_v(float* p, vf v) { *reinterpret_cast<vf*>(p) = v; }
inline vf splat(float x) {  // one broadcast (see vec.h's splat8)
#if defined(__AVX512F__)
    return (vf)_mm512_set1_ps(x);
#else
    return splat8(x);
#endif
}
inline float hmax_v(vf v) {
#if defined(__AVX512F__)
    return _mm512_reduce_max_ps((__m512)v);
#else
    float m = v[0];
    for (int i = 1; i < kLanes; ++i) m = std::max(m, v[i]);
    return m;
#endif
}
inline float hsum_v(vf v) {
    float s = 0.f;
    for (int i = 0; i < kLanes; ++i) s += v[i];
    return s;
}

inline vf exp_v(vf x) { return exp_lanes<vf, vi>(x); }

struct Chunk {
    int64_t seq, q_lo, q_len, ctx_len;
};
struct Item {
    int64_t chunk, kv_head, i0, i1, cost;
};

struct Scratch {
    std::vector<float> q, o, m, l, kt, v, p;  // l: kLanes partial sums per row
    std::vector<int64_t> pos;
};

template <typename T, typename C>
struct Prefill {
    T* out;
    const T* q;
    const C *k_cache, *v_cache;
    const int32_t* tables;
    int64_t max_blocks, num_kv_heads, group, d, dp, block_size;  // dp: d rounded up to whole vectors
    int64_t q_stride_tok, q_stride_head, o_stride_tok, o_stride_head;
    float scale;

    // Keys k0 .. k0 + n - 1 of a sequence's KV head into kt [d][kKeys] and v [kKeys][dp] (zero-padded).
    void load_keys(const int32_t* table, int64_t kv_head, int64_t k0, int64_t n, Scratch& s) const {
        const int64_t tok_stride = num_kv_heads * d;
        for (int64_t t = 0; t < kKeys; ++t) {
            float* vrow = &s.v[t * dp];
            if (t >= n) {
                for (int64_t x = 0; x < d; ++x) s.kt[x * kKeys + t] = 0.f;
                std::fill(vrow, vrow + dp, 0.f);
                continue;
            }
            const int64_t token = k0 + t;
            const int64_t row = (int64_t(table[token / block_size]) * block_size + token % block_size) * tok_stride;
            const C* krow = k_cache + row + kv_head * d;
            const C* vsrc = v_cache + row + kv_head * d;
            for (int64_t x = 0; x < d; ++x) s.kt[x * kKeys + t] = to_float(krow[x]);
            for (int64_t x = 0; x < d; ++x) vrow[x] = to_float(vsrc[x]);
            std::fill(vrow + d, vrow + dp, 0.f);
        }
    }

    // Rows r0 .. r0 + R - 1 against the loaded keys k0 .. k0 + n - 1 (n: as many as the last row sees): online
    // softmax, then O += P V.
    template <int R>
    void tile(int64_t r0, int64_t k0, int64_t n, Scratch& s) const {
        vf acc[R][kKeyVecs];
        for (int j = 0; j < R; ++j)
            for (int v = 0; v < kKeyVecs; ++v) acc[j][v] = vf{};
        const float* qr = &s.q[r0 * d];
        // only the key vectors holding keys 0 .. n - 1: past them the tile sees nothing (left 0, masked below)
        with_count<kKeyVecs>((n + kLanes - 1) / kLanes, [&](auto nkv_) {
            constexpr int NKV = decltype(nkv_)::value;
            for (int64_t x = 0; x < d; ++x) {
                vf kv[NKV];
                for (int v = 0; v < NKV; ++v) kv[v] = load_v(&s.kt[x * kKeys + v * kLanes]);
                for (int j = 0; j < R; ++j) {
                    const vf b = splat(qr[j * d + x]);
                    for (int v = 0; v < NKV; ++v) acc[j][v] = acc[j][v] + b * kv[v];
                }
            }
        });
        vi lane;
        for (int i = 0; i < kLanes; ++i) lane[i] = i;
        const float neg_inf = -std::numeric_limits<float>::infinity();
        for (int j = 0; j < R; ++j) {
            const int64_t r = r0 + j;
            float* p = &s.p[j * kKeys];
            // key k0 + v * kLanes + lane is visible to this row iff it is at or before the row's position
            const int32_t limit = static_cast<int32_t>(s.pos[r] - k0);
            const bool all_visible = limit >= kKeys - 1;
            vi visible[kKeyVecs];
            vf mx = splat(neg_inf);
            for (int v = 0; v < kKeyVecs; ++v) {
                if (!all_visible) {
                    visible[v] = (lane + v * kLanes) <= limit;
                    acc[j][v] = visible[v] ? acc[j][v] : splat(neg_inf);
                }
                mx = acc[j][v] > mx ? acc[j][v] : mx;
            }
            const float row_max = hmax_v(mx);
            if (row_max == neg_inf) {  // none of these keys is visible to this row
                std::fill(p, p + kKeys, 0.f);
                continue;
            }
            const float m_new = std::max(s.m[r], row_max);
            const float corr = std::exp(s.m[r] - m_new);  // 0 on the first chunk (m = -inf)
            vf sum{};
            for (int v = 0; v < kKeyVecs; ++v) {
                vf e = exp_v(acc[j][v] - m_new);
                if (!all_visible) e = visible[v] ? e : vf{};
                store_v(p + v * kLanes, e);
                sum += e;
            }
            store_v(&s.l[r * kLanes], load_v(&s.l[r * kLanes]) * corr + sum);
            s.m[r] = m_new;
            if (corr != 1.f) {
                float* o = &s.o[r * dp];
                for (int64_t x = 0; x < dp; x += kLanes) store_v(o + x, load_v(o + x) * corr);
            }
        }
        for (int64_t c0 = 0; c0 < dp; c0 += kKeyVecs * kLanes) {
            with_count<kKeyVecs>(std::min<int64_t>(kKeyVecs, (dp - c0) / kLanes), [&](auto nv_) {
                constexpr int NV = decltype(nv_)::value;
                vf o[R][NV];
                for (int j = 0; j < R; ++j)
                    for (int i = 0; i < NV; ++i) o[j][i] = load_v(&s.o[(r0 + j) * dp + c0 + i * kLanes]);
                for (int64_t t = 0; t < n; ++t) {
                    vf vv[NV];
                    for (int i = 0; i < NV; ++i) vv[i] = load_v(&s.v[t * dp + c0 + i * kLanes]);
                    for (int j = 0; j < R; ++j) {
                        const vf b = splat(s.p[j * kKeys + t]);
                        for (int i = 0; i < NV; ++i) o[j][i] = o[j][i] + b * vv[i];
                    }
                }
                for (int j = 0; j < R; ++j)
                    for (int i = 0; i < NV; ++i) store_v(&s.o[(r0 + j) * dp + c0 + i * kLanes], o[j][i]);
            });
        }
    }

    void run(const Chunk& c, const Item& it, Scratch& s) const {
        const int64_t off = c.ctx_len - c.q_len;  // position of the chunk's first query
        const int64_t rows = (it.i1 - it.i0) * group;
        s.q.resize(rows * d);
        s.o.assign(rows * dp, 0.f);
        s.m.assign(rows, -std::numeric_limits<float>::infinity());
        s.l.assign(rows * kLanes, 0.f);
        s.pos.resize(rows);
        s.kt.resize(d * kKeys);
        s.v.resize(kKeys * dp);
        s.p.resize(kRows * kKeys);
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t i = it.i0 + r / group, h = it.kv_head * group + r % group;
            const T* src = q + (c.q_lo + i) * q_stride_tok + h * q_stride_head;
            for (int64_t x = 0; x < d; ++x) s.q[r * d + x] = to_float(src[x]) * scale;
            s.pos[r] = off + i;
        }
        const int32_t* table = tables + c.seq * max_blocks;
        const int64_t last = off + it.i1 - 1;  // the furthest key any row sees
        for (int64_t k0 = 0; k0 <= last; k0 += kKeys) {
            const int64_t n = std::min<int64_t>(kKeys, last + 1 - k0);
            load_keys(table, it.kv_head, k0, n, s);
            for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
                const int64_t nr = std::min<int64_t>(kRows, rows - r0);
                // positions grow with r: the tile's last row sees the most keys, maybe none, maybe not all n
                const int64_t seen = std::min(n, s.pos[r0 + nr - 1] - k0 + 1);
                if (seen <= 0) continue;
                with_count<kRows>(nr, [&](auto r_) { tile<decltype(r_)::value>(r0, k0, seen, s); });
            }
        }
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t i = it.i0 + r / group, h = it.kv_head * group + r % group;
            T* dst = out + (c.q_lo + i) * o_stride_tok + h * o_stride_head;
            const float inv = 1.f / hsum_v(load_v(&s.l[r * kLanes]));
            for (int64_t x = 0; x < d; ++x) dst[x] = static_cast<T>(s.o[r * dp + x] * inv);
        }
    }
};

template <typename T, typename C>
void prefill_kernel(const Prefill<T, C>& job, const std::vector<Chunk>& chunks) {
    std::vector<Item> items;
    for (int64_t c = 0; c < static_cast<int64_t>(chunks.size()); ++c) {
        const Chunk& ch = chunks[c];
        for (int64_t kh = 0; kh < job.num_kv_heads; ++kh)
            for (int64_t i0 = 0; i0 < ch.q_len; i0 += kQueryTile) {
                const int64_t i1 = std::min(ch.q_len, i0 + kQueryTile);
                // rows x keys of the furthest row, less the causal triangle's half
                const int64_t cost = (i1 - i0) * (ch.ctx_len - ch.q_len + (i0 + i1) / 2 + 1);
                items.push_back({c, kh, i0, i1, cost});
            }
    }
    const int64_t num_items = static_cast<int64_t>(items.size());
    const int64_t num_tasks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), num_items));
    std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.cost > b.cost; });
    std::vector<std::vector<int64_t>> tasks(num_tasks);
    std::vector<int64_t> load(num_tasks, 0);
    for (int64_t i = 0; i < num_items; ++i) {
        const int64_t t = std::min_element(load.begin(), load.end()) - load.begin();
        tasks[t].push_back(i);
        load[t] += items[i].cost;
    }
    at::parallel_for(0, num_tasks, 1, [&](int64_t begin, int64_t end) {
        Scratch scratch;
        for (int64_t task = begin; task < end; ++task)
            for (int64_t i : tasks[task]) job.run(chunks[items[i].chunk], items[i], scratch);
    });
}

}  // namespace

// out/q: [tokens, num_heads, head_dim] (head_dim contiguous); caches: [num_blocks, block_size, num_kv_heads,
// head_dim] contiguous, in q's dtype or another float dtype; block_tables: [num_seqs, max_blocks] int32;
// chunks: [num_chunks, 4] int64 rows (sequence, first query row, query rows, context length): the chunk's
// queries are the last of the context's tokens, all already in the cache. Rows of q outside every chunk are
// left as they are in out.
void paged_prefill(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                   const at::Tensor& block_tables, const at::Tensor& chunks, double scale) {
    TORCH_CHECK(q.device().is_cpu(), "paged_prefill: CPU tensors only");
    TORCH_CHECK(q.dim() == 3 && out.sizes() == q.sizes(), "paged_prefill: q and out must be [tokens, heads, head_dim]");
    TORCH_CHECK(q.stride(2) == 1 && out.stride(2) == 1, "paged_prefill: head_dim must be contiguous");
    check_cache(k_cache, v_cache, "paged_prefill");
    TORCH_CHECK(q.scalar_type() == out.scalar_type(), "paged_prefill: q and out must share a dtype");
    TORCH_CHECK(block_tables.scalar_type() == at::kInt && block_tables.is_contiguous() && block_tables.dim() == 2,
                "paged_prefill: block_tables must be contiguous [seqs, max_blocks] int32");
    TORCH_CHECK(chunks.scalar_type() == at::kLong && chunks.is_contiguous() && chunks.dim() == 2 && chunks.size(1) == 4,
                "paged_prefill: chunks must be contiguous [chunks, 4] int64");
    const int64_t num_heads = q.size(1), head_dim = q.size(2), num_kv_heads = k_cache.size(2);
    TORCH_CHECK(k_cache.size(3) == head_dim && num_heads % num_kv_heads == 0, "paged_prefill: head shapes disagree");
    const int64_t block_size = k_cache.size(1), max_blocks = block_tables.size(1);
    std::vector<Chunk> list;
    const int64_t* c = chunks.data_ptr<int64_t>();
    for (int64_t i = 0; i < chunks.size(0); ++i, c += 4) {
        const Chunk ch{c[0], c[1], c[2], c[3]};
        TORCH_CHECK(ch.seq >= 0 && ch.seq < block_tables.size(0), "paged_prefill: chunk ", i, " names sequence ",
                    ch.seq, " of ", block_tables.size(0));
        TORCH_CHECK(ch.q_len >= 0 && ch.q_lo >= 0 && ch.q_lo + ch.q_len <= q.size(0) && ch.q_len <= ch.ctx_len &&
                        ch.ctx_len <= max_blocks * block_size,
                    "paged_prefill: chunk ", i, " (rows ", ch.q_lo, " + ", ch.q_len, ", context ", ch.ctx_len,
                    ") does not fit q or its block table");
        if (ch.q_len > 0) list.push_back(ch);
    }
    dispatch_float(q.scalar_type(), "paged_prefill", [&](auto t) {
        dispatch_float(k_cache.scalar_type(), "paged_prefill", [&](auto cache) {
            using T = decltype(t);
            using C = decltype(cache);
            const Prefill<T, C> job{out.data_ptr<T>(),
                                    q.data_ptr<T>(),
                                    k_cache.data_ptr<C>(),
                                    v_cache.data_ptr<C>(),
                                    block_tables.data_ptr<int32_t>(),
                                    max_blocks,
                                    num_kv_heads,
                                    num_heads / num_kv_heads,
                                    head_dim,
                                    (head_dim + kLanes - 1) / kLanes * kLanes,
                                    block_size,
                                    q.stride(0),
                                    q.stride(1),
                                    out.stride(0),
                                    out.stride(1),
                                    static_cast<float>(scale)};
            prefill_kernel(job, list);
        });
    });
}

}  // namespace testbed_cpu

TORCH_LIBRARY_FRAGMENT(testbed_cpu, m) {
    m.def(
        "paged_prefill(Tensor(a!) out, Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor chunks, "
        "float scale) -> ()");
    m.impl("paged_prefill", c10::DispatchKey::CPU, TORCH_FN(testbed_cpu::paged_prefill));
}

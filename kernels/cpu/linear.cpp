// Linear layers with few rows (decode steps, the LM head): y = x w^T (+ bias), x [M, K], w [N, K] as stored.
//
// With a handful of rows a linear layer only streams its weights from memory once; a general GEMM library
// packs panels first and, for M of 2..16, measured ~1.3-1.7x more CPU time than this kernel on the 2-core
// EPYC it was written on (results/throughput/). Each weight row is read once into registers and dotted with
// every x row: a tile of 4 x rows by NR weight rows keeps 4 * NR accumulators in registers, and the NR weight
// rows (K floats each) stay in L1 while the x rows stream past. Parallel over weight rows. With AVX-512 the
// vectors are 16 floats and NR is 6 (24 of the 32 registers hold accumulators); otherwise 8 floats and NR 3.
// While a tile computes, the next tile's weights are prefetched into L2: without it a layer's time at 8-32
// rows was its weights' memory time plus its arithmetic, one after the other (A/B: results/kernels/cpu_kernels.md).
//
// Every output element is the same sequence of fused multiply-adds over k followed by the same horizontal
// sum, whatever M is and wherever the row sits in a tile: results are batch invariant.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "ops.h"
#include "vec.h"

namespace testbed_cpu {
namespace {

#if defined(__AVX512F__)
typedef float vec_t __attribute__((vector_size(64), aligned(4)));
constexpr int kLanes = 16;
constexpr int kColTile = 6;  // weight rows per tile
inline vec_t fma_v(vec_t a, vec_t b, vec_t acc) { return (vec_t)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)acc); }
// lanes i and i + 8 first, then vec.h's fixed order over the 8 sums
inline float hsum_v(vec_t v) {
    const __m512 z = (__m512)v;
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(z), 1));
    return hsum((v8f)_mm256_add_ps(_mm512_castps512_ps256(z), hi));
}
#else
typedef v8f vec_t;
constexpr int kLanes = 8;
constexpr int kColTile = 3;
inline vec_t fma_v(vec_t a, vec_t b, vec_t acc) { return fma8(a, b, acc); }
inline float hsum_v(vec_t v) { return hsum(v); }
#endif
constexpr int kRowTile = 4;  // x rows per tile
// How far ahead (in tiles) column_tile asks for weights: 1, or 0 (no prefetch) when the environment sets
// TESTBED_CPU_LINEAR_PREFETCH=0, for benchmarks.cpu_kernels' A/B.
inline int64_t prefetch_tiles() {
    static const int64_t tiles = [] {
        const char* v = std::getenv("TESTBED_CPU_LINEAR_PREFETCH");
        return (v != nullptr && std::string(v) == "0") ? int64_t(0) : int64_t(1);
    }();
    return tiles;
}

inline vec_t load_v(const float* p) { return *reinterpret_cast<const vec_t*>(p); }

// pf: lines [pf_lo, pf_hi) of the next weights to ask for (into L2) while this tile computes, spread over its
// k steps (see column_tile).
template <int MR, int NR>
inline void dot_tile(const float* x, int64_t ldx, const float* w, int64_t K, float* y, int64_t ldy, const char* pf,
                     int64_t pf_lo, int64_t pf_hi) {
    vec_t acc[MR][NR];
    for (int m = 0; m < MR; ++m)
        for (int j = 0; j < NR; ++j) acc[m][j] = vec_t{};
    const int64_t kv = K - K % kLanes;
    const int64_t steps = std::max<int64_t>(1, kv / kLanes);
    const int64_t per_step = (pf_hi - pf_lo + steps - 1) / steps;
    int64_t line = pf_lo;
    for (int64_t k = 0; k < kv; k += kLanes) {
        for (int64_t i = 0; i < per_step && line < pf_hi; ++i, ++line) __builtin_prefetch(pf + 64 * line, 0, 2);
        vec_t wv[NR];
        for (int j = 0; j < NR; ++j) wv[j] = load_v(w + j * K + k);
        for (int m = 0; m < MR; ++m) {
            const vec_t xv = load_v(x + m * ldx + k);
            for (int j = 0; j < NR; ++j) acc[m][j] = fma_v(xv, wv[j], acc[m][j]);
        }
    }
    for (int m = 0; m < MR; ++m) {
        for (int j = 0; j < NR; ++j) {
            float s = hsum_v(acc[m][j]);
            for (int64_t k = kv; k < K; ++k) s = std::fma(x[m * ldx + k], w[j * K + k], s);  // fused in every tile
            y[m * ldy + j] = s;
        }
    }
}

// All M rows against NR weight rows starting at column n. The passes over the rows read this tile's weights
// from L1 after the first pass; meanwhile the next tile's weights are requested, spread over
// the passes, so that streaming the weights from memory overlaps the arithmetic instead of following it.
template <int NR>
inline void column_tile(const float* x, int64_t M, int64_t K, const float* w, float* y, int64_t N, int64_t n,
                        int64_t n_end) {
    const int64_t tiles_ahead = prefetch_tiles();
    const int64_t lo = std::min(n + tiles_ahead * NR, n_end);
    const int64_t ahead = tiles_ahead == 0 ? lo : std::min(n + (tiles_ahead + 1) * NR, n_end);
    const char* pf = reinterpret_cast<const char*>(w + lo * K);
    const int64_t lines = (ahead - lo) * K * int64_t(sizeof(float)) / 64;
    const int64_t passes = (M + kRowTile - 1) / kRowTile;
    int64_t m = 0, pass = 0;
    auto tile = [&](auto mr) {
        const int64_t pf_lo = lines * pass / passes, pf_hi = lines * (pass + 1) / passes;
        dot_tile<decltype(mr)::value, NR>(x + m * K, K, w + n * K, K, y + m * N + n, N, pf, pf_lo, pf_hi);
        m += decltype(mr)::value;
        ++pass;
    };
    while (m + kRowTile <= M) tile(std::integral_constant<int, kRowTile>{});
    switch (M - m) {
        case 3:
            tile(std::integral_constant<int, 3>{});
            break;
        case 2:
            tile(std::integral_constant<int, 2>{});
            break;
        case 1:
            tile(std::integral_constant<int, 1>{});
            break;
        default:
            break;
    }
}

}  // namespace

at::Tensor linear_rows(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
    TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu(), "linear_rows: CPU tensors only");
    TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat, "linear_rows: float32 only");
    TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && weight.dim() == 2 && weight.is_contiguous(),
                "linear_rows: x [M, K] and weight [N, K] must be contiguous");
    const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
    TORCH_CHECK(weight.size(1) == K, "linear_rows: x has ", K, " columns, weight ", weight.size(1));
    at::Tensor y = at::empty({M, N}, x.options());
    const float* xp = x.data_ptr<float>();
    const float* wp = weight.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    const int64_t tiles = N / kColTile;
    // ~64 KiB of weights per task at least: small layers stay on one thread
    const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 14) / std::max<int64_t>(1, kColTile * K));
    at::parallel_for(0, tiles, grain, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) column_tile<kColTile>(xp, M, K, wp, yp, N, t * kColTile, end * kColTile);
    });
    for (int64_t n = tiles * kColTile; n < N; ++n) column_tile<1>(xp, M, K, wp, yp, N, n, N);
    if (bias.has_value() && bias->defined()) {
        TORCH_CHECK(bias->numel() == N && bias->scalar_type() == at::kFloat, "linear_rows: bias must be [N] float32");
        y.add_(bias->view({1, N}));
    }
    return y;
}

}  // namespace testbed_cpu

TORCH_LIBRARY_FRAGMENT(testbed_cpu, m) {
    m.def("linear_rows(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
    m.impl("linear_rows", c10::DispatchKey::CPU, TORCH_FN(testbed_cpu::linear_rows));
}

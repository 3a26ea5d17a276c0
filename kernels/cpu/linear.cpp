// Linear layers with few rows (decode steps, the LM head): y = x w^T (+ bias), x [M, K], w [N, K] as stored.
//
// With a handful of rows a linear layer only streams its weights from memory once; a general GEMM library
// packs panels first and, for M of 2..16, measured ~1.3-1.7x more CPU time than this kernel on the 2-core
// EPYC it was written on (results/throughput/). Each weight row is read once into registers and dotted with
// every x row: a tile of 4 x rows by NR weight rows keeps 4 * NR accumulators in registers, and the NR weight
// rows (K floats each) stay in L1 while the x rows stream past. Parallel over weight rows. With AVX-512 the
// vectors are 16 floats and NR is 6 (24 of the 32 registers hold accumulators); otherwise 8 floats and NR 3.
//
// Every output element is the same sequence of fused multiply-adds over k followed by the same horizontal
// sum, whatever M is and wherever the row sits in a tile: results are batch invariant.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>

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

inline vec_t load_v(const float* p) { return *reinterpret_cast<const vec_t*>(p); }

template <int MR, int NR>
inline void dot_tile(const float* x, int64_t ldx, const float* w, int64_t K, float* y, int64_t ldy) {
    vec_t acc[MR][NR];
    for (int m = 0; m < MR; ++m)
        for (int j = 0; j < NR; ++j) acc[m][j] = vec_t{};
    const int64_t kv = K - K % kLanes;
    for (int64_t k = 0; k < kv; k += kLanes) {
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

// All M rows against NR weight rows starting at column n.
template <int NR>
inline void column_tile(const float* x, int64_t M, int64_t K, const float* w, float* y, int64_t N, int64_t n) {
    int64_t m = 0;
    for (; m + kRowTile <= M; m += kRowTile) dot_tile<kRowTile, NR>(x + m * K, K, w + n * K, K, y + m * N + n, N);
    switch (M - m) {
        case 3:
            dot_tile<3, NR>(x + m * K, K, w + n * K, K, y + m * N + n, N);
            break;
        case 2:
            dot_tile<2, NR>(x + m * K, K, w + n * K, K, y + m * N + n, N);
            break;
        case 1:
            dot_tile<1, NR>(x + m * K, K, w + n * K, K, y + m * N + n, N);
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
        for (int64_t t = begin; t < end; ++t) column_tile<kColTile>(xp, M, K, wp, yp, N, t * kColTile);
    });
    for (int64_t n = tiles * kColTile; n < N; ++n) column_tile<1>(xp, M, K, wp, yp, N, n);
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

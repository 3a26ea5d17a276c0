// Linear layers with few rows (decode steps, the LM head): y = x w^T (+ bias), x [M, K], with w [N, K] packed
// once (pack_linear) into column panels [N / P][K][P]: panel p holds output columns p*P .. p*P+P-1, k-major.
//
// The packed layout lets the inner loop be the register-blocked micro-kernel of Goto & van de Geijn ("Anatomy
// of high-performance matrix multiplication", TOMS 2008) and of BLIS: for each k, P weights are two vector
// loads, each of MR x rows is one broadcast, and MR x 2 vector accumulators take one fused multiply-add each,
// with no horizontal sums. With AVX-512, P = 32 and MR = 12 (24 of the 32 registers hold accumulators);
// otherwise P = 16 and MR = 6 (12 of 16). Where it departs from a BLAS GEMM: x is not packed and there is no
// blocking over k or over rows beyond MR, since with few rows the weights are the only large operand and are
// read once; instead, while a panel computes its passes over the rows, the next panel is prefetched into L2
// (a layer's time at 8-32 rows was otherwise its weights' memory time plus its arithmetic, one after the other).
// Parallel over panels. For many rows (prefill) torch's GEMM on the plain weights is faster: testbed_kernels.cpu.linear
// sends only up to FEW_ROWS rows here (same-run A/B: results/kernels/cpu_kernels.md).
//
// Every output element is one chain of fused multiply-adds over k in order, whatever M is and wherever its row
// sits in a tile: results are batch invariant.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "checks.h"
#include "ops.h"
#include "vec.h"

namespace testbed_cpu {
namespace {

// vec_t: registers (naturally aligned: an under-aligned accumulator array slowed the 12-row tile, see
// results/kernels/README.md); loads and stores of rows go through unaligned_t.
#if defined(__AVX512F__)
typedef float vec_t __attribute__((vector_size(64)));
typedef float unaligned_t __attribute__((vector_size(64), aligned(4)));
constexpr int kLanes = 16;
constexpr int kRowTile = 12;
inline vec_t fma_v(vec_t a, vec_t b, vec_t acc) { return (vec_t)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)acc); }
#else
typedef float vec_t __attribute__((vector_size(32)));
typedef v8f unaligned_t;
constexpr int kLanes = 8;
constexpr int kRowTile = 6;
inline vec_t fma_v(vec_t a, vec_t b, vec_t acc) { return (vec_t)fma8((v8f)a, (v8f)b, (v8f)acc); }
#endif
constexpr int kPanel = 2 * kLanes;  // output columns per panel

inline vec_t load_v(const float* p) { return *reinterpret_cast<const unaligned_t*>(p); }
inline vec_t broadcast_v(float s) {
#if defined(__AVX512F__)
    return (vec_t)_mm512_set1_ps(s);
#elif defined(__AVX__)
    return (vec_t)_mm256_set1_ps(s);
#else
    return vec_t{s, s, s, s, s, s, s, s};
#endif
}

// Whether a panel asks for the next one's weights while it computes: off when the environment sets
// TESTBED_CPU_LINEAR_PREFETCH=0, for benchmarks.cpu_kernels' A/B.
inline bool prefetch_on() {
    static const bool on = [] {
        const char* v = std::getenv("TESTBED_CPU_LINEAR_PREFETCH");
        return !(v != nullptr && std::string(v) == "0");
    }();
    return on;
}

// MR rows of x against one panel; `cols` (<= kPanel) of its columns are real, the rest zero padding.
// pf: lines [0, pf_lines) to ask for (into L2) while this tile computes, spread over its k steps.
template <int MR>
inline void panel_tile(const float* x, int64_t K, const float* panel, float* y, int64_t ldy, int64_t cols,
                       const char* pf, int64_t pf_lines) {
    vec_t acc[MR][2];
    for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = vec_t{};
    const int64_t per_k = (pf_lines + K - 1) / K;
    int64_t line = 0;
    for (int64_t k = 0; k < K; ++k) {
        for (int64_t i = 0; i < per_k && line < pf_lines; ++i, ++line) __builtin_prefetch(pf + 64 * line, 0, 2);
        const vec_t w0 = load_v(panel + k * kPanel), w1 = load_v(panel + k * kPanel + kLanes);
        for (int m = 0; m < MR; ++m) {
            const vec_t xv = broadcast_v(x[m * K + k]);
            acc[m][0] = fma_v(xv, w0, acc[m][0]);
            acc[m][1] = fma_v(xv, w1, acc[m][1]);
        }
    }
    for (int m = 0; m < MR; ++m) {
        if (cols == kPanel) {
            *reinterpret_cast<unaligned_t*>(y + m * ldy) = acc[m][0];
            *reinterpret_cast<unaligned_t*>(y + m * ldy + kLanes) = acc[m][1];
        } else {
            float row[kPanel];
            *reinterpret_cast<unaligned_t*>(row) = acc[m][0];
            *reinterpret_cast<unaligned_t*>(row + kLanes) = acc[m][1];
            std::copy(row, row + cols, y + m * ldy);
        }
    }
}

// All M rows against panel p; the next panel (if this thread computes it) is prefetched over the passes.
inline void one_panel(const float* x, int64_t M, int64_t K, const float* packed, float* y, int64_t N, int64_t p,
                      bool prefetch_next) {
    const float* panel = packed + p * K * kPanel;
    const char* next = reinterpret_cast<const char*>(panel + K * kPanel);
    const int64_t lines = prefetch_next ? K * kPanel * int64_t(sizeof(float)) / 64 : 0;
    const int64_t cols = std::min<int64_t>(kPanel, N - p * kPanel);
    const int64_t passes = (M + kRowTile - 1) / kRowTile;
    for (int64_t m = 0, pass = 0; m < M; m += kRowTile, ++pass) {
        const int64_t lo = lines * pass / passes, hi = lines * (pass + 1) / passes;
        with_count<kRowTile>(M - m, [&](auto mr) {
            panel_tile<decltype(mr)::value>(x + m * K, K, panel, y + m * N + p * kPanel, N, cols, next + 64 * lo,
                                            hi - lo);
        });
    }
}

}  // namespace

at::Tensor pack_linear(const at::Tensor& weight) {
    TORCH_CHECK(weight.device().is_cpu() && weight.scalar_type() == at::kFloat && weight.dim() == 2,
                "pack_linear: weight must be a float32 [N, K] CPU tensor");
    const int64_t N = weight.size(0), K = weight.size(1), panels = (N + kPanel - 1) / kPanel;
    at::Tensor padded = weight;
    if (N % kPanel != 0) padded = at::cat({weight, at::zeros({panels * kPanel - N, K}, weight.options())});
    return padded.reshape({panels, kPanel, K}).transpose(1, 2).contiguous();
}

at::Tensor linear_packed(const at::Tensor& x, const at::Tensor& packed, int64_t N,
                         const c10::optional<at::Tensor>& bias) {
    TORCH_CHECK(x.device().is_cpu() && packed.device().is_cpu(), "linear_packed: CPU tensors only");
    TORCH_CHECK(x.scalar_type() == at::kFloat && packed.scalar_type() == at::kFloat, "linear_packed: float32 only");
    TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "linear_packed: x must be a contiguous [M, K]");
    const int64_t M = x.size(0), K = x.size(1), panels = (N + kPanel - 1) / kPanel;
    TORCH_CHECK(packed.dim() == 3 && packed.is_contiguous() && packed.size(0) == panels && packed.size(2) == kPanel,
                "linear_packed: weights must come from pack_linear of an [", N, ", K] weight");
    TORCH_CHECK(packed.size(1) == K, "linear_packed: x has ", K, " columns, weight ", packed.size(1));
    at::Tensor y = at::empty({M, N}, x.options());
    if (M == 0) return y;
    const float* xp = x.data_ptr<float>();
    const float* wp = packed.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    const bool prefetch = prefetch_on();
    // ~64 KiB of weights per task at least: small layers stay on one thread
    const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 14) / std::max<int64_t>(1, kPanel * K));
    at::parallel_for(0, panels, grain, [&](int64_t begin, int64_t end) {
        for (int64_t p = begin; p < end; ++p) one_panel(xp, M, K, wp, yp, N, p, prefetch && p + 1 < end);
    });
    if (bias.has_value() && bias->defined()) {
        TORCH_CHECK(bias->numel() == N && bias->scalar_type() == at::kFloat, "linear_packed: bias must be [N] float32");
        y.add_(bias->view({1, N}));
    }
    return y;
}

}  // namespace testbed_cpu

TORCH_LIBRARY_FRAGMENT(testbed_cpu, m) {
    m.def("pack_linear(Tensor weight) -> Tensor");
    m.impl("pack_linear", c10::DispatchKey::CPU, TORCH_FN(testbed_cpu::pack_linear));
    m.def("linear_packed(Tensor x, Tensor packed, int N, Tensor? bias) -> Tensor");
    m.impl("linear_packed", c10::DispatchKey::CPU, TORCH_FN(testbed_cpu::linear_packed));
}

// Fused per-token layer ops for the CPU (RMSNorm, rotary, SiLU-and-mul): one pass over memory where the torch
// reference makes several. Same math as testbed_kernels/reference.py (fp32 inside, results in the input dtype).
// Parallel over tokens.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <tuple>
#include <type_traits>
#include <vector>

#include "ops.h"
#include "vec.h"

namespace testbed_cpu {
namespace {

// Rows per parallel task: enough work per task that small (decode) batches stay on one thread.
int64_t grain(int64_t row_elems) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, row_elems)); }

// sum of x_i^2 in fp32: in 8 lanes, each a chain over its elements in order, then hsum's fixed tree (one
// sequential chain was bound by the add latency, ~4 cycles per element); double stays scalar.
template <typename T>
float sum_squares(const T* x, int64_t n) {
    int64_t i = 0;
    float ss = 0.f;
    if constexpr (!std::is_same_v<T, double>) {
        v8f lanes{};
        for (; i + 8 <= n; i += 8) {
            const v8f f = load8_as_float(x + i);
            lanes = fma8(f, f, lanes);
        }
        ss = hsum(lanes);
    }
    for (; i < n; ++i) {
        const float f = static_cast<float>(x[i]);
        ss += f * f;
    }
    return ss;
}

template <typename T>
void rms_norm_rows(T* out, T* residual_out, const T* x, const T* residual, const T* weight, int64_t rows,
                   int64_t hidden, float eps) {
    at::parallel_for(0, rows, grain(hidden), [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
            const T* xr = x + r * hidden;
            T* outr = out + r * hidden;
            if (residual != nullptr) {  // x + residual, rounded to T as the reference does
                const T* rr = residual + r * hidden;
                T* ro = residual_out + r * hidden;
                for (int64_t i = 0; i < hidden; ++i)
                    ro[i] = static_cast<T>(static_cast<float>(xr[i]) + static_cast<float>(rr[i]));
                xr = ro;
            }
            const float ss = sum_squares(xr, hidden);
            const float inv = 1.f / std::sqrt(ss / static_cast<float>(hidden) + eps);
            for (int64_t i = 0; i < hidden; ++i) {
                const T normed = static_cast<T>(static_cast<float>(xr[i]) * inv);
                outr[i] = static_cast<T>(static_cast<float>(normed) * static_cast<float>(weight[i]));
            }
        }
    });
}

// Neox-style rotary on [tokens, heads, head_dim] rows (head_dim contiguous), out of place.
template <typename T>
void rotary_rows(T* out, const T* x, const int64_t* positions, const T* cos_sin, int64_t tokens, int64_t heads,
                 int64_t head_dim, int64_t x_stride_tok, int64_t x_stride_head) {
    const int64_t half = head_dim / 2;
    at::parallel_for(0, tokens, grain(heads * head_dim), [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
            const T* cs = cos_sin + positions[t] * head_dim;
            for (int64_t h = 0; h < heads; ++h) {
                const T* xr = x + t * x_stride_tok + h * x_stride_head;
                T* o = out + (t * heads + h) * head_dim;
                for (int64_t i = 0; i < half; ++i) {
                    const float c = static_cast<float>(cs[i]), s = static_cast<float>(cs[half + i]);
                    const float x1 = static_cast<float>(xr[i]), x2 = static_cast<float>(xr[half + i]);
                    o[i] = static_cast<T>(x1 * c - x2 * s);
                    o[half + i] = static_cast<T>(x2 * c + x1 * s);
                }
            }
        }
    });
}

// out[r] = silu(gate) * up for rows x[r] = (gate | up), gate and up d wide each; silu(g) = g / (1 + e^-g),
// rounded to T before the product as the reference rounds it. fp32 rows 16 lanes at a time with AVX-512, else
// 8 (vec.h's exp_lanes).
template <typename T>
void silu_and_mul_rows(T* out, const T* x, int64_t rows, int64_t d) {
    at::parallel_for(0, rows, grain(2 * d), [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
            const T* gate = x + r * 2 * d;
            const T* up = gate + d;
            T* o = out + r * d;
            int64_t i = 0;
            if constexpr (std::is_same_v<T, float>) {
#if defined(__AVX512F__)
                // 16 lanes: the same operations per lane as below, so the same results, at half the instructions
                for (; i + 16 <= d; i += 16) {
                    const v16f g = load16(gate + i);
                    *reinterpret_cast<v16f*>(o + i) = g / (1.f + exp_lanes<v16f, v16i>(-g)) * load16(up + i);
                }
#endif
                const v8f one = v8f{} + 1.f;
                for (; i + 8 <= d; i += 8) {
                    const v8f g = load8(gate + i);
                    *reinterpret_cast<v8f*>(o + i) = g / (one + exp8(-g)) * load8(up + i);
                }
            }
            for (; i < d; ++i) {
                const float g = static_cast<float>(gate[i]);
                const T act = static_cast<T>(g / (1.f + std::exp(-g)));
                o[i] = static_cast<T>(static_cast<float>(act) * static_cast<float>(up[i]));
            }
        }
    });
}

void check_rows(const at::Tensor& t, const char* what) {
    TORCH_CHECK(t.device().is_cpu() && t.is_contiguous(), what, ": contiguous CPU tensors only");
}

at::Tensor rotate(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos_sin) {
    TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1, "rotary: q/k must be [tokens, heads, head_dim], head_dim contiguous");
    TORCH_CHECK(cos_sin.scalar_type() == x.scalar_type() && cos_sin.size(1) == x.size(2) && x.size(2) % 2 == 0,
                "rotary: cos_sin cache must be [max_pos, head_dim] in q/k's dtype");
    TORCH_CHECK(positions.numel() == x.size(0), "rotary: one position per token");
    at::Tensor out = at::empty(x.sizes(), x.options());
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "rotary", [&] {
        rotary_rows<scalar_t>(out.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), positions.data_ptr<int64_t>(),
                              cos_sin.data_ptr<scalar_t>(), x.size(0), x.size(1), x.size(2), x.stride(0), x.stride(1));
    });
    return out;
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
    check_rows(x, "rms_norm");
    const int64_t hidden = x.size(-1);
    TORCH_CHECK(weight.numel() == hidden && weight.scalar_type() == x.scalar_type(), "rms_norm: weight mismatch");
    at::Tensor out = at::empty_like(x);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "rms_norm", [&] {
        rms_norm_rows<scalar_t>(out.data_ptr<scalar_t>(), nullptr, x.data_ptr<scalar_t>(), nullptr,
                                weight.contiguous().data_ptr<scalar_t>(), x.numel() / hidden, hidden, eps);
    });
    return out;
}

// (normed(x + residual), x + residual)
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                const at::Tensor& weight, double eps) {
    check_rows(x, "add_rms_norm");
    check_rows(residual, "add_rms_norm");
    const int64_t hidden = x.size(-1);
    TORCH_CHECK(weight.numel() == hidden && weight.scalar_type() == x.scalar_type() && residual.sizes() == x.sizes() &&
                    residual.scalar_type() == x.scalar_type(),
                "add_rms_norm: shapes or dtypes disagree");
    at::Tensor out = at::empty_like(x), residual_out = at::empty_like(x);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "add_rms_norm", [&] {
        rms_norm_rows<scalar_t>(out.data_ptr<scalar_t>(), residual_out.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(),
                                residual.data_ptr<scalar_t>(), weight.contiguous().data_ptr<scalar_t>(),
                                x.numel() / hidden, hidden, eps);
    });
    return {out, residual_out};
}

// Rotated (q, k), new contiguous tensors; q/k may be strided views of a fused qkv projection.
std::tuple<at::Tensor, at::Tensor> rotary(const at::Tensor& positions, const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& cos_sin) {
    check_rows(cos_sin, "rotary");
    TORCH_CHECK(positions.scalar_type() == at::kLong && positions.is_contiguous(), "rotary: positions must be int64");
    return {rotate(q, positions, cos_sin), rotate(k, positions, cos_sin)};
}

at::Tensor silu_and_mul(const at::Tensor& x) {
    check_rows(x, "silu_and_mul");
    TORCH_CHECK(x.dim() >= 1 && x.size(-1) % 2 == 0, "silu_and_mul: the last dim must be gate | up, even");
    const int64_t d = x.size(-1) / 2;
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = d;
    at::Tensor out = at::empty(shape, x.options());
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "silu_and_mul", [&] {
        silu_and_mul_rows<scalar_t>(out.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), x.numel() / (2 * d), d);
    });
    return out;
}

}  // namespace testbed_cpu

TORCH_LIBRARY_FRAGMENT(testbed_cpu, m) {
    m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
    m.def("add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)");
    m.def("rotary(Tensor positions, Tensor q, Tensor k, Tensor cos_sin) -> (Tensor, Tensor)");
    m.impl("rms_norm", c10::DispatchKey::CPU, TORCH_FN(testbed_cpu::rms_norm));
    m.impl("add_rms_norm", c10::DispatchKey::CPU, TORCH_FN(testbed_cpu::add_rms_norm));
    m.impl("rotary", c10::DispatchKey::CPU, TORCH_FN(testbed_cpu::rotary));
    m.def("silu_and_mul(Tensor x) -> Tensor");
    m.impl("silu_and_mul", c10::DispatchKey::CPU, TORCH_FN(testbed_cpu::silu_and_mul));
}

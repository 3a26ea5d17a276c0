// Argument checks and dispatch (dtype, small counts) shared by the attention kernels (paged_decode.cpp,
// paged_prefill.cpp).
#pragma once

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <type_traits>

namespace testbed_cpu {

// Calls f(T{}) with T the C++ type of a float32 / float16 / bfloat16 dtype.
template <typename F>
inline void dispatch_float(at::ScalarType dtype, const char* what, F&& f) {
    switch (dtype) {
        case at::kFloat:
            f(float{});
            break;
        case at::kHalf:
            f(c10::Half{});
            break;
        case at::kBFloat16:
            f(c10::BFloat16{});
            break;
        default:
            TORCH_CHECK(false, what, ": float32, float16 or bfloat16 only, got ", dtype);
    }
}

inline void check_cache(const at::Tensor& k_cache, const at::Tensor& v_cache, const char* what) {
    TORCH_CHECK(k_cache.device().is_cpu() && k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.dim() == 4 &&
                    v_cache.sizes() == k_cache.sizes() && v_cache.scalar_type() == k_cache.scalar_type(),
                what, ": caches must be contiguous [blocks, block_size, kv_heads, head_dim] of one dtype");
}

// f(integral_constant<int, v>) for v = value in [1, N] (values above N: N), so that a loop's trip count
// becomes a template argument and its accumulators stay in registers
template <int N, typename F>
inline void with_count(int64_t value, F&& f) {
    if constexpr (N > 1) {
        if (value < N) return with_count<N - 1>(value, f);
    }
    f(std::integral_constant<int, N>{});
}

}  // namespace testbed_cpu

// The CPU kernels as C++ functions, for the ops registered under torch.ops.testbed_cpu and for
// decode_layers.cpp, which chains them without going back to Python between ops.
#pragma once

#include <ATen/ATen.h>

#include <tuple>

namespace testbed_cpu {

// y = x w^T (+ bias), few rows, w packed by pack_linear (linear.cpp)
at::Tensor pack_linear(const at::Tensor& weight);
at::Tensor linear_packed(const at::Tensor& x, const at::Tensor& packed, int64_t N,
                         const c10::optional<at::Tensor>& bias);

// layer_ops.cpp
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                const at::Tensor& weight, double eps);
at::Tensor silu_and_mul(const at::Tensor& x);  // x = [..., 2d] (gate | up) -> silu(gate) * up
std::tuple<at::Tensor, at::Tensor> rotary(const at::Tensor& positions, const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& cos_sin);

// paged_decode.cpp
void write_kv(const at::Tensor& k, const at::Tensor& v, at::Tensor& k_cache, at::Tensor& v_cache,
              const at::Tensor& slot_mapping);
void paged_decode(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                  const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale);
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& k_cache,
                            at::Tensor& v_cache, const at::Tensor& slot_mapping, const at::Tensor& block_tables,
                            const at::Tensor& seq_lens, double scale);

}  // namespace testbed_cpu

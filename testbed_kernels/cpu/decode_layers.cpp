// A decode step's decoder layers in one call: the same kernels, in the same order, as the Python layers of
// testbed/models/llama.py run with kernel=cpu, chained in C++ so that a step with a handful of tokens does
// not pay ~15 Python-to-dispatcher round trips per layer (about as long as a small model's weights take to
// stream; measured: results/kernels/README.md). Results equal the Python path's bit for bit.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops.h"

namespace testbed_cpu {
namespace {

// Per-layer entries of `weights`, in this order (absent ones are None). The *Packed entries are the linear
// weights in linear.cpp's panel layout (pack_linear), None when the backend keeps no packed copies.
enum Weight {
    kInputNorm,
    kQkv,
    kQkvBias,
    kQNorm,
    kKNorm,
    kOut,
    kPostNorm,
    kGateUp,
    kDown,
    kQkvPacked,
    kOutPacked,
    kGateUpPacked,
    kDownPacked,
    kPerLayer
};

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& packed,
                  const c10::optional<at::Tensor>& b, int64_t few_rows) {
    // as testbed_kernels.cpu.linear: few rows to the packed-weight kernel, more (or no packed copy) to torch's GEMM
    if (packed.has_value() && packed->defined() && x.size(0) <= few_rows)
        return linear_packed(x.contiguous(), *packed, w.size(0), b);
    return at::linear(x, w, b);
}

}  // namespace

// hidden: [n, hidden] (embeddings); residual: None before the first layer. Returns (hidden, residual) after
// the last layer, before the final norm.
std::tuple<at::Tensor, at::Tensor> decode_layers(
    const at::Tensor& hidden_in, const c10::optional<at::Tensor>& residual_in, const at::Tensor& positions_in,
    const at::Tensor& slot_mapping_in, const at::Tensor& block_tables_in, const at::Tensor& seq_lens_in,
    const at::Tensor& cos_sin, const c10::List<c10::optional<at::Tensor>>& weights, at::TensorList kv_caches,
    int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double eps, double scale, int64_t few_rows) {
    const int64_t num_layers = static_cast<int64_t>(kv_caches.size()) / 2;
    TORCH_CHECK(static_cast<int64_t>(weights.size()) == num_layers * kPerLayer, "decode_layers: expected ", kPerLayer,
                " weight entries per layer");
    const at::Tensor positions = positions_in.to(at::kLong).contiguous();
    const at::Tensor slots = slot_mapping_in.to(at::kLong).contiguous();
    const at::Tensor tables = block_tables_in.to(at::kInt).contiguous();
    const at::Tensor seq_lens = seq_lens_in.to(at::kInt).contiguous();
    const int64_t n = hidden_in.size(0), q_size = num_heads * head_dim, kv_size = num_kv_heads * head_dim;
    at::Tensor hidden = hidden_in, residual;
    bool have_residual = residual_in.has_value() && residual_in->defined();
    if (have_residual) residual = *residual_in;
    auto w = [&](int64_t layer, Weight which) -> c10::optional<at::Tensor> {
        return weights.get(layer * kPerLayer + which);
    };
    for (int64_t l = 0; l < num_layers; ++l) {
        if (have_residual) {
            std::tie(hidden, residual) =
                add_rms_norm(hidden.contiguous(), residual.contiguous(), *w(l, kInputNorm), eps);
        } else {
            residual = hidden;
            hidden = rms_norm(hidden.contiguous(), *w(l, kInputNorm), eps);
            have_residual = true;
        }
        const at::Tensor qkv = linear(hidden, *w(l, kQkv), w(l, kQkvPacked), w(l, kQkvBias), few_rows);
        at::Tensor q = qkv.narrow(1, 0, q_size).reshape({n, num_heads, head_dim});
        at::Tensor k = qkv.narrow(1, q_size, kv_size).reshape({n, num_kv_heads, head_dim});
        const at::Tensor v = qkv.narrow(1, q_size + kv_size, kv_size).reshape({n, num_kv_heads, head_dim});
        if (w(l, kQNorm).has_value()) {  // qwen3: per-head RMSNorm of q and k
            q = rms_norm(q.contiguous(), *w(l, kQNorm), eps);
            k = rms_norm(k.contiguous(), *w(l, kKNorm), eps);
        }
        std::tie(q, k) = rotary(positions, q, k, cos_sin);
        at::Tensor k_cache = kv_caches[2 * l], v_cache = kv_caches[2 * l + 1];
        const at::Tensor attn = decode_attention(q, k, v, k_cache, v_cache, slots, tables, seq_lens, scale);
        const at::Tensor out = linear(attn.reshape({n, q_size}), *w(l, kOut), w(l, kOutPacked), c10::nullopt, few_rows);
        std::tie(hidden, residual) = add_rms_norm(out, residual, *w(l, kPostNorm), eps);
        const at::Tensor gate_up = linear(hidden, *w(l, kGateUp), w(l, kGateUpPacked), c10::nullopt, few_rows);
        hidden = linear(silu_and_mul(gate_up), *w(l, kDown), w(l, kDownPacked), c10::nullopt, few_rows);
    }
    return {hidden, residual};
}

}  // namespace testbed_cpu

TORCH_LIBRARY_FRAGMENT(testbed_cpu, m) {
    m.def(
        "decode_layers(Tensor hidden, Tensor? residual, Tensor positions, Tensor slot_mapping, Tensor block_tables, "
        "Tensor seq_lens, Tensor cos_sin, Tensor?[] weights, Tensor(a!)[] kv_caches, int num_heads, "
        "int num_kv_heads, int head_dim, float eps, float scale, int few_rows) -> (Tensor, Tensor)");
    m.impl("decode_layers", c10::DispatchKey::CPU, TORCH_FN(testbed_cpu::decode_layers));
}

"""What the simulated device holds before its KV cache: every weight of the model, as the real engine
allocates it (testbed/models/llama.py), so that the KV capacity the roofline plan derives is not overstated.

Counted: the input-embedding table, the LM head (one table with the embedding when tie_word_embeddings,
else its own), per layer the fused qkv projection (+ its bias for qwen2), o, gate_up and down projections,
the two RMSNorms (+ qwen3's per-head q/k norms), and the final norm. Not counted: activations, the CUDA
context, CUDA graphs and the rotary cache (vLLM subtracts a profiled peak for these;
gpu_memory_utilization leaves room for them here).
"""


def weight_params(arch) -> int:
    h, layers = arch.hidden_size, arch.num_hidden_layers
    q_out = arch.num_attention_heads * arch.head_dim
    kv_out = arch.num_key_value_heads * arch.head_dim
    per_layer = h * (q_out + 2 * kv_out) + q_out * h + 3 * h * arch.intermediate_size + 2 * h
    if arch.attention_bias:
        per_layer += q_out + 2 * kv_out
    if arch.qk_norm:
        per_layer += 2 * arch.head_dim
    embedding = arch.vocab_size * h
    head = 0 if arch.tie_word_embeddings else arch.vocab_size * h
    return embedding + head + layers * per_layer + h


def weight_bytes(arch, dtype_bytes: int) -> int:
    return weight_params(arch) * dtype_bytes

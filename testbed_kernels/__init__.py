"""Attention and layer kernels: Triton implementations beside their torch references.

Nothing here imports the engine: every function takes plain tensors.
KV-cache layout shared by every kernel: k_cache / v_cache are
[num_blocks, block_size, num_kv_heads, head_dim]; token slot s lives at
block s // block_size, offset s % block_size.
"""

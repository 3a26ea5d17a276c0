from testbed.attention.backend import AttentionMetadata, KernelBackend, get_backend, resolve_kernel

__all__ = ["AttentionMetadata", "KernelBackend", "get_backend", "resolve_kernel"]

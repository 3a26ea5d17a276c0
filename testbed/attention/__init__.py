from testbed.attention.backend import AttentionMetadata, KernelBackend, get_backend

__all__ = ["AttentionMetadata", "KernelBackend", "get_backend"]

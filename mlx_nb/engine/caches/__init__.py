"""Layer caches: what the engine asks of one, the quantized KV cache that batches, and the prefix
cache with its folder on disk."""

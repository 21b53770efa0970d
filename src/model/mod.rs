//! The transformer: config, weights on the GPU, KV cache, forward pass.

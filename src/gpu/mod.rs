//! GPU core: adapter, device, buffers, kernels, op lists.

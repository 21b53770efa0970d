//! wgspec: lossless speculative decoding for LLMs on WebGPU and wgpu.
//!
//! Data flows one way: bytes -> [`loader`] (GGUF | safetensors + config.json) -> [`model::Config`]
//! and named tensors -> [`model::Model`] on the GPU ([`gpu`]) -> logits for every position.
//! The same code runs natively (wgpu on Vulkan/Metal/DX12) and in the browser (wasm32 + WebGPU).

pub mod error;
#[cfg(not(target_arch = "wasm32"))]
pub mod fetch;
pub mod gpu;
pub mod loader;
#[cfg(not(target_arch = "wasm32"))]
pub mod local;
pub mod model;
pub mod sampling;
pub mod session;
pub mod spec;
pub mod tokenizer;

pub use error::{Error, Result};

//! wgspec: lossless speculative decoding for LLMs on WebGPU and wgpu.
//!
//! Data flows one way: bytes -> [`loader`] (GGUF | safetensors + config.json) -> [`model::Config`]
//! and named tensors -> [`model::Model`] on the GPU ([`gpu`]) -> logits for every position.
//! [`engine::Engine`] loads a target, its tokenizer and chat template and an optional draft, and
//! puts them behind one `generate` (one decode loop, [`speculative::generate`](fn@speculative::generate)) for every front end: the
//! CLI, the wasm facade (`web`, wasm32 only), the server.
//! The same code runs natively (wgpu on Vulkan/Metal/DX12) and in the browser (wasm32 + WebGPU).

pub mod engine;
pub mod error;
pub mod files;
pub mod generation;
pub mod gpu;
pub mod loader;
#[cfg(not(target_arch = "wasm32"))]
pub mod local;
pub mod model;
pub mod openai;
pub mod sampling;
pub mod speculative;
pub mod tokenizer;
#[cfg(target_arch = "wasm32")]
pub mod web;

pub use error::{Error, Result};

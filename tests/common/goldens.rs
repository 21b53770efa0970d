//! The llama.cpp golden transcripts of SmolLM2-135M (`tests/goldens/smollm2-135m.json`, made by
//! `scripts/goldens`) and the cached model files the real-model tests read.
#![allow(dead_code)]

use std::path::PathBuf;

use serde::Deserialize;

#[derive(Deserialize)]
pub struct Goldens {
    pub model: ModelInfo,
    pub cases: Vec<Case>,
}

#[derive(Deserialize)]
pub struct ModelInfo {
    pub file: String,
}

#[derive(Deserialize)]
pub struct Case {
    pub prompt: String,
    pub prompt_tokens: Vec<u32>,
    /// llama.cpp's greedy tokens on the weights dequantized to F32.
    pub f32_tokens: Vec<u32>,
    /// llama.cpp's greedy tokens on the Q4_1 file itself.
    pub q4_1_tokens: Vec<u32>,
}

pub fn goldens() -> Goldens {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/goldens/smollm2-135m.json");
    serde_json::from_slice(&std::fs::read(path).expect("goldens")).expect("goldens json")
}

/// The model cache of `wgspec fetch`: `$WGSPEC_CACHE`, else `~/.cache/wgspec`.
pub fn cache_dir() -> PathBuf {
    match std::env::var_os("WGSPEC_CACHE") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| ".".into())).join(".cache/wgspec"),
    }
}

/// A model file in the cache; fails loudly, naming the command that fetches it.
pub fn model_file(file: &str, fetch_name: &str) -> PathBuf {
    let p = cache_dir().join("models").join(file);
    assert!(p.exists(), "{} is missing: run `wgspec fetch {fetch_name}` (or ./build.sh models)", p.display());
    p
}

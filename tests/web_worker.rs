//! The browser checks (tests/web/mod.rs) in a dedicated Web Worker (where the package runs the engine). Run: `cargo test --target wasm32-unknown-unknown
//! --test web_worker` (build.sh sets up wasm-bindgen-test-runner, chromedriver and webdriver.json).
#![cfg(target_arch = "wasm32")]

mod web;

use wasm_bindgen_test::{wasm_bindgen_test, wasm_bindgen_test_configure};

wasm_bindgen_test_configure!(run_in_dedicated_worker);

#[wasm_bindgen_test]
async fn matmul_matches_reference() {
    web::matmul_matches_reference().await;
}

#[wasm_bindgen_test]
async fn tiny_models_match_reference() {
    web::tiny_models_match_reference().await;
}

#[wasm_bindgen_test]
async fn greedy_speculation_equals_greedy() {
    web::greedy_speculation_equals_greedy().await;
}

#[wasm_bindgen_test]
async fn facade_generates_like_the_engine() {
    web::facade_generates_like_the_engine().await;
}

#[wasm_bindgen_test]
async fn facade_loads_a_hugging_face_folder() {
    web::facade_loads_a_hugging_face_folder().await;
}

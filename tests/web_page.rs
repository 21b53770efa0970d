//! The browser checks (tests/web/mod.rs) on a page. Run: `cargo test --target wasm32-unknown-unknown
//! --test web_page` (build.sh sets up wasm-bindgen-test-runner, chromedriver and webdriver.json).
#![cfg(target_arch = "wasm32")]

#[macro_use]
mod web;

wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

all_browser_tests!();

// (the page only: the worker's browser compiles and runs the same shaders)
browser_tests!(
    every_kernel_builds,
    embed_dequantises_edge_scales_bit_for_bit,
    matmul_rows_keep_their_bits_in_every_pass
);

//! The browser checks (tests/web/mod.rs) in a dedicated Web Worker (where the package runs the
//! engine). Run: `cargo test --target wasm32-unknown-unknown --test web_worker` (build.sh sets up
//! wasm-bindgen-test-runner, chromedriver and webdriver.json).
#![cfg(target_arch = "wasm32")]

#[macro_use]
mod web;

wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_dedicated_worker);

all_browser_tests!();

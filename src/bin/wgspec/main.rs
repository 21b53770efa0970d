//! The `wgspec` binary: the command line in [`cli`], the models and drafts its commands load in
//! [`load`], the benchmark in [`bench`] (with the kernels' rooflines and shape facts in
//! [`roofline`], the batch under load in [`bench_batch`]) and the HTTP server in [`serve`] (native only; built for wasm32 as an empty
//! program, since the browser gets the library through `src/web.rs` instead).

#[cfg(not(target_arch = "wasm32"))]
mod bench;
#[cfg(not(target_arch = "wasm32"))]
mod bench_batch;
#[cfg(not(target_arch = "wasm32"))]
mod cli;
#[cfg(not(target_arch = "wasm32"))]
mod fetch;
#[cfg(not(target_arch = "wasm32"))]
mod load;
#[cfg(not(target_arch = "wasm32"))]
mod roofline;
#[cfg(not(target_arch = "wasm32"))]
mod serve;

#[cfg(not(target_arch = "wasm32"))]
fn main() -> std::process::ExitCode {
    cli::main()
}

#[cfg(target_arch = "wasm32")]
fn main() {}

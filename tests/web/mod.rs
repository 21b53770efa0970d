//! Browser checks, shared by `tests/web_page.rs` (on the page) and `tests/web_worker.rs` (in a
//! dedicated worker), run by wasm-bindgen-test in headless Chromium on its WebGPU adapter
//! (SwiftShader, no `shader-f16`): a shader against the CPU reference, tiny-model logits against
//! the reference, greedy speculation == greedy decoding through the engine and the JS facade.
#![allow(dead_code)]
// One browser thread owns every WebGPU object; the model API shares the GPU through an Arc.
#![allow(clippy::arc_with_non_send_sync)]

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;
use wgspec::engine::{DraftKind, Engine, Request};
use wgspec::files::ModelFiles;
use wgspec::gpu::{Gpu, GpuBuffer, KernelShape, MatmulOut, WeightBuffer};
use wgspec::loader::DType;
use wgspec::model::{Checkpoint, LoadOptions, Model, Precision};
use wgspec::web::WebEngine;

#[path = "../reference/mod.rs"]
mod reference;
#[path = "../common/tiny.rs"]
mod tiny;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tiny::{TinyModel, TinySpec};

/// The test binary's allocator: the system one, counting the heap bytes live and their peak, so a
/// test can tell how much wasm memory a load needs (linear memory itself never shrinks, and the
/// allocator reuses what earlier tests freed).
struct PeakAlloc;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for PeakAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: PeakAlloc = PeakAlloc;

/// Starts a new peak at the bytes live now; returns them.
fn reset_peak() -> usize {
    let live = LIVE.load(Ordering::Relaxed);
    PEAK.store(live, Ordering::Relaxed);
    live
}

/// Logits tolerance (as in tests/model.rs): f32 GPU sums vs f64 reference sums, relative to the
/// largest logit.
const LOGIT_ABS: f32 = 2e-4;
const LOGIT_REL: f32 = 1e-3;
/// f32 dot products of length k: error bound relative to the magnitude of the terms.
const MATMUL_REL: f32 = 2e-6;

pub async fn gpu() -> Arc<Gpu> {
    let g = Gpu::new().await.unwrap_or_else(|e| panic!("WebGPU setup failed: {e}"));
    web_sys_log(&format!("adapter: {}", g.describe()));
    Arc::new(g)
}

fn web_sys_log(s: &str) {
    wasm_bindgen_test::console_log!("{}", s);
}

fn rng(seed: u64) -> SmallRng {
    SmallRng::seed_from_u64(seed)
}

fn rand_vec(r: &mut SmallRng, len: usize, scale: f32) -> Vec<f32> {
    (0..len).map(|_| r.gen_range(-scale..scale)).collect()
}

async fn read_f32(gpu: &Gpu, b: &wgpu::Buffer, len: usize) -> Vec<f32> {
    let bytes = gpu.read_buffer(b).await.expect("read back");
    bytemuck::pod_collect_to_vec::<u8, f32>(&bytes)[..len].to_vec()
}

/// Every kernel builds in this browser (Tint, not only naga): kernels compile on first use, so
/// this compiles the ones the other checks leave out (the GPUs' split attention, the
/// benchmarks'). The GPU shape's modules are the same; only its matmuls' override constants
/// differ (compiling them all again cost SwiftShader about 48 s more).
pub async fn every_kernel_builds() {
    let gpu = gpu().await;
    gpu.check_kernels().await.unwrap_or_else(|e| panic!("{}: {e}", gpu.describe()));
}

/// Every quantized format's dequantisation in this browser, bit for bit (signed zeros too)
/// against the CPU's, as natively (tests/kernels.rs): the embedding kernel gathers whole rows
/// through the matmul's `unit_group`. Scales of +-0, +-2^-24, the largest f16 subnormal (an
/// adapter that flushed f16 subnormals would fail here), +-65504 and negative normals; second
/// scales of both signs; Q6_K scale bytes -128, 127 and 0; random quant bytes.
pub async fn embed_dequantises_edge_scales_bit_for_bit() {
    let gpu = gpu().await;
    let step = gpu.step_buffer();
    let mut r = rng(21);
    let (rows, dim) = (32, 512);
    for dtype in DType::ALL.into_iter().filter(|d| d.block_len() > 1) {
        let bytes = tiny::edge_scale_blocks(dtype, rows * dim, &mut r);
        let want = wgspec::loader::quant::dequantize(dtype, &bytes, rows * dim).expect("dequantize");
        let table = WeightBuffer::from_blocks(&gpu, "table", dtype, &bytes, rows, dim).expect("weights");
        let tokens: Vec<u32> = (0..rows as u32).collect();
        let tb = GpuBuffer::<u32>::from_slice(&gpu, "tokens", &tokens);
        let xb = GpuBuffer::<f32>::zeros(&gpu, "x", rows * dim);
        let op = gpu.embed(&step, &tb, &table, &xb, (0, 1.0), None);
        gpu.write_step(&step, rows, 0);
        let mut enc = gpu.encoder();
        gpu.encode(&mut enc, &[op], rows as u32);
        gpu.submit(enc);
        let got = read_f32(&gpu, &xb.raw, rows * dim).await;
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{dtype}: row {}, element {}: {g} vs {w}", i / dim, i % dim);
        }
    }
}

/// The matmul shader (every weight format, dequantised in the kernel, with bias) against the CPU.
pub async fn matmul_matches_reference() {
    let gpu = gpu().await;
    let step = gpu.step_buffer();
    let mut r = rng(1);
    for dtype in DType::ALL {
        let block = dtype.block_len().max(32);
        for &(n, k, cols) in &[(1, block, 1), (3, 2 * block, 13), (9, 3 * block, 40)] {
            let x = rand_vec(&mut r, n * k, 1.0);
            let bytes = match dtype {
                DType::F32 => tiny::f32_bytes(&rand_vec(&mut r, cols * k, 0.5)),
                DType::F16 => tiny::f16_bytes(&rand_vec(&mut r, cols * k, 0.5)),
                DType::BF16 => tiny::bf16_bytes(&rand_vec(&mut r, cols * k, 0.5)),
                q => tiny::random_blocks(q, cols * k, &mut r),
            };
            let w = wgspec::loader::quant::dequantize(dtype, &bytes, cols * k).expect("dequantize");
            let bias = rand_vec(&mut r, cols, 0.3);
            let xb = GpuBuffer::<f32>::from_slice(&gpu, "x", &x);
            let wb = WeightBuffer::from_blocks(&gpu, "w", dtype, &bytes, cols, k).expect("weights");
            let bb = GpuBuffer::<f32>::from_slice(&gpu, "b", &bias);
            let yb = GpuBuffer::<f32>::zeros(&gpu, "y", n * cols);
            let out = MatmulOut { ldy: cols as u32, ..Default::default() };
            let op = gpu.matmul(&step, &xb, &wb, Some(&bb), &yb, out);
            gpu.write_step(&step, n, 0);
            let mut enc = gpu.encoder();
            gpu.encode(&mut enc, &[op], n as u32);
            gpu.submit(enc);
            let y = read_f32(&gpu, &yb.raw, n * cols).await;
            for row in 0..n {
                let want = reference::matvec(&w, &x[row * k..(row + 1) * k], cols, k);
                for c in 0..cols {
                    let mag: f32 = (0..k).map(|i| (x[row * k + i] * w[c * k + i]).abs()).sum();
                    let bound = mag * MATMUL_REL * (k as f32).sqrt() + 1e-6;
                    let (g, e) = (y[row * cols + c], want[c] + bias[c]);
                    assert!((g - e).abs() <= bound, "matmul {dtype} n={n} k={k} [{row},{c}]: {g} vs {e}");
                }
            }
        }
    }
}

/// Gemma's GeGLU epilogue (GELU's tanh approximation) against the CPU for gates far past where
/// sinh / cosh overflow f32 (SwiftShader's tanh then gave NaN, and Gemma's logits with it).
pub async fn geglu_matches_reference_for_large_gates() {
    let gpu = gpu().await;
    let step = gpu.step_buffer();
    let mut r = rng(3);
    let (n, k, f) = (3, 64, 24);
    let x = rand_vec(&mut r, n * k, 30.0);
    let w = rand_vec(&mut r, 2 * f * k, 0.5);
    let xb = GpuBuffer::<f32>::from_slice(&gpu, "x", &x);
    let wb =
        WeightBuffer::from_blocks(&gpu, "w", DType::F32, &tiny::f32_bytes(&w), 2 * f, k).expect("weights");
    let yb = GpuBuffer::<f32>::zeros(&gpu, "y", n * f);
    let out = MatmulOut { ldy: f as u32, glu: true, gelu: true, ..Default::default() };
    let op = gpu.matmul(&step, &xb, &wb, None, &yb, out);
    gpu.write_step(&step, n, 0);
    let mut enc = gpu.encoder();
    gpu.encode(&mut enc, &[op], n as u32);
    gpu.submit(enc);
    let y = read_f32(&gpu, &yb.raw, n * f).await;
    let mut most = 0f64;
    for row in 0..n {
        let both = reference::matvec(&w, &x[row * k..(row + 1) * k], 2 * f, k);
        for c in 0..f {
            let (g, u) = (both[2 * c] as f64, both[2 * c + 1] as f64);
            most = most.max(g.abs());
            let inner = (2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g);
            let want = 0.5 * g * (1.0 + inner.tanh()) * u;
            let got = y[row * f + c] as f64;
            assert!((got - want).abs() <= 1e-3 * (1.0 + want.abs()), "geglu [{row},{c}]: {got} vs {want}");
        }
    }
    assert!(most > 20.0, "gates up to {most} only");
}

/// A row's bits do not depend on the pass it is in, in this browser's compiler too (Tint, then
/// SwiftShader): each of 16 rows computed alone equals, bit for bit, the same row in passes of 16
/// down to 2 rows, in the adapter's own shape (row groups of 1 to 8) and in the GPU shape (its
/// 4-row and 16-row pipelines, with 16, 32 and 64 lanes per column quad), as natively
/// (tests/kernels.rs, matmul_rows_are_batch_invariant).
pub async fn matmul_rows_keep_their_bits_in_every_pass() {
    let gpu_shape = KernelShape { matmul_lanes: Some(16), split_attention: Some(true), shuffle_loads: None };
    for gpu in [gpu().await, Arc::new(Gpu::with_shape(gpu_shape).await.expect("the GPU shape"))] {
        let step = gpu.step_buffer();
        let mut r = rng(4);
        let mut lanes_seen = Vec::new();
        // (lanes in the GPU shape: Q8_0 of 8 units 16, Q6_K of 24 units 32, Q4_K of 64 units 64)
        for (dtype, k, cols) in [(DType::Q8_0, 256, 40), (DType::Q6_K, 768, 40), (DType::Q4_K, 2048, 40)] {
            let rows = 16;
            let x = rand_vec(&mut r, rows * k, 1.0);
            let bytes = tiny::random_blocks(dtype, cols * k, &mut r);
            let wb = WeightBuffer::from_blocks(&gpu, "w", dtype, &bytes, cols, k).expect("weights");
            let out = MatmulOut { ldy: cols as u32, ..Default::default() };
            let run = |x: &[f32], n: usize| {
                let xb = GpuBuffer::<f32>::from_slice(&gpu, "x", x);
                let yb = GpuBuffer::<f32>::zeros(&gpu, "y", n * cols);
                let op = gpu.matmul(&step, &xb, &wb, None, &yb, out);
                let lanes = op.lanes();
                gpu.write_step(&step, n, 0);
                let mut enc = gpu.encoder();
                gpu.encode(&mut enc, &[op], n as u32);
                gpu.submit(enc);
                (yb, lanes)
            };
            let mut alone = Vec::new();
            for row in 0..rows {
                let (yb, _) = run(&x[row * k..(row + 1) * k], 1);
                alone.push(read_f32(&gpu, &yb.raw, cols).await);
            }
            for n in [16usize, 13, 9, 8, 7, 6, 5, 4, 3, 2] {
                let (yb, lanes) = run(&x[..n * k], n);
                lanes_seen.push(lanes);
                let pass = read_f32(&gpu, &yb.raw, n * cols).await;
                for (row, single) in alone.iter().enumerate().take(n) {
                    let same =
                        single.iter().zip(&pass[row * cols..]).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "{} {dtype} k={k} ({lanes} lanes): row {row} of a {n}-row pass differs from the row alone",
                        gpu.describe()
                    );
                }
            }
        }
        lanes_seen.dedup();
        let want: &[u32] = if gpu.matmul_lanes() > 1 { &[16, 32, 64] } else { &[1] };
        assert_eq!(lanes_seen, want, "{}: the lanes the matmuls ran with", gpu.describe());
    }
}

fn assert_logits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(1f32, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs();
        assert!(err <= LOGIT_ABS * scale + LOGIT_REL * w.abs(), "{what}[{i}]: got {g}, want {w}");
    }
    assert!(got.iter().any(|v| *v != 0.0), "{what}: all zeros");
}

/// Tiny random models (both architectures, F32 / F16 / Q8_0 weights) against the CPU reference:
/// every row of passes of 5, 1 and 6 tokens, then again after a rollback.
pub async fn tiny_models_match_reference() {
    let gpu = gpu().await;
    // (the newer families in f32 only: their blocks are the same kernels)
    let families = [TinySpec::qwen3(), TinySpec::phi3(), TinySpec::gemma3()].map(|s| (s, &[DType::F32][..]));
    let formats = &[DType::F32, DType::F16, DType::Q8_0][..];
    for (spec, dtypes) in
        [(TinySpec::llama(), formats), (TinySpec::qwen2(), formats)].into_iter().chain(families)
    {
        for &dtype in dtypes {
            let what = format!("{dtype:?} {:?}", spec.arch_of());
            let mut r = rng(10);
            let tiny = TinyModel::random(spec, &mut r);
            let ckpt = Checkpoint::from_gguf(tiny.to_gguf(dtype, &mut r)).expect("gguf");
            let opts = LoadOptions { context: Some(64), ..Default::default() };
            let mut model = Model::load(gpu.clone(), &ckpt, &opts, &mut |_| {}).expect("load");
            let mut cpu = reference::RefModel::new(&ckpt, Precision::Auto);
            let vocab = ckpt.config.vocab_size as u32;
            let tokens: Vec<u32> = (0..12).map(|_| r.gen_range(0..vocab)).collect();
            let mut pos = 0;
            for n in [5, 1, 6] {
                let chunk = &tokens[pos..pos + n];
                let got = model.forward(chunk, pos).await.expect("forward");
                assert_logits(&format!("{what}: {n} rows at {pos}"), &got, &cpu.forward(chunk, pos));
                pos += n;
            }
            model.truncate(3);
            cpu.truncate(3);
            let other: Vec<u32> = tokens[3..7].iter().map(|t| (t + 5) % vocab).collect();
            let got = model.forward(&other, 3).await.expect("forward");
            assert_logits(&format!("{what}: after truncate"), &got, &cpu.forward(&other, 3));
        }
    }
}

/// The same model with every weight moved by up to `noise` (a draft that mostly agrees).
fn perturbed(t: &TinyModel, noise: f32, r: &mut SmallRng) -> TinyModel {
    let mut out = TinyModel { spec: t.spec, tensors: Vec::new() };
    for x in &t.tensors {
        let values = x.values.iter().map(|v| v + r.gen_range(-noise..noise)).collect();
        out.tensors.push(tiny::TinyTensor { name: x.name.clone(), shape: x.shape.clone(), values });
    }
    out
}

fn open(gguf: Vec<u8>) -> wgspec::files::OpenedModel {
    let mut files = ModelFiles::new();
    files.add("model.gguf", gguf).expect("stage");
    files.open().expect("open")
}

fn load(gpu: &Arc<Gpu>, ckpt: &Checkpoint) -> Model {
    let opts = LoadOptions { context: Some(128), ..Default::default() };
    Model::load(gpu.clone(), ckpt, &opts, &mut |_| {}).expect("load")
}

/// Tiny target and draft GGUF files (the draft: the target's weights plus noise).
fn tiny_pair() -> (Vec<u8>, Vec<u8>) {
    let mut r = rng(300);
    let target = TinyModel::random(TinySpec::llama(), &mut r);
    let draft = perturbed(&target, 0.02, &mut r);
    (target.to_gguf(DType::F32, &mut r), draft.to_gguf(DType::F32, &mut r))
}

/// An engine over [`tiny_pair`]'s target, with its draft.
async fn tiny_engine_with_draft() -> Engine {
    let gpu = gpu().await;
    let (target_file, draft_file) = tiny_pair();
    let t = open(target_file);
    let d = open(draft_file);
    let mut engine = Engine::new(load(&gpu, &t.checkpoint), t.tokenizer, None);
    engine.set_draft(Some((load(&gpu, &d.checkpoint), &d.tokenizer))).expect("draft");
    engine
}

/// Greedy speculation (draft model at K = 1, 3 and adaptive; n-gram) equals greedy decoding
/// token for token, through the engine the facade uses.
pub async fn greedy_speculation_equals_greedy() {
    let mut engine = tiny_engine_with_draft().await;
    // Medusa heads for the target in the public layout (its own output matrix as their projection)
    let mut r = rng(300);
    let tiny = TinyModel::random(TinySpec::llama(), &mut r);
    let (heads, config) = tiny::medusa_heads(&tiny, 3, 1, DType::F16, tiny::MedusaKind::Echo, &mut r);
    let mut files = ModelFiles::new();
    files.add("medusa_lm_head.safetensors", heads).expect("heads");
    files.add("config.json", config).expect("config");
    engine.load_medusa_async(files, &mut |_, _| {}).await.expect("Medusa heads");
    let (head, config) = tiny::eagle_head(&tiny.spec, DType::F16, false, true, &mut r);
    let mut files = ModelFiles::new();
    files.add("model.safetensors", head).expect("head");
    files.add("config.json", config).expect("config");
    engine.load_eagle_async(files, &mut |_, _| {}).await.expect("EAGLE head");
    let prompt = "the cat sat on the mat; the cat sat on the";
    let mut req = Request::text(prompt, 24);
    req.draft = Some(DraftKind::None);
    let plain = engine.generate(&req, &mut |_| true).await.expect("plain");
    assert_eq!(plain.tokens.len(), 24, "no stop token and room in the context");
    let (mut drafted_any, mut trees) = (false, 0);
    for (kind, k) in [
        (DraftKind::Model, Some(1)),
        (DraftKind::Model, Some(3)),
        (DraftKind::Model, None),
        (DraftKind::Ngram, Some(4)),
        (DraftKind::ModelNgram, Some(4)),
        (DraftKind::Medusa, Some(3)),
        (DraftKind::Eagle, Some(3)),
    ] {
        req.draft = Some(kind);
        req.draft_k = k;
        let mut streamed = String::new();
        let got = engine
            .generate(&req, &mut |ev| {
                streamed.push_str(&ev.text);
                true
            })
            .await
            .expect("speculative");
        assert_eq!(got.tokens, plain.tokens, "{kind:?} K={k:?}: speculative output differs from greedy");
        assert_eq!(streamed, got.text, "{kind:?}: streamed text equals the final text");
        drafted_any |= got.from_draft.iter().any(|&b| b);
        trees += got.stats.tree_cycles;
    }
    assert!(drafted_any, "no draft token was ever accepted: the test would not test speculation");
    assert!(trees > 0, "token trees (n-gram, model+ngram, Medusa, EAGLE) were verified in the browser too");
    // an EAGLE-3 head (reduced vocabulary, the target's feature taps) replaces the EAGLE-1 one
    let (head, config) = tiny::eagle3_head(&tiny, DType::F16, 200, None, false, &mut r);
    let mut files = ModelFiles::new();
    files.add("model.safetensors", head).expect("head");
    files.add("config.json", config).expect("config");
    engine.load_eagle_async(files, &mut |_, _| {}).await.expect("EAGLE-3 head");
    for k in [Some(3), None] {
        req.draft = Some(DraftKind::Eagle);
        req.draft_k = k;
        let got = engine.generate(&req, &mut |_| true).await.expect("EAGLE-3");
        assert_eq!(got.tokens, plain.tokens, "EAGLE-3 K={k:?}: speculative output differs from greedy");
        assert!(got.stats.drafted > 0, "EAGLE-3 drafted: {:?}", got.stats);
    }
}

/// Sampled decoding in the browser draws on the GPU (SwiftShader has no shader-f16 and no
/// subgroups: the draws still compile and run): plain, n-gram and draft-model cycles read back a
/// few words each, and a seed fixes the output.
pub async fn sampled_decoding_draws_on_the_gpu() {
    let mut engine = tiny_engine_with_draft().await;
    let mut req = Request::text("the cat sat on the mat; the cat sat on the", 24);
    req.temperature = 1.0;
    req.top_k = 8;
    req.top_p = 0.9; // the nucleus' bisection, in Tint's uniformity rules too
    for (kind, k) in [(DraftKind::None, None), (DraftKind::Ngram, Some(3)), (DraftKind::Model, Some(3))] {
        req.draft = Some(kind);
        req.draft_k = k;
        req.seed = 7;
        let a = engine.generate(&req, &mut |_| true).await.expect("sampled");
        let b = engine.generate(&req, &mut |_| true).await.expect("sampled");
        req.seed = 8;
        let c = engine.generate(&req, &mut |_| true).await.expect("sampled");
        assert_eq!(a.tokens.len(), 24, "{kind:?}");
        assert_eq!(a.tokens, b.tokens, "{kind:?}: a seed fixes the output");
        assert_ne!(a.tokens, c.tokens, "{kind:?}: another seed, other tokens");
        let s = &a.stats;
        if kind == DraftKind::Model {
            // past its calibrating cycles, a draft model's K steps and the verify pass are one
            // submission and one read-back
            assert!(s.gpu_cycles > 0 && s.gpu_sampled >= s.gpu_cycles, "{kind:?}: {s:?}");
            assert!((s.readbacks as usize) < s.verify_forwards + s.draft_steps, "{kind:?}: {s:?}");
        } else {
            assert_eq!(s.gpu_sampled, s.verify_forwards, "{kind:?}: every pass drawn on the GPU: {s:?}");
        }
    }
}

/// A thrown or rejected error's message.
fn js_message(e: wasm_bindgen::JsValue) -> String {
    e.dyn_into::<js_sys::Error>().map(|e| String::from(e.message())).unwrap_or_default()
}

/// `web.load_target(context, max_memory_mb)`, awaited: its JSON summary, or the message of the
/// error it threw or the promise rejected with.
async fn load_target(web: &mut WebEngine, context: Option<u32>, mb: Option<u32>) -> Result<String, String> {
    let noop = js_sys::Function::new_no_args("");
    let promise = web.load_target(context, mb, noop).map_err(|e| js_message(e.into()))?;
    let info = JsFuture::from(promise).await.map_err(js_message)?;
    Ok(info.as_string().unwrap_or_default())
}

/// `web.load_draft()`, awaited, as [`load_target`].
async fn load_draft(web: &mut WebEngine) -> Result<String, String> {
    let noop = js_sys::Function::new_no_args("");
    let promise = web.load_draft(noop).map_err(|e| js_message(e.into()))?;
    let info = JsFuture::from(promise).await.map_err(js_message)?;
    Ok(info.as_string().unwrap_or_default())
}

/// The JS facade end to end: stage files, load target and draft, generate through the promise,
/// stop from the callback, errors as rejected promises / thrown errors.
pub async fn facade_generates_like_the_engine() {
    let (target_file, draft_file) = tiny_pair();
    let mut web = WebEngine::create().await.unwrap_or_else(|_| panic!("WebEngine::create"));
    assert!(!web.adapter().is_empty());
    let noop = js_sys::Function::new_no_args("");
    // No target yet: a clear error, not a panic.
    assert!(web.generate(r#"{"prompt":"x"}"#, noop.clone()).is_err());
    web.stage_file("model.gguf", target_file.clone()).unwrap_or_else(|_| panic!("stage"));
    let info = load_target(&mut web, Some(64), None).await.unwrap_or_else(|e| panic!("load_target: {e}"));
    let info: serde_json::Value = serde_json::from_str(&info).expect("info json");
    assert_eq!(info["arch"], "llama");
    web.stage_file("model.gguf", draft_file).unwrap_or_else(|_| panic!("stage draft"));
    load_draft(&mut web).await.unwrap_or_else(|e| panic!("load_draft: {e}"));

    let run = |json: &str, cb: js_sys::Function| {
        let promise = web.generate(json, cb).unwrap_or_else(|_| panic!("generate"));
        JsFuture::from(promise)
    };
    let plain = run(r#"{"prompt":"the cat sat","max_tokens":12,"draft":"none"}"#, noop.clone())
        .await
        .unwrap_or_else(|e| panic!("plain: {e:?}"));
    let spec = run(r#"{"prompt":"the cat sat","max_tokens":12,"draft_k":3}"#, noop.clone())
        .await
        .unwrap_or_else(|e| panic!("spec: {e:?}"));
    let plain: serde_json::Value = serde_json::from_str(&plain.as_string().expect("string")).expect("json");
    let spec: serde_json::Value = serde_json::from_str(&spec.as_string().expect("string")).expect("json");
    assert_eq!(plain["tokens"].as_array().map(Vec::len), Some(12));
    assert_eq!(spec["tokens"], plain["tokens"], "facade: speculative != greedy");
    assert_eq!(spec["stats"]["draft"], "model");

    // A callback returning false after 3 tokens stops the generation.
    let make = js_sys::Function::new_no_args("let n = 0; return (id, text, fromDraft) => ++n < 3;");
    let stop_after_3: js_sys::Function =
        make.call0(&wasm_bindgen::JsValue::NULL).expect("make").dyn_into().expect("a function");
    let stopped = run(r#"{"prompt":"the cat sat","max_tokens":12}"#, stop_after_3).await.expect("stopped");
    let stopped: serde_json::Value =
        serde_json::from_str(&stopped.as_string().expect("string")).expect("json");
    assert_eq!(stopped["finish_reason"], "cancelled");
    assert_eq!(stopped["tokens"].as_array().map(Vec::len), Some(3));

    // Malformed requests reject with a message naming the problem.
    let err = web.generate(r#"{"prompt":"x","max_tokenz":3}"#, noop.clone()).expect_err("unknown field");
    let msg = wasm_bindgen::JsValue::from(err).dyn_into::<js_sys::Error>().expect("Error").message();
    assert!(String::from(msg).contains("max_tokenz"), "message names the field");
    let err = web.stage_file("weights.bin", vec![1, 2, 3]).expect_err("unknown file name");
    let msg = wasm_bindgen::JsValue::from(err).dyn_into::<js_sys::Error>().expect("Error").message();
    assert!(String::from(msg).contains("weights.bin"));
    // The default draft is the engine's, set once for every request that names none: the draft
    // loaded last, or what JS sets (the n-gram); one that is not loaded is refused.
    assert_eq!(web.default_draft().ok().as_deref(), Some("model"));
    web.set_default_draft("ngram").unwrap_or_else(|_| panic!("ngram needs nothing loaded"));
    let promise = web.generate(r#"{"prompt":"the cat sat","max_tokens":6}"#, noop.clone()).expect("generate");
    let out = JsFuture::from(promise).await.unwrap_or_else(|e| panic!("ngram default: {e:?}"));
    let out: serde_json::Value = serde_json::from_str(&out.as_string().expect("string")).expect("json");
    assert_eq!(out["stats"]["draft"], "ngram");
    assert!(web.set_default_draft("eagle").is_err(), "no EAGLE head is loaded");
    assert!(web.set_default_draft("medusa+ngarm").is_err(), "no such draft");
    // A truncated GGUF file: a thrown error, the engine still usable afterwards.
    web.stage_file("model.gguf", target_file[..target_file.len() / 2].to_vec()).expect("stage");
    assert!(load_target(&mut web, Some(64), None).await.is_err(), "a truncated file must be refused");
    drop(web); // frees GPU memory (JS: engine.free())
}

/// The facade loads a Hugging Face folder (config.json, tokenizer.json, tokenizer_config.json,
/// *.safetensors) as well as a GGUF file: the same tiny model both ways gives the same greedy text.
pub async fn facade_loads_a_hugging_face_folder() {
    let mut r = rng(301);
    let tiny = TinyModel::random(TinySpec::qwen2(), &mut r);
    let gguf = tiny.to_gguf(DType::F32, &mut r);
    let (config, weights) = tiny.to_safetensors(DType::F32);
    // tokenizer.json: the GGUF vocabulary serialised by the tokenizers crate.
    let tokenizer_json = open(gguf.clone()).tokenizer.inner().to_string(false).expect("tokenizer.json");
    let noop = js_sys::Function::new_no_args("");
    let request = r#"{"prompt":"the cat sat","max_tokens":10,"draft":"ngram"}"#;
    let mut outputs = Vec::new();
    for hf in [false, true] {
        let mut web = WebEngine::create().await.unwrap_or_else(|_| panic!("WebEngine::create"));
        let stage = |web: &mut WebEngine, name: &str, bytes: Vec<u8>| {
            web.stage_file(name, bytes).unwrap_or_else(|_| panic!("stage {name}"));
        };
        if hf {
            stage(&mut web, "config.json", config.clone());
            stage(&mut web, "tokenizer.json", tokenizer_json.clone().into_bytes());
            let template = br#"{"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}"#;
            stage(&mut web, "tokenizer_config.json", template.to_vec());
            stage(&mut web, "model.safetensors", weights.clone());
        } else {
            stage(&mut web, "model.gguf", gguf.clone());
        }
        let info = load_target(&mut web, Some(64), None)
            .await
            .unwrap_or_else(|e| panic!("load_target hf={hf}: {e}"));
        let info: serde_json::Value = serde_json::from_str(&info).expect("info json");
        assert_eq!(info["arch"], "qwen2");
        assert_eq!(info["chat_template"], hf, "only the folder brings a template here");
        let out = JsFuture::from(web.generate(request, noop.clone()).unwrap_or_else(|_| panic!("generate")))
            .await
            .unwrap_or_else(|e| panic!("generate hf={hf}: {e:?}"));
        let out: serde_json::Value = serde_json::from_str(&out.as_string().expect("string")).expect("json");
        assert_eq!(out["tokens"].as_array().map(Vec::len), Some(10));
        outputs.push(out["tokens"].clone());
    }
    assert_eq!(outputs[0], outputs[1], "GGUF and safetensors of one model generate alike");
}

/// Hostile files in the browser: a GGUF declaring a model far beyond any adapter and a chat
/// template that would loop 10^12 times reject with a message naming the problem, and the engine
/// goes on serving.
pub async fn facade_refuses_hostile_files() {
    use wgspec::loader::gguf::Value;
    let mut r = rng(302);
    let tiny = TinyModel::random(TinySpec::llama(), &mut r);
    let noop = js_sys::Function::new_no_args("");
    let mut web = WebEngine::create().await.unwrap_or_else(|_| panic!("WebEngine::create"));

    // 4096 heads of 4096: refused from the metadata, before any allocation.
    let wide =
        [("llama.attention.head_count", Value::U32(4096)), ("llama.attention.key_length", Value::U32(4096))];
    web.stage_file("model.gguf", tiny.to_gguf_with(DType::F32, &mut r, &wide)).expect("stage");
    let msg = load_target(&mut web, Some(64), None).await.expect_err("an oversized model must be refused");
    assert!(msg.contains("q width"), "{msg}");

    // A model over the page's GPU memory budget: refused with its bill, before any allocation.
    web.stage_file("model.gguf", tiny.to_gguf(DType::F32, &mut r)).expect("stage");
    let msg =
        load_target(&mut web, Some(64), Some(0)).await.expect_err("a model over the budget must be refused");
    assert!(msg.contains("the budget is 0.0 MB"), "{msg}");

    // A template that would run for hours, one that doubles a string forty times (terabytes): the
    // chat fails fast on its budget, before the worker runs out of memory; plain generation runs.
    let hours = "{% for a in range(10000) %}{% for b in range(10000) %}{% for c in range(10000) %}\
                 {% endfor %}{% endfor %}{% endfor %}";
    let doubling = "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}\
                    {% endfor %}{{ ns.s }}";
    for (hostile, budget) in [(hours, "fuel"), (doubling, "the template makes")] {
        let with_template = [("tokenizer.chat_template", Value::String(hostile.into()))];
        web.stage_file("model.gguf", tiny.to_gguf_with(DType::F32, &mut r, &with_template)).expect("stage");
        load_target(&mut web, Some(64), None)
            .await
            .unwrap_or_else(|e| panic!("the model itself is fine: {e}"));
        let chat = r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}"#;
        let promise = web.generate(chat, noop.clone()).unwrap_or_else(|_| panic!("generate"));
        let err = JsFuture::from(promise).await.expect_err("the template's budget must end it");
        let msg = js_message(err);
        assert!(msg.contains("chat template") && msg.contains(budget), "{msg}");
    }
    let promise = web
        .generate(r#"{"prompt":"ab","max_tokens":2}"#, noop.clone())
        .unwrap_or_else(|_| panic!("generate"));
    let out = JsFuture::from(promise).await.unwrap_or_else(|e| panic!("plain after a failed chat: {e:?}"));
    let out: serde_json::Value = serde_json::from_str(&out.as_string().expect("string")).expect("json");
    assert_eq!(out["tokens"].as_array().map(Vec::len), Some(2));
}

/// A model file larger than the read budget, held by JS (outside wasm memory) and read by ranges:
/// it loads with the heap's peak under the budget plus a fixed overhead, its logits equal those
/// of the same file loaded from wasm memory bit for bit, and that whole-file path's peak (the
/// file itself) shows the measure would catch a load that copies the file in.
pub async fn weights_stream_with_bounded_wasm_memory() {
    let gpu = gpu().await;
    let mut r = rng(700);
    let spec = TinySpec {
        vocab: 2000,
        dim: 512,
        ffn: 1536,
        heads: 8,
        kv_heads: 4,
        tied: false,
        ..TinySpec::llama()
    };
    let file = TinyModel::random(spec, &mut r).to_gguf(DType::F16, &mut r);
    let file_len = file.len();
    let js_file = js_sys::Uint8Array::from(&file[..]);
    drop(file);
    let in_js = js_file.clone();
    let read = wasm_bindgen::closure::Closure::<dyn Fn(f64, f64) -> js_sys::Uint8Array>::new(
        move |offset: f64, len: f64| in_js.subarray(offset as u32, (offset + len) as u32),
    );
    let read_fn: js_sys::Function = read.as_ref().unchecked_ref::<js_sys::Function>().clone();
    let budget = 256 << 10;
    let opts = LoadOptions { context: Some(64), read_bytes: budget, ..Default::default() };
    let tokens = [5u32, 1999, 0, 77];

    let before = reset_peak();
    let source = wgspec::web::JsSource::new(file_len as u64, read_fn, None);
    let ckpt = Checkpoint::from_gguf_source(Box::new(source)).expect("header");
    let mut streamed = Model::load(gpu.clone(), &ckpt, &opts, &mut |_| {}).expect("streamed load");
    let streamed_peak = PEAK.load(Ordering::Relaxed) - before;
    let got = streamed.forward(&tokens, 0).await.expect("forward");
    drop((streamed, ckpt));

    let before = reset_peak();
    let ckpt = Checkpoint::from_gguf(js_file.to_vec()).expect("whole file");
    let mut whole = Model::load(gpu.clone(), &ckpt, &opts, &mut |_| {}).expect("whole load");
    let whole_peak = PEAK.load(Ordering::Relaxed) - before;
    let want = whole.forward(&tokens, 0).await.expect("forward");
    web_sys_log(&format!(
        "a {file_len}-byte model: heap peak {streamed_peak} bytes streamed in reads of {budget}, \
         {whole_peak} from wasm memory"
    ));
    assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "streaming changed the logits");
    drop((whole, ckpt));

    // The same file arriving 1 MiB per timer tick (a download the load overlaps): reading past
    // what has arrived throws, so the load must wait for each batch (`ready`); the blocking
    // loader refuses such a file instead of reading it.
    let make = js_sys::Function::new_with_args(
        "bytes",
        "const st = { arrived: 2 << 20, waits: 0 };
         st.read = (offset, length) => {
           if (offset + length > st.arrived) throw new Error(`read past the ${st.arrived} bytes arrived`);
           return bytes.subarray(offset, offset + length);
         };
         st.ready = (end) => {
           if (end <= st.arrived) return undefined;
           st.waits++;
           return new Promise((resolve) => {
             const tick = () => {
               st.arrived = Math.min(bytes.length, st.arrived + (1 << 20));
               if (end <= st.arrived) resolve(); else setTimeout(tick, 0);
             };
             setTimeout(tick, 0);
           });
         };
         return st;",
    );
    let st = make.call1(&wasm_bindgen::JsValue::NULL, &js_file).expect("arriving file");
    let field = |name: &str| js_sys::Reflect::get(&st, &name.into()).expect(name);
    let arriving = || {
        let (read, ready) = (field("read").unchecked_into(), field("ready").unchecked_into());
        Checkpoint::from_gguf_source(Box::new(wgspec::web::JsSource::new(file_len as u64, read, Some(ready))))
            .expect("header")
    };
    let err = Model::load(gpu.clone(), &arriving(), &opts, &mut |_| {}).err().expect("must not block");
    assert!(err.to_string().contains("still arriving"), "{err}");
    let ckpt = arriving();
    let mut overlapped =
        Model::load_async(gpu.clone(), &ckpt, &opts, &mut |_| {}).await.expect("overlapped load");
    let waits = field("waits").as_f64().unwrap_or(0.0);
    assert!(waits >= 10.0, "the load waited {waits} times for a 16.7 MB file arriving by the MiB");
    let got = overlapped.forward(&tokens, 0).await.expect("forward");
    assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "waiting changed the logits");
    // The fixed overhead: the GGUF header's first MiB, the vocabulary, pipelines and run state.
    let bound = 4 * budget as usize + (3 << 20);
    assert!(file_len > 3 * bound, "the model ({file_len} bytes) must dwarf the bound ({bound})");
    assert!(streamed_peak < bound, "streamed load peaked at {streamed_peak} bytes of heap, bound {bound}");
    assert!(whole_peak >= file_len, "the whole-file path's peak {whole_peak} must count the file");
}

/// Declares every check above as a wasm-bindgen test, once per harness (`tests/web_page.rs`,
/// `tests/web_worker.rs`), which differ only in where the tests run.
macro_rules! browser_tests {
    ($($name:ident),* $(,)?) => {$(
        #[wasm_bindgen_test::wasm_bindgen_test]
        async fn $name() {
            web::$name().await;
        }
    )*};
}

macro_rules! all_browser_tests {
    () => {
        browser_tests!(
            matmul_matches_reference,
            geglu_matches_reference_for_large_gates,
            tiny_models_match_reference,
            greedy_speculation_equals_greedy,
            sampled_decoding_draws_on_the_gpu,
            facade_generates_like_the_engine,
            facade_loads_a_hugging_face_folder,
            facade_refuses_hostile_files,
            weights_stream_with_bounded_wasm_memory,
        );
    };
}

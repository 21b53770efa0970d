//! The whole forward pass on the GPU against the CPU reference, on tiny random models that the
//! tests write as GGUF (every supported tensor type) and as safetensors, for both architectures.

mod common;
mod reference;

use common::tiny::{TinyModel, TinySpec};
use common::{assert_close, gpu, gpu_shaped, rng};
use reference::RefModel;
use wgspec::generation::GenerateOptions;
use wgspec::gpu::{Gpu, KernelShape};
use wgspec::loader::source::Source;
use wgspec::loader::DType;
use wgspec::model::{Checkpoint, LoadOptions, Model, Precision, TensorTable};
use wgspec::speculative::{KPolicy, TokenTree};
use wgspec::Error;

/// Logits tolerance: f32 GPU sums vs f64 reference sums over a few hundred terms, relative to
/// the largest logit of the sequence.
const LOGIT_ABS: f32 = 2e-4;
const LOGIT_REL: f32 = 1e-3;
/// With an f16 KV cache (both sides round k and v to f16): where the GPU's and the CPU's f32
/// value of a k or v element straddle an f16 rounding midpoint, they cache neighbours one f16 ulp
/// (2^-11 relative) apart. Measured on these tiny models: up to 3e-4 of the largest logit (1e-5
/// without such flips), so 5x LOGIT_ABS; the f32 cache path keeps LOGIT_ABS.
const LOGIT_ABS_KV_F16: f32 = 1e-3;

fn assert_logits(what: &str, got: &[f32], want: &[f32], kv_f16: bool) {
    let scale = want.iter().fold(1f32, |m, v| m.max(v.abs()));
    let abs = if kv_f16 { LOGIT_ABS_KV_F16 } else { LOGIT_ABS };
    assert_close(what, got, want, abs * scale, LOGIT_REL);
}

fn load(ckpt: &Checkpoint, precision: Precision) -> Model {
    load_on(gpu(), ckpt, precision)
}

fn load_on(gpu: std::sync::Arc<wgspec::gpu::Gpu>, ckpt: &Checkpoint, precision: Precision) -> Model {
    let opts = LoadOptions { context: Some(64), precision, ..Default::default() };
    Model::load(gpu, ckpt, &opts, &mut |_| {}).expect("load")
}

fn forward(m: &mut Model, tokens: &[u32], pos: usize) -> Vec<f32> {
    pollster::block_on(m.forward(tokens, pos)).expect("forward")
}

/// Runs a sequence in passes of several sizes, rolls back and re-runs, comparing every row.
fn check_against_reference(what: &str, ckpt: &Checkpoint, precision: Precision, seed: u64) {
    check_on(gpu(), what, ckpt, precision, seed)
}

fn check_on(
    gpu: std::sync::Arc<wgspec::gpu::Gpu>,
    what: &str,
    ckpt: &Checkpoint,
    precision: Precision,
    seed: u64,
) {
    let mut gpu_model = load_on(gpu, ckpt, precision);
    let mut cpu = RefModel::new(ckpt, precision);
    let vocab = ckpt.config.vocab_size as u32;
    let mut r = rng(seed);
    let tokens: Vec<u32> = (0..14).map(|_| rand::Rng::gen_range(&mut r, 0..vocab)).collect();
    let mut pos = 0;
    for n in [5, 1, 6, 2] {
        let chunk = &tokens[pos..pos + n];
        let got = forward(&mut gpu_model, chunk, pos);
        let want = cpu.forward(chunk, pos);
        assert_logits(&format!("{what}: logits of {n} rows at {pos}"), &got, &want, gpu_model.kv_f16());
        pos += n;
    }
    assert_eq!(gpu_model.len(), 14);
    // Roll back to 4 positions and continue with other tokens: the cache must hold no trace of them.
    gpu_model.truncate(4);
    assert_eq!(gpu_model.len(), 4);
    let other: Vec<u32> = tokens[4..9].iter().map(|t| (t + 7) % vocab).collect();
    let got = forward(&mut gpu_model, &other, 4);
    let want = cpu.forward(&other, 4);
    assert_logits(&format!("{what}: logits after truncate"), &got, &want, gpu_model.kv_f16());
}

#[test]
fn gguf_float_models_match_reference() {
    for spec in
        [TinySpec::llama(), TinySpec::qwen2(), TinySpec::qwen3(), TinySpec::phi3(), TinySpec::gemma3()]
    {
        for dtype in [DType::F32, DType::F16] {
            let mut r = rng(10);
            let tiny = TinyModel::random(spec, &mut r);
            let ckpt = Checkpoint::from_gguf(tiny.to_gguf(dtype, &mut r)).expect("gguf");
            // the f16 KV cache (Auto) and the f32 one (F32: the same weights, tighter tolerance)
            for precision in [Precision::Auto, Precision::F32] {
                let what = format!("gguf {dtype:?} {:?} {precision:?}", spec.arch_of());
                check_against_reference(&what, &ckpt, precision, 11);
                // the GPU shape too (16-lane matmul, attention split over the cache)
                if dtype == DType::F16 {
                    check_on(gpu_shaped(), &format!("{what} (GPU shape)"), &ckpt, precision, 11);
                }
            }
        }
    }
}

#[test]
fn gguf_quantized_models_match_reference() {
    let k_spec = |qwen2| TinySpec {
        dim: 256,
        ffn: 256,
        heads: 4,
        kv_heads: 2,
        ..if qwen2 { TinySpec::qwen2() } else { TinySpec::llama() }
    };
    let cases = [
        (TinySpec::llama(), DType::Q8_0),
        (TinySpec::qwen2(), DType::Q4_0),
        (TinySpec::llama(), DType::Q4_1),
        (TinySpec::qwen2(), DType::Q5_0),
        (k_spec(false), DType::Q4_K),
        (k_spec(true), DType::Q5_K),
        (k_spec(true), DType::Q6_K),
    ];
    for (spec, dtype) in cases {
        let mut r = rng(20);
        let tiny = TinyModel::random(spec, &mut r);
        let ckpt = Checkpoint::from_gguf(tiny.to_gguf(dtype, &mut r)).expect("gguf");
        for precision in [Precision::Auto, Precision::F32] {
            check_against_reference(&format!("gguf {dtype:?} {precision:?}"), &ckpt, precision, 21);
        }
    }
}

#[test]
fn safetensors_models_match_reference() {
    for spec in
        [TinySpec::llama(), TinySpec::qwen2(), TinySpec::qwen3(), TinySpec::phi3(), TinySpec::gemma3()]
    {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let mut r = rng(30);
            let tiny = TinyModel::random(spec, &mut r);
            let (config, st) = tiny.to_safetensors(dtype);
            let ckpt = Checkpoint::from_safetensors(&config, vec![st]).expect("safetensors");
            check_against_reference(
                &format!("safetensors {dtype:?} {:?}", spec.arch_of()),
                &ckpt,
                Precision::Auto,
                31,
            );
        }
    }
}

#[test]
fn gguf_and_hugging_face_rotary_layouts_give_the_same_model() {
    // The same weights written as GGUF (llama q/k permuted to interleaved pairs, as llama.cpp's
    // converter does) and as safetensors (halves) must produce the same logits.
    for spec in
        [TinySpec::llama(), TinySpec::qwen2(), TinySpec::qwen3(), TinySpec::phi3(), TinySpec::gemma3()]
    {
        let mut r = rng(40);
        let tiny = TinyModel::random(spec, &mut r);
        let gguf = Checkpoint::from_gguf(tiny.to_gguf(DType::F32, &mut r)).expect("gguf");
        let (config, st) = tiny.to_safetensors(DType::F32);
        let hf = Checkpoint::from_safetensors(&config, vec![st]).expect("safetensors");
        assert_ne!(
            gguf.config.rope_layout == hf.config.rope_layout,
            spec.arch_of() == wgspec::model::Arch::Llama,
            "layouts differ only for llama"
        );
        let tokens = [3u32, 99, 17, 250, 4, 4, 120];
        let a = forward(&mut load(&gguf, Precision::Auto), &tokens, 0);
        let b = forward(&mut load(&hf, Precision::Auto), &tokens, 0);
        assert_close(&format!("gguf vs hf {:?}", spec.arch_of()), &a, &b, 1e-4, 1e-4);
    }
}

/// Llama 3.1's rope scaling as llama.cpp's converter stores it in `rope_freqs.weight`: each
/// frequency's divisor, worked out here on its own (1 above the high-frequency wavelength,
/// `factor` below the low one, the blend between).
fn converter_rope_freqs(theta: f64, rope_dim: usize, factor: f64, low: f64, high: f64, old: f64) -> Vec<f32> {
    (0..rope_dim / 2)
        .map(|i| {
            let wavelen = 2.0 * std::f64::consts::PI * theta.powf(2.0 * i as f64 / rope_dim as f64);
            let d = if wavelen < old / high {
                1.0
            } else if wavelen > old / low {
                factor
            } else {
                let smooth = (old / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            };
            d as f32
        })
        .collect()
}

#[test]
fn rope_scaling_follows_llama3_and_linear_in_both_formats() {
    use wgspec::loader::gguf::Value;
    use wgspec::model::RopeScaling;
    // theta 100 and an original context of 64 put the tiny heads' 8 frequencies in all three of
    // Llama 3's bands (wavelengths 6 to 353 against 16 and 64), and make the scaling move the
    // logits within the test's 14 positions
    let mut r = rng(47);
    let tiny = TinyModel::random(TinySpec::llama(), &mut r);
    let (config, st) = tiny.to_safetensors(DType::F32);
    let mut config: serde_json::Value = serde_json::from_slice(&config).expect("json");
    config["rope_theta"] = 100.0.into();
    config["rope_scaling"] = serde_json::json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64});
    let hf = Checkpoint::from_safetensors(&serde_json::to_vec(&config).expect("json"), vec![st.clone()])
        .expect("safetensors");
    assert!(matches!(hf.config.rope_scaling, RopeScaling::Llama3 { original_context: 64, .. }));
    check_against_reference("llama3 rope scaling (config.json)", &hf, Precision::F32, 5);

    // the same model as GGUF, its scaling in rope_freqs.weight as llama.cpp's converter writes it
    let freqs = converter_rope_freqs(100.0, tiny.spec.head_dim(), 8.0, 1.0, 4.0, 64.0);
    assert!(freqs[0] == 1.0 && freqs[7] == 8.0 && freqs[2] > 1.0 && freqs[4] < 8.0, "{freqs:?}");
    let mut with_freqs = TinyModel { spec: tiny.spec, tensors: tiny.tensors.clone() };
    let t = common::tiny::TinyTensor {
        name: "rope_freqs.weight".into(),
        shape: vec![freqs.len()],
        values: freqs,
    };
    with_freqs.tensors.push(t);
    let base = [("llama.rope.freq_base", Value::F32(100.0))];
    let gguf = Checkpoint::from_gguf(with_freqs.to_gguf_with(DType::F32, &mut r, &base)).expect("gguf");
    assert_eq!(gguf.config.rope_scaling, RopeScaling::Stored);
    check_against_reference("llama3 rope scaling (rope_freqs.weight)", &gguf, Precision::F32, 5);
    let tokens = [3u32, 99, 17, 250, 4, 4, 120, 8, 60, 61, 62, 9];
    let a = forward(&mut load(&hf, Precision::F32), &tokens, 0);
    let b = forward(&mut load(&gguf, Precision::F32), &tokens, 0);
    assert_close("llama3 scaling: config.json vs rope_freqs.weight", &a, &b, 1e-4, 1e-4);
    // (a test that the scaling is applied at all: the unscaled model differs)
    let plain = Checkpoint::from_gguf(tiny.to_gguf_with(DType::F32, &mut r, &base)).expect("gguf");
    let c = forward(&mut load(&plain, Precision::F32), &tokens, 0);
    let moved = a.iter().zip(&c).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    assert!(moved > 1e-2, "the scaling moved the logits by {moved} only");

    // linear scaling (GGUF's rope.scaling.type), and a type wgspec does not run, refused by name
    let linear = [
        base[0].clone(),
        ("llama.rope.scaling.type", Value::String("linear".into())),
        ("llama.rope.scaling.factor", Value::F32(4.0)),
    ];
    let lin = Checkpoint::from_gguf(tiny.to_gguf_with(DType::F32, &mut r, &linear)).expect("gguf");
    assert_eq!(lin.config.rope_scaling, RopeScaling::Linear { factor: 4.0 });
    check_against_reference("linear rope scaling", &lin, Precision::F32, 6);
    // Gemma 3 4B's linear scaling: its global layers only (the local ones keep their own base,
    // unscaled), as llama.cpp and transformers run it
    let gemma = TinyModel::random(TinySpec::gemma3(), &mut r);
    let gemma_linear = [
        ("gemma3.rope.scaling.type", Value::String("linear".into())),
        ("gemma3.rope.scaling.factor", Value::F32(8.0)),
    ];
    let g = Checkpoint::from_gguf(gemma.to_gguf_with(DType::F32, &mut r, &gemma_linear)).expect("gguf");
    assert_eq!(g.config.rope_scaling, RopeScaling::Linear { factor: 8.0 });
    assert!((1..=g.config.n_layers).contains(&g.config.global_every), "{:?}", g.config);
    check_against_reference("gemma3 linear rope scaling (global layers)", &g, Precision::F32, 6);
    let yarn = [("llama.rope.scaling.type", Value::String("yarn".into()))];
    let err = Checkpoint::from_gguf(tiny.to_gguf_with(DType::F32, &mut r, &yarn)).err().expect("yarn");
    assert!(err.to_string().contains("\"yarn\" is not supported"), "{err}");
    config["rope_scaling"] = serde_json::json!({"rope_type": "dynamic", "factor": 2.0});
    let err = Checkpoint::from_safetensors(&serde_json::to_vec(&config).expect("json"), vec![st])
        .err()
        .expect("dynamic");
    assert!(err.to_string().contains("\"dynamic\" is not supported"), "{err}");
}

#[test]
fn phi3_fused_matrices_are_read_as_their_parts_and_a_sliding_window_masks_old_keys() {
    use wgspec::loader::gguf::Value;
    let mut r = rng(48);
    let tiny = TinyModel::random(TinySpec::phi3(), &mut r);
    let gguf = Checkpoint::from_gguf(tiny.to_gguf(DType::F32, &mut r)).expect("gguf");
    let (config, st) = tiny.to_safetensors(DType::F32);
    let hf = Checkpoint::from_safetensors(&config, vec![st]).expect("safetensors");
    // the files hold attn_qkv and a gate|up of twice the rows (gate_up_proj): each part reads as
    // the tensor it was made of
    let names: Vec<&str> = gguf.tensor_shapes().into_iter().map(|(n, _)| n).collect();
    assert!(names.contains(&"blk.0.attn_qkv.weight") && !names.contains(&"blk.0.attn_q.weight"), "{names:?}");
    for part in ["attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up"] {
        let name = format!("blk.1.{part}.weight");
        let want = tiny.tensors.iter().find(|t| t.name == name).expect("part");
        for (what, ckpt) in [("gguf", &gguf), ("safetensors", &hf)] {
            let got = ckpt.tensor(&name, &want.shape, Precision::F32).expect(&name).to_f32().expect("values");
            assert!(got == want.values, "{what} {name}: not the rows it was made of");
        }
    }
    // quantized fused matrices: rows of blocks
    let q = Checkpoint::from_gguf(tiny.to_gguf(DType::Q4_0, &mut r)).expect("gguf");
    check_against_reference("phi3 Q4_0", &q, Precision::Auto, 12);
    // a sliding window in the file is not applied (llama.cpp runs Phi-3 with full attention);
    // a config with one (as Gemma 3's local layers will have): each query sees its last 5 keys,
    // in both attention shapes, against the CPU, and a verify pass across the window's edge
    // equals single steps bit for bit (what keeps speculation exact there)
    let windowed = [("phi3.attention.sliding_window", Value::U32(5))];
    let mut w = Checkpoint::from_gguf(tiny.to_gguf_with(DType::F16, &mut r, &windowed)).expect("gguf");
    assert_eq!(w.config.sliding_window, None);
    w.config.sliding_window = Some(5);
    check_against_reference("phi3 window 5", &w, Precision::Auto, 13);
    check_on(gpu_shaped(), "phi3 window 5 (GPU shape)", &w, Precision::Auto, 13);
    for g in [gpu(), gpu_shaped()] {
        let mut m = load_on(g, &w, Precision::Auto);
        let tokens: Vec<u32> = (0..16).map(|i| (i * 37 % 300) as u32).collect();
        let single: Vec<Vec<f32>> =
            tokens.iter().enumerate().map(|(p, t)| forward(&mut m, &[*t], p)).collect();
        m.truncate(3);
        let pass = forward(&mut m, &tokens[3..12], 3);
        let v = w.config.vocab_size;
        for (i, row) in pass.chunks(v).enumerate() {
            let same = row.iter().zip(&single[3 + i]).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "window 5: row {i} of a pass from 3 differs from its single step");
        }
    }
    let plain = Checkpoint::from_gguf(tiny.to_gguf(DType::F16, &mut r)).expect("gguf");
    let (a, b) = (
        forward(&mut load(&w, Precision::Auto), &[1, 2, 3, 4, 5, 6, 7], 0),
        forward(&mut load(&plain, Precision::Auto), &[1, 2, 3, 4, 5, 6, 7], 0),
    );
    let v = w.config.vocab_size;
    assert!(a[..5 * v] == b[..5 * v] && a[5 * v..] != b[5 * v..], "the window changes only the rows past it");
    // Phi-3.5's longrope factors are refused by name
    let mut longrope = TinyModel { spec: tiny.spec, tensors: tiny.tensors.clone() };
    let factors = vec![1.0; tiny.spec.head_dim() / 2];
    let t = common::tiny::TinyTensor {
        name: "rope_factors_long.weight".into(),
        shape: vec![factors.len()],
        values: factors,
    };
    longrope.tensors.push(t);
    let err = Checkpoint::from_gguf(longrope.to_gguf(DType::F32, &mut r)).err().expect("longrope");
    assert!(err.to_string().contains("longrope"), "{err}");
}

/// The tiny models whose logits llama.cpp recorded (`tests/goldens/tiny-archs.json`, made by
/// `scripts/goldens/make_tiny_goldens.mjs` from the GGUF files this writes when
/// `WGSPEC_WRITE_TINY_GOLDENS` names a folder): seeded random weights in F32, one per
/// architecture feature llama.cpp checks for us.
fn tiny_golden_models() -> Vec<(&'static str, Vec<u8>)> {
    use wgspec::loader::gguf::Value;
    let mut r = rng(0x901d);
    let qwen3 = TinyModel::random(TinySpec::qwen3(), &mut r).to_gguf(DType::F32, &mut r);
    // Llama 3.1's rope scaling as rope_freqs.weight, at a base and original context that put the
    // heads' frequencies in all three bands
    let llama = TinyModel::random(TinySpec::llama(), &mut r);
    let freqs = converter_rope_freqs(100.0, llama.spec.head_dim(), 8.0, 1.0, 4.0, 64.0);
    let mut scaled = TinyModel { spec: llama.spec, tensors: llama.tensors.clone() };
    scaled.tensors.push(common::tiny::TinyTensor {
        name: "rope_freqs.weight".into(),
        shape: vec![freqs.len()],
        values: freqs,
    });
    let base = [("llama.rope.freq_base", Value::F32(100.0))];
    let llama3 = scaled.to_gguf_with(DType::F32, &mut r, &base);
    // (a sliding window in the file, which llama.cpp's Phi-3 ignores, as wgspec does)
    let window = [("phi3.attention.sliding_window", Value::U32(5))];
    let phi3 = TinyModel::random(TinySpec::phi3(), &mut r).to_gguf_with(DType::F32, &mut r, &window);
    let gemma3 = TinyModel::random(TinySpec::gemma3(), &mut r).to_gguf(DType::F32, &mut r);
    vec![
        ("tiny-qwen3", qwen3),
        ("tiny-llama3-rope-scaling", llama3),
        ("tiny-phi3", phi3),
        ("tiny-gemma3", gemma3),
    ]
}

/// Prompt of the tiny goldens.
const TINY_GOLDEN_PROMPT: [u32; 8] = [3, 99, 17, 250, 4, 4, 120, 8];

#[test]
fn tiny_models_of_each_architecture_match_llama_cpp() {
    // llama.cpp's log-probabilities over the whole vocabulary after the prompt and after each
    // token it then chose greedily, on the same files (their sha256 recorded beside them):
    // the GPU's, fed the same tokens, within LOGPROB_ABS of each. llama.cpp keeps its KV cache
    // in f16 and takes q.k in f16: measured, its log-probabilities are within 0.02 nats of the
    // f32 path's (the most, over both models and every token down to -20); an architecture
    // mistake moves them by nats (Llama 3.1's scaling left out: 3.7 to 7 per step).
    const LOGPROB_ABS: f32 = 0.05;
    use sha2::Digest;
    let models = tiny_golden_models();
    if let Some(dir) = std::env::var_os("WGSPEC_WRITE_TINY_GOLDENS") {
        let dir = std::path::PathBuf::from(dir);
        for (name, bytes) in &models {
            std::fs::write(dir.join(format!("{name}.gguf")), bytes).expect("write");
        }
        return;
    }
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/goldens/tiny-archs.json");
    let goldens: serde_json::Value =
        serde_json::from_slice(&std::fs::read(path).expect("tiny goldens")).expect("json");
    for (name, bytes) in models {
        let g = &goldens["models"][name];
        let sha = format!("{:x}", sha2::Sha256::digest(&bytes));
        assert_eq!(g["sha256"].as_str(), Some(sha.as_str()), "{name}: not the file llama.cpp ran");
        let prompt: Vec<u32> = serde_json::from_value(g["prompt_tokens"].clone()).expect("prompt");
        assert_eq!(prompt, TINY_GOLDEN_PROMPT);
        let chosen: Vec<u32> = serde_json::from_value(g["tokens"].clone()).expect("tokens");
        let want: Vec<Vec<f32>> = serde_json::from_value(g["logprobs"].clone()).expect("logprobs");
        let ckpt = Checkpoint::from_gguf(bytes).expect("gguf");
        let mut m = load(&ckpt, Precision::F32);
        let all: Vec<u32> = prompt.iter().chain(&chosen).copied().collect();
        let logits = forward(&mut m, &all, 0);
        let v = ckpt.config.vocab_size;
        assert_eq!(want.len(), chosen.len());
        for (i, want) in want.iter().enumerate() {
            let row = prompt.len() - 1 + i;
            let l = &logits[row * v..(row + 1) * v];
            let max = l.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            let lse = max + l.iter().map(|&x| ((x - max) as f64).exp()).sum::<f64>().ln() as f32;
            let got: Vec<f32> = l.iter().map(|&x| x - lse).collect();
            // (llama.cpp's probabilities underflow far in the tail: compare where it has them)
            for (t, (&w, &gv)) in want.iter().zip(&got).enumerate() {
                if w > -20.0 {
                    assert!(
                        (w - gv).abs() < LOGPROB_ABS,
                        "{name} step {i} token {t}: llama.cpp {w}, wgspec {gv}"
                    );
                }
            }
            let argmax = (0..v).max_by(|&a, &b| got[a].total_cmp(&got[b]).then(b.cmp(&a))).unwrap_or(0);
            assert_eq!(argmax as u32, chosen[i], "{name} step {i}: greedy choice");
        }
    }
}

#[test]
fn every_row_of_a_batch_equals_single_token_steps_bit_for_bit() {
    // The adapter's default matmul and the GPU shape (16 lanes, fixed-tree reductions); F16 and
    // Q4_1 blocks read in place.
    for (spec, dtype, gpu) in [
        (TinySpec::llama(), DType::F16, gpu()),
        (TinySpec::qwen2(), DType::F16, gpu()),
        (TinySpec::llama(), DType::Q4_1, gpu_shaped()),
        (TinySpec::qwen2(), DType::F16, gpu_shaped()),
    ] {
        let mut r = rng(50);
        let tiny = TinyModel::random(spec, &mut r);
        let ckpt = Checkpoint::from_gguf(tiny.to_gguf(dtype, &mut r)).expect("gguf");
        let opts = LoadOptions { context: Some(64), ..Default::default() };
        let mut m = Model::load(gpu, &ckpt, &opts, &mut |_| {}).expect("load");
        let vocab = spec.vocab as u32;
        let tokens: Vec<u32> = (0..20).map(|i| (i * 37 + 5) % vocab).collect();
        let v = spec.vocab;
        for (start, n) in [(0usize, 1usize), (3, 5), (9, 9), (0, 20)] {
            forward(&mut m, &tokens[..start.max(1)], 0);
            let batch = forward(&mut m, &tokens[start..start + n], start);
            for i in 0..n {
                let single = forward(&mut m, &tokens[start + i..start + i + 1], start + i);
                let same =
                    single.iter().zip(&batch[i * v..(i + 1) * v]).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "row {i} of a {n}-row pass at {start} differs from the single-token step");
            }
        }
    }
}

/// Pages of a pool of `pool` for sequences reaching `lens` positions: none shared, each
/// sequence's scattered among the pool's and interleaved with the others'.
fn scattered_pages(lens: &[usize], pool: usize, r: &mut impl rand::Rng) -> Vec<Vec<u32>> {
    let mut ids: Vec<u32> = (0..pool as u32).collect();
    rand::seq::SliceRandom::shuffle(&mut ids[..], r);
    let mut free = ids.into_iter();
    let mut pages: Vec<Vec<u32>> = lens.iter().map(|_| Vec::new()).collect();
    // (a page for each sequence in turn, while it needs more)
    for round in 0.. {
        let mut took = false;
        for (p, &n) in pages.iter_mut().zip(lens) {
            if round < n.div_ceil(wgspec::gpu::KV_PAGE) {
                p.push(free.next().expect("a pool as large as the sequences"));
                took = true;
            }
        }
        if !took {
            break;
        }
    }
    pages
}

#[test]
fn trees_of_several_sequences_in_one_paged_pass_equal_each_tree_alone() {
    // A paged pass holds two sequences' token trees beside a chain and a prompt chunk (the trees'
    // rows 29 to 60 of 61, past the 32 a one-sequence tree holds): every node's logits are the bits
    // of its tree run alone after the same prefix (`forward_tree`), every chain row's those of its
    // chain alone; in the one-pass attention and in the GPU shape's split one.
    use wgspec::model::SeqRows;
    const PAGE: usize = wgspec::gpu::KV_PAGE;
    for (spec, gpu) in [(TinySpec::llama(), gpu()), (TinySpec::qwen3(), gpu_shaped())] {
        let mut r = rng(78);
        let tiny = TinyModel::random(spec, &mut r);
        let ckpt = Checkpoint::from_gguf(tiny.to_gguf(DType::F16, &mut r)).expect("gguf");
        let context = Some(192);
        let pool = 704 / PAGE;
        let opts = LoadOptions { context, kv_pages: Some(pool), ..Default::default() };
        let mut m = Model::load(gpu.clone(), &ckpt, &opts, &mut |_| {}).expect("load");
        let mut alone = Model::load(gpu, &ckpt, &LoadOptions { context, ..Default::default() }, &mut |_| {})
            .expect("load");
        let v = spec.vocab;
        let mut tokens =
            |n: usize| -> Vec<u32> { (0..n).map(|_| rand::Rng::gen_range(&mut r, 0..v as u32)).collect() };
        // sequence 0: 60 committed, a tree of 12 at 60; 1: 20, a chain of 10; 2: 30, a chunk of
        // 19 and a tree of 20 rooted at 49 (its last prompt token)
        let seqs = [tokens(61), tokens(30), tokens(50)];
        let nodes = [tokens(11), vec![], tokens(19)];
        let next = tokens(2);
        let mut shape = |n: usize| -> Vec<u32> {
            let mut masks = vec![1u32];
            for i in 1..n {
                let parent = rand::Rng::gen_range(&mut r, 0..i);
                masks.push(masks[parent] | 1 << i);
            }
            masks
        };
        let masks = [shape(12), vec![], shape(20)];
        // (positions each sequence's rows reach: 72, 30, 69)
        let pages = scattered_pages(&[72, 30, 69], pool, &mut r);
        let pages: Vec<&[u32]> = pages.iter().map(|p| &p[..]).collect();
        // the committed prefixes, in chain passes that want no logits (their keys and values)
        for batch in [[(0, 0, 40), (1, 0, 20)], [(0, 40, 60), (2, 0, 30)]] {
            let rows: Vec<SeqRows> = (batch.iter())
                .map(|&(s, a, b)| SeqRows {
                    pages: pages[s],
                    start_pos: a,
                    tokens: &seqs[s][a..b],
                    tree: None,
                    logits: 0,
                })
                .collect();
            let none = pollster::block_on(m.forward_pages(&rows)).expect("prefix pass");
            assert!(none.is_empty());
        }
        // the pass: the chain, the chunk and its tree (its tree's rows want logits, the chunk's
        // none: the rows that do are gathered), the other tree
        let tree_tokens = |s: usize, root: usize| [&seqs[s][root..root + 1], &nodes[s][..]].concat();
        let (t0, t2) = (tree_tokens(0, 60), tree_tokens(2, 49));
        let chunk2 = [&seqs[2][30..49], &t2[..]].concat();
        let pass = [
            SeqRows { pages: pages[1], start_pos: 20, tokens: &seqs[1][20..30], tree: None, logits: 10 },
            SeqRows { pages: pages[2], start_pos: 30, tokens: &chunk2, tree: Some(&masks[2]), logits: 20 },
            SeqRows { pages: pages[0], start_pos: 60, tokens: &t0, tree: Some(&masks[0]), logits: 12 },
        ];
        let got = pollster::block_on(m.forward_pages(&pass)).expect("paged pass with trees");
        assert_eq!(got.len(), 42 * v);
        // each part alone: its prefix, then its chain or tree
        let mut want = Vec::new();
        alone.truncate(0);
        forward(&mut alone, &seqs[1][..20], 0);
        want.extend(forward(&mut alone, &seqs[1][20..30], 20));
        alone.truncate(0);
        forward(&mut alone, &seqs[2][..30], 0);
        forward(&mut alone, &seqs[2][30..49], 30);
        want.extend(pollster::block_on(alone.forward_tree(&t2, &masks[2], 49)).expect("tree alone"));
        alone.truncate(0);
        forward(&mut alone, &seqs[0][..60], 0);
        want.extend(pollster::block_on(alone.forward_tree(&t0, &masks[0], 60)).expect("tree alone"));
        for (row, (g, w)) in got.chunks(v).zip(want.chunks(v)).enumerate() {
            assert!(
                g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{:?}: row {row} of the pass differs from its run alone",
                ckpt.config.arch
            );
        }
        // each tree keeps its deepest node's path (nodes out of place, tree 0's across a page's
        // end): a row after it then has the logits of the prefix and the path run as a chain
        let deepest = |masks: &[u32]| -> Vec<usize> {
            let node = (0..masks.len()).max_by_key(|&i| (masks[i].count_ones(), i)).expect("nodes");
            (0..32).filter(|&j| masks[node] >> j & 1 == 1).collect()
        };
        let (p0, p2) = (deepest(&masks[0]), deepest(&masks[2]));
        let moves = |p: &[usize]| p.iter().enumerate().any(|(d, &n)| n != d);
        assert!(moves(&p0) && moves(&p2), "a path whose nodes are in place already: {p0:?} {p2:?}");
        let keep = [(pages[0], 60, &p0[..]), (pages[2], 49, &p2[..])];
        m.keep_paths_in_pages(&keep).expect("keep the paths");
        let after = |s: usize, root: usize, path: &[usize], tree: &[u32], t: u32| -> Vec<u32> {
            [&seqs[s][..root], &path.iter().map(|&n| tree[n]).collect::<Vec<_>>(), &[t][..]].concat()
        };
        let (c0, c2) = (after(0, 60, &p0, &t0, next[0]), after(2, 49, &p2, &t2, next[1]));
        fn last<'a>(c: &'a [u32], pages: &'a [u32]) -> SeqRows<'a> {
            SeqRows { pages, start_pos: c.len() - 1, tokens: &c[c.len() - 1..], tree: None, logits: 1 }
        }
        let rows = [last(&c2[..], pages[2]), last(&c0[..], pages[0])];
        let got = pollster::block_on(m.forward_pages(&rows)).expect("a pass after the kept paths");
        for (row, (chain, root)) in [(&c2, 49), (&c0, 60)].into_iter().enumerate() {
            alone.truncate(0);
            forward(&mut alone, &chain[..root], 0);
            let want = forward(&mut alone, &chain[root..], root);
            let (g, w) = (&got[row * v..(row + 1) * v], &want[want.len() - v..]);
            let same = g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{:?}: the row after kept path {row} differs from its chain", ckpt.config.arch);
        }
        let too_long: Vec<usize> = (0..40).collect();
        let refused = m.keep_paths_in_pages(&[(pages[0], 0, &too_long[..])]);
        assert!(matches!(refused, Err(Error::InvalidArgument(_))));
        let unordered = m.keep_paths_in_pages(&[(pages[0], 60, &[0, 3, 2][..])]);
        assert!(matches!(unordered, Err(Error::InvalidArgument(_))));
        // a tree that is not one (node 1 without the root), or past its rows: refused
        let bad = [1u32, 2];
        let tokens = &seqs[1][..2];
        let rows = [SeqRows { pages: pages[1], start_pos: 30, tokens, tree: Some(&bad), logits: 2 }];
        assert!(matches!(pollster::block_on(m.forward_pages(&rows)), Err(Error::InvalidArgument(_))));
        let (tokens, tree) = (&seqs[1][..1], Some(&masks[0][..2]));
        let rows = [SeqRows { pages: pages[1], start_pos: 30, tokens, tree, logits: 1 }];
        assert!(matches!(pollster::block_on(m.forward_pages(&rows)), Err(Error::InvalidArgument(_))));
    }
}

#[test]
fn rows_of_several_sequences_in_one_pass_equal_each_sequence_alone() {
    // Sequences of different lengths share passes over a pool of pages, each at its own
    // position, its pages scattered and interleaved with the others': every row's logits are the
    // bits of its sequence run alone. Passes whose rows all want logits, some (each sequence's
    // last few or none: the rows that do are gathered), or none (a pass of keys and values).
    // Llama (the one-pass attention), Qwen3 (per-head norms: the KV written by head_norm) and Gemma 3 (sliding windows, their own RoPE) in the GPU shape
    // (the split attention), f16 and f32 caches; sequences that cross pages.
    use wgspec::model::SeqRows;
    const PAGE: usize = wgspec::gpu::KV_PAGE;
    for (spec, precision, gpu) in [
        (TinySpec::llama(), Precision::Auto, gpu()),
        (TinySpec::qwen3(), Precision::Auto, gpu_shaped()),
        (TinySpec::gemma3(), Precision::F32, gpu_shaped()),
        (TinySpec::qwen2(), Precision::F32, gpu()),
    ] {
        let mut r = rng(77);
        let tiny = TinyModel::random(spec, &mut r);
        let ckpt = Checkpoint::from_gguf(tiny.to_gguf(DType::F16, &mut r)).expect("gguf");
        const CONTEXT: usize = 192;
        let pool = 704 / PAGE;
        let opts =
            LoadOptions { context: Some(CONTEXT), kv_pages: Some(pool), precision, ..Default::default() };
        let mut m = Model::load(gpu, &ckpt, &opts, &mut |_| {}).expect("load");
        assert_eq!(m.kv_pages(), pool);
        let v = spec.vocab;
        let lens = [150usize, 70, 5, 100];
        let seqs: Vec<Vec<u32>> = lens
            .iter()
            .map(|&n| (0..n).map(|_| rand::Rng::gen_range(&mut r, 0..v as u32)).collect())
            .collect();
        // alone: one sequence's passes (the pool's first positions), in passes of 29 rows
        let alone: Vec<Vec<f32>> = seqs
            .iter()
            .map(|s| {
                let mut out = Vec::new();
                for (i, chunk) in s.chunks(29).enumerate() {
                    out.extend(forward(&mut m, chunk, i * 29));
                }
                out
            })
            .collect();
        // the pages each sequence takes, scattered among the pool's and interleaved
        let pages = scattered_pages(&lens, pool, &mut r);
        // passes: each sequence with rows left gives a chunk of its own size, within a pass's
        // most rows (64: passes of up to 59 rows)
        let sizes = [29usize, 1, 17, 12];
        let mut done = [0usize; 4];
        let mut passes = 0;
        while done.iter().zip(&lens).any(|(d, n)| d < n) {
            let mut rows = Vec::new();
            let mut budget = wgspec::model::MAX_BATCH;
            for i in 0..seqs.len() {
                let take = sizes[(i + passes) % 4].min(lens[i] - done[i]).min(budget);
                if take == 0 {
                    continue;
                }
                budget -= take;
                let want = match passes {
                    1 => 0,
                    _ if passes % 2 == 0 => take,
                    _ => [take, 0, 1, 3][(i + passes) % 4].min(take),
                };
                rows.push((i, done[i], take, want));
            }
            let batch: Vec<SeqRows> = rows
                .iter()
                .map(|&(i, at, take, want)| SeqRows {
                    pages: &pages[i],
                    start_pos: at,
                    tokens: &seqs[i][at..at + take],
                    tree: None,
                    logits: want,
                })
                .collect();
            let logits = pollster::block_on(m.forward_pages(&batch)).expect("paged pass");
            let wanted: usize = rows.iter().map(|r| r.3).sum();
            assert_eq!(logits.len(), wanted * v);
            let mut row = 0;
            for &(i, at, take, want) in &rows {
                for p in at + take - want..at + take {
                    let got = &logits[row * v..(row + 1) * v];
                    let want = &alone[i][p * v..(p + 1) * v];
                    assert!(
                        got.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{:?}: sequence {i}'s position {p} in pass {passes} (rows {rows:?}) differs from its run alone",
                        ckpt.config.arch
                    );
                    row += 1;
                }
                done[i] += take;
            }
            passes += 1;
        }
        // bad passes: typed errors naming the problem
        let s = &seqs[0][..4];
        let mut bad = |what: &str, seqs: &[SeqRows]| {
            let got = pollster::block_on(m.forward_pages(seqs)).err();
            let typed = matches!(
                got,
                Some(
                    Error::InvalidArgument(_) | Error::ContextOverflow { .. } | Error::TokenOutOfRange { .. }
                )
            );
            assert!(typed, "{what}: {got:?}");
        };
        let rows = |pages, start_pos, tokens| SeqRows { pages, start_pos, tokens, tree: None, logits: 1 };
        let all: Vec<u32> = (0..(CONTEXT / PAGE) as u32).collect();
        let past_pool = [pool as u32];
        bad("a page past the pool", &[rows(&past_pool, 0, s)]);
        let twice = rows(&[1], 0, s);
        bad("one page written for two sequences", &[twice, twice]);
        bad("rows past the pages", &[rows(&[1], PAGE - 2, s)]);
        bad("rows past the context", &[rows(&all, CONTEXT - 2, s)]);
        let over = [1u32; wgspec::model::MAX_BATCH + 1];
        bad("rows past a pass's", &[rows(&all, 0, &over)]);
        bad("no rows", &[SeqRows { logits: 0, ..rows(&[1], 0, &[]) }]);
        let past_vocabulary = [v as u32];
        bad("a token past the vocabulary", &[rows(&[1], 0, &past_vocabulary)]);
        bad("the logits of more rows than it has", &[SeqRows { logits: 5, ..rows(&[1], 0, s) }]);
    }
}

#[test]
fn a_prefill_leaves_the_cache_a_forward_pass_leaves() {
    // A prefill runs the layers without the output projection; what follows it must see the
    // very cache (and hidden states) a full pass leaves: bit for bit.
    let mut r = rng(51);
    let spec = TinySpec::qwen2();
    let tiny = TinyModel::random(spec, &mut r);
    let ckpt = Checkpoint::from_gguf(tiny.to_gguf(DType::Q4_1, &mut r)).expect("gguf");
    let mut m = load(&ckpt, Precision::Auto);
    let vocab = spec.vocab as u32;
    let tokens: Vec<u32> = (0..40).map(|i| (i * 53 + 11) % vocab).collect();
    forward(&mut m, &tokens[..32], 0);
    let want = forward(&mut m, &tokens[32..37], 32)[4 * spec.vocab..].to_vec();
    let want_next = forward(&mut m, &tokens[37..40], 37);
    // the hidden states a pass leaves (what heads draft from), of a 4-row pass at 32
    let hidden = |m: &Model| -> Vec<u8> {
        let g = m.gpu();
        let raw = &m.hidden_buffers().0.raw;
        pollster::block_on(g.submit_and_read(g.encoder(), raw, 0, (4 * spec.dim * 4) as u64)).expect("read")
    };
    m.truncate(32);
    forward(&mut m, &tokens[32..36], 32);
    let want_hidden = hidden(&m);
    m.truncate(0);
    // the last pass's logits would equal these if the prefill left them alone: make them stale
    forward(&mut m, &tokens[20..21], 0);
    m.prefill(&tokens[..32], 0).expect("prefill");
    m.prefill(&tokens[32..36], 32).expect("prefill");
    pollster::block_on(m.sync()).expect("sync");
    assert_eq!(hidden(&m), want_hidden, "a prefill leaves the hidden states a pass leaves");
    let got = forward(&mut m, &tokens[36..37], 36);
    assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "the row after a prefill");
    let next = forward(&mut m, &tokens[37..40], 37);
    assert!(next.iter().zip(&want_next).all(|(a, b)| a.to_bits() == b.to_bits()), "the rows after");
    // a prefill past the context is refused as a forward pass is
    assert!(m.prefill(&tokens[..5], 60).is_err());
}

#[test]
fn every_node_of_a_token_tree_equals_its_path_run_alone_bit_for_bit() {
    // Both architectures (qwen2: biases, GQA), both kernel shapes; trees of several shapes at a
    // position past 0, so that nodes see the cache before the pass and their ancestors. The GPU
    // shape's trees start at 62, so that their nodes' keys straddle the split attention's first
    // chunk boundary (64).
    for (spec, dtype, gpu, past) in [
        (TinySpec::llama(), DType::Q4_1, gpu(), 7u32),
        (TinySpec::qwen2(), DType::F16, gpu_shaped(), 62),
        (TinySpec::qwen3(), DType::F16, gpu(), 7),
        // (Gemma: tree nodes across its local layers' window of 5 keys)
        (TinySpec::gemma3(), DType::F16, gpu_shaped(), 7),
    ] {
        let mut r = rng(52);
        let tiny = TinyModel::random(spec, &mut r);
        let ckpt = Checkpoint::from_gguf(tiny.to_gguf(dtype, &mut r)).expect("gguf");
        let opts = LoadOptions { context: Some(128), ..Default::default() };
        let mut m = Model::load(gpu, &ckpt, &opts, &mut |_| {}).expect("load");
        let (v, vocab) = (spec.vocab, spec.vocab as u32);
        let prompt: Vec<u32> = (0..past).map(|i| (i * 41 + 3) % vocab).collect();
        // (a pass holds at most 32 rows)
        let run_prompt = |m: &mut Model| {
            for (i, chunk) in prompt.chunks(32).enumerate() {
                forward(m, chunk, 32 * i);
            }
        };
        let start = prompt.len();
        let mut trees = vec![TokenTree::chain(9, &[4, 8, 15])];
        let mut wide = TokenTree::new(9);
        for (i, path) in [[4u32, 8, 15, 16], [4, 8, 23, 42], [4, 5, 6, 7], [11, 12, 13, 14], [4, 8, 15, 99]]
            .iter()
            .enumerate()
        {
            wide.insert(&path[..4 - i % 2], 32);
        }
        trees.push(wide);
        let mut full = TokenTree::new(1); // 32 nodes: every mask bit in use
        for i in 0..31u32 {
            full.insert(&[i % 3, i, i * 7 % vocab], 32);
        }
        assert_eq!(full.len(), 32);
        trees.push(full);
        for tree in &trees {
            run_prompt(&mut m);
            let nodes =
                pollster::block_on(m.forward_tree(tree.tokens(), &tree.ancestors(), start)).expect("tree");
            let anc = tree.ancestors();
            for node in 0..tree.len() {
                let path: Vec<u32> =
                    (0..tree.len()).filter(|&j| anc[node] >> j & 1 == 1).map(|j| tree.tokens()[j]).collect();
                let alone = forward(&mut m, &path, start);
                let last = &alone[(path.len() - 1) * v..];
                let same = last
                    .iter()
                    .zip(&nodes[node * v..(node + 1) * v])
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "node {node} of a {}-node tree differs from its path {path:?} alone",
                    tree.len()
                );
            }
            // Keeping a path leaves the cache a chain would: the next step's logits are the chain's.
            let deepest = (0..tree.len()).max_by_key(|&i| anc[i].count_ones()).expect("nodes");
            let path: Vec<usize> = (0..tree.len()).filter(|&j| anc[deepest] >> j & 1 == 1).collect();
            let tokens: Vec<u32> = path.iter().map(|&j| tree.tokens()[j]).collect();
            pollster::block_on(m.forward_tree(tree.tokens(), &anc, start)).expect("tree");
            m.keep_path(start, &path).expect("keep");
            assert_eq!(m.len(), start + path.len());
            let kept = forward(&mut m, &[5], start + path.len());
            forward(&mut m, &tokens, start);
            let chain = forward(&mut m, &[5], start + path.len());
            assert!(
                kept.iter().zip(&chain).all(|(a, b)| a.to_bits() == b.to_bits()),
                "after keep_path {path:?}"
            );
        }
        // A chain pass after a tree pass is a chain again (the tree flag is per pass).
        let batch = forward(&mut m, &prompt[..7], 0);
        let single = forward(&mut m, &prompt[6..7], 6);
        assert!(single.iter().zip(&batch[6 * v..]).all(|(a, b)| a.to_bits() == b.to_bits()));
        // Malformed trees and paths are refused.
        for bad in [vec![1u32, 0b11, 0b101, 0b1000], vec![0b11, 0b11], vec![1, 0b10]] {
            let err = pollster::block_on(m.forward_tree(&[1, 2, 3, 4][..bad.len()], &bad, 0)).err();
            assert!(matches!(err, Some(Error::InvalidArgument(_))), "{bad:?}: {err:?}");
        }
        run_prompt(&mut m);
        pollster::block_on(m.forward_tree(&[1, 2, 3], &[1, 0b11, 0b101], start)).expect("tree");
        assert!(m.keep_path(start, &[0, 2, 1]).is_err() && m.keep_path(start, &[1, 2]).is_err());
        assert!(m.keep_path(start, &[0, 5]).is_err(), "past the pass");
    }
}

/// A file in memory that records every read (offset, length).
struct Recorded {
    bytes: Vec<u8>,
    reads: std::sync::Arc<std::sync::Mutex<Vec<(u64, usize)>>>,
}

impl Source for Recorded {
    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> wgspec::Result<()> {
        self.reads.lock().expect("reads").push((offset, buf.len()));
        self.bytes.read_at(offset, buf)
    }
}

#[test]
fn weights_streamed_in_small_reads_give_identical_logits() {
    // Every stored type (and the f32 expansion), GGUF and safetensors (whose llama q/k rows are
    // reordered across each head; streamed from three shards): loaded in reads of a few rows, the logits must equal those of
    // a load that reads each matrix at once, bit for bit, and no read may exceed its bound.
    let k_spec = TinySpec { dim: 256, ffn: 256, heads: 4, kv_heads: 2, ..TinySpec::qwen2() };
    let cases: Vec<(TinySpec, Option<DType>, Precision)> = vec![
        (TinySpec::llama(), Some(DType::F32), Precision::Auto),
        (TinySpec::qwen2(), Some(DType::F16), Precision::Auto),
        (TinySpec::llama(), Some(DType::Q8_0), Precision::Auto),
        (TinySpec::qwen2(), Some(DType::Q4_0), Precision::F32),
        (TinySpec::llama(), Some(DType::Q4_1), Precision::Auto),
        (TinySpec::qwen2(), Some(DType::Q5_0), Precision::Auto),
        (k_spec, Some(DType::Q4_K), Precision::Auto),
        (k_spec, Some(DType::Q5_K), Precision::Auto),
        (k_spec, Some(DType::Q6_K), Precision::Auto),
        (TinySpec::llama(), None, Precision::Auto), // safetensors, BF16
    ];
    let read_bytes = 1024;
    for (spec, dtype, precision) in cases {
        let what = format!("{dtype:?} {precision:?} qwen2={}", spec.qwen2);
        let mut r = rng(57);
        let tiny = TinyModel::random(spec, &mut r);
        let reads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        // safetensors: whole from one file, streamed from three shards
        let open = |reads: &std::sync::Arc<_>, shards: usize| -> Checkpoint {
            let mut r = rng(58);
            let recorded = |bytes| -> Box<dyn Source> {
                Box::new(Recorded { bytes, reads: std::sync::Arc::clone(reads) })
            };
            match dtype {
                Some(dtype) => {
                    Checkpoint::from_gguf_source(recorded(tiny.to_gguf(dtype, &mut r))).expect("gguf")
                }
                None => {
                    let (config, st) = tiny.to_safetensors_shards(DType::BF16, shards);
                    let st = st.into_iter().map(recorded).collect();
                    Checkpoint::from_safetensors_sources(&config, st).expect("safetensors")
                }
            }
        };
        let tokens = [7u32, 299 % spec.vocab as u32, 0, 150, 64, 3];
        let whole = forward(&mut load(&open(&reads, 1), precision), &tokens, 0);
        let ckpt = open(&reads, 3);
        reads.lock().expect("reads").clear();
        let opts = LoadOptions { context: Some(64), precision, read_bytes, ..Default::default() };
        let mut events = Vec::new();
        let mut streamed = Model::load(gpu(), &ckpt, &opts, &mut |p| events.push(p)).expect("load streamed");
        // Progress per batch: bytes grow to the weights' total, tensors to theirs, never back.
        let last = *events.last().expect("progress");
        let stored: u64 =
            TensorTable::new(&ckpt.config).iter().filter_map(|t| ckpt.stored_bytes(&t.name)).sum();
        assert!(
            last.bytes_done == stored && last.bytes_total == stored,
            "{what}: {last:?}, weights {stored}"
        );
        assert_eq!(last.tensors_done, last.tensors_total, "{what}");
        assert!(events
            .windows(2)
            .all(|w| w[1].bytes_done >= w[0].bytes_done && w[1].tensors_done >= w[0].tensors_done));
        assert!(
            events.len() > 4 * (2 + 4 * ckpt.config.n_layers),
            "{what}: {} progress events",
            events.len()
        );
        let got = forward(&mut streamed, &tokens, 0);
        assert!(
            got.iter().zip(&whole).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{what}: streaming changed the logits"
        );
        // A batch is at most read_bytes or 8 rows; a q/k batch of the halves layout spans at
        // most one head's rows of the file.
        let c = &ckpt.config;
        let widest =
            dtype.unwrap_or(DType::BF16).bytes_for(c.ffn_dim.max(c.dim) as u64).expect("row") as usize;
        let bound = (read_bytes as usize).max(8 * widest).max(c.head_dim * widest);
        let reads = reads.lock().expect("reads");
        let largest = reads.iter().map(|r| r.1).max().unwrap_or(0);
        assert!(largest <= bound, "{what}: a read of {largest} bytes, bound {bound}");
        let matrices = 2 + 4 * c.n_layers; // embedding, qkv, wo, gate|up, down, output (or tied)
        assert!(reads.len() > 4 * matrices, "{what}: only {} reads: not streamed", reads.len());
    }
}

#[test]
fn matrices_split_across_buffers_give_identical_logits() {
    // A 4 KiB cap splits the 300-row tied embedding/output into 8-row chunks (f32) and every
    // other matrix too; each output column is computed the same way, so the bits must not change.
    let mut r = rng(55);
    let tiny = TinyModel::random(TinySpec::llama(), &mut r);
    for dtype in [DType::F32, DType::Q8_0] {
        let ckpt = Checkpoint::from_gguf(tiny.to_gguf(dtype, &mut r)).expect("gguf");
        let tokens = [7u32, 299, 0, 150, 64, 3];
        let whole = forward(&mut load(&ckpt, Precision::Auto), &tokens, 0);
        let opts = LoadOptions { context: Some(64), max_chunk_bytes: Some(4096), ..Default::default() };
        let mut split = Model::load(gpu(), &ckpt, &opts, &mut |_| {}).expect("load split");
        let got = forward(&mut split, &tokens, 0);
        assert!(
            got.iter().zip(&whole).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{dtype:?}: split changed the logits"
        );
    }
    // In the GPU shape a matrix's lanes follow the whole matrix, not its chunks: a 5,000-row
    // output (16 lanes: 313 column tiles) cut into chunks of 488 rows (each alone would take 32)
    let spec = TinySpec { vocab: 5000, dim: 576, heads: 9, kv_heads: 3, ffn: 256, ..TinySpec::llama() };
    let wide = TinyModel::random(spec, &mut r);
    let ckpt = Checkpoint::from_gguf(wide.to_gguf(DType::Q8_0, &mut r)).expect("gguf");
    let tokens = [7u32, 4999, 0, 150];
    let opts = |cap| LoadOptions { context: Some(64), max_chunk_bytes: cap, ..Default::default() };
    let whole =
        forward(&mut Model::load(gpu_shaped(), &ckpt, &opts(None), &mut |_| {}).expect("load"), &tokens, 0);
    let mut split = Model::load(gpu_shaped(), &ckpt, &opts(Some(300_000)), &mut |_| {}).expect("load split");
    let got = forward(&mut split, &tokens, 0);
    assert!(
        got.iter().zip(&whole).all(|(a, b)| a.to_bits() == b.to_bits()),
        "GPU shape: split changed the logits"
    );
    let opts = LoadOptions { max_chunk_bytes: Some(64), ..Default::default() };
    let ckpt = Checkpoint::from_gguf(tiny.to_gguf(DType::F32, &mut r)).expect("gguf");
    let err = Model::load(gpu(), &ckpt, &opts, &mut |_| {}).err().expect("eight rows cannot fit");
    assert!(matches!(err, Error::GpuLimit(_)), "{err}");
}

#[test]
fn argmax_on_the_gpu_matches_the_logits() {
    let mut r = rng(60);
    let tiny = TinyModel::random(TinySpec::qwen2(), &mut r);
    let ckpt = Checkpoint::from_gguf(tiny.to_gguf(DType::F32, &mut r)).expect("gguf");
    let mut m = load(&ckpt, Precision::Auto);
    let tokens = [1u32, 2, 3, 200, 100, 50];
    let logits = forward(&mut m, &tokens, 0);
    let ids = pollster::block_on(m.forward_argmax(&tokens, 0)).expect("argmax");
    let want: Vec<u32> = logits.chunks(tiny.spec.vocab).map(wgspec::sampling::argmax).collect();
    assert_eq!(ids, want);
}

#[test]
fn an_uncaptured_gpu_error_fails_the_operation_not_the_process() {
    // A device of its own: the error must not reach other tests sharing `gpu()`.
    let g = std::sync::Arc::new(pollster::block_on(wgspec::gpu::Gpu::new()).expect("gpu"));
    let too_big = (g.limits.max_buffer_size + 4).next_multiple_of(4);
    let _buffer = g.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("larger than the device allows"),
        size: too_big,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    // wgpu's default handler would have panicked; the error waits for the next check instead.
    let err = g.take_error().expect_err("the allocation failed");
    assert!(matches!(&err, Error::Gpu(m) if !m.is_empty()), "{err}");
    g.take_error().expect("reported once");
    // The device still works: a model loads and runs on it.
    let mut r = rng(72);
    let ckpt =
        Checkpoint::from_gguf(TinyModel::random(TinySpec::llama(), &mut r).to_gguf(DType::Q8_0, &mut r))
            .expect("gguf");
    let mut m = Model::load(g, &ckpt, &LoadOptions::default(), &mut |_| {}).expect("load");
    assert_eq!(pollster::block_on(m.forward_argmax(&[1, 2, 3], 0)).expect("forward").len(), 3);
}

#[test]
fn bad_model_input_gives_typed_errors() {
    let mut r = rng(70);
    let spec = TinySpec::llama();
    let tiny = TinyModel::random(spec, &mut r);

    // A missing tensor.
    let mut missing = TinyModel::random(spec, &mut r);
    missing.tensors.retain(|t| t.name != "blk.1.ffn_up.weight");
    let ckpt = Checkpoint::from_gguf(missing.to_gguf(DType::F32, &mut r)).expect("header parses");
    let err = Model::load(gpu(), &ckpt, &LoadOptions::default(), &mut |_| {}).err().expect("must fail");
    assert!(matches!(&err, Error::MissingTensor { name } if name == "blk.1.ffn_up.weight"), "{err}");

    // A mis-shaped tensor.
    let mut bad = TinyModel::random(spec, &mut r);
    for t in bad.tensors.iter_mut().filter(|t| t.name == "blk.0.attn_k.weight") {
        t.shape = vec![t.shape[0] / 2, t.shape[1]];
        t.values.truncate(t.values.len() / 2);
    }
    let ckpt = Checkpoint::from_gguf(bad.to_gguf(DType::F32, &mut r)).expect("header parses");
    let err = Model::load(gpu(), &ckpt, &LoadOptions::default(), &mut |_| {}).err().expect("must fail");
    assert!(matches!(&err, Error::TensorShape { name, .. } if name == "blk.0.attn_k.weight"), "{err}");

    // A GPU memory budget is checked before anything is allocated: the bill is exact to the byte.
    let ckpt = Checkpoint::from_gguf(tiny.to_gguf(DType::Q8_0, &mut r)).expect("gguf");
    let load = |max_memory| {
        Model::load(gpu(), &ckpt, &LoadOptions { max_memory, ..Default::default() }, &mut |_| {})
    };
    let need = load(None).expect("load").memory_bytes();
    let m = load(Some(need)).expect("a budget of exactly what it needs");
    assert!(
        need > m.weight_bytes() && m.weight_bytes() > 0,
        "{need} bytes for {} of weights",
        m.weight_bytes()
    );
    let err = load(Some(need - 1)).err().expect("one byte short");
    assert!(matches!(&err, Error::GpuLimit(msg) if msg.contains("budget")), "{err}");

    // A weight that is NaN or infinite, stored as F32 and F16 (kept as stored) and as BF16 in
    // safetensors: refused, naming the tensor and the element.
    for (value, dtype) in
        [(f32::NAN, DType::F32), (f32::INFINITY, DType::F16), (f32::NEG_INFINITY, DType::BF16)]
    {
        let mut poisoned = TinyModel::random(spec, &mut r);
        for t in poisoned.tensors.iter_mut().filter(|t| t.name == "blk.1.ffn_down.weight") {
            t.values[37] = value;
        }
        let ckpt = if dtype == DType::BF16 {
            let (config, st) = poisoned.to_safetensors(dtype);
            Checkpoint::from_safetensors(&config, vec![st]).expect("header parses")
        } else {
            Checkpoint::from_gguf(poisoned.to_gguf(dtype, &mut r)).expect("header parses")
        };
        let err = Model::load(gpu(), &ckpt, &LoadOptions::default(), &mut |_| {}).err().expect("must fail");
        let msg = err.to_string();
        assert!(
            msg.contains("blk.1.ffn_down.weight") && msg.contains("element 37 is not finite"),
            "{dtype}: {msg}"
        );
    }

    // Finite weights whose logits overflow: sampling refuses the row instead of drawing from NaNs.
    let mut huge = TinyModel::random(spec, &mut r);
    for t in huge.tensors.iter_mut().filter(|t| t.name == "output_norm.weight" || t.name == "output.weight") {
        t.values.iter_mut().for_each(|v| *v = 3e38);
    }
    let ckpt = Checkpoint::from_gguf(huge.to_gguf(DType::F32, &mut r)).expect("header parses");
    let mut m = Model::load(gpu(), &ckpt, &LoadOptions::default(), &mut |_| {}).expect("finite weights load");
    let sampling =
        wgspec::sampling::SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 1 };
    let opts = GenerateOptions { max_tokens: 2, sampling, stop_tokens: vec![] };
    let mut go_on = |_, _| true;
    let run = wgspec::speculative::generate(
        &mut m,
        wgspec::speculative::Drafter::None,
        &[1, 2],
        &opts,
        KPolicy::default(),
        &mut go_on,
    );
    let err = pollster::block_on(run).expect_err("must fail");
    assert!(matches!(&err, Error::NonFinite(m) if m.contains("row 0")), "{err}");

    // Metadata checked as a whole before anything is allocated: a present key of the wrong type or
    // sign is an error naming it (never a silent default), and derived widths are bounded.
    use wgspec::loader::gguf::Value;
    let s = |v: &str| Value::String(v.into());
    for (overrides, key, says) in [
        (vec![("llama.context_length", s("4096"))], "llama.context_length", "found string"),
        (vec![("llama.context_length", Value::I32(-5))], "llama.context_length", "found i32 -5"),
        (vec![("llama.rope.freq_base", s("1e4"))], "llama.rope.freq_base", "found string"),
        (vec![("llama.attention.head_count_kv", Value::I64(-2))], "llama.attention.head_count_kv", "-2"),
        (vec![("llama.rope.scaling.type", Value::U32(1))], "llama.rope.scaling.type", "expected a string"),
        (
            vec![
                ("llama.attention.head_count", Value::U32(4096)),
                ("llama.attention.key_length", Value::U32(4096)),
            ],
            "model config",
            "q width 16777216",
        ),
        (vec![("llama.context_length", Value::U32(0))], "model config", "context of 0"),
    ] {
        let err = Checkpoint::from_gguf(tiny.to_gguf_with(DType::F32, &mut r, &overrides)).err().expect(key);
        assert!(
            matches!(&err, Error::Metadata { key: k, message } if k == key && message.contains(says)),
            "{overrides:?}: {err}"
        );
    }

    // An unsupported architecture.
    let bytes = tiny.to_gguf(DType::F32, &mut r);
    let renamed = replace_once(&bytes, b"llama", b"mamba");
    let err = Checkpoint::from_gguf(renamed).err().expect("must fail");
    assert!(matches!(&err, Error::UnsupportedArchitecture(a) if a == "mamba"), "{err}");
    let (config, st) = tiny.to_safetensors(DType::F32);
    let config = String::from_utf8(config).expect("utf8").replace("LlamaForCausalLM", "GPT2LMHeadModel");
    let err = Checkpoint::from_safetensors(config.as_bytes(), vec![st]).err().expect("must fail");
    assert!(matches!(&err, Error::UnsupportedArchitecture(_)), "{err}");

    // Positions past the context, tokens outside the vocabulary, empty and oversized passes.
    let ckpt = Checkpoint::from_gguf(tiny.to_gguf(DType::F32, &mut r)).expect("gguf");
    let mut m =
        Model::load(gpu(), &ckpt, &LoadOptions { context: Some(16), ..Default::default() }, &mut |_| {})
            .expect("load");
    let err = pollster::block_on(m.forward(&[1; 17], 0)).expect_err("must fail");
    assert!(
        matches!(err, Error::ContextOverflow { needed: 17, context: 16 } | Error::InvalidArgument(_)),
        "{err}"
    );
    pollster::block_on(m.forward(&[1; 10], 0)).expect("fits");
    let err = pollster::block_on(m.forward(&[1; 7], 10)).expect_err("must fail");
    assert!(matches!(err, Error::ContextOverflow { needed: 17, context: 16 }), "{err}");
    let err = pollster::block_on(m.forward(&[spec.vocab as u32], 0)).expect_err("must fail");
    assert!(matches!(err, Error::TokenOutOfRange { .. }), "{err}");
    let err = pollster::block_on(m.forward(&[], 0)).expect_err("must fail");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    let err = pollster::block_on(m.forward(&[1; wgspec::model::MAX_BATCH + 1], 0)).expect_err("must fail");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    let err = pollster::block_on(m.forward(&[1], 12)).expect_err("a gap in the cache");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");

    // A prompt longer than the context.
    let opts = GenerateOptions { max_tokens: 4, sampling: Default::default(), stop_tokens: vec![] };
    let err = common::plain(&mut m, &[5; 20], &opts).expect_err("must fail");
    assert!(matches!(err, Error::ContextOverflow { needed: 21, context: 16 }), "{err}");
}

#[test]
fn generation_stops_at_the_context_end_and_on_stop_tokens() {
    let mut r = rng(80);
    let tiny = TinyModel::random(TinySpec::llama(), &mut r);
    let ckpt = Checkpoint::from_gguf(tiny.to_gguf(DType::F32, &mut r)).expect("gguf");
    let mut m =
        Model::load(gpu(), &ckpt, &LoadOptions { context: Some(12), ..Default::default() }, &mut |_| {})
            .expect("load");
    let opts = GenerateOptions { max_tokens: 100, sampling: Default::default(), stop_tokens: vec![] };
    let g = common::plain(&mut m, &[1, 2, 3], &opts).expect("generate");
    // 3 prompt positions + 9 fed tokens fill 12 positions; the 10th token is produced but not fed.
    assert_eq!(g.tokens.len(), 10);
    assert_eq!(g.finish, wgspec::generation::FinishReason::Length);
    // The same greedy run with its 4th token as a stop token ends there.
    let stop = g.tokens[3];
    let first = g.tokens.iter().position(|&t| t == stop).expect("present");
    let opts = GenerateOptions { stop_tokens: vec![stop], ..opts };
    let h = common::plain(&mut m, &[1, 2, 3], &opts).expect("generate");
    assert_eq!(h.tokens, g.tokens[..=first]);
    assert_eq!(h.finish, wgspec::generation::FinishReason::Stop);
}

fn replace_once(hay: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let i = hay.windows(from.len()).position(|w| w == from).expect("present");
    let mut out = hay.to_vec();
    out[i..i + from.len()].copy_from_slice(to);
    out
}

#[test]
fn a_model_load_compiles_its_own_kernels_and_no_others() {
    // Kernels compile on first use: a new device that loads a Q4_0 model compiles the kernels
    // its passes use while it loads (none during a forward), and no other weight format's
    // kernels nor the benchmarks' (a browser paid about 17 s compiling every kernel before each
    // load). Its own device: the shared ones have run other tests.
    use wgspec::gpu::Kernel;
    let gpu = std::sync::Arc::new(pollster::block_on(Gpu::new()).expect("gpu"));
    let mut r = rng(71);
    let tiny = TinyModel::random(TinySpec::llama(), &mut r);
    let ckpt = Checkpoint::from_gguf(tiny.to_gguf(DType::Q4_0, &mut r)).expect("gguf");
    let mut m = load_on(gpu.clone(), &ckpt, Precision::Auto);
    let loaded = gpu.compiled_kernels();
    assert!(loaded.contains(&Kernel::Matmul(DType::Q4_0)), "{loaded:?}");
    for k in &loaded {
        match k {
            Kernel::Matmul(d) | Kernel::Embed(d) => {
                assert!(matches!(d, DType::Q4_0 | DType::F32), "{k:?} compiled for a Q4_0 model: {loaded:?}")
            }
            Kernel::BenchCopy | Kernel::BenchFma => panic!("{k:?} compiled by a model load"),
            _ => {}
        }
    }
    assert!(
        loaded.len() < Kernel::all().len() / 2,
        "{} of {} kernels: {loaded:?}",
        loaded.len(),
        Kernel::all().len()
    );
    forward(&mut m, &[1, 2, 3], 0);
    assert_eq!(gpu.compiled_kernels(), loaded, "a forward pass compiled a kernel");
}

/// The shape facts a pass's recorded ops give (`Model::shapes`): one per dispatch, as the GPU
/// runs them (a GPU's wide matmul pipeline for passes of more than 4 rows, the argmax in two
/// dispatches of many workgroups, the split attention's loop over the cache), nothing run.
#[test]
fn shape_facts_follow_the_recorded_ops() {
    let mut r = rng(61);
    let spec = TinySpec { vocab: 3000, ..TinySpec::llama() };
    let tiny = TinyModel::random(spec, &mut r);
    let ckpt = Checkpoint::from_gguf(tiny.to_gguf(DType::Q8_0, &mut r)).expect("gguf");
    for gpu in [gpu(), gpu_shaped()] {
        // (a GPU's own default is the GPU shape: 4-row groups and a wide pipeline)
        let shaped = gpu.matmul_rows() == 4;
        let m = load_on(gpu.clone(), &ckpt, Precision::Auto);
        let (step, verify) = (m.shapes(1, 0), m.shapes(5, 0));
        assert_eq!(step.len(), verify.len(), "the same dispatches in either pass");
        let layers = spec.layers;
        let per_layer = m.dispatches_per_layer();
        assert!((5..=7).contains(&per_layer), "{per_layer} dispatches per layer");
        // embedding, the layers, the output, the argmax's two
        assert_eq!(step.len(), 1 + layers * per_layer + 1 + 2, "{step:?}");
        for s in step.iter().chain(&verify) {
            assert!(s.workgroups > 0 && s.serial_iterations > 0 && s.bytes > 0, "{s:?}");
            assert!(matches!(s.invocations, 64 | 256), "{s:?}");
        }
        // the argmax: a workgroup per slice of 1024 logits and row, then one per row
        let argmax: Vec<_> = step.iter().filter(|s| s.kernel == "Argmax").collect();
        assert_eq!(argmax.iter().map(|s| s.workgroups).collect::<Vec<_>>(), [3, 1]);
        assert_eq!(argmax[0].serial_iterations, 16 + 6);
        let argmax5: Vec<u64> =
            verify.iter().filter(|s| s.kernel == "Argmax").map(|s| s.workgroups).collect();
        assert_eq!(argmax5, [15, 5]);
        let matmul = |shapes: &[wgspec::gpu::OpShape]| {
            shapes.iter().filter(|s| s.kernel.starts_with("Matmul")).map(|s| s.workgroups).sum::<u64>()
        };
        let nine = m.shapes(9, 0);
        if shaped {
            // a 9-row pass in one group of the wide pipeline's 16 rows, as a step in one of 4
            assert_eq!(matmul(&nine), matmul(&step), "the wide pipeline");
        } else {
            // groups of 8 rows on a CPU adapter: two for 9 rows
            assert_eq!(matmul(&nine), 2 * matmul(&step));
        }
        // a pass's bytes grow with its rows (activations), its weights read once
        let bytes = |shapes: &[wgspec::gpu::OpShape]| shapes.iter().map(|s| s.bytes).sum::<u64>();
        assert!(bytes(&verify) > bytes(&step));
    }
}

/// A model's memory bill (Model::plan) is what its load allocates: every buffer the load creates
/// but uniforms and staging is counted by the device, and the two agree to the byte, for stored
/// and f32 weights, both KV cache types, both attention shapes and several contexts.
#[test]
fn a_load_allocates_what_its_bill_says() {
    let mut r = rng(0x5ca1ab1e);
    let qwen2 = TinyModel::random(TinySpec { vocab: 3000, ..TinySpec::qwen2() }, &mut r);
    // (Qwen3: its raw q|k|v scratch and per-head norms; Gemma 3: its post-norm scratch and
    // local RoPE table too)
    let qwen3 = TinyModel::random(TinySpec { vocab: 3000, ..TinySpec::qwen3() }, &mut r);
    let gemma3 = TinyModel::random(TinySpec { vocab: 3000, ..TinySpec::gemma3() }, &mut r);
    let shapes = [
        KernelShape::default(),
        KernelShape { matmul_lanes: Some(16), split_attention: Some(true), shuffle_loads: None },
    ];
    for shape in shapes {
        let g = std::sync::Arc::new(pollster::block_on(Gpu::with_shape(shape)).expect("a fresh device"));
        for (tiny, dtype, precision, context) in [
            (&qwen2, DType::Q8_0, Precision::Auto, 64),
            (&qwen2, DType::Q4_0, Precision::Auto, 200),
            (&qwen2, DType::F16, Precision::F32, 128),
            (&qwen3, DType::Q8_0, Precision::Auto, 64),
            (&gemma3, DType::Q4_0, Precision::Auto, 64),
        ] {
            let ckpt = Checkpoint::from_gguf(tiny.to_gguf(dtype, &mut r)).expect("gguf");
            let opts = LoadOptions { context: Some(context), precision, ..Default::default() };
            let before = g.billed_bytes();
            let m = Model::load(g.clone(), &ckpt, &opts, &mut |_| {}).expect("load");
            let made = g.billed_bytes() - before;
            let what =
                format!("{:?} {shape:?} {dtype:?} {precision:?} context {context}", tiny.spec.arch_of());
            assert_eq!(made, m.memory_bytes(), "{what}: allocated, billed");
            // a forward allocates nothing the bill missed
            let mut m = m;
            pollster::block_on(m.forward_argmax(&[1, 2, 3], 0)).expect("forward");
            assert_eq!(g.billed_bytes() - before, m.memory_bytes(), "{what}: after a forward");
        }
    }
}

//! Real SmolLM2-135M and Gemma-3-270m (fetched by `./build.sh models`) against llama.cpp goldens
//! (`tests/goldens/smollm2-135m.json`, `gemma-3-270m.json`, made by `scripts/goldens`).

mod common;

use common::goldens::{goldens, model_file, Goldens};
use common::gpu;
use wgspec::generation::GenerateOptions;
use wgspec::model::{Checkpoint, LoadOptions, Model, Precision};

fn checkpoint(g: &Goldens) -> Checkpoint {
    let bytes = std::fs::read(model_file(&g.model.file, "smollm2-135m")).expect("read model");
    Checkpoint::from_gguf(bytes).expect("parse SmolLM2")
}

fn greedy(model: &mut Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let opts = GenerateOptions { max_tokens: n, sampling: Default::default(), stop_tokens: vec![] };
    common::plain(model, prompt, &opts).expect("generate").tokens
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[test]
fn smollm2_greedy_equals_llama_cpp_on_f32_weights() {
    // Q4_1 blocks expanded exactly to f32 are the weights of llama.cpp's F32 golden file.
    let g = goldens();
    let ckpt = checkpoint(&g);
    let opts = LoadOptions { context: Some(256), precision: Precision::F32, ..Default::default() };
    let mut model = Model::load(gpu(), &ckpt, &opts, &mut |_| {}).expect("load");
    for case in &g.cases {
        let got = greedy(&mut model, &case.prompt_tokens, case.f32_tokens.len());
        assert_eq!(got, case.f32_tokens, "prompt {:?}", case.prompt);
    }
}

#[test]
fn smollm2_greedy_on_f16_weights_shares_a_long_prefix_with_llama_cpp_q4_1() {
    // llama.cpp's Q4_1 kernels quantize activations to 8 bits, so even its own F32 run leaves its
    // Q4_1 transcript after a few tokens. Ours (the Q4_1 blocks dequantised exactly inside the
    // kernel, f32 arithmetic) must agree with the Q4_1 transcript at least as long as llama.cpp's
    // F32 run does, up to TOKENS, and equal llama.cpp's F32 transcript: the weights are the same.
    const TOKENS: usize = 24;
    let g = goldens();
    let ckpt = checkpoint(&g);
    let opts = LoadOptions { context: Some(256), precision: Precision::Auto, ..Default::default() };
    let mut model = Model::load(gpu(), &ckpt, &opts, &mut |_| {}).expect("load");
    for case in g.cases.iter().take(4) {
        let got = greedy(&mut model, &case.prompt_tokens, TOKENS);
        let llama_cpp_own = common_prefix(&case.f32_tokens, &case.q4_1_tokens).min(TOKENS);
        let ours = common_prefix(&got, &case.q4_1_tokens);
        assert_eq!(
            got[..],
            case.f32_tokens[..TOKENS],
            "prompt {:?}: Q4_1 blocks vs F32 goldens",
            case.prompt
        );
        assert!(
            ours >= llama_cpp_own,
            "prompt {:?}: {ours} tokens agree with llama.cpp Q4_1, llama.cpp F32 agrees on {llama_cpp_own}",
            case.prompt
        );
    }
}

/// The Gemma-3-270m goldens (`tests/goldens/gemma-3-270m.json`, llama.cpp's AVX2 CPU build).
fn gemma_goldens() -> serde_json::Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/goldens/gemma-3-270m.json");
    serde_json::from_slice(&std::fs::read(path).expect("gemma goldens")).expect("gemma goldens json")
}

#[test]
fn gemma3_270m_tokenizes_and_decodes_greedily_as_llama_cpp_does() {
    // Its SentencePiece vocabulary of 262,144 tokens gives llama.cpp's prompt ids (BOS, spaces,
    // digits, accents, a dash, tabs, the euro sign); on the Q4_K_M blocks expanded exactly to f32
    // (llama.cpp's F32 golden file) and on the blocks kept as stored, greedy decoding gives
    // llama.cpp's F32 transcript up to its first near-tie (a top-2 gap under 0.05 nats, where
    // another order of the same sums may choose the other token). (These runs stay within the
    // local layers' window of 512 keys: the tiny models' goldens check its edge.)
    const NEAR_TIE: f64 = 0.05;
    let g = gemma_goldens();
    let bytes =
        std::fs::read(model_file(g["model"]["file"].as_str().expect("file"), "gemma-3-270m")).expect("read");
    let ckpt = Checkpoint::from_gguf(bytes).expect("parse Gemma 3");
    assert_eq!((ckpt.config.arch, ckpt.config.sliding_window), (wgspec::model::Arch::Gemma3, Some(512)));
    let tokenizer = wgspec::tokenizer::Tokenizer::from_gguf(ckpt.gguf().expect("gguf")).expect("tokenizer");
    let cases = g["cases"].as_array().expect("cases");
    let ids = |v: &serde_json::Value| -> Vec<u32> { serde_json::from_value(v.clone()).expect("ids") };
    for c in cases {
        let prompt = c["prompt"].as_str().expect("prompt");
        assert_eq!(tokenizer.encode(prompt, true).expect("encode"), ids(&c["prompt_tokens"]), "{prompt:?}");
    }
    // its turn markup: one token each (<start_of_turn> 105, <end_of_turn> 106, which ends a turn)
    let turn = tokenizer.encode("<start_of_turn>user\nHi<end_of_turn>", false).expect("encode");
    assert_eq!((turn.first(), turn.last()), (Some(&105), Some(&106)), "{turn:?}");
    assert!(
        tokenizer.eos_ids().contains(&106) && tokenizer.eos_ids().contains(&1),
        "{:?}",
        tokenizer.eos_ids()
    );
    for (precision, which) in [(Precision::F32, 0..cases.len()), (Precision::Auto, 2..cases.len())] {
        let opts = LoadOptions { context: Some(128), precision, ..Default::default() };
        let mut model = Model::load(gpu(), &ckpt, &opts, &mut |_| {}).expect("load");
        for c in &cases[which] {
            let want = ids(&c["f32_tokens"]);
            let gaps: Vec<f64> = serde_json::from_value(c["f32_top2_logit_gap"].clone()).expect("gaps");
            // up to and including the first near-tie's step: the token before it is decided
            let sure = gaps.iter().position(|&gap| gap < NEAR_TIE).unwrap_or(want.len());
            let got = greedy(&mut model, &ids(&c["prompt_tokens"]), sure);
            assert_eq!(got[..], want[..sure], "{precision:?} {:?}", c["prompt"]);
        }
    }
}

//! Real SmolLM2-135M (fetched by `./build.sh models`) against llama.cpp goldens
//! (`tests/goldens/smollm2-135m.json`, made by `scripts/goldens`).

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

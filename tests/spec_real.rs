//! Speculative greedy decoding on real models equals target-only greedy decoding:
//! SmolLM2-135M with n-gram lookup (the golden prompts) and with the EAGLE head trained here, and
//! the Qwen2.5-Coder pair (1.5B target, 0.5B draft). Models come from the cache (`./build.sh models`, `wgspec fetch`).
//!
//! Lavapipe runs these models at seconds per token, so the default lengths are short; set
//! `WGSPEC_SPEC_TOKENS` for longer runs (and all golden prompts) on a real GPU.
//!
//! Besides a literal comparison with plain greedy generation, outputs are checked by teacher
//! forcing: one batched forward over prompt + output must give, at every position, the argmax
//! that is the next output token. With batch-invariant rows (tested in `tests/spec.rs`) that is
//! exactly the plain greedy sequence, at the cost of one pass per 32 tokens instead of one per token.

mod common;

use std::path::PathBuf;

use common::goldens::{goldens, model_file, Case};
use common::gpu;
use web_time::Instant;
use wgspec::engine::{Completion, Engine, Request};
use wgspec::generation::GenerateOptions;
use wgspec::model::{Checkpoint, EagleHead, EagleLayout, LoadOptions, Model, MAX_BATCH};
use wgspec::speculative::{self, DraftModel, Drafter, KPolicy, NGram, SpecGeneration};
use wgspec::tokenizer::Tokenizer;

fn load(path: &PathBuf, context: usize) -> (Model, Checkpoint) {
    let ckpt = Checkpoint::from_gguf(std::fs::read(path).expect("read model")).expect("parse");
    let m =
        Model::load(gpu(), &ckpt, &LoadOptions { context: Some(context), ..Default::default() }, &mut |_| {})
            .expect("load");
    (m, ckpt)
}

/// Tokens to generate per prompt (env `WGSPEC_SPEC_TOKENS`, else `default`).
fn token_count(default: usize) -> usize {
    std::env::var("WGSPEC_SPEC_TOKENS").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn greedy(n: usize) -> GenerateOptions {
    GenerateOptions { max_tokens: n, sampling: Default::default(), stop_tokens: vec![] }
}

/// Asserts that `output` is the target's greedy continuation of `prompt` by teacher forcing.
fn assert_greedy_continuation(target: &mut Model, prompt: &[u32], output: &[u32], what: &str) {
    let all: Vec<u32> = prompt.iter().chain(output).copied().collect();
    let mut argmax = Vec::new();
    for (c, chunk) in all[..all.len() - 1].chunks(MAX_BATCH).enumerate() {
        argmax.extend(pollster::block_on(target.forward_argmax(chunk, c * MAX_BATCH)).expect("forward"));
    }
    let predicted = &argmax[prompt.len() - 1..];
    assert_eq!(predicted, output, "{what}: the output is not the target's greedy continuation");
}

fn report(what: &str, g: &SpecGeneration, seconds: f64) {
    let s = &g.stats;
    eprintln!(
        "{what}: {} tokens, {} verify passes, {} drafted, {} accepted ({:.0}%), tau {:.2}, by position {:.2?}, {:.1} s",
        s.base.generated_tokens,
        s.verify_forwards,
        s.drafted,
        s.accepted,
        100.0 * s.acceptance_rate,
        s.tokens_per_target_forward,
        s.acceptance_by_position,
        seconds
    );
}

#[test]
fn smollm2_ngram_speculation_equals_greedy() {
    let g = goldens();
    let path = model_file(&g.model.file, "smollm2-135m");
    let (mut target, _) = load(&path, 256);
    let n = token_count(8);
    let long = std::env::var("WGSPEC_SPEC_TOKENS").is_ok();
    // By default: a list, code and a chat turn.
    let picked: Vec<&Case> = if long {
        g.cases.iter().collect()
    } else {
        g.cases
            .iter()
            .filter(|c| {
                ["Here is a list", "def fibonacci", "<|im_start|>"].iter().any(|p| c.prompt.starts_with(p))
            })
            .collect()
    };
    assert!(picked.len() >= 3);
    let (mut drafted, mut accepted, mut tokens, mut verifies) = (0, 0, 0, 0);
    for (i, case) in picked.iter().enumerate() {
        let t = Instant::now();
        let got = pollster::block_on(speculative::generate(
            &mut target,
            Drafter::Other(&mut NGram::default()),
            &case.prompt_tokens,
            &greedy(n),
            KPolicy::default(),
            &mut |_, _| true,
        ))
        .expect("spec generate");
        report(
            &format!("SmolLM2 + ngram {:?}", case.prompt.chars().take(24).collect::<String>()),
            &got,
            t.elapsed().as_secs_f64(),
        );
        assert_eq!(got.tokens.len(), n);
        if i == 0 {
            // One literal comparison with plain greedy generation.
            let plain = common::plain(&mut target, &case.prompt_tokens, &greedy(n)).expect("generate");
            assert_eq!(got.tokens, plain.tokens, "prompt {:?}", case.prompt);
        } else {
            assert_greedy_continuation(&mut target, &case.prompt_tokens, &got.tokens, &case.prompt);
        }
        drafted += got.stats.drafted;
        accepted += got.stats.accepted;
        tokens += got.stats.base.generated_tokens;
        verifies += got.stats.verify_forwards;
    }
    eprintln!(
        "SmolLM2 + ngram overall: acceptance {:.0}% ({accepted}/{drafted}), tau {:.2}",
        100.0 * accepted as f64 / drafted.max(1) as f64,
        tokens as f64 / verifies.max(1) as f64
    );
}

/// The real Gemma-3-270m (stored Q4_K_M blocks) speculating with n-gram drafts and with a random
/// EAGLE-1 head of its shape (a dynamic tree) gives its greedy output; the head's trees are
/// verified (wrong guesses are fine: exactness is the point).
#[test]
fn gemma3_270m_speculation_with_ngram_and_a_random_eagle_head_equals_greedy() {
    use common::tiny::{eagle_head, TinySpec};
    use rand::{rngs::SmallRng, SeedableRng};
    use wgspec::loader::DType;
    use wgspec::speculative::{Eagle, EagleTree};
    let path = model_file("gemma-3-270m-q4_k_m.gguf", "gemma-3-270m");
    let (mut target, ckpt) = load(&path, 128);
    let tokenizer = Tokenizer::from_gguf(ckpt.gguf().expect("gguf")).expect("tokenizer");
    let c = ckpt.config.clone();
    drop(ckpt);
    let prompt =
        tokenizer.encode("one two three, one two three, one two three, one two", true).expect("encode");
    let n = token_count(16);
    let want = common::plain(&mut target, &prompt, &greedy(n)).expect("plain");
    // a head of the target's width, heads and vocabulary (a small FFN of its own)
    let spec = TinySpec {
        gemma3: true,
        vocab: c.vocab_size,
        dim: c.dim,
        heads: c.n_heads,
        kv_heads: c.n_kv_heads,
        ffn: 512,
        context: 128,
        ..TinySpec::llama()
    };
    let (file, config) = eagle_head(&spec, DType::F16, false, false, &mut SmallRng::seed_from_u64(270));
    let cfg = EagleHead::config_for(&target.config, &config).expect("head config");
    let head_ckpt = Checkpoint::from_named_safetensors(cfg, vec![Box::new(file)]).expect("head");
    let layout = EagleHead::layout_of(&target.config, &config, &head_ckpt).expect("layout");
    let opts = LoadOptions::default();
    let head = pollster::block_on(EagleHead::load(&target, &head_ckpt, layout, &opts, 4, &mut |_| {}))
        .expect("load head");
    let mut eagle = Eagle::with_tree(head, EagleTree::Dynamic { width: 3 });
    for (what, drafter) in
        [("ngram", Drafter::Other(&mut NGram::default())), ("random EAGLE head", Drafter::Other(&mut eagle))]
    {
        let t = Instant::now();
        let got = pollster::block_on(speculative::generate(
            &mut target,
            drafter,
            &prompt,
            &greedy(n),
            KPolicy::Fixed(3),
            &mut |_, _| true,
        ))
        .expect("spec generate");
        report(&format!("Gemma-3-270m + {what}"), &got, t.elapsed().as_secs_f64());
        assert_eq!(got.tokens, want.tokens, "Gemma-3-270m + {what}");
        assert!(got.stats.drafted > 0, "{what}: nothing was drafted");
    }
}

#[test]
fn qwen_coder_pair_speculation_equals_greedy() {
    let target_path = model_file("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-1.5b");
    let draft_path = model_file("qwen2.5-coder-0.5b-instruct.gguf", "qwen2.5-coder-0.5b");
    let t = Instant::now();
    let (mut target, target_ckpt) = load(&target_path, 64);
    let target_tok = Tokenizer::from_gguf(target_ckpt.gguf().expect("gguf")).expect("tokenizer");
    drop(target_ckpt);
    let (draft_model, draft_ckpt) = load(&draft_path, 64);
    let draft_tok = Tokenizer::from_gguf(draft_ckpt.gguf().expect("gguf")).expect("tokenizer");
    drop(draft_ckpt);
    speculative::check_tokenizers(&target_tok, &draft_tok).expect("the pair shares a tokenizer");
    let mut draft = DraftModel::new(draft_model, &target.config).expect("draft");
    eprintln!("Qwen pair loaded in {:.1} s", t.elapsed().as_secs_f64());

    // A short prompt: on lavapipe a 1.5B pass takes about a minute and rows are not free, so the
    // test is a short prefill, K = n - 1 draft steps, one verify pass and one checking pass.
    let prompt = target_tok.encode("def quicksort(arr):", true).expect("encode");
    let n = token_count(4);
    let t = Instant::now();
    let got = pollster::block_on(speculative::generate(
        &mut target,
        Drafter::Model(&mut draft),
        &prompt,
        &greedy(n),
        KPolicy::Fixed(n - 1),
        &mut |_, _| true,
    ))
    .expect("spec generate");
    report("Qwen2.5-Coder 1.5B + 0.5B draft", &got, t.elapsed().as_secs_f64());
    assert_eq!(got.tokens.len(), n);
    let t = Instant::now();
    assert_greedy_continuation(&mut target, &prompt, &got.tokens, "qwen pair");
    eprintln!(
        "teacher-forced check in {:.1} s; text {:?}",
        t.elapsed().as_secs_f64(),
        target_tok.decode(&got.tokens)
    );
}

/// Greedy generations of `n` tokens with `draft` (`"eagle"` or `"medusa"`, loaded in `engine`) at
/// a fixed K (the adaptive K follows timings: the same trees on every run) on the first `prompts`
/// chat prompts the heads never saw (`benches/chat_prompts.json`, held out of their training: 4
/// code, then 4 prose), each asserted equal to the plain greedy generation; returns τ over them.
fn trained_heads_tau(engine: &mut Engine, draft: &str, k: usize, n: usize, prompts: usize) -> f64 {
    let all: serde_json::Value =
        serde_json::from_str(include_str!("../benches/chat_prompts.json")).expect("json");
    let (mut tokens, mut verifies) = (0, 0);
    for p in all.as_array().expect("prompts").iter().take(prompts) {
        let messages = serde_json::json!([{"role": "user", "content": p["prompt"]}]);
        let request = |draft: &str| {
            let json =
                serde_json::json!({"messages": messages, "max_tokens": n, "draft": draft, "draft_k": k});
            Request::from_json(&json.to_string()).expect("request")
        };
        let plain = pollster::block_on(engine.generate(&request("none"), &mut |_| true)).expect("plain");
        let t = Instant::now();
        let got = pollster::block_on(engine.generate(&request(draft), &mut |_| true)).expect(draft);
        let s = &got.stats;
        eprintln!(
            "SmolLM2 + trained {draft} {}: {} tokens, {} verify passes, tau {:.2}, acceptance by depth {:.2?}, {:.1} s",
            p["name"],
            s.base.generated_tokens,
            s.verify_forwards,
            s.tokens_per_target_forward,
            s.acceptance_by_position,
            t.elapsed().as_secs_f64()
        );
        assert_eq!(got.tokens, plain.tokens, "{}: {draft} speculation changed the output", p["name"]);
        tokens += s.base.generated_tokens;
        verifies += s.verify_forwards;
    }
    let tau = tokens as f64 / verifies.max(1) as f64;
    eprintln!("SmolLM2 + trained {draft} overall: tau {tau:.2}");
    tau
}

/// SmolLM2-135M with a context of 512.
fn smollm2_engine() -> Engine {
    let g = goldens();
    let path = model_file(&g.model.file, "smollm2-135m");
    let opts = LoadOptions { context: Some(512), ..Default::default() };
    Engine::load(gpu(), wgspec::local::open(&path).expect("open"), &opts, &mut |_, _| {}).expect("load")
}

/// The EAGLE head trained here for SmolLM2-135M (`heads/smollm2-135m-eagle`, made by
/// `scripts/train/train_eagle.sh`): greedy output identical to plain greedy output, and τ (tokens
/// per target pass) above 1.6 at K = 7 with EAGLE-2's dynamic tree of 7 nodes (1.76 measured over
/// the 8 chat prompts x 24 tokens; 1.81 at 64 tokens in `wgspec bench --chat`, BENCHMARKS.md; the
/// EAGLE-1 shape gave 1.54 there; a head that read misaligned features would give about 1.0).
#[test]
fn smollm2_trained_eagle_head_is_exact_and_pays_in_tokens_per_pass() {
    let mut engine = smollm2_engine();
    let head = concat!(env!("CARGO_MANIFEST_DIR"), "/heads/smollm2-135m-eagle");
    let files = wgspec::local::heads_files(std::path::Path::new(head)).expect("head files");
    engine.load_eagle(files, &mut |_, _| {}).expect("the trained head");
    let tau = trained_heads_tau(&mut engine, "eagle", 7, token_count(24), 8);
    assert!(tau > 1.6, "the trained head gives tau {tau:.2}, not above 1.6");
    batched_eagle_chains_are_their_solo_chains(&mut engine, token_count(24));
    batched_eagle_chains_end_below_unsure_steps(&mut engine, token_count(24));
}

/// The trained head's chains in the batch (4 chat prompts at once, greedy, K = 4): each request's
/// tokens are its solo run's, and its chains pay as they do alone (a head that read another
/// row's feature or the wrong next token would fall towards tau 1.0); one request alone in the
/// batch keeps exactly the drafts its solo chains keep, cycle by cycle.
fn batched_eagle_chains_are_their_solo_chains(engine: &mut Engine, n: usize) {
    use wgspec::speculative::EagleTree;
    engine.set_eagle_tree(EagleTree::Chain { siblings: 0 }).expect("a head");
    let (alone, together) = alone_and_batched(engine, "eagle", Some(4), n);
    let (solo, batched) = (tau(&alone), tau(&together));
    eprintln!("SmolLM2 + trained eagle chains (K = 4): tau {solo:.2} alone, {batched:.2} in the batch");
    assert!(batched > 1.3 && batched > solo - 0.25, "tau {batched:.2} in the batch, {solo:.2} alone");
    let got = batched_run(engine, &[alone_request(0, "eagle", Some(4), n)]).remove(0);
    assert_eq!(
        (got.stats.drafted, got.stats.accepted, &got.from_draft),
        (alone[0].stats.drafted, alone[0].stats.accepted, &alone[0].from_draft),
        "request 0 alone in the batch"
    );
}

/// The trained head's chains in the batch under an adaptive K, with the plan's costs fixed (a
/// pass 1 s, a row 0.05 s more, the head's follows and steps free: measured ones come from
/// timings): once drafted, a chain is judged again by the head's confidence of each of its steps
/// (EAGLE-2's dynamic depth), and its drafts below a step too unsure to pay for them are dropped
/// before the pass (29 drafts verified and 89 cut over the 4 prompts x 24 tokens). Then with 3
/// siblings beside each step, each judged by the head's probability of it, and a row at 0.02 s:
/// token trees verified, and drafts cut (79 verified, 17 proposals trees, 85 cut). Each request's
/// tokens are its run alone.
fn batched_eagle_chains_end_below_unsure_steps(engine: &mut Engine, n: usize) {
    use wgspec::engine::FixedCosts;
    engine.set_batch_costs(Some(FixedCosts { pass: 1.0, row: 0.05, ..FixedCosts::default() }));
    let before = engine.batch_status();
    let (_, together) = alone_and_batched(engine, "eagle", None, n);
    let after = engine.batch_status();
    let (drafts, cut) = (after.drafts - before.drafts, after.drafts_cut - before.drafts_cut);
    eprintln!(
        "SmolLM2 + trained eagle, adaptive K, fixed costs: {drafts} drafts verified, {cut} cut, tau {:.2}",
        tau(&together)
    );
    assert!(drafts > 0 && cut > 0, "{drafts} drafts verified, {cut} cut");
    // with 3 siblings beside each step, each judged by the head's probability of it, a row at
    // 0.02 s (a GPU's few-row passes): trees
    engine.set_eagle_tree(wgspec::speculative::EagleTree::Chain { siblings: 3 }).expect("a head");
    engine.set_batch_costs(Some(FixedCosts { pass: 1.0, row: 0.02, ..FixedCosts::default() }));
    let before = engine.batch_status();
    let (_, together) = alone_and_batched(engine, "eagle", None, n);
    let after = engine.batch_status();
    let (drafts, cut) = (after.drafts - before.drafts, after.drafts_cut - before.drafts_cut);
    let trees = after.trees - before.trees;
    eprintln!(
        "SmolLM2 + trained eagle with siblings, adaptive K, fixed costs: {drafts} drafts verified, {trees} \
         proposals trees, {cut} cut, tau {:.2}",
        tau(&together)
    );
    engine.set_batch_costs(None);
    assert!(trees > 0 && cut > 0, "{trees} trees, {cut} drafts cut");
}

/// Chat prompt `i` of `benches/chat_prompts.json` as a greedy request of `n` tokens drafting
/// with `draft` at K = `k` (none: an adaptive K).
fn alone_request(i: usize, draft: &str, k: Option<usize>, n: usize) -> Request {
    let all: serde_json::Value =
        serde_json::from_str(include_str!("../benches/chat_prompts.json")).expect("json");
    let messages = serde_json::json!([{"role": "user", "content": all[i]["prompt"]}]);
    let mut json = serde_json::json!({"messages": messages, "max_tokens": n, "draft": draft});
    if let Some(k) = k {
        json["draft_k"] = k.into();
    }
    Request::from_json(&json.to_string()).expect("request")
}

/// The first 4 chat prompts drafting with `draft` (K = `k`, none: adaptive; `n` tokens), each
/// run alone, then all four in the batch at once (its pool as the budget leaves it): each batched request's tokens
/// asserted equal to its run alone. Returns both runs' completions.
fn alone_and_batched(
    engine: &mut Engine,
    draft: &str,
    k: Option<usize>,
    n: usize,
) -> (Vec<Completion>, Vec<Completion>) {
    engine.set_kv_pool(None).expect("a pool");
    engine.set_batch_limits(wgspec::engine::BatchLimits { max_seqs: 8, max_rows: 32 });
    let reqs: Vec<Request> = (0..4).map(|i| alone_request(i, draft, k, n)).collect();
    let alone: Vec<Completion> =
        reqs.iter().map(|r| pollster::block_on(engine.generate(r, &mut |_| true)).expect("alone")).collect();
    let together = batched_run(engine, &reqs);
    for (i, (got, want)) in together.iter().zip(&alone).enumerate() {
        assert_eq!(got.tokens, want.tokens, "{draft}: request {i} in the batch");
    }
    (alone, together)
}

/// `reqs` submitted to the batch at once and run until it is idle: their completions in order.
fn batched_run(engine: &mut Engine, reqs: &[Request]) -> Vec<Completion> {
    use wgspec::engine::BatchEvent;
    let ids: Vec<_> = (reqs.iter())
        .map(|r| engine.batch_submit(engine.prompt_tokens(r).expect("prompt"), r).expect("submit"))
        .collect();
    let mut done = std::collections::HashMap::new();
    while !engine.batch_idle() {
        for (id, ev) in pollster::block_on(engine.batch_step()).expect("pass") {
            match ev {
                BatchEvent::Done(c) => drop(done.insert(id, *c)),
                BatchEvent::Failed(e) => panic!("{id:?} failed: {e}"),
                BatchEvent::Token(_) => {}
            }
        }
    }
    ids.iter().map(|id| done.remove(id).expect("done")).collect()
}

/// Tokens per target pass over `runs`.
fn tau(runs: &[Completion]) -> f64 {
    let tokens: usize = runs.iter().map(|c| c.tokens.len()).sum();
    tokens as f64 / runs.iter().map(|c| c.stats.verify_forwards).sum::<usize>().max(1) as f64
}

/// The Medusa heads trained here for SmolLM2-135M (`heads/smollm2-135m-medusa`, made by
/// `scripts/train/train_medusa.sh`: three one-block heads projecting with the target's output
/// matrix): greedy output identical to plain, and τ above 1.35 at K = 7 (the first 7 nodes
/// of Medusa's tree paths, 3 deep: a verify pass of 8 rows; 1.63 measured over the four code
/// prompts x 24 tokens, 1.52 over all eight at 64 in `wgspec bench --chat`). Heads reading the
/// wrong row would give about 1.0.
#[test]
fn smollm2_trained_medusa_heads_are_exact_and_pay_in_tokens_per_pass() {
    let mut engine = smollm2_engine();
    let heads = concat!(env!("CARGO_MANIFEST_DIR"), "/heads/smollm2-135m-medusa");
    let files = wgspec::local::heads_files(std::path::Path::new(heads)).expect("heads files");
    let loaded = engine.load_medusa(files, &mut |_, _| {}).expect("the trained heads");
    assert!(loaded.config.shared_output && loaded.config.heads == 3, "{:?}", loaded.config);
    // (the four code prompts: lean)
    let tau_trees = trained_heads_tau(&mut engine, "medusa", 7, token_count(24), 4);
    assert!(tau_trees > 1.35, "the trained heads give tau {tau_trees:.2}, not above 1.35");
    // in the batch: the same four at once, each head's first guess from each request's row of
    // the pass before (K = 3, the heads' depth): each request's tokens its run alone's, and the
    // chains pay (heads reading another request's row, or a row too early, would give about 1.0)
    let (alone, together) = alone_and_batched(&mut engine, "medusa", Some(3), token_count(24));
    let (solo, batched) = (tau(&alone), tau(&together));
    eprintln!(
        "SmolLM2 + trained medusa (K = 3): tau {solo:.2} alone (trees), {batched:.2} in the batch (chains)"
    );
    assert!(batched > 1.2, "tau {batched:.2} in the batch, {solo:.2} alone");
}

/// The shipped head on the GPU against PyTorch: `check.json` (written by the training script from
/// the exported float16 weights, in float32) holds a held-out prompt's ids, the head's predicted
/// features (first 8 values) and top-5 draft ids at its last positions; the runtime, reading the
/// target's features from its own pass, must give the same.
#[test]
fn the_shipped_eagle_head_computes_what_pytorch_computed() {
    let g = goldens();
    let path = model_file(&g.model.file, "smollm2-135m");
    let (mut target, _) = load(&path, 128);
    let dir = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/heads/smollm2-135m-eagle"));
    let check: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("check.json")).expect("check.json")).expect("json");
    let ids: Vec<u32> =
        check["ids"].as_array().expect("ids").iter().filter_map(|v| v.as_u64()).map(|v| v as u32).collect();
    let config = std::fs::read(dir.join("config.json")).expect("config.json");
    let cfg = EagleHead::config_for(&target.config, &config).expect("head config");
    let file = wgspec::loader::source::LocalFile::open(&dir.join("model.safetensors")).expect("head file");
    let ckpt = Checkpoint::from_named_safetensors(cfg, vec![Box::new(file)]).expect("head");
    let mut head = pollster::block_on(EagleHead::load(
        &target,
        &ckpt,
        EagleLayout::Eagle1 { draft_vocab: target.config.vocab_size },
        &LoadOptions::default(),
        5,
        &mut |_| {},
    ))
    .expect("load head");
    // the target's pass over every position but the last, in chunks; the head over each chunk's rows
    let positions = ids.len() - 1;
    let mut first = 0;
    let mut features = vec![Vec::new(); positions];
    let mut top_last = Vec::new();
    for chunk in ids[..positions].chunks(MAX_BATCH) {
        pollster::block_on(target.forward(chunk, first)).expect("forward");
        let rows: Vec<usize> = (0..chunk.len()).collect();
        head.run_target_rows(&rows, &ids[first + 1..first + 1 + chunk.len()], first).expect("head pass");
        let f = pollster::block_on(head.features(chunk.len())).expect("features");
        for (i, row) in f.chunks(target.config.dim).enumerate() {
            features[first + i] = row.to_vec();
        }
        top_last = pollster::block_on(head.top_ids()).expect("top");
        first += chunk.len();
    }
    let cases = check["positions"].as_array().expect("positions");
    for case in cases {
        let p = case["position"].as_u64().expect("position") as usize;
        let want: Vec<f32> = case["predicted_feature_first8"]
            .as_array()
            .expect("f")
            .iter()
            .filter_map(|v| v.as_f64())
            .map(|v| v as f32)
            .collect();
        common::assert_close(&format!("f^ at position {p}"), &features[p][..want.len()], &want, 2e-3, 2e-3);
    }
    let last = cases.last().expect("a position");
    assert_eq!(last["position"].as_u64(), Some(positions as u64 - 1), "check.json ends at the last position");
    let want: Vec<u32> = last["draft_top5_ids"]
        .as_array()
        .expect("ids")
        .iter()
        .filter_map(|v| v.as_u64())
        .map(|v| v as u32)
        .collect();
    assert_eq!(top_last, want, "the draft's top 5 at the last position");
}

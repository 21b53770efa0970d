//! The `wgspec` binary end to end: a tiny model written as GGUF (with a byte-level vocabulary),
//! `generate --json`, seeded sampling, and clear errors for bad input.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};

use common::rng;
use common::tiny::{TinyModel, TinySpec};
use wgspec::loader::DType;

fn wgspec(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_wgspec"))
        .args(args)
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .output()
        .expect("run wgspec")
}

fn tiny_model_file(name: &str) -> PathBuf {
    let mut r = rng(90);
    let tiny = TinyModel::random(TinySpec::llama(), &mut r);
    let dir = std::env::temp_dir().join(format!("wgspec-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(name);
    std::fs::write(&path, tiny.to_gguf(DType::Q8_0, &mut r)).expect("write model");
    path
}

fn json_of(out: &Output) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "wgspec failed: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout.trim().lines().count(), 1, "exactly one JSON line: {stdout}");
    serde_json::from_str(stdout.trim()).expect("valid JSON")
}

#[test]
fn generate_json_prints_one_object_with_tokens_text_and_stats() {
    let model = tiny_model_file("tiny.gguf");
    let m = model.to_str().expect("utf8 path");
    let out = wgspec(&["generate", "--model", m, "--prompt", "hello world", "--max-tokens", "7", "--json"]);
    let v = json_of(&out);
    let prompt: Vec<u64> =
        v["prompt_tokens"].as_array().expect("prompt_tokens").iter().filter_map(|t| t.as_u64()).collect();
    assert_eq!(prompt.len(), "hello world".len(), "one byte token per byte without merges");
    assert_eq!(prompt[0], u64::from(b'h'), "the vocabulary lists the byte symbols in byte order");
    let tokens = v["tokens"].as_array().expect("tokens");
    assert!(!tokens.is_empty() && tokens.len() <= 7);
    assert!(v["text"].is_string());
    assert_eq!(v["stats"]["generated_tokens"].as_u64(), Some(tokens.len() as u64));
    assert!(v["stats"]["tokens_per_second"].as_f64().is_some_and(|t| t > 0.0));
    // The Q8_0 blocks stay as stored: GPU weight bytes within 1% of the file's tensor bytes.
    let (gpu, file) =
        (v["gpu_weight_bytes"].as_f64().expect("gpu"), v["file_weight_bytes"].as_f64().expect("file"));
    assert!(file > 0.0 && (gpu / file - 1.0).abs() < 0.01, "gpu {gpu} vs file {file} bytes");

    // A draft model's top-k trees (`tree:N:MODEL`, the model drafting for itself): trees verified,
    // the target's greedy tokens, the stats naming the draft as requests do
    let draft = format!("tree:3:{m}");
    let args = ["generate", "--model", m, "--prompt", "hello world", "--max-tokens", "7", "--json"];
    let tree = json_of(&wgspec(&[&args[..], &["--draft", &draft, "--draft-k", "2"]].concat()));
    assert_eq!(tree["tokens"], v["tokens"], "speculation on trees changed the tokens");
    assert_eq!(tree["stats"]["draft"], "model");
    assert!(tree["stats"]["tree_cycles"].as_u64().is_some_and(|n| n > 0), "{}", tree["stats"]);
    // the n-gram's trees (`--tree`, as bench and serve take it): the target's greedy tokens
    let ngram =
        json_of(&wgspec(&[&args[..], &["--draft", "ngram", "--tree", "4", "--draft-k", "3"]].concat()));
    assert_eq!((&ngram["tokens"], &ngram["stats"]["draft"]), (&v["tokens"], &"ngram".into()));

    // --compare: the target-only run of the same request beside the speculative one, the same
    // tokens; as text, the verdict line names both speeds, the speedup and tau
    let cmp = json_of(&wgspec(&[&args[..], &["--draft", m, "--compare"]].concat()));
    assert_eq!(cmp["target_only"]["tokens"], v["tokens"], "{cmp}");
    assert_eq!((&cmp["tokens"], &cmp["target_only"]["stats"]["draft"]), (&v["tokens"], &"none".into()));
    let text = wgspec(&[
        "generate",
        "--model",
        m,
        "--prompt",
        "hello world",
        "--max-tokens",
        "7",
        "--draft",
        m,
        "--compare",
    ]);
    let err = String::from_utf8_lossy(&text.stderr);
    assert!(
        text.status.success()
            && err.contains("target-only")
            && err.contains("the same text, token for token"),
        "{err}"
    );
    let alone = wgspec(&["generate", "--model", m, "--prompt", "hi", "--max-tokens", "2", "--compare"]);
    let err = String::from_utf8_lossy(&alone.stderr);
    assert!(!alone.status.success() && err.contains("--compare compares with a draft"), "{err}");

    // Seeded sampling is reproducible, and a different seed may differ but still parses.
    let args = ["generate", "--model", m, "--prompt", "abc", "--max-tokens", "6", "--temperature", "1.5"];
    let a = json_of(&wgspec(&[&args[..], &["--seed", "7", "--json"]].concat()));
    let b = json_of(&wgspec(&[&args[..], &["--seed", "7", "--json"]].concat()));
    assert_eq!(a["tokens"], b["tokens"], "same seed, same tokens");
}

#[test]
fn generate_speculates_with_medusa_and_eagle_heads_from_their_folders() {
    let model = tiny_model_file("tiny-medusa.gguf");
    let m = model.to_str().expect("utf8 path");
    let dir = model.with_file_name("medusa-heads");
    std::fs::create_dir_all(&dir).expect("heads dir");
    let mut r = rng(91);
    let tiny = TinyModel::random(TinySpec::llama(), &mut r);
    let (heads, config) =
        common::tiny::medusa_heads(&tiny, 2, 1, DType::BF16, common::tiny::MedusaKind::Random, &mut r);
    std::fs::write(dir.join("medusa_lm_head.safetensors"), heads).expect("write heads");
    std::fs::write(dir.join("config.json"), config).expect("write config");
    let args = ["generate", "--model", m, "--prompt", "abab abab", "--max-tokens", "12", "--json"];
    let plain = json_of(&wgspec(&args));
    let draft = format!("medusa:{}", dir.display());
    let spec = json_of(&wgspec(&[&args[..], &["--draft", &draft]].concat()));
    assert_eq!(spec["tokens"], plain["tokens"], "Medusa speculation changes no token");
    assert_eq!(spec["stats"]["draft"], "medusa");
    assert!(spec["stats"]["tree_cycles"].as_u64().is_some_and(|n| n > 0), "{}", spec["stats"]);
    // an EAGLE head's folder
    let dir = model.with_file_name("eagle-head");
    std::fs::create_dir_all(&dir).expect("head dir");
    let (head, config) = common::tiny::eagle_head(&tiny.spec, DType::F16, true, false, &mut r);
    std::fs::write(dir.join("model.safetensors"), head).expect("write head");
    std::fs::write(dir.join("config.json"), config).expect("write config");
    let draft = format!("eagle:{}", dir.display());
    let spec = json_of(&wgspec(&[&args[..], &["--draft", &draft]].concat()));
    assert_eq!(spec["tokens"], plain["tokens"], "EAGLE speculation changes no token");
    assert_eq!(spec["stats"]["draft"], "eagle");
    assert!(spec["stats"]["drafted"].as_u64().is_some_and(|n| n > 0), "{}", spec["stats"]);
    // a heads file that does not exist is a clear error
    let out = wgspec(&[&args[..], &["--draft", "medusa:/no/such/heads"]].concat());
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("/no/such/heads"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_trained_heads_ship_in_the_binary_and_are_fetched_checked() {
    let cache = std::env::temp_dir().join(format!("wgspec-cli-heads-{}", std::process::id()));
    for (name, weights) in
        [("smollm2-135m-eagle", "model.safetensors"), ("smollm2-135m-medusa", "medusa_lm_head.safetensors")]
    {
        let fetch = |cache: &std::path::Path| {
            Command::new(env!("CARGO_BIN_EXE_wgspec"))
                .args(["fetch", name])
                .env("WGSPEC_CACHE", cache)
                .output()
                .expect("run wgspec")
        };
        let out = fetch(&cache);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let dir = std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        assert_eq!(dir, cache.join("models").join(name));
        let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("heads").join(name).join(weights);
        let bytes = std::fs::read(dir.join(weights)).expect("written");
        assert_eq!(
            bytes,
            std::fs::read(shipped).expect("shipped"),
            "{name}: the shipped file, byte for byte"
        );
        // a damaged copy in the cache is replaced, and checked again
        std::fs::write(dir.join(weights), b"damaged").expect("damage");
        let out = fetch(&cache);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(std::fs::read(dir.join(weights)).expect("rewritten"), bytes, "{name}");
    }
    let _ = std::fs::remove_dir_all(&cache);
}

#[test]
fn generate_runs_a_hugging_face_folder() {
    // config.json + model.safetensors + tokenizer.json (serialised from the GGUF vocabulary's
    // tokenizer), as `--model FOLDER`.
    let mut r = rng(91);
    let tiny = TinyModel::random(TinySpec::qwen2(), &mut r);
    let gguf = tiny.to_gguf(DType::F32, &mut r);
    let header = wgspec::loader::gguf::Gguf::parse(&gguf, gguf.len() as u64).expect("gguf");
    let tok = wgspec::tokenizer::Tokenizer::from_gguf(&header).expect("tokenizer");
    let dir = std::env::temp_dir().join(format!("wgspec-cli-hf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let (config, st) = tiny.to_safetensors(DType::BF16);
    std::fs::write(dir.join("config.json"), config).expect("write");
    std::fs::write(dir.join("model.safetensors"), st).expect("write");
    std::fs::write(dir.join("tokenizer.json"), tok.inner().to_string(false).expect("json")).expect("write");
    let out = wgspec(&[
        "generate",
        "--model",
        dir.to_str().expect("utf8"),
        "--prompt",
        "hi!",
        "--max-tokens",
        "5",
        "--json",
    ]);
    let v = json_of(&out);
    assert_eq!(v["prompt_tokens"], serde_json::json!([104, 105, 33]), "byte tokens of \"hi!\"");
    assert_eq!(v["tokens"].as_array().map(|t| t.len()), Some(5));
}

#[test]
fn bad_input_gives_a_clear_error_and_a_failing_exit_code() {
    let model = tiny_model_file("tiny-for-errors.gguf");
    let bytes = std::fs::read(&model).expect("read");
    let truncated = model.with_file_name("truncated.gguf");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).expect("write");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["--model".into(), truncated.display().to_string()], "beyond the file"),
        (vec!["--model".into(), "/nonexistent/model.gguf".into()], "no such file"),
        // A device that never ends is refused before reading, not read forever.
        (vec!["--model".into(), "/dev/zero".into()], "not a regular file"),
        (
            vec!["--model".into(), model.display().to_string(), "--max-memory-mb".into(), "0".into()],
            "the budget is 0.0 mb",
        ),
        (vec!["--model".into(), model.display().to_string(), "--temperature=-1".into()], "temperature"),
        (vec!["--model".into(), model.display().to_string(), "--context".into(), "4".into()], "context"),
        // malformed drafts, named (parsed before anything loads)
        (vec!["--model".into(), "m.gguf".into(), "--draft".into(), "tree:0:m.gguf".into()], "1 to 16"),
        (vec!["--model".into(), "m.gguf".into(), "--draft".into(), "medusa:".into()], "names no file"),
        (vec!["--model".into(), "m.gguf".into(), "--draft".into(), "ngram+ngram".into()], "follows a draft"),
        (
            vec![
                "--model".into(),
                "m.gguf".into(),
                "--draft".into(),
                "m.gguf".into(),
                "--tree".into(),
                "2".into(),
            ],
            "--tree with a draft model alone",
        ),
    ];
    for (args, needle) in cases {
        let mut full = vec!["generate".to_string(), "--prompt".into(), "hello there".into()];
        full.extend(args);
        let refs: Vec<&str> = full.iter().map(String::as_str).collect();
        let out = wgspec(&refs);
        let stderr = String::from_utf8_lossy(&out.stderr).to_lowercase();
        assert!(!out.status.success(), "{full:?} must fail");
        assert!(
            stderr.contains("error:") && stderr.contains(needle),
            "{full:?}: stderr {stderr:?} lacks {needle:?}"
        );
        assert!(!stderr.contains("panicked"), "{full:?} panicked: {stderr}");
    }
    // names quoted in errors (here a path) cannot drive the terminal: control characters escaped
    let hostile = "/nonexistent/\u{1b}]0;pwned\u{7}\u{1b}[31mmodel.gguf";
    let out = wgspec(&["generate", "--prompt", "x", "--model", hostile]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("error:"), "{stderr}");
    assert!(!stderr.contains('\u{1b}') && !stderr.contains('\u{7}'), "raw escapes in {stderr:?}");
    assert!(stderr.contains("\\u{1b}]0;pwned"), "the escaped name is still shown: {stderr:?}");
    // a negative number is a clear value error, not "unexpected argument"
    let out = wgspec(&["generate", "--prompt", "x", "--model", "m.gguf", "--max-tokens", "-1"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("invalid value '-1'"), "{stderr}");
    let out = wgspec(&["fetch", "no-such-model"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("smollm2-135m"),
        "the error lists the known models"
    );
}

#[test]
fn bench_compares_speculation_with_plain_decoding_and_writes_its_report() {
    let model = tiny_model_file("tiny-bench.gguf");
    let out_file = model.with_extension("bench.json");
    let m = model.to_str().expect("utf8");
    let o = out_file.to_str().expect("utf8");
    // The tiny model holds 64 positions: short prompts, code and prose.
    let prompts = model.with_extension("prompts.json");
    let set = r#"[{"name": "a", "kind": "code", "prompt": "ababababab"},
                  {"name": "b", "kind": "prose", "prompt": "the cat the cat"},
                  {"name": "c", "kind": "code", "prompt": "x = x + 1"}]"#;
    std::fs::write(&prompts, set).expect("prompts");
    let p = prompts.to_str().expect("utf8");
    let args = ["bench", "--model", m, "--draft", "ngram", "--prompts", p, "--max-tokens", "6"];
    let out = wgspec(&[&args[..], &["--context", "64", "--verify-ks", "1,2", "--out", o]].concat());
    assert!(out.status.success(), "bench failed: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out_file).expect("bench json")).expect("json");
    let prompts = v["prompts"].as_array().expect("prompts");
    assert_eq!(prompts.len(), 3);
    let generated: u64 = prompts.iter().map(|p| p["generated_tokens"].as_u64().expect("tokens")).sum();
    assert_eq!(v["summary"]["generated_tokens"].as_u64(), Some(generated));
    assert_eq!(v["summary"]["all_identical"], true, "greedy speculation equals plain decoding");
    assert_eq!(v["draft"], "ngram");
    let by_kind: u64 = ["code", "prose"].iter().filter_map(|k| v["by_kind"][k]["prompts"].as_u64()).sum();
    assert_eq!(by_kind, 3, "every prompt is code or prose");
    for k in ["1", "2"] {
        assert!(v["verify_cost_by_k"][k].as_f64().is_some_and(|c| c > 0.0), "{}", v["verify_cost_by_k"]);
    }
    assert!(v["verify_cost"].as_f64().is_some_and(|c| c > 0.0));
}

/// A synthetic target drafted by itself (`--draft self`): every draft accepted, tau = K + 1, and
/// every verify row equal to plain decoding, on SmolLM2's real shapes and stored types.
#[test]
fn bench_synthetic_self_draft_accepts_every_draft() {
    let dir = std::env::temp_dir().join(format!("wgspec-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let out_file = dir.join("self.json");
    let o = out_file.to_str().expect("utf8");
    let args = ["bench", "--synthetic", "smollm2-135m", "--draft", "self", "--draft-k", "3"];
    let out =
        wgspec(&[&args[..], &["--limit", "1", "--max-tokens", "8", "--context", "256", "--out", o]].concat());
    assert!(out.status.success(), "bench failed: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out_file).expect("bench json")).expect("json");
    assert_eq!(v["summary"]["all_identical"], true, "{}", v["summary"]);
    assert_eq!(v["summary"]["acceptance_rate"], 1.0, "{}", v["summary"]);
    assert_eq!(v["summary"]["tokens_per_target_forward"], 4.0, "{}", v["summary"]);
    // SmolLM2's file: Q4_1 matrices, a Q8_0 embedding, 98.4 MB with its tokenizer
    let bytes = v["target_gpu_weight_bytes"].as_u64().expect("weight bytes");
    assert!((95_000_000..98_362_432).contains(&bytes), "{bytes}");
    // dispatches and host time per cycle: a target-only step is one forward with its argmax
    // (the shape facts' dispatches of a step); a cycle of 3 self-drafts and the verify pass more
    let summary = &v["summary"];
    let per = |key: &str| summary[key].as_f64().unwrap_or_else(|| panic!("{key}: {summary}"));
    let shape_file = dir.join("self-shape.json");
    let so = shape_file.to_str().expect("utf8");
    let facts = wgspec(&[
        "bench",
        "--synthetic",
        "smollm2-135m",
        "--context",
        "256",
        "--roofline",
        "--shape-only",
        "--out",
        so,
    ]);
    assert!(facts.status.success(), "{}", String::from_utf8_lossy(&facts.stderr));
    let facts: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&shape_file).expect("shape json")).expect("json");
    let step = facts["dispatches_per_step"].as_f64().expect("dispatches per step");
    assert_eq!(per("target_only_dispatches_per_step"), step, "{summary}");
    assert!(per("dispatches_per_cycle") > 3.0 * step, "{summary}");
    assert!(per("host_us_per_cycle") > 0.0 && per("target_only_host_us_per_step") > 0.0, "{summary}");
    // `self` needs a synthetic target
    let tiny = tiny_model_file("tiny-self.gguf");
    let out = wgspec(&[
        "bench",
        "--model",
        tiny.to_str().expect("utf8"),
        "--draft",
        "self",
        "--context",
        "64",
        "--out",
        o,
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--draft self"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn bench_roofline_reports_every_kernel_against_the_ceilings() {
    let model = tiny_model_file("tiny-roofline.gguf");
    let out_file = model.with_extension("roofline.json");
    // `bench --roofline` with `extra` arguments: its stderr and its JSON
    let roofline = |extra: &[&str]| {
        let (m, o) = (model.to_str().expect("utf8"), out_file.to_str().expect("utf8"));
        let base = ["bench", "--roofline", "--model", m, "--context", "128", "--out", o];
        let out = wgspec(&[&base[..], extra].concat());
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "roofline {extra:?} failed: {stderr}");
        let json = std::fs::read_to_string(&out_file).expect("roofline json");
        (stderr, serde_json::from_str::<serde_json::Value>(&json).expect("json"))
    };
    let (_, v) = roofline(&[]);
    assert!(v["ceilings"]["bytes_per_second"].as_f64().is_some_and(|b| b > 1e6), "{}", v["ceilings"]);
    assert!(v["ceilings"]["flops_per_second"].as_f64().is_some_and(|f| f > 1e6), "{}", v["ceilings"]);
    let passes = v["passes"].as_array().expect("passes");
    assert_eq!(passes.iter().map(|p| p["rows"].as_u64()).collect::<Vec<_>>(), [Some(1), Some(5)]);
    for p in passes {
        let by_kernel = p["by_kernel"].as_object().expect("by_kernel");
        let ops: u64 = by_kernel.values().map(|k| k["ops"].as_u64().expect("ops")).sum();
        assert_eq!(Some(ops), p["dispatches"].as_u64(), "every dispatch reported once");
        // 2 layers x (normed q|k|v with RoPE, attention, wo, normed gate|up, down) + embed, normed
        // output, the argmax's two
        assert_eq!(ops, 2 * 5 + 4);
        // (the attention over the f16 KV cache, one pass per head on this CPU adapter)
        assert!(by_kernel.contains_key("Matmul(Q8_0)") && by_kernel.contains_key("Attention(F16)"), "{p}");
        for (name, k) in by_kernel {
            let f = k["roofline_fraction"].as_f64().expect("fraction");
            assert!(f.is_finite() && f > 0.0, "{name}: {f}");
        }
        assert!(p["floor_seconds"]
            .as_f64()
            .is_some_and(|f| f > 0.0 && f <= p["seconds"].as_f64().unwrap_or(0.0) * 1.5));
    }
    assert!(v["verify_cost"].as_f64().is_some_and(|c| c > 0.0));
    assert_eq!((v["clock"].as_str(), v["reps"].as_u64()), (Some("wall"), Some(3)));
    // the shape facts of every dispatch, beside the times
    let shapes = |v: &serde_json::Value, pass: &str| {
        v["ops"].as_array().expect("ops").iter().filter(|o| o["pass"] == pass).cloned().collect::<Vec<_>>()
    };
    assert_eq!(shapes(&v, "step").len(), 2 * 5 + 4);
    assert_eq!(v["dispatches_per_step"], 2 * 5 + 4);
    assert_eq!(v["dispatches_per_layer"], 5);

    // --shape-only: the facts, in the GPU shape (attention split: one more dispatch a layer),
    // and nothing timed
    let (stderr, v) = roofline(&["--shape-only", "--shape", "gpu"]);
    assert!(v.get("ceilings").is_none() && v.get("passes").is_none(), "{v}");
    assert!(stderr.contains("matmul lanes 16") && stderr.contains("attention split"), "{stderr}");
    assert_eq!(v["dispatches_per_layer"], 6);
    for pass in ["step", "verify"] {
        let ops = shapes(&v, pass);
        assert_eq!(ops.len(), 2 * 6 + 4, "{pass}");
        for o in &ops {
            for key in ["workgroups", "invocations", "serial_iterations", "bytes"] {
                assert!(o[key].as_u64().is_some_and(|n| n > 0), "{pass}: {key} of {o}");
            }
        }
    }

    // The same timed as the process's CPU time (this Linux's /proc/self/stat), one run each: the
    // 256 MB copy of the ceilings takes CPU ticks (10 ms each), the tiny passes maybe none.
    let (stderr, v) = roofline(&["--cpu-time", "--reps", "1"]);
    assert_eq!((v["clock"].as_str(), v["reps"].as_u64()), (Some("process_cpu"), Some(1)));
    let copy = v["ceilings"]["bytes_per_second"].as_f64().expect("copy ceiling");
    assert!(copy.is_finite() && copy > 1e6, "{}", v["ceilings"]);
    assert!(stderr.contains("timed in process CPU seconds, runs of each op and pass: 1"), "{stderr}");
    // one run each on a clock of 10 ms ticks: every time is a whole number of ticks (a wall
    // clock's would not be)
    for p in v["passes"].as_array().expect("passes") {
        let kernels = p["by_kernel"].as_object().expect("by_kernel").values().map(|k| &k["seconds"]);
        for s in kernels.chain([&p["seconds"]]) {
            let ticks = s.as_f64().expect("seconds") * 100.0;
            assert!((ticks - ticks.round()).abs() < 1e-6, "{s} s is no whole number of CPU ticks: {p}");
        }
    }
}

#[test]
fn the_gpu_shape_keeps_its_rules_on_real_model_shapes() {
    // The shape facts of real models' decode steps and 5-row verify passes in the GPU shape
    // (`bench --roofline --shape-only --shape gpu`: no weights made or uploaded, llama-8b's
    // included), against the rules of issue 33 that the kernels meet so far.
    let dir = std::env::temp_dir().join(format!("wgspec-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    // (shape, layers, the matmuls of over 1 MB that 4-column tiles leave under two waves: the
    // 896 columns of Qwen2.5-0.5B's down, the 1,024 of Llama-3.1-8B's Q6_K v; a split of k lifts them)
    for (shape, layers, narrow) in
        [("qwen2-1.5b", 28, None), ("qwen2-0.5b", 24, Some(224)), ("llama-8b", 32, Some(256))]
    {
        let out_file = dir.join(format!("shape-{shape}.json"));
        let o = out_file.to_str().expect("utf8");
        let out = wgspec(&[
            "bench",
            "--synthetic",
            shape,
            "--roofline",
            "--shape-only",
            "--shape",
            "gpu",
            "--out",
            o,
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{shape}: {stderr}");
        assert!(stderr.contains("(no weights)"), "{shape}: {stderr}");
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&out_file).expect("json")).expect("json");
        let ops = v["ops"].as_array().expect("ops");
        let pass = |name: &str| ops.iter().filter(|o| o["pass"] == name).collect::<Vec<_>>();
        let (step, verify) = (pass("step"), pass("verify"));
        let n = |o: &serde_json::Value, key: &str| o[key].as_u64().unwrap_or_else(|| panic!("{key} of {o}"));
        // 4: dispatches (the target is 5 a layer, 3 for the output: today 7 and 4)
        let per_layer = n(&v, "dispatches_per_layer") as usize;
        assert!(per_layer <= 7, "{shape}: {per_layer} dispatches a layer");
        assert_eq!(step.len(), n(&v, "dispatches_per_step") as usize);
        assert!(step.len() <= 1 + layers * per_layer + 4, "{shape}: {} dispatches a step", step.len());
        assert_eq!(step.len(), verify.len(), "{shape}: the same dispatches in a verify pass");
        // 3: attention in two dispatches a layer (chunks, merge): one more than the one-pass shape
        let attention =
            step.iter().filter(|o| o["kernel"].as_str().is_some_and(|k| k.starts_with("Attention")));
        assert_eq!(attention.count(), 2 * layers, "{shape}");
        for (rows, ops) in [(1, &step), (5, &verify)] {
            for o in ops.iter() {
                let (kernel, groups, bytes) =
                    (o["kernel"].as_str().expect("kernel"), n(o, "workgroups"), n(o, "bytes"));
                // 1: no reduction of more than 256 KiB runs in a few workgroups a row (the
                // one-workgroup argmax read 0.6 MB of logits a row); matmuls: rule 2
                let matmul = kernel.starts_with("Matmul");
                assert!(matmul || bytes <= 256 << 10 || groups >= 16 * rows, "{shape} {rows} rows: {o}");
                // the longest loop of an invocation: 3, the attention chunks' (2,608 steps when
                // each invocation walked every key's value row); the others'
                let most = if kernel.starts_with("AttentionChunks") { 768 } else { 160 };
                assert!(n(o, "serial_iterations") <= most, "{shape}: {o}");
                // 2: a matmul that moves more than 1 MB fills two waves of 132 SMs
                if matmul && bytes > 1 << 20 && groups < 264 {
                    assert_eq!(Some(groups), narrow, "{shape} {rows} rows: {o}");
                }
            }
        }
        // a verify pass reads each weight once: its matmuls launch a step's workgroups (one group
        // of up to 16 rows)
        let matmuls = |ops: &[&serde_json::Value]| {
            ops.iter()
                .filter(|o| o["kernel"].as_str().is_some_and(|k| k.starts_with("Matmul")))
                .map(|o| n(o, "workgroups"))
                .collect::<Vec<_>>()
        };
        assert_eq!(matmuls(&step), matmuls(&verify), "{shape}");
    }
}

#[test]
fn the_prompt_comes_from_a_file_or_standard_input() {
    use std::io::Write;
    let model = tiny_model_file("tiny-for-prompt-files.gguf");
    let m = model.to_str().expect("utf8 path");
    let args = ["generate", "--model", m, "--max-tokens", "3", "--json"];
    let direct = json_of(&wgspec(&[&args[..], &["--prompt", "hello world"]].concat()));
    let file = model.with_file_name("prompt.txt");
    std::fs::write(&file, "hello world").expect("write prompt");
    let from_file = json_of(&wgspec(&[&args[..], &["--prompt-file", file.to_str().expect("utf8")]].concat()));
    assert_eq!(from_file["prompt_tokens"], direct["prompt_tokens"]);
    assert_eq!(from_file["tokens"], direct["tokens"]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_wgspec"))
        .args([&args[..], &["--prompt-file", "-"]].concat())
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run wgspec");
    child.stdin.take().expect("stdin").write_all(b"hello world").expect("write stdin");
    let from_stdin = json_of(&child.wait_with_output().expect("wait"));
    assert_eq!(from_stdin["prompt_tokens"], direct["prompt_tokens"]);
    // a device that never ends is refused at the size limit, not read forever
    let out = wgspec(&[&args[..], &["--prompt-file", "/dev/zero"]].concat());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("more than"), "{stderr}");
    // both at once is refused
    let out = wgspec(&[&args[..], &["--prompt", "x", "--prompt-file", "-"]].concat());
    assert!(!out.status.success());
}

//! A seeded mutation fuzzer over everything a model download brings: GGUF files, Hugging Face
//! folders (config.json, safetensors, tokenizer.json) and chat templates. Each case goes through
//! what loading does on the CPU (parse, config, tokenizer, chat template, every tensor of the
//! table converted for upload) and must return `Ok` or a typed `Err`: never a panic, never more
//! than [`CEILING`] bytes allocated, never more than [`SLOW`]. A smaller set of the cases that
//! parse goes all the way through `Model::load` on the GPU.
//!
//! `cargo test --test fuzz` runs [`CASES`] cases (well under two minutes); the long run before a
//! release: `cargo test --release --test fuzz -- --ignored` ([`LONG_CASES`]).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::tiny::{TinyModel, TinySpec};
use common::{gpu, rng};
use rand::rngs::SmallRng;
use rand::Rng;
use wgspec::files::{ModelFiles, OpenedModel};
use wgspec::loader::gguf::{Gguf, Value};
use wgspec::loader::gguf_writer::GgufWriter;
use wgspec::loader::DType;
use wgspec::model::{LoadOptions, Model, Precision, TensorTable};
use wgspec::tokenizer::{ChatTemplate, Message, Tokenizer};

/// Counts live heap bytes and their peak, so each case's allocations can be bounded.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let now = LIVE.fetch_add(by, Relaxed) + by;
    PEAK.fetch_max(now, Relaxed);
}

// SAFETY: every call is forwarded to the system allocator unchanged; only counters are kept.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = System.alloc(l);
        if !p.is_null() {
            grew(l.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(l);
        if !p.is_null() {
            grew(l.size());
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l);
        LIVE.fetch_sub(l.size(), Relaxed);
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        let q = System.realloc(p, l, new);
        if !q.is_null() {
            if new >= l.size() {
                grew(new - l.size());
            } else {
                LIVE.fetch_sub(l.size() - new, Relaxed);
            }
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Held by each test while it counts: the counters are the process's, and tests run in threads.
static COUNTING: Mutex<()> = Mutex::new(());

/// The most one case may allocate on top of what was live before it (the files are ~100 kB; a
/// loader that trusts a declared size allocates gigabytes).
const CEILING: usize = 64 << 20;
/// The longest one case may take (a hostile template's budget ends it well within).
const SLOW: Duration = Duration::from_secs(5);
const CASES: usize = 10_000;
const LONG_CASES: usize = 200_000;
/// Cases of the short run that parse and then go through `Model::load` on the GPU.
const GPU_CASES: usize = 40;

/// One mutated input.
enum Input {
    Gguf(Vec<u8>),
    Folder { config: Vec<u8>, safetensors: Vec<u8>, tokenizer: Vec<u8> },
    Template(String),
}

/// The unmutated files the mutations start from.
struct Bases {
    ggufs: Vec<Vec<u8>>,
    /// Each GGUF's header length.
    headers: Vec<usize>,
    llama: TinyModel,
    config: Vec<u8>,
    safetensors: Vec<u8>,
    tokenizer: Vec<u8>,
}

fn bases(r: &mut SmallRng) -> Bases {
    let llama = TinyModel::random(TinySpec::llama(), r);
    let qwen = TinyModel::random(TinySpec::qwen2(), r);
    let ggufs = vec![
        llama.to_gguf(DType::F32, r),
        llama.to_gguf(DType::Q8_0, r),
        qwen.to_gguf(DType::Q4_0, r),
        qwen.to_gguf(DType::Q4_1, r),
    ];
    let header = Gguf::parse(&ggufs[0], ggufs[0].len() as u64).expect("base gguf");
    let tokenizer = Tokenizer::from_gguf(&header).expect("tokenizer").inner().to_string(false).expect("json");
    let (config, safetensors) = qwen.to_safetensors(DType::BF16);
    let headers = ggufs.iter().map(|g| header_len(g)).collect();
    Bases { ggufs, headers, llama, config, safetensors, tokenizer: tokenizer.into_bytes() }
}

/// Where a GGUF's header ends (its tensor data begins).
fn header_len(file: &[u8]) -> usize {
    let g = Gguf::parse(file, file.len() as u64).expect("base gguf");
    (g.data_offset as usize).clamp(24, file.len())
}

const EXTREMES: [u64; 8] = [0, 1, 0x7F, 0xFF, 0x8000_0000, 0xFFFF_FFFF, 0x7FFF_FFFF_FFFF_FFFF, u64::MAX];

/// Metadata keys a loader reads, with values of the wrong type, sign or size.
fn hostile_value(r: &mut SmallRng) -> Value {
    match r.gen_range(0..13) {
        0 => Value::I32(-r.gen_range(1..100_000)),
        1 => Value::U32(0),
        2 => Value::U32(u32::MAX),
        3 => Value::U64(u64::MAX),
        4 => Value::I64(i64::MIN),
        5 => Value::F32(f32::NAN),
        6 => Value::F32(f32::NEG_INFINITY),
        7 => Value::F64(1e300),
        8 => Value::Bool(true),
        9 => Value::String("4096".into()),
        10 => Value::String("\u{1b}]0;pwned\u{7}\u{1b}[31m".into()),
        11 => Value::Array(vec![]),
        _ => Value::Array(vec![Value::U32(r.gen()); r.gen_range(1..5)]),
    }
}

const KEYS: [&str; 22] = [
    "general.architecture",
    "llama.context_length",
    "llama.embedding_length",
    "llama.block_count",
    "llama.feed_forward_length",
    "llama.attention.head_count",
    "llama.attention.head_count_kv",
    "llama.attention.key_length",
    "llama.attention.layer_norm_rms_epsilon",
    "llama.rope.freq_base",
    "llama.rope.dimension_count",
    "llama.rope.scaling.type",
    "llama.vocab_size",
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.chat_template",
];

/// Chat templates as an attacker writes them; each must end within its budget.
fn hostile_template(r: &mut SmallRng) -> String {
    let n = [3, 100, 10_000, 1_000_000][r.gen_range(0..4)];
    match r.gen_range(0..12) {
        0 => format!("{{% for a in range({n}) %}}{{% for b in range({n}) %}}x{{% endfor %}}{{% endfor %}}"),
        1 => format!("{{{{ 'x' * {n} }}}}{{{{ 'y' * {n} }}}}"),
        2 => "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}".into(),
        3 => "{% if true %}".repeat(r.gen_range(1..3000)),
        4 => "{{ ".repeat(r.gen_range(1..3000)),
        5 => format!("{{% for m in messages * {n} %}}{{{{ m.content }}}}{{% endfor %}}"),
        6 => "{{ raise_exception('no') }}".into(),
        7 => format!("{{% set ns = namespace(s='ab') %}}{{% for i in range({}) %}}{{% set ns.s = ns.s ~ 'ab' %}}{{% endfor %}}{{{{ ns.s }}}}", n.min(10_000)),
        // doubling: a string, a capture, a list of references turned into text
        8 => format!("{{% set ns = namespace(s='ab') %}}{{% for i in range({n}) %}}{{% set ns.s = ns.s ~ ns.s %}}{{% endfor %}}"),
        9 => format!("{{% set ns = namespace(s='ab') %}}{{% for i in range({n}) %}}{{% set c %}}{{{{ ns.s }}}}{{{{ ns.s }}}}{{% endset %}}{{% set ns.s = c %}}{{% endfor %}}"),
        10 => format!("{{% set ns = namespace(l=['ab']) %}}{{% for i in range({n}) %}}{{% set ns.l = ns.l + ns.l %}}{{% endfor %}}{{{{ ns.l | join }}}}"),
        _ => {
            let bytes: Vec<u8> = (0..r.gen_range(1..200)).map(|_| r.gen_range(b' '..=b'~')).collect();
            String::from_utf8(bytes).unwrap_or_default()
        }
    }
}

/// The mutation class names, in the order [`mutate`] draws them.
const CLASSES: [&str; 10] = [
    "gguf truncated",
    "gguf header bytes flipped",
    "gguf header field set to an extreme",
    "gguf metadata of a wrong type or range",
    "gguf tensor shapes inconsistent",
    "config.json values of a wrong type or range",
    "safetensors header bytes flipped",
    "safetensors truncated",
    "tokenizer.json bytes flipped",
    "chat template hostile",
];

fn mutate(b: &Bases, class: usize, r: &mut SmallRng) -> Input {
    let which = r.gen_range(0..b.ggufs.len());
    let (gguf, header) = (&b.ggufs[which], b.headers[which]);
    let folder = |config: &[u8], safetensors: &[u8], tokenizer: &[u8]| Input::Folder {
        config: config.to_vec(),
        safetensors: safetensors.to_vec(),
        tokenizer: tokenizer.to_vec(),
    };
    match class {
        0 => {
            let end = if r.gen_bool(0.7) { header } else { gguf.len() };
            Input::Gguf(gguf[..r.gen_range(0..end)].to_vec())
        }
        1 => {
            let mut f = gguf.clone();
            for _ in 0..r.gen_range(1..6) {
                let i = r.gen_range(0..header);
                f[i] = r.gen();
            }
            Input::Gguf(f)
        }
        2 => {
            let mut f = gguf.clone();
            let width = [1, 2, 4, 8][r.gen_range(0..4)];
            let at = r.gen_range(0..header.saturating_sub(width).max(1));
            let v = EXTREMES[r.gen_range(0..EXTREMES.len())].to_le_bytes();
            let stop = (at + width).min(f.len());
            f[at..stop].copy_from_slice(&v[..stop - at]);
            Input::Gguf(f)
        }
        3 => {
            let overrides: Vec<(&str, Value)> = (0..r.gen_range(1..4))
                .map(|_| (KEYS[r.gen_range(0..KEYS.len())], hostile_value(r)))
                .collect();
            Input::Gguf(b.llama.to_gguf_with(DType::Q8_0, r, &overrides))
        }
        4 => {
            let mut m = TinyModel { spec: b.llama.spec, tensors: b.llama.tensors.clone() };
            let i = r.gen_range(0..m.tensors.len());
            let t = &mut m.tensors[i];
            match r.gen_range(0..3) {
                0 => t.shape.reverse(),
                1 => {
                    t.shape[0] *= 2;
                    t.values = t.values.repeat(2);
                }
                _ => {
                    m.tensors.remove(i);
                }
            }
            Input::Gguf(m.to_gguf(DType::F32, r))
        }
        5 => {
            let mut config: serde_json::Value = serde_json::from_slice(&b.config).expect("config");
            let keys: Vec<String> =
                config.as_object().map(|o| o.keys().cloned().collect()).unwrap_or_default();
            let key = &keys[r.gen_range(0..keys.len())];
            let weird = [
                serde_json::json!(-1),
                serde_json::json!(0),
                serde_json::json!(1e20),
                serde_json::json!(4294967296u64),
                serde_json::json!("x"),
                serde_json::json!(null),
                serde_json::json!([]),
                serde_json::json!({}),
                serde_json::json!(true),
            ];
            config[key] = weird[r.gen_range(0..weird.len())].clone();
            folder(&serde_json::to_vec(&config).expect("json"), &b.safetensors, &b.tokenizer)
        }
        6 => {
            let mut st = b.safetensors.clone();
            let header = 8 + u64::from_le_bytes(st[..8].try_into().expect("8 bytes")) as usize;
            for _ in 0..r.gen_range(1..4) {
                let i = r.gen_range(0..header.min(st.len()));
                st[i] = r.gen();
            }
            folder(&b.config, &st, &b.tokenizer)
        }
        7 => folder(&b.config, &b.safetensors[..r.gen_range(0..b.safetensors.len())], &b.tokenizer),
        8 => {
            let mut tok = b.tokenizer.clone();
            for _ in 0..r.gen_range(1..4) {
                let i = r.gen_range(0..tok.len());
                tok[i] = r.gen_range(b' '..=b'~');
            }
            folder(&b.config, &b.safetensors, &tok)
        }
        _ => Input::Template(hostile_template(r)),
    }
}

/// What loading does on the CPU, to the end: files -> checkpoint, tokenizer, template -> every
/// tensor of the table as it would be uploaded; a chat rendered and a text encoded.
/// A model input's files opened (checkpoint, tokenizer, template); `None` for a template alone.
fn open(input: &Input) -> wgspec::Result<Option<OpenedModel>> {
    let mut files = ModelFiles::new();
    match input {
        Input::Template(_) => return Ok(None),
        Input::Gguf(bytes) => files.add("model.gguf", bytes.clone())?,
        Input::Folder { config, safetensors, tokenizer } => {
            files.add("config.json", config.clone())?;
            files.add("model.safetensors", safetensors.clone())?;
            files.add("tokenizer.json", tokenizer.clone())?;
        }
    }
    files.open().map(Some)
}

fn load_on_cpu(input: &Input) -> wgspec::Result<()> {
    let chat = [Message { role: "user".into(), content: "hi <|eos|>".into() }];
    let opened = match (input, open(input)?) {
        (Input::Template(source), _) => {
            let t = ChatTemplate::new(source, "<s>", "</s>");
            return t.render(&chat, true).map(drop);
        }
        (_, Some(opened)) => opened,
        (_, None) => return Ok(()),
    };
    for t in TensorTable::new(&opened.checkpoint.config).iter() {
        opened.checkpoint.tensor(&t.name, &t.shape, Precision::Auto)?;
    }
    opened.tokenizer.encode("hello <|eos|> world", true)?;
    if let Some(t) = &opened.chat_template {
        t.prompt_tokens(&chat, &opened.tokenizer)?;
    }
    Ok(())
}

/// Runs `cases` cases from `seed`; returns (class -> (ok, err)) and the parsing inputs kept for
/// the GPU.
fn run(seed: u64, cases: usize, keep_for_gpu: usize) -> (BTreeMap<&'static str, (usize, usize)>, Vec<Input>) {
    let mut r = rng(seed);
    let b = bases(&mut r);
    let mut outcome: BTreeMap<&'static str, (usize, usize)> = BTreeMap::new();
    let mut for_gpu = Vec::new();
    for case in 0..cases {
        let class = case % CLASSES.len();
        let input = mutate(&b, class, &mut r);
        let before = LIVE.load(Relaxed);
        PEAK.store(before, Relaxed);
        let t = Instant::now();
        let result = catch_unwind(AssertUnwindSafe(|| load_on_cpu(&input)));
        let (took, peak) = (t.elapsed(), PEAK.load(Relaxed).saturating_sub(before));
        let name = CLASSES[class];
        let Ok(result) = result else { panic!("case {case} ({name}) panicked") };
        if peak > CEILING {
            if let Input::Template(t) = &input {
                eprintln!("TEMPLATE {t}");
            }
        }
        assert!(peak <= CEILING, "case {case} ({name}) allocated {peak} bytes");
        assert!(took <= SLOW, "case {case} ({name}) took {took:?}");
        let entry = outcome.entry(name).or_default();
        match result {
            Ok(()) => {
                entry.0 += 1;
                if for_gpu.len() < keep_for_gpu && !matches!(input, Input::Template(_)) && class != 0 {
                    for_gpu.push(input);
                }
            }
            Err(e) => {
                entry.1 += 1;
                assert!(
                    !e.to_string().contains('\u{1b}'),
                    "case {case} ({name}): an escape reached the message: {e}"
                );
            }
        }
    }
    (outcome, for_gpu)
}

fn report(outcome: &BTreeMap<&'static str, (usize, usize)>, seconds: f64) {
    let total: usize = outcome.values().map(|(ok, err)| ok + err).sum();
    eprintln!(
        "fuzz: {total} cases in {seconds:.1} s, no panic, every case within {CEILING} bytes and {SLOW:?}"
    );
    for (name, (ok, err)) in outcome {
        eprintln!("  {name:<45} ok {ok:>6}  typed error {err:>6}");
    }
}

#[test]
fn mutated_model_files_and_templates_load_or_fail_cleanly() {
    let _counting = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let t = Instant::now();
    let (outcome, for_gpu) = run(2026, CASES, GPU_CASES);
    report(&outcome, t.elapsed().as_secs_f64());
    assert_eq!(outcome.len(), CLASSES.len(), "every class ran");
    for (name, (ok, err)) in &outcome {
        // Each class must reach the loaders' checks and get past some of them: a class that
        // always fails at the first byte, or never fails, tests nothing. (A truncated file or a
        // flipped safetensors header never loads.)
        assert!(*err > 0, "{name}: no case was refused");
        let can_load = !name.contains("truncated") && !name.starts_with("safetensors header");
        assert!(!can_load || *ok > 0, "{name}: no case loaded");
    }
    // The cases that load on the CPU go through the GPU upload too.
    assert!(!for_gpu.is_empty(), "some mutated files still load");
    for input in &for_gpu {
        let result = catch_unwind(AssertUnwindSafe(|| -> wgspec::Result<()> {
            let Some(opened) = open(input)? else { return Ok(()) };
            let opts = LoadOptions { context: Some(32), ..Default::default() };
            let mut model = Model::load(gpu(), &opened.checkpoint, &opts, &mut |_| {})?;
            pollster::block_on(model.forward_argmax(&[1, 2], 0))?;
            Ok(())
        }));
        assert!(result.is_ok(), "a mutated model panicked in Model::load or forward");
    }
    eprintln!("fuzz: {} loading cases through Model::load and a forward pass", for_gpu.len());
}

#[test]
#[ignore = "the long run before a release: cargo test --release --test fuzz -- --ignored"]
fn long_fuzz_run() {
    let _counting = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let t = Instant::now();
    let (outcome, _) = run(7, LONG_CASES, 0);
    report(&outcome, t.elapsed().as_secs_f64());
}

/// The size of an input's files.
fn input_len(input: &Input) -> usize {
    match input {
        Input::Gguf(bytes) => bytes.len(),
        Input::Folder { config, safetensors, tokenizer } => {
            config.len() + safetensors.len() + tokenizer.len()
        }
        Input::Template(t) => t.len(),
    }
}

/// A GGUF of the tiny llama's metadata, `extra` keys added, its tensors or `tensors` alone.
fn gguf_with(base: &[u8], extra: Vec<(String, Value)>, tensors: Option<usize>) -> Vec<u8> {
    let g = Gguf::parse(base, base.len() as u64).expect("base gguf");
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata.iter().filter(|(k, _)| !extra.iter().any(|(e, _)| e == k)).chain(&extra) {
        w.add(k, v.clone());
    }
    match tensors {
        // (distinct names at distinct offsets: a well-formed table, only long)
        Some(n) => (0..n).for_each(|i| w.add_tensor(&format!("x.{i}"), DType::F32, &[1], vec![0; 4])),
        None => {
            for t in &g.tensors {
                let at = t.offset as usize;
                w.add_tensor(&t.name, t.dtype, &t.shape, base[at..at + t.n_bytes as usize].to_vec());
            }
        }
    }
    w.to_bytes()
}

/// A SentencePiece vocabulary of `tokens` (the first three `<unk>`, `<s>`, `</s>`), scored in
/// their order.
fn spm_vocab(tokens: Vec<String>) -> Vec<(String, Value)> {
    let n = tokens.len();
    let types = (0..n).map(|i| Value::I32([2, 3, 3].get(i).copied().unwrap_or(1))).collect();
    vec![
        ("tokenizer.ggml.model".into(), Value::String("llama".into())),
        ("tokenizer.ggml.tokens".into(), Value::Array(tokens.into_iter().map(Value::String).collect())),
        ("tokenizer.ggml.token_type".into(), Value::Array(types)),
        ("tokenizer.ggml.scores".into(), Value::Array((0..n).map(|i| Value::F32(-(i as f32))).collect())),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(2)),
    ]
}

/// Inputs at the scale a header may reach (megabytes), each aimed at a cost that grows faster
/// than the file: a duplicate check over every earlier key or tensor, the merges of a long
/// SentencePiece token or of every prefix of one, a value table many times its bytes, added
/// tokens by the hundred thousand, a tokenizer.json id that sizes a table.
#[test]
fn header_scale_inputs_end_within_their_time_and_memory() {
    let _counting = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let mut r = rng(31);
    let llama = TinyModel::random(TinySpec::llama(), &mut r);
    let base = llama.to_gguf(DType::F32, &mut r);
    let (config, safetensors) = llama.to_safetensors(DType::F32);
    let tokenizer_json = |edit: &dyn Fn(&mut serde_json::Value)| {
        let header = Gguf::parse(&base, base.len() as u64).expect("base gguf");
        let json = Tokenizer::from_gguf(&header).expect("tokenizer").inner().to_string(false).expect("json");
        let mut json: serde_json::Value = serde_json::from_str(&json).expect("json");
        edit(&mut json);
        Input::Folder {
            config: config.clone(),
            safetensors: safetensors.clone(),
            tokenizer: serde_json::to_vec(&json).expect("json"),
        }
    };
    let added = |id: u64, content: &str| {
        serde_json::json!({"id": id, "content": content, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true})
    };
    let keys = (0..300_000).map(|i| (format!("x.k{i:06}"), Value::U8(0))).collect();
    let spm = |long: String| spm_vocab(vec!["<unk>".into(), "<s>".into(), "</s>".into(), long]);
    let pyramid =
        ["<unk>", "<s>", "</s>"].map(String::from).into_iter().chain((1..=1000).map(|l| "a".repeat(l)));
    let controls = |n: usize| {
        let mut v = spm_vocab((0..n).map(|i| format!("<c{i}>")).collect());
        v[2].1 = Value::Array(vec![Value::I32(3); n]);
        Input::Gguf(gguf_with(&base, v, None))
    };
    let bytes = vec![("x.bytes".to_string(), Value::Array(vec![Value::U8(0); 9_000_000]))];
    // (what each must end in: loaded, or refused with these words)
    let cases: Vec<(&str, Input, Result<(), &str>)> = vec![
        ("300,000 metadata keys", Input::Gguf(gguf_with(&base, keys, None)), Ok(())),
        ("300,000 tensors", Input::Gguf(gguf_with(&base, vec![], Some(300_000))), Err("missing tensor")),
        ("a u8 array of 9,000,000 values", Input::Gguf(gguf_with(&base, bytes, None)), Err("array values")),
        (
            "a 1 MB SentencePiece token",
            Input::Gguf(gguf_with(&base, spm("a".repeat(1 << 20)), None)),
            Err("too long"),
        ),
        (
            "every prefix of a 1000-byte SentencePiece token",
            Input::Gguf(gguf_with(&base, spm_vocab(pyramid.collect()), None)),
            Err("merges"),
        ),
        // (a speech vocabulary's 65,536 loads; one over the limit is refused before it is built)
        ("65,536 control tokens", controls(65_536), Ok(())),
        ("262,145 control tokens", controls(262_145), Err("control and user-defined tokens")),
        (
            "a tokenizer.json id of 4,000,000,000",
            tokenizer_json(&|j| {
                j["model"]["vocab"]["zzz"] = serde_json::json!(4_000_000_000u64);
                j["added_tokens"].as_array_mut().expect("added tokens").push(added(0, "zzz"));
            }),
            Err("beyond the largest vocabulary"),
        ),
        (
            "262,144 tokenizer.json added tokens",
            tokenizer_json(&|j| {
                // (refused by their count, before the tokenizers crate reads one: a 31 MB file
                // read within four times its bytes)
                let list = j["added_tokens"].as_array_mut().expect("added tokens");
                list.extend((0..262_144).map(|i| added(1000 + i, &format!("<a{i}>"))));
            }),
            Err("added tokens"),
        ),
    ];
    for (name, input, expected) in cases {
        let size = input_len(&input);
        let before = LIVE.load(Relaxed);
        PEAK.store(before, Relaxed);
        let t = Instant::now();
        let result = catch_unwind(AssertUnwindSafe(|| load_on_cpu(&input)));
        let (took, peak) = (t.elapsed(), PEAK.load(Relaxed).saturating_sub(before));
        let Ok(result) = result else { panic!("{name}: panicked") };
        eprintln!("{name}: {size} bytes, {took:?}, {peak} bytes allocated: {result:?}");
        match (&result, expected) {
            (Ok(()), Ok(())) => {}
            (Err(e), Err(words)) if e.to_string().contains(words) => {}
            _ => panic!("{name}: {result:?}, expected {expected:?}"),
        }
        assert!(peak <= CEILING + 4 * size, "{name}: allocated {peak} bytes for {size}");
        assert!(took <= SLOW, "{name}: took {took:?}");
    }
}

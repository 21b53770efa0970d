//! Tokenizer tests against llama.cpp's own test vectors (`ggml-vocab-*.gguf` with `.inp`/`.out`)
//! and a Hugging Face tokenizer.json. The files come from `scripts/fetch_vocab.sh` into
//! `${WGSPEC_CACHE:-$HOME/.cache/wgspec}/vocab/`; a missing file fails the test.
//!
//! Vector format (llama.cpp `tests/test-tokenizer-0.cpp`): the `.inp` file holds the inputs
//! separated by `"\n__ggml_vocab_test__\n"` (the file ends with one), the `.out` file one line of
//! space-separated ids per input, produced with `add_special = false`, `parse_special = false`.

use std::path::PathBuf;

use wgspec::loader::gguf::{Gguf, Value};
use wgspec::loader::gguf_writer::GgufWriter;
use wgspec::tokenizer::{GgufVocab, StreamDecoder, Tokenizer};
use wgspec::Error;

const VOCABS: [&str; 4] = ["qwen2", "llama-bpe", "gpt-2", "starcoder"];

fn vocab_dir() -> PathBuf {
    let cache = match std::env::var_os("WGSPEC_CACHE") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").expect("HOME is not set")).join(".cache/wgspec"),
    };
    cache.join("vocab")
}

/// The path of a cached test file; fails loudly when it is missing.
fn need(name: &str) -> PathBuf {
    let path = vocab_dir().join(name);
    assert!(
        path.is_file(),
        "missing tokenizer test file {}: run scripts/fetch_vocab.sh (honours WGSPEC_CACHE)",
        path.display()
    );
    path
}

fn read(name: &str) -> Vec<u8> {
    std::fs::read(need(name)).unwrap()
}

/// The (input, expected ids) pairs of one vocabulary.
fn vectors(vocab: &str) -> Vec<(String, Vec<u32>)> {
    let inp = String::from_utf8(read(&format!("ggml-vocab-{vocab}.gguf.inp"))).unwrap();
    let out = String::from_utf8(read(&format!("ggml-vocab-{vocab}.gguf.out"))).unwrap();
    let sep = "\n__ggml_vocab_test__\n";
    let mut inputs: Vec<String> = inp.split(sep).map(str::to_string).collect();
    // llama.cpp stops at the end of the file: the text after the last separator is no test.
    if inputs.last().is_some_and(|s| s.is_empty()) {
        inputs.pop();
    }
    let outputs: Vec<Vec<u32>> =
        out.lines().map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect()).collect();
    assert_eq!(inputs.len(), outputs.len(), "{vocab}: .inp and .out disagree on the number of tests");
    assert!(inputs.len() >= 40, "{vocab}: only {} vectors", inputs.len());
    inputs.into_iter().zip(outputs).collect()
}

// ---- a minimal GGUF metadata reader (test-only, independent of the crate's loader) ----

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

enum Val {
    Int(i64),
    F32(f32),
    Bool(bool),
    Str(String),
    Arr(Vec<Val>),
    Other,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        s
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().unwrap())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take(8).try_into().unwrap())
    }
    fn string(&mut self) -> String {
        let n = self.u64() as usize;
        String::from_utf8(self.take(n).to_vec()).unwrap()
    }
    fn value(&mut self, ty: u32) -> Val {
        match ty {
            0 => Val::Int(self.take(1)[0] as i64),
            1 => Val::Int(self.take(1)[0] as i8 as i64),
            2 => Val::Int(u16::from_le_bytes(self.take(2).try_into().unwrap()) as i64),
            3 => Val::Int(i16::from_le_bytes(self.take(2).try_into().unwrap()) as i64),
            4 => Val::Int(self.u32() as i64),
            5 => Val::Int(self.u32() as i32 as i64),
            6 => Val::F32(f32::from_le_bytes(self.take(4).try_into().unwrap())),
            7 => Val::Bool(self.take(1)[0] != 0),
            8 => Val::Str(self.string()),
            9 => {
                let ty = self.u32();
                let n = self.u64();
                Val::Arr((0..n).map(|_| self.value(ty)).collect())
            }
            10 | 11 => Val::Int(self.u64() as i64),
            12 => {
                self.take(8);
                Val::Other
            }
            t => panic!("unknown GGUF value type {t}"),
        }
    }
}

fn read_gguf_vocab(vocab: &str) -> GgufVocab {
    let bytes = read(&format!("ggml-vocab-{vocab}.gguf"));
    let mut r = Reader { b: &bytes, pos: 0 };
    assert_eq!(r.take(4), b"GGUF");
    let _version = r.u32();
    let _tensors = r.u64();
    let n_kv = r.u64();
    let mut kv = std::collections::HashMap::new();
    for _ in 0..n_kv {
        let key = r.string();
        let ty = r.u32();
        kv.insert(key, r.value(ty));
    }
    let str_of = |k: &str| match kv.get(k) {
        Some(Val::Str(s)) => Some(s.clone()),
        _ => None,
    };
    let id_of = |k: &str| match kv.get(k) {
        Some(Val::Int(i)) => Some(*i as u32),
        _ => None,
    };
    let bool_of = |k: &str| match kv.get(k) {
        Some(Val::Bool(b)) => Some(*b),
        _ => None,
    };
    let arr = |k: &str| match kv.get(k) {
        Some(Val::Arr(a)) => a,
        _ => panic!("{k} missing"),
    };
    let strings = |k: &str| {
        arr(k)
            .iter()
            .map(|v| match v {
                Val::Str(s) => s.clone(),
                _ => panic!("{k}: not a string"),
            })
            .collect::<Vec<_>>()
    };
    let pre = str_of("tokenizer.ggml.pre");
    GgufVocab {
        model: str_of("tokenizer.ggml.model").unwrap(),
        add_bos: bool_of("tokenizer.ggml.add_bos_token").unwrap_or(
            str_of("tokenizer.ggml.model").as_deref() == Some("llama")
                || matches!(pre.as_deref(), Some("llama-bpe" | "llama3" | "llama-v3")),
        ),
        add_eos: bool_of("tokenizer.ggml.add_eos_token").unwrap_or(false),
        pre,
        tokens: strings("tokenizer.ggml.tokens"),
        token_types: arr("tokenizer.ggml.token_type")
            .iter()
            .map(|v| match v {
                Val::Int(i) => *i as i32,
                _ => panic!("token type"),
            })
            .collect(),
        merges: match kv.get("tokenizer.ggml.merges") {
            Some(_) => strings("tokenizer.ggml.merges"),
            None => Vec::new(),
        },
        scores: match kv.get("tokenizer.ggml.scores") {
            Some(Val::Arr(a)) => a
                .iter()
                .map(|v| match v {
                    Val::F32(x) => *x,
                    _ => panic!("score"),
                })
                .collect(),
            _ => Vec::new(),
        },
        add_space_prefix: bool_of("tokenizer.ggml.add_space_prefix").unwrap_or(true),
        bos: id_of("tokenizer.ggml.bos_token_id"),
        eos: id_of("tokenizer.ggml.eos_token_id"),
        eot: id_of("tokenizer.ggml.eot_token_id"),
        strip_after_specials: str_of("general.architecture").as_deref() == Some("phi3")
            && str_of("tokenizer.ggml.model").as_deref() == Some("llama"),
    }
}

fn parse_gguf(vocab: &str) -> Gguf {
    let bytes = read(&format!("ggml-vocab-{vocab}.gguf"));
    Gguf::parse(&bytes, bytes.len() as u64).unwrap()
}

/// The tokenizer of a vocabulary file, through the crate's GGUF loader.
fn gguf_tokenizer(vocab: &str) -> Tokenizer {
    Tokenizer::from_gguf(&parse_gguf(vocab)).unwrap()
}

fn json_tokenizer() -> Tokenizer {
    Tokenizer::from_json(&read("qwen3-tokenizer.json")).unwrap()
}

#[test]
fn from_gguf_reads_the_vocab_fields() {
    for vocab in VOCABS {
        let from_loader = GgufVocab::from_gguf(&parse_gguf(vocab)).unwrap();
        let independent = read_gguf_vocab(vocab);
        assert_eq!(from_loader.pre.as_deref(), Some(vocab));
        assert_eq!(from_loader.add_bos, vocab == "llama-bpe", "{vocab}: llama.cpp's add_bos default");
        assert!(from_loader == independent, "{vocab}: GgufVocab::from_gguf differs from a plain reading");
    }
}

#[test]
fn from_gguf_metadata_errors() {
    let tiny = tiny_vocab();
    let strs = |v: &[String]| Value::Array(v.iter().cloned().map(Value::String).collect());
    let write = |types: &[i32], add_bos: Option<Value>| {
        let mut w = GgufWriter::new();
        w.add("general.architecture", Value::String("qwen2".into()));
        w.add("tokenizer.ggml.model", Value::String("gpt2".into()));
        w.add("tokenizer.ggml.pre", Value::String("qwen2".into()));
        w.add("tokenizer.ggml.tokens", strs(&tiny.tokens));
        w.add("tokenizer.ggml.token_type", Value::Array(types.iter().map(|&t| Value::I32(t)).collect()));
        w.add("tokenizer.ggml.merges", strs(&tiny.merges));
        w.add("tokenizer.ggml.eos_token_id", Value::U32(258));
        if let Some(v) = add_bos {
            w.add("tokenizer.ggml.add_bos_token", v);
        }
        let bytes = w.try_to_bytes().unwrap();
        Gguf::parse(&bytes, bytes.len() as u64).unwrap()
    };
    let ok = Tokenizer::from_gguf(&write(&tiny.token_types, Some(Value::Bool(true)))).unwrap();
    assert_eq!(ok.eos_ids(), &[258]);
    assert_eq!(ok.encode("abc", true).unwrap(), vec![257], "add_bos without a bos id adds nothing");

    let e = Tokenizer::from_gguf(&write(&tiny.token_types[1..], None)).unwrap_err();
    assert!(matches!(&e, Error::Metadata { key, .. } if key == "tokenizer.ggml.token_type"), "{e}");
    let e = Tokenizer::from_gguf(&write(&tiny.token_types, Some(Value::U32(1)))).unwrap_err();
    assert!(matches!(&e, Error::Metadata { key, .. } if key == "tokenizer.ggml.add_bos_token"), "{e}");
}

/// Encodes every vector and reports all mismatches at once.
fn check_vectors(name: &str, tok: &Tokenizer, vectors: &[(String, Vec<u32>)]) {
    let mut bad = Vec::new();
    for (text, want) in vectors {
        let got = tok.encode(text, false).unwrap();
        if &got != want {
            bad.push(format!("  {text:?}\n    want {want:?}\n    got  {got:?}"));
        }
    }
    eprintln!("{name}: {}/{} vectors match", vectors.len() - bad.len(), vectors.len());
    assert!(bad.is_empty(), "{name}: {} of {} vectors differ:\n{}", bad.len(), vectors.len(), bad.join("\n"));
}

#[test]
fn qwen2_vectors() {
    check_vectors("qwen2", &gguf_tokenizer("qwen2"), &vectors("qwen2"));
}

#[test]
fn llama_bpe_vectors() {
    check_vectors("llama-bpe", &gguf_tokenizer("llama-bpe"), &vectors("llama-bpe"));
}

/// SentencePiece (`tokenizer.ggml.model = "llama"`, Llama 2's vocabulary): scores, byte
/// fallback, `▁` spaces and the space prefix, as llama.cpp's own vectors say.
#[test]
fn llama_spm_vectors() {
    let tok = gguf_tokenizer("llama-spm");
    check_vectors("llama-spm", &tok, &vectors("llama-spm"));
    // BOS added where asked (add_bos_token), and the text decoded back, byte tokens included
    assert_eq!(tok.encode("Hello", true).unwrap()[0], 1);
    for text in ["Hello world", " this is 🦙.cpp", "нещо на Български", "\t\n  x"] {
        let ids = tok.encode(text, false).unwrap();
        assert_eq!(
            tok.decode(&ids).unwrap(),
            format!(" {text}"),
            "{text:?} (the space prefix decodes as a space)"
        );
    }
    // control tokens are matched whole; as plain text they are spelled
    let s = tok.encode("<s>x", false).unwrap();
    assert_eq!(s[0], 1, "{s:?}");
    assert_ne!(tok.encode_plain("<s>x").unwrap()[0], 1);
    assert_eq!(tok.eos_ids(), &[2]);
}

/// Phi-3's SentencePiece vocabulary, as llama.cpp's vectors say.
#[test]
fn phi3_vectors() {
    let tok = gguf_tokenizer("phi-3");
    check_vectors("phi-3", &tok, &vectors("phi-3"));
    // Phi-3's special tokens take the whitespace after them (Hugging Face's `rstrip`, llama.cpp's
    // RSTRIP for files named Phi-3), but for <s>, <unk> and <|endoftext|>: llama.cpp's ids
    // (node-llama-cpp 3.21.1, this vocabulary, special tokens parsed)
    let cases: [(&str, &[u32]); 6] = [
        ("<|user|>\nHi", &[32010, 6324]),
        ("<|user|>\nHello there<|end|>\n<|assistant|>\n", &[32010, 15043, 727, 32007, 32001]),
        (
            "<|system|>\n  You are kind.<|end|>\n<|user|>\n\nHi <|end|> x",
            &[32006, 887, 526, 2924, 29889, 32007, 32010, 6324, 29871, 32007, 921],
        ),
        ("<s> a</s> b<|endoftext|> c<unk> d", &[1, 29871, 263, 2, 289, 32000, 29871, 274, 0, 29871, 270]),
        ("<|user|>Hi", &[32010, 6324]),
        ("<|assistant|> \t\n yes", &[32001, 4874]),
    ];
    for (text, ids) in cases {
        assert_eq!(tok.encode(text, false).unwrap(), ids, "{text:?}");
    }
}

#[test]
fn gpt2_vectors() {
    check_vectors("gpt-2", &gguf_tokenizer("gpt-2"), &vectors("gpt-2"));
}

/// StarCoder's pre-tokenizer is also SmolLM's (`smollm`).
#[test]
fn starcoder_vectors() {
    check_vectors("starcoder", &gguf_tokenizer("starcoder"), &vectors("starcoder"));
}

#[test]
fn tokenizer_json_matches_qwen2_vectors() {
    let json = json_tokenizer();
    check_vectors("qwen3 tokenizer.json", &json, &vectors("qwen2"));
    // Special tokens agree with the GGUF vocabulary too.
    let gguf = gguf_tokenizer("qwen2");
    let chat = "<|im_start|>user\nWrite 12345 in words 😀<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(json.encode(chat, true).unwrap(), gguf.encode(chat, true).unwrap());
    assert_eq!(json.bos(), None, "Qwen's tokenizer.json adds no BOS");
    for id in [151643, 151645] {
        assert!(json.eos_ids().contains(&id), "{id} not in {:?}", json.eos_ids());
    }
}

#[test]
fn round_trip_on_vectors() {
    for vocab in VOCABS {
        let tok = gguf_tokenizer(vocab);
        for (text, _) in vectors(vocab) {
            let ids = tok.encode(&text, false).unwrap();
            assert_eq!(tok.decode(&ids).unwrap(), text, "{vocab}: round trip of {text:?}");
        }
    }
    let json = json_tokenizer();
    for (text, _) in vectors("qwen2") {
        let ids = json.encode(&text, false).unwrap();
        assert_eq!(json.decode(&ids).unwrap(), text, "tokenizer.json: round trip of {text:?}");
    }
}

#[test]
fn special_tokens_and_bos() {
    let qwen = gguf_tokenizer("qwen2");
    let ids = qwen.encode("<|im_start|>user\nhi<|im_end|>", true).unwrap();
    assert_eq!(ids.first(), Some(&151644), "{ids:?}");
    assert_eq!(ids.last(), Some(&151645), "{ids:?}");
    assert_eq!(qwen.decode(&ids).unwrap(), "<|im_start|>user\nhi<|im_end|>");
    assert_eq!(qwen.token_text(151644).as_deref(), Some("<|im_start|>"));
    assert_eq!(qwen.token_text(9707).as_deref(), Some("Hello"));
    // User-defined tokens are matched in text as well.
    assert_eq!(qwen.encode("a[PAD151700]b", false).unwrap()[1], 151700);
    assert_eq!(qwen.bos(), Some(151643));
    assert_eq!(qwen.encode("Hello", true).unwrap(), vec![9707], "qwen2 adds no BOS");
    assert_eq!(qwen.eos_ids(), &[151643, 151645]);
    assert_eq!(qwen.vocab_size(), 151936);

    let llama = gguf_tokenizer("llama-bpe");
    assert_eq!(llama.bos(), Some(128000));
    assert_eq!(llama.encode("Hello", true).unwrap(), vec![128000, 9906]);
    assert_eq!(llama.encode("Hello", false).unwrap(), vec![9906]);
    for id in [128001, 128009] {
        assert!(llama.eos_ids().contains(&id), "{id} not in {:?}", llama.eos_ids());
    }

    let gpt2 = gguf_tokenizer("gpt-2");
    assert_eq!(gpt2.eos_ids(), &[50256]);
    assert_eq!(gpt2.encode("Hello<|endoftext|>", true).unwrap(), vec![15496, 50256]);

    assert!(matches!(
        qwen.decode(&[9707, 151936]),
        Err(Error::TokenOutOfRange { id: 151936, vocab: 151936 })
    ));
}

/// Pushes ids one at a time; the pieces must concatenate to the full decode, and no piece may
/// be produced before its characters are complete.
fn stream(tok: &Tokenizer, ids: &[u32]) -> (String, usize) {
    let mut dec = StreamDecoder::new();
    let mut out = String::new();
    let mut held = 0;
    for &id in ids {
        let piece = dec.push(tok, id).unwrap();
        assert!(!piece.contains('\u{FFFD}'), "piece {piece:?} splits a character");
        if piece.is_empty() {
            held += 1;
        }
        out.push_str(&piece);
    }
    out.push_str(&dec.finish(tok).unwrap());
    (out, held)
}

#[test]
fn stream_decoder_multibyte() {
    let text = "🦙 llamas 😶‍🌫️ say 你好，世界 — ẞtraße ✅ កាន់តែពិសេស 👍🏽!";
    for (name, tok) in
        [("qwen2", gguf_tokenizer("qwen2")), ("gpt-2", gguf_tokenizer("gpt-2")), ("json", json_tokenizer())]
    {
        let ids = tok.encode(text, false).unwrap();
        let full = tok.decode(&ids).unwrap();
        assert_eq!(full, text, "{name}");
        let (streamed, held) = stream(&tok, &ids);
        assert_eq!(streamed, full, "{name}");
        assert!(held > 0, "{name}: no token ended inside a character, the test proves nothing");
    }
}

#[test]
fn stream_decoder_invalid_bytes_match_decode() {
    let tok = gguf_tokenizer("gpt-2");
    // Byte-level entries (GPT-2's byte -> char table): "ð" = 0xF0 and "Ł" = 0x9F (the start
    // of a 4-byte character, cut short), "a", "Ģ" = 0x80 (a lone continuation byte), then 😀.
    let mut ids: Vec<u32> =
        ["ð", "Ł", "a", "Ģ"].iter().map(|t| tok.inner().token_to_id(t).expect(t)).collect();
    ids.extend(tok.encode("😀", false).unwrap());
    let full = tok.decode(&ids).unwrap();
    assert!(full.contains('\u{FFFD}'), "{full:?}");
    assert!(full.ends_with("😀"), "{full:?}");
    let mut dec = StreamDecoder::new();
    let mut out = String::new();
    for &id in &ids {
        out.push_str(&dec.push(&tok, id).unwrap());
    }
    out.push_str(&dec.finish(&tok).unwrap());
    assert_eq!(out, full);
}

/// A tiny byte-level vocabulary: the 256 byte tokens, "ab", "abc", and a control token.
fn tiny_vocab() -> GgufVocab {
    let json: serde_json::Value = serde_json::from_slice(&read("qwen3-tokenizer.json")).unwrap();
    // The first 256 entries of a byte-level vocabulary are the byte characters.
    let vocab = json["model"]["vocab"].as_object().unwrap();
    let mut tokens = vec![String::new(); 256];
    for (t, id) in vocab {
        let id = id.as_u64().unwrap() as usize;
        if id < 256 {
            tokens[id] = t.clone();
        }
    }
    tokens.extend(["ab", "abc", "<|end|>", "12", "123"].map(String::from));
    let mut token_types = vec![1; tokens.len()];
    token_types[258] = 3;
    GgufVocab {
        model: "gpt2".into(),
        pre: Some("qwen2".into()),
        tokens,
        token_types,
        merges: ["a b", "ab c", "1 2", "12 3"].map(String::from).to_vec(),
        bos: Some(258),
        eos: Some(258),
        eot: None,
        add_bos: true,
        add_eos: false,
        ..GgufVocab::default()
    }
}

#[test]
fn tiny_vocab_works() {
    let tok = Tokenizer::from_vocab(tiny_vocab()).unwrap();
    assert_eq!(tok.vocab_size(), 261);
    assert_eq!(tok.encode("abc<|end|>ab", true).unwrap(), vec![258, 257, 258, 256]);
    assert_eq!(tok.eos_ids(), &[258]);
}

/// The digit rules that tell the pre-tokenizers apart (the Qwen2 vocabulary itself has no
/// multi-digit tokens, so its vectors cannot tell `\p{N}` from `\p{N}{1,3}`).
#[test]
fn digit_rules_per_pre_tokenizer() {
    for (pre, want) in [
        ("qwen2", &["1", "2", "3", "4", "Ġ", "1", "2"][..]),
        ("smollm", &["1", "2", "3", "4", "Ġ", "1", "2"]),
        ("llama-bpe", &["123", "4", "Ġ", "12"]),
        ("gpt2", &["123", "4", "Ġ12"]),
        ("gpt-2", &["123", "4", "Ġ12"]),
        ("default", &["123", "4", "Ġ", "12"]),
    ] {
        let mut v = tiny_vocab();
        v.pre = Some(pre.to_string());
        v.tokens.push("Ġ12".to_string());
        v.token_types.push(1);
        v.merges.push("Ġ 12".to_string());
        let tok = Tokenizer::from_vocab(v).unwrap();
        let ids = tok.encode("1234 12", false).unwrap();
        let texts: Vec<String> = ids.iter().map(|&id| tok.token_text(id).unwrap()).collect();
        assert_eq!(texts, want, "pre-tokenizer {pre}");
        assert_eq!(tok.decode(&ids).unwrap(), "1234 12");
    }
}

#[test]
fn bad_vocabularies_are_errors() {
    let err = |v: GgufVocab| Tokenizer::from_vocab(v).unwrap_err().to_string();

    let mut v = tiny_vocab();
    v.pre = Some("klingon-bpe".into());
    let e = err(v);
    assert!(e.contains("klingon-bpe"), "{e}");

    let mut v = tiny_vocab();
    v.model = "bert".into();
    let e = err(v);
    assert!(e.contains("\"bert\""), "{e}");

    let mut v = tiny_vocab();
    v.model = "llama".into();
    v.scores = vec![0.0; 3];
    let e = err(v);
    assert!(e.contains("tokenizer.ggml.scores") && e.contains("3 scores"), "{e}");

    let mut v = tiny_vocab();
    v.merges.push("x nosuchtoken".into());
    let e = err(v);
    assert!(e.contains("nosuchtoken"), "{e}");

    let mut v = tiny_vocab();
    v.merges.push("abc".into());
    let e = err(v);
    assert!(e.contains("merges"), "{e}");

    let mut v = tiny_vocab();
    v.token_types.pop();
    let e = err(v);
    assert!(e.contains("token_type"), "{e}");

    assert!(Tokenizer::from_json(b"{\"not\": \"a tokenizer\"}").is_err());
}

/// A Llama-2-style tokenizer.json (Metaspace, byte fallback): decoding goes through
/// `tokenizers`' decoder, and streaming through re-decoded windows.
#[test]
fn stream_decoder_non_byte_level_json() {
    let json = r#"{
      "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
      "normalizer": {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
      "pre_tokenizer": null, "post_processor": null,
      "decoder": {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
      "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>",
        "continuing_subword_prefix": null, "end_of_word_suffix": null,
        "fuse_unk": true, "byte_fallback": true,
        "vocab": {"<unk>": 0, "<0xE4>": 1, "<0xBD>": 2, "<0xA0>": 3, "▁hi": 4, "▁": 5,
                  "h": 6, "i": 7, "hi": 8},
        "merges": ["h i", "▁ hi"]}
    }"#;
    let tok = Tokenizer::from_json(json.as_bytes()).unwrap();
    let ids = tok.encode("hi 你 hi", false).unwrap();
    assert_eq!(ids, vec![4, 5, 1, 2, 3, 4]);
    let full = tok.decode(&ids).unwrap();
    assert_eq!(full, "hi 你 hi");
    let (streamed, held) = stream(&tok, &ids);
    assert_eq!(streamed, full);
    assert!(held >= 2, "the bytes of 你 must be held back");
    // After a prompt, the ids' text is what they add to it: the first one's space is kept
    // (decoding them alone strips it), the last few prompt ids are the context, and byte-level
    // vocabularies decode as before.
    let prompt = tok.encode("hi hi hi hi hi", false).unwrap();
    // (a prompt whose last 4 ids start inside a character spelled in byte tokens)
    let cjk = tok.encode("hi 你你", false).unwrap();
    assert_eq!(cjk[cjk.len() - 4..], [3, 1, 2, 3]);
    for (prompt, ids, want) in [
        (&prompt, &ids, " hi 你 hi"),
        (&prompt, &vec![5, 1, 2, 3], " 你"),
        (&cjk, &vec![1, 2, 3, 4], "你 hi"),
    ] {
        let t = &tok;
        let mut dec = StreamDecoder::after(prompt);
        let mut out: String = ids.iter().map(|&id| dec.push(t, id).unwrap()).collect();
        out.push_str(&dec.finish(t).unwrap());
        assert_eq!(out, want);
    }
    let qwen = gguf_tokenizer("qwen2");
    let ids = qwen.encode(" Paris 你好", false).unwrap();
    let mut dec = StreamDecoder::after(&qwen.encode("The capital of France is", false).unwrap());
    let out: String = ids.iter().map(|&id| dec.push(&qwen, id).unwrap()).collect();
    assert_eq!(out + &dec.finish(&qwen).unwrap(), " Paris 你好");
    assert!(tok.eos_ids().is_empty());
    assert!(matches!(tok.decode(&[9]), Err(Error::TokenOutOfRange { id: 9, vocab: 9 })));
}

/// A text longer than `n` times [`Tokenizer::max_bytes_per_token`] has more than `n` tokens, on
/// every vocabulary here: byte-level GGUF ones and a tokenizer.json with an NFC normalizer
/// (texts of long runs, of the vocabulary's own longest tokens, NFC-shrinking sequences, and the
/// test vectors).
#[test]
fn no_token_stands_for_more_bytes_than_the_bound() {
    let mut tokenizers: Vec<(String, Tokenizer)> =
        VOCABS.iter().map(|v| (v.to_string(), gguf_tokenizer(v))).collect();
    tokenizers.push(("qwen3 tokenizer.json".into(), json_tokenizer()));
    tokenizers.push(("llama-spm".into(), gguf_tokenizer("llama-spm")));
    for (name, tok) in &tokenizers {
        let bound = tok.max_bytes_per_token().unwrap_or_else(|| panic!("{name}: bounded"));
        assert!((1..=1024).contains(&bound), "{name}: {bound}");
        let longest = (0..tok.vocab_size() as u32)
            .filter_map(|id| tok.decode(&[id]).ok())
            .max_by_key(String::len)
            .unwrap_or_default();
        let mut texts = vec![
            " ".repeat(4000),
            "=".repeat(4000),
            "\n".repeat(4000),
            longest.repeat(50),
            // Decomposed Hangul jamo (9 bytes per syllable) and Kelvin signs, which NFC shrinks.
            "\u{1100}\u{1161}\u{11A8}".repeat(300),
            "\u{212A}".repeat(300),
        ];
        texts.extend(VOCABS.iter().flat_map(|v| vectors(v)).map(|(text, _)| text));
        for text in texts {
            let tokens = tok.encode(&text, false).unwrap().len();
            assert!(
                tokens * bound >= text.len(),
                "{name}: {} bytes in {tokens} tokens, bound {bound}",
                text.len()
            );
        }
        eprintln!("{name}: at most {bound} bytes per token (longest token {:?})", longest);
    }
    // A normalizer that deletes text (here: stripping) leaves no bound.
    let mut json: serde_json::Value = serde_json::from_slice(&read("qwen3-tokenizer.json")).unwrap();
    json["normalizer"] = serde_json::json!({"type": "Strip", "strip_left": true, "strip_right": true});
    let stripping = Tokenizer::from_json(json.to_string().as_bytes()).unwrap();
    assert_eq!(stripping.max_bytes_per_token(), None);
    // So does a pre-tokenizer that drops what it splits on, and an added token that takes the
    // whitespace beside it.
    let mut json: serde_json::Value = serde_json::from_slice(&read("qwen3-tokenizer.json")).unwrap();
    json["pre_tokenizer"] = serde_json::json!({"type": "Whitespace"});
    assert_eq!(Tokenizer::from_json(json.to_string().as_bytes()).unwrap().max_bytes_per_token(), None);
    let mut json: serde_json::Value = serde_json::from_slice(&read("qwen3-tokenizer.json")).unwrap();
    json["added_tokens"][0]["lstrip"] = serde_json::json!(true);
    assert_eq!(Tokenizer::from_json(json.to_string().as_bytes()).unwrap().max_bytes_per_token(), None);
}

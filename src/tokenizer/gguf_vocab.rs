//! A GGUF-embedded vocabulary (`tokenizer.ggml.*`) and its tokenizer: byte-level BPE (`gpt2`)
//! or SentencePiece (`llama`: Llama 2, Mistral, Phi-3, Gemma).

use std::sync::Arc;

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

use super::{byte_level, Derived, Detok, PreKind, Specials, Tokenizer, EOG_TEXTS};
use crate::error::{Error, Result};
use crate::loader::gguf::{Gguf, Value};

/// GGUF token type CONTROL: a special token (BOS, `<|im_start|>`, ...).
pub const TOKEN_TYPE_CONTROL: i32 = 3;
/// GGUF token type USER_DEFINED: an added token, matched whole in the input text.
pub const TOKEN_TYPE_USER_DEFINED: i32 = 4;
/// GGUF token type UNKNOWN: SentencePiece's `<unk>`.
pub const TOKEN_TYPE_UNKNOWN: i32 = 2;
/// GGUF token type BYTE: a SentencePiece byte-fallback token, `<0xXX>`.
pub const TOKEN_TYPE_BYTE: i32 = 6;
/// The most added tokens (GGUF's control and user-defined ones, tokenizer.json's
/// `added_tokens`) a vocabulary may hold: Gemma 3 has 6,414, Llasa's speech vocabulary 65,536
/// and more; matching them in the text costs about 1 kB of memory each.
pub const MAX_ADDED_TOKENS: usize = 1 << 18;

/// A GGUF-embedded vocabulary, as read from the `tokenizer.ggml.*` metadata keys.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: `"gpt2"` (byte-level BPE) or `"llama"` (SentencePiece).
    pub model: String,
    /// `tokenizer.ggml.pre`, e.g. `"qwen2"`, `"llama-bpe"`, `"smollm"`.
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`: the vocabulary entry of every id (byte-level encoded).
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type`, one per token (1 normal, 3 control, 4 user-defined, ...).
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.merges`: `"left right"`, highest priority first (BPE).
    pub merges: Vec<String>,
    /// `tokenizer.ggml.scores`, one per token (SentencePiece: a merge's priority); empty when
    /// absent.
    pub scores: Vec<f32>,
    /// `tokenizer.ggml.add_space_prefix` (SentencePiece: a space before the text and after
    /// each special token; default true).
    pub add_space_prefix: bool,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos: Option<u32>,
    /// `tokenizer.ggml.eot_token_id`.
    pub eot: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`; when the key is absent, llama.cpp's default for the
    /// pre-tokenizer (true for Llama 3, false otherwise).
    pub add_bos: bool,
    /// `tokenizer.ggml.add_eos_token` (default false).
    pub add_eos: bool,
    /// Whether special tokens take the whitespace after them (but `<s>`, `<unk>` and
    /// `<|endoftext|>`): the Phi-3 family's SentencePiece vocabulary, whose `tokenizer.json` marks
    /// them `rstrip`. llama.cpp does so for files whose `general.name` says Phi-3; this also does
    /// for SentencePiece `phi3` files (not Phi-4's byte-level BPE).
    pub strip_after_specials: bool,
}

fn meta_err(key: &str, message: impl Into<String>) -> Error {
    Error::Metadata { key: key.to_string(), message: message.into() }
}

/// An optional key that must be a string when present.
fn opt_str(g: &Gguf, key: &str) -> Result<Option<String>> {
    g.get(key)
        .map(|v| v.as_str().map(str::to_string).ok_or_else(|| meta_err(key, "expected a string")))
        .transpose()
}

/// An optional key that must be a token id when present.
fn opt_id(g: &Gguf, key: &str) -> Result<Option<u32>> {
    g.get(key)
        .map(|v| {
            v.as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .ok_or_else(|| meta_err(key, format!("expected a token id, found {v:?}")))
        })
        .transpose()
}

/// An optional key that must be a bool when present.
fn opt_bool(g: &Gguf, key: &str) -> Result<Option<bool>> {
    g.get(key).map(|v| v.as_bool().ok_or_else(|| meta_err(key, "expected a bool"))).transpose()
}

/// An array key (`None` when absent).
fn opt_array<'a>(g: &'a Gguf, key: &str) -> Result<Option<&'a [Value]>> {
    g.get(key).map(|v| v.as_array().ok_or_else(|| meta_err(key, "expected an array"))).transpose()
}

/// A required array of strings.
fn strings(g: &Gguf, key: &str) -> Result<Vec<String>> {
    let arr = opt_array(g, key)?.ok_or_else(|| meta_err(key, "missing"))?;
    arr.iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| meta_err(key, format!("element {i} is not a string")))
        })
        .collect()
}

impl GgufVocab {
    /// Reads the `tokenizer.ggml.*` keys. Token types default to normal (1) when absent;
    /// `add_bos` follows llama.cpp's default for the pre-tokenizer when the key is absent.
    pub fn from_gguf(g: &Gguf) -> Result<GgufVocab> {
        let model = g.get_str("tokenizer.ggml.model")?.to_string();
        let pre = opt_str(g, "tokenizer.ggml.pre")?;
        let tokens = strings(g, "tokenizer.ggml.tokens")?;
        let token_types = match opt_array(g, "tokenizer.ggml.token_type")? {
            None => vec![1; tokens.len()],
            Some(arr) => arr
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::I32(t) => Ok(*t),
                    other => other.as_u64().and_then(|t| i32::try_from(t).ok()).ok_or_else(|| {
                        meta_err("tokenizer.ggml.token_type", format!("element {i} is not an integer"))
                    }),
                })
                .collect::<Result<_>>()?,
        };
        let merges = match opt_array(g, "tokenizer.ggml.merges")? {
            None if model == "gpt2" => return Err(meta_err("tokenizer.ggml.merges", "missing")),
            None => Vec::new(),
            Some(_) => strings(g, "tokenizer.ggml.merges")?,
        };
        // llama.cpp's default before the key: true for the Llama 3 family. An unknown
        // pre-tokenizer is reported by `Tokenizer::from_vocab`.
        let default_add_bos = match pre.as_deref() {
            // (SentencePiece: llama.cpp adds BOS unless the file says otherwise)
            _ if model == "llama" => true,
            Some(p) => PreKind::from_name(Some(p)).is_ok_and(PreKind::default_add_bos),
            None => false,
        };
        let scores = match opt_array(g, "tokenizer.ggml.scores")? {
            None => Vec::new(),
            Some(arr) => arr
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::F32(x) => Ok(*x),
                    _ => Err(meta_err("tokenizer.ggml.scores", format!("element {i} is not an f32"))),
                })
                .collect::<Result<_>>()?,
        };
        // (SentencePiece only: Phi-4's files say phi3 too, with a byte-level BPE vocabulary)
        let strip_after_specials = model == "llama" && phi3_named(g)?;
        Ok(GgufVocab {
            model,
            pre,
            tokens,
            token_types,
            merges,
            scores,
            add_space_prefix: opt_bool(g, "tokenizer.ggml.add_space_prefix")?.unwrap_or(true),
            bos: opt_id(g, "tokenizer.ggml.bos_token_id")?,
            eos: opt_id(g, "tokenizer.ggml.eos_token_id")?,
            eot: opt_id(g, "tokenizer.ggml.eot_token_id")?,
            add_bos: opt_bool(g, "tokenizer.ggml.add_bos_token")?.unwrap_or(default_add_bos),
            add_eos: opt_bool(g, "tokenizer.ggml.add_eos_token")?.unwrap_or(false),
            strip_after_specials,
        })
    }
}

/// Whether a file is of the Phi-3 family: its architecture, or its name as llama.cpp reads it.
fn phi3_named(g: &Gguf) -> Result<bool> {
    let name = opt_str(g, "general.name")?.unwrap_or_default().to_lowercase();
    let arch = opt_str(g, "general.architecture")?;
    Ok(arch.as_deref() == Some("phi3") || name.contains("phi-3") || name.contains("phi3"))
}

/// Splits a merge line at its first space after the first byte (as llama.cpp does, so that a
/// merge of a leading space token still parses).
fn split_merge(i: usize, line: &str) -> Result<(String, String)> {
    let pos =
        line.bytes().enumerate().skip(1).find(|&(_, b)| b == b' ').map(|(p, _)| p).ok_or_else(|| {
            Error::Metadata {
                key: "tokenizer.ggml.merges".to_string(),
                message: format!("merge {i} {line:?} has no space separating two tokens"),
            }
        })?;
    Ok((line[..pos].to_string(), line[pos + 1..].to_string()))
}

/// Drops (with a warning, as llama.cpp does) a special id outside the vocabulary.
fn in_range(name: &str, id: Option<u32>, n: usize) -> Option<u32> {
    match id {
        Some(id) if id as usize >= n => {
            log::warn!("tokenizer.ggml.{name} = {id} is outside the vocabulary of {n}: ignored");
            None
        }
        other => other,
    }
}

/// Refuses an empty vocabulary, token types (and scores, when given) not one per token, and
/// more tokens than u32 ids.
pub(super) fn check_sizes(v: &GgufVocab) -> Result<()> {
    let n = v.tokens.len();
    let bad = |key: &str, message: String| Err(Error::Metadata { key: key.to_string(), message });
    if n == 0 {
        return bad("tokenizer.ggml.tokens", "the vocabulary is empty".to_string());
    }
    if v.token_types.len() != n {
        return bad(
            "tokenizer.ggml.token_type",
            format!("{} token types for {n} tokens", v.token_types.len()),
        );
    }
    if !v.scores.is_empty() && v.scores.len() != n {
        return bad("tokenizer.ggml.scores", format!("{} scores for {n} tokens", v.scores.len()));
    }
    if u32::try_from(n).is_err() {
        return bad("tokenizer.ggml.tokens", format!("{n} tokens do not fit u32 ids"));
    }
    let added =
        v.token_types.iter().filter(|&&t| matches!(t, TOKEN_TYPE_CONTROL | TOKEN_TYPE_USER_DEFINED)).count();
    if added > MAX_ADDED_TOKENS {
        return bad(
            "tokenizer.ggml.token_type",
            format!("{added} control and user-defined tokens (at most {MAX_ADDED_TOKENS})"),
        );
    }
    Ok(())
}

/// The ids that end a generation: EOS, EOT, and the added tokens whose text is an end-of-turn
/// marker (an ordinary entry such as Qwen's "</s>" is text, not a stop signal).
fn end_ids(v: &GgufVocab, eos: Option<u32>, eot: Option<u32>) -> Vec<u32> {
    let mut ids: Vec<u32> = eos.into_iter().chain(eot).collect();
    ids.extend(
        v.tokens
            .iter()
            .zip(&v.token_types)
            .enumerate()
            .filter(|&(_, (t, &tt))| {
                matches!(tt, TOKEN_TYPE_CONTROL | TOKEN_TYPE_USER_DEFINED) && EOG_TEXTS.contains(&t.as_str())
            })
            .map(|(i, _)| i as u32),
    );
    ids
}

/// The added tokens of type `ty` (CONTROL: special, matched whole in the text; USER_DEFINED).
pub(super) fn added_tokens(v: &GgufVocab, ty: i32, special: bool) -> Vec<AddedToken> {
    let rstrip = |t: &str| v.strip_after_specials && !["<s>", "<unk>", "<|endoftext|>"].contains(&t);
    v.tokens
        .iter()
        .zip(&v.token_types)
        .filter(|&(t, &tt)| tt == ty && !t.is_empty())
        .map(|(t, _)| AddedToken::from(t.clone(), special).normalized(false).rstrip(rstrip(t)))
        .collect()
}

pub(super) fn build(v: GgufVocab) -> Result<Tokenizer> {
    match v.model.as_str() {
        "gpt2" => {}
        "llama" => return super::spm::build(v),
        other => {
            return Err(Error::Tokenizer(format!(
                "unsupported tokenizer model {other:?} (tokenizer.ggml.model); byte-level BPE \"gpt2\" and SentencePiece \"llama\" are"
            )))
        }
    }
    let kind = PreKind::from_name(v.pre.as_deref())?;
    check_sizes(&v)?;

    // The BPE model over the whole vocabulary (a repeated entry keeps its last id, as in llama.cpp).
    let vocab: Vocab = v.tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    // Real vocabularies may lack bytes that rarely occur (SmolLM2 has no 0xC0, 0xF5..0xFF, ...);
    // such a byte in the input is dropped, as llama.cpp and `tokenizers` do.
    let missing = byte_level::byte_to_char().iter().filter(|c| !vocab.contains_key(&c.to_string())).count();
    if missing > 0 {
        log::debug!("byte-level vocabulary lacks {missing} of the 256 byte tokens");
    }
    let merges = v.merges.iter().enumerate().map(|(i, m)| split_merge(i, m)).collect::<Result<Vec<_>>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(kind.ignore_merges())
        .build()
        .map_err(|e| Error::Tokenizer(format!("GGUF BPE vocabulary: {e}")))?;

    let mut splits: Vec<PreTokenizerWrapper> = Vec::new();
    for re in kind.regexes() {
        let split = Split::new(SplitPattern::Regex(re.clone()), SplitDelimiterBehavior::Isolated, false)
            .map_err(|e| Error::Tokenizer(format!("pre-tokenizer regex {re:?}: {e}")))?;
        splits.push(split.into());
    }
    splits.push(ByteLevel::new(false, false, false).into());

    let mut hf = tokenizers::Tokenizer::new(bpe);
    hf.with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(Sequence::new(splits))));
    hf.with_decoder(Some(ByteLevelDecoder::default()));

    // CONTROL and USER_DEFINED tokens are matched whole in the text, before the regexes.
    hf.add_special_tokens(&added_tokens(&v, TOKEN_TYPE_CONTROL, true));
    hf.add_tokens(&added_tokens(&v, TOKEN_TYPE_USER_DEFINED, false));

    // Detokenization: added tokens are their text, the others byte-level encoded.
    let table = byte_level::char_to_byte();
    let pieces = v
        .tokens
        .iter()
        .zip(&v.token_types)
        .map(|(t, &tt)| match tt {
            TOKEN_TYPE_CONTROL | TOKEN_TYPE_USER_DEFINED => t.as_bytes().into(),
            _ => byte_level::decode_token(&table, t),
        })
        .collect();

    finish(&v, hf, pieces)
}

/// The tokenizer of a GGUF vocabulary `v` from its `tokenizers` pipeline and the bytes of each
/// token: BOS, EOS and EOT where they are in the vocabulary, the end-of-generation ids, BOS and
/// EOS added as the file asks.
pub(super) fn finish(v: &GgufVocab, hf: tokenizers::Tokenizer, pieces: Vec<Box<[u8]>>) -> Result<Tokenizer> {
    let n = v.tokens.len();
    let bos = in_range("bos_token_id", v.bos, n);
    let eos = in_range("eos_token_id", v.eos, n);
    let eot = in_range("eot_token_id", v.eot, n);
    let eos_ids = end_ids(v, eos, eot);
    let detok = Detok::Bytes(pieces);
    let derived = Arc::new(Derived::of(&hf, &detok)?);
    let mut tok = Tokenizer {
        hf,
        detok,
        specials: Specials::Gguf { add_bos: v.add_bos, add_eos: v.add_eos, eos },
        vocab_size: n,
        bos,
        eos_ids: Vec::new(),
        derived,
    };
    tok.add_eos_ids(&eos_ids)?;
    Ok(tok)
}

//! SentencePiece vocabularies in GGUF (`tokenizer.ggml.model = "llama"`: Llama 2, Mistral,
//! Phi-3, Gemma), tokenized as llama.cpp's `llm_tokenizer_spm` does:
//!
//! - spaces become `▁` (U+2581), and with `add_space_prefix` (the default) a `▁` goes before the
//!   text and after each special token;
//! - the text's characters are merged pairwise, the pair whose merged piece has the highest score
//!   first (leftmost on ties), while the merged piece is a token;
//! - a character that is no token is spelled with byte tokens `<0xXX>` (byte fallback).
//!
//! Built on `tokenizers`' BPE: one merge for every way of cutting each token into two tokens,
//! ranked by the token's score (Hugging Face's own conversion of SentencePiece models), byte
//! fallback, and `▁` put in by the normalizer. Control tokens (`<s>`, `<start_of_turn>`, ...) and
//! user-defined ones are matched whole in the text, as for byte-level vocabularies.

use std::collections::HashMap;

use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace, Sequence};
use tokenizers::NormalizerWrapper;

use super::gguf_vocab::{
    added_tokens, check_sizes, finish, GgufVocab, TOKEN_TYPE_BYTE, TOKEN_TYPE_CONTROL, TOKEN_TYPE_UNKNOWN,
    TOKEN_TYPE_USER_DEFINED,
};
use super::Tokenizer;
use crate::error::{Error, Result};

/// SentencePiece's escaped space.
const SPACE: &str = "\u{2581}";

/// The most bytes [`merges`] may hash looking for cuts (a token of b bytes and c characters
/// costs b * c): Gemma 3's 262,144 tokens cost 15.6 million, a hostile 1 MB token 10^12.
const MAX_CUT_BYTES: usize = 1 << 30;
/// The most bytes the merges may hold: Gemma 3's 514,847 merges hold 4.6 million, every prefix
/// of a 1,000-byte token 333 million.
const MAX_MERGE_BYTES: usize = 1 << 27;

/// The merges that rebuild each token from two others: every cut of a token into two pieces
/// that are both tokens, the highest-scoring merged token first (a token's cuts in the order of
/// their pieces' ids). A vocabulary past [`MAX_CUT_BYTES`] or [`MAX_MERGE_BYTES`] is refused.
fn merges(tokens: &[String], scores: &[f32], ids: &HashMap<&str, u32>) -> Result<Vec<(String, String)>> {
    let too_big = |what: String| Err(Error::Metadata { key: "tokenizer.ggml.tokens".into(), message: what });
    let work = tokens.iter().fold(0usize, |w, t| w.saturating_add(t.len().saturating_mul(t.chars().count())));
    if work > MAX_CUT_BYTES {
        return too_big(format!(
            "tokens too long: cutting each in two would hash {work} bytes (at most {MAX_CUT_BYTES})"
        ));
    }
    // (score, token id, byte offset of the cut)
    let mut all: Vec<(f32, usize, usize)> = Vec::new();
    let mut bytes = 0usize;
    for (id, token) in tokens.iter().enumerate() {
        let score = scores.get(id).copied().unwrap_or(0.0);
        let mut cuts: Vec<(u32, u32, usize)> = token
            .char_indices()
            .skip(1)
            .filter_map(|(at, _)| Some((*ids.get(&token[..at])?, *ids.get(&token[at..])?, at)))
            .collect();
        cuts.sort_unstable();
        bytes += cuts.len() * token.len();
        if bytes > MAX_MERGE_BYTES {
            return too_big(format!(
                "the merges that rebuild the tokens from two others hold over {MAX_MERGE_BYTES} bytes"
            ));
        }
        all.extend(cuts.into_iter().map(|(_, _, at)| (score, id, at)));
    }
    // (stable: a token's cuts keep their order; equal scores keep the tokens' order)
    all.sort_by(|a, b| b.0.total_cmp(&a.0));
    Ok(all
        .into_iter()
        .map(|(_, id, at)| (tokens[id][..at].to_string(), tokens[id][at..].to_string()))
        .collect())
}

/// The byte of a byte-fallback token's text, `<0xXX>`.
pub(super) fn byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x").and_then(|h| h.strip_suffix('>'))?;
    u8::from_str_radix(hex, 16).ok()
}

/// The bytes a token stands for: its text with `▁` as a space; a byte token's byte; SentencePiece's
/// unknown token as llama.cpp shows it (▅); control and user-defined tokens as their text.
fn piece(token: &str, ty: i32) -> Box<[u8]> {
    match ty {
        TOKEN_TYPE_BYTE => match byte_token(token) {
            Some(b) => Box::new([b]),
            None => token.as_bytes().into(),
        },
        TOKEN_TYPE_UNKNOWN => "\u{2585}".as_bytes().into(),
        TOKEN_TYPE_CONTROL | TOKEN_TYPE_USER_DEFINED => token.as_bytes().into(),
        _ => token.replace(SPACE, " ").into_bytes().into(),
    }
}

pub(super) fn build(v: GgufVocab) -> Result<Tokenizer> {
    check_sizes(&v)?;
    let n = v.tokens.len();
    let mut ids: HashMap<&str, u32> = HashMap::with_capacity(n);
    for (i, t) in v.tokens.iter().enumerate() {
        // (a repeated entry keeps its first id, as llama.cpp's token_to_id)
        ids.entry(t.as_str()).or_insert(i as u32);
    }
    let merges = merges(&v.tokens, &v.scores, &ids)?;
    let vocab: Vocab = ids.iter().map(|(t, &i)| (t.to_string(), i)).collect();
    let unk = v.token_types.iter().position(|&t| t == TOKEN_TYPE_UNKNOWN).map(|i| v.tokens[i].clone());
    let mut bpe = BPE::builder().vocab_and_merges(vocab, merges).byte_fallback(true);
    if let Some(unk) = unk {
        bpe = bpe.unk_token(unk);
    }
    let bpe = bpe.build().map_err(|e| Error::Tokenizer(format!("GGUF SentencePiece vocabulary: {e}")))?;

    let mut hf = tokenizers::Tokenizer::new(bpe);
    let replace = Replace::new(" ", SPACE).map_err(|e| Error::Tokenizer(format!("normalizer: {e}")))?;
    let mut normalizers: Vec<NormalizerWrapper> = Vec::new();
    if v.add_space_prefix {
        // (each piece of text between special tokens, as llama.cpp prefixes its fragments)
        normalizers.push(Prepend::new(SPACE.to_string()).into());
    }
    normalizers.push(replace.into());
    hf.with_normalizer(Some(Sequence::new(normalizers)));
    hf.add_special_tokens(&added_tokens(&v, TOKEN_TYPE_CONTROL, true));
    hf.add_tokens(&added_tokens(&v, TOKEN_TYPE_USER_DEFINED, false));

    let pieces = v.tokens.iter().zip(&v.token_types).map(|(t, &ty)| piece(t, ty)).collect();
    finish(&v, hf, pieces)
}

//! Pre-tokenizers of byte-level BPE vocabularies, keyed by the GGUF `tokenizer.ggml.pre` name.
//!
//! The split regexes follow llama.cpp (`src/llama-vocab.cpp`, `LLAMA_VOCAB_PRE_TYPE_*`): each
//! regex of a list is applied in turn to the pieces the previous one produced, matches and the
//! text between matches both becoming pieces. The case-insensitive contractions `(?i:'s|...)` of
//! the Hugging Face originals are spelled out per letter, as llama.cpp does, so that no Unicode
//! case folding (e.g. the Kelvin sign) changes a split.

use crate::error::{Error, Result};

/// The pre-tokenizer families this crate knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreKind {
    /// llama.cpp's fallback (`default` or a missing `tokenizer.ggml.pre`).
    Default,
    /// GPT-2: `'s|'t|... ?\p{L}+| ?\p{N}+|...`.
    Gpt2,
    /// Llama 3 (`llama-bpe`, `llama3`): numbers in groups of up to 3; whole words found in the
    /// vocabulary are taken as they are (merges ignored).
    Llama3,
    /// Qwen2 / Qwen2.5 (also `stablelm2`, `deepseek-r1-qwen`): like Llama 3 but one digit per piece.
    Qwen2,
    /// StarCoder family (`smollm`, `starcoder`, `refact`, `codeshell`): every digit split off
    /// first, then the GPT-2 regex.
    StarCoder,
}

/// The GPT-2 regex, shared by several families.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// Contractions matched without Unicode case folding.
const CONTRACTIONS: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])";

impl PreKind {
    /// The family of a `tokenizer.ggml.pre` value (`None` when the key is absent).
    pub fn from_name(pre: Option<&str>) -> Result<PreKind> {
        Ok(match pre {
            None => {
                log::warn!("tokenizer.ggml.pre is missing: using llama.cpp's default pre-tokenizer");
                PreKind::Default
            }
            Some("default") => PreKind::Default,
            Some("gpt2" | "gpt-2") => PreKind::Gpt2,
            Some("llama3" | "llama-v3" | "llama-bpe") => PreKind::Llama3,
            Some("qwen2" | "deepseek-r1-qwen" | "stablelm2") => PreKind::Qwen2,
            Some("smollm" | "starcoder" | "refact" | "codeshell") => PreKind::StarCoder,
            Some(other) => {
                return Err(Error::Tokenizer(format!(
                    "unknown pre-tokenizer {other:?} (tokenizer.ggml.pre); supported: default, \
                     gpt2, gpt-2, llama3, llama-v3, llama-bpe, qwen2, deepseek-r1-qwen, stablelm2, \
                     smollm, starcoder, refact, codeshell"
                )))
            }
        })
    }

    /// The split regexes, applied in order.
    pub fn regexes(self) -> Vec<String> {
        match self {
            PreKind::Default => vec![
                r"[\p{P}\$\+<=>\^~\|]+".to_string(),
                GPT2.to_string(),
                r"\p{N}+".to_string(),
                "[0-9][0-9][0-9]".to_string(),
            ],
            PreKind::Gpt2 => vec![GPT2.to_string()],
            PreKind::Llama3 => vec![format!(
                r"{CONTRACTIONS}|[^\r\n\p{{L}}\p{{N}}]?\p{{L}}+|\p{{N}}{{1,3}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
            )],
            PreKind::Qwen2 => vec![format!(
                r"{CONTRACTIONS}|[^\r\n\p{{L}}\p{{N}}]?\p{{L}}+|\p{{N}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
            )],
            PreKind::StarCoder => vec![r"\p{N}".to_string(), GPT2.to_string()],
        }
    }

    /// Whether a pre-token found whole in the vocabulary skips the merges (llama.cpp `ignore_merges`).
    pub fn ignore_merges(self) -> bool {
        self == PreKind::Llama3
    }

    /// llama.cpp's `add_bos` default for this family, before `tokenizer.ggml.add_bos_token`.
    pub fn default_add_bos(self) -> bool {
        self == PreKind::Llama3
    }
}

//! Tokenizers: a Hugging Face `tokenizer.json` or a GGUF-embedded vocabulary (byte-level BPE, or
//! SentencePiece: `spm.rs`), all turned into a [`tokenizers::Tokenizer`] (the BPE merging is
//! that crate's), plus the
//! bookkeeping generation needs: BOS, the end-of-generation ids, and exact detokenization
//! (whole-sequence [`Tokenizer::decode`] and streaming [`StreamDecoder`]).
//!
//! A GGUF vocabulary is tokenized as llama.cpp does: the pre-tokenizer regexes of
//! `tokenizer.ggml.pre` (see `pre.rs`), tokens of type CONTROL (3) and USER_DEFINED (4) matched as
//! whole tokens in the input text, BOS prepended when `add_special` and the vocabulary asks for it.

mod chat;
mod gguf_vocab;
mod pre;
mod spm;
mod stream;
mod template_budget;

use std::fmt;
use std::sync::{Arc, OnceLock};

use aho_corasick::{AhoCorasick, MatchKind};
use tokenizers::{DecoderWrapper, Model};

use crate::error::{Error, Result};

/// The character each byte is written as in a byte-level (GPT-2) vocabulary.
pub use byte_level::byte_to_char;
pub use chat::{known_role, ChatTemplate, Message, TextLimit, ROLES};
pub use gguf_vocab::GgufVocab;
pub use pre::PreKind;
pub use stream::StreamDecoder;

/// Texts of added (control / user-defined) tokens that end generation (the common part of
/// llama.cpp's EOG list), in addition to the declared eos / eot ids.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|eom_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "</s>",
    "<end_of_utterance>",
];

/// How ids turn back into text.
#[derive(Clone)]
enum Detok {
    /// Byte-level BPE: the exact bytes of every id (added tokens: their text as is).
    /// `pieces[id]`.
    Bytes(Vec<Box<[u8]>>),
    /// Another decoder (Metaspace, ByteFallback, ...): through `tokenizers`' decode.
    Hf,
}

/// Whether `encode(_, add_special = true)` adds BOS / EOS by hand (GGUF) or through the
/// tokenizer.json's post-processor.
#[derive(Clone, Copy, Debug)]
enum Specials {
    Gguf { add_bos: bool, add_eos: bool, eos: Option<u32> },
    PostProcessor,
}

/// A ready tokenizer: encode text to ids and ids back to text.
#[derive(Clone)]
pub struct Tokenizer {
    hf: tokenizers::Tokenizer,
    detok: Detok,
    specials: Specials,
    /// Number of ids (the largest id + 1).
    vocab_size: usize,
    bos: Option<u32>,
    /// Ids that end generation, sorted, no duplicates.
    eos_ids: Vec<u32>,
    /// What the vocabulary says once, shared by clones.
    derived: Arc<Derived>,
}

/// Facts of a vocabulary computed once, when the tokenizer is built.
struct Derived {
    /// The texts of the special (control) tokens, sorted, and their ids, sorted.
    special_texts: Vec<String>,
    special_ids: Vec<u32>,
    /// Finds the special texts in a text, leftmost-longest first (as the tokenizer matches them).
    finder: AhoCorasick,
    /// See [`Tokenizer::max_bytes_per_token`].
    max_bytes_per_token: Option<usize>,
    /// The tokenizer with special-token text spelled plainly ([`Tokenizer::encode_plain`]),
    /// built the first time it is needed.
    plain: OnceLock<tokenizers::Tokenizer>,
}

impl Derived {
    fn of(hf: &tokenizers::Tokenizer, detok: &Detok) -> Result<Derived> {
        let mut specials: Vec<(u32, String)> = hf
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special && !t.content.is_empty())
            .map(|(id, t)| (id, t.content))
            .collect();
        let mut special_ids: Vec<u32> = specials.iter().map(|(id, _)| *id).collect();
        special_ids.sort_unstable();
        specials.sort_by(|a, b| a.1.cmp(&b.1));
        let special_texts: Vec<String> = specials.into_iter().map(|(_, t)| t).collect();
        let finder = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&special_texts)
            .map_err(|e| Error::Tokenizer(format!("special tokens: {e}")))?;
        let max_bytes_per_token = max_bytes_per_token(hf, detok);
        Ok(Derived { special_texts, special_ids, finder, max_bytes_per_token, plain: OnceLock::new() })
    }
}

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size)
            .field("bos", &self.bos)
            .field("eos_ids", &self.eos_ids)
            .field("specials", &self.specials)
            .field("byte_level", &matches!(self.detok, Detok::Bytes(_)))
            .finish()
    }
}

fn hf_err(context: &str) -> impl Fn(tokenizers::Error) -> Error + '_ {
    move |e| Error::Tokenizer(crate::error::printable(&format!("{context}: {e}")))
}

/// What is read of a tokenizer.json before the `tokenizers` library reads it: the whole file's
/// syntax, and how many added tokens it holds (nothing else is kept: a `serde_json::Value` of
/// the file took 7 times its bytes).
#[derive(serde::Deserialize)]
struct Outline {
    added_tokens: Option<Vec<serde::de::IgnoredAny>>,
}

/// A `tokenizer.json` as the `tokenizers` library reads it. That library panics (an `expect`)
/// on some malformed files instead of returning an error, so the JSON syntax is checked first and
/// the library only ever sees well-formed JSON; natively its remaining panics are caught too.
/// More than [`gguf_vocab::MAX_ADDED_TOKENS`] added tokens are refused before it sees them.
fn parse_tokenizer_json(bytes: &[u8]) -> Result<tokenizers::Tokenizer> {
    let err =
        |e: serde_json::Error| Error::Tokenizer(crate::error::printable(&format!("tokenizer.json: {e}")));
    let outline: Outline = serde_json::from_slice(bytes).map_err(err)?;
    let added = outline.added_tokens.map_or(0, |a| a.len());
    if added > gguf_vocab::MAX_ADDED_TOKENS {
        return Err(Error::Tokenizer(format!(
            "tokenizer.json: {added} added tokens (at most {})",
            gguf_vocab::MAX_ADDED_TOKENS
        )));
    }
    let parse = move || serde_json::from_slice::<tokenizers::Tokenizer>(bytes);
    #[cfg(not(target_arch = "wasm32"))]
    let parsed = std::panic::catch_unwind(parse)
        .map_err(|_| Error::Tokenizer("tokenizer.json: the tokenizers library could not read it".into()))?;
    #[cfg(target_arch = "wasm32")]
    let parsed = parse();
    parsed.map_err(err)
}

impl Tokenizer {
    /// A Hugging Face `tokenizer.json`. End-of-generation ids are the vocabulary's tokens among
    /// `<|endoftext|>`, `<|im_end|>`, `<|eot_id|>`, `</s>`, ...; add those of a
    /// `generation_config.json` with [`Tokenizer::add_eos_ids`].
    pub fn from_json(tokenizer_json: &[u8]) -> Result<Tokenizer> {
        let hf = parse_tokenizer_json(tokenizer_json)?;
        let added = hf.get_added_tokens_decoder();
        let max_added = added.keys().max().map_or(0, |&id| id as usize + 1);
        if max_added > crate::model::config::MAX_VOCAB {
            return Err(Error::Tokenizer(format!(
                "tokenizer.json: added token id {} is beyond the largest vocabulary ({})",
                max_added - 1,
                crate::model::config::MAX_VOCAB
            )));
        }
        let vocab_size = hf.get_model().get_vocab_size().max(max_added);

        let detok = match hf.get_decoder() {
            Some(DecoderWrapper::ByteLevel(_)) => {
                let table = byte_level::char_to_byte();
                let pieces = (0..vocab_size as u32)
                    .map(|id| match (added.get(&id), hf.id_to_token(id)) {
                        (Some(t), _) => t.content.as_bytes().into(),
                        (None, Some(text)) => byte_level::decode_token(&table, &text),
                        (None, None) => Box::default(),
                    })
                    .collect();
                Detok::Bytes(pieces)
            }
            _ => Detok::Hf,
        };

        // BOS: what the post-processor puts in front of an empty input, if it is a special token.
        let with_specials = hf.encode_fast("", true).map_err(hf_err("tokenizer.json post-processor"))?;
        let bos =
            with_specials.get_ids().first().copied().filter(|id| added.get(id).is_some_and(|t| t.special));

        // End-of-turn tokens among the added tokens (an ordinary BPE entry is text).
        let eos_ids: Vec<u32> = added
            .iter()
            .filter(|(_, t)| EOG_TEXTS.contains(&t.content.as_str()))
            .map(|(&id, _)| id)
            .collect();
        let derived = Arc::new(Derived::of(&hf, &detok)?);
        let mut tok = Tokenizer {
            hf,
            detok,
            specials: Specials::PostProcessor,
            vocab_size,
            bos,
            eos_ids: Vec::new(),
            derived,
        };
        tok.add_eos_ids(&eos_ids)?;
        Ok(tok)
    }

    /// A GGUF vocabulary (byte-level BPE, `tokenizer.ggml.model == "gpt2"`, or SentencePiece,
    /// `"llama"`).
    pub fn from_vocab(v: GgufVocab) -> Result<Tokenizer> {
        gguf_vocab::build(v)
    }

    /// The vocabulary in a GGUF file's `tokenizer.ggml.*` metadata.
    pub fn from_gguf(g: &crate::loader::gguf::Gguf) -> Result<Tokenizer> {
        Tokenizer::from_vocab(GgufVocab::from_gguf(g)?)
    }

    /// Token ids for `text`. Special-token text such as `<|im_start|>` becomes that token.
    /// With `add_special`, BOS (and EOS) are added where the vocabulary asks for them
    /// (GGUF `add_bos_token` / `add_eos_token`, or the tokenizer.json post-processor).
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let post = add_special && matches!(self.specials, Specials::PostProcessor);
        let enc = self.hf.encode_fast(text, post).map_err(hf_err("encode"))?;
        let ids = enc.get_ids();
        match self.specials {
            Specials::Gguf { add_bos, add_eos, eos } if add_special => {
                let mut out = Vec::with_capacity(ids.len() + 2);
                if let (true, Some(bos)) = (add_bos, self.bos) {
                    out.push(bos);
                }
                out.extend_from_slice(ids);
                if let (true, Some(eos)) = (add_eos, eos) {
                    out.push(eos);
                }
                Ok(out)
            }
            _ => Ok(ids.to_vec()),
        }
    }

    /// The texts of the special (control) tokens, such as `<|im_start|>`, that [`Tokenizer::encode`]
    /// turns into their tokens wherever they occur in the text; sorted.
    pub fn special_texts(&self) -> &[String] {
        &self.derived.special_texts
    }

    /// The ids of the special (control) tokens, sorted.
    pub fn special_ids(&self) -> &[u32] {
        &self.derived.special_ids
    }

    /// The (start, end) byte ranges of the special texts in `text`, leftmost-longest first, as
    /// [`Tokenizer::encode`] matches them; one pass over the text.
    pub fn find_specials<'t>(&'t self, text: &'t str) -> impl Iterator<Item = (usize, usize)> + 't {
        self.derived.finder.find_iter(text).map(|m| (m.start(), m.end()))
    }

    /// Token ids for `text` as plain text: special-token text such as `<|im_end|>` is spelled
    /// with ordinary tokens, never the control token; nothing is added.
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>> {
        let plain = self.derived.plain.get_or_init(|| {
            let mut hf = self.hf.clone();
            hf.set_encode_special_tokens(true);
            hf
        });
        let enc = plain.encode_fast(text, false).map_err(hf_err("encode"))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The text of `ids`. Nothing is skipped: special tokens appear as their text. Bytes that
    /// are not valid UTF-8 become U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        match &self.detok {
            Detok::Bytes(_) => {
                let mut bytes = Vec::with_capacity(ids.len() * 4);
                for &id in ids {
                    bytes.extend_from_slice(self.piece(id)?);
                }
                Ok(String::from_utf8_lossy(&bytes).into_owned())
            }
            Detok::Hf => {
                for &id in ids {
                    self.check_id(id)?;
                }
                self.hf.decode(ids, false).map_err(hf_err("decode"))
            }
        }
    }

    /// The most bytes of input text one token can stand for, where that is bounded: the
    /// longest token's bytes times the most the normalizer can shrink a text (NFC 3x, as the
    /// Kelvin sign U+212A, 3 bytes, becomes `K`; NFKC 4x, as U+1D400 becomes `A`). A text of
    /// more than `n` times this many bytes has more than `n` tokens, so a front end can refuse
    /// a prompt over the context without tokenizing it (the tokenizer's memory and time grow
    /// with the text: tens of bytes per byte). `None` where it is not bounded: a vocabulary
    /// that is not byte-level (its tokens need not cover their input), a normalizer or a
    /// pre-tokenizer that can delete text (stripping, accents, control characters, whitespace
    /// splits, a replacement by less), or added tokens that take the whitespace beside them.
    pub fn max_bytes_per_token(&self) -> Option<usize> {
        self.derived.max_bytes_per_token
    }

    /// Number of ids (the largest id + 1), or a model's output rows where they are more
    /// ([`Tokenizer::cover`]).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The beginning-of-sequence id, if the vocabulary has one.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// All ids that end generation (eos, eot and end-of-turn tokens), sorted.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    /// Adds end-of-generation ids (e.g. `eos_token_id` of a `generation_config.json`).
    pub fn add_eos_ids(&mut self, ids: &[u32]) -> Result<()> {
        for &id in ids {
            self.check_id(id)?;
        }
        self.eos_ids.extend_from_slice(ids);
        self.eos_ids.sort_unstable();
        self.eos_ids.dedup();
        Ok(())
    }

    /// Makes every id of a model with `model_vocab` output rows decodable. Where the rows
    /// outnumber the tokenizer's ids (Qwen2.5's Hugging Face files: 151,936 rows, 151,665 ids in
    /// tokenizer.json), sampling may draw a row beyond: it decodes as no text, as `tokenizers`
    /// and vLLM decode it, instead of failing the generation.
    pub fn cover(&mut self, model_vocab: usize) {
        if model_vocab > self.vocab_size {
            if let Detok::Bytes(pieces) = &mut self.detok {
                pieces.resize(model_vocab, Box::default());
            }
            self.vocab_size = model_vocab;
        }
    }

    /// The vocabulary entry of `id` as stored (byte-level BPE: `"Ġhello"` for `" hello"`).
    pub fn token_text(&self, id: u32) -> Option<String> {
        self.hf.id_to_token(id)
    }

    /// The underlying `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.hf
    }

    fn check_id(&self, id: u32) -> Result<()> {
        if (id as usize) < self.vocab_size {
            Ok(())
        } else {
            Err(Error::TokenOutOfRange { id, vocab: self.vocab_size })
        }
    }

    /// The bytes of one token (byte-level tokenizers only; `None` otherwise).
    fn token_bytes(&self, id: u32) -> Result<Option<&[u8]>> {
        match &self.detok {
            Detok::Bytes(_) => self.piece(id).map(Some),
            Detok::Hf => {
                self.check_id(id)?;
                Ok(None)
            }
        }
    }

    fn piece(&self, id: u32) -> Result<&[u8]> {
        match &self.detok {
            Detok::Bytes(pieces) => pieces
                .get(id as usize)
                .map(|p| &p[..])
                .ok_or(Error::TokenOutOfRange { id, vocab: self.vocab_size }),
            Detok::Hf => Err(Error::Tokenizer("not a byte-level tokenizer".to_string())),
        }
    }
}

/// See [`Tokenizer::max_bytes_per_token`].
fn max_bytes_per_token(hf: &tokenizers::Tokenizer, detok: &Detok) -> Option<usize> {
    let Detok::Bytes(pieces) = detok else {
        return None;
    };
    let added = hf.get_added_tokens_decoder();
    if added.values().any(|t| t.lstrip || t.rstrip) {
        return None;
    }
    let longest = pieces.iter().map(|p| p.len()).chain(added.values().map(|t| t.content.len())).max()?.max(1);
    if let Some(pre) = hf.get_pre_tokenizer() {
        if !pre_tokenizer_keeps_text(&serde_json::to_value(pre).ok()?) {
            return None;
        }
    }
    let shrink = match hf.get_normalizer() {
        None => 1,
        Some(n) => normalizer_shrink(&serde_json::to_value(n).ok()?)?,
    };
    longest.checked_mul(shrink)
}

/// Whether a pre-tokenizer (its JSON form) keeps every byte of its input in some piece: one
/// that splits, maps bytes to characters or replaces spaces does; one that removes what it
/// splits on (whitespace, a `Removed` delimiter) does not.
fn pre_tokenizer_keeps_text(p: &serde_json::Value) -> bool {
    match p.get("type").and_then(|t| t.as_str()) {
        Some("ByteLevel" | "Digits" | "Metaspace" | "Punctuation" | "UnicodeScripts") => {
            p.get("behavior").and_then(|b| b.as_str()) != Some("Removed")
        }
        Some("Split") => p.get("behavior").and_then(|b| b.as_str()) != Some("Removed"),
        Some("Sequence") => p
            .get("pretokenizers")
            .and_then(|v| v.as_array())
            .is_some_and(|all| all.iter().all(pre_tokenizer_keeps_text)),
        _ => false,
    }
}

/// How many times shorter in bytes a normalizer (its JSON form) can make a text, or `None`
/// where it can delete text without bound.
fn normalizer_shrink(n: &serde_json::Value) -> Option<usize> {
    match n.get("type")?.as_str()? {
        // Canonical singletons (U+212A KELVIN SIGN, 3 bytes -> `K`) and Hangul jamo
        // compositions (9 bytes -> 3) shrink 3x at most; NFD only decomposes, but shares the
        // singletons.
        "NFC" | "NFD" | "Lowercase" => Some(3),
        // Compatibility mappings also take 4-byte letters to ASCII (U+1D400 -> `A`).
        "NFKC" | "NFKD" => Some(4),
        "Prepend" | "ByteLevel" => Some(1),
        "Replace" => {
            let pattern = n.get("pattern")?.get("String")?.as_str()?;
            let content = n.get("content")?.as_str()?;
            (!content.is_empty()).then(|| pattern.len().div_ceil(content.len()).max(1))
        }
        "Sequence" => n
            .get("normalizers")?
            .as_array()?
            .iter()
            .try_fold(1usize, |acc, inner| acc.checked_mul(normalizer_shrink(inner)?)),
        _ => None,
    }
}

/// GPT-2's byte <-> printable character mapping of byte-level BPE.
mod byte_level {
    use std::collections::HashMap;

    /// The character each byte is written as in a byte-level vocabulary.
    pub fn byte_to_char() -> [char; 256] {
        let mut table = ['\0'; 256];
        let mut next = 256u32;
        for (b, slot) in table.iter_mut().enumerate() {
            let printable = matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
            let code = if printable {
                b as u32
            } else {
                next += 1;
                next - 1
            };
            *slot = char::from_u32(code).unwrap_or('\u{FFFD}');
        }
        table
    }

    pub fn char_to_byte() -> HashMap<char, u8> {
        byte_to_char().iter().enumerate().map(|(b, &c)| (c, b as u8)).collect()
    }

    /// The bytes a vocabulary entry stands for; an entry with a character outside the mapping
    /// is taken as its UTF-8 text (as `tokenizers`' ByteLevel decoder does).
    pub fn decode_token(table: &HashMap<char, u8>, text: &str) -> Box<[u8]> {
        let mapped: Option<Vec<u8>> = text.chars().map(|c| table.get(&c).copied()).collect();
        mapped.unwrap_or_else(|| text.as_bytes().to_vec()).into_boxed_slice()
    }
}

//! Streaming detokenization: text as ids arrive, never splitting a UTF-8 character.

use super::Tokenizer;
use crate::error::Result;

/// Incremental detokenizer: push ids, get the newly completed text. The concatenation of every
/// `push` and the final `finish` equals `Tokenizer::decode` of all the ids (after
/// [`StreamDecoder::after`], what they add to the decoded prompt).
///
/// Byte-level tokenizers: bytes of an incomplete UTF-8 sequence are held back until the
/// sequence completes (an invalid sequence becomes U+FFFD, as in `decode`). Other tokenizers:
/// the ids since the last emitted text are decoded again with the previous window as prefix,
/// and text ending in U+FFFD is held back.
#[derive(Debug, Clone, Default)]
pub struct StreamDecoder {
    /// Byte-level: bytes not yet returned (an incomplete UTF-8 sequence).
    pending: Vec<u8>,
    /// Other tokenizers: ids of the current window.
    ids: Vec<u32>,
    /// Start of the ids decoded as context only.
    prefix: usize,
    /// Start of the ids whose text has not been returned yet.
    read: usize,
    /// Other tokenizers: the window holds a prompt's last ids, not yet cut to a whole character.
    cut: bool,
}

/// Prompt ids a continuation is decoded after ([`StreamDecoder::after`]).
const CONTEXT: usize = 4;

impl StreamDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// A decoder of the ids that continue `prompt`: their text is what they add to the prompt's.
    /// Other than byte-level tokenizers decode the first id after the prompt's last few: a
    /// SentencePiece decoder strips a leading space only at the start of a text, so "▁Paris"
    /// after "The capital of France is" is " Paris", as a GGUF vocabulary decodes it.
    pub fn after(prompt: &[u32]) -> Self {
        let ids = prompt[prompt.len().saturating_sub(CONTEXT)..].to_vec();
        StreamDecoder { read: ids.len(), ids, cut: true, ..Self::default() }
    }

    /// Appends `id`; returns the text completed by it (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String> {
        match tok.token_bytes(id)? {
            Some(bytes) => {
                self.pending.extend_from_slice(bytes);
                Ok(self.take_complete())
            }
            None => {
                if std::mem::take(&mut self.cut) {
                    // (the context starts at a whole character: byte-fallback tokens `<0xXX>`
                    // at its start may be the end of one, and a run of them decodes whole)
                    let byte =
                        |id: u32| tok.token_text(id).and_then(|t| super::spm::byte_token(&t)).is_some();
                    while self.prefix < self.read && byte(self.ids[self.prefix]) {
                        self.prefix += 1;
                    }
                }
                self.ids.push(id);
                let before = tok.decode(&self.ids[self.prefix..self.read])?;
                let now = tok.decode(&self.ids[self.prefix..])?;
                if now.len() <= before.len() || now.ends_with('\u{FFFD}') {
                    return Ok(String::new());
                }
                let Some(new) = now.get(before.len()..) else {
                    return Ok(String::new());
                };
                let new = new.to_string();
                self.ids.drain(..self.read);
                self.prefix = 0;
                self.read = self.ids.len();
                Ok(new)
            }
        }
    }

    /// Returns whatever is held back (an incomplete sequence as U+FFFD) and resets the decoder.
    pub fn finish(&mut self, tok: &Tokenizer) -> Result<String> {
        let mut out = String::from_utf8_lossy(&self.pending).into_owned();
        if self.read < self.ids.len() {
            let before = tok.decode(&self.ids[self.prefix..self.read])?;
            let now = tok.decode(&self.ids[self.prefix..])?;
            out.push_str(now.get(before.len()..).unwrap_or(&now));
        }
        *self = Self::default();
        Ok(out)
    }

    /// Takes the longest prefix of `pending` that is decided: valid UTF-8, with invalid
    /// sequences as U+FFFD; an incomplete sequence at the end stays.
    fn take_complete(&mut self) -> String {
        let mut out = String::new();
        let mut start = 0;
        while start < self.pending.len() {
            let rest = &self.pending[start..];
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(&String::from_utf8_lossy(&rest[..valid]));
                    match e.error_len() {
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            start += valid + bad;
                        }
                        None => {
                            start += valid;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
        out
    }
}

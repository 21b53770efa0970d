//! From a request to prompt ids ([`Prompter`]: the target's tokenizer and chat template), and
//! from generated pieces to released text ([`StopFilter`]: stop strings).

use super::Request;
use crate::error::{Error, Result};
use crate::tokenizer::{ChatTemplate, Message, StreamDecoder, TextLimit, Tokenizer};

/// The text of one generation as its tokens come, for every decode loop: each token's UTF-8
/// piece once complete ([`StreamDecoder`]), held back while it could begin a stop string.
pub(super) struct TextStream {
    decoder: StreamDecoder,
    filter: StopFilter,
}

impl TextStream {
    /// The text of the tokens after `prompt`, cut at the first of `stops`.
    pub(super) fn new(stops: &[String], prompt: &[u32]) -> TextStream {
        TextStream { decoder: StreamDecoder::after(prompt), filter: StopFilter::new(stops) }
    }

    /// The text that token `id` makes final (possibly empty). An end-of-generation token ends
    /// the generation without text: `<|im_end|>` is no part of the answer (as in vLLM and
    /// llama.cpp), its id is still among the tokens.
    pub(super) fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<String> {
        if tokenizer.eos_ids().contains(&id) {
            return Ok(String::new());
        }
        let piece = self.decoder.push(tokenizer, id)?;
        Ok(self.filter.push(&piece))
    }

    /// Whether a stop string was found: the generation ends, its text before it.
    pub(super) fn stopped(&self) -> bool {
        self.filter.hit.is_some()
    }

    /// At the end: the text held back that is final now (an incomplete UTF-8 sequence's bytes,
    /// the start of a stop string that did not come).
    pub(super) fn finish(&mut self, tokenizer: &Tokenizer) -> Result<String> {
        let rest = self.decoder.finish(tokenizer)?;
        let mut tail = self.filter.push(&rest);
        tail.push_str(&self.filter.flush());
        Ok(tail)
    }

    /// Every text released so far.
    pub(super) fn text(&self) -> &str {
        &self.filter.text[..self.filter.released]
    }
}

/// Text streaming with stop strings: text is released only once it cannot begin a stop string.
pub(super) struct StopFilter {
    stops: Vec<String>,
    /// All text so far (released and held).
    pub(super) text: String,
    pub(super) released: usize,
    /// Byte offset in `text` where a stop string begins, once found.
    pub(super) hit: Option<usize>,
}

impl StopFilter {
    pub(super) fn new(stops: &[String]) -> Self {
        StopFilter { stops: stops.to_vec(), text: String::new(), released: 0, hit: None }
    }

    /// Adds `piece`; returns the text now safe to release.
    pub(super) fn push(&mut self, piece: &str) -> String {
        self.text.push_str(piece);
        let stops = self.stops.iter().filter(|s| !s.is_empty());
        // A stop string can only begin in the unreleased part: released text never ends with the
        // start of one, so searching from `released` finds every new occurrence.
        let (released, unreleased) = (self.released, &self.text[self.released..]);
        if let Some(i) = stops.clone().filter_map(|s| unreleased.find(s.as_str()).map(|i| released + i)).min()
        {
            self.hit = Some(i);
            return self.release(i);
        }
        // Hold back the longest tail that is a prefix of some stop string.
        let held = stops
            .flat_map(|s| (1..s.len()).rev().filter(|&n| s.is_char_boundary(n)).map(move |n| &s[..n]))
            .filter(|p| self.text.ends_with(p))
            .map(str::len)
            .max()
            .unwrap_or(0);
        self.release(self.text.len() - held)
    }

    pub(super) fn release(&mut self, upto: usize) -> String {
        let upto = upto.max(self.released);
        let out = self.text[self.released..upto].to_string();
        self.released = upto;
        out
    }

    /// Everything not yet released (when no stop string was hit).
    pub(super) fn flush(&mut self) -> String {
        match self.hit {
            Some(_) => String::new(),
            None => self.release(self.text.len()),
        }
    }
}

/// What turns a request into prompt ids: the target's tokenizer and chat template. Cloneable,
/// so a front end can tokenize a request (and check it against the context) before it queues
/// the request for the engine, then hand the ids to [`Engine::generate_from`](super::Engine::generate_from).
#[derive(Clone)]
pub struct Prompter {
    pub(super) tokenizer: Tokenizer,
    pub(super) chat_template: Option<ChatTemplate>,
}

impl Prompter {
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn has_chat_template(&self) -> bool {
        self.chat_template.is_some()
    }

    /// The prompt text of `messages` under the model's chat template (assistant turn opened).
    pub fn chat_prompt(&self, messages: &[Message]) -> Result<String> {
        self.template()?.render(messages, true)
    }

    fn template(&self) -> Result<&ChatTemplate> {
        self.chat_template
            .as_ref()
            .ok_or_else(|| Error::ChatTemplate("the model declares no chat template".into()))
    }

    /// The prompt's token ids: `prompt` with BOS where the vocabulary asks for it, or `messages`
    /// under the chat template (which places the special tokens itself; message content stays
    /// text).
    pub fn prompt_tokens(&self, req: &Request) -> Result<Vec<u32>> {
        self.tokens(req, None)
    }

    /// [`Prompter::prompt_tokens`] for a context of `context` positions: a prompt (or rendered
    /// chat) of more bytes than `context` tokens can hold is refused before the tokenizer runs
    /// ([`Error::PromptTooLong`]; see [`Tokenizer::max_bytes_per_token`]), so what tokenizing a
    /// request costs is bounded by the context, whatever the request's size.
    pub fn prompt_tokens_within(&self, req: &Request, context: usize) -> Result<Vec<u32>> {
        self.tokens(req, TextLimit::new(&self.tokenizer, context))
    }

    fn tokens(&self, req: &Request, limit: Option<TextLimit>) -> Result<Vec<u32>> {
        match (&req.prompt, &req.messages) {
            (Some(p), None) => {
                if let Some(limit) = limit {
                    limit.check(p.len())?;
                }
                self.tokenizer.encode(p, true)
            }
            (None, Some(m)) => self.template()?.prompt_tokens_within(m, &self.tokenizer, limit),
            _ => Err(Error::InvalidArgument("a request needs exactly one of `prompt` and `messages`".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::StopFilter;

    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, Option<usize>) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut f = StopFilter::new(&stops);
        let mut out: Vec<String> = pieces.iter().map(|p| f.push(p)).collect();
        out.push(f.flush());
        (out, f.hit)
    }

    #[test]
    fn stop_filter_holds_back_possible_starts() {
        let (out, hit) = run(&["\n\n"], &["a", "b\n", "c", "\n", "\n", "d"]);
        assert_eq!(out, ["a", "b", "\nc", "", "", "", ""]);
        assert_eq!(hit, Some(4));
    }

    #[test]
    fn stop_filter_releases_everything_without_a_hit() {
        let (out, hit) = run(&["END"], &["x", "E", "N", "y", "EN"]);
        assert_eq!(out, ["x", "", "", "ENy", "", "EN"]);
        assert_eq!(hit, None);
    }

    #[test]
    fn stop_filter_without_stops_is_transparent() {
        let (out, hit) = run(&[], &["a", "b"]);
        assert_eq!(out, ["a", "b", ""]);
        assert_eq!(hit, None);
    }
}

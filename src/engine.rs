//! The engine behind every front end (CLI, wasm facade, later the HTTP server): a target model,
//! its tokenizer and chat template, an optional draft model; text or chat messages in, streamed
//! text (with per-token draft provenance) and stats out.
//!
//! A [`Request`] is plain data (it deserializes from the JSON the browser package sends):
//! the prompt or the messages, sampling, stop strings, the draft to use and K.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::model::Model;
use crate::sampling::SamplingParams;
use crate::session::{self, FinishReason, GenerateOptions};
use crate::spec::{self, DraftModel, KPolicy, NGram};
use crate::tokenizer::{ChatTemplate, Message, StreamDecoder, Tokenizer};

/// Which draft a request speculates with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DraftKind {
    /// The loaded draft model.
    Model,
    /// N-gram lookup in the prompt and the text so far.
    Ngram,
    /// No speculation: plain target decoding.
    None,
}

fn default_max_tokens() -> usize {
    128
}
fn default_top_p() -> f32 {
    1.0
}
fn default_max_draft_k() -> usize {
    16
}

/// One generation request.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// Plain text prompt (BOS added where the vocabulary asks for it). Exclusive with `messages`.
    #[serde(default)]
    pub prompt: Option<String>,
    /// Chat messages, rendered with the model's chat template. Exclusive with `prompt`.
    #[serde(default)]
    pub messages: Option<Vec<Message>>,
    #[serde(default = "default_max_tokens")]
    pub max_tokens: usize,
    /// 0 = greedy.
    #[serde(default)]
    pub temperature: f32,
    /// 0 = no top-k cut.
    #[serde(default)]
    pub top_k: usize,
    #[serde(default = "default_top_p")]
    pub top_p: f32,
    #[serde(default)]
    pub seed: u64,
    /// Generation ends when the text contains one of these; the text ends before it.
    #[serde(default)]
    pub stop: Vec<String>,
    /// Default: the draft model when one is loaded, else no speculation.
    #[serde(default)]
    pub draft: Option<DraftKind>,
    /// Fixed K; `None` = adaptive up to `max_draft_k`.
    #[serde(default)]
    pub draft_k: Option<usize>,
    #[serde(default = "default_max_draft_k")]
    pub max_draft_k: usize,
}

impl Request {
    /// A greedy request for `prompt` with every other field at its default.
    pub fn text(prompt: &str, max_tokens: usize) -> Request {
        Request {
            prompt: Some(prompt.to_string()),
            messages: None,
            max_tokens,
            temperature: 0.0,
            top_k: 0,
            top_p: default_top_p(),
            seed: 0,
            stop: Vec::new(),
            draft: None,
            draft_k: None,
            max_draft_k: default_max_draft_k(),
        }
    }

    /// Parses a JSON request, naming the problem when it is malformed.
    pub fn from_json(json: &str) -> Result<Request> {
        let de = &mut serde_json::Deserializer::from_str(json);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let err = e.into_inner();
            match path.as_str() {
                "." | "" => Error::InvalidArgument(format!("request: {err}")),
                field => Error::InvalidArgument(format!("request field `{field}`: {err}")),
            }
        })
    }

    pub fn sampling(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            seed: self.seed,
        }
    }

    pub fn k_policy(&self) -> KPolicy {
        match self.draft_k {
            Some(k) => KPolicy::Fixed(k),
            None => KPolicy::Adaptive { max: self.max_draft_k },
        }
    }
}

/// One streamed piece of output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenEvent {
    /// The token committed, or `None` for the final flush of text held back (an incomplete
    /// UTF-8 sequence, or text that could have begun a stop string).
    pub id: Option<u32>,
    /// Text that became final with this event (possibly empty).
    pub text: String,
    /// The token was a draft token the target accepted (false: the target produced it).
    pub from_draft: bool,
}

/// The result of [`Engine::generate`]. `text` equals the concatenation of the streamed texts.
#[derive(Clone, Debug, Serialize)]
pub struct Completion {
    pub prompt_tokens: Vec<u32>,
    pub tokens: Vec<u32>,
    pub from_draft: Vec<bool>,
    pub text: String,
    /// `"stop"` (a stop token or string), `"length"` or `"cancelled"`.
    pub finish_reason: FinishReason,
    /// [`session::Stats`] or, when speculating, [`spec::SpecStats`].
    pub stats: serde_json::Value,
}

/// Text streaming with stop strings: text is released only once it cannot begin a stop string.
struct StopFilter<'a> {
    stops: &'a [String],
    /// All text so far (released and held).
    text: String,
    released: usize,
    /// Byte offset in `text` where a stop string begins, once found.
    hit: Option<usize>,
}

impl<'a> StopFilter<'a> {
    fn new(stops: &'a [String]) -> Self {
        StopFilter { stops, text: String::new(), released: 0, hit: None }
    }

    /// Adds `piece`; returns the text now safe to release.
    fn push(&mut self, piece: &str) -> String {
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

    fn release(&mut self, upto: usize) -> String {
        let upto = upto.max(self.released);
        let out = self.text[self.released..upto].to_string();
        self.released = upto;
        out
    }

    /// Everything not yet released (when no stop string was hit).
    fn flush(&mut self) -> String {
        match self.hit {
            Some(_) => String::new(),
            None => self.release(self.text.len()),
        }
    }
}

/// A loaded target (and optional draft) ready to generate.
pub struct Engine {
    target: Model,
    tokenizer: Tokenizer,
    chat_template: Option<ChatTemplate>,
    draft: Option<DraftModel>,
}

impl Engine {
    pub fn new(target: Model, tokenizer: Tokenizer, chat_template: Option<ChatTemplate>) -> Engine {
        Engine { target, tokenizer, chat_template, draft: None }
    }

    /// Sets the draft model (it must share the target's tokenizer) or removes it.
    pub fn set_draft(&mut self, draft: Option<(Model, &Tokenizer)>) -> Result<()> {
        self.draft = match draft {
            Some((model, tokenizer)) => {
                spec::check_draft((&self.target.config, &self.tokenizer), (&model.config, tokenizer))?;
                Some(DraftModel::new(model, &self.target.config)?)
            }
            None => None,
        };
        Ok(())
    }

    pub fn target(&self) -> &Model {
        &self.target
    }

    pub fn draft_model(&self) -> Option<&Model> {
        self.draft.as_ref().map(|d| d.model())
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn has_chat_template(&self) -> bool {
        self.chat_template.is_some()
    }

    /// The prompt text of `messages` under the model's chat template (assistant turn opened).
    pub fn chat_prompt(&self, messages: &[Message]) -> Result<String> {
        self.chat_template
            .as_ref()
            .ok_or_else(|| Error::ChatTemplate("the model declares no chat template".into()))?
            .render(messages, true)
    }

    /// The prompt's token ids.
    pub fn prompt_tokens(&self, req: &Request) -> Result<Vec<u32>> {
        match (&req.prompt, &req.messages) {
            (Some(p), None) => self.tokenizer.encode(p, true),
            // The template places the special tokens itself.
            (None, Some(m)) => self.tokenizer.encode(&self.chat_prompt(m)?, false),
            _ => Err(Error::InvalidArgument("a request needs exactly one of `prompt` and `messages`".into())),
        }
    }

    /// Generates for `req`, calling `on_token` for every committed token (return false to stop)
    /// and once more with `id: None` when held-back text remains at the end.
    pub async fn generate(
        &mut self,
        req: &Request,
        on_token: &mut dyn FnMut(&TokenEvent) -> bool,
    ) -> Result<Completion> {
        let prompt = self.prompt_tokens(req)?;
        let opts = GenerateOptions {
            max_tokens: req.max_tokens,
            sampling: req.sampling(),
            stop_tokens: self.tokenizer.eos_ids().to_vec(),
        };
        let kind = req.draft.unwrap_or(if self.draft.is_some() { DraftKind::Model } else { DraftKind::None });

        let tokenizer = &self.tokenizer;
        let mut decoder = StreamDecoder::new();
        let mut filter = StopFilter::new(&req.stop);
        let mut stream_err = None;
        let mut on_commit = |id: u32, from_draft: bool| -> bool {
            let piece = match decoder.push(tokenizer, id) {
                Ok(p) => p,
                Err(e) => {
                    stream_err = Some(e);
                    return false;
                }
            };
            let text = filter.push(&piece);
            let go_on = on_token(&TokenEvent { id: Some(id), text, from_draft });
            go_on && filter.hit.is_none()
        };
        let (tokens, from_draft, finish, stats) = match kind {
            DraftKind::None => {
                let g = session::generate(&mut self.target, &prompt, &opts, &mut |id| on_commit(id, false))
                    .await?;
                let n = g.tokens.len();
                (g.tokens, vec![false; n], g.finish, serde_json::to_value(&g.stats))
            }
            DraftKind::Ngram | DraftKind::Model => {
                let mut ngram = NGram::default();
                let draft: &mut dyn spec::Draft = match (kind, self.draft.as_mut()) {
                    (DraftKind::Ngram, _) => &mut ngram,
                    (_, Some(d)) => d,
                    (_, None) => {
                        return Err(Error::InvalidArgument(
                            "draft \"model\" asked for, but none is loaded".into(),
                        ))
                    }
                };
                let g =
                    spec::generate(&mut self.target, draft, &prompt, &opts, req.k_policy(), &mut on_commit)
                        .await?;
                (g.tokens, g.from_draft, g.finish, serde_json::to_value(&g.stats))
            }
        };
        if let Some(e) = stream_err {
            return Err(e);
        }
        let stats = stats.map_err(|e| Error::InvalidArgument(format!("stats: {e}")))?;
        let rest = decoder.finish(tokenizer)?;
        let mut tail = filter.push(&rest);
        tail.push_str(&filter.flush());
        if !tail.is_empty() {
            on_token(&TokenEvent { id: None, text: tail, from_draft: false });
        }
        let finish = if filter.hit.is_some() { FinishReason::Stop } else { finish };
        let text = filter.text[..filter.released].to_string();
        Ok(Completion { prompt_tokens: prompt, tokens, from_draft, text, finish_reason: finish, stats })
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

//! Chat templates: the model's own Jinja template (GGUF `tokenizer.chat_template`, or
//! `chat_template` in `tokenizer_config.json`) rendered with minijinja the way Hugging Face
//! `apply_chat_template` renders it (`trim_blocks`, `lstrip_blocks`, Python string methods,
//! `raise_exception`), so the prompt text is the one the model was trained on.
//!
//! A template is a program from the internet: it runs on a budget ([`TEMPLATE_FUEL`] minijinja
//! instructions, [`MAX_RENDER_BYTES`] of output, and a byte budget on every value it makes, see
//! `template_budget`), so a hostile one fails in well under a second with [`Error::ChatTemplate`]. A template that does not parse is an error only when a chat is
//! rendered: plain generation never needs it.

use minijinja::{Environment, ErrorKind};
use serde::{Deserialize, Serialize};

use super::{template_budget, Tokenizer};
use crate::error::{Error, Result};

/// One chat message (`role`: "system", "user", "assistant", ...).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

/// Instructions one render may run (a chat of hundreds of messages takes well under 1% of it).
pub const TEMPLATE_FUEL: u64 = 5_000_000;
/// The longest prompt text one render may write.
pub const MAX_RENDER_BYTES: usize = 16 << 20;

/// A compiled chat template with the tokenizer's BOS / EOS texts.
#[derive(Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    /// Why the template did not compile (reported when a chat is rendered).
    broken: Option<String>,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("bos_token", &self.bos_token).finish()
    }
}

fn template_err(e: minijinja::Error) -> Error {
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        msg.push_str(&format!(": {s}"));
        source = s.source();
    }
    Error::ChatTemplate(crate::error::printable(&msg))
}

impl ChatTemplate {
    /// Compiles `source` with the texts the template knows as `bos_token` and `eos_token`. A
    /// template that does not parse gives a `ChatTemplate` whose [`ChatTemplate::render`] and
    /// [`ChatTemplate::check`] return the parse error.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> ChatTemplate {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_fuel(Some(TEMPLATE_FUEL));
        template_budget::install(&mut env, minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> std::result::Result<String, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
        });
        let broken =
            env.add_template_owned("chat", source.to_string()).err().map(|e| match template_err(e) {
                Error::ChatTemplate(msg) => format!("the chat template does not parse: {msg}"),
                other => other.to_string(),
            });
        ChatTemplate { env, broken, bos_token: bos_token.to_string(), eos_token: eos_token.to_string() }
    }

    /// Whether the template parsed (its error otherwise).
    pub fn check(&self) -> Result<()> {
        match &self.broken {
            Some(msg) => Err(Error::ChatTemplate(msg.clone())),
            None => Ok(()),
        }
    }

    /// [`ChatTemplate::new`] with the tokenizer's BOS and (first) end-of-generation token texts.
    pub fn for_tokenizer(source: &str, tokenizer: &Tokenizer) -> ChatTemplate {
        let text = |id: Option<u32>| id.and_then(|id| tokenizer.decode(&[id]).ok()).unwrap_or_default();
        ChatTemplate::new(source, &text(tokenizer.bos()), &text(tokenizer.eos_ids().first().copied()))
    }

    /// The prompt text for `messages`, ending with the assistant turn's opening when
    /// `add_generation_prompt`. Tokenize it without adding special tokens: the template places them.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        if messages.is_empty() {
            return Err(Error::InvalidArgument("a chat needs at least one message".into()));
        }
        self.check()?;
        let tmpl = self.env.get_template("chat").map_err(template_err)?;
        let compiled = minijinja::machinery::get_compiled_template(&tmpl);
        let guarded = template_budget::guard(&compiled.instructions).map_err(template_err)?;
        let blocks = compiled
            .blocks
            .iter()
            .map(|(name, block)| Ok((*name, template_budget::guard(block)?)))
            .collect::<std::result::Result<_, minijinja::Error>>()
            .map_err(template_err)?;
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token,
            eos_token => self.eos_token,
        };
        let mut text = String::new();
        let mut out = minijinja::machinery::make_string_output(&mut text);
        template_budget::with_budget(|| {
            minijinja::machinery::Vm::new(&self.env).eval(
                &guarded,
                ctx,
                &blocks,
                &mut out,
                compiled.initial_auto_escape,
            )
        })
        .map_err(template_err)?;
        if text.len() > MAX_RENDER_BYTES {
            return Err(Error::ChatTemplate(format!(
                "the template's output exceeds {MAX_RENDER_BYTES} bytes"
            )));
        }
        Ok(text)
    }
    /// The prompt ids of `messages` (assistant turn opened), with message content as plain
    /// text: only the template's own markup becomes control tokens. A user who types
    /// `<|im_end|>` gets those characters, not the end of their turn (the guard against prompt
    /// injection through chat markup). Content without special-token text is tokenized exactly
    /// as the rendered prompt is; content with it has each occurrence spelled in ordinary tokens.
    pub fn prompt_tokens(&self, messages: &[Message], tokenizer: &Tokenizer) -> Result<Vec<u32>> {
        let specials = tokenizer.special_texts();
        let has_special = |text: &str| specials.iter().any(|s| text.contains(s.as_str()));
        if !messages.iter().any(|m| has_special(&m.content)) {
            return tokenizer.encode(&self.render(messages, true)?, false);
        }
        // Each occurrence becomes a marker the template copies through; the rendered text is then
        // tokenized between markers, and each marker as its special text spelled plainly. The
        // marker's delimiter is a private-use character that no message holds.
        let delim = ('\u{E000}'..='\u{F8FF}')
            .find(|c| !messages.iter().any(|m| m.content.contains(*c) || m.role.contains(*c)))
            .ok_or_else(|| Error::InvalidArgument("the messages use every private-use character".into()))?;
        let mut replaced = Vec::new();
        let marked: Vec<Message> = messages
            .iter()
            .map(|m| Message {
                role: m.role.clone(),
                content: mark(&m.content, &specials, delim, &mut replaced),
            })
            .collect();
        let text = self.render(&marked, true)?;
        let mut ids = Vec::new();
        let mut pieces = text.split(delim);
        if let Some(first) = pieces.next() {
            ids.extend(tokenizer.encode(first, false)?);
        }
        let mut seen = 0;
        while let (Some(index), Some(after)) = (pieces.next(), pieces.next()) {
            let original = index.parse::<usize>().ok().and_then(|i| replaced.get(i));
            let original: &String = original.ok_or_else(|| {
                Error::ChatTemplate("the template altered a message's special-token text".into())
            })?;
            ids.extend(tokenizer.encode_plain(original)?);
            ids.extend(tokenizer.encode(after, false)?);
            seen += 1;
        }
        if seen == 0 || text.matches(delim).count() != 2 * seen {
            return Err(Error::ChatTemplate("the template altered a message's special-token text".into()));
        }
        Ok(ids)
    }
}

/// `content` with every special-token text in it replaced by `delim` index `delim`, the texts
/// appended to `replaced` (leftmost, longest match first).
fn mark(content: &str, specials: &[String], delim: char, replaced: &mut Vec<String>) -> String {
    let mut out = String::with_capacity(content.len());
    let mut rest = content;
    while let Some((at, special)) = specials
        .iter()
        .filter_map(|s| rest.find(s.as_str()).map(|i| (i, s)))
        .min_by_key(|&(i, s)| (i, std::cmp::Reverse(s.len())))
    {
        out.push_str(&rest[..at]);
        out.push(delim);
        out.push_str(&replaced.len().to_string());
        out.push(delim);
        replaced.push(special.clone());
        rest = &rest[at + special.len()..];
    }
    out.push_str(rest);
    out
}

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

/// The roles a chat template is given. A role is written into the template's markup, so only
/// these reach it, whatever a front end was sent (see [`known_role`]).
pub const ROLES: &[&str] = &["system", "user", "assistant", "tool"];

/// `role` as a template is given it: one of [`ROLES`], or OpenAI's `developer` (the `system` of
/// its newer models) as `system`; `None` for any other text.
pub fn known_role(role: &str) -> Option<&'static str> {
    match role {
        "developer" => Some("system"),
        role => ROLES.iter().find(|r| **r == role).copied(),
    }
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
    /// A message whose role is not one of [`ROLES`] (or `developer`, given as `system`) is refused.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        if messages.is_empty() {
            return Err(Error::InvalidArgument("a chat needs at least one message".into()));
        }
        self.check()?;
        let mut renamed = None;
        for (i, m) in messages.iter().enumerate() {
            match known_role(&m.role) {
                None => {
                    return Err(Error::InvalidArgument(format!(
                        "message {i}: the role {:?} is none of {} (or developer)",
                        crate::error::printable(&m.role.chars().take(64).collect::<String>()),
                        ROLES.join(", ")
                    )))
                }
                Some(role) if role != m.role => {
                    let all = renamed.get_or_insert_with(|| messages.to_vec());
                    all[i].role = role.to_string();
                }
                Some(_) => {}
            }
        }
        let messages = renamed.as_deref().unwrap_or(messages);
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
        self.prompt_tokens_within(messages, tokenizer, None)
    }

    /// [`ChatTemplate::prompt_tokens`], refusing a rendered prompt over `limit` before it is
    /// tokenized.
    ///
    /// Besides special-token text inside a message, a message that begins with the end of a
    /// special token's text (`|>`), ends with its beginning (`<|im_`) or lies inside one could
    /// complete one with the template's text beside it; such edges are spelled in ordinary
    /// tokens too, unless the prompt as rendered, tokenized whole, holds exactly the same
    /// control tokens (then its ids are kept: the usual case, as the template's text beside a
    /// message is whole markup).
    pub fn prompt_tokens_within(
        &self,
        messages: &[Message],
        tokenizer: &Tokenizer,
        limit: Option<TextLimit>,
    ) -> Result<Vec<u32>> {
        let specials = tokenizer.special_texts();
        let risky = |m: &Message| {
            let c = m.content.as_str();
            tokenizer.find_specials(c).next().is_some()
                || [c, c.trim()].iter().any(|c| edges(c, specials) != (0, 0))
        };
        if !messages.iter().any(risky) {
            let text = self.render(messages, true)?;
            check_limit(limit, text.len())?;
            return tokenizer.encode(&text, false);
        }
        // Each occurrence becomes a marker the template copies through; the rendered text is then
        // tokenized between markers, and each marker as its text spelled plainly. The marker's
        // delimiter is a private-use character that no message holds.
        let delim = unused_private_char(messages)
            .ok_or_else(|| Error::InvalidArgument("the messages use every private-use character".into()))?;
        let mut replaced = Vec::new();
        let marked: Vec<Message> = messages
            .iter()
            .map(|m| {
                mark(&m.content, tokenizer, delim, &mut replaced)
                    .map(|content| Message { role: m.role.clone(), content })
            })
            .collect::<Result<_>>()?;
        let text = self.render(&marked, true)?;
        // The prompt's bytes with each marker spelled out again.
        let markers: usize = (0..replaced.len()).map(|i| marker_len(delim, i)).sum();
        let originals: usize = replaced.iter().map(String::len).sum();
        check_limit(limit, (text.len() + originals).saturating_sub(markers))?;
        let altered = || Error::ChatTemplate("the template altered a message's special-token text".into());
        let mut ids = Vec::new();
        let mut pieces = text.split(delim);
        if let Some(first) = pieces.next() {
            ids.extend(tokenizer.encode(first, false)?);
        }
        let mut seen = 0;
        while let (Some(index), Some(after)) = (pieces.next(), pieces.next()) {
            let original = index.parse::<usize>().ok().and_then(|i| replaced.get(i)).ok_or_else(altered)?;
            ids.extend(tokenizer.encode_plain(original)?);
            ids.extend(tokenizer.encode(after, false)?);
            seen += 1;
        }
        // (a template may drop a message, and its markers with it, but not split one)
        if text.matches(delim).count() != 2 * seen {
            return Err(altered());
        }
        // Only edges were spelled apart: the prompt as rendered serves when its ids hold the
        // same control tokens in the same order (no edge completed one).
        if replaced.iter().all(|r| specials.binary_search(r).is_err()) {
            let text = self.render(messages, true)?;
            check_limit(limit, text.len())?;
            let whole = tokenizer.encode(&text, false)?;
            let control = tokenizer.special_ids();
            let controls = |ids: &[u32]| {
                ids.iter().copied().filter(|id| control.binary_search(id).is_ok()).collect::<Vec<_>>()
            };
            if controls(&whole) == controls(&ids) {
                return Ok(whole);
            }
        }
        Ok(ids)
    }
}

/// The most special-token texts and edges the messages of one chat may hold (each is tokenized
/// on its own).
pub const MAX_MARKED: usize = 1024;

/// A private-use character that no message's content or role holds (one pass over them).
fn unused_private_char(messages: &[Message]) -> Option<char> {
    const FIRST: u32 = 0xE000;
    const LAST: u32 = 0xF8FF;
    let mut used = vec![false; (LAST - FIRST + 1) as usize];
    for m in messages {
        for c in m.content.chars().chain(m.role.chars()) {
            if (FIRST..=LAST).contains(&(c as u32)) {
                used[(c as u32 - FIRST) as usize] = true;
            }
        }
    }
    let free = used.iter().position(|u| !u)?;
    char::from_u32(FIRST + free as u32)
}

/// The most bytes a rendered prompt may have before it is tokenized: more than `context`
/// tokens' worth of text ([`Tokenizer::max_bytes_per_token`] bytes each) cannot fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TextLimit {
    /// Tokens the prompt must stay under.
    pub context: usize,
    /// `context` times the most bytes one token stands for.
    pub max_bytes: usize,
}

impl TextLimit {
    /// The limit for `context` tokens of `tokenizer`'s vocabulary, where it is bounded.
    pub fn new(tokenizer: &Tokenizer, context: usize) -> Option<TextLimit> {
        let max_bytes = tokenizer.max_bytes_per_token()?.checked_mul(context)?;
        Some(TextLimit { context, max_bytes })
    }

    /// [`Error::PromptTooLong`] for a text of more than `max_bytes` bytes.
    pub fn check(&self, bytes: usize) -> Result<()> {
        if bytes > self.max_bytes {
            return Err(Error::PromptTooLong { bytes, max_bytes: self.max_bytes, context: self.context });
        }
        Ok(())
    }
}

fn check_limit(limit: Option<TextLimit>, bytes: usize) -> Result<()> {
    limit.map_or(Ok(()), |l| l.check(bytes))
}

/// The bytes of marker `index` (`delim`, the index's digits, `delim`).
fn marker_len(delim: char, index: usize) -> usize {
    2 * delim.len_utf8() + index.to_string().len()
}

/// The lengths of the longest prefix of `content` that ends a special token's text and of the
/// longest suffix that begins one (proper parts only: a whole special text is no edge); a
/// message that lies inside a special token's text is one edge, whole.
fn edges(content: &str, specials: &[String]) -> (usize, usize) {
    if !content.is_empty() && specials.iter().any(|s| s.len() > content.len() && s.contains(content)) {
        return (content.len(), 0);
    }
    let mut head = 0;
    let mut tail = 0;
    for s in specials {
        for (i, _) in s.char_indices().skip(1) {
            if content.starts_with(&s[i..]) {
                head = head.max(s.len() - i);
            }
            if content.ends_with(&s[..i]) {
                tail = tail.max(i);
            }
        }
    }
    if head + tail > content.len() {
        // Both edges overlap: the whole message is one edge.
        return (content.len(), 0);
    }
    (head, tail)
}

/// `content` with every special-token text in it, and its edges (see [`edges`]), replaced by
/// `delim` index `delim`, the texts appended to `replaced` (leftmost, longest match first); more
/// than [`MAX_MARKED`] in all is refused.
fn mark(content: &str, tokenizer: &Tokenizer, delim: char, replaced: &mut Vec<String>) -> Result<String> {
    let mut out = String::with_capacity(content.len());
    let mut put = |out: &mut String, text: &str| {
        if replaced.len() == MAX_MARKED {
            return Err(Error::InvalidArgument(format!(
                "the messages hold more than {MAX_MARKED} special-token texts"
            )));
        }
        out.push(delim);
        out.push_str(&replaced.len().to_string());
        out.push(delim);
        replaced.push(text.to_string());
        Ok(())
    };
    let specials = tokenizer.special_texts();
    // edges of the content, or of it trimmed (templates trim)
    let (head, tail) = edges(content, specials);
    let (head, tail) = if (head, tail) == (0, 0) {
        let trimmed = content.trim();
        let at = content.len() - content.trim_start().len();
        match edges(trimmed, specials) {
            (0, 0) => (0, 0),
            (h, t) => (at + h, content.len() - (at + trimmed.len()) + t),
        }
    } else {
        (head, tail)
    };
    let (head, tail) = if head + tail > content.len() { (content.len(), 0) } else { (head, tail) };
    if head > 0 {
        put(&mut out, &content[..head])?;
    }
    let rest = &content[head..content.len() - tail];
    let mut last = 0;
    for (start, end) in tokenizer.find_specials(rest) {
        out.push_str(&rest[last..start]);
        put(&mut out, &rest[start..end])?;
        last = end;
    }
    out.push_str(&rest[last..]);
    if tail > 0 {
        put(&mut out, &content[content.len() - tail..])?;
    }
    Ok(out)
}

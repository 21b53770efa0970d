//! Chat templates: the model's own Jinja template (GGUF `tokenizer.chat_template`, or
//! `chat_template` in `tokenizer_config.json`) rendered with minijinja the way Hugging Face
//! `apply_chat_template` renders it (`trim_blocks`, `lstrip_blocks`, Python string methods,
//! `raise_exception`), so the prompt text is the one the model was trained on.

use minijinja::{Environment, ErrorKind};
use serde::{Deserialize, Serialize};

use super::Tokenizer;
use crate::error::{Error, Result};

/// One chat message (`role`: "system", "user", "assistant", ...).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

/// A compiled chat template with the tokenizer's BOS / EOS texts.
pub struct ChatTemplate {
    env: Environment<'static>,
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
    Error::ChatTemplate(msg)
}

impl ChatTemplate {
    /// Compiles `source` with the texts the template knows as `bos_token` and `eos_token`;
    /// refuses a template that does not parse.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> std::result::Result<String, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_template_owned("chat", source.to_string()).map_err(template_err)?;
        Ok(ChatTemplate { env, bos_token: bos_token.to_string(), eos_token: eos_token.to_string() })
    }

    /// [`ChatTemplate::new`] with the tokenizer's BOS and (first) end-of-generation token texts.
    pub fn for_tokenizer(source: &str, tokenizer: &Tokenizer) -> Result<ChatTemplate> {
        let text = |id: Option<u32>| id.and_then(|id| tokenizer.decode(&[id]).ok()).unwrap_or_default();
        ChatTemplate::new(source, &text(tokenizer.bos()), &text(tokenizer.eos_ids().first().copied()))
    }

    /// The prompt text for `messages`, ending with the assistant turn's opening when
    /// `add_generation_prompt`. Tokenize it without adding special tokens: the template places them.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        if messages.is_empty() {
            return Err(Error::InvalidArgument("a chat needs at least one message".into()));
        }
        let tmpl = self.env.get_template("chat").map_err(template_err)?;
        tmpl.render(minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token,
            eos_token => self.eos_token,
        })
        .map_err(template_err)
    }
}

//! The fields of a request body whose JSON may have several shapes, read straight from the
//! bytes without building a JSON tree: a body's cost in memory stays close to its size (a tree
//! of 8 MiB of `[0,0,...]` would take 16 times that), and a list over its limit stops the
//! reading at its first element too many.

use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use crate::tokenizer::{known_role, ROLES};

/// The most messages of one chat (a conversation of thousands of turns fills any context long
/// before; the limit bounds what reading a body builds).
pub const MAX_MESSAGES: usize = 2048;
/// The most prompts of one completions request, and the most choices it asks for in all
/// (prompts × `n`): each choice is a sequence of the server's batch.
pub const MAX_PROMPTS: usize = 32;
/// The most stop strings one request may give.
pub const MAX_STOPS: usize = 16;
/// The longest stop string, in bytes (the decode loop holds back text that could begin one, and
/// checks every prefix of every stop string after each token).
pub const MAX_STOP_BYTES: usize = 256;

/// A message's role as the chat template is given it ([`known_role`]: one of the template roles,
/// or `developer` as `system`). A role is the one field of a message that a template writes into
/// its markup, so nothing else is let through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Role(pub &'static str);

impl<'de> Deserialize<'de> for Role {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Role, D::Error> {
        let AnyString::Str(given) = AnyString::deserialize(d)? else {
            return Err(de::Error::custom("must be a string"));
        };
        known_role(&given).map(Role).ok_or_else(|| {
            de::Error::custom(format!(
                "must be one of {} or developer, not {:?}",
                ROLES.join(", "),
                crate::error::printable(&given.chars().take(64).collect::<String>())
            ))
        })
    }
}

/// A chat message as OpenAI documents it. Unknown fields are refused; the fields clients send
/// back with an assistant's earlier answer are accepted when they ask for nothing.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatMessage {
    pub role: Role,
    pub content: Option<Content>,
    /// A participant's name: accepted, not shown to the model.
    #[serde(default, rename = "name")]
    _name: Option<IgnoredAny>,
    /// A tool message's call id: accepted, not shown to the model (there are no tool calls).
    #[serde(default, rename = "tool_call_id")]
    _tool_call_id: Option<IgnoredAny>,
    #[serde(default, rename = "tool_calls")]
    _tool_calls: Option<Nothing>,
    #[serde(default, rename = "function_call")]
    _function_call: Option<Nothing>,
    #[serde(default, rename = "refusal")]
    _refusal: Option<Nothing>,
    #[serde(default, rename = "audio")]
    _audio: Option<Nothing>,
    #[serde(default, rename = "annotations")]
    _annotations: Option<Nothing>,
    /// An assistant's reasoning, as reasoning servers return it and clients send it back: not
    /// shown to the model (templates drop earlier turns' reasoning).
    #[serde(default, rename = "reasoning_content")]
    _reasoning_content: Option<IgnoredAny>,
    #[serde(default, rename = "reasoning")]
    _reasoning: Option<IgnoredAny>,
}

/// At most [`MAX_MESSAGES`] messages.
pub struct Messages(pub Vec<ChatMessage>);

impl<'de> Deserialize<'de> for Messages {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Messages, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Messages;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of messages")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Messages, A::Error> {
                let mut out = Vec::new();
                while let Some(m) = seq.next_element::<ChatMessage>()? {
                    if out.len() == MAX_MESSAGES {
                        return Err(de::Error::custom(format!("at most {MAX_MESSAGES} messages")));
                    }
                    out.push(m);
                }
                Ok(Messages(out))
            }
        }
        d.deserialize_seq(V)
    }
}

/// A message's content: a string, or a list of text parts (`{"type": "text", "text": ...}`),
/// joined by newlines (as vLLM joins them).
pub struct Content(pub String);

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Content, D::Error> {
        struct V;
        const PARTS: &str = "only text parts ({\"type\": \"text\", \"text\": ...}) are supported";
        impl<'de> Visitor<'de> for V {
            type Value = Content;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or a list of text parts")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Content, E> {
                Ok(Content(s.to_string()))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Content, E> {
                Ok(Content(s))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Content, A::Error> {
                let mut text = String::new();
                let mut first = true;
                while let Some(part) = seq.next_element::<Part>()? {
                    match part {
                        Part { kind: Some(k), text: Some(t) } if k == "text" => {
                            // (the parts' texts on lines of their own, as vLLM joins them)
                            if !std::mem::take(&mut first) {
                                text.push('\n');
                            }
                            text.push_str(&t)
                        }
                        _ => return Err(de::Error::custom(PARTS)),
                    }
                }
                Ok(Content(text))
            }
        }
        d.deserialize_any(V)
    }
}

/// One part of a message's content; other keys are ignored.
#[derive(Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: Option<String>,
    text: Option<String>,
}

/// A value that must ask for nothing: null, false, 0, `[]` or `{}` (a field of an unsupported
/// feature that clients send empty).
pub struct Nothing;

impl<'de> Deserialize<'de> for Nothing {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Nothing, D::Error> {
        match Probe::deserialize(d)? {
            Probe::Null | Probe::False | Probe::Zero | Probe::Empty => Ok(Nothing),
            _ => Err(de::Error::custom("is not supported (tool calls, audio and annotations)")),
        }
    }
}

/// The shape of a value, read without keeping it (strings aside): enough to tell a field that
/// asks for nothing from one that asks for something this server does not do.
#[derive(Debug, PartialEq, Eq)]
pub enum Probe {
    Null,
    False,
    /// The number 0.
    Zero,
    /// `[]` or `{}`.
    Empty,
    Str(String),
    /// An object with these many keys and the string of its `type` key, if it has one.
    Object {
        keys: usize,
        kind: Option<String>,
    },
    /// Anything else: true, a number other than 0, a list.
    Other,
}

impl<'de> Deserialize<'de> for Probe {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Probe, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Probe;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any value")
            }
            fn visit_unit<E>(self) -> Result<Probe, E> {
                Ok(Probe::Null)
            }
            fn visit_none<E>(self) -> Result<Probe, E> {
                Ok(Probe::Null)
            }
            fn visit_bool<E>(self, b: bool) -> Result<Probe, E> {
                Ok(if b { Probe::Other } else { Probe::False })
            }
            fn visit_u64<E>(self, n: u64) -> Result<Probe, E> {
                Ok(if n == 0 { Probe::Zero } else { Probe::Other })
            }
            fn visit_i64<E>(self, n: i64) -> Result<Probe, E> {
                Ok(if n == 0 { Probe::Zero } else { Probe::Other })
            }
            fn visit_f64<E>(self, n: f64) -> Result<Probe, E> {
                Ok(if n == 0.0 { Probe::Zero } else { Probe::Other })
            }
            fn visit_str<E>(self, s: &str) -> Result<Probe, E> {
                Ok(Probe::Str(s.to_string()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Probe, A::Error> {
                if seq.next_element::<IgnoredAny>()?.is_none() {
                    return Ok(Probe::Empty);
                }
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Probe::Other)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Probe, A::Error> {
                let (mut keys, mut kind) = (0, None);
                while let Some(key) = map.next_key::<AnyString>()? {
                    keys += 1;
                    match key {
                        AnyString::Str(k) if k == "type" => {
                            if let AnyString::Str(s) = map.next_value::<AnyString>()? {
                                kind = Some(s);
                            }
                        }
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(if keys == 0 { Probe::Empty } else { Probe::Object { keys, kind } })
            }
        }
        d.deserialize_any(V)
    }
}

/// A string, or any other value (not kept).
enum AnyString {
    Str(String),
    Other,
}

impl<'de> Deserialize<'de> for AnyString {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<AnyString, D::Error> {
        Ok(match Probe::deserialize(d)? {
            Probe::Str(s) => AnyString::Str(s),
            _ => AnyString::Other,
        })
    }
}

/// A completions `prompt`: a string, or a list of 1 to [`MAX_PROMPTS`] strings (each answered
/// by its own choices).
pub struct PromptText(pub Vec<String>);

impl<'de> Deserialize<'de> for PromptText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<PromptText, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = PromptText;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or a list of strings")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<PromptText, E> {
                Ok(PromptText(vec![s.to_string()]))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<PromptText, E> {
                Ok(PromptText(vec![s]))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<PromptText, A::Error> {
                const SHAPE: &str = "must be a string or a list of strings (token arrays are not supported)";
                let mut prompts = Vec::new();
                while let Some(s) = seq.next_element::<AnyString>()? {
                    match s {
                        AnyString::Str(s) if prompts.len() < MAX_PROMPTS => prompts.push(s),
                        AnyString::Str(_) => {
                            return Err(de::Error::custom(format!(
                                "a list of more than {MAX_PROMPTS} prompts"
                            )))
                        }
                        AnyString::Other => return Err(de::Error::custom(SHAPE)),
                    }
                }
                if prompts.is_empty() {
                    return Err(de::Error::custom("an empty list of prompts"));
                }
                Ok(PromptText(prompts))
            }
        }
        d.deserialize_any(V)
    }
}

/// `stop`: a string or a list of at most [`MAX_STOPS`] strings of at most [`MAX_STOP_BYTES`].
pub struct Stops(pub Vec<String>);

fn stop<E: de::Error>(s: String) -> Result<String, E> {
    if s.len() > MAX_STOP_BYTES {
        return Err(de::Error::custom(format!(
            "a stop string of {} bytes (at most {MAX_STOP_BYTES})",
            s.len()
        )));
    }
    Ok(s)
}

impl<'de> Deserialize<'de> for Stops {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Stops, D::Error> {
        struct V;
        const SHAPE: &str = "must be a string or a list of strings";
        impl<'de> Visitor<'de> for V {
            type Value = Stops;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or a list of strings")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Stops, E> {
                Ok(Stops(vec![stop(s.to_string())?]))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Stops, A::Error> {
                let mut out = Vec::new();
                while let Some(s) = seq.next_element::<AnyString>()? {
                    let AnyString::Str(s) = s else {
                        return Err(de::Error::custom(SHAPE));
                    };
                    if out.len() == MAX_STOPS {
                        return Err(de::Error::custom(format!("at most {MAX_STOPS} stop strings")));
                    }
                    out.push(stop(s)?);
                }
                Ok(Stops(out))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Stops, E> {
                Err(de::Error::custom(SHAPE))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Stops, E> {
                Err(de::Error::custom(SHAPE))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Stops, E> {
                Err(de::Error::custom(SHAPE))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Stops, E> {
                Err(de::Error::custom(SHAPE))
            }
            fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<Stops, A::Error> {
                Err(de::Error::custom(SHAPE))
            }
        }
        d.deserialize_any(V)
    }
}

//! The one error type of the crate. Every fallible public function returns [`Result`].
//! Variants are structured so that callers (CLI, server, wasm facade) can tell problems apart.

use std::fmt;

/// Everything that can go wrong in wgspec, named precisely.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading a file or another byte source failed.
    #[error("i/o error on {path}: {message}")]
    Io { path: String, message: String },

    /// The byte stream ended before a structure was complete.
    #[error("file truncated: needed {needed} bytes at offset {offset} for {what}, but the file has {len}")]
    Truncated { what: String, offset: u64, needed: u64, len: u64 },

    /// The file does not start with the magic of the expected format.
    #[error("bad magic: expected {expected}, found {found:?}")]
    BadMagic { expected: &'static str, found: [u8; 4] },

    /// A known format, but a version this crate does not read.
    #[error("unsupported {format} version {version}")]
    UnsupportedVersion { format: &'static str, version: u32 },

    /// A header field has a value that cannot be right (a count, a dimension, an offset, a length).
    #[error("corrupt {format} file: {message}")]
    Corrupt { format: &'static str, message: String },

    /// A tensor element type that no loader or kernel knows.
    #[error("tensor {tensor}: unknown or unsupported tensor type {type_name}")]
    UnsupportedTensorType { tensor: String, type_name: String },

    /// A tensor the architecture needs is not in the file.
    #[error("missing tensor {name}")]
    MissingTensor { name: String },

    /// A tensor is present but has the wrong shape for the model's config.
    #[error("tensor {name} has shape {found:?}, expected {expected:?}")]
    TensorShape { name: String, expected: Vec<usize>, found: Vec<usize> },

    /// A metadata key the architecture needs is missing or has the wrong type.
    #[error("metadata {key}: {message}")]
    Metadata { key: String, message: String },

    /// The model's architecture is not one this crate runs.
    #[error("unsupported architecture {0:?} (supported: llama, qwen2)")]
    UnsupportedArchitecture(String),

    /// The tokens do not fit in the model's context window.
    #[error("context overflow: {needed} positions needed, the context holds {context}")]
    ContextOverflow { needed: usize, context: usize },

    /// A prompt of more bytes than the context could hold in tokens, refused before it was
    /// tokenized (see [`crate::tokenizer::Tokenizer::max_bytes_per_token`]).
    #[error(
        "the prompt is {bytes} bytes; a context of {context} tokens holds at most {max_bytes} bytes of this vocabulary's text"
    )]
    PromptTooLong { bytes: usize, max_bytes: usize, context: usize },

    /// A call was made with arguments that cannot be served.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// A token id is not in the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    TokenOutOfRange { id: u32, vocab: usize },

    /// Building or using the tokenizer failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),

    /// A chat template that does not compile or render.
    #[error("chat template: {0}")]
    ChatTemplate(String),

    /// The engine is already running a request (one generation at a time per engine).
    #[error("busy: {0}")]
    Busy(String),

    /// No GPU adapter could be found or a device could not be created.
    #[error("no usable GPU: {0}")]
    NoGpu(String),

    /// The adapter lacks a limit or feature this model needs.
    #[error("GPU limit: {0}")]
    GpuLimit(String),

    /// A GPU operation (buffer mapping, submission, validation) failed.
    #[error("GPU error: {0}")]
    Gpu(String),

    /// An API request (OpenAI's shapes) refused: the message, the field at fault and a
    /// machine-readable code (`model_not_found`, `context_length_exceeded`, `invalid_json`, ...).
    #[error("{message}")]
    Request { message: String, param: Option<String>, code: Option<&'static str> },

    /// The model computed a NaN or an infinity where a number was needed.
    #[error("numerical error: {0}")]
    NonFinite(String),

    /// Fetching a model failed (a download, an archive, a checksum).
    #[error("fetch {name}: {message}")]
    Fetch { name: String, message: String },

    /// A model file's problem, with the file named (a target and a draft load side by side).
    #[error("{path}: {error}")]
    InFile { path: String, error: Box<Error> },
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Shorthand for [`Error::Corrupt`].
    pub fn corrupt(format: &'static str, message: impl fmt::Display) -> Self {
        Error::Corrupt { format, message: printable(&message.to_string()) }
    }
    /// Shorthand for [`Error::Io`].
    pub fn io(path: impl fmt::Display, err: impl fmt::Display) -> Self {
        Error::Io { path: path.to_string(), message: err.to_string() }
    }
    /// This error as the problem of the file at `path` ([`Error::InFile`]), unless it names a
    /// file already ([`Error::Io`], [`Error::InFile`], [`Error::Fetch`]) or is the GPU's
    /// ([`Error::NoGpu`], [`Error::Gpu`]).
    pub fn in_file(self, path: impl fmt::Display) -> Self {
        match self {
            Error::Io { .. }
            | Error::InFile { .. }
            | Error::Fetch { .. }
            | Error::NoGpu(_)
            | Error::Gpu(_) => self,
            e => Error::InFile { path: printable(&path.to_string()), error: Box::new(e) },
        }
    }
}

/// The longest text [`printable`] keeps.
const MAX_MESSAGE_CHARS: usize = 2000;

/// `text` safe to show in a terminal or a page: control characters escaped (`\u{1b}` for ESC,
/// so names from a file cannot set colours or titles), newlines and tabs kept, and at most
/// 2000 characters.
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(MAX_MESSAGE_CHARS));
    for (i, c) in text.chars().enumerate() {
        if i == MAX_MESSAGE_CHARS {
            out.push_str("...");
            break;
        }
        match c {
            '\n' | '\t' => out.push(c),
            c if c.is_control() => out.extend(c.escape_default()),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_files_problem_names_the_file_once() {
        let e = Error::UnsupportedVersion { format: "GGUF", version: 9 }.in_file("/m/draft.gguf");
        assert_eq!(e.to_string(), "/m/draft.gguf: unsupported GGUF version 9");
        assert_eq!(e.in_file("/other").to_string(), "/m/draft.gguf: unsupported GGUF version 9");
        let io = Error::io("/m/x.gguf", "no such file").in_file("/m/x.gguf");
        assert_eq!(io.to_string(), "i/o error on /m/x.gguf: no such file");
        let hostile = Error::corrupt("GGUF", "bad").in_file("a\u{1b}[31m.gguf");
        assert!(!hostile.to_string().contains('\u{1b}'), "{hostile}");
    }
}

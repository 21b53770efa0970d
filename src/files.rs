//! A model's files, whatever their source (the disk, a download, the browser's storage), turned
//! into a [`Checkpoint`], its [`Tokenizer`] and its chat template. JSON files are held as bytes;
//! weight files (`*.gguf`, `*.safetensors`) as [`Source`]s, of which opening reads only the
//! headers (the weights are read when the model is loaded, a batch of rows at a time). The native reader
//! ([`crate::local`]) and the wasm facade both go through [`ModelFiles::open`].
//!
//! Two layouts:
//! - one GGUF file (its metadata carries the vocabulary and `tokenizer.chat_template`);
//! - a Hugging Face folder: `config.json`, `tokenizer.json`, optional `tokenizer_config.json`
//!   (its `chat_template`), and one or more `*.safetensors` shards.

use crate::error::{Error, Result};
use crate::loader::source::{self, Source};
use crate::model::Checkpoint;
use crate::tokenizer::{ChatTemplate, Tokenizer};

/// The files of one model, by name. Each file is held once and moved into the checkpoint.
#[derive(Default)]
pub struct ModelFiles {
    files: Vec<(String, Box<dyn Source>)>,
}

/// The largest JSON file of a model read (config.json, tokenizer.json): real ones are a few MB.
pub const MAX_JSON_BYTES: u64 = 256 << 20;

/// What [`ModelFiles::open_named`] gives.
pub struct NamedFiles {
    pub config_json: Option<Vec<u8>>,
    /// The weight files, sorted by name.
    pub shards: Vec<Box<dyn Source>>,
}

/// What [`ModelFiles::open`] gives.
pub struct OpenedModel {
    pub checkpoint: Checkpoint,
    pub tokenizer: Tokenizer,
    /// The model's chat template, when it declares one.
    pub chat_template: Option<ChatTemplate>,
}

impl ModelFiles {
    pub fn new() -> ModelFiles {
        ModelFiles::default()
    }

    /// Adds a file held in memory: `*.gguf`, `config.json`, `tokenizer.json`,
    /// `tokenizer_config.json` or `*.safetensors` (other names are refused, so a typo does not
    /// pass silently).
    pub fn add(&mut self, name: &str, bytes: Vec<u8>) -> Result<()> {
        self.add_source(name, Box::new(bytes))
    }

    /// Adds a file read by ranges (see [`ModelFiles::add`] for the names); a JSON file is read
    /// whole when the files are opened, at most [`MAX_JSON_BYTES`].
    pub fn add_source(&mut self, name: &str, file: Box<dyn Source>) -> Result<()> {
        let known = name.ends_with(".gguf")
            || name.ends_with(".safetensors")
            || matches!(name, "config.json" | "tokenizer.json" | "tokenizer_config.json");
        if !known {
            return Err(Error::InvalidArgument(format!(
                "model file {name:?}: expected *.gguf, config.json, tokenizer.json, \
                 tokenizer_config.json or *.safetensors"
            )));
        }
        if self.files.iter().any(|(n, _)| n == name) {
            return Err(Error::InvalidArgument(format!("model file {name:?} given twice")));
        }
        if name.ends_with(".json") && file.len() > MAX_JSON_BYTES {
            return Err(Error::InvalidArgument(format!(
                "{name}: {} bytes (a JSON file of a model holds at most {MAX_JSON_BYTES})",
                file.len()
            )));
        }
        self.files.push((name.to_string(), file));
        Ok(())
    }

    /// Whether no file was added.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    fn take(&mut self, name: &str) -> Option<Box<dyn Source>> {
        let i = self.files.iter().position(|(n, _)| n == name)?;
        Some(self.files.swap_remove(i).1)
    }

    /// The whole of a (JSON) file.
    fn take_bytes(&mut self, name: &str) -> Result<Option<Vec<u8>>> {
        let Some(file) = self.take(name) else { return Ok(None) };
        source::read(file.as_ref(), 0, file.len(), name).map(Some)
    }

    /// Parses the files into a checkpoint, a tokenizer and the chat template.
    pub fn open(mut self) -> Result<OpenedModel> {
        let ggufs: Vec<String> =
            self.files.iter().map(|(n, _)| n.clone()).filter(|n| n.ends_with(".gguf")).collect();
        match ggufs.as_slice() {
            [name] => {
                if self.files.len() > 1 {
                    return Err(Error::InvalidArgument(
                        "a GGUF model is one file; other files were given with it".into(),
                    ));
                }
                let file = self.take(name).ok_or_else(|| Error::io(name, "missing"))?;
                let mut checkpoint = Checkpoint::from_gguf_source(file)?;
                let gguf = checkpoint.gguf().ok_or_else(|| Error::corrupt("gguf", "no header"))?;
                let tokenizer = Tokenizer::from_gguf(gguf)?;
                let chat_template = gguf
                    .get("tokenizer.chat_template")
                    .and_then(|v| v.as_str())
                    .map(|src| ChatTemplate::for_tokenizer(src, &tokenizer));
                // The tokenizer holds the vocabulary now: the header's copy (tens of MB for a
                // 151k-token vocabulary) need not stay in memory while the weights load.
                checkpoint.forget_vocabulary();
                Ok(OpenedModel { checkpoint, tokenizer, chat_template })
            }
            [] => self.open_hf(),
            _ => Err(Error::InvalidArgument(format!("several GGUF files given: {}", ggufs.join(", ")))),
        }
    }

    /// Sorts out the files of heads that draft for a model, whose tensors go by their own
    /// names: `*.safetensors` shards (Medusa's `medusa_lm_head.safetensors`, EAGLE's
    /// `model.safetensors`) and an optional `config.json`, read as bytes; see
    /// [`Checkpoint::from_named_safetensors`].
    pub fn open_named(mut self) -> Result<NamedFiles> {
        let config_json = self.take_bytes("config.json")?;
        if let Some((name, _)) = self.files.iter().find(|(n, _)| !n.ends_with(".safetensors")) {
            return Err(Error::InvalidArgument(format!(
                "{name}: heads come as *.safetensors files and an optional config.json"
            )));
        }
        self.files.sort_by(|a, b| a.0.cmp(&b.0));
        if self.files.is_empty() {
            return Err(Error::io("*.safetensors", "missing from the heads' files"));
        }
        let shards = self.files.into_iter().map(|(_, b)| b).collect();
        Ok(NamedFiles { config_json, shards })
    }

    fn open_hf(mut self) -> Result<OpenedModel> {
        let missing = |name: &str| Error::io(name, "missing from the model's files");
        let config = self.take_bytes("config.json")?.ok_or_else(|| missing("config.json"))?;
        let tokenizer_json = self.take_bytes("tokenizer.json")?.ok_or_else(|| missing("tokenizer.json"))?;
        let tokenizer_config = self.take_bytes("tokenizer_config.json")?;
        // The rest are shards; sorted by name, as the shard files are numbered.
        self.files.sort_by(|a, b| a.0.cmp(&b.0));
        if self.files.is_empty() {
            return Err(missing("*.safetensors"));
        }
        let shards = self.files.into_iter().map(|(_, b)| b).collect();
        let checkpoint = Checkpoint::from_safetensors_sources(&config, shards)?;
        let tokenizer = Tokenizer::from_json(&tokenizer_json)?;
        let chat_template = match tokenizer_config {
            Some(bytes) => {
                let v: serde_json::Value =
                    serde_json::from_slice(&bytes).map_err(|e| Error::corrupt("tokenizer_config.json", e))?;
                v.get("chat_template")
                    .and_then(|t| t.as_str())
                    .map(|src| ChatTemplate::for_tokenizer(src, &tokenizer))
            }
            None => None,
        };
        Ok(OpenedModel { checkpoint, tokenizer, chat_template })
    }
}

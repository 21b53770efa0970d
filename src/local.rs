//! Reading a model from local files (native only): a GGUF file, or a Hugging Face folder with
//! `config.json`, `tokenizer.json`, optional `tokenizer_config.json` and `*.safetensors` shards.

use std::fs;
use std::path::Path;

use crate::error::{Error, Result};
use crate::files::{ModelFiles, OpenedModel};

fn read(path: &Path) -> Result<Vec<u8>> {
    fs::read(path).map_err(|e| Error::io(path.display(), e))
}

/// Reads the model at `path` (a `.gguf` file or a Hugging Face folder).
pub fn open(path: &Path) -> Result<OpenedModel> {
    let mut files = ModelFiles::new();
    if path.is_dir() {
        let entries = fs::read_dir(path).map_err(|e| Error::io(path.display(), e))?;
        for entry in entries {
            let p = entry.map_err(|e| Error::io(path.display(), e))?.path();
            let Some(name) = p.file_name().and_then(|n| n.to_str()) else { continue };
            if name.ends_with(".safetensors")
                || matches!(name, "config.json" | "tokenizer.json" | "tokenizer_config.json")
            {
                files.add(name, read(&p)?)?;
            }
        }
    } else {
        // The name only tells the format; a GGUF file need not end in .gguf.
        files.add("model.gguf", read(path)?)?;
    }
    files.open()
}

//! Reading a model from local files (native only): a GGUF file, or a Hugging Face folder with
//! `config.json`, `tokenizer.json`, optional `tokenizer_config.json` and `*.safetensors` shards.

use std::fs;
use std::path::Path;

use crate::error::{Error, Result};
use crate::files::{ModelFiles, OpenedModel};

/// The largest JSON file (config.json, tokenizer.json) read: real ones are a few MB.
const MAX_JSON_BYTES: u64 = 256 << 20;

/// A regular file's bytes, no more than its size said when opened (a device such as /dev/zero,
/// a pipe or a file growing while read cannot make the read run forever); JSON files at most
/// [`MAX_JSON_BYTES`].
fn read(path: &Path) -> Result<Vec<u8>> {
    use std::io::Read;
    let io = |e| Error::io(path.display(), e);
    let file = fs::File::open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(Error::InvalidArgument(format!("{}: not a regular file", path.display())));
    }
    let json = path.extension().is_some_and(|e| e == "json");
    if json && meta.len() > MAX_JSON_BYTES {
        return Err(Error::InvalidArgument(format!(
            "{}: {} bytes (a JSON file of a model holds at most {MAX_JSON_BYTES})",
            path.display(),
            meta.len()
        )));
    }
    let mut bytes = Vec::new();
    file.take(meta.len()).read_to_end(&mut bytes).map_err(io)?;
    Ok(bytes)
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

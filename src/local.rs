//! Reading a model from local files (native only): a GGUF file, or a Hugging Face folder with
//! `config.json`, `tokenizer.json`, optional `tokenizer_config.json` and `*.safetensors` shards.

use std::fs;
use std::path::Path;

use crate::error::{Error, Result};
use crate::files::{ModelFiles, OpenedModel};
use crate::loader::source::LocalFile;

/// Opens the model at `path` (a `.gguf` file or a Hugging Face folder): reads its JSON files and
/// its weight files' headers; the weights are read when it is loaded.
pub fn open(path: &Path) -> Result<OpenedModel> {
    files(path, "model.gguf")?.open()
}

/// The files of heads that draft for a model (Medusa): a `.safetensors` file, or a folder with
/// `*.safetensors` and the heads' `config.json` (see [`ModelFiles::open_named`]).
pub fn heads_files(path: &Path) -> Result<ModelFiles> {
    files(path, "heads.safetensors")
}

/// A folder's model files, or the file at `path` under the name `single` (a GGUF file need not
/// end in .gguf: the name only tells the format).
fn files(path: &Path, single: &str) -> Result<ModelFiles> {
    let mut files = ModelFiles::new();
    if path.is_dir() {
        let entries = fs::read_dir(path).map_err(|e| Error::io(path.display(), e))?;
        for entry in entries {
            let p = entry.map_err(|e| Error::io(path.display(), e))?.path();
            let Some(name) = p.file_name().and_then(|n| n.to_str()) else { continue };
            if name.ends_with(".safetensors")
                || matches!(name, "config.json" | "tokenizer.json" | "tokenizer_config.json")
            {
                files.add_source(name, Box::new(LocalFile::open(&p)?))?;
            }
        }
    } else {
        files.add_source(single, Box::new(LocalFile::open(path)?))?;
    }
    Ok(files)
}

//! Loading a model and its tokenizer from local files (native only): a GGUF file, or a Hugging
//! Face folder with `config.json`, `tokenizer.json` and `*.safetensors` shards.

use std::fs;
use std::path::Path;

use crate::error::{Error, Result};
use crate::model::Checkpoint;
use crate::tokenizer::Tokenizer;

fn read(path: &Path) -> Result<Vec<u8>> {
    fs::read(path).map_err(|e| Error::io(path.display(), e))
}

/// Reads the checkpoint and tokenizer at `path` (a `.gguf` file or a Hugging Face folder).
pub fn open(path: &Path) -> Result<(Checkpoint, Tokenizer)> {
    if path.is_dir() {
        let config = read(&path.join("config.json"))?;
        let mut shards: Vec<_> = fs::read_dir(path)
            .map_err(|e| Error::io(path.display(), e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        shards.sort();
        if shards.is_empty() {
            return Err(Error::io(path.display(), "no *.safetensors files in the folder"));
        }
        let files = shards.iter().map(|p| read(p)).collect::<Result<Vec<_>>>()?;
        let ckpt = Checkpoint::from_safetensors(&config, files)?;
        let tokenizer = Tokenizer::from_json(&read(&path.join("tokenizer.json"))?)?;
        Ok((ckpt, tokenizer))
    } else {
        let ckpt = Checkpoint::from_gguf(read(path)?)?;
        let gguf = ckpt.gguf().ok_or_else(|| Error::corrupt("gguf", "no header"))?;
        let tokenizer = Tokenizer::from_gguf(gguf)?;
        Ok((ckpt, tokenizer))
    }
}

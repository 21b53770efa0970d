//! Tokenizers: tokenizer.json or a GGUF vocabulary.

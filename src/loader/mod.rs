//! File formats: bytes -> metadata + typed tensors. No GPU knowledge here.

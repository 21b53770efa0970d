//! Static files: the demo page (`www/`) at `/`, the built npm package (`pkg/`) at `/pkg/`, and
//! the model cache at `/models/` with `/models/index.json` listing the known models present.
//!
//! No page or package path resolves outside its root: the path is refused when it has `..`,
//! empty or hidden parts, and the file it names is canonicalized (symlinks followed) and must
//! still lie under the canonical root. The model cache serves model files only (the known
//! models' files, `*.gguf`, `*.safetensors`, `*.safetensors.index.json`, `config.json`,
//! `tokenizer*.json`), which may be symlinks anywhere (Hugging Face's cache is made of them), but
//! whose content must begin as such a file does (GGUF magic, a safetensors header, a JSON object).

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::fetch;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, Method};
use axum::response::{IntoResponse, Response};
use tower::ServiceExt;
use tower_http::services::ServeFile;

use super::error::ApiError;

/// Where the static files come from.
#[derive(Clone, Debug)]
pub struct Roots {
    /// The page: `index.html`, `app.js`, `style.css`.
    pub www: PathBuf,
    /// The built npm package (`./build.sh wasm`).
    pub pkg: PathBuf,
    /// Model files (`$WGSPEC_CACHE/models`).
    pub models: PathBuf,
}

/// What a request path names.
enum Target {
    File(PathBuf),
    ModelsIndex,
    NotFound,
}

/// Answers a GET or HEAD for a static file (the router's fallback): anything else is 404.
pub async fn serve(roots: Roots, req: Request) -> Response {
    let path = req.uri().path().to_string();
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return ApiError::not_found(format!("unknown route {} {}", req.method(), printable(&path)))
            .into_response();
    }
    let resolved = {
        let (roots, path) = (roots.clone(), path.clone());
        tokio::task::spawn_blocking(move || resolve(&roots, &path)).await
    };
    let target = match resolved {
        Ok(t) => t,
        Err(e) => return ApiError::internal(format!("resolving {}: {e}", printable(&path))).into_response(),
    };
    match target {
        Target::ModelsIndex => {
            let models = roots.models;
            let body = tokio::task::spawn_blocking(move || models_index(&models)).await.unwrap_or_default();
            ([(header::CONTENT_TYPE, "application/json"), (header::CACHE_CONTROL, "no-cache")], body)
                .into_response()
        }
        Target::NotFound => ApiError::not_found(format!("not found: {}", printable(&path))).into_response(),
        Target::File(file) => {
            let content_type = content_type(&path);
            match ServeFile::new(&file).oneshot(req).await {
                Ok(response) => {
                    let mut response = response.map(Body::new);
                    let headers = response.headers_mut();
                    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
                    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
                    response
                }
                Err(e) => ApiError::internal(format!("reading {}: {e}", file.display())).into_response(),
            }
        }
    }
}

fn resolve(roots: &Roots, raw: &str) -> Target {
    let Some(path) = percent_decode(raw) else { return Target::NotFound };
    let file = if path == "/models/index.json" {
        return Target::ModelsIndex;
    } else if let Some(rest) = path.strip_prefix("/pkg/") {
        confined(&roots.pkg, rest)
    } else if let Some(rest) = path.strip_prefix("/models/") {
        model_file(&roots.models, rest)
    } else if path == "/" {
        confined(&roots.www, "index.html")
    } else {
        path.strip_prefix('/').and_then(|rest| confined(&roots.www, rest))
    };
    file.map_or(Target::NotFound, Target::File)
}

/// `root/rest` when `rest` is a plain relative path: no `..`, `.`, empty or hidden parts, no
/// backslashes.
fn safe_join(root: &Path, rest: &str) -> Option<PathBuf> {
    if rest.is_empty() || rest.contains('\\') || rest.contains('\0') {
        return None;
    }
    let mut out = root.to_path_buf();
    for part in rest.split('/') {
        if part.is_empty() || part.starts_with('.') {
            return None;
        }
        out.push(part);
    }
    Some(out)
}

/// The regular file `root/rest` names, when it resolves (symlinks followed) inside `root`.
fn confined(root: &Path, rest: &str) -> Option<PathBuf> {
    let root = root.canonicalize().ok()?;
    let file = safe_join(&root, rest)?.canonicalize().ok()?;
    (file.starts_with(&root) && file.is_file()).then_some(file)
}

/// Whether a file name is one a model folder holds.
fn is_model_file_name(name: &str) -> bool {
    fetch::KNOWN_MODELS.iter().any(|m| m.file == name)
        || name.ends_with(".gguf")
        || name.ends_with(".safetensors")
        || name.ends_with(".safetensors.index.json")
        || name == "config.json"
        || (name.starts_with("tokenizer") && name.ends_with(".json"))
}

/// The model file `root/rest` names: a model file name, a regular file (possibly through
/// symlinks, wherever they lead) whose first bytes are those of its format.
fn model_file(root: &Path, rest: &str) -> Option<PathBuf> {
    let joined = safe_join(root, rest)?;
    let name = joined.file_name()?.to_str()?;
    if !is_model_file_name(name) {
        return None;
    }
    let name = name.to_string();
    let file = joined.canonicalize().ok()?;
    if !file.is_file() {
        return None;
    }
    let mut head = [0u8; 64];
    let n = std::fs::File::open(&file).and_then(|mut f| read_up_to(&mut f, &mut head)).ok()?;
    looks_like(&name, &head[..n]).then_some(file)
}

fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Whether `head` (a file's first bytes) begins as a file called `name` must.
fn looks_like(name: &str, head: &[u8]) -> bool {
    if name.ends_with(".gguf") {
        head.starts_with(b"GGUF")
    } else if name.ends_with(".safetensors") {
        // An 8-byte little-endian header length, then the JSON header.
        head.len() > 8 && head[8] == b'{'
    } else if name.ends_with(".json") {
        let text = head.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(head);
        text.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{')
    } else {
        // A known model's file under its exact name: the known files are all GGUF.
        head.starts_with(b"GGUF")
    }
}

/// The known models present in the cache, as `[{name, url, bytes}]`.
fn models_index(dir: &Path) -> String {
    let list: Vec<_> = fetch::KNOWN_MODELS
        .iter()
        .filter(|m| dir.join(m.file).is_file())
        .map(
            |m| serde_json::json!({ "name": m.name, "url": format!("/models/{}", m.file), "bytes": m.bytes }),
        )
        .collect();
    serde_json::Value::from(list).to_string()
}

fn content_type(path: &str) -> &'static str {
    let ext = path.rsplit_once('.').map_or("", |(_, e)| e);
    match ext {
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "json" => "application/json",
        "wasm" => "application/wasm",
        "ts" | "md" | "txt" => "text/plain; charset=utf-8",
        "png" => "image/png",
        "svg" => "image/svg+xml",
        _ if path.ends_with('/') => "text/html; charset=utf-8",
        _ => "application/octet-stream",
    }
}

/// `%XX` escapes decoded; `None` for a bad escape or a path that is not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A request path for an error message: control characters escaped, at most 200 characters.
fn printable(path: &str) -> String {
    path.chars().take(200).flat_map(char::escape_default).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_join_refuses_escapes() {
        let root = Path::new("/srv");
        assert_eq!(safe_join(root, "a/b.js"), Some(PathBuf::from("/srv/a/b.js")));
        for bad in ["", "../etc/passwd", "a/../../x", "/etc/passwd", "a//b", "a\\..\\b", "./x", ".git/config"]
        {
            assert_eq!(safe_join(root, bad), None, "{bad:?}");
        }
    }

    #[test]
    fn model_files_are_recognised_by_name_and_first_bytes() {
        for name in
            ["m.gguf", "model.safetensors", "model.safetensors.index.json", "config.json", "tokenizer.json"]
        {
            assert!(is_model_file_name(name), "{name}");
        }
        for name in ["passwd", "id_rsa", "notes.txt", "x.json"] {
            assert!(!is_model_file_name(name), "{name}");
        }
        assert!(looks_like("a.gguf", b"GGUF\x03\0\0\0"));
        assert!(!looks_like("a.gguf", b"root:x:0:0"));
        assert!(looks_like("model.safetensors", b"\x10\0\0\0\0\0\0\0{\"a\""));
        assert!(!looks_like("model.safetensors", b"root:x:0:0:root"));
        assert!(looks_like("config.json", b"\xEF\xBB\xBF \n{\"a\": 1}"));
        assert!(!looks_like("config.json", b"root:x:0:0"));
    }

    #[test]
    fn percent_escapes_decode_or_refuse() {
        assert_eq!(percent_decode("/pkg/a%20b.js").as_deref(), Some("/pkg/a b.js"));
        assert_eq!(percent_decode("/%2e%2e/x").as_deref(), Some("/../x"));
        assert_eq!(percent_decode("/%zz"), None);
        assert_eq!(percent_decode("/%ff"), None);
    }
}

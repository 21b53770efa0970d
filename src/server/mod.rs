//! Native HTTP serving (std only, one thread per connection, HTTP/1.1 with `Connection: close`).
//!
//! [`serve_demo`] serves the browser demo on 127.0.0.1: the page (`www/`) at `/`, the built npm
//! package (`pkg/`) at `/pkg/`, and the local model cache at `/models/` with `/models/index.json`
//! listing the known models present, so the page loads real models without any download from
//! the internet.

mod http;

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::fetch;
pub use http::{read_request, Request};

/// Where the demo's files come from.
#[derive(Clone, Debug)]
pub struct DemoRoots {
    /// The page: `index.html`, `app.js`, `style.css`.
    pub www: PathBuf,
    /// The built npm package (`./build.sh wasm`).
    pub pkg: PathBuf,
    /// Model files (`$WGSPEC_CACHE/models`).
    pub models: PathBuf,
}

/// Binds 127.0.0.1:`port` (0 = any free port), reports the address through `ready`, and serves
/// the demo until the process ends.
pub fn serve_demo(port: u16, roots: DemoRoots, ready: impl FnOnce(u16)) -> Result<()> {
    let listener =
        TcpListener::bind(("127.0.0.1", port)).map_err(|e| Error::io(format!("127.0.0.1:{port}"), e))?;
    let port = listener.local_addr().map_err(|e| Error::io("listener", e))?.port();
    ready(port);
    for conn in listener.incoming() {
        let Ok(stream) = conn else { continue };
        let roots = roots.clone();
        std::thread::spawn(move || {
            if let Err(e) = handle(stream, &roots) {
                log::debug!("connection: {e}");
            }
        });
    }
    Ok(())
}

fn handle(mut stream: TcpStream, roots: &DemoRoots) -> io::Result<()> {
    // Buffered: the head is read byte by byte up to its blank line (no body is read).
    let req = match read_request(&mut io::BufReader::new(&stream)) {
        Ok(r) => r,
        Err(e) => return http::respond(&mut stream, 400, "text/plain", e.to_string().as_bytes(), false),
    };
    let head = req.method == "HEAD";
    if req.method != "GET" && !head {
        return http::respond(&mut stream, 405, "text/plain", b"only GET and HEAD", false);
    }
    let path = req.path.as_str();
    if path == "/models/index.json" {
        let body = models_index(&roots.models);
        return http::respond(&mut stream, 200, "application/json", body.as_bytes(), head);
    }
    let file = if let Some(rest) = path.strip_prefix("/pkg/") {
        safe_join(&roots.pkg, rest)
    } else if let Some(rest) = path.strip_prefix("/models/") {
        safe_join(&roots.models, rest)
    } else if path == "/" {
        Some(roots.www.join("index.html"))
    } else {
        safe_join(&roots.www, &path[1..])
    };
    match file.filter(|f| f.is_file()) {
        Some(f) => send_file(&mut stream, &f, head),
        None => http::respond(&mut stream, 404, "text/plain", format!("not found: {path}").as_bytes(), head),
    }
}

/// `root/rest` when `rest` is a plain relative path (no `..`, no absolute parts, no backslashes).
fn safe_join(root: &Path, rest: &str) -> Option<PathBuf> {
    if rest.is_empty() || rest.contains('\\') {
        return None;
    }
    let mut out = root.to_path_buf();
    for part in rest.split('/') {
        if part.is_empty() || part == "." || part == ".." {
            return None;
        }
        out.push(part);
    }
    Some(out)
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

fn content_type(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()).unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "json" => "application/json",
        "wasm" => "application/wasm",
        "ts" => "text/plain; charset=utf-8",
        "png" => "image/png",
        "svg" => "image/svg+xml",
        "md" | "txt" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

fn send_file(stream: &mut TcpStream, path: &Path, head: bool) -> io::Result<()> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    let mut out = BufWriter::with_capacity(1 << 20, stream);
    http::write_head(&mut out, 200, content_type(path), len)?;
    if !head {
        io::copy(&mut file, &mut out)?;
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_join_refuses_escapes() {
        let root = Path::new("/srv");
        assert_eq!(safe_join(root, "a/b.js"), Some(PathBuf::from("/srv/a/b.js")));
        for bad in ["", "../etc/passwd", "a/../../x", "/etc/passwd", "a//b", "a\\..\\b", "./x"] {
            assert_eq!(safe_join(root, bad), None, "{bad:?}");
        }
    }
}

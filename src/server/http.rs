//! The HTTP/1.1 subset the demo server needs: read a request head, write a response.

use std::io::{self, Read, Write};

/// The largest request head accepted.
const MAX_HEAD: usize = 16 * 1024;

/// A parsed request line (headers are read and ignored; bodies are not read).
#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    /// The path, percent-decoded, without the query string.
    pub path: String,
}

fn bad(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

/// Reads one request head (up to the blank line) from `r`.
pub fn read_request(r: &mut impl Read) -> io::Result<Request> {
    let mut head = Vec::with_capacity(1024);
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && !head.ends_with(b"\n\n") {
        if head.len() >= MAX_HEAD {
            return Err(bad("request head too large"));
        }
        if r.read(&mut byte)? == 0 {
            return Err(bad("connection closed inside the request head"));
        }
        head.push(byte[0]);
    }
    let text = std::str::from_utf8(&head).map_err(|_| bad("request head is not UTF-8"))?;
    let line = text.lines().next().unwrap_or("");
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(bad("malformed request line"));
    };
    if !version.starts_with("HTTP/1.") || !target.starts_with('/') {
        return Err(bad("malformed request line"));
    }
    let raw_path = target.split(['?', '#']).next().unwrap_or("/");
    Ok(Request { method: method.to_string(), path: percent_decode(raw_path)? })
}

fn percent_decode(s: &str) -> io::Result<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3).ok_or_else(|| bad("bad percent escape"))?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| bad("bad percent escape"))?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| bad("path is not UTF-8"))
}

/// Writes a status line and headers for a body of `len` bytes.
pub fn write_head(w: &mut impl Write, status: u16, content_type: &str, len: u64) -> io::Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Error",
    };
    write!(
        w,
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {len}\r\n\
         Cache-Control: no-cache\r\nConnection: close\r\n\r\n"
    )
}

/// Writes a whole response (the body only when `!head_only`).
pub fn respond(
    w: &mut impl Write,
    status: u16,
    content_type: &str,
    body: &[u8],
    head_only: bool,
) -> io::Result<()> {
    write_head(w, status, content_type, body.len() as u64)?;
    if !head_only {
        w.write_all(body)?;
    }
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_request_lines() {
        let mut r: &[u8] = b"GET /pkg/a%20b.js?x=1 HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_eq!(
            read_request(&mut r).ok(),
            Some(Request { method: "GET".into(), path: "/pkg/a b.js".into() })
        );
        for bad in [
            &b"GET\r\n\r\n"[..],
            b"GET x HTTP/1.1\r\n\r\n",
            b"GET /%zz HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\n",
        ] {
            let mut r = bad;
            assert!(read_request(&mut r).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }
}

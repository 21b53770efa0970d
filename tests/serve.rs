//! `wgspec serve` and `wgspec web` end to end: the real binary on a free loopback port with tiny
//! models written as GGUF, spoken to over plain HTTP/1.1 (std sockets, every read with a timeout).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Barrier};
use std::time::{Duration, Instant};

use common::rng;
use common::tiny::{TinyModel, TinySpec};
use serde_json::{json, Value};
use wgspec::loader::gguf::Value as GgufValue;
use wgspec::loader::DType;

/// The tiny model's chat template: a line per message, then the assistant's turn.
const TEMPLATE: &str =
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}";
/// No answer may take longer (the tiny models answer in milliseconds).
const IO_TIMEOUT: Duration = Duration::from_secs(60);

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("wgspec-serve-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// A tiny llama with a chat template (`context` positions) written as Q8_0 GGUF into `dir`.
/// Without `eos`, its end-of-sequence id lies outside the vocabulary (ignored, with a warning), so
/// that generations run to `max_tokens`.
fn tiny_model(dir: &Path, context: usize, eos: bool) -> PathBuf {
    let mut r = rng(95);
    let tiny = TinyModel::random(TinySpec { context, ..TinySpec::llama() }, &mut r);
    let mut meta = vec![("tokenizer.chat_template", GgufValue::String(TEMPLATE.into()))];
    if !eos {
        meta.push(("tokenizer.ggml.eos_token_id", GgufValue::U32(u32::MAX)));
    }
    let path = dir.join("tiny.gguf");
    std::fs::write(&path, tiny.to_gguf_with(DType::Q8_0, &mut r, &meta)).expect("write model");
    path
}

/// `wgspec serve` on a tiny model of `context` positions (with an end-of-sequence token) written
/// into a fresh folder `name`, with `args` added.
fn serve_tiny(name: &str, context: usize, args: &[&str]) -> Server {
    let dir = temp_dir(name);
    let model = tiny_model(&dir, context, true);
    let m = model.to_str().expect("utf8 path");
    let mut all = vec!["serve", "--model", m];
    all.extend_from_slice(args);
    Server::start(&all, &[], dir.join("server.log"))
}

/// A running `wgspec` server, killed when dropped.
struct Server {
    child: Child,
    addr: String,
    log: PathBuf,
}

impl Server {
    /// Starts `wgspec ARGS --port 0`, reads the address from its first line, and (with a model)
    /// waits for readiness.
    fn start(args: &[&str], env: &[(&str, &Path)], log: PathBuf) -> Server {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_wgspec"));
        cmd.args(args).args(["--port", "0"]).env("XDG_RUNTIME_DIR", std::env::temp_dir());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let stderr = std::fs::File::create(&log).expect("log file");
        let mut child = cmd.stdout(Stdio::piped()).stderr(stderr).spawn().expect("start wgspec");
        let mut stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = Vec::new();
            let mut byte = [0u8];
            while stdout.read(&mut byte).is_ok_and(|n| n == 1) && byte[0] != b'\n' {
                line.push(byte[0]);
            }
            let _ = tx.send(String::from_utf8_lossy(&line).into_owned());
            // Keep reading so that the server never blocks on a full pipe.
            let _ = std::io::copy(&mut stdout, &mut std::io::sink());
        });
        let line = rx.recv_timeout(IO_TIMEOUT).expect("the server printed its address");
        let addr =
            line.strip_prefix("listening on http://").unwrap_or_else(|| panic!("first line: {line:?}"));
        let server = Server { child, addr: addr.to_string(), log };
        if args[0] == "serve" {
            let deadline = Instant::now() + IO_TIMEOUT;
            while server.get("/ready").status != 200 {
                assert!(Instant::now() < deadline, "not ready in time: {}", server.log());
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        server
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(&self.addr).expect("connect");
        s.set_read_timeout(Some(IO_TIMEOUT)).expect("timeout");
        s.set_write_timeout(Some(IO_TIMEOUT)).expect("timeout");
        s
    }

    fn request(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Reply {
        let mut s = self.connect();
        let mut head = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
        let given = |name: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(name));
        if !given("host") {
            head += "Host: 127.0.0.1\r\n";
        }
        if !given("content-length") {
            head += &format!("Content-Length: {}\r\n", body.len());
        }
        for (k, v) in headers {
            head += &format!("{k}: {v}\r\n");
        }
        head += "\r\n";
        s.write_all(head.as_bytes()).expect("send head");
        s.write_all(body).expect("send body");
        read_reply(&mut s)
    }

    /// Sends `bytes` as they are, from a thread (so that an answer sent before they are all
    /// read is read at once), and reads the answer. `unparsed`: the head cannot be parsed, and
    /// the thread closes its half (which ends the server's lingering close at once); a request
    /// that a handler reads must ask for `Connection: close` instead, as a closed half is a
    /// client that left.
    fn raw(&self, bytes: Vec<u8>, unparsed: bool) -> Reply {
        let mut s = self.connect();
        let mut writer = s.try_clone().expect("clone");
        let sender = std::thread::spawn(move || {
            // The server may answer and stop reading before the end.
            let _ = writer.write_all(&bytes);
            if unparsed {
                let _ = writer.shutdown(std::net::Shutdown::Write);
            }
        });
        let reply = read_reply(&mut s);
        let _ = sender.join();
        reply
    }

    /// The process's resident memory now and at its peak (`VmRSS`, `VmHWM`), in bytes.
    fn memory(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("status");
        let kib = |key: &str| {
            let line = status.lines().find(|l| l.starts_with(key)).unwrap_or_else(|| panic!("{key}"));
            let n: u64 = line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).expect("kB");
            n << 10
        };
        (kib("VmRSS:"), kib("VmHWM:"))
    }

    /// A normal request is answered normally.
    fn still_answers(&self) {
        let v = completion(self, json!({"prompt": "ab", "max_tokens": 2, "temperature": 0}));
        assert_eq!(v["usage"]["completion_tokens"], 2, "{v}");
    }

    fn get(&self, path: &str) -> Reply {
        self.request("GET", path, &[], b"")
    }

    fn post(&self, path: &str, body: &Value) -> Reply {
        self.request("POST", path, &[("Content-Type", "application/json")], body.to_string().as_bytes())
    }

    /// `wgspec_requests_total{route, status}` from `/metrics`.
    fn requests_counted(&self, route: &str, status: u16) -> u64 {
        let metrics = self.get("/metrics").text();
        let key = format!("wgspec_requests_total{{route=\"{route}\",status=\"{status}\"}} ");
        metrics.lines().find_map(|l| l.strip_prefix(&key)).map_or(0, |n| n.parse().expect("count"))
    }

    fn metric(&self, name: &str) -> f64 {
        let metrics = self.get("/metrics").text();
        let key = format!("{name} ");
        metrics.lines().find_map(|l| l.strip_prefix(&key)).map_or(0.0, |n| n.parse().expect("value"))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Reply {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// The server-sent events' data, in order.
    fn events(&self) -> Vec<String> {
        let text = self.text();
        assert!(text.ends_with("\n\n"), "events end with a blank line: {text:?}");
        text.split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                e.strip_prefix("data: ").unwrap_or_else(|| panic!("not a data event: {e:?}")).to_string()
            })
            .collect()
    }
}

/// Reads a whole `Connection: close` response, undoing chunked transfer encoding.
fn read_reply(s: &mut TcpStream) -> Reply {
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read the response");
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a response head");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|c| c.parse().ok()).expect("status");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked =
        headers.iter().any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    if chunked {
        body = dechunk(&body);
    }
    Reply { status, headers, body }
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = data.windows(2).position(|w| w == b"\r\n").expect("chunk size line");
        let size_text = String::from_utf8_lossy(&data[..line_end]).into_owned();
        let size =
            usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16).expect("chunk size");
        data = &data[line_end + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

/// Asserts OpenAI's error shape with `status` and `code` ("": any); returns the error object.
fn check_error(r: &Reply, status: u16, code: &str, what: &str) -> Value {
    assert_eq!(r.status, status, "{what}: {}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"), "{what}");
    let e = r.json()["error"].clone();
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{what}: {e}");
    assert!(e["type"].is_string() && e.get("param").is_some(), "{what}: {e}");
    if !code.is_empty() {
        assert_eq!(e["code"], code, "{what}: {e}");
    }
    e
}

/// Checks a stream against OpenAI's rules; returns the text, the number of tokens flagged, and
/// the stats of the last chunk.
fn check_stream(reply: &Reply, chat: bool, include_usage: bool) -> (String, usize, Value) {
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.header("content-type"), Some("text/event-stream"));
    let events = reply.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "ends with [DONE]");
    let chunks: Vec<Value> =
        events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).expect("chunk JSON")).collect();
    let id = chunks[0]["id"].as_str().expect("id").to_string();
    assert!(id.starts_with(if chat { "chatcmpl-" } else { "cmpl-" }), "{id}");
    let object = if chat { "chat.completion.chunk" } else { "text_completion" };
    let (with_choices, after): (Vec<&Value>, Vec<&Value>) =
        chunks.iter().partition(|c| c["choices"].as_array().is_some_and(|a| !a.is_empty()));
    let mut text = String::new();
    let mut flagged = 0;
    for (i, c) in with_choices.iter().enumerate() {
        assert_eq!(c["id"], id.as_str(), "every chunk has the same id");
        assert_eq!(c["object"], object);
        assert_eq!(c["model"], "tiny");
        assert!(c["created"].is_u64());
        let choice = &c["choices"][0];
        assert_eq!(choice["index"], 0);
        let last = i + 1 == with_choices.len();
        assert_eq!(choice["finish_reason"].is_string(), last, "finish_reason in the last chunk only: {c}");
        if chat {
            assert_eq!(
                choice["delta"].get("role").is_some(),
                i == 0,
                "the role in the first delta only: {c}"
            );
            text += choice["delta"]["content"].as_str().unwrap_or("");
        } else {
            text += choice["text"].as_str().expect("text");
        }
        flagged += c["wgspec"]["from_draft"].as_array().expect("from_draft in every chunk").len();
        assert_eq!(c.get("usage").is_some(), include_usage, "usage: null in chunks when asked: {c}");
    }
    let stats = with_choices.last().expect("a last chunk")["wgspec"].clone();
    if include_usage {
        assert_eq!(after.len(), 1, "one usage chunk after the last");
        let usage = &after[0]["usage"];
        assert_eq!(chunks.last().map(|c| &c["usage"]), Some(usage), "the usage chunk comes last");
        assert_eq!(usage["completion_tokens"].as_u64(), Some(flagged as u64));
        let sum = usage["prompt_tokens"].as_u64().expect("prompt")
            + usage["completion_tokens"].as_u64().expect("n");
        assert_eq!(usage["total_tokens"].as_u64(), Some(sum));
    } else {
        assert!(after.is_empty(), "no chunk without choices unless usage is asked");
    }
    (text, flagged, stats)
}

/// Completions of `bodies` sent at once, each from its own client thread: their answers, in order
/// (each a 200).
fn at_once(server: &Arc<Server>, bodies: Vec<Value>) -> Vec<Value> {
    let handles: Vec<_> = (bodies.into_iter())
        .map(|body| {
            let server = server.clone();
            std::thread::spawn(move || server.post("/v1/completions", &body))
        })
        .collect();
    (handles.into_iter())
        .map(|h| {
            let r = h.join().expect("client");
            assert_eq!(r.status, 200, "{}", r.text());
            r.json()
        })
        .collect()
}

fn completion(server: &Server, body: Value) -> Value {
    let r = server.post("/v1/completions", &body);
    assert_eq!(r.status, 200, "{body}: {}", r.text());
    r.json()
}

#[test]
fn the_api_answers_as_openai_does_and_matches_the_cli() {
    let dir = temp_dir("api");
    let model = tiny_model(&dir, 64, true);
    let m = model.to_str().expect("utf8 path");
    let server = Server::start(&["serve", "--model", m], &[], dir.join("server.log"));
    let prompt = "hello world";

    // Completions, greedy: the CLI's text and token count.
    let v =
        completion(&server, json!({"model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 0}));
    assert!(v["id"].as_str().is_some_and(|id| id.starts_with("cmpl-")), "{v}");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["model"], "tiny");
    let greedy = v["choices"][0]["text"].as_str().expect("text").to_string();
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": prompt.len(), "completion_tokens": 12, "total_tokens": prompt.len() + 12,
               "prompt_tokens_details": {"cached_tokens": 0}})
    );
    assert_eq!(v["wgspec"]["draft"], "none");
    assert_eq!(v["wgspec"]["tokens_per_target_forward"], 1.0);
    let cli = Command::new(env!("CARGO_BIN_EXE_wgspec"))
        .args(["generate", "--model", m, "--prompt", prompt, "--max-tokens", "12", "--json"])
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .output()
        .expect("run wgspec generate");
    assert!(cli.status.success(), "{}", String::from_utf8_lossy(&cli.stderr));
    let cli: Value = serde_json::from_slice(&cli.stdout).expect("generate --json");
    assert_eq!(cli["text"].as_str(), Some(greedy.as_str()), "greedy text equals the CLI's");
    assert_eq!(cli["tokens"].as_array().map(Vec::len), Some(12));

    // N-gram speculation gives the same text, with its stats.
    let v = completion(
        &server,
        json!({"prompt": prompt, "max_tokens": 12, "temperature": 0, "draft": "ngram", "draft_k": 3}),
    );
    assert_eq!(v["choices"][0]["text"].as_str(), Some(greedy.as_str()), "speculation output equals plain");
    let stats = &v["wgspec"];
    assert_eq!(stats["draft"], "ngram");
    for key in
        ["drafted", "accepted", "acceptance_rate", "tokens_per_target_forward", "mean_k", "decode_seconds"]
    {
        assert!(stats[key].is_number(), "wgspec.{key} in {stats}");
    }
    assert!(stats["accepted"].as_u64() <= stats["drafted"].as_u64());
    assert_eq!(stats["from_draft"].as_array().map(Vec::len), Some(12));

    // A stop string: the text ends before its first occurrence.
    let (at, stop) = greedy
        .char_indices()
        .skip(1)
        .find(|(_, c)| c.is_ascii_alphanumeric())
        .map(|(i, c)| (greedy.find(c).unwrap_or(i), c.to_string()))
        .expect("an ASCII letter or digit in the greedy text");
    assert!(at > 0, "the stop string {stop:?} must not begin the text {greedy:?}");
    let v =
        completion(&server, json!({"prompt": prompt, "max_tokens": 12, "temperature": 0, "stop": [stop]}));
    assert_eq!(v["choices"][0]["text"].as_str(), Some(&greedy[..at]), "stop {stop:?} in {greedy:?}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    // Seeded sampling is reproducible.
    let sampled =
        json!({"prompt": "abc", "max_tokens": 10, "temperature": 1.5, "top_k": 50, "top_p": 0.9, "seed": 7});
    let (a, b) = (completion(&server, sampled.clone()), completion(&server, sampled));
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"], "same seed, same text");

    // Streaming completions: chunk by chunk, with usage; the text equals the whole answer's.
    let body = json!({"prompt": prompt, "max_tokens": 12, "temperature": 0, "stream": true, "stream_options": {"include_usage": true}});
    let (text, flagged, stats) = check_stream(&server.post("/v1/completions", &body), false, true);
    assert_eq!((text.as_str(), flagged), (greedy.as_str(), 12));
    assert_eq!(stats["draft"], "none");

    // Chat, whole and streamed (no usage asked), under the model's template.
    let chat = json!({"model": "tiny", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0});
    let r = server.post("/v1/chat/completions", &chat);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert!(v["id"].as_str().is_some_and(|id| id.starts_with("chatcmpl-")), "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    let reply = v["choices"][0]["message"]["content"].as_str().expect("content").to_string();
    let rendered = "<system>be brief\n<user>hi\n<assistant>";
    assert_eq!(
        v["usage"]["prompt_tokens"].as_u64(),
        Some(rendered.len() as u64),
        "the template's prompt, byte tokens"
    );
    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    let (text, flagged, _) = check_stream(&server.post("/v1/chat/completions", &streamed), true, false);
    assert_eq!(text, reply);
    assert_eq!(flagged as u64, v["usage"]["completion_tokens"].as_u64().expect("completion tokens"));

    // vLLM's `ignore_eos` runs to max_tokens.
    let v = completion(
        &server,
        json!({"prompt": prompt, "max_tokens": 40, "temperature": 0, "ignore_eos": true, "draft": "ngram"}),
    );
    assert_eq!(
        (&v["usage"]["completion_tokens"], &v["choices"][0]["finish_reason"]),
        (&json!(40), &json!("length")),
        "{v}"
    );

    // Tokenize / detokenize round trip, the model list, health, the page.
    let t = server.post("/tokenize", &json!({"content": "héllo"}));
    assert_eq!(t.status, 200, "{}", t.text());
    let tokens = t.json()["tokens"].clone();
    assert_eq!(tokens.as_array().map(Vec::len), Some("héllo".len()), "one byte token per byte");
    let d = server.post("/detokenize", &json!({"tokens": tokens}));
    assert_eq!(d.json(), json!({"content": "héllo"}));
    let models = server.get("/v1/models").json();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "tiny");
    assert_eq!(models["data"][0]["object"], "model");
    // One model by any name a request's `model` may give (the --model path has slashes).
    for name in ["tiny", m] {
        let one = server.get(&format!("/v1/models/{name}"));
        assert_eq!(one.status, 200, "{name}: {}", one.text());
        assert_eq!(one.json(), models["data"][0], "{name}");
    }
    let e = check_error(&server.get("/v1/models/gpt-4o"), 404, "model_not_found", "another model");
    assert!(e["message"].as_str().is_some_and(|m| m.contains("`tiny`")), "{e}");
    check_error(&server.get("/v1/models/%FF"), 400, "", "a name that is not UTF-8");
    assert_eq!(server.get("/health").status, 200);
    let page = server.get("/");
    assert_eq!((page.status, page.header("content-type")), (200, Some("text/html; charset=utf-8")));

    // SIGTERM during a stream: the stream ends whole, the server exits 0.
    let mut s = server.connect();
    let body = json!({"prompt": prompt, "max_tokens": 40, "temperature": 0, "stream": true}).to_string();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(head.as_bytes()).expect("send");
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("data: ") {
        let n = s.read(&mut buf).expect("the stream began");
        assert!(n > 0, "the stream ended before its first event");
        seen.extend_from_slice(&buf[..n]);
    }
    let mut server = server;
    let term =
        Command::new("kill").args(["-TERM", &server.child.id().to_string()]).status().expect("kill -TERM");
    assert!(term.success());
    s.read_to_end(&mut seen).expect("the rest of the stream");
    let seen = String::from_utf8_lossy(&seen);
    assert!(
        seen.contains("\"finish_reason\":\"length\"") && seen.contains("data: [DONE]"),
        "the stream finished after SIGTERM: {seen:?}"
    );
    let deadline = Instant::now() + IO_TIMEOUT;
    let status = loop {
        if let Some(status) = server.child.try_wait().expect("wait") {
            break status;
        }
        assert!(Instant::now() < deadline, "the server did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "exit status {status:?}: {}", server.log());
}

/// (method, path, an extra header, body, the status, the error's `param` or `code`: "" for any)
type BadCase<'a> = (&'a str, &'a str, Option<(&'a str, &'a str)>, String, u16, &'a str);

#[test]
fn bad_requests_get_openai_errors_and_the_server_stays_up() {
    let server = serve_tiny("errors", 64, &["--api-key", "sk-test"]);
    let auth = ("Authorization", "Bearer sk-test");
    let long_prompt = "x".repeat(80);
    let cases: Vec<BadCase> = vec![
        ("POST", "/v1/completions", Some(auth), "{".into(), 400, "invalid_json"),
        ("POST", "/v1/completions", Some(auth), "[1]".into(), 400, "invalid_json"),
        ("POST", "/v1/completions", Some(auth), r#"{"max_tokens": 3}"#.into(), 400, "prompt"),
        ("POST", "/v1/chat/completions", Some(auth), r#"{"prompt": "a"}"#.into(), 400, "prompt"),
        ("POST", "/v1/chat/completions", Some(auth), r#"{"messages": "hi"}"#.into(), 400, "messages"),
        (
            "POST",
            "/v1/chat/completions",
            Some(auth),
            r#"{"messages": [{"role": "user", "content": "a"}], "logprobs": true}"#.into(),
            400,
            "logprobs",
        ),
        (
            "POST",
            "/v1/completions",
            Some(auth),
            r#"{"prompt": "a", "temperature": "hot"}"#.into(),
            400,
            "temperature",
        ),
        (
            "POST",
            "/v1/completions",
            Some(auth),
            r#"{"prompt": "a", "temperature": -0.5}"#.into(),
            400,
            "temperature",
        ),
        ("POST", "/v1/completions", Some(auth), r#"{"prompt": "a", "top_p": 1.5}"#.into(), 400, "top_p"),
        (
            "POST",
            "/v1/completions",
            Some(auth),
            r#"{"prompt": "a", "max_tokens": 0}"#.into(),
            400,
            "max_tokens",
        ),
        ("POST", "/v1/completions", Some(auth), r#"{"prompt": "a", "n": 9}"#.into(), 400, "n"),
        (
            "POST",
            "/v1/completions",
            Some(auth),
            r#"{"prompt": "a", "presence_penalty": 1}"#.into(),
            400,
            "presence_penalty",
        ),
        ("POST", "/v1/completions", Some(auth), r#"{"prompt": "a", "stream": "yes"}"#.into(), 400, "stream"),
        ("POST", "/v1/completions", Some(auth), r#"{"prompt": "a", "draft": "model"}"#.into(), 400, "draft"),
        (
            "POST",
            "/v1/completions",
            Some(auth),
            r#"{"prompt": "a", "model": "gpt-4"}"#.into(),
            404,
            "model_not_found",
        ),
        (
            "POST",
            "/v1/completions",
            Some(auth),
            format!(r#"{{"prompt": "{long_prompt}"}}"#),
            400,
            "context_length_exceeded",
        ),
        (
            "POST",
            "/v1/completions",
            Some(auth),
            r#"{"prompt": "ab", "max_tokens": 63}"#.into(),
            400,
            "max_tokens",
        ),
        ("POST", "/v1/completions", None, r#"{"prompt": "a"}"#.into(), 401, "invalid_api_key"),
        (
            "POST",
            "/v1/completions",
            Some(("Authorization", "Bearer nope")),
            r#"{"prompt": "a"}"#.into(),
            401,
            "invalid_api_key",
        ),
        (
            "POST",
            "/v1/completions",
            Some(("Host", "attacker.example:8080")),
            r#"{"prompt": "a"}"#.into(),
            403,
            "host_not_allowed",
        ),
        ("GET", "/v1/chat/completions", Some(auth), String::new(), 405, "method_not_allowed"),
        ("GET", "/v1/nothing", Some(auth), String::new(), 404, ""),
        ("POST", "/tokenize", Some(auth), r#"{"content": 5}"#.into(), 400, "content"),
        ("POST", "/detokenize", Some(auth), r#"{"tokens": [99999]}"#.into(), 400, ""),
        (
            "POST",
            "/detokenize",
            Some(auth),
            json!({"tokens": vec![1; 65]}).to_string(),
            400,
            "context_length_exceeded",
        ),
    ];
    for (method, path, header, body, status, expected) in &cases {
        let headers: Vec<(&str, &str)> = header.iter().copied().collect();
        let r = server.request(method, path, &headers, body.as_bytes());
        let what = format!("{method} {path} {body:.60}");
        assert_eq!(r.status, *status, "{what}: {}", r.text());
        let e = &r.json()["error"];
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{what}: {e}");
        assert!(e["type"].is_string(), "{what}: {e}");
        assert!(e.get("param").is_some() && e.get("code").is_some(), "{what}: {e}");
        if !expected.is_empty() {
            assert!(
                e["param"] == *expected || e["code"] == *expected,
                "{what}: param or code {expected:?} in {e}"
            );
        }
    }

    // A body over 8 MiB: 413, whether its length is declared or it comes in chunks.
    let r = server.request("POST", "/v1/completions", &[auth, ("Content-Length", "9000000")], b"");
    assert_eq!(r.status, 413, "{}", r.text());
    let mut s = server.connect();
    let head = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer sk-test\r\n\
                Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
    s.write_all(head.as_bytes()).expect("head");
    let mut writer = s.try_clone().expect("clone");
    let sender = std::thread::spawn(move || {
        let chunk = vec![b' '; 1 << 20];
        for _ in 0..10 {
            // The server may close as soon as it has answered.
            if writer.write_all(format!("{:x}\r\n", chunk.len()).as_bytes()).is_err()
                || writer.write_all(&chunk).is_err()
                || writer.write_all(b"\r\n").is_err()
            {
                return;
            }
        }
        let _ = writer.write_all(b"0\r\n\r\n");
    });
    let r = read_reply(&mut s);
    assert_eq!(r.status, 413, "{}", r.text());
    let _ = sender.join();

    // Health and metrics need no key; the server still answers correctly.
    assert_eq!(server.get("/health").status, 200);
    assert_eq!(server.get("/metrics").status, 200);
    let body = json!({"prompt": "ab", "max_tokens": 3, "temperature": 0});
    let r = server.request("POST", "/v1/completions", &[auth], body.to_string().as_bytes());
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["usage"]["completion_tokens"], 3);
    assert!(server.requests_counted("/v1/completions", 401) >= 2);
    assert!(server.metric("wgspec_errors_total{kind=\"invalid_request_error\"}") >= 20.0);
}

#[test]
fn a_full_queue_answers_429_and_a_client_that_leaves_frees_the_worker() {
    let dir = temp_dir("load");
    // A long context and no end-of-sequence token: an abandoned stream could run for a minute.
    let context = 32768;
    let model = tiny_model(&dir, context, false);
    let m = model.to_str().expect("utf8 path");
    let context_arg = context.to_string();
    // (two requests served together at most: more wait in the queue)
    let args = ["serve", "--model", m, "--max-queue", "2", "--max-batch", "2", "--context", &context_arg];
    let server = Arc::new(Server::start(&args, &[], dir.join("server.log")));

    // 16 clients x 4 requests at once: each gets 200 or a clean 429, and the metrics agree.
    // Threads only report what they saw (a panic in one would leave the others waiting).
    let (clients, each) = (16, 4);
    let barrier = Arc::new(Barrier::new(clients));
    let handles: Vec<_> = (0..clients)
        .map(|i| {
            let (server, barrier) = (server.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                (0..each)
                    .map(|j| {
                        let stream = j % 2 == 1;
                        let body = json!({"prompt": format!("client {i} request {j}"), "max_tokens": 48, "temperature": 0, "stream": stream});
                        (stream, server.post("/v1/completions", &body))
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let replies: Vec<(bool, Reply)> =
        handles.into_iter().flat_map(|h| h.join().expect("client thread")).collect();
    let (mut ok, mut busy, mut tokens) = (0u64, 0u64, 0u64);
    for (stream, r) in &replies {
        match r.status {
            200 if *stream => {
                ok += 1;
                tokens += check_stream(r, false, false).1 as u64;
            }
            200 => {
                ok += 1;
                let n = r.json()["usage"]["completion_tokens"].as_u64().expect("completion_tokens");
                assert_eq!(n, 48, "no end-of-sequence token: every answer runs to max_tokens");
                tokens += n;
            }
            429 => {
                busy += 1;
                assert_eq!(r.json()["error"]["type"], "rate_limit_exceeded");
            }
            other => panic!("status {other}: {}", r.text()),
        }
    }
    assert_eq!(ok + busy, (clients * each) as u64);
    assert!(ok >= 4 && busy >= 1, "{ok} answered, {busy} refused: two run and two wait at a time");
    assert_eq!(server.requests_counted("/v1/completions", 200), ok);
    assert_eq!(server.requests_counted("/v1/completions", 429), busy);
    assert_eq!(server.metric("wgspec_errors_total{kind=\"rate_limit_exceeded\"}"), busy as f64);
    assert_eq!(server.metric("wgspec_completions_total"), ok as f64);
    assert_eq!(server.metric("wgspec_generated_tokens_total"), tokens as f64);
    assert_eq!(server.metric("wgspec_queue_depth"), 0.0);

    // A client leaves a long stream after its first event: the next request is served at once,
    // far sooner than the stream would have ended (its length over the measured tokens/s).
    let rate = completion(&server, json!({"prompt": "rate", "max_tokens": 100, "temperature": 0}));
    let tokens_per_second = rate["wgspec"]["tokens_per_second"].as_f64().expect("tokens_per_second");
    let long = context - 100;
    let whole = Duration::from_secs_f64(long as f64 / tokens_per_second);
    let mut s = server.connect();
    let body =
        json!({"prompt": "leave early", "max_tokens": long, "temperature": 0, "stream": true}).to_string();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(head.as_bytes()).expect("send");
    let mut buf = [0u8; 512];
    let n = s.read(&mut buf).expect("the stream began");
    assert!(String::from_utf8_lossy(&buf[..n]).contains("200"), "{}", String::from_utf8_lossy(&buf[..n]));
    // While it runs, a prompt over the context gets its 400 at once: requests are tokenized and
    // checked before they queue, not when the GPU worker reaches them.
    let t = Instant::now();
    let r = server.post("/v1/completions", &json!({"prompt": "x".repeat(2 * context), "max_tokens": 1}));
    assert_eq!(
        (r.status, r.json()["error"]["code"].as_str()),
        (400, Some("context_length_exceeded")),
        "{}",
        r.text()
    );
    assert!(t.elapsed() < whole / 4, "the over-long prompt waited {:?} behind the stream", t.elapsed());
    drop(s);
    let t = Instant::now();
    let v = completion(&server, json!({"prompt": "next", "max_tokens": 4, "temperature": 0}));
    let waited = t.elapsed();
    assert_eq!(v["usage"]["completion_tokens"], 4);
    assert!(waited < whole / 4, "the next request waited {waited:?}; the whole stream takes {whole:?}");
    assert_eq!(
        server.metric("wgspec_completions_total"),
        ok as f64 + 2.0,
        "the abandoned stream never finished"
    );

    // The same for a client that leaves while waiting for a whole answer.
    let mut s = server.connect();
    let body = json!({"prompt": "leave early", "max_tokens": long, "temperature": 0}).to_string();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(head.as_bytes()).expect("send");
    std::thread::sleep(Duration::from_millis(300));
    drop(s);
    let t = Instant::now();
    completion(&server, json!({"prompt": "next", "max_tokens": 4, "temperature": 0}));
    let waited = t.elapsed();
    assert!(waited < whole / 4, "the next request waited {waited:?}; the whole answer takes {whole:?}");
    assert_eq!(
        server.metric("wgspec_completions_total"),
        ok as f64 + 3.0,
        "the abandoned answer never finished"
    );
    // Both counted once, as cancelled, with the tokens they had generated.
    assert_eq!(server.requests_counted("/v1/completions", 499), 2);
    assert_eq!(server.metric("wgspec_cancelled_generations_total"), 2.0);
    let finished_tokens = tokens + 100 + 4 + 4;
    assert!(
        server.metric("wgspec_generated_tokens_total") > finished_tokens as f64,
        "the cancelled generations' tokens are counted"
    );

    // A client that leaves while its request waits in the queue frees its place at once,
    // while the two requests before it still run (the batch is full).
    let send = |body: Value| {
        let mut s = server.connect();
        let body = body.to_string();
        let head = format!(
            "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(head.as_bytes()).expect("send");
        s
    };
    let mut running = send(json!({"prompt": "run", "max_tokens": long, "temperature": 0, "stream": true}));
    let n = running.read(&mut buf).expect("the stream began");
    assert!(String::from_utf8_lossy(&buf[..n]).contains("200"));
    let mut beside =
        send(json!({"prompt": "run beside", "max_tokens": long, "temperature": 0, "stream": true}));
    let n = beside.read(&mut buf).expect("the stream began");
    assert!(String::from_utf8_lossy(&buf[..n]).contains("200"));
    let queued = send(json!({"prompt": "wait", "max_tokens": 4, "temperature": 0}));
    let until = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + whole / 8;
        while !done() {
            assert!(Instant::now() < deadline, "{what} within {:?}", whole / 8);
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    until("queued", &|| server.metric("wgspec_queue_depth") == 1.0);
    drop(queued);
    until("out of the queue", &|| server.metric("wgspec_queue_depth") == 0.0);
    until("counted", &|| server.requests_counted("/v1/completions", 499) == 3);
    drop(running);
    drop(beside);
    completion(&server, json!({"prompt": "next", "max_tokens": 4, "temperature": 0}));
    assert_eq!(server.requests_counted("/v1/completions", 499), 5);
    assert_eq!(server.metric("wgspec_cancelled_generations_total"), 4.0, "the queued one never ran");

    // Every request counted once: what the clients sent, by the status they saw (499: left).
    let sent = clients * each + 10;
    let on_route: u64 =
        [200, 400, 429, 499].iter().map(|&s| server.requests_counted("/v1/completions", s)).sum();
    assert_eq!(on_route, sent as u64);
    assert_eq!(server.requests_counted("/v1/completions", 400), 1, "the over-long prompt");
    assert_eq!(server.requests_counted("/v1/completions", 200), ok + 4);
}

#[test]
fn hostile_clients_and_symlinks_get_nothing() {
    let dir = temp_dir("hostile");
    let www = dir.join("www");
    let pkg = dir.join("pkg");
    let models = dir.join("cache").join("models");
    for d in [&www, &pkg, &models] {
        std::fs::create_dir_all(d).expect("dir");
    }
    std::fs::write(www.join("index.html"), "<p>demo</p>").expect("page");
    std::fs::write(pkg.join("wgspec.js"), "export {};").expect("pkg");
    let link = |target: &Path, at: PathBuf| std::os::unix::fs::symlink(target, at).expect("symlink");
    link(Path::new("/etc/passwd"), www.join("passwd.txt"));
    link(Path::new("/etc"), www.join("etc"));
    link(Path::new("/etc/passwd"), pkg.join("passwd.js"));
    link(Path::new("/etc/passwd"), models.join("passwd"));
    link(Path::new("/etc/passwd"), models.join("passwd.gguf"));
    link(Path::new("/etc/passwd"), models.join("config.json"));
    // A model folder made of symlinks to files elsewhere (as Hugging Face's cache is): served.
    let real = tiny_model(&dir, 64, true);
    std::fs::create_dir_all(models.join("hf")).expect("dir");
    link(&real, models.join("hf").join("model.gguf"));
    let cache = dir.join("cache");
    let server = Server::start(
        &[
            "web",
            "--www",
            www.to_str().expect("utf8"),
            "--pkg",
            pkg.to_str().expect("utf8"),
            "--header-timeout",
            "2",
        ],
        &[("WGSPEC_CACHE", &cache)],
        dir.join("server.log"),
    );

    assert_eq!(server.get("/").text(), "<p>demo</p>");
    assert_eq!(server.get("/pkg/wgspec.js").status, 200);
    let gguf = server.get("/models/hf/model.gguf");
    assert_eq!(gguf.status, 200);
    assert!(gguf.body.starts_with(b"GGUF"));
    assert_eq!(server.get("/models/index.json").json(), json!([]), "no known model in this cache");
    for path in [
        "/passwd.txt",
        "/etc/passwd",
        "/pkg/passwd.js",
        "/models/passwd",
        "/models/passwd.gguf",
        "/models/config.json",
        "/../../../../etc/passwd",
        "/pkg/..%2f..%2f..%2fetc/passwd",
        "/%2e%2e/%2e%2e/etc/passwd",
        "/models/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
    ] {
        let r = server.get(path);
        assert!(!r.text().contains("root:"), "{path} leaked /etc/passwd");
        assert!(r.status == 404 || r.status == 400, "{path}: {} {}", r.status, r.text());
    }
    assert_eq!(server.get("/v1/models").status, 404, "`web` has no model");

    // 500 idle connections (nothing sent) and a half-sent head: a normal request is answered at
    // once, and the timeout closes the idle ones.
    let mut idle: Vec<TcpStream> = (0..500).map(|_| server.connect()).collect();
    let mut half = server.connect();
    half.write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n").expect("half a head");
    let t = Instant::now();
    assert_eq!(server.get("/health").status, 200);
    assert!(t.elapsed() < Duration::from_secs(2), "answered in {:?}", t.elapsed());
    idle.push(half);
    let deadline = Instant::now() + Duration::from_secs(20);
    for s in &mut idle {
        s.set_read_timeout(Some(
            deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1)),
        ))
        .expect("timeout");
        let mut byte = [0u8; 256];
        // Closed: end of stream (0) or a reset; a response to the half head is fine too (408).
        let closed = match s.read(&mut byte) {
            Ok(0) | Err(_) if Instant::now() < deadline => true,
            Ok(_) => s.read_to_end(&mut Vec::new()).is_ok(),
            Err(_) => false,
        };
        assert!(closed, "an idle connection stayed open past the header timeout");
    }
}

#[test]
fn smollm2_chat_through_the_server_equals_the_cli() {
    let model = common::goldens::model_file("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m");
    let m = model.to_str().expect("utf8 path");
    let dir = temp_dir("smollm2");
    let server = Server::start(&["serve", "--model", m, "--context", "512"], &[], dir.join("server.log"));
    let question = "What is the capital of France?";
    let cli = Command::new(env!("CARGO_BIN_EXE_wgspec"))
        .args(["generate", "--model", m, "--chat", "--prompt", question, "--max-tokens", "6", "--json"])
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .output()
        .expect("run wgspec generate");
    assert!(cli.status.success(), "{}", String::from_utf8_lossy(&cli.stderr));
    let cli: Value = serde_json::from_slice(&cli.stdout).expect("generate --json");
    let want = cli["text"].as_str().expect("text");
    assert!(!want.trim().is_empty(), "SmolLM2 answers something: {cli}");

    let mut chat = json!({"model": "SmolLM2-135M-Instruct.Q4_1", "messages": [{"role": "user", "content": question}], "max_tokens": 6, "temperature": 0});
    let v = server.post("/v1/chat/completions", &chat).json();
    assert_eq!(v["choices"][0]["message"]["content"].as_str(), Some(want), "{v}");
    assert_eq!(v["usage"]["prompt_tokens"].as_u64(), cli["prompt_tokens"].as_array().map(|p| p.len() as u64));
    chat["stream"] = json!(true);
    chat["draft"] = json!("ngram");
    let r = server.post("/v1/chat/completions", &chat);
    let events = r.events();
    let text: String = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).expect("chunk"))
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str().map(str::to_string))
        .collect();
    assert_eq!(text, want, "streamed with n-gram drafts");
}

#[test]
fn malformed_heads_get_json_errors_and_are_counted() {
    let server = serve_tiny("heads", 64, &[]);
    let head = |lines: &str| format!("GET /health HTTP/1.1\r\nConnection: close\r\n{lines}\r\n").into_bytes();
    let big = |n: usize| head(&format!("Host: 127.0.0.1\r\nX-Big: {}\r\n", "a".repeat(n)));
    let many: String = (0..500).map(|i| format!("X-{i}: a\r\n")).collect();
    let post = |headers: &str| {
        format!("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}\r\n{{\"prompt\": \"a\"}}")
            .into_bytes()
    };
    // (what, the request, status, code, counted under the route)
    let cases: Vec<(&str, Vec<u8>, u16, &str, &str)> = vec![
        ("a bad request line", b"GET\r\n\r\n".to_vec(), 400, "invalid_http_request", "unparsed"),
        (
            "a control byte in a header",
            head("Host: 127.0.0.1\r\nX-Bad: a\x01b\r\n"),
            400,
            "invalid_http_request",
            "unparsed",
        ),
        (
            "two Content-Lengths",
            post("Content-Length: 14\r\nContent-Length: 15\r\n"),
            400,
            "invalid_http_request",
            "unparsed",
        ),
        (
            "a negative Content-Length",
            post("Content-Length: -14\r\n"),
            400,
            "invalid_http_request",
            "unparsed",
        ),
        (
            "500 headers",
            head(&format!("Host: 127.0.0.1\r\n{many}")),
            431,
            "request_header_fields_too_large",
            "unparsed",
        ),
        ("a 1 MB header", big(1 << 20), 431, "request_header_fields_too_large", "unparsed"),
    ];
    let mut counted = std::collections::BTreeMap::new();
    for (what, request, status, code, route) in cases {
        check_error(&server.raw(request, route == "unparsed"), status, code, what);
        *counted.entry((route, status)).or_insert(0u64) += 1;
        server.still_answers();
    }
    // A head over 64 KiB that hyper's buffer took whole: the server's own check answers.
    let r = server.raw(big(100_000), false);
    check_error(&r, 431, "request_header_fields_too_large", "a 100 kB header");
    server.still_answers();
    let heads_431 = server.requests_counted("unparsed", 431) + server.requests_counted("/health", 431)
        - counted[&("unparsed", 431)];
    assert_eq!(heads_431, 1, "the 100 kB head counted once, under one route or the other");
    for ((route, status), n) in counted {
        assert_eq!(server.requests_counted(route, status), n, "{route} {status}");
    }
}

#[test]
fn a_request_names_one_host_and_on_loopback_a_loopback_one() {
    let server = serve_tiny("hosts", 64, &[]);
    let get = |target: &str, hosts: &str| {
        format!("GET {target} HTTP/1.1\r\nConnection: close\r\n{hosts}\r\n").into_bytes()
    };
    for (what, request, status, code) in [
        (
            "an allowed Host, then another",
            get("/health", "Host: 127.0.0.1\r\nHost: evil.com\r\n"),
            400,
            "invalid_host",
        ),
        (
            "two allowed Hosts",
            get("/v1/models", "Host: 127.0.0.1\r\nHost: localhost\r\n"),
            400,
            "invalid_host",
        ),
        ("no Host", get("/health", ""), 400, "invalid_host"),
        (
            "an absolute target on another host",
            get("http://evil.com/health", "Host: 127.0.0.1\r\n"),
            403,
            "host_not_allowed",
        ),
        ("another host", get("/health", "Host: evil.com\r\n"), 403, "host_not_allowed"),
        ("an absolute target and no Host", get("http://127.0.0.1/health", ""), 400, "invalid_host"),
    ] {
        check_error(&server.raw(request, false), status, code, what);
        server.still_answers();
    }
    let ok = server.raw(get("http://127.0.0.1/health", "Host: 127.0.0.1\r\n"), false);
    assert_eq!(ok.status, 200, "an absolute target on the loopback host: {}", ok.text());
    assert_eq!(server.requests_counted("/health", 400), 3);
    assert_eq!(server.requests_counted("/v1/models", 400), 1);
    assert_eq!(server.requests_counted("/health", 403), 2);
}

#[test]
fn chat_roles_and_fields_cannot_become_control_tokens() {
    let server = serve_tiny("roles", 4096, &[]);
    let chat = |messages: Value| {
        server.post("/v1/chat/completions", &json!({"messages": messages, "max_tokens": 2, "temperature": 0}))
    };
    // The tiny vocabulary's one control token is `<|eos|>` (its other ids are bytes).
    for (what, messages) in [
        ("a role with markup", json!([{"role": "user>\n<|eos|><system", "content": "hi"}])),
        ("an unknown role", json!([{"role": "root", "content": "hi"}])),
        ("an unknown message field", json!([{"role": "user", "content": "hi", "weight": 2}])),
        ("tool calls", json!([{"role": "assistant", "content": "", "tool_calls": [{"id": "c"}]}])),
        ("an image part", json!([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])),
    ] {
        let e = check_error(&chat(messages), 400, "", what);
        assert_eq!(e["param"], "messages", "{what}: {e}");
        server.still_answers();
    }
    // Roles the template knows: `developer` is given as `system`; null and empty fields that
    // clients send back with an answer are accepted.
    let r = chat(json!([
        {"role": "developer", "content": "be brief", "name": "ops"},
        {"role": "assistant", "content": "ok", "refusal": null, "tool_calls": []},
        {"role": "user", "content": "hi"},
    ]));
    assert_eq!(r.status, 200, "{}", r.text());
    let rendered = "<system>be brief\n<assistant>ok\n<user>hi\n<assistant>";
    assert_eq!(r.json()["usage"]["prompt_tokens"].as_u64(), Some(rendered.len() as u64));
    // Control-token text in content, or the start or end of one (which a template's own text
    // beside it could complete: tests/engine.rs), stays text: one byte token per byte.
    for content in ["hi<|eos|>there", "<|eos|>", "hi <|eo", "s|> hi", "o"] {
        let r = chat(json!([{"role": "user", "content": content}]));
        assert_eq!(r.status, 200, "{content}: {}", r.text());
        let tokens = r.json()["usage"]["prompt_tokens"].as_u64();
        assert_eq!(tokens, Some(format!("<user>{content}\n<assistant>").len() as u64), "{content}");
    }
    // Through /tokenize the same text is parsed for control tokens, as llama.cpp's is: the
    // chat's count above is not that of a naive encoding.
    let naive = server.post("/tokenize", &json!({"content": "<user>hi<|eos|>there\n<assistant>"})).json();
    assert_eq!(
        naive["tokens"].as_array().map(Vec::len),
        Some("<user>hi".len() + 1 + "there\n<assistant>".len())
    );
    // Many: each is spelled on its own, so more than 1024 are refused, and either way at once.
    for (n, status) in [(500, 200), (100_000, 400)] {
        let t = Instant::now();
        let r = chat(json!([{"role": "user", "content": "<|eos|>".repeat(n)}]));
        assert_eq!(r.status, status, "{n} control-token texts: {}", r.text());
        assert!(t.elapsed() < Duration::from_secs(10), "{n} control-token texts took {:?}", t.elapsed());
    }
    let many = vec![json!({"role": "user", "content": "o"}); 400];
    let t = Instant::now();
    let r = chat(Value::Array(many));
    assert_eq!(r.status, 200, "400 messages that lie inside a control token's text: {}", r.text());
    assert!(t.elapsed() < Duration::from_secs(10), "400 messages took {:?}", t.elapsed());
    server.still_answers();
}

#[test]
fn work_before_admission_is_bounded_whatever_the_bodies() {
    let server = Arc::new(serve_tiny("bounded", 4096, &[]));
    // Bodies just under the 8 MiB limit, each refused after the work it can cost: a prompt and
    // a chat whose bytes alone cannot fit the context (refused before tokenizing, the chat after
    // rendering), a /tokenize text as long, a prompt of 4 million numbers (refused at its second),
    // and a harmless field holding as many (read and dropped) beside a refused `max_tokens`.
    let size = (8 << 20) - 1024;
    let text = "x".repeat(size - 64);
    let zeros = |n: usize| format!("[{}0]", "0,".repeat(n));
    let bodies: Arc<Vec<(&str, String, &str)>> = Arc::new(vec![
        ("/v1/completions", json!({"prompt": text}).to_string(), "prompt"),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": text}]}).to_string(),
            "messages",
        ),
        ("/tokenize", json!({"content": text}).to_string(), "content"),
        ("/v1/completions", format!(r#"{{"prompt": {}}}"#, zeros(size / 2 - 16)), "prompt"),
        (
            "/v1/completions",
            format!(r#"{{"prompt": "a", "max_tokens": 0, "user": {}}}"#, zeros(size / 2 - 32)),
            "max_tokens",
        ),
    ]);
    let round = |n: usize| {
        let barrier = Arc::new(Barrier::new(n));
        let threads: Vec<_> = (0..n)
            .map(|i| {
                let (server, bodies, barrier) = (server.clone(), bodies.clone(), barrier.clone());
                std::thread::spawn(move || {
                    let (path, body, param) = &bodies[i % bodies.len()];
                    barrier.wait();
                    let r = server.request("POST", path, &[], body.as_bytes());
                    (r.status, r.json()["error"]["param"].as_str().map(str::to_string), *param)
                })
            })
            .collect();
        for t in threads {
            let (status, param, want) = t.join().expect("client thread");
            assert_eq!((status, param.as_deref()), (400, Some(want)));
        }
        server.memory()
    };
    let (base, _) = server.memory();
    round(bodies.len());
    let (_, few) = round(2 * bodies.len());
    let (after, many) = round(8 * bodies.len());
    let mib = |b: u64| b as f64 / f64::from(1 << 20);
    eprintln!(
        "resident {:.0} MiB at the start; peak {:.0} MiB after 10 maximal bodies at once, {:.0} MiB after 40; {:.0} MiB after",
        mib(base),
        mib(few),
        mib(many),
        mib(after)
    );
    // The README's bound: 32 MiB of large bodies held at once, two requests being read at a
    // time at about 7 times their body each (an 8 MiB chat: its text, the template's copy and
    // output), and the tokenizer's share of a prompt no longer than the context can hold. 40
    // bodies held at once, or tokenized, would take over 320 MiB (the bodies alone) and 20 GB.
    assert!(many - base < 200 << 20, "peak {:.0} MiB over the start", mib(many - base));
    // 10 bodies at once may not meet the worst case (two chats rendered together): a request's
    // worth of slack.
    assert!(
        many - few < 64 << 20,
        "the peak grew from {:.0} to {:.0} MiB with 4 times the bodies",
        mib(few),
        mib(many)
    );
    assert!(after - base < 64 << 20, "{:.0} MiB kept after the bodies", mib(after - base));
    server.still_answers();
}

#[test]
fn batched_requests_equal_their_solo_runs_and_a_cancelled_one_frees_its_pages() {
    // Eight requests at once (different prompts and lengths, plain and with n-gram drafts, greedy
    // and sampled with seeds, the n-gram's trees of up to 4 continuations: `--tree 4`) share the
    // server's passes: each answer is the one it got alone. A stream whose client leaves
    // mid-batch gives its KV cache pages back (the metrics show it) and the request beside it
    // finishes exactly.
    let dir = temp_dir("batch");
    let model = tiny_model(&dir, 1024, false);
    let m = model.to_str().expect("utf8 path");
    let args = ["serve", "--model", m, "--kv-pages", "96", "--draft", "ngram", "--tree", "4"];
    let server = Arc::new(Server::start(&args, &[], dir.join("server.log")));
    let body = |i: usize| {
        let draft = ["none", "ngram"][i % 2];
        let prompt = "the cat sat on the mat ".repeat(1 + i % 4) + &format!("request {i}");
        let temperature = if i % 3 == 2 { 0.9 } else { 0.0 };
        json!({"prompt": prompt, "max_tokens": 20 + 9 * i, "temperature": temperature, "seed": i, "draft": draft})
    };
    let text = |v: &Value| v["choices"][0]["text"].as_str().expect("text").to_string();
    let solo: Vec<String> = (0..8).map(|i| text(&completion(&server, body(i)))).collect();
    let passes = server.metric("wgspec_batch_passes_total");
    let rows = server.metric("wgspec_batch_rows_total");
    for (i, v) in at_once(&server, (0..8).map(body).collect()).iter().enumerate() {
        assert_eq!(text(v), solo[i], "request {i} beside the others");
    }
    let (passes, rows) = (
        server.metric("wgspec_batch_passes_total") - passes,
        server.metric("wgspec_batch_rows_total") - rows,
    );
    assert!(rows > 1.5 * passes, "requests shared passes: {rows} rows in {passes} passes");
    assert_eq!(server.metric("wgspec_kv_pages_used"), 0.0);
    assert_eq!(server.metric("wgspec_kv_pages_free"), 96.0);
    // a fixed K over a prompt whose earlier matches continue differently: its drafts are a tree
    // (`--tree 4`), its text the plain request's
    let trees = server.metric("wgspec_batch_draft_trees_total");
    let branching =
        json!({"prompt": "a b a c a d a b a c a d a", "max_tokens": 16, "temperature": 0, "draft_k": 4});
    let plain =
        json!({"prompt": "a b a c a d a b a c a d a", "max_tokens": 16, "temperature": 0, "draft": "none"});
    assert_eq!(text(&completion(&server, branching)), text(&completion(&server, plain)));
    assert!(server.metric("wgspec_batch_draft_trees_total") > trees, "no tree drafted under --tree 4");

    // `n` choices: choice i is the request with seed + i alone; the prompt, computed by those
    // solo runs, is found in the prefix cache (`cached_tokens`), whole and streamed
    let choices = |n: usize, stream: bool| {
        let prompt = "the cat sat on the mat ".repeat(9);
        json!({"prompt": prompt, "max_tokens": 24, "temperature": 0.9, "seed": 40, "n": n, "stream": stream,
               "stream_options": if stream { json!({"include_usage": true}) } else { Value::Null }})
    };
    let solo: Vec<Value> = (0..3)
        .map(|i| {
            let mut one = choices(1, false);
            one["seed"] = (40 + i).into();
            completion(&server, one)
        })
        .collect();
    let hits = server.metric("wgspec_prefix_cache_hit_tokens_total");
    let v = completion(&server, choices(3, false));
    let got: Vec<String> =
        (0..3).map(|i| v["choices"][i]["text"].as_str().expect("text").to_string()).collect();
    assert_eq!(got, solo.iter().map(text).collect::<Vec<_>>(), "each choice is its seed's solo run");
    assert_ne!(got[0], got[1], "the choices sample with their own seeds");
    assert!(
        (0..3).all(|i| v["choices"][i]["index"] == i && v["choices"][i]["wgspec"]["from_draft"].is_array())
    );
    let tokens: u64 = solo.iter().map(|s| s["usage"]["completion_tokens"].as_u64().expect("tokens")).sum();
    assert_eq!(v["usage"]["completion_tokens"].as_u64(), Some(tokens));
    assert_eq!(v["usage"]["prompt_tokens"], solo[0]["usage"]["prompt_tokens"]);
    let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().expect("cached");
    let prompt_tokens = v["usage"]["prompt_tokens"].as_u64().expect("prompt tokens");
    let page = wgspec::gpu::KV_PAGE as u64;
    assert!(prompt_tokens > page, "a prompt over a page: {v}");
    assert_eq!(cached, (prompt_tokens - 1) / page * page, "the prompt's whole pages found cached: {v}");
    assert!(server.metric("wgspec_prefix_cache_hit_tokens_total") >= hits + 3.0 * cached as f64);
    let r = server.post("/v1/completions", &choices(2, true));
    assert_eq!(r.status, 200, "{}", r.text());
    let events = r.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> =
        events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).expect("JSON")).collect();
    let mut streamed = [String::new(), String::new()];
    let mut finished = [0, 0];
    for c in chunks.iter().filter(|c| c["choices"].as_array().is_some_and(|a| !a.is_empty())) {
        let i = c["choices"][0]["index"].as_u64().expect("index") as usize;
        assert_eq!(finished[i], 0, "nothing of choice {i} after its last chunk");
        streamed[i] += c["choices"][0]["text"].as_str().expect("text");
        finished[i] += c["choices"][0]["finish_reason"].is_string() as usize;
    }
    assert_eq!((finished, streamed.to_vec()), ([1, 1], got[..2].to_vec()), "streamed choices");
    let usage = &chunks.last().expect("usage chunk")["usage"];
    let two: u64 = solo[..2].iter().map(|s| s["usage"]["completion_tokens"].as_u64().expect("n")).sum();
    assert_eq!(usage["completion_tokens"].as_u64(), Some(two), "one usage chunk, last");
    // a top-k of 40 (above the 16 ids top_k.wgsl ranks) with the server's n-gram drafts: the
    // batch takes its choices, each its seed's alone whatever K each run's timings choose (the
    // GPU draws the cut as every other sampled token); the prompt counted once
    let mut top_k = choices(2, false);
    top_k["top_k"] = 40.into();
    let prompts = server.metric("wgspec_prompt_tokens_total");
    let v = completion(&server, top_k.clone());
    let counted = server.metric("wgspec_prompt_tokens_total") - prompts;
    assert_eq!(Some(counted as u64), v["usage"]["prompt_tokens"].as_u64(), "the prompt counted once");
    for i in 0..2 {
        let mut one = top_k.clone();
        (one["n"], one["seed"]) = (1.into(), (40 + i).into());
        assert_eq!(
            v["choices"][i]["text"],
            completion(&server, one)["choices"][0]["text"],
            "choice {i} alone"
        );
    }
    assert_eq!(server.metric("wgspec_kv_pages_used"), 0.0);

    // a long stream beside a long answer; the stream's client leaves
    let long = |prompt: &str| json!({"prompt": prompt, "max_tokens": 700, "temperature": 0});
    let alone = text(&completion(&server, long("stays")));
    let mut s = server.connect();
    // (a prompt of several pages: their return shows beside the other's growth)
    let mut stream = long(&"leaves early ".repeat(20));
    stream["stream"] = true.into();
    let body = stream.to_string();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(head.as_bytes()).expect("send");
    let stays = {
        let server = server.clone();
        std::thread::spawn(move || server.post("/v1/completions", &long("stays")))
    };
    let until = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + IO_TIMEOUT;
        while !done() {
            assert!(Instant::now() < deadline, "{what} in time");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let mut buf = [0u8; 512];
    let n = s.read(&mut buf).expect("the stream began");
    assert!(String::from_utf8_lossy(&buf[..n]).contains("200"), "{}", String::from_utf8_lossy(&buf[..n]));
    until("both running", &|| server.metric("wgspec_running_sequences") == 2.0);
    let held = server.metric("wgspec_kv_pages_used");
    assert!(held >= 4.0, "{held} pages held");
    drop(s);
    until("the stream's pages freed", &|| {
        server.metric("wgspec_running_sequences") <= 1.0
            && server.metric("wgspec_kv_pages_used") <= held - 2.0
    });
    let r = stays.join().expect("client");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(text(&r.json()), alone, "the answer beside a cancelled stream");
    until("every page back", &|| server.metric("wgspec_kv_pages_used") == 0.0);
    assert_eq!(server.metric("wgspec_cancelled_generations_total"), 1.0);

    // a draft model (the target itself: every draft kept, sampled ones too, drawn with the noise
    // of the target's rows): greedy and sampled requests share its passes and the target's, each
    // answer its solo run's. Prefixes not shared between requests: none finds the prompt its
    // solo run computed (the choices of one request share theirs).
    let args = ["serve", "--model", m, "--kv-pages", "96", "--draft", m, "--no-prefix-sharing"];
    let drafted = Arc::new(Server::start(&args, &[], dir.join("server-draft.log")));
    let body = |i: usize| {
        let prompt = "the cat sat on the mat ".repeat(1 + i % 3) + &format!("request {i}");
        let (temperature, top_k) = [(0.0, 0), (0.8, 0), (0.0, 0), (1.0, 40)][i];
        json!({"prompt": prompt, "max_tokens": 16 + 5 * i, "temperature": temperature, "top_k": top_k,
               "seed": 100 + i, "draft_k": 3})
    };
    let solo: Vec<Value> = (0..4).map(|i| completion(&drafted, body(i))).collect();
    assert!(solo.iter().all(|v| v["wgspec"]["draft"] == "model"), "{}", solo[0]);
    let (passes, draft_rows) =
        (drafted.metric("wgspec_batch_passes_total"), drafted.metric("wgspec_batch_draft_rows_total"));
    let page = wgspec::gpu::KV_PAGE as u64;
    assert!(solo[2]["usage"]["prompt_tokens"].as_u64().is_some_and(|n| n > page), "{}", solo[2]);
    for (i, v) in at_once(&drafted, (0..4).map(body).collect()).iter().enumerate() {
        assert_eq!(text(v), text(&solo[i]), "request {i} beside the others, drafting with the model");
        assert_eq!(v["wgspec"]["acceptance_rate"], 1.0, "the target as its own draft: {v}");
        assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0, "request {i}: not shared");
    }
    assert_eq!(drafted.metric("wgspec_prefix_cache_hit_tokens_total"), 0.0);
    assert!(drafted.metric("wgspec_batch_passes_total") > passes);
    assert!(
        drafted.metric("wgspec_batch_draft_rows_total") > draft_rows,
        "the draft model's drafts were verified"
    );

    // the choices of a request drafting with the draft model's ensemble with the n-gram (one
    // token tree each) are batched too, each its seed's alone; the prompt counted once
    let ensemble = json!({"prompt": "the cat sat on the mat ".repeat(3), "max_tokens": 12, "temperature": 0.9,
                          "top_k": 40, "seed": 7, "n": 2, "draft": "model+ngram", "draft_k": 2});
    let (prompts, passes) =
        (drafted.metric("wgspec_prompt_tokens_total"), drafted.metric("wgspec_batch_passes_total"));
    let v = completion(&drafted, ensemble.clone());
    let counted = drafted.metric("wgspec_prompt_tokens_total") - prompts;
    assert_eq!(Some(counted as u64), v["usage"]["prompt_tokens"].as_u64(), "the prompt counted once");
    assert!(drafted.metric("wgspec_batch_passes_total") > passes, "batched");
    for i in 0..2 {
        let mut one = ensemble.clone();
        (one["n"], one["seed"]) = (1.into(), (7 + i).into());
        let alone = completion(&drafted, one);
        assert_eq!(v["choices"][i]["text"], alone["choices"][0]["text"], "choice {i} alone");
        assert_eq!(alone["wgspec"]["draft"], "model+ngram", "{alone}");
    }
}

/// Whether an answer's `Vary` names `Origin`.
fn varies_by_origin(r: &Reply) -> bool {
    r.headers.iter().any(|(k, v)| k.eq_ignore_ascii_case("vary") && v.contains("Origin"))
}

#[test]
fn browser_origins_need_allowing_and_get_cors_answers() {
    const APP: &str = "http://app.example:5173";
    const EXTENSION: &str = "chrome-extension://abcdefghijklmnop";
    let allowed = format!("{APP},{EXTENSION}");
    let server = serve_tiny("origins", 64, &["--api-key", "sk-test", "--allow-origin", &allowed]);
    let own = format!("http://{}", server.addr);
    let key = ("Authorization", "Bearer sk-test");
    let body = json!({"prompt": "ab", "max_tokens": 2, "temperature": 0}).to_string();
    let post = |origin: Option<&str>, content_type: &str, key: Option<(&str, &str)>| {
        let mut headers = vec![("Content-Type", content_type)];
        headers.extend(origin.map(|o| ("Origin", o)));
        headers.extend(key);
        server.request("POST", "/v1/completions", &headers, body.as_bytes())
    };
    let completions = || server.metric("wgspec_completions_total");

    // A page on another site posts a "simple" request (no preflight): refused before it runs.
    let before = completions();
    for origin in ["http://evil.example", "null", "http://app.example:5174", "https://app.example:5173"] {
        let r = post(Some(origin), "text/plain", Some(key));
        let e = check_error(&r, 403, "origin_not_allowed", origin);
        assert!(e["message"].as_str().is_some_and(|m| m.contains("--allow-origin")), "{e}");
        assert_eq!(r.header("access-control-allow-origin"), None, "{origin}");
        assert!(varies_by_origin(&r), "{origin}: {:?}", r.headers);
    }
    let r = server.request("GET", "/v1/models", &[("Origin", "http://evil.example"), key], b"");
    check_error(&r, 403, "origin_not_allowed", "a cross-site GET of the models");
    assert_eq!(completions(), before, "a refused origin ran a generation");
    assert_eq!(server.requests_counted("/v1/completions", 403), 4);

    // The allowed origin: its preflight needs no key and names what the request will send.
    let preflight = |origin: &str| {
        server.request(
            "OPTIONS",
            "/v1/completions",
            &[
                ("Origin", origin),
                ("Access-Control-Request-Method", "POST"),
                ("Access-Control-Request-Headers", "authorization,content-type,x-stainless-os"),
                ("Access-Control-Request-Private-Network", "true"),
            ],
            b"",
        )
    };
    let r = preflight(APP);
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(r.header("access-control-allow-origin"), Some(APP));
    assert!(r.header("access-control-allow-methods").is_some_and(|m| m.contains("POST")), "{:?}", r.headers);
    assert_eq!(r.header("access-control-allow-headers"), Some("authorization,content-type,x-stainless-os"));
    assert_eq!(r.header("access-control-allow-private-network"), Some("true"));
    check_error(&preflight("http://evil.example"), 403, "origin_not_allowed", "another site's preflight");
    // Its answers name it, errors included, so that the page can read them.
    let r = post(Some(APP), "application/json", Some(key));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["usage"]["completion_tokens"], 2);
    assert_eq!(r.header("access-control-allow-origin"), Some(APP));
    assert!(varies_by_origin(&r));
    let r = post(Some(EXTENSION), "application/json", Some(key));
    assert_eq!((r.status, r.header("access-control-allow-origin")), (200, Some(EXTENSION)), "{}", r.text());
    let r = post(Some(APP), "application/json", None);
    check_error(&r, 401, "invalid_api_key", "the allowed origin without its key");
    assert_eq!(r.header("access-control-allow-origin"), Some(APP));

    // The server's own pages and clients that are not browsers (no Origin) are served as before.
    let from_own =
        [("Origin", own.as_str()), ("Host", server.addr.as_str()), ("Content-Type", "text/plain"), key];
    assert_eq!(server.request("POST", "/v1/completions", &from_own, body.as_bytes()).status, 200);
    let r = post(None, "application/json", Some(key));
    assert_eq!(r.status, 200);
    assert!(varies_by_origin(&r), "an answer that would differ with an Origin says so: {:?}", r.headers);
    assert_eq!(completions(), before + 4.0);
    // Static files and health stay open to every page.
    assert_eq!(server.request("GET", "/health", &[("Origin", "http://evil.example")], b"").status, 200);

    // A malformed --allow-origin stops the server before it starts.
    let out = Command::new(env!("CARGO_BIN_EXE_wgspec"))
        .args(["serve", "--model", "none.gguf", "--allow-origin", "app.example:5173"])
        .output()
        .expect("run wgspec");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--allow-origin \"app.example:5173\""), "{err}");
}

#[test]
fn a_list_of_prompts_is_answered_as_each_prompt_alone() {
    // `/v1/completions` with a list of prompts (LangChain's batches, vLLM's clients): prompt p's
    // choices are the answer's `p * n ..`, each the text its prompt gets alone (greedy and
    // sampled with a seed), whole and streamed, batched and with requests one at a time; the
    // usage counts each prompt once.
    let dir = temp_dir("prompts");
    let model = tiny_model(&dir, 256, false);
    let m = model.to_str().expect("utf8 path");
    let prompts = ["the cat sat", "on the mat the cat", "a b a b a"];
    for extra in [&[][..], &["--max-batch", "1"][..]] {
        let mut args = vec!["serve", "--model", m, "--draft", "ngram"];
        args.extend_from_slice(extra);
        let server = Server::start(&args, &[], dir.join("server.log"));
        for (temperature, n) in [(0.0, 1), (0.9, 2)] {
            let body = |prompt: Value| json!({"prompt": prompt, "max_tokens": 9, "temperature": temperature, "seed": 3, "n": n});
            let solo: Vec<Value> = prompts.iter().map(|p| completion(&server, body(json!(p)))).collect();
            let all = completion(&server, body(json!(prompts)));
            let what = format!("{extra:?} temperature {temperature} n {n}");
            let choices = all["choices"].as_array().expect("choices");
            assert_eq!(choices.len(), prompts.len() * n, "{what}: {all}");
            for (p, alone) in solo.iter().enumerate() {
                for i in 0..n {
                    let c = &choices[p * n + i];
                    assert_eq!(c["index"], p * n + i, "{what}");
                    assert_eq!(c["text"], alone["choices"][i]["text"], "{what}: prompt {p} choice {i}");
                }
            }
            let sum =
                |field: &str| solo.iter().map(|v| v["usage"][field].as_u64().expect("count")).sum::<u64>();
            assert_eq!(all["usage"]["prompt_tokens"], sum("prompt_tokens"), "{what}");
            assert_eq!(all["usage"]["completion_tokens"], sum("completion_tokens"), "{what}");
            // streamed: each choice's chunks by its index add up to its text; the usage last
            let mut streamed = body(json!(prompts));
            streamed["stream"] = json!(true);
            streamed["stream_options"] = json!({"include_usage": true});
            let reply = server.post("/v1/completions", &streamed);
            let events = reply.events();
            let mut texts = vec![String::new(); prompts.len() * n];
            for e in &events[..events.len() - 2] {
                let chunk: Value = serde_json::from_str(e).expect("chunk");
                let index = chunk["choices"][0]["index"].as_u64().expect("index") as usize;
                texts[index] += chunk["choices"][0]["text"].as_str().expect("text");
            }
            let usage: Value = serde_json::from_str(&events[events.len() - 2]).expect("usage chunk");
            assert_eq!(usage["usage"]["prompt_tokens"], sum("prompt_tokens"), "{what}: streamed");
            for (i, c) in choices.iter().enumerate() {
                assert_eq!(c["text"], texts[i], "{what}: streamed choice {i}");
            }
        }
        // A prompt over the context among others refuses the request, naming `prompt` and which;
        // one whose max_tokens cannot fit too.
        let long = "the cat ".repeat(200);
        let r = server.post("/v1/completions", &json!({"prompt": ["a", long], "max_tokens": 4}));
        let e = check_error(&r, 400, "context_length_exceeded", "a long prompt among others");
        assert!(e["message"].as_str().is_some_and(|m| m.starts_with("`prompt[1]`: ")), "{e}");
        assert_eq!(e["param"], "prompt", "{e}");
        let near = "the cat ".repeat(20);
        let r = server.post("/v1/completions", &json!({"prompt": ["a", "b", near], "max_tokens": 200}));
        let e = check_error(&r, 400, "", "a prompt whose max_tokens cannot fit");
        assert!(e["message"].as_str().is_some_and(|m| m.starts_with("`prompt[2]`: ")), "{e}");
        // one prompt: its refusal as it was
        let r = server.post("/v1/completions", &json!({"prompt": long, "max_tokens": 4}));
        let e = check_error(&r, 400, "context_length_exceeded", "a long prompt alone");
        assert!(e["message"].as_str().is_some_and(|m| !m.contains("prompt[")), "{e}");
        server.still_answers();
    }
}

#[test]
fn a_model_that_fails_to_load_stops_the_server_with_its_error() {
    // The path a GPU worker's panic takes too (it stops the server, as vLLM's engine death does):
    // the error on standard error, a failing exit status, and no hang.
    let dir = temp_dir("fails");
    let model = dir.join("broken.gguf");
    std::fs::write(&model, b"GGUF not really").expect("write");
    let mut child = Command::new(env!("CARGO_BIN_EXE_wgspec"))
        .args(["serve", "--model", model.to_str().expect("utf8"), "--port", "0"])
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start wgspec");
    let deadline = Instant::now() + IO_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        assert!(Instant::now() < deadline, "the server did not stop");
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    child.stderr.take().expect("stderr").read_to_string(&mut err).expect("read");
    assert!(!status.success(), "{err}");
    assert!(err.contains("broken.gguf: unsupported GGUF version"), "{err}");
}

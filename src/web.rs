//! The browser facade (wasm32 only): a thin `#[wasm_bindgen]` class over [`Engine`]. No logic of
//! its own: files are staged (small JSON files as bytes, weight files as a synchronous read
//! function over storage outside wasm memory), opened by [`ModelFiles`], loaded by
//! [`Engine::load`] (which streams the weights to the GPU a bounded batch of rows at a time), and
//! requests run through [`Engine::generate`]. Errors reach JavaScript as rejected promises /
//! thrown `Error`s whose message is the [`Error`]'s text.
//!
//! ```js
//! const engine = await WebEngine.create();            // WebGPU adapter + device (kernels compile as models load)
//! engine.stage_file("config.json", bytes);            // small files: copied into wasm memory
//! engine.stage_source("model.gguf", size, (offset, length) => bytes);  // weights: read by ranges
//! const info = JSON.parse(await engine.load_target(2048, undefined, (done, total) => {}));
//! info.wasm_memory_bytes;                              // wasm memory after the load
//! const out = JSON.parse(await engine.generate(JSON.stringify({ prompt: "Hi", draft: "ngram" }),
//!     (id, text, fromDraft) => true));                // return false to stop
//! engine.free();                                      // GPU memory back
//! ```
//!
//! The package's Web Worker (`www/lib/worker.js`) drives this class; pages use `www/lib/wgspec.js`.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use js_sys::Function;
use wasm_bindgen::prelude::*;

use crate::engine::{Completion, DraftKind, Engine, ModelInfo, Request, Role, TokenEvent};
use crate::error::Error;
use crate::files::ModelFiles;
use crate::generation::FinishReason;
use crate::gpu::Gpu;
use crate::loader::source::{Prefix, Source};
use crate::model::{Checkpoint, LoadOptions, LoadProgress, Model, DEFAULT_READ_BYTES};
use crate::openai::response::Chunk;
use crate::openai::{self, Endpoint, ErrorReply, Parsed, Reply, Shape, Stream};
use crate::tokenizer::Message;

fn js_err(e: Error) -> JsError {
    JsError::new(&e.to_string())
}

/// The engine slot.
#[derive(Default)]
enum Slot {
    /// No target is loaded (or its load failed).
    #[default]
    Empty,
    Ready(Box<Engine>),
    /// A generation or a load holds the engine until its promise settles.
    Busy,
}

impl Slot {
    /// The engine, or why there is none.
    fn engine(&mut self) -> crate::Result<&mut Engine> {
        match self {
            Slot::Ready(engine) => Ok(engine),
            Slot::Busy => Err(Error::Busy("a generation is running".into())),
            Slot::Empty => Err(Error::InvalidArgument("no target model is loaded".into())),
        }
    }
}

/// A WebGPU device with (once loaded) a target model, an optional draft and their tokenizer.
#[wasm_bindgen]
pub struct WebEngine {
    gpu: Arc<Gpu>,
    /// Files staged for the next `load_target` / `load_draft`.
    staged: ModelFiles,
    slot: Rc<RefCell<Slot>>,
    /// The most bytes of a weight file read into wasm memory at once.
    read_bytes: u64,
}

/// A weight file read through a synchronous JS function `(offset, length) => Uint8Array`
/// (in the package's worker: `FileSystemSyncAccessHandle.read` on the origin-private file
/// system, or a slice of bytes held by JS), so the file is never whole in wasm memory.
pub struct JsSource {
    len: u64,
    read: Function,
    /// `ready(end)`: undefined when the bytes before `end` can be read, else a promise that
    /// resolves when they can (a download in progress) or rejects (the download failed).
    ready: Option<Function>,
}

impl JsSource {
    /// A file of `len` bytes read by `read(offset, length) => Uint8Array`, whose bytes before
    /// `end` can be read once `ready(end)` (if given) has resolved.
    pub fn new(len: u64, read: Function, ready: Option<Function>) -> JsSource {
        JsSource { len, read, ready }
    }
}

impl Source for JsSource {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> crate::Result<()> {
        let failed = |why: String| Error::io("model file", why);
        let got = self
            .read
            .call2(&JsValue::NULL, &JsValue::from(offset as f64), &JsValue::from(buf.len() as f64))
            .map_err(|e| failed(format!("reading {} bytes at {offset}: {}", buf.len(), js_text(&e))))?;
        let bytes: js_sys::Uint8Array = got
            .dyn_into()
            .map_err(|_| failed(format!("reading {} bytes at {offset}: not a Uint8Array", buf.len())))?;
        if bytes.length() as usize != buf.len() {
            return Err(failed(format!("asked {} bytes at {offset}, got {}", buf.len(), bytes.length())));
        }
        bytes.copy_to(buf);
        Ok(())
    }

    fn ready(&self, end: u64) -> Option<crate::loader::source::Wait<'_>> {
        let waiting = self.ready.as_ref()?.call1(&JsValue::NULL, &JsValue::from(end as f64));
        let promise = match waiting {
            Ok(v) if v.is_undefined() || v.is_null() => return None,
            Ok(v) => v
                .dyn_into::<js_sys::Promise>()
                .map_err(|_| "ready() returned neither undefined nor a promise".to_string()),
            Err(e) => Err(js_text(&e)),
        };
        Some(Box::pin(async move {
            let failed =
                |why: String| Error::io("model file", format!("waiting for its first {end} bytes: {why}"));
            let promise = promise.map_err(failed)?;
            wasm_bindgen_futures::JsFuture::from(promise).await.map_err(|e| failed(js_text(&e)))?;
            Ok(())
        }))
    }
}

/// A thrown JS value as text: an `Error`'s message, a string, or its debug form.
fn js_text(e: &JsValue) -> String {
    e.dyn_ref::<js_sys::Error>()
        .map(|e| String::from(e.message()))
        .or_else(|| e.as_string())
        .unwrap_or_else(|| format!("{e:?}"))
}

/// Bytes of wasm linear memory: it grows and never shrinks, so this is the peak so far.
fn wasm_memory_bytes() -> u64 {
    core::arch::wasm32::memory_size(0) as u64 * 65536
}

/// Calls the JS progress callback with (bytes of the weights uploaded, their total).
fn progress_to(callback: &Function) -> impl FnMut(Role, LoadProgress) + '_ {
    move |_, p| {
        let _ = callback.call2(
            &JsValue::NULL,
            &JsValue::from(p.bytes_done as f64),
            &JsValue::from(p.bytes_total as f64),
        );
    }
}

/// Puts `engine` back into `slot` after a head load and turns its JSON summary (or error) into
/// the promise's value.
fn put_back(slot: &RefCell<Slot>, engine: Engine, loaded: crate::Result<String>) -> Result<JsValue, JsValue> {
    *slot.borrow_mut() = Slot::Ready(Box::new(engine));
    let info = loaded.map_err(|e| JsValue::from(js_err(e)))?;
    Ok(JsValue::from_str(&info))
}

/// The model's summary, with the wasm memory after loading it (`wasm_memory_bytes`).
fn to_json(info: &ModelInfo) -> Result<String, JsError> {
    let bad = |e: serde_json::Error| js_err(Error::InvalidArgument(format!("model info: {e}")));
    let mut v = serde_json::to_value(info).map_err(bad)?;
    if let Some(map) = v.as_object_mut() {
        map.insert("wasm_memory_bytes".into(), wasm_memory_bytes().into());
    }
    serde_json::to_string(&v).map_err(bad)
}

#[wasm_bindgen]
impl WebEngine {
    /// Opens the WebGPU adapter and device. Rejects when WebGPU is missing or the adapter lacks a
    /// limit wgspec needs.
    pub async fn create() -> Result<WebEngine, JsError> {
        let gpu = Gpu::new().await.map_err(js_err)?;
        // Models share the GPU through an Arc (natively across threads); the browser's WebGPU
        // objects are not Send, and one worker thread owns them all.
        #[allow(clippy::arc_with_non_send_sync)]
        Ok(WebEngine {
            gpu: Arc::new(gpu),
            staged: ModelFiles::new(),
            slot: Rc::default(),
            read_bytes: DEFAULT_READ_BYTES,
        })
    }

    /// The adapter, in one line.
    pub fn adapter(&self) -> String {
        self.gpu.describe()
    }

    /// Copies one model file into wasm memory (`model.gguf`, or `config.json`, `tokenizer.json`,
    /// `tokenizer_config.json`, `*.safetensors`). Drop the JS copy afterwards.
    pub fn stage_file(&mut self, name: &str, bytes: Vec<u8>) -> Result<(), JsError> {
        self.staged.add(name, bytes).map_err(js_err)
    }

    /// Stages a weight file (`model.gguf` or `*.safetensors`) of `length` bytes, read by
    /// `read(offset, length)`, which must return a `Uint8Array` of exactly `length` bytes
    /// synchronously. Loading reads the header, then the weights a batch of rows at a time. For a
    /// file still downloading, `ready(end)` returns undefined when its bytes before `end` are in,
    /// else a promise of them: the load waits for each batch (the header must be in at staging).
    pub fn stage_source(
        &mut self,
        name: &str,
        length: f64,
        read: Function,
        ready: Option<Function>,
    ) -> Result<(), JsError> {
        if !(length >= 0.0 && length <= 2f64.powi(53)) {
            return Err(js_err(Error::InvalidArgument(format!("{name}: a length of {length} bytes"))));
        }
        self.staged.add_source(name, Box::new(JsSource::new(length as u64, read, ready))).map_err(js_err)
    }

    /// The most bytes of a weight file read into wasm memory at once while loading (default
    /// 8 MiB; at least 8 rows of a matrix are read).
    pub fn set_read_bytes(&mut self, bytes: u32) {
        self.read_bytes = u64::from(bytes.max(1));
    }

    /// Bytes of wasm memory now (it never shrinks: the peak so far).
    pub fn wasm_memory_bytes(&self) -> f64 {
        wasm_memory_bytes() as f64
    }

    /// Checks a GGUF model from the first bytes of its file (`prefix`, of a file of `file_len`
    /// bytes) before the rest is downloaded, as the next model to load: its header, and its GPU
    /// needs against the adapter's limits and the budget. With no target loaded it is a target
    /// of `context` positions within `max_memory_mb`; with one, it is the target's draft model,
    /// checked by the engine as `load_draft` will be (the target's context, what the target and
    /// the heads left of the budget; `context` and `max_memory_mb` are not used). Resolves to
    /// JSON: `{"need": n}` when the header needs the first n bytes, else `{"gpu_memory_bytes":
    /// n, "context": c}`; a model that cannot load throws, naming the limit.
    pub fn check_gguf(
        &self,
        prefix: Vec<u8>,
        file_len: f64,
        context: Option<u32>,
        max_memory_mb: Option<u32>,
    ) -> Result<String, JsError> {
        let file = Prefix { bytes: prefix, len: file_len.max(0.0) as u64 };
        let have = file.bytes.len() as u64;
        let ckpt = match Checkpoint::from_gguf_source(Box::new(file)) {
            Err(Error::Truncated { offset, needed, .. }) if offset.saturating_add(needed) > have => {
                return Ok(format!("{{\"need\":{}}}", offset.saturating_add(needed)))
            }
            other => other.map_err(js_err)?,
        };
        let bill = match &*self.slot.borrow() {
            Slot::Ready(engine) => engine.plan_draft(&ckpt),
            _ => Model::plan(&self.gpu, &ckpt, &self.options(context, max_memory_mb)),
        };
        let bill = bill.map_err(js_err)?;
        Ok(format!("{{\"gpu_memory_bytes\":{},\"context\":{}}}", bill.total, bill.context))
    }

    /// Loads the staged files as the target (replacing any target and draft), with `context`
    /// KV positions (default: min(model context, 4096)) and at most `max_memory_mb` MB of GPU
    /// memory for the target and its draft together (weights, KV cache, scratch; no limit by
    /// default): a model over it is refused before anything is allocated. Resolves to a JSON
    /// summary once the weights are on the GPU (waiting for files still arriving: see
    /// [`WebEngine::stage_source`]); the engine is busy meanwhile.
    pub fn load_target(
        &mut self,
        context: Option<u32>,
        max_memory_mb: Option<u32>,
        on_progress: Function,
    ) -> Result<js_sys::Promise, JsError> {
        {
            let mut slot = self.slot.borrow_mut();
            if matches!(*slot, Slot::Busy) {
                return Err(js_err(Error::Busy("the engine is busy (a generation or a load)".into())));
            }
            *slot = Slot::Empty; // frees the previous models' GPU memory first
        }
        let opened = std::mem::take(&mut self.staged).open().map_err(js_err)?;
        let opts = self.options(context, max_memory_mb);
        let (gpu, slot) = (self.gpu.clone(), self.slot.clone());
        *slot.borrow_mut() = Slot::Busy;
        Ok(wasm_bindgen_futures::future_to_promise(async move {
            let loaded = Engine::load_async(gpu, opened, &opts, &mut progress_to(&on_progress)).await;
            let mut s = slot.borrow_mut();
            *s = Slot::Empty;
            let engine = loaded.map_err(|e| JsValue::from(js_err(e)))?;
            let info = to_json(engine.target_info()).map_err(JsValue::from)?;
            *s = Slot::Ready(Box::new(engine));
            Ok(JsValue::from_str(&info))
        }))
    }

    /// Loads the staged files as the draft model (same tokenizer as the target, else an error);
    /// resolves to its JSON summary, as [`WebEngine::load_target`] does.
    pub fn load_draft(&mut self, on_progress: Function) -> Result<js_sys::Promise, JsError> {
        self.ready(&mut self.slot.borrow_mut())?;
        let opened = std::mem::take(&mut self.staged).open().map_err(js_err)?;
        let mut engine = self.take_engine()?;
        let slot = self.slot.clone();
        Ok(wasm_bindgen_futures::future_to_promise(async move {
            let loaded = engine.load_draft_async(opened, &mut progress_to(&on_progress)).await.map(to_json);
            *slot.borrow_mut() = Slot::Ready(Box::new(engine));
            let info = loaded.map_err(|e| JsValue::from(js_err(e)))?.map_err(JsValue::from)?;
            Ok(JsValue::from_str(&info))
        }))
    }

    /// Loads the staged files (`medusa_lm_head.safetensors` or other `*.safetensors` shards, and
    /// optionally the heads' `config.json`) as Medusa heads for the target (within what the
    /// target and the draft left of the memory budget); resolves to `{heads, layers,
    /// gpu_weight_bytes}` once they are on the GPU. Requests then speculate with them when they
    /// ask for `draft: "medusa"`.
    pub fn load_medusa(&mut self, on_progress: Function) -> Result<js_sys::Promise, JsError> {
        self.ready(&mut self.slot.borrow_mut())?;
        let files = std::mem::take(&mut self.staged);
        let mut engine = self.take_engine()?;
        let slot = self.slot.clone();
        Ok(wasm_bindgen_futures::future_to_promise(async move {
            let loaded = engine.load_medusa_async(files, &mut progress_to(&on_progress)).await.map(|h| {
                let c = h.config;
                serde_json::json!({"heads": c.heads, "layers": c.layers, "gpu_weight_bytes": h.weight_bytes()})
                    .to_string()
            });
            put_back(&slot, engine, loaded)
        }))
    }

    /// Loads the staged files (`config.json` and `model.safetensors`, the public EAGLE-1/2 or
    /// EAGLE-3 layout) as an EAGLE head for the target (within what the models and heads loaded before
    /// left of the memory budget); resolves to `{gpu_weight_bytes, gpu_memory_bytes}` once it is on
    /// the GPU. Requests then speculate with it when they ask for `draft: "eagle"`.
    pub fn load_eagle(&mut self, on_progress: Function) -> Result<js_sys::Promise, JsError> {
        self.ready(&mut self.slot.borrow_mut())?;
        let files = std::mem::take(&mut self.staged);
        let mut engine = self.take_engine()?;
        let slot = self.slot.clone();
        Ok(wasm_bindgen_futures::future_to_promise(async move {
            let loaded = engine.load_eagle_async(files, &mut progress_to(&on_progress)).await.map(|h| {
                serde_json::json!({"gpu_weight_bytes": h.weight_bytes(), "gpu_memory_bytes": h.memory_bytes()})
                    .to_string()
            });
            put_back(&slot, engine, loaded)
        }))
    }

    /// The draft of requests that name none (`"model"`, `"eagle+ngram"`, `"none"`): the draft
    /// loaded last, unless `set_default_draft` chose another.
    pub fn default_draft(&self) -> Result<String, JsError> {
        let mut slot = self.slot.borrow_mut();
        Ok(self.ready(&mut slot)?.default_draft().to_string())
    }

    /// Sets the draft of requests that name none (a request's `draft` name, such as `"ngram"`);
    /// refused when it needs a draft that is not loaded.
    pub fn set_default_draft(&mut self, kind: &str) -> Result<(), JsError> {
        let kind: DraftKind = kind.parse().map_err(js_err)?;
        let mut slot = self.slot.borrow_mut();
        self.ready(&mut slot)?.set_default_draft(kind).map_err(js_err)
    }

    /// Drops the draft model (its GPU memory is freed).
    pub fn unload_draft(&mut self) -> Result<(), JsError> {
        let mut slot = self.slot.borrow_mut();
        self.ready(&mut slot)?.set_draft(None).map_err(js_err)
    }

    /// The prompt text of a JSON array of `{role, content}` under the target's chat template.
    pub fn chat_prompt(&self, messages_json: &str) -> Result<String, JsError> {
        let messages: Vec<Message> = serde_json::from_str(messages_json)
            .map_err(|e| js_err(Error::InvalidArgument(format!("messages: {e}"))))?;
        let mut slot = self.slot.borrow_mut();
        self.ready(&mut slot)?.chat_prompt(&messages).map_err(js_err)
    }

    /// Runs a JSON request (see [`Request`]); `on_token(id, text, fromDraft)` is called for every
    /// committed token (`id` undefined for the final flush of held-back text); returning `false`
    /// stops generation. Resolves to the JSON [`crate::engine::Completion`].
    pub fn generate(&self, request_json: &str, on_token: Function) -> Result<js_sys::Promise, JsError> {
        let req = Request::from_json(request_json).map_err(js_err)?;
        let emit = move |ev: &TokenEvent| {
            let id = ev.id.map_or(JsValue::UNDEFINED, JsValue::from);
            let text = JsValue::from_str(&ev.text);
            match on_token.call3(&JsValue::NULL, &id, &text, &JsValue::from_bool(ev.from_draft)) {
                // Only an explicit `false` stops; a callback returning nothing goes on.
                Ok(v) => v.as_bool() != Some(false),
                Err(_) => false,
            }
        };
        let running = self.run(req, None, Box::new(emit))?;
        Ok(wasm_bindgen_futures::future_to_promise(async move {
            let out = running.await.map_err(|e| JsValue::from(js_err(e)))?;
            let json = serde_json::to_string(&out)
                .map_err(|e| JsValue::from(js_err(Error::InvalidArgument(format!("result: {e}")))))?;
            Ok(JsValue::from_str(&json))
        }))
    }

    /// Runs an OpenAI request body (`endpoint`: `"chat"` for chat completions, `"completions"`)
    /// as the HTTP server does, from the same library code: the same parser
    /// ([`crate::openai::parse`]: fields, defaults such as temperature 1, refusals naming the
    /// field), the prompt tokenized within the context and the reply fitted to it
    /// ([`crate::openai::Parsed::ready`]), and the same answers ([`crate::openai::response`]),
    /// carrying `model` as their model name.
    ///
    /// With `stream`, `on_chunk(chunk)` gets each chunk as JSON text, in order (the first and the
    /// last ones included); it is also called with `null` for a token whose text is held back.
    /// Returning `false` stops the generation. Resolves to JSON `{"completion", "response"}`: the
    /// engine's [`crate::engine::Completion`], and the whole answer (null with `stream`).
    ///
    /// Rejects with an `Error` whose `status` and `error` (`{message, type, param, code}`) are
    /// the server's answer to the same request, or, when `on_chunk` stopped it, an `AbortError`.
    pub fn generate_openai(
        &self,
        endpoint: &str,
        body_json: &str,
        model: &str,
        on_chunk: Function,
    ) -> Result<js_sys::Promise, JsValue> {
        let endpoint = match endpoint {
            "chat" => Endpoint::Chat,
            "completions" => Endpoint::Completions,
            other => {
                let e = Error::InvalidArgument(format!("endpoint {other:?}: chat or completions"));
                return Err(api_err((&e).into()));
            }
        };
        let (parsed, prompt) = self.prepare_openai(endpoint, body_json).map_err(api_err)?;
        let chunks =
            Rc::new(RefCell::new(Stream::new(Shape::new(endpoint, model, parsed.include_usage, 1), 1)));
        let streamed = parsed.stream;
        let send = move |chunk: Option<&Chunk>| {
            let json = chunk.and_then(|c| serde_json::to_string(c).ok());
            let arg = json.map_or(JsValue::NULL, |j| JsValue::from_str(&j));
            // Only an explicit `false` stops.
            on_chunk.call1(&JsValue::NULL, &arg).is_ok_and(|v| v.as_bool() != Some(false))
        };
        let send = Rc::new(send);
        if streamed {
            for first in chunks.borrow().start() {
                send(Some(&first));
            }
        }
        let (events, sink) = (chunks.clone(), send.clone());
        let emit = move |ev: &TokenEvent| match streamed {
            true => sink(events.borrow_mut().token(0, ev).as_ref()),
            false => sink(None),
        };
        let running = self.run(parsed.request, Some(prompt), Box::new(emit))?;
        Ok(wasm_bindgen_futures::future_to_promise(async move {
            let completion = running.await.map_err(|e| api_err((&e).into()))?;
            if completion.finish_reason == FinishReason::Cancelled {
                return Err(abort_error());
            }
            let reply = Reply::from(completion.clone());
            let shape = chunks.borrow().shape.clone();
            let response = match streamed {
                true => {
                    for chunk in chunks.borrow_mut().finish(0, &reply) {
                        send(Some(&chunk));
                    }
                    None
                }
                false => Some(shape.response(std::slice::from_ref(&reply))),
            };
            let out = serde_json::json!({ "completion": completion, "response": response });
            Ok(JsValue::from_str(&out.to_string()))
        }))
    }
}

/// A JS `Error` carrying what the server answers (`reply`): `status` and `error` (`{message, type,
/// param, code}`), as the OpenAI client's `APIError` has them.
fn api_err(reply: ErrorReply) -> JsValue {
    let error = js_sys::Error::new(&reply.message);
    let body = reply.body();
    let fields = js_sys::JSON::parse(&body["error"].to_string()).unwrap_or(JsValue::NULL);
    let _ = js_sys::Reflect::set(&error, &"status".into(), &JsValue::from(reply.status));
    let _ = js_sys::Reflect::set(&error, &"error".into(), &fields);
    error.into()
}

/// The `Error` of a generation its caller stopped (named `AbortError`, as `fetch` names it).
fn abort_error() -> JsValue {
    let error = js_sys::Error::new("the generation was aborted");
    error.set_name("AbortError");
    error.into()
}

impl WebEngine {
    /// Parses an OpenAI body, tokenizes its prompt within the context and readies the request
    /// (the server's sequence: [`crate::openai::Parsed::ready`]).
    fn prepare_openai(&self, endpoint: Endpoint, body_json: &str) -> Result<(Parsed, Vec<u32>), ErrorReply> {
        let parsed = openai::parse(endpoint, body_json.as_bytes(), &[]).map_err(|e| ErrorReply::from(&e))?;
        // (one generation at a time: one choice of one prompt)
        let refused = |param: &str, message: String| {
            Err(ErrorReply::from(&Error::Request { message, param: Some(param.into()), code: None }))
        };
        if parsed.n > 1 {
            let (n, most) = (parsed.n, openai::MAX_CHOICES);
            return refused(
                "n",
                format!(
                    "`n` must be 1 in the browser (one choice), not {n}; `wgspec serve` answers up to {most}"
                ),
            );
        }
        if !parsed.more_prompts.is_empty() {
            let (count, most) = (1 + parsed.more_prompts.len(), openai::MAX_PROMPTS);
            return refused("prompt", format!("`prompt` must be one prompt in the browser, not a list of {count}; `wgspec serve` answers up to {most}"));
        }
        let mut slot = self.slot.borrow_mut();
        let engine = slot.engine().map_err(|e| ErrorReply::from(&e))?;
        let context = engine.target().context();
        let prompt = engine
            .prompter()
            .prompt_tokens_within(&parsed.request, context)
            .map_err(|e| ErrorReply::from(&e).with_param_if_none(parsed.prompt_field()))?;
        let missing = |kind: DraftKind| {
            engine.missing(kind).map(|what| format!("`draft` \"{}\": {what} not loaded", kind.name()))
        };
        let parsed = parsed.ready(&prompt, context, engine.default_draft(), &missing);
        Ok((parsed.map_err(|e| ErrorReply::from(&e))?, prompt))
    }

    /// Takes the engine out of its slot for one generation (`prompt`: already tokenized; `emit`
    /// gets each token event and returns false to stop); the future puts it back when it ends.
    fn run(
        &self,
        req: Request,
        prompt: Option<Vec<u32>>,
        mut emit: Box<dyn FnMut(&TokenEvent) -> bool>,
    ) -> Result<impl std::future::Future<Output = crate::Result<Completion>>, JsError> {
        let mut engine = self.take_engine()?;
        let slot = self.slot.clone();
        Ok(async move {
            let result = match prompt {
                Some(ids) => engine.generate_from(ids, &req, &mut emit).await,
                None => engine.generate(&req, &mut emit).await,
            };
            *slot.borrow_mut() = Slot::Ready(Box::new(engine));
            result
        })
    }
}

impl WebEngine {
    /// Takes the engine out of its slot for a generation or a draft load: the slot is busy until
    /// the promise settles and puts it back.
    fn take_engine(&self) -> Result<Engine, JsError> {
        let mut slot = self.slot.borrow_mut();
        self.ready(&mut slot)?;
        match std::mem::replace(&mut *slot, Slot::Busy) {
            Slot::Ready(engine) => Ok(*engine),
            other => {
                *slot = other;
                Err(js_err(Error::Busy("no engine".into())))
            }
        }
    }

    /// Load options from the JS arguments: `context` KV positions, at most `max_memory_mb` MB.
    fn options(&self, context: Option<u32>, max_memory_mb: Option<u32>) -> LoadOptions {
        LoadOptions {
            context: context.map(|c| c as usize),
            max_memory: max_memory_mb.map(|mb| u64::from(mb) * 1_000_000),
            read_bytes: self.read_bytes,
            ..Default::default()
        }
    }

    /// The engine, or why there is none.
    fn ready<'a>(&self, slot: &'a mut Slot) -> Result<&'a mut Engine, JsError> {
        slot.engine().map_err(js_err)
    }
}

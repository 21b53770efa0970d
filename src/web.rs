//! The browser facade (wasm32 only): a thin `#[wasm_bindgen]` class over [`Engine`]. No logic of
//! its own: files are staged as bytes, opened by [`ModelFiles`], loaded by [`Engine::load`], and
//! requests run through [`Engine::generate`]. Errors reach JavaScript as rejected promises /
//! thrown `Error`s whose message is the [`Error`]'s text.
//!
//! ```js
//! const engine = await WebEngine.create();            // WebGPU adapter + device, pipelines
//! engine.stage_file("model.gguf", bytes);             // or config.json, tokenizer.json, *.safetensors
//! const info = JSON.parse(engine.load_target(2048, undefined, (done, total) => {}));
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

use crate::engine::{Engine, ModelInfo, Request, Role};
use crate::error::Error;
use crate::files::ModelFiles;
use crate::gpu::Gpu;
use crate::model::{LoadOptions, LoadProgress};
use crate::openai::{self, Endpoint};
use crate::tokenizer::Message;

fn js_err(e: Error) -> JsError {
    JsError::new(&e.to_string())
}

/// The engine slot: empty before a target is loaded and while a generation holds the engine.
#[derive(Default)]
struct Slot {
    engine: Option<Engine>,
    busy: bool,
}

/// A WebGPU device with (once loaded) a target model, an optional draft and their tokenizer.
#[wasm_bindgen]
pub struct WebEngine {
    gpu: Arc<Gpu>,
    /// Files staged for the next `load_target` / `load_draft`.
    staged: ModelFiles,
    slot: Rc<RefCell<Slot>>,
}

/// Calls the JS progress callback with (tensors done, tensors total).
fn progress_to(callback: &Function) -> impl FnMut(Role, LoadProgress) + '_ {
    move |_, p| {
        let _ = callback.call2(
            &JsValue::NULL,
            &JsValue::from(p.tensors_done as u32),
            &JsValue::from(p.tensors_total as u32),
        );
    }
}

fn to_json(info: &ModelInfo) -> Result<String, JsError> {
    serde_json::to_string(info).map_err(|e| js_err(Error::InvalidArgument(format!("model info: {e}"))))
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
        Ok(WebEngine { gpu: Arc::new(gpu), staged: ModelFiles::new(), slot: Rc::default() })
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

    /// Loads the staged files as the target (replacing any target and draft), with `context`
    /// KV positions (default: min(model context, 4096)) and at most `max_memory_mb` MB of GPU
    /// memory for the target and its draft together (weights, KV cache, scratch; no limit by
    /// default): a model over it is refused before anything is allocated. Returns a JSON summary.
    pub fn load_target(
        &mut self,
        context: Option<u32>,
        max_memory_mb: Option<u32>,
        on_progress: &Function,
    ) -> Result<String, JsError> {
        let mut slot = self.slot.borrow_mut();
        if slot.busy {
            return Err(js_err(Error::Busy("a generation is running".into())));
        }
        slot.engine = None; // frees the previous models' GPU memory first
        let opened = std::mem::take(&mut self.staged).open().map_err(js_err)?;
        let opts = LoadOptions {
            context: context.map(|c| c as usize),
            max_memory: max_memory_mb.map(|mb| u64::from(mb) * 1_000_000),
            ..Default::default()
        };
        let engine =
            Engine::load(self.gpu.clone(), opened, &opts, &mut progress_to(on_progress)).map_err(js_err)?;
        let info = to_json(engine.target_info())?;
        slot.engine = Some(engine);
        Ok(info)
    }

    /// Loads the staged files as the draft model (same tokenizer as the target, else an error).
    pub fn load_draft(&mut self, on_progress: &Function) -> Result<String, JsError> {
        let mut slot = self.slot.borrow_mut();
        let engine = self.ready(&mut slot)?;
        let opened = std::mem::take(&mut self.staged).open().map_err(js_err)?;
        to_json(engine.load_draft(opened, &mut progress_to(on_progress)).map_err(js_err)?)
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
        self.run(req, None, on_token)
    }

    /// Runs an OpenAI request body (`endpoint`: `"chat"` for chat completions, `"completions"`),
    /// read by the same parser as the HTTP server's ([`crate::openai::parse`]): the same fields,
    /// defaults (temperature 1) and refusals (naming the field), and `max_tokens` fitted to the
    /// context. Streams and resolves as [`WebEngine::generate`] does.
    pub fn generate_openai(
        &self,
        endpoint: &str,
        body_json: &str,
        on_token: Function,
    ) -> Result<js_sys::Promise, JsError> {
        let endpoint = match endpoint {
            "chat" => Endpoint::Chat,
            "completions" => Endpoint::Completions,
            other => {
                return Err(js_err(Error::InvalidArgument(format!(
                    "endpoint {other:?}: chat or completions"
                ))))
            }
        };
        let parsed = openai::parse(endpoint, body_json.as_bytes(), &[]).map_err(js_err)?;
        let mut slot = self.slot.borrow_mut();
        let engine = self.ready(&mut slot)?;
        let mut req = parsed.request;
        let prompt = engine.prompt_tokens(&req).map_err(js_err)?;
        let field = if req.messages.is_some() { "messages" } else { "prompt" };
        req.max_tokens =
            openai::fit_context(prompt.len(), parsed.max_tokens, engine.target().context(), field)
                .map_err(js_err)?;
        drop(slot);
        self.run(req, Some(prompt), on_token)
    }
}

impl WebEngine {
    /// Takes the engine out of its slot for one generation (`prompt`: already tokenized) and
    /// puts it back when the promise settles.
    fn run(
        &self,
        req: Request,
        prompt: Option<Vec<u32>>,
        on_token: Function,
    ) -> Result<js_sys::Promise, JsError> {
        let mut engine = {
            let mut slot = self.slot.borrow_mut();
            self.ready(&mut slot)?;
            slot.busy = true;
            slot.engine.take().ok_or_else(|| js_err(Error::Busy("no engine".into())))?
        };
        let slot = self.slot.clone();
        Ok(wasm_bindgen_futures::future_to_promise(async move {
            let mut emit = |ev: &crate::engine::TokenEvent| {
                let id = ev.id.map_or(JsValue::UNDEFINED, JsValue::from);
                let text = JsValue::from_str(&ev.text);
                match on_token.call3(&JsValue::NULL, &id, &text, &JsValue::from_bool(ev.from_draft)) {
                    // Only an explicit `false` stops; a callback returning nothing goes on.
                    Ok(v) => v.as_bool() != Some(false),
                    Err(_) => false,
                }
            };
            let result = match prompt {
                Some(ids) => engine.generate_from(ids, &req, &mut emit).await,
                None => engine.generate(&req, &mut emit).await,
            };
            {
                let mut s = slot.borrow_mut();
                s.engine = Some(engine);
                s.busy = false;
            }
            let out = result.map_err(|e| JsValue::from(js_err(e)))?;
            let json = serde_json::to_string(&out)
                .map_err(|e| JsValue::from(js_err(Error::InvalidArgument(format!("result: {e}")))))?;
            Ok(JsValue::from_str(&json))
        }))
    }
}

impl WebEngine {
    /// The engine, or why there is none.
    fn ready<'a>(&self, slot: &'a mut Slot) -> Result<&'a mut Engine, JsError> {
        if slot.busy {
            return Err(js_err(Error::Busy("a generation is running".into())));
        }
        slot.engine.as_mut().ok_or_else(|| js_err(Error::InvalidArgument("no target model is loaded".into())))
    }
}

// wgspec Web Worker: owns the WebAssembly engine and the GPU device, downloads and caches model
// files, and runs generations. The page talks to it through `wgspec.js`; see the protocol below.
//
// Page -> worker (every message has a numeric `id`, except "abort"):
//   { id, type: "load", target, draft, context, maxMemoryMb, cache }  target/draft: absolute URLs (or "ngram")
//   { id, type: "generate", request, aborted }           request: the engine's request object
//   { id, type: "generate", openai, aborted }            openai: {endpoint: "chat"|"completions", body}
//   { id, type: "chatPrompt", messages }
//   { id, type: "dispose" }
//   { type: "abort", ids: [generate ids] }               handled at once, between GPU steps
// Worker -> page:
//   { id, type: "progress", event }                      event: see `WgSpec.load`'s onProgress
//   { id, type: "token", token, text, fromDraft }
//   { id, type: "result", value }
//   { id, type: "error", message }
//   { type: "fatal", message }                           an uncaught failure: every call fails
//
// Calls run one at a time in arrival order (the engine is single-threaded and must never be
// re-entered); "abort" is the exception and is processed while a generation awaits the GPU.

const CACHE_NAME = "wgspec-models-v1";

/** @type {any} the wasm WebEngine, once loaded */
let engine = null;
/** Generation ids whose abort was requested (checked by the token callback). */
const aborted = new Set();
/** Serializes calls: each one starts when the previous has settled. */
let chain = Promise.resolve();

self.addEventListener("message", (e) => {
  const msg = e.data || {};
  if (msg.type === "abort") {
    for (const id of msg.ids || []) aborted.add(id);
    return;
  }
  if (msg.type === "generate" && msg.aborted) aborted.add(msg.id); // its signal was already aborted
  chain = chain.then(() => handle(msg));
});

self.addEventListener("unhandledrejection", (e) => {
  self.postMessage({ type: "fatal", message: errorMessage(e.reason) });
});
self.addEventListener("error", (e) => {
  self.postMessage({ type: "fatal", message: e.message || "uncaught error in the wgspec worker" });
});

/** Runs one call and posts its result or error; never throws. */
async function handle(msg) {
  const { id } = msg;
  try {
    let value;
    switch (msg.type) {
      case "load":
        value = await load(msg, (event) => self.postMessage({ id, type: "progress", event }));
        break;
      case "generate":
        value = await generate(id, msg.request, msg.openai);
        break;
      case "chatPrompt":
        value = requireEngine().chat_prompt(JSON.stringify(msg.messages));
        break;
      case "dispose":
        if (engine) {
          engine.free();
          engine = null;
        }
        value = true;
        break;
      default:
        throw new Error(`unknown request type ${JSON.stringify(msg.type)}`);
    }
    self.postMessage({ id, type: "result", value });
  } catch (err) {
    self.postMessage({ id, type: "error", message: errorMessage(err) });
  } finally {
    aborted.delete(id);
  }
}

function requireEngine() {
  if (!engine) throw new Error("no model is loaded");
  return engine;
}

/** Turns anything thrown (Error, string, wasm-bindgen JsValue) into a readable message. */
function errorMessage(err) {
  if (err instanceof Error) return err.message || String(err);
  if (typeof err === "string") return err;
  try {
    return JSON.stringify(err);
  } catch {
    return String(err);
  }
}

// ---------------------------------------------------------------------------------------------
// Loading

/**
 * Creates the engine, downloads (or reads from the cache) and stages the target's files, loads
 * the target, then the draft model if one is given.
 */
async function load({ target, draft, context, maxMemoryMb, cache: useCache = true }, progress) {
  if (engine) throw new Error("this worker already holds a model; create a new WgSpec instance");
  if (!self.navigator || !self.navigator.gpu) {
    throw new Error(
      "WebGPU is not available in this browser (navigator.gpu is missing). Use a browser with " +
        "WebGPU enabled (Chrome/Edge 113+, Safari 26+, or Firefox with WebGPU), served over " +
        "https:// or http://localhost; headless Chromium needs --enable-unsafe-webgpu.",
    );
  }
  let core;
  try {
    core = await import("./wgspec_core.js");
    await core.default();
  } catch (err) {
    throw new Error(
      `could not load the WebAssembly module (wgspec_core.js and wgspec_core_bg.wasm must be ` +
        `served next to worker.js): ${errorMessage(err)}`,
    );
  }
  const created = await core.WebEngine.create();
  const cache = useCache ? await openCache() : null;
  try {
    await stageModel(created, target, "target", cache, progress);
    const info = JSON.parse(
      named(`the target model ${fileName(target)}`, () =>
        created.load_target(context ?? undefined, maxMemoryMb ?? undefined, (done, total) =>
          progress({ model: "target", phase: "upload", file: null, loaded: done, total }),
        ),
      ),
    );
    progress({ model: "target", phase: "ready", file: null, loaded: 1, total: 1 });

    let draftInfo = null;
    let draftKind = null;
    if (draft === "ngram") {
      draftKind = "ngram";
    } else if (draft) {
      await stageModel(created, draft, "draft", cache, progress);
      draftInfo = JSON.parse(
        named(`the draft model ${fileName(draft)}`, () =>
          created.load_draft((done, total) =>
            progress({ model: "draft", phase: "upload", file: null, loaded: done, total }),
          ),
        ),
      );
      draftKind = "model";
    }
    if (draftKind) progress({ model: "draft", phase: "ready", file: null, loaded: 1, total: 1 });
    engine = created;
    return { adapter: await describeAdapter(created.adapter()), info, draftInfo, draftKind };
  } catch (err) {
    created.free();
    throw err;
  }
}

/**
 * The adapter in one line. wgpu's description is empty in browsers, where WebGPU's own
 * `GPUAdapter.info` names the vendor and architecture (e.g. "google swiftshader (fallback)").
 * @param {string} fromEngine
 */
async function describeAdapter(fromEngine) {
  try {
    const adapter = await navigator.gpu.requestAdapter({ powerPreference: "high-performance" });
    const info = adapter?.info;
    if (!info) return fromEngine;
    const parts = [info.vendor, info.architecture, info.description].filter((p) => p);
    const fallback = (adapter.isFallbackAdapter ?? info.isFallbackAdapter) ? " (fallback adapter)" : "";
    return `WebGPU: ${parts.join(" ") || "unnamed adapter"}${fallback}`;
  } catch {
    return fromEngine;
  }
}

/** Runs `fn`, prefixing any error's message with what was being loaded. */
function named(what, fn) {
  try {
    return fn();
  } catch (err) {
    throw new Error(`${what}: ${errorMessage(err)}`);
  }
}

async function openCache() {
  try {
    return self.caches ? await self.caches.open(CACHE_NAME) : null;
  } catch {
    return null; // e.g. storage disabled: download every time
  }
}

/** Last path segment of a URL, for messages and progress events. */
function fileName(url) {
  const path = new URL(url).pathname.replace(/\/+$/, "");
  return decodeURIComponent(path.slice(path.lastIndexOf("/") + 1)) || url;
}

/**
 * Stages the files of one model. `url` is a .gguf file, or a Hugging Face folder (ending with
 * "/") holding config.json, tokenizer.json, optional tokenizer_config.json and
 * model.safetensors or model.safetensors.index.json with its shards.
 */
async function stageModel(eng, url, model, cache, progress) {
  const isFolder = new URL(url).pathname.endsWith("/");
  if (!isFolder) {
    await stageFile(eng, "model.gguf", url, model, cache, progress);
    return;
  }
  const at = (name) => new URL(name, url).href;
  await stageFile(eng, "config.json", at("config.json"), model, cache, progress);
  await stageFile(eng, "tokenizer.json", at("tokenizer.json"), model, cache, progress);
  await stageFile(eng, "tokenizer_config.json", at("tokenizer_config.json"), model, cache, progress, {
    optional: true,
  });
  const index = await download(at("model.safetensors.index.json"), model, cache, progress, {
    optional: true,
  });
  let shards = ["model.safetensors"];
  if (index) {
    const weightMap = JSON.parse(new TextDecoder().decode(index)).weight_map || {};
    shards = [...new Set(Object.values(weightMap))];
    if (shards.length === 0) throw new Error(`${at("model.safetensors.index.json")}: empty weight_map`);
  }
  for (const shard of shards) {
    await stageFile(eng, shard, at(shard), model, cache, progress);
  }
}

/** Downloads one file and copies it into wasm memory; the JS copy is dropped right after. */
async function stageFile(eng, name, url, model, cache, progress, { optional = false } = {}) {
  const bytes = await download(url, model, cache, progress, { optional });
  if (bytes) eng.stage_file(name, bytes);
  // `bytes` goes out of scope here: the wasm side holds the only copy.
}

/**
 * Returns the bytes of `url`, from the Cache API when present there (phase "cache"), else
 * downloaded (phase "download") and then stored in the cache. With `optional`, a 404 gives null.
 * @returns {Promise<Uint8Array|null>}
 */
async function download(url, model, cache, progress, { optional = false } = {}) {
  const file = fileName(url);
  let response = cache ? await cache.match(url).catch(() => undefined) : undefined;
  const cached = Boolean(response);
  if (!response) {
    try {
      response = await fetch(url);
    } catch (err) {
      throw new Error(`download failed: ${url}: ${errorMessage(err)}`);
    }
    if (optional && response.status === 404) return null;
    if (!response.ok) {
      const status = `HTTP ${response.status}${response.statusText ? " " + response.statusText : ""}`;
      throw new Error(`download failed: ${url}: ${status}`);
    }
  }
  const phase = cached ? "cache" : "download";
  const bytes = await readBody(response, url, (loaded, total) =>
    progress({ model, phase, file, loaded, total }),
  );
  if (cache && !cached && response.status === 200) {
    try {
      const headers = { "content-length": String(bytes.byteLength) };
      await cache.put(url, new Response(bytes, { headers }));
    } catch (err) {
      // Quota or storage errors only cost a download next time.
      console.warn(`wgspec: not cached: ${url}: ${errorMessage(err)}`);
    }
  }
  return bytes;
}

/**
 * Reads a response body with progress. With a known Content-Length (and no content encoding,
 * which would make it the compressed size) the bytes go straight into one preallocated array.
 */
async function readBody(response, url, onProgress) {
  const length = Number(response.headers.get("content-length"));
  const encoded = response.headers.get("content-encoding");
  const total = Number.isFinite(length) && length > 0 && !encoded ? length : null;
  if (!response.body) {
    const bytes = new Uint8Array(await response.arrayBuffer());
    onProgress(bytes.byteLength, bytes.byteLength);
    return bytes;
  }
  const reader = response.body.getReader();
  let buffer = new Uint8Array(total ?? 1 << 20);
  let loaded = 0;
  let lastReport = 0;
  onProgress(0, total);
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      if (loaded + value.byteLength > buffer.byteLength) {
        const grown = new Uint8Array(Math.max(buffer.byteLength * 2, loaded + value.byteLength));
        grown.set(buffer.subarray(0, loaded));
        buffer = grown;
      }
      buffer.set(value, loaded);
      loaded += value.byteLength;
      const now = performance.now();
      if (now - lastReport > 100) {
        lastReport = now;
        onProgress(loaded, total);
      }
    }
  } catch (err) {
    throw new Error(`download failed: ${url}: ${errorMessage(err)}`);
  }
  if (total !== null && loaded !== total) {
    throw new Error(`download failed: ${url}: got ${loaded} of ${total} bytes`);
  }
  onProgress(loaded, total ?? loaded);
  return loaded === buffer.byteLength ? buffer : buffer.subarray(0, loaded);
}

// ---------------------------------------------------------------------------------------------
// Generation

/**
 * Runs one generation (an engine request, or an OpenAI body read by the engine's OpenAI parser),
 * posting a "token" message per committed token; returns the result.
 */
async function generate(id, request, openai) {
  const eng = requireEngine();
  if (aborted.has(id)) {
    // Aborted while it waited for its turn: do not start it.
    const stats = { prompt_tokens: 0, generated_tokens: 0, target_forwards: 0 };
    return { prompt_tokens: [], tokens: [], from_draft: [], text: "", finish_reason: "cancelled", stats };
  }
  const onToken = (token, text, fromDraft) => {
    // `token` is undefined for the final flush of held-back text (not a token of its own).
    self.postMessage({ id, type: "token", token: token ?? null, text, fromDraft: Boolean(fromDraft) });
    return !aborted.has(id);
  };
  const json = openai
    ? await eng.generate_openai(openai.endpoint, JSON.stringify(openai.body), onToken)
    : await eng.generate(JSON.stringify(request), onToken);
  return JSON.parse(json);
}

// wgspec Web Worker: owns the WebAssembly engine and the GPU device, downloads and stores model
// files, and runs generations. The page talks to it through `wgspec.js`; see the protocol below.
//
// Page -> worker (every message has a numeric `id`, except "abort"):
//   { id, type: "load", target, draft, context, maxMemoryMb, readMb, stallSeconds, cache }
//                                                        target/draft: absolute URLs (or "ngram")
//   { id, type: "generate", request, aborted }           request: the engine's request object
//   { id, type: "generate", openai, aborted }            openai: {endpoint: "chat"|"completions", body, model}
//   { id, type: "chatPrompt", messages }
//   { id, type: "dispose" }
//   { type: "abort", ids: [generate ids] }               handled at once, between GPU steps
// Worker -> page:
//   { type: "ready" }                                    first, once this script runs
//   { id, type: "progress", event }                      event: see `WgSpec.load`'s onProgress
//   { id, type: "token", token, text, fromDraft }        an engine request's tokens
//   { id, type: "chunk", chunk }                         an OpenAI stream's chunks (JSON text)
//   { id, type: "started" }                              the request was accepted and runs
//   { id, type: "result", value }                        load: {adapter, info, draftInfo, draftKind, wasmMemoryBytes}
//   { id, type: "error", message, name, status, error }  status/error: an OpenAI refusal's
//   { type: "fatal", message }                           an uncaught failure: every call fails
//
// Calls run one at a time in arrival order (the engine is single-threaded and must never be
// re-entered); "abort" is the exception and is processed while a generation awaits the GPU.
//
// Model files. Weight files (.gguf, .safetensors) are never whole in wasm memory: the engine reads
// them by ranges, a batch of rows at a time (8 MiB by default, `readMb`), while it uploads them
// to the GPU, starting as soon as the header is in and waiting for each batch's bytes while the
// rest downloads. They stream from the network chunk by chunk into the origin-private file system
// (OPFS folder "wgspec-models-v1", one folder per file named by the SHA-256 of its URL: `data`,
// then `complete.json` written last once the whole body is in) and are read back through a
// FileSystemSyncAccessHandle; a complete copy is read with no request, a partial one is deleted
// and downloaded again. Before a download the storage estimate must leave room for it. Without
// OPFS sync access handles (or with `cache: false`) a download is held in a JS array outside wasm
// memory. A GGUF model is checked from its first bytes (header, adapter limits, `maxMemoryMb`)
// and refused before the rest is downloaded. Small JSON files (config, tokenizer) go through the
// Cache API ("wgspec-models-v1") and are copied into wasm memory.

import { fileName, STORE_NAME } from "./names.js";
// (static imports, and the .wasm as a `new URL(..., import.meta.url)`: what bundlers follow)
import initCore, { WebEngine } from "./wgspec_core.js";

/** The WebAssembly module, as this script's bundler placed it (next to it when unbundled). */
const WASM_URL = new URL("./wgspec_core_bg.wasm", import.meta.url);

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

self.postMessage({ type: "ready" });

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
    // an OpenAI refusal keeps its status and {message, type, param, code}; an abort its name
    const { name, status, error } = err instanceof Error ? err : {};
    self.postMessage({ id, type: "error", message: errorMessage(err), name, status, error });
  } finally {
    aborted.delete(id);
  }
}

function requireEngine() {
  if (!engine) throw new Error("no model is loaded");
  return engine;
}

/** Fetches and instantiates the WebAssembly module (once), naming its URL when that fails. */
async function initWasm() {
  const failed = (why) =>
    new Error(
      `could not load the WebAssembly module ${WASM_URL.href}: ${why}. It comes with wgspec.js and ` +
        `worker.js: a bundler that does not emit it needs wgspec_core_bg.wasm copied next to ` +
        `worker.js (see "Bundlers" in wgspec's README)`,
    );
  let response;
  try {
    response = await fetch(WASM_URL);
  } catch (err) {
    throw failed(errorMessage(err));
  }
  if (!response.ok) throw failed(`HTTP ${response.status}`);
  try {
    await initCore({ module_or_path: response });
  } catch (err) {
    throw failed(errorMessage(err));
  }
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
 * Creates the engine, stages the target's files (weights from the origin-private file system,
 * downloaded into it first when missing), loads the target, then the draft model if one is given.
 * Weight files are read a batch at a time while loading and closed once their model is loaded.
 */
async function load(
  { target, draft, medusa, eagle, context, maxMemoryMb, readMb, stallSeconds, cache: useCache = true },
  progress,
) {
  if (engine) throw new Error("this worker already holds a model; create a new WgSpec instance");
  if (!self.navigator || !self.navigator.gpu) {
    throw new Error(
      "WebGPU is not available in this browser (navigator.gpu is missing). Use a browser with " +
        "WebGPU enabled (Chrome/Edge 113+, Safari 26+, or Firefox with WebGPU), served over " +
        "https:// or http://localhost; headless Chromium needs --enable-unsafe-webgpu.",
    );
  }
  if (readMb != null && !(readMb >= 0.001 && readMb <= 4000)) {
    throw new Error(`readMb must be between 0.001 and 4000 (MB read at once while loading), not ${readMb}`);
  }
  stallSeconds ??= 60;
  if (!(stallSeconds > 0 && stallSeconds <= 3600)) {
    throw new Error(`stallSeconds must be in (0, 3600] (a download with no bytes for that long fails), not ${stallSeconds}`);
  }
  const stallMs = stallSeconds * 1000;
  await initWasm();
  const created = await WebEngine.create();
  if (readMb != null) created.set_read_bytes(Math.round(readMb * 1e6));
  const stores = {
    cache: useCache ? await openCache() : null,
    files: useCache ? await openStore() : null,
  };
  try {
    const targetName = `the target model ${fileName(target)}`;
    const targetFiles = await stageModel(created, target, {
      model: "target",
      what: targetName,
      stores,
      progress,
      stallMs,
      gpu: { context, maxMemoryMb },
    });
    const load = (files, what, model, upload) =>
      uploadStaged(files, what, (done, total) => progress({ model, phase: "upload", file: null, loaded: done, total }), upload);
    const info = await load(targetFiles, targetName, "target", (onUpload) =>
      created.load_target(context ?? undefined, maxMemoryMb ?? undefined, onUpload),
    );
    progress({ model: "target", phase: "ready", file: null, loaded: 1, total: 1 });

    let draftInfo = null;
    if (draft && draft !== "ngram") {
      const draftName = `the draft model ${fileName(draft)}`;
      // The engine checks the draft's header as load_draft will: the target's context, what the
      // target left of the budget.
      const draftLoad = { model: "draft", what: draftName, stores, progress, stallMs, gpu: {} };
      const draftFiles = await stageModel(created, draft, draftLoad);
      draftInfo = await load(draftFiles, draftName, "draft", (onUpload) => created.load_draft(onUpload));
    }
    const heads = { medusa: "the Medusa heads", eagle: "the EAGLE head" };
    const headInfo = {};
    for (const [kind, url] of [["medusa", medusa], ["eagle", eagle]]) {
      if (!url) continue;
      const what = `${heads[kind]} ${fileName(url)}`;
      const files = await stageHeads(created, url, { model: "draft", what, stores, progress, stallMs }, kind);
      headInfo[kind] = await load(files, what, "draft", (onUpload) =>
        kind === "medusa" ? created.load_medusa(onUpload) : created.load_eagle(onUpload),
      );
    }
    const medusaInfo = headInfo.medusa ?? null;
    const eagleInfo = headInfo.eagle ?? null;
    // the engine's default draft: the one loaded last, or the n-gram named alone
    if (draft === "ngram" && !medusa && !eagle) created.set_default_draft("ngram");
    const draftKind = created.default_draft() === "none" ? null : created.default_draft();
    if (draftKind) progress({ model: "draft", phase: "ready", file: null, loaded: 1, total: 1 });
    engine = created;
    return {
      adapter: await describeAdapter(created.adapter()),
      info,
      draftInfo,
      medusaInfo,
      eagleInfo,
      draftKind,
      wasmMemoryBytes: created.wasm_memory_bytes(),
    };
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

/**
 * Uploads staged files to the GPU: `upload(onUpload)` starts the engine's load (reporting bytes
 * through `onUpload`); the files are closed once it settles and its errors name `what`. Resolves
 * to the engine's JSON summary, parsed.
 */
async function uploadStaged(files, what, onUpload, upload) {
  return JSON.parse(await closingAfter(files, () => namedAsync(what, () => upload(onUpload))));
}

/** Runs `fn`, prefixing any error's message with what was being loaded. */
function named(what, fn) {
  try {
    return fn();
  } catch (err) {
    throw new Error(`${what}: ${errorMessage(err)}`);
  }
}

/** Awaits `fn()`, prefixing any error's message with what was being loaded. */
async function namedAsync(what, fn) {
  try {
    return await fn();
  } catch (err) {
    throw new Error(`${what}: ${errorMessage(err)}`);
  }
}

/**
 * Awaits `fn()` (a load reading `files`, which may still be downloading), then their downloads
 * (stored complete), then closes them; when it throws, unfinished downloads are stopped.
 */
async function closingAfter(files, fn) {
  try {
    const result = await fn();
    await Promise.all(files.map((f) => f.done));
    return result;
  } finally {
    closeAll(files);
  }
}

/** @param {Array<WeightFile>} files */
function closeAll(files) {
  for (const f of files) {
    try {
      f.close();
    } catch (err) {
      console.warn(`wgspec: closing a weight file: ${errorMessage(err)}`);
    }
  }
}

async function openCache() {
  try {
    return self.caches ? await self.caches.open(STORE_NAME) : null;
  } catch {
    return null; // e.g. storage disabled: download every time
  }
}

/**
 * What loading one model needs.
 * @typedef {object} ModelLoad
 * @property {"target"|"draft"} model
 * @property {string} what the model in messages ("the target model x.gguf")
 * @property {{cache: Cache|null, files: FileSystemDirectoryHandle|null}} stores
 * @property {(event: object) => void} progress
 * @property {number} stallMs a download that gets no bytes for this long fails
 * @property {{context?: number, maxMemoryMb?: number}} gpu what a GGUF target is checked against
 *   (a draft: `{}`, the engine checks it against the target it holds)
 *   before its weights are downloaded
 */

/**
 * A weight file staged as a read function; `close` releases its storage (an OPFS handle).
 * A weight file to stage: `read` its bytes, `ready(end)` undefined once the first `end` bytes can
 * be read, else a promise of them (a download in progress; absent for a stored copy), `done`
 * settled when its download has finished and been stored, `close` (which stops a download).
 * @typedef {{size: number, read: (offset: number, length: number) => Uint8Array,
 *   ready?: (end: number) => Promise<void>|undefined, done?: Promise<number>, close: () => void}} WeightFile
 */

/**
 * Stages the files of one model. `url` is a .gguf file, or a Hugging Face folder (ending with
 * "/") holding config.json, tokenizer.json, optional tokenizer_config.json and
 * model.safetensors or model.safetensors.index.json with its shards.
 * @param {any} eng the WebEngine
 * @param {string} url
 * @param {ModelLoad} load
 * @returns {Promise<Array<WeightFile>>} the staged weight files, to close after loading
 */
async function stageModel(eng, url, load) {
  const files = [];
  try {
    const isFolder = new URL(url).pathname.endsWith("/");
    if (!isFolder) {
      files.push(await stageWeights(eng, "model.gguf", url, load, { checkGguf: true }));
      return files;
    }
    const at = (name) => new URL(name, url).href;
    await stageFile(eng, "config.json", at("config.json"), load);
    await stageFile(eng, "tokenizer.json", at("tokenizer.json"), load);
    await stageFile(eng, "tokenizer_config.json", at("tokenizer_config.json"), load, { optional: true });
    const index = await download(at("model.safetensors.index.json"), load, { optional: true });
    let shards = ["model.safetensors"];
    if (index) {
      const weightMap = JSON.parse(new TextDecoder().decode(index)).weight_map || {};
      shards = [...new Set(Object.values(weightMap))];
      if (shards.length === 0) throw new Error(`${at("model.safetensors.index.json")}: empty weight_map`);
    }
    for (const shard of shards) {
      files.push(await stageWeights(eng, shard, at(shard), load, { checkGguf: false }));
    }
    return files;
  } catch (err) {
    closeAll(files);
    throw err;
  }
}

/**
 * Stages draft heads. Medusa: a `.safetensors` file, or a folder URL ending with "/" holding an
 * optional `config.json` and `medusa_lm_head.safetensors`. EAGLE: a folder URL ending with "/"
 * holding `config.json` and `model.safetensors`. Returns the opened weight files.
 */
async function stageHeads(eng, url, load, kind = "medusa") {
  const files = [];
  try {
    const folder = new URL(url).pathname.endsWith("/");
    if (!folder && kind === "eagle") throw new Error(`${url}: an EAGLE head is a folder URL ending with "/"`);
    if (!folder) {
      files.push(await stageWeights(eng, "heads.safetensors", url, load, { checkGguf: false }));
      return files;
    }
    const at = (name) => new URL(name, url).href;
    await stageFile(eng, "config.json", at("config.json"), load, { optional: kind === "medusa" });
    const weights = kind === "eagle" ? "model.safetensors" : "medusa_lm_head.safetensors";
    files.push(await stageWeights(eng, weights, at(weights), load, { checkGguf: false }));
    return files;
  } catch (err) {
    closeAll(files);
    throw err;
  }
}

/** Downloads one small (JSON) file and copies it into wasm memory; the JS copy is dropped right after. */
async function stageFile(eng, name, url, load, { optional = false } = {}) {
  const bytes = await download(url, load, { optional });
  if (bytes) eng.stage_file(name, bytes);
  // `bytes` goes out of scope here: the wasm side holds the only copy.
}

/** Opens one weight file (see {@link openWeights}) and stages it as a read function. */
async function stageWeights(eng, name, url, load, { checkGguf }) {
  const file = await openWeights(eng, url, load, { checkGguf });
  try {
    eng.stage_source(name, file.size, file.read, file.ready);
  } catch (err) {
    file.close();
    throw err;
  }
  return file;
}

/**
 * Returns the bytes of a small file, from the Cache API when present there (phase "cache"),
 * else downloaded (phase "download") and then stored in the cache. With `optional`, a 404
 * gives null.
 * @param {string} url
 * @param {ModelLoad} load
 * @returns {Promise<Uint8Array|null>}
 */
async function download(url, { model, stores, progress, stallMs }, { optional = false } = {}) {
  const file = fileName(url);
  const cache = stores.cache;
  let response = cache ? await cache.match(url).catch(() => undefined) : undefined;
  const cached = Boolean(response);
  if (!response) {
    response = await request(url, { optional, stallMs });
    if (!response) return null;
  }
  const phase = cached ? "cache" : "download";
  const total = contentLength(response);
  const sink = memorySink(total);
  const loaded = await readBody(response, url, sink, total, stallMs, (loaded, total) =>
    progress({ model, phase, file, loaded, total }),
  );
  const bytes = sink.bytes(loaded);
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
 * Fetches `url`: the response, or null for a 404 of an `optional` file; any other failure
 * throws naming the URL and the HTTP status. `noStore`: keep it out of the HTTP cache (a file
 * stored in OPFS needs no second copy there). `signal`: aborts the request and its body.
 * @returns {Promise<Response|null>}
 */
async function request(url, { optional = false, noStore = false, signal = undefined, stallMs } = {}) {
  let response;
  try {
    response = await within(fetch(url, { ...(noStore ? { cache: "no-store" } : {}), signal }), stallMs);
  } catch (err) {
    // (a caller with a `signal` stops the request; without one it is left to end by itself)
    if (err === STALLED) throw new Error(`download stalled: ${url}: no answer for ${stallMs / 1000} s`);
    throw new Error(`download failed: ${url}: ${errorMessage(err)}`);
  }
  if (optional && response.status === 404) return null;
  if (!response.ok) {
    const status = `HTTP ${response.status}${response.statusText ? " " + response.statusText : ""}`;
    throw new Error(`download failed: ${url}: ${status}`);
  }
  return response;
}

/** The body's length in bytes, or null when unknown (or the compressed size of an encoded body). */
function contentLength(response) {
  const length = Number(response.headers.get("content-length"));
  const encoded = response.headers.get("content-encoding");
  return Number.isFinite(length) && length > 0 && !encoded ? length : null;
}

/**
 * Where a download's bytes go, chunk by chunk.
 * @typedef {object} Sink
 * @property {(chunk: Uint8Array, at: number) => void} write
 * @property {(length: number) => Uint8Array} prefix the first `length` bytes written
 */

/**
 * A JS array (outside wasm memory): preallocated when the length is known, else grown.
 * @param {number|null} total
 * @returns {Sink & {bytes: (length: number) => Uint8Array}}
 */
function memorySink(total) {
  let buffer = new Uint8Array(total ?? 1 << 20);
  return {
    write(chunk, at) {
      if (at + chunk.byteLength > buffer.byteLength) {
        const grown = new Uint8Array(Math.max(buffer.byteLength * 2, at + chunk.byteLength));
        grown.set(buffer.subarray(0, at));
        buffer = grown;
      }
      buffer.set(chunk, at);
    },
    prefix: (length) => buffer.subarray(0, length),
    bytes: (length) => (length === buffer.byteLength ? buffer : buffer.subarray(0, length)),
  };
}

/**
 * A file of the origin-private file system, written and read through its sync access handle.
 * @param {FileSystemSyncAccessHandle} handle
 * @param {string} file for messages
 * @returns {Sink}
 */
function fileSink(handle, file) {
  return {
    write(chunk, at) {
      let written;
      try {
        written = handle.write(chunk, { at });
      } catch (err) {
        throw new Error(`storing ${file} in the browser's storage failed: ${errorMessage(err)}`);
      }
      if (written !== chunk.byteLength) {
        throw new Error(`storing ${file} in the browser's storage failed: wrote ${written} of ${chunk.byteLength} bytes`);
      }
    },
    prefix: (length) => readHandle(handle, 0, length, file),
  };
}

/** `length` bytes at `offset` of an OPFS file; throws when fewer are there. */
function readHandle(handle, offset, length, file) {
  const bytes = new Uint8Array(length);
  const got = handle.read(bytes, { at: offset });
  if (got !== length) throw new Error(`${file}: read ${got} of ${length} bytes at ${offset} from the browser's storage`);
  return bytes;
}

/**
 * Reads a response body into `sink` chunk by chunk, with progress (at most every 100 ms).
 * `onChunk(loaded)` runs after each chunk; when it (or the download) fails, the download is
 * cancelled, progress reports where it stopped and the error is thrown. A body shorter or
 * longer than a known `total` is an error.
 * @returns {Promise<number>} the bytes read
 */
async function readBody(response, url, sink, total, stallMs, onProgress, onChunk = () => {}) {
  if (!response.body) {
    const bytes = new Uint8Array(await response.arrayBuffer());
    sink.write(bytes, 0);
    onChunk(bytes.byteLength);
    onProgress(bytes.byteLength, bytes.byteLength);
    return bytes.byteLength;
  }
  const reader = response.body.getReader();
  let loaded = 0;
  let lastReport = 0;
  onProgress(0, total);
  try {
    for (;;) {
      let step;
      try {
        step = await within(reader.read(), stallMs);
      } catch (err) {
        if (err === STALLED) {
          const of = total === null ? "" : ` of ${total}`;
          throw new Error(`download stalled: ${url}: no bytes for ${stallMs / 1000} s (${loaded}${of} bytes in)`);
        }
        throw new Error(`download failed: ${url}: ${errorMessage(err)}`);
      }
      if (step.done) break;
      sink.write(step.value, loaded);
      loaded += step.value.byteLength;
      const now = performance.now();
      if (now - lastReport > 100) {
        lastReport = now;
        onProgress(loaded, total);
      }
      onChunk(loaded);
    }
  } catch (err) {
    reader.cancel().catch(() => {});
    onProgress(loaded, total); // where it stopped
    throw err;
  }
  if (total !== null && loaded !== total) {
    throw new Error(`download failed: ${url}: got ${loaded} of ${total} bytes`);
  }
  onProgress(loaded, total ?? loaded);
  return loaded;
}

/** What {@link within} rejects with when its time is up. */
const STALLED = Symbol("stalled");

/**
 * `promise`, or a rejection with {@link STALLED} once `ms` have passed without it settling (no
 * limit unless `ms` is positive).
 */
async function within(promise, ms) {
  if (!(ms > 0)) return promise;
  let timer;
  const late = new Promise((_, reject) => (timer = setTimeout(() => reject(STALLED), ms)));
  try {
    return await Promise.race([promise, late]);
  } finally {
    clearTimeout(timer);
  }
}

// ---------------------------------------------------------------------------------------------
// Weight files: the origin-private file system, or JS memory

/** The OPFS folder of weight files (one folder per file, named by the SHA-256 of its URL). */
/** The most of a GGUF file's beginning its header may need (the engine's limit: 256 MiB). */
const MAX_GGUF_HEADER = 256 * 1024 * 1024;
/** Whether persistent storage has been asked for (once per worker). */
let persistAsked = false;

/**
 * The OPFS folder of weight files, or null where the browser has no origin-private file system
 * or no sync access handles (or storage is disabled).
 * @returns {Promise<FileSystemDirectoryHandle|null>}
 */
async function openStore() {
  try {
    const storage = self.navigator.storage;
    const syncHandles =
      typeof FileSystemFileHandle !== "undefined" && "createSyncAccessHandle" in FileSystemFileHandle.prototype;
    if (!storage?.getDirectory || !syncHandles || !self.crypto?.subtle) return null;
    const root = await storage.getDirectory();
    return await root.getDirectoryHandle(STORE_NAME, { create: true });
  } catch {
    return null;
  }
}

/** The folder name of a URL's entry: the hex SHA-256 of the URL. */
async function entryName(url) {
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(url)));
  return Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
}

/**
 * The complete stored copy of `url`, opened for reading, or null. An entry is complete when its
 * `complete.json` (written last) names the URL and the data file's size; anything else (a
 * download cut short, an older layout) is deleted here, never read.
 * @returns {Promise<{handle: FileSystemSyncAccessHandle, size: number}|null>}
 */
async function openComplete(store, url) {
  const name = await entryName(url);
  let dir;
  try {
    dir = await store.getDirectoryHandle(name);
  } catch {
    return null; // no entry
  }
  const marker = await readMarker(dir);
  const data = marker?.url === url ? await dir.getFileHandle("data").catch(() => null) : null;
  if (data) {
    // Throws while another worker (another tab) holds the file open.
    const handle = await data.createSyncAccessHandle();
    if (handle.getSize() === marker.size) return { handle, size: marker.size };
    handle.close();
  }
  await store.removeEntry(name, { recursive: true });
  return null;
}

/** The entry's `complete.json`, or null when it is missing or unreadable. */
async function readMarker(dir) {
  try {
    const file = await (await dir.getFileHandle("complete.json")).getFile();
    const marker = JSON.parse(await file.text());
    return typeof marker?.url === "string" && Number.isSafeInteger(marker.size) ? marker : null;
  } catch {
    return null;
  }
}

/**
 * A new, empty entry for `url`: its data file open for writing. `finish(size)` marks it
 * complete (the data flushed, then `complete.json` written); `discard()` deletes it.
 */
async function createEntry(store, url) {
  const name = await entryName(url);
  await store.removeEntry(name, { recursive: true }).catch(() => {});
  const dir = await store.getDirectoryHandle(name, { create: true });
  const handle = await (await dir.getFileHandle("data", { create: true })).createSyncAccessHandle();
  handle.truncate(0);
  return {
    handle,
    async finish(size) {
      handle.flush();
      const marker = await (await dir.getFileHandle("complete.json", { create: true })).createSyncAccessHandle();
      try {
        const bytes = new TextEncoder().encode(JSON.stringify({ url, size }));
        marker.truncate(0);
        marker.write(bytes, { at: 0 });
        marker.flush();
      } finally {
        marker.close();
      }
    },
    async discard() {
      try {
        handle.close();
      } catch {
        // already closed
      }
      await store.removeEntry(name, { recursive: true }).catch(() => {});
    },
  };
}

/**
 * Refuses a download of `length` bytes (`what`: the file, in messages) that the site's storage
 * quota cannot hold, and asks once for persistent storage (so the browser does not evict the
 * models; where workers may not ask, wgspec.js asks from the page).
 */
async function checkQuota(what, length) {
  const storage = self.navigator.storage;
  if (!persistAsked) {
    persistAsked = true;
    storage.persist?.().catch(() => {});
  }
  let estimate;
  try {
    estimate = await storage.estimate();
  } catch {
    return; // no estimate: the writes will tell
  }
  const { quota, usage } = estimate;
  if (typeof quota !== "number" || typeof usage !== "number" || quota - usage >= length) return;
  const mb = (bytes) => (Math.max(0, bytes) / 1e6).toFixed(0);
  throw new Error(
    `${what} needs ${mb(length)} MB of storage, the browser allows ${mb(quota - usage)} MB more ` +
      `for this site (free space, clear the stored models with WgSpec.clearCache(), or load with cache: false)`,
  );
}

/**
 * Checks a GGUF model from the first `have` bytes of its file of `size` bytes (read by
 * `prefix(n)`) against the adapter's limits and the GPU memory budget. Returns the engine's
 * answer: `{need}` when the header needs more bytes; a model that cannot load throws.
 */
function checkGgufPrefix(eng, prefix, have, size, { context, maxMemoryMb }) {
  const n = Math.min(have, size, MAX_GGUF_HEADER);
  return JSON.parse(eng.check_gguf(prefix(n), size, context ?? undefined, maxMemoryMb ?? undefined));
}

/**
 * A complete stored copy as a weight file, after the GGUF check (`check`, unless null) from its
 * first bytes; the handle is closed when the check throws.
 */
function openStored({ handle, size }, file, check, onProgress) {
  try {
    onProgress(0, size);
    if (check) {
      const prefix = (n) => readHandle(handle, 0, n, file);
      let have = Math.min(size, 1 << 20);
      for (;;) {
        const answer = check(prefix, have, size);
        if (answer.need === undefined || have >= size) break;
        have = answer.need;
      }
    }
    onProgress(size, size);
  } catch (err) {
    handle.close();
    throw err;
  }
  return { size, read: (offset, length) => readHandle(handle, offset, length, file), close: () => handle.close() };
}

/**
 * Opens a weight file: the complete copy in the origin-private file system when there is one
 * (phase "cache", no request), else downloaded (phase "download") chunk by chunk into it, or,
 * without OPFS sync access handles (or with `cache: false`), into a JS array outside wasm
 * memory. With `checkGguf`, the model's header is checked from the file's first bytes (as they
 * arrive) and a model that cannot load on this adapter or within the budget is refused before
 * the rest is downloaded. A download returns once the header is in (when the length is known):
 * the load then reads each batch as it arrives (`ready`), overlapping download and upload.
 * @param {string} url
 * @param {ModelLoad} load
 * @returns {Promise<WeightFile>}
 */
async function openWeights(eng, url, load, { checkGguf }) {
  const { model, what, stores, progress } = load;
  const file = fileName(url);
  const check = (prefix, have, size) => named(what, () => checkGgufPrefix(eng, prefix, have, size, load.gpu));
  let store = stores.files;

  if (store) {
    let stored = null;
    try {
      stored = await openComplete(store, url);
    } catch (err) {
      // E.g. another tab holds the file open: this load keeps its own copy in memory.
      console.warn(`wgspec: the stored copy of ${url} is unusable (${errorMessage(err)}); downloading it into memory`);
      store = null;
    }
    if (stored) return openStored(stored, file, checkGguf ? check : null, (loaded, total) =>
      progress({ model, phase: "cache", file, loaded, total }),
    );
  }

  const abort = new AbortController();
  const response = await request(url, { noStore: Boolean(store), signal: abort.signal, stallMs: load.stallMs }).catch(
    (err) => {
      abort.abort();
      throw err;
    },
  );
  const total = contentLength(response);
  let entry = null;
  if (store) {
    try {
      if (total !== null) await checkQuota(what.endsWith(file) ? what : `${what}: ${file}`, total);
    } catch (err) {
      response.body?.cancel().catch(() => {});
      throw err;
    }
    try {
      entry = await createEntry(store, url);
    } catch (err) {
      console.warn(`wgspec: cannot store ${url} (${errorMessage(err)}); downloading it into memory`);
    }
  }
  let sink;
  try {
    sink = entry ? fileSink(entry.handle, file) : memorySink(total);
  } catch (err) {
    // E.g. a file larger than a JS array may be: stop the request.
    abort.abort();
    await entry?.discard();
    throw new Error(`${what}: cannot hold ${file} (${total} bytes) in memory: ${errorMessage(err)}`);
  }
  const arrival = arrivals();
  // The header as the first bytes arrive (the file's length must be known): a GGUF is checked
  // (and refused before the rest is downloaded), a safetensors header is complete at 8 + its
  // length. Once it is in, the load starts while the rest arrives.
  let need = total === null ? Infinity : checkGguf ? 0 : 8;
  const onChunk = (loaded) => {
    if (loaded >= need) {
      if (checkGguf) {
        need = check(sink.prefix, loaded, total).need ?? Infinity;
      } else if (need === 8) {
        need = Math.min(total, 8 + Number(new DataView(sink.prefix(8).slice().buffer).getBigUint64(0, true)));
        if (loaded >= need) need = Infinity;
      } else {
        need = Infinity;
      }
      if (need === Infinity) arrival.headerIn();
    }
    arrival.arrived(loaded);
  };
  const downloading = readBody(
    response,
    url,
    sink,
    total,
    load.stallMs,
    (loaded, total) => progress({ model, phase: "download", file, loaded, total }),
    onChunk,
  ).then(
    async (loaded) => {
      arrival.arrived(loaded);
      arrival.complete();
      try {
        // (marking it stored must not hold the load up: storage that does not answer is as
        // storage that failed)
        if (entry) await within(entry.finish(loaded), load.stallMs);
      } catch (err) {
        // Not storing the file only costs a download next time: the load goes on (still
        // reading the file), and the unmarked entry is deleted by the next load.
        const why = err === STALLED ? `no answer from storage in ${load.stallMs / 1000} s` : errorMessage(err);
        console.warn(`wgspec: not stored: ${url}: ${why}`);
      }
      return loaded;
    },
    async (err) => {
      arrival.failed(err);
      await entry?.discard();
      throw err;
    },
  );
  // Whoever loads awaits `done`; a failure before then is also reported through `ready`.
  downloading.catch(() => {});
  await Promise.race([arrival.header, downloading]);
  const size = total ?? (await downloading);
  const readBytes = entry
    ? (offset, length) => readHandle(entry.handle, offset, length, file)
    : (offset, length) => sink.prefix(offset + length).subarray(offset);
  // A download that failed after the header was in: its error, not a closed file's.
  const read = (offset, length) => {
    arrival.throwIfFailed();
    return readBytes(offset, length);
  };
  return {
    size,
    read,
    ready: (end) => arrival.ready(end),
    done: downloading,
    close: () => {
      if (!arrival.finished()) abort.abort(); // a load that failed midway: the download stops
      try {
        entry?.handle.close();
      } catch {
        // already closed
      }
    },
  };
}

/**
 * A download's progress as the load waits on it: `arrived(n)` as bytes come in, `ready(end)`
 * undefined once the first `end` bytes are in, else a promise of them (rejected when the
 * download fails), `header` resolved by `headerIn()`, `throwIfFailed()` the download's error.
 */
function arrivals() {
  let arrived = 0;
  let failure = null;
  let done = false;
  let headerIn;
  const header = new Promise((resolve) => (headerIn = resolve));
  /** @type {Array<{end: number, resolve: () => void, reject: (e: any) => void}>} */
  let waiting = [];
  return {
    header,
    headerIn: () => headerIn(),
    finished: () => done || failure !== null,
    arrived(n) {
      arrived = n;
      const now = waiting.filter((w) => w.end <= n);
      waiting = waiting.filter((w) => w.end > n);
      now.forEach((w) => w.resolve());
    },
    failed(err) {
      failure = err;
      waiting.forEach((w) => w.reject(err));
      waiting = [];
    },
    throwIfFailed() {
      if (failure) throw failure;
    },
    ready(end) {
      if (end <= arrived) return undefined;
      if (failure) return Promise.reject(failure);
      return new Promise((resolve, reject) => waiting.push({ end, resolve, reject }));
    },
    complete() {
      done = true;
    },
  };
}

// ---------------------------------------------------------------------------------------------
// Generation

/**
 * Runs one generation: an engine request, posting a "token" message per committed token, or an
 * OpenAI body, read and answered by the engine's OpenAI code (the server's), posting a "chunk"
 * message per streamed chunk. Posts "started" once the request is accepted; returns the result.
 */
async function generate(id, request, openai) {
  const eng = requireEngine();
  const keepGoing = () => !aborted.has(id);
  if (!keepGoing()) {
    // Aborted while it waited for its turn: do not start it.
    if (openai) throw abortError();
    const stats = { prompt_tokens: 0, generated_tokens: 0, target_forwards: 0 };
    return { prompt_tokens: [], tokens: [], from_draft: [], text: "", finish_reason: "cancelled", stats };
  }
  let running;
  if (openai) {
    const onChunk = (chunk) => {
      if (chunk !== null) self.postMessage({ id, type: "chunk", chunk });
      return keepGoing();
    };
    running = eng.generate_openai(openai.endpoint, JSON.stringify(openai.body), openai.model, onChunk);
  } else {
    const onToken = (token, text, fromDraft) => {
      // `token` is undefined for the final flush of held-back text (not a token of its own).
      self.postMessage({ id, type: "token", token: token ?? null, text, fromDraft: Boolean(fromDraft) });
      return keepGoing();
    };
    running = eng.generate(JSON.stringify(request), onToken);
  }
  self.postMessage({ id, type: "started" });
  return JSON.parse(await running);
}

/** The error of a generation stopped by its caller (as fetch names it). */
function abortError() {
  const err = new Error("the generation was aborted");
  err.name = "AbortError";
  return err;
}

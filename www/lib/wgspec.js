// wgspec: lossless speculative decoding of LLMs on WebGPU, in the browser.
//
// This module runs on the page. The model, the GPU device and the WebAssembly engine live in a
// module Web Worker (`worker.js`, served next to this file), so downloads, weight uploads and
// decoding never block the page.

import { fileName, STORE_NAME } from "./names.js";

/**
 * The page side of the worker protocol (see worker.js): numbered calls, each with a promise and
 * an optional event handler for its progress/token messages.
 */
/**
 * Where worker.js is when nothing bundled it (esbuild, Rollup): next to this module's URL at run
 * time, read from a stack trace. (`import.meta.url` would be replaced by bundlers with a build
 * path, and `import.meta.resolve("./worker.js")` makes webpack emit a second, unbundled copy.)
 */
function unbundledWorkerUrl() {
  const at = /(https?:\/\/[^\s()]+?):\d+:\d+/.exec(new Error().stack ?? "");
  return at ? new URL("worker.js", at[1]).href : "worker.js, as bundled";
}

/** What to do when the worker or its files cannot be fetched (the README's "Bundlers"). */
const BUNDLING_HELP =
  "worker.js, names.js, wgspec_core.js and wgspec_core_bg.wasm come with wgspec.js: a bundler " +
  "that does not bundle `new Worker(new URL(..., import.meta.url))` (esbuild, Rollup without a " +
  "worker plugin) needs them copied to a served folder and that folder's worker.js passed as the " +
  "`worker` option of WgSpec.load; Vite 7's dev server needs `optimizeDeps: { exclude: [\"wgspec\"] }`; " +
  "see \"Bundlers\" in wgspec's README";

class WorkerClient {
  /**
   * @param {Worker} worker
   * @param {string|null} where the worker's URL as this module knows it, for messages (null: a
   *   Worker the caller started)
   */
  constructor(worker, where) {
    this.worker = worker;
    this.nextId = 1;
    /** @type {Map<number, {resolve: Function, reject: Function, onEvent?: Function}>} */
    this.pending = new Map();
    /** @type {Error|null} set once the worker is unusable; every later call fails with it */
    this.failure = null;
    /** Whether the worker's script ran (it posts "ready" first; a Worker given may have already). */
    this.started = where === null;
    worker.addEventListener("message", (e) => this.onMessage(e.data));
    worker.addEventListener("error", (e) => {
      e.preventDefault?.();
      const detail = e.message ? `: ${e.message}` : "";
      // (a script that never ran was not found, or not a module: the usual bundler problem)
      this.fail(
        new Error(
          this.started
            ? `the wgspec worker failed${detail}`
            : `could not start the wgspec worker ${where}${detail}. ${BUNDLING_HELP}`,
        ),
      );
    });
    worker.addEventListener("messageerror", () =>
      this.fail(new Error("the wgspec worker sent a message that could not be read")),
    );
  }

  /**
   * Starts a call.
   * @param {string} type
   * @param {object} payload
   * @param {(msg: any) => void} [onEvent] progress and token messages
   * @returns {{ id: number, promise: Promise<any> }}
   */
  call(type, payload = {}, onEvent) {
    const id = this.nextId++;
    const promise = new Promise((resolve, reject) => {
      if (this.failure) {
        reject(this.failure);
        return;
      }
      this.pending.set(id, { resolve, reject, onEvent });
      this.worker.postMessage({ ...payload, id, type });
    });
    return { id, promise };
  }

  /** Posts a message that expects no reply (abort). */
  post(message) {
    if (!this.failure) this.worker.postMessage(message);
  }

  onMessage(msg) {
    if (!msg) return;
    if (msg.type === "ready") {
      this.started = true;
      return;
    }
    if (msg.type === "fatal") {
      this.fail(new Error(msg.message));
      return;
    }
    const call = this.pending.get(msg.id);
    if (!call) return;
    if (msg.type === "result") {
      this.pending.delete(msg.id);
      call.resolve(msg.value);
    } else if (msg.type === "error") {
      this.pending.delete(msg.id);
      call.reject(workerError(msg));
    } else if (call.onEvent) {
      try {
        call.onEvent(msg);
      } catch (err) {
        console.error("wgspec: an event handler threw", err);
      }
    }
  }

  /** Rejects every pending call with `error`, and every later one. */
  fail(error) {
    this.failure ??= error;
    for (const call of this.pending.values()) call.reject(error);
    this.pending.clear();
  }

  terminate() {
    this.worker.terminate();
    this.fail(new Error("this WgSpec instance has been disposed"));
  }
}

/**
 * A request refused or failed as `wgspec serve` answers it: the HTTP `status` and OpenAI's error
 * object (`{message, type, param, code}`), as the OpenAI client's `APIError` carries them.
 */
export class APIError extends Error {
  /**
   * @param {number} status
   * @param {{message: string, type: string, param: string|null, code: string|null}} error
   */
  constructor(status, error) {
    super(error.message);
    this.name = "APIError";
    this.status = status;
    this.error = error;
    this.type = error.type;
    this.param = error.param;
    this.code = error.code;
  }
}

/** The Error of a worker's "error" message: an APIError, an AbortError or a plain Error. */
function workerError(msg) {
  if (msg.error && typeof msg.status === "number") return new APIError(msg.status, msg.error);
  const err = new Error(msg.message);
  if (msg.name === "AbortError") err.name = "AbortError";
  return err;
}

let persistenceRequested = false;

/**
 * Asks the browser once to keep this site's storage (the stored models) under storage pressure;
 * only pages may ask (not workers). A refusal or a missing API changes nothing.
 */
function requestPersistence() {
  if (persistenceRequested) return;
  persistenceRequested = true;
  try {
    globalThis.navigator?.storage?.persist?.().catch(() => {});
  } catch {
    // not available here
  }
}

/** Resolves a model URL against the page's address ("ngram" stays as it is). */
function resolveUrl(url) {
  if (url === "ngram") return url;
  const base = globalThis.document?.baseURI ?? globalThis.location?.href;
  return new URL(String(url), base).href;
}

/**
 * Builds the engine's request object from a prompt (string) or messages (array) and options in
 * camelCase or snake_case.
 */
function buildRequest(prompt, opts) {
  let request;
  if (typeof prompt === "string") request = { prompt };
  else if (Array.isArray(prompt)) request = { messages: prompt };
  else throw new TypeError("prompt must be a string or an array of {role, content} messages");
  const pick = (camel, snake) => (opts[camel] !== undefined ? opts[camel] : opts[snake]);
  const stop = opts.stop;
  Object.assign(request, {
    max_tokens: pick("maxTokens", "max_tokens"),
    temperature: opts.temperature,
    top_k: pick("topK", "top_k"),
    top_p: pick("topP", "top_p"),
    min_p: pick("minP", "min_p"),
    seed: opts.seed,
    stop: typeof stop === "string" ? [stop] : stop,
    draft: opts.draft,
    draft_k: pick("draftK", "draft_k"),
    max_draft_k: pick("maxDraftK", "max_draft_k"),
    ignore_eos: pick("ignoreEos", "ignore_eos"),
  });
  for (const key of Object.keys(request)) {
    if (request[key] === undefined) delete request[key];
  }
  return request;
}

/**
 * A loaded model (and optional draft) running in a Web Worker.
 *
 * Create one with {@link WgSpec.load}; generate with {@link WgSpec#generate},
 * {@link WgSpec#complete}, `chat.completions.create` or `completions.create`; free it with
 * {@link WgSpec#dispose}.
 */
export class WgSpec {
  /** @private Use WgSpec.load. */
  constructor(client, loaded, model) {
    /** @private */
    this._client = client;
    /** @private ids of the generations that have not finished */
    this._active = new Set();
    /** The GPU adapter's description. @type {string} */
    this.adapter = loaded.adapter;
    /** The target model: {arch, layers, dim, vocab, context, params, file_bytes, chat_template}. */
    this.info = loaded.info;
    /** The draft model's info when a draft model is loaded, else null. */
    this.draftInfo = loaded.draftInfo;
    /** Medusa heads' info ({heads, layers, gpu_weight_bytes}) when heads are loaded, else null. */
    this.medusaInfo = loaded.medusaInfo;
    /** The EAGLE head's info ({gpu_weight_bytes, gpu_memory_bytes}) when loaded, else null. */
    this.eagleInfo = loaded.eagleInfo;
    /** "model", "ngram", "medusa", "eagle" or null: the draft used when a call does not name one. */
    this.draftKind = loaded.draftKind;
    /** The target's file or folder name (the `model` field of chat completions). */
    this.model = model;
    /**
     * The worker's WebAssembly memory after loading, in bytes: its peak (wasm memory never
     * shrinks). Weights stream through it a batch at a time, so it stays far below the files.
     * @type {number}
     */
    this.wasmMemoryBytes = loaded.wasmMemoryBytes;
    /** The stats of the last finished generation. @type {object|null} */
    this.stats = null;
    /** The last finished generation's whole result. @type {object|null} */
    this.lastResult = null;
    /** OpenAI-style chat completions (`POST /v1/chat/completions` of `wgspec serve`). */
    this.chat = { completions: { create: (params, options) => this._openai("chat", params, options) } };
    /** OpenAI-style completions of a plain prompt (`POST /v1/completions`). */
    this.completions = { create: (params, options) => this._openai("completions", params, options) };
  }

  /**
   * Starts a worker, downloads (or reads from the browser's storage) the target model and the
   * draft, uploads them to the GPU and resolves to a ready instance. Weight files are stored in
   * the origin-private file system and stream from there to the GPU in batches, never whole in
   * memory; a GGUF model that cannot fit the adapter or `maxMemoryMb` is refused from its first
   * bytes, before the rest is downloaded.
   *
   * @param {object} options
   * @param {string|URL} options.target URL of a .gguf file, or of a Hugging Face folder ending
   *   with "/" (config.json, tokenizer.json, optional tokenizer_config.json, model.safetensors or
   *   model.safetensors.index.json and its shards).
   * @param {string|URL} [options.draft] a draft model URL of the same kinds (same tokenizer as
   *   the target), or "ngram" for prompt-lookup drafts; none by default.
   * @param {string|URL} [options.medusa] Medusa heads trained for the target: the URL of a
   *   `.safetensors` file in the public Medusa-1 layout, or of a folder ending with "/" holding
   *   `medusa_lm_head.safetensors` and optionally its `config.json`. Requests then draft token
   *   trees from the heads by default (`draft: "medusa"`).
   * @param {string|URL} [options.eagle] an EAGLE-1/2 or EAGLE-3 head trained for the target: a folder URL
   *   ending with "/" holding `config.json` and `model.safetensors`. Requests then draft from it
   *   by default (`draft: "eagle"`).
   * @param {number} [options.context] KV cache positions (default: the engine's choice).
   * @param {number} [options.maxMemoryMb] GPU memory budget in MB for the target and draft
   *   together (weights, KV cache, scratch); a model over it is refused before any allocation
   *   with the bill in the message. No limit by default.
   * @param {number} [options.readMb] MB of a weight file read into wasm memory at once while
   *   loading (default 8 MiB, about 8.4 MB).
   * @param {number} [options.stallSeconds=60] a download that gets no bytes for this long fails
   *   the load, naming the file (a dead connection: fetch itself never gives up).
   * @param {(event: {model: "target"|"draft", phase: "download"|"cache"|"upload"|"ready",
   *   file: string|null, loaded: number, total: number|null}) => void} [options.onProgress]
   *   bytes for download/cache (total null when unknown), bytes of the weights for upload (a
   *   batch of rows at a time; with a download in progress the upload follows it).
   * @param {Worker|string|URL} [options.worker] a Worker to use, or the URL of worker.js (default:
   *   worker.js next to this module, which Vite, webpack and Parcel bundle; with esbuild or Rollup,
   *   the package's worker.js copied to a served folder with its three files: README, "Bundlers").
   * @param {boolean} [options.cache=true] keep downloaded files (weights in the origin-private
   *   file system, JSON files in the Cache API, both "wgspec-models-v1") and read them from there
   *   next time; asks the browser once for persistent storage. With `false`, every load downloads
   *   and holds the weights in a JS array outside wasm memory.
   * @returns {Promise<WgSpec>} rejects with the worker's message on any failure.
   */
  static async load({
    target,
    draft,
    medusa,
    eagle,
    context,
    maxMemoryMb,
    readMb,
    stallSeconds,
    onProgress,
    worker,
    cache = true,
  } = {}) {
    if (!target) throw new TypeError("WgSpec.load: `target` (a model URL) is required");
    const targetUrl = resolveUrl(target);
    const draftUrl = draft ? resolveUrl(draft) : undefined;
    const medusaUrl = medusa ? resolveUrl(medusa) : undefined;
    const eagleUrl = eagle ? resolveUrl(eagle) : undefined;
    let w = worker;
    let where = null;
    if (!(typeof Worker !== "undefined" && w instanceof Worker)) {
      if (w) {
        const url = new URL(String(w), globalThis.location?.href);
        where = `from ${url.href}`;
        w = new Worker(url, { type: "module" });
      } else {
        // (written out as bundlers recognise it: Vite, webpack 5 and Parcel bundle the worker and
        // what it imports, the .wasm included; the URL for messages is spelled otherwise, so that
        // they do not take it for a second, unbundled copy)
        w = new Worker(new URL("./worker.js", import.meta.url), { type: "module" });
        where = `next to wgspec.js (${unbundledWorkerUrl()})`;
      }
    }
    if (cache) requestPersistence();
    const client = new WorkerClient(w, where);
    const onEvent = (msg) => {
      if (msg.type === "progress" && onProgress) onProgress(msg.event);
    };
    try {
      const { promise } = client.call(
        "load",
        {
          target: targetUrl,
          draft: draftUrl,
          medusa: medusaUrl,
          eagle: eagleUrl,
          context,
          maxMemoryMb,
          readMb,
          stallSeconds,
          cache,
        },
        onEvent,
      );
      const loaded = await promise;
      return new WgSpec(client, loaded, fileName(targetUrl));
    } catch (err) {
      client.terminate();
      throw err;
    }
  }

  /**
   * Deletes the model files kept in the browser's storage (the origin-private file system and
   * the Cache API). A file a loading worker holds open stays.
   * @returns {Promise<boolean>} whether there was anything to delete.
   */
  static async clearCache() {
    let deleted = globalThis.caches ? await caches.delete(STORE_NAME).catch(() => false) : false;
    try {
      const root = await globalThis.navigator.storage.getDirectory();
      await root.removeEntry(STORE_NAME, { recursive: true });
      deleted = true;
    } catch {
      // no origin-private file system, nothing stored, or a file in use
    }
    return deleted;
  }

  /**
   * Generates from a prompt, yielding one event per committed token (and, at the end, possibly
 * one with `token: null` carrying text the detokenizer held back). The iterator's final
   * result (and `this.stats`, `this.lastResult`) is the engine's result object. Leaving the loop
   * early (break) aborts the generation.
   *
   * @param {string|Array<{role: string, content: string}>} prompt raw text, or chat messages
   *   (rendered with the model's chat template).
   * @param {GenerateOptions} [opts]
   * @returns {AsyncGenerator<{token: number|null, text: string, fromDraft: boolean}, object, void>}
   *
   * @typedef {object} GenerateOptions
   * @property {number} [maxTokens=128]
   * @property {number} [temperature=0] 0 (or below 1e-5) = greedy
   * @property {number} [topK]
   * @property {number} [topP]
   * @property {number} [minP] keep only tokens at least this fraction as likely as the likeliest
   * @property {number} [seed]
   * @property {string|string[]} [stop]
   * @property {boolean} [ignoreEos] end-of-generation tokens do not end it
   * @property {"model"|"ngram"|"model+ngram"|"medusa"|"medusa+ngram"|"eagle"|"eagle+ngram"|"none"} [draft]
   *   default: the draft given to load, else "none" ("X+ngram": the draft's proposal and n-gram
   *   continuations merged into one token tree)
   * @property {number|null} [draftK] fixed K, or null/undefined for adaptive K
   * @property {number} [maxDraftK=16]
   * @property {AbortSignal} [signal] aborts this generation (finish_reason "cancelled")
   */
  async *generate(prompt, opts = {}) {
    const request = buildRequest(prompt, opts);
    const run = this._start({ request }, opts.signal, (msg) =>
      msg.type === "token" ? { token: msg.token, text: msg.text, fromDraft: msg.fromDraft } : undefined,
    );
    const result = yield* run.items;
    this._finished(result);
    return result;
  }

  /**
   * @private Starts one generation in the worker: `call` is `{request}` (the engine's request) or
   * `{openai: {endpoint, body, model}}` (an OpenAI body, read and answered by the engine's OpenAI
   * code). `toItem` turns the call's messages into the items `items` yields (undefined: none).
   * @returns {{items: AsyncGenerator<any, any, void>, started: Promise<void>, settled: Promise<void>}}
   *   `items` ends with the worker's result; `started` resolves once the worker accepted the
   *   request (rejects with its refusal); `settled` once the worker is done with it, however it
   *   ended. Leaving `items` early aborts the generation.
   */
  _start(call, signal, toItem) {
    const queue = [];
    let wake = null;
    let settled = false;
    let accepted;
    const started = new Promise((resolve) => (accepted = resolve));
    const payload = { ...call, aborted: Boolean(signal?.aborted) };
    const { id, promise } = this._client.call("generate", payload, (msg) => {
      if (msg.type === "started") accepted();
      const item = toItem(msg);
      if (item === undefined) return;
      queue.push(item);
      wake?.();
    });
    this._active.add(id);
    const finish = () => {
      settled = true;
      this._active.delete(id);
      accepted();
      wake?.();
    };
    promise.then(finish, finish);

    const onAbort = () => this._abortIds([id]);
    signal?.addEventListener("abort", onAbort, { once: true });
    const abortIds = (ids) => this._abortIds(ids);
    async function* items() {
      try {
        for (;;) {
          if (queue.length > 0) {
            yield queue.shift();
          } else if (settled) {
            break;
          } else {
            await new Promise((resolve) => (wake = resolve));
            wake = null;
          }
        }
        return await promise;
      } finally {
        signal?.removeEventListener("abort", onAbort);
        if (!settled) abortIds([id]); // the consumer left the loop early
      }
    }
    // a refusal settles the call before it starts: `started` rejects with it
    return {
      items: items(),
      started: started.then(() => (settled ? promise.then(() => {}) : undefined)),
      settled: promise.then(() => {}, () => {}),
    };
  }

  /** @private Records a finished generation's result. */
  _finished(result) {
    this.lastResult = result;
    this.stats = result.stats;
  }

  /**
   * Generates to the end and resolves to the engine's result object
   * (`{prompt_tokens, tokens, from_draft, text, finish_reason, stats}`).
   *
   * @param {string|Array<{role: string, content: string}>} prompt
   * @param {GenerateOptions & {onToken?: (event: {token: number|null, text: string,
   *   fromDraft: boolean}) => void}} [opts]
   * @returns {Promise<object>}
   */
  async complete(prompt, opts = {}) {
    const iterator = this.generate(prompt, opts);
    for (;;) {
      const { done, value } = await iterator.next();
      if (done) return value;
      opts.onToken?.(value);
    }
  }

  /**
   * Renders chat messages with the target's chat template (generation prompt added).
   * @param {Array<{role: string, content: string}>} messages
   * @returns {Promise<string>} rejects when the model has no chat template.
   */
  chatPrompt(messages) {
    return this._client.call("chatPrompt", { messages }).promise;
  }

  /**
   * Stops every running or queued generation: `generate`/`complete` finish with finish_reason
   * "cancelled", OpenAI-style calls reject with an `AbortError` (streams end).
   */
  abort() {
    this._abortIds([...this._active]);
  }

  /**
   * Frees the GPU memory and terminates the worker. Pending calls reject; the instance is
   * unusable afterwards.
   * @returns {Promise<void>}
   */
  async dispose() {
    if (this._client.failure) {
      this._client.terminate();
      return;
    }
    this.abort();
    const { promise } = this._client.call("dispose");
    const timeout = new Promise((resolve) => setTimeout(resolve, 5000));
    await Promise.race([promise.catch(() => {}), timeout]);
    this._client.terminate();
  }

  _abortIds(ids) {
    if (ids.length > 0) this._client.post({ type: "abort", ids });
  }

  /**
   * @private OpenAI-style `chat.completions.create` and `completions.create`: the body is read,
   * run and answered by the engine's OpenAI code, the very code of `wgspec serve` (fields,
   * defaults such as temperature 1, refusals naming the field, the answer and chunk shapes).
   * Resolves to the answer, or with `stream: true` (once the request is accepted) to an async
   * iterable of its chunks with openai-node's `controller` (an `AbortController` whose `abort()`
   * stops it). A refusal rejects with an {@link APIError}. The second argument's `signal`, as
   * openai-node's request options give it, aborts, as does a `signal` in the body (not OpenAI's)
   * or `abort()`: the call rejects with an `AbortError`, or, as openai-node's streams do, the
   * stream ends after the chunks it has given. The options' other fields are HTTP's (headers,
   * retries, timeouts) and mean nothing here.
   */
  async _openai(endpoint, params = {}, options = {}) {
    const { signal, ...body } = params;
    const controller = new AbortController();
    const release = follow(controller, [signal, options?.signal]);
    const call = { openai: { endpoint, body, model: this.model } };
    let run;
    try {
      run = this._start(call, controller.signal, (msg) => (msg.type === "chunk" ? JSON.parse(msg.chunk) : undefined));
    } finally {
      if (!run) release();
    }
    run.settled.then(release);
    await run.started;
    if (body.stream) {
      const finished = (result) => this._finished(result);
      const chunks = (async function* chunks() {
        try {
          const { completion } = yield* run.items;
          finished(completion);
        } catch (e) {
          if (e?.name !== "AbortError") throw e;
        }
      })();
      chunks.controller = controller;
      return chunks;
    }
    let step = await run.items.next();
    while (!step.done) step = await run.items.next();
    const { completion, response } = step.value;
    this._finished(completion);
    return response;
  }
}

/**
 * Aborts `controller` when any of `signals` (undefined ones skipped) aborts, at once if one has.
 * @returns {() => void} stops following them.
 */
function follow(controller, signals) {
  const given = signals.filter(Boolean);
  const abort = () => controller.abort();
  if (given.some((s) => s.aborted)) abort();
  for (const s of given) s.addEventListener("abort", abort, { once: true });
  return () => given.forEach((s) => s.removeEventListener("abort", abort));
}

export default WgSpec;

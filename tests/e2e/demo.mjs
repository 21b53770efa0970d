// End-to-end test of the browser demo: the page served by `wgspec web`, in headless Chromium on
// WebGPU (SwiftShader without a GPU), must generate exactly the native CLI's greedy text.
//
//   WGSPEC_BIN=target/release/wgspec node tests/e2e/demo.mjs
//
// Environment:
//   WGSPEC_BIN    the native wgspec binary (required)
//   WGSPEC_CACHE  the model cache (default ~/.cache/wgspec); the model is
//                 $WGSPEC_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf
//   E2E_OUT       folder for artifacts: demo.png, error.png, result.json (default target/e2e)
//   CHROMIUM      the browser (default /usr/bin/chromium)
//
// Weights stream into the origin-private file system (OPFS) and from there to the GPU; the cases
// share one browser profile, so what one stores the next finds:
// Case 0a: a model over `maxMemoryMb` is refused from the GGUF's first bytes, before the download.
// Case 0b: a file larger than the site's storage quota is refused before it is written.
// Case 0c: a download cut short fails the load and leaves nothing usable behind; then a partial
//          entry (what a tab closed mid-download leaves) is planted for case 1 to replace.
// Case 1: load the model with n-gram drafts (downloaded again), generate 16 greedy tokens,
//         compare with the CLI; wasm memory stays far below the file.
// Case 1a: the JS API's OpenAI calls and `wgspec serve` on the same model answer the same bodies
//          with the same JSON, field by field (ids, clocks and timings aside).
// Case 1b: after a reload the model is read from OPFS with no request for it, same text; the
//          file as target and draft with 1 MB read batches (readMb): wasm memory under 32 MB,
//          still no request; a budget the draft does not fit refuses it from its stored header;
//          `cache: false` downloads into JS memory from a slow server, the upload starting while
//          the download runs; WgSpec.clearCache() empties OPFS.
// Case 2: loading a missing URL shows an error naming the 404 or the URL.

import { spawn } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import readline from "node:readline";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const BIN = process.env.WGSPEC_BIN && path.resolve(process.env.WGSPEC_BIN);
const CACHE = process.env.WGSPEC_CACHE || path.join(os.homedir(), ".cache", "wgspec");
const OUT = path.resolve(ROOT, process.env.E2E_OUT || "target/e2e");
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf";
const MODEL = path.join(CACHE, "models", MODEL_FILE);
const MAX_TOKENS = 16;
// A prompt whose continuation repeats it, so the n-gram drafts get accepted and the page runs
// multi-token verify passes (SmolLM2-135M: about 60% acceptance over 16 tokens).
const PROMPT =
  "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n" +
  "class Point3:\n    def __init__(self, x, y, z):\n";
const CASE_TIMEOUT_MS = 10 * 60 * 1000;

// Headless Chromium exposes WebGPU (the SwiftShader adapter when there is no GPU) with
// --enable-unsafe-webgpu on a secure origin (http://127.0.0.1 counts as one).
const CHROMIUM_ARGS = [
  "--enable-unsafe-webgpu",
  "--no-sandbox",
  "--disable-gpu-sandbox",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
  "--no-first-run",
  "--disable-quic",
];

const started = Date.now();
function log(...args) {
  const t = ((Date.now() - started) / 1000).toFixed(1).padStart(6);
  console.log(`[e2e ${t}s]`, ...args);
}

class Failure extends Error {}
function check(condition, message) {
  if (!condition) throw new Failure(message);
}

/** Runs a command to completion; resolves to its stdout (rejects on a non-zero exit). */
function run(cmd, args, { timeoutMs }) {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { env: { ...process.env, WGSPEC_CACHE: CACHE } });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d) => (stdout += d));
    child.stderr.on("data", (d) => (stderr += d));
    const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
    child.on("error", reject);
    child.on("close", (code, signal) => {
      clearTimeout(timer);
      if (code === 0) resolve(stdout);
      else reject(new Failure(`${cmd} ${args[0]} exited with ${code ?? signal}\n${stderr}`));
    });
  });
}

/**
 * Starts `wgspec web --port 0` (or `wgspec ARGS --port 0`) in the repository root (it serves www/
 * and pkg/ from there) and resolves to {child, url} once it prints its address.
 */
function startServer(args = ["web"]) {
  const what = `wgspec ${args[0]}`;
  return new Promise((resolve, reject) => {
    const child = spawn(BIN, [...args, "--port", "0"], { cwd: ROOT, env: { ...process.env, WGSPEC_CACHE: CACHE } });
    const timer = setTimeout(() => reject(new Failure(`${what} printed no address within 60 s`)), 60_000);
    child.on("error", reject);
    child.on("exit", (code, signal) => reject(new Failure(`${what} exited early (${code ?? signal})`)));
    readline.createInterface({ input: child.stderr }).on("line", (line) => log(`[${what}] ${line}`));
    const lines = readline.createInterface({ input: child.stdout });
    let first = true;
    lines.on("line", (line) => {
      if (!first) {
        log(`[${what}] ${line}`);
        return;
      }
      first = false;
      const match = /listening on (http:\/\/\S+)/.exec(line);
      clearTimeout(timer);
      if (match) resolve({ child, url: match[1].replace(/\/?$/, "/") });
      else reject(new Failure(`unexpected first line from ${what}: ${line}`));
    });
  });
}

/** Waits until #status shows one of `states`, logging the progress line now and then. */
async function waitForStatus(page, states, what) {
  const deadline = Date.now() + CASE_TIMEOUT_MS;
  let lastLogged = 0;
  for (;;) {
    const status = (await page.textContent("#status")).trim();
    if (states.includes(status) || status === "error") return status;
    if (Date.now() > deadline) throw new Failure(`${what}: still "${status}" after ${CASE_TIMEOUT_MS / 1000} s`);
    if (Date.now() - lastLogged > 15_000) {
      lastLogged = Date.now();
      const progress = (await page.textContent("#progress-text").catch(() => "")) || "";
      const tokens = (await page.textContent("#stat-tokens").catch(() => "")) || "";
      log(`${what}: ${status}`, progress && `· ${progress}`, status === "generating" ? `· ${tokens} tokens` : "");
    }
    await page.waitForTimeout(500);
  }
}

async function newPage(context, baseUrl) {
  const page = await context.newPage();
  page.on("console", (m) => log(`[page ${m.type()}] ${m.text()}`));
  page.on("pageerror", (e) => log(`[page error] ${e.message}`));
  await page.goto(baseUrl);
  await page.waitForSelector("#load");
  return page;
}

/** The model's URL from the server's index (fall back to the usual path). */
async function findModelUrl(baseUrl) {
  let modelUrl = `/models/${MODEL_FILE}`;
  try {
    const index = await (await fetch(new URL("models/index.json", baseUrl))).json();
    const entry = index.find((m) => m.url.endsWith(`/${MODEL_FILE}`));
    if (entry) modelUrl = entry.url;
    log(`models/index.json: ${index.map((m) => m.name).join(", ") || "(empty)"}`);
  } catch (err) {
    log(`models/index.json unavailable (${err.message}); using ${modelUrl}`);
  }
  return modelUrl;
}

/**
 * Counts the browser's requests for the model file, the worker's included (a dedicated worker's
 * requests reach the context's "request" event, not the page's).
 */
function countModelRequests(context) {
  const counter = { count: 0 };
  context.on("request", (r) => {
    if (new URL(r.url()).pathname.endsWith(`/${MODEL_FILE}`)) counter.count += 1;
  });
  return counter;
}

/** In the page: WgSpec.load through the JS API; resolves to {error, events, wasmMemoryBytes}. */
function loadInPage(page, options) {
  return page.evaluate(async (options) => {
    const { WgSpec } = await import("/pkg/wgspec.js");
    const events = [];
    try {
      const llm = await WgSpec.load({ ...options, onProgress: (e) => events.push(e) });
      const wasmMemoryBytes = llm.wasmMemoryBytes;
      await llm.dispose();
      return { error: null, events, wasmMemoryBytes };
    } catch (e) {
      return { error: String(e.message || e), events };
    }
  }, options);
}

/**
 * In the page: the entries of the package's OPFS folder of weight files, as
 * [{name, complete}] (complete: the entry has its complete.json marker).
 */
function storedEntries(page) {
  return page.evaluate(async () => {
    const root = await navigator.storage.getDirectory();
    let dir;
    try {
      dir = await root.getDirectoryHandle("wgspec-models-v1");
    } catch {
      return [];
    }
    const entries = [];
    for await (const [name, handle] of dir.entries()) {
      let complete = false;
      try {
        await handle.getFileHandle("complete.json");
        complete = true;
      } catch {
        // no marker
      }
      entries.push({ name, complete });
    }
    return entries;
  });
}

/** The most bytes the progress events report for the model file. */
function bytesSeen(events) {
  return Math.max(0, ...events.filter((e) => e.file === MODEL_FILE && e.phase !== "upload").map((e) => e.loaded));
}

async function caseRefusedBeforeDownload(context, baseUrl, modelUrl, requests) {
  log("case 0a: a model over maxMemoryMb is refused before its download");
  const page = await newPage(context, baseUrl);
  const before = requests.count;
  const { error, events } = await loadInPage(page, { target: modelUrl, maxMemoryMb: 1 });
  const stored = await storedEntries(page);
  await page.close();
  const fileBytes = fs.statSync(MODEL).size;
  const seen = bytesSeen(events);
  log(`refused: ${error} (${(seen / 1e6).toFixed(1)} of ${(fileBytes / 1e6).toFixed(1)} MB received, ` +
    `${requests.count - before} request(s) for the model)`);
  check(error !== null, "a 1 MB budget must refuse SmolLM2");
  check(error.includes("the target model") && error.includes("the budget is 1.0 MB"), `unexpected refusal: ${error}`);
  check(requests.count - before === 1, `expected one request for the model, saw ${requests.count - before}`);
  check(seen > 0 && seen < fileBytes / 4, `the download must stop at the header: ${seen} of ${fileBytes} bytes`);
  check(!events.some((e) => e.phase === "upload"), "nothing may reach the GPU");
  check(stored.length === 0, `the refused download must be deleted from OPFS: ${JSON.stringify(stored)}`);
  log("case 0a passed");
}

async function caseNoStorage(context, baseUrl, modelUrl) {
  log("case 0b: a file larger than the storage quota is refused before it is written");
  const pattern = `**/${MODEL_FILE}`;
  // A 10 TB Content-Length: more than any profile's quota.
  await context.route(pattern, (route) =>
    route.fulfill({
      status: 200,
      headers: { "content-type": "application/octet-stream", "content-length": String(1e13) },
      body: Buffer.alloc(1 << 20),
    }),
  );
  const page = await newPage(context, baseUrl);
  let outcome;
  let stored;
  try {
    outcome = await loadInPage(page, { target: modelUrl });
    stored = await storedEntries(page);
  } finally {
    await context.unroute(pattern);
    await page.close();
  }
  log(`refused: ${outcome.error}`);
  check(
    outcome.error?.includes("needs 10000000 MB of storage, the browser allows"),
    `expected a storage refusal, got ${outcome.error}`,
  );
  check(bytesSeen(outcome.events) === 0, "nothing may be downloaded");
  check(stored.length === 0, `nothing may be stored: ${JSON.stringify(stored)}`);
  log("case 0b passed");
}

/**
 * Case 0d: a download that stops sending bytes but keeps its connection open (a dead network
 * path), or a server that never answers, fails the load after `stallSeconds`, naming the file,
 * instead of waiting for ever.
 */
async function caseStalledDownload(context, baseUrl) {
  log("case 0d: a download that stalls fails the load, naming the file");
  const fileBytes = fs.statSync(MODEL).size;
  const head = fs.readFileSync(MODEL).subarray(0, 8 << 20);
  const open = new Set();
  const stalling = http.createServer((req, res) => {
    open.add(res);
    if (req.url.startsWith("/silent/")) return; // no answer at all
    res.writeHead(200, {
      "content-type": "application/octet-stream",
      "content-length": String(fileBytes),
      "access-control-allow-origin": "*",
    });
    res.write(head); // then nothing, the connection held open
  });
  await new Promise((resolve) => stalling.listen(0, "127.0.0.1", resolve));
  const url = `http://127.0.0.1:${stalling.address().port}/stalls/${MODEL_FILE}`;
  const page = await newPage(context, baseUrl);
  const started = Date.now();
  const silent = url.replace("/stalls/", "/silent/");
  let outcome;
  let unanswered;
  try {
    outcome = await loadInPage(page, { target: url, stallSeconds: 3, cache: false });
    unanswered = await loadInPage(page, { target: silent, stallSeconds: 2 });
  } finally {
    await page.close();
    open.forEach((res) => res.destroy());
    stalling.close();
  }
  const seconds = (Date.now() - started) / 1000;
  log(`stalled: ${outcome.error} (both loads: ${seconds.toFixed(1)} s)`);
  check(
    outcome.error?.includes(`download stalled: ${url}: no bytes for 3 s`),
    `expected the stall named, got ${outcome.error}`,
  );
  check(bytesSeen(outcome.events) >= head.length, "the bytes sent arrived first");
  log(`unanswered: ${unanswered.error}`);
  check(
    unanswered.error?.includes(`download stalled: ${silent}: no answer for 2 s`),
    `expected the unanswered request named, got ${unanswered.error}`,
  );
  log("case 0d passed");
}

async function caseCancelledDownload(context, baseUrl, modelUrl, requests) {
  log("case 0c: a download cut short leaves nothing usable");
  const fileBytes = fs.statSync(MODEL).size;
  const partial = fs.readFileSync(MODEL).subarray(0, 8 << 20);
  const pattern = `**/${MODEL_FILE}`;
  // The whole file's length, but the connection ends after 8 MiB.
  await context.route(pattern, (route) =>
    route.fulfill({
      status: 200,
      headers: { "content-type": "application/octet-stream", "content-length": String(fileBytes) },
      body: partial,
    }),
  );
  const page = await newPage(context, baseUrl);
  const before = requests.count;
  let outcome;
  let stored;
  try {
    outcome = await loadInPage(page, { target: modelUrl, draft: "ngram" });
    stored = await storedEntries(page);
  } finally {
    await context.unroute(pattern);
    await page.close();
  }
  log(`cut short: ${outcome.error} (${requests.count - before} request(s) for the model)`);
  check(outcome.error !== null, "a truncated download must fail the load");
  check(outcome.error.includes("download failed"), `the error must name the failed download: ${outcome.error}`);
  check(requests.count - before >= 1, "the model was not requested");
  check(!outcome.events.some((e) => e.phase === "ready"), "a truncated file must not load");
  check(stored.length === 0, `the partial download must be deleted from OPFS: ${JSON.stringify(stored)}`);
  // What a tab closed mid-download leaves: the entry's data, without its complete.json. Case 1
  // must download the file again and end with one complete entry.
  const page2 = await newPage(context, baseUrl);
  await page2.evaluate(async (modelUrl) => {
    const url = new URL(modelUrl, location.href).href;
    const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(url)));
    const name = Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
    const root = await navigator.storage.getDirectory();
    const store = await root.getDirectoryHandle("wgspec-models-v1", { create: true });
    const dir = await store.getDirectoryHandle(name, { create: true });
    const writable = await (await dir.getFileHandle("data", { create: true })).createWritable();
    await writable.write(new Uint8Array(1 << 20).fill(7));
    await writable.close();
  }, modelUrl);
  const planted = await storedEntries(page2);
  await page2.close();
  check(planted.length === 1 && !planted[0].complete, `planting a partial entry: ${JSON.stringify(planted)}`);
  log("case 0c passed (and a partial entry is left for case 1 to replace)");
}

/** Loads the model in the demo page with `kind` drafts (n-gram by default) and generates PROMPT greedily. */
async function loadAndGenerate(page, modelUrl, kind = "ngram") {
  await page.fill("#target-url", modelUrl);
  await page.selectOption("#draft-kind", kind);
  await page.click("#load");
  const loaded = await waitForStatus(page, ["ready"], "load");
  check(loaded === "ready", `load failed: ${await page.textContent("#error")}`);
  const loadSeconds = await page.evaluate(() => window.wgspecLoadSeconds);
  const wasmMemoryBytes = await page.evaluate(() => window.wgspec.wasmMemoryBytes);
  log(`loaded in ${loadSeconds.toFixed(1)} s: ${await page.textContent("#adapter")}`);
  const fileBytes = fs.statSync(MODEL).size;
  log(`wasm memory after loading: ${(wasmMemoryBytes / 1e6).toFixed(1)} MB (file ${(fileBytes / 1e6).toFixed(1)} MB)`);
  check(
    wasmMemoryBytes > 0 && wasmMemoryBytes < fileBytes,
    `wasm memory ${wasmMemoryBytes} bytes: the weights must stream, not sit in wasm memory`,
  );

  if (await page.isEnabled("#chat")) await page.uncheck("#chat"); // raw prompt, like the CLI
  await page.fill("#prompt", PROMPT);
  await page.fill("#temperature", "0");
  await page.fill("#max-tokens", String(MAX_TOKENS));
  await page.selectOption("#draft-k", ""); // adaptive
  await page.click("#generate");
  const finished = await waitForStatus(page, ["done"], "generate");
  check(finished === "done", `generation failed: ${await page.textContent("#error")}`);
  const result = await page.evaluate(() => window.wgspecLastResult);
  const output = await page.textContent("#output");
  // the last verify pass drawn as a tree: its nodes as the stats list them, the accepted path marked
  const trace = result.stats?.last_cycle;
  const drawn = await page.evaluate(() => ({
    nodes: document.querySelectorAll("#cycle-tree .node").length,
    accepted: document.querySelectorAll("#cycle-tree .node.accepted").length,
  }));
  check(
    trace && trace.tokens.length >= 2 && drawn.nodes === trace.tokens.length && drawn.accepted === trace.accepted.length,
    `the last verify pass's tree: ${JSON.stringify(trace)} drawn as ${JSON.stringify(drawn)}`,
  );
  // the plain steps the schedule chose, as the stats count them
  const plain = (await page.textContent("#stat-plain")).trim();
  check(plain === String(result.stats?.plain_cycles), `plain steps shown: "${plain}", stats: ${result.stats?.plain_cycles}`);
  return { loadSeconds, wasmMemoryBytes, result, output };
}

async function caseGenerate(context, baseUrl, modelUrl, nativeText, requests) {
  log("case 1: load with n-gram drafts, generate, compare with the CLI");
  const page = await newPage(context, baseUrl);
  const before = requests.count;
  const { loadSeconds, wasmMemoryBytes, result, output } = await loadAndGenerate(page, modelUrl);
  const downloads = requests.count - before;
  const stored = await storedEntries(page);
  log(`requests for the model: ${downloads}; stored in OPFS: ${JSON.stringify(stored)}`);
  check(downloads >= 1, "the model must be downloaded again after the failed downloads and over the partial entry");
  check(stored.length === 1 && stored[0].complete, `one complete entry expected in OPFS: ${JSON.stringify(stored)}`);
  fs.mkdirSync(OUT, { recursive: true });
  await page.screenshot({ path: path.join(OUT, "demo.png") });
  const stats = result.stats || {};
  const figures = {
    load_seconds: loadSeconds,
    tokens_per_second: stats.tokens_per_second,
    prefill_seconds: stats.prefill_seconds,
    decode_seconds: stats.decode_seconds,
    generated_tokens: stats.generated_tokens,
    acceptance_rate: stats.acceptance_rate,
    tokens_per_target_forward: stats.tokens_per_target_forward,
    wasm_memory_bytes: wasmMemoryBytes,
    adapter: await page.evaluate(() => window.wgspec?.adapter),
  };
  fs.writeFileSync(path.join(OUT, "result.json"), JSON.stringify({ figures, native_text: nativeText, result }, null, 2));
  log(`page: load ${loadSeconds.toFixed(1)} s, ${stats.tokens_per_second?.toFixed(2)} tokens/s ` +
    `(prefill ${stats.prefill_seconds?.toFixed(2)} s, ${stats.generated_tokens} tokens, ` +
    `acceptance ${stats.acceptance_rate}, τ ${stats.tokens_per_target_forward}, ${stats.plain_cycles} plain steps, ` +
    `finish ${result.finish_reason})`);

  const show = (s) => JSON.stringify(s);
  check(
    result.text === nativeText && output === nativeText,
    `the page's text differs from the CLI's\n  cli:    ${show(nativeText)}\n  page:   ${show(result.text)}\n` +
      `  output: ${show(output)}`,
  );
  log(`case 1 passed: ${show(result.text)}`);

  await caseSameAnswersAsTheServer(page);
  await caseAborts(page);
  await caseOnePromptInThePage(page);
  await page.close();
  return figures;
}

/**
 * Case 1a: the JS API's `chat.completions.create` and `completions.create` against `wgspec serve`
 * on the same model: the same bodies (whole, streamed, with and without usage, refused) must get
 * the same JSON field by field, values included; only ids, clocks, timings and the model's name
 * may differ (in value, not in type). Both run the library's OpenAI code; this catches a front
 * end that builds or alters an answer of its own.
 */
async function caseSameAnswersAsTheServer(page) {
  log("case 1a: OpenAI answers in the page and from wgspec serve, field by field");
  const pageOrigin = new URL(page.url()).origin;
  const server = await startServer(["serve", "--model", MODEL, "--allow-origin", pageOrigin]);
  try {
    for (let i = 0; ; i++) {
      const ready = await fetch(`${server.url}ready`).then((r) => r.status, () => 0);
      if (ready === 200) break;
      check(i < 600, "wgspec serve was not ready within 5 minutes");
      await new Promise((r) => setTimeout(r, 500));
    }
    const base = { max_tokens: 6, temperature: 0, draft: "ngram", draft_k: 2 };
    const chat = { ...base, messages: [{ role: "user", content: "Name a prime number." }] };
    const text = { ...base, prompt: PROMPT };
    const cases = [
      ["chat", chat],
      ["chat", { ...chat, stream: true }],
      ["chat", { ...chat, stream: true, stream_options: { include_usage: true } }],
      ["completions", text],
      ["completions", { ...text, stream: true, stream_options: { include_usage: true } }],
      ["completions", { ...text, stream: true, stop: ["\n"] }],
      ["chat", { ...chat, n: 9 }],
      ["chat", { ...chat, messages: [{ role: "robot", content: "x" }] }],
      ["completions", { ...text, max_tokens: 1 << 20 }],
      ["completions", { ...text, prompt: "" }],
      ["completions", { ...text, min_p: 0.2, repetition_penalty: 1, min_tokens: 0 }],
      ["completions", { ...text, min_p: 2 }],
    ];
    for (const [endpoint, body] of cases) {
      const route = endpoint === "chat" ? "v1/chat/completions" : "v1/completions";
      const response = await fetch(server.url + route, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(body),
      });
      const raw = await response.text();
      let fromServer;
      if (!response.ok) fromServer = { status: response.status, ...JSON.parse(raw) };
      else if (body.stream) {
        const events = raw.split("\n\n").filter((e) => e.startsWith("data: ")).map((e) => e.slice(6));
        check(events.pop() === "[DONE]", `${route}: the stream must end with [DONE]: ${raw}`);
        fromServer = events.map((e) => JSON.parse(e));
      } else fromServer = JSON.parse(raw);
      const fromPage = await page.evaluate(
        async ({ endpoint, body }) => {
          const api = endpoint === "chat" ? window.wgspec.chat.completions : window.wgspec.completions;
          try {
            const answer = await api.create(body);
            if (!body.stream) return answer;
            const chunks = [];
            for await (const c of answer) chunks.push(c);
            return chunks;
          } catch (e) {
            if (e.name !== "APIError") return { thrown: String(e.stack || e) };
            return { status: e.status, error: e.error };
          }
        },
        { endpoint, body },
      );
      const label = `${endpoint} ${JSON.stringify(body).slice(0, 120)}`;
      const diffs = [];
      sameShape(fromServer, fromPage, "", diffs);
      check(diffs.length === 0, `${label}: the page answers differently from the server:\n  ${diffs.join("\n  ")}` +
        `\n  server: ${JSON.stringify(fromServer)}\n  page:   ${JSON.stringify(fromPage)}`);
      const kind = fromServer.status ? `refused ${fromServer.status} (${fromServer.error.param})` :
        Array.isArray(fromServer) ? `${fromServer.length} chunks` : "whole";
      log(`same answer: ${label}: ${kind}`);
    }
    await caseOrigins(page, server.url);
  } finally {
    server.child.removeAllListeners("exit");
    server.child.kill("SIGTERM");
  }
  log("case 1a passed");
}

/**
 * The OpenAI-style calls stop as openai-node's do: the second argument's `signal` (aborted before
 * the call or while it streams or runs) and a stream's `controller`. A call rejects with an
 * AbortError; a stream ends quietly, long before its max_tokens; the next call is answered whole.
 */
async function caseAborts(page) {
  const outcome = await page.evaluate(async () => {
    const api = window.wgspec.chat.completions;
    const body = { messages: [{ role: "user", content: "Count to fifty." }], max_tokens: 48, temperature: 0 };
    const settle = (promise) => promise.then((value) => ({ value }), (e) => ({ name: e.name, message: e.message }));
    const drain = async (stream, abortAt, abort) => {
      let chunks = 0;
      const end = await settle((async () => {
        for await (const _ of stream) if (++chunks === abortAt) abort();
      })());
      return { ...end, chunks };
    };
    const before = await settle(api.create(body, { signal: AbortSignal.abort() }));
    const c1 = new AbortController();
    const optionSignal = await drain(await api.create({ ...body, stream: true }, { signal: c1.signal }), 2, () => c1.abort());
    const s2 = await api.create({ ...body, stream: true });
    const controller = await drain(s2, 2, () => s2.controller.abort());
    const c3 = new AbortController();
    const running = settle(api.create(body, { signal: c3.signal }));
    c3.abort();
    const whole = await running;
    const next = await settle(api.create({ ...body, max_tokens: 3 }));
    return { before, optionSignal, controller, whole, next: next.value?.choices?.[0]?.finish_reason ?? next };
  });
  const show = JSON.stringify(outcome);
  check(outcome.before.name === "AbortError" && outcome.whole.name === "AbortError", `aborted calls: ${show}`);
  for (const s of [outcome.optionSignal, outcome.controller]) {
    check(s.name === undefined && s.chunks >= 2 && s.chunks < 40, `an aborted stream: ${show}`);
  }
  check(outcome.next === "length", `the call after the aborted ones: ${show}`);
  log(`case 1a: create(params, { signal }) and stream.controller abort as openai-node's (${outcome.optionSignal.chunks} and ` +
    `${outcome.controller.chunks} chunks)`);
}

/** A list of several prompts, which `wgspec serve` answers, is refused in the page, naming `prompt`. */
async function caseOnePromptInThePage(page) {
  const refused = await page.evaluate(() =>
    window.wgspec.completions.create({ prompt: ["a", "b"], max_tokens: 2 }).then(
      (v) => ({ answered: v }),
      (e) => ({ name: e.name, status: e.status, param: e.param, message: e.message }),
    ),
  );
  check(refused.status === 400 && refused.param === "prompt" && /one prompt in the browser/.test(refused.message),
    `a list of prompts in the page: ${JSON.stringify(refused)}`);
  log("case 1a: a list of prompts is refused in the page, naming `prompt`");
  // the package's own options: a sampled min-p run past its end tokens to maxTokens; a bad min-p
  const run = await page.evaluate(async (prompt) => {
    const finish = async (opts) => {
      const it = window.wgspec.generate(prompt, opts);
      let r;
      while (!(r = await it.next()).done);
      return r.value;
    };
    const done = await finish({ maxTokens: 5, temperature: 0.9, minP: 0.3, seed: 3, ignoreEos: true });
    const bad = await finish({ maxTokens: 2, minP: 2 }).then(() => "answered", (e) => String(e.message || e));
    return { tokens: done.tokens.length, finish: done.finish_reason, bad };
  }, PROMPT);
  check(run.tokens === 5 && run.finish === "length" && /min_p/.test(run.bad),
    `generate with minP and ignoreEos: ${JSON.stringify(run)}`);
  log(`case 1a: generate() takes minP and ignoreEos (${run.tokens} tokens); a min_p of 2 is refused: ${run.bad}`);
}

/**
 * The page's origin, allowed by --allow-origin, calls the server's API from the browser (a
 * preflighted, streamed request); a page on another origin (localhost for 127.0.0.1) can neither
 * read an answer nor start a generation with a "simple" request that needs no preflight.
 */
async function caseOrigins(page, serverUrl) {
  const chat = { messages: [{ role: "user", content: "Name a prime number." }], max_tokens: 4, temperature: 0 };
  // In the page: fetches each request, giving status, response type and text, or what it threw.
  const fetchAll = ({ url, requests }) =>
    Promise.all(
      requests.map((init) =>
        fetch(url, init).then(
          async (r) => ({ status: r.status, type: r.type, text: await r.text() }),
          (e) => ({ thrown: String(e) }),
        ),
      ),
    );
  const url = `${serverUrl}v1/chat/completions`;
  const [allowed] = await page.evaluate(fetchAll, {
    url,
    requests: [{
      method: "POST",
      headers: { "content-type": "application/json", "x-stainless-os": "Linux" },
      body: JSON.stringify({ ...chat, stream: true }),
    }],
  });
  check(allowed.status === 200 && allowed.text.trim().endsWith("data: [DONE]"),
    `the allowed origin's streamed request: ${JSON.stringify(allowed).slice(0, 300)}`);

  const metrics = () => fetch(`${serverUrl}metrics`).then((r) => r.text());
  const sum = (text, start) =>
    text.split("\n").filter((l) => l.startsWith(start)).reduce((s, l) => s + Number(l.split(" ").pop()), 0);
  const refusals = (t) => sum(t, 'wgspec_requests_total{route="/v1/chat/completions",status="403"} ');
  const completions = (t) => sum(t, "wgspec_completions_total ");
  const before = await metrics();
  const other = await page.context().newPage();
  await other.goto(page.url().replace("127.0.0.1", "localhost"));
  const [readable, simple] = await other.evaluate(fetchAll, {
    url,
    requests: [
      { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(chat) },
      { method: "POST", mode: "no-cors", headers: { "content-type": "text/plain" }, body: JSON.stringify(chat) },
    ],
  });
  await other.close();
  const after = await metrics();
  check(readable.thrown && simple.type === "opaque",
    `another origin's requests: ${JSON.stringify({ readable, simple }).slice(0, 300)}`);
  check(refusals(after) - refusals(before) === 2 && completions(after) === completions(before),
    `another origin: ${refusals(after) - refusals(before)} refusals (expected 2: the preflight and the simple POST), ` +
      `${completions(after) - completions(before)} generations run (expected 0)`);
  log("case 1a: the allowed origin calls the API from the page; another origin is refused");
}

/**
 * Fields whose values belong to one run (ids, clocks, timings, the name a model is served by, the
 * prompt positions the server's prefix cache held from its earlier requests).
 */
const PER_RUN = new Set([
  "id", "created", "model", "prefill_seconds", "decode_seconds", "tokens_per_second", "cached_tokens",
]);

/**
 * Compares two JSON values field by field into `diffs`: the same keys, the same types, the same
 * values but under PER_RUN keys.
 */
function sameShape(a, b, at, diffs) {
  const kind = (v) => (v === null ? "null" : Array.isArray(v) ? "array" : typeof v);
  if (kind(a) !== kind(b)) {
    diffs.push(`${at || "/"}: ${kind(a)} on the server, ${kind(b)} in the page`);
    return;
  }
  if (kind(a) === "array") {
    if (a.length !== b.length) diffs.push(`${at}: ${a.length} items on the server, ${b.length} in the page`);
    for (let i = 0; i < Math.min(a.length, b.length); i++) sameShape(a[i], b[i], `${at}[${i}]`, diffs);
  } else if (kind(a) === "object") {
    const keys = new Set([...Object.keys(a), ...Object.keys(b)]);
    for (const k of keys) {
      if (!(k in a) || !(k in b)) diffs.push(`${at}.${k}: only ${k in a ? "on the server" : "in the page"}`);
      else if (PER_RUN.has(k)) {
        if (kind(a[k]) !== kind(b[k])) diffs.push(`${at}.${k}: ${kind(a[k])} vs ${kind(b[k])}`);
      } else sameShape(a[k], b[k], `${at}.${k}`, diffs);
    }
  } else if (a !== b) diffs.push(`${at}: ${JSON.stringify(a)} on the server, ${JSON.stringify(b)} in the page`);
}

/** Case 1c (EAGLE) and 1d (Medusa): the heads trained for SmolLM2, served from the model cache, draft in the page. */
async function caseHeads(context, baseUrl, modelUrl, nativeText, kind) {
  const [name, label] = kind === "eagle" ? ["1c", "EAGLE head"] : ["1d", "Medusa heads"];
  log(`case ${name}: the ${label} trained for SmolLM2 (served from the model cache) draft in the page`);
  const page = await newPage(context, baseUrl);
  await page.selectOption("#draft-kind", kind);
  const url = await page.inputValue("#heads-url");
  check(url === `/models/smollm2-135m-${kind}/`, `the page's default ${label} folder is ${url}`);
  const { result } = await loadAndGenerate(page, modelUrl, kind);
  await page.close();
  const s = result.stats || {};
  log(`${label} in the page: ${s.tokens_per_second?.toFixed(2)} tokens/s, τ ${s.tokens_per_target_forward?.toFixed(2)}, ` +
    `acceptance ${s.acceptance_rate?.toFixed(3)} (${s.accepted}/${s.drafted}), ${s.tree_cycles} tree cycles`);
  check(s.draft === kind && s.drafted > 0, `the ${label} did not draft: ${JSON.stringify(s)}`);
  check(result.text === nativeText, `the ${label} changed the text: ${JSON.stringify(result.text)} vs ${JSON.stringify(nativeText)}`);
  log(`case ${name} passed`);
  return s;
}

async function caseReload(context, baseUrl, modelUrl, firstText, requests) {
  log("case 1b: a reload reads the model from OPFS, with no request for it");
  const page = await newPage(context, baseUrl);
  const before = requests.count;
  const { loadSeconds, wasmMemoryBytes, result } = await loadAndGenerate(page, modelUrl);
  const downloads = requests.count - before;
  log(`reload: load ${loadSeconds.toFixed(1)} s, wasm memory ${(wasmMemoryBytes / 1e6).toFixed(1)} MB, ` +
    `${downloads} request(s) for the model`);
  check(downloads === 0, `the stored copy must be used: ${downloads} request(s) for ${MODEL_FILE}`);
  check(result.text === firstText, `the reloaded model's text differs: ${JSON.stringify(result.text)} vs ${JSON.stringify(firstText)}`);

  // With 1 MB read batches (readMb), the 98 MB file loads in a small fraction of its size. The
  // same file as the draft: the target's handle was closed after loading, the stored copy is
  // opened again (no request).
  await page.evaluate(() => window.wgspec.dispose());
  const small = await loadInPage(page, { target: modelUrl, draft: modelUrl, readMb: 1 });
  check(small.error === null, `load with readMb 1 failed: ${small.error}`);
  log(`readMb 1, the file as target and draft: wasm memory ${(small.wasmMemoryBytes / 1e6).toFixed(1)} MB, ` +
    `${requests.count - before} request(s) for the model`);
  check(small.wasmMemoryBytes < 32e6, `readMb 1: wasm memory ${small.wasmMemoryBytes} bytes, expected under 32 MB`);
  check(requests.count === before, "the stored copy must be used for the target and the draft");
  // A budget the target fits but not target + draft: the stored draft is refused from its header.
  // (the target takes 203.5 MB at 4096 positions with its f16 KV cache, leaving 146.5 MB)
  const tight = await loadInPage(page, { target: modelUrl, draft: modelUrl, maxMemoryMb: 350 });
  await page.close();
  log(`maxMemoryMb 350 with a draft: ${tight.error}`);
  // (the engine's own check, as load_draft makes it: what the target left, in bytes)
  const leftMb = Number(/([0-9.]+) MB of the 350\.0 MB budget are left/.exec(tight.error ?? "")?.[1]);
  check(
    tight.error?.startsWith("the draft model") && leftMb > 100 && leftMb < 200,
    `the draft must be refused against what the target left of the budget: ${tight.error}`,
  );
  check(!tight.events.some((e) => e.model === "draft" && e.phase === "upload"), "the refused draft reached the GPU");
  // Without storage the download is held in JS (outside wasm memory) and read from there; from
  // a server that sends 1 MiB per 40 ms, the upload must start while the model still downloads.
  const slow = await startSlowServer(MODEL);
  const page2 = await newPage(context, baseUrl);
  const uncached = await loadInPage(page2, { target: slow.url, readMb: 1, cache: false });
  await page2.close();
  slow.close();
  check(uncached.error === null, `load with cache: false failed: ${uncached.error}`);
  const target = uncached.events.filter((e) => e.model === "target");
  const firstUpload = target.findIndex((e) => e.phase === "upload");
  const downloaded = target.findIndex((e) => e.phase === "download" && e.total > 0 && e.loaded === e.total);
  log(`cache: false: wasm memory ${(uncached.wasmMemoryBytes / 1e6).toFixed(1)} MB, ` +
    `${slow.requests()} request(s) for the model; first upload event ${firstUpload}, download done at ${downloaded}`);
  check(slow.requests() === 1, "cache: false must download the model");
  check(firstUpload >= 0 && downloaded > firstUpload, "the upload must start while the model downloads");
  check(uncached.wasmMemoryBytes < 32e6, `cache: false: wasm memory ${uncached.wasmMemoryBytes} bytes, expected under 32 MB`);
  // WgSpec.clearCache() empties the OPFS folder too.
  const page3 = await newPage(context, baseUrl);
  const cleared = await page3.evaluate(async () => (await import("/pkg/wgspec.js")).WgSpec.clearCache());
  const left = await storedEntries(page3);
  await page3.close();
  check(cleared === true && left.length === 0, `clearCache: ${cleared}, left ${JSON.stringify(left)}`);
  log("case 1b passed");
  return { loadSeconds, wasmMemoryBytes, downloads, smallWasmMemoryBytes: small.wasmMemoryBytes };
}

/**
 * Serves `file` at `url` slowly (1 MiB every 40 ms, about 4 s for the model), with CORS so the
 * demo's worker may fetch it from another port.
 */
function startSlowServer(file) {
  let requests = 0;
  const server = http.createServer((req, res) => {
    requests++;
    const size = fs.statSync(file).size;
    res.writeHead(200, {
      "content-type": "application/octet-stream",
      "content-length": String(size),
      "access-control-allow-origin": "*",
    });
    const fd = fs.openSync(file, "r");
    let at = 0;
    const send = () => {
      if (at >= size || res.destroyed) {
        fs.closeSync(fd);
        res.end();
        return;
      }
      const chunk = Buffer.alloc(Math.min(1 << 20, size - at));
      fs.readSync(fd, chunk, 0, chunk.length, at);
      at += chunk.length;
      res.write(chunk);
      setTimeout(send, 40);
    };
    send();
  });
  return new Promise((resolve) => {
    server.listen(0, "127.0.0.1", () => {
      const url = `http://127.0.0.1:${server.address().port}/${path.basename(file)}`;
      resolve({ url, requests: () => requests, close: () => server.close() });
    });
  });
}

async function caseMissingFile(context, baseUrl) {
  log("case 2: a missing model URL shows an error");
  const page = await newPage(context, baseUrl);
  const missing = "/models/does-not-exist.gguf";
  await page.fill("#target-url", missing);
  await page.selectOption("#draft-kind", "none");
  await page.click("#load");
  await page.waitForSelector("#error:not([hidden])", { timeout: CASE_TIMEOUT_MS });
  const message = (await page.textContent("#error")).trim();
  await page.screenshot({ path: path.join(OUT, "error.png") });
  log(`error box: ${message}`);
  check(message.includes("404") || message.includes("does-not-exist.gguf"), `unexpected error message: ${message}`);
  check((await page.textContent("#status")).trim() === "error", "status is not \"error\" after a failed load");
  log("case 2 passed");
  await page.close();
}

async function main() {
  check(BIN, "set WGSPEC_BIN to the wgspec binary");
  check(fs.existsSync(MODEL), `model missing: ${MODEL} (run: ${BIN} fetch smollm2-135m)`);
  check(fs.existsSync(CHROMIUM), `browser missing: ${CHROMIUM} (apt-get install chromium)`);
  fs.mkdirSync(OUT, { recursive: true });

  log(`native: ${BIN} generate --max-tokens ${MAX_TOKENS} --json`);
  const nativeStdout = await run(BIN, ["generate", "--model", MODEL, "--prompt", PROMPT, "--max-tokens", String(MAX_TOKENS), "--json"], {
    timeoutMs: CASE_TIMEOUT_MS,
  });
  const jsonLine = nativeStdout.trim().split("\n").filter((l) => l.startsWith("{")).pop();
  check(jsonLine, `no JSON from the CLI:\n${nativeStdout}`);
  const native = JSON.parse(jsonLine);
  log(`native text: ${JSON.stringify(native.text)} (${native.stats?.tokens_per_second?.toFixed(2)} tokens/s)`);

  let server = null;
  let context = null;
  const userData = fs.mkdtempSync(path.join(os.tmpdir(), "wgspec-e2e-"));
  const cleanup = () => {
    server?.child.kill("SIGTERM");
    server = null;
  };
  process.on("exit", cleanup);
  for (const sig of ["SIGINT", "SIGTERM"]) {
    process.on(sig, () => {
      cleanup();
      process.exit(130);
    });
  }
  try {
    server = await startServer();
    log(`server at ${server.url}`);
    context = await chromium.launchPersistentContext(userData, {
      executablePath: CHROMIUM,
      headless: true,
      args: CHROMIUM_ARGS,
      viewport: { width: 1366, height: 768 },
    });
    const modelUrl = await findModelUrl(server.url);
    const requests = countModelRequests(context);
    await caseRefusedBeforeDownload(context, server.url, modelUrl, requests);
    await caseNoStorage(context, server.url, modelUrl);
    await caseCancelledDownload(context, server.url, modelUrl, requests);
    await caseStalledDownload(context, server.url);
    const figures = await caseGenerate(context, server.url, modelUrl, native.text, requests);
    const reload = await caseReload(context, server.url, modelUrl, native.text, requests);
    const eagle = await caseHeads(context, server.url, modelUrl, native.text, "eagle");
    const medusa = await caseHeads(context, server.url, modelUrl, native.text, "medusa");
    await caseMissingFile(context, server.url);
    log(`PASS (load ${figures.load_seconds.toFixed(1)} s downloading, ${reload.loadSeconds.toFixed(1)} s from OPFS; ` +
      `wasm memory ${(figures.wasm_memory_bytes / 1e6).toFixed(1)} MB, ` +
      `${(reload.smallWasmMemoryBytes / 1e6).toFixed(1)} MB with readMb 1; ` +
      `${figures.tokens_per_second?.toFixed(2)} tokens/s in the page, ` +
      `${native.stats?.tokens_per_second?.toFixed(2)} tokens/s native; ` +
      `EAGLE τ ${eagle.tokens_per_target_forward?.toFixed(2)}, ${eagle.tokens_per_second?.toFixed(2)} tokens/s; ` +
      `Medusa τ ${medusa.tokens_per_target_forward?.toFixed(2)}, ${medusa.tokens_per_second?.toFixed(2)} tokens/s)`);
  } finally {
    await context?.close().catch(() => {});
    cleanup();
    fs.rmSync(userData, { recursive: true, force: true });
  }
}

main().catch((err) => {
  console.error(`[e2e] FAIL: ${err instanceof Failure ? err.message : err.stack || err}`);
  process.exitCode = 1;
});

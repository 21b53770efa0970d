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
// Case 1: load the model with n-gram drafts, generate 16 greedy tokens, compare with the CLI.
// Case 2: loading a missing URL shows an error naming the 404 or the URL.

import { spawn } from "node:child_process";
import fs from "node:fs";
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
 * Starts `wgspec web --port 0` in the repository root (it serves www/ and pkg/ from there) and
 * resolves to {child, url} once it prints its address.
 */
function startServer() {
  return new Promise((resolve, reject) => {
    const child = spawn(BIN, ["web", "--port", "0"], { cwd: ROOT, env: { ...process.env, WGSPEC_CACHE: CACHE } });
    const timer = setTimeout(() => reject(new Failure("wgspec web printed no address within 60 s")), 60_000);
    child.on("error", reject);
    child.on("exit", (code, signal) => reject(new Failure(`wgspec web exited early (${code ?? signal})`)));
    readline.createInterface({ input: child.stderr }).on("line", (line) => log(`[server] ${line}`));
    const lines = readline.createInterface({ input: child.stdout });
    let first = true;
    lines.on("line", (line) => {
      if (!first) {
        log(`[server] ${line}`);
        return;
      }
      first = false;
      const match = /listening on (http:\/\/\S+)/.exec(line);
      clearTimeout(timer);
      if (match) resolve({ child, url: match[1].replace(/\/?$/, "/") });
      else reject(new Failure(`unexpected first line from wgspec web: ${line}`));
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

async function caseGenerate(context, baseUrl, nativeText) {
  log("case 1: load with n-gram drafts, generate, compare with the CLI");
  // The model's URL from the server's index (fall back to the usual path).
  let modelUrl = `/models/${MODEL_FILE}`;
  try {
    const index = await (await fetch(new URL("models/index.json", baseUrl))).json();
    const entry = index.find((m) => m.url.endsWith(`/${MODEL_FILE}`));
    if (entry) modelUrl = entry.url;
    log(`models/index.json: ${index.map((m) => m.name).join(", ") || "(empty)"}`);
  } catch (err) {
    log(`models/index.json unavailable (${err.message}); using ${modelUrl}`);
  }

  const page = await newPage(context, baseUrl);
  await page.fill("#target-url", modelUrl);
  await page.selectOption("#draft-kind", "ngram");
  await page.click("#load");
  const loaded = await waitForStatus(page, ["ready"], "load");
  check(loaded === "ready", `load failed: ${await page.textContent("#error")}`);
  const loadSeconds = await page.evaluate(() => window.wgspecLoadSeconds);
  log(`loaded in ${loadSeconds.toFixed(1)} s: ${await page.textContent("#adapter")}`);

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
    adapter: await page.evaluate(() => window.wgspec?.adapter),
  };
  fs.writeFileSync(path.join(OUT, "result.json"), JSON.stringify({ figures, native_text: nativeText, result }, null, 2));
  log(`page: load ${loadSeconds.toFixed(1)} s, ${stats.tokens_per_second?.toFixed(2)} tokens/s ` +
    `(prefill ${stats.prefill_seconds?.toFixed(2)} s, ${stats.generated_tokens} tokens, ` +
    `acceptance ${stats.acceptance_rate}, τ ${stats.tokens_per_target_forward}, finish ${result.finish_reason})`);

  const show = (s) => JSON.stringify(s);
  check(
    result.text === nativeText && output === nativeText,
    `the page's text differs from the CLI's\n  cli:    ${show(nativeText)}\n  page:   ${show(result.text)}\n` +
      `  output: ${show(output)}`,
  );
  log(`case 1 passed: ${show(result.text)}`);

  // The JS API's chat.completions.create: the body is read by the engine's OpenAI parser (the
  // server's): whole and streamed agree, usage adds up, and `n: 2` is refused naming the field.
  const chat = await page.evaluate(async () => {
    const llm = window.wgspec;
    const body = { messages: [{ role: "user", content: "Hi" }], max_tokens: 4, temperature: 0 };
    const whole = await llm.chat.completions.create(body);
    const pieces = [];
    let finish = null;
    for await (const c of await llm.chat.completions.create({ ...body, stream: true })) {
      pieces.push(c.choices[0].delta.content ?? "");
      finish = c.choices[0].finish_reason ?? finish;
    }
    let refused = "";
    try {
      await llm.chat.completions.create({ ...body, n: 2 });
    } catch (e) {
      refused = String(e.message || e);
    }
    return { whole, streamed: pieces.join(""), finish, refused };
  });
  const reply = chat.whole.choices[0];
  check(chat.whole.object === "chat.completion" && reply.message.role === "assistant", `chat shape: ${show(chat.whole)}`);
  check(chat.whole.usage.completion_tokens <= 4 && chat.whole.usage.completion_tokens > 0, `usage: ${show(chat.whole.usage)}`);
  check(chat.streamed === reply.message.content, `streamed ${show(chat.streamed)} != whole ${show(reply.message.content)}`);
  check(chat.finish === reply.finish_reason, `finish ${chat.finish} vs ${reply.finish_reason}`);
  check(chat.refused.includes("`n`"), `n: 2 must be refused naming the field, got ${show(chat.refused)}`);
  log(`chat.completions: ${show(reply.message.content)} (whole and streamed), n: 2 refused`);
  await page.close();
  return figures;
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
    const figures = await caseGenerate(context, server.url, native.text);
    await caseMissingFile(context, server.url);
    log(`PASS (load ${figures.load_seconds.toFixed(1)} s, ${figures.tokens_per_second?.toFixed(2)} tokens/s in the page, ` +
      `${native.stats?.tokens_per_second?.toFixed(2)} tokens/s native)`);
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

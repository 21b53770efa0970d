// Loads models in headless Chromium through the npm package (the demo server's /pkg/wgspec.js,
// its worker and WebGPU) and prints, per model, the file's size, the load time and the wasm
// memory after loading (`info.wasm_memory_bytes`: linear memory never shrinks, so this is the
// load's peak). A fresh page per model, so each starts from a fresh wasm instance. With
// GENERATE=N, each model then generates N greedy tokens of PROMPT plain and with n-gram drafts
// (the same text, checked) and the page's figures are printed.
//
//   node scripts/load_memory.mjs [model file in $WGSPEC_CACHE/models ...]
//
// Environment: WGSPEC_BIN (default target/release/wgspec), WGSPEC_CACHE (default ~/.cache/wgspec),
// CHROMIUM (default /usr/bin/chromium), CONTEXT (KV positions, default 1024), GENERATE (tokens,
// default 0: load only), PROMPT (default a list to continue).

import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import readline from "node:readline";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const BIN = path.resolve(ROOT, process.env.WGSPEC_BIN || "target/release/wgspec");
const CACHE = process.env.WGSPEC_CACHE || path.join(os.homedir(), ".cache", "wgspec");
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const CONTEXT = Number(process.env.CONTEXT || 1024);
const GENERATE = Number(process.env.GENERATE || 0);
const PROMPT = process.env.PROMPT || "Fruits: apple, banana, cherry. Colours: red, green, blue. Fruits: apple, banana,";
const MODELS = process.argv.slice(2).length
  ? process.argv.slice(2)
  : ["SmolLM2-135M-Instruct.Q4_1.gguf", "qwen2.5-coder-0.5b-instruct.gguf", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"];

function startServer() {
  return new Promise((resolve, reject) => {
    const child = spawn(BIN, ["web", "--port", "0"], { cwd: ROOT, env: { ...process.env, WGSPEC_CACHE: CACHE } });
    child.on("error", reject);
    readline.createInterface({ input: child.stdout }).once("line", (line) => {
      const match = /listening on (http:\/\/\S+)/.exec(line);
      if (match) resolve({ child, url: match[1].replace(/\/?$/, "/") });
      else reject(new Error(`unexpected first line from wgspec web: ${line}`));
    });
  });
}

const { child, url } = await startServer();
const browser = await chromium.launch({
  executablePath: CHROMIUM,
  args: ["--enable-unsafe-webgpu", "--no-sandbox", "--disable-gpu-sandbox", "--disable-quic"],
});
try {
  for (const file of MODELS) {
    const bytes = fs.statSync(path.join(CACHE, "models", file)).size;
    const context = await browser.newContext();
    const page = await context.newPage();
    page.on("console", (m) => { if (m.type() !== "log" || process.env.VERBOSE) console.log("[page]", m.type(), m.text().slice(0, 400)); });
    page.on("pageerror", (e) => console.log("[pageerror]", e.message));
    await page.goto(url);
    const out = await page.evaluate(
      async ({ target, context, generate, prompt }) => {
        const { WgSpec } = await import("/pkg/wgspec.js");
        const t0 = performance.now();
        const llm = await WgSpec.load({ target, context, cache: false });
        const seconds = (performance.now() - t0) / 1000;
        const info = llm.info;
        const runs = [];
        for (const draft of generate > 0 ? ["none", "ngram"] : []) {
          const r = await llm.complete(prompt, { maxTokens: generate, draft });
          runs.push({ draft, text: r.text, stats: r.stats });
        }
        await llm.dispose();
        return { info, seconds, runs };
      },
      { target: new URL(`models/${file}`, url).href, context: CONTEXT, generate: GENERATE, prompt: PROMPT },
    );
    const seconds = out.seconds;
    const mb = (n) => (n / 1e6).toFixed(1);
    console.log(
      `${file}: file ${mb(bytes)} MB, loaded in ${seconds.toFixed(1)} s, wasm memory ` +
        `${mb(out.info.wasm_memory_bytes)} MB, GPU ${mb(out.info.gpu_memory_bytes)} MB (context ${out.info.context})`,
    );
    for (const { draft, text, stats: s } of out.runs) {
      console.log(
        `  ${draft}: ${s.generated_tokens} tokens, prefill ${s.prefill_seconds.toFixed(2)} s (${s.prompt_tokens} tokens), ` +
          `decode ${s.tokens_per_second.toFixed(2)} tok/s, tau ${(s.tokens_per_target_forward ?? 1).toFixed(2)}, ` +
          `acceptance ${((s.acceptance_rate ?? 0) * 100).toFixed(0)}%: ${JSON.stringify(text)}`,
      );
    }
    if (out.runs.length === 2 && out.runs[0].text !== out.runs[1].text) {
      throw new Error(`${file}: n-gram speculation changed the text`);
    }
    await context.close();
  }
} finally {
  await browser.close();
  child.kill();
}

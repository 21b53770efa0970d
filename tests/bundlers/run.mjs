// The npm package in the web apps it is for: the packed package (`npm pack pkg/`) installed into
// this consumer app, the app built by real bundlers as their users build it, each output served
// with SmolLM2-135M and run in headless Chromium (WebGPU on SwiftShader), its 16 greedy tokens
// with n-gram drafts compared with the CLI's; the package's types checked by `tsc --strict`.
//
//   Vite, webpack 5, Parcel (production builds, no config)   the worker, the bindings and the .wasm bundled
//   Vite 8 (dev server, no config), Vite 7 (dev server, the option: optimizeDeps.exclude)
//   esbuild --bundle, Rollup + node-resolve (the option)     the worker's four files copied, `worker` passed
//   esbuild without the option                               the rejection names the worker's URL
//   esbuild without the .wasm                                the rejection names the .wasm's URL
//
//   node tests/bundlers/run.mjs   (after `npm ci` here and `./build.sh wasm`; ./build.sh test runs it)
//
// Environment: WGSPEC_BIN (default target/release/wgspec), WGSPEC_CACHE (default ~/.cache/wgspec),
// CHROMIUM (default /usr/bin/chromium).

import { execFileSync, spawn } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const APP = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(APP, "../..");
const OUT = path.join(ROOT, "target/bundlers");
const BIN = path.resolve(ROOT, process.env.WGSPEC_BIN || "target/release/wgspec");
const CACHE = process.env.WGSPEC_CACHE || path.join(os.homedir(), ".cache", "wgspec");
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf";
const PROMPT = "def fibonacci(n):";
const TOKENS = 16;
const CASE_TIMEOUT_MS = 300_000;
/** The files the package's worker needs beside it (README, "Bundlers"). */
const WORKER_FILES = ["worker.js", "names.js", "wgspec_core.js", "wgspec_core_bg.wasm"];

const log = (msg) => console.log(`[bundlers] ${msg}`);
function check(ok, msg) {
  if (!ok) throw new Error(msg);
}
const bin = (name) => path.join(APP, "node_modules/.bin", name);
const run = (cmd, args, opts = {}) => execFileSync(cmd, args, { cwd: APP, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], ...opts });

/** `npm pack pkg/`, unpacked into node_modules/wgspec as `npm install <tarball>` would. */
function installPackage() {
  fs.mkdirSync(OUT, { recursive: true });
  const packed = JSON.parse(run("npm", ["pack", path.join(ROOT, "pkg"), "--pack-destination", OUT, "--json"]));
  const tarball = path.join(OUT, packed[0].filename);
  const dest = path.join(APP, "node_modules/wgspec");
  fs.rmSync(dest, { recursive: true, force: true });
  fs.mkdirSync(dest, { recursive: true });
  run("tar", ["-xzf", tarball, "-C", dest, "--strip-components=1"]);
  log(`installed ${packed[0].filename} (${packed[0].files.length} files, ${(packed[0].size / 1e6).toFixed(1)} MB packed)`);
}

/** `index.html` of an output whose entry is `entry` (`module`: a module script, else a classic one). */
function html(dir, entry, module = true) {
  const page = fs.readFileSync(path.join(APP, "index.html"), "utf8");
  const tag = module ? `<script type="module" src="./${entry}"></script>` : `<script defer src="./${entry}"></script>`;
  fs.writeFileSync(path.join(dir, "index.html"), page.replace(/<script[^>]*src="\.\/src\/main\.js"><\/script>/, tag));
}

/** The README's option for bundlers that leave the worker alone: its files copied to `dir`/wgspec. */
function copyWorkerFiles(dir) {
  fs.mkdirSync(path.join(dir, "wgspec"), { recursive: true });
  for (const f of WORKER_FILES) fs.copyFileSync(path.join(APP, "node_modules/wgspec", f), path.join(dir, "wgspec", f));
}

/** The app as each bundler builds it for production, as its users run it (no config files). */
function build() {
  const out = Object.fromEntries(["vite", "vite7", "webpack", "parcel", "esbuild", "rollup", "esbuild-no-wasm"].map((b) => [b, path.join(OUT, b)]));
  for (const dir of Object.values(out)) fs.rmSync(dir, { recursive: true, force: true });
  run(bin("vite"), ["build", "--outDir", out.vite, "--emptyOutDir", "--logLevel", "warn"]);
  run("node", [path.join(APP, "node_modules/vite7/bin/vite.js"), "build", "--outDir", out.vite7, "--emptyOutDir", "--logLevel", "warn"]);
  run(bin("webpack"), ["--entry", "./src/main.js", "--output-path", out.webpack, "--mode", "production", "--no-stats"]);
  html(out.webpack, "main.js", false);
  run(bin("parcel"), ["build", "index.html", "--dist-dir", out.parcel, "--public-url", "./", "--no-cache", "--log-level", "warn"]);
  // esbuild and Rollup leave `new URL(..., import.meta.url)` alone: the option
  run(bin("esbuild"), ["src/main.js", "--bundle", "--format=esm", `--outfile=${path.join(out.esbuild, "main.js")}`, "--log-level=warning"]);
  html(out.esbuild, "main.js");
  copyWorkerFiles(out.esbuild);
  run(bin("rollup"), ["src/main.js", "--format", "es", "--dir", out.rollup, "-p", "node-resolve", "--silent"]);
  html(out.rollup, "main.js");
  copyWorkerFiles(out.rollup);
  // esbuild's output with the .wasm forgotten
  fs.cpSync(out.esbuild, out["esbuild-no-wasm"], { recursive: true });
  fs.rmSync(path.join(out["esbuild-no-wasm"], "wgspec", "wgspec_core_bg.wasm"));
  for (const b of ["vite", "vite7", "webpack", "parcel"]) {
    const files = fs.readdirSync(out[b], { recursive: true }).map(String);
    log(`${b}: ${files.filter((f) => /\.(js|wasm)$/.test(f)).join(", ")}`);
    check(files.some((f) => f.endsWith(".wasm")), `${b}'s build emitted no .wasm`);
    for (const f of files.filter((f) => f.endsWith(".js"))) {
      const code = fs.readFileSync(path.join(out[b], f), "utf8");
      // (no unbundled copy of the worker beside the bundled one, no path of this machine)
      check(!/from\s*["']\.\/names\.js["']/.test(code), `${b}: ${f} is an unbundled copy of worker.js`);
      check(!code.includes(APP), `${b}: ${f} holds this machine's path ${APP}`);
    }
  }
  return out;
}

const TYPES = { ".html": "text/html", ".js": "text/javascript", ".mjs": "text/javascript", ".wasm": "application/wasm", ".json": "application/json" };

/** Serves `root` and, under /models/, the model cache; resolves to its base URL. */
function serve(root) {
  const server = http.createServer((req, res) => {
    const url = new URL(req.url, "http://x");
    const rel = decodeURIComponent(url.pathname);
    const file = rel.startsWith("/models/") ? path.join(CACHE, rel) : path.join(root, rel.endsWith("/") ? `${rel}index.html` : rel);
    if (!file.startsWith(root) && !file.startsWith(path.join(CACHE, "models"))) {
      res.writeHead(403).end();
      return;
    }
    fs.stat(file, (err, st) => {
      if (err || !st.isFile()) {
        res.writeHead(404).end("not found");
        return;
      }
      res.writeHead(200, { "content-type": TYPES[path.extname(file)] || "application/octet-stream", "content-length": st.size });
      fs.createReadStream(file).pipe(res);
    });
  });
  return new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve({ server, url: `http://127.0.0.1:${server.address().port}/` })));
}

/** Opens the app at `url` and resolves to its `window.result`. */
async function runApp(browser, url) {
  const page = await browser.newPage();
  try {
    page.on("pageerror", (e) => log(`  page error: ${e.message}`));
    await page.goto(url);
    return await page.evaluate(() => window.result, undefined, { timeout: CASE_TIMEOUT_MS });
  } finally {
    await page.close();
  }
}

function query(extra = {}) {
  return "?" + new URLSearchParams({ model: `/models/${MODEL_FILE}`, prompt: PROMPT, tokens: String(TOKENS), ...extra });
}

/** A run that must generate the CLI's tokens. */
async function expectTokens(name, browser, url, native) {
  const started = Date.now();
  const r = await runApp(browser, url);
  check(r.ok, `${name}: ${r.message}`);
  check(JSON.stringify(r.tokens) === JSON.stringify(native.tokens), `${name}: tokens ${JSON.stringify(r.tokens)}, the CLI's ${JSON.stringify(native.tokens)}`);
  const s = r.stats;
  log(
    `${name}: the CLI's ${TOKENS} tokens in ${((Date.now() - started) / 1000).toFixed(1)} s (load ${r.loadSeconds.toFixed(1)} s, ` +
      `prefill ${s.prefill_seconds.toFixed(2)} s, decode ${s.tokens_per_second.toFixed(2)} tok/s, tau ${(s.tokens_per_target_forward ?? 1).toFixed(2)})`,
  );
}

/** A run that must be refused with a message holding every one of `parts`. */
async function expectRefusal(name, browser, url, parts) {
  const r = await runApp(browser, url);
  check(!r.ok, `${name}: loaded, but should have been refused`);
  for (const p of parts) check(r.message.includes(p), `${name}: the message does not name ${p}: ${r.message}`);
  log(`${name}: refused: ${r.message.slice(0, 160)}...`);
}

/** The public API's types under tsc --strict, with both module resolutions consumers use. */
function typecheck() {
  for (const resolution of ["bundler", "node16"]) {
    const module = resolution === "bundler" ? "esnext" : "node16";
    run(bin("tsc"), ["--strict", "--noEmit", "--skipLibCheck", "false", "--target", "es2022", "--lib", "es2022,dom",
      "--module", module, "--moduleResolution", resolution, "src/consumer.ts"]);
    log(`tsc --strict --moduleResolution ${resolution}: the whole API checks`);
  }
}

async function main() {
  check(fs.existsSync(path.join(ROOT, "pkg/wgspec.js")), "pkg/ is not built (./build.sh wasm)");
  check(fs.existsSync(bin("vite")), "the bundlers are not installed (npm ci in tests/bundlers)");
  const model = path.join(CACHE, "models", MODEL_FILE);
  check(fs.existsSync(model), `model missing: ${model} (wgspec fetch smollm2-135m)`);
  const nativeOut = run(BIN, ["generate", "--model", model, "--prompt", PROMPT, "--max-tokens", String(TOKENS), "--json"], { cwd: ROOT });
  const native = JSON.parse(nativeOut.trim().split("\n").filter((l) => l.startsWith("{")).pop());
  log(`the CLI: ${JSON.stringify(native.text)}`);

  installPackage();
  typecheck();
  const out = build();
  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ["--enable-unsafe-webgpu", "--no-sandbox", "--disable-gpu-sandbox", "--disable-quic"],
  });
  const servers = [];
  try {
    const at = {};
    for (const [name, dir] of Object.entries(out)) {
      const { server, url } = await serve(dir);
      servers.push(server);
      at[name] = url;
    }
    const option = { worker: "./wgspec/worker.js" };
    await expectTokens("vite build", browser, at.vite + query(), native);
    await expectTokens("vite 7 build", browser, at.vite7 + query(), native);
    await expectTokens("webpack", browser, at.webpack + query(), native);
    await expectTokens("parcel build", browser, at.parcel + query(), native);
    await expectTokens("esbuild + worker option", browser, at.esbuild + query(option), native);
    await expectTokens("rollup + worker option", browser, at.rollup + query(option), native);
    await expectRefusal("esbuild without the option", browser, at.esbuild + query(), [`${at.esbuild}worker.js`, "Bundlers"]);
    await expectRefusal("esbuild without the .wasm", browser, at["esbuild-no-wasm"] + query(option), [
      `${at["esbuild-no-wasm"]}wgspec/wgspec_core_bg.wasm`,
      "HTTP 404",
      "Bundlers",
    ]);
    // Vite's dev servers, the model through their proxy: 8 with no config; 7 pre-bundles the
    // package away from its worker unless told not to (the README's option), which it then names
    const devServers = [
      ["vite dev server", "vite", {}],
      ["vite 7 dev server without the option", "vite7", null],
      ["vite 7 dev server", "vite7", { exclude: ["wgspec"] }],
    ];
    for (const [name, dir, optimizeDeps] of devServers) {
      const { createServer } = await import(path.join(APP, "node_modules", dir, "dist/node/index.js"));
      const dev = await createServer({
        root: APP,
        configFile: false,
        logLevel: "silent",
        optimizeDeps: { ...optimizeDeps, force: true },
        server: { port: 0, host: "127.0.0.1", proxy: { "/models": at.vite.replace(/\/$/, "") } },
      });
      await dev.listen();
      try {
        const url = dev.resolvedUrls.local[0];
        if (optimizeDeps) await expectTokens(name, browser, url + query(), native);
        else await expectRefusal(name, browser, url + query(), [`${url}node_modules/.vite/deps/worker.js`, "optimizeDeps"]);
      } finally {
        await dev.close();
      }
    }
  } finally {
    for (const s of servers) s.close();
    await browser.close();
  }
  log("PASS");
}

main().catch((err) => {
  console.error(`[bundlers] FAIL: ${err.stack || err}`);
  process.exit(1);
});

// A web app as its README shows: load a model with n-gram drafts, generate greedily. The test
// driver (../run.mjs) passes the model URL and, for bundlers that need it, the worker's URL in
// the query string, and reads window.result.
import { WgSpec } from "wgspec";

const params = new URLSearchParams(location.search);
const out = document.getElementById("out");

async function main() {
  const started = performance.now();
  const llm = await WgSpec.load({
    target: new URL(params.get("model"), location.href).href,
    draft: "ngram",
    context: 256,
    cache: false,
    ...(params.get("worker") ? { worker: params.get("worker") } : {}),
  });
  const loadSeconds = (performance.now() - started) / 1000;
  const result = await llm.complete(params.get("prompt") ?? "Once upon a time", {
    maxTokens: Number(params.get("tokens") ?? 16),
  });
  await llm.dispose();
  return { text: result.text, tokens: result.tokens, stats: result.stats, loadSeconds };
}

window.result = main().then(
  (value) => {
    out.textContent = value.text;
    return { ok: true, ...value };
  },
  (err) => {
    out.textContent = String(err?.message ?? err);
    return { ok: false, message: String(err?.message ?? err) };
  },
);

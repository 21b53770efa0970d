// The wgspec demo page: load a target model (and a draft), generate with speculation, and show
// which tokens the draft supplied, the acceptance rate, τ and tokens/s as they happen.

const $ = (id) => document.getElementById(id);

/** The package, imported once; a failed import is shown in the error box. */
const pkg = import("/pkg/wgspec.js").catch((err) => {
  const message = `could not load /pkg/wgspec.js (is the package built?): ${err.message || err}`;
  showError(message);
  return { error: message };
});

/** @type {any} the loaded WgSpec instance */
let llm = null;
let busy = false;

// ---------------------------------------------------------------------------------------------
// Status, errors, progress

function setStatus(text) {
  $("status").textContent = text;
}

function showError(err) {
  const box = $("error");
  box.textContent = err instanceof Error ? err.message : String(err);
  box.hidden = false;
}

function clearError() {
  $("error").hidden = true;
  $("error").textContent = "";
}

function updateButtons() {
  $("load").disabled = busy;
  $("generate").disabled = busy || !llm;
}

function megabytes(bytes) {
  return (bytes / 1e6).toFixed(bytes < 1e7 ? 1 : 0);
}

/** Shows one WgSpec.load progress event. */
function showProgress({ model, phase, file, loaded, total }) {
  const box = $("progress");
  box.hidden = false;
  let text;
  if (phase === "download" || phase === "cache") {
    const verb = phase === "download" ? "downloading" : "reading from cache";
    const size = total ? `${megabytes(loaded)} / ${megabytes(total)} MB` : `${megabytes(loaded)} MB`;
    text = `${model}: ${verb} ${file} · ${size}`;
  } else if (phase === "upload") {
    text = `${model}: uploading to the GPU · ${megabytes(loaded)} / ${megabytes(total)} MB`;
  } else {
    text = `${model}: ready`;
  }
  $("progress-text").textContent = text;
  const fraction = total ? Math.min(1, loaded / total) : 1;
  $("progress-fill").style.width = `${(fraction * 100).toFixed(1)}%`;
  $("progress-fill").classList.toggle("indeterminate", !total);
}

window.addEventListener("unhandledrejection", (e) => showError(e.reason));

// ---------------------------------------------------------------------------------------------
// Model pickers

/** Fills the target and draft pickers from /models/index.json (the server's model cache). */
async function fillModelPickers() {
  let models = [];
  try {
    const response = await fetch("/models/index.json");
    if (response.ok) models = await response.json();
  } catch {
    // No index: the URL fields still work.
  }
  for (const [select, input, preferred] of [
    [$("target-select"), $("target-url"), 0],
    [$("draft-select"), $("draft-url"), 1],
  ]) {
    select.replaceChildren();
    for (const m of models) {
      const size = m.bytes ? ` (${megabytes(m.bytes)} MB)` : "";
      select.append(new Option(`${m.name}${size}`, m.url));
    }
    select.append(new Option("URL…", ""));
    const index = Math.min(preferred, Math.max(0, models.length - 1));
    select.selectedIndex = models.length > 0 ? index : models.length;
    input.value = select.value;
    select.addEventListener("change", () => {
      input.value = select.value;
      if (!select.value) input.focus();
    });
    input.addEventListener("input", () => {
      const match = [...select.options].find((o) => o.value === input.value.trim());
      select.value = match ? match.value : "";
    });
  }
}

/** The heads trained here for SmolLM2-135M, which `wgspec web` serves from the model cache. */
const DEFAULT_HEADS = { eagle: "/models/smollm2-135m-eagle/", medusa: "/models/smollm2-135m-medusa/" };

function updateDraftRow() {
  const kind = $("draft-kind").value;
  $("draft-model-row").hidden = !kind.startsWith("model");
  $("heads-row").hidden = !Object.hasOwn(DEFAULT_HEADS, kind);
  // switching between EAGLE and Medusa swaps a default folder for the other one
  const url = $("heads-url");
  if (Object.hasOwn(DEFAULT_HEADS, kind) && Object.values(DEFAULT_HEADS).includes(url.value.trim())) {
    url.value = DEFAULT_HEADS[kind];
  }
}

// ---------------------------------------------------------------------------------------------
// Loading

async function onLoad() {
  clearError();
  busy = true;
  updateButtons();
  setStatus("loading");
  try {
    const { WgSpec, error } = await pkg;
    if (error) throw new Error(error);
    if (llm) {
      const old = llm;
      llm = null;
      await old.dispose();
    }
    const target = $("target-url").value.trim();
    if (!target) throw new Error("choose a target model or enter its URL");
    const kind = $("draft-kind").value;
    let draft;
    if (kind.startsWith("model")) {
      draft = $("draft-url").value.trim();
      if (!draft) throw new Error("choose a draft model or enter its URL (or pick n-gram / none)");
    } else if (kind === "ngram") {
      draft = "ngram";
    }
    const heads = {};
    if (Object.hasOwn(DEFAULT_HEADS, kind)) {
      heads[kind] = $("heads-url").value.trim();
      if (!heads[kind]) throw new Error(`enter the URL of the ${kind === "eagle" ? "EAGLE head's" : "Medusa heads'"} folder (or pick another draft)`);
    }
    const started = performance.now();
    llm = await WgSpec.load({ target, draft, ...heads, onProgress: showProgress });
    window.wgspecLoadSeconds = (performance.now() - started) / 1000;
    window.wgspec = llm;
    const { info } = llm;
    $("adapter").textContent =
      `${llm.model}: ${info.arch}, ${info.layers} layers, ${(info.params / 1e6).toFixed(0)}M params · ` +
      `loaded in ${window.wgspecLoadSeconds.toFixed(1)} s (wasm memory ${megabytes(llm.wasmMemoryBytes)} MB) · ` +
      llm.adapter;
    $("chat").checked = Boolean(info.chat_template);
    $("chat").disabled = !info.chat_template;
    setStatus("ready");
  } catch (err) {
    setStatus("error");
    showError(err);
  } finally {
    busy = false;
    updateButtons();
  }
}

// ---------------------------------------------------------------------------------------------
// Generation: output, live stats, chart

/** Per verification step: [tokens from the draft, tokens from the target]. */
let steps = [];
let pendingDraft = 0;

function resetView() {
  $("output").replaceChildren();
  for (const id of ["acceptance", "share", "tau", "tps", "tokens", "prefill", "k", "plain", "finish"]) {
    $(`stat-${id}`).textContent = "–";
  }
  steps = [];
  pendingDraft = 0;
  drawChart();
  showCycleTree(null);
}

function percent(x) {
  return `${(100 * x).toFixed(1)}%`;
}

/** Live figures computed from the token stream alone. */
function showLiveStats(live, speculating) {
  $("stat-tokens").textContent = String(live.tokens);
  if (speculating) {
    $("stat-share").textContent = percent(live.fromDraft / Math.max(1, live.tokens));
    if (steps.length > 0) $("stat-tau").textContent = (live.committed / steps.length).toFixed(2);
  }
  if (live.tokens > 1) {
    const seconds = (live.lastAt - live.firstAt) / 1000;
    if (seconds > 0) $("stat-tps").textContent = ((live.tokens - 1) / seconds).toFixed(2);
  }
}

/** The exact figures from the result's stats. */
function showFinalStats(result) {
  const s = result.stats || {};
  const fixed = (x, digits = 2) => (typeof x === "number" ? x.toFixed(digits) : "–");
  $("stat-tokens").textContent = String(result.tokens.length);
  $("stat-tps").textContent = fixed(s.tokens_per_second);
  $("stat-prefill").textContent = typeof s.prefill_seconds === "number" ? `${fixed(s.prefill_seconds)} s` : "–";
  $("stat-finish").textContent = result.finish_reason;
  if (typeof s.acceptance_rate === "number") {
    $("stat-acceptance").textContent = `${percent(s.acceptance_rate)} (${s.accepted}/${s.drafted})`;
  }
  if (typeof s.tokens_per_target_forward === "number") $("stat-tau").textContent = fixed(s.tokens_per_target_forward);
  if (typeof s.mean_k === "number") $("stat-k").textContent = fixed(s.mean_k);
  if (typeof s.plain_cycles === "number") $("stat-plain").textContent = String(s.plain_cycles);
  const share = result.from_draft?.length ? result.from_draft.filter(Boolean).length / result.from_draft.length : 0;
  if (s.drafted !== undefined) $("stat-share").textContent = percent(share);
  showCycleTree(s.last_cycle);
}

/**
 * Draws the last verify pass's tokens as a tree (nested lists below the root, the last committed
 * token), the path the target accepted highlighted.
 * @param {{tokens: number[], parents: number[], accepted: number[], texts: string[]}|null|undefined} trace
 */
function showCycleTree(trace) {
  const root = $("cycle-tree");
  root.replaceChildren();
  if (!trace || !trace.tokens?.length) {
    const none = document.createElement("li");
    none.textContent = "–";
    root.append(none);
    return;
  }
  const accepted = new Set(trace.accepted);
  const items = trace.tokens.map((id, i) => {
    const li = document.createElement("li");
    const node = document.createElement("span");
    node.className = accepted.has(i) ? "node accepted" : "node";
    // quoted, so that spaces and newlines show
    node.textContent = JSON.stringify(trace.texts?.[i] ?? String(id));
    node.title = `token ${id}` + (i === 0 ? " (the last committed token)" : accepted.has(i) ? " (accepted)" : "");
    li.append(node);
    return li;
  });
  const children = new Map();
  items.forEach((li, i) => {
    if (i === 0) {
      root.append(li);
      return;
    }
    const parent = trace.parents[i];
    if (!children.has(parent)) {
      const ul = document.createElement("ul");
      children.set(parent, ul);
      items[parent].append(ul);
    }
    children.get(parent).append(li);
  });
}

/** Makes the coloured output equal the final text (a stop string may have cut the stream). */
function reconcileOutput(text) {
  const out = $("output");
  if (out.textContent === text) return;
  if (!out.textContent.startsWith(text)) {
    out.textContent = text;
    return;
  }
  let excess = out.textContent.length - text.length;
  while (excess > 0 && out.lastChild) {
    const span = out.lastChild;
    const length = span.textContent.length;
    if (length <= excess) {
      span.remove();
      excess -= length;
    } else {
      span.textContent = span.textContent.slice(0, length - excess);
      excess = 0;
    }
  }
}

function drawChart() {
  const canvas = $("chart");
  const ratio = window.devicePixelRatio || 1;
  const width = Math.max(1, Math.round(canvas.clientWidth * ratio));
  const height = Math.max(1, Math.round(canvas.clientHeight * ratio));
  if (canvas.width !== width || canvas.height !== height) {
    canvas.width = width;
    canvas.height = height;
  }
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, width, height);
  const style = getComputedStyle(document.documentElement);
  const colors = {
    draft: style.getPropertyValue("--draft-strong").trim() || "#2f9e44",
    target: style.getPropertyValue("--target-strong").trim() || "#4263eb",
    grid: style.getPropertyValue("--grid").trim() || "#ddd",
    text: style.getPropertyValue("--muted").trim() || "#666",
  };
  const pad = { left: 28 * ratio, bottom: 4 * ratio, top: 6 * ratio };
  const highest = Math.max(4, ...steps.map(([d, t]) => d + t));
  const tick = highest <= 8 ? 2 : highest <= 20 ? 4 : 8;
  const maxTokens = Math.ceil(highest / tick) * tick;
  const plotHeight = height - pad.top - pad.bottom;
  const unit = plotHeight / maxTokens;
  const y = (tokens) => height - pad.bottom - tokens * unit;

  ctx.font = `${10 * ratio}px system-ui, sans-serif`;
  ctx.fillStyle = colors.text;
  ctx.strokeStyle = colors.grid;
  ctx.lineWidth = 1;
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  for (let t = 0; t <= maxTokens; t += tick) {
    ctx.beginPath();
    ctx.moveTo(pad.left, Math.round(y(t)) + 0.5);
    ctx.lineTo(width, Math.round(y(t)) + 0.5);
    ctx.stroke();
    ctx.fillText(String(t), pad.left - 4 * ratio, y(t));
  }
  if (steps.length === 0) return;
  const slot = Math.min(14 * ratio, (width - pad.left) / steps.length);
  const bar = Math.max(1, slot - (slot > 4 ? Math.max(1, slot * 0.2) : 0));
  steps.forEach(([fromDraft, fromTarget], i) => {
    const x = pad.left + i * slot;
    ctx.fillStyle = colors.target;
    ctx.fillRect(x, y(fromTarget), bar, fromTarget * unit);
    ctx.fillStyle = colors.draft;
    ctx.fillRect(x, y(fromTarget + fromDraft), bar, fromDraft * unit);
  });
}

async function onGenerate() {
  if (!llm || busy) return;
  clearError();
  const kind = $("draft-kind").value;
  if (kind.startsWith("model") && llm.draftKind !== "model") {
    showError("no draft model is loaded: press Load with the draft model chosen, or pick n-gram / none");
    return;
  }
  if (Object.hasOwn(DEFAULT_HEADS, kind) && llm.draftKind !== kind) {
    const what = kind === "eagle" ? "EAGLE head" : "Medusa heads";
    showError(`no ${what} loaded: press Load with the ${what} chosen, or pick another draft`);
    return;
  }
  const text = $("prompt").value;
  const prompt = $("chat").checked ? [{ role: "user", content: text }] : text;
  const k = $("draft-k").value;
  const opts = {
    maxTokens: Number($("max-tokens").value) || 128,
    temperature: Number($("temperature").value) || 0,
    draft: kind,
    draftK: k === "" ? null : Number(k),
  };
  const speculating = kind !== "none";

  busy = true;
  updateButtons();
  $("stop").disabled = false;
  setStatus("generating");
  resetView();
  const out = $("output");
  const live = { tokens: 0, fromDraft: 0, committed: 0, firstAt: 0, lastAt: 0 };
  let frame = 0;
  try {
    const iterator = llm.generate(prompt, opts);
    let next;
    while (!(next = await iterator.next()).done) {
      const ev = next.value;
      const now = performance.now();
      if (ev.token !== null) {
        // A committed token (token null: held-back text flushed at the end, not a token).
        live.tokens += 1;
        live.firstAt ||= now;
        live.lastAt = now;
        if (ev.fromDraft) {
          live.fromDraft += 1;
          pendingDraft += 1;
        } else {
          // The target's own token ends a verification step.
          steps.push([pendingDraft, 1]);
          live.committed += pendingDraft + 1;
          pendingDraft = 0;
        }
      }
      if (ev.text) {
        const span = document.createElement("span");
        span.className = ev.fromDraft ? "draft" : "target";
        span.textContent = ev.text;
        out.append(span);
      }
      if (!frame) {
        frame = requestAnimationFrame(() => {
          frame = 0;
          showLiveStats(live, speculating);
          drawChart();
          out.scrollTop = out.scrollHeight;
        });
      }
    }
    const result = next.value;
    if (pendingDraft > 0) steps.push([pendingDraft, 0]); // a stop right after accepted drafts
    window.wgspecLastResult = result;
    reconcileOutput(result.text);
    showFinalStats(result);
    drawChart();
    setStatus("done");
  } catch (err) {
    setStatus("error");
    showError(err);
  } finally {
    busy = false;
    $("stop").disabled = true;
    updateButtons();
  }
}

// ---------------------------------------------------------------------------------------------
// Wiring

$("load").addEventListener("click", onLoad);
$("generate").addEventListener("click", onGenerate);
$("stop").addEventListener("click", () => llm?.abort());
$("draft-kind").addEventListener("change", updateDraftRow);
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
    e.preventDefault();
    onGenerate();
  }
});
window.addEventListener("resize", drawChart);
if (!navigator.gpu) $("adapter").textContent = "WebGPU is not available in this browser";

updateDraftRow();
updateButtons();
drawChart();
fillModelPickers();

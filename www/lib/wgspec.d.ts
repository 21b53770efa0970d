// Type declarations for wgspec's browser API (wgspec.js).

/** A chat message. */
export interface ChatMessage {
  /** The roles a chat template is given (`developer` is given as `system`); any other is refused. */
  role: "system" | "developer" | "user" | "assistant" | "tool";
  content: string;
}

/** A loading progress event. */
export interface ProgressEvent {
  model: "target" | "draft";
  /** download: bytes from the network; cache: a stored copy (no download); upload: weight bytes to the GPU. */
  phase: "download" | "cache" | "upload" | "ready";
  /** The file being read (download/cache), else null. */
  file: string | null;
  loaded: number;
  /** null while a download's size is unknown. */
  total: number | null;
}

export interface LoadOptions {
  /** URL of a .gguf file, or of a Hugging Face folder ending with "/". */
  target: string | URL;
  /** A draft model URL (same tokenizer as the target), or "ngram" for prompt-lookup drafts. */
  draft?: string | URL;
  /**
   * Medusa heads for the target: a `.safetensors` file in the public Medusa-1 layout, or a folder
   * URL ending with "/" holding `medusa_lm_head.safetensors` and optionally `config.json`.
   * Requests then draft token trees from them by default (`draft: "medusa"`).
   */
  medusa?: string | URL;
  /**
   * An EAGLE-1/2 or EAGLE-3 head for the target: a folder URL ending with "/" holding `config.json` and
   * `model.safetensors`. Requests then draft from it by default (`draft: "eagle"`).
   */
  eagle?: string | URL;
  /** KV cache positions. */
  context?: number;
  /**
   * GPU memory budget in MB for target and draft together; a model over it is refused before any
   * allocation (a GGUF model from its first bytes, before the rest is downloaded).
   */
  maxMemoryMb?: number;
  /** MB of a weight file read into wasm memory at once while loading (default 8 MiB). */
  readMb?: number;
  /** A download that gets no bytes for this many seconds fails the load (default 60). */
  stallSeconds?: number;
  onProgress?: (event: ProgressEvent) => void;
  /**
   * A Worker to use, or the URL of worker.js (default: worker.js next to wgspec.js, which Vite,
   * webpack and Parcel bundle). With esbuild or Rollup: the URL of the package's worker.js copied
   * to a served folder, with names.js, wgspec_core.js and wgspec_core_bg.wasm beside it.
   */
  worker?: Worker | string | URL;
  /**
   * Keep downloaded files (weights in the origin-private file system, JSON files in the Cache
   * API) and read them from there next time (default true).
   */
  cache?: boolean;
}

/** Information about a loaded model. */
export interface ModelInfo {
  arch: string;
  layers: number;
  dim: number;
  vocab: number;
  context: number;
  params: number;
  file_bytes: number;
  /** Weight bytes on the GPU, and in the file (equal when blocks stay as stored). */
  gpu_weight_bytes: number;
  file_weight_bytes: number;
  /** GPU memory in all: weights, KV cache and scratch. */
  gpu_memory_bytes: number;
  chat_template: boolean;
  /** The worker's wasm memory right after this model was loaded. */
  wasm_memory_bytes: number;
}

export type DraftKind =
  | "model"
  | "ngram"
  | "model+ngram"
  | "medusa"
  | "medusa+ngram"
  | "eagle"
  | "eagle+ngram"
  | "none";

export interface GenerateOptions {
  /** Default 128. */
  maxTokens?: number;
  /** 0 (the default) is greedy. */
  temperature?: number;
  topK?: number;
  topP?: number;
  /** Keep only tokens at least this fraction as likely as the likeliest (0, the default: all). */
  minP?: number;
  seed?: number;
  stop?: string | string[];
  /** End-of-generation tokens do not end it (it runs to maxTokens or a stop string). */
  ignoreEos?: boolean;
  /** Default: the draft given to load(), else "none". */
  draft?: DraftKind;
  /** A fixed K, or null/undefined for adaptive K. */
  draftK?: number | null;
  /** Default 16. */
  maxDraftK?: number;
  /** Aborts this generation (finish_reason "cancelled"). */
  signal?: AbortSignal;
}

/** One committed token. */
export interface TokenEvent {
  /** The token id; null for a final flush of text the detokenizer held back (no new token). */
  token: number | null;
  /** The decoded text this token adds (may be empty while a UTF-8 sequence is incomplete). */
  text: string;
  /** Proposed by the draft and accepted; false for the target's own token ending a verify step. */
  fromDraft: boolean;
}

export interface GenerationStats {
  prompt_tokens: number;
  generated_tokens: number;
  target_forwards: number;
  prefill_seconds: number;
  decode_seconds: number;
  tokens_per_second: number;
  /** The following are present when speculating. */
  draft?: string;
  verify_forwards?: number;
  draft_steps?: number;
  drafted?: number;
  accepted?: number;
  acceptance_rate?: number;
  acceptance_by_position?: number[];
  tokens_per_target_forward?: number;
  mean_k?: number;
  draft_seconds?: number;
  verify_seconds?: number;
  [key: string]: unknown;
}

export interface GenerationResult {
  /** The prompt's token ids (their count is stats.prompt_tokens). */
  prompt_tokens: number[];
  tokens: number[];
  from_draft: boolean[];
  text: string;
  finish_reason: "stop" | "length" | "cancelled";
  stats: GenerationStats;
}

/**
 * The fields both OpenAI routes take, read by the engine with the same parser as `wgspec serve`:
 * unknown fields and unsupported values (`n` other than 1, penalties, logprobs, tools) are refused
 * naming the field; `temperature` defaults to 1 (OpenAI's default) and `max_tokens` to the rest
 * of the context.
 */
export interface CompletionParamsBase {
  stream?: boolean;
  stream_options?: { include_usage?: boolean };
  max_tokens?: number;
  max_completion_tokens?: number;
  temperature?: number;
  top_p?: number;
  top_k?: number;
  /** vLLM's: keep only tokens at least this fraction as likely as the likeliest (0: all). */
  min_p?: number;
  /** vLLM's; only 1 (none) is accepted. */
  repetition_penalty?: number;
  /** vLLM's; only 0 (none) is accepted. */
  min_tokens?: number;
  seed?: number;
  stop?: string | string[];
  draft?: DraftKind;
  draft_k?: number | null;
  max_draft_k?: number;
  /** vLLM's: end-of-generation tokens do not end it (it runs to max_tokens or a stop string). */
  ignore_eos?: boolean;
  /** Aborts: the call rejects with an `AbortError`, or its stream ends (not an OpenAI field). */
  signal?: AbortSignal;
  /** Ignored (the loaded model answers). */
  model?: string;
}

/** openai-node's second argument to `create`; only `signal` means something here (no HTTP). */
export interface RequestOptions {
  /** Aborts: the call rejects with an `AbortError`, or its stream ends. */
  signal?: AbortSignal | null;
  [other: string]: unknown;
}

/** A streamed answer's chunks, with openai-node's `controller`: its `abort()` ends the stream. */
export interface ChunkStream<T> extends AsyncIterable<T> {
  readonly controller: AbortController;
}

/** `chat.completions.create`'s body. */
export interface ChatCompletionParams extends CompletionParamsBase {
  messages: ChatMessage[];
}

/** `completions.create`'s body. */
export interface CompletionParams extends CompletionParamsBase {
  /** One prompt (a list of one: `wgspec serve` answers several, the browser one). */
  prompt: string | string[];
}

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  /** `cached_tokens`: prompt tokens found computed (the server's prefix cache; 0 in the browser). */
  prompt_tokens_details: { cached_tokens: number };
}

/** The speculation figures of one request (the `wgspec` object of an answer's last part). */
export interface WgspecStats {
  draft: DraftKind;
  drafted: number;
  accepted: number;
  acceptance_rate: number;
  tokens_per_target_forward: number;
  mean_k: number;
  prefill_seconds: number;
  decode_seconds: number;
  tokens_per_second: number;
}

/** `wgspec`: one flag per token the answer (or chunk) carries: accepted from the draft. */
export type Wgspec = { from_draft: boolean[] } & Partial<WgspecStats>;

export type FinishReason = "stop" | "length";

export interface ChatCompletion {
  id: string;
  object: "chat.completion";
  created: number;
  model: string;
  choices: Array<{
    index: 0;
    message: { role: "assistant"; content: string };
    logprobs: null;
    finish_reason: FinishReason;
  }>;
  usage: Usage;
  wgspec: Wgspec & WgspecStats;
}

/**
 * A streamed chat chunk: the first has `delta.role`, the next `delta.content`, the last
 * `finish_reason` (and the figures in `wgspec`); with `stream_options.include_usage`, every
 * chunk has `usage: null` and a last one with no choices carries the usage.
 */
export interface ChatCompletionChunk {
  id: string;
  object: "chat.completion.chunk";
  created: number;
  model: string;
  choices: Array<{
    index: 0;
    delta: { role?: "assistant"; content?: string };
    logprobs: null;
    /** null until the last chunk. */
    finish_reason: FinishReason | null;
  }>;
  wgspec?: Wgspec;
  usage?: Usage | null;
}

export interface Completion {
  id: string;
  object: "text_completion";
  created: number;
  model: string;
  choices: Array<{ index: 0; text: string; logprobs: null; finish_reason: FinishReason }>;
  usage: Usage;
  wgspec: Wgspec & WgspecStats;
}

/** A streamed completion chunk (as ChatCompletionChunk, with `text` for `delta`). */
export interface CompletionChunk {
  id: string;
  object: "text_completion";
  created: number;
  model: string;
  choices: Array<{ index: 0; text: string; logprobs: null; finish_reason: FinishReason | null }>;
  wgspec?: Wgspec;
  usage?: Usage | null;
}

/**
 * A request refused or failed as `wgspec serve` answers it: its HTTP status and OpenAI's error
 * object, as the OpenAI client's `APIError` carries them.
 */
export class APIError extends Error {
  readonly status: number;
  readonly error: { message: string; type: string; param: string | null; code: string | null };
  readonly type: string;
  readonly param: string | null;
  readonly code: string | null;
}

export class WgSpec {
  private constructor();
  /** Starts a worker, loads the target (and draft) and resolves to a ready instance. */
  static load(options: LoadOptions): Promise<WgSpec>;
  /** Deletes the model files kept in the browser's storage (OPFS and the Cache API). */
  static clearCache(): Promise<boolean>;

  /** The GPU adapter's description. */
  readonly adapter: string;
  readonly info: ModelInfo;
  readonly draftInfo: ModelInfo | null;
  /** The draft loaded with the model: used when a call names none. */
  readonly draftKind: "model" | "ngram" | "medusa" | "eagle" | null;
  /** The Medusa heads when loaded, else null. */
  readonly medusaInfo: { heads: number; layers: number; gpu_weight_bytes: number } | null;
  /** The EAGLE head when loaded, else null. */
  readonly eagleInfo: { gpu_weight_bytes: number; gpu_memory_bytes: number } | null;
  /** The target's file or folder name. */
  readonly model: string;
  /** The worker's wasm memory after loading, in bytes (its peak: wasm memory never shrinks). */
  readonly wasmMemoryBytes: number;
  /** The last finished generation's stats. */
  readonly stats: GenerationStats | null;
  readonly lastResult: GenerationResult | null;

  /** Yields one event per committed token; the final iterator result is the whole result. */
  generate(
    prompt: string | ChatMessage[],
    opts?: GenerateOptions,
  ): AsyncGenerator<TokenEvent, GenerationResult, void>;
  /** Generates to the end, calling onToken per token. */
  complete(
    prompt: string | ChatMessage[],
    opts?: GenerateOptions & { onToken?: (event: TokenEvent) => void },
  ): Promise<GenerationResult>;
  /** Renders messages with the model's chat template (generation prompt added). */
  chatPrompt(messages: ChatMessage[]): Promise<string>;

  /** OpenAI's chat completions; refusals reject with an APIError. */
  readonly chat: {
    completions: {
      create(
        params: ChatCompletionParams & { stream: true },
        options?: RequestOptions,
      ): Promise<ChunkStream<ChatCompletionChunk>>;
      create(params: ChatCompletionParams & { stream?: false }, options?: RequestOptions): Promise<ChatCompletion>;
    };
  };
  /** OpenAI's completions of a plain prompt; refusals reject with an APIError. */
  readonly completions: {
    create(params: CompletionParams & { stream: true }, options?: RequestOptions): Promise<ChunkStream<CompletionChunk>>;
    create(params: CompletionParams & { stream?: false }, options?: RequestOptions): Promise<Completion>;
  };

  /**
   * Stops every running or queued generation: `generate`/`complete` finish with finish_reason
   * "cancelled", OpenAI-style calls reject with an `AbortError` (streams end).
   */
  abort(): void;
  /** Frees GPU memory and terminates the worker. */
  dispose(): Promise<void>;
}

export default WgSpec;

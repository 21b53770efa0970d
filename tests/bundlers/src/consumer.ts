// Every public name of the package as a TypeScript app uses it, checked by `tsc --strict
// --noEmit` (run.mjs) under moduleResolution "bundler" and "node16". Never run.
import WgSpecDefault, {
  APIError,
  WgSpec,
  type ChatCompletion,
  type ChatCompletionChunk,
  type ChatMessage,
  type ChunkStream,
  type Completion,
  type CompletionChunk,
  type DraftKind,
  type GenerateOptions,
  type GenerationResult,
  type GenerationStats,
  type LoadOptions,
  type ModelInfo,
  type ProgressEvent,
  type RequestOptions,
  type TokenEvent,
  type Usage,
  type WgspecStats,
} from "wgspec";

export async function everything(): Promise<string> {
  const progress: ProgressEvent[] = [];
  const options: LoadOptions = {
    target: new URL("/models/model.gguf", "https://example.com"),
    draft: "ngram",
    context: 512,
    maxMemoryMb: 1024,
    readMb: 8,
    cache: false,
    worker: "/wgspec/worker.js",
    onProgress: (e) => progress.push(e),
  };
  const llm: WgSpec = await WgSpecDefault.load(options);
  const info: ModelInfo = llm.info;
  const kind: DraftKind = "eagle+ngram";
  const opts: GenerateOptions = { maxTokens: 8, temperature: 0, draft: kind, draftK: null };
  const messages: ChatMessage[] = [{ role: "user", content: "Hi" }];
  for await (const event of llm.generate(messages, opts)) {
    const e: TokenEvent = event;
    if (e.fromDraft && e.token !== null) progress.length = 0;
  }
  const result: GenerationResult = await llm.complete("Once", { ...opts, onToken: (e: TokenEvent) => e.text });
  const stats: GenerationStats | null = llm.stats;
  const chat: ChatCompletion = await llm.chat.completions.create({ messages, max_tokens: 4 });
  const stream: AsyncIterable<ChatCompletionChunk> = await llm.chat.completions.create({
    messages,
    stream: true,
    stream_options: { include_usage: true },
  });
  for await (const chunk of stream) {
    const usage: Usage | null | undefined = chunk.usage;
    if (usage) return String(usage.total_tokens);
  }
  const plain: Completion = await llm.completions.create({ prompt: "x", max_tokens: 2 });
  const stopper: RequestOptions = { signal: new AbortController().signal, maxRetries: 0 };
  const chunks: ChunkStream<CompletionChunk> = await llm.completions.create({ prompt: ["x"], stream: true }, stopper);
  chunks.controller.abort();
  for await (const c of chunks) if (c.choices[0]?.finish_reason === "length") break;
  const figures: WgspecStats = plain.wgspec;
  try {
    await llm.chat.completions.create({ messages, top_p: 2 });
  } catch (err) {
    if (err instanceof APIError) return `${err.status} ${err.code ?? ""} ${err.param ?? ""} ${err.error.message}`;
  }
  const prompt: string = await llm.chatPrompt(messages);
  llm.abort();
  await llm.dispose();
  await WgSpec.clearCache();
  return [info.arch, result.text, stats?.tokens_per_second, chat.choices[0].message.content, figures.draft, prompt,
    llm.adapter, llm.model, llm.wasmMemoryBytes, llm.draftKind, llm.medusaInfo?.heads, llm.eagleInfo?.gpu_memory_bytes,
    llm.lastResult?.finish_reason, llm.draftInfo?.vocab].join(" ");
}

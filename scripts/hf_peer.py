"""The peer of `wgspec bench --synthetic` in the same GPU run: Hugging Face transformers on the
machine's PyTorch, random weights of the same configs (bf16 on CUDA: transformers' usual way to
run these models), greedy decoding at batch 1, eager attention.

For each target shape: target-only tokens/s, and assisted generation (transformers' speculative
decoding, `assistant_model`, a constant 4 draft tokens) with the target as its own assistant
(every draft accepted, as `wgspec bench --draft self`) and, for qwen2-1.5b, with the qwen2-0.5b
shape (random weights: few drafts accepted; it times the machinery). Writes one JSON object and
prints a line per figure, each starting with "hf ". Run by scripts/gpu_bench.sh; alone:

    python3 scripts/hf_peer.py --out hf-peer.json [--shapes qwen2-1.5b,qwen2-7b] [--tokens 64]
"""

import argparse
import json
import sys
import time

# The shapes of src/model/synthetic.rs (name: arch, vocab, dim, layers, heads, kv heads, ffn,
# tied embeddings, rope theta).
SHAPES = {
    "qwen2-1.5b": ("qwen2", 151936, 1536, 28, 12, 2, 8960, False, 1e6),
    "qwen2-0.5b": ("qwen2", 151936, 896, 24, 14, 2, 4864, False, 1e6),
    "qwen2-7b": ("qwen2", 152064, 3584, 28, 28, 4, 18944, False, 1e6),
    "llama-1b": ("llama", 128256, 2048, 16, 32, 8, 8192, True, 500000.0),
    "llama-8b": ("llama", 128256, 4096, 32, 32, 8, 14336, False, 500000.0),
    "smollm2-135m": ("llama", 49152, 576, 30, 9, 3, 1536, True, 100000.0),
}
PROMPT = 32  # prompt tokens


def build(torch, transformers, name, device, dtype, seed):
    arch, vocab, dim, layers, heads, kv, ffn, tied, theta = SHAPES[name]
    kwargs = dict(
        vocab_size=vocab,
        hidden_size=dim,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        intermediate_size=ffn,
        tie_word_embeddings=tied,
        rope_theta=theta,
        max_position_embeddings=4096,
        attn_implementation="eager",
    )
    config = transformers.Qwen2Config(**kwargs) if arch == "qwen2" else transformers.LlamaConfig(**kwargs)
    torch.manual_seed(seed)
    with torch.device(device):
        try:
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
        except TypeError:  # (transformers before 4.56 names it torch_dtype)
            model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=dtype)
    return model.eval()


def tokens_per_second(torch, model, ids, tokens, assistant=None):
    kwargs = dict(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=0)
    if assistant is not None:
        assistant.generation_config.num_assistant_tokens = 4
        assistant.generation_config.num_assistant_tokens_schedule = "constant"
        # (else the assistant stops drafting below 0.4 confidence: always, on random weights)
        assistant.generation_config.assistant_confidence_threshold = 0.0
        kwargs["assistant_model"] = assistant
    with torch.no_grad():
        model.generate(ids, **{**kwargs, "max_new_tokens": 4, "min_new_tokens": 4})  # warm-up
        if ids.is_cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        out = model.generate(ids, **kwargs)
        if ids.is_cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t
    return (out.shape[1] - ids.shape[1]) / seconds


# What `timed` built, for the caller to take.
BUILT = []


def timed(make):
    t = time.perf_counter()
    BUILT.append(make())
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="qwen2-1.5b,qwen2-7b")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    import torch
    import transformers

    device = args.device if args.device != "cuda" or torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    result = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "dtype": str(dtype),
        "tokens": args.tokens,
        "shapes": {},
    }
    print(f"hf torch {torch.__version__}, transformers {transformers.__version__}, {result['device']}, {dtype}")
    for name in args.shapes.split(","):
        figures = {}

        def figure(key, run):
            try:  # one figure failing leaves the others
                figures[key] = run()
            except Exception as e:
                figures[key + "_error"] = f"{type(e).__name__}: {e}"[:300]

        target = None
        figure("build_seconds", lambda: timed(lambda: build(torch, transformers, name, device, dtype, 1)))
        if "build_seconds" in figures:
            target = BUILT.pop()
            vocab = SHAPES[name][1]
            ids = torch.randint(0, vocab, (1, PROMPT), generator=torch.Generator().manual_seed(0)).to(device)
            figure("target_only", lambda: tokens_per_second(torch, target, ids, args.tokens))
            figure("assisted_by_itself_k4", lambda: tokens_per_second(torch, target, ids, args.tokens, target))
            if name == "qwen2-1.5b":
                figure("draft_build_seconds", lambda: timed(lambda: build(torch, transformers, "qwen2-0.5b", device, dtype, 2)))
                if "draft_build_seconds" in figures:
                    draft = BUILT.pop()
                    figure("assisted_by_qwen2-0.5b_k4", lambda: tokens_per_second(torch, target, ids, args.tokens, draft))
                    del draft
        del target
        if device == "cuda":
            torch.cuda.empty_cache()
        result["shapes"][name] = figures
        for k, v in figures.items():
            unit = "s" if k.endswith("seconds") else "tok/s"
            print(f"hf {name} {k}: {v:.2f} {unit}" if isinstance(v, float) else f"hf {name} {k}: {v}")
        sys.stdout.flush()
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()

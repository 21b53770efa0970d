#!/usr/bin/env python3
"""Train Medusa-1 heads for SmolLM2-135M-Instruct (Q4_1 GGUF) on CPU, on the EAGLE recipe's corpus.

Phases:
  1-2. corpus  the self-distilled and plain-text sequences with the target's final features, built (or
               reused from the cache) exactly as train_eagle.py builds them: both heads learn from the same data
  3.   train   every head's residual block; head k at position p reads f_p (the target's final feature,
               after its output norm) and learns the target's own distribution of the token k + 2 places
               ahead, softmax(lm_head(f_{p+k+1})) (soft-target cross-entropy: self-distillation)
  4.   eval    held-out top-1 / top-5 per head, with the EXPORTED float16 weights in float32
  5.   export  medusa_lm_head.safetensors (float16) + config.json into --out

The file (what `wgspec ... --draft medusa:DIR` loads) is the public Medusa-1 layout without the vocabulary
projections: per head h, `{h}.0.linear.weight` [dim, dim] and `{h}.0.linear.bias` [dim] (one residual block,
h + silu(W h + b)). Medusa initialises each head's projection `{h}.1.weight` [vocab, dim] to the target's
lm_head and each block at zero (the head starts as the target's next-token guess); here the projections stay
frozen at the lm_head, so the file leaves them out and the runtime projects every head with the target's own
output matrix (one read of it for all heads; 2 MB of f16 instead of 170 MB). A trainable [49152, 576]
projection per head would triple the step's cost on this CPU for what a 576-wide block can hardly use.

Run with the venv from setup.sh; train_medusa.sh does both.
"""

import json
import math
import os
import random
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_eagle as te  # noqa: E402

CACHE = te.CACHE

PRESETS = {
    # the EAGLE head's corpus (train_eagle.py's full preset: its cached phases are reused), one epoch
    "full": dict(te.PRESETS["full"], heads=3, epochs=1, lr=3e-3, text_frac=0.25),
    # a few minutes: the smoke corpus, 60 steps
    "smoke": dict(te.PRESETS["smoke"], heads=3, epochs=0, steps=60, lr=3e-3, text_frac=1.0),
}


class MedusaHeads(torch.nn.Module):
    """Per head one residual block h + silu(W h + b) (W, b zero at start) and a frozen projection."""

    def __init__(self, heads, dim):
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(dim, dim) for _ in range(heads)])
        for b in self.blocks:
            torch.nn.init.zeros_(b.weight)
            torch.nn.init.zeros_(b.bias)

    def block(self, k, f):
        return f + F.silu(self.blocks[k](f))


def collate(seqs, idx):
    """Features of every position, padded: [B, T, dim], and the real positions' mask."""
    T = max(len(seqs[i]["tokens"]) for i in idx)
    f0 = seqs[idx[0]]["feats"]
    feats = torch.zeros((len(idx), T, f0.shape[1]))
    mask = torch.zeros((len(idx), T), dtype=torch.bool)
    resp = torch.zeros((len(idx), T), dtype=torch.bool)
    for b, i in enumerate(idx):
        f, n, rs = seqs[i]["feats"], len(seqs[i]["tokens"]), seqs[i]["resp_start"]
        feats[b, :n] = f
        mask[b, :n] = True
        resp[b, :n] = torch.arange(n) + 1 >= rs  # position p's next token is part of the response
    return feats, mask, resp


def head_pairs(feats, mask, k):
    """Head k's inputs f_p and targets f_{p+k+1}, for the p where both are real positions."""
    s = k + 1
    m = mask[:, :-s] & mask[:, s:]
    return feats[:, :-s][m], feats[:, s:][m], m


def train(heads, W, seqs, cfg, seed):
    rng = random.Random(seed)
    nh = len(heads.blocks)
    if cfg["steps"] > 0:
        total = cfg["steps"]
    else:
        total = len(te.make_batches(seqs, cfg["batch_tokens"], random.Random(seed))) * cfg["epochs"]
    warm = max(1, int(total * cfg["warmup_frac"]))
    opt = torch.optim.AdamW(heads.parameters(), lr=cfg["lr"], betas=(0.9, 0.95), weight_decay=0.0)

    def lr_at(s):
        if s < warm:
            return cfg["lr"] * (s + 1) / warm
        return cfg["lr"] * 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, total - warm)))

    te.log(f"train: {len(seqs)} sequences, {nh} heads, {total} steps (~{cfg['batch_tokens']} tokens/batch), lr {cfg['lr']}")
    heads.train()
    step, t0, seen, hist = 0, time.time(), 0, []
    acc = dict(loss=[0.0] * nh, top1=[0] * nh, n=[0] * nh)
    Wb = W.to(torch.bfloat16)
    while step < total:
        for bidx in te.make_batches(seqs, cfg["batch_tokens"], rng):
            if step >= total:
                break
            feats, mask, _ = collate(seqs, bidx)
            for g in opt.param_groups:
                g["lr"] = lr_at(step)
            opt.zero_grad(set_to_none=True)
            for k in range(nh):
                fin, ftg, _ = head_pairs(feats, mask, k)
                if fin.shape[0] == 0:
                    continue
                with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                    tl = (ftg.to(torch.bfloat16) @ Wb.t()).float()
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    dl = heads.block(k, fin) @ Wb.t()
                loss = F.cross_entropy(dl.float(), torch.softmax(tl, -1))
                # each head's graph is freed before the next one's [positions, vocab] products
                (loss / nh).backward()
                acc["loss"][k] += float(loss.detach()) * fin.shape[0]
                acc["top1"][k] += int((dl.detach().argmax(-1) == tl.argmax(-1)).sum())
                acc["n"][k] += fin.shape[0]
            gn = torch.nn.utils.clip_grad_norm_(heads.parameters(), cfg["clip"])
            opt.step()
            seen += int(mask.sum())
            step += 1
            if step % 10 == 0 or step == total:
                dt = time.time() - t0
                rec = dict(step=step, lr=lr_at(step - 1), grad_norm=float(gn), tok_per_s=seen / dt,
                           ce=[acc["loss"][k] / max(1, acc["n"][k]) for k in range(nh)],
                           top1=[acc["top1"][k] / max(1, acc["n"][k]) for k in range(nh)])
                hist.append(rec)
                te.log(f"  step {step}/{total} ce {' '.join(f'{x:.3f}' for x in rec['ce'])} train-top1 "
                       f"{' '.join(f'{x:.3f}' for x in rec['top1'])} lr {rec['lr']:.2e} |g| {rec['grad_norm']:.2f} "
                       f"{rec['tok_per_s']:.0f} positions/s")
                acc = dict(loss=[0.0] * nh, top1=[0] * nh, n=[0] * nh)
    dt = time.time() - t0
    heads.eval()
    return dict(steps=total, positions=seen, seconds=round(dt, 1), tok_per_s=round(seen / dt, 1), history=hist)


@torch.no_grad()
def evaluate(heads, W, seqs, batch_tokens=2048):
    """Per head, over response positions: top-1 (the head's argmax == the target's argmax k + 2 places
    ahead, i.e. argmax lm_head(f_{p+k+1})) and top-5 (that token among the head's 5 best)."""
    heads.eval()
    nh = len(heads.blocks)
    agg = [dict(n=0, top1=0, top5=0, ce=0.0) for _ in range(nh)]
    for bidx in te.make_batches(seqs, batch_tokens, random.Random(0)):
        feats, mask, resp = collate(seqs, bidx)
        for k in range(nh):
            s = k + 1
            m = mask[:, :-s] & mask[:, s:] & resp[:, s:]
            if not m.any():
                continue
            fin, ftg = feats[:, :-s][m], feats[:, s:][m]
            dl, tl = heads.block(k, fin) @ W.t(), ftg @ W.t()
            tgt = tl.argmax(-1)
            top5 = dl.topk(5, -1).indices
            a = agg[k]
            a["n"] += int(m.sum())
            a["top1"] += int((top5[:, 0] == tgt).sum())
            a["top5"] += int((top5 == tgt[:, None]).any(-1).sum())
            a["ce"] += float(-(torch.softmax(tl, -1) * torch.log_softmax(dl, -1)).sum())
    return [dict(positions=a["n"], ce=a["ce"] / max(1, a["n"]), top1=a["top1"] / max(1, a["n"]),
                 top5=a["top5"] / max(1, a["n"])) for a in agg]


def export(heads, out_dir, dim, vocab):
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    sd = {}
    for h, b in enumerate(heads.blocks):
        sd[f"{h}.0.linear.weight"] = b.weight.detach().to(torch.float16).contiguous()
        sd[f"{h}.0.linear.bias"] = b.bias.detach().to(torch.float16).contiguous()
    path = os.path.join(out_dir, "medusa_lm_head.safetensors")
    save_file(sd, path, metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as fh:
        json.dump(dict(medusa_num_heads=len(heads.blocks), medusa_num_layers=1, hidden_size=dim, vocab_size=vocab,
                       base_model_name_or_path="HuggingFaceTB/SmolLM2-135M-Instruct"), fh, indent=2)
        fh.write("\n")
    return path


def load_exported(path, heads_n, dim):
    from safetensors import safe_open

    heads = MedusaHeads(heads_n, dim)
    with safe_open(path, framework="pt") as fh:
        assert sorted(fh.keys()) == sorted(f"{h}.0.linear.{p}" for h in range(heads_n) for p in ("weight", "bias"))
        for h, b in enumerate(heads.blocks):
            b.weight.data[:] = fh.get_tensor(f"{h}.0.linear.weight").float()
            b.bias.data[:] = fh.get_tensor(f"{h}.0.linear.bias").float()
    heads.eval()
    return heads


def main():
    a = te.parse_args(__doc__, PRESETS, "smollm2-135m-medusa", [
        ("heads", int), ("epochs", int), ("steps", int), ("batch_tokens", int), ("lr", float),
        ("text_frac", float), ("warmup_frac", float), ("clip", float)],
        dict(steps=0, warmup_frac=0.05, clip=0.5))
    cfg = a.cfg
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    te.seed_all(a.seed)
    os.makedirs(a.work, exist_ok=True)
    times, summary = {}, dict(preset=a.preset, cfg=cfg, seed=a.seed, versions=dict(torch=torch.__version__))
    te.log(f"preset {a.preset}: {json.dumps(cfg)}")
    T0 = time.time()

    t = time.time()
    tok, model = te.load_target(a.gguf)
    mc = model.config
    eos_id = mc.eos_token_id if isinstance(mc.eos_token_id, int) else mc.eos_token_id[0]
    pad_id = mc.pad_token_id if mc.pad_token_id is not None else eos_id
    W = model.lm_head.weight
    times["load"] = round(time.time() - t, 1)

    gen_train, gen_held, text_train, text_held = te.build_corpus(a, cfg, tok, model, eos_id, pad_id, summary, times)
    text_used = text_train[: int(len(text_train) * cfg["text_frac"])]
    train_seqs = gen_train + text_used
    summary["medusa_train_data"] = dict(sequences=len(train_seqs), tokens=sum(len(s["tokens"]) for s in train_seqs),
                                        selfdistill_sequences=len(gen_train), text_sequences=len(text_used))
    te.log(f"medusa train data: {summary['medusa_train_data']}")

    t = time.time()
    te.seed_all(a.seed)
    heads = MedusaHeads(cfg["heads"], mc.hidden_size)
    base = evaluate(heads, W, gen_held)  # zero blocks: each head guesses with the lm_head alone
    st = train(heads, W, train_seqs, cfg, a.seed)
    times["train"] = round(time.time() - t, 1)
    summary["train"] = {k: v for k, v in st.items() if k != "history"}
    summary["train_history"] = st["history"]

    t = time.time()
    path = export(heads, a.out, mc.hidden_size, mc.vocab_size)
    sha = te.sha256(path)
    heads16 = load_exported(path, cfg["heads"], mc.hidden_size)
    res = dict(before_training_heldout=base, heldout_selfdistill=evaluate(heads16, W, gen_held),
               heldout_text=evaluate(heads16, W, text_held))
    summary["eval"] = res
    times["export_eval"] = round(time.time() - t, 1)
    times["total"] = round(time.time() - T0, 1)
    summary["times_s"], summary["sha256"] = times, sha
    with open(os.path.join(a.work, "medusa_summary.json"), "w") as fh:
        json.dump(summary, fh, indent=1)
    for name, per_head in res.items():
        te.log(f"eval {name}: " + "; ".join(
            f"head {k}: top1 {m['top1']:.3f} top5 {m['top5']:.3f} ce {m['ce']:.3f} ({m['positions']})"
            for k, m in enumerate(per_head)))
    te.log(f"times (s): {times}; summary {os.path.join(a.work, 'medusa_summary.json')}")
    print(f"sha256 {sha}  {path}", flush=True)


if __name__ == "__main__":
    main()

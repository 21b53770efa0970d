#!/usr/bin/env python3
"""Train an EAGLE-1 draft head for SmolLM2-135M-Instruct (Q4_1 GGUF) on CPU.

Phases (each timed and logged; outputs cached in --work and reused when their parameters match):
  1. gen   self-distillation: the target's own responses (greedy and T=0.7) to the training prompts and
           greedy responses to the held-out prompts, with the target's final features captured on the way
           (prefill gives the prompt positions' features, every decode step the new token's feature)
  2. text  plain text shipped on this machine (Python sources, READMEs/docs), windows of --seq-len
           tokens, features from one full forward each
  3. train the head on (token, feature) sequences with the EAGLE-1 loss
  4. eval  held-out loss and top-1/top-5 draft accuracy, with the EXPORTED float16 weights in float32
  5. export model.safetensors (float16) + config.json + check.json into --out

Run with the venv from setup.sh; train_eagle.sh does both.
"""

import argparse
import glob
import gzip
import hashlib
import json
import math
import os
import random
import sys
import sysconfig
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from eagle_head import EXPECTED_SHAPES, EagleHead, head_config  # noqa: E402
from prompts import heldout_prompts, train_prompts  # noqa: E402

CACHE = os.environ.get("WGSPEC_CACHE", os.path.expanduser("~/.cache/wgspec"))
DATA_VERSION = 2  # bump when the corpus/feature code changes, so cached phase outputs are not reused

PRESETS = {
    # ~60 minutes on 2 shared CPU cores (see README.md for the measured throughputs behind it)
    "full": dict(
        train_prompts=559, samples="greedy,0.7", max_new=320, gen_batch=64,
        heldout_prompts=32, heldout_max_new=160,
        text_train=600, text_heldout=16, seq_len=512,
        epochs=2, batch_tokens=2048, lr=1e-3,
    ),
    # a 3-5 minute end-to-end check of every phase
    "smoke": dict(
        train_prompts=32, samples="greedy,0.7", max_new=96, gen_batch=32,
        heldout_prompts=12, heldout_max_new=96,
        text_train=24, text_heldout=4, seq_len=256,
        epochs=0, steps=300, batch_tokens=1024, lr=1e-3,
    ),
}


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def parse_args(doc, presets, out, overrides, defaults):
    """The options both training scripts take: --preset (one of `presets`), --gguf, --out (default
    `out` in $WGSPEC_CACHE/heads), --work, --seed, --threads, --no-reuse, and `--name VALUE` for
    each (name, type) in `overrides`, which replaces the preset's value; `a.cfg` is `defaults`
    updated by the preset, then by the overrides given."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(presets), default="full")
    ap.add_argument("--gguf", default=os.path.join(CACHE, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--out", default=os.path.join(CACHE, "heads", out))
    ap.add_argument("--work", default=None, help="phase outputs (default $WGSPEC_CACHE/train-work/<preset>)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-reuse", action="store_true", help="recompute phases even when cached outputs match")
    for k, t in overrides:
        ap.add_argument("--" + k.replace("_", "-"), dest=k, type=t, default=None)
    a = ap.parse_args()
    cfg = dict(defaults)
    cfg.update(presets[a.preset])
    for k, _ in overrides:
        v = getattr(a, k, None)
        if v is not None:
            cfg[k] = v
    a.cfg = cfg
    if a.work is None:
        a.work = os.path.join(CACHE, "train-work", a.preset)
    return a


def seed_all(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# ------------------------------------------------------------------------------------------------
# target model


def gguf_hparams(path):
    """rms_norm_eps and rope_theta straight from the GGUF metadata (not guessed)."""
    from gguf import GGUFReader

    r = GGUFReader(path)
    arch = r.fields["general.architecture"].contents()
    eps = float(r.fields[f"{arch}.attention.layer_norm_rms_epsilon"].contents())
    theta = float(r.fields[f"{arch}.rope.freq_base"].contents())
    return arch, eps, theta


def load_target(path):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import transformers.integrations.sdpa_attention as sdpa_attention

    # transformers 4.57 expands K/V to all 9 query heads (repeat_kv, a copy per layer per step) whenever an
    # attention mask is given, i.e. in every left-padded batch; torch's SDPA does grouped-query attention
    # itself (enable_gqa=True), masked or not. Same math, and 1.5x faster decoding here (145 -> 215 tok/s
    # at batch 32, context 300).
    sdpa_attention.use_gqa_in_sdpa = lambda attention_mask, key: not isinstance(key, torch.fx.Proxy)

    d, f = os.path.dirname(path), os.path.basename(path)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return tok, model


def render(tok, prompt):
    """The chat template, as the runtime renders a single user turn, with the assistant header."""
    return tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True)


# ------------------------------------------------------------------------------------------------
# phase 1: self-distillation with features captured during generation


def _cache_layers(cache):
    layers = getattr(cache, "layers", None)
    assert layers and all(hasattr(l, "keys") and hasattr(l, "values") for l in layers), \
        "this transformers version's DynamicCache has no layers[i].keys/values (pinned: 4.57.1)"
    return layers


def _left_pad(x, n, dim):
    if n == 0:
        return x
    shape = list(x.shape)
    shape[dim] = n
    return torch.cat([torch.zeros(shape, dtype=x.dtype), x], dim)


@torch.no_grad()
def generate_continuous(model, jobs, batch, max_new, eos_id, pad_id, gen, label):
    """Continuous batching with one DynamicCache: rows that finish are dropped and new prompts are
    prefilled and merged in (left-padded in the cache, masked out), so the batch stays full.

    jobs: list of dict(ids=prompt ids, temp=0 for greedy). Fills job["tokens"] (every token fed to the
    target: prompt + response; the final eos / last sampled token is not fed and not kept) and
    job["feats"] ([N, hidden], the target's final feature at each of those tokens)."""
    from transformers.cache_utils import DynamicCache

    queue = list(range(len(jobs)))
    cache, am, rows, next_pos, last = None, None, [], None, None
    t0, new_total, done, step = time.time(), 0, 0, 0
    while queue or rows:
        # admit new prompts when a quarter of the batch (or the whole queue's remainder) has room
        free = batch - len(rows)
        if queue and (free >= max(1, batch // 4) or not rows):
            take, queue = queue[:free], queue[free:]
            P = max(len(jobs[j]["ids"]) for j in take)
            ids = torch.full((len(take), P), pad_id, dtype=torch.long)
            am_n = torch.zeros((len(take), P), dtype=torch.long)
            for b, j in enumerate(take):
                n = len(jobs[j]["ids"])
                ids[b, P - n:] = torch.tensor(jobs[j]["ids"])
                am_n[b, P - n:] = 1
            pos = (am_n.cumsum(-1) - 1).clamp(min=0)
            c_n = DynamicCache()
            H = model.model(input_ids=ids, attention_mask=am_n, position_ids=pos, past_key_values=c_n,
                            use_cache=True).last_hidden_state
            for b, j in enumerate(take):
                n = len(jobs[j]["ids"])
                jobs[j]["tokens"] = list(jobs[j]["ids"])
                jobs[j]["feats"] = [H[b, P - n:].clone()]
                jobs[j]["new"] = 0
            if cache is None:
                cache, am, rows, next_pos, last = c_n, am_n, take, am_n.sum(-1), H[:, -1]
            else:
                Tc = am.shape[1]
                T = max(Tc, P)
                for lo, ln in zip(_cache_layers(cache), _cache_layers(c_n)):
                    lo.keys = torch.cat([_left_pad(lo.keys, T - Tc, 2), _left_pad(ln.keys, T - P, 2)], 0)
                    lo.values = torch.cat([_left_pad(lo.values, T - Tc, 2), _left_pad(ln.values, T - P, 2)], 0)
                am = torch.cat([_left_pad(am, T - Tc, 1), _left_pad(am_n, T - P, 1)], 0)
                rows = rows + take
                next_pos = torch.cat([next_pos, am_n.sum(-1)])
                last = torch.cat([last, H[:, -1]])
        # pick the next token of every live row
        logits = model.lm_head(last)
        nxt = logits.argmax(-1)
        temps = torch.tensor([float(jobs[j]["temp"]) for j in rows])
        samp = (temps > 0).nonzero().flatten()
        if len(samp):
            probs = torch.softmax(logits[samp] / temps[samp, None], -1)
            nxt[samp] = torch.multinomial(probs, 1, generator=gen).flatten()
        fin = [(int(nxt[i]) == eos_id or jobs[j]["new"] >= max_new) for i, j in enumerate(rows)]
        if any(fin):
            done += sum(fin)
            ki = torch.tensor([i for i, f in enumerate(fin) if not f], dtype=torch.long)
            rows = [j for j, f in zip(rows, fin) if not f]
            if not rows:
                cache = None
                continue
            cache.batch_select_indices(ki)
            am, nxt, next_pos = am[ki], nxt[ki], next_pos[ki]
            # drop cache columns that no live row attends to any more
            lead = int((am.sum(0) == 0).long().cumprod(0).sum())
            if lead:
                am = am[:, lead:]
                for l in _cache_layers(cache):
                    l.keys, l.values = l.keys[:, :, lead:], l.values[:, :, lead:]
        am = torch.cat([am, torch.ones((len(rows), 1), dtype=torch.long)], 1)
        h = model.model(input_ids=nxt[:, None], attention_mask=am, position_ids=next_pos[:, None],
                        past_key_values=cache, use_cache=True).last_hidden_state[:, 0]
        for i, j in enumerate(rows):
            jobs[j]["tokens"].append(int(nxt[i]))
            jobs[j]["feats"].append(h[i:i + 1].clone())
            jobs[j]["new"] += 1
        new_total += len(rows)
        last, next_pos = h, next_pos + 1
        step += 1
        if step % 100 == 0:
            dt = time.time() - t0
            log(f"  {label}: {done}/{len(jobs)} sequences done, {len(rows)} live, {new_total} new tokens, "
                f"{new_total / dt:.0f} new tok/s")
    for j in jobs:
        j["tokens"] = torch.tensor(j["tokens"], dtype=torch.int32)
        j["feats"] = torch.cat(j["feats"], 0)
    return new_total


def run_generation(tok, model, prompts, temps, max_new, batch, eos_id, pad_id, seed, label):
    gen = torch.Generator().manual_seed(seed)
    jobs = [dict(ids=render(tok, p), temp=t, prompt=p) for p, t in zip(prompts, temps)]
    t0 = time.time()
    new_total = generate_continuous(model, jobs, batch, max_new, eos_id, pad_id, gen, label)
    dt = time.time() - t0
    seqs = [dict(tokens=j["tokens"], feats=j["feats"], resp_start=len(j["ids"]), prompt=j["prompt"], temp=j["temp"])
            for j in jobs]
    total = sum(len(x["tokens"]) for x in seqs)
    stats = dict(sequences=len(seqs), new_tokens=new_total, tokens=total, seconds=round(dt, 1),
                 new_tok_per_s=round(new_total / dt, 1), tok_per_s=round(total / dt, 1))
    log(f"  {label}: {stats}")
    return seqs, stats


@torch.no_grad()
def check_features(model, seqs, n=3):
    """Features captured during batched generation == a plain full-sequence forward (up to rounding)."""
    worst = 0.0
    for s in seqs[:n]:
        f = model.model(input_ids=s["tokens"][None].long()).last_hidden_state[0]
        worst = max(worst, float((f - s["feats"]).abs().max()))
    return worst


# ------------------------------------------------------------------------------------------------
# phase 2: plain text shipped with installed packages


def text_files():
    """(path, kind) for candidate plain-text files, in a sorted, machine-independent order of roots."""
    purelib = sysconfig.get_paths()["purelib"]
    stdlib = sysconfig.get_paths()["stdlib"]
    roots = [purelib, stdlib] + sorted(glob.glob("/usr/lib/python3*/")) + ["/usr/share/doc"]
    skip_names = ("license", "copying", "copyright", "authors", "notice", "record", "entry_points", "top_level")
    out = []
    seen = set()
    for root in roots:
        root = os.path.realpath(root)
        if root in seen or not os.path.isdir(root):
            continue
        seen.add(root)
        for dp, dns, fns in os.walk(root):
            dns.sort()
            for fn in sorted(fns):
                low = fn.lower()
                if any(s in low for s in skip_names):
                    continue
                p = os.path.join(dp, fn)
                if low.endswith(".py"):
                    kind = "code"
                elif low.endswith((".md", ".rst", ".txt")) or low.startswith("readme"):
                    kind = "doc"
                else:
                    continue
                if low.endswith(".gz"):
                    continue
                out.append((p, kind))
    return out


def read_text(path, limit=40000):
    try:
        if os.path.getsize(path) > 2_000_000:
            return None
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rb") as fh:
            raw = fh.read(limit)
        s = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if sum(c.isprintable() or c in "\n\t" for c in s) < 0.98 * len(s):
        return None
    return s


def build_text_windows(tok, n_total, seq_len, seed):
    """n_total windows of seq_len tokens, ~55% code and ~45% docs, one window per distinct file."""
    files = text_files()
    rng = random.Random(seed)
    rng.shuffle(files)
    want = {"code": int(round(n_total * 0.55)), "doc": n_total - int(round(n_total * 0.55))}
    got = {"code": [], "doc": []}
    hashes = set()
    for path, kind in files:
        if len(got[kind]) >= want[kind]:
            if all(len(got[k]) >= want[k] for k in want):
                break
            continue
        s = read_text(path)
        if not s or len(s) < seq_len * 3:
            continue
        h = hashlib.sha1(s.encode()).hexdigest()
        if h in hashes:
            continue
        hashes.add(h)
        ids = tok(s, add_special_tokens=False)["input_ids"]
        if len(ids) < seq_len:
            continue
        start = rng.randrange(0, len(ids) - seq_len + 1)
        got[kind].append(dict(tokens=ids[start:start + seq_len], source=path))
    wins = got["code"] + got["doc"]
    rng.shuffle(wins)
    return wins, {k: len(v) for k, v in got.items()}, len(files)


@torch.no_grad()
def text_features(model, wins, batch=8, label="text"):
    t0 = time.time()
    seqs = []
    for s in range(0, len(wins), batch):
        chunk = wins[s:s + batch]
        ids = torch.tensor([w["tokens"] for w in chunk], dtype=torch.long)
        H = model.model(input_ids=ids).last_hidden_state
        for w, h in zip(chunk, H):
            seqs.append(dict(tokens=torch.tensor(w["tokens"], dtype=torch.int32), feats=h.clone(),
                             resp_start=0, source=w["source"]))
        done = sum(len(x["tokens"]) for x in seqs)
        log(f"  {label}: {len(seqs)}/{len(wins)} windows, {done / (time.time() - t0):.0f} tok/s")
    dt = time.time() - t0
    total = sum(len(x["tokens"]) for x in seqs)
    return seqs, dict(sequences=len(seqs), tokens=total, seconds=round(dt, 1), tok_per_s=round(total / max(dt, 1e-9), 1))


# ------------------------------------------------------------------------------------------------
# cached phases


def cached(path, params, reuse, fn):
    stamp = path + ".json"
    if reuse and os.path.exists(path) and os.path.exists(stamp):
        with open(stamp) as fh:
            st = json.load(fh)
        if st.get("params") == params:
            log(f"reusing {path}")
            return torch.load(path, weights_only=False), dict(st["stats"], reused=True)
    data, stats = fn()
    torch.save(data, path)
    with open(stamp, "w") as fh:
        json.dump(dict(params=params, stats=stats), fh, indent=1)
    return data, stats


# ------------------------------------------------------------------------------------------------
# training


def make_batches(seqs, batch_tokens, rng):
    """Shuffle, then group sequences of similar length so padding stays small; B * maxlen <= batch_tokens."""
    idx = list(range(len(seqs)))
    rng.shuffle(idx)
    batches = []
    for s in range(0, len(idx), 64):
        group = sorted(idx[s:s + 64], key=lambda i: len(seqs[i]["tokens"]))
        cur = []
        for i in group:
            L = len(seqs[i]["tokens"]) - 1
            if cur and (len(cur) + 1) * max(L, max(len(seqs[j]["tokens"]) - 1 for j in cur)) > batch_tokens:
                batches.append(cur)
                cur = []
            cur.append(i)
        if cur:
            batches.append(cur)
    rng.shuffle(batches)
    return batches


def collate(seqs, idx):
    """Head inputs for positions p = 0..N-2 of each sequence: token t_{p+1}, feature f_p, target f_{p+1}."""
    T = max(len(seqs[i]["tokens"]) - 1 for i in idx)
    B = len(idx)
    tok = torch.zeros((B, T), dtype=torch.long)
    fin = torch.zeros((B, T, seqs[idx[0]]["feats"].shape[1]))
    ftg = torch.zeros_like(fin)
    mask = torch.zeros((B, T), dtype=torch.bool)
    resp = torch.zeros((B, T), dtype=torch.bool)
    for b, i in enumerate(idx):
        t, f, rs = seqs[i]["tokens"], seqs[i]["feats"], seqs[i]["resp_start"]
        n = len(t) - 1
        tok[b, :n] = t[1:].long()
        fin[b, :n] = f[:-1]
        ftg[b, :n] = f[1:]
        mask[b, :n] = True
        # position p predicts token p+2: a response position when that token is part of the response
        resp[b, :n] = torch.arange(n) + 2 >= rs
    return tok, fin, ftg, mask, resp


def losses(head, W, tok, fin, ftg, mask, noise, amp):
    emb = F.embedding(tok, W)
    if noise > 0:
        fin = fin + (torch.rand_like(fin) * 2.0 - 1.0) * noise  # U(-noise, noise)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        y = head(emb, fin)
    ys = y.float()[mask]
    ts = ftg[mask]
    vloss = F.smooth_l1_loss(ys, ts, reduction="none").mean(-1).mean()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        dl = ys @ W.t()
        with torch.no_grad():
            tl = ts @ W.t()
    # soft-target cross-entropy -sum_v softmax(tl)_v * log_softmax(dl)_v, fused (probability targets)
    ploss = F.cross_entropy(dl.float(), torch.softmax(tl.float(), -1))
    return vloss, ploss, dl.detach(), tl


def train(head, W, seqs, cfg, seed, eval_fn):
    rng = random.Random(seed)
    ntok = sum(len(s["tokens"]) - 1 for s in seqs)
    if cfg["steps"] > 0:
        total_steps = cfg["steps"]
    else:
        per_epoch = len(make_batches(seqs, cfg["batch_tokens"], random.Random(seed)))
        total_steps = per_epoch * cfg["epochs"]
    warm = max(1, int(total_steps * cfg["warmup_frac"]))
    opt = torch.optim.AdamW(head.parameters(), lr=cfg["lr"], betas=(0.9, 0.95), weight_decay=cfg["weight_decay"])

    def lr_at(s):  # linear warmup, cosine decay to 0
        if s < warm:
            return cfg["lr"] * (s + 1) / warm
        return cfg["lr"] * 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, total_steps - warm)))

    log(f"train: {len(seqs)} sequences, {ntok} head positions, {total_steps} steps "
        f"(~{cfg['batch_tokens']} tokens/batch), lr {cfg['lr']} warmup {warm}")
    head.train()
    step, t0, seen = 0, time.time(), 0
    hist = []
    acc = dict(v=0.0, p=0.0, n=0, top1=0, cnt=0)
    while step < total_steps:
        for bidx in make_batches(seqs, cfg["batch_tokens"], rng):
            if step >= total_steps:
                break
            tok, fin, ftg, mask, _ = collate(seqs, bidx)
            for g in opt.param_groups:
                g["lr"] = lr_at(step)
            vloss, ploss, dl, tl = losses(head, W, tok, fin, ftg, mask, cfg["noise"], amp=True)
            loss = vloss + cfg["ce_weight"] * ploss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gn = torch.nn.utils.clip_grad_norm_(head.parameters(), cfg["clip"])
            opt.step()
            n = int(mask.sum())
            seen += n
            acc["v"] += float(vloss.detach()) * n
            acc["p"] += float(ploss.detach()) * n
            acc["n"] += n
            acc["top1"] += int((dl.argmax(-1) == tl.argmax(-1)).sum())
            step += 1
            if step % 20 == 0 or step == total_steps:
                dt = time.time() - t0
                rec = dict(step=step, vloss=acc["v"] / acc["n"], ploss=acc["p"] / acc["n"],
                           loss=(acc["v"] + cfg["ce_weight"] * acc["p"]) / acc["n"], top1=acc["top1"] / acc["n"],
                           lr=lr_at(step - 1), grad_norm=float(gn), tok_per_s=seen / dt)
                hist.append(rec)
                log(f"  step {step}/{total_steps} loss {rec['loss']:.4f} (smoothl1 {rec['vloss']:.4f} ce {rec['ploss']:.3f}) "
                    f"train-top1 {rec['top1']:.3f} lr {rec['lr']:.2e} |g| {rec['grad_norm']:.2f} {rec['tok_per_s']:.0f} tok/s")
                acc = dict(v=0.0, p=0.0, n=0, top1=0, cnt=0)
            if eval_fn is not None and cfg.get("eval_every") and step % cfg["eval_every"] == 0:
                eval_fn(head)
    dt = time.time() - t0
    head.eval()
    return dict(steps=total_steps, head_positions_per_epoch=ntok, token_passes=seen, seconds=round(dt, 1),
                tok_per_s=round(seen / dt, 1), history=hist)


@torch.no_grad()
def evaluate(head, W, seqs, ce_weight, batch_tokens=2048):
    """float32, no noise. top-1: argmax of the draft logits == the target's argmax at p+2 (= argmax
    lm_head(f_{p+1})); top-5: the target's argmax among the draft's 5 best."""
    head.eval()
    agg = {k: dict(v=0.0, p=0.0, n=0, top1=0, top5=0) for k in ("all", "response")}
    for bidx in make_batches(seqs, batch_tokens, random.Random(0)):
        tok, fin, ftg, mask, resp = collate(seqs, bidx)
        emb = F.embedding(tok, W)
        y = head(emb, fin)
        for key, m in (("all", mask), ("response", mask & resp)):
            if not m.any():
                continue
            ys, ts = y[m], ftg[m]
            v = F.smooth_l1_loss(ys, ts, reduction="none").mean(-1)
            dl, tl = ys @ W.t(), ts @ W.t()
            p = -(torch.softmax(tl, -1) * torch.log_softmax(dl, -1)).sum(-1)
            tgt = tl.argmax(-1)
            top5 = dl.topk(5, -1).indices
            a = agg[key]
            a["v"] += float(v.sum())
            a["p"] += float(p.sum())
            a["n"] += int(m.sum())
            a["top1"] += int((top5[:, 0] == tgt).sum())
            a["top5"] += int((top5 == tgt[:, None]).any(-1).sum())
    out = {}
    for k, a in agg.items():
        if a["n"]:
            out[k] = dict(positions=a["n"], smoothl1=a["v"] / a["n"], ce=a["p"] / a["n"],
                          loss=(a["v"] + ce_weight * a["p"]) / a["n"], top1=a["top1"] / a["n"], top5=a["top5"] / a["n"])
    return out


# ------------------------------------------------------------------------------------------------
# export


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for blk in iter(lambda: fh.read(1 << 20), b""):
            h.update(blk)
    return h.hexdigest()


def export(head, out_dir, eps, theta):
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    sd = {k: v.detach().to(torch.float16).contiguous() for k, v in head.state_dict().items()}
    assert {k: tuple(v.shape) for k, v in sd.items()} == EXPECTED_SHAPES, sorted(sd)
    st = os.path.join(out_dir, "model.safetensors")
    save_file(sd, st, metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as fh:
        json.dump(head_config(eps, theta), fh, indent=2)
        fh.write("\n")
    return st


def load_exported(st, eps, theta):
    """The head from the exported float16 file, in float32 (what the checks and the runtime use)."""
    from safetensors import safe_open

    head = EagleHead(eps=eps, theta=theta)
    sd = {}
    with safe_open(st, framework="pt") as fh:
        names = list(fh.keys())
        for k in names:
            sd[k] = fh.get_tensor(k)
    dtypes = {str(v.dtype) for v in sd.values()}
    head.load_state_dict({k: v.float() for k, v in sd.items()}, strict=True)
    head.eval()
    return head, {k: (list(sd[k].shape), str(sd[k].dtype)) for k in sorted(names)}, dtypes


@torch.no_grad()
def write_check(head, tok, model, prompt, out_dir, eps, theta, sha):
    ids = render(tok, prompt)
    L = len(ids)
    f = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0]  # full-sequence float32 forward
    W = model.lm_head.weight
    emb = F.embedding(torch.tensor([ids[1:]]), W)
    y = head(emb, f[None, :-1])[0]  # positions 0..L-2
    logits = y @ W.t()
    rows = []
    for p in range(L - 4, L - 1):
        top = logits[p].topk(5)
        rows.append(dict(
            position=p,
            input_token=ids[p + 1],
            target_feature_first8=[round(float(x), 6) for x in f[p, :8]],
            predicted_feature_first8=[round(float(x), 6) for x in y[p, :8]],
            draft_top5_ids=[int(i) for i in top.indices],
            draft_top5_logits=[round(float(x), 5) for x in top.values],
            target_argmax_token_p_plus_2=int((f[p + 1] @ W.t()).argmax()) if p + 1 < L else None,
        ))
    check = dict(
        prompt=prompt,
        ids=ids,
        convention=("head position p takes (token ids[p+1], target feature f_p) with RoPE position p and causal "
                    "attention over head positions 0..p; predicted_feature = f^_{p+1}; draft logits = "
                    "lm_head(f^_{p+1}) with the target's tied lm_head, no norm; draft_top5_ids[0] is the head's guess of the "
                    "token at p+2, target_argmax_token_p_plus_2 the target's own choice there (argmax lm_head(f_{p+1}))"),
        target_features=("float32 transformers forward of the whole ids sequence through the dequantized GGUF, "
                         "last_hidden_state after the final RMSNorm"),
        head_weights="model.safetensors (float16) converted to float32; all head math in float32",
        rms_norm_eps=eps,
        rope_theta=theta,
        model_sha256=sha,
        positions=rows,
    )
    path = os.path.join(out_dir, "check.json")
    with open(path, "w") as fh:
        json.dump(check, fh, indent=1)
        fh.write("\n")
    return path, check


# ------------------------------------------------------------------------------------------------
# self-test: the hand-written head == transformers' LlamaDecoderLayer without input_layernorm


@torch.no_grad()
def selftest(eps, theta):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    cfg = LlamaConfig(**{k: v for k, v in head_config(eps, theta).items() if k not in ("architectures", "torch_dtype", "bias")},
                      head_dim=64)
    cfg._attn_implementation = "eager"
    g = torch.Generator().manual_seed(0)
    head = EagleHead(eps=eps, theta=theta)
    for p in head.parameters():
        p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    layer = LlamaDecoderLayer(cfg, layer_idx=0).eval()
    layer.input_layernorm = torch.nn.Identity()
    layer.load_state_dict({k[len("layers.0."):]: v for k, v in head.state_dict().items() if k.startswith("layers.0.")})
    rope = LlamaRotaryEmbedding(cfg)
    emb, feat = torch.randn(1, 37, 576, generator=g), torch.randn(1, 37, 576, generator=g)
    x = head.fc(torch.cat([emb, feat], -1))
    pos = torch.arange(37)[None]
    mask = torch.full((37, 37), float("-inf")).triu(1)[None, None]
    ref = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=rope(x, pos))
    ref = ref[0] if isinstance(ref, tuple) else ref
    ours = head(emb, feat)
    err = float((ours - ref).abs().max())
    log(f"selftest: hand-written head vs transformers LlamaDecoderLayer (no input_layernorm): max |diff| {err:.2e}")
    assert err < 1e-4, err


# ------------------------------------------------------------------------------------------------


def build_corpus(a, cfg, tok, model, eos_id, pad_id, summary, times):
    """Phases 1 and 2 (cached in a.work): the self-distilled and plain-text sequences, each
    {"tokens", "feats" (the target's final features, after its output norm), "resp_start", ...}.
    Returns (gen_train, gen_heldout, text_train, text_heldout); fills summary and times."""
    reuse = not a.no_reuse
    # -- phase 1: self-distillation
    t = time.time()
    temps_list = [0.0 if s == "greedy" else float(s) for s in cfg["samples"].split(",")]
    tp = train_prompts(a.seed)[: cfg["train_prompts"]]
    prompts = [p for p in tp for _ in temps_list]
    temps = [tt for _ in tp for tt in temps_list]
    gparams = dict(version=DATA_VERSION, prompts=prompts, temps=temps, max_new=cfg["max_new"], batch=cfg["gen_batch"], seed=a.seed, gguf=a.gguf)
    gen_train, st_gen = cached(os.path.join(a.work, "gen_train.pt"), gparams, reuse, lambda: run_generation(
        tok, model, prompts, temps, cfg["max_new"], cfg["gen_batch"], eos_id, pad_id, a.seed, "gen/train"))
    hp = heldout_prompts()[: cfg["heldout_prompts"]]
    hparams = dict(version=DATA_VERSION, prompts=hp, max_new=cfg["heldout_max_new"], batch=cfg["gen_batch"], seed=a.seed + 1, gguf=a.gguf)
    gen_held, st_held = cached(os.path.join(a.work, "gen_heldout.pt"), hparams, reuse, lambda: run_generation(
        tok, model, hp, [0.0] * len(hp), cfg["heldout_max_new"], cfg["gen_batch"], eos_id, pad_id, a.seed + 1, "gen/heldout"))
    times["generate"] = round(time.time() - t, 1)
    err = check_features(model, gen_train)
    summary["gen_feature_check_max_abs_diff"] = err
    log(f"features captured while generating vs a full forward of the same tokens: max |diff| {err:.2e}")
    assert err < 1e-2, err
    summary["generate_train"], summary["generate_heldout"] = st_gen, st_held
    log(f"generation: train {st_gen}, held-out {st_held}")
    ex = gen_train[0]
    log(f"  sample (T={ex['temp']}): {ex['prompt']!r} -> {tok.decode(ex['tokens'][ex['resp_start']:].tolist())[:300]!r}")

    # -- phase 2: plain text
    t = time.time()
    n_text = cfg["text_train"] + cfg["text_heldout"]
    tparams = dict(version=DATA_VERSION, n=n_text, seq_len=cfg["seq_len"], seed=a.seed, gguf=a.gguf)

    def text_phase():
        wins, kinds, nfiles = build_text_windows(tok, n_text, cfg["seq_len"], a.seed)
        log(f"text: {nfiles} candidate files, windows {kinds}")
        seqs, st = text_features(model, wins)
        st.update(kinds=kinds, candidate_files=nfiles)
        return seqs, st

    text_seqs, st_text = cached(os.path.join(a.work, "text.pt"), tparams, reuse, text_phase)
    times["text"] = round(time.time() - t, 1)
    summary["text"] = st_text
    text_train, text_held = text_seqs[: cfg["text_train"]], text_seqs[cfg["text_train"]:]
    log(f"text: {st_text}")

    train_seqs = gen_train + text_train
    ntr = sum(len(s["tokens"]) for s in train_seqs)
    summary["train_data"] = dict(sequences=len(train_seqs), tokens=ntr,
                                 selfdistill_tokens=sum(len(s["tokens"]) for s in gen_train),
                                 text_tokens=sum(len(s["tokens"]) for s in text_train))
    fr = torch.cat([s["feats"] for s in train_seqs[:64]])
    summary["feature_rms"] = float(fr.pow(2).mean().sqrt())
    log(f"train data: {summary['train_data']}; feature rms {summary['feature_rms']:.3f}, max |f| {float(fr.abs().max()):.2f}")

    return gen_train, gen_held, text_train, text_held


def main():
    a = parse_args(__doc__, PRESETS, "smollm2-135m-eagle", [
        ("train_prompts", int), ("samples", str), ("max_new", int), ("gen_batch", int),
        ("heldout_prompts", int), ("heldout_max_new", int), ("text_train", int),
        ("text_heldout", int), ("seq_len", int), ("epochs", int), ("steps", int),
        ("batch_tokens", int), ("lr", float), ("noise", float), ("ce_weight", float),
        ("warmup_frac", float), ("clip", float), ("weight_decay", float)],
        dict(steps=0, noise=0.1, ce_weight=0.1, warmup_frac=0.05, clip=0.5, weight_decay=0.0))
    cfg = a.cfg
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    seed_all(a.seed)
    os.makedirs(a.work, exist_ok=True)
    times = {}
    summary = dict(preset=a.preset, cfg=cfg, seed=a.seed, versions=dict(torch=torch.__version__))
    import transformers

    summary["versions"]["transformers"] = transformers.__version__
    log(f"preset {a.preset}: {json.dumps(cfg)}")
    T0 = time.time()

    arch, eps, theta = gguf_hparams(a.gguf)
    log(f"GGUF {a.gguf}: arch {arch}, rms_norm_eps {eps!r}, rope_theta {theta!r}")
    selftest(eps, theta)

    t = time.time()
    tok, model = load_target(a.gguf)
    mc = model.config
    assert (mc.hidden_size, mc.num_hidden_layers, mc.num_attention_heads, mc.num_key_value_heads, mc.vocab_size) == (576, 30, 9, 3, 49152)
    assert abs(mc.rms_norm_eps - eps) < 1e-12 and abs(mc.rope_theta - theta) < 1e-6, (mc.rms_norm_eps, mc.rope_theta)
    eos_id = mc.eos_token_id if isinstance(mc.eos_token_id, int) else mc.eos_token_id[0]
    pad_id = mc.pad_token_id if mc.pad_token_id is not None else eos_id
    W = model.lm_head.weight
    assert W.data_ptr() == model.model.embed_tokens.weight.data_ptr(), "expected tied embeddings"
    times["load"] = round(time.time() - t, 1)
    log(f"target loaded in {times['load']}s; eos {eos_id} = {tok.convert_ids_to_tokens([eos_id])}, pad {pad_id}")

    gen_train, gen_held, text_train, text_held = build_corpus(a, cfg, tok, model, eos_id, pad_id, summary, times)
    train_seqs = gen_train + text_train

    # -- phase 3: train
    t = time.time()
    seed_all(a.seed)
    head = EagleHead(eps=eps, theta=theta)
    head.init_weights()
    st_train = train(head, W, train_seqs, cfg, a.seed, None)
    times["train"] = round(time.time() - t, 1)
    summary["train"] = {k: v for k, v in st_train.items() if k != "history"}
    summary["train_history"] = st_train["history"]

    # -- phase 4/5: export, reload the float16 file, evaluate it, check.json
    t = time.time()
    st_path = export(head, a.out, eps, theta)
    sha = sha256(st_path)
    head16, names, dtypes = load_exported(st_path, eps, theta)
    log(f"exported {st_path}: dtypes {sorted(dtypes)}")
    for k, (shape, dt) in names.items():
        log(f"  {k:45s} {shape} {dt}")
    assert {k: tuple(v[0]) for k, v in names.items()} == EXPECTED_SHAPES and dtypes == {"torch.float16"}
    res = dict(
        heldout_selfdistill=evaluate(head16, W, gen_held, cfg["ce_weight"]),
        heldout_text=evaluate(head16, W, text_held, cfg["ce_weight"]),
        train_selfdistill_subset=evaluate(head16, W, gen_train[: max(8, len(gen_train) // 10)], cfg["ce_weight"]),
    )
    summary["eval"] = res
    cpath, check = write_check(head16, tok, model, heldout_prompts()[12], a.out, eps, theta, sha)
    times["export_eval"] = round(time.time() - t, 1)
    times["total"] = round(time.time() - T0, 1)
    summary["times_s"] = times
    summary["model_sha256"] = sha
    with open(os.path.join(a.work, "summary.json"), "w") as fh:
        json.dump(summary, fh, indent=1)
    for k, r in res.items():
        for sub, m in r.items():
            log(f"eval {k}/{sub}: positions {m['positions']} loss {m['loss']:.4f} (smoothl1 {m['smoothl1']:.4f} "
                f"ce {m['ce']:.3f}) top1 {m['top1']:.4f} top5 {m['top5']:.4f}")
    log(f"check.json: {cpath} ({len(check['ids'])} ids; positions {[r['position'] for r in check['positions']]})")
    log(f"times (s): {times}")
    log(f"summary: {os.path.join(a.work, 'summary.json')}")
    print(f"sha256 {sha}  {st_path}", flush=True)


if __name__ == "__main__":
    main()

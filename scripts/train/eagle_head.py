"""The EAGLE-1 draft head, written out by hand (the runtime implements the same math).

For a token sequence t_0..t_{L-1} and the target's final features f_0..f_{L-1} (the last hidden state
AFTER the target's final RMSNorm, i.e. the vector its lm_head multiplies), the head runs over positions
p = 0..L-2 with input (t_{p+1}, f_p):

    e_p = embed(t_{p+1})                                   target's embedding table, frozen
    x_p = fc(cat([e_p, f_p]))                              embedding first; fc has a bias
    q, k, v = q_proj(x_p), k_proj(x_p), v_proj(x_p)        NO norm before them (EAGLE-1 drops input_layernorm)
    q, k = rope(q, p), rope(k, p)                          HF "rotate_half" RoPE, theta = target's rope_theta
    a_p = softmax(q k^T / sqrt(64), causal over 0..p) v    9 query heads, 3 kv heads (query head h reads kv head h // 3)
    h_p = x_p + o_proj(a_p)
    n_p = RMSNorm(h_p) * post_attention_layernorm.weight   eps = target's rms_norm_eps
    y_p = h_p + down_proj(silu(gate_proj(n_p)) * up_proj(n_p))

y_p is the predicted feature f^_{p+1}; the draft logits are lm_head(y_p) with the target's tied lm_head
and no norm in between; the draft token t^_{p+2} = argmax of them.

Parameter names (state_dict keys) are exactly the public EAGLE-1 ones:
    fc.weight [576, 1152], fc.bias [576]
    layers.0.self_attn.{q,k,v,o}_proj.weight
    layers.0.post_attention_layernorm.weight
    layers.0.mlp.{gate,up,down}_proj.weight
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float):
    """cos, sin of shape [T, head_dim] in the HF convention: frequencies duplicated (cat(freqs, freqs))."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    freqs = positions.to(torch.float64)[:, None] * inv_freq[None, :]  # [T, head_dim/2]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(torch.float32), emb.sin().to(torch.float32)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf


class Attention(nn.Module):
    def __init__(self, hidden, n_heads, n_kv, head_dim, theta):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim, self.theta = n_heads, n_kv, head_dim, theta
        self.q_proj = nn.Linear(hidden, n_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, n_kv * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, n_kv * head_dim, bias=False)
        self.o_proj = nn.Linear(n_heads * head_dim, hidden, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).float().view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).float().view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).float().view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.n_heads // self.n_kv
        k = k.repeat_interleave(rep, dim=1)  # kv head j serves query heads j*rep .. j*rep+rep-1
        v = v.repeat_interleave(rep, dim=1)
        # Causal over the head's own positions; right padding needs no extra mask (a real position
        # never attends to a later, padded one).
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / math.sqrt(self.head_dim))
        a = a.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)
        return self.o_proj(a)


class MLP(nn.Module):
    def __init__(self, hidden, inter):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    """A Llama decoder layer WITHOUT input_layernorm (EAGLE-1's first layer)."""

    def __init__(self, hidden, inter, n_heads, n_kv, head_dim, eps, theta):
        super().__init__()
        self.self_attn = Attention(hidden, n_heads, n_kv, head_dim, theta)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.mlp = MLP(hidden, inter)

    def forward(self, x, cos, sin):
        h = x.float() + self.self_attn(x, cos, sin).float()
        return h + self.mlp(self.post_attention_layernorm(h)).float()


class EagleHead(nn.Module):
    def __init__(self, hidden=576, inter=1536, n_heads=9, n_kv=3, head_dim=64, eps=1e-5, theta=100000.0):
        super().__init__()
        self.hidden, self.head_dim, self.theta = hidden, head_dim, theta
        self.fc = nn.Linear(2 * hidden, hidden, bias=True)
        self.layers = nn.ModuleList([Layer(hidden, inter, n_heads, n_kv, head_dim, eps, theta)])

    def init_weights(self, std=0.02):
        """Llama-style init: N(0, std) for every projection, zero bias, unit norm weight."""
        for name, p in self.named_parameters():
            if name.endswith("layernorm.weight"):
                nn.init.ones_(p)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
            else:
                nn.init.normal_(p, 0.0, std)

    def forward(self, emb: torch.Tensor, feat: torch.Tensor) -> torch.Tensor:
        """emb = embed(t_{p+1}), feat = f_p, both [B, T, hidden], positions 0..T-1. Returns f^_{p+1}."""
        T = emb.shape[1]
        cos, sin = rope_cos_sin(torch.arange(T), self.head_dim, self.theta)
        x = self.fc(torch.cat([emb, feat], dim=-1))
        return self.layers[0](x, cos, sin)


def head_config(eps: float, theta: float) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "num_hidden_layers": 1,
        "rms_norm_eps": eps,
        "rope_theta": theta,
        "vocab_size": 49152,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
        "bias": True,
        "torch_dtype": "float16",
    }


EXPECTED_SHAPES = {
    "fc.weight": (576, 1152),
    "fc.bias": (576,),
    "layers.0.self_attn.q_proj.weight": (576, 576),
    "layers.0.self_attn.k_proj.weight": (192, 576),
    "layers.0.self_attn.v_proj.weight": (192, 576),
    "layers.0.self_attn.o_proj.weight": (576, 576),
    "layers.0.post_attention_layernorm.weight": (576,),
    "layers.0.mlp.gate_proj.weight": (1536, 576),
    "layers.0.mlp.up_proj.weight": (1536, 576),
    "layers.0.mlp.down_proj.weight": (576, 1536),
}

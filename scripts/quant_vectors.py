#!/usr/bin/env python3
"""Writes the dequantization test vectors in tests/data/quant/.

For each block type (and F16, BF16) this makes a few blocks of random but valid bytes
(seeded; f16 scales are finite normal numbers), dequantizes them with the PyPI `gguf`
package (`gguf.quants.dequantize`, the reference), and saves
    tests/data/quant/<TYPE>.bin   the raw bytes
    tests/data/quant/<TYPE>.f32   the little-endian f32 result
tests/loader.rs checks `quant::dequantize` against these bit for bit. CI does not run this.

Usage: python3 scripts/quant_vectors.py   (needs `pip install gguf numpy`)
"""
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "quant"
rng = np.random.default_rng(20240531)


def f16_scales(n: int, spread: float) -> np.ndarray:
    """n finite, normal f16 scales of both signs around `spread` (as raw bytes, shape (n, 2))."""
    mag = np.exp(rng.uniform(np.log(spread / 100), np.log(spread * 10), n))
    x = (mag * rng.choice([-1.0, 1.0], n)).astype(np.float16)
    assert np.all(np.isfinite(x)) and np.all(np.abs(x) >= np.finfo(np.float16).tiny)
    return x.view(np.uint8).reshape(n, 2)


def rand_bytes(n: int, k: int) -> np.ndarray:
    return rng.integers(0, 256, size=(n, k), dtype=np.uint8)


def q4_0(n):  # d, qs[16]
    return np.concatenate([f16_scales(n, 0.05), rand_bytes(n, 16)], axis=1)


def q4_1(n):  # d, m, qs[16]
    return np.concatenate([f16_scales(n, 0.05), f16_scales(n, 0.5), rand_bytes(n, 16)], axis=1)


def q5_0(n):  # d, qh[4], qs[16]
    return np.concatenate([f16_scales(n, 0.05), rand_bytes(n, 4), rand_bytes(n, 16)], axis=1)


def q8_0(n):  # d, qs[32]
    return np.concatenate([f16_scales(n, 0.01), rand_bytes(n, 32)], axis=1)


def q4_k(n):  # d, dmin, scales[12], qs[128]
    return np.concatenate([f16_scales(n, 0.005), f16_scales(n, 0.005), rand_bytes(n, 12), rand_bytes(n, 128)], axis=1)


def q5_k(n):  # d, dmin, scales[12], qh[32], qs[128]
    return np.concatenate(
        [f16_scales(n, 0.005), f16_scales(n, 0.005), rand_bytes(n, 12), rand_bytes(n, 32), rand_bytes(n, 128)], axis=1
    )


def q6_k(n):  # ql[128], qh[64], scales[16] (i8), d
    return np.concatenate([rand_bytes(n, 128), rand_bytes(n, 64), rand_bytes(n, 16), f16_scales(n, 0.002)], axis=1)


def f16(n):
    """Normal values plus the edge cases: +-0, +-inf, subnormals, the largest finite."""
    x = rng.normal(0, 2, n).astype(np.float16)
    special = np.array([0.0, -0.0, np.inf, -np.inf, 6e-8, -6e-8, 3e-5, 65504.0, -65504.0, 6.1035e-05],
                       dtype=np.float16)
    x[: len(special)] = special
    return x.view(np.uint8).reshape(1, -1)


def bf16(n):
    """bf16 bit patterns of normal values plus edge cases (no NaN: payloads are not compared)."""
    x = rng.normal(0, 2, n).astype(np.float32)
    x[:8] = [0.0, -0.0, np.inf, -np.inf, 1e-40, -3e38, 3e38, 1.0]
    bits = (x.view(np.uint32) >> 16).astype(np.uint16)
    return bits.view(np.uint8).reshape(1, -1)


CASES = [
    ("Q4_0", T.Q4_0, q4_0, 8),
    ("Q4_1", T.Q4_1, q4_1, 8),
    ("Q5_0", T.Q5_0, q5_0, 8),
    ("Q8_0", T.Q8_0, q8_0, 8),
    ("Q4_K", T.Q4_K, q4_k, 3),
    ("Q6_K", T.Q6_K, q6_k, 3),
    ("F16", T.F16, f16, 256),
    ("BF16", T.BF16, bf16, 256),
    # Added later: last, so that the random stream of the cases above (and their files) is unchanged.
    ("Q5_K", T.Q5_K, q5_k, 3),
]


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    for name, qtype, make, n in CASES:
        raw = np.ascontiguousarray(make(n), dtype=np.uint8)
        if qtype == T.F16:
            vals = dequantize(raw.reshape(-1), qtype)  # F16 is dequantized from the flat bytes
        else:
            vals = dequantize(raw, qtype)
        vals = np.ascontiguousarray(vals, dtype=np.float32).reshape(-1)
        assert not np.any(np.isnan(vals)), name
        (OUT / f"{name}.bin").write_bytes(raw.tobytes())
        (OUT / f"{name}.f32").write_bytes(vals.astype("<f4").tobytes())
        print(f"{name}: {raw.size} bytes -> {vals.size} values")


if __name__ == "__main__":
    main()

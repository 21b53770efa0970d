// The 6-bit scale and min of sub-block s (0..8) of a Q4_K / Q5_K super-block (ggml's
// get_scale_min_k4), from its twelve packed scale bytes held in three words: sub-blocks 0..3 keep
// theirs in the low six bits of bytes s and s + 4; sub-blocks 4..7 take their low four bits from
// the nibbles of byte s + 4 and their top two from the spare high bits of bytes s - 4 and s.
// Placed ahead of q4_k.wgsl and q5_k.wgsl.

// byte i of the twelve scale bytes held in words (a, b, c)
fn scale_byte(sb: vec3<u32>, i: u32) -> u32 {
    return (sb[i / 4u] >> (8u * (i % 4u))) & 255u;
}

// (scale, min) of sub-block s
fn k_scale_min(sb: vec3<u32>, s: u32) -> vec2<u32> {
    if (s < 4u) {
        return vec2<u32>(scale_byte(sb, s) & 63u, scale_byte(sb, s + 4u) & 63u);
    }
    let a = scale_byte(sb, s + 4u);
    return vec2<u32>((a & 15u) | ((scale_byte(sb, s - 4u) >> 6u) << 4u), (a >> 4u) | ((scale_byte(sb, s) >> 6u) << 4u));
}

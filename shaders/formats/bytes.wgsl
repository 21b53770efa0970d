// Quant fields read where they lie (placed ahead of the formats that use it: Q4_0, Q4_1, Q5_0,
// Q4_K, Q5_K). A format's four weights of a group sit in the four bytes of one word, a field of
// the low `bits` bits of each byte. Field j masked in place is q_j * 2^8j: a u32 under 2^29 with
// at most 5 significant bits, which converts to f32 exactly. A scale times BYTE_PLACES[j] (a
// power of two, exact) then gives the same products as the scale times q_j: one mask and one
// conversion per weight, where a shift of field j down to bit 0 and a mask were two integer
// operations.

// 2^-8j: the place of byte j's field, undone by a scale
const BYTE_PLACES: vec4<f32> = vec4<f32>(1.0, 0x1p-8f, 0x1p-16f, 0x1p-24f);

// the low `bits` bits of each byte of `word`, in place (field j: q_j * 2^8j)
fn byte_fields(word: u32, bits: u32) -> vec4<u32> {
    let m = (1u << bits) - 1u;
    return vec4<u32>(word) & vec4<u32>(m, m << 8u, m << 16u, m << 24u);
}

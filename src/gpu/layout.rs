//! Uniform layouts declared once, in Rust: each `#[repr(C)]` struct the host writes into a
//! uniform buffer is declared with [`gpu_struct!`], which also gives its WGSL declaration; the
//! kernels' sources get those declarations from [`super::Kernel::source`] (the `.wgsl` files
//! declare none of them). A unit test checks every kernel's emitted layouts against naga's: the
//! same member offsets as the Rust struct's, and a WGSL size the Rust struct covers.
//!
//! WGSL spellings: `u32` and `f32` as they are; an array of 4n scalars as `array<vec4<T>, n>`
//! (a uniform array's stride is 16 bytes, so a `[u32; 32]` is 8 vec4s, indexed `a[i / 4][i % 4]`);
//! any other array (padding) as one scalar member per element, `name0`, `name1`, ...

use std::fmt::Write;

/// A Rust field type's WGSL element type and its count (`1`: a scalar).
pub trait WgslType {
    const ELEMENT: &'static str;
    const COUNT: usize;
}

impl WgslType for u32 {
    const ELEMENT: &'static str = "u32";
    const COUNT: usize = 1;
}

impl WgslType for f32 {
    const ELEMENT: &'static str = "f32";
    const COUNT: usize = 1;
}

impl<T: WgslType, const N: usize> WgslType for [T; N] {
    const ELEMENT: &'static str = T::ELEMENT;
    const COUNT: usize = N * T::COUNT;
}

/// One field of a uniform struct: its name, byte offset in the Rust struct, WGSL element type
/// and element count (see [`WgslType`]).
#[derive(Clone, Copy, Debug)]
pub struct Field {
    pub name: &'static str,
    pub offset: usize,
    pub element: &'static str,
    pub count: usize,
    /// Whether it is an array (a scalar has `count` 1 and is not).
    pub array: bool,
}

/// A uniform struct: its WGSL name, its fields in order and its size in Rust.
#[derive(Clone, Debug)]
pub struct Layout {
    pub wgsl_name: &'static str,
    pub fields: Vec<Field>,
    pub size: usize,
}

/// A struct declared with [`gpu_struct!`].
pub trait GpuStruct: bytemuck::Pod {
    /// Its name in WGSL.
    const WGSL_NAME: &'static str;
    /// Its fields, in order.
    fn fields() -> Vec<Field>;

    fn layout() -> Layout {
        Layout { wgsl_name: Self::WGSL_NAME, fields: Self::fields(), size: std::mem::size_of::<Self>() }
    }
}

impl Layout {
    /// The WGSL members the struct's fields become: (name, type, byte offset in the Rust struct).
    pub fn members(&self) -> Vec<(String, String, usize)> {
        let mut out = Vec::new();
        for f in &self.fields {
            match (f.array, f.count % 4) {
                (false, _) => out.push((f.name.to_string(), f.element.to_string(), f.offset)),
                (true, 0) => out.push((
                    f.name.to_string(),
                    format!("array<vec4<{}>, {}>", f.element, f.count / 4),
                    f.offset,
                )),
                (true, _) => out.extend(
                    (0..f.count).map(|i| (format!("{}{i}", f.name), f.element.to_string(), f.offset + 4 * i)),
                ),
            }
        }
        out
    }

    /// The WGSL declaration `struct Name { member: type, ... }`.
    pub fn wgsl(&self) -> String {
        let mut s = format!("// {} bytes written by the host\nstruct {} {{\n", self.size, self.wgsl_name);
        for (name, ty, offset) in self.members() {
            let _ = writeln!(s, "    {name}: {ty}, // byte {offset}");
        }
        s.push_str("}\n");
        s
    }
}

/// Declares a `#[repr(C)]` uniform struct (Clone, Copy, Debug, Pod, Zeroable) and its WGSL twin
/// ([`GpuStruct`]): `gpu_struct! { /// docs  pub struct Rust => Wgsl { /// docs  pub a: u32, ... } }`.
macro_rules! gpu_struct {
    ($(#[$m:meta])* $vis:vis struct $name:ident => $wgsl:ident {
        $($(#[$fm:meta])* $fvis:vis $field:ident : $ty:ty),* $(,)?
    }) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
        $vis struct $name { $($(#[$fm])* $fvis $field: $ty,)* }

        impl $crate::gpu::layout::GpuStruct for $name {
            const WGSL_NAME: &'static str = stringify!($wgsl);
            fn fields() -> Vec<$crate::gpu::layout::Field> {
                vec![$($crate::gpu::layout::Field {
                    name: stringify!($field),
                    offset: std::mem::offset_of!($name, $field),
                    element: <$ty as $crate::gpu::layout::WgslType>::ELEMENT,
                    count: <$ty as $crate::gpu::layout::WgslType>::COUNT,
                    array: stringify!($ty).starts_with('['),
                }),*]
            }
        }
    };
}
pub(crate) use gpu_struct;

/// WGSL `const NAME: u32 = value;` lines for `constants` (host values a kernel's source must
/// agree with).
pub fn wgsl_constants(constants: &[(&str, u64)]) -> String {
    constants.iter().map(|(name, v)| format!("const {name}: u32 = {v}u;\n")).collect()
}

/// The uniform layouts of `source` (a kernel's WGSL) that differ from `want` (binding b's struct
/// is `want[b]`): each difference as a line. naga lays the WGSL out; `want` is the Rust layout.
#[cfg(test)]
fn differences(source: &str, want: &[Layout]) -> Vec<String> {
    let module = match naga::front::wgsl::parse_str(source) {
        Ok(m) => m,
        Err(e) => return vec![format!("does not parse: {}", e.emit_to_string(source))],
    };
    let mut out = Vec::new();
    let uniforms: Vec<_> = (module.global_variables.iter())
        .filter(|(_, g)| g.space == naga::AddressSpace::Uniform)
        .map(|(_, g)| g)
        .collect();
    if uniforms.len() != want.len() {
        out.push(format!("{} uniform bindings, the host binds {}", uniforms.len(), want.len()));
    }
    for g in uniforms {
        let b = g.binding.as_ref().map_or(usize::MAX, |b| b.binding as usize);
        let Some(want) = want.get(b) else {
            out.push(format!("binding {b}: no uniform of the host's"));
            continue;
        };
        let ty = &module.types[g.ty];
        let naga::TypeInner::Struct { members, span } = &ty.inner else {
            out.push(format!("binding {b}: not a struct"));
            continue;
        };
        if ty.name.as_deref() != Some(want.wgsl_name) {
            out.push(format!("binding {b}: struct {:?}, the host's {}", ty.name, want.wgsl_name));
        }
        let got: Vec<(String, usize)> =
            members.iter().map(|m| (m.name.clone().unwrap_or_default(), m.offset as usize)).collect();
        let host: Vec<(String, usize)> = want.members().into_iter().map(|(name, _, at)| (name, at)).collect();
        if got != host {
            out.push(format!("binding {b} ({}): WGSL members {got:?}, Rust {host:?}", want.wgsl_name));
        }
        if *span as usize > want.size {
            out.push(format!(
                "binding {b} ({}): {span} bytes in WGSL, {} written",
                want.wgsl_name, want.size
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{Kernel, MAX_TREE};

    #[test]
    fn every_kernel_binds_its_uniforms_as_rust_lays_them_out() {
        for kernel in Kernel::all() {
            for shuffle in [false, true] {
                let wrong = differences(&kernel.source(shuffle), &kernel.uniforms());
                assert!(wrong.is_empty(), "{kernel:?}: {wrong:#?}");
            }
        }
    }

    gpu_struct! {
        /// A u32 before a `[u32; 32]`: WGSL aligns the array of vec4s to 16 bytes, repr(C) to 4.
        struct Misaligned => Misaligned {
            a: u32,
            b: [u32; MAX_TREE],
            c: [u32; 3],
        }
    }

    #[test]
    fn a_layout_that_wgsl_places_differently_is_caught() {
        let layout = Misaligned::layout();
        assert_eq!(
            layout.members().iter().map(|(n, t, at)| format!("{n}: {t} @{at}")).collect::<Vec<_>>(),
            ["a: u32 @0", "b: array<vec4<u32>, 8> @4", "c0: u32 @132", "c1: u32 @136", "c2: u32 @140"]
        );
        let source = format!("{}@group(0) @binding(0) var<uniform> m: Misaligned;", layout.wgsl());
        let wrong = differences(&source, std::slice::from_ref(&layout));
        assert_eq!(wrong.len(), 2, "{wrong:?}");
        assert!(wrong[0].contains("(\"b\", 16)") && wrong[0].contains("(\"b\", 4)"), "{wrong:?}");
        assert!(wrong[1].contains("160 bytes in WGSL, 144 written"), "{wrong:?}");
        // a binding the host does not write, a struct of another name
        let wrong = differences(&source.replace("binding(0)", "binding(1)"), std::slice::from_ref(&layout));
        assert!(wrong.iter().any(|w| w.contains("no uniform")), "{wrong:?}");
        let mut other = layout.clone();
        other.wgsl_name = "Params";
        assert!(differences(&source, &[other]).iter().any(|w| w.contains("the host's Params")));
    }
}

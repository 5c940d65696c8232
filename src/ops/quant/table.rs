//! The one table of the weight types the kernels compute. A row names the GGUF type (its id,
//! block size and bytes are `gguf::GgmlType`'s, the file format's own table), its CPU
//! reference in `dequant.rs` (the ground truth of its values), and the byte offsets of the f16
//! scales in one block (so random test blocks stay finite). The kernels see each type as the
//! constant `QUANT_<NAME>` = its ggml id, which `KERNEL_CODES` puts into their header by name:
//! reordering rows changes nothing.

use crate::gguf::GgmlType;

use super::dequant::{
    dequant_bf16, dequant_f16, dequant_f32, dequant_iq4_nl, dequant_iq4_xs, dequant_q2_k,
    dequant_q3_k, dequant_q4_0, dequant_q4_1, dequant_q4_k, dequant_q5_0, dequant_q5_1,
    dequant_q5_k, dequant_q6_k, dequant_q8_0,
};

macro_rules! quant_types {
    ($($variant:ident: $reference:ident, f16 scales at [$($scale:literal),*];)*) => {
        /// Weight encodings the kernels read, with GGUF's block layouts.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[allow(non_camel_case_types)]
        pub enum QuantType {
            $($variant,)*
        }

        impl QuantType {
            /// Every type of the table, in its order.
            pub const ALL: [QuantType; [$(QuantType::$variant),*].len()] =
                [$(QuantType::$variant,)*];

            /// The GGUF type, whose id, name and block geometry these are.
            pub fn ggml(self) -> GgmlType {
                match self {
                    $(QuantType::$variant => GgmlType::$variant,)*
                }
            }

            /// Dequantizes one block: the type's CPU reference.
            pub(super) fn reference(self) -> fn(&[u8], &mut [f32]) {
                match self {
                    $(QuantType::$variant => $reference,)*
                }
            }

            /// Byte offsets of the f16 scales inside one block (none for float types).
            pub(super) fn f16_scale_offsets(self) -> &'static [usize] {
                match self {
                    $(QuantType::$variant => &[$($scale),*],)*
                }
            }
        }

        /// `QUANT_<NAME>` = ggml id of every type, the names `wgsl/dequant.wgsl` switches on.
        pub(super) const KERNEL_CODES: &[(&str, u32)] =
            &[$((concat!("QUANT_", stringify!($variant)), GgmlType::$variant as u32),)*];

        /// The GGUF types the engine computes, for callers that check a file's tensors.
        pub const ENGINE_SUPPORTED: &[GgmlType] = &[$(GgmlType::$variant,)*];
    };
}

quant_types! {
    F32: dequant_f32, f16 scales at [];
    F16: dequant_f16, f16 scales at [];
    BF16: dequant_bf16, f16 scales at [];
    Q4_0: dequant_q4_0, f16 scales at [0];
    Q4_1: dequant_q4_1, f16 scales at [0, 2];
    Q5_0: dequant_q5_0, f16 scales at [0];
    Q5_1: dequant_q5_1, f16 scales at [0, 2];
    Q8_0: dequant_q8_0, f16 scales at [0];
    Q4_K: dequant_q4_k, f16 scales at [0, 2];
    Q5_K: dequant_q5_k, f16 scales at [0, 2];
    Q6_K: dequant_q6_k, f16 scales at [208];
    Q2_K: dequant_q2_k, f16 scales at [80, 82];
    Q3_K: dequant_q3_k, f16 scales at [108];
    IQ4_NL: dequant_iq4_nl, f16 scales at [0];
    IQ4_XS: dequant_iq4_xs, f16 scales at [0];
}

#[cfg(test)]
mod tests {
    use super::{QuantType, KERNEL_CODES};

    /// A type without its case in the kernels would dequantize to the switch's default.
    #[test]
    fn every_type_has_its_case_in_the_kernels() {
        let kernels = include_str!("../../../wgsl/dequant.wgsl");
        for (name, _) in KERNEL_CODES {
            assert!(
                kernels.contains(&format!("case {name}:")),
                "wgsl/dequant.wgsl has no `case {name}:` in dequant_unit"
            );
        }
        assert_eq!(KERNEL_CODES.len(), QuantType::ALL.len());
    }

    /// Every integer type needs its case in the integer products' decoding too.
    #[test]
    fn every_integer_type_has_its_case_in_the_integer_products() {
        let kernels = include_str!("../../../wgsl/dequant_int8.wgsl");
        for quant in QuantType::ALL
            .into_iter()
            .filter(|&q| super::super::integer_type(q))
        {
            let name = format!("QUANT_{quant:?}");
            assert!(
                kernels.contains(&format!("case {name}:")),
                "wgsl/dequant_int8.wgsl has no `case {name}:` in int_unit"
            );
        }
    }
}

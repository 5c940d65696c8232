//! The residual stream on the wire: `[tokens, d_model]` f32 values, sent as f16 by default
//! (half the bytes per hop) or f32 when exactness matters more than bandwidth.

use half::f16;
use serde::{Deserialize, Serialize};

use super::frame::FrameError;

/// How activation values are stored in a frame; always little-endian.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Encoding {
    /// IEEE binary16, round to nearest even. Values beyond ±65504 cannot be sent this way.
    #[default]
    F16,
    F32,
}

impl Encoding {
    pub fn bytes_per_value(self) -> usize {
        match self {
            Encoding::F16 => 2,
            Encoding::F32 => 4,
        }
    }
}

/// A block of activations: `data.len() / bytes_per_value` values, row-major `[tokens, d_model]`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Activations {
    pub encoding: Encoding,
    pub d_model: u32,
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
}

impl Activations {
    /// Encodes `values` (a whole number of `d_model` rows). Non-finite values and, for f16,
    /// values that would overflow to infinity are refused rather than sent.
    pub fn encode(
        values: &[f32],
        d_model: u32,
        encoding: Encoding,
    ) -> Result<Activations, FrameError> {
        if d_model == 0 || !values.len().is_multiple_of(d_model as usize) {
            return Err(FrameError::RaggedActivations {
                values: values.len(),
                d_model,
            });
        }
        if let Some(index) = values.iter().position(|v| !v.is_finite()) {
            return Err(FrameError::NonFinite {
                field: "activations",
                index,
            });
        }
        let data = match encoding {
            Encoding::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            Encoding::F16 => encode_f16(values)?,
        };
        Ok(Activations {
            encoding,
            d_model,
            data,
        })
    }

    /// How many values `data` holds (a partial trailing value is not counted).
    pub fn n_values(&self) -> usize {
        self.data.len() / self.encoding.bytes_per_value()
    }

    /// Checks that `data` is exactly `n_tokens × d_model` finite values.
    pub fn check(&self, n_tokens: u32, field: &'static str) -> Result<(), FrameError> {
        let expected = (n_tokens as u64)
            .saturating_mul(self.d_model as u64)
            .saturating_mul(self.encoding.bytes_per_value() as u64);
        if self.d_model == 0 || expected != self.data.len() as u64 {
            return Err(FrameError::ShapeMismatch {
                field,
                n_tokens,
                d_model: self.d_model,
                encoding: self.encoding,
                expected_bytes: expected,
                found_bytes: self.data.len(),
            });
        }
        match self.first_non_finite() {
            Some(index) => Err(FrameError::NonFinite { field, index }),
            None => Ok(()),
        }
    }

    /// The values as f32. Call `check` first: this only reads whole values.
    pub fn to_f32(&self) -> Vec<f32> {
        match self.encoding {
            Encoding::F32 => self
                .data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Encoding::F16 => self
                .data
                .chunks_exact(2)
                .map(|b| f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
                .collect(),
        }
    }

    fn first_non_finite(&self) -> Option<usize> {
        match self.encoding {
            Encoding::F32 => self
                .data
                .chunks_exact(4)
                .position(|b| !f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_finite()),
            Encoding::F16 => self
                .data
                .chunks_exact(2)
                .position(|b| !f16::from_bits(u16::from_le_bytes([b[0], b[1]])).is_finite()),
        }
    }
}

fn encode_f16(values: &[f32]) -> Result<Vec<u8>, FrameError> {
    let mut data = Vec::with_capacity(values.len() * 2);
    for (index, &value) in values.iter().enumerate() {
        let half = f16::from_f32(value);
        if !half.is_finite() {
            return Err(FrameError::F16Overflow { index, value });
        }
        data.extend_from_slice(&half.to_bits().to_le_bytes());
    }
    Ok(data)
}

/// How far an f16 round trip moves a tensor's values.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RoundTripError {
    /// Largest absolute change of one value.
    pub max_abs: f32,
    /// Mean absolute change.
    pub mean_abs: f32,
    /// Root-mean-square change divided by the tensor's root-mean-square: a scale-free measure.
    pub relative_rms: f32,
    /// Values that would overflow f16 (`Activations::encode` refuses such tensors).
    pub overflowed: usize,
}

/// Measures the error f16 encoding would add to `values`; non-finite inputs are skipped.
pub fn f16_round_trip_error(values: &[f32]) -> RoundTripError {
    let mut max_abs = 0f64;
    let mut sum_abs = 0f64;
    let mut sum_sq_err = 0f64;
    let mut sum_sq = 0f64;
    let mut counted = 0usize;
    let mut overflowed = 0usize;
    for &value in values.iter().filter(|v| v.is_finite()) {
        let back = f16::from_f32(value);
        if !back.is_finite() {
            overflowed += 1;
            continue;
        }
        let err = (back.to_f32() as f64 - value as f64).abs();
        max_abs = max_abs.max(err);
        sum_abs += err;
        sum_sq_err += err * err;
        sum_sq += value as f64 * value as f64;
        counted += 1;
    }
    if counted == 0 {
        return RoundTripError {
            overflowed,
            ..RoundTripError::default()
        };
    }
    let relative_rms = if sum_sq > 0.0 {
        (sum_sq_err / sum_sq).sqrt()
    } else {
        0.0
    };
    RoundTripError {
        max_abs: max_abs as f32,
        mean_abs: (sum_abs / counted as f64) as f32,
        relative_rms: relative_rms as f32,
        overflowed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_round_trip_error_matches_half_precision_spacing() {
        // 1.0 + 2^-11 lies halfway between f16 neighbours 1.0 and 1.0 + 2^-10: rounds to even.
        let values = [1.0 + 2f32.powi(-11), 0.0, -2.0];
        let err = f16_round_trip_error(&values);
        assert_eq!(err.max_abs, 2f32.powi(-11));
        assert_eq!(err.overflowed, 0);
        let big = f16_round_trip_error(&[70000.0, 1.0]);
        assert_eq!(big.overflowed, 1);
        assert_eq!(big.max_abs, 0.0);
    }

    #[test]
    fn f32_encoding_is_exact_and_f16_refuses_overflow() {
        let values = [0.1f32, -3.5e7, 1e-30, 7.0];
        let exact = Activations::encode(&values, 2, Encoding::F32).unwrap();
        assert_eq!(exact.to_f32(), values);
        assert!(matches!(
            Activations::encode(&values, 2, Encoding::F16),
            Err(FrameError::F16Overflow { index: 1, .. })
        ));
    }
}

//! The tokens the last stage may choose from at a constrained step, as a `Forward` carries
//! them from the coordinator down the chain: a bitset of the vocabulary, or the same set as
//! runs of ids when that is smaller (after JSON structure few tokens are allowed, inside a
//! string almost all, and both are a few runs). `validate.rs` checks them against the model.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::sample::TokenMask;

/// An allowed-token set on the wire.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum AllowedTokens {
    /// Bit `id % 8` of byte `id / 8` is set for an allowed id: `vocab.div_ceil(8)` bytes.
    Bits(#[serde(with = "serde_bytes")] Vec<u8>),
    /// Allowed ids as `[start, end)` runs: ascending, each non-empty and apart from the one
    /// before.
    Runs(Vec<[u32; 2]>),
}

impl AllowedTokens {
    /// The mask's ids below `vocab_size` in whichever form encodes smaller.
    pub fn from_mask(mask: &TokenMask, vocab_size: u32) -> AllowedTokens {
        let runs = runs_of(mask.ids().into_iter().filter(|&id| id < vocab_size));
        let bits_bytes = vocab_size.div_ceil(8) as usize;
        let runs_bytes: usize = runs
            .iter()
            .map(|run| varint_len(run.start) + varint_len(run.end))
            .sum();
        if runs_bytes < bits_bytes {
            return AllowedTokens::Runs(runs.into_iter().map(|r| [r.start, r.end]).collect());
        }
        let mut bits = vec![0u8; bits_bytes];
        for id in runs.into_iter().flatten() {
            bits[id as usize / 8] |= 1 << (id % 8);
        }
        AllowedTokens::Bits(bits)
    }

    /// The allowed ids as ascending runs (of a validated set: bits past the vocabulary and
    /// malformed runs were refused with the frame).
    pub fn runs(&self) -> Vec<Range<u32>> {
        match self {
            AllowedTokens::Runs(runs) => runs.iter().map(|&[start, end]| start..end).collect(),
            AllowedTokens::Bits(bits) => runs_of(set_bits(bits)),
        }
    }

    /// The set as the sampler's mask over `vocab_size` ids.
    pub fn to_mask(&self, vocab_size: u32) -> TokenMask {
        TokenMask::from_runs(vocab_size as usize, self.runs())
    }

    /// Bytes on the wire, roughly (for frame size hints).
    pub fn size_hint(&self) -> usize {
        match self {
            AllowedTokens::Bits(bits) => bits.len(),
            AllowedTokens::Runs(runs) => 10 * runs.len(),
        }
    }
}

/// The ids whose bit is set, ascending.
pub(super) fn set_bits(bits: &[u8]) -> impl Iterator<Item = u32> + '_ {
    bits.iter().enumerate().flat_map(|(byte, &value)| {
        (0..8)
            .filter(move |bit| value & (1 << bit) != 0)
            .map(move |bit| (byte * 8 + bit) as u32)
    })
}

/// Ascending ids joined into maximal runs.
fn runs_of(ids: impl Iterator<Item = u32>) -> Vec<Range<u32>> {
    let mut runs: Vec<Range<u32>> = Vec::new();
    for id in ids {
        match runs.last_mut() {
            Some(run) if run.end == id => run.end += 1,
            _ => runs.push(id..id + 1),
        }
    }
    runs
}

/// Bytes postcard's varint takes for `value`.
fn varint_len(value: u32) -> usize {
    (32 - value.leading_zeros()).div_ceil(7).max(1) as usize
}

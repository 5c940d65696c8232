//! Unicode facts the pre-tokenizers need: per-codepoint category flags and GPT-2's byte↔char map.
//!
//! The category tables come from `regex-syntax` (the same tables the regex splitters use), so the
//! hand-written splitters and the regex ones agree on what a letter, number or space is.

use std::sync::OnceLock;

use regex_syntax::hir::{Class, HirKind};

/// Category bits of one codepoint, as llama.cpp's `unicode_cpt_flags` uses them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CpFlags(u8);

impl CpFlags {
    const LETTER: u8 = 1;
    const NUMBER: u8 = 2;
    const WHITESPACE: u8 = 4;
    const PUNCTUATION: u8 = 8;
    const SYMBOL: u8 = 16;
    /// General category C: control, format, unassigned, private use, surrogate.
    const CONTROL: u8 = 32;
    /// Nonspacing marks (Mn), which BERT's accent stripping drops.
    const ACCENT_MARK: u8 = 64;
    /// Set for every codepoint inside the text; unset for positions past a fragment's end.
    const IN_RANGE: u8 = 128;

    /// Flags for a position outside the fragment being split.
    pub(crate) const OUT_OF_RANGE: CpFlags = CpFlags(0);

    pub(crate) fn is_letter(self) -> bool {
        self.0 & Self::LETTER != 0
    }
    pub(crate) fn is_number(self) -> bool {
        self.0 & Self::NUMBER != 0
    }
    pub(crate) fn is_whitespace(self) -> bool {
        self.0 & Self::WHITESPACE != 0
    }
    pub(crate) fn is_punctuation(self) -> bool {
        self.0 & Self::PUNCTUATION != 0
    }
    pub(crate) fn is_symbol(self) -> bool {
        self.0 & Self::SYMBOL != 0
    }
    pub(crate) fn is_control(self) -> bool {
        self.0 & Self::CONTROL != 0
    }
    pub(crate) fn is_accent_mark(self) -> bool {
        self.0 & Self::ACCENT_MARK != 0
    }
    pub(crate) fn in_range(self) -> bool {
        self.0 & Self::IN_RANGE != 0
    }
}

/// Category bits per codepoint.
struct FlagTable {
    /// Flags for the Basic Multilingual Plane, indexed directly (64 KiB).
    bmp: Vec<u8>,
    /// Per class: its sorted, disjoint `(first, last)` ranges above U+FFFF, and its bit.
    astral: Vec<(Vec<(u32, u32)>, u8)>,
}

fn class_ranges(pattern: &str) -> Vec<(u32, u32)> {
    // The patterns are constants; a parse failure would be a bug caught by every test.
    let Ok(hir) = regex_syntax::Parser::new().parse(pattern) else {
        return Vec::new();
    };
    match hir.kind() {
        HirKind::Class(Class::Unicode(class)) => class
            .ranges()
            .iter()
            .map(|r| (r.start() as u32, r.end() as u32))
            .collect(),
        _ => Vec::new(),
    }
}

fn build_table() -> FlagTable {
    let classes = [
        (r"\p{L}", CpFlags::LETTER),
        (r"\p{N}", CpFlags::NUMBER),
        (r"\s", CpFlags::WHITESPACE),
        (r"\p{P}", CpFlags::PUNCTUATION),
        (r"\p{S}", CpFlags::SYMBOL),
        (r"\p{C}", CpFlags::CONTROL),
        (r"\p{Mn}", CpFlags::ACCENT_MARK),
    ];
    let mut bmp = vec![0u8; 0x10000];
    let mut astral = Vec::new();
    for (pattern, bit) in classes {
        let mut high = Vec::new();
        for (first, last) in class_ranges(pattern) {
            for cp in first..=last.min(0xFFFF) {
                bmp[cp as usize] |= bit;
            }
            if last > 0xFFFF {
                high.push((first.max(0x10000), last));
            }
        }
        astral.push((high, bit));
    }
    FlagTable { bmp, astral }
}

fn table() -> &'static FlagTable {
    static TABLE: OnceLock<FlagTable> = OnceLock::new();
    TABLE.get_or_init(build_table)
}

/// Category flags of `c` (always marked in range).
pub(crate) fn flags_of(c: char) -> CpFlags {
    let cp = c as u32;
    let t = table();
    let bits = if cp <= 0xFFFF {
        t.bmp[cp as usize]
    } else {
        t.astral.iter().fold(0, |acc, (ranges, bit)| {
            let after = ranges.partition_point(|r| r.0 <= cp);
            let hit = after > 0 && ranges[after - 1].1 >= cp;
            if hit {
                acc | bit
            } else {
                acc
            }
        })
    };
    CpFlags(bits | CpFlags::IN_RANGE)
}

/// GPT-2's reversible map from bytes to printable characters.
pub(crate) fn byte_to_char_table() -> &'static [char; 256] {
    static TABLE: OnceLock<[char; 256]> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut map = ['\0'; 256];
        let printable =
            |b: u32| (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
        let mut next_extra = 256u32;
        for b in 0u32..256 {
            let cp = if printable(b) {
                b
            } else {
                next_extra += 1;
                next_extra - 1
            };
            map[b as usize] = char::from_u32(cp).unwrap_or('\u{FFFD}');
        }
        map
    })
}

/// Inverse of [`byte_to_char_table`]: the byte a printable character stands for.
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    // Every mapped char lies below U+0200 (256 + 68 remapped bytes).
    static TABLE: OnceLock<[Option<u8>; 512]> = OnceLock::new();
    let reverse = TABLE.get_or_init(|| {
        let mut rev = [None; 512];
        for (b, &ch) in byte_to_char_table().iter().enumerate() {
            rev[ch as usize] = Some(b as u8);
        }
        rev
    });
    reverse.get(c as usize).copied().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_match_unicode() {
        assert!(flags_of('a').is_letter());
        assert!(flags_of('ß').is_letter());
        assert!(flags_of('日').is_letter());
        assert!(flags_of('7').is_number());
        assert!(flags_of('½').is_number());
        assert!(flags_of('\u{3000}').is_whitespace());
        assert!(flags_of('\u{a0}').is_whitespace());
        assert!(!flags_of('\u{200b}').is_whitespace());
        assert!(!flags_of('!').is_letter());
        assert!(flags_of('𝐀').is_letter(), "astral letter");
        assert!(flags_of('𝟎').is_number(), "astral digit");
        assert!(!flags_of('😀').is_letter());
        assert!(flags_of('😀').in_range());
        assert!(!CpFlags::OUT_OF_RANGE.in_range());
    }

    #[test]
    fn bert_categories_match_unicode() {
        assert!(flags_of('!').is_punctuation());
        assert!(flags_of('「').is_punctuation());
        assert!(flags_of('$').is_symbol());
        assert!(flags_of('😀').is_symbol());
        assert!(flags_of('\u{7}').is_control());
        assert!(flags_of('\u{200b}').is_control(), "format character");
        assert!(flags_of('\u{301}').is_accent_mark());
        assert!(!flags_of('a').is_punctuation() && !flags_of('a').is_control());
    }

    #[test]
    fn byte_map_round_trips() {
        let table = byte_to_char_table();
        assert_eq!(table[b'a' as usize], 'a');
        assert_eq!(table[b' ' as usize], 'Ġ');
        assert_eq!(table[b'\n' as usize], 'Ċ');
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(table[b as usize]), Some(b));
        }
        assert_eq!(char_to_byte('日'), None);
    }
}

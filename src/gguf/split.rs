//! llama.cpp's split GGUF (`gguf-split`): a model stored as `NAME-00001-of-0000N.gguf` ...
//! `NAME-0000N-of-0000N.gguf`, each part a GGUF of its own whose header lists the tensors it
//! stores. The first part holds all the model's metadata; every part holds `split.no` (0-based,
//! u16), `split.count` (u16) and `split.tensors.count` (the model's total, i32).
//!
//! The parts are read as one model: one `Header` (the first part's metadata, every part's
//! tensors) over one `SplitSource`. A tensor's `offset` is then a *source* offset: part `k`'s
//! byte `o` is at `k << PART_BITS | o`, so everything that reads a tensor by its offset (the
//! loader, a shard donor) works unchanged, and no part's size is needed before its header.
//!
//! Every split field comes from untrusted files: counts, numbering and tensor totals are checked
//! part by part, and an error names the part that disagrees.

use std::collections::HashSet;

use super::error::GgufError;
use super::header::Header;
use super::metadata::Metadata;

pub const KEY_NO: &str = "split.no";
pub const KEY_COUNT: &str = "split.count";
pub const KEY_TENSORS_COUNT: &str = "split.tensors.count";

/// Bits of a source offset that address bytes inside one part (256 TiB per part); the bits
/// above number the part. 2^16 parts (all `split.count` can say) fill exactly 64 bits.
pub const PART_BITS: u32 = 48;
const PART_MASK: u64 = (1 << PART_BITS) - 1;

/// The source offset of byte `offset` of part `part` (0-based); `None` past a part's range.
pub fn source_offset(part: u16, offset: u64) -> Option<u64> {
    (offset <= PART_MASK).then(|| u64::from(part) << PART_BITS | offset)
}

/// The part (0-based) and the offset inside it of source offset `offset`.
pub fn locate(offset: u64) -> (u16, u64) {
    ((offset >> PART_BITS) as u16, offset & PART_MASK)
}

/// A location named the way `gguf-split` names its parts: `PREFIX-NNNNN-of-MMMMM.gguf`, with
/// an optional `?query` or `#fragment` after it (URLs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitName {
    prefix: String,
    /// What followed `.gguf` (empty for paths).
    tail: String,
    /// 1-based, as in the name.
    pub number: u16,
    pub count: u16,
}

impl SplitName {
    /// `None` when `location` is not named like a part (then it is read as one file).
    pub fn parse(location: &str) -> Option<SplitName> {
        let tail_at = location.find(['?', '#']).unwrap_or(location.len());
        let (path, tail) = location.split_at(tail_at);
        let stem = path.strip_suffix(".gguf")?;
        let (rest, count) = stem.rsplit_once("-of-")?;
        let (prefix, number) = rest.rsplit_once('-')?;
        let number = five_digits(number)?;
        let count = five_digits(count)?;
        (number >= 1 && number <= count && !prefix.is_empty()).then(|| SplitName {
            prefix: prefix.to_string(),
            tail: tail.to_string(),
            number,
            count,
        })
    }

    /// The location of part `index` (0-based), named as `gguf-split` names it.
    pub fn part(&self, index: u16) -> String {
        let (prefix, count, tail) = (&self.prefix, self.count, &self.tail);
        format!(
            "{prefix}-{:05}-of-{count:05}.gguf{tail}",
            u32::from(index) + 1
        )
    }
}

/// `%05d` as `gguf-split` prints it: exactly five digits for every u16 count above 9999 too.
fn five_digits(s: &str) -> Option<u16> {
    (s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit()))
        .then(|| s.parse().ok())
        .flatten()
}

/// One part's `split.*` keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitInfo {
    /// 0-based.
    pub no: u16,
    pub count: u16,
    /// Tensors in the whole model.
    pub tensors: u64,
}

/// The `split.*` keys of `metadata`; `None` for a model in one file (no `split.count`, or 1).
pub fn split_info(metadata: &Metadata, location: &str) -> Result<Option<SplitInfo>, GgufError> {
    let bad = |reason: String| split_error(location, reason);
    let count = match metadata.opt_u32(KEY_COUNT) {
        Ok(None) | Ok(Some(1)) => return Ok(None),
        Ok(Some(count)) => u16::try_from(count)
            .ok()
            .filter(|&c| c > 0)
            .ok_or_else(|| bad(format!("`{KEY_COUNT}` is {count}, must be 1 to 65535")))?,
        Err(err) => return Err(bad(err.to_string())),
    };
    let no = metadata
        .get_u32(KEY_NO)
        .map_err(|err| bad(err.to_string()))?;
    let no = u16::try_from(no)
        .ok()
        .filter(|&n| n < count)
        .ok_or_else(|| bad(format!("`{KEY_NO}` is {no}, but there are {count} parts")))?;
    let tensors = metadata
        .get_u64(KEY_TENSORS_COUNT)
        .map_err(|err| bad(err.to_string()))?;
    Ok(Some(SplitInfo { no, count, tensors }))
}

/// A model opened as one file must not be one part of a split model: its other tensors would be
/// missing. Says which file to open instead.
pub fn check_whole(header: &Header, location: &str) -> Result<(), GgufError> {
    let Some(info) = split_info(&header.metadata, location)? else {
        return Ok(());
    };
    let first = SplitName::parse(location)
        .map(|name| format!("`{}`", name.part(0)))
        .unwrap_or_else(|| "the first part, named `NAME-00001-of-NNNNN.gguf`".to_string());
    Err(split_error(
        location,
        format!(
            "this is part {} of {} of a split model ({} tensors in all); open {first}, which \
             reads every part",
            u32::from(info.no) + 1,
            info.count,
            info.tensors
        ),
    ))
}

/// One header for the whole model from the headers of its parts, in order, each with its
/// location: the first part's metadata, every part's tensors at their source offsets.
pub fn merge(parts: Vec<(String, Header)>) -> Result<Header, GgufError> {
    let Some((first_location, first)) = parts.first() else {
        return Err(split_error("split model", "no parts".into()));
    };
    let first_location = first_location.clone();
    let first_location = first_location.as_str();
    let expected = split_info(&first.metadata, first_location)?.ok_or_else(|| {
        split_error(
            first_location,
            format!(
                "named as a part of {} but has no `{KEY_COUNT}` above 1",
                parts.len()
            ),
        )
    })?;
    if usize::from(expected.count) != parts.len() {
        return Err(split_error(
            first_location,
            format!(
                "`{KEY_COUNT}` is {}, but the file name says {} parts",
                expected.count,
                parts.len()
            ),
        ));
    }
    let mut parts = parts.into_iter();
    let (_, mut merged) = parts.next().expect("checked non-empty");
    check_part(&merged, first_location, 0, expected)?;
    merged.tensors = rebase(std::mem::take(&mut merged.tensors), 0, first_location)?;
    let mut names: HashSet<String> = merged.tensors.iter().map(|t| t.name.clone()).collect();
    for (index, (location, header)) in parts.enumerate() {
        let index = u16::try_from(index + 1).expect("at most split.count parts");
        check_part(&header, &location, index, expected)?;
        for tensor in rebase(header.tensors, index, &location)? {
            if !names.insert(tensor.name.clone()) {
                return Err(split_error(
                    &location,
                    format!("tensor `{}` is also in an earlier part", tensor.name),
                ));
            }
            merged.tensors.push(tensor);
        }
    }
    if merged.tensors.len() as u64 != expected.tensors {
        return Err(split_error(
            first_location,
            format!(
                "`{KEY_TENSORS_COUNT}` is {}, but the {} parts hold {} tensors",
                expected.tensors,
                expected.count,
                merged.tensors.len()
            ),
        ));
    }
    Ok(merged)
}

/// Part `index` must say it is that part of the same model.
fn check_part(
    header: &Header,
    location: &str,
    index: u16,
    expected: SplitInfo,
) -> Result<(), GgufError> {
    let info = split_info(&header.metadata, location)?.ok_or_else(|| {
        split_error(
            location,
            format!("part {} has no `{KEY_COUNT}` above 1", u32::from(index) + 1),
        )
    })?;
    let disagree = |what: &str, found: u64, want: u64| {
        split_error(
            location,
            format!(
                "`{what}` is {found}, but part {} of {} must say {want}",
                u32::from(index) + 1,
                expected.count
            ),
        )
    };
    if info.no != index {
        return Err(disagree(KEY_NO, info.no.into(), index.into()));
    }
    if info.count != expected.count {
        return Err(disagree(
            KEY_COUNT,
            info.count.into(),
            expected.count.into(),
        ));
    }
    if info.tensors != expected.tensors {
        return Err(disagree(KEY_TENSORS_COUNT, info.tensors, expected.tensors));
    }
    Ok(())
}

fn rebase(
    tensors: Vec<super::TensorInfo>,
    part: u16,
    location: &str,
) -> Result<Vec<super::TensorInfo>, GgufError> {
    tensors
        .into_iter()
        .map(|mut tensor| {
            let end = tensor.offset.checked_add(tensor.bytes);
            match end.and_then(|end| source_offset(part, end)) {
                Some(_) => {
                    tensor.offset = source_offset(part, tensor.offset).expect("below its end");
                    Ok(tensor)
                }
                None => Err(split_error(
                    location,
                    format!(
                        "tensor `{}` ends past the {}-byte limit of one part",
                        tensor.name,
                        PART_MASK + 1
                    ),
                )),
            }
        })
        .collect()
}

fn split_error(location: &str, reason: String) -> GgufError {
    GgufError::Split {
        part: location.to_string(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_odd_names_are_one_file() {
        let name = SplitName::parse("models/m-00001-of-00003.gguf").unwrap();
        assert_eq!((name.number, name.count), (1, 3));
        assert_eq!(name.part(2), "models/m-00003-of-00003.gguf");
        let url = SplitName::parse("http://h/a-b-00002-of-00012.gguf?download=1").unwrap();
        assert_eq!(url.part(0), "http://h/a-b-00001-of-00012.gguf?download=1");
        for plain in [
            "m.gguf",
            "m-1-of-3.gguf",
            "m-00004-of-00003.gguf",
            "m-00000-of-00003.gguf",
            "-00001-of-00003.gguf",
            "m-00001-of-00003.bin",
            "m-0000a-of-00003.gguf",
            "m-00001-of-99999.gguf",
        ] {
            assert_eq!(SplitName::parse(plain), None, "{plain}");
        }
    }

    #[test]
    fn source_offsets_number_the_part_above_the_byte() {
        let offset = source_offset(3, 5 << 32).unwrap();
        assert_eq!(locate(offset), (3, 5 << 32));
        assert_eq!(source_offset(u16::MAX, PART_MASK), Some(u64::MAX));
        assert_eq!(source_offset(0, PART_MASK + 1), None);
    }
}

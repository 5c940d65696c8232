//! Bounds-checked little-endian reads over a prefix of a GGUF file.
//!
//! Every failure is an error value, never a panic. Reading past the prefix yields
//! `GgufError::Truncated` whose `needed` is a lower bound on the prefix length that would let the
//! read succeed; the incremental reader uses it to size its next fetch.

use super::error::GgufError;

pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Total file length when known: reads beyond it are final errors, not "fetch more".
    file_size: Option<u64>,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(buf: &'a [u8], file_size: Option<u64>) -> Cursor<'a> {
        Cursor {
            buf,
            pos: 0,
            file_size,
        }
    }

    pub(crate) fn offset(&self) -> u64 {
        self.pos as u64
    }

    fn truncated(&self, needed: u64) -> GgufError {
        let available = match self.file_size {
            Some(size) if needed > size => size,
            _ => self.buf.len() as u64,
        };
        GgufError::Truncated {
            context: String::new(),
            offset: self.offset(),
            needed,
            available,
        }
    }

    pub(crate) fn take(&mut self, n: u64) -> Result<&'a [u8], GgufError> {
        let end = self.offset().saturating_add(n);
        if end > self.buf.len() as u64 {
            return Err(self.truncated(end));
        }
        let bytes = &self.buf[self.pos..end as usize];
        self.pos = end as usize;
        Ok(bytes)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], GgufError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, GgufError> {
        Ok(self.array::<1>()?[0])
    }
    pub(crate) fn i8(&mut self) -> Result<i8, GgufError> {
        Ok(i8::from_le_bytes(self.array()?))
    }
    pub(crate) fn u16(&mut self) -> Result<u16, GgufError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    pub(crate) fn i16(&mut self) -> Result<i16, GgufError> {
        Ok(i16::from_le_bytes(self.array()?))
    }
    pub(crate) fn u32(&mut self) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub(crate) fn i32(&mut self) -> Result<i32, GgufError> {
        Ok(i32::from_le_bytes(self.array()?))
    }
    pub(crate) fn u64(&mut self) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    pub(crate) fn i64(&mut self) -> Result<i64, GgufError> {
        Ok(i64::from_le_bytes(self.array()?))
    }
    pub(crate) fn f32(&mut self) -> Result<f32, GgufError> {
        Ok(f32::from_le_bytes(self.array()?))
    }
    pub(crate) fn f64(&mut self) -> Result<f64, GgufError> {
        Ok(f64::from_le_bytes(self.array()?))
    }
    pub(crate) fn bytes4(&mut self) -> Result<[u8; 4], GgufError> {
        self.array()
    }

    /// Checks that `count` items of at least `min_size` bytes each can follow the cursor, before
    /// anything is allocated for them. `count_offset` is where the count was read, for messages.
    /// Returns the count as a capacity that the bytes at hand justify.
    pub(crate) fn check_count(
        &self,
        count: u64,
        min_size: u64,
        count_offset: u64,
    ) -> Result<usize, GgufError> {
        let needed = count
            .checked_mul(min_size)
            .and_then(|bytes| bytes.checked_add(self.offset()));
        let too_large = || GgufError::CountTooLarge {
            context: String::new(),
            count,
            offset: count_offset,
            bytes_left: self
                .file_size
                .unwrap_or(u64::MAX)
                .saturating_sub(self.offset()),
        };
        let needed = needed.ok_or_else(too_large)?;
        if self.file_size.is_some_and(|size| needed > size) {
            return Err(too_large());
        }
        if needed > self.buf.len() as u64 {
            return Err(self.truncated(needed));
        }
        // `needed` fits in the buffer, so the count fits in usize.
        Ok(count as usize)
    }

    /// A GGUF string: u64 byte length, then UTF-8 bytes.
    pub(crate) fn string(&mut self) -> Result<String, GgufError> {
        let len_offset = self.offset();
        let len = self.u64()?;
        self.check_count(len, 1, len_offset)?;
        let start = self.offset();
        let bytes = self.take(len)?;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| GgufError::InvalidUtf8 {
                context: String::new(),
                offset: start,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_reports_lower_bound_and_final_size() {
        let data = [1u8, 0, 0, 0, 9];
        let mut prefix = Cursor::new(&data, None);
        assert_eq!(prefix.u32().unwrap(), 1);
        match prefix.u64() {
            Err(GgufError::Truncated {
                offset,
                needed,
                available,
                ..
            }) => assert_eq!((offset, needed, available), (4, 12, 5)),
            other => panic!("{other:?}"),
        }
        let sized = Cursor::new(&data, Some(5));
        assert!(matches!(
            sized.check_count(u64::MAX, 8, 0),
            Err(GgufError::CountTooLarge {
                count: u64::MAX,
                ..
            })
        ));
        assert!(matches!(
            sized.check_count(2, 4, 0),
            Err(GgufError::CountTooLarge { bytes_left: 5, .. })
        ));
        let prefix = Cursor::new(&data, None);
        assert!(matches!(
            prefix.check_count(1000, 8, 0),
            Err(GgufError::Truncated { needed: 8000, .. })
        ));
    }
}

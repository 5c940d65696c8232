//! HTTP Range plumbing shared by the native and browser HTTP sources.

use super::SourceError;

/// A parsed `Content-Range: bytes FIRST-LAST/TOTAL` (either side may be `*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ContentRange {
    /// Inclusive first and last byte.
    pub range: Option<(u64, u64)>,
    pub total: Option<u64>,
}

pub(crate) fn parse_content_range(value: &str) -> Option<ContentRange> {
    let value = value.trim();
    let (unit, rest) = value.split_once(' ')?;
    if !unit.eq_ignore_ascii_case("bytes") {
        return None;
    }
    let (range, total) = rest.trim().split_once('/')?;
    let total = match total {
        "*" => None,
        digits => Some(digits.parse().ok()?),
    };
    let range = match range {
        "*" => None,
        span => {
            let (first, last) = span.split_once('-')?;
            let (first, last): (u64, u64) = (first.parse().ok()?, last.parse().ok()?);
            if first > last {
                return None;
            }
            Some((first, last))
        }
    };
    Some(ContentRange { range, total })
}

/// `Range` header value for `len >= 1` bytes at `offset`.
pub(crate) fn range_header(offset: u64, len: u64) -> String {
    format!("bytes={}-{}", offset, offset + len - 1)
}

/// Accepts only a 206 whose Content-Range is exactly the requested span.
pub(crate) fn check_partial_response(
    url: &str,
    status: u16,
    content_range: Option<&str>,
    offset: u64,
    len: u64,
) -> Result<(), SourceError> {
    match status {
        206 => {}
        200 => return Err(SourceError::RangeIgnored { url: url.into() }),
        status => {
            return Err(SourceError::HttpStatus {
                url: url.into(),
                status,
                offset,
                len,
            })
        }
    }
    let last = offset + len - 1;
    let parsed = content_range.and_then(parse_content_range);
    let consistent = parsed.is_some_and(|cr| {
        cr.range == Some((offset, last)) && cr.total.is_none_or(|total| total > last)
    });
    if consistent {
        Ok(())
    } else {
        Err(SourceError::BadContentRange {
            url: url.into(),
            expected: format!("bytes {offset}-{last}"),
            found: content_range.map(str::to_string),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_past_4_gib_keep_64_bit_offsets() {
        let offset = (5u64 << 32) + 7;
        assert_eq!(range_header(offset, 10), "bytes=21474836487-21474836496");
        let cr = parse_content_range("bytes 21474836487-21474836496/30000000000").unwrap();
        assert_eq!(
            (cr.range, cr.total),
            (Some((offset, offset + 9)), Some(30_000_000_000))
        );
        assert!(check_partial_response(
            "u",
            206,
            Some("bytes 21474836487-21474836496/*"),
            offset,
            10
        )
        .is_ok());
    }

    #[test]
    fn content_range_forms() {
        let cr = parse_content_range("bytes 0-99/1000").unwrap();
        assert_eq!((cr.range, cr.total), (Some((0, 99)), Some(1000)));
        let cr = parse_content_range("Bytes 5-5/*").unwrap();
        assert_eq!((cr.range, cr.total), (Some((5, 5)), None));
        let cr = parse_content_range("bytes */77").unwrap();
        assert_eq!((cr.range, cr.total), (None, Some(77)));
        for bad in [
            "",
            "bytes",
            "bytes 9-1/10",
            "items 0-1/2",
            "bytes 0-x/2",
            "bytes 0-1/",
        ] {
            assert_eq!(parse_content_range(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn partial_response_checks() {
        assert!(check_partial_response("u", 206, Some("bytes 10-19/20"), 10, 10).is_ok());
        assert!(matches!(
            check_partial_response("u", 200, None, 0, 10),
            Err(SourceError::RangeIgnored { .. })
        ));
        assert!(matches!(
            check_partial_response("u", 404, None, 0, 10),
            Err(SourceError::HttpStatus { status: 404, .. })
        ));
        assert!(matches!(
            check_partial_response("u", 206, Some("bytes 10-18/20"), 10, 10),
            Err(SourceError::BadContentRange { .. })
        ));
        assert!(matches!(
            check_partial_response("u", 206, Some("bytes 10-19/15"), 10, 10),
            Err(SourceError::BadContentRange { .. })
        ));
        assert!(matches!(
            check_partial_response("u", 206, None, 10, 10),
            Err(SourceError::BadContentRange { found: None, .. })
        ));
        assert_eq!(range_header(10, 10), "bytes=10-19");
    }
}

//! Browser glue: JS values are single-threaded, so sources need not be `Send`; every location is
//! fetched (relative URLs resolve against the page).

use super::{FetchSource, RangeSource, SourceError};

/// Nothing is required in the browser.
pub trait MaybeSendSync {}
impl<T: ?Sized> MaybeSendSync for T {}

pub(super) fn open(url: &str) -> Result<Box<dyn RangeSource>, SourceError> {
    Ok(Box::new(FetchSource::new(url)))
}

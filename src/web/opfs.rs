//! The origin private file system (OPFS), through its promise API, which works in pages and
//! in workers alike. Whole files only: the cache keeps one file per downloaded range.

use js_sys::{Reflect, Uint8Array};
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;
use web_sys::{
    File, FileSystemDirectoryHandle, FileSystemFileHandle, FileSystemGetDirectoryOptions,
    FileSystemGetFileOptions, FileSystemRemoveOptions, FileSystemWritableFileStream,
    StorageManager,
};

use super::error::{js_message, WebError};

/// A directory in OPFS.
#[derive(Clone)]
pub struct Dir {
    handle: FileSystemDirectoryHandle,
    name: String,
}

fn cache_error(operation: &'static str, name: &str, value: &JsValue) -> WebError {
    WebError::Cache {
        operation,
        name: name.to_string(),
        message: js_message(value),
    }
}

async fn wait(
    operation: &'static str,
    name: &str,
    promise: js_sys::Promise,
) -> Result<JsValue, WebError> {
    JsFuture::from(promise)
        .await
        .map_err(|e| cache_error(operation, name, &e))
}

/// Whether a rejection means "no such entry" (as opposed to a real failure).
fn is_not_found(value: &JsValue) -> bool {
    value
        .dyn_ref::<js_sys::Error>()
        .is_some_and(|e| e.name() == "NotFoundError")
}

impl Dir {
    /// The origin's OPFS root (`navigator.storage.getDirectory()`).
    pub async fn root() -> Result<Dir, WebError> {
        let unavailable = |what: &str| WebError::Cache {
            operation: "open",
            name: "/".into(),
            message: format!("{what} is not available in this context"),
        };
        let navigator = Reflect::get(&js_sys::global(), &"navigator".into())
            .ok()
            .filter(|v| v.is_object())
            .ok_or_else(|| unavailable("navigator"))?;
        let storage = Reflect::get(&navigator, &"storage".into())
            .ok()
            .filter(|v| v.is_object())
            .ok_or_else(|| unavailable("navigator.storage"))?
            .unchecked_into::<StorageManager>();
        let handle = wait("open", "/", storage.get_directory()).await?;
        Ok(Dir {
            handle: handle.unchecked_into(),
            name: String::new(),
        })
    }

    pub fn path(&self, child: &str) -> String {
        format!("{}/{}", self.name, child)
    }

    /// The child directory `name`, created when missing.
    pub async fn subdir(&self, name: &str) -> Result<Dir, WebError> {
        let options = FileSystemGetDirectoryOptions::new();
        options.set_create(true);
        let path = self.path(name);
        let handle = wait(
            "open directory",
            &path,
            self.handle
                .get_directory_handle_with_options(name, &options),
        )
        .await?;
        Ok(Dir {
            handle: handle.unchecked_into(),
            name: path,
        })
    }

    /// Names of the entries, in no particular order.
    pub async fn names(&self) -> Result<Vec<String>, WebError> {
        let iterator: JsValue = self.handle.keys().into();
        let next = Reflect::get(&iterator, &"next".into())
            .map_err(|e| cache_error("list", &self.name, &e))?
            .unchecked_into::<js_sys::Function>();
        let mut names = Vec::new();
        loop {
            let promise = next
                .call0(&iterator)
                .map_err(|e| cache_error("list", &self.name, &e))?;
            let step = wait("list", &self.name, promise.unchecked_into()).await?;
            let done = Reflect::get(&step, &"done".into()).is_ok_and(|d| d.is_truthy());
            if done {
                return Ok(names);
            }
            if let Some(name) = Reflect::get(&step, &"value".into())
                .ok()
                .and_then(|v| v.as_string())
            {
                names.push(name);
            }
        }
    }

    async fn file_handle(
        &self,
        name: &str,
        create: bool,
    ) -> Result<Option<FileSystemFileHandle>, WebError> {
        let options = FileSystemGetFileOptions::new();
        options.set_create(create);
        let promise = self.handle.get_file_handle_with_options(name, &options);
        match JsFuture::from(promise).await {
            Ok(handle) => Ok(Some(handle.unchecked_into())),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(cache_error("open", &self.path(name), &e)),
        }
    }

    /// The file's bytes, `None` when it does not exist. Files longer than `max_len` are not
    /// read: a cached range is never larger than the range it holds.
    pub async fn read(&self, name: &str, max_len: u64) -> Result<Option<Vec<u8>>, WebError> {
        let Some(handle) = self.file_handle(name, false).await? else {
            return Ok(None);
        };
        let path = self.path(name);
        let file: File = wait("read", &path, handle.get_file())
            .await?
            .unchecked_into();
        if file.size() > max_len as f64 {
            return Ok(Some(Vec::new()));
        }
        let buffer = wait("read", &path, file.array_buffer()).await?;
        Ok(Some(Uint8Array::new(&buffer).to_vec()))
    }

    /// Writes `bytes` as the whole file. The stream commits on close, so a write cut short
    /// (tab closed, crash) leaves the previous content or no file, never a torn one.
    pub async fn write(&self, name: &str, bytes: &[u8]) -> Result<(), WebError> {
        let path = self.path(name);
        let handle = self
            .file_handle(name, true)
            .await?
            .ok_or_else(|| WebError::Cache {
                operation: "create",
                name: path.clone(),
                message: "the file could not be created".into(),
            })?;
        let stream: FileSystemWritableFileStream = wait("write", &path, handle.create_writable())
            .await?
            .unchecked_into();
        // A copy in the JS heap: a view of wasm memory would be detached if memory grew
        // while the write is pending.
        let copy = Uint8Array::from(bytes);
        let written = stream
            .write_with_js_u8_array(&copy)
            .map_err(|e| cache_error("write", &path, &e))?;
        wait("write", &path, written).await?;
        wait("write", &path, stream.close()).await?;
        Ok(())
    }

    /// Removes `name` (recursively for a directory); a missing entry is not an error.
    pub async fn remove(&self, name: &str) -> Result<(), WebError> {
        let options = FileSystemRemoveOptions::new();
        options.set_recursive(true);
        match JsFuture::from(self.handle.remove_entry_with_options(name, &options)).await {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(cache_error("remove", &self.path(name), &e)),
        }
    }
}

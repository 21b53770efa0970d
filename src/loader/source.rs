//! Random access to a model file's bytes, wherever they are: in memory, on disk, or (in the
//! browser) in the origin-private file system, a `Blob` or a JS array outside wasm memory. The
//! loader reads a file's header and then each tensor's rows through this trait, a bounded chunk
//! at a time, so a model never has to be whole in memory to be loaded.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use crate::error::{Error, Result};

/// A wait for bytes still arriving (in the browser, a download in progress).
pub type Wait<'a> = Pin<Box<dyn Future<Output = Result<()>> + 'a>>;

/// `Send + Sync` natively, where a model may be opened on one thread and loaded on another;
/// nothing in the browser, whose JS objects stay on their thread.
#[cfg(not(target_arch = "wasm32"))]
pub trait MaybeSend: Send + Sync {}
#[cfg(not(target_arch = "wasm32"))]
impl<T: Send + Sync> MaybeSend for T {}
/// `Send + Sync` natively, where a model may be opened on one thread and loaded on another;
/// nothing in the browser, whose JS objects stay on their thread.
#[cfg(target_arch = "wasm32")]
pub trait MaybeSend {}
#[cfg(target_arch = "wasm32")]
impl<T> MaybeSend for T {}

/// One file, read by ranges.
pub trait Source: MaybeSend {
    /// The file's length in bytes (fixed when the source was opened).
    fn len(&self) -> u64;

    /// Whether the file is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Fills `buf` with the bytes at `offset .. offset + buf.len()`; callers stay inside
    /// [`Source::len`] (see [`read`]) and, for a file still arriving, wait for them first
    /// ([`Source::ready`]).
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()>;

    /// A wait until the bytes before `end` can be read, for a file still arriving (a download
    /// that the load overlaps); `None` when they can be read now (the default: a whole file).
    fn ready(&self, _end: u64) -> Option<Wait<'_>> {
        None
    }
}

/// The result of a future that does not wait (a load whose files are whole: on disk, in memory,
/// or stored in the browser), got by polling it once; one that would wait is an error, as the
/// caller has no executor to wait with (the browser facade awaits the async loaders instead).
pub fn now<T>(what: &str, future: impl Future<Output = Result<T>>) -> Result<T> {
    let mut future = std::pin::pin!(future);
    match future.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(result) => result,
        Poll::Pending => Err(Error::InvalidArgument(format!(
            "{what}: a model file is still arriving; use the async loader to wait for it"
        ))),
    }
}

/// The bytes at `offset .. offset + len` of `source`, or [`Error::Truncated`] when the range
/// ends past the file (`what` names what was being read).
pub fn read(source: &dyn Source, offset: u64, len: u64, what: &str) -> Result<Vec<u8>> {
    let end = offset.checked_add(len);
    let n = usize::try_from(len).ok();
    match (end, n) {
        (Some(end), Some(n)) if end <= source.len() => {
            let mut buf = vec![0u8; n];
            source.read_at(offset, &mut buf)?;
            Ok(buf)
        }
        _ => Err(Error::Truncated { what: what.to_string(), offset, needed: len, len: source.len() }),
    }
}

/// A file held in memory.
impl Source for Vec<u8> {
    fn len(&self) -> u64 {
        self.as_slice().len() as u64
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let range = usize::try_from(offset).ok().and_then(|s| Some(s..s.checked_add(buf.len())?));
        let src = range.and_then(|r| self.get(r)).ok_or_else(|| Error::Truncated {
            what: "bytes in memory".into(),
            offset,
            needed: buf.len() as u64,
            len: self.as_slice().len() as u64,
        })?;
        buf.copy_from_slice(src);
        Ok(())
    }
}

/// The first bytes of a file of a known length (what a download has delivered so far): enough to
/// parse the file's header and check the model before the rest arrives. A read past them gives
/// [`Error::Truncated`].
pub struct Prefix {
    pub bytes: Vec<u8>,
    /// The whole file's length.
    pub len: u64,
}

impl Source for Prefix {
    fn len(&self) -> u64 {
        self.len.max(self.bytes.as_slice().len() as u64)
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.bytes.read_at(offset, buf)
    }
}

/// A local file (native only), read with positioned reads; its length is fixed when opened, so
/// a file that shrinks while loading fails with a read error instead of giving short data.
#[cfg(not(target_arch = "wasm32"))]
pub struct LocalFile {
    path: std::path::PathBuf,
    file: std::sync::Mutex<std::fs::File>,
    len: u64,
}

#[cfg(not(target_arch = "wasm32"))]
impl LocalFile {
    /// Opens a regular file (a device, a pipe or a folder is refused).
    pub fn open(path: &std::path::Path) -> Result<LocalFile> {
        let io = |e| Error::io(path.display(), e);
        let file = std::fs::File::open(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if !meta.is_file() {
            return Err(Error::InvalidArgument(format!("{}: not a regular file", path.display())));
        }
        Ok(LocalFile { path: path.to_path_buf(), file: std::sync::Mutex::new(file), len: meta.len() })
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl Source for LocalFile {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        use std::io::{Read, Seek, SeekFrom};
        let io = |e| Error::io(self.path.display(), e);
        let mut file = self.file.lock().map_err(|_| Error::io(self.path.display(), "a reader panicked"))?;
        file.seek(SeekFrom::Start(offset)).map_err(io)?;
        file.read_exact(buf).map_err(io)
    }
}

//! Request and response bodies in constant memory.
//!
//! - [`read_all`] buffers a small body (control JSON, inline values) up to a limit;
//! - [`CheckedReader`] turns a streaming body into a blocking [`Read`] for the storage
//!   calls (through [`SyncIoBridge`]), counting bytes against the upload limit and checking
//!   the signed BLAKE3 hash at the end, so an oversize or tampered body fails the write
//!   before any version is committed;
//! - [`produce`] runs a blocking producer (a blob reader, a list iterator) that writes into
//!   a bounded channel feeding the response body.

use std::io::{self, Read, Write};
use std::sync::Arc;

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use cairn_core::{HashAlgo, Hasher};
use futures_util::TryStreamExt;
use parking_lot::Mutex;
use tokio_util::io::{StreamReader, SyncIoBridge};

use super::error::{ApiError, ApiResult};
use crate::node::Node;

/// Bytes per response chunk handed to the HTTP layer.
const OUT_CHUNK: usize = 64 << 10;
/// Response chunks queued between the producer and the connection.
const OUT_QUEUE: usize = 4;

/// Counts and hashes a body as it arrives.
struct Check {
    limit: u64,
    expect: Option<[u8; 32]>,
    hasher: Option<Hasher>,
    n: u64,
}

impl Check {
    fn new(limit: u64, expect: Option<[u8; 32]>) -> Self {
        Check {
            limit,
            expect,
            hasher: expect.map(|_| HashAlgo::Blake3.hasher()),
            n: 0,
        }
    }

    fn feed(&mut self, data: &[u8]) -> ApiResult<()> {
        self.n += data.len() as u64;
        if self.n > self.limit {
            return Err(ApiError::too_large(self.limit));
        }
        if let Some(h) = &mut self.hasher {
            h.update(data);
        }
        Ok(())
    }

    fn finish(&mut self) -> ApiResult<()> {
        if let (Some(h), Some(expect)) = (self.hasher.take(), self.expect) {
            let got = h.finalize();
            if *got.digest() != expect {
                return Err(ApiError::unauthorized(format!(
                    "the body's BLAKE3 hash is {}, not the signed {}",
                    hex::encode(got.digest()),
                    hex::encode(expect)
                )));
            }
        }
        Ok(())
    }
}

/// Reads a whole body of at most `limit` bytes; with `expect`, checks its BLAKE3 hash.
pub async fn read_all(body: Body, limit: u64, expect: Option<[u8; 32]>) -> ApiResult<Bytes> {
    let mut check = Check::new(limit, expect);
    let mut buf = BytesMut::new();
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream
        .try_next()
        .await
        .map_err(|e| ApiError::bad_request(format!("reading the request body: {e}")))?
    {
        check.feed(&chunk)?;
        buf.extend_from_slice(&chunk);
    }
    check.finish()?;
    Ok(buf.freeze())
}

/// Why a [`CheckedReader`] stopped a write, if it did.
pub type Failure = Arc<Mutex<Option<ApiError>>>;

/// A blocking reader over a streaming request body that enforces the upload limit and the
/// signed hash: either failure makes `read` return an error (so the storage call aborts
/// before it commits anything) and is kept in [`CheckedReader::failure`] for the response.
pub struct CheckedReader {
    inner: SyncIoBridge<Box<dyn tokio::io::AsyncRead + Send + Unpin>>,
    check: Check,
    failure: Failure,
    done: bool,
}

impl CheckedReader {
    /// Wraps `body`; must be called on the runtime (the bridge keeps its handle).
    pub fn new(body: Body, limit: u64, expect: Option<[u8; 32]>) -> Self {
        let stream = body.into_data_stream().map_err(io::Error::other);
        let reader: Box<dyn tokio::io::AsyncRead + Send + Unpin> =
            Box::new(StreamReader::new(stream));
        CheckedReader {
            inner: SyncIoBridge::new(reader),
            check: Check::new(limit, expect),
            failure: Arc::new(Mutex::new(None)),
            done: false,
        }
    }

    /// Where a failure is reported.
    pub fn failure(&self) -> Failure {
        self.failure.clone()
    }

    /// Bytes read so far.
    pub fn bytes(&self) -> u64 {
        self.check.n
    }

    fn fail(&mut self, e: ApiError) -> io::Error {
        let msg = e.message.clone();
        *self.failure.lock() = Some(e);
        io::Error::other(msg)
    }
}

impl Read for CheckedReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.done {
            return Ok(0);
        }
        let n = match self.inner.read(buf) {
            Ok(n) => n,
            Err(e) => {
                return Err(self.fail(ApiError::bad_request(format!(
                    "reading the request body: {e}"
                ))));
            }
        };
        if n == 0 {
            self.done = true;
            if let Err(e) = self.check.finish() {
                return Err(self.fail(e));
            }
            return Ok(0);
        }
        if let Err(e) = self.check.feed(&buf[..n]) {
            return Err(self.fail(e));
        }
        Ok(n)
    }
}

/// The blocking end of a streamed response: [`Write`] into bounded chunks handed to the
/// connection. A write fails once the client has gone away, which stops the producer.
pub struct ChannelWriter {
    tx: tokio::sync::mpsc::Sender<io::Result<Bytes>>,
    buf: BytesMut,
    node: Arc<Node>,
}

impl ChannelWriter {
    fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = self.buf.split().freeze();
        let n = chunk.len() as u64;
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the client went away"))?;
        self.node
            .metrics
            .bytes_read
            .with_label_values(&["native"])
            .inc_by(n);
        Ok(())
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let room = OUT_CHUNK - self.buf.len();
        let n = data.len().min(room);
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() >= OUT_CHUNK {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send()
    }
}

/// A response body written by `f` on the blocking pool, in chunks of at most 64 KiB with
/// at most a few in flight (constant memory whatever the size). An error from `f` after the
/// response has started aborts the body, so the client sees a cut transfer, never a
/// silently short one.
pub fn produce<F>(node: Arc<Node>, f: F) -> Body
where
    F: FnOnce(&mut ChannelWriter) -> cairn_core::Result<()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel::<io::Result<Bytes>>(OUT_QUEUE);
    tokio::task::spawn_blocking(move || {
        let mut w = ChannelWriter {
            tx: tx.clone(),
            buf: BytesMut::with_capacity(OUT_CHUNK),
            node,
        };
        let result = f(&mut w).and_then(|()| {
            w.send()
                .map_err(|e| cairn_core::Error::io("sending the response", e))
        });
        if let Err(e) = result {
            tracing::warn!(error = %e, "native API response cut short");
            let _ = tx.blocking_send(Err(io::Error::other(e.to_string())));
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    Body::from_stream(stream)
}

/// Maps an I/O error from a [`std::io::Write`] into a [`ChannelWriter`] to Cairn's error.
pub fn io_err(e: io::Error) -> cairn_core::Error {
    cairn_core::Error::io("streaming the response", e)
}

//! Request and response bodies in constant memory.
//!
//! - [`read_all`] buffers a small body (control JSON, inline values) up to a limit;
//! - [`BodyReader`] turns a streaming request body into a blocking [`Read`] for the
//!   storage calls: a task on the runtime pulls the body and hands it over in batches of
//!   about 256 KiB through a small bounded channel, so memory stays constant and the
//!   blocking thread wakes once per batch rather than once per network read (used by the
//!   native API and the Gaia hub);
//! - [`CheckedReader`] wraps a [`BodyReader`], counting bytes against the upload limit and
//!   checking the signed BLAKE3 hash at the end, so an oversize or tampered body fails the
//!   write before any version is committed;
//! - [`produce`] runs a blocking producer (a blob reader, a list iterator) that writes into
//!   a bounded channel feeding the response body.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::{Buf, Bytes, BytesMut};
use cairn_core::{HashAlgo, Hasher};
use futures_util::{StreamExt, TryStreamExt};
use parking_lot::Mutex;

use super::error::{ApiError, ApiResult};
use crate::node::Node;

/// Bytes per response chunk handed to the HTTP layer.
const OUT_CHUNK: usize = 256 << 10;
/// Response chunks queued between the producer and the connection.
const OUT_QUEUE: usize = 4;

/// Request-body bytes the pump gathers before it wakes the blocking reader.
const IN_BATCH: usize = 256 << 10;
/// Request-body batches queued between the pump and the blocking reader.
const IN_QUEUE: usize = 4;
/// Most frames one batch hands over, whatever their size: a client that sends its body in
/// tiny frames (1-byte chunks) must not make a batch of hundreds of thousands of `Bytes`
/// handles (tens of MiB per upload).
const IN_FRAMES: usize = 256;
/// Frames shorter than this are copied into one buffer of the batch; longer ones are handed
/// over as they are (no copy).
const SMALL_FRAME: usize = 4 << 10;

/// Most elements (lines of a text body; JSON values, object keys included, of a JSON body)
/// a request body buffered in memory may have: 1,048,576. They are counted on the raw
/// bytes before anything is parsed ([`text_elements`], [`json_elements`]) and a body with
/// more is refused with 400, so one small element of a body (a 1-byte line, `"",`) cannot
/// make the node allocate tens of bytes per byte sent. A list with more elements streams
/// (a text `PUT`).
pub const MAX_BUFFERED_ELEMENTS: usize = 1 << 20;

/// Most bytes of a refused request body the node still reads and throws away, and for how
/// long: most HTTP clients send the whole body before they read the answer, and a node
/// that closed the connection at once would leave them a reset connection instead of the
/// refusal. Beyond either bound the connection is closed.
const DRAIN_MAX: u64 = 16 << 20;
/// See [`DRAIN_MAX`].
const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(10);

/// Reads and throws away what the client still sends of a request the node refused
/// (bounded by [`DRAIN_MAX`] and [`DRAIN_TIME`]), on a task of its own, so the client gets
/// the answer. Nothing of it is stored.
pub fn drain_refused(body: Body) {
    tokio::spawn(drain(body.into_data_stream()));
}

/// Reads and drops the rest of a request body, within [`DRAIN_MAX`] and [`DRAIN_TIME`].
async fn drain(mut stream: axum::body::BodyDataStream) {
    let mut left = DRAIN_MAX;
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        while let Some(Ok(frame)) = stream.next().await {
            match left.checked_sub(frame.len() as u64) {
                Some(l) => left = l,
                None => break,
            }
        }
    })
    .await;
}

/// Why reading a request body failed, in words: a body that sent nothing for the stall
/// timeout (the node's `TimeoutBody` around every request body) says so.
pub fn body_error(e: &axum::Error) -> String {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if c.is::<tower_http::timeout::TimeoutError>() {
            return "the request body stalled: it sent no bytes for the stall timeout".into();
        }
        if let Some(slow) = c.downcast_ref::<crate::rate::TooSlow>() {
            return format!("the request body was too slow: {slow}");
        }
        cause = c.source();
    }
    e.to_string()
}

/// What the body pump hands to a [`BodyReader`].
enum Pumped {
    /// The next frames of the body, in order.
    Data(Vec<Bytes>),
    /// The body ended cleanly after everything sent before.
    End,
    /// The body failed (the client went away, a malformed chunked encoding, ...).
    Failed(String),
}

/// Moves the small frames copied into `small` (if any) into `batch` as one frame.
fn take_small(small: &mut BytesMut, batch: &mut Vec<Bytes>) {
    if !small.is_empty() {
        batch.push(small.split().freeze());
    }
}

/// A streaming request body as a blocking [`Read`], for the storage calls that run on the
/// blocking pool. A task on the runtime pulls the body and hands its frames over in
/// batches of about 256 KiB and at most 256 frames (frames under 4 KiB are copied into one
/// buffer; at most four batches queued), so memory stays constant
/// whatever the size and the reading thread wakes once per batch. The end of the body is
/// an explicit message: a body cut short, or a pump that died, reads as an error and never
/// as a clean end of file, so a truncated upload can never be committed.
pub struct BodyReader {
    rx: tokio::sync::mpsc::Receiver<Pumped>,
    frames: VecDeque<Bytes>,
    state: ReadState,
}

/// Where a [`BodyReader`] stands.
enum ReadState {
    Open,
    Ended,
    Failed(String),
}

impl BodyReader {
    /// Starts pulling `body`; must be called on the runtime (it spawns the pump). Reads
    /// must happen off the runtime's worker threads (e.g. in `spawn_blocking`). A body that
    /// stalls fails through the node's stall timer on every request body (the read errors;
    /// nothing is stored).
    pub fn new(body: Body) -> Self {
        let (reader, gate) = Self::gated(body, false);
        gate.open();
        reader
    }

    /// [`BodyReader::new`], pulling nothing until `gate` is opened: a request refused on
    /// its headers (a bad token, a Content-Length over the limit) must not be invited to
    /// upload (`Expect: 100-continue` is answered when the body is first pulled) nor have
    /// its body buffered first. When the gate is dropped unopened, the body is drained
    /// (bounded, so a client already sending it reads the answer, not a reset); with
    /// `expects_continue` only after a moment, once the refusal has gone out.
    pub fn gated(body: Body, expects_continue: bool) -> (Self, BodyGate) {
        let (open, opened) = tokio::sync::oneshot::channel::<()>();
        let (tx, rx) = tokio::sync::mpsc::channel(IN_QUEUE);
        tokio::spawn(async move {
            let mut stream = body.into_data_stream();
            if opened.await.is_err() {
                // A client waiting for `100 Continue` is not invited: pulling the body
                // before the refusal is out would send it. Some send anyway after a
                // wait (curl after 1 s), so the body is drained once the refusal has
                // had time to go out (a pull after the response started sends nothing).
                if expects_continue {
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
                drain(stream).await;
                return;
            }
            let mut batch = Vec::new();
            // Small frames are copied here, so a batch holds few handles whatever the
            // client's framing; at most about `IN_BATCH` bytes.
            let mut small = BytesMut::new();
            let mut bytes = 0;
            loop {
                let msg = match stream.next().await {
                    Some(Ok(frame)) => {
                        if frame.is_empty() {
                            continue;
                        }
                        bytes += frame.len();
                        if frame.len() < SMALL_FRAME {
                            small.extend_from_slice(&frame);
                        } else {
                            take_small(&mut small, &mut batch);
                            batch.push(frame);
                        }
                        // One handle is kept free for what `small` holds.
                        if bytes < IN_BATCH && batch.len() + 1 < IN_FRAMES {
                            continue;
                        }
                        take_small(&mut small, &mut batch);
                        bytes = 0;
                        Pumped::Data(std::mem::take(&mut batch))
                    }
                    end => {
                        take_small(&mut small, &mut batch);
                        if !batch.is_empty()
                            && tx
                                .send(Pumped::Data(std::mem::take(&mut batch)))
                                .await
                                .is_err()
                        {
                            return;
                        }
                        let last = match end {
                            Some(Err(e)) => Pumped::Failed(body_error(&e)),
                            _ => Pumped::End,
                        };
                        let _ = tx.send(last).await;
                        return;
                    }
                };
                // The reader is gone (the write failed or was refused): stop storing, but
                // read and drop what the client still sends (bounded), so it gets the
                // answer rather than a reset connection.
                if tx.send(msg).await.is_err() {
                    drain(stream).await;
                    return;
                }
            }
        });
        (
            BodyReader {
                rx,
                frames: VecDeque::new(),
                state: ReadState::Open,
            },
            BodyGate(Some(open)),
        )
    }
}

/// Lets a [`BodyReader::gated`] reader start pulling its body.
pub struct BodyGate(Option<tokio::sync::oneshot::Sender<()>>);

impl BodyGate {
    /// Starts pulling the body.
    pub fn open(mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

impl Read for BodyReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            // Copy whatever is already here, across frames, without blocking.
            let mut n = 0;
            while n < buf.len() {
                let Some(front) = self.frames.front_mut() else {
                    break;
                };
                let k = front.len().min(buf.len() - n);
                buf[n..n + k].copy_from_slice(&front[..k]);
                front.advance(k);
                if front.is_empty() {
                    self.frames.pop_front();
                }
                n += k;
            }
            if n > 0 {
                return Ok(n);
            }
            match &self.state {
                ReadState::Ended => return Ok(0),
                ReadState::Failed(e) => return Err(io::Error::other(e.clone())),
                ReadState::Open => {}
            }
            self.state = match self.rx.blocking_recv() {
                Some(Pumped::Data(frames)) => {
                    self.frames.extend(frames);
                    ReadState::Open
                }
                Some(Pumped::End) => ReadState::Ended,
                Some(Pumped::Failed(e)) => ReadState::Failed(e),
                None => ReadState::Failed("the request body ended unexpectedly".into()),
            };
        }
    }
}

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
///
/// A body whose declared length (`Content-Length`) is over `limit` is refused before any
/// of it is read (413 at once, where the client waited to send it all, or stalled with it
/// held back, first), and a body that runs over `limit` is refused where it does; in both
/// cases what the client still sends is drained ([`drain_refused`]), so it reads the 413
/// rather than a reset connection.
pub async fn read_all(body: Body, limit: u64, expect: Option<[u8; 32]>) -> ApiResult<Bytes> {
    read_all_within(body, limit, expect, None).await
}

/// [`read_all`] of a body that is then parsed in memory: `memory` grows with the bytes as
/// they arrive, and when the node's budget for such bodies is held the read stops with
/// 503 (`Retry-After: 1`; what the client still sends is drained).
pub async fn read_all_within(
    body: Body,
    limit: u64,
    expect: Option<[u8; 32]>,
    mut memory: Option<&mut crate::node::BufferedMemory>,
) -> ApiResult<Bytes> {
    if http_body::Body::size_hint(&body).lower() > limit {
        drain_refused(body);
        return Err(ApiError::too_large(limit));
    }
    let mut check = Check::new(limit, expect);
    let mut buf = BytesMut::new();
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.try_next().await.map_err(|e| {
        ApiError::bad_request(format!("reading the request body: {}", body_error(&e)))
    })? {
        if let Err(e) = check.feed(&chunk) {
            tokio::spawn(drain(stream));
            return Err(e);
        }
        if let Some(m) = memory.as_deref_mut()
            && let Err(b) = m.grow((buf.len() + chunk.len()) as u64)
        {
            tokio::spawn(drain(stream));
            return Err(busy(b.0));
        }
        buf.extend_from_slice(&chunk);
    }
    check.finish()?;
    Ok(buf.freeze())
}

/// The lines of `r` (split at `\n`, which is dropped; a last line without one counts), each
/// at most `max` bytes: a longer one ends the iteration with [`Error::InvalidInput`] after
/// reading at most `max + 1` of its bytes, so one endless line cannot fill memory.
pub fn bounded_lines<R: std::io::BufRead>(
    r: R,
    max: usize,
) -> impl Iterator<Item = cairn_core::Result<Vec<u8>>> {
    bounded_lines_within(r, max, |_| Ok(()))
}

/// Bytes of a line [`bounded_lines_within`] reads before it asks `charge` for the memory
/// the line holds: shorter lines live in the reader's buffer's shadow.
const LINE_CHARGE_FROM: usize = 1 << 20;

/// [`bounded_lines`], calling `charge` with the memory a line past 1 MiB holds (its buffer,
/// and as much again for the leaf it is copied into) before its buffer grows: an error
/// from `charge` (a memory budget with no room) ends the iteration with it. A line's
/// buffer doubles by at most 1 MiB at a time and never past `max + 1` bytes.
pub fn bounded_lines_within<R: std::io::BufRead>(
    mut r: R,
    max: usize,
    mut charge: impl FnMut(usize) -> cairn_core::Result<()>,
) -> impl Iterator<Item = cairn_core::Result<Vec<u8>>> {
    let mut done = false;
    std::iter::from_fn(move || {
        if done {
            return None;
        }
        let mut line: Vec<u8> = Vec::new();
        let mut ended = false;
        let mut read_any = false;
        loop {
            let buf = match r.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    done = true;
                    return Some(Err(cairn_core::Error::io("reading a list's lines", e)));
                }
            };
            if buf.is_empty() {
                break;
            }
            read_any = true;
            let (take, newline) = match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (i, true),
                None => (buf.len(), false),
            };
            // At most `max + 1` bytes of a line are kept: past `max` it is refused.
            let room = (max + 1).saturating_sub(line.len());
            let keep = take.min(room);
            // The buffer grows here only (doubling, by at most a MiB at a time, never past
            // `max + 1`), and past a MiB it is charged before it grows: a vector left to
            // grow itself could double past the threshold uncharged.
            let need = line.len() + keep;
            if need > line.capacity() {
                let grown = line
                    .capacity()
                    .saturating_mul(2)
                    .min(line.capacity() + LINE_CHARGE_FROM)
                    .min(max + 1)
                    .max(need);
                if grown > LINE_CHARGE_FROM
                    && let Err(e) = charge(2 * grown)
                {
                    done = true;
                    return Some(Err(e));
                }
                line.reserve_exact(grown - line.len());
            }
            line.extend_from_slice(&buf[..keep]);
            let consumed = if newline && keep == take {
                take + 1
            } else {
                keep
            };
            r.consume(consumed);
            if newline && keep == take {
                ended = true;
                break;
            }
            if line.len() > max {
                break;
            }
        }
        if !read_any {
            done = true;
            return None;
        }
        if line.len() > max {
            done = true;
            return Some(Err(cairn_core::Error::invalid(format!(
                "a list element (one line) is longer than {} MiB; store large data as a blob",
                max >> 20
            ))));
        }
        if !ended {
            // The last line, without a newline: the input ends here.
            done = true;
        }
        Some(Ok(line))
    })
}

/// An upper bound on the lines of a text body (its newlines, plus one): the elements a
/// tuple, set or map in text form would have. Allocates nothing.
pub fn text_elements(body: &[u8]) -> usize {
    body.iter().filter(|&&b| b == b'\n').count() + 1
}

/// An upper bound on the JSON values (object keys included) parsing `body` would make:
/// one, plus one per `[`, `{`, `,` and `:` outside strings (exact for a well-formed body
/// without empty arrays or objects). Allocates nothing; a malformed body is left to the
/// parser.
pub fn json_elements(body: &[u8]) -> usize {
    let mut n = 1;
    let mut in_string = false;
    let mut escaped = false;
    for &b in body {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else {
            match b {
                b'"' => in_string = true,
                b'[' | b'{' | b',' | b':' => n += 1,
                _ => {}
            }
        }
    }
    n
}

/// Parses a buffered JSON body into `T`: refused (400) with too many elements (counted
/// before the parse allocates; see [`check_elements`]), with an object naming a key twice,
/// or when it does not parse, the parser's message after `what`.
pub fn parse_bounded_json<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    what: &str,
) -> ApiResult<T> {
    check_elements(json_elements(bytes))?;
    // Derived structs refuse a field twice; a free-form value inside (a map's `set`) would
    // keep the last of two keys.
    super::values::check_unique_keys(bytes)
        .map_err(|e| ApiError::bad_request(format!("{what}: {e}")))?;
    serde_json::from_slice(bytes).map_err(|e| ApiError::bad_request(format!("{what}: {e}")))
}

/// Refuses (400) a buffered body of `n` elements (see [`text_elements`],
/// [`json_elements`]) beyond [`MAX_BUFFERED_ELEMENTS`], before it is parsed.
pub fn check_elements(n: usize) -> ApiResult<()> {
    if n > MAX_BUFFERED_ELEMENTS {
        return Err(ApiError::bad_request(format!(
            "the body has too many elements (up to {n}; at most {MAX_BUFFERED_ELEMENTS} are \
             accepted in one buffered request; stream a long list as text instead)"
        )));
    }
    Ok(())
}

/// Why a [`CheckedReader`] stopped a write, if it did.
pub type Failure = Arc<Mutex<Option<ApiError>>>;

/// A blocking reader over a streaming request body that enforces the upload limit and the
/// signed hash: either failure makes `read` return an error (so the storage call aborts
/// before it commits anything) and is kept in [`CheckedReader::failure`] for the response.
pub struct CheckedReader {
    inner: BodyReader,
    check: Check,
    failure: Failure,
    done: bool,
}

impl CheckedReader {
    /// Wraps `body`; must be called on the runtime (see [`BodyReader::new`]).
    pub fn new(body: Body, limit: u64, expect: Option<[u8; 32]>) -> Self {
        CheckedReader {
            inner: BodyReader::new(body),
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

/// What a response producer hands to the connection.
enum Out {
    /// The next frames of the body.
    Data(Vec<Bytes>),
    /// The body failed: the connection aborts it.
    Failed(io::Error),
    /// The body is complete. A channel that closes without it (a producer that died) is a
    /// failure too, so a response never ends short while looking complete.
    End,
}

/// The blocking end of a streamed response: [`Write`] into bounded chunks handed to the
/// connection. A write fails once the client has gone away, or has read nothing for the
/// stall timeout, which stops the producer (and frees its thread and buffers).
pub struct ChannelWriter {
    tx: tokio::sync::mpsc::Sender<Out>,
    /// The runtime, whose timer bounds each hand-over.
    handle: tokio::runtime::Handle,
    stall: Duration,
    /// The minimum rate at which the client must read (time blocked handing over counts).
    floor: crate::rate::RateFloor,
    /// Pending bytes: `shared` (pieces handed over whole), then `buf` (bytes copied in).
    shared: Vec<Bytes>,
    shared_len: usize,
    buf: BytesMut,
    node: Arc<Node>,
    /// The `bytes_read` label the sent bytes count under (`None`: the caller counts).
    label: Option<&'static str>,
}

impl ChannelWriter {
    /// Queues `piece` without copying it (e.g. a verified leaf that shares the store's read
    /// buffer); sends once about [`OUT_CHUNK`] bytes are pending. Errors as `write` does.
    pub fn write_shared(&mut self, piece: Bytes) -> io::Result<()> {
        if !self.buf.is_empty() {
            let copied = self.buf.split().freeze();
            self.shared_len += copied.len();
            self.shared.push(copied);
        }
        self.shared_len += piece.len();
        self.shared.push(piece);
        if self.shared_len >= OUT_CHUNK {
            self.send()?;
        }
        Ok(())
    }

    fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() && self.shared.is_empty() {
            return Ok(());
        }
        let mut frames = std::mem::take(&mut self.shared);
        let mut n = std::mem::take(&mut self.shared_len) as u64;
        if !self.buf.is_empty() {
            let chunk = self.buf.split().freeze();
            // The split left no room: take a whole chunk's worth now, not by doubling
            // (each doubling copied what was buffered).
            self.buf.reserve(OUT_CHUNK);
            n += chunk.len() as u64;
            frames.push(chunk);
        }
        let t0 = std::time::Instant::now();
        self.hand_over(Out::Data(frames))?;
        let waited = t0.elapsed();
        if let Err(e) = self.floor.record(n, waited) {
            return Err(io::Error::new(io::ErrorKind::TimedOut, e.to_string()));
        }
        if let Some(label) = self.label {
            self.node
                .metrics
                .bytes_read
                .with_label_values(&[label])
                .inc_by(n);
        }
        Ok(())
    }
}

impl ChannelWriter {
    /// Queues `out` for the connection, waiting at most the stall timeout for room.
    fn hand_over(&self, out: Out) -> io::Result<()> {
        let sent = self
            .handle
            .block_on(tokio::time::timeout(self.stall, self.tx.send(out)));
        match sent {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the client went away",
            )),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing for {} s", self.stall.as_secs_f64()),
            )),
        }
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let room = OUT_CHUNK
            .saturating_sub(self.shared_len + self.buf.len())
            .max(1);
        let n = data.len().min(room);
        self.buf.extend_from_slice(&data[..n]);
        if self.shared_len + self.buf.len() >= OUT_CHUNK {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send()
    }
}

/// A permit for one request that sends data from the store ([`Node::read_permit`]), or
/// 503 with `Retry-After` while reads hold their share of `max_transfers` (or the peer's
/// address its `max_transfers_per_ip`).
pub fn transfer_permit(node: &Node) -> ApiResult<crate::node::Transfer> {
    node.read_permit().map_err(|b| busy(b.0))
}

/// A 503 with `Retry-After: 1`.
pub(crate) fn busy(message: String) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        message,
    )
    .with_header(
        axum::http::header::RETRY_AFTER,
        axum::http::HeaderValue::from_static("1"),
    )
}

/// A permit for a request with a body ([`Node::write_permit`]): when none is free, what the client still
/// sends is drained ([`drain_refused`]) so that it reads the 503 rather than a reset
/// connection. Take it before anything else is done for the request (before a request
/// signature is checked, which consumes it against replays), so a refused request can be
/// sent again as it was.
pub fn body_permit(node: &Node, body: Body) -> ApiResult<(crate::node::Transfer, Body)> {
    match node.write_permit() {
        Ok(p) => Ok((p, body)),
        Err(b) => {
            drain_refused(body);
            Err(busy(b.0))
        }
    }
}

/// [`memory_room`] for a body of at most `limit` bytes that declared `declared`: one
/// declared over the limit is refused with 413 first (a 503 for want of room would tell the
/// client to send again what can never be taken).
pub fn declared_room(
    node: &Node,
    declared: Option<u64>,
    limit: u64,
    body: Body,
) -> ApiResult<Body> {
    match declared {
        Some(n) if n > limit => {
            drain_refused(body);
            Err(ApiError::too_large(limit))
        }
        n => memory_room(node, n.unwrap_or(0), body),
    }
}

/// Refuses (503, `Retry-After: 1`, the body drained) a body of up to `bytes` the budget
/// for bodies held in memory has no room for now, before a signed request's signature is
/// used ([`Node::has_buffered_room`]).
pub fn memory_room(node: &Node, bytes: u64, body: Body) -> ApiResult<Body> {
    if node.has_buffered_room(bytes) {
        Ok(body)
    } else {
        drain_refused(body);
        Err(busy(format!(
            "the request bodies being held in memory hold the {} MiB this node keeps for \
             them; retry",
            crate::node::BUFFERED_MEMORY_MIB
        )))
    }
}

/// Largest JSON answer [`json_response`] sends from memory.
const SMALL_JSON: usize = 16 << 10;

/// A writer into `out` that fails once it would hold more than `cap` bytes.
struct CappedWriter<'a> {
    out: &'a mut Vec<u8>,
    cap: usize,
}

impl io::Write for CappedWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.out.len() + buf.len() > self.cap {
            return Err(io::Error::other("over the in-memory answer's size"));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A JSON answer built in memory. Up to 16 KiB it is sent from memory (the transfer given
/// back at once); larger, as a [`produce`] body under `permit`: a client that reads
/// nothing for the stall timeout (or below the rate floor) is cut, which frees the answer
/// and the transfer.
pub fn json_response(
    node: Arc<Node>,
    permit: crate::node::Transfer,
    value: serde_json::Value,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    // A small answer (most are) is serialized here and sent from memory, its transfer
    // given back at once; a larger one streams from the blocking pool.
    let mut small = Vec::new();
    let body = if serde_json::to_writer(
        CappedWriter {
            out: &mut small,
            cap: SMALL_JSON,
        },
        &value,
    )
    .is_ok()
    {
        drop(permit);
        node.metrics
            .bytes_read
            .with_label_values(&["native"])
            .inc_by(small.len() as u64);
        // Held at its length, not at the capacity its growth reached.
        small.shrink_to_fit();
        Body::from(small)
    } else {
        produce(node, permit, move |w| {
            serde_json::to_writer(&mut *w, &value).map_err(|e| io_err(io::Error::other(e)))
        })
    };
    (
        axum::http::StatusCode::OK,
        [(
            axum::http::header::CONTENT_TYPE,
            axum::http::HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

/// A response body written by `f` on the blocking pool, in chunks of at most 256 KiB with
/// at most a few in flight (constant memory whatever the size). An error from `f` after the
/// response has started aborts the body, so the client sees a cut transfer, never a
/// silently short one. `permit` (see [`Node::read_permit`]) is held until the
/// producer ends; a client that reads nothing for the stall timeout ends it too.
pub fn produce<F>(node: Arc<Node>, permit: crate::node::Transfer, f: F) -> Body
where
    F: FnOnce(&mut ChannelWriter) -> cairn_core::Result<()> + Send + 'static,
{
    produce_as(node, Some("native"), permit, f)
}

/// [`produce`], counting the bytes sent under the `bytes_read` label `label` (`None`: not
/// counted here).
pub fn produce_as<F>(
    node: Arc<Node>,
    label: Option<&'static str>,
    permit: crate::node::Transfer,
    f: F,
) -> Body
where
    F: FnOnce(&mut ChannelWriter) -> cairn_core::Result<()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel::<Out>(OUT_QUEUE);
    let handle = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let mut w = ChannelWriter {
            tx,
            handle,
            stall: node.stall_timeout(),
            floor: node.rate_floor(),
            shared: Vec::new(),
            shared_len: 0,
            buf: BytesMut::with_capacity(OUT_CHUNK),
            node,
            label,
        };
        let result = f(&mut w)
            .and_then(|()| {
                w.send()
                    .map_err(|e| cairn_core::Error::io("sending the response", e))
            })
            .and_then(|()| match w.hand_over(Out::End) {
                // Every byte was handed over and the body is gone: with a Content-Length,
                // the server drops the body as soon as that many bytes were sent, which
                // can beat the end marker. Not a cut.
                Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
                    tracing::debug!("response complete before its end marker");
                    Ok(())
                }
                r => r.map_err(|e| cairn_core::Error::io("sending the response", e)),
            });
        if let Err(e) = result {
            tracing::warn!(error = %e, "response cut short");
            // Best effort: if the queue is full the client is not reading, and the channel
            // closing without `End` aborts the body anyway.
            let _ = w.tx.try_send(Out::Failed(io::Error::other(e.to_string())));
        }
    });
    let stream = futures_util::stream::unfold((rx, false), |(mut rx, ended)| async move {
        if ended {
            return None;
        }
        match rx.recv().await {
            Some(Out::Data(frames)) => Some((Ok(frames), (rx, false))),
            Some(Out::Failed(e)) => Some((Err(e), (rx, true))),
            Some(Out::End) => None,
            None => Some((
                Err(io::Error::other("the response producer stopped")),
                (rx, true),
            )),
        }
    })
    .flat_map(|item| {
        let frames: Vec<io::Result<Bytes>> = match item {
            Ok(frames) => frames.into_iter().map(Ok).collect(),
            Err(e) => vec![Err(e)],
        };
        futures_util::stream::iter(frames)
    });
    Body::from_stream(stream)
}

/// Maps an I/O error from a [`std::io::Write`] into a [`ChannelWriter`] to Cairn's error.
pub fn io_err(e: io::Error) -> cairn_core::Error {
    cairn_core::Error::io("streaming the response", e)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads a whole [`BodyReader`] over `frames` (with `Err` items for failures) on a
    /// blocking thread, as the storage calls do, in `buf_len`-byte reads.
    fn read_body(
        frames: Vec<Result<Vec<u8>, &'static str>>,
        buf_len: usize,
    ) -> io::Result<Vec<u8>> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        let stream = futures_util::stream::iter(
            frames
                .into_iter()
                .map(|f| f.map(Bytes::from).map_err(io::Error::other)),
        );
        let mut reader = {
            let _guard = rt.enter();
            BodyReader::new(Body::from_stream(stream))
        };
        std::thread::spawn(move || {
            let mut out = Vec::new();
            let mut buf = vec![0u8; buf_len];
            loop {
                match reader.read(&mut buf)? {
                    0 => return Ok(out),
                    n => out.extend_from_slice(&buf[..n]),
                }
            }
        })
        .join()
        .unwrap()
    }

    #[test]
    fn body_reader_returns_every_byte_in_order_across_batches() {
        // Frames of many sizes, crossing the 256 KiB batch boundary several times.
        let mut frames = Vec::new();
        let mut want = Vec::new();
        for i in 0..400usize {
            let frame: Vec<u8> = (0..(i * 37) % 9000).map(|j| (i + j) as u8).collect();
            want.extend_from_slice(&frame);
            frames.push(Ok(frame));
        }
        for buf_len in [1, 7, 4096, 1 << 20] {
            assert_eq!(
                read_body(frames.clone(), buf_len).unwrap(),
                want,
                "{buf_len}"
            );
        }
        assert_eq!(read_body(Vec::new(), 10).unwrap(), Vec::<u8>::new());
    }

    /// A body sent in 1-byte frames is handed over in batches of few handles (small frames
    /// are copied together), never one handle per frame; large frames are not copied.
    #[test]
    fn tiny_frames_make_batches_of_few_handles() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        let n = 300_000usize;
        let big = Bytes::from(vec![9u8; 64 << 10]);
        let big_ptr = big.as_ptr() as usize;
        let frames = (0..n)
            .map(|i| Ok::<_, io::Error>(Bytes::from(vec![i as u8])))
            .chain(std::iter::once(Ok(big)));
        let mut reader = {
            let _guard = rt.enter();
            BodyReader::new(Body::from_stream(futures_util::stream::iter(frames)))
        };
        let (batches, total, shared) = std::thread::spawn(move || {
            let (mut batches, mut total, mut shared) = (0usize, 0usize, false);
            loop {
                match reader.rx.blocking_recv() {
                    Some(Pumped::Data(frames)) => {
                        assert!(
                            frames.len() <= IN_FRAMES,
                            "a batch of {} handles",
                            frames.len()
                        );
                        batches += 1;
                        total += frames.iter().map(Bytes::len).sum::<usize>();
                        shared |= frames.iter().any(|f| f.as_ptr() as usize == big_ptr);
                    }
                    Some(Pumped::End) => return (batches, total, shared),
                    Some(Pumped::Failed(e)) => panic!("{e}"),
                    None => panic!("the pump stopped"),
                }
            }
        })
        .join()
        .unwrap();
        assert_eq!(total, n + (64 << 10));
        assert!(batches >= 2, "{batches}");
        assert!(shared, "the large frame was copied");
    }

    #[test]
    fn bounded_lines_split_as_split_does_and_stop_at_a_long_line() {
        for text in [
            &b""[..],
            b"a",
            b"a\n",
            b"a\n\nbc\n",
            b"\n",
            b"abcd\nabcd",
            b"x\n\n",
        ] {
            let want: Vec<Vec<u8>> = std::io::BufRead::split(text, b'\n')
                .map(|l| l.unwrap())
                .collect();
            let got: Vec<Vec<u8>> = bounded_lines(text, 4).map(|l| l.unwrap()).collect();
            assert_eq!(got, want, "{text:?}");
        }
        // A line past the bound fails after the lines before it, having read at most one
        // byte past the bound of it.
        let mut src = std::io::Cursor::new(b"ab\nabcdefgh\nz".to_vec());
        let got: Vec<_> = bounded_lines(&mut src, 4).collect();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].as_ref().unwrap(), b"ab");
        let e = got[1].as_ref().unwrap_err();
        assert!(
            matches!(e, cairn_core::Error::InvalidInput(m) if m.contains("longer than")),
            "{e}"
        );
        assert_eq!(src.position(), 3 + 5);
    }

    /// On random inputs, read through buffers of every small size (lines across buffer
    /// boundaries) and with long lines past the charging threshold: the lines are those
    /// `split` gives up to the first one over `max`, which ends the iteration with an
    /// error; `charge` is asked before a line's buffer grows past the threshold, never for
    /// more than twice `max + 1`, and its refusal ends the iteration.
    #[test]
    fn bounded_lines_within_match_split_across_buffers_and_charges() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for case in 0..400 {
            let long = case % 4 == 0;
            let n = (next() % if long { 3 } else { 40 }) as usize;
            let mut text = Vec::new();
            for _ in 0..n {
                let len = if long {
                    (next() % (3 << 20)) as usize
                } else {
                    (next() % 9) as usize
                };
                text.extend(std::iter::repeat_n(b'a' + (next() % 3) as u8, len));
                if next() % 5 != 0 {
                    text.push(b'\n');
                }
            }
            let max = if long {
                2 << 20
            } else {
                1 + (next() % 8) as usize
            };
            let cap = 1 + (next() % 64) as usize;
            let mut want: Vec<Vec<u8>> = Vec::new();
            let mut too_long = false;
            for l in std::io::BufRead::split(&text[..], b'\n') {
                let l = l.unwrap();
                if l.len() > max {
                    too_long = true;
                    break;
                }
                want.push(l);
            }
            let mut asked = 0usize;
            let reader = std::io::BufReader::with_capacity(cap, &text[..]);
            let mut got = Vec::new();
            let mut failed = false;
            for l in bounded_lines_within(reader, max, |bytes| {
                assert!(bytes <= 2 * (max + 1), "charged {bytes} for max {max}");
                asked = asked.max(bytes);
                Ok(())
            }) {
                match l {
                    Ok(l) => got.push(l),
                    Err(_) => {
                        failed = true;
                        break;
                    }
                }
            }
            assert_eq!(got, want, "case {case}");
            assert_eq!(failed, too_long, "case {case}");
            let longest = want.iter().map(Vec::len).max().unwrap_or(0);
            if longest > LINE_CHARGE_FROM {
                assert!(
                    asked >= longest,
                    "case {case}: a {longest}-byte line charged {asked}"
                );
            }
        }
        // A refused charge ends the lines with its error.
        let mut text = vec![b'x'; LINE_CHARGE_FROM + 10];
        text.push(b'\n');
        let mut it = bounded_lines_within(&text[..], 4 << 20, |_| {
            Err(cairn_core::Error::Unavailable("no room".into()))
        });
        assert!(matches!(
            it.next(),
            Some(Err(cairn_core::Error::Unavailable(_)))
        ));
        assert!(it.next().is_none());
    }

    #[test]
    fn element_counts_bound_the_parse() {
        assert_eq!(text_elements(b""), 1);
        assert_eq!(text_elements(b"a\nb\n"), 3);
        assert_eq!(json_elements(br#""a,b:[c{""#), 1);
        assert_eq!(json_elements(br#"["a","b\",[",{"k":"v"}]"#), 6);
        assert_eq!(json_elements(br#"[["k","v"],["k2","v2"]]"#), 7);
        assert!(check_elements(MAX_BUFFERED_ELEMENTS).is_ok());
        let e = check_elements(MAX_BUFFERED_ELEMENTS + 1).unwrap_err();
        assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
        assert!(e.message.contains("too many elements"), "{}", e.message);
        // The typed parse refuses both ways, with the caller's words first.
        let v: Vec<u32> = parse_bounded_json(b"[1,2]", "list").unwrap();
        assert_eq!(v, [1, 2]);
        let e = parse_bounded_json::<Vec<u32>>(b"[1,", "list").unwrap_err();
        assert!(e.message.starts_with("list: "), "{}", e.message);
        let many = format!("[{}0]", "0,".repeat(MAX_BUFFERED_ELEMENTS));
        let e = parse_bounded_json::<Vec<u32>>(many.as_bytes(), "list").unwrap_err();
        assert!(e.message.contains("too many elements"), "{}", e.message);
    }

    #[test]
    fn a_failed_body_reads_as_an_error_never_as_a_clean_end() {
        let frames = vec![
            Ok(vec![1u8; 1000]),
            Err("connection reset"),
            Ok(vec![2u8; 10]),
        ];
        let err = read_body(frames, 64).unwrap_err();
        assert!(err.to_string().contains("connection reset"), "{err}");
    }
}

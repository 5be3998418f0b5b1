//! A blocking, pipelined request/response protocol over TCP.
//!
//! **Wire.** Each side first sends [`PREAMBLE`] (`CRPC` and [`PROTOCOL_VERSION`]); the
//! server closes a connection whose preamble differs and the client refuses a server whose
//! preamble differs. Then the client sends requests and the server answers, each as one
//! frame ([`crate::frame`]). Responses come back in request order, so a client may send
//! many requests before reading (pipelining) and match answers by position.
//!
//! **Server.** [`serve`] binds, then runs an accept thread and one thread per connection.
//! A connection thread reads a request, calls the handler, buffers the response, and
//! flushes only when no further request is already buffered, so a pipelined burst is
//! answered with few writes. Sockets use `TCP_NODELAY`. A request over the frame limit,
//! a torn frame, a request or response that misses its deadline (a timeout plus a second
//! per 64 KiB by default) closes that connection only. Request buffers grow as bytes
//! arrive, within one server-wide memory budget ([`ServerConfig::max_request_memory`],
//! 1 GiB by default, besides 64 KiB a connection may keep between requests), which
//! responses waiting to be written count against too: past it, arriving requests and
//! answers wait for memory (at most 10 s) instead of growing it. A handler that knows an
//! answer will be large reserves its memory before building it ([`serve_reserving`]);
//! other answers are charged once built.
//! [`ServerHandle::shutdown`] (or dropping the handle) stops accepting, lets each
//! connection finish the requests it already received, and joins every thread.
//!
//! **Client.** [`Client::call`] sends one request and waits for its response;
//! [`Client::send`] / [`Client::recv`] pipeline; [`Client::call_batch`] pipelines a slice
//! safely. With bare `send`/`recv`, keep the unanswered requests within what the kernel's
//! socket buffers hold (a few hundred KiB of requests is always safe): a client that
//! writes an unbounded stream without reading can fill both directions and stall, as with
//! any pipelined TCP protocol. `call_batch` writes from a second thread when its requests
//! are large, so it never stalls; [`Client::call_batch_each`] does the same and hands each
//! response to the caller as it arrives.

use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use cairn_core::{Error, Result};

use crate::frame::{DEFAULT_MAX_FRAME, read_frame, write_frame};

/// Version of this RPC framing.
pub const PROTOCOL_VERSION: u8 = 1;
/// What each side sends first: `CRPC` and [`PROTOCOL_VERSION`].
pub const PREAMBLE: [u8; 5] = [b'C', b'R', b'P', b'C', PROTOCOL_VERSION];
/// Socket buffer size of the reader and writer on each side.
const IO_BUF: usize = 64 << 10;
/// A batch whose requests are larger than this is written from a second thread.
const BATCH_INLINE_BYTES: usize = 64 << 10;

/// Server settings.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Largest request payload accepted; a larger one closes the connection.
    pub max_frame: usize,
    /// Most open connections; further ones are closed on accept.
    pub max_connections: usize,
    /// Most open connections from one IP address other than loopback (where a local proxy
    /// or benchmark speaks for many clients), an IPv6 address counted by its /64 (and a
    /// /48 at most [`SITE_CONNECTIONS_FACTOR`] times this many); further ones are closed
    /// on accept, so one remote host cannot take every slot (64 by default:
    /// with 512, eight hosts held all 4,096). Each connection also holds a thread and
    /// 128 KiB of buffers the request budget does not count.
    pub max_connections_per_ip: usize,
    /// Whether `max_connections_per_ip` counts loopback peers too (off by default).
    pub limit_loopback: bool,
    /// How long writing a response may take, plus one second per
    /// [`ServerConfig::min_request_rate`] bytes it holds: a client that stops reading, or
    /// reads too slowly, is dropped (and cannot hold up a shutdown for longer). Also the
    /// grace after which a response must keep up that rate: a client falling behind it
    /// (taking a little now and then) is dropped then, not at the end of the allowance.
    pub write_timeout: Option<Duration>,
    /// How long a new connection may take to send its preamble.
    pub handshake_timeout: Option<Duration>,
    /// How long any one read of a connection may wait after the preamble (between
    /// requests, or inside one): idle or stalled peers are dropped, so they cannot hold
    /// every connection slot.
    pub idle_timeout: Option<Duration>,
    /// How long a request may take to arrive once its first byte has, plus one second per
    /// [`ServerConfig::min_request_rate`] bytes it announces: a peer that trickles a
    /// request (a byte just inside every idle timeout) is dropped when it runs out, so it
    /// cannot hold a slot for long. Also the longest silence between a request's bytes, so
    /// a peer that stalls midway gives back the memory it holds.
    pub request_timeout: Option<Duration>,
    /// Bytes a second a request must at least arrive at (see `request_timeout`), and a
    /// response be taken at (see `write_timeout`).
    pub min_request_rate: u64,
    /// Most memory all connections together hold for request payloads (those arriving,
    /// being handled, and the buffers connections keep between requests) and for
    /// responses until they are written. A request's buffer grows only as its bytes
    /// arrive, and only while the server is under this budget: past it, arriving requests
    /// and answers wait for memory (within their deadline and at most 10 s, else their
    /// connection is closed). Raised to `max_frame` if lower.
    pub max_request_memory: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_frame: DEFAULT_MAX_FRAME,
            max_connections: 4096,
            max_connections_per_ip: 64,
            limit_loopback: false,
            write_timeout: Some(Duration::from_secs(60)),
            handshake_timeout: Some(Duration::from_secs(10)),
            idle_timeout: Some(Duration::from_secs(300)),
            request_timeout: Some(Duration::from_secs(30)),
            min_request_rate: 64 << 10,
            max_request_memory: 1 << 30,
        }
    }
}

/// The address a peer's connections are counted under: an IPv4-mapped IPv6 address, or
/// one of the NAT64 prefix `64:ff9b::/96`, as the IPv4 one (so a local proxy on a
/// dual-stack listener is loopback); a 6to4 address (`2002::/16`) as the IPv4 address it
/// embeds (every IPv4 host has a /48 of them); a global unicast IPv6 address by its /64,
/// which one host commonly holds whole; any other address as itself (a LAN's link-local
/// or unique-local hosts are many hosts).
pub fn peer_group(ip: std::net::IpAddr) -> std::net::IpAddr {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let mut seg = v6.segments();
            if seg[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                let [a, b] = seg[6].to_be_bytes();
                let [c, d] = seg[7].to_be_bytes();
                return IpAddr::V4(Ipv4Addr::new(a, b, c, d));
            }
            if seg[0] == 0x2002 {
                let [a, b] = seg[1].to_be_bytes();
                let [c, d] = seg[2].to_be_bytes();
                return IpAddr::V4(Ipv4Addr::new(a, b, c, d));
            }
            if seg[0] & 0xe000 != 0x2000 {
                return IpAddr::V6(v6);
            }
            seg[4..].fill(0);
            IpAddr::V6(Ipv6Addr::from(seg))
        }
        v4 => v4,
    }
}

/// The site a peer group ([`peer_group`]) belongs to, for a second, coarser count: a
/// global unicast IPv6 group by its /48 (a site is commonly delegated a /56 or /48, so
/// one host could otherwise open [`ServerConfig::max_connections_per_ip`] connections
/// from each of hundreds of /64s); `None` for any other group, counted on its own.
pub fn peer_site(group: std::net::IpAddr) -> Option<std::net::IpAddr> {
    use std::net::{IpAddr, Ipv6Addr};
    match group {
        IpAddr::V6(v6) if v6.segments()[0] & 0xe000 == 0x2000 => {
            let mut seg = v6.segments();
            seg[3..].fill(0);
            Some(IpAddr::V6(Ipv6Addr::from(seg)))
        }
        _ => None,
    }
}

/// How many times [`ServerConfig::max_connections_per_ip`] one IPv6 site ([`peer_site`])
/// may open.
pub const SITE_CONNECTIONS_FACTOR: usize = 4;

/// The time left until `deadline`, in whole seconds rounded up, so a socket's timeout
/// changes at most once a second while a transfer goes on (an I/O call may end up to a
/// second past the deadline, and the next one is refused); a `TimedOut` error saying
/// `what` once it has passed.
fn time_left(deadline: std::time::Instant, what: &'static str) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(std::time::Instant::now());
    if left.is_zero() {
        return Err(io::Error::new(io::ErrorKind::TimedOut, what));
    }
    Ok(Duration::from_secs(left.as_secs() + 1))
}

/// A connection's reader that cuts a request taking longer than its deadline: the
/// deadline starts with the request's first byte ([`RequestReader::start`] sets it off,
/// [`RequestReader::extend`] adds time for the announced length), and every read waits at
/// most until it (or the idle timeout, whichever is sooner).
struct RequestReader<'a> {
    inner: BufReader<TcpStream>,
    stream: &'a TcpStream,
    idle: Option<Duration>,
    timeout: Option<Duration>,
    min_rate: u64,
    started: Option<std::time::Instant>,
    deadline: Option<std::time::Instant>,
    /// The read timeout the socket has now (set again only when it changes: a pipelined
    /// burst refills the buffer often).
    set: Option<Option<Duration>>,
}

impl RequestReader<'_> {
    /// Waits for the next request (the idle timeout applies).
    fn start(&mut self) {
        self.started = None;
        self.deadline = None;
    }

    /// The request announced `len` payload bytes: it may take that much longer.
    fn extend(&mut self, len: u64) {
        if let (Some(t0), Some(timeout)) = (self.started, self.timeout) {
            let extra = Duration::from_secs(len / self.min_rate.max(1));
            self.deadline = Some(t0 + timeout + extra);
        }
    }
}

impl Read for RequestReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.inner.buffer().is_empty() {
            let wait = match self.deadline {
                // Within a request, at most the request timeout between bytes (not the
                // idle timeout): a peer that sent most of a large frame fast and then
                // stops gives back the memory it holds after that, not at the end of
                // the time its length allows.
                Some(d) => {
                    let left = time_left(d, "the request did not arrive in time")?;
                    let gap = self.timeout.or(self.idle);
                    Some(gap.map_or(left, |g| g.min(left)))
                }
                None => self.idle,
            };
            if self.set != Some(wait) {
                self.stream.set_read_timeout(wait)?;
                self.set = Some(wait);
            }
        }
        let n = self.inner.read(buf)?;
        if n > 0 && self.started.is_none() {
            let now = std::time::Instant::now();
            self.started = Some(now);
            self.deadline = self.timeout.map(|t| now + t);
        }
        Ok(n)
    }
}

/// The server's memory budget for request payloads (see
/// [`ServerConfig::max_request_memory`]).
struct Budget {
    left: std::sync::Mutex<u64>,
    freed: std::sync::Condvar,
    /// The whole budget.
    total: u64,
}

impl Budget {
    fn new(bytes: u64) -> Self {
        Budget {
            total: bytes,
            left: std::sync::Mutex::new(bytes),
            freed: std::sync::Condvar::new(),
        }
    }

    fn left(&self) -> std::sync::MutexGuard<'_, u64> {
        self.left
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes `n` bytes, waiting for them until `deadline` (or the server stops).
    fn take(&self, n: u64, deadline: Option<std::time::Instant>, stop: &AtomicBool) -> bool {
        let mut left = self.left();
        loop {
            if *left >= n {
                *left -= n;
                return true;
            }
            if stop.load(Ordering::SeqCst) {
                return false;
            }
            // Waits in slices, so that a stopping server is noticed.
            let mut wait = Duration::from_millis(100);
            if let Some(d) = deadline {
                let rest = d.saturating_duration_since(std::time::Instant::now());
                if rest.is_zero() {
                    return false;
                }
                wait = wait.min(rest);
            }
            left = self
                .freed
                .wait_timeout(left, wait)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }

    fn give(&self, n: u64) {
        if n > 0 {
            *self.left() += n;
            self.freed.notify_all();
        }
    }
}

/// Bytes of a request buffer each connection holds outside the [`Budget`] (so a buffer
/// kept between requests, at most this large, holds none of it while the connection is
/// idle): 4096 connections hold at most 256 MiB this way.
const UNCHARGED: usize = 64 << 10;

/// Longest a request waits for memory from the [`Budget`] (within its own deadline): a
/// request that cannot get it in this time is cut (its connection closed, its memory
/// given back), so requests each holding part of what they need cannot wait on each other
/// for long.
const BUDGET_WAIT: Duration = Duration::from_secs(10);

/// The part of the [`Budget`] one connection holds: its request buffer's capacity past
/// [`UNCHARGED`]. Given back when dropped.
struct Charge<'a> {
    budget: &'a Budget,
    stop: &'a AtomicBool,
    held: u64,
}

impl Charge<'_> {
    /// Covers a buffer of `bytes`, waiting for memory until `deadline` (at most
    /// [`BUDGET_WAIT`]).
    fn cover(&mut self, bytes: usize, deadline: Option<std::time::Instant>) -> io::Result<()> {
        // Never more than the whole budget, which no wait could get: a buffer larger than
        // the budget (an answer reserved or built larger) holds all of it.
        let bytes = (bytes.saturating_sub(UNCHARGED) as u64).min(self.budget.total);
        if bytes > self.held {
            let limit = std::time::Instant::now() + BUDGET_WAIT;
            let deadline = Some(deadline.map_or(limit, |d| d.min(limit)));
            if !self.budget.take(bytes - self.held, deadline, self.stop) {
                return Err(io::Error::new(
                    io::ErrorKind::OutOfMemory,
                    "the server's request memory stayed in use while the request waited",
                ));
            }
            self.held = bytes;
        }
        Ok(())
    }

    /// Holds exactly what a buffer of `bytes` needs: gives back any surplus at once (so
    /// memory held for an answer's building is not given up and taken again), waits for
    /// any shortfall as [`Charge::cover`] does.
    fn resize(&mut self, bytes: usize) -> io::Result<()> {
        let want = (bytes.saturating_sub(UNCHARGED) as u64).min(self.budget.total);
        if want < self.held {
            self.budget.give(self.held - want);
            self.held = want;
            return Ok(());
        }
        self.cover(bytes, None)
    }

    /// Gives everything back (the buffer kept is at most [`UNCHARGED`]).
    fn release(&mut self) {
        self.budget.give(self.held);
        self.held = 0;
    }
}

impl Drop for Charge<'_> {
    fn drop(&mut self) {
        self.budget.give(self.held);
    }
}

/// A handler's claim on the server's memory budget for the answer it is building (see
/// [`serve_reserving`]): a handler that knows its answer will be large says so before it
/// reads the data, and waits, as arriving requests do, while the budget is spent.
pub struct Reserve<'a, 'b> {
    charge: &'a mut Charge<'b>,
    /// The request's buffer, which the charge covers while the handler runs.
    request: usize,
    reserved: usize,
}

impl Reserve<'_, '_> {
    /// Takes `bytes` more from the server's budget for this answer (held until the answer
    /// is written, then given back), waiting up to 10 s for them. An error means the
    /// server's memory stayed in use that long: the handler should answer "busy" instead
    /// of building the answer.
    pub fn reserve(&mut self, bytes: usize) -> Result<()> {
        let reserved = self.reserved.saturating_add(bytes);
        let want = self.request.saturating_add(reserved);
        self.charge.cover(want, None).map_err(|_| {
            Error::Unavailable(format!(
                "the server's memory for answers stayed in use while an answer of \
                 {bytes} bytes waited for it; try again"
            ))
        })?;
        self.reserved = reserved;
        Ok(())
    }

    /// Bytes reserved so far.
    pub fn reserved(&self) -> usize {
        self.reserved
    }
}

/// Bytes a request's buffer grows by at most per read while its payload arrives.
const READ_STEP: usize = 256 << 10;

/// A connection's writer that cuts a response taking longer than its deadline (set by
/// [`ResponseWriter::start`] for each response; every write waits at most until it).
struct ResponseWriter {
    stream: TcpStream,
    timeout: Option<Duration>,
    min_rate: u64,
    deadline: Option<std::time::Instant>,
    /// When the response being written started, and how many bytes went since: it must
    /// keep up `min_rate` on average after the write timeout's grace, or a client taking a
    /// few bytes a minute held a large response's memory for its whole allowance.
    since: Option<(std::time::Instant, u64)>,
    /// The length of the response started since the last write, whose deadline the next
    /// write sets (the clock is read once per write to the socket, not once per response
    /// of a pipelined burst).
    started: Option<usize>,
    /// The write timeout the socket has now (set again only when it changes).
    set: Option<Option<Duration>>,
}

impl ResponseWriter {
    /// A response of `len` bytes is about to be written: it (and whatever is buffered
    /// before it) may take the write timeout plus a second per `min_rate` bytes.
    fn start(&mut self, len: usize) {
        self.started = Some(len);
    }
}

impl Write for ResponseWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Some(len) = self.started.take() {
            let now = std::time::Instant::now();
            self.deadline = self
                .timeout
                .map(|t| now + t + Duration::from_secs(len as u64 / self.min_rate.max(1)));
            self.since = Some((now, 0));
        }
        // Each write waits at most the write timeout for the client to take bytes (as
        // each read of a request waits at most the request timeout): a client that stops
        // reading is dropped then, not only at the end of the whole response's allowance,
        // which for a large response held its memory budget for many minutes. Nor may it
        // fall behind the minimum rate past the timeout's grace (taking a little now and
        // then, it held that memory for the whole allowance all the same).
        let wait = match (self.deadline, self.timeout) {
            (Some(d), Some(t)) => {
                let paced = self.since.map_or(d, |(t0, done)| {
                    t0 + t + Duration::from_secs_f64(done as f64 / self.min_rate.max(1) as f64)
                });
                Some(
                    time_left(d.min(paced), "the client did not take the response in time")?.min(t),
                )
            }
            _ => None,
        };
        if self.set != Some(wait) {
            self.stream.set_write_timeout(wait)?;
            self.set = Some(wait);
        }
        let n = self.stream.write(buf)?;
        if let Some((_, done)) = &mut self.since {
            *done += n as u64;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}

/// Shuts a connection's socket when dropped, also when its handler panics (the acceptor
/// holds a clone of the socket, so the peer would otherwise wait on a dead connection).
struct CloseOnDrop(TcpStream);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        let _ = self.0.shutdown(Shutdown::Both);
    }
}

/// Requests larger than this do not keep their buffer after they are answered.
const KEEP_REQUEST_BUF: usize = UNCHARGED;

/// Client settings.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Largest response payload accepted (and largest request sent).
    pub max_frame: usize,
    /// Limit on establishing the connection; `None` waits as long as the OS does.
    pub connect_timeout: Option<Duration>,
    /// Longest silence while reading the server's preamble or a response (each read
    /// waits at most this long for a byte); `None` waits forever. A server that stops
    /// answering breaks the connection with an I/O error after it; in a batch, only once
    /// the requests' upload, which the server reads before it answers, made no progress
    /// for that long.
    pub read_timeout: Option<Duration>,
    /// Longest a write of requests may block on a server that does not read them;
    /// `None` waits forever.
    pub write_timeout: Option<Duration>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            max_frame: DEFAULT_MAX_FRAME,
            connect_timeout: Some(Duration::from_secs(10)),
            read_timeout: Some(Duration::from_secs(60)),
            write_timeout: Some(Duration::from_secs(60)),
        }
    }
}

/// A running server. Dropping it shuts the server down like [`ServerHandle::shutdown`].
pub struct ServerHandle {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

type Handler = dyn Fn(&[u8], &mut Reserve<'_, '_>) -> Vec<u8> + Send + Sync;

/// Binds `addr` and serves requests with `handler` (request payload in, response payload
/// out) until the returned handle is shut down or dropped. A response counts against the
/// server's memory budget once it is built; use [`serve_reserving`] when some answers are
/// large and their size is known before they are built.
pub fn serve<F>(addr: impl ToSocketAddrs, config: ServerConfig, handler: F) -> Result<ServerHandle>
where
    F: Fn(&[u8]) -> Vec<u8> + Send + Sync + 'static,
{
    serve_reserving(addr, config, move |req: &[u8], _: &mut Reserve<'_, '_>| {
        handler(req)
    })
}

/// [`serve`], where the handler may [`Reserve::reserve`] memory from the server's budget
/// before it builds a large answer, so that many such answers built at once wait for
/// memory instead of growing the process past the budget.
pub fn serve_reserving<F>(
    addr: impl ToSocketAddrs,
    config: ServerConfig,
    handler: F,
) -> Result<ServerHandle>
where
    F: Fn(&[u8], &mut Reserve<'_, '_>) -> Vec<u8> + Send + Sync + 'static,
{
    let listener = TcpListener::bind(addr).map_err(|e| Error::io("binding the RPC server", e))?;
    serve_listener_reserving(listener, config, handler)
}

/// Serves requests on an already bound `listener` (see [`serve`]).
pub fn serve_listener<F>(
    listener: TcpListener,
    config: ServerConfig,
    handler: F,
) -> Result<ServerHandle>
where
    F: Fn(&[u8]) -> Vec<u8> + Send + Sync + 'static,
{
    serve_listener_reserving(
        listener,
        config,
        move |req: &[u8], _: &mut Reserve<'_, '_>| handler(req),
    )
}

/// Serves requests on an already bound `listener` (see [`serve_reserving`]).
pub fn serve_listener_reserving<F>(
    listener: TcpListener,
    config: ServerConfig,
    handler: F,
) -> Result<ServerHandle>
where
    F: Fn(&[u8], &mut Reserve<'_, '_>) -> Vec<u8> + Send + Sync + 'static,
{
    let mut addr = listener
        .local_addr()
        .map_err(|e| Error::io("reading the RPC server's address", e))?;
    if addr.ip().is_unspecified() {
        // Bound to every interface: reach it (to wake the acceptor) over loopback.
        addr.set_ip(match addr {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    let stop = Arc::new(AtomicBool::new(false));
    let handler: Arc<Handler> = Arc::new(handler);
    let acceptor = {
        let stop = stop.clone();
        std::thread::Builder::new()
            .name("cairn-net-accept".into())
            .spawn(move || accept_loop(listener, config, handler, stop))
            .map_err(|e| Error::io("starting the RPC accept thread", e))?
    };
    Ok(ServerHandle {
        addr,
        stop,
        acceptor: Some(acceptor),
    })
}

impl ServerHandle {
    /// The address clients connect to (loopback when bound to every interface).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, closes the read side of every connection (each finishes the
    /// requests it already received and flushes their responses), and joins every thread.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        let Some(acceptor) = self.acceptor.take() else {
            return;
        };
        self.stop.store(true, Ordering::SeqCst);
        // Wake the acceptor out of accept(). If this connect fails the listener is gone
        // already, and the acceptor has failed out of its loop.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(5));
        let _ = acceptor.join();
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

impl std::fmt::Debug for ServerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerHandle")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

struct Conn {
    stream: TcpStream,
    thread: JoinHandle<()>,
    /// The peer's address (`None` if the socket could not say).
    ip: Option<std::net::IpAddr>,
}

fn accept_loop(
    listener: TcpListener,
    config: ServerConfig,
    handler: Arc<Handler>,
    stop: Arc<AtomicBool>,
) {
    let mut conns: Vec<Conn> = Vec::new();
    let budget = Arc::new(Budget::new(
        config.max_request_memory.max(config.max_frame as u64),
    ));
    loop {
        let accepted = listener.accept();
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                // Out of descriptors and the like: back off instead of spinning.
                if e.kind() != io::ErrorKind::Interrupted {
                    std::thread::sleep(Duration::from_millis(10));
                }
                continue;
            }
        };
        // Reap finished connections.
        let (done, live): (Vec<Conn>, Vec<Conn>) =
            conns.into_iter().partition(|c| c.thread.is_finished());
        conns = live;
        for c in done {
            let _ = c.thread.join();
        }
        if conns.len() >= config.max_connections {
            continue;
        }
        // Loopback is judged on the address itself: a NAT64 or 6to4 address embedding
        // 127.0.0.1 is a remote peer, not a local proxy.
        let ip = stream
            .peer_addr()
            .ok()
            .filter(|a| config.limit_loopback || !a.ip().to_canonical().is_loopback())
            .map(|a| peer_group(a.ip()));
        if ip.is_some()
            && conns.iter().filter(|c| c.ip == ip).count() >= config.max_connections_per_ip
        {
            continue;
        }
        let site = ip.and_then(peer_site);
        if site.is_some()
            && conns
                .iter()
                .filter(|c| c.ip.and_then(peer_site) == site)
                .count()
                >= config
                    .max_connections_per_ip
                    .saturating_mul(SITE_CONNECTIONS_FACTOR)
        {
            continue;
        }
        let Ok(clone) = stream.try_clone() else {
            continue;
        };
        let handler = handler.clone();
        let config = config.clone();
        let budget = budget.clone();
        let stop = stop.clone();
        let spawned = std::thread::Builder::new()
            .name("cairn-net-conn".into())
            .spawn(move || {
                // The acceptor holds a clone of this socket: close it explicitly (also
                // when the handler panics) so the peer sees the end now, not when the
                // clone is reaped.
                let stream = CloseOnDrop(stream);
                let charge = Charge {
                    budget: &budget,
                    stop: &stop,
                    held: 0,
                };
                let _ = serve_connection(&stream.0, &config, &*handler, charge);
            });
        if let Ok(thread) = spawned {
            conns.push(Conn {
                stream: clone,
                thread,
                ip,
            });
        }
    }
    for c in &conns {
        let _ = c.stream.shutdown(Shutdown::Read);
    }
    for c in conns {
        let _ = c.thread.join();
    }
}

fn serve_connection(
    stream: &TcpStream,
    config: &ServerConfig,
    handler: &Handler,
    mut charge: Charge<'_>,
) -> io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_write_timeout(config.write_timeout)?;
    stream.set_read_timeout(config.handshake_timeout)?;
    let mut reader = BufReader::with_capacity(IO_BUF, stream.try_clone()?);
    let mut writer = BufWriter::with_capacity(
        IO_BUF,
        ResponseWriter {
            stream: stream.try_clone()?,
            timeout: config.write_timeout,
            min_rate: config.min_request_rate,
            deadline: None,
            since: None,
            started: None,
            set: Some(config.write_timeout),
        },
    );
    let mut pre = [0u8; PREAMBLE.len()];
    reader.read_exact(&mut pre)?;
    if pre != PREAMBLE {
        return Ok(());
    }
    writer.get_mut().start(PREAMBLE.len());
    writer.write_all(&PREAMBLE)?;
    writer.flush()?;
    stream.set_read_timeout(config.idle_timeout)?;
    let mut reader = RequestReader {
        inner: reader,
        stream,
        idle: config.idle_timeout,
        timeout: config.request_timeout,
        min_rate: config.min_request_rate,
        started: None,
        deadline: None,
        set: Some(config.idle_timeout),
    };
    let mut request = Vec::new();
    // Whether the connection ends with part of a request read (and maybe more on the way).
    let mut unread = false;
    loop {
        // Answers go out before a read that may wait: with only part of the next request
        // buffered (a pipelined upload), they waited for all of it, and a client timing
        // out on silence gave up during a long batch.
        let whole = whole_frame_buffered(reader.inner.buffer());
        if !whole {
            writer.flush()?;
        }
        // A stopping server answers the requests it has whole, and no more: a client
        // keeping its pipeline full kept the connection, and the shutdown, going.
        if !whole && charge.stop.load(Ordering::SeqCst) {
            unread = !reader.inner.buffer().is_empty();
            break;
        }
        reader.start();
        match read_request(&mut reader, config.max_frame, &mut request, &mut charge) {
            Ok(true) => {}
            Ok(false) => break,
            Err(_) => {
                // Cut in the middle of a request (by the peer, a timeout, or a stop).
                unread = true;
                break;
            }
        }
        let response = handler(
            &request,
            &mut Reserve {
                charge: &mut charge,
                request: request.capacity(),
                reserved: 0,
            },
        );
        if request.capacity() > KEEP_REQUEST_BUF {
            request = Vec::new();
        }
        // A response is held until it is written, as long as its reader takes: it counts
        // against the same budget (what the handler reserved for it is kept, the rest of
        // the request's share given back), or peers that send small requests and never
        // read would pin a large response each.
        if charge.resize(response.len()).is_err() {
            break;
        }
        writer.get_mut().start(response.len());
        let written = write_frame(&mut writer, &response, u32::MAX as usize);
        drop(response);
        charge.release();
        if written.is_err() {
            break;
        }
    }
    writer.flush()?;
    if charge.stop.load(Ordering::SeqCst) {
        // Closed with unread requests, the socket would be reset and the answers still
        // queued for the client dropped: take what the client still sends while they
        // drain (at most STOP_DRAIN), until the client has taken every answer and sent
        // nothing for a moment. (The read side is shut, so a read finds nothing rather than
        // waiting while nothing has arrived: look again. The write side stays open: with
        // both shut, Linux resets a connection that receives more data.)
        let until = std::time::Instant::now() + STOP_DRAIN;
        let mut quiet_since = if unread {
            None
        } else {
            Some(std::time::Instant::now())
        };
        let mut sink = [0u8; 1 << 14];
        while let Some(left) = until
            .checked_duration_since(std::time::Instant::now())
            .filter(|l| !l.is_zero())
        {
            let _ = stream.set_read_timeout(Some(left));
            match reader.inner.read(&mut sink) {
                Ok(n) if n > 0 => quiet_since = None,
                Ok(_) => {
                    let now = std::time::Instant::now();
                    let quiet = *quiet_since.get_or_insert(now);
                    if unsent_bytes(stream) == Some(0) && now - quiet >= STOP_QUIET {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(10).min(left));
                }
                Err(_) => break,
            }
        }
    }
    Ok(())
}

/// How long a stopping server's connection must find nothing more from its client, with
/// every answer taken, before it closes.
const STOP_QUIET: Duration = Duration::from_millis(50);

/// Bytes written to `stream` that its peer has not acknowledged yet (Linux's
/// `SIOCOUTQ`); `None` where that cannot be asked (the drain then runs its full time).
fn unsent_bytes(stream: &TcpStream) -> Option<usize> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let mut n: libc::c_int = 0;
        // SAFETY: the descriptor is open for the call, and `n` is an int the ioctl fills.
        let r = unsafe { libc::ioctl(stream.as_raw_fd(), libc::TIOCOUTQ, &mut n) };
        (r == 0).then(|| usize::try_from(n).unwrap_or(0))
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = stream;
        None
    }
}

/// How long a stopping server's connection takes what its client still sends, after its
/// last answer, so that the answers are not dropped with a reset.
const STOP_DRAIN: Duration = Duration::from_secs(1);

/// Whether `buf` starts with a whole frame (header and payload).
fn whole_frame_buffered(buf: &[u8]) -> bool {
    match buf.first_chunk::<4>() {
        Some(h) => buf.len() - 4 >= u32::from_be_bytes(*h) as usize,
        None => false,
    }
}

/// Reads one request frame through `r`, giving it time for the length it announces and
/// growing `buf` only as its bytes arrive, within the memory `charge` can get.
fn read_request(
    r: &mut RequestReader<'_>,
    max: usize,
    buf: &mut Vec<u8>,
    charge: &mut Charge<'_>,
) -> Result<bool> {
    buf.clear();
    let mut header = [0u8; 4];
    let mut got = 0;
    while got < header.len() {
        match r.read(&mut header[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => {
                return Err(Error::io(
                    "reading a frame header",
                    io::Error::from(io::ErrorKind::UnexpectedEof),
                ));
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::io("reading a frame header", e)),
        }
    }
    let announced = u64::from(u32::from_be_bytes(header));
    if announced > max as u64 {
        return Err(Error::decode(format!(
            "frame too large: {announced} bytes (limit {max})"
        )));
    }
    r.extend(announced);
    let len = announced as usize;
    while buf.len() < len {
        let start = buf.len();
        let want = (len - start).min(READ_STEP);
        if buf.capacity() < start + want {
            // Geometric growth (no quadratic copying), never past the announced length.
            let cap = (start + want)
                .max(buf.capacity().saturating_mul(2))
                .min(len);
            charge
                .cover(cap, r.deadline)
                .map_err(|e| Error::io("reading a frame payload", e))?;
            buf.reserve_exact(cap - start);
        }
        // Reads into the capacity just covered (without zeroing it first).
        let n = (&mut *r)
            .take(want as u64)
            .read_to_end(buf)
            .map_err(|e| Error::io("reading a frame payload", e))?;
        if n < want {
            return Err(Error::io(
                "reading a frame payload",
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "peer closed the connection after {} of {len} payload bytes",
                        start + n
                    ),
                ),
            ));
        }
    }
    Ok(true)
}

/// A connection to an RPC server.
pub struct Client {
    reader: BufReader<TcpStream>,
    writer: BufWriter<TcpStream>,
    max_frame: usize,
    in_flight: usize,
    broken: Option<String>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("peer", &self.reader.get_ref().peer_addr().ok())
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Connects to `addr` with default settings.
    pub fn connect(addr: impl ToSocketAddrs) -> Result<Self> {
        Self::connect_with(addr, ClientConfig::default())
    }

    /// Connects to `addr` (trying each address it resolves to) and exchanges preambles.
    pub fn connect_with(addr: impl ToSocketAddrs, config: ClientConfig) -> Result<Self> {
        let addrs: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|e| Error::io("resolving the RPC server address", e))?
            .collect();
        let mut last = io::Error::new(io::ErrorKind::InvalidInput, "no address to connect to");
        let mut stream = None;
        for a in &addrs {
            let s = match config.connect_timeout {
                Some(t) => TcpStream::connect_timeout(a, t),
                None => TcpStream::connect(a),
            };
            match s {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = e,
            }
        }
        let stream = stream.ok_or_else(|| Error::io("connecting to the RPC server", last))?;
        let ctx = |e| Error::io("setting up the RPC connection", e);
        stream.set_nodelay(true).map_err(ctx)?;
        stream.set_read_timeout(config.read_timeout).map_err(ctx)?;
        stream
            .set_write_timeout(config.write_timeout)
            .map_err(ctx)?;
        let reader = BufReader::with_capacity(IO_BUF, stream.try_clone().map_err(ctx)?);
        let mut writer = BufWriter::with_capacity(IO_BUF, stream);
        writer
            .write_all(&PREAMBLE)
            .and_then(|()| writer.flush())
            .map_err(|e| Error::io("sending the RPC preamble", e))?;
        let mut client = Client {
            reader,
            writer,
            max_frame: config.max_frame,
            in_flight: 0,
            broken: None,
        };
        let mut pre = [0u8; PREAMBLE.len()];
        client.reader.read_exact(&mut pre).map_err(|e| {
            Error::io(
                "reading the RPC server's preamble (is it a Cairn RPC server?)",
                e,
            )
        })?;
        if pre != PREAMBLE {
            return Err(Error::Unavailable(format!(
                "the peer is not a Cairn RPC server of protocol version {PROTOCOL_VERSION} (it sent {pre:02x?})"
            )));
        }
        Ok(client)
    }

    /// Requests sent whose responses have not been read yet.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    fn check(&self) -> Result<()> {
        match &self.broken {
            Some(why) => Err(Error::Unavailable(format!(
                "RPC connection unusable after an earlier error: {why}"
            ))),
            None => Ok(()),
        }
    }

    fn fail<T>(&mut self, e: Error) -> Result<T> {
        self.broken = Some(e.to_string());
        Err(e)
    }

    /// Queues one request (buffered; [`Client::flush`] or [`Client::recv`] sends it). A
    /// request over the frame limit is refused and nothing is queued.
    pub fn send(&mut self, request: &[u8]) -> Result<()> {
        self.check()?;
        if request.len() > self.max_frame {
            return Err(Error::invalid(format!(
                "request too large: {} bytes (frame limit {})",
                request.len(),
                self.max_frame
            )));
        }
        match write_frame(&mut self.writer, request, self.max_frame) {
            Ok(()) => {
                self.in_flight += 1;
                Ok(())
            }
            Err(e) => self.fail(e),
        }
    }

    /// Sends everything queued.
    pub fn flush(&mut self) -> Result<()> {
        self.check()?;
        match self.writer.flush() {
            Ok(()) => Ok(()),
            Err(e) => self.fail(Error::io("sending RPC requests", e)),
        }
    }

    /// Reads the response to the oldest unanswered request into `buf` (flushing queued
    /// requests first).
    pub fn recv_into(&mut self, buf: &mut Vec<u8>) -> Result<()> {
        self.check()?;
        if self.in_flight == 0 {
            return Err(Error::invalid("recv with no request in flight"));
        }
        self.flush()?;
        match read_frame(&mut self.reader, self.max_frame, buf) {
            Ok(true) => {
                self.in_flight -= 1;
                Ok(())
            }
            Ok(false) => self.fail(Error::io(
                "waiting for an RPC response",
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "server closed the connection with {} requests unanswered",
                        self.in_flight
                    ),
                ),
            )),
            Err(e) => self.fail(e),
        }
    }

    /// Reads the response to the oldest unanswered request.
    pub fn recv(&mut self) -> Result<Vec<u8>> {
        let mut buf = Vec::new();
        self.recv_into(&mut buf)?;
        Ok(buf)
    }

    /// Sends one request and returns its response (earlier unanswered requests must be
    /// received first).
    pub fn call(&mut self, request: &[u8]) -> Result<Vec<u8>> {
        self.check()?;
        if self.in_flight != 0 {
            return Err(Error::invalid(format!(
                "call with {} pipelined responses unread",
                self.in_flight
            )));
        }
        self.send(request)?;
        self.recv()
    }

    /// Sends all `requests` pipelined and returns their responses in order.
    pub fn call_batch<R: AsRef<[u8]> + Sync>(&mut self, requests: &[R]) -> Result<Vec<Vec<u8>>> {
        let mut out = Vec::with_capacity(requests.len());
        self.call_batch_each(requests, |_, r| {
            out.push(r.to_vec());
            Ok(())
        })?;
        Ok(out)
    }

    /// Sends all `requests` pipelined and hands each response to `each` (with its
    /// request's index) as soon as it arrives, in order, so the caller's work on early
    /// responses overlaps the server's work on later ones. If `each` fails (or panics),
    /// the remaining responses are still read and dropped, so the connection stays in
    /// step and usable; then `each`'s panic is resumed, or its first error returned. A
    /// transport error ends the batch and breaks the connection; it is returned instead
    /// of `each`'s error (a panic is still resumed).
    pub fn call_batch_each<R: AsRef<[u8]> + Sync>(
        &mut self,
        requests: &[R],
        mut each: impl FnMut(usize, &[u8]) -> Result<()>,
    ) -> Result<()> {
        self.check()?;
        if self.in_flight != 0 {
            return Err(Error::invalid(format!(
                "call_batch with {} pipelined responses unread",
                self.in_flight
            )));
        }
        if let Some(r) = requests.iter().find(|r| r.as_ref().len() > self.max_frame) {
            return Err(Error::invalid(format!(
                "request too large: {} bytes (frame limit {})",
                r.as_ref().len(),
                self.max_frame
            )));
        }
        // The first error `each` returns, or its panic; later responses are drained
        // without it.
        let mut failed: Option<Error> = None;
        let mut panicked: Option<Box<dyn std::any::Any + Send>> = None;
        let mut deliver = |i: usize, buf: &[u8]| {
            if failed.is_some() || panicked.is_some() {
                return;
            }
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| each(i, buf))) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => failed = Some(e),
                Err(p) => panicked = Some(p),
            }
        };
        let total: usize = requests.iter().map(|r| r.as_ref().len() + 4).sum();
        if total <= BATCH_INLINE_BYTES {
            for r in requests {
                self.send(r.as_ref())?;
            }
            let mut buf = Vec::new();
            let mut broke = None;
            for i in 0..requests.len() {
                if let Err(e) = self.recv_into(&mut buf) {
                    broke = Some(e);
                    break;
                }
                deliver(i, &buf);
            }
            // A panic of `each` is resumed even when the connection then broke.
            if let Some(p) = panicked {
                std::panic::resume_unwind(p);
            }
            return match broke {
                Some(e) => Err(e),
                None => failed.map_or(Ok(()), Err),
            };
        }
        // Large: write from a second thread while this one reads, so neither direction's
        // buffers can fill up and stall the other.
        let max = self.max_frame;
        let n = requests.len();
        let (writer, reader) = (&mut self.writer, &mut self.reader);
        // How far the upload got: while it goes on, the server may be reading a large
        // request before it answers, so silence is not a timeout.
        let progress = AtomicU64::new(0);
        let ended = AtomicBool::new(false);
        let (sent, received) = std::thread::scope(|s| {
            let (progress, ended) = (&progress, &ended);
            let w = s.spawn(move || -> Result<()> {
                let mut counted = Counted {
                    inner: &mut *writer,
                    count: progress,
                };
                let res = requests
                    .iter()
                    .try_for_each(|r| write_frame(&mut counted, r.as_ref(), max))
                    .and_then(|()| {
                        writer
                            .flush()
                            .map_err(|e| Error::io("sending RPC requests", e))
                    });
                ended.store(true, Ordering::SeqCst);
                if res.is_err() {
                    // Unblock the reader: no more responses will come.
                    let _ = writer.get_ref().shutdown(Shutdown::Both);
                }
                res
            });
            let mut res = Ok(());
            let mut buf = Vec::new();
            for i in 0..n {
                if let Err(e) = wait_while_uploading(reader, progress, ended) {
                    res = Err(Error::io("waiting for an RPC response", e));
                    break;
                }
                match read_frame(reader, max, &mut buf) {
                    Ok(true) => deliver(i, &buf),
                    Ok(false) => {
                        res = Err(Error::io(
                            "waiting for an RPC response",
                            io::Error::new(
                                io::ErrorKind::UnexpectedEof,
                                "server closed the connection mid-batch",
                            ),
                        ));
                        break;
                    }
                    Err(e) => {
                        res = Err(e);
                        break;
                    }
                }
            }
            if res.is_err() {
                // Unblock the writer if the server stopped reading.
                let _ = reader.get_ref().shutdown(Shutdown::Both);
            }
            let sent = w
                .join()
                .unwrap_or_else(|_| Err(Error::Unavailable("RPC writer thread panicked".into())));
            (sent, res)
        });
        let res = match (sent, received) {
            (Ok(()), Ok(())) => failed.map_or(Ok(()), Err),
            (_, Err(e)) | (Err(e), _) => self.fail(e),
        };
        if let Some(p) = panicked {
            std::panic::resume_unwind(p);
        }
        res
    }
}

/// A writer that adds what passes through it to `count`, at most [`READ_STEP`] bytes
/// at a time (one write of a whole large request would count nothing until it ended).
struct Counted<'a, W> {
    inner: &'a mut W,
    count: &'a AtomicU64,
}

impl<W: Write> Write for Counted<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(&buf[..buf.len().min(READ_STEP)])?;
        self.count.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Bytes a batch's upload must make in each read timeout for its reader to keep waiting
/// (a server reading a few bytes a minute, and never answering, would hold it for ever).
const MIN_BATCH_PROGRESS: u64 = 64 << 10;

/// Waits for the next response to start (or the connection to end), giving up on a
/// read timeout only once the upload counted in `progress` made too little progress
/// during it ([`MIN_BATCH_PROGRESS`]):
/// the server cannot answer a request before reading it, and on a slow link a large one
/// takes longer than the timeout (one more period is allowed after the upload ends, for
/// what the socket buffers still held).
fn wait_while_uploading(
    reader: &mut BufReader<TcpStream>,
    progress: &AtomicU64,
    ended: &AtomicBool,
) -> io::Result<()> {
    let mut seen = progress.load(Ordering::Relaxed);
    loop {
        match reader.fill_buf() {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
                ) && {
                    // Enough moved; or the upload ended during the period (its last
                    // bytes may be few): one more period for what the buffers hold.
                    let moved = progress.load(Ordering::Relaxed).saturating_sub(seen);
                    moved >= MIN_BATCH_PROGRESS || (moved > 0 && ended.load(Ordering::SeqCst))
                } =>
            {
                seen = progress.load(Ordering::Relaxed);
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod peer_group_tests {
    use super::{peer_group, peer_site};
    use std::net::IpAddr;

    #[test]
    fn peers_are_grouped_by_host() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(peer_group(ip("::ffff:127.0.0.1")), ip("127.0.0.1"));
        assert!(peer_group(ip("::ffff:127.0.0.1")).is_loopback());
        assert_eq!(peer_group(ip("10.1.2.3")), ip("10.1.2.3"));
        assert_eq!(peer_group(ip("::1")), ip("::1"));
        assert_eq!(
            peer_group(ip("2001:db8:1:2:aaaa:bbbb:cccc:dddd")),
            peer_group(ip("2001:db8:1:2::1"))
        );
        assert_ne!(
            peer_group(ip("2001:db8:1:2::1")),
            peer_group(ip("2001:db8:1:3::1"))
        );
        // Link-local and unique-local hosts are many hosts; NAT64 peers are IPv4 ones.
        assert_ne!(peer_group(ip("fe80::1")), peer_group(ip("fe80::2")));
        assert_ne!(peer_group(ip("fd00::1")), peer_group(ip("fd00::2")));
        assert_eq!(peer_group(ip("64:ff9b::192.0.2.7")), ip("192.0.2.7"));
        // 6to4: the IPv4 host its /48 is made of.
        assert_eq!(peer_group(ip("2002:c000:0207:5::1")), ip("192.0.2.7"));
        assert_eq!(peer_group(ip("2002:c000:0207:9::2")), ip("192.0.2.7"));
        // Sites: the /48 of a global IPv6 group; nothing for IPv4 or local groups.
        assert_eq!(
            peer_site(peer_group(ip("2001:db8:1:2::1"))),
            peer_site(peer_group(ip("2001:db8:1:ff::1")))
        );
        assert_ne!(
            peer_site(peer_group(ip("2001:db8:1:2::1"))),
            peer_site(peer_group(ip("2001:db8:2:2::1")))
        );
        assert_eq!(peer_site(ip("192.0.2.7")), None);
        assert_eq!(peer_site(peer_group(ip("fd00::1"))), None);
    }
}

//! The minimum transfer rate (`min_rate_bytes_per_sec`): an upload body or a streamed
//! download that moves too few bytes, counting only the time the node spent waiting for its
//! client, is cut. The stall timeout alone cuts a transfer that moves nothing; this cuts
//! one that trickles a byte just inside it (and would otherwise hold a transfer slot, and
//! its buffers, for as long as it likes).
//!
//! Only the client's share of the time counts: while the node is busy (storing, syncing,
//! waiting for the disk) it is not waiting for the client, and a slow node never makes a
//! client look slow.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

/// Counts the bytes a transfer moved and the time the node waited for them.
#[derive(Debug)]
pub struct RateFloor {
    /// Least average rate, in bytes per second of waiting (0: no floor).
    rate: u64,
    /// Waiting time after which the average is checked (and both counts restart).
    window: Duration,
    waited: Duration,
    moved: u64,
}

/// A transfer that moved fewer bytes than the floor allows.
#[derive(Debug)]
pub struct TooSlow {
    /// Bytes moved in the window.
    pub moved: u64,
    /// Time waited for them.
    pub waited: Duration,
    /// The floor, bytes per second.
    pub rate: u64,
}

impl std::fmt::Display for TooSlow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the client moved {} bytes in {:.0} s, below the node's minimum of {} bytes/s",
            self.moved,
            self.waited.as_secs_f64(),
            self.rate
        )
    }
}

impl std::error::Error for TooSlow {}

impl RateFloor {
    /// A floor of `rate` bytes per second, checked after each `window` of waiting.
    pub fn new(rate: u64, window: Duration) -> Self {
        RateFloor {
            rate,
            window,
            waited: Duration::ZERO,
            moved: 0,
        }
    }

    /// Records that `bytes` moved after the node waited `waited` for them; fails when a
    /// window of waiting has passed with fewer bytes than the floor asks.
    pub fn record(&mut self, bytes: u64, waited: Duration) -> Result<(), TooSlow> {
        if self.rate == 0 {
            return Ok(());
        }
        self.moved = self.moved.saturating_add(bytes);
        self.waited += waited;
        if self.waited < self.window {
            return Ok(());
        }
        let need = (self.rate as f64 * self.waited.as_secs_f64()) as u64;
        if self.moved < need {
            return Err(TooSlow {
                moved: self.moved,
                waited: self.waited,
                rate: self.rate,
            });
        }
        self.waited = Duration::ZERO;
        self.moved = 0;
        Ok(())
    }
}

/// A request body held to a [`RateFloor`]: the time counted is the time its reader spent
/// waiting on it (polls that found no data), so a reader that pauses costs the client
/// nothing.
pub struct FloorBody<B> {
    inner: B,
    floor: RateFloor,
    /// When the current wait for data began (a poll answered `Pending`).
    waiting_since: Option<Instant>,
    /// The size the request declared (its `Content-Length`), when the body under `inner`
    /// knew it and a wrapper in between (the stall timeout's) hides it.
    declared: Option<SizeHint>,
    /// Data bytes passed on so far (the declared size hint shrinks by them).
    passed: u64,
}

impl<B> FloorBody<B> {
    /// Wraps `inner`.
    pub fn new(inner: B, floor: RateFloor) -> Self {
        FloorBody {
            inner,
            floor,
            waiting_since: None,
            declared: None,
            passed: 0,
        }
    }

    /// Reports `hint` (the size hint of the request's own body, from its `Content-Length`)
    /// as this body's size hint, so a handler can refuse a body declared too large before
    /// reading it.
    pub fn with_size_hint(mut self, hint: SizeHint) -> Self {
        self.declared = Some(hint);
        self
    }
}

impl<B> Body for FloorBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Pending => {
                this.waiting_since.get_or_insert_with(Instant::now);
                Poll::Pending
            }
            Poll::Ready(Some(Ok(frame))) => {
                let waited = this
                    .waiting_since
                    .take()
                    .map_or(Duration::ZERO, |t| t.elapsed());
                // Only data counts: trailers (or an empty frame) neither help nor hurt.
                let Some(n) = frame.data_ref().map(|d| d.len() as u64) else {
                    return Poll::Ready(Some(Ok(frame)));
                };
                this.passed = this.passed.saturating_add(n);
                match this.floor.record(n, waited) {
                    Ok(()) => Poll::Ready(Some(Ok(frame))),
                    Err(e) => Poll::Ready(Some(Err(Box::new(e)))),
                }
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        match &self.declared {
            // What is left of the declared size.
            Some(h) => {
                let mut left = SizeHint::new();
                left.set_lower(h.lower().saturating_sub(self.passed));
                if let Some(u) = h.upper() {
                    left.set_upper(u.saturating_sub(self.passed));
                }
                left
            }
            None => self.inner.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The declared size a `FloorBody` reports is what is left of it: it shrinks by the
    /// data passed on (a size hint describes the rest of the body).
    #[tokio::test]
    async fn the_declared_size_shrinks_as_data_passes() {
        let frames = futures_util::stream::iter(vec![
            Ok::<_, std::io::Error>(Frame::data(Bytes::from_static(b"abcd"))),
            Ok(Frame::data(Bytes::from_static(b"efghij"))),
        ]);
        let inner = axum::body::Body::new(http_body_util::StreamBody::new(frames));
        let body = FloorBody::new(inner, RateFloor::new(0, Duration::from_secs(1)))
            .with_size_hint(SizeHint::with_exact(10));
        assert_eq!(body.size_hint().exact(), Some(10));
        let mut body = std::pin::pin!(body);
        let mut seen = Vec::new();
        while let Some(f) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
            let f = f.unwrap();
            seen.extend_from_slice(f.data_ref().unwrap());
            assert_eq!(body.size_hint().exact(), Some(10 - seen.len() as u64));
        }
        assert_eq!(seen, b"abcdefghij");
    }

    #[test]
    fn the_floor_counts_waiting_time_only() {
        let w = Duration::from_secs(10);
        let mut f = RateFloor::new(100, w);
        // 500 bytes over 4 s of waiting: the window is not over yet.
        f.record(500, Duration::from_secs(4)).unwrap();
        // 600 more after 6 s: 1100 bytes in 10 s, above 100/s; the window restarts.
        f.record(600, Duration::from_secs(6)).unwrap();
        // Bytes that came with no waiting (the node was busy) are fine at any pace.
        for _ in 0..1000 {
            f.record(1, Duration::ZERO).unwrap();
        }
        // A trickle: 1 byte per 9 s of waiting fails at the end of the window.
        let mut f = RateFloor::new(100, w);
        f.record(1, Duration::from_secs(9)).unwrap();
        let e = f.record(1, Duration::from_secs(9)).unwrap_err();
        assert_eq!(
            (e.moved, e.waited, e.rate),
            (2, Duration::from_secs(18), 100)
        );
        assert!(e.to_string().contains("2 bytes in 18 s"), "{e}");
        // Rate 0 is no floor.
        let mut f = RateFloor::new(0, w);
        f.record(0, Duration::from_secs(3600)).unwrap();
    }
}

//! Prometheus metrics: requests by route and status, request latency, bytes in and out.
//! Served in the Prometheus text format at `/metrics`.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};

use crate::node::Node;

/// The node's metrics.
pub struct Metrics {
    registry: Registry,
    /// Requests by method, route and status.
    pub requests: IntCounterVec,
    /// Request latency in seconds by method and route.
    pub latency: HistogramVec,
    /// Requests being served now.
    pub in_flight: IntGauge,
    /// Body bytes stored, by API (native, gaia).
    pub bytes_written: IntCounterVec,
    /// Body bytes served, by API.
    pub bytes_read: IntCounterVec,
    /// Buckets open now (bounded by `max_open_buckets`); set when scraped.
    pub open_buckets: IntGauge,
    /// Capsules loaded in memory now; set when scraped.
    pub loaded_capsules: IntGauge,
    /// 1 while the store takes writes, 0 once it refuses them until a restart (see
    /// `/healthz`); set when scraped.
    pub store_writable: IntGauge,
    /// Streamed transfers in progress (bounded by `max_transfers`); set when scraped.
    pub transfers: IntGauge,
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> prometheus::Result<Self> {
        let registry = Registry::new_custom(Some("cairn".into()), None)?;
        let requests = IntCounterVec::new(
            Opts::new(
                "http_requests_total",
                "HTTP requests by method, route and status",
            ),
            &["method", "route", "status"],
        )?;
        let latency = HistogramVec::new(
            HistogramOpts::new("http_request_seconds", "HTTP request latency")
                .buckets(prometheus::exponential_buckets(0.0005, 2.0, 18)?),
            &["method", "route"],
        )?;
        let in_flight = IntGauge::new("http_requests_in_flight", "HTTP requests being served")?;
        let bytes_written = IntCounterVec::new(
            Opts::new("bytes_written_total", "body bytes stored"),
            &["api"],
        )?;
        let bytes_read =
            IntCounterVec::new(Opts::new("bytes_read_total", "body bytes served"), &["api"])?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(latency.clone()))?;
        registry.register(Box::new(in_flight.clone()))?;
        registry.register(Box::new(bytes_written.clone()))?;
        registry.register(Box::new(bytes_read.clone()))?;
        let open_buckets = IntGauge::new("open_buckets", "buckets open now")?;
        let loaded_capsules = IntGauge::new("loaded_capsules", "capsules loaded in memory now")?;
        let transfers = IntGauge::new("transfers_in_progress", "streamed transfers in progress")?;
        registry.register(Box::new(open_buckets.clone()))?;
        registry.register(Box::new(loaded_capsules.clone()))?;
        registry.register(Box::new(transfers.clone()))?;
        let store_writable = IntGauge::new(
            "store_writable",
            "1 while the store takes writes, 0 once it refuses them until a restart",
        )?;
        registry.register(Box::new(store_writable.clone()))?;
        Ok(Metrics {
            registry,
            requests,
            latency,
            in_flight,
            bytes_written,
            bytes_read,
            open_buckets,
            loaded_capsules,
            transfers,
            store_writable,
        })
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> Result<String, prometheus::Error> {
        let mut buf = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut buf)?;
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }
}

/// `GET /metrics`.
pub async fn handler(State(node): State<Arc<Node>>) -> Response {
    let m = &node.metrics;
    m.open_buckets.set(node.open_buckets() as i64);
    m.loaded_capsules
        .set(node.capsules.loaded_capsules() as i64);
    m.transfers.set(node.transfers_in_progress() as i64);
    m.store_writable
        .set(i64::from(node.store.write_failure().is_none()));
    match node.metrics.render() {
        Ok(text) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// Middleware counting and timing every request by its route pattern (not its path, so
/// the number of series stays bounded).
pub async fn track(State(node): State<Arc<Node>>, req: Request, next: Next) -> Response {
    // Labels come from a fixed set, so clients cannot grow the label space (a method
    // outside the standard ones is counted as `other`; an unrouted path as `unmatched`).
    let method: &'static str = match req.method().as_str() {
        "GET" => "GET",
        "HEAD" => "HEAD",
        "POST" => "POST",
        "PUT" => "PUT",
        "PATCH" => "PATCH",
        "DELETE" => "DELETE",
        "OPTIONS" => "OPTIONS",
        _ => "other",
    };
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into());
    let m = &node.metrics;
    // Decremented on drop: a request whose connection goes away mid-way is dropped
    // without returning here.
    let _in_flight = InFlight::enter(&m.in_flight);
    let start = Instant::now();
    let resp = next.run(req).await;
    m.latency
        .with_label_values(&[method, &route])
        .observe(start.elapsed().as_secs_f64());
    m.requests
        .with_label_values(&[method, &route, resp.status().as_str()])
        .inc();
    resp
}

/// One request counted in `http_requests_in_flight` while it lives.
struct InFlight<'a>(&'a IntGauge);

impl<'a> InFlight<'a> {
    fn enter(g: &'a IntGauge) -> Self {
        g.inc();
        InFlight(g)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

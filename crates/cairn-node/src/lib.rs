//! The Cairn node (`cairn serve`): one process serving the embedded store over HTTP.
//!
//! - [`config`]: the TOML config file, environment variables and defaults;
//! - [`node`]: the shared state (store, capsule server, buckets) every handler uses;
//! - [`keys`]: key files (the writer key, the node key);
//! - [`metrics`]: Prometheus counters and histograms, served at `/metrics`;
//! - [`native`]: Cairn's own HTTP API (objects, versions, branches, proofs);
//! - [`gaia`]: a drop-in Gaia hub (the endpoints and auth of stacks-network/gaia).
//!
//! [`router`] assembles the routes; [`serve`] binds, serves and shuts down gracefully
//! (in-flight requests finish, within a grace period) on SIGINT/SIGTERM or when the given
//! future completes. Slow or stalled clients are bounded: headers must arrive within a
//! timeout, transfers that move no byte are cut, and connections and streamed transfers
//! are capped (see [`Config`]).

pub mod config;
pub mod gaia;
pub mod keys;
pub mod metrics;
pub mod native;
pub mod node;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use axum::Router;
use axum::routing::get;

pub use config::Config;
pub use node::Node;

/// Every route of the node over `node`.
pub fn router(node: Arc<Node>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics::handler))
        .merge(native::routes())
        .merge(gaia::routes(&node))
        .layer(axum::middleware::from_fn_with_state(
            node.clone(),
            metrics::track,
        ))
        .with_state(node)
}

async fn healthz() -> &'static str {
    "ok\n"
}

/// A bound node: its address, and the future that serves until `shutdown` completes (or
/// SIGINT/SIGTERM arrives), then waits for in-flight requests.
pub struct Bound {
    /// The address the node listens on (useful with port 0).
    pub addr: SocketAddr,
    listener: tokio::net::TcpListener,
    node: Arc<Node>,
}

impl Bound {
    /// Binds the configured listen address.
    pub async fn bind(node: Arc<Node>) -> Result<Self> {
        let listen = node.config.listen.clone();
        let listener = tokio::net::TcpListener::bind(&listen)
            .await
            .with_context(|| format!("binding {listen}"))?;
        let addr = listener.local_addr()?;
        Ok(Bound {
            addr,
            listener,
            node,
        })
    }

    /// Serves until `shutdown` completes or a termination signal arrives; then stops
    /// accepting connections and waits for in-flight requests to finish, at most
    /// `shutdown_grace_secs` (connections still open then are closed).
    ///
    /// Each connection must send a request's headers within `header_timeout_secs` (and is
    /// closed after idling that long between requests); at most `max_connections` are
    /// served at once, further ones waiting in the listen backlog.
    pub async fn serve(self, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<()> {
        use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
        let node = self.node.clone();
        let cfg = &node.config;
        tracing::info!(addr = %self.addr, data = %cfg.data_dir.display(), "cairn node listening");
        let service = hyper_util::service::TowerToHyperService::new(router(node.clone()));
        let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            // A client that sends its whole request, then shuts down its write side, still
            // gets the answer (without this the connection closed unanswered, while the
            // handler could still go on and store the write).
            .half_close(true)
            .timer(TokioTimer::new())
            .header_read_timeout(Duration::from_secs_f64(cfg.header_timeout_secs));
        let connections = Arc::new(tokio::sync::Semaphore::new(cfg.max_connections));
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        let stop = async move {
            tokio::select! {
                _ = shutdown => {}
                _ = termination() => {}
            }
        };
        tokio::pin!(stop);
        loop {
            let permit = tokio::select! {
                p = connections.clone().acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => break,
                },
                _ = &mut stop => break,
            };
            let tcp = tokio::select! {
                r = self.listener.accept() => match r {
                    Ok((tcp, _)) => tcp,
                    Err(e) => {
                        // Out of file descriptors, a connection reset before accept: wait
                        // a moment rather than spin.
                        tracing::warn!("accept: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                _ = &mut stop => break,
            };
            // Without TCP_NODELAY, Nagle's algorithm and delayed ACKs held small responses
            // back ~40 ms (measured by `cairn bench hub`: 1 MB reads 47 ms → 2.9 ms).
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::warn!("TCP_NODELAY: {e}");
            }
            let builder = builder.clone();
            let service = service.clone();
            let watcher = graceful.watcher();
            tokio::spawn(async move {
                let _permit = permit;
                let conn = builder.serve_connection_with_upgrades(TokioIo::new(tcp), service);
                if let Err(e) = watcher.watch(conn).await {
                    tracing::debug!("connection: {e}");
                }
            });
        }
        drop(self.listener);
        let grace = Duration::from_secs_f64(cfg.shutdown_grace_secs);
        let open = graceful.count();
        tracing::info!(
            connections = open,
            "shutting down: finishing in-flight requests"
        );
        tokio::select! {
            _ = graceful.shutdown() => tracing::info!("stopped"),
            _ = tokio::time::sleep(grace) => tracing::warn!(
                "stopped after the {} s shutdown grace period; requests still open were cut",
                grace.as_secs_f64()
            ),
        }
        Ok(())
    }
}

/// Opens the node and serves it until a termination signal (the `cairn serve` command).
pub async fn serve(config: Config) -> Result<()> {
    let node = Node::open(config)?;
    Bound::bind(node).await?.serve(std::future::pending()).await
}

async fn termination() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}

/// Installs the global tracing subscriber: `RUST_LOG` filters (default `info`), `format`
/// chooses text or JSON lines on stderr. Calling it twice keeps the first.
pub fn init_logging(format: config::LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let _ = match format {
        config::LogFormat::Text => builder.try_init(),
        config::LogFormat::Json => builder.json().try_init(),
    };
}

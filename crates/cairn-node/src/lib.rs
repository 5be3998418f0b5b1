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

#![warn(missing_docs)]

pub mod config;
pub mod gaia;
pub mod keys;
pub mod metrics;
pub mod native;
pub mod node;
pub mod rate;

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
        .layer(axum::middleware::from_fn_with_state(
            node.clone(),
            stall_bodies,
        ))
        .layer(axum::middleware::from_fn_with_state(
            Arc::new(HostCheck::new(&node.config)),
            check_host,
        ))
        .with_state(node)
}

/// Which `Host` names a node serves, and which web pages may write through its native API
/// (see [`Config::allowed_hosts`]).
#[derive(Debug)]
pub struct HostCheck {
    /// Whether `Host` names are checked at all.
    on: bool,
    /// `*` was listed: every name is served and every page may write.
    any: bool,
    /// Names listed in `allowed_hosts`, lowercase: served, and their pages may write.
    allowed: Vec<String>,
    /// The Gaia hub's own names: served (their pages, which may be files stored there, may
    /// not write).
    hub: Vec<String>,
}

impl HostCheck {
    /// The check `config` asks for: on when the node listens on a loopback address or
    /// names hosts, off with `*` among them. The host names of the Gaia hub's own URLs
    /// (`server_name`, `valid_hub_urls`, `read_url`) are served too.
    pub fn new(config: &Config) -> HostCheck {
        let allowed: Vec<String> = config.allowed_hosts.iter().map(|h| host_name(h)).collect();
        let any = allowed.iter().any(|h| h == "*");
        let on = (is_loopback_listen(&config.listen) || !allowed.is_empty()) && !any;
        let g = &config.gaia;
        let urls = g.valid_hub_urls.iter().chain(g.read_url.iter());
        let mut hub: Vec<String> = urls
            .filter_map(|u| u.parse::<axum::http::Uri>().ok())
            .filter_map(|u| u.host().map(host_name))
            .collect();
        hub.push(host_name(&g.server_name));
        HostCheck {
            on,
            any,
            allowed,
            hub,
        }
    }

    /// Whether a request naming `host` (a `Host` header value, port included) is served.
    pub fn allows(&self, host: &str) -> bool {
        if !self.on {
            return true;
        }
        split_host(host).is_some_and(|(name, ip)| {
            ip || is_local_name(&name) || self.allowed.contains(&name) || self.hub.contains(&name)
        })
    }

    /// Whether a native-API write carrying `Origin: origin` may go ahead on a request
    /// naming `host`. The native API serves no page and grants no CORS, so such a write
    /// comes from a page of a listed host (a front end behind the same reverse proxy), or
    /// from the node's own origin (port aside: proxies often drop or rewrite it) when that
    /// is an IP address or a `localhost` name. A page of any other name is refused even
    /// when `Host` says the same name: after DNS rebinding they agree.
    pub fn allows_origin(&self, origin: &str, host: Option<&str>) -> bool {
        if self.any {
            return true;
        }
        // `scheme://host[:port]`; "null" names no host.
        let Some((o, o_ip)) = origin.split_once("://").and_then(|(_, a)| split_host(a)) else {
            return false;
        };
        if self.allowed.contains(&o) {
            return true;
        }
        host.and_then(split_host)
            .is_some_and(|(h, _)| h == o && (o_ip || is_local_name(&o)))
    }
}

/// The host of an authority (`name`, `name:port`, `[v6]`, `[v6]:port`) as compared
/// (lowercase, no trailing dot), and whether it is an IP address; `None` when it is not
/// one of those forms.
fn split_host(authority: &str) -> Option<(String, bool)> {
    let a = authority.trim();
    let digits = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
    if let Some(rest) = a.strip_prefix('[') {
        let (ip, port) = rest.split_once(']')?;
        let port_ok = port.is_empty() || port.strip_prefix(':').is_some_and(digits);
        return (port_ok && ip.parse::<std::net::Ipv6Addr>().is_ok())
            .then(|| (ip.to_ascii_lowercase(), true));
    }
    let name = match a.rsplit_once(':') {
        Some((n, port)) if digits(port) => n,
        Some(_) => return None,
        None => a,
    };
    let name = host_name(name);
    if name.is_empty() {
        return None;
    }
    let ip = name.parse::<std::net::Ipv4Addr>().is_ok();
    Some((name, ip))
}

/// `localhost` and its subdomains, which resolve to loopback by definition (RFC 6761).
fn is_local_name(name: &str) -> bool {
    name == "localhost" || name.ends_with(".localhost")
}

/// A host name as compared: lowercase, without a trailing dot.
fn host_name(h: &str) -> String {
    h.trim().trim_end_matches('.').to_ascii_lowercase()
}

/// Whether `listen` (`host:port`) is a loopback address or `localhost`.
fn is_loopback_listen(listen: &str) -> bool {
    let host = listen.rsplit_once(':').map_or(listen, |(h, _)| h);
    host.eq_ignore_ascii_case("localhost")
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Refuses (403) a request whose `Host` (or absolute URI) names a host this node does not
/// serve (see [`HostCheck`]); a request naming none (HTTP/1.0) is served. Refuses too a
/// native-API write (`/v1/...`, any method but `GET` and `HEAD`) that a web page sent
/// (browsers name the page's origin in `Origin` on every such request), unless
/// [`HostCheck::allows_origin`] (whatever its `Content-Type`). The answer allows any origin
/// to read it (a request a browser sends without a preflight then shows the reason).
async fn check_host(
    axum::extract::State(check): axum::extract::State<Arc<HostCheck>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::http::{Method, header};
    use axum::response::IntoResponse;
    let printable = |s: &str| -> String {
        s.chars()
            .filter(|c| !c.is_control())
            .take(256)
            .collect::<String>()
    };
    let host = req.uri().authority().map(|a| a.to_string()).or_else(|| {
        req.headers()
            .get(header::HOST)
            .map(|v| v.to_str().unwrap_or("\u{fffd}").to_string())
    });
    let refused = |why: String| {
        confine(
            (
                axum::http::StatusCode::FORBIDDEN,
                [(header::ACCESS_CONTROL_ALLOW_ORIGIN, "*")],
                why,
            )
                .into_response(),
        )
    };
    if let Some(h) = &host
        && !check.allows(h)
    {
        return refused(format!(
            "this node does not serve host {:?}: add it to the config's allowed_hosts (a \
             guard against DNS rebinding; see docs/node.md)\n",
            printable(h)
        ));
    }
    let write = !matches!(*req.method(), Method::GET | Method::HEAD);
    if write && req.uri().path().starts_with("/v1/") {
        let origin = req
            .headers()
            .get(header::ORIGIN)
            .map(|o| o.to_str().unwrap_or("null"));
        if let Some(o) = origin
            && !check.allows_origin(o, host.as_deref())
        {
            return refused(format!(
                "a web page of {:?} may not write through the native API (list its host in \
                 the config's allowed_hosts if it is your own front end; see docs/node.md)\n",
                printable(o)
            ));
        }
    }
    confine(next.run(req).await)
}

/// Stored files are served with the type their uploader chose (a Gaia `/read/` of
/// `text/html`): a page opened from the node must not run as the node's own origin, where
/// it could read open buckets and pass the origin check of [`check_host`]. So every answer
/// says `Content-Security-Policy: sandbox` (a sandboxed document gets an opaque origin,
/// and its requests say `Origin: null`; `fetch`, `<img>` and `<video>` uses of the bytes
/// are unaffected) and `X-Content-Type-Options: nosniff` (no browser guesses another
/// type). PDFs are left out of the sandbox: browsers refuse to show them sandboxed, and
/// their viewers do not run a document as the node's origin. Only a single Content-Type
/// without a comma counts as one: browsers take a list's last valid type
/// (`application/pdf;a=b,text/html` is HTML to them).
fn confine(mut resp: axum::response::Response) -> axum::response::Response {
    use axum::http::header;
    let mut types = resp.headers().get_all(header::CONTENT_TYPE).iter();
    let pdf = match (types.next(), types.next()) {
        (Some(v), None) => v.to_str().ok().is_some_and(|v| {
            !v.contains(',')
                && v.split(';')
                    .next()
                    .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/pdf"))
        }),
        _ => false,
    };
    let h = resp.headers_mut();
    if !pdf {
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            header::HeaderValue::from_static("sandbox"),
        );
    }
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        header::HeaderValue::from_static("nosniff"),
    );
    resp
}

/// Every request body fails once it sends nothing for `stall_timeout_secs` while it is
/// being read (small JSON bodies included, not only the streamed uploads), or sends less
/// than `min_rate_bytes_per_sec` on average while the node waits for it (see
/// [`rate`]).
async fn stall_bodies(
    axum::extract::State(node): axum::extract::State<Arc<Node>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let stall = node.stall_timeout();
    let floor = node.rate_floor();
    let req = req.map(|b| {
        // The declared length survives the wrappers (the timeout's hides it).
        let declared = http_body::Body::size_hint(&b);
        let timed = axum::body::Body::new(tower_http::timeout::TimeoutBody::new(stall, b));
        axum::body::Body::new(rate::FloorBody::new(timed, floor).with_size_hint(declared))
    });
    next.run(req).await
}

/// `GET /healthz`: 200 `ok` while the node can take writes; 503 with the reason once its
/// store refuses every write until a restart (after a failed write or sync, such as a
/// full disk), so a supervisor can tell and restart it. Reads are still served then.
async fn healthz(
    axum::extract::State(node): axum::extract::State<Arc<Node>>,
) -> (axum::http::StatusCode, String) {
    match node.store.write_failure() {
        None => (axum::http::StatusCode::OK, "ok\n".into()),
        Some(why) => (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            format!("the store refuses writes until the node restarts: {why}\n"),
        ),
    }
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
    /// `shutdown_grace_secs`; connections still open then are closed.
    ///
    /// HTTP/1.1. Each connection must send a request's headers within
    /// `header_timeout_secs` (from when it opens, and after each response) or is closed;
    /// at most `max_connections` are served at once, further ones waiting in the listen
    /// backlog.
    pub async fn serve(self, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<()> {
        use hyper_util::rt::{TokioIo, TokioTimer};
        let node = self.node.clone();
        let cfg = &node.config;
        tracing::info!(addr = %self.addr, data = %cfg.data_dir.display(), "cairn node listening");
        if !HostCheck::new(cfg).on {
            // Reachable from other hosts, and (through a name a web page rebinds to this
            // machine) from pages in a local browser: open buckets are readable that way.
            tracing::warn!(
                addr = %self.addr,
                "the Host check is off (listening beyond loopback with no allowed_hosts, or \
                 \"*\" among them): set allowed_hosts to the names clients use"
            );
        }
        let service = hyper_util::service::TowerToHyperService::new(router(node.clone()));
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            // A client that sends its whole request, then shuts down its write side, still
            // gets the answer (without this the connection closed unanswered, while the
            // handler could still go on and store the write).
            .half_close(true)
            .timer(TokioTimer::new())
            .header_read_timeout(Duration::from_secs_f64(cfg.header_timeout_secs));
        let connections = Arc::new(tokio::sync::Semaphore::new(cfg.max_connections));
        let per_ip = crate::node::PeerCounts::default();
        // IPv6 sites (/48s), counted apart: a site's key may equal one of its /64s'.
        let per_site = crate::node::PeerCounts::default();
        let mut refused = RefusalLog::default();
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        let mut tasks = tokio::task::JoinSet::new();
        let stop = async move {
            tokio::select! {
                _ = shutdown => {}
                _ = termination() => {}
            }
        };
        tokio::pin!(stop);
        loop {
            // Reap finished connection tasks, so the set holds only open connections.
            while tasks.try_join_next().is_some() {}
            let permit = tokio::select! {
                p = connections.clone().acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => break,
                },
                _ = &mut stop => break,
            };
            let (tcp, peer) = tokio::select! {
                r = self.listener.accept() => match r {
                    Ok(accepted) => accepted,
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
            // One address holds at most its share of connections, and its requests take
            // transfers within its share (see `Node::write_permit`).
            // (Loopback is judged on the address itself: a NAT64 address embedding
            // 127.0.0.1 is not a local proxy.)
            let loopback = peer.ip().to_canonical().is_loopback();
            let limited =
                (cfg.limit_loopback || !loopback).then(|| cairn_net::peer_group(peer.ip()));
            let slot = match limited {
                Some(ip) if cfg.max_connections_per_ip > 0 => {
                    let site = match cairn_net::peer_site(ip) {
                        Some(site) => per_site
                            .take(
                                site,
                                cfg.max_connections_per_ip
                                    .saturating_mul(cairn_net::SITE_CONNECTIONS_FACTOR),
                            )
                            .map(Some),
                        None => Some(None),
                    };
                    match (site, per_ip.take(ip, cfg.max_connections_per_ip)) {
                        (Some(site), Some(slot)) => Some((slot, site)),
                        _ => {
                            refused.note(ip);
                            continue;
                        }
                    }
                }
                _ => None,
            };
            let conn = builder.serve_connection(TokioIo::new(tcp), service.clone());
            let conn = graceful.watch(conn);
            tasks.spawn(async move {
                let _permit = permit;
                let _slot = slot;
                let conn = crate::node::PEER.scope(peer.ip(), conn);
                let done = match limited {
                    Some(ip) => crate::node::LIMITED_PEER.scope(ip, conn).await,
                    None => conn.await,
                };
                if let Err(e) = done {
                    tracing::debug!("connection: {e}");
                }
            });
        }
        drop(self.listener);
        let grace = Duration::from_secs_f64(cfg.shutdown_grace_secs);
        tracing::info!(
            connections = tasks.len(),
            "shutting down: finishing in-flight requests"
        );
        tokio::select! {
            _ = graceful.shutdown() => tracing::info!("stopped"),
            _ = tokio::time::sleep(grace) => {
                tracing::warn!(
                    connections = tasks.len(),
                    "stopped after the {} s shutdown grace period; closing the connections still open",
                    grace.as_secs_f64()
                );
                tasks.abort_all();
            }
        }
        Ok(())
    }
}

/// Connections refused for `max_connections_per_ip`, reported as a warning at most once a
/// minute (a proxy on another host makes every client one address: its operator must
/// see why connections close).
#[derive(Default)]
struct RefusalLog {
    since: usize,
    last: Option<std::time::Instant>,
}

impl RefusalLog {
    fn note(&mut self, ip: std::net::IpAddr) {
        self.since += 1;
        if self
            .last
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(60))
        {
            tracing::warn!(
                %ip,
                refused = self.since,
                "connections refused: this address holds max_connections_per_ip, or its \
                 IPv6 /48 4 times that (behind a proxy on another host, every client is the \
                 proxy's address: set max_connections_per_ip and max_transfers_per_ip to 0)"
            );
            self.since = 0;
            self.last = Some(std::time::Instant::now());
        }
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

#[cfg(test)]
mod host_tests {
    use super::*;

    fn check(listen: &str, allowed: &[&str]) -> HostCheck {
        HostCheck::new(&Config {
            listen: listen.into(),
            allowed_hosts: allowed.iter().map(|s| s.to_string()).collect(),
            ..Config::default()
        })
    }

    #[test]
    fn host_names_a_node_serves() {
        let local = check("127.0.0.1:3000", &[]);
        for ok in [
            "localhost",
            "LOCALHOST:3000",
            "a.localhost:1",
            "localhost.",
            "127.0.0.1",
            "10.1.2.3:80",
            "[::1]:3000",
            "[fe80::1]",
        ] {
            assert!(local.allows(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:3000",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
            "[evil]:3000",
            "[::1]evil",
            "[::1]:x",
            "",
        ] {
            assert!(!local.allows(bad), "{bad}");
        }
        let proxied = check("127.0.0.1:3000", &["Cairn.Example.com"]);
        assert!(proxied.allows("cairn.example.com:443"));
        assert!(!proxied.allows("evil.example"));
        // A node on a public address checks only the names it is given.
        assert!(check("0.0.0.0:3000", &[]).allows("evil.example"));
        assert!(!check("0.0.0.0:3000", &["cairn.example.com"]).allows("evil.example"));
        assert!(check("[::1]:3000", &["*"]).allows("evil.example"));
        assert!(!check("localhost:3000", &[]).allows("evil.example"));
        assert!(!check("[::1]:3000", &[]).allows("evil.example"));
        assert!(!check("LOCALHOST:3000", &[]).allows("evil.example"));
        // The Gaia hub's own names are served.
        let hub = HostCheck::new(&Config {
            gaia: crate::gaia::GaiaConfig {
                server_name: "hub.example".into(),
                read_url: Some("https://reader.example/read/".into()),
                valid_hub_urls: vec!["https://Other.Example:8443".into()],
                ..Default::default()
            },
            ..Config::default()
        });
        for ok in ["hub.example", "reader.example:443", "other.example:8443"] {
            assert!(hub.allows(ok), "{ok}");
        }
        assert!(!hub.allows("evil.example"));
    }

    #[test]
    fn web_pages_that_may_write() {
        let local = check("127.0.0.1:3000", &[]);
        let public = check("0.0.0.0:3000", &[]);
        let proxied = check("127.0.0.1:3000", &["app.example.com"]);
        for c in [&local, &public, &proxied] {
            // The node's own origin, by IP or localhost name, port aside.
            assert!(c.allows_origin("http://127.0.0.1:3000", Some("127.0.0.1:3000")));
            assert!(c.allows_origin("http://localhost:5173", Some("localhost:3000")));
            assert!(c.allows_origin("https://[::1]", Some("[::1]:3000")));
            // Another site; nothing at all; another page's IP.
            assert!(!c.allows_origin("https://evil.example", Some("127.0.0.1:3000")));
            assert!(!c.allows_origin("null", Some("127.0.0.1:3000")));
            assert!(!c.allows_origin("http://10.0.0.9", Some("127.0.0.1:3000")));
            // DNS rebinding: Host and Origin agree on a name that is not the node's.
            assert!(!c.allows_origin("http://evil.example:3000", Some("evil.example:3000")));
        }
        // A listed front end, whatever Host the proxy sends.
        assert!(proxied.allows_origin("https://App.Example.com", Some("127.0.0.1:3000")));
        assert!(proxied.allows_origin("https://app.example.com:8443", None));
        assert!(check("0.0.0.0:3000", &["*"]).allows_origin("https://evil.example", None));
    }
}

//! A drop-in Gaia hub (stacks-network/gaia `hub/src/server/http.ts`, `server.ts`,
//! `authentication.ts`, and the reader side-car), with Gaia's failures fixed.
//!
//! Routes, status codes, JSON bodies and CORS headers are the hub's:
//!
//! | route | answer |
//! | --- | --- |
//! | `GET /hub_info[/]` | 200 `{challenge_text, latest_auth_version, max_file_upload_size_megabytes, read_url_prefix}` |
//! | `POST /store/{address}/{path}` | 202 `{publicURL, etag}` |
//! | `DELETE /delete/{address}/{path}` | 202, empty |
//! | `POST /list-files/{address}` | 202 `{entries, page}` (`{"page", "stat"}` in the body) |
//! | `POST /revoke-all/{address}` | 202 `{status: "success"}` (`{"oldestValidTimestamp"}` in the body) |
//! | `GET/HEAD /read/{address}/{path}` | the file, with `ETag`, `Content-Type`, `Last-Modified` (the reader's job in Gaia) |
//!
//! Errors are `{message, error}` with the hub's error names: 401 `ValidationError` /
//! `AuthTokenTimestampValidationError`, 403 `BadPathError` (on a delete too, as the hub
//! answers since its fix of issue 266), 404 `DoesNotExist`, 412
//! `PreconditionFailedError`, 413 `PayloadTooLargeError`.
//!
//! **Storage.** Each Gaia address is one Cairn bucket (`gaia-<hex of the address's
//! hash160>`, a capsule written by the node key) and each file path one key of it. Every
//! store puts a new Blob version on the key's `master` branch (the previous head is its
//! base, so history is kept; the ETag is the version's uid; content type and modification
//! time live in the version's context). A delete removes the `master` head; the versions
//! stay in the store. The revocation time (`revoke-all`) is an Integer under the key
//! [`REVOCATION_KEY`], which starts with a NUL byte no Gaia path may contain.
//!
//! **Fixed failures.** The hub answers 409 to a second concurrent write of one path; here
//! writes to one path queue (up to `write_queue` per path, then 503 with `Retry-After`)
//! and all succeed. Bodies stream: the upload goes from the socket through a
//! [`BodyReader`] into the POS-tree builder, and reads stream leaf by leaf, so memory
//! does not grow with file size. The body is built into chunks before the path's turn
//! comes; only its end (the last chunks) and the commit are serialized, and
//! `If-Match` / `If-None-Match` are re-checked right before the commit (atomically with
//! it), not only before the upload, as are the token's revocation and expiry (under the
//! address's revocation lock, which `revoke-all` takes exclusively) and the version's base. `revoke-all` takes a time at most
//! [`REVOCATION_SKEW_SECS`] ahead of the node's clock, and only from a v1 token with `iat`
//! that the current time does not revoke, so a stolen token cannot lock the owner out.
//! `list-files` pages are cursors (the last name listed), so changes between pages
//! neither skip nor repeat names.

pub mod auth;

use std::collections::HashMap;
use std::io::{self, Read};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::native::body::BodyReader;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use cairn_capsule::Bucket;
use cairn_object::db::DEFAULT_BRANCH;
use cairn_object::{At, Db, NewValue, PutOptions, Target, Uid, Value, ValueType};
use parking_lot::Mutex;
use serde::{Deserialize, Deserializer, Serialize};

use crate::native::objects::{RangeAsk, parse_range};
use crate::node::Node;
use auth::{AuthError, AuthSettings, Verified};

/// How far (seconds) a `revoke-all` time may lie ahead of the node's clock: the clock skew
/// allowed between client and hub. A later time would lock the owner's current tokens out
/// until then, and the time can never be lowered.
pub const REVOCATION_SKEW_SECS: i64 = 300;

/// The key holding a bucket's revocation time (seconds since the epoch): it starts with a
/// NUL byte, which Gaia paths may not contain, so it never collides with a file.
pub const REVOCATION_KEY: &[u8] = b"\0gaia/oldest-valid-token";

/// Gaia hub settings (the `[gaia]` table of the config file). The names follow the hub's
/// `config.json` keys in snake case.
///
/// ```toml
/// [gaia]
/// server_name = "gaia-0"                  # part of the challenge text clients sign
/// read_url = "https://cdn.example/"       # read_url_prefix; default http://<Host>/read/
/// require_correct_hub_url = false         # tokens must claim one of valid_hub_urls
/// valid_hub_urls = ["https://hub.example"]
/// whitelist = ["1Address..."]             # only these signers may use the hub
/// page_size = 100                         # list-files entries per page (1..=4096)
/// cache_control = "no-cache"              # Cache-Control of reads ("" for none)
/// auth_timestamp_cache_size = 50000       # revocation times kept in memory
/// allow_legacy_tokens = true              # false: refuse pre-v1 tokens (never revocable)
/// ```
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GaiaConfig {
    /// The hub's name in the challenge text (`serverName`); `https://<server_name>` is
    /// always an accepted `hubUrl`.
    pub server_name: String,
    /// The `read_url_prefix` announced and used in `publicURL` (`readURL`). Unset: the
    /// node's own read endpoint, `http://<Host of the request>/read/`.
    pub read_url: Option<String>,
    /// Whether tokens must claim an accepted `hubUrl` (`requireCorrectHubUrl`).
    pub require_correct_hub_url: bool,
    /// Accepted `hubUrl` claims besides `https://<server_name>` (`validHubUrls`).
    pub valid_hub_urls: Vec<String>,
    /// When set, only these signer addresses may use the hub (`whitelist`).
    pub whitelist: Option<Vec<String>>,
    /// Entries per `list-files` page (`pageSize`, 1 to 4096).
    #[serde(deserialize_with = "page_size")]
    pub page_size: usize,
    /// `Cache-Control` of read responses (the reader's `cacheControl`; empty: none).
    pub cache_control: String,
    /// Revocation times cached in memory (`authTimestampCacheSize`, at least 1).
    #[serde(deserialize_with = "cache_size")]
    pub auth_timestamp_cache_size: usize,
    /// Whether legacy (pre-v1) tokens are accepted, as the hub accepts them. Such a token
    /// signs only the fixed challenge text: it never expires and `revoke-all` cannot stop
    /// it, so a hub whose users all have v1 clients (`@stacks/storage` signs v1) should
    /// turn this off.
    pub allow_legacy_tokens: bool,
}

impl Default for GaiaConfig {
    fn default() -> Self {
        GaiaConfig {
            server_name: "gaia-0".into(),
            read_url: None,
            require_correct_hub_url: false,
            valid_hub_urls: Vec::new(),
            whitelist: None,
            page_size: 100,
            cache_control: "no-cache".into(),
            auth_timestamp_cache_size: 50_000,
            allow_legacy_tokens: true,
        }
    }
}

fn page_size<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    let n = usize::deserialize(d)?;
    if !(1..=4096).contains(&n) {
        return Err(serde::de::Error::custom(
            "page_size must be between 1 and 4096",
        ));
    }
    Ok(n)
}

fn cache_size<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    let n = usize::deserialize(d)?;
    if n == 0 {
        return Err(serde::de::Error::custom(
            "auth_timestamp_cache_size must be at least 1",
        ));
    }
    Ok(n)
}

/// The hub's state beside the node: per-path write queues and cached revocation times.
struct Hub {
    node: Arc<Node>,
    cfg: GaiaConfig,
    auth: AuthSettings,
    queues: Mutex<HashMap<(String, Vec<u8>), PathQueue>>,
    revoked: Mutex<HashMap<String, i64>>,
    /// Revocation locks, one per address hash: a store or delete holds its address's
    /// shared from its last revocation check through its commit, `revoke-all` holds it
    /// exclusively, so no write checked before a revocation commits after it.
    revocation_locks: [parking_lot::RwLock<()>; REVOCATION_STRIPES],
}

/// Stripes of [`Hub::revocation_locks`].
const REVOCATION_STRIPES: usize = 64;

/// Writers of one path: how many are registered, and the lock whose holder commits.
struct PathQueue {
    waiting: usize,
    turn: Arc<tokio::sync::Mutex<()>>,
}

/// A writer's place in a path's queue; leaving (drop) frees it.
struct Ticket {
    hub: Arc<Hub>,
    id: (String, Vec<u8>),
    turn: Arc<tokio::sync::Mutex<()>>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut q = self.hub.queues.lock();
        if let Some(e) = q.get_mut(&self.id) {
            e.waiting -= 1;
            if e.waiting == 0 {
                q.remove(&self.id);
            }
        }
    }
}

/// The Gaia hub's routes.
pub fn routes(node: &Arc<Node>) -> Router<Arc<Node>> {
    let cfg = node.config.gaia.clone();
    let hub = Arc::new(Hub {
        node: node.clone(),
        auth: AuthSettings {
            server_name: cfg.server_name.clone(),
            require_correct_hub_url: cfg.require_correct_hub_url,
            valid_hub_urls: cfg.valid_hub_urls.clone(),
        },
        cfg,
        queues: Mutex::new(HashMap::new()),
        revoked: Mutex::new(HashMap::new()),
        revocation_locks: std::array::from_fn(|_| parking_lot::RwLock::new(())),
    });
    let api = Router::new()
        .route("/hub_info", get(hub_info))
        .route("/hub_info/", get(hub_info))
        .route("/store/{address}/{*path}", post(store))
        .route("/delete/{address}/{*path}", delete(remove))
        .route("/list-files/{address}", post(list_files))
        .route("/list-files/{address}/", post(list_files))
        .route("/list-files/{address}/{*rest}", post(list_files_rest))
        .route("/revoke-all/{address}", post(revoke_all))
        .route("/revoke-all/{address}/", post(revoke_all))
        .route("/revoke-all/{address}/{*rest}", post(revoke_all_rest))
        .layer(axum::middleware::from_fn(hub_cors));
    let reader = Router::new()
        .route("/read/{address}/{*path}", get(read))
        .layer(axum::middleware::from_fn(reader_cors));
    api.merge(reader).with_state(hub)
}

// ----- errors -----

/// A refusal, answered as the hub does: a status and `{message, error}`.
#[derive(Debug)]
enum GaiaError {
    Auth(AuthError),
    BadPath(String),
    DoesNotExist(String),
    Precondition(String),
    TooLarge(String),
    InvalidInput(String),
    /// 400 with a message only (the hub's JSON-body checks).
    BadRequest(String),
    /// 503 with Retry-After: the path's write queue is full.
    Busy(String),
    /// 500 `{message: "Server Error"}`; the cause is logged.
    Server(String),
}

impl From<AuthError> for GaiaError {
    fn from(e: AuthError) -> Self {
        GaiaError::Auth(e)
    }
}

impl From<cairn_core::Error> for GaiaError {
    fn from(e: cairn_core::Error) -> Self {
        GaiaError::Server(e.to_string())
    }
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    message: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
}

fn json(status: StatusCode, body: &impl Serialize) -> Response {
    match serde_json::to_vec(body) {
        Ok(bytes) => (status, [(header::CONTENT_TYPE, "application/json")], bytes).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

impl IntoResponse for GaiaError {
    fn into_response(self) -> Response {
        let (status, name, message) = match &self {
            GaiaError::Auth(AuthError::Validation(m)) => (
                StatusCode::UNAUTHORIZED,
                Some("ValidationError"),
                m.as_str(),
            ),
            GaiaError::Auth(AuthError::Revoked(m)) => (
                StatusCode::UNAUTHORIZED,
                Some("AuthTokenTimestampValidationError"),
                m.as_str(),
            ),
            GaiaError::BadPath(m) => (StatusCode::FORBIDDEN, Some("BadPathError"), m.as_str()),
            GaiaError::DoesNotExist(m) => (StatusCode::NOT_FOUND, Some("DoesNotExist"), m.as_str()),
            GaiaError::Precondition(m) => (
                StatusCode::PRECONDITION_FAILED,
                Some("PreconditionFailedError"),
                m.as_str(),
            ),
            GaiaError::TooLarge(m) => (
                StatusCode::PAYLOAD_TOO_LARGE,
                Some("PayloadTooLargeError"),
                m.as_str(),
            ),
            GaiaError::InvalidInput(m) => (
                StatusCode::BAD_REQUEST,
                Some("InvalidInputError"),
                m.as_str(),
            ),
            GaiaError::BadRequest(m) => (StatusCode::BAD_REQUEST, None, m.as_str()),
            GaiaError::Busy(m) => (
                StatusCode::SERVICE_UNAVAILABLE,
                Some("ServiceUnavailableError"),
                m.as_str(),
            ),
            GaiaError::Server(m) => {
                tracing::error!(error = %m, "gaia hub: server error");
                (StatusCode::INTERNAL_SERVER_ERROR, None, "Server Error")
            }
        };
        let mut resp = json(
            status,
            &ErrorBody {
                message,
                error: name,
            },
        );
        if matches!(self, GaiaError::Busy(_)) {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        resp
    }
}

type HubResult<T> = Result<T, GaiaError>;

/// Runs blocking storage work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> HubResult<T> + Send + 'static,
) -> HubResult<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| GaiaError::Server(format!("storage task failed: {e}")))?
}

// ----- CORS -----

/// The hub's CORS (the `cors` package with origin `*`): preflights answered for every hub
/// route, `Access-Control-Allow-Origin: *` on every answer.
async fn hub_cors(req: Request, next: Next) -> Response {
    if req.method() == Method::OPTIONS {
        // The requested headers echoed, as the hub's `cors()` does: a browser app whose
        // requests carry one more header (tracing, say) works as against Gaia.
        return preflight("DELETE,POST,GET,OPTIONS,HEAD", None, &req);
    }
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    h.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    // Beyond the hub: a browser client may read when to retry a 503 (a full write queue).
    if h.contains_key(header::RETRY_AFTER) {
        h.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static("Retry-After"),
        );
    }
    resp
}

/// The reader's CORS: GET/HEAD/OPTIONS, `Content-Type` and `ETag` exposed.
async fn reader_cors(req: Request, next: Next) -> Response {
    if req.method() == Method::OPTIONS {
        return preflight("GET,HEAD,OPTIONS", None, &req);
    }
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    h.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    h.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static("Content-Type,ETag,Content-Range,Accept-Ranges"),
    );
    resp
}

/// A 204 preflight answer; with no fixed allowed headers, the requested ones are echoed
/// (and `Vary` says so), as the `cors` package does.
fn preflight(methods: &'static str, allowed: Option<&'static str>, req: &Request) -> Response {
    let mut resp = StatusCode::NO_CONTENT.into_response();
    let h = resp.headers_mut();
    h.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static(methods),
    );
    match allowed {
        Some(a) => {
            h.insert(
                header::ACCESS_CONTROL_ALLOW_HEADERS,
                HeaderValue::from_static(a),
            );
        }
        None => {
            h.insert(
                header::VARY,
                HeaderValue::from_static("Access-Control-Request-Headers"),
            );
            if let Some(v) = req.headers().get(header::ACCESS_CONTROL_REQUEST_HEADERS) {
                h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, v.clone());
            }
        }
    }
    h.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("86400"),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
    resp
}

// ----- helpers -----

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn now_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The hub's address pattern for writes: `[a-zA-Z0-9]+`.
fn valid_address(a: &str) -> bool {
    !a.is_empty() && a.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// What the names of the hub's buckets start with; the native API refuses such names, so
/// no one can create (and then write into) the bucket of an address before its owner.
pub const BUCKET_PREFIX: &str = "gaia-";

/// The bucket of a Gaia address: `gaia-<hex of its hash160>` (`None` for a string that is
/// no version-0 P2PKH address, which no token can own).
pub fn bucket_name(address: &str) -> Option<String> {
    auth::address_hash160(address).map(|h| format!("{BUCKET_PREFIX}{}", hex::encode(h)))
}

/// A Gaia file path as the hub takes it: one trailing `/` dropped; `..`, a trailing `/`,
/// NUL bytes, over-long or over-deep paths refused (403).
fn file_path(raw: &str) -> HubResult<String> {
    let p = raw.strip_suffix('/').unwrap_or(raw);
    if p.is_empty() || p.contains("..") || p.ends_with('/') || p.contains('\0') {
        return Err(GaiaError::BadPath("Invalid Path".into()));
    }
    if p.len() > cairn_object::fobject::MAX_KEY_LEN {
        return Err(GaiaError::BadPath("Path is too long".into()));
    }
    if p.split('/').filter(|s| !s.is_empty()).count() > 100 {
        return Err(GaiaError::BadPath("Path is too deep".into()));
    }
    Ok(p.to_string())
}

fn megabytes(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

/// `max_file_upload_size_megabytes`: a whole number when it is one.
fn max_upload_megabytes(bytes: u64) -> serde_json::Value {
    if bytes.is_multiple_of(1 << 20) {
        serde_json::Value::from(bytes >> 20)
    } else {
        serde_json::Value::from(megabytes(bytes))
    }
}

/// A header's bytes as the hub's Node.js reads them: one character per byte (latin1).
fn latin1(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| char::from(b)).collect()
}

/// [`latin1`] back to the header's bytes (a character past U+00FF, which no header
/// brought, becomes `?`).
fn latin1_bytes(s: &str) -> Vec<u8> {
    s.chars()
        .map(|c| u8::try_from(u32::from(c)).unwrap_or(b'?'))
        .collect()
}

fn header_str<'a>(h: &'a HeaderMap, name: &header::HeaderName) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// A conditional header as the hub sees it: every value of it joined with `, ` (as
/// Node.js joins repeated headers), bytes that are not text kept as replacement
/// characters, so an undecodable or repeated condition still applies (and fails to match)
/// rather than being dropped; `None` when absent or empty.
fn condition_header(h: &HeaderMap, name: &header::HeaderName) -> Option<String> {
    let values: Vec<String> = h
        .get_all(name)
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .collect();
    let joined = values.join(", ");
    (!joined.is_empty()).then_some(joined)
}

/// Longest content type a store keeps (longer ones are refused).
const MAX_CONTENT_TYPE: usize = 1024;

/// About the most bytes of JSON one `list-files` page holds (see `list`).
const LIST_PAGE_BYTES: usize = 1 << 20;
/// Keys a listing reads from the store at a time.
const LIST_READ_KEYS: usize = 256;
/// Most head refs one `list-files` request reads (about a millisecond's work): keys that
/// are not files (a file deleted under an archival scope keeps its history on other
/// branches of its key) are read past, and a run of more of them than this ends the page
/// early, with a cursor after the last key read, instead of every page reading them all.
const LIST_READ_REFS: usize = 16 * 1024;

/// What a stored version's context holds: the upload's content type and time.
#[derive(Serialize, Deserialize)]
struct FileMeta {
    gaia: u8,
    content_type: String,
    mtime_ms: u64,
}

impl FileMeta {
    fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The metadata of a version (defaults for one the Gaia hub did not write).
    fn of(context: &[u8]) -> FileMeta {
        serde_json::from_slice::<FileMeta>(context)
            .ok()
            .filter(|m| m.gaia == 1)
            .unwrap_or(FileMeta {
                gaia: 1,
                content_type: "application/octet-stream".into(),
                mtime_ms: 0,
            })
    }
}

/// The ETag of a version: its uid in text form.
fn etag(uid: &Uid) -> String {
    uid.to_string()
}

impl Hub {
    /// `read_url_prefix`: the configured one (ending in `/`), else this node's read
    /// endpoint under the host the client used.
    fn read_prefix(&self, headers: &HeaderMap) -> String {
        if let Some(u) = &self.cfg.read_url {
            return if u.ends_with('/') {
                u.clone()
            } else {
                format!("{u}/")
            };
        }
        let host = header_str(headers, &header::HOST).filter(|h| {
            !h.is_empty()
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
        });
        format!(
            "http://{}/read/",
            host.unwrap_or(self.node.config.listen.as_str())
        )
    }

    /// Checks the token and the whitelist (not revocation).
    fn authenticate(&self, headers: &HeaderMap, address: &str) -> HubResult<Verified> {
        let v = auth::authenticate(
            header_str(headers, &header::AUTHORIZATION),
            address,
            &self.auth,
            now_secs(),
        )?;
        if v.legacy && !self.cfg.allow_legacy_tokens {
            return Err(AuthError::Validation(
                "this hub does not accept legacy authentication tokens (they never expire \
                 and cannot be revoked): sign in again for a v1 token"
                    .into(),
            )
            .into());
        }
        if let Some(list) = &self.cfg.whitelist
            && !list.contains(&v.signer)
        {
            return Err(AuthError::Validation(format!(
                "Address {} not authorized for writes",
                v.signer
            ))
            .into());
        }
        Ok(v)
    }

    /// The bucket of an authenticated address, opened (created on first use). A bucket of
    /// that name registered through the native API (possible before such names were
    /// refused there) is open to anyone through it, so the hub refuses to write into it.
    fn bucket(&self, address: &str) -> HubResult<Arc<Bucket>> {
        let name = self.writable_name(address)?;
        Ok(self.node.bucket(&name)?)
    }

    /// The name of the bucket of `address`, refused when the hub may not write it (an
    /// address without one, or a bucket registered through the native API).
    fn writable_name(&self, address: &str) -> HubResult<String> {
        let name = bucket_name(address).ok_or_else(|| {
            AuthError::Validation("Address not allowed to write on this path".into())
        })?;
        if crate::native::buckets::entry(&self.node, &name)?.is_some() {
            return Err(GaiaError::Server(format!(
                "bucket {name} was registered through the native API, which anyone may \
                 write; the hub will not store into it (remove its registry ref \
                 native/bucket/{name})"
            )));
        }
        Ok(name)
    }

    /// The name of the bucket of an address if the hub ever created it. A bucket of that
    /// name registered through the native API (see [`Hub::bucket`]) is not the hub's: it
    /// is neither served nor listed, as it is not written.
    fn existing_name(&self, address: &str) -> HubResult<Option<String>> {
        let Some(name) = bucket_name(address) else {
            return Ok(None);
        };
        let capsule_ref = format!("bucket-capsule/{name}");
        if self.node.store.get_ref(capsule_ref.as_bytes())?.is_none()
            || crate::native::buckets::entry(&self.node, &name)?.is_some()
        {
            return Ok(None);
        }
        Ok(Some(name))
    }

    /// The bucket of an address if it was ever created (reads never create one).
    fn existing_bucket(&self, address: &str) -> HubResult<Option<Arc<Bucket>>> {
        match self.existing_name(address)? {
            Some(name) => Ok(Some(self.node.bucket(&name)?)),
            None => Ok(None),
        }
    }

    /// A read view of the bucket of an address if it was ever created, without opening
    /// the bucket: opening loads its capsule (the record DAG, replayed from its journal),
    /// which a read does not need, and anonymous reads cycling over more buckets than
    /// `max_open_buckets` made the node reload large capsules over and over.
    fn existing_reader(&self, address: &str) -> HubResult<Option<Arc<Db>>> {
        match self.existing_name(address)? {
            Some(name) => Ok(Some(Arc::new(self.node.db_for(&name)?))),
            None => Ok(None),
        }
    }

    /// The bucket's revocation time (0: none) and the version holding it.
    fn read_revocation(db: &Db) -> HubResult<Option<(i64, Uid)>> {
        match db.get(REVOCATION_KEY, &At::default_branch()) {
            Ok(v) => match v.object.value {
                Value::Integer(t) => Ok(Some((t, v.uid))),
                _ => Err(GaiaError::Server(format!(
                    "bucket {}: the revocation key does not hold an integer",
                    db.bucket()
                ))),
            },
            Err(cairn_core::Error::NotFound(_)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The oldest valid token time of `address`, from the cache or the store.
    fn oldest_valid(&self, address: &str, bucket: &Bucket) -> HubResult<i64> {
        if let Some(t) = self.revoked.lock().get(address) {
            return Ok(*t);
        }
        let t = Self::read_revocation(bucket.db())?.map_or(0, |(t, _)| t);
        self.remember_revocation(address, t);
        Ok(t)
    }

    /// The oldest valid token time of `address` read from the store (the cache may lag a
    /// `revoke-all` that just committed), never lower than the cached one.
    fn current_revocation(&self, address: &str, bucket: &Bucket) -> HubResult<i64> {
        let stored = Self::read_revocation(bucket.db())?.map_or(0, |(t, _)| t);
        self.remember_revocation(address, stored);
        let cached = self.revoked.lock().get(address).copied().unwrap_or(0);
        Ok(stored.max(cached))
    }

    /// The revocation lock of `address` (see [`Hub::revocation_locks`]).
    fn revocation_lock(&self, address: &str) -> &parking_lot::RwLock<()> {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        address.hash(&mut h);
        &self.revocation_locks[(h.finish() % REVOCATION_STRIPES as u64) as usize]
    }

    fn remember_revocation(&self, address: &str, t: i64) {
        let mut c = self.revoked.lock();
        if c.len() >= self.cfg.auth_timestamp_cache_size && !c.contains_key(address) {
            c.clear();
        }
        let e = c.entry(address.to_string()).or_insert(t);
        *e = (*e).max(t);
    }

    /// Joins the write queue of `path` in `bucket`; 503 when it is full.
    fn enqueue(self: &Arc<Self>, bucket: &str, path: &[u8]) -> HubResult<Ticket> {
        let id = (bucket.to_string(), path.to_vec());
        let mut q = self.queues.lock();
        let e = q.entry(id.clone()).or_insert_with(|| PathQueue {
            waiting: 0,
            turn: Arc::new(tokio::sync::Mutex::new(())),
        });
        if e.waiting >= self.node.config.write_queue {
            return Err(GaiaError::Busy(format!(
                "{} writes are already queued on this path; retry later",
                e.waiting
            )));
        }
        e.waiting += 1;
        Ok(Ticket {
            hub: self.clone(),
            id,
            turn: e.turn.clone(),
        })
    }
}

/// The head of a file (its `master` branch), if it exists.
fn head(bucket: &Bucket, key: &[u8]) -> HubResult<Option<Uid>> {
    Ok(bucket.db().branch_head(key, DEFAULT_BRANCH)?)
}

/// The write preconditions of a store, checked against the current head.
#[derive(Clone)]
enum Precondition {
    None,
    /// `If-Match` with this ETag (`*` is no condition).
    Match(String),
    /// `If-None-Match: *`.
    Absent,
}

impl Precondition {
    fn from_headers(h: &HeaderMap) -> HubResult<Self> {
        let m = condition_header(h, &header::IF_MATCH);
        let n = condition_header(h, &header::IF_NONE_MATCH);
        match (m.as_deref(), n.as_deref()) {
            (Some(_), Some(_)) => Err(GaiaError::Precondition(
                "Request should not contain both if-match and if-none-match headers".into(),
            )),
            (None, Some(n)) if n != "*" => Err(GaiaError::Precondition(
                "Misuse of the if-none-match header. Expected to be * on write requests.".into(),
            )),
            (None, Some(_)) => Ok(Precondition::Absent),
            (Some("*"), None) | (None, None) => Ok(Precondition::None),
            (Some(m), None) => Ok(Precondition::Match(m.to_string())),
        }
    }

    fn check(&self, head: Option<Uid>) -> HubResult<()> {
        match self {
            Precondition::None => Ok(()),
            Precondition::Match(tag) => {
                if head.map(|h| etag(&h)).as_deref() == Some(tag.as_str()) {
                    Ok(())
                } else {
                    Err(GaiaError::Precondition(
                        "The provided ETag does not match that of the resource on the server"
                            .into(),
                    ))
                }
            }
            Precondition::Absent => match head {
                Some(_) => Err(GaiaError::Precondition(
                    "The entity you are trying to create already exists".into(),
                )),
                None => Ok(()),
            },
        }
    }
}

// ----- hub_info -----

#[derive(Serialize)]
struct HubInfo {
    challenge_text: String,
    latest_auth_version: &'static str,
    max_file_upload_size_megabytes: serde_json::Value,
    read_url_prefix: String,
}

async fn hub_info(State(hub): State<Arc<Hub>>, headers: HeaderMap) -> Response {
    json(
        StatusCode::OK,
        &HubInfo {
            challenge_text: auth::challenge_text(&hub.cfg.server_name),
            latest_auth_version: auth::LATEST_AUTH_VERSION,
            max_file_upload_size_megabytes: max_upload_megabytes(hub.node.config.max_upload_bytes),
            read_url_prefix: hub.read_prefix(&headers),
        },
    )
}

// ----- store -----

#[derive(Serialize)]
struct WriteResult {
    #[serde(rename = "publicURL")]
    public_url: String,
    etag: String,
}

/// The upload as a blocking reader: counts bytes against the limit and, at the end of the
/// body, waits for the path's turn and re-checks the token's revocation and expiry and the
/// precondition, so the commit that follows is atomic with the checks.
struct Upload<R> {
    inner: R,
    limit: u64,
    max_mb: f64,
    seen: u64,
    at_end: Option<Box<dyn FnOnce() -> HubResult<tokio::sync::OwnedMutexGuard<()>> + Send>>,
    turn: Option<tokio::sync::OwnedMutexGuard<()>>,
    failed: Option<GaiaError>,
}

impl<R: Read> Read for Upload<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.failed.is_some() {
            return Err(io::Error::other("upload refused"));
        }
        let n = self.inner.read(buf)?;
        if n == 0 {
            if let Some(f) = self.at_end.take() {
                match f() {
                    Ok(g) => self.turn = Some(g),
                    Err(e) => {
                        self.failed = Some(e);
                        return Err(io::Error::other("upload refused"));
                    }
                }
            }
            return Ok(0);
        }
        self.seen += n as u64;
        if self.seen > self.limit {
            self.failed = Some(GaiaError::TooLarge(format!(
                "Max file upload size is {} megabytes. Rejected POST body stream of {:.4} megabytes",
                self.max_mb,
                megabytes(self.seen)
            )));
            return Err(io::Error::other("upload too large"));
        }
        Ok(n)
    }
}

async fn store(
    State(hub): State<Arc<Hub>>,
    Path((address, raw_path)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if !valid_address(&address) {
        crate::native::body::drain_refused(body);
        return StatusCode::NOT_FOUND.into_response();
    }
    let permit = match hub.node.write_permit() {
        Ok(p) => p,
        Err(b) => {
            crate::native::body::drain_refused(body);
            return GaiaError::Busy(b.0).into_response();
        }
    };
    // Made here (it needs the runtime handle); read in the blocking task, which opens the
    // gate once the request passed every check made before the body.
    let expects_continue = headers
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let (reader, gate) = BodyReader::gated(body, expects_continue);
    let public_prefix = hub.read_prefix(&headers);
    let h = hub.clone();
    let addr = address.clone();
    let result = blocking(move || {
        let _permit = permit;
        store_blocking(&h, &addr, &raw_path, &headers, reader, gate)
    })
    .await;
    match result {
        Ok((path, uid, bytes)) => {
            hub.node
                .metrics
                .bytes_written
                .with_label_values(&["gaia"])
                .inc_by(bytes);
            json(
                StatusCode::ACCEPTED,
                &WriteResult {
                    public_url: format!("{public_prefix}{address}/{path}"),
                    etag: etag(&uid),
                },
            )
        }
        Err(e) => e.into_response(),
    }
}

/// The name of a `.history.` branch keeping version `uid` of a file (as the hub's
/// `.history.<time>.<id>.` copies): `.history.<ms>.<last 12 hex digits of the uid>`.
fn history_branch(uid: &Uid) -> String {
    // Times strictly increasing within the process (two in one millisecond made "the
    // newest" a tie, which a later store, going on from it, could resolve to the older;
    // across restarts the clock has moved on).
    static LAST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let now = now_millis();
    let prev = LAST
        .fetch_update(
            std::sync::atomic::Ordering::SeqCst,
            std::sync::atomic::Ordering::SeqCst,
            |last| Some(now.max(last.saturating_add(1))),
        )
        .unwrap_or(now);
    let ms = now.max(prev.saturating_add(1));
    let hex = uid.to_string();
    format!(".history.{ms}.{}", &hex[hex.len().saturating_sub(12)..])
}

/// The head of the newest `.history.` branch of `key` (left by a delete under an archival
/// scope), if the key has one.
fn archived_head(bucket: &Bucket, key: &[u8]) -> HubResult<Option<Uid>> {
    // The hub names them with 13-digit times (2001 to 2286), so the newest has the greatest
    // name: found with a few ref reads, however many versions the file's archive holds.
    // Any other name (not the hub's) falls back to reading the whole table.
    match bucket.db().last_tagged_with_prefix(key, ".history.") {
        Ok(None) => return Ok(None),
        Ok(Some((b, u)))
            if b.strip_prefix(".history.")
                .and_then(|r| r.split_once('.'))
                .is_some_and(|(ms, _)| {
                    ms.len() == 13 && ms.bytes().all(|c| c.is_ascii_digit())
                }) =>
        {
            return Ok(Some(u));
        }
        Ok(Some(_)) => {}
        Err(e) => return Err(e.into()),
    }
    let table = match bucket.db().existing_table(key) {
        Ok(t) => t,
        Err(cairn_core::Error::NotFound(_)) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    // `.history.<ms>.<id>`: the newest has the greatest time.
    let newest = table
        .tagged
        .iter()
        .filter_map(|(b, u)| {
            let ms: u64 = b
                .strip_prefix(".history.")?
                .split('.')
                .next()?
                .parse()
                .ok()?;
            Some((ms, b, *u))
        })
        .max();
    Ok(newest.map(|(_, _, u)| u))
}

fn store_blocking<R: Read>(
    hub: &Arc<Hub>,
    address: &str,
    raw_path: &str,
    headers: &HeaderMap,
    reader: R,
    gate: crate::native::body::BodyGate,
) -> HubResult<(String, Uid, u64)> {
    let v = hub.authenticate(headers, address)?;
    // The bucket is created only once the request passed every check before its body: a
    // refused request leaves nothing behind.
    let name = hub.writable_name(address)?;
    let existing = hub.existing_bucket(address)?;
    let oldest_valid = match &existing {
        Some(b) => hub.oldest_valid(address, b)?,
        None => 0,
    };
    v.check_revocation(oldest_valid)?;
    let path = file_path(raw_path)?;
    v.scopes.check_write(address, &path)?;
    let key = path.as_bytes().to_vec();
    let cond = Precondition::from_headers(headers)?;
    // Fail fast, before the body is read; checked again at commit time.
    let current = match &existing {
        Some(b) => head(b, &key)?,
        None => None,
    };
    cond.check(current)?;
    let limit = hub.node.config.max_upload_bytes;
    let max_mb = megabytes(limit);
    if let Some(len) =
        header_str(headers, &header::CONTENT_LENGTH).and_then(|l| l.parse::<u64>().ok())
        && len > limit
    {
        return Err(GaiaError::TooLarge(format!(
            "Max file upload size is {max_mb} megabytes. Rejected Content-Length of {:.4} megabytes",
            megabytes(len)
        )));
    }
    // Kept as the hub keeps it (Node.js reads header bytes as latin1), not dropped for
    // `application/octet-stream` when it holds a byte past ASCII.
    let content_type = headers.get(header::CONTENT_TYPE).map_or_else(
        || "application/octet-stream".to_string(),
        |v| latin1(v.as_bytes()),
    );
    // Counted in the header's bytes (a byte past ASCII is two in the string).
    if content_type.chars().count() > MAX_CONTENT_TYPE {
        return Err(GaiaError::InvalidInput("Invalid content-type".into()));
    }
    let bucket = match existing {
        Some(b) => b,
        None => hub.node.bucket(&name)?,
    };
    let ticket = hub.enqueue(bucket.name(), &key)?;
    // Every check before the body passed (and the writer has its place in the path's
    // queue): the body may come.
    gate.open();
    let guard = match &cond {
        Precondition::Match(tag) => Some(tag.parse::<Uid>().map_err(|_| {
            GaiaError::Precondition(
                "The provided ETag does not match that of the resource on the server".into(),
            )
        })?),
        _ => None,
    };
    let turn = ticket.turn.clone();
    let archival = v.scopes.archival_restricted();
    let mut upload = Upload {
        inner: reader,
        limit,
        max_mb,
        seen: 0,
        // The body ended: this writer's turn, through the last leaves and the commit.
        at_end: Some(Box::new(move || Ok(turn.blocking_lock_owned()))),
        turn: None,
        failed: None,
    };
    // Held from the last revocation check through the commit (see Hub::revocation_locks).
    let mut revocation_held = None;
    let mut refused = None;
    let lock = hub.revocation_lock(address);
    let result = bucket.put_blob_stream_then(
        &key,
        Target::Branch(DEFAULT_BRANCH),
        &mut upload,
        &mut |_| {},
        &mut || {
            // The body may have taken long: a `revoke-all`, the token's `exp` or another
            // writer's change to the file that came meanwhile decides now, under this
            // writer's turn, right before the commit.
            revocation_held = Some(lock.read());
            let checked = (|| -> HubResult<PutOptions> {
                v.check_revocation(hub.current_revocation(address, &bucket)?)?;
                v.check_expiry(now_secs())?;
                let current = head(&bucket, &key)?;
                cond.check(current)?;
                // An archival scope keeps what a store replaces, as the hub's rename of the
                // old file to a `.history.` name does: a branch of its own at the head being
                // replaced, made here, once every check passed (a store refused at commit
                // keeps nothing) and before the commit, so a failure to keep it fails the
                // store (nothing written) rather than leaving the replaced version to a
                // later plain delete and GC with a 202.
                if archival && let Some(old) = current {
                    match bucket.fork(&key, &At::Uid(old), &history_branch(&old)) {
                        Ok(_) | Err(cairn_core::Error::AlreadyExists(_)) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                Ok(PutOptions {
                    guard,
                    // Modified when committed, as the hub's disk driver reports the file's
                    // mtime once written: stamped when the body began, a slow upload that
                    // committed after a quicker one showed an older time than the version
                    // it replaced, and a sync client asking for changes since its last
                    // listing missed it.
                    context: FileMeta {
                        gaia: 1,
                        content_type: content_type.clone(),
                        mtime_ms: now_millis(),
                    }
                    .encode(),
                    // A file deleted under an archival scope kept its versions on a
                    // `.history.` branch: written again, it goes on from the newest of
                    // them (only a key without a `master` head can have one to look for).
                    branch_from: match current {
                        Some(_) => None,
                        None => archived_head(&bucket, &key)?,
                    },
                    // Gaia clients sign tokens, not content.
                    owner_seal: None,
                })
            })();
            checked.map_err(|e| {
                refused = Some(e);
                cairn_core::Error::invalid("the upload was refused at commit")
            })
        },
    );
    drop(revocation_held);
    if let Some(e) = refused {
        upload.failed.get_or_insert(e);
    }
    drop(upload.turn.take());
    drop(ticket);
    match (result, upload.failed) {
        (_, Some(e)) => Err(e),
        (Ok(uid), None) => Ok((path, uid, upload.seen)),
        (Err(cairn_core::Error::GuardMismatch(_)), None) => Err(GaiaError::Precondition(
            "The provided ETag does not match that of the resource on the server".into(),
        )),
        (Err(cairn_core::Error::TypeMismatch(m)), None) => Err(GaiaError::InvalidInput(m)),
        (Err(cairn_core::Error::Io { context, source }), None)
            if context == "reading the input" =>
        {
            Err(GaiaError::BadRequest(format!(
                "reading the request body: {source}"
            )))
        }
        (Err(e), None) => Err(e.into()),
    }
}

// ----- delete -----

async fn remove(
    State(hub): State<Arc<Hub>>,
    Path((address, raw_path)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    if !valid_address(&address) {
        return StatusCode::NOT_FOUND.into_response();
    }
    // A delete commits (and may wait for the path's turn on a blocking thread): counted
    // with the writes, so `max_transfers` and `max_transfers_per_ip` bound them too.
    let permit = match hub.node.write_permit() {
        Ok(p) => p,
        Err(b) => return GaiaError::Busy(b.0).into_response(),
    };
    let h = hub.clone();
    match blocking(move || {
        let _permit = permit;
        remove_blocking(&h, &address, &raw_path, &headers)
    })
    .await
    {
        Ok(()) => StatusCode::ACCEPTED.into_response(),
        Err(e) => e.into_response(),
    }
}

fn remove_blocking(
    hub: &Arc<Hub>,
    address: &str,
    raw_path: &str,
    headers: &HeaderMap,
) -> HubResult<()> {
    let v = hub.authenticate(headers, address)?;
    // Like a store: never into a bucket registered through the native API.
    hub.writable_name(address)?;
    let missing = || GaiaError::DoesNotExist("File does not exist".into());
    let Some(bucket) = hub.existing_bucket(address)? else {
        // Nothing was ever stored, so nothing was revoked either.
        v.check_revocation(0)?;
        let path = file_path(raw_path)?;
        v.scopes.check_delete(address, &path)?;
        return Err(missing());
    };
    v.check_revocation(hub.oldest_valid(address, &bucket)?)?;
    let path = file_path(raw_path)?;
    v.scopes.check_delete(address, &path)?;
    let key = path.as_bytes();
    let ticket = hub.enqueue(bucket.name(), key)?;
    let _turn = ticket.turn.clone().blocking_lock_owned();
    // As for uploads: a `revoke-all` or the token's `exp` that came while this delete
    // waited for its turn stops it, and none can commit between this check and the
    // delete's commit.
    let _revocation = hub.revocation_lock(address).read();
    v.check_revocation(hub.current_revocation(address, &bucket)?)?;
    v.check_expiry(now_secs())?;
    let Some(uid) = head(&bucket, key)? else {
        return Err(missing());
    };
    if v.scopes.archival_restricted() {
        // As the hub renames the file to a `.history.` name, the file's head moves to a
        // branch of its own: the file is gone from reads and listings, and its versions
        // stay (a plain delete drops the head, leaving them to GC).
        let branch = history_branch(&uid);
        return match bucket.rename(key, DEFAULT_BRANCH, &branch) {
            Ok(_) => Ok(()),
            Err(cairn_core::Error::NotFound(_)) => Err(missing()),
            Err(e) => Err(e.into()),
        };
    }
    match bucket.remove(key, DEFAULT_BRANCH) {
        Ok(_) => Ok(()),
        Err(cairn_core::Error::NotFound(_)) => Err(missing()),
        Err(e) => Err(e.into()),
    }
}

// ----- JSON bodies (list-files, revoke-all) -----

/// The hub's limit of JSON bodies (`express.json({limit: 4096})`).
const JSON_LIMIT: usize = 4096;

/// The limit of `list-files` bodies: room for a `page` cursor of the longest name (hex,
/// twice its bytes) besides the hub's 4096 bytes.
const LIST_JSON_LIMIT: usize = JSON_LIMIT + 2 * cairn_object::fobject::MAX_KEY_LEN;

/// The hub parses these bodies with `express.json({limit})`: only JSON content types are
/// parsed (anything else reads as `{}`), bodies over `limit` bytes are refused.
async fn small_json(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> HubResult<serde_json::Map<String, serde_json::Value>> {
    let is_json = header_str(headers, &header::CONTENT_TYPE).is_some_and(|t| {
        let t = t
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        t == "application/json" || (t.starts_with("application/") && t.ends_with("+json"))
    });
    if header_str(headers, &header::CONTENT_LENGTH)
        .and_then(|l| l.parse::<usize>().ok())
        .is_some_and(|l| l > limit)
    {
        return Err(GaiaError::TooLarge("Invalid JSON: too long".into()));
    }
    // Too long is 413; a body that breaks off (a bad chunked encoding, fewer bytes than
    // its Content-Length) is 400.
    let mut bytes = Vec::new();
    let mut stream = body.into_data_stream();
    while let Some(frame) = futures_util::StreamExt::next(&mut stream).await {
        let frame = frame.map_err(|e| {
            GaiaError::BadRequest(format!(
                "Invalid JSON: the body could not be read ({})",
                crate::native::body::body_error(&e)
            ))
        })?;
        if bytes.len() + frame.len() > limit {
            return Err(GaiaError::TooLarge("Invalid JSON: too long".into()));
        }
        bytes.extend_from_slice(&frame);
    }
    if !is_json || bytes.is_empty() {
        return Ok(Default::default());
    }
    match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Ok(serde_json::Value::Object(m)) => Ok(m),
        Ok(serde_json::Value::Array(_)) => Ok(Default::default()),
        _ => Err(GaiaError::BadRequest("Invalid JSON".into())),
    }
}

/// JavaScript truthiness of a JSON value.
fn truthy(v: Option<&serde_json::Value>) -> bool {
    use serde_json::Value as J;
    match v {
        None | Some(J::Null) => false,
        Some(J::Bool(b)) => *b,
        Some(J::Number(n)) => n.as_f64().is_some_and(|x| x != 0.0),
        Some(J::String(s)) => !s.is_empty(),
        Some(J::Array(_)) | Some(J::Object(_)) => true,
    }
}

// ----- list-files -----

/// One entry of a `stat` listing, fields in the hub's order.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StatEntry {
    exists: bool,
    etag: String,
    content_length: u64,
    content_type: String,
    last_modified_date: u64,
    name: String,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Entries {
    Names(Vec<Option<String>>),
    Stats(Vec<Option<StatEntry>>),
}

#[derive(Serialize)]
struct Listing {
    entries: Entries,
    page: Option<String>,
}

async fn list_files(
    State(hub): State<Arc<Hub>>,
    Path(address): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    list_files_at(hub, address, headers, body).await
}

async fn list_files_rest(
    State(hub): State<Arc<Hub>>,
    Path((address, _rest)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    list_files_at(hub, address, headers, body).await
}

async fn list_files_at(hub: Arc<Hub>, address: String, headers: HeaderMap, body: Body) -> Response {
    if !valid_address(&address) {
        return StatusCode::NOT_FOUND.into_response();
    }
    let req = match small_json(&headers, body, LIST_JSON_LIMIT).await {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let page = match req.get("page") {
        p if !truthy(p) => None,
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        Some(other) => Some(other.to_string()),
        None => None,
    };
    let stat = truthy(req.get("stat"));
    // A page is built in memory (about a MiB at most): listings hold a read transfer, so
    // the node's transfer limit bounds how many are built at once.
    let permit = match hub.node.read_permit() {
        Ok(p) => p,
        Err(b) => return GaiaError::Busy(b.0).into_response(),
    };
    let h = hub.clone();
    let answer = blocking(move || list_blocking(&h, &address, &headers, page, stat)).await;
    drop(permit);
    match answer {
        Ok(listing) => json(StatusCode::ACCEPTED, &listing),
        Err(e) => e.into_response(),
    }
}

/// What a `list-files` cursor starts with; the rest is the hex of the last name listed.
const CURSOR_PREFIX: &str = "after-";

/// The `page` that continues a listing after `name`.
fn cursor(name: &[u8]) -> String {
    format!("{CURSOR_PREFIX}{}", hex::encode(name))
}

/// The name a `page` cursor continues after; 400 for anything no listing returned.
fn parse_cursor(page: &str) -> HubResult<Vec<u8>> {
    page.strip_prefix(CURSOR_PREFIX)
        .and_then(|h| hex::decode(h).ok())
        .ok_or_else(|| {
            GaiaError::BadRequest(
                "Invalid page: it must be the `page` value returned by the previous \
                 list-files call (or null for the first page)"
                    .into(),
            )
        })
}

fn is_historical(path: &str) -> bool {
    path.rsplit('/')
        .next()
        .unwrap_or(path)
        .starts_with(".history.")
}

fn list_blocking(
    hub: &Arc<Hub>,
    address: &str,
    headers: &HeaderMap,
    page: Option<String>,
    stat: bool,
) -> HubResult<Listing> {
    let v = hub.authenticate(headers, address)?;
    let empty = |stat: bool| Listing {
        entries: if stat {
            Entries::Stats(Vec::new())
        } else {
            Entries::Names(Vec::new())
        },
        page: None,
    };
    let Some(bucket) = hub.existing_bucket(address)? else {
        v.check_revocation(0)?;
        if let Some(p) = &page {
            parse_cursor(p)?;
        }
        return Ok(empty(stat));
    };
    // The stored time, not only the cache (a cache entry written back stale after a
    // `revoke-all` let a revoked token list the files).
    v.check_revocation(hub.current_revocation(address, &bucket)?)?;
    let mut after = page.as_deref().map(parse_cursor).transpose()?;
    // Keys come in byte order (the native API's `/keys?after=` relies on it too), so the
    // page starts just after the cursor's name: deletes and inserts between pages neither
    // skip nor repeat a name. The store is read a page at a time, not the whole bucket;
    // keys that are not file names (the revocation time's) do not count.
    let mut names: Vec<String> = Vec::new();
    let mut more = true;
    // A page is built in memory: at most about LIST_PAGE_BYTES of it, whatever the page
    // size (names of 4 KiB and content types of 1 KiB, escaped six bytes a character in
    // the worst case, made pages of megabytes that a client could hold by never reading).
    // Cut short, it ends at its last name, and the cursor goes on from there. Keys are
    // read a few hundred at a time, so the names read past the cut are few too.
    let worst = |n: &String| 6 * n.len() + if stat { 6 * MAX_CONTENT_TYPE + 256 } else { 8 };
    let mut bytes = 0usize;
    // Calls that stopped at their share of the ref budget (a call that filled its want
    // of names read what it listed: pages of many names are not cut short).
    let mut spent_calls = 0usize;
    'pages: while more && names.len() < hub.cfg.page_size {
        // Files are keys with a `master` head: a file deleted under an archival scope keeps
        // its history on another branch of its key, and is not listed.
        let want = (hub.cfg.page_size - names.len()).min(LIST_READ_KEYS);
        let (keys, next) = bucket.db().list_keys_page_bounded(
            after.as_deref(),
            want,
            Some(DEFAULT_BRANCH),
            LIST_READ_REFS / 4,
        )?;
        more = next.is_some();
        let listed_all = keys.len();
        // Past the budget (four calls stopped at their share of refs), the page ends
        // here: the cursor goes on after the last key read, listed or not.
        if more && listed_all < want {
            spent_calls += 1;
        }
        let spent = spent_calls >= 4;
        for k in keys {
            after = Some(k.to_vec());
            if k.starts_with(b"\0") {
                continue;
            }
            let Ok(name) = String::from_utf8(k.to_vec()) else {
                continue;
            };
            bytes += worst(&name);
            if bytes > LIST_PAGE_BYTES && !names.is_empty() {
                // This name starts the next page.
                after = names.last().map(|n| n.as_bytes().to_vec());
                more = true;
                break 'pages;
            }
            names.push(name);
        }
        // A call that stopped at its budget goes on after the key it stopped at.
        if let Some(n) = next
            && listed_all < want
        {
            after = Some(n.to_vec());
        }
        if spent {
            break;
        }
    }
    let next = if more {
        after.as_deref().map(cursor)
    } else {
        None
    };
    let archival = v.scopes.archival_restricted();
    let slice = names.iter().filter(|n| !(archival && is_historical(n)));
    let mut listing = if stat {
        let mut out = Vec::new();
        for name in slice {
            // Checked as a read checks it (the version is this file's; a head moved and
            // collected meanwhile is read again).
            let Some(cairn_object::Version { uid, object: o }) = bucket
                .db()
                .branch_version(name.as_bytes(), DEFAULT_BRANCH)?
            else {
                continue;
            };
            let meta = FileMeta::of(&o.context);
            out.push(Some(StatEntry {
                exists: true,
                etag: etag(&uid),
                content_length: value_len(&o.value),
                content_type: meta.content_type,
                last_modified_date: (meta.mtime_ms + 500) / 1000,
                name: name.clone(),
            }));
        }
        Listing {
            entries: Entries::Stats(out),
            page: next,
        }
    } else {
        Listing {
            entries: Entries::Names(slice.cloned().map(Some).collect()),
            page: next,
        }
    };
    // The hub's marker for "more pages, though this one was all history files"; also for
    // a page whose files were all deleted between listing and stat (`@stacks/storage`
    // stops at an empty page, and would miss the files after it).
    if listing.page.is_some() {
        match &mut listing.entries {
            Entries::Names(n) if n.is_empty() => n.push(None),
            Entries::Stats(s) if s.is_empty() => s.push(None),
            _ => {}
        }
    }
    Ok(listing)
}

fn value_len(v: &Value) -> u64 {
    match v {
        Value::Tree(t) => t.count,
        Value::String(b) => b.len() as u64,
        _ => 0,
    }
}

// ----- revoke-all -----

#[derive(Serialize)]
struct Success {
    status: &'static str,
}

async fn revoke_all(
    State(hub): State<Arc<Hub>>,
    Path(address): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    revoke_all_at(hub, address, headers, body).await
}

async fn revoke_all_rest(
    State(hub): State<Arc<Hub>>,
    Path((address, _rest)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    revoke_all_at(hub, address, headers, body).await
}

/// `parseInt` of the hub: leading whitespace, an optional sign, then digits. A JSON number
/// is first turned into text as JavaScript does, so `1e300` ("1e+300") gives 1, as it does
/// for the hub, and never saturates to a revocation that lasts forever.
fn parse_int(v: &serde_json::Value) -> Option<i64> {
    match v {
        serde_json::Value::Number(n) => n.as_i64().or_else(|| n.as_f64().and_then(js_parse_int)),
        serde_json::Value::String(s) => {
            let s = s.trim_start();
            let (neg, digits) = match s.as_bytes().first() {
                Some(b'-') => (true, &s[1..]),
                Some(b'+') => (false, &s[1..]),
                _ => (false, s),
            };
            let end = digits
                .bytes()
                .position(|b| !b.is_ascii_digit())
                .unwrap_or(digits.len());
            let n: i64 = digits[..end].parse().ok()?;
            Some(if neg { -n } else { n })
        }
        _ => None,
    }
}

/// JavaScript's `parseInt(x)` for a number `x`: `String(x)` uses exponent notation from
/// 1e21 up and below 1e-6, and `parseInt` then stops at the `.` or `e`.
fn js_parse_int(x: f64) -> Option<i64> {
    if !x.is_finite() {
        return None;
    }
    let a = x.abs();
    if a != 0.0 && !(1e-6..1e21).contains(&a) {
        // Rust's `{:e}` gives the same leading digits: "1e300", "1.5e-7".
        let text = format!("{a:e}");
        let lead: String = text.chars().take_while(char::is_ascii_digit).collect();
        let d: i64 = lead.parse().ok()?;
        return Some(if x < 0.0 { -d } else { d });
    }
    Some(x.trunc() as i64)
}

async fn revoke_all_at(hub: Arc<Hub>, address: String, headers: HeaderMap, body: Body) -> Response {
    if !valid_address(&address) {
        return StatusCode::NOT_FOUND.into_response();
    }
    let req = match small_json(&headers, body, JSON_LIMIT).await {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    if !truthy(req.get("oldestValidTimestamp")) {
        return GaiaError::BadRequest("Invalid JSON: missing oldestValidTimestamp".into())
            .into_response();
    }
    let ts = match req.get("oldestValidTimestamp").and_then(parse_int) {
        Some(t) if t >= 0 => t,
        _ => {
            return GaiaError::BadRequest(
                "Invalid JSON: oldestValidTimestamp is not a valid integer".into(),
            )
            .into_response();
        }
    };
    let now = now_secs().floor() as i64;
    if ts > now.saturating_add(REVOCATION_SKEW_SECS) {
        return GaiaError::BadRequest(format!(
            "Invalid JSON: oldestValidTimestamp {ts} is in the future: it may be at most \
             {REVOCATION_SKEW_SECS} seconds ahead of the hub's clock ({now} seconds since \
             the epoch)"
        ))
        .into_response();
    }
    // Counted with the writes, as a delete is.
    let permit = match hub.node.write_permit() {
        Ok(p) => p,
        Err(b) => return GaiaError::Busy(b.0).into_response(),
    };
    let h = hub.clone();
    match blocking(move || {
        let _permit = permit;
        revoke_blocking(&h, &address, &headers, ts)
    })
    .await
    {
        Ok(()) => json(StatusCode::ACCEPTED, &Success { status: "success" }),
        Err(e) => e.into_response(),
    }
}

fn revoke_blocking(hub: &Arc<Hub>, address: &str, headers: &HeaderMap, ts: i64) -> HubResult<()> {
    let v = hub.authenticate(headers, address)?;
    // Unlike the hub, only a token that revocation could stop may move the time: a legacy
    // token (never revoked) or a v1 token without `iat` could otherwise set it again and
    // again, and an already revoked token may not move it any further.
    if v.legacy || v.issued_at.is_none() {
        return Err(AuthError::Validation(
            "revoke-all needs a v1 authentication token with an `iat` (issued at) claim; \
             legacy tokens and tokens without `iat` cannot be revoked, so they may not set \
             the revocation time"
                .into(),
        )
        .into());
    }
    // Revoking locks out every other token of the address: a token limited to some paths
    // (an archival-only backup, a collaborator's prefix) may not.
    if !v.scopes.is_unscoped() {
        return Err(AuthError::Validation(
            "revoke-all needs a token without scopes: a token limited to some paths may not \
             revoke the address's other tokens"
                .into(),
        )
        .into());
    }
    // A time at or below the current one changes nothing: answered without the exclusive
    // revocation lock, which would hold up the stores of every address sharing its stripe.
    let current = match hub.existing_bucket(address)? {
        Some(b) => hub.current_revocation(address, &b)?,
        None => 0,
    };
    if ts <= current {
        v.check_revocation(current)?;
        return Ok(());
    }
    let name = hub.writable_name(address)?;
    let ticket = hub.enqueue(&name, REVOCATION_KEY)?;
    let _turn = ticket.turn.clone().blocking_lock_owned();
    // No store or delete of this address commits between this check and this commit.
    let _revocation = hub.revocation_lock(address).write();
    let existing = hub.existing_bucket(address)?;
    let current = match &existing {
        Some(b) => Hub::read_revocation(b.db())?.map_or(0, |(t, _)| t),
        None => 0,
    };
    // Checked under the turn, against the stored time: a revocation that just landed
    // stops this token too.
    v.check_revocation(current)?;
    // Revocation only moves forward: a lower time never re-enables revoked tokens (and
    // a revocation that changes nothing creates no bucket).
    if ts > current {
        let bucket = match existing {
            Some(b) => b,
            None => hub.bucket(address)?,
        };
        bucket.put(
            REVOCATION_KEY,
            Target::Branch(DEFAULT_BRANCH),
            NewValue::Integer(ts),
            &PutOptions::default(),
        )?;
    }
    hub.remember_revocation(address, ts.max(current));
    Ok(())
}

// ----- reads (the reader side-car's job in Gaia) -----

fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        "File not found",
    )
        .into_response()
}

/// [`not_found`] with the reader's `Cache-Control`, which the reader sets before it looks
/// (a CDN in front of `read_url` would otherwise keep a "missing" answer).
fn not_found_cached(hub: &Hub) -> Response {
    let mut r = not_found();
    if let Ok(v) = HeaderValue::from_str(&hub.cfg.cache_control)
        && !hub.cfg.cache_control.is_empty()
    {
        r.headers_mut().insert(header::CACHE_CONTROL, v);
    }
    r
}

/// What a read found: the headers to send and, for a Blob, the tree to stream.
struct Found {
    etag: String,
    content_type: String,
    mtime_ms: u64,
    len: u64,
    body: FoundBody,
}

enum FoundBody {
    Inline(Bytes),
    Blob(Arc<Db>, cairn_object::TreeRef),
}

/// Largest file a read answers from memory, read in the same trip to the blocking pool as
/// its lookup; larger ones stream.
const SMALL_FILE: u64 = 16 << 10;

/// The file `raw_path` of `address`; a small blob comes read already unless `headers_only`.
fn find(hub: &Hub, address: &str, raw_path: &str, headers_only: bool) -> HubResult<Option<Found>> {
    // `<address>-auth/authTimestamp`: where the hub keeps (and reads back) revocations.
    if let Some(owner) = address.strip_suffix("-auth") {
        if raw_path.strip_suffix('/').unwrap_or(raw_path) != "authTimestamp" {
            return Ok(None);
        }
        let Some(db) = hub.existing_reader(owner)? else {
            return Ok(None);
        };
        return Ok(Hub::read_revocation(&db)?.map(|(t, uid)| {
            let text = Bytes::from(t.to_string());
            Found {
                etag: etag(&uid),
                content_type: "text/plain; charset=UTF-8".into(),
                mtime_ms: 0,
                len: text.len() as u64,
                body: FoundBody::Inline(text),
            }
        }));
    }
    let Ok(path) = file_path(raw_path) else {
        return Ok(None);
    };
    let Some(db) = hub.existing_reader(address)? else {
        return Ok(None);
    };
    let Some(cairn_object::Version { uid, object: o }) =
        db.branch_version(path.as_bytes(), DEFAULT_BRANCH)?
    else {
        return Ok(None);
    };
    let meta = FileMeta::of(&o.context);
    let (len, body) = match o.value {
        Value::Tree(t) if o.value.value_type() == ValueType::Blob => {
            if !headers_only && t.count <= SMALL_FILE {
                // Verified leaf by leaf, as a streamed read is.
                let bytes = cairn_object::postree::blob_read(db.chunks(), &t, 0, t.count)?;
                (t.count, FoundBody::Inline(Bytes::from(bytes)))
            } else {
                (t.count, FoundBody::Blob(db.clone(), t))
            }
        }
        Value::String(b) => (b.len() as u64, FoundBody::Inline(b)),
        _ => return Ok(None),
    };
    Ok(Some(Found {
        etag: etag(&uid),
        content_type: meta.content_type,
        mtime_ms: meta.mtime_ms,
        len,
        body,
    }))
}

async fn read(
    State(hub): State<Arc<Hub>>,
    method: Method,
    headers: HeaderMap,
    Path((address, raw_path)): Path<(String, String)>,
) -> Response {
    if address.is_empty()
        || !address
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return not_found_cached(&hub);
    }
    let h = hub.clone();
    let head = method == Method::HEAD;
    let found = match blocking(move || find(&h, &address, &raw_path, head)).await {
        Ok(Some(f)) => f,
        Ok(None) => return not_found_cached(&hub),
        Err(e) => {
            if let GaiaError::Server(m) = &e {
                tracing::error!(error = %m, "gaia read failed");
            }
            return (StatusCode::BAD_REQUEST, "Could not return file").into_response();
        }
    };
    // As the reader's `res.sendFile` does: one byte range (`Range`, honoured when an
    // `If-Range` names this version), and 304 for a matching `If-None-Match` (weak
    // comparison, `*` included).
    let header_str = |n: header::HeaderName| headers.get(n).and_then(|v| v.to_str().ok());
    let names_this = |list: &str| {
        list.split(',').any(|t| {
            let t = t.trim();
            let t = t.strip_prefix("W/").unwrap_or(t).trim_matches('"');
            t == "*" || t == found.etag
        })
    };
    // An `If-Match` naming another version is 412, checked first, as `send` (behind the
    // reader's `res.sendFile`) does: a download resumed with the ETag it started from
    // must not get another version's bytes.
    // Every `If-Match` line counts; an empty one is no condition, as for `send`.
    let if_match: Vec<&str> = headers
        .get_all(header::IF_MATCH)
        .iter()
        .map(|v| v.to_str().unwrap_or("\u{0}"))
        .filter(|v| !v.trim().is_empty())
        .collect();
    if !if_match.is_empty() && !if_match.iter().any(|l| names_this(l)) {
        return (StatusCode::PRECONDITION_FAILED, "Precondition Failed").into_response();
    }
    let not_modified = header_str(header::IF_NONE_MATCH).is_some_and(names_this);
    // If-Range compares strongly (RFC 9110, 13.1.5): the exact ETag, quoted or not; any
    // other value, a date included, serves the whole file.
    let range_applies = match headers.get(header::IF_RANGE) {
        None => true,
        Some(v) => v
            .to_str()
            .is_ok_and(|t| t.trim().trim_matches('"') == found.etag),
    };
    let ranged = header_str(header::RANGE)
        .filter(|_| range_applies)
        .map_or(RangeAsk::Full, |r| parse_range(r, found.len));
    let (status, start, end) = match ranged {
        _ if not_modified => (StatusCode::NOT_MODIFIED, 0, 0),
        RangeAsk::Full => (StatusCode::OK, 0, found.len),
        RangeAsk::Part(s, e) => (StatusCode::PARTIAL_CONTENT, s, e),
        RangeAsk::Unsatisfiable => {
            return (
                StatusCode::RANGE_NOT_SATISFIABLE,
                [
                    (header::CONTENT_RANGE, format!("bytes */{}", found.len)),
                    (header::ACCEPT_RANGES, "bytes".to_string()),
                ],
            )
                .into_response();
        }
    };
    let mut b = Response::builder()
        .status(status)
        .header(header::ETAG, found.etag.as_str());
    if !hub.cfg.cache_control.is_empty() {
        b = b.header(header::CACHE_CONTROL, hub.cfg.cache_control.as_str());
    }
    if found.mtime_ms > 0 {
        let t = UNIX_EPOCH + Duration::from_millis(found.mtime_ms);
        b = b.header(header::LAST_MODIFIED, httpdate::fmt_http_date(t));
    }
    if status == StatusCode::NOT_MODIFIED {
        return b
            .body(Body::empty())
            .unwrap_or_else(|_| StatusCode::NOT_MODIFIED.into_response());
    }
    let n = end - start;
    b = b
        .header(header::CONTENT_TYPE, latin1_bytes(&found.content_type))
        .header(header::ACCEPT_RANGES, "bytes")
        .header(header::CONTENT_LENGTH, n);
    if status == StatusCode::PARTIAL_CONTENT {
        b = b.header(
            header::CONTENT_RANGE,
            format!("bytes {start}-{}/{}", end - 1, found.len),
        );
    }
    let body = if method == Method::HEAD {
        Body::empty()
    } else {
        let body = match found.body {
            FoundBody::Inline(bytes) => {
                // `start..end` lies within the file (`parse_range` clamps it).
                Body::from(bytes.slice(start as usize..end as usize))
            }
            FoundBody::Blob(db, tree) => match hub.node.read_permit() {
                Ok(permit) => stream_blob(&hub, db, tree, start, n, permit),
                Err(b) => return GaiaError::Busy(b.0).into_response(),
            },
        };
        hub.node
            .metrics
            .bytes_read
            .with_label_values(&["gaia"])
            .inc_by(n);
        body
    };
    b.body(body)
        .unwrap_or_else(|_| (StatusCode::BAD_REQUEST, "Could not return file").into_response())
}

/// Streams `len` bytes of a Blob tree from `start`, from a blocking task through a small channel
/// ([`crate::native::body::produce_as`]), fetching and verifying leaves on a few threads
/// ([`crate::native::values::send_tree_range`]), so a read holds a few windows in memory
/// whatever the file's size. A client that goes away closes the channel, which ends the
/// task.
fn stream_blob(
    hub: &Hub,
    db: Arc<Db>,
    tree: cairn_object::TreeRef,
    start: u64,
    len: u64,
    permit: crate::node::Transfer,
) -> Body {
    crate::native::body::produce_as(hub.node.clone(), None, permit, move |w| {
        crate::native::values::send_tree_range(&db, &tree, start, len, w)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revocation_times_parse_as_javascript_parse_int() {
        use serde_json::json;
        for (v, want) in [
            (json!(1700000000), Some(1700000000)),
            (json!(1700000000.9), Some(1700000000)),
            (json!(1e300), Some(1)),
            (json!(-2.5e30), Some(-2)),
            (json!(1.5e-7), Some(1)),
            (json!(" 42abc"), Some(42)),
            (json!("abc"), None),
            (json!(true), None),
        ] {
            assert_eq!(parse_int(&v), want, "{v}");
        }
    }

    #[test]
    fn conditions_that_are_not_text_or_repeated_still_apply() {
        let with = |name: header::HeaderName, values: &[&[u8]]| {
            let mut h = HeaderMap::new();
            for v in values {
                h.append(name.clone(), HeaderValue::from_bytes(v).unwrap());
            }
            Precondition::from_headers(&h)
        };
        // Not dropped (which made the write unconditional): they can only fail to match.
        match with(header::IF_MATCH, &[b"stale-\xe9tag"]) {
            Ok(Precondition::Match(tag)) => assert!(tag.starts_with("stale-")),
            _ => panic!("an undecodable If-Match was not kept"),
        }
        match with(header::IF_MATCH, &[b"*", b"abc"]) {
            Ok(Precondition::Match(tag)) => assert_eq!(tag, "*, abc"),
            _ => panic!("a repeated If-Match was not kept"),
        }
        assert!(matches!(
            with(header::IF_NONE_MATCH, &[b"\xe9"]),
            Err(GaiaError::Precondition(_))
        ));
        assert!(matches!(
            with(header::IF_MATCH, &[b"*"]),
            Ok(Precondition::None)
        ));
    }

    #[test]
    fn gaia_table_parses_and_refuses_typos_and_bad_values() {
        let c: crate::config::Config = toml::from_str(
            "[gaia]\nserver_name = \"hub.example\"\nread_url = \"https://r.example\"\n\
             require_correct_hub_url = true\nvalid_hub_urls = [\"https://a\"]\n\
             whitelist = [\"1abc\"]\npage_size = 7\ncache_control = \"\"\n",
        )
        .unwrap();
        assert_eq!(c.gaia.server_name, "hub.example");
        assert_eq!(c.gaia.page_size, 7);
        assert_eq!(c.gaia.whitelist.as_deref(), Some(&["1abc".to_string()][..]));
        assert_eq!(c.gaia.auth_timestamp_cache_size, 50_000);
        for bad in [
            "[gaia]\nservername = \"x\"",
            "[gaia]\npage_size = 0",
            "[gaia]\npage_size = 5000",
            "[gaia]\nauth_timestamp_cache_size = 0",
        ] {
            assert!(
                toml::from_str::<crate::config::Config>(bad).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn list_cursors_round_trip_and_fit_a_list_files_body() {
        let longest = "\u{7f}".repeat(cairn_object::fobject::MAX_KEY_LEN);
        for name in ["f0", "dir/é.txt", longest.as_str()] {
            let c = cursor(name.as_bytes());
            assert_eq!(parse_cursor(&c).unwrap(), name.as_bytes());
            let body = serde_json::json!({ "page": c, "stat": true }).to_string();
            assert!(body.len() <= LIST_JSON_LIMIT, "{}", body.len());
        }
        for bad in ["", "1", "42", "after-0", "after-zz", "f0"] {
            assert!(parse_cursor(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn paths_limits_and_int_parsing() {
        assert_eq!(file_path("a/b.txt/").unwrap(), "a/b.txt");
        for bad in ["", "/", "a..b", "a//", "a\0b"] {
            assert!(file_path(bad).is_err(), "{bad:?}");
        }
        assert!(file_path(&"a/".repeat(101)).is_err());
        assert_eq!(max_upload_megabytes(5 << 30), serde_json::json!(5120));
        assert_eq!(max_upload_megabytes(3 << 19), serde_json::json!(1.5));
        assert_eq!(parse_int(&serde_json::json!(" 12x")), Some(12));
        assert_eq!(parse_int(&serde_json::json!("-3")), Some(-3));
        assert_eq!(parse_int(&serde_json::json!(7.9)), Some(7));
        assert_eq!(parse_int(&serde_json::json!("abc")), None);
        assert_eq!(parse_int(&serde_json::json!(true)), None);
        assert!(bucket_name("1BgGZ9tcN4rm9KBzDn7KprQz87SZ26SAMH").is_some());
        assert!(bucket_name("nope").is_none());
    }
}

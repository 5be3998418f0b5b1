//! Objects: read (whole, by range, typed as text or JSON), write (streamed, typed, guarded),
//! update by a type operation, remove a branch, and a version's metadata.
//!
//! A version is chosen by `?branch=` (default `master`) or `?uid=`. Responses carry
//! `ETag: "<uid>"` and `X-Cairn-Type`. A PUT streams a blob (the default type) or a
//! text list into the store in constant memory; other types are buffered (at most
//! [`BUFFERED_LIMIT`] bytes and [`body::MAX_BUFFERED_ELEMENTS`] elements). `If-Match:
//! "<uid>"` makes the write conditional on the branch head, checked atomically with the
//! write (412 otherwise). A write larger than `max_upload_bytes` is refused with 413 and
//! creates no version.
//!
//! Every route here that reads a body (PUT, PATCH, DELETE) or sends one (GET) holds a
//! transfer ([`body::transfer_permit`], 503 with `Retry-After` when `max_transfers` are in
//! progress), taken before anything else, the request signature included; responses
//! stream through [`produce`], so a client that reads nothing for the stall timeout is cut
//! and frees its transfer and memory. A whole value of at most 16 KiB (text form) is the
//! exception: it is read and rendered in one trip to the blocking pool and sent from
//! memory, its transfer given back at once (at most `max_connections` × 16 KiB held).

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use cairn_core::Error;
use cairn_object::branch::check_branch_name;
use cairn_object::fobject::check_key;
use cairn_object::{At, DEFAULT_BRANCH, NewValue, Op, PutOptions, Target, Uid, Value, ValueType};
use serde::Deserialize;
use serde_json::json;

use super::body::{self, CheckedReader, produce};
use super::buckets::{self, open_for_write};
use super::error::{ApiError, ApiResult, blocking};
use super::values::{self, json_bytes};
use super::{KeyPath, VersionQuery, etag, parse_uid, query};
use crate::node::Node;

/// Largest body buffered in memory: typed values other than blobs and text lists, JSON.
pub const BUFFERED_LIMIT: u64 = 64 << 20;
/// Largest body of a control request (PATCH, DELETE, POST with a JSON body).
pub const CONTROL_LIMIT: u64 = 16 << 20;

/// The most a control body (a PATCH, DELETE, fork, merge or rename) may hold on `node`:
/// [`CONTROL_LIMIT`], or `max_upload_bytes` when smaller, which bounds every body (a PATCH
/// appending to a value took 16 MiB where a PUT of 1000 bytes was refused).
pub fn control_limit(node: &Node) -> u64 {
    CONTROL_LIMIT.min(node.config.max_upload_bytes)
}
/// Largest value a GET answers from memory, read and rendered in one trip to the blocking
/// pool; larger ones stream.
const SMALL_BODY: u64 = 16 << 10;

/// The response header naming a value's type.
pub const TYPE_HEADER: &str = "x-cairn-type";

fn type_header(ty: ValueType) -> (HeaderName, HeaderValue) {
    (
        HeaderName::from_static(TYPE_HEADER),
        HeaderValue::from_static(ty.name()),
    )
}

fn etag_header(uid: &Uid) -> ApiResult<(HeaderName, HeaderValue)> {
    let v = HeaderValue::from_str(&etag(uid))
        .map_err(|_| ApiError::internal("a uid does not fit a header"))?;
    Ok((header::ETAG, v))
}

/// True when the client asks for JSON (`Accept`, a list of media ranges).
pub fn accepts_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',').any(|part| {
                let mime = part.split(';').next().unwrap_or("").trim();
                mime.eq_ignore_ascii_case("application/json")
            })
        })
}

/// Whether the body is JSON: exactly one `Content-Type`, whose media type (what comes
/// before any `;`) is `application/json`. A comma separates nothing here, unlike in
/// `Accept` ([`accepts_json`]): `text/plain;,application/json` is plain text to a browser,
/// which sends it across sites without asking first, so it must not pass for JSON.
pub fn is_json_body(headers: &HeaderMap) -> bool {
    let mut all = headers.get_all(header::CONTENT_TYPE).iter();
    match (all.next(), all.next()) {
        (Some(v), None) => v.to_str().is_ok_and(|v| {
            v.split(';')
                .next()
                .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
        }),
        _ => false,
    }
}

/// The guard of a write (`PUT`, `PATCH`, `DELETE` of an object): its `If-Match`.
/// `If-None-Match` is refused rather than ignored (a create-only `*` would otherwise
/// overwrite silently): guard with `If-Match` and the head's ETag.
fn write_guard(headers: &HeaderMap) -> ApiResult<Option<Uid>> {
    if headers.contains_key(header::IF_NONE_MATCH) {
        return Err(ApiError::bad_request(
            "If-None-Match is not supported on writes; guard with If-Match and the head's ETag",
        ));
    }
    if_match(headers)
}

/// The uid named by `If-Match: "<uid>"`, if the header is present.
fn if_match(headers: &HeaderMap) -> ApiResult<Option<Uid>> {
    let Some(v) = headers.get(header::IF_MATCH) else {
        return Ok(None);
    };
    if headers.get_all(header::IF_MATCH).iter().nth(1).is_some() {
        return Err(ApiError::bad_request(
            "If-Match must be given once, as one quoted version id",
        ));
    }
    let s = v
        .to_str()
        .map_err(|_| ApiError::bad_request("If-Match is not ASCII text"))?
        .trim();
    let inner = s
        .strip_prefix('"')
        .and_then(|x| x.strip_suffix('"'))
        .ok_or_else(|| {
            ApiError::bad_request(
                "If-Match must be one quoted version id, \"<uid>\" (no lists, no *, no W/)",
            )
        })?;
    parse_uid(inner).map(Some)
}

/// Whether a read's `If-Match` fails for the representation tagged `tag` (RFC 9110
/// §13.1.1: a list of entity tags, compared strongly, so `W/` tags never match, or `*`;
/// `tag` is `None` when there is no representation). A read must answer 412 then: a
/// client resuming a download with `Range` and the ETag it started from would otherwise be
/// sent another version's bytes to splice onto the first one's.
fn read_match_fails(if_match: &[HeaderValue], tag: Option<&str>) -> bool {
    !if_match.is_empty()
        && !if_match.iter().any(|v| {
            v.to_str().is_ok_and(|v| {
                v.split(',').any(|t| {
                    let t = t.trim();
                    tag.is_some() && (t == "*" || Some(t) == tag)
                })
            })
        })
}

/// A request's `If-Match` values (none, without allocating, when it has none).
fn if_match_values(headers: &HeaderMap) -> Vec<HeaderValue> {
    headers.get_all(header::IF_MATCH).iter().cloned().collect()
}

/// 412 for a read whose `If-Match` names another version (see [`read_match_fails`]).
fn read_precondition_failed() -> ApiError {
    ApiError::from(Error::GuardMismatch(
        "If-Match names another version than the one this read would send".into(),
    ))
}

fn if_none_match_hits(headers: &HeaderMap, tag: &str) -> bool {
    none_match_hits(headers.get(header::IF_NONE_MATCH), tag)
}

/// [`if_none_match_hits`] on the header's value.
fn none_match_hits(value: Option<&HeaderValue>, tag: &str) -> bool {
    value.and_then(|v| v.to_str().ok()).is_some_and(|v| {
        v.split(',').any(|t| {
            let t = t.trim();
            t == "*" || t.strip_prefix("W/").unwrap_or(t) == tag
        })
    })
}

/// What a `Range` header asks of a representation of `len` bytes.
#[derive(Debug, PartialEq, Eq)]
pub enum RangeAsk {
    /// No usable range: send everything (absent, another unit, several ranges, bad syntax).
    Full,
    /// Bytes `start..end` (end exclusive).
    Part(u64, u64),
    /// No byte of the range exists: 416.
    Unsatisfiable,
}

/// Parses one `bytes=` range (RFC 9110 §14.1.2). Several ranges are served as the whole
/// representation, which the RFC allows.
pub fn parse_range(h: &str, len: u64) -> RangeAsk {
    // The unit is case-insensitive (RFC 9110, 14.1).
    let h = h.trim();
    let Some(spec) = h
        .get(..6)
        .filter(|u| u.eq_ignore_ascii_case("bytes="))
        .map(|_| &h[6..])
    else {
        return RangeAsk::Full;
    };
    if spec.contains(',') {
        return RangeAsk::Full;
    }
    let Some((a, b)) = spec.trim().split_once('-') else {
        return RangeAsk::Full;
    };
    let (a, b) = (a.trim(), b.trim());
    // Digits only; a number past u64 (larger than any blob) reads as u64::MAX, so a last
    // position beyond the end is clamped as for any other large one.
    let num = |s: &str| -> Option<u64> {
        if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
            None
        } else {
            Some(s.parse().unwrap_or(u64::MAX))
        }
    };
    if a.is_empty() {
        // Suffix range: the last n bytes.
        return match num(b) {
            None => RangeAsk::Full,
            Some(0) => RangeAsk::Unsatisfiable,
            Some(_) if len == 0 => RangeAsk::Unsatisfiable,
            Some(n) => RangeAsk::Part(len.saturating_sub(n), len),
        };
    }
    let Some(first) = num(a) else {
        return RangeAsk::Full;
    };
    let last = if b.is_empty() {
        None
    } else {
        match num(b) {
            Some(l) if l >= first => Some(l),
            _ => return RangeAsk::Full,
        }
    };
    if first >= len {
        return RangeAsk::Unsatisfiable;
    }
    let end = last.map_or(len, |l| l.saturating_add(1).min(len));
    RangeAsk::Part(first, end)
}

/// `GET /v1/buckets/{bucket}/objects/{key}`: the value (see the module documentation).
/// The answer varies with `Accept` (text or JSON under one ETag), and says so: a cache
/// would otherwise answer a JSON request with the text it kept.
pub async fn get(
    state: State<Arc<Node>>,
    path: KeyPath,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let mut resp = get_value(state, path, method, uri, headers).await?;
    resp.headers_mut()
        .insert(header::VARY, HeaderValue::from_static("accept"));
    Ok(resp)
}

async fn get_value(
    State(node): State<Arc<Node>>,
    KeyPath { bucket, key }: KeyPath,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> ApiResult<Response> {
    // HEAD answers the same headers with no body.
    let head = method == Method::HEAD;
    let at = query::<VersionQuery>(&uri)?.at()?;
    // A GET holds a transfer from before the value is read (an inline value is in memory
    // from then on) until its response is sent or cut. A HEAD holds one while it loads
    // the version (an inline value of 16 MiB decodes to more): it reads from the store.
    let head_permit = if head {
        Some(body::transfer_permit(&node)?)
    } else {
        None
    };
    let permit = if head {
        None
    } else {
        Some(body::transfer_permit(&node)?)
    };
    let b = buckets::open(&node, &bucket).await?.bucket;
    let bb = b.clone();
    let json = accepts_json(&headers);
    // A small value whole (no Range asked): its text form is made in the same trip to the
    // blocking pool as the read, and sent from memory.
    let whole = !head && !json && !headers.contains_key(header::RANGE);
    let conditional = headers.get(header::IF_NONE_MATCH).cloned();
    let must_match = if_match_values(&headers);
    let (v, small) = blocking(move || {
        let v = match bb.db().get(key.as_bytes(), &at) {
            // `If-Match` fails when there is nothing to match (RFC 9110 §13.1.1).
            Err(Error::NotFound(_)) if read_match_fails(&must_match, None) => {
                return Err(read_precondition_failed());
            }
            v => v?,
        };
        // A GET answered 304 or 412 reads nothing of the value.
        let unchanged = none_match_hits(conditional.as_ref(), &etag(&v.uid))
            || read_match_fails(&must_match, Some(&etag(&v.uid)));
        let small = match &v.object.value {
            _ if !whole || unchanged => None,
            Value::Tree(t) if t.kind == cairn_object::TreeKind::Blob && t.count <= SMALL_BODY => {
                let mut out = Vec::with_capacity(t.count as usize);
                values::write_text(bb.db(), &v.object.value, &mut out)?;
                Some(out)
            }
            Value::Tree(_) => None,
            inline => match values::text_len(inline) {
                Some(n) if n <= SMALL_BODY => {
                    let mut out = Vec::with_capacity(n as usize);
                    values::write_text(bb.db(), inline, &mut out)?;
                    Some(out)
                }
                _ => None,
            },
        };
        Ok((v, small))
    })
    .await?;
    drop(head_permit);
    let tag = etag(&v.uid);
    let etag_h = etag_header(&v.uid)?;
    let value = v.object.value;
    let ty = value.value_type();
    // If-Match first, then If-None-Match (RFC 9110 §13.2.2).
    if read_match_fails(&if_match_values(&headers), Some(&tag)) {
        return Err(read_precondition_failed());
    }
    if if_none_match_hits(&headers, &tag) {
        return Ok((StatusCode::NOT_MODIFIED, [etag_h, type_header(ty)]).into_response());
    }
    if let Some(body) = small {
        // In memory now: the transfer is not needed to send it.
        drop(permit);
        node.metrics
            .bytes_read
            .with_label_values(&["native"])
            .inc_by(body.len() as u64);
        let ctype = match ty {
            ValueType::Blob | ValueType::String => "application/octet-stream",
            _ => "text/plain; charset=utf-8",
        };
        let n = body.len();
        let mut resp = (
            [
                etag_h,
                type_header(ty),
                (header::CONTENT_TYPE, HeaderValue::from_static(ctype)),
            ],
            Body::from(body),
        )
            .into_response();
        let h = resp.headers_mut();
        if ty == ValueType::Blob {
            h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
        }
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
        return Ok(resp);
    }
    let ok_headers = |ctype: &'static str| {
        [
            etag_h.clone(),
            type_header(ty),
            (header::CONTENT_TYPE, HeaderValue::from_static(ctype)),
        ]
    };
    match &value {
        Value::Tree(t) if ty == ValueType::Blob => {
            let len = t.count;
            let ranged = headers
                .get(header::RANGE)
                .and_then(|r| r.to_str().ok())
                .filter(|_| {
                    // If-Range: honour the range only when the version is the one named.
                    headers
                        .get(header::IF_RANGE)
                        .is_none_or(|ir| ir.to_str().is_ok_and(|s| s.trim() == tag))
                })
                .map_or(RangeAsk::Full, |r| parse_range(r, len));
            let (status, start, end) = match ranged {
                RangeAsk::Full => (StatusCode::OK, 0, len),
                RangeAsk::Part(s, e) => (StatusCode::PARTIAL_CONTENT, s, e),
                RangeAsk::Unsatisfiable => {
                    return Err(ApiError::new(
                        StatusCode::RANGE_NOT_SATISFIABLE,
                        "range_not_satisfiable",
                        format!("the blob has {len} bytes"),
                    )
                    .with_header(
                        header::CONTENT_RANGE,
                        HeaderValue::from_str(&format!("bytes */{len}"))
                            .map_err(|_| ApiError::internal("bad Content-Range"))?,
                    )
                    .with_header(header::ACCEPT_RANGES, HeaderValue::from_static("bytes")));
                }
            };
            let n = end - start;
            let body = match permit {
                None => Body::empty(),
                Some(permit) => produce(node.clone(), permit, move |w| {
                    values::send_blob_range(b.db(), &value, start, n, w)
                }),
            };
            let mut resp = (status, ok_headers("application/octet-stream"), body).into_response();
            let h = resp.headers_mut();
            h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
            h.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
            if status == StatusCode::PARTIAL_CONTENT {
                let cr = format!("bytes {start}-{}/{len}", end - 1);
                h.insert(
                    header::CONTENT_RANGE,
                    HeaderValue::from_str(&cr)
                        .map_err(|_| ApiError::internal("bad Content-Range"))?,
                );
            }
            Ok(resp)
        }
        _ => {
            // Trees (lists, sets, maps) and inline values alike: written into the
            // response as it is sent, never rendered whole.
            let len = if json { None } else { values::text_len(&value) };
            let body = match permit {
                None => Body::empty(),
                Some(permit) => produce(node.clone(), permit, move |w| {
                    if json {
                        values::write_json(b.db(), &value, w)
                    } else {
                        values::write_text(b.db(), &value, w)
                    }
                }),
            };
            let ctype = match (json, ty) {
                (true, _) => "application/json",
                (false, ValueType::String) => "application/octet-stream",
                (false, _) => "text/plain; charset=utf-8",
            };
            let mut resp = (ok_headers(ctype), body).into_response();
            if let Some(n) = len {
                resp.headers_mut()
                    .insert(header::CONTENT_LENGTH, HeaderValue::from(n));
            }
            Ok(resp)
        }
    }
}

/// The media type of a verified stream of a version ([`cairn_object::stream`]).
pub const VERSION_STREAM_TYPE: &str = "application/vnd.cairn.version-stream";

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct StreamQuery {
    branch: Option<String>,
    uid: Option<String>,
    /// Only the Meta chunk (the version without its content).
    #[serde(default)]
    meta: bool,
}

/// `GET /v1/buckets/{bucket}/stream/{key}`: the version as a verified stream (its Meta
/// chunk, then every POS-tree node in pre-order, each length-prefixed), so a client that
/// trusts only a uid checks every byte before using it. `?meta=true` sends the Meta chunk
/// alone. `ETag` names the version sent.
pub async fn stream(
    State(node): State<Arc<Node>>,
    KeyPath { bucket, key }: KeyPath,
    method: Method,
    uri: Uri,
    req_headers: HeaderMap,
) -> ApiResult<Response> {
    let q = query::<StreamQuery>(&uri)?;
    let at = super::version_at(q.branch, q.uid)?;
    // (A HEAD holds one while it loads the version, as `get` does.)
    let head_permit = if method == Method::HEAD {
        Some(body::transfer_permit(&node)?)
    } else {
        None
    };
    let permit = if method == Method::HEAD {
        None
    } else {
        Some(body::transfer_permit(&node)?)
    };
    let b = buckets::open(&node, &bucket).await?.bucket;
    let bb = b.clone();
    let must_match = if_match_values(&req_headers);
    let v = blocking(move || match bb.db().get(key.as_bytes(), &at) {
        Err(Error::NotFound(_)) if read_match_fails(&must_match, None) => {
            Err(read_precondition_failed())
        }
        v => Ok(v?),
    })
    .await?;
    drop(head_permit);
    // An `If-Match` naming another version: 412, as for a read of the value.
    if read_match_fails(&if_match_values(&req_headers), Some(&etag(&v.uid))) {
        return Err(read_precondition_failed());
    }
    let headers = [
        etag_header(&v.uid)?,
        type_header(v.object.value_type()),
        (
            header::CONTENT_TYPE,
            HeaderValue::from_static(VERSION_STREAM_TYPE),
        ),
    ];
    let body = match permit {
        None => Body::empty(),
        Some(permit) => produce(node.clone(), permit, move |w| {
            let mut out = |piece| w.write_shared(piece);
            if q.meta {
                cairn_object::stream::send_meta(&v.object, &mut out)
            } else {
                cairn_object::stream::send_version(b.db().chunks(), &v.object, &mut out)
            }
        }),
    };
    Ok((headers, body).into_response())
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct PutQuery {
    branch: Option<String>,
    base: Option<String>,
    #[serde(rename = "type")]
    ty: Option<String>,
}

/// Where a write goes, owned (a [`Target`] borrows the branch name).
#[derive(Clone)]
enum Dest {
    Branch(String),
    Base(Uid),
}

impl Dest {
    fn target(&self) -> Target<'_> {
        match self {
            Dest::Branch(b) => Target::Branch(b),
            Dest::Base(u) => Target::Base(*u),
        }
    }

    fn json(&self) -> (&'static str, String) {
        match self {
            Dest::Branch(b) => ("branch", b.clone()),
            Dest::Base(u) => ("base", u.to_string()),
        }
    }
}

fn dest(branch: Option<String>, base: Option<String>, guard: Option<Uid>) -> ApiResult<Dest> {
    match (branch, base) {
        (Some(_), Some(_)) => Err(ApiError::bad_request(
            "give ?branch= (a branch head) or ?base= (a new untagged head), not both",
        )),
        (_, Some(u)) => {
            if guard.is_some() {
                return Err(ApiError::bad_request(
                    "If-Match guards a branch head, not a write on a base version",
                ));
            }
            Ok(Dest::Base(parse_uid(&u)?))
        }
        (b, None) => {
            let b = b.unwrap_or_else(|| DEFAULT_BRANCH.to_string());
            check_branch_name(&b)?;
            Ok(Dest::Branch(b))
        }
    }
}

/// The owner seal a put carries ([`OWNER_SEAL_HEADER`]: the hex of
/// `cairn_capsule::OwnerSeal::encode`), checked for form here and against the version by
/// the bucket before the put is recorded. One copy at most.
fn owner_seal(headers: &HeaderMap) -> ApiResult<Option<Vec<u8>>> {
    let mut all = headers.get_all(OWNER_SEAL_HEADER).iter();
    let Some(v) = all.next() else {
        return Ok(None);
    };
    if all.next().is_some() {
        return Err(ApiError::bad_request(format!(
            "{OWNER_SEAL_HEADER} is given more than once"
        )));
    }
    let bytes = v
        .to_str()
        .ok()
        .and_then(|s| hex::decode(s.trim()).ok())
        .ok_or_else(|| ApiError::bad_request(format!("{OWNER_SEAL_HEADER} is not hex")))?;
    let seal = cairn_capsule::OwnerSeal::decode(&bytes)
        .map_err(|e| ApiError::bad_request(format!("{OWNER_SEAL_HEADER}: {e}")))?;
    // Dated as a signed request is: an honest node records no seal made long before (a
    // replay of an old one, which a reader of one proof could not tell from a new one).
    let now = super::auth::now_secs();
    if seal.date.abs_diff(now) > super::auth::WINDOW_SECS {
        return Err(ApiError::bad_request(format!(
            "the owner seal is dated {}, more than {} s from the node's clock ({now}): seal \
             the put anew",
            seal.date,
            super::auth::WINDOW_SECS
        )));
    }
    Ok(Some(bytes))
}

/// The header of a put that carries its owner seal (see `docs/node.md`, "Owner seals").
pub const OWNER_SEAL_HEADER: &str = "x-cairn-owner-seal";

/// The body length a request declares (`Content-Length`), if it declares one.
pub(crate) fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

fn written(node: &Node, key: &str, dest: &Dest, uid: Uid, n: u64, status: StatusCode) -> Response {
    node.metrics
        .bytes_written
        .with_label_values(&["native"])
        .inc_by(n);
    let (field, value) = dest.json();
    let body = json!({ "uid": uid.to_string(), "key": key, field: value });
    let mut resp = (status, Json(body)).into_response();
    if let Ok(v) = HeaderValue::from_str(&etag(&uid)) {
        resp.headers_mut().insert(header::ETAG, v);
    }
    resp
}

/// `PUT /v1/buckets/{bucket}/objects/{key}`: writes a new version.
#[allow(clippy::too_many_arguments)]
pub async fn put(
    State(node): State<Arc<Node>>,
    KeyPath { bucket, key }: KeyPath,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let q: PutQuery = query(&uri)?;
    check_key(key.as_bytes())?;
    let ty = q.ty.as_deref().map(str::parse::<ValueType>).transpose()?;
    let guard = write_guard(&headers)?;
    let dest = dest(q.branch, q.base, guard)?;
    let context = headers
        .get(super::auth::CONTEXT_HEADER)
        .map(|v| v.as_bytes().to_vec())
        .unwrap_or_default();
    let owner_seal = owner_seal(&headers)?;
    let json = is_json_body(&headers);
    if json && ty == Some(ValueType::Blob) {
        return Err(ApiError::bad_request(
            "a blob is sent as raw bytes, not as application/json",
        ));
    }
    let max = node.config.max_upload_bytes;
    if content_length(&headers).is_some_and(|n| n > max) {
        body::drain_refused(body);
        return Err(ApiError::too_large(max));
    }
    // Text bodies default to a blob; JSON bodies name their type or have it inferred.
    let text_ty = ty.unwrap_or(ValueType::Blob);
    // A small blob of known length is read whole, then put in one trip to the blocking
    // pool (the same tree as streamed: POS-trees depend on content only).
    let small_blob =
        text_ty == ValueType::Blob && content_length(&headers).is_some_and(|n| n <= SMALL_BODY);
    let streamed = !json && matches!(text_ty, ValueType::Blob | ValueType::List) && !small_blob;
    // The transfer first, and for a body held in memory room for its declared length:
    // a request refused for want of either has not used its signature.
    let (permit, body) = body::body_permit(&node, body)?;
    let limit = max.min(BUFFERED_LIMIT);
    let body = if streamed {
        body
    } else {
        body::declared_room(&node, content_length(&headers), limit, body)?
    };
    let (opened, expect) = open_for_write(&node, &bucket, &method, &uri, &headers).await?;
    // A seal on a bucket whose capsule names no owner key is refused before the body is
    // read (the bucket would refuse it once the body is stored).
    if owner_seal.is_some()
        && !matches!(
            opened.bucket.metadata().map(cairn_capsule::bucket_owner),
            Some(Ok(Some(_)))
        )
    {
        body::drain_refused(body);
        return Err(Error::Rejected(format!(
            "bucket {bucket}'s capsule names no owner key: a put to it cannot carry an owner \
             seal"
        ))
        .into());
    }
    let b = opened.bucket;
    let opts = PutOptions {
        guard,
        context,
        owner_seal,
        ..PutOptions::default()
    };
    if streamed {
        // What would refuse the put (a branch typo, another type on the key, a stale
        // guard) is answered before the body is read and stored, not after it.
        let (pb, pk, pd, po) = (b.clone(), key.clone(), dest.clone(), opts.clone());
        let checked = blocking(move || {
            Ok(pb
                .db()
                .check_put_target(pk.as_bytes(), pd.target(), text_ty, &po)?)
        })
        .await;
        if let Err(e) = checked {
            body::drain_refused(body);
            return Err(e);
        }
        let mut reader = CheckedReader::new(body, max, expect);
        let failure = reader.failure();
        let d = dest.clone();
        let k = key.clone();
        let list_memory = node.buffered_memory();
        let (result, n) = blocking(move || {
            let _permit = permit;
            let target = d.target();
            let r = if text_ty == ValueType::Blob {
                b.put_blob_stream(k.as_bytes(), target, &mut reader, &opts, &mut |_| {})
            } else {
                let lines = std::io::BufReader::with_capacity(1 << 20, &mut reader);
                // A line past a MiB (up to 16) is held whole, with the leaf it is copied
                // into: from the budget for bodies held in memory, 503 when it is full.
                let mut memory = list_memory;
                b.put_list_stream(
                    k.as_bytes(),
                    target,
                    &mut body::bounded_lines_within(
                        lines,
                        cairn_object::db::MAX_INLINE_BYTES,
                        |bytes| {
                            memory
                                .hold(bytes as u64)
                                .map_err(|b| cairn_core::Error::Unavailable(b.0))
                        },
                    ),
                    &opts,
                )
            };
            let n = reader.bytes();
            Ok((r, n))
        })
        .await?;
        return match result {
            Ok(uid) => Ok(written(&node, &key, &dest, uid, n, StatusCode::CREATED)),
            Err(e) => Err(failure.lock().take().unwrap_or_else(|| e.into())),
        };
    }
    // A body read whole takes its memory, as it arrives, from the node's budget for
    // bodies parsed in memory.
    let mut memory = node.buffered_memory();
    let bytes = body::read_all_within(body, limit, expect, Some(&mut memory)).await?;
    let n = bytes.len() as u64;
    // Elements are counted before the parse allocates one object per element.
    if json {
        body::check_elements(body::json_elements(&bytes))?;
    } else if matches!(text_ty, ValueType::Tuple | ValueType::Set | ValueType::Map) {
        body::check_elements(body::text_elements(&bytes))?;
    }
    let value = if json {
        values::parse_json(ty, &bytes)?
    } else {
        // Not copied when the buffer is not shared.
        values::parse_text(text_ty, Vec::from(bytes))?
    };
    let d = dest.clone();
    let k = key.clone();
    let uid = blocking(move || {
        let _permit = (permit, memory);
        Ok(b.put(k.as_bytes(), d.target(), value, &opts)?)
    })
    .await?;
    Ok(written(&node, &key, &dest, uid, n, StatusCode::CREATED))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct BranchQuery {
    branch: Option<String>,
}

/// Refuses the headers only a PUT takes on another write (`what`): an `X-Cairn-Context`
/// would be signed and then silently dropped, and an owner seal would leave the version
/// unsealed without a word.
pub(super) fn no_put_headers(headers: &HeaderMap, what: &str) -> ApiResult<()> {
    if headers.contains_key(super::auth::CONTEXT_HEADER) {
        return Err(ApiError::bad_request(format!(
            "{what} sets no context: send X-Cairn-Context with a PUT"
        )));
    }
    if headers.contains_key(OWNER_SEAL_HEADER) {
        return Err(ApiError::bad_request(format!(
            "{what} is not sealed by its owner: only a PUT carries {OWNER_SEAL_HEADER}"
        )));
    }
    Ok(())
}

/// `DELETE /v1/buckets/{bucket}/objects/{key}?branch=`: removes a tagged branch (the key
/// goes when its last head does; versions stay until GC finds them unreachable).
pub async fn remove(
    State(node): State<Arc<Node>>,
    KeyPath { bucket, key }: KeyPath,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Json<serde_json::Value>> {
    let q: BranchQuery = query(&uri)?;
    let branch = q.branch.unwrap_or_else(|| DEFAULT_BRANCH.to_string());
    // `If-Match` guards the removal: checked with it, under the key's lock.
    let guard = write_guard(&headers)?;
    no_put_headers(&headers, "a removal")?;
    let (permit, body) = body::body_permit(&node, body)?;
    let body = body::declared_room(&node, content_length(&headers), control_limit(&node), body)?;
    let (opened, expect) = open_for_write(&node, &bucket, &method, &uri, &headers).await?;
    // Read (and dropped) within the memory budget for bodies held in memory.
    let mut memory = node.buffered_memory();
    body::read_all_within(body, control_limit(&node), expect, Some(&mut memory)).await?;
    drop(memory);
    let b = opened.bucket;
    let br = branch.clone();
    let k = key.clone();
    let uid = blocking(move || {
        let _permit = permit;
        Ok(b.remove_guarded(k.as_bytes(), &br, guard.as_ref())?)
    })
    .await?;
    Ok(Json(
        json!({ "key": key, "branch": branch, "removed": uid.to_string() }),
    ))
}

/// `GET /v1/buckets/{bucket}/meta/{key}`: a version's FObject fields.
pub async fn meta(
    State(node): State<Arc<Node>>,
    KeyPath { bucket, key }: KeyPath,
    uri: Uri,
) -> ApiResult<Json<serde_json::Value>> {
    let at = query::<VersionQuery>(&uri)?.at()?;
    // Loading the version reads from the store (an inline value of 16 MiB decodes to
    // more): a transfer is held meanwhile, as for a GET.
    let permit = body::transfer_permit(&node)?;
    let b = buckets::open(&node, &bucket).await?.bucket;
    let v = blocking(move || Ok(b.db().get(key.as_bytes(), &at)?)).await?;
    drop(permit);
    let o = &v.object;
    let tree = o.value.tree();
    Ok(Json(json!({
        "uid": v.uid.to_string(),
        "key": values::bytes_json(&o.key),
        "type": o.value_type().name(),
        "size": o.value.len(),
        "depth": o.depth,
        "bases": o.bases.iter().map(|b| b.to_string()).collect::<Vec<_>>(),
        "context": values::bytes_json(&o.context),
        "root": tree.map(|t| t.root.to_string()),
        "height": tree.map(|t| t.height),
    })))
}

/// `PATCH` body: one type operation.
#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
enum PatchBody {
    /// String: append bytes; Tuple: append an element.
    Append { value: serde_json::Value },
    /// String: insert bytes at a byte offset; Tuple: insert an element at an index.
    Insert { at: u64, value: serde_json::Value },
    /// Integer: add.
    Add { by: i64 },
    /// Integer: multiply.
    Multiply { by: i64 },
    /// Blob: replace `delete` bytes at `at` with `insert` (a byte string); List: replace
    /// `delete` elements at `at` with `insert` (an array).
    Splice {
        at: u64,
        #[serde(default)]
        delete: u64,
        #[serde(default)]
        insert: Option<serde_json::Value>,
    },
    /// Map: upsert `set` (object or pairs), delete `unset`; Set: add `add`, remove `remove`.
    Update {
        #[serde(default)]
        set: Option<serde_json::Value>,
        #[serde(default)]
        unset: Vec<serde_json::Value>,
        #[serde(default)]
        add: Vec<serde_json::Value>,
        #[serde(default)]
        remove: Vec<serde_json::Value>,
    },
}

fn patch_op(ty: ValueType, p: PatchBody) -> cairn_core::Result<Op> {
    let list = |v: &[serde_json::Value], what: &str| -> cairn_core::Result<Vec<Vec<u8>>> {
        v.iter()
            .enumerate()
            .map(|(i, x)| json_bytes(x, &format!("{what} {i}")))
            .collect()
    };
    Ok(match p {
        PatchBody::Append { value } => Op::Append(json_bytes(&value, "value")?),
        PatchBody::Insert { at, value } => Op::Insert(at, json_bytes(&value, "value")?),
        PatchBody::Add { by } => Op::Add(by),
        PatchBody::Multiply { by } => Op::Multiply(by),
        PatchBody::Splice { at, delete, insert } => match ty {
            ValueType::List => Op::ListSplice {
                index: at,
                delete,
                insert: match &insert {
                    None => Vec::new(),
                    Some(serde_json::Value::Array(a)) => list(a, "insert element")?,
                    Some(_) => {
                        return Err(Error::invalid("a list splice inserts an array"));
                    }
                },
            },
            _ => Op::BlobSplice {
                offset: at,
                delete,
                insert: match &insert {
                    None => Vec::new(),
                    Some(v) => json_bytes(v, "insert")?,
                },
            },
        },
        PatchBody::Update {
            set,
            unset,
            add,
            remove,
        } => match ty {
            ValueType::Set => {
                if set.is_some() || !unset.is_empty() {
                    return Err(Error::invalid("a set takes add and remove, not set/unset"));
                }
                let mut edits: Vec<(Vec<u8>, bool)> =
                    list(&add, "add")?.into_iter().map(|k| (k, true)).collect();
                edits.extend(list(&remove, "remove")?.into_iter().map(|k| (k, false)));
                Op::SetUpdate(edits)
            }
            _ => {
                if !add.is_empty() || !remove.is_empty() {
                    return Err(Error::invalid("a map takes set and unset, not add/remove"));
                }
                let mut edits = Vec::new();
                if let Some(s) = set {
                    match values::parse_json(Some(ValueType::Map), s.to_string().as_bytes())? {
                        NewValue::Map(m) => edits.extend(m.into_iter().map(|(k, v)| (k, Some(v)))),
                        _ => return Err(Error::invalid("set must be a map")),
                    }
                }
                edits.extend(list(&unset, "unset")?.into_iter().map(|k| (k, None)));
                Op::MapUpdate(edits)
            }
        },
    })
}

/// `PATCH /v1/buckets/{bucket}/objects/{key}?branch=`: applies a type operation to the
/// branch head and writes the result as its new head (guarded by `If-Match` if given).
pub async fn patch(
    State(node): State<Arc<Node>>,
    KeyPath { bucket, key }: KeyPath,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let q: BranchQuery = query(&uri)?;
    let branch = q.branch.unwrap_or_else(|| DEFAULT_BRANCH.to_string());
    let guard = write_guard(&headers)?;
    no_put_headers(&headers, "a PATCH (it keeps the version's context)")?;
    let (permit, body) = body::body_permit(&node, body)?;
    let body = body::declared_room(&node, content_length(&headers), control_limit(&node), body)?;
    let (opened, expect) = open_for_write(&node, &bucket, &method, &uri, &headers).await?;
    // Held, parsed and applied within the memory budget for bodies held in memory.
    let mut memory = node.buffered_memory();
    let bytes =
        body::read_all_within(body, control_limit(&node), expect, Some(&mut memory)).await?;
    let p: PatchBody = body::parse_bounded_json(&bytes, "the body must be one operation")?;
    let b = opened.bucket;
    let (k, br) = (key.clone(), branch.clone());
    let n = bytes.len() as u64;
    let uid = blocking(move || {
        let _permit = (permit, memory);
        // A guard names the head it expects: with no branch there it fails (412, as an
        // If-Match on a missing resource), rather than 404. (Checked again with the write,
        // under the key's lock.)
        if let Some(g) = guard
            && b.db().branch_head(k.as_bytes(), &br)?.is_none()
        {
            return Err(Error::GuardMismatch(format!(
                "branch {br:?} of key {k:?} is at nothing, not {g}"
            ))
            .into());
        }
        let ty = match b.db().get(k.as_bytes(), &At::Branch(br.clone())) {
            Ok(v) => v.object.value_type(),
            // Removed since the check above: the guard fails as it would have.
            Err(Error::NotFound(_))
                if guard.is_some() && b.db().branch_head(k.as_bytes(), &br)?.is_none() =>
            {
                return Err(Error::GuardMismatch(format!(
                    "branch {br:?} of key {k:?} is at nothing"
                ))
                .into());
            }
            Err(e) => return Err(e.into()),
        };
        let op = patch_op(ty, p)?;
        let opts = PutOptions {
            guard,
            ..PutOptions::default()
        };
        Ok(b.update(k.as_bytes(), Target::Branch(&br), op, &opts)?)
    })
    .await?;
    Ok(written(
        &node,
        &key,
        &Dest::Branch(branch),
        uid,
        n,
        StatusCode::OK,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        use RangeAsk::*;
        assert_eq!(parse_range("bytes=0-9", 100), Part(0, 10));
        assert_eq!(parse_range("bytes=90-", 100), Part(90, 100));
        assert_eq!(parse_range("bytes=90-200", 100), Part(90, 100));
        assert_eq!(parse_range("bytes=-10", 100), Part(90, 100));
        assert_eq!(parse_range("bytes=-200", 100), Part(0, 100));
        assert_eq!(parse_range("bytes=99-99", 100), Part(99, 100));
        assert_eq!(parse_range("bytes=100-", 100), Unsatisfiable);
        assert_eq!(parse_range("bytes=-0", 100), Unsatisfiable);
        assert_eq!(parse_range("bytes=0-", 0), Unsatisfiable);
        assert_eq!(parse_range("bytes=-5", 0), Unsatisfiable);
        assert_eq!(parse_range("bytes=5-1", 100), Full);
        assert_eq!(parse_range("bytes=0-1,5-6", 100), Full);
        assert_eq!(parse_range("items=0-1", 100), Full);
        assert_eq!(parse_range("bytes=x-1", 100), Full);
        assert_eq!(parse_range("bytes=+1-2", 100), Full);
        // Numbers past u64 are larger than any blob; the unit is case-insensitive.
        assert_eq!(
            parse_range("bytes=0-99999999999999999999999", 1000),
            Part(0, 1000)
        );
        assert_eq!(
            parse_range("bytes=99999999999999999999999-", 1000),
            Unsatisfiable
        );
        assert_eq!(parse_range("BYTES=0-0", 100), Part(0, 1));
        assert_eq!(parse_range("Bytes=", 100), Full);
    }
}

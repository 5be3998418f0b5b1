//! Versions and branches: list keys and branches, log (track), diff, LCA, fork, merge with
//! a resolver, rename, and version proofs.
//!
//! Versions are named by branch or uid (`BRANCH_OR_UID`: a 68-hex-digit uid, else a branch
//! name, as on the command line). A merge whose conflicts the resolver leaves open answers
//! 409 with the conflict list and writes nothing.
//!
//! The listings (keys, branches, log, diff) hold a transfer ([`body::transfer_permit`], 503
//! with `Retry-After` when none is free) from before they are built until their answer is
//! sent, which streams ([`body::json_response`]), so a client that reads nothing for the
//! stall timeout is cut. The POST control routes hold one while their body is read, parsed
//! (at most [`body::MAX_BUFFERED_ELEMENTS`] JSON values) and applied, taken before the
//! request signature is checked.

use std::ops::ControlFlow;
use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use cairn_capsule::Anchor;
use cairn_core::Error;
use cairn_object::{
    At, BuiltinResolver, Conflict, ConflictAt, DEFAULT_BRANCH, Diff, DiffCursor, HeadPos,
    MergeOutcome, PutOptions, Uid, Value,
};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value as J, json};

use super::buckets::{self, open_for_write};
use super::error::{ApiError, ApiResult, blocking};
use super::objects::{accepts_json, control_limit};
use super::values::{bytes_json, json_bytes};
use super::{BucketPath, KeyPath, NoQuery, VersionQuery, body, parse_uid, query, version_at};
use crate::node::Node;

/// Most keys one `GET .../keys` page lists.
const MAX_KEYS_PAGE: usize = 10_000;
/// Largest distance a log may reach.
const MAX_TRACK_DISTANCE: u64 = 10_000;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct KeysQuery {
    after: Option<String>,
    limit: Option<usize>,
}

/// `GET /v1/buckets/{bucket}/keys?after=&limit=`: keys in byte order, a page at a time.
pub async fn keys(
    State(node): State<Arc<Node>>,
    BucketPath(bucket): BucketPath,
    uri: Uri,
) -> ApiResult<Response> {
    let q: KeysQuery = query(&uri)?;
    let limit = q.limit.unwrap_or(1000);
    if limit == 0 || limit > MAX_KEYS_PAGE {
        return Err(ApiError::bad_request(format!(
            "limit must be 1 to {MAX_KEYS_PAGE}"
        )));
    }
    let permit = body::transfer_permit(&node)?;
    let b = buckets::open(&node, &bucket).await?.bucket;
    let page = blocking(move || {
        // At most KEYS_ANSWER_BYTES of keys in one answer (10,000 keys of 4 KiB held
        // about 80 MiB while it was sent): a page cut short goes on from its last key.
        // Read from the store 256 keys at a time, so what is read past the cut is little
        // (a whole page of long keys was read, then most of it dropped).
        let mut keys = Vec::with_capacity(limit.min(4096));
        let mut last: Option<bytes::Bytes> = None;
        let mut bytes = 0usize;
        let mut more = true;
        let mut cut = false;
        let mut after = q.after.map(|a| bytes::Bytes::from(a.into_bytes()));
        'read: while more && keys.len() < limit {
            let (page, m) = b
                .db()
                .list_keys_page(after.as_deref(), (limit - keys.len()).min(256))?;
            more = m;
            for k in page {
                if !keys.is_empty() && bytes + k.len() > KEYS_ANSWER_BYTES {
                    cut = true;
                    break 'read;
                }
                bytes += k.len();
                keys.push(bytes_json(&k));
                last = Some(k.clone());
                after = Some(k);
            }
        }
        let next = if more || cut {
            last.as_deref().map(bytes_json)
        } else {
            None
        };
        Ok(json!({ "keys": keys, "next": next }))
    })
    .await?;
    Ok(body::json_response(node, permit, page))
}

/// Most heads one `GET .../branches` page lists.
const MAX_BRANCHES_PAGE: usize = 10_000;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct BranchesQuery {
    after: Option<String>,
    limit: Option<usize>,
}

/// `GET /v1/buckets/{bucket}/branches/{key}?after=&limit=`: tagged branches with their
/// heads, and the untagged heads (more than one: concurrent writes forked the key), a page
/// of at most `limit` heads (default 1000, at most [`MAX_BRANCHES_PAGE`]): tagged by name,
/// then untagged by uid. When more follow, `next` (`tagged:NAME` or `untagged:UID`) is the
/// `after` of the next page. `metas` maps each head uid of the page to its version's Meta
/// chunk (hex), so a reader can check that every head is a version of this key; a Meta
/// chunk over [`LOG_META_BYTES`], or past [`BRANCHES_META_BYTES`] of them in all, is left
/// out (the reader reads it alone).
pub async fn branches(
    State(node): State<Arc<Node>>,
    KeyPath { bucket, key }: KeyPath,
    uri: Uri,
) -> ApiResult<Response> {
    let q: BranchesQuery = query(&uri)?;
    let limit = q.limit.unwrap_or(1000);
    if limit == 0 || limit > MAX_BRANCHES_PAGE {
        return Err(ApiError::bad_request(format!(
            "limit must be 1 to {MAX_BRANCHES_PAGE}"
        )));
    }
    let after = match q.after.as_deref() {
        None => None,
        Some(a) => Some(a.parse::<HeadPos>()?),
    };
    let permit = body::transfer_permit(&node)?;
    let b = buckets::open(&node, &bucket).await?.bucket;
    let answer = blocking(move || {
        // A page of heads, not the whole table: a key may have very many (every put on
        // an old base leaves one), and the answer, its metas and the refs read for it
        // grew with all of them.
        let (t, next) = b.db().heads_page(key.as_bytes(), after.as_ref(), limit)?;
        let tagged: serde_json::Map<String, J> = t
            .tagged
            .iter()
            .map(|(n, u)| (n.clone(), J::String(u.to_string())))
            .collect();
        let untagged: Vec<String> = t.untagged.iter().map(|u| u.to_string()).collect();
        let mut metas = serde_json::Map::new();
        let mut bytes = 0usize;
        // Each head is loaded once however many branches name it (one too large to list
        // was loaded again for every branch), and none once twice the budget was loaded
        // (heads too large to list count too): the rest are left for the reader to read.
        let mut seen = std::collections::HashSet::new();
        let mut loaded = 0usize;
        for uid in t.tagged.values().chain(t.untagged.iter()) {
            if !seen.insert(*uid) {
                continue;
            }
            if loaded >= 2 * BRANCHES_META_BYTES {
                break;
            }
            let hex_uid = uid.to_string();
            // A head ref naming another key's version is damage (500), not "no such key".
            let meta = b.db().load_reached(key.as_bytes(), uid)?.to_chunk();
            loaded = loaded.saturating_add(meta.len());
            if meta.len() > LOG_META_BYTES || bytes + 2 * meta.len() > BRANCHES_META_BYTES {
                continue;
            }
            bytes += 2 * meta.len();
            metas.insert(hex_uid, J::String(hex::encode(&meta)));
        }
        let next = next.map(|p| p.to_string());
        Ok(json!({
            "key": key, "tagged": tagged, "untagged": untagged, "metas": metas, "next": next
        }))
    })
    .await?;
    Ok(body::json_response(node, permit, answer))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct LogQuery {
    branch: Option<String>,
    uid: Option<String>,
    min: Option<u64>,
    max: Option<u64>,
}

/// Bytes of keys one `keys` answer holds at most (past its first key): a page cut short
/// says where to go on (`next`).
const KEYS_ANSWER_BYTES: usize = 4 << 20;

/// Bytes (about: values counted as hex) of conflicts a merge's 409 lists at most, past the
/// first; `conflicts_total` says how many there are.
const CONFLICTS_ANSWER_BYTES: usize = 1 << 20;

/// Bytes of version entries one `log` answer holds at most: past it the answer stops at a
/// distance boundary and says where to go on (`next_min`).
const LOG_ANSWER_BYTES: usize = 8 << 20;

/// `GET /v1/buckets/{bucket}/log/{key}?branch=|uid=&min=&max=`: the versions whose
/// distance from the start lies in `min..=max` (default 0..=100), nearest first. An answer
/// holds whole distances only, at most [`LOG_ANSWER_BYTES`] of entries: when it stops
/// early, `next_min` is the first distance left out (ask again with `min` set to it).
pub async fn log(
    State(node): State<Arc<Node>>,
    KeyPath { bucket, key }: KeyPath,
    uri: Uri,
) -> ApiResult<Response> {
    let q: LogQuery = query(&uri)?;
    let at = version_at(q.branch, q.uid)?;
    let (min, max) = (q.min.unwrap_or(0), q.max.unwrap_or(100));
    if min > max || max > MAX_TRACK_DISTANCE {
        return Err(ApiError::bad_request(format!(
            "need min <= max <= {MAX_TRACK_DISTANCE}"
        )));
    }
    let permit = body::transfer_permit(&node)?;
    let b = buckets::open(&node, &bucket).await?.bucket;
    let answer = blocking(move || {
        let (out, next_min) = log_entries(b.db(), key.as_bytes(), &at, min, max, LOG_ANSWER_BYTES)?;
        Ok(json!({ "key": key, "versions": out, "next_min": next_min }))
    })
    .await?;
    Ok(body::json_response(node, permit, answer))
}

/// Most bytes (hex) of Meta chunks one `branches` answer carries.
pub const BRANCHES_META_BYTES: usize = 8 << 20;

/// Largest Meta chunk a `log` entry carries.
pub const LOG_META_BYTES: usize = 64 << 10;

/// The `log` entries of versions `min..=max` from `at`, whole distances only and at most
/// `budget` bytes of them (the values are dropped as each version is seen), and the first
/// distance left out when the budget stopped them. A single distance over the budget is
/// refused.
fn log_entries(
    db: &cairn_object::Db,
    key: &[u8],
    at: &At,
    min: u64,
    max: u64,
    budget: usize,
) -> cairn_core::Result<(Vec<J>, Option<u64>)> {
    let mut out: Vec<J> = Vec::new();
    let mut bytes = 0usize;
    // Where the entries of the distance being filled start, and that distance.
    let (mut group_start, mut group_dist) = (0usize, min);
    let mut next_min = None;
    db.track_each(key, at, min, max, &mut |e| {
        if e.distance != group_dist {
            group_start = out.len();
            group_dist = e.distance;
        }
        let mut entry = json!({
            "distance": e.distance,
            "uid": e.uid.to_string(),
            "type": e.object.value_type().name(),
            "size": e.object.value.len(),
            "depth": e.object.depth,
            "bases": e.object.bases.iter().map(|b| b.to_string()).collect::<Vec<_>>(),
            "context": bytes_json(&e.object.context),
        });
        bytes += 2 * e.object.context.len() + 110 * (2 + e.object.bases.len());
        // The version's Meta chunk, for a reader to check the entry against its uid (a
        // large inline value is left out: `stream?meta=true` sends it).
        let meta = e.object.to_chunk();
        if meta.len() <= LOG_META_BYTES {
            bytes += 2 * meta.len();
            entry["meta"] = J::String(hex::encode(&meta));
        }
        if bytes > budget {
            if group_start == 0 {
                return Err(cairn_core::Error::invalid(format!(
                    "the versions at distance {} alone exceed the {} MiB a log answer holds",
                    e.distance,
                    budget >> 20
                )));
            }
            out.truncate(group_start);
            next_min = Some(group_dist);
            return Ok(ControlFlow::Break(()));
        }
        out.push(entry);
        Ok(ControlFlow::Continue(()))
    })?;
    Ok((out, next_min))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PairQuery {
    a: String,
    b: String,
    /// Answer with the chunks the query reads instead of JSON (see [`chunks_answer`]).
    #[serde(default)]
    chunks: bool,
}

/// Content type of an answer made of the chunks a query read, framed as a version stream
/// (`cairn_object::evidence`): the client re-runs the query over them.
pub const CHUNKS_TYPE: &str = "application/vnd.cairn.chunks";

/// The uids a query answered with chunks was run on (`BRANCH_OR_UID` resolved by the node).
const A_HEADER: HeaderName = HeaderName::from_static("x-cairn-a");
/// See [`A_HEADER`].
const B_HEADER: HeaderName = HeaderName::from_static("x-cairn-b");
/// The page size a diff answered with chunks was computed with (at most the `limit` asked,
/// less when a page of that many changes reads more than
/// `cairn_object::evidence::EVIDENCE_BUDGET`).
const LIMIT_HEADER: HeaderName = HeaderName::from_static("x-cairn-limit");

/// An answer carrying chunks as frames of a version stream, written by `send` on the
/// blocking pool, with the uids the query ran on and any further headers.
fn chunks_answer<F>(
    node: Arc<Node>,
    permit: crate::node::Transfer,
    a: &Uid,
    b: &Uid,
    more: Option<(HeaderName, HeaderValue)>,
    send: F,
) -> ApiResult<Response>
where
    F: FnOnce(
            &mut (dyn FnMut(bytes::Bytes) -> cairn_core::Result<()> + Send),
        ) -> cairn_core::Result<()>
        + Send
        + 'static,
{
    let uid_value = |u: &Uid| {
        HeaderValue::from_str(&u.to_string())
            .map_err(|e| ApiError::from(Error::invalid(format!("uid header: {e}"))))
    };
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(CHUNKS_TYPE));
    headers.insert(A_HEADER, uid_value(a)?);
    headers.insert(B_HEADER, uid_value(b)?);
    if let Some((n, v)) = more {
        headers.insert(n, v);
    }
    let body = body::produce(node, permit, move |w| {
        send(&mut |c| cairn_object::stream::write_frame(c, &mut |piece| w.write_shared(piece)))
    });
    Ok((headers, body).into_response())
}

fn value_json(v: &Value) -> J {
    match v {
        Value::String(b) => bytes_json(b),
        Value::Integer(i) => json!(i),
        Value::Tuple(items) => J::Array(items.iter().map(|i| bytes_json(i)).collect()),
        Value::Tree(t) => json!({ "root": t.root.to_string(), "count": t.count }),
    }
}

fn opt_bytes(b: &Option<bytes::Bytes>) -> J {
    b.as_deref().map_or(J::Null, bytes_json)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DiffQuery {
    a: String,
    b: String,
    after: Option<String>,
    limit: Option<usize>,
    /// Answer with the chunks the page reads instead of JSON (see [`chunks_answer`]).
    #[serde(default)]
    chunks: bool,
}

/// `GET /v1/buckets/{bucket}/diff/{key}?a=&b=&after=&limit=`: what differs between two
/// versions of the key (`a`, `b`: BRANCH_OR_UID). Maps and sets list changed keys; blobs
/// and lists list changed regions, a page of at most `limit` at a time (`next`, passed as
/// `after`, continues); primitives show both values.
pub async fn diff(
    State(node): State<Arc<Node>>,
    KeyPath { bucket, key }: KeyPath,
    uri: Uri,
) -> ApiResult<Response> {
    let q: DiffQuery = query(&uri)?;
    let limit = q.limit.unwrap_or(1000);
    if limit == 0 || limit > MAX_KEYS_PAGE {
        return Err(ApiError::bad_request(format!(
            "limit must be 1 to {MAX_KEYS_PAGE}"
        )));
    }
    let after = q.after.as_deref().map(DiffCursor::parse).transpose()?;
    let permit = body::transfer_permit(&node)?;
    let b = buckets::open(&node, &bucket).await?.bucket;
    if q.chunks {
        let (ua, ub, sent, used) = blocking(move || {
            let db = b.db();
            // Through `get`: a branch head naming no version of the key is damage.
            let ua = db.get(key.as_bytes(), &At::parse(&q.a))?.uid;
            let ub = db.get(key.as_bytes(), &At::parse(&q.b))?.uid;
            let (sent, used) = cairn_object::evidence::diff_page_evidence(
                db.chunks(),
                key.as_bytes(),
                &ua,
                &ub,
                after.as_ref(),
                limit,
                cairn_object::evidence::EVIDENCE_BUDGET,
            )?;
            Ok((ua, ub, sent, used))
        })
        .await?;
        let used = (LIMIT_HEADER, HeaderValue::from(used));
        return chunks_answer(node, permit, &ua, &ub, Some(used), move |emit| {
            sent.into_iter().try_for_each(emit)
        });
    }
    let answer = blocking(move || {
        let db = b.db();
        let va = db.get(key.as_bytes(), &At::parse(&q.a))?;
        let vb = db.get(key.as_bytes(), &At::parse(&q.b))?;
        let (d, next) =
            db.diff_values_page(&va.object.value, &vb.object.value, after.as_ref(), limit)?;
        let changes = match &d {
            Diff::Same => json!([]),
            Diff::Primitive(l, r) => json!([{ "left": value_json(l), "right": value_json(r) }]),
            Diff::Sorted(cs) => J::Array(
                cs.iter()
                    .map(|c| {
                        json!({
                            "key": bytes_json(&c.key),
                            "left": opt_bytes(&c.left),
                            "right": opt_bytes(&c.right),
                        })
                    })
                    .collect(),
            ),
            Diff::Seq(cs) => J::Array(
                cs.iter()
                    .map(|c| {
                        json!({
                            "a_start": c.a_start, "a_end": c.a_end,
                            "b_start": c.b_start, "b_end": c.b_end,
                        })
                    })
                    .collect(),
            ),
        };
        Ok(json!({
            "a": va.uid.to_string(),
            "b": vb.uid.to_string(),
            "type": va.object.value_type().name(),
            "same": d == Diff::Same,
            "changes": changes,
            "next": next.map(|c| c.token()),
        }))
    })
    .await?;
    Ok(body::json_response(node, permit, answer))
}

/// `GET /v1/buckets/{bucket}/lca/{key}?a=&b=&chunks=`: the least common ancestor of two
/// versions (`null` when their histories are disjoint); with `chunks=true`, the Meta chunks
/// the search read instead, for the client to search them itself.
pub async fn lca(
    State(node): State<Arc<Node>>,
    KeyPath { bucket, key }: KeyPath,
    uri: Uri,
) -> ApiResult<Response> {
    let q: PairQuery = query(&uri)?;
    // The transfer before the bucket is opened (which may replay its capsule).
    let permit = body::transfer_permit(&node)?;
    let b = buckets::open(&node, &bucket).await?.bucket;
    if q.chunks {
        // Both versions are looked up first, so a bad request answers 4xx; the search
        // then streams its Meta chunks as it reads them.
        let bb = b.clone();
        let k = key.clone();
        let (ua, ub) = blocking(move || {
            let db = bb.db();
            let ua = db.get(k.as_bytes(), &At::parse(&q.a))?.uid;
            let ub = db.get(k.as_bytes(), &At::parse(&q.b))?.uid;
            Ok((ua, ub))
        })
        .await?;
        return chunks_answer(node, permit, &ua, &ub, None, move |emit| {
            cairn_object::evidence::lca_evidence(b.db().chunks(), key.as_bytes(), &ua, &ub, emit)
        });
    }
    // The search reads as much history as lies between the versions: it holds a read
    // transfer while it runs, as the listings do.
    let answer = blocking(move || {
        let _permit = permit;
        let db = b.db();
        let ua = db.get(key.as_bytes(), &At::parse(&q.a))?.uid;
        let ub = db.get(key.as_bytes(), &At::parse(&q.b))?.uid;
        let l = db.lca(key.as_bytes(), &ua, &ub)?;
        Ok(Json(json!({
            "a": ua.to_string(),
            "b": ub.to_string(),
            "lca": l.map(|u| u.to_string()),
        })))
    })
    .await?;
    Ok(answer.into_response())
}

/// A transfer held by a control mutation until it is done.
type Permit = crate::node::Transfer;

/// Takes a transfer (before the signature is checked, so a 503 leaves the request usable),
/// authorizes a control mutation and reads its JSON body (bounded in bytes and elements).
async fn control<T: DeserializeOwned>(
    node: &Arc<Node>,
    bucket: &str,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: Body,
) -> ApiResult<(Permit, Arc<cairn_capsule::Bucket>, T)> {
    let _: NoQuery = query(uri)?;
    // Conditions would be ignored here: refused, so a guarded fork, rename or merge never
    // goes ahead unguarded.
    if headers.contains_key(axum::http::header::IF_MATCH)
        || headers.contains_key(axum::http::header::IF_NONE_MATCH)
    {
        return Err(ApiError::bad_request(
            "fork, rename and merge take no If-Match or If-None-Match",
        ));
    }
    // Nor a context, which would be signed and then dropped (a merge's version keeps none).
    super::objects::no_put_headers(headers, "a fork, rename or merge")?;
    if !super::objects::is_json_body(headers) {
        return Err(ApiError::json_required());
    }
    let (permit, body) = body::body_permit(node, body)?;
    let declared = super::objects::content_length(headers);
    let body = body::declared_room(node, declared, control_limit(node), body)?;
    let (opened, expect) = open_for_write(node, bucket, method, uri, headers).await?;
    // Read and parsed within the memory budget for bodies held in memory (the parsed
    // request is small).
    let mut memory = node.buffered_memory();
    let bytes = body::read_all_within(body, control_limit(node), expect, Some(&mut memory)).await?;
    let req = body::parse_bounded_json(&bytes, "bad request body")?;
    Ok((permit, opened.bucket, req))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ForkBody {
    #[serde(default)]
    from: Option<String>,
    branch: String,
}

/// `POST /v1/buckets/{bucket}/fork/{key}` `{from?, branch}`: creates tagged branch
/// `branch` at `from` (BRANCH_OR_UID, default `master`).
#[allow(clippy::too_many_arguments)]
pub async fn fork(
    State(node): State<Arc<Node>>,
    KeyPath { bucket, key }: KeyPath,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let (_permit, b, req): (_, _, ForkBody) =
        control(&node, &bucket, &method, &uri, &headers, body).await?;
    let from = At::parse(req.from.as_deref().unwrap_or(DEFAULT_BRANCH));
    let (k, br) = (key.clone(), req.branch.clone());
    let uid = blocking(move || Ok(b.fork(k.as_bytes(), &from, &br)?)).await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({ "key": key, "branch": req.branch, "uid": uid.to_string() })),
    )
        .into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RenameBody {
    from: String,
    to: String,
}

/// `POST /v1/buckets/{bucket}/rename/{key}` `{from, to}`: renames a tagged branch.
pub async fn rename(
    State(node): State<Arc<Node>>,
    KeyPath { bucket, key }: KeyPath,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Json<J>> {
    let (_permit, b, req): (_, _, RenameBody) =
        control(&node, &bucket, &method, &uri, &headers, body).await?;
    let k = key.clone();
    let (from, to) = (req.from.clone(), req.to.clone());
    let uid = blocking(move || Ok(b.rename(k.as_bytes(), &from, &to)?)).await?;
    Ok(Json(
        json!({ "key": key, "from": req.from, "branch": req.to, "uid": uid.to_string() }),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MergeBody {
    #[serde(default)]
    into: Option<String>,
    #[serde(default)]
    from: Option<String>,
    #[serde(default)]
    untagged: bool,
    #[serde(default)]
    uids: Vec<String>,
    #[serde(default)]
    resolver: Option<String>,
}

/// Most bytes of each side (base, ours, theirs) of a conflict a 409 carries: a side of an
/// inline value can hold 16 MiB, and the answer, built in memory, held all three whole (up
/// to about 288 MiB once JSON escapes control bytes).
pub const CONFLICT_SIDE_BYTES: usize = 4 << 10;

/// A merge conflict as the API reports it (in the `conflicts` list of a 409): each side cut
/// to [`CONFLICT_SIDE_BYTES`], with `truncated: true` and the sides' full lengths
/// (`base_len`, `ours_len`, `theirs_len`) when any was cut.
pub fn conflict_json(c: &Conflict) -> J {
    // Cut at a character boundary when the side is text, so it stays a JSON string.
    let cut = |v: &Option<bytes::Bytes>| {
        v.as_ref().map(|b| {
            let mut n = b.len().min(CONFLICT_SIDE_BYTES);
            if n < b.len() && std::str::from_utf8(b).is_ok() {
                while n > 0 && (b[n] & 0xC0) == 0x80 {
                    n -= 1;
                }
            }
            b.slice(..n)
        })
    };
    let sides = [&c.base, &c.ours, &c.theirs];
    let truncated = sides
        .iter()
        .any(|v| v.as_ref().is_some_and(|b| b.len() > CONFLICT_SIDE_BYTES));
    let mut out = conflict_json_whole(&Conflict {
        at: c.at.clone(),
        base: cut(&c.base),
        ours: cut(&c.ours),
        theirs: cut(&c.theirs),
    });
    if truncated && let Some(o) = out.as_object_mut() {
        o.insert("truncated".into(), J::Bool(true));
        for (name, v) in ["base_len", "ours_len", "theirs_len"]
            .into_iter()
            .zip(sides)
        {
            o.insert(
                name.into(),
                v.as_ref().map_or(J::Null, |b| J::from(b.len())),
            );
        }
    }
    out
}

/// [`conflict_json`] with every side whole.
fn conflict_json_whole(c: &Conflict) -> J {
    let at = match &c.at {
        ConflictAt::Value => json!({ "kind": "value" }),
        ConflictAt::MapKey(k) => json!({ "kind": "map_key", "key": bytes_json(k) }),
        ConflictAt::Range { start, end } => {
            json!({ "kind": "range", "start": start, "end": end })
        }
    };
    json!({
        "at": at,
        "base": opt_bytes(&c.base),
        "ours": opt_bytes(&c.ours),
        "theirs": opt_bytes(&c.theirs),
    })
}

/// Reads a conflict written by [`conflict_json`] (`None` if it is not one).
pub fn conflict_from_json(c: &J) -> Option<Conflict> {
    let side = |v: &J| -> Option<Option<bytes::Bytes>> {
        match v {
            J::Null => Some(None),
            v => json_bytes(v, "conflict").ok().map(|b| Some(b.into())),
        }
    };
    let at = c.get("at")?;
    let at = match at.get("kind")?.as_str()? {
        "value" => ConflictAt::Value,
        "map_key" => ConflictAt::MapKey(json_bytes(at.get("key")?, "conflict").ok()?.into()),
        "range" => ConflictAt::Range {
            start: at.get("start")?.as_u64()?,
            end: at.get("end")?.as_u64()?,
        },
        _ => return None,
    };
    Some(Conflict {
        at,
        base: side(c.get("base")?)?,
        ours: side(c.get("ours")?)?,
        theirs: side(c.get("theirs")?)?,
    })
}

/// `POST /v1/buckets/{bucket}/merge/{key}`: merges `from` (BRANCH_OR_UID) into tagged
/// branch `into` (default `master`), or with `untagged: true` merges untagged heads
/// (`uids`, all of them when empty) into one. `resolver`: manual (default), ours, theirs,
/// append, sum or union. Unresolved conflicts: 409 with `conflicts`, nothing written.
#[allow(clippy::too_many_arguments)]
pub async fn merge(
    State(node): State<Arc<Node>>,
    KeyPath { bucket, key }: KeyPath,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Json<J>> {
    // What the merge may hold, from the node's budget for memory held by requests, until
    // it ends (a merge that ends in conflicts writes nothing, and may be sent again and
    // again: without it, as many as there are write transfers held 256 MiB each). Taken
    // before the signature is checked, so a request refused for it can be sent again.
    let mut _merge_memory = node.buffered_memory();
    if let Err(b) = _merge_memory.hold(crate::node::MERGE_MEMORY_MIB << 20) {
        body::drain_refused(body);
        return Err(body::busy(b.0));
    }
    let (_permit, b, req): (_, _, MergeBody) =
        control(&node, &bucket, &method, &uri, &headers, body).await?;
    let resolver: BuiltinResolver = req.resolver.as_deref().unwrap_or("manual").parse()?;
    let k = key.clone();
    let into = req.into.clone();
    let outcome = if req.untagged {
        if req.into.is_some() || req.from.is_some() {
            return Err(ApiError::bad_request(
                "an untagged merge takes uids, not into/from",
            ));
        }
        let uids = req
            .uids
            .iter()
            .map(|u| parse_uid(u))
            .collect::<ApiResult<Vec<Uid>>>()?;
        blocking(move || {
            Ok(b.merge_untagged(k.as_bytes(), &uids, &resolver, &PutOptions::default())?)
        })
        .await?
    } else {
        if !req.uids.is_empty() {
            return Err(ApiError::bad_request(
                "uids go with untagged: true; a branch merge takes into and from",
            ));
        }
        let from = At::parse(
            req.from
                .as_deref()
                .ok_or_else(|| ApiError::bad_request("from (BRANCH_OR_UID) is required"))?,
        );
        let into = into.unwrap_or_else(|| DEFAULT_BRANCH.to_string());
        blocking(move || {
            Ok(b.merge_into(
                k.as_bytes(),
                &into,
                &from,
                &resolver,
                &PutOptions::default(),
            )?)
        })
        .await?
    };
    let (what, uid) = match outcome {
        MergeOutcome::Merged(u) => ("merged", u),
        MergeOutcome::FastForward(u) => ("fast_forward", u),
        MergeOutcome::UpToDate(u) => ("up_to_date", u),
        MergeOutcome::Conflicts(cs) => {
            // The answer is built in memory and sent as it is: it lists conflicts up to
            // CONFLICTS_ANSWER_BYTES (the first always), and says how many there are.
            let mut list: Vec<J> = Vec::new();
            let mut bytes = 0usize;
            for c in &cs {
                // Each side cut to CONFLICT_SIDE_BYTES, at most 6 bytes of JSON a byte (a
                // control byte is escaped as \u00XX).
                let key = match &c.at {
                    ConflictAt::MapKey(k) => k.len(),
                    _ => 0,
                };
                let size = [&c.base, &c.ours, &c.theirs]
                    .iter()
                    .map(|v| v.as_ref().map_or(0, |b| b.len().min(CONFLICT_SIDE_BYTES)))
                    .sum::<usize>()
                    .saturating_add(key)
                    .saturating_mul(6)
                    .saturating_add(256);
                if !list.is_empty() && bytes.saturating_add(size) > CONFLICTS_ANSWER_BYTES {
                    break;
                }
                bytes = bytes.saturating_add(size);
                list.push(conflict_json(c));
            }
            let shown = list.len();
            return Err(ApiError::from(Error::Conflict(format!(
                "{} unresolved conflict(s){}; nothing was written (try resolver ours, theirs, \
                 append, sum or union)",
                cs.len(),
                if shown < cs.len() {
                    format!(", the first {shown} listed")
                } else {
                    String::new()
                }
            )))
            .with_extra("conflicts", J::Array(list))
            .with_extra("conflicts_total", J::from(cs.len())));
        }
    };
    Ok(Json(json!({
        "key": key,
        "outcome": what,
        "uid": uid.to_string(),
        "into": if req.untagged { None } else { Some(req.into.unwrap_or_else(|| DEFAULT_BRANCH.to_string())) },
    })))
}

/// `GET /v1/buckets/{bucket}/proof/{key}?uid=|branch=`: the proof that the bucket's
/// writer created the version: `VersionProof::to_bytes()` as `application/octet-stream`
/// (what `cairn verify-proof` reads), or with `Accept: application/json` a JSON view of the
/// mutation, the hash chain, the signature and the owner seal (`null` for a put the node
/// recorded without one), with the same bytes in hex. The node checks the proof, and the
/// seal, against the bucket's metadata before sending it.
pub async fn proof(
    State(node): State<Arc<Node>>,
    KeyPath { bucket, key }: KeyPath,
    uri: Uri,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let at = query::<VersionQuery>(&uri)?.at()?;
    // Proving loads the version and its records: a transfer is held meanwhile.
    let permit = body::transfer_permit(&node)?;
    let b = buckets::open(&node, &bucket).await?.bucket;
    let k = key.clone();
    let (vp, meta, uid, mutation, names, sealed) = blocking(move || {
        // Through `get`: a branch head naming no version of the key is damage.
        let uid = b.db().get(k.as_bytes(), &at)?.uid;
        let vp = b.prove(k.as_bytes(), &uid)?;
        let meta = b
            .metadata()
            .ok_or_else(|| Error::not_found("the bucket's capsule"))?
            .clone();
        let (m, names) = vp
            .verify(&meta, k.as_bytes(), &uid)
            .map_err(|e| Error::corrupt(format!("the node's own proof does not verify: {e}")))?;
        let sealed = vp.owner_seal(&meta, &m, &uid).map_err(|e| {
            Error::corrupt(format!(
                "the owner seal in the node's own proof does not verify: {e}"
            ))
        })?;
        Ok((vp, meta, uid, m, names, sealed))
    })
    .await?;
    drop(permit);
    let capsule = meta.name().to_string();
    let capsule_h = (
        HeaderName::from_static("x-cairn-capsule"),
        HeaderValue::from_str(&capsule).map_err(|_| ApiError::internal("bad capsule name"))?,
    );
    if !accepts_json(&headers) {
        return Ok((
            [
                (
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/octet-stream"),
                ),
                capsule_h,
            ],
            vp.to_bytes(),
        )
            .into_response());
    }
    let anchor = match &vp.proof.anchor {
        Anchor::Signed(ws) => json!({
            "kind": "signed",
            "writer": ws.writer,
            "key": meta.writers.get(ws.writer as usize).map(|k| k.to_string()),
            "signature": hex::encode(ws.sig.raw()),
        }),
        Anchor::Cached => json!({ "kind": "cached" }),
    };
    Ok((
        [capsule_h],
        Json(json!({
            "key": key,
            "uid": uid.to_string(),
            "capsule": capsule,
            "record": names.first().map(|n| n.to_string()),
            "mutation": {
                "kind": mutation.kind.name(),
                "key": bytes_json(&mutation.key),
                "branch": mutation.branch,
                "from": mutation.from,
                "uid": mutation.uid.to_string(),
                "bases": mutation.bases.iter().map(|b| b.to_string()).collect::<Vec<_>>(),
            },
            "chain": names.iter().map(|n| n.to_string()).collect::<Vec<_>>(),
            "anchor": anchor,
            "owner_seal": sealed.map(|(owner, seal)| json!({
                "owner": owner.to_string(),
                "date": seal.date,
                "nonce": hex::encode(seal.nonce),
                "names_base": seal.names_base,
                "signature": hex::encode(seal.signature.raw()),
            })),
            "proof": hex::encode(vp.to_bytes()),
        })),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_object::{Db, NewValue, Target};

    /// A conflict side over the cut is cut at a character boundary when it is text (so it
    /// stays a JSON string, not hex), anywhere when it is not, and its length is given.
    #[test]
    fn conflict_sides_are_cut_at_a_character() {
        let text = "é".repeat(CONFLICT_SIDE_BYTES); // two bytes a character
        let odd = format!("a{text}");
        let binary = vec![0xFFu8; CONFLICT_SIDE_BYTES + 5];
        let c = Conflict {
            at: ConflictAt::Value,
            base: Some(odd.clone().into()),
            ours: Some(binary.clone().into()),
            theirs: Some(bytes::Bytes::from_static(b"short")),
        };
        let j = conflict_json(&c);
        assert_eq!(j["truncated"], true);
        let base = j["base"].as_str().expect("text stays a string");
        assert!(odd.starts_with(base) && base.len() == CONFLICT_SIDE_BYTES - 1);
        assert_eq!(j["base_len"], odd.len());
        let ours = j["ours"]["hex"].as_str().unwrap();
        assert_eq!(ours.len(), 2 * CONFLICT_SIDE_BYTES);
        assert_eq!(j["ours_len"], binary.len());
        assert_eq!(
            (j["theirs"].as_str(), &j["theirs_len"]),
            (Some("short"), &J::from(5))
        );
        // Nothing cut: no lengths.
        let whole = conflict_json(&Conflict {
            at: ConflictAt::Value,
            base: None,
            ours: Some(bytes::Bytes::from_static(b"a")),
            theirs: Some(bytes::Bytes::from_static(b"b")),
        });
        assert!(whole.get("truncated").is_none() && whole.get("ours_len").is_none());
    }

    /// A log answer over its budget stops at a distance boundary and names the next one;
    /// asking again from there gives the rest, every version exactly once.
    #[test]
    fn log_answers_stop_at_a_distance_within_their_budget() {
        let db = Db::new(Arc::new(cairn_store::MemoryStore::new()));
        let mut uids = Vec::new();
        for i in 0..20u8 {
            let opts = PutOptions {
                context: vec![i; 1000],
                ..PutOptions::default()
            };
            let v = NewValue::String(vec![i; 3]);
            uids.push(db.put(b"k", Target::Branch("master"), v, &opts).unwrap());
        }
        let at = At::default_branch();
        let (all, next) = log_entries(&db, b"k", &at, 0, 100, 1 << 20).unwrap();
        assert_eq!((all.len(), next), (20, None));
        let mut got = Vec::new();
        let mut min = 0;
        let mut pages = 0;
        loop {
            let (page, next) = log_entries(&db, b"k", &at, min, 100, 9000).unwrap();
            assert!(!page.is_empty() && page.len() < 20);
            got.extend(page.iter().map(|e| e["uid"].as_str().unwrap().to_string()));
            pages += 1;
            match next {
                Some(n) => min = n,
                None => break,
            }
        }
        assert!(pages > 1);
        let want: Vec<String> = uids.iter().rev().map(|u| u.to_string()).collect();
        assert_eq!(got, want);
        // A budget smaller than one distance's versions is refused.
        assert!(log_entries(&db, b"k", &at, 0, 100, 100).is_err());
    }
}

//! Buckets of the native API: create, list, info, and the registry behind them.
//!
//! The native API serves only buckets created through it (`POST /v1/buckets`), so buckets
//! the node keeps for other front doors (the Gaia hub) are never writable here. Each is
//! registered in the store's ref `native/bucket/<name>`, whose value is a versioned
//! encoding of its owner key (if any) and creation time. Creating it first creates the
//! bucket's capsule, written by the node key, with the owner key (or `open`) in the
//! metadata setting [`OWNER_SETTING`], so the owner is bound into the capsule name and the
//! metadata (and so every proof) exists from the start.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use cairn_capsule::Bucket;
use cairn_core::{Decoder, Encoder, Error, PublicKey};
use cairn_object::check_bucket_name;
use cairn_store::RefUpdate;
use serde::Deserialize;
use serde_json::json;

use super::error::{ApiError, ApiResult, blocking};
use super::{BucketPath, Native, auth, body};
use crate::node::Node;

/// Prefix of the registry refs.
const REGISTRY: &[u8] = b"native/bucket/";
/// Format version of a registry entry.
const ENTRY_VERSION: u8 = 1;
/// The capsule metadata setting that names a bucket's owner key (`ed25519:<hex>`), or
/// [`OPEN`]: bound into the capsule name, so a reader who trusts the name knows who may
/// write through the native API (and whose seals count: `cairn_capsule::seal`).
pub const OWNER_SETTING: &str = cairn_capsule::OWNER_SETTING;
/// [`OWNER_SETTING`]'s value for an open bucket.
pub const OPEN: &str = "open";
/// Largest `POST /v1/buckets` body.
const CREATE_LIMIT: u64 = 64 << 10;

/// A bucket of the native API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The key whose signature every mutation needs; `None` for an open bucket.
    pub owner: Option<PublicKey>,
    /// When the bucket was created, milliseconds since the Unix epoch.
    pub created_ms: u64,
}

impl Entry {
    fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::versioned(ENTRY_VERSION);
        match &self.owner {
            Some(k) => {
                e.u8(1);
                k.encode(&mut e);
            }
            None => {
                e.u8(0);
            }
        }
        e.varint(self.created_ms);
        e.finish()
    }

    fn decode(bytes: &[u8]) -> cairn_core::Result<Self> {
        let mut d = Decoder::new(bytes, "native bucket entry");
        d.version(&[ENTRY_VERSION])?;
        let owner = match d.u8()? {
            0 => None,
            1 => Some(PublicKey::decode(&mut d)?),
            other => return Err(Error::decode(format!("bad owner tag {other}"))),
        };
        let created_ms = d.varint()?;
        d.finish()?;
        Ok(Entry { owner, created_ms })
    }
}

fn registry_ref(name: &str) -> Vec<u8> {
    let mut r = REGISTRY.to_vec();
    r.extend_from_slice(name.as_bytes());
    r
}

/// The registry entry of bucket `name`, if the native API created it (blocking).
pub fn entry(node: &Node, name: &str) -> cairn_core::Result<Option<Entry>> {
    check_bucket_name(name)?;
    match node.store.get_ref(&registry_ref(name))? {
        None => Ok(None),
        Some(v) => Entry::decode(&v)
            .map(Some)
            .map_err(|e| Error::corrupt(format!("registry entry of bucket {name}: {e}"))),
    }
}

/// A bucket the native API serves, opened.
pub struct Opened {
    /// Its registry entry.
    pub entry: Entry,
    /// The bucket (written by the node key).
    pub bucket: Arc<Bucket>,
}

/// Opens bucket `name`; 404 when the native API did not create it.
pub async fn open(node: &Arc<Node>, name: &str) -> ApiResult<Opened> {
    let node = node.clone();
    let name = name.to_string();
    blocking(move || {
        // The Gaia hub's buckets are never served here, even one registered before such
        // names were refused at creation.
        let entry = (!name.starts_with(crate::gaia::BUCKET_PREFIX))
            .then(|| entry(&node, &name))
            .transpose()?
            .flatten();
        let entry = entry.ok_or_else(|| {
            Error::not_found(format!(
                "bucket {name:?} (create it with POST /v1/buckets; `cairn --server URL put` \
                 creates it on its first write)"
            ))
        })?;
        let bucket = node.bucket(&name)?;
        Ok(Opened { entry, bucket })
    })
    .await
}

/// Persists an accepted signature before the request writes anything, so that a restart
/// still refuses its replay.
async fn remember(node: &Arc<Node>, checked: auth::Checked) -> ApiResult<()> {
    let n = node.clone();
    blocking(move || {
        n.replay
            .persist(&*n.store, &checked, auth::now_secs())
            .map_err(Into::into)
    })
    .await
}

/// [`auth::check`] on the blocking pool: the signature check, and the replay table's
/// sweep when it is full (passes over up to 400,000 signatures under its lock), must not
/// hold one of the runtime's few worker threads.
async fn check(
    node: &Arc<Node>,
    owner: PublicKey,
    capsule: Option<String>,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
) -> ApiResult<auth::Checked> {
    let (n, method, uri, headers) = (node.clone(), method.clone(), uri.clone(), headers.clone());
    blocking(move || {
        auth::check(
            &owner,
            capsule.as_deref(),
            &n.replay,
            &method,
            &uri,
            &headers,
            auth::now_secs(),
        )
    })
    .await
}

/// Opens bucket `name` for a mutation: checks the request signature when the bucket has
/// an owner key. Returns the bucket and the BLAKE3 hash its body must have, if signed.
pub async fn open_for_write(
    node: &Arc<Node>,
    name: &str,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
) -> ApiResult<(Opened, Option<[u8; 32]>)> {
    let opened = open(node, name).await?;
    let expect = match &opened.entry.owner {
        Some(owner) => {
            let capsule = opened.bucket.metadata().map(|m| m.name().to_string());
            let checked = check(node, *owner, capsule, method, uri, headers).await?;
            remember(node, checked).await?;
            Some(checked.body_blake3)
        }
        None => None,
    };
    Ok((opened, expect))
}

fn info(name: &str, entry: &Entry, bucket: &Bucket) -> serde_json::Value {
    let meta = bucket.metadata();
    json!({
        "name": name,
        "owner": entry.owner.map(|k| k.to_string()),
        "open": entry.owner.is_none(),
        "created_ms": entry.created_ms,
        "capsule": meta.map(|m| m.name().to_string()),
        "writers": meta.map(|m| m.writers.iter().map(|k| k.to_string()).collect::<Vec<_>>()),
        "hash_algo": meta.map(|m| m.algo.name()),
        "leaf_size": bucket.db().tree_config().leaf_target,
        "index_size": bucket.db().tree_config().index_target,
        "description": meta.map(|m| m.description.clone()),
        "settings": meta.map(|m| m.settings.clone()),
        "metadata": meta.map(|m| hex::encode(m.encode())),
    })
}

/// `POST /v1/buckets` body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    name: String,
    #[serde(default)]
    owner: Option<String>,
    /// Average POS-tree leaf size in bytes (default: the node's `leaf_size`).
    #[serde(default)]
    leaf_size: Option<u64>,
}

/// `POST /v1/buckets`: creates a bucket, open or with an owner key. With an owner key the
/// request must be signed by that key (proof that the creator holds it). Holds a transfer
/// (503 with `Retry-After` when none is free) while its body is read and applied.
pub async fn create(
    State(node): State<Arc<Node>>,
    Extension(native): Extension<Arc<Native>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    // Parameters belong in the body: `?owner=...` must not create an open bucket.
    let _: super::NoQuery = super::query(&uri)?;
    if !super::objects::is_json_body(&headers) {
        return Err(ApiError::json_required());
    }
    let (_permit, body) = body::body_permit(&node, body)?;
    let bytes = body::read_all(body, CREATE_LIMIT.min(node.config.max_upload_bytes), None).await?;
    let req: CreateBody = serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::bad_request(format!(
            "the body must be {{name, owner?, leaf_size?}}: {e}"
        ))
    })?;
    check_bucket_name(&req.name)?;
    if req.name.starts_with(crate::gaia::BUCKET_PREFIX) {
        return Err(Error::invalid(format!(
            "bucket names starting with {:?} are kept for the Gaia hub's addresses",
            crate::gaia::BUCKET_PREFIX
        ))
        .into());
    }
    if let Some(n) = req.leaf_size {
        cairn_object::TreeConfig::default().with_leaf_target(n)?;
    }
    let owner = match &req.owner {
        Some(s) => Some(s.parse::<PublicKey>()?),
        None => None,
    };
    if owner.is_none() {
        let peer = crate::node::PEER.try_with(|ip| *ip).ok();
        if !node.config.open_buckets.allows(peer) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!(
                    "this node creates open buckets (without an owner key) {}: give the \
                     bucket an owner key (\"owner\": \"ed25519:<hex>\"; `cairn --server` \
                     does), or see open_buckets in the node's config",
                    match node.config.open_buckets {
                        crate::config::OpenBuckets::Off => "for no one",
                        _ => "only for clients on its own machine",
                    }
                ),
            ));
        }
    }
    // One create at a time, from the checks on: a name that is taken, or holds data
    // written elsewhere, is refused before the signature is checked, so requests that
    // create nothing take no place in the replay table (concurrent creates of one free
    // name each took one, and filled the table's owner keys cheaply).
    let _one_at_a_time = native.create.lock().await;
    let probe = (node.clone(), req.name.clone(), owner, req.leaf_size);
    let interrupted = blocking(move || {
        let (node, name, owner, leaf_size) = probe;
        if entry(&node, &name)?.is_some() {
            return Err(Error::AlreadyExists(format!("bucket {name:?}")).into());
        }
        // The native API must not take over a bucket another front door (the CLI)
        // wrote.
        let b = Bucket::open(node.db_for(&name)?, node.capsules.clone(), None)?;
        let keys = !b.db().list_keys_page(None, 1)?.0.is_empty();
        match b.metadata() {
            None if !keys => Ok(false),
            // A create of these very settings stopped (a crash) between its capsule and
            // its registry entry: this one finishes it, or the name would stay taken.
            Some(meta) if !keys && left_by_create(&node, &name, meta, owner, leaf_size) => Ok(true),
            _ => Err(Error::AlreadyExists(format!(
                "bucket {name:?} holds data written outside the native API"
            ))
            .into()),
        }
    })
    .await?;
    if let Some(owner) = &owner {
        // The body is read whole: a body other than the signed one is refused before the
        // signature takes a place in the replay table.
        if auth::body_blake3(&bytes) != auth::signed_body_hash(&headers)? {
            return Err(ApiError::unauthorized(
                "the body's BLAKE3 hash differs from the signed one",
            ));
        }
        // The bucket's capsule does not exist yet: a capsule line is signed, not checked.
        let checked = check(&node, *owner, None, &method, &uri, &headers).await?;
        remember(&node, checked).await?;
    }
    let name = req.name;
    let leaf_size = req.leaf_size;
    let info = blocking(move || {
        let entry = Entry {
            owner,
            created_ms: auth::now_secs().saturating_mul(1000),
        };
        // The capsule first, with the owner in its metadata, then the registry entry that
        // makes the bucket visible here.
        let owner_setting = owner.map_or_else(|| OPEN.to_string(), |k| k.to_string());
        let bucket = if interrupted {
            node.bucket(&name)?
        } else {
            node.create_bucket(&name, leaf_size, &[(OWNER_SETTING, owner_setting)])?
        };
        node.store.commit(&[RefUpdate::Set {
            name: registry_ref(&name),
            value: entry.encode(),
        }])?;
        Ok(info(&name, &entry, &bucket))
    })
    .await?;
    Ok((StatusCode::CREATED, Json(info)).into_response())
}

/// Whether `meta` is the capsule a native create of bucket `name` with `owner` and
/// `leaf_size` makes on this node (written by the node's key, with exactly those
/// settings), so a create that stopped before its registry entry can be finished by the
/// same request sent again.
fn left_by_create(
    node: &Node,
    name: &str,
    meta: &cairn_capsule::CapsuleMetadata,
    owner: Option<PublicKey>,
    leaf_size: Option<u64>,
) -> bool {
    let leaf_size = leaf_size.unwrap_or(node.config.leaf_size).to_string();
    let owner = owner.map_or_else(|| OPEN.to_string(), |k| k.to_string());
    let setting = |k: &str| meta.settings.get(k).map(String::as_str);
    meta.writers == [node.public_key()]
        && meta.settings.len() == 3
        && setting(cairn_capsule::bucket::BUCKET_SETTING) == Some(name)
        && setting(cairn_capsule::bucket::LEAF_SIZE_SETTING) == Some(leaf_size.as_str())
        && setting(OWNER_SETTING) == Some(owner.as_str())
}

/// Most buckets one `GET /v1/buckets` page lists.
const MAX_BUCKETS_PAGE: usize = 10_000;

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    after: Option<String>,
    limit: Option<usize>,
}

/// `GET /v1/buckets?after=&limit=`: the buckets of the native API by name, a page of at
/// most `limit` (default 1000, at most [`MAX_BUCKETS_PAGE`]); when more follow, `next` is
/// the `after` of the next page.
pub async fn list(State(node): State<Arc<Node>>, uri: Uri) -> ApiResult<Response> {
    let q: ListQuery = super::query(&uri)?;
    let limit = q.limit.unwrap_or(1000);
    if limit == 0 || limit > MAX_BUCKETS_PAGE {
        return Err(ApiError::bad_request(format!(
            "limit must be 1 to {MAX_BUCKETS_PAGE}"
        )));
    }
    let permit = body::transfer_permit(&node)?;
    let n = node.clone();
    let answer = blocking(move || {
        // The page starts just past `after`: its ref name with a zero byte appended is
        // the least name above it.
        let mut from = registry_ref(q.after.as_deref().unwrap_or(""));
        if q.after.is_some() {
            from.push(0);
        }
        let refs = n
            .store
            .list_refs_from(REGISTRY, &from, limit.saturating_add(1))?;
        let more = refs.len() > limit;
        let mut out = Vec::with_capacity(refs.len().min(limit));
        let mut last = None;
        for (name, value) in refs.into_iter().take(limit) {
            let name = String::from_utf8_lossy(&name[REGISTRY.len()..]).into_owned();
            let e = Entry::decode(&value)
                .map_err(|e| Error::corrupt(format!("registry entry of bucket {name}: {e}")))?;
            out.push(json!({
                "name": name,
                "owner": e.owner.map(|k| k.to_string()),
                "created_ms": e.created_ms,
            }));
            last = Some(name);
        }
        Ok(json!({ "buckets": out, "next": if more { last } else { None } }))
    })
    .await?;
    Ok(body::json_response(node, permit, answer))
}

/// `GET /v1/buckets/{bucket}`: owner, capsule name, writers and the capsule metadata
/// (hex), everything a client needs to check proofs.
pub async fn show(
    State(node): State<Arc<Node>>,
    BucketPath(name): BucketPath,
    uri: Uri,
) -> ApiResult<Json<serde_json::Value>> {
    let _: super::NoQuery = super::query(&uri)?;
    // Opening a bucket may replay its capsule's journal: under a read transfer, as every
    // read is (held until the answer is built).
    let _permit = body::transfer_permit(&node)?;
    let o = open(&node, &name).await?;
    Ok(Json(info(&name, &o.entry, &o.bucket)))
}

/// `GET /v1/buckets/{bucket}/metadata`: the capsule metadata bytes (what `cairn
/// verify-proof --metadata` reads; they hash to the capsule name).
pub async fn metadata(
    State(node): State<Arc<Node>>,
    BucketPath(name): BucketPath,
    uri: Uri,
) -> ApiResult<Response> {
    let _: super::NoQuery = super::query(&uri)?;
    // As `show`.
    let _permit = body::transfer_permit(&node)?;
    let o = open(&node, &name).await?;
    let meta = o.bucket.metadata().ok_or_else(|| {
        ApiError::from(Error::not_found(format!("the capsule of bucket {name:?}")))
    })?;
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (
                header::HeaderName::from_static("x-cairn-capsule"),
                meta.name().to_string(),
            ),
        ],
        meta.encode(),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_strictly() {
        let k = cairn_core::SigningKey::from_seed(&[9; 32]).public();
        for e in [
            Entry {
                owner: None,
                created_ms: 5,
            },
            Entry {
                owner: Some(k),
                created_ms: 1 << 40,
            },
        ] {
            let b = e.encode();
            assert_eq!(Entry::decode(&b).unwrap(), e);
            let mut longer = b.clone();
            longer.push(0);
            assert!(Entry::decode(&longer).is_err());
            assert!(Entry::decode(&b[..b.len() - 1]).is_err());
        }
    }

    /// A `gaia-` bucket registered before such names were refused (as an attacker could)
    /// is not served by the native API, nor read through the hub.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_gaia_bucket_in_the_registry_is_not_served() {
        let dir = tempfile::tempdir().unwrap();
        let node = Node::open(crate::Config {
            data_dir: dir.path().join("data"),
            durability: cairn_store::Durability::Buffered,
            ..crate::Config::default()
        })
        .unwrap();
        let address = "1BgGZ9tcN4rm9KBzDn7KprQz87SZ26SAMH";
        let name = crate::gaia::bucket_name(address).unwrap();
        // A file in the hub's bucket of that address, served until the name is registered.
        node.bucket(&name)
            .unwrap()
            .put(
                b"k",
                cairn_object::Target::Branch(cairn_object::db::DEFAULT_BRANCH),
                cairn_object::NewValue::String(b"planted".to_vec()),
                &cairn_object::PutOptions::default(),
            )
            .unwrap();
        let gaia_read = || {
            use hyper::service::Service;
            let service =
                hyper_util::service::TowerToHyperService::new(crate::router(node.clone()));
            let req = axum::http::Request::get(format!("/read/{address}/k"))
                .header("host", "localhost")
                .body(Body::empty())
                .unwrap();
            async move { service.call(req).await.unwrap().status() }
        };
        assert_eq!(gaia_read().await, StatusCode::OK);
        let entry = Entry {
            owner: None,
            created_ms: 0,
        };
        node.store
            .commit(&[RefUpdate::Set {
                name: registry_ref(&name),
                value: entry.encode(),
            }])
            .unwrap();
        let e = open(&node, &name).await.err().unwrap();
        assert_eq!(e.status, 404, "{}", e.message);
        // Nor by the hub: what was written into it through the native API (open to
        // anyone) must not be served as the address's files.
        assert_eq!(gaia_read().await, StatusCode::NOT_FOUND);
        // An ordinary name in the registry is served.
        node.store
            .commit(&[RefUpdate::Set {
                name: registry_ref("plain"),
                value: entry.encode(),
            }])
            .unwrap();
        assert!(open(&node, "plain").await.is_ok());
    }
}

//! Revocation of Gaia tokens cannot be abused and reaches uploads in flight: `revoke-all`
//! refuses times far ahead of the node's clock and tokens that revocation cannot stop
//! (legacy, without `iat`, already revoked), so a stolen token cannot lock the owner out;
//! an upload whose token is revoked, or expires, while its body is arriving stores nothing.

mod gaia_support;

use std::time::Duration;

use cairn_node::gaia::bucket_name;
use gaia_support::{Hub, Key, now};
use serde_json::{Value, json};

fn err_name(v: &Value) -> &str {
    v["error"].as_str().unwrap_or("")
}

/// `POST /revoke-all/{address}` with a JSON body; status and JSON answer.
async fn revoke(hub: &Hub, address: &str, auth: &str, ts: Value) -> (u16, Value) {
    let resp = hub
        .http
        .post(hub.url(&format!("/revoke-all/{address}")))
        .header("authorization", auth)
        .header("content-type", "application/json")
        .body(json!({ "oldestValidTimestamp": ts }).to_string())
        .send()
        .await
        .unwrap();
    let st = resp.status().as_u16();
    (st, resp.json().await.unwrap_or(Value::Null))
}

/// The revocation time as Gaia serves it (`None`: never set).
async fn revocation_time(hub: &Hub, address: &str) -> Option<i64> {
    let (st, _, _, body) = hub.read(&format!("{address}-auth"), "authTimestamp").await;
    (st == 200).then(|| String::from_utf8(body).unwrap().parse().unwrap())
}

/// A v1 token of `k` issued at `iat`.
fn token_at(k: &Key, iat: i64) -> String {
    let mut p = k.payload();
    p["iat"] = json!(iat);
    k.bearer_with(&p)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoke_all_cannot_lock_the_owner_out() {
    let hub = Hub::start(1 << 20).await;
    let k = Key::new(30);
    let a = k.address();
    let t = now() as i64;
    let stolen = token_at(&k, t - 1000);
    assert_eq!(hub.store(&stolen, &a, "f", b"1", &[]).await.0, 202);

    // A time far ahead of the node's clock is refused, saying the limit; nothing changes.
    for ts in [
        json!(i64::MAX),
        json!((t + 301 + 5).to_string()),
        json!(t + 3600),
    ] {
        let (st, v) = revoke(&hub, &a, &stolen, ts.clone()).await;
        assert_eq!(st, 400, "{ts}: {v}");
        let msg = v["message"].as_str().unwrap();
        assert!(msg.contains("300 seconds ahead"), "{msg}");
    }
    assert_eq!(revocation_time(&hub, &a).await, None);
    assert_eq!(hub.store(&stolen, &a, "f", b"2", &[]).await.0, 202);

    // A legacy token (never revocable) and a v1 token without iat may not revoke.
    let legacy = k.legacy_bearer(r#"["gaiahub","0","gaia-0","blockstack_storage_please_sign"]"#);
    let mut p = k.payload();
    p.as_object_mut().unwrap().remove("iat");
    let no_iat = k.bearer_with(&p);
    for (what, auth) in [("legacy", &legacy), ("no iat", &no_iat)] {
        let (st, v) = revoke(&hub, &a, auth, json!(t)).await;
        assert_eq!((st, err_name(&v)), (401, "ValidationError"), "{what}: {v}");
        let msg = v["message"].as_str().unwrap();
        assert!(msg.contains("revoke-all needs a v1"), "{what}: {msg}");
    }
    assert_eq!(revocation_time(&hub, &a).await, None);

    // The owner revokes the stolen token; within the allowed skew is accepted.
    let owner = token_at(&k, t);
    let (st, v) = revoke(&hub, &a, &owner, json!(t - 10)).await;
    assert_eq!((st, v), (202, json!({"status": "success"})));
    assert_eq!(revocation_time(&hub, &a).await, Some(t - 10));
    // The revoked token can no longer move the time, not even within the skew.
    for ts in [json!(t + 200), json!(t)] {
        let (st, v) = revoke(&hub, &a, &stolen, ts).await;
        assert_eq!(
            (st, err_name(&v)),
            (401, "AuthTokenTimestampValidationError"),
            "{v}"
        );
    }
    assert_eq!(revocation_time(&hub, &a).await, Some(t - 10));
    // The legacy token still works for files (the hub's rule), not for revoke-all.
    assert_eq!(hub.store(&legacy, &a, "l", b"x", &[]).await.0, 202);
    assert_eq!(revoke(&hub, &a, &legacy, json!(t + 200)).await.0, 401);
    // After all the attacker's attempts the owner's tokens still work.
    assert_eq!(hub.store(&owner, &a, "f", b"3", &[]).await.0, 202);
    assert_eq!(hub.store(&k.bearer(), &a, "g", b"3", &[]).await.0, 202);
    assert_eq!(hub.store(&stolen, &a, "f", b"4", &[]).await.0, 401);
    assert_eq!(hub.read(&a, "f").await.3, b"3");
    // Up to the skew ahead is allowed, and the time still only moves forward.
    let (st, _) = revoke(&hub, &a, &owner, json!(t + 250)).await;
    assert_eq!(st, 202);
    let fresh = token_at(&k, t + 250);
    assert_eq!(revoke(&hub, &a, &fresh, json!(t)).await.0, 202);
    assert_eq!(revocation_time(&hub, &a).await, Some(t + 250));
    assert_eq!(hub.store(&fresh, &a, "f", b"5", &[]).await.0, 202);
}

fn tokio_stream(
    mut rx: tokio::sync::mpsc::Receiver<Result<Vec<u8>, std::io::Error>>,
) -> impl futures_util::Stream<Item = Result<Vec<u8>, std::io::Error>> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// Starts a store of `path` whose body comes in parts, and waits until the node has
/// checked its token (it opens the address's bucket just before: the bucket must not
/// exist yet). Returns the sender of the remaining parts and the request's task.
async fn start_slow_store(
    hub: &Hub,
    address: &str,
    auth: &str,
    path: &str,
) -> (
    tokio::sync::mpsc::Sender<Result<Vec<u8>, std::io::Error>>,
    tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>,
) {
    let capsule_ref = format!("bucket-capsule/{}", bucket_name(address).unwrap());
    assert!(
        hub.node
            .store
            .get_ref(capsule_ref.as_bytes())
            .unwrap()
            .is_none(),
        "use an address without a bucket"
    );
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(1);
    let slow = hub
        .http
        .post(hub.url(&format!("/store/{address}/{path}")))
        .header("authorization", auth)
        .body(reqwest::Body::wrap_stream(tokio_stream(rx)))
        .send();
    let slow = tokio::spawn(slow);
    tx.send(Ok(b"part one ".to_vec())).await.unwrap();
    let mut opened = false;
    for _ in 0..1000 {
        if hub
            .node
            .store
            .get_ref(capsule_ref.as_bytes())
            .unwrap()
            .is_some()
        {
            opened = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(opened, "the node never opened the bucket");
    // The token checks follow the bucket's opening at once; the body has not ended.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!slow.is_finished());
    (tx, slow)
}

/// A token limited by scopes (an archival-only backup, a collaborator's prefix) may not
/// revoke the address's other tokens; a revocation that moves nothing is answered as
/// before and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scoped_token_cannot_revoke_all() {
    let hub = Hub::start(1 << 20).await;
    let k = Key::new(35);
    let a = k.address();
    let t = now() as i64;
    for scopes in [
        json!([{"scope": "putFileArchivalPrefix", "domain": "arch/"}]),
        json!([{"scope": "putFilePrefix", "domain": "shared/"}]),
        json!([{"scope": "deleteFile", "domain": "x"}]),
    ] {
        let mut p = k.payload();
        p["iat"] = json!(t);
        p["scopes"] = scopes.clone();
        let (st, v) = revoke(&hub, &a, &k.bearer_with(&p), json!(t + 100)).await;
        assert_eq!(
            (st, err_name(&v)),
            (401, "ValidationError"),
            "{scopes}: {v}"
        );
        let msg = v["message"].as_str().unwrap();
        assert!(msg.contains("without scopes"), "{msg}");
    }
    assert_eq!(revocation_time(&hub, &a).await, None);
    let owner = token_at(&k, t);
    assert_eq!(revoke(&hub, &a, &owner, json!(t)).await.0, 202);
    assert_eq!(revocation_time(&hub, &a).await, Some(t));
    for ts in [json!(t), json!(t - 50)] {
        assert_eq!(revoke(&hub, &a, &owner, ts).await.0, 202);
    }
    assert_eq!(revocation_time(&hub, &a).await, Some(t));
    // A token revoked by that time is still refused, even for a time that moves nothing.
    let old = token_at(&k, t - 100);
    let (st, v) = revoke(&hub, &a, &old, json!(t - 50)).await;
    assert_eq!(
        (st, err_name(&v)),
        (401, "AuthTokenTimestampValidationError"),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_revoked_while_its_body_arrives_stores_nothing() {
    let hub = Hub::start(1 << 20).await;
    let k = Key::new(31);
    let a = k.address();
    let t = now() as i64;
    let uploader = token_at(&k, t);
    let (tx, slow) = start_slow_store(&hub, &a, &uploader, "doc").await;
    // The token passed its checks; now the owner revokes it.
    let (st, v) = revoke(&hub, &a, &token_at(&k, t), json!(t + 1)).await;
    assert_eq!(st, 202, "{v}");
    tx.send(Ok(b"part two".to_vec())).await.unwrap();
    drop(tx);
    let resp = slow.await.unwrap().unwrap();
    assert_eq!(resp.status(), 401);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(err_name(&v), "AuthTokenTimestampValidationError", "{v}");
    // The same answer the check before the body gives.
    let (st, before) = hub.store(&uploader, &a, "doc", b"x", &[]).await;
    assert_eq!((st, &before), (401, &v));
    // Nothing was stored, and the path is free for a valid token.
    assert_eq!(hub.read(&a, "doc").await.0, 404);
    let fresh = token_at(&k, t + 1);
    assert!(hub.names(&fresh, &a).await.is_empty());
    assert_eq!(hub.store(&fresh, &a, "doc", b"new", &[]).await.0, 202);
    assert_eq!(hub.read(&a, "doc").await.3, b"new");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_whose_token_expires_while_its_body_arrives_stores_nothing() {
    let hub = Hub::start(1 << 20).await;
    let k = Key::new(32);
    let a = k.address();
    let mut p = k.payload();
    let exp = now() + 2.0;
    p["exp"] = json!(exp);
    let (tx, slow) = start_slow_store(&hub, &a, &k.bearer_with(&p), "doc").await;
    while now() <= exp + 0.2 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tx.send(Ok(b"part two".to_vec())).await.unwrap();
    drop(tx);
    let resp = slow.await.unwrap().unwrap();
    assert_eq!(resp.status(), 401);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(err_name(&v), "ValidationError", "{v}");
    assert_eq!(
        v["message"],
        format!("Expired authentication token: expire time of {exp} (secs since epoch)")
    );
    assert_eq!(hub.read(&a, "doc").await.0, 404);
    assert!(hub.names(&k.bearer(), &a).await.is_empty());
}

/// A token issued far ahead of the node's clock would outlive every `revoke-all` its owner
/// could make (those take times at most 300 s ahead): it is refused, and stores nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_issued_in_the_future_is_refused() {
    let hub = Hub::start(1 << 20).await;
    let k = Key::new(33);
    let a = k.address();
    let t = now() as i64;
    let ahead = token_at(&k, t + 3600);
    let (st, body) = hub.store(&ahead, &a, "f", b"1", &[]).await;
    assert_eq!(st, 401, "{body}");
    assert!(body.to_string().contains("issued in the future"), "{body}");
    assert!(hub.names(&k.bearer(), &a).await.is_empty());
    // Within the clock skew it is accepted.
    let near = token_at(&k, t + 60);
    assert_eq!(hub.store(&near, &a, "f", b"1", &[]).await.0, 202);
}

/// Every token the hub accepts can be revoked at once: a token issued just under the skew
/// ahead (a fraction of a second past the last whole second `revoke-all` may name) is
/// either refused or revoked by the latest `revoke-all` allowed right after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_accepted_token_can_be_revoked_at_once() {
    let hub = Hub::start(1 << 20).await;
    let k = Key::new(35);
    let a = k.address();
    for frac in [0.0, 0.5, 0.999] {
        let t = now().floor();
        let mut p = k.payload();
        p["iat"] = json!(t + 300.0 + frac);
        let ahead = k.bearer_with(&p);
        let (st, body) = hub.store(&ahead, &a, "g", b"1", &[]).await;
        if st == 401 {
            assert!(body.to_string().contains("issued in the future"), "{body}");
            continue;
        }
        assert_eq!(st, 202, "{body}");
        let latest = now().floor() as i64 + 300;
        let (st, body) = revoke(&hub, &a, &ahead, json!(latest)).await;
        assert_eq!(st, 202, "{body}");
        let (st, body) = hub.store(&ahead, &a, "g", b"2", &[]).await;
        assert_eq!(
            st,
            401,
            "iat {} outlived a revoke-all at {latest}: {body}",
            t + 300.0 + frac
        );
    }
}

/// Requests refused before their body (a bad path, a precondition that fails, a body over
/// the limit) leave no bucket behind; the first accepted store creates it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_requests_create_no_bucket() {
    let hub = Hub::start(1 << 20).await;
    let k = Key::new(34);
    let a = k.address();
    let name = bucket_name(&a).unwrap();
    let exists = || {
        hub.node
            .store
            .get_ref(format!("bucket-capsule/{name}").as_bytes())
            .unwrap()
            .is_some()
    };
    let auth = token_at(&k, now() as i64);
    let (st, v) = hub.store(&auth, &a, "a..b", b"x", &[]).await;
    assert_eq!(st, 403, "{v}");
    let (st, v) = hub
        .store(&auth, &a, "f", b"x", &[("if-match", "\"nosuch\"")])
        .await;
    assert_eq!(st, 412, "{v}");
    let (st, v) = hub
        .store(&auth, &a, "f", &vec![0u8; (1 << 20) + 1], &[])
        .await;
    assert_eq!(st, 413, "{v}");
    assert!(!exists(), "a refused request created the bucket");
    assert_eq!(hub.store(&auth, &a, "f", b"x", &[]).await.0, 202);
    assert!(exists());
}

/// A file deleted under an archival scope while a write to it is still uploading: the
/// write lands (202, readable), and goes on from the archived versions, as it does when
/// the delete comes first. (It used to fail with 500: its base was decided before the
/// body, when the file still had a head.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_deleted_while_a_write_uploads_is_written() {
    let hub = Hub::start(1 << 20).await;
    let k = Key::new(34);
    let a = k.address();
    let full = k.bearer();
    let mut p = k.payload();
    p["scopes"] = json!([{"scope": "putFileArchivalPrefix", "domain": "arch/"}]);
    let arch = k.bearer_with(&p);
    assert_eq!(hub.store(&arch, &a, "arch/f", b"1", &[]).await.0, 202);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(1);
    let slow = tokio::spawn(
        hub.http
            .post(hub.url(&format!("/store/{a}/arch/f")))
            .header("authorization", full.clone())
            .body(reqwest::Body::wrap_stream(tokio_stream(rx)))
            .send(),
    );
    tx.send(Ok(b"part one, ".to_vec())).await.unwrap();
    // The write's checks before the body pass with the file present.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!slow.is_finished());
    assert_eq!(hub.delete(&arch, &a, "arch/f").await.0, 202);
    assert_eq!(hub.read(&a, "arch/f").await.0, 404);
    tx.send(Ok(b"part two".to_vec())).await.unwrap();
    drop(tx);
    let resp = slow.await.unwrap().unwrap();
    let st = resp.status().as_u16();
    assert_eq!(st, 202, "{}", resp.text().await.unwrap_or_default());
    assert_eq!(hub.read(&a, "arch/f").await.3, b"part one, part two");
    let bucket = hub.node.bucket(&bucket_name(&a).unwrap()).unwrap();
    let all = bucket
        .db()
        .track(b"arch/f", &cairn_object::At::default_branch(), 0, 10)
        .unwrap();
    assert_eq!(all.len(), 2, "the write goes on from the archived version");
}

/// An archival store refused at its commit (its token revoked while the body was on its
/// way) keeps nothing, not even the `.history.` branch of the head it would have replaced:
/// that branch is made once every check passed, before the commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_archival_store_leaves_no_history_branch() {
    let hub = Hub::start(1 << 20).await;
    let k = Key::new(61);
    let a = k.address();
    let t = now() as i64;
    assert_eq!(
        hub.store(&token_at(&k, t), &a, "arch/f", b"1", &[]).await.0,
        202
    );
    let mut p = k.payload();
    p["iat"] = json!(t);
    p["scopes"] = json!([{"scope": "putFileArchivalPrefix", "domain": "arch/"}]);
    let arch = k.bearer_with(&p);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(1);
    let slow = hub
        .http
        .post(hub.url(&format!("/store/{a}/arch/f")))
        .header("authorization", &arch)
        .body(reqwest::Body::wrap_stream(tokio_stream(rx)))
        .send();
    let slow = tokio::spawn(slow);
    tx.send(Ok(b"part one ".to_vec())).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!slow.is_finished());
    let (st, v) = revoke(&hub, &a, &token_at(&k, t), json!(t + 1)).await;
    assert_eq!(st, 202, "{v}");
    tx.send(Ok(b"part two".to_vec())).await.unwrap();
    drop(tx);
    assert_eq!(slow.await.unwrap().unwrap().status(), 401);
    assert_eq!(hub.read(&a, "arch/f").await.3, b"1");
    let bucket = hub.node.bucket(&bucket_name(&a).unwrap()).unwrap();
    let table = bucket.db().existing_table(b"arch/f").unwrap();
    let history: Vec<&String> = table
        .tagged
        .keys()
        .filter(|b| b.starts_with(".history."))
        .collect();
    assert!(history.is_empty(), "a refused store forked {history:?}");
}

//! HTTP tests of the Gaia hub over a real socket: every endpoint, every auth failure
//! (each a 401 with nothing stored), scopes, `If-Match` / `If-None-Match`, revocation,
//! paging, size limits, write queues and 100 concurrent writers to one path.

mod gaia_support;

use cairn_node::gaia::{GaiaConfig, bucket_name};
use cairn_object::{At, Uid};
use gaia_support::{Hub, Key, now};
use serde_json::{Value, json};

fn err_name(v: &Value) -> &str {
    v["error"].as_str().unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_info_with_and_without_slash_and_cors() {
    let hub = Hub::start(5 << 30).await;
    for path in ["/hub_info", "/hub_info/"] {
        let r = hub.http.get(hub.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["access-control-allow-origin"], "*");
        assert_eq!(r.headers()["content-type"], "application/json");
        let v: Value = r.json().await.unwrap();
        assert_eq!(
            v["challenge_text"],
            r#"["gaiahub","0","gaia-0","blockstack_storage_please_sign"]"#
        );
        assert_eq!(v["latest_auth_version"], "v1");
        assert_eq!(v["max_file_upload_size_megabytes"], 5120);
        assert_eq!(v["read_url_prefix"], format!("{}/read/", hub.base));
    }
    // The hub's preflight on a write route.
    let r = hub
        .http
        .request(reqwest::Method::OPTIONS, hub.url("/store/1abc/x.txt"))
        .header("origin", "https://app.example")
        .header("access-control-request-method", "POST")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let h = r.headers();
    assert_eq!(h["access-control-allow-origin"], "*");
    assert_eq!(
        h["access-control-allow-methods"],
        "DELETE,POST,GET,OPTIONS,HEAD"
    );
    // The requested headers are echoed, as the hub's `cors()` does.
    assert!(h.get("access-control-allow-headers").is_none());
    let r = hub
        .http
        .request(reqwest::Method::OPTIONS, hub.url("/store/1abc/x.txt"))
        .header("origin", "https://app.example")
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "authorization,content-type,sentry-trace",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.headers()["access-control-allow-headers"],
        "authorization,content-type,sentry-trace"
    );
    assert_eq!(h["access-control-max-age"], "86400");
    // The reader's preflight echoes the requested headers.
    let r = hub
        .http
        .request(reqwest::Method::OPTIONS, hub.url("/read/1abc/x.txt"))
        .header("access-control-request-headers", "range")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    assert_eq!(
        r.headers()["access-control-allow-methods"],
        "GET,HEAD,OPTIONS"
    );
    assert_eq!(r.headers()["access-control-allow-headers"], "range");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_read_url_and_fractional_limit() {
    let gaia = GaiaConfig {
        read_url: Some("https://cdn.example/files".into()),
        ..GaiaConfig::default()
    };
    let hub = Hub::with(3 << 19, 256, gaia).await;
    let v: Value = hub
        .http
        .get(hub.url("/hub_info"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["read_url_prefix"], "https://cdn.example/files/");
    assert_eq!(v["max_file_upload_size_megabytes"], 1.5);
    let k = Key::new(1);
    let (st, w) = hub
        .store(&k.bearer(), &k.address(), "a.txt", b"x", &[])
        .await;
    assert_eq!(st, 202);
    assert_eq!(
        w["publicURL"],
        format!("https://cdn.example/files/{}/a.txt", k.address())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_read_list_delete() {
    let hub = Hub::start(1 << 20).await;
    let k = Key::new(2);
    let (a, auth) = (k.address(), k.bearer());
    let (st, w) = hub
        .store(
            &auth,
            &a,
            "dir/hello.txt",
            b"hello gaia",
            &[("content-type", "text/plain")],
        )
        .await;
    assert_eq!(st, 202, "{w}");
    let url = w["publicURL"].as_str().unwrap();
    assert_eq!(url, format!("{}/read/{a}/dir/hello.txt", hub.base));
    let tag = w["etag"].as_str().unwrap().to_string();
    // The ETag is the version uid.
    let uid: Uid = tag.parse().unwrap();
    let bucket = hub.node.bucket(&bucket_name(&a).unwrap()).unwrap();
    assert_eq!(
        bucket
            .db()
            .resolve(b"dir/hello.txt", &At::default_branch())
            .unwrap(),
        uid
    );
    // The address's bucket chunks with the node's leaf size, recorded in its capsule.
    assert_eq!(bucket.db().tree_config().leaf_target, 65536);
    assert_eq!(
        bucket.metadata().unwrap().settings["cairn.leaf_size"],
        "65536"
    );

    let r = hub.http.get(url).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let h = r.headers().clone();
    assert_eq!(h["etag"], tag.as_str());
    assert_eq!(h["content-type"], "text/plain");
    assert_eq!(h["content-length"], "10");
    assert_eq!(h["cache-control"], "no-cache");
    assert_eq!(h["access-control-allow-origin"], "*");
    assert_eq!(
        h["access-control-expose-headers"],
        "Content-Type,ETag,Content-Range,Accept-Ranges"
    );
    assert!(h.contains_key("last-modified"));
    assert_eq!(r.bytes().await.unwrap().as_ref(), b"hello gaia");
    let r = hub.http.head(url).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-length"], "10");
    assert_eq!(r.headers()["etag"], tag.as_str());

    // A missing content type is stored as application/octet-stream.
    let (st, _) = hub.store(&auth, &a, "b.bin", &[0, 1, 2], &[]).await;
    assert_eq!(st, 202);
    let (_, _, ct, body) = hub.read(&a, "b.bin").await;
    assert_eq!(ct.as_deref(), Some("application/octet-stream"));
    assert_eq!(body, [0, 1, 2]);

    assert_eq!(hub.names(&auth, &a).await, ["b.bin", "dir/hello.txt"]);
    let (st, v) = hub.list(&auth, &a, json!({"stat": true})).await;
    assert_eq!(st, 202);
    assert!(v["page"].is_null());
    let e = &v["entries"][1];
    assert_eq!(e["name"], "dir/hello.txt");
    assert_eq!(e["exists"], true);
    assert_eq!(e["etag"], tag.as_str());
    assert_eq!(e["contentLength"], 10);
    assert_eq!(e["contentType"], "text/plain");
    let lm = e["lastModifiedDate"].as_u64().unwrap() as f64;
    assert!((lm - now()).abs() < 60.0, "{lm}");

    // Overwrite: a new version on top of the old one (history kept).
    let (st, w2) = hub.store(&auth, &a, "dir/hello.txt", b"v2", &[]).await;
    assert_eq!(st, 202);
    let uid2: Uid = w2["etag"].as_str().unwrap().parse().unwrap();
    assert_eq!(bucket.db().load(&uid2).unwrap().bases, vec![uid]);
    assert_eq!(hub.read(&a, "dir/hello.txt").await.3, b"v2");

    // Delete: 202 with an empty body, then 404 on read, on a second delete, gone from lists.
    let (st, body) = hub.delete(&auth, &a, "dir/hello.txt").await;
    assert_eq!((st, body.as_str()), (202, ""));
    let (st, _, ct, body) = hub.read(&a, "dir/hello.txt").await;
    assert_eq!(st, 404);
    assert_eq!(ct.as_deref(), Some("text/html; charset=utf-8"));
    assert_eq!(body, b"File not found");
    let (st, body) = hub.delete(&auth, &a, "dir/hello.txt").await;
    assert_eq!(st, 404);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(err_name(&v), "DoesNotExist");
    assert_eq!(hub.names(&auth, &a).await, ["b.bin"]);
    // The versions stay in the store.
    assert_eq!(bucket.db().load(&uid2).unwrap().bases, vec![uid]);

    // Reads of unknown addresses and files are 404s; bad paths are 403s.
    assert_eq!(hub.read(&Key::new(9).address(), "x").await.0, 404);
    assert_eq!(hub.read("notanaddress", "x").await.0, 404);
    let (st, v) = hub.store(&auth, &a, "a..b", b"x", &[]).await;
    assert_eq!((st, err_name(&v)), (403, "BadPathError"));
    let (st, v) = hub.store(&auth, &a, "a%00b", b"x", &[]).await;
    assert_eq!((st, err_name(&v)), (403, "BadPathError"));
    // A trailing slash is dropped, as the hub does.
    let (st, w) = hub.store(&auth, &a, "t.txt/", b"t", &[]).await;
    assert_eq!(st, 202);
    assert!(w["publicURL"].as_str().unwrap().ends_with("/t.txt"));

    // Bytes are counted under api="gaia".
    let m = hub.node.metrics.render().unwrap();
    assert!(
        m.lines()
            .any(|l| l.starts_with("cairn_bytes_written_total{api=\"gaia\"}")),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn if_match_and_if_none_match() {
    let hub = Hub::start(1 << 20).await;
    let k = Key::new(3);
    let (a, auth) = (k.address(), k.bearer());
    let p = "doc.json";
    let none = [("if-none-match", "*")];
    let (st, w) = hub.store(&auth, &a, p, b"1", &none).await;
    assert_eq!(st, 202);
    let t1 = w["etag"].as_str().unwrap().to_string();
    let (st, v) = hub.store(&auth, &a, p, b"2", &none).await;
    assert_eq!((st, err_name(&v)), (412, "PreconditionFailedError"));
    assert_eq!(
        v["message"],
        "The entity you are trying to create already exists"
    );
    let (st, v) = hub
        .store(&auth, &a, p, b"2", &[("if-none-match", "abc")])
        .await;
    assert_eq!(st, 412, "{v}");
    let (st, _) = hub
        .store(
            &auth,
            &a,
            p,
            b"2",
            &[("if-match", &t1), ("if-none-match", "*")],
        )
        .await;
    assert_eq!(st, 412);
    let (st, w) = hub.store(&auth, &a, p, b"2", &[("if-match", &t1)]).await;
    assert_eq!(st, 202);
    let t2 = w["etag"].as_str().unwrap().to_string();
    // A stale or malformed ETag is refused; nothing changes.
    for stale in [t1.as_str(), "\"nope\""] {
        let (st, v) = hub.store(&auth, &a, p, b"3", &[("if-match", stale)]).await;
        assert_eq!((st, err_name(&v)), (412, "PreconditionFailedError"));
    }
    let (_, etag, _, body) = hub.read(&a, p).await;
    assert_eq!((etag.unwrap(), body), (t2.clone(), b"2".to_vec()));
    // If-Match on a file that does not exist fails; `*` matches anything.
    let (st, _) = hub
        .store(&auth, &a, "new", b"x", &[("if-match", &t2)])
        .await;
    assert_eq!(st, 412);
    let (st, _) = hub.store(&auth, &a, p, b"4", &[("if-match", "*")]).await;
    assert_eq!(st, 202);
    // The ETag from a read works for the next write (what @stacks/storage does).
    let (_, etag, _, _) = hub.read(&a, p).await;
    let (st, _) = hub
        .store(&auth, &a, p, b"5", &[("if-match", &etag.unwrap())])
        .await;
    assert_eq!(st, 202);
}

/// Every refused token: 401 with the hub's error name, and nothing stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_failures_store_nothing() {
    let hub = Hub::start(1 << 20).await;
    let owner = Key::new(4);
    let other = Key::new(5);
    let a = owner.address();
    let mut cases: Vec<(&str, String)> = vec![
        ("missing header", String::new()),
        ("not bearer", "basic abc".into()),
        ("malformed jwt", "bearer v1:not.a.jwt".into()),
        ("unknown version", "bearer v9:abc".into()),
        ("garbage legacy", "bearer !!!".into()),
    ];
    // Signed by another key but claiming the owner's iss.
    let good = owner.jwt(&owner.payload(), false);
    let forged = other.jwt(&owner.payload(), false);
    let (head, _) = good.rsplit_once('.').unwrap();
    let (_, sig) = forged.rsplit_once('.').unwrap();
    cases.push(("bad signature", format!("bearer v1:{head}.{sig}")));
    cases.push(("wrong address", other.bearer()));
    let mut p = owner.payload();
    p["exp"] = json!(now() - 10.0);
    cases.push(("expired", owner.bearer_with(&p)));
    let mut p = owner.payload();
    p["gaiaChallenge"] = json!(r#"["gaiahub","0","other-hub","blockstack_storage_please_sign"]"#);
    cases.push(("wrong challenge", owner.bearer_with(&p)));
    let mut p = owner.payload();
    p["scopes"] = json!([{"scope": "putFile", "domain": "only-this.txt"}]);
    cases.push(("insufficient scope", owner.bearer_with(&p)));
    let mut p = owner.payload();
    p["scopes"] = json!([{"scope": "readEverything", "domain": "x"}]);
    cases.push(("unknown scope", owner.bearer_with(&p)));
    let mut p = owner.payload();
    p["scopes"] = json!(
        (0..9)
            .map(|i| json!({"scope": "putFile", "domain": format!("{i}")}))
            .collect::<Vec<_>>()
    );
    cases.push(("too many scopes", owner.bearer_with(&p)));
    let identity = Key::new(6);
    let mut p = owner.payload();
    p["associationToken"] = json!(identity.association(&other, now() + 60.0));
    cases.push(("association for another child", owner.bearer_with(&p)));
    let mut p = owner.payload();
    p["associationToken"] = json!(identity.association(&owner, now() - 60.0));
    cases.push(("expired association", owner.bearer_with(&p)));
    let mut p = owner.payload();
    let assoc = identity.association(&owner, now() + 60.0);
    let (ahead, _) = assoc.rsplit_once('.').unwrap();
    let wrong = other.association(&owner, now() + 60.0);
    let (_, wsig) = wrong.rsplit_once('.').unwrap();
    p["associationToken"] = json!(format!("{ahead}.{wsig}"));
    cases.push(("badly signed association", owner.bearer_with(&p)));
    cases.push((
        "legacy with another hub's challenge",
        owner.legacy_bearer(r#"["gaiahub","0","elsewhere","blockstack_storage_please_sign"]"#),
    ));

    for (what, auth) in &cases {
        let mut r = hub
            .http
            .post(hub.url(&format!("/store/{a}/f.txt")))
            .body("data");
        if !auth.is_empty() {
            r = r.header("authorization", auth.as_str());
        }
        let resp = r.send().await.unwrap();
        assert_eq!(resp.status(), 401, "{what}");
        let v: Value = resp.json().await.unwrap();
        assert_eq!(err_name(&v), "ValidationError", "{what}: {v}");
        assert!(!v["message"].as_str().unwrap().is_empty());
        let (st, _) = hub.delete(auth, &a, "f.txt").await;
        // A token with write scopes only may delete anywhere (the hub's rule): 404 here.
        let want = if what.contains("insufficient") {
            404
        } else {
            401
        };
        assert_eq!(st, want, "delete: {what}");
        let (st, _) = hub.list(auth, &a, json!({})).await;
        // Listing ignores path scopes, so a scoped token may list.
        if !what.contains("insufficient") {
            assert_eq!(st, 401, "list: {what}");
        }
    }
    assert_eq!(hub.read(&a, "f.txt").await.0, 404);
    assert!(hub.names(&owner.bearer(), &a).await.is_empty());

    // hubUrl is checked only when required.
    let gaia = GaiaConfig {
        require_correct_hub_url: true,
        // Configured with a trailing `/`, compared without it (as the claim is).
        valid_hub_urls: vec!["http://hub.example/".into()],
        ..GaiaConfig::default()
    };
    let hub = Hub::with(1 << 20, 256, gaia).await;
    let mut p = owner.payload();
    let (st, v) = hub.store(&owner.bearer_with(&p), &a, "f", b"x", &[]).await;
    assert_eq!((st, err_name(&v)), (401, "ValidationError"));
    p["hubUrl"] = json!("http://evil.example");
    let (st, v) = hub.store(&owner.bearer_with(&p), &a, "f", b"x", &[]).await;
    assert_eq!(st, 401, "{v}");
    assert!(v["message"].as_str().unwrap().contains("claimed hub url"));
    assert_eq!(hub.read(&a, "f").await.0, 404);
    for ok in [
        "http://hub.example/",
        "http://hub.example",
        "https://gaia-0",
    ] {
        p["hubUrl"] = json!(ok);
        let (st, v) = hub.store(&owner.bearer_with(&p), &a, "f", b"x", &[]).await;
        assert_eq!(st, 202, "{ok}: {v}");
    }
    // A legacy token names no hub: refused where a claimed hub is required (it would
    // write on every hub of the same server name, for ever).
    let legacy =
        owner.legacy_bearer(r#"["gaiahub","0","gaia-0","blockstack_storage_please_sign"]"#);
    let (st, v) = hub.store(&legacy, &a, "g", b"x", &[]).await;
    assert_eq!((st, err_name(&v)), (401, "ValidationError"), "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("legacy tokens"),
        "{v}"
    );
    assert_eq!(hub.read(&a, "g").await.0, 404);

    // A whitelist admits only its signers (an association token's issuer is the signer).
    let gaia = GaiaConfig {
        whitelist: Some(vec![identity.address()]),
        ..GaiaConfig::default()
    };
    let hub = Hub::with(1 << 20, 256, gaia).await;
    let (st, v) = hub.store(&owner.bearer(), &a, "f", b"x", &[]).await;
    assert_eq!(st, 401);
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("not authorized for writes")
    );
    let mut p = owner.payload();
    p["associationToken"] = json!(identity.association(&owner, now() + 60.0));
    let (st, v) = hub.store(&owner.bearer_with(&p), &a, "f", b"x", &[]).await;
    assert_eq!(st, 202, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn high_s_legacy_and_legacy_challenges_are_accepted() {
    let hub = Hub::start(1 << 20).await;
    let k = Key::new(7);
    let a = k.address();
    let high = format!("bearer v1:{}", k.jwt(&k.payload(), true));
    let (st, v) = hub.store(&high, &a, "h", b"x", &[]).await;
    assert_eq!(st, 202, "{v}");
    let legacy = k.legacy_bearer(r#"["gaiahub","0","gaia-0","blockstack_storage_please_sign"]"#);
    let (st, v) = hub.store(&legacy, &a, "l", b"x", &[]).await;
    assert_eq!(st, 202, "{v}");
    let old = k.legacy_bearer(r#"["gaiahub","2018","gaia-0","blockstack_storage_please_sign"]"#);
    let (st, _) = hub.store(&old, &a, "l2", b"x", &[]).await;
    assert_eq!(st, 202);
    let mut p = k.payload();
    p["gaiaChallenge"] = json!(r#"["gaiahub","2019","gaia-0","blockstack_storage_please_sign"]"#);
    let (st, _) = hub.store(&k.bearer_with(&p), &a, "v", b"x", &[]).await;
    assert_eq!(st, 202);
    // An uncompressed iss has its own address.
    let un = hex::encode(k.0.verifying_key().to_encoded_point(false).as_bytes());
    let mut p = k.payload();
    p["iss"] = json!(un);
    let ua = cairn_node::gaia::auth::p2pkh_address(&hex::decode(&un).unwrap());
    assert_ne!(ua, a);
    let (st, _) = hub.store(&k.bearer_with(&p), &ua, "u", b"x", &[]).await;
    assert_eq!(st, 202);
    let (st, _) = hub.store(&k.bearer_with(&p), &a, "u", b"x", &[]).await;
    assert_eq!(st, 401);
}

/// A hub with `allow_legacy_tokens = false` refuses legacy tokens (401, nothing stored)
/// and goes on accepting v1 ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_tokens_can_be_turned_off() {
    let gaia = GaiaConfig {
        allow_legacy_tokens: false,
        ..GaiaConfig::default()
    };
    let hub = Hub::with(1 << 20, 256, gaia).await;
    let k = Key::new(17);
    let a = k.address();
    let legacy = k.legacy_bearer(r#"["gaiahub","0","gaia-0","blockstack_storage_please_sign"]"#);
    let (st, v) = hub.store(&legacy, &a, "l", b"x", &[]).await;
    assert_eq!((st, err_name(&v)), (401, "ValidationError"), "{v}");
    assert!(v.to_string().contains("legacy"), "{v}");
    assert_eq!(hub.read(&a, "l").await.0, 404);
    assert_eq!(hub.delete(&legacy, &a, "l").await.0, 401);
    assert_eq!(hub.store(&k.bearer(), &a, "v1", b"x", &[]).await.0, 202);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scopes_restrict_writes_and_deletes() {
    let hub = Hub::start(1 << 20).await;
    let k = Key::new(8);
    let a = k.address();
    let full = k.bearer();
    for f in ["pub/a", "pub/b", "priv/c", "keep"] {
        assert_eq!(hub.store(&full, &a, f, b"x", &[]).await.0, 202);
    }
    let mut p = k.payload();
    p["scopes"] = json!([
        {"scope": "putFilePrefix", "domain": "pub/"},
        {"scope": "putFile", "domain": "exact.txt"},
        {"scope": "deleteFile", "domain": "pub/a"},
    ]);
    let scoped = k.bearer_with(&p);
    assert_eq!(hub.store(&scoped, &a, "pub/new", b"x", &[]).await.0, 202);
    assert_eq!(hub.store(&scoped, &a, "exact.txt", b"x", &[]).await.0, 202);
    let (st, v) = hub.store(&scoped, &a, "priv/c", b"y", &[]).await;
    assert_eq!((st, err_name(&v)), (401, "ValidationError"));
    assert_eq!(hub.read(&a, "priv/c").await.3, b"x");
    assert_eq!(hub.delete(&scoped, &a, "pub/b").await.0, 401);
    assert_eq!(hub.delete(&scoped, &a, "pub/a").await.0, 202);
    assert_eq!(hub.read(&a, "pub/b").await.0, 200);

    // Archival scopes: writes only to their paths; listings hide `.history.` files.
    assert_eq!(
        hub.store(&full, &a, "arch/.history.1.x.f", b"h", &[])
            .await
            .0,
        202
    );
    let mut p = k.payload();
    p["scopes"] = json!([{"scope": "putFileArchivalPrefix", "domain": "arch/"}]);
    let arch = k.bearer_with(&p);
    assert_eq!(hub.store(&arch, &a, "arch/f", b"1", &[]).await.0, 202);
    assert_eq!(hub.store(&arch, &a, "keep", b"1", &[]).await.0, 401);
    assert_eq!(hub.delete(&arch, &a, "keep").await.0, 401);
    let names = hub.names(&arch, &a).await;
    assert!(names.contains(&"arch/f".to_string()));
    assert!(!names.iter().any(|n| n.contains(".history.")), "{names:?}");
    assert!(
        hub.names(&full, &a)
            .await
            .contains(&"arch/.history.1.x.f".to_string())
    );
    // An archival delete keeps the file's history, as the hub's rename to a `.history.`
    // name does: the file is gone from reads and listings, and its versions stay on a
    // branch of their own (a plain delete leaves them to GC).
    assert_eq!(hub.store(&arch, &a, "arch/f", b"2", &[]).await.0, 202);
    assert_eq!(hub.delete(&arch, &a, "arch/f").await.0, 202);
    assert_eq!(hub.read(&a, "arch/f").await.0, 404);
    assert!(!hub.names(&full, &a).await.contains(&"arch/f".to_string()));
    assert_eq!(hub.delete(&arch, &a, "arch/f").await.0, 404);
    let bucket = hub
        .node
        .bucket(&cairn_node::gaia::bucket_name(&a).unwrap())
        .unwrap();
    let table = bucket.db().existing_table(b"arch/f").unwrap();
    // The newest `.history.` branch is the deleted head (the store of "2" kept "1" on one
    // too, as the hub's archival overwrite renames the old file).
    let history: Vec<&String> = table
        .tagged
        .keys()
        .filter(|b| b.starts_with(".history."))
        .collect();
    assert_eq!(history.len(), 2, "{history:?}");
    let branch = history
        .iter()
        .max_by_key(|b| b.split('.').nth(2).and_then(|ms| ms.parse::<u64>().ok()))
        .copied()
        .expect("a history branch");
    let kept = bucket
        .db()
        .track(b"arch/f", &cairn_object::At::Branch(branch.clone()), 0, 10)
        .unwrap();
    assert_eq!(kept.len(), 2, "both versions stay reachable");
    // Written again, the file is back, history kept.
    let (st, m) = hub.store(&arch, &a, "arch/f", b"3", &[]).await;
    assert_eq!(st, 202, "{m}");
    assert_eq!(hub.read(&a, "arch/f").await.3, b"3");
    let all = bucket
        .db()
        .track(b"arch/f", &cairn_object::At::default_branch(), 0, 10)
        .unwrap();
    assert_eq!(
        all.len(),
        3,
        "the new version goes on from the archived ones"
    );
    assert!(hub.names(&full, &a).await.contains(&"arch/f".to_string()));
    // A plain delete removes the head.
    assert_eq!(hub.delete(&full, &a, "arch/f").await.0, 202);
    assert_eq!(hub.read(&a, "arch/f").await.0, 404);
    // What archival stores replaced outlives a plain delete, as the hub's `.history.`
    // copies outlive a delete of the file: it stays on a branch of its own (before, it
    // stayed only in the file's history, which the delete left to GC).
    assert_eq!(hub.store(&arch, &a, "arch/g", b"first", &[]).await.0, 202);
    assert_eq!(hub.store(&arch, &a, "arch/g", b"second", &[]).await.0, 202);
    assert_eq!(hub.delete(&full, &a, "arch/g").await.0, 202);
    assert_eq!(hub.read(&a, "arch/g").await.0, 404);
    let table = bucket.db().existing_table(b"arch/g").unwrap();
    let kept: Vec<Vec<u8>> = table
        .tagged
        .iter()
        .filter(|(b, _)| b.starts_with(".history."))
        .map(|(b, _)| {
            let v = bucket
                .db()
                .get(b"arch/g", &cairn_object::At::Branch(b.clone()))
                .unwrap();
            let t = v.object.value.tree().unwrap();
            cairn_object::postree::blob_read(bucket.db().chunks(), t, 0, t.count).unwrap()
        })
        .collect();
    assert_eq!(kept, vec![b"first".to_vec()]);
    // A store with a plain scope keeps nothing aside (the hub overwrites in place).
    assert_eq!(hub.store(&full, &a, "plain", b"1", &[]).await.0, 202);
    assert_eq!(hub.store(&full, &a, "plain", b"2", &[]).await.0, 202);
    let table = bucket.db().existing_table(b"plain").unwrap();
    assert_eq!(table.tagged.len(), 1, "{table:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_files_pages() {
    let gaia = GaiaConfig {
        page_size: 2,
        ..GaiaConfig::default()
    };
    let hub = Hub::with(1 << 20, 256, gaia).await;
    let k = Key::new(10);
    let (a, auth) = (k.address(), k.bearer());
    // An address that never stored anything lists nothing.
    let (st, v) = hub.list(&auth, &a, json!({})).await;
    assert_eq!((st, v), (202, json!({"entries": [], "page": null})));
    for i in 0..5 {
        hub.store(&auth, &a, &format!("f{i}"), b"x", &[]).await;
    }
    let mut all = Vec::new();
    let mut page = Value::Null;
    let mut pages = 0;
    loop {
        let (st, v) = hub.list(&auth, &a, json!({ "page": page })).await;
        assert_eq!(st, 202);
        pages += 1;
        for e in v["entries"].as_array().unwrap() {
            all.push(e.as_str().unwrap().to_string());
        }
        if v["page"].is_null() {
            break;
        }
        page = v["page"].clone();
    }
    assert_eq!(pages, 3);
    assert_eq!(all, ["f0", "f1", "f2", "f3", "f4"]);
    // A revocation time is kept under a key no file name can be: it takes no place in a
    // page.
    let r = hub
        .http
        .post(hub.url(&format!("/revoke-all/{a}")))
        .header("authorization", &auth)
        .header("content-type", "application/json")
        .body(r#"{"oldestValidTimestamp":1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let (st, v) = hub.list(&auth, &a, json!({})).await;
    assert_eq!(st, 202);
    assert_eq!(v["entries"], json!(["f0", "f1"]));
    let (_, v) = hub.list(&auth, &a, json!({ "page": v["page"] })).await;
    assert_eq!(v["entries"], json!(["f2", "f3"]));
    let (st, _) = hub.list(&auth, &a, json!({"page": "x1"})).await;
    assert_eq!(st, 400);
    // A non-JSON body reads as `{}`; trailing path segments are ignored (the hub's regex).
    let r = hub
        .http
        .post(hub.url(&format!("/list-files/{a}/whatever")))
        .header("authorization", &auth)
        .body("not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["entries"], json!(["f0", "f1"]));
    assert!(v["page"].is_string(), "{v}");
    // A body over 4096 bytes plus room for the cursor of a 4096-byte name is refused.
    let big = json!({ "page": "0".repeat(13000) });
    let (st, _) = hub.list(&auth, &a, big).await;
    assert_eq!(st, 413);
}

/// A page of long names ends once it would pass about a MiB of worst-case JSON (six bytes
/// a character escaped), whatever the page size, and the next page goes on from the last
/// name: every name comes once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_files_pages_are_cut_by_size() {
    let gaia = GaiaConfig {
        page_size: 4096,
        ..GaiaConfig::default()
    };
    let hub = Hub::with(1 << 20, 256, gaia).await;
    let k = Key::new(11);
    let (a, auth) = (k.address(), k.bearer());
    let mut want = Vec::new();
    for i in 0..400 {
        let name = format!("{i:04}-{}", "n".repeat(995));
        assert_eq!(hub.store(&auth, &a, &name, b"x", &[]).await.0, 202);
        want.push(name);
    }
    let (mut all, mut page, mut pages) = (Vec::new(), Value::Null, 0);
    loop {
        let (st, v) = hub.list(&auth, &a, json!({ "page": page })).await;
        assert_eq!(st, 202, "{v}");
        pages += 1;
        let entries = v["entries"].as_array().unwrap();
        // 1,000-byte names, 6,008 bytes each at worst: at most 174 in a MiB.
        assert!(
            !entries.is_empty() && entries.len() <= 174,
            "{}",
            entries.len()
        );
        all.extend(entries.iter().map(|e| e.as_str().unwrap().to_string()));
        if v["page"].is_null() {
            break;
        }
        page = v["page"].clone();
    }
    assert_eq!(pages, 3);
    assert_eq!(all, want);
}

/// `page` is a cursor (the last name returned), not an offset: a delete or an insert
/// between pages neither skips nor repeats a name, with or without `stat`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_files_pages_survive_deletes_and_inserts_between_pages() {
    let gaia = GaiaConfig {
        page_size: 2,
        ..GaiaConfig::default()
    };
    let hub = Hub::with(1 << 20, 256, gaia).await;
    let k = Key::new(16);
    let (a, auth) = (k.address(), k.bearer());
    for stat in [false, true] {
        for i in 0..6 {
            assert_eq!(
                hub.store(&auth, &a, &format!("f{i}"), b"x", &[]).await.0,
                202
            );
        }
        let name = |e: &Value| {
            if stat {
                e["name"].as_str().unwrap().to_string()
            } else {
                e.as_str().unwrap().to_string()
            }
        };
        let mut all = Vec::new();
        let mut page = Value::Null;
        let mut round = 0;
        loop {
            let (st, v) = hub
                .list(&auth, &a, json!({ "page": page, "stat": stat }))
                .await;
            assert_eq!(st, 202, "{v}");
            all.extend(v["entries"].as_array().unwrap().iter().map(name));
            if v["page"].is_null() {
                break;
            }
            page = v["page"].clone();
            match round {
                // After [f0, f1], a listed name goes: an offset would skip f2.
                0 => {
                    assert_eq!(all, ["f0", "f1"]);
                    assert_eq!(hub.delete(&auth, &a, "f1").await.0, 202);
                }
                // After [f2, f3], names come before and after the cursor: an offset would
                // repeat a name.
                1 => {
                    assert_eq!(all, ["f0", "f1", "f2", "f3"]);
                    assert_eq!(hub.store(&auth, &a, "a0", b"x", &[]).await.0, 202);
                    assert_eq!(hub.store(&auth, &a, "f3a", b"x", &[]).await.0, 202);
                }
                // After [f3a, f4], the cursor's own name goes.
                2 => assert_eq!(hub.delete(&auth, &a, "f4").await.0, 202),
                _ => {}
            }
            round += 1;
        }
        assert_eq!(
            all,
            ["f0", "f1", "f2", "f3", "f3a", "f4", "f5"],
            "stat {stat}"
        );
        // Clean up for the next round.
        for n in ["a0", "f0", "f1", "f2", "f3", "f3a", "f4", "f5"] {
            hub.delete(&auth, &a, n).await;
        }
        assert!(hub.names(&auth, &a).await.is_empty());
    }
    // A page that no listing returned is a clear 400, with or without a bucket.
    for bad in [json!("1"), json!(2), json!("after-zz"), json!("f0")] {
        for addr in [a.clone(), Key::new(17).address()] {
            let auth = if addr == a {
                auth.clone()
            } else {
                Key::new(17).bearer()
            };
            let (st, v) = hub.list(&auth, &addr, json!({ "page": bad })).await;
            assert_eq!(st, 400, "{bad}: {v}");
            assert!(
                v["message"].as_str().unwrap().contains("Invalid page"),
                "{v}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoke_all_by_iat() {
    let hub = Hub::start(1 << 20).await;
    let k = Key::new(11);
    let a = k.address();
    let old_auth = k.bearer();
    assert_eq!(hub.store(&old_auth, &a, "f", b"1", &[]).await.0, 202);
    let revoke = |auth: String, body: String| {
        let r = hub
            .http
            .post(hub.url(&format!("/revoke-all/{a}")))
            .header("authorization", auth)
            .header("content-type", "application/json")
            .body(body);
        async move {
            let resp = r.send().await.unwrap();
            let st = resp.status().as_u16();
            (st, resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (st, v) = revoke(old_auth.clone(), "{}".into()).await;
    assert_eq!(
        (st, v["message"].as_str()),
        (400, Some("Invalid JSON: missing oldestValidTimestamp"))
    );
    let (st, _) = revoke(old_auth.clone(), r#"{"oldestValidTimestamp":"abc"}"#.into()).await;
    assert_eq!(st, 400);
    let (st, _) = revoke(old_auth.clone(), r#"{"oldestValidTimestamp":-5}"#.into()).await;
    assert_eq!(st, 400);
    let (st, _) = revoke(
        Key::new(12).bearer(),
        r#"{"oldestValidTimestamp":1}"#.into(),
    )
    .await;
    assert_eq!(st, 401);
    let cutoff = now() as i64 + 100;
    let (st, v) = revoke(
        old_auth.clone(),
        format!(r#"{{"oldestValidTimestamp":"{cutoff}"}}"#),
    )
    .await;
    assert_eq!((st, v), (202, json!({"status": "success"})));

    // Tokens issued before the cutoff, or without iat, are refused; newer ones pass.
    let (st, v) = hub.store(&old_auth, &a, "f", b"2", &[]).await;
    assert_eq!(
        (st, err_name(&v)),
        (401, "AuthTokenTimestampValidationError")
    );
    let mut p = k.payload();
    p.as_object_mut().unwrap().remove("iat");
    let (st, v) = hub.store(&k.bearer_with(&p), &a, "f", b"2", &[]).await;
    assert_eq!(
        (st, err_name(&v)),
        (401, "AuthTokenTimestampValidationError")
    );
    assert_eq!(hub.delete(&old_auth, &a, "f").await.0, 401);
    assert_eq!(hub.list(&old_auth, &a, json!({})).await.0, 401);
    assert_eq!(hub.read(&a, "f").await.3, b"1");
    let mut p = k.payload();
    p["iat"] = json!(cutoff + 1);
    let fresh = k.bearer_with(&p);
    assert_eq!(hub.store(&fresh, &a, "f", b"3", &[]).await.0, 202);
    // A lower time does not re-enable revoked tokens; the time is readable as in Gaia.
    let (st, _) = revoke(fresh.clone(), r#"{"oldestValidTimestamp":5}"#.into()).await;
    assert_eq!(st, 202);
    assert_eq!(hub.store(&old_auth, &a, "f", b"4", &[]).await.0, 401);
    let (st, _, ct, body) = hub.read(&format!("{a}-auth"), "authTimestamp").await;
    assert_eq!(
        (st, ct.as_deref()),
        (200, Some("text/plain; charset=UTF-8"))
    );
    assert_eq!(String::from_utf8(body).unwrap(), cutoff.to_string());
    // The revocation key is not a file.
    assert_eq!(hub.names(&fresh, &a).await, ["f"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_size_uploads_are_413_and_store_nothing() {
    let hub = Hub::start(1000).await;
    let k = Key::new(13);
    let (a, auth) = (k.address(), k.bearer());
    let (st, v) = hub.store(&auth, &a, "big", &[7u8; 5000], &[]).await;
    assert_eq!((st, err_name(&v)), (413, "PayloadTooLargeError"));
    // Without a Content-Length (chunked), the stream is cut at the limit.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        (0..10).map(|_| Ok(vec![1u8; 300])).collect();
    let resp = hub
        .http
        .post(hub.url(&format!("/store/{a}/big")))
        .header("authorization", &auth)
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(err_name(&v), "PayloadTooLargeError");
    assert_eq!(hub.read(&a, "big").await.0, 404);
    assert!(hub.names(&auth, &a).await.is_empty());
    // Exactly the limit is fine.
    assert_eq!(hub.store(&auth, &a, "big", &[7u8; 1000], &[]).await.0, 202);
}

/// A store the hub refuses before reading the body (too large by its Content-Length, bad
/// token, stale `If-Match`) still gets its answer while the client is sending a body of
/// several MiB: the node reads and drops what follows, so clients see the refusal and not
/// a reset connection. Nothing is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_stores_answer_even_while_the_body_is_still_coming() {
    let hub = Hub::start(1 << 20).await;
    let k = Key::new(15);
    let (a, auth) = (k.address(), k.bearer());
    let big = vec![9u8; 12 << 20];
    let fits = vec![8u8; 1 << 19];
    let stale = [("if-match", "\"0000\"")];
    for round in 0..4 {
        let (st, v) = hub.store(&auth, &a, "big", &big, &[]).await;
        assert_eq!(
            (st, err_name(&v)),
            (413, "PayloadTooLargeError"),
            "round {round}"
        );
        let (st, _) = hub.store("bearer v1:not-a-jwt", &a, "f", &big, &[]).await;
        assert_eq!(st, 401, "round {round}");
        let (st, v) = hub.store(&auth, &a, "f", &big, &stale).await;
        assert_eq!(
            (st, err_name(&v)),
            (412, "PreconditionFailedError"),
            "round {round}"
        );
    }
    assert!(hub.names(&auth, &a).await.is_empty());
    assert_eq!(hub.store(&auth, &a, "f", &fits, &[]).await.0, 202);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_concurrent_writers_to_one_path_all_succeed() {
    let hub = std::sync::Arc::new(Hub::start(1 << 20).await);
    let k = Key::new(14);
    let (a, auth) = (k.address(), k.bearer());
    let mut tasks = Vec::new();
    for i in 0..100 {
        let (hub, a, auth) = (hub.clone(), a.clone(), auth.clone());
        tasks.push(tokio::spawn(async move {
            let body = format!("writer {i} ").repeat(200);
            hub.store(&auth, &a, "todos.json", body.as_bytes(), &[])
                .await
        }));
    }
    let mut tags = Vec::new();
    for t in tasks {
        let (st, v) = t.await.unwrap();
        assert_eq!(st, 202, "{v}");
        tags.push(v["etag"].as_str().unwrap().to_string());
    }
    // 100 distinct versions, one chain: the head is 99 versions deep.
    tags.sort();
    tags.dedup();
    assert_eq!(tags.len(), 100);
    let bucket = hub.node.bucket(&bucket_name(&a).unwrap()).unwrap();
    let head = bucket
        .db()
        .get(b"todos.json", &At::default_branch())
        .unwrap();
    assert_eq!(head.object.depth, 99);
    let (_, etag, _, _) = hub.read(&a, "todos.json").await;
    assert_eq!(etag.unwrap(), head.uid.to_string());
}

/// One address holds at most `max_transfers_per_ip` Gaia transfers: with its one slot
/// taken by a slow upload, its next upload gets 503 with `Retry-After` and a message
/// naming the setting (loopback counted here, as `limit_loopback` asks); once the slow
/// upload ends, it goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_holds_at_most_its_share_of_gaia_transfers() {
    let hub = Hub::tuned(|c| {
        c.max_transfers_per_ip = 1;
        c.limit_loopback = true;
    })
    .await;
    let k = Key::new(16);
    let (a, auth) = (k.address(), k.bearer());
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(1);
    let slow = hub
        .http
        .post(hub.url(&format!("/store/{a}/slow")))
        .header("authorization", &auth)
        .body(reqwest::Body::wrap_stream(tokio_stream(rx)))
        .send();
    let slow = tokio::spawn(slow);
    tx.send(Ok(b"part one ".to_vec())).await.unwrap();
    let local = "127.0.0.1".parse().unwrap();
    for _ in 0..500 {
        if hub.node.peer_transfers(local) == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(hub.node.peer_transfers(local), 1);
    let resp = hub
        .http
        .post(hub.url(&format!("/store/{a}/other")))
        .header("authorization", &auth)
        .body("refused")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers()["retry-after"], "1");
    let text = resp.text().await.unwrap();
    assert!(text.contains("max_transfers_per_ip"), "{text}");
    tx.send(Ok(b"part two".to_vec())).await.unwrap();
    drop(tx);
    let resp = slow.await.unwrap().unwrap();
    assert_eq!(resp.status(), 202);
    assert_eq!(hub.store(&auth, &a, "other", b"stored", &[]).await.0, 202);
}

/// A Content-Type with bytes past ASCII is kept and served as sent (the hub's Node.js
/// reads header bytes as latin1); it was dropped for `application/octet-stream`, and
/// `@stacks/storage` then gave the app bytes instead of text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_content_type_past_ascii_is_kept_as_sent() {
    let hub = Hub::start(1 << 20).await;
    let k = Key::new(18);
    let (a, auth) = (k.address(), k.bearer());
    let ct = b"text/plain; name=\"caf\xE9\"";
    let resp = hub
        .http
        .post(hub.url(&format!("/store/{a}/n.txt")))
        .header("authorization", &auth)
        .header(
            "content-type",
            reqwest::header::HeaderValue::from_bytes(ct).unwrap(),
        )
        .body("text")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    let r = hub
        .http
        .get(hub.url(&format!("/read/{a}/n.txt")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["content-type"].as_bytes(), ct);
    let (st, v) = hub.list(&auth, &a, json!({"stat": true})).await;
    assert_eq!(st, 202);
    assert_eq!(
        v["entries"][0]["contentType"],
        "text/plain; name=\"caf\u{e9}\""
    );
}

/// A file's modification time is when its store committed, as the hub's disk driver
/// reports the file's mtime once written: a slow upload that began first and committed
/// after a quicker one to the same path is the newer file, and lists as such (it was
/// stamped when its body began, older than the version it replaced).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_files_modification_time_is_its_commit() {
    let hub = Hub::start(1 << 20).await;
    let k = Key::new(17);
    let (a, auth) = (k.address(), k.bearer());
    let mtime = |v: &serde_json::Value| -> u64 {
        let e = &v["entries"][0];
        assert_eq!(e["name"], "p");
        e["lastModifiedDate"].as_u64().unwrap()
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(1);
    let slow = hub
        .http
        .post(hub.url(&format!("/store/{a}/p")))
        .header("authorization", &auth)
        .body(reqwest::Body::wrap_stream(tokio_stream(rx)))
        .send();
    let slow = tokio::spawn(slow);
    tx.send(Ok(b"slow, ".to_vec())).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(hub.store(&auth, &a, "p", b"quick", &[]).await.0, 202);
    let (st, v) = hub.list(&auth, &a, json!({"stat": true})).await;
    assert_eq!(st, 202);
    let quick = mtime(&v);
    // Listed in whole seconds, as the hub lists them.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    tx.send(Ok(b"and last".to_vec())).await.unwrap();
    drop(tx);
    assert_eq!(slow.await.unwrap().unwrap().status(), 202);
    assert_eq!(hub.read(&a, "p").await.3, b"slow, and last");
    let (st, v) = hub.list(&auth, &a, json!({"stat": true})).await;
    assert_eq!(st, 202);
    assert!(mtime(&v) > quick, "{} after {quick}", mtime(&v));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_write_queue_answers_503_with_retry_after() {
    let hub = Hub::with(1 << 20, 1, GaiaConfig::default()).await;
    let k = Key::new(15);
    let (a, auth) = (k.address(), k.bearer());
    // A slow upload holds the path's only place.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(1);
    let slow = hub
        .http
        .post(hub.url(&format!("/store/{a}/q")))
        .header("authorization", &auth)
        .body(reqwest::Body::wrap_stream(tokio_stream(rx)))
        .send();
    let slow = tokio::spawn(slow);
    tx.send(Ok(b"part one ".to_vec())).await.unwrap();
    // Wait until the node serves the slow writer (then give it a moment to take its place:
    // a probe that came first would take the place itself).
    for _ in 0..500 {
        if hub.node.metrics.in_flight.get() >= 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let mut busy = None;
    for _ in 0..100 {
        let resp = hub
            .http
            .post(hub.url(&format!("/store/{a}/q")))
            .header("authorization", &auth)
            .body("other")
            .send()
            .await
            .unwrap();
        if resp.status() == 503 {
            busy = Some(resp);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let busy = busy.expect("a 503 while the queue is full");
    assert_eq!(busy.headers()["retry-after"], "1");
    // Another path is not affected.
    assert_eq!(hub.store(&auth, &a, "other", b"x", &[]).await.0, 202);
    tx.send(Ok(b"part two".to_vec())).await.unwrap();
    drop(tx);
    let resp = slow.await.unwrap().unwrap();
    assert_eq!(resp.status(), 202);
    assert_eq!(hub.read(&a, "q").await.3, b"part one part two");
}

fn tokio_stream(
    mut rx: tokio::sync::mpsc::Receiver<Result<Vec<u8>, std::io::Error>>,
) -> impl futures_util::Stream<Item = Result<Vec<u8>, std::io::Error>> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// A JSON body that breaks off (a bad chunked encoding) is 400, not 413 "too long".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_json_body_is_a_bad_request() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let hub = Hub::start(1 << 20).await;
    let k = Key::new(12);
    let (a, auth) = (k.address(), k.bearer());
    let mut tcp = tokio::net::TcpStream::connect(hub.base.trim_start_matches("http://"))
        .await
        .unwrap();
    let req = format!(
        "POST /list-files/{a} HTTP/1.1\r\nHost: localhost\r\nAuthorization: {auth}\r\n\
         Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{{}}\r\n0\r\n\r\n"
    );
    tcp.write_all(req.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        tcp.read_to_end(&mut got),
    )
    .await;
    let got = String::from_utf8_lossy(&got);
    assert!(got.starts_with("HTTP/1.1 400"), "{got}");
}

/// Small files are read in one go and large ones stream; a reader sees the same either
/// side of the 16 KiB line, and a HEAD has the headers without the body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_and_streamed_reads_look_alike() {
    let hub = Hub::start(1 << 20).await;
    let k = Key::new(41);
    let a = k.address();
    let auth = k.bearer();
    for n in [0usize, 1, 16 << 10, (16 << 10) + 1, 200_000] {
        let body: Vec<u8> = (0..n).map(|i| (i % 253) as u8).collect();
        let path = format!("f{n}");
        let (st, v) = hub.store(&auth, &a, &path, &body, &[]).await;
        assert_eq!(st, 202, "{v}");
        let (st, etag, ct, got) = hub.read(&a, &path).await;
        assert_eq!(st, 200);
        assert!(got == body, "{n} bytes read back");
        let head = hub
            .http
            .head(hub.url(&format!("/read/{a}/{path}")))
            .send()
            .await
            .unwrap();
        assert_eq!(head.status(), 200);
        assert_eq!(head.headers()["content-length"], n.to_string());
        assert_eq!(
            head.headers()
                .get("etag")
                .map(|v| v.to_str().unwrap().to_string()),
            etag
        );
        assert_eq!(
            head.headers()
                .get("content-type")
                .map(|v| v.to_str().unwrap().to_string()),
            ct
        );
        assert!(head.bytes().await.unwrap().is_empty());
    }
}

/// A stored HTML file is served sandboxed: opened in a browser it cannot run as the node's
/// own origin (where it could read open buckets and write through the native API), and no
/// browser guesses another type. The bytes and their type are as stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_pages_are_served_sandboxed() {
    let hub = Hub::start(1 << 20).await;
    let k = Key::new(40);
    let (a, auth) = (k.address(), k.bearer());
    let page = b"<script>fetch('/v1/buckets')</script>";
    let (st, _) = hub
        .store(&auth, &a, "x.html", page, &[("content-type", "text/html")])
        .await;
    assert_eq!(st, 202);
    for path in [
        format!("/read/{a}/x.html"),
        format!("/read/{a}/missing.html"),
    ] {
        let r = hub.http.get(hub.url(&path)).send().await.unwrap();
        let h = r.headers().clone();
        assert_eq!(h["content-security-policy"], "sandbox", "{path}");
        assert_eq!(h["x-content-type-options"], "nosniff", "{path}");
        // The reader's Cache-Control, on a missing file too (as the reader sets it first).
        assert_eq!(h["cache-control"], "no-cache", "{path}");
        if r.status() == 200 {
            assert_eq!(h["content-type"], "text/html");
            assert_eq!(r.bytes().await.unwrap().as_ref(), page);
        }
    }
    // A PDF is not sandboxed (browsers refuse to show it so), but nothing is sniffed.
    let (st, _) = hub
        .store(
            &auth,
            &a,
            "d.pdf",
            b"%PDF-1.4",
            &[("content-type", "application/pdf")],
        )
        .await;
    assert_eq!(st, 202);
    let r = hub
        .http
        .get(hub.url(&format!("/read/{a}/d.pdf")))
        .send()
        .await
        .unwrap();
    assert!(r.headers().get("content-security-policy").is_none());
    assert_eq!(r.headers()["x-content-type-options"], "nosniff");
    // A type list ending in HTML is HTML to a browser (the last valid type wins): it is
    // sandboxed, however it starts.
    for ct in [
        "application/pdf;a=b,text/html",
        "application/pdf, text/html",
    ] {
        let (st, _) = hub
            .store(&auth, &a, "p.html", page, &[("content-type", ct)])
            .await;
        assert_eq!(st, 202);
        let r = hub
            .http
            .get(hub.url(&format!("/read/{a}/p.html")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.headers()["content-type"], ct);
        assert_eq!(r.headers()["content-security-policy"], "sandbox", "{ct}");
    }
}

/// A `list-files` page holds at most about 1 MiB of JSON, whatever the page size: long
/// names with long content types make shorter pages, and the cursor goes on from the last
/// one, so every file is listed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pages_are_bounded_in_bytes() {
    let hub = Hub::start(1 << 20).await;
    let k = Key::new(45);
    let (a, auth) = (k.address(), k.bearer());
    let ct = "a/".to_string() + &"b".repeat(1000);
    let mut want = Vec::new();
    for i in 0..40u32 {
        let name = format!("{i:03}{}", "n".repeat(4000));
        let (st, v) = hub
            .store(&auth, &a, &name, b"x", &[("content-type", ct.as_str())])
            .await;
        assert_eq!(st, 202, "{v}");
        want.push(name);
    }
    let mut got: Vec<String> = Vec::new();
    let mut page = serde_json::Value::Null;
    let mut pages = 0;
    loop {
        let (st, v) = hub
            .list(&auth, &a, serde_json::json!({"stat": true, "page": page}))
            .await;
        assert_eq!(st, 202, "{v}");
        pages += 1;
        let entries = v["entries"].as_array().unwrap();
        assert!(entries.len() < 40, "a page of {}", entries.len());
        got.extend(
            entries
                .iter()
                .filter_map(|e| e["name"].as_str().map(str::to_string)),
        );
        page = v["page"].clone();
        if page.is_null() {
            break;
        }
    }
    assert!(pages >= 2);
    assert_eq!(got, want);
}

/// A bad path is 403 on a store and on a delete, as the hub answers (`http.ts`; a delete's
/// was 400 before the hub's fix of issue 266, which `@stacks/storage` reads as a generic
/// error instead of a `BadPathError`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_path_is_403_on_a_delete_too() {
    let hub = Hub::start(1 << 20).await;
    let k = Key::new(42);
    let (a, auth) = (k.address(), k.bearer());
    assert_eq!(hub.store(&auth, &a, "f", b"x", &[]).await.0, 202);
    assert_eq!(hub.store(&auth, &a, "a..b", b"x", &[]).await.0, 403);
    let (st, v) = hub.delete(&auth, &a, "a..b").await;
    assert_eq!(st, 403, "{v:?}");
}

/// `/read/` serves one byte range and answers a matching `If-None-Match` with 304, as the
/// reader's `res.sendFile` does (a `<video>` in Safari plays only from servers with
/// ranges), streamed files and small ones alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_serve_ranges_and_not_modified() {
    let hub = Hub::start(1 << 20).await;
    let k = Key::new(43);
    let (a, auth) = (k.address(), k.bearer());
    for n in [1000usize, 100_000] {
        let data: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
        let path = format!("v{n}.bin");
        assert_eq!(hub.store(&auth, &a, &path, &data, &[]).await.0, 202);
        let (_, etag, _, _) = hub.read(&a, &path).await;
        let etag = etag.unwrap();
        let get = |hdrs: Vec<(&'static str, String)>| {
            let mut r = hub.http.get(hub.url(&format!("/read/{a}/{path}")));
            for (h, v) in hdrs {
                r = r.header(h, v);
            }
            r.send()
        };
        let r = get(vec![("range", "bytes=10-19".into())]).await.unwrap();
        assert_eq!(r.status(), 206, "{n}");
        assert_eq!(r.headers()["content-range"], format!("bytes 10-19/{n}"));
        assert_eq!(r.headers()["accept-ranges"], "bytes");
        assert_eq!(r.bytes().await.unwrap().as_ref(), &data[10..20]);
        let r = get(vec![("range", "bytes=-5".into())]).await.unwrap();
        assert_eq!(r.status(), 206);
        assert_eq!(r.bytes().await.unwrap().as_ref(), &data[n - 5..]);
        let r = get(vec![("range", format!("bytes={n}-"))]).await.unwrap();
        assert_eq!(r.status(), 416);
        assert_eq!(r.headers()["content-range"], format!("bytes */{n}"));
        // If-Range naming this version (strongly): the range; another version, a weak
        // tag or a date: the whole file.
        let r = get(vec![
            ("range", "bytes=10-19".into()),
            ("if-range", format!("\"{etag}\"")),
        ])
        .await
        .unwrap();
        assert_eq!(r.status(), 206);
        for other in ["other".to_string(), format!("W/\"{etag}\""), "*".into()] {
            let r = get(vec![("range", "bytes=10-19".into()), ("if-range", other)])
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            assert_eq!(r.bytes().await.unwrap().len(), n);
        }
        for tag in [etag.clone(), format!("\"{etag}\""), format!("W/\"{etag}\"")] {
            let r = get(vec![("if-none-match", tag)]).await.unwrap();
            assert_eq!(r.status(), 304);
            assert!(r.bytes().await.unwrap().is_empty());
        }
        let r = get(vec![("if-none-match", "other".into())]).await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.bytes().await.unwrap().as_ref(), &data[..]);
        // If-Match, as `send` checks it: another version is 412 (a resumed range
        // included), this one or `*` is served.
        for other in ["other".to_string(), "\"0000\"".into()] {
            let r = get(vec![("if-match", other), ("range", "bytes=10-19".into())])
                .await
                .unwrap();
            assert_eq!(r.status(), 412);
        }
        for tag in [
            format!("\"{etag}\""),
            "*".into(),
            format!("x, {etag}"),
            String::new(),
        ] {
            let r = get(vec![("if-match", tag), ("range", "bytes=10-19".into())])
                .await
                .unwrap();
            assert_eq!(r.status(), 206);
        }
    }
}

/// A file whose head ref names another file's version is damage to a read (which answers
/// any failure as the hub's reader does: 400) and to a listing with `stat` (500), not that
/// other file's content or size under this name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_naming_another_files_version_is_damage() {
    let hub = Hub::start(1 << 20).await;
    let k = Key::new(31);
    let (a, auth) = (k.address(), k.bearer());
    let (st, _) = hub.store(&auth, &a, "a", b"the other file", &[]).await;
    assert_eq!(st, 202);
    let (st, _) = hub.store(&auth, &a, "b", b"bb", &[]).await;
    assert_eq!(st, 202);
    let node = hub.node.clone();
    let name = bucket_name(&a).unwrap();
    tokio::task::spawn_blocking(move || {
        let bucket = node.bucket(&name).unwrap();
        let db = bucket.db();
        let of_a = db.branch_head(b"a", "master").unwrap().unwrap();
        let of_b = db.branch_head(b"b", "master").unwrap().unwrap();
        let (ref_b, _) = db
            .store()
            .list_refs(b"bucket/")
            .unwrap()
            .into_iter()
            .find(|(_, v)| v[..] == of_b.to_bytes()[..])
            .unwrap();
        db.store()
            .commit(&[cairn_store::RefUpdate::Set {
                name: ref_b.to_vec(),
                value: of_a.to_bytes().to_vec(),
            }])
            .unwrap();
    })
    .await
    .unwrap();
    let (st, _, _, body) = hub.read(&a, "b").await;
    assert_eq!((st, &body[..]), (400, &b"Could not return file"[..]));
    let (st, v) = hub.list(&auth, &a, json!({ "stat": true })).await;
    assert_eq!(st, 500, "{v}");
    // Without stat only names are listed: no version is read.
    let (st, v) = hub.list(&auth, &a, json!({})).await;
    assert_eq!((st, &v["entries"]), (202, &json!(["a", "b"])));
}

/// Reads do not open the bucket they read (which loads its capsule's record DAG):
/// anonymous reads cycling over more buckets than `max_open_buckets` made the node reload
/// large capsules over and over. Small and streamed files, HEAD and the revocation
/// timestamp are all served from the store with the open bucket left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_do_not_open_the_bucket() {
    let hub = Hub::tuned(|c| c.max_open_buckets = 1).await;
    let (ka, kb) = (Key::new(31), Key::new(32));
    let (a, b) = (ka.address(), kb.address());
    let big: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(
        hub.store(&ka.bearer(), &a, "small.txt", b"hi", &[]).await.0,
        202
    );
    assert_eq!(
        hub.store(&ka.bearer(), &a, "big.bin", &big, &[]).await.0,
        202
    );
    let now = now() as i64;
    let revoke = hub
        .http
        .post(hub.url(&format!("/revoke-all/{a}")))
        .header("authorization", ka.bearer())
        .header("content-type", "application/json")
        .body(json!({ "oldestValidTimestamp": now - 100 }).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(revoke.status().as_u16(), 202);
    // B's store closes A (one bucket open at most).
    assert_eq!(hub.store(&kb.bearer(), &b, "x", b"x", &[]).await.0, 202);
    let open_b = hub.node.bucket(&bucket_name(&b).unwrap()).unwrap();
    assert_eq!(hub.node.open_buckets(), 1);
    let (st, _, _, body) = hub.read(&a, "small.txt").await;
    assert_eq!((st, body.as_slice()), (200, &b"hi"[..]));
    let (st, _, _, body) = hub.read(&a, "big.bin").await;
    assert_eq!(st, 200);
    assert!(body == big);
    let head = hub
        .http
        .head(hub.url(&format!("/read/{a}/big.bin")))
        .send()
        .await
        .unwrap();
    assert_eq!(head.status().as_u16(), 200);
    let (st, _, _, body) = hub.read(&format!("{a}-auth"), "authTimestamp").await;
    assert_eq!(
        (st, String::from_utf8(body).unwrap()),
        (200, (now - 100).to_string())
    );
    assert_eq!(hub.read(&a, "absent").await.0, 404);
    // B is still the bucket open: none of the reads opened A (which would have closed B).
    let still = hub.node.bucket(&bucket_name(&b).unwrap()).unwrap();
    assert!(
        std::sync::Arc::ptr_eq(&open_b, &still),
        "a read opened its bucket"
    );
    assert_eq!(hub.node.open_buckets(), 1);
}

/// A store refused on its headers is answered before its body is asked for: a client that
/// sends `Expect: 100-continue` gets the refusal, not `100 Continue` (an invitation to
/// upload, sent when the body is first pulled, which happened before the token was
/// checked). An accepted store is still invited and stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_refused_on_its_headers_is_not_invited_to_upload() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let hub = Hub::start(1 << 20).await;
    let k = Key::new(33);
    let a = k.address();
    let addr = hub.base.trim_start_matches("http://").to_string();
    let first_line = |auth: String, len: u64| {
        let (addr, a) = (addr.clone(), a.clone());
        async move {
            let mut tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
            let req = format!(
                "POST /store/{a}/f HTTP/1.1\r\nHost: localhost\r\nAuthorization: {auth}\r\n\
                 Content-Length: {len}\r\nExpect: 100-continue\r\n\r\n"
            );
            tcp.write_all(req.as_bytes()).await.unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 256];
            while !got.windows(2).any(|w| w == b"\r\n") {
                let n =
                    tokio::time::timeout(std::time::Duration::from_secs(10), tcp.read(&mut buf))
                        .await
                        .expect("an answer to the headers")
                        .unwrap();
                assert!(n > 0, "closed without an answer");
                got.extend_from_slice(&buf[..n]);
            }
            let line = String::from_utf8_lossy(&got)
                .lines()
                .next()
                .unwrap()
                .to_string();
            (tcp, line)
        }
    };
    let (_, line) = first_line("bearer v1:not-a-jwt".into(), 5).await;
    assert!(line.starts_with("HTTP/1.1 401"), "{line}");
    let (_, line) = first_line(k.bearer(), 6 << 30).await;
    assert!(line.starts_with("HTTP/1.1 413"), "{line}");
    let (mut tcp, line) = first_line(k.bearer(), 5).await;
    assert!(line.starts_with("HTTP/1.1 100"), "{line}");
    tcp.write_all(b"hello").await.unwrap();
    let mut rest = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&rest).contains("HTTP/1.1 202") {
        let n = tokio::time::timeout(std::time::Duration::from_secs(10), tcp.read(&mut buf))
            .await
            .expect("the store's answer")
            .unwrap();
        assert!(n > 0, "closed without an answer");
        rest.extend_from_slice(&buf[..n]);
    }
    assert_eq!(hub.read(&a, "f").await.3, b"hello");
}

/// A `list-files` page reads a bounded number of the store's refs, whatever the bucket's
/// archival history: a run of 20,000 files deleted under an archival scope (each key left
/// with a `.history.` branch and no file) ends a page early with a cursor, and a file
/// with 2,000 archived versions costs a lookup, not its versions. Every file is listed
/// once over the pages. (One page read every ref before the first file past them.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_files_pages_read_past_archives_in_bounded_steps() {
    let hub = Hub::start(1 << 20).await;
    let k = Key::new(92);
    let (a, auth) = (k.address(), k.bearer());
    for f in ["0-first", "m-archived", "zz-last"] {
        assert_eq!(hub.store(&auth, &a, f, b"x", &[]).await.0, 202);
    }
    let bucket = hub
        .node
        .bucket(&cairn_node::gaia::bucket_name(&a).unwrap())
        .unwrap();
    tokio::task::spawn_blocking(move || {
        let head = bucket
            .db()
            .branch_head(b"m-archived", "master")
            .unwrap()
            .unwrap();
        for i in 0..2000 {
            bucket
                .fork(
                    b"m-archived",
                    &cairn_object::At::Uid(head),
                    &format!(".history.1700000000000.{i:012}"),
                )
                .unwrap();
        }
        for i in 0..20_000 {
            let key = format!("n/{i:07}");
            bucket
                .put(
                    key.as_bytes(),
                    cairn_object::Target::Branch("master"),
                    cairn_object::NewValue::Blob(vec![1]),
                    &cairn_object::PutOptions::default(),
                )
                .unwrap();
            bucket
                .rename(
                    key.as_bytes(),
                    "master",
                    &format!(".history.1700000000000.{i:012}"),
                )
                .unwrap();
        }
    })
    .await
    .unwrap();
    let (st, v) = hub.list(&auth, &a, json!({})).await;
    assert_eq!(st, 202);
    assert_eq!(v["entries"], json!(["0-first", "m-archived"]));
    assert!(
        v["page"].is_string(),
        "the page ended in the archived run: {v}"
    );
    let mut all = vec!["0-first".to_string(), "m-archived".to_string()];
    let mut page = v["page"].clone();
    let mut pages = 1;
    while !page.is_null() {
        let (st, v) = hub.list(&auth, &a, json!({ "page": page })).await;
        assert_eq!(st, 202);
        pages += 1;
        for e in v["entries"].as_array().unwrap() {
            all.push(e.as_str().unwrap().to_string());
        }
        page = v["page"].clone();
    }
    assert_eq!(all, ["0-first", "m-archived", "zz-last"]);
    assert!((2..=4).contains(&pages), "{pages} pages");
}

/// A page of plain files holds `page_size` names whatever the page size: the ref budget
/// cuts a page short only where it read past keys that are not files (a page stopped at
/// 1,024 names, four reads of 256, whatever the size configured).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_of_files_holds_page_size_names() {
    let gaia = GaiaConfig {
        page_size: 4096,
        ..GaiaConfig::default()
    };
    let hub = Hub::with(1 << 20, 256, gaia).await;
    let k = Key::new(93);
    let (a, auth) = (k.address(), k.bearer());
    assert_eq!(hub.store(&auth, &a, "seed", b"x", &[]).await.0, 202);
    let bucket = hub.node.bucket(&bucket_name(&a).unwrap()).unwrap();
    tokio::task::spawn_blocking(move || {
        for i in 0..1499 {
            bucket
                .put(
                    format!("f{i:07}").as_bytes(),
                    cairn_object::Target::Branch("master"),
                    cairn_object::NewValue::Blob(vec![1]),
                    &cairn_object::PutOptions::default(),
                )
                .unwrap();
        }
    })
    .await
    .unwrap();
    let (st, v) = hub.list(&auth, &a, json!({})).await;
    assert_eq!(st, 202);
    assert_eq!(
        v["entries"].as_array().unwrap().len(),
        1500,
        "{}",
        v["page"]
    );
    assert!(v["page"].is_null());
}

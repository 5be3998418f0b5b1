//! HTTP tests of the native API over a real socket: every route, ranges, typed values,
//! guards, size limits, owner-key auth failures and proofs checked by a reader.

mod native_support;

use cairn_capsule::{CapsuleMetadata, VersionProof};
use cairn_core::SigningKey;
use cairn_node::native::auth::now_secs;
use cairn_object::Uid;
use native_support::{Server, kind};
use reqwest::Method;
use serde_json::json;

const JSON: (&str, &str) = ("content-type", "application/json");

fn uid_of(v: &serde_json::Value) -> Uid {
    v["uid"].as_str().expect("uid").parse().expect("a uid")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_create_list_info_metadata() {
    let s = Server::start(1 << 20).await;
    let info = s.open_bucket("photos").await;
    assert_eq!(info["name"], "photos");
    assert_eq!(info["open"], true);
    assert!(info["owner"].is_null());
    let node_key = s.node.public_key().to_string();
    assert_eq!(info["writers"], json!([node_key]));
    // The metadata bytes hash to the capsule name; the binary route serves the same bytes.
    let meta_hex = info["metadata"].as_str().unwrap();
    let meta = CapsuleMetadata::decode(&hex::decode(meta_hex).unwrap()).unwrap();
    assert_eq!(meta.name().to_string(), info["capsule"].as_str().unwrap());
    // An open bucket says so in its metadata (bound into the capsule name).
    assert_eq!(meta.settings["cairn.native.owner"], "open");
    assert_eq!(info["settings"]["cairn.native.owner"], "open");
    // The node's default leaf size, recorded in the metadata.
    assert_eq!(info["leaf_size"], 65536);
    assert_eq!(meta.settings["cairn.leaf_size"], "65536");
    // Parameters in the query of the bucket routes are refused, not ignored: an owner
    // meant as `?owner=` must not create an open bucket.
    let (st, e) = s
        .send(
            Method::POST,
            "/v1/buckets?owner=ed25519:00",
            &[("content-type", "application/json")],
            json!({"name": "typo"}).to_string(),
        )
        .await;
    assert_eq!(st, 400, "{e}");
    for path in [
        "/v1/buckets?x=1",
        "/v1/buckets/photos?x=1",
        "/v1/buckets/photos/metadata?x=1",
    ] {
        assert_eq!(s.get(path).await.status(), 400, "{path}");
    }
    assert_eq!(s.get("/v1/buckets/typo").await.status(), 404);
    let r = s.get("/v1/buckets/photos/metadata").await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["x-cairn-capsule"].to_str().unwrap(),
        info["capsule"].as_str().unwrap()
    );
    assert_eq!(r.bytes().await.unwrap().to_vec(), meta.encode());
    let (st, got) = s.get_json("/v1/buckets/photos").await;
    assert_eq!(st, 200);
    assert_eq!(got, info);

    s.open_bucket("docs").await;
    let (st, list) = s.get_json("/v1/buckets").await;
    assert_eq!(st, 200);
    let names: Vec<&str> = list["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["docs", "photos"]);

    // Duplicates, bad names, bad bodies, unknown buckets.
    let body = json!({ "name": "photos" }).to_string();
    let (st, e) = s.send(Method::POST, "/v1/buckets", &[JSON], body).await;
    assert_eq!((st, kind(&e)), (409, "already_exists"), "{e}");
    let body = json!({ "name": "Bad Name" }).to_string();
    let (st, e) = s.send(Method::POST, "/v1/buckets", &[JSON], body).await;
    assert_eq!((st, kind(&e)), (400, "invalid_input"), "{e}");
    let (st, e) = s
        .send(Method::POST, "/v1/buckets", &[JSON], "{\"nam\": 1}")
        .await;
    assert_eq!((st, kind(&e)), (400, "invalid_input"), "{e}");
    let body = json!({ "name": "x", "owner": "ed25519:zz" }).to_string();
    let (st, e) = s.send(Method::POST, "/v1/buckets", &[JSON], body).await;
    assert_eq!(st, 400, "{e}");
    let (st, e) = s.get_json("/v1/buckets/nosuch").await;
    assert_eq!((st, kind(&e)), (404, "not_found"), "{e}");
    let (st, e) = s.get_json("/v1/buckets/nosuch/objects/k").await;
    assert_eq!((st, kind(&e)), (404, "not_found"), "{e}");
    let (st, e) = s.get_json("/v1/no/such/route").await;
    assert_eq!((st, kind(&e)), (404, "not_found"), "{e}");
    // A leaf size of its own: recorded and reported; an unusable one is refused and
    // creates nothing.
    for bad in [
        json!(63),
        json!(65537),
        json!(1u64 << 22),
        json!("big"),
        json!(-2),
    ] {
        let body = json!({ "name": "sized", "leaf_size": bad }).to_string();
        let (st, e) = s.send(Method::POST, "/v1/buckets", &[JSON], body).await;
        assert_eq!((st, kind(&e)), (400, "invalid_input"), "{bad}: {e}");
    }
    let (_, list) = s.get_json("/v1/buckets").await;
    assert_eq!(list["buckets"].as_array().unwrap().len(), 2);
    let body = json!({ "name": "sized", "leaf_size": 8192 }).to_string();
    let (st, info) = s.send(Method::POST, "/v1/buckets", &[JSON], body).await;
    assert_eq!(st, 201, "{info}");
    assert_eq!(info["leaf_size"], 8192);
    assert_eq!(info["settings"]["cairn.leaf_size"], "8192");
    let b = s.node.bucket("sized").unwrap();
    assert_eq!(b.db().tree_config().leaf_target, 8192);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_written_elsewhere_are_not_taken_over() {
    let s = Server::start(1 << 20).await;
    // A bucket the node keeps for another front door (e.g. the Gaia hub).
    let node = s.node.clone();
    tokio::task::spawn_blocking(move || {
        node.bucket("gaia-x")
            .unwrap()
            .put(
                b"k",
                cairn_object::Target::Branch("master"),
                cairn_object::NewValue::String(b"v".to_vec()),
                &Default::default(),
            )
            .unwrap();
    })
    .await
    .unwrap();
    let (st, e) = s.get_json("/v1/buckets/gaia-x/objects/k").await;
    assert_eq!(st, 404, "{e}");
    let (st, e) = s
        .send(Method::PUT, "/v1/buckets/gaia-x/objects/k", &[], "w")
        .await;
    assert_eq!(st, 404, "{e}");
    let body = json!({ "name": "gaia-x" }).to_string();
    let (st, e) = s.send(Method::POST, "/v1/buckets", &[JSON], body).await;
    assert_eq!((st, kind(&e)), (400, "invalid_input"), "{e}");
    // Nor can anyone create the bucket of a Gaia address before its owner stores there
    // (it would be an open bucket the hub then writes into).
    let unused = cairn_node::gaia::bucket_name("1BgGZ9tcN4rm9KBzDn7KprQz87SZ26SAMH").unwrap();
    let body = json!({ "name": unused }).to_string();
    let (st, e) = s.send(Method::POST, "/v1/buckets", &[JSON], body).await;
    assert_eq!((st, kind(&e)), (400, "invalid_input"), "{e}");
    let (st, e) = s.get_json("/v1/buckets").await;
    assert_eq!(st, 200);
    assert!(e["buckets"].as_array().unwrap().is_empty(), "{e}");
    s.stop().await;
}

/// A create that stopped between its capsule and its registry entry (a crash) does not
/// leave the name taken for good: the same create sent again finishes it, and a create
/// with other settings is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_interrupted_before_its_registry_entry_is_finished_by_a_retry() {
    use cairn_node::native::buckets::{OPEN, OWNER_SETTING};
    let s = Server::start(1 << 20).await;
    let owner = SigningKey::from_seed(&[31; 32]);
    let other = SigningKey::from_seed(&[32; 32]);
    // What the first commit of each create leaves: the capsule, no registry entry.
    let node = s.node.clone();
    let owner_key = owner.public().to_string();
    tokio::task::spawn_blocking(move || {
        node.create_bucket("half", None, &[(OWNER_SETTING, owner_key)])
            .unwrap();
        node.create_bucket("half-open", None, &[(OWNER_SETTING, OPEN.to_string())])
            .unwrap();
    })
    .await
    .unwrap();
    let (st, e) = s.get_json("/v1/buckets/half").await;
    assert_eq!(st, 404, "{e}");
    // Other settings: another owner, an open bucket, another leaf size.
    let (st, e) = s.create_owned(&other, "half").await;
    assert_eq!((st, kind(&e)), (409, "already_exists"), "{e}");
    let body = json!({ "name": "half" }).to_string();
    let (st, e) = s.send(Method::POST, "/v1/buckets", &[JSON], body).await;
    assert_eq!((st, kind(&e)), (409, "already_exists"), "{e}");
    let body = json!({ "name": "half-open", "leaf_size": 8192 }).to_string();
    let (st, e) = s.send(Method::POST, "/v1/buckets", &[JSON], body).await;
    assert_eq!((st, kind(&e)), (409, "already_exists"), "{e}");
    // The same create again finishes it, and the bucket works.
    let (st, v) = s.create_owned(&owner, "half").await;
    assert_eq!(st, 201, "{v}");
    assert_eq!(v["owner"], json!(owner.public().to_string()), "{v}");
    let v = s.open_bucket("half-open").await;
    assert!(v["owner"].is_null(), "{v}");
    let (st, v) = s
        .send(Method::PUT, "/v1/buckets/half-open/objects/k", &[], "w")
        .await;
    assert_eq!(st, 201, "{v}");
    let (st, e) = s.create_owned(&owner, "half").await;
    assert_eq!((st, kind(&e)), (409, "already_exists"), "{e}");
    let (st, list) = s.get_json("/v1/buckets").await;
    assert_eq!(st, 200);
    assert_eq!(list["buckets"].as_array().unwrap().len(), 2, "{list}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blobs_stream_with_ranges_and_etags() {
    let s = Server::start(1 << 20).await;
    s.open_bucket("b").await;
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let (st, w) = s
        .send(
            Method::PUT,
            "/v1/buckets/b/objects/dir/file.bin",
            &[],
            data.clone(),
        )
        .await;
    assert_eq!(st, 201, "{w}");
    assert_eq!(w["key"], "dir/file.bin");
    assert_eq!(w["branch"], "master");
    let uid = uid_of(&w);
    let etag = format!("\"{uid}\"");

    let r = s.get("/v1/buckets/b/objects/dir/file.bin").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["etag"].to_str().unwrap(), etag);
    assert_eq!(r.headers()["x-cairn-type"], "blob");
    assert_eq!(r.headers()["accept-ranges"], "bytes");
    assert_eq!(r.headers()["content-length"], "100000");
    assert_eq!(r.bytes().await.unwrap().to_vec(), data);

    let r = s
        .req(Method::HEAD, "/v1/buckets/b/objects/dir/file.bin")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-length"], "100000");
    assert_eq!(r.headers()["etag"].to_str().unwrap(), etag);
    assert!(r.bytes().await.unwrap().is_empty());

    let range = |h: &'static str| {
        s.req(Method::GET, "/v1/buckets/b/objects/dir/file.bin")
            .header("range", h)
            .send()
    };
    for (h, start, end) in [
        ("bytes=0-9", 0usize, 10usize),
        ("bytes=99990-", 99_990, 100_000),
        ("bytes=-5", 99_995, 100_000),
        ("bytes=50000-50000", 50_000, 50_001),
        ("bytes=99999-200000", 99_999, 100_000),
        ("bytes=-200000", 0, 100_000),
        ("bytes=4000-70000", 4_000, 70_001),
    ] {
        let r = range(h).await.unwrap();
        assert_eq!(r.status(), 206, "{h}");
        assert_eq!(
            r.headers()["content-range"].to_str().unwrap(),
            format!("bytes {start}-{}/100000", end - 1),
            "{h}"
        );
        assert_eq!(r.bytes().await.unwrap().to_vec(), &data[start..end], "{h}");
    }
    for h in ["bytes=100000-", "bytes=-0", "bytes=200000-300000"] {
        let r = range(h).await.unwrap();
        assert_eq!(r.status(), 416, "{h}");
        assert_eq!(r.headers()["content-range"], "bytes */100000", "{h}");
        let e: serde_json::Value = r.json().await.unwrap();
        assert_eq!(kind(&e), "range_not_satisfiable");
    }
    // Several ranges, another unit, or bad syntax: the whole blob.
    for h in ["bytes=0-1,5-6", "items=0-1", "bytes=9-1", "bytes=a-b"] {
        let r = range(h).await.unwrap();
        assert_eq!(r.status(), 200, "{h}");
        assert_eq!(r.bytes().await.unwrap().len(), 100_000, "{h}");
    }
    // If-Range: honoured only for the current version.
    let r = s
        .req(Method::GET, "/v1/buckets/b/objects/dir/file.bin")
        .header("range", "bytes=0-0")
        .header("if-range", etag.as_str())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 206);
    let r = s
        .req(Method::GET, "/v1/buckets/b/objects/dir/file.bin")
        .header("range", "bytes=0-0")
        .header("if-range", "\"other\"")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // If-None-Match. The answer varies with Accept (text or JSON under one ETag), and
    // says so, on the 304 too.
    let r = s
        .req(Method::GET, "/v1/buckets/b/objects/dir/file.bin")
        .header("if-none-match", etag.as_str())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 304);
    assert_eq!(r.headers()["vary"], "accept");
    let r = s
        .req(Method::GET, "/v1/buckets/b/objects/dir/file.bin")
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["vary"], "accept");
    // An empty blob: every range is unsatisfiable; the whole is empty.
    let (st, _) = s
        .send(Method::PUT, "/v1/buckets/b/objects/empty", &[], Vec::new())
        .await;
    assert_eq!(st, 201);
    let r = s
        .req(Method::GET, "/v1/buckets/b/objects/empty")
        .header("range", "bytes=0-")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 416);
    assert_eq!(r.headers()["content-range"], "bytes */0");
    let r = s.get("/v1/buckets/b/objects/empty").await;
    assert_eq!(r.status(), 200);
    assert!(r.bytes().await.unwrap().is_empty());
    // A version by uid; a key with percent-encoded bytes.
    let r = s
        .get(&format!("/v1/buckets/b/objects/dir/file.bin?uid={uid}"))
        .await;
    assert_eq!(r.status(), 200);
    let (st, _) = s
        .send(Method::PUT, "/v1/buckets/b/objects/a%20b%2Fc", &[], "x")
        .await;
    assert_eq!(st, 201);
    let (_, keys) = s.get_json("/v1/buckets/b/keys").await;
    assert_eq!(keys["keys"], json!(["a b/c", "dir/file.bin", "empty"]));

    // Metrics count the native API's bytes.
    let m = s.get("/metrics").await.text().await.unwrap();
    let line = |name: &str| {
        m.lines()
            .find(|l| l.starts_with(name) && l.contains("api=\"native\""))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0)
    };
    assert!(line("cairn_bytes_written_total") >= 100_001, "{m}");
    assert!(line("cairn_bytes_read_total") >= 200_000, "{m}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_values_in_text_and_json() {
    let s = Server::start(1 << 20).await;
    s.open_bucket("t").await;
    let put = |key: &'static str, q: &'static str, json: bool, body: String| {
        let headers: &'static [(&str, &str)] = if json { &[JSON] } else { &[] };
        let path = format!("/v1/buckets/t/objects/{key}{q}");
        let s = &s;
        async move { s.send(Method::PUT, &path, headers, body).await }
    };
    let text = |key: &'static str| {
        let s = &s;
        async move {
            let r = s.get(&format!("/v1/buckets/t/objects/{key}")).await;
            assert_eq!(r.status(), 200);
            let ty = r.headers()["x-cairn-type"].to_str().unwrap().to_string();
            (ty, r.text().await.unwrap())
        }
    };
    // Text forms (the CLI's).
    assert_eq!(put("s", "?type=string", false, "hello".into()).await.0, 201);
    assert_eq!(text("s").await, ("string".into(), "hello".into()));
    assert_eq!(
        put("i", "?type=integer", false, " 42\n".into()).await.0,
        201
    );
    assert_eq!(text("i").await, ("integer".into(), "42\n".into()));
    assert_eq!(
        put("tu", "?type=tuple", false, "a\nb\n".into()).await.0,
        201
    );
    assert_eq!(text("tu").await, ("tuple".into(), "a\nb\n".into()));
    assert_eq!(
        put("l", "?type=list", false, "x\n\ny\n".into()).await.0,
        201
    );
    assert_eq!(text("l").await, ("list".into(), "x\n\ny\n".into()));
    assert_eq!(
        put("se", "?type=set", false, "b\na\nb\n".into()).await.0,
        201
    );
    assert_eq!(text("se").await, ("set".into(), "a\nb\n".into()));
    assert_eq!(
        put("m", "?type=map", false, "k=v\na=1=2\n".into()).await.0,
        201
    );
    assert_eq!(text("m").await, ("map".into(), "a=1=2\nk=v\n".into()));

    // JSON forms, inferred and explicit, and their round trips.
    assert_eq!(put("js", "", true, json!("héllo").to_string()).await.0, 201);
    assert_eq!(
        s.get_json("/v1/buckets/t/objects/js").await.1,
        json!("héllo")
    );
    assert_eq!(put("ji", "", true, "-7".into()).await.0, 201);
    assert_eq!(s.get_json("/v1/buckets/t/objects/ji").await.1, json!(-7));
    assert_eq!(
        put("jl", "", true, json!(["a\nb", "c"]).to_string())
            .await
            .0,
        201
    );
    assert_eq!(
        s.get_json("/v1/buckets/t/objects/jl").await.1,
        json!(["a\nb", "c"])
    );
    let (st, _) = put(
        "jt",
        "?type=tuple",
        true,
        json!(["1", {"hex": "ff00"}]).to_string(),
    )
    .await;
    assert_eq!(st, 201);
    assert_eq!(
        s.get_json("/v1/buckets/t/objects/jt").await.1,
        json!(["1", {"hex": "ff00"}])
    );
    let (st, _) = put("jset", "?type=set", true, json!(["z", "y"]).to_string()).await;
    assert_eq!(st, 201);
    assert_eq!(
        s.get_json("/v1/buckets/t/objects/jset").await.1,
        json!(["y", "z"])
    );
    assert_eq!(
        put("jm", "", true, json!({"b": "2", "a": "1"}).to_string())
            .await
            .0,
        201
    );
    assert_eq!(
        s.get_json("/v1/buckets/t/objects/jm").await.1,
        json!({"a": "1", "b": "2"})
    );
    // A map with a key that is not UTF-8 comes back as pairs.
    let pairs = json!([[{"hex": "ff"}, "x"], ["k", {"hex": "fe"}]]);
    assert_eq!(put("jp", "?type=map", true, pairs.to_string()).await.0, 201);
    assert_eq!(
        s.get_json("/v1/buckets/t/objects/jp").await.1,
        json!([["k", {"hex": "fe"}], [{"hex": "ff"}, "x"]])
    );
    // Old text values read as JSON too.
    assert_eq!(
        s.get_json("/v1/buckets/t/objects/m").await.1,
        json!({"a": "1=2", "k": "v"})
    );
    assert_eq!(s.get_json("/v1/buckets/t/objects/i").await.1, json!(42));

    // Bad input writes nothing.
    let before = s.get_json("/v1/buckets/t/meta/m").await.1["uid"].clone();
    for (q, json, body, status, k) in [
        ("?type=map", false, "novalue", 400, "invalid_input"),
        ("?type=map", true, "[1]", 400, "invalid_input"),
        ("?type=map", true, "{", 400, "invalid_input"),
        ("?type=integer", false, "5", 409, "type_mismatch"),
        ("?type=integer", false, "x", 400, "invalid_input"),
        ("", false, "blob on a map", 409, "type_mismatch"),
        ("?type=wat", false, "x", 400, "invalid_input"),
        ("?brnach=x", false, "x", 400, "invalid_input"),
        ("?type=blob", true, "\"x\"", 400, "invalid_input"),
        ("?branch=a&base=b", false, "x", 400, "invalid_input"),
    ] {
        let headers: &[(&str, &str)] = if json { &[JSON] } else { &[] };
        let (st, e) = s
            .send(
                Method::PUT,
                &format!("/v1/buckets/t/objects/m{q}"),
                headers,
                body,
            )
            .await;
        assert_eq!((st, kind(&e)), (status, k), "{q} {body}: {e}");
    }
    assert_eq!(s.get_json("/v1/buckets/t/meta/m").await.1["uid"], before);

    // PATCH: type operations.
    let patch = |key: &'static str, body: serde_json::Value| {
        let s = &s;
        async move {
            s.send(
                Method::PATCH,
                &format!("/v1/buckets/t/objects/{key}"),
                &[JSON],
                body.to_string(),
            )
            .await
        }
    };
    assert_eq!(patch("i", json!({"op": "add", "by": 8})).await.0, 200);
    assert_eq!(patch("i", json!({"op": "multiply", "by": 2})).await.0, 200);
    assert_eq!(s.get_json("/v1/buckets/t/objects/i").await.1, json!(100));
    // A context goes with a PUT: sent with a PATCH or a DELETE (where it was dropped
    // silently) it is refused, and nothing changes.
    for method in [Method::PATCH, Method::DELETE] {
        let (st, e) = s
            .send(
                method.clone(),
                "/v1/buckets/t/objects/i",
                &[JSON, ("x-cairn-context", "note")],
                json!({"op": "add", "by": 1}).to_string(),
            )
            .await;
        assert_eq!((st, kind(&e)), (400, "invalid_input"), "{method}: {e}");
    }
    assert_eq!(s.get_json("/v1/buckets/t/objects/i").await.1, json!(100));
    assert_eq!(
        patch("s", json!({"op": "append", "value": "!"})).await.0,
        200
    );
    assert_eq!(
        patch("s", json!({"op": "insert", "at": 0, "value": ">"}))
            .await
            .0,
        200
    );
    assert_eq!(text("s").await.1, ">hello!");
    // A PATCH keeps the version's context (it made a version with none).
    let (st, _) = s
        .send(
            Method::PUT,
            "/v1/buckets/t/objects/c?type=string",
            &[("x-cairn-context", "note")],
            "hello",
        )
        .await;
    assert_eq!(st, 201);
    assert_eq!(
        patch("c", json!({"op": "append", "value": "!"})).await.0,
        200
    );
    assert_eq!(text("c").await.1, "hello!");
    assert_eq!(
        s.get_json("/v1/buckets/t/meta/c").await.1["context"],
        "note"
    );
    let (st, _) = patch(
        "m",
        json!({"op": "update", "set": {"n": "new"}, "unset": ["k"]}),
    )
    .await;
    assert_eq!(st, 200);
    assert_eq!(
        s.get_json("/v1/buckets/t/objects/m").await.1,
        json!({"a": "1=2", "n": "new"})
    );
    // A key named twice (which value is meant depends on the parser) is refused, as a
    // patch and as a whole map, and nothing changes.
    for (method, body) in [
        (
            Method::PATCH,
            r#"{"op": "update", "set": {"n": "x", "n": "y"}}"#,
        ),
        (Method::PUT, r#"{"n": "x", "n": "y"}"#),
    ] {
        let (st, e) = s
            .send(method, "/v1/buckets/t/objects/m", &[JSON], body)
            .await;
        assert_eq!((st, kind(&e)), (400, "invalid_input"), "{e}");
        assert!(e.to_string().contains("twice"), "{e}");
    }
    assert_eq!(
        s.get_json("/v1/buckets/t/objects/m").await.1,
        json!({"a": "1=2", "n": "new"})
    );
    let (st, _) = patch("se", json!({"op": "update", "add": ["c"], "remove": ["a"]})).await;
    assert_eq!(st, 200);
    assert_eq!(text("se").await.1, "b\nc\n");
    let (st, _) = patch(
        "l",
        json!({"op": "splice", "at": 1, "delete": 1, "insert": ["q", "r"]}),
    )
    .await;
    assert_eq!(st, 200);
    assert_eq!(text("l").await.1, "x\nq\nr\ny\n");
    let (st, e) = patch("i", json!({"op": "append", "value": "x"})).await;
    assert_eq!((st, kind(&e)), (409, "type_mismatch"), "{e}");
    let (st, e) = patch("i", json!({"op": "explode"})).await;
    assert_eq!(st, 400, "{e}");
    let (st, e) = patch("i", json!({"op": "add", "by": i64::MAX})).await;
    assert_eq!(st, 400, "{e}");
    assert_eq!(s.get_json("/v1/buckets/t/objects/i").await.1, json!(100));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guarded_writes_and_size_limits() {
    let s = Server::start(1000).await;
    s.open_bucket("g").await;
    let (st, w) = s
        .send(Method::PUT, "/v1/buckets/g/objects/k", &[], "one")
        .await;
    assert_eq!(st, 201);
    let first = uid_of(&w);
    let guard = format!("\"{first}\"");
    let (st, w) = s
        .send(
            Method::PUT,
            "/v1/buckets/g/objects/k",
            &[("if-match", guard.as_str())],
            "two",
        )
        .await;
    assert_eq!(st, 201, "{w}");
    let second = uid_of(&w);
    // The same guard again is stale: 412, head unchanged.
    let (st, e) = s
        .send(
            Method::PUT,
            "/v1/buckets/g/objects/k",
            &[("if-match", guard.as_str())],
            "three",
        )
        .await;
    assert_eq!((st, kind(&e)), (412, "guard_mismatch"), "{e}");
    let (st, e) = s
        .send(
            Method::PATCH,
            "/v1/buckets/g/objects/k",
            &[JSON, ("if-match", guard.as_str())],
            json!({"op": "splice", "at": 0, "insert": "x"}).to_string(),
        )
        .await;
    assert_eq!((st, kind(&e)), (412, "guard_mismatch"), "{e}");
    // `max_upload_bytes` (1000 here) bounds a PATCH's body as any other: refused, the
    // value unchanged (it took up to 16 MiB).
    let (st, e) = s
        .send(
            Method::PATCH,
            "/v1/buckets/g/objects/k",
            &[JSON],
            json!({"op": "splice", "at": 0, "insert": "x".repeat(5000)}).to_string(),
        )
        .await;
    assert_eq!((st, kind(&e)), (413, "too_large"), "{e}");
    assert_eq!(
        s.get_json("/v1/buckets/g/meta/k").await.1["uid"],
        second.to_string()
    );
    // A streamed put refused for its target (a branch that is not there) is answered before
    // its body is read: here the body never ends.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(1);
    tx.send(Ok(vec![7u8; 1 << 16])).await.unwrap();
    let endless = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    let resp = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        s.req(Method::PUT, "/v1/buckets/g/objects/k?branch=typo")
            .body(reqwest::Body::wrap_stream(endless))
            .send(),
    )
    .await
    .expect("answered before the body ended")
    .unwrap();
    assert_eq!(resp.status(), 404);
    drop(tx);
    // A method a route does not take is a JSON error too, with the methods it takes.
    let resp = s
        .req(Method::POST, "/v1/buckets/g/objects/k")
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 405);
    let allow = resp.headers()["allow"].to_str().unwrap().to_string();
    assert!(allow.contains("GET") && allow.contains("PUT"), "{allow}");
    let e: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(kind(&e), "method_not_allowed", "{e}");
    for bad in ["*", "W/\"x\"", "\"nope\"", "\"a\", \"b\""] {
        let (st, _) = s
            .send(
                Method::PUT,
                "/v1/buckets/g/objects/k",
                &[("if-match", bad)],
                "x",
            )
            .await;
        assert_eq!(st, 400, "{bad}");
    }
    // If-None-Match on a write is refused, not ignored (a create-only `*` must not
    // overwrite).
    let (st, e) = s
        .send(
            Method::PUT,
            "/v1/buckets/g/objects/k",
            &[("if-none-match", "*")],
            "over",
        )
        .await;
    assert_eq!(st, 400, "{e}");
    // Fork, rename and merge take no conditions: refused rather than ignored.
    let (st, e) = s
        .send(
            Method::POST,
            "/v1/buckets/g/fork/k",
            &[JSON, ("if-match", guard.as_str())],
            json!({"branch": "side"}).to_string(),
        )
        .await;
    assert_eq!(st, 400, "{e}");
    // Nor a context, which they would drop: refused, and nothing forked.
    let (st, e) = s
        .send(
            Method::POST,
            "/v1/buckets/g/fork/k",
            &[JSON, ("x-cairn-context", "reviewed")],
            json!({"branch": "side"}).to_string(),
        )
        .await;
    assert_eq!(st, 400, "{e}");
    assert!(e.to_string().contains("sets no context"), "{e}");
    let (st, _) = s.get_json("/v1/buckets/g/objects/k?branch=side").await;
    assert_eq!(st, 404);
    // DELETE honours If-Match: a stale one is 412 and removes nothing.
    let (st, e) = s
        .send(
            Method::DELETE,
            "/v1/buckets/g/objects/k",
            &[("if-match", guard.as_str())],
            "",
        )
        .await;
    assert_eq!((st, kind(&e)), (412, "guard_mismatch"), "{e}");
    let r = s.get("/v1/buckets/g/objects/k").await;
    assert_eq!(
        r.headers()["etag"].to_str().unwrap(),
        format!("\"{second}\"")
    );
    assert_eq!(r.text().await.unwrap(), "two");
    // A guard on a branch (or key) that is not there fails as a guard (412, as an
    // If-Match on a missing resource), for PATCH and DELETE as for PUT; unguarded, the
    // same requests are 404.
    for path in [
        "/v1/buckets/g/objects/k?branch=nowhere",
        "/v1/buckets/g/objects/no-such-key",
    ] {
        let (st, e) = s
            .send(
                Method::PATCH,
                path,
                &[JSON, ("if-match", guard.as_str())],
                json!({"op": "splice", "at": 0, "insert": "x"}).to_string(),
            )
            .await;
        assert_eq!((st, kind(&e)), (412, "guard_mismatch"), "PATCH {path}: {e}");
        let (st, e) = s
            .send(Method::DELETE, path, &[("if-match", guard.as_str())], "")
            .await;
        assert_eq!(
            (st, kind(&e)),
            (412, "guard_mismatch"),
            "DELETE {path}: {e}"
        );
        let (st, e) = s
            .send(
                Method::PATCH,
                path,
                &[JSON],
                json!({"op": "splice", "at": 0, "insert": "x"}).to_string(),
            )
            .await;
        assert_eq!(st, 404, "PATCH {path}: {e}");
        let (st, e) = s.send(Method::DELETE, path, &[], "").await;
        assert_eq!(st, 404, "DELETE {path}: {e}");
    }
    let (st, _) = s.get_json("/v1/buckets/g/objects/k?branch=nowhere").await;
    assert_eq!(st, 404, "a refused guarded request created the branch");

    // Concurrent writers guarding on the same head: exactly one wins.
    let guard = format!("\"{second}\"");
    let tries = (0..8).map(|i| {
        let req = s
            .req(Method::PUT, "/v1/buckets/g/objects/k")
            .header("if-match", guard.as_str())
            .body(format!("racer {i}"));
        async move { req.send().await.map(|r| r.status().as_u16()) }
    });
    let mut statuses: Vec<u16> = futures_util::future::join_all(tries)
        .await
        .into_iter()
        .map(|r| r.expect("send"))
        .collect();
    statuses.sort();
    assert_eq!(statuses, [201, 412, 412, 412, 412, 412, 412, 412]);
    let (_, log) = s.get_json("/v1/buckets/g/log/k").await;
    assert_eq!(log["versions"].as_array().unwrap().len(), 3);

    // Oversize: declared (Content-Length), streamed (chunked), buffered typed values.
    let big = vec![7u8; 1001];
    let (st, e) = s
        .send(Method::PUT, "/v1/buckets/g/objects/big", &[], big.clone())
        .await;
    assert_eq!((st, kind(&e)), (413, "too_large"), "{e}");
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = vec![Ok(vec![1u8; 600]), Ok(vec![2u8; 600])];
    let r = s
        .req(Method::PUT, "/v1/buckets/g/objects/big")
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        vec![Ok(vec![b'a'; 600]), Ok(vec![b'\n'; 600])];
    let r = s
        .req(Method::PUT, "/v1/buckets/g/objects/big?type=list")
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    let (st, _) = s
        .send(
            Method::PUT,
            "/v1/buckets/g/objects/big?type=string",
            &[],
            big.clone(),
        )
        .await;
    assert_eq!(st, 413);
    let (st, _) = s.get_json("/v1/buckets/g/objects/big").await;
    assert_eq!(st, 404, "an oversize upload created the key");
    // Exactly the limit is accepted.
    let (st, _) = s
        .send(
            Method::PUT,
            "/v1/buckets/g/objects/big",
            &[],
            vec![7u8; 1000],
        )
        .await;
    assert_eq!(st, 201);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_branches_merges() {
    let s = Server::start(1 << 20).await;
    s.open_bucket("v").await;
    let put_map = |q: &'static str, body: serde_json::Value| {
        let s = &s;
        async move {
            s.send(
                Method::PUT,
                &format!("/v1/buckets/v/objects/doc{q}"),
                &[JSON],
                body.to_string(),
            )
            .await
        }
    };
    let post = |op: &'static str, body: serde_json::Value| {
        let s = &s;
        async move {
            s.send(
                Method::POST,
                &format!("/v1/buckets/v/{op}/doc"),
                &[JSON],
                body.to_string(),
            )
            .await
        }
    };
    let (st, w) = put_map("", json!({"a": "1", "b": "1"})).await;
    assert_eq!(st, 201);
    let root = uid_of(&w);
    let (st, f) = post("fork", json!({"branch": "dev"})).await;
    assert_eq!((st, uid_of(&f)), (201, root), "{f}");
    let (st, e) = post("fork", json!({"branch": "dev"})).await;
    assert_eq!((st, kind(&e)), (409, "already_exists"), "{e}");
    let (st, e) = post("fork", json!({"branch": "x", "from": "nosuch"})).await;
    assert_eq!((st, kind(&e)), (404, "not_found"), "{e}");
    let (st, e) = post("fork", json!({"branch": "x", "extra": 1})).await;
    assert_eq!(st, 400, "{e}");
    let (_, w) = put_map("?branch=dev", json!({"a": "2", "b": "1"})).await;
    let dev = uid_of(&w);
    let (_, w) = put_map("", json!({"a": "3", "b": "1", "c": "1"})).await;
    let master = uid_of(&w);

    let (st, br) = s.get_json("/v1/buckets/v/branches/doc").await;
    assert_eq!(st, 200);
    assert_eq!(
        br["tagged"],
        json!({"dev": dev.to_string(), "master": master.to_string()})
    );
    assert_eq!(br["untagged"], json!([]));

    let (st, log) = s.get_json("/v1/buckets/v/log/doc").await;
    assert_eq!(st, 200);
    let uids: Vec<&str> = log["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["uid"].as_str().unwrap())
        .collect();
    assert_eq!(uids, [master.to_string(), root.to_string()]);
    assert_eq!(log["versions"][1]["distance"], 1);
    let (_, log) = s
        .get_json("/v1/buckets/v/log/doc?branch=dev&min=1&max=1")
        .await;
    assert_eq!(log["versions"].as_array().unwrap().len(), 1);
    let (st, _) = s.get_json("/v1/buckets/v/log/doc?min=5&max=1").await;
    assert_eq!(st, 400);

    let (st, d) = s.get_json("/v1/buckets/v/diff/doc?a=master&b=dev").await;
    assert_eq!(st, 200, "{d}");
    assert_eq!(d["same"], false);
    assert_eq!(
        d["changes"],
        json!([
            {"key": "a", "left": "3", "right": "2"},
            {"key": "c", "left": "1", "right": null}
        ])
    );
    assert_eq!(d["next"], json!(null));
    // A page at a time: one change, then the cursor for the rest.
    let (st, d) = s
        .get_json("/v1/buckets/v/diff/doc?a=master&b=dev&limit=1")
        .await;
    assert_eq!(st, 200, "{d}");
    assert_eq!(
        d["changes"],
        json!([{"key": "a", "left": "3", "right": "2"}])
    );
    let next = d["next"].as_str().unwrap().to_string();
    let (st, d) = s
        .get_json(&format!(
            "/v1/buckets/v/diff/doc?a=master&b=dev&limit=1&after={next}"
        ))
        .await;
    assert_eq!(st, 200, "{d}");
    assert_eq!(
        (&d["changes"], &d["next"]),
        (
            &json!([{"key": "c", "left": "1", "right": null}]),
            &json!(null)
        )
    );
    for bad in ["limit=0", "limit=10001", "after=zz", "after=r0-0"] {
        let (st, e) = s
            .get_json(&format!("/v1/buckets/v/diff/doc?a=master&b=dev&{bad}"))
            .await;
        assert_eq!(st, 400, "{bad}: {e}");
    }
    let (_, d) = s
        .get_json(&format!("/v1/buckets/v/diff/doc?a={root}&b={root}"))
        .await;
    assert_eq!(d["same"], true);
    let (st, _) = s.get_json("/v1/buckets/v/diff/doc?a=master").await;
    assert_eq!(st, 400);
    let (st, l) = s.get_json("/v1/buckets/v/lca/doc?a=master&b=dev").await;
    assert_eq!(st, 200);
    assert_eq!(l["lca"], root.to_string());

    let (st, m) = s
        .get_json(&format!("/v1/buckets/v/meta/doc?uid={master}"))
        .await;
    assert_eq!(st, 200);
    assert_eq!(m["type"], "map");
    assert_eq!(m["size"], 3);
    assert_eq!(m["bases"], json!([root.to_string()]));

    // A conflicting merge: 409 with the conflict list, nothing written.
    let (st, e) = post("merge", json!({"into": "master", "from": "dev"})).await;
    assert_eq!((st, kind(&e)), (409, "conflict"), "{e}");
    assert_eq!(
        e["conflicts"],
        json!([{"at": {"kind": "map_key", "key": "a"}, "base": "1", "ours": "3", "theirs": "2"}])
    );
    let (_, br) = s.get_json("/v1/buckets/v/branches/doc").await;
    assert_eq!(br["tagged"]["master"], master.to_string());
    let (st, e) = post("merge", json!({"from": "dev", "resolver": "bogus"})).await;
    assert_eq!(st, 400, "{e}");
    let (st, mg) = post("merge", json!({"from": "dev", "resolver": "theirs"})).await;
    assert_eq!(st, 200, "{mg}");
    assert_eq!(mg["outcome"], "merged");
    assert_eq!(
        s.get_json("/v1/buckets/v/objects/doc").await.1,
        json!({"a": "2", "b": "1", "c": "1"})
    );
    let (_, mg2) = post("merge", json!({"from": "dev"})).await;
    assert_eq!(mg2["outcome"], "up_to_date");
    let (_, ff) = post("merge", json!({"into": "dev", "from": "master"})).await;
    assert_eq!(ff["outcome"], "fast_forward");

    // Untagged heads: two writes on one base fork; a merge joins them.
    let (_, a) = s
        .send(
            Method::PUT,
            &format!("/v1/buckets/v/objects/doc?base={root}"),
            &[JSON],
            json!({"a": "1", "b": "1", "x": "1"}).to_string(),
        )
        .await;
    let (_, b) = s
        .send(
            Method::PUT,
            &format!("/v1/buckets/v/objects/doc?base={root}"),
            &[JSON],
            json!({"a": "1", "b": "1", "y": "1"}).to_string(),
        )
        .await;
    assert_eq!(a["base"], root.to_string());
    let (_, br) = s.get_json("/v1/buckets/v/branches/doc").await;
    assert_eq!(br["untagged"].as_array().unwrap().len(), 2);
    assert_eq!(br["next"], json!(null), "{br}");
    // A page at a time: tagged by name, then untagged; each page's `next` is the `after`
    // of the following one, and the pages put together are the whole listing, metas too.
    for limit in 1..=4 {
        let (mut tagged, mut untagged, mut metas) = (json!({}), Vec::new(), json!({}));
        let mut after: Option<String> = None;
        let mut pages = 0;
        loop {
            let q = match &after {
                None => format!("?limit={limit}"),
                Some(a) => format!("?limit={limit}&after={a}"),
            };
            let (st, page) = s.get_json(&format!("/v1/buckets/v/branches/doc{q}")).await;
            assert_eq!(st, 200, "{page}");
            pages += 1;
            let n = page["tagged"].as_object().unwrap().len()
                + page["untagged"].as_array().unwrap().len();
            assert!(n <= limit, "{page}");
            for (k, v) in page["tagged"].as_object().unwrap() {
                tagged[k] = v.clone();
            }
            untagged.extend(page["untagged"].as_array().unwrap().iter().cloned());
            for (k, v) in page["metas"].as_object().unwrap() {
                metas[k] = v.clone();
            }
            match page["next"].as_str() {
                Some(n) => after = Some(n.to_string()),
                None => break,
            }
        }
        assert_eq!(pages, 4usize.div_ceil(limit), "limit {limit}");
        assert_eq!(tagged, br["tagged"], "limit {limit}");
        assert_eq!(json!(untagged), br["untagged"], "limit {limit}");
        assert_eq!(metas, br["metas"], "limit {limit}");
    }
    for bad in [
        "?limit=0",
        "?limit=10001",
        "?after=nowhere",
        "?after=untagged:zz",
    ] {
        let (st, e) = s
            .get_json(&format!("/v1/buckets/v/branches/doc{bad}"))
            .await;
        assert_eq!((st, kind(&e)), (400, "invalid_input"), "{bad}: {e}");
    }
    let (st, e) = post("merge", json!({"untagged": true, "from": "dev"})).await;
    assert_eq!(st, 400, "{e}");
    let (st, mu) = post(
        "merge",
        json!({"untagged": true, "uids": [a["uid"], b["uid"]]}),
    )
    .await;
    assert_eq!(st, 200, "{mu}");
    let (_, br) = s.get_json("/v1/buckets/v/branches/doc").await;
    assert_eq!(br["untagged"], json!([mu["uid"]]));
    let merged = s
        .get_json(&format!(
            "/v1/buckets/v/objects/doc?uid={}",
            mu["uid"].as_str().unwrap()
        ))
        .await
        .1;
    assert_eq!(merged, json!({"a": "1", "b": "1", "x": "1", "y": "1"}));

    // Rename and remove.
    let (st, r) = post("rename", json!({"from": "dev", "to": "feature"})).await;
    assert_eq!(st, 200, "{r}");
    let (st, e) = post("rename", json!({"from": "dev", "to": "x"})).await;
    assert_eq!((st, kind(&e)), (404, "not_found"), "{e}");
    let (st, e) = post("rename", json!({"from": "feature", "to": "master"})).await;
    assert_eq!((st, kind(&e)), (409, "already_exists"), "{e}");
    let (st, rm) = s
        .send(
            Method::DELETE,
            "/v1/buckets/v/objects/doc?branch=feature",
            &[],
            "",
        )
        .await;
    assert_eq!(st, 200, "{rm}");
    let (st, _) = s
        .send(
            Method::DELETE,
            "/v1/buckets/v/objects/doc?branch=feature",
            &[],
            "",
        )
        .await;
    assert_eq!(st, 404);
    let (_, br) = s.get_json("/v1/buckets/v/branches/doc").await;
    assert_eq!(br["tagged"].as_object().unwrap().len(), 1);

    // Key listing pages.
    for k in ["k1", "k2", "k3"] {
        s.send(Method::PUT, &format!("/v1/buckets/v/objects/{k}"), &[], "x")
            .await;
    }
    let (_, p1) = s.get_json("/v1/buckets/v/keys?limit=2").await;
    assert_eq!(p1["keys"], json!(["doc", "k1"]));
    assert_eq!(p1["next"], "k1");
    let (_, p2) = s.get_json("/v1/buckets/v/keys?limit=2&after=k1").await;
    assert_eq!(p2["keys"], json!(["k2", "k3"]));
    assert!(p2["next"].is_null());
    let (st, _) = s.get_json("/v1/buckets/v/keys?limit=0").await;
    assert_eq!(st, 400);
    // Long keys: a page holds at most 4 MiB of them, and goes on from its last one.
    let bucket = s.node.bucket("v").unwrap();
    let long = |i: usize| format!("z{i:04}{}", "x".repeat(4000));
    for i in 0..1100 {
        bucket
            .put(
                long(i).as_bytes(),
                cairn_object::Target::Branch("master"),
                cairn_object::NewValue::String("v".into()),
                &cairn_object::PutOptions::default(),
            )
            .unwrap();
    }
    let mut after = "k3".to_string();
    let mut got = Vec::new();
    loop {
        let (st, p) = s
            .get_json(&format!("/v1/buckets/v/keys?limit=10000&after={after}"))
            .await;
        assert_eq!(st, 200);
        let page: Vec<String> = p["keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k.as_str().unwrap().to_string())
            .collect();
        assert!(
            page.len() * 4005 <= (4 << 20) + 4005,
            "{} long keys",
            page.len()
        );
        got.extend(page);
        match p["next"].as_str() {
            Some(n) => after = n.to_string(),
            None => break,
        }
    }
    assert_eq!(got, (0..1100).map(long).collect::<Vec<_>>());
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proofs_verify_against_the_bucket_metadata() {
    let s = Server::start(1 << 20).await;
    let info = s.open_bucket("p").await;
    let (_, w1) = s
        .send(Method::PUT, "/v1/buckets/p/objects/nft/1.png", &[], "v1")
        .await;
    let (_, w2) = s
        .send(Method::PUT, "/v1/buckets/p/objects/nft/1.png", &[], "v2")
        .await;
    let (u1, u2) = (uid_of(&w1), uid_of(&w2));
    // The reader's trust: metadata that hashes to the capsule name it was told.
    let capsule = info["capsule"].as_str().unwrap();
    let meta_bytes = s.get("/v1/buckets/p/metadata").await.bytes().await.unwrap();
    let meta = CapsuleMetadata::decode(&meta_bytes).unwrap();
    assert_eq!(meta.name().to_string(), capsule);

    for (q, uid) in [(format!("?uid={u1}"), u1), (String::new(), u2)] {
        let r = s.get(&format!("/v1/buckets/p/proof/nft/1.png{q}")).await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["content-type"], "application/octet-stream");
        assert_eq!(r.headers()["x-cairn-capsule"].to_str().unwrap(), capsule);
        let bytes = r.bytes().await.unwrap();
        let vp = VersionProof::from_bytes(&bytes).unwrap();
        let (m, chain) = vp.verify(&meta, b"nft/1.png", &uid).unwrap();
        assert_eq!(m.uid, uid);
        assert!(!chain.is_empty());
        // Not a proof of another version or key.
        let other = if uid == u1 { u2 } else { u1 };
        assert!(vp.verify(&meta, b"nft/1.png", &other).is_err());
        assert!(vp.verify(&meta, b"nft/2.png", &uid).is_err());
        // A flipped byte anywhere fails (decoding or verification).
        for i in (0..bytes.len()).step_by(7) {
            let mut bad = bytes.to_vec();
            bad[i] ^= 1;
            let ok = VersionProof::from_bytes(&bad)
                .ok()
                .is_some_and(|p| p.verify(&meta, b"nft/1.png", &uid).is_ok());
            assert!(!ok, "flipping byte {i} still verifies");
        }
        // The JSON view carries the same proof and its chain.
        let (st, j) = s
            .get_json(&format!("/v1/buckets/p/proof/nft/1.png{q}"))
            .await;
        assert_eq!(st, 200);
        assert_eq!(j["proof"].as_str().unwrap(), hex::encode(&bytes));
        assert_eq!(j["uid"], uid.to_string());
        assert_eq!(j["mutation"]["kind"], "put");
        assert_eq!(j["mutation"]["branch"], "master");
        assert_eq!(j["chain"].as_array().unwrap().len(), chain.len());
        assert_eq!(j["anchor"]["kind"], "signed");
        assert_eq!(j["anchor"]["key"], s.node.public_key().to_string());
    }
    let (st, e) = s.get_json("/v1/buckets/p/proof/nft/none.png").await;
    assert_eq!((st, kind(&e)), (404, "not_found"), "{e}");
    let (st, _) = s.get_json("/v1/buckets/p/proof/nft/1.png?uid=zz").await;
    assert_eq!(st, 400);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_keys_gate_mutations() {
    let s = Server::start(1 << 20).await;
    let owner = SigningKey::from_seed(&[11; 32]);
    let other = SigningKey::from_seed(&[12; 32]);
    let create = json!({ "name": "mine", "owner": owner.public().to_string() }).to_string();
    // Creating a bucket with an owner key needs that key's signature.
    let (st, e) = s
        .send(Method::POST, "/v1/buckets", &[JSON], create.clone())
        .await;
    assert_eq!((st, kind(&e)), (401, "unauthorized"), "{e}");
    let (st, e) = s
        .send_now(
            &other,
            Method::POST,
            "/v1/buckets",
            &[JSON],
            create.as_bytes(),
        )
        .await;
    assert_eq!(st, 401, "{e}");
    let (st, info) = s
        .send_now(
            &owner,
            Method::POST,
            "/v1/buckets",
            &[JSON],
            create.as_bytes(),
        )
        .await;
    assert_eq!(st, 201, "{info}");
    assert_eq!(info["owner"], owner.public().to_string());
    assert_eq!(info["open"], false);
    // The owner key is bound into the capsule: the metadata that hashes to the capsule name
    // names it.
    let meta =
        CapsuleMetadata::decode(&hex::decode(info["metadata"].as_str().unwrap()).unwrap()).unwrap();
    assert_eq!(meta.name().to_string(), info["capsule"].as_str().unwrap());
    assert_eq!(
        meta.settings["cairn.native.owner"],
        owner.public().to_string()
    );

    let path = "/v1/buckets/mine/objects/k";
    let now = now_secs();
    let body = b"signed bytes";
    // Every failure is 401 and writes nothing.
    let (st, _) = s.send(Method::PUT, path, &[], body.to_vec()).await;
    assert_eq!(st, 401, "unsigned");
    let (st, _) = s
        .send_signed(&other, now, Method::PUT, path, &[], body, body)
        .await;
    assert_eq!(st, 401, "wrong key");
    let (st, e) = s
        .send_signed(&owner, now - 3600, Method::PUT, path, &[], body, body)
        .await;
    assert_eq!(st, 401, "stale date: {e}");
    let (st, _) = s
        .send_signed(&owner, now + 3600, Method::PUT, path, &[], body, body)
        .await;
    assert_eq!(st, 401, "future date");
    let (st, e) = s
        .send_signed(&owner, now, Method::PUT, path, &[], body, b"other bytes")
        .await;
    assert_eq!(st, 401, "body hash mismatch: {e}");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("BLAKE3"),
        "{e}"
    );
    // Headers signed for another path (or method) do not authorize this one.
    let for_j = cairn_node::native::auth::RequestToSign {
        method: "PUT",
        path_and_query: "/v1/buckets/mine/objects/j",
        unix_secs: now,
        body_blake3: cairn_node::native::auth::body_blake3(body),
        content_type: b"",
        if_match: b"",
        context: b"",
        nonce: b"",
        capsule: b"",
    };
    let [(an, av), (dn, dv), (hn, hv)]: [_; 3] = for_j.sign(&owner).try_into().unwrap();
    let hdrs = [(an, av.as_str()), (dn, dv.as_str()), (hn, hv.as_str())];
    let (st, _) = s.send(Method::PUT, path, &hdrs, body.to_vec()).await;
    assert_eq!(st, 401, "signed for another path");
    let (st, _) = s
        .send(
            Method::DELETE,
            "/v1/buckets/mine/objects/j",
            &hdrs,
            body.to_vec(),
        )
        .await;
    assert_eq!(st, 401, "signed for another method");
    // A bad signature: valid headers with one flipped bit.
    let req = cairn_node::native::auth::RequestToSign {
        method: "PUT",
        path_and_query: path,
        unix_secs: now,
        body_blake3: cairn_node::native::auth::body_blake3(body),
        content_type: b"",
        if_match: b"",
        context: b"",
        nonce: b"",
        capsule: b"",
    };
    let [(_, auth), (dn, dv), (hn, hv)]: [_; 3] = req.sign(&owner).try_into().unwrap();
    let mut sig = hex::decode(auth.strip_prefix("Cairn-Ed25519 ").unwrap()).unwrap();
    sig[5] ^= 0x10;
    let bad_auth = format!("Cairn-Ed25519 {}", hex::encode(&sig));
    let (st, e) = s
        .send(
            Method::PUT,
            path,
            &[("authorization", &bad_auth), (dn, &dv), (hn, &hv)],
            body.to_vec(),
        )
        .await;
    assert_eq!((st, kind(&e)), (401, "unauthorized"), "{e}");
    for malformed in ["Cairn-Ed25519 zz", "Bearer x", "Cairn-Ed25519"] {
        let (st, _) = s
            .send(
                Method::PUT,
                path,
                &[("authorization", malformed), (dn, &dv), (hn, &hv)],
                body.to_vec(),
            )
            .await;
        assert_eq!(st, 401, "{malformed}");
    }
    // A signed Content-Type or context cannot be changed in flight.
    let req_ct = cairn_node::native::auth::RequestToSign {
        content_type: b"text/plain",
        unix_secs: now + 2,
        ..req.clone()
    };
    let [(an, av), (dn2, dv2), (hn2, hv2)]: [_; 3] = req_ct.sign(&owner).try_into().unwrap();
    let (st, _) = s
        .send(
            Method::PUT,
            path,
            &[
                (an, &av),
                (dn2, &dv2),
                (hn2, &hv2),
                ("content-type", "application/json"),
            ],
            body.to_vec(),
        )
        .await;
    assert_eq!(st, 401);
    let (st, _) = s.get_json(path).await;
    assert_eq!(st, 404, "a refused request wrote the key");

    // Correctly signed: accepted once; the same request replayed is refused.
    let [(an, av), (dn, dv), (hn, hv)]: [_; 3] = cairn_node::native::auth::RequestToSign {
        unix_secs: now + 3,
        ..req.clone()
    }
    .sign(&owner)
    .try_into()
    .unwrap();
    let hdrs = [(an, av.as_str()), (dn, dv.as_str()), (hn, hv.as_str())];
    let (st, w) = s.send(Method::PUT, path, &hdrs, body.to_vec()).await;
    assert_eq!(st, 201, "{w}");
    let (st, e) = s.send(Method::PUT, path, &hdrs, body.to_vec()).await;
    assert_eq!(st, 401, "{e}");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("replayed"),
        "{e}"
    );
    // Reads are open.
    let r = s.get(path).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.bytes().await.unwrap().as_ref(), body);
    // Control mutations, typed JSON writes and guards work signed and fail unsigned.
    let fork = json!({"branch": "dev"}).to_string();
    let (st, _) = s
        .send(
            Method::POST,
            "/v1/buckets/mine/fork/k",
            &[JSON],
            fork.clone(),
        )
        .await;
    assert_eq!(st, 401);
    let (st, f) = s
        .send_now(
            &owner,
            Method::POST,
            "/v1/buckets/mine/fork/k",
            &[JSON],
            fork.as_bytes(),
        )
        .await;
    assert_eq!(st, 201, "{f}");
    let guard = format!("\"{}\"", w["uid"].as_str().unwrap());
    let (st, w2) = s
        .send_now(
            &owner,
            Method::PUT,
            "/v1/buckets/mine/objects/k?branch=dev",
            &[("if-match", &guard), ("x-cairn-context", "note")],
            b"dev bytes",
        )
        .await;
    assert_eq!(st, 201, "{w2}");
    let (_, m) = s.get_json("/v1/buckets/mine/meta/k?branch=dev").await;
    assert_eq!(m["context"], "note");
    let (st, _) = s
        .send(
            Method::DELETE,
            "/v1/buckets/mine/objects/k?branch=dev",
            &[],
            "",
        )
        .await;
    assert_eq!(st, 401);
    let (st, _) = s
        .send_now(
            &owner,
            Method::DELETE,
            "/v1/buckets/mine/objects/k?branch=dev",
            &[],
            b"",
        )
        .await;
    assert_eq!(st, 200);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_document_is_served() {
    let s = Server::start(1 << 20).await;
    let (st, doc) = s.get_json("/openapi.json").await;
    assert_eq!(st, 200);
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().unwrap();
    for p in [
        "/v1/buckets",
        "/v1/buckets/{bucket}/objects/{key}",
        "/v1/buckets/{bucket}/proof/{key}",
        "/v1/buckets/{bucket}/merge/{key}",
    ] {
        assert!(paths.contains_key(p), "{p}");
    }
    assert!(doc["components"]["securitySchemes"]["CairnEd25519"].is_object());
    s.stop().await;
}

#[test]
fn a_restarted_node_keeps_each_buckets_leaf_size() {
    let dir = tempfile::tempdir().unwrap();
    let config = |leaf_size| cairn_node::Config {
        data_dir: dir.path().join("data"),
        leaf_size,
        durability: cairn_store::Durability::Buffered,
        ..cairn_node::Config::default()
    };
    let node = cairn_node::Node::open(config(16384)).unwrap();
    let native = node.create_bucket("native", None, &[]).unwrap();
    let sized = node.create_bucket("sized", Some(2048), &[]).unwrap();
    let gaia = node.bucket("gaia-00").unwrap();
    for (b, want) in [(&native, 16384), (&sized, 2048), (&gaia, 16384)] {
        assert_eq!(b.db().tree_config().leaf_target, want);
    }
    drop((native, sized, gaia, node));
    // Restarted with another default: existing buckets keep theirs, new ones take it.
    let node = cairn_node::Node::open(config(65536)).unwrap();
    for (name, want) in [
        ("native", 16384),
        ("sized", 2048),
        ("gaia-00", 16384),
        ("new", 65536),
    ] {
        let b = node.bucket(name).unwrap();
        assert_eq!(b.db().tree_config().leaf_target, want, "{name}");
        assert_eq!(
            b.metadata().unwrap().settings["cairn.leaf_size"],
            want.to_string(),
            "{name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_request_cannot_be_replayed_after_a_restart() {
    let s = Server::start(1 << 20).await;
    let owner = SigningKey::from_seed(&[21; 32]);
    let (st, e) = s.create_owned(&owner, "mine").await;
    assert_eq!(st, 201, "{e}");
    let path = "/v1/buckets/mine/objects/k";
    let now = now_secs();
    let (st, e) = s
        .send_signed(&owner, now, Method::PUT, path, &[], b"OLD", b"OLD")
        .await;
    assert_eq!(st, 201, "{e}");
    let (st, e) = s.send_now(&owner, Method::PUT, path, &[], b"NEW").await;
    assert_eq!(st, 201, "{e}");
    let s = s.restart().await;
    // The first request, captured and sent again after the restart, is refused.
    let (st, e) = s
        .send_signed(&owner, now, Method::PUT, path, &[], b"OLD", b"OLD")
        .await;
    assert_eq!((st, kind(&e)), (401, "unauthorized"), "{e}");
    assert!(e.to_string().contains("replayed"), "{e}");
    let r = s.get(path).await;
    assert_eq!(r.bytes().await.unwrap(), "NEW");
    // New requests still go through.
    let (st, e) = s.send_now(&owner, Method::PUT, path, &[], b"NEWER").await;
    assert_eq!(st, 201, "{e}");
    s.stop().await;
}

/// A node keeps at most `max_open_buckets` buckets open and their capsules loaded; closed
/// ones reopen on their next request with nothing lost: their values, their history and
/// proofs of every version, old and new.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_buckets_close_past_the_limit_and_reopen_intact() {
    let s = Server::start_with(|c| c.max_open_buckets = 2).await;
    let names: Vec<String> = (0..6).map(|i| format!("many-{i}")).collect();
    let mut capsules = Vec::new();
    for n in &names {
        capsules.push(
            s.open_bucket(n).await["capsule"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    let mut uids: Vec<Vec<Uid>> = vec![Vec::new(); names.len()];
    for round in 0..3 {
        for (i, n) in names.iter().enumerate() {
            let (st, w) = s
                .send(
                    Method::PUT,
                    &format!("/v1/buckets/{n}/objects/k"),
                    &[],
                    format!("{n} round {round}"),
                )
                .await;
            assert_eq!(st, 201, "{w}");
            uids[i].push(uid_of(&w));
            assert!(s.node.open_buckets() <= 2, "{}", s.node.open_buckets());
            assert!(s.node.capsules.loaded_capsules() <= 2);
        }
    }
    for (i, n) in names.iter().enumerate() {
        let r = s.get(&format!("/v1/buckets/{n}/objects/k")).await;
        assert_eq!(r.bytes().await.unwrap(), format!("{n} round 2"));
        let meta_bytes = s
            .get(&format!("/v1/buckets/{n}/metadata"))
            .await
            .bytes()
            .await
            .unwrap();
        let meta = CapsuleMetadata::decode(&meta_bytes).unwrap();
        assert_eq!(meta.name().to_string(), capsules[i]);
        for uid in &uids[i] {
            let r = s.get(&format!("/v1/buckets/{n}/proof/k?uid={uid}")).await;
            assert_eq!(r.status(), 200);
            let vp = VersionProof::from_bytes(&r.bytes().await.unwrap()).unwrap();
            assert_eq!(vp.verify(&meta, b"k", uid).unwrap().0.uid, *uid);
        }
    }
    // And after a restart, from the store alone.
    let s = s.restart().await;
    for (i, n) in names.iter().enumerate() {
        let (st, log) = s.get_json(&format!("/v1/buckets/{n}/log/k")).await;
        assert_eq!(st, 200, "{log}");
        assert_eq!(log.to_string().matches("\"uid\"").count(), 3, "{log}");
        let last = uids[i][2];
        assert_eq!(
            s.get(&format!("/v1/buckets/{n}/proof/k?uid={last}"))
                .await
                .status(),
            200
        );
    }
    s.stop().await;
}

/// `GET .../stream/{key}`: the verified stream of a version, checked here as a client
/// would; `?meta=true` sends the Meta chunk alone; bad queries and unknown keys are clear
/// errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_stream_verified() {
    use cairn_object::stream::{FrameReader, Verified, VersionCheck};
    let s = Server::start(64 << 20).await;
    s.open_bucket("v").await;
    let body: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let (code, put) = s
        .send(Method::PUT, "/v1/buckets/v/objects/big", &[], body.clone())
        .await;
    assert_eq!(code, 201, "{put}");
    let uid = uid_of(&put);
    let read = |q: &'static str| {
        let s = &s;
        async move {
            let r = s.get(&format!("/v1/buckets/v/stream/big{q}")).await;
            assert_eq!(r.status(), 200);
            assert_eq!(
                r.headers()["content-type"],
                "application/vnd.cairn.version-stream"
            );
            let etag = r.headers()["etag"].to_str().unwrap().to_string();
            (etag, r.bytes().await.unwrap().to_vec())
        }
    };
    for q in ["", "?branch=master"] {
        let (etag, wire) = read(q).await;
        assert_eq!(etag, format!("\"{uid}\""));
        let mut frames = FrameReader::new(&wire[..]);
        let mut check = VersionCheck::new(uid);
        let mut got = Vec::new();
        let mut chunks = 0;
        while let Some(c) = frames.next_chunk().unwrap() {
            chunks += 1;
            if let Verified::Bytes(b) = check.accept(c).unwrap() {
                got.extend_from_slice(&b);
            }
        }
        assert!(check.is_complete().unwrap());
        assert!(chunks > 3, "the Meta chunk and a tree of several nodes");
        assert!(got == body, "the content, verified");
    }
    let (_, wire) = read("?meta=true").await;
    let mut frames = FrameReader::new(&wire[..]);
    let first = frames.next_chunk().unwrap().unwrap();
    assert!(
        frames.next_chunk().unwrap().is_none(),
        "the Meta chunk alone"
    );
    assert!(matches!(
        VersionCheck::new(uid).accept(first).unwrap(),
        Verified::Object(_)
    ));
    let (code, v) = s
        .get_json(&format!("/v1/buckets/v/stream/big?uid={uid}&branch=master"))
        .await;
    assert_eq!((code, kind(&v)), (400, "invalid_input"), "{v}");
    let (code, v) = s.get_json("/v1/buckets/v/stream/big?bogus=1").await;
    assert_eq!(code, 400, "{v}");
    let (code, v) = s.get_json("/v1/buckets/v/stream/nope").await;
    assert_eq!((code, kind(&v)), (404, "not_found"), "{v}");
}

/// Values up to 16 KiB are answered from memory and larger ones stream: the answers are
/// the same either side of the boundary (bytes, length, ETag, type, ranges accepted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_and_streamed_reads_answer_alike() {
    let s = Server::start(1 << 20).await;
    s.open_bucket("r").await;
    let mut served = 0u64;
    for n in [0usize, 1, 16 << 10, (16 << 10) + 1, 100_000] {
        let body: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
        for (ty, key) in [("blob", format!("b{n}")), ("string", format!("s{n}"))] {
            let path = format!("/v1/buckets/r/objects/{key}");
            let (code, put) = s
                .send(Method::PUT, &format!("{path}?type={ty}"), &[], body.clone())
                .await;
            assert_eq!(code, 201, "{put}");
            let r = s.get(&path).await;
            assert_eq!(r.status(), 200);
            let h = r.headers().clone();
            assert_eq!(h["etag"], format!("\"{}\"", uid_of(&put)));
            assert_eq!(h["x-cairn-type"], ty);
            assert_eq!(h["content-type"], "application/octet-stream");
            assert_eq!(h["content-length"], n.to_string(), "{ty} of {n} bytes");
            if ty == "blob" {
                assert_eq!(h["accept-ranges"], "bytes");
            }
            assert!(r.bytes().await.unwrap() == body, "{ty} of {n} bytes");
            served += n as u64;
        }
    }
    // Bytes served from memory count in the metrics as streamed ones do. A streamed answer
    // is counted once its producer finishes, which can be just after the client has read
    // the last byte: wait for it, briefly.
    let mut read = 0;
    for _ in 0..100 {
        let m = s.get("/metrics").await.text().await.unwrap();
        read = m
            .lines()
            .find(|l| l.starts_with("cairn_bytes_read_total") && l.contains("api=\"native\""))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
        if read >= served {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(read >= served, "{read} bytes counted, {served} served");
    // A conditional GET of the current version answers 304 with no body.
    let (_, put) = s
        .send(Method::PUT, "/v1/buckets/r/objects/c?type=string", &[], "x")
        .await;
    let r = s
        .req(Method::GET, "/v1/buckets/r/objects/c")
        .header("if-none-match", format!("\"{}\"", uid_of(&put)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 304);
    assert!(r.bytes().await.unwrap().is_empty());
}

/// A small blob put whole (its length known) and the same bytes streamed (chunked) make
/// the same version: the two write paths build the same POS-tree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_blob_puts_whole_or_streamed_give_one_tree() {
    let s = Server::start(1 << 20).await;
    s.open_bucket("w").await;
    let body: Vec<u8> = (0..12_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 9) as u8)
        .collect();
    let (code, whole) = s
        .send(Method::PUT, "/v1/buckets/w/objects/a", &[], body.clone())
        .await;
    assert_eq!(code, 201, "{whole}");
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        body.chunks(1000).map(|c| Ok(c.to_vec())).collect();
    let resp = s
        .req(Method::PUT, "/v1/buckets/w/objects/b")
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let streamed: serde_json::Value = resp.json().await.unwrap();
    let root = |key: &str| {
        let s = &s;
        let key = key.to_string();
        async move { s.get_json(&format!("/v1/buckets/w/meta/{key}")).await.1["root"].clone() }
    };
    assert_eq!(root("a").await, root("b").await);
    assert_ne!(
        uid_of(&whole),
        uid_of(&streamed),
        "different keys, different uids"
    );
}

/// Buckets share one chunk store, but a uid names a version only in the bucket that made
/// it: another bucket's versions, such as a Gaia file's overwritten content, are not found
/// through any other bucket (read, meta, log, base, fork, merge, diff), so they can be
/// neither read nor brought in and kept from GC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_uid_names_a_version_only_in_its_own_bucket() {
    let s = Server::start(1 << 20).await;
    // A Gaia file, since overwritten: its first version is history only its bucket keeps.
    let node = s.node.clone();
    let old = tokio::task::spawn_blocking(move || {
        let b = node.bucket("gaia-x").unwrap();
        let put = |v: &[u8]| {
            b.put(
                b"k",
                cairn_object::Target::Branch("master"),
                cairn_object::NewValue::String(v.to_vec()),
                &Default::default(),
            )
            .unwrap()
        };
        let old = put(b"private phone number");
        put(b"nothing to see");
        old
    })
    .await
    .unwrap();
    s.open_bucket("mine").await;
    let (st, v) = s
        .send(Method::PUT, "/v1/buckets/mine/objects/k", &[], "mine")
        .await;
    assert_eq!(st, 201, "{v}");
    let own = uid_of(&v);
    // Another key's version of the same bucket is not a version of this key either: 404
    // (it was a 400, as if the request were malformed).
    let (st, v) = s
        .send(Method::PUT, "/v1/buckets/mine/objects/other", &[], "other")
        .await;
    assert_eq!(st, 201, "{v}");
    let other = uid_of(&v);
    for path in [
        format!("/v1/buckets/mine/objects/k?uid={other}"),
        format!("/v1/buckets/mine/meta/k?uid={other}"),
        format!("/v1/buckets/mine/log/k?uid={other}"),
        format!("/v1/buckets/mine/stream/k?uid={other}"),
        format!("/v1/buckets/mine/diff/k?a={own}&b={other}"),
        format!("/v1/buckets/mine/lca/k?a={own}&b={other}"),
    ] {
        let (st, e) = s.get_json(&path).await;
        assert_eq!((st, kind(&e)), (404, "not_found"), "{path}: {e}");
    }
    for path in [
        format!("/v1/buckets/mine/objects/k?uid={old}"),
        format!("/v1/buckets/mine/meta/k?uid={old}"),
        format!("/v1/buckets/mine/log/k?uid={old}"),
        format!("/v1/buckets/mine/stream/k?uid={old}"),
        format!("/v1/buckets/mine/diff/k?a={own}&b={old}"),
        format!("/v1/buckets/mine/lca/k?a={own}&b={old}"),
    ] {
        let (st, e) = s.get_json(&path).await;
        assert_eq!((st, kind(&e)), (404, "not_found"), "{path}: {e}");
    }
    let (st, e) = s
        .send(
            Method::PUT,
            &format!("/v1/buckets/mine/objects/k?base={old}"),
            &[],
            "x",
        )
        .await;
    assert_eq!((st, kind(&e)), (404, "not_found"), "{e}");
    let body = json!({ "from": old.to_string(), "branch": "stolen" }).to_string();
    let (st, e) = s
        .send(Method::POST, "/v1/buckets/mine/fork/k", &[JSON], body)
        .await;
    assert_eq!((st, kind(&e)), (404, "not_found"), "{e}");
    let body = json!({ "into": "master", "from": old.to_string() }).to_string();
    let (st, e) = s
        .send(Method::POST, "/v1/buckets/mine/merge/k", &[JSON], body)
        .await;
    assert_eq!((st, kind(&e)), (404, "not_found"), "{e}");
    // Its own versions still answer by uid, and nothing above changed the bucket.
    let (st, v) = s
        .get_json(&format!("/v1/buckets/mine/meta/k?uid={own}"))
        .await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = s.get_json("/v1/buckets/mine/branches/k").await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["tagged"].as_object().map(|t| t.len()), Some(1), "{v}");
    s.stop().await;
}

/// Concurrent creates of one bucket name by different owners: exactly one is created, the
/// others are refused with 409, and the bucket's registry entry names the owner its
/// capsule was created with. Buckets now open outside the lock every request takes, each
/// behind its own gate, so this race must still have one winner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_of_one_bucket_have_one_winner() {
    let s = std::sync::Arc::new(Server::start(1 << 20).await);
    let owners: Vec<SigningKey> = (0..8u8)
        .map(|i| SigningKey::from_seed(&[40 + i; 32]))
        .collect();
    let tries: Vec<_> = owners
        .iter()
        .cloned()
        .map(|o| {
            let s = s.clone();
            tokio::spawn(async move { (o.public(), s.create_owned(&o, "contested").await) })
        })
        .collect();
    let mut winners = Vec::new();
    for t in tries {
        let (owner, (st, v)) = t.await.unwrap();
        match st {
            201 => winners.push(owner),
            409 => assert_eq!(kind(&v), "already_exists", "{v}"),
            other => panic!("create answered {other}: {v}"),
        }
    }
    assert_eq!(winners.len(), 1, "{winners:?}");
    let (st, info) = s.get_json("/v1/buckets/contested").await;
    assert_eq!(st, 200, "{info}");
    assert_eq!(info["owner"], winners[0].to_string(), "{info}");
    assert_eq!(
        info["settings"]["cairn.native.owner"],
        winners[0].to_string(),
        "{info}"
    );
    // The race's narrow end, made directly: a create that finds the bucket open already
    // (another create got there first) is refused, and the first one's bucket stays the
    // one open copy.
    let node = s.node.clone();
    tokio::task::spawn_blocking(move || {
        let first = node
            .create_bucket("raced", None, &[("cairn.native.owner", "open".into())])
            .unwrap();
        for owner in ["open", "other"] {
            let e = node
                .create_bucket("raced", None, &[("cairn.native.owner", owner.into())])
                .err()
                .expect("a second create of an open bucket");
            assert!(matches!(e, cairn_core::Error::AlreadyExists(_)), "{e}");
        }
        assert!(std::sync::Arc::ptr_eq(
            &first,
            &node.bucket("raced").unwrap()
        ));
    })
    .await
    .unwrap();
    std::sync::Arc::into_inner(s).unwrap().stop().await;
}

/// A web page cannot change an open bucket on a local node: a cross-site `text/plain`
/// POST (which a browser sends without asking first) is refused with 415 before it does
/// anything, and a request naming another host (a page whose domain was made to resolve
/// to 127.0.0.1: DNS rebinding) is refused with 403, reads included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_site_requests_change_nothing() {
    let s = Server::start(1 << 20).await;
    s.open_bucket("notes").await;
    let (st, _) = s
        .send(Method::PUT, "/v1/buckets/notes/objects/todo", &[], "milk")
        .await;
    assert_eq!(st, 201);
    // What a browser sends across sites without asking first: refused whatever it says.
    // Without an Origin (a page cannot leave it out), plain text is still not JSON.
    let body = r#"{"from":"master","to":"gone","branch":"gone","a":"master","b":"master"}"#;
    for ct in ["text/plain;charset=UTF-8", "text/plain;,application/json"] {
        for origin in [Some("https://evil.example"), Some("null"), None] {
            let post = |path: &str, body: &str| {
                let r = s
                    .req(Method::POST, path)
                    .header("content-type", ct)
                    .body(body.to_string());
                match origin {
                    Some(o) => r.header("origin", o),
                    None => r,
                }
            };
            let want = if origin.is_some() { 403 } else { 415 };
            let r = post("/v1/buckets", r#"{"name":"evil"}"#)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status().as_u16(), want, "{ct} {origin:?}");
            for op in ["rename", "fork", "merge"] {
                let r = post(&format!("/v1/buckets/notes/{op}/todo"), body)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status().as_u16(), want, "{op} {ct} {origin:?}");
            }
        }
    }
    // Another origin is refused on every native write, JSON or not.
    let r = s
        .req(Method::PUT, "/v1/buckets/notes/objects/todo")
        .header("origin", "http://evil.example")
        .body("eggs")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    // The node's own origin may write.
    let r = s
        .req(Method::POST, "/v1/buckets")
        .header("content-type", "application/json")
        .header("origin", s.base.clone())
        .body(r#"{"name":"own"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    assert_eq!(s.get("/v1/buckets/evil").await.status().as_u16(), 404);
    let r = s.get("/v1/buckets/notes/objects/todo").await;
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.bytes().await.unwrap().as_ref(), b"milk");
    let (_, branches) = s.get_json("/v1/buckets/notes/branches/todo").await;
    assert!(!branches.to_string().contains("gone"), "{branches}");
    // Another host name: refused, whatever the route.
    for path in ["/v1/buckets/notes/objects/todo", "/v1/buckets", "/healthz"] {
        let r = s
            .req(Method::GET, path)
            .header("host", "rebound.evil.example:3000")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 403, "{path}");
    }
    let r = s
        .req(Method::PUT, "/v1/buckets/notes/objects/todo")
        .header("host", "rebound.evil.example")
        .body("eggs")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    // Loopback names are served.
    for host in [
        "localhost:1",
        "app.localhost",
        "127.0.0.1:3000",
        "[::1]:3000",
    ] {
        let r = s
            .req(Method::GET, "/v1/buckets/notes/objects/todo")
            .header("host", host)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "{host}");
        assert_eq!(r.bytes().await.unwrap().as_ref(), b"milk");
    }
}

/// Concurrent creates of one free name: one creates the bucket, the others are refused
/// before their signatures are checked, so they take no place in the replay table (each
/// took one, so the table's owner keys filled at a few hundred buckets' cost).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_creates_of_one_name_take_one_replay_owner() {
    use cairn_node::native::auth::REPLAY_REFS;
    let s = std::sync::Arc::new(Server::start(1 << 20).await);
    let mut tasks = Vec::new();
    for i in 0..32u8 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let mut seed = [0xABu8; 32];
            seed[0] = i;
            s.create_owned(&SigningKey::from_seed(&seed), "contested")
                .await
                .0
        }));
    }
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    assert_eq!(statuses.iter().filter(|&&x| x == 201).count(), 1);
    assert_eq!(statuses.iter().filter(|&&x| x == 409).count(), 31);
    let owners: std::collections::HashSet<Vec<u8>> = s
        .node
        .store
        .list_refs(REPLAY_REFS)
        .unwrap()
        .iter()
        .map(|(n, _)| n[REPLAY_REFS.len()..REPLAY_REFS.len() + 32].to_vec())
        .collect();
    assert_eq!(owners.len(), 1, "one owner key remembered");
    // A name holding data written outside the native API is refused before the
    // signature is checked too.
    s.node.bucket("elsewhere").unwrap();
    for i in 0..4u8 {
        let (st, v) = s
            .create_owned(&SigningKey::from_seed(&[i; 32]), "elsewhere")
            .await;
        assert_eq!(st, 409, "{v}");
    }
    let refs = s.node.store.list_refs(REPLAY_REFS).unwrap();
    assert_eq!(refs.len(), 1, "no signature of a refused create remembered");
}

/// Answers built in memory stay bounded whatever the values: a merge's 409 lists
/// conflicts up to about 1 MiB, each side cut to its first 4 KiB, and counts them all; a map diff page
/// ends once it holds 8 MiB of keys and values, with a cursor that goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflict_lists_and_diff_pages_stay_bounded() {
    let s = Server::start(64 << 20).await;
    s.open_bucket("v").await;
    let big = |c: char| c.to_string().repeat(2 << 20);
    let map = |c: char| {
        let m: serde_json::Map<String, serde_json::Value> =
            (0..6).map(|i| (format!("k{i}"), json!(big(c)))).collect();
        serde_json::Value::Object(m)
    };
    let send = |m: Method, path: String, body: String| {
        let s = &s;
        async move { s.send(m, &path, &[JSON], body).await }
    };
    let (st, w) = send(
        Method::PUT,
        "/v1/buckets/v/objects/doc".into(),
        map('a').to_string(),
    )
    .await;
    assert_eq!(st, 201, "{w}");
    let (st, _) = send(
        Method::POST,
        "/v1/buckets/v/fork/doc".into(),
        json!({"branch": "dev"}).to_string(),
    )
    .await;
    assert_eq!(st, 201);
    let (st, _) = send(
        Method::PUT,
        "/v1/buckets/v/objects/doc?branch=dev".into(),
        map('b').to_string(),
    )
    .await;
    assert_eq!(st, 201);
    let (st, _) = send(
        Method::PUT,
        "/v1/buckets/v/objects/doc".into(),
        map('c').to_string(),
    )
    .await;
    assert_eq!(st, 201);
    // Six conflicts of 6 MiB each (three sides of 2 MiB): each side is cut to its first
    // CONFLICT_SIDE_BYTES (the answer held all three whole, for the first conflict at
    // least), with its full length, so all six fit.
    let resp = s
        .req(Method::POST, "/v1/buckets/v/merge/doc")
        .header(JSON.0, JSON.1)
        .body(json!({"from": "dev"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 409);
    let body = resp.bytes().await.unwrap();
    assert!(body.len() < 1 << 20, "a 409 of {} bytes", body.len());
    let e: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(kind(&e), "conflict", "{}", e["error"]);
    assert_eq!(e["conflicts_total"], 6);
    let cs = e["conflicts"].as_array().unwrap();
    assert_eq!(cs.len(), 6);
    let side = cairn_node::native::versions::CONFLICT_SIDE_BYTES;
    for c in cs {
        assert_eq!(c["truncated"], true, "{}", c["at"]);
        for name in ["base", "ours", "theirs"] {
            assert_eq!(c[format!("{name}_len")], 2 << 20);
            assert_eq!(c[name].as_str().unwrap().len(), side);
        }
    }
    // The diff of the two heads: six changes of 4 MiB, in pages of at most 8 MiB past the
    // first change, each page going on from the last.
    let mut after = String::new();
    let mut seen = 0;
    let mut pages = 0;
    loop {
        let (st, d) = s
            .get_json(&format!("/v1/buckets/v/diff/doc?a=master&b=dev{after}"))
            .await;
        assert_eq!(st, 200);
        let n = d["changes"].as_array().unwrap().len();
        assert!((1..=2).contains(&n), "{n} changes of 4 MiB in one page");
        seen += n;
        pages += 1;
        match d["next"].as_str() {
            Some(next) => after = format!("&after={next}"),
            None => break,
        }
    }
    assert_eq!((seen, pages), (6, 3));
}

/// An open bucket (no owner key) is created only for the clients `open_buckets` names: by
/// default those on the node's own machine. A refused create changes nothing; a bucket
/// with an owner key is created for anyone who signs with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_bucket_creation_follows_the_config() {
    use hyper::service::Service;
    let s = Server::start_with(|c| c.open_buckets = cairn_node::config::OpenBuckets::Off).await;
    let (st, e) = s
        .send(
            Method::POST,
            "/v1/buckets",
            &[JSON],
            json!({"name": "x"}).to_string(),
        )
        .await;
    assert_eq!(st, 403, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("owner key"),
        "{e}"
    );
    assert_eq!(s.get_json("/v1/buckets/x").await.0, 404);
    let owner = SigningKey::from_seed(&[21; 32]);
    assert_eq!(s.create_owned(&owner, "x").await.0, 201);

    // The default: loopback peers (every test client) may, others may not. A request
    // from another address goes through the router as the server hands it over, with the
    // peer address the accept loop sets.
    let s = Server::start(1 << 20).await;
    let service = hyper_util::service::TowerToHyperService::new(cairn_node::router(s.node.clone()));
    let create = |name: &str| {
        axum::http::Request::post("/v1/buckets")
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(axum::body::Body::from(json!({ "name": name }).to_string()))
            .unwrap()
    };
    let remote: std::net::IpAddr = "203.0.113.9".parse().unwrap();
    let resp = cairn_node::node::PEER
        .scope(remote, service.call(create("far")))
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
    assert_eq!(s.get_json("/v1/buckets/far").await.0, 404);
    let local: std::net::IpAddr = "::1".parse().unwrap();
    let resp = cairn_node::node::PEER
        .scope(local, service.call(create("near")))
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    assert_eq!(s.get_json("/v1/buckets/near").await.0, 200);
}

/// `GET /v1/buckets` answers a page at a time: `next` leads through every bucket once, in
/// name order, and a limit out of range is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bucket_listing_pages() {
    let s = Server::start(1 << 20).await;
    let mut names: Vec<String> = (0..5).map(|i| format!("b{i}")).collect();
    names.push("b1-x".into());
    for n in &names {
        s.open_bucket(n).await;
    }
    names.sort();
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..10 {
        let path = match &after {
            Some(a) => format!("/v1/buckets?limit=2&after={a}"),
            None => "/v1/buckets?limit=2".into(),
        };
        let (st, v) = s.get_json(&path).await;
        assert_eq!(st, 200, "{v}");
        let page = v["buckets"].as_array().unwrap();
        assert!(page.len() <= 2, "{v}");
        seen.extend(page.iter().map(|b| b["name"].as_str().unwrap().to_string()));
        match v["next"].as_str() {
            Some(n) => after = Some(n.to_string()),
            None => break,
        }
    }
    assert_eq!(seen, names);
    let (st, v) = s.get_json("/v1/buckets").await;
    assert_eq!(
        (st, v["buckets"].as_array().unwrap().len()),
        (200, 6),
        "{v}"
    );
    assert!(v["next"].is_null(), "{v}");
    for bad in ["limit=0", "limit=10001", "limit=x", "page=2"] {
        assert_eq!(
            s.get_json(&format!("/v1/buckets?{bad}")).await.0,
            400,
            "{bad}"
        );
    }
}

/// A read's `If-Match` is honoured (RFC 9110 §13.1.1): a client resuming a download with
/// `Range` and the ETag it started from gets 412 once the branch moved, not another
/// version's bytes to splice onto the first one's. Compared strongly; `*` matches any
/// version and fails where there is none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_honour_if_match() {
    let s = Server::start(1 << 20).await;
    s.open_bucket("m").await;
    let path = "/v1/buckets/m/objects/f";
    let put = |body: &'static str| {
        let s = &s;
        async move {
            let r = s.req(Method::PUT, path).body(body).send().await.unwrap();
            assert_eq!(r.status().as_u16(), 201);
            r.headers()["etag"].to_str().unwrap().to_string()
        }
    };
    let v1 = put("first version").await;
    let v2 = put("second version").await;
    let read = |method: Method, p: &'static str, h: Vec<(&'static str, String)>| {
        let s = &s;
        async move {
            let mut r = s.req(method, p);
            for (n, v) in h {
                r = r.header(n, v);
            }
            let r = r.send().await.unwrap();
            let st = r.status().as_u16();
            (st, r.text().await.unwrap())
        }
    };
    let (st, _) = read(Method::GET, path, vec![("if-match", v1.clone())]).await;
    assert_eq!(st, 412);
    let ranged = vec![("if-match", v1.clone()), ("range", "bytes=7-".to_string())];
    assert_eq!(read(Method::GET, path, ranged).await.0, 412);
    assert_eq!(
        read(Method::HEAD, path, vec![("if-match", v1.clone())])
            .await
            .0,
        412
    );
    assert_eq!(
        read(Method::GET, path, vec![("if-match", format!("W/{v2}"))])
            .await
            .0,
        412
    );
    let (st, body) = read(Method::GET, path, vec![("if-match", v2.clone())]).await;
    assert_eq!((st, body.as_str()), (200, "second version"));
    let either = vec![
        ("if-match", format!("{v1}, {v2}")),
        ("range", "bytes=7-".into()),
    ];
    let (st, body) = read(Method::GET, path, either).await;
    assert_eq!((st, body.as_str()), (206, "version"));
    assert_eq!(
        read(Method::GET, path, vec![("if-match", "*".into())])
            .await
            .0,
        200
    );
    // The version stream too.
    let stream = "/v1/buckets/m/stream/f";
    assert_eq!(
        read(Method::GET, stream, vec![("if-match", v1.clone())])
            .await
            .0,
        412
    );
    assert_eq!(
        read(Method::GET, stream, vec![("if-match", v2.clone())])
            .await
            .0,
        200
    );
    let missing = "/v1/buckets/m/objects/none";
    assert_eq!(
        read(Method::GET, missing, vec![("if-match", "*".into())])
            .await
            .0,
        412
    );
    assert_eq!(read(Method::GET, missing, vec![]).await.0, 404);
}

/// A put carrying its owner's seal (`X-Cairn-Owner-Seal`) is recorded with it and its
/// proof shows the owner sealed the content; a seal that is not the owner's seal of
/// exactly that put is refused (403; 400 when malformed or repeated) and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_seals_are_checked_and_kept_in_the_proof() {
    use cairn_capsule::{CapsuleName, OwnerSeal, SealedPut};
    use cairn_object::{FObject, Value};
    let s = Server::start(1 << 20).await;
    let owner = SigningKey::from_seed(&[41; 32]);
    let other = SigningKey::from_seed(&[42; 32]);
    let (st, info) = s.create_owned(&owner, "sealed").await;
    assert_eq!(st, 201, "{info}");
    let capsule: CapsuleName = info["capsule"].as_str().unwrap().parse().unwrap();
    let meta =
        CapsuleMetadata::decode(&hex::decode(info["metadata"].as_str().unwrap()).unwrap()).unwrap();
    let path = "/v1/buckets/sealed/objects/k?type=string";
    let seal_dated = |by: &SigningKey, text: &[u8], date: u64| {
        let digest = Value::String(text.to_vec().into()).digest(cairn_core::HashAlgo::Blake3);
        hex::encode(
            OwnerSeal::sign(
                by,
                &SealedPut {
                    capsule: &capsule,
                    key: b"k",
                    branch: Some("master"),
                    base: None,
                    value: &digest,
                    context: b"",
                },
                date,
                [8; 16],
            )
            .encode(),
        )
    };
    let seal = |by: &SigningKey, text: &[u8]| seal_dated(by, text, now_secs());
    let good = seal(&owner, b"hello");
    let (st, w) = s
        .send_now(
            &owner,
            Method::PUT,
            path,
            &[("x-cairn-owner-seal", &good)],
            b"hello",
        )
        .await;
    assert_eq!(st, 201, "{w}");
    let uid = uid_of(&w);
    // The proof carries the seal and the version to check it against; a reader checks it
    // from the bytes, trusting only the metadata.
    let r = s
        .get(&format!("/v1/buckets/sealed/proof/k?uid={uid}"))
        .await;
    let vp = VersionProof::from_bytes(&r.bytes().await.unwrap()).unwrap();
    let (m, _) = vp.verify(&meta, b"k", &uid).unwrap();
    let (by, got) = vp.owner_seal(&meta, &m, &uid).unwrap().expect("sealed");
    assert_eq!(
        (by, got.encode()),
        (owner.public(), hex::decode(&good).unwrap())
    );
    assert_eq!(
        FObject::from_chunk(vp.object.as_ref().unwrap())
            .unwrap()
            .value,
        Value::String(b"hello".to_vec().into())
    );
    let r = s
        .req(
            Method::GET,
            &format!("/v1/buckets/sealed/proof/k?uid={uid}"),
        )
        .header("accept", "application/json")
        .send()
        .await
        .unwrap();
    let view: serde_json::Value = r.json().await.unwrap();
    assert_eq!(
        view["owner_seal"]["owner"],
        owner.public().to_string(),
        "{view}"
    );

    // Refused seals write nothing: another key's, another value's, a malformed or a
    // repeated header. Each request is signed by the owner (the seal is checked after).
    let bad_key = seal(&other, b"evil");
    let other_value = seal(&owner, b"something else");
    let stale = seal_dated(&owner, b"evil 5", now_secs() - 3600);
    let cases: [(&[(&str, &str)], u16); 6] = [
        (&[("x-cairn-owner-seal", &stale)], 400),
        (&[("x-cairn-owner-seal", &bad_key)], 403),
        (&[("x-cairn-owner-seal", &other_value)], 403),
        (&[("x-cairn-owner-seal", "zz")], 400),
        (&[("x-cairn-owner-seal", "00ff")], 400),
        (
            &[("x-cairn-owner-seal", &good), ("x-cairn-owner-seal", &good)],
            400,
        ),
    ];
    for (i, (headers, want)) in cases.into_iter().enumerate() {
        // A body of its own each: the same signed request twice in a second is a replay.
        let body = format!("evil {i}");
        let (st, e) = s
            .send_now(&owner, Method::PUT, path, headers, body.as_bytes())
            .await;
        assert_eq!(st, want, "{headers:?}: {e}");
        let (st, v) = s.get_json("/v1/buckets/sealed/meta/k").await;
        assert_eq!(
            (st, v["uid"].as_str()),
            (200, Some(uid.to_string().as_str())),
            "{v}"
        );
    }
    // Only a PUT is sealed: a seal on a PATCH is refused, not dropped.
    let (st, e) = s
        .send_now(
            &owner,
            Method::PATCH,
            "/v1/buckets/sealed/objects/k",
            &[("x-cairn-owner-seal", &good), JSON],
            br#"{"append": "x"}"#,
        )
        .await;
    assert_eq!(st, 400, "{e}");
    // A seal on an open bucket is refused before its body is read.
    s.open_bucket("open").await;
    let (st, e) = s
        .send(
            Method::PUT,
            "/v1/buckets/open/objects/k?type=string",
            &[("x-cairn-owner-seal", &good)],
            "hello",
        )
        .await;
    assert_eq!((st, kind(&e)), (403, "rejected"), "{e}");
    let (st, _) = s.get_json("/v1/buckets/open/meta/k").await;
    assert_eq!(st, 404);
    // An unsealed put is still taken; its proof says it carries no seal.
    let (st, w) = s.send_now(&owner, Method::PUT, path, &[], b"plain").await;
    assert_eq!(st, 201, "{w}");
    let plain = uid_of(&w);
    let r = s
        .get(&format!("/v1/buckets/sealed/proof/k?uid={plain}"))
        .await;
    let vp = VersionProof::from_bytes(&r.bytes().await.unwrap()).unwrap();
    let (m, _) = vp.verify(&meta, b"k", &plain).unwrap();
    assert!(vp.owner_seal(&meta, &m, &plain).unwrap().is_none());
    s.stop().await;
}

//! Memory bounds of the native API over a real socket: requests that buffer a body and
//! answers built in memory hold a transfer (503 when `max_transfers` are in progress), an
//! inline value whose client reads nothing is cut at the stall timeout, a buffered body
//! with too many elements is refused before it is parsed, and a signed request refused for
//! want of a transfer can be sent again as it was.

mod native_support;

use std::time::{Duration, Instant};

use cairn_core::SigningKey;
use cairn_node::native::auth::{RequestToSign, body_blake3, now_secs};
use native_support::Server;
use reqwest::Method;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Sends `method path` with `headers` and `body`; returns the status, whether the answer
/// carries `Retry-After`, and its JSON body.
async fn send(
    s: &Server,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Vec<u8>>,
) -> (u16, bool, serde_json::Value) {
    let mut r = s.req(method, path).body(body.into());
    for (n, v) in headers {
        r = r.header(*n, *v);
    }
    let resp = r.send().await.unwrap();
    let status = resp.status().as_u16();
    let retry = resp.headers().contains_key("retry-after");
    (
        status,
        retry,
        resp.json().await.unwrap_or(serde_json::Value::Null),
    )
}

const JSON: (&str, &str) = ("content-type", "application/json");

/// Waits (up to 5 s) until no transfer is held: a GET's transfer is given back when its
/// producer ends, which can trail the last byte the client received.
async fn wait_for_idle_transfers(s: &Server) {
    for _ in 0..1000 {
        if s.node.write_permit().is_ok() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    panic!("a transfer is still held after 5 s");
}

/// Request headers, as name and value.
type Headers<'a> = Vec<(&'a str, &'a str)>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffered_bodies_and_answers_built_in_memory_wait_for_a_transfer() {
    let s = Server::start_with(|c| c.max_transfers = 1).await;
    s.open_bucket("b").await;
    let (st, _, v) = send(
        &s,
        Method::PUT,
        "/v1/buckets/b/objects/k?type=string",
        &[],
        "x",
    )
    .await;
    assert_eq!(st, 201, "{v}");
    // Inline values stream with their exact length (text forms).
    for (path, body, want) in [
        ("/v1/buckets/b/objects/i?type=integer", "-42", "-42\n"),
        (
            "/v1/buckets/b/objects/t?type=tuple",
            "a\n\nbc\n",
            "a\n\nbc\n",
        ),
    ] {
        wait_for_idle_transfers(&s).await;
        let (st, _, v) = send(&s, Method::PUT, path, &[], body).await;
        assert_eq!(st, 201, "{v}");
        let r = s.get(path.split('?').next().unwrap()).await;
        assert_eq!(r.headers()["content-length"], want.len().to_string());
        assert_eq!(r.bytes().await.unwrap(), want);
    }
    // Another transfer holds the only one.
    wait_for_idle_transfers(&s).await;
    let held = s.node.write_permit().unwrap();
    let refused: Vec<(Method, &str, Headers, &str)> = vec![
        (
            Method::PUT,
            "/v1/buckets/b/objects/s?type=set",
            vec![],
            "a\nb\n",
        ),
        (
            Method::PUT,
            "/v1/buckets/b/objects/j",
            vec![JSON],
            "[\"a\"]",
        ),
        (
            Method::PATCH,
            "/v1/buckets/b/objects/k",
            vec![JSON],
            r#"{"op":"append","value":"y"}"#,
        ),
        (Method::DELETE, "/v1/buckets/b/objects/k", vec![], ""),
        (
            Method::POST,
            "/v1/buckets/b/fork/k",
            vec![JSON],
            r#"{"branch":"f"}"#,
        ),
        (Method::POST, "/v1/buckets", vec![JSON], r#"{"name":"c"}"#),
        (Method::GET, "/v1/buckets/b/objects/k", vec![], ""),
        (Method::GET, "/v1/buckets/b/keys", vec![], ""),
        (Method::GET, "/v1/buckets/b/log/k", vec![], ""),
        (
            Method::GET,
            "/v1/buckets/b/lca/k?a=master&b=master",
            vec![],
            "",
        ),
    ];
    for (method, path, headers, body) in refused {
        let (st, retry, v) = send(&s, method.clone(), path, &headers, body).await;
        assert_eq!(st, 503, "{method} {path}: {v}");
        assert!(retry, "{method} {path}: no Retry-After");
    }
    // A HEAD, `meta` and `proof` load the version (an inline value is part of it): they
    // wait for a transfer too.
    for path in [
        "/v1/buckets/b/objects/k",
        "/v1/buckets/b/meta/k",
        "/v1/buckets/b/proof/k",
    ] {
        let method = if path.contains("/objects/") {
            Method::HEAD
        } else {
            Method::GET
        };
        let r = s.req(method.clone(), path).send().await.unwrap();
        assert_eq!(r.status(), 503, "{method} {path}");
    }
    drop(held);
    wait_for_idle_transfers(&s).await;
    let r = s
        .req(Method::HEAD, "/v1/buckets/b/objects/k")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-length"], "1");
    // Nothing was written while they were refused.
    let (st, v) = s.get_json("/v1/buckets/b/objects/s").await;
    assert_eq!(st, 404, "{v}");
    wait_for_idle_transfers(&s).await;
    let (st, v) = s.get_json("/v1/buckets/b/objects/j").await;
    assert_eq!(st, 404, "{v}");
    wait_for_idle_transfers(&s).await;
    let (st, v) = s.get_json("/v1/buckets/b/branches/k").await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["tagged"].as_object().unwrap().len(), 1, "{v}");
    wait_for_idle_transfers(&s).await;
    let r = s.get("/v1/buckets/b/objects/k").await;
    assert_eq!(r.headers()["content-length"], "1");
    assert_eq!(r.bytes().await.unwrap(), "x");
    let (st, v) = s.get_json("/v1/buckets/c").await;
    assert_eq!(st, 404, "{v}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inline_value_whose_client_reads_nothing_is_cut() {
    let s = Server::start_with(|c| {
        c.stall_timeout_secs = 0.5;
        c.max_transfers = 1;
    })
    .await;
    s.open_bucket("b").await;
    let len = 15 << 20;
    let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    let (st, _, v) = send(
        &s,
        Method::PUT,
        "/v1/buckets/b/objects/str?type=string",
        &[],
        data.clone(),
    )
    .await;
    assert_eq!(st, 201, "{v}");
    // A client with a small receive window asks for it and reads nothing.
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(64 << 10).unwrap();
    let addr = s.base.trim_start_matches("http://").parse().unwrap();
    let mut stalled = sock.connect(addr).await.unwrap();
    stalled
        .write_all(b"GET /v1/buckets/b/objects/str HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // It holds the one transfer...
    let r = s.get("/v1/buckets/b/objects/str").await;
    assert_eq!(r.status(), 503);
    // ...until the stall timeout cuts it; then the value reads back whole.
    let t0 = Instant::now();
    loop {
        let r = s.get("/v1/buckets/b/objects/str").await;
        if r.status() == 200 {
            assert_eq!(r.headers()["content-length"], len.to_string());
            assert!(
                r.bytes().await.unwrap() == data,
                "the value read back differs"
            );
            break;
        }
        assert_eq!(r.status(), 503);
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the stalled reader kept its transfer"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The stalled client got less than the value before the connection ended.
    let mut got = 0usize;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match tokio::time::timeout(Duration::from_secs(10), stalled.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => got += n,
            Err(_) => panic!("the cut connection stayed open"),
        }
    }
    assert!(got < len, "the stalled client got everything ({got} bytes)");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_with_too_many_elements_is_refused_before_it_is_parsed() {
    let s = Server::start_with(|_| {}).await;
    s.open_bucket("b").await;
    let max = cairn_node::native::body::MAX_BUFFERED_ELEMENTS;
    let mut json_list = String::from("[\"\"");
    for _ in 0..max {
        json_list.push_str(",\"\"");
    }
    json_list.push(']');
    let cases: Vec<(&str, Headers, Vec<u8>)> = vec![
        // 60 MiB of empty lines: one element per byte.
        (
            "/v1/buckets/b/objects/t?type=tuple",
            vec![],
            vec![b'\n'; 60 << 20],
        ),
        ("/v1/buckets/b/objects/s?type=set", vec![], vec![b'\n'; max]),
        (
            "/v1/buckets/b/objects/m?type=map",
            vec![],
            b"a=1\n".repeat(max),
        ),
        (
            "/v1/buckets/b/objects/l",
            vec![JSON],
            json_list.clone().into(),
        ),
    ];
    for (path, headers, body) in cases {
        let t0 = Instant::now();
        let (st, _, v) = send(&s, Method::PUT, path, &headers, body).await;
        assert_eq!(st, 400, "{path}: {v}");
        let msg = v["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains("too many elements"), "{path}: {v}");
        assert!(t0.elapsed() < Duration::from_secs(20), "{path}");
        let key_path = path.split('?').next().unwrap();
        let (st, v) = s.get_json(key_path).await;
        assert_eq!(st, 404, "{path}: {v}");
    }
    // The same bound holds for a PATCH and a control body.
    let (st, _, v) = send(
        &s,
        Method::PUT,
        "/v1/buckets/b/objects/set?type=set",
        &[],
        "a\n",
    )
    .await;
    assert_eq!(st, 201, "{v}");
    let patch = format!(r#"{{"op":"update","add":{json_list}}}"#);
    let (st, _, v) = send(
        &s,
        Method::PATCH,
        "/v1/buckets/b/objects/set",
        &[JSON],
        patch,
    )
    .await;
    assert_eq!(st, 400, "{v}");
    assert!(v.to_string().contains("too many elements"), "{v}");
    let merge = format!(r#"{{"untagged":true,"uids":{json_list}}}"#);
    let (st, _, v) = send(&s, Method::POST, "/v1/buckets/b/merge/set", &[JSON], merge).await;
    assert_eq!(st, 400, "{v}");
    assert!(v.to_string().contains("too many elements"), "{v}");
    // A value within the bound is stored.
    let (st, _, v) = send(
        &s,
        Method::PUT,
        "/v1/buckets/b/objects/ok?type=set",
        &[],
        "x\n".repeat(1000),
    )
    .await;
    assert_eq!(st, 201, "{v}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_request_refused_for_want_of_a_transfer_can_be_sent_again() {
    let s = Server::start_with(|c| c.max_transfers = 1).await;
    let owner = SigningKey::from_seed(&[7; 32]);
    let (st, v) = s.create_owned(&owner, "mine").await;
    assert_eq!(st, 201, "{v}");
    wait_for_idle_transfers(&s).await;
    let path = "/v1/buckets/mine/objects/k";
    let body = b"hello";
    let req = RequestToSign {
        method: "PUT",
        path_and_query: path,
        unix_secs: now_secs(),
        body_blake3: body_blake3(body),
        content_type: b"",
        if_match: b"",
        context: b"",
        nonce: b"",
        capsule: b"",
    };
    let signed = req.sign(&owner);
    let headers: Vec<(&str, &str)> = signed.iter().map(|(n, v)| (*n, v.as_str())).collect();
    let held = s.node.write_permit().unwrap();
    let (st, retry, v) = send(&s, Method::PUT, path, &headers, &body[..]).await;
    assert_eq!(st, 503, "{v}");
    assert!(retry);
    drop(held);
    // The very same request, as the client retries it after Retry-After.
    let (st, _, v) = send(&s, Method::PUT, path, &headers, &body[..]).await;
    assert_eq!(st, 201, "{v}");
    assert_eq!(s.get(path).await.bytes().await.unwrap(), "hello");
    // Once used, it is a replay. (The read's transfer may still be finishing on the
    // server after its last byte arrived: a 503 then is the one slot being busy, retried
    // as a client does.)
    let mut tries = 0;
    let (st, v) = loop {
        let (st, _, v) = send(&s, Method::PUT, path, &headers, &body[..]).await;
        tries += 1;
        if st != 503 || tries == 100 {
            break (st, v);
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    assert_eq!(st, 401, "{v}");
    s.stop().await;
}

/// Bodies read whole and parsed in memory (JSON, typed values) take their memory, four
/// times what they hold, from the node's budget for them as their bytes arrive: a client
/// holds budget only for what it sent (charging the declared length let two slow clients
/// declaring 40 MiB each hold it all, and a chunked body of a few bytes took 256 MiB). A
/// body that would pass the budget is cut with 503 and `Retry-After`; small ones, chunked
/// too, still pass; the memory comes back when the request ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_parsed_in_memory_share_a_budget() {
    let s = Server::start(1 << 30).await;
    s.open_bucket("j").await;
    let addr = s.base.trim_start_matches("http://").to_string();
    let declared = 64u64 << 20;
    // A 64 MiB JSON put that sends `sent` bytes of its body, then waits.
    let start = |sent: usize| {
        let addr = addr.clone();
        async move {
            let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
            let (rd, mut wr) = tcp.into_split();
            let req = format!(
                "PUT /v1/buckets/j/objects/big HTTP/1.1\r\nHost: localhost\r\n\
                 Content-Type: application/json\r\nContent-Length: {declared}\r\n\r\n[\""
            );
            wr.write_all(req.as_bytes()).await.unwrap();
            let writer = tokio::spawn(async move {
                let piece = vec![b'a'; 1 << 20];
                let mut left = sent;
                while left > 0 {
                    let n = left.min(piece.len());
                    if wr.write_all(&piece[..n]).await.is_err() {
                        break;
                    }
                    left -= n;
                }
                wr
            });
            (writer, rd)
        }
    };
    async fn first_line(rd: &mut tokio::net::tcp::OwnedReadHalf, wait: Duration) -> Option<String> {
        let mut buf = [0u8; 512];
        match tokio::time::timeout(wait, rd.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => String::from_utf8_lossy(&buf[..n])
                .lines()
                .next()
                .map(str::to_string),
            _ => None,
        }
    }
    // The first sends 60 MiB: it holds 240 of the 320 MiB.
    let (w1, mut r1) = start(60 << 20).await;
    let _w1 = w1.await.unwrap();
    let t0 = Instant::now();
    while s.node.buffered_memory().grow(81 << 20).is_ok() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the first body never arrived"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(first_line(&mut r1, Duration::from_millis(100)).await, None);
    // A small chunked JSON put still fits.
    let small = s
        .req(Method::PUT, "/v1/buckets/j/objects/small")
        .header(JSON.0, JSON.1)
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter([
            Ok::<_, std::io::Error>(bytes::Bytes::from_static(br#"["x", "y"]"#)),
        ])))
        .send()
        .await
        .unwrap();
    assert_eq!(small.status().as_u16(), 201);
    // A second that sends 30 MiB passes the budget at about 20 MiB: cut with 503.
    let (_w2, mut r2) = start(30 << 20).await;
    let line = first_line(&mut r2, Duration::from_secs(20)).await;
    let line = line.expect("an answer once the budget is passed");
    assert!(line.starts_with("HTTP/1.1 503"), "{line}");
    // The first request ends (its client goes away): its memory comes back.
    drop((_w1, r1));
    let t0 = Instant::now();
    while s.node.buffered_memory().grow(declared).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the budget never came back"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A signed request refused because the memory for bodies held in memory is taken (by its
/// declared length) is refused before its signature is used, so it can be sent again
/// unchanged once there is room (it was refused as a replay).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_request_refused_for_memory_can_be_sent_again() {
    let s = Server::start(1 << 30).await;
    let owner = SigningKey::from_seed(&[51; 32]);
    assert_eq!(s.create_owned(&owner, "o").await.0, 201);
    let body = br#"["a", "b"]"#;
    let path = "/v1/buckets/o/objects/l";
    let date = now_secs();
    // Someone else's bodies hold all but a few MiB of the budget.
    let mut held = s.node.buffered_memory();
    held.grow(u64::from(cairn_node::node::BUFFERED_MEMORY_MIB - 2) << 20 >> 2)
        .unwrap();
    let send = || s.send_signed(&owner, date, Method::PUT, path, &[JSON], body, body);
    // Declared small, it fits.
    let (st, v) = send().await;
    assert_eq!(st, 201, "{v}");
    // A large declared length does not fit: 503 before the signature is used.
    let big = "a".repeat(1 << 20);
    let big_body = format!(r#"["{big}"]"#);
    let path2 = "/v1/buckets/o/objects/m";
    let date2 = now_secs();
    let send2 = || {
        s.send_signed(
            &owner,
            date2,
            Method::PUT,
            path2,
            &[JSON],
            big_body.as_bytes(),
            big_body.as_bytes(),
        )
    };
    let (st, v) = send2().await;
    assert_eq!(st, 503, "{v}");
    drop(held);
    let (st, v) = send2().await;
    assert_eq!(st, 201, "the same request once there is room: {v}");
}

/// The status line of the answer to `head` (request line and headers, no body) sent on a
/// raw socket: the node answers a refused body before reading it.
async fn status_of_headers_only(s: &Server, head: &str) -> String {
    let addr = s.base.trim_start_matches("http://");
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(head.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut buf))
        .await
        .expect("an answer before the body is sent")
        .unwrap();
    String::from_utf8_lossy(&buf[..n])
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// A body declared over its limit gets 413 before anything is read, whatever part of the
/// memory budget other requests hold: answered 503 with `Retry-After` while any was held,
/// it told the client to send again what can never be taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_declared_over_its_limit_gets_413_while_the_budget_is_in_use() {
    let s = Server::start(5 << 30).await;
    s.open_bucket("b").await;
    let (st, _) = s
        .send(Method::PUT, "/v1/buckets/b/objects/k?type=string", &[], "x")
        .await;
    assert_eq!(st, 201);
    let mut held = s.node.buffered_memory();
    held.grow(100 << 20).unwrap();
    for (method, path, ctype, len) in [
        ("PATCH", "/v1/buckets/b/objects/k", "", 400u64 << 20),
        (
            "DELETE",
            "/v1/buckets/b/objects/k?branch=master",
            "",
            400 << 20,
        ),
        (
            "POST",
            "/v1/buckets/b/fork/k",
            "content-type: application/json\r\n",
            400 << 20,
        ),
        // A JSON PUT declared over the 64 MiB a buffered body may hold.
        (
            "PUT",
            "/v1/buckets/b/objects/j",
            "content-type: application/json\r\n",
            100 << 20,
        ),
    ] {
        let head = format!(
            "{method} {path} HTTP/1.1\r\nhost: localhost\r\n{ctype}content-length: {len}\r\n\r\n"
        );
        let status = status_of_headers_only(&s, &head).await;
        assert!(status.contains(" 413 "), "{method} {path}: {status}");
    }
    drop(held);
}

/// A streamed text list holds a line past a MiB whole (with the leaf it is copied into):
/// that memory comes from the budget for bodies held in memory, so a 16 MiB line is
/// refused with 503 (nothing written) while the budget is nearly all held, and taken once
/// it is free; lists of short lines stream as before, whatever the budget holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_list_takes_its_long_lines_from_the_memory_budget() {
    let s = Server::start(1 << 30).await;
    s.open_bucket("b").await;
    let long = {
        let mut v = vec![b'a'; 16 << 20];
        v.push(b'\n');
        v.extend_from_slice(b"short\n");
        v
    };
    let put = |name: &str, body: Vec<u8>| {
        let req = s
            .req(
                Method::PUT,
                &format!("/v1/buckets/b/objects/{name}?type=list"),
            )
            .body(body);
        async move { req.send().await.unwrap().status().as_u16() }
    };
    let mut held = s.node.buffered_memory();
    // All but 8 MiB of the 320 MiB budget.
    held.hold(312 << 20).unwrap();
    assert_eq!(put("short", b"one\ntwo\n".repeat(1000)).await, 201);
    assert_eq!(put("long", long.clone()).await, 503);
    let (st, _) = s
        .send(Method::GET, "/v1/buckets/b/objects/long", &[], "")
        .await;
    assert_eq!(st, 404, "nothing written");
    drop(held);
    assert_eq!(put("long", long).await, 201);
}

/// A bucket's details, its metadata and an LCA open the bucket (which may replay its
/// capsule's journal) only under a read transfer: with every read transfer taken they get
/// 503, as the other reads do, and a free one serves them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bucket_details_wait_for_a_read_transfer() {
    let s = Server::start_with(|c| {
        c.max_transfers = 4;
        c.max_open_buckets = 1;
    })
    .await;
    s.open_bucket("a").await;
    s.open_bucket("b").await;
    // Every read transfer taken (reads may hold three of four).
    let held: Vec<_> = (0..3).map(|_| s.node.read_permit().unwrap()).collect();
    for path in [
        "/v1/buckets/a",
        "/v1/buckets/b/metadata",
        "/v1/buckets/a/lca/k?a=master&b=master",
    ] {
        assert_eq!(s.get(path).await.status(), 503, "{path}");
    }
    drop(held);
    assert_eq!(s.get("/v1/buckets/a").await.status(), 200);
    assert_eq!(s.get("/v1/buckets/b/metadata").await.status(), 200);
}

/// A merge takes what it may hold (`node::MERGE_MEMORY_MIB`) from the node's budget for
/// memory held by requests, before its signature is checked: while the budget cannot
/// give it, the merge gets 503 with `Retry-After`, and once it can, the same merge runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merge_takes_its_memory_from_the_budget() {
    let s = Server::start(1 << 30).await;
    s.open_bucket("b").await;
    let json = ("content-type", "application/json");
    let (st, _) = s
        .send(Method::PUT, "/v1/buckets/b/objects/k?type=string", &[], "x")
        .await;
    assert_eq!(st, 201);
    let (st, _) = s
        .send(
            Method::POST,
            "/v1/buckets/b/fork/k",
            &[json],
            r#"{"branch":"dev"}"#,
        )
        .await;
    assert_eq!(st, 201);
    let merge = || async {
        let (st, retry, v) = send(
            &s,
            Method::POST,
            "/v1/buckets/b/merge/k",
            &[json],
            r#"{"from":"dev"}"#,
        )
        .await;
        (st, retry, v)
    };
    let mut held = s.node.buffered_memory();
    held.hold(300 << 20).unwrap();
    let (st, retry, _) = merge().await;
    assert_eq!((st, retry), (503, true));
    drop(held);
    let (st, _, v) = merge().await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["outcome"], "up_to_date", "{v}");
}

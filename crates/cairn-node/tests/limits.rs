//! The node's resource limits, over a real socket: a connection that never finishes its
//! headers is closed, a stalled upload is cut and stores nothing, a reader that stops
//! reading gives its transfer back, uploads and readers that trickle below the minimum
//! rate are cut, `max_transfers` answers 503, a shutdown stops waiting
//! after its grace period, metric labels stay bounded, and a client that half-closes after
//! its request still gets the answer.

mod native_support;

use std::time::{Duration, Instant};

use native_support::Server;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn connect(s: &Server) -> TcpStream {
    TcpStream::connect(s.base.trim_start_matches("http://"))
        .await
        .unwrap()
}

/// Starts an upload of 1,000,000 bytes to key `k` of open bucket `b` and sends 1000 of them.
async fn stalled_upload(s: &Server) -> TcpStream {
    let mut tcp = connect(s).await;
    tcp.write_all(
        b"PUT /v1/buckets/b/objects/k HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000000\r\n\r\n",
    )
    .await
    .unwrap();
    tcp.write_all(&[7u8; 1000]).await.unwrap();
    tcp
}

/// Stores `len` bytes of pseudo-random data as object `big` of open bucket `b`; returns them.
async fn put_big(s: &Server, len: usize) -> Vec<u8> {
    let mut x = 0x9E3779B97F4A7C15u64;
    let data: Vec<u8> = (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let r = s
        .req(reqwest::Method::PUT, "/v1/buckets/b/objects/big")
        .body(data.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    data
}

/// Asks for `big` until the one transfer is free again (503 until then, for at most
/// `within`), then checks it reads back as `data`.
async fn read_big_once_free(s: &Server, data: &[u8], within: Duration, why: &str) {
    let t0 = Instant::now();
    loop {
        let r = s.get("/v1/buckets/b/objects/big").await;
        if r.status() == 200 {
            assert!(
                r.bytes().await.unwrap() == data,
                "the blob read back differs"
            );
            return;
        }
        assert_eq!(r.status(), 503);
        assert!(t0.elapsed() < within, "{why}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Reads until the peer closes, `want` shows up, or 10 s pass; returns what was read and
/// whether the connection was closed.
async fn read_until(tcp: &mut TcpStream, want: &str) -> (String, bool) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, tcp.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&got).into(), true),
            Ok(Ok(n)) => {
                got.extend_from_slice(&buf[..n]);
                if !want.is_empty() && String::from_utf8_lossy(&got).contains(want) {
                    return (String::from_utf8_lossy(&got).into(), false);
                }
            }
            Err(_) => return (String::from_utf8_lossy(&got).into(), false),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_never_finishes_its_headers_is_closed() {
    let s = Server::start_with(|c| c.header_timeout_secs = 0.5).await;
    let mut tcp = connect(&s).await;
    tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
        .await
        .unwrap();
    let t0 = Instant::now();
    let (_, closed) = read_until(&mut tcp, "").await;
    assert!(closed, "the connection was still open after 10 s");
    assert!(t0.elapsed() >= Duration::from_millis(400));
    // Nor does one that sends nothing at all keep its place (here the only one).
    drop(tcp);
    let s2 = Server::start_with(|c| {
        c.header_timeout_secs = 0.5;
        c.max_connections = 1;
    })
    .await;
    let mut silent = connect(&s2).await;
    let (_, closed) = read_until(&mut silent, "").await;
    assert!(closed, "a silent connection was still open after 10 s");
    assert_eq!(s2.get("/healthz").await.status(), 200);
    assert_eq!(s.get("/healthz").await.status(), 200);
    s2.stop().await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_upload_is_cut_and_stores_nothing() {
    let s = Server::start_with(|c| c.stall_timeout_secs = 0.5).await;
    s.open_bucket("b").await;
    let mut tcp = stalled_upload(&s).await;
    let (answer, _) = read_until(&mut tcp, "stalled").await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("stalled"), "{answer}");
    let (st, v) = s.get_json("/v1/buckets/b/objects/k").await;
    assert_eq!(st, 404, "{v}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_stops_reading_gives_its_transfer_back() {
    let s = Server::start_with(|c| {
        c.stall_timeout_secs = 0.5;
        c.max_transfers = 1;
    })
    .await;
    s.open_bucket("b").await;
    // More than the socket buffers and the node's read-ahead hold.
    let data = put_big(&s, 64 << 20).await;
    // A client asks for it and reads nothing.
    let mut stalled = connect(&s).await;
    stalled
        .write_all(b"GET /v1/buckets/b/objects/big HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The one transfer is taken.
    let r = s.get("/v1/buckets/b/objects/big").await;
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    // A HEAD loads the version too (see `head_meta_and_proof_hold_a_transfer`): it waits
    // for a transfer like the GET.
    let r = s
        .req(reqwest::Method::HEAD, "/v1/buckets/b/objects/big")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    // Once the stall timeout cuts the stalled reader, the blob reads back whole.
    let why = "the transfer never came back";
    read_big_once_free(&s, &data, Duration::from_secs(10), why).await;
    let r = s
        .req(reqwest::Method::HEAD, "/v1/buckets/b/objects/big")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-length"], (64u64 << 20).to_string());
    drop(stalled);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_waiting_after_its_grace_period() {
    let s = Server::start_with(|c| c.shutdown_grace_secs = 0.5).await;
    s.open_bucket("b").await;
    // An upload that stalls (the stall timeout, 60 s by default, is far away).
    let mut held = stalled_upload(&s).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t0 = Instant::now();
    s.stop().await;
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    // And the connection still open at the end of the grace period is closed.
    let (_, closed) = read_until(&mut held, "").await;
    assert!(closed, "the stalled connection outlived the shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_labels_stay_bounded_and_dropped_requests_leave_the_gauge() {
    let s = Server::start_with(|_| {}).await;
    for m in ["FOO", "BAR", "BAZ"] {
        let method = reqwest::Method::from_bytes(m.as_bytes()).unwrap();
        s.req(method, "/healthz").send().await.unwrap();
    }
    // A request whose client goes away mid-body.
    s.open_bucket("b").await;
    let tcp = stalled_upload(&s).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(tcp);
    let t0 = Instant::now();
    loop {
        let m = s.get("/metrics").await.text().await.unwrap();
        assert!(!m.contains("FOO") && m.contains("method=\"other\""), "{m}");
        let in_flight = m
            .lines()
            .find(|l| l.starts_with("cairn_http_requests_in_flight "))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|n| n.parse::<i64>().ok());
        // The /metrics request itself is the one in flight.
        if in_flight == Some(1) {
            // The gauges of the node's bounded resources: bucket `b` is open with its
            // capsule, and the dropped upload gave its transfer back.
            let gauge = |name: &str| {
                m.lines()
                    .find(|l| l.starts_with(&format!("{name} ")))
                    .and_then(|l| l.rsplit(' ').next())
                    .and_then(|n| n.parse::<i64>().ok())
            };
            assert_eq!(gauge("cairn_open_buckets"), Some(1), "{m}");
            assert_eq!(gauge("cairn_loaded_capsules"), Some(1), "{m}");
            assert_eq!(gauge("cairn_transfers_in_progress"), Some(0), "{m}");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "in flight: {in_flight:?}\n{m}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_half_closes_after_its_request_gets_the_answer() {
    let s = Server::start_with(|_| {}).await;
    s.open_bucket("b").await;
    let mut tcp = connect(&s).await;
    tcp.write_all(
        b"PUT /v1/buckets/b/objects/k HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\n\r\nhello",
    )
    .await
    .unwrap();
    tcp.shutdown().await.unwrap();
    let (answer, _) = read_until(&mut tcp, "\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer:?}");
    let r = s.get("/v1/buckets/b/objects/k").await;
    assert_eq!(r.bytes().await.unwrap(), "hello");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_small_body_is_cut_too() {
    let s = Server::start_with(|c| c.stall_timeout_secs = 0.5).await;
    let mut tcp = connect(&s).await;
    tcp.write_all(
        b"POST /v1/buckets HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
          Content-Length: 100\r\n\r\n{\"na",
    )
    .await
    .unwrap();
    let (answer, _) = read_until(&mut tcp, "\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 4"), "{answer:?}");
    let (st, v) = s.get_json("/v1/buckets").await;
    assert_eq!(st, 200);
    assert!(v["buckets"].as_array().unwrap().is_empty(), "{v}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_upload_is_cut_and_stores_nothing() {
    // Each byte comes well inside the stall timeout, but far below the floor.
    let s = Server::start_with(|c| {
        c.stall_timeout_secs = 1.0;
        c.min_rate_bytes_per_sec = 10_000;
    })
    .await;
    s.open_bucket("b").await;
    let mut tcp = stalled_upload(&s).await;
    let t0 = Instant::now();
    let mut answer = String::new();
    let mut buf = [0u8; 4096];
    while t0.elapsed() < Duration::from_secs(10) {
        if tcp.write_all(&[1u8]).await.is_err() {
            break;
        }
        match tokio::time::timeout(Duration::from_millis(200), tcp.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => {
                answer.push_str(&String::from_utf8_lossy(&buf[..n]));
                if answer.contains("slow") {
                    break;
                }
            }
            Err(_) => {}
        }
    }
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer:?}");
    assert!(answer.contains("too slow"), "{answer}");
    let (st, v) = s.get_json("/v1/buckets/b/objects/k").await;
    assert_eq!(st, 404, "{v}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickling_reader_gives_its_transfer_back() {
    let s = Server::start_with(|c| {
        c.stall_timeout_secs = 2.0;
        c.min_rate_bytes_per_sec = 16 << 20;
        c.max_transfers = 1;
    })
    .await;
    s.open_bucket("b").await;
    let data = put_big(&s, 64 << 20).await;
    // A client that reads 1 MiB every 100 ms (about 10 MiB/s): never idle for the stall
    // timeout, but below the floor. Unchecked, it would read all 64 MiB in about 7 s.
    let mut slow = connect(&s).await;
    slow.write_all(b"GET /v1/buckets/b/objects/big HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    // Once told to, it drains what the socket buffers hold at full speed: the node must
    // have ended the connection short of the blob.
    let drain = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let drain_now = drain.clone();
    let progress = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let progress_now = progress.clone();
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0usize;
        loop {
            progress_now.store(got, std::sync::atomic::Ordering::Relaxed);
            let fast = drain_now.load(std::sync::atomic::Ordering::Relaxed);
            let want = if fast { buf.len() } else { 1 << 20 };
            match slow.read(&mut buf[..want]).await {
                Ok(0) | Err(_) => return got,
                Ok(n) => got += n,
            }
            if !fast {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });
    // Once the slow reader has its transfer, a second reader is turned away.
    let t0 = Instant::now();
    while progress.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the slow read never started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(s.get("/v1/buckets/b/objects/big").await.status(), 503);
    // The floor cuts the trickling reader; the transfer comes back and the blob reads whole.
    let why = "the trickling reader kept its transfer";
    read_big_once_free(&s, &data, Duration::from_secs(20), why).await;
    drain.store(true, std::sync::atomic::Ordering::Relaxed);
    let got = tokio::time::timeout(Duration::from_secs(30), reader)
        .await
        .unwrap()
        .unwrap();
    assert!(got < data.len(), "the trickling reader got everything");
    s.stop().await;
}

/// Writers hold all but an eighth of `max_transfers` (at least one is kept): with every
/// write slot taken by slow uploads, reads still get through (and writes get 503 until a
/// slot frees).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_writers_leave_room_for_reads() {
    let s = Server::start_with(|c| c.max_transfers = 4).await;
    s.open_bucket("b").await;
    assert_eq!(cairn_node::node::write_share(4), 3);
    assert_eq!(cairn_node::node::write_share(256), 224);
    assert_eq!(cairn_node::node::write_share(1), 1);
    let r = s
        .req(reqwest::Method::PUT, "/v1/buckets/b/objects/k")
        .body("written before the writers are slow")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let writers: Vec<_> = (0..3).map(|_| s.node.write_permit().unwrap()).collect();
    assert!(s.node.write_permit().is_err());
    let r = s
        .req(reqwest::Method::PUT, "/v1/buckets/b/objects/k")
        .body("refused")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    let r = s.get("/v1/buckets/b/objects/k").await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.bytes().await.unwrap(),
        "written before the writers are slow"
    );
    drop(writers);
    assert!(s.node.write_permit().is_ok());
    s.stop().await;
}

/// Readers hold at most three quarters of `max_transfers`: with every read slot taken by
/// slow downloads, uploads still get through (and reads get 503 until a slot frees).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_readers_leave_room_for_writes() {
    let s = Server::start_with(|c| c.max_transfers = 4).await;
    s.open_bucket("b").await;
    assert_eq!(cairn_node::node::read_share(4), 3);
    let readers: Vec<_> = (0..3).map(|_| s.node.read_permit().unwrap()).collect();
    assert!(s.node.read_permit().is_err());
    let r = s.get("/v1/buckets/b/keys").await;
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    let r = s
        .req(reqwest::Method::PUT, "/v1/buckets/b/objects/k")
        .body("written while the readers are slow")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    drop(readers);
    let r = s.get("/v1/buckets/b/objects/k").await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.bytes().await.unwrap(),
        "written while the readers are slow"
    );
    s.stop().await;
}

/// A `HEAD` of an object, `meta` and `proof` load the version (an inline value of 16 MiB
/// decodes to more) and so hold a transfer while they do: with every read slot taken they
/// get 503 like a GET (they took none, so many of them at once held memory unbounded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_meta_and_proof_hold_a_transfer() {
    let s = Server::start_with(|c| c.max_transfers = 4).await;
    s.open_bucket("b").await;
    let r = s
        .req(reqwest::Method::PUT, "/v1/buckets/b/objects/k")
        .body("a value")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let readers: Vec<_> = (0..3).map(|_| s.node.read_permit().unwrap()).collect();
    for (method, path) in [
        (reqwest::Method::HEAD, "/v1/buckets/b/objects/k"),
        (reqwest::Method::HEAD, "/v1/buckets/b/stream/k"),
        (reqwest::Method::GET, "/v1/buckets/b/meta/k"),
        (reqwest::Method::GET, "/v1/buckets/b/proof/k"),
    ] {
        let r = s.req(method.clone(), path).send().await.unwrap();
        assert_eq!(r.status(), 503, "{method} {path}");
    }
    drop(readers);
    for (method, path) in [
        (reqwest::Method::HEAD, "/v1/buckets/b/objects/k"),
        (reqwest::Method::GET, "/v1/buckets/b/meta/k"),
        (reqwest::Method::GET, "/v1/buckets/b/proof/k"),
    ] {
        let r = s.req(method.clone(), path).send().await.unwrap();
        assert_eq!(r.status(), 200, "{method} {path}");
    }
    assert_eq!(s.node.transfers_in_progress(), 0);
    s.stop().await;
}

/// Waits (up to 10 s) until `cond` holds.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < Duration::from_secs(10), "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One address holds at most `max_transfers_per_ip` transfers (reads and writes together):
/// before, slow uploads from one host (at the rate floor) could hold every write slot for
/// everyone. Here loopback counts as a remote host (`limit_loopback`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_holds_at_most_its_share_of_transfers() {
    let s = Server::start_with(|c| {
        c.max_transfers = 16;
        c.max_transfers_per_ip = 2;
        c.limit_loopback = true;
    })
    .await;
    s.open_bucket("b").await;
    let local = "127.0.0.1".parse().unwrap();
    let slow: Vec<TcpStream> = vec![stalled_upload(&s).await, stalled_upload(&s).await];
    eventually("the two slow uploads hold their transfers", || {
        s.node.peer_transfers(local) == 2
    })
    .await;
    assert_eq!(s.node.transfers_in_progress(), 2);
    let r = s
        .req(reqwest::Method::PUT, "/v1/buckets/b/objects/other")
        .body("refused")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    let v = r.text().await.unwrap();
    assert!(v.contains("max_transfers_per_ip"), "{v}");
    assert_eq!(s.get("/v1/buckets/b/keys").await.status(), 503);
    // Transfers taken outside a connection (no peer address) count only in `max_transfers`.
    drop(s.node.write_permit().unwrap());
    // The slow uploads go away: their slots are the address's again.
    drop(slow);
    eventually("the slow uploads give their transfers back", || {
        s.node.peer_transfers(local) == 0
    })
    .await;
    let r = s
        .req(reqwest::Method::PUT, "/v1/buckets/b/objects/other")
        .body("stored")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    s.stop().await;
}

/// Asks for `/healthz` on `tcp`; the answer's status line start, if one comes.
async fn health(tcp: &mut TcpStream) -> Option<[u8; 12]> {
    tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .ok()?;
    let mut buf = [0u8; 12];
    tcp.read_exact(&mut buf).await.ok()?;
    Some(buf)
}

/// One address holds at most `max_connections_per_ip` connections; a further one is
/// closed at once, and its slot comes back when one of the others closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_holds_at_most_its_share_of_connections() {
    let s = Server::start_with(|c| {
        c.max_connections_per_ip = 3;
        c.limit_loopback = true;
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(connect(&s).await);
    }
    // Each of the three is served.
    for tcp in &mut held {
        assert_eq!(health(tcp).await, Some(*b"HTTP/1.1 200"));
    }
    // The fourth is closed unanswered.
    let mut extra = connect(&s).await;
    let _ = extra
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await;
    let mut buf = Vec::new();
    let got = tokio::time::timeout(Duration::from_secs(5), extra.read_to_end(&mut buf)).await;
    assert!(
        matches!(got, Ok(Ok(0)) | Ok(Err(_))),
        "the fourth connection was served: {got:?} {:?}",
        String::from_utf8_lossy(&buf)
    );
    drop(held.pop());
    let t0 = Instant::now();
    loop {
        if let Some(status) = health(&mut connect(&s).await).await {
            assert_eq!(&status, b"HTTP/1.1 200");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the slot never came back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_body_declared_too_large_is_refused_before_it_is_sent() {
    // The stall timeout (60 s by default) is far away: only the declared length can
    // answer within the test's 10 s.
    let s = Server::start_with(|_| {}).await;
    s.open_bucket("b").await;
    let (st, _) = s
        .send(reqwest::Method::PUT, "/v1/buckets/b/objects/k", &[], "one")
        .await;
    assert_eq!(st, 201);
    for (method, path) in [
        ("PATCH", "/v1/buckets/b/objects/k"),
        ("DELETE", "/v1/buckets/b/objects/k"),
        ("POST", "/v1/buckets/b/fork/k"),
    ] {
        let mut tcp = connect(&s).await;
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
             Content-Length: 100000000\r\n\r\n"
        );
        tcp.write_all(head.as_bytes()).await.unwrap();
        let t0 = Instant::now();
        let (answer, _) = read_until(&mut tcp, "\r\n\r\n").await;
        assert!(
            answer.starts_with("HTTP/1.1 413"),
            "{method} {path}: {answer}"
        );
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    }
    // Nothing changed.
    let r = s.get("/v1/buckets/b/objects/k").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "one");
    s.stop().await;
}

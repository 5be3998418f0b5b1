//! A large upload and download through the Gaia hub stream in bounded memory: 96 MiB go
//! up as a chunked body (no Content-Length) and come back, and the process's peak RSS
//! grows by far less than the file's size.

mod gaia_support;

use futures_util::StreamExt;
use gaia_support::{Hub, Key};
use sha2::{Digest, Sha256};

const SIZE: u64 = 96 << 20;
const PIECE: usize = 256 << 10;

/// Peak resident set size of this process (Linux `VmHWM`), in bytes.
fn peak_rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Deterministic, incompressible-looking bytes for piece `i`.
fn piece(i: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(PIECE);
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while out.len() < PIECE {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_upload_and_download_stream_in_bounded_memory() {
    let hub = Hub::start(SIZE).await;
    let k = Key::new(40);
    let (a, auth) = (k.address(), k.bearer());
    // Warm up the bucket so its opening is not counted.
    assert_eq!(hub.store(&auth, &a, "warm", b"x", &[]).await.0, 202);
    let before = peak_rss();

    let pieces = SIZE / PIECE as u64;
    let mut want = Sha256::new();
    for i in 0..pieces {
        want.update(piece(i));
    }
    let want = want.finalize();
    let body = futures_util::stream::iter(0..pieces).map(|i| Ok::<_, std::io::Error>(piece(i)));
    let resp = hub
        .http
        .post(hub.url(&format!("/store/{a}/big.bin")))
        .header("authorization", &auth)
        .body(reqwest::Body::wrap_stream(body))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);

    let resp = hub
        .http
        .get(hub.url(&format!("/read/{a}/big.bin")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-length"], SIZE.to_string().as_str());
    let mut got = Sha256::new();
    let mut n = 0u64;
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.unwrap();
        n += chunk.len() as u64;
        got.update(&chunk);
    }
    assert_eq!(n, SIZE);
    assert_eq!(got.finalize(), want);

    // Bytes are counted both ways.
    let m = hub.node.metrics.render().unwrap();
    let counted = |name: &str| {
        m.lines()
            .find(|l| l.starts_with(&format!("cairn_{name}{{api=\"gaia\"}}")))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0) as u64
    };
    assert!(counted("bytes_written_total") >= SIZE);
    assert!(counted("bytes_read_total") >= SIZE);

    if let (Some(b), Some(after)) = (before, peak_rss()) {
        let grew = after.saturating_sub(b);
        eprintln!("peak RSS grew by {} KiB", grew >> 10);
        assert!(
            grew < SIZE / 4,
            "peak RSS grew by {} MiB for a {} MiB file",
            grew >> 20,
            SIZE >> 20
        );
    }
}

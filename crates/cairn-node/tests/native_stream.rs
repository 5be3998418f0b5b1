//! A large blob streamed through the native API both ways in bounded memory: the upload is
//! generated on the fly (never held whole), the download is hashed as it arrives, and the
//! process's peak resident set must grow by far less than the blob's size.
//!
//! Size: `CAIRN_STREAM_TEST_MB` (default 256). Its own test binary, so no other test's
//! allocations count against the peak.

mod native_support;

use cairn_core::HashAlgo;
use futures_util::StreamExt;
use native_support::{Server, peak_rss_kib};
use reqwest::Method;

/// Deterministic pseudo-random bytes (xorshift64), `n` chunks of 1 MiB.
fn chunks(n: usize) -> impl Iterator<Item = Vec<u8>> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    (0..n).map(move |_| {
        let mut c = vec![0u8; 1 << 20];
        for w in c.chunks_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            w.copy_from_slice(&state.to_le_bytes()[..w.len()]);
        }
        c
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_blob_streams_in_bounded_memory() {
    let mb: usize = std::env::var("CAIRN_STREAM_TEST_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let s = Server::start(u64::MAX).await;
    s.open_bucket("big").await;
    let mut h = HashAlgo::Blake3.hasher();
    for c in chunks(mb) {
        h.update(&c);
    }
    let expected = h.finalize();
    let before = peak_rss_kib();

    let body = futures_util::stream::iter(chunks(mb).map(Ok::<_, std::io::Error>));
    let r = s
        .req(Method::PUT, "/v1/buckets/big/objects/blob.bin")
        .body(reqwest::Body::wrap_stream(body))
        .send()
        .await
        .expect("upload");
    assert_eq!(r.status(), 201);

    let r = s.get("/v1/buckets/big/objects/blob.bin").await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["content-length"].to_str().unwrap(),
        (mb << 20).to_string()
    );
    let mut h = HashAlgo::Blake3.hasher();
    let mut n = 0usize;
    let mut stream = r.bytes_stream();
    while let Some(c) = stream.next().await {
        let c = c.expect("download");
        n += c.len();
        h.update(&c);
    }
    assert_eq!(n, mb << 20);
    assert_eq!(h.finalize(), expected, "the blob came back different");

    if let (Some(b), Some(a)) = (before, peak_rss_kib()) {
        let grew_mib = a.saturating_sub(b) / 1024;
        eprintln!("{mb} MiB up and down: peak RSS {b} KiB -> {a} KiB (+{grew_mib} MiB)");
        // Buffering either way would add at least the blob's size; the store's in-memory
        // chunk index grows a little with it (one entry per ~4 KiB chunk).
        assert!(
            (grew_mib as usize) < 64 + mb / 16,
            "peak RSS grew by {grew_mib} MiB for a {mb} MiB blob"
        );
    }
    s.stop().await;
}

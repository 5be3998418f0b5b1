//! Load test of the Gaia hub (issue 4): 200 concurrent clients for 60 seconds (set
//! `CAIRN_LOAD_SECONDS` to change the length), each storing, reading back, listing and
//! deleting its own files and all of them storing to one shared path. Every answer is
//! checked (status, ETag, the exact bytes); the test fails on any error and on memory
//! that grows faster than the data. The process's resident set is sampled every 250 ms:
//! it must stay under a fixed ceiling, and from the end of the first third of the run to
//! the end it may grow by a small margin plus a per-mutation budget only. That budget is
//! what the node keeps in memory for every stored version by design (the log store's
//! chunk index, the capsule DAG node and signature of its record: about 1.7 KiB per Gaia
//! store, measured with massif); a leak of request bodies or buffers (4 KiB on average
//! here) or of per-connection state breaks it.

mod gaia_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use gaia_support::{Hub, Key};
use parking_lot::Mutex;

/// Concurrent clients.
const CLIENTS: usize = 200;
/// Distinct paths each client cycles through.
const PATHS_PER_CLIENT: u64 = 4;
/// Resident-set ceiling for the whole test process (node and clients).
const RSS_CEILING: u64 = 768 << 20;
/// Growth allowed besides the per-mutation budget (allocator arenas, hash-table doubling).
const RSS_GROWTH_MARGIN: u64 = 64 << 20;
/// Resident bytes each stored version (Gaia store or delete) may add.
const RSS_PER_MUTATION: u64 = 3 << 10;

/// Resident set size of this process (Linux `VmRSS`), in bytes.
fn rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The body client `c` writes in its `n`-th operation: 100 B to 8 KiB, unique to (c, n).
fn body(c: usize, n: u64) -> Vec<u8> {
    let mut x =
        (c as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ n.wrapping_mul(0xD1B5_4A32_D192_ED03);
    x |= 1;
    let len = 100 + (x % (8 << 10)) as usize;
    let mut out = format!("client {c} op {n} ").into_bytes();
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.push(b'a' + (x % 26) as u8);
    }
    out
}

/// Counts of what the clients did and the errors they met.
#[derive(Default)]
struct Tally {
    stores: AtomicU64,
    reads: AtomicU64,
    lists: AtomicU64,
    deletes: AtomicU64,
    shared: AtomicU64,
    /// Stores and deletes acknowledged so far (each makes a version and a capsule record).
    mutations: AtomicU64,
    errors: Mutex<Vec<String>>,
}

impl Tally {
    fn error(&self, e: String) {
        let mut errors = self.errors.lock();
        if errors.len() < 1000 {
            errors.push(e);
        }
    }
}

/// One client's loop until `deadline`.
async fn client(
    c: usize,
    hub: Arc<Hub>,
    key: Key,
    shared: (String, String),
    deadline: Instant,
    tally: Arc<Tally>,
) {
    let (address, auth) = (key.address(), key.bearer());
    let http = &hub.http;
    let mut n = 0u64;
    while Instant::now() < deadline {
        n += 1;
        let path = format!("load/{c}/f{}", n % PATHS_PER_CLIENT);
        let data = body(c, n);
        // Store, then read back the same bytes under the ETag the store returned.
        let stored = http
            .post(hub.url(&format!("/store/{address}/{path}")))
            .header("authorization", &auth)
            .body(data.clone())
            .send()
            .await;
        let etag = match stored {
            Ok(r) if r.status().as_u16() == 202 => match r.json::<serde_json::Value>().await {
                Ok(v) => match v["etag"].as_str() {
                    Some(e) => e.to_string(),
                    None => {
                        tally.error(format!("client {c} store {path}: no etag in {v}"));
                        continue;
                    }
                },
                Err(e) => {
                    tally.error(format!("client {c} store {path}: bad JSON: {e}"));
                    continue;
                }
            },
            Ok(r) => {
                tally.error(format!("client {c} store {path}: status {}", r.status()));
                continue;
            }
            Err(e) => {
                tally.error(format!("client {c} store {path}: {e}"));
                continue;
            }
        };
        tally.stores.fetch_add(1, Ordering::Relaxed);
        tally.mutations.fetch_add(1, Ordering::Relaxed);
        match http
            .get(hub.url(&format!("/read/{address}/{path}")))
            .send()
            .await
        {
            Ok(r) if r.status().as_u16() == 200 => {
                let got_tag = r
                    .headers()
                    .get("etag")
                    .and_then(|v| v.to_str().ok())
                    .map(|s| s.trim_matches('"').to_string());
                match r.bytes().await {
                    Ok(b) if b[..] == data[..] && got_tag.as_deref() == Some(etag.trim_matches('"')) => {
                        tally.reads.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(b) => tally.error(format!(
                        "client {c} read {path}: {} bytes under ETag {got_tag:?}, wrote {} under {etag}",
                        b.len(),
                        data.len()
                    )),
                    Err(e) => tally.error(format!("client {c} read {path}: {e}")),
                }
            }
            Ok(r) => tally.error(format!("client {c} read {path}: status {}", r.status())),
            Err(e) => tally.error(format!("client {c} read {path}: {e}")),
        }
        // Every 4th operation: a write to the one path every client shares.
        if n.is_multiple_of(4) {
            let (shared_addr, shared_auth) = &shared;
            match http
                .post(hub.url(&format!("/store/{shared_addr}/shared.json")))
                .header("authorization", shared_auth)
                .body(data.clone())
                .send()
                .await
            {
                Ok(r) if r.status().as_u16() == 202 => {
                    tally.shared.fetch_add(1, Ordering::Relaxed);
                    tally.mutations.fetch_add(1, Ordering::Relaxed);
                }
                Ok(r) => tally.error(format!("client {c} shared store: status {}", r.status())),
                Err(e) => tally.error(format!("client {c} shared store: {e}")),
            }
        }
        // Every 8th: list this client's bucket; the path just written must be there.
        if n.is_multiple_of(8) {
            match http
                .post(hub.url(&format!("/list-files/{address}")))
                .header("authorization", &auth)
                .header("content-type", "application/json")
                .body("{}")
                .send()
                .await
            {
                Ok(r) if r.status().as_u16() == 202 => match r.json::<serde_json::Value>().await {
                    Ok(v)
                        if v["entries"].as_array().is_some_and(|e| {
                            e.iter().any(|x| x.as_str() == Some(path.as_str()))
                        }) =>
                    {
                        tally.lists.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(v) => tally.error(format!("client {c} list: {path} missing from {v}")),
                    Err(e) => tally.error(format!("client {c} list: bad JSON: {e}")),
                },
                Ok(r) => tally.error(format!("client {c} list: status {}", r.status())),
                Err(e) => tally.error(format!("client {c} list: {e}")),
            }
        }
        // Every 16th: delete the path just written; a read must then answer 404.
        if n.is_multiple_of(16) {
            match http
                .delete(hub.url(&format!("/delete/{address}/{path}")))
                .header("authorization", &auth)
                .send()
                .await
            {
                Ok(r) if r.status().as_u16() == 202 => {
                    tally.mutations.fetch_add(1, Ordering::Relaxed);
                    match http
                        .get(hub.url(&format!("/read/{address}/{path}")))
                        .send()
                        .await
                    {
                        Ok(r) if r.status().as_u16() == 404 => {
                            tally.deletes.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(r) => tally.error(format!(
                            "client {c} read after delete {path}: status {}",
                            r.status()
                        )),
                        Err(e) => tally.error(format!("client {c} read after delete: {e}")),
                    }
                }
                Ok(r) => tally.error(format!("client {c} delete {path}: status {}", r.status())),
                Err(e) => tally.error(format!("client {c} delete {path}: {e}")),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_clients_for_a_minute_without_errors_in_bounded_memory() {
    let seconds: u64 = std::env::var("CAIRN_LOAD_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let hub = Arc::new(Hub::start(1 << 20).await);
    let owner = Key::new(0);
    let shared = (owner.address(), owner.bearer());
    let tally = Arc::new(Tally::default());
    let start = Instant::now();
    let deadline = start + Duration::from_secs(seconds);

    // Sample the resident set while the clients run.
    // (seconds, resident bytes, mutations so far)
    let samples = Arc::new(Mutex::new(Vec::<(f64, u64, u64)>::new()));
    let sampler = {
        let samples = samples.clone();
        let tally = tally.clone();
        tokio::spawn(async move {
            while Instant::now() < deadline {
                if let Some(r) = rss() {
                    let m = tally.mutations.load(Ordering::Relaxed);
                    samples.lock().push((start.elapsed().as_secs_f64(), r, m));
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };
    let mut tasks = Vec::with_capacity(CLIENTS);
    for c in 0..CLIENTS {
        let key = Key::new(1 + (c % 255) as u8);
        tasks.push(tokio::spawn(client(
            c,
            hub.clone(),
            key,
            shared.clone(),
            deadline,
            tally.clone(),
        )));
    }
    for t in tasks {
        t.await.expect("client task");
    }
    sampler.await.expect("sampler");

    let samples = samples.lock().clone();
    let third = seconds as f64 / 3.0;
    // The highest sample of the first third, and the last sample.
    let early = samples
        .iter()
        .filter(|(t, _, _)| *t < third)
        .max_by_key(|(_, r, _)| *r)
        .copied()
        .unwrap_or_default();
    let late = samples.last().copied().unwrap_or_default();
    let all = samples.iter().map(|(_, r, _)| *r).max().unwrap_or(0);
    let added = late.2.saturating_sub(early.2);
    let allowed = early.1 + RSS_GROWTH_MARGIN + added * RSS_PER_MUTATION;
    // The resident set every ~5 s, for the log.
    let timeline: Vec<String> = samples
        .iter()
        .step_by(20)
        .map(|(t, r, _)| format!("{t:.0}s:{}M", r >> 20))
        .collect();
    eprintln!("RSS over time: {}", timeline.join(" "));
    let errors = tally.errors.lock().clone();
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    eprintln!(
        "{CLIENTS} clients, {seconds} s: {} stores + reads checked ({} reads), {} shared-path \
         stores, {} lists, {} deletes; {} errors; RSS peak {} MiB; from {} MiB after the first \
         third to {} MiB at the end, {} B per mutation over {} mutations (budget {} B + {} MiB)",
        get(&tally.stores),
        get(&tally.reads),
        get(&tally.shared),
        get(&tally.lists),
        get(&tally.deletes),
        errors.len(),
        all >> 20,
        early.1 >> 20,
        late.1 >> 20,
        late.1.saturating_sub(early.1) / added.max(1),
        added,
        RSS_PER_MUTATION,
        RSS_GROWTH_MARGIN >> 20
    );
    assert!(
        errors.is_empty(),
        "{} errors, first: {:#?}",
        errors.len(),
        &errors[..errors.len().min(10)]
    );
    // Every client got through several rounds (the node did not stall).
    assert!(
        get(&tally.stores) >= (CLIENTS * 4) as u64,
        "only {} stores",
        get(&tally.stores)
    );
    assert!(get(&tally.deletes) > 0 && get(&tally.lists) > 0 && get(&tally.shared) > 0);
    assert!(samples.len() >= 4, "too few memory samples");
    assert!(all < RSS_CEILING, "RSS peaked at {} MiB", all >> 20);
    assert!(
        late.1 <= allowed,
        "RSS grew from {} MiB to {} MiB over {added} mutations: more than {} MiB + {} B each",
        early.1 >> 20,
        late.1 >> 20,
        RSS_GROWTH_MARGIN >> 20,
        RSS_PER_MUTATION
    );
    // The shared path holds one of the writes (history kept: it is a chain of versions).
    let r = hub
        .http
        .get(hub.url(&format!("/read/{}/shared.json", shared.0)))
        .send()
        .await
        .expect("read shared");
    assert_eq!(r.status().as_u16(), 200);
}

//! `cairn bench hub`: the Gaia-protocol hub benchmark of issue 4 (deliverable 8).
//!
//! One client, written here in Rust over `reqwest`, drives every hub the same way:
//!
//! - **Files**: for each size (default 1, 10 and 100 MB, decimal), `--runs` writes
//!   (`POST /store/{address}/{path}`) and reads (`GET {read_url_prefix}{address}/{path}`)
//!   of fresh random bytes, each to a new path, plain and client-encrypted. Latency is from
//!   the first byte sent to the last byte received; median and p95 (nearest rank).
//! - **Client-side encryption** happens in the client before upload, as `@stacks/storage`
//!   does, but with a RustCrypto AEAD: ChaCha20-Poly1305 (crate `chacha20poly1305`) over
//!   the whole file, one random 96-bit nonce, stored as `nonce ‖ ciphertext ‖ tag` (28 bytes
//!   more than the plaintext; `@stacks/storage`'s ECIES JSON envelope is larger). The
//!   encrypted write time includes encrypting; the read time includes decrypting.
//! - **Concurrent writers**: N = 1, 2, 10, 100 writers released together by a barrier,
//!   to one path and to N different paths, `--rounds` times; status counts (409 and the
//!   like are failures), failure rate and latency percentiles of every attempt.
//! - **Checks**: every store must answer 202 with JSON `{publicURL, etag}` whose
//!   `publicURL` is the read prefix plus the path; every read must answer 200 with an
//!   `ETag` equal to the store's `etag` (quotes and `W/` ignored) and the bytes written
//!   (after decryption). After concurrent writes to one path, the path must hold the body
//!   of one writer that was answered 202, under that writer's ETag.
//! - **Raw disk**: the same sizes written to a file in the benchmark directory with and
//!   without `fdatasync`, and read back, so "within 2× of raw local disk" is measured in
//!   the same run.
//! - Before measuring, one untimed 1 MB write and read per hub (connections, warm caches).
//! - `--cold`: the page cache is emptied before every timed read (hubs' and raw disk's),
//!   so reads come from the disk; without it they mostly come from memory.
//!
//! Hubs: `--hub LABEL=URL[,READ_URL_PREFIX]` (repeatable; the read prefix defaults to the
//! hub's `/hub_info` `read_url_prefix`), plus, unless `--no-cairn`, a Cairn node started in
//! this process on an ephemeral loopback port with a new data directory, once per
//! `--durability` level (default `group`: every acknowledged write is `fdatasync`ed).
//! Tokens are `v1` ES256K JWTs signed with `k256` for a fresh key per hub, with the
//! hub's own `challenge_text`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use cairn_node::gaia::auth::p2pkh_address;
use cairn_node::{Bound, Config, Node};
use cairn_store::Durability;
use chacha20poly1305::aead::Aead;
use chacha20poly1305::{ChaCha20Poly1305, KeyInit, Nonce};
use clap::Args;
use k256::ecdsa::signature::hazmat::PrehashSigner;
use k256::ecdsa::{Signature, SigningKey};
use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};
use sha2::{Digest, Sha256};

/// Options of `cairn bench hub`.
#[derive(Args, Debug, Clone)]
pub struct HubArgs {
    /// A hub to measure, `LABEL=URL[,READ_URL_PREFIX]` (repeatable). The read prefix
    /// defaults to the hub's `read_url_prefix` from `/hub_info`.
    #[arg(long = "hub", value_name = "LABEL=URL[,READ]")]
    pub hubs: Vec<String>,
    /// Do not start the in-process Cairn node (measure only the `--hub` hubs).
    #[arg(long)]
    pub no_cairn: bool,
    /// File sizes in MB (10^6 bytes), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100")]
    pub file_mb: Vec<f64>,
    /// Runs per file size and mode (write then read, each to a new path).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Numbers of concurrent writers, comma-separated (`--writers` with no value: skip
    /// the concurrent-writer cells).
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "1,2,10,100")]
    pub writers: Vec<usize>,
    /// Bytes each concurrent writer uploads.
    #[arg(long, default_value_t = 100_000)]
    pub writer_bytes: usize,
    /// Rounds of each concurrent-writer cell (all writers released together each round).
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Upload limit of the in-process Cairn node, in MiB.
    #[arg(long, default_value_t = 5120)]
    pub cairn_max_mib: u64,
    /// Average POS-tree leaf size, in bytes, of the in-process Cairn node's buckets
    /// (default: the node's, 65536).
    #[arg(long)]
    pub cairn_leaf_size: Option<u64>,
    /// Label whose medians the others are compared with (default: the first `--hub`).
    #[arg(long)]
    pub baseline: Option<String>,
    /// Numbers of files for the `list-files` cells, comma-separated (none by default): each
    /// hub gets a fresh address filled with that many small files (in increasing order,
    /// the same files growing), then every page is listed, `--runs` times.
    #[arg(long, value_delimiter = ',')]
    pub list_files: Vec<usize>,
    /// Empty the page cache before every timed read, hubs' and raw disk's alike (`sync`,
    /// then `3` into `/proc/sys/vm/drop_caches`: Linux, as root), so reads come from the
    /// disk.
    #[arg(long)]
    pub cold: bool,
}

/// A hub under test.
#[derive(Clone)]
struct Hub {
    label: String,
    url: String,
    read_prefix: String,
    max_mb: Option<f64>,
    address: String,
    bearer: String,
}

/// One timed file transfer outcome.
#[derive(Default, Clone)]
struct Cell {
    write_ms: Vec<f64>,
    read_ms: Vec<f64>,
    refused: BTreeMap<String, usize>,
    bad: Vec<String>,
}

/// One concurrent-writer cell outcome.
#[derive(Default)]
struct Conc {
    ms: Vec<f64>,
    statuses: BTreeMap<String, usize>,
    ok: usize,
    attempts: usize,
    bad: Vec<String>,
}

/// Runs the hub benchmark; the in-process Cairn nodes live under `root`.
pub fn run(args: &HubArgs, durabilities: &[Durability], root: &Path) -> Result<()> {
    ensure!(args.runs >= 1, "--runs must be at least 1");
    ensure!(args.rounds >= 1, "--rounds must be at least 1");
    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .timeout(Duration::from_secs(600))
        .build()?;

    // In-process Cairn nodes, one per durability level, on their own runtime.
    let node_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut stops = Vec::new();
    let mut specs: Vec<(String, String, Option<String>)> = Vec::new();
    if !args.no_cairn {
        for d in durabilities {
            let dir = root.join(format!("cairn-node-{}", d.name()));
            let _ = std::fs::remove_dir_all(&dir);
            let config = Config {
                data_dir: dir,
                listen: "127.0.0.1:0".into(),
                durability: *d,
                max_upload_bytes: args.cairn_max_mib << 20,
                leaf_size: args
                    .cairn_leaf_size
                    .unwrap_or(cairn_node::config::DEFAULT_LEAF_SIZE),
                ..Config::default()
            };
            let node = Node::open(config).context("opening the in-process Cairn node")?;
            let bound = node_rt.block_on(Bound::bind(node))?;
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            let addr = bound.addr;
            node_rt.spawn(bound.serve(async {
                let _ = rx.await;
            }));
            stops.push(tx);
            specs.push((
                format!("cairn-{}", d.name()),
                format!("http://{addr}"),
                None,
            ));
        }
    }
    for h in &args.hubs {
        let (label, rest) = h
            .split_once('=')
            .with_context(|| format!("--hub {h:?}: expected LABEL=URL[,READ_URL_PREFIX]"))?;
        let (url, read) = match rest.split_once(',') {
            Some((u, r)) => (u.to_string(), Some(r.to_string())),
            None => (rest.to_string(), None),
        };
        specs.push((
            label.to_string(),
            url.trim_end_matches('/').to_string(),
            read,
        ));
    }
    ensure!(!specs.is_empty(), "no hub to measure");

    let mut hubs = Vec::new();
    for (label, url, read) in specs {
        hubs.push(client_rt.block_on(connect(&http, label, url, read))?);
    }
    // One untimed 1 MB write and read per hub first: connections, caches, JIT (Node.js).
    for h in &hubs {
        let c = client_rt.block_on(file_cell(&http, h, 1_000_000, false, 1, 0, false));
        ensure!(
            c.read_ms.len() == 1 && c.bad.is_empty(),
            "{}: warm-up write and read failed: refused {:?}, {:?}",
            h.label,
            c.refused,
            c.bad
        );
    }
    let baseline = match &args.baseline {
        Some(b) => b.clone(),
        None => args
            .hubs
            .first()
            .and_then(|h| h.split_once('=').map(|(l, _)| l.to_string()))
            .unwrap_or_else(|| hubs[0].label.clone()),
    };

    if args.cold {
        drop_caches().context("--cold")?;
    }
    println!(
        "# cairn bench hub: {} runs per file cell{}, writers {:?} × {} B × {} rounds, {} cores",
        args.runs,
        if args.cold {
            " (page cache emptied before every read)"
        } else {
            ""
        },
        args.writers,
        args.writer_bytes,
        args.rounds,
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    println!();
    println!("| hub | URL | read prefix | limit (MB, hub_info) |");
    println!("| --- | --- | --- | ---: |");
    for h in &hubs {
        println!(
            "| {} | {} | {} | {} |",
            h.label,
            h.url,
            h.read_prefix,
            h.max_mb.map(|m| format!("{m}")).unwrap_or("?".into())
        );
    }
    println!();

    // Raw disk, files.
    let sizes: Vec<usize> = args.file_mb.iter().map(|m| (m * 1e6) as usize).collect();
    let raw = raw_disk(root, &sizes, args.runs, args.cold)?;
    let floor = http_floor(&node_rt, &client_rt, &http, &sizes, args.runs)?;
    let mut files: BTreeMap<(String, usize, bool), Cell> = BTreeMap::new();
    let mut seed = 1u64;
    // The hubs take turns first from cell to cell, and the dirty pages one leaves are
    // written back (untimed) before the next starts: with a fixed order, the writeback of
    // the hubs that do not sync fell into the timed cells of the hubs after them.
    let mut turn = 0usize;
    for &size in &sizes {
        for encrypt in [false, true] {
            turn += 1;
            for j in 0..hubs.len() {
                let h = &hubs[(j + turn) % hubs.len()];
                settle();
                seed += 1;
                let cell = client_rt.block_on(file_cell(
                    &http, h, size, encrypt, args.runs, seed, args.cold,
                ));
                eprintln!(
                    "{:>14} {:>6} {:>9}: write {} ms, read {} ms{}",
                    h.label,
                    mb(size),
                    mode(encrypt),
                    fmt_ms(median(&cell.write_ms)),
                    fmt_ms(median(&cell.read_ms)),
                    if cell.refused.is_empty() {
                        String::new()
                    } else {
                        format!(", refused {:?}", cell.refused)
                    }
                );
                files.insert((h.label.clone(), size, encrypt), cell);
            }
        }
    }
    print_files(&hubs, &sizes, &files, &raw, &baseline);
    print_floor(&hubs, &sizes, &files, &floor);

    // Concurrent writers.
    let mut conc: BTreeMap<(String, usize, bool), Conc> = BTreeMap::new();
    for &n in &args.writers {
        for one_path in [true, false] {
            turn += 1;
            for j in 0..hubs.len() {
                let h = &hubs[(j + turn) % hubs.len()];
                settle();
                seed += 1;
                let c = client_rt.block_on(conc_cell(
                    &http,
                    h,
                    n,
                    one_path,
                    args.writer_bytes,
                    args.rounds,
                    seed,
                ));
                eprintln!(
                    "{:>14} {:>3} writers {:>9}: {}/{} ok {:?}",
                    h.label,
                    n,
                    if one_path { "one path" } else { "N paths" },
                    c.ok,
                    c.attempts,
                    c.statuses
                );
                conc.insert((h.label.clone(), n, one_path), c);
            }
        }
    }
    print_conc(&hubs, &args.writers, &conc);

    // Listing.
    if !args.list_files.is_empty() {
        let mut counts = args.list_files.clone();
        counts.sort_unstable();
        counts.dedup();
        let mut rows = Vec::new();
        for h in &hubs {
            // A fresh address, so the listing holds exactly the files stored for it.
            let lh = client_rt.block_on(connect(
                &http,
                h.label.clone(),
                h.url.clone(),
                Some(h.read_prefix.clone()),
            ))?;
            let mut stored = 0;
            for &n in &counts {
                let t = Instant::now();
                client_rt.block_on(fill_listing(&http, &lh, stored, n))?;
                let fill_s = t.elapsed().as_secs_f64();
                stored = n;
                let l = client_rt.block_on(list_cell(&http, &lh, n, args.runs));
                eprintln!(
                    "{:>14} {n:>7} files (stored in {fill_s:.1} s): first page {} ms, all {} pages {} ms{}",
                    h.label,
                    fmt_ms(median(&l.first_ms)),
                    l.pages,
                    fmt_ms(median(&l.all_ms)),
                    if l.bad.is_empty() {
                        String::new()
                    } else {
                        format!(", {}", checks(&l.bad))
                    }
                );
                rows.push((h.label.clone(), n, l));
            }
        }
        print_listing(&rows, &baseline);
    }

    for tx in stops {
        let _ = tx.send(());
    }
    node_rt.shutdown_timeout(Duration::from_secs(10));
    Ok(())
}

/// Stores files `list/f{i:08}` for `i` in `from..to` (1 byte each), 32 requests in
/// flight; any refusal fails the benchmark.
async fn fill_listing(http: &reqwest::Client, h: &Hub, from: usize, to: usize) -> Result<()> {
    let hub = Arc::new(h.clone());
    let mut tasks = tokio::task::JoinSet::new();
    let mut next = from;
    loop {
        while next < to && tasks.len() < 32 {
            let (http, hub) = (http.clone(), hub.clone());
            let path = format!("list/f{next:08}");
            next += 1;
            tasks.spawn(async move {
                match store(&http, &hub, &path, Bytes::from_static(b"x")).await {
                    Stored::Ok(_) => Ok(()),
                    Stored::Refused(s) | Stored::Bad(s) => {
                        Err(anyhow::anyhow!("{}: storing {path}: {s}", hub.label))
                    }
                }
            });
        }
        match tasks.join_next().await {
            Some(r) => r??,
            None => return Ok(()),
        }
    }
}

/// One `list-files` cell: latency of the first page and of listing every page.
#[derive(Default)]
struct Listing {
    first_ms: Vec<f64>,
    all_ms: Vec<f64>,
    pages: usize,
    bad: Vec<String>,
}

/// Lists every page of `h`'s files `runs` times, following pages as `@stacks/storage`'s
/// `listFiles` does; checks that each listing names exactly `list/f00000000` ..
/// `list/f{n-1}` once each.
async fn list_cell(http: &reqwest::Client, h: &Hub, n: usize, runs: usize) -> Listing {
    let mut out = Listing::default();
    for _ in 0..runs {
        let t = Instant::now();
        let mut page = serde_json::Value::Null;
        let mut names: Vec<String> = Vec::with_capacity(n);
        let mut pages = 0;
        loop {
            let resp = http
                .post(format!("{}/list-files/{}", h.url, h.address))
                .header("authorization", &h.bearer)
                .header("content-type", "application/json")
                .body(serde_json::json!({ "page": page, "stat": false }).to_string())
                .send()
                .await;
            let v: serde_json::Value = match resp {
                Ok(r) if r.status().as_u16() == 202 => match r.bytes().await {
                    Ok(b) => serde_json::from_slice(&b).unwrap_or_default(),
                    Err(e) => {
                        out.bad.push(format!("list-files: {e}"));
                        break;
                    }
                },
                Ok(r) => {
                    out.bad.push(format!("list-files answered {}", r.status()));
                    break;
                }
                Err(e) => {
                    out.bad.push(format!("list-files: {e}"));
                    break;
                }
            };
            pages += 1;
            if pages == 1 {
                out.first_ms.push(t.elapsed().as_secs_f64() * 1e3);
            }
            let listed = match v["entries"].as_array() {
                Some(es) => {
                    names.extend(es.iter().filter_map(|e| e.as_str().map(String::from)));
                    es.len()
                }
                None => {
                    out.bad.push("list-files: no entries".into());
                    break;
                }
            };
            page = v["page"].clone();
            // As `@stacks/storage`'s listFiles: on while there is a next page and this one
            // was not empty.
            if page.is_null() || listed == 0 {
                break;
            }
            if pages > n + 10 {
                out.bad.push("list-files: more pages than files".into());
                break;
            }
        }
        out.all_ms.push(t.elapsed().as_secs_f64() * 1e3);
        out.pages = pages;
        names.sort();
        let want: Vec<String> = (0..n).map(|i| format!("list/f{i:08}")).collect();
        if names != want {
            out.bad.push(format!(
                "listed {} names, expected {n} (first difference at {:?})",
                names.len(),
                names.iter().zip(&want).position(|(a, b)| a != b)
            ));
        }
    }
    out
}

/// The `list-files` table.
fn print_listing(rows: &[(String, usize, Listing)], baseline: &str) {
    println!("## list-files: every page of an address's files (ms; median of the runs)");
    println!();
    println!(
        "| hub | files | pages | first page ms | all pages ms | {baseline} ÷ hub, all pages | checks |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | --- |");
    for (label, n, l) in rows {
        let base = rows
            .iter()
            .find(|(b, m, _)| b == baseline && m == n)
            .map(|(_, _, b)| median(&b.all_ms));
        let ratio = base
            .map(|b| format!("{:.2}×", b / median(&l.all_ms)))
            .unwrap_or_else(|| "—".into());
        println!(
            "| {label} | {n} | {} | {} | {} | {ratio} | {} |",
            l.pages,
            fmt_ms(median(&l.first_ms)),
            fmt_ms(median(&l.all_ms)),
            checks(&l.bad)
        );
    }
    println!();
}

/// Reads `/hub_info` and makes a key and token for the hub.
async fn connect(
    http: &reqwest::Client,
    label: String,
    url: String,
    read: Option<String>,
) -> Result<Hub> {
    let resp = http
        .get(format!("{url}/hub_info"))
        .send()
        .await
        .with_context(|| format!("{label}: GET {url}/hub_info"))?;
    ensure!(
        resp.status().as_u16() == 200,
        "{label}: hub_info answered {}",
        resp.status()
    );
    let info: serde_json::Value = serde_json::from_slice(&resp.bytes().await?)?;
    let challenge = info["challenge_text"]
        .as_str()
        .context("hub_info has no challenge_text")?
        .to_string();
    let read_prefix = match read {
        Some(r) => r,
        None => info["read_url_prefix"]
            .as_str()
            .context("hub_info has no read_url_prefix")?
            .to_string(),
    };
    let max_mb = info["max_file_upload_size_megabytes"].as_f64();
    let mut rng = rand::rng();
    let key = loop {
        let mut b = [0u8; 32];
        rng.fill_bytes(&mut b);
        if let Ok(k) = SigningKey::from_slice(&b) {
            break k;
        }
    };
    let public = key.verifying_key().to_encoded_point(true);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let mut salt = [0u8; 16];
    rng.fill_bytes(&mut salt);
    let payload = serde_json::json!({
        "gaiaChallenge": challenge,
        "iss": hex::encode(public.as_bytes()),
        "exp": now + 24 * 3600,
        "iat": now,
        "salt": hex::encode(salt),
    });
    let input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(br#"{"typ":"JWT","alg":"ES256K"}"#),
        URL_SAFE_NO_PAD.encode(payload.to_string())
    );
    let sig: Signature = key
        .sign_prehash(&Sha256::digest(input.as_bytes()))
        .map_err(|e| anyhow::anyhow!("signing the token: {e}"))?;
    Ok(Hub {
        label,
        url,
        read_prefix,
        max_mb,
        address: p2pkh_address(public.as_bytes()),
        bearer: format!(
            "bearer v1:{input}.{}",
            URL_SAFE_NO_PAD.encode(sig.to_bytes())
        ),
    })
}

/// An ETag without `W/` and quotes.
fn bare_etag(s: &str) -> &str {
    s.trim_start_matches("W/").trim_matches('"')
}

/// Outcome of one store request.
enum Stored {
    /// 202 with a well-formed answer: the etag.
    Ok(String),
    /// Another status (or a transport error): its name.
    Refused(String),
    /// 202 with a wrong answer.
    Bad(String),
}

/// Stores `body` at `path`; checks the answer.
async fn store(http: &reqwest::Client, h: &Hub, path: &str, body: Bytes) -> Stored {
    let resp = match http
        .post(format!("{}/store/{}/{path}", h.url, h.address))
        .header("authorization", &h.bearer)
        .header("content-type", "application/octet-stream")
        .body(body)
        .send()
        .await
    {
        Ok(r) => r,
        Err(e) => return Stored::Refused(format!("error: {e}")),
    };
    let status = resp.status().as_u16();
    let text = match resp.bytes().await {
        Ok(t) => t,
        Err(e) => return Stored::Refused(format!("error: {e}")),
    };
    if status != 202 {
        return Stored::Refused(status.to_string());
    }
    let v: serde_json::Value = match serde_json::from_slice(&text) {
        Ok(v) => v,
        Err(_) => return Stored::Bad(format!("store {path}: answer is not JSON")),
    };
    let want = format!("{}{}/{path}", h.read_prefix, h.address);
    if v["publicURL"].as_str() != Some(want.as_str()) {
        return Stored::Bad(format!(
            "store {path}: publicURL {} (expected {want})",
            v["publicURL"]
        ));
    }
    match v["etag"].as_str() {
        Some(e) if !e.is_empty() => Stored::Ok(bare_etag(e).to_string()),
        _ => Stored::Bad(format!("store {path}: no etag")),
    }
}

/// Reads `path`: (status, bare ETag, body).
async fn read(http: &reqwest::Client, h: &Hub, path: &str) -> Result<(u16, String, Bytes)> {
    let mut resp = http
        .get(format!("{}{}/{path}", h.read_prefix, h.address))
        .send()
        .await?;
    let status = resp.status().as_u16();
    let etag = resp
        .headers()
        .get("etag")
        .and_then(|v| v.to_str().ok())
        .map(|v| bare_etag(v).to_string())
        .unwrap_or_default();
    Ok((status, etag, Bytes::from(collect(&mut resp).await?)))
}

/// A response's whole body, in one buffer of the announced length (as the raw-disk read
/// gets from `fs::read`), not one regrown as chunks arrive; a length over 8 GiB is not
/// trusted up front. The hubs' reads and the HTTP floor's download share it.
async fn collect(resp: &mut reqwest::Response) -> Result<Vec<u8>> {
    let announced = resp.content_length().unwrap_or(0).min(8 << 30) as usize;
    let mut body = Vec::with_capacity(announced);
    while let Some(chunk) = resp.chunk().await? {
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Client-side encryption: `nonce ‖ ChaCha20-Poly1305(plain)`.
fn encrypt(cipher: &ChaCha20Poly1305, plain: &[u8]) -> Result<Vec<u8>> {
    let mut nonce = [0u8; 12];
    rand::rng().fill_bytes(&mut nonce);
    let ct = cipher
        .encrypt(Nonce::from_slice(&nonce), plain)
        .map_err(|_| anyhow::anyhow!("encryption failed"))?;
    let mut out = Vec::with_capacity(12 + ct.len());
    out.extend_from_slice(&nonce);
    out.extend_from_slice(&ct);
    Ok(out)
}

/// Reverses [`encrypt`].
fn decrypt(cipher: &ChaCha20Poly1305, sealed: &[u8]) -> Result<Vec<u8>> {
    ensure!(sealed.len() >= 28, "ciphertext too short");
    cipher
        .decrypt(Nonce::from_slice(&sealed[..12]), &sealed[12..])
        .map_err(|_| anyhow::anyhow!("decryption failed (tag mismatch)"))
}

/// `runs` writes and reads of fresh random files of `size` bytes.
async fn file_cell(
    http: &reqwest::Client,
    h: &Hub,
    size: usize,
    encrypted: bool,
    runs: usize,
    seed: u64,
    cold: bool,
) -> Cell {
    let mut cell = Cell::default();
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut key = [0u8; 32];
    rng.fill_bytes(&mut key);
    let cipher = ChaCha20Poly1305::new((&key).into());
    let tag = rng.next_u64();
    for i in 0..runs {
        let mut plain = vec![0u8; size];
        rng.fill_bytes(&mut plain);
        let plain = Bytes::from(plain);
        let path = format!("bench/files/{tag:016x}-{}-{}-{i}", size, mode(encrypted));
        let t0 = Instant::now();
        let body = if encrypted {
            match encrypt(&cipher, &plain) {
                Ok(c) => Bytes::from(c),
                Err(e) => {
                    cell.bad.push(e.to_string());
                    continue;
                }
            }
        } else {
            plain.clone()
        };
        let etag = match store(http, h, &path, body).await {
            Stored::Ok(e) => e,
            Stored::Refused(s) => {
                *cell.refused.entry(s).or_default() += 1;
                continue;
            }
            Stored::Bad(b) => {
                cell.bad.push(b);
                continue;
            }
        };
        cell.write_ms.push(t0.elapsed().as_secs_f64() * 1e3);
        if cold && let Err(e) = drop_caches() {
            cell.bad.push(format!("emptying the page cache: {e:#}"));
            continue;
        }
        let t0 = Instant::now();
        let got = match read(http, h, &path).await {
            Ok((200, got_etag, body)) => {
                if got_etag != etag {
                    cell.bad
                        .push(format!("read {path}: ETag {got_etag:?}, stored {etag:?}"));
                }
                if encrypted {
                    decrypt(&cipher, &body).map(Bytes::from)
                } else {
                    Ok(body)
                }
            }
            Ok((st, _, _)) => Err(anyhow::anyhow!("read {path}: status {st}")),
            Err(e) => Err(e),
        };
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        match got {
            Ok(b) if b == plain => cell.read_ms.push(ms),
            Ok(b) => cell.bad.push(format!(
                "read {path}: {} bytes differ from the {} written",
                b.len(),
                plain.len()
            )),
            Err(e) => cell.bad.push(e.to_string()),
        }
    }
    cell
}

/// `rounds` rounds of `n` writers released together, to one path or to `n` paths.
async fn conc_cell(
    http: &reqwest::Client,
    h: &Hub,
    n: usize,
    one_path: bool,
    bytes: usize,
    rounds: usize,
    seed: u64,
) -> Conc {
    let mut out = Conc::default();
    let mut rng = SmallRng::seed_from_u64(seed);
    let tag = rng.next_u64();
    let hub = Arc::new(h.clone());
    for r in 0..rounds {
        let barrier = Arc::new(tokio::sync::Barrier::new(n));
        let mut tasks = Vec::new();
        let mut bodies = Vec::new();
        for w in 0..n {
            let mut b = vec![0u8; bytes];
            rng.fill_bytes(&mut b);
            let body = Bytes::from(b);
            let path = if one_path {
                format!("bench/conc/{tag:016x}-{n}-{r}")
            } else {
                format!("bench/conc/{tag:016x}-{n}-{r}-{w}")
            };
            bodies.push((path.clone(), body.clone()));
            let (http, hub, barrier) = (http.clone(), hub.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let t0 = Instant::now();
                let s = store(&http, &hub, &path, body).await;
                (s, t0.elapsed().as_secs_f64() * 1e3)
            }));
        }
        let mut won: Vec<(usize, String)> = Vec::new();
        for (w, t) in tasks.into_iter().enumerate() {
            out.attempts += 1;
            // A writer task that failed to run has no latency: counted as a failure, left
            // out of the percentiles (a 0 there would pull them down).
            let (s, ms) = match t.await {
                Ok((s, ms)) => (s, Some(ms)),
                Err(e) => (Stored::Refused(format!("task: {e}")), None),
            };
            out.ms.extend(ms);
            match s {
                Stored::Ok(e) => {
                    out.ok += 1;
                    *out.statuses.entry("202".into()).or_default() += 1;
                    won.push((w, e));
                }
                Stored::Refused(s) => *out.statuses.entry(s).or_default() += 1,
                Stored::Bad(b) => {
                    *out.statuses.entry("202 (bad answer)".into()).or_default() += 1;
                    out.bad.push(b);
                }
            }
        }
        // Check what the hub holds now.
        if one_path {
            if won.is_empty() {
                continue;
            }
            let path = &bodies[0].0;
            match read(http, &hub, path).await {
                Ok((200, etag, body)) => {
                    let ok = won.iter().any(|(w, e)| *e == etag && bodies[*w].1 == body);
                    if !ok {
                        out.bad.push(format!(
                            "{path}: holds {} bytes under ETag {etag:?}, not the body of a writer answered 202 with that ETag",
                            body.len()
                        ));
                    }
                }
                Ok((st, _, _)) => out.bad.push(format!("read {path}: status {st}")),
                Err(e) => out.bad.push(format!("read {path}: {e}")),
            }
        } else {
            for (w, e) in &won {
                let (path, want) = &bodies[*w];
                match read(http, &hub, path).await {
                    Ok((200, etag, body)) if etag == *e && body == *want => {}
                    Ok((st, etag, body)) => out.bad.push(format!(
                        "read {path}: status {st}, ETag {etag:?} (stored {e:?}), {} bytes, equal: {}",
                        body.len(),
                        body == *want
                    )),
                    Err(err) => out.bad.push(format!("read {path}: {err}")),
                }
            }
        }
    }
    out
}

/// Writes back every dirty page (`sync`, untimed) so the next hub's cells do not pay for
/// the writeback of what an earlier hub left unsynced (Linux; elsewhere nothing).
fn settle() {
    #[cfg(target_os = "linux")]
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe {
        libc::sync()
    };
}

/// Writes back dirty pages (`sync`) and empties the page cache (Linux, as root).
fn drop_caches() -> Result<()> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: sync(2) takes no arguments and cannot fail.
        unsafe { libc::sync() };
        std::fs::write("/proc/sys/vm/drop_caches", b"3")
            .context("emptying the page cache needs root (writing /proc/sys/vm/drop_caches)")
    }
    #[cfg(not(target_os = "linux"))]
    bail!("emptying the page cache is only supported on Linux")
}

/// Raw local disk: per size, (write+fdatasync ms, write without sync ms, read ms) medians.
/// One thread, one sequential `write` of the whole file (then `fdatasync`), and one
/// buffered `read` of it (cold after [`drop_caches`] with `--cold`): what a plain program
/// gets from the disk, not the device's best (parallel or direct I/O may go faster).
fn raw_disk(
    root: &Path,
    sizes: &[usize],
    runs: usize,
    cold: bool,
) -> Result<BTreeMap<usize, [f64; 3]>> {
    let dir = root.join("raw-disk");
    std::fs::create_dir_all(&dir)?;
    let mut rng = SmallRng::seed_from_u64(3);
    let mut out = BTreeMap::new();
    for &size in sizes {
        let mut t = [Vec::new(), Vec::new(), Vec::new()];
        for i in 0..runs {
            let mut data = vec![0u8; size];
            rng.fill_bytes(&mut data);
            for (k, sync) in [(0usize, true), (1, false)] {
                let path = dir.join(format!("{size}-{i}-{k}"));
                let t0 = Instant::now();
                let mut f = std::fs::File::create(&path)?;
                f.write_all(&data)?;
                if sync {
                    f.sync_data()?;
                }
                drop(f);
                t[k].push(t0.elapsed().as_secs_f64() * 1e3);
                if sync {
                    if cold {
                        drop_caches()?;
                    }
                    let t0 = Instant::now();
                    let back = std::fs::read(&path)?;
                    t[2].push(t0.elapsed().as_secs_f64() * 1e3);
                    if back != data {
                        bail!("raw disk: {} read back differs", path.display());
                    }
                }
                std::fs::remove_file(&path)?;
            }
        }
        out.insert(size, [median(&t[0]), median(&t[1]), median(&t[2])]);
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(out)
}

/// The floor of moving a file over HTTP on this machine: the same client moving the same
/// number of bytes over loopback to a server on the nodes' runtime that stores nothing (it
/// reads an upload and drops it; it answers a download from bytes already in memory).
/// Medians of `runs` per size, in ms: `[upload, download]`.
fn http_floor(
    node_rt: &tokio::runtime::Runtime,
    client_rt: &tokio::runtime::Runtime,
    http: &reqwest::Client,
    sizes: &[usize],
    runs: usize,
) -> Result<BTreeMap<usize, [f64; 2]>> {
    use axum::extract::{Path as UrlPath, State};
    use futures_util::StreamExt;

    let largest = sizes.iter().copied().max().unwrap_or(0);
    let mut source = vec![0u8; largest];
    SmallRng::seed_from_u64(5).fill_bytes(&mut source);
    let source = Bytes::from(source);
    let app = axum::Router::new()
        .route(
            "/sink",
            axum::routing::post(|body: axum::body::Body| async move {
                let mut n = 0usize;
                let mut frames = body.into_data_stream();
                while let Some(f) = frames.next().await {
                    match f {
                        Ok(f) => n += f.len(),
                        Err(_) => return (axum::http::StatusCode::BAD_REQUEST, String::new()),
                    }
                }
                (axum::http::StatusCode::OK, n.to_string())
            }),
        )
        .route(
            "/source/{n}",
            axum::routing::get(
                |State(src): State<Bytes>, UrlPath(n): UrlPath<usize>| async move {
                    src.slice(..n.min(src.len()))
                },
            ),
        )
        .with_state(source.clone());
    let listener = node_rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let url = format!("http://{}", listener.local_addr()?);
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    node_rt.spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = rx.await;
            })
            .await;
    });
    let mut out = BTreeMap::new();
    for &size in sizes {
        let (mut up, mut down) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            let body = source.slice(..size);
            let t0 = Instant::now();
            let got = client_rt.block_on(async {
                let resp = http.post(format!("{url}/sink")).body(body).send().await?;
                anyhow::Ok(resp.text().await?)
            })?;
            up.push(t0.elapsed().as_secs_f64() * 1e3);
            ensure!(
                got == size.to_string(),
                "HTTP floor: the sink counted {got} bytes of {size}"
            );
            let t0 = Instant::now();
            let got = client_rt.block_on(async {
                let mut resp = http.get(format!("{url}/source/{size}")).send().await?;
                collect(&mut resp).await
            })?;
            down.push(t0.elapsed().as_secs_f64() * 1e3);
            ensure!(
                got[..] == source[..size],
                "HTTP floor: the download differs"
            );
        }
        out.insert(size, [median(&up), median(&down)]);
    }
    let _ = tx.send(());
    Ok(out)
}

/// Each hub's median plain write (or read) of `size` bytes divided by `base` ms, as
/// `label ratio×`, comma-separated.
fn plain_ratios(
    hubs: &[Hub],
    files: &BTreeMap<(String, usize, bool), Cell>,
    size: usize,
    write: bool,
    base: f64,
) -> String {
    hubs.iter()
        .filter_map(|h| {
            let c = files.get(&(h.label.clone(), size, false))?;
            let v = if write { &c.write_ms } else { &c.read_ms };
            Some(format!("{} {:.2}×", h.label, median(v) / base))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Each hub's plain transfers against the HTTP floor ([`http_floor`]).
fn print_floor(
    hubs: &[Hub],
    sizes: &[usize],
    files: &BTreeMap<(String, usize, bool), Cell>,
    floor: &BTreeMap<usize, [f64; 2]>,
) {
    println!(
        "## HTTP floor: the same client and bytes over loopback to a server that stores nothing (median of the same runs)"
    );
    println!();
    println!(
        "| size | upload ms | MB/s | download ms | MB/s | each hub's plain write ÷ upload | each hub's plain read ÷ download |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | --- | --- |");
    for &size in sizes {
        let Some(f) = floor.get(&size) else { continue };
        let ratio = |write: bool| plain_ratios(hubs, files, size, write, f[usize::from(!write)]);
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            mb(size),
            fmt_ms(f[0]),
            mbps(size, f[0]),
            fmt_ms(f[1]),
            mbps(size, f[1]),
            ratio(true),
            ratio(false)
        );
    }
    println!();
}

fn mode(encrypted: bool) -> &'static str {
    if encrypted { "encrypted" } else { "plain" }
}

fn mb(size: usize) -> String {
    format!("{} MB", size as f64 / 1e6)
}

/// Nearest-rank percentile `p` (0..=100) of `v`; NaN when empty.
fn percentile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * s.len() as f64).ceil().max(1.0) as usize;
    s[rank.min(s.len()) - 1]
}

fn median(v: &[f64]) -> f64 {
    percentile(v, 50.0)
}

fn fmt_ms(x: f64) -> String {
    if x.is_nan() {
        "—".into()
    } else if x < 10.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.1}")
    }
}

fn mbps(size: usize, ms: f64) -> String {
    if ms.is_nan() {
        "—".into()
    } else {
        format!("{:.0}", size as f64 / 1e3 / ms)
    }
}

fn checks(bad: &[String]) -> String {
    if bad.is_empty() {
        "all ok".into()
    } else {
        for b in bad {
            eprintln!("check failed: {b}");
        }
        format!("{} FAILED", bad.len())
    }
}

fn print_files(
    hubs: &[Hub],
    sizes: &[usize],
    files: &BTreeMap<(String, usize, bool), Cell>,
    raw: &BTreeMap<usize, [f64; 3]>,
    baseline: &str,
) {
    println!("## Files: write and read latency (ms; median and p95, nearest rank)");
    println!();
    println!(
        "| hub | size | mode | write p50 | write p95 | read p50 | read p95 | write MB/s | read MB/s | refused | checks |"
    );
    println!("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |");
    for &size in sizes {
        for encrypted in [false, true] {
            for h in hubs {
                let Some(c) = files.get(&(h.label.clone(), size, encrypted)) else {
                    continue;
                };
                let refused = if c.refused.is_empty() {
                    "—".to_string()
                } else {
                    c.refused
                        .iter()
                        .map(|(s, n)| format!("{n}× {s}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                println!(
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    h.label,
                    mb(size),
                    mode(encrypted),
                    fmt_ms(median(&c.write_ms)),
                    fmt_ms(percentile(&c.write_ms, 95.0)),
                    fmt_ms(median(&c.read_ms)),
                    fmt_ms(percentile(&c.read_ms, 95.0)),
                    mbps(size, median(&c.write_ms)),
                    mbps(size, median(&c.read_ms)),
                    refused,
                    checks(&c.bad)
                );
            }
        }
    }
    println!();
    if hubs.iter().any(|h| h.label == baseline) && hubs.len() > 1 {
        println!(
            "## Speed-up over {baseline} (its median ÷ the hub's median; > 1: faster than {baseline})"
        );
        println!();
        println!("| hub | size | mode | write | read |");
        println!("| --- | ---: | --- | ---: | ---: |");
        for &size in sizes {
            for encrypted in [false, true] {
                let Some(b) = files.get(&(baseline.to_string(), size, encrypted)) else {
                    continue;
                };
                for h in hubs.iter().filter(|h| h.label != baseline) {
                    let Some(c) = files.get(&(h.label.clone(), size, encrypted)) else {
                        continue;
                    };
                    let r = |a: &[f64], b: &[f64]| {
                        let x = median(a) / median(b);
                        if x.is_nan() {
                            "—".to_string()
                        } else {
                            format!("{x:.2}×")
                        }
                    };
                    println!(
                        "| {} | {} | {} | {} | {} |",
                        h.label,
                        mb(size),
                        mode(encrypted),
                        r(&b.write_ms, &c.write_ms),
                        r(&b.read_ms, &c.read_ms)
                    );
                }
            }
        }
        println!();
    }
    println!("## Raw local disk, same directory's file system (median of the same runs)");
    println!();
    println!(
        "| size | write+fdatasync ms | MB/s | write, no sync ms | MB/s | read ms | MB/s | each hub's plain write ÷ raw write+fdatasync time (the like for like of a hub that syncs: cairn-group) | each hub's plain write ÷ raw write time, no sync (the like for like of a hub that does not: cairn-buffered, Gaia's disk driver) | each hub's plain read ÷ raw read time |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |");
    for &size in sizes {
        let Some(r) = raw.get(&size) else { continue };
        let ratio = |idx: usize| plain_ratios(hubs, files, size, idx < 2, r[idx]);
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            mb(size),
            fmt_ms(r[0]),
            mbps(size, r[0]),
            fmt_ms(r[1]),
            mbps(size, r[1]),
            fmt_ms(r[2]),
            mbps(size, r[2]),
            ratio(0),
            ratio(1),
            ratio(2)
        );
    }
    println!();
}

fn print_conc(hubs: &[Hub], writers: &[usize], conc: &BTreeMap<(String, usize, bool), Conc>) {
    if writers.is_empty() {
        return;
    }
    println!("## Concurrent writers (every attempt's latency, ms)");
    println!();
    println!(
        "| hub | writers | target | attempts | 202 | failed | failure rate | statuses | p50 | p95 | p99 | max | checks |"
    );
    println!(
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- |"
    );
    for &n in writers {
        for one_path in [true, false] {
            for h in hubs {
                let Some(c) = conc.get(&(h.label.clone(), n, one_path)) else {
                    continue;
                };
                let failed = c.attempts - c.ok;
                let statuses = c
                    .statuses
                    .iter()
                    .map(|(s, k)| format!("{k}× {s}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                println!(
                    "| {} | {n} | {} | {} | {} | {failed} | {:.1}% | {statuses} | {} | {} | {} | {} | {} |",
                    h.label,
                    if one_path { "one path" } else { "N paths" },
                    c.attempts,
                    c.ok,
                    100.0 * failed as f64 / c.attempts.max(1) as f64,
                    fmt_ms(median(&c.ms)),
                    fmt_ms(percentile(&c.ms, 95.0)),
                    fmt_ms(percentile(&c.ms, 99.0)),
                    fmt_ms(percentile(&c.ms, 100.0)),
                    checks(&c.bad)
                );
            }
        }
    }
    println!();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writers_and_cold_parse() {
        #[derive(clap::Parser)]
        struct T {
            #[command(flatten)]
            a: HubArgs,
        }
        use clap::Parser;
        let p = |args: &[&str]| T::try_parse_from([&["bench"], args].concat()).unwrap().a;
        assert_eq!(p(&[]).writers, vec![1, 2, 10, 100]);
        assert!(!p(&[]).cold);
        assert!(p(&["--writers"]).writers.is_empty());
        assert!(p(&["--writers", "--cold"]).cold);
        assert_eq!(p(&["--writers", "3,4"]).writers, vec![3, 4]);
        assert!(T::try_parse_from(["bench", "--writers", "x"]).is_err());
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v = [5.0, 1.0, 4.0, 2.0, 3.0];
        assert_eq!(median(&v), 3.0);
        assert_eq!(percentile(&v, 95.0), 5.0);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert!(percentile(&[], 50.0).is_nan());
    }

    #[test]
    fn encryption_round_trips_and_detects_tampering() {
        let cipher = ChaCha20Poly1305::new((&[7u8; 32]).into());
        let sealed = encrypt(&cipher, b"hello hub").unwrap();
        assert_eq!(sealed.len(), 9 + 28);
        assert_eq!(decrypt(&cipher, &sealed).unwrap(), b"hello hub");
        let mut bad = sealed.clone();
        bad[20] ^= 1;
        assert!(decrypt(&cipher, &bad).is_err());
    }

    #[test]
    fn etags_compare_without_quotes() {
        assert_eq!(bare_etag("W/\"abc\""), "abc");
        assert_eq!(bare_etag("abc"), "abc");
    }
}

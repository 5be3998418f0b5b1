//! `cairn bench`: benchmarks that anyone can re-run; their results, with the anchors they
//! are measured against, are recorded in `docs/benchmarks.md`.
//!
//! `cairn bench forkbase` runs the ForkBase micro-benchmark (paper Table 3: Put-String,
//! Put-Blob, Put-Map, Get-String, Get-Blob-Meta, Get-Blob-Full, Get-Map-Full, Track, Fork)
//! at each request size, on the embedded store at each durability level, with N concurrent
//! client threads (the paper used 32 clients against one servlet; here they call the store
//! in process). Full reads (Get-String, Get-Blob-Full, Get-Map-Full) compare what they
//! get back, byte for byte, with what was written (Get-Blob-Meta checks the size, Track
//! the version found); puts and forks check that they succeeded; every put writes fresh
//! random content (no accidental dedup). It then measures dedup (100 successive edited
//! versions of a 10 MB blob against the ideal) and Blob put throughput (chunking, hashing
//! and the store's write: the tree built on one thread, a committed put on one thread, and a committed
//! streamed put hashing on a second thread).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use cairn_object::postree::{self, TreeConfig};
use cairn_object::{At, Db, NewValue, Op, PutOptions, Target, Value};
use cairn_store::{
    ChunkStore, Durability, HashAlgo, LogStore, LogStoreOptions, MemoryStore, Store,
};
use clap::{Args, ValueEnum};
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};

/// Which benchmark to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Which {
    /// ForkBase Table 3 operations, dedup and blob throughput.
    Forkbase,
    /// DataCapsule evaluation (DCS §6): sequential write/read/prove, manyclient, YCSB
    /// against redb, concurrent clients, Merkle-log proofs (see `bench_capsule`).
    Capsule,
    /// Gaia-protocol hubs side by side (issue 4): file write/read latency plain and
    /// client-encrypted, concurrent writers, raw disk (see `bench_hub`).
    Hub,
}

/// Arguments of `cairn bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Which benchmark.
    #[arg(value_enum)]
    pub which: Which,
    /// Concurrent client threads.
    #[arg(long, default_value_t = 32)]
    pub clients: usize,
    /// Seconds each operation runs for.
    #[arg(long, default_value_t = 1.5)]
    pub seconds: f64,
    /// Durability levels to run (comma-separated; forkbase default: fsync,group,buffered;
    /// capsule default: group).
    #[arg(long, value_delimiter = ',')]
    pub durability: Vec<Durability>,
    /// Request sizes in bytes (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1024,20480")]
    pub sizes: Vec<usize>,
    /// Operations to run (comma-separated names from Table 3; default all).
    #[arg(long, value_delimiter = ',')]
    pub ops: Vec<String>,
    /// Directory for the benchmark stores (default: a new directory under the system
    /// temporary directory, removed afterwards).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Skip the dedup and blob-throughput parts.
    #[arg(long)]
    pub no_dedup: bool,
    /// Size of the blob for the throughput measurement, in MiB.
    #[arg(long, default_value_t = 512)]
    pub throughput_mib: usize,
    /// Average POS-tree leaf size in bytes for `forkbase` (Table 3, dedup, throughput).
    #[arg(long, default_value_t = 4096)]
    pub leaf_size: u64,
    /// `forkbase`: run Table 3 against a `cairn serve` node in this process over loopback
    /// HTTP (the native API, one keep-alive connection per client), as the paper's clients
    /// reached its servlet over the network, instead of calling the store in process.
    #[arg(long)]
    pub over_http: bool,
    /// Options of `cairn bench capsule` (boxed: `cli::Command` stays small).
    #[command(flatten)]
    pub capsule: Box<crate::bench_capsule::CapsuleArgs>,
    /// Options of `cairn bench hub` (boxed: `cli::Command` stays small).
    #[command(flatten)]
    pub hub: Box<crate::bench_hub::HubArgs>,
}

const OPS: [&str; 9] = [
    "Put-String",
    "Put-Blob",
    "Put-Map",
    "Get-String",
    "Get-Blob-Meta",
    "Get-Blob-Full",
    "Get-Map-Full",
    "Track",
    "Fork",
];

/// The ForkBase paper's Table 3 (32 clients, one servlet, E5-1650 3.5 GHz, HDD), as
/// (ops/s at 1 KB, ops/s at 20 KB).
fn paper(op: &str) -> (f64, f64) {
    match op {
        "Put-String" => (75.0e3, 8.3e3),
        "Put-Blob" => (37.5e3, 5.7e3),
        "Put-Map" => (35.8e3, 4.7e3),
        "Get-String" => (78.3e3, 56.9e3),
        "Get-Blob-Meta" => (99.7e3, 100.4e3),
        "Get-Blob-Full" => (38.4e3, 4.9e3),
        "Get-Map-Full" => (38.2e3, 5.0e3),
        "Track" => (97.8e3, 96.0e3),
        "Fork" => (113.6e3, 109.4e3),
        _ => (f64::NAN, f64::NAN),
    }
}

/// Runs a benchmark.
pub fn run(args: &BenchArgs) -> Result<ExitCode> {
    match args.which {
        Which::Forkbase => forkbase(args)?,
        Which::Capsule => capsule(args)?,
        Which::Hub => {
            let root = bench_root(args)?;
            let levels = durabilities(args, &[Durability::Group]);
            crate::bench_hub::run(&args.hub, &levels, &root.0)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

struct TempDir(PathBuf, bool);
impl Drop for TempDir {
    fn drop(&mut self) {
        if self.1 {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn bench_root(args: &BenchArgs) -> Result<TempDir> {
    let root = match &args.dir {
        Some(d) => TempDir(d.clone(), false),
        None => TempDir(
            std::env::temp_dir().join(format!("cairn-bench-{}", std::process::id())),
            true,
        ),
    };
    std::fs::create_dir_all(&root.0).with_context(|| format!("creating {}", root.0.display()))?;
    Ok(root)
}

fn capsule(args: &BenchArgs) -> Result<()> {
    let root = bench_root(args)?;
    for d in durabilities(args, &[Durability::Group]) {
        crate::bench_capsule::run(&args.capsule, d, &root.0)?;
    }
    Ok(())
}

/// The `--durability` levels, or `default` when none were given.
fn durabilities(args: &BenchArgs, default: &[Durability]) -> Vec<Durability> {
    if args.durability.is_empty() {
        default.to_vec()
    } else {
        args.durability.clone()
    }
}

fn forkbase(args: &BenchArgs) -> Result<()> {
    let cfg = TreeConfig::default().with_leaf_target(args.leaf_size)?;
    let ops: Vec<&str> = if args.ops.is_empty() {
        OPS.to_vec()
    } else {
        for o in &args.ops {
            ensure!(
                OPS.contains(&o.as_str()),
                "unknown op {o:?}; ops: {}",
                OPS.join(", ")
            );
        }
        OPS.iter()
            .copied()
            .filter(|o| args.ops.iter().any(|a| a == o))
            .collect()
    };
    ensure!(args.clients >= 1, "--clients must be at least 1");
    let root = bench_root(args)?;
    let levels = durabilities(args, &Durability::ALL);
    println!(
        "# cairn bench forkbase: {} clients, {:.1} s per cell, {} cores, {}-byte leaves, {}, store in {}",
        args.clients,
        args.seconds,
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        args.leaf_size,
        if args.over_http {
            "clients over loopback HTTP to a node in this process (the native API)"
        } else {
            "clients calling the embedded store in this process (no network)"
        },
        root.0.display()
    );
    println!();
    // results[(durability, op, size)] = (ops/s, mean latency ms)
    let mut results: BTreeMap<(usize, &str, usize), (f64, f64)> = BTreeMap::new();
    for (di, d) in levels.iter().enumerate() {
        let dir = root.0.join(format!("store-{}", d.name()));
        let _ = std::fs::remove_dir_all(&dir);
        let (log, own_db, node) = if args.over_http {
            let node = HttpNode::start(&dir, *d, args.leaf_size)?;
            (None, None, Some(node))
        } else {
            let log = Arc::new(LogStore::open(
                &dir,
                LogStoreOptions {
                    durability: *d,
                    algo: HashAlgo::Blake3,
                    ..Default::default()
                },
            )?);
            let store: Arc<dyn Store> = log.clone();
            (Some(log), Some(Db::with_config(store, cfg)), None)
        };
        let db: &Db = own_db
            .as_ref()
            .or(node.as_ref().map(|n| n.bucket.db()))
            .context("no store to run against")?;
        let counters = || log.as_ref().map(|l| l.commit_counters());
        for &size in &args.sizes {
            let fixture = Fixture::prepare(db, args.clients, size)?;
            for op in &ops {
                let c0 = counters();
                let cpu0 = process_cpu_seconds();
                let r = run_op(db, node.as_ref(), &fixture, op, size, args)?;
                let cpu1 = process_cpu_seconds();
                let c1 = counters();
                let cpu = match (cpu0, cpu1) {
                    (Some(a), Some(b)) => {
                        format!(", {:.1} µs CPU/op", (b - a) * 1e6 / (r.0 * r.2).max(1.0))
                    }
                    _ => String::new(),
                };
                let commits = match (c0, c1) {
                    (Some(c0), Some(c1)) => format!(
                        "{:.1} commits/group, {:.0} µs/fdatasync",
                        (c1.commits - c0.commits) as f64 / (c1.groups - c0.groups).max(1) as f64,
                        (c1.sync_micros - c0.sync_micros) as f64
                            / (c1.syncs - c0.syncs).max(1) as f64
                    ),
                    _ => "over HTTP".to_string(),
                };
                eprintln!(
                    "{:>8} {:>14} {:>6} B: {:>10.0} ops/s  {:>8.3} ms  ({commits}{cpu})",
                    d.name(),
                    op,
                    size,
                    r.0,
                    r.1,
                );
                let r = (r.0, r.1);
                results.insert((di, op, size), r);
            }
        }
        drop(own_db);
        drop(node);
        let _ = std::fs::remove_dir_all(&dir);
    }
    print_table(args, &levels, &ops, &results);
    if args.over_http && !args.no_dedup {
        println!("(dedup and blob throughput below run in process, not over HTTP)\n");
    }
    if !args.no_dedup {
        dedup(&root.0, cfg)?;
        throughput(&root.0, args.throughput_mib, cfg)?;
    }
    Ok(())
}

fn print_table(
    args: &BenchArgs,
    levels: &[Durability],
    ops: &[&str],
    results: &BTreeMap<(usize, &str, usize), (f64, f64)>,
) {
    for (di, d) in levels.iter().enumerate() {
        println!("## durability: {d}");
        println!();
        let mut head = String::from("| operation |");
        let mut rule = String::from("| --- |");
        for s in &args.sizes {
            head += &format!(" {} ops/s | paper | ratio | mean ms |", human(*s));
            rule += " ---: | ---: | ---: | ---: |";
        }
        println!("{head}");
        println!("{rule}");
        for op in ops {
            let mut row = format!("| {op} |");
            for &s in &args.sizes {
                let (tput, lat) = results
                    .get(&(di, op, s))
                    .copied()
                    .unwrap_or((f64::NAN, f64::NAN));
                let p = match s {
                    1024 => paper(op).0,
                    20480 => paper(op).1,
                    _ => f64::NAN,
                };
                row += &format!(
                    " {} | {} | {:.2}× | {:.3} |",
                    kilo(tput),
                    kilo(p),
                    tput / p,
                    lat
                );
            }
            println!("{row}");
        }
        println!();
    }
}

fn human(n: usize) -> String {
    if n.is_multiple_of(1024) {
        format!("{} KB", n / 1024)
    } else {
        format!("{n} B")
    }
}

fn kilo(x: f64) -> String {
    if x.is_nan() {
        "n/a".into()
    } else {
        format!("{:.1}K", x / 1000.0)
    }
}

/// Keys prepared before the read operations run.
struct Fixture {
    keys_per_client: usize,
    size: usize,
    map_entries: usize,
    /// The value each read key's head holds, by `client * keys_per_client + i`: every
    /// read is compared with it (a store answering the right length of wrong bytes, or an
    /// older version, fails the run).
    strings: Vec<Vec<u8>>,
    blobs: Vec<Vec<u8>>,
    maps: Vec<BTreeMap<Vec<u8>, Vec<u8>>>,
}

impl Fixture {
    fn index(&self, client: usize, i: usize) -> usize {
        client * self.keys_per_client + i
    }
}

/// Bytes of a Table 3 map entry's key.
const MAP_KEY: usize = 16;
/// Bytes of a Table 3 map entry's value.
const MAP_VALUE: usize = 84;

fn map_value(rng: &mut SmallRng, size: usize) -> (NewValue, usize) {
    let (m, n) = map_entries_of(rng, size);
    (NewValue::Map(m), n)
}

/// The entries of a Table 3 map of about `size` bytes, and how many.
fn map_entries_of(rng: &mut SmallRng, size: usize) -> (BTreeMap<Vec<u8>, Vec<u8>>, usize) {
    // Entries of 100 bytes: a 16-byte key and an 84-byte value, random letters and digits
    // (so the HTTP text form `key=value` carries them unchanged).
    let n = (size / 100).max(1);
    let mut m = BTreeMap::new();
    while m.len() < n {
        m.insert(alnum(rng, MAP_KEY), alnum(rng, MAP_VALUE));
    }
    (m, n)
}

fn alnum(rng: &mut SmallRng, n: usize) -> Vec<u8> {
    const SET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    (0..n)
        .map(|_| SET[rng.random_range(0..SET.len())])
        .collect()
}

fn random_bytes(rng: &mut SmallRng, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rng.fill_bytes(&mut v);
    v
}

fn read_key(kind: &str, size: usize, client: usize, i: usize) -> String {
    format!("read-{kind}-{size}-{client}-{i}")
}

impl Fixture {
    fn prepare(db: &Db, clients: usize, size: usize) -> Result<Fixture> {
        let keys_per_client = 32;
        let mut rng = SmallRng::seed_from_u64(size as u64);
        let opts = PutOptions::default();
        let mut map_entries = 0;
        let (mut strings, mut blobs, mut maps) = (Vec::new(), Vec::new(), Vec::new());
        for c in 0..clients {
            for i in 0..keys_per_client {
                for kind in ["string", "blob", "map"] {
                    let key = read_key(kind, size, c, i);
                    // Two versions each, so Track has a base to find; the second is kept
                    // to compare reads with.
                    for version in 0..2 {
                        let v = match kind {
                            "string" => {
                                let b = random_bytes(&mut rng, size);
                                if version == 1 {
                                    strings.push(b.clone());
                                }
                                NewValue::String(b)
                            }
                            "blob" => {
                                let b = random_bytes(&mut rng, size);
                                if version == 1 {
                                    blobs.push(b.clone());
                                }
                                NewValue::Blob(b)
                            }
                            _ => {
                                let (m, n) = map_entries_of(&mut rng, size);
                                map_entries = n;
                                if version == 1 {
                                    maps.push(m.clone());
                                }
                                NewValue::Map(m)
                            }
                        };
                        db.put(key.as_bytes(), Target::Branch("master"), v, &opts)?;
                    }
                }
            }
        }
        Ok(Fixture {
            keys_per_client,
            size,
            map_entries,
            strings,
            blobs,
            maps,
        })
    }
}

/// CPU time (user + system) this process has used so far, all threads included, from
/// `/proc/self/stat` (Linux; `None` elsewhere). Clock ticks of 1/100 s.
pub(crate) fn process_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which is in parentheses and may hold spaces): state is
    // field 3, utime field 14, stime field 15.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut f = rest.split_whitespace().skip(11);
    let utime: f64 = f.next()?.parse().ok()?;
    let stime: f64 = f.next()?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

/// Runs one operation with all clients for the configured time; returns (ops/s, mean ms,
/// seconds elapsed).
fn run_op(
    db: &Db,
    node: Option<&HttpNode>,
    fx: &Fixture,
    op: &str,
    size: usize,
    args: &BenchArgs,
) -> Result<(f64, f64, f64)> {
    let total_ops = AtomicU64::new(0);
    let total_ns = AtomicU64::new(0);
    let deadline = Duration::from_secs_f64(args.seconds);
    let start = Instant::now();
    std::thread::scope(|s| -> Result<()> {
        let mut handles = Vec::new();
        for c in 0..args.clients {
            let total_ops = &total_ops;
            let total_ns = &total_ns;
            handles.push(s.spawn(move || -> Result<()> {
                // Salted apart from the fixture's seed (`size`), which client 0's would equal:
                // its puts would repeat the fixture's bytes and be deduplicated.
                let mut rng = SmallRng::seed_from_u64(
                    ((c as u64) << 32 | size as u64) ^ 0x7ab1_e3c1_1e47_0000,
                );
                let opts = PutOptions::default();
                // One keep-alive connection per client, driven on the client's own thread
                // (reqwest's async client on a current-thread runtime: the blocking client
                // would hand every request to a thread of its own and back).
                let http = match node {
                    Some(_) => Some(BenchClient::new()?),
                    None => None,
                };
                let mut n = 0u64;
                let mut busy = Duration::ZERO;
                while start.elapsed() < deadline {
                    let i = n as usize;
                    let k = i % fx.keys_per_client;
                    // Inputs are made before the clock starts. Embedded, only the store's
                    // work is timed; over HTTP also the client's (the request's URL and
                    // body text, the answer's parse), as a real client pays it.
                    let input = match op {
                        "Put-String" => Some(NewValue::String(random_bytes(&mut rng, size))),
                        "Put-Blob" => Some(NewValue::Blob(random_bytes(&mut rng, size))),
                        "Put-Map" => Some(map_value(&mut rng, size).0),
                        _ => None,
                    };
                    let t0 = Instant::now();
                    match (node, &http) {
                        (Some(node), Some(http)) => {
                            node.one_op(http, fx, op, c, k, i, input, &mut rng)?
                        }
                        _ => one_op(db, fx, op, c, k, i, input, &opts, &mut rng)?,
                    }
                    busy += t0.elapsed();
                    n += 1;
                }
                total_ops.fetch_add(n, Ordering::Relaxed);
                total_ns.fetch_add(busy.as_nanos() as u64, Ordering::Relaxed);
                Ok(())
            }));
        }
        for h in handles {
            match h.join() {
                Ok(r) => r?,
                Err(_) => bail!("a benchmark client panicked"),
            }
        }
        Ok(())
    })?;
    let elapsed = start.elapsed().as_secs_f64();
    let n = total_ops.load(Ordering::Relaxed) as f64;
    let mean_ms = total_ns.load(Ordering::Relaxed) as f64 / n.max(1.0) / 1e6;
    Ok((n / elapsed, mean_ms, elapsed))
}

#[allow(clippy::too_many_arguments)]
fn one_op(
    db: &Db,
    fx: &Fixture,
    op: &str,
    c: usize,
    k: usize,
    i: usize,
    input: Option<NewValue>,
    opts: &PutOptions,
    rng: &mut SmallRng,
) -> Result<()> {
    let size = fx.size;
    let master = At::Branch("master".into());
    match op {
        "Put-String" | "Put-Blob" | "Put-Map" => {
            let key = format!("{op}-{size}-{c}-{k}");
            let v = input.context("missing input")?;
            db.put(key.as_bytes(), Target::Branch("master"), v, opts)?;
        }
        "Get-String" => {
            let v = db.get(read_key("string", size, c, k).as_bytes(), &master)?;
            match &v.object.value {
                Value::String(b) => ensure!(
                    b[..] == fx.strings[fx.index(c, k)][..],
                    "Get-String returned other bytes than the head's ({} bytes)",
                    b.len()
                ),
                other => bail!("Get-String returned a {}", other.value_type()),
            }
        }
        "Get-Blob-Meta" => {
            let v = db.get(read_key("blob", size, c, k).as_bytes(), &master)?;
            let t = v.object.value.tree().context("Get-Blob-Meta: not a blob")?;
            ensure!(t.count == size as u64, "Get-Blob-Meta: size {}", t.count);
        }
        "Get-Blob-Full" => {
            let v = db.get(read_key("blob", size, c, k).as_bytes(), &master)?;
            let t = v.object.value.tree().context("Get-Blob-Full: not a blob")?;
            let bytes = postree::blob_read(db.chunks(), t, 0, t.count)?;
            ensure!(
                bytes == fx.blobs[fx.index(c, k)],
                "Get-Blob-Full returned other bytes than the head's ({} bytes)",
                bytes.len()
            );
        }
        "Get-Map-Full" => {
            let v = db.get(read_key("map", size, c, k).as_bytes(), &master)?;
            let t = v.object.value.tree().context("Get-Map-Full: not a map")?;
            let mut want = fx.maps[fx.index(c, k)].iter();
            let mut n = 0;
            for e in postree::iter(db.chunks(), t) {
                let e = e?;
                ensure!(
                    want.next().is_some_and(
                        |(wk, wv)| e.key[..] == wk[..] && e.value.as_deref() == Some(&wv[..])
                    ),
                    "Get-Map-Full: entry {n} is not the head's"
                );
                n += 1;
            }
            ensure!(n == fx.map_entries, "Get-Map-Full returned {n} entries");
        }
        "Track" => {
            let key = read_key("blob", size, c, k);
            let t = db.track(key.as_bytes(), &master, 1, 1)?;
            ensure!(
                t.len() == 1 && t[0].distance == 1,
                "Track found {} versions",
                t.len()
            );
        }
        "Fork" => {
            let key = read_key("string", size, c, k);
            let name = format!("f{i}-{}", rng.random::<u32>());
            db.fork(key.as_bytes(), &master, &name)?;
        }
        other => bail!("unknown op {other}"),
    }
    Ok(())
}

/// A `cairn serve` node in this process on a loopback port, with an open bucket the
/// Table 3 clients reach through the native HTTP API (`--over-http`).
struct HttpNode {
    base: String,
    bucket: Arc<cairn_capsule::Bucket>,
    _rt: tokio::runtime::Runtime,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for HttpNode {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// One `--over-http` client: reqwest's async client on a current-thread runtime, so each
/// request is driven on the calling thread.
struct BenchClient {
    rt: tokio::runtime::Runtime,
    http: reqwest::Client,
}

impl BenchClient {
    fn new() -> Result<BenchClient> {
        Ok(BenchClient {
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?,
            http: reqwest::Client::new(),
        })
    }
}

/// The bucket `--over-http` runs in.
const HTTP_BUCKET: &str = "table3";

impl HttpNode {
    fn start(dir: &Path, durability: Durability, leaf_size: u64) -> Result<HttpNode> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let config = cairn_node::Config {
            data_dir: dir.to_path_buf(),
            listen: "127.0.0.1:0".into(),
            durability,
            leaf_size,
            ..cairn_node::Config::default()
        };
        let node = cairn_node::Node::open(config).context("opening the in-process node")?;
        let bound = rt.block_on(cairn_node::Bound::bind(node.clone()))?;
        let addr = bound.addr;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        rt.spawn(bound.serve(async {
            let _ = rx.await;
        }));
        // An open bucket (no owner key): requests are not signed, as ForkBase's are not.
        let created = reqwest::blocking::Client::new()
            .post(format!("http://{addr}/v1/buckets"))
            .header("content-type", "application/json")
            .body(serde_json::json!({ "name": HTTP_BUCKET }).to_string())
            .send()
            .context("creating the benchmark's bucket")?;
        ensure!(
            created.status().as_u16() == 201,
            "creating the benchmark's bucket: HTTP {}",
            created.status()
        );
        let bucket = node.bucket(HTTP_BUCKET)?;
        let base = format!("http://{addr}/v1/buckets/{HTTP_BUCKET}");
        Ok(HttpNode {
            base,
            bucket,
            _rt: rt,
            stop: Some(tx),
        })
    }

    /// Sends one request on `client`, checking its status; the answer's body.
    fn call(
        &self,
        client: &BenchClient,
        req: reqwest::RequestBuilder,
        want: u16,
        op: &str,
    ) -> Result<bytes::Bytes> {
        client.rt.block_on(async {
            let resp = req.send().await.with_context(|| format!("{op}: sending"))?;
            let status = resp.status().as_u16();
            let body = resp
                .bytes()
                .await
                .with_context(|| format!("{op}: reading"))?;
            ensure!(
                status == want,
                "{op}: HTTP {status}: {}",
                String::from_utf8_lossy(&body)
            );
            Ok(body)
        })
    }

    /// [`one_op`] through the node's native API.
    #[allow(clippy::too_many_arguments)]
    fn one_op(
        &self,
        client: &BenchClient,
        fx: &Fixture,
        op: &str,
        c: usize,
        k: usize,
        i: usize,
        input: Option<NewValue>,
        rng: &mut SmallRng,
    ) -> Result<()> {
        let size = fx.size;
        let url = |route: &str, key: &str| format!("{}/{route}/{key}", self.base);
        match op {
            "Put-String" | "Put-Blob" | "Put-Map" => {
                let key = format!("{op}-{size}-{c}-{k}");
                let (ty, body) = match input.context("missing input")? {
                    NewValue::String(b) => ("string", b),
                    NewValue::Blob(b) => ("blob", b),
                    NewValue::Map(m) => ("map", map_text(&m)),
                    other => bail!("no HTTP form for {:?}", other.value_type()),
                };
                let req = client
                    .http
                    .put(format!("{}?type={ty}", url("objects", &key)))
                    .body(body);
                self.call(client, req, 201, op)?;
            }
            "Get-String" | "Get-Blob-Full" => {
                let kind = if op == "Get-String" { "string" } else { "blob" };
                let b = self.call(
                    client,
                    client.http.get(url("objects", &read_key(kind, size, c, k))),
                    200,
                    op,
                )?;
                let want = if op == "Get-String" {
                    &fx.strings[fx.index(c, k)]
                } else {
                    &fx.blobs[fx.index(c, k)]
                };
                ensure!(
                    b[..] == want[..],
                    "{op} returned other bytes than the head's ({} bytes)",
                    b.len()
                );
            }
            "Get-Blob-Meta" => {
                let b = self.call(
                    client,
                    client.http.get(url("meta", &read_key("blob", size, c, k))),
                    200,
                    op,
                )?;
                let m: serde_json::Value = serde_json::from_slice(&b)?;
                ensure!(
                    m["size"].as_u64() == Some(size as u64),
                    "Get-Blob-Meta: size {}",
                    m["size"]
                );
            }
            "Get-Map-Full" => {
                let b = self.call(
                    client,
                    client
                        .http
                        .get(url("objects", &read_key("map", size, c, k))),
                    200,
                    op,
                )?;
                // The text form: `key=value` lines, in key order.
                let mut want = fx.maps[fx.index(c, k)].iter();
                let mut n = 0;
                for line in b.split(|&x| x == b'\n').filter(|l| !l.is_empty()) {
                    ensure!(
                        want.next()
                            .is_some_and(|(wk, wv)| line.len() == wk.len() + 1 + wv.len()
                                && line.starts_with(wk)
                                && line[wk.len()] == b'='
                                && line.ends_with(wv)),
                        "Get-Map-Full: entry {n} is not the head's"
                    );
                    n += 1;
                }
                ensure!(n == fx.map_entries, "Get-Map-Full returned {n} entries");
            }
            "Track" => {
                let key = read_key("blob", size, c, k);
                let b = self.call(
                    client,
                    client.http.get(format!("{}?min=1&max=1", url("log", &key))),
                    200,
                    op,
                )?;
                let j: serde_json::Value = serde_json::from_slice(&b)?;
                let v = j["versions"].as_array().context("Track: no versions")?;
                ensure!(
                    v.len() == 1 && v[0]["distance"].as_u64() == Some(1),
                    "Track found {} versions",
                    v.len()
                );
            }
            "Fork" => {
                let key = read_key("string", size, c, k);
                let name = format!("f{i}-{}", rng.random::<u32>());
                let req = client
                    .http
                    .post(url("fork", &key))
                    .header("content-type", "application/json")
                    .body(serde_json::json!({ "from": "master", "branch": name }).to_string());
                self.call(client, req, 201, op)?;
            }
            other => bail!("unknown op {other}"),
        }
        Ok(())
    }
}

/// A Map in the text form `PUT ?type=map` takes: `key=value` lines.
fn map_text(m: &BTreeMap<Vec<u8>, Vec<u8>>) -> Vec<u8> {
    let mut out = Vec::with_capacity(m.len() * (MAP_KEY + MAP_VALUE + 2));
    for (k, v) in m {
        out.extend_from_slice(k);
        out.push(b'=');
        out.extend_from_slice(v);
        out.push(b'\n');
    }
    out
}

/// 100 successive versions of a 10 MB blob, each with a small random insert, delete or
/// overwrite, against the ideal: one version plus the bytes each edit adds.
fn dedup(root: &Path, cfg: TreeConfig) -> Result<()> {
    let dir = root.join("dedup");
    let _ = std::fs::remove_dir_all(&dir);
    let store: Arc<dyn Store> = Arc::new(LogStore::open(
        &dir,
        LogStoreOptions {
            durability: Durability::Buffered,
            ..Default::default()
        },
    )?);
    let db = Db::with_config(store.clone(), cfg);
    let mut rng = SmallRng::seed_from_u64(7);
    let size = 10_000_000usize;
    let mut model = random_bytes(&mut rng, size);
    let opts = PutOptions::default();
    db.put(
        b"dedup",
        Target::Branch("master"),
        NewValue::Blob(model.clone()),
        &opts,
    )?;
    let first = store.stats()?.chunk_bytes;
    let mut ideal = first as f64;
    let mut edits = [0usize; 3];
    for _ in 1..100 {
        let at = rng.random_range(0..model.len() - 100) as u64;
        let len = rng.random_range(1..=64usize);
        let op = match rng.random_range(0..3) {
            0 => {
                let ins = random_bytes(&mut rng, len);
                model.splice(at as usize..at as usize, ins.iter().copied());
                ideal += len as f64;
                edits[0] += 1;
                Op::BlobSplice {
                    offset: at,
                    delete: 0,
                    insert: ins,
                }
            }
            1 => {
                model.drain(at as usize..at as usize + len);
                edits[1] += 1;
                Op::BlobSplice {
                    offset: at,
                    delete: len as u64,
                    insert: Vec::new(),
                }
            }
            _ => {
                let ins = random_bytes(&mut rng, len);
                model.splice(at as usize..at as usize + len, ins.iter().copied());
                ideal += len as f64;
                edits[2] += 1;
                Op::BlobSplice {
                    offset: at,
                    delete: len as u64,
                    insert: ins,
                }
            }
        };
        db.update(b"dedup", Target::Branch("master"), op, &opts)?;
    }
    let head = db.get(b"dedup", &At::Branch("master".into()))?;
    let t = head.object.value.tree().context("not a blob")?;
    ensure!(
        postree::blob_read(db.chunks(), t, 0, t.count)? == model,
        "final version differs from the model"
    );
    let stored = store.stats()?.chunk_bytes as f64;
    let naive = 100.0 * size as f64;
    println!(
        "## dedup: 100 versions of a 10 MB blob ({} inserts, {} deletes, {} overwrites of 1-64 bytes; {} B leaves)",
        edits[0], edits[1], edits[2], cfg.leaf_target
    );
    println!();
    println!("| measure | bytes | × ideal |");
    println!("| --- | ---: | ---: |");
    println!(
        "| ideal: first version's chunks + bytes the edits add | {:.0} | 1.00 |",
        ideal
    );
    println!(
        "| Cairn: distinct chunk bytes stored (data + index + meta) | {:.0} | {:.3} |",
        stored,
        stored / ideal
    );
    println!(
        "| no dedup: 100 full copies | {:.0} | {:.1} |",
        naive,
        naive / ideal
    );
    println!();
    drop(db);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Blob put throughput: content-defined chunking + hashing + store, on one thread and with
/// the streaming writer's second (hashing) thread.
fn throughput(root: &Path, mib: usize, cfg: TreeConfig) -> Result<()> {
    let mut rng = SmallRng::seed_from_u64(11);
    let data = random_bytes(&mut rng, mib << 20);
    println!(
        "## Blob put throughput, {mib} MiB of random bytes, {} B leaves",
        cfg.leaf_target
    );
    println!();
    println!("| store | MB/s |");
    println!("| --- | ---: |");
    // The chunker and the hash alone, one thread, best of three: the floor of the rows
    // after them (which also frame, copy and store every leaf).
    let mut lengths = Vec::new();
    let mut best_cut = f64::MAX;
    for _ in 0..3 {
        let t0 = Instant::now();
        lengths = postree::blob_leaf_lengths(&cfg, &data);
        best_cut = best_cut.min(t0.elapsed().as_secs_f64());
    }
    ensure!(
        lengths.iter().sum::<usize>() == data.len(),
        "leaf lengths do not cover the blob"
    );
    let mb_s = |secs: f64| data.len() as f64 / secs / 1e6;
    println!(
        "| FastCDC cut points only ({} leaves), best of 3 | {:.0} |",
        lengths.len(),
        mb_s(best_cut)
    );
    // A store keeps a copy of every leaf: the copy alone, into memory already touched.
    let mut copy = vec![1u8; data.len()];
    let mut best_copy = f64::MAX;
    for _ in 0..3 {
        let t0 = Instant::now();
        let mut at = 0;
        for &n in &lengths {
            copy[at..at + n].copy_from_slice(&data[at..at + n]);
            at += n;
        }
        std::hint::black_box(&copy);
        best_copy = best_copy.min(t0.elapsed().as_secs_f64());
    }
    drop(copy);
    println!(
        "| copy of each leaf into memory already touched, best of 3 | {:.0} |",
        mb_s(best_copy)
    );
    for algo in [HashAlgo::Blake3, HashAlgo::Sha256] {
        let mut best_hash = f64::MAX;
        for _ in 0..3 {
            let t0 = Instant::now();
            let mut at = 0;
            for &n in &lengths {
                std::hint::black_box(algo.digest(&data[at..at + n]));
                at += n;
            }
            best_hash = best_hash.min(t0.elapsed().as_secs_f64());
        }
        println!(
            "| {algo} of each leaf only (no framing, no store), best of 3 | {:.0} |",
            mb_s(best_hash)
        );
        println!(
            "| floor of chunking + {algo} on one thread (cut points + hash rows in sequence) | {:.0} |",
            mb_s(best_cut + best_hash)
        );
        println!(
            "| floor of chunking + {algo} + one copy per leaf on one thread | {:.0} |",
            mb_s(best_cut + best_hash + best_copy)
        );
    }
    for algo in [HashAlgo::Blake3, HashAlgo::Sha256] {
        let mem = MemoryStore::with_algo(algo);
        // Best of three: the first pass also pays for faulting in fresh memory.
        let mut best = f64::MAX;
        for _ in 0..3 {
            mem.remove(&mem.cids()?)?;
            let t0 = Instant::now();
            let t = postree::build_blob(&mem as &dyn ChunkStore, &cfg, &data)?;
            best = best.min(t0.elapsed().as_secs_f64());
            ensure!(
                t.count == data.len() as u64,
                "built blob has the wrong size"
            );
        }
        println!(
            "| memory, {algo} (chunking + hashing + hash map insert), best of 3 | {:.0} |",
            data.len() as f64 / best / 1e6
        );
    }
    // The streaming writer, 1 MiB writes, into memory: one thread, then two.
    for two in [false, true] {
        let mem = MemoryStore::new();
        let mut best = f64::MAX;
        for _ in 0..3 {
            mem.remove(&mem.cids()?)?;
            let t0 = Instant::now();
            let mut w = postree::BlobWriter::new(&mem as &dyn ChunkStore, &cfg);
            if !two {
                w = w.single_threaded();
            }
            for part in data.chunks(1 << 20) {
                w.write_bytes(part)?;
            }
            let t = w.finish()?;
            best = best.min(t0.elapsed().as_secs_f64());
            ensure!(
                t.count == data.len() as u64,
                "built blob has the wrong size"
            );
        }
        println!(
            "| memory, blake3, streaming writer, {}, best of 3 | {:.0} |",
            if two {
                "hashing on a second thread"
            } else {
                "one thread"
            },
            data.len() as f64 / best / 1e6
        );
    }
    let dir = root.join("throughput");
    let _ = std::fs::remove_dir_all(&dir);
    // One thread into the log store: chunking, hashing, framing and the store's write
    // (page cache; `buffered`, nothing synced), a fresh store each time (no dedup).
    let mut best = f64::MAX;
    for i in 0..3 {
        let at = dir.join(format!("one-thread-{i}"));
        let store = LogStore::open(
            &at,
            LogStoreOptions {
                durability: Durability::Buffered,
                ..Default::default()
            },
        )?;
        let t0 = Instant::now();
        let t = postree::build_blob(&store as &dyn ChunkStore, &cfg, &data)?;
        best = best.min(t0.elapsed().as_secs_f64());
        ensure!(
            t.count == data.len() as u64,
            "built blob has the wrong size"
        );
        drop(store);
        let _ = std::fs::remove_dir_all(&at);
    }
    println!(
        "| embedded log store, buffered, one thread (chunking + hashing + store write, not committed; the background sync of sealed segments not timed), best of 3 | {:.0} |",
        data.len() as f64 / best / 1e6
    );
    // A committed put on one thread: `Db::put` of the whole blob (held in memory, copied
    // before the timer) builds its tree on the caller's thread, then commits the version
    // at the store's level; the timer stops when the put returns (at `group`, synced).
    for d in [Durability::Buffered, Durability::Group] {
        let mut best = f64::MAX;
        for i in 0..3 {
            let at = dir.join(format!("put-{}-{i}", d.name()));
            let store = LogStore::open(
                &at,
                LogStoreOptions {
                    durability: d,
                    ..Default::default()
                },
            )?;
            let db = Db::with_config(Arc::new(store), cfg);
            let value = NewValue::Blob(data.clone());
            let t0 = Instant::now();
            db.put(
                b"big",
                Target::Branch("master"),
                value,
                &PutOptions::default(),
            )?;
            best = best.min(t0.elapsed().as_secs_f64());
            drop(db);
            let _ = std::fs::remove_dir_all(&at);
        }
        println!(
            "| embedded, {} (put of a blob held in memory, committed; one thread), best of 3 | {:.0} |",
            d.name(),
            data.len() as f64 / best / 1e6
        );
    }
    for d in [Durability::Buffered, Durability::Group] {
        let store = LogStore::open(
            &dir.join(d.name()),
            LogStoreOptions {
                durability: d,
                ..Default::default()
            },
        )?;
        let db = Db::with_config(Arc::new(store), cfg);
        let t0 = Instant::now();
        db.put_blob_stream(
            b"big",
            Target::Branch("master"),
            &mut &data[..],
            &PutOptions::default(),
            &mut |_| {},
        )?;
        let secs = t0.elapsed().as_secs_f64();
        println!(
            "| embedded, {} (streamed put, committed; hashing on a second thread) | {:.0} |",
            d.name(),
            data.len() as f64 / secs / 1e6
        );
    }
    println!();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every Table 3 operation runs, embedded and over HTTP, checking what it reads; a read
    /// of other bytes than the head's (here: a fixture expecting others) fails the run.
    #[test]
    fn every_operation_runs_and_reads_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        #[derive(clap::Parser)]
        struct T {
            #[command(flatten)]
            a: BenchArgs,
        }
        use clap::Parser;
        let args = T::try_parse_from(["bench", "forkbase", "--clients", "2", "--seconds", "0.05"])
            .unwrap()
            .a;
        let cfg = TreeConfig {
            leaf_target: 4096,
            index_target: 4096,
        };
        let store: Arc<dyn Store> = Arc::new(
            LogStore::open(
                &dir.path().join("embedded"),
                LogStoreOptions {
                    durability: Durability::Buffered,
                    ..Default::default()
                },
            )
            .unwrap(),
        );
        let db = Db::with_config(store, cfg);
        let node = HttpNode::start(&dir.path().join("node"), Durability::Buffered, 4096).unwrap();
        for (db, node) in [(&db, None), (node.bucket.db(), Some(&node))] {
            let mut fx = Fixture::prepare(db, 2, 1024).unwrap();
            for op in OPS {
                let (ops, _, _) = run_op(db, node, &fx, op, 1024, &args).unwrap();
                assert!(ops > 0.0, "{op}");
            }
            for (op, spoil) in [
                ("Get-String", 0usize),
                ("Get-Blob-Full", 1),
                ("Get-Map-Full", 2),
            ] {
                let i = fx.index(1, 3);
                match spoil {
                    0 => fx.strings[i][5] ^= 1,
                    1 => fx.blobs[i][700] ^= 1,
                    _ => {
                        let (k, _) = fx.maps[i].pop_last().unwrap();
                        fx.maps[i].insert(k, b"other".to_vec());
                    }
                }
                let r = match node {
                    Some(n) => {
                        let client = BenchClient::new().unwrap();
                        let mut rng = SmallRng::seed_from_u64(1);
                        n.one_op(&client, &fx, op, 1, 3, 0, None, &mut rng)
                    }
                    None => {
                        let mut rng = SmallRng::seed_from_u64(1);
                        one_op(db, &fx, op, 1, 3, 0, None, &PutOptions::default(), &mut rng)
                    }
                };
                assert!(r.is_err(), "{op} took other bytes than the head's");
            }
        }
    }
}

//! `cairn bench capsule`: the DCS paper's evaluation (§6) on Cairn's capsule layer, with
//! every response checked by the client (acks verified against the server key, records
//! checked against their names and decrypted and compared byte for byte with what was
//! written, proofs verified by the reader against the capsule metadata and its own cache).
//!
//! Parts (select with `--parts`):
//!
//! - `seq` (paper §6.3, Figures 5, 6, 10–13): one client writes N records (21-byte bodies,
//!   as the prototype's `local` bench) with a signature every k records, reads them all,
//!   then proves them newest first, with and without the verification cache. Each phase
//!   is pipelined the way the prototype sends it (one batch of requests per phase; with
//!   `--mirror ack`, proofs in windows so acks of one window ride in front of the next).
//! - `many` (prototype `manyclient`, Figure 9's workload): C clients, each on its own
//!   capsule, each writing N/C records at 1000 per signature, then reading, then proving
//!   them, all clients at once, each phase one pipelined batch per client.
//! - `ycsb` (§6.4): YCSB A, B, C, D over a key-value store built on a capsule (a put
//!   appends a record holding key and value, and with proofs on each batch's write carries
//!   the writer's signature of its newest record; a get looks the key up in the client's
//!   index and reads the record, with proofs on as one read-and-prove whose proof the
//!   reader verifies; the reader is the writer, so a proof anchored on the writer's own
//!   signature skips re-checking it, `Writer::sign_for`), against redb at the
//!   same durability.
//! - `conc` (§6.5, Figure 9): C closed-loop clients, one request at a time, with
//!   throughput and latency percentiles for writes, reads and proofs.
//! - `merkle`: the per-capsule Merkle log's inclusion and consistency proofs (size and
//!   verify time) at growing log sizes.
//!
//! The client/server boundary is [`Conn`], carrying `cairn_capsule::wire` requests: [`Local`]
//! dispatches them to the server directly; [`Tcp`] encodes them and sends them pipelined
//! over a loopback connection to `wire::serve_tcp`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use cairn_capsule::cache::MirrorMode;
use cairn_capsule::merkle::{self, Digest, MerkleLog};
use cairn_capsule::wire::{self, RemoteCapsule, Request, Response};
use cairn_capsule::{
    Ack, AckKind, Anchor, BodyCipher, BodyKey, CachePolicy, CapsuleDag, CapsuleMetadata,
    CapsuleName, CapsuleServer, Reader, Record, RecordName, ServerOptions, SessionId,
};
use cairn_core::{Hash, HashAlgo, PublicKey, SigningKey};
use cairn_net::ServerHandle;
use cairn_store::{Durability, LogStore, LogStoreOptions, Store};
use clap::{Args, ValueEnum};
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};
use redb::{ReadableDatabase, ReadableTable};

use crate::bench::process_cpu_seconds;

/// Body ciphers `cairn bench capsule` can seal with (`--cipher`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Cipher {
    /// AES-256-GCM-SIV, Cairn's default.
    #[value(name = "aes-256-gcm-siv")]
    Aes256GcmSiv,
    /// XChaCha20-Poly1305.
    #[value(name = "xchacha20-poly1305")]
    XChaCha20Poly1305,
    /// No sealing.
    Plaintext,
}

impl From<Cipher> for BodyCipher {
    fn from(c: Cipher) -> BodyCipher {
        match c {
            Cipher::Aes256GcmSiv => BodyCipher::Aes256GcmSiv,
            Cipher::XChaCha20Poly1305 => BodyCipher::XChaCha20Poly1305,
            Cipher::Plaintext => BodyCipher::Plaintext,
        }
    }
}

/// Parts of `cairn bench capsule`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Part {
    /// Sequential write, read and prove at 1, 10, 100, 1000 records per signature.
    Seq,
    /// The prototype's `manyclient` workload.
    Many,
    /// YCSB A–D on a capsule key-value store against redb.
    Ycsb,
    /// Concurrent closed-loop clients with latency percentiles.
    Conc,
    /// Merkle-log proof sizes and verify times.
    Merkle,
}

/// Which write/prove API the clients use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Api {
    /// One record per write, hash-chain proofs (the prototype's "flexible" API).
    Flexible,
    /// Subrecords committed as one record with a Merkle root (the "subrecord" API).
    Subrecord,
}

/// When a session's mirror takes in a proof's names ([`MirrorMode`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mirror {
    /// [`MirrorMode::OnIssue`].
    Issue,
    /// [`MirrorMode::OnAck`].
    Ack,
}

impl Mirror {
    fn mode(self) -> MirrorMode {
        match self {
            Mirror::Issue => MirrorMode::OnIssue,
            Mirror::Ack => MirrorMode::OnAck,
        }
    }

    /// The proof window for `args`: the flag, or this mode's default.
    fn window(self, args: &CapsuleArgs) -> usize {
        args.proof_window
            .unwrap_or(match self {
                Mirror::Issue => 10_000,
                Mirror::Ack => 1,
            })
            .max(1)
    }
}

/// How a client asks for its reads and proofs in `many`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Requests {
    /// One request per record or subrecord, pipelined (a window's requests go out
    /// together, each answered in its own response).
    Single,
    /// One request per window naming all its subrecords: `ReadSubrecords` answered with
    /// all their bytes, `ProveSubrecords` answered with one Merkle multiproof, as the
    /// prototype sends a client's requests of a phase in one message. Subrecord API only.
    Batch,
}

/// How the benchmark's clients reach the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Transport {
    /// Direct calls into the server, in this process.
    Inproc,
    /// The server on its own threads behind `wire::serve_tcp`, each client on its own
    /// loopback connection, requests encoded and pipelined.
    Tcp,
}

/// Options of `cairn bench capsule`.
#[derive(Args, Debug, Clone)]
pub struct CapsuleArgs {
    /// Parts to run (comma-separated).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "seq,many,ycsb,conc,merkle"
    )]
    pub parts: Vec<Part>,
    /// Transports to run the client/server parts over (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "inproc")]
    pub transport: Vec<Transport>,
    /// APIs to run `seq` and `many` with (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "flexible")]
    pub api: Vec<Api>,
    /// Body cipher of the capsules the clients create.
    #[arg(long, value_enum, default_value = "aes-256-gcm-siv")]
    pub cipher: Cipher,
    /// Records written and read in `seq`.
    #[arg(long, default_value_t = 100_000)]
    pub seq_records: usize,
    /// Records per writer signature in `seq` (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,10,100,1000")]
    pub per_sig: Vec<usize>,
    /// Most proofs per `seq` cell without the cache (the paper's bars are 10k operations;
    /// uncached chains at 1000 per signature are 500 headers on average).
    #[arg(long, default_value_t = 10_000)]
    pub uncached_proofs: usize,
    /// When the server's mirror of a reader's cache takes in a proof's names: `issue`
    /// (when the server issues it, as the prototype does; proofs pipeline and chain off
    /// each other, no acks) or `ack` (when the reader acks it; a window's proofs cannot
    /// use each other). Comma-separated to run both.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "issue")]
    pub mirror: Vec<Mirror>,
    /// Proof requests per pipelined window (with `--mirror ack` the acks of one window
    /// travel in front of the next). Default: 1 with `ack` (fastest there), 10,000 with
    /// `issue`.
    #[arg(long)]
    pub proof_window: Option<usize>,
    /// Records in all of `many` (split evenly over the clients).
    #[arg(long, default_value_t = 1_000_000)]
    pub many_records: usize,
    /// Client counts for `many` (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,1000")]
    pub many_clients: Vec<usize>,
    /// How `many`'s clients read and prove: `single` (one request per record) or `batch`
    /// (one read request and one multiproof request per window of subrecords; subrecord
    /// API only). Comma-separated to run both.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "single")]
    pub requests: Vec<Requests>,
    /// YCSB workloads (comma-separated letters).
    #[arg(long, value_delimiter = ',', default_value = "a,b,c,d")]
    pub ycsb: Vec<char>,
    /// Records loaded before each YCSB run.
    #[arg(long, default_value_t = 10_000)]
    pub ycsb_records: usize,
    /// Operations in each YCSB run.
    #[arg(long, default_value_t = 100_000)]
    pub ycsb_ops: usize,
    /// YCSB value size in bytes.
    #[arg(long, default_value_t = 16)]
    pub ycsb_value: usize,
    /// YCSB operations per pipelined batch (one request batch, one store commit).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub ycsb_batch: Vec<usize>,
    /// Replay the prototype's YCSB trace files from this directory
    /// (`tracea_load_<w>.txt`, `tracea_run_<w>.txt`) instead of generating operations.
    #[arg(long)]
    pub ycsb_traces: Option<PathBuf>,
    /// YCSB: the reader re-checks a signature its own writer made when a proof ends at
    /// one (by default it trusts it, `Writer::sign_for`; the prototype's client checks
    /// every signature, so use this beside it).
    #[arg(long)]
    pub ycsb_verify_own: bool,
    /// Client counts for `conc` (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,10,100,1000")]
    pub conc_clients: Vec<usize>,
    /// Records written, read and proven in each `conc` cell (split over the clients).
    #[arg(long, default_value_t = 50_000)]
    pub conc_records: usize,
    /// Merkle-log sizes for `merkle` (comma-separated).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1000,10000,100000,1000000"
    )]
    pub merkle_sizes: Vec<u64>,
    /// Proofs sampled per Merkle-log size.
    #[arg(long, default_value_t = 2000)]
    pub merkle_samples: usize,
}

/// Body length of the prototype's benchmark records (`"data:"` and two 8-byte integers).
const BODY_LEN: usize = 21;
/// Verification-cache capacity (the flexible prototype's `CACHE_SIZE`).
const CACHE_CAPACITY: u32 = 100_000;

// ---------------------------------------------------------------------------------------
// The client/server boundary.

/// One client's connection to a capsule server: sends a batch of [`Request`]s (pipelined
/// over TCP) and returns one response per request, in order. Any error, local or
/// remote, aborts the benchmark.
pub trait Conn: Send {
    /// Sends `reqs` and returns their responses in order.
    fn call(&mut self, reqs: Vec<Request>) -> Result<Vec<Response>>;

    /// Sends `reqs` and hands each response to `each` in order as it arrives (over TCP,
    /// while the server still works on later requests).
    fn call_each(
        &mut self,
        reqs: Vec<Request>,
        each: &mut dyn FnMut(usize, Response) -> Result<()>,
    ) -> Result<()> {
        for (i, r) in self.call(reqs)?.into_iter().enumerate() {
            each(i, r)?;
        }
        Ok(())
    }
}

/// In-process transport: each request is a direct call into a shared [`CapsuleServer`]
/// ([`wire::dispatch`], no encoding).
pub struct Local(pub Arc<CapsuleServer>);

impl Conn for Local {
    fn call(&mut self, reqs: Vec<Request>) -> Result<Vec<Response>> {
        let mut out = Vec::with_capacity(reqs.len());
        for r in reqs {
            out.push(wire::dispatch(&self.0, r).into_result()?);
        }
        Ok(out)
    }
}

/// Loopback TCP transport: the requests of one call are encoded and sent pipelined on one
/// connection ([`RemoteCapsule::call_batch`]); the server (`wire::serve_tcp`) answers them
/// in order.
pub struct Tcp(pub RemoteCapsule);

impl Conn for Tcp {
    fn call(&mut self, reqs: Vec<Request>) -> Result<Vec<Response>> {
        let mut out = Vec::with_capacity(reqs.len());
        for r in self.0.call_batch(&reqs)? {
            out.push(r?);
        }
        Ok(out)
    }

    fn call_each(
        &mut self,
        reqs: Vec<Request>,
        each: &mut dyn FnMut(usize, Response) -> Result<()>,
    ) -> Result<()> {
        // `each`'s errors travel through the capsule layer's error type and back.
        let mut failed: Option<anyhow::Error> = None;
        let res = self.0.call_batch_each(&reqs, |i, r| {
            let r = r?;
            each(i, r).map_err(|e| {
                let msg = e.to_string();
                failed = Some(e);
                cairn_core::Error::invalid(msg)
            })
        });
        match (failed, res) {
            (Some(e), _) => Err(e),
            (None, r) => Ok(r?),
        }
    }
}

/// A server under test and how to reach it.
struct Backend {
    server: Arc<CapsuleServer>,
    log: Arc<LogStore>,
    transport: Transport,
    tcp: Option<ServerHandle>,
    dir: PathBuf,
    /// Body cipher of the capsules clients of this backend create.
    cipher: BodyCipher,
}

impl Backend {
    fn start(
        dir: &Path,
        durability: Durability,
        transport: Transport,
        cipher: BodyCipher,
    ) -> Result<Backend> {
        let _ = std::fs::remove_dir_all(dir);
        let log = Arc::new(LogStore::open(
            dir,
            LogStoreOptions {
                durability,
                algo: HashAlgo::Blake3,
                ..Default::default()
            },
        )?);
        let store: Arc<dyn Store> = log.clone();
        let server = Arc::new(CapsuleServer::new(
            store,
            SigningKey::generate()?,
            ServerOptions::default(),
        ));
        let tcp = match transport {
            Transport::Inproc => None,
            Transport::Tcp => Some(wire::serve_tcp(server.clone(), "127.0.0.1:0")?),
        };
        Ok(Backend {
            server,
            log,
            transport,
            tcp,
            dir: dir.to_path_buf(),
            cipher,
        })
    }

    fn connect(&self) -> Result<Box<dyn Conn>> {
        match self.transport {
            Transport::Inproc => Ok(Box::new(Local(self.server.clone()))),
            Transport::Tcp => {
                let addr = self
                    .tcp
                    .as_ref()
                    .context("no TCP server running")?
                    .local_addr();
                Ok(Box::new(Tcp(RemoteCapsule::connect(addr)?)))
            }
        }
    }

    fn public_key(&self) -> PublicKey {
        self.server.public_key()
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        if let Some(h) = self.tcp.take() {
            h.shutdown();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

// ---------------------------------------------------------------------------------------
// One benchmark client on its own capsule.

/// Something a client wrote and can read and prove.
#[derive(Clone, Copy)]
enum Item {
    Rec(RecordName),
    Sub(Hash),
}

struct Client {
    conn: Box<dyn Conn>,
    writer: cairn_capsule::Writer,
    reader: Reader,
    capsule: CapsuleName,
    server: PublicKey,
    session: Option<SessionId>,
    /// The session's mirror mode.
    mode: MirrorMode,
    /// Proof ids verified but not yet acked (sent in front of the next request batch).
    unacked: Vec<u64>,
    /// Records written one at a time (`conc`).
    written: Vec<RecordName>,
}

fn expect_ack(
    r: Response,
    server: &PublicKey,
    capsule: &CapsuleName,
    want: &AckKind,
) -> Result<Ack> {
    match r {
        Response::Ack(a) => {
            a.verify(server, capsule, want)?;
            Ok(a)
        }
        other => bail!("expected an ack, got a {}", other.kind()),
    }
}

impl Client {
    fn new(
        conn: Box<dyn Conn>,
        server: PublicKey,
        cache: bool,
        mode: MirrorMode,
        label: &str,
        cipher: BodyCipher,
    ) -> Result<Client> {
        let key = SigningKey::generate()?;
        let mut meta = CapsuleMetadata::new(HashAlgo::Blake3, key.public(), label);
        meta.cipher = cipher;
        let capsule = meta.name();
        let body_key = BodyKey::generate()?;
        let policy = if cache {
            CachePolicy::Lru {
                capacity: CACHE_CAPACITY,
            }
        } else {
            CachePolicy::Off
        };
        let writer = cairn_capsule::Writer::new(meta.clone(), key, Some(body_key.clone()))?;
        let mut reader = Reader::new(capsule, meta.clone(), policy, Some(body_key))?;
        reader.set_mirror_mode(mode);
        let mut c = Client {
            conn,
            writer,
            reader,
            capsule,
            server,
            session: None,
            mode,
            unacked: Vec::new(),
            written: Vec::new(),
        };
        let mut reqs = vec![Request::Create { meta }];
        if cache {
            reqs.push(Request::OpenSession {
                capsule,
                policy,
                mode,
                cached: Vec::new(),
            });
        }
        let mut resps = c.conn.call(reqs)?.into_iter();
        let first = resps.next().context("no response to create")?;
        expect_ack(first, &c.server, &capsule, &AckKind::Created)?;
        if cache {
            match resps.next() {
                Some(Response::Session(id)) => c.session = Some(id),
                _ => bail!("no session from the server"),
            }
        }
        Ok(c)
    }

    /// Requests acking every verified proof not yet acked; the reader inserts what those
    /// proofs verified now, as the server will when the acks arrive.
    fn take_acks(&mut self) -> Vec<Request> {
        self.reader.commit_staged();
        match self.session {
            Some(session) => self
                .unacked
                .drain(..)
                .map(|proof_id| Request::Ack { session, proof_id })
                .collect(),
            None => Vec::new(),
        }
    }

    /// Sends `reqs` after any pending acks and returns the responses to `reqs`.
    fn call(&mut self, reqs: Vec<Request>) -> Result<Vec<Response>> {
        let mut all = self.take_acks();
        let n_acks = all.len();
        all.extend(reqs);
        let mut resps = self.conn.call(all)?;
        for r in resps.drain(..n_acks) {
            ensure!(
                matches!(r, Response::Unit),
                "ack answered with a {}",
                r.kind()
            );
        }
        Ok(resps)
    }

    /// As [`Client::call`], handing each response to `reqs` to `each` (with its index
    /// in `reqs`) as it arrives.
    fn call_each(
        &mut self,
        reqs: Vec<Request>,
        mut each: impl FnMut(&mut Reader, &mut Vec<u64>, usize, Response) -> Result<()>,
    ) -> Result<usize> {
        let mut all = self.take_acks();
        let n_acks = all.len();
        all.extend(reqs);
        let mut seen: usize = 0;
        let (reader, unacked) = (&mut self.reader, &mut self.unacked);
        self.conn.call_each(all, &mut |i, r| {
            seen += 1;
            if i < n_acks {
                ensure!(
                    matches!(r, Response::Unit),
                    "ack answered with a {}",
                    r.kind()
                );
                return Ok(());
            }
            each(reader, unacked, i - n_acks, r)
        })?;
        Ok(seen.saturating_sub(n_acks))
    }

    /// Sends the pending acks, if any.
    fn flush_acks(&mut self) -> Result<()> {
        if !self.unacked.is_empty() {
            self.call(Vec::new())?;
        }
        Ok(())
    }

    /// Write phase: `bodies.len()` records with a signature every `per_sig`, sent as one
    /// pipelined batch (one Write or Commit request per signature). Returns what can be
    /// read and proven, in write order.
    fn write_all(&mut self, api: Api, bodies: &[Vec<u8>], per_sig: usize) -> Result<Vec<Item>> {
        let mut reqs = Vec::with_capacity(bodies.len() / per_sig + 1);
        let mut wants = Vec::with_capacity(reqs.capacity());
        let mut items = Vec::with_capacity(bodies.len());
        for group in bodies.chunks(per_sig) {
            match api {
                Api::Flexible => {
                    let mut records = Vec::with_capacity(group.len());
                    for b in group {
                        let r = self.writer.record(b, &[])?;
                        items.push(Item::Rec(r.name()));
                        records.push(r);
                    }
                    let names: Vec<RecordName> = records.iter().map(Record::name).collect();
                    // `group` is non-empty: chunks() yields no empty slices.
                    let last = names[names.len() - 1];
                    let sig = self.writer.sign(&last);
                    reqs.push(Request::Write {
                        capsule: self.capsule,
                        records,
                        signatures: vec![(last, sig)],
                    });
                    wants.push(AckKind::wrote(names, vec![last]));
                }
                Api::Subrecord => {
                    for b in group {
                        items.push(Item::Sub(self.writer.write_subrecord(b)?));
                    }
                    let (header, subs, sig) = self.writer.commit_subrecords(&[])?;
                    wants.push(AckKind::wrote(vec![header.name()], vec![header.name()]));
                    reqs.push(Request::CommitSubrecords {
                        capsule: self.capsule,
                        header,
                        subrecords: subs,
                        sig: Some(sig),
                    });
                }
            }
        }
        let resps = self.call(reqs)?;
        ensure!(
            resps.len() == wants.len(),
            "wrong number of write responses"
        );
        for (r, want) in resps.into_iter().zip(&wants) {
            expect_ack(r, &self.server, &self.capsule, want)?;
        }
        Ok(items)
    }

    /// Read phase: reads every item in one pipelined batch and compares each opened body
    /// with what was written.
    /// Each response is checked as it arrives, while the server still reads later ones.
    fn read_all(&mut self, items: &[Item], bodies: &[Vec<u8>]) -> Result<()> {
        let reqs = items.iter().map(|it| self.read_req(it)).collect();
        let n = self.call_each(reqs, |reader, _, i, r| {
            let (it, want) = items
                .get(i)
                .zip(bodies.get(i))
                .context("more read responses than requests")?;
            let got = open_item(reader, it, r)?;
            ensure!(&got == want, "read returned other bytes than were written");
            Ok(())
        })?;
        ensure!(n == items.len(), "wrong number of read responses");
        Ok(())
    }

    fn read_req(&self, it: &Item) -> Request {
        match *it {
            Item::Rec(name) => Request::Read {
                capsule: self.capsule,
                name,
            },
            Item::Sub(sub) => Request::ReadSubrecord {
                capsule: self.capsule,
                sub,
            },
        }
    }

    fn prove_req(&self, it: &Item) -> Request {
        match *it {
            Item::Rec(name) => Request::Prove {
                capsule: self.capsule,
                name,
                session: self.session,
            },
            Item::Sub(sub) => Request::ProveSubrecord {
                capsule: self.capsule,
                sub,
                session: self.session,
            },
        }
    }

    /// Verifies one proof response and queues its ack. With `measure`, also encodes the
    /// proof to learn its size (returned; 0 without).
    fn check_proof(&mut self, it: &Item, r: Response, measure: bool) -> Result<usize> {
        let acks = self.wants_acks();
        check_proof(&mut self.reader, &mut self.unacked, acks, it, r, measure)
    }

    /// Whether verified proofs must be acked (a session in [`MirrorMode::OnAck`]).
    fn wants_acks(&self) -> bool {
        self.session.is_some() && self.mode == MirrorMode::OnAck
    }

    /// Queues the ack of a verified proof, when the session's mode wants one.
    fn note_issued(&mut self, proof_id: u64) {
        if self.wants_acks() {
            self.unacked.push(proof_id);
        }
    }

    /// Prove phase: proves `items` in the order given, `window` requests per batch, and
    /// verifies every proof. Returns (proofs, total encoded bytes). Each proof is encoded
    /// once to count its bytes, inside the timed phase: a cost a real client does not pay,
    /// left in rather than estimated out (over TCP it overlaps the server's work).
    ///
    /// With [`MirrorMode::OnAck`] a window's proofs cannot stop at each other's names (the
    /// acks travel with the next window); with [`MirrorMode::OnIssue`] they do.
    fn prove_all(
        &mut self,
        items: &[Item],
        window: usize,
        requests: Requests,
    ) -> Result<(usize, u64)> {
        let mut bytes = 0u64;
        let window = window.max(1);
        if requests == Requests::Batch {
            return self.multiprove_all(items, window);
        }
        let acks = self.wants_acks();
        for chunk in items.chunks(window) {
            let reqs = chunk.iter().map(|it| self.prove_req(it)).collect();
            // Each proof is verified as it arrives, while the server works on later ones.
            let n = self.call_each(reqs, |reader, unacked, i, r| {
                let it = chunk.get(i).context("more proof responses than requests")?;
                bytes += check_proof(reader, unacked, acks, it, r, true)? as u64;
                Ok(())
            })?;
            ensure!(n == chunk.len(), "wrong number of proof responses");
        }
        self.flush_acks()?;
        Ok((items.len(), bytes))
    }
}

/// `items`, which must all be subrecords, in lists of `window`.
fn sub_lists(items: &[Item], window: usize) -> Result<Vec<Vec<Hash>>> {
    items
        .chunks(window.max(1))
        .map(|chunk| {
            chunk
                .iter()
                .map(|it| match *it {
                    Item::Sub(s) => Ok(s),
                    Item::Rec(_) => bail!("batched requests are for subrecords only"),
                })
                .collect()
        })
        .collect()
}

impl Client {
    /// Read phase in batches: one `ReadSubrecords` request per `window` items, pipelined;
    /// every body is checked against its name, opened and compared with what was written.
    fn read_batched(&mut self, items: &[Item], bodies: &[Vec<u8>], window: usize) -> Result<()> {
        let lists = sub_lists(items, window)?;
        let capsule = self.capsule;
        let reqs = lists
            .iter()
            .map(|subs| Request::ReadSubrecords {
                capsule,
                subs: subs.clone(),
            })
            .collect();
        let mut done = 0usize;
        let n = self.call_each(reqs, |reader, _, i, r| {
            let subs = lists.get(i).context("more read responses than requests")?;
            let Response::Subrecords(got) = r else {
                bail!("read_subrecords answered with a {}", r.kind());
            };
            ensure!(got.len() == subs.len(), "wrong number of subrecords read");
            for (sub, sealed) in subs.iter().zip(&got) {
                let want = bodies.get(done).context("more bodies read than written")?;
                ensure!(
                    &reader.open_subrecord(sub, sealed)? == want,
                    "read returned other bytes than were written"
                );
                done += 1;
            }
            Ok(())
        })?;
        ensure!(
            n == lists.len() && done == items.len(),
            "wrong number of read responses"
        );
        Ok(())
    }

    /// Prove phase with multiproofs: one `ProveSubrecords` request per `window` items,
    /// pipelined, each proof verified for exactly the names its request listed.
    fn multiprove_all(&mut self, items: &[Item], window: usize) -> Result<(usize, u64)> {
        let mut bytes = 0u64;
        let lists = sub_lists(items, window)?;
        let reqs = lists
            .iter()
            .map(|subs| Request::ProveSubrecords {
                capsule: self.capsule,
                subs: subs.clone(),
                session: self.session,
            })
            .collect();
        let acks = self.wants_acks();
        let n = self.call_each(reqs, |reader, unacked, i, r| {
            let subs = lists.get(i).context("more proof responses than requests")?;
            let Response::SubrecordsProof { proof_id, proof } = r else {
                bail!("prove_subrecords answered with a {}", r.kind());
            };
            reader.verify_subrecords(subs, &proof)?;
            let mut e = cairn_core::Encoder::new();
            proof.encode(&mut e);
            bytes += e.finish().len() as u64;
            if acks {
                unacked.push(proof_id);
            }
            Ok(())
        })?;
        ensure!(n == lists.len(), "wrong number of proof responses");
        self.flush_acks()?;
        Ok((items.len(), bytes))
    }
}

/// Opens one read response: checks it against the item's name and decrypts it.
fn open_item(reader: &Reader, it: &Item, r: Response) -> Result<Vec<u8>> {
    Ok(match (it, r) {
        (Item::Rec(name), Response::Record(rec)) => reader.open_record(name, &rec)?,
        (Item::Sub(sub), Response::Subrecord(b)) => reader.open_subrecord(sub, &b)?,
        (_, other) => bail!("read answered with a {}", other.kind()),
    })
}

/// Verifies one proof response and, when `acks`, queues its ack in `unacked`. With
/// `measure`, also encodes the proof to learn its size (returned; 0 without).
fn check_proof(
    reader: &mut Reader,
    unacked: &mut Vec<u64>,
    acks: bool,
    it: &Item,
    r: Response,
    measure: bool,
) -> Result<usize> {
    let (id, size) = match (it, r) {
        (Item::Rec(name), Response::RecordProof { proof_id, proof }) => {
            reader.verify_record(name, &proof)?;
            let n = if measure { proof.to_bytes().len() } else { 0 };
            (proof_id, n)
        }
        (Item::Sub(sub), Response::SubrecordProof { proof_id, proof }) => {
            reader.verify_subrecord(sub, &proof)?;
            let n = if measure {
                let mut e = cairn_core::Encoder::new();
                proof.encode(&mut e);
                e.finish().len()
            } else {
                0
            };
            (proof_id, n)
        }
        (_, other) => bail!("prove answered with a {}", other.kind()),
    };
    if acks {
        unacked.push(id);
    }
    Ok(size)
}

/// The prototype's record bodies: `"data:"`, the commit number and the index in it.
fn bodies(n: usize, per_sig: usize, salt: u64) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            let mut b = Vec::with_capacity(BODY_LEN);
            b.extend_from_slice(b"data:");
            b.extend_from_slice(&((i / per_sig) as u64 ^ salt).to_le_bytes());
            b.extend_from_slice(&((i % per_sig) as u64).to_le_bytes());
            b
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// seq and many: write, read, prove phases over C clients.

#[derive(Default, Clone, Copy)]
struct PhaseResult {
    write: f64,
    read: f64,
    prove: f64,
    proofs: usize,
    proof_bytes: u64,
    cpu_write: Option<f64>,
    commits_per_group: f64,
}

/// Runs the three phases with `clients` clients on their own capsules, `per_client`
/// records each; proofs are newest first, at most `max_proofs` per client.
#[allow(clippy::too_many_arguments)]
fn phases(
    backend: &Backend,
    api: Api,
    clients: usize,
    per_client: usize,
    per_sig: usize,
    cache: bool,
    max_proofs: usize,
    mirror: Mirror,
    window: usize,
    requests: Requests,
) -> Result<PhaseResult> {
    let server = backend.public_key();
    let mut cs = Vec::with_capacity(clients);
    for i in 0..clients {
        cs.push(Client::new(
            backend.connect()?,
            server,
            cache,
            mirror.mode(),
            &format!("bench capsule {i}"),
            backend.cipher,
        )?);
    }
    let data: Vec<Vec<Vec<u8>>> = (0..clients)
        .map(|i| bodies(per_client, per_sig, i as u64))
        .collect();
    let barrier = Barrier::new(clients);
    // Write.
    let c0 = backend.log.commit_counters();
    let cpu0 = process_cpu_seconds();
    let t0 = Instant::now();
    let mut items: Vec<Vec<Item>> = run_all(&mut cs, &barrier, |c, i| {
        c.write_all(api, &data[i], per_sig)
    })?;
    let write_s = t0.elapsed().as_secs_f64();
    let cpu_write = match (cpu0, process_cpu_seconds()) {
        (Some(a), Some(b)) => Some((b - a) * 1e6 / (clients * per_client) as f64),
        _ => None,
    };
    let c1 = backend.log.commit_counters();
    // Read.
    let t0 = Instant::now();
    run_all(&mut cs, &barrier, |c, i| match requests {
        Requests::Single => c.read_all(&items[i], &data[i]),
        Requests::Batch => c.read_batched(&items[i], &data[i], window),
    })?;
    let read_s = t0.elapsed().as_secs_f64();
    // Prove, newest first.
    for v in &mut items {
        v.reverse();
        v.truncate(max_proofs);
    }
    let t0 = Instant::now();
    let res = run_all(&mut cs, &barrier, |c, i| {
        c.prove_all(&items[i], window, requests)
    })?;
    let prove_s = t0.elapsed().as_secs_f64();
    let proofs: usize = res.iter().map(|r| r.0).sum();
    let proof_bytes: u64 = res.iter().map(|r| r.1).sum();
    let n = (clients * per_client) as f64;
    Ok(PhaseResult {
        write: n / write_s,
        read: n / read_s,
        prove: proofs as f64 / prove_s,
        proofs,
        proof_bytes,
        cpu_write,
        commits_per_group: (c1.commits - c0.commits) as f64 / (c1.groups - c0.groups).max(1) as f64,
    })
}

/// Runs `f` for every client on its own thread (or inline for one client), starting them
/// together; returns their results in client order.
fn run_all<T: Send>(
    cs: &mut [Client],
    barrier: &Barrier,
    f: impl Fn(&mut Client, usize) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    if cs.len() == 1 {
        return Ok(vec![f(&mut cs[0], 0)?]);
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = cs
            .iter_mut()
            .enumerate()
            .map(|(i, c)| {
                let f = &f;
                std::thread::Builder::new()
                    .stack_size(256 << 10)
                    .spawn_scoped(s, move || {
                        barrier.wait();
                        f(c, i)
                    })
            })
            .collect();
        let mut out = Vec::with_capacity(handles.len());
        for h in handles {
            match h?.join() {
                Ok(r) => out.push(r?),
                Err(_) => bail!("a benchmark client panicked"),
            }
        }
        Ok(out)
    })
}

fn kps(x: f64) -> String {
    if x.is_nan() {
        "n/a".into()
    } else if x >= 10_000.0 {
        format!("{:.0}k", x / 1000.0)
    } else {
        format!("{:.1}k", x / 1000.0)
    }
}

fn seq(args: &CapsuleArgs, root: &Path, d: Durability, t: Transport) -> Result<()> {
    println!(
        "## seq: 1 client, {} records of {BODY_LEN} B, write / read / prove newest first ({t:?}, durability {})",
        args.seq_records,
        d.name()
    );
    println!();
    println!(
        "| API | records per signature | cache | mirror | write rec/s | read rec/s | prove+verify /s | proofs | mean proof B | commits per fsync group | write CPU µs/rec |"
    );
    println!("| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let mut cells = Vec::new();
    for &api in &args.api {
        for &k in &args.per_sig {
            cells.push((api, k, false, args.mirror[0]));
            for &m in &args.mirror {
                cells.push((api, k, true, m));
            }
        }
    }
    {
        for (api, k, cache, mirror) in cells {
            {
                let backend = Backend::start(&root.join("seq"), d, t, args.cipher.into())?;
                let max = if cache {
                    usize::MAX
                } else {
                    args.uncached_proofs
                };
                let r = phases(
                    &backend,
                    api,
                    1,
                    args.seq_records,
                    k,
                    cache,
                    max,
                    mirror,
                    mirror.window(args),
                    Requests::Single,
                )?;
                println!(
                    "| {api:?} | {k} | {} | {} | {} | {} | {} | {} | {:.0} | {:.1} | {} |",
                    if cache { "on" } else { "off" },
                    if cache {
                        format!("{mirror:?}")
                    } else {
                        "—".into()
                    },
                    kps(r.write),
                    kps(r.read),
                    kps(r.prove),
                    r.proofs,
                    r.proof_bytes as f64 / r.proofs.max(1) as f64,
                    r.commits_per_group,
                    r.cpu_write.map_or("n/a".into(), |c| format!("{c:.1}")),
                );
            }
        }
    }
    println!();
    // Merkle log of the last capsule of the run: a signed checkpoint and an inclusion
    // proof checked against its root.
    log_check(root, d, t, args.cipher.into())?;
    Ok(())
}

/// Writes a few records and checks a Merkle-log inclusion proof of each against a signed
/// checkpoint (the capsule's log is the one `merkle` measures).
fn log_check(root: &Path, d: Durability, t: Transport, cipher: BodyCipher) -> Result<()> {
    let backend = Backend::start(&root.join("logcheck"), d, t, cipher)?;
    let mut c = Client::new(
        backend.connect()?,
        backend.public_key(),
        false,
        MirrorMode::OnAck,
        "log check",
        backend.cipher,
    )?;
    let data = bodies(1000, 100, 7);
    let items = c.write_all(Api::Flexible, &data, 100)?;
    let nonce: [u8; 16] = rand::random();
    let mut reqs = vec![Request::QueryFresh {
        capsule: c.capsule,
        nonce,
    }];
    let names: Vec<RecordName> = items
        .iter()
        .step_by(97)
        .filter_map(|i| match i {
            Item::Rec(n) => Some(*n),
            Item::Sub(_) => None,
        })
        .collect();
    for n in &names {
        reqs.push(Request::LogInclusion {
            capsule: c.capsule,
            name: *n,
            size: 1000,
        });
    }
    let mut resps = c.call(reqs)?.into_iter();
    let cp = match resps.next() {
        Some(Response::Checkpoint(cp)) => cp,
        _ => bail!("no checkpoint"),
    };
    cp.verify(&c.server, &c.capsule, &nonce)?;
    ensure!(cp.size == 1000, "checkpoint size {}", cp.size);
    for (n, r) in names.iter().zip(resps) {
        let Response::Inclusion { index, path } = r else {
            bail!("no inclusion proof");
        };
        merkle::verify_inclusion(
            HashAlgo::Blake3,
            index,
            cp.size,
            &CapsuleDag::log_leaf(n),
            &path,
            &cp.root,
        )?;
    }
    Ok(())
}

fn many(args: &CapsuleArgs, root: &Path, d: Durability, t: Transport) -> Result<()> {
    println!(
        "## many: the prototype's manyclient workload, {} records in all, 1000 per signature ({t:?}, durability {})",
        args.many_records,
        d.name()
    );
    println!();
    println!(
        "| API | mirror | requests | clients × records | write rec/s | read rec/s | prove+verify /s | mean proof B | commits per fsync group |"
    );
    println!("| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |");
    let mut cells: Vec<(Api, Mirror, Requests)> = Vec::new();
    for &api in &args.api {
        for &mirror in &args.mirror {
            for &requests in &args.requests {
                // Batched reads and multiproofs exist for subrecords only.
                if requests == Requests::Single || api == Api::Subrecord {
                    cells.push((api, mirror, requests));
                }
            }
        }
    }
    ensure!(
        !cells.is_empty(),
        "--requests batch needs --api subrecord (batched reads and multiproofs are for subrecords)"
    );
    for (api, mirror, requests) in cells {
        for &clients in &args.many_clients {
            ensure!(clients >= 1, "--many-clients must be at least 1");
            let per = args.many_records / clients;
            let backend = Backend::start(&root.join("many"), d, t, args.cipher.into())?;
            let r = phases(
                &backend,
                api,
                clients,
                per,
                1000,
                true,
                usize::MAX,
                mirror,
                mirror.window(args),
                requests,
            )?;
            println!(
                "| {api:?} | {mirror:?} | {requests:?} | {clients} × {per} | {} | {} | {} | {:.0} | {:.1} |",
                kps(r.write),
                kps(r.read),
                kps(r.prove),
                r.proof_bytes as f64 / r.proofs.max(1) as f64,
                r.commits_per_group
            );
        }
    }
    println!();
    Ok(())
}

// ---------------------------------------------------------------------------------------
// conc: closed-loop clients, one request at a time, with latency percentiles.

struct Lat(Vec<u64>);

impl Lat {
    fn pct(&self, p: f64) -> f64 {
        if self.0.is_empty() {
            return f64::NAN;
        }
        let i = ((self.0.len() as f64 - 1.0) * p).round() as usize;
        self.0[i.min(self.0.len() - 1)] as f64 / 1000.0
    }
}

fn conc(args: &CapsuleArgs, root: &Path, d: Durability, t: Transport) -> Result<()> {
    println!(
        "## conc: closed-loop clients, one request at a time, {} records in all, a signature every 1000 ({t:?}, durability {}); latency in µs",
        args.conc_records,
        d.name()
    );
    println!();
    println!(
        "| clients | phase | ops/s | p50 | p90 | p99 | p99.9 | max | commits per fsync group |"
    );
    println!("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for &clients in &args.conc_clients {
        ensure!(clients >= 1, "--conc-clients must be at least 1");
        let per = (args.conc_records / clients).max(1);
        let backend = Backend::start(&root.join("conc"), d, t, args.cipher.into())?;
        let server = backend.public_key();
        let mut cs = Vec::with_capacity(clients);
        for i in 0..clients {
            cs.push(Client::new(
                backend.connect()?,
                server,
                true,
                args.mirror[0].mode(),
                &format!("conc {i}"),
                backend.cipher,
            )?);
        }
        let data: Vec<Vec<Vec<u8>>> = (0..clients).map(|i| bodies(per, 1000, i as u64)).collect();
        let barrier = Barrier::new(clients);
        for phase in ["write", "read", "prove"] {
            let c0 = backend.log.commit_counters();
            let t0 = Instant::now();
            let lats = run_all(&mut cs, &barrier, |c, i| conc_phase(c, phase, &data[i]))?;
            let secs = t0.elapsed().as_secs_f64();
            let c1 = backend.log.commit_counters();
            let mut all: Vec<u64> = lats.into_iter().flatten().collect();
            all.sort_unstable();
            let l = Lat(all);
            println!(
                "| {clients} | {phase} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {} |",
                kps(l.0.len() as f64 / secs),
                l.pct(0.5),
                l.pct(0.9),
                l.pct(0.99),
                l.pct(0.999),
                l.pct(1.0),
                if phase == "write" {
                    format!(
                        "{:.1}",
                        (c1.commits - c0.commits) as f64 / (c1.groups - c0.groups).max(1) as f64
                    )
                } else {
                    "".into()
                }
            );
        }
    }
    println!();
    Ok(())
}

/// One client's part of a `conc` phase; returns per-request latencies in nanoseconds.
fn conc_phase(c: &mut Client, phase: &str, data: &[Vec<u8>]) -> Result<Vec<u64>> {
    let mut lat = Vec::with_capacity(data.len());
    match phase {
        "write" => {
            let mut names = Vec::with_capacity(data.len());
            for (i, b) in data.iter().enumerate() {
                let t = Instant::now();
                let r = c.writer.record(b, &[])?;
                let name = r.name();
                let sigs = if (i + 1) % 1000 == 0 || i + 1 == data.len() {
                    vec![(name, c.writer.sign(&name))]
                } else {
                    Vec::new()
                };
                let want = AckKind::for_write(vec![name], &sigs);
                let resp = c.call(vec![Request::Write {
                    capsule: c.capsule,
                    records: vec![r],
                    signatures: sigs,
                }])?;
                let r = resp.into_iter().next().context("no write response")?;
                expect_ack(r, &c.server, &c.capsule, &want)?;
                lat.push(nanos(t.elapsed()));
                names.push(name);
            }
            c.written = names;
        }
        "read" => {
            let names = c.written.clone();
            for (name, want) in names.iter().zip(data) {
                let t = Instant::now();
                let it = Item::Rec(*name);
                let r = c.call(vec![c.read_req(&it)])?;
                let got = open_item(
                    &c.reader,
                    &it,
                    r.into_iter().next().context("no read response")?,
                )?;
                ensure!(&got == want, "read returned other bytes than were written");
                lat.push(nanos(t.elapsed()));
            }
        }
        _ => {
            let names = c.written.clone();
            for name in names.iter().rev() {
                let t = Instant::now();
                let it = Item::Rec(*name);
                let r = c.call(vec![c.prove_req(&it)])?;
                c.check_proof(&it, r.into_iter().next().context("no proof")?, false)?;
                lat.push(nanos(t.elapsed()));
            }
            c.flush_acks()?;
        }
    }
    Ok(lat)
}

fn nanos(d: Duration) -> u64 {
    d.as_nanos().min(u64::MAX as u128) as u64
}

// ---------------------------------------------------------------------------------------
// ycsb: a key-value store on a capsule against redb.

#[derive(Clone, Debug)]
enum Op {
    Put(Vec<u8>, Vec<u8>),
    Get(Vec<u8>),
}

struct Workload {
    load: Vec<(Vec<u8>, Vec<u8>)>,
    run: Vec<Op>,
}

/// YCSB's zipfian generator (Gray et al., "Quickly generating billion-record synthetic
/// databases", as YCSB's `ZipfianGenerator`), θ = 0.99, over `[0, n)`, growing `n`
/// incrementally.
struct Zipf {
    theta: f64,
    n: u64,
    zetan: f64,
    zeta2: f64,
    alpha: f64,
    eta: f64,
}

impl Zipf {
    fn new(n: u64) -> Zipf {
        let theta = 0.99;
        let mut z = Zipf {
            theta,
            n: 0,
            zetan: 0.0,
            zeta2: 1.0 + 0.5f64.powf(theta),
            alpha: 1.0 / (1.0 - theta),
            eta: 0.0,
        };
        z.grow(n);
        z
    }

    /// YCSB's `ScrambledZipfianGenerator` before its hash: θ = 0.99 over 10^10 items
    /// (YCSB's `ITEM_COUNT`; its `ZipfianGenerator(0, ITEM_COUNT)` counts 10^10 + 1) with
    /// YCSB's precomputed ζ(10^10, 0.99) = 26.46902820178302. Hashed onto `[0, n)` with
    /// [`fnv64`], as YCSB does, about 4% of draws land on the hottest key and the rest
    /// spread far more evenly than a zipfian drawn over `n` alone.
    fn scrambled() -> Zipf {
        let theta = 0.99;
        let n: u64 = 10_000_000_001;
        let zetan = 26.46902820178302;
        let zeta2 = 1.0 + 0.5f64.powf(theta);
        Zipf {
            theta,
            n,
            zetan,
            zeta2,
            alpha: 1.0 / (1.0 - theta),
            eta: (1.0 - (2.0 / n as f64).powf(1.0 - theta)) / (1.0 - zeta2 / zetan),
        }
    }

    fn grow(&mut self, n: u64) {
        while self.n < n {
            self.n += 1;
            self.zetan += 1.0 / (self.n as f64).powf(self.theta);
        }
        self.eta =
            (1.0 - (2.0 / self.n as f64).powf(1.0 - self.theta)) / (1.0 - self.zeta2 / self.zetan);
    }

    fn next(&self, rng: &mut SmallRng) -> u64 {
        let u: f64 = rng.random();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return 1.min(self.n - 1);
        }
        ((self.n as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64).min(self.n - 1)
    }
}

fn fnv64(x: u64) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in x.to_le_bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

fn ycsb_key(i: u64) -> Vec<u8> {
    format!("user{:020}", fnv64(i)).into_bytes()
}

fn ycsb_value(rng: &mut SmallRng, n: usize) -> Vec<u8> {
    (0..n).map(|_| rng.random_range(b'!'..=b'~')).collect()
}

/// YCSB core workloads: A = 50% read / 50% update, B = 95/5, C = read only (keys drawn
/// from YCSB's scrambled zipfian, [`Zipf::scrambled`]); D = 95% read / 5% insert, reads
/// skewed to the latest inserts.
fn generate(w: char, records: usize, ops: usize, vsize: usize, seed: u64) -> Result<Workload> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let load = (0..records as u64)
        .map(|i| (ycsb_key(i), ycsb_value(&mut rng, vsize)))
        .collect();
    let (read_p, latest) = match w {
        'a' => (0.5, false),
        'b' => (0.95, false),
        'c' => (1.0, false),
        'd' => (0.95, true),
        other => bail!("unknown YCSB workload {other:?} (a, b, c, d)"),
    };
    let mut n = records as u64;
    // D's reads: YCSB's `SkewedLatestGenerator`, a zipfian over the keys inserted so far,
    // counted back from the newest. A, B and C: YCSB's scrambled zipfian.
    let mut z = if latest {
        Zipf::new(n)
    } else {
        Zipf::scrambled()
    };
    let mut run = Vec::with_capacity(ops);
    for _ in 0..ops {
        let read = rng.random::<f64>() < read_p;
        if latest {
            if read {
                let k = n - 1 - z.next(&mut rng);
                run.push(Op::Get(ycsb_key(k)));
            } else {
                run.push(Op::Put(ycsb_key(n), ycsb_value(&mut rng, vsize)));
                n += 1;
                z.grow(n);
            }
        } else {
            let k = fnv64(z.next(&mut rng)) % n;
            run.push(if read {
                Op::Get(ycsb_key(k))
            } else {
                Op::Put(ycsb_key(k), ycsb_value(&mut rng, vsize))
            });
        }
    }
    Ok(Workload { load, run })
}

/// Reads the prototype's trace files for workload `w` (`SET <16 digits> <value>`,
/// `GET <16 digits>`).
fn traces(dir: &Path, w: char) -> Result<Workload> {
    let parse = |name: String| -> Result<Vec<Op>> {
        let path = dir.join(&name);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let mut ops = Vec::new();
        for (ln, line) in text.lines().enumerate() {
            let key = line
                .get(4..20)
                .with_context(|| format!("{name}:{}: short line", ln + 1))?;
            if line.starts_with("GET") {
                ops.push(Op::Get(key.as_bytes().to_vec()));
            } else if line.starts_with("SET") {
                let v = line.get(21..).unwrap_or("");
                ops.push(Op::Put(key.as_bytes().to_vec(), v.as_bytes().to_vec()));
            } else {
                bail!("{name}:{}: neither GET nor SET", ln + 1);
            }
        }
        Ok(ops)
    };
    let load = parse(format!("tracea_load_{w}.txt"))?
        .into_iter()
        .map(|op| match op {
            Op::Put(k, v) => Ok((k, v)),
            Op::Get(_) => bail!("a GET in a load trace"),
        })
        .collect::<Result<_>>()?;
    Ok(Workload {
        load,
        run: parse(format!("tracea_run_{w}.txt"))?,
    })
}

/// A key-value store on a capsule (DCS §6.4): the client keeps key → newest record name;
/// a put appends a record whose body is `len(key) ‖ key ‖ value`; a get reads that record
/// and, with proofs on, proves and verifies it. With proofs on, every batch's write carries
/// the writer's signature of its newest record (so every record is covered before any get
/// of it, whether or not a get follows; the prototype instead signs before a get of a key
/// written since its last signature).
struct CapsuleKv {
    c: Client,
    index: foldhash::HashMap<Vec<u8>, RecordName>,
    proofs: bool,
    /// Sign as the prototype's trace runs do (see [`CapsuleKv::batch`]).
    sign_before_get: bool,
    /// The reader re-checks its own writer's signatures (`--ycsb-verify-own`).
    verify_own: bool,
    stats: ProofStats,
}

/// What the proofs a [`CapsuleKv`] verified rested on, so a run says how often its reads
/// walked a chain or hit the verification cache.
#[derive(Clone, Copy, Debug, Default)]
struct ProofStats {
    /// Proofs verified.
    proofs: u64,
    /// Headers in them, the record's own included.
    headers: u64,
    /// Proofs whose chain ends at a name in the reader's verification cache.
    cached: u64,
    /// Proofs whose chain ends at a writer signature (in this harness always the reader's
    /// own, which it does not re-check unless `--ycsb-verify-own`:
    /// [`cairn_capsule::Writer::sign_for`]).
    signed: u64,
}

/// The expected value of every key, shared by the capsule store's and redb's runs (values
/// behind `Arc` so a get's expectation is a reference count, not a copy).
type Model = foldhash::HashMap<Vec<u8>, Arc<[u8]>>;

fn kv_body(k: &[u8], v: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(2 + k.len() + v.len());
    b.extend_from_slice(&(k.len() as u16).to_le_bytes());
    b.extend_from_slice(k);
    b.extend_from_slice(v);
    b
}

fn kv_parse(b: &[u8]) -> Result<(&[u8], &[u8])> {
    let n = u16::from_le_bytes([
        *b.first().context("empty body")?,
        *b.get(1).context("short")?,
    ]);
    let rest = &b[2..];
    ensure!(rest.len() >= n as usize, "body shorter than its key");
    Ok(rest.split_at(n as usize))
}

/// One response a [`CapsuleKv`] batch expects, in request order.
enum KvStep<'a> {
    /// A write's acknowledgment.
    Ack(AckKind),
    /// A get: its key, the record read, and the value it must hold.
    Get(&'a [u8], RecordName, Arc<[u8]>),
}

impl CapsuleKv {
    /// Runs `ops` as one pipelined batch of requests, checked in order. Puts go out as
    /// Write requests (with proofs on, each carrying the writer's signature of its newest
    /// record); gets as a read-and-prove each (a Read with proofs off). By default all the
    /// batch's puts are one Write ahead of its gets; with `sign_before_get`, as the
    /// prototype's `process_trace_sign`, the puts so far are written (and signed) when a
    /// get names a key put since the last signature, and at the end of the batch.
    /// `model` holds the expected value of every key.
    fn batch(&mut self, ops: &[Op], model: &mut Model) -> Result<()> {
        let mut reqs = Vec::new();
        let mut steps = Vec::new();
        let mut pending = Vec::new();
        let mut unsigned = std::collections::HashSet::new();
        let mut later = Vec::new();
        for op in ops {
            match op {
                Op::Put(k, v) => {
                    let r = self.c.writer.record(&kv_body(k, v), &[])?;
                    self.index.insert(k.clone(), r.name());
                    pending.push(r);
                    model.insert(k.clone(), Arc::from(&v[..]));
                    if self.sign_before_get {
                        unsigned.insert(&k[..]);
                    }
                }
                Op::Get(k) => {
                    if unsigned.contains(&k[..]) {
                        self.flush_write(&mut pending, &mut reqs, &mut steps);
                        unsigned.clear();
                    }
                    let name = *self.index.get(k).context("get of a key never put")?;
                    let want = model.get(k).context("key missing from the model")?.clone();
                    let get = KvStep::Get(&k[..], name, want);
                    if self.sign_before_get {
                        reqs.push(self.get_req(&name));
                        steps.push(get);
                    } else {
                        later.push(get);
                    }
                }
            }
        }
        self.flush_write(&mut pending, &mut reqs, &mut steps);
        for get in later {
            if let KvStep::Get(_, name, _) = &get {
                reqs.push(self.get_req(name));
            }
            steps.push(get);
        }
        let mut resps = self.c.call(reqs)?.into_iter();
        for step in steps {
            let r = resps.next().context("fewer responses than requests")?;
            match step {
                KvStep::Ack(want) => {
                    expect_ack(r, &self.c.server, &self.c.capsule, &want)?;
                }
                KvStep::Get(k, name, want) => {
                    let body = if self.proofs {
                        let Response::RecordAndProof {
                            proof_id,
                            body,
                            proof,
                        } = r
                        else {
                            bail!("read-and-prove answered with a {}", r.kind());
                        };
                        let plain = self.c.reader.verify_read(&name, body, &proof)?;
                        self.stats.proofs += 1;
                        self.stats.headers += proof.chain.len() as u64;
                        match proof.anchor {
                            Anchor::Cached => self.stats.cached += 1,
                            Anchor::Signed(_) => self.stats.signed += 1,
                        }
                        self.c.note_issued(proof_id);
                        plain
                    } else {
                        open_item(&self.c.reader, &Item::Rec(name), r)?
                    };
                    let (gk, gv) = kv_parse(&body)?;
                    ensure!(
                        gk == k && gv == &want[..],
                        "get returned another value than the last put"
                    );
                }
            }
        }
        Ok(())
    }

    /// Queues one Write of the `pending` records (none if there are none), with proofs on
    /// carrying the writer's signature of the newest: every record of the write chains to
    /// it. The reader is this writer, so it need not check its own signature when a proof
    /// comes back anchored on it.
    fn flush_write(
        &mut self,
        pending: &mut Vec<Record>,
        reqs: &mut Vec<Request>,
        steps: &mut Vec<KvStep<'_>>,
    ) {
        let records = std::mem::take(pending);
        let Some(last) = records.last().map(Record::name) else {
            return;
        };
        let wrote: Vec<RecordName> = records.iter().map(Record::name).collect();
        let signatures = if self.proofs && self.verify_own {
            vec![(last, self.c.writer.sign(&last))]
        } else if self.proofs {
            vec![(last, self.c.writer.sign_for(&last, &mut self.c.reader))]
        } else {
            Vec::new()
        };
        steps.push(KvStep::Ack(AckKind::for_write(wrote, &signatures)));
        reqs.push(Request::Write {
            capsule: self.c.capsule,
            records,
            signatures,
        });
    }

    /// The request a get sends: read-and-prove with proofs on (body and proof in one
    /// response, the header sent once), a plain read without.
    fn get_req(&self, name: &RecordName) -> Request {
        if self.proofs {
            Request::ReadProve {
                capsule: self.c.capsule,
                name: *name,
                session: self.c.session,
            }
        } else {
            self.c.read_req(&Item::Rec(*name))
        }
    }
}

const KV_TABLE: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("kv");

/// The baseline: the same operations on redb, one write transaction per batch with puts.
struct RedbKv {
    db: redb::Database,
    durability: redb::Durability,
}

impl RedbKv {
    fn batch(&self, ops: &[Op], model: &mut Model) -> Result<()> {
        let check = |got: Option<redb::AccessGuard<&[u8]>>, want: &[u8]| -> Result<()> {
            let g = got.context("redb lost a key")?;
            ensure!(g.value() == want, "redb returned another value");
            Ok(())
        };
        if ops.iter().any(|o| matches!(o, Op::Put(..))) {
            let mut tx = self.db.begin_write()?;
            tx.set_durability(self.durability)?;
            {
                let mut t = tx.open_table(KV_TABLE)?;
                for op in ops {
                    match op {
                        Op::Put(k, v) => {
                            t.insert(&k[..], &v[..])?;
                            model.insert(k.clone(), Arc::from(&v[..]));
                        }
                        Op::Get(k) => {
                            let want = model.get(k).context("key missing from the model")?;
                            check(t.get(&k[..])?, want)?;
                        }
                    }
                }
            }
            tx.commit()?;
        } else {
            let tx = self.db.begin_read()?;
            let t = tx.open_table(KV_TABLE)?;
            for op in ops {
                if let Op::Get(k) = op {
                    let want = model.get(k).context("key missing from the model")?;
                    check(t.get(&k[..])?, want)?;
                }
            }
        }
        Ok(())
    }
}

fn ycsb(args: &CapsuleArgs, root: &Path, d: Durability, t: Transport) -> Result<()> {
    let source = match &args.ycsb_traces {
        Some(dir) => format!(
            "the prototype's traces in {}; with proofs on, puts are signed before a get of a key put since the last signature, as the prototype does",
            dir.display()
        ),
        None => format!(
            "{} records loaded, {} operations, {}-byte values, YCSB's scrambled zipfian θ=0.99 (D: latest); with proofs on, every batch's write is signed",
            args.ycsb_records, args.ycsb_ops, args.ycsb_value
        ),
    };
    println!(
        "## ycsb: key-value store on a capsule vs redb ({source}; {t:?}, durability {}; redb {}; the three stores take turns on {YCSB_SLICES} slices of each run)",
        d.name(),
        match d {
            Durability::Buffered => "Durability::None",
            _ => "Durability::Immediate",
        }
    );
    println!();
    println!(
        "| workload | ops per batch | capsule, proofs on ops/s | capsule, proofs, signatures and cache off ops/s | redb ops/s | redb / proofs on | target ≤ 1.5×, this run alone (B and D move with the disk's sync time: judge over several runs) | headers per proof | proofs anchored on the cache / on the reader's own signature |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- |");
    for &w in &args.ycsb {
        let wl = match &args.ycsb_traces {
            Some(dir) => traces(dir, w)?,
            None => generate(w, args.ycsb_records, args.ycsb_ops, args.ycsb_value, 42)?,
        };
        for &b in &args.ycsb_batch {
            let b = b.max(1);
            let mut stores = [
                YcsbStore::capsule(&wl, &root.join("ycsb-on"), d, t, true, args)?,
                YcsbStore::capsule(&wl, &root.join("ycsb-off"), d, t, false, args)?,
                YcsbStore::redb(&wl, &root.join("ycsb-redb"), d)?,
            ];
            // The three stores take turns on slices of the run, so a drift in the disk's
            // sync time (which puts wait for) falls on all three alike.
            let mut took = [Duration::ZERO; 3];
            let slice = wl.run.len().div_ceil(YCSB_SLICES).div_ceil(b).max(1) * b;
            for (k, ops) in wl.run.chunks(slice).enumerate() {
                for j in 0..stores.len() {
                    let i = (j + k) % stores.len();
                    took[i] += stores[i].run(ops, b)?;
                }
            }
            let rate = |i: usize| wl.run.len() as f64 / took[i].as_secs_f64();
            let (on, off, base) = (rate(0), rate(1), rate(2));
            let ratio = base / on;
            let target = if w == 'a' {
                "(none)"
            } else if t != Transport::Inproc {
                // The target compares embedded stores; redb here has no network hop.
                "(not counted: over TCP)"
            } else if ratio <= 1.5 {
                "met"
            } else {
                "not met"
            };
            let st = match &stores[0] {
                YcsbStore::Capsule { kv, .. } => kv.stats,
                YcsbStore::Redb { .. } => bail!("the first YCSB store is not the capsule"),
            };
            let share = |k: u64| 100.0 * k as f64 / st.proofs.max(1) as f64;
            println!(
                "| {} | {b} | {} | {} | {} | {ratio:.2}× | {target} | {:.2} | {:.1}% / {:.1}% |",
                w.to_ascii_uppercase(),
                kps(on),
                kps(off),
                kps(base),
                st.headers as f64 / st.proofs.max(1) as f64,
                share(st.cached),
                share(st.signed),
            );
        }
    }
    println!();
    Ok(())
}

/// Slices of a YCSB run the stores take turns on.
const YCSB_SLICES: usize = 10;

/// One store under test in `ycsb`, loaded with the workload's records, with the model of
/// what every key must read back.
enum YcsbStore {
    /// The key-value store on a capsule (the backend kept alive for it).
    Capsule {
        kv: Box<CapsuleKv>,
        model: Model,
        _backend: Backend,
    },
    /// The embedded baseline, in its own directory (removed on drop).
    Redb {
        kv: RedbKv,
        model: Model,
        dir: PathBuf,
    },
}

impl YcsbStore {
    /// A capsule store in `dir`, loaded with `wl`'s records (1000 per batch).
    fn capsule(
        wl: &Workload,
        dir: &Path,
        d: Durability,
        t: Transport,
        proofs: bool,
        args: &CapsuleArgs,
    ) -> Result<YcsbStore> {
        let (mirror, cipher) = (args.mirror[0], args.cipher.into());
        // The prototype's traces are run as the prototype runs them: signing before a get
        // of a key put since the last signature. Generated workloads sign every batch's
        // write.
        let sign_before_get = args.ycsb_traces.is_some();
        let backend = Backend::start(dir, d, t, cipher)?;
        let c = Client::new(
            backend.connect()?,
            backend.public_key(),
            proofs,
            mirror.mode(),
            "ycsb",
            backend.cipher,
        )?;
        let mut store = YcsbStore::Capsule {
            kv: Box::new(CapsuleKv {
                c,
                index: Default::default(),
                proofs,
                sign_before_get,
                verify_own: args.ycsb_verify_own,
                stats: ProofStats::default(),
            }),
            model: Model::default(),
            _backend: backend,
        };
        store.load(wl)?;
        Ok(store)
    }

    /// redb in `dir` at the durability matching `d`, loaded with `wl`'s records.
    fn redb(wl: &Workload, dir: &Path, d: Durability) -> Result<YcsbStore> {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir)?;
        let mut store = YcsbStore::Redb {
            kv: RedbKv {
                db: redb::Database::create(dir.join("kv.redb"))?,
                durability: match d {
                    Durability::Buffered => redb::Durability::None,
                    _ => redb::Durability::Immediate,
                },
            },
            model: Model::default(),
            dir: dir.to_path_buf(),
        };
        store.load(wl)?;
        Ok(store)
    }

    fn load(&mut self, wl: &Workload) -> Result<()> {
        let load: Vec<Op> = wl
            .load
            .iter()
            .map(|(k, v)| Op::Put(k.clone(), v.clone()))
            .collect();
        self.run(&load, 1000).map(|_| ())
    }

    /// Runs `ops`, `batch` per request batch and commit; returns the time taken.
    fn run(&mut self, ops: &[Op], batch: usize) -> Result<Duration> {
        let t0 = Instant::now();
        match self {
            YcsbStore::Capsule { kv, model, .. } => {
                for chunk in ops.chunks(batch) {
                    kv.batch(chunk, model)?;
                }
                kv.c.flush_acks()?;
            }
            YcsbStore::Redb { kv, model, .. } => {
                for chunk in ops.chunks(batch) {
                    kv.batch(chunk, model)?;
                }
            }
        }
        Ok(t0.elapsed())
    }
}

impl Drop for YcsbStore {
    fn drop(&mut self) {
        if let YcsbStore::Redb { dir, .. } = self {
            let _ = std::fs::remove_dir_all(&*dir);
        }
    }
}

// ---------------------------------------------------------------------------------------
// merkle: proof size and verify time of the per-capsule log.

fn merkle_part(args: &CapsuleArgs) -> Result<()> {
    println!(
        "## merkle: per-capsule Merkle log (RFC 6962, BLAKE3), {} sampled proofs per size",
        args.merkle_samples
    );
    println!();
    println!(
        "| records n | log2 n | inclusion: hashes (mean / max) | hash bytes | verify µs | consistency: hashes (mean / max) | hash bytes | verify µs |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let algo = HashAlgo::Blake3;
    let mut rng = SmallRng::seed_from_u64(3);
    let max = args.merkle_sizes.iter().copied().max().unwrap_or(0);
    let mut log = MerkleLog::new(algo);
    let mut sizes = args.merkle_sizes.clone();
    sizes.sort_unstable();
    let mut leaves: Vec<Digest> = Vec::with_capacity(max as usize);
    for &n in &sizes {
        ensure!(n >= 2, "Merkle sizes must be at least 2");
        while log.size() < n {
            let mut name = [0u8; 32];
            rng.fill_bytes(&mut name);
            let leaf = CapsuleDag::log_leaf(&RecordName(Hash::new(algo, name)));
            leaves.push(leaf);
            log.push(leaf);
        }
        let root = log.root_at(n)?;
        // Inclusion.
        let mut samples = Vec::with_capacity(args.merkle_samples);
        for _ in 0..args.merkle_samples {
            let i = rng.random_range(0..n);
            samples.push((i, log.inclusion_proof(i, n)?));
        }
        let t0 = Instant::now();
        for (i, p) in &samples {
            merkle::verify_inclusion(algo, *i, n, &leaves[*i as usize], p, &root)?;
        }
        let inc_us = t0.elapsed().as_secs_f64() * 1e6 / samples.len().max(1) as f64;
        // A tampered proof must fail.
        if let Some((i, p)) = samples.first() {
            let mut bad = p.clone();
            if let Some(x) = bad.first_mut() {
                x[0] ^= 1;
                ensure!(
                    merkle::verify_inclusion(algo, *i, n, &leaves[*i as usize], &bad, &root)
                        .is_err(),
                    "a tampered inclusion proof verified"
                );
            }
        }
        let inc_mean =
            samples.iter().map(|s| s.1.len()).sum::<usize>() as f64 / samples.len().max(1) as f64;
        let inc_max = samples.iter().map(|s| s.1.len()).max().unwrap_or(0);
        // Consistency from a random earlier size.
        let mut cons = Vec::with_capacity(args.merkle_samples);
        for _ in 0..args.merkle_samples {
            let m = rng.random_range(1..n);
            cons.push((m, log.root_at(m)?, log.consistency_proof(m, n)?));
        }
        let t0 = Instant::now();
        for (m, r1, p) in &cons {
            merkle::verify_consistency(algo, *m, n, r1, &root, p)?;
        }
        let con_us = t0.elapsed().as_secs_f64() * 1e6 / cons.len().max(1) as f64;
        if let Some((m, r1, p)) = cons.iter().find(|c| !c.2.is_empty()) {
            let mut bad = p.clone();
            bad[0][0] ^= 1;
            ensure!(
                merkle::verify_consistency(algo, *m, n, r1, &root, &bad).is_err(),
                "a tampered consistency proof verified"
            );
        }
        let con_mean =
            cons.iter().map(|s| s.2.len()).sum::<usize>() as f64 / cons.len().max(1) as f64;
        let con_max = cons.iter().map(|s| s.2.len()).max().unwrap_or(0);
        println!(
            "| {n} | {:.1} | {inc_mean:.1} / {inc_max} | {:.0} | {inc_us:.2} | {con_mean:.1} / {con_max} | {:.0} | {con_us:.2} |",
            (n as f64).log2(),
            inc_mean * 32.0,
            con_mean * 32.0
        );
    }
    println!();
    Ok(())
}

// ---------------------------------------------------------------------------------------

/// Runs `cairn bench capsule`.
pub fn run(args: &CapsuleArgs, durability: Durability, dir: &Path) -> Result<()> {
    println!(
        "# cairn bench capsule: durability {} ({}), {} cores, store under {}",
        durability.name(),
        match durability {
            Durability::PerWrite => "one fdatasync per acknowledged commit",
            Durability::Group =>
                "group commit: every acknowledged commit fdatasync'ed, syncs shared",
            Durability::Buffered => "acknowledged once written to the kernel, no sync",
        },
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        dir.display()
    );
    println!();
    ensure!(!args.mirror.is_empty(), "--mirror needs at least one mode");
    for &part in &args.parts {
        if part == Part::Merkle {
            merkle_part(args)?;
            continue;
        }
        for &t in &args.transport {
            match part {
                Part::Seq => seq(args, dir, durability, t)?,
                Part::Many => many(args, dir, durability, t)?,
                Part::Ycsb => ycsb(args, dir, durability, t)?,
                Part::Conc => conc(args, dir, durability, t)?,
                Part::Merkle => {}
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_is_skewed_and_in_range() {
        let mut rng = SmallRng::seed_from_u64(1);
        let z = Zipf::new(1000);
        let mut hits = vec![0u32; 1000];
        for _ in 0..100_000 {
            hits[z.next(&mut rng) as usize] += 1;
        }
        assert!(hits[0] > hits[10] && hits[10] > hits[500]);
        assert!(hits[0] > 5_000);
    }

    /// The scrambled zipfian spreads as YCSB's does over 10,000 records: its hottest key
    /// takes about 4% of the draws (a zipfian drawn over the 10,000 alone gives it about
    /// 10%), and the keys outside the hottest 100 take most of them.
    #[test]
    fn scrambled_zipf_spreads_as_ycsb_does() {
        let mut rng = SmallRng::seed_from_u64(7);
        let z = Zipf::scrambled();
        let n = 10_000u64;
        let mut hits = vec![0u32; n as usize];
        let draws = 200_000;
        for _ in 0..draws {
            hits[(fnv64(z.next(&mut rng)) % n) as usize] += 1;
        }
        hits.sort_unstable_by(|a, b| b.cmp(a));
        let share = |k: u32| f64::from(k) / f64::from(draws);
        assert!((0.03..0.05).contains(&share(hits[0])), "{}", share(hits[0]));
        let top100: u32 = hits[..100].iter().sum();
        assert!(share(top100) < 0.5, "{}", share(top100));
        let mut unscrambled = vec![0u32; n as usize];
        let zn = Zipf::new(n);
        for _ in 0..draws {
            unscrambled[zn.next(&mut rng) as usize] += 1;
        }
        assert!(share(unscrambled[0]) > 0.08, "{}", share(unscrambled[0]));
    }

    #[test]
    fn small_run_of_every_part_checks_out() {
        let dir = tempfile::tempdir().unwrap();
        let args = CapsuleArgs {
            parts: vec![Part::Seq, Part::Many, Part::Ycsb, Part::Conc, Part::Merkle],
            transport: vec![Transport::Inproc, Transport::Tcp],
            api: vec![Api::Flexible, Api::Subrecord],
            seq_records: 200,
            per_sig: vec![1, 100],
            uncached_proofs: 50,
            mirror: vec![Mirror::Issue, Mirror::Ack],
            proof_window: Some(4),
            many_records: 400,
            many_clients: vec![1, 4],
            requests: vec![Requests::Single, Requests::Batch],
            ycsb: vec!['a', 'b', 'c', 'd'],
            ycsb_records: 100,
            ycsb_ops: 300,
            ycsb_value: 16,
            ycsb_batch: vec![1, 50],
            ycsb_traces: None,
            ycsb_verify_own: false,
            conc_clients: vec![1, 3],
            conc_records: 60,
            merkle_sizes: vec![10, 1000],
            merkle_samples: 20,
            cipher: Cipher::Aes256GcmSiv,
        };
        run(&args, Durability::Buffered, dir.path()).unwrap();
        // The other ciphers, on the parts that read bodies back.
        for cipher in [Cipher::XChaCha20Poly1305, Cipher::Plaintext] {
            let args = CapsuleArgs {
                parts: vec![Part::Seq, Part::Many, Part::Ycsb],
                transport: vec![Transport::Inproc],
                cipher,
                ..args.clone()
            };
            run(&args, Durability::Buffered, dir.path()).unwrap();
        }
    }
}

//! Client mode: `cairn --server URL <command>` runs the local commands against a node's
//! native HTTP API (docs/node.md, Native API) instead of the embedded store, with the same
//! output and exit codes.
//!
//! - Errors: the node's JSON `{"error": {"kind", "message"}}` becomes the same
//!   [`cairn_core::Error`] variant local mode would fail with (so the exit code is the same);
//!   `unauthorized` (a refused request signature) is [`Error::Rejected`], `too_large` is
//!   [`Error::InvalidInput`], a node that cannot be reached is [`Error::Unavailable`].
//! - Buckets: `--bucket` names a native bucket. A write to a bucket that does not exist
//!   creates it owned by the writer key (`--key-file`), as local mode makes that key the
//!   bucket's writer; every mutation of an owned bucket is signed with that key
//!   (`Cairn-Ed25519`, [`RequestToSign`]). The signature covers the body's BLAKE3 hash,
//!   so an upload to an owned bucket reads its input twice (hash, then send); stdin is
//!   first spooled to a temporary file for that.
//! - Streaming: uploads are streamed from the file or stdin (a sized body when the length
//!   is known, chunked otherwise) in 256 KiB pieces read on their own thread and sent by
//!   reqwest's async client; downloads are streamed to the file or stdout; memory stays
//!   constant whatever the size. Progress bars on stderr when it is a terminal.
//! - Encryption: `put --encrypt` and `get --decrypt` (see [`crate::crypt`]).
//! - Reads: `get` takes the node's verified stream of the version and checks every chunk
//!   against the uid before using a byte ([`crate::verified`]).
//! - Proofs: `verify --proof` fetches the proof and the bucket's capsule metadata and checks
//!   the proof locally against the metadata, whose hash is the capsule name it prints, then
//!   the version's content as `get` does; `--capsule NAME` pins the name (a different one
//!   fails with exit 11).
//!
//! Commands that need the store itself (`verify` without `--proof`, `gc`, `stats`,
//! `recovery`, `demo`, `serve`) are refused: run them on the node.

use std::fs::File;
use std::io::{self, BufWriter, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use cairn_capsule::{CapsuleMetadata, CapsuleName, VersionProof};
use cairn_core::{Error, SigningKey};
use cairn_node::native::auth::{CONTEXT_HEADER, RequestToSign, now_secs};
use cairn_node::native::objects::OWNER_SEAL_HEADER;
use cairn_node::native::values::json_bytes;
use cairn_node::native::versions::CHUNKS_TYPE;
use cairn_object::evidence;
use cairn_object::{At, BuiltinResolver, DEFAULT_BRANCH, DiffCursor, Uid, ValueType};
use cairn_store::{ChunkStore, MemoryStore};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::{Method, StatusCode, Url};
use serde_json::{Value as J, json};

use crate::cli::{Cli, Command, GetArgs, MergeArgs, PutArgs, UpdateArgs, progress_bar};
use crate::digest::{TreeDigest, TreeShape};
use crate::verified::VerifiedValue;
use crate::{crypt, format};

/// Characters left alone in a path segment or query value: RFC 3986's unreserved set.
const ENCODE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Largest error body read from the node.
const ERROR_BODY_LIMIT: u64 = 1 << 20;
/// Largest JSON answer read from the node.
const JSON_LIMIT: u64 = 64 << 20;
/// Bytes per piece of a streamed upload. reqwest's blocking client hands a request body
/// from the caller's thread to its runtime thread 8 KiB at a time (131,072 hand-offs per
/// GiB; a third of the client's samples in `perf`, docs/benchmarks.md "Cold reads and CLI
/// writes"), so streamed uploads go through its async client instead, read on their own
/// thread in pieces of this size.
const UPLOAD_PIECE: usize = 256 << 10;
/// Streamed pieces read ahead of the connection.
const UPLOAD_QUEUE: usize = 4;
/// Pieces of a download received ahead of the reader.
const DOWNLOAD_QUEUE: usize = 16;
/// Keys asked for per page.
const KEYS_PAGE: usize = 10_000;
/// Farthest history distance the node serves in one log request.
const MAX_TRACK_DISTANCE: u64 = 10_000;

fn enc(s: &str) -> String {
    utf8_percent_encode(s, ENCODE).to_string()
}

/// Runs `cli.command` against the node at `server`.
pub fn run(cli: Cli, server: &str) -> Result<ExitCode> {
    let mut c = Client::new(&cli, server)?;
    let out = io::stdout();
    let mut out = out.lock();
    match cli.command {
        Command::Put(a) => c.put(a, cli.data_key_file.as_deref(), &mut out)?,
        Command::Get(a) => c.get(a, cli.data_key_file.as_deref(), &mut out)?,
        Command::Update(a) => c.update(a, &mut out)?,
        Command::Fork { key, from, to } => {
            let r = c.control("fork", &key, json!({ "from": from, "branch": to }))?;
            // A fork makes no version: the branch starts at the one forked from.
            let (uid, _) = c.written_version(&key, &r, "fork")?;
            if let At::Uid(u) = At::parse(&from)
                && u != uid
            {
                bail!(Error::Rejected(format!(
                    "the node forked {key:?} at {uid}, not at {u}"
                )));
            }
            writeln!(out, "{uid}")?;
        }
        Command::Merge(a) => c.merge(a, &mut out)?,
        Command::Rename { key, from, to } => {
            c.control("rename", &key, json!({ "from": from, "to": to }))?;
        }
        Command::Remove { key, branch } => {
            let url = c.url("objects", Some(&key), &[("branch", branch.clone())])?;
            let signer = c.signer()?;
            let resp = c.send(Method::DELETE, url, Vec::new(), &[], signer.as_ref())?;
            let r = read_json(resp)?;
            let gone = match c.get_json(c.url("branches", Some(&key), &[])?) {
                Err(e) => matches!(e.downcast_ref::<Error>(), Some(Error::NotFound(_))),
                Ok(_) => false,
            };
            if gone {
                let uid = r
                    .get("removed")
                    .and_then(J::as_str)
                    .and_then(|u| u.parse::<Uid>().ok())
                    .map_or("UID".to_string(), |u| u.to_string());
                eprintln!("{}", crate::cli::last_branch_removed(&key, &branch, &uid));
            }
        }
        Command::Branches { key, untagged } => c.branches(&key, untagged, &mut out)?,
        Command::Keys => c.keys(&mut out)?,
        Command::Log { key, branch, limit } => c.log(&key, &branch, limit, &mut out)?,
        Command::Diff { key, a, b } => c.diff(&key, a, b, &mut out)?,
        Command::Lca { key, a, b } => {
            let q = [
                ("a", a.clone()),
                ("b", b.clone()),
                ("chunks", "true".into()),
            ];
            let sent = c.chunks_answer(c.url("lca", Some(&key), &q)?, &a, &b)?;
            // The search runs here, over the versions' Meta chunks, each hashed as it
            // arrives (nothing of the history is held).
            let chunks = cairn_object::evidence::StreamedChunks::new(sent.body, sent.a.algo());
            match cairn_object::evidence::check_lca(&chunks, key.as_bytes(), &sent.a, &sent.b)? {
                Some(u) => writeln!(out, "{u}")?,
                None => bail!(Error::not_found(
                    "common ancestor (the histories are disjoint)"
                )),
            }
        }
        Command::Verify {
            key: Some(key),
            proof: true,
            uid,
            branch,
            out: file,
            capsule,
        } => c.verify_proof(&key, uid, branch, file.as_deref(), capsule, &mut out)?,
        Command::Bucket { metadata_out } => c.bucket(metadata_out.as_deref(), &mut out)?,
        Command::Verify { .. }
        | Command::Gc
        | Command::Stats
        | Command::Recovery { .. }
        | Command::Demo
        | Command::Serve(_) => bail!(Error::invalid(
            "this command works on a store directly, not through --server: run it on the node \
             (verify --proof KEY works remotely)"
        )),
        Command::Bench(_) | Command::Keygen { .. } | Command::VerifyProof { .. } => {
            bail!(Error::invalid("this command does not use --server"))
        }
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// The node connection and what client mode learned about the bucket.
struct Client {
    base: String,
    /// How long a transfer may go without a byte from the node (`None`: for ever).
    stall: Option<Duration>,
    bucket: String,
    key_file: Option<PathBuf>,
    /// The bucket's signer once known: `Some(None)` for an open bucket.
    signer: Option<Option<SigningKey>>,
    /// The bucket's capsule name, learned with the signer: signed requests are bound to
    /// it (`X-Cairn-Capsule`), so they cannot be replayed on another node.
    capsule: std::cell::RefCell<Option<String>>,
    /// How the bucket chunks blobs, learned with the signer: a blob put's version must
    /// hold the tree of the bytes sent ([`crate::digest`]).
    shape: std::cell::Cell<Option<TreeShape>>,
    /// The bucket's capsule metadata as the node described it (checked before a put is
    /// sealed for the capsule it names).
    metadata: std::cell::RefCell<Option<CapsuleMetadata>>,
}

impl Client {
    fn new(cli: &Cli, server: &str) -> Result<Self> {
        let base = server.trim_end_matches('/').to_string();
        let url = Url::parse(&base)
            .map_err(|e| Error::invalid(format!("--server {server:?} is not a URL: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            bail!(Error::invalid(format!(
                "--server {server:?} must start with http:// or https://"
            )));
        }
        Ok(Client {
            base,
            stall: (cli.stall_timeout > 0.0).then(|| Duration::from_secs_f64(cli.stall_timeout)),
            bucket: cli.bucket.clone(),
            key_file: cli.key_file.clone(),
            signer: None,
            capsule: std::cell::RefCell::new(None),
            shape: std::cell::Cell::new(None),
            metadata: std::cell::RefCell::new(None),
        })
    }

    /// `/v1/buckets/{bucket}[/{op}[/{key}]]?query`.
    fn url(&self, op: &str, key: Option<&str>, query: &[(&str, String)]) -> Result<Url> {
        if key == Some("") {
            // As in local mode (the node could only answer that no route matches).
            bail!(Error::invalid("key must not be empty"));
        }
        if let Some(k @ ("." | "..")) = key {
            // URL parsers remove such path segments, escaped or not: the request would
            // reach another route.
            bail!(Error::invalid(format!(
                "key {k:?} cannot be named in a URL path, so not through a node; use \
                 another key (local mode takes it)"
            )));
        }
        let mut s = format!("{}/v1/buckets/{}", self.base, enc(&self.bucket));
        if !op.is_empty() {
            s.push('/');
            s.push_str(op);
        }
        if let Some(k) = key {
            s.push('/');
            s.push_str(&enc(k));
        }
        for (i, (name, value)) in query.iter().enumerate() {
            s.push(if i == 0 { '?' } else { '&' });
            s.push_str(name);
            s.push('=');
            s.push_str(&enc(value));
        }
        Url::parse(&s).map_err(|e| Error::invalid(format!("bad request URL {s:?}: {e}")).into())
    }

    /// Sends a request, signing it with `signer` when given (each signature carries a
    /// fresh nonce, so the same request sent twice within a second is not a replay), and
    /// returns the answer's headers and body as [`Client::request`] does: within the stall
    /// timeout for its head (plus the time `body` takes at [`SLOWEST_UPLINK`]) and for each
    /// piece of its body.
    fn send(
        &self,
        method: Method,
        url: Url,
        body: Vec<u8>,
        headers: &[(&str, String)],
        signer: Option<&SigningKey>,
    ) -> Result<Answer> {
        let hash = signer.map(|_| *blake3::hash(&body).as_bytes());
        let capsule = self.capsule.borrow().clone();
        let headers = request_headers(&method, &url, headers, signer, hash, capsule.as_deref());
        self.request(method, url, body, headers)
    }

    /// Streams `body` (`len` bytes, or chunked when `None`) as the body of a request and
    /// returns the node's JSON answer. The body is read on its own thread in
    /// [`UPLOAD_PIECE`]s and sent by reqwest's async client on a current-thread runtime. A
    /// signed request needs the body's BLAKE3 hash (`body_hash`) up front. With `shape`,
    /// every piece read also goes to a [`TreeDigest`], and a successful answer comes with
    /// the tree of the bytes sent.
    #[allow(clippy::too_many_arguments)]
    fn send_stream(
        &self,
        method: Method,
        url: Url,
        body: Box<dyn Read + Send>,
        len: Option<u64>,
        headers: &[(&str, String)],
        signer: Option<&SigningKey>,
        body_hash: Option<[u8; 32]>,
        shape: Option<TreeShape>,
    ) -> Result<(J, Option<cairn_object::TreeRef>)> {
        if signer.is_some() && body_hash.is_none() {
            bail!(Error::invalid("a signed stream needs its hash first"));
        }
        let capsule = self.capsule.borrow().clone();
        let mut all = request_headers(
            &method,
            &url,
            headers,
            signer,
            body_hash,
            capsule.as_deref(),
        );
        if let Some(n) = len {
            all.push(("content-length".to_string(), n.to_string()));
        }
        let (rt, http) = async_http()?;
        let (tee, digest) = shape.map(TreeDigest::blob).transpose()?.unzip();
        let (reader, rx, watch) = read_in_pieces(body, UPLOAD_PIECE, tee)?;
        // Told when the last piece has been taken (the declared length reached: the client
        // then stops asking for more, or the end of the body): from then on the node owes
        // an answer.
        let sent = std::sync::Arc::new(tokio::sync::Notify::new());
        let taken_total = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        // Whether the body's end was reached (the input read to its end).
        let ended = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        // When a piece was last taken, in milliseconds since `started` (`u64::MAX` until
        // the request first asks for one: connecting and sending the head come first).
        let last_taken = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX));
        let started = std::time::Instant::now();
        let state = (rx, sent.clone(), taken_total.clone(), ended.clone(), 0u64);
        let lt = last_taken.clone();
        let stream =
            futures_util::stream::unfold(state, move |(mut rx, sent, total, ended, taken)| {
                let lt = lt.clone();
                async move {
                    match rx.recv().await {
                        Some(piece) => {
                            lt.store(
                                started.elapsed().as_millis() as u64,
                                std::sync::atomic::Ordering::Release,
                            );
                            let taken = taken + piece.as_ref().map_or(0, |p| p.len() as u64);
                            total.store(taken, std::sync::atomic::Ordering::Release);
                            if len == Some(taken) {
                                sent.notify_one();
                            }
                            Some((piece, (rx, sent, total, ended, taken)))
                        }
                        None => {
                            ended.store(true, std::sync::atomic::Ordering::Release);
                            sent.notify_one();
                            None
                        }
                    }
                }
            });
        let (base, stall) = (&self.base, self.stall);
        let answer = rt.block_on(async {
            let mut req = http
                .request(method, url)
                .body(reqwest::Body::wrap_stream(stream));
            for (n, v) in &all {
                req = req.header(n.as_str(), v.as_str());
            }
            // The upload takes as long as it takes; once its last piece is handed over, the
            // answer's head must come within the stall timeout, plus the time the bytes
            // still queued on the way (that piece, the socket's send buffer) take to drain
            // at the rate the upload went so far.
            let send = req.send();
            let mut resp = match stall {
                None => send.await.map_err(|e| transport(base, e))?,
                Some(d) => {
                    let quiet = async {
                        sent.notified().await;
                        let taken = taken_total.load(std::sync::atomic::Ordering::Acquire);
                        let wait = d + drain_allowance(taken, started.elapsed());
                        tokio::time::sleep(wait).await;
                        wait
                    };
                    // A node that stops reading the body (its connection open, the input
                    // ready, a piece waiting for room) for the stall timeout has stalled:
                    // nothing else ends such an upload (no write timeout in the client).
                    let not_reading = async {
                        loop {
                            tokio::time::sleep(d.min(Duration::from_secs(1))).await;
                            let at = last_taken.load(std::sync::atomic::Ordering::Acquire);
                            if at == u64::MAX {
                                continue;
                            }
                            let idle = started.elapsed().saturating_sub(Duration::from_millis(at));
                            if idle >= d && watch.waiting.load(std::sync::atomic::Ordering::Acquire)
                            {
                                return idle;
                            }
                        }
                    };
                    tokio::select! {
                        r = send => r.map_err(|e| transport(base, e))?,
                        wait = quiet => {
                            return Err(stalled(base, "the answer to an upload", wait));
                        }
                        idle = not_reading => {
                            return Err(stalled(base, "reading the upload", idle));
                        }
                    }
                }
            };
            let status = resp.status();
            // The answer is small JSON: read at most one byte past the limit, which
            // `parse_json` then refuses, whatever a node sends.
            let mut body = Vec::new();
            while let Some(chunk) = within(stall, base, "the answer", resp.chunk()).await? {
                body.extend_from_slice(&chunk);
                if body.len() as u64 > JSON_LIMIT {
                    break;
                }
            }
            Ok::<_, anyhow::Error>((status, body))
        });
        // A node that answers before reading the whole body (413, 401, ...) leaves the
        // body stream, and with it the reader thread's receiver, inside a connection task
        // of this runtime: drop them, so the reader's next send fails and it stops, before
        // waiting for it.
        drop(http);
        drop(rt);
        let input_error = || {
            watch
                .error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
                .map(|(kind, what)| Error::io("reading the upload", io::Error::new(kind, what)))
        };
        // The input failed (a read error; a file that shrank or grew while it was sent):
        // that explains a failed transfer, and fails a success answer (exit 10); a node's
        // own error answer stays the error (its exit code), the input's noted with it.
        let input = input_error();
        let (status, answer) = match answer {
            Ok(a) => a,
            // The transfer failed because the input did: the input's error, the transfer's
            // noted with it.
            Err(e) => {
                return Err(match input {
                    Some(i) => {
                        eprintln!("note: the transfer then failed: {e:#}");
                        i.into()
                    }
                    None => e,
                });
            }
        };
        if !status.is_success() {
            if let Some(i) = input {
                eprintln!("note: the input failed too: {i}");
            }
            return Err(error_from(status, &answer));
        }
        if let Some(i) = input {
            bail!(i);
        }
        // A success answer before the whole body was sent (its declared length, or the end
        // of a chunked one) is no answer to this upload: what the version is checked
        // against below would be only the part read so far.
        let taken = taken_total.load(std::sync::atomic::Ordering::Acquire);
        let whole = match len {
            Some(n) => taken == n,
            None => ended.load(std::sync::atomic::Ordering::Acquire),
        };
        if !whole {
            bail!(Error::Rejected(format!(
                "node {} answered the upload before all of it was sent ({taken} bytes{}); \
                 it stored something else",
                self.base,
                len.map_or(String::new(), |n| format!(" of {n}"))
            )));
        }
        // After a complete upload the reader has finished (after a failure it may still
        // wait on a slow input, a terminal or a pipe, and is left: the process is ending).
        let _ = reader.join();
        if let Some(e) = input_error() {
            bail!(e);
        }
        // The reader, and with it the builder's sender, is done after a complete upload.
        let tree = digest.map(TreeDigest::finish).transpose()?;
        Ok((parse_json(&answer)?, tree))
    }

    /// A GET whose body is read as [`Client::request`] reads it.
    fn download(&self, url: Url) -> Result<Answer> {
        let capsule = self.capsule.borrow().clone();
        let headers = request_headers(&Method::GET, &url, &[], None, None, capsule.as_deref());
        self.request(Method::GET, url, Vec::new(), headers)
    }

    /// Sends a request with `body` and `headers` (already signed, if it is), whose answer
    /// is read by reqwest's async client on a thread of its own and handed over in the
    /// pieces the connection yields (no copy, no hand-off per 8 KiB as the blocking client
    /// makes). Returns the answer's headers and a [`Read`] of its body; an error answer is
    /// returned as its [`Error`]. Nothing waits longer than the stall timeout for the node
    /// (plus, for the answer's head, the time `body` takes at [`SLOWEST_UPLINK`]).
    fn request(
        &self,
        method: Method,
        url: Url,
        body: Vec<u8>,
        headers: Vec<(String, String)>,
    ) -> Result<Answer> {
        let (head_tx, head_rx) = std::sync::mpsc::sync_channel(1);
        let (tx, rx) = std::sync::mpsc::sync_channel::<io::Result<bytes::Bytes>>(DOWNLOAD_QUEUE);
        let (base, stall) = (self.base.clone(), self.stall);
        // The body is in memory and handed over at once: the answer's head may also take
        // the time all of it takes at the slowest rate assumed.
        let head_stall =
            stall.map(|d| d + Duration::from_secs_f64(body.len() as f64 / SLOWEST_UPLINK));
        let mutation = method != Method::GET;
        std::thread::Builder::new()
            .name("cairn-request".into())
            .spawn(move || {
                let run = || -> Result<()> {
                    let (rt, http) = async_http()?;
                    rt.block_on(async {
                        let mut req = http.request(method, url);
                        for (n, v) in &headers {
                            req = req.header(n.as_str(), v.as_str());
                        }
                        if !body.is_empty() {
                            req = req.body(body);
                        }
                        let what = if mutation {
                            "the answer (the node may still carry the request out: look \
                             before sending it again)"
                        } else {
                            "the answer"
                        };
                        let mut resp = within(head_stall, &base, what, req.send()).await?;
                        let status = resp.status();
                        if !status.is_success() {
                            let mut body = Vec::new();
                            while let Some(c) =
                                within(stall, &base, "the answer", resp.chunk()).await?
                            {
                                body.extend_from_slice(&c);
                                if body.len() as u64 > ERROR_BODY_LIMIT {
                                    break;
                                }
                            }
                            return Err(error_from(status, &body));
                        }
                        if head_tx.send(Ok(resp.headers().clone())).is_err() {
                            return Ok(());
                        }
                        loop {
                            let piece =
                                match within(stall, &base, "the download", resp.chunk()).await {
                                    Ok(Some(c)) => Ok(c),
                                    Ok(None) => return Ok(()),
                                    // Kept whole inside the I/O error the reader sees,
                                    // so the exit code is the node's (9), not I/O's.
                                    Err(e) => Err(match e.downcast::<Error>() {
                                        Ok(err) => io::Error::other(err),
                                        Err(e) => io::Error::other(e.to_string()),
                                    }),
                                };
                            let failed = piece.is_err();
                            // The reader went away (it found what it needed, or failed).
                            if tx.send(piece).is_err() || failed {
                                return Ok(());
                            }
                        }
                    })
                };
                if let Err(e) = run() {
                    let _ = head_tx.send(Err(e));
                }
            })
            .context("starting the request thread")?;
        let head = head_rx.recv().map_err(|_| {
            Error::Unavailable(format!("node {}: the request stopped", self.base))
        })??;
        Ok((
            head,
            Pieces {
                rx,
                piece: bytes::Bytes::new(),
            },
        ))
    }

    fn get_json(&self, url: Url) -> Result<J> {
        read_json(self.download(url)?)
    }

    /// The key that signs this bucket's mutations (`None` for an open bucket); a bucket that
    /// does not exist yet is created, owned by the writer key.
    fn signer(&mut self) -> Result<Option<SigningKey>> {
        if self.signer.is_none() {
            let s = self.find_signer()?;
            self.signer = Some(s);
        }
        Ok(self.signer.clone().flatten())
    }

    fn key_path(&self) -> Result<PathBuf> {
        match &self.key_file {
            Some(p) => Ok(p.clone()),
            None => cairn_node::keys::default_writer_key(),
        }
    }

    fn find_signer(&self) -> Result<Option<SigningKey>> {
        for _ in 0..2 {
            match self.get_json(self.url("", None, &[])?) {
                Ok(info) => {
                    self.note_bucket(&info);
                    let Some(owner) = info.get("owner").and_then(J::as_str) else {
                        // Someone may have taken the name before its owner: say so.
                        eprintln!(
                            "note: bucket {} on {} is open (it has no owner key): anyone who \
                             can reach the node can change or delete what it holds",
                            self.bucket, self.base
                        );
                        return Ok(None);
                    };
                    let path = self.key_path()?;
                    if !path.exists() {
                        bail!(Error::Rejected(format!(
                            "bucket {} is owned by {owner}; its key is not at {} (--key-file)",
                            self.bucket,
                            path.display()
                        )));
                    }
                    let key = cairn_node::keys::read(&path)?;
                    if key.public().to_string() != owner {
                        bail!(Error::Rejected(format!(
                            "bucket {} is owned by {owner}, not by the key in {} ({})",
                            self.bucket,
                            path.display(),
                            key.public()
                        )));
                    }
                    return Ok(Some(key));
                }
                Err(e) if matches!(e.downcast_ref::<Error>(), Some(Error::NotFound(_))) => {
                    let key = cairn_node::keys::read_or_create(&self.key_path()?, "writer", true)?;
                    let body = serde_json::to_vec(
                        &json!({ "name": self.bucket, "owner": key.public().to_string() }),
                    )?;
                    let url = Url::parse(&format!("{}/v1/buckets", self.base))?;
                    match self.send(
                        Method::POST,
                        url,
                        body,
                        &[("content-type", "application/json".into())],
                        Some(&key),
                    ) {
                        Ok(resp) => {
                            self.note_bucket(&read_json(resp)?);
                            eprintln!(
                                "created bucket {} on {}, owned by writer key {}",
                                self.bucket,
                                self.base,
                                key.public()
                            );
                            return Ok(Some(key));
                        }
                        // Someone else created it meanwhile: look again.
                        Err(e)
                            if matches!(
                                e.downcast_ref::<Error>(),
                                Some(Error::AlreadyExists(m)) if !m.contains("outside")
                            ) => {}
                        Err(e) => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            }
        }
        bail!(Error::Unavailable(format!(
            "bucket {} could not be opened or created",
            self.bucket
        )))
    }

    /// Notes what the bucket's description says about its capsule and its chunking.
    fn note_bucket(&self, info: &J) {
        *self.capsule.borrow_mut() = info.get("capsule").and_then(J::as_str).map(str::to_string);
        self.shape.set(TreeShape::from_info(info));
        *self.metadata.borrow_mut() = info
            .get("metadata")
            .and_then(J::as_str)
            .and_then(|h| hex::decode(h).ok())
            .and_then(|b| CapsuleMetadata::decode(&b).ok());
    }

    /// The capsule a put to this bucket by `owner` is sealed for: the one the node named,
    /// once its metadata (as the node sent it) hashes to that name, names this bucket and
    /// names `owner` as the bucket's owner; a node naming another bucket's capsule (of
    /// the same owner key, say) would have the owner seal a put into that bucket. `None`
    /// (with a note) when no seal can be made: the node names no capsule or sends no
    /// metadata, or the capsule names no owner key (a bucket made before owner keys were
    /// bound into capsules).
    fn sealing_capsule(&self, owner: &SigningKey) -> Result<Option<CapsuleName>> {
        let unsealed = |why: &str| {
            eprintln!(
                "note: {why}: this put to bucket {} is not sealed by its owner",
                self.bucket
            );
            Ok(None)
        };
        let Some(named) = self.capsule.borrow().clone() else {
            return unsealed("the node does not name the bucket's capsule");
        };
        let capsule: CapsuleName = named.parse().map_err(|e| {
            Error::Rejected(format!(
                "the node names the bucket's capsule {named:?}: {e}"
            ))
        })?;
        let meta = self.metadata.borrow();
        let Some(meta) = meta.as_ref() else {
            return unsealed("the node does not send the bucket's capsule metadata");
        };
        if meta.name() != capsule {
            bail!(Error::Rejected(format!(
                "the node's metadata for bucket {} hashes to capsule {}, not the {capsule} it \
                 names",
                self.bucket,
                meta.name()
            )));
        }
        check_bucket_named(meta, &self.bucket)?;
        match cairn_capsule::bucket_owner(meta)? {
            Some(k) if k == owner.public() => Ok(Some(capsule)),
            Some(k) => bail!(Error::Rejected(format!(
                "bucket {}'s capsule names owner {k}, not {}",
                self.bucket,
                owner.public()
            ))),
            None => unsealed("the bucket's capsule names no owner key"),
        }
    }

    /// A signed JSON POST to `/{op}/{key}`.
    fn control(&mut self, op: &str, key: &str, body: J) -> Result<J> {
        let url = self.url(op, Some(key), &[])?;
        let body = serde_json::to_vec(&body)?;
        let signer = self.signer()?;
        let resp = self.send(
            Method::POST,
            url,
            body,
            &[("content-type", "application/json".into())],
            signer.as_ref(),
        )?;
        read_json(resp)
    }

    fn put(&mut self, a: PutArgs, data_key: Option<&Path>, out: &mut impl Write) -> Result<()> {
        let mut query = Vec::new();
        match (&a.branch, &a.base) {
            (_, Some(b)) => query.push(("base", b.to_string())),
            (Some(b), None) => query.push(("branch", b.clone())),
            (None, None) => {}
        }
        let ty = a.ty.unwrap_or(if a.value.is_some() && !a.encrypt {
            ValueType::String
        } else {
            ValueType::Blob
        });
        if a.encrypt && ty != ValueType::Blob {
            bail!(Error::invalid(
                "--encrypt stores a blob (of ciphertext); drop --type or use --type blob"
            ));
        }
        query.push(("type", ty.name().to_string()));
        let url = self.url("objects", Some(&a.key), &query)?;
        let mut headers = Vec::new();
        if let Some(g) = a.guard {
            headers.push(("if-match", format!("\"{g}\"")));
        }
        if !a.context.is_empty() {
            // One line of text (checked when the arguments were parsed).
            headers.push((CONTEXT_HEADER, a.context.clone()));
        }
        // An input that cannot be read fails here, before the bucket, the writer key or
        // the data key is created for a put that cannot happen (as in local mode). A
        // named pipe is only looked up: opening it twice would take its writer's first
        // reader.
        if let Some(p) = &a.file {
            let m = std::fs::metadata(p).with_context(|| format!("opening {}", p.display()))?;
            #[cfg(unix)]
            let fifo = std::os::unix::fs::FileTypeExt::is_fifo(&m.file_type());
            #[cfg(not(unix))]
            let fifo = false;
            if !fifo {
                File::open(p).with_context(|| format!("opening {}", p.display()))?;
            }
        }
        let signer = self.signer()?;
        let key = if a.encrypt {
            let path = match data_key {
                Some(p) => p.to_path_buf(),
                None => crypt::default_key_path()?,
            };
            Some(crypt::load_or_create_key(&path, true)?)
        } else {
            None
        };
        // An encrypted value is bound to its bucket and key.
        let place = crypt::binding(&self.bucket, &a.key);
        // What the version must hold: the value given inline, else the length sent, and
        // a blob's tree as the bucket chunks it (built from the bytes as they are sent).
        let mut sent_inline: Option<Vec<u8>> = None;
        let sent_len: Option<u64>;
        let shape = match (ty, self.shape.get()) {
            (ValueType::Blob, None) => bail!(Error::Rejected(format!(
                "the node does not say how bucket {} chunks blobs in a way this client can \
                 use (hash_algo, leaf_size, index_size): what it stores of this put could not \
                 be checked",
                self.bucket
            ))),
            (ValueType::Blob, s) => s,
            _ => None,
        };
        // A value sent in a text form (integer, tuple, list, map, set) is checked against
        // what the text sent makes, parsed here as the node parses it: a list as the tree
        // the bucket builds of its lines, built as they are sent (a list streams, in
        // constant memory, as the node stores it); the other types from the text kept
        // (the node buffers them, at most `BUFFERED_LIMIT` bytes; a map or set compared as
        // the tree the bucket builds of it).
        let text_shape = match ty {
            ValueType::String | ValueType::Blob => None,
            ValueType::Integer | ValueType::Tuple => Some(None),
            _ => match self.shape.get() {
                Some(s) => Some(Some(s)),
                None => bail!(Error::Rejected(format!(
                    "the node does not say how bucket {} builds trees in a way this client \
                     can use (hash_algo, leaf_size, index_size): what it stores of this put \
                     could not be checked",
                    self.bucket
                ))),
            },
        };
        // An owned bucket's put carries the owner's seal over the value it makes (docs/
        // node.md, "Owner seals"), built here from the bytes to send before they are sent,
        // so that its proof shows the owner wrote the content, not only that the node
        // recorded it.
        let sealer = match &signer {
            Some(k) => self.sealing_capsule(k)?.map(|c| (k.clone(), c)),
            None => None,
        };
        let value_shape = match ty {
            ValueType::Blob => shape,
            _ => text_shape.flatten(),
        };
        let seal_branch = match a.base {
            Some(_) => None,
            None => Some(
                a.branch
                    .clone()
                    .unwrap_or_else(|| DEFAULT_BRANCH.to_string()),
            ),
        };
        let seal_base = a.base.or(a.guard);
        let seal_context = a.context.clone();
        let seal_key = a.key.clone();
        let seal_of = |value: &cairn_object::Value| -> Result<(&'static str, String)> {
            let Some((k, capsule)) = &sealer else {
                bail!(Error::invalid("no owner key to seal the put with"));
            };
            let digest = value.digest(capsule.hash().algo());
            let mut nonce = [0u8; cairn_capsule::seal::SEAL_NONCE_LEN];
            getrandom::fill(&mut nonce)
                .map_err(|e| anyhow::anyhow!("the system random source failed: {e}"))?;
            let seal = cairn_capsule::OwnerSeal::sign(
                k,
                &cairn_capsule::SealedPut {
                    capsule,
                    key: seal_key.as_bytes(),
                    branch: seal_branch.as_deref(),
                    base: seal_base.as_ref(),
                    value: &digest,
                    context: seal_context.as_bytes(),
                },
                now_secs(),
                nonce,
            );
            Ok((OWNER_SEAL_HEADER, hex::encode(seal.encode())))
        };
        let (list_tx, list_digest) = match (ty, text_shape) {
            (ValueType::List, Some(Some(s))) => {
                let (tx, d) = TreeDigest::list(s)?;
                (Some(tx), Some(d))
            }
            _ => (None, None),
        };
        let sent_text = (text_shape.is_some() && ty != ValueType::List)
            .then(|| std::sync::Arc::new(std::sync::Mutex::new(Some(Vec::new()))));
        let mut sent_tree = None;
        // A string sent from a file or stdin: the bytes sent, hashed as they go, so the
        // version's value can be checked against them (strings are stored inline).
        let sent_hash = (ty == ValueType::String)
            .then(|| std::sync::Arc::new(std::sync::Mutex::new(blake3::Hasher::new())));
        let tee = |r: Box<dyn Read + Send>| -> Box<dyn Read + Send> {
            match (&sent_hash, &sent_text, &list_tx) {
                (Some(h), _, _) => Box::new(HashTee {
                    inner: r,
                    hasher: h.clone(),
                }),
                (None, Some(t), _) => Box::new(TextTee {
                    inner: r,
                    text: t.clone(),
                }),
                (None, None, Some(tx)) => Box::new(ListTee {
                    inner: r,
                    tx: Some(tx.clone()),
                }),
                (None, None, None) => r,
            }
        };
        let r = if let Some(v) = a.value {
            let body = match &key {
                Some(k) => {
                    let mut c = Vec::new();
                    crypt::EncryptReader::new(v.as_bytes(), k, &place)?.read_to_end(&mut c)?;
                    c
                }
                None => v.into_bytes(),
            };
            sent_len = Some(body.len() as u64);
            if ty == ValueType::String {
                sent_inline = Some(body.clone());
            }
            if let Some(t) = &sent_text {
                *t.lock().unwrap_or_else(|e| e.into_inner()) = Some(body.clone());
            }
            if let Some(tx) = &list_tx {
                // The builder takes the whole text at once (its queue holds it).
                let _ = tx.send(bytes::Bytes::from(body.clone()));
            }
            if let Some(s) = shape {
                sent_tree = Some(s.tree_of(&body)?);
            }
            if sealer.is_some() {
                let value = match &sent_tree {
                    Some(t) => cairn_object::Value::Tree(*t),
                    None => crate::digest::value_of_text(ty, body.clone(), value_shape)?,
                };
                headers.push(seal_of(&value)?);
            }
            read_json(self.send(Method::PUT, url, body, &headers, signer.as_ref())?)?
        } else if let (Some(k), Some(_)) = (&key, &signer) {
            // Signed and encrypted: encrypted once, into a spool of ciphertext hashed as it
            // is written, and that spool sent. Encrypting the input twice (once to hash,
            // once to send) would use one nonce prefix for two readings of a file that may
            // change in between, and a spool of stdin would hold plaintext on disk.
            let (input, len): (Box<dyn Read + Send>, Option<u64>) = match &a.file {
                Some(p) => {
                    let f = File::open(p).with_context(|| format!("opening {}", p.display()))?;
                    let m = f
                        .metadata()
                        .with_context(|| format!("reading {}", p.display()))?;
                    let len = m.is_file().then_some(m.len());
                    (Box::new(io::BufReader::with_capacity(1 << 20, f)), len)
                }
                None => (
                    Box::new(io::BufReader::with_capacity(1 << 20, io::stdin())),
                    None,
                ),
            };
            let (_interrupt, mut spool) =
                crate::cleanup::create_registered(tempfile::NamedTempFile::new, |t| t.path())
                    .context("creating a temporary file for the ciphertext")?;
            let pb = progress_bar(len, "encrypting");
            let mut enc = crypt::EncryptReader::new(pb.wrap_read(input), k, &place)?;
            let mut h = blake3::Hasher::new();
            // The ciphertext's tree, for the seal (the blob the node stores).
            let mut built = sealer
                .as_ref()
                .map(|_| crate::digest::ValueBuilder::new(ValueType::Blob, shape, u64::MAX))
                .transpose()?;
            let mut buf = vec![0u8; 1 << 16];
            loop {
                let n = enc.read(&mut buf).context("reading the input")?;
                if n == 0 {
                    break;
                }
                h.update(&buf[..n]);
                if let Some(b) = &mut built {
                    b.update(&buf[..n]);
                }
                spool
                    .write_all(&buf[..n])
                    .context("writing the ciphertext to a temporary file")?;
            }
            pb.finish_and_clear();
            spool
                .flush()
                .context("writing the ciphertext to a temporary file")?;
            let n = spool
                .as_file()
                .metadata()
                .context("reading the ciphertext's temporary file")?
                .len();
            sent_len = Some(n);
            let f = spool
                .reopen()
                .context("reading the ciphertext's temporary file")?;
            // The tree built for the seal is the one to check the answer against.
            let pre_tree = match built.map(|b| b.finish()).transpose()?.flatten() {
                Some(cairn_object::Value::Tree(t)) => {
                    headers.push(seal_of(&cairn_object::Value::Tree(t))?);
                    Some(t)
                }
                _ => None,
            };
            let pb = progress_bar(Some(n), "put");
            let reader: Box<dyn Read + Send> = tee(Box::new(pb.wrap_read(ExactLen::new(
                io::BufReader::with_capacity(1 << 20, f),
                n,
                spool.path(),
            ))));
            let answer = self.send_stream(
                Method::PUT,
                url,
                reader,
                Some(n),
                &headers,
                signer.as_ref(),
                Some(*h.finalize().as_bytes()),
                if pre_tree.is_some() { None } else { shape },
            );
            pb.finish_and_clear();
            let (answer, tree) = answer?;
            sent_tree = tree.or(pre_tree);
            answer
        } else {
            // A signed upload hashes its body first, which needs a second read: spool stdin,
            // and any input that is not a regular file (a pipe, `<(...)`, a device).
            let mut spooled = None;
            let regular = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.is_file());
            let spool = |from: &mut dyn Read, what: &str| -> Result<_> {
                let (interrupt, mut tmp) =
                    crate::cleanup::create_registered(tempfile::NamedTempFile::new, |t| t.path())
                        .with_context(|| format!("creating a temporary file for {what}"))?;
                io::copy(from, &mut tmp).with_context(|| format!("reading {what}"))?;
                // A tuple drops its fields in order: the file, then its registration.
                Ok((tmp, interrupt))
            };
            let path = match (&a.file, &signer) {
                (Some(p), Some(_)) if !regular(p) => {
                    let mut f =
                        File::open(p).with_context(|| format!("opening {}", p.display()))?;
                    let (tmp, interrupt) = spool(&mut f, &p.display().to_string())?;
                    let t = tmp.path().to_path_buf();
                    spooled = Some((tmp, interrupt));
                    Some(t)
                }
                (Some(p), _) => Some(p.clone()),
                (None, Some(_)) => {
                    let (tmp, interrupt) = spool(&mut io::stdin().lock(), "stdin")?;
                    let p = tmp.path().to_path_buf();
                    spooled = Some((tmp, interrupt));
                    Some(p)
                }
                (None, None) => None,
            };
            // The length only of a regular file: a pipe or a device reports a size that is
            // not what it yields (a pipe says 0), and a declared length the body then does
            // not match is cut or padded by the HTTP layer, silently. Those go chunked.
            let open = |p: &Path| -> Result<(File, Option<u64>)> {
                let f = File::open(p).with_context(|| format!("opening {}", p.display()))?;
                let m = f
                    .metadata()
                    .with_context(|| format!("reading {}", p.display()))?;
                Ok((f, m.is_file().then_some(m.len())))
            };
            let prefix = match &key {
                Some(_) => {
                    let mut p = [0u8; crypt::NONCE_PREFIX];
                    getrandom::fill(&mut p)
                        .map_err(|e| anyhow::anyhow!("the system random source failed: {e}"))?;
                    Some(p)
                }
                None => None,
            };
            let body_reader = |r: Box<dyn Read + Send>| -> Box<dyn Read + Send> {
                match (&key, prefix) {
                    (Some(k), Some(p)) => {
                        Box::new(crypt::EncryptReader::with_nonce_prefix(r, k, p, &place))
                    }
                    _ => r,
                }
            };
            let wire_len = |n: u64| {
                if key.is_some() {
                    crypt::encrypted_len(n)
                } else {
                    n
                }
            };
            // Hashed (and, to seal it, the value it makes built) in one read.
            let mut pre_tree = None;
            let hash = match (&path, &signer) {
                (Some(p), Some(_)) => {
                    let (f, len) = open(p)?;
                    let pb = progress_bar(len, "hashing");
                    let mut r = body_reader(Box::new(pb.wrap_read(io::BufReader::new(f))));
                    let mut h = blake3::Hasher::new();
                    let mut built = sealer
                        .as_ref()
                        .map(|_| crate::digest::ValueBuilder::new(ty, value_shape, BUFFERED_LIMIT))
                        .transpose()?;
                    let mut buf = vec![0u8; 1 << 16];
                    loop {
                        let n = r.read(&mut buf).context("reading the input")?;
                        if n == 0 {
                            break;
                        }
                        h.update(&buf[..n]);
                        if let Some(b) = &mut built {
                            b.update(&buf[..n]);
                        }
                    }
                    pb.finish_and_clear();
                    // (None: a text past what a node buffers, which it refuses anyway.)
                    if let Some(v) = built.map(|b| b.finish()).transpose()?.flatten() {
                        headers.push(seal_of(&v)?);
                        if let (ValueType::Blob, cairn_object::Value::Tree(t)) = (ty, &v) {
                            pre_tree = Some(*t);
                        }
                    }
                    Some(*h.finalize().as_bytes())
                }
                _ => None,
            };
            let (reader, len): (Box<dyn Read + Send>, Option<u64>) = match &path {
                Some(p) => {
                    let (f, len) = open(p)?;
                    let r = io::BufReader::with_capacity(1 << 20, f);
                    match len {
                        // A file that changes while it is sent fails the upload instead of
                        // being cut to (or padded past) the length declared.
                        Some(n) => (Box::new(ExactLen::new(r, n, p)), Some(n)),
                        None => (Box::new(r), None),
                    }
                }
                None => {
                    if io::stdin().is_terminal() {
                        eprintln!(
                            "reading the value from stdin (end with Ctrl-D; or use --value / --file)"
                        );
                    }
                    (
                        Box::new(io::BufReader::with_capacity(1 << 20, io::stdin())),
                        None,
                    )
                }
            };
            sent_len = len.map(wire_len);
            let pb = progress_bar(len, "put");
            let reader = tee(body_reader(Box::new(pb.wrap_read(reader))));
            let answer = self.send_stream(
                Method::PUT,
                url,
                reader,
                len.map(wire_len),
                &headers,
                signer.as_ref(),
                hash,
                if pre_tree.is_some() { None } else { shape },
            );
            pb.finish_and_clear();
            drop(spooled);
            let (answer, tree) = answer?;
            sent_tree = tree.or(pre_tree);
            answer
        };
        let (uid, o) = self.written_version(&a.key, &r, "put")?;
        let lied = |what: String| -> anyhow::Error {
            Error::Rejected(format!("the node's version {uid} of the put {what}")).into()
        };
        if o.value_type() != ty {
            return Err(lied(format!(
                "is a {}, not a {}",
                o.value_type().name(),
                ty.name()
            )));
        }
        if o.context.as_ref() != a.context.as_bytes() {
            return Err(lied("has another context than the one sent".into()));
        }
        // A put on a base (or guarded by the head it expects) makes a version of exactly
        // that base; a branch put, one of the head it found, or of none on a new branch.
        match a.base.or(a.guard) {
            Some(b) if o.bases != [b] => {
                return Err(lied(format!(
                    "does not derive from {b} alone ({} base(s))",
                    o.bases.len()
                )));
            }
            None if o.bases.len() > 1 => {
                return Err(lied(format!("has {} bases", o.bases.len())));
            }
            _ => {}
        }
        match (&o.value, &sent_inline, sent_len) {
            (cairn_object::Value::String(v), Some(sent), _) if v.as_ref() != sent.as_slice() => {
                return Err(lied("holds another value than the one sent".into()));
            }
            (cairn_object::Value::String(v), None, _)
                if sent_hash.as_ref().is_some_and(|h| {
                    *h.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .finalize()
                        .as_bytes()
                        != *blake3::hash(v.as_ref()).as_bytes()
                }) =>
            {
                return Err(lied("holds another value than the one sent".into()));
            }
            (cairn_object::Value::Tree(t), None, Some(n))
                if ty == ValueType::Blob && t.count != n =>
            {
                return Err(lied(format!("holds {} bytes, not the {n} sent", t.count)));
            }
            _ => {}
        }
        if let (Some(text), Some(shape)) = (&sent_text, text_shape) {
            let text = text.lock().unwrap_or_else(|e| e.into_inner()).take();
            let Some(text) = text else {
                return Err(lied(format!(
                    "was taken from a text of more than {} MiB, more than a node buffers: \
                     what it holds could not be checked",
                    BUFFERED_LIMIT >> 20
                )));
            };
            if !holds_text(&o.value, ty, text, shape)? {
                return Err(lied("holds another value than the one sent".into()));
            }
        }
        if let Some(d) = list_digest {
            drop(list_tx);
            let want = d.finish()?;
            if o.value.tree() != Some(&want) {
                return Err(lied("holds another value than the one sent".into()));
            }
        }
        if let (cairn_object::Value::Tree(t), Some(want)) = (&o.value, &sent_tree)
            && t != want
        {
            return Err(lied(format!(
                "holds other bytes than the ones sent (its tree root is {}, the bytes sent \
                 make {} with this bucket's {}-byte leaves)",
                t.root,
                want.root,
                shape.map_or(0, |s| s.cfg.leaf_target)
            )));
        }
        // A sealed put is recorded with its seal, or the owner is told: a node (or anyone
        // on the way) leaving the seal out would leave a version that only the node
        // vouches for, while the owner believed it sealed.
        let sealed = headers.iter().any(|(n, _)| *n == OWNER_SEAL_HEADER);
        if let (true, Some((_, capsule))) = (sealed, &sealer) {
            // The owner's seal (checked against the owner the pinned metadata names):
            // this put's, or an earlier one of the same put (the same base, value and
            // context make the same version, whose proof shows the first sealed record).
            let p = self.proven(&a.key, &uid, &o, Some(capsule))?;
            if p.sealed.is_none() {
                return Err(lied(
                    "was recorded without the owner seal sent with it (its proof shows none)"
                        .into(),
                ));
            }
        }
        writeln!(out, "{uid}")?;
        Ok(())
    }

    /// The version a write (`what`) answered with, checked rather than trusted: the uid
    /// must parse, and its Meta chunk, read from the node and hashed against it, must be a
    /// version of `key`, or the uid printed (and perhaps anchored on a chain) would name
    /// something the node made up. The caller then checks the Meta against what it wrote.
    fn written_version(
        &self,
        key: &str,
        r: &J,
        what: &str,
    ) -> Result<(Uid, cairn_object::FObject)> {
        let raw = str_field(r, "uid")?;
        let uid: Uid = raw.parse().map_err(|_| {
            Error::Rejected(format!(
                "the node answered the {what} with {:?}, not a version id",
                crate::format::show(raw.as_bytes())
            ))
        })?;
        let (_, v) = self.open_version_part(key, Some(uid), None, true)?;
        Ok((uid, v.object().clone()))
    }

    fn version_query(uid: Option<Uid>, branch: Option<String>) -> Vec<(&'static str, String)> {
        match (uid, branch) {
            (Some(u), _) => vec![("uid", u.to_string())],
            (None, Some(b)) => vec![("branch", b)],
            (None, None) => Vec::new(),
        }
    }

    /// Opens the node's verified stream of version `uid` (or the head of `branch`) of
    /// `key` ([`crate::verified`]): checked against `uid` when given, else against the uid
    /// the node names; a version of another key is refused.
    fn open_version(
        &self,
        key: &str,
        uid: Option<Uid>,
        branch: Option<String>,
    ) -> Result<(Uid, VerifiedValue<Pieces>)> {
        self.open_version_part(key, uid, branch, false)
    }

    /// [`Client::open_version`]; `meta_only` asks for the version without its content.
    fn open_version_part(
        &self,
        key: &str,
        uid: Option<Uid>,
        branch: Option<String>,
        meta_only: bool,
    ) -> Result<(Uid, VerifiedValue<Pieces>)> {
        let mut query = Self::version_query(uid, branch);
        if meta_only {
            query.push(("meta", "true".to_string()));
        }
        let url = self.url("stream", Some(key), &query)?;
        let (headers, body) = self.download(url)?;
        let named: Uid = headers
            .get(reqwest::header::ETAG)
            .and_then(|v| v.to_str().ok())
            .and_then(|s| {
                let s = s.trim();
                // A proxy may weaken the tag (`W/"…"`); the uid inside is the same.
                let s = s.strip_prefix("W/").unwrap_or(s);
                s.trim_matches('"').parse().ok()
            })
            .ok_or_else(|| bad_answer("ETag"))?;
        let uid = match uid {
            Some(u) if u != named => bail!(Error::Rejected(format!(
                "asked for version {u}, the node answered with {named}"
            ))),
            Some(u) => u,
            // The node names the branch head; the stream is checked against what it names.
            None => named,
        };
        let value = VerifiedValue::open(body, uid, meta_only)?;
        if value.object().key.as_ref() != key.as_bytes() {
            bail!(Error::Rejected(format!(
                "version {uid} belongs to key {:?}, not {key:?}",
                String::from_utf8_lossy(&value.object().key),
            )));
        }
        Ok((uid, value))
    }

    /// `get`: the version comes as the node's verified stream and every byte is checked
    /// against the uid before it is printed, written or decrypted ([`crate::verified`]).
    fn get(&mut self, a: GetArgs, data_key: Option<&Path>, out: &mut impl Write) -> Result<()> {
        let (uid, value) = match &a.capsule {
            // The version is proven first (its Meta chunk, then the writer's record of it),
            // its content read after.
            Some(cap) => {
                let asked = a
                    .branch
                    .clone()
                    .or_else(|| a.uid.is_none().then(|| DEFAULT_BRANCH.to_string()));
                let (uid, version) = self.open_version_part(&a.key, a.uid, a.branch, true)?;
                let p = self.proven(&a.key, &uid, version.object(), Some(cap))?;
                if let Some(b) = &asked
                    && p.record.branch.as_deref() != Some(b.as_str())
                {
                    // Not refused: a fork or a rename puts a version on another branch
                    // without a new record of it.
                    eprintln!(
                        "note: the node named version {uid} as branch {b:?}'s head, but the \
                         writer recorded it on {} (a fork or rename does that; so does a node \
                         serving a version of another branch)",
                        p.record.branch.as_deref().map_or_else(
                            || "an untagged head".to_string(),
                            |r| format!("branch {r:?}")
                        )
                    );
                }
                if let Some(c) = crate::cli::signer_caveat(&p.proof, &p.meta) {
                    eprintln!("note: {c}");
                }
                eprintln!(
                    "version {uid} (depth {}), proven recorded in capsule {cap}{}",
                    version.object().depth,
                    match &p.sealed {
                        Some((owner, _)) => format!(", its content sealed by owner {owner}"),
                        None => String::new(),
                    }
                );
                if a.meta {
                    (uid, version)
                } else {
                    self.open_version(&a.key, Some(uid), None)?
                }
            }
            None => self.open_version_part(&a.key, a.uid, a.branch, a.meta)?,
        };
        if a.meta {
            let meta = crate::cli::meta_text(&uid, value.object())?;
            crate::cli::emit_text(&meta, a.out.as_deref(), out)?;
            return Ok(());
        }
        let failure = value.failure();
        let pb = progress_bar(value.len_hint(), "get");
        let mut body = pb.wrap_read(value);
        let result = if a.decrypt {
            let path = match data_key {
                Some(p) => p.to_path_buf(),
                None => crypt::default_key_path()?,
            };
            let key = crypt::load_or_create_key(&path, false)?;
            let place = crypt::binding(&self.bucket, &a.key);
            match &a.out {
                Some(p) => crypt::decrypt_to_file(&mut body, &key, &place, p),
                None => crypt::decrypt_to_writer(&mut body, &key, &place, out),
            }
            .map(|_| ())
        } else {
            match &a.out {
                Some(p) => {
                    crate::cli::write_whole_file(p, 0o666, &mut |w| copy(&mut body, w)).map(|_| ())
                }
                None => {
                    let mut sink = BufWriter::with_capacity(1 << 20, &mut *out);
                    copy(&mut body, &mut sink)
                        .and_then(|_| sink.flush().context("writing the output"))
                }
            }
        };
        pb.finish_and_clear();
        // A verification failure is reported as itself (exit 6), not as the read error
        // the copy saw.
        if let Some(e) = failure.take() {
            return Err(
                anyhow::Error::new(e).context(format!("reading version {uid} of {:?}", a.key))
            );
        }
        result
    }

    fn update(&mut self, a: UpdateArgs, out: &mut impl Write) -> Result<()> {
        crate::cli::check_update_args(&a)?;
        let text = a.text.clone().unwrap_or_default();
        let needs_type = a.splice_at.is_some() || !a.set.is_empty() || !a.unset.is_empty();
        // A tuple element with a line break is refused (`check_update_elements`): the
        // type is asked for only then.
        let line_break =
            |x: &Option<String>| x.as_deref().is_some_and(|x| x.contains(['\n', '\r']));
        let ty = if needs_type || line_break(&a.append) || line_break(&a.text) {
            let m =
                self.get_json(self.url("meta", Some(&a.key), &[("branch", a.branch.clone())])?)?;
            Some(str_field(&m, "type")?.to_string())
        } else {
            None
        };
        if let Some(t) = ty.as_deref().and_then(|t| {
            cairn_object::ValueType::ALL
                .into_iter()
                .find(|v| v.name() == t)
        }) {
            crate::cli::check_update_elements(&a, t)?;
        }
        let op = if let Some(x) = &a.append {
            json!({ "op": "append", "value": x })
        } else if let Some(pos) = a.insert_at {
            json!({ "op": "insert", "at": pos, "value": text })
        } else if let Some(x) = a.add {
            json!({ "op": "add", "by": x })
        } else if let Some(x) = a.multiply {
            json!({ "op": "multiply", "by": x })
        } else if let Some(at) = a.splice_at {
            if ty.as_deref() == Some("list") {
                let lines: Vec<J> = format::lines(text.as_bytes())
                    .into_iter()
                    .map(|l| J::String(String::from_utf8_lossy(&l).into_owned()))
                    .collect();
                json!({ "op": "splice", "at": at, "delete": a.delete.unwrap_or(0), "insert": lines })
            } else {
                json!({ "op": "splice", "at": at, "delete": a.delete.unwrap_or(0), "insert": text })
            }
        } else if needs_type {
            if ty.as_deref() == Some("set") {
                json!({ "op": "update", "add": a.set, "remove": a.unset })
            } else {
                let mut set = serde_json::Map::new();
                for kv in &a.set {
                    let (k, v) = kv.split_once('=').ok_or_else(|| {
                        Error::invalid(format!("--set {kv:?}: expected key=value"))
                    })?;
                    set.insert(k.to_string(), J::String(v.to_string()));
                }
                json!({ "op": "update", "set": set, "unset": a.unset })
            }
        } else {
            bail!(Error::invalid(crate::cli::NOTHING_TO_DO));
        };
        let url = self.url("objects", Some(&a.key), &[("branch", a.branch.clone())])?;
        let mut headers = vec![("content-type", "application/json".to_string())];
        if let Some(g) = a.guard {
            headers.push(("if-match", format!("\"{g}\"")));
        }
        // The operation as local mode applies it to an inline value, to check the result.
        let inline_op = if let Some(x) = &a.append {
            Some(cairn_object::Op::Append(x.clone().into_bytes()))
        } else if let Some(pos) = a.insert_at {
            Some(cairn_object::Op::Insert(pos, text.clone().into_bytes()))
        } else if let Some(x) = a.add {
            Some(cairn_object::Op::Add(x))
        } else {
            a.multiply.map(cairn_object::Op::Multiply)
        };
        let body = serde_json::to_vec(&op)?;
        let signer = self.signer()?;
        let resp = self.send(Method::PATCH, url, body, &headers, signer.as_ref())?;
        let r = read_json(resp)?;
        let (uid, o) = self.written_version(&a.key, &r, "update")?;
        // One version on one base of the key, of the base's type, one deeper; an inline
        // value must be what the operation makes of the base's.
        let [base] = o.bases[..] else {
            bail!(Error::Rejected(format!(
                "the node's version {uid} of the update has {} bases, not one",
                o.bases.len()
            )));
        };
        if let Some(g) = a.guard
            && base != g
        {
            bail!(Error::Rejected(format!(
                "the node's version {uid} of the update does not derive from {g}"
            )));
        }
        let (_, b) = self.open_version_part(&a.key, Some(base), None, true)?;
        let b = b.object();
        let made = inline_op.and_then(|op| cairn_object::apply_inline(&b.value, &op));
        let wrong = if o.depth != b.depth.saturating_add(1) {
            Some(format!("is at depth {}, its base at {}", o.depth, b.depth))
        } else if o.value_type() != b.value_type() {
            Some(format!(
                "is a {}, its base a {}",
                o.value_type(),
                b.value_type()
            ))
        } else {
            match made {
                Some(Ok(v)) if v != o.value => {
                    Some("does not hold what the update makes of its base".to_string())
                }
                Some(Err(e)) => Some(format!("exists, though the update does not apply: {e}")),
                _ => None,
            }
        };
        if let Some(w) = wrong {
            bail!(Error::Rejected(format!(
                "the node's version {uid} of the update {w}"
            )));
        }
        writeln!(out, "{uid}")?;
        Ok(())
    }

    fn merge(&mut self, a: MergeArgs, out: &mut impl Write) -> Result<()> {
        crate::cli::check_merge_args(&a)?;
        let resolver = resolver_name(a.resolve);
        let body = if a.untagged {
            let uids: Vec<String> = a.uids.iter().map(|u| u.to_string()).collect();
            json!({ "untagged": true, "uids": uids, "resolver": resolver })
        } else {
            let into = a.into.unwrap_or_else(|| DEFAULT_BRANCH.to_string());
            let from = a
                .from
                .clone()
                .ok_or_else(|| Error::invalid("--from BRANCH_OR_UID is required with --into"))?;
            json!({ "into": into, "from": from, "resolver": resolver })
        };
        let r = self.control("merge", &a.key, body)?;
        let outcome = r.get("outcome").and_then(J::as_str).unwrap_or_default();
        let (uid, o) = self.written_version(&a.key, &r, "merge")?;
        // What can be checked from the answer alone: the versions named by uid must be
        // the result (a fast-forward) or its bases (a merge); a merge has two bases or
        // more. (That an up-to-date branch contains them takes its history.)
        let named: Vec<Uid> = if a.untagged {
            a.uids.clone()
        } else {
            a.from.iter().filter_map(|f| f.parse().ok()).collect()
        };
        let wrong = match outcome {
            "merged" if o.bases.len() < 2 => Some(format!("has {} base(s)", o.bases.len())),
            "merged" if a.untagged && !a.uids.is_empty() => o
                .bases
                .iter()
                .find(|b| !named.contains(b))
                .map(|b| format!("has base {b}, not one of the heads named")),
            "merged" => named
                .iter()
                .find(|n| !o.bases.contains(n))
                .map(|n| format!("does not derive from {n}")),
            "fast_forward" | "up_to_date"
                if a.untagged && !a.uids.is_empty() && !named.contains(&uid) =>
            {
                Some("is none of the heads named".to_string())
            }
            "fast_forward" if !a.untagged => named
                .first()
                .filter(|n| **n != uid)
                .map(|n| format!("is not {n}, where the branch was to move")),
            "fast_forward" | "up_to_date" => None,
            other => Some(format!(
                "came with an outcome this client does not know ({:?})",
                crate::format::show(other.as_bytes())
            )),
        };
        if let Some(w) = wrong {
            bail!(Error::Rejected(format!(
                "the node's version {uid} of the merge {w}"
            )));
        }
        match outcome {
            "fast_forward" => eprintln!("fast-forward"),
            "up_to_date" => eprintln!("already up to date"),
            _ => {}
        }
        writeln!(out, "{uid}")?;
        Ok(())
    }

    fn keys(&self, out: &mut impl Write) -> Result<()> {
        let mut after: Option<String> = None;
        loop {
            let mut q = vec![("limit", KEYS_PAGE.to_string())];
            if let Some(a) = &after {
                q.push(("after", a.clone()));
            }
            let r = self.get_json(self.url("keys", None, &q)?)?;
            for k in array_field(&r, "keys")? {
                out.write_all(&json_bytes(k, "key")?)?;
                writeln!(out)?;
            }
            match r.get("next") {
                None | Some(J::Null) => return Ok(()),
                // Keys come in byte order: a cursor that does not move past the last one
                // would page forever.
                Some(J::String(s))
                    if after.as_ref().is_some_and(|a| s.as_bytes() <= a.as_bytes()) =>
                {
                    bail!(Error::decode(format!(
                        "the node's next page would start at {s:?}, not after {:?}; stopping",
                        after.unwrap_or_default()
                    )))
                }
                Some(J::String(s)) => after = Some(s.clone()),
                Some(_) => bail!(Error::invalid(
                    "the next page starts after a key that is not UTF-8, which this client \
                     cannot name; list the keys on the node"
                )),
            }
        }
    }

    /// The version `uid` of `key`, from the Meta chunk (hex) the node sent with a listing,
    /// checked against `uid` and `key`; one the listing left out (too large to travel in
    /// it) is read alone, verified. `lied` words a failure as the listing's.
    fn checked_meta(
        &self,
        key: &str,
        uid: Uid,
        meta: Option<&J>,
        lied: &dyn Fn(String) -> anyhow::Error,
    ) -> Result<cairn_object::FObject> {
        let o = match meta {
            Some(J::String(h)) => {
                let chunk = hex::decode(h)
                    .map_err(|_| lied(format!("sends {uid} with a Meta chunk that is not hex")))?;
                let got = uid.algo().digest(&chunk);
                if got != uid {
                    return Err(lied(format!(
                        "sends a version {uid} whose Meta chunk hashes to {got}"
                    )));
                }
                cairn_object::FObject::from_chunk(&chunk).map_err(|e| {
                    lied(format!(
                        "sends {uid} with a Meta chunk that does not decode: {e}"
                    ))
                })?
            }
            Some(_) => {
                return Err(lied(format!(
                    "sends {uid} with a Meta chunk that is not hex"
                )));
            }
            // Too large to travel in the listing: read it alone, verified.
            None => {
                let (_, v) = self.open_version_part(key, Some(uid), None, true)?;
                v.object().clone()
            }
        };
        if o.key.as_ref() != key.as_bytes() {
            return Err(lied(format!("lists {uid}, a version of another key")));
        }
        Ok(o)
    }

    /// `branches`: each head the node lists is checked to be a version of `key` (its Meta
    /// chunk hashes to the uid and names the key), so a node cannot list a uid with no
    /// version behind it or another key's version. It can still make up a version, leave a
    /// branch out or name an older head; `get --capsule` proves that the bucket's writer
    /// recorded a version.
    fn branches(&self, key: &str, untagged: bool, out: &mut impl Write) -> Result<()> {
        use cairn_object::HeadPos;
        let lied = |what: String| -> anyhow::Error {
            Error::Rejected(format!("the node's branches of {key:?} {what}")).into()
        };
        // Heads come a page at a time (`next`), each page checked, then printed.
        let mut after: Option<HeadPos> = None;
        let mut untagged_heads = 0usize;
        loop {
            let q: Vec<(&str, String)> = after.iter().map(|a| ("after", a.to_string())).collect();
            let r = self.get_json(self.url("branches", Some(key), &q)?)?;
            let metas = r.get("metas").and_then(J::as_object);
            let check = |u: &J| -> Result<Uid> {
                let uid: Uid = u
                    .as_str()
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| bad_answer("branches"))?;
                self.checked_meta(key, uid, metas.and_then(|m| m.get(&uid.to_string())), &lied)?;
                Ok(uid)
            };
            let heads = array_field(&r, "untagged")?;
            let tagged = r
                .get("tagged")
                .and_then(J::as_object)
                .ok_or_else(|| bad_answer("tagged"))?;
            let next = match r.get("next") {
                None | Some(J::Null) => None,
                Some(n) => Some(
                    n.as_str()
                        .and_then(|n| n.parse::<HeadPos>().ok())
                        .ok_or_else(|| bad_answer("next"))?,
                ),
            };
            // Before anything of the page is printed: every head of it comes after the
            // last page's, in the listing's order (tagged by name, then untagged by uid,
            // each in order), and a page that goes on ends with the head its `next`
            // names. So no head is listed twice and every page moves on.
            let mut last: Option<HeadPos> = None;
            let mut positions = Vec::with_capacity(tagged.len() + heads.len());
            for name in tagged.keys() {
                // A name with a tab or newline could forge a checked line.
                cairn_object::branch::check_branch_name(name).map_err(|e| {
                    Error::Rejected(format!("the node's branches of {key:?} name {e}"))
                })?;
                positions.push(HeadPos::Tagged(name.clone()));
            }
            for u in heads {
                let uid: Uid = u
                    .as_str()
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| bad_answer("untagged"))?;
                positions.push(HeadPos::Untagged(uid));
            }
            for p in positions {
                let floor = last.as_ref().or(after.as_ref());
                if let Some(f) = floor
                    && *f >= p
                {
                    return Err(lied(format!("lists {p} after {f}: out of order or again")));
                }
                last = Some(p);
            }
            if let Some(n) = &next
                && last.as_ref() != Some(n)
            {
                return Err(lied(match &last {
                    None => "sends an empty page that goes on".to_string(),
                    Some(l) => format!("ends a page at {l} but goes on after {n}"),
                }));
            }
            untagged_heads += heads.len();
            let mut lines = Vec::new();
            if untagged {
                for u in heads {
                    writeln!(lines, "{}", check(u)?)?;
                }
            } else {
                for (name, u) in tagged {
                    writeln!(lines, "{name}\t{}", check(u)?)?;
                }
            }
            // A page is printed once every head of it checked out.
            out.write_all(&lines)?;
            match next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        if !untagged && untagged_heads > 0 {
            eprintln!("{}", crate::cli::untagged_note(key, untagged_heads));
        }
        Ok(())
    }

    /// `log`: the node's answer is checked, not trusted. Each entry's Meta chunk must hash
    /// to its uid (what is printed comes from it), and the entries must be exactly the
    /// breadth-first walk of the history those verified versions record, from the start
    /// version, in order: a node cannot add, drop, reorder or alter a version. Pages
    /// (`next_min`) are followed from the same start version.
    fn log(&self, key: &str, branch: &str, limit: u64, out: &mut impl Write) -> Result<()> {
        if limit == 0 {
            bail!(Error::invalid("--limit must be at least 1"));
        }
        let max = (limit - 1).min(MAX_TRACK_DISTANCE);
        let mut from = match At::parse(branch) {
            At::Uid(u) => ("uid", u.to_string()),
            At::Branch(b) => ("branch", b),
        };
        // The walk the entries must follow: (uid, distance) in the order the node's
        // breadth-first track visits them.
        let mut walk: std::collections::VecDeque<(Uid, u64)> = std::collections::VecDeque::new();
        let mut seen: std::collections::HashSet<Uid> = std::collections::HashSet::new();
        let mut started = false;
        let mut printed = 0u64;
        let mut lines: Vec<u8> = Vec::new();
        // History goes on past the farthest distance asked for.
        let mut beyond = false;
        let mut min = 0u64;
        let lied = |what: String| -> anyhow::Error {
            Error::Rejected(format!("the node's log of {key:?} {what}")).into()
        };
        loop {
            let q = vec![
                from.clone(),
                ("min", min.to_string()),
                ("max", max.to_string()),
            ];
            let r = self.get_json(self.url("log", Some(key), &q)?)?;
            let versions = array_field(&r, "versions")?;
            if versions.is_empty() && r.get("next_min").and_then(J::as_u64).is_some() {
                // A page that moves the walk nowhere would be asked for again, forever.
                return Err(lied("sends an empty page that goes on".to_string()));
            }
            for e in versions {
                let uid: Uid = str_field(e, "uid")?
                    .parse()
                    .map_err(|_| bad_answer("uid"))?;
                let distance = e
                    .get("distance")
                    .and_then(J::as_u64)
                    .ok_or_else(|| bad_answer("distance"))?;
                if !started {
                    // The start version: the uid asked for, or the head the node names.
                    if let At::Uid(u) = At::parse(branch)
                        && u != uid
                    {
                        return Err(lied(format!("starts at {uid}, not at {u}")));
                    }
                    walk.push_back((uid, 0));
                    seen.insert(uid);
                    from = ("uid", uid.to_string());
                    started = true;
                }
                match walk.pop_front() {
                    Some((u, d)) if u == uid && d == distance => {}
                    Some((u, d)) => {
                        return Err(lied(format!(
                            "lists {uid} at distance {distance} where the history has {u} at \
                             distance {d}"
                        )));
                    }
                    None => {
                        return Err(lied(format!(
                            "lists {uid}, beyond the history its versions record"
                        )));
                    }
                }
                let o = self.checked_meta(key, uid, e.get("meta"), &lied)?;
                if distance < max {
                    for b in &o.bases {
                        if seen.insert(*b) {
                            walk.push_back((*b, distance + 1));
                        }
                    }
                } else if !o.bases.is_empty() {
                    beyond = true;
                }
                // Printed only once the whole answer checked out.
                writeln!(lines, "{}", crate::cli::log_line(&uid, &o))?;
                printed += 1;
                if printed == limit {
                    out.write_all(&lines)?;
                    return Ok(());
                }
            }
            match r.get("next_min").and_then(J::as_u64) {
                // An honest node's next page starts at the distance the walk reached.
                Some(n) if walk.front().is_some_and(|&(_, d)| d == n) && n <= max => min = n,
                Some(n) => {
                    return Err(lied(format!(
                        "goes on at distance {n}, where the history has {}",
                        walk.front()
                            .map_or("nothing more".to_string(), |(u, d)| format!(
                                "{u} at distance {d}"
                            ))
                    )));
                }
                None => break,
            }
        }
        if !started {
            return Err(lied("lists no version".into()));
        }
        // Every version the walk reached within the distance asked for was listed.
        if let Some((u, d)) = walk.front() {
            return Err(lied(format!("leaves out {u} at distance {d}")));
        }
        out.write_all(&lines)?;
        if beyond && limit - 1 > MAX_TRACK_DISTANCE {
            eprintln!(
                "note: a node lists versions up to {MAX_TRACK_DISTANCE} steps from the start; \
                 the history goes on (run `cairn log {key} --branch UID` from the last one \
                 shown, or `cairn log` on the node)"
            );
        }
        Ok(())
    }

    /// Prints the diff a page at a time. Each page is computed here from the chunks the
    /// node sends (the two versions' Meta chunks and the POS-tree nodes the page reads,
    /// each hashed), so a node can refuse a diff but not change one. Pages after the first
    /// name the uids the first one was computed on, so a branch that moves meanwhile does
    /// not mix two diffs. A failure on a later page leaves the earlier (checked) pages
    /// printed.
    fn diff(&self, key: &str, a: String, b: String, out: &mut impl Write) -> Result<()> {
        const PAGE: usize = 10_000;
        let (mut a, mut b) = (a, b);
        let mut after: Option<DiffCursor> = None;
        loop {
            let mut q = vec![
                ("a", a.clone()),
                ("b", b.clone()),
                ("limit", PAGE.to_string()),
                ("chunks", "true".into()),
            ];
            if let Some(c) = &after {
                q.push(("after", c.token()));
            }
            let sent = self.chunks_answer(self.url("diff", Some(key), &q)?, &a, &b)?;
            let limit = match sent.limit {
                Some(n) if (1..=PAGE).contains(&n) => n,
                other => bail!(Error::Rejected(format!(
                    "the node computed a diff page of {other:?} changes (asked for at most \
                     {PAGE})"
                ))),
            };
            let (ua, ub) = (sent.a, sent.b);
            let chunks = read_diff_chunks(sent.body, &ua, &ub)?;
            let (d, next) = cairn_object::evidence::check_diff_page(
                &chunks,
                key.as_bytes(),
                &ua,
                &ub,
                after.as_ref(),
                limit,
            )?;
            crate::cli::print_diff(&d, out)?;
            match next {
                Some(c) => after = Some(c),
                None => return Ok(()),
            }
            (a, b) = (ua.to_string(), ub.to_string());
        }
    }

    /// Sends a query answered with the chunks it read (`chunks=true`) and checks the
    /// answer's head: its content type, and the uids the node ran the query on, which must
    /// be `a` and `b` where these name uids (a branch name is the node's word, as for
    /// `get --branch`). The body is left to read.
    fn chunks_answer(&self, url: Url, a: &str, b: &str) -> Result<SentChunks> {
        let (headers, body) = self.download(url)?;
        let header = |name: &str| -> Result<Option<String>> {
            headers
                .get(name)
                .map(|v| {
                    v.to_str().map(str::to_string).map_err(|_| {
                        anyhow::Error::from(Error::Rejected(format!(
                            "the node's {name} header is not text"
                        )))
                    })
                })
                .transpose()
        };
        if header("content-type")?.as_deref() != Some(CHUNKS_TYPE) {
            bail!(Error::Rejected(format!(
                "node {} did not answer with the chunks of the query (content type {:?}, \
                 not {CHUNKS_TYPE}); a node older than this client cannot be checked",
                self.base,
                header("content-type")?.unwrap_or_default()
            )));
        }
        let uid = |name: &str, asked: &str| -> Result<Uid> {
            let v = header(name)?.ok_or_else(|| {
                Error::Rejected(format!("the node's answer has no {name} header"))
            })?;
            let u: Uid = v
                .parse()
                .map_err(|e| Error::Rejected(format!("the node's {name} header: {e}")))?;
            if let At::Uid(want) = At::parse(asked)
                && want != u
            {
                bail!(Error::Rejected(format!(
                    "the node answered about version {u}, not {want}"
                )));
            }
            Ok(u)
        };
        let (ua, ub) = (uid("x-cairn-a", a)?, uid("x-cairn-b", b)?);
        let limit = header("x-cairn-limit")?.and_then(|v| v.parse::<usize>().ok());
        Ok(SentChunks {
            a: ua,
            b: ub,
            limit,
            body,
        })
    }

    /// The bucket's capsule metadata and the proof that the writer recorded version `uid`
    /// (`object`, already verified against it) of `key`, both from the node and checked
    /// here: the metadata must hash to `pinned` when given, the proof must lead from the
    /// version's record to a writer's signature, and the record must name the bases the
    /// version has. Any failure is [`Error::Rejected`].
    fn proven(
        &self,
        key: &str,
        uid: &Uid,
        object: &cairn_object::FObject,
        pinned: Option<&CapsuleName>,
    ) -> Result<Proven> {
        // With a pinned capsule, anything short of a valid proof is a refusal (exit 11).
        let refuse = |what: &str, e: anyhow::Error| -> anyhow::Error {
            match pinned {
                Some(_) => Error::Rejected(format!("{what}: {e:#}")).into(),
                None => e,
            }
        };
        let meta_bytes = self
            .get_bytes(self.url("metadata", None, &[])?)
            .map_err(|e| refuse("the bucket's capsule metadata", e))?;
        let meta = CapsuleMetadata::decode(&meta_bytes)
            .map_err(|e| refuse("the bucket's capsule metadata", e.into()))?;
        let capsule = meta.name();
        if let Some(p) = pinned
            && *p != capsule
        {
            bail!(Error::Rejected(format!(
                "the node's metadata for bucket {} hashes to capsule {capsule}, not the pinned \
                 {p}",
                self.bucket
            )));
        }
        check_bucket_named(&meta, &self.bucket)?;
        let proof = self
            .get_bytes(self.url("proof", Some(key), &[("uid", uid.to_string())])?)
            .map_err(|e| refuse("the proof of the version", e))?;
        let vp = VersionProof::from_bytes(&proof)
            .map_err(|e| refuse("the proof of the version", e.into()))?;
        let (record, names) = vp.verify(&meta, key.as_bytes(), uid)?;
        if object.bases != record.bases {
            bail!(Error::Rejected(format!(
                "version {uid} has bases the writer's record does not name"
            )));
        }
        let sealed = vp.owner_seal(&meta, &record, uid)?;
        Ok(Proven {
            proof: vp,
            meta,
            record,
            names,
            sealed,
        })
    }

    /// `verify --proof` against a node: the proof and the metadata come from the node, the
    /// check is done here.
    fn verify_proof(
        &self,
        key: &str,
        uid: Option<Uid>,
        branch: Option<String>,
        file: Option<&Path>,
        pinned: Option<CapsuleName>,
        out: &mut impl Write,
    ) -> Result<()> {
        let branch = branch.or_else(|| uid.is_none().then(|| DEFAULT_BRANCH.to_string()));
        let asked = branch.clone();
        // The version first (its Meta chunk alone), its content last: a stream opened
        // before the other requests would wait on the node meanwhile.
        let (uid, version) = self.open_version_part(key, uid, branch, true)?;
        let p = self.proven(key, &uid, version.object(), pinned.as_ref())?;
        if let Some(b) = &asked
            && p.record.branch.as_deref() != Some(b.as_str())
        {
            // The node picked the version as the branch's head; the proof is of the
            // writer's record of it, which names where it was made.
            eprintln!(
                "note: the writer recorded version {uid} on {}, not on branch {b:?}: the proof \
                 shows the writer made it, not that it is {b:?}'s head",
                p.record.branch.as_deref().map_or_else(
                    || "an untagged head".to_string(),
                    |r| format!("branch {r:?}")
                )
            );
        }
        let (vp, meta) = (&p.proof, &p.meta);
        let capsule = meta.name();
        // Printed once the content checked out too, so that no "valid" line reaches stdout
        // for a version whose content fails.
        let mut lines = Vec::new();
        writeln!(lines, "bucket   {}  capsule {capsule}", self.bucket)?;
        crate::cli::print_verified_proof(
            vp,
            meta,
            key.as_bytes(),
            &uid,
            &p.record,
            &p.names,
            &mut lines,
        )?;
        // The version itself comes as a verified stream: its FObject hashed to the uid, and
        // every chunk of its value is re-hashed here as it arrives.
        let (_, mut value) = self.open_version(key, Some(uid), None)?;
        let failure = value.failure();
        let pb = progress_bar(value.len_hint(), "verify");
        let drained = io::copy(&mut pb.wrap_read(&mut value), &mut io::sink());
        pb.finish_and_clear();
        if let Some(e) = failure.take() {
            return Err(anyhow::Error::new(e).context(format!("checking version {uid} of {key:?}")));
        }
        drained.context("reading the version from the node")?;
        out.write_all(&lines)?;
        writeln!(
            out,
            "content  the version hashes to its uid; {} chunk(s) received and re-hashed",
            value.chunks_checked()
        )?;
        if let Some(p) = file {
            crate::cli::write_whole_file(p, 0o666, &mut |w| {
                let b: &[u8] = &vp.to_bytes();
                w.write_all(b)?;
                Ok(b.len() as u64)
            })?;
            eprintln!(
                "proof written to {} (check it with `cairn verify-proof`)",
                p.display()
            );
        }
        if pinned.is_some() {
            crate::cli::write_proof_ok(vp, meta, out)?;
        } else {
            if let Some(c) = crate::cli::signer_caveat(vp, meta) {
                eprintln!("note: {c}");
            }
            // The verdict says what it rests on: a node can make up metadata with a writer
            // key of its own and sign with it (only a pinned name rules that out).
            writeln!(
                out,
                "proof OK against the node's metadata only (capsule {capsule} is the name of \
                 the metadata the node sent; pin the capsule you trust with --capsule)"
            )?;
        }
        Ok(())
    }

    fn get_bytes(&self, url: Url) -> Result<Vec<u8>> {
        let (_, body) = self.download(url)?;
        let mut b = Vec::new();
        // One byte past the limit: an answer over it is refused as such, not cut.
        body.take(JSON_LIMIT + 1)
            .read_to_end(&mut b)
            .context("reading the node's answer")?;
        if b.len() as u64 > JSON_LIMIT {
            bail!(Error::decode(format!(
                "the node's answer is over {JSON_LIMIT} bytes"
            )));
        }
        Ok(b)
    }

    fn bucket(&self, metadata_out: Option<&Path>, out: &mut impl Write) -> Result<()> {
        let info = self.get_json(self.url("", None, &[])?)?;
        // With --metadata-out the metadata is checked first: nothing reaches stdout for a
        // node whose metadata does not hash to the capsule it reports.
        let checked = match metadata_out {
            Some(_) => {
                let bytes = self.get_bytes(self.url("metadata", None, &[])?)?;
                let meta = CapsuleMetadata::decode(&bytes)?;
                if info.get("capsule").and_then(J::as_str) != Some(meta.name().to_string().as_str())
                {
                    bail!(Error::Rejected(format!(
                        "the node's metadata hashes to {}, not the capsule it reports",
                        meta.name()
                    )));
                }
                // Saved to check proofs offline later: another bucket's would pass them.
                check_bucket_named(&meta, &self.bucket)?;
                Some(bytes)
            }
            None => None,
        };
        writeln!(out, "bucket: {}", self.bucket)?;
        match info.get("capsule").and_then(J::as_str) {
            Some(c) => writeln!(out, "capsule: {}", crate::format::escape_controls(c))?,
            None => writeln!(out, "capsule: none yet")?,
        }
        if let Some(d) = info.get("description").and_then(J::as_str) {
            writeln!(out, "description: {}", crate::format::escape_controls(d))?;
        }
        if let Some(ws) = info.get("writers").and_then(J::as_array) {
            for (i, w) in ws.iter().enumerate() {
                let w = w.as_str().unwrap_or_default();
                writeln!(out, "writer {i}: {}", crate::format::escape_controls(w))?;
            }
        }
        match info.get("owner").and_then(J::as_str) {
            Some(o) => writeln!(out, "owner: {}", crate::format::escape_controls(o))?,
            None => writeln!(out, "owner: none (open bucket)")?,
        }
        if let (Some(p), Some(bytes)) = (metadata_out, checked) {
            crate::cli::write_whole_file(p, 0o666, &mut |w| {
                let b: &[u8] = &bytes;
                w.write_all(b)?;
                Ok(b.len() as u64)
            })?;
            eprintln!("metadata written to {}", p.display());
        }
        Ok(())
    }
}

/// The head of an answer made of the chunks a query read ([`Client::chunks_answer`]).
struct SentChunks {
    /// The uid the node ran the query on as `a`.
    a: Uid,
    /// The uid the node ran the query on as `b`.
    b: Uid,
    /// The page size the node used (diffs).
    limit: Option<usize>,
    /// The chunks, framed, still to read.
    body: Pieces,
}

/// Reads the chunks of a diff page, each stored under its own hash: the Meta chunks of
/// `a` and `b` (one when they are the same version), each at most
/// [`evidence::MAX_META_FRAME`] bytes, then at most [`evidence::EVIDENCE_BUDGET`] bytes of
/// POS-tree nodes. Anything else is [`Error::Rejected`].
fn read_diff_chunks(body: Pieces, a: &Uid, b: &Uid) -> Result<MemoryStore> {
    let rejected = |e: cairn_core::Error| -> anyhow::Error {
        Error::Rejected(format!("the node's diff chunks: {e}")).into()
    };
    let chunks = MemoryStore::with_algo(a.algo());
    let metas = if a == b { 1 } else { 2 };
    let mut frames = cairn_object::stream::FrameReader::with_limit(body, evidence::MAX_META_FRAME);
    let mut n = 0usize;
    let mut bytes = 0u64;
    while let Some(c) = frames.next_chunk().map_err(rejected)? {
        n += 1;
        if n > metas {
            bytes += c.len() as u64 + evidence::CHUNK_COST;
        }
        if n >= metas {
            // Room for the next chunk's bytes once its cost is counted too.
            let left = evidence::EVIDENCE_BUDGET
                .saturating_sub(bytes)
                .saturating_sub(evidence::CHUNK_COST);
            frames.set_limit(usize::try_from(left).unwrap_or(usize::MAX));
        }
        chunks.put(&c).map_err(rejected)?;
    }
    Ok(chunks)
}

fn resolver_name(r: BuiltinResolver) -> &'static str {
    match r {
        BuiltinResolver::Manual => "manual",
        BuiltinResolver::Ours => "ours",
        BuiltinResolver::Theirs => "theirs",
        BuiltinResolver::Append => "append",
        BuiltinResolver::Sum => "sum",
        BuiltinResolver::Union => "union",
    }
}

/// Copies a download to its sink, naming which side failed.
fn copy(from: &mut dyn Read, to: &mut dyn Write) -> Result<u64> {
    let mut buf = vec![0u8; 1 << 16];
    let mut n = 0u64;
    loop {
        let k = match from.read(&mut buf) {
            Ok(0) => return Ok(n),
            Ok(k) => k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::io("reading the value from the node", e).into()),
        };
        to.write_all(&buf[..k]).context("writing the output")?;
        n += k as u64;
    }
}

fn bad_answer(field: &str) -> anyhow::Error {
    Error::decode(format!("the node's answer has no valid {field:?}")).into()
}

fn str_field<'a>(v: &'a J, field: &str) -> Result<&'a str> {
    v.get(field)
        .and_then(J::as_str)
        .ok_or_else(|| bad_answer(field))
}

fn array_field<'a>(v: &'a J, field: &str) -> Result<&'a Vec<J>> {
    v.get(field)
        .and_then(J::as_array)
        .ok_or_else(|| bad_answer(field))
}

fn read_json((_, body): Answer) -> Result<J> {
    let mut b = Vec::new();
    // One byte past the limit, which `parse_json` refuses.
    body.take(JSON_LIMIT + 1)
        .read_to_end(&mut b)
        .context("reading the node's answer")?;
    parse_json(&b)
}

/// A reader that hashes (BLAKE3) what passes through it into a hasher the caller keeps:
/// the bytes a put sent, to check the stored value against.
/// Whether `value` is what the text `sent` makes as a `ty` value (parsed as the node
/// parses it): an integer or tuple compared as is, a map or set as the POS-tree `shape`
/// builds of it (into a store that keeps nothing). (A list is checked as it streams:
/// [`TreeDigest::list`].)
fn holds_text(
    value: &cairn_object::Value,
    ty: ValueType,
    sent: Vec<u8>,
    shape: Option<TreeShape>,
) -> Result<bool> {
    use cairn_object::{NewValue, Value, postree};
    let want = crate::format::parse_value(ty, sent)?;
    match (&want, value) {
        (NewValue::Integer(a), Value::Integer(b)) => return Ok(a == b),
        (NewValue::Tuple(a), Value::Tuple(b)) => {
            return Ok(a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x[..] == y[..]));
        }
        _ => {}
    }
    let (Value::Tree(t), Some(s)) = (value, shape) else {
        return Ok(false);
    };
    let store = cairn_store::DigestStore::new(s.algo);
    let built = match want {
        NewValue::Map(m) => postree::build_map(&store, &s.cfg, m.iter())?,
        NewValue::Set(m) => postree::build_set(&store, &s.cfg, m.iter())?,
        _ => return Ok(false),
    };
    Ok(built == *t)
}

/// Largest text of a typed value (other than a list) a node buffers, and so the most a
/// put keeps to check it.
const BUFFERED_LIMIT: u64 = cairn_node::native::objects::BUFFERED_LIMIT;

/// A reader that keeps a copy of the bytes read through it (a value's text form, to be
/// checked against the version the node makes of it), up to [`BUFFERED_LIMIT`]: past it
/// the copy is dropped (`None`), as the node refuses such a text.
struct TextTee {
    inner: Box<dyn Read + Send>,
    text: std::sync::Arc<std::sync::Mutex<Option<Vec<u8>>>>,
}

impl Read for TextTee {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        let mut text = self.text.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = text.as_mut() {
            if (t.len() + n) as u64 > BUFFERED_LIMIT {
                *text = None;
            } else {
                t.extend_from_slice(&buf[..n]);
            }
        }
        Ok(n)
    }
}

/// A reader that sends the bytes read through it to a list's tree builder
/// ([`TreeDigest::list`]), and lets go of the builder at the end of its input.
struct ListTee {
    inner: Box<dyn Read + Send>,
    tx: Option<std::sync::mpsc::SyncSender<bytes::Bytes>>,
}

impl Read for ListTee {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n == 0 && !buf.is_empty() {
            self.tx = None;
        } else if let Some(tx) = &self.tx
            && tx.send(bytes::Bytes::copy_from_slice(&buf[..n])).is_err()
        {
            self.tx = None;
        }
        Ok(n)
    }
}

struct HashTee {
    inner: Box<dyn Read + Send>,
    hasher: std::sync::Arc<std::sync::Mutex<blake3::Hasher>>,
}

impl Read for HashTee {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .update(&buf[..n]);
        Ok(n)
    }
}

/// Reads `body` on its own thread into pieces of `piece` bytes (the last one shorter),
/// at most [`UPLOAD_QUEUE`] ahead of the receiver. A read error is passed on as the last
/// item, so the request fails instead of ending short; the thread also stops when the
/// receiver is dropped.
/// The bytes of a file uploaded with a declared length: exactly `len` of them, or an
/// error (the file shrank or grew while it was read), so that the upload fails rather than
/// storing a cut or a padded value.
struct ExactLen<R> {
    inner: R,
    left: u64,
    checked_end: bool,
    name: String,
}

impl<R: Read> ExactLen<R> {
    fn new(inner: R, len: u64, path: &Path) -> Self {
        ExactLen {
            inner,
            left: len,
            checked_end: false,
            name: path.display().to_string(),
        }
    }
}

impl<R: Read> ExactLen<R> {
    /// Checks once that nothing follows the declared length.
    fn check_end(&mut self) -> io::Result<()> {
        if !self.checked_end {
            let mut one = [0u8; 1];
            let n = loop {
                match self.inner.read(&mut one) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    r => break r?,
                }
            };
            if n > 0 {
                return Err(io::Error::other(format!(
                    "{} grew while it was being uploaded; nothing was stored",
                    self.name
                )));
            }
            self.checked_end = true;
        }
        Ok(())
    }
}

impl<R: Read> Read for ExactLen<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            self.check_end()?;
            return Ok(0);
        }
        let max = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..max])?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{} shrank while it was being uploaded ({} bytes short); nothing was stored",
                    self.name, self.left
                ),
            ));
        }
        self.left -= n as u64;
        if self.left == 0 {
            // In the read that yields the last declared byte, not the next one: a request
            // that has its declared length stops asking, and the error of a later read
            // would come after the upload looked whole. The bytes of this read go with
            // the error (the reader sends no piece read together with one).
            self.check_end()?;
        }
        Ok(n)
    }
}

/// A version proof from the node, checked ([`Client::proven`]): the proof, the capsule
/// metadata it was checked against, and what the check found.
struct Proven {
    proof: VersionProof,
    meta: CapsuleMetadata,
    record: cairn_capsule::Mutation,
    names: Vec<cairn_capsule::RecordName>,
    /// The owner's seal on the put, checked (`None`: the node recorded it alone).
    sealed: Option<(cairn_core::PublicKey, cairn_capsule::OwnerSeal)>,
}

/// A current-thread runtime and reqwest's async client on it, for one streamed transfer
/// (the blocking client hands bodies between threads 8 KiB at a time).
fn async_http() -> Result<(tokio::runtime::Runtime, reqwest::Client)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the transfer runtime")?;
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(30))
        // A node's redirect is not followed: signed requests would be replayed, headers
        // and all, to whatever host it names.
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("cairn/", env!("CARGO_PKG_VERSION")))
        .build()
        .context("starting the HTTP client")?;
    Ok((rt, http))
}

/// A node's answer: its headers and its body, as [`Client::request`] hands them over.
type Answer = (reqwest::header::HeaderMap, Pieces);

/// The body of a [`Client::request`], as the connection yields it.
pub struct Pieces {
    rx: std::sync::mpsc::Receiver<io::Result<bytes::Bytes>>,
    piece: bytes::Bytes,
}

impl Read for Pieces {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use bytes::Buf;
        while self.piece.is_empty() {
            match self.rx.recv() {
                Ok(p) => self.piece = p?,
                // The download thread ended: the whole body was received.
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.piece.len());
        buf[..n].copy_from_slice(&self.piece[..n]);
        self.piece.advance(n);
        Ok(n)
    }
}

/// The queue of an upload's pieces ([`read_in_pieces`]).
type PieceQueue = tokio::sync::mpsc::Receiver<io::Result<bytes::Bytes>>;

/// What an upload's reader thread shares with the request: the input's error, if reading
/// it failed, and whether the thread waits for room in a full queue (the request stopped
/// taking pieces).
#[derive(Default)]
struct ReaderWatch {
    error: std::sync::Mutex<Option<(io::ErrorKind, String)>>,
    waiting: std::sync::atomic::AtomicBool,
}

/// Reads `body` on a thread of its own in pieces of `piece` bytes (the last one shorter),
/// queued for a request body, each also handed to `tee`; returns the thread, the queue and
/// the thread's [`ReaderWatch`]. A piece read together with an error is not sent, only the
/// error: an upload whose input failed never reaches its declared length (an input that
/// grew past it fails on the read after its last byte, and a request that had taken that
/// last byte would have stopped reading and stored the first `len` bytes as if whole).
/// The thread stops when the queue's receiver is dropped.
fn read_in_pieces(
    mut body: Box<dyn Read + Send>,
    piece: usize,
    tee: Option<std::sync::mpsc::SyncSender<bytes::Bytes>>,
) -> Result<(
    std::thread::JoinHandle<()>,
    PieceQueue,
    std::sync::Arc<ReaderWatch>,
)> {
    let (tx, rx) = tokio::sync::mpsc::channel::<io::Result<bytes::Bytes>>(UPLOAD_QUEUE);
    let watch = std::sync::Arc::new(ReaderWatch::default());
    let w = watch.clone();
    // `waiting` only while the queue is full: the request is not taking pieces.
    let send = move |item: io::Result<bytes::Bytes>| match tx.try_send(item) {
        Ok(()) => true,
        Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) => false,
        Err(tokio::sync::mpsc::error::TrySendError::Full(item)) => {
            w.waiting.store(true, std::sync::atomic::Ordering::Release);
            let sent = tx.blocking_send(item).is_ok();
            w.waiting.store(false, std::sync::atomic::Ordering::Release);
            sent
        }
    };
    let w = watch.clone();
    let handle = std::thread::Builder::new()
        .name("cairn-upload".into())
        .spawn(move || {
            loop {
                let mut buf = Vec::with_capacity(piece);
                // `read_to_end` retries `Interrupted`.
                let res = (&mut body).take(piece as u64).read_to_end(&mut buf);
                if let Err(e) = res {
                    *w.error.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some((e.kind(), e.to_string()));
                    let _ = send(Err(e));
                    return;
                }
                let n = buf.len();
                if n > 0 {
                    let piece = bytes::Bytes::from(buf);
                    if let Some(t) = &tee {
                        // A builder that stopped has failed: its error is reported when
                        // it is joined.
                        let _ = t.send(piece.clone());
                    }
                    if !send(Ok(piece)) {
                        return;
                    }
                }
                if n < piece {
                    return;
                }
            }
        })
        .context("starting the upload reader thread")?;
    Ok((handle, rx, watch))
}

/// The node's JSON answer.
fn parse_json(b: &[u8]) -> Result<J> {
    if b.len() as u64 > JSON_LIMIT {
        bail!(Error::decode(format!(
            "the node's answer is over {JSON_LIMIT} bytes"
        )));
    }
    serde_json::from_slice(b)
        .map_err(|e| Error::decode(format!("the node's answer is not JSON: {e}")).into())
}

/// The headers of a request: `headers`, and with `signer` the `Cairn-Ed25519` signature
/// over method, path and query, date, the body's BLAKE3 `hash` and the signed headers,
/// bound to the bucket's `capsule` when known.
fn request_headers(
    method: &Method,
    url: &Url,
    headers: &[(&str, String)],
    signer: Option<&SigningKey>,
    hash: Option<[u8; 32]>,
    capsule: Option<&str>,
) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = headers
        .iter()
        .map(|(n, v)| (n.to_string(), v.clone()))
        .collect();
    if let (Some(key), Some(hash)) = (signer, hash) {
        let pq = match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_string(),
        };
        let header = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_bytes())
                .unwrap_or_default()
        };
        // A fresh nonce per request: two identical requests in one second would otherwise
        // carry the same (deterministic) signature, and the node refuses replays.
        let nonce = hex::encode(rand::random::<[u8; 16]>());
        let to_sign = RequestToSign {
            method: method.as_str(),
            path_and_query: &pq,
            unix_secs: now_secs(),
            body_blake3: hash,
            content_type: header("content-type"),
            if_match: header("if-match"),
            context: header(CONTEXT_HEADER),
            nonce: nonce.as_bytes(),
            capsule: capsule.unwrap_or_default().as_bytes(),
        };
        out.extend(
            to_sign
                .sign(key)
                .into_iter()
                .map(|(n, v)| (n.to_string(), v)),
        );
    }
    out
}

/// Bytes an upload may still have on the way when its last piece is handed over: that
/// piece and a socket send buffer (Linux grows one to 4 MiB by default; twice that).
const UPLOAD_IN_FLIGHT: u64 = UPLOAD_PIECE as u64 + (8 << 20);

/// The slowest link the drain allowance assumes when the upload's own rate says nothing
/// (all of it fit in the buffers): 64 KiB/s, on top of the stall timeout itself (at the
/// default 120 s, a full 8 MiB of buffers drains at 33 KB/s in the time).
const SLOWEST_UPLINK: f64 = 64.0 * 1024.0;

/// How long the bytes of an upload of `taken` bytes handed over in `elapsed` may still
/// take to reach the node (at most a day). Past [`UPLOAD_IN_FLIGHT`] the bytes beyond it
/// have left the machine, so their rate bounds the link's; a smaller upload may sit in
/// the buffers whole, and is given the time of [`SLOWEST_UPLINK`].
fn drain_allowance(taken: u64, elapsed: Duration) -> Duration {
    const DAY: f64 = 86_400.0;
    let secs = if taken > UPLOAD_IN_FLIGHT {
        let rate = (taken - UPLOAD_IN_FLIGHT) as f64 / elapsed.as_secs_f64().max(1e-3);
        UPLOAD_IN_FLIGHT as f64 / rate
    } else {
        taken as f64 / SLOWEST_UPLINK
    };
    Duration::from_secs_f64(secs.min(DAY))
}

/// `fut` (a step of a transfer), failed as [`stalled`] when the node sends nothing for
/// `stall`.
async fn within<T>(
    stall: Option<Duration>,
    base: &str,
    what: &str,
    fut: impl std::future::Future<Output = reqwest::Result<T>>,
) -> Result<T> {
    let r = match stall {
        None => fut.await,
        Some(d) => tokio::time::timeout(d, fut)
            .await
            .map_err(|_| stalled(base, what, d))?,
    };
    r.map_err(|e| transport(base, e))
}

/// A transfer step that got nothing from the node for `d`.
fn stalled(base: &str, what: &str, d: Duration) -> anyhow::Error {
    Error::Unavailable(format!(
        "node {base}: {what} stalled: nothing came for {:.0} s (--stall-timeout)",
        d.as_secs_f64()
    ))
    .into()
}

/// Refuses (as [`Error::Rejected`]) capsule metadata that does not name `bucket` in its
/// bucket setting: every bucket's capsule names its bucket, so a node answering for one
/// bucket with another's metadata (and that bucket's proofs) is caught even when the
/// capsule is not pinned.
fn check_bucket_named(meta: &CapsuleMetadata, bucket: &str) -> Result<()> {
    let named = meta
        .settings
        .get(cairn_capsule::bucket::BUCKET_SETTING)
        .map(String::as_str);
    if named != Some(bucket) {
        bail!(Error::Rejected(format!(
            "the node's capsule metadata is for bucket {}, not {bucket:?}",
            named.map_or_else(|| "(none named)".to_string(), |b| format!("{b:?}"))
        )));
    }
    Ok(())
}

/// A request that did not get an answer.
fn transport(base: &str, e: reqwest::Error) -> anyhow::Error {
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(&e);
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    Error::Unavailable(format!("node {base}: {msg}")).into()
}

/// The [`Error`] an error answer (`status` and up to [`ERROR_BODY_LIMIT`] bytes of `body`)
/// stands for.
fn error_from(status: StatusCode, body: &[u8]) -> anyhow::Error {
    let body = &body[..body.len().min(ERROR_BODY_LIMIT as usize)];
    let parsed: Option<J> = serde_json::from_slice(body).ok();
    let (kind, message) = match parsed
        .as_ref()
        .and_then(|j| j.get("error"))
        .and_then(|e| Some((e.get("kind")?.as_str()?, e.get("message")?.as_str()?)))
    {
        Some((k, m)) => (k.to_string(), m.to_string()),
        None => (
            String::new(),
            format!("HTTP {status}: {}", String::from_utf8_lossy(body).trim()),
        ),
    };
    let mut message = crate::format::escape_controls(&message);
    if let Some(cs) = parsed
        .as_ref()
        .and_then(|j| j.get("conflicts"))
        .and_then(J::as_array)
    {
        // Printed as local mode prints them, with local mode's hint.
        for c in cs {
            match cairn_node::native::versions::conflict_from_json(c) {
                Some(c) => eprintln!("conflict: {c}"),
                None => eprintln!("conflict: {c}"),
            }
            if c.get("truncated").and_then(J::as_bool) == Some(true) {
                eprintln!(
                    "  (the node sent the first {} bytes of each side)",
                    cairn_node::native::versions::CONFLICT_SIDE_BYTES
                );
            }
        }
        let total = parsed
            .as_ref()
            .and_then(|j| j.get("conflicts_total"))
            .and_then(J::as_u64)
            .map_or(cs.len(), |n| n as usize);
        if total > cs.len() {
            eprintln!(
                "({} more conflicts not listed by the node)",
                total - cs.len()
            );
        }
        message = format!("merge conflict: {}", crate::cli::conflict_summary(total));
    }
    let strip = |prefix: &str| message.strip_prefix(prefix).unwrap_or(&message).to_string();
    let e = match kind.as_str() {
        "not_found" => Error::NotFound(strip("not found: ")),
        "decode" => Error::Decode(strip("decode error: ")),
        "corrupt" => Error::Corrupt(strip("corrupt: ")),
        "invalid_input" => Error::InvalidInput(strip("invalid input: ")),
        "guard_mismatch" => Error::GuardMismatch(strip("guard mismatch: ")),
        "type_mismatch" => Error::TypeMismatch(strip("type mismatch: ")),
        "already_exists" => Error::AlreadyExists(strip("already exists: ")),
        "conflict" => Error::Conflict(strip("merge conflict: ")),
        "rejected" => Error::Rejected(strip("rejected: ")),
        "unavailable" => Error::Unavailable(strip("unavailable: ")),
        "unauthorized" => Error::Rejected(format!("the node refused the request: {message}")),
        "too_large" | "range_not_satisfiable" => Error::InvalidInput(message),
        "insufficient_storage" => Error::io(
            "storing the request on the node",
            io::Error::new(io::ErrorKind::StorageFull, message),
        ),
        "io" | "internal" => {
            Error::io("serving the request on the node", io::Error::other(message))
        }
        _ => match status {
            StatusCode::NOT_FOUND => Error::NotFound(message),
            StatusCode::PRECONDITION_FAILED => Error::GuardMismatch(message),
            StatusCode::CONFLICT => Error::Conflict(message),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Error::Rejected(message),
            // A gateway's failures mean the node cannot be reached (exit 9), as its own 503.
            StatusCode::SERVICE_UNAVAILABLE
            | StatusCode::BAD_GATEWAY
            | StatusCode::GATEWAY_TIMEOUT => Error::Unavailable(message),
            s if s.is_client_error() => Error::InvalidInput(message),
            // Redirects are not followed (a signed request would be replayed elsewhere).
            s if s.is_redirection() => Error::InvalidInput(format!(
                "the node answered with a redirect ({s}); point --server at the address it \
                 redirects to"
            )),
            _ => Error::io("serving the request on the node", io::Error::other(message)),
        },
    };
    e.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file read with a declared length yields exactly it, or fails when it shrank or
    /// grew.
    #[test]
    fn exact_len_reads_exactly_or_fails() {
        let p = Path::new("f");
        let mut out = Vec::new();
        ExactLen::new(&b"abcdef"[..], 6, p)
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, b"abcdef");
        let e = ExactLen::new(&b"abc"[..], 6, p)
            .read_to_end(&mut Vec::new())
            .unwrap_err();
        assert!(e.to_string().contains("shrank"), "{e}");
        let e = ExactLen::new(&b"abcdefg"[..], 6, p)
            .read_to_end(&mut Vec::new())
            .unwrap_err();
        assert!(e.to_string().contains("grew"), "{e}");
    }

    /// Gives `data`, then `error` (when set), in reads of at most `step` bytes, with an
    /// `Interrupted` before every other read.
    struct Feeder {
        data: Vec<u8>,
        at: usize,
        step: usize,
        error: bool,
        interrupt: bool,
    }

    impl Read for Feeder {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.interrupt = !self.interrupt;
            if self.interrupt {
                return Err(io::ErrorKind::Interrupted.into());
            }
            if self.at == self.data.len() {
                return if self.error {
                    Err(io::Error::other("disk went away"))
                } else {
                    Ok(0)
                };
            }
            let n = buf.len().min(self.step).min(self.data.len() - self.at);
            buf[..n].copy_from_slice(&self.data[self.at..self.at + n]);
            self.at += n;
            Ok(n)
        }
    }

    fn pieces(len: usize, piece: usize, error: bool) -> Vec<io::Result<bytes::Bytes>> {
        let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        let feeder = Feeder {
            data,
            at: 0,
            step: 3000,
            error,
            interrupt: false,
        };
        let (handle, mut rx, _) = read_in_pieces(Box::new(feeder), piece, None).unwrap();
        let mut out = Vec::new();
        while let Some(p) = rx.blocking_recv() {
            out.push(p);
        }
        handle.join().unwrap();
        out
    }

    #[test]
    fn upload_pieces_are_full_but_the_last_and_add_up() {
        for (len, want) in [
            (0, vec![]),
            (5000, vec![5000]),
            (10_000, vec![8192, 1808]),
            (16_384, vec![8192, 8192]),
        ] {
            let got: Vec<usize> = pieces(len, 8192, false)
                .into_iter()
                .map(|p| p.unwrap().len())
                .collect();
            assert_eq!(got, want, "len {len}");
        }
        let got = pieces(20_000, 8192, false);
        let bytes: Vec<u8> = got.into_iter().flat_map(|p| p.unwrap().to_vec()).collect();
        let want: Vec<u8> = (0..20_000).map(|i| (i * 7 % 251) as u8).collect();
        assert_eq!(bytes, want);
    }

    #[test]
    fn a_read_error_ends_the_upload_with_that_error() {
        let got = pieces(20_000, 8192, true);
        let (last, ok) = got.split_last().unwrap();
        assert!(last.is_err(), "the error is passed on");
        let n: usize = ok.iter().map(|p| p.as_ref().unwrap().len()).sum();
        // The piece read together with the error is not sent: an upload whose input
        // failed can never look whole.
        assert_eq!(
            n, 16_384,
            "only the whole pieces read before the error are sent"
        );
    }

    /// A node that takes an upload's head and then stops reading its body, its connection
    /// open, fails the upload after the stall timeout instead of holding it for ever.
    #[test]
    fn an_upload_to_a_node_that_stops_reading_fails_after_the_stall_timeout() {
        let c = client(quiet_node(0, b""), 1.0);
        let url = Url::parse(&format!("{}/x", c.base)).unwrap();
        let t = std::time::Instant::now();
        let e = c
            .send_stream(
                Method::PUT,
                url,
                Box::new(io::Cursor::new(vec![1u8; 256 << 20])),
                Some(256 << 20),
                &[],
                None,
                None,
                None,
            )
            .expect_err("a node that reads nothing");
        assert!(is_stall(&e), "{e:#}");
        assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    }

    /// A file that grows while it is uploaded fails the upload with the input's error
    /// (exit 10), however far the request got: the node took every declared byte and
    /// answered, which would otherwise have stored the first `len` bytes as if whole.
    #[test]
    fn an_input_that_grows_past_its_length_fails_the_upload() {
        let answer: &'static [u8] =
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: application/json\r\n\r\n{}";
        // Within one piece, and at whole pieces (where the last piece read is full).
        for len in [100_000u64, UPLOAD_PIECE as u64, 2 * UPLOAD_PIECE as u64] {
            let c = client(quiet_node(len as usize, answer), 5.0);
            let url = Url::parse(&format!("{}/x", c.base)).unwrap();
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("grows");
            std::fs::write(&path, vec![3u8; len as usize + 10]).unwrap();
            let file = std::fs::File::open(&path).unwrap();
            let e = c
                .send_stream(
                    Method::PUT,
                    url,
                    Box::new(ExactLen::new(file, len, &path)),
                    Some(len),
                    &[],
                    None,
                    None,
                    None,
                )
                .expect_err("the input grew past its declared length");
            assert!(
                matches!(e.downcast_ref::<Error>(), Some(Error::Io { .. })),
                "{len}: {e:#}"
            );
            assert!(e.to_string().contains("grew"), "{len}: {e:#}");
        }
    }

    /// Answers without a Cairn error body map by status: a gateway's failure is the node
    /// being unreachable (exit 9), a redirect (not followed) bad input, a 500 a node I/O
    /// failure.
    #[test]
    fn statuses_without_an_error_body_map_to_kinds() {
        let kind = |s: u16| {
            let e = error_from(StatusCode::from_u16(s).unwrap(), b"<html>proxy</html>");
            match e.downcast_ref::<Error>() {
                Some(Error::Unavailable(_)) => "unavailable",
                Some(Error::InvalidInput(_)) => "invalid",
                Some(Error::Io { .. }) => "io",
                Some(Error::NotFound(_)) => "not found",
                other => panic!("{s}: {other:?}"),
            }
        };
        assert_eq!(kind(502), "unavailable");
        assert_eq!(kind(503), "unavailable");
        assert_eq!(kind(504), "unavailable");
        assert_eq!(kind(307), "invalid");
        assert_eq!(kind(301), "invalid");
        assert_eq!(kind(500), "io");
        assert_eq!(kind(404), "not found");
    }

    /// Metadata naming another bucket, or none, is refused; the bucket's own passes.
    #[test]
    fn metadata_must_name_the_bucket_asked_for() {
        let key = SigningKey::from_seed(&[4; 32]);
        let mut meta = CapsuleMetadata::new(cairn_core::HashAlgo::Blake3, key.public(), "x");
        let e = check_bucket_named(&meta, "b").unwrap_err();
        assert!(e.to_string().contains("(none named)"), "{e}");
        meta.settings.insert(
            cairn_capsule::bucket::BUCKET_SETTING.to_string(),
            "a".to_string(),
        );
        let e = check_bucket_named(&meta, "b").unwrap_err();
        assert!(
            matches!(e.downcast_ref::<Error>(), Some(Error::Rejected(_))),
            "{e}"
        );
        check_bucket_named(&meta, "a").unwrap();
    }

    /// A node on loopback that reads a request's head (and `body` bytes of its body), then
    /// writes `answer` and keeps the connection open without another byte for 30 s.
    fn quiet_node(body: usize, answer: &'static [u8]) -> String {
        use std::io::BufRead;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let (c, _) = l.accept().unwrap();
            let mut r = io::BufReader::new(c.try_clone().unwrap());
            let mut line = String::new();
            while r.read_line(&mut line).unwrap() > 2 {
                line.clear();
            }
            io::copy(&mut (&mut r).take(body as u64), &mut io::sink()).unwrap();
            (&c).write_all(answer).unwrap();
            std::thread::sleep(Duration::from_secs(30));
        });
        format!("http://{addr}")
    }

    /// A success answer that comes before the whole upload was sent is refused: the
    /// version it names holds at most what was read so far (the put's check compared it
    /// with that part, not the input).
    #[test]
    fn a_success_answer_before_the_whole_upload_is_refused() {
        let answer: &'static [u8] =
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: application/json\r\n\r\n{}";
        for len in [None, Some(32u64 << 20)] {
            let c = client(quiet_node(0, answer), 5.0);
            let url = Url::parse(&format!("{}/x", c.base)).unwrap();
            let e = c
                .send_stream(
                    Method::PUT,
                    url,
                    Box::new(io::Cursor::new(vec![1u8; 32 << 20])),
                    len,
                    &[],
                    None,
                    None,
                    None,
                )
                .expect_err("an answer before the body was sent");
            assert!(
                matches!(e.downcast_ref::<Error>(), Some(Error::Rejected(_))),
                "{len:?}: {e:#}"
            );
        }
    }

    /// Keys a URL parser would remove from the path are refused before anything is sent
    /// (they reached another route: `get ..` asked for the bucket).
    #[test]
    fn dot_keys_are_refused_in_client_mode() {
        let c = client("http://127.0.0.1:1".into(), 1.0);
        for k in [".", ".."] {
            let e = c.url("objects", Some(k), &[]).unwrap_err();
            assert!(
                matches!(e.downcast_ref::<Error>(), Some(Error::InvalidInput(_))),
                "{e:#}"
            );
        }
        let u = c.url("objects", Some("..."), &[]).unwrap();
        assert!(u.path().ends_with("/objects/..."), "{u}");
    }

    fn client(base: String, stall: f64) -> Client {
        Client {
            base,
            stall: Some(Duration::from_secs_f64(stall)),
            bucket: "b".into(),
            key_file: None,
            signer: None,
            capsule: std::cell::RefCell::new(None),
            shape: std::cell::Cell::new(None),
            metadata: std::cell::RefCell::new(None),
        }
    }

    fn is_stall(e: &dyn std::fmt::Display) -> bool {
        e.to_string().contains("stalled: nothing came for")
    }

    /// A node that stops sending fails a download after the stall timeout instead of
    /// holding the command for ever: before the answer's head, and in the middle of the
    /// body.
    #[test]
    fn a_download_from_a_silent_node_fails_after_the_stall_timeout() {
        let c = client(quiet_node(0, b""), 0.3);
        let url = Url::parse(&format!("{}/x", c.base)).unwrap();
        let e = c.download(url).err().expect("no answer");
        assert!(is_stall(&e), "{e:#}");
        let c = client(
            quiet_node(
                0,
                b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789",
            ),
            0.3,
        );
        let url = Url::parse(&format!("{}/x", c.base)).unwrap();
        let (_, mut body) = c.download(url).unwrap();
        let mut got = Vec::new();
        let e = body.read_to_end(&mut got).unwrap_err();
        assert!(is_stall(&e), "{e}");
        assert_eq!(got, b"0123456789");
    }

    /// The small requests (JSON answers, signed mutations, metadata) are bounded by the
    /// stall timeout too: they went through a blocking client with no timeout at all, so a
    /// node that took the connection and never answered held `put`, `update`, `keys`,
    /// `verify --proof` ... for ever.
    #[test]
    fn a_request_the_node_never_answers_fails_after_the_stall_timeout() {
        let c = client(quiet_node(0, b""), 0.3);
        let url = Url::parse(&format!("{}/x", c.base)).unwrap();
        let e = c.get_json(url).expect_err("no answer");
        assert!(is_stall(&e), "{e:#}");
        let body = br#"{"from":"a","to":"b"}"#.to_vec();
        let c = client(quiet_node(body.len(), b""), 0.3);
        let url = Url::parse(&format!("{}/x", c.base)).unwrap();
        let e = c
            .send(
                Method::POST,
                url,
                body,
                &[],
                Some(&SigningKey::from_seed(&[3; 32])),
            )
            .err()
            .expect("no answer");
        assert!(is_stall(&e), "{e:#}");
        // Half an answer, then nothing.
        let c = client(
            quiet_node(
                0,
                b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\ncontent-type: application/json\r\n\r\n{\"a\"",
            ),
            0.3,
        );
        let url = Url::parse(&format!("{}/x", c.base)).unwrap();
        let e = c.get_json(url).expect_err("half an answer");
        assert!(format!("{e:#}").contains("stalled"), "{e:#}");
        // An answer that comes is read as before, error answers as their error.
        let c = client(
            quiet_node(
                0,
                b"HTTP/1.1 404 Not Found\r\ncontent-length: 44\r\ncontent-type: application/json\r\n\r\n{\"error\":{\"kind\":\"not_found\",\"message\":\"k\"}}",
            ),
            0.3,
        );
        let url = Url::parse(&format!("{}/x", c.base)).unwrap();
        let e = c.get_json(url).expect_err("an error answer");
        assert!(
            matches!(e.downcast_ref::<Error>(), Some(Error::NotFound(_))),
            "{e:#}"
        );
    }

    /// An upload takes as long as it takes, but once all of it is sent the node must
    /// answer within the stall timeout.
    #[test]
    fn an_upload_the_node_never_answers_fails_after_the_stall_timeout() {
        let data = vec![5u8; 30_000];
        let c = client(quiet_node(data.len(), b""), 0.3);
        let url = Url::parse(&format!("{}/x", c.base)).unwrap();
        let e = c
            .send_stream(
                Method::PUT,
                url,
                Box::new(io::Cursor::new(data.clone())),
                Some(data.len() as u64),
                &[],
                None,
                None,
                None,
            )
            .expect_err("no answer");
        assert!(is_stall(&e), "{e:#}");
        // The wait after the last piece allows for what may still be on the way at the
        // rate the upload went: nothing much at loopback speed, minutes on a slow link.
        assert!(drain_allowance(300 << 20, Duration::from_secs(1)) < Duration::from_millis(50));
        let slow = drain_allowance(32_000 * 600, Duration::from_secs(600));
        // (32 KB/s for 10 minutes: 270 s to drain the buffers at that rate; the estimate
        // counts only the bytes past them, so it is longer, never shorter.)
        assert!(
            slow > Duration::from_secs(270) && slow < Duration::from_secs(600),
            "{slow:?}"
        );
        // A body that fits in the buffers was handed over at once, whatever the link: the
        // slowest link's time for all of it.
        let small = drain_allowance(1 << 20, Duration::from_millis(2));
        assert_eq!(small, Duration::from_secs(16));
        assert_eq!(drain_allowance(0, Duration::ZERO), Duration::ZERO);
        // A node that answers is not cut off, however slow the body was to read.
        let c = client(
            quiet_node(
                data.len(),
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: application/json\r\n\r\n{}",
            ),
            0.3,
        );
        let url = Url::parse(&format!("{}/x", c.base)).unwrap();
        let (answer, _) = c
            .send_stream(
                Method::PUT,
                url,
                Box::new(io::Cursor::new(data)),
                Some(30_000),
                &[],
                None,
                None,
                None,
            )
            .unwrap();
        assert_eq!(answer, json!({}));
    }
}

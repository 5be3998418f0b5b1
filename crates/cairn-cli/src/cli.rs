//! Command-line definitions and the local (embedded-store) implementation of each command.

use std::fs::File;
use std::io::{self, BufWriter, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use cairn_capsule::{
    Bucket, CapsuleMetadata, CapsuleName, CapsuleServer, ServerOptions, VersionProof,
};
use cairn_core::{Error, HashAlgo};
use cairn_object::postree;
use cairn_object::{
    At, BuiltinResolver, DEFAULT_BRANCH, DEFAULT_BUCKET, Db, Diff, MergeOutcome, PutOptions,
    Target, Uid, Value, ValueType,
};
use cairn_store::{Durability, LogStore, LogStoreOptions, Store};
use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

use crate::format;

/// Cairn: versioned, forkable, deduplicated, tamper-evident storage for off-chain data.
#[derive(Parser, Debug)]
#[command(name = "cairn", version, about, long_about = None)]
pub struct Cli {
    /// Data directory of the embedded store, created by the first write [default: ./cairn-data,
    /// or the config file's for `serve`].
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "CAIRN_DATA"
    )]
    pub data: Option<PathBuf>,
    /// Durability of writes: fsync (sync each write), group (group commit, the default:
    /// same guarantee, syncs shared by concurrent writers), buffered (no sync: survives a
    /// process crash, not power loss).
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "CAIRN_DURABILITY"
    )]
    pub durability: Option<Durability>,
    /// Hash algorithm for a new store (blake3 or sha256); an existing store keeps its own.
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        default_value = "blake3"
    )]
    pub hash: HashAlgo,
    /// Seconds to wait for a store another `cairn` process has open [default: 30; for
    /// `serve`, the config file's `lock_timeout_secs`].
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "CAIRN_LOCK_TIMEOUT",
        value_parser = parse_lock_timeout
    )]
    pub lock_timeout: Option<f64>,
    /// With --server: seconds a transfer may go without progress from the node (while a
    /// download waits for its answer or its next piece, an upload waits for the node to
    /// read more of it, or an upload, fully sent, waits for its answer) before it fails;
    /// 0 waits for ever.
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "CAIRN_STALL_TIMEOUT",
        default_value_t = 120.0,
        value_parser = parse_stall_timeout
    )]
    pub stall_timeout: f64,
    /// The bucket (namespace of keys, backed by one capsule) the command works on.
    #[arg(long, global = true, help_heading = "Global options", env = "CAIRN_BUCKET", default_value = DEFAULT_BUCKET)]
    pub bucket: String,
    /// The writer key that signs the bucket's records (default:
    /// $XDG_CONFIG_HOME/cairn/writer.key or ~/.config/cairn/writer.key; created on first
    /// write when missing).
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "CAIRN_KEY_FILE"
    )]
    pub key_file: Option<PathBuf>,
    /// Work against the native HTTP API of the node at this URL (e.g.
    /// http://127.0.0.1:3000) instead of the local store: same commands, same output and
    /// exit codes.
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "CAIRN_SERVER"
    )]
    pub server: Option<String>,
    /// The data key of `put --encrypt` / `get --decrypt` (default:
    /// $XDG_CONFIG_HOME/cairn/data.key or ~/.config/cairn/data.key; created on first
    /// --encrypt when missing).
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "CAIRN_DATA_KEY_FILE"
    )]
    pub data_key_file: Option<PathBuf>,
    /// Decrypt values in encryption format 1, which does not bind a value to its bucket
    /// and key (a node could serve another value encrypted with the same data key in its
    /// place); refused without it. Put such a value again to store it in format 2.
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "CAIRN_ALLOW_FORMAT_1",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub allow_format_1: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Write a new version of KEY; prints the new uid alone on stdout.
    Put(PutArgs),
    /// Read a version of KEY (the head of master by default).
    Get(GetArgs),
    /// Apply a type operation to the head of a branch (append, insert, add, multiply,
    /// map/set edits); prints the new uid.
    Update(UpdateArgs),
    /// Create branch NEW at a branch head or a version.
    Fork {
        /// The key.
        key: String,
        /// Branch name or uid to fork from.
        #[arg(long)]
        from: String,
        /// Name of the new branch.
        #[arg(long)]
        to: String,
    },
    /// Three-way merge of a branch or version into a branch, or of untagged heads.
    Merge(MergeArgs),
    /// Rename a branch.
    Rename {
        /// The key.
        key: String,
        /// Current name.
        from: String,
        /// New name.
        to: String,
    },
    /// Remove a branch (its versions stay until GC finds nothing reaching them).
    Remove {
        /// The key.
        key: String,
        /// Branch to remove.
        branch: String,
    },
    /// List a key's tagged branches (or untagged heads).
    Branches {
        /// The key.
        key: String,
        /// List untagged heads instead (more than one: concurrent writes forked the key).
        #[arg(long)]
        untagged: bool,
    },
    /// List keys.
    Keys,
    /// Show a key's history from a branch head or version, newest first.
    Log {
        /// The key.
        key: String,
        /// Branch name or uid to start from.
        #[arg(long, default_value = DEFAULT_BRANCH)]
        branch: String,
        /// Most versions to show.
        #[arg(long, default_value_t = 20)]
        limit: u64,
    },
    /// Show what differs between two versions.
    Diff {
        /// The key.
        key: String,
        /// First version (uid or branch).
        a: String,
        /// Second version (uid or branch).
        b: String,
    },
    /// Print the least common ancestor of two versions.
    Lca {
        /// The key.
        key: String,
        /// First version (uid or branch).
        a: String,
        /// Second version (uid or branch).
        b: String,
    },
    /// Re-hash everything reachable; exit 0 when intact, 6 naming the damage otherwise.
    /// With --proof: print and check the proof that the bucket's writer made a version.
    Verify {
        /// Verify only this key (required with --proof).
        #[arg(required_if_eq("proof", "true"))]
        key: Option<String>,
        /// Print the version's record and its hash chain to a writer signature, and check
        /// them as a reader who trusts only the capsule name would; exit 11 on a bad proof.
        #[arg(long)]
        proof: bool,
        /// The version to prove (default: the head of --branch).
        #[arg(long, requires = "proof", conflicts_with = "branch")]
        uid: Option<Uid>,
        /// The branch whose head is proven.
        #[arg(long, requires = "proof")]
        branch: Option<String>,
        /// Also write the proof's bytes to this file (check it elsewhere with
        /// `cairn verify-proof`).
        #[arg(long, requires = "proof")]
        out: Option<PathBuf>,
        /// With --server: the capsule name you trust; the node's metadata must hash to it.
        #[arg(long, requires = "proof")]
        capsule: Option<CapsuleName>,
    },
    /// Check a proof file written by `cairn verify --proof --out` against a capsule name,
    /// without any store: exit 0 when it proves the version, 11 when it does not, 6 when
    /// the file is not a proof at all (damaged or truncated).
    VerifyProof {
        /// The proof file.
        file: PathBuf,
        /// The bucket's capsule name (what the reader trusts, e.g. from a chain).
        #[arg(long)]
        capsule: CapsuleName,
        /// The capsule's metadata file (`cairn bucket --metadata-out`).
        #[arg(long)]
        metadata: PathBuf,
        /// The key the version belongs to.
        #[arg(long)]
        key: String,
        /// The version.
        #[arg(long)]
        uid: Uid,
    },
    /// Create the writer key that signs bucket records (at --key-file, see there).
    Keygen {
        /// Replace an existing key (records it signed stay signed by the old key, which
        /// stays the bucket's writer).
        #[arg(long)]
        force: bool,
    },
    /// Show the bucket's capsule: name, writers, records, log size.
    Bucket {
        /// Write the capsule's metadata (what `verify-proof` checks against) to this file.
        #[arg(long)]
        metadata_out: Option<PathBuf>,
    },
    /// Reclaim chunks no branch head reaches.
    Gc,
    /// Store statistics.
    Stats,
    /// Show the damage crash recovery found (kept until cleared); exit 6 when there is any.
    Recovery {
        /// Forget the notes (after dealing with the damage they describe).
        #[arg(long)]
        clear: bool,
        /// Delete the head refs whose value is damaged (not a uid), in every bucket of the
        /// store: they stop GC and every change to their key, and nothing else can remove
        /// them. The versions they named, if any, may then be collected by GC.
        #[arg(long)]
        drop_damaged_heads: bool,
    },
    /// A guided tour: writes, forks, edits, merges and verifies a few objects.
    Demo,
    /// Run a node: the native HTTP API and a drop-in Gaia hub over this data directory.
    Serve(ServeArgs),
    /// Benchmarks (see docs/benchmarks.md).
    Bench(crate::bench::BenchArgs),
}

/// `cairn serve`: flags and their environment variables override the config file.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// TOML config file (see docs/node.md); flags and environment variables override it.
    #[arg(long, env = "CAIRN_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:3000].
    #[arg(long, env = "CAIRN_LISTEN")]
    pub listen: Option<String>,
    /// Largest upload accepted, in bytes [default: 5 GiB].
    #[arg(long, env = "CAIRN_MAX_UPLOAD_BYTES")]
    pub max_upload_bytes: Option<u64>,
    /// Log format on stderr: text or json [default: text]. Filter with RUST_LOG.
    #[arg(long, env = "CAIRN_LOG_FORMAT")]
    pub log_format: Option<cairn_node::config::LogFormat>,
    /// Average POS-tree leaf size, in bytes, of the buckets the node creates [default:
    /// 65536]; a bucket keeps the size it was created with.
    #[arg(long, env = "CAIRN_LEAF_SIZE")]
    pub leaf_size: Option<u64>,
}

/// `cairn put`.
#[derive(Args, Debug)]
pub struct PutArgs {
    /// The key.
    pub key: String,
    /// The value, inline (default type string).
    #[arg(long, conflicts_with = "file")]
    pub value: Option<String>,
    /// Read the value from this file (default type blob, streamed; `-` is stdin). Without
    /// --value or --file the value is read from stdin.
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// Value type: string, integer, tuple, blob, list, map or set.
    #[arg(long = "type")]
    pub ty: Option<ValueType>,
    /// Branch to write (default master).
    #[arg(long, conflicts_with = "base")]
    pub branch: Option<String>,
    /// Derive from this version instead of a branch head (the new version is an untagged
    /// head; two puts on one base fork on conflict).
    #[arg(long)]
    pub base: Option<Uid>,
    /// Write only if the branch head is this version.
    #[arg(long)]
    pub guard: Option<Uid>,
    /// Application context stored with the version (e.g. a commit message): one line,
    /// no control characters.
    #[arg(long, default_value = "", value_parser = parse_context)]
    pub context: String,
    /// With --server: encrypt the value on this machine before upload (streamed;
    /// XChaCha20-Poly1305 STREAM under the data key, see --data-key-file).
    #[arg(long)]
    pub encrypt: bool,
}

/// `cairn get`.
#[derive(Args, Debug)]
pub struct GetArgs {
    /// The key.
    pub key: String,
    /// Branch to read.
    #[arg(long, conflicts_with = "uid")]
    pub branch: Option<String>,
    /// Version to read.
    #[arg(long)]
    pub uid: Option<Uid>,
    /// Write the value to this file instead of stdout (streamed).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the version's metadata instead of its value.
    #[arg(long)]
    pub meta: bool,
    /// With --server: decrypt a value put with --encrypt; nothing is written unless all of
    /// it authenticates.
    #[arg(long, conflicts_with = "meta")]
    pub decrypt: bool,
    /// With --server: read only a version the bucket's writer recorded, in the capsule of
    /// this name (the one you trust, e.g. anchored on a chain): the node's proof is checked
    /// before the value is read (exit 11 when it fails); the uid read is printed, and a note
    /// says when the writer recorded it on another branch than the one read. A proof shows
    /// the version was recorded, not that it is still the branch's head (an older one
    /// passes); and for a bucket written through a node's API the writer is the node's key
    /// (a note says so).
    #[arg(long)]
    pub capsule: Option<CapsuleName>,
}

/// `cairn update`.
#[derive(Args, Debug)]
pub struct UpdateArgs {
    /// The key.
    pub key: String,
    /// Branch whose head is updated.
    #[arg(long, default_value = DEFAULT_BRANCH)]
    pub branch: String,
    /// String: append text. Tuple: append an element. (One operation per update: --append,
    /// --insert-at, --add, --multiply, --splice-at, or --set/--unset.)
    #[arg(long, conflicts_with_all = ["insert_at", "add", "multiply", "splice_at", "set", "unset"])]
    pub append: Option<String>,
    /// String/Tuple: insert at this offset/index (with --text).
    #[arg(long, requires = "text", conflicts_with_all = ["add", "multiply", "splice_at", "set", "unset"])]
    pub insert_at: Option<u64>,
    /// Text inserted by --insert-at or --splice-at.
    #[arg(long, conflicts_with_all = ["append", "add", "multiply", "set", "unset"])]
    pub text: Option<String>,
    /// Integer: add.
    #[arg(long, allow_hyphen_values = true, conflicts_with_all = ["multiply", "splice_at", "set", "unset"])]
    pub add: Option<i64>,
    /// Integer: multiply.
    #[arg(long, allow_hyphen_values = true, conflicts_with_all = ["splice_at", "set", "unset"])]
    pub multiply: Option<i64>,
    /// Blob/List: replace --delete bytes/elements at this offset/index with --text
    /// (List: one element per line).
    #[arg(long, conflicts_with_all = ["set", "unset"])]
    pub splice_at: Option<u64>,
    /// Bytes/elements removed by --splice-at (0 when not given).
    #[arg(long)]
    pub delete: Option<u64>,
    /// Map: set key=value (repeatable). Set: add a member (repeatable).
    #[arg(long = "set")]
    pub set: Vec<String>,
    /// Map: remove a key (repeatable). Set: remove a member (repeatable).
    #[arg(long = "unset")]
    pub unset: Vec<String>,
    /// Write only if the branch head is this version.
    #[arg(long)]
    pub guard: Option<Uid>,
}

/// `cairn merge`.
#[derive(Args, Debug)]
pub struct MergeArgs {
    /// The key.
    pub key: String,
    /// Target branch (its head becomes the merge).
    #[arg(
        long,
        required_unless_present = "untagged",
        conflicts_with = "untagged"
    )]
    pub into: Option<String>,
    /// Branch or uid merged in.
    #[arg(long, requires = "into")]
    pub from: Option<String>,
    /// Merge untagged heads instead (all of them, or the uids given).
    #[arg(long)]
    pub untagged: bool,
    /// Uids of untagged heads to merge (with --untagged).
    pub uids: Vec<Uid>,
    /// Conflict resolver: ours, theirs, append, sum or union (default: fail on conflict).
    #[arg(long, default_value = "manual")]
    pub resolve: BuiltinResolver,
}

/// Opens (or creates) the embedded store at `dir`, waiting up to `lock_timeout` seconds
/// while another process has it open. A node's data_dir whose chunks live in an object
/// store is refused unless `log_only` (a command that reads or mends the log itself, such
/// as `recovery`).
pub fn open_store(
    dir: &Path,
    durability: Durability,
    algo: HashAlgo,
    lock_timeout: f64,
    log_only: bool,
) -> Result<Arc<dyn Store>> {
    let opts = LogStoreOptions {
        durability,
        algo,
        ..Default::default()
    };
    // A node's data_dir whose chunks live in an object store: the log holds only its refs,
    // and chunks written here would be invisible to the node (which then refuses to start
    // over them) while reads would find every version missing.
    let record = dir.join(cairn_node::node::BACKEND_RECORD_FILE);
    if let Ok(text) = std::fs::read_to_string(&record)
        && !log_only
    {
        return Err(Error::invalid(format!(
            "{} keeps its chunks in an object-store backend ({}): the CLI opens only embedded \
             stores; run `cairn serve` with its config and use `cairn --server URL`",
            dir.display(),
            text.trim().replace('\n', ", ")
        ))
        .into());
    }
    let timeout = std::time::Duration::from_secs_f64(lock_timeout.max(0.0));
    let store = LogStore::open_waiting(dir, opts, timeout, &mut |msg| {
        eprintln!("waiting for the store ({msg})")
    })
    .with_context(|| format!("opening store {}", dir.display()))?;
    Ok(Arc::new(store))
}

/// A progress bar on stderr when it is a terminal; hidden otherwise.
pub fn progress_bar(len: Option<u64>, what: &str) -> ProgressBar {
    if !io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let pb = match len {
        Some(n) => ProgressBar::new(n),
        None => ProgressBar::no_length(),
    };
    let tmpl = if len.is_some() {
        "{msg} {bar:30} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}"
    } else {
        "{msg} {bytes} {bytes_per_sec}"
    };
    if let Ok(style) = ProgressStyle::with_template(tmpl) {
        pb.set_style(style);
    }
    pb.set_message(what.to_string());
    pb
}

/// A spinner on stderr (hidden when it is not a terminal) for work of unknown length, with
/// its message and the time it has taken.
pub fn spinner(what: &str) -> ProgressBar {
    if !io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new_spinner();
    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} {elapsed}") {
        pb.set_style(style);
    }
    pb.set_message(what.to_string());
    pb.enable_steady_tick(std::time::Duration::from_millis(120));
    pb
}

/// A progress bar on stderr counting items (not bytes), hidden when stderr is not a
/// terminal; the total is set with `set_length` once known.
pub fn count_bar(what: &str, unit: &str) -> ProgressBar {
    if !io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::no_length();
    let tmpl = format!("{{msg}} {{bar:30}} {{pos}}/{{len}} {unit} eta {{eta}}");
    if let Ok(style) = ProgressStyle::with_template(&tmpl) {
        pb.set_style(style);
    }
    pb.set_message(what.to_string());
    pb
}

/// Runs one parsed command.
pub fn run(mut cli: Cli) -> Result<ExitCode> {
    crate::crypt::allow_unbound_format(cli.allow_format_1);
    // `put --file -` reads stdin, as most tools read it.
    if let Command::Put(a) = &mut cli.command
        && a.file.as_deref() == Some(Path::new("-"))
    {
        a.file = None;
    }
    match &cli.command {
        Command::Bench(args) => return crate::bench::run(args),
        Command::Keygen { force } => return keygen(&cli, *force),
        Command::VerifyProof {
            file,
            capsule,
            metadata,
            key,
            uid,
        } => return verify_proof_file(file, capsule, metadata, key, uid),
        _ => {}
    }
    // A node serves its own data directory: a client's `--server` / CAIRN_SERVER (say,
    // exported for the shell's other commands) has no meaning for it.
    if let Command::Serve(a) = &cli.command {
        return serve(&cli, a);
    }
    if let Some(server) = cli.server.clone() {
        return crate::client::run(cli, &server);
    }
    if matches!(
        &cli.command,
        Command::Put(PutArgs { encrypt: true, .. })
            | Command::Get(GetArgs { decrypt: true, .. })
            | Command::Get(GetArgs {
                capsule: Some(_),
                ..
            })
            | Command::Verify {
                capsule: Some(_),
                ..
            }
    ) {
        bail!(Error::invalid(
            "--encrypt, --decrypt and --capsule work with --server"
        ));
    }
    let data = cli
        .data
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
    let writes = matches!(
        cli.command,
        Command::Put(_)
            | Command::Update(_)
            | Command::Fork { .. }
            | Command::Merge(_)
            | Command::Rename { .. }
            | Command::Remove { .. }
            | Command::Demo
    );
    // Only a write creates a store: a read of a mistyped directory must not leave an
    // empty store there and answer as if it were one.
    // A store has its MANIFEST (a directory holding segments without one is a damaged
    // store, which opening reports).
    let is_store = data
        .join("MANIFEST")
        .try_exists()
        .with_context(|| format!("opening store {}", data.display()))?
        || std::fs::read_dir(&data).is_ok_and(|entries| {
            entries
                .flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with("seg-"))
        });
    // A put's input (and a merge's arguments) is read and checked first: bad input
    // creates no store, no key and no capsule.
    let mut put_input = match &cli.command {
        Command::Put(a) => Some(prepare_put(a)?),
        Command::Merge(a) => {
            check_merge_args(a)?;
            None
        }
        Command::Update(a) => {
            check_update_args(a)?;
            None
        }
        _ => None,
    };
    // Nor is anything created for a write that names what cannot be there: a refused
    // bucket name, or, in a store not made yet, a version to build on or guard with.
    if writes {
        cairn_object::db::check_bucket_name(&cli.bucket)?;
    }
    if let Command::Put(a) = &cli.command
        && !is_store
    {
        if let Some(g) = a.guard {
            bail!(Error::GuardMismatch(format!(
                "no store at {} yet, so no branch is at {g}",
                data.display()
            )));
        }
        if let Some(b) = a.base {
            bail!(Error::NotFound(format!(
                "version {b} (no store at {} yet)",
                data.display()
            )));
        }
    }
    // Only a put (or the demo) makes something new: every other command needs a store,
    // and its key, to exist already, and fails before anything is created otherwise.
    let creates = matches!(cli.command, Command::Put(_) | Command::Demo);
    if !creates && !is_store {
        bail!(Error::NotFound(format!(
            "no store at {} (a write such as `cairn put` creates one; check --data or \
             CAIRN_DATA)",
            data.display()
        )));
    }
    let store = open_store(
        &data,
        cli.durability.unwrap_or(Durability::Group),
        cli.hash,
        cli.lock_timeout.unwrap_or(DEFAULT_LOCK_TIMEOUT_SECS),
        // The crash-recovery notes of a node's log are its own, whatever holds its chunks.
        matches!(cli.command, Command::Recovery { .. }),
    )?;
    if !matches!(
        cli.command,
        Command::Recovery { .. } | Command::Verify { .. }
    ) {
        let notes = store.recovery_notes()?;
        if !notes.is_empty() {
            eprintln!(
                "warning: crash recovery found damage in this store ({} note(s)); see `cairn recovery`",
                notes.len()
            );
        }
    }
    let existing_key = match &cli.command {
        Command::Update(a) => Some(a.key.as_str()),
        // A fork from a uid may bring back a key whose last branch was removed.
        Command::Fork { key, from, .. } if !matches!(At::parse(from), At::Uid(_)) => {
            Some(key.as_str())
        }
        Command::Rename { key, .. } | Command::Remove { key, .. } => Some(key.as_str()),
        Command::Merge(a) => Some(a.key.as_str()),
        _ => None,
    };
    // The store's one Db, made before anything is created for the command.
    let db = Db::new(store.clone()).in_bucket(&cli.bucket)?;
    if let Some(key) = existing_key {
        db.existing_table(key.as_bytes())?;
    }
    // A guard, a base or a fork's source that cannot hold fails before a writer key or the
    // bucket's capsule is made (a first write to a bucket claims it for the writer's key).
    // Checked again, under the key's lock, by the write itself.
    // A uid can be a version of this bucket only if the bucket has a capsule: in a new one
    // (whose capsule the open below would make) it is refused here, whatever else of the
    // store it names (`Bucket` checks membership once open). A bucket whose keys were all
    // removed keeps its capsule, and its versions can be brought back.
    let empty_bucket = || -> Result<bool> {
        Ok(cairn_capsule::bucket::bucket_capsule(store.as_ref(), &cli.bucket)?.is_none())
    };
    let not_here = |u: &Uid| {
        Error::NotFound(format!(
            "version {u} in bucket {:?}, which has no version yet",
            cli.bucket
        ))
    };
    match &cli.command {
        Command::Put(a) => {
            if let Some(g) = a.guard {
                let branch = a.branch.as_deref().unwrap_or(DEFAULT_BRANCH);
                let head = db.branch_head(a.key.as_bytes(), branch)?;
                if head != Some(g) {
                    bail!(Error::GuardMismatch(format!(
                        "branch {branch:?} of key {:?} is at {}, not {g}",
                        a.key,
                        head.map_or_else(|| "nothing".to_string(), |h| h.to_string())
                    )));
                }
            }
            if let Some(b) = a.base
                && empty_bucket()?
            {
                bail!(not_here(&b));
            }
            // A streamed input's target (branch, type), before the bucket's capsule is
            // made and before the input is read.
            if let Some(ty) = put_input.as_ref().and_then(streamed_type) {
                db.check_put_target(a.key.as_bytes(), put_target(a), ty, &put_options(a))?;
            }
        }
        Command::Fork { from, .. } => {
            if let At::Uid(u) = At::parse(from)
                && empty_bucket()?
            {
                bail!(not_here(&u));
            }
        }
        _ => {}
    }
    let writer = if writes {
        let path = writer_key_path(&cli)?;
        // A key is made only for a bucket that has no writer yet (the write makes the
        // bucket's capsule with it): for one that has, a missing key file is a wrong path,
        // and a new key could not write there anyway.
        if !path.exists()
            && let Some(capsule) =
                cairn_capsule::bucket::bucket_capsule(store.as_ref(), &cli.bucket)?
        {
            let writers = store
                .get(capsule.hash())?
                .and_then(|m| cairn_capsule::CapsuleMetadata::decode(&m).ok())
                .map(|m| {
                    m.writers
                        .iter()
                        .map(|w| w.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_else(|| "its capsule's writers".into());
            bail!(Error::Rejected(format!(
                "bucket {:?} is written by {writers}; no writer key at {} (--key-file or \
                 CAIRN_KEY_FILE)",
                cli.bucket,
                path.display()
            )));
        }
        Some(cairn_node::keys::read_or_create(&path, "writer", true)?)
    } else {
        None
    };
    // The store's node key signs what its capsule server acknowledges. A damaged one is
    // damage (exit 6), and does not stop a command that writes nothing: reads, `verify`
    // and `recovery` (the tools to diagnose damage) run with a key of their own.
    let node_key = match cairn_node::keys::read_or_create(&data.join(NODE_KEY_FILE), "node", false)
    {
        Ok(k) => k,
        Err(e) if !writes => {
            eprintln!(
                "warning: the store's node key {} is unusable ({e}); this command writes \
                 nothing and goes on without it",
                data.join(NODE_KEY_FILE).display()
            );
            cairn_core::SigningKey::generate()?
        }
        Err(e) => bail!(Error::corrupt(format!(
            "the store's node key {}: {e}",
            data.join(NODE_KEY_FILE).display()
        ))),
    };
    let server = Arc::new(CapsuleServer::new(
        store.clone(),
        node_key,
        ServerOptions::default(),
    ));
    // A bucket whose capsule metadata is damaged does not open. A command that writes
    // nothing goes on over the bucket's Db (verify reporting the damage), so the tools to
    // diagnose and repair damage, and reads of intact keys, still run.
    // Which versions are the bucket's is its capsule's to say: without it, none named
    // by uid is taken (another bucket's would read as this one's).
    struct NoneKnown;
    impl cairn_object::VersionMembership for NoneKnown {
        fn holds(&self, _: &Uid) -> cairn_core::Result<bool> {
            Ok(false)
        }
    }
    let plain = Db::new(store.clone())
        .in_bucket(&cli.bucket)?
        .with_members(Arc::new(NoneKnown));
    let opened = match Bucket::open(db, server, writer) {
        Ok(b) => Ok(b),
        Err(e @ (Error::Corrupt(_) | Error::Decode(_))) if !writes => {
            if !matches!(cli.command, Command::Verify { .. }) {
                eprintln!(
                    "warning: the capsule of bucket {:?} is damaged ({e}); this command \
                     writes nothing and goes on without it",
                    cli.bucket
                );
            }
            Err(e)
        }
        Err(e) => return Err(e.into()),
    };
    let db = match &opened {
        Ok(b) => b.db(),
        Err(_) => &plain,
    };
    // What needs the bucket's capsule (writes, proofs, the capsule's audit).
    let bucket = || -> Result<&Bucket> {
        opened.as_ref().map_err(|e| {
            anyhow::Error::from(Error::corrupt(format!(
                "capsule of bucket {:?}: {e}",
                cli.bucket
            )))
        })
    };
    let out = io::stdout();
    let mut out = out.lock();
    match cli.command {
        Command::Put(a) => {
            let input = put_input
                .take()
                .ok_or_else(|| anyhow::anyhow!("the put's input was not prepared"))?;
            put(bucket()?, a, input, &mut out)?
        }
        Command::Get(a) => get(db, a, &mut out)?,
        Command::Update(a) => update(bucket()?, a, &mut out)?,
        Command::Fork { key, from, to } => {
            let uid = bucket()?.fork(key.as_bytes(), &At::parse(&from), &to)?;
            writeln!(out, "{uid}")?;
        }
        Command::Merge(a) => return merge(bucket()?, a, &mut out),
        Command::Rename { key, from, to } => {
            bucket()?.rename(key.as_bytes(), &from, &to)?;
        }
        Command::Remove { key, branch } => {
            let uid = bucket()?.remove(key.as_bytes(), &branch)?;
            if let Err(Error::NotFound(_)) = db.list_tagged(key.as_bytes()) {
                eprintln!("{}", last_branch_removed(&key, &branch, &uid.to_string()));
            }
        }
        Command::Branches { key, untagged } => {
            if untagged {
                for u in db.list_untagged(key.as_bytes())? {
                    writeln!(out, "{u}")?;
                }
            } else {
                for (name, u) in db.list_tagged(key.as_bytes())? {
                    writeln!(out, "{name}\t{u}")?;
                }
                let n = db.list_untagged(key.as_bytes())?.len();
                if n > 0 {
                    eprintln!("{}", untagged_note(&key, n));
                }
            }
        }
        Command::Keys => {
            // A page at a time: a bucket of millions of keys prints without holding them.
            let mut after: Option<bytes::Bytes> = None;
            loop {
                let (page, more) = db.list_keys_page(after.as_deref(), 4096)?;
                for k in &page {
                    out.write_all(k)?;
                    writeln!(out)?;
                }
                if !more {
                    break;
                }
                after = page.last().cloned();
            }
        }
        Command::Log { key, branch, limit } => {
            if limit == 0 {
                bail!(Error::invalid("--limit must be at least 1"));
            }
            // Nearest first; distances 0..limit hold at least `limit` versions when the
            // history is that long (merges put several at one distance).
            let entries = db.track(key.as_bytes(), &At::parse(&branch), 0, limit - 1)?;
            for e in entries.into_iter().take(limit as usize) {
                writeln!(out, "{}", log_line(&e.uid, &e.object))?;
            }
        }
        Command::Diff { key, a, b } => {
            // A branch's head is damage, not "not found", when it names another key's
            // version (`Db::get` tells the two apart).
            let va = db.get(key.as_bytes(), &At::parse(&a))?.object.value;
            let vb = db.get(key.as_bytes(), &At::parse(&b))?.object.value;
            // A page at a time: memory stays bounded however large the diff.
            let mut after = None;
            loop {
                let (d, next) = db.diff_values_page(&va, &vb, after.as_ref(), 10_000)?;
                print_diff(&d, &mut out)?;
                match next {
                    Some(c) => after = Some(c),
                    None => break,
                }
            }
        }
        Command::Lca { key, a, b } => {
            // Through `get`: a branch head naming no version of the key is damage.
            // Both versions were admitted by the reads (by branch, or by uid as the
            // bucket's), so the walk takes them as they are (a bucket whose capsule is
            // damaged admits no uid, and its branches' heads are still its own).
            let ua = db.get(key.as_bytes(), &At::parse(&a))?.uid;
            let ub = db.get(key.as_bytes(), &At::parse(&b))?.uid;
            match cairn_object::history::lca_in(db.chunks(), key.as_bytes(), &ua, &ub)? {
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
            ..
        } => verify_version(bucket()?, &key, uid, branch, file.as_deref(), &mut out)?,
        Command::Verify { key, .. } => {
            let pb = count_bar("verifying", "keys");
            let report = db.verify_with_progress(key.as_deref().map(str::as_bytes), &mut |p| {
                pb.set_length(p.keys_total);
                pb.set_position(p.keys_done);
                // A single large value moves the count of chunks, not of keys.
                pb.set_message(format!("verifying ({} chunks re-hashed)", p.chunks));
            })?;
            pb.finish_and_clear();
            // A bucket with nothing in it (a mistyped --bucket) is not "intact": verify checks
            // one bucket, and said so of one that is not there. (Damage the store's crash
            // recovery noted is reported below all the same.)
            if key.is_none()
                && report.keys == 0
                && report.is_intact()
                && opened.as_ref().is_ok_and(|b| b.capsule().is_none())
            {
                bail!(Error::not_found(format!(
                    "bucket {:?}: it holds no key and no capsule (verify checks one bucket; \
                     check --bucket)",
                    cli.bucket
                )));
            }
            // The bucket's capsule: every record header re-hashed, every signature checked.
            let audit = match &opened {
                Ok(b) => match b.capsule() {
                    Some(c) if key.is_none() => Some(b.server().audit(&c)),
                    _ => None,
                },
                Err(e) => Some(Err(Error::corrupt(e))),
            };
            if let Some(Err(e)) = &audit {
                eprintln!("damaged: capsule of bucket {}: {e}", cli.bucket);
            }
            if report.is_intact() && !matches!(audit, Some(Err(_))) {
                writeln!(
                    out,
                    "intact: {} key(s), {} version(s), {} chunk(s) re-hashed",
                    report.keys, report.versions, report.chunks
                )?;
                if let Some(Ok((records, sigs))) = audit {
                    writeln!(
                        out,
                        "capsule of bucket {}: {records} records, {sigs} writer signatures re-verified",
                        cli.bucket
                    )?;
                }
            } else if report.is_intact() {
                bail!(Error::corrupt(format!(
                    "the capsule of bucket {} is damaged",
                    cli.bucket
                )));
            } else {
                for d in &report.damage {
                    eprintln!("damaged: {d}");
                }
                bail!(Error::corrupt(format!(
                    "{} damaged item(s) found in {} key(s)",
                    report.damage.len(),
                    report.keys
                )));
            }
        }
        Command::Gc => {
            let pb = spinner("gc");
            let r = db.gc_with_progress(&mut |phase| pb.set_message(format!("gc: {phase}")));
            pb.finish_and_clear();
            let r = r?;
            writeln!(
                out,
                "gc: {} chunks examined, {} live, {} removed, {} bytes reclaimed",
                r.candidates, r.live, r.removed, r.bytes_reclaimed
            )?;
            if r.damaged_kept > 0 {
                eprintln!(
                    "warning: {} chunk(s) no head reaches failed their hash when read and were \
                     kept (damaged: a bucket capsule's record among them comes back from a \
                     replica by anti-entropy); `cairn verify` checks what heads reach",
                    r.damaged_kept
                );
            }
            if r.removed > 0 && r.bytes_reclaimed == 0 {
                eprintln!(
                    "note: compaction rewrites only segment files that are at least half \
                     garbage, so the removed chunks' space returns once more of theirs is \
                     garbage; `cairn stats` shows chunk bytes against bytes on disk"
                );
            }
        }
        Command::Stats => {
            let s = db.store().stats()?;
            writeln!(out, "hash: {}", db.algo())?;
            writeln!(out, "durability: {}", db.store().durability())?;
            writeln!(
                out,
                "keys in bucket {}: {}",
                cli.bucket,
                db.list_keys()?.len()
            )?;
            writeln!(out, "chunks: {}", s.chunks)?;
            writeln!(out, "chunk bytes: {}", s.chunk_bytes)?;
            writeln!(out, "bytes on disk: {}", s.bytes_on_disk)?;
        }
        Command::Recovery {
            clear,
            drop_damaged_heads,
        } => {
            if drop_damaged_heads {
                let dropped = db.drop_damaged_heads()?;
                for name in &dropped {
                    writeln!(out, "dropped damaged head ref {name:?}")?;
                }
                writeln!(out, "{} damaged head ref(s) dropped", dropped.len())?;
            }
            let notes = db.store().recovery_notes()?;
            if clear {
                db.store().clear_recovery_notes()?;
                writeln!(out, "cleared {} recovery note(s)", notes.len())?;
            } else if notes.is_empty() {
                writeln!(out, "no damage recorded by crash recovery")?;
            } else {
                for n in &notes {
                    writeln!(out, "{n}")?;
                }
                bail!(Error::corrupt(format!(
                    "{} recovery note(s); clear them with `cairn recovery --clear` once dealt with",
                    notes.len()
                )));
            }
        }
        Command::Bucket { metadata_out } => {
            show_bucket(bucket()?, metadata_out.as_deref(), &mut out)?
        }
        Command::Demo => crate::demo::run(bucket()?, cli.data.as_deref(), &mut out)?,
        Command::Bench(_)
        | Command::Keygen { .. }
        | Command::VerifyProof { .. }
        | Command::Serve(_) => {
            unreachable!("handled above")
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The `size:` line of `cairn get --meta`: bytes, elements, or an integer's value.
fn size_of(v: &Value) -> String {
    match v.value_type() {
        ValueType::String | ValueType::Blob => format!("{} bytes", v.len()),
        ValueType::Integer => match v {
            Value::Integer(i) => format!("= {i}"),
            _ => String::new(),
        },
        _ => format!("{} elements", v.len()),
    }
}

/// A put's value, read (or opened, for the streamed types) and checked before the store
/// is opened.
enum PutInput {
    /// A value read whole and parsed.
    Value(cairn_object::NewValue),
    /// A blob streamed from the reader (with its length when known).
    Blob(Box<dyn Read>, Option<u64>),
    /// A list streamed from the reader, one element per line.
    List(Box<dyn Read>, Option<u64>),
}

/// Most bytes of input a map or set put reads (it is read whole and sorted): what a node
/// buffers of one body.
const MAP_SET_INPUT_LIMIT: u64 = cairn_node::native::objects::BUFFERED_LIMIT;

fn too_large_map_set(ty: ValueType) -> Error {
    Error::invalid(format!(
        "a {ty} put from a file or stdin is read whole and limited to {} MiB; build a \
         larger one with `update` in steps",
        MAP_SET_INPUT_LIMIT >> 20
    ))
}

fn prepare_put(a: &PutArgs) -> Result<PutInput> {
    if a.base.is_some() && a.guard.is_some() {
        bail!(Error::invalid(
            "a guard applies to a branch put, not to a put on a base version"
        ));
    }
    // Before anything is opened or created: a put refused for its key or branch name
    // creates no store, key or bucket.
    cairn_object::fobject::check_key(a.key.as_bytes())?;
    if let Some(b) = &a.branch {
        cairn_object::branch::check_branch_name(b)?;
    }
    if let Some(v) = &a.value {
        let ty = a.ty.unwrap_or(ValueType::String);
        return Ok(PutInput::Value(format::parse_value(
            ty,
            v.clone().into_bytes(),
        )?));
    }
    let ty = a.ty.unwrap_or(ValueType::Blob);
    let (reader, len): (Box<dyn Read>, Option<u64>) = match &a.file {
        Some(p) => {
            let f = File::open(p).with_context(|| format!("opening {}", p.display()))?;
            let meta = f.metadata().ok();
            if meta.as_ref().is_some_and(|m| m.is_dir()) {
                bail!(Error::invalid(format!(
                    "{} is a directory; give a file (or - for stdin)",
                    p.display()
                )));
            }
            let len = meta.filter(|m| m.is_file()).map(|m| m.len());
            (Box::new(f), len)
        }
        None => {
            if io::stdin().is_terminal() {
                eprintln!(
                    "reading the value from stdin (end with Ctrl-D; or use --value / --file)"
                );
            }
            (Box::new(io::stdin()), None)
        }
    };
    match ty {
        ValueType::Blob => Ok(PutInput::Blob(reader, len)),
        ValueType::List => Ok(PutInput::List(reader, len)),
        _ => {
            let inline = matches!(
                ty,
                ValueType::String | ValueType::Tuple | ValueType::Integer
            );
            let limit = cairn_object::db::MAX_INLINE_BYTES as u64;
            let too_large = || {
                Error::invalid(format!(
                    "a {ty} is stored inline and limited to {} MiB; store this as a blob or list",
                    limit >> 20
                ))
            };
            if inline && len.is_some_and(|n| n > limit) {
                bail!(too_large());
            }
            // A map or set is read whole (it is sorted before it is built): at most
            // MAP_SET_INPUT_LIMIT, as a node buffers (it took all of a file of any size,
            // and several copies more as it was parsed).
            if !inline && len.is_some_and(|n| n > MAP_SET_INPUT_LIMIT) {
                bail!(too_large_map_set(ty));
            }
            // An inline value is read no further than its limit (a pipe has no length).
            let mut buf = Vec::new();
            let cap = if inline {
                limit + 1
            } else {
                MAP_SET_INPUT_LIMIT + 1
            };
            reader
                .take(cap)
                .read_to_end(&mut buf)
                .context("reading the input")?;
            if inline && buf.len() as u64 > limit {
                bail!(too_large());
            }
            if !inline && buf.len() as u64 > MAP_SET_INPUT_LIMIT {
                bail!(too_large_map_set(ty));
            }
            Ok(PutInput::Value(format::parse_value(ty, buf)?))
        }
    }
}

/// Where `cairn put` writes: on `--base`, else to `--branch` (master by default).
fn put_target(a: &PutArgs) -> Target<'_> {
    match (&a.branch, &a.base) {
        (_, Some(b)) => Target::Base(*b),
        (Some(b), None) => Target::Branch(b),
        (None, None) => Target::Branch(DEFAULT_BRANCH),
    }
}

/// The options of `cairn put`.
fn put_options(a: &PutArgs) -> PutOptions {
    PutOptions {
        guard: a.guard,
        context: a.context.clone().into_bytes(),
        ..PutOptions::default()
    }
}

/// The type a streamed put input stores (`None` for a value given whole).
fn streamed_type(input: &PutInput) -> Option<ValueType> {
    match input {
        PutInput::Blob(..) => Some(ValueType::Blob),
        PutInput::List(..) => Some(ValueType::List),
        PutInput::Value(_) => None,
    }
}

fn put(db: &Bucket, a: PutArgs, input: PutInput, out: &mut impl Write) -> Result<()> {
    let target = put_target(&a);
    let opts = put_options(&a);
    let key = a.key.as_bytes();
    // A streamed input is stored before the put's own checks: what would refuse it (a
    // branch typo, another type on the key, a stale guard) is found first, not after
    // reading (and storing) the whole input.
    // (Checked once before the bucket was opened too; here with its versions known.)
    if let Some(ty) = streamed_type(&input) {
        db.db().check_put_target(key, target, ty, &opts)?;
    }
    let uid = match input {
        PutInput::Value(v) => db.put(key, target, v, &opts)?,
        PutInput::Blob(mut reader, len) => {
            let pb = progress_bar(len, "put");
            let uid =
                db.put_blob_stream(key, target, &mut reader, &opts, &mut |n| pb.set_position(n))?;
            pb.finish_and_clear();
            uid
        }
        PutInput::List(reader, len) => {
            let pb = progress_bar(len, "put");
            // Each element at most an inline value's size, as a node takes them (one
            // endless line was read into memory whole).
            let mut lines = cairn_node::native::body::bounded_lines(
                io::BufReader::with_capacity(1 << 20, pb.wrap_read(reader)),
                cairn_object::db::MAX_INLINE_BYTES,
            );
            let uid = db.put_list_stream(key, target, &mut lines, &opts)?;
            pb.finish_and_clear();
            uid
        }
    };
    writeln!(out, "{uid}")?;
    Ok(())
}

fn get(db: &Db, a: GetArgs, out: &mut impl Write) -> Result<()> {
    let at = match (a.uid, a.branch) {
        (Some(u), _) => At::Uid(u),
        (None, Some(b)) => At::Branch(b),
        (None, None) => At::default_branch(),
    };
    let v = db.get(a.key.as_bytes(), &at)?;
    if a.meta {
        let meta = meta_text(&v.uid, &v.object)?;
        crate::cli::emit_text(&meta, a.out.as_deref(), out)?;
        return Ok(());
    }
    match &a.out {
        Some(p) => {
            write_whole_file(p, 0o666, &mut |w| {
                write_value(db, &v.object.value, w).map(|()| 0)
            })?;
        }
        None => {
            let mut sink = BufWriter::with_capacity(1 << 20, &mut *out);
            write_value(db, &v.object.value, &mut sink)?;
            sink.flush().context("writing the output")?;
        }
    }
    Ok(())
}

/// One line of `cairn log`: the version, its depth, type and size, the versions it
/// merges and its context.
pub fn log_line(uid: &Uid, o: &cairn_object::FObject) -> String {
    let mut line = format!(
        "{uid}  depth {}  {} ({})",
        o.depth,
        o.value_type(),
        size_of(&o.value)
    );
    if o.bases.len() > 1 {
        let b: Vec<String> = o.bases.iter().map(|b| b.short()).collect();
        line.push_str(&format!("  merge of {}", b.join(" ")));
    }
    if !o.context.is_empty() {
        line.push_str(&format!("  {}", format::show(&o.context)));
    }
    line
}

/// What `cairn get --meta` prints about version `uid`.
pub fn meta_text(uid: &Uid, o: &cairn_object::FObject) -> Result<Vec<u8>> {
    let mut meta = Vec::new();
    writeln!(meta, "uid: {uid}")?;
    writeln!(meta, "key: {}", String::from_utf8_lossy(&o.key))?;
    writeln!(meta, "type: {}", o.value_type())?;
    writeln!(meta, "size: {}", size_of(&o.value))?;
    writeln!(meta, "depth: {}", o.depth)?;
    for b in &o.bases {
        writeln!(meta, "base: {b}")?;
    }
    if let Some(t) = o.value.tree() {
        writeln!(meta, "root: {}", t.root)?;
        writeln!(meta, "height: {}", t.height)?;
    }
    if !o.context.is_empty() {
        writeln!(meta, "context: {}", format::show(&o.context))?;
    }
    Ok(meta)
}

/// Writes a command's text output to `--out` (whole or not at all) or to `out`.
pub fn emit_text(text: &[u8], dest: Option<&Path>, out: &mut impl Write) -> Result<()> {
    match dest {
        Some(p) => {
            write_whole_file(p, 0o666, &mut |w| {
                w.write_all(text)
                    .with_context(|| format!("writing {}", p.display()))?;
                Ok(text.len() as u64)
            })?;
        }
        None => out.write_all(text)?,
    }
    Ok(())
}

/// What `cairn branches KEY` adds (on stderr) when the key also has untagged heads.
pub fn untagged_note(key: &str, n: usize) -> String {
    let k = format::shell_word(key);
    format!(
        "note: {key:?} also has {n} untagged head(s) (concurrent puts on one base): \
         `cairn branches {k} --untagged` lists them, `cairn merge {k} --untagged` merges them"
    )
}

/// What `cairn remove` tells when it removed a key's last branch: the key is gone from
/// `keys`, and how to bring it back while its versions are still in the store.
pub fn last_branch_removed(key: &str, branch: &str, uid: &str) -> String {
    let (k, b) = (format::shell_word(key), format::shell_word(branch));
    format!(
        "note: {key:?} has no branch left, so it is no longer listed; its versions stay until \
         `cairn gc` reclaims them: `cairn fork {k} --from {uid} --to {b}` restores it"
    )
}

/// Where [`write_whole_file`] writes.
pub enum OutTarget {
    /// A regular file (new or existing; a symlink resolved to it), replaced whole.
    File(PathBuf),
    /// Something else that exists (a device such as `/dev/null`, a pipe), or whatever a
    /// descriptor path (`/dev/stdout`, `/dev/fd/N`, `/proc/self/fd/N`) names: written in
    /// place, as a shell redirection would ([`open_in_place`]).
    InPlace,
}

/// Opens `dest`, which [`out_target`] found is written in place: a device or a pipe as `>`
/// opens it; a regular file (reached through a descriptor path, the shell's own
/// redirection) appended to, so that `>>`, or a group's earlier output, stays.
pub fn open_in_place(dest: &Path) -> Result<File> {
    let regular = std::fs::metadata(dest).is_ok_and(|m| m.is_file());
    let f = if regular {
        std::fs::OpenOptions::new().append(true).open(dest)
    } else {
        File::create(dest)
    };
    f.with_context(|| format!("opening {}", dest.display()))
}

/// Whether `p` names an open descriptor (`/dev/stdout`, `/dev/stderr`, `/dev/fd/N`,
/// `/proc/<pid>/fd/N`): its "link" is the kernel's, to whatever the descriptor holds (a
/// pipe reads as `pipe:[N]`), so it is opened, never resolved and replaced.
fn is_descriptor_path(p: &Path) -> bool {
    let mut parts = p
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned());
    let first: Vec<String> = parts.by_ref().take(4).collect();
    let first: Vec<&str> = first.iter().map(String::as_str).collect();
    matches!(
        first.as_slice(),
        ["/", "dev", "stdout" | "stderr", ..] | ["/", "dev", "fd", _] | ["/", "proc", _, "fd"]
    )
}

/// Decides how `dest` is written: a symlink is followed (as the kernel would follow it,
/// [`check_link_owner`]), and an existing file must be writable by us (a shell
/// redirection into a read-only file fails too).
pub fn out_target(dest: &Path) -> Result<OutTarget> {
    // The chain of links is walked here, not by the kernel, because the file is replaced
    // by a rename beside the file it ends at; a dangling link's file is made whole or not
    // at all, like any new file.
    let Some(end) = link_target(dest)? else {
        // A descriptor: it must be open (the kernel follows it), and is written in place.
        std::fs::metadata(dest).with_context(|| format!("opening {}", dest.display()))?;
        return Ok(OutTarget::InPlace);
    };
    let m = match std::fs::metadata(&end) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(OutTarget::File(end)),
        Err(e) => return Err(e).with_context(|| format!("opening {}", dest.display())),
    };
    if !m.file_type().is_file() {
        return Ok(OutTarget::InPlace);
    }
    // Opening for writing without truncating checks permission and changes nothing.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&end)
        .with_context(|| format!("opening {}", dest.display()))?;
    Ok(OutTarget::File(end))
}

/// The path a chain of symbolic links starting at `dest` ends at (a path that is not a
/// link, or does not exist); at most 40 links, as the kernel follows. Each link must pass
/// [`check_link_owner`]. `None` when the chain reaches a descriptor path
/// ([`is_descriptor_path`]).
fn link_target(dest: &Path) -> Result<Option<PathBuf>> {
    let mut at = dest.to_path_buf();
    for _ in 0..40 {
        if is_descriptor_path(&at) {
            return Ok(None);
        }
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.file_type().is_symlink() => {
                check_link_owner(&at, &m)?;
                let to = std::fs::read_link(&at)
                    .with_context(|| format!("reading the link {}", at.display()))?;
                at = match at.parent() {
                    Some(dir) if to.is_relative() => dir.join(to),
                    _ => to,
                };
            }
            _ => return Ok(Some(at)),
        }
    }
    Err(Error::invalid(format!(
        "{}: too many levels of symbolic links",
        dest.display()
    ))
    .into())
}

/// Refuses to follow `link` (its own metadata `m`) where Linux's `fs.protected_symlinks`
/// refuses: in a sticky directory anyone may write (such as `/tmp`), a link owned neither
/// by us nor by the directory's owner. `--out` follows links itself (to write beside the
/// file they name and rename into place), which the kernel's check would not see: another
/// user's link `/tmp/report.pdf` → `~/.bashrc` would otherwise have `cairn get --out
/// /tmp/report.pdf` replace the victim's own file, where `> /tmp/report.pdf` fails.
fn check_link_owner(link: &Path, m: &std::fs::Metadata) -> Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let dir = link
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let d = std::fs::metadata(dir).with_context(|| format!("opening {}", dir.display()))?;
        // SAFETY: geteuid has no arguments and cannot fail.
        let me = unsafe { libc::geteuid() };
        if link_is_protected(d.mode(), d.uid(), m.uid(), me) {
            return Err(Error::invalid(format!(
                "{}: not following a symbolic link another user owns in a shared directory \
                 (as the kernel refuses with fs.protected_symlinks); give the file it names",
                link.display()
            ))
            .into());
        }
    }
    Ok(())
}

/// The kernel's `protected_symlinks` rule: a link in a sticky directory anyone may write
/// (`dir_mode`, owned by `dir_uid`) is not followed for `me` when it is owned (`link_uid`)
/// neither by `me` nor by the directory's owner.
#[cfg(unix)]
fn link_is_protected(dir_mode: u32, dir_uid: u32, link_uid: u32, me: u32) -> bool {
    dir_mode & 0o1002 == 0o1002 && link_uid != me && link_uid != dir_uid
}

/// Copies the complete, checked `from` over the existing file `to` in place (when no
/// temporary file can replace it), as a shell redirection would, but only once the content
/// is whole: a failure to open `to` leaves it as it was. A write that fails partway (a
/// full disk) cuts the file where the new content stopped, so it cannot pass for whole
/// (new bytes followed by the old file's tail, at its old length), and the command fails.
fn copy_over(from: &mut File, to: &Path, dest: &Path) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(to)
        .with_context(|| format!("opening {}", dest.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut written = 0u64;
    loop {
        let n = match io::Read::read(from, &mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                let _ = f.set_len(written);
                return Err(e).context("reading the temporary file");
            }
        };
        if let Err(e) = f.write_all(&buf[..n]) {
            let _ = f.set_len(written);
            return Err(e).with_context(|| format!("writing {}", dest.display()));
        }
        written += n as u64;
    }
    f.set_len(written)
        .and_then(|()| f.sync_data())
        .with_context(|| format!("writing {}", dest.display()))?;
    Ok(())
}

/// Writes `dest` whole or not at all: `fill` writes into a temporary file beside it, which
/// replaces `dest` only once `fill` succeeded and everything is flushed and synced (so a
/// crash or power loss leaves the old file or the new one). The result keeps
/// the permissions of the file it replaces; a new file gets `new_mode` (less the umask).
/// On failure `dest` is left as it was and the temporary file is removed. A `dest` that is
/// not a regular file (`/dev/null`, a pipe) is written in place. An existing `dest` in a
/// directory where no temporary file can be made is filled through an anonymous temporary
/// file in `$TMPDIR` and copied in once complete (as is one that cannot be renamed over).
/// Returns what `fill` returned.
pub fn write_whole_file(
    dest: &Path,
    new_mode: u32,
    fill: &mut dyn FnMut(&mut dyn Write) -> Result<u64>,
) -> Result<u64> {
    use std::os::unix::fs::PermissionsExt;
    let in_place = |fill: &mut dyn FnMut(&mut dyn Write) -> Result<u64>| -> Result<u64> {
        let mut f = open_in_place(dest)?;
        if f.metadata().is_ok_and(|m| m.is_file()) {
            // A file behind a descriptor (`>> log` and `--out /dev/stdout`): appended to
            // only once the whole value was written out and checked, through a spool, so
            // a failure adds nothing to it.
            let (mut spool, n) = spooled(fill)?;
            // Cut back to where it was should the copy fail (a full disk), so nothing of
            // the value is left appended.
            let before = f.metadata().map(|m| m.len()).ok();
            if let Err(e) = io::copy(&mut spool, &mut f) {
                if let Some(len) = before {
                    let _ = f.set_len(len);
                }
                return Err(e).with_context(|| format!("writing {}", dest.display()));
            }
            return Ok(n);
        }
        let mut w = BufWriter::with_capacity(1 << 20, f);
        let n = fill(&mut w)?;
        w.flush()
            .with_context(|| format!("writing {}", dest.display()))?;
        Ok(n)
    };
    let real = match out_target(dest)? {
        OutTarget::InPlace => return in_place(fill),
        OutTarget::File(p) => p,
    };
    let keep = std::fs::metadata(&real)
        .ok()
        .map(|m| m.permissions().mode() & 0o777);
    let dir = real
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let made = crate::cleanup::create_registered(
        || {
            tempfile::Builder::new()
                .prefix(".cairn-out-")
                .permissions(std::fs::Permissions::from_mode(new_mode))
                .tempfile_in(dir)
        },
        |t| t.path(),
    );
    let (_interrupt, tmp) = match made {
        Ok(t) => t,
        // No temporary file here (a directory we may not write, or a virtual file system
        // such as /proc): in place, like `>`, so the error, if any, names the file itself.
        // The file itself is writable (checked above): fill an anonymous temporary file
        // elsewhere ($TMPDIR), then copy it in only once `fill` succeeded, so a failure
        // leaves the file as it was.
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::PermissionDenied
                    | io::ErrorKind::NotFound
                    | io::ErrorKind::ReadOnlyFilesystem
            ) && keep.is_some() =>
        {
            let (mut spool, n) = spooled(fill)?;
            copy_over(&mut spool, &real, dest)?;
            return Ok(n);
        }
        // Said of the directory, not of the hidden temporary file the error names.
        // (An I/O error, exit 10, as before: not a missing key or version.)
        Err(e) if e.kind() == io::ErrorKind::NotFound && !dir.is_dir() => {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("directory {} does not exist", dir.display()),
            ))
            .with_context(|| format!("cannot write {}", dest.display()));
        }
        Err(e) => return Err(e).with_context(|| format!("creating {}", dest.display())),
    };
    if let Some(mode) = keep {
        // Keep the mode of the file being replaced (a private file stays private).
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(mode))
            .with_context(|| format!("creating {}", dest.display()))?;
    }
    let n = {
        let mut w = BufWriter::with_capacity(1 << 20, tmp.as_file());
        let n = fill(&mut w)?;
        w.flush()
            .with_context(|| format!("writing {}", dest.display()))?;
        n
    };
    // On the disk before it takes the name: renamed unsynced, a crash soon after could
    // leave `dest` empty or cut short, its old content gone.
    tmp.as_file()
        .sync_data()
        .with_context(|| format!("writing {}", dest.display()))?;
    match tmp.persist(&real) {
        // And the rename itself (best effort: some file systems refuse to sync a directory).
        Ok(_) => {
            let _ = File::open(dir).and_then(|d| d.sync_all());
        }
        Err(e) => {
            // The file cannot be replaced (sticky directory, bind mount, ...): the content
            // is complete and checked, so copy it in place.
            let mut from = e.file.reopen().context("reading the temporary file")?;
            copy_over(&mut from, &real, dest)?;
        }
    }
    Ok(n)
}

/// Runs `fill` into an anonymous temporary file in `$TMPDIR`, rewound for reading back;
/// returns it and what `fill` returned.
fn spooled(fill: &mut dyn FnMut(&mut dyn Write) -> Result<u64>) -> Result<(File, u64)> {
    use std::io::Seek;
    let mut spool = tempfile::tempfile().context("creating a temporary file")?;
    let n = {
        let mut w = BufWriter::with_capacity(1 << 20, &mut spool);
        let n = fill(&mut w)?;
        w.flush().context("writing the temporary file")?;
        n
    };
    spool
        .seek(io::SeekFrom::Start(0))
        .context("rewinding the temporary file")?;
    Ok((spool, n))
}

/// Writes a value in its command-line text form (blobs streamed with a progress bar).
pub fn write_value(db: &Db, v: &Value, sink: &mut dyn Write) -> Result<()> {
    if format::write_inline(v, sink)? {
        return Ok(());
    }
    let Value::Tree(t) = v else {
        return Ok(());
    };
    match v.value_type() {
        ValueType::Blob => {
            let pb = progress_bar(Some(t.count), "get");
            let mut out = pb.wrap_write(&mut *sink);
            let workers = postree::copy_blob_workers();
            postree::copy_blob(db.chunks(), t, 0, t.count, workers, &mut out)?;
            pb.finish_and_clear();
        }
        ty => {
            for el in postree::iter(db.chunks(), t) {
                format::write_element(ty, &el?, sink)?;
            }
        }
    }
    Ok(())
}

fn update(bucket: &Bucket, a: UpdateArgs, out: &mut impl Write) -> Result<()> {
    use cairn_object::Op;
    let head = bucket
        .db()
        .get(a.key.as_bytes(), &At::Branch(a.branch.clone()))?;
    let ty = head.object.value_type();
    check_update_elements(&a, ty)?;
    let text = a.text.clone().unwrap_or_default().into_bytes();
    let op = if let Some(x) = a.append {
        Op::Append(x.into_bytes())
    } else if let Some(pos) = a.insert_at {
        Op::Insert(pos, text)
    } else if let Some(x) = a.add {
        Op::Add(x)
    } else if let Some(x) = a.multiply {
        Op::Multiply(x)
    } else if let Some(at) = a.splice_at {
        match ty {
            ValueType::List => Op::ListSplice {
                index: at,
                delete: a.delete.unwrap_or(0),
                insert: format::lines(&text),
            },
            _ => Op::BlobSplice {
                offset: at,
                delete: a.delete.unwrap_or(0),
                insert: text,
            },
        }
    } else if !a.set.is_empty() || !a.unset.is_empty() {
        match ty {
            ValueType::Set => Op::SetUpdate(
                a.set
                    .into_iter()
                    .map(|k| (k.into_bytes(), true))
                    .chain(a.unset.into_iter().map(|k| (k.into_bytes(), false)))
                    .collect(),
            ),
            _ => {
                let mut edits = Vec::new();
                for kv in a.set {
                    let (k, v) = kv.split_once('=').ok_or_else(|| {
                        Error::invalid(format!("--set {kv:?}: expected key=value"))
                    })?;
                    edits.push((k.as_bytes().to_vec(), Some(v.as_bytes().to_vec())));
                }
                edits.extend(a.unset.into_iter().map(|k| (k.into_bytes(), None)));
                Op::MapUpdate(edits)
            }
        }
    } else {
        bail!(Error::invalid(NOTHING_TO_DO));
    };
    let opts = PutOptions {
        guard: a.guard,
        ..PutOptions::default()
    };
    let uid = bucket.update(a.key.as_bytes(), Target::Branch(&a.branch), op, &opts)?;
    writeln!(out, "{uid}")?;
    Ok(())
}

/// What `update` says when it is given no operation.
pub const NOTHING_TO_DO: &str =
    "nothing to do: give --append, --insert-at, --add, --multiply, --splice-at, --set or --unset";

/// An update names one operation, and `--text` goes with `--insert-at` or `--splice-at`,
/// `--delete` with `--splice-at` (clap checks the rest): checked before anything is opened
/// or created.
pub fn check_update_args(a: &UpdateArgs) -> Result<()> {
    if a.append.is_none()
        && a.insert_at.is_none()
        && a.add.is_none()
        && a.multiply.is_none()
        && a.splice_at.is_none()
        && a.set.is_empty()
        && a.unset.is_empty()
    {
        bail!(Error::invalid(NOTHING_TO_DO));
    }
    if a.delete.is_some() && a.splice_at.is_none() {
        bail!(Error::invalid("--delete goes with --splice-at"));
    }
    if a.text.is_some() && a.insert_at.is_none() && a.splice_at.is_none() {
        bail!(Error::invalid(
            "--text goes with --insert-at or --splice-at"
        ));
    }
    Ok(())
}

/// Elements of a tuple, set or map are lines of `get`'s text (and of `put`'s): one holding
/// a newline would print as two and read back as another value, so `update` refuses it
/// (as `put` cannot make one). A string's text, a blob's bytes and a list splice's lines
/// are not elements here.
pub fn check_update_elements(a: &UpdateArgs, ty: ValueType) -> Result<()> {
    let element = |what: &str, x: &str| -> Result<()> {
        if x.contains('\n') || x.contains('\r') {
            bail!(Error::invalid(format!(
                "{what} {x:?} holds a line break: a {} element is one line of text (`get` \
                 prints one per line, and `put` reads them back that way)",
                ty.name()
            )));
        }
        Ok(())
    };
    match ty {
        ValueType::Tuple => {
            if let Some(x) = &a.append {
                element("--append", x)?;
            }
            if a.insert_at.is_some()
                && let Some(x) = &a.text
            {
                element("--text", x)?;
            }
        }
        ValueType::Set | ValueType::Map => {
            for x in a.set.iter().chain(&a.unset) {
                element(
                    if a.set.contains(x) {
                        "--set"
                    } else {
                        "--unset"
                    },
                    x,
                )?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Uids name untagged heads to merge: without `--untagged` they would be ignored.
pub fn check_merge_args(a: &MergeArgs) -> Result<()> {
    if !a.untagged && !a.uids.is_empty() {
        bail!(Error::invalid(
            "uids name untagged heads to merge: give --untagged, or --from to merge a branch"
        ));
    }
    Ok(())
}

fn merge(db: &Bucket, a: MergeArgs, out: &mut impl Write) -> Result<ExitCode> {
    check_merge_args(&a)?;
    let key = a.key.as_bytes();
    let opts = PutOptions::default();
    let outcome = if a.untagged {
        db.merge_untagged(key, &a.uids, &a.resolve, &opts)?
    } else {
        let into = a.into.unwrap_or_else(|| DEFAULT_BRANCH.to_string());
        let from = a
            .from
            .ok_or_else(|| Error::invalid("--from BRANCH_OR_UID is required with --into"))?;
        db.merge_into(key, &into, &At::parse(&from), &a.resolve, &opts)?
    };
    match outcome {
        MergeOutcome::Merged(u) => writeln!(out, "{u}")?,
        MergeOutcome::FastForward(u) => {
            eprintln!("fast-forward");
            writeln!(out, "{u}")?;
        }
        MergeOutcome::UpToDate(u) => {
            eprintln!("already up to date");
            writeln!(out, "{u}")?;
        }
        MergeOutcome::Conflicts(cs) => {
            for c in &cs {
                eprintln!("conflict: {c}");
            }
            bail!(Error::Conflict(conflict_summary(cs.len())));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The error line after `n` unresolved merge conflicts (local and client mode alike).
pub fn conflict_summary(n: usize) -> String {
    format!(
        "{n} unresolved conflict(s); nothing was written (try --resolve ours|theirs|append|sum|union)"
    )
}

/// Prints a diff (or one page of it) as `cairn diff` shows it.
pub(crate) fn print_diff(d: &Diff, out: &mut impl Write) -> Result<()> {
    match d {
        Diff::Same => writeln!(out, "identical")?,
        Diff::Primitive(a, b) => {
            writeln!(out, "- {}", show_value(a))?;
            writeln!(out, "+ {}", show_value(b))?;
        }
        Diff::Sorted(changes) => {
            for c in changes {
                let k = format::show(&c.key);
                match (&c.left, &c.right) {
                    (None, Some(v)) if v.is_empty() => writeln!(out, "+ {k}")?,
                    (Some(v), None) if v.is_empty() => writeln!(out, "- {k}")?,
                    (None, Some(v)) => writeln!(out, "+ {k}={}", format::show(v))?,
                    (Some(v), None) => writeln!(out, "- {k}={}", format::show(v))?,
                    (Some(a), Some(b)) => {
                        writeln!(out, "~ {k}: {} -> {}", format::show(a), format::show(b))?
                    }
                    (None, None) => {}
                }
            }
        }
        Diff::Seq(changes) => {
            for c in changes {
                writeln!(
                    out,
                    "@ {}..{} -> {}..{}",
                    c.a_start, c.a_end, c.b_start, c.b_end
                )?;
            }
        }
    }
    Ok(())
}

fn show_value(v: &Value) -> String {
    match v {
        Value::String(b) => format::show(b),
        Value::Integer(i) => i.to_string(),
        Value::Tuple(items) => items
            .iter()
            .map(|i| format::show(i))
            .collect::<Vec<_>>()
            .join(", "),
        Value::Tree(t) => format!("{} root {}", v.value_type(), t.root),
    }
}

use cairn_node::node::NODE_KEY_FILE;

/// `--context`: one line of text, the same in local and client mode (`cairn log` shows it
/// on the version's line, and a node receives it in an HTTP header).
/// `--lock-timeout`: seconds, 0 to 86400 (as `serve`'s `lock_timeout_secs`).
fn parse_lock_timeout(s: &str) -> std::result::Result<f64, String> {
    parse_seconds(s, "lock timeout")
}

fn parse_stall_timeout(s: &str) -> std::result::Result<f64, String> {
    parse_seconds(s, "stall timeout")
}

/// A number of seconds from 0 to a day.
fn parse_seconds(s: &str, what: &str) -> std::result::Result<f64, String> {
    let t: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(0.0..=86_400.0).contains(&t) {
        return Err(format!("the {what} must be between 0 and 86400 seconds"));
    }
    Ok(t)
}

fn parse_context(s: &str) -> std::result::Result<String, String> {
    if s.bytes().any(|b| b < 0x20 || b == 0x7f) {
        return Err("context is one line of text: no newlines or other control characters".into());
    }
    // Sent to a node as an HTTP header value, whose surrounding spaces HTTP drops: the
    // version would hold another context than the one given.
    if s.starts_with(' ') || s.ends_with(' ') {
        return Err("context may not start or end with a space".into());
    }
    Ok(s.to_string())
}

/// Seconds a command waits for a store another process has open, unless told otherwise.
pub const DEFAULT_LOCK_TIMEOUT_SECS: f64 = 30.0;

/// The data directory when neither `--data` nor `CAIRN_DATA` names one.
pub const DEFAULT_DATA_DIR: &str = "./cairn-data";

/// `cairn serve`: config file, then environment and flags on top.
fn serve(cli: &Cli, a: &ServeArgs) -> Result<ExitCode> {
    let mut config = match &a.config {
        Some(p) => cairn_node::Config::from_file(p)?,
        None => cairn_node::Config::default(),
    };
    if let Some(d) = &cli.data {
        config.data_dir = d.clone();
    }
    if let Some(d) = cli.durability {
        config.durability = d;
    }
    if let Some(l) = &a.listen {
        config.listen = l.clone();
    }
    if let Some(m) = a.max_upload_bytes {
        config.max_upload_bytes = m;
    }
    if let Some(f) = a.log_format {
        config.log_format = f;
    }
    if let Some(n) = a.leaf_size {
        config.leaf_size = n;
    }
    if let Some(t) = cli.lock_timeout {
        config.lock_timeout_secs = t;
    }
    cairn_node::init_logging(config.log_format);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let served = rt.block_on(cairn_node::serve(config));
    // Requests still running after the grace period (a client that stopped reading) must
    // not hold the process: their blocking tasks are left behind.
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    served?;
    Ok(ExitCode::SUCCESS)
}

fn writer_key_path(cli: &Cli) -> Result<PathBuf> {
    match &cli.key_file {
        Some(p) => Ok(p.clone()),
        None => cairn_node::keys::default_writer_key(),
    }
}

/// `cairn keygen`.
fn keygen(cli: &Cli, force: bool) -> Result<ExitCode> {
    let path = writer_key_path(cli)?;
    let key = cairn_node::keys::create(&path, "writer", force)?;
    // Not `println!`, which panics when stdout cannot take it (a full disk, a closed pipe).
    writeln!(io::stdout().lock(), "{}", key.public()).context("writing the public key")?;
    eprintln!(
        "writer key written to {} (mode 0600; back it up: only it can write the buckets it creates)",
        path.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// `cairn bucket`.
fn show_bucket(bucket: &Bucket, metadata_out: Option<&Path>, out: &mut impl Write) -> Result<()> {
    writeln!(out, "bucket: {}", bucket.name())?;
    let Some(meta) = bucket.metadata() else {
        writeln!(out, "capsule: none yet (created by the first write)")?;
        if metadata_out.is_some() {
            bail!(Error::not_found(format!(
                "a capsule for bucket {}: nothing was written to it yet",
                bucket.name()
            )));
        }
        return Ok(());
    };
    let capsule = meta.name();
    writeln!(out, "capsule: {capsule}")?;
    writeln!(out, "description: {}", meta.description)?;
    for (i, w) in meta.writers.iter().enumerate() {
        writeln!(out, "writer {i}: {w}")?;
    }
    let (records, heads, log) = bucket
        .server()
        .with_dag(&capsule, |d| (d.len(), d.heads(), d.log().size()))?;
    writeln!(out, "records: {records}")?;
    writeln!(out, "merkle log size: {log}")?;
    for h in heads {
        writeln!(out, "head: {h}")?;
    }
    if let Some(p) = metadata_out {
        write_whole_file(p, 0o666, &mut |w| {
            let b: &[u8] = &meta.encode();
            w.write_all(b)?;
            Ok(b.len() as u64)
        })?;
        eprintln!("metadata written to {}", p.display());
    }
    Ok(())
}

/// `cairn verify --proof KEY [--uid UID | --branch B] [--out FILE]`.
fn verify_version(
    bucket: &Bucket,
    key: &str,
    uid: Option<Uid>,
    branch: Option<String>,
    file: Option<&Path>,
    out: &mut impl Write,
) -> Result<()> {
    // Nothing is printed until every check passed: a reader that closes the pipe early
    // (`| head -n1`) would otherwise end the command, as a success, before the last checks.
    let (stdout, out) = (out, &mut Vec::new());
    let db = bucket.db();
    let kb = key.as_bytes();
    let at = match uid {
        Some(u) => At::Uid(u),
        None => At::Branch(branch.unwrap_or_else(|| DEFAULT_BRANCH.to_string())),
    };
    // Read first: a branch head naming no version of the key is damage.
    let v = db.get(kb, &at)?;
    let (uid, o) = (v.uid, v.object);
    let vp = bucket.prove(kb, &uid)?;
    let meta = bucket
        .metadata()
        .ok_or_else(|| Error::not_found("the bucket's capsule"))?;
    writeln!(out, "bucket   {}  capsule {}", bucket.name(), meta.name())?;
    print_version_proof(&vp, meta, kb, &uid, out)?;
    // The version itself: its FObject hashes to the uid, its value tree re-hashes, and the
    // record names the bases the FObject has.
    let m = cairn_capsule::Mutation::decode(&vp.record.body)?;
    if o.bases != m.bases {
        bail!(Error::Rejected(format!(
            "version {uid} has bases the writer's record does not name"
        )));
    }
    let mut chunks = 1u64;
    if let Some(t) = o.value.tree() {
        postree::walk(db.chunks(), t, &mut |_, _| {
            chunks += 1;
            Ok(())
        })?;
    }
    writeln!(
        out,
        "content  the version hashes to its uid; {chunks} chunk(s) re-hashed"
    )?;
    if let Some(p) = file {
        write_whole_file(p, 0o666, &mut |w| {
            let b: &[u8] = &vp.to_bytes();
            w.write_all(b)?;
            Ok(b.len() as u64)
        })?;
        eprintln!(
            "proof written to {} (check it with `cairn verify-proof`)",
            p.display()
        );
    }
    writeln!(out, "proof OK")?;
    stdout.write_all(out)?;
    Ok(())
}

/// Checks `vp` as a reader trusting only `meta` (whose name the caller checked) and prints
/// the chain. Fails (exit 11) on anything wrong.
pub(crate) fn print_version_proof(
    vp: &VersionProof,
    meta: &CapsuleMetadata,
    key: &[u8],
    uid: &Uid,
    out: &mut impl Write,
) -> Result<()> {
    let (m, names) = vp.verify(meta, key, uid)?;
    print_verified_proof(vp, meta, key, uid, &m, &names, out)
}

/// Prints the chain of `vp`, which `VersionProof::verify` already checked and answered
/// with `m` and `names`.
pub(crate) fn print_verified_proof(
    vp: &VersionProof,
    meta: &CapsuleMetadata,
    key: &[u8],
    uid: &Uid,
    m: &cairn_capsule::Mutation,
    names: &[cairn_capsule::RecordName],
    out: &mut impl Write,
) -> Result<()> {
    let branch = match &m.branch {
        Some(b) => format!("branch {b:?}"),
        None => "an untagged head".into(),
    };
    writeln!(
        out,
        "version  {uid}  ({} of key {:?} on {branch}, {} base(s))",
        m.kind.name(),
        String::from_utf8_lossy(key),
        m.bases.len()
    )?;
    writeln!(out, "record   {}", names[0])?;
    for (i, n) in names.iter().enumerate().skip(1) {
        writeln!(out, "  <- {n}  (hop {i})")?;
    }
    if let cairn_capsule::Anchor::Signed(ws) = &vp.proof.anchor {
        let who = meta
            .writers
            .get(ws.writer as usize)
            .map(|k| k.to_string())
            .unwrap_or_default();
        writeln!(
            out,
            "signed   by writer {} {who} over {}: valid",
            ws.writer,
            names[names.len() - 1]
        )?;
    }
    // A seal that does not verify fails the whole proof (exit 11).
    if let Some((owner, seal)) = vp.owner_seal(meta, m, uid)? {
        writeln!(
            out,
            "sealed   by owner {owner} at {} (unix seconds, the owner's clock){}: valid",
            seal.date,
            if seal.names_base {
                ", on the base it names"
            } else {
                ""
            }
        )?;
    }
    Ok(())
}

/// Whether the owner sealed the put proof `vp` proves (checked; a seal that does not
/// verify is no seal).
fn owner_sealed(vp: &VersionProof, meta: &CapsuleMetadata) -> bool {
    cairn_capsule::Mutation::decode(&vp.record.body)
        .is_ok_and(|m| matches!(vp.owner_seal(meta, &m, &m.uid), Ok(Some(_))))
}

/// The bucket owner a capsule's metadata names (`cairn.native.owner`: a key, or `open`),
/// when the key that signed proof `vp` is not it and the owner did not seal the put: the
/// records of a bucket written through a node's API are signed by the node's key, so such
/// a proof shows that the node recorded the version, not that the owner wrote it (a node
/// that lies can record a version it made up). `None` when no owner is named (the writer
/// is then the bucket's), the owner signed, or the owner sealed the put.
pub(crate) fn signer_caveat(vp: &VersionProof, meta: &CapsuleMetadata) -> Option<String> {
    let owner = meta.settings.get(cairn_capsule::OWNER_SETTING)?;
    let cairn_capsule::Anchor::Signed(ws) = &vp.proof.anchor else {
        return None;
    };
    let signer = meta.writers.get(ws.writer as usize)?.to_string();
    if *owner == signer || owner_sealed(vp, meta) {
        return None;
    }
    let whose = if owner == "open" {
        "an open bucket's (anyone may write through the node)".to_string()
    } else {
        format!("the bucket's owner {owner}")
    };
    Some(format!(
        "the record is signed by writer key {signer} (the node's), not by {whose}: the proof \
         shows that the node recorded this version, not that the owner wrote it, and a node \
         that lies can record a version it made up"
    ))
}

/// Writes the verdict on a proof checked against a pinned capsule to `out`: `proof OK`,
/// qualified when the node's key signed it rather than the bucket's owner (and the note
/// [`signer_caveat`] gives on stderr).
pub(crate) fn write_proof_ok(
    vp: &VersionProof,
    meta: &CapsuleMetadata,
    out: &mut impl Write,
) -> io::Result<()> {
    if owner_sealed(vp, meta) {
        return writeln!(
            out,
            "proof OK (content sealed by the owner's key, recorded by the node's)"
        );
    }
    match signer_caveat(vp, meta) {
        Some(c) => {
            eprintln!("note: {c}");
            writeln!(
                out,
                "proof OK (recorded by the node's key, not the owner's)"
            )
        }
        None => writeln!(out, "proof OK"),
    }
}

/// Most bytes `verify-proof` reads of a file: far above any proof or metadata Cairn
/// writes (a proof names one record and its chain; metadata a few keys and settings).
const PROOF_FILE_LIMIT: u64 = 64 << 20;

/// The file at `path`, refused past [`PROOF_FILE_LIMIT`] (`/dev/zero` read until memory
/// ran out).
fn read_bounded(path: &Path, what: &str) -> Result<Vec<u8>> {
    let f = File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut buf = Vec::new();
    f.take(PROOF_FILE_LIMIT + 1)
        .read_to_end(&mut buf)
        .with_context(|| format!("reading {}", path.display()))?;
    if buf.len() as u64 > PROOF_FILE_LIMIT {
        bail!(Error::invalid(format!(
            "{} is larger than {} MiB: not {what}",
            path.display(),
            PROOF_FILE_LIMIT >> 20
        )));
    }
    Ok(buf)
}

/// `cairn verify-proof`: no store, only the proof, the metadata and the trusted name.
fn verify_proof_file(
    file: &Path,
    capsule: &CapsuleName,
    metadata: &Path,
    key: &str,
    uid: &Uid,
) -> Result<ExitCode> {
    let mbytes = read_bounded(metadata, "capsule metadata")?;
    let meta = CapsuleMetadata::decode(&mbytes)
        .with_context(|| format!("{} is not capsule metadata", metadata.display()))?;
    if meta.name() != *capsule {
        bail!(Error::Rejected(format!(
            "metadata {} hashes to capsule {}, not {capsule}",
            metadata.display(),
            meta.name()
        )));
    }
    let bytes = read_bounded(file, "a version proof")?;
    let vp = VersionProof::from_bytes(&bytes).with_context(|| {
        format!(
            "{} is not a version proof (`cairn verify --proof KEY --out FILE` writes one)",
            file.display()
        )
    })?;
    // Printed once every check passed (see `verify_version`).
    let mut out = Vec::new();
    writeln!(out, "capsule  {capsule}")?;
    print_version_proof(&vp, &meta, key.as_bytes(), uid, &mut out)?;
    write_proof_ok(&vp, &meta, &mut out)?;
    io::stdout().lock().write_all(&out)?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(all(test, unix))]
mod tests {
    use super::link_is_protected;

    /// The rule `--out` applies to links as it follows them, whoever runs the tests (the
    /// end-to-end test needs root to give a link away).
    #[test]
    fn links_in_shared_sticky_directories_follow_the_kernels_rule() {
        // A directory like /tmp: root's, sticky, anyone may write.
        assert!(
            link_is_protected(0o41777, 0, 1000, 1001),
            "another user's link"
        );
        assert!(!link_is_protected(0o41777, 0, 1001, 1001), "our own link");
        assert!(
            !link_is_protected(0o41777, 0, 0, 1001),
            "the directory owner's link"
        );
        assert!(!link_is_protected(0o40777, 0, 1000, 1001), "not sticky");
        assert!(
            !link_is_protected(0o41775, 0, 1000, 1001),
            "not writable by anyone"
        );
        assert!(
            link_is_protected(0o41777, 500, 1000, 0),
            "root is no exception"
        );
    }
}

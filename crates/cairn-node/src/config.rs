//! Node configuration: a TOML file (every field optional), overridden by the `cairn serve`
//! flags and their environment variables (`CAIRN_DATA`, `CAIRN_LISTEN`, ...).
//!
//! ```toml
//! data_dir = "./cairn-data"
//! listen = "127.0.0.1:3000"
//! durability = "group"            # fsync | group | buffered
//! max_upload_bytes = 5368709120   # 5 GiB
//! write_queue = 256               # writers waiting on one path before 503 + Retry-After
//! leaf_size = 65536               # average POS-tree leaf of new buckets (bytes)
//! page_cache_window_mib = 256     # sealed log data kept in the page cache (0: all)
//! stall_timeout_secs = 60         # a transfer that moves no byte this long is cut
//! min_rate_bytes_per_sec = 500    # ... and one slower than this, counted over that window
//! max_open_buckets = 4096         # buckets (and capsules) kept open; idle ones past it close
//! log_format = "text"             # text | json
//! allowed_hosts = []               # Host names served besides loopback ones (["*"]: any)
//! open_buckets = "local"          # who may create buckets without an owner key: local | anyone | off
//!
//! [gaia]
//! # see crate::gaia::GaiaConfig
//!
//! [backend]                        # where chunks live; refs stay in data_dir
//! kind = "embedded"                # embedded | s3 | azure | gcs | local
//! # bucket = "my-bucket"           # s3, gcs: bucket; azure: container
//! # prefix = "cairn"               # key prefix inside the bucket or directory
//! # endpoint = "http://127.0.0.1:9000"  # S3-compatible servers, Azurite, fake GCS
//! # region = "us-east-1"           # s3
//! # allow_http = false             # plain-HTTP endpoints (test servers)
//! # path = "/srv/cairn-chunks"     # local
//! ```
//!
//! Cloud credentials are never in the file: they come from the environment
//! (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AZURE_STORAGE_ACCOUNT_NAME`,
//! `GOOGLE_SERVICE_ACCOUNT`, ...). Every kind but `embedded` needs a build with the
//! `object-store` feature (see `docs/node.md`, "Backends").

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use cairn_store::Durability;
use serde::Deserialize;

/// Default [`Config::leaf_size`]: 64 KiB.
pub const DEFAULT_LEAF_SIZE: u64 = 64 << 10;

/// Everything a node needs to start.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Data directory of the embedded store.
    pub data_dir: PathBuf,
    /// Address to listen on (`host:port`; port 0 picks one).
    pub listen: String,
    /// Durability of acknowledged writes.
    #[serde(with = "durability_name")]
    pub durability: Durability,
    /// Largest upload accepted, in bytes.
    pub max_upload_bytes: u64,
    /// Writers that may wait on one path before further ones get 503 with Retry-After.
    pub write_queue: usize,
    /// Average POS-tree leaf size, in bytes, of the buckets this node creates (Gaia
    /// buckets and native ones that do not choose): 64 KiB by default, because a node
    /// mostly holds whole files (media, documents, datasets), where larger leaves hash
    /// several times faster and need a sixteenth of the index entries of the object
    /// engine's 4 KiB default, at the cost of coarser dedup between versions. A bucket
    /// keeps the size it was created with (see `docs/node.md`).
    pub leaf_size: u64,
    /// MiB of the most recently written log kept in the page cache besides the active
    /// segment; older parts of sealed segments are dropped from it, so that writes reuse
    /// memory (0: leave it all to the kernel). See
    /// `cairn_store::LogStoreOptions::page_cache_window`.
    pub page_cache_window_mib: u64,
    /// Log format on stderr: `text` or `json`.
    pub log_format: LogFormat,
    /// Seconds to wait for a store another process has open.
    pub lock_timeout_secs: f64,
    /// Seconds a connection may take to send a request's headers, and may stay idle between
    /// requests, before it is closed.
    pub header_timeout_secs: f64,
    /// Seconds an upload body or a streamed response may go without moving a byte before
    /// it is cut (the upload stores nothing; the download ends short of its length).
    pub stall_timeout_secs: f64,
    /// Least average rate, in bytes per second, at which an upload body must arrive and a
    /// streamed download must be read, counting only the time the node waits for the
    /// client, checked over each `stall_timeout_secs` of waiting (0: no floor).
    pub min_rate_bytes_per_sec: u64,
    /// Connections served at once; further ones wait in the listen backlog.
    pub max_connections: usize,
    /// Streamed uploads and downloads in progress at once; further ones get 503 with
    /// `Retry-After` (each streamed download holds up to about 9 MiB of buffers).
    pub max_transfers: usize,
    /// Connections one peer address (a global IPv6 address by its /64) may hold at once;
    /// further ones from it are closed on accept, so one host cannot take every
    /// connection. 0: no limit (behind a proxy on another host, whose one address speaks
    /// for every client).
    pub max_connections_per_ip: usize,
    /// Streamed transfers one peer address may hold at once; further ones from it get 503
    /// with `Retry-After`, so one host's slow uploads or downloads cannot take every
    /// transfer. 0: no limit.
    pub max_transfers_per_ip: usize,
    /// Whether the two per-address limits apply to loopback peers too. Off by default: a
    /// reverse proxy or a benchmark on the same machine speaks for many clients from one
    /// loopback address (behind such a proxy, set its own per-client limits).
    pub limit_loopback: bool,
    /// Buckets kept open, and their capsules loaded, at once: past it the least recently
    /// used idle ones are closed and reopened from the store on their next request.
    pub max_open_buckets: usize,
    /// Seconds a shutdown waits for in-flight requests before it closes them.
    pub shutdown_grace_secs: f64,
    /// Host names (as in the `Host` header, without the port) a request may name besides
    /// `localhost`, `*.localhost`, IP addresses and the Gaia hub's own names. Checked when
    /// the node listens on a loopback address, or whenever the list is not empty: a web
    /// page whose domain is made to resolve to 127.0.0.1 (DNS rebinding) would otherwise
    /// reach a local node's open buckets as its own origin. Web pages of these hosts may
    /// also write through the native API (see `docs/node.md`). `["*"]` turns both checks
    /// off (a reverse proxy that passes every name through).
    pub allowed_hosts: Vec<String>,
    /// Who may create an open bucket (one without an owner key, which anyone who can reach
    /// the node may then write) through the native API.
    pub open_buckets: OpenBuckets,
    /// Gaia hub settings.
    pub gaia: crate::gaia::GaiaConfig,
    /// Where chunks are stored.
    pub backend: BackendConfig,
}

/// Where a node keeps its chunks. Refs (branch tables) always stay in the embedded log in
/// `data_dir`, whose commit is the durability point.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct BackendConfig {
    /// The kind of chunk store.
    pub kind: BackendKind,
    /// Bucket (s3, gcs) or container (azure).
    pub bucket: Option<String>,
    /// Key prefix inside the bucket or directory.
    pub prefix: String,
    /// Service endpoint URL (S3-compatible servers, emulators).
    pub endpoint: Option<String>,
    /// Region (s3).
    pub region: Option<String>,
    /// Directory of the `local` kind.
    pub path: Option<PathBuf>,
    /// Allow plain-HTTP endpoints.
    pub allow_http: bool,
}

/// The chunk store kinds a config may name.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// Chunks in the embedded log in `data_dir`, beside the refs (the default).
    #[default]
    Embedded,
    /// Amazon S3 or an S3-compatible server.
    S3,
    /// Azure Blob Storage.
    Azure,
    /// Google Cloud Storage.
    Gcs,
    /// A directory, one file per chunk.
    Local,
}

impl BackendKind {
    /// The name used in the config.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Embedded => "embedded",
            BackendKind::S3 => "s3",
            BackendKind::Azure => "azure",
            BackendKind::Gcs => "gcs",
            BackendKind::Local => "local",
        }
    }
}

impl BackendConfig {
    /// The object store this config names; `None` for the embedded kind.
    #[cfg(feature = "object-store")]
    pub fn object_store(&self) -> Option<cairn_store::object::ObjectStoreConfig> {
        use cairn_store::object::{ObjectStoreConfig, ObjectStoreKind};
        let kind = match self.kind {
            BackendKind::Embedded => return None,
            BackendKind::S3 => ObjectStoreKind::S3,
            BackendKind::Azure => ObjectStoreKind::Azure,
            BackendKind::Gcs => ObjectStoreKind::Gcs,
            BackendKind::Local => ObjectStoreKind::Local,
        };
        Some(ObjectStoreConfig {
            kind,
            bucket: self.bucket.clone(),
            prefix: self.prefix.clone(),
            endpoint: self.endpoint.clone(),
            region: self.region.clone(),
            allow_http: self.allow_http,
            path: self.path.clone(),
        })
    }

    /// Checks the backend settings; a kind other than `embedded` in a build without the
    /// `object-store` feature is an error saying how to build with it.
    pub fn check(&self) -> Result<()> {
        if self.kind == BackendKind::Embedded {
            let extra = [
                ("bucket", self.bucket.is_some()),
                ("prefix", !self.prefix.is_empty()),
                ("endpoint", self.endpoint.is_some()),
                ("region", self.region.is_some()),
                ("path", self.path.is_some()),
            ];
            if let Some((name, _)) = extra.iter().find(|(_, set)| *set) {
                bail!("[backend] {name} does not apply to kind = \"embedded\"");
            }
            return Ok(());
        }
        self.check_object_store()
    }

    #[cfg(feature = "object-store")]
    fn check_object_store(&self) -> Result<()> {
        if let Some(os) = self.object_store() {
            os.check().context("[backend]")?;
        }
        Ok(())
    }

    #[cfg(not(feature = "object-store"))]
    fn check_object_store(&self) -> Result<()> {
        bail!(
            "[backend] kind = \"{}\" needs a build with the object-store feature \
             (cargo build --release -p cairn-cli --features object-store); \
             this binary keeps chunks only in the embedded store (kind = \"embedded\")",
            self.kind.name()
        )
    }
}

/// Who may create an open bucket through the native API ([`Config::open_buckets`]). An open
/// bucket has no owner key: anyone who can reach the node may write it, so one made by a
/// stranger on a public node is free storage for them and a name taken from its owner.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum OpenBuckets {
    /// Clients on this machine only (a loopback peer address). Behind a reverse proxy on
    /// this machine every client looks local: set `off` there.
    #[default]
    Local,
    /// Any client.
    Anyone,
    /// No one: every bucket created through the native API has an owner key.
    Off,
}

impl OpenBuckets {
    /// Whether a client at `peer` may create an open bucket (`None`: a request handed to
    /// the router in process, which is local).
    pub fn allows(self, peer: Option<std::net::IpAddr>) -> bool {
        match self {
            OpenBuckets::Anyone => true,
            OpenBuckets::Off => false,
            OpenBuckets::Local => peer.is_none_or(|ip| ip.to_canonical().is_loopback()),
        }
    }
}

/// How logs are printed.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => bail!("log format {other:?}: use text or json"),
        }
    }
}

/// Largest value of a count setting (`max_connections`, `max_transfers`, ...).
pub const MAX_COUNT_SETTING: usize = 1 << 24;

impl Default for Config {
    fn default() -> Self {
        Config {
            data_dir: PathBuf::from("./cairn-data"),
            listen: "127.0.0.1:3000".into(),
            durability: Durability::Group,
            max_upload_bytes: 5 << 30,
            write_queue: 256,
            leaf_size: DEFAULT_LEAF_SIZE,
            page_cache_window_mib: 256,
            log_format: LogFormat::Text,
            lock_timeout_secs: 30.0,
            header_timeout_secs: 30.0,
            stall_timeout_secs: 60.0,
            min_rate_bytes_per_sec: 500,
            max_connections: 4096,
            max_transfers: 256,
            max_connections_per_ip: 256,
            max_transfers_per_ip: 32,
            limit_loopback: false,
            max_open_buckets: 4096,
            shutdown_grace_secs: 30.0,
            allowed_hosts: Vec::new(),
            open_buckets: OpenBuckets::Local,
            gaia: Default::default(),
            backend: BackendConfig::default(),
        }
    }
}

impl Config {
    /// Reads a TOML config file; unknown keys are an error (a typo must not be ignored).
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config file {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("config file {}", path.display()))
    }

    /// Checks values that parse but cannot work.
    pub fn check(&self) -> Result<()> {
        if self.max_upload_bytes == 0 {
            bail!("max_upload_bytes must be at least 1");
        }
        if self.write_queue == 0 {
            bail!("write_queue must be at least 1");
        }
        cairn_object::TreeConfig::default()
            .with_leaf_target(self.leaf_size)
            .context("leaf_size")?;
        if self.min_rate_bytes_per_sec > 1 << 30 {
            bail!("min_rate_bytes_per_sec must be at most 1073741824 (0: no minimum)");
        }
        if self.page_cache_window_mib > 1 << 30 {
            bail!("page_cache_window_mib must be at most 1073741824 (0 keeps everything)");
        }
        if !(0.0..=86_400.0).contains(&self.lock_timeout_secs) {
            bail!("lock_timeout_secs must be between 0 and 86400");
        }
        for (name, v) in [
            ("header_timeout_secs", self.header_timeout_secs),
            ("stall_timeout_secs", self.stall_timeout_secs),
            ("shutdown_grace_secs", self.shutdown_grace_secs),
        ] {
            if !(v > 0.0 && v <= 86_400.0) {
                bail!("{name} must be above 0 and at most 86400");
            }
        }
        for h in &self.allowed_hosts {
            let h = h.trim();
            if h != "*" && (h.is_empty() || !h.is_ascii() || h.contains(['/', ':', '@', ' ', '*']))
            {
                bail!(
                    "allowed_hosts entry {h:?}: give a host name such as cairn.example.com, \
                     without scheme or port, in ASCII (xn-- for international names; or \
                     \"*\" for any)"
                );
            }
        }
        if self.max_connections == 0 || self.max_transfers == 0 || self.max_open_buckets == 0 {
            bail!("max_connections, max_transfers and max_open_buckets must be at least 1");
        }
        // Each is a count of things held at once (a semaphore's permits, queue places):
        // far past any machine, and past what a semaphore takes, is a typo.
        for (name, v) in [
            ("max_connections", self.max_connections),
            ("max_transfers", self.max_transfers),
            ("max_open_buckets", self.max_open_buckets),
            ("write_queue", self.write_queue),
            ("max_connections_per_ip", self.max_connections_per_ip),
            ("max_transfers_per_ip", self.max_transfers_per_ip),
        ] {
            if v > MAX_COUNT_SETTING {
                bail!("{name} = {v} is more than {MAX_COUNT_SETTING}, the most it may be");
            }
        }
        self.backend.check()
    }

    /// [`Config::page_cache_window_mib`] in bytes, as the store takes it.
    pub fn page_cache_window(&self) -> Option<u64> {
        (self.page_cache_window_mib > 0).then_some(self.page_cache_window_mib << 20)
    }
}

mod durability_name {
    use cairn_store::Durability;
    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Durability, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_values_parse_and_typos_are_refused() {
        let c: Config = toml::from_str(
            "listen = \"0.0.0.0:9\"\ndurability = \"fsync\"\nmax_upload_bytes = 10\n",
        )
        .unwrap();
        assert_eq!(c.listen, "0.0.0.0:9");
        assert_eq!(c.durability, Durability::PerWrite);
        assert_eq!(c.max_upload_bytes, 10);
        assert_eq!(c.write_queue, Config::default().write_queue);
        assert!(toml::from_str::<Config>("lissen = \"x\"").is_err());
        assert!(toml::from_str::<Config>("durability = \"sometimes\"").is_err());
        let bad = Config {
            write_queue: 0,
            ..Config::default()
        };
        assert!(bad.check().is_err());
        let c: Config = toml::from_str("leaf_size = 16384").unwrap();
        assert_eq!(c.leaf_size, 16384);
        c.check().unwrap();
        assert_eq!(Config::default().leaf_size, 65536);
        let c: Config = toml::from_str("allowed_hosts = [\"cairn.example.com\", \"*\"]").unwrap();
        c.check().unwrap();
        for h in [
            "https://cairn.example.com",
            "cairn.example.com:443",
            "",
            "*.example",
            "bücher.example",
        ] {
            let bad = Config {
                allowed_hosts: vec![h.into()],
                ..Config::default()
            };
            let e = format!("{:#}", bad.check().unwrap_err());
            assert!(e.contains("allowed_hosts"), "{e}");
        }
        for n in [0, 63, 4097, 4 << 20] {
            let bad = Config {
                leaf_size: n,
                ..Config::default()
            };
            let e = format!("{:#}", bad.check().unwrap_err());
            assert!(e.contains("leaf_size") && e.contains("leaf size"), "{e}");
        }
        // A count past any machine (TOML takes up to 2^63 - 1) is refused, not a panic
        // when the node builds its semaphores.
        let c: Config = toml::from_str("max_transfers = 9223372036854775807").unwrap();
        let e = format!("{:#}", c.check().unwrap_err());
        assert!(e.contains("max_transfers"), "{e}");
        let c: Config = toml::from_str("max_connections = 16777216").unwrap();
        c.check().unwrap();
    }

    #[test]
    fn open_buckets_are_local_by_default() {
        let ip = |s: &str| Some(s.parse::<std::net::IpAddr>().unwrap());
        let c: Config = toml::from_str("").unwrap();
        assert_eq!(c.open_buckets, OpenBuckets::Local);
        for local in [None, ip("127.0.0.1"), ip("::1"), ip("::ffff:127.0.0.1")] {
            assert!(c.open_buckets.allows(local), "{local:?}");
        }
        for remote in [
            ip("203.0.113.7"),
            ip("2001:db8::1"),
            ip("::ffff:203.0.113.7"),
        ] {
            assert!(!c.open_buckets.allows(remote), "{remote:?}");
            assert!(OpenBuckets::Anyone.allows(remote));
        }
        let c: Config = toml::from_str("open_buckets = \"off\"").unwrap();
        assert!(!c.open_buckets.allows(None) && !c.open_buckets.allows(ip("127.0.0.1")));
        let c: Config = toml::from_str("open_buckets = \"anyone\"").unwrap();
        assert_eq!(c.open_buckets, OpenBuckets::Anyone);
        assert!(toml::from_str::<Config>("open_buckets = \"yes\"").is_err());
    }

    #[test]
    fn backend_table_parses_and_defaults_to_embedded() {
        let c: Config = toml::from_str("").unwrap();
        assert_eq!(c.backend.kind, BackendKind::Embedded);
        c.check().unwrap();
        let c: Config = toml::from_str(
            "[backend]\nkind = \"s3\"\nbucket = \"b\"\nprefix = \"p\"\n\
             endpoint = \"http://127.0.0.1:9000\"\nregion = \"us-east-1\"\nallow_http = true\n",
        )
        .unwrap();
        assert_eq!(c.backend.kind, BackendKind::S3);
        assert_eq!(c.backend.bucket.as_deref(), Some("b"));
        assert!(c.backend.allow_http);
        assert!(toml::from_str::<Config>("[backend]\nkind = \"ftp\"").is_err());
        assert!(toml::from_str::<Config>("[backend]\nbuckit = \"b\"").is_err());
        let stray: Config = toml::from_str("[backend]\nbucket = \"b\"").unwrap();
        let e = stray.check().unwrap_err().to_string();
        assert!(e.contains("bucket") && e.contains("embedded"), "{e}");
        let result = c.check();
        #[cfg(feature = "object-store")]
        result.unwrap();
        #[cfg(not(feature = "object-store"))]
        {
            let e = result.unwrap_err().to_string();
            assert!(e.contains("--features object-store"), "{e}");
        }
        #[cfg(feature = "object-store")]
        {
            let no_bucket: Config = toml::from_str("[backend]\nkind = \"gcs\"").unwrap();
            let e = format!("{:#}", no_bucket.check().unwrap_err());
            assert!(e.contains("bucket"), "{e}");
        }
    }
}

//! Starts a real S3-compatible server for tests: a process speaking S3 over HTTP on a
//! loopback port, with its data in a temporary directory, killed when the guard drops.
//!
//! The server binary comes from the environment (`.ci/run` builds one from the Go module
//! proxy and always sets it):
//!
//! - `CAIRN_MINIO_BIN`: a MinIO server (`go install github.com/minio/minio@...`);
//! - `CAIRN_GOFAKES3_BIN`: gofakes3's server (`go install
//!   github.com/johannesboyne/gofakes3/cmd/gofakes3@...`), much quicker to build.
//!
//! With neither set, [`S3Server::start`] prints why the test is skipped and returns `None`.
//!
//! Shared by `cairn-store/tests/s3.rs` and `cairn-node/tests/s3_backend.rs` (through
//! `#[path]`).

use std::io::Write;
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cairn_store::object::{ObjectStoreConfig, ObjectStoreKind};

/// The bucket every test server starts with.
pub const BUCKET: &str = "cairn-test";
/// Credentials the server accepts (MinIO checks them; gofakes3 accepts any).
pub const ACCESS_KEY: &str = "cairntestkey";
/// See [`ACCESS_KEY`].
pub const SECRET_KEY: &str = "cairntestsecret123";

/// A running S3 server; killed on drop.
pub struct S3Server {
    child: Child,
    /// Base URL, `http://127.0.0.1:<port>`.
    pub endpoint: String,
    /// Which server runs (for messages).
    pub name: &'static str,
    _dir: tempfile::TempDir,
}

impl S3Server {
    /// Starts the server named by the environment and waits until it accepts connections;
    /// `None` (after printing why) when no server binary is configured. Also exports the
    /// server's credentials as `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`, where
    /// `object_store`'s `from_env` builders read them: call this first thing in a test
    /// binary with a single test, before any other thread could read the environment.
    pub fn start() -> Option<S3Server> {
        let (name, bin) = if let Some(bin) = std::env::var_os("CAIRN_MINIO_BIN") {
            ("minio", PathBuf::from(bin))
        } else if let Some(bin) = std::env::var_os("CAIRN_GOFAKES3_BIN") {
            ("gofakes3", PathBuf::from(bin))
        } else {
            // Written to stderr directly, past the test harness's output capture, so a
            // skip shows in every run's log.
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: neither CAIRN_MINIO_BIN nor CAIRN_GOFAKES3_BIN names an S3 server \
                 binary, so the S3 backend test did not run (.ci/run builds one and sets it)"
            );
            return None;
        };
        assert!(
            bin.is_file(),
            "S3 server binary {} does not exist",
            bin.display()
        );
        // SAFETY: called before the test starts any thread of its own, in a test binary
        // holding a single test, so no other thread reads the environment concurrently.
        unsafe {
            std::env::set_var("AWS_ACCESS_KEY_ID", ACCESS_KEY);
            std::env::set_var("AWS_SECRET_ACCESS_KEY", SECRET_KEY);
            std::env::remove_var("AWS_SESSION_TOKEN");
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let address = format!("127.0.0.1:{port}");
        let mut cmd = Command::new(&bin);
        match name {
            "minio" => {
                // A directory at the top of a fresh data dir is served as a bucket.
                std::fs::create_dir_all(dir.path().join("data").join(BUCKET)).expect("bucket dir");
                cmd.arg("server")
                    .arg(dir.path().join("data"))
                    .args(["--address", &address])
                    .args(["--console-address", &format!("127.0.0.1:{}", free_port())])
                    .env("MINIO_ROOT_USER", ACCESS_KEY)
                    .env("MINIO_ROOT_PASSWORD", SECRET_KEY)
                    .env("MINIO_BROWSER", "off")
                    .env("MINIO_UPDATE", "off")
                    .env("HOME", dir.path());
            }
            _ => {
                // The in-memory backend: gofakes3's `fs` backend answers NoSuchBucket to a
                // listing under a prefix that has no objects yet.
                cmd.args(["-backend", "memory", "-initialbucket", BUCKET])
                    .args(["-host", &address]);
            }
        }
        let log = std::fs::File::create(dir.path().join("server.log")).expect("log file");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        let server = S3Server {
            child,
            endpoint: format!("http://{address}"),
            name,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(&address).is_err() {
            assert!(
                Instant::now() < deadline,
                "{name} did not listen on {address}: {}",
                server.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!("{name} listening at {}", server.endpoint);
        Some(server)
    }

    /// A backend config for this server's bucket under `prefix`.
    pub fn config(&self, prefix: &str) -> ObjectStoreConfig {
        let mut c = ObjectStoreConfig::new(ObjectStoreKind::S3);
        c.bucket = Some(BUCKET.into());
        c.prefix = prefix.into();
        c.endpoint = Some(self.endpoint.clone());
        c.region = Some("us-east-1".into());
        c.allow_http = true;
        c
    }

    /// The server's output so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("server.log")).unwrap_or_default()
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind a loopback port");
    l.local_addr().expect("local addr").port()
}

/// Retries `f` until it succeeds or `secs` pass (a server may listen before it serves).
pub fn until_ready<T, E: std::fmt::Display>(secs: u64, mut f: impl FnMut() -> Result<T, E>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        match f() {
            Ok(v) => return v,
            Err(e) if Instant::now() < deadline => {
                eprintln!("server not ready yet: {e}");
                std::thread::sleep(Duration::from_millis(250));
            }
            Err(e) => panic!("server never became ready: {e}"),
        }
    }
}

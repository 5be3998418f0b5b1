//! End-to-end tests of client mode (`cairn --server URL ...`): a real node in this process
//! on a loopback port, the `cairn` binary against it, outputs and exit codes compared with
//! local mode; client-side encryption (round trip, tampering, truncation, wrong key); and
//! a large encrypted upload and download with the client's peak RSS measured.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Instant;

use cairn_node::{Bound, Config, Node};

mod support;

/// A node serving a temporary data directory on 127.0.0.1 (port 0) until dropped.
struct Server {
    base: String,
    rt: Option<tokio::runtime::Runtime>,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start() -> Server {
        Server::start_limited(Config::default().max_upload_bytes)
    }

    /// A node refusing bodies over `max_upload_bytes`.
    fn start_limited(max_upload_bytes: u64) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let config = Config {
            data_dir: dir.path().join("node"),
            listen: "127.0.0.1:0".into(),
            durability: cairn_store::Durability::Buffered,
            max_upload_bytes,
            // Local mode's leaf size, so that the same value gets the same uid both ways.
            leaf_size: 4096,
            ..Config::default()
        };
        let node = Node::open(config).unwrap();
        let bound = rt.block_on(Bound::bind(node)).unwrap();
        let base = format!("http://{}", bound.addr);
        rt.spawn(bound.serve(std::future::pending()));
        Server {
            base,
            rt: Some(rt),
            _dir: dir,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// One user's machine: a data directory for local mode, a writer key, a data key.
struct User {
    dir: tempfile::TempDir,
}

impl User {
    fn new() -> User {
        User {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn command(&self, server: Option<&str>, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_cairn"));
        c.arg("--data")
            .arg(self.path().join("data"))
            .env("CAIRN_KEY_FILE", self.path().join("writer.key"))
            .env("XDG_CONFIG_HOME", self.path().join("config"))
            .env_remove("CAIRN_SERVER")
            .env_remove("CAIRN_DATA_KEY_FILE")
            .env_remove("CAIRN_BUCKET");
        if let Some(s) = server {
            c.arg("--server").arg(s);
        }
        c.args(args);
        c
    }

    fn run(&self, server: Option<&str>, args: &[&str]) -> Output {
        self.command(server, args).output().unwrap()
    }

    fn ok(&self, server: Option<&str>, args: &[&str]) -> String {
        let out = self.run(server, args);
        assert!(
            out.status.success(),
            "cairn {args:?} (server {server:?}) failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn fails(&self, server: Option<&str>, args: &[&str], code: i32) -> String {
        let out = self.run(server, args);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(code), "cairn {args:?}: {err}");
        let last = err.lines().last().unwrap_or_default();
        assert!(last.starts_with("error: "), "stderr: {err}");
        assert!(!err.contains("panicked"), "stderr: {err}");
        err
    }
}

/// Creates bucket `name`, open to every client (no owner key), on the node at `base`.
fn create_open_bucket(base: &str, name: &str) {
    let created = reqwest::blocking::Client::new()
        .post(format!("{base}/v1/buckets"))
        .header("content-type", "application/json")
        .body(format!(r#"{{"name":"{name}"}}"#))
        .send()
        .unwrap();
    assert_eq!(created.status().as_u16(), 201);
}

/// Runs `args` in local mode and against the node; both must give the same exit code and
/// stdout. Returns the stdout.
fn same(u: &User, server: &str, args: &[&str]) -> String {
    let local = u.run(None, args);
    let remote = u.run(Some(server), args);
    assert_eq!(
        local.status.code(),
        remote.status.code(),
        "cairn {args:?}: exit codes differ\nlocal: {}\nremote: {}",
        String::from_utf8_lossy(&local.stderr),
        String::from_utf8_lossy(&remote.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&local.stdout),
        String::from_utf8_lossy(&remote.stdout),
        "cairn {args:?}: outputs differ\nremote stderr: {}",
        String::from_utf8_lossy(&remote.stderr)
    );
    if !remote.status.success() {
        let err = String::from_utf8_lossy(&remote.stderr);
        assert!(
            err.lines()
                .last()
                .unwrap_or_default()
                .starts_with("error: "),
            "{err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
    String::from_utf8_lossy(&remote.stdout).into_owned()
}

#[test]
fn every_command_matches_local_mode() {
    let s = Server::start();
    let u = User::new();
    let srv = s.base.as_str();
    let run = |args: &[&str]| same(&u, srv, args);
    // Typed values.
    let uid = run(&["put", "s", "--value", "hello"]);
    assert_eq!(uid.trim().len(), 68, "{uid}");
    assert_eq!(run(&["get", "s"]), "hello");
    run(&["get", "s", "--uid", uid.trim()]);
    run(&["put", "n", "--type", "integer", "--value", "40"]);
    run(&["update", "n", "--add", "2"]);
    run(&["update", "n", "--multiply", "-3"]);
    assert_eq!(run(&["get", "n"]), "-126\n");
    run(&["put", "m", "--type", "map", "--value", "b=2\na=1\n"]);
    run(&["update", "m", "--set", "c=3", "--unset", "a"]);
    assert_eq!(run(&["get", "m"]), "b=2\nc=3\n");
    run(&["put", "l", "--type", "list", "--value", "x\ny\nz\n"]);
    run(&[
        "update",
        "l",
        "--splice-at",
        "1",
        "--delete",
        "1",
        "--text",
        "Y\nW",
    ]);
    assert_eq!(run(&["get", "l"]), "x\nY\nW\nz\n");
    run(&["put", "st", "--type", "set", "--value", "q\np\nq"]);
    run(&["update", "st", "--set", "r", "--unset", "p"]);
    assert_eq!(run(&["get", "st"]), "q\nr\n");
    run(&["put", "t", "--type", "tuple", "--value", "1\n2"]);
    run(&["update", "t", "--append", "3"]);
    run(&["put", "str", "--value", "hello world"]);
    run(&["update", "str", "--insert-at", "5", "--text", ","]);
    assert_eq!(run(&["get", "str"]), "hello, world");
    let file = u.path().join("blob.bin");
    std::fs::write(
        &file,
        (0..300_000u32).map(|i| (i % 253) as u8).collect::<Vec<_>>(),
    )
    .unwrap();
    let f = file.to_str().unwrap();
    run(&["put", "dir/b.bin", "--file", f, "--context", "first upload"]);
    run(&[
        "update",
        "dir/b.bin",
        "--splice-at",
        "10",
        "--delete",
        "5",
        "--text",
        "XY",
    ]);
    assert_eq!(run(&["keys"]), "dir/b.bin\nl\nm\nn\ns\nst\nstr\nt\n");
    for k in ["m", "n", "s", "dir/b.bin", "l"] {
        run(&["get", k, "--meta"]);
        run(&["log", k]);
    }
    run(&["get", "dir/b.bin", "--branch", "master"]);
    // Branches, merges, history.
    let v1 = run(&["put", "doc", "--type", "map", "--value", "a=1\nb=2\n"]);
    run(&["fork", "doc", "--from", "master", "--to", "dev"]);
    run(&["update", "doc", "--branch", "dev", "--set", "c=3"]);
    run(&["update", "doc", "--set", "a=9"]);
    run(&["branches", "doc"]);
    run(&["diff", "doc", "master", "dev"]);
    run(&["diff", "doc", "master", "master"]);
    run(&["diff", "s", "master", uid.trim()]);
    run(&["diff", "l", "master", "master"]);
    run(&["lca", "doc", "master", "dev"]);
    run(&["merge", "doc", "--into", "master", "--from", "dev"]);
    run(&["log", "doc", "--limit", "3"]);
    run(&["log", "doc", "--branch", v1.trim()]);
    run(&["rename", "doc", "dev", "feature"]);
    run(&["remove", "doc", "feature"]);
    run(&["branches", "doc"]);
    // Untagged heads and their merge.
    let base = run(&["put", "u", "--type", "map", "--value", "k=0\n"]);
    run(&[
        "put",
        "u",
        "--base",
        base.trim(),
        "--type",
        "map",
        "--value",
        "k=0\nx=1\n",
    ]);
    run(&[
        "put",
        "u",
        "--base",
        base.trim(),
        "--type",
        "map",
        "--value",
        "k=0\ny=2\n",
    ]);
    run(&["branches", "u", "--untagged"]);
    run(&["merge", "u", "--untagged"]);
    // Failures: same exit codes.
    run(&["get", "nope"]); // 3
    run(&["get", ""]); // 8, as for a put
    run(&["put", "ctx", "--value", "x", "--context", "two\nlines"]); // 8 both ways
    // A version that does not exist: not found both ways.
    let fake = format!("{}00", &uid.trim()[..66]);
    assert_ne!(fake, uid.trim());
    run(&["verify", "--proof", "s", "--uid", &fake]); // 3
    assert!(
        u.fails(None, &["verify", "--proof", "s", "--uid", &fake], 3)
            .contains("not found: version")
    );
    run(&["get", "s", "--branch", "nope"]); // 3
    run(&["put", "s", "--value", "x", "--guard", uid.trim()]); // 4
    run(&["put", "c", "--value", "base"]);
    run(&["fork", "c", "--from", "master", "--to", "other"]);
    run(&["put", "c", "--value", "ours"]);
    run(&["put", "c", "--branch", "other", "--value", "theirs"]);
    run(&["merge", "c", "--into", "master", "--from", "other"]); // 5
    // The conflicts and the hint read the same both ways.
    let conflict = ["merge", "c", "--into", "master", "--from", "other"];
    let (local, remote) = (u.run(None, &conflict), u.run(Some(srv), &conflict));
    assert_eq!(local.status.code(), Some(5));
    assert_eq!(
        String::from_utf8_lossy(&local.stderr),
        String::from_utf8_lossy(&remote.stderr)
    );
    run(&[
        "merge",
        "c",
        "--into",
        "master",
        "--from",
        "other",
        "--resolve",
        "ours",
    ]);
    run(&["update", "s", "--add", "1"]); // 7
    run(&["fork", "c", "--from", "master", "--to", "other"]); // 8
    run(&["update", "s"]); // 8, nothing to do
    run(&["log", "s", "--limit", "0"]);
    run(&["lca", "s", "master", "nope"]);
    assert_eq!(u.run(Some(srv), &["get", "nope"]).status.code(), Some(3));
    assert_eq!(
        u.run(
            Some(srv),
            &["merge", "c", "--into", "master", "--from", "other"]
        )
        .status
        .code(),
        Some(0)
    );
}

#[test]
fn proofs_buckets_and_owner_keys() {
    let s = Server::start();
    let u = User::new();
    let srv = Some(s.base.as_str());
    let uid = u.ok(srv, &["put", "k", "--value", "v1"]);
    u.ok(srv, &["put", "k", "--value", "v2"]);
    let info = u.ok(
        srv,
        &[
            "bucket",
            "--metadata-out",
            u.path().join("meta.bin").to_str().unwrap(),
        ],
    );
    let capsule = info
        .lines()
        .find_map(|l| l.strip_prefix("capsule: "))
        .unwrap()
        .to_string();
    let writer = cairn_node::keys::read(&u.path().join("writer.key"))
        .unwrap()
        .public()
        .to_string();
    assert!(info.contains(&format!("owner: {writer}")), "{info}");
    // The proof of the head, then of the first version pinned to the capsule name. Not
    // pinned, the verdict says it rests on the node's own metadata.
    let out = u.ok(srv, &["verify", "--proof", "k"]);
    assert!(
        out.contains(&format!("capsule {capsule}"))
            && out.ends_with(&format!(
                "proof OK against the node's metadata only (capsule {capsule} is the name of \
                 the metadata the node sent; pin the capsule you trust with --capsule)\n"
            )),
        "{out}"
    );
    // The content came as a verified stream and was re-hashed here.
    assert!(out.contains("1 chunk(s) received and re-hashed"), "{out}");
    let blob = u.path().join("blob");
    std::fs::write(&blob, pseudo_random(300_000, 5)).unwrap();
    let blob = blob.to_str().unwrap();
    u.ok(srv, &["--bucket", "blobs", "put", "b", "--file", blob]);
    let out = u.ok(srv, &["--bucket", "blobs", "verify", "--proof", "b"]);
    let n: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("content  the version hashes to its uid; "))
        .and_then(|l| l.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    assert!(n > 3, "the Meta chunk and a tree of several nodes: {out}");
    let proof = u.path().join("proof.bin");
    let out = u.ok(
        srv,
        &[
            "verify",
            "--proof",
            "k",
            "--uid",
            uid.trim(),
            "--capsule",
            &capsule,
            "--out",
            proof.to_str().unwrap(),
        ],
    );
    // The bucket was made through the node's API: the node's key signs its records, and
    // the owner's key seals what each put stores: the verdict says both.
    assert!(
        out.contains(&format!("sealed   by owner {writer} at "))
            && out.ends_with(
                "proof OK (content sealed by the owner's key, recorded by the node's)\n"
            ),
        "{out}"
    );
    // The files verify offline.
    let out = u.ok(
        None,
        &[
            "verify-proof",
            proof.to_str().unwrap(),
            "--capsule",
            &capsule,
            "--metadata",
            u.path().join("meta.bin").to_str().unwrap(),
            "--key",
            "k",
            "--uid",
            uid.trim(),
        ],
    );
    assert!(
        out.contains(&format!("sealed   by owner {writer} at "))
            && out.ends_with(
                "proof OK (content sealed by the owner's key, recorded by the node's)\n"
            ),
        "{out}"
    );
    // A merge is the node's work, not a put the owner sealed: its verdict says the node
    // recorded it.
    u.ok(srv, &["fork", "k", "--from", "master", "--to", "dev"]);
    u.ok(srv, &["put", "k", "--branch", "dev", "--value", "v3"]);
    u.ok(srv, &["put", "k", "--value", "v4"]);
    let merged = u.ok(
        srv,
        &[
            "merge",
            "k",
            "--into",
            "master",
            "--from",
            "dev",
            "--resolve",
            "ours",
        ],
    );
    let out = u.ok(
        srv,
        &[
            "verify",
            "--proof",
            "k",
            "--uid",
            merged.trim(),
            "--capsule",
            &capsule,
        ],
    );
    assert!(
        !out.contains("sealed")
            && out.ends_with("proof OK (recorded by the node's key, not the owner's)\n"),
        "{out}"
    );
    u.ok(srv, &["put", "k", "--value", "v2"]);
    // The same put twice (same base, value and context: the same version) is taken both
    // times, the version sealed by its owner either way.
    let twice = |args: &[&str]| {
        let mut all = vec!["--bucket", "twice"];
        all.extend_from_slice(args);
        u.ok(srv, &all)
    };
    let base = twice(&["put", "t", "--value", "a"]);
    let first = twice(&["put", "t", "--base", base.trim(), "--value", "b"]);
    let again = twice(&["put", "t", "--base", base.trim(), "--value", "b"]);
    assert_eq!(first, again);
    // A pinned name the node's metadata does not hash to: exit 11.
    let other = "c".to_string() + &capsule[1..].replace('a', "b");
    let wrong = if other == capsule {
        capsule.replace('0', "1")
    } else {
        other
    };
    if wrong.parse::<cairn_capsule::CapsuleName>().is_ok() {
        let err = u.fails(srv, &["verify", "--proof", "k", "--capsule", &wrong], 11);
        assert!(err.contains("pinned"), "{err}");
    }
    // Another writer key cannot write the bucket: refused before sending (exit 11), and
    // a forged request is refused by the node (exit 11 too).
    let stranger = User::new();
    let err = stranger.fails(srv, &["put", "k", "--value", "evil"], 11);
    assert!(err.contains("owned by"), "{err}");
    assert_eq!(u.ok(srv, &["get", "k"]), "v2");
    // Another bucket, and store-only commands are refused with exit 8.
    u.ok(
        srv,
        &["--bucket", "photos", "put", "a/b.jpg", "--value", "x"],
    );
    assert_eq!(u.ok(srv, &["--bucket", "photos", "keys"]), "a/b.jpg\n");
    assert_eq!(u.ok(srv, &["keys"]), "k\n");
    for cmd in [&["gc"][..], &["stats"], &["verify"]] {
        u.fails(srv, cmd, 8);
    }
    // An unreachable node: exit 9.
    u.fails(Some("http://127.0.0.1:9"), &["get", "k"], 9);
    // Encryption flags are client-mode only.
    u.fails(None, &["put", "x", "--value", "v", "--encrypt"], 8);
}

/// Ed25519 signatures are deterministic: the same put twice in one second would carry the
/// same signature, and the node refuses a signature it has seen (replays). The client signs
/// a fresh nonce into every request, so repeated identical writes all land.
#[test]
fn identical_signed_writes_in_one_second_all_land() {
    let s = Server::start();
    let u = User::new();
    let srv = Some(s.base.as_str());
    // Each put takes well under a second, so some of these share one.
    let f = u.path().join("same.bin");
    std::fs::write(&f, b"the same bytes each time").unwrap();
    let mut uids = Vec::new();
    for _ in 0..6 {
        uids.push(u.ok(srv, &["put", "k", "--file", f.to_str().unwrap()]));
    }
    uids.dedup();
    assert_eq!(uids.len(), 6, "{uids:?}");
    let log = u.ok(srv, &["log", "k"]);
    assert_eq!(
        log.lines().filter(|l| !l.trim().is_empty()).count(),
        6,
        "{log}"
    );
    // Buffered bodies (`--value`) too: the client no longer retries a replay refusal, so
    // these land only because each request has its own nonce.
    for _ in 0..4 {
        u.ok(srv, &["put", "v", "--value", "same"]);
    }
}

fn pseudo_random(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn encrypted_round_trip_tampering_and_truncation() {
    let s = Server::start();
    let u = User::new();
    let srv = Some(s.base.as_str());
    let p = |n: &str| -> PathBuf { u.path().join(n) };
    let plain = pseudo_random(3 * 1024 * 1024 + 12345, 7);
    std::fs::write(p("plain"), &plain).unwrap();
    u.ok(
        srv,
        &[
            "put",
            "secret",
            "--file",
            p("plain").to_str().unwrap(),
            "--encrypt",
        ],
    );
    assert!(p("config/cairn/data.key").exists());
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(p("config/cairn/data.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    // The node holds ciphertext only.
    u.ok(
        srv,
        &["get", "secret", "--out", p("cipher").to_str().unwrap()],
    );
    let cipher = std::fs::read(p("cipher")).unwrap();
    assert!(cipher.starts_with(b"CAIRNENC"));
    let segments = plain.len().div_ceil(65536);
    assert_eq!(cipher.len(), 39 + plain.len() + 16 * segments);
    assert!(!cipher.windows(64).any(|w| w == &plain[1000..1064]));
    // Round trip to a file and to stdout.
    u.ok(
        srv,
        &[
            "get",
            "secret",
            "--decrypt",
            "--out",
            p("back").to_str().unwrap(),
        ],
    );
    assert!(std::fs::read(p("back")).unwrap() == plain);
    let out = u.run(srv, &["get", "secret", "--decrypt"]);
    assert!(out.status.success());
    assert!(out.stdout == plain);
    // `--out /dev/stdout >> FILE` whose write fails part way (here past a file size
    // limit, set above the ciphertext spool's size): FILE is cut back, no plaintext left.
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        let log = p("log");
        std::fs::write(&log, vec![b'.'; 4 << 20]).unwrap();
        let f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
        let mut cmd = u.command(srv, &["get", "secret", "--decrypt", "--out", "/dev/stdout"]);
        cmd.stdout(f);
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                let lim = libc::rlimit {
                    rlim_cur: 5 << 20,
                    rlim_max: 5 << 20,
                };
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let out = cmd.output().unwrap();
        assert!(!out.status.success(), "{out:?}");
        assert_eq!(
            std::fs::metadata(&log).unwrap().len(),
            4 << 20,
            "plaintext left appended: {out:?}"
        );
    }
    // From stdin (chunked upload; the bucket is owned, so stdin is spooled and signed).
    let mut child = u
        .command(srv, &["put", "piped", "--encrypt"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&plain[..100_000])
        .unwrap();
    assert!(child.wait_with_output().unwrap().status.success());
    let piped = u.run(srv, &["get", "piped", "--decrypt"]);
    assert!(piped.status.success() && piped.stdout == plain[..100_000]);
    // Inline values too.
    u.ok(
        srv,
        &["put", "small", "--value", "tiny secret", "--encrypt"],
    );
    assert_eq!(u.ok(srv, &["get", "small", "--decrypt"]), "tiny secret");
    // Tampering: one flipped byte, stored back as a plain blob.
    for at in [20, 39 + 70_000, cipher.len() - 1] {
        let mut t = cipher.clone();
        t[at] ^= 0x01;
        std::fs::write(p("tampered"), &t).unwrap();
        u.ok(
            srv,
            &["put", "secret", "--file", p("tampered").to_str().unwrap()],
        );
        let dest = p("must-not-exist");
        let err = u.fails(
            srv,
            &[
                "get",
                "secret",
                "--decrypt",
                "--out",
                dest.to_str().unwrap(),
            ],
            11,
        );
        assert!(
            err.contains("authenticate") || err.contains("another data key"),
            "{err}"
        );
        assert!(!dest.exists());
        let out = u.run(srv, &["get", "secret", "--decrypt"]);
        assert_eq!(out.status.code(), Some(11));
        assert!(
            out.stdout.is_empty(),
            "decrypt wrote unverified bytes to stdout"
        );
    }
    // Truncation: at a segment boundary (no last flag) and mid-segment.
    for len in [
        39 + 65536 + 16,
        39 + 2 * (65536 + 16),
        cipher.len() - 100,
        30,
    ] {
        std::fs::write(p("cut"), &cipher[..len]).unwrap();
        u.ok(
            srv,
            &["put", "secret", "--file", p("cut").to_str().unwrap()],
        );
        let dest = p("must-not-exist");
        let err = u.fails(
            srv,
            &[
                "get",
                "secret",
                "--decrypt",
                "--out",
                dest.to_str().unwrap(),
            ],
            11,
        );
        assert!(err.contains("truncated"), "{err}");
        assert!(!dest.exists());
    }
    // The original ciphertext back: decrypts again. Another data key: refused.
    std::fs::write(p("orig"), &cipher).unwrap();
    u.ok(
        srv,
        &["put", "secret", "--file", p("orig").to_str().unwrap()],
    );
    u.ok(
        srv,
        &[
            "get",
            "secret",
            "--decrypt",
            "--out",
            p("back2").to_str().unwrap(),
        ],
    );
    assert!(std::fs::read(p("back2")).unwrap() == plain);
    let other = p("other.key");
    std::fs::write(&other, format!("cairn-data-key:{}\n", "ab".repeat(32))).unwrap();
    let err = u.fails(
        srv,
        &[
            "--data-key-file",
            other.to_str().unwrap(),
            "get",
            "secret",
            "--decrypt",
        ],
        11,
    );
    assert!(err.contains("another data key"), "{err}");
    // Decrypting a value that was never encrypted: bad input (exit 8), not damage.
    u.fails(srv, &["get", "small2", "--decrypt"], 3);
    u.ok(srv, &["put", "clear", "--value", "not encrypted"]);
    u.fails(srv, &["get", "clear", "--decrypt"], 8);
}

/// An unsigned upload of unknown length (stdin into an open bucket) goes out chunked, in
/// pieces (several full ones and a short last one), and reads back byte for byte; an empty
/// stdin stores an empty blob.
#[test]
fn chunked_upload_from_stdin_to_an_open_bucket() {
    let server = Server::start();
    let srv = Some(server.base.as_str());
    create_open_bucket(&server.base, "pub");
    let u = User::new();
    for (key, data) in [
        ("piped", pseudo_random((5 << 18) + 12_345, 7)),
        ("empty", Vec::new()),
    ] {
        let mut child = u
            .command(srv, &["--bucket", "pub", "put", key, "--type", "blob"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(&data).unwrap();
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "put {key}: {err}");
        // A write into a bucket anyone may change says so.
        assert!(
            err.contains("bucket pub") && err.contains("is open"),
            "{err}"
        );
        let back = u.run(srv, &["--bucket", "pub", "get", key]);
        assert!(back.status.success());
        assert!(back.stdout == data, "{key} reads back as written");
    }
}

/// A node that refuses an upload on its Content-Length (413) must not leave the client
/// waiting on its own upload thread, and the client must get the node's reason rather
/// than a reset connection: every try ends with exit code 8 and that reason.
#[test]
fn an_upload_the_node_refuses_ends_with_its_reason() {
    let s = Server::start_limited(1_000_000);
    let u = User::new();
    let big = u.path().join("big.bin");
    std::fs::write(&big, pseudo_random(24 << 20, 5)).unwrap();
    let srv = Some(s.base.as_str());
    u.ok(srv, &["put", "small", "--value", "fits"]);
    for _ in 0..3 {
        let mut child = u
            .command(srv, &["put", "k", "--file", big.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let status = wait_within(&mut child, 60)
            .unwrap_or_else(|| panic!("the refused upload did not end within 60 s"));
        let err = stderr_of(&mut child);
        // The node reads and drops what the client still sends, so the 413 reaches it.
        assert_eq!(status.code(), Some(8), "{err}");
        assert!(err.contains("larger than this node accepts"), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}

/// Waits up to `secs` seconds for `child` to exit; kills it (and returns `None`) past that.
fn wait_within(child: &mut std::process::Child, secs: u64) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return Some(st);
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// All `child` wrote to its piped stderr.
fn stderr_of(child: &mut std::process::Child) -> String {
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    err
}

/// A put from a named pipe reads it once: the check that the input is there must not open
/// it (opening and closing a FIFO took its writer's first reader, and the put then waited
/// for a writer that never came).
#[test]
fn put_from_a_named_pipe_opens_it_once() {
    let s = Server::start();
    let u = User::new();
    let fifo = u.path().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let data = pseudo_random(1 << 20, 3);
    let feed = data.clone();
    let path = fifo.clone();
    let writer = std::thread::spawn(move || {
        let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        f.write_all(&feed).is_ok()
    });
    let mut child = u
        .command(
            Some(&s.base),
            &[
                "put",
                "k",
                "--type",
                "blob",
                "--file",
                fifo.to_str().unwrap(),
            ],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let Some(status) = wait_within(&mut child, 30) else {
        // Unblock the writer, if it still waits for a reader (without waiting here for a
        // writer, if it does not).
        use std::os::unix::fs::OpenOptionsExt;
        let _ = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo);
        panic!("put from a named pipe hung");
    };
    let err = stderr_of(&mut child);
    assert!(status.success(), "{err}");
    assert!(writer.join().unwrap(), "the writer lost its reader");
    let back = u.run(Some(&s.base), &["get", "k"]);
    assert!(back.stdout == data, "reads back whole");
}

/// A node that stops sending in the middle of a download makes the command fail as the
/// node's failure (exit 9, which a script may retry), as a stall before the answer's head
/// does: it was an I/O error (exit 10).
#[test]
fn a_download_that_stalls_midway_exits_as_unavailable() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut c) = conn else { return };
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if c.read(&mut byte).unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let uid = format!("1e20{}", "ab".repeat(32));
                let _ = c.write_all(
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/vnd.cairn.version-stream\r\n\
                         ETag: \"{uid}\"\r\nContent-Length: 1000\r\n\r\n"
                    )
                    .as_bytes(),
                );
                // The start of a first frame (100 bytes announced, 3 sent), then nothing.
                let _ = c.write_all(&[100, 0, 0, 0, b'a', b'b', b'c']);
                std::thread::sleep(std::time::Duration::from_secs(10));
            });
        }
    });
    let u = User::new();
    let base = format!("http://{addr}");
    let out = u.run(Some(&base), &["--stall-timeout", "0.5", "get", "k"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(9), "{err}");
    assert!(err.contains("stalled"), "{err}");
}

/// A put whose input file cannot be opened fails before it changes anything: no bucket on
/// the node, no writer key, no data key (it created all three, then failed).
#[test]
fn a_put_of_a_missing_file_creates_nothing() {
    let s = Server::start();
    let u = User::new();
    let srv = Some(s.base.as_str());
    let missing = u.path().join("typo.pdf");
    let data_key = u.path().join("data.key");
    let err = u.fails(
        srv,
        &[
            "put",
            "k",
            "--file",
            missing.to_str().unwrap(),
            "--encrypt",
            "--data-key-file",
            data_key.to_str().unwrap(),
        ],
        10,
    );
    assert!(err.contains("opening"), "{err}");
    assert!(!u.path().join("writer.key").exists());
    assert!(!data_key.exists());
    let info = reqwest::blocking::get(format!("{}/v1/buckets/default", s.base)).unwrap();
    assert_eq!(info.status().as_u16(), 404);
}

/// Runs `cmd` to completion, its output in files, and returns its peak RSS in KiB
/// ([`support::PeakRss`]). Fails the test when it exits non-zero, with its stderr.
fn run_measured(mut cmd: Command, dir: &Path) -> i64 {
    let out = std::fs::File::create(dir.join("measured.out")).unwrap();
    let err_path = dir.join("measured.err");
    let err = std::fs::File::create(&err_path).unwrap();
    let mut child = cmd.stdout(out).stderr(err).spawn().unwrap();
    // Sampled until it exits; reaped only after.
    let peak = support::PeakRss::watch(child.id()).finish();
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "{}",
        std::fs::read_to_string(&err_path).unwrap_or_default()
    );
    peak
}

/// Writes `size` pseudo-random bytes to `path` (1 MiB at a time); returns their BLAKE3.
fn write_big(path: &Path, size: u64) -> blake3::Hash {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut h = blake3::Hasher::new();
    let mut block = vec![0u8; 1 << 20];
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut left = size;
    while left > 0 {
        for c in block.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            c.copy_from_slice(&x.to_le_bytes());
        }
        let n = left.min(block.len() as u64) as usize;
        f.write_all(&block[..n]).unwrap();
        h.update(&block[..n]);
        left -= n as u64;
    }
    f.flush().unwrap();
    h.finalize()
}

fn hash_file(path: &Path) -> blake3::Hash {
    let mut f = std::fs::File::open(path).unwrap();
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            return h.finalize();
        }
        h.update(&buf[..n]);
    }
}

/// Encrypted upload and download of `size` bytes through a node; asserts the client's
/// peak RSS stays under `max_rss_mib` and prints the measurements.
fn big_encrypted_transfer(size: u64, max_rss_mib: i64) {
    let s = Server::start();
    let u = User::new();
    let srv = Some(s.base.as_str());
    let src = u.path().join("big.bin");
    let want = write_big(&src, size);
    let t = Instant::now();
    let rss_up = run_measured(
        u.command(
            srv,
            &["put", "big", "--file", src.to_str().unwrap(), "--encrypt"],
        ),
        u.path(),
    );
    let up = t.elapsed();
    std::fs::remove_file(&src).unwrap();
    let back = u.path().join("back.bin");
    let t = Instant::now();
    let rss_down = run_measured(
        u.command(
            srv,
            &["get", "big", "--decrypt", "--out", back.to_str().unwrap()],
        ),
        u.path(),
    );
    let down = t.elapsed();
    let rss = rss_up.max(rss_down);
    assert_eq!(std::fs::metadata(&back).unwrap().len(), size);
    assert_eq!(hash_file(&back), want);
    eprintln!(
        "encrypted {} MiB: put {:.1} s (hash + send, client peak RSS {} MiB), get --decrypt \
         {:.1} s (client peak RSS {} MiB)",
        size >> 20,
        up.as_secs_f64(),
        rss_up / 1024,
        down.as_secs_f64(),
        rss_down / 1024
    );
    assert!(
        rss / 1024 < max_rss_mib,
        "client peak RSS {} MiB",
        rss / 1024
    );
}

/// 192 MiB encrypted up and down with the client under 64 MiB of peak RSS: three times
/// the bound, so a client that buffered the file (or its ciphertext) would fail. (Kept
/// small because `cargo test` builds the CLI without optimisation; the 2 GiB run is below.)
#[test]
fn large_encrypted_upload_in_constant_memory() {
    big_encrypted_transfer(192 << 20, 64);
}

/// The issue's target: a 2 GiB client-encrypted upload (and download) succeeds, in
/// bounded client memory. Slow in debug builds: `cargo test -- --ignored`.
#[test]
#[ignore]
fn two_gib_encrypted_upload() {
    big_encrypted_transfer(2 << 30, 64);
}

/// Interrupting a signed upload from stdin removes the copy of stdin it spools.
#[test]
fn an_interrupted_upload_leaves_no_spool_file() {
    let s = Server::start();
    let u = User::new();
    let srv = Some(s.base.as_str());
    u.ok(srv, &["put", "first", "--value", "x"]);
    let tmp = u.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let mut child = u
        .command(srv, &["put", "big"])
        .env("TMPDIR", &tmp)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Stdin stays open, so the client is still spooling it when interrupted.
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(&pseudo_random(1 << 20, 5)).unwrap();
    support::interrupt_once_a_file_fills(child, &tmp);
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    drop(stdin);
    // Nothing was stored under the key.
    u.fails(srv, &["get", "big"], 3);
}

/// `lock_timeout_secs` from the config file is used when no flag or variable overrides it:
/// a second node on a data directory in use gives up after it, exit 9.
#[test]
fn serve_takes_the_lock_timeout_from_its_config_file() {
    let s = Server::start();
    let u = User::new();
    let config = u.path().join("node.toml");
    std::fs::write(&config, "lock_timeout_secs = 0.5\n").unwrap();
    let t0 = Instant::now();
    let out = u
        .command(None, &["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .arg("--data")
        .arg(s._dir.path().join("node"))
        .env_remove("CAIRN_LOCK_TIMEOUT")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(9), "stderr: {err}");
    // The flag's old default (30 s) no longer overrides the file.
    assert!(t0.elapsed().as_secs() < 20, "waited {:?}", t0.elapsed());
}

/// `put --file` of something that is not a regular file (here `/dev/stdin` on a pipe,
/// which reports size 0) uploads what it yields, plain and encrypted, to the default
/// (owned, signed) bucket: before, the pipe's size was sent as the Content-Length and the
/// HTTP layer cut the body to it, storing an empty value (found in review).
#[cfg(unix)]
#[test]
fn put_from_a_pipe_stores_all_it_yields() {
    let s = Server::start();
    let u = User::new();
    let srv = Some(s.base.as_str());
    let data = pseudo_random((3 << 20) + 777, 11);
    create_open_bucket(&s.base, "pub");
    for (bucket, key, extra) in [
        ("default", "plain", None),
        ("default", "sealed", Some("--encrypt")),
        ("pub", "plain", None),
        ("pub", "sealed", Some("--encrypt")),
    ] {
        let mut args = vec!["--bucket", bucket, "put", key, "--type", "blob"];
        args.extend(["--file", "/dev/stdin"]);
        args.extend(extra);
        let mut child = u
            .command(srv, &args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let feed = data.clone();
        let writer = std::thread::spawn(move || stdin.write_all(&feed).unwrap());
        let out = child.wait_with_output().unwrap();
        writer.join().unwrap();
        assert!(
            out.status.success(),
            "put {bucket}/{key}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut get = vec!["--bucket", bucket, "get", key];
        if extra.is_some() {
            get.push("--decrypt");
        }
        let back = u.run(srv, &get);
        assert!(
            back.status.success(),
            "{}",
            String::from_utf8_lossy(&back.stderr)
        );
        assert!(back.stdout == data, "{bucket}/{key} reads back whole");
    }
}

/// A node that lies: answers every request with `status`, `ETag: "<etag>"` and `body`,
/// whatever was asked. Serves until the test ends.
fn lying_node(etag: String, body: Vec<u8>) -> String {
    lying_node_with(
        format!("ETag: \"{etag}\"\r\nContent-Type: application/vnd.cairn.version-stream\r\n"),
        body,
    )
}

/// [`lying_node`] answering with the given header lines (each ending in CRLF).
fn lying_node_with(headers: String, body: Vec<u8>) -> String {
    lying_node_seq(headers, vec![body])
}

/// [`lying_node_with`] answering its n-th request with `bodies[n]` (the last one after
/// those), and hanging up on every request after the 64th. A request body of a declared
/// length is read before the answer (as a node reads an upload before it answers it: an
/// answer before the whole upload is refused by the client on its own account).
fn lying_node_seq(headers: String, bodies: Vec<Vec<u8>>) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for (n, conn) in listener.incoming().enumerate() {
            let Ok(mut conn) = conn else { return };
            if n >= 64 {
                continue;
            }
            let body = &bodies[n.min(bodies.len() - 1)];
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                match conn.read(&mut byte) {
                    Ok(1) => head.push(byte[0]),
                    _ => break,
                }
            }
            let declared = String::from_utf8_lossy(&head)
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.trim()
                        .eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse::<u64>().ok())?
                })
                .unwrap_or(0);
            let _ = std::io::copy(&mut (&mut conn).take(declared), &mut std::io::sink());
            let resp = format!(
                "HTTP/1.1 200 OK\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = conn.write_all(resp.as_bytes());
            let _ = conn.write_all(body);
            drain_then_close(conn);
        }
    });
    format!("http://{addr}")
}

/// A node in front of the real one at `base` that forwards every request except those
/// whose method is `method`, which it answers itself with `answer` (as 200 JSON) without
/// passing them on. Serves until the test ends.
fn intercepting_node(base: String, method: &'static str, answer: String) -> String {
    proxy_node(base, method, Some(answer), None)
}

/// [`intercepting_node`], answering requests of `method` itself only with an `answer`, and
/// leaving header `strip` out of every request it forwards.
fn proxy_node(
    base: String,
    method: &'static str,
    answer: Option<String>,
    strip: Option<&'static str>,
) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let http = reqwest::blocking::Client::new();
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                match conn.read(&mut byte) {
                    Ok(1) => head.push(byte[0]),
                    _ => break,
                }
            }
            let head = String::from_utf8_lossy(&head).into_owned();
            let mut lines = head.split("\r\n");
            let mut first = lines.next().unwrap_or_default().split(' ');
            let (m, path) = (
                first.next().unwrap_or_default(),
                first.next().unwrap_or_default(),
            );
            let mut headers = Vec::new();
            let mut len = 0usize;
            for l in lines.filter(|l| !l.is_empty()) {
                let Some((n, v)) = l.split_once(": ") else {
                    continue;
                };
                if n.eq_ignore_ascii_case("content-length") {
                    len = v.parse().unwrap_or(0);
                }
                if !n.eq_ignore_ascii_case("host")
                    && !n.eq_ignore_ascii_case("connection")
                    && strip.is_none_or(|s| !n.eq_ignore_ascii_case(s))
                {
                    headers.push((n.to_string(), v.to_string()));
                }
            }
            let mut body = vec![0u8; len];
            if conn.read_exact(&mut body).is_err() {
                continue;
            }
            let (status, ctype, extra, answer_body) =
                if let Some(answer) = answer.as_ref().filter(|_| m == method) {
                    (
                        200,
                        "application/json".to_string(),
                        String::new(),
                        answer.clone().into_bytes(),
                    )
                } else {
                    let mut req = http.request(m.parse().unwrap(), format!("{base}{path}"));
                    for (n, v) in &headers {
                        req = req.header(n.as_str(), v.as_str());
                    }
                    let resp = req.body(body).send().unwrap();
                    let status = resp.status().as_u16();
                    let mut extra = String::new();
                    let mut ctype = String::new();
                    for (n, v) in resp.headers() {
                        let v = v.to_str().unwrap_or_default();
                        if n.as_str() == "content-type" {
                            ctype = v.to_string();
                        } else if n.as_str() == "etag" || n.as_str().starts_with("x-cairn") {
                            extra.push_str(&format!("{n}: {v}\r\n"));
                        }
                    }
                    (status, ctype, extra, resp.bytes().unwrap().to_vec())
                };
            let resp = format!(
                "HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n",
                answer_body.len()
            );
            let _ = conn.write_all(resp.as_bytes());
            let _ = conn.write_all(&answer_body);
            drain_then_close(conn);
        }
    });
    format!("http://{addr}")
}

/// A put of a value in a text form (integer, tuple, list, map, set) checks that the
/// version the node names holds what the text sent makes (a list, map or set as the tree
/// the bucket builds of it): a node answering with another version of the key is caught
/// (exit 11, nothing on stdout). Only the type was checked before.
#[test]
fn typed_puts_refuse_a_version_holding_another_value() {
    let s = Server::start();
    let u = User::new();
    let srv = Some(s.base.as_str());
    for (ty, first, second) in [
        ("integer", "10", "11"),
        ("tuple", "a\nb\n", "a\nc\n"),
        ("list", "x\ny\n", "x\ny\nz\n"),
        ("map", "a=1\nb=2\n", "a=1\nb=3\n"),
        ("set", "p\nq\n", "p\nr\n"),
    ] {
        let key = format!("k-{ty}");
        let v1 = u.ok(srv, &["put", &key, "--type", ty, "--value", first]);
        let v1 = v1.trim();
        let lie = format!(r#"{{"uid":"{v1}","key":"{key}"}}"#);
        let node = intercepting_node(s.base.clone(), "PUT", lie);
        let out = u.run(Some(&node), &["put", &key, "--type", ty, "--value", second]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(11), "{ty}: {err}");
        assert!(
            err.contains("holds another value than the one sent"),
            "{ty}: {err}"
        );
        assert!(out.stdout.is_empty(), "{ty}");
        // The same value again is taken (the check is not refusing everything): the
        // version named holds what was sent and carries the owner's seal (from the first
        // put; the same put made twice makes the same version, so a seal of this very
        // request cannot be asked for).
        let out = u.run(Some(&node), &["put", &key, "--type", ty, "--value", first]);
        assert!(
            out.status.success(),
            "{ty}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), v1, "{ty}");
        // Through the node itself, the put is taken, sealed.
        let v = u.ok(srv, &["put", &key, "--type", ty, "--value", second]);
        let out = u.ok(srv, &["verify", "--proof", &key, "--uid", v.trim()]);
        assert!(out.contains("sealed   by owner"), "{ty}: {out}");
    }
}

/// A put whose owner seal is left out on the way (the seal header is not in the request
/// signature) is recorded unsealed by the node: the CLI, which checks the version's proof
/// after a sealed put, says so (exit 11) instead of printing the uid.
#[test]
fn a_seal_dropped_on_the_way_is_caught() {
    let s = Server::start();
    let u = User::new();
    let srv = Some(s.base.as_str());
    u.ok(srv, &["put", "k", "--value", "first"]);
    let proxy = proxy_node(s.base.clone(), "", None, Some("x-cairn-owner-seal"));
    let out = u.run(Some(&proxy), &["put", "k", "--value", "second"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(11), "{err}");
    assert!(
        err.contains("recorded without the owner seal sent with it"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
}

/// `update` and `merge` check what the node says it made: a node answering with the uid
/// of another version of the key (one with no base, one whose value is not what the
/// operation makes of its base, one that does not derive from the version merged) is
/// caught (exit 11, nothing on stdout). Only the key was checked before.
#[test]
fn update_and_merge_refuse_a_version_the_node_did_not_make_of_them() {
    let s = Server::start();
    let u = User::new();
    let srv = Some(s.base.as_str());
    let v1 = u.ok(srv, &["put", "n", "--value", "10", "--type", "integer"]);
    let v1 = v1.trim();
    let v2 = u.ok(srv, &["update", "n", "--add", "5"]);
    let v2 = v2.trim();
    let lie = |uid: &str| format!(r#"{{"uid":"{uid}","key":"n"}}"#);
    // A version with no base.
    let node = intercepting_node(s.base.clone(), "PATCH", lie(v1));
    let out = u.run(Some(&node), &["update", "n", "--add", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(11), "{err}");
    assert!(err.contains("has 0 bases"), "{err}");
    assert!(out.stdout.is_empty());
    // A version on a base, but not what adding 1 makes of it (10 + 5).
    let node = intercepting_node(s.base.clone(), "PATCH", lie(v2));
    let out = u.run(Some(&node), &["update", "n", "--add", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(11), "{err}");
    assert!(err.contains("does not hold what the update makes"), "{err}");
    // What adding 5 makes of it is taken (the check is not refusing everything).
    let out = u.run(Some(&node), &["update", "n", "--add", "5"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A merge answered with a version that does not derive from what was merged: one
    // with a single base, and a real merge of two other versions.
    u.ok(srv, &["fork", "n", "--from", "master", "--to", "side"]);
    let v3 = u.ok(srv, &["update", "n", "--branch", "side", "--add", "1"]);
    let v3 = v3.trim();
    u.ok(srv, &["fork", "n", "--from", "master", "--to", "other"]);
    u.ok(srv, &["update", "n", "--branch", "other", "--add", "2"]);
    let v4 = u.ok(srv, &["update", "n", "--add", "3"]);
    let v4 = v4.trim();
    let vm = u.ok(
        srv,
        &[
            "merge",
            "n",
            "--into",
            "master",
            "--from",
            "other",
            "--resolve",
            "sum",
        ],
    );
    let merge_lie = |uid: &str, outcome: &str, args: &[&str], want: &str| {
        let lie = format!(r#"{{"uid":"{uid}","key":"n","outcome":"{outcome}"}}"#);
        let node = intercepting_node(s.base.clone(), "POST", lie);
        let out = u.run(Some(&node), args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(11), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(out.stdout.is_empty());
    };
    let from_v3 = [
        "merge",
        "n",
        "--into",
        "master",
        "--from",
        v3,
        "--resolve",
        "sum",
    ];
    // A put guarded by a head, answered with a merge that has that head among two bases:
    // a put makes a version of the guarded head alone.
    let lie = format!(r#"{{"uid":"{}","key":"n"}}"#, vm.trim());
    let node = intercepting_node(s.base.clone(), "PUT", lie);
    let out = u.run(
        Some(&node),
        &[
            "put", "n", "--type", "integer", "--value", "1", "--guard", v4,
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(11), "{err}");
    assert!(
        err.contains(&format!("does not derive from {v4} alone (2 base(s))")),
        "{err}"
    );
    merge_lie(v2, "merged", &from_v3, "has 1 base(s)");
    merge_lie(
        vm.trim(),
        "merged",
        &from_v3,
        &format!("does not derive from {v3}"),
    );
    merge_lie(v2, "fast_forward", &from_v3, "where the branch was to move");
    // Answers the client cannot fault are taken: a fast-forward to the version named,
    // and an untagged merge naming no heads (which the node picks).
    let take = |uid: &str, outcome: &str, args: &[&str]| {
        let lie = format!(r#"{{"uid":"{uid}","key":"n","outcome":"{outcome}"}}"#);
        let node = intercepting_node(s.base.clone(), "POST", lie);
        let out = u.run(Some(&node), args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), uid);
    };
    take(v3, "fast_forward", &from_v3);
    take(v2, "fast_forward", &["merge", "n", "--untagged"]);
}

/// Ends a fake node's answer without a reset: the request body it did not read (an
/// upload it answered early) is read and dropped until the client closes, on a thread
/// of its own. Closed with unread bytes, the socket would send a reset, and the client,
/// still writing, could fail on it before reading the answer (as a real node's
/// answer-then-close does not make it).
fn drain_then_close(mut conn: std::net::TcpStream) {
    std::thread::spawn(move || {
        let _ = conn.shutdown(std::net::Shutdown::Write);
        let _ = conn.set_read_timeout(Some(std::time::Duration::from_secs(10)));
        let mut sink = [0u8; 1 << 16];
        while matches!(conn.read(&mut sink), Ok(n) if n > 0) {}
    });
}

/// The frames of a verified stream, cut apart (`u32` LE length, chunk).
fn frames(stream: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < stream.len() {
        let n = u32::from_le_bytes(stream[at..at + 4].try_into().unwrap()) as usize;
        out.push(stream[at + 4..at + 4 + n].to_vec());
        at += 4 + n;
    }
    out
}

fn join(frames: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for f in frames {
        out.extend_from_slice(&(f.len() as u32).to_le_bytes());
        out.extend_from_slice(f);
    }
    out
}

/// `cairn --server get` checks every byte against the uid: a node that changes a byte,
/// drops or adds a chunk, sends another version or names another uid than asked is caught
/// (exit 6, or 11 for the wrong uid), `--out` is left unwritten, and what reached stdout
/// before the failure is a verified prefix of the value, never a changed byte.
#[test]
fn get_refuses_what_a_lying_node_sends() {
    let s = Server::start();
    let u = User::new();
    let srv = Some(s.base.as_str());
    let p = |n: &str| -> PathBuf { u.path().join(n) };
    let value = pseudo_random(600_000, 11);
    std::fs::write(p("v"), &value).unwrap();
    let uid = u.ok(srv, &["put", "k", "--file", p("v").to_str().unwrap()]);
    let uid = uid.trim().to_string();
    let other = u.ok(srv, &["put", "k2", "--value", "another value"]);
    let other = other.trim().to_string();
    // The honest stream, read from the real node.
    let fetch = |key: &str, uid: &str| -> Vec<u8> {
        let url = format!("{}/v1/buckets/default/stream/{key}?uid={uid}", s.base);
        let resp = reqwest::blocking::get(url).unwrap();
        assert!(resp.status().is_success());
        resp.bytes().unwrap().to_vec()
    };
    let honest = frames(&fetch("k", &uid));
    assert!(honest.len() > 4, "a tree of several nodes");
    // Sanity: the honest stream served by the stand-in node reads back whole.
    let ok = lying_node(uid.clone(), join(&honest));
    let back = u.run(Some(&ok), &["get", "k", "--uid", &uid]);
    assert!(back.status.success() && back.stdout == value);

    let last = honest.len() - 1;
    let mut flipped_leaf = honest.clone();
    flipped_leaf[last][100] ^= 1;
    let mut flipped_root = honest.clone();
    flipped_root[1][10] ^= 1;
    let mut flipped_meta = honest.clone();
    flipped_meta[0][5] ^= 1;
    let mut extra = honest.clone();
    extra.push(honest[last].clone());
    let mut reordered = honest.clone();
    reordered.swap(last - 1, last);
    let foreign = frames(&fetch("k2", &other));
    let mut swapped_tree = vec![honest[0].clone()];
    swapped_tree.extend(foreign.iter().skip(1).cloned());
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("a flipped byte in the last leaf", join(&flipped_leaf)),
        ("a flipped byte in the root", join(&flipped_root)),
        ("a flipped byte in the Meta chunk", join(&flipped_meta)),
        ("a missing last leaf", join(&honest[..last])),
        ("an extra chunk", join(&extra)),
        ("two leaves swapped", join(&reordered)),
        ("another key's version", join(&foreign)),
        (
            "another tree under the right Meta chunk",
            join(&swapped_tree),
        ),
        (
            "a stream cut inside a frame",
            join(&honest)[..300_000].to_vec(),
        ),
    ];
    for (what, body) in cases {
        let liar = lying_node(uid.clone(), body);
        for by_branch in [false, true] {
            let mut args = vec!["get", "k"];
            if !by_branch {
                args.extend(["--uid", &uid]);
            }
            let out = u.run(Some(&liar), &args);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(6), "{what}: {err}");
            assert!(!err.contains("panicked"), "{what}: {err}");
            assert!(
                value.starts_with(&out.stdout),
                "{what}: only a verified prefix reaches stdout"
            );
            let dest = p("out");
            let _ = std::fs::remove_file(&dest);
            args.extend(["--out", dest.to_str().unwrap()]);
            let out = u.run(Some(&liar), &args);
            assert_eq!(out.status.code(), Some(6), "{what} --out");
            assert!(!dest.exists(), "{what}: --out is not written");
        }
    }
    // With the capsule pinned, a read by branch checks the node's proof first: a version
    // the node made up (no writer's record of it) is refused even under its own ETag.
    let info = u.ok(srv, &["bucket"]);
    let capsule = info
        .lines()
        .find_map(|l| l.strip_prefix("capsule: "))
        .unwrap()
        .to_string();
    let back = u.run(srv, &["get", "k", "--capsule", &capsule]);
    assert!(back.status.success() && back.stdout == value);
    // It names the version it proved, and says who sealed it: the node's key recorded it
    // (the bucket was made through its API), the owner's key sealed the content.
    let said = String::from_utf8_lossy(&back.stderr);
    assert!(said.contains(&format!("version {uid} (depth")), "{said}");
    let owner = cairn_node::keys::read(&u.path().join("writer.key"))
        .unwrap()
        .public();
    assert!(
        said.contains(&format!("its content sealed by owner {owner}"))
            && !said.contains("not by the bucket's owner"),
        "{said}"
    );
    let meta = u.ok(srv, &["get", "k2", "--meta", "--capsule", &capsule]);
    assert!(meta.starts_with(&format!("uid: {other}\n")), "{meta}");
    let mut wrong = capsule.clone();
    let last = wrong.pop().unwrap();
    wrong.push(if last == '0' { '1' } else { '0' });
    let err = u.fails(srv, &["get", "k", "--capsule", &wrong], 11);
    assert!(err.contains("not the pinned"), "{err}");
    // The lying node answers every request with the same body: its "metadata" and "proof"
    // are not the bucket's, so the pinned read fails before printing anything.
    let liar = lying_node(other.clone(), join(&foreign));
    let out = u.run(Some(&liar), &["get", "k", "--capsule", &capsule]);
    assert_ne!(out.status.code(), Some(0));
    assert!(out.stdout.is_empty());
    let err = u.fails(None, &["get", "k", "--capsule", &capsule], 8);
    assert!(err.contains("--server"), "{err}");
    // A node naming another version than the one asked for: refused before reading it.
    let liar = lying_node(other.clone(), join(&foreign));
    let err = u.fails(Some(&liar), &["get", "k2", "--uid", &uid], 11);
    assert!(err.contains("answered with"), "{err}");
    // Tampering under --decrypt: nothing decrypted reaches the output.
    u.ok(
        srv,
        &[
            "put",
            "sealed",
            "--file",
            p("v").to_str().unwrap(),
            "--encrypt",
        ],
    );
    let sealed_uid = u.ok(srv, &["get", "sealed", "--meta"]);
    let sealed_uid = sealed_uid
        .lines()
        .next()
        .unwrap()
        .trim_start_matches("uid: ");
    let mut sealed = frames(&fetch("sealed", sealed_uid));
    let n = sealed.len();
    sealed[n / 2][50] ^= 1;
    let liar = lying_node(sealed_uid.to_string(), join(&sealed));
    let out = u.run(Some(&liar), &["get", "sealed", "--decrypt"]);
    assert_eq!(
        out.status.code(),
        Some(6),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout.is_empty(), "no plaintext of a tampered value");
}

/// `cairn --server diff` and `lca` compute their answers from chunks the node sends, each
/// hashed: the honest chunks give local mode's output; a changed or missing chunk, a page
/// size the client did not ask for, or an answer about another version than named exits
/// 11, and a node cannot pass off shared history as disjoint.
#[test]
fn diff_and_lca_refuse_what_a_lying_node_sends() {
    let s = Server::start();
    let u = User::new();
    let srv = Some(s.base.as_str());
    let p = |n: &str| -> PathBuf { u.path().join(n) };
    let mut value = pseudo_random(900_000, 5);
    std::fs::write(p("v"), &value).unwrap();
    let v1 = u.ok(srv, &["put", "k", "--file", p("v").to_str().unwrap()]);
    let v1 = v1.trim().to_string();
    value[450_000..450_100].fill(7);
    std::fs::write(p("v"), &value).unwrap();
    let v2 = u.ok(srv, &["put", "k", "--file", p("v").to_str().unwrap()]);
    let v2 = v2.trim().to_string();
    let expected = u.ok(srv, &["diff", "k", &v1, &v2]);
    assert!(expected.starts_with("@ "), "{expected}");
    u.ok(srv, &["fork", "k", "--from", &v1, "--to", "side"]);
    value[10..20].fill(1);
    std::fs::write(p("w"), &value).unwrap();
    let w = p("w");
    u.ok(
        srv,
        &[
            "put",
            "k",
            "--file",
            w.to_str().unwrap(),
            "--branch",
            "side",
        ],
    );
    let lca = u.ok(srv, &["lca", "k", "master", "side"]);
    assert_eq!(lca.trim(), v1);
    let fetch = |op: &str, a: &str, b: &str| -> (Vec<Vec<u8>>, String) {
        let url = format!(
            "{}/v1/buckets/default/{op}/k?a={a}&b={b}&limit=10000&chunks=true",
            s.base
        );
        let url = if op == "lca" {
            url.replace("&limit=10000", "")
        } else {
            url
        };
        let resp = reqwest::blocking::get(url).unwrap();
        assert!(resp.status().is_success());
        let mut headers = String::new();
        for h in ["content-type", "x-cairn-a", "x-cairn-b", "x-cairn-limit"] {
            if let Some(v) = resp.headers().get(h) {
                headers.push_str(&format!("{h}: {}\r\n", v.to_str().unwrap()));
            }
        }
        (frames(&resp.bytes().unwrap()), headers)
    };
    let check = |what: &str, args: &[&str], liar: String, expect: Option<&str>| {
        let out = u.run(Some(&liar), args);
        let err = String::from_utf8_lossy(&out.stderr);
        match expect {
            Some(want) => {
                assert!(out.status.success(), "{what}: {err}");
                assert_eq!(String::from_utf8_lossy(&out.stdout), want, "{what}");
            }
            None => {
                assert_eq!(out.status.code(), Some(11), "{what}: {err}");
                assert!(!err.contains("panicked"), "{what}: {err}");
                assert!(out.stdout.is_empty(), "{what}: nothing printed");
            }
        }
    };

    let diff_args = ["diff", "k", v1.as_str(), v2.as_str()];
    let (honest, headers) = fetch("diff", &v1, &v2);
    assert!(honest.len() >= 4, "Meta chunks, roots and leaves");
    check(
        "the honest chunks",
        &diff_args,
        lying_node_with(headers.clone(), join(&honest)),
        Some(&expected),
    );
    let mut cases: Vec<(String, String, Vec<Vec<u8>>)> = Vec::new();
    for i in 0..honest.len() {
        let mut flipped = honest.clone();
        let at = flipped[i].len() / 2;
        flipped[i][at] ^= 1;
        cases.push((format!("chunk {i} flipped"), headers.clone(), flipped));
        let mut dropped = honest.clone();
        dropped.remove(i);
        cases.push((format!("chunk {i} left out"), headers.clone(), dropped));
    }
    for limit in ["0", "20000", "many"] {
        let h = headers
            .lines()
            .map(|l| match l.starts_with("x-cairn-limit") {
                true => format!("x-cairn-limit: {limit}\r\n"),
                false => format!("{l}\n"),
            })
            .collect();
        cases.push((format!("a page of {limit} changes"), h, honest.clone()));
    }
    // A Meta chunk far larger than any version's, and a POS-tree node past the budget.
    let mut huge = honest.clone();
    huge[0] = vec![0u8; 40 << 20];
    cases.push(("a 40 MiB Meta chunk".into(), headers.clone(), huge));
    let mut padded = honest.clone();
    padded.push(vec![1u8; 9 << 20]);
    cases.push(("9 MiB more of chunks".into(), headers.clone(), padded));
    cases.push((
        "an answer that is not chunks".into(),
        headers.replace("application/vnd.cairn.chunks", "application/json"),
        honest.clone(),
    ));
    let (other, other_headers) = fetch("diff", &v1, "side");
    cases.push(("the diff of other versions".into(), other_headers, other));
    for (what, h, body) in cases {
        check(&what, &diff_args, lying_node_with(h, join(&body)), None);
    }

    // Large inline values: a diff of two 5 MiB strings, and an LCA whose walk reads 12 MiB
    // of Meta chunks (the search streams them; neither side holds the history).
    let big = |seed: u64, n: usize| {
        let path = p(&format!("big{seed}"));
        let text: Vec<u8> = pseudo_random(n, seed)
            .iter()
            .map(|b| b'a' + b % 26)
            .collect();
        std::fs::write(&path, text).unwrap();
        path
    };
    let s1 = u.ok(
        srv,
        &[
            "put",
            "s",
            "--type",
            "string",
            "--file",
            big(1, 5 << 20).to_str().unwrap(),
        ],
    );
    let s2 = u.ok(
        srv,
        &[
            "put",
            "s",
            "--type",
            "string",
            "--file",
            big(2, 5 << 20).to_str().unwrap(),
        ],
    );
    let local_style = u.ok(srv, &["diff", "s", s1.trim(), s2.trim()]);
    assert!(local_style.starts_with("- ") && local_style.contains("\n+ "));
    let first = u.ok(
        srv,
        &[
            "put",
            "h",
            "--type",
            "string",
            "--file",
            big(3, 300 << 10).to_str().unwrap(),
        ],
    );
    u.ok(srv, &["fork", "h", "--from", first.trim(), "--to", "other"]);
    u.ok(srv, &["put", "h", "--value", "x", "--branch", "other"]);
    for i in 0..40 {
        let f = big(10 + i, 300 << 10);
        u.ok(
            srv,
            &[
                "put",
                "h",
                "--type",
                "string",
                "--file",
                f.to_str().unwrap(),
            ],
        );
    }
    assert_eq!(
        u.ok(srv, &["lca", "h", "master", "other"]).trim(),
        first.trim()
    );

    let lca_args = ["lca", "k", v2.as_str(), "side"];
    let (honest, headers) = fetch("lca", &v2, "side");
    check(
        "the honest lca chunks",
        &lca_args,
        lying_node_with(headers.clone(), join(&honest)),
        Some(&lca),
    );
    // Only the two versions' Meta chunks: the walk cannot reach its end, so the client
    // refuses instead of reporting disjoint histories.
    check(
        "only the two Meta chunks",
        &lca_args,
        lying_node_with(headers.clone(), join(&honest[..2])),
        None,
    );
    for i in 0..honest.len() {
        let mut flipped = honest.clone();
        let at = flipped[i].len() / 2;
        flipped[i][at] ^= 1;
        check(
            &format!("lca chunk {i} flipped"),
            &lca_args,
            lying_node_with(headers.clone(), join(&flipped)),
            None,
        );
    }
}

/// `cairn --server log` checks the node's answer: every entry against its Meta chunk and
/// the whole list against the breadth-first walk of the history those versions record.
/// A dropped, added, reordered or altered entry exits 11 (6 for a Meta chunk that does
/// not decode); the honest answer, served by the same stand-in, reads as local mode does.
#[test]
fn log_refuses_what_a_lying_node_sends() {
    let s = Server::start();
    let u = User::new();
    let srv = Some(s.base.as_str());
    for v in ["1", "2", "3"] {
        u.ok(srv, &["put", "k", "--value", v]);
    }
    u.ok(srv, &["fork", "k", "--from", "master", "--to", "side"]);
    u.ok(srv, &["put", "k", "--value", "s", "--branch", "side"]);
    u.ok(srv, &["put", "k", "--value", "4"]);
    u.ok(
        srv,
        &[
            "merge",
            "k",
            "--into",
            "master",
            "--from",
            "side",
            "--resolve",
            "ours",
        ],
    );
    u.ok(srv, &["put", "other", "--value", "x"]);
    let expected = u.ok(srv, &["log", "k", "--limit", "20"]);
    assert_eq!(expected.lines().count(), 6, "{expected}");
    let fetch = |key: &str| -> serde_json::Value {
        let url = format!(
            "{}/v1/buckets/default/log/{key}?branch=master&min=0&max=19",
            s.base
        );
        serde_json::from_slice(&reqwest::blocking::get(url).unwrap().bytes().unwrap()).unwrap()
    };
    let honest = fetch("k");
    let serve = |j: &serde_json::Value| lying_node(String::new(), j.to_string().into_bytes());
    let ok = serve(&honest);
    assert_eq!(u.ok(Some(&ok), &["log", "k", "--limit", "20"]), expected);
    let versions = honest["versions"].as_array().unwrap().clone();
    let with = |vs: Vec<serde_json::Value>| {
        let mut j = honest.clone();
        j["versions"] = serde_json::Value::Array(vs);
        j
    };
    let mut dropped = versions.clone();
    dropped.remove(3);
    let mut swapped = versions.clone();
    swapped.swap(1, 2);
    let mut added = versions.clone();
    added.push(fetch("other")["versions"][0].clone());
    let mut altered = versions.clone();
    let m = altered[2]["meta"].as_str().unwrap().to_string();
    let flip = if m.ends_with('0') { "1" } else { "0" };
    altered[2]["meta"] = serde_json::Value::String(format!("{}{flip}", &m[..m.len() - 1]));
    let mut renamed = versions.clone();
    renamed[4]["uid"] = versions[5]["uid"].clone();
    let mut last_dropped = versions.clone();
    last_dropped.pop();
    for (what, j) in [
        ("an entry dropped", with(dropped)),
        ("two entries swapped", with(swapped)),
        ("another key's version added", with(added)),
        ("a Meta chunk altered", with(altered)),
        ("an entry under another uid", with(renamed)),
        ("the last entry dropped", with(last_dropped)),
        ("no entry at all", with(Vec::new())),
        ("a next page past the history", {
            let mut j = honest.clone();
            j["next_min"] = serde_json::json!(3);
            j
        }),
    ] {
        let liar = serve(&j);
        let out = u.run(Some(&liar), &["log", "k", "--limit", "20"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(11), "{what}: {err}");
        assert!(!err.contains("panicked"), "{what}: {err}");
    }
    // A first page that stops where the walk goes on, then empty pages that go on at the
    // same place: the client must not ask again forever.
    let mut first = with(versions[..2].to_vec());
    first["next_min"] = versions[2]["distance"].clone();
    let mut empty = with(Vec::new());
    empty["next_min"] = versions[2]["distance"].clone();
    let liar = lying_node_seq(
        String::new(),
        vec![
            first.to_string().into_bytes(),
            empty.to_string().into_bytes(),
        ],
    );
    let out = u.run(Some(&liar), &["log", "k", "--limit", "20"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(11), "empty pages: {err}");
    assert!(err.contains("empty page"), "{err}");
}

/// `--out` naming a link to a file that does not exist yet gets the same all-or-nothing
/// write as a new file: nothing of a refused value reaches the link's target, and a
/// decrypted value is private (0600).
#[test]
fn out_through_a_dangling_link_is_written_whole_or_not_at_all() {
    use std::os::unix::fs::PermissionsExt;
    let s = Server::start();
    let u = User::new();
    let srv = Some(s.base.as_str());
    let p = |n: &str| -> PathBuf { u.path().join(n) };
    let link = |name: &str, target: &str| {
        std::os::unix::fs::symlink(p(target), p(name)).unwrap();
        p(name).to_str().unwrap().to_string()
    };
    std::fs::write(p("plain"), pseudo_random(200_000, 3)).unwrap();
    let plain = p("plain").to_str().unwrap().to_string();
    u.ok(srv, &["put", "secret", "--file", &plain, "--encrypt"]);
    let l1 = link("link1", "target1");
    u.ok(srv, &["get", "secret", "--decrypt", "--out", &l1]);
    assert_eq!(
        std::fs::read(p("target1")).unwrap(),
        std::fs::read(p("plain")).unwrap()
    );
    let mode = std::fs::metadata(p("target1"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode & 0o077, 0, "decrypted through a link: mode {mode:o}");
    assert!(
        std::fs::symlink_metadata(p("link1"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    // A node that changes a byte of a leaf: nothing reaches the target.
    let value = pseudo_random(600_000, 11);
    std::fs::write(p("v"), &value).unwrap();
    let uid = u.ok(srv, &["put", "k", "--file", p("v").to_str().unwrap()]);
    let uid = uid.trim();
    let url = format!("{}/v1/buckets/default/stream/k?uid={uid}", s.base);
    let body = reqwest::blocking::get(url)
        .unwrap()
        .bytes()
        .unwrap()
        .to_vec();
    let mut fr = frames(&body);
    let last = fr.len() - 1;
    fr[last][100] ^= 1;
    let liar = lying_node(uid.to_string(), join(&fr));
    let l2 = link("link2", "target2");
    let out = u.run(Some(&liar), &["get", "k", "--out", &l2]);
    assert_eq!(
        out.status.code(),
        Some(6),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !p("target2").exists(),
        "a refused value reached the link's target"
    );
}

/// `branches` over a node checks each head it lists against the Meta chunk sent with it:
/// a made-up head, another key's version or an altered chunk makes it exit 11 with nothing
/// printed; an honest answer prints as the node's own listing does.
#[test]
fn branches_refuse_what_a_lying_node_sends() {
    let s = Server::start();
    let u = User::new();
    let srv = Some(s.base.as_str());
    u.ok(srv, &["put", "k", "--value", "1"]);
    u.ok(srv, &["fork", "k", "--from", "master", "--to", "side"]);
    u.ok(srv, &["put", "k", "--value", "2", "--branch", "side"]);
    let other = u.ok(srv, &["put", "other", "--value", "x"]);
    let expected = u.ok(srv, &["branches", "k"]);
    assert_eq!(expected.lines().count(), 2, "{expected}");
    let url = format!("{}/v1/buckets/default/branches/k", s.base);
    let honest: serde_json::Value =
        serde_json::from_slice(&reqwest::blocking::get(url).unwrap().bytes().unwrap()).unwrap();
    assert_eq!(honest["metas"].as_object().unwrap().len(), 2, "{honest}");
    let serve = |j: &serde_json::Value| lying_node(String::new(), j.to_string().into_bytes());
    assert_eq!(u.ok(Some(&serve(&honest)), &["branches", "k"]), expected);
    let side = honest["tagged"]["side"].as_str().unwrap().to_string();
    let other_url = format!("{}/v1/buckets/default/branches/other", s.base);
    let other_answer: serde_json::Value =
        serde_json::from_slice(&reqwest::blocking::get(other_url).unwrap().bytes().unwrap())
            .unwrap();
    let other = other.trim().to_string();
    let mut foreign = honest.clone();
    foreign["tagged"]["side"] = serde_json::json!(other);
    foreign["metas"][&other] = other_answer["metas"][&other].clone();
    let mut altered = honest.clone();
    let m = altered["metas"][&side].as_str().unwrap().to_string();
    let flip = if m.ends_with('0') { "1" } else { "0" };
    altered["metas"][&side] = serde_json::json!(format!("{}{flip}", &m[..m.len() - 1]));
    let mut swapped = honest.clone();
    let master = honest["tagged"]["master"].clone();
    swapped["metas"][&side] = honest["metas"][master.as_str().unwrap()].clone();
    // A branch name carrying a forged line: "master<TAB><another key's uid>".
    let mut forged = honest.clone();
    forged["tagged"][format!("zz\nmaster\t{other}")] = honest["tagged"]["side"].clone();
    for (what, j) in [
        ("another key's version as a head", foreign),
        ("a Meta chunk altered", altered),
        ("another head's Meta chunk", swapped),
        ("a branch name with a newline", forged),
    ] {
        let out = u.run(Some(&serve(&j)), &["branches", "k"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(11), "{what}: {err}");
        assert!(out.stdout.is_empty(), "{what}: printed {:?}", out.stdout);
        assert!(!err.contains("panicked"), "{what}: {err}");
    }
    // A head sent without its Meta chunk is read alone, verified: here the liar cannot
    // produce it.
    let mut made_up = honest.clone();
    made_up["untagged"] = serde_json::json!([format!("1e20{}", "ab".repeat(32))]);
    let out = u.run(Some(&serve(&made_up)), &["branches", "k", "--untagged"]);
    assert!(
        !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout.is_empty());
}

/// A key with more heads than one page of the node's listing (1000): `branches` follows
/// `next` and lists every one; a node whose `next` does not move on is refused rather than
/// asked again for ever.
#[test]
fn branches_are_read_across_pages() {
    let s = Server::start();
    let u = User::new();
    create_open_bucket(&s.base, "pub");
    let http = reqwest::blocking::Client::new();
    let r = http
        .put(format!("{}/v1/buckets/pub/objects/k", s.base))
        .body("root")
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    for i in 0..1004 {
        let r = http
            .post(format!("{}/v1/buckets/pub/fork/k", s.base))
            .header("content-type", "application/json")
            .body(format!("{{\"branch\": \"b{i:04}\"}}"))
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 201);
    }
    let out = u.ok(Some(&s.base), &["--bucket", "pub", "branches", "k"]);
    let names: Vec<&str> = out.lines().map(|l| l.split('\t').next().unwrap()).collect();
    let mut want: Vec<String> = (0..1004).map(|i| format!("b{i:04}")).collect();
    want.push("master".into());
    assert_eq!(names, want);
    // A node that answers every page with the same `next`.
    let url = format!("{}/v1/buckets/pub/branches/k?limit=2", s.base);
    let page: serde_json::Value =
        serde_json::from_slice(&http.get(url).send().unwrap().bytes().unwrap()).unwrap();
    assert_eq!(page["next"], "tagged:b0001", "{page}");
    let liar = lying_node(String::new(), page.to_string().into_bytes());
    let out = u.run(Some(&liar), &["--bucket", "pub", "branches", "k"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(11), "{err}");
    assert!(err.contains("out of order or again"), "{err}");
    // Nothing of the repeated page was printed twice: only the first page.
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 2);
    // A page that says it goes on after a head it does not end with.
    let mut skip = page.clone();
    skip["next"] = serde_json::json!("tagged:b0500");
    let liar = lying_node(String::new(), skip.to_string().into_bytes());
    let out = u.run(Some(&liar), &["--bucket", "pub", "branches", "k"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(11), "{err}");
    assert!(err.contains("goes on after"), "{err}");
    assert!(out.stdout.is_empty());
}

/// A log longer than one answer (the node's 8 MiB budget, here 600 versions with 4 KiB
/// contexts): the client follows `next_min` from the same start version and checks the
/// walk across pages.
#[test]
fn a_long_log_is_read_and_checked_across_pages() {
    let s = Server::start();
    let u = User::new();
    create_open_bucket(&s.base, "pub");
    let http = reqwest::blocking::Client::new();
    for i in 0..600 {
        let r = http
            .put(format!(
                "{}/v1/buckets/pub/objects/long?type=string",
                s.base
            ))
            .header("x-cairn-context", format!("{i:04}{}", "c".repeat(4092)))
            .body(format!("v{i}"))
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 201);
    }
    let first: serde_json::Value = serde_json::from_slice(
        &http
            .get(format!("{}/v1/buckets/pub/log/long?min=0&max=599", s.base))
            .send()
            .unwrap()
            .bytes()
            .unwrap(),
    )
    .unwrap();
    assert!(
        first["next_min"].as_u64().is_some(),
        "the log needs two answers"
    );
    let log = u.ok(
        Some(&s.base),
        &["--bucket", "pub", "log", "long", "--limit", "600"],
    );
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 600);
    for (i, l) in lines.iter().enumerate() {
        assert!(l.contains(&format!("depth {}", 599 - i)), "{l}");
        assert!(l.contains(&format!("  {:04}ccc", 599 - i)), "{l}");
    }
}

/// `cairn serve` on `data` as a child process (synced commits, the default), on a port of
/// its choosing; returns it and its base URL, read from its "listening" log line.
fn spawn_node(u: &User, data: &Path) -> (std::process::Child, String) {
    spawn_node_with(u, data, |_| {})
}

/// [`spawn_node`], with `setup` applied to the command first.
fn spawn_node_with(
    u: &User,
    data: &Path,
    setup: impl FnOnce(&mut Command),
) -> (std::process::Child, String) {
    let mut cmd = u.command(
        None,
        &["serve", "--listen", "127.0.0.1:0", "--log-format", "json"],
    );
    cmd.arg("--data")
        .arg(data)
        .env_remove("CAIRN_LOCK_TIMEOUT")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    setup(&mut cmd);
    let mut child = cmd.spawn().unwrap();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let addr = loop {
        line.clear();
        let n = std::io::BufRead::read_line(&mut lines, &mut line).unwrap();
        assert!(n > 0, "the node exited before listening");
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line)
            && let Some(a) = v.pointer("/fields/addr").and_then(|a| a.as_str())
        {
            break a.to_string();
        }
    };
    // Later log lines are drained so the node never blocks on a full pipe.
    std::thread::spawn(move || std::io::copy(&mut lines, &mut std::io::sink()));
    (child, format!("http://{addr}"))
}

/// What a writer of [`a_node_killed_mid_writes_keeps_every_acknowledged_write`] saw.
#[derive(Default)]
struct Acks {
    /// (key, uid, value) of every write the node answered 201.
    acked: Vec<(String, String, String)>,
    /// The value each key's writer last sent (acknowledged or not).
    last_sent: std::collections::HashMap<String, String>,
}

/// `cairn serve` killed with SIGKILL while eight clients write: after a restart, every
/// write it acknowledged reads back by uid with its value, each key's head is its last
/// acknowledged write or the one in flight at the kill, and the store verifies intact.
#[test]
fn a_node_killed_mid_writes_keeps_every_acknowledged_write() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let u = User::new();
    let data = u.path().join("node");
    let acks = Arc::new(Mutex::new(Acks::default()));
    for round in 0..3u64 {
        let (mut node, base) = spawn_node(&u, &data);
        if round == 0 {
            create_open_bucket(&base, "pub");
        }
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..8)
            .map(|w| {
                let (base, stop, acks) = (base.clone(), stop.clone(), acks.clone());
                std::thread::spawn(move || {
                    let http = reqwest::blocking::Client::new();
                    let key = format!("k{w}");
                    for i in 0.. {
                        if stop.load(Ordering::Relaxed) {
                            return;
                        }
                        // Every few writes a larger blob, so the kill also lands mid-upload.
                        let size = if i % 5 == 4 { 300_000 } else { 40 };
                        let mut value = format!("round {round} writer {w} write {i} ");
                        while value.len() < size {
                            value.push_str("0123456789abcdef");
                        }
                        acks.lock()
                            .unwrap()
                            .last_sent
                            .insert(key.clone(), value.clone());
                        let Ok(resp) = http
                            .put(format!("{base}/v1/buckets/pub/objects/{key}"))
                            .body(value.clone())
                            .send()
                        else {
                            return;
                        };
                        if resp.status().as_u16() != 201 {
                            return;
                        }
                        let Ok(body) = resp.text() else {
                            return;
                        };
                        let body: serde_json::Value = serde_json::from_str(&body).unwrap();
                        let uid = body["uid"].as_str().unwrap().to_string();
                        acks.lock().unwrap().acked.push((key.clone(), uid, value));
                    }
                })
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(400 + 300 * round));
        node.kill().unwrap();
        node.wait().unwrap();
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            w.join().unwrap();
        }
    }
    let acks = acks.lock().unwrap();
    assert!(
        acks.acked.len() >= 24,
        "only {} writes acknowledged",
        acks.acked.len()
    );
    let (mut node, base) = spawn_node(&u, &data);
    let http = reqwest::blocking::Client::new();
    let read = |key: &str, at: &str| {
        let resp = http
            .get(format!("{base}/v1/buckets/pub/objects/{key}?{at}"))
            .send()
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200, "{key} at {at}");
        String::from_utf8(resp.bytes().unwrap().to_vec()).unwrap()
    };
    for (key, uid, value) in &acks.acked {
        assert!(read(key, &format!("uid={uid}")) == *value, "{key} {uid}");
    }
    for w in 0..8 {
        let key = format!("k{w}");
        let head = read(&key, "branch=master");
        let last_acked = acks.acked.iter().rev().find(|a| a.0 == key).map(|a| &a.2);
        assert!(
            Some(&head) == last_acked || Some(&head) == acks.last_sent.get(&key),
            "{key}'s head is neither its last acknowledged write nor the one in flight"
        );
    }
    node.kill().unwrap();
    node.wait().unwrap();
    let local = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_cairn"))
            .arg("--data")
            .arg(&data)
            .args(args)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "cairn {args:?}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    };
    // The bucket the writers wrote (a bare verify checked the empty default bucket).
    assert!(local(&["--bucket", "pub", "verify"]).starts_with("intact"));
    // Each head is a signed record of the bucket's capsule.
    for w in 0..8 {
        let key = format!("k{w}");
        let proof = local(&["--bucket", "pub", "verify", "--proof", &key]);
        assert!(proof.ends_with("proof OK\n"), "{proof}");
    }
}

/// A node raises its soft limit on open files to the hard limit: it keeps a descriptor
/// per sealed segment and per connection, and a soft limit of 1024 failed a store of about
/// 250 GiB.
#[cfg(target_os = "linux")]
#[test]
fn a_node_raises_its_open_file_limit() {
    use std::os::unix::process::CommandExt;
    let u = User::new();
    let data = u.path().join("node");
    let (mut node, _base) = spawn_node_with(&u, &data, |c| {
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            c.pre_exec(|| {
                let limit = libc::rlimit {
                    rlim_cur: 64,
                    rlim_max: 1000,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    });
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", node.id())).unwrap();
    let _ = node.kill();
    let _ = node.wait();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let nums: Vec<&str> = line.split_whitespace().skip(3).take(2).collect();
    assert_eq!(nums, ["1000", "1000"], "{line}");
}

/// A full disk, here the node's file size limit (`RLIMIT_FSIZE`, which fails a write past
/// it as a full disk does, with `EFBIG` instead of `ENOSPC`): the write that hits it fails
/// with 507, later writes with 503, `/healthz` turns 503 with the reason and the metrics
/// say so, and acknowledged writes are still read. Restarted with room again, the node has
/// every acknowledged write, takes new ones and verifies intact.
#[test]
fn a_full_disk_fails_writes_and_keeps_acknowledged_ones() {
    use std::os::unix::process::CommandExt;
    let u = User::new();
    let data = u.path().join("node");
    let limited = |c: &mut Command| {
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            c.pre_exec(|| {
                let limit = libc::rlimit {
                    rlim_cur: 6 << 20,
                    rlim_max: 6 << 20,
                };
                if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // A write past the limit then fails with EFBIG instead of killing.
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                Ok(())
            });
        }
    };
    let (mut node, base) = spawn_node_with(&u, &data, limited);
    create_open_bucket(&base, "pub");
    let http = reqwest::blocking::Client::new();
    let put = |key: &str, value: Vec<u8>| {
        let resp = http
            .put(format!("{base}/v1/buckets/pub/objects/{key}"))
            .body(value)
            .send()
            .unwrap();
        (resp.status().as_u16(), resp.text().unwrap())
    };
    let mut acked = Vec::new();
    let mut refused = None;
    for i in 0..64 {
        let value = pseudo_random(200_000, 1000 + 2 * i);
        let (status, body) = put(&format!("k{i}"), value.clone());
        if status != 201 {
            refused = Some((status, body));
            break;
        }
        let body: serde_json::Value = serde_json::from_str(&body).unwrap();
        acked.push((i, body["uid"].as_str().unwrap().to_string(), value));
    }
    let (status, body) = refused.expect("6 MiB cannot hold 64 distinct values of 200 KB");
    assert!(
        acked.len() >= 5,
        "only {} writes before the limit",
        acked.len()
    );
    assert_eq!(status, 507, "{body}");
    assert!(body.contains("insufficient_storage"), "{body}");
    assert!(body.contains("nothing was committed"), "{body}");
    // The store takes no more writes; the reason is given, and health and metrics say so.
    let (status, body) = put("after", b"small".to_vec());
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("refuses writes"), "{body}");
    let health = http.get(format!("{base}/healthz")).send().unwrap();
    assert_eq!(health.status().as_u16(), 503);
    let why = health.text().unwrap();
    assert!(
        why.contains("refuses writes") && why.contains("too large"),
        "{why}"
    );
    let metrics = http
        .get(format!("{base}/metrics"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert!(
        metrics.lines().any(|l| l == "cairn_store_writable 0"),
        "{metrics}"
    );
    // Reads go on.
    let read = |base: &str, key: String, uid: &str| {
        let resp = http
            .get(format!("{base}/v1/buckets/pub/objects/{key}?uid={uid}"))
            .send()
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200, "{key}");
        resp.bytes().unwrap().to_vec()
    };
    for (i, uid, value) in &acked {
        assert!(read(&base, format!("k{i}"), uid) == *value, "k{i}");
    }
    node.kill().unwrap();
    node.wait().unwrap();
    // Room again: every acknowledged write is there, new writes land, health is back.
    let (mut node, base) = spawn_node(&u, &data);
    for (i, uid, value) in &acked {
        assert!(
            read(&base, format!("k{i}"), uid) == *value,
            "k{i} after the restart"
        );
    }
    let resp = http
        .put(format!("{base}/v1/buckets/pub/objects/after"))
        .body("small")
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 201);
    let health = http.get(format!("{base}/healthz")).send().unwrap();
    assert_eq!(health.status().as_u16(), 200);
    node.kill().unwrap();
    node.wait().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .arg("--data")
        .arg(&data)
        // The bucket written (a bare verify checked the empty default bucket).
        .args(["--bucket", "pub", "verify"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "verify: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A write's answer is checked, not trusted: the uid must parse and name a version of the
/// key (its Meta chunk read back and hashed against it) holding what was written, so a
/// node cannot have the client print (and its user anchor) a made-up or older version.
#[test]
fn writes_refuse_a_version_the_node_made_up() {
    let s = Server::start();
    let u = User::new();
    let srv = Some(s.base.as_str());
    let old = u
        .ok(srv, &["put", "k", "--value", "old"])
        .trim()
        .to_string();
    let other = u
        .ok(srv, &["put", "o", "--value", "new"])
        .trim()
        .to_string();
    let small = u
        .ok(srv, &["put", "b", "--type", "blob", "--value", "old"])
        .trim()
        .to_string();
    let big = u.path().join("big");
    std::fs::write(&big, pseudo_random(300_000, 7)).unwrap();
    let file = u
        .ok(srv, &["put", "f", "--file", big.to_str().unwrap()])
        .trim()
        .to_string();
    let http = reqwest::blocking::Client::new();
    let get = |url: String| http.get(url).send().unwrap().bytes().unwrap().to_vec();
    let info = get(format!("{}/v1/buckets/default", s.base));
    let meta = |key: &str, uid: &str| {
        get(format!(
            "{}/v1/buckets/default/stream/{key}?uid={uid}&meta=true",
            s.base
        ))
    };
    // The client asks for the bucket's details, sends the write, then reads the version
    // back: the liar answers those three in turn.
    let liar = |etag: &str, answer: &str, stream: Vec<u8>| {
        lying_node_seq(
            format!("ETag: \"{etag}\"\r\nContent-Type: application/vnd.cairn.version-stream\r\n"),
            vec![info.clone(), answer.as_bytes().to_vec(), stream],
        )
    };
    let short = pseudo_random(299_999, 7);
    let shorter = u.path().join("shorter");
    std::fs::write(&shorter, &short).unwrap();
    // As long as the file the version holds, one byte in the middle changed.
    let mut changed = pseudo_random(300_000, 7);
    changed[150_000] ^= 1;
    let same_len = u.path().join("same-length");
    std::fs::write(&same_len, &changed).unwrap();
    // A string as long as the one the older version holds.
    let same_string = u.path().join("same-string");
    std::fs::write(&same_string, b"olD").unwrap();
    for (what, node, args) in [
        (
            "not a uid",
            liar(&old, r#"{"uid":"latest"}"#, Vec::new()),
            vec!["put", "k", "--value", "new"],
        ),
        (
            "the older version",
            liar(&old, &format!(r#"{{"uid":"{old}"}}"#), meta("k", &old)),
            vec!["put", "k", "--value", "new"],
        ),
        (
            "another key's version with the same value",
            liar(
                &other,
                &format!(r#"{{"uid":"{other}"}}"#),
                meta("o", &other),
            ),
            vec!["put", "k", "--value", "new"],
        ),
        (
            "a blob of another length",
            liar(&file, &format!(r#"{{"uid":"{file}"}}"#), meta("f", &file)),
            vec!["put", "f", "--file", shorter.to_str().unwrap()],
        ),
        (
            "a blob of the same length with other bytes",
            liar(&file, &format!(r#"{{"uid":"{file}"}}"#), meta("f", &file)),
            vec!["put", "f", "--file", same_len.to_str().unwrap()],
        ),
        (
            "an inline blob of the same length with other bytes",
            liar(
                &small,
                &format!(r#"{{"uid":"{small}"}}"#),
                meta("b", &small),
            ),
            vec!["put", "b", "--type", "blob", "--value", "olD"],
        ),
        (
            "the older string, for one sent from a file",
            liar(&old, &format!(r#"{{"uid":"{old}"}}"#), meta("k", &old)),
            vec![
                "put",
                "k",
                "--type",
                "string",
                "--file",
                same_string.to_str().unwrap(),
            ],
        ),
        (
            "a fork elsewhere than asked",
            liar(&old, &format!(r#"{{"uid":"{old}"}}"#), meta("k", &old)),
            vec!["fork", "k", "--from", &file, "--to", "x"],
        ),
    ] {
        let out = u.run(Some(&node), &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(11), "{what}: {err}");
        assert!(out.stdout.is_empty(), "{what}: printed {:?}", out.stdout);
        if what.contains("other bytes") {
            assert!(
                err.contains("holds other bytes than the ones sent"),
                "{what}: {err}"
            );
        }
    }
}

/// `bucket --metadata-out` against a node whose metadata does not hash to the capsule it
/// reports prints nothing (the bucket's lines came before the check) and writes no file.
#[test]
fn bucket_metadata_out_prints_nothing_before_its_check() {
    let u = User::new();
    let key = cairn_core::SigningKey::from_seed(&[8; 32]);
    let meta = cairn_capsule::CapsuleMetadata::new(cairn_core::HashAlgo::Blake3, key.public(), "x");
    let other =
        cairn_capsule::CapsuleMetadata::new(cairn_core::HashAlgo::Blake3, key.public(), "y");
    let info = serde_json::json!({
        "capsule": other.name().to_string(),
        "writers": [key.public().to_string()],
        "owner": key.public().to_string(),
    });
    let liar = lying_node_seq(
        "Content-Type: application/json\r\n".into(),
        vec![info.to_string().into_bytes(), meta.encode()],
    );
    let file = u.path().join("meta.bin");
    let out = u.run(
        Some(&liar),
        &["bucket", "--metadata-out", file.to_str().unwrap()],
    );
    assert_eq!(
        out.status.code(),
        Some(11),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(!file.exists());
}

/// A node that names another bucket's capsule (of the same owner key: one key owns every
/// bucket the CLI creates) cannot have the owner seal a put for that bucket: the CLI checks
/// that the capsule's metadata names this bucket and this owner before sealing (exit 11,
/// nothing sent).
#[test]
fn a_put_is_not_sealed_for_a_capsule_the_node_names_falsely() {
    let s = Server::start();
    let u = User::new();
    let srv = Some(s.base.as_str());
    u.ok(srv, &["--bucket", "photos", "put", "a", "--value", "1"]);
    u.ok(srv, &["--bucket", "backups", "put", "b", "--value", "2"]);
    let other: serde_json::Value = serde_json::from_slice(
        &reqwest::blocking::get(format!("{}/v1/buckets/backups", s.base))
            .unwrap()
            .bytes()
            .unwrap(),
    )
    .unwrap();
    let liar = intercepting_node(s.base.clone(), "GET", other.to_string());
    let out = u.run(
        Some(&liar),
        &["--bucket", "photos", "put", "k", "--value", "x"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(11), "{err}");
    assert!(err.contains("for bucket \"backups\""), "{err}");
    for bucket in ["photos", "backups"] {
        u.fails(srv, &["--bucket", bucket, "get", "k"], 3);
    }
}

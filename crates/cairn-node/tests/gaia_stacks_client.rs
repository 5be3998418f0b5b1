//! The real-client compatibility test: the published `@stacks/storage` npm package (and
//! `@stacks/auth`, which it uses), unchanged, against the node's Gaia hub on a loopback
//! socket. `tests/stacks-client/client.mjs` connects, uploads, puts files plain,
//! encrypted, signed and both, gets them back, lists and deletes them.
//!
//! The npm packages are installed with `npm ci` from the committed `package-lock.json`
//! into a cache directory outside the clone (`$CAIRN_STACKS_CLIENT_DIR`, else
//! `~/.cache/cairn-stacks-client/<hash of the lock file>`), once. Node.js and npm must
//! be installed: without them the test fails and says so.

mod gaia_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gaia_support::Hub;
use sha2::{Digest, Sha256};

const SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/stacks-client");

fn tool_version(tool: &str) -> String {
    match Command::new(tool).arg("--version").output() {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
        _ => panic!(
            "`{tool}` is not installed or does not run: the @stacks/storage compatibility \
             test needs Node.js 18+ and npm (e.g. `apt-get install nodejs npm`)"
        ),
    }
}

/// The directory holding the client with its npm packages installed.
fn client_dir() -> PathBuf {
    let lock = std::fs::read(Path::new(SRC).join("package-lock.json")).expect("package-lock.json");
    let manifest = std::fs::read(Path::new(SRC).join("package.json")).expect("package.json");
    let mut h = Sha256::new();
    h.update(&lock);
    h.update(&manifest);
    let tag = hex::encode(&h.finalize()[..8]);
    let dir = match std::env::var_os("CAIRN_STACKS_CLIENT_DIR") {
        Some(d) => PathBuf::from(d),
        None => {
            let base = std::env::var_os("HOME")
                .map(|h| PathBuf::from(h).join(".cache"))
                .unwrap_or_else(std::env::temp_dir);
            base.join("cairn-stacks-client").join(tag)
        }
    };
    std::fs::create_dir_all(&dir).expect("client cache dir");
    let installed = dir
        .join("node_modules/@stacks/storage/package.json")
        .exists()
        && std::fs::read(dir.join("package-lock.json")).ok().as_deref() == Some(&lock[..]);
    if !installed {
        std::fs::write(dir.join("package.json"), &manifest).unwrap();
        std::fs::write(dir.join("package-lock.json"), &lock).unwrap();
        let out = Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
            .current_dir(&dir)
            .output()
            .expect("running npm ci");
        assert!(
            out.status.success(),
            "npm ci failed in {}:\n{}\n{}",
            dir.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The script sits beside its node_modules so its imports resolve there.
    std::fs::copy(Path::new(SRC).join("client.mjs"), dir.join("client.mjs")).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stacks_storage_client_against_the_hub() {
    let node_version = tool_version("node");
    tool_version("npm");
    let major: u32 = node_version
        .trim_start_matches('v')
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    assert!(
        major >= 18,
        "Node.js {node_version} is too old: 18+ (global fetch) needed"
    );
    let dir = tokio::task::spawn_blocking(client_dir).await.unwrap();
    let hub = Hub::start(64 << 20).await;
    let base = hub.base.clone();
    let (ok, output) = tokio::task::spawn_blocking(move || {
        let mut child = Command::new("node")
            .arg("client.mjs")
            .arg(&base)
            .current_dir(&dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting node");
        let start = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().expect("waiting for node") {
                break Some(s);
            }
            if start.elapsed() > Duration::from_secs(120) {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut out = String::new();
        if let Some(mut s) = child.stdout.take() {
            let _ = std::io::Read::read_to_string(&mut s, &mut out);
        }
        if let Some(mut s) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut s, &mut out);
        }
        (status.is_some_and(|s| s.success()), out)
    })
    .await
    .unwrap();
    println!("{output}");
    assert!(
        ok,
        "the @stacks/storage client failed (or timed out):\n{output}"
    );
    assert!(output.contains(" passed, 0 failed"), "{output}");
    assert!(!output.contains("FAIL"), "{output}");
}

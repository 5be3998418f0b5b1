//! End-to-end tests of the `cairn` binary: outputs, exit codes, tamper detection, crash
//! safety under kill -9, and constant-memory streaming of a 2 GiB blob.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};

mod support;

fn cairn(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cairn"))
        .arg("--data")
        .arg(dir)
        .env("CAIRN_KEY_FILE", dir.join("writer.key"))
        .args(args)
        .output()
        .expect("run cairn")
}

fn ok(dir: &Path, args: &[&str]) -> String {
    let out = cairn(dir, args);
    assert!(
        out.status.success(),
        "cairn {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf8 stdout")
}

fn fails(dir: &Path, args: &[&str], code: i32) -> String {
    let out = cairn(dir, args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "cairn {args:?}: {err}");
    // One error line, last; merge conflicts are listed above it.
    let last = err.lines().last().unwrap_or_default();
    assert!(last.starts_with("error: "), "stderr: {err}");
    assert_eq!(err.matches("error: ").count(), 1, "stderr: {err}");
    assert!(!err.contains("panicked"), "stderr: {err}");
    err
}

#[test]
fn typed_values_round_trip() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let uid = ok(dir, &["put", "s", "--value", "hello"]);
    assert_eq!(uid.trim().len(), 68);
    assert_eq!(ok(dir, &["get", "s"]), "hello");
    assert_eq!(ok(dir, &["get", "s", "--uid", uid.trim()]), "hello");
    // `--file -` is stdin.
    let mut child = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .arg("--data")
        .arg(dir)
        .env("CAIRN_KEY_FILE", dir.join("writer.key"))
        .args(["put", "from-stdin", "--file", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"piped").unwrap();
    assert!(child.wait_with_output().unwrap().status.success());
    assert_eq!(ok(dir, &["get", "from-stdin"]), "piped");
    // --meta honours --out.
    let meta = dir.join("meta.txt");
    assert_eq!(
        ok(
            dir,
            &["get", "s", "--meta", "--out", meta.to_str().unwrap()]
        ),
        ""
    );
    let text = std::fs::read_to_string(&meta).unwrap();
    assert!(
        text.starts_with(&format!("uid: {}\nkey: s\n", uid.trim())),
        "{text}"
    );
    ok(dir, &["put", "n", "--type", "integer", "--value", "40"]);
    ok(dir, &["update", "n", "--add", "2"]);
    assert_eq!(ok(dir, &["get", "n"]), "42\n");
    // One operation per update: two are refused, and nothing changes.
    fails(dir, &["update", "n", "--add", "5", "--multiply", "2"], 8);
    assert_eq!(ok(dir, &["get", "n"]), "42\n");
    ok(dir, &["put", "m", "--type", "map", "--value", "b=2\na=1\n"]);
    ok(dir, &["update", "m", "--set", "c=3", "--unset", "a"]);
    assert_eq!(ok(dir, &["get", "m"]), "b=2\nc=3\n");
    ok(dir, &["put", "l", "--type", "list", "--value", "x\ny\n"]);
    assert_eq!(ok(dir, &["get", "l"]), "x\ny\n");
    ok(dir, &["put", "st", "--type", "set", "--value", "q\np\nq"]);
    assert_eq!(ok(dir, &["get", "st"]), "p\nq\n");
    ok(dir, &["put", "t", "--type", "tuple", "--value", "1\n2"]);
    assert_eq!(ok(dir, &["get", "t"]), "1\n2\n");
    let keys = ok(dir, &["keys"]);
    assert_eq!(keys, "from-stdin\nl\nm\nn\ns\nst\nt\n");
    let meta = ok(dir, &["get", "m", "--meta"]);
    assert!(
        meta.contains("type: map") && meta.contains("depth: 1"),
        "{meta}"
    );
}

#[test]
fn branches_merge_log_diff_lca() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let v1 = ok(dir, &["put", "doc", "--value", "base"])
        .trim()
        .to_string();
    ok(dir, &["fork", "doc", "--from", "master", "--to", "dev"]);
    let v2 = ok(
        dir,
        &["put", "doc", "--branch", "dev", "--value", "dev edit"],
    )
    .trim()
    .to_string();
    let v3 = ok(
        dir,
        &["put", "doc", "--value", "main edit", "--context", "second"],
    )
    .trim()
    .to_string();
    assert_eq!(ok(dir, &["lca", "doc", &v2, &v3]).trim(), v1);
    let branches = ok(dir, &["branches", "doc"]);
    assert!(
        branches.contains(&format!("dev\t{v2}")) && branches.contains(&format!("master\t{v3}"))
    );
    let err = fails(
        dir,
        &["merge", "doc", "--into", "master", "--from", "dev"],
        5,
    );
    assert!(err.contains("nothing was written"), "{err}");
    assert_eq!(ok(dir, &["get", "doc"]), "main edit");
    ok(
        dir,
        &[
            "merge",
            "doc",
            "--into",
            "master",
            "--from",
            "dev",
            "--resolve",
            "theirs",
        ],
    );
    assert_eq!(ok(dir, &["get", "doc"]), "dev edit");
    let log = ok(dir, &["log", "doc"]);
    assert_eq!(log.lines().count(), 4, "{log}");
    assert!(log.lines().next().unwrap().contains("merge of"), "{log}");
    assert!(log.contains("second"));
    let diff = ok(dir, &["diff", "doc", &v1, &v3]);
    assert_eq!(diff, "- base\n+ main edit\n");
    // Fork on conflict through the CLI.
    ok(dir, &["put", "doc", "--base", &v1, "--value", "a"]);
    ok(dir, &["put", "doc", "--base", &v1, "--value", "b"]);
    assert_eq!(
        ok(dir, &["branches", "doc", "--untagged"]).lines().count(),
        2
    );
    // The tagged listing points at them.
    let out = cairn(dir, &["branches", "doc"]);
    assert!(out.status.success());
    let note = String::from_utf8_lossy(&out.stderr);
    assert!(note.contains("2 untagged head(s)"), "{note}");
    ok(dir, &["merge", "doc", "--untagged", "--resolve", "append"]);
    assert_eq!(
        ok(dir, &["branches", "doc", "--untagged"]).lines().count(),
        1
    );
    ok(dir, &["rename", "doc", "dev", "wip"]);
    ok(dir, &["remove", "doc", "wip"]);
    assert_eq!(ok(dir, &["branches", "doc"]).lines().count(), 1);

    // Removing a key's last branch says so, and forking one of its versions restores it.
    let uid = ok(dir, &["put", "solo", "--value", "s"]).trim().to_string();
    let out = cairn(dir, &["remove", "solo", "master"]);
    assert!(out.status.success());
    let note = String::from_utf8_lossy(&out.stderr);
    assert!(
        note.contains("no branch left") && note.contains(&uid),
        "{note}"
    );
    assert!(!ok(dir, &["keys"]).lines().any(|k| k == "solo"));
    ok(dir, &["fork", "solo", "--from", &uid, "--to", "master"]);
    assert_eq!(ok(dir, &["get", "solo"]), "s");
    // A put on a version of a key whose last branch was removed brings the key back too
    // (as an untagged head).
    let solo2 = ok(dir, &["put", "solo2", "--value", "t"])
        .trim()
        .to_string();
    assert!(cairn(dir, &["remove", "solo2", "master"]).status.success());
    ok(dir, &["put", "solo2", "--base", &solo2, "--value", "u"]);
    assert_eq!(
        ok(dir, &["branches", "solo2", "--untagged"])
            .lines()
            .count(),
        1
    );
}

/// A streamed put is refused for its target before its input is read: a branch typo,
/// another type on the key or a stale guard were found only once the whole input was read
/// and stored (here the input never ends, so reading it first would not finish).
#[test]
fn a_streamed_put_is_refused_before_its_input_is_read() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    ok(dir, &["put", "k", "--value", "a string"]);
    let stale = ok(dir, &["put", "b", "--value", "v", "--type", "blob"])
        .trim()
        .to_string();
    ok(dir, &["put", "b", "--value", "w", "--type", "blob"]);
    for (args, code) in [
        (
            &["put", "k", "--file", "/dev/zero", "--branch", "typo"][..],
            3,
        ),
        (&["put", "k", "--file", "/dev/zero"], 7),
        (&["put", "b", "--file", "/dev/zero", "--guard", &stale], 4),
        (&["put", "k", "--file", "/dev/zero", "--type", "list"], 7),
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_cairn"))
            .arg("--data")
            .arg(dir)
            .env("CAIRN_KEY_FILE", dir.join("writer.key"))
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("cairn {args:?} was still reading its input after 60 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        assert_eq!(status.code(), Some(code), "cairn {args:?}");
    }
    assert_eq!(ok(dir, &["get", "k"]), "a string");
}

/// A write refused for its input or arguments creates nothing: no store, no key, and no
/// capsule for a bucket (a bucket's first write claims it for the writer's key, so a
/// refused one kept its rightful owner out).
#[test]
fn a_refused_write_creates_nothing() {
    let d = tempfile::tempdir().unwrap();
    let fresh = d.path().join("fresh");
    let sub = d.path().join("a-directory");
    std::fs::create_dir(&sub).unwrap();
    let e = fails(&fresh, &["put", "k", "--file", sub.to_str().unwrap()], 8);
    assert!(e.contains("is a directory"), "{e}");
    fails(&fresh, &["--bucket", "Prod", "put", "k", "--value", "v"], 8);
    let uid = "1e20".repeat(17);
    fails(&fresh, &["put", "k", "--value", "v", "--guard", &uid], 4);
    fails(&fresh, &["put", "k", "--value", "v", "--base", &uid], 3);
    // A bad key or branch name, inline or streamed.
    fails(&fresh, &["put", "", "--value", "x"], 8);
    fails(&fresh, &["put", "k", "--branch", "a b", "--value", "x"], 8);
    let f = d.path().join("input");
    std::fs::write(&f, b"bytes").unwrap();
    fails(&fresh, &["put", "", "--file", f.to_str().unwrap()], 8);
    assert!(!fresh.exists(), "nothing created at {}", fresh.display());
    assert!(!d.path().join("fresh/writer.key").exists());

    // In a store: the bucket is not claimed by a write that fails its guard, base or
    // source.
    let dir = d.path().join("store");
    ok(&dir, &["put", "k", "--value", "v"]);
    fails(
        &dir,
        &[
            "--bucket", "prod", "put", "k", "--value", "v", "--guard", &uid,
        ],
        4,
    );
    fails(
        &dir,
        &[
            "--bucket", "prod", "put", "k", "--value", "v", "--base", &uid,
        ],
        3,
    );
    fails(
        &dir,
        &["--bucket", "prod", "fork", "k", "--from", &uid, "--to", "x"],
        3,
    );
    // Nor by one naming a version of another bucket, which the new bucket cannot hold.
    let elsewhere = ok(&dir, &["put", "k2", "--value", "v"]).trim().to_string();
    for args in [
        &[
            "--bucket", "prod", "put", "k", "--value", "v", "--base", &elsewhere,
        ][..],
        &[
            "--bucket", "prod", "fork", "k", "--from", &elsewhere, "--to", "x",
        ],
    ] {
        fails(&dir, args, 3);
    }
    // A bucket whose keys were all removed keeps its capsule: its versions come back.
    let solo = d.path().join("solo");
    let v = ok(&solo, &["put", "solo", "--value", "s"])
        .trim()
        .to_string();
    ok(&solo, &["remove", "solo", "master"]);
    ok(&solo, &["fork", "solo", "--from", &v, "--to", "master"]);
    assert_eq!(ok(&solo, &["get", "solo"]), "s");
    ok(&solo, &["remove", "solo", "master"]);
    ok(&solo, &["put", "solo", "--value", "t", "--base", &v]);
    // A streamed put to a branch that cannot be made is refused before a new bucket's
    // capsule is made.
    let f = d.path().join("input.bin");
    std::fs::write(&f, b"bytes").unwrap();
    fails(
        &dir,
        &[
            "--bucket",
            "fresh2",
            "put",
            "k",
            "--branch",
            "bad name",
            "--file",
            f.to_str().unwrap(),
        ],
        8,
    );
    // A guard with a base is refused as such (exit 8), before anything is made.
    fails(
        &fresh,
        &["put", "k", "--value", "v", "--base", &uid, "--guard", &uid],
        8,
    );
    assert!(!fresh.exists());
    let owner = d.path().join("owner.key");
    for bucket in ["prod", "fresh2"] {
        let out = Command::new(env!("CARGO_BIN_EXE_cairn"))
            .arg("--data")
            .arg(&dir)
            .env("CAIRN_KEY_FILE", &owner)
            .args(["--bucket", bucket, "put", "k", "--value", "mine"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "bucket {bucket} was claimed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn errors_are_one_clear_line_and_change_nothing() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let v1 = ok(dir, &["put", "k", "--value", "v"]).trim().to_string();
    fails(dir, &["get", "nope"], 3);
    fails(dir, &["get", "k", "--branch", "nope"], 3);
    fails(dir, &["put", "k", "--value", "w", "--branch", "typo"], 3);
    let other = ok(dir, &["put", "k2", "--value", "x"]).trim().to_string();
    fails(dir, &["put", "k", "--value", "w", "--guard", &other], 4);
    fails(dir, &["put", "k", "--value", "1", "--type", "integer"], 7);
    fails(dir, &["update", "k", "--add", "1"], 7);
    fails(dir, &["put", "n", "--value", "x1", "--type", "integer"], 8);
    fails(dir, &["put", "m", "--value", "novalue", "--type", "map"], 8);
    fails(dir, &["fork", "k", "--from", "master", "--to", "master"], 8);
    fails(dir, &["get", "k", "--uid", &"1e20".repeat(17)], 3);
    // Another key's version is not a version of this key: not found, as over a node.
    let e = fails(dir, &["lca", "k", &v1, &other], 3);
    assert!(e.contains("it is a version of key \"k2\""), "{e}");
    fails(dir, &["get", "k", "--uid", &other], 3);
    // Arguments the parser refuses are bad input too: one line, exit 8.
    let e = fails(dir, &["get", "k", "--uid", "zz"], 8);
    assert!(e.contains("--uid"), "{e}");
    let e = fails(dir, &["--durability", "bogus", "keys"], 8);
    assert!(e.contains("expected fsync, group or buffered"), "{e}");
    fails(dir, &["put", "k", "--value", "v", "--no-such-flag"], 8);
    fails(dir, &["--lock-timeout", "inf", "keys"], 8);
    // Uids name untagged heads to merge, with --untagged only (they were ignored).
    fails(
        dir,
        &["merge", "k", "--into", "master", "--from", "dev", &v1],
        8,
    );
    fails(dir, &["--lock-timeout", "1e20", "keys"], 8);
    // No command at all: the help, and the exit status of a refused command line.
    let bare = Command::new(env!("CARGO_BIN_EXE_cairn")).output().unwrap();
    assert_eq!(bare.status.code(), Some(8));
    assert!(String::from_utf8_lossy(&bare.stderr).contains("Usage"));
    // A context HTTP would change on the way to a node (its spaces trimmed).
    let e = fails(dir, &["put", "k", "--value", "w", "--context", "fix "], 8);
    assert!(e.contains("space"), "{e}");
    fails(dir, &["put", "k", "--value", "w", "--context", " fix"], 8);
    // Client-mode input checked before any request is sent.
    let e = fails(dir, &["--server", "localhost:3917", "keys"], 8);
    assert!(e.contains("http://"), "{e}");
    let e = fails(
        dir,
        &["--server", "http://127.0.0.1:9", "put", "", "--value", "1"],
        8,
    );
    assert!(e.contains("key must not be empty"), "{e}");
    // `serve` is not a client: a CAIRN_SERVER exported for the shell does not stop it (here
    // it gets as far as refusing its own bad listen address).
    let out = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .arg("--data")
        .arg(dir)
        .env("CAIRN_SERVER", "http://127.0.0.1:9")
        .args(["serve", "--listen", "nonsense"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(8), "{err}");
    assert!(err.contains("nonsense"), "{err}");
    // A read of a data directory that does not exist does not create one, nor does a read
    // of a directory that is not a store turn it into one.
    let missing = dir.join("no-such-store");
    fails(&missing, &["keys"], 3);
    assert!(!missing.exists());
    let plain = dir.join("plain-dir");
    std::fs::create_dir(&plain).unwrap();
    fails(&plain, &["keys"], 3);
    assert_eq!(std::fs::read_dir(&plain).unwrap().count(), 0);
    let e = fails(dir, &["get"], 8);
    assert!(e.contains("not provided: <KEY>"), "{e}");
    // A write with bad input creates nothing: no store, no key, no bucket capsule.
    let fresh = dir.join("fresh");
    fails(
        &fresh,
        &["put", "n", "--value", "x1", "--type", "integer"],
        8,
    );
    fails(&fresh, &["put", "f", "--file", "/nonexistent/input"], 10);
    fails(&fresh, &["update", "k", "--add", "1"], 3);
    fails(&fresh, &["fork", "k", "--from", "master", "--to", "x"], 3);
    fails(
        &fresh,
        &["merge", "k", "--into", "master", "--from", "dev", &v1],
        8,
    );
    assert!(!fresh.exists(), "nothing was created");
    fails(
        dir,
        &[
            "--bucket", "prod", "put", "n", "--value", "x1", "--type", "integer",
        ],
        8,
    );
    fails(dir, &["--bucket", "prod", "rename", "k", "master", "x"], 3);
    let other_key = dir.join("other.key");
    let out = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .arg("--data")
        .arg(dir)
        .arg("--key-file")
        .arg(&other_key)
        .args(["--bucket", "prod", "put", "k", "--value", "v"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the bucket is still free for another key: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Files the command cannot read or write: I/O errors.
    fails(dir, &["put", "f", "--file", "/nonexistent/input"], 10);
    fails(dir, &["get", "k", "--out", "/nonexistent/dir/out"], 10);
    assert_eq!(ok(dir, &["get", "k"]), "v");
    assert_eq!(ok(dir, &["log", "k"]).lines().count(), 1);
}

#[test]
fn verify_detects_flipped_bytes_in_the_data_dir() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let mut x = 0x2545F4914F6CDD1Du64;
    let data: Vec<u8> = (0..400_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let f = dir.join("input.bin");
    std::fs::write(&f, &data).unwrap();
    let store = dir.join("store");
    let uid = ok(&store, &["put", "doc", "--file", f.to_str().unwrap()])
        .trim()
        .to_string();
    assert!(ok(&store, &["verify"]).starts_with("intact"));
    // Flip one byte in the middle of the largest file in the store (the chunk log).
    let mut files: Vec<_> = std::fs::read_dir(&store)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort_by_key(|p| std::fs::metadata(p).unwrap().len());
    let seg = files.last().unwrap();
    let mut bytes = std::fs::read(seg).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(seg, &bytes).unwrap();
    let err = fails(&store, &["verify"], 6);
    // Either the version is named as damaged, or (when the flip hit the last write group,
    // which recovery cannot tell from a torn write) recovery names the commit it cut.
    assert!(
        err.contains("\"doc\"") || err.contains("bucket/default/doc"),
        "{err}"
    );
    assert!(err.contains(&uid) || err.contains("not applied"), "{err}");
    // The damage stays reported (and GC refuses) until an operator clears it.
    fails(&store, &["verify"], 6);
    fails(&store, &["gc"], 6);
    // Reading the damaged blob fails loudly rather than returning wrong bytes, and leaves
    // no partial file behind: the output file is replaced whole or not at all.
    let out_path = dir.join("out.bin");
    let out = cairn(&store, &["get", "doc", "--out", out_path.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(!out_path.exists());
    std::fs::write(&out_path, b"kept").unwrap();
    let out = cairn(&store, &["get", "doc", "--out", out_path.to_str().unwrap()]);
    assert!(!out.status.success());
    assert_eq!(std::fs::read(&out_path).unwrap(), b"kept");
    let leftovers: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".cairn-out-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// Kills a writer with SIGKILL in the middle of a streamed put; every acknowledged
/// version must read back intact and verify must pass.
#[test]
fn acknowledged_writes_survive_kill_9() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let mut acked = Vec::new();
    for i in 0..20 {
        let v = format!("version {i}");
        let uid = ok(dir, &["put", "k", "--value", &v]).trim().to_string();
        acked.push((uid, v));
    }
    for round in 0..3 {
        let mut child = Command::new(env!("CARGO_BIN_EXE_cairn"))
            .arg("--data")
            .arg(dir)
            .env("CAIRN_KEY_FILE", dir.join("writer.key"))
            .args(["put", &format!("big{round}")])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let block: Vec<u8> = (0..1u32 << 20)
            .map(|i| (i.wrapping_mul(31 + round) >> 3) as u8)
            .collect();
        for _ in 0..(8 + round * 5) {
            if stdin.write_all(&block).is_err() {
                break;
            }
        }
        child.kill().unwrap();
        let _ = child.wait();
        drop(stdin);
        let uid = ok(
            dir,
            &["put", "k", "--value", &format!("after crash {round}")],
        )
        .trim()
        .to_string();
        acked.push((uid, format!("after crash {round}")));
    }
    for (uid, v) in &acked {
        assert_eq!(&ok(dir, &["get", "k", "--uid", uid]), v);
        // Every acknowledged version is a signed record of the bucket's capsule.
        assert!(ok(dir, &["verify", "--proof", "k", "--uid", uid]).ends_with("proof OK\n"));
    }
    assert!(ok(dir, &["verify"]).starts_with("intact"));
    // A bucket with nothing in it (a typo) is not reported intact.
    let e = fails(dir, &["--bucket", "typo", "verify"], 3);
    assert!(e.contains("--bucket"), "{e}");
    assert_eq!(ok(dir, &["keys"]), "k\n");
}

/// A 2 GiB blob streams through `put` (stdin) and `get` (--out) in bounded memory.
#[test]
fn two_gib_blob_streams_in_constant_memory() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    const SIZE: u64 = 2 << 30;
    let mut child = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .arg("--data")
        .arg(dir)
        .env("CAIRN_KEY_FILE", dir.join("writer.key"))
        .args(["--durability", "buffered", "put", "huge"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let put_rss = support::PeakRss::watch(child.id());
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        let mut block = vec![0u8; 1 << 20];
        let mut x = 0x9E3779B97F4A7C15u64;
        for _ in 0..(SIZE >> 20) {
            for b in block.chunks_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                b.copy_from_slice(&x.to_le_bytes()[..b.len()]);
            }
            stdin.write_all(&block).unwrap();
        }
    });
    writer.join().unwrap();
    // The sampler ends once the child has exited (it is reaped only after).
    let mut stderr = child.stderr.take().unwrap();
    let drain = std::thread::spawn(move || {
        let mut e = Vec::new();
        stderr.read_to_end(&mut e).unwrap();
        e
    });
    let put_rss = put_rss.finish();
    let out = child.wait_with_output().unwrap();
    let err = drain.join().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&err));
    assert!(put_rss < 256 * 1024, "put peak RSS {put_rss} KiB");
    let meta = ok(dir, &["get", "huge", "--meta"]);
    assert!(meta.contains(&format!("size: {SIZE} bytes")), "{meta}");
    // Stream it back out and count the bytes.
    let mut child = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .arg("--data")
        .arg(dir)
        .args(["get", "huge"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let get_rss = support::PeakRss::watch(child.id());
    let mut stdout = child.stdout.take().unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = stdout.read(&mut buf).unwrap();
        if k == 0 {
            break;
        }
        n += k as u64;
    }
    let get_rss = get_rss.finish();
    assert!(child.wait().unwrap().success());
    assert_eq!(n, SIZE);
    assert!(get_rss < 256 * 1024, "peak RSS {get_rss} KiB");
}

/// Every bucket is a capsule: each mutation is a signed record, `verify --proof` checks the
/// chain from a version to a writer signature, a proof file checks without the store, and
/// tampering or a foreign key is refused.
#[test]
fn bucket_mutations_are_signed_records_with_proofs() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let key = dir.join("writer.key");
    let public = ok(dir, &["keygen"]);
    assert!(public.starts_with("ed25519:"), "{public}");
    assert!(
        std::fs::read_to_string(&key)
            .unwrap()
            .contains(public.trim())
    );
    // A second keygen refuses to replace the key.
    fails(dir, &["keygen"], 8);
    // A stdout that cannot take the public key is an error, not a panic (exit 101).
    let full = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .env("CAIRN_KEY_FILE", dir.join("other.key"))
        .args(["keygen"])
        .stdout(std::fs::File::create("/dev/full").unwrap())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&full.stderr);
    assert_eq!(full.status.code(), Some(10), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // The demo's follow-up commands name its bucket.
    let demo = ok(dir, &["--bucket", "play", "demo"]);
    assert!(demo.contains("--bucket play"), "{demo}");
    let v1 = ok(dir, &["put", "doc", "--value", "one"])
        .trim()
        .to_string();
    ok(dir, &["fork", "doc", "--from", "master", "--to", "draft"]);
    let d1 = ok(dir, &["put", "doc", "--branch", "draft", "--value", "two"])
        .trim()
        .to_string();
    let m = ok(
        dir,
        &["merge", "doc", "--into", "master", "--from", "draft"],
    )
    .trim()
    .to_string();
    ok(dir, &["rename", "doc", "draft", "old"]);
    ok(dir, &["remove", "doc", "old"]);
    let info = ok(
        dir,
        &[
            "bucket",
            "--metadata-out",
            dir.join("meta").to_str().unwrap(),
        ],
    );
    assert!(
        info.contains(&format!("writer 0: {}", public.trim())),
        "{info}"
    );
    assert!(info.contains("records: 6"), "{info}");
    let capsule = info
        .lines()
        .find_map(|l| l.strip_prefix("capsule: "))
        .unwrap()
        .to_string();
    for uid in [&v1, &d1, &m] {
        let out = ok(dir, &["verify", "--proof", "doc", "--uid", uid]);
        assert!(out.contains("signed   by writer 0"), "{out}");
        assert!(out.ends_with("proof OK\n"), "{out}");
    }
    let head = ok(dir, &["verify", "--proof", "doc"]);
    assert!(head.contains(&m), "{head}");
    // A version of another key, or a uid no record made, has no proof.
    fails(dir, &["verify", "--proof", "other"], 3);
    let bogus = format!("1e20{}", "ab".repeat(32));
    fails(dir, &["verify", "--proof", "doc", "--uid", &bogus], 3);
    // The proof file checks with nothing but the capsule name and its metadata.
    let pf = dir.join("proof");
    ok(
        dir,
        &[
            "verify",
            "--proof",
            "doc",
            "--uid",
            &d1,
            "--out",
            pf.to_str().unwrap(),
        ],
    );
    let check = |file: &Path, capsule: &str, uid: &str| {
        Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(["verify-proof", file.to_str().unwrap(), "--capsule", capsule])
            .args(["--metadata", dir.join("meta").to_str().unwrap()])
            .args(["--key", "doc", "--uid", uid])
            .output()
            .unwrap()
    };
    let good = check(&pf, &capsule, &d1);
    assert!(
        good.status.success(),
        "{}",
        String::from_utf8_lossy(&good.stderr)
    );
    // The same proof does not prove another version, under another capsule name, or
    // after any byte of it changes.
    assert_eq!(check(&pf, &capsule, &v1).status.code(), Some(11));
    // Also when its output goes to a reader that has gone (`| head -n1`): nothing is
    // printed before every check passed, so a closed pipe cannot end it as a success
    // before the proof is checked.
    let mut child = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["verify-proof", pf.to_str().unwrap(), "--capsule", &capsule])
        .args(["--metadata", dir.join("meta").to_str().unwrap()])
        .args(["--key", "doc", "--uid", &v1])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    assert_eq!(child.wait().unwrap().code(), Some(11));
    let other = format!("1e20{}", "cd".repeat(32));
    assert_eq!(check(&pf, &other, &d1).status.code(), Some(11));
    let bytes = std::fs::read(&pf).unwrap();
    for i in (0..bytes.len()).step_by(7) {
        let mut t = bytes.clone();
        t[i] ^= 0x01;
        let tf = dir.join("tampered");
        std::fs::write(&tf, &t).unwrap();
        let out = check(&tf, &capsule, &d1);
        assert!(
            matches!(out.status.code(), Some(6) | Some(11)),
            "byte {i}: {:?} {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout)
        );
    }
    // Another key may read the bucket but not write it.
    let stranger = dir.join("stranger.key");
    let forge = || {
        Command::new(env!("CARGO_BIN_EXE_cairn"))
            .arg("--data")
            .arg(dir)
            .arg("--key-file")
            .arg(&stranger)
            .args(["put", "doc", "--value", "forged"])
            .output()
            .unwrap()
    };
    // No key there: refused, and none made (it could not write here).
    let out = forge();
    assert_eq!(out.status.code(), Some(11));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no writer key at"));
    assert!(!stranger.exists());
    cairn_node::keys::create(&stranger, "writer", false).unwrap();
    // As against a node: a key the bucket does not accept is a rejected signer (11).
    let out = forge();
    assert_eq!(out.status.code(), Some(11));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a writer of bucket default"));
    assert_eq!(ok(dir, &["get", "doc"]), "two");
}

/// `get --out` replaces a regular file whole, keeping its permissions; it writes through a
/// symlink and into a device in place, never replacing them.
#[test]
fn get_out_replaces_files_whole_and_writes_other_paths_in_place() {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    ok(dir, &["put", "k", "--value", "secret"]);
    let private = dir.join("private.txt");
    std::fs::write(&private, b"old").unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).unwrap();
    ok(dir, &["get", "k", "--out", private.to_str().unwrap()]);
    assert_eq!(std::fs::read(&private).unwrap(), b"secret");
    let mode = std::fs::metadata(&private).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let shared = dir.join("shared.txt");
    std::fs::write(&shared, b"old").unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o666)).unwrap();
    ok(dir, &["get", "k", "--out", shared.to_str().unwrap()]);
    let mode = std::fs::metadata(&shared).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o666);
    let link = dir.join("link.txt");
    std::os::unix::fs::symlink(&private, &link).unwrap();
    ok(dir, &["put", "k", "--value", "newer"]);
    ok(dir, &["get", "k", "--out", link.to_str().unwrap()]);
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(std::fs::read(&private).unwrap(), b"newer");
    ok(dir, &["get", "k", "--out", "/dev/null"]);
    assert!(
        std::fs::metadata("/dev/null")
            .unwrap()
            .file_type()
            .is_char_device()
    );
    // Into a directory that does not exist: said so (exit 10), not of a temporary file.
    let missing = dir.join("nodir").join("x");
    let err = fails(dir, &["get", "k", "--out", missing.to_str().unwrap()], 10);
    assert!(
        err.contains("does not exist") && !err.contains(".cairn-out"),
        "{err}"
    );
}

/// `--out /dev/stdout` (and `/dev/fd/N`) writes to the descriptor in place, as a shell
/// redirection does: into a pipe, and appended to a file the shell opened (`>>`, or a
/// group's earlier output). The descriptor's kernel link was resolved by hand: a pipe's
/// `pipe:[N]` was taken for a file name and failed, and a file was replaced by a rename,
/// losing what it held.
#[test]
fn get_out_to_a_descriptor_writes_in_place() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    ok(dir, &["put", "k", "--value", "value"]);
    // Into a pipe (the output is captured through one).
    assert_eq!(ok(dir, &["get", "k", "--out", "/dev/stdout"]), "value");
    // Appended to a file opened for appending, as `>> log` opens it.
    let log = dir.join("log.txt");
    std::fs::write(&log, b"before\n").unwrap();
    for dest in ["/dev/stdout", "/dev/fd/1"] {
        let out = Command::new(env!("CARGO_BIN_EXE_cairn"))
            .arg("--data")
            .arg(dir)
            .env("CAIRN_KEY_FILE", dir.join("writer.key"))
            .args(["get", "k", "--out", dest])
            .stdout(std::fs::OpenOptions::new().append(true).open(&log).unwrap())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{dest}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(std::fs::read(&log).unwrap(), b"before\nvaluevalue");
}

/// `get --out` does not follow another user's symlink in a shared sticky directory such as
/// `/tmp` (Linux's `fs.protected_symlinks` rule, which the kernel would not apply because
/// the command follows links itself): the file the link names is left alone. Our own
/// link there is followed. Needs to give a link away (root); skipped otherwise.
#[test]
fn get_out_does_not_follow_another_users_link_in_a_shared_directory() {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    ok(dir, &["put", "k", "--value", "written by cairn"]);
    let victim = dir.join("victim.txt");
    std::fs::write(&victim, b"the victim's own file").unwrap();
    let shared = dir.join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let theirs = shared.join("report.txt");
    std::os::unix::fs::symlink(&victim, &theirs).unwrap();
    if let Err(e) = std::os::unix::fs::lchown(&theirs, Some(54321), Some(54321)) {
        eprintln!("skipped: cannot give a link to another user here ({e})");
        return;
    }
    let out = cairn(dir, &["get", "k", "--out", theirs.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(8), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("protected_symlinks"),
        "{out:?}"
    );
    assert_eq!(std::fs::read(&victim).unwrap(), b"the victim's own file");
    // Nor through a chain that starts with a link of ours.
    let ours = shared.join("ours.txt");
    std::os::unix::fs::symlink(&theirs, &ours).unwrap();
    let out = cairn(dir, &["get", "k", "--out", ours.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(8), "{out:?}");
    assert_eq!(std::fs::read(&victim).unwrap(), b"the victim's own file");
    // A link of our own straight to the file is followed.
    let direct = shared.join("direct.txt");
    std::os::unix::fs::symlink(&victim, &direct).unwrap();
    ok(dir, &["get", "k", "--out", direct.to_str().unwrap()]);
    assert_eq!(std::fs::read(&victim).unwrap(), b"written by cairn");
}

/// A node's data_dir whose chunks live in an object store (its `BACKEND` record) is
/// refused by the local commands with a clear error, and nothing is written to it: chunks
/// put there would be invisible to the node, which then refused to start over them.
#[test]
fn local_commands_refuse_a_data_dir_with_an_object_store_backend() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    // A fresh directory with the record: nothing is created.
    std::fs::write(dir.join("BACKEND"), "kind s3\nbucket b\nprefix p\n").unwrap();
    let out = cairn(dir, &["put", "k", "--value", "v"]);
    assert_eq!(out.status.code(), Some(8), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("object-store backend (kind s3, bucket b, prefix p)"),
        "{err}"
    );
    let left: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from("BACKEND")]);
    // A store (as a node's data_dir holds one for its refs) with the record: reads and
    // writes are refused alike.
    let e = tempfile::tempdir().unwrap();
    let node_dir = e.path();
    ok(node_dir, &["put", "k", "--value", "v"]);
    std::fs::write(node_dir.join("BACKEND"), "kind s3\nbucket b\nprefix p\n").unwrap();
    for args in [&["get", "k"][..], &["put", "k", "--value", "w"][..]] {
        let out = cairn(node_dir, args);
        assert_eq!(out.status.code(), Some(8), "{args:?}: {out:?}");
    }
    // The log's own crash-recovery notes can still be read (and cleared).
    ok(node_dir, &["recovery"]);
    std::fs::remove_file(node_dir.join("BACKEND")).unwrap();
    assert_eq!(ok(node_dir, &["get", "k"]), "v");
}

/// Interrupting `get --out` removes its temporary file: no partial copy is left behind
/// (with `--decrypt` it would be unauthenticated plaintext), and the destination keeps
/// what it held.
#[test]
fn an_interrupted_get_leaves_no_partial_file() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let mut put = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .arg("--data")
        .arg(dir)
        .env("CAIRN_KEY_FILE", dir.join("writer.key"))
        .args(["--durability", "buffered", "put", "big"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = put.stdin.take().unwrap();
    let mut block = vec![0u8; 1 << 20];
    let mut x = 0x2545F4914F6CDD1Du64;
    for _ in 0..192 {
        for b in block.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        stdin.write_all(&block).unwrap();
    }
    drop(stdin);
    assert!(put.wait().unwrap().success());
    let out_dir = dir.join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let dest = out_dir.join("big.bin");
    let child = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .arg("--data")
        .arg(dir)
        .args(["get", "big", "--out", dest.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    support::interrupt_once_a_file_fills(child, &out_dir);
    // No temporary file is left. On a busy machine the signal can land after the whole
    // value was written and renamed into place: the destination is then complete.
    for e in std::fs::read_dir(&out_dir).unwrap() {
        let e = e.unwrap();
        let len = e.metadata().unwrap().len();
        assert!(
            e.file_name() == "big.bin" && len == 192 << 20,
            "left behind: {:?} ({len} bytes)",
            e.file_name()
        );
    }
}

/// A damaged node key in the store is damage (exit 6) for a write, and does not stop a
/// command that writes nothing: reads and `verify` (it stopped every command with exit 8,
/// the diagnosing ones too).
#[test]
fn a_damaged_node_key_stops_writes_only() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    ok(dir, &["put", "k", "--value", "v"]);
    std::fs::write(dir.join("node.key"), b"not a key\n").unwrap();
    assert_eq!(ok(dir, &["get", "k"]), "v");
    assert!(ok(dir, &["verify"]).starts_with("intact"));
    let e = fails(dir, &["put", "k", "--value", "w"], 6);
    assert!(e.contains("node key"), "{e}");
    assert_eq!(ok(dir, &["get", "k"]), "v");
}

/// Input that a put reads whole or line by line is bounded as a node bounds it: a list
/// element (a line) at most an inline value's 16 MiB (one endless line was read into
/// memory whole), a map or set at most 64 MiB (read whole and sorted, with no limit);
/// `verify-proof` reads at most 64 MiB of a file (`/dev/zero` until memory ran out); and a
/// closed stderr does not turn an exit code into a panic's 101.
#[test]
fn inputs_read_whole_are_bounded_and_a_closed_stderr_keeps_the_exit_code() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("store");
    ok(&dir, &["put", "k", "--value", "v"]);
    let line = d.path().join("line");
    std::fs::write(&line, vec![b'x'; (16 << 20) + 1]).unwrap();
    let e = fails(
        &dir,
        &[
            "put",
            "l",
            "--type",
            "list",
            "--file",
            line.to_str().unwrap(),
        ],
        8,
    );
    assert!(e.contains("longer than"), "{e}");
    let big = d.path().join("map");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len((64 << 20) + 1).unwrap();
    for ty in ["map", "set"] {
        let e = fails(
            &dir,
            &["put", "m", "--type", ty, "--file", big.to_str().unwrap()],
            8,
        );
        assert!(e.contains("64 MiB"), "{e}");
    }
    assert!(fails(&dir, &["get", "l"], 3).contains("not found"));
    let e = fails(
        &dir,
        &[
            "verify-proof",
            "/dev/zero",
            "--capsule",
            &format!("1e20{}", "00".repeat(32)),
            "--metadata",
            "/dev/zero",
            "--key",
            "k",
            "--uid",
            &"1e20".repeat(17),
        ],
        8,
    );
    assert!(e.contains("/dev/zero is larger than 64 MiB"), "{e}");
    // stderr closed before the error line is written.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let status = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .arg("--data")
        .arg(&dir)
        .env("CAIRN_KEY_FILE", dir.join("writer.key"))
        .args(["get", "missing"])
        .stdout(Stdio::null())
        .stderr(writer)
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(3), "a closed stderr, not a panic");
}

/// A bucket whose capsule metadata is damaged still lets the commands that write nothing
/// run (reads of intact keys, `verify`, which reports the damage and still checks the
/// keys, `recovery`); a write refuses with the damage (exit 6). Every command stopped at
/// the bucket's open before.
#[test]
fn a_damaged_capsule_leaves_reads_and_repairs_working() {
    let d = tempfile::tempdir().unwrap();
    let store = d.path().join("store");
    ok(&store, &["put", "k", "--value", "v"]);
    for i in 0..3 {
        ok(&store, &["put", &format!("k{i}"), "--value", "w"]);
    }
    let elsewhere = ok(&store, &["--bucket", "other", "put", "k", "--value", "o"])
        .trim()
        .to_string();
    // The metadata names the leaf-size setting; flip a byte of it where the log holds it
    // (the default bucket's, written first).
    let needle = b"cairn.leaf_size";
    let mut flipped = false;
    for e in std::fs::read_dir(&store).unwrap() {
        let p = e.unwrap().path();
        if !p.is_file() {
            continue;
        }
        let mut bytes = std::fs::read(&p).unwrap();
        if !flipped && let Some(at) = bytes.windows(needle.len()).position(|w| w == needle) {
            bytes[at + 3] ^= 0x01;
            std::fs::write(&p, &bytes).unwrap();
            flipped = true;
        }
    }
    assert!(flipped, "the metadata was found in the data directory");
    assert_eq!(ok(&store, &["get", "k"]), "v");
    // A version named by uid cannot be told to be this bucket's without its capsule: not
    // found, even another bucket's (which would read as this one's).
    fails(&store, &["get", "k", "--uid", &elsewhere], 3);
    // Branch heads are the bucket's own: an LCA of branches still runs.
    assert!(
        !ok(&store, &["lca", "k", "master", "master"])
            .trim()
            .is_empty()
    );
    let err = fails(&store, &["verify"], 6);
    assert!(err.contains("capsule"), "{err}");
    fails(&store, &["put", "k3", "--value", "x"], 6);
    let out = cairn(&store, &["recovery"]);
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("does not hash"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A write run with a writer key file that does not exist makes a key only for a bucket
/// that has no writer yet: for one another key writes, it is refused (exit 11) naming the
/// bucket's writers, and no key is left behind (it could never write there). Arguments an
/// update cannot use are refused (exit 8) before any key is looked at.
#[test]
fn a_missing_writer_key_is_not_made_for_a_bucket_with_a_writer() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    ok(dir, &["put", "k", "--value", "v"]);
    let stray = dir.join("elsewhere").join("writer.key");
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_cairn"))
            .arg("--data")
            .arg(dir)
            .env("CAIRN_KEY_FILE", &stray)
            .args(args)
            .output()
            .unwrap()
    };
    let out = run(&["put", "k", "--value", "w"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(11), "{err}");
    assert!(
        err.contains("no writer key at") && err.contains("ed25519:"),
        "{err}"
    );
    assert!(!stray.exists(), "a useless writer key was made: {err}");
    for args in [
        &["update", "k"][..],
        &["update", "k", "--append", "!", "--delete", "3"],
        &["update", "k", "--add", "1", "--text", "x"],
    ] {
        let out = run(args);
        assert_eq!(out.status.code(), Some(8), "{args:?}: {out:?}");
        assert!(!stray.exists());
    }
    // Another bucket, with no writer yet, gets the key made.
    let out = run(&["--bucket", "mine", "put", "k", "--value", "w"]);
    assert!(out.status.success(), "{out:?}");
    assert!(stray.exists());
}

/// `update` refuses a tuple, set or map element holding a line break (exit 8, nothing
/// written): `get` prints one element a line and `put` reads them back so, and such an
/// element printed as two and read back as another value. Other types keep them.
#[test]
fn update_refuses_elements_that_would_not_read_back() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let t = ok(dir, &["put", "t", "--type", "tuple", "--value", "a"]);
    ok(dir, &["put", "s", "--type", "set", "--value", "a"]);
    ok(dir, &["put", "m", "--type", "map", "--value", "a=1"]);
    fails(dir, &["update", "t", "--append", "x\ny"], 8);
    fails(
        dir,
        &["update", "t", "--insert-at", "0", "--text", "x\ny"],
        8,
    );
    fails(dir, &["update", "s", "--set", "x\ny"], 8);
    fails(dir, &["update", "m", "--set", "k=v\nz"], 8);
    assert_eq!(ok(dir, &["log", "t"]).lines().count(), 1, "nothing written");
    assert_eq!(ok(dir, &["get", "t"]), "a\n");
    assert!(ok(dir, &["log", "t"]).starts_with(t.trim()));
    // A string may hold line breaks.
    ok(dir, &["put", "str", "--value", "one"]);
    ok(dir, &["update", "str", "--append", "\ntwo"]);
    assert_eq!(ok(dir, &["get", "str"]), "one\ntwo");
}

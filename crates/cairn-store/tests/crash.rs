//! Crash safety: a child process commits in a loop and reports each acknowledged commit;
//! the parent kills it with SIGKILL at a random moment, reopens the store and checks that
//! every acknowledged commit and the chunks it names survived and verify.
//!
//! The child is this test binary itself, re-run with `CAIRN_CRASH_CHILD=<dir>` so that only
//! [`crash_child_entry`] does anything.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_store::{ChunkStore, Cid, Durability, LogStore, LogStoreOptions, RefStore, RefUpdate};
use rand::{Rng, SeedableRng, rngs::StdRng};

const THREADS: u64 = 4;

fn payload(t: u64, i: u64, j: u64) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(t << 48 ^ i << 8 ^ j);
    let len = rng.random_range(0..12_000);
    (0..len).map(|_| rng.random()).collect()
}

fn options(durability: Durability) -> LogStoreOptions {
    LogStoreOptions {
        durability,
        // Small segments so that crashes also land around segment rolls.
        segment_size: 2 << 20,
        refs_log_max: 256 << 10,
        ..Default::default()
    }
}

fn child(dir: &Path, durability: Durability) {
    let store = Arc::new(LogStore::open(dir, options(durability)).unwrap());
    let deadline = Instant::now() + Duration::from_secs(30);
    std::thread::scope(|sc| {
        for t in 0..THREADS {
            let store = store.clone();
            sc.spawn(move || {
                // Continue after whatever the previous (killed) run committed.
                let mut i = store
                    .get_ref(format!("head/{t}").as_bytes())
                    .unwrap()
                    .map_or(0, |h| u64::from_le_bytes(h[..].try_into().unwrap()) + 1);
                while Instant::now() < deadline {
                    let cids: Vec<u8> = (0..1 + i % 3)
                        .flat_map(|j| store.put(&payload(t, i, j)).unwrap().to_bytes())
                        .collect();
                    store
                        .commit(&[
                            RefUpdate::Set {
                                name: format!("c/{t}/{i:08}").into_bytes(),
                                value: cids,
                            },
                            RefUpdate::Set {
                                name: format!("head/{t}").into_bytes(),
                                value: i.to_le_bytes().to_vec(),
                            },
                        ])
                        .unwrap();
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "ack {t} {i}").unwrap();
                    out.flush().unwrap();
                    i += 1;
                }
            });
        }
    });
}

/// Entry point of the child process; a no-op in a normal test run.
#[test]
fn crash_child_entry() {
    if let Ok(dir) = std::env::var("CAIRN_CRASH_CHILD") {
        let d: Durability = std::env::var("CAIRN_CRASH_DURABILITY")
            .unwrap()
            .parse()
            .unwrap();
        child(Path::new(&dir), d);
    }
}

#[test]
fn kill9_keeps_every_acknowledged_commit() {
    let exe = std::env::current_exe().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(0xC0FFEE);
    let start = Instant::now();
    let rounds = [
        Durability::Group,
        Durability::PerWrite,
        Durability::Group,
        Durability::Buffered,
        Durability::PerWrite,
        Durability::Group,
    ];
    // One store directory across rounds: each round recovers the previous crash first.
    let mut acked: HashMap<u64, u64> = HashMap::new();
    for (round, &d) in rounds.iter().enumerate() {
        let target = rng.random_range(20..300);
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "crash_child_entry",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env("CAIRN_CRASH_CHILD", dir.path())
            .env("CAIRN_CRASH_DURABILITY", d.name())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut seen = 0;
        let record = |line: &str, acked: &mut HashMap<u64, u64>| {
            if let Some(rest) = line.strip_prefix("ack ") {
                let mut it = rest.split(' ').map(|x| x.parse::<u64>().unwrap());
                let (t, i) = (it.next().unwrap(), it.next().unwrap());
                let e = acked.entry(t).or_insert(0);
                *e = (*e).max(i + 1);
                true
            } else {
                false
            }
        };
        for line in lines.by_ref() {
            if record(&line.unwrap(), &mut acked) {
                seen += 1;
                if seen >= target {
                    break;
                }
            }
        }
        assert!(seen >= target, "child stopped early (round {round})");
        std::thread::sleep(Duration::from_micros(rng.random_range(0..3000)));
        child.kill().unwrap();
        // Acks already in the pipe were acknowledged before the kill.
        for line in lines {
            record(&line.unwrap(), &mut acked);
        }
        child.wait().unwrap();

        let store = LogStore::open(dir.path(), options(d)).unwrap();
        let mut checked = 0;
        for (&t, &n) in &acked {
            let head = store
                .get_ref(format!("head/{t}").as_bytes())
                .unwrap()
                .unwrap();
            let head = u64::from_le_bytes(head[..].try_into().unwrap());
            assert!(
                head + 1 >= n,
                "round {round} ({d}): head/{t} = {head}, acked {n}"
            );
            for i in 0..n {
                let v = store
                    .get_ref(format!("c/{t}/{i:08}").as_bytes())
                    .unwrap()
                    .unwrap_or_else(|| panic!("round {round} ({d}): commit {t}/{i} lost"));
                for (j, c) in v.chunks(34).enumerate() {
                    let cid = Cid::from_bytes(c).unwrap();
                    let data = store.get(&cid).unwrap().unwrap();
                    assert_eq!(&data[..], &payload(t, i, j as u64)[..]);
                }
                checked += 1;
            }
        }
        eprintln!(
            "round {round} ({d}): {checked} acknowledged commits verified, recovery {:?}",
            store.recovery()
        );
        // Later rounds continue each thread's numbering from its recovered head.
        for t in 0..THREADS {
            if let Some(h) = store.get_ref(format!("head/{t}").as_bytes()).unwrap() {
                acked.insert(t, u64::from_le_bytes(h[..].try_into().unwrap()) + 1);
            }
        }
    }
    assert!(start.elapsed() < Duration::from_secs(60));
}

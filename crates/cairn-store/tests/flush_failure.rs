//! A group commit whose write fails part way (a short write, then an error, as on a full
//! disk) fails every commit of the group, and a reopen replays none of them: the commit
//! records that reached the file whole are cut off with the rest.
//!
//! Alone in its own test binary: it lowers the process's file size limit
//! (`RLIMIT_FSIZE`) to make writes fail where it wants.

use std::sync::{Arc, Mutex};

use cairn_store::{Durability, LogStore, LogStoreOptions, RefStore, RefUpdate};

fn set_file_size_limit(limit: u64) {
    let r = libc::rlimit {
        rlim_cur: limit,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit with a valid pointer to an initialised rlimit.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_FSIZE, &r) }, 0);
}

#[test]
fn commits_of_a_group_whose_write_failed_are_not_replayed() {
    // Past the limit a write fails with EFBIG instead of killing the process.
    // SAFETY: ignoring a signal installs no handler code.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    for trial in 0..40u64 {
        let dir = tempfile::tempdir().unwrap();
        let opts = LogStoreOptions {
            durability: Durability::Group,
            ..Default::default()
        };
        let store = Arc::new(LogStore::open(dir.path(), opts.clone()).unwrap());
        store
            .commit(&[RefUpdate::Set {
                name: b"x".to_vec(),
                value: b"y".to_vec(),
            }])
            .unwrap();
        // A few KiB past the data, at a different place each trial.
        set_file_size_limit(3216 + trial * 37);
        let failed: Arc<Mutex<Vec<String>>> = Arc::default();
        let threads: Vec<_> = (0..16)
            .map(|t| {
                let store = store.clone();
                let failed = failed.clone();
                std::thread::spawn(move || {
                    for i in 0..1000 {
                        let name = format!("t{t}-{i}");
                        let r = store.commit(&[RefUpdate::Set {
                            name: name.clone().into_bytes(),
                            value: vec![7; 20],
                        }]);
                        if r.is_err() {
                            failed.lock().unwrap().push(name);
                            return;
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        set_file_size_limit(libc::RLIM_INFINITY);
        let failed = failed.lock().unwrap().clone();
        assert!(!failed.is_empty(), "trial {trial}: no write failed");
        drop(store);
        let store = LogStore::open(dir.path(), opts).unwrap();
        let back: Vec<&String> = failed
            .iter()
            .filter(|n| store.get_ref(n.as_bytes()).unwrap().is_some())
            .collect();
        assert!(
            back.is_empty(),
            "trial {trial}: commits that failed are present after a reopen: {back:?}"
        );
        assert!(store.get_ref(b"x").unwrap().is_some());
    }
}

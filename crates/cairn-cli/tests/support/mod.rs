//! Helpers shared by the `cairn` binary's test files.

use std::path::Path;
use std::process::{Child, Output};
use std::time::Instant;

/// Waits (up to 20 s) until `dir` holds a file with bytes in it (the command is then well
/// past creating it), sends SIGINT to `child`, and checks that it exits 130 saying it was
/// interrupted. Returns its output; the caller checks what `dir` holds.
pub fn interrupt_once_a_file_fills(child: Child, dir: &Path) -> Output {
    let t0 = Instant::now();
    while !std::fs::read_dir(dir)
        .unwrap()
        .any(|e| e.unwrap().metadata().unwrap().len() > 0)
    {
        assert!(
            t0.elapsed().as_secs() < 20,
            "no temporary file appeared in {}",
            dir.display()
        );
        std::thread::yield_now();
    }
    // SAFETY: kill(2) with a pid of our own child and a valid signal number.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "stderr: {err}");
    assert!(err.contains("interrupted"), "stderr: {err}");
    out
}

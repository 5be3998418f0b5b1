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

/// The peak RSS of one child process, sampled from `/proc` on a thread of its own until
/// the child has exited (a zombie, not yet reaped, so its pid cannot be reused meanwhile):
/// the largest `VmHWM` of the child's address space once it runs the `cairn` binary
/// (before exec it shares the test process's pages, which `getrusage`/`wait4` would
/// count, and those grow with the other tests running beside it).
pub struct PeakRss(std::thread::JoinHandle<i64>);

impl PeakRss {
    /// Starts sampling process `pid` (a child not yet waited for) every 20 ms.
    pub fn watch(pid: u32) -> PeakRss {
        let exe = std::fs::canonicalize(env!("CARGO_BIN_EXE_cairn")).unwrap();
        PeakRss(std::thread::spawn(move || {
            let mut peak = 0i64;
            loop {
                let Ok(st) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
                    return peak;
                };
                if st
                    .lines()
                    .any(|l| l.starts_with("State:") && l.contains("Z"))
                {
                    return peak;
                }
                let own = std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|e| e == exe);
                if own {
                    let hwm = st
                        .lines()
                        .find_map(|l| l.strip_prefix("VmHWM:"))
                        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<i64>().ok());
                    peak = peak.max(hwm.unwrap_or(0));
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }))
    }

    /// Waits until the child has exited (call it before reaping the child) and returns its
    /// peak in KiB; fails when it was never sampled.
    pub fn finish(self) -> i64 {
        let peak = self.0.join().unwrap();
        assert!(peak > 0, "the child's memory was never sampled");
        peak
    }
}

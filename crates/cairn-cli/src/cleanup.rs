//! Temporary files a command must not leave behind when it is interrupted.
//!
//! `get --out` writes into a hidden temporary file next to the destination (renamed over it
//! only once every byte is verified, and, with `--decrypt`, authenticated), and a signed
//! upload from stdin spools stdin to a temporary file. Both are removed on every normal or
//! failed exit by their owners; this module removes them on SIGINT, SIGTERM and SIGHUP too,
//! so an interrupted command leaves neither a partial copy nor unauthenticated plaintext.
//! The handler is installed by the first registration, so commands that never make a
//! temporary file (`serve`, with its own graceful shutdown) keep the default signals.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, Once, PoisonError};

/// Paths to remove if the process is interrupted.
static PATHS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
static INSTALL: Once = Once::new();

/// Exit status after an interruption (as a shell reports SIGINT: 128 + 2).
const INTERRUPTED: i32 = 130;

/// Installs the interrupt handler (once). A file created before its registration may be
/// left behind by an interruption between the two: create it with [`create_registered`].
pub fn arm() {
    INSTALL.call_once(|| {
        // If no handler can be installed the default action (exit) stays: the file may
        // then be left behind, as before; nothing else changes.
        let _ = ctrlc::set_handler(|| {
            // Held until the exit, so no file is created and registered after the list
            // was emptied (it would outlive the process).
            let mut paths = PATHS.lock().unwrap_or_else(PoisonError::into_inner);
            for p in paths.drain(..) {
                let _ = std::fs::remove_file(p);
            }
            eprintln!("error: interrupted");
            std::process::exit(INTERRUPTED);
        });
    });
}

/// Creates a file with `create` and registers the path `path_of` names for removal, with
/// no interruption between the two: the handler waits for the registration, then removes
/// the file. The registration comes first in the pair, so that a `let (guard, file)` drops
/// the file (removing a temporary file) before it ends the registration.
pub fn create_registered<T>(
    create: impl FnOnce() -> std::io::Result<T>,
    path_of: impl FnOnce(&T) -> &Path,
) -> std::io::Result<(Registered, T)> {
    arm();
    let mut paths = PATHS.lock().unwrap_or_else(PoisonError::into_inner);
    let made = create()?;
    let path = path_of(&made).to_path_buf();
    paths.push(path.clone());
    drop(paths);
    Ok((Registered(path), made))
}

/// A registration made by [`create_registered`]; dropping it ends it (the owner has
/// renamed or removed the file by then).
pub struct Registered(PathBuf);

impl Drop for Registered {
    fn drop(&mut self) {
        let mut paths = PATHS.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(i) = paths.iter().position(|p| *p == self.0) {
            paths.swap_remove(i);
        }
    }
}

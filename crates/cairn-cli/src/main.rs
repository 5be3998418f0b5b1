//! The `cairn` command: a local, embedded Cairn store driven from the shell.
//!
//! Every command opens the store at `--data` (default `./cairn-data`), does one thing and
//! exits. Errors print one line on stderr and exit non-zero (see [`exit_code`]); results
//! go to stdout, so `uid=$(cairn put k --value v)` works.

mod bench;
mod bench_capsule;
mod bench_hub;
mod cli;
mod client;
mod crypt;
mod demo;
mod format;

use std::process::ExitCode;

use cairn_core::Error;
use clap::Parser;

/// Opts this process out of transparent huge pages (Linux). mimalloc asks for them on its
/// arenas, and with many threads (a node serving many connections) every first touch of a
/// fresh region then faults in and zeroes 2 MiB: in `cairn bench capsule --parts many` with
/// 1000 clients, peak RSS was 7.0 GB with them and 2.2 GB without, and the run took twice
/// as long. Redis and MongoDB advise the same for the same reason. Failure is harmless.
fn disable_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_THP_DISABLE takes plain integer arguments and touches no memory of ours.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

/// mimalloc: the object engine allocates many small, short-lived buffers (POS-tree nodes,
/// map entries); glibc malloc spent about a sixth of Put-Map's CPU on them.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    disable_transparent_huge_pages();
    let args = cli::Cli::parse();
    match cli::run(args) {
        Ok(code) => code,
        Err(e) => {
            // A closed pipe (`cairn get big | head`) is the reader's choice, not an error.
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) {
                return ExitCode::SUCCESS;
            }
            let code = match e.downcast_ref::<Error>() {
                Some(err) => exit_code(err),
                None => 1,
            };
            eprintln!("error: {e:#}");
            ExitCode::from(code)
        }
    }
}

/// Exit status for each kind of error, so scripts can tell them apart.
fn exit_code(e: &Error) -> u8 {
    match e {
        Error::NotFound(_) => 3,
        Error::GuardMismatch(_) => 4,
        Error::Conflict(_) => 5,
        Error::Corrupt(_) | Error::Decode(_) => 6,
        Error::TypeMismatch(_) => 7,
        Error::InvalidInput(_) | Error::AlreadyExists(_) => 8,
        Error::Unavailable(_) => 9,
        Error::Io { .. } => 10,
        Error::Rejected(_) => 11,
    }
}

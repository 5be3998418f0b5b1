//! The `cairn` command: Cairn driven from the shell.
//!
//! Object commands work on the embedded store at `--data` (default `./cairn-data`), or on
//! a node with `--server URL` (verifying what it answers); `serve` runs a node, `keygen`
//! makes a writer key, `verify-proof` checks a saved proof offline, and `bench` runs the
//! benchmarks. Each command does one thing and exits. Errors print one line on stderr and
//! exit non-zero (see [`exit_code`]); results go to stdout, so `uid=$(cairn put k --value
//! v)` works.

/// `eprintln!` that ignores a failed write: with stderr closed early (`cairn verify 2>&1 |
/// head -n1`), std's panics, and the exit code the scripts read becomes 101.
macro_rules! eprintln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod bench;
mod bench_capsule;
mod bench_hub;
mod cleanup;
mod cli;
mod client;
mod crypt;
mod demo;
mod digest;
mod format;
mod verified;

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

/// Raises this process's soft limit on open files to its hard limit (Unix). The log store
/// keeps every sealed segment open (one descriptor per 256 MiB of data) and a node one per
/// connection besides, so the common soft limit of 1024 would fail a store of about
/// 250 GiB at its next roll and refuse to reopen it. Failure is harmless: the old limit
/// stays.
fn raise_open_file_limit() {
    #[cfg(unix)]
    // SAFETY: getrlimit and setrlimit read and write only the `rlimit` passed.
    unsafe {
        let mut l = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 {
            // An unlimited hard limit is not a number every kernel takes as a soft one
            // (macOS wants at most OPEN_MAX, Linux at most fs.nr_open): try less then.
            let soft = l.rlim_cur;
            for want in [l.rlim_max, 1 << 20, 65536, 10240] {
                if want <= soft || want > l.rlim_max {
                    continue;
                }
                l.rlim_cur = want;
                if libc::setrlimit(libc::RLIMIT_NOFILE, &l) == 0 {
                    break;
                }
            }
        }
    }
}

/// mimalloc: the object engine allocates many small, short-lived buffers (POS-tree nodes,
/// map entries); glibc malloc spent about a sixth of Put-Map's CPU on them.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    disable_transparent_huge_pages();
    raise_open_file_limit();
    let args = match cli::Cli::try_parse() {
        Ok(a) => a,
        Err(e) => return usage_error(e),
    };
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
            // The kind of the innermost Cairn error decides; an operating-system error
            // anywhere (a missing input file, an unwritable output) is an I/O error; what
            // is left is a setting or argument the command could not use.
            // A Cairn error carried inside an I/O error (a node that stalled or failed in
            // the middle of a download, seen by the reader of the body) counts as itself.
            let carried = e.chain().find_map(|c| {
                c.downcast_ref::<std::io::Error>()
                    .and_then(std::io::Error::get_ref)
                    .and_then(|inner| inner.downcast_ref::<Error>())
            });
            let code = match carried.or_else(|| e.chain().find_map(|c| c.downcast_ref::<Error>())) {
                Some(err) => exit_code(err),
                None if e.chain().any(|c| {
                    // An address that does not parse is bad input; an OS error is I/O.
                    c.downcast_ref::<std::io::Error>().is_some_and(|io| {
                        io.kind() != std::io::ErrorKind::InvalidInput || io.raw_os_error().is_some()
                    })
                }) =>
                {
                    10
                }
                None => 8,
            };
            eprintln!("error: {}", one_line(&e));
            ExitCode::from(code)
        }
    }
}

/// The error and its causes on one line, `outer: inner: ...`, leaving out a cause whose
/// text the message before it already ends with (an I/O error names its OS error itself).
fn one_line(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        // Multi-line messages (a TOML parser's) lose their source-snippet lines.
        let text = cause
            .to_string()
            .lines()
            .map(str::trim)
            .filter(|l| {
                let snippet = l
                    .trim_start_matches(|c: char| c.is_ascii_digit())
                    .trim_start();
                !l.is_empty() && !snippet.starts_with('|')
            })
            .collect::<Vec<_>>()
            .join("; ");
        if out.ends_with(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// A command line the parser refused: help and version print as usual; anything else is
/// bad input, told on one line (clap's message, its hints folded in, without the usage
/// block) with exit status 8, like every other refused input.
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        e.exit()
    }
    // No command at all: the help, then exit 8 like any other refused command line.
    if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        let _ = e.print();
        return ExitCode::from(8);
    }
    let text = e.render().to_string();
    let mut line = String::new();
    for l in text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("Usage:") && !l.starts_with("For more"))
    {
        if !line.is_empty() {
            line.push_str(if line.ends_with(':') { " " } else { "; " });
        }
        line.push_str(l);
    }
    let line = line.strip_prefix("error: ").unwrap_or(&line);
    eprintln!("error: {line} (see --help)");
    ExitCode::from(8)
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

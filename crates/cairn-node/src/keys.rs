//! Key files: the writer key that signs a bucket's records, and the node key that signs
//! the embedded capsule server's acknowledgements.
//!
//! A key file is text: comment lines starting with `#`, then one line
//! `cairn-ed25519-secret:<64 hex digits>` (the Ed25519 secret seed). It is created with
//! mode 0600 and appears atomically (written to a temporary file, synced, then hard-linked
//! into place, so two processes creating it at once end up with the same key).
//!
//! The writer key lives at `--key-file` / `$CAIRN_KEY_FILE`, else
//! `$XDG_CONFIG_HOME/cairn/writer.key`, else `~/.config/cairn/writer.key`. The node key
//! lives in the data directory (`node.key`).

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use cairn_core::{Error, SigningKey};

const PREFIX: &str = "cairn-ed25519-secret:";

/// The default writer key path (see the module comment).
pub fn default_writer_key() -> Result<PathBuf> {
    if let Some(x) = std::env::var_os("XDG_CONFIG_HOME").filter(|x| !x.is_empty()) {
        return Ok(PathBuf::from(x).join("cairn").join("writer.key"));
    }
    match std::env::var_os("HOME").filter(|x| !x.is_empty()) {
        Some(h) => Ok(PathBuf::from(h)
            .join(".config")
            .join("cairn")
            .join("writer.key")),
        None => bail!(Error::invalid(
            "no home directory to keep the writer key in: set --key-file or CAIRN_KEY_FILE"
        )),
    }
}

/// Reads a key file.
pub fn read(path: &Path) -> Result<SigningKey> {
    let text =
        fs::read_to_string(path).with_context(|| format!("reading key file {}", path.display()))?;
    let mut found = None;
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let hexpart = line.strip_prefix(PREFIX).ok_or_else(|| {
            Error::invalid(format!(
                "key file {}: expected a line \"{PREFIX}<64 hex digits>\"",
                path.display()
            ))
        })?;
        let mut seed = [0u8; 32];
        hex::decode_to_slice(hexpart, &mut seed)
            .map_err(|e| Error::invalid(format!("key file {}: bad secret: {e}", path.display())))?;
        if found.is_some() {
            bail!(Error::invalid(format!(
                "key file {} holds more than one key",
                path.display()
            )));
        }
        found = Some(SigningKey::from_seed(&seed));
        seed.fill(0);
    }
    warn_if_readable_by_others(path);
    found.ok_or_else(|| {
        anyhow::Error::from(Error::invalid(format!(
            "key file {} holds no key",
            path.display()
        )))
    })
}

/// Warns on stderr when the key file `path` is readable by other users (chmod 600 it).
#[cfg(unix)]
pub fn warn_if_readable_by_others(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(m) = fs::metadata(path)
        && m.permissions().mode() & 0o077 != 0
    {
        eprintln!(
            "warning: key file {} is readable by other users (chmod 600 it)",
            path.display()
        );
    }
}

/// Warns on stderr when the key file `path` is readable by other users (not on Unix:
/// nothing to check).
#[cfg(not(unix))]
pub fn warn_if_readable_by_others(_path: &Path) {}

/// Creates the file `path` holding `text`, readable by its owner only (0600), whole or not
/// at all and only if it does not exist: the text is written and synced to a temporary
/// file beside it, which is then linked into place (a link fails if `path` exists) and the
/// directory synced, so a concurrent creator never sees a partial file and a power loss
/// never loses an acknowledged one. Returns false when `path` exists already (made by
/// another process, perhaps at the same moment: read it).
pub fn create_private_file(path: &Path, text: &str) -> Result<bool> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = write_private_temp(dir, path, text)?;
    let linked = fs::hard_link(&tmp, path);
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => {
            sync_dir(dir);
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        // A file system without hard links (vfat, some FUSE mounts): an exclusive create,
        // written and synced (a concurrent reader may then see it partly written). Any
        // other error is reported.
        Err(e) if !links_unsupported(&e) => {
            Err(e).with_context(|| format!("writing {}", path.display()))
        }
        Err(_) => {
            let mut opts = OpenOptions::new();
            opts.write(true).create_new(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt;
                opts.mode(0o600);
            }
            match opts.open(path) {
                Ok(mut f) => {
                    if let Err(e) = f.write_all(text.as_bytes()).and_then(|_| f.sync_all()) {
                        // A partial key file must not be read as the key next time.
                        let _ = fs::remove_file(path);
                        return Err(e).with_context(|| format!("writing {}", path.display()));
                    }
                    sync_dir(dir);
                    Ok(true)
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
                Err(e) => Err(e).with_context(|| format!("creating {}", path.display())),
            }
        }
    }
}

/// Whether a failed `hard_link` means the file system has no hard links (rather than a
/// real failure such as a full disk): unsupported, not permitted (EPERM), too many links
/// (EMLINK) or not supported (EOPNOTSUPP).
fn links_unsupported(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::Unsupported | std::io::ErrorKind::PermissionDenied
    ) || matches!(e.raw_os_error(), Some(1 | 31 | 95))
}

/// The prefix of the temporary files a key file at `path` is written through.
fn temp_prefix(path: &Path) -> String {
    format!(
        ".{}.tmp.",
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "key".into())
    )
}

/// Removes temporary files of `path`'s key older than a minute: a crash between writing
/// one and removing it left a second copy of a secret key (hard-linked to the key file,
/// so it outlived a `--force` replacement of the key), and its name could collide with a
/// later process's after the process id was reused. Best effort.
fn remove_stale_temps(dir: &Path, path: &Path) {
    let prefix = temp_prefix(path);
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
    for e in entries.flatten() {
        let stale = e.file_name().to_string_lossy().starts_with(&prefix)
            && e.metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t < old);
        if stale {
            let _ = fs::remove_file(e.path());
        }
    }
}

/// A new temporary file in `dir` (named after `path`, this process, the time and a
/// counter) holding `text`, mode 0600, synced.
fn write_private_temp(dir: &Path, path: &Path, text: &str) -> Result<std::path::PathBuf> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    remove_stale_temps(dir, path);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let tmp = dir.join(format!(
        "{}{}.{nanos}.{}",
        temp_prefix(path),
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let mut opts = OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f: File = opts
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    let written = f.write_all(text.as_bytes()).and_then(|_| f.sync_all());
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("writing {}", tmp.display()));
    }
    Ok(tmp)
}

/// Syncs a directory's entries (best effort: some file systems refuse it).
fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Creates a new key file at `path` holding a fresh key; refuses to replace an existing
/// one unless `force`. `what` says what the key is for (written as a comment).
pub fn create(path: &Path, what: &str, force: bool) -> Result<SigningKey> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    if path.exists() && !force {
        bail!(Error::AlreadyExists(format!(
            "key file {} (keep it, or pass --force to replace it: whatever it signed stays \
             signed by the old key)",
            path.display()
        )));
    }
    let key = SigningKey::generate()?;
    let text = format!(
        "# Cairn Ed25519 secret key ({what}). Public key: {}\n{PREFIX}{}\n",
        key.public(),
        hex::encode(key.seed())
    );
    if force {
        let tmp = write_private_temp(dir, path, &text)?;
        fs::rename(&tmp, path)
            .inspect_err(|_| {
                let _ = fs::remove_file(&tmp);
            })
            .with_context(|| format!("writing key file {}", path.display()))?;
        sync_dir(dir);
    } else if !create_private_file(path, &text)? {
        bail!(Error::AlreadyExists(format!(
            "key file {} (created meanwhile by another process)",
            path.display()
        )));
    }
    Ok(key)
}

/// Reads the key at `path`, creating it first when it does not exist (telling the user on
/// stderr where it went when `announce`). A concurrent creator wins the race cleanly: both
/// read its key.
pub fn read_or_create(path: &Path, what: &str, announce: bool) -> Result<SigningKey> {
    if path.exists() {
        return read(path);
    }
    match create(path, what, false) {
        Ok(key) => {
            if announce {
                eprintln!(
                    "created {what} key {} at {} (back it up)",
                    key.public(),
                    path.display()
                );
            }
            Ok(key)
        }
        Err(_) if path.exists() => read(path),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A temporary copy of a key left by a crash (a second link to the secret) is removed
    /// when a key is next written there, once it is a minute old; a younger one may be a
    /// concurrent creator's and stays.
    #[test]
    fn stale_temporary_copies_of_a_key_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("writer.key");
        let stale = dir.path().join(".writer.key.tmp.1.2.3");
        let young = dir.path().join(".writer.key.tmp.4.5.6");
        let other = dir.path().join(".other.key.tmp.1.2.3");
        for p in [&stale, &young, &other] {
            fs::write(p, "cairn-ed25519-secret:00").unwrap();
        }
        let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        for p in [&stale, &other] {
            File::options()
                .write(true)
                .open(p)
                .unwrap()
                .set_modified(hour_ago)
                .unwrap();
        }
        let key = create(&path, "test", false).unwrap();
        assert_eq!(read(&path).unwrap().public(), key.public());
        assert!(!stale.exists(), "the stale copy of the key is gone");
        assert!(young.exists() && other.exists());
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 3, "{names:?}");
    }
}

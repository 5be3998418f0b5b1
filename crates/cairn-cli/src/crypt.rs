//! Client-side encryption for `cairn --server URL put --encrypt` / `get --decrypt`: the
//! value is encrypted before it leaves the machine, so the node stores and serves only
//! ciphertext. Streaming, in constant memory, for values of any size.
//!
//! # Format (version 2)
//!
//! A 39-byte header, then the segments:
//!
//! | bytes | what |
//! | --- | --- |
//! | 8 | magic `CAIRNENC` |
//! | 1 | format version, 2 (1 is still read) |
//! | 1 | algorithm, 1 = XChaCha20-Poly1305 in the STREAM construction, big-endian 32-bit counter (`aead::stream::StreamBE32`) |
//! | 1 | log2 of the plaintext segment size, 16 (64 KiB) |
//! | 1 | reserved, 0 |
//! | 19 | random nonce prefix (24-byte XChaCha nonce less STREAM's 4-byte counter and 1-byte last flag) |
//! | 8 | key id: the first 8 bytes of `BLAKE3-derive_key("cairn data key id v1", secret)` |
//!
//! Every plaintext segment is 64 KiB except the last, which holds 0 to 64 KiB and is sealed
//! with STREAM's last-segment flag; each ciphertext segment is its plaintext plus a 16-byte
//! Poly1305 tag, and each is authenticated with the whole header and the value's place as
//! associated data: `header ‖ "cairn value place v2" ‖ u32 LE length ‖ bucket ‖ u32 LE
//! length ‖ key` (see [`binding`]; version 1 authenticated the header alone). So a changed
//! byte anywhere, reordered or dropped segments, a stream cut at any point (including at a
//! segment boundary: the last flag is missing), a changed header, or a node serving the
//! value of another key or bucket as this one all fail to decrypt. (A node can still serve
//! an older version of the same key: read the version you expect with `--uid`; a read by
//! branch takes the node's word for the head, and `get --capsule` prints the uid it
//! proved.) The ciphertext of `n` plaintext bytes is `39 + n + 16 · max(1, ⌈n / 64 KiB⌉)`
//! bytes.
//!
//! The AEAD key is `BLAKE3-derive_key("cairn data key v1 xchacha20poly1305 stream", secret)`
//! where `secret` is the 32 bytes of the data key file (see [`DataKey`]). All primitives are
//! RustCrypto's (`chacha20poly1305`, `aead::stream`) and BLAKE3's; nothing here is
//! hand-written cryptography.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use cairn_core::Error;
use chacha20poly1305::aead::stream::{DecryptorBE32, EncryptorBE32};
use chacha20poly1305::aead::{KeyInit, generic_array::GenericArray};
use chacha20poly1305::{Key, XChaCha20Poly1305};

/// The first bytes of every encrypted value.
pub const MAGIC: &[u8; 8] = b"CAIRNENC";
/// The format version written.
pub const VERSION: u8 = 2;
/// The earlier format, still read: its associated data is the header alone.
pub const VERSION_UNBOUND: u8 = 1;

/// Whether values in format [`VERSION_UNBOUND`] are decrypted (`--allow-format-1`).
static ALLOW_UNBOUND: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Lets this process decrypt values in format [`VERSION_UNBOUND`] (refused otherwise).
pub fn allow_unbound_format(allow: bool) {
    ALLOW_UNBOUND.store(allow, std::sync::atomic::Ordering::Relaxed);
}

/// What binds a value to its place, after the header in the associated data: the bucket
/// and the key, each length-prefixed.
pub fn binding(bucket: &str, key: &str) -> Vec<u8> {
    let mut b = Vec::with_capacity(32 + bucket.len() + key.len());
    b.extend_from_slice(b"cairn value place v2");
    for part in [bucket.as_bytes(), key.as_bytes()] {
        b.extend_from_slice(&(part.len() as u32).to_le_bytes());
        b.extend_from_slice(part);
    }
    b
}
/// Algorithm id: XChaCha20-Poly1305, STREAM with a big-endian 32-bit counter.
pub const ALGO_XCHACHA20POLY1305_STREAM_BE32: u8 = 1;
/// log2 of the plaintext segment size.
pub const SEGMENT_LOG2: u8 = 16;
/// Plaintext bytes per segment (all but the last).
pub const SEGMENT: usize = 1 << SEGMENT_LOG2;
/// The Poly1305 tag added to every segment.
pub const TAG: usize = 16;
/// Length of the nonce prefix (XChaCha's 24 bytes less STREAM's 5).
pub const NONCE_PREFIX: usize = 19;
/// Length of the key id.
pub const KEY_ID: usize = 8;
/// Length of the header.
pub const HEADER: usize = 8 + 4 + NONCE_PREFIX + KEY_ID;

const KEY_CONTEXT: &str = "cairn data key v1 xchacha20poly1305 stream";
const KEY_ID_CONTEXT: &str = "cairn data key id v1";
const FILE_PREFIX: &str = "cairn-data-key:";

/// The secret of client-side encryption: 32 random bytes kept in a key file (hex, mode
/// 0600), default `$XDG_CONFIG_HOME/cairn/data.key` or `~/.config/cairn/data.key`, created
/// on first use. Whoever holds it can read every value encrypted with it; whoever loses it
/// cannot.
pub struct DataKey {
    key: Key,
    id: [u8; KEY_ID],
}

impl DataKey {
    /// Derives the AEAD key and key id from the 32-byte secret.
    pub fn from_secret(secret: &[u8; 32]) -> Self {
        let key = blake3::derive_key(KEY_CONTEXT, secret);
        let idh = blake3::derive_key(KEY_ID_CONTEXT, secret);
        let mut id = [0u8; KEY_ID];
        id.copy_from_slice(&idh[..KEY_ID]);
        DataKey {
            key: Key::clone_from_slice(&key),
            id,
        }
    }

    /// The key id written into headers (not secret).
    pub fn id(&self) -> [u8; KEY_ID] {
        self.id
    }

    fn cipher(&self) -> XChaCha20Poly1305 {
        XChaCha20Poly1305::new(&self.key)
    }
}

/// The default data key file.
pub fn default_key_path() -> Result<PathBuf> {
    if let Some(x) = std::env::var_os("XDG_CONFIG_HOME").filter(|x| !x.is_empty()) {
        return Ok(PathBuf::from(x).join("cairn").join("data.key"));
    }
    match std::env::var_os("HOME").filter(|x| !x.is_empty()) {
        Some(h) => Ok(PathBuf::from(h)
            .join(".config")
            .join("cairn")
            .join("data.key")),
        None => bail!(Error::invalid(
            "no HOME or XDG_CONFIG_HOME: name the data key with --data-key-file"
        )),
    }
}

/// Reads the data key at `path`; when it does not exist and `create` is set, makes a new
/// random one there first (mode 0600; never replaces an existing file).
pub fn load_or_create_key(path: &Path, create: bool) -> Result<DataKey> {
    if !path.exists() {
        if !create {
            bail!(Error::not_found(format!(
                "data key file {} (the key the value was encrypted with)",
                path.display()
            )));
        }
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret)
            .map_err(|e| anyhow::anyhow!("the system random source failed: {e}"))?;
        let text = format!(
            "# Cairn data key (client-side encryption). Keep it secret and back it up: \
             without it encrypted values cannot be read.\n{FILE_PREFIX}{}\n",
            hex::encode(secret)
        );
        // Written whole and linked into place, so a concurrent `cairn` making it too either
        // wins (and both use its key) or reads the one that won, never a partial file.
        if cairn_node::keys::create_private_file(path, &text)? {
            eprintln!(
                "created data key {} (back it up: it is the only way to decrypt)",
                path.display()
            );
            return Ok(DataKey::from_secret(&secret));
        }
    }
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    // The data key keeps the content secret: warned about as the writer key is.
    cairn_node::keys::warn_if_readable_by_others(path);
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .ok_or_else(|| Error::invalid(format!("data key file {} is empty", path.display())))?;
    let hex_part = line.strip_prefix(FILE_PREFIX).unwrap_or(line);
    let mut secret = [0u8; 32];
    hex::decode_to_slice(hex_part, &mut secret).map_err(|_| {
        Error::invalid(format!(
            "data key file {} does not hold {FILE_PREFIX}<64 hex digits>",
            path.display()
        ))
    })?;
    Ok(DataKey::from_secret(&secret))
}

/// The ciphertext length of `n` plaintext bytes.
pub fn encrypted_len(n: u64) -> u64 {
    let segments = n.div_ceil(SEGMENT as u64).max(1);
    HEADER as u64 + n + TAG as u64 * segments
}

/// Reads until `buf` is full or the reader ends; returns the bytes read.
fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Reads `n` bytes into `buf`: the look-ahead byte first (when there is one), then the
/// reader. Returns the bytes read and whether the reader has more after them.
fn read_segment(
    r: &mut dyn Read,
    look: &mut Option<u8>,
    buf: &mut Vec<u8>,
    n: usize,
) -> io::Result<(usize, bool)> {
    buf.clear();
    buf.resize(n, 0);
    let mut got = 0;
    if let Some(b) = look.take() {
        buf[0] = b;
        got = 1;
    }
    got += read_full(r, &mut buf[got..])?;
    buf.truncate(got);
    if got < n {
        return Ok((got, false));
    }
    let mut one = [0u8; 1];
    let more = read_full(r, &mut one)? == 1;
    if more {
        *look = Some(one[0]);
    }
    Ok((got, more))
}

/// Encrypts a plaintext stream as it is read: a [`Read`] giving the header, then the sealed
/// segments. Holds one segment (64 KiB) at a time.
pub struct EncryptReader<R> {
    inner: R,
    enc: Option<EncryptorBE32<XChaCha20Poly1305>>,
    /// The associated data of every segment: the header, then the place binding.
    aad: Vec<u8>,
    out: Vec<u8>,
    pos: usize,
    look: Option<u8>,
    /// A read failed: every later read fails too (the failed segment's buffer may hold
    /// plaintext, and the stream cannot go on past a segment it did not seal).
    failed: bool,
}

impl<R: Read> EncryptReader<R> {
    /// Encrypts `inner` under `key` for the place `binding` names ([`binding`]) with a
    /// fresh random nonce prefix.
    pub fn new(inner: R, key: &DataKey, binding: &[u8]) -> Result<Self> {
        let mut prefix = [0u8; NONCE_PREFIX];
        getrandom::fill(&mut prefix)
            .map_err(|e| anyhow::anyhow!("the system random source failed: {e}"))?;
        Ok(Self::with_nonce_prefix(inner, key, prefix, binding))
    }

    /// Encrypts `inner` under `key` with the given nonce prefix (which must never be used
    /// twice with one key; [`EncryptReader::new`] draws it at random). Two readers with the
    /// same prefix over the same plaintext give the same bytes, which lets a caller hash
    /// the ciphertext in one pass and send it in another.
    pub fn with_nonce_prefix(
        inner: R,
        key: &DataKey,
        prefix: [u8; NONCE_PREFIX],
        binding: &[u8],
    ) -> Self {
        Self::in_format(inner, key, prefix, binding, VERSION)
    }

    /// [`EncryptReader::with_nonce_prefix`] writing format `version` (the place binding
    /// is left out of version 1).
    fn in_format(
        inner: R,
        key: &DataKey,
        prefix: [u8; NONCE_PREFIX],
        binding: &[u8],
        version: u8,
    ) -> Self {
        let mut header = [0u8; HEADER];
        header[..8].copy_from_slice(MAGIC);
        header[8] = version;
        header[9] = ALGO_XCHACHA20POLY1305_STREAM_BE32;
        header[10] = SEGMENT_LOG2;
        header[11] = 0;
        header[12..12 + NONCE_PREFIX].copy_from_slice(&prefix);
        header[12 + NONCE_PREFIX..].copy_from_slice(&key.id());
        let enc = EncryptorBE32::from_aead(key.cipher(), GenericArray::from_slice(&prefix));
        EncryptReader {
            inner,
            enc: Some(enc),
            aad: associated_data(&header, binding),
            out: header.to_vec(),
            pos: 0,
            look: None,
            failed: false,
        }
    }

    fn next_segment(&mut self) -> io::Result<()> {
        let Some(mut enc) = self.enc.take() else {
            self.out.clear();
            self.pos = 0;
            return Ok(());
        };
        let (_, more) = read_segment(&mut self.inner, &mut self.look, &mut self.out, SEGMENT)?;
        self.pos = 0;
        let sealed = if more {
            let r = enc.encrypt_next_in_place(&self.aad, &mut self.out);
            self.enc = Some(enc);
            r
        } else {
            enc.encrypt_last_in_place(&self.aad, &mut self.out)
        };
        sealed.map_err(|_| io::Error::other("encryption failed (segment counter exhausted)"))
    }
}

impl<R: Read> Read for EncryptReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.failed {
            return Err(io::Error::other("encryption stopped at an earlier error"));
        }
        if self.pos == self.out.len() {
            if let Err(e) = self.next_segment() {
                self.failed = true;
                self.enc = None;
                self.out.clear();
                self.pos = 0;
                return Err(e);
            }
            if self.out.is_empty() {
                return Ok(0);
            }
        }
        let n = buf.len().min(self.out.len() - self.pos);
        buf[..n].copy_from_slice(&self.out[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// The associated data of a value's segments: the header, then (from version 2) the
/// place binding.
fn associated_data(header: &[u8; HEADER], binding: &[u8]) -> Vec<u8> {
    let mut aad = header.to_vec();
    if header[8] != VERSION_UNBOUND {
        aad.extend_from_slice(binding);
    }
    aad
}

/// Decrypts `input` (the format above) under `key` into `out`, one verified segment at a
/// time; returns the plaintext length. Fails (nothing more written) on a bad header, a key
/// that is not the one the value was encrypted with, any segment that does not
/// authenticate, and a stream that ends before its last segment. The caller must treat
/// what it wrote as unverified until this returns `Ok` (see [`decrypt_to_file`]).
/// The value must be the one stored at the place `binding` names ([`binding`]; a value of
/// another key or bucket fails).
pub fn decrypt(
    input: &mut dyn Read,
    key: &DataKey,
    binding: &[u8],
    out: &mut dyn Write,
) -> Result<u64> {
    let mut header = [0u8; HEADER];
    let n = read_full(input, &mut header).context("reading the encrypted value")?;
    if n < 8 || &header[..8] != MAGIC {
        // Not damage (exit 6): the wrong command for this value (exit 8).
        bail!(Error::invalid(
            "the value is not Cairn-encrypted (no CAIRNENC header); was it put with --encrypt?"
        ));
    }
    if n < HEADER {
        bail!(Error::Rejected(
            "the encrypted value is truncated (inside its header)".into()
        ));
    }
    if (header[8] != VERSION && header[8] != VERSION_UNBOUND)
        || header[9] != ALGO_XCHACHA20POLY1305_STREAM_BE32
        || header[10] != SEGMENT_LOG2
        || header[11] != 0
    {
        bail!(Error::decode(format!(
            "unsupported encryption format (version {}, algorithm {}, segment 2^{}); this \
             cairn reads versions {VERSION_UNBOUND} and {VERSION}",
            header[8], header[9], header[10]
        )));
    }
    if header[8] == VERSION_UNBOUND {
        // Not bound to its bucket and key: a node could serve another value of this data
        // key here, and it would decrypt cleanly. Refused unless allowed; then read, but
        // said (once: a value decrypted to a pipe is read twice).
        if !ALLOW_UNBOUND.load(std::sync::atomic::Ordering::Relaxed) {
            bail!(Error::Rejected(format!(
                "this value is in encryption format {VERSION_UNBOUND}, which does not bind it \
                 to its bucket and key (a node could serve another value encrypted with this \
                 data key in its place); read it with --allow-format-1 (or \
                 CAIRN_ALLOW_FORMAT_1=true) if you trust where it comes from, then put it \
                 again to store it in format {VERSION}"
            )));
        }
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| {
            eprintln!(
                "warning: this value is in encryption format {VERSION_UNBOUND}, which does not \
             bind it to its bucket and key (a node could have served another value encrypted \
             with this data key); put it again to store it in format {VERSION}"
            )
        });
    }
    if header[12 + NONCE_PREFIX..] != key.id() {
        bail!(Error::Rejected(format!(
            "the value was encrypted with another data key (key id {}, this key {})",
            hex::encode(&header[12 + NONCE_PREFIX..]),
            hex::encode(key.id())
        )));
    }
    let mut dec = DecryptorBE32::from_aead(
        key.cipher(),
        GenericArray::from_slice(&header[12..12 + NONCE_PREFIX]),
    );
    let aad = associated_data(&header, binding);
    let mut buf = Vec::with_capacity(SEGMENT + TAG + 1);
    let mut look = None;
    let mut total = 0u64;
    let mut index = 0u64;
    loop {
        let (got, more) = read_segment(input, &mut look, &mut buf, SEGMENT + TAG)
            .context("reading the encrypted value")?;
        if more {
            dec.decrypt_next_in_place(&aad, &mut buf).map_err(|_| {
                Error::Rejected(format!(
                    "segment {index} of the encrypted value does not authenticate: it was \
                     altered, or it is the value of another key or bucket"
                ))
            })?;
        } else {
            if got < TAG {
                bail!(Error::Rejected(format!(
                    "the encrypted value is truncated (segment {index} is cut short)"
                )));
            }
            dec.decrypt_last_in_place(&aad, &mut buf).map_err(|_| {
                Error::Rejected(format!(
                    "the encrypted value is truncated or altered, or it is the value of \
                     another key or bucket: its last segment ({index}) does not \
                     authenticate as the final one"
                ))
            })?;
            out.write_all(&buf).context("writing the decrypted value")?;
            total += buf.len() as u64;
            return Ok(total);
        }
        out.write_all(&buf).context("writing the decrypted value")?;
        total += buf.len() as u64;
        index += 1;
    }
}

/// Decrypts into a temporary file beside `dest` and renames it to `dest` only when the whole
/// value verified; on failure `dest` is left as it was and the temporary file is removed.
pub fn decrypt_to_file(
    input: &mut dyn Read,
    key: &DataKey,
    binding: &[u8],
    dest: &Path,
) -> Result<u64> {
    match crate::cli::out_target(dest)? {
        // A device or pipe: nothing may reach it before the whole value verified.
        crate::cli::OutTarget::InPlace => {
            let mut f = crate::cli::open_in_place(dest)?;
            // A file behind a descriptor (`--out /dev/stdout >> log`) is cut back to where
            // it was should the second pass fail part way (a full disk), so nothing of the
            // plaintext is left appended.
            let before = f.metadata().ok().filter(|m| m.is_file()).map(|m| m.len());
            let r = decrypt_to_writer(input, key, binding, &mut f);
            if r.is_err()
                && let Some(len) = before
            {
                let _ = f.set_len(len);
            }
            r
        }
        // A new plaintext file is private (0600), as the data key is.
        crate::cli::OutTarget::File(_) => {
            crate::cli::write_whole_file(dest, 0o600, &mut |w| decrypt(input, key, binding, w))
        }
    }
}

/// Decrypts to `out` (stdout, a pipe) only once the whole value verified, without putting
/// plaintext on disk: the ciphertext is spooled to an anonymous temporary file, every
/// segment and the end are authenticated in a first pass (plaintext discarded), and a
/// second pass decrypts to `out`. A spool changed between the passes fails the second
/// pass's authentication, so even then nothing unauthenticated is written.
pub fn decrypt_to_writer(
    input: &mut dyn Read,
    key: &DataKey,
    binding: &[u8],
    out: &mut dyn Write,
) -> Result<u64> {
    use std::io::Seek;
    let mut tmp: File = tempfile::tempfile().context("creating a temporary file")?;
    io::copy(input, &mut tmp).context("spooling the encrypted value")?;
    tmp.seek(io::SeekFrom::Start(0))
        .context("rewinding the temporary file")?;
    decrypt(
        &mut io::BufReader::with_capacity(1 << 20, &mut tmp),
        key,
        binding,
        &mut io::sink(),
    )?;
    tmp.seek(io::SeekFrom::Start(0))
        .context("rewinding the temporary file")?;
    let mut w = io::BufWriter::with_capacity(1 << 20, &mut *out);
    let n = decrypt(
        &mut io::BufReader::with_capacity(1 << 20, &mut tmp),
        key,
        binding,
        &mut w,
    )?;
    w.flush().context("writing the output")?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> DataKey {
        DataKey::from_secret(&[7; 32])
    }

    /// Many creators racing for one new data key all get the key that won, never an empty
    /// or partial file, and the file is private.
    #[test]
    fn racing_creators_share_one_data_key() {
        use std::os::unix::fs::PermissionsExt;
        for round in 0..40 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("sub").join("data.key");
            let ids: Vec<[u8; KEY_ID]> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..6)
                    .map(|_| s.spawn(|| load_or_create_key(&path, true).map(|k| k.id)))
                    .collect();
                hs.into_iter()
                    .map(|h| {
                        h.join()
                            .unwrap()
                            .unwrap_or_else(|e| panic!("round {round}: {e:#}"))
                    })
                    .collect()
            });
            assert!(
                ids.windows(2).all(|w| w[0] == w[1]),
                "round {round}: two keys"
            );
            assert_eq!(load_or_create_key(&path, false).unwrap().id, ids[0]);
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
            // No temporary file is left beside it.
            assert_eq!(
                std::fs::read_dir(path.parent().unwrap()).unwrap().count(),
                1
            );
        }
    }

    fn place() -> Vec<u8> {
        binding("b", "k")
    }

    fn enc(data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        EncryptReader::new(data, &key(), &place())
            .unwrap()
            .read_to_end(&mut out)
            .unwrap();
        out
    }

    /// A reader that fails once, then yields data again.
    struct FailsOnce {
        failed: bool,
        at: usize,
        given: usize,
    }

    impl Read for FailsOnce {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if !self.failed && self.given >= self.at {
                self.failed = true;
                return Err(io::Error::other("disk error"));
            }
            let n = buf.len().min(4096);
            buf[..n].fill(b'p');
            self.given += n;
            Ok(n)
        }
    }

    /// After a read error the encrypting reader fails every later read: it handed out
    /// the failed segment's plaintext (at the start) or panicked (mid-stream) when read
    /// again.
    #[test]
    fn an_input_error_stops_the_encryption_for_good() {
        for at in [0, SEGMENT + 100] {
            let inner = FailsOnce {
                failed: false,
                at,
                given: 0,
            };
            let mut r = EncryptReader::new(inner, &key(), &place()).unwrap();
            let mut out = Vec::new();
            let mut buf = vec![0u8; 1000];
            let mut errors = 0;
            for _ in 0..1000 {
                match r.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => out.extend_from_slice(&buf[..n]),
                    Err(_) => errors += 1,
                }
                if errors == 3 {
                    break;
                }
            }
            assert_eq!(errors, 3, "at {at}: the stream went on after its error");
            assert!(
                !out.windows(64).any(|w| w.iter().all(|&b| b == b'p')),
                "at {at}: plaintext came out"
            );
        }
    }

    #[test]
    fn round_trips_every_size_class() {
        for n in [
            0,
            1,
            SEGMENT - 1,
            SEGMENT,
            SEGMENT + 1,
            3 * SEGMENT,
            3 * SEGMENT + 17,
        ] {
            let data: Vec<u8> = (0..n).map(|i| (i * 31 % 251) as u8).collect();
            let c = enc(&data);
            assert_eq!(c.len() as u64, encrypted_len(n as u64), "n={n}");
            let mut back = Vec::new();
            assert_eq!(
                decrypt(&mut &c[..], &key(), &place(), &mut back).unwrap(),
                n as u64
            );
            assert_eq!(back, data);
        }
    }

    #[test]
    fn detects_tampering_truncation_and_wrong_keys() {
        let data = vec![5u8; 2 * SEGMENT + 100];
        let c = enc(&data);
        for at in [
            0,
            9,
            20,
            HEADER + 3,
            HEADER + SEGMENT + TAG + 1,
            c.len() - 1,
        ] {
            let mut t = c.clone();
            t[at] ^= 1;
            assert!(
                decrypt(&mut &t[..], &key(), &place(), &mut Vec::new()).is_err(),
                "at {at}"
            );
        }
        // Cut anywhere, including exactly at a segment boundary.
        for len in [
            0,
            5,
            HEADER,
            HEADER + 10,
            HEADER + SEGMENT + TAG,
            c.len() - 1,
        ] {
            assert!(
                decrypt(&mut &c[..len], &key(), &place(), &mut Vec::new()).is_err(),
                "len {len}"
            );
        }
        let other = DataKey::from_secret(&[8; 32]);
        assert!(decrypt(&mut &c[..], &other, &place(), &mut Vec::new()).is_err());
        // Two encryptions of one value differ (fresh nonce prefixes).
        assert_ne!(enc(&data), c);
    }

    #[test]
    fn failed_decryption_leaves_the_destination_alone() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("out");
        let mut c = enc(&vec![1u8; SEGMENT * 2]);
        let last = c.len() - 1;
        c[last] ^= 1;
        assert!(decrypt_to_file(&mut &c[..], &key(), &place(), &dest).is_err());
        assert!(!dest.exists());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    /// A value decrypts only at the place it was encrypted for: the same ciphertext read
    /// as another key's or another bucket's fails; values of format 1 (no place) are
    /// refused, and decrypt once allowed (`--allow-format-1`).
    #[test]
    fn values_are_bound_to_their_bucket_and_key() {
        let data = vec![9u8; SEGMENT + 5];
        let c = enc(&data);
        assert_eq!(c[8], VERSION);
        for elsewhere in [
            binding("b", "k2"),
            binding("b2", "k"),
            binding("bk", ""),
            Vec::new(),
        ] {
            let e = decrypt(&mut &c[..], &key(), &elsewhere, &mut Vec::new()).unwrap_err();
            assert!(e.to_string().contains("another key or bucket"), "{e}");
        }
        // Length prefixes keep ("b", "k2") and ("bk", "2") apart.
        assert_ne!(binding("b", "k2"), binding("bk", "2"));
        let mut old = Vec::new();
        EncryptReader::in_format(
            &data[..],
            &key(),
            [3; NONCE_PREFIX],
            &place(),
            VERSION_UNBOUND,
        )
        .read_to_end(&mut old)
        .unwrap();
        assert_eq!(old[8], VERSION_UNBOUND);
        let e = decrypt(&mut &old[..], &key(), &place(), &mut Vec::new()).unwrap_err();
        assert!(e.to_string().contains("--allow-format-1"), "{e}");
        allow_unbound_format(true);
        let mut back = Vec::new();
        decrypt(&mut &old[..], &key(), &binding("any", "where"), &mut back).unwrap();
        allow_unbound_format(false);
        assert_eq!(back, data);
    }
}

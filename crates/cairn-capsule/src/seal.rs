//! Owner seals: a bucket owner's own signature over what a put stores.
//!
//! A bucket written through a node's API has its records signed by the node's key (the
//! capsule's writer), so a [`crate::VersionProof`] alone shows that the node recorded a
//! version, not that the bucket's owner asked for it: a node that lies could record a
//! version it made up. An [`OwnerSeal`] closes that gap for puts. The owner (the client
//! holding the key the metadata setting [`OWNER_SETTING`] names) signs a [`SealedPut`]:
//! the capsule, the key, the branch, the base the put named (if it named one), the digest
//! of the value ([`cairn_object::FObject::value_digest`]) and the context, with the time
//! and a random nonce. The node checks the seal against the version it built before it
//! records the put, and keeps it in the put's record ([`crate::Mutation::seal`]); a reader
//! checks it again from the proof ([`crate::VersionProof::owner_seal`]), trusting only
//! the capsule name. A valid seal shows that the owner wrote that content under that key
//! and branch. It does not show which version the node chose as the base of a put that
//! named none, nor that the version is still the branch's head (freshness). A node that
//! lies can record the same seal again later (on a newer head, rolling the content back):
//! a reader of one proof cannot tell; the seal's date (when the owner sealed it) is the
//! hint, and only a scan of the capsule finds the same date and nonce twice. An honest
//! node refuses a seal dated far from its clock.

use cairn_core::{Decoder, Encoder, Error, Hash, PublicKey, Result, Signature, SigningKey};
use cairn_object::{FObject, Uid};

use crate::metadata::{CapsuleMetadata, CapsuleName};

/// The capsule metadata setting that names a bucket's owner key (`ed25519:<hex>`), or
/// `open` for a bucket anyone may write through the node (then no seal can be checked).
/// Bound into the capsule name, so a reader who trusts the name knows whose seals count.
pub const OWNER_SETTING: &str = "cairn.native.owner";
/// The signature domain of owner seals.
pub const OWNER_SEAL_DOMAIN: &[u8] = b"cairn/bucket/owner-seal/v1";
/// Format version of an encoded [`OwnerSeal`] and of the message it signs.
pub const OWNER_SEAL_VERSION: u8 = 1;
/// Bytes of a seal's nonce.
pub const SEAL_NONCE_LEN: usize = 16;
/// Length of an encoded [`OwnerSeal`].
pub const OWNER_SEAL_LEN: usize = 1 + 8 + SEAL_NONCE_LEN + 1 + cairn_core::sign::SIGNATURE_LEN;

/// What an owner seals of a put: where it goes and what it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SealedPut<'a> {
    /// The bucket's capsule.
    pub capsule: &'a CapsuleName,
    /// The key.
    pub key: &'a [u8],
    /// The tagged branch written; `None` for an untagged put on a base.
    pub branch: Option<&'a str>,
    /// The version the put named as its base (an untagged put's base, or the head a
    /// guarded put expects); `None` when the node takes the branch's head as it finds it.
    pub base: Option<&'a Uid>,
    /// [`FObject::value_digest`] of the version, under the bucket's hash algorithm.
    pub value: &'a Hash,
    /// The version's context.
    pub context: &'a [u8],
}

impl SealedPut<'_> {
    /// The bytes signed: this put, the date and the nonce, canonically encoded.
    fn message(&self, date: u64, nonce: &[u8; SEAL_NONCE_LEN]) -> Vec<u8> {
        let mut e = Encoder::versioned(OWNER_SEAL_VERSION);
        e.hash(self.capsule.hash()).bytes(self.key);
        match self.branch {
            Some(b) => e.u8(1).bytes(b.as_bytes()),
            None => e.u8(0),
        };
        match self.base {
            Some(b) => e.u8(1).hash(b),
            None => e.u8(0),
        };
        e.hash(self.value)
            .bytes(self.context)
            .u64_le(date)
            .raw(nonce);
        e.finish()
    }
}

/// A bucket owner's signature over a [`SealedPut`], with its date (seconds since the Unix
/// epoch, as the owner's clock read it) and a random nonce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OwnerSeal {
    /// When the owner sealed the put, in seconds since the Unix epoch (the owner's claim).
    pub date: u64,
    /// Random bytes, so that two seals of the same put differ.
    pub nonce: [u8; SEAL_NONCE_LEN],
    /// Whether the sealed put named its base ([`SealedPut::base`]): the version must
    /// then have that one base.
    pub names_base: bool,
    /// The owner's Ed25519 signature.
    pub signature: Signature,
}

impl OwnerSeal {
    /// Seals `put` with the owner's `key`.
    pub fn sign(
        key: &SigningKey,
        put: &SealedPut<'_>,
        date: u64,
        nonce: [u8; SEAL_NONCE_LEN],
    ) -> OwnerSeal {
        let signature = key.sign(OWNER_SEAL_DOMAIN, &put.message(date, &nonce));
        OwnerSeal {
            date,
            nonce,
            names_base: put.base.is_some(),
            signature,
        }
    }

    /// Checks that `owner` sealed exactly `put` ([`Error::Rejected`] otherwise).
    pub fn verify(&self, owner: &PublicKey, put: &SealedPut<'_>) -> Result<()> {
        if self.names_base != put.base.is_some() {
            return Err(Error::Rejected(
                "the owner seal names a base where the put has none, or none where it has one"
                    .into(),
            ));
        }
        owner
            .verify(
                OWNER_SEAL_DOMAIN,
                &put.message(self.date, &self.nonce),
                &self.signature,
            )
            .map_err(|_| {
                Error::Rejected(format!(
                    "the owner seal does not verify under {owner} for this put (key, branch, \
                     base, value or context differ from what the owner sealed)"
                ))
            })
    }

    /// Checks that `owner` sealed the put of version `object` (its key, value and
    /// context) to `branch` of `capsule`, and, when the seal names a base, that the
    /// version's one base is it. `algo` is the bucket's hash algorithm.
    pub fn verify_put(
        &self,
        owner: &PublicKey,
        capsule: &CapsuleName,
        branch: Option<&str>,
        object: &FObject,
        algo: cairn_core::HashAlgo,
    ) -> Result<()> {
        let base = match (self.names_base, object.bases.as_slice()) {
            (false, _) => None,
            (true, [b]) => Some(b),
            (true, bases) => {
                return Err(Error::Rejected(format!(
                    "the owner sealed a put on one base; the version has {}",
                    bases.len()
                )));
            }
        };
        let value = object.value_digest(algo);
        self.verify(
            owner,
            &SealedPut {
                capsule,
                key: &object.key,
                branch,
                base,
                value: &value,
                context: &object.context,
            },
        )
    }

    /// Appends the seal's fields (no version byte: see [`Self::encode`]).
    pub(crate) fn encode_fields(&self, e: &mut Encoder) {
        e.u64_le(self.date)
            .raw(&self.nonce)
            .bool(self.names_base)
            .raw(&self.signature.raw());
    }

    /// Reads the fields [`Self::encode_fields`] wrote.
    pub(crate) fn decode_fields(d: &mut Decoder<'_>) -> Result<Self> {
        let date = d.u64_le()?;
        let mut nonce = [0u8; SEAL_NONCE_LEN];
        nonce.copy_from_slice(d.raw(SEAL_NONCE_LEN)?);
        let names_base = d.bool()?;
        let signature = Signature::from_raw(d.raw(cairn_core::sign::SIGNATURE_LEN)?)?;
        Ok(OwnerSeal {
            date,
            nonce,
            names_base,
            signature,
        })
    }

    /// The canonical encoding ([`OWNER_SEAL_LEN`] bytes), as a client sends it to a node.
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::versioned(OWNER_SEAL_VERSION);
        self.encode_fields(&mut e);
        e.finish()
    }

    /// Decodes an encoding; anything but the canonical bytes is refused.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let mut d = Decoder::new(bytes, "owner seal");
        d.version(&[OWNER_SEAL_VERSION])?;
        let s = Self::decode_fields(&mut d)?;
        d.finish()?;
        Ok(s)
    }
}

/// The bucket owner `meta` names in [`OWNER_SETTING`]: `Ok(Some(key))` for a key,
/// `Ok(None)` when it names none (`open`, or no setting: a bucket not written through a
/// node's API, whose writer is its owner), an error when the setting is not a key.
pub fn bucket_owner(meta: &CapsuleMetadata) -> Result<Option<PublicKey>> {
    match meta.settings.get(OWNER_SETTING).map(String::as_str) {
        None | Some("open") => Ok(None),
        Some(k) => k.parse().map(Some).map_err(|e| {
            Error::Rejected(format!(
                "capsule {}: setting {OWNER_SETTING} is not an owner key: {e}",
                meta.name()
            ))
        }),
    }
}

//! The verification cache and its server-side mirror (DCS §3.3).
//!
//! A reader remembers the names (record names and subrecord-tree nodes) it has verified,
//! so later proofs may stop at any of them. The server keeps an exact mirror of each
//! session's cache so it can build proofs that stop early. Both sides run the same
//! deterministic structure ([`VerificationCache`]) with the same policy, and apply the same
//! insertions in the same order. When they apply them is the session's [`MirrorMode`]:
//! with [`MirrorMode::OnAck`] the reader stages what a proof verified and inserts it when it
//! sends the proof's ack, and the server inserts the same names when that ack arrives; with
//! [`MirrorMode::OnIssue`] the server inserts what a proof names when it issues it and the
//! reader inserts the same names as soon as the proof verifies (the prototype's
//! optimistic mirror: pipelined proofs chain off each other, and no acks travel). Lookups
//! never reorder the cache, so only these insertions move either copy.
//!
//! A mirror that drifts (lost acks, a refused proof under `OnIssue`, a buggy or lying
//! server) can only make the server send proofs that stop at names the reader does not
//! trust; the reader refuses those and asks again without the cache, or opens a new
//! session with its cached names. It never makes the reader accept anything.

use std::num::NonZeroUsize;

use cairn_core::{Decoder, Encoder, Error, Hash, Result};
use lru::LruCache;

/// How a reader's cache evicts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CachePolicy {
    /// No cache: every proof runs to a writer signature.
    Off,
    /// Least-recently-inserted eviction with room for `capacity` names (re-inserting a name
    /// refreshes it).
    Lru {
        /// Most names kept.
        capacity: u32,
    },
}

impl CachePolicy {
    /// Largest capacity a server agrees to mirror per session.
    pub const MAX_CAPACITY: u32 = 1 << 22;

    /// Appends the encoding.
    pub fn encode(&self, e: &mut Encoder) {
        match self {
            CachePolicy::Off => {
                e.u8(0);
            }
            CachePolicy::Lru { capacity } => {
                e.u8(1).varint(*capacity as u64);
            }
        }
    }

    /// Reads what [`CachePolicy::encode`] wrote; refuses capacities over
    /// [`CachePolicy::MAX_CAPACITY`].
    pub fn decode(d: &mut Decoder<'_>) -> Result<Self> {
        match d.u8()? {
            0 => Ok(CachePolicy::Off),
            1 => {
                let c = d.varint()?;
                if c == 0 || c > Self::MAX_CAPACITY as u64 {
                    return Err(Error::decode(format!(
                        "cache capacity {c} (1 to {} allowed)",
                        Self::MAX_CAPACITY
                    )));
                }
                Ok(CachePolicy::Lru { capacity: c as u32 })
            }
            other => Err(Error::decode(format!("unknown cache policy {other}"))),
        }
    }
}

/// When a server's mirror of a session's cache takes in the names of a proof it issued.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MirrorMode {
    /// When the reader acks the proof (the reader inserts when it sends the ack). A proof
    /// issued before an ack arrives cannot stop at what that ack covers, so pipelined
    /// proofs do not chain off each other; the mirror stays exact whatever the reader
    /// refuses.
    #[default]
    OnAck,
    /// When the server issues the proof (the reader inserts as soon as it verifies it), as
    /// the DCS prototype does: a window of pipelined proofs chains off each other and no
    /// acks are sent. If the reader refuses a proof, the mirror holds names the reader
    /// does not, so later proofs may stop at names it never verified: it refuses those
    /// too, and resynchronises (a new session with its cached names) or asks without the
    /// cache.
    OnIssue,
}

impl MirrorMode {
    /// Appends the encoding.
    pub fn encode(&self, e: &mut Encoder) {
        e.u8(match self {
            MirrorMode::OnAck => 0,
            MirrorMode::OnIssue => 1,
        });
    }

    /// Reads what [`MirrorMode::encode`] wrote.
    pub fn decode(d: &mut Decoder<'_>) -> Result<Self> {
        match d.u8()? {
            0 => Ok(MirrorMode::OnAck),
            1 => Ok(MirrorMode::OnIssue),
            other => Err(Error::decode(format!("unknown mirror mode {other}"))),
        }
    }
}

/// A bounded set of verified names with a deterministic eviction order.
///
/// Memory grows with the names actually held, not with the policy's capacity: a session
/// that asks for a large cache and verifies little costs little (a server mirrors one per
/// reader session, so a preallocated table per session would let idle sessions pin
/// memory and would zero pages no name ever uses).
pub struct VerificationCache {
    policy: CachePolicy,
    /// The names, with the capacity the policy allows.
    lru: Option<(LruCache<Hash, ()>, NonZeroUsize)>,
}

impl VerificationCache {
    /// An empty cache with `policy`.
    pub fn new(policy: CachePolicy) -> Result<Self> {
        let lru = match policy {
            CachePolicy::Off => None,
            CachePolicy::Lru { capacity } => {
                if capacity > CachePolicy::MAX_CAPACITY {
                    return Err(Error::invalid(format!(
                        "cache capacity {capacity} exceeds {}",
                        CachePolicy::MAX_CAPACITY
                    )));
                }
                let cap = NonZeroUsize::new(capacity as usize)
                    .ok_or_else(|| Error::invalid("cache capacity must be at least 1"))?;
                Some((LruCache::unbounded(), cap))
            }
        };
        Ok(VerificationCache { policy, lru })
    }

    /// The policy.
    pub fn policy(&self) -> CachePolicy {
        self.policy
    }

    /// Whether `name` is cached. Does not change the eviction order.
    pub fn contains(&self, name: &Hash) -> bool {
        self.lru.as_ref().is_some_and(|(l, _)| l.contains(name))
    }

    /// Inserts `names` in order (each becomes the most recent).
    pub fn insert_all<'a>(&mut self, names: impl IntoIterator<Item = &'a Hash>) {
        if let Some((l, cap)) = self.lru.as_mut() {
            for n in names {
                l.put(*n, ());
                if l.len() > cap.get() {
                    l.pop_lru();
                }
            }
        }
    }

    /// Number of names held.
    pub fn len(&self) -> usize {
        self.lru.as_ref().map_or(0, |(l, _)| l.len())
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The cached names, least recent first: re-inserting them in this order into a fresh
    /// cache of the same policy rebuilds this cache exactly (how a reader restores its
    /// mirror in a new session).
    pub fn names(&self) -> Vec<Hash> {
        match &self.lru {
            Some((l, _)) => l.iter().rev().map(|(k, _)| *k).collect(),
            None => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_core::HashAlgo;

    fn h(i: u32) -> Hash {
        HashAlgo::Blake3.digest(&i.to_le_bytes())
    }

    #[test]
    fn mirror_stays_exact() {
        let p = CachePolicy::Lru { capacity: 4 };
        let mut a = VerificationCache::new(p).unwrap();
        let mut b = VerificationCache::new(p).unwrap();
        for i in 0..10 {
            let ins = [h(i), h(i / 2)];
            a.insert_all(&ins);
            b.insert_all(&ins);
            assert_eq!(a.names(), b.names());
        }
        assert_eq!(a.len(), 4);
        let mut c = VerificationCache::new(p).unwrap();
        c.insert_all(&a.names());
        assert_eq!(c.names(), a.names());
        assert!(!a.contains(&h(0)) && a.contains(&h(9)));
    }

    proptest::proptest! {
        /// The cache behaves as a least-recently-inserted list of at most `capacity` names.
        #[test]
        fn matches_a_list_model(cap in 1u32..8, ops in proptest::collection::vec(0u32..12, 0..64)) {
            let mut c = VerificationCache::new(CachePolicy::Lru { capacity: cap }).unwrap();
            let mut model: Vec<Hash> = Vec::new();
            for i in ops {
                c.insert_all(&[h(i)]);
                model.retain(|n| *n != h(i));
                model.push(h(i));
                if model.len() > cap as usize {
                    model.remove(0);
                }
                proptest::prop_assert_eq!(c.names(), model.clone());
                proptest::prop_assert_eq!(c.len(), model.len());
            }
        }
    }
}

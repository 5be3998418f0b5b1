//! Branch tables (ForkBase §4.5): per key, the TB-table of tagged branches (name → head
//! uid) and the UB-table of untagged heads (leaves of the derivation graph left by puts on
//! a base version and by merges of untagged heads). A store keeps them as one ref per head
//! (`Db`'s head refs: a tagged branch by name, an untagged head by uid), read back into a
//! table; [`BranchTable::encode`] and [`BranchTable::decode`] are a whole-table form that
//! no store layout uses today (its decoder is fuzzed like the others).

use std::collections::{BTreeMap, BTreeSet};

use cairn_core::{Decoder, Encoder, Error, Result};

use crate::fobject::Uid;

/// Format version of the branch table encoding.
pub const BRANCH_TABLE_FORMAT: u8 = 1;
/// Longest branch name accepted.
pub const MAX_BRANCH_LEN: usize = 255;

/// The heads of one key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BranchTable {
    /// Tagged branches: name → head uid.
    pub tagged: BTreeMap<String, Uid>,
    /// Untagged heads.
    pub untagged: BTreeSet<Uid>,
}

impl BranchTable {
    /// The heads, for an error message: the tagged branch names, and how many untagged
    /// heads there are (`branches KEY --untagged` lists them).
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = Vec::new();
        if !self.tagged.is_empty() {
            // At most 20 named: a key may have very many, and this goes into an error.
            const SHOWN: usize = 20;
            let names: Vec<&str> = self.tagged.keys().take(SHOWN).map(String::as_str).collect();
            let more = self.tagged.len().saturating_sub(SHOWN);
            let tail = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            parts.push(format!("branches: {}{tail}", names.join(", ")));
        } else {
            parts.push("no tagged branch".into());
        }
        if !self.untagged.is_empty() {
            parts.push(format!("{} untagged head(s)", self.untagged.len()));
        }
        parts.join("; ")
    }

    /// True when the key has no heads at all (it no longer exists).
    pub fn is_empty(&self) -> bool {
        self.tagged.is_empty() && self.untagged.is_empty()
    }

    /// Every head, tagged and untagged, without duplicates.
    pub fn heads(&self) -> BTreeSet<Uid> {
        self.tagged
            .values()
            .copied()
            .chain(self.untagged.iter().copied())
            .collect()
    }

    /// Canonical encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::versioned(BRANCH_TABLE_FORMAT);
        e.varint(self.tagged.len() as u64);
        for (name, uid) in &self.tagged {
            e.bytes(name.as_bytes());
            e.hash(uid);
        }
        e.varint(self.untagged.len() as u64);
        for uid in &self.untagged {
            e.hash(uid);
        }
        e.finish()
    }

    /// Parses [`BranchTable::encode`]'s output strictly.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let mut d = Decoder::new(bytes, "branch table");
        d.version(&[BRANCH_TABLE_FORMAT])?;
        let mut t = BranchTable::default();
        let n = d.count(1 + cairn_core::hash::ENCODED_LEN)?;
        // Canonical: names and untagged heads strictly increasing (sorted, no repeats).
        for _ in 0..n {
            let name = d.str()?.to_string();
            let uid = d.hash()?;
            if t.tagged
                .keys()
                .next_back()
                .is_some_and(|last| *last >= name)
            {
                return Err(Error::decode(
                    "branch table names are not strictly increasing",
                ));
            }
            t.tagged.insert(name, uid);
        }
        let n = d.count(cairn_core::hash::ENCODED_LEN)?;
        for _ in 0..n {
            let uid = d.hash()?;
            if t.untagged
                .iter()
                .next_back()
                .is_some_and(|last| *last >= uid)
            {
                return Err(Error::decode("untagged heads are not strictly increasing"));
            }
            t.untagged.insert(uid);
        }
        d.finish()?;
        Ok(t)
    }
}

/// A place in the list of a key's heads, as [`crate::Db::heads_page`] walks it: tagged
/// branches by name, then untagged heads by uid. Its text form (`tagged:NAME` or
/// `untagged:UID`) is how a paged listing says where to go on. Ordered as the listing
/// goes (and as the store sorts the head refs): tagged before untagged, names and uids by
/// their bytes.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum HeadPos {
    /// Tagged branch `NAME`.
    Tagged(String),
    /// Untagged head `UID`.
    Untagged(Uid),
}

impl std::fmt::Display for HeadPos {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeadPos::Tagged(name) => write!(f, "tagged:{name}"),
            HeadPos::Untagged(uid) => write!(f, "untagged:{uid}"),
        }
    }
}

impl std::str::FromStr for HeadPos {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        if let Some(name) = s.strip_prefix("tagged:") {
            check_branch_name(name)?;
            Ok(HeadPos::Tagged(name.to_string()))
        } else if let Some(uid) = s.strip_prefix("untagged:") {
            let uid = uid
                .parse::<Uid>()
                .map_err(|e| Error::invalid(format!("{uid:?} is not a version id: {e}")))?;
            Ok(HeadPos::Untagged(uid))
        } else {
            Err(Error::invalid(format!(
                "{s:?} is not a place in a list of heads (tagged:NAME or untagged:UID)"
            )))
        }
    }
}

/// Checks a branch name: 1 to 255 bytes of printable ASCII other than space, not a uid.
pub fn check_branch_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > MAX_BRANCH_LEN {
        return Err(Error::invalid(format!(
            "branch name must be 1 to {MAX_BRANCH_LEN} characters"
        )));
    }
    if !name.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Error::invalid(format!(
            "branch name {name:?} may contain only printable ASCII without spaces"
        )));
    }
    if name.parse::<Uid>().is_ok() {
        return Err(Error::invalid(format!(
            "branch name {name:?} would be read as a version id"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_core::HashAlgo;

    /// An error naming a key's branches names at most 20 of them (a key may have very
    /// many: the whole list went into every "branch not found").
    #[test]
    fn describe_names_at_most_twenty_branches() {
        let mut t = BranchTable::default();
        for i in 0..30 {
            t.tagged
                .insert(format!("b{i:02}"), HashAlgo::Blake3.digest(&[i]));
        }
        let d = t.describe();
        assert!(
            d.contains("b00") && d.contains("b19") && !d.contains("b20"),
            "{d}"
        );
        assert!(d.ends_with("and 10 more"), "{d}");
    }

    #[test]
    fn round_trip_and_strictness() {
        let mut t = BranchTable::default();
        t.tagged
            .insert("master".into(), HashAlgo::Blake3.digest(b"a"));
        t.tagged.insert("dev".into(), HashAlgo::Blake3.digest(b"b"));
        t.untagged.insert(HashAlgo::Blake3.digest(b"c"));
        let bytes = t.encode();
        assert_eq!(BranchTable::decode(&bytes).unwrap(), t);
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(BranchTable::decode(&longer).is_err());
        assert!(BranchTable::decode(&bytes[..bytes.len() - 1]).is_err());
        assert_eq!(t.heads().len(), 3);
    }

    #[test]
    fn branch_names() {
        assert!(check_branch_name("master").is_ok());
        assert!(check_branch_name("feature/x-1").is_ok());
        assert!(check_branch_name("").is_err());
        assert!(check_branch_name("a b").is_err());
        assert!(check_branch_name(&"x".repeat(256)).is_err());
        let uid = HashAlgo::Blake3.digest(b"x").to_hex();
        assert!(check_branch_name(&uid).is_err());
    }
}

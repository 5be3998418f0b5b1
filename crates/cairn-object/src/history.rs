//! Version history queries (ForkBase Table 1 M15 to M17, §3.2): Track (versions within a
//! distance range of a version), LCA (least common ancestor, the base of a three-way merge)
//! and Diff (between two versions of the same type, descending only into the parts of
//! their POS-trees that differ).

use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet, VecDeque};
use std::ops::ControlFlow;

use bytes::Bytes;
use cairn_core::{Error, Result};
use cairn_store::ChunkStore;

use crate::db::{At, Db};
use crate::fobject::{FObject, Uid};
use crate::postree::{self, KeyChange, SeqChange};
use crate::value::{Value, ValueType};

/// One version found by [`Db::track`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrackEntry {
    /// Number of derivation steps from the starting version (0 = the start).
    pub distance: u64,
    /// The version id.
    pub uid: Uid,
    /// The version.
    pub object: FObject,
}

/// What differs between two versions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Diff {
    /// The values are identical.
    Same,
    /// Primitive values that differ: left then right.
    Primitive(Value, Value),
    /// Map or Set: the keys whose entries differ.
    Sorted(Vec<KeyChange>),
    /// Blob or List: the regions that differ.
    Seq(Vec<SeqChange>),
}

/// Where a page of a diff ended, to go on from (see [`Db::diff_values_page`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DiffCursor {
    /// Map or Set: the last key reported.
    AfterKey(Bytes),
    /// Blob or List: the ends of the last region reported, in the first and the second
    /// value.
    AfterRegion {
        /// End of the region in the first value.
        a: u64,
        /// End of the region in the second value.
        b: u64,
    },
}

impl DiffCursor {
    /// Text form, for APIs: `k` and the key in hex, or `r<a>-<b>`.
    pub fn token(&self) -> String {
        match self {
            DiffCursor::AfterKey(k) => format!("k{}", hex::encode(k)),
            DiffCursor::AfterRegion { a, b } => format!("r{a}-{b}"),
        }
    }

    /// Reads [`DiffCursor::token`]'s form back; anything else is
    /// [`Error::InvalidInput`].
    pub fn parse(token: &str) -> Result<Self> {
        let bad = || {
            Error::invalid(format!(
                "{token:?} is not a diff cursor (k<hex> or r<a>-<b>)"
            ))
        };
        if let Some(h) = token.strip_prefix('k') {
            return Ok(DiffCursor::AfterKey(
                hex::decode(h).map_err(|_| bad())?.into(),
            ));
        }
        let (a, b) = token
            .strip_prefix('r')
            .and_then(|r| r.split_once('-'))
            .ok_or_else(bad)?;
        Ok(DiffCursor::AfterRegion {
            a: a.parse().map_err(|_| bad())?,
            b: b.parse().map_err(|_| bad())?,
        })
    }
}

impl Db {
    /// M15 / M16: the versions whose distance from `from` lies in `min..=max`, nearest
    /// first, following every base (a merge's history includes both sides).
    pub fn track(&self, key: &[u8], from: &At, min: u64, max: u64) -> Result<Vec<TrackEntry>> {
        let mut out = Vec::new();
        self.track_each(key, from, min, max, &mut |e| {
            out.push(e);
            Ok(ControlFlow::Continue(()))
        })?;
        Ok(out)
    }

    /// [`Db::track`], handing each version to `each` as it is found (nearest first)
    /// instead of collecting them, so a caller that keeps only what it needs of each holds
    /// no values; `each` may stop the walk (`Break`) or fail it.
    pub fn track_each(
        &self,
        key: &[u8],
        from: &At,
        min: u64,
        max: u64,
        each: &mut dyn FnMut(TrackEntry) -> Result<ControlFlow<()>>,
    ) -> Result<()> {
        let start = self.resolve(key, from)?;
        let mut seen = HashSet::new();
        let mut queue = VecDeque::from([(start, 0u64)]);
        seen.insert(start);
        while let Some((uid, dist)) = queue.pop_front() {
            if dist > max {
                break;
            }
            // The start is the version asked for by uid, or a branch head (reached through
            // its head ref); the rest are reached through bases.
            let object = if dist == 0 && matches!(from, At::Uid(_)) {
                self.load_for_key(key, &uid)?
            } else {
                self.load_reached(key, &uid)?
            };
            if dist < max {
                for b in &object.bases {
                    if seen.insert(*b) {
                        queue.push_back((*b, dist + 1));
                    }
                }
            }
            if dist >= min
                && each(TrackEntry {
                    distance: dist,
                    uid,
                    object,
                })?
                .is_break()
            {
                break;
            }
        }
        Ok(())
    }

    /// M17: the least common ancestor of two versions of `key` (the deepest version both
    /// derive from), or `None` when their histories are disjoint. Walks only down to the
    /// answer's depth, newest first, using each FObject's depth.
    pub fn lca(&self, key: &[u8], a: &Uid, b: &Uid) -> Result<Option<Uid>> {
        // Versions named from outside are this bucket's, or not found (see
        // `VersionMembership`).
        self.admit(key, a)?;
        self.admit(key, b)?;
        lca_in(self.chunks(), key, a, b)
    }

    /// Every merge base of two versions of `key` (see [`merge_bases_in`]), deepest first:
    /// one for most histories, several after criss-cross merges, none for disjoint ones.
    pub fn merge_bases(&self, key: &[u8], a: &Uid, b: &Uid) -> Result<Vec<Uid>> {
        self.admit(key, a)?;
        self.admit(key, b)?;
        merge_bases_in(self.chunks(), key, a, b)
    }

    /// Diff between two versions of the same type (they may belong to different keys, of
    /// this bucket).
    pub fn diff(&self, a: &Uid, b: &Uid) -> Result<Diff> {
        self.admit_uid(a)?;
        self.admit_uid(b)?;
        let (oa, ob) = (self.load(a)?, self.load(b)?);
        self.diff_values(&oa.value, &ob.value)
    }

    /// Diff between two values of the same type.
    pub fn diff_values(&self, a: &Value, b: &Value) -> Result<Diff> {
        diff_values_in(self.chunks(), a, b)
    }

    /// [`Db::diff_values`] a page at a time: at most `limit` (≥ 1) changed keys or regions
    /// after `after` (from the start with `None`), and where the next page starts (`None`
    /// when this one ends the diff). Memory stays bounded by the page, and a page after a
    /// key reads no subtree of keys before it. A cursor of the wrong kind, or a region
    /// cursor whose positions are not where leaves start in the two values, is
    /// [`Error::InvalidInput`]; a region cursor at leaf starts that no earlier page ended
    /// at is taken as given: the diff goes on from those positions, so only cursors from
    /// earlier pages give the rest of the whole diff.
    pub fn diff_values_page(
        &self,
        a: &Value,
        b: &Value,
        after: Option<&DiffCursor>,
        limit: usize,
    ) -> Result<(Diff, Option<DiffCursor>)> {
        diff_page_in(self.chunks(), a, b, after, limit)
    }

    /// Every version reachable from `key`'s heads, by uid (for tools and tests).
    pub fn all_versions(&self, key: &[u8]) -> Result<BTreeMap<Uid, FObject>> {
        let t = self.existing_table(key)?;
        let mut out = BTreeMap::new();
        let mut stack: Vec<Uid> = t.heads().into_iter().collect();
        while let Some(u) = stack.pop() {
            if out.contains_key(&u) {
                continue;
            }
            let o = self.load_reached(key, &u)?;
            stack.extend(o.bases.iter().copied());
            out.insert(u, o);
        }
        Ok(out)
    }
}

/// Loads version `uid` from `chunks` (verified against the uid by the store) and checks it
/// belongs to `key`.
pub fn load_version(chunks: &dyn ChunkStore, key: &[u8], uid: &Uid) -> Result<FObject> {
    load_version_chunk(chunks, key, uid).map(|(_, o)| o)
}

/// [`load_version`], with the Meta chunk it decoded.
pub(crate) fn load_version_chunk(
    chunks: &dyn ChunkStore,
    key: &[u8],
    uid: &Uid,
) -> Result<(Bytes, FObject)> {
    load_version_as(chunks, key, uid, false)
}

/// [`load_version`] of a version reached through a head ref or a base rather than named
/// by the caller: there, a version of another key is damage ([`Error::Corrupt`]), not a
/// version that is not there.
pub(crate) fn load_reached_version(
    chunks: &dyn ChunkStore,
    key: &[u8],
    uid: &Uid,
) -> Result<FObject> {
    load_version_as(chunks, key, uid, true).map(|(_, o)| o)
}

fn load_version_as(
    chunks: &dyn ChunkStore,
    key: &[u8],
    uid: &Uid,
    reached: bool,
) -> Result<(Bytes, FObject)> {
    let chunk = chunks.get(uid)?.ok_or_else(|| {
        if reached {
            // A head ref or a base naming a version the store does not hold: damage (a
            // missing Gaia revocation read as "none" would fail open).
            Error::corrupt(format!(
                "version {uid}, reached as a version of key {}, is missing",
                crate::fobject::show_key(key)
            ))
        } else {
            Error::not_found(format!("version {uid}"))
        }
    })?;
    let o = FObject::from_chunk(&chunk)
        .map_err(|e| Error::corrupt(format!("version {uid} does not decode: {e}")))?;
    if o.key != key {
        let (k, other) = (
            crate::fobject::show_key(key),
            crate::fobject::show_key(&o.key),
        );
        return Err(if reached {
            Error::corrupt(format!(
                "version {uid}, reached as a version of key {k}, is a version of key {other}"
            ))
        } else {
            // Not a version of `key`: as not found as a uid no one made (a `?uid=` of
            // another key's version was a 400, which said the request was malformed).
            Error::not_found(format!(
                "version {uid} of key {k} (it is a version of key {other})"
            ))
        });
    }
    Ok((chunk, o))
}

/// [`Db::lca`] over any chunk store (a node's, or the chunks a node sent, see
/// [`crate::evidence`]): the least common ancestor of two versions of `key` (the deepest version both
/// derive from), or `None` when their histories are disjoint. Walks only down to the
/// answer's depth, newest first, using each FObject's depth.
pub fn lca_in(chunks: &dyn ChunkStore, key: &[u8], a: &Uid, b: &Uid) -> Result<Option<Uid>> {
    Ok(common_ancestors(chunks, key, a, b, false)?
        .into_iter()
        .next())
}

/// Every merge base of two versions of `key`: the common ancestors that are not ancestors
/// of another common ancestor, deepest first (empty when the histories are disjoint). A
/// criss-cross history (each side merged the other's branch) has several; a three-way
/// merge against any one of them alone can silently undo a change made after it.
pub fn merge_bases_in(chunks: &dyn ChunkStore, key: &[u8], a: &Uid, b: &Uid) -> Result<Vec<Uid>> {
    common_ancestors(chunks, key, a, b, true)
}

/// Most versions waiting in an LCA walk, plus the bases they name (about 100 bytes each
/// held, and as much again for the depth being walked: some 800 MiB at most). Smaller in
/// unit tests, so that a test can pass it.
#[cfg(not(test))]
const MAX_LCA_FRONTIER: usize = 1 << 22;
#[cfg(test)]
const MAX_LCA_FRONTIER: usize = 64;

/// The walk behind [`lca_in`] and [`merge_bases_in`]: versions newest first by depth,
/// each marked with the sides it is reached from; a version reached from both is a
/// common ancestor, and everything below it is marked stale (an ancestor of an answer is
/// no answer). Stops at the first answer unless `all`, else once only stale versions are
/// left to visit. Refuses histories wider than [`MAX_LCA_FRONTIER`] at one depth.
fn common_ancestors(
    chunks: &dyn ChunkStore,
    key: &[u8],
    a: &Uid,
    b: &Uid,
    all: bool,
) -> Result<Vec<Uid>> {
    const A: u8 = 1;
    const B: u8 = 2;
    const STALE: u8 = 4;
    let mut flags: HashMap<Uid, u8> = HashMap::new();
    let mut heap = BinaryHeap::new();
    // Only what the walk needs of each version waiting in the heap (not its value), and
    // each version is read once: a chunk source that hands each chunk out once (a
    // stream, see `crate::evidence`) serves this walk.
    let mut pending: HashMap<Uid, (u64, Vec<Uid>)> = HashMap::new();
    // Versions waiting in the heap that are not stale; of them, those reached from `a`
    // and those reached from `b`. A new answer needs a version reached from both sides
    // that is not stale, so once no live version carries one side the walk is over: a
    // history with a long branch merged in on one side since the fork used to be walked
    // to the branch's start below the answer, and disjoint histories to their roots.
    let mut live = 0usize;
    let mut live_sides = [0usize; 2];
    let count = |sides: &mut [usize; 2], f: u8, add: bool| {
        for (i, side) in [A, B].into_iter().enumerate() {
            if f & side != 0 {
                if add {
                    sides[i] += 1;
                } else {
                    sides[i] -= 1;
                }
            }
        }
    };
    // Bases the versions of `pending` name, together.
    let mut pending_bases = 0usize;
    for (u, f) in [(*a, A), (*b, B)] {
        *flags.entry(u).or_default() |= f;
        if let std::collections::hash_map::Entry::Vacant(e) = pending.entry(u) {
            let o = load_version(chunks, key, &u)?;
            heap.push((o.depth, u));
            pending_bases += o.bases.len();
            e.insert((o.depth, o.bases));
            live += 1;
        }
    }
    let starts: &[Uid] = if a == b { &[*a] } else { &[*a, *b] };
    for u in starts {
        count(&mut live_sides, flags.get(u).copied().unwrap_or(0), true);
    }
    let mut found = Vec::new();
    let mut done = HashSet::new();
    // Versions walked, in walk order (so by depth, deepest first). One deeper than the
    // version being walked is never reached again (a base is shallower than its child),
    // so it leaves `done` and `flags`: the walk holds its frontier, not the history.
    let mut walked: VecDeque<(u64, Uid)> = VecDeque::new();
    while let Some((depth_now, uid)) = heap.pop() {
        while walked.front().is_some_and(|(d, _)| *d > depth_now) {
            if let Some((_, old)) = walked.pop_front() {
                done.remove(&old);
                flags.remove(&old);
            }
        }
        if !done.insert(uid) {
            continue;
        }
        walked.push_back((depth_now, uid));
        let mut f = flags.get(&uid).copied().unwrap_or(0);
        if f & STALE == 0 {
            live -= 1;
            count(&mut live_sides, f, false);
        }
        if f == A | B {
            found.push(uid);
            if !all {
                break;
            }
            f |= STALE;
        }
        let (depth, bases) = pending
            .remove(&uid)
            .ok_or_else(|| Error::corrupt(format!("version {uid} left the LCA walk")))?;
        pending_bases -= bases.len();
        for base in &bases {
            let entry = flags.entry(*base).or_default();
            let before = *entry;
            *entry |= f;
            if before == 0 {
                let bo = load_reached_version(chunks, key, base)?;
                if bo.depth >= depth {
                    return Err(Error::corrupt(format!(
                        "version {uid} has depth {depth} but its base {base} has depth {}",
                        bo.depth
                    )));
                }
                heap.push((bo.depth, *base));
                pending_bases += bo.bases.len();
                pending.insert(*base, (bo.depth, bo.bases));
                if f & STALE == 0 {
                    live += 1;
                    count(&mut live_sides, f, true);
                }
                // The frontier, not the history, is held; a history wider than any real
                // one (versions naming thousands of bases each, all different: what a
                // made-up stream of chunks can say) would hold memory without end.
                if pending.len().saturating_add(pending_bases) > MAX_LCA_FRONTIER {
                    return Err(Error::invalid(format!(
                        "the histories of {a} and {b} are wider than {MAX_LCA_FRONTIER} \
                         versions and bases at one depth; no common ancestor is looked for"
                    )));
                }
            } else if done.contains(base) {
                if *entry != before {
                    return Err(Error::corrupt(format!(
                        "history of version {uid} is not ordered by depth"
                    )));
                }
            } else if before & STALE == 0 && f & STALE != 0 {
                // Waiting in the heap, and stale from now on.
                live -= 1;
                count(&mut live_sides, before, false);
            } else if before & STALE == 0 {
                // Waiting in the heap, live, and now reached from another side too.
                count(&mut live_sides, f & !before, true);
            }
        }
        // Only stale versions left, or none reached from one of the sides: none of them,
        // nor anything below, is an answer.
        if live == 0 || live_sides.contains(&0) {
            break;
        }
    }
    Ok(found)
}

/// [`Db::diff_values`] over any chunk store.
pub fn diff_values_in(chunks: &dyn ChunkStore, a: &Value, b: &Value) -> Result<Diff> {
    if a.value_type() != b.value_type() {
        return Err(Error::TypeMismatch(format!(
            "cannot diff a {} with a {}",
            a.value_type(),
            b.value_type()
        )));
    }
    if a == b {
        return Ok(Diff::Same);
    }
    Ok(match (a, b) {
        (Value::Tree(ta), Value::Tree(tb)) => match a.value_type() {
            ValueType::Map | ValueType::Set => Diff::Sorted(postree::diff_sorted(chunks, ta, tb)?),
            _ => Diff::Seq(postree::diff_seq(chunks, ta, tb)?),
        },
        _ => Diff::Primitive(a.clone(), b.clone()),
    })
}

/// Bytes of keys and values a page of a Map or Set diff holds before it ends early (with a
/// cursor to go on from), once it holds at least one change.
pub const DIFF_PAGE_BYTES: usize = 8 << 20;

/// [`Db::diff_values_page`] over any chunk store (a node's, or the chunks a node sent, see
/// [`crate::evidence`]).
pub fn diff_page_in(
    chunks: &dyn ChunkStore,
    a: &Value,
    b: &Value,
    after: Option<&DiffCursor>,
    limit: usize,
) -> Result<(Diff, Option<DiffCursor>)> {
    if limit == 0 {
        return Err(Error::invalid("a diff page holds at least one change"));
    }
    if a.value_type() != b.value_type() {
        return Err(Error::TypeMismatch(format!(
            "cannot diff a {} with a {}",
            a.value_type(),
            b.value_type()
        )));
    }
    let wrong = |c: &DiffCursor| {
        Err(Error::invalid(format!(
            "diff cursor {} does not go with a {} diff",
            c.token(),
            a.value_type()
        )))
    };
    let (Value::Tree(ta), Value::Tree(tb)) = (a, b) else {
        if let Some(c) = after {
            return wrong(c);
        }
        return Ok((diff_values_in(chunks, a, b)?, None));
    };
    if a == b {
        return Ok((Diff::Same, None));
    }
    if matches!(a.value_type(), ValueType::Map | ValueType::Set) {
        let from = match after {
            None => None,
            Some(DiffCursor::AfterKey(k)) => Some(&k[..]),
            Some(c) => return wrong(c),
        };
        // A page ends at `limit` changes or once it holds DIFF_PAGE_BYTES of keys and
        // values (after at least one change): a map's values may be 16 MiB each.
        let mut out: Vec<KeyChange> = Vec::new();
        let mut more = false;
        let mut bytes = 0usize;
        postree::diff_sorted_each(chunks, ta, tb, from, &mut |c: KeyChange| {
            if out.len() == limit || (bytes >= DIFF_PAGE_BYTES && !out.is_empty()) {
                more = true;
                return Ok(std::ops::ControlFlow::Break(()));
            }
            bytes = bytes
                .saturating_add(c.key.len())
                .saturating_add(c.left.as_ref().map_or(0, |v| v.len()))
                .saturating_add(c.right.as_ref().map_or(0, |v| v.len()));
            // Copied out of their leaves: a slice would keep its whole leaf (and a large
            // unchanged value beside it) in memory for as long as the page is held.
            let own = |b: &Bytes| Bytes::copy_from_slice(b);
            out.push(KeyChange {
                key: own(&c.key),
                left: c.left.as_ref().map(own),
                right: c.right.as_ref().map(own),
            });
            Ok(std::ops::ControlFlow::Continue(()))
        })?;
        let next = more
            .then(|| out.last().map(|c| DiffCursor::AfterKey(c.key.clone())))
            .flatten();
        return Ok((Diff::Sorted(out), next));
    }
    let from = match after {
        None => None,
        Some(DiffCursor::AfterRegion { a, b }) => Some((*a, *b)),
        Some(c) => return wrong(c),
    };
    let (out, more): (Vec<SeqChange>, bool) = postree::collect_changes(limit, |each| {
        postree::diff_seq_each(chunks, ta, tb, from, each)
    })?;
    let next = more
        .then(|| {
            out.last().map(|c| DiffCursor::AfterRegion {
                a: c.a_end,
                b: c.b_end,
            })
        })
        .flatten();
    Ok((Diff::Seq(out), next))
}

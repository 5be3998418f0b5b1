//! Three-way merge (ForkBase §3.3.3, §4.5.2): Merge(key, tgt_brh, ref_brh) (M5),
//! Merge(key, tgt_brh, ref_uid) (M6) and Merge(key, uid1, ...) of untagged heads (M7).
//!
//! The base of the merge is the LCA of the two versions. Each side's changes against the
//! base are found by POS-tree diff (only differing subtrees are read); changes that do not
//! overlap are combined, and overlapping ones are conflicts handed to a [`Resolver`]:
//! built-ins `ours`, `theirs`, `append`, `sum` (Integer, or Map values holding decimal
//! integers), `union` (Set, Tuple), or a custom hook. A merge with an unresolved conflict
//! returns the conflicts and changes no branch.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::ops::ControlFlow;
use std::str::FromStr;

use bytes::Bytes;
use cairn_core::{Error, Result};
use cairn_store::ChunkStore;

use crate::db::{Db, HeadChange, HeadChangeKind, PutOptions};
use crate::fobject::{FObject, Uid, show_key};
use crate::postree::{self, SeqChange, TreeKind, TreeRef};
use crate::value::{Value, ValueType};

/// Default of [`Db::with_merge_memory`]: 256 MiB.
pub const DEFAULT_MERGE_MEMORY: u64 = 256 << 20;

/// Bookkeeping bytes counted for each change, element or region on top of its bytes.
const ENTRY_OVERHEAD: u64 = 64;

/// What one merge holds in memory (changes, regions, conflicts, merged content), against
/// the Db's limit, so that merging huge divergent values fails cleanly instead of
/// exhausting the process.
struct MergeMemory {
    used: u64,
    limit: u64,
}

impl MergeMemory {
    fn charge(&mut self, bytes: u64) -> Result<()> {
        self.used = self
            .used
            .saturating_add(bytes.saturating_add(ENTRY_OVERHEAD));
        if self.used > self.limit {
            return Err(Error::invalid(format!(
                "this merge needs more than {} MiB in memory (the changes of both sides, the \
                 regions they touch and the conflicts); nothing was written. Merge smaller \
                 changes at a time, or write the merged value yourself with a guarded put",
                self.limit >> 20
            )));
        }
        Ok(())
    }

    fn charge_change(&mut self, c: &postree::KeyChange) -> Result<()> {
        let len = |b: &Option<Bytes>| b.as_ref().map_or(0, |b| b.len() as u64);
        self.charge(c.key.len() as u64 + len(&c.left) + len(&c.right))
    }
}

/// Where a conflict is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConflictAt {
    /// The whole value (String, Integer, Tuple).
    Value,
    /// One key of a Map.
    MapKey(Bytes),
    /// A region of a Blob (bytes) or List (elements), in the base version's coordinates.
    Range {
        /// Start in the base.
        start: u64,
        /// End (exclusive) in the base.
        end: u64,
    },
}

/// Both sides changed the same thing differently.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    /// What the conflict is about.
    pub at: ConflictAt,
    /// The base's content there (`None`: absent). For Lists, elements are joined by `\n`.
    pub base: Option<Bytes>,
    /// Our side's content.
    pub ours: Option<Bytes>,
    /// Their side's content.
    pub theirs: Option<Bytes>,
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |b: &Option<Bytes>| match b {
            None => "(absent)".to_string(),
            Some(b) => {
                let s = String::from_utf8_lossy(&b[..b.len().min(60)]).into_owned();
                if b.len() > 60 {
                    format!("{s:?}…")
                } else {
                    format!("{s:?}")
                }
            }
        };
        match &self.at {
            ConflictAt::Value => write!(f, "value")?,
            ConflictAt::MapKey(k) => write!(f, "map key {}", show_key(k))?,
            ConflictAt::Range { start, end } => write!(f, "range {start}..{end} of the base")?,
        }
        write!(
            f,
            ": base {}, ours {}, theirs {}",
            show(&self.base),
            show(&self.ours),
            show(&self.theirs)
        )
    }
}

/// How a resolver settles one conflict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// Keep our side.
    Ours,
    /// Take their side.
    Theirs,
    /// Use this content (`None` deletes a Map key). For a List region or a Tuple it is
    /// read as elements one per line, so it cannot hold an element containing a newline,
    /// nor a single empty element: use [`Resolution::Elements`] for those.
    Value(Option<Bytes>),
    /// Use these elements, for a List region or a Tuple (for any other value the conflict
    /// stays unresolved).
    Elements(Vec<Bytes>),
    /// Use the base's content (as it is, not through the conflict's text, which joins a
    /// List region's or a Tuple's elements with newlines).
    Base,
}

/// A conflict resolution strategy: returns `None` to leave a conflict unresolved.
pub trait Resolver: Send + Sync {
    /// Settles one conflict of a value of type `ty`, or declines.
    fn resolve(&self, ty: ValueType, c: &Conflict) -> Option<Resolution>;

    /// The built-in resolver this is, if any (lets Tuple merges act on elements).
    fn builtin(&self) -> Option<BuiltinResolver> {
        None
    }
}

/// The built-in resolvers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum BuiltinResolver {
    /// Resolve nothing: any conflict fails the merge.
    #[default]
    Manual,
    /// Keep our side of every conflict.
    Ours,
    /// Take their side of every conflict.
    Theirs,
    /// Our content followed by theirs (String, Blob, List, Tuple, Map values).
    Append,
    /// ours + theirs - base, as integers (Integer; Map values holding decimal integers),
    /// also where both sides made the same change (a counter both moved: 5 to 6 on each side
    /// merges to 7).
    Sum,
    /// Elements of ours, then those of theirs not in ours (Tuple, List regions); Sets always
    /// merge as a union of both sides' changes.
    Union,
}

impl FromStr for BuiltinResolver {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "manual" | "none" => BuiltinResolver::Manual,
            "ours" => BuiltinResolver::Ours,
            "theirs" => BuiltinResolver::Theirs,
            "append" => BuiltinResolver::Append,
            "sum" => BuiltinResolver::Sum,
            "union" => BuiltinResolver::Union,
            other => {
                return Err(Error::invalid(format!(
                    "unknown resolver {other:?} (expected ours, theirs, append, sum or union)"
                )));
            }
        })
    }
}

fn parse_int(b: &Option<Bytes>) -> Option<i64> {
    match b {
        None => Some(0),
        Some(b) => std::str::from_utf8(b).ok()?.trim().parse().ok(),
    }
}

impl Resolver for BuiltinResolver {
    fn builtin(&self) -> Option<BuiltinResolver> {
        Some(*self)
    }

    fn resolve(&self, ty: ValueType, c: &Conflict) -> Option<Resolution> {
        match self {
            BuiltinResolver::Manual => None,
            BuiltinResolver::Ours => Some(Resolution::Ours),
            BuiltinResolver::Theirs => Some(Resolution::Theirs),
            BuiltinResolver::Append => match ty {
                // Lists and Tuples append element-wise in the merge itself.
                ValueType::Integer | ValueType::Set | ValueType::Tuple | ValueType::List => None,
                _ => {
                    // A side that deleted a Map entry has nothing to append to or from:
                    // leave it (appending to nothing kept a fragment of theirs), as an
                    // edit of theirs inside the base ([`appended_part`]).
                    let ours = c.ours.as_deref()?;
                    let theirs = c.theirs.as_deref()?;
                    let base = c.base.as_deref().unwrap_or_default();
                    let mut v = ours.to_vec();
                    v.extend_from_slice(&appended_part(base, theirs)?);
                    Some(Resolution::Value(Some(v.into())))
                }
            },
            BuiltinResolver::Sum => match ty {
                ValueType::Integer | ValueType::Map => {
                    // A side that deleted a Map entry has no number to add: leave it.
                    c.ours.as_ref()?;
                    c.theirs.as_ref()?;
                    // In 128 bits: ours + theirs may overflow where the result does not.
                    let s = i128::from(parse_int(&c.ours)?) + i128::from(parse_int(&c.theirs)?)
                        - i128::from(parse_int(&c.base)?);
                    let s = i64::try_from(s).ok()?;
                    Some(Resolution::Value(Some(s.to_string().into())))
                }
                _ => None,
            },
            // Union applies to Lists and Tuples element-wise in the merge itself; Sets always
            // merge as the union of both sides' changes.
            BuiltinResolver::Union => None,
        }
    }
}

/// Settles each conflict between merge bases with the value of their own common base, as
/// Git does in a virtual merge base: the outer merge then sees both heads' changes on that
/// value and leaves them to the caller's resolver (bases conflicting with each other never
/// block a merge by themselves).
struct BaseOfBases;

impl Resolver for BaseOfBases {
    fn resolve(&self, _ty: ValueType, _c: &Conflict) -> Option<Resolution> {
        Some(Resolution::Base)
    }
}

/// Lengths of the common prefix and (non-overlapping) common suffix of `a` and `b`.
fn common_ends<T: PartialEq>(a: &[T], b: &[T]) -> (usize, usize) {
    let p = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let s = a[p..]
        .iter()
        .rev()
        .zip(b[p..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    (p, s)
}

/// What `x` put in `base`'s place for append to add after ours: what it added before or
/// after the whole of `base`, or all of `x`, when it replaced `base` from end to end;
/// `None` otherwise. Of an edit inside `base`, the units that differ from it are a
/// fragment ("quick" changed to "quack" differs by "a", "quick" to "quickest" by "est"),
/// not something added, so append leaves that conflict to the caller.
fn appended_part<T: PartialEq + Clone>(base: &[T], x: &[T]) -> Option<Vec<T>> {
    let (p, s) = common_ends(base, x);
    (p == base.len() || s == base.len() || (p == 0 && s == 0)).then(|| x[p..x.len() - s].to_vec())
}

/// Element-level three-way merge of one region: `Some` when ours and theirs changed
/// disjoint parts of `base` (both changes applied), `None` when their changes overlap.
fn merge_region<T: PartialEq + Clone>(base: &[T], ours: &[T], theirs: &[T]) -> Option<Vec<T>> {
    let (po, so) = common_ends(base, ours);
    let (pt, st) = common_ends(base, theirs);
    let ro = (po, base.len() - so);
    let rt = (pt, base.len() - st);
    let (first, first_new, second, second_new) = if ro.1 < rt.0 {
        (
            ro,
            &ours[po..ours.len() - so],
            rt,
            &theirs[pt..theirs.len() - st],
        )
    } else if rt.1 < ro.0 {
        (
            rt,
            &theirs[pt..theirs.len() - st],
            ro,
            &ours[po..ours.len() - so],
        )
    } else {
        return None;
    };
    let mut out = Vec::with_capacity(base.len() + first_new.len() + second_new.len());
    out.extend_from_slice(&base[..first.0]);
    out.extend_from_slice(first_new);
    out.extend_from_slice(&base[first.1..second.0]);
    out.extend_from_slice(second_new);
    out.extend_from_slice(&base[second.1..]);
    Some(out)
}

/// Longest an element-level diff of one merge region may take before it settles for a
/// coarser answer. Coarser hunks make larger conflicts, which a resolver would replace
/// whole (losing the other side's edits inside them), so conflicts of a cut-short diff
/// are never resolved automatically ([`diff3`] says when it was).
const DIFF3_DEADLINE: std::time::Duration = std::time::Duration::from_millis(500);

#[cfg(test)]
thread_local! {
    /// A test's stand-in for [`DIFF3_DEADLINE`].
    static TEST_DIFF3_DEADLINE: std::cell::Cell<Option<std::time::Duration>> =
        const { std::cell::Cell::new(None) };
}

/// [`DIFF3_DEADLINE`] (or, in tests, what a test set).
fn diff3_deadline() -> std::time::Duration {
    #[cfg(test)]
    if let Some(d) = TEST_DIFF3_DEADLINE.with(std::cell::Cell::get) {
        return d;
    }
    DIFF3_DEADLINE
}

/// One part of a three-way merge of a region ([`diff3`]).
#[derive(Debug, PartialEq, Eq)]
enum Seg<C> {
    /// Content both sides agree on (unchanged, changed by one side, or changed alike).
    Agreed(C),
    /// Changes of both sides that overlap (or touch) and differ: the base units
    /// `start..end` of the region, and what each side has in their place.
    Conflict {
        start: usize,
        end: usize,
        base: C,
        ours: C,
        theirs: C,
    },
}

impl<C> Seg<C> {
    /// The same part with its contents passed through `f`.
    fn map<D>(self, f: impl Fn(C) -> D) -> Seg<D> {
        match self {
            Seg::Agreed(c) => Seg::Agreed(f(c)),
            Seg::Conflict {
                start,
                end,
                base,
                ours,
                theirs,
            } => Seg::Conflict {
                start,
                end,
                base: f(base),
                ours: f(ours),
                theirs: f(theirs),
            },
        }
    }
}

/// The changed parts of `side` against `base`, as `(base start, base end, side start, side
/// end)`, sorted and disjoint: the gaps between the runs a Myers diff matches. The runs
/// are checked (in order on both sides, and equal) before they are used; should they not
/// be, the whole region counts as one change, which can only make a conflict more. The
/// flag says whether the diff is exact: `false` when it ran past the deadline (and so may
/// have settled for coarser hunks) or its runs did not check out.
fn hunks<T: Eq + std::hash::Hash + Ord>(
    base: &[T],
    side: &[T],
) -> (Vec<(usize, usize, usize, usize)>, bool) {
    let whole = || (vec![(0, base.len(), 0, side.len())], false);
    let deadline = std::time::Instant::now().checked_add(diff3_deadline());
    let ops =
        similar::capture_diff_slices_deadline(similar::Algorithm::Myers, base, side, deadline);
    let exact = deadline.is_some_and(|d| std::time::Instant::now() < d);
    let mut runs: Vec<(usize, usize, usize)> = ops
        .iter()
        .map(similar::DiffOp::as_tag_tuple)
        .filter(|(tag, b, _)| *tag == similar::DiffTag::Equal && !b.is_empty())
        .map(|(_, b, x)| (b.start, x.start, b.len()))
        .collect();
    runs.sort_unstable();
    let mut out = Vec::new();
    let (mut pb, mut px) = (0usize, 0usize);
    for (b0, x0, len) in runs {
        let fits = b0 >= pb
            && x0 >= px
            && b0 + len <= base.len()
            && x0 + len <= side.len()
            && base[b0..b0 + len] == side[x0..x0 + len];
        if !fits {
            return whole();
        }
        if b0 > pb || x0 > px {
            out.push((pb, b0, px, x0));
        }
        pb = b0 + len;
        px = x0 + len;
    }
    if pb < base.len() || px < side.len() {
        out.push((pb, base.len(), px, side.len()));
    }
    (out, exact)
}

/// Element-level three-way merge (diff3) of one region: each side's changes against the
/// base, found by a Myers diff, are applied where they do not overlap; overlapping (or
/// touching) changes of both sides are agreed when they give the same content, else a
/// conflict of just that part. So non-conflicting edits of a side are never lost to a
/// conflict elsewhere in the region, whatever resolves that conflict, as long as both
/// diffs were exact (the flag returned; see [`hunks`]).
fn diff3<T: Eq + std::hash::Hash + Ord + Clone>(
    base: &[T],
    ours: &[T],
    theirs: &[T],
) -> (Vec<Seg<Vec<T>>>, bool) {
    let ((ho, exact_o), (ht, exact_t)) = (hunks(base, ours), hunks(base, theirs));
    let (mut i, mut j) = (0, 0);
    // Where each side is, in its own units, at base position `pos`.
    let (mut pos, mut at_o, mut at_t) = (0usize, 0usize, 0usize);
    let mut out: Vec<Seg<Vec<T>>> = Vec::new();
    let agreed = |out: &mut Vec<Seg<Vec<T>>>, units: &[T]| {
        if units.is_empty() {
            return;
        }
        match out.last_mut() {
            Some(Seg::Agreed(v)) => v.extend_from_slice(units),
            _ => out.push(Seg::Agreed(units.to_vec())),
        }
    };
    loop {
        let next_o = ho.get(i).map(|h| h.0);
        let next_t = ht.get(j).map(|h| h.0);
        let start = match (next_o, next_t) {
            (None, None) => break,
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) | (None, Some(a)) => a,
        };
        // The group: every hunk of either side that overlaps or touches it.
        let (gi, gj) = (i, j);
        let mut end = start;
        loop {
            let mut grew = false;
            if let Some(h) = ho.get(i).filter(|h| h.0 <= end) {
                end = end.max(h.1);
                i += 1;
                grew = true;
            }
            if let Some(h) = ht.get(j).filter(|h| h.0 <= end) {
                end = end.max(h.1);
                j += 1;
                grew = true;
            }
            if !grew {
                break;
            }
        }
        agreed(&mut out, &base[pos..start]);
        at_o += start - pos;
        at_t += start - pos;
        // Each side's content in place of base `start..end`: from where it stands at
        // `start` to where its last hunk in the group ends, plus the base units after it.
        let content =
            |src: &[T], hs: &[(usize, usize, usize, usize)], at: usize| -> (Vec<T>, usize) {
                match hs.last() {
                    Some(last) => {
                        let s1 = last.3 + (end - last.1);
                        (src[at..s1].to_vec(), s1 - at)
                    }
                    None => (base[start..end].to_vec(), end - start),
                }
            };
        let (oc, o_len) = content(ours, &ho[gi..i], at_o);
        let (tc, t_len) = content(theirs, &ht[gj..j], at_t);
        at_o += o_len;
        at_t += t_len;
        let (o_changed, t_changed) = (i > gi, j > gj);
        if !t_changed || oc == tc {
            agreed(&mut out, &oc);
        } else if !o_changed {
            agreed(&mut out, &tc);
        } else {
            out.push(Seg::Conflict {
                start,
                end,
                base: base[start..end].to_vec(),
                ours: oc,
                theirs: tc,
            });
        }
        pos = end;
    }
    agreed(&mut out, &base[pos..]);
    (out, exact_o && exact_t)
}

/// `ours`, then the elements of `theirs` that `ours` lacks, in their order (linear time).
fn union(ours: &[Bytes], theirs: &[Bytes]) -> Vec<Bytes> {
    let have: HashSet<&Bytes> = ours.iter().collect();
    let mut out = ours.to_vec();
    out.extend(theirs.iter().filter(|x| !have.contains(x)).cloned());
    out
}

fn split_lines(b: &[u8]) -> Vec<&[u8]> {
    if b.is_empty() {
        Vec::new()
    } else {
        b.split(|x| *x == b'\n').collect()
    }
}

/// What a merge did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MergeOutcome {
    /// A new merged version was made and became the head.
    Merged(Uid),
    /// The target was an ancestor of the other side; the head moved forward to it.
    FastForward(Uid),
    /// The other side was already contained in the target; nothing changed.
    UpToDate(Uid),
    /// Unresolved conflicts; nothing was written (versions and chunks the merge made on
    /// the way, such as a virtual merge base, were held in memory and dropped).
    Conflicts(Vec<Conflict>),
}

impl Db {
    /// M5 / M6: merges the version `from` into tagged branch `into` of `key`; with
    /// `opts.guard`, only while `into`'s head is that version ([`Error::GuardMismatch`]
    /// otherwise, nothing changed).
    pub fn merge_into(
        &self,
        key: &[u8],
        into: &str,
        from: &crate::db::At,
        resolver: &dyn Resolver,
        opts: &PutOptions,
    ) -> Result<MergeOutcome> {
        let _w = self.writer_guard();
        let _k = self.lock_key(key);
        // Only the refs involved are read and written (the target branch, and the untagged
        // heads the merge retires): a key's table may hold very many branches (a Gaia
        // file's archive), and each merge read all of them twice.
        let Some(ours) = self.branch_head(key, into)? else {
            // A guarded merge into a branch that is not there fails its guard (as a guarded
            // put does).
            return Err(match opts.guard {
                Some(g) => Error::GuardMismatch(format!(
                    "branch {into:?} of key {} is at nothing, not {g}",
                    show_key(key)
                )),
                None => self.missing_branch(key, into),
            });
        };
        // A guarded merge (compare-and-set on the target's head), checked under the key's
        // lock with the commit.
        if let Some(g) = opts.guard
            && ours != g
        {
            return Err(Error::GuardMismatch(format!(
                "branch {into:?} of key {} is at {ours}, not {g}",
                show_key(key)
            )));
        }
        if opts.branch_from.is_some() {
            return Err(Error::invalid(
                "a merge's target branch must exist: branch_from does not apply",
            ));
        }
        let theirs = self.resolve(key, from)?;
        // Heads reached through head refs: another key's version there is damage (the
        // merge's walk would take it for a version that is not there).
        self.load_reached(key, &ours)?;
        if let crate::db::At::Branch(_) = from {
            self.load_reached(key, &theirs)?;
        }
        // Chunks held until the merge is known to move the head (an unresolved merge
        // writes nothing, not even a virtual base).
        let (view, staged) = self.staged_view();
        let outcome = view.merge_pair(key, ours, theirs, resolver, opts)?;
        match &outcome {
            MergeOutcome::Merged(u) | MergeOutcome::FastForward(u) => {
                // What the new head reaches (not a virtual base): nothing for a fast
                // forward, whose head is there already.
                staged.flush_reachable(u)?;
                let mut updates = vec![self.tagged_update(key, into, u)];
                if self.is_untagged_head(key, &theirs)? {
                    updates.push(self.untagged_delete(key, &theirs));
                }
                // The old head, if it was an untagged head too, now has a descendant: it
                // leaves the heads, recorded unless the merge record names it as a base
                // (a fast forward past it does not).
                let bases = self.load(u)?.bases;
                let mut changes = Vec::with_capacity(2);
                let ours_untagged = ours != theirs && self.is_untagged_head(key, &ours)?;
                if ours_untagged {
                    updates.push(self.untagged_delete(key, &ours));
                }
                if ours_untagged && ours != *u && !bases.contains(&ours) {
                    changes.push(HeadChange {
                        kind: HeadChangeKind::Remove,
                        key,
                        branch: None,
                        from: None,
                        uid: ours,
                        bases: &[],
                        object: None,
                        owner_seal: None,
                    });
                }
                changes.push(HeadChange {
                    kind: HeadChangeKind::Merge,
                    key,
                    branch: Some(into),
                    from: None,
                    uid: *u,
                    bases: &bases,
                    object: None,
                    owner_seal: None,
                });
                // Together, all or none.
                self.record_heads(&changes)?;
                self.store().commit(&updates)?;
            }
            MergeOutcome::UpToDate(_) => {
                // `from` is contained in the target: an untagged head it was is now derived,
                // and leaves the heads (recorded, as every head change is).
                if self.is_untagged_head(key, &theirs)? {
                    self.record_head(HeadChange {
                        kind: HeadChangeKind::Remove,
                        key,
                        branch: None,
                        from: None,
                        uid: theirs,
                        bases: &[],
                        object: None,
                        owner_seal: None,
                    })?;
                    self.store().commit(&[self.untagged_delete(key, &theirs)])?;
                }
            }
            MergeOutcome::Conflicts(_) => {}
        }
        Ok(outcome)
    }

    /// M7: merges untagged heads of `key` (all of them when `uids` is empty) into one new
    /// untagged head that replaces them.
    pub fn merge_untagged(
        &self,
        key: &[u8],
        uids: &[Uid],
        resolver: &dyn Resolver,
        opts: &PutOptions,
    ) -> Result<MergeOutcome> {
        if opts.guard.is_some() || opts.branch_from.is_some() {
            return Err(Error::invalid(
                "a merge of untagged heads names its heads: a guard or branch_from does not apply",
            ));
        }
        let _w = self.writer_guard();
        let _k = self.lock_key(key);
        let mut table = self.existing_table(key)?;
        let inputs: Vec<Uid> = if uids.is_empty() {
            table.untagged.iter().copied().collect()
        } else {
            uids.to_vec()
        };
        /// Heads one merge takes at most (they all become the new version's bases).
        const MAX_MERGED_HEADS: usize = 1 << 16;
        if inputs.len() > MAX_MERGED_HEADS {
            return Err(Error::invalid(format!(
                "{} untagged heads in one merge; at most {MAX_MERGED_HEADS} (name some)",
                inputs.len()
            )));
        }
        if let Some(u) = inputs.iter().find(|u| !table.untagged.contains(*u)) {
            return Err(Error::invalid(format!(
                "version {u} is not an untagged head of key {}",
                show_key(key)
            )));
        }
        let mut named = HashSet::with_capacity(inputs.len());
        if let Some(u) = inputs.iter().find(|u| !named.insert(**u)) {
            return Err(Error::invalid(format!(
                "version {u} is named twice; a merge needs two different untagged heads"
            )));
        }
        if inputs.len() < 2 {
            return Err(Error::invalid(format!(
                "key {} has {} untagged head(s); a merge needs at least two",
                show_key(key),
                inputs.len()
            )));
        }
        // Untagged heads, reached through head refs: another key's version there is damage.
        // Their depth is kept for the merged version's.
        let mut depth = 0u64;
        for u in &inputs {
            depth = depth.max(self.load_reached(key, u)?.depth);
        }
        // Chunks held until every pair merged: one that conflicts leaves nothing written
        // (the pairwise merges before it included).
        let (view, staged) = self.staged_view();
        let mut acc = inputs[0];
        let mut merges = 0;
        for next in &inputs[1..] {
            match view.merge_pair(key, acc, *next, resolver, opts)? {
                MergeOutcome::Merged(u) => {
                    acc = u;
                    merges += 1;
                    // The earlier pairs' chunks the running result no longer reaches.
                    staged.retain_reachable(&acc)?;
                }
                MergeOutcome::FastForward(u) | MergeOutcome::UpToDate(u) => acc = u,
                c @ MergeOutcome::Conflicts(_) => return Ok(c),
            }
        }
        if merges > 1 {
            // The pairwise merges made intermediate versions: the new head is one version of
            // the merged value whose bases are all the heads merged, so every version in its
            // history is one a head change recorded.
            let merged = view.load(&acc)?;
            acc = view.store_object(&FObject {
                key: merged.key,
                value: merged.value,
                depth: depth.checked_add(1).ok_or_else(|| {
                    Error::corrupt("a version being merged claims the greatest depth there is")
                })?,
                bases: inputs.clone(),
                context: Bytes::copy_from_slice(&opts.context),
            })?;
        }
        let bases = view.load(&acc)?.bases;
        staged.flush_reachable(&acc)?;
        for u in &inputs {
            table.untagged.remove(u);
        }
        table.untagged.insert(acc);
        // Every head that leaves is recorded: as a base of the merge record, or, contained
        // in another head (a fast forward or an up-to-date step), as a Remove without a
        // branch. With no merge made, the head that stays is no new version: no merge
        // record, only the others' removals.
        let mut changes: Vec<HeadChange<'_>> = inputs
            .iter()
            .filter(|u| **u != acc && (merges == 0 || !bases.contains(u)))
            .map(|u| HeadChange {
                kind: HeadChangeKind::Remove,
                key,
                branch: None,
                from: None,
                uid: *u,
                bases: &[],
                object: None,
                owner_seal: None,
            })
            .collect();
        if merges > 0 {
            changes.push(HeadChange {
                kind: HeadChangeKind::Merge,
                key,
                branch: None,
                from: None,
                uid: acc,
                bases: &bases,
                object: None,
                owner_seal: None,
            });
        }
        // Together (one group of records for a journal), all or none.
        self.record_heads(&changes)?;
        self.commit_table(key, &table)?;
        // No merge made a version: every other head was contained in this one.
        Ok(if merges == 0 {
            MergeOutcome::FastForward(acc)
        } else {
            MergeOutcome::Merged(acc)
        })
    }

    /// Merges `theirs` into `ours`, storing the merged FObject (but committing no branch).
    fn merge_pair(
        &self,
        key: &[u8],
        ours: Uid,
        theirs: Uid,
        resolver: &dyn Resolver,
        opts: &PutOptions,
    ) -> Result<MergeOutcome> {
        self.merge_pair_at(key, ours, theirs, resolver, opts, 0)
    }

    /// [`Db::merge_pair`] as a merge of merge bases `level` deep: when the sides have
    /// several merge bases (a criss-cross history), they are merged first (recursively)
    /// into one virtual base, a version no branch names (held with the merge's other
    /// writes until it succeeds, see [`crate::staged`]), as Git's recursive
    /// strategy does; where the bases conflict with each other, the virtual base keeps
    /// their own common base's value ([`BaseOfBases`]). Taking any one of them alone could
    /// silently undo a change.
    fn merge_pair_at(
        &self,
        key: &[u8],
        ours: Uid,
        theirs: Uid,
        resolver: &dyn Resolver,
        opts: &PutOptions,
        level: usize,
    ) -> Result<MergeOutcome> {
        /// Merges of merge bases inside merges of merge bases, at most.
        const MAX_LEVELS: usize = 16;
        if ours == theirs {
            return Ok(MergeOutcome::UpToDate(ours));
        }
        // Not `Db::merge_bases`, which admits only versions the bucket recorded: a merge
        // of merge bases works on versions it has just built.
        let bases = crate::history::merge_bases_in(self.chunks(), key, &ours, &theirs)?;
        if bases.contains(&theirs) {
            return Ok(MergeOutcome::UpToDate(ours));
        }
        if bases.contains(&ours) {
            return Ok(MergeOutcome::FastForward(theirs));
        }
        let lca = match bases.split_first() {
            None => None,
            Some((first, [])) => Some(*first),
            Some((first, rest)) => {
                if level >= MAX_LEVELS {
                    return Err(Error::invalid(format!(
                        "the merge bases of {ours} and {theirs} are merges of merge bases \
                         {MAX_LEVELS} levels deep"
                    )));
                }
                let mut acc = *first;
                for next in rest {
                    acc = match self.merge_pair_at(
                        key,
                        acc,
                        *next,
                        &BaseOfBases,
                        &PutOptions::default(),
                        level + 1,
                    )? {
                        MergeOutcome::Merged(u)
                        | MergeOutcome::FastForward(u)
                        | MergeOutcome::UpToDate(u) => u,
                        c @ MergeOutcome::Conflicts(_) => return Ok(c),
                    };
                }
                Some(acc)
            }
        };
        // Ours is a branch head and the base an ancestor (reached: another key's version
        // there is damage); theirs may be a version the caller named.
        let o = self.load_reached(key, &ours)?;
        let t = self.load_for_key(key, &theirs)?;
        if o.value_type() != t.value_type() {
            return Err(Error::TypeMismatch(format!(
                "cannot merge a {} with a {}",
                o.value_type(),
                t.value_type()
            )));
        }
        let base = match lca {
            Some(b) => self.load_reached(key, &b)?.value,
            None => self.empty_value(o.value_type())?,
        };
        crate::fobject::check_context(&opts.context)?;
        // Merges of merge bases (level > 0) build a virtual base.
        let merged = match self.merge_values_in(&base, &o.value, &t.value, resolver, level > 0)? {
            Ok(v) => v,
            Err(conflicts) => return Ok(MergeOutcome::Conflicts(conflicts)),
        };
        let object = FObject {
            key: o.key.clone(),
            value: merged,
            depth: o.depth.max(t.depth).checked_add(1).ok_or_else(|| {
                Error::corrupt("a version being merged claims the greatest depth there is")
            })?,
            bases: vec![ours, theirs],
            context: Bytes::copy_from_slice(&opts.context),
        };
        Ok(MergeOutcome::Merged(self.store_object(&object)?))
    }

    fn empty_value(&self, ty: ValueType) -> Result<Value> {
        Ok(match ty {
            ValueType::String => Value::String(Bytes::new()),
            ValueType::Integer => Value::Integer(0),
            ValueType::Tuple => Value::Tuple(Vec::new()),
            _ => {
                let kind = ty
                    .tree_kind()
                    .ok_or_else(|| Error::invalid(format!("no empty {ty}")))?;
                Value::Tree(postree::empty(self.chunks(), kind)?)
            }
        })
    }

    /// Three-way merge of values; `Ok(Err(conflicts))` when some stay unresolved. The
    /// merged value's new chunks are written without the writers' lock, so until a version
    /// names them a GC may collect them: commit it through a put (as the merges of
    /// branches do, holding the lock) before a GC can run.
    pub fn merge_values(
        &self,
        base: &Value,
        ours: &Value,
        theirs: &Value,
        resolver: &dyn Resolver,
    ) -> Result<std::result::Result<Value, Vec<Conflict>>> {
        self.merge_values_in(base, ours, theirs, resolver, false)
    }

    /// [`Db::merge_values`]; `virtual_base` when merging merge bases with each other into a
    /// virtual base (every span of which the outer merge reads again against both heads,
    /// so taking the base for a span loses no one's edits).
    fn merge_values_in(
        &self,
        base: &Value,
        ours: &Value,
        theirs: &Value,
        resolver: &dyn Resolver,
        virtual_base: bool,
    ) -> Result<std::result::Result<Value, Vec<Conflict>>> {
        // Under `sum` an Integer (or a Map's number) is a counter: both sides changing it
        // alike (each added 1 to 5) is two changes to add up (7), not one agreed value (6).
        let summing = resolver.builtin() == Some(BuiltinResolver::Sum)
            && ours == theirs
            && base != ours
            && matches!(ours.value_type(), ValueType::Integer | ValueType::Map);
        if summing && matches!(ours, Value::Integer(_)) {
            // A sum past the 64-bit range keeps the value both sides agree on (as a Map's
            // entry does), rather than a conflict between equal sides.
            return Ok(Ok(merge_primitive(
                ValueType::Integer,
                base,
                ours,
                theirs,
                resolver,
            )
            .unwrap_or_else(|_| ours.clone())));
        }
        if (ours == theirs && !summing) || base == theirs {
            return Ok(Ok(ours.clone()));
        }
        if base == ours {
            return Ok(Ok(theirs.clone()));
        }
        let ty = ours.value_type();
        let mut mem = MergeMemory {
            used: 0,
            limit: self.merge_memory(),
        };
        match (base, ours, theirs) {
            (Value::Tree(b), Value::Tree(o), Value::Tree(t)) => match o.kind {
                TreeKind::Map | TreeKind::Set => self.merge_sorted(ty, b, o, t, resolver, &mut mem),
                TreeKind::Blob | TreeKind::List => {
                    self.merge_seq(ty, b, o, t, resolver, &mut mem, virtual_base)
                }
            },
            _ => Ok(merge_primitive(ty, base, ours, theirs, resolver)),
        }
    }

    fn merge_sorted(
        &self,
        ty: ValueType,
        b: &TreeRef,
        o: &TreeRef,
        t: &TreeRef,
        resolver: &dyn Resolver,
        mem: &mut MergeMemory,
    ) -> Result<std::result::Result<Value, Vec<Conflict>>> {
        let s = self.chunks();
        let summing = ty == ValueType::Map && resolver.builtin() == Some(BuiltinResolver::Sum);
        let mut ours: BTreeMap<Bytes, Option<Bytes>> = BTreeMap::new();
        postree::diff_sorted_each(s, b, o, None, &mut |c| {
            mem.charge_change(&c)?;
            ours.insert(c.key, c.right);
            Ok(ControlFlow::Continue(()))
        })?;
        let mut edits: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::new();
        let mut conflicts = Vec::new();
        postree::diff_sorted_each(s, b, t, None, &mut |c| {
            mem.charge_change(&c)?;
            let theirs = c.right.clone();
            match ours.get(&c.key) {
                None => edits.push((c.key.to_vec(), theirs.map(|v| v.to_vec()))),
                Some(our) if *our == theirs => {
                    // Under `sum`, a number both sides changed alike is added up as a
                    // counter's changes are (see `merge_values`); anything else both sides
                    // did alike (a deletion, a value that is no number) is agreed.
                    if summing && theirs.is_some() {
                        let alike = Conflict {
                            at: ConflictAt::MapKey(c.key.clone()),
                            base: c.left.clone(),
                            ours: our.clone(),
                            theirs,
                        };
                        if let Some(Resolution::Value(v)) = resolver.resolve(ty, &alike) {
                            edits.push((c.key.to_vec(), v.map(|v| v.to_vec())));
                        }
                    }
                }
                Some(our) => {
                    let conflict = Conflict {
                        at: ConflictAt::MapKey(c.key.clone()),
                        base: c.left.clone(),
                        ours: our.clone(),
                        theirs,
                    };
                    match resolver.resolve(ty, &conflict) {
                        Some(Resolution::Ours) => {}
                        Some(Resolution::Theirs) => {
                            edits.push((c.key.to_vec(), conflict.theirs.map(|v| v.to_vec())))
                        }
                        Some(Resolution::Value(v)) => {
                            mem.charge(
                                c.key.len() as u64 + v.as_ref().map_or(0, |v| v.len() as u64),
                            )?;
                            edits.push((c.key.to_vec(), v.map(|v| v.to_vec())))
                        }
                        Some(Resolution::Base) => {
                            edits.push((c.key.to_vec(), conflict.base.map(|v| v.to_vec())))
                        }
                        // A map value is one value, not elements.
                        Some(Resolution::Elements(_)) | None => conflicts.push(conflict),
                    }
                }
            }
            Ok(ControlFlow::Continue(()))
        })?;
        if !conflicts.is_empty() {
            return Ok(Err(conflicts));
        }
        let tree = if ty == ValueType::Set {
            let set_edits = edits.into_iter().map(|(k, v)| (k, v.is_some())).collect();
            postree::set_update(s, self.tree_config(), o, set_edits)?
        } else {
            postree::map_update(s, self.tree_config(), o, edits)?
        };
        Ok(Ok(Value::Tree(tree)))
    }

    #[allow(clippy::too_many_arguments)]
    fn merge_seq(
        &self,
        ty: ValueType,
        b: &TreeRef,
        o: &TreeRef,
        t: &TreeRef,
        resolver: &dyn Resolver,
        mem: &mut MergeMemory,
        virtual_base: bool,
    ) -> Result<std::result::Result<Value, Vec<Conflict>>> {
        let s = self.chunks();
        let mut diff = |from: &TreeRef| -> Result<Vec<SeqChange>> {
            let mut out = Vec::new();
            postree::diff_seq_each(s, b, from, None, &mut |c| {
                // The change, its entry in `all` and its share of `clusters`.
                mem.charge(96)?;
                out.push(c);
                Ok(ControlFlow::Continue(()))
            })?;
            Ok(out)
        };
        let co = diff(o)?;
        let ct = diff(t)?;
        // Cluster changes of both sides whose base ranges overlap or touch.
        let mut all: Vec<(u64, u64, bool)> = co
            .iter()
            .map(|c| (c.a_start, c.a_end, true))
            .chain(ct.iter().map(|c| (c.a_start, c.a_end, false)))
            .collect();
        all.sort_by_key(|x| (x.0, x.1));
        let mut clusters: Vec<(u64, u64, bool, bool)> = Vec::new();
        for (s0, e0, is_ours) in all {
            match clusters.last_mut() {
                Some(last) if s0 <= last.1 => {
                    last.1 = last.1.max(e0);
                    if is_ours {
                        last.2 = true
                    } else {
                        last.3 = true
                    }
                }
                _ => clusters.push((s0, e0, is_ours, !is_ours)),
            }
        }
        // Position in a side of a base position: changes wholly before a cluster start shift
        // it (a change ending exactly at the start belongs to the cluster, since touching
        // changes are clustered), and every change up to a cluster end shifts that. The
        // clusters are visited in order, so each side's changes are swept once.
        let (mut shift_o, mut shift_t) = (Shift::new(&co), Shift::new(&ct));
        let builtin = resolver.builtin();
        let mut plan: Vec<(u64, u64, Units)> = Vec::new(); // (ours start, ours end, content)
        let mut conflicts = Vec::new();
        for &(cs, ce, has_o, has_t) in &clusters {
            if !has_t {
                continue;
            }
            let (os, oe) = (shift_o.at(cs, false), shift_o.at(ce, true));
            let (ts, te) = (shift_t.at(cs, false), shift_t.at(ce, true));
            let theirs_u = Units::read(s, ty, t, ts, te, mem)?;
            if !has_o {
                plan.push((os, oe, theirs_u));
                continue;
            }
            let ours_u = Units::read(s, ty, o, os, oe, mem)?;
            if ours_u == theirs_u {
                continue;
            }
            let base_u = Units::read(s, ty, b, cs, ce, mem)?;
            if let Some(m) = Units::merge_region(&base_u, &ours_u, &theirs_u) {
                mem.charge(m.bytes())?;
                plan.push((os, oe, m));
                continue;
            }
            // The sides' changes in this region overlap somewhere: merged unit by unit
            // (diff3), so only the parts where both changed differently conflict, and a
            // resolver's answer replaces just those parts.
            // The Myers diff holds about 16 bytes per unit of base and side for each side,
            // the hunks and segments a copy of the region more.
            let units = base_u.len() * 2 + ours_u.len() + theirs_u.len();
            mem.charge(
                24 * units as u64 + 2 * (base_u.bytes() + ours_u.bytes() + theirs_u.bytes()),
            )?;
            let (segs, exact) = base_u.diff3(&ours_u, &theirs_u);
            // What the merge will hold besides what a resolver adds: Union adds their
            // elements found nowhere in it (not in ours' region, which may hold an element
            // theirs moved away from an agreed part).
            let mut kept = base_u.empty_like();
            for seg in &segs {
                match seg {
                    Seg::Agreed(u) | Seg::Conflict { ours: u, .. } => kept.extend(u.clone()),
                }
            }
            let mut merged = base_u.empty_like();
            let mut unresolved = false;
            for seg in segs {
                let (start, end, bg, og, tg) = match seg {
                    Seg::Agreed(u) => {
                        merged.extend(u);
                        continue;
                    }
                    Seg::Conflict {
                        start,
                        end,
                        base,
                        ours,
                        theirs,
                    } => (start, end, base, ours, theirs),
                };
                let at = ConflictAt::Range {
                    start: cs + start as u64,
                    end: cs + end as u64,
                };
                if !exact && virtual_base {
                    // Between merge bases, a span the diff could not line up keeps their
                    // own base: the outer merge sees both heads' edits there against it.
                    merged.extend(bg);
                    continue;
                }
                if !exact {
                    // The diff was cut short: this conflict may span edits of both sides
                    // that do not overlap, which any resolution would lose in part. Listed
                    // for a person to resolve, never resolved here.
                    let conflict = Conflict {
                        at,
                        base: Some(bg.to_text()),
                        ours: Some(og.to_text()),
                        theirs: Some(tg.to_text()),
                    };
                    let resolvable = Units::builtin_resolve(builtin, &bg, &og, &tg, &kept)
                        .is_some()
                        || resolver.resolve(ty, &conflict).is_some();
                    if resolvable {
                        return Err(Error::Conflict(format!(
                            "the changes both sides made to units {}..{} of the {ty} could \
                             not be lined up within {} ms (a region of {} units with many \
                             scattered edits); a resolver would have replaced the whole span, \
                             losing edits of the other side, so nothing was merged: merge in \
                             smaller steps, or resolve the span by hand",
                            cs + start as u64,
                            cs + end as u64,
                            diff3_deadline().as_millis(),
                            base_u.len()
                        )));
                    }
                    unresolved = true;
                    conflicts.push(conflict);
                    continue;
                }
                if let Some(r) = Units::builtin_resolve(builtin, &bg, &og, &tg, &kept) {
                    mem.charge(r.bytes())?;
                    merged.extend(r);
                    continue;
                }
                let conflict = Conflict {
                    at,
                    base: Some(bg.to_text()),
                    ours: Some(og.to_text()),
                    theirs: Some(tg.to_text()),
                };
                match resolver.resolve(ty, &conflict) {
                    Some(Resolution::Ours) => merged.extend(og),
                    Some(Resolution::Theirs) => merged.extend(tg),
                    Some(Resolution::Base) => merged.extend(bg),
                    Some(Resolution::Value(v)) => {
                        let v = v.unwrap_or_default();
                        mem.charge(2 * v.len() as u64)?;
                        merged.extend(Units::from_text(ty, v))
                    }
                    Some(Resolution::Elements(es)) if ty != ValueType::Blob => {
                        mem.charge(es.iter().map(|e| e.len() as u64 + 8).sum())?;
                        merged.extend(Units::Elems(es))
                    }
                    Some(Resolution::Elements(_)) | None => {
                        unresolved = true;
                        conflicts.push(conflict);
                    }
                }
            }
            if !unresolved {
                plan.push((os, oe, merged));
            }
        }
        if !conflicts.is_empty() {
            return Ok(Err(conflicts));
        }
        let mut tree = *o;
        for (os, oe, content) in plan.into_iter().rev() {
            tree = match content {
                Units::Bytes(b) => {
                    postree::blob_splice(s, self.tree_config(), &tree, os, oe - os, &b)?
                }
                Units::Elems(e) => {
                    postree::list_splice(s, self.tree_config(), &tree, os, oe - os, &e)?
                }
            };
        }
        Ok(Ok(Value::Tree(tree)))
    }
}

/// Base positions mapped into one side of a merge, for positions that never decrease:
/// the sum of the length changes of the side's changes (sorted and disjoint, as
/// [`postree::diff_seq`] gives them) that end before the position, kept as the position
/// moves.
struct Shift<'a> {
    changes: &'a [SeqChange],
    next: usize,
    delta: i128,
}

impl<'a> Shift<'a> {
    fn new(changes: &'a [SeqChange]) -> Self {
        Shift {
            changes,
            next: 0,
            delta: 0,
        }
    }

    /// `p` in the side: shifted by every change ending before `p` (or at `p`, with
    /// `include_touching`).
    fn at(&mut self, p: u64, include_touching: bool) -> u64 {
        while let Some(c) = self.changes.get(self.next) {
            if !(c.a_end < p || (include_touching && c.a_end == p)) {
                break;
            }
            self.delta += (c.b_end - c.b_start) as i128 - (c.a_end - c.a_start) as i128;
            self.next += 1;
        }
        (p as i128 + self.delta) as u64
    }
}

/// A region of a Blob (bytes) or List (elements).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Units {
    Bytes(Vec<u8>),
    Elems(Vec<Bytes>),
}

impl Units {
    /// Units `start..end` of `tree`, charged to `mem` before they are held.
    fn read(
        s: &dyn ChunkStore,
        ty: ValueType,
        tree: &TreeRef,
        start: u64,
        end: u64,
        mem: &mut MergeMemory,
    ) -> Result<Self> {
        if ty == ValueType::Blob {
            mem.charge(end - start)?;
            Ok(Units::Bytes(postree::blob_read(
                s,
                tree,
                start,
                end - start,
            )?))
        } else {
            let mut v = Vec::new();
            for el in postree::list_range(s, tree, start, end) {
                let el = el?;
                mem.charge(el.key.len() as u64)?;
                v.push(el.key);
            }
            Ok(Units::Elems(v))
        }
    }

    /// Bytes held (element bytes for a List).
    fn bytes(&self) -> u64 {
        match self {
            Units::Bytes(b) => b.len() as u64,
            Units::Elems(e) => e.iter().map(|x| x.len() as u64).sum(),
        }
    }

    /// Units (bytes or elements) in the region.
    fn len(&self) -> usize {
        match self {
            Units::Bytes(b) => b.len(),
            Units::Elems(e) => e.len(),
        }
    }

    /// An empty region of the same kind.
    fn empty_like(&self) -> Units {
        match self {
            Units::Bytes(_) => Units::Bytes(Vec::new()),
            Units::Elems(_) => Units::Elems(Vec::new()),
        }
    }

    /// Appends `other` (of the same kind; another kind is a bug and appends nothing).
    fn extend(&mut self, other: Units) {
        match (self, other) {
            (Units::Bytes(a), Units::Bytes(b)) => a.extend(b),
            (Units::Elems(a), Units::Elems(b)) => a.extend(b),
            _ => debug_assert!(false, "merge regions of two kinds"),
        }
    }

    /// [`diff3`] of this base region against `o` and `t`, as regions, and whether both
    /// diffs were exact.
    fn diff3(&self, o: &Units, t: &Units) -> (Vec<Seg<Units>>, bool) {
        fn wrap<T>(
            (segs, exact): (Vec<Seg<Vec<T>>>, bool),
            f: impl Fn(Vec<T>) -> Units,
        ) -> (Vec<Seg<Units>>, bool) {
            (segs.into_iter().map(|seg| seg.map(&f)).collect(), exact)
        }
        match (self, o, t) {
            (Units::Bytes(b), Units::Bytes(o), Units::Bytes(t)) => {
                wrap(diff3(b, o, t), Units::Bytes)
            }
            (Units::Elems(b), Units::Elems(o), Units::Elems(t)) => {
                wrap(diff3(b, o, t), Units::Elems)
            }
            _ => (
                vec![Seg::Conflict {
                    start: 0,
                    end: 0,
                    base: self.clone(),
                    ours: o.clone(),
                    theirs: t.clone(),
                }],
                false,
            ),
        }
    }

    fn merge_region(b: &Units, o: &Units, t: &Units) -> Option<Units> {
        match (b, o, t) {
            (Units::Bytes(b), Units::Bytes(o), Units::Bytes(t)) => {
                merge_region(b, o, t).map(Units::Bytes)
            }
            (Units::Elems(b), Units::Elems(o), Units::Elems(t)) => {
                merge_region(b, o, t).map(Units::Elems)
            }
            _ => None,
        }
    }

    /// Append and union, element-wise for Lists (and byte-wise append for Blobs), over the
    /// span either side changed: a region comes whole leaves at a time, so acting on all of
    /// it would put their change at the end of a leaf (where depends on the chunking) and
    /// could repeat the base's units around it.
    /// `kept` is what the merge of the region holds besides resolutions (its agreed parts
    /// and ours' side of each conflict): Union leaves out their elements found anywhere in
    /// it, not only in the conflicting part.
    fn builtin_resolve(
        r: Option<BuiltinResolver>,
        b: &Units,
        o: &Units,
        t: &Units,
        kept: &Units,
    ) -> Option<Units> {
        /// `ours` with its middle (between the units both sides kept at the ends)
        /// replaced by `f(base middle, ours middle, theirs middle)`; `None` when `f`
        /// declines.
        fn in_changed_span<T: PartialEq + Clone>(
            b: &[T],
            o: &[T],
            t: &[T],
            f: impl FnOnce(&[T], &[T], &[T]) -> Option<Vec<T>>,
        ) -> Option<Vec<T>> {
            let (po, so) = common_ends(b, o);
            let (pt, st) = common_ends(b, t);
            let (p, s) = (po.min(pt), so.min(st));
            let mid = f(&b[p..b.len() - s], &o[p..o.len() - s], &t[p..t.len() - s])?;
            let mut v = Vec::with_capacity(p + mid.len() + s);
            v.extend_from_slice(&o[..p]);
            v.extend(mid);
            v.extend_from_slice(&o[o.len() - s..]);
            Some(v)
        }
        /// Ours, then what theirs put in the base's place ([`appended_part`]); `None` (the
        /// conflict stays) for an edit inside it.
        fn append<T: PartialEq + Clone>(b: &[T], o: &[T], t: &[T]) -> Option<Vec<T>> {
            let mut v = o.to_vec();
            v.extend(appended_part(b, t)?);
            Some(v)
        }
        match (r?, b, o, t) {
            (BuiltinResolver::Append, Units::Bytes(b), Units::Bytes(o), Units::Bytes(t)) => {
                in_changed_span(b, o, t, append).map(Units::Bytes)
            }
            (BuiltinResolver::Append, Units::Elems(b), Units::Elems(o), Units::Elems(t)) => {
                in_changed_span(b, o, t, append).map(Units::Elems)
            }
            (BuiltinResolver::Union, Units::Elems(b), Units::Elems(o), Units::Elems(t)) => {
                // Their elements found nowhere in ours' region (not only outside its changed span).
                let have: HashSet<&Bytes> = match kept {
                    Units::Elems(whole) => whole.iter().chain(o.iter()).collect(),
                    Units::Bytes(_) => o.iter().collect(),
                };
                in_changed_span(b, o, t, |_, om, tm| {
                    let mut v = om.to_vec();
                    v.extend(tm.iter().filter(|x| !have.contains(x)).cloned());
                    Some(v)
                })
                .map(Units::Elems)
            }
            _ => None,
        }
    }

    /// Text shown to resolvers and users: bytes as they are, elements one per line.
    fn to_text(&self) -> Bytes {
        match self {
            Units::Bytes(b) => Bytes::copy_from_slice(b),
            Units::Elems(e) => e
                .iter()
                .map(|x| x.to_vec())
                .collect::<Vec<_>>()
                .join(&b"\n"[..])
                .into(),
        }
    }

    /// Reads a custom resolver's text back (Lists: one element per line).
    fn from_text(ty: ValueType, v: Bytes) -> Units {
        if ty == ValueType::Blob {
            Units::Bytes(v.to_vec())
        } else {
            Units::Elems(
                split_lines(&v)
                    .into_iter()
                    .map(Bytes::copy_from_slice)
                    .collect(),
            )
        }
    }
}

fn merge_primitive(
    ty: ValueType,
    base: &Value,
    ours: &Value,
    theirs: &Value,
    resolver: &dyn Resolver,
) -> std::result::Result<Value, Vec<Conflict>> {
    let as_bytes = |v: &Value| -> Bytes {
        match v {
            Value::String(b) => b.clone(),
            Value::Integer(i) => i.to_string().into(),
            Value::Tuple(items) => items
                .iter()
                .map(|b| b.to_vec())
                .collect::<Vec<_>>()
                .join(&b"\n"[..])
                .into(),
            Value::Tree(t) => t.root.to_hex().into(),
        }
    };
    let conflict = Conflict {
        at: ConflictAt::Value,
        base: Some(as_bytes(base)),
        ours: Some(as_bytes(ours)),
        theirs: Some(as_bytes(theirs)),
    };
    // Tuple append and union work on elements, not on their joined text.
    if let (Value::Tuple(o), Value::Tuple(t)) = (ours, theirs) {
        match resolver.builtin() {
            Some(BuiltinResolver::Append) => {
                let base: &[Bytes] = match base {
                    Value::Tuple(b) => b,
                    _ => &[],
                };
                // An edit of theirs inside the base: no part to append, a conflict.
                return match appended_part(base, t) {
                    Some(new) => {
                        let mut out = o.clone();
                        out.extend(new);
                        Ok(Value::Tuple(out))
                    }
                    None => Err(vec![conflict]),
                };
            }
            Some(BuiltinResolver::Union) => return Ok(Value::Tuple(union(o, t))),
            _ => {}
        }
    }
    match resolver.resolve(ty, &conflict) {
        Some(Resolution::Ours) => Ok(ours.clone()),
        Some(Resolution::Theirs) => Ok(theirs.clone()),
        Some(Resolution::Base) => Ok(base.clone()),
        Some(Resolution::Value(v)) => {
            let v = v.unwrap_or_default();
            match ty {
                ValueType::String => Ok(Value::String(v)),
                ValueType::Integer => std::str::from_utf8(&v)
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                    .map(Value::Integer)
                    .ok_or_else(|| vec![conflict.clone()]),
                ValueType::Tuple => Ok(Value::Tuple(
                    split_lines(&v)
                        .into_iter()
                        .map(Bytes::copy_from_slice)
                        .collect(),
                )),
                _ => Err(vec![conflict]),
            }
        }
        Some(Resolution::Elements(es)) if ty == ValueType::Tuple => Ok(Value::Tuple(es)),
        Some(Resolution::Elements(_)) | None => Err(vec![conflict]),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::{BuiltinResolver, Conflict, ConflictAt, Resolution, Resolver, Seg, diff3};
    use crate::ValueType;

    /// A merge whose region diff runs past its deadline (here: none at all) may see one
    /// coarse conflict over edits of both sides that do not overlap: a resolver is never
    /// let loose on it (Ours replaced the whole span, silently dropping theirs' edit; the
    /// same merge gave other content when it had time), while without a resolver the
    /// conflict is listed.
    #[test]
    fn a_cut_short_region_diff_is_never_resolved_automatically() {
        use crate::{At, Db, MergeOutcome, NewValue, PutOptions, Target, TreeConfig};
        use std::sync::Arc;
        let o = PutOptions::default();
        let base: Vec<Vec<u8>> = (0..100).map(|i| format!("e{i}").into_bytes()).collect();
        let (before, mut ours, mut theirs) = (base.clone(), base.clone(), base.clone());
        ours[10] = b"O1".to_vec();
        ours[12] = b"O2".to_vec();
        theirs[11] = b"T".to_vec();
        let merge = |resolver: BuiltinResolver| {
            let db = Db::with_config(
                Arc::new(cairn_store::MemoryStore::new()),
                TreeConfig {
                    leaf_target: 128,
                    index_target: 256,
                },
            );
            let put = |branch: &str, v: &[Vec<u8>]| {
                db.put(b"l", Target::Branch(branch), NewValue::List(v.to_vec()), &o)
                    .unwrap()
            };
            put("master", &before);
            db.fork(b"l", &At::Branch("master".into()), "dev").unwrap();
            put("master", &ours);
            let from = put("dev", &theirs);
            db.merge_into(b"l", "master", &At::Uid(from), &resolver, &o)
        };
        // With time, every edit is kept.
        assert!(matches!(
            merge(BuiltinResolver::Ours).unwrap(),
            MergeOutcome::Merged(_)
        ));
        super::TEST_DIFF3_DEADLINE.with(|d| d.set(Some(std::time::Duration::ZERO)));
        let e = merge(BuiltinResolver::Ours).unwrap_err();
        assert!(matches!(e, cairn_core::Error::Conflict(_)), "{e}");
        assert!(e.to_string().contains("nothing was merged"), "{e}");
        match merge(BuiltinResolver::Manual).unwrap() {
            MergeOutcome::Conflicts(c) => assert!(!c.is_empty()),
            other => panic!("{other:?}"),
        }
        super::TEST_DIFF3_DEADLINE.with(|d| d.set(None));
    }

    /// A virtual base (criss-cross history) whose region diff is cut short keeps the
    /// bases' own base there: the merge goes on (the outer merge lists what conflicts),
    /// where it failed as if a resolver had been let loose on the span.
    #[test]
    fn a_cut_short_diff_between_merge_bases_does_not_fail_the_merge() {
        use crate::{At, Db, MergeOutcome, NewValue, PutOptions, Target, TreeConfig};
        use std::sync::Arc;
        let o = PutOptions::default();
        let db = Db::with_config(
            Arc::new(cairn_store::MemoryStore::new()),
            TreeConfig {
                leaf_target: 128,
                index_target: 256,
            },
        );
        let base: Vec<Vec<u8>> = (0..100).map(|i| format!("e{i}").into_bytes()).collect();
        let put = |branch: &str, v: &[Vec<u8>]| {
            db.put(b"l", Target::Branch(branch), NewValue::List(v.to_vec()), &o)
                .unwrap()
        };
        put("master", &base);
        db.fork(b"l", &At::Branch("master".into()), "dev").unwrap();
        let (mut ours, mut theirs) = (base.clone(), base.clone());
        ours[10] = b"O1".to_vec();
        ours[12] = b"O2".to_vec();
        theirs[11] = b"T".to_vec();
        let a1 = put("master", &ours);
        let d1 = put("dev", &theirs);
        // Criss-cross: each branch merges the other's first head (each keeping its own
        // side of the region both changed), then each moves on.
        let r = db.merge_into(b"l", "master", &At::Uid(d1), &BuiltinResolver::Ours, &o);
        assert!(matches!(r, Ok(MergeOutcome::Merged(_))), "{r:?}");
        let r = db.merge_into(b"l", "dev", &At::Uid(a1), &BuiltinResolver::Ours, &o);
        assert!(matches!(r, Ok(MergeOutcome::Merged(_))), "{r:?}");
        // Both heads settle the span the first merges left apart alike, then each moves
        // on far from it.
        ours[11] = b"T".to_vec();
        theirs[10] = b"O1".to_vec();
        theirs[12] = b"O2".to_vec();
        ours[50] = b"M".to_vec();
        theirs[95] = b"D".to_vec();
        put("master", &ours);
        let d2 = put("dev", &theirs);
        let bases = crate::history::merge_bases_in(
            db.chunks(),
            b"l",
            &db.resolve(b"l", &At::Branch("master".into())).unwrap(),
            &d2,
        )
        .unwrap();
        assert_eq!(bases.len(), 2, "a criss-cross history");
        super::TEST_DIFF3_DEADLINE.with(|d| d.set(Some(std::time::Duration::ZERO)));
        let r = db.merge_into(b"l", "master", &At::Uid(d2), &BuiltinResolver::Manual, &o);
        super::TEST_DIFF3_DEADLINE.with(|d| d.set(None));
        // Not an error: the outer merge's own diff, cut short too under a zero deadline,
        // lists the region where the heads moved as a conflict for a person (with time it
        // merges; see the test above).
        match r {
            Ok(MergeOutcome::Conflicts(c)) => assert!(!c.is_empty()),
            other => panic!("{other:?}"),
        }
    }

    /// Sum adds both sides' changes in 128 bits: near the ends of the range a sum whose
    /// intermediate overflows still resolves, and one whose result does not fit conflicts.
    #[test]
    fn sum_near_the_ends_of_the_range() {
        let sum = |base: i64, ours: i64, theirs: i64| {
            let c = Conflict {
                at: ConflictAt::Value,
                base: Some(base.to_string().into()),
                ours: Some(ours.to_string().into()),
                theirs: Some(theirs.to_string().into()),
            };
            match BuiltinResolver::Sum.resolve(ValueType::Integer, &c) {
                Some(Resolution::Value(Some(v))) => Some(
                    String::from_utf8(v.to_vec())
                        .unwrap()
                        .parse::<i64>()
                        .unwrap(),
                ),
                None => None,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(sum(10, i64::MAX, 5), Some(i64::MAX - 5));
        assert_eq!(sum(-10, i64::MIN, -5), Some(i64::MIN + 5));
        assert_eq!(sum(0, i64::MAX, 1), None);
        assert_eq!(sum(1, 2, 3), Some(4));
    }

    /// The merged units when `segs` hold no conflict.
    fn agreed(segs: Vec<Seg<Vec<u32>>>) -> Option<Vec<u32>> {
        let mut out = Vec::new();
        for s in segs {
            match s {
                Seg::Agreed(v) => out.extend(v),
                Seg::Conflict { .. } => return None,
            }
        }
        Some(out)
    }

    /// `base` with `edits` (position, units deleted, units inserted) applied, last first.
    fn apply(base: &[u32], edits: &[(usize, usize, Vec<u32>)]) -> Vec<u32> {
        let mut v = base.to_vec();
        for (at, del, ins) in edits.iter().rev() {
            v.splice(*at..*at + *del, ins.iter().copied());
        }
        v
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Edits of two sides at separate places of one region (distinct units, so the
        /// diff is unambiguous) all merge, with no conflict; one side unchanged, or both
        /// alike, give the other side.
        #[test]
        fn diff3_keeps_every_edit_that_overlaps_none_of_the_other_sides(
            n in 1usize..120,
            cuts in proptest::collection::vec((any::<u16>(), 0usize..3, 0usize..3), 1..8),
        ) {
            let base: Vec<u32> = (0..n as u32).collect();
            // Edits at increasing places, each at least two units after the last one's
            // end, dealt to the sides in turn.
            let mut at = 0usize;
            let (mut ours, mut theirs) = (Vec::new(), Vec::new());
            let mut fresh = 10_000u32;
            for (k, (skip, del, ins)) in cuts.into_iter().enumerate() {
                let start = at + 2 + skip as usize % 7;
                if start + del > n {
                    break;
                }
                let insert: Vec<u32> = (0..ins).map(|_| { fresh += 1; fresh }).collect();
                let edit = (start, del, insert);
                if k % 2 == 0 { ours.push(edit) } else { theirs.push(edit) }
                at = start + del;
            }
            let o = apply(&base, &ours);
            let t = apply(&base, &theirs);
            let mut both = ours.clone();
            both.extend(theirs.iter().cloned());
            both.sort_by_key(|e| e.0);
            let merged = agreed(diff3(&base, &o, &t).0);
            prop_assert_eq!(merged, Some(apply(&base, &both)));
            prop_assert_eq!(agreed(diff3(&base, &o, &base).0), Some(o.clone()));
            prop_assert_eq!(agreed(diff3(&base, &base, &t).0), Some(t.clone()));
            prop_assert_eq!(agreed(diff3(&base, &o, &o).0), Some(o.clone()));
        }

        /// Whatever the three regions, taking ours' side of every conflict and keeping
        /// the agreed parts gives a list that holds every unit ours kept or added where
        /// theirs did not change the base (no unit of ours outside a conflict is lost).
        #[test]
        fn diff3_conflicts_cover_only_where_both_changed(
            base in proptest::collection::vec(0u32..6, 0..40),
            o in proptest::collection::vec(0u32..6, 0..40),
            t in proptest::collection::vec(0u32..6, 0..40),
        ) {
            let (segs, _) = diff3(&base, &o, &t);
            // Taking ours everywhere gives ours' changes; theirs everywhere, theirs', and
            // the parts both agree on are the same in both.
            let mut with_ours = Vec::new();
            let mut pos = 0usize;
            for s in &segs {
                match s {
                    Seg::Agreed(v) => with_ours.extend(v.iter().copied()),
                    Seg::Conflict { start, end, ours, .. } => {
                        prop_assert!(pos <= *start && start <= end && *end <= base.len());
                        pos = *end;
                        with_ours.extend(ours.iter().copied());
                    }
                }
            }
            if t == base {
                prop_assert_eq!(&with_ours, &o);
            }
        }
    }
}

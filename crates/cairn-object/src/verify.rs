//! Verification (ForkBase §3.2, tamper evidence): re-hash everything reachable from every
//! head of every key (or one key): each version's Meta chunk, its bases back to the first
//! version, and every chunk of each value's POS-tree. Any changed byte is reported with the
//! key and the version it damages.

use std::collections::{BTreeSet, HashSet};
use std::fmt;

use bytes::Bytes;
use cairn_core::{Error, Result};

use crate::db::Db;
use crate::fobject::{Uid, show_key};
use crate::postree;

/// One damaged thing found by [`Db::verify`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damage {
    /// The key whose history is damaged.
    pub key: Bytes,
    /// The damaged version, when the damage is inside one.
    pub uid: Option<Uid>,
    /// The heads (branch names or "untagged") from which the damaged version is reached.
    pub reached_from: String,
    /// What is wrong.
    pub what: String,
}

impl fmt::Display for Damage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "key {}", show_key(&self.key))?;
        if let Some(u) = &self.uid {
            write!(f, " version {u}")?;
        }
        write!(f, " (from {}): {}", self.reached_from, self.what)
    }
}

/// The result of a verification.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Keys checked.
    pub keys: u64,
    /// Versions checked.
    pub versions: u64,
    /// POS-tree chunks re-hashed. A subtree of a blob or list that several versions share
    /// is read once (see [`postree::walk_sharing`]); a repeated leaf counts once per value.
    pub chunks: u64,
    /// Everything found damaged; empty when the store is intact.
    pub damage: Vec<Damage>,
}

impl VerifyReport {
    /// True when nothing is damaged.
    pub fn is_intact(&self) -> bool {
        self.damage.is_empty()
    }
}

/// Where a [`Db::verify_with_progress`] stands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VerifyProgress {
    /// Keys checked whole.
    pub keys_done: u64,
    /// Keys to check.
    pub keys_total: u64,
    /// POS-tree chunks re-hashed so far.
    pub chunks: u64,
}

/// Chunks re-hashed between two progress calls inside one key.
const PROGRESS_CHUNKS: u64 = 4096;

impl Db {
    /// Verifies one key, or every key when `key` is `None`. `progress` is called after each
    /// key with (keys done, keys total).
    pub fn verify(
        &self,
        key: Option<&[u8]>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<VerifyReport> {
        let mut last = None;
        self.verify_with_progress(key, &mut |p| {
            if last != Some(p.keys_done) {
                last = Some(p.keys_done);
                progress(p.keys_done, p.keys_total);
            }
        })
    }

    /// [`Db::verify`], calling `progress` after each key and every few thousand chunks
    /// re-hashed within one (a single large value shows its progress too).
    pub fn verify_with_progress(
        &self,
        key: Option<&[u8]>,
        progress: &mut dyn FnMut(&VerifyProgress),
    ) -> Result<VerifyReport> {
        let mut report = VerifyReport::default();
        let keys: Vec<Bytes> = match key {
            Some(k) => {
                let (t, damage) = self.table_lenient(k)?;
                if t.is_empty() && damage.is_empty() {
                    return Err(Error::not_found(format!("key {}", show_key(k))));
                }
                vec![Bytes::copy_from_slice(k)]
            }
            None => {
                // A ref name that does not parse is damage of the store; every other key
                // is still checked.
                let (keys, damage) = self.list_keys_lenient()?;
                for what in damage {
                    report.damage.push(Damage {
                        key: Bytes::from_static(b"(store)"),
                        uid: None,
                        reached_from: "head refs".into(),
                        what,
                    });
                }
                keys
            }
        };
        // Damage crash recovery worked around is damage too, even where no key shows it any
        // more (a commit cut because its group was torn names the refs it changed).
        for note in self.store().recovery_notes()? {
            report.damage.push(Damage {
                key: Bytes::from_static(b"(store)"),
                uid: None,
                reached_from: "crash recovery".into(),
                what: note,
            });
        }
        let total = keys.len() as u64;
        let done = std::cell::Cell::new(0u64);
        let mut trees = TreesDone::new(Box::new(|chunks| {
            progress(&VerifyProgress {
                keys_done: done.get(),
                keys_total: total,
                chunks,
            })
        }));
        for (i, k) in keys.iter().enumerate() {
            self.verify_key(k, &mut report, &mut trees);
            done.set(i as u64 + 1);
            (trees.tick)(report.chunks);
        }
        Ok(report)
    }

    fn verify_key(&self, key: &Bytes, report: &mut VerifyReport, trees: &mut TreesDone) {
        report.keys += 1;
        // Each damaged head ref is reported, and the key's other heads are still walked.
        let table = match self.table_lenient(key) {
            Ok((t, damage)) => {
                for why in damage {
                    report.damage.push(Damage {
                        key: key.clone(),
                        uid: None,
                        reached_from: "branch table".into(),
                        what: format!("branch table of key {} is damaged: {why}", show_key(key)),
                    });
                }
                t
            }
            Err(e) => {
                report.damage.push(Damage {
                    key: key.clone(),
                    uid: None,
                    reached_from: "branch table".into(),
                    what: e.to_string(),
                });
                return;
            }
        };
        let mut seen: BTreeSet<Uid> = BTreeSet::new();
        let mut heads = heads_of(&table);
        let mut walked_heads: HashSet<Uid> = HashSet::new();
        // A head that moved while its damage was found is walked again from the key's
        // heads as they are then, a few times at most (a key written without pause).
        for _pass in 0..3 {
            let mut moved = false;
            for (head, label, branch) in heads {
                let mark = report.damage.len();
                let mut walked = Vec::new();
                self.verify_history(key, head, &label, report, trees, &mut seen, &mut walked);
                // A put or a remove, then a GC, between reading the table and walking this
                // head collect what the walk then finds missing: not damage, once the head
                // is no longer one. Its walk is forgotten (a version it shares with a head
                // still there is walked again from that head), and the heads the key has
                // now are walked: a put moved the head, and the new one still reaches the
                // damage (it was dropped for good before: verify said intact).
                if report.damage.len() > mark && !self.is_still_head(key, &head, branch.as_deref())
                {
                    report.damage.truncate(mark);
                    report.versions -= walked.len() as u64;
                    for u in walked {
                        seen.remove(&u);
                    }
                    moved = true;
                } else {
                    // Kept: not walked again (a head dropped above is, under any name the
                    // key now gives it: a rename moves a branch to another name).
                    walked_heads.insert(head);
                }
            }
            if !moved {
                break;
            }
            let Ok((table, _)) = self.table_lenient(key) else {
                break;
            };
            heads = heads_of(&table);
            heads.retain(|(u, _, _)| !walked_heads.contains(u));
        }
    }

    /// Whether `head` is still the head of `branch` of `key` (an untagged head with
    /// `None`). A table that cannot be read counts as unchanged.
    fn is_still_head(&self, key: &[u8], head: &Uid, branch: Option<&str>) -> bool {
        match branch {
            Some(b) => match self.branch_head(key, b) {
                Ok(now) => now.as_ref() == Some(head),
                Err(_) => true,
            },
            None => self
                .table_lenient(key)
                .map_or(true, |(t, _)| t.untagged.contains(head)),
        }
    }

    /// Walks the history of `head` (reached as `label`) not yet `seen`, adding the versions
    /// it checks to `walked`.
    #[allow(clippy::too_many_arguments)]
    fn verify_history(
        &self,
        key: &Bytes,
        head: Uid,
        label: &str,
        report: &mut VerifyReport,
        trees: &mut TreesDone<'_>,
        seen: &mut BTreeSet<Uid>,
        walked: &mut Vec<Uid>,
    ) {
        let mut stack = vec![head];
        while let Some(uid) = stack.pop() {
            if !seen.insert(uid) {
                continue;
            }
            walked.push(uid);
            report.versions += 1;
            let damage = |what: String| Damage {
                key: key.clone(),
                uid: Some(uid),
                reached_from: label.to_string(),
                what,
            };
            let o = match self.load_reached(key, &uid) {
                Ok(o) => o,
                Err(e) => {
                    report.damage.push(damage(e.to_string()));
                    continue;
                }
            };
            let mut max_base_depth = None;
            let mut all_loaded = true;
            for b in &o.bases {
                stack.push(*b);
                match self.load(b) {
                    Ok(bo) => max_base_depth = max_base_depth.max(Some(bo.depth)),
                    Err(_) => all_loaded = false,
                }
            }
            // A base claiming the greatest depth there is has no version after it. With a
            // base unreadable (reported when the walk reaches it) the depth cannot be
            // checked: the missing base may have been the deepest.
            let expected = max_base_depth.map_or(Some(0), |d| d.checked_add(1));
            if !o.bases.is_empty() && all_loaded && expected != Some(o.depth) {
                report.damage.push(damage(match expected {
                    Some(e) => format!("depth is {} but its bases say {e}", o.depth),
                    None => "a base claims the greatest depth there is".to_string(),
                }));
            }
            if let Some(t) = o.value.tree()
                && trees.roots.insert(*t)
            {
                let mut n = 0u64;
                let before = report.chunks;
                let tick = &mut trees.tick;
                let r =
                    postree::walk_sharing(self.chunks(), t, &mut trees.subtrees, &mut |_, _| {
                        n += 1;
                        if n.is_multiple_of(PROGRESS_CHUNKS) {
                            tick(before + n);
                        }
                        Ok(())
                    });
                report.chunks += n;
                if let Err(e) = r {
                    trees.roots.remove(t);
                    report.damage.push(damage(format!("value: {e}")));
                }
            }
        }
    }
}

/// Most index nodes [`Db::verify`] remembers as checked across values (about 64 MiB): a
/// store holding more is verified all the same, re-reading what values share past it.
const MAX_SHARED_SUBTREES: usize = 1 << 20;

/// What a verification has checked of the values so far, and whom it tells.
struct TreesDone<'a> {
    /// Called with the chunks re-hashed so far.
    tick: Box<dyn FnMut(u64) + 'a>,
    /// Whole trees checked intact.
    roots: HashSet<postree::TreeRef>,
    /// Index nodes of blobs and of lists checked whole (see [`postree::walk_sharing`]).
    subtrees: postree::SharedSubtrees,
}

impl<'a> TreesDone<'a> {
    fn new(tick: Box<dyn FnMut(u64) + 'a>) -> Self {
        TreesDone {
            tick,
            roots: HashSet::new(),
            subtrees: postree::SharedSubtrees::new(MAX_SHARED_SUBTREES),
        }
    }
}

/// The heads of a key's branch `table`, each with how a report names it and its branch
/// (`None` for an untagged head).
fn heads_of(table: &crate::branch::BranchTable) -> Vec<(Uid, String, Option<String>)> {
    table
        .tagged
        .iter()
        .map(|(n, u)| (*u, format!("branch {n:?}"), Some(n.clone())))
        .chain(
            table
                .untagged
                .iter()
                .map(|u| (*u, "untagged head".to_string(), None)),
        )
        .collect()
}

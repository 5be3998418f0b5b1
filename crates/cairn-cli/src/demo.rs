//! `cairn demo`: a short guided tour on the embedded store that exercises the ForkBase API
//! end to end through a bucket (so every write is a signed capsule record) and checks every
//! step's result, including a version proof, so it doubles as a smoke test.

use std::io::Write;

use anyhow::{Result, ensure};
use cairn_capsule::Bucket;
use cairn_object::{At, BuiltinResolver, MergeOutcome, NewValue, Op, PutOptions, Target, Value};

/// Runs the tour, narrating on `out`.
pub fn run(bucket: &Bucket, data: Option<&std::path::Path>, out: &mut impl Write) -> Result<()> {
    let db = bucket.db();
    let opts = PutOptions::default();
    // A key of its own each run: the process id alone repeats (in a container it is
    // often 1 every time), and a second run would find its branches taken.
    let mut tag = [0u8; 6];
    getrandom::fill(&mut tag)
        .map_err(|e| anyhow::anyhow!("the system random source failed: {e}"))?;
    let key = format!("demo/{}-{}", std::process::id(), hex::encode(tag));
    let key = key.as_bytes();
    writeln!(
        out,
        "Cairn demo on key {:?} (hash {})",
        String::from_utf8_lossy(key),
        db.algo()
    )?;

    // A 1 MiB document as a Blob, content-defined chunked into a POS-tree.
    let mut doc = vec![0u8; 1 << 20];
    rand::RngCore::fill_bytes(
        &mut <rand::rngs::SmallRng as rand::SeedableRng>::seed_from_u64(42),
        &mut doc,
    );
    let before = db.store().stats()?.chunk_bytes;
    let v1 = bucket.put(
        key,
        Target::Branch("master"),
        NewValue::Blob(doc.clone()),
        &opts,
    )?;
    let after_v1 = db.store().stats()?.chunk_bytes;
    writeln!(
        out,
        "put 1 MiB blob on master      -> {v1}  ({} bytes stored)",
        after_v1 - before
    )?;

    // Fork on demand, then edit both branches independently.
    bucket.fork(key, &At::Branch("master".into()), "draft")?;
    let d1 = bucket.update(
        key,
        Target::Branch("draft"),
        Op::BlobSplice {
            offset: 1000,
            delete: 0,
            insert: b"DRAFT EDIT".to_vec(),
        },
        &opts,
    )?;
    let m2 = bucket.update(
        key,
        Target::Branch("master"),
        Op::BlobSplice {
            offset: 900_000,
            delete: 4,
            insert: b"MAIN".to_vec(),
        },
        &opts,
    )?;
    let after_edits = db.store().stats()?.chunk_bytes;
    writeln!(
        out,
        "fork draft, edit both branches -> draft {}, master {}",
        d1.short(),
        m2.short()
    )?;
    writeln!(
        out,
        "  two edited versions added only {} bytes (dedup)",
        after_edits - after_v1
    )?;

    // Three-way merge: non-overlapping edits combine.
    let merged = match bucket.merge_into(
        key,
        "master",
        &At::Branch("draft".into()),
        &BuiltinResolver::Manual,
        &opts,
    )? {
        MergeOutcome::Merged(u) => u,
        other => anyhow::bail!("unexpected merge outcome {other:?}"),
    };
    let lca = db.lca(key, &m2, &d1)?;
    ensure!(lca == Some(v1), "LCA should be the first version");
    let got = db.get(key, &At::Branch("master".into()))?;
    let Value::Tree(t) = &got.object.value else {
        anyhow::bail!("expected a blob")
    };
    let bytes = cairn_object::postree::blob_read(db.chunks(), t, 0, t.count)?;
    let mut expect = doc.clone();
    expect.splice(900_000..900_004, b"MAIN".iter().copied());
    expect.splice(1000..1000, b"DRAFT EDIT".iter().copied());
    ensure!(
        bytes == expect,
        "merged blob differs from the expected content"
    );
    writeln!(
        out,
        "merge draft into master        -> {merged}  (both edits present; LCA = first version)"
    )?;

    // Fork on conflict: two puts on the same base leave two untagged heads.
    let c = format!("{}/counter", String::from_utf8_lossy(key));
    let c = c.as_bytes();
    let base = bucket.put(c, Target::Branch("master"), NewValue::Integer(10), &opts)?;
    bucket.put(c, Target::Base(base), NewValue::Integer(13), &opts)?;
    bucket.put(c, Target::Base(base), NewValue::Integer(15), &opts)?;
    let heads = db.list_untagged(c)?;
    writeln!(
        out,
        "two concurrent puts on one base -> {} untagged heads (fork on conflict)",
        heads.len()
    )?;
    let MergeOutcome::Merged(m) = bucket.merge_untagged(c, &[], &BuiltinResolver::Sum, &opts)?
    else {
        anyhow::bail!("merge of untagged heads failed")
    };
    let sum = db.get(c, &At::Uid(m))?.object.value;
    ensure!(
        sum == Value::Integer(18),
        "sum resolver should give 10 + 3 + 5"
    );
    writeln!(
        out,
        "merge them with the sum resolver -> {}",
        match sum {
            Value::Integer(i) => i,
            _ => 0,
        }
    )?;

    let report = db.verify(Some(key), &mut |_, _| {})?;
    ensure!(
        report.is_intact(),
        "verify found damage: {:?}",
        report.damage
    );
    writeln!(
        out,
        "verify: intact ({} versions, {} chunks re-hashed)",
        report.versions, report.chunks
    )?;
    // Every write above is a record of the bucket's capsule; prove the merge.
    let proof = bucket.prove(key, &merged)?;
    let meta = bucket
        .metadata()
        .ok_or_else(|| anyhow::anyhow!("the bucket has no capsule"))?;
    let (_, chain) = proof.verify(meta, key, &merged)?;
    writeln!(
        out,
        "prove the merge                -> record {} signed by the writer ({} hop(s))",
        chain[0].hash().short(),
        chain.len() - 1
    )?;
    // The follow-up commands name the data directory the demo used.
    let mut cairn = match data {
        Some(d) => format!("cairn --data {}", shell_word(&d.to_string_lossy())),
        None => "cairn".to_string(),
    };
    // And its bucket, unless the default one.
    if bucket.name() != cairn_object::DEFAULT_BUCKET {
        cairn.push_str(&format!(" --bucket {}", shell_word(bucket.name())));
    }
    let key = shell_word(&String::from_utf8_lossy(key));
    writeln!(out, "try: {cairn} log {key}   {cairn} verify --proof {key}")?;
    Ok(())
}

/// `w` as one shell word: as is when it holds only safe characters, else single-quoted.
fn shell_word(w: &str) -> String {
    if !w.is_empty()
        && w.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+=:,@".contains(c))
    {
        w.to_string()
    } else {
        format!("'{}'", w.replace('\'', "'\\''"))
    }
}

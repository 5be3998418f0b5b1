//! Writes small valid seed inputs for every fuzz target.
//!
//! `cargo run --example gen_seeds -- <out-dir>` creates `<out-dir>/<target>/seed-NNN`.
//! The committed `fuzz/seeds/` directory was produced by this program.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::Path;

use cairn_capsule::BodyCipher;
use cairn_core::{Encoder, HashAlgo};
use cairn_fuzz::capsule;
use cairn_fuzz::logstore::{self, Edit};
use cairn_fuzz::postree::{CID_LEN, Input, PLACEHOLDER};
use cairn_fuzz::wire;
use cairn_object::evidence::{diff_page_evidence, lca_evidence};
use cairn_object::postree::{self, TreeConfig, TreeRef};
use cairn_object::{At, BranchTable, Db, FObject, NewValue, PutOptions, Target, Value};
use cairn_store::{ChunkStore, Cid, MemoryStore};
use std::sync::Arc;

fn write(out: &Path, target: &str, seeds: &[Vec<u8>]) {
    let d = out.join(target);
    fs::create_dir_all(&d).unwrap();
    for (i, s) in seeds.iter().enumerate() {
        fs::write(d.join(format!("seed-{i:03}")), s).unwrap();
    }
    println!("{target}: {} seeds", seeds.len());
}

fn codec_seeds() -> Vec<Vec<u8>> {
    let h = HashAlgo::Blake3.digest(b"x");
    let mut e = Encoder::versioned(1);
    e.varint(300)
        .ivarint(-5)
        .bytes(b"abc")
        .bool(true)
        .hash(&h)
        .u64_le(7);
    let body = e.finish();
    // ops: version(1), varint, ivarint, bytes, bool, hash, u64_le, finish-check
    let ops = [12u8, 1, 2, 3, 7, 1, 9, 5, 13];
    let mut a = vec![ops.len() as u8];
    a.extend_from_slice(&ops);
    a.extend_from_slice(&body);
    let mut b = vec![3u8, 8, 10, 4];
    let mut e = Encoder::new();
    e.bytes("héllo".as_bytes()).varint(2).varint(1);
    b.extend_from_slice(&e.finish());
    vec![
        a,
        b,
        h.to_bytes().to_vec(),
        h.to_hex().into_bytes(),
        HashAlgo::Sha256
            .digest(b"y")
            .to_hex()
            .to_uppercase()
            .into_bytes(),
    ]
}

fn fobject_seeds() -> Vec<Vec<u8>> {
    let store = MemoryStore::new();
    let cfg = TreeConfig::default();
    let base = HashAlgo::Blake3.digest(b"base");
    let values = [
        Value::String("hello".into()),
        Value::Integer(-42),
        Value::Tuple(vec!["a".into(), "".into()]),
        Value::Tree(postree::build_blob(&store, &cfg, b"blob bytes").unwrap()),
        Value::Tree(postree::build_map(&store, &cfg, [("k", "v")]).unwrap()),
        Value::Tree(postree::build_set(&store, &cfg, ["s"]).unwrap()),
        Value::Tree(postree::build_list(&store, &cfg, ["l1", "l2"]).unwrap()),
    ];
    values
        .into_iter()
        .enumerate()
        .map(|(i, value)| {
            let merge = i % 3 == 2;
            FObject {
                key: format!("key{i}").into_bytes().into(),
                value,
                depth: if i % 2 == 0 { 0 } else { 3 },
                bases: if i % 2 == 0 {
                    vec![]
                } else if merge {
                    vec![base, HashAlgo::Sha256.digest(b"other")]
                } else {
                    vec![base]
                },
                context: if i == 1 {
                    "msg".into()
                } else {
                    Default::default()
                },
            }
            .to_chunk()
        })
        .collect()
}

fn branch_seeds() -> Vec<Vec<u8>> {
    let mut seeds = vec![BranchTable::default().encode()];
    let mut t = BranchTable::default();
    t.tagged
        .insert("master".into(), HashAlgo::Blake3.digest(b"a"));
    seeds.push(t.encode());
    t.tagged.insert("dev".into(), HashAlgo::Sha256.digest(b"b"));
    t.untagged.insert(HashAlgo::Blake3.digest(b"c"));
    t.untagged.insert(HashAlgo::Blake3.digest(b"d"));
    seeds.push(t.encode());
    seeds
}

/// Replaces the first occurrence of `cid` in `bytes` by a placeholder naming chunk `index`.
fn put_placeholder(bytes: &mut [u8], cid: &Cid, index: usize) {
    let mut ph = [0u8; CID_LEN];
    ph[..PLACEHOLDER.len()].copy_from_slice(&PLACEHOLDER);
    ph[PLACEHOLDER.len()] = index as u8;
    let kb = cid.to_bytes();
    let p = bytes.windows(CID_LEN).position(|w| w == kb).unwrap();
    bytes[p..p + CID_LEN].copy_from_slice(&ph);
}

/// Serialises tree `t` in the `postree_node` input format: chunks in topological order
/// (root first), child cids replaced by placeholders.
fn tree_input(store: &MemoryStore, t: &TreeRef, a: u64, b: u64, key: &[u8]) -> Vec<u8> {
    // Reverse post-order of the chunk DAG.
    fn visit(store: &MemoryStore, c: Cid, seen: &mut HashMap<Cid, ()>, post: &mut Vec<Cid>) {
        if seen.insert(c, ()).is_some() {
            return;
        }
        let bytes = store.get(&c).unwrap().unwrap();
        for k in postree::child_cids(&bytes).unwrap() {
            visit(store, k, seen, post);
        }
        post.push(c);
    }
    let mut post = Vec::new();
    visit(store, t.root, &mut HashMap::new(), &mut post);
    post.reverse();
    let index: BTreeMap<Cid, usize> = post.iter().enumerate().map(|(i, c)| (*c, i)).collect();
    let chunks: Vec<Vec<u8>> = post
        .iter()
        .map(|c| {
            let mut bytes = store.get(c).unwrap().unwrap().to_vec();
            for k in postree::child_cids(&bytes.clone()).unwrap() {
                put_placeholder(&mut bytes, &k, index[&k]);
            }
            bytes
        })
        .collect();
    assert!(
        chunks.len() <= cairn_fuzz::postree::MAX_CHUNKS,
        "tree too big for a seed"
    );
    Input {
        kind: t.kind,
        height: t.height,
        count: t.count,
        a,
        b,
        key,
        chunks: chunks.iter().map(|c| c.as_slice()).collect(),
    }
    .encode()
}

fn postree_seeds() -> Vec<Vec<u8>> {
    let small = TreeConfig {
        leaf_target: 64,
        index_target: 64,
    };
    let mut seeds = Vec::new();
    for (n, cfg) in [
        (0usize, TreeConfig::default()),
        (3, TreeConfig::default()),
        (40, small),
        (150, small),
    ] {
        let store = MemoryStore::new();
        let blob: Vec<u8> = (0..n * 12).map(|i| (i * 131 % 251) as u8).collect();
        let keys: Vec<Vec<u8>> = (0..n).map(|i| format!("key{i:04}").into_bytes()).collect();
        let trees = [
            postree::build_blob(&store, &cfg, &blob).unwrap(),
            postree::build_list(&store, &cfg, &keys).unwrap(),
            postree::build_set(&store, &cfg, &keys).unwrap(),
            postree::build_map(
                &store,
                &cfg,
                keys.iter().map(|k| (k.clone(), b"value".to_vec())),
            )
            .unwrap(),
        ];
        for t in &trees {
            if t.height > 3 {
                continue;
            }
            let key = format!("key{:04}", n / 2).into_bytes();
            seeds.push(tree_input(&store, t, n as u64 / 3, n as u64, &key));
        }
    }
    seeds
}

fn logstore_seeds() -> Vec<Vec<u8>> {
    let t = logstore::template();
    let idx = |name: &str| t.files.iter().position(|(n, _)| n == name).unwrap() as u8;
    // No edits; and no edits plus the write check (a no-op overwrite with mode bit 7).
    let mut seeds = vec![
        Vec::new(),
        Edit::encode(&[Edit {
            file: 0,
            mode: 0x83,
            off: 0,
            data: vec![0],
        }]),
    ];
    // Rewrite each file with its own content from byte 16 (after the header) or from 0:
    // mutations of the data then damage real records.
    for (i, (_, bytes)) in t.files.iter().enumerate() {
        if bytes.len() > 16 && bytes.len() < 60000 {
            seeds.push(Edit::encode(&[Edit {
                file: i as u8,
                mode: 0,
                off: 16,
                data: bytes[16..].to_vec(),
            }]));
        }
    }
    let active = t.segments.last().unwrap();
    let a = idx(active);
    let active_bytes = &t.files[a as usize].1;
    // Torn tail of the active segment, and one flipped bit in its last record.
    seeds.push(Edit::encode(&[Edit {
        file: a,
        mode: 0x84,
        off: (active_bytes.len() - 5) as u16,
        data: vec![],
    }]));
    seeds.push(Edit::encode(&[Edit {
        file: a,
        mode: 0x83,
        off: (active_bytes.len() - 3) as u16,
        data: vec![0x10],
    }]));
    // Append a copy of the first sealed segment's records to the active one.
    if let Some(first) = t.segments.first().filter(|s| *s != active) {
        let b = &t.files[idx(first) as usize].1;
        seeds.push(Edit::encode(&[Edit {
            file: a,
            mode: 1,
            off: 0,
            data: b[16..].to_vec(),
        }]));
    }
    seeds
}

fn capsule_metadata_seeds() -> Vec<Vec<u8>> {
    let f = capsule::fixture();
    let mut m = f.meta.clone();
    let mut seeds = vec![m.encode()];
    m.algo = HashAlgo::Sha256;
    m.writers.truncate(1);
    m.cipher = BodyCipher::XChaCha20Poly1305;
    m.settings.insert("replicas".into(), "3".into());
    m.description = "dé".into();
    seeds.push(m.encode());
    seeds
}

fn record_header_seeds() -> Vec<Vec<u8>> {
    let f = capsule::fixture();
    f.names.iter().map(|n| f.headers[n].encode()).collect()
}

fn record_proof_seeds() -> Vec<Vec<u8>> {
    let f = capsule::fixture();
    let mut seeds = Vec::new();
    for (k, v) in f.record_proofs.iter().enumerate() {
        let t = f.names.iter().position(|n| *n == v.target).unwrap() as u8;
        let mut raw = vec![t << 1];
        raw.extend_from_slice(&v.bytes);
        seeds.push(raw);
        seeds.push(vec![1, k as u8]);
    }
    // A mutation: flip a bit of the anchor's signature.
    let v = f.record_proofs.len() as u16;
    seeds.push(vec![1, 0, 0, v.to_le_bytes()[0], v.to_le_bytes()[1], 1]);
    seeds
}

fn subrecord_proof_seeds() -> Vec<Vec<u8>> {
    let f = capsule::fixture();
    let mut seeds = Vec::new();
    for (k, v) in f.subrecord_proofs.iter().enumerate() {
        let t = f.subs.iter().position(|s| *s == v.sub).unwrap() as u8;
        let mut raw = vec![t << 1];
        raw.extend_from_slice(&v.bytes);
        seeds.push(raw);
        seeds.push(vec![1, k as u8, t.wrapping_add(1)]);
    }
    // Mutations: the index, and the first path element.
    seeds.push(vec![1, 3, 0, 0, 1, 0, 1]);
    seeds.push(vec![1, 3, 0, 0, 5, 0, 0x80]);
    seeds
}

fn subrecords_proof_seeds() -> Vec<Vec<u8>> {
    let f = capsule::fixture();
    let mut seeds = Vec::new();
    for (k, v) in f.subrecords_proofs.iter().enumerate() {
        let mut raw = vec![(v.list as u8) << 1];
        raw.extend_from_slice(&v.bytes);
        seeds.push(raw);
        seeds.push(vec![1, k as u8]);
    }
    // The stray list, with the mixed list's proof; and mutations of a sibling and a position.
    let stray = (f.sub_lists.len() - 1) as u8;
    let mut raw = vec![stray << 1];
    raw.extend_from_slice(&f.subrecords_proofs[2].bytes);
    seeds.push(raw);
    seeds.push(vec![1, 3, 0, 8, 0, 1]);
    seeds.push(vec![1, 2, 0, 4, 0, 2]);
    seeds
}

fn merkle_seeds() -> Vec<Vec<u8>> {
    let mut seeds = Vec::new();
    for algo in [HashAlgo::Blake3, HashAlgo::Sha256] {
        let bit = u8::from(algo == HashAlgo::Sha256);
        let log = cairn_fuzz::merkle::log(algo);
        for (a, b) in [
            (0u64, 1u64),
            (5, 13),
            (12, 13),
            (300, 600),
            (0, 0),
            (64, 64),
        ] {
            let (first, second) = (a.min(b), b);
            // Raw inclusion (valid when a < b) and consistency (valid).
            if a < b {
                let mut r = vec![bit];
                r.extend_from_slice(&a.to_le_bytes());
                r.extend_from_slice(&b.to_le_bytes());
                r.extend_from_slice(&log.leaf(a).unwrap());
                r.extend_from_slice(&log.root_at(b).unwrap());
                for d in log.inclusion_proof(a, b).unwrap() {
                    r.extend_from_slice(&d);
                }
                seeds.push(r);
            }
            let mut r = vec![bit | 4];
            r.extend_from_slice(&first.to_le_bytes());
            r.extend_from_slice(&second.to_le_bytes());
            r.extend_from_slice(&log.root_at(first).unwrap());
            r.extend_from_slice(&log.root_at(second).unwrap());
            for d in log.consistency_proof(first, second).unwrap() {
                r.extend_from_slice(&d);
            }
            seeds.push(r);
            // Structured, unedited, and with one edit of the path.
            for flags in [bit | 2, bit | 6] {
                let mut s = vec![flags];
                s.extend_from_slice(&(a as u16).to_le_bytes());
                s.extend_from_slice(&(b as u16).to_le_bytes());
                seeds.push(s.clone());
                s.extend_from_slice(&[0, 2, 7, 1]);
                seeds.push(s);
            }
        }
    }
    seeds
}

/// Runs every capsule seed through its target, so a broken fixture or oracle shows here.
fn check_capsule_seeds(all: &[(&str, Vec<Vec<u8>>)]) {
    for (t, seeds) in all {
        let run: fn(&[u8]) = match *t {
            "capsule_metadata" => capsule::run_capsule_metadata,
            "record_header" => capsule::run_record_header,
            "record_proof" => capsule::run_record_proof,
            "subrecord_proof" => capsule::run_subrecord_proof,
            "subrecords_proof" => capsule::run_subrecords_proof,
            "merkle_proofs" => cairn_fuzz::merkle::run,
            _ => unreachable!(),
        };
        for s in seeds {
            run(s);
        }
    }
}

/// Turns the chunks a node side recorded into the `evidence` input format: `a`'s Meta
/// chunk, `b`'s, then the rest in reverse post-order of their references (bases and tree
/// roots of Meta chunks, children of tree nodes), each reference replaced by a placeholder
/// naming a later chunk.
fn evidence_input(
    sent: &[bytes::Bytes],
    a: Cid,
    b: Cid,
    lca: bool,
    limit: usize,
    key: &[u8],
) -> Vec<u8> {
    let by_cid: HashMap<Cid, &bytes::Bytes> = sent
        .iter()
        .map(|c| (HashAlgo::Blake3.digest(c), c))
        .collect();
    let refs = |c: &bytes::Bytes| -> Vec<Cid> {
        let r = match FObject::from_chunk(c) {
            Ok(o) => {
                let mut r = o.bases.clone();
                if let Value::Tree(t) = &o.value {
                    r.push(t.root);
                }
                r
            }
            Err(_) => postree::child_cids(c).unwrap_or_default(),
        };
        r.into_iter().filter(|x| by_cid.contains_key(x)).collect()
    };
    fn visit(
        c: Cid,
        by_cid: &HashMap<Cid, &bytes::Bytes>,
        refs: &dyn Fn(&bytes::Bytes) -> Vec<Cid>,
        seen: &mut HashMap<Cid, ()>,
        post: &mut Vec<Cid>,
    ) {
        if seen.insert(c, ()).is_some() {
            return;
        }
        for k in refs(by_cid[&c]) {
            visit(k, by_cid, refs, seen, post);
        }
        post.push(c);
    }
    let mut seen: HashMap<Cid, ()> = [(a, ()), (b, ())].into_iter().collect();
    let mut post = Vec::new();
    for top in [b, a] {
        for k in refs(by_cid[&top]) {
            visit(k, &by_cid, &refs, &mut seen, &mut post);
        }
    }
    post.reverse();
    let mut order = vec![a];
    if b != a {
        order.push(b);
    }
    order.extend(post);
    assert!(
        order.len() <= cairn_fuzz::evidence::MAX_CHUNKS,
        "evidence too big for a seed"
    );
    let index: HashMap<Cid, usize> = order.iter().enumerate().map(|(i, c)| (*c, i)).collect();
    let chunks: Vec<Vec<u8>> = order
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut bytes = by_cid[c].to_vec();
            for k in refs(by_cid[c]) {
                assert!(index[&k] > i, "a reference to an earlier chunk");
                put_placeholder(&mut bytes, &k, index[&k]);
            }
            bytes
        })
        .collect();
    cairn_fuzz::evidence::Input {
        lca,
        limit,
        key,
        cursor: b"",
        chunks: chunks.iter().map(|c| c.as_slice()).collect(),
    }
    .encode()
}

fn evidence_seeds() -> Vec<Vec<u8>> {
    let small = TreeConfig {
        leaf_target: 64,
        index_target: 64,
    };
    let db = Db::with_config(Arc::new(MemoryStore::new()), small);
    let put = |key: &[u8], branch: &str, v: NewValue| {
        db.put(key, Target::Branch(branch), v, &PutOptions::default())
            .unwrap()
    };
    let mut seeds = Vec::new();
    // Two versions of a map, the newer first (it names the older as its base).
    let entries = |edit: usize| -> NewValue {
        NewValue::Map(
            (0..60)
                .map(|i| {
                    let v = if i == edit {
                        "edited".to_string()
                    } else {
                        format!("v{i}")
                    };
                    (format!("k{i:03}").into_bytes(), v.into_bytes())
                })
                .collect(),
        )
    };
    let old = put(b"m", "master", entries(usize::MAX));
    let new = put(b"m", "master", entries(17));
    for limit in [1, 16] {
        let (sent, used) =
            diff_page_evidence(db.chunks(), b"m", &new, &old, None, limit, 1 << 30).unwrap();
        seeds.push(evidence_input(&sent, new, old, false, used, b"m"));
    }
    // A blob with a region changed.
    let mut bytes: Vec<u8> = (0..1500u32).map(|i| (i * 131 % 251) as u8).collect();
    let old = put(b"b", "master", NewValue::Blob(bytes.clone()));
    bytes[700..720].fill(9);
    let new = put(b"b", "master", NewValue::Blob(bytes));
    let (sent, used) =
        diff_page_evidence(db.chunks(), b"b", &new, &old, None, 16, 1 << 30).unwrap();
    seeds.push(evidence_input(&sent, new, old, false, used, b"b"));
    // A forked history of strings for the LCA.
    let s = |v: &str| NewValue::String(v.as_bytes().to_vec());
    let root = put(b"h", "master", s("0"));
    let mut main = root;
    for i in 0..4 {
        main = put(b"h", "master", s(&format!("m{i}")));
    }
    db.fork(b"h", &At::Uid(root), "side").unwrap();
    let mut side = root;
    for i in 0..3 {
        side = put(b"h", "side", s(&format!("s{i}")));
    }
    let mut sent = Vec::new();
    lca_evidence(db.chunks(), b"h", &main, &side, |c| {
        sent.push(c);
        Ok(())
    })
    .unwrap();
    seeds.push(evidence_input(&sent, main, side, true, 1, b"h"));
    for seed in &seeds {
        assert!(
            cairn_fuzz::evidence::checks_out(seed),
            "a seed that fails its check"
        );
        cairn_fuzz::evidence::run(seed);
    }
    seeds
}

fn main() {
    let out = std::env::args().nth(1).unwrap_or_else(|| "seeds".into());
    let out = Path::new(&out);
    write(out, "codec", &codec_seeds());
    write(out, "fobject", &fobject_seeds());
    write(out, "branch_table", &branch_seeds());
    write(out, "postree_node", &postree_seeds());
    write(out, "evidence", &evidence_seeds());
    write(out, "logstore_recovery", &logstore_seeds());
    let capsule_seeds = [
        ("capsule_metadata", capsule_metadata_seeds()),
        ("record_header", record_header_seeds()),
        ("record_proof", record_proof_seeds()),
        ("subrecord_proof", subrecord_proof_seeds()),
        ("subrecords_proof", subrecords_proof_seeds()),
        ("merkle_proofs", merkle_seeds()),
    ];
    check_capsule_seeds(&capsule_seeds);
    for (t, seeds) in &capsule_seeds {
        write(out, t, seeds);
    }
    let wire_seeds: [(&str, Vec<Vec<u8>>, fn(&[u8])); 5] = [
        ("sync_msg", wire::sync_msg_seeds(), wire::run_sync_msg),
        (
            "sync_session",
            wire::sync_session_seeds(),
            wire::run_sync_session,
        ),
        (
            "wire_request",
            wire::wire_request_seeds(),
            wire::run_wire_request,
        ),
        (
            "wire_response",
            wire::wire_response_seeds(),
            wire::run_wire_response,
        ),
        ("frame", wire::frame_seeds(), wire::run_frame),
    ];
    for (t, seeds, run) in &wire_seeds {
        for s in seeds {
            run(s);
        }
        write(out, t, seeds);
    }
    let bucket_seeds: [(&str, Vec<Vec<u8>>, fn(&[u8])); 2] = [
        (
            "bucket_mutation",
            cairn_fuzz::bucket::mutation_seeds(),
            cairn_fuzz::bucket::run_mutation,
        ),
        (
            "version_proof",
            cairn_fuzz::bucket::version_proof_seeds(),
            cairn_fuzz::bucket::run_version_proof,
        ),
    ];
    for (t, seeds, run) in &bucket_seeds {
        for s in seeds {
            run(s);
        }
        write(out, t, seeds);
    }
    let t = logstore::template();
    for (n, b) in &t.files {
        println!("  template file {n}: {} bytes", b.len());
    }
}

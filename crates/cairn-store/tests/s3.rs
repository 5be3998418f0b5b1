//! The S3 chunk backend against a real S3-compatible server started by the test (see
//! `s3_server/mod.rs`): puts, reads, batches, listings, removals and tamper detection over
//! HTTP, no client-side mock.
#![cfg(feature = "object-store")]

mod s3_server;

use std::sync::Arc;

use cairn_store::object::object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use cairn_store::object::{ObjectChunkStore, ObjectStoreConfig, ObjectStoreKind};
use cairn_store::{ChunkStore, Durability, Error, HashAlgo};
use s3_server::{S3Server, until_ready};

#[test]
fn s3_chunk_store_against_a_real_server() {
    let Some(server) = S3Server::start() else {
        return;
    };
    let config = server.config("node-a");
    let store = config.open(Durability::Group).expect("open the S3 store");
    until_ready(60, || store.probe());
    let algo = HashAlgo::default();

    // Single chunks.
    let a = store.put(b"alpha").unwrap();
    assert_eq!(store.get(&a).unwrap().as_deref(), Some(&b"alpha"[..]));
    assert!(store.has(&a).unwrap());
    let dup = store.put_hashed(a, b"alpha").unwrap();
    assert!(
        !dup,
        "{}: a repeated put is not new (If-None-Match)",
        server.name
    );
    assert_eq!(store.get(&a).unwrap().as_deref(), Some(&b"alpha"[..]));
    let absent = algo.digest(b"never stored");
    assert_eq!(store.get(&absent).unwrap(), None);
    assert!(!store.has(&absent).unwrap());

    // A batch large enough that listing takes more than one page (S3 pages hold 1000 keys),
    // with a few large chunks among the small ones.
    let mut bodies: Vec<Vec<u8>> = (0..1100u32)
        .map(|i| format!("chunk {i}").into_bytes())
        .collect();
    for i in 0..4u8 {
        bodies.push(vec![i; 1 << 20]);
    }
    let slices: Vec<&[u8]> = bodies.iter().map(Vec::as_slice).collect();
    let cids = store.put_batch(&slices).unwrap();
    for (cid, body) in cids.iter().zip(&bodies) {
        assert_eq!(*cid, algo.digest(body));
    }
    for i in [0, 1, 555, 1099, 1100, 1103] {
        assert_eq!(
            store.get(&cids[i]).unwrap().as_deref(),
            Some(bodies[i].as_slice())
        );
    }
    // get_many: concurrent reads, in order, each verified.
    let many = store.get_many(&cids).unwrap();
    assert_eq!(many.len(), bodies.len());
    for (got, body) in many.iter().zip(&bodies) {
        assert_eq!(got.as_deref(), Some(body.as_slice()));
    }
    let mut listed = store.cids().unwrap();
    listed.sort();
    let mut want = cids.clone();
    want.push(a);
    want.sort();
    assert_eq!(listed, want, "cids() lists every chunk, across pages");
    let stats = store.stats().unwrap();
    assert_eq!(stats.chunks, want.len() as u64);
    let body_bytes: usize = bodies.iter().map(Vec::len).sum();
    assert_eq!(stats.chunk_bytes, (body_bytes + 5) as u64);

    // Another prefix in the same bucket is another store; a new client sees what was put.
    let other = server.config("node-b").open(Durability::Group).unwrap();
    assert!(other.cids().unwrap().is_empty());
    assert_eq!(other.get(&a).unwrap(), None);
    let again = config.open(Durability::Group).unwrap();
    assert_eq!(
        again.get(&cids[1100]).unwrap().as_deref(),
        Some(bodies[1100].as_slice())
    );

    // Verified reads: bytes overwritten through the raw client are an error, never data.
    let raw: Arc<dyn ObjectStore> = store.object_store().clone();
    let path = store.chunk_path(&a);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(raw.put(&path, PutPayload::from_static(b"omega")))
        .unwrap();
    let err = store.get(&a).unwrap_err();
    assert!(matches!(err, Error::Corrupt(_)), "{err}");
    assert!(err.to_string().contains(&a.to_string()), "{err}");
    let err = store.get_many(&[cids[0], a]).unwrap_err();
    assert!(matches!(err, Error::Corrupt(_)), "{err}");

    // Removal, absent cids included.
    store.remove(&[a, cids[3], cids[1101], absent]).unwrap();
    for gone in [a, cids[3], cids[1101]] {
        assert!(!store.has(&gone).unwrap());
        assert_eq!(store.get(&gone).unwrap(), None);
    }
    assert!(store.has(&cids[4]).unwrap());
    assert_eq!(store.cids().unwrap().len(), want.len() - 3);

    // A bucket that does not exist fails the probe instead of reading as "no chunks".
    let mut missing = ObjectStoreConfig::new(ObjectStoreKind::S3);
    missing.bucket = Some("no-such-bucket".into());
    missing.endpoint = config.endpoint.clone();
    missing.region = config.region.clone();
    missing.allow_http = true;
    let missing: ObjectChunkStore = missing.open(Durability::Group).unwrap();
    let err = missing.probe().unwrap_err();
    eprintln!("{}: probing a missing bucket: {err}", server.name);
}

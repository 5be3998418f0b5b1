//! A node whose chunks live in S3: a real S3-compatible server started by the test (see
//! `cairn-store/tests/s3_server/mod.rs`), a multi-megabyte object put through a bucket,
//! the node closed and reopened, the object read back and compared byte for byte, and a
//! chunk altered in the bucket behind the node's back reported as corrupt.
#![cfg(feature = "object-store")]

#[path = "../../cairn-store/tests/s3_server/mod.rs"]
mod s3_server;

use cairn_node::config::{BackendConfig, BackendKind};
use cairn_node::{Config, Node};
use cairn_object::postree;
use cairn_object::{At, PutOptions, Target};
use cairn_store::object::object_store::{ObjectStoreExt, PutPayload};
use cairn_store::{Durability, Error};
use futures_util::TryStreamExt;
use s3_server::{S3Server, until_ready};

/// Deterministic bytes that do not repeat (so chunks do not dedup away).
fn data(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn read_blob(node: &Node, key: &[u8]) -> cairn_core::Result<Vec<u8>> {
    let db = node.db_for("b")?;
    let version = db.get(key, &At::Branch("master".into()))?;
    let tree = version
        .object
        .value
        .tree()
        .ok_or_else(|| Error::invalid("not a blob"))?;
    postree::blob_read(db.chunks(), tree, 0, tree.count)
}

#[test]
fn node_keeps_chunks_in_s3_across_restarts() {
    let Some(server) = S3Server::start() else {
        return;
    };
    eprintln!("S3 server: {} at {}", server.name, server.endpoint);
    let os = server.config("node-1");
    // The server may listen a moment before it serves.
    let probe = os.open(Durability::Group).unwrap();
    until_ready(60, || probe.probe());

    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        data_dir: dir.path().join("data"),
        durability: Durability::Group,
        backend: BackendConfig {
            kind: BackendKind::S3,
            bucket: os.bucket.clone(),
            prefix: os.prefix.clone(),
            endpoint: os.endpoint.clone(),
            region: os.region.clone(),
            path: None,
            allow_http: true,
        },
        ..Config::default()
    };

    let body = data(6 << 20);
    let chunks = {
        let node = Node::open(config.clone()).expect("open a node with an S3 backend");
        let bucket = node.bucket("b").unwrap();
        bucket
            .put_blob_stream(
                b"big",
                Target::Branch("master"),
                &mut body.as_slice(),
                &PutOptions::default(),
                &mut |_| {},
            )
            .unwrap();
        assert_eq!(read_blob(&node, b"big").unwrap(), body);
        let stats = node.store.stats().unwrap();
        // 6 MiB in leaves of about 64 KiB (the node's default leaf size), plus index nodes.
        assert!(stats.chunks > 40, "{stats:?}: the object spans many chunks");
        assert!(stats.chunk_bytes >= body.len() as u64, "{stats:?}");
        stats.chunks
    };

    // Every chunk went to the bucket: the embedded log holds refs only (Node::open refuses
    // a data_dir with embedded chunks under an object-store backend, so reopening checks
    // that too), and a fresh client of the bucket lists them.
    let raw = os.build(Durability::Group).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let objects: Vec<_> = rt.block_on(raw.list(None).try_collect::<Vec<_>>()).unwrap();
    assert!(
        objects.len() as u64 >= chunks,
        "{} objects in the bucket, {chunks} chunks in the store",
        objects.len()
    );
    // Chunks, and the marker naming the node that writes the prefix.
    assert!(objects.iter().all(|o| {
        let at = o.location.as_ref();
        at.starts_with("node-1/chunks/") || at == "node-1/cairn-owner"
    }));
    assert!(
        objects
            .iter()
            .any(|o| o.location.as_ref() == "node-1/cairn-owner")
    );

    let node = Node::open(config.clone()).expect("reopen the node");
    assert_eq!(
        read_blob(&node, b"big").unwrap(),
        body,
        "read back after a restart"
    );

    // A chunk changed in the bucket is reported, not served.
    let victim = objects
        .iter()
        .max_by_key(|o| o.size)
        .map(|o| o.location.clone())
        .unwrap();
    rt.block_on(raw.put(&victim, PutPayload::from_static(b"not the chunk")))
        .unwrap();
    let err = read_blob(&node, b"big").unwrap_err();
    assert!(matches!(err, Error::Corrupt(_)), "{err}");
    drop(node);

    // A data_dir that already holds embedded chunks is refused under an S3 backend.
    let embedded_dir = tempfile::tempdir().unwrap();
    let embedded = Config {
        data_dir: embedded_dir.path().join("data"),
        ..Config::default()
    };
    {
        let node = Node::open(embedded.clone()).unwrap();
        node.bucket("b")
            .unwrap()
            .put_blob_stream(
                b"small",
                Target::Branch("master"),
                &mut &b"local bytes"[..],
                &PutOptions::default(),
                &mut |_| {},
            )
            .unwrap();
    }
    let switched = Config {
        backend: config.backend.clone(),
        ..embedded
    };
    let err = Node::open(switched)
        .err()
        .expect("a switched backend is refused");
    assert!(format!("{err:#}").contains("embedded"), "{err:#}");
}

/// A data directory remembers where its chunks live, and a prefix the node that writes it:
/// a restart with another prefix, or as `embedded`, is refused (every version would read
/// as missing), and so is a second node on a prefix the first claimed (each would count
/// the other's half-written chunks as stored). Uses the `local` kind: no server needed.
#[test]
fn a_node_refuses_another_backend_or_another_nodes_prefix() {
    let chunks = tempfile::tempdir().unwrap();
    let local = |prefix: &str| BackendConfig {
        kind: BackendKind::Local,
        bucket: None,
        prefix: prefix.into(),
        endpoint: None,
        region: None,
        path: Some(chunks.path().to_path_buf()),
        allow_http: false,
    };
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        data_dir: dir.path().join("data"),
        durability: Durability::Group,
        backend: local("a"),
        ..Config::default()
    };
    let body = data(300_000);
    {
        let node = Node::open(config.clone()).unwrap();
        node.bucket("b")
            .unwrap()
            .put_blob_stream(
                b"k",
                Target::Branch("master"),
                &mut body.as_slice(),
                &PutOptions::default(),
                &mut |_| {},
            )
            .unwrap();
    }
    assert!(dir.path().join("data/BACKEND").is_file());
    assert!(chunks.path().join("a/cairn-owner").is_file());
    // The same config starts again and reads its data, also with the directory spelled
    // another way (a `.` step, a trailing slash).
    assert_eq!(
        read_blob(&Node::open(config.clone()).unwrap(), b"k").unwrap(),
        body
    );
    let respelled = chunks.path().join(".").join("");
    let mut same_dir = config.clone();
    same_dir.backend.path = Some(respelled);
    Node::open(same_dir).unwrap();
    // Another prefix, or no object store at all: refused, saying why.
    for backend in [local("other"), BackendConfig::default()] {
        let e = Node::open(Config {
            backend,
            ..config.clone()
        })
        .err()
        .expect("refused");
        assert!(format!("{e:#}").contains("another backend"), "{e:#}");
    }
    // A second node (its own data directory, so its own key) on the same prefix.
    let other = tempfile::tempdir().unwrap();
    let second = Config {
        data_dir: other.path().join("data"),
        ..config.clone()
    };
    let e = Node::open(second.clone()).err().expect("refused");
    assert!(format!("{e:#}").contains("another Cairn node"), "{e:#}");
    assert!(
        !other.path().join("data/BACKEND").exists(),
        "nothing recorded"
    );
    // On a prefix of its own it starts.
    Node::open(Config {
        backend: local("second"),
        ..second
    })
    .unwrap();
    // The first node is still fine.
    assert_eq!(
        read_blob(&Node::open(config.clone()).unwrap(), b"k").unwrap(),
        body
    );
    // A copy of the first node's key file in another data directory, on its prefix: refused
    // as another instance of that key (it would count the first one's half-written chunks
    // as stored).
    let copy = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(copy.path().join("data")).unwrap();
    std::fs::copy(
        dir.path()
            .join("data")
            .join(cairn_node::node::NODE_KEY_FILE),
        copy.path()
            .join("data")
            .join(cairn_node::node::NODE_KEY_FILE),
    )
    .unwrap();
    let e = Node::open(Config {
        data_dir: copy.path().join("data"),
        ..config.clone()
    })
    .err()
    .expect("refused");
    assert!(format!("{e:#}").contains("another instance"), "{e:#}");
    // A marker naming the key alone (claimed before instance ids) is taken over by its node.
    let key = cairn_node::keys::read(
        &dir.path()
            .join("data")
            .join(cairn_node::node::NODE_KEY_FILE),
    )
    .unwrap();
    let marker = chunks.path().join("a/cairn-owner");
    std::fs::write(&marker, format!("cairn node {}\n", key.public())).unwrap();
    std::fs::remove_file(dir.path().join("data/INSTANCE")).unwrap();
    assert_eq!(
        read_blob(&Node::open(config.clone()).unwrap(), b"k").unwrap(),
        body
    );
    assert!(
        std::fs::read_to_string(&marker)
            .unwrap()
            .contains(" instance ")
    );
    // Its INSTANCE file lost (a data_dir restored from an older backup): the node, which
    // used this backend before, takes its key's marker over again.
    std::fs::remove_file(dir.path().join("data/INSTANCE")).unwrap();
    assert_eq!(
        read_blob(&Node::open(config.clone()).unwrap(), b"k").unwrap(),
        body
    );
    // The chunk directory comes back empty (a volume that did not mount, a bucket
    // replaced): the node that used it before refuses to start rather than claim it afresh
    // and serve every version as missing; nothing is written there.
    let moved = chunks.path().with_extension("moved");
    std::fs::rename(chunks.path().join("a"), &moved).unwrap();
    std::fs::create_dir(chunks.path().join("a")).unwrap();
    let e = Node::open(config.clone()).err().expect("refused");
    assert!(
        format!("{e:#}").contains("not the bucket, prefix or directory"),
        "{e:#}"
    );
    assert!(!chunks.path().join("a/cairn-owner").exists());
    // Mounted again, it starts and reads its data.
    std::fs::remove_dir_all(chunks.path().join("a")).unwrap();
    std::fs::rename(&moved, chunks.path().join("a")).unwrap();
    assert_eq!(read_blob(&Node::open(config).unwrap(), b"k").unwrap(), body);
}

//! Shared harness of the Gaia hub tests: a node on a loopback socket (port 0) in a
//! temporary directory, and Gaia tokens made the way stacks.js makes them (ES256K JWTs
//! signed with k256, legacy DER tokens, association tokens).

#![allow(dead_code)]

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use cairn_node::gaia::GaiaConfig;
use cairn_node::gaia::auth::{challenge_text, p2pkh_address};
use cairn_node::{Bound, Config, Node};
use k256::ecdsa::signature::hazmat::PrehashSigner;
use k256::ecdsa::{Signature, SigningKey};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// A running node.
pub struct Hub {
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    /// The client.
    pub http: reqwest::Client,
    /// The node's shared state.
    pub node: Arc<Node>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    _dir: tempfile::TempDir,
}

impl Hub {
    /// Starts a node with default Gaia settings and the given upload limit.
    pub async fn start(max_upload_bytes: u64) -> Hub {
        Self::with(max_upload_bytes, 256, GaiaConfig::default()).await
    }

    /// Starts a node with chosen settings.
    pub async fn with(max_upload_bytes: u64, write_queue: usize, gaia: GaiaConfig) -> Hub {
        Self::tuned(|c| {
            c.max_upload_bytes = max_upload_bytes;
            c.write_queue = write_queue;
            c.gaia = gaia;
        })
        .await
    }

    /// Starts a node with the default settings as `tune` changes them.
    pub async fn tuned(tune: impl FnOnce(&mut Config)) -> Hub {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = Config {
            data_dir: dir.path().join("data"),
            listen: "127.0.0.1:0".into(),
            durability: cairn_store::Durability::Buffered,
            ..Config::default()
        };
        tune(&mut config);
        let node = Node::open(config).expect("open node");
        let bound = Bound::bind(node.clone()).await.expect("bind");
        let base = format!("http://{}", bound.addr);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(bound.serve(async {
            let _ = rx.await;
        }));
        Hub {
            base,
            http: reqwest::Client::new(),
            node,
            stop: Some(tx),
            _dir: dir,
        }
    }

    /// `base + path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Stores `body` at `path` of `key`'s bucket with `auth`; returns status and JSON.
    pub async fn store(
        &self,
        auth: &str,
        address: &str,
        path: &str,
        body: &[u8],
        headers: &[(&str, &str)],
    ) -> (u16, Value) {
        let mut r = self
            .http
            .post(self.url(&format!("/store/{address}/{path}")))
            .header("authorization", auth)
            .body(body.to_vec());
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        let resp = r.send().await.expect("send");
        let st = resp.status().as_u16();
        (st, resp.json().await.unwrap_or(Value::Null))
    }

    /// Deletes `path`; returns status and body text.
    pub async fn delete(&self, auth: &str, address: &str, path: &str) -> (u16, String) {
        let resp = self
            .http
            .delete(self.url(&format!("/delete/{address}/{path}")))
            .header("authorization", auth)
            .send()
            .await
            .expect("send");
        let st = resp.status().as_u16();
        (st, resp.text().await.unwrap_or_default())
    }

    /// Lists files with a JSON request body.
    pub async fn list(&self, auth: &str, address: &str, body: Value) -> (u16, Value) {
        let resp = self
            .http
            .post(self.url(&format!("/list-files/{address}")))
            .header("authorization", auth)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .expect("send");
        let st = resp.status().as_u16();
        (st, resp.json().await.unwrap_or(Value::Null))
    }

    /// Reads `address/path` from the read endpoint: status, ETag, content type, body.
    pub async fn read(
        &self,
        address: &str,
        path: &str,
    ) -> (u16, Option<String>, Option<String>, Vec<u8>) {
        let resp = self
            .http
            .get(self.url(&format!("/read/{address}/{path}")))
            .send()
            .await
            .expect("send");
        let st = resp.status().as_u16();
        let h = |n: &str| {
            resp.headers()
                .get(n)
                .map(|v| v.to_str().unwrap().to_string())
        };
        let (etag, ct) = (h("etag"), h("content-type"));
        (st, etag, ct, resp.bytes().await.unwrap().to_vec())
    }

    /// The names listed for `address` (all pages).
    pub async fn names(&self, auth: &str, address: &str) -> Vec<String> {
        let (st, v) = self.list(auth, address, json!({})).await;
        assert_eq!(st, 202, "{v}");
        v["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e.as_str().unwrap().to_string())
            .collect()
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// Seconds since the epoch.
pub fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// A secp256k1 key of a test user.
pub struct Key(pub SigningKey);

impl Key {
    /// A fixed key from a seed byte.
    pub fn new(seed: u8) -> Key {
        let mut b = [0x11u8; 32];
        b[31] = seed;
        Key(SigningKey::from_slice(&b).expect("key"))
    }

    /// The compressed public key in hex.
    pub fn public_hex(&self) -> String {
        hex::encode(self.0.verifying_key().to_encoded_point(true).as_bytes())
    }

    /// The key's P2PKH address.
    pub fn address(&self) -> String {
        p2pkh_address(self.0.verifying_key().to_encoded_point(true).as_bytes())
    }

    /// A compact ES256K JWT over `payload`; `high_s` flips S to its high form (as some JS
    /// signers leave it).
    pub fn jwt(&self, payload: &Value, high_s: bool) -> String {
        let header = URL_SAFE_NO_PAD.encode(br#"{"typ":"JWT","alg":"ES256K"}"#);
        let body = URL_SAFE_NO_PAD.encode(payload.to_string());
        let input = format!("{header}.{body}");
        let sig: Signature = self
            .0
            .sign_prehash(&Sha256::digest(input.as_bytes()))
            .expect("sign");
        let sig = if high_s {
            let (r, s) = (sig.r(), sig.s());
            Signature::from_scalars(r.to_bytes(), (-*s.as_ref()).to_bytes()).expect("high s")
        } else {
            sig
        };
        format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig.to_bytes()))
    }

    /// The default payload of a v1 token for the default hub (`gaia-0`).
    pub fn payload(&self) -> Value {
        json!({
            "gaiaChallenge": challenge_text("gaia-0"),
            "iss": self.public_hex(),
            "exp": now() + 3600.0,
            "iat": now().floor() as i64,
            "salt": "00112233445566778899aabbccddeeff",
        })
    }

    /// `bearer v1:<jwt>` for a payload.
    pub fn bearer_with(&self, payload: &Value) -> String {
        format!("bearer v1:{}", self.jwt(payload, false))
    }

    /// `bearer v1:<jwt>` with the default payload.
    pub fn bearer(&self) -> String {
        self.bearer_with(&self.payload())
    }

    /// A legacy token: base64 of `{publickey, signature}` with a DER signature over
    /// SHA-256 of the challenge text.
    pub fn legacy_bearer(&self, challenge: &str) -> String {
        let sig: Signature = self
            .0
            .sign_prehash(&Sha256::digest(challenge.as_bytes()))
            .expect("sign");
        let obj = json!({
            "publickey": self.public_hex(),
            "signature": hex::encode(sig.to_der().as_bytes()),
        });
        format!("bearer {}", STANDARD.encode(obj.to_string()))
    }

    /// An association token by this (identity) key for `child`.
    pub fn association(&self, child: &Key, exp: f64) -> String {
        self.jwt(
            &json!({
                "childToAssociate": child.public_hex(),
                "iss": self.public_hex(),
                "exp": exp,
                "iat": now().floor() as i64,
                "gaiaChallenge": "undefined",
                "salt": "aa",
            }),
            false,
        )
    }
}

//! Shared harness of the native API tests: a real node on a loopback socket (port 0) in a
//! temporary data directory, a client, and request signing.

#![allow(dead_code)]

use std::sync::Arc;

use cairn_core::SigningKey;
use cairn_node::native::auth::{RequestToSign, body_blake3, now_secs};
use cairn_node::{Bound, Config, Node};
use reqwest::{Method, RequestBuilder, Response};

/// A running node.
pub struct Server {
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    /// The client.
    pub http: reqwest::Client,
    /// The node's shared state.
    pub node: Arc<Node>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    _dir: tempfile::TempDir,
}

impl Server {
    /// Starts a node accepting uploads up to `max_upload_bytes`.
    pub async fn start(max_upload_bytes: u64) -> Server {
        Server::start_with(|c| c.max_upload_bytes = max_upload_bytes).await
    }

    /// Starts a node with the test defaults changed by `tune`.
    pub async fn start_with(tune: impl FnOnce(&mut Config)) -> Server {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = Config {
            data_dir: dir.path().join("data"),
            listen: "127.0.0.1:0".into(),
            durability: cairn_store::Durability::Buffered,
            ..Config::default()
        };
        tune(&mut config);
        Server::serve(config, dir).await
    }

    /// Opens a node with `config` (its data in `dir`) and serves it.
    async fn serve(config: Config, dir: tempfile::TempDir) -> Server {
        let node = Node::open(config).expect("open node");
        let bound = Bound::bind(node.clone()).await.expect("bind");
        let base = format!("http://{}", bound.addr);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(bound.serve(async {
            let _ = rx.await;
        }));
        Server {
            base,
            http: reqwest::Client::new(),
            node,
            stop: Some(tx),
            task: Some(task),
            _dir: dir,
        }
    }

    /// A request to `path` (which starts with `/`).
    pub fn req(&self, method: Method, path: &str) -> RequestBuilder {
        self.http.request(method, format!("{}{path}", self.base))
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> Response {
        self.req(Method::GET, path).send().await.expect("send")
    }

    /// `GET path` as JSON.
    pub async fn get_json(&self, path: &str) -> (u16, serde_json::Value) {
        let r = self
            .req(Method::GET, path)
            .header("accept", "application/json")
            .send()
            .await
            .expect("send");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(serde_json::Value::Null))
    }

    /// Sends a request with a body and optional headers; returns status and JSON body.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Vec<u8>>,
    ) -> (u16, serde_json::Value) {
        let mut r = self.req(method, path).body(body.into());
        for (n, v) in headers {
            r = r.header(*n, *v);
        }
        let resp = r.send().await.expect("send");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(serde_json::Value::Null))
    }

    /// Sends a request signed by `key` (`Cairn-Ed25519`) at Unix time `date`; `signed_body`
    /// is what the signature's body hash covers (normally `body`).
    #[allow(clippy::too_many_arguments)]
    pub async fn send_signed(
        &self,
        key: &SigningKey,
        date: u64,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        signed_body: &[u8],
    ) -> (u16, serde_json::Value) {
        let find = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_bytes())
                .unwrap_or_default()
        };
        let req = RequestToSign {
            method: method.as_str(),
            path_and_query: path,
            unix_secs: date,
            body_blake3: body_blake3(signed_body),
            content_type: find("content-type"),
            if_match: find("if-match"),
            context: find("x-cairn-context"),
            nonce: find("x-cairn-nonce"),
            capsule: find("x-cairn-capsule"),
        };
        let mut all: Vec<(String, String)> = headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        for (n, v) in req.sign(key) {
            all.push((n.to_string(), v));
        }
        let pairs: Vec<(&str, &str)> = all.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        self.send(method, path, &pairs, body.to_vec()).await
    }

    /// Signs with the current time.
    pub async fn send_now(
        &self,
        key: &SigningKey,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> (u16, serde_json::Value) {
        self.send_signed(key, now_secs(), method, path, headers, body, body)
            .await
    }

    /// Creates bucket `name` owned by `owner` (the request signed by it); returns the
    /// status and the answer.
    pub async fn create_owned(&self, owner: &SigningKey, name: &str) -> (u16, serde_json::Value) {
        let create =
            serde_json::json!({ "name": name, "owner": owner.public().to_string() }).to_string();
        self.send_now(
            owner,
            Method::POST,
            "/v1/buckets",
            &[("content-type", "application/json")],
            create.as_bytes(),
        )
        .await
    }

    /// Creates an open bucket.
    pub async fn open_bucket(&self, name: &str) -> serde_json::Value {
        let (s, v) = self
            .send(
                Method::POST,
                "/v1/buckets",
                &[("content-type", "application/json")],
                serde_json::json!({ "name": name }).to_string(),
            )
            .await;
        assert_eq!(s, 201, "{v}");
        v
    }

    /// Stops the node, then starts a new one on the same data directory and config.
    pub async fn restart(mut self) -> Server {
        let config = self.node.config.clone();
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            t.await.expect("join").expect("serve");
        }
        let dir = std::mem::replace(&mut self._dir, tempfile::tempdir().expect("temp dir"));
        drop(self);
        Server::serve(config, dir).await
    }

    /// Stops the node and waits for it.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            t.await.expect("join").expect("serve");
        }
    }
}

/// The error kind of a JSON error body.
pub fn kind(v: &serde_json::Value) -> &str {
    v["error"]["kind"].as_str().unwrap_or("")
}

/// The peak resident set of this process in KiB (Linux), if known.
pub fn peak_rss_kib() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
}

/// The resident set of this process in KiB (Linux), if known.
pub fn rss_kib() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
}

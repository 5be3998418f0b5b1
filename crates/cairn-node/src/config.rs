//! Node configuration: a TOML file (every field optional), overridden by the `cairn serve`
//! flags and their environment variables (`CAIRN_DATA`, `CAIRN_LISTEN`, ...).
//!
//! ```toml
//! data_dir = "./cairn-data"
//! listen = "127.0.0.1:3000"
//! durability = "group"            # fsync | group | buffered
//! max_upload_bytes = 5368709120   # 5 GiB
//! write_queue = 256               # writers waiting on one path before 503 + Retry-After
//! log_format = "text"             # text | json
//!
//! [gaia]
//! # see crate::gaia::GaiaConfig
//! ```

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use cairn_store::Durability;
use serde::Deserialize;

/// Everything a node needs to start.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Data directory of the embedded store.
    pub data_dir: PathBuf,
    /// Address to listen on (`host:port`; port 0 picks one).
    pub listen: String,
    /// Durability of acknowledged writes.
    #[serde(with = "durability_name")]
    pub durability: Durability,
    /// Largest upload accepted, in bytes.
    pub max_upload_bytes: u64,
    /// Writers that may wait on one path before further ones get 503 with Retry-After.
    pub write_queue: usize,
    /// Log format on stderr: `text` or `json`.
    pub log_format: LogFormat,
    /// Seconds to wait for a store another process has open.
    pub lock_timeout_secs: f64,
    /// Gaia hub settings.
    pub gaia: crate::gaia::GaiaConfig,
}

/// How logs are printed.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => bail!("log format {other:?}: use text or json"),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            data_dir: PathBuf::from("./cairn-data"),
            listen: "127.0.0.1:3000".into(),
            durability: Durability::Group,
            max_upload_bytes: 5 << 30,
            write_queue: 256,
            log_format: LogFormat::Text,
            lock_timeout_secs: 30.0,
            gaia: Default::default(),
        }
    }
}

impl Config {
    /// Reads a TOML config file; unknown keys are an error (a typo must not be ignored).
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config file {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("config file {}", path.display()))
    }

    /// Checks values that parse but cannot work.
    pub fn check(&self) -> Result<()> {
        if self.max_upload_bytes == 0 {
            bail!("max_upload_bytes must be at least 1");
        }
        if self.write_queue == 0 {
            bail!("write_queue must be at least 1");
        }
        if !(0.0..=86_400.0).contains(&self.lock_timeout_secs) {
            bail!("lock_timeout_secs must be between 0 and 86400");
        }
        Ok(())
    }
}

mod durability_name {
    use cairn_store::Durability;
    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Durability, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_values_parse_and_typos_are_refused() {
        let c: Config = toml::from_str(
            "listen = \"0.0.0.0:9\"\ndurability = \"fsync\"\nmax_upload_bytes = 10\n",
        )
        .unwrap();
        assert_eq!(c.listen, "0.0.0.0:9");
        assert_eq!(c.durability, Durability::PerWrite);
        assert_eq!(c.max_upload_bytes, 10);
        assert_eq!(c.write_queue, Config::default().write_queue);
        assert!(toml::from_str::<Config>("lissen = \"x\"").is_err());
        assert!(toml::from_str::<Config>("durability = \"sometimes\"").is_err());
        let bad = Config {
            write_queue: 0,
            ..Config::default()
        };
        assert!(bad.check().is_err());
    }
}

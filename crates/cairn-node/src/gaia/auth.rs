//! Gaia hub authentication, as `hub/src/server/authentication.ts` does it.
//!
//! The `Authorization` header is `bearer v1:<JWT>` (a JWT signed ES256K by the bucket's
//! key) or, in the legacy format, `bearer <base64 of {"publickey", "signature"}>` (a DER
//! ECDSA signature over SHA-256 of the challenge text). A v1 token must:
//!
//! - name in `iss` a secp256k1 public key whose P2PKH address (base58check of version 0
//!   and RIPEMD160(SHA256(key))) is the address in the URL;
//! - carry a signature over `header.payload` by that key (high-S signatures, as the JS
//!   signer makes them, are accepted by normalizing S);
//! - carry one of the hub's challenge texts in `gaiaChallenge`;
//! - not be past its `exp`, nor issued (`iat`) before the bucket's revocation time;
//! - claim an allowed `hubUrl` when the hub requires one;
//! - if it holds an `associationToken`: that token must be signed by its `iss`, unexpired,
//!   and name in `childToAssociate` the key whose address is the URL's; the association
//!   token's issuer is then the address checked against the whitelist.
//!
//! Scopes (`putFile`, `putFilePrefix`, `deleteFile`, `deleteFilePrefix`, `putFileArchival`,
//! `putFileArchivalPrefix`, at most 8) restrict the paths a token may write and delete.

use base64::Engine;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use k256::ecdsa::signature::hazmat::PrehashVerifier;
use k256::ecdsa::{Signature, VerifyingKey};
use ripemd::Ripemd160;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// The auth version `/hub_info` announces.
pub const LATEST_AUTH_VERSION: &str = "v1";

/// Why a request was refused: both are answered 401, with the error's name in the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthError {
    /// The token is malformed, badly signed, expired, for another address or hub, or the
    /// signer is not whitelisted (`ValidationError`).
    Validation(String),
    /// The token was issued before the bucket's revocation time
    /// (`AuthTokenTimestampValidationError`).
    Revoked(String),
}

impl AuthError {
    fn v(msg: impl Into<String>) -> Self {
        AuthError::Validation(msg.into())
    }
}

/// What a token may do beyond its address: empty lists mean no restriction of that kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scopes {
    /// `putFilePrefix` domains.
    pub write_prefixes: Vec<String>,
    /// `putFile` domains.
    pub write_paths: Vec<String>,
    /// `deleteFilePrefix` domains.
    pub delete_prefixes: Vec<String>,
    /// `deleteFile` domains.
    pub delete_paths: Vec<String>,
    /// `putFileArchivalPrefix` domains.
    pub archival_prefixes: Vec<String>,
    /// `putFileArchival` domains.
    pub archival_paths: Vec<String>,
}

/// The scope names the hub knows.
pub const SCOPE_NAMES: [&str; 6] = [
    "putFile",
    "putFilePrefix",
    "deleteFile",
    "deleteFilePrefix",
    "putFileArchival",
    "putFileArchivalPrefix",
];

fn matches(prefixes: &[String], paths: &[String], path: &str) -> bool {
    prefixes.iter().any(|p| path.starts_with(p.as_str())) || paths.iter().any(|p| p == path)
}

impl Scopes {
    /// True when the token carries no scope at all (it may do anything for its address).
    pub fn is_unscoped(&self) -> bool {
        self.write_prefixes.is_empty()
            && self.write_paths.is_empty()
            && self.delete_prefixes.is_empty()
            && self.delete_paths.is_empty()
            && !self.archival_restricted()
    }

    /// True when the token carries archival scopes (it may then only write those paths,
    /// and its listings hide `.history.` files).
    pub fn archival_restricted(&self) -> bool {
        !self.archival_prefixes.is_empty() || !self.archival_paths.is_empty()
    }

    /// The hub's checks before a write of `path` (`address` is for the message).
    pub fn check_write(&self, address: &str, path: &str) -> Result<(), AuthError> {
        self.check_archival(address, path)?;
        if (!self.write_prefixes.is_empty() || !self.write_paths.is_empty())
            && !matches(&self.write_prefixes, &self.write_paths, path)
        {
            return Err(AuthError::v(format!(
                "Address {address} not authorized to write to {path} by scopes"
            )));
        }
        Ok(())
    }

    /// The hub's checks before a delete of `path`.
    pub fn check_delete(&self, address: &str, path: &str) -> Result<(), AuthError> {
        self.check_archival(address, path)?;
        if (!self.delete_prefixes.is_empty() || !self.delete_paths.is_empty())
            && !matches(&self.delete_prefixes, &self.delete_paths, path)
        {
            return Err(AuthError::v(format!(
                "Address {address} not authorized to delete from {path} by scopes"
            )));
        }
        Ok(())
    }

    fn check_archival(&self, address: &str, path: &str) -> Result<(), AuthError> {
        if self.archival_restricted()
            && !matches(&self.archival_prefixes, &self.archival_paths, path)
        {
            return Err(AuthError::v(format!(
                "Address {address} not authorized to modify {path} by scopes"
            )));
        }
        Ok(())
    }
}

/// A token that passed every check but revocation.
#[derive(Debug, Clone)]
pub struct Verified {
    /// The address whose key signed the token (or its association token): what the
    /// whitelist is checked against.
    pub signer: String,
    /// The token's scopes (none for legacy tokens).
    pub scopes: Scopes,
    /// The v1 token's `iat` (`None` when absent or for legacy tokens).
    pub issued_at: Option<f64>,
    /// A legacy (pre-v1) token: revocation does not apply to it, as in the hub.
    pub legacy: bool,
    /// The v1 token's `exp` (`None` when absent or for legacy tokens).
    pub expires_at: Option<f64>,
    /// The `exp` of the v1 token's association token, if it carries one.
    pub association_expires_at: Option<f64>,
}

impl Verified {
    /// The hub's revocation check: with a revocation time set (> 0), a v1 token must have
    /// been issued at or after it.
    pub fn check_revocation(&self, oldest_valid: i64) -> Result<(), AuthError> {
        if self.legacy || oldest_valid <= 0 {
            return Ok(());
        }
        match self.issued_at {
            None => Err(AuthError::Revoked(format!(
                "Gaia bucket requires auth token issued after {oldest_valid} but this token \
                 has no creation timestamp. This token may have been revoked by the user."
            ))),
            Some(iat) if iat < oldest_valid as f64 => Err(AuthError::Revoked(format!(
                "Gaia bucket requires auth token issued after {oldest_valid} but this token \
                 was issued {iat}. This token may have been revoked by the user."
            ))),
            Some(_) => Ok(()),
        }
    }

    /// The expiry checks of [`authenticate`] again at time `now` (seconds since the
    /// epoch), with the same errors: for a request that outlives the moment its token was
    /// checked, such as an upload whose body is still arriving.
    pub fn check_expiry(&self, now: f64) -> Result<(), AuthError> {
        if let Some(exp) = self.expires_at
            && exp < now
        {
            return Err(expired_token(exp));
        }
        if let Some(exp) = self.association_expires_at
            && exp < now
        {
            return Err(expired_association(exp));
        }
        Ok(())
    }
}

fn expired_token(exp: f64) -> AuthError {
    AuthError::v(format!(
        "Expired authentication token: expire time of {exp} (secs since epoch)"
    ))
}

fn expired_association(exp: f64) -> AuthError {
    AuthError::v(format!(
        "Expired association token: expire time of {exp} (secs since epoch)"
    ))
}

/// The hub's settings that tokens are checked against.
#[derive(Debug, Clone)]
pub struct AuthSettings {
    /// The hub's server name (part of the challenge text).
    pub server_name: String,
    /// Whether a token must claim one of `valid_hub_urls` in `hubUrl`.
    pub require_correct_hub_url: bool,
    /// Accepted `hubUrl` claims (`https://<server_name>` is always one).
    pub valid_hub_urls: Vec<String>,
}

/// The challenge text clients sign: `["gaiahub","0",server_name,"blockstack_storage_please_sign"]`.
pub fn challenge_text(server_name: &str) -> String {
    challenge_for(server_name, "0")
}

fn challenge_for(server_name: &str, span: &str) -> String {
    serde_json::to_string(&[
        "gaiahub",
        span,
        server_name,
        "blockstack_storage_please_sign",
    ])
    .unwrap_or_default()
}

/// Every challenge text accepted: the current one and the 2018 and 2019 legacy ones.
pub fn accepted_challenges(server_name: &str) -> Vec<String> {
    vec![
        challenge_text(server_name),
        challenge_for(server_name, "2018"),
        challenge_for(server_name, "2019"),
    ]
}

/// RIPEMD160(SHA256(bytes)).
pub fn hash160(bytes: &[u8]) -> [u8; 20] {
    Ripemd160::digest(Sha256::digest(bytes)).into()
}

/// The P2PKH (version 0) address of a public key as given (compressed or not).
pub fn p2pkh_address(pubkey: &[u8]) -> String {
    let mut payload = Vec::with_capacity(21);
    payload.push(0u8);
    payload.extend_from_slice(&hash160(pubkey));
    bs58::encode(payload).with_check().into_string()
}

/// The hash160 of a version-0 P2PKH address, or `None` if `address` is not one.
pub fn address_hash160(address: &str) -> Option<[u8; 20]> {
    let bytes = bs58::decode(address).with_check(None).into_vec().ok()?;
    match bytes.split_first() {
        Some((0, h)) if h.len() == 20 => h.try_into().ok(),
        _ => None,
    }
}

/// Parses a hex secp256k1 public key (SEC1, compressed or not); returns it and its bytes.
fn parse_pubkey(hex_key: &str) -> Option<(VerifyingKey, Vec<u8>)> {
    let bytes = hex::decode(hex_key).ok()?;
    let key = VerifyingKey::from_sec1_bytes(&bytes).ok()?;
    Some((key, bytes))
}

/// Verifies an ECDSA signature over a SHA-256 digest, accepting high S.
fn verify_digest(key: &VerifyingKey, digest: &[u8], sig: Signature) -> bool {
    let sig = sig.normalize_s().unwrap_or(sig);
    key.verify_prehash(digest, &sig).is_ok()
}

const B64URL: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::URL_SAFE,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);
const B64STD: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// A decoded compact JWT (not yet verified).
struct Jwt<'a> {
    signing_input: &'a str,
    payload: Map<String, Value>,
    signature: Vec<u8>,
}

fn decode_jwt(token: &str) -> Option<Jwt<'_>> {
    let mut parts = token.split('.');
    let (h, p, s) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let header: Value = serde_json::from_slice(&B64URL.decode(h).ok()?).ok()?;
    if !header.is_object() {
        return None;
    }
    let payload = match serde_json::from_slice(&B64URL.decode(p).ok()?).ok()? {
        Value::Object(m) => m,
        _ => return None,
    };
    let signature = B64URL.decode(s).ok()?;
    Some(Jwt {
        signing_input: &token[..h.len() + 1 + p.len()],
        payload,
        signature,
    })
}

impl Jwt<'_> {
    fn verify(&self, key: &VerifyingKey) -> bool {
        let sig = if self.signature.len() == 64 {
            Signature::from_slice(&self.signature)
        } else {
            Signature::from_der(&self.signature)
        };
        match sig {
            Ok(sig) => verify_digest(key, &Sha256::digest(self.signing_input.as_bytes()), sig),
            Err(_) => false,
        }
    }

    /// A claim that JS would take as truthy, as a string.
    fn str_claim(&self, name: &str) -> Result<Option<&str>, AuthError> {
        match self.payload.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s.is_empty() => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(AuthError::v(format!("`{name}` claim must be a string"))),
        }
    }

    /// A numeric claim (seconds since the epoch); 0 counts as absent, as in JS.
    fn time_claim(&self, name: &str) -> Result<Option<f64>, AuthError> {
        match self.payload.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => Ok(n.as_f64().filter(|x| *x != 0.0)),
            Some(_) => Err(AuthError::v(format!("`{name}` claim must be a number"))),
        }
    }
}

fn parse_scopes(payload: &Map<String, Value>) -> Result<Scopes, String> {
    let list = match payload.get("scopes") {
        None | Some(Value::Null) => return Ok(Scopes::default()),
        Some(Value::Array(a)) => a,
        Some(_) => return Err("scopes must be a list".into()),
    };
    if list.len() > 8 {
        return Err("Too many authentication scopes".into());
    }
    let mut s = Scopes::default();
    for entry in list {
        let text = |v: Option<&Value>| match v {
            Some(Value::String(x)) => x.clone(),
            Some(other) => other.to_string(),
            None => "undefined".to_string(),
        };
        let scope = text(entry.get("scope"));
        let domain = text(entry.get("domain"));
        let into = match scope.as_str() {
            "putFile" => &mut s.write_paths,
            "putFilePrefix" => &mut s.write_prefixes,
            "deleteFile" => &mut s.delete_paths,
            "deleteFilePrefix" => &mut s.delete_prefixes,
            "putFileArchival" => &mut s.archival_paths,
            "putFileArchivalPrefix" => &mut s.archival_prefixes,
            _ => return Err(format!("Unrecognized scope {scope}")),
        };
        into.push(domain);
    }
    Ok(s)
}

const PARSE_FAILED: &str = "Failed to parse authentication header.";

/// Checks an `Authorization` header for a request on bucket `address` at time `now`
/// (seconds since the epoch). Revocation is checked separately
/// ([`Verified::check_revocation`]) once the token is known to be the bucket owner's, so
/// an unauthenticated request never makes the hub open a bucket.
pub fn authenticate(
    header: Option<&str>,
    address: &str,
    settings: &AuthSettings,
    now: f64,
) -> Result<Verified, AuthError> {
    let header = header.ok_or_else(|| AuthError::v(PARSE_FAILED))?;
    if !header.to_ascii_lowercase().starts_with("bearer") {
        return Err(AuthError::v(PARSE_FAILED));
    }
    let part = header.get("bearer ".len()..).unwrap_or("");
    let challenges = accepted_challenges(&settings.server_name);
    match part.find(':') {
        // A legacy token names no hub: where tokens must claim this one, it is refused (it
        // would otherwise write on every hub sharing this one's server name, for ever).
        None if settings.require_correct_hub_url => Err(AuthError::v(
            "Authentication must provide a claimed hub: legacy tokens (without a hubUrl) are \
             not accepted where require_correct_hub_url is set. You may need to update \
             stacks.js.",
        )),
        None => legacy(part, address, &challenges),
        Some(i) if &part[..i] == "v1" => v1(&part[i + 1..], address, settings, &challenges, now),
        Some(i) => Err(AuthError::v(format!(
            "{PARSE_FAILED} Unknown authentication header version: {}",
            &part[..i]
        ))),
    }
}

fn legacy(part: &str, address: &str, challenges: &[String]) -> Result<Verified, AuthError> {
    #[derive(serde::Deserialize)]
    struct Legacy {
        publickey: String,
        signature: String,
    }
    let parsed: Legacy = B64STD
        .decode(part.trim())
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| AuthError::v(PARSE_FAILED))?;
    let (key, key_bytes) =
        parse_pubkey(&parsed.publickey).ok_or_else(|| AuthError::v(PARSE_FAILED))?;
    let sig = hex::decode(&parsed.signature)
        .ok()
        .and_then(|b| Signature::from_der(&b).ok())
        .ok_or_else(|| AuthError::v(PARSE_FAILED))?;
    if p2pkh_address(&key_bytes) != address {
        return Err(AuthError::v("Address not allowed to write on this path"));
    }
    for c in challenges {
        if verify_digest(&key, &Sha256::digest(c.as_bytes()), sig) {
            return Ok(Verified {
                signer: address.to_string(),
                scopes: Scopes::default(),
                issued_at: None,
                legacy: true,
                expires_at: None,
                association_expires_at: None,
            });
        }
    }
    Err(AuthError::v(
        "Invalid signature or expired authentication token.",
    ))
}

fn v1(
    token: &str,
    address: &str,
    settings: &AuthSettings,
    challenges: &[String],
    now: f64,
) -> Result<Verified, AuthError> {
    let jwt = decode_jwt(token).ok_or_else(|| AuthError::v(PARSE_FAILED))?;
    let iss = match jwt.str_claim("iss") {
        Ok(Some(i)) => i,
        _ => {
            return Err(AuthError::v(format!(
                "{PARSE_FAILED} Auth token should be a JWT with at least an `iss` claim"
            )));
        }
    };
    let scopes =
        parse_scopes(&jwt.payload).map_err(|e| AuthError::v(format!("{PARSE_FAILED} {e}")))?;
    let issued_at = jwt.time_claim("iat")?;
    // A token issued far ahead of the clock would outlive every revocation its owner could
    // make: `revoke-all` takes whole seconds at most the same skew ahead, and revokes a
    // token issued before the time it names, so an accepted `iat` lies before that bound.
    if let Some(iat) = issued_at
        && iat >= now.floor() + crate::gaia::REVOCATION_SKEW_SECS as f64
    {
        return Err(AuthError::v(format!(
            "Auth token issued in the future: its `iat` ({iat}) is more than {} seconds \
             ahead of the hub's clock ({now:.0} seconds since the epoch)",
            crate::gaia::REVOCATION_SKEW_SECS
        )));
    }
    let (key, key_bytes) = parse_pubkey(iss).ok_or_else(|| {
        AuthError::v(format!(
            "{PARSE_FAILED} `iss` is not a secp256k1 public key"
        ))
    })?;
    if p2pkh_address(&key_bytes) != address {
        return Err(AuthError::v("Address not allowed to write on this path"));
    }
    if settings.require_correct_hub_url {
        let claimed = jwt.str_claim("hubUrl")?.ok_or_else(|| {
            AuthError::v(
                "Authentication must provide a claimed hub. You may need to update stacks.js.",
            )
        })?;
        let claimed = claimed.strip_suffix('/').unwrap_or(claimed);
        let mut valid = settings.valid_hub_urls.clone();
        let own = format!("https://{}", settings.server_name);
        if !valid.contains(&own) {
            valid.push(own);
        }
        // Configured URLs are compared without a trailing `/`, as the claim is.
        if !valid
            .iter()
            .any(|u| u.strip_suffix('/').unwrap_or(u) == claimed)
        {
            return Err(AuthError::v(format!(
                "Auth token's claimed hub url '{claimed}' not found in this hubs set: {}",
                serde_json::to_string(&valid).unwrap_or_default()
            )));
        }
    }
    if !jwt.verify(&key) {
        return Err(AuthError::v("Failed to verify supplied authentication JWT"));
    }
    let challenge = jwt.payload.get("gaiaChallenge");
    if !challenge
        .and_then(Value::as_str)
        .is_some_and(|c| challenges.iter().any(|x| x == c))
    {
        return Err(AuthError::v(format!(
            "Invalid gaiaChallenge text in supplied JWT: {} not found in {}",
            challenge
                .map(|c| c.to_string())
                .unwrap_or_else(|| "undefined".into()),
            serde_json::to_string(challenges).unwrap_or_default()
        )));
    }
    let expires_at = jwt.time_claim("exp")?;
    if let Some(exp) = expires_at
        && exp < now
    {
        return Err(expired_token(exp));
    }
    let (signer, association_expires_at) = match jwt.str_claim("associationToken")? {
        Some(assoc) => {
            let (signer, exp) = check_association(assoc, address, now)?;
            (signer, Some(exp))
        }
        None => (address.to_string(), None),
    };
    Ok(Verified {
        signer,
        scopes,
        issued_at,
        legacy: false,
        expires_at,
        association_expires_at,
    })
}

/// Checks an association token authorizing the bearer `address`; returns the address of
/// its issuer (the identity that vouches for the app key) and its `exp`.
fn check_association(token: &str, address: &str, now: f64) -> Result<(String, f64), AuthError> {
    let jwt = decode_jwt(token).ok_or_else(|| {
        AuthError::v("checkAssociationToken: Failed to decode association token in JWT")
    })?;
    let iss = jwt
        .str_claim("iss")?
        .ok_or_else(|| AuthError::v("Must provide `iss` claim in association JWT."))?;
    let child = jwt
        .str_claim("childToAssociate")?
        .ok_or_else(|| AuthError::v("Must provide `childToAssociate` claim in association JWT."))?;
    let exp = jwt
        .time_claim("exp")?
        .ok_or_else(|| AuthError::v("Must provide `exp` claim in association JWT."))?;
    let (key, key_bytes) = parse_pubkey(iss)
        .ok_or_else(|| AuthError::v("Failed to verify association JWT: invalid issuer"))?;
    if !jwt.verify(&key) {
        return Err(AuthError::v(
            "Failed to verify association JWT: invalid issuer",
        ));
    }
    if exp < now {
        return Err(expired_association(exp));
    }
    let child_address = parse_pubkey(child)
        .map(|(_, b)| p2pkh_address(&b))
        .ok_or_else(|| {
            AuthError::v(format!(
                "Association token child key {child} is not a public key"
            ))
        })?;
    if child_address != address {
        return Err(AuthError::v(format!(
            "Association token child key {child} does not match {address}"
        )));
    }
    Ok((p2pkh_address(&key_bytes), exp))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_of_a_known_key() {
        // The compressed public key of secret 1 (the generator) and its well-known address.
        let g = hex::decode("0279be667ef9dcbbac55a06295ce870b07029bfcdb2dce28d959f2815b16f81798")
            .unwrap();
        assert_eq!(p2pkh_address(&g), "1BgGZ9tcN4rm9KBzDn7KprQz87SZ26SAMH");
        assert_eq!(
            address_hash160("1BgGZ9tcN4rm9KBzDn7KprQz87SZ26SAMH"),
            Some(hash160(&g))
        );
        assert_eq!(address_hash160("1BgGZ9tcN4rm9KBzDn7KprQz87SZ26SAMh"), None);
    }

    /// Times in error messages are the token's own numbers, as the hub (JavaScript) prints
    /// them: JSON numbers must parse to the nearest double (serde_json's
    /// `float_roundtrip`), or a message can differ from Gaia's in the last digit.
    #[test]
    fn token_times_print_as_they_were_written() {
        for text in [
            "1795568802.7234945",
            "1795568802.7234943",
            "1700000000.1",
            "0.3",
        ] {
            let v: serde_json::Value = serde_json::from_str(text).unwrap();
            let exp = v.as_f64().unwrap();
            assert_eq!(exp.to_string(), text);
            assert!(matches!(expired_token(exp), AuthError::Validation(m) if m.contains(text)));
        }
    }

    #[test]
    fn challenge_text_is_the_hubs() {
        assert_eq!(
            challenge_text("gaia-0"),
            r#"["gaiahub","0","gaia-0","blockstack_storage_please_sign"]"#
        );
    }
}

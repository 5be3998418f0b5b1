//! Typed values on the wire, in two forms.
//!
//! **Text** (the default; the CLI's forms, so `cairn get` and the API agree): string and
//! blob are raw bytes; integer is decimal (printed with a trailing newline); tuple, list and
//! set are one element per line; map is one `key=value` per line (split at the first `=`).
//! Text cannot carry an element that contains a newline: use JSON for those.
//!
//! **JSON** (`Content-Type` / `Accept: application/json`), lossless: a byte string is a JSON
//! string when it is UTF-8, else `{"hex": "<hex digits>"}`; integer is a number; tuple, list
//! and set are arrays of byte strings; a map is an object `{key: value}`, or, when a key is
//! not UTF-8, an array of `[key, value]` pairs (both forms are accepted on input). Without
//! `?type=` a JSON body's type is inferred: string → string, number → integer, array →
//! list, object → map. Blobs are always raw bytes.
//!
//! Lists, sets and maps are written out element by element as their POS-tree is walked,
//! so a large value streams in constant memory in either form.

use std::collections::BTreeMap;
use std::io::Write;

use cairn_core::{Error, Result};
use cairn_object::postree;
use cairn_object::{Db, NewValue, Value, ValueType};
use serde_json::Value as Json;

/// A byte string as JSON: a string when UTF-8, else `{"hex": ...}`.
pub fn bytes_json(b: &[u8]) -> Json {
    match std::str::from_utf8(b) {
        Ok(s) => Json::String(s.to_string()),
        Err(_) => serde_json::json!({ "hex": hex::encode(b) }),
    }
}

/// Reads a byte string written by [`bytes_json`].
pub fn json_bytes(v: &Json, what: &str) -> Result<Vec<u8>> {
    match v {
        Json::String(s) => Ok(s.as_bytes().to_vec()),
        Json::Object(o) if o.len() == 1 => match o.get("hex") {
            Some(Json::String(h)) => {
                hex::decode(h).map_err(|e| Error::invalid(format!("{what}: bad hex: {e}")))
            }
            _ => Err(Error::invalid(format!(
                "{what}: expected a string or {{\"hex\": \"...\"}}"
            ))),
        },
        _ => Err(Error::invalid(format!(
            "{what}: expected a string or {{\"hex\": \"...\"}}"
        ))),
    }
}

fn json_array(v: &Json, ty: ValueType) -> Result<Vec<Vec<u8>>> {
    let items = v
        .as_array()
        .ok_or_else(|| Error::invalid(format!("a {ty} is a JSON array of strings")))?;
    items
        .iter()
        .enumerate()
        .map(|(i, x)| json_bytes(x, &format!("{ty} element {i}")))
        .collect()
}

fn json_map(v: &Json) -> Result<BTreeMap<Vec<u8>, Vec<u8>>> {
    let mut m = BTreeMap::new();
    let mut insert = |k: Vec<u8>, v: Vec<u8>| {
        if m.contains_key(&k) {
            return Err(Error::invalid(format!(
                "map key {:?} appears twice",
                String::from_utf8_lossy(&k)
            )));
        }
        m.insert(k, v);
        Ok(())
    };
    match v {
        Json::Object(o) => {
            for (k, x) in o {
                insert(
                    k.as_bytes().to_vec(),
                    json_bytes(x, &format!("map value {k:?}"))?,
                )?;
            }
        }
        Json::Array(pairs) => {
            for (i, p) in pairs.iter().enumerate() {
                match p.as_array().map(Vec::as_slice) {
                    Some([k, x]) => insert(
                        json_bytes(k, &format!("map pair {i} key"))?,
                        json_bytes(x, &format!("map pair {i} value"))?,
                    )?,
                    _ => {
                        return Err(Error::invalid(format!(
                            "map pair {i}: expected [key, value]"
                        )));
                    }
                }
            }
        }
        _ => {
            return Err(Error::invalid(
                "a map is a JSON object or an array of [key, value] pairs",
            ));
        }
    }
    Ok(m)
}

/// Refuses JSON with an object that names a key twice (which value is meant depends on
/// the parser: serde_json keeps the last, others the first), or that does not parse.
pub fn check_unique_keys(body: &[u8]) -> Result<()> {
    serde_json::from_slice::<UniqueKeys>(body)
        .map(|_| ())
        .map_err(|e| Error::invalid(format!("the body is not JSON with unique keys: {e}")))
}

/// A JSON value walked for [`check_unique_keys`], holding nothing.
struct UniqueKeys;

impl<'de> serde::Deserialize<'de> for UniqueKeys {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_any(UniqueKeysVisitor)
    }
}

struct UniqueKeysVisitor;

impl<'de> serde::de::Visitor<'de> for UniqueKeysVisitor {
    type Value = UniqueKeys;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> std::result::Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_i64<E>(self, _: i64) -> std::result::Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_u64<E>(self, _: u64) -> std::result::Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_f64<E>(self, _: f64) -> std::result::Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_str<E>(self, _: &str) -> std::result::Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_unit<E>(self) -> std::result::Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> std::result::Result<UniqueKeys, A::Error> {
        while seq.next_element::<UniqueKeys>()?.is_some() {}
        Ok(UniqueKeys)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(
        self,
        mut map: A,
    ) -> std::result::Result<UniqueKeys, A::Error> {
        let mut seen = std::collections::HashSet::new();
        while let Some(k) = map.next_key::<String>()? {
            if !seen.insert(k) {
                return Err(serde::de::Error::custom(
                    "an object names one key twice".to_string(),
                ));
            }
            map.next_value::<UniqueKeys>()?;
        }
        Ok(UniqueKeys)
    }
}

/// Parses a JSON body as a value of type `ty` (inferred when `None`, see the module doc).
/// An object naming a key twice is refused.
pub fn parse_json(ty: Option<ValueType>, body: &[u8]) -> Result<NewValue> {
    check_unique_keys(body)?;
    let v: Json = serde_json::from_slice(body)
        .map_err(|e| Error::invalid(format!("the body is not JSON: {e}")))?;
    let ty = match ty {
        Some(t) => t,
        None => match &v {
            Json::String(_) => ValueType::String,
            Json::Number(_) => ValueType::Integer,
            Json::Array(_) => ValueType::List,
            Json::Object(_) => ValueType::Map,
            _ => {
                return Err(Error::invalid(
                    "a JSON value must be a string, number, array or object (or give ?type=)",
                ));
            }
        },
    };
    Ok(match ty {
        ValueType::String => NewValue::String(json_bytes(&v, "a string")?),
        ValueType::Integer => NewValue::Integer(
            v.as_i64()
                .ok_or_else(|| Error::invalid("an integer must be a JSON integer in 64 bits"))?,
        ),
        ValueType::Tuple => NewValue::Tuple(json_array(&v, ty)?),
        ValueType::List => NewValue::List(json_array(&v, ty)?),
        ValueType::Set => NewValue::Set(json_array(&v, ty)?.into_iter().collect()),
        ValueType::Map => NewValue::Map(json_map(&v)?),
        ValueType::Blob => {
            return Err(Error::invalid(
                "a blob is sent as raw bytes, not as application/json",
            ));
        }
    })
}

/// Parses a text body as a value of type `ty` (the CLI's forms, see
/// [`NewValue::parse_text`]).
pub fn parse_text(ty: ValueType, input: Vec<u8>) -> Result<NewValue> {
    NewValue::parse_text(ty, input)
}

fn io(e: std::io::Error) -> Error {
    // A blob reader reports store errors inside an io::Error: keep the original kind.
    match e.into_inner().map(|i| i.downcast::<Error>()) {
        Some(Ok(inner)) => *inner,
        Some(Err(other)) => Error::io("streaming the response", std::io::Error::other(other)),
        None => Error::io(
            "streaming the response",
            std::io::Error::other("write failed"),
        ),
    }
}

/// Writes `len` bytes of a blob from `offset`.
pub fn write_blob_range(
    db: &Db,
    v: &Value,
    offset: u64,
    len: u64,
    w: &mut dyn Write,
) -> Result<()> {
    postree::copy_blob(
        db.chunks(),
        blob_tree(v)?,
        offset,
        len,
        postree::copy_blob_workers(),
        w,
    )?;
    Ok(())
}

/// [`write_blob_range`] into a response: the verified leaves go out without being copied.
pub fn send_blob_range(
    db: &Db,
    v: &Value,
    offset: u64,
    len: u64,
    w: &mut super::body::ChannelWriter,
) -> Result<()> {
    send_tree_range(db, blob_tree(v)?, offset, len, w)
}

/// Sends `len` bytes of Blob tree `t` from `offset` into a response, each leaf verified and
/// handed on without being copied (the native API's reads and the Gaia read endpoint).
pub fn send_tree_range(
    db: &Db,
    t: &postree::TreeRef,
    offset: u64,
    len: u64,
    w: &mut super::body::ChannelWriter,
) -> Result<()> {
    let workers = postree::copy_blob_workers();
    postree::copy_blob_into(db.chunks(), t, offset, len, workers, &mut |leaf| {
        w.write_shared(leaf)
    })?;
    Ok(())
}

/// The tree of a Blob value.
fn blob_tree(v: &Value) -> Result<&postree::TreeRef> {
    v.tree()
        .filter(|t| t.kind == postree::TreeKind::Blob)
        .ok_or_else(|| Error::TypeMismatch(format!("a {} is not a blob", v.value_type())))
}

/// The length of an inline value's text form (exactly what [`write_text`] writes),
/// computed without rendering it; `None` for a tree.
pub fn text_len(v: &Value) -> Option<u64> {
    match v {
        Value::String(b) => Some(b.len() as u64),
        Value::Integer(i) => Some(i.to_string().len() as u64 + 1),
        Value::Tuple(items) => Some(items.iter().map(|i| i.len() as u64 + 1).sum()),
        Value::Tree(_) => None,
    }
}

/// Writes a value in its text form.
pub fn write_text(db: &Db, v: &Value, w: &mut dyn Write) -> Result<()> {
    match v {
        Value::String(b) => w.write_all(b).map_err(io)?,
        Value::Integer(i) => writeln!(w, "{i}").map_err(io)?,
        Value::Tuple(items) => {
            for it in items {
                w.write_all(it).map_err(io)?;
                w.write_all(b"\n").map_err(io)?;
            }
        }
        Value::Tree(t) => match v.value_type() {
            ValueType::Blob => write_blob_range(db, v, 0, t.count, w)?,
            ty => {
                for el in postree::iter(db.chunks(), t) {
                    let el = el?;
                    w.write_all(&el.key).map_err(io)?;
                    if ty == ValueType::Map {
                        w.write_all(b"=").map_err(io)?;
                        w.write_all(el.value.as_deref().unwrap_or_default())
                            .map_err(io)?;
                    }
                    w.write_all(b"\n").map_err(io)?;
                }
            }
        },
    }
    Ok(())
}

fn write_json_bytes(b: &[u8], w: &mut dyn Write) -> Result<()> {
    serde_json::to_writer(&mut *w, &bytes_json(b))
        .map_err(|e| Error::io("streaming the response", std::io::Error::other(e)))
}

/// Writes a value (not a blob) in its JSON form.
pub fn write_json(db: &Db, v: &Value, w: &mut dyn Write) -> Result<()> {
    match v {
        Value::String(b) => write_json_bytes(b, w)?,
        Value::Integer(i) => write!(w, "{i}").map_err(io)?,
        Value::Tuple(items) => {
            w.write_all(b"[").map_err(io)?;
            for (i, it) in items.iter().enumerate() {
                if i > 0 {
                    w.write_all(b",").map_err(io)?;
                }
                write_json_bytes(it, w)?;
            }
            w.write_all(b"]").map_err(io)?;
        }
        Value::Tree(t) => {
            let ty = v.value_type();
            if ty == ValueType::Blob {
                return Err(Error::invalid("a blob has no JSON form: read it as bytes"));
            }
            // A map is an object when every key is UTF-8 (one pass over the keys to know).
            let pairs = ty == ValueType::Map && {
                let mut all_utf8 = true;
                for el in postree::iter(db.chunks(), t) {
                    if std::str::from_utf8(&el?.key).is_err() {
                        all_utf8 = false;
                        break;
                    }
                }
                !all_utf8
            };
            let object = ty == ValueType::Map && !pairs;
            w.write_all(if object { b"{" } else { b"[" }).map_err(io)?;
            for (i, el) in postree::iter(db.chunks(), t).enumerate() {
                let el = el?;
                if i > 0 {
                    w.write_all(b",").map_err(io)?;
                }
                let value = el.value.as_deref().unwrap_or_default();
                if object {
                    write_json_bytes(&el.key, w)?;
                    w.write_all(b":").map_err(io)?;
                    write_json_bytes(value, w)?;
                } else if pairs {
                    w.write_all(b"[").map_err(io)?;
                    write_json_bytes(&el.key, w)?;
                    w.write_all(b",").map_err(io)?;
                    write_json_bytes(value, w)?;
                    w.write_all(b"]").map_err(io)?;
                } else {
                    write_json_bytes(&el.key, w)?;
                }
            }
            w.write_all(if object { b"}" } else { b"]" }).map_err(io)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn json_forms_parse_and_refuse() {
        assert_eq!(
            parse_json(None, br#""hi""#).unwrap(),
            NewValue::String(b"hi".to_vec())
        );
        assert_eq!(
            parse_json(Some(ValueType::String), br#"{"hex":"00ff"}"#).unwrap(),
            NewValue::String(vec![0, 255])
        );
        assert_eq!(parse_json(None, b"-5").unwrap(), NewValue::Integer(-5));
        assert!(parse_json(None, b"1.5").is_err());
        assert!(parse_json(None, b"true").is_err());
        assert_eq!(
            parse_json(Some(ValueType::Set), br#"["b","a","b"]"#).unwrap(),
            NewValue::Set([b"a".to_vec(), b"b".to_vec()].into_iter().collect())
        );
        let m = parse_json(None, br#"{"k":"v","z":{"hex":"01"}}"#).unwrap();
        let NewValue::Map(m) = m else { panic!() };
        assert_eq!(m.get(&b"z"[..]), Some(&vec![1u8]));
        let pairs = parse_json(Some(ValueType::Map), br#"[[{"hex":"ff"},"v"]]"#).unwrap();
        let NewValue::Map(pairs) = pairs else {
            panic!()
        };
        assert_eq!(pairs.get(&[255u8][..]), Some(&b"v".to_vec()));
        assert!(parse_json(Some(ValueType::Map), br#"[["a","1"],["a","2"]]"#).is_err());
        assert!(parse_json(Some(ValueType::Blob), br#""x""#).is_err());
        assert!(parse_json(Some(ValueType::List), br#"[1]"#).is_err());
        assert!(parse_json(None, b"{").is_err());
        // A key twice, at the top or nested, is refused; the same key in two objects not.
        for twice in [
            &br#"{"a":"1","a":"2"}"#[..],
            br#"{"a":"1","b":{"c":1,"c":1}}"#,
            br#"[{"x":1},{"y":[{"k":"1","k":"2"}]}]"#,
        ] {
            let e = parse_json(None, twice).unwrap_err();
            assert!(e.to_string().contains("one key twice"), "{e}");
        }
        assert!(check_unique_keys(br#"[{"a":1},{"a":2,"b":null,"c":true,"d":-1.5}]"#).is_ok());
    }

    #[test]
    fn text_len_is_the_length_write_text_writes() {
        let db = Db::new(std::sync::Arc::new(cairn_store::MemoryStore::new()));
        for v in [
            Value::String(Bytes::from_static(b"hello")),
            Value::String(Bytes::new()),
            Value::Integer(0),
            Value::Integer(-1234567),
            Value::Integer(i64::MIN),
            Value::Tuple(vec![
                Bytes::from_static(b"a"),
                Bytes::new(),
                Bytes::from_static(b"xyz"),
            ]),
            Value::Tuple(Vec::new()),
        ] {
            let mut out = Vec::new();
            write_text(&db, &v, &mut out).unwrap();
            assert_eq!(text_len(&v), Some(out.len() as u64), "{v:?}");
        }
    }

    #[test]
    fn text_forms_match_the_cli() {
        assert_eq!(
            parse_text(ValueType::Map, b"a=1\nb=x=y\n".to_vec()).unwrap(),
            NewValue::Map(
                [
                    (b"a".to_vec(), b"1".to_vec()),
                    (b"b".to_vec(), b"x=y".to_vec())
                ]
                .into_iter()
                .collect()
            )
        );
        assert!(parse_text(ValueType::Map, b"novalue".to_vec()).is_err());
        assert!(parse_text(ValueType::Integer, b"12x".to_vec()).is_err());
        assert_eq!(
            parse_text(ValueType::Integer, b" 42\n".to_vec()).unwrap(),
            NewValue::Integer(42)
        );
        assert_eq!(
            parse_text(ValueType::List, b"a\n\nb\n".to_vec()).unwrap(),
            NewValue::List(vec![b"a".to_vec(), vec![], b"b".to_vec()])
        );
    }
}

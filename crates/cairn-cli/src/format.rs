//! Text forms of typed values for the command line: how `cairn put` reads a value of each
//! type and how `cairn get` prints it (the two are inverses).
//!
//! - string, blob: raw bytes;
//! - integer: decimal;
//! - tuple, list, set: one element per line;
//! - map: one `key=value` per line (split at the first `=`).

use std::collections::{BTreeMap, BTreeSet};

use cairn_core::{Error, Result};
use cairn_object::{NewValue, ValueType};

/// Splits text into lines, dropping one trailing newline.
pub fn lines(input: &[u8]) -> Vec<Vec<u8>> {
    let input = input.strip_suffix(b"\n").unwrap_or(input);
    if input.is_empty() {
        return Vec::new();
    }
    input.split(|b| *b == b'\n').map(|l| l.to_vec()).collect()
}

/// Parses command-line input as a value of type `ty`.
pub fn parse_value(ty: ValueType, input: Vec<u8>) -> Result<NewValue> {
    Ok(match ty {
        ValueType::String => NewValue::String(input),
        ValueType::Blob => NewValue::Blob(input),
        ValueType::Integer => {
            let s = std::str::from_utf8(&input)
                .map_err(|_| Error::invalid("an integer must be decimal text"))?;
            NewValue::Integer(s.trim().parse().map_err(|e| {
                Error::invalid(format!("{:?} is not a 64-bit integer: {e}", s.trim()))
            })?)
        }
        ValueType::Tuple => NewValue::Tuple(lines(&input)),
        ValueType::List => NewValue::List(lines(&input)),
        ValueType::Set => NewValue::Set(lines(&input).into_iter().collect::<BTreeSet<_>>()),
        ValueType::Map => {
            let mut m = BTreeMap::new();
            for (i, l) in lines(&input).into_iter().enumerate() {
                let eq = l.iter().position(|b| *b == b'=').ok_or_else(|| {
                    Error::invalid(format!(
                        "map line {} has no '=' (expected key=value)",
                        i + 1
                    ))
                })?;
                if m.insert(l[..eq].to_vec(), l[eq + 1..].to_vec()).is_some() {
                    return Err(Error::invalid(format!(
                        "map line {} repeats key {:?}",
                        i + 1,
                        String::from_utf8_lossy(&l[..eq])
                    )));
                }
            }
            NewValue::Map(m)
        }
    })
}

/// A short printable form of possibly-binary bytes.
pub fn show(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(&b[..b.len().min(80)]).into_owned();
    if b.len() > 80 { format!("{s}…") } else { s }
}

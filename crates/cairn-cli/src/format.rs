//! Text forms of typed values for the command line: how `cairn put` reads a value of each
//! type and how `cairn get` prints it (the two are inverses).
//!
//! - string, blob: raw bytes;
//! - integer: decimal;
//! - tuple, list, set: one element per line;
//! - map: one `key=value` per line (split at the first `=`).

use cairn_core::Result;
use cairn_object::{NewValue, ValueType};

pub use cairn_object::text_lines as lines;

/// Parses command-line input as a value of type `ty` ([`NewValue::parse_text`]).
pub fn parse_value(ty: ValueType, input: Vec<u8>) -> Result<NewValue> {
    NewValue::parse_text(ty, input)
}

/// A short printable form of possibly-binary bytes.
pub fn show(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(&b[..b.len().min(80)]).into_owned();
    if b.len() > 80 { format!("{s}…") } else { s }
}

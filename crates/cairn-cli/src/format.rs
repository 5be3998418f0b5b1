//! Text forms of typed values for the command line: how `cairn put` reads a value of each
//! type and how `cairn get` prints it (the two are inverses).
//!
//! - string, blob: raw bytes;
//! - integer: decimal;
//! - tuple, list, set: one element per line;
//! - map: one `key=value` per line (split at the first `=`).

use std::io::{self, Write};

use cairn_core::Result;
use cairn_object::postree::Element;
use cairn_object::{NewValue, Value, ValueType};

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

/// Prints an inline value (string, integer, tuple) as `cairn get` does; `false` for a
/// chunkable value, whose content lives in its POS-tree.
pub fn write_inline(v: &Value, sink: &mut dyn Write) -> io::Result<bool> {
    match v {
        Value::String(b) => sink.write_all(b)?,
        Value::Integer(i) => writeln!(sink, "{i}")?,
        Value::Tuple(items) => {
            for it in items {
                sink.write_all(it)?;
                sink.write_all(b"\n")?;
            }
        }
        Value::Tree(_) => return Ok(false),
    }
    Ok(true)
}

/// Prints one List, Set or Map element as `cairn get` does: the element (or key), for a
/// Map `=` and the value, then a newline.
pub fn write_element(ty: ValueType, el: &Element, sink: &mut dyn Write) -> io::Result<()> {
    sink.write_all(&el.key)?;
    if ty == ValueType::Map {
        sink.write_all(b"=")?;
        sink.write_all(el.value.as_deref().unwrap_or_default())?;
    }
    sink.write_all(b"\n")
}

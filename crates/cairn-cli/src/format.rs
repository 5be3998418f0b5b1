//! Text forms of typed values for the command line: how `cairn put` reads a value of each
//! type and how `cairn get` prints it (the two are inverses).
//!
//! - string, blob: raw bytes;
//! - integer: decimal;
//! - tuple, list, set: one element per line (empty text is no element, a lone newline one
//!   empty element);
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

/// A short printable form of possibly-binary bytes: at most 80 of them, control
/// characters escaped (so a value cannot add lines to, or steer the terminal showing,
/// the output around it).
pub fn show(b: &[u8]) -> String {
    let mut s = escape_controls(&String::from_utf8_lossy(&b[..b.len().min(80)]));
    if b.len() > 80 {
        s.push('…');
    }
    s
}

/// `s` with every control character (newlines and terminal escapes included), and every
/// character that reorders or breaks a line (bidirectional overrides, U+2028), written as
/// its Rust escape, such as `\n` or `\u{1b}`: for text from a node or a store that is
/// printed among checked output.
pub fn escape_controls(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        // Bidirectional overrides and isolates, and the Unicode line and paragraph
        // separators, reorder or break a terminal's line as control characters do.
        let steers = matches!(
            c,
            '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{2028}'..='\u{202E}' | '\u{2066}'..='\u{2069}'
        );
        if c.is_control() || steers {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// `s` as one shell word: as it is when it holds only characters no shell treats
/// specially, else in single quotes (a `'` written `'\''`), control characters escaped
/// (for commands a note suggests).
pub fn shell_word(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-./:@%+=,".contains(&b));
    if plain {
        return s.to_string();
    }
    format!("'{}'", escape_controls(s).replace('\'', "'\\''"))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn show_escapes_control_characters_and_cuts_at_80_bytes() {
        assert_eq!(show(b"plain text"), "plain text");
        assert_eq!(
            show(b"a\nmaster\t1e20\x1b[2Jb"),
            "a\\nmaster\\t1e20\\u{1b}[2Jb"
        );
        assert_eq!(show("été".as_bytes()), "été");
        let long = vec![b'x'; 81];
        assert_eq!(show(&long), format!("{}…", "x".repeat(80)));
        // Characters that reorder or break a terminal's line.
        assert_eq!(
            escape_controls("a\u{202E}b\u{2028}c\u{2067}d"),
            "a\\u{202e}b\\u{2028}c\\u{2067}d"
        );
    }

    /// A key in a suggested command is one shell word, whatever it holds.
    #[test]
    fn shell_words_quote_what_a_shell_would_split_or_expand() {
        assert_eq!(shell_word("docs/report.pdf"), "docs/report.pdf");
        assert_eq!(shell_word("my file"), "'my file'");
        assert_eq!(shell_word("it's $HOME"), "'it'\\''s $HOME'");
        assert_eq!(shell_word(""), "''");
        assert_eq!(shell_word("a\nb"), "'a\\nb'");
    }
}

//! Fitting text into a terminal's columns: long names lose their middle (both ends say the
//! most: a module's start, a function's name), long sentences wrap at word boundaries.

/// `text` as HTML text or an attribute's value.
pub(crate) fn escape_html(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// The width gpuprof's tables keep to.
pub(crate) const COLUMNS: usize = 120;

/// `text` in at most `width` characters: the middle replaced by "…" when it is longer.
pub(crate) fn fit(text: &str, width: usize) -> String {
    let count = text.chars().count();
    if count <= width {
        return text.to_string();
    }
    if width <= 1 {
        return "…".chars().take(width).collect();
    }
    let tail = (width - 1) / 2;
    let head = width - 1 - tail;
    let start: String = text.chars().take(head).collect();
    let end: String = text.chars().skip(count - tail).collect();
    format!("{start}…{end}")
}

/// `text` in lines of at most `width` characters (a word longer than that stands alone), each
/// after `indent`.
pub(crate) fn wrap(text: &str, width: usize, indent: &str) -> Vec<String> {
    let room = width.saturating_sub(indent.chars().count()).max(1);
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > room {
            lines.push(format!("{indent}{line}"));
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(format!("{indent}{line}"));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_names_lose_their_middle() {
        assert_eq!(fit("c10::reportMemoryUsageToProfiler", 20), "c10::repor…oProfiler");
        assert_eq!(fit("c10::reportMemoryUsageToProfiler", 20).chars().count(), 20);
        assert_eq!(fit("cuMemAlloc_v2", 20), "cuMemAlloc_v2");
        assert_eq!(fit("abcdef", 1), "…");
    }

    #[test]
    fn sentences_wrap_at_words() {
        let lines = wrap("pid 12 exited holding 4.0 MiB allocated at train.py:42", 24, "    ");
        assert_eq!(lines, ["    pid 12 exited", "    holding 4.0 MiB", "    allocated at", "    train.py:42"]);
        assert!(lines.iter().all(|l| l.chars().count() <= 24));
        assert_eq!(wrap("a_very_long_word_alone", 10, "  "), ["  a_very_long_word_alone"]);
    }
}

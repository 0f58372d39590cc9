//! File names and types as the people and agents on either side see them: a name safe in a
//! folder, a URL, a header and a prompt, and the type a file is served as.

/// The most characters of a file name kept.
pub const MAX_NAME_CHARS: usize = 80;

/// A file name safe in a folder, a URL path, a header and a prompt: its last path component,
/// letters, digits, `.`, `-` and `_` (anything else becomes `_`), no leading dot, at most 80
/// characters; `fallback` when nothing of it is left.
pub fn safe_file_name(name: &str, fallback: &str) -> String {
    let last = name.rsplit(['/', '\\']).next().unwrap_or("");
    let cleaned: String = last
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let cut: String = cleaned
        .trim_start_matches('.')
        .chars()
        .take(MAX_NAME_CHARS)
        .collect();
    if cut.chars().all(|c| c == '_' || c == '.') {
        fallback.into()
    } else {
        cut
    }
}

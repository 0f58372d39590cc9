//! The offline summary (no `[llm]` configured): honest extraction, not invention. The sentences
//! of the previous summary and of the new messages are ranked by TF-IDF centrality (how close
//! each is, by cosine, to all the others: the sentences the conversation keeps coming back to),
//! the top ones are kept in their original order under the size cap, and a header line says
//! the summary is extractive and made without a model.
use std::collections::{HashMap, HashSet};

/// The first words of the header line; a previous extractive summary's header is dropped
/// before its sentences are ranked again.
pub const HEADER_PREFIX: &str = "Extractive summary (no model configured):";

/// An extractive summary and what it chose.
#[derive(Debug, Clone, PartialEq)]
pub struct Extract {
    /// The header line, then one chosen sentence a line.
    pub text: String,
    pub sentences_chosen: usize,
    pub sentences_seen: usize,
}

/// Merge `previous` (the summary so far, maybe empty) and `messages` (the new ones, oldest
/// first) into at most `max_chars` characters. `messages_covered` is how many messages the
/// result covers in all (for the header).
pub fn summarise(
    previous: &str,
    messages: &[&str],
    messages_covered: u64,
    max_chars: usize,
) -> Extract {
    let mut sentences: Vec<String> = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();
    let previous_lines = previous
        .lines()
        .filter(|l| !l.trim_start().starts_with(HEADER_PREFIX));
    for text in previous_lines.chain(messages.iter().flat_map(|m| m.lines())) {
        for s in split_sentences(text) {
            // The same sentence twice ("thanks!") is one candidate.
            if seen.insert(normalise(&s)) {
                sentences.push(s);
            }
        }
    }
    let scores = centrality(&sentences);
    let mut ranked: Vec<usize> = (0..sentences.len()).collect();
    // Most central first; among equals the later (more recent) one.
    ranked.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(b.cmp(&a)));

    // The header's length with the widest numbers it can carry, so the cap always holds.
    let header_budget = header(sentences.len(), messages_covered).chars().count();
    let mut budget = max_chars.saturating_sub(header_budget);
    let mut chosen: Vec<usize> = Vec::new();
    for i in ranked {
        let cost = sentences[i].chars().count() + 1; // and its newline
        if cost <= budget {
            budget -= cost;
            chosen.push(i);
        }
    }
    chosen.sort_unstable();
    let mut text = header(chosen.len(), messages_covered);
    for i in &chosen {
        text.push('\n');
        text.push_str(&sentences[*i]);
    }
    if text.chars().count() > max_chars {
        // Only when even the header does not fit the cap.
        text = text.chars().take(max_chars).collect();
    }
    Extract {
        text,
        sentences_chosen: chosen.len(),
        sentences_seen: sentences.len(),
    }
}

fn header(chosen: usize, messages: u64) -> String {
    let plural = |n: u64, one: &str, many: &str| {
        if n == 1 {
            format!("{n} {one}")
        } else {
            format!("{n} {many}")
        }
    };
    format!(
        "{HEADER_PREFIX} {} chosen from {}.",
        plural(chosen as u64, "sentence", "sentences"),
        plural(messages, "message", "messages")
    )
}

/// Sentences of `text`: cut after `.`, `!` or `?` followed by a space, trimmed, blanks dropped.
pub fn split_sentences(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if matches!(c, '.' | '!' | '?') && chars.peek().is_none_or(|(_, next)| next.is_whitespace())
        {
            let end = i + c.len_utf8();
            push_sentence(&mut out, &text[start..end]);
            start = end;
        }
    }
    push_sentence(&mut out, &text[start..]);
    out
}

fn push_sentence(out: &mut Vec<String>, s: &str) {
    let s = s.split_whitespace().collect::<Vec<_>>().join(" ");
    // A lone bullet or a stray full stop is not a sentence.
    if s.chars().any(char::is_alphanumeric) {
        out.push(s);
    }
}

fn normalise(s: &str) -> String {
    words(s).collect::<Vec<_>>().join(" ")
}

fn words(s: &str) -> impl Iterator<Item = String> + '_ {
    s.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
}

/// Each sentence's mean cosine similarity to the others, over TF-IDF vectors (each sentence a
/// document). A lone sentence scores 0.
fn centrality(sentences: &[String]) -> Vec<f64> {
    let n = sentences.len();
    let tfs: Vec<HashMap<String, f64>> = sentences
        .iter()
        .map(|s| {
            let mut tf = HashMap::new();
            for w in words(s) {
                *tf.entry(w).or_insert(0.0) += 1.0;
            }
            tf
        })
        .collect();
    let mut df: HashMap<&str, f64> = HashMap::new();
    for tf in &tfs {
        for w in tf.keys() {
            *df.entry(w.as_str()).or_insert(0.0) += 1.0;
        }
    }
    // Smoothed IDF: a word in every sentence still counts a little.
    let idf = |w: &str| ((n as f64 + 1.0) / (df[w] + 1.0)).ln() + 1.0;
    let vectors: Vec<HashMap<&str, f64>> = tfs
        .iter()
        .map(|tf| {
            let mut v: HashMap<&str, f64> =
                tf.iter().map(|(w, c)| (w.as_str(), c * idf(w))).collect();
            let norm = v.values().map(|x| x * x).sum::<f64>().sqrt();
            if norm > 0.0 {
                v.values_mut().for_each(|x| *x /= norm);
            }
            v
        })
        .collect();
    (0..n)
        .map(|i| {
            if n < 2 {
                return 0.0;
            }
            let total: f64 = (0..n)
                .filter(|&j| j != i)
                .map(|j| {
                    vectors[i]
                        .iter()
                        .filter_map(|(w, x)| vectors[j].get(w).map(|y| x * y))
                        .sum::<f64>()
                })
                .sum();
            total / (n - 1) as f64
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentences_are_cut_at_their_ends_and_not_inside_numbers() {
        assert_eq!(
            split_sentences("My shift is at 7.30 tomorrow. Can I swap it? Thanks!"),
            ["My shift is at 7.30 tomorrow.", "Can I swap it?", "Thanks!"]
        );
        assert_eq!(split_sentences("  no full stop  "), ["no full stop"]);
        assert!(split_sentences(" . ! ").is_empty());
    }

    #[test]
    fn the_sentences_the_conversation_keeps_returning_to_are_kept_in_their_order() {
        let messages = [
            "My Friday shift at the Elm Street house needs cover.",
            "The weather is lovely.",
            "Who can cover the Friday shift at Elm Street?",
            "Maria can cover the Friday shift at Elm Street.",
        ];
        // Room for the header and about two sentences.
        let header_len = header(4, 4).chars().count();
        let out = summarise("", &messages, 4, header_len + 100);
        let lines: Vec<&str> = out.text.lines().collect();
        assert_eq!(
            lines[0],
            "Extractive summary (no model configured): 2 sentences chosen from 4 messages."
        );
        assert_eq!(
            &lines[1..],
            [
                "Who can cover the Friday shift at Elm Street?",
                "Maria can cover the Friday shift at Elm Street."
            ],
            "the off-topic sentence goes first; the kept ones stay in the order they were said"
        );
        assert!(out.text.chars().count() <= header_len + 100);
        assert_eq!((out.sentences_chosen, out.sentences_seen), (2, 4));
    }

    #[test]
    fn a_previous_summary_is_merged_without_its_header_and_nothing_twice() {
        let previous = summarise("", &["Ana works nights at Elm Street."], 1, 500).text;
        let out = summarise(
            &previous,
            &[
                "Ana works nights at Elm Street.",
                "She asked for Sunday off.",
            ],
            3,
            500,
        );
        assert_eq!(out.text.matches(HEADER_PREFIX).count(), 1, "{}", out.text);
        assert_eq!(out.text.matches("Ana works nights").count(), 1);
        assert!(out.text.contains("She asked for Sunday off."));
        assert!(out.text.starts_with(
            "Extractive summary (no model configured): 2 sentences chosen from 3 messages."
        ));
    }

    #[test]
    fn the_cap_always_holds_even_when_nothing_fits() {
        let long = "word ".repeat(200);
        for cap in [0, 10, 80, 150, 2_000] {
            let out = summarise("", &[&long, "short one."], 2, cap);
            assert!(out.text.chars().count() <= cap, "cap {cap}: {}", out.text);
        }
        let empty = summarise("", &[], 0, 500);
        assert_eq!(
            empty.text,
            "Extractive summary (no model configured): 0 sentences chosen from 0 messages."
        );
    }
}

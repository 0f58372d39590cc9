//! Labelling an exchange (a message and the reply that answers it) with one of the configured
//! labels (`[categorise] labels`): the prompt a chat model gets, how its answer is read back
//! (normalised; anything outside the set is `other`, keeping what the model said), and the
//! offline default, the label whose description is nearest to the exchange by embedding.
use switchboard_kit::memory_config::CategoryLabel;

/// The label every set has: what an answer outside the set becomes.
pub const OTHER: &str = "other";

/// The exchange's text is cut to this many characters before labelling: the label is decided by
/// what the conversation is about, which the start of each side says.
const MAX_SIDE_CHARS: usize = 2_000;

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum LabelSetError {
    #[error("[categorise] labels: a label has an empty name")]
    EmptyName,
    #[error(
        "[categorise] labels: {0:?} is not a label name (lowercase letters, digits and `_` only)"
    )]
    BadName(String),
    #[error("[categorise] labels: {0:?} is listed twice")]
    Duplicate(String),
}

/// The labels an exchange may get, `other` always among them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelSet {
    labels: Vec<CategoryLabel>,
}

/// What a chat model's answer stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// A label of the set.
    pub label: String,
    /// What the model said, when it was not a label of the set (the label is then `other`).
    pub raw_label: Option<String>,
}

impl LabelSet {
    /// The configured labels, checked: each name already in its normal form (so a model's
    /// answer, normalised, can match it), none twice; `other` added when missing.
    pub fn new(labels: &[CategoryLabel]) -> Result<Self, LabelSetError> {
        let mut out: Vec<CategoryLabel> = Vec::with_capacity(labels.len() + 1);
        for l in labels {
            if l.name.trim().is_empty() {
                return Err(LabelSetError::EmptyName);
            }
            if normalise(&l.name) != l.name {
                return Err(LabelSetError::BadName(l.name.clone()));
            }
            if out.iter().any(|o| o.name == l.name) {
                return Err(LabelSetError::Duplicate(l.name.clone()));
            }
            out.push(l.clone());
        }
        if !out.iter().any(|l| l.name == OTHER) {
            out.push(CategoryLabel {
                name: OTHER.into(),
                description: "Anything else.".into(),
            });
        }
        Ok(Self { labels: out })
    }

    pub fn labels(&self) -> &[CategoryLabel] {
        &self.labels
    }

    pub fn contains(&self, name: &str) -> bool {
        self.labels.iter().any(|l| l.name == name)
    }

    /// The system prompt of a chat model asked for one label.
    pub fn system_prompt(&self) -> String {
        let mut p = String::from(
            "You label conversations. The user message is one exchange between a person and an \
             agent. Answer with exactly one label name from this list and nothing else:\n",
        );
        for l in &self.labels {
            p.push_str(&format!("- {}: {}\n", l.name, l.description));
        }
        p.push_str(&format!(
            "If none fits, answer {OTHER}. Answer only the label name."
        ));
        p
    }

    /// The label a model's answer names, or `other` with what it said.
    pub fn resolve(&self, answer: &str) -> Resolved {
        let name = normalise(answer);
        if self.contains(&name) {
            Resolved {
                label: name,
                raw_label: None,
            }
        } else {
            Resolved {
                label: OTHER.into(),
                raw_label: Some(answer.trim().chars().take(200).collect()),
            }
        }
    }

    /// The texts embedded for the offline default, one per label, in the set's order.
    pub fn descriptions(&self) -> Vec<String> {
        self.labels
            .iter()
            .map(|l| format!("{}: {}", l.name.replace('_', " "), l.description))
            .collect()
    }

    /// The label whose description vector (`label_vectors`, in the set's order) is nearest to
    /// `text` by cosine; the first of equals; `other` when there is nothing to compare.
    pub fn nearest(&self, text: &[f32], label_vectors: &[Vec<f32>]) -> &str {
        let mut best: Option<(usize, f32)> = None;
        for (i, v) in label_vectors.iter().enumerate().take(self.labels.len()) {
            let s = crate::embed::cosine(text, v);
            if best.is_none_or(|(_, b)| s > b) {
                best = Some((i, s));
            }
        }
        match best {
            Some((i, _)) => &self.labels[i].name,
            None => OTHER,
        }
    }
}

/// An answer in the form label names have: trimmed, lowercase, punctuation stripped, words
/// joined by `_` ("Roster query." and "`roster_query`" are both `roster_query`).
pub fn normalise(answer: &str) -> String {
    let cleaned: String = answer
        .trim()
        .to_lowercase()
        .chars()
        .map(|c| {
            if c == '-' || c.is_whitespace() {
                ' '
            } else {
                c
            }
        })
        .filter(|c| c.is_alphanumeric() || *c == '_' || *c == ' ')
        .collect();
    cleaned.split_whitespace().collect::<Vec<_>>().join("_")
}

/// The text an exchange is labelled by: what the person said and what the agent answered (an
/// agent-started message has no first part).
pub fn exchange_text(inbound: Option<&str>, outbound: &str) -> String {
    let cut = |s: &str| s.chars().take(MAX_SIDE_CHARS).collect::<String>();
    match inbound {
        Some(i) => format!("Person: {}\nAgent: {}", cut(i), cut(outbound)),
        None => format!("Agent: {}", cut(outbound)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchboard_kit::memory_config::CategoriseConfig;

    fn label(name: &str, description: &str) -> CategoryLabel {
        CategoryLabel {
            name: name.into(),
            description: description.into(),
        }
    }

    fn defaults() -> LabelSet {
        LabelSet::new(&CategoriseConfig::default().labels).expect("the defaults are valid")
    }

    #[test]
    fn a_model_answer_is_read_as_a_label_whatever_its_case_spacing_or_punctuation() {
        let set = defaults();
        for answer in [
            "roster_query",
            "  Roster_Query.\n",
            "`roster_query`",
            "\"roster query\"",
            "Roster-Query!",
        ] {
            assert_eq!(
                set.resolve(answer),
                Resolved {
                    label: "roster_query".into(),
                    raw_label: None
                },
                "{answer:?}"
            );
        }
    }

    #[test]
    fn an_answer_outside_the_set_is_other_and_keeps_what_the_model_said() {
        let set = defaults();
        assert_eq!(
            set.resolve("  weather_smalltalk "),
            Resolved {
                label: "other".into(),
                raw_label: Some("weather_smalltalk".into())
            }
        );
        // A sentence around a label is not a label.
        assert_eq!(
            set.resolve("The label is roster_query").label,
            "other".to_string()
        );
        assert_eq!(set.resolve("other").raw_label, None);
    }

    #[test]
    fn the_prompt_lists_every_label_with_its_description() {
        let set = defaults();
        let prompt = set.system_prompt();
        for l in set.labels() {
            assert!(
                prompt.contains(&format!("- {}: {}", l.name, l.description)),
                "{} missing from {prompt}",
                l.name
            );
        }
    }

    #[test]
    fn other_is_always_a_label_and_a_bad_or_repeated_name_is_refused() {
        let set = LabelSet::new(&[label("billing", "Money.")]).unwrap();
        let names: Vec<_> = set.labels().iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["billing", "other"]);
        assert_eq!(
            LabelSet::new(&[label("Billing Stuff", "x")]),
            Err(LabelSetError::BadName("Billing Stuff".into()))
        );
        assert_eq!(
            LabelSet::new(&[label("a", "x"), label("a", "y")]),
            Err(LabelSetError::Duplicate("a".into()))
        );
        assert_eq!(
            LabelSet::new(&[label(" ", "x")]),
            Err(LabelSetError::EmptyName)
        );
    }

    #[test]
    fn the_nearest_label_is_the_one_whose_description_vector_is_closest() {
        let set = LabelSet::new(&[label("a", "x"), label("b", "y")]).unwrap();
        let vectors = vec![
            vec![1.0, 0.0, 0.0],
            vec![0.0, 1.0, 0.0],
            vec![0.0, 0.0, 1.0],
        ];
        assert_eq!(set.nearest(&[0.1, 0.9, 0.0], &vectors), "b");
        assert_eq!(set.nearest(&[0.9, 0.1, 0.0], &vectors), "a");
        assert_eq!(set.nearest(&[0.0, 0.2, 0.8], &vectors), "other");
        assert_eq!(set.nearest(&[1.0, 0.0, 0.0], &[]), "other");
    }

    #[test]
    fn an_exchange_reads_as_the_person_then_the_agent() {
        assert_eq!(
            exchange_text(Some("when do I work"), "Tuesday at 9"),
            "Person: when do I work\nAgent: Tuesday at 9"
        );
        assert_eq!(exchange_text(None, "Reminder"), "Agent: Reminder");
        let long = "x".repeat(5_000);
        assert!(exchange_text(Some(&long), &long).len() < 4_100);
    }
}

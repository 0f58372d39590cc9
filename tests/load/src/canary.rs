//! A canary per person: every message a person sends in a chaos run carries a string that is
//! theirs alone (`cnry-<sender>-<8 hex>`, the hex drawn from the run's salt), so that whatever
//! the product puts in a prompt (the message itself, the summary, curated memory, recalled
//! messages) can be traced back to whose words it was. A prompt for one person that carries
//! another person's canary is memory leaking between people.
//!
//! The message text stays `s<sender>#<index>` for every other check: the canary follows it
//! after a space, and the fake runner reads the text without it ([`strip`]).
use serde::{Deserialize, Serialize};

/// What every canary starts with.
pub const PREFIX: &str = "cnry-";
/// Hex digits of a canary's random part.
const HEX: usize = 8;

/// The canaries of one run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Canaries {
    pub salt: u64,
}

impl Canaries {
    pub fn new(salt: u64) -> Self {
        Self { salt }
    }

    /// A run's own canaries (a random salt).
    pub fn random() -> Self {
        Self::new(rand::random())
    }

    /// Sender `sender`'s canary.
    pub fn of(&self, sender: usize) -> String {
        format!("{PREFIX}{sender}-{:08x}", self.random_part(sender))
    }

    fn random_part(&self, sender: usize) -> u32 {
        // splitmix64 of (salt, sender): stable, and different for every sender.
        let mut z = self
            .salt
            .wrapping_add((sender as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) as u32
    }

    /// Whose canary `token` is: `None` for a string that looks like a canary but is nobody's
    /// of this run (mangled, or another run's).
    pub fn owner(&self, token: &str) -> Option<usize> {
        let rest = token.strip_prefix(PREFIX)?;
        let (sender, _) = rest.split_once('-')?;
        let sender: usize = sender.parse().ok()?;
        (self.of(sender) == token).then_some(sender)
    }

    /// The text sender `sender` sends for `text` (`s<sender>#<index> cnry-…`).
    pub fn mark(&self, sender: usize, text: &str) -> String {
        format!("{text} {}", self.of(sender))
    }
}

/// Every canary-shaped token in `text`, in order, with repeats.
pub fn find(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = text[from..].find(PREFIX) {
        let start = from + at;
        let rest = &text[start + PREFIX.len()..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let hex = rest
            .get(digits + 1..)
            .map(|h| h.bytes().take_while(u8::is_ascii_hexdigit).count())
            .unwrap_or(0);
        if digits > 0 && rest.as_bytes().get(digits) == Some(&b'-') && hex >= HEX {
            let end = start + PREFIX.len() + digits + 1 + HEX;
            out.push(&text[start..end]);
            from = end;
        } else {
            from = start + PREFIX.len();
        }
    }
    out
}

/// A message text without the canary it carries (`s1#2 cnry-1-…` → `s1#2`).
pub fn strip(text: &str) -> &str {
    match text.find(&format!(" {PREFIX}")) {
        Some(at) => &text[..at],
        None => text,
    }
}

/// The canaries one prompt carried: every distinct one, and how many times a canary appeared
/// outside the person's own message fences (the summary, memory or recall brought it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptCanaries {
    /// Distinct canary tokens anywhere in the prompt, in order of first appearance.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tokens: Vec<String>,
    /// Canary appearances outside the message fences.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub outside_messages: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl PromptCanaries {
    /// What `prompt` carries, given the texts of its message fences.
    pub fn of_prompt(prompt: &str, fenced: &[&str]) -> Self {
        let all = find(prompt);
        let in_fences: usize = fenced.iter().map(|t| find(t).len()).sum();
        let mut tokens: Vec<String> = Vec::new();
        for t in &all {
            if !tokens.iter().any(|k| k == t) {
                tokens.push(t.to_string());
            }
        }
        Self {
            tokens,
            outside_messages: all.len().saturating_sub(in_fences) as u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_person_has_a_canary_of_their_own_found_again_in_any_text() {
        let c = Canaries::new(42);
        assert_ne!(c.of(3), c.of(31));
        assert_ne!(
            c.of(3),
            Canaries::new(43).of(3),
            "another run, other canaries"
        );
        assert_eq!(c.owner(&c.of(31)), Some(31));
        assert_eq!(c.owner(&Canaries::new(43).of(31)), None);
        let text = format!(
            "summary: {} then {} and cnry-x, cnry-7-zz",
            c.of(3),
            c.of(31)
        );
        assert_eq!(find(&text), vec![c.of(3), c.of(31)]);
        let sent = c.mark(3, "s3#2");
        assert_eq!(strip(&sent), "s3#2");
        assert_eq!(strip("s3#2"), "s3#2");
    }

    #[test]
    fn a_prompt_counts_the_canaries_outside_its_message_fences() {
        let c = Canaries::new(7);
        let own = c.mark(1, "s1#4");
        let prompt = format!(
            "summary: {} {}\n<<<MSG-x\n{own}\nMSG-x>>>",
            c.of(1),
            c.of(2)
        );
        let p = PromptCanaries::of_prompt(&prompt, &[own.as_str()]);
        assert_eq!(p.tokens, vec![c.of(1), c.of(2)]);
        assert_eq!(p.outside_messages, 2);
    }
}

//! What a message asks of the proof flow: a phone to link, or a code.
use super::CODE_DIGITS;

/// The longest text read as a request or a code ("link my phone number +61 412 345 678" is 36).
const MAX_ASK_LEN: usize = 80;

/// What a message asks of the proof flow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ask {
    /// "link my phone +61 412 345 678": text a code to this number (as typed).
    LinkPhone(String),
    /// Six digits ("123456", "123 456", "code 123-456"): a code, if a claim waits for one.
    Code(String),
}

/// Read `text` as a request to link a phone or as a code; `None` for anything else (the agent
/// answers it).
pub fn parse(text: &str) -> Option<Ask> {
    let text = text.trim();
    // Every message passes here: a long one is no request, and is not split into words.
    if text.len() > MAX_ASK_LEN {
        return None;
    }
    let text = text.strip_prefix('/').unwrap_or(text);
    let words: Vec<&str> = text.split_whitespace().collect();
    let is = |i: usize, any: &[&str]| {
        words
            .get(i)
            .is_some_and(|w| any.iter().any(|a| w.eq_ignore_ascii_case(a)))
    };
    let mut at = 0;
    if is(at, &["link"]) {
        at += 1;
        if is(at, &["my"]) {
            at += 1;
        }
        if is(at, &["phone", "mobile", "number"]) {
            at += 1;
            if is(at, &["number"]) {
                at += 1;
            }
            let number = words[at..].concat();
            return (!number.is_empty()).then_some(Ask::LinkPhone(number));
        }
    }
    if is(at, &["code"]) {
        at += 1;
    }
    let digits: String = words[at..].concat().replace('-', "");
    (digits.len() == CODE_DIGITS && digits.bytes().all(|b| b.is_ascii_digit()))
        .then_some(Ask::Code(digits))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asking_to_link_a_phone_is_read_in_the_ways_people_write_it() {
        let phone = |s: &str| Some(Ask::LinkPhone(s.into()));
        assert_eq!(
            parse("link my phone +61 412 345 678"),
            phone("+61412345678")
        );
        assert_eq!(
            parse("Link my phone number 0412-345-678"),
            phone("0412-345-678")
        );
        assert_eq!(parse("/link phone +14155550100"), phone("+14155550100"));
        assert_eq!(
            parse("  LINK MY MOBILE (415) 555 0100 "),
            phone("(415)5550100")
        );
        assert_eq!(parse("link my phone"), None);
        assert_eq!(parse("please link my phone +14155550100"), None);
        assert_eq!(parse("link me up"), None);
        let long = format!("link my phone +61 412 345 678 {}", "please ".repeat(10));
        assert_eq!(parse(&long), None);
    }

    #[test]
    fn six_digits_are_a_code_and_nothing_else_is() {
        let code = |s: &str| Some(Ask::Code(s.into()));
        assert_eq!(parse("123456"), code("123456"));
        assert_eq!(parse(" 123 456 "), code("123456"));
        assert_eq!(parse("code 123-456"), code("123456"));
        assert_eq!(parse("link code 000042"), code("000042"));
        assert_eq!(parse("12345"), None);
        assert_eq!(parse("1234567"), None);
        assert_eq!(parse("12345a"), None);
        assert_eq!(parse("my code is 123456"), None);
        assert_eq!(parse("١٢٣٤٥٦"), None, "only ASCII digits");
        assert_eq!(parse(""), None);
    }
}

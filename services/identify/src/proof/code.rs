//! The codes themselves: how they are made and compared.
use uuid::Uuid;

/// Digits in a code.
pub const CODE_DIGITS: usize = 6;

/// Whether `given` is `code`, in time that does not depend on where they differ.
pub(super) fn same_code(code: &str, given: &str) -> bool {
    let (code, given) = (code.as_bytes(), given.as_bytes());
    let differ = code
        .iter()
        .zip(given)
        .fold(0u8, |d, (a, b)| d | std::hint::black_box(a ^ b));
    code.len() == given.len() && differ == 0
}

/// A fresh code: uuid's v4 bytes come from the operating system's CSPRNG (getrandom); the
/// modulo's bias over 122 random bits is nil.
pub(super) fn new_code() -> String {
    let n = Uuid::new_v4().as_u128() % 10u128.pow(CODE_DIGITS as u32);
    format!("{n:0width$}", width = CODE_DIGITS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_compare_equal_only_when_every_digit_is() {
        assert!(same_code("012345", "012345"));
        assert!(!same_code("012345", "012346"));
        assert!(!same_code("012345", "112345"));
        assert!(!same_code("012345", "01234"));
        assert!(!same_code("01234", "012345"));
        assert!(!same_code("012345", ""));
    }

    #[test]
    fn codes_are_six_digits_and_vary() {
        let codes: std::collections::HashSet<String> = (0..200).map(|_| new_code()).collect();
        assert!(
            codes
                .iter()
                .all(|c| c.len() == CODE_DIGITS && c.bytes().all(|b| b.is_ascii_digit()))
        );
        assert!(codes.len() > 190, "{} distinct of 200", codes.len());
    }
}

#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| switchboard_fuzz::telegram_update(data));

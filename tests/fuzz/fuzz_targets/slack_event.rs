#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| switchboard_fuzz::slack_event(data));

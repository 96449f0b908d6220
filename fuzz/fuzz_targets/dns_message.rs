#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| riceguard_fuzz::check_dns_message(data));

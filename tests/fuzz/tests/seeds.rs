//! The fuzz targets' checks without libFuzzer (see `switchboard_fuzz::replay`), including
//! whatever `cargo fuzz run` saved under `corpus/`. `make test` runs the same replay through
//! `tests/tests/hostile_input.rs`; this is for `cargo test --manifest-path tests/fuzz/Cargo.toml`.
#[test]
fn seeds_corpus_and_mutations_pass_every_check() {
    let rounds = std::env::var("SB_FUZZ_REPLAY_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5_000);
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for (target, n) in switchboard_fuzz::replay(dir, rounds) {
        eprintln!("{target}: {n} inputs");
    }
}

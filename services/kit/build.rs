//! Compiles `proto/` with protox (pure Rust), so no system `protoc` is needed.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = "../../proto";
    let files = [
        "switchboard/v1/messages.proto",
        "switchboard/v1/events.proto",
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={root}/{f}");
    }
    // `sqlx::migrate!` embeds the migrations at compile time but does not ask to be rebuilt
    // when one is added: without this a new migration is silently left out of the binary.
    println!("cargo:rerun-if-changed=../../migrations");
    let fds = protox::compile(files, [root])?;
    // The schemas themselves, for what decodes events by their type name (`switchboard tail`).
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("switchboard.fds.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    prost_build::Config::new()
        .enable_type_names()
        .compile_fds(fds)?;
    Ok(())
}

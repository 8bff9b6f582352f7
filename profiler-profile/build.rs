//! Generates pprof's messages (`$OUT_DIR/perftools.profiles.rs`) from
//! `proto/profile.proto`: protox parses it in Rust and prost-build writes
//! the structs, so building needs no protoc.

fn main() {
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(["profile.proto"], ["proto"])
        .unwrap_or_else(|e| panic!("parsing proto/profile.proto: {e}"));
    // prost-build derives Copy for messages of plain numbers (ValueType,
    // Label, Line, Function), which the encoder passes by value.
    prost_build::Config::new()
        .compile_fds(descriptors)
        .unwrap_or_else(|e| panic!("generating Rust from proto/profile.proto: {e}"));
}

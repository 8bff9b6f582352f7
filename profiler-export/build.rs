//! Generates Pyroscope's push messages (`$OUT_DIR/push.v1.rs`,
//! `types.v1.rs`) from `proto/pyroscope/`: protox parses the files in Rust
//! and prost-build writes the structs, so building needs no protoc.

fn main() {
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(["pyroscope/push.proto"], ["proto"])
        .unwrap_or_else(|e| panic!("parsing proto/pyroscope/push.proto: {e}"));
    prost_build::Config::new()
        .compile_fds(descriptors)
        .unwrap_or_else(|e| panic!("generating Rust from proto/pyroscope: {e}"));
}

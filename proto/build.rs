//! Compiles `proto/drun/v1/*.proto` with protoc (Debian: `apt-get install -y protobuf-compiler`).

fn main() {
    let protos = ["proto/drun/v1/rendezvous.proto"];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    if std::env::var_os("PROTOC").is_none() && which("protoc").is_none() {
        panic!(
            "protoc not found: install it with `apt-get install -y protobuf-compiler` \
             (or set PROTOC=/path/to/protoc)"
        );
    }
    tonic_prost_build::configure()
        // Small starting buffers per stream (src/codec.rs).
        .codec_path("crate::codec::SmallBuffers")
        .compile_protos(&protos, &["proto"])
        .unwrap_or_else(|e| panic!("compiling drun.v1 protos failed: {e}"));
}

fn which(bin: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(bin))
            .find(|p| p.is_file())
    })
}

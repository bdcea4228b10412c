//! Generates the CSI messages and services from `proto/csi.proto` (needs `protoc`, which
//! `scripts/setup.sh` installs).

fn main() {
    println!("cargo:rerun-if-changed=proto/csi.proto");
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_protos(&["proto/csi.proto"], &["proto"])
        .expect("compiling proto/csi.proto (is protoc installed?)");
}

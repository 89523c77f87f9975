//! Compiles `tollgate/v1/*.proto` with protox, so a fresh machine needs no
//! system `protoc`.
use std::{env, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fds = protox::compile(
        ["tollgate/v1/budget.proto", "tollgate/v1/admin.proto"],
        ["."],
    )?;
    let out = PathBuf::from(env::var("OUT_DIR")?);
    // compile_fds ignores file_descriptor_set_path, so the set that server
    // reflection serves is written here.
    std::fs::write(
        out.join("tollgate_descriptor.bin"),
        protox::prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    // compile_fds prints no rerun directive of its own.
    println!("cargo:rerun-if-changed=tollgate");
    Ok(())
}

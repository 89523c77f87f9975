//! The `tollgate.v1` gRPC API: messages, the `Budget` and `Admin` client and server stubs,
//! and the file descriptor set that server reflection serves.
//!
//! The `.proto` files under `proto/tollgate/v1/` are the documentation of every
//! field; this crate only compiles them.

#![allow(missing_docs, unreachable_pub, clippy::all)]

/// Generated code for the `tollgate.v1` package.
pub mod v1 {
    tonic::include_proto!("tollgate.v1");

    /// The encoded descriptor set of every `tollgate.v1` file, for reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("tollgate_descriptor");
}

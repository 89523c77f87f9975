//! tollgate

//! tests
use super::*;
